//! `eeane pull hf:ORG/NAME[@REVISION]`: the files a sentence-transformers
//! model is made of, from the Hub into the HF cache (`hub`).

use super::PullError;
use std::path::Path;

use indicatif::ProgressBar;

/// The CLI's progress: a bar per file.
pub fn bars() -> impl Progress {
    Bars(Default::default())
}

use super::hub::{Hub, Progress, RepoRef};
use super::st::StModel;
pub use super::target::Target;
use crate::manifest::Manifest;

/// The files of a repository that serving it needs: the configs
/// sentence-transformers and transformers read, the tokenizer, each module's
/// folder (pooling, dense), and one set of weights: the repository's own
/// ONNX (`onnx/model.onnx` and its external data) when it ships one, else the
/// safetensors (sharded or not), else PyTorch's pytorch_model.bin or its
/// shards (`torch_bin`). Other formats (TensorFlow, Flax, OpenVINO, other
/// ONNX variants), READMEs and images are left.
/// With `onnx_file` (a variant such as onnx/model_O4.onnx), that file and its
/// external data too, beside the fp32 weights it is checked against; for
/// ncnn, the safetensors whatever else the repository ships.
pub fn select_files(listing: &[&str], target: &Target) -> Vec<String> {
    let onnx = listing.contains(&"onnx/model.onnx") && target.reads_repository_onnx();
    let onnx_file = target.onnx_file.as_deref();
    let variant = |f: &str| onnx_file.is_some_and(|v| f == v || f.strip_prefix(v).is_some_and(|rest| rest == "_data" || rest == ".data"));
    let config_or_tokenizer = |f: &str| {
        let name = f.rsplit('/').next().unwrap_or(f);
        (name.ends_with(".json") && !f.starts_with("onnx/") && !f.starts_with("openvino/"))
            || matches!(name, "vocab.txt" | "merges.txt" | "sentencepiece.bpe.model" | "spiece.model" | "tokenizer.model" | "vocab.json")
    };
    // A module's own weights (2_Dense/model.safetensors) come whatever graph is served.
    let module_weights = |f: &str| f.ends_with(".safetensors") && f.split('/').count() == 2 && !f.starts_with("onnx/");
    let pytorch = super::torch_bin::select(listing);
    let weights = |f: &str| {
        if onnx {
            f == "onnx/model.onnx" || f.starts_with("onnx/model.onnx_data") || f == "onnx/model.onnx.data" || module_weights(f)
        } else {
            f.ends_with(".safetensors") && !f.contains('/') || module_weights(f) || pytorch.iter().any(|p| p == f)
        }
    };
    listing.iter().filter(|f| config_or_tokenizer(f) || weights(f) || variant(f)).map(|f| f.to_string()).collect()
}

/// A progress bar per file on the terminal (stderr).
struct Bars(std::cell::RefCell<Option<ProgressBar>>);

impl Progress for Bars {
    fn start(&self, file: &str, done: u64, total: u64) {
        let bar = super::download::progress_bar(file, total);
        bar.set_position(done);
        *self.0.borrow_mut() = Some(bar);
    }

    fn advance(&self, _file: &str, done: u64) {
        if let Some(bar) = self.0.borrow().as_ref() {
            bar.set_position(done);
        }
    }

    fn finish(&self, _file: &str) {
        if let Some(bar) = self.0.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }
}

/// What a `source` entry resolves to.
pub struct Resolved {
    /// The prepared model's folder under `{cache}/models`.
    pub dir_name: String,
    pub commit: String,
    pub model: StModel,
}

fn dir_name(repo: &RepoRef, target: &Target) -> String {
    let variant =
        target.onnx_file.as_ref().map(|f| format!("--{}", f.trim_start_matches("onnx/").trim_end_matches(".onnx").replace('/', "-"))).unwrap_or_default();
    format!("hf--{}{variant}{}", repo.repo.replace('/', "--"), target.preparation.folder_suffix)
}

