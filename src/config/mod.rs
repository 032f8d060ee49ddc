//! Layered configuration: built-in defaults < TOML file < `EEANE_*` environment < CLI flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use eeane_backend_core::Devices;
pub use eeane_backend_core::Isolation as Placement;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::magic::RelativePathBuf;
use figment::Figment;
use serde::{Deserialize, Serialize, Serializer};

mod size;
mod sources;
mod validate;

/// The built-in defaults, including the default model.
pub const DEFAULTS: &str = include_str!("../../config/default.toml");

/// `EEANE_<KEY>` sets `server.<key>` for these.
const SHORT_SERVER_KEYS: &[&str] = &[
    "host",
    "port",
    "api_key",
    "max_inputs",
    "max_request_bytes",
    "keep_alive",
    "max_loaded_models",
    "max_pending_requests",
    "queue_timeout",
    "accept_token_ids",
    "max_connections",
];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    #[serde(default)]
    pub runtimes: RuntimesConfig,
    #[serde(default)]
    pub models: Vec<ModelConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// When set, every endpoint but `GET /health` needs `Authorization: Bearer <key>`.
    #[serde(default, serialize_with = "redact")]
    pub api_key: Option<String>,
    /// Most inputs in one embeddings request.
    pub max_inputs: usize,
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: usize,
    /// Where runtimes and converted models live; "" means $EEANE_CACHE_DIR or ~/.cache/eeane.
    pub cache_dir: String,
    /// Load policy of entries that set none.
    pub default_load_policy: LoadPolicy,
    /// Seconds an on-demand model stays loaded after its last request; 0 unloads
    /// at once, negative never unloads.
    pub keep_alive: i64,
    /// Most models in memory at once; unset means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loaded_models: Option<usize>,
    /// Most inference requests admitted at once, running plus waiting; 0 = unlimited.
    pub max_pending_requests: usize,
    /// Seconds a request may wait before its inference starts; 0 = no limit.
    pub queue_timeout: u64,
    /// Identical requests in flight share one inference.
    pub coalesce_requests: bool,
    /// Seconds to wait for in-flight requests at shutdown; unset waits for all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown_timeout: Option<u64>,
    /// GET /health requests per minute per client IP; 0 = no limit.
    pub health_rate_limit: u32,
    /// Serve GET /metrics without the API key (for a scraper on a trusted network).
    #[serde(default)]
    pub metrics_public: bool,
    /// Take token-id arrays as input (models that set none). Off by default:
    /// the usual sender is LangChain's OpenAIEmbeddings, whose tiktoken ids are
    /// not the model's vocabulary and would embed as silent nonsense.
    #[serde(default)]
    pub accept_token_ids: bool,
    /// GPU names (or substrings) no model may use, whatever its entry says:
    /// the card driving the desktop, for one.
    #[serde(default)]
    pub forbidden_devices: Vec<String>,
    /// Where engines run (models that set none).
    #[serde(default)]
    pub isolation: Isolation,
    /// Fetch a `source = "hf:..."` model's files from the Hugging Face Hub when
    /// the HF cache lacks them (at start for its configs, at its first load for
    /// its weights). false: the cache only, as with HF_HUB_OFFLINE=1.
    #[serde(default = "yes")]
    pub hub_downloads: bool,
    /// Most MiB each engine's compile cache ({cache}/compiled/ENGINE) holds:
    /// past it, the least recently used compiled models are removed. 0: no bound.
    #[serde(default = "default_compile_cache_mib")]
    pub compile_cache_max_mib: u64,
    /// Seconds a client has to send a whole request head (request line and
    /// headers), counted from its first byte, or from the accept for a new
    /// connection. 0 = no limit.
    pub header_read_timeout: u64,
    /// Seconds a request body may go without a byte arriving: progress, not
    /// total time, so a large body on a slow link passes and a stalled one is
    /// cut (408). 0 = no limit.
    pub body_read_timeout: u64,
    /// Seconds a kept-alive connection may wait for its next request before
    /// it is closed. Longer than a proxy's pool timeout (nginx: 60 s), so the
    /// proxy, not eeane, closes its idle connections. 0 = no limit.
    pub idle_connection_timeout: u64,
    /// Seconds writing a response may make no progress (a client that stopped
    /// reading) before the connection is cut. 0 = no limit.
    pub write_timeout: u64,
    /// Most client connections open at once; past it the connection idle or
    /// stuck longest is closed to make room, or the new one is refused. Unset:
    /// the open-file limit less a reserve for models, engine pipes and
    /// runtimes (`http::connections::connection_cap`); a larger value is held to that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
}

