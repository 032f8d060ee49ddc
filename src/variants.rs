//! `precision = "auto"`: a model is served by the fastest of its variants on
//! this machine whose vectors keep within cosine 0.9999 of the fp32 graph.
//!
//! A variant is an engine, a precision it offers on this CPU
//! (`Backend::cpu_precisions`) and a graph: the entry's own fp32 graph, and a
//! quantized one beside it when the model ships one (`{stem}_int8.onnx` or
//! Optimum's `{stem}_quantized.onnx`). On a GPU (`Backend::device_precisions`)
//! the fp32 graph and the GPU's fp16 graph beside it (`{stem}.fp16.onnx`),
//! measured on the entry's devices. The survey loads each variant as it
//! would be served (its engine process, its buckets), embeds check texts with
//! it and with the fp32 reference (ONNX Runtime on the fp32 graph), and times
//! each on the same texts in interleaved rounds, keeping each one's best round
//! (this machine's figures move 20-30 % within an hour; interleaving keeps
//! their ratios honest). Its figures and verdicts are kept in the model's
//! manifest.json under `variants.{id}`, or in `{cache}/variants/{id}.json`
//! for a model without a manifest, and measured again only when the machine,
//! the graphs or the entry's batching settings change. Variants whose weights
//! together exceed the memory left beside the served reference (the host's,
//! or the GPU's) are loaded and timed one at a time instead, each unloaded
//! before the next, and one that does not fit even alone is not loaded.
//!
//! The variant chosen is then measured as several engines fed from the
//! model's one queue, each on its own share of the cores (`engine_layouts`),
//! against itself as one engine in interleaved rounds: on many cores a small
//! model's batch does not spread over every core, and disjoint engines do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Instant;

use eeane_backend_core::{Backend, CpuFeatures, Devices, EngineError, GraphKind};
use serde::{Deserialize, Serialize};

use crate::config::{AutoPrecision, Config, ModelConfig};
use crate::manifest::{GraphCheck, Manifest};
use crate::model::{Inputs, LoadedModel, ModelError, Output, VariantNote};
use crate::pull::size::{human_bytes, Available, Need};

/// A variant is served only when its lowest cosine to the reference is at least this.
pub const MIN_COSINE: f64 = 0.9999;

/// A variant replaces the reference only when it is this much faster: closer
/// than that is within the machine's noise, and fp32 is kept.
const FASTER_BY: f64 = 1.05;

const TIMING_ROUNDS: usize = 3;

/// Texts a GPU variant is timed on in the survey, one batch of them for its
/// one session (`trial_config`), each near the model's window (up to
/// `GPU_TIMING_TOKENS`).
const GPU_TIMING_TEXTS: usize = 64;
const GPU_TIMING_TOKENS: usize = 512;

/// How long a variant measured alone may take to give its memory back
/// before the next loads (an engine process's exit, a runtime's teardown).
const UNLOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Texts of the layout rounds: enough batches that eight engines all run.
const LAYOUT_TIMING_TEXTS: usize = 256;

/// The engine counts tried for the chosen variant on `cores` physical cores:
/// 2, 4 and 8 while each engine keeps two cores, and two engines of one core
/// each on a 2- or 3-core machine.
pub fn engine_layouts(cores: usize) -> Vec<usize> {
    [2, 4, 8].into_iter().filter(|&k| cores >= 2 * k || (k == 2 && cores >= 2)).collect()
}

/// What the survey's figures hold for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub features: CpuFeatures,
}

impl Machine {
    pub fn detect() -> Self {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            info.lines().find(|l| l.split(':').next().is_some_and(|k| k.trim() == name)).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string())
        };
        let flags: Vec<String> = field("flags").unwrap_or_default().split_whitespace().map(str::to_string).collect();
        let has = |f: &str| flags.iter().any(|x| x == f);
        Machine {
            cpu: field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            features: CpuFeatures { bf16: has("avx512_bf16") || has("amx_bf16"), int8_dot: has("avx512_vnni") || has("avx_vnni") || has("amx_int8") },
        }
    }
}

/// One variant the survey may serve.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub engine: &'static str,
    pub precision: &'static str,
    pub graph: PathBuf,
    /// The engine's keys that select the precision, merged over the entry's own.
    pub keys: serde_json::Map<String, serde_json::Value>,
    /// Engines fed from the model's queue, each on its own share of the cores.
    pub engines: usize,
    /// The graph pools (and applies any Dense modules) itself, so the
    /// variant is served with pooling = "none" (the GPU's graph).
    pub pooled_in_graph: bool,
}

impl Candidate {
    pub fn label(&self) -> String {
        match self.engines {
            0 | 1 => label(self.engine, self.precision),
            n => format!("{} x{n}", label(self.engine, self.precision)),
        }
    }

    fn with_engines(&self, engines: usize) -> Candidate {
        Candidate { engines, ..self.clone() }
    }
}

fn label(engine: &str, precision: &str) -> String {
    format!("{engine} {precision}")
}

/// A variant's figures and why it was or was not served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub variant: String,
    /// The graph's file name.
    pub graph: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_cosine: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_cosine: Option<f64>,
    /// Best of the interleaved rounds. For a layout (several engines), the
    /// one engine's rate times the layout's ratio to it, measured in rounds
    /// of their own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub texts_per_s: Option<f64>,
    /// Its speed over the reference's, in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speed_vs_reference: Option<f64>,
    /// Why it could not be measured (not offered here, or its load failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
}

impl Measured {
    /// A variant's row before any figure is in.
    fn unmeasured(variant: String, graph: String) -> Self {
        Measured { variant, graph, min_cosine: None, mean_cosine: None, texts_per_s: None, speed_vs_reference: None, not_measured: None }
    }

    fn keeps_the_vectors(&self) -> bool {
        self.min_cosine.is_some_and(|c| c >= MIN_COSINE)
    }
}

/// One entry's survey on one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Survey {
    pub machine: Machine,
    /// The entry's settings that move the figures (threads, buckets, batch).
    pub settings: String,
    /// Each graph's file name and what identifies its contents.
    pub graphs: BTreeMap<String, String>,
    pub reference: String,
    pub variants: Vec<Measured>,
    pub chosen: String,
    pub reason: String,
    pub check_texts: usize,
    pub timing_texts: usize,
    pub measured_at_unix: u64,
    /// The fp32 reference was measured as the copy that served meanwhile
    /// (`PendingSurvey::lend_reference`), not loaded a second time.
    #[serde(default)]
    pub reference_served: bool,
}

