//! The engines compiled into this build, by config name.

use eeane_backend_core::EngineLoader;

pub const NAMES: &[&str] = &[
    #[cfg(feature = "onnxruntime")]
    "onnxruntime",
    #[cfg(feature = "openvino")]
    "openvino",
    #[cfg(feature = "ncnn")]
    "ncnn",
    #[cfg(feature = "coreml")]
    "coreml",
];

pub fn known(name: &str) -> bool {
    NAMES.contains(&name)
}

pub fn loader(name: &str) -> Option<EngineLoader> {
    match name {
        #[cfg(feature = "onnxruntime")]
        "onnxruntime" => Some(eeane_backend_onnxruntime::load),
        #[cfg(feature = "openvino")]
        "openvino" => Some(eeane_backend_openvino::load),
        #[cfg(feature = "ncnn")]
        "ncnn" => Some(eeane_backend_ncnn::load),
        #[cfg(feature = "coreml")]
        "coreml" => Some(eeane_backend_coreml::load),
        _ => None,
    }
}

/// Opens the runtime library an engine needs, ahead of any model load; its version.
pub fn open_runtime(name: &str, library: &std::path::Path) -> Result<String, String> {
    match name {
        #[cfg(feature = "onnxruntime")]
        "onnxruntime" => eeane_backend_onnxruntime::open(library).map_err(|e| e.to_string()),
        #[cfg(feature = "openvino")]
        "openvino" => eeane_backend_openvino::open(library).map_err(|e| e.to_string()),
        #[cfg(feature = "ncnn")]
        "ncnn" => eeane_backend_ncnn::open(library).map_err(|e| e.to_string()),
        #[cfg(feature = "coreml")]
        "coreml" => eeane_backend_coreml::open(library).map_err(|e| e.to_string()),
        _ => {
            let _ = library;
            Err(format!("engine {name:?} is not compiled into this build"))
        }
    }
}

/// Hands back what runtimes keep between models (ncnn's GPU instance) before
/// the process exits; call after the engine threads have ended.
pub fn release_runtimes_at_exit() {
    #[cfg(feature = "ncnn")]
    eeane_backend_ncnn::release_gpu_at_exit();
}

/// The accelerator devices the engines' runtimes saw when they were opened, by
/// API, for /health: ncnn's Vulkan devices as (name, kind).
pub fn visible_devices() -> serde_json::Value {
    #[cfg_attr(not(feature = "ncnn"), allow(unused_mut))]
    let mut devices = serde_json::Map::new();
    #[cfg(feature = "ncnn")]
    if let Some(list) = eeane_backend_ncnn::visible_devices() {
        let list: Vec<_> = list.into_iter().map(|(name, kind)| serde_json::json!({"name": name, "kind": kind})).collect();
        devices.insert("vulkan".into(), list.into());
    }
    devices.into()
}

/// Why an engine cannot run on this platform at all (not a missing file: the
/// platform), for check-config; `None` where it can.
pub fn platform_unavailable(name: &str) -> Option<&'static str> {
    match name {
        #[cfg(feature = "coreml")]
        "coreml" => eeane_backend_coreml::unavailable(),
        _ => None,
    }
}