impl ServerConfig {
    /// A timeout key in seconds as a Duration; 0 means none.
    pub fn timeout(seconds: u64) -> Option<std::time::Duration> {
        (seconds > 0).then(|| std::time::Duration::from_secs(seconds))
    }
}

/// Where a model's engine runs, as the config says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// The engine's choice for the model's device (`Backend::default_isolation`):
    /// a thread for ncnn on a Vulkan GPU, a process for the rest.
    #[default]
    Auto,
    /// `Placement::Process`: a child process of its own.
    Process,
    /// `Placement::Thread`: a thread of the server process.
    Thread,
}

impl Isolation {
    /// Where a model of `engine` on `device` runs: `auto` is the engine's choice.
    pub fn resolve(self, engine: &str, device: &Devices) -> Placement {
        match self {
            Isolation::Auto => crate::engines::find(engine).map_or(Placement::Process, |e| e.default_isolation(device)),
            Isolation::Process => Placement::Process,
            Isolation::Thread => Placement::Thread,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadPolicy {
    /// Loaded by the first request that needs it; unloaded after keep_alive idle.
    #[default]
    OnDemand,
    /// Loaded before the port is bound; never unloaded.
    Resident,
    /// Kept in the file, not served.
    Disabled,
}

/// Each engine's runtime library by engine name (libonnxruntime.so,
/// OpenVINO's libopenvino_c.so, eeane's ncnn shim), and by the key an engine
/// gives for a device that needs another build (`onnxruntime-cuda`); a key
/// left out opens its default (`Backend::default_runtime`,
/// `Backend::device_runtime`), under the cache.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct RuntimesConfig(BTreeMap<String, ConfigPath>);

impl RuntimesConfig {
    /// The runtime library an engine opens for a model on `device`; `None`
    /// for one that opens none.
    pub fn library(&self, engine: &str, device: &Devices) -> Option<PathBuf> {
        let key = crate::engines::find(engine).and_then(|e| e.device_runtime(device)).map_or(engine, |r| r.key);
        self.0.get(key).map(ConfigPath::path)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    #[default]
    Embedding,
    /// A cross-encoder: scores a (query, document) pair; served on /rerank.
    Reranker,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Mean of the token states under the attention mask.
    #[default]
    Mean,
    /// The first token's state.
    Cls,
    /// The graph pools itself; its output is used as it comes.
    None,
    /// The largest value of each dimension over the real tokens
    /// (sentence-transformers' pooling_mode_max_tokens).
    Max,
    /// The last real token's state (pooling_mode_lasttoken, for decoder models).
    LastToken,
    /// The sum of the token states over the square root of their count
    /// (pooling_mode_mean_sqrt_len_tokens).
    MeanSqrtLen,
}

/// What a cross-encoder's logit goes through to become /rerank's score
/// (sentence-transformers' CrossEncoder activation_fn; `raw_scores` skips it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreActivation {
    /// 1 / (1 + e^-x): CrossEncoder's default for one label.
    #[default]
    Sigmoid,
    /// The logit as it is.
    Identity,
}

/// How a SentencePiece vocabulary is numbered (ignored for tokenizer.json).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenIds {
    /// The `.model` file's own ids (code-daemon: pad=0 unk=1 bos=2 eos=3).
    #[default]
    Raw,
    /// XLM-R's HF convention: <s>=0 <pad>=1 </s>=2 <unk>=3, pieces shifted by one.
    Fairseq,
}

/// What happens to an input longer than the model takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LongText {
    /// Keep the first max_tokens tokens.
    #[default]
    Truncate,
    /// Embed overlapping windows and average their vectors.
    Window,
}

fn default_window() -> usize {
    128
}
fn default_stride() -> usize {
    96
}

fn yes() -> bool {
    true
}
fn default_max_batch() -> usize {
    32
}
fn default_max_batch_tokens() -> usize {
    8192
}

/// One length bucket of a model: sequences up to `max_tokens`, `max_batch` per batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    pub max_tokens: usize,
    pub max_batch: usize,
}

