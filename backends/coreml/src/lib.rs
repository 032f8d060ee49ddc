//! Core ML engine: compiled models (`.mlmodelc`), one per sequence-length
//! bucket, optionally a batch-2 artifact per bucket that runs two inputs of
//! that bucket in one Neural Engine call (about 25% more throughput on many
//! short inputs, measured on an M2).
//!
//! This crate holds the platform-independent parts, tested everywhere:
//! finding the artifacts (an explicit bucket -> path table, or a directory of
//! eeANE's compiled-model cache with its `model_info.json`), choosing an
//! input's bucket, and pairing inputs for the batch-2 artifacts. The part
//! that calls Core ML (`macos.rs`) is compiled on macOS only; CI type-checks
//! it for aarch64-apple-darwin, but it has never run (docs/engines/coreml.md).
//! Elsewhere a model naming this engine fails with "needs macOS".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use eeane_backend_core::{Backend, Engine, EngineError, EngineSpec, InvalidOptions, Options, PathResolver};

#[cfg(target_os = "macos")]
mod macos;

/// Why a model's compiled artifacts cannot be used; the message names the
/// file or table key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArtifactsError(pub String);

impl From<ArtifactsError> for EngineError {
    fn from(e: ArtifactsError) -> Self {
        EngineError::Model(e.0)
    }
}

/// The newest `model_info.json` format this reader understands.
pub const MAX_MODEL_INFO_FORMAT: i64 = 2;

/// What a Core ML model is made of, wherever it was described.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Artifacts {
    /// Sequence length -> compiled model for one input.
    pub buckets: BTreeMap<usize, PathBuf>,
    /// Sequence length -> compiled model for two inputs of that length.
    pub batch2: BTreeMap<usize, PathBuf>,
    /// The frozen tokenizer, when the cache names one.
    pub tokenizer: Option<PathBuf>,
    /// "embedding" or "reranker", when the cache records it.
    pub kind: Option<String>,
    pub output_name: Option<String>,
    pub embedding_dim: Option<usize>,
    /// Compiled buckets left out because calibration did not recommend them.
    pub excluded: Vec<usize>,
}

fn bucket_key(key: &str, what: &str) -> Result<usize, ArtifactsError> {
    match key.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ArtifactsError(format!("{what} key {key:?} is not a positive sequence length"))),
    }
}

/// From config tables: `artifacts` (bucket -> path) and, optionally,
/// `batch_artifacts`, whose buckets must each have a batch-1 artifact.
pub fn from_tables(artifacts: &BTreeMap<String, PathBuf>, batch: &BTreeMap<String, PathBuf>) -> Result<Artifacts, ArtifactsError> {
    if artifacts.is_empty() {
        return Err(ArtifactsError("artifacts is empty: name at least one bucket's compiled model".into()));
    }
    let buckets = artifacts.iter().map(|(k, p)| Ok((bucket_key(k, "artifacts")?, p.clone()))).collect::<Result<BTreeMap<_, _>, ArtifactsError>>()?;
    let batch2 = batch.iter().map(|(k, p)| Ok((bucket_key(k, "batch_artifacts")?, p.clone()))).collect::<Result<BTreeMap<_, _>, ArtifactsError>>()?;
    if let Some(orphan) = batch2.keys().find(|b| !buckets.contains_key(b)) {
        return Err(ArtifactsError(format!("batch_artifacts has bucket {orphan}, which artifacts lacks")));
    }
    Ok(Artifacts { buckets, batch2, ..Default::default() })
}

/// The directory eeANE's `eeane compile` gives a model id in its cache:
/// `<root>/compiled/<id with "/" as "--">`.
pub fn cache_dir_for(root: &Path, model_id: &str) -> Result<PathBuf, ArtifactsError> {
    let name = model_id.trim().replace('/', "--");
    if name.is_empty() || name == "." || name == ".." || Path::new(&name).file_name().map(|n| n != name.as_str()).unwrap_or(true) {
        return Err(ArtifactsError(format!("model id {model_id:?} does not name a single cache directory")));
    }
    Ok(root.join("compiled").join(name))
}

