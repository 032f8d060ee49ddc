//! The requests serving answers, and why it refuses or fails one: the types
//! every API surface speaks to serving in. A surface parses its own body
//! into these, and maps a `RequestError`'s `Fault` to its own status and
//! error shape; it needs nothing from the registry, the model or the engines.

use std::sync::Arc;

pub use crate::registry::KeepAlive;
pub use crate::tokenize::{Inputs, Token};

use super::Service;
use crate::config::{ModelKind, ScoreActivation};
use crate::model::{ModelError, Output};
use crate::pooling::VectorOptions;
use crate::registry::{AcquireError, ModelSlot};
use crate::tokenize::TokenizeError;
use eeane_backend_core::EngineError;

/// What Infinity's own client (infinity-client) sends as `model` when none is set.
pub const INFINITY_NO_MODEL: &str = "default/not-specified";

pub struct EmbedRequest {
    /// An id or alias; `None` takes the first embedding model.
    pub model: Option<String>,
    pub inputs: Inputs,
    /// One of the model's prompts, put before each text input; `None` takes
    /// the model's default prompt, if it has one.
    pub prompt_name: Option<String>,
    /// Keep the first n values of each vector, renormalized.
    pub dimensions: Option<usize>,
    pub keep_alive: Option<KeepAlive>,
    pub long_inputs: LongInputs,
    /// Unit-length vectors asked for (TEI's `normalize`): `None` takes the
    /// model's `normalize`; `Some(true)` normalizes a model that does not;
    /// `Some(false)` is refused for one that does, whose raw vectors are not kept.
    pub unit_length: Option<bool>,
}

pub struct Embedded {
    /// The model's id.
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    /// Tokens the model processed, special tokens and prompts included.
    pub tokens: usize,
}

/// Texts to show as the model's tokens (TEI's `/tokenize`).
pub struct TokenizeRequest {
    /// An id or alias; `None` takes the first embedding model.
    pub model: Option<String>,
    pub texts: Vec<String>,
    pub add_special_tokens: bool,
    /// One of the model's prompts, put before each text; without it the
    /// model's default prompt, if it has one (as for embedding).
    pub prompt_name: Option<String>,
}

/// What a request asks of an input longer than the model takes at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LongInputs {
    /// The model's own `long_text`: truncated, or embedded in windows. A
    /// client's `truncate: true` gets this too, so that a text has one vector
    /// per model whichever API asks.
    #[default]
    AsConfigured,
    /// Refused with `Fault::InputTooLong` (TEI's and Ollama's `truncate: false`).
    Refuse,
}

pub struct RerankRequest {
    /// An id or alias; `None` (or infinity-client's "default/not-specified")
    /// takes the default reranker.
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// A cross-encoder's logits as they are, without its activation.
    pub raw_scores: bool,
    pub keep_alive: Option<KeepAlive>,
    /// A language-model reranker's instruction, in place of its entry's.
    pub instruction: Option<String>,
}

pub struct Ranked {
    /// The model's id.
    pub model: String,
    /// One score per document, in the documents' order.
    pub scores: Vec<f64>,
    pub tokens: usize,
}

/// What went wrong, for each API surface to map to its own status and code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// No model has the name asked for; the models that could have answered.
    UnknownModel {
        servable: Vec<String>,
    },
    NotAnEmbeddingModel,
    NotAReranker,
    NoRerankModel,
    UnknownPrompt,
    PromptWithTokenIds,
    TokenIdsNotAccepted,
    InvalidDimensions,
    /// An input longer than the model takes, with truncation refused.
    InputTooLong,
    /// Vectors that are not unit length, from a model that normalizes.
    NormalizeUnavailable,
    /// max_pending_requests are already in.
    Overloaded,
    /// A token id outside the model's vocabulary.
    OutOfVocabulary,
    Tokenization,
    QueryTooLong,
    /// The request waited longer than queue_timeout.
    QueueTimeout,
    /// max_loaded_models are loaded and busy.
    NoRoom,
    /// The model could not load, or cannot serve now.
    Unavailable,
    /// A model file does not match its manifest.
    Integrity,
    /// The engine failed on this input.
    EngineFailed,
    /// The engine cannot take this input.
    UnsupportedInput,
    /// A bug, caught: the server keeps serving.
    Internal,
}

/// Why serving refused or failed a request, for every API surface: a
/// `Fault` to map to a status, the message users see, the field and the
/// model at fault. Cloneable: coalesced requests share one.
#[derive(Debug, Clone)]
pub struct RequestError {
    pub fault: Fault,
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// The model the request was for, once known (the name asked for when no
    /// model has it), for the request log and per-model metrics.
    pub model: Option<String>,
}

