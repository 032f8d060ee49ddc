//! The CUDA side of the ONNX Runtime engine: GPUs pinned by name through
//! NVML, the CUDA and cuDNN libraries found and loaded before ONNX Runtime's
//! CUDA provider needs them, and what a machine lacks, said in one message
//! that `check-config` and a model's load share.
//!
//! The CUDA provider ships in the `onnxruntime-gpu` wheel, a different build
//! of the runtime library than the CPU wheel's; a process holds one, so a
//! CUDA model runs in an engine process of its own (process isolation).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use eeane_backend_core::{every_device, lasting_pin, DeviceGraph, DeviceName, Devices, EngineError, ListedDevice, EVERY};

/// The `[runtimes]` key of the CUDA build, and where `INSTALL` puts it.
pub const RUNTIME_KEY: &str = "onnxruntime-cuda";
pub const DEFAULT_RUNTIME: &str = "{cache}/runtimes/onnxruntime-gpu/libonnxruntime.so";

/// How a user installs the CUDA build, with CUDA and cuDNN from PyPI.
const INSTALL: &str = "`eeane pull all-minilm-l6-v2-cuda`, or `EEANE_EXTRA_MODELS=onnxruntime-gpu bash models/setup.sh` for the runtime alone";

/// The provider library that the CUDA build loads from beside itself.
const PROVIDER: &str = "libonnxruntime_providers_cuda.so";

/// cuBLASLt: the CUDA provider's matmuls, and eeane's own operator's (cuda_ops.rs).
const CUBLAS_LT: &str = "libcublasLt.so.13";

/// The CUDA runtime: the provider's, and the copies around a CUDA graph's replay (cuda_graphs.rs).
const CUDART: &str = "libcudart.so.13";

/// What the CUDA provider links against or loads, dependencies first (a
/// library loaded here by path satisfies a later lookup of its soname).
const CUDA_LIBRARIES: &[&str] = &[CUDART, CUBLAS_LT, "libcublas.so.13", "libcurand.so.10", "libcufft.so.12"];
const CUDNN_LIBRARIES: &[&str] = &[
    "libcudnn.so.9",
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
];

/// How a device names a CUDA GPU: `cuda:<GPU name>`.
pub const PREFIX: &str = "cuda:";

/// The GPU's graph of a Hub model, made by `eeane pull` for an entry on a
/// CUDA device (models/gpu_graph.py): model.fp16.onnx beside model.onnx.
pub const FP16_GRAPH: DeviceGraph = DeviceGraph { device_prefix: PREFIX, prepare_flag: "--cuda-fp16", manifest_check: "cuda_fp16" };

/// The device names a CUDA GPU.
pub fn is_cuda(device: &DeviceName) -> bool {
    device.as_str().starts_with(PREFIX)
}

/// A GPU as NVML sees it.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub name: String,
    /// NVML's "GPU-8a1f...": names the card for good.
    pub uuid: String,
    /// "00000000:18:00.0": what ties NVML's GPU to CUDA's device ordinal.
    pub pci_bus_id: String,
    pub memory_total: u64,
    pub memory_used: u64,
}

type NvmlReturn = c_int;

#[repr(C)]
struct NvmlPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[repr(C)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// NVML, opened once per process (libnvidia-ml.so.1 comes with the driver).
struct Nvml {
    _library: libloading::Library,
    count: unsafe extern "C" fn(*mut c_uint) -> NvmlReturn,
    handle: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> NvmlReturn,
    name: unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> NvmlReturn,
    pci: unsafe extern "C" fn(*mut c_void, *mut NvmlPciInfo) -> NvmlReturn,
    memory: unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> NvmlReturn,
    uuid: unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> NvmlReturn,
}

static NVML: OnceLock<Result<Nvml, EngineError>> = OnceLock::new();

fn nvml() -> Result<&'static Nvml, EngineError> {
    NVML.get_or_init(open_nvml).as_ref().map_err(Clone::clone)
}

/// A function of `library` by name, as the C signature `T`.
///
/// # Safety
/// `T` must be the symbol's true signature.
unsafe fn function<T: Copy>(library: &libloading::Library, name: &[u8]) -> Result<T, EngineError> {
    library.get::<T>(name).map(|s| *s).map_err(|e| EngineError::Device(format!("NVML lacks {}: {e}", String::from_utf8_lossy(&name[..name.len() - 1]))))
}

