//! Shared tokenization: text or caller-supplied token ids become the exact
//! sequences the model sees, special tokens, truncation and long-text windows
//! included. Engines never tokenize.

mod bert_wordpiece;
mod hf;
mod sentencepiece;

use std::ops::Range;
use std::path::Path;

use rayon::prelude::*;

use crate::config::{LongText, ModelConfig, RerankTemplate, TokenIds};
use crate::rerank_template::PartRole;

/// What a request asks to embed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Inputs {
    Texts(Vec<String>),
    /// Content token ids in the model's own vocabulary (its special tokens are added).
    TokenIds(Vec<Vec<i64>>),
    /// A query and documents, each document joined to the query as one pair
    /// (a cross-encoder's input).
    Pairs {
        query: String,
        documents: Vec<String>,
        /// A language-model reranker's instruction, in place of its template's.
        instruction: Option<String>,
    },
}

impl Inputs {
    /// The size of the text to tokenize, in bytes (a token id counts 8).
    pub fn bytes(&self) -> usize {
        match self {
            Inputs::Texts(texts) => texts.iter().map(String::len).sum(),
            Inputs::TokenIds(all) => all.iter().map(|ids| ids.len() * 8).sum(),
            Inputs::Pairs { query, documents, .. } => documents.iter().map(|d| query.len() + d.len()).sum(),
        }
    }
}

/// One sequence ready for an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenizeError {
    #[error("token id {id} (input {input}, position {position}) is outside the model's vocabulary (0..{vocab_size})")]
    OutOfVocabulary { input: usize, position: usize, id: i64, vocab_size: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("the query is {query} tokens; with the model's {specials} special tokens that leaves no room for a document in its {max_tokens}")]
    QueryTooLong { query: usize, specials: usize, max_tokens: usize },
}

/// What the shared layer needs of a tokenizer library: its vocabulary, the
/// content ids of a text, and its special tokens around a sequence.
trait Vocabulary: Send + Sync {
    fn vocab_size(&self) -> usize;
    fn pad_id(&self) -> i64;
    /// Special tokens added to one sequence.
    fn specials(&self) -> usize;
    /// A text's ids without special tokens.
    fn content(&self, text: &str) -> Result<Vec<u32>, TokenizeError>;
    /// `id` as a vocabulary id, if it is one.
    fn check_id(&self, id: i64) -> Option<u32>;
    /// The special tokens around `content`, with its type ids.
    fn wrap(&self, content: &[u32]) -> Result<Encoded, TokenizeError>;
    /// The pair template, for a cross-encoder (tokenizer.json only).
    fn pairs(&self) -> Option<&hf::HfTokenizer> {
        None
    }
    /// Each token of `text` with its place in it, special tokens added when
    /// `add_special` (TEI's `/tokenize`).
    fn tokens(&self, _text: &str, _add_special: bool) -> Result<Vec<Token>, TokenizeError> {
        Err(TokenizeError::Tokenizer("listing tokens with their offsets needs a tokenizer.json; this model has a SentencePiece model".into()))
    }
    /// The text of `ids` (TEI's `/decode`).
    fn decode(&self, _ids: &[u32], _skip_special: bool) -> Result<String, TokenizeError> {
        Err(TokenizeError::Tokenizer("decoding needs a tokenizer.json; this model has a SentencePiece model".into()))
    }
}

/// One token of a text, as `/tokenize` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Token {
    pub id: u32,
    /// The text it stands for; a special token's own string.
    pub text: String,
    pub special: bool,
    /// Byte offsets of `text` in the input (none for a special token).
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

/// How inputs longer than the model's window become sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Keep the first `max_tokens` tokens (special tokens included).
    Truncate { max_tokens: usize },
    /// Windows of `window` tokens (special tokens included) whose content starts
    /// `stride` content tokens apart; the last window reaches the input's end.
    Window { window: usize, stride: usize },
}

impl Split {
    pub fn of(config: &ModelConfig) -> Self {
        match config.long_text {
            LongText::Truncate => Split::Truncate { max_tokens: config.max_tokens },
            LongText::Window => Split::Window { window: config.window, stride: config.stride },
        }
    }
}

