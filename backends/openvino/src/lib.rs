//! OpenVINO engine: the model (ONNX or IR) is compiled once per length
//! bucket, with bounded dynamic shapes (rows up to the bucket's batch, length
//! up to its tokens), and each batch runs unpadded on the smallest that holds it.
//!
//! The C library comes from the PyPI `openvino` wheel, whose files carry only
//! versioned names, so it is opened by explicit path.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

use eeane_backend_core::{
    compile_cache, Backend, CpuFeatures, DeviceName, Engine, EngineError, EngineInfo, EngineOutput, EngineSpec, GraphKind, HubPreparation, InputShapes,
    InvalidOptions, Options, PathResolver, PrecisionOffer, TokenBatch,
};
use openvino::{Core, DeviceType, Dimension, ElementType, InferRequest, PartialShape, RwPropertyKey, Shape, Tensor};

static RUNTIME: OnceLock<Result<String, EngineError>> = OnceLock::new();

/// The OpenVINO engine, as eeane registers it.
pub struct OpenVino;

/// The inference precision hint. The model's own precision (f32) unless the
/// config says otherwise: on CPUs with AVX512-BF16 OpenVINO would otherwise
/// run an fp32 graph in bf16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    #[serde(alias = "fp32")]
    F32,
    Bf16,
    #[serde(alias = "fp16")]
    F16,
    /// A Q/DQ graph: its scales are kept and the rest runs in f32.
    Int8,
}

/// A model entry's keys for this engine.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenVinoOptions {
    #[serde(default)]
    pub precision: Precision,
    #[serde(default)]
    pub compile_cache: CacheMode,
}

/// What a compiled model in the compile cache holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// The compiled graph without its weights, which are mapped from the model
    /// file at each load (OpenVINO's OPTIMIZE_SIZE). all-MiniLM-L6-v2, six
    /// buckets: 2.2 MiB against 518 MiB, and a cached load 1.0 s slower
    /// (2.7 s against 1.7 s, 2-core EPYC, 2026-12-02; docs/performance.md).
    #[default]
    Size,
    /// The compiled graph with its weights, once per bucket (OPTIMIZE_SPEED).
    Speed,
}

impl Backend for OpenVino {
    fn name(&self) -> &'static str {
        "openvino"
    }

    /// OpenVINO reads the same ONNX graph as ONNX Runtime.
    fn hub_preparation(&self) -> Option<HubPreparation> {
        Some(HubPreparation::ONNX)
    }

    fn configured_precision(&self, options: &Options) -> Option<String> {
        let precision = options.typed::<OpenVinoOptions>().ok()?.precision;
        serde_json::to_value(precision).ok()?.as_str().map(str::to_string)
    }

    fn default_runtime(&self) -> Option<&'static str> {
        Some("{cache}/runtimes/openvino/libopenvino_c.so")
    }

    fn open(&self, library: Option<&Path>) -> Result<String, EngineError> {
        open(library.ok_or_else(no_library)?)
    }

    fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        load(spec)
    }

    fn options(&self, entry: &serde_json::Map<String, serde_json::Value>, _paths: PathResolver) -> Result<Options, InvalidOptions> {
        Options::check(entry, |_: &mut OpenVinoOptions| Ok(()))
    }

    /// f32, and bf16 where the CPU computes in bf16 (emulated bf16 is slower
    /// than f32); a quantized graph at its own int8.
    fn cpu_precisions(&self, kind: GraphKind, cpu: &CpuFeatures) -> Vec<PrecisionOffer> {
        match kind {
            GraphKind::Float32 => vec![
                PrecisionOffer::new("fp32", &[("precision", "f32")]),
                if cpu.bf16 {
                    PrecisionOffer::new("bf16", &[("precision", "bf16")])
                } else {
                    PrecisionOffer::unavailable("bf16", "this CPU has neither AVX512-BF16 nor AMX: bf16 would be emulated, slower than f32")
                },
            ],
            GraphKind::Int8 => vec![PrecisionOffer::new("int8", &[("precision", "int8")])],
            // A graph made for a GPU's fp16 kernels (ONNX Runtime's own operators).
            GraphKind::Float16 => Vec::new(),
        }
    }

    fn compiles_per_bucket(&self) -> bool {
        true
    }
}