/// A file named in the record, which must stay inside the model's directory.
fn inside(dir: &Path, value: Option<&serde_json::Value>, field: &str, record: &str) -> Result<PathBuf, ArtifactsError> {
    let name = value.and_then(|v| v.as_str()).filter(|s| !s.trim().is_empty()).ok_or_else(|| ArtifactsError(format!("{record} names no usable {field}")))?;
    let relative = Path::new(name);
    if relative.is_absolute() || relative.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(ArtifactsError(format!("{record} points {field} at {name:?}, outside its own directory")));
    }
    Ok(dir.join(relative))
}

/// From a directory of eeANE's compiled-model cache: its `model_info.json`
/// names the kind, the frozen tokenizer and the artifacts (relative to the
/// directory); when it recommends buckets, only those are used.
pub fn from_cache_dir(dir: &Path) -> Result<Artifacts, ArtifactsError> {
    let path = dir.join("model_info.json");
    let record = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| ArtifactsError(format!("{record}: {e} (run `eeane compile` for this model first)")))?;
    let info: serde_json::Value = serde_json::from_str(&text).map_err(|e| ArtifactsError(format!("{record} is not JSON: {e}")))?;
    let version = info
        .get("format_version")
        .and_then(|v| v.as_i64())
        .filter(|&v| v >= 1)
        .ok_or_else(|| ArtifactsError(format!("{record} has no usable format_version")))?;
    if version > MAX_MODEL_INFO_FORMAT {
        return Err(ArtifactsError(format!("{record} has format_version {version}; this eeane reads up to {MAX_MODEL_INFO_FORMAT}")));
    }
    let kind = info.get("kind").and_then(|v| v.as_str()).filter(|k| matches!(*k, "embedding" | "reranker"));
    let kind = kind.ok_or_else(|| ArtifactsError(format!("{record} records no supported kind (embedding or reranker)")))?.to_string();
    let table = |field: &str| -> Result<BTreeMap<usize, PathBuf>, ArtifactsError> {
        let Some(entries) = info.get(field) else { return Ok(BTreeMap::new()) };
        let entries = entries.as_object().ok_or_else(|| ArtifactsError(format!("{record}: {field} is not a table")))?;
        entries.iter().map(|(k, v)| Ok((bucket_key(k, field)?, inside(dir, Some(v), field, &record)?))).collect()
    };
    let mut buckets = table("artifacts")?;
    if buckets.is_empty() {
        return Err(ArtifactsError(format!("{record} lists no compiled artifacts")));
    }
    let mut batch2 = table("batch_artifacts")?;
    let mut excluded = Vec::new();
    if let Some(recommended) = info.get("recommended_buckets") {
        let wanted: Vec<usize> = recommended
            .as_array()
            .and_then(|a| a.iter().map(|b| b.as_u64().map(|b| b as usize)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| ArtifactsError(format!("{record} has an unusable recommended_buckets list")))?;
        excluded = buckets.keys().copied().filter(|b| !wanted.contains(b)).collect();
        buckets.retain(|b, _| wanted.contains(b));
        batch2.retain(|b, _| wanted.contains(b));
        if buckets.is_empty() {
            return Err(ArtifactsError(format!("{record} recommends buckets {wanted:?}, none of which is compiled")));
        }
    }
    Ok(Artifacts {
        buckets,
        batch2,
        tokenizer: Some(inside(dir, info.get("tokenizer"), "tokenizer", &record)?),
        kind: Some(kind),
        output_name: info.get("output_name").and_then(|v| v.as_str()).map(str::to_string),
        embedding_dim: info.get("embedding_dim").and_then(|v| v.as_u64()).map(|d| d as usize),
        excluded,
    })
}

/// The bucket an input of `len` tokens runs in: the smallest that holds it,
/// else the largest (the input is then truncated to it). `None` without buckets.
pub fn choose_bucket(buckets: &[usize], len: usize) -> Option<(usize, bool)> {
    let largest = *buckets.iter().max()?;
    Some(buckets.iter().copied().filter(|&b| b >= len).min().map_or((largest, true), |b| (b, false)))
}

/// One Core ML call: one input, or two inputs of one bucket through its batch-2 artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Single { input: usize, bucket: usize },
    Pair { inputs: [usize; 2], bucket: usize },
}