/// NVML's failures are the GPU's: `EngineError::Device`, whose words
/// `problem` lists as they are.
fn open_nvml() -> Result<Nvml, EngineError> {
    // SAFETY: NVML's documented entry points with their C signatures; the
    // library stays loaded for the process's life.
    unsafe {
        let library = libloading::Library::new("libnvidia-ml.so.1").map_err(|e| {
            EngineError::Device(format!(
                "NVML (libnvidia-ml.so.1, part of the NVIDIA driver) cannot be opened: {e}; install the NVIDIA driver, or use device = \"cpu\""
            ))
        })?;
        let init: unsafe extern "C" fn() -> NvmlReturn = function(&library, b"nvmlInit_v2\0")?;
        let code = init();
        if code != 0 {
            return Err(EngineError::Device(format!("NVML cannot start (nvmlInit_v2 returned {code}): the NVIDIA driver is not loaded or sees no GPU")));
        }
        Ok(Nvml {
            count: function(&library, b"nvmlDeviceGetCount_v2\0")?,
            handle: function(&library, b"nvmlDeviceGetHandleByIndex_v2\0")?,
            name: function(&library, b"nvmlDeviceGetName\0")?,
            pci: function(&library, b"nvmlDeviceGetPciInfo_v3\0")?,
            memory: function(&library, b"nvmlDeviceGetMemoryInfo\0")?,
            uuid: function(&library, b"nvmlDeviceGetUUID\0")?,
            _library: library,
        })
    }
}

/// The GPUs NVML lists, if this process opened NVML already (a CUDA model
/// was checked or loaded here); never opens it.
pub fn gpus_if_open() -> Option<Vec<Gpu>> {
    NVML.get().is_some_and(Result::is_ok).then(gpus).and_then(Result::ok).filter(|g| !g.is_empty())
}

/// The GPUs NVML lists, in its order.
pub fn gpus() -> Result<Vec<Gpu>, EngineError> {
    let nvml = nvml()?;
    let mut count: c_uint = 0;
    // SAFETY: NVML calls with buffers of the sizes NVML documents.
    unsafe {
        let code = (nvml.count)(&mut count);
        if code != 0 {
            return Err(EngineError::Device(format!("NVML cannot count the GPUs (error {code})")));
        }
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut handle = std::ptr::null_mut();
            if (nvml.handle)(index, &mut handle) != 0 {
                continue;
            }
            let mut name = [0 as c_char; 96];
            (nvml.name)(handle, name.as_mut_ptr(), name.len() as c_uint);
            let mut pci: NvmlPciInfo = std::mem::zeroed();
            (nvml.pci)(handle, &mut pci);
            let mut memory = NvmlMemory { total: 0, free: 0, used: 0 };
            (nvml.memory)(handle, &mut memory);
            // NVML_DEVICE_UUID_V2_BUFFER_SIZE is 96.
            let mut uuid = [0 as c_char; 96];
            (nvml.uuid)(handle, uuid.as_mut_ptr(), uuid.len() as c_uint);
            gpus.push(Gpu {
                name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                uuid: CStr::from_ptr(uuid.as_ptr()).to_string_lossy().into_owned(),
                pci_bus_id: CStr::from_ptr(pci.bus_id.as_ptr()).to_string_lossy().into_owned(),
                memory_total: memory.total,
                memory_used: memory.used,
            });
        }
        Ok(gpus)
    }
}

/// The GPUs as the device pins read them: name, UUID, PCI bus id.
fn listed(gpus: &[Gpu]) -> Vec<ListedDevice> {
    gpus.iter().map(|g| ListedDevice::identified(&g.name, &g.uuid, &g.pci_bus_id)).collect()
}

/// What follows `cuda:` in a device.
fn pin_of(device: &DeviceName) -> Result<&str, EngineError> {
    device
        .as_str()
        .strip_prefix(PREFIX)
        .ok_or_else(|| EngineError::Device(format!("device {device:?}: use \"cpu\" or \"cuda:<GPU name, UUID or PCI bus id>\"")))
}

/// The GPU that `cuda:<pin>` names: a unique part of its name, its UUID (or
/// a unique prefix) or its PCI bus id.
pub fn pick(device: &DeviceName, forbidden: &[String]) -> Result<Gpu, EngineError> {
    let wanted = pin_of(device)?;
    eeane_backend_core::refuse_index("CUDA", wanted)?;
    let gpus = gpus()?;
    let index = eeane_backend_core::pick_device("CUDA", wanted, &listed(&gpus), forbidden)?;
    Ok(gpus[index].clone())
}