/// Buckets doubling from 32 tokens up to `max_tokens`, each about 4,096
/// tokens a batch (between 4 and 64 rows).
fn default_compile_cache_mib() -> u64 {
    2048
}

impl ServerConfig {
    /// The compile cache's bound in bytes, `None` for none.
    pub fn compile_cache_limit(&self) -> Option<u64> {
        (self.compile_cache_max_mib > 0).then_some(self.compile_cache_max_mib << 20)
    }
}

pub fn length_ladder(max_tokens: usize) -> Vec<Bucket> {
    let mut ladder = Vec::new();
    let mut tokens = 32;
    loop {
        let t = tokens.min(max_tokens);
        ladder.push(Bucket { max_tokens: t, max_batch: (4096 / t.max(1)).clamp(4, 64) });
        if t >= max_tokens {
            return ladder;
        }
        tokens *= 2;
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchOrder {
    /// Sort waiting sequences by length and batch similar lengths together.
    #[default]
    Sorted,
    /// Arrival order, padded to each batch's longest (a baseline for `eeane bench`).
    Arrival,
}

pub use crate::rerank_template::RerankTemplate;

/// One `[[models]]` entry. Keys that are not fields here belong to the
/// model's engine: its `Backend::options` checks them (`engine_options`), so
/// a key that neither knows is refused.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ModelConfig {
    pub id: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub kind: ModelKind,
    /// Required unless `source` names a Hub repository (then "onnxruntime").
    #[serde(default)]
    pub engine: String,
    /// Required unless `source` names a Hub repository (then the prepared model's).
    #[serde(default)]
    pub model: ConfigPath,
    #[serde(default)]
    pub tokenizer: ConfigPath,
    /// A Hugging Face repository, `hf:ORG/NAME[@REVISION]`: engine, files,
    /// pooling, normalize and max_tokens are read from it (sentence-transformers'
    /// files) unless set here, and it is fetched and prepared when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// With `source`: one of the repository's ONNX variants to serve instead
    /// (onnx/model_O4.onnx, onnx/model_quantized.onnx); served only when its
    /// cosine to the fp32 graph, measured on check texts, is at least 0.9999.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onnx_file: Option<String>,
    /// Each value read from `source`, and the file it came from (check-config shows them).
    #[serde(skip)]
    pub inferred: Vec<(String, String)>,
    /// Why `source` could not be read: the model fails with this, the others serve.
    #[serde(skip)]
    pub unavailable: Option<String>,
    /// Named prompts put before each text input, as sentence-transformers'
    /// prompts are (`{ query = "query: " }`); a request's `prompt_name` picks one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prompts: BTreeMap<String, String>,
    /// The prompt for requests that name none (sentence-transformers' default_prompt_name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_prompt_name: Option<String>,
    #[serde(default)]
    pub pooling: Pooling,
    #[serde(default = "yes")]
    pub normalize: bool,
    /// An embedding model that also answers /rerank, by the cosine of the
    /// query's and each document's vectors.
    #[serde(default)]
    pub rerank: bool,
    /// A reranker's score: its logit through this (default sigmoid).
    #[serde(default)]
    pub score_activation: ScoreActivation,
    /// A reranker that is a language model (Qwen3-Reranker): each pair is
    /// written into this template and scored by the model's own graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank_template: Option<RerankTemplate>,
    /// Longest input in tokens, special tokens included; longer inputs are truncated.
    /// Required unless `source` gives it.
    #[serde(default)]
    pub max_tokens: usize,
    /// Numbering of a SentencePiece tokenizer's ids: raw | fairseq.
    #[serde(default)]
    pub tokenizer_ids: TokenIds,
    /// truncate | window: longer inputs become overlapping windows whose vectors are averaged.
    #[serde(default)]
    pub long_text: LongText,
    /// Tokens per window, special tokens included (long_text = "window").
    #[serde(default = "default_window")]
    pub window: usize,
    /// Content tokens between the starts of two windows (long_text = "window").
    #[serde(default = "default_stride")]
    pub stride: usize,
    /// Device, or devices in order of preference: "cpu" for onnxruntime;
    /// "CPU", "GPU", "NPU" or a list of them for openvino.
    #[serde(default)]
    pub device: Devices,
    /// Engine compute threads; 0 lets the runtime choose.
    #[serde(default)]
    pub threads: usize,
    /// Most sequences in one forward pass (when no buckets are given).
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// Length buckets, ascending; unset means one bucket of max_tokens and max_batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<Bucket>,
    /// Most tokens (rows x padded length) in one forward pass.
    #[serde(default = "default_max_batch_tokens")]
    pub max_batch_tokens: usize,
    /// A batch runs at its longest sequence rounded up to a multiple of this;
    /// unset takes the engine's preference (1 for ONNX Runtime on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_to_multiple_of: Option<usize>,
    #[serde(default)]
    pub batch_order: BatchOrder,
    /// Graph output to read; unset takes the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The engine's own keys (precision, spin, pack_tokens, Core ML's
    /// artifact tables...), in the normal form its `Backend::options` gave
    /// them after checking: defaults filled in, paths resolved.
    #[serde(skip_deserializing, flatten)]
    pub engine_options: serde_json::Map<String, serde_json::Value>,
    /// Overrides server.default_load_policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_policy: Option<LoadPolicy>,
    /// Overrides server.accept_token_ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_token_ids: Option<bool>,
    /// Overrides server.keep_alive, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive: Option<i64>,
    /// Overrides server.isolation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// Set by `precision = "auto"`: the variant served is the fastest whose
    /// vectors stay within cosine 0.9999 of the fp32 graph, measured on this
    /// machine (src/variants.rs). `engine` then names the reference engine.
    /// `Config::to_toml` writes it back as `precision = "auto"`.
    #[serde(skip)]
    pub auto_precision: Option<AutoPrecision>,
}

/// Which engines `precision = "auto"` may choose among.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoPrecision {
    /// The entry names no engine: every CPU engine of this build.
    AnyEngine,
    /// The entry names its engine: that engine's precisions only.
    ItsEngine,
}