/// Plans the calls for inputs of `lengths` tokens: each goes to its bucket;
/// within a bucket that has a batch-2 artifact, inputs are paired in order and
/// an odd one out runs alone. Every input appears in exactly one call.
pub fn plan_calls(lengths: &[usize], buckets: &[usize], batch2: &[usize]) -> Vec<Call> {
    let mut by_bucket: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (input, &len) in lengths.iter().enumerate() {
        if let Some((bucket, _)) = choose_bucket(buckets, len) {
            by_bucket.entry(bucket).or_default().push(input);
        }
    }
    let mut calls = Vec::new();
    for (bucket, inputs) in by_bucket {
        if batch2.contains(&bucket) {
            let mut pairs = inputs.chunks_exact(2);
            calls.extend(pairs.by_ref().map(|p| Call::Pair { inputs: [p[0], p[1]], bucket }));
            calls.extend(pairs.remainder().iter().map(|&input| Call::Single { input, bucket }));
        } else {
            calls.extend(inputs.into_iter().map(|input| Call::Single { input, bucket }));
        }
    }
    calls
}

/// Why this build cannot run Core ML, or `None` where it could.
pub fn unavailable() -> Option<&'static str> {
    if cfg!(target_os = "macos") {
        None
    } else {
        Some("the Core ML engine needs macOS")
    }
}

/// Core ML compute units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeUnits {
    #[default]
    CpuAndNe,
    CpuOnly,
    CpuAndGpu,
    All,
}

impl ComputeUnits {
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeUnits::CpuAndNe => "cpu_and_ne",
            ComputeUnits::CpuOnly => "cpu_only",
            ComputeUnits::CpuAndGpu => "cpu_and_gpu",
            ComputeUnits::All => "all",
        }
    }
}

fn default_input_names() -> [String; 2] {
    ["input_ids".into(), "attention_mask".into()]
}

/// A model entry's keys for this engine.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoremlOptions {
    /// Sequence length -> compiled model (.mlmodelc). Empty: `model` is a
    /// directory of eeANE's compiled-model cache, read from its model_info.json.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, PathBuf>,
    /// Sequence length -> batch-2 compiled model (two inputs of that bucket
    /// in one call); each bucket needs an `artifacts` entry too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub batch_artifacts: BTreeMap<String, PathBuf>,
    #[serde(default)]
    pub compute_units: ComputeUnits,
    /// The graph's two input names: the ids', then the mask's.
    #[serde(default = "default_input_names")]
    pub input_names: [String; 2],
}

impl Default for CoremlOptions {
    fn default() -> Self {
        Self { artifacts: BTreeMap::new(), batch_artifacts: BTreeMap::new(), compute_units: ComputeUnits::default(), input_names: default_input_names() }
    }
}

impl CoremlOptions {
    /// The tables' paths resolved; the tables checked (positive buckets, no
    /// batch-2 bucket without its batch-1 artifact).
    fn check(&mut self, paths: PathResolver) -> Result<(), InvalidOptions> {
        for path in self.artifacts.values_mut().chain(self.batch_artifacts.values_mut()) {
            *path = paths(path);
        }
        match (self.artifacts.is_empty(), self.batch_artifacts.is_empty()) {
            (true, false) => Err(InvalidOptions("batch_artifacts needs an explicit artifacts table beside it".into())),
            (true, true) => Ok(()),
            (false, _) => from_tables(&self.artifacts, &self.batch_artifacts).map(drop).map_err(|e| InvalidOptions(e.0)),
        }
    }
}

/// The Core ML engine, as eeane registers it.
pub struct Coreml;