/// `devices` with each `cuda:<name>*` replaced by one `cuda:<PCI bus id>` per
/// GPU whose name holds `<name>` (those on `forbidden` left out), in NVML's
/// order: one session per card, each pinned for good.
pub fn expand(devices: &Devices, forbidden: &[String]) -> Result<Devices, EngineError> {
    if !devices.iter().any(|d| is_cuda(d) && d.as_str().ends_with(EVERY)) {
        return Ok(devices.clone());
    }
    expand_among(devices, &listed(&gpus()?), forbidden)
}

/// `expand` over the GPUs `visible` lists.
fn expand_among(devices: &Devices, visible: &[ListedDevice], forbidden: &[String]) -> Result<Devices, EngineError> {
    let mut names = Vec::new();
    for device in devices {
        match pin_of(device) {
            Ok(pattern) if pattern.ends_with(EVERY) => {
                for index in every_device("CUDA", pattern, visible, forbidden)? {
                    names.push(format!("{PREFIX}{}", lasting_pin(&visible[index])));
                }
            }
            _ => names.push(device.to_string()),
        }
    }
    Devices::new(names).map_err(|e| EngineError::Device(e.to_string()))
}

/// The directories searched for the CUDA and cuDNN libraries: the nvidia-*
/// wheels that `INSTALL` puts beside the runtime
/// (`site/nvidia/*/lib`), then the system's loader path.
fn library_dirs(runtime: &Path) -> Vec<PathBuf> {
    let Some(home) = runtime.parent() else { return Vec::new() };
    let mut dirs = Vec::new();
    if let Ok(entries) = std::fs::read_dir(home.join("site").join("nvidia")) {
        let mut found: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("lib")).filter(|p| p.is_dir()).collect();
        found.sort();
        dirs.extend(found);
    }
    dirs
}

/// Where a library would come from: a file in `dirs`, else its soname for the system loader.
fn locate(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if let Some(path) = dirs.iter().map(|d| d.join(name)).find(|p| p.exists()) {
        return Some(path);
    }
    // SAFETY: dlopen with RTLD_NOLOAD|RTLD_LAZY only asks; then a lazy open and close to see whether the loader finds it.
    let soname = CString::new(name).ok()?;
    unsafe {
        let handle = libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            return None;
        }
        libc::dlclose(handle);
    }
    Some(PathBuf::from(name))
}

/// What this machine lacks for `devices` with the CUDA runtime at `runtime`,
/// checked without starting CUDA: the driver (libcuda.so.1, NVML), each named
/// GPU, the provider library, and the CUDA and cuDNN libraries.
pub fn problem(devices: &Devices, runtime: Option<&Path>, forbidden: &[String]) -> Option<String> {
    let mut missing = Vec::new();
    // SAFETY: as in `locate`.
    let driver = unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        let found = !handle.is_null();
        if found {
            libc::dlclose(handle);
        }
        found
    };
    if !driver {
        missing.push("the NVIDIA driver (libcuda.so.1 is not on the loader path)".to_string());
    }
    let pinned = match expand(devices, forbidden) {
        Ok(pinned) => pinned,
        Err(e) => {
            missing.push(match e {
                EngineError::Device(m) => m,
                other => other.to_string(),
            });
            devices.clone()
        }
    };
    // The list's CPU entries need nothing of CUDA.
    for device in pinned.iter().filter(|d| is_cuda(d) && !d.as_str().ends_with(EVERY)) {
        if let Err(e) = pick(device, forbidden) {
            let text = match e {
                EngineError::Device(m) => m,
                other => other.to_string(),
            };
            if !missing.contains(&text) {
                missing.push(text);
            }
        }
    }
    match runtime {
        None => missing.push(format!("no ONNX Runtime CUDA build configured ([runtimes] {RUNTIME_KEY})")),
        Some(runtime) if !runtime.exists() => {
            missing.push(format!("the ONNX Runtime CUDA build {} (install it: {INSTALL}; or set [runtimes] {RUNTIME_KEY})", runtime.display()))
        }
        Some(runtime) => {
            let real = std::fs::canonicalize(runtime).unwrap_or_else(|_| runtime.to_path_buf());
            let provider = real.with_file_name(PROVIDER);
            if !provider.exists() {
                missing.push(format!("the CUDA provider library {} (the onnxruntime-gpu wheel's; install it: {INSTALL})", provider.display()));
            }
            let dirs = library_dirs(runtime);
            let absent: Vec<&str> = CUDA_LIBRARIES.iter().chain(CUDNN_LIBRARIES).copied().filter(|n| locate(n, &dirs).is_none()).collect();
            if !absent.is_empty() {
                missing.push(format!(
                    "CUDA 13 / cuDNN 9 libraries {} (looked in {}{}the loader path; {INSTALL} installs them from the nvidia-* wheels)",
                    absent.join(", "),
                    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                    if dirs.is_empty() { "" } else { ", then " }
                ));
            }
        }
    }
    (!missing.is_empty()).then(|| format!("CUDA device {devices:?} cannot be used on this machine; missing: {}", missing.join("; ")))
}

