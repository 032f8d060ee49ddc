//! The engines compiled into this build, by config name.

use eeane_backend_core::EngineLoader;

pub const NAMES: &[&str] = &[
    #[cfg(feature = "onnxruntime")]
    "onnxruntime",
];

pub fn known(name: &str) -> bool {
    NAMES.contains(&name)
}

pub fn loader(name: &str) -> Option<EngineLoader> {
    match name {
        #[cfg(feature = "onnxruntime")]
        "onnxruntime" => Some(eeane_backend_onnxruntime::load),
        _ => None,
    }
}
