//! ncnn engine: CPU or a Vulkan device pinned by name. ncnn itself is built
//! from its PyPI sdist by models/build_ncnn.sh, together with eeane's C++ shim
//! (`shim/eeane_ncnn.cpp`), which this crate opens at run time: the build
//! needs no ncnn, and a missing one fails only the models that use it.
//!
//! Three traps of ncnn on old GPUs, all handled in the shim's load order:
//! fp16 storage, packing and arithmetic are off unless a model asks (fp16
//! rounds Q and K before the attention scores accumulate: cosine 0.16), the
//! Vulkan device is attached before `load_param` (after it, layers silently
//! stay on the CPU), and every sequence runs at its own length (padding
//! corrupts GPU results).

use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use eeane_backend_core::{
    every_device, lasting_pin, Backend, Device, DeviceName, Devices, Engine, EngineError, EngineInfo, EngineOutput, EngineSpec, HubPreparation, InputShapes,
    InvalidOptions, Isolation, ListedDevice, Options, PathResolver, TokenBatch, VisibleDevices, EVERY,
};

type GpuCount = unsafe extern "C" fn() -> c_int;
type GpuInfo = unsafe extern "C" fn(c_int, *mut c_char, c_int) -> c_int;
type GpuRelease = unsafe extern "C" fn();
type GpuUuid = unsafe extern "C" fn(c_int, *mut c_char, c_int) -> c_int;
type NetLoad = unsafe extern "C" fn(c_int, c_int, c_int, *const c_char, *const c_char) -> *mut c_void;
type VulkanLayers = unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int;
type Run = unsafe extern "C" fn(*mut c_void, *const c_int, *const c_int, c_int, *mut f32, c_long) -> c_int;
type Trim = unsafe extern "C" fn(*mut c_void);
type NetFree = unsafe extern "C" fn(*mut c_void);

struct Shim {
    gpu_count: GpuCount,
    gpu_info: GpuInfo,
    gpu_release: GpuRelease,
    /// Absent from a shim built before it (the device then has no UUID).
    gpu_uuid: Option<GpuUuid>,
    net_load: NetLoad,
    vulkan_layers: VulkanLayers,
    run: Run,
    trim: Trim,
    net_free: NetFree,
    // Kept last: the function pointers above point into it.
    _library: libloading::Library,
}

static SHIM: OnceLock<Result<Arc<Shim>, EngineError>> = OnceLock::new();
/// Nets alive on a Vulkan device; when the last goes, the GPU instance goes too.
static GPU_NETS: AtomicUsize = AtomicUsize::new(0);
/// Held while the GPU instance may be created or destroyed (device listing,
/// net load, net free), so that a release never races a load.
static GPU_LOCK: Mutex<()> = Mutex::new(());
/// The Vulkan devices seen when the shim was first opened, for /health.
static DEVICES: OnceLock<Vec<VulkanDevice>> = OnceLock::new();

/// A Vulkan device as ncnn lists it.
#[derive(Debug, Clone)]
struct VulkanDevice {
    name: String,
    kind: &'static str,
    /// Its deviceUUID, which tells identical cards apart.
    uuid: Option<String>,
}

impl VulkanDevice {
    fn listed(&self) -> ListedDevice {
        ListedDevice { name: self.name.clone(), uuid: self.uuid.clone(), bus_id: None }
    }
}

/// Bumped each time the last Vulkan net goes; a delayed release acts only if
/// no net came and went since it was scheduled.
static GPU_IDLE_GENERATION: AtomicUsize = AtomicUsize::new(0);
/// How long the GPU instance outlives the last Vulkan net. Creating and
/// destroying it on every load made NVIDIA's driver refuse a new instance
/// (vkCreateInstance -9) after about 30 cycles of a keep_alive = 0 churn on
/// the H200, and ncnn then crashed; a model reloaded within this time reuses
/// the instance, and an idle server still gives the driver's memory back.
const GPU_IDLE_RELEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// Releases the GPU instance once no Vulkan net has existed for GPU_IDLE_RELEASE.
fn release_gpu_when_idle(shim: Arc<Shim>) {
    let generation = GPU_IDLE_GENERATION.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = std::thread::Builder::new().name("ncnn-gpu-release".into()).spawn(move || {
        std::thread::sleep(GPU_IDLE_RELEASE);
        let _guard = GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if GPU_IDLE_GENERATION.load(Ordering::SeqCst) == generation {
            release_gpu_if_unused(&shim);
        }
    });
}