/// The variant to serve, the fastest that keeps the vectors, and why in words.
pub fn choose(reference: &str, measured: &[Measured]) -> (String, String) {
    let reference_speed = measured.iter().find(|m| m.variant == reference).and_then(|m| m.texts_per_s);
    let fastest = measured
        .iter()
        .filter(|m| m.keeps_the_vectors() && m.texts_per_s.is_some())
        .max_by(|a, b| a.texts_per_s.partial_cmp(&b.texts_per_s).unwrap_or(std::cmp::Ordering::Equal));
    let chosen = match (fastest, reference_speed) {
        (Some(f), Some(r)) if f.variant != reference && f.texts_per_s.unwrap_or(0.0) >= r * FASTER_BY => f,
        _ => measured.iter().find(|m| m.variant == reference).unwrap_or(&measured[0]),
    };
    let mut why = Vec::new();
    if chosen.variant == reference {
        why.push(match fastest {
            Some(f) if f.variant != reference => format!(
                "{reference}, the fp32 reference: the fastest variant within cosine {MIN_COSINE}, {}, is only {:.2}x as fast (under {FASTER_BY}x is noise)",
                f.variant,
                f.speed_vs_reference.unwrap_or(1.0)
            ),
            _ => format!("{reference}, the fp32 reference: no other variant is faster within cosine {MIN_COSINE}"),
        });
    } else {
        why.push(format!(
            "{}: {:.2}x the speed of {reference} at min cosine {:.6}, the fastest within {MIN_COSINE}",
            chosen.variant,
            chosen.speed_vs_reference.unwrap_or(1.0),
            chosen.min_cosine.unwrap_or(0.0)
        ));
    }
    let slower: Vec<String> = measured
        .iter()
        .filter(|m| m.keeps_the_vectors() && m.variant != chosen.variant && m.texts_per_s.is_some())
        .map(|m| format!("{} ({:.2}x)", m.variant, m.speed_vs_reference.unwrap_or(0.0)))
        .collect();
    if !slower.is_empty() {
        why.push(format!("also within the gate: {}", slower.join(", ")));
    }
    let refused: Vec<String> = measured
        .iter()
        .filter(|m| m.min_cosine.is_some() && !m.keeps_the_vectors())
        .map(|m| format!("{} (min cosine {:.6}, {:.2}x)", m.variant, m.min_cosine.unwrap_or(0.0), m.speed_vs_reference.unwrap_or(0.0)))
        .collect();
    if !refused.is_empty() {
        why.push(format!("refused for drift: {}", refused.join(", ")));
    }
    let absent: Vec<String> = measured.iter().filter_map(|m| m.not_measured.as_ref().map(|w| format!("{} ({w})", m.variant))).collect();
    if !absent.is_empty() {
        why.push(format!("not measured: {}", absent.join("; ")));
    }
    (chosen.variant.clone(), why.join("; "))
}

/// A quantized graph beside the fp32 one, when the model ships one.
pub fn int8_graph(fp32: &Path) -> Option<PathBuf> {
    let stem = fp32.file_stem()?.to_str()?;
    let dir = fp32.parent()?;
    ["int8", "quantized"].iter().map(|suffix| dir.join(format!("{stem}_{suffix}.onnx"))).find(|p| p.is_file())
}

/// The GPU's fp16 graph beside the fp32 one (`{stem}.fp16.onnx`), when made.
pub fn fp16_graph(fp32: &Path) -> Option<PathBuf> {
    let stem = fp32.file_stem()?.to_str()?;
    Some(fp32.with_file_name(format!("{stem}.fp16.onnx"))).filter(|p| p.is_file())
}

/// The checks that the prepared model's manifest (beside `fp32`) keeps of
/// the graphs made beside it: each a graph's file name, or null with why.
fn made_graphs(fp32: &Path) -> Vec<GraphCheck> {
    Manifest::beside(fp32).map(|m| m.graph_checks()).unwrap_or_default()
}

/// Whether the graph pools inside, as its prepared manifest says.
fn pooled_in_graph(graph: &Path) -> bool {
    let name = file_name(graph);
    made_graphs(graph).iter().any(|c| c.graph.as_deref() == Some(name.as_str()) && c.pooling_in_graph.is_some())
}

/// Why no fp16 graph sits beside `fp32`, in words.
fn no_fp16_graph(fp32: &Path) -> String {
    match made_graphs(fp32).into_iter().find_map(|c| c.graph.is_none().then_some(c.why).flatten()) {
        Some(why) => format!("no GPU graph was made: {why}"),
        None => format!(
            "no {}.fp16.onnx beside {} (a Hub model's is made when its entry is on a CUDA device with precision = \"auto\")",
            fp32.file_stem().unwrap_or_default().to_string_lossy(),
            file_name(fp32)
        ),
    }
}

/// The variants of `config` this build and this machine offer, the
/// reference first; and those not offered, with why. On the CPU: each
/// engine's precisions of the fp32 graph and of a quantized graph beside
/// it; on a GPU: the fp32 graph and the GPU's fp16 graph beside it.
pub fn candidates(config: &ModelConfig, cpu: &CpuFeatures) -> (Vec<Candidate>, Vec<Measured>) {
    let fp32 = config.model.path();
    let on_cpu = config.device.all_cpu();
    let mut graphs = vec![(GraphKind::Float32, fp32.clone())];
    if let Some(int8) = int8_graph(&fp32).filter(|_| on_cpu) {
        graphs.push((GraphKind::Int8, int8));
    }
    let fp16 = fp16_graph(&fp32).filter(|_| !on_cpu);
    if let Some(fp16) = &fp16 {
        graphs.push((GraphKind::Float16, fp16.clone()));
    }
    let engines: Vec<&'static dyn Backend> = match config.auto_precision {
        Some(AutoPrecision::ItsEngine) => crate::engines::find(&config.engine).into_iter().collect(),
        _ => {
            let mut all: Vec<&'static dyn Backend> = crate::engines::ENGINES.to_vec();
            // The default engine first, so that its fp32 run, the reference, leads.
            let reference = crate::engines::default_engine().name();
            all.sort_by_key(|e| e.name() != reference);
            all
        }
    };
    let offers = |engine: &dyn Backend, kind: GraphKind| if on_cpu { engine.cpu_precisions(kind, cpu) } else { engine.device_precisions(kind, &config.device) };
    let (mut offered, mut absent) = (Vec::new(), Vec::new());
    for engine in engines {
        if engine.unavailable().is_some() {
            continue;
        }
        if fp16.is_none() && !on_cpu {
            for offer in offers(engine, GraphKind::Float16) {
                let row = Measured::unmeasured(label(engine.name(), offer.precision), String::new());
                absent.push(Measured { not_measured: Some(no_fp16_graph(&fp32)), ..row });
            }
        }
        for (kind, graph) in &graphs {
            for offer in offers(engine, *kind) {
                let graph_name = file_name(graph);
                match offer.unavailable {
                    Some(why) => absent.push(Measured { not_measured: Some(why), ..Measured::unmeasured(label(engine.name(), offer.precision), graph_name) }),
                    None => offered.push(Candidate {
                        engine: engine.name(),
                        precision: offer.precision,
                        graph: graph.clone(),
                        keys: offer.keys,
                        engines: 1,
                        pooled_in_graph: pooled_in_graph(graph),
                    }),
                }
            }
        }
    }
    (offered, absent)
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The entry as it would be written to serve `candidate`: its engine, graph
/// and precision keys, checked by the engine as a written entry's are, and a
/// length ladder for an engine that compiles per bucket.
pub fn variant_config(config: &ModelConfig, server: &Config, candidate: &Candidate) -> Result<ModelConfig, EngineError> {
    let engine = crate::engines::find(candidate.engine).ok_or_else(|| EngineError::Runtime(format!("engine {:?} is not in this build", candidate.engine)))?;
    // The candidate's keys select its precision over the entry's own
    // (which, for precision = "auto", hold none).
    let mut keys = config.engine_options.clone();
    keys.extend(candidate.keys.clone());
    let cache = server.cache_dir();
    let resolve = |p: &Path| crate::config::resolve_path(&p.to_string_lossy(), &cache, Path::new(""));
    let options = engine.options(&keys, &resolve).map_err(|e| EngineError::Model(format!("{}: {e}", candidate.label())))?;
    let mut variant = config.clone();
    variant.engine = candidate.engine.to_string();
    variant.model = crate::config::ConfigPath::new(&candidate.graph);
    variant.engine_options = match options.0 {
        serde_json::Value::Object(map) => map,
        _ => Default::default(),
    };
    variant.auto_precision = None;
    if candidate.pooled_in_graph {
        variant.pooling = crate::config::Pooling::None;
    }
    if candidate.engines > 1 {
        variant.device = config.device.repeated(candidate.engines);
    }
    // A Hub model's files were fetched before any variant was looked for.
    variant.source = None;
    if engine.compiles_per_bucket() && variant.buckets.is_empty() {
        variant.buckets = crate::config::length_ladder(variant.max_tokens);
    }
    Ok(variant)
}