impl ModelConfig {
    pub fn policy(&self, server: &ServerConfig) -> LoadPolicy {
        self.load_policy.unwrap_or(server.default_load_policy)
    }

    pub fn accepts_token_ids(&self, server: &ServerConfig) -> bool {
        self.accept_token_ids.unwrap_or(server.accept_token_ids)
    }

    pub fn keep_alive(&self, server: &ServerConfig) -> i64 {
        self.keep_alive.unwrap_or(server.keep_alive)
    }

    /// Where this model's engine runs, `auto` resolved.
    pub fn isolation(&self, server: &ServerConfig) -> Placement {
        self.isolation.unwrap_or(server.isolation).resolve(&self.engine, &self.device)
    }

    /// The precision its engine keys select, as its engine reads them
    /// (`Backend::configured_precision`); `None` when they name none.
    pub fn configured_precision(&self) -> Option<String> {
        let options = eeane_backend_core::Options(serde_json::Value::Object(self.engine_options.clone()));
        crate::engines::find(&self.engine)?.configured_precision(&options)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.id.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// A path in the config: `{cache}/...`, `~/...`, absolute, or relative to the
/// file that set it. After `Config::load` it holds the resolved absolute path.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct ConfigPath(RelativePathBuf);

impl Default for ConfigPath {
    fn default() -> Self {
        ConfigPath(RelativePathBuf::from(PathBuf::new()))
    }
}

impl ConfigPath {
    /// A path as a config file would give it (`{cache}/...` resolves at load).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ConfigPath(RelativePathBuf::from(path.into()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.original().as_os_str().is_empty()
    }
}

impl ConfigPath {
    pub fn path(&self) -> PathBuf {
        self.0.relative()
    }

