//! ONNX Runtime engine. The library is opened at run time from an explicit path,
//! so a machine without it still builds and serves the other engines, and a
//! missing or wrong library fails only the models that use it. On the CPU it
//! opens the `onnxruntime` wheel's library; on `cuda:<GPU name>` the
//! `onnxruntime-gpu` wheel's, with the CUDA execution provider (cuda.rs).

pub mod cuda;
mod cuda_graphs;
mod cuda_ops;

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use eeane_backend_core::{
    Backend, CpuFeatures, Device, DeviceMemory, DeviceRuntime, Devices, Engine, EngineError, EngineInfo, EngineOutput, EngineSpec, GraphKind, HubPreparation,
    InputShapes, InvalidOptions, Options, PathResolver, PrecisionOffer, TokenBatch, VisibleDevices,
};
use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{Tensor, ValueType};

/// ONNX Runtime allows one environment per process, bound to the first library opened.
type Runtime = (Environment, String);
static RUNTIME: OnceLock<(PathBuf, Result<Runtime, EngineError>)> = OnceLock::new();
static RUNTIME_INIT: Mutex<()> = Mutex::new(());

/// The process's environment and the library's version, opened from `library` on first use.
fn runtime(library: &Path) -> Result<&'static Runtime, EngineError> {
    let _guard = RUNTIME_INIT.lock().unwrap_or_else(|e| e.into_inner());
    let (opened, result) = RUNTIME.get_or_init(|| (library.to_path_buf(), open_runtime(library)));
    if opened != library {
        return Err(EngineError::Runtime(format!(
            "ONNX Runtime is already loaded from {} in this process; cannot also load {}",
            opened.display(),
            library.display()
        )));
    }
    result.as_ref().map_err(Clone::clone)
}

fn open_runtime(library: &Path) -> Result<Runtime, EngineError> {
    let fail = |message: String| EngineError::Runtime(message);
    if !library.exists() {
        return Err(fail(format!("ONNX Runtime library {} does not exist (run models/setup.sh, or set [runtimes] onnxruntime)", library.display())));
    }
    // Opened by its real path: ONNX Runtime finds its provider libraries
    // (CUDA) beside the file it was loaded from, not beside a link to it.
    let real = std::fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf());
    let builder = ort::init_from(&real).map_err(|e| fail(format!("cannot load ONNX Runtime from {}: {e}", library.display())))?;
    let env = builder.with_name("eeane").build().map_err(|e| fail(format!("cannot create the ONNX Runtime environment: {e}")))?;
    warm_up(&env).map_err(|e| fail(format!("ONNX Runtime from {} cannot run a graph: {e}", library.display())))?;
    page_out_library(library);
    // The wheel's library is named libonnxruntime.so.X.Y.Z; a link to it names no version.
    let version = std::fs::canonicalize(library)
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.strip_prefix("libonnxruntime.so.").map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    Ok((env, version))
}

/// The ONNX Runtime engine, as eeane registers it.
pub struct OnnxRuntime;

/// A model entry's keys for this engine.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxRuntimeOptions {
    /// Let the compute threads spin between operations. Off by default:
    /// spinning threads steal the cores that tokenization and HTTP need
    /// between forward passes on a small machine.
    #[serde(default)]
    pub spin: bool,
    /// The graph's precision as /health reports it ("int8" for a quantized
    /// graph); ONNX Runtime runs the graph as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// On a CUDA device: batches that run with at most this many rows (the
    /// GPU's row counts: 1, 2, 4 .. 32, 64, 96 ..) run as CUDA graphs, one
    /// captured per shape while the model is idle (cuda_graphs.rs). The
    /// graph's output must be pooled. Other devices ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_graph_rows: Option<usize>,
}

/// The most rows `cuda_graph_rows` takes: one graph a shape, and shapes of
/// more rows gain little from one (the engine alone, 256 rows: 1.01-1.04x).
const MAX_CUDA_GRAPH_ROWS: usize = 256;