/// A variant as the survey loads it. On a GPU, one session on the entry's
/// first card, whatever the entry's count: fp16 against fp32 is a matter
/// of each session's speed, and on an 80 GB H100 four fp16 sessions of a
/// 0.6B decoder could not warm beside the four fp32 ones that served
/// (about 16 GB each at 65,536-token batches). Elsewhere the variant as
/// it would be served.
fn trial_config(variant: &ModelConfig) -> ModelConfig {
    let mut trial = variant.clone();
    if !variant.device.all_cpu() {
        trial.device = Devices::one(variant.device.first().clone());
    }
    trial
}

/// The entry's settings that move the figures. Not its isolation: the pipe
/// to an engine process costs every variant alike, and `eeane bench` runs
/// the same entry both in process and behind the server.
fn settings(config: &ModelConfig, server: &Config) -> String {
    let buckets: Vec<String> = config.buckets.iter().map(|b| format!("{}x{}", b.max_batch, b.max_tokens)).collect();
    // A runtime installed since (or removed) changes which variants can load.
    let runtimes: Vec<String> = crate::engines::ENGINES
        .iter()
        .filter_map(|e| server.runtimes.library(e.name(), &Devices::cpu()).map(|p| format!("{} {}", e.name(), if p.is_file() { "present" } else { "absent" })))
        .collect();
    // A survey measured on other check texts was gated on other texts; one
    // on a GPU holds for that GPU (the CPU's surveys name none).
    let device = if config.device.all_cpu() { String::new() } else { format!(", devices {:?}", config.device) };
    format!(
        "check texts {}, threads {}, engine layouts [{}], max_batch {}, max_batch_tokens {}, max_tokens {}, buckets [{}], engine keys {}, runtimes [{}]{device}",
        CHECK_TEXTS,
        config.threads,
        layouts(config).iter().map(usize::to_string).collect::<Vec<_>>().join(" "),
        config.max_batch,
        config.max_batch_tokens,
        config.max_tokens,
        buckets.join(" "),
        serde_json::Value::Object(config.engine_options.clone()),
        runtimes.join(", ")
    )
}

/// What identifies a graph's contents: its manifest's sha256, else its size and time.
fn graph_identity(path: &Path) -> String {
    if let Some(digest) = crate::integrity::recorded_digest(path) {
        return format!("sha256 {digest}");
    }
    let meta = std::fs::metadata(path).ok();
    let modified = meta.as_ref().and_then(|m| m.modified().ok()).and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    format!("{} bytes, modified {modified}", meta.map_or(0, |m| m.len()))
}

/// Where the survey of `config` is kept: beside its manifest, or in the cache.
enum Store {
    Manifest(PathBuf),
    File(PathBuf),
}

impl Store {
    fn of(config: &ModelConfig, server: &Config) -> Self {
        let manifest = config.model.path().with_file_name("manifest.json");
        if manifest.is_file() {
            Store::Manifest(manifest)
        } else {
            let safe: String = config.id.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
            Store::File(server.cache_dir().join("variants").join(format!("{safe}.json")))
        }
    }

    fn read(&self, id: &str) -> Option<Survey> {
        match self {
            Store::Manifest(path) => Manifest::beside(path)?.survey(id),
            Store::File(path) => serde_json::from_slice(&std::fs::read(path).ok()?).ok(),
        }
    }

    fn write(&self, id: &str, survey: &Survey) -> std::io::Result<()> {
        let (path, bytes) = match self {
            Store::Manifest(path) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let mut manifest = Manifest::read(dir).map_err(std::io::Error::other)?.ok_or_else(|| std::io::Error::other("manifest.json is gone"))?;
                manifest.set_survey(id, survey)?;
                return manifest.write(dir).map_err(std::io::Error::other);
            }
            Store::File(path) => (path.clone(), serde_json::to_vec_pretty(survey)?),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Whole or not at all: a reader never sees half a manifest.
        let partial = path.with_extension(format!("json.partial-{}", std::process::id()));
        std::fs::write(&partial, bytes)?;
        std::fs::rename(&partial, &path)
    }
}

/// What `load` gives: the model to serve now, and for `precision = "auto"`
/// without a survey that holds on this machine, the survey to run while the
/// fp32 reference serves.
pub struct Loaded {
    pub model: LoadedModel,
    pub survey: Option<PendingSurvey>,
}

/// A survey that has not run yet: every variant of one entry, measured on
/// this machine against the fp32 reference (`PendingSurvey::run`).
pub struct PendingSurvey {
    config: ModelConfig,
    server: Config,
    machine: Machine,
    offered: Vec<Candidate>,
    absent: Vec<Measured>,
    graphs: BTreeMap<String, String>,
    settings: String,
    store: Store,
    /// The fp32 reference as it serves, when its slot lends it.
    served: Option<Weak<LoadedModel>>,
}

/// What a survey leaves to serve.
pub enum Surveyed {
    /// The chosen variant, loaded.
    Loaded(Box<LoadedModel>),
    /// The chosen variant is the lent fp32 reference, measured as it served:
    /// it keeps serving, with this note.
    Served(VariantNote),
}

impl PendingSurvey {
    /// Lends the survey the fp32 reference that serves meanwhile. On a GPU,
    /// or where the variants do not fit together, the survey measures that
    /// copy instead of loading a second: on an 80 GB H100 four fp32 sessions
    /// of a 0.6B decoder, each warmed at 65,536-token batches, filled the
    /// card beside the served four, and the fp16 graph could not be loaded.
    /// The survey holds it weakly: an unload still gives its memory back
    /// (the survey then fails, and runs again at the next load).
    pub fn lend_reference(&mut self, served: &Arc<LoadedModel>) {
        self.served = Some(Arc::downgrade(served));
    }

    /// How many variants it measures (the layouts of the chosen one come after).
    pub fn variants(&self) -> usize {
        self.offered.len()
    }

    /// Measures every variant, keeps the verdict for the next load, and
    /// returns the chosen variant loaded.
    pub async fn run(self) -> Result<Surveyed, ModelError> {
        let (survey, model) = survey(&self).await?;
        if let Err(e) = self.store.write(&self.config.id, &survey) {
            tracing::warn!(model = %self.config.id, "cannot keep the variant survey ({e}); it runs again at the next load");
        }
        let note = note(&survey, true);
        Ok(match model {
            Some(model) => {
                model.set_variant(note);
                Surveyed::Loaded(Box::new(model))
            }
            None => Surveyed::Served(note),
        })
    }
}