/// From this many texts in one request, tokenization is spread over rayon's
/// pool (one thread per core), in runs of at least `PARALLEL_CHUNK` texts; a
/// paragraph takes about 0.02 ms (BERT's short way) to 0.3 ms (the
/// tokenizers crate's whole way), a hand-off a few microseconds.
const PARALLEL_FROM: usize = 16;
const PARALLEL_CHUNK: usize = 4;

pub struct TextTokenizer {
    backend: Box<dyn Vocabulary>,
    split: Split,
    /// A language-model reranker's template: pairs are written into it.
    rerank_template: Option<TemplateIds>,
}

/// A rerank template with its fixed parts tokenized once, at load.
struct TemplateIds {
    template: RerankTemplate,
    /// Each part's ids when it holds no placeholder.
    fixed: Vec<Option<Vec<i64>>>,
    document: usize,
    query: Option<usize>,
}

impl TextTokenizer {
    /// A `.model` file is SentencePiece (its ids numbered by `ids`); anything
    /// else is read as a Hugging Face `tokenizer.json`.
    pub fn load(path: &Path, ids: TokenIds, split: Split) -> Result<Self, TokenizeError> {
        let backend: Box<dyn Vocabulary> = if path.extension().is_some_and(|e| e == "model") {
            Box::new(sentencepiece::SpTokenizer::from_file(path, ids)?)
        } else {
            Box::new(hf::HfTokenizer::from_file(path)?)
        };
        let tokenizer = Self { backend, split, rerank_template: None };
        let specials = tokenizer.backend.specials();
        let (length, stride) = match split {
            Split::Truncate { max_tokens } => (max_tokens, 1),
            Split::Window { window, stride } => (window, stride),
        };
        if length <= specials || stride == 0 || stride > length - specials {
            return Err(TokenizeError::Tokenizer(format!(
                "{}: {length} tokens leave {} for content after {specials} special tokens, stride {stride}: \
                 need at least one content token and 1 <= stride <= the content per window",
                path.display(),
                length.saturating_sub(specials)
            )));
        }
        Ok(tokenizer)
    }

    pub fn from_config(config: &ModelConfig) -> Result<Self, TokenizeError> {
        let mut tokenizer = Self::load(&config.tokenizer.path(), config.tokenizer_ids, Split::of(config))?;
        if let Some(template) = &config.rerank_template {
            if let Some(problem) = template.problem() {
                return Err(TokenizeError::Tokenizer(format!("rerank_template: {problem}")));
            }
            let fixed = template
                .parts
                .iter()
                .map(|part| match RerankTemplate::role(part) {
                    PartRole::Fixed => tokenizer.ids(part).map(Some),
                    PartRole::Request | PartRole::Document => Ok(None),
                })
                .collect::<Result<_, _>>()?;
            let (document, query) = (template.document_part().expect("checked by problem()"), template.query_part());
            tokenizer.rerank_template = Some(TemplateIds { template: template.clone(), fixed, document, query });
        }
        Ok(tokenizer)
    }

    pub fn vocab_size(&self) -> usize {
        self.backend.vocab_size()
    }

    pub fn pad_id(&self) -> i64 {
        self.backend.pad_id()
    }

    /// The sequences for each input, in order: one per input when truncating,
    /// one per window otherwise. Token ids are validated against the vocabulary.
    pub fn encode(&self, inputs: &Inputs) -> Result<Vec<Vec<Encoded>>, TokenizeError> {
        Ok(self.encode_measured(inputs)?.0)
    }

