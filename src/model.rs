//! A loaded model: its tokenizer, its engine worker, and the path from inputs
//! to vectors.

use std::sync::Arc;
use std::time::Instant;

use eeane_backend_core::{EngineError, EngineSpec, Options};

use crate::batcher::{BatchPolicy, Bucket, EngineWorker, Launch, Pipeline, WorkerError};
use crate::config::{Config, ModelConfig};
use crate::pooling::{finish_vector, VectorOptions};
use crate::sync::Recover;
pub use crate::tokenize::Inputs;
use crate::tokenize::{Encoded, TextTokenizer, TokenizeError};

/// What a model answers for a request's inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// One vector per input, an input's windows averaged (an embedding model).
    Vectors(Vec<Vec<f32>>),
    /// One score per (query, document) pair: a cross-encoder's logit.
    Scores(Vec<f32>),
}

pub struct Inference {
    pub output: Output,
    /// Tokens the model processed, special tokens included.
    pub tokens: usize,
    /// The longest input's whole length in tokens, special tokens included,
    /// before truncation or windows (0 for pairs).
    pub longest_input: usize,
    /// The length of the model's vectors, before a request's `dimensions`
    /// (0 for scores).
    pub width: usize,
}

/// Why a model could not load or answer: its files, tokenizer, engine or
/// worker, or a caught panic; serving maps each to a `Fault`.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Integrity(#[from] crate::integrity::IntegrityError),
    #[error("model file {} does not exist", .0.display())]
    MissingFile(std::path::PathBuf),
    /// A Hub model's files could not be fetched or prepared.
    #[error(transparent)]
    Source(#[from] crate::pull::PullError),
    #[error("the request waited longer than queue_timeout before its inference started")]
    QueueTimeout,
    /// A bug: a panic in blocking work, caught so that only this request fails.
    #[error("model {model:?}: the {what} panicked ({message}); the server keeps serving: please report this")]
    Panicked { model: String, what: &'static str, message: String },
}

/// Runs `work` off the async workers; a panic in it becomes an error that
/// names the model and the work, instead of taking the request task down.
async fn blocking<T: Send + 'static>(model: &str, what: &'static str, work: impl FnOnce() -> T + Send + 'static) -> Result<T, ModelError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        let message = match e.try_into_panic() {
            Ok(payload) => panic_message(payload),
            Err(e) => e.to_string(),
        };
        ModelError::Panicked { model: model.to_string(), what, message }
    })
}

/// As `blocking`, on the calling async worker: for short work, where handing
/// it to the blocking pool and back (two thread wake-ups, and one more thread
/// allocating at once) costs about as much as the work.
fn inline<T>(model: &str, what: &'static str, work: impl FnOnce() -> T) -> Result<T, ModelError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|payload| ModelError::Panicked {
        model: model.to_string(),
        what,
        message: panic_message(payload),
    })
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// Inputs up to this many bytes are tokenized on the async worker that
/// received them. 1 KiB of English is about 250 tokens, at most a few hundred
/// microseconds; a single text is usually far shorter, and larger inputs go
/// to the blocking pool, where they cannot hold up other connections.
const INLINE_TOKENIZE_BYTES: usize = 1024;

/// How long a measurement (the survey, `eeane bench`) waits for a model's
/// background warm-up: eight CUDA sessions of all-MiniLM-L6-v2 ran their
/// batch shapes in 27-43 s on an H100 and an H200.
const WARM_WAIT: std::time::Duration = std::time::Duration::from_secs(180);

impl From<WorkerError> for ModelError {
    fn from(e: WorkerError) -> Self {
        match e {
            WorkerError::Engine(e) => ModelError::Engine(e),
            WorkerError::QueueTimeout => ModelError::QueueTimeout,
        }
    }
}

pub struct LoadedModel {
    pub config: ModelConfig,
    tokenizer: Arc<TextTokenizer>,
    worker: EngineWorker,
    /// Width of the model's vectors, measured by a warm-up pass at load.
    pub dimensions: usize,
    pub load_ms: u64,
    /// Where the engine runs.
    pub isolation: crate::config::Placement,
    /// For `precision = "auto"`: the variant chosen and why. Set again when
    /// a survey keeps the served fp32 reference (it measured that very copy).
    variant: std::sync::Mutex<Option<VariantNote>>,
}