/// Loads the model an entry serves. An entry that is not `precision =
/// "auto"` loads as written. An auto entry loads the variant its kept survey
/// chose on this machine; without one, its fp32 reference at once, with the
/// survey to run beside it (`Loaded::survey`), so that no request waits for it.
pub async fn load(config: &ModelConfig, server: &Config) -> Result<Loaded, ModelError> {
    if config.auto_precision.is_none() {
        return Ok(Loaded { model: LoadedModel::load(config, server).await?, survey: None });
    }
    if config.source.is_some() {
        // A Hub model's files come at its first load: before any variant is looked for.
        let (entry, server) = (config.clone(), server.clone());
        tokio::task::spawn_blocking(move || entry.ensure_hub_prepared(&server))
            .await
            .map_err(|e| ModelError::Engine(EngineError::Model(format!("Hub fetch: {e}"))))??;
    }
    let machine = Machine::detect();
    let (offered, absent) = candidates(config, &machine.features);
    let store = Store::of(config, server);
    let graphs: BTreeMap<String, String> = offered.iter().map(|c| (file_name(&c.graph), graph_identity(&c.graph))).collect();
    let settings = settings(config, server);
    if let Some(survey) = store.read(&config.id).filter(|s| s.machine == machine && s.graphs == graphs && s.settings == settings) {
        let counts: Vec<usize> = std::iter::once(1).chain(layouts(config)).collect();
        let kept = offered.iter().flat_map(|c| counts.iter().map(|&k| c.with_engines(k))).find(|c| c.label() == survey.chosen);
        if let Some(candidate) = kept {
            let variant = variant_config(config, server, &candidate)?;
            match LoadedModel::load(&variant, server).await {
                Ok(model) => {
                    model.set_variant(note(&survey, false));
                    return Ok(Loaded { model, survey: None });
                }
                Err(e) => tracing::warn!(model = %config.id, variant = %survey.chosen, "the surveyed variant failed to load ({e}); surveying again"),
            }
        }
    }
    let reference = offered.first().cloned().ok_or_else(|| {
        ModelError::Engine(EngineError::Runtime(format!("precision = \"auto\": no engine of this build runs {:?} on {:?}", config.engine, config.device)))
    })?;
    let model = LoadedModel::load(&variant_config(config, server, &reference)?, server)
        .await
        .map_err(|e| ModelError::Engine(EngineError::Model(format!("the fp32 reference ({}) could not be loaded: {e}", reference.label()))))?;
    model.set_variant(VariantNote::awaiting_survey(reference.label()));
    let survey = PendingSurvey { config: config.clone(), server: server.clone(), machine, offered, absent, graphs, settings, store, served: None };
    Ok(Loaded { model, survey: Some(survey) })
}

/// Loads the variant the server would serve once its survey is done, running
/// the survey first when none holds: `eeane bench` and `eeane survey`.
pub async fn load_chosen(config: &ModelConfig, server: &Config) -> Result<LoadedModel, ModelError> {
    let Loaded { model, survey } = load(config, server).await?;
    match survey {
        None => Ok(model),
        Some(survey) => {
            // Nothing serves here: the survey loads the reference itself, measured beside the others.
            drop(model);
            match survey.run().await? {
                Surveyed::Loaded(model) => Ok(*model),
                Surveyed::Served(_) => Err(ModelError::Engine(EngineError::Model("the survey chose a served reference it was not lent".into()))),
            }
        }
    }
}

/// The entry as the chosen variant's (engine, graph and precision written
/// out), surveying first if need be: `eeane bench` runs every phase on it.
pub async fn chosen_entry(config: &ModelConfig, server: &Config) -> Result<ModelConfig, ModelError> {
    if config.auto_precision.is_none() {
        return Ok(config.clone());
    }
    Ok(load_chosen(config, server).await?.config.clone())
}

fn note(survey: &Survey, measured_now: bool) -> VariantNote {
    let chosen = survey.variants.iter().find(|m| m.variant == survey.chosen);
    VariantNote {
        chosen: survey.chosen.clone(),
        reason: survey.reason.clone(),
        min_cosine: chosen.and_then(|m| m.min_cosine),
        speed_vs_reference: chosen.and_then(|m| m.speed_vs_reference),
        measured_at_this_load: measured_now,
        measured_at: survey.measured_at_unix,
        awaiting_survey: false,
    }
}

fn vectors(output: Output) -> Vec<Vec<f32>> {
    match output {
        Output::Vectors(v) => v,
        Output::Scores(s) => s.into_iter().map(|x| vec![x]).collect(),
    }
}

/// The lowest and mean cosine of `got` to `want`, row by row; a non-finite
/// value anywhere makes the lowest NaN, which no gate passes.
fn agreement(got: &[Vec<f32>], want: &[Vec<f32>]) -> (Option<f64>, Option<f64>) {
    let cosines: Vec<f64> = got.iter().zip(want).map(|(a, b)| cosine(a, b)).collect();
    let finite = got.iter().flatten().all(|x| x.is_finite());
    let min = if finite { cosines.iter().copied().fold(f64::INFINITY, f64::min) } else { f64::NAN };
    (Some(min), Some(cosines.iter().sum::<f64>() / cosines.len().max(1) as f64))
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b)).max(f64::MIN_POSITIVE)
}

/// Short and unusual texts, where a reduced precision drifts most: pooling
/// over one or two tokens averages none of its rounding away, and scripts
/// and symbols rare in training sit on less worn weights. Measured: all
/// MiniLM with a Dense module in OpenVINO bf16 kept 0.999960 on the corpus
/// alone and fell to 0.999896 on such texts.
const EDGE_TEXTS: &[&str] = &[
    "b",
    "q",
    "ok",
    "yes",
    "?!",
    "...",
    "7",
    "-1.5e3",
    "über",
    "Καλημέρα κόσμε",
    "Добрый вечер",
    "東京都の天気",
    "مرحبا بالعالم",
    "👍🎉",
    "  padded  ",
    "snake_case_name",
    "<br/>",
    "{}",
];

/// Corpus texts among the check texts.
const CORPUS_CHECKS: usize = 40;

/// How many check texts there are: the corpus's, the short and unusual ones, one long.
const CHECK_TEXTS: usize = CORPUS_CHECKS + EDGE_TEXTS.len() + 1;

/// Check texts: the corpus's varied code and prose, the short and unusual
/// texts above, and one text longer than the model's window, so the longest
/// bucket is checked too.
fn check_texts(max_tokens: usize) -> Vec<String> {
    let mut texts = crate::corpus::corpus(CORPUS_CHECKS, 20_261_202);
    texts.extend(EDGE_TEXTS.iter().map(|t| t.to_string()));
    texts.push(crate::corpus::corpus(max_tokens / 4 + 8, 5).join(" "));
    texts
}

/// Why a survey that measured the served reference ends without a verdict.
const REFERENCE_GONE: &str = "the served fp32 reference was unloaded during the survey; it runs again at the next load";

