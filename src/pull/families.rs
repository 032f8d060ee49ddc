//! The model families eeane builds from a Hub repository's weights, as
//! models/families.toml declares them: the one table that names
//! architectures. `eeane pull` picks a repository's family here and hands
//! its name to models/prepare.py, which builds with the family's builder
//! (models/families/{builder}.py) and chooses nothing itself.

use std::sync::LazyLock;

use serde::Deserialize;

/// One row of models/families.toml.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Family {
    pub name: String,
    /// models/families/{builder}.py.
    pub builder: String,
    /// config.json's `architectures` values it takes.
    pub architectures: Vec<String>,
    /// Whether an engine that converts the built graph (one whose
    /// `HubPreparation` reads no repository ONNX) takes it.
    pub converted: bool,
    /// How models/gpu_graph.py makes its fp16 graph.
    pub gpu_graph: GpuGraph,
}

/// How the GPU's fp16 graph of a family is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuGraph {
    /// ONNX Runtime's transformer optimizer fuses the attention.
    Optimized,
    /// The builder writes fused attention itself.
    Fused,
    /// fp16 with the builder's own attention.
    Unfused,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    family: Vec<Family>,
}

/// The table, compiled in: the binary and models/ come from one checkout.
const TABLE: &str = include_str!("../../models/families.toml");

static FAMILIES: LazyLock<Vec<Family>> = LazyLock::new(|| match toml::from_str::<Table>(TABLE) {
    Ok(table) => table.family,
    // A broken table is a broken build: tests/hub_pull.rs and the unit tests below read it.
    Err(e) => panic!("models/families.toml does not parse: {e}"),
});

/// Every family, in the table's order.
pub fn all() -> &'static [Family] {
    &FAMILIES
}

/// The family that builds `architecture`, if eeane builds it.
pub fn for_architecture(architecture: &str) -> Option<&'static Family> {
    all().iter().find(|f| f.architectures.iter().any(|a| a == architecture))
}

/// The architectures of families that `converted` engines take, or of all.
pub fn architectures(converted_only: bool) -> Vec<&'static str> {
    all().iter().filter(|f| f.converted || !converted_only).flat_map(|f| f.architectures.iter().map(String::as_str)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_names_each_architecture_once() {
        let mut seen = std::collections::BTreeSet::new();
        for family in all() {
            assert!(!family.architectures.is_empty(), "{} takes no architecture", family.name);
            for architecture in &family.architectures {
                assert!(seen.insert(architecture.as_str()), "{architecture} is in two rows");
            }
        }
        assert_eq!(for_architecture("BertModel").map(|f| f.name.as_str()), Some("bert"));
        assert_eq!(for_architecture("GPTNeoXForCausalLM"), None);
        assert!(architectures(true).contains(&"BertModel") && !architectures(true).contains(&"Qwen3Model"));
        assert!(architectures(false).contains(&"Qwen3Model"));
    }

    #[test]
    fn every_builder_file_exists() {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/families");
        for family in all() {
            let file = models.join(format!("{}.py", family.builder));
            assert!(file.is_file(), "{}: {} is missing", family.name, file.display());
        }
    }
}
