//! A Hugging Face Hub client for model repositories: resolves a revision to
//! its commit, downloads the files asked for into the standard Hugging Face
//! cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`: `models--ORG--NAME/blobs`,
//! `snapshots/COMMIT`, `refs`), so that what sentence-transformers, TEI or
//! `hf download` fetched is used as it is and the reverse.
//!
//! Written here rather than with the `hf-hub` crate (1.0), which keeps the
//! same cache but neither checks a download against the Hub's sha256 (LFS
//! files) or git blob id (the others), nor resumes an interrupted download
//! (it starts its `.incomplete` file over), nor honours `HF_HUB_OFFLINE`.
//!
//! - Endpoint: `HF_ENDPOINT`, else https://huggingface.co.
//! - Token: `HF_TOKEN`, else the file `HF_TOKEN_PATH`, else `$HF_HOME/token`
//!   (where `hf auth login` writes it). It goes only to the endpoint's host:
//!   a large file's redirect to its storage host is followed without it. It is
//!   never logged or printed.
//! - A file is written to `blobs/ID.incomplete`, resumed from there with a
//!   Range request, checked (LFS: sha256; others: size and git blob id, which
//!   is their ETag), and only then renamed to `blobs/ID` and linked from the
//!   snapshot. A mismatch deletes the partial file.

use super::PullError;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use reqwest::header::{HeaderMap, AUTHORIZATION, LOCATION, RANGE};
use reqwest::StatusCode;
use serde::Deserialize;
use sha1::Sha1;
use sha2::{Digest, Sha256};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Redirects followed for one file (the Hub answers one, to its storage).
const MAX_REDIRECTS: usize = 5;

/// `hf:ORG/NAME[@REVISION]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub repo: String,
    pub revision: String,
}

impl RepoRef {
    pub fn parse(source: &str) -> Result<RepoRef, PullError> {
        let rest = source.strip_prefix("hf:").ok_or_else(|| PullError::Unsupported(format!("{source:?} is not a Hub source (hf:ORG/NAME[@REVISION])")))?;
        let (repo, revision) = rest.split_once('@').unwrap_or((rest, "main"));
        let valid = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && !s.starts_with('.');
        match repo.split_once('/') {
            Some((org, name)) if valid(org) && valid(name) && !revision.is_empty() && !revision.contains("..") => {
                Ok(RepoRef { repo: repo.to_string(), revision: revision.to_string() })
            }
            _ => Err(PullError::Unsupported(format!("{source:?} is not a Hub source: expected hf:ORG/NAME or hf:ORG/NAME@REVISION"))),
        }
    }