/// Loads the CUDA and cuDNN libraries globally, from the wheels beside the
/// runtime first, so that ONNX Runtime's CUDA provider finds them whatever
/// LD_LIBRARY_PATH says. Once per process.
pub fn preload(runtime: &Path) -> Result<(), EngineError> {
    static LOADED: OnceLock<Result<(), EngineError>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dirs = library_dirs(runtime);
            for name in CUDA_LIBRARIES.iter().chain(CUDNN_LIBRARIES) {
                let path = locate(name, &dirs).ok_or_else(|| EngineError::Runtime(format!("{name} not found")))?;
                let text = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| EngineError::Runtime(e.to_string()))?;
                // SAFETY: loading a shared library; it stays loaded for the process's life.
                let handle = unsafe { libc::dlopen(text.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
                if handle.is_null() {
                    // SAFETY: dlerror returns the last error as a C string, or null.
                    let why = unsafe { libc::dlerror() };
                    let why = if why.is_null() { "unknown".into() } else { unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned() };
                    return Err(EngineError::Runtime(format!("cannot load {}: {why}", path.display())));
                }
            }
            Ok(())
        })
        .clone()
}

/// libcublasLt's path, the one `preload` loads for the CUDA provider.
pub fn cublas_lt(runtime: &Path) -> Result<PathBuf, EngineError> {
    locate(CUBLAS_LT, &library_dirs(runtime)).ok_or_else(|| EngineError::Runtime(format!("{CUBLAS_LT} not found")))
}

/// Opens a CUDA library by path into a struct of its entry points: each
/// field a C function pointer read by its symbol's name, and `_library`,
/// which keeps the library loaded while the struct lives. An expression of
/// type `Result<Struct, EngineError>`; the caller vouches, in a SAFETY
/// comment, that each field's type is its symbol's C signature.
macro_rules! entry_points {
    ($path:expr, $what:literal, $struct:ident { $($field:ident: $symbol:literal),* $(,)? }) => {{
        let path: &std::path::Path = $path;
        let fail = |m: String| eeane_backend_core::EngineError::Runtime(format!("{} ({}): {m}", $what, path.display()));
        (|| {
            let library = libloading::Library::new(path).map_err(|e| fail(e.to_string()))?;
            Ok($struct { $($field: *library.get(concat!($symbol, "\0").as_bytes()).map_err(|e| fail(e.to_string()))?,)* _library: library })
        })()
    }};
}
pub(crate) use entry_points;

/// libcudart's path, the one `preload` loads for the CUDA provider.
pub fn cudart(runtime: &Path) -> Result<PathBuf, EngineError> {
    locate(CUDART, &library_dirs(runtime)).ok_or_else(|| EngineError::Runtime(format!("{CUDART} not found")))
}

/// CUDA's device ordinal for an NVML GPU, matched by PCI bus id through the
/// driver API, so that CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES cannot make
/// a name pin one card and CUDA use another.
pub fn ordinal(gpu: &Gpu) -> Result<i32, EngineError> {
    let fail = |m: String| EngineError::Device(m);
    // SAFETY: the CUDA driver API's documented entry points; the library stays loaded.
    unsafe {
        let library = libloading::Library::new("libcuda.so.1").map_err(|e| fail(format!("the NVIDIA driver (libcuda.so.1) cannot be opened: {e}")))?;
        let init: libloading::Symbol<unsafe extern "C" fn(c_uint) -> c_int> = library.get(b"cuInit\0").map_err(|e| fail(e.to_string()))?;
        let by_bus: libloading::Symbol<unsafe extern "C" fn(*mut c_int, *const c_char) -> c_int> =
            library.get(b"cuDeviceGetByPCIBusId\0").map_err(|e| fail(e.to_string()))?;
        let code = init(0);
        if code != 0 {
            return Err(fail(format!("CUDA cannot start (cuInit returned {code})")));
        }
        let bus = CString::new(gpu.pci_bus_id.as_str()).map_err(|e| fail(e.to_string()))?;
        let mut ordinal: c_int = -1;
        let code = by_bus(&mut ordinal, bus.as_ptr());
        std::mem::forget(library);
        if code != 0 {
            return Err(fail(format!(
                "GPU {:?} (PCI {}) is not visible to CUDA in this process (cuDeviceGetByPCIBusId returned {code}; is CUDA_VISIBLE_DEVICES hiding it?)",
                gpu.name, gpu.pci_bus_id
            )));
        }
        Ok(ordinal)
    }
}

