//! Each entry's size: its parameter count (`pull::size`), the memory its
//! weights take in each precision it can be served in, and the refusal of a
//! load whose weights this machine cannot hold. `eeane check-config` prints
//! the sizes as TOML comments above each entry; `LoadedModel::load` asks
//! `memory_refusal` before it starts an engine.

use eeane_backend_core::{CpuFeatures, GraphKind};

use super::{AutoPrecision, Config, ModelConfig};
use crate::pull::size::{self, bytes_per_parameter, human_bytes, human_parameters, Available, Need, Weights};

/// A precision as one name: "fp32" for f32, "fp16" for f16.
fn normal(precision: &str) -> String {
    match precision.to_ascii_lowercase().as_str() {
        "f32" | "float32" => "fp32".into(),
        "f16" | "float16" => "fp16".into(),
        other => other.to_string(),
    }
}

impl ModelConfig {
    /// Its model file's size (`pull::size::prepared`), `None` when the file
    /// is not there or its format is not counted.
    pub fn weights(&self) -> Option<Weights> {
        size::prepared(&self.model.path())
    }

    /// Bytes on disk of its model file and the weights its format keeps
    /// beside it: an ONNX graph's external data (`{file}_data` or
    /// `{file}.data`, how exporters name it), the `.bin` of an ncnn `.param`
    /// or an OpenVINO `.xml`.
    pub fn stored_bytes(&self) -> u64 {
        let model = self.model.path();
        let name = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut files = vec![model.clone(), model.with_file_name(format!("{name}_data")), model.with_file_name(format!("{name}.data"))];
        if model.extension().is_some_and(|e| e == "param" || e == "xml") {
            files.push(model.with_extension("bin"));
        }
        files.iter().filter_map(|f| std::fs::metadata(f).ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
    }

    /// The precision its weights are held in as it is configured, and the
    /// bytes a parameter takes: the precision its engine keys select, else
    /// the graph's own (its stored bytes over its parameters, rounded; fp32
    /// for a graph eeane built, whose manifest gives the count).
    fn held_as(&self, weights: &Weights) -> (String, u64) {
        if let Some((precision, bytes)) = self.configured_precision().and_then(|p| bytes_per_parameter(&p).map(|b| (normal(&p), b))) {
            return (precision, bytes);
        }
        match weights.stored_bytes {
            Some(stored) if weights.parameters > 0 => {
                let per = ((stored + weights.parameters / 2) / weights.parameters).max(1);
                let name = match per {
                    4 => "fp32",
                    2 => "16-bit",
                    1 => "int8",
                    _ => "as stored",
                };
                (name.into(), per)
            }
            _ => ("fp32".into(), 4),
        }
    }

    /// The engines `precision = "auto"` may choose among, or its own.
    fn candidate_engines(&self) -> Vec<&'static dyn eeane_backend_core::Backend> {
        match self.auto_precision {
            Some(AutoPrecision::AnyEngine) => crate::engines::ENGINES.iter().copied().filter(|e| e.unavailable().is_none()).collect(),
            _ => crate::engines::find(&self.engine).into_iter().collect(),
        }
    }

    /// The precisions below `per` bytes that an engine offers for an fp32
    /// graph on some CPU, as the keys that select them: `engine = "NAME",
    /// precision = "bf16"`.
    fn reduced_offers(&self, per: u64) -> Vec<String> {
        let any_cpu = CpuFeatures { bf16: true, int8_dot: true };
        let mut offers = Vec::new();
        for engine in crate::engines::ENGINES.iter().filter(|e| e.unavailable().is_none()) {
            for offer in engine.cpu_precisions(GraphKind::Float32, &any_cpu) {
                if bytes_per_parameter(offer.precision).is_some_and(|b| b < per) {
                    let keys: Vec<String> = offer.keys.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                    offers.push(format!("engine = {:?}{}", engine.name(), keys.iter().map(|k| format!(", {k}")).collect::<String>()));
                }
            }
        }
        offers
    }

    /// The memory its weights take as configured (one copy per engine on the
    /// device that holds them) and the memory there is for them now: the
    /// GPU's free memory where its engine reads it, else the host's. `None`
    /// when the size or the available memory cannot be told.
    pub fn memory_need(&self) -> Option<(Need, Available)> {
        let weights = self.weights()?;
        let (precision, per) = self.held_as(&weights);
        let engine = crate::engines::find(&self.engine)?;
        let (available, copies) = match engine.device_memory(&self.device) {
            Some(device) => {
                let free = device.total_mib.saturating_sub(device.used_mib) << 20;
                // Sessions named alike share the card, each with its copy.
                let on_it = self.device.iter().filter(|d| *d == self.device.first()).count() as u64;
                (Available { bytes: free, from: format!("free on {}", device.name) }, on_it)
            }
            None => (size::available()?, self.device.len() as u64),
        };
        Some((Need { weights, precision, bytes_per_parameter: per, copies }, available))
    }

    /// Why this machine cannot load the model as configured: its weights at
    /// its precision, once per engine, need more memory than is available
    /// (the device's own memory for a GPU that reports it). `None` when they
    /// fit, or when the size or the available memory cannot be told.
    pub fn memory_refusal(&self) -> Option<String> {
        let (need, available) = self.memory_need()?;
        let per = need.bytes_per_parameter;
        let reduced = need.reduced();
        let fix = if reduced.is_empty() {
            "serve a smaller model, or give it more memory".to_string()
        } else {
            let offers = self.reduced_offers(per);
            let by = if offers.is_empty() { String::new() } else { format!("; {}", offers.join("; ")) };
            format!("serve a smaller model, a reduced-precision variant of this one ({reduced}{by}), or give it more memory")
        };
        size::refusal(&format!("model {:?}", self.id), &need, &available, &fix)
    }