impl RequestError {
    fn new(fault: Fault, message: impl Into<String>) -> Self {
        Self { fault, message: message.into(), param: None, model: None }
    }

    fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    fn model(mut self, model: &str) -> Self {
        self.model = Some(model.to_string());
        self
    }

    pub fn unknown_model(name: &str, servable: Vec<&str>) -> Self {
        let message = format!("The model {name:?} does not exist. Servable models: {}", servable.join(", "));
        Self::new(Fault::UnknownModel { servable: servable.into_iter().map(str::to_string).collect() }, message).param("model").model(name)
    }

    fn overloaded(limit: usize) -> Self {
        Self::new(Fault::Overloaded, format!("{limit} requests are already pending (max_pending_requests)"))
    }
}

/// A model that could not be had for the request: loading failed, no room, or the wait ran out.
impl From<AcquireError> for RequestError {
    fn from(e: AcquireError) -> Self {
        let fault = match e {
            AcquireError::LoadFailed(_) => Fault::Unavailable,
            AcquireError::NoRoom(_) => Fault::NoRoom,
            AcquireError::Timeout => Fault::QueueTimeout,
        };
        Self::new(fault, e.to_string())
    }
}

impl From<&ModelError> for RequestError {
    fn from(e: &ModelError) -> Self {
        let message = e.to_string();
        match e {
            ModelError::QueueTimeout => Self::new(Fault::QueueTimeout, message),
            ModelError::Panicked { .. } => Self::new(Fault::Internal, message),
            ModelError::Tokenize(TokenizeError::OutOfVocabulary { input, position, .. }) => Self::new(
                Fault::OutOfVocabulary,
                format!("{message}. Token ids must come from this model's own tokenizer (not tiktoken; LangChain users: set check_embedding_ctx_length=False)"),
            )
            .param(format!("input[{input}][{position}]")),
            ModelError::Tokenize(TokenizeError::Tokenizer(_)) => Self::new(Fault::Tokenization, message).param("input"),
            ModelError::Tokenize(TokenizeError::QueryTooLong { .. }) => Self::new(Fault::QueryTooLong, message).param("query"),
            ModelError::Engine(EngineError::Inference(_)) => Self::new(Fault::EngineFailed, message),
            ModelError::Engine(EngineError::Input(_)) => Self::new(Fault::UnsupportedInput, message),
            ModelError::Engine(_) => Self::new(Fault::Unavailable, message),
            ModelError::Integrity(_) => Self::new(Fault::Integrity, message),
            ModelError::Source(_) | ModelError::MissingFile(_) => Self::new(Fault::Unavailable, message),
        }
    }
}

impl Service {
    /// Embeds a request's inputs with the model it names: its prompt applied,
    /// admitted against max_pending_requests, batched with other requests.
    pub async fn embed(&self, request: EmbedRequest) -> Result<Embedded, RequestError> {
        let live = self.live();
        let slot = live
            .registry
            .find(request.model.as_deref())
            .ok_or_else(|| RequestError::unknown_model(request.model.as_deref().unwrap_or(""), live.registry.embedding_ids()))?;
        let id = slot.config.id.as_str();
        let refuse = |e: RequestError| e.model(id);
        if slot.config.kind == ModelKind::Reranker {
            return Err(refuse(RequestError::new(Fault::NotAnEmbeddingModel, format!("{id:?} is a reranker: use /v1/rerank")).param("model")));
        }
        let inputs = apply_prompt(request.inputs, slot, request.prompt_name.as_deref()).map_err(refuse)?;
        if matches!(inputs, Inputs::TokenIds(_)) && !slot.config.accepts_token_ids(&live.config.server) {
            return Err(refuse(
                RequestError::new(
                    Fault::TokenIdsNotAccepted,
                    format!(
                        "model {id:?} takes text, not token ids. LangChain's OpenAIEmbeddings sends tiktoken ids unless \
                         check_embedding_ctx_length=False, and those are not this model's vocabulary: set \
                         OpenAIEmbeddings(..., check_embedding_ctx_length=False) to send text. A client that sends this \
                         model's own tokenizer ids can be allowed with accept_token_ids = true on its [[models]] entry"
                    ),
                )
                .param("input"),
            ));
        }
        if request.unit_length == Some(false) && slot.config.normalize {
            return Err(refuse(
                RequestError::new(
                    Fault::NormalizeUnavailable,
                    format!("model {id:?} is configured to normalize its vectors (normalize = true); normalize: false cannot be served"),
                )
                .param("normalize"),
            ));
        }
        let _admitted = self.admit(&live).map_err(|o| refuse(RequestError::overloaded(o.limit)))?;
        // Unit length asked of a model that normalizes is what it gives already.
        let options = VectorOptions { dimensions: request.dimensions, unit_length: request.unit_length == Some(true) && !slot.config.normalize };
        let result = self.run(&live, slot, inputs, options, request.keep_alive, live.deadline()).await.map_err(refuse)?;
        let limit = match slot.config.long_text {
            crate::config::LongText::Truncate => slot.config.max_tokens,
            crate::config::LongText::Window => slot.config.window,
        };
        if request.long_inputs == LongInputs::Refuse && result.longest_input > limit {
            return Err(refuse(
                RequestError::new(
                    Fault::InputTooLong,
                    format!(
                        "an input is {} tokens; model {id:?} takes at most {limit} at once. Send truncate: true to embed it as the model is \
                         configured to (long_text = {})",
                        result.longest_input,
                        if slot.config.long_text == crate::config::LongText::Window { "window" } else { "truncate" }
                    ),
                )
                .param("truncate"),
            ));
        }
        // Checked after inference, once the model's width is known; a
        // refused request's vectors (already cut and scaled) are dropped.
        if let Some(dims) = request.dimensions {
            let width = result.width;
            if dims == 0 || dims > width {
                return Err(refuse(
                    RequestError::new(Fault::InvalidDimensions, format!("dimensions must be between 1 and {width} for this model")).param("dimensions"),
                ));
            }
        }
        // The vectors are shared only when the request was coalesced; otherwise take them.
        let tokens = result.tokens;
        let Output::Vectors(vectors) = Arc::try_unwrap(result).map_or_else(|shared| shared.output.clone(), |own| own.output) else {
            return Err(refuse(RequestError::new(Fault::Internal, "an embedding model answered with scores")));
        };
        Ok(Embedded { model: id.to_string(), vectors, tokens })
    }