impl Backend for OnnxRuntime {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }

    fn is_default(&self) -> bool {
        true
    }

    fn file_format(&self) -> &'static str {
        "onnx"
    }

    /// The ONNX graph, and on a CUDA device the GPU's graph beside it
    /// (models/gpu_graph.py: fused attention, fp16, pooled inside).
    fn hub_preparation(&self) -> Option<HubPreparation> {
        Some(HubPreparation { device_graphs: &[cuda::FP16_GRAPH], ..HubPreparation::ONNX })
    }

    fn configured_precision(&self, options: &Options) -> Option<String> {
        options.typed::<OnnxRuntimeOptions>().ok()?.precision
    }

    fn default_runtime(&self) -> Option<&'static str> {
        Some("{cache}/runtimes/onnxruntime/libonnxruntime.so")
    }

    /// Opens the runtime library (once per process) and returns its version, so a
    /// missing or wrong library shows at start-up rather than at the first request.
    fn open(&self, library: Option<&Path>) -> Result<String, EngineError> {
        runtime(library.ok_or_else(no_library)?).map(|(_, version)| version.clone())
    }

    fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        load(spec)
    }

    /// ONNX Runtime creates sessions of one environment from several threads;
    /// eight CUDA sessions of one model then load in about the time of one.
    fn loads_in_parallel(&self) -> bool {
        true
    }

    fn device_runtimes(&self) -> &'static [DeviceRuntime] {
        &[DeviceRuntime { key: cuda::RUNTIME_KEY, default: cuda::DEFAULT_RUNTIME, device_prefix: cuda::PREFIX }]
    }

    /// The GPUs NVML lists, once a CUDA model opened it, with the UUID and bus id that pin each.
    fn visible_devices(&self) -> Option<VisibleDevices> {
        let gpus = cuda::gpus_if_open()?;
        let devices = gpus.into_iter().map(|g| Device { name: g.name, kind: "discrete".into(), uuid: Some(g.uuid), bus_id: Some(g.pci_bus_id) }).collect();
        Some(VisibleDevices { api: "cuda", devices })
    }

    fn expand_devices(&self, devices: &Devices, _library: Option<&Path>, forbidden: &[String]) -> Result<Devices, EngineError> {
        cuda::expand(devices, forbidden)
    }

    fn device_problem(&self, devices: &Devices, library: Option<&Path>, forbidden: &[String]) -> Option<String> {
        devices.any_starts_with(cuda::PREFIX).then(|| cuda::problem(devices, library, forbidden)).flatten()
    }

    fn device_memory(&self, devices: &Devices) -> Option<DeviceMemory> {
        if !cuda::is_cuda(devices.first()) {
            return None;
        }
        let pinned = cuda::expand(devices, &[]).ok()?;
        let gpu = cuda::pick(pinned.first(), &[]).ok()?;
        Some(DeviceMemory { name: gpu.name, used_mib: gpu.memory_used >> 20, total_mib: gpu.memory_total >> 20 })
    }

    fn options(&self, entry: &serde_json::Map<String, serde_json::Value>, _paths: PathResolver) -> Result<Options, InvalidOptions> {
        Options::check(entry, |options: &mut OnnxRuntimeOptions| match options.cuda_graph_rows {
            Some(rows) if rows == 0 || rows > MAX_CUDA_GRAPH_ROWS => {
                Err(InvalidOptions(format!("cuda_graph_rows = {rows}: it takes 1 to {MAX_CUDA_GRAPH_ROWS} rows (the batches that run as CUDA graphs)")))
            }
            _ => Ok(()),
        })
    }

    /// The graph as it is: fp32, or a quantized graph's own int8.
    fn cpu_precisions(&self, kind: GraphKind, _cpu: &CpuFeatures) -> Vec<PrecisionOffer> {
        match kind {
            GraphKind::Float32 => vec![PrecisionOffer::new("fp32", &[])],
            GraphKind::Int8 => vec![PrecisionOffer::new("int8", &[("precision", "int8")])],
            // fp16 kernels on the CPU are slower than fp32 ones.
            GraphKind::Float16 => Vec::new(),
        }
    }

    /// On CUDA devices: the fp32 graph (TF32 off), and the fp16 graph made
    /// for the GPU. A quantized graph is not offered there: ONNX Runtime's
    /// CUDA provider runs its integer operators on the CPU.
    fn device_precisions(&self, kind: GraphKind, devices: &Devices) -> Vec<PrecisionOffer> {
        if !devices.iter().all(cuda::is_cuda) {
            return Vec::new();
        }
        match kind {
            GraphKind::Float32 => vec![PrecisionOffer::new("fp32", &[])],
            GraphKind::Float16 => vec![PrecisionOffer::new("fp16", &[("precision", "fp16")])],
            GraphKind::Int8 => Vec::new(),
        }
    }
}