/// Which variant `precision = "auto"` serves, and the survey behind it
/// (/health shows it as it is).
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct VariantNote {
    /// Engine and precision, e.g. "openvino bf16".
    pub chosen: String,
    /// The survey's verdict in words: its speed over fp32, and what was refused and why.
    pub reason: String,
    /// Its lowest cosine to the fp32 reference on the check texts.
    pub min_cosine: Option<f64>,
    /// Its speed over the fp32 reference, measured in the same run.
    pub speed_vs_reference: Option<f64>,
    /// Whether this load measured it (else the kept survey of this machine was read).
    pub measured_at_this_load: bool,
    /// Unix seconds of the survey.
    pub measured_at: u64,
    /// The fp32 reference, served until the survey now running chooses
    /// (the slot then switches to the variant chosen).
    #[serde(skip)]
    pub awaiting_survey: bool,
}

impl VariantNote {
    /// The fp32 reference (`label`), served while the survey runs.
    pub fn awaiting_survey(label: String) -> Self {
        VariantNote {
            chosen: label,
            reason: "the fp32 reference, served while the survey measures the variants on this machine".into(),
            min_cosine: Some(1.0),
            speed_vs_reference: Some(1.0),
            measured_at_this_load: false,
            measured_at: 0,
            awaiting_survey: true,
        }
    }
}

impl LoadedModel {
    /// Loads the tokenizer and engine, then embeds one short input so that a
    /// model that cannot answer fails here, not on a user's request.
    pub async fn load(config: &ModelConfig, server: &Config) -> Result<Self, ModelError> {
        let started = Instant::now();
        if let Some(reason) = &config.unavailable {
            return Err(ModelError::Engine(EngineError::Model(reason.clone())));
        }
        if config.source.is_some() {
            // A Hub model's weights come (and are prepared) at its first load.
            let (entry, server) = (config.clone(), server.clone());
            blocking(&config.id, "Hub fetch", move || entry.ensure_hub_prepared(&server)).await??;
        }
        let files = vec![config.model.path(), config.tokenizer.path()];
        blocking(&config.id, "manifest check", move || crate::integrity::verify(&files)).await??;
        // Refused before an engine starts when its weights cannot fit in this machine's memory.
        let sized = config.clone();
        if let Some(why) = blocking(&config.id, "memory check", move || sized.memory_refusal()).await? {
            return Err(ModelError::Source(crate::pull::PullError::Memory(why)));
        }
        let tokenizer = {
            let config = config.clone();
            blocking(&config.id.clone(), "tokenizer load", move || TextTokenizer::from_config(&config)).await??
        };
        let engine =
            crate::engines::find(&config.engine).ok_or_else(|| EngineError::Runtime(format!("engine {:?} is not compiled into this build", config.engine)))?;
        let isolation = config.isolation(&server.server);
        let launch = match isolation {
            crate::config::Placement::Thread => Launch::Thread(engine),
            crate::config::Placement::Process => Launch::Process { engine: config.engine.clone() },
        };
        let policy = batch_policy(config);
        let spec = EngineSpec {
            model_path: config.model.path(),
            runtime_library: server.runtimes.library(&config.engine, &config.device),
            // Set per engine by the batcher, one of `config.device` each.
            device: config.device.first().clone(),
            threads: config.threads,
            output: config.output.clone(),
            options: Options(serde_json::Value::Object(config.engine_options.clone())),
            forbidden_devices: server.server.forbidden_devices.clone(),
            // A reload after a keep-alive unload skips compiling (OpenVINO).
            compile_cache: Some(server.cache_dir().join("compiled").join(&config.engine)),
            compile_cache_limit: server.server.compile_cache_limit(),
            shapes: policy.buckets.iter().map(|b| (b.max_batch, b.max_tokens)).collect(),
            // Set per engine by the batcher, which gives each its CPUs.
            own_cpus_in_shared_process: false,
        };
        let pipeline = Pipeline { pooling: config.pooling, policy, pad_id: tokenizer.pad_id() };
        // A pattern (`cuda:H200*`) becomes one pin per matching card, each a session fed from this model's queue.
        let devices = {
            let (devices, forbidden, library) = (config.device.clone(), server.server.forbidden_devices.clone(), spec.runtime_library.clone());
            blocking(&config.id, "device list", move || engine.expand_devices(&devices, library.as_deref(), &forbidden)).await??
        };
        let worker = EngineWorker::start(&config.id, launch, devices, spec, pipeline).await?;
        let tokenizer = Arc::new(tokenizer);
        let warm = match config.kind {
            crate::config::ModelKind::Embedding => vec![tokenizer.encode_truncated("eeane")?],
            crate::config::ModelKind::Reranker => tokenizer.encode_pairs("eeane", &["eeane".to_string()], config.max_tokens)?,
        };
        let dimensions = worker.embed(warm, None).await?.first().map_or(0, Vec::len);
        if config.kind == crate::config::ModelKind::Reranker && dimensions != 1 {
            return Err(ModelError::Engine(EngineError::Model(format!(
                "a reranker's graph returns one score per pair; this one returns {dimensions} values (a one-label sequence-classification \
                 head, with pooling = \"none\")"
            ))));
        }
        Ok(Self {
            config: config.clone(),
            tokenizer,
            worker,
            dimensions,
            load_ms: started.elapsed().as_millis() as u64,
            isolation,
            variant: Default::default(),
        })
    }