    /// Each text's tokens as the model's tokenizer makes them, with their byte
    /// offsets; the model is loaded (and admitted) as for embedding.
    pub async fn tokenize(&self, request: TokenizeRequest) -> Result<(String, Vec<Vec<Token>>), RequestError> {
        let live = self.live();
        let slot = self.tokenizer_slot(&live, request.model.as_deref())?;
        let id = slot.config.id.clone();
        // The prompt as embedding applies it, named or the model's default:
        // these are the ids the model would embed.
        let Inputs::Texts(texts) = apply_prompt(Inputs::Texts(request.texts), slot, request.prompt_name.as_deref()).map_err(|e| e.model(&id))? else {
            unreachable!("apply_prompt returns texts for texts")
        };
        let add_special = request.add_special_tokens;
        let tokens = self.with_tokenizer(&live, slot, move |t| texts.iter().map(|text| t.tokens(text, add_special)).collect()).await?;
        Ok((id, tokens))
    }

    /// The text of each list of token ids.
    pub async fn decode(&self, model: Option<&str>, ids: Vec<Vec<i64>>, skip_special_tokens: bool) -> Result<(String, Vec<String>), RequestError> {
        let live = self.live();
        let slot = self.tokenizer_slot(&live, model)?;
        let texts = self
            .with_tokenizer(&live, slot, move |t| {
                ids.iter()
                    .enumerate()
                    .map(|(input, ids)| {
                        t.decode(ids, skip_special_tokens).map_err(|e| match e {
                            TokenizeError::OutOfVocabulary { position, id, vocab_size, .. } => {
                                TokenizeError::OutOfVocabulary { input, position, id, vocab_size }
                            }
                            e => e,
                        })
                    })
                    .collect()
            })
            .await?;
        Ok((slot.config.id.clone(), texts))
    }

