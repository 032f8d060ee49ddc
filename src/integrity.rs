//! A model directory prepared by eeane (`eeane pull`, models/prepare.py) has a
//! manifest.json with every file's sha256. Before a model loads, the files of
//! its manifests are checked against it, once per file as long as its size and
//! modification time stay the same: a truncated, corrupted or replaced file
//! then fails its model with a message that says so, instead of loading (a
//! flipped byte in the weights would still parse, and embed wrongly).
//! Directories without a manifest (a user's own files) are not checked.

use crate::manifest::{Manifest, ManifestError};
use crate::sync::Recover;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// Files found intact, with the size and mtime they had then.
static VERIFIED: Mutex<Option<HashMap<PathBuf, (u64, SystemTime)>>> = Mutex::new(None);

fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

fn sha256(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// A prepared model's files do not match its manifest.
#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    #[error("{} is not valid JSON ({reason}); prepare the model again", manifest.display())]
    BadManifest { manifest: PathBuf, reason: String },
    #[error("{} is missing (listed in {}); prepare the model again (eeane pull)", path.display(), manifest.display())]
    Missing { path: PathBuf, manifest: PathBuf },
    #[error("cannot read {}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "{} does not match its manifest (sha256 {digest}, expected {expected}): the file is truncated, corrupted or was replaced; \
         prepare the model again (eeane pull)",
        path.display()
    )]
    Mismatch { path: PathBuf, digest: String, expected: String },
}

/// Checks every file listed by the manifest.json beside each of `paths`.
pub fn verify(paths: &[PathBuf]) -> Result<(), IntegrityError> {
    let mut dirs: Vec<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
    dirs.dedup();
    for dir in dirs {
        let manifest = dir.join(crate::manifest::FILE);
        let parsed = match Manifest::read(dir) {
            Ok(Some(parsed)) => parsed,
            Ok(None) | Err(ManifestError::Read { .. } | ManifestError::Write { .. }) => continue,
            Err(ManifestError::Parse { source, .. }) => return Err(IntegrityError::BadManifest { manifest, reason: source.to_string() }),
        };
        for (name, expected) in &parsed.files {
            let path = dir.join(name);
            let Some(now) = stamp(&path) else {
                return Err(IntegrityError::Missing { path, manifest });
            };
            if VERIFIED.locked().as_ref().and_then(|v| v.get(&path)) == Some(&now) {
                continue;
            }
            let digest = sha256(&path).map_err(|e| IntegrityError::Unreadable { path: path.clone(), reason: e.to_string() })?;
            if digest != *expected {
                return Err(IntegrityError::Mismatch { path, digest, expected: expected.clone() });
            }
            VERIFIED.locked().get_or_insert_with(HashMap::new).insert(path, now);
        }
    }
    Ok(())
}

/// The sha256 the manifest beside `path` records for it, if one does.
pub fn recorded_digest(path: &Path) -> Option<String> {
    Manifest::beside(path)?.files.get(path.file_name()?.to_str()?).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_fails_and_a_directory_without_manifest_passes() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.onnx");
        std::fs::write(&model, b"weights").unwrap();
        assert!(verify(std::slice::from_ref(&model)).is_ok(), "no manifest: not checked");
        let manifest = serde_json::json!({"files": {"model.onnx": format!("{:x}", Sha256::digest(b"weights"))}});
        std::fs::write(dir.path().join("manifest.json"), manifest.to_string()).unwrap();
        assert!(verify(std::slice::from_ref(&model)).is_ok());
        assert_eq!(recorded_digest(&model), Some(format!("{:x}", Sha256::digest(b"weights"))));
        std::fs::write(&model, b"weighs").unwrap();
        let e = verify(std::slice::from_ref(&model)).unwrap_err();
        assert!(matches!(e, IntegrityError::Mismatch { .. }) && e.to_string().contains("does not match its manifest"), "{e}");
        std::fs::remove_file(&model).unwrap();
        assert!(matches!(verify(&[model]).unwrap_err(), IntegrityError::Missing { .. }));
    }
}
