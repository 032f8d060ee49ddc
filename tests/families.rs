//! A family is one builder file and one row: each architecture eeane builds
//! from safetensors is named in models/families.toml and in its family's
//! builder (models/families/{builder}.py) only, besides tests and docs. Code
//! that needs a family asks the table (src/pull/families.rs in Rust,
//! models/families/__init__.py in Python).

use std::path::{Path, PathBuf};

#[derive(serde::Deserialize)]
struct Table {
    family: Vec<Row>,
}

#[derive(serde::Deserialize)]
struct Row {
    builder: String,
    architectures: Vec<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Every .rs, .py and .sh file under `dir`, build outputs aside.
fn code_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "__pycache__" | "node_modules") && !name.starts_with('.') {
                code_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs" || e == "py" || e == "sh") {
            out.push(path);
        }
    }
}

/// The lines of `text` that name `word` as a whole word (not inside a longer
/// name: BertModel is not named by DistilBertModel), numbered from 1; a
/// Rust file's lines from its `#[cfg(test)]` module on are its tests.
fn naming(text: &str, word: &str, rust: bool) -> Vec<usize> {
    let part_of_name = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.lines()
        .enumerate()
        .take_while(|(_, line)| !(rust && line.trim() == "#[cfg(test)]"))
        .filter(|(_, line)| {
            line.match_indices(word).any(|(at, _)| !part_of_name(line[..at].chars().next_back()) && !part_of_name(line[at + word.len()..].chars().next()))
        })
        .map(|(n, _)| n + 1)
        .collect()
}

/// Where an architecture is named outside its row and its builder.
fn strays(root: &Path, table: &Table) -> Vec<String> {
    let mut files = Vec::new();
    for dir in ["src", "backends", "models"] {
        code_files(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for row in &table.family {
        let builder = root.join("models/families").join(format!("{}.py", row.builder));
        for file in files.iter().filter(|f| **f != builder) {
            let text = std::fs::read_to_string(file).unwrap();
            let rust = file.extension().is_some_and(|e| e == "rs");
            for architecture in &row.architectures {
                for line in naming(&text, architecture, rust) {
                    found.push(format!("{}:{line}: {architecture}", file.strip_prefix(root).unwrap_or(file).display()));
                }
            }
        }
    }
    found
}

fn table(root: &Path) -> Table {
    toml::from_str(&std::fs::read_to_string(root.join("models/families.toml")).unwrap()).unwrap()
}

#[test]
fn architectures_are_named_in_the_family_table_and_their_builders_only() {
    let root = root();
    let found = strays(&root, &table(&root));
    assert!(found.is_empty(), "architectures named outside models/families.toml and their builder files (ask the family table instead):\n{}", found.join("\n"));
}

#[test]
fn the_check_finds_a_stray_name_and_leaves_tests_and_longer_names() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("models/families/bert.py", "ARCHITECTURES = ('BertModel',)\n");
    write("models/prepare.py", "if arch == 'BertModel':\n    pass\n");
    write("src/pull/st.rs", "// DistilBertModel is another family\n#[cfg(test)]\nmod tests { const A: &str = \"BertModel\"; }\n");
    write("backends/x/src/lib.rs", "fn f() -> &'static str { \"BertModel\" }\n");
    let table = Table { family: vec![Row { builder: "bert".into(), architectures: vec!["BertModel".into()] }] };
    let mut found = strays(dir.path(), &table);
    found.sort();
    assert_eq!(found, ["backends/x/src/lib.rs:1: BertModel", "models/prepare.py:1: BertModel"]);
}
