//! A compile cache with a size bound: one folder per compiled model (its
//! graph, precision, device and shapes hashed into the folder's name), the
//! time of its last load in `.last-used`, and the least recently used folders
//! removed once the whole cache is over its bound.
//!
//! A load holds its folder's lock while the runtime writes blobs there. A
//! blob rewritten in place while another load maps it killed that load with
//! SIGBUS (OpenVINO, 2026-12-01); the kernel drops the lock if the process
//! is killed. Eviction skips a folder whose lock is held.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const LOCK: &str = ".lock";
const LAST_USED: &str = ".last-used";
/// What the folder was compiled from, so that `prune` can tell a stale one.
const SOURCE: &str = ".source";

/// One compiled model's folder, locked for the load that uses it.
pub struct CacheFolder {
    pub dir: PathBuf,
    _lock: File,
}

/// The folder name for a compiled model: a hash of everything that makes its
/// blobs differ. std's hasher with its fixed keys: a Rust upgrade that changes
/// it costs one compile per model, never a wrong blob.
pub fn folder_name(graph: &Path, parts: &[&str]) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let meta = std::fs::metadata(graph).ok();
    std::fs::canonicalize(graph).unwrap_or_else(|_| graph.to_path_buf()).hash(&mut hasher);
    meta.as_ref().map(|m| m.len()).hash(&mut hasher);
    meta.as_ref().and_then(|m| m.modified().ok()).hash(&mut hasher);
    parts.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