fn no_library() -> EngineError {
    EngineError::Runtime("no ONNX Runtime library path configured".into())
}

/// Sessions alive in this process; when the last one goes, the library's code
/// pages are handed back too.
static LIVE_SESSIONS: AtomicUsize = AtomicUsize::new(0);

/// A 4x4 MatMul and a Softmax (made by make_warmup_onnx.py).
const WARMUP_GRAPH: &[u8] = include_bytes!("warmup.onnx");

/// Runs a tiny graph once, so that the runtime's one-time state (operator
/// schemas, kernel registries) is built and checked when the runtime opens, not
/// left behind by the first model's unload.
fn warm_up(env: &Environment) -> Result<(), ort::Error> {
    let mut session = Session::builder(env)?.commit_from_memory(WARMUP_GRAPH)?;
    let x = Tensor::from_array(([1usize, 4], vec![1.0f32; 4]))?;
    session.run(ort::inputs!["x" => x])?;
    Ok(())
}

pub struct OnnxRuntimeEngine {
    /// Dropped in `drop`, holding off CUDA graph captures (cuda_graphs.rs).
    session: ManuallyDrop<Session>,
    info: EngineInfo,
    output_name: String,
    /// On a GPU, batches run with their row count rounded up (`gpu_rows`,
    /// rows of one padding token), so that a few shapes recur: ONNX
    /// Runtime's CUDA provider pays for every shape it has not run before.
    round_rows: bool,
    /// GPU batch shapes `(rows, seq)` not run yet, the cheapest last: the
    /// engine's thread runs them one at a time while idle (`warm_next`).
    unwarmed: Vec<(usize, usize)>,
    loaded_at: std::time::Instant,
    /// On a CUDA device: this process's CUDA work is held against captures.
    on_cuda: bool,
    /// `cuda_graph_rows`' graphs.
    graphs: Option<cuda_graphs::Graphs>,
}

/// Sequence lengths on a GPU are multiples of this: with row counts as
/// `gpu_rows` rounds them, a model of 256 tokens and batches of 256 has
/// 16 x 13 shapes, each run once while the model is idle. Steps of 32 padded
/// the texts of tests/gpu/cuda.sh to 0.89 real tokens and steps of 8 to 0.94
/// (+7 % texts/s from eight sessions on an H100, the engine alone); each
/// shape costs its first run (cuDNN's attention plan), so 16 halves the step
/// at twice the shapes.
const GPU_SEQ_STEP: usize = 16;

/// What a call costs a GPU beyond its tokens, in tokens. Eight sessions of
/// all-MiniLM-L6-v2 on an H100 ran the texts of tests/gpu/cuda.sh at 19.0 us
/// a padded text in batches of 32 rows and 15.5 us in batches of 256, the
/// engine alone (tests/gpu/ort_kernels.py): a call of 32 rows cost about
/// 1,100 tokens more than its share. With the CPU's 128, the planner split
/// batches at every length step to save a little padding.
const GPU_CALL_COST_TOKENS: usize = 1024;

/// Whether a CUDA session of this process has put eeane's operator domain
/// (cuda_ops.rs) into ONNX's table of domains.
static CUDA_DOMAIN_ADDED: Mutex<bool> = Mutex::new(false);