    fn tokenizer_slot<'l>(&self, live: &'l super::Live, model: Option<&str>) -> Result<&'l Arc<ModelSlot>, RequestError> {
        live.registry.find(model).ok_or_else(|| RequestError::unknown_model(model.unwrap_or(""), live.registry.ids()))
    }

    /// Runs `work` with `slot`'s tokenizer, the model loaded and the request
    /// admitted as any other.
    async fn with_tokenizer<T: Send + 'static>(
        &self,
        live: &super::Live,
        slot: &Arc<ModelSlot>,
        work: impl FnOnce(&crate::tokenize::TextTokenizer) -> Result<T, TokenizeError> + Send + 'static,
    ) -> Result<T, RequestError> {
        let id = slot.config.id.as_str();
        let _admitted = self.admit(live).map_err(|o| RequestError::overloaded(o.limit).model(id))?;
        let lease = live.registry.acquire(slot, &live.config, live.deadline()).await.map_err(|e| RequestError::from(e).model(id))?;
        lease.with_tokenizer(work).await.map_err(|e| RequestError::from(&e).model(id))
    }

    /// Scores each document against the query: a cross-encoder's score of
    /// each pair, or an embedding model's cosine of the two vectors.
    pub async fn rerank(&self, request: RerankRequest) -> Result<Ranked, RequestError> {
        let live = self.live();
        let slot = match request.model.as_deref().filter(|name| *name != INFINITY_NO_MODEL) {
            Some(name) => live.registry.find(Some(name)).ok_or_else(|| RequestError::unknown_model(name, live.registry.reranking_ids()))?,
            None => live.registry.default_reranker().ok_or_else(|| {
                RequestError::new(Fault::NoRerankModel, "no model here reranks: add a kind = \"reranker\" entry, or rerank = true on an embedding entry")
                    .param("model")
            })?,
        };
        let id = slot.config.id.as_str();
        let refuse = |e: RequestError| e.model(id);
        let cross_encoder = slot.config.kind == ModelKind::Reranker;
        if !cross_encoder && !slot.config.rerank {
            return Err(refuse(
                RequestError::new(
                    Fault::NotAReranker,
                    format!("{id:?} is an embedding model: use /v1/embeddings, or set rerank = true on its entry to rank by cosine"),
                )
                .param("model"),
            ));
        }
        if request.instruction.is_some() && slot.config.rerank_template.is_none() {
            return Err(refuse(
                RequestError::new(
                    Fault::UnsupportedInput,
                    format!("{id:?} takes no instruction: only a reranker that is a language model (an entry with rerank_template) reads one"),
                )
                .param("instruction"),
            ));
        }
        let _admitted = self.admit(&live).map_err(|o| refuse(RequestError::overloaded(o.limit)))?;
        let inputs = if cross_encoder {
            Inputs::Pairs { query: request.query, documents: request.documents, instruction: request.instruction }
        } else {
            Inputs::Texts(std::iter::once(request.query).chain(request.documents).collect())
        };
        let result = self.run(&live, slot, inputs, VectorOptions::default(), request.keep_alive, live.deadline()).await.map_err(|mut error| {
            // Pairs and texts are tokenized as "input"; here they are the documents.
            if error.param.as_deref() == Some("input") {
                error.param = Some("documents".into());
            }
            refuse(error)
        })?;
        let scores = match &result.output {
            Output::Scores(logits) => logits
                .iter()
                .map(|&x| match (request.raw_scores, slot.config.score_activation) {
                    (false, ScoreActivation::Sigmoid) => sigmoid(x as f64),
                    _ => x as f64,
                })
                .collect(),
            // The query's vector first, then each document's.
            Output::Vectors(vectors) => match vectors.split_first() {
                Some((query, documents)) => documents.iter().map(|d| cosine(query, d)).collect(),
                None => Vec::new(),
            },
        };
        Ok(Ranked { model: id.to_string(), scores, tokens: result.tokens })
    }
}

/// Puts the prompt a request names (else the model's default prompt) before
/// each text input, as sentence-transformers' `encode(prompt_name=...)` does.
/// Token-id inputs are the model's own ids already: a named prompt is refused
/// for them, and no default applies.
fn apply_prompt(inputs: Inputs, slot: &ModelSlot, prompt_name: Option<&str>) -> Result<Inputs, RequestError> {
    let model = &slot.config;
    let prompt = match prompt_name {
        Some(name) => Some(model.prompts.get(name).ok_or_else(|| {
            let known = if model.prompts.is_empty() {
                "it has none".to_string()
            } else {
                format!("its prompts: {}", model.prompts.keys().cloned().collect::<Vec<_>>().join(", "))
            };
            RequestError::new(Fault::UnknownPrompt, format!("model {:?} has no prompt {name:?}; {known}", model.id)).param("prompt_name")
        })?),
        None => model.default_prompt_name.as_ref().and_then(|name| model.prompts.get(name)),
    };
    match (inputs, prompt) {
        (Inputs::Texts(texts), Some(prompt)) => Ok(Inputs::Texts(texts.into_iter().map(|t| format!("{prompt}{t}")).collect())),
        (Inputs::TokenIds(_), Some(_)) if prompt_name.is_some() => {
            Err(RequestError::new(Fault::PromptWithTokenIds, "prompt_name applies to text input; token ids are taken as they are").param("prompt_name"))
        }
        (inputs, _) => Ok(inputs),
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    let denominator = norm(a) * norm(b);
    if denominator > 0.0 {
        dot / denominator
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_and_cosine() {
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-12);
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