/// The survey's verdict and the chosen variant loaded, or `None` when that is
/// the lent reference that serves.
async fn survey(plan: &PendingSurvey) -> Result<(Survey, Option<LoadedModel>), ModelError> {
    let (config, server) = (&plan.config, &plan.server);
    let offered = plan.offered.clone();
    let reference = offered.first().cloned().ok_or_else(|| {
        ModelError::Engine(EngineError::Runtime(format!("precision = \"auto\": no engine of this build runs {:?} on {:?}", config.engine, config.device)))
    })?;
    tracing::info!(model = %config.id, variants = offered.len(), "precision = auto: measuring the variants on this machine");
    let started = Instant::now();
    let variants: Vec<Result<ModelConfig, EngineError>> = offered.iter().map(|c| variant_config(config, server, c)).collect();
    let trial_configs: Vec<Result<ModelConfig, EngineError>> = variants.iter().map(|v| v.as_ref().map(trial_config).map_err(Clone::clone)).collect();
    let needs: Vec<Option<(Need, Available)>> = trial_configs.iter().map(|v| v.as_ref().ok().and_then(ModelConfig::memory_need)).collect();
    let alone = one_at_a_time(
        &needs.iter().map(|n| n.as_ref().map(|(need, _)| need.bytes())).collect::<Vec<_>>(),
        needs.iter().flatten().map(|(_, room)| room.bytes).next(),
    );
    if alone {
        tracing::info!(model = %config.id, "precision = auto: the variants' weights together exceed the memory there is; measuring them one at a time");
    }
    // Where a second copy of the reference may not fit, the one that serves is measured (`PendingSurvey::lend_reference`).
    let lent = plan.served.clone().filter(|_| alone || !config.device.all_cpu());
    let (checks, timing) = (check_texts(config.max_tokens), timing_texts(config));
    let (check_count, timing_count) = (checks.len(), timing.len());
    let (checks, timing) = (Arc::new(Inputs::Texts(checks)), Arc::new(Inputs::Texts(timing)));
    let mut trials: Vec<Trial> = Vec::new();
    for (i, variant) in trial_configs.iter().enumerate() {
        let trial = match (variant, &lent) {
            (Err(e), _) => Trial::failed(TrialError::Entry(e.clone())),
            (Ok(_), Some(served)) if i == 0 => Trial::served(served, &checks).await,
            (Ok(variant), _) => match needs[i].as_ref().filter(|(need, room)| alone && need.bytes() > room.bytes) {
                // Measured alone and still too big: not loaded at all (no swap, no OOM kill).
                Some((need, room)) => {
                    Trial::failed(TrialError::TooBig { need: need.bytes(), explained: need.explained(), room: room.bytes, room_from: room.from.clone() })
                }
                None => Trial::load(variant, server, &checks).await,
            },
        };
        if i == 0 {
            if let Err(e) = &trial.outcome {
                // Beside the served reference there may be no room for a second copy; `eeane survey` has the model's memory to itself.
                let fix = if alone { "; `eeane survey --config FILE` measures the variants while the model is not served" } else { "" };
                return Err(ModelError::Engine(EngineError::Model(format!("the fp32 reference ({}) {e}{fix}", offered[0].label()))));
            }
        }
        trials.push(trial);
        if alone {
            // Warmed, timed by itself, and unloaded before the next loads.
            let trial = trials.last_mut().expect("just pushed");
            trial.warmed().await;
            trial.time(&timing).await;
            if let Some(TrialModel::Own(model)) = trial.model.take_if(|m| matches!(m, TrialModel::Own(_))) {
                (*model).unload(UNLOAD_WAIT).await;
            }
        }
    }
    if !alone {
        for trial in &trials {
            trial.warmed().await;
        }
        // Warm each, then interleaved rounds; each variant keeps its best.
        for round in 0..=TIMING_ROUNDS {
            for trial in trials.iter_mut() {
                trial.time_once(&timing, round > 0).await;
            }
        }
    }
    if lent.as_ref().is_some_and(|served| served.strong_count() == 0) {
        return Err(ModelError::Engine(EngineError::Model(REFERENCE_GONE.into())));
    }
    let want = match &trials[0].outcome {
        Ok(v) => v.clone(),
        Err(e) => return Err(ModelError::Engine(EngineError::Inference(format!("the fp32 reference: {e}")))),
    };
    let texts = timing_count as f64;
    let reference_best = trials[0].best;
    let mut measured: Vec<Measured> = Vec::new();
    for (candidate, trial) in offered.iter().zip(&trials) {
        let mut m = Measured::unmeasured(candidate.label(), file_name(&candidate.graph));
        match &trial.outcome {
            Err(why) => m.not_measured = Some(why.to_string()),
            Ok(got) => {
                (m.min_cosine, m.mean_cosine) = agreement(got, &want);
                if trial.best.is_finite() && reference_best.is_finite() {
                    m.texts_per_s = Some(texts / trial.best);
                    m.speed_vs_reference = Some(reference_best / trial.best);
                } else {
                    // Said, not left out: a variant that cannot be timed is never served.
                    let (whose, failed) = if trial.best.is_finite() { ("the fp32 reference's", &trials[0]) } else { ("its", trial) };
                    let error = failed.timing_error.as_deref().unwrap_or("no round completed");
                    m.not_measured = Some(format!("{whose} timing rounds failed: {error}"));
                }
            }
        }
        measured.push(m);
    }
    measured.extend(plan.absent.iter().cloned());
    let (mut chosen, mut reason) = choose(&reference.label(), &measured);
    if alone {
        reason = format!("{reason} (measured one at a time: together they exceed the memory there is)");
    }
    if lent.is_some() {
        reason = format!("{reason}; the fp32 reference was measured as the copy that serves");
    }
    // The chosen variant stays loaded (or loads again, when each was unloaded after its turn); the others go.
    let Some(at) = offered.iter().position(|c| c.label() == chosen) else {
        return Err(ModelError::Engine(EngineError::Model(format!("the chosen variant {chosen} is not among those offered"))));
    };
    let chosen_candidate = offered[at].clone();
    let served_as_trial = trial_configs[at].as_ref().ok().zip(variants[at].as_ref().ok()).is_some_and(|(t, v)| t.device == v.device);
    let mut model = match trials.swap_remove(at).model {
        Some(TrialModel::Own(model)) if served_as_trial => Some(*model),
        // The served reference keeps serving; the layouts are measured on a copy of their own.
        Some(TrialModel::Served(_)) if layouts(config).is_empty() => None,
        chosen_trial => {
            // Their memory back first: on a GPU the chosen variant's sessions load beside the served reference.
            for held in chosen_trial.into_iter().chain(trials.into_iter().filter_map(|t| t.model)) {
                if let TrialModel::Own(model) = held {
                    (*model).unload(UNLOAD_WAIT).await;
                }
            }
            let variant = variants[at].as_ref().map_err(|e| ModelError::Engine(e.clone()))?;
            Some(LoadedModel::load(variant, server).await?)
        }
    };
    let base = measured.iter().find(|m| m.variant == chosen).cloned();
    let surveys_layouts = !layouts(config).is_empty();
    if let (Some(base), Some(loaded)) = (base.filter(|_| surveys_layouts), model.take_if(|_| surveys_layouts)) {
        // `base` is there whenever `model` was taken: the chosen variant is one of `measured`.
        let (layout_model, layout_chosen, layout_reason, layout_measured) =
            survey_layouts(config, server, &chosen_candidate, loaded, &base, &want, checks.clone()).await;
        model = Some(layout_model);
        chosen = layout_chosen;
        reason = format!("{reason}; {layout_reason}");
        measured.extend(layout_measured);
    }
    tracing::info!(model = %config.id, chosen = %chosen, seconds = started.elapsed().as_secs_f64(), "precision = auto: {reason}");
    let survey = Survey {
        machine: plan.machine.clone(),
        settings: plan.settings.clone(),
        graphs: plan.graphs.clone(),
        reference: reference.label(),
        variants: measured,
        chosen: chosen.clone(),
        reason,
        check_texts: check_count,
        timing_texts: timing_count,
        measured_at_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        reference_served: lent.is_some(),
    };
    Ok((survey, model))
}