/// Runs `work` on a thread of its own: the Hub client drives its own
/// runtime, which must not start inside the server's (a reload runs there).
fn off_runtime<T: Send + 'static>(work: impl FnOnce() -> Result<T, PullError> + Send + 'static) -> Result<T, PullError> {
    std::thread::spawn(work).join().map_err(|_| PullError::Remote("the Hub client panicked".to_string()))?
}

/// The configs of `repo` fetched (small JSON files only); whether it ships onnx/model.onnx.
fn fetch_configs(hub: &Hub, repo: &RepoRef, progress: &dyn Progress) -> Result<(super::hub::Snapshot, bool), PullError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| PullError::Io(e.to_string()))?;
    let listing = std::cell::RefCell::new(Vec::new());
    let configs = runtime.block_on(hub.snapshot(
        repo,
        |all: &[&str]| {
            *listing.borrow_mut() = all.iter().map(|f| f.to_string()).collect();
            select_files(all, &Target::default_engine()).into_iter().filter(|f| f.ends_with(".json")).collect()
        },
        progress,
    ))?;
    let ships_onnx = listing.borrow().iter().any(|f| f == "onnx/model.onnx") || configs.dir.join("onnx/model.onnx").is_file();
    Ok((configs, ships_onnx))
}

/// Reads `source` as sentence-transformers would, from the HF cache when it
/// has the revision's configs, else (with `downloads`) from the Hub's config
/// files alone; the weights are left for `ensure_prepared`.
pub fn resolve(source: &str, downloads: bool, target: &Target) -> Result<Resolved, PullError> {
    let repo = RepoRef::parse(source)?;
    let mut hub = Hub::from_env()?;
    hub.offline |= !downloads;
    let cached = hub.cached_commit(&repo).filter(|commit| hub.snapshot_dir(&repo, commit).join("config.json").is_file());
    let (dir, commit, ships_onnx) = match cached {
        Some(commit) => {
            let dir = hub.snapshot_dir(&repo, &commit);
            let onnx = dir.join("onnx/model.onnx").is_file();
            (dir, commit, onnx)
        }
        None if hub.offline => {
            let why = if downloads { "HF_HUB_OFFLINE is set" } else { "server.hub_downloads = false" };
            return Err(PullError::Offline(format!(
                "{}@{} is not in the HF cache ({}) and {why}; run `eeane pull {source}` where the Hub is reachable",
                repo.repo,
                repo.revision,
                hub.cache.display()
            )));
        }
        None => {
            let (hub, repo) = (hub, repo.clone());
            let (snapshot, onnx) = off_runtime(move || fetch_configs(&hub, &repo, &Quiet))?;
            (snapshot.dir, snapshot.commit, onnx)
        }
    };
    let model = read_for(&dir, &repo.repo, ships_onnx, target)?;
    Ok(Resolved { dir_name: dir_name(&repo, target), commit, model })
}

/// The repository read for `target`: an engine that converts from
/// safetensors ignores the repository's own ONNX, and may serve embeddings only.
fn read_for(dir: &Path, repo: &str, ships_onnx: bool, target: &Target) -> Result<StModel, PullError> {
    let model = StModel::read(dir, repo, ships_onnx && target.reads_repository_onnx())?;
    if model.family.is_some_and(|f| !f.converted) && !target.reads_repository_onnx() {
        let default = crate::engines::default_engine().name();
        return Err(PullError::Unsupported(format!(
            "{repo} is a {}; the {} engine's graph is converted from the graphs of {} only (use engine = {default:?})",
            model.architecture,
            target.engine,
            super::families::architectures(true).join(", ")
        )));
    }
    if !model.dense.is_empty() && !target.reads_repository_onnx() {
        let default = crate::engines::default_engine().name();
        return Err(PullError::Unsupported(format!(
            "{repo} has Dense modules after pooling, which eeane applies inside the ONNX graph; the {} engine's converted graph does not carry them yet (use engine = {default:?})",
            target.engine
        )));
    }
    if model.reranker && !target.preparation.serves_rerankers {
        let default = crate::engines::default_engine().name();
        return Err(PullError::Unsupported(format!(
            "{repo} is a cross-encoder; the {} engine serves embedding models (use engine = {default:?})",
            target.engine
        )));
    }
    Ok(model)
}