/// Before the process exits: releases the GPU instance now if no net holds it
/// (a delayed release may still be waiting). ncnn's static destructors must
/// not be the ones to tear it down: on the H200 that crashed at exit.
fn release_gpu_at_exit() {
    let Some(Ok(shim)) = SHIM.get() else { return };
    let _guard = GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    GPU_IDLE_GENERATION.fetch_add(1, Ordering::SeqCst);
    release_gpu_if_unused(shim);
}

/// Destroys the GPU instance when no net uses it (listing devices creates it).
/// Call with GPU_LOCK held.
fn release_gpu_if_unused(shim: &Shim) {
    if GPU_NETS.load(Ordering::SeqCst) == 0 {
        // SAFETY: no net is alive on any Vulkan device.
        unsafe { (shim.gpu_release)() };
    }
}

fn shim(path: &Path) -> Result<Arc<Shim>, EngineError> {
    let fail = |message: String| EngineError::Runtime(message);
    SHIM.get_or_init(|| {
        if !path.exists() {
            return Err(fail(format!("ncnn shim {} not found (run models/build_ncnn.sh, or set runtimes.ncnn)", path.display())));
        }
        // SAFETY: the shim is eeane's own library with the signatures above.
        unsafe {
            let library = libloading::Library::new(path).map_err(|e| fail(format!("cannot open {}: {e}", path.display())))?;
            macro_rules! sym {
                ($name:literal) => {
                    *library.get($name).map_err(|e| fail(format!("{}: {e}", path.display())))?
                };
            }
            Ok(Arc::new(Shim {
                gpu_count: sym!(b"eeane_ncnn_gpu_count"),
                gpu_info: sym!(b"eeane_ncnn_gpu_info"),
                gpu_release: sym!(b"eeane_ncnn_gpu_release"),
                gpu_uuid: library.get::<GpuUuid>(b"eeane_ncnn_gpu_uuid").ok().map(|s| *s),
                net_load: sym!(b"eeane_ncnn_net_load"),
                vulkan_layers: sym!(b"eeane_ncnn_vulkan_layers"),
                run: sym!(b"eeane_ncnn_run"),
                trim: sym!(b"eeane_ncnn_trim"),
                net_free: sym!(b"eeane_ncnn_net_free"),
                _library: library,
            }))
        }
    })
    .clone()
}

/// The ncnn engine, as eeane registers it.
pub struct Ncnn;

/// The precision ncnn computes in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    #[serde(alias = "f32")]
    Fp32,
    /// fp16 storage, packing and arithmetic: off by default, because fp16
    /// Q·K overflows in attention on old GPUs.
    #[serde(alias = "f16")]
    Fp16,
}

/// A model entry's keys for this engine.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcnnOptions {
    #[serde(default)]
    pub precision: Precision,
    /// Most tokens of sequences packed side by side into one run; unset takes
    /// 512 on Vulkan and 128 on the CPU, 1 runs each sequence alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack_tokens: Option<usize>,
}