/// Makes a thread that waits for this GPU sleep rather than spin. CUDA's
/// default, with fewer contexts than cores, is to spin: every session would
/// then hold a core at 100% for as long as its batch runs on the GPU, and those
/// cores are the ones tokenization and HTTP need to keep the GPU fed. Waking
/// costs microseconds against the milliseconds a batch takes. Set on the
/// primary context, which ONNX Runtime's CUDA provider uses, before it starts;
/// a failure (an old driver) only leaves CUDA's default. Once per GPU: the
/// sessions of a model load at the same time, and a later call would find the
/// context already started by another.
pub fn block_while_waiting(device: i32) {
    static SET: Mutex<Vec<i32>> = Mutex::new(Vec::new());
    let mut set = SET.lock().unwrap_or_else(|e| e.into_inner());
    if set.contains(&device) {
        return;
    }
    set.push(device);
    const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 0x04;
    // SAFETY: the CUDA driver API's documented entry point, with its true
    // signature (CUdevice is an int); the library stays loaded.
    unsafe {
        let Ok(library) = libloading::Library::new("libcuda.so.1") else { return };
        let set_flags: Result<libloading::Symbol<unsafe extern "C" fn(c_int, c_uint) -> c_int>, _> =
            library.get(b"cuDevicePrimaryCtxSetFlags_v2\0").or_else(|_| library.get(b"cuDevicePrimaryCtxSetFlags\0"));
        let code = set_flags.map(|f| f(device, CU_CTX_SCHED_BLOCKING_SYNC));
        std::mem::forget(library);
        match code {
            Ok(0) => {}
            Ok(code) => tracing::warn!(device, code, "CUDA would not set blocking waits on this GPU; waiting threads spin"),
            Err(e) => tracing::warn!(device, "CUDA has no cuDevicePrimaryCtxSetFlags ({e}); waiting threads spin"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four H200s and an A2000, as NVML lists them.
    fn host() -> Vec<ListedDevice> {
        [("GPU-1111", "18"), ("GPU-2222", "2A"), ("GPU-3333", "3A"), ("GPU-4444", "5D")]
            .into_iter()
            .map(|(uuid, bus)| ListedDevice::identified("NVIDIA H200", uuid, format!("00000000:{bus}:00.0")))
            .chain([ListedDevice::identified("NVIDIA RTX A2000", "GPU-5555", "00000000:AB:00.0")])
            .collect()
    }

    #[test]
    fn a_pattern_becomes_one_bus_id_pin_per_card_and_a_list_repeats_them() {
        let names = |devices: &Devices| devices.iter().map(|d| d.to_string()).collect::<Vec<_>>();
        let every = expand_among(&Devices::new(["cuda:H200*"]).unwrap(), &host(), &[]).unwrap();
        assert_eq!(names(&every), ["cuda:00000000:18:00.0", "cuda:00000000:2A:00.0", "cuda:00000000:3A:00.0", "cuda:00000000:5D:00.0"]);
        // Two sessions a card: the pattern twice; forbidden cards left out; other devices kept.
        let forbidden = vec!["GPU-2222".to_string()];
        let twice = expand_among(&Devices::new(["cuda:H200*", "cuda:H200*", "cpu"]).unwrap(), &host(), &forbidden).unwrap();
        assert_eq!(twice.iter().filter(|d| d.as_str() == "cuda:00000000:18:00.0").count(), 2);
        assert_eq!((twice.iter().count(), twice.iter().any(|d| d.as_str().contains("2A:00.0"))), (7, false));
        let none = expand_among(&Devices::new(["cuda:V100*"]).unwrap(), &host(), &[]).unwrap_err().to_string();
        assert!(none.contains("no CUDA devices match") && none.contains("GPU-5555"), "{none}");
    }
}
