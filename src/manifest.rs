//! What crosses between eeane and models/prepare.py, typed once: the
//! settings `eeane pull hf:` read from a repository and hands to prepare.py
//! (`HubSettings`, recorded back as the manifest's `source.inferred`), and
//! the manifest.json prepare.py writes beside every prepared model
//! (`Manifest`), which eeane reads to verify files, size models, find GPU
//! graphs and keep `precision = "auto"` surveys. This module is the only one
//! that parses or writes manifest.json.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The file beside a prepared model's files.
pub const FILE: &str = "manifest.json";

/// manifest.json, as models/prepare.py writes it (`write_manifest`). Keys
/// eeane does not read are kept as they are, so that a rewrite (a survey
/// added) loses nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converter_version: Option<u64>,
    #[serde(default)]
    pub source: Source,
    /// Each check's figures by name; a device graph's check (`GraphCheck`)
    /// under its `DeviceGraph::manifest_check` key.
    #[serde(default)]
    pub checks: BTreeMap<String, Value>,
    /// Every file of the folder with its sha256.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Parameters>,
    /// `precision = "auto"` surveys by entry id (src/variants.rs's `Survey`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, Value>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Where a prepared model came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// hf:REPO@COMMIT, for a Hub repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
    /// What eeane read from the repository, as it handed it to prepare.py
    /// (`HubSettings`; `Source::settings`). Kept as written, so that a
    /// manifest of an older layout still reads, and is rewritten unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inferred: Option<Value>,
    /// The PyPI package a catalog model comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converted_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized_from: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl Source {
    /// The settings the model was prepared with, when they read as today's.
    pub fn settings(&self) -> Option<HubSettings> {
        serde_json::from_value(self.inferred.clone()?).ok()
    }
}

/// The parameter count prepare.py recorded, and what it counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameters {
    pub count: u64,
    #[serde(default)]
    pub from: Option<String>,
}

/// A graph made beside the model file for a kind of device: its file, or
/// none and why.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GraphCheck {
    pub graph: Option<String>,
    #[serde(default)]
    pub why: Option<String>,
    /// The pooling the graph does inside, when it does.
    #[serde(default)]
    pub pooling_in_graph: Option<String>,
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} is not a manifest: {source}", path.display())]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

impl Manifest {
    /// The manifest in `dir`; `Ok(None)` when there is none.
    pub fn read(dir: &Path) -> Result<Option<Manifest>, ManifestError> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|source| ManifestError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ManifestError::Read { path, source }),
        }
    }

    /// The manifest in `dir`, or `None` when there is none or it does not parse.
    pub fn find(dir: &Path) -> Option<Manifest> {
        Self::read(dir).ok().flatten()
    }

    /// The manifest beside `file`.
    pub fn beside(file: &Path) -> Option<Manifest> {
        Self::find(file.parent()?)
    }

    /// Writes the manifest into `dir` whole or not at all: a reader never
    /// sees half a manifest.
    pub fn write(&self, dir: &Path) -> Result<(), ManifestError> {
        let path = dir.join(FILE);
        let bytes = serde_json::to_vec_pretty(self).map_err(|source| ManifestError::Parse { path: path.clone(), source })?;
        let partial = path.with_extension(format!("json.partial-{}", std::process::id()));
        std::fs::write(&partial, bytes).and_then(|()| std::fs::rename(&partial, &path)).map_err(|source| ManifestError::Write { path, source })
    }

    /// Whether every file the manifest lists is in `dir`.
    pub fn complete_in(&self, dir: &Path) -> bool {
        self.files.keys().all(|f| dir.join(f).is_file())
    }

    /// The device graphs' checks: each a graph's file name, or none with why.
    pub fn graph_checks(&self) -> Vec<GraphCheck> {
        self.checks
            .values()
            .filter(|c| c.get("graph").is_some() && (c.get("why").is_some() || c.get("pooling_in_graph").is_some()))
            .filter_map(|c| serde_json::from_value(c.clone()).ok())
            .collect()
    }

    /// The survey kept for entry `id`, as `T` (src/variants.rs's `Survey`).
    pub fn survey<T: serde::de::DeserializeOwned>(&self, id: &str) -> Option<T> {
        serde_json::from_value(self.variants.get(id)?.clone()).ok()
    }

    /// Keeps `survey` for entry `id`.
    pub fn set_survey<T: Serialize>(&mut self, id: &str, survey: &T) -> Result<(), serde_json::Error> {
        self.variants.insert(id.to_string(), serde_json::to_value(survey)?);
        Ok(())
    }

    /// A survey's `chosen` and `reason`, for `eeane models`.
    pub fn chosen_variants(&self) -> Vec<(String, String, String)> {
        self.variants
            .iter()
            .map(|(id, s)| {
                let text = |key: &str| s.get(key).and_then(Value::as_str).map(str::to_string);
                (id.clone(), text("chosen").unwrap_or_else(|| "?".into()), text("reason").unwrap_or_default())
            })
            .collect()
    }
}