/// The texts the survey times variants on. On the CPU, 128 short texts of
/// code and prose. On a GPU, texts near the model's window, 64 for each
/// session: short ones leave the card idle between kernel launches, where
/// fp32 and fp16 take about the same time (an H200, a 0.6B decoder on four
/// sessions: the survey timed fp16 at 0.91x fp32 on the short texts, while
/// wrk's bulk on 238-token paragraphs gave 1,395.5 texts/s in fp16 against
/// 152.6 in fp32).
fn timing_texts(config: &ModelConfig) -> Vec<String> {
    if config.device.all_cpu() {
        return crate::corpus::corpus(128, 7);
    }
    // About three characters a token: enough to reach the window, where truncation ends it.
    let chars = 3 * config.max_tokens.min(GPU_TIMING_TOKENS);
    let count = GPU_TIMING_TEXTS;
    let corpus = crate::corpus::corpus(512, 7);
    let mut pieces = corpus.iter().cycle();
    (0..count)
        .map(|_| {
            let mut text = String::new();
            while text.len() < chars {
                text.push_str(pieces.next().expect("a cycle of a non-empty corpus"));
                text.push('\n');
            }
            text
        })
        .collect()
}

/// One variant in the survey: the model while it is loaded, its vectors for
/// the check texts (or why there are none) and its best timing round.
struct Trial {
    model: Option<TrialModel>,
    outcome: Result<Vec<Vec<f32>>, TrialError>,
    best: f64,
    /// Why the last timing round failed, if one did.
    timing_error: Option<String>,
}

/// A variant as the survey holds it.
enum TrialModel {
    /// Loaded by the survey.
    Own(Box<LoadedModel>),
    /// The fp32 reference that serves meanwhile, lent to the survey.
    Served(Weak<LoadedModel>),
}

/// A trial's model for one call: its own, or the lent reference while that
/// is still loaded.
enum Held<'a> {
    Own(&'a LoadedModel),
    Served(Arc<LoadedModel>),
}

impl std::ops::Deref for Held<'_> {
    type Target = LoadedModel;
    fn deref(&self) -> &LoadedModel {
        match self {
            Held::Own(model) => model,
            Held::Served(model) => model,
        }
    }
}

impl TrialModel {
    fn held(&self) -> Option<Held<'_>> {
        match self {
            TrialModel::Own(model) => Some(Held::Own(model)),
            TrialModel::Served(served) => served.upgrade().map(Held::Served),
        }
    }
}

impl Trial {
    fn failed(why: TrialError) -> Self {
        Trial { model: None, outcome: Err(why), best: f64::INFINITY, timing_error: None }
    }

    /// Loads the variant and embeds the check texts with it.
    async fn load(variant: &ModelConfig, server: &Config, checks: &Arc<Inputs>) -> Self {
        match LoadedModel::load(variant, server).await {
            Err(e) => Trial::failed(TrialError::Load(e)),
            Ok(model) => Trial::checked(TrialModel::Own(Box::new(model)), checks).await,
        }
    }

    /// The served reference, with its vectors for the check texts.
    async fn served(reference: &Weak<LoadedModel>, checks: &Arc<Inputs>) -> Self {
        Trial::checked(TrialModel::Served(reference.clone()), checks).await
    }

    /// `model` with its vectors for the check texts, or why it has none.
    async fn checked(model: TrialModel, checks: &Arc<Inputs>) -> Self {
        let mut trial = Trial { model: Some(model), ..Trial::failed(TrialError::ReferenceGone) };
        trial.outcome = match trial.embed(checks.clone()).await {
            Some(Ok(inference)) => Ok(vectors(inference.output)),
            Some(Err(e)) => Err(TrialError::Check(e)),
            None => Err(TrialError::ReferenceGone),
        };
        trial
    }

    /// Embeds `inputs` with the variant; `None` when it is not held (or the
    /// lent reference was unloaded).
    async fn embed(&self, inputs: Arc<Inputs>) -> Option<Result<crate::model::Inference, ModelError>> {
        Some(self.model.as_ref()?.held()?.embed(inputs, None).await)
    }

    /// Once its engines have no idle work left: a GPU session runs each
    /// batch shape once in the background after loading, and timing beside
    /// that (other variants' sessions too) measures the warm-up, not the
    /// variant.
    async fn warmed(&self) {
        if let Some(model) = self.model.as_ref().and_then(TrialModel::held) {
            model.warmed().await;
        }
    }

    /// One timing round on `timing`, kept when `counted` (the first warms).
    async fn time_once(&mut self, timing: &Arc<Inputs>, counted: bool) {
        if self.outcome.is_err() {
            return;
        }
        let t = Instant::now();
        match self.embed(timing.clone()).await {
            Some(Ok(_)) if counted => self.best = self.best.min(t.elapsed().as_secs_f64()),
            Some(Ok(_)) => {}
            Some(Err(e)) => self.timing_error = Some(e.to_string()),
            None => self.timing_error = Some(REFERENCE_GONE.into()),
        }
    }

    /// A warm-up and every timing round, by itself.
    async fn time(&mut self, timing: &Arc<Inputs>) {
        for round in 0..=TIMING_ROUNDS {
            self.time_once(timing, round > 0).await;
        }
    }
}

/// Whether the survey loads its variants one at a time: their weights
/// (`needs`, bytes where known) together exceed `room`, the memory there is
/// beside the fp32 reference that serves meanwhile. Loaded together they are
/// timed in interleaved rounds, so that a busy machine's noise falls on all
/// alike; one at a time no two copies of the weights are in memory beside
/// the served one (Qwen3-Embedding-4B: 16 GB in fp32, 8 in bf16, 4 in int8).
fn one_at_a_time(needs: &[Option<u64>], room: Option<u64>) -> bool {
    let together: u64 = needs.iter().flatten().sum();
    room.is_some_and(|room| together > room)
}

/// The layouts surveyed for `config`: none when the entry names its threads
/// or devices (an explicit layout wins) or runs on a GPU (its sessions are
/// the entry's devices), else `engine_layouts` of this machine's physical cores.
fn layouts(config: &ModelConfig) -> Vec<usize> {
    if config.threads > 0 || config.device.len() > 1 || !config.device.all_cpu() {
        return Vec::new();
    }
    engine_layouts(crate::cpu_sets::cores().len())
}

/// Half the memory the system has free, from /proc/meminfo (None elsewhere).
fn memory_for_engines() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024 / 2)
}