    /// The repository's folder in the HF cache.
    pub fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

/// Where the Hub is and what it takes, from the environment.
pub struct Hub {
    pub endpoint: String,
    token: Option<String>,
    /// The HF hub cache: `HF_HUB_CACHE`, else `$HF_HOME/hub`.
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE=1`: only what the cache holds.
    pub offline: bool,
    client: reqwest::Client,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("cache", &self.cache)
            .field("offline", &self.offline)
            .finish()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let cache = env("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env("HOME").unwrap_or_default()).join(".cache"));
        cache.join("huggingface")
    })
}

impl Hub {
    pub fn from_env() -> Result<Hub, PullError> {
        let token = env("HF_TOKEN").or_else(|| {
            let path = env("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home().join("token"));
            std::fs::read_to_string(path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        });
        let cache = env("HF_HUB_CACHE").or_else(|| env("HUGGINGFACE_HUB_CACHE")).map(PathBuf::from).unwrap_or_else(|| hf_home().join("hub"));
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        let client = reqwest::Client::builder()
            .user_agent(concat!("eeane/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(30))
            // Redirects are followed by hand: the token must not go to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| PullError::Remote(format!("cannot start an HTTP client: {e}")))?;
        Ok(Hub { endpoint: env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()).trim_end_matches('/').to_string(), token, cache, offline, client })
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    /// The commit `repo.revision` names and its files, from the Hub.
    pub async fn info(&self, repo: &RepoRef) -> Result<RepoInfo, PullError> {
        let url = format!("{}/api/models/{}/revision/{}?blobs=true", self.endpoint, repo.repo, encode(&repo.revision));
        let response = self.authorized(self.client.get(&url)).send().await.map_err(|e| PullError::Remote(self.unreachable(e)))?;
        if !response.status().is_success() {
            return Err(PullError::Remote(self.refusal(repo, None, response.status(), response.headers())));
        }
        response.json().await.map_err(|e| PullError::Remote(format!("the Hub's answer for {} is not model info: {e}", repo.repo)))
    }

    fn unreachable(&self, e: reqwest::Error) -> String {
        let offline = if self.offline { "" } else { "; with the model already in the HF cache, HF_HUB_OFFLINE=1 serves it without the network" };
        format!("cannot reach the Hugging Face Hub at {} (HF_ENDPOINT): {e}{offline}", self.endpoint)
    }

    /// The message for a refused request, from the Hub's status and X-Error-Code.
    fn refusal(&self, repo: &RepoRef, file: Option<&str>, status: StatusCode, headers: &HeaderMap) -> String {
        let code = headers.get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or("");
        let token = if self.token.is_some() { "the token given (HF_TOKEN) has no access to it" } else { "set HF_TOKEN (or log in with `hf auth login`)" };
        match (status.as_u16(), code) {
            (_, "GatedRepo") => format!("{} is gated: accept its conditions on its Hub page, then {token}", repo.repo),
            (401 | 403, _) => format!("{} was not found or is private ({}): if it is private or gated, {token}", repo.repo, status.as_u16()),
            (404, "RevisionNotFound") => format!("{} has no revision {:?} (a branch, tag or commit)", repo.repo, repo.revision),
            (404, "EntryNotFound") => format!("{} has no file {:?} at {}", repo.repo, file.unwrap_or(""), repo.revision),
            (404, _) if file.is_none() => format!("{}: repository not found on {}", repo.repo, self.endpoint),
            (404, _) => format!("{}: file {:?} not found at {}", repo.repo, file.unwrap_or(""), repo.revision),
            _ => format!("the Hub answered {status} for {}{}", repo.repo, file.map(|f| format!(" file {f:?}")).unwrap_or_default()),
        }
    }

    /// The snapshot folder of `commit`.
    pub fn snapshot_dir(&self, repo: &RepoRef, commit: &str) -> PathBuf {
        self.cache.join(repo.folder()).join("snapshots").join(commit)
    }

    /// The commit the cache has for `repo.revision` (a ref it recorded, or the revision itself).
    pub fn cached_commit(&self, repo: &RepoRef) -> Option<String> {
        if is_commit(&repo.revision) && self.snapshot_dir(repo, &repo.revision).is_dir() {
            return Some(repo.revision.clone());
        }
        let recorded = std::fs::read_to_string(self.cache.join(repo.folder()).join("refs").join(&repo.revision)).ok()?;
        let commit = recorded.trim().to_string();
        self.snapshot_dir(repo, &commit).is_dir().then_some(commit)
    }

    /// Makes the cache hold the files of `repo` that `select` picks from the
    /// repository's listing, at the revision's commit; the snapshot. Offline,
    /// whatever the cache has.
    pub async fn snapshot(&self, repo: &RepoRef, select: impl FnOnce(&[&str]) -> Vec<String>, progress: &dyn Progress) -> Result<Snapshot, PullError> {
        if self.offline {
            let commit = self.cached_commit(repo).ok_or_else(|| {
                PullError::Offline(format!("{}@{} is not in the HF cache ({}) and HF_HUB_OFFLINE is set", repo.repo, repo.revision, self.cache.display()))
            })?;
            return Ok(Snapshot { dir: self.snapshot_dir(repo, &commit), commit, fetched_bytes: 0 });
        }
        let info = self.info(repo).await?;
        let commit = info.sha.clone().ok_or_else(|| PullError::Remote(format!("the Hub's info for {} names no commit", repo.repo)))?;
        let dir = self.snapshot_dir(repo, &commit);
        let mut fetched_bytes = 0;
        let chosen = select(&info.siblings.iter().map(|s| s.rfilename.as_str()).collect::<Vec<_>>());
        for sibling in info.siblings.iter().filter(|s| chosen.contains(&s.rfilename)) {
            fetched_bytes += self.ensure_file(repo, &commit, sibling, progress).await?;
        }
        if repo.revision != commit {
            let refs = self.cache.join(repo.folder()).join("refs");
            write_atomically(&refs.join(&repo.revision), commit.as_bytes())?;
        }
        Ok(Snapshot { dir, commit, fetched_bytes })
    }

    /// One file into blobs/ and the snapshot; the bytes downloaded.
    async fn ensure_file(&self, repo: &RepoRef, commit: &str, sibling: &Sibling, progress: &dyn Progress) -> Result<u64, PullError> {
        let expected = Expected::of(sibling)?;
        let repo_dir = self.cache.join(repo.folder());
        let blob = repo_dir.join("blobs").join(&expected.blob_name);
        let link = self.snapshot_dir(repo, commit).join(&sibling.rfilename);
        if !safe_relative(&sibling.rfilename) {
            return Err(PullError::Unsupported(format!("{} lists a file outside the repository: {:?}", repo.repo, sibling.rfilename)));
        }
        let mut fetched = 0;
        if !blob.is_file() || std::fs::metadata(&blob).map(|m| m.len()).ok() != Some(expected.size) {
            fetched = self.download(repo, commit, &sibling.rfilename, &expected, &blob, progress).await?;
        }
        link_into_snapshot(&blob, &link)?;
        Ok(fetched)
    }

    async fn download(&self, repo: &RepoRef, commit: &str, file: &str, expected: &Expected, blob: &Path, progress: &dyn Progress) -> Result<u64, PullError> {
        let partial = PathBuf::from(format!("{}.incomplete", blob.display()));
        if let Some(parent) = partial.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PullError::Io(format!("cannot create {}: {e}", parent.display())))?;
        }
        let have = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        if have >= expected.size {
            // Whole (or too long): check it as it is, or start over.
            let _ = std::fs::remove_file(&partial);
        }
        let have = if have >= expected.size { 0 } else { have };
        let mut url = format!("{}/{}/resolve/{}/{}", self.endpoint, repo.repo, commit, encode_path(file));
        let mut send_token = true;
        let mut response = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut request = self.client.get(&url);
            if send_token {
                request = self.authorized(request);
            }
            if have > 0 {
                request = request.header(RANGE, format!("bytes={have}-"));
            }
            let answer = request.send().await.map_err(|e| PullError::Remote(self.unreachable(e)))?;
            if answer.status().is_redirection() {
                let location = answer
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| PullError::Remote(format!("a redirect without Location for {file}")))?;
                let next =
                    reqwest::Url::parse(&url).and_then(|base| base.join(location)).map_err(|e| PullError::Remote(format!("a bad redirect for {file}: {e}")))?;
                // The token stays with the Hub's own host.
                let hub = reqwest::Url::parse(&self.endpoint).ok();
                send_token =
                    send_token && hub.is_some_and(|hub| hub.host_str() == next.host_str() && hub.port_or_known_default() == next.port_or_known_default());
                url = next.to_string();
                continue;
            }
            response = Some(answer);
            break;
        }
        let mut response = response.ok_or_else(|| PullError::Remote(format!("too many redirects for {file}")))?;
        let resumed = match response.status() {
            StatusCode::PARTIAL_CONTENT if have > 0 => true,
            s if s.is_success() => false,
            s => return Err(PullError::Remote(self.refusal(repo, Some(file), s, response.headers()))),
        };
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(resumed)
            .truncate(!resumed)
            .open(&partial)
            .map_err(|e| PullError::Io(format!("cannot write {}: {e}", partial.display())))?;
        let mut hash = expected.hasher();
        let mut done = 0u64;
        if resumed {
            let mut existing = std::fs::File::open(&partial).map_err(|e| PullError::Io(format!("cannot read {}: {e}", partial.display())))?;
            std::io::copy(&mut (&mut existing).take(have), &mut hash).map_err(|e| PullError::Io(format!("cannot read {}: {e}", partial.display())))?;
            done = have;
        }
        progress.start(file, done, expected.size);
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                // Kept for the next attempt, which resumes from here.
                Err(e) => {
                    return Err(PullError::Remote(format!(
                        "the download of {file} broke off after {done} of {} bytes ({e}); run it again to resume",
                        expected.size
                    )))
                }
            };
            if let Err(e) = out.write_all(&chunk) {
                // A full disk: the partial file would only hold on to the space.
                let _ = std::fs::remove_file(&partial);
                return Err(PullError::Io(write_failed(&partial, done, &e)));
            }
            hash.update(&chunk);
            done += chunk.len() as u64;
            progress.advance(file, done);
        }
        out.sync_all().map_err(|e| PullError::Io(format!("cannot write {}: {e}", partial.display())))?;
        drop(out);
        progress.finish(file);
        if done != expected.size {
            if done > expected.size {
                let _ = std::fs::remove_file(&partial);
            }
            return Err(PullError::Mismatch(format!("{file}: got {done} bytes, the Hub lists {}; run it again to resume", expected.size)));
        }
        let digest = hash.finish(expected.size);
        if digest != expected.digest {
            let _ = std::fs::remove_file(&partial);
            return Err(PullError::Mismatch(format!("{file}: the download's {} is {digest}, the Hub lists {}; nothing kept", expected.kind, expected.digest)));
        }
        std::fs::rename(&partial, blob).map_err(|e| PullError::Io(format!("cannot move {} into place: {e}", blob.display())))?;
        Ok(done - have.min(done))
    }
}

/// What a file must be, from the Hub's listing.
struct Expected {
    blob_name: String,
    size: u64,
    digest: String,
    /// "sha256" or "git blob id".
    kind: &'static str,
    lfs: bool,
}

impl Expected {
    fn of(sibling: &Sibling) -> Result<Expected, PullError> {
        match (&sibling.lfs, &sibling.blob_id, sibling.size) {
            (Some(lfs), _, _) => Ok(Expected { blob_name: lfs.sha256.clone(), size: lfs.size, digest: lfs.sha256.clone(), kind: "sha256", lfs: true }),
            (None, Some(id), Some(size)) => Ok(Expected { blob_name: id.clone(), size, digest: id.clone(), kind: "git blob id", lfs: false }),
            _ => Err(PullError::Remote(format!("the Hub's listing gives no size or id for {}", sibling.rfilename))),
        }
    }

    fn hasher(&self) -> FileHash {
        if self.lfs {
            FileHash::Sha256(Sha256::new())
        } else {
            FileHash::GitBlob(Vec::new())
        }
    }
}

/// sha256 of the bytes (LFS files), or the git blob id: sha1 of
/// `blob SIZE\0` and the bytes (the others, small enough to hold).
enum FileHash {
    Sha256(Sha256),
    GitBlob(Vec<u8>),
}

impl FileHash {
    fn update(&mut self, bytes: &[u8]) {
        match self {
            FileHash::Sha256(h) => h.update(bytes),
            FileHash::GitBlob(all) => all.extend_from_slice(bytes),
        }
    }

    fn finish(self, size: u64) -> String {
        match self {
            FileHash::Sha256(h) => format!("{:x}", h.finalize()),
            FileHash::GitBlob(all) => {
                let mut h = Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                h.update(&all);
                format!("{:x}", h.finalize())
            }
        }
    }
}

impl Write for FileHash {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Download progress: a bar on a terminal, log lines in the server.
pub trait Progress {
    fn start(&self, file: &str, done: u64, total: u64);
    fn advance(&self, file: &str, done: u64);
    fn finish(&self, file: &str);
}

/// The model info the client reads (`/api/models/REPO/revision/REV?blobs=true`).
#[derive(Debug, Deserialize)]
pub struct RepoInfo {
    pub sha: Option<String>,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    #[serde(rename = "blobId")]
    pub blob_id: Option<String>,
    pub size: Option<u64>,
    pub lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
pub struct Lfs {
    pub sha256: String,
    pub size: u64,
}

/// A repository's files at one commit, in the HF cache.
#[derive(Debug)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub commit: String,
    pub fetched_bytes: u64,
}

/// The message for a failed write, saying so when the disk is full.
fn write_failed(path: &Path, done: u64, e: &std::io::Error) -> String {
    // ENOSPC, EFBIG (a file-size limit), EDQUOT.
    let full = matches!(e.raw_os_error(), Some(28 | 27 | 122)) || e.kind() == std::io::ErrorKind::StorageFull;
    if full {
        format!("the disk is full: cannot write {} after {done} bytes ({e}); nothing of it is kept: free space and pull again", path.display())
    } else {
        format!("cannot write {} after {done} bytes: {e}", path.display())
    }
}

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit())
}

/// A repository path that stays inside the snapshot.
fn safe_relative(path: &str) -> bool {
    !path.is_empty() && !path.starts_with('/') && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

/// A revision as one URL path segment (a branch may hold '/': refs/pr/1).
fn encode(revision: &str) -> String {
    revision.replace('%', "%25").replace('/', "%2F").replace(' ', "%20")
}

fn encode_path(path: &str) -> String {
    path.split('/').map(|p| p.replace('%', "%25").replace(' ', "%20").replace('#', "%23").replace('?', "%3F")).collect::<Vec<_>>().join("/")
}

/// The snapshot's entry for a file: a relative symlink to its blob, as
/// huggingface_hub makes it (a copy where links are not available).
fn link_into_snapshot(blob: &Path, link: &Path) -> Result<(), PullError> {
    let parent = link.parent().expect("a snapshot file has a folder");
    std::fs::create_dir_all(parent).map_err(|e| PullError::Io(format!("cannot create {}: {e}", parent.display())))?;
    if link.exists() && std::fs::canonicalize(link).ok() == std::fs::canonicalize(blob).ok() {
        return Ok(());
    }
    let _ = std::fs::remove_file(link);
    #[cfg(unix)]
    {
        // snapshots/COMMIT/a/b -> ../../../blobs/ID: up through the file's
        // folders, the commit and snapshots/.
        let depth = link.strip_prefix(blob.parent().and_then(Path::parent).expect("blobs/ is in the repo folder")).map(|p| p.components().count()).unwrap_or(3);
        let target = PathBuf::from("../".repeat(depth - 1)).join("blobs").join(blob.file_name().expect("a blob has a name"));
        std::os::unix::fs::symlink(&target, link).map_err(|e| PullError::Io(format!("cannot link {}: {e}", link.display())))
    }
    #[cfg(not(unix))]
    std::fs::copy(blob, link).map(|_| ()).map_err(|e| format!("cannot copy {} to {}: {e}", blob.display(), link.display()))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PullError> {
    let parent = path.parent().expect("a ref has a folder");
    std::fs::create_dir_all(parent).map_err(|e| PullError::Io(format!("cannot create {}: {e}", parent.display())))?;
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| PullError::Io(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!(RepoRef::parse("hf:BAAI/bge-small-en-v1.5").unwrap(), RepoRef { repo: "BAAI/bge-small-en-v1.5".into(), revision: "main".into() });
        assert_eq!(RepoRef::parse("hf:org/name@v1.0").unwrap().revision, "v1.0");
        assert_eq!(RepoRef::parse("hf:org/name").unwrap().folder(), "models--org--name");
        for bad in ["BAAI/bge", "hf:bge", "hf:a/b/c", "hf:../x", "hf:a/b@", "hf:/b"] {
            assert!(RepoRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn git_blob_id_is_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        let mut hash = FileHash::GitBlob(Vec::new());
        hash.update(b"hello\n");
        assert_eq!(hash.finish(6), "ce013625030ba8dba906f756967f9e9ca394464a");
    }

    #[test]
    fn paths_stay_inside() {
        assert!(safe_relative("1_Pooling/config.json"));
        for bad in ["../x", "/etc/passwd", "a/../../b", "a//b", ""] {
            assert!(!safe_relative(bad), "{bad}");
        }
    }
}