/// One setting read from a repository and the file it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setting<T> {
    pub value: T,
    pub from: String,
}

/// What `eeane pull hf:` read from a repository, handed to models/prepare.py
/// as `--settings` and recorded as the manifest's `source.inferred`:
/// prepare.py builds the graph the settings describe (the family's builder,
/// its pooling and Dense modules, a reranker's head) from config.json, the
/// tokenizer and the weights, and reads none of sentence-transformers' files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubSettings {
    pub architecture: String,
    /// The row of models/families.toml that builds it; none when the
    /// repository's own ONNX graph is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// "embedding" or "reranker".
    pub kind: String,
    /// The weights the graph is made from, in words.
    pub weights: String,
    pub pooling: Setting<String>,
    pub normalize: Setting<bool>,
    pub max_tokens: Setting<usize>,
    pub prompts: Setting<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_activation: Option<Setting<String>>,
    /// Dense modules after pooling, in order, applied inside the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense: Option<Vec<DenseModule>>,
    /// The pooling the graph does inside, with Dense modules ("mean" or "cls").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_pooling: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_prompt_name: Option<Setting<String>>,
    /// A language-model reranker's tokens whose logits score a pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_tokens: Option<ScoreTokens>,
}

/// A sentence-transformers Dense module: its folder and the torch class of
/// its activation, as its config.json names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DenseModule {
    pub path: String,
    pub activation: String,
}

/// The token whose logit says a pair is relevant, and the one it is weighed against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreTokens {
    #[serde(rename = "true")]
    pub relevant: String,
    #[serde(rename = "false")]
    pub irrelevant: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_keeps_what_it_does_not_read_through_a_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"converter_version": 1, "source": {"hub": "hf:o/m@c", "pytorch": "x.bin", "inferred": {"architecture": "BertModel",
            "family": "bert", "kind": "embedding", "weights": "model.safetensors", "pooling": {"value": "mean", "from": "f"},
            "normalize": {"value": true, "from": "f"}, "max_tokens": {"value": 512, "from": "f"}, "prompts": {"value": {}, "from": "f"}}},
            "checks": {"min_cosine": 0.99, "cuda_fp16": {"graph": null, "why": "rerankers keep their fp32 graph"}},
            "files": {"model.onnx": "ab"}, "parameters": {"count": 7, "from": "headers"}, "recipe_notes": [1, 2]}"#;
        std::fs::write(dir.path().join(FILE), text).unwrap();
        let mut manifest = Manifest::read(dir.path()).unwrap().unwrap();
        assert_eq!(manifest.source.settings().unwrap().family.as_deref(), Some("bert"));
        assert_eq!(manifest.graph_checks(), [GraphCheck { graph: None, why: Some("rerankers keep their fp32 graph".into()), pooling_in_graph: None }]);
        manifest.set_survey("m", &serde_json::json!({"chosen": "fp32", "reason": "r"})).unwrap();
        manifest.write(dir.path()).unwrap();
        let again = Manifest::read(dir.path()).unwrap().unwrap();
        assert_eq!(again, manifest);
        assert_eq!(again.other["recipe_notes"], serde_json::json!([1, 2]));
        assert_eq!(again.source.other["pytorch"], "x.bin");
        assert_eq!(again.chosen_variants(), [("m".to_string(), "fp32".to_string(), "r".to_string())]);
        assert!(!again.complete_in(dir.path()));
        // The settings as prepare.py reads them: the same JSON as written.
        let settings = serde_json::to_value(again.source.settings().unwrap()).unwrap();
        assert_eq!(settings["pooling"], serde_json::json!({"value": "mean", "from": "f"}));
        assert!(settings.get("score_tokens").is_none());
    }

    #[test]
    fn no_manifest_is_none_and_a_broken_one_says_where() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Manifest::read(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join(FILE), "{").unwrap();
        let e = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("manifest.json is not a manifest"), "{e}");
    }
}