/// Measures `base` (loaded as one engine, as `base_model`) as each of the
/// entry's layouts, interleaved with itself as one engine; returns the model
/// to serve (the fastest layout by at least `FASTER_BY`, else the one
/// engine), its label, the verdict in words, and each layout's figures.
async fn survey_layouts(
    config: &ModelConfig,
    server: &Config,
    base: &Candidate,
    base_model: LoadedModel,
    base_measured: &Measured,
    want: &[Vec<f32>],
    checks: Arc<Inputs>,
) -> (LoadedModel, String, String, Vec<Measured>) {
    let timing = Arc::new(Inputs::Texts(crate::corpus::corpus(LAYOUT_TIMING_TEXTS, 11)));
    let graph_bytes = std::fs::metadata(&base.graph).map_or(0, |m| m.len());
    let room = memory_for_engines();
    let (mut figures, mut said) = (Vec::new(), Vec::new());
    let mut best: Option<(Candidate, LoadedModel, f64)> = None;
    for engines in layouts(config) {
        let candidate = base.with_engines(engines);
        let mut m = Measured::unmeasured(candidate.label(), base_measured.graph.clone());
        let measured = if room.is_some_and(|room| graph_bytes * engines as u64 > room) {
            Err(LayoutError::Memory { engines, graph_mib: graph_bytes >> 20 })
        } else {
            let texts = CheckAndTiming { want, checks: checks.clone(), timing: timing.clone() };
            measure_layout(config, server, &candidate, &base_model, &texts).await
        };
        match measured {
            Ok(MeasuredLayout { model: layout, min_cosine, mean_cosine, over_one_engine: over_one }) => {
                (m.min_cosine, m.mean_cosine) = (min_cosine, mean_cosine);
                // In the one engine's terms (its rate times the ratio), so that
                // every variant's rate in the survey compares with every other's.
                m.texts_per_s = base_measured.texts_per_s.map(|r| r * over_one);
                m.speed_vs_reference = base_measured.speed_vs_reference.map(|s| s * over_one);
                said.push(format!("{} {over_one:.2}x one engine", m.variant));
                if m.keeps_the_vectors() && over_one >= best.as_ref().map_or(FASTER_BY, |(_, _, b)| *b) {
                    best = Some((candidate, layout, over_one));
                }
            }
            Err(why) => {
                said.push(format!("{} not measured ({why})", m.variant));
                m.not_measured = Some(why.to_string());
            }
        }
        figures.push(m);
    }
    let said = said.join(", ");
    match best {
        Some((candidate, layout, over_one)) => {
            let why = format!("served as {} engines, each on its own cores: {over_one:.2}x one engine (measured: {said})", candidate.engines);
            (layout, candidate.label(), why, figures)
        }
        None => (base_model, base.label(), format!("served as one engine: no layout is {FASTER_BY}x faster (measured: {said})"), figures),
    }
}

/// A layout as measured: the model loaded, its cosines to the reference on
/// the check texts, and its speed over the one engine.
struct MeasuredLayout {
    model: LoadedModel,
    min_cosine: Option<f64>,
    mean_cosine: Option<f64>,
    over_one_engine: f64,
}

/// The texts a layout is held to and timed on.
struct CheckAndTiming<'a> {
    /// The reference's vectors for `checks`.
    want: &'a [Vec<f32>],
    checks: Arc<Inputs>,
    timing: Arc<Inputs>,
}

/// Why a variant in the survey has no vectors for the check texts: its
/// `not_measured`, and for the fp32 reference the survey's failure.
#[derive(Debug, thiserror::Error)]
enum TrialError {
    #[error("could not be loaded: {0}")]
    Entry(EngineError),
    #[error("could not be loaded: {0}")]
    Load(ModelError),
    #[error("does not fit alone: its weights need {} ({explained}); {} are {room_from}", human_bytes(*need), human_bytes(*room))]
    TooBig { need: u64, explained: String, room: u64, room_from: String },
    #[error("failed the check texts: {0}")]
    Check(ModelError),
    #[error("{}", REFERENCE_GONE)]
    ReferenceGone,
}

/// Why a layout was not measured.
#[derive(Debug, thiserror::Error)]
enum LayoutError {
    #[error("{engines} copies of the {graph_mib} MiB graph exceed half the free memory")]
    Memory { engines: usize, graph_mib: u64 },
    #[error("{0}")]
    Entry(EngineError),
    #[error("could not be loaded: {0}")]
    Load(ModelError),
    #[error("failed the check texts: {0}")]
    Check(ModelError),
    #[error("its timing rounds failed")]
    Timing,
}