/// Loads `spec.model_path` on the CPU, or on a CUDA GPU through the CUDA
/// execution provider with eeane's operators (cuda_ops.rs) registered.
fn load(spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
    let options: OnnxRuntimeOptions = spec.options.typed()?;
    let library = spec.runtime_library.as_deref().ok_or_else(no_library)?;
    // A CUDA session's load is CUDA work from its first call (the provider's
    // libraries, the context's flags) to its last (the graphs' buffers): a
    // capture elsewhere in the process must not meet it (cuda_graphs.rs).
    let cuda_work = cuda::is_cuda(&spec.device).then(cuda_graphs::loading);
    let gpu = match &spec.device {
        device if *device == "cpu" => None,
        device if cuda::is_cuda(device) => {
            if let Some(problem) = cuda::problem(&Devices::one(device.clone()), Some(library), &spec.forbidden_devices) {
                return Err(EngineError::Device(problem));
            }
            cuda::preload(library)?;
            let gpu = cuda::pick(device, &spec.forbidden_devices)?;
            let ordinal = cuda::ordinal(&gpu)?;
            cuda::block_while_waiting(ordinal);
            Some((gpu, ordinal))
        }
        device => return Err(EngineError::Device(format!("device {device:?}: the ONNX Runtime engine runs on \"cpu\" or \"cuda:<GPU name>\""))),
    };
    let (env, version) = runtime(library)?;
    if !spec.model_path.is_file() {
        return Err(EngineError::Model(format!("{} does not exist", spec.model_path.display())));
    }
    let model_err = |e: ort::Error| EngineError::Model(format!("{}: {e}", spec.model_path.display()));
    let mut builder = Session::builder(env).map_err(model_err)?;
    builder = builder.with_optimization_level(GraphOptimizationLevel::Level3).map_err(|e| model_err(e.into()))?;
    // On a GPU the CPU only runs the few shape operators: one thread, so that
    // several sessions leave the cores to tokenization and HTTP.
    let threads = if spec.threads == 0 && gpu.is_some() { 1 } else { spec.threads };
    if threads > 0 {
        builder = builder.with_intra_threads(threads).map_err(|e| model_err(e.into()))?;
    }
    builder = builder.with_intra_op_spinning(options.spin).map_err(|e| model_err(e.into()))?;
    if let Some((_, ordinal)) = &gpu {
        // error_on_failure: by default ONNX Runtime falls back to the CPU,
        // silently, when the CUDA provider cannot start.
        // TF32 off: an fp32 graph computes in fp32, as its reference does; fp16
        // is the fast variant, checked against it.
        // The arena grows by what a run asks for, not to the next power of
        // two: every shape is run at load, and doubling left each session
        // holding about three times the memory its largest shape needs.
        let provider = ort::ep::CUDA::default()
            .with_device_id(*ordinal)
            .with_tf32(false)
            .with_arena_extend_strategy(ort::ep::ArenaExtendStrategy::SameAsRequested)
            .with_cuda_graph(options.cuda_graph_rows.is_some())
            .build()
            .error_on_failure();
        builder = builder
            .with_execution_providers([provider])
            .map_err(|e| EngineError::Device(format!("the CUDA execution provider cannot start on device {ordinal}: {e}")))?;
        builder = builder.with_operators(cuda_ops::domain(&cuda::cublas_lt(library)?)?).map_err(|e| model_err(e.into()))?;
    }
    let session = if gpu.is_some() {
        // ONNX keeps one process-wide table of operator domains, and ONNX
        // Runtime adds a session's custom domain to it when absent, without
        // a lock: eight CUDA sessions committed at once raced there, and one
        // failed ("the domain is already exist"). The first commits alone.
        let mut added = CUDA_DOMAIN_ADDED.lock().unwrap_or_else(|e| e.into_inner());
        if *added {
            drop(added);
            builder.commit_from_file(&spec.model_path)
        } else {
            let session = builder.commit_from_file(&spec.model_path);
            *added = session.is_ok();
            session
        }
    } else {
        builder.commit_from_file(&spec.model_path)
    };
    let session = session.map_err(|e| match gpu {
        // The GPU's graph (model.fp16.onnx of a CUDA-prepared model) on the CPU.
        None if e.to_string().contains(cuda_ops::DOMAIN) => EngineError::Model(format!(
            "{}: this graph is made for CUDA devices (it uses eeane's {} operators, which run on NVIDIA GPUs only); on the CPU serve the model.onnx beside it, or put the model on device = \"cuda:<GPU name>\"",
            spec.model_path.display(),
            cuda_ops::DOMAIN
        )),
        _ => model_err(e),
    })?;

    let input_names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
    for required in ["input_ids", "attention_mask"] {
        if !input_names.contains(&required) {
            return Err(EngineError::Model(format!("the graph has no input {required:?} (inputs: {input_names:?})")));
        }
    }
    if let Some(extra) = input_names.iter().find(|n| !["input_ids", "attention_mask", "token_type_ids"].contains(n)) {
        return Err(EngineError::Model(format!("the graph takes an input {extra:?} that eeane does not provide")));
    }
    let output = match &spec.output {
        Some(name) => session.outputs().iter().find(|o| o.name() == name).ok_or_else(|| EngineError::Model(format!("the graph has no output {name:?}")))?,
        None => session.outputs().first().ok_or_else(|| EngineError::Model("the graph has no outputs".into()))?,
    };
    let precision = match output.dtype() {
        ValueType::Tensor { ty, shape, .. } if matches!(shape.len(), 2 | 3) => {
            if *ty != ort::value::TensorElementType::Float32 {
                return Err(EngineError::Model(format!("output {:?} is {ty}, eeane reads float32", output.name())));
            }
            // ONNX Runtime runs the graph at its own precision; the config may name it.
            options.precision.clone().unwrap_or_else(|| "as-graph".into())
        }
        other => return Err(EngineError::Model(format!("output {:?} is {other}, expected a rank 2 or 3 tensor", output.name()))),
    };
    let info = EngineInfo {
        engine: "onnxruntime".into(),
        device: gpu.as_ref().map_or_else(|| "cpu".into(), |(g, _)| format!("cuda:{}", g.name)),
        precision,
        shapes: InputShapes::Dynamic,
        takes_token_type_ids: input_names.contains(&"token_type_ids"),
        // On the CPU every padded token costs compute and no length runs faster
        // than a shorter one, so batches run at their exact longest length. On
        // a GPU lengths in steps keep the number of shapes small (see round_rows).
        seq_multiple: if gpu.is_some() { GPU_SEQ_STEP } else { 1 },
        call_cost_tokens: if gpu.is_some() { GPU_CALL_COST_TOKENS } else { eeane_backend_core::CPU_CALL_COST_TOKENS },
        row_counts: if gpu.is_some() { gpu_row_counts(&spec.shapes) } else { Vec::new() },
        accelerated_layers: None,
        runtime_version: Some(version.clone()),
    };
    let output_name = output.name().to_string();
    let graphs = match (&gpu, options.cuda_graph_rows) {
        (Some((_, ordinal)), Some(rows)) => {
            let dim = match output.dtype() {
                ValueType::Tensor { shape, .. } if shape.len() == 2 && shape[1] > 0 => shape[1] as usize,
                other => {
                    return Err(EngineError::Model(format!(
                        "cuda_graph_rows: CUDA graphs need a graph whose output {:?} is pooled, [rows, dim] with dim fixed; it is {other} (serve it without cuda_graph_rows)",
                        output.name()
                    )))
                }
            };
            let mut inputs = vec!["input_ids", "attention_mask"];
            if info.takes_token_type_ids {
                inputs.push("token_type_ids");
            }
            let graphs = cuda_graphs::Graphs::new(&session, library, *ordinal, rows, &output_name, dim, inputs)?;
            Some(graphs)
        }
        _ => None,
    };
    drop(cuda_work);
    LIVE_SESSIONS.fetch_add(1, Ordering::AcqRel);
    let unwarmed = if gpu.is_some() { gpu_shapes(&spec.shapes) } else { Vec::new() };
    Ok(Box::new(OnnxRuntimeEngine {
        session: ManuallyDrop::new(session),
        info,
        output_name,
        round_rows: gpu.is_some(),
        unwarmed,
        loaded_at: std::time::Instant::now(),
        on_cuda: gpu.is_some(),
        graphs,
    }))
}