impl Backend for Ncnn {
    fn name(&self) -> &'static str {
        "ncnn"
    }

    fn hub_preparation(&self) -> Option<HubPreparation> {
        Some(HubPreparation {
            model_file: "model.ncnn.param",
            folder_suffix: "--ncnn",
            converter_flag: Some("--ncnn"),
            // ncnn's runtime and Python module, for the conversion's check, are built on first need.
            setup_extra: Some("ncnn"),
            // Converted from the graph built from model.safetensors.
            reads_repository_onnx: false,
            serves_rerankers: false,
            device_graphs: &[],
        })
    }

    fn configured_precision(&self, options: &Options) -> Option<String> {
        let precision = options.typed::<NcnnOptions>().ok()?.precision;
        serde_json::to_value(precision).ok()?.as_str().map(str::to_string)
    }

    fn default_runtime(&self) -> Option<&'static str> {
        Some("{cache}/runtimes/ncnn/libeeane_ncnn.so")
    }

    fn open(&self, library: Option<&Path>) -> Result<String, EngineError> {
        open(library.ok_or_else(no_library)?)
    }

    fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        load(spec)
    }

    fn options(&self, entry: &serde_json::Map<String, serde_json::Value>, _paths: PathResolver) -> Result<Options, InvalidOptions> {
        Options::check(entry, |options: &mut NcnnOptions| match options.pack_tokens {
            Some(0) => Err(InvalidOptions("pack_tokens must be at least 1 (1 runs each sequence alone)".into())),
            _ => Ok(()),
        })
    }

    /// A model on a Vulkan GPU runs on a thread of the server, because engines
    /// in separate processes each create their own Vulkan instance and device,
    /// and the GPU time-slices between processes instead of running their work
    /// side by side (docs/engines/ncnn.md has the measurement); elsewhere, a process.
    fn default_isolation(&self, devices: &Devices) -> Isolation {
        if devices.any_starts_with("vulkan") {
            Isolation::Thread
        } else {
            Isolation::Process
        }
    }

    fn expand_devices(&self, devices: &Devices, library: Option<&Path>, forbidden: &[String]) -> Result<Devices, EngineError> {
        match library {
            Some(path) => expand(path, devices, forbidden),
            None if devices.iter().any(|d| d.as_str().ends_with(EVERY)) => Err(no_library()),
            None => Ok(devices.clone()),
        }
    }

    fn visible_devices(&self) -> Option<VisibleDevices> {
        let devices = DEVICES.get()?.iter().map(|d| Device { name: d.name.clone(), kind: d.kind.to_string(), uuid: d.uuid.clone(), bus_id: None }).collect();
        Some(VisibleDevices { api: "vulkan", devices })
    }

    fn at_exit(&self) {
        release_gpu_at_exit();
    }
}

fn no_library() -> EngineError {
    EngineError::Runtime("no ncnn shim configured".into())
}

/// Opens the shim (and ncnn), and lists the Vulkan devices once for /health;
/// a missing shim shows at start-up.
fn open(path: &Path) -> Result<String, EngineError> {
    let shim = shim(path)?;
    if DEVICES.get().is_none() {
        let _guard = GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let devices = vulkan_devices(path)?;
        release_gpu_if_unused(&shim);
        let _ = DEVICES.set(devices);
    }
    Ok("ncnn".to_string())
}