/// One layout loaded, held to the check texts' reference vectors, and timed
/// against the one engine in interleaved rounds (a warm-up first, then each
/// keeps its best).
async fn measure_layout(
    config: &ModelConfig,
    server: &Config,
    candidate: &Candidate,
    one_engine: &LoadedModel,
    texts: &CheckAndTiming<'_>,
) -> Result<MeasuredLayout, LayoutError> {
    let variant = variant_config(config, server, candidate).map_err(LayoutError::Entry)?;
    let layout = LoadedModel::load(&variant, server).await.map_err(LayoutError::Load)?;
    let got = layout.embed(texts.checks.clone(), None).await.map_err(LayoutError::Check)?;
    let (min_cosine, mean_cosine) = agreement(&vectors(got.output), texts.want);
    let (mut one, mut many) = (f64::INFINITY, f64::INFINITY);
    for round in 0..=TIMING_ROUNDS {
        for (model, best_seconds) in [(one_engine, &mut one), (&layout, &mut many)] {
            let t = Instant::now();
            if model.embed(texts.timing.clone(), None).await.is_ok() && round > 0 {
                *best_seconds = best_seconds.min(t.elapsed().as_secs_f64());
            }
        }
    }
    if !(one.is_finite() && many.is_finite()) {
        return Err(LayoutError::Timing);
    }
    Ok(MeasuredLayout { model: layout, min_cosine, mean_cosine, over_one_engine: one / many })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(variant: &str, min_cosine: f64, speed: f64) -> Measured {
        Measured {
            variant: variant.into(),
            graph: "model.onnx".into(),
            min_cosine: Some(min_cosine),
            mean_cosine: Some(min_cosine),
            texts_per_s: Some(100.0 * speed),
            speed_vs_reference: Some(speed),
            not_measured: None,
        }
    }

    #[test]
    fn variants_that_do_not_fit_together_are_measured_one_at_a_time() {
        const GIB: u64 = 1 << 30;
        // Qwen3-Embedding-4B on 24 GiB, its fp32 reference serving: 16 GB
        // fp32, 8 bf16, 4 int8 beside it do not fit together in what is left.
        assert!(one_at_a_time(&[Some(16 * GIB), Some(8 * GIB), Some(4 * GIB)], Some(20 * GIB)));
        assert!(!one_at_a_time(&[Some(16 * GIB), Some(8 * GIB), Some(4 * GIB)], Some(28 * GIB)));
        // all-MiniLM-L6-v2's 90 MB fit; sizes or memory that cannot be told change nothing.
        assert!(!one_at_a_time(&[Some(90 << 20), Some(45 << 20), None], Some(20 * GIB)));
        assert!(!one_at_a_time(&[Some(16 * GIB), Some(8 * GIB)], None));
        assert!(one_at_a_time(&[None, Some(24 * GIB)], Some(20 * GIB)));
    }

    #[test]
    fn the_fastest_variant_within_the_gate_is_served() {
        let measured = [m("engine-a fp32", 1.0, 1.0), m("engine-b fp32", 0.999999, 1.3), m("engine-b bf16", 0.99997, 1.9)];
        let (chosen, reason) = choose("engine-a fp32", &measured);
        assert_eq!(chosen, "engine-b bf16");
        assert!(reason.contains("1.90x"), "{reason}");
    }

    #[test]
    fn a_lossy_variant_is_never_served_however_fast() {
        let measured = [m("engine-a fp32", 1.0, 1.0), m("engine-a int8", 0.99833, 3.0), m("engine-b fp32", 0.999999, 1.2)];
        let (chosen, reason) = choose("engine-a fp32", &measured);
        assert_eq!(chosen, "engine-b fp32");
        assert!(reason.contains("refused for drift: engine-a int8 (min cosine 0.998330"), "{reason}");
    }

    #[test]
    fn fp32_is_kept_when_nothing_else_passes_or_gains_beyond_noise() {
        let lossy = [m("engine-a fp32", 1.0, 1.0), m("engine-b int8", 0.99, 2.0)];
        assert_eq!(choose("engine-a fp32", &lossy).0, "engine-a fp32");
        let close = [m("engine-a fp32", 1.0, 1.0), m("engine-b fp32", 0.999999, 1.03)];
        let (chosen, reason) = choose("engine-a fp32", &close);
        assert_eq!(chosen, "engine-a fp32");
        assert!(reason.contains("only 1.03x"), "{reason}");
        let mut nan = m("engine-b bf16", f64::NAN, 2.0);
        nan.min_cosine = Some(f64::NAN);
        assert_eq!(choose("engine-a fp32", &[m("engine-a fp32", 1.0, 1.0), nan]).0, "engine-a fp32");
    }

    #[test]
    fn engine_layouts_keep_two_cores_an_engine() {
        assert_eq!(engine_layouts(1), Vec::<usize>::new());
        assert_eq!(engine_layouts(2), [2]);
        assert_eq!(engine_layouts(4), [2]);
        assert_eq!(engine_layouts(8), [2, 4]);
        assert_eq!(engine_layouts(16), [2, 4, 8]);
        assert_eq!(engine_layouts(64), [2, 4, 8]);
    }

    #[test]
    fn a_layout_is_labelled_with_its_engines() {
        let one =
            Candidate { engine: "engine-b", precision: "bf16", graph: PathBuf::from("m.onnx"), keys: Default::default(), engines: 1, pooled_in_graph: false };
        assert_eq!(one.label(), "engine-b bf16");
        assert_eq!(one.with_engines(4).label(), "engine-b bf16 x4");
    }

    /// On a CUDA device the survey holds the fp32 graph against the GPU's
    /// fp16 graph beside it, served with the pooling inside it; the CPU's
    /// variants (a quantized graph, OpenVINO) are not offered there. With no
    /// fp16 graph, the manifest's reason is given.
    #[test]
    fn a_cuda_entry_measures_the_fp32_graph_and_the_gpus_fp16_graph() {
        let dir = tempfile::tempdir().unwrap();
        let fp32 = dir.path().join("model.onnx");
        for file in ["model.onnx", "model_int8.onnx"] {
            std::fs::write(dir.path().join(file), b"graph").unwrap();
        }
        let manifest = |gpu: serde_json::Value| std::fs::write(dir.path().join("manifest.json"), serde_json::json!({"checks": {"cuda_fp16": gpu}}).to_string());
        let file = dir.path().join("eeane.toml");
        let entry =
            format!("[[models]]\nid = \"m\"\nmodel = {fp32:?}\ntokenizer = \"t.json\"\nmax_tokens = 16\nprecision = \"auto\"\ndevice = [\"cuda:H200\", \"cuda:H200\"]\n");
        std::fs::write(&file, entry).unwrap();
        let mut config = Config::load(Some(&file), &crate::config::CliOverrides::default()).unwrap().models.remove(0);
        let cpu = CpuFeatures { bf16: true, int8_dot: true };

        // The engine that measures variants on CUDA devices.
        let engine = crate::engines::ENGINES.iter().find(|e| !e.device_precisions(GraphKind::Float32, &config.device).is_empty()).unwrap().name();
        manifest(serde_json::json!({"graph": null, "why": "rerankers keep their fp32 graph"})).unwrap();
        let (offered, absent) = candidates(&config, &cpu);
        assert_eq!(offered.iter().map(Candidate::label).collect::<Vec<_>>(), [format!("{engine} fp32")]);
        assert_eq!(absent.len(), 1, "{absent:?}");
        assert!(absent[0].not_measured.as_deref().unwrap().contains("rerankers keep their fp32 graph"), "{absent:?}");

        std::fs::write(dir.path().join("model.fp16.onnx"), b"graph").unwrap();
        manifest(serde_json::json!({"graph": "model.fp16.onnx", "pooling_in_graph": "last_token"})).unwrap();
        let (offered, absent) = candidates(&config, &cpu);
        let offered: Vec<(String, String, bool)> = offered.iter().map(|c| (c.label(), file_name(&c.graph), c.pooled_in_graph)).collect();
        assert_eq!(offered, [(format!("{engine} fp32"), "model.onnx".into(), false), (format!("{engine} fp16"), "model.fp16.onnx".into(), true)]);
        assert!(absent.is_empty(), "{absent:?}");
        // The fp16 graph pools inside: its variant is served with pooling = "none".
        let server = Config::load(Some(&file), &crate::config::CliOverrides::default()).unwrap();
        let (offered, _) = candidates(&config, &cpu);
        let fp16 = variant_config(&config, &server, &offered[1]).unwrap();
        assert_eq!((fp16.pooling, fp16.model.path()), (crate::config::Pooling::None, dir.path().join("model.fp16.onnx")));
        assert_eq!(variant_config(&config, &server, &offered[0]).unwrap().pooling, config.pooling);
        // The same folder on the CPU: the quantized graph, never the GPU's.
        config.device = Devices::cpu();
        let (offered, _) = candidates(&config, &cpu);
        assert!(offered.iter().all(|c| file_name(&c.graph) != "model.fp16.onnx"), "{offered:?}");
        assert!(offered.iter().any(|c| file_name(&c.graph) == "model_int8.onnx"), "{offered:?}");
    }

    /// An auto entry of four sessions on one card, as a config file reads it.
    fn four_sessions(card: &str, max_tokens: usize) -> ModelConfig {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eeane.toml");
        let device = format!("\"cuda:{card}\"");
        let entry = format!(
            "[[models]]\nid = \"m\"\nmodel = \"m.onnx\"\ntokenizer = \"t.json\"\nmax_tokens = {max_tokens}\nprecision = \"auto\"\ndevice = [{}]\n",
            [device.as_str(); 4].join(", ")
        );
        std::fs::write(&file, entry).unwrap();
        Config::load(Some(&file), &crate::config::CliOverrides::default()).unwrap().models.remove(0)
    }

    #[test]
    fn a_gpu_variant_is_surveyed_as_one_session_and_a_cpu_one_as_served() {
        let mut config = four_sessions("H100", 256);
        let trial = trial_config(&config);
        assert_eq!(trial.device.iter().map(|d| d.to_string()).collect::<Vec<_>>(), ["cuda:H100"]);
        assert_eq!((trial.max_batch, trial.max_batch_tokens, &trial.buckets), (config.max_batch, config.max_batch_tokens, &config.buckets));
        config.device = Devices::new(["cpu", "cpu"]).unwrap();
        assert_eq!(trial_config(&config).device, config.device);
    }

    #[test]
    fn a_gpu_is_timed_on_texts_near_the_window_and_the_cpu_on_short_ones() {
        let mut config = four_sessions("H200", 8192);
        let gpu = timing_texts(&config);
        assert_eq!(gpu.len(), GPU_TIMING_TEXTS);
        // The window is capped: 512 tokens, about 1,536 characters.
        assert!(gpu.iter().all(|t| (1536..1536 + 2000).contains(&t.len())), "{:?}", gpu.iter().map(String::len).collect::<Vec<_>>());
        assert!(gpu.windows(2).any(|w| w[0] != w[1]));
        config.max_tokens = 128;
        assert!(timing_texts(&config).iter().all(|t| t.len() >= 384));
        config.device = Devices::cpu();
        assert_eq!(timing_texts(&config), crate::corpus::corpus(128, 7));
    }

    #[test]
    fn a_variant_not_offered_says_why() {
        let mut absent = m("engine-b bf16", 0.0, 0.0);
        absent.min_cosine = None;
        absent.texts_per_s = None;
        absent.not_measured = Some("this CPU has neither AVX512-BF16 nor AMX".into());
        let (_, reason) = choose("engine-a fp32", &[m("engine-a fp32", 1.0, 1.0), absent]);
        assert!(reason.contains("not measured: engine-b bf16 (this CPU has neither"), "{reason}");
    }
}