/// Rows a GPU batch of `rows` runs with: a power of two up to 32, then a
/// multiple of 32 up to 256, and above that of a quarter of the power of two
/// below (64 up to 512, 128 up to 1,024). Powers of two all the way wasted
/// up to half of a large batch (129 rows ran as 256; on an H100 steps of 32
/// gave bulk 1.07x, docs/performance.md); the steps grow with the rows so
/// that the shapes warmed stay few: 13 row counts up to 256, 21 up to 1,024.
fn gpu_rows(rows: usize) -> usize {
    if rows <= GPU_ROW_STEP {
        return rows.next_power_of_two();
    }
    let below = 1usize << (usize::BITS - 1 - (rows - 1).leading_zeros());
    let step = (below / 4).max(GPU_ROW_STEP);
    rows.div_ceil(step) * step
}

const GPU_ROW_STEP: usize = 32;

/// The row counts a GPU batch runs with (`gpu_rows`), up to the largest
/// bucket's batch: the planner prices a batch at these.
fn gpu_row_counts(buckets: &[(usize, usize)]) -> Vec<usize> {
    let max_rows = buckets.iter().map(|s| s.0).max().unwrap_or(32);
    let mut rows: Vec<usize> = (1..=max_rows).map(gpu_rows).collect();
    rows.dedup();
    rows
}