/// Makes `{cache}/models/hf--ORG--NAME` hold `source`'s prepared model at the
/// commit it resolves to, fetching and preparing it when it does not (with
/// `downloads`); progress goes to the log.
pub fn ensure_prepared(source: &str, cache: &Path, downloads: bool, target: &Target) -> Result<(), PullError> {
    let resolved = resolve(source, downloads, target)?;
    let repo = RepoRef::parse(source)?;
    let pinned = format!("hf:{}@{}", repo.repo, resolved.commit);
    let out = cache.join("models").join(&resolved.dir_name);
    if is_prepared(&out, &pinned, target) {
        return Ok(());
    }
    if !downloads {
        return Err(PullError::Offline(format!("{source} is not prepared in {} and server.hub_downloads = false; run `eeane pull {source}`", out.display())));
    }
    let (cache, target) = (cache.to_path_buf(), target.clone());
    off_runtime(move || {
        // Another entry (or `eeane pull`) may be preparing it: wait, then look again.
        let _lock = lock_repo(&cache, &repo)?;
        if is_prepared(&out, &pinned, &target) {
            return Ok(());
        }
        tracing::info!(source = %pinned, "fetching and preparing a Hub model");
        pull_unlocked(&pinned, &cache, false, &target, &LogProgress::default()).map(drop)
    })
}

/// Whether `out` holds the model prepared from `pinned` (hf:REPO@COMMIT) for
/// `target`, with its device graph made (or refused, with why) when it asks for one.
fn is_prepared(out: &Path, pinned: &str, target: &Target) -> bool {
    let device_graph = |m: &Manifest| target.device_graph.is_none_or(|g| m.checks.contains_key(g.manifest_check));
    Manifest::find(out).is_some_and(|m| m.source.hub.as_deref() == Some(pinned) && device_graph(&m)) && out.join(target.model_file()).is_file()
}

/// An exclusive lock on preparing `repo` in `cache` (released when dropped):
/// two entries of one repository, or a server and `eeane pull`, never write
/// its blobs or its prepared folder at once.
fn lock_repo(cache: &Path, repo: &RepoRef) -> Result<std::fs::File, PullError> {
    let dir = cache.join("models");
    std::fs::create_dir_all(&dir).map_err(|e| PullError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join(format!(".hf--{}.lock", repo.repo.replace('/', "--")));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| PullError::Io(format!("cannot open {}: {e}", path.display())))?;
    file.lock().map_err(|e| PullError::Io(format!("cannot lock {}: {e}", path.display())))?;
    Ok(file)
}

/// Downloads `source`'s files into the HF cache, reads them as
/// sentence-transformers does, prepares the ONNX model under
/// `{cache}/models/hf--ORG--NAME` (models/prepare.py, checked against the
/// numpy reference) and returns the `[[models]]` entry that serves it; with
/// `download_only`, where the files are.
pub fn pull(source: &str, cache: &Path, download_only: bool, target: &Target, progress: &dyn Progress) -> Result<String, PullError> {
    let _lock = lock_repo(cache, &RepoRef::parse(source)?)?;
    pull_unlocked(source, cache, download_only, target, progress)
}

