//! The engines compiled into this build. This list is the only place in
//! eeane that names an engine: everything else asks it. Adding an engine is
//! a backend crate (exporting one `Backend` value), its Cargo feature, and
//! one line here.

use std::collections::BTreeMap;

use eeane_backend_core::{Backend, Device};

/// Every engine in this build.
pub static ENGINES: &[&dyn Backend] = &[
    #[cfg(feature = "onnxruntime")]
    &eeane_backend_onnxruntime::OnnxRuntime,
    #[cfg(feature = "openvino")]
    &eeane_backend_openvino::OpenVino,
    #[cfg(feature = "ncnn")]
    &eeane_backend_ncnn::Ncnn,
    #[cfg(feature = "coreml")]
    &eeane_backend_coreml::Coreml,
    #[cfg(feature = "test-engine")]
    &eeane_backend_testing::Testing,
];

/// The engine a model entry's `engine` key names.
pub fn find(name: &str) -> Option<&'static dyn Backend> {
    ENGINES.iter().copied().find(|e| e.name() == name)
}

/// The engine of entries that name none, and `precision = "auto"`'s
/// reference: the one that says so (`Backend::is_default`), else the first.
pub fn default_engine() -> &'static dyn Backend {
    ENGINES.iter().copied().find(|e| e.is_default()).or_else(|| ENGINES.first().copied()).expect("a build has at least one engine")
}

pub fn names() -> Vec<&'static str> {
    ENGINES.iter().map(|e| e.name()).collect()
}

/// Hands back what runtimes keep between models (ncnn's GPU instance) before
/// the process exits; call after the engine threads have ended.
pub fn at_exit() {
    for engine in ENGINES {
        engine.at_exit();
    }
}

/// The accelerator devices the runtimes opened in this process saw, by API
/// ("vulkan": ncnn's devices), for /health.
pub fn visible_devices() -> BTreeMap<&'static str, Vec<Device>> {
    ENGINES.iter().filter_map(|e| e.visible_devices()).map(|v| (v.api, v.devices)).collect()
}