/// Every shape a GPU batch can take (rows as `gpu_rows` rounds them up to
/// the largest bucket's batch, lengths in steps up to its longest), the
/// cheapest last. Running them all at load took 38 s for eight sessions of
/// all-MiniLM-L6-v2 on an H200 (then 72 shapes each); a model now serves at once
/// and runs them while idle, the small ones that one-text traffic needs first.
fn gpu_shapes(buckets: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let max_seq = buckets.iter().map(|s| s.1).max().unwrap_or(512).div_ceil(GPU_SEQ_STEP) * GPU_SEQ_STEP;
    let mut shapes: Vec<(usize, usize)> =
        gpu_row_counts(buckets).into_iter().flat_map(|r| (GPU_SEQ_STEP..=max_seq).step_by(GPU_SEQ_STEP).map(move |s| (r, s))).collect();
    shapes.sort_by_key(|&(rows, seq)| std::cmp::Reverse((rows * seq, rows)));
    shapes
}

impl Engine for OnnxRuntimeEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Runs the cheapest shape not run yet, with rows of distinct tokens; a
    /// shape that is to run as a CUDA graph is captured.
    fn warm_next(&mut self) -> Result<bool, EngineError> {
        let Some(&(rows, seq)) = self.unwarmed.last() else { return Ok(false) };
        let started = std::time::Instant::now();
        // Rows of distinct tokens; a second set for a capture's check.
        let tokens =
            |offset: i64| -> Vec<Vec<i64>> { (0..rows as i64).map(|r| (0..seq as i64).map(|i| 1000 + (offset + r * 131 + i * 7) % 500).collect()).collect() };
        let batch_of = |tokens: &[Vec<i64>]| TokenBatch::from_rows(&tokens.iter().map(|row| (row.as_slice(), None)).collect::<Vec<_>>(), seq, 0);
        let first = tokens(0);
        let captured = match &mut self.graphs {
            Some(graphs) if graphs.covers(rows, seq) && !graphs.captured(rows, seq) => {
                let second = tokens(251);
                let types = self.info.takes_token_type_ids;
                let capture = graphs.capture(
                    &mut self.session,
                    rows,
                    seq,
                    &padded_inputs(&batch_of(&first), rows, types),
                    &padded_inputs(&batch_of(&second), rows, types),
                );
                if capture == cuda_graphs::Capture::Later {
                    return Ok(true);
                }
                self.unwarmed.pop();
                capture == cuda_graphs::Capture::Captured
            }
            _ => {
                self.run(&batch_of(&first))?;
                false
            }
        };
        tracing::debug!(rows, seq, captured, ms = started.elapsed().as_secs_f64() * 1e3, left = self.unwarmed.len(), "warmed a GPU batch shape");
        if self.unwarmed.is_empty() {
            let cuda_graphs = self.graphs.as_ref().map_or(0, cuda_graphs::Graphs::count);
            tracing::info!(seconds_since_load = self.loaded_at.elapsed().as_secs_f64(), cuda_graphs, "every GPU batch shape has run once");
        }
        Ok(!self.unwarmed.is_empty())
    }

    fn run(&mut self, batch: &TokenBatch) -> Result<EngineOutput, EngineError> {
        let rows = if self.round_rows { gpu_rows(batch.batch) } else { batch.batch };
        let seq = batch.seq;
        // A shape has run once; one that is to be a CUDA graph stays for
        // `warm_next` to capture.
        if !self.graphs.as_ref().is_some_and(|graphs| graphs.covers(rows, seq) && !graphs.captured(rows, seq)) {
            self.unwarmed.retain(|&shape| shape != (rows, seq));
        }
        let _cuda_work = self.on_cuda.then(cuda_graphs::shared_work);
        let inputs = padded_inputs(batch, rows, self.info.takes_token_type_ids);
        let real = batch.batch;
        let started = std::time::Instant::now();
        if let Some(graphs) = &mut self.graphs {
            if graphs.covers(rows, seq) && graphs.captured(rows, seq) {
                // A replay that fails turns the graphs off; the batch runs plainly below.
                if let Ok(data) = graphs.run(&mut self.session, rows, seq, &inputs, real) {
                    tracing::debug!(rows, seq, real, run_ms = started.elapsed().as_secs_f64() * 1e3, "graph replay");
                    return Ok(EngineOutput::Pooled { dim: data.len() / real.max(1), data, batch: real });
                }
            }
        }
        let shape = [rows as i64, seq as i64];
        let mut tensors = Vec::with_capacity(inputs.len());
        for (name, data) in ["input_ids", "attention_mask", "token_type_ids"].into_iter().zip(inputs) {
            tensors.push((name, Tensor::from_array((shape, data)).map_err(|e| EngineError::Input(e.to_string()))?));
        }
        let outputs = match &self.graphs {
            Some(graphs) => self.session.run_with_options(tensors, graphs.plain()),
            None => self.session.run(tensors),
        }
        .map_err(|e| EngineError::Inference(e.to_string()))?;
        tracing::debug!(
            rows,
            seq,
            real,
            longest = batch.lengths.iter().max().copied().unwrap_or(0),
            run_ms = started.elapsed().as_secs_f64() * 1e3,
            "session run"
        );
        let (out_shape, data) = outputs[self.output_name.as_str()].try_extract_tensor::<f32>().map_err(|e| EngineError::Inference(e.to_string()))?;
        let dims: Vec<usize> = out_shape.iter().map(|&d| d as usize).collect();
        match dims.as_slice() {
            [b, d] if *b == rows => Ok(EngineOutput::Pooled { data: data[..real * d].to_vec(), batch: real, dim: *d }),
            [b, s, d] if *b == rows && *s == seq => Ok(EngineOutput::Hidden { data: data[..real * s * d].to_vec(), batch: real, seq: *s, dim: *d }),
            _ => Err(EngineError::Inference(format!("unexpected output shape {dims:?} for a batch of {rows}x{seq}"))),
        }
    }
}