/// The Vulkan devices ncnn sees. Creates the GPU instance.
fn vulkan_devices(path: &Path) -> Result<Vec<VulkanDevice>, EngineError> {
    let shim = shim(path)?;
    // SAFETY: plain calls into the shim.
    let count = unsafe { (shim.gpu_count)() };
    Ok((0..count)
        .map(|i| {
            let mut buf = [0 as c_char; 256];
            // SAFETY: buf is writable for its whole length, which the shim is told,
            // and the shim writes at most that many bytes, NUL included.
            let kind = unsafe { (shim.gpu_info)(i, buf.as_mut_ptr(), buf.len() as c_int) };
            // SAFETY: the shim NUL-terminates within buf (and buf starts zeroed).
            let name = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
            let kind = match kind {
                0 => "discrete",
                1 => "integrated",
                2 => "virtual",
                3 => "cpu",
                _ => "unknown",
            };
            let uuid = shim.gpu_uuid.and_then(|gpu_uuid| {
                let mut buf = [0 as c_char; 64];
                // SAFETY: as above; the shim writes at most buf's length, NUL included.
                let found = unsafe { gpu_uuid(i, buf.as_mut_ptr(), buf.len() as c_int) } == 0;
                // SAFETY: NUL-terminated within buf when found.
                found.then(|| unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
            });
            VulkanDevice { name, kind, uuid }
        })
        .collect())
}

/// `"cpu"` is the CPU; `"vulkan:<name or unique substring>"` a Vulkan device,
/// never an index (indices move when cards are added; the desktop's card must
/// not be taken by accident). `forbidden` names are refused whatever the model asks.
fn resolve_device(path: &Path, device: &DeviceName, forbidden: &[String]) -> Result<Option<(i32, String)>, EngineError> {
    if device.is_cpu() {
        return Ok(None);
    }
    let Some(wanted) = device.as_str().strip_prefix("vulkan:") else {
        return Err(EngineError::Device(format!("device {device:?}: use \"cpu\" or \"vulkan:<device name>\"")));
    };
    let visible = vulkan_devices(path)?;
    let listed: Vec<ListedDevice> = visible.iter().map(VulkanDevice::listed).collect();
    let index = eeane_backend_core::pick_device("Vulkan", wanted, &listed, forbidden)?;
    Ok(Some((index as i32, visible[index].name.clone())))
}

/// `devices` with each `vulkan:<name>*` replaced by one `vulkan:<deviceUUID>`
/// per device whose name holds `<name>`, forbidden ones left out.
fn expand(path: &Path, devices: &Devices, forbidden: &[String]) -> Result<Devices, EngineError> {
    if !devices.iter().any(|d| d.as_str().starts_with("vulkan:") && d.as_str().ends_with(EVERY)) {
        return Ok(devices.clone());
    }
    open(path)?;
    let listed: Vec<ListedDevice> = DEVICES.get().into_iter().flatten().map(VulkanDevice::listed).collect();
    let mut names = Vec::new();
    for device in devices {
        match device.as_str().strip_prefix("vulkan:") {
            Some(pattern) if pattern.ends_with(EVERY) => {
                for index in every_device("Vulkan", pattern, &listed, forbidden)? {
                    names.push(format!("vulkan:{}", lasting_pin(&listed[index])));
                }
            }
            _ => names.push(device.to_string()),
        }
    }
    Devices::new(names).map_err(|e| EngineError::Device(e.to_string()))
}

pub struct NcnnEngine {
    shim: Arc<Shim>,
    net: *mut c_void,
    on_gpu: bool,
    info: EngineInfo,
    /// Sequences are packed side by side into runs of at most this many tokens.
    pack_tokens: usize,
    /// Reused buffers: packed ids, segment lengths, token states (tokens x dim).
    ids: Vec<c_int>,
    segments: Vec<c_int>,
    states: Vec<f32>,
}

/// Tokens per packed run when the model does not say: on a GPU one dispatch
/// per layer for many sequences is what makes it fast; on a CPU the packed
/// run's attention grows with the square of its length, so less is packed.
const PACK_TOKENS_GPU: usize = 512;
const PACK_TOKENS_CPU: usize = 128;

// SAFETY: the net is used by one thread at a time (the engine's own); the shim
// also serialises calls on a net.
unsafe impl Send for NcnnEngine {}

/// Loads one net on the CPU or the Vulkan device `spec.device` names, never
/// one of `spec.forbidden_devices`.
fn load(spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
    let options: NcnnOptions = spec.options.typed()?;
    let library = spec.runtime_library.as_deref().ok_or_else(no_library)?;
    let shim = shim(library)?;
    let _guard = GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let device = resolve_device(library, &spec.device, &spec.forbidden_devices).inspect_err(|_| release_gpu_if_unused(&shim))?;
    let fp16 = options.precision == Precision::Fp16;
    let param = spec.model_path.clone();
    let bin = param.with_extension("bin");
    if !param.is_file() || !bin.is_file() {
        release_gpu_if_unused(&shim);
        return Err(EngineError::Model(format!("{} and {} must both exist", param.display(), bin.display())));
    }
    let (param_c, bin_c) = (
        CString::new(param.to_string_lossy().as_bytes()).map_err(|e| EngineError::Model(e.to_string()))?,
        CString::new(bin.to_string_lossy().as_bytes()).map_err(|e| EngineError::Model(e.to_string()))?,
    );
    let gpu = device.as_ref().map_or(-1, |(i, _)| *i);
    // SAFETY: valid C strings; the shim returns null on failure.
    let net = unsafe { (shim.net_load)(gpu, fp16 as c_int, spec.threads as c_int, param_c.as_ptr(), bin_c.as_ptr()) };
    if net.is_null() {
        release_gpu_if_unused(&shim);
        return Err(EngineError::Model(format!("ncnn cannot load {} / {}", param.display(), bin.display())));
    }
    if gpu >= 0 {
        GPU_NETS.fetch_add(1, Ordering::SeqCst);
    }
    let mut total = 0;
    // SAFETY: net is live.
    let on_vulkan = unsafe { (shim.vulkan_layers)(net, &mut total) };
    let info = EngineInfo {
        engine: "ncnn".into(),
        device: device.as_ref().map_or("cpu".into(), |(_, name)| format!("vulkan:{name}")),
        precision: if fp16 { "fp16".into() } else { "fp32".into() },
        shapes: InputShapes::NaturalLengths,
        takes_token_type_ids: false,
        seq_multiple: 1,
        call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
        row_counts: Vec::new(),
        accelerated_layers: Some((on_vulkan.max(0) as usize, total.max(0) as usize)),
        runtime_version: Some("ncnn 1.0.20261020".into()),
    };
    let pack_tokens = match options.pack_tokens {
        Some(n) => n,
        None if gpu >= 0 => PACK_TOKENS_GPU,
        None => PACK_TOKENS_CPU,
    };
    tracing::info!(device = %info.device, vulkan_layers = on_vulkan, layers = total, pack_tokens, "ncnn: loaded");
    Ok(Box::new(NcnnEngine { shim, net, on_gpu: gpu >= 0, info, pack_tokens, ids: Vec::new(), segments: Vec::new(), states: Vec::new() }))
}

impl Engine for NcnnEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Every row at its own length, never padded: consecutive rows are packed
    /// side by side into runs of at most `pack_tokens` tokens (a longer row
    /// runs alone), each row attending only to itself. The states are laid into
    /// a padded `[batch, seq, dim]` block whose padding stays zero (pooling
    /// reads only each row's first `length` rows).
    fn run(&mut self, batch: &TokenBatch) -> Result<EngineOutput, EngineError> {
        let mut out: Vec<f32> = Vec::new();
        let mut dim = 0usize;
        let mut first = 0;
        while first < batch.batch {
            // Rows first..end form one packed run.
            let (mut end, mut tokens) = (first + 1, batch.lengths[first]);
            while end < batch.batch && tokens + batch.lengths[end] <= self.pack_tokens {
                tokens += batch.lengths[end];
                end += 1;
            }
            self.ids.clear();
            self.segments.clear();
            for r in first..end {
                let len = batch.lengths[r];
                self.ids.extend(batch.input_ids[r * batch.seq..r * batch.seq + len].iter().map(|&i| i as c_int));
                self.segments.push(len as c_int);
            }
            let cap = tokens * 4096;
            self.states.resize(cap, 0.0);
            // SAFETY: ids holds `tokens` ids, segments `end - first` lengths summing
            // to it, and states `cap` floats.
            let d = unsafe {
                (self.shim.run)(self.net, self.ids.as_ptr(), self.segments.as_ptr(), self.segments.len() as c_int, self.states.as_mut_ptr(), cap as c_long)
            };
            if d <= 0 {
                return Err(EngineError::Inference(format!("ncnn failed on {} sequence(s) of {tokens} tokens (code {d})", end - first)));
            }
            let d = d as usize;
            if out.is_empty() {
                dim = d;
                out = vec![0.0; batch.batch * batch.seq * dim];
            }
            let mut at = 0;
            for r in first..end {
                let len = batch.lengths[r];
                let row = r * batch.seq * dim;
                out[row..row + len * dim].copy_from_slice(&self.states[at * dim..(at + len) * dim]);
                at += len;
            }
            // A run longer than the packing budget (one long sequence) leaves
            // buffers of its size in the allocators: give them back, so that one
            // long request does not hold memory for the life of the model.
            if tokens > self.pack_tokens {
                // SAFETY: the net is live and no run is in flight on it.
                unsafe { (self.shim.trim)(self.net) };
                self.states = Vec::new();
            }
            first = end;
        }
        Ok(EngineOutput::Hidden { data: out, batch: batch.batch, seq: batch.seq, dim })
    }
}

impl Drop for NcnnEngine {
    fn drop(&mut self) {
        let _guard = GPU_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the net is live and dropped once.
        unsafe { (self.shim.net_free)(self.net) };
        // The last Vulkan net takes the GPU instance with it, so the driver's
        // memory goes back (otherwise it stays held for the process's life), once
        // no net has come for GPU_IDLE_RELEASE.
        if self.on_gpu && GPU_NETS.fetch_sub(1, Ordering::SeqCst) == 1 {
            release_gpu_when_idle(self.shim.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vulkan_models_run_in_the_server_and_cpu_models_in_a_process() {
        let on = |names: &[&str]| Devices::new(names.iter().copied()).unwrap();
        assert_eq!(Ncnn.default_isolation(&on(&["vulkan:H200"])), Isolation::Thread);
        assert_eq!(Ncnn.default_isolation(&on(&["vulkan:H200", "vulkan:H200"])), Isolation::Thread);
        assert_eq!(Ncnn.default_isolation(&on(&["cpu"])), Isolation::Process);
    }
}