    fn resolve(&mut self, cache: &Path) {
        let original = self.0.original().to_string_lossy().into_owned();
        let resolved = match original.starts_with("{cache}") || original.starts_with("~/") {
            true => resolve_path(&original, cache, Path::new("")),
            false => self.0.relative(),
        };
        self.0 = RelativePathBuf::from(resolved);
    }
}

impl Serialize for ConfigPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.path().serialize(s)
    }
}

/// A path as a config file writes it: `{cache}/...`, `~/...`, absolute, or
/// relative to `base` (the file's directory).
pub(crate) fn resolve_path(written: &str, cache: &Path, base: &Path) -> PathBuf {
    if let Some(rest) = written.strip_prefix("{cache}") {
        cache.join(rest.trim_start_matches('/'))
    } else if let Some(rest) = written.strip_prefix("~/") {
        home().join(rest)
    } else {
        base.join(written)
    }
}

fn redact<S: Serializer>(key: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    key.as_ref().map(|_| "<redacted>").serialize(s)
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// Overrides from CLI flags; unset flags leave the lower layers alone.
#[derive(Debug, Default, Serialize)]
pub struct CliOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Figment(#[from] Box<figment::Error>),
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

/// The config file to read: the flag (or EEANE_CONFIG), else ./eeane.toml, else
/// ~/.config/eeane/eeane.toml, else none.
pub fn find_file(flag: Option<&Path>) -> Result<Option<PathBuf>, ConfigError> {
    if let Some(path) = flag {
        return if path.is_file() { Ok(Some(path.to_path_buf())) } else { Err(ConfigError::MissingFile(path.to_path_buf())) };
    }
    let xdg = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".config"));
    Ok([PathBuf::from("eeane.toml"), xdg.join("eeane/eeane.toml")].into_iter().find(|p| p.is_file()))
}

impl Config {
    pub fn load(file: Option<&Path>, cli: &CliOverrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULTS));
        // Absolute, so that paths relative to the file resolve to absolute paths.
        let file = file.map(|file| std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf()));
        if let Some(file) = &file {
            figment = figment.merge(Toml::file_exact(file));
        }
        // Short names for the common server keys; any key as SECTION__KEY. Other
        // EEANE_* variables (EEANE_CONFIG, EEANE_LOG, tools' own) are not config.
        let env = Env::prefixed("EEANE_")
            .filter(|key| {
                let key = key.as_str().to_ascii_lowercase();
                SHORT_SERVER_KEYS.contains(&key.as_str()) || key.starts_with("server__") || key.starts_with("runtimes__")
            })
            .map(|key| {
                let key = key.as_str().to_ascii_lowercase();
                if SHORT_SERVER_KEYS.contains(&key.as_str()) {
                    format!("server.{key}").into()
                } else {
                    key.replace("__", ".").into()
                }
            });
        figment = figment.merge(env).merge(Serialized::defaults(cli).key("server"));
        let mut config: Config = figment.extract().map_err(Box::new)?;
        // Which keys each entry sets itself: a Hub source fills in only the others.
        let written: Vec<serde_json::Value> = figment.extract_inner("models").unwrap_or_default();
        config.mark_auto_precision(&written);
        config.read_sources(&written);
        config.resolve_paths();
        config.validate()?;
        let base = file.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
        config.check_engine_options(&written, &base)?;
        Ok(config)
    }

    /// The configuration as resolved, written as a file that eeane reads
    /// back to the same configuration (`eeane check-config` prints it): every
    /// value filled in, `precision = "auto"` as written, and an entry that
    /// leaves its engine to the survey without the reference engine it was given.
    pub fn to_toml(&self) -> String {
        let printed = toml::to_string_pretty(self).expect("config serializes");
        let mut document: toml_edit::DocumentMut = printed.parse().expect("serialized TOML parses");
        if let Some(entries) = document.get_mut("models").and_then(|m| m.as_array_of_tables_mut()) {
            for (entry, model) in entries.iter_mut().zip(&self.models) {
                let Some(auto) = model.auto_precision else { continue };
                if auto == AutoPrecision::AnyEngine {
                    entry.remove("engine");
                }
                entry.insert("precision", toml_edit::value("auto"));
            }
        }
        document.to_string()
    }

    pub fn cache_dir(&self) -> PathBuf {
        if !self.server.cache_dir.is_empty() {
            return PathBuf::from(&self.server.cache_dir);
        }
        cache_dir_from_env()
    }

    fn resolve_paths(&mut self) {
        let cache = self.cache_dir();
        self.server.cache_dir = cache.to_string_lossy().into_owned();
        for engine in crate::engines::ENGINES {
            if let Some(default) = engine.default_runtime() {
                self.runtimes.0.entry(engine.name().to_string()).or_insert_with(|| ConfigPath::new(default));
            }
        }
        for m in &self.models {
            if let Some(runtime) = crate::engines::find(&m.engine).and_then(|e| e.device_runtime(&m.device)) {
                self.runtimes.0.entry(runtime.key.to_string()).or_insert_with(|| ConfigPath::new(runtime.default));
            }
        }
        for library in self.runtimes.0.values_mut() {
            library.resolve(&cache);
        }
        for m in &mut self.models {
            m.model.resolve(&cache);
            m.tokenizer.resolve(&cache);
        }
    }
}