/// A batch's inputs padded to `rows` rows: input_ids, attention_mask, and
/// token_type_ids where the graph takes them, each `[rows, seq]`. Padding
/// rows hold one attended padding token each (a row with nothing attended
/// would divide by zero in the attention's softmax).
fn padded_inputs(batch: &TokenBatch, rows: usize, token_types: bool) -> Vec<Vec<i64>> {
    let seq = batch.seq;
    let padded = |data: &[i64], first: i64| {
        let mut all = Vec::with_capacity(rows * seq);
        all.extend_from_slice(data);
        for _ in batch.batch..rows {
            all.push(first);
            all.extend(std::iter::repeat_n(0, seq - 1));
        }
        all
    };
    let mut inputs = vec![padded(&batch.input_ids, 0), padded(&batch.attention_mask, 1)];
    if token_types {
        inputs.push(match &batch.token_type_ids {
            Some(t) => padded(t, 0),
            None => vec![0; rows * seq],
        });
    }
    inputs
}

impl Drop for OnnxRuntimeEngine {
    fn drop(&mut self) {
        {
            // Freeing the card's memory is CUDA work that a capture elsewhere
            // in the process must not meet.
            let _cuda_work = self.on_cuda.then(cuda_graphs::shared_work);
            self.graphs = None;
            // SAFETY: dropped once, here; the field is not used after.
            unsafe { ManuallyDrop::drop(&mut self.session) };
        }
        if LIVE_SESSIONS.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some((library, _)) = RUNTIME.get() {
                page_out_library(library);
            }
        }
    }
}