fn pull_unlocked(source: &str, cache: &Path, download_only: bool, target: &Target, progress: &dyn Progress) -> Result<String, PullError> {
    let repo = RepoRef::parse(source)?;
    let hub = Hub::from_env()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| PullError::Io(e.to_string()))?;
    // The configs first: an architecture eeane cannot serve is refused before the weights come.
    let (configs, ships_onnx) = fetch_configs(&hub, &repo, progress)?;
    let model = read_for(&configs.dir, &repo.repo, ships_onnx, target)?;
    // Preparing holds the weights in fp32 (the graph is built, then run by
    // its checks): a model this machine cannot hold is refused, before its
    // shards come when its index says its size.
    let prepared = cache.join("models").join(dir_name(&repo, target));
    let available = if download_only { None } else { super::size::available() };
    if let (Some(available), None) = (&available, &model.onnx) {
        if let Some(why) = super::size::index_estimate(&configs.dir).and_then(|w| super::size::prepare_refusal(source, w, 4, available, &prepared)) {
            return Err(PullError::Memory(why));
        }
    }
    let snapshot = runtime.block_on(hub.snapshot(&repo, |listing| select_files(listing, target), progress))?;
    if let Some(file) = target.onnx_file.as_deref().filter(|f| !snapshot.dir.join(f).is_file()) {
        return Err(PullError::Unsupported(format!("{} has no {file} at {}", repo.repo, snapshot.commit)));
    }
    let pytorch = super::torch_bin::in_snapshot(&snapshot.dir).filter(|_| model.onnx.is_none());
    if model.onnx.is_none() && pytorch.is_none() {
        // model.safetensors, or the shards model.safetensors.index.json names.
        super::size::checkpoint_files(&snapshot.dir).map_err(|why| {
            PullError::Unsupported(format!(
                "{} at {}: {why}, nor pytorch_model.bin (eeane builds {} graphs from its weights)",
                repo.repo,
                snapshot.commit,
                if target.reads_repository_onnx() { "ONNX" } else { target.engine }
            ))
        })?;
    }
    if let Some(available) = &available {
        if let Some((weights, per)) = super::size::repository_weights(&snapshot.dir, model.onnx.as_deref()) {
            if let Some(why) = super::size::prepare_refusal(source, weights, per, available, &prepared) {
                return Err(PullError::Memory(why));
            }
        }
    }
    eprintln!(
        "{}@{}: commit {}, {:.1} MiB downloaded, in {}",
        repo.repo,
        repo.revision,
        snapshot.commit,
        snapshot.fetched_bytes as f64 / (1 << 20) as f64,
        snapshot.dir.display()
    );
    if download_only {
        return Ok(format!("# {} at commit {}\n# files: {}\n", repo.repo, snapshot.commit, snapshot.dir.display()));
    }
    let dir_name = dir_name(&repo, target);
    let pinned = format!("hf:{}@{}", repo.repo, snapshot.commit);
    let mut settings = model.settings();
    let entry = model.entry(&repo.repo, &snapshot.commit, &dir_name, target);
    let entry = match pytorch {
        Some(file) => super::torch_bin::converted(&mut settings, &entry, file),
        None => entry,
    };
    let settings = serde_json::to_string(&settings).map_err(|e| PullError::Io(format!("cannot write the settings for models/prepare.py: {e}")))?;
    let mut args = vec![
        "--hf-snapshot".into(),
        snapshot.dir.display().to_string(),
        "--name".into(),
        dir_name.clone(),
        "--source".into(),
        pinned,
        "--settings".into(),
        settings,
    ];
    if let Some(file) = &target.onnx_file {
        args.extend(["--onnx-file".to_string(), file.clone()]);
    }
    if let Some(flag) = target.preparation.converter_flag {
        args.push(flag.into());
    }
    if let Some(graph) = target.device_graph {
        args.push(graph.prepare_flag.into());
    }
    super::run_prepare(cache, &args, target.preparation.setup_extra.unwrap_or(""))?;
    Ok(entry)
}

/// No progress shown (the config files are a few kilobytes).
struct Quiet;

impl Progress for Quiet {
    fn start(&self, _: &str, _: u64, _: u64) {}
    fn advance(&self, _: &str, _: u64) {}
    fn finish(&self, _: &str) {}
}

/// Progress as log lines: at the start, every 5 s, and at the end of each file.
#[derive(Default)]
pub struct LogProgress(std::cell::Cell<Option<(std::time::Instant, u64)>>);