pub fn cache_dir_from_env() -> PathBuf {
    if let Some(dir) = std::env::var_os("EEANE_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache")).join("eeane")
}

#[cfg(test)]
mod isolation_tests {
    use super::{Devices, Isolation, Placement};

    #[test]
    fn auto_isolation_is_each_engines_choice() {
        let on = |names: &[&str]| Devices::new(names.iter().copied()).unwrap();
        for engine in crate::engines::ENGINES {
            for devices in [on(&["cpu"]), on(&["vulkan:H200", "vulkan:H200"]), on(&["CPU", "GPU"])] {
                assert_eq!(Isolation::Auto.resolve(engine.name(), &devices), engine.default_isolation(&devices), "{} on {devices}", engine.name());
                assert_eq!(Isolation::Process.resolve(engine.name(), &devices), Placement::Process);
                assert_eq!(Isolation::Thread.resolve(engine.name(), &devices), Placement::Thread);
            }
        }
    }
}

#[cfg(test)]
// figment::Jail's closures return figment::Error, figment's own (large) type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn the_length_ladder_doubles_up_to_max_tokens() {
        let ladder: Vec<(usize, usize)> = length_ladder(512).iter().map(|b| (b.max_tokens, b.max_batch)).collect();
        assert_eq!(ladder, [(32, 64), (64, 64), (128, 32), (256, 16), (512, 8)]);
        let ladder: Vec<usize> = length_ladder(200).iter().map(|b| b.max_tokens).collect();
        assert_eq!(ladder, [32, 64, 128, 200]);
        assert_eq!(length_ladder(16).len(), 1);
    }

    #[test]
    fn defaults_serve_the_default_model() {
        Jail::expect_with(|jail| {
            jail.set_env("EEANE_CACHE_DIR", "/c");
            let config = Config::load(None, &CliOverrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(config.server.port, 7997);
            assert_eq!(config.models[0].id, "all-minilm-l6-v2");
            assert_eq!(config.models[0].model.path(), PathBuf::from("/c/models/all-minilm-l6-v2/model.onnx"));
            Ok(())
        });
    }

    #[test]
    fn layers_apply_in_order_file_env_cli() {
        Jail::expect_with(|jail| {
            jail.create_file("eeane.toml", "[server]\nport = 1000\nhost = \"0.0.0.0\"\nmax_inputs = 5\n")?;
            jail.set_env("EEANE_PORT", "2000");
            jail.set_env("EEANE_SERVER__MAX_INPUTS", "7");
            let file = find_file(None).map_err(|e| e.to_string())?;
            let cli = CliOverrides { port: Some(3000), ..Default::default() };
            let config = Config::load(file.as_deref(), &cli).map_err(|e| e.to_string())?;
            assert_eq!(config.server.host, "0.0.0.0");
            assert_eq!(config.server.max_inputs, 7);
            assert_eq!(config.server.port, 3000);
            Ok(())
        });
    }

    #[test]
    fn file_models_replace_the_default_and_paths_resolve_against_the_file() {
        Jail::expect_with(|jail| {
            jail.create_dir("conf")?;
            jail.create_file(
                "conf/eeane.toml",
                &format!(
                    "[[models]]\nid = \"a\"\nengine = {:?}\nmodel = \"m/model.onnx\"\ntokenizer = \"~/t.json\"\nmax_tokens = 128\n",
                    crate::engines::default_engine().name()
                ),
            )?;
            jail.set_env("HOME", "/home/u");
            let config = Config::load(Some(Path::new("conf/eeane.toml")), &CliOverrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(config.models.len(), 1);
            assert_eq!(config.models[0].model.path(), jail.directory().join("conf/m/model.onnx"));
            assert_eq!(config.models[0].tokenizer.path(), PathBuf::from("/home/u/t.json"));
            assert_eq!(config.models[0].pooling, Pooling::Mean);
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key() {
        Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "[server]\nport = \"seven\"\n")?;
            let err = Config::load(Some(Path::new("bad.toml")), &CliOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("server.port"), "{err}");
            jail.create_file("typo.toml", "[server]\nprot = 1\n")?;
            let err = Config::load(Some(Path::new("typo.toml")), &CliOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("prot"), "{err}");
            jail.create_file(
                "dup.toml",
                &format!(
                    "[[models]]\nid = \"a\"\nengine = {:?}\nmodel = \"m\"\ntokenizer = \"t\"\nmax_tokens = 9\n\
                     [[models]]\nid = \"b\"\naliases = [\"a\"]\nengine = \"nope\"\nmodel = \"m\"\ntokenizer = \"t\"\nmax_tokens = 9\n",
                    crate::engines::default_engine().name()
                ),
            )?;
            let err = Config::load(Some(Path::new("dup.toml")), &CliOverrides::default()).unwrap_err().to_string();
            assert!(err.contains("models[1].aliases"), "{err}");
            Ok(())
        });
    }

    /// precision = "auto" measures variants where an engine offers them: the
    /// CPU (one device) and CUDA devices (ONNX Runtime's fp32 and fp16
    /// graphs, one card or several sessions); elsewhere the entry names its
    /// precision, and the refusal says where auto runs.
    #[test]
    fn auto_precision_runs_on_the_cpu_and_on_cuda_devices() {
        Jail::expect_with(|jail| {
            let entry = |device: &str| {
                format!("[[models]]\nid = \"a\"\nmodel = \"m.onnx\"\ntokenizer = \"t\"\nmax_tokens = 16\nprecision = \"auto\"\ndevice = {device}\n")
            };
            for (device, accepted) in [
                ("\"cpu\"", true),
                ("\"cuda:H200\"", true),
                ("[\"cuda:H200\", \"cuda:H200\"]", true),
                ("\"cuda:H200*\"", true),
                ("\"vulkan:H200\"", false),
                ("[\"cpu\", \"cpu\"]", false),
                ("[\"cpu\", \"cuda:H200\"]", false),
            ] {
                jail.create_file("auto.toml", &entry(device))?;
                let loaded = Config::load(Some(Path::new("auto.toml")), &CliOverrides::default());
                assert_eq!(loaded.is_ok(), accepted, "device = {device}: {:?}", loaded.as_ref().err().map(ToString::to_string));
                if let Err(e) = loaded {
                    assert!(e.to_string().contains("models[0].precision"), "{e}");
                }
            }
            Ok(())
        });
    }
}
