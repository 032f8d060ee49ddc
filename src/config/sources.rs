//! A `source = "hf:..."` entry's unset keys, read from its repository as
//! sentence-transformers reads them (`pull::hf::resolve`).

use super::{length_ladder, Config, ConfigPath, ModelConfig, ModelKind, Pooling, ScoreActivation};
use crate::pull::hf::Target;
use crate::pull::PullError;

impl ModelConfig {
    /// What this entry's Hub source is prepared into: its engine's target,
    /// with the device graph its `precision = "auto"` measures.
    pub fn hub_target(&self) -> Result<Target, PullError> {
        Target::for_engine(&self.engine, self.onnx_file.as_deref()).map(|t| t.with_device_graph(&self.device, self.auto_precision.is_some()))
    }

    /// Fetches and prepares this entry's Hub source unless it is prepared
    /// (blocking: run it off the async runtime); nothing for an entry
    /// without a source.
    pub fn ensure_hub_prepared(&self, server: &Config) -> Result<(), PullError> {
        let Some(source) = &self.source else { return Ok(()) };
        crate::pull::hf::ensure_prepared(source, &server.cache_dir(), server.server.hub_downloads, &self.hub_target()?)
    }
}

impl Config {
    /// Fills in each `source` entry's unset keys from its repository's files
    /// (`pull::hf::resolve`: the HF cache, else the Hub's small config files
    /// when downloads are allowed). A source that cannot be read leaves its
    /// model failing with the reason; the others are untouched.
    pub(super) fn read_sources(&mut self, written: &[serde_json::Value]) {
        let downloads = self.server.hub_downloads;
        for (i, m) in self.models.iter_mut().enumerate() {
            let Some(source) = m.source.clone() else { continue };
            let set = |key: &str| written.get(i).and_then(|w| w.get(key)).is_some();
            if !set("engine") {
                m.engine = crate::engines::default_engine().name().into();
            }
            let resolved = m.hub_target().and_then(|target| crate::pull::hf::resolve(&source, downloads, &target).map(|resolved| (resolved, target)));
            match resolved {
                Ok((resolved, target)) => {
                    let mut take = |key: &str, value: String, from: &str| {
                        if !set(key) {
                            m.inferred.push((format!("{key} = {value}"), from.to_string()));
                        }
                        !set(key)
                    };
                    let dir = format!("{{cache}}/models/{}", resolved.dir_name);
                    let model = format!("{dir}/{}", target.model_file());
                    if take("model", format!("{model:?}"), "where eeane prepares it") {
                        m.model = ConfigPath::new(model);
                    }
                    if take("tokenizer", format!("\"{dir}/tokenizer.json\""), "the repository's tokenizer.json") {
                        m.tokenizer = ConfigPath::new(format!("{dir}/tokenizer.json"));
                    }
                    let st = &resolved.model;
                    if st.reranker && take("kind", "\"reranker\"".into(), "config.json (a sequence classifier with one label)") {
                        m.kind = ModelKind::Reranker;
                    }
                    if let Some(activation) = &st.score_activation {
                        if take("score_activation", format!("{:?}", activation.value), &activation.from) {
                            match typed::<ScoreActivation>(activation.value, "score_activation", &activation.from) {
                                Ok(value) => m.score_activation = value,
                                Err(reason) => m.unavailable = Some(format!("{source}: {reason}")),
                            }
                        }
                    }
                    if take("pooling", format!("{:?}", st.pooling.value), &st.pooling.from) {
                        match typed::<Pooling>(st.pooling.value, "pooling", &st.pooling.from) {
                            Ok(value) => m.pooling = value,
                            Err(reason) => m.unavailable = Some(format!("{source}: {reason}")),
                        }
                    }
                    if take("normalize", st.normalize.value.to_string(), &st.normalize.from) {
                        m.normalize = st.normalize.value;
                    }
                    if take("max_tokens", st.max_tokens.value.to_string(), &st.max_tokens.from) {
                        m.max_tokens = st.max_tokens.value;
                    }
                    if !st.prompts.value.is_empty() && take("prompts", format!("{:?}", st.prompts.value), &st.prompts.from) {
                        m.prompts = st.prompts.value.clone();
                    }
                    if let Some(default) = &st.default_prompt_name {
                        if take("default_prompt_name", format!("{:?}", default.value), &default.from) {
                            m.default_prompt_name = Some(default.value.clone());
                        }
                    }
                    // OpenVINO compiles one model per bucket, its shapes bounded
                    // by the bucket's rows and tokens: an entry without buckets
                    // gets a length ladder.
                    if crate::engines::find(&m.engine).is_some_and(|e| e.compiles_per_bucket()) && !set("buckets") {
                        m.buckets = length_ladder(m.max_tokens);
                        let shown: Vec<String> =
                            m.buckets.iter().map(|b| format!("{{ max_tokens = {}, max_batch = {} }}", b.max_tokens, b.max_batch)).collect();
                        m.inferred.push((format!("buckets = [{}]", shown.join(", ")), "a length ladder: OpenVINO compiles bounded shapes per bucket".into()));
                    }
                    m.inferred.push((format!("commit = {:?}", resolved.commit), "the Hub (or the HF cache's refs)".into()));
                }
                Err(reason) => {
                    // Placeholders that pass validation; loading fails with the reason.
                    if m.max_tokens < 3 {
                        m.max_tokens = 512;
                    }
                    m.unavailable = Some(format!("{source}: {reason}"));
                }
            }
        }
    }
}

/// A value a repository's files give that eeane has no name for.
#[derive(Debug, thiserror::Error)]
#[error("{key} {value:?} (from {from}) is not one eeane serves")]
struct UnknownValue {
    key: String,
    value: String,
    from: String,
}

/// A value read from a repository's files, through the config's own enum:
/// one eeane has no name for is refused, naming the file, never taken as a default.
fn typed<T: serde::de::DeserializeOwned>(value: &str, key: &str, from: &str) -> Result<T, UnknownValue> {
    serde_json::from_value(serde_json::Value::String(value.to_string())).map_err(|_| UnknownValue { key: key.into(), value: value.into(), from: from.into() })
}
