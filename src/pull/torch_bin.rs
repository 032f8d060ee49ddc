//! PyTorch weights for a repository that ships no safetensors:
//! `pytorch_model.bin`, or its shards (`pytorch_model-00001-of-00002.bin`,
//! ...) with `pytorch_model.bin.index.json`. They are fetched in place of
//! safetensors, and `models/torch_bin.py` converts them once to
//! model.safetensors in the prepared model's folder, reading their pickle
//! with an unpickler that allows only what a state dict needs (a file that
//! names any other global, such as os.system, is refused and nothing of it
//! is kept). The HF cache keeps the repository's files as they are.

use std::path::Path;

use crate::manifest::HubSettings;

pub const WEIGHTS: &str = "pytorch_model.bin";
pub const INDEX: &str = "pytorch_model.bin.index.json";

/// `pytorch_model-00001-of-00002.bin`, as transformers names a shard.
fn is_shard(file: &str) -> bool {
    let Some(middle) = file.strip_prefix("pytorch_model-").and_then(|f| f.strip_suffix(".bin")) else { return false };
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    middle.split_once("-of-").is_some_and(|(part, of)| digits(part) && digits(of))
}

/// The PyTorch weights to fetch, from a repository's listing: none when it
/// has safetensors at its top level (they are read instead); else
/// pytorch_model.bin; else, beside its index, every shard.
pub fn select(listing: &[&str]) -> Vec<String> {
    if listing.iter().any(|f| f.ends_with(".safetensors") && !f.contains('/')) {
        return Vec::new();
    }
    if listing.contains(&WEIGHTS) {
        return vec![WEIGHTS.to_string()];
    }
    if !listing.contains(&INDEX) {
        return Vec::new();
    }
    listing.iter().filter(|f| is_shard(f)).map(|f| f.to_string()).collect()
}

/// The file that names a snapshot's PyTorch weights (pytorch_model.bin, else
/// its index), when it holds them and no safetensors at its top level.
pub fn in_snapshot(dir: &Path) -> Option<&'static str> {
    let safetensors = std::fs::read_dir(dir).ok()?.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".safetensors")) && e.path().is_file());
    if safetensors {
        return None;
    }
    [WEIGHTS, INDEX].into_iter().find(|f| dir.join(f).is_file())
}

/// The settings recorded in the manifest and the printed entry, saying that
/// the graph's weights come from `file`, converted to model.safetensors.
pub fn converted(settings: &mut HubSettings, entry: &str, file: &str) -> String {
    let how = format!("{file}, converted to model.safetensors without running its pickle");
    settings.weights = how.clone();
    entry.replace(", graph built from model.safetensors", &format!(", graph built from {how}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::target::Target;

    #[test]
    fn pytorch_weights_come_only_without_safetensors() {
        assert_eq!(select(&["config.json", "pytorch_model.bin", "tf_model.h5", "training_args.bin"]), ["pytorch_model.bin"]);
        let sharded = [
            "config.json",
            "pytorch_model-00001-of-00002.bin",
            "pytorch_model-00002-of-00002.bin",
            "pytorch_model.bin.index.json",
            "pytorch_model.fp16-00001-of-00001.bin",
            "pytorch_model-1-of-2-extra.bin",
            "training_args.bin",
        ];
        assert_eq!(select(&sharded), ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]);
        // Shards without their index, or beside pytorch_model.bin: not taken.
        assert!(select(&sharded[..3]).is_empty());
        assert_eq!(select(&["pytorch_model.bin", "pytorch_model-00001-of-00001.bin", "pytorch_model.bin.index.json"]), ["pytorch_model.bin"]);
        // Safetensors (one file or shards) are read instead.
        assert!(select(&["config.json", "model.safetensors", "pytorch_model.bin"]).is_empty());
        assert!(select(&["model-00001-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin"]).is_empty());
        // A Dense module's safetensors are not the encoder's.
        assert_eq!(select(&["2_Dense/model.safetensors", "pytorch_model.bin"]), ["pytorch_model.bin"]);
    }

    #[test]
    fn a_snapshot_names_its_pytorch_weights() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(in_snapshot(dir.path()), None);
        std::fs::write(dir.path().join(INDEX), "{}").unwrap();
        assert_eq!(in_snapshot(dir.path()), Some(INDEX));
        std::fs::write(dir.path().join(WEIGHTS), "x").unwrap();
        assert_eq!(in_snapshot(dir.path()), Some(WEIGHTS));
        std::fs::write(dir.path().join("model.safetensors"), "x").unwrap();
        assert_eq!(in_snapshot(dir.path()), None);
    }

    #[test]
    fn the_entry_and_settings_name_the_converted_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), r#"{"architectures": ["BertForMaskedLM"], "model_type": "bert"}"#).unwrap();
        let model = crate::pull::st::StModel::read(dir.path(), "org/old", false).unwrap();
        let mut settings = model.settings();
        let entry = converted(&mut settings, &model.entry("org/old", "abc", "hf--org--old", &Target::default_engine()), WEIGHTS);
        assert!(entry.contains("graph built from pytorch_model.bin, converted to model.safetensors without running its pickle"), "{entry}");
        assert_eq!(settings.weights, "pytorch_model.bin, converted to model.safetensors without running its pickle");
    }
}