/// With no model on ONNX Runtime left, asks the kernel to drop the library's
/// read-only pages (about 29 MiB of code that inference paged in) from this
/// process's resident set. They are clean file pages: the next load faults
/// them back from the page cache.
fn page_out_library(library: &Path) {
    #[cfg(target_os = "linux")]
    {
        let Ok(target) = std::fs::canonicalize(library) else { return };
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
            if perms.contains('w') || fields.nth(3).map(Path::new) != Some(target.as_path()) {
                continue;
            }
            let Some((start, end)) = range.split_once('-') else { continue };
            let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else { continue };
            // SAFETY: a read-only file mapping of this process; MADV_PAGEOUT only
            // reclaims pages, which fault back in unchanged. Errors (old kernels) are harmless.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = library;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_rows_round_to_powers_of_two_then_steps_of_32() {
        let rounded: Vec<usize> = [1, 3, 17, 32, 33, 64, 65, 129, 250, 256, 257, 513, 1000].into_iter().map(gpu_rows).collect();
        assert_eq!(rounded, [1, 4, 32, 32, 64, 64, 96, 160, 256, 256, 320, 640, 1024]);
        let mut counts: Vec<usize> = (1..=1024).map(gpu_rows).collect();
        counts.dedup();
        assert_eq!(counts.len(), 21, "{counts:?}");
    }

    #[test]
    fn every_batch_a_gpu_runs_is_a_shape_warmed_while_idle() {
        let buckets = [(256, 64), (256, 128), (100, 256)];
        let shapes = gpu_shapes(&buckets);
        for rows in 1..=256 {
            for seq in (GPU_SEQ_STEP..=256).step_by(GPU_SEQ_STEP) {
                assert!(shapes.contains(&(gpu_rows(rows), seq)), "{rows} rows of {seq} tokens run as a shape never warmed");
            }
        }
        assert_eq!(shapes.len(), 13 * 16, "13 row counts up to 256, 16 lengths up to 256");
        assert!(gpu_shapes(&[(100, 64)]).contains(&(128, 64)), "a batch of 100 rows runs as 128");
        assert_eq!(shapes.last(), Some(&(1, GPU_SEQ_STEP)), "the cheapest shape is warmed first");
    }

    #[test]
    fn cuda_graph_rows_takes_1_to_256() {
        let entry = |rows: i64| serde_json::json!({ "cuda_graph_rows": rows }).as_object().cloned().unwrap();
        let resolve = |p: &Path| p.to_path_buf();
        assert!(OnnxRuntime.options(&entry(64), &resolve).is_ok());
        for rows in [0, 257] {
            let refused = OnnxRuntime.options(&entry(rows), &resolve).unwrap_err();
            assert!(refused.0.contains("cuda_graph_rows"), "{refused}");
        }
    }

    #[test]
    fn the_planner_prices_a_batch_at_the_rows_the_gpu_runs() {
        // The planner prices a batch at the first row count at or above its
        // rows (eeane_backend_core::rows_run): the rows the engine runs.
        let counts = gpu_row_counts(&[(256, 64), (256, 128), (100, 256)]);
        assert_eq!(counts, [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256]);
        for rows in 1..=256 {
            assert_eq!(eeane_backend_core::rows_run(&counts, rows), gpu_rows(rows), "{rows} rows");
        }
    }
}
