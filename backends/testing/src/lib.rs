//! A test-only engine (Cargo feature `test-engine`): no runtime, no model
//! file; each token's state is a fixed function of its id, so a test can
//! compute the vector eeane must serve from the tokenizer alone. It exists to
//! show that an engine is one crate and one line in `src/engines.rs`, and it
//! goes through everything a real engine does: its options checked from the
//! model entry, an engine process, the batcher, pooling, HTTP.

use std::path::Path;

use eeane_backend_core::{Backend, Engine, EngineError, EngineInfo, EngineOutput, EngineSpec, InputShapes, InvalidOptions, Options, PathResolver, TokenBatch};

/// The engine's name in a model entry.
pub const NAME: &str = "testing";

/// Token `id`'s state in dimension `j`: deterministic, in [-0.5, 0.5), and
/// different for nearby ids and dimensions.
pub fn token_state(id: i64, j: usize) -> f32 {
    ((id * (2 * j as i64 + 1) + 7 * j as i64) % 1009) as f32 / 1009.0 - 0.5
}

/// A model entry's keys for this engine.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestingOptions {
    /// Width of the token states.
    #[serde(default = "default_dimensions")]
    pub dimensions: usize,
    /// Seconds the load takes, so that a test can watch a load under way.
    #[serde(default)]
    pub load_seconds: f64,
}

fn default_dimensions() -> usize {
    8
}

impl Default for TestingOptions {
    fn default() -> Self {
        Self { dimensions: default_dimensions(), load_seconds: 0.0 }
    }
}

pub struct Testing;

impl Backend for Testing {
    fn name(&self) -> &'static str {
        NAME
    }

    fn default_runtime(&self) -> Option<&'static str> {
        None
    }

    fn open(&self, _library: Option<&Path>) -> Result<String, EngineError> {
        Ok("testing".into())
    }

    fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        let options: TestingOptions = spec.options.typed()?;
        if spec.device != "cpu" {
            return Err(EngineError::Device(format!("device {:?}: the testing engine runs on \"cpu\"", spec.device)));
        }
        let info = EngineInfo {
            engine: NAME.into(),
            device: "cpu".into(),
            precision: "fp32".into(),
            shapes: InputShapes::Dynamic,
            takes_token_type_ids: false,
            seq_multiple: 1,
            call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
            row_counts: Vec::new(),
            accelerated_layers: None,
            runtime_version: None,
        };
        std::thread::sleep(std::time::Duration::from_secs_f64(options.load_seconds));
        Ok(Box::new(TestingEngine { info, dimensions: options.dimensions }))
    }

    fn options(&self, entry: &serde_json::Map<String, serde_json::Value>, _paths: PathResolver) -> Result<Options, InvalidOptions> {
        Options::check(entry, |options: &mut TestingOptions| match (options.dimensions, options.load_seconds) {
            (1..=4096, 0.0..=60.0) => Ok(()),
            (1..=4096, s) => Err(InvalidOptions(format!("load_seconds = {s}: use 0 to 60"))),
            (n, _) => Err(InvalidOptions(format!("dimensions = {n}: use 1 to 4096"))),
        })
    }
}

struct TestingEngine {
    info: EngineInfo,
    dimensions: usize,
}

impl Engine for TestingEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }

    fn run(&mut self, batch: &TokenBatch) -> Result<EngineOutput, EngineError> {
        let dim = self.dimensions;
        let data = batch.input_ids.iter().flat_map(|&id| (0..dim).map(move |j| token_state(id, j))).collect();
        Ok(EngineOutput::Hidden { data, batch: batch.batch, seq: batch.seq, dim })
    }
}