fn no_library() -> EngineError {
    EngineError::Runtime("no OpenVINO library configured".into())
}

/// Opens the OpenVINO C library once per process and returns its version.
/// The first path wins: OpenVINO cannot be loaded twice.
fn open(path: &Path) -> Result<String, EngineError> {
    RUNTIME
        .get_or_init(|| {
            let fail = |message: String| EngineError::Runtime(message);
            if !path.is_file() {
                return Err(fail(format!(
                    "OpenVINO library {} not found (run models/setup.sh with EEANE_EXTRA_MODELS=openvino, or set runtimes.openvino)",
                    path.display()
                )));
            }
            // Through any symlink: the library finds its siblings by $ORIGIN, the real directory.
            let real = std::fs::canonicalize(path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
            openvino_sys::library::load_from(&real).map_err(|e| fail(format!("cannot open {}: {e}", path.display())))?;
            Ok(openvino::version().build_number)
        })
        .clone()
}

/// OpenVINO's name of the device asked for ("CPU", "GPU", "NPU", "GPU.1"),
/// when this machine has it. A model entry's list in order of preference is
/// eeane's: it starts one engine per device, skipping those that are missing.
fn pick_device(core: &Core, asked: &DeviceName) -> Result<String, EngineError> {
    let available: Vec<String> = core
        .available_devices()
        .map_err(|e| EngineError::Device(format!("cannot list OpenVINO devices: {e}")))?
        .iter()
        .map(|d| d.as_ref().to_string())
        .collect();
    let want = asked.as_str().to_uppercase();
    // "GPU" matches "GPU" or the first "GPU.n".
    match available.iter().find(|a| **a == want || a.split('.').next() == Some(want.as_str())) {
        Some(found) => Ok(found.clone()),
        None => Err(EngineError::Device(format!("none of the devices asked for ({asked}) is present; this machine has: {}", available.join(", ")))),
    }
}

struct Compiled {
    batch: usize,
    seq: usize,
    request: InferRequest,
}

pub struct OpenVinoEngine {
    info: EngineInfo,
    compiled: Vec<Compiled>,
    output: String,
    inputs: Vec<String>,
    // Dropped last: the compiled models belong to it.
    _core: Core,
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> EngineError {
    move |e| EngineError::Model(format!("{what}: {e}"))
}

/// Loads the model and compiles it once per entry of `spec.shapes`, with
/// bounded dynamic shapes (rows and tokens up to the entry's), through
/// OpenVINO's compile cache in `spec.compile_cache`.
fn load(spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
    let options: OpenVinoOptions = spec.options.typed()?;
    let library = spec.runtime_library.as_deref().ok_or_else(no_library)?;
    let version = open(library)?;
    let mut core = Core::new().map_err(|e| EngineError::Runtime(format!("OpenVINO core: {e}")))?;
    let device = pick_device(&core, &spec.device)?;
    let device_type = DeviceType::Other(device.clone().into());

    let (precision, hint) = match options.precision {
        Precision::F32 => ("f32", "f32"),
        Precision::Int8 => ("int8", "f32"),
        Precision::Bf16 => ("bf16", "bf16"),
        Precision::F16 => ("f16", "f16"),
    };
    let set = |core: &mut Core, key: RwPropertyKey, value: &str| {
        core.set_property(&device_type, &key, value).map_err(|e| EngineError::Device(format!("{device}: cannot set {}={value}: {e}", key.as_ref())))
    };
    set(&mut core, RwPropertyKey::HintInferencePrecision, hint)?;
    set(&mut core, RwPropertyKey::HintPerformanceMode, "LATENCY")?;
    if spec.threads > 0 {
        set(&mut core, RwPropertyKey::InferenceNumThreads, &spec.threads.to_string())?;
    }
    // OpenVINO pins its compute threads by its own process-wide map of the
    // CPUs: two engines of one core each, on threads of one process kept to
    // CPU 0 and CPU 1, both computed on CPU 0 (half the throughput of the
    // same engines in two processes). The thread's mask already places them.
    if spec.own_cpus_in_shared_process {
        set(&mut core, RwPropertyKey::HintEnableCpuPinning, "NO")?;
    }
    let shapes: Vec<String> = spec.shapes.iter().map(|(b, s)| format!("{b}x{s}")).collect();
    let cache_mode = match options.compile_cache {
        CacheMode::Size => "OPTIMIZE_SIZE",
        CacheMode::Speed => "OPTIMIZE_SPEED",
    };
    // One folder per compiled model, locked while its blobs are written: a
    // blob rewritten in place while another load mapped it killed that load
    // with SIGBUS (a server killed mid-load leaves its engine compiling).
    let compile_cache = match spec.compile_cache.as_deref() {
        Some(root) => {
            let name = compile_cache::folder_name(&spec.model_path, &[hint, &device, &shapes.join(","), cache_mode, &version]);
            Some(
                compile_cache::CacheFolder::open(root, &name, &spec.model_path)
                    .map_err(|e| EngineError::Runtime(format!("compile cache {}: {e}", root.display())))?,
            )
        }
        None => None,
    };
    if let Some(cache) = &compile_cache {
        set(&mut core, RwPropertyKey::CacheDir, &cache.dir.to_string_lossy())?;
        set(&mut core, RwPropertyKey::CacheMode, cache_mode)?;
    }

    let path = &spec.model_path;
    if !path.is_file() {
        return Err(EngineError::Model(format!("{} does not exist", path.display())));
    }
    let weights = match path.extension().and_then(|e| e.to_str()) {
        Some("xml") => path.with_extension("bin").to_string_lossy().into_owned(),
        _ => String::new(),
    };
    let mut model = core
        .read_model_from_file(&path.to_string_lossy(), &weights)
        .map_err(|e| EngineError::Model(format!("OpenVINO cannot read {}: {e}", path.display())))?;
    let inputs: Vec<String> = (0..model.get_inputs_len().map_err(err("inputs"))?)
        .map(|i| model.get_input_by_index(i).and_then(|n| n.get_name()).map_err(err("input name")))
        .collect::<Result<_, _>>()?;
    for name in &inputs {
        if !matches!(name.as_str(), "input_ids" | "attention_mask" | "token_type_ids") {
            return Err(EngineError::Model(format!("unexpected input {name:?}: eeane feeds input_ids, attention_mask, token_type_ids")));
        }
    }
    let output = match &spec.output {
        Some(name) => name.clone(),
        None => model.get_output_by_index(0).and_then(|n| n.get_name()).map_err(err("output name"))?,
    };
    if spec.shapes.is_empty() {
        return Err(EngineError::Model("OpenVINO compiles bounded shapes per bucket: the model needs at least one bucket".into()));
    }

    let started = Instant::now();
    let mut compiled = Vec::with_capacity(spec.shapes.len());
    for &(batch, seq) in &spec.shapes {
        // Bounded dynamic shapes: a batch runs at its own rows and length, up
        // to the bucket's. Static shapes padded every batch to its bucket's
        // rows and length, and ran at 0.2x of ONNX Runtime on the survey's
        // partly filled buckets (2-core EPYC, 2026-12-02).
        let shape = PartialShape::new(2, &[Dimension::new(1, batch as i64), Dimension::new(1, seq as i64)]).map_err(err("shape"))?;
        let shapes: Vec<(&str, &PartialShape)> = inputs.iter().map(|n| (n.as_str(), &shape)).collect();
        model.reshape(&shapes).map_err(|e| EngineError::Model(format!("reshape to {batch}x{seq}: {e}")))?;
        let mut compiled_model = core
            .compile_model(&model, DeviceType::Other(device.clone().into()))
            .map_err(|e| EngineError::Device(format!("compile {batch}x{seq} on {device}: {e}")))?;
        let request = compiled_model.create_infer_request().map_err(err("infer request"))?;
        compiled.push(Compiled { batch, seq, request });
    }
    tracing::info!(device, shapes = spec.shapes.len(), compile_ms = started.elapsed().as_millis() as u64, "openvino: compiled");
    // The compiled blobs are written: other loads may use the folder now,
    // and the cache keeps to its bound.
    if let (Some(folder), Some(root), Some(limit)) = (&compile_cache, spec.compile_cache.as_deref(), spec.compile_cache_limit) {
        match compile_cache::evict(root, limit, Some(&folder.dir)) {
            Ok(removed) if !removed.is_empty() => {
                let bytes: u64 = removed.iter().map(|e| e.bytes).sum();
                tracing::info!(removed = removed.len(), mib = bytes >> 20, "openvino: compile cache over its bound; least recently used removed");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("openvino: compile cache eviction failed: {e}"),
        }
    }
    drop(compile_cache);
    compiled.sort_by_key(|c| (c.seq, c.batch));

    let info = EngineInfo {
        engine: "openvino".into(),
        device: device.clone(),
        precision: precision.into(),
        shapes: InputShapes::Dynamic,
        takes_token_type_ids: inputs.iter().any(|n| n == "token_type_ids"),
        // AMX multiplies bf16 in tiles of 16 rows: lengths padded to 16 ran
        // 4-7 % faster than unpadded ones on a Xeon with AMX, and new shapes
        // (each compiles its kernels on first use) became 16 times rarer.
        // In f32, padding only cost (-5 %).
        seq_multiple: if precision == "bf16" { 16 } else { 1 },
        call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
        row_counts: Vec::new(),
        accelerated_layers: None,
        runtime_version: Some(version),
    };
    Ok(Box::new(OpenVinoEngine { info, compiled, output, inputs, _core: core }))
}

fn tensor(values: &[i64], batch: usize, seq: usize) -> Result<Tensor, EngineError> {
    let shape = Shape::new(&[batch as i64, seq as i64]).map_err(|e| EngineError::Inference(e.to_string()))?;
    let mut t = Tensor::new(ElementType::I64, &shape).map_err(|e| EngineError::Inference(e.to_string()))?;
    t.get_data_mut::<i64>().map_err(|e| EngineError::Inference(e.to_string()))?.copy_from_slice(values);
    Ok(t)
}

impl Engine for OpenVinoEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn run(&mut self, batch: &TokenBatch) -> Result<EngineOutput, EngineError> {
        let target = self
            .compiled
            .iter_mut()
            .find(|c| c.seq >= batch.seq && c.batch >= batch.batch)
            .ok_or_else(|| EngineError::Input(format!("no compiled shape holds {} x {}", batch.batch, batch.seq)))?;
        let (rows, seq) = (batch.batch, batch.seq);
        let zeros = vec![0; if batch.token_type_ids.is_none() { rows * seq } else { 0 }];
        for name in &self.inputs {
            let values: &[i64] = match name.as_str() {
                "input_ids" => &batch.input_ids,
                "attention_mask" => &batch.attention_mask,
                _ => match batch.token_type_ids.as_deref() {
                    Some(types) => types,
                    None => &zeros,
                },
            };
            target.request.set_tensor(name, &tensor(values, rows, seq)?).map_err(|e| EngineError::Inference(format!("{name}: {e}")))?;
        }
        target.request.infer().map_err(|e| EngineError::Inference(e.to_string()))?;
        let out = target.request.get_tensor(&self.output).map_err(|e| EngineError::Inference(format!("output {}: {e}", self.output)))?;
        let dims: Vec<usize> = out.get_shape().map_err(|e| EngineError::Inference(e.to_string()))?.get_dimensions().iter().map(|&d| d as usize).collect();
        let data = out.get_data::<f32>().map_err(|e| EngineError::Inference(e.to_string()))?;
        match dims[..] {
            [b, d] if b == rows => Ok(EngineOutput::Pooled { data: data[..batch.batch * d].to_vec(), batch: batch.batch, dim: d }),
            [b, s, d] if b == rows && s == seq => Ok(EngineOutput::Hidden { data: data[..batch.batch * s * d].to_vec(), batch: batch.batch, seq: s, dim: d }),
            _ => Err(EngineError::Model(format!("output {} has shape {dims:?}; expected [batch, dim] or [batch, seq, dim]", self.output))),
        }
    }
}