impl Progress for LogProgress {
    fn start(&self, file: &str, done: u64, total: u64) {
        tracing::info!(file, done, total, "downloading");
        self.0.set(Some((std::time::Instant::now(), total)));
    }

    fn advance(&self, file: &str, done: u64) {
        if let Some((last, total)) = self.0.get() {
            if last.elapsed() >= std::time::Duration::from_secs(5) {
                tracing::info!(file, done, total, percent = format!("{:.0}", done as f64 * 100.0 / total.max(1) as f64), "downloading");
                self.0.set(Some((std::time::Instant::now(), total)));
            }
        }
    }

    fn finish(&self, file: &str) {
        tracing::info!(file, "downloaded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eeane_backend_core::HubPreparation;

    #[test]
    fn picks_configs_tokenizer_modules_and_one_set_of_weights() {
        let st = [
            ".gitattributes",
            "1_Pooling/config.json",
            "README.md",
            "config.json",
            "config_sentence_transformers.json",
            "model.safetensors",
            "modules.json",
            "pytorch_model.bin",
            "sentence_bert_config.json",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
            "tf_model.h5",
            "openvino/openvino_model.xml",
            "onnx/model_O4.onnx",
            "2_Dense/config.json",
            "2_Dense/model.safetensors",
        ];
        let chosen = select_files(&st, &Target::default_engine());
        for f in ["1_Pooling/config.json", "config.json", "model.safetensors", "modules.json", "tokenizer.json", "vocab.txt", "2_Dense/model.safetensors"] {
            assert!(chosen.contains(&f.to_string()), "{f} not chosen: {chosen:?}");
        }
        for f in ["pytorch_model.bin", "tf_model.h5", "README.md", "onnx/model_O4.onnx", "openvino/openvino_model.xml"] {
            assert!(!chosen.contains(&f.to_string()), "{f} chosen");
        }
        // A sharded checkpoint: every shard and the index.
        let sharded = [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin.index.json",
            "tokenizer.json",
        ];
        assert_eq!(select_files(&sharded, &Target::default_engine()), sharded, "every shard and index is taken (a .bin index is a small JSON file)");
        let with_onnx = ["config.json", "model.safetensors", "onnx/model.onnx", "onnx/model.onnx_data", "onnx/model_quantized.onnx", "tokenizer.json"];
        assert_eq!(select_files(&with_onnx, &Target::default_engine()), ["config.json", "onnx/model.onnx", "onnx/model.onnx_data", "tokenizer.json"]);
        // A Dense module's weights come with the repository's graph too.
        let with_dense = ["2_Dense/config.json", "2_Dense/model.safetensors", "model.safetensors", "onnx/model.onnx"];
        assert_eq!(select_files(&with_dense, &Target::default_engine()), ["2_Dense/config.json", "2_Dense/model.safetensors", "onnx/model.onnx"]);
        assert_eq!(
            select_files(&with_onnx, &Target { onnx_file: Some("onnx/model_quantized.onnx".into()), ..Target::default_engine() }),
            ["config.json", "onnx/model.onnx", "onnx/model.onnx_data", "onnx/model_quantized.onnx", "tokenizer.json"]
        );
        // An engine that converts from safetensors takes them, whatever ONNX the repository ships.
        let converting = HubPreparation { reads_repository_onnx: false, ..HubPreparation::ONNX };
        let target = Target { engine: "converting", preparation: converting, onnx_file: None, device_graph: None };
        assert_eq!(select_files(&with_onnx, &target), ["config.json", "model.safetensors", "tokenizer.json"]);
        for engine in crate::engines::ENGINES.iter().filter(|e| e.hub_preparation().is_some_and(|p| !p.reads_repository_onnx)) {
            let refused = Target::for_engine(engine.name(), Some("onnx/model_O4.onnx")).unwrap_err().to_string();
            assert!(refused.contains("onnx_file"), "{refused}");
        }
    }
}