impl Backend for Coreml {
    fn name(&self) -> &'static str {
        "coreml"
    }

    fn file_format(&self) -> &'static str {
        "mlpackage"
    }

    /// Core ML is a system framework: nothing to open by path.
    fn default_runtime(&self) -> Option<&'static str> {
        None
    }

    fn open(&self, _library: Option<&Path>) -> Result<String, EngineError> {
        match self.unavailable() {
            Some(why) => Err(EngineError::Runtime(why.into())),
            None => Ok("coreml".into()),
        }
    }

    fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        self.open(None)?;
        let options: CoremlOptions = spec.options.typed()?;
        let artifacts = artifacts_of(spec, &options)?;
        #[cfg(target_os = "macos")]
        {
            let [ids, mask] = &options.input_names;
            macos::load(&artifacts, options.compute_units.as_str(), [ids.as_str(), mask.as_str()], spec.output.as_deref())
        }
        #[cfg(not(target_os = "macos"))]
        {
            let _ = artifacts;
            Err(EngineError::Runtime("the Core ML engine needs macOS".into()))
        }
    }

    fn options(&self, entry: &serde_json::Map<String, serde_json::Value>, paths: PathResolver) -> Result<Options, InvalidOptions> {
        Options::check(entry, |options: &mut CoremlOptions| options.check(paths))
    }

    fn unavailable(&self) -> Option<&'static str> {
        if cfg!(target_os = "macos") {
            None
        } else {
            Some("the Core ML engine needs macOS")
        }
    }
}