    pub fn engine_info(&self) -> &eeane_backend_core::EngineInfo {
        self.worker.info()
    }

    /// For `precision = "auto"`: the variant served and why.
    pub fn variant(&self) -> Option<VariantNote> {
        self.variant.locked().clone()
    }

    pub fn set_variant(&self, note: VariantNote) {
        *self.variant.locked() = Some(note);
    }

    /// Waits, up to `WARM_WAIT`, until its engines have no idle work left
    /// (a GPU session's batch shapes run once after the load): a
    /// measurement taken meanwhile shares the device with that work.
    pub async fn warmed(&self) {
        self.worker.warmed(WARM_WAIT).await
    }

    /// Unloads it and waits, up to `limit`, until its engines have given
    /// their memory back.
    pub async fn unload(self, limit: std::time::Duration) {
        self.worker.unload(limit).await
    }

    pub fn stats(&self) -> &crate::batcher::WorkerStats {
        &self.worker.stats
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    /// Runs `work` with the model's tokenizer, off the async workers.
    pub async fn with_tokenizer<T: Send + 'static>(
        &self,
        work: impl FnOnce(&TextTokenizer) -> Result<T, crate::tokenize::TokenizeError> + Send + 'static,
    ) -> Result<T, ModelError> {
        let tokenizer = self.tokenizer.clone();
        Ok(blocking(&self.config.id, "tokenizer", move || work(&tokenizer)).await??)
    }

    /// Runs `inputs`: an embedding model's vectors, as its config makes them,
    /// or a reranker's scores; `deadline` bounds the wait before inference starts.
    pub async fn embed(&self, inputs: Arc<Inputs>, deadline: Option<Instant>) -> Result<Inference, ModelError> {
        self.embed_with(inputs, deadline, VectorOptions::default()).await
    }