    /// The comment lines `eeane check-config` prints above the entry: its
    /// parameter count and where it came from, and the memory of its
    /// weights in fp32 and in each reduced precision its engine (or, with
    /// `precision = "auto"` and no engine, any engine) can serve it in.
    pub fn size_comment(&self) -> String {
        let id = &self.id;
        let path = self.model.path();
        if !path.exists() {
            return if self.source.is_some() {
                format!("# {id}: not pulled yet (eeane pull --config FILE, or its first load); its size shows once it is\n")
            } else {
                format!("# {id}: {} does not exist yet\n", path.display())
            };
        }
        let Some(weights) = self.weights() else {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            return format!("# {id}: parameters not counted ({name}: eeane counts ONNX graphs and the safetensors it prepares from)\n");
        };
        let (held, per) = self.held_as(&weights);
        let mut precisions: Vec<(String, u64)> = Vec::new();
        let mut add = |name: String, bytes: u64| {
            if !precisions.iter().any(|(n, _)| *n == name) {
                precisions.push((name, bytes));
            }
        };
        if per >= 4 {
            add("fp32".into(), 4);
        }
        let any_cpu = CpuFeatures { bf16: true, int8_dot: true };
        for engine in self.candidate_engines() {
            for offer in engine.cpu_precisions(GraphKind::Float32, &any_cpu) {
                if let Some(bytes) = bytes_per_parameter(offer.precision).filter(|&b| b <= per) {
                    add(normal(offer.precision), bytes);
                }
            }
        }
        add(held.clone(), per);
        precisions.sort_by_key(|p| std::cmp::Reverse(p.1));
        let copies = self.device.len() as u64;
        let shown: Vec<String> = precisions
            .iter()
            .map(|(name, bytes)| {
                let memory = human_bytes(weights.parameters.saturating_mul(*bytes).saturating_mul(copies));
                let served = if *name == held && self.auto_precision.is_none() { " (as configured)" } else { "" };
                format!("{name} {memory}{served}")
            })
            .collect();
        let engines = if copies > 1 { format!(", {copies} engines") } else { String::new() };
        format!("# {id}: {}, from {}\n# {id}: memory of its weights{engines}: {}\n", human_parameters(weights.parameters), weights.from, shown.join(", "))
    }
}

impl Config {
    /// `to_toml` with each entry's `ModelConfig::size_comment` above it: a
    /// file that reads back to the same configuration (comments are not
    /// configuration), and to the same text while the model files stay.
    pub fn to_toml_with_sizes(&self) -> String {
        let printed = self.to_toml();
        let Ok(mut document) = printed.parse::<toml_edit::DocumentMut>() else { return printed };
        if let Some(entries) = document.get_mut("models").and_then(|m| m.as_array_of_tables_mut()) {
            for (entry, model) in entries.iter_mut().zip(&self.models) {
                let before = entry.decor().prefix().and_then(|p| p.as_str()).unwrap_or("\n").to_string();
                entry.decor_mut().set_prefix(format!("{before}{}", model.size_comment()));
            }
        }
        document.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CliOverrides;

    fn entry(model: &str, extra: &str) -> ModelConfig {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eeane.toml");
        std::fs::write(
            &file,
            format!(
                "[[models]]\nid = \"m\"\nengine = {:?}\nmodel = {model:?}\ntokenizer = \"t.json\"\nmax_tokens = 16\n{extra}\n",
                crate::engines::default_engine().name()
            ),
        )
        .unwrap();
        Config::load(Some(&file), &CliOverrides::default()).unwrap().models.remove(0)
    }

    #[test]
    fn an_entry_counts_its_graph_and_names_what_is_missing() {
        let missing = entry("/nonexistent/model.onnx", "");
        assert_eq!(missing.size_comment(), "# m: /nonexistent/model.onnx does not exist yet\n");
        assert_eq!(missing.memory_refusal(), None);

        // A prepared model's manifest gives the count (models/prepare.py records it).
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.onnx");
        std::fs::write(&model, b"").unwrap();
        std::fs::write(dir.path().join("manifest.json"), r#"{"parameters": {"count": 7567295488, "from": "the safetensors headers of 4 shards"}}"#).unwrap();
        let big = entry(model.to_str().unwrap(), "");
        let comment = big.size_comment();
        assert!(
            comment.starts_with("# m: 7,567,295,488 parameters (7.57 billion), from the safetensors headers of 4 shards, recorded in manifest.json\n"),
            "{comment}"
        );
        assert!(comment.contains("# m: memory of its weights: fp32 28.2 GiB (as configured)"), "{comment}");
        // Whether it loads depends on this machine; the refusal, when there is one, names the figures.
        if let Some(refusal) = big.memory_refusal() {
            assert!(refusal.contains("28.2 GiB") && refusal.contains("available") && refusal.contains("bf16 or fp16: 14.1 GiB"), "{refusal}");
        }
        let two = entry(model.to_str().unwrap(), "device = [\"cpu\", \"cpu\"]");
        assert!(two.size_comment().contains("memory of its weights, 2 engines: fp32 56.4 GiB"), "{}", two.size_comment());
    }
}