/// The artifacts of a model entry: its explicit tables when given, else the
/// eeANE cache directory that `model` names.
pub fn artifacts_of(spec: &EngineSpec, options: &CoremlOptions) -> Result<Artifacts, ArtifactsError> {
    if options.artifacts.is_empty() {
        from_cache_dir(&spec.model_path)
    } else {
        from_tables(&options.artifacts, &options.batch_artifacts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_record(dir: &Path, record: serde_json::Value) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("model_info.json"), record.to_string()).unwrap();
    }

    #[test]
    fn explicit_tables_resolve_and_batch2_needs_its_bucket() {
        let a: BTreeMap<String, PathBuf> = [("128".to_string(), PathBuf::from("/m/s128.mlmodelc")), ("512".into(), "/m/s512.mlmodelc".into())].into();
        let b: BTreeMap<String, PathBuf> = [("128".to_string(), PathBuf::from("/m/s128_b2.mlmodelc"))].into();
        let got = from_tables(&a, &b).unwrap();
        assert_eq!(got.buckets.keys().copied().collect::<Vec<_>>(), [128, 512]);
        assert_eq!(got.batch2[&128], PathBuf::from("/m/s128_b2.mlmodelc"));
        let orphan: BTreeMap<String, PathBuf> = [("256".to_string(), PathBuf::from("/x"))].into();
        assert!(from_tables(&a, &orphan).unwrap_err().to_string().contains("256"));
        let bad: BTreeMap<String, PathBuf> = [("zero".to_string(), PathBuf::from("/x"))].into();
        assert!(from_tables(&bad, &BTreeMap::new()).unwrap_err().to_string().contains("positive"));
        assert!(from_tables(&BTreeMap::new(), &BTreeMap::new()).is_err());
    }

    #[test]
    fn eeane_cache_layout_resolves_with_recommended_buckets() {
        let root = tempfile::tempdir().unwrap();
        let dir = cache_dir_for(root.path(), "intfloat/multilingual-e5-base").unwrap();
        assert!(dir.ends_with("compiled/intfloat--multilingual-e5-base"));
        write_record(
            &dir,
            serde_json::json!({
                "format_version": 2, "kind": "embedding", "tokenizer": "tokenizer.json",
                "artifacts": {"128": "s128_b1.mlmodelc", "512": "s512_b1.mlmodelc", "1024": "s1024_b1.mlmodelc"},
                "batch_artifacts": {"128": "s128_b2.mlmodelc"},
                "recommended_buckets": [128, 512], "output_name": "embeddings", "embedding_dim": 768
            }),
        );
        let got = from_cache_dir(&dir).unwrap();
        assert_eq!(got.buckets.keys().copied().collect::<Vec<_>>(), [128, 512]);
        assert_eq!(got.excluded, [1024]);
        assert_eq!(got.buckets[&512], dir.join("s512_b1.mlmodelc"));
        assert_eq!(got.batch2[&128], dir.join("s128_b2.mlmodelc"));
        assert_eq!(got.tokenizer, Some(dir.join("tokenizer.json")));
        assert_eq!((got.kind.as_deref(), got.embedding_dim, got.output_name.as_deref()), (Some("embedding"), Some(768), Some("embeddings")));
    }

    #[test]
    fn broken_cache_records_are_refused_with_a_reason() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("m");
        assert!(from_cache_dir(&dir).unwrap_err().to_string().contains("eeane compile"));
        let base = serde_json::json!({"format_version": 1, "kind": "embedding", "tokenizer": "t.json", "artifacts": {"128": "a.mlmodelc"}});
        for (field, value, needle) in [
            ("format_version", serde_json::json!(9), "format_version 9"),
            ("kind", serde_json::json!("generator"), "kind"),
            ("tokenizer", serde_json::json!("../../etc/passwd"), "outside"),
            ("artifacts", serde_json::json!({}), "no compiled artifacts"),
            ("recommended_buckets", serde_json::json!([2048]), "none of which"),
        ] {
            let mut record = base.clone();
            record[field] = value;
            write_record(&dir, record);
            let error = from_cache_dir(&dir).unwrap_err();
            assert!(error.0.contains(needle), "{field}: {error}");
        }
        assert!(cache_dir_for(root.path(), "..").is_err());
        assert!(cache_dir_for(root.path(), "../x").unwrap().ends_with("compiled/..--x"), "a hub-style id stays one component");
        assert!(cache_dir_for(root.path(), "").is_err());
    }

    #[test]
    fn buckets_hold_or_truncate() {
        assert_eq!(choose_bucket(&[128, 512], 10), Some((128, false)));
        assert_eq!(choose_bucket(&[128, 512], 128), Some((128, false)));
        assert_eq!(choose_bucket(&[128, 512], 129), Some((512, false)));
        assert_eq!(choose_bucket(&[128, 512], 900), Some((512, true)));
        assert_eq!(choose_bucket(&[], 1), None);
    }

    #[test]
    fn inputs_of_a_bucket_with_a_batch2_artifact_go_in_pairs() {
        let calls = plan_calls(&[10, 300, 20, 30, 400], &[128, 512], &[128]);
        assert_eq!(
            calls,
            [
                Call::Pair { inputs: [0, 2], bucket: 128 },
                Call::Single { input: 3, bucket: 128 },
                Call::Single { input: 1, bucket: 512 },
                Call::Single { input: 4, bucket: 512 }
            ]
        );
        let mut seen: Vec<usize> = calls
            .iter()
            .flat_map(|c| match *c {
                Call::Single { input, .. } => vec![input],
                Call::Pair { inputs, .. } => inputs.to_vec(),
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3, 4], "every input exactly once");
        assert!(plan_calls(&[1, 2], &[128], &[]).iter().all(|c| matches!(c, Call::Single { .. })));
    }

    #[test]
    fn options_are_checked_once_with_paths_resolved() {
        let resolve = |p: &Path| Path::new("/conf").join(p);
        let entry = |v: serde_json::Value| v.as_object().unwrap().clone();
        let ok = Coreml.options(&entry(serde_json::json!({"artifacts": {"128": "s128.mlmodelc"}, "compute_units": "all"})), &resolve).unwrap();
        let typed: CoremlOptions = ok.typed().unwrap();
        assert_eq!(typed.artifacts["128"], PathBuf::from("/conf/s128.mlmodelc"));
        assert_eq!((typed.compute_units, typed.input_names[1].as_str()), (ComputeUnits::All, "attention_mask"));
        for (bad, needle) in [
            (serde_json::json!({"compute_units": "gpu"}), "unknown variant"),
            (serde_json::json!({"batch_artifacts": {"128": "b.mlmodelc"}}), "explicit artifacts"),
            (serde_json::json!({"artifacts": {"zero": "a"}}), "positive"),
            (serde_json::json!({"input_names": ["ids"]}), "2"),
            (serde_json::json!({"spin": true}), "unknown field"),
        ] {
            let error = Coreml.options(&entry(bad.clone()), &resolve).unwrap_err();
            assert!(error.0.contains(needle), "{bad}: {error}");
        }
    }

    #[test]
    fn elsewhere_the_engine_says_it_needs_macos() {
        let error = Coreml.open(None).unwrap_err().to_string();
        if cfg!(not(target_os = "macos")) {
            assert!(error.contains("needs macOS"), "{error}");
        }
    }
}