    /// `embed`, with a request's `dimensions` and unit length applied to
    /// each vector (`pooling::finish_vector`, the one place vectors are
    /// normalized). An input split into windows gets the mean of its
    /// windows' vectors. A reranker's scores are never normalized.
    pub async fn embed_with(&self, inputs: Arc<Inputs>, deadline: Option<Instant>, options: VectorOptions) -> Result<Inference, ModelError> {
        let tokenizer = self.tokenizer.clone();
        // Tokenizing thousands of texts takes milliseconds: only small inputs stay on the async worker.
        let started = Instant::now();
        let (groups, longest_input): (Vec<Vec<Encoded>>, usize) = if inputs.bytes() <= INLINE_TOKENIZE_BYTES {
            inline(&self.config.id, "tokenizer", || tokenizer.encode_measured(&inputs))??
        } else {
            blocking(&self.config.id, "tokenizer", move || tokenizer.encode_measured(&inputs)).await??
        };
        let tokenized = started.elapsed();
        let counts: Vec<usize> = groups.iter().map(Vec::len).collect();
        let seqs: Vec<Encoded> = groups.into_iter().flatten().collect();
        let tokens = seqs.iter().map(|s| s.ids.len()).sum();
        let sequences = seqs.len();
        let mut vectors = self.worker.embed(seqs, deadline).await?.into_iter();
        tracing::debug!(model = %self.config.id, sequences, tokenize_ms = tokenized.as_secs_f64() * 1e3, total_ms = started.elapsed().as_secs_f64() * 1e3, "embedded");
        let mut width = 0;
        let output = match self.config.kind {
            // One pair, one sequence, one value (checked at load).
            crate::config::ModelKind::Reranker => Output::Scores(vectors.map(|v| v.first().copied().unwrap_or(f32::NAN)).collect()),
            crate::config::ModelKind::Embedding => Output::Vectors(
                counts
                    .into_iter()
                    .map(|n| {
                        let window_vectors: Vec<Vec<f32>> = vectors.by_ref().take(n).collect();
                        width = window_vectors.first().map_or(0, Vec::len);
                        finish_vector(window_vectors, self.config.normalize, options)
                    })
                    .collect(),
            ),
        };
        Ok(Inference { output, tokens, longest_input, width })
    }
}

/// The cheap start-up checks for a model that loads later: its files exist,
/// its tokenizer parses, its engine's runtime library opens.
pub fn check_files(config: &ModelConfig, server: &Config) -> Result<(), ModelError> {
    let model = config.model.path();
    if !model.exists() {
        return Err(ModelError::MissingFile(model));
    }
    TextTokenizer::from_config(config)?;
    let engine =
        crate::engines::find(&config.engine).ok_or_else(|| EngineError::Runtime(format!("engine {:?} is not compiled into this build", config.engine)))?;
    let library = server.runtimes.library(&config.engine, &config.device);
    if let Some(problem) = engine.device_problem(&config.device, library.as_deref(), &server.server.forbidden_devices) {
        return Err(EngineError::Device(problem).into());
    }
    if engine.device_runtime(&config.device).is_some() {
        // Another build of the runtime, opened by the model's own engine process.
        return Ok(());
    }
    engine.open(library.as_deref())?;
    Ok(())
}

/// The batcher's policy from a model's config: its buckets, closed by one of
/// the longest sequence the model can see (`max_tokens`, or `window` for a
/// windowed model) x `max_batch` when they stop short of it.
pub fn batch_policy(config: &ModelConfig) -> BatchPolicy {
    let longest = match config.long_text {
        crate::config::LongText::Truncate => config.max_tokens,
        crate::config::LongText::Window => config.window,
    };
    let mut buckets: Vec<Bucket> = config.buckets.iter().filter(|b| b.max_tokens <= longest).copied().collect();
    if buckets.last().is_none_or(|b| b.max_tokens < longest) {
        buckets.push(Bucket { max_tokens: longest, max_batch: config.max_batch });
    }
    BatchPolicy {
        buckets,
        max_batch_tokens: config.max_batch_tokens,
        pad_to_multiple_of: config.pad_to_multiple_of.unwrap_or(0),
        pad_to_bucket: false,
        order: config.batch_order,
        call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
        row_counts: Vec::new(),
    }
}

#[cfg(test)]
mod blocking_tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_blocking_work_is_an_error_naming_the_model() {
        let e = blocking("m", "tokenizer", || -> u32 { panic!("bad byte at 7") }).await.unwrap_err();
        assert!(matches!(&e, ModelError::Panicked { model, what: "tokenizer", message } if model == "m" && message == "bad byte at 7"), "{e}");
        let api = crate::http::error::ApiError::from(crate::serving::RequestError::from(&e));
        assert_eq!(api.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(blocking("m", "tokenizer", || 3).await.unwrap(), 3);
    }

    #[test]
    fn a_panic_in_inline_work_is_the_same_error() {
        let e = inline("m", "tokenizer", || -> u32 { panic!("bad byte at {}", 7) }).unwrap_err();
        assert!(matches!(&e, ModelError::Panicked { model, what: "tokenizer", message } if model == "m" && message == "bad byte at 7"), "{e}");
        assert_eq!(inline("m", "tokenizer", || 3).unwrap(), 3);
    }
}
