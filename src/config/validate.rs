//! Checks a loaded configuration: `precision = "auto"` entries marked, each
//! entry's engine keys handed to its engine, and the values that do not fit.

use std::collections::HashSet;
use std::path::Path;

use super::{resolve_path, AutoPrecision, Config, ConfigError, LoadPolicy, LongText, ModelConfig, ModelKind, Pooling};

impl Config {
    /// Entries that write `precision = "auto"`. One without an engine gets
    /// ONNX Runtime, the fp32 reference the others are measured against.
    pub(super) fn mark_auto_precision(&mut self, written: &[serde_json::Value]) {
        for (i, m) in self.models.iter_mut().enumerate() {
            let Some(entry) = written.get(i) else { continue };
            if entry.get("precision").and_then(|p| p.as_str()) != Some("auto") {
                continue;
            }
            m.auto_precision = Some(if entry.get("engine").is_some() {
                AutoPrecision::ItsEngine
            } else {
                m.engine = crate::engines::default_engine().name().into();
                AutoPrecision::AnyEngine
            });
        }
    }

    /// Hands each entry's keys that are not `ModelConfig`'s to its engine,
    /// which checks them once and returns them in their normal form.
    pub(super) fn check_engine_options(&mut self, written: &[serde_json::Value], base: &Path) -> Result<(), ConfigError> {
        let common = serde_aux::serde_introspection::serde_introspect::<ModelConfig>();
        let cache = self.cache_dir();
        let resolve = |path: &Path| resolve_path(&path.to_string_lossy(), &cache, base);
        for (i, m) in self.models.iter_mut().enumerate() {
            let entry: serde_json::Map<String, serde_json::Value> = written
                .get(i)
                .and_then(|w| w.as_object())
                .map(|w| {
                    w.iter()
                        // precision = "auto" is eeane's: each variant gets the engine's own precision keys.
                        .filter(|(k, _)| {
                            let eeanes = common.contains(&k.as_str()) || (m.auto_precision.is_some() && *k == "precision");
                            !eeanes
                        })
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            if m.auto_precision == Some(AutoPrecision::AnyEngine) {
                // Each variant's engine checks these at its load; at least one must take them.
                let refusals: Vec<String> =
                    crate::engines::ENGINES.iter().filter_map(|e| e.options(&entry, &resolve).err().map(|r| format!("{}: {r}", e.name()))).collect();
                if refusals.len() == crate::engines::ENGINES.len() && !refusals.is_empty() {
                    return Err(ConfigError::Invalid {
                        key: format!("models[{i}] (id {:?})", m.id),
                        message: format!("no engine of this build takes these keys ({})", refusals.join("; ")),
                    });
                }
                m.engine_options = entry;
                continue;
            }
            let Some(engine) = crate::engines::find(&m.engine) else { continue };
            let options = engine.options(&entry, &resolve).map_err(|message| ConfigError::Invalid {
                key: format!("models[{i}] (id {:?})", m.id),
                message: format!("{message} (a key that is not a model key belongs to its engine, {:?})", m.engine),
            })?;
            m.engine_options = match options.0 {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: String, message: String| Err(ConfigError::Invalid { key, message });
        if self.server.max_inputs == 0 {
            return invalid("server.max_inputs".into(), "must be at least 1".into());
        }
        if self.server.max_connections == Some(0) {
            return invalid("server.max_connections".into(), "must be at least 1 (leave it unset for the open-file limit less a reserve)".into());
        }
        if self.models.is_empty() {
            return invalid("models".into(), "no [[models]] entry".into());
        }
        let keys: Vec<&str> = crate::engines::ENGINES.iter().flat_map(|e| std::iter::once(e.name()).chain(e.device_runtimes().iter().map(|r| r.key))).collect();
        if let Some(name) = self.runtimes.0.keys().find(|name| !keys.contains(&name.as_str())) {
            return invalid(format!("runtimes.{name}"), format!("no engine or runtime build of that name in this build; it has: {}", keys.join(", ")));
        }
        let mut names = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            let key = |field: &str| format!("models[{i}].{field} (id {:?})", m.id);
            if m.id.trim().is_empty() {
                return invalid(format!("models[{i}].id"), "must not be empty".into());
            }
            for name in m.names() {
                if !names.insert(name.to_string()) {
                    return invalid(key("aliases"), format!("the name {name:?} is used by another model"));
                }
            }
            if m.source.is_none() {
                for (field, missing) in [("engine", m.engine.is_empty()), ("model", m.model.is_empty()), ("tokenizer", m.tokenizer.is_empty())] {
                    if missing {
                        return invalid(key(field), "is required (or name a Hub repository: source = \"hf:ORG/NAME\")".into());
                    }
                }
            }
            if let Some(name) = m.default_prompt_name.as_ref().filter(|n| !m.prompts.contains_key(*n)) {
                return invalid(key("default_prompt_name"), format!("{name:?} is not one of its prompts"));
            }
            if crate::engines::find(&m.engine).is_none() {
                return invalid(key("engine"), format!("unknown engine {:?}; this build has: {}", m.engine, crate::engines::names().join(", ")));
            }
            if m.max_tokens < 3 {
                return invalid(key("max_tokens"), "must be at least 3".into());
            }
            if m.max_batch == 0 {
                return invalid(key("max_batch"), "must be at least 1".into());
            }
            if m.buckets.iter().any(|b| b.max_tokens == 0 || b.max_batch == 0) {
                return invalid(key("buckets"), "every bucket needs max_tokens and max_batch of at least 1".into());
            }
            if m.buckets.windows(2).any(|w| w[0].max_tokens >= w[1].max_tokens) {
                return invalid(key("buckets"), "buckets must be in ascending order of max_tokens".into());
            }
            if m.buckets.iter().any(|b| b.max_tokens > m.max_tokens) {
                return invalid(key("buckets"), format!("a bucket is longer than max_tokens = {}", m.max_tokens));
            }
            if m.kind == ModelKind::Reranker {
                if m.pooling != Pooling::None {
                    return invalid(key("pooling"), "a reranker's graph returns its score; set pooling = \"none\"".into());
                }
                if m.long_text != LongText::Truncate {
                    return invalid(key("long_text"), "a reranker truncates the document; windows are for embeddings".into());
                }
                if m.rerank {
                    return invalid(key("rerank"), "rerank = true is for embedding models; a reranker always reranks".into());
                }
            }
            if let Some(template) = &m.rerank_template {
                if m.kind != ModelKind::Reranker {
                    return invalid(key("rerank_template"), "is for kind = \"reranker\" entries whose graph scores a templated pair".into());
                }
                if let Some(problem) = template.problem() {
                    return invalid(key("rerank_template"), problem);
                }
                if template.pair_tokens.is_some_and(|n| n > m.max_tokens) {
                    return invalid(key("rerank_template.pair_tokens"), format!("is more than max_tokens = {}", m.max_tokens));
                }
            }
            if m.auto_precision.is_some() {
                if m.kind == ModelKind::Reranker {
                    return invalid(key("precision"), "\"auto\" compares vectors; a reranker's entry names its precision".into());
                }
                if !m.device.all_cpu() && !auto_runs_on(m) {
                    return invalid(
                        key("precision"),
                        format!("\"auto\" measures variants on the CPU and on CUDA devices; name a precision for device {:?}", m.device),
                    );
                }
                if m.device.all_cpu() && m.device.len() > 1 {
                    return invalid(key("precision"), "\"auto\" chooses how many engines share the CPU; write device = \"cpu\"".into());
                }
            }
            if m.long_text == LongText::Window {
                if m.window < 3 || m.window > m.max_tokens {
                    return invalid(key("window"), format!("must be between 3 and max_tokens = {}", m.max_tokens));
                }
                if m.stride == 0 || m.stride > m.window - 2 {
                    return invalid(key("stride"), format!("must be between 1 and window - 2 = {} (content tokens per window)", m.window - 2));
                }
            }
        }
        let resident = self.models.iter().filter(|m| m.policy(&self.server) == LoadPolicy::Resident).count();
        if let Some(cap) = self.server.max_loaded_models {
            if cap == 0 {
                return invalid("server.max_loaded_models".into(), "must be at least 1 (leave it unset for no limit)".into());
            }
            if resident > cap {
                return invalid("server.max_loaded_models".into(), format!("{resident} models are resident, more than max_loaded_models = {cap}"));
            }
        }
        if self.models.iter().all(|m| m.policy(&self.server) == LoadPolicy::Disabled) {
            return invalid("models".into(), "every model is disabled".into());
        }
        Ok(())
    }
}

/// Whether some engine that an auto entry may use measures variants on its
/// (non-CPU) devices: the entry's own engine when it names one, else any.
fn auto_runs_on(m: &super::ModelConfig) -> bool {
    let engines: Vec<&dyn eeane_backend_core::Backend> = match m.auto_precision {
        Some(AutoPrecision::ItsEngine) => crate::engines::find(&m.engine).into_iter().collect(),
        _ => crate::engines::ENGINES.to_vec(),
    };
    engines.iter().any(|e| !e.device_precisions(eeane_backend_core::GraphKind::Float32, &m.device).is_empty())
}