impl CacheFolder {
    /// Opens (creating) `root/name`, waits for its lock, and stamps its use.
    pub fn open(root: &Path, name: &str, graph: &Path) -> io::Result<Self> {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)?;
        let lock = File::create(dir.join(LOCK))?;
        lock.lock()?;
        std::fs::write(dir.join(LAST_USED), now_secs().to_string())?;
        std::fs::write(dir.join(SOURCE), graph.to_string_lossy().as_bytes())?;
        Ok(Self { dir, _lock: lock })
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One folder of the cache, for `eeane models` and eviction.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheEntry {
    pub dir: PathBuf,
    pub bytes: u64,
    /// Unix seconds of its last load (0: none recorded, a blob of the old flat layout).
    pub last_used: u64,
    /// The graph it was compiled from, when recorded.
    pub source: Option<PathBuf>,
}

fn tree_bytes(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path).map(|d| d.flatten().map(|e| tree_bytes(&e.path())).sum()).unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Every folder (and loose file of the old flat layout) under `root`, least recently used first.
pub fn entries(root: &Path) -> Vec<CacheEntry> {
    let Ok(dir) = std::fs::read_dir(root) else { return Vec::new() };
    let mut entries: Vec<CacheEntry> = dir
        .flatten()
        .filter(|e| e.file_name() != LOCK)
        .map(|e| {
            let path = e.path();
            let read = |name: &str| std::fs::read_to_string(path.join(name)).ok();
            CacheEntry {
                bytes: tree_bytes(&path),
                last_used: read(LAST_USED).and_then(|s| s.trim().parse().ok()).unwrap_or(0),
                source: read(SOURCE).map(PathBuf::from),
                dir: path,
            }
        })
        .collect();
    entries.sort_by_key(|e| (e.last_used, e.dir.clone()));
    entries
}

/// Removes `entry` unless a load holds it; whether it did.
fn remove_unless_in_use(entry: &CacheEntry) -> io::Result<bool> {
    if entry.dir.is_dir() {
        let lock = match File::open(entry.dir.join(LOCK)) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Some(lock) = &lock {
            if lock.try_lock().is_err() {
                return Ok(false);
            }
        }
        std::fs::remove_dir_all(&entry.dir)?;
    } else {
        std::fs::remove_file(&entry.dir)?;
    }
    Ok(true)
}

/// Removes least recently used entries (never `keep`, never one in use)
/// until the cache holds at most `limit` bytes; what it removed.
pub fn evict(root: &Path, limit: u64, keep: Option<&Path>) -> io::Result<Vec<CacheEntry>> {
    let all = entries(root);
    let mut total: u64 = all.iter().map(|e| e.bytes).sum();
    let mut removed = Vec::new();
    for entry in all {
        if total <= limit {
            break;
        }
        if Some(entry.dir.as_path()) == keep {
            continue;
        }
        if remove_unless_in_use(&entry)? {
            total -= entry.bytes;
            removed.push(entry);
        }
    }
    Ok(removed)
}

/// Removes stale entries: those whose graph is gone, loose blobs of the old
/// flat layout, and those unused for `older_than`; then applies `limit`.
pub fn prune(root: &Path, limit: u64, older_than: Duration) -> io::Result<Vec<CacheEntry>> {
    let cutoff = now_secs().saturating_sub(older_than.as_secs());
    let mut removed = Vec::new();
    for entry in entries(root) {
        let stale = entry.last_used == 0 || entry.last_used < cutoff || entry.source.as_ref().is_some_and(|s| !s.exists());
        if stale && remove_unless_in_use(&entry)? {
            removed.push(entry);
        }
    }
    removed.extend(evict(root, limit, None)?);
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(root: &Path, name: &str, bytes: usize, last_used: u64, graph: &Path) {
        let folder = CacheFolder::open(root, name, graph).unwrap();
        std::fs::write(folder.dir.join("blob"), vec![0u8; bytes]).unwrap();
        std::fs::write(folder.dir.join(LAST_USED), last_used.to_string()).unwrap();
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_one_in_use_stays() {
        let (root, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let graph = models.path().join("model.onnx");
        std::fs::write(&graph, b"graph").unwrap();
        fill(root.path(), "old", 1000, 10, &graph);
        fill(root.path(), "mid", 1000, 20, &graph);
        fill(root.path(), "new", 1000, 30, &graph);
        std::fs::write(root.path().join("123.blob"), vec![0u8; 500]).unwrap();
        let held = CacheFolder::open(root.path(), "held", &graph).unwrap();
        std::fs::write(held.dir.join(LAST_USED), "1").unwrap();
        std::fs::write(held.dir.join("blob"), vec![0u8; 1000]).unwrap();

        let removed = evict(root.path(), 3200, Some(&root.path().join("new"))).unwrap();
        let names: Vec<String> = removed.iter().map(|e| e.dir.file_name().unwrap().to_string_lossy().into_owned()).collect();
        // The loose blob (never stamped) first, the held folder skipped, then by age.
        assert_eq!(names, ["123.blob", "old"]);
        assert!(root.path().join("held").exists() && root.path().join("new").exists() && root.path().join("mid").exists());
        drop(held);
        let removed = evict(root.path(), 1500, Some(&root.path().join("new"))).unwrap();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(root.path().join("new").exists());
    }

    #[test]
    fn prune_removes_folders_whose_graph_is_gone() {
        let (root, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (kept, gone) = (models.path().join("kept.onnx"), models.path().join("gone.onnx"));
        std::fs::write(&kept, b"a").unwrap();
        std::fs::write(&gone, b"b").unwrap();
        fill(root.path(), "a", 10, now_secs(), &kept);
        fill(root.path(), "b", 10, now_secs(), &gone);
        std::fs::remove_file(&gone).unwrap();
        let removed = prune(root.path(), u64::MAX, Duration::from_secs(3600)).unwrap();
        assert_eq!(removed.len(), 1);
        assert!(root.path().join("a").exists() && !root.path().join("b").exists());
    }

    #[test]
    fn a_folder_name_changes_with_its_settings() {
        let root = tempfile::tempdir().unwrap();
        let graph = root.path().join("m.onnx");
        std::fs::write(&graph, b"x").unwrap();
        assert_eq!(folder_name(&graph, &["f32"]), folder_name(&graph, &["f32"]));
        assert_ne!(folder_name(&graph, &["f32"]), folder_name(&graph, &["bf16"]));
    }
}
