//! What a `source = "hf:..."` entry is prepared into: the engine's own
//! answer (`Backend::hub_preparation`), and the ONNX variant it names.

use eeane_backend_core::{DeviceGraph, Devices, HubPreparation};

use super::PullError;

#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The engine the prepared model is for.
    pub engine: &'static str,
    pub preparation: HubPreparation,
    /// One of the repository's ONNX variants (onnx/model_O4.onnx).
    pub onnx_file: Option<String>,
    /// The graph made beside the model file for the entry's device, which
    /// its `precision = "auto"` measures (`with_device_graph`).
    pub device_graph: Option<DeviceGraph>,
}

impl Target {
    /// The target an entry's engine and `onnx_file` call for.
    pub fn for_engine(engine: &str, onnx_file: Option<&str>) -> Result<Target, PullError> {
        let found = crate::engines::find(engine).and_then(|e| Some((e.name(), e.hub_preparation()?)));
        let Some((engine, preparation)) = found else {
            let takers: Vec<&str> = crate::engines::ENGINES.iter().filter(|e| e.hub_preparation().is_some()).map(|e| e.name()).collect();
            return Err(PullError::Unsupported(format!("a Hub source is prepared for engine {}, not {engine:?}", takers.join(", "))));
        };
        if onnx_file.is_some() && !preparation.reads_repository_onnx {
            return Err(PullError::Unsupported(format!(
                "onnx_file picks an ONNX variant; {engine}'s graph is converted from model.safetensors (leave onnx_file out)"
            )));
        }
        Ok(Target { engine, preparation, onnx_file: onnx_file.map(str::to_string), device_graph: None })
    }

    /// With the engine's graph for `devices` (the GPU's fp16 graph on a CUDA
    /// device), when `auto_precision` will measure it: an entry that names
    /// its precision serves model.onnx alone, and does not wait for more.
    pub fn with_device_graph(mut self, devices: &Devices, auto_precision: bool) -> Target {
        self.device_graph =
            self.preparation.device_graphs.iter().find(|g| auto_precision && devices.iter().all(|d| d.as_str().starts_with(g.device_prefix))).copied();
        self
    }

    /// The default engine's target: the repository's ONNX graph as it is.
    pub fn default_engine() -> Target {
        let engine = crate::engines::default_engine();
        Target { engine: engine.name(), preparation: engine.hub_preparation().unwrap_or(HubPreparation::ONNX), onnx_file: None, device_graph: None }
    }

    /// The prepared model's file in its folder.
    pub fn model_file(&self) -> &'static str {
        self.preparation.model_file
    }

    /// Whether the repository's own ONNX graph is used (else one is built
    /// from its safetensors, and converted when the engine needs it).
    pub fn reads_repository_onnx(&self) -> bool {
        self.preparation.reads_repository_onnx
    }
}