    /// As `encode`, with the longest input's whole length in tokens (special
    /// tokens included) before truncation or windows: what a client that asks
    /// not to truncate is refused by. Many texts are tokenized on all cores, so
    /// that one large request does not leave an accelerator waiting on one core.
    pub fn encode_measured(&self, inputs: &Inputs) -> Result<(Vec<Vec<Encoded>>, usize), TokenizeError> {
        let measured: Vec<(Vec<Encoded>, usize)> = match inputs {
            Inputs::Texts(texts) if texts.len() >= PARALLEL_FROM => {
                texts.par_iter().with_min_len(PARALLEL_CHUNK).map(|t| self.split(&self.backend.content(t)?)).collect::<Result<_, _>>()?
            }
            Inputs::Texts(texts) => texts.iter().map(|t| self.split(&self.backend.content(t)?)).collect::<Result<_, _>>()?,
            Inputs::TokenIds(all) => all
                .iter()
                .enumerate()
                .map(|(input, ids)| {
                    let content = ids
                        .iter()
                        .enumerate()
                        .map(|(position, &id)| {
                            self.backend.check_id(id).ok_or(TokenizeError::OutOfVocabulary { input, position, id, vocab_size: self.vocab_size() })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    self.split(&content)
                })
                .collect::<Result<_, _>>()?,
            Inputs::Pairs { query, documents, instruction } => {
                let max_tokens = match self.split {
                    Split::Truncate { max_tokens } => max_tokens,
                    Split::Window { window, .. } => window,
                };
                let encoded = match &self.rerank_template {
                    Some(frame) => self.encode_templated(frame, instruction.as_deref(), query, documents, max_tokens)?,
                    None => self.encode_pairs(query, documents, max_tokens)?,
                };
                return Ok((encoded.into_iter().map(|e| vec![e]).collect(), 0));
            }
        };
        let longest = measured.iter().map(|(_, tokens)| *tokens).max().unwrap_or(0);
        Ok((measured.into_iter().map(|(sequences, _)| sequences).collect(), longest))
    }

    /// One sequence per (query, document) pair, joined by the model's pair
    /// template, for a cross-encoder: the query is kept whole and each document
    /// cut to what is left of `max_tokens` (as Hugging Face's `only_second`).
    pub fn encode_pairs(&self, query: &str, documents: &[String], max_tokens: usize) -> Result<Vec<Encoded>, TokenizeError> {
        let Some(hf) = self.backend.pairs() else {
            return Err(TokenizeError::Tokenizer("pairs need a tokenizer.json with a pair template; this model has a SentencePiece model".into()));
        };
        let query = hf.content(query)?;
        let room = max_tokens.saturating_sub(query.len() + hf.pair_specials());
        if room == 0 {
            return Err(TokenizeError::QueryTooLong { query: query.len(), specials: hf.pair_specials(), max_tokens });
        }
        let pair = |d: &String| {
            let document = hf.content(d)?;
            hf.wrap_pair(&query, &document[..document.len().min(room)])
        };
        if documents.len() >= PARALLEL_FROM {
            documents.par_iter().with_min_len(PARALLEL_CHUNK).map(pair).collect()
        } else {
            documents.iter().map(pair).collect()
        }
    }

    /// A text's ids without special tokens.
    fn ids(&self, text: &str) -> Result<Vec<i64>, TokenizeError> {
        Ok(self.backend.content(text)?.into_iter().map(i64::from).collect())
    }

    /// One sequence per document for a language-model reranker, as its model
    /// card builds them: the template's parts filled and tokenized apart
    /// (those without `{document}` once a request), the query's part cut to
    /// `query_tokens`, the document's part cut so that the parts up to it fit
    /// `pair_tokens` and all of them `max_tokens`.
    fn encode_templated(
        &self,
        frame: &TemplateIds,
        instruction: Option<&str>,
        query: &str,
        documents: &[String],
        max_tokens: usize,
    ) -> Result<Vec<Encoded>, TokenizeError> {
        let template = &frame.template;
        let mut parts = Vec::with_capacity(template.parts.len());
        for (i, part) in template.parts.iter().enumerate() {
            parts.push(match (&frame.fixed[i], RerankTemplate::role(part)) {
                (Some(ids), _) => ids.clone(),
                (None, PartRole::Document) => Vec::new(),
                (None, _) => {
                    let mut ids = self.ids(&template.fill(part, instruction, query, ""))?;
                    if Some(i) == frame.query {
                        ids.truncate(template.query_tokens.unwrap_or(usize::MAX));
                    }
                    ids
                }
            });
        }
        let before: usize = parts[..frame.document].iter().map(Vec::len).sum();
        let after: usize = parts[frame.document + 1..].iter().map(Vec::len).sum();
        let room = max_tokens.saturating_sub(before + after).min(template.pair_tokens.map_or(usize::MAX, |n| n.saturating_sub(before)));
        if room == 0 {
            return Err(TokenizeError::QueryTooLong {
                query: before + after,
                specials: 0,
                max_tokens: max_tokens.min(template.pair_tokens.unwrap_or(max_tokens)),
            });
        }
        let one = |document: &String| {
            let mut body = self.ids(&template.fill(&template.parts[frame.document], instruction, query, document))?;
            body.truncate(room);
            let ids: Vec<i64> = parts[..frame.document].iter().flatten().chain(&body).chain(parts[frame.document + 1..].iter().flatten()).copied().collect();
            Ok(Encoded { type_ids: vec![0; ids.len()], ids })
        };
        if documents.len() >= PARALLEL_FROM {
            documents.par_iter().with_min_len(PARALLEL_CHUNK).map(one).collect()
        } else {
            documents.iter().map(one).collect()
        }
    }

    /// Every token of `text` (not truncated), with its byte offsets.
    pub fn tokens(&self, text: &str, add_special: bool) -> Result<Vec<Token>, TokenizeError> {
        self.backend.tokens(text, add_special)
    }

    /// The text of `ids`, which must be in the vocabulary.
    pub fn decode(&self, ids: &[i64], skip_special: bool) -> Result<String, TokenizeError> {
        let ids = ids
            .iter()
            .enumerate()
            .map(|(position, &id)| self.backend.check_id(id).ok_or(TokenizeError::OutOfVocabulary { input: 0, position, id, vocab_size: self.vocab_size() }))
            .collect::<Result<Vec<_>, _>>()?;
        self.backend.decode(&ids, skip_special)
    }

    /// One sequence per input, truncated whatever the model's long-text mode
    /// (for warm-up and checks).
    pub fn encode_truncated(&self, text: &str) -> Result<Encoded, TokenizeError> {
        let content = self.backend.content(text)?;
        let max = match self.split {
            Split::Truncate { max_tokens } => max_tokens,
            Split::Window { window, .. } => window,
        };
        self.backend.wrap(&content[..content.len().min(max - self.backend.specials())])
    }

    /// The sequences of one input's content, and its whole length in tokens.
    fn split(&self, content: &[u32]) -> Result<(Vec<Encoded>, usize), TokenizeError> {
        let specials = self.backend.specials();
        let sequences = match self.split {
            Split::Truncate { max_tokens } => vec![self.backend.wrap(&content[..content.len().min(max_tokens - specials)])?],
            Split::Window { window, stride } => {
                window_ranges(content.len(), window - specials, stride).into_iter().map(|r| self.backend.wrap(&content[r])).collect::<Result<_, _>>()?
            }
        };
        Ok((sequences, content.len() + specials))
    }
}

/// Content ranges of `per` tokens starting `stride` apart, the last one
/// reaching `n`; an empty input is one empty window.
pub fn window_ranges(n: usize, per: usize, stride: usize) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(n.saturating_sub(per) / stride + 1);
    let mut start = 0;
    loop {
        let end = (start + per).min(n);
        out.push(start..end);
        if end >= n {
            return out;
        }
        start += stride;
    }
}

#[cfg(test)]
mod tests {
    use super::window_ranges;

    #[test]
    fn windows_cover_the_input_with_the_given_stride() {
        assert_eq!(window_ranges(0, 126, 96), vec![0..0]);
        assert_eq!(window_ranges(126, 126, 96), vec![0..126]);
        assert_eq!(window_ranges(127, 126, 96), vec![0..126, 96..127]);
        assert_eq!(window_ranges(300, 126, 96), vec![0..126, 96..222, 192..300]);
        assert_eq!(window_ranges(5, 2, 2), vec![0..2, 2..4, 4..5]);
    }
}
