//! The import graph of `src/` has no circle, and every module imports only
//! modules below it.
//!
//! - HTTP goes through one door: the handlers in src/http know `serving` (its
//!   requests, answers, errors and status snapshots) and the config, never the
//!   registry, the model, the tokenizers, the batcher or the engines. A new
//!   API surface is then one file that knows only `serving`.
//! - The top-level modules stand in the order of `LAYERS`: an arrow from one
//!   to another points down the list. Inside a module, files import each
//!   other without a circle. A file's references to its own ancestors (its
//!   `mod.rs`, `super::`) are how Rust nests modules and are not arrows.
//! - No function of src/ or backends/ fails with a bare `String`: an error
//!   is a type (thiserror), so a caller can tell one failure from another
//!   and a message is written once, beside the case it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules of src/, highest first: a module may import only
/// those after it.
const LAYERS: &[&str] = &[
    "bench",
    "http",
    "serving",
    "registry",
    "variants",
    "model",
    "batcher",
    "engine_host",
    "tokenize",
    "pooling",
    "config",
    "pull",
    "rerank_template",
    "engines",
    "corpus",
    "cpu_sets",
    "integrity",
    "manifest",
    "sync",
    "allocator",
];

#[test]
fn http_knows_serving_and_nothing_behind_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let behind = ["crate::registry", "crate::model", "crate::tokenize", "crate::batcher", "crate::engines", "crate::pooling", "eeane_backend_"];
    let mut reaches = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if let Some(module) = behind.iter().find(|m| line.contains(*m)) {
                    reaches.push(format!("{}:{}: {module}", path.file_name().unwrap().to_string_lossy(), n + 1));
                }
            }
        }
    }
    assert!(reaches.is_empty(), "src/http reaches past serving:\n{}", reaches.join("\n"));
}

#[test]
fn the_import_graph_has_no_circle_and_points_down() {
    let files = source_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let graph = Graph::of(&files);
    let tops: BTreeSet<&str> = graph.modules.iter().filter_map(|m| m.split("::").next()).filter(|t| !t.is_empty()).collect();
    let unplaced: Vec<&&str> = tops.iter().filter(|t| !LAYERS.contains(t)).collect();
    assert!(unplaced.is_empty(), "top-level modules missing from LAYERS (tests/layering.rs): {unplaced:?}");
    let upward = graph.upward(LAYERS);
    let circles = graph.circles();
    assert!(upward.is_empty() && circles.is_empty(), "arrows up the layers:\n{}\ncircles:\n{}", upward.join("\n"), circles.join("\n"));
    println!("{} modules, {} arrows, no circle", graph.modules.len(), graph.arrows.values().map(BTreeMap::len).sum::<usize>());
}

#[test]
fn the_check_names_a_circle_and_an_arrow_up() {
    let files = vec![
        ("config".to_string(), "use crate::variants::MIN_COSINE;\n".to_string()),
        ("variants".to_string(), "use crate::config::Config;\n".to_string()),
        ("http::rerank".to_string(), "fn f() { super::tei::rank(); }\n".to_string()),
        ("http::tei".to_string(), "use super::{rerank::documents, error};\n".to_string()),
        ("http::error".to_string(), "// crate::variants in a comment is no arrow\n".to_string()),
        ("http".to_string(), "mod rerank;\n".to_string()),
    ];
    let graph = Graph::of(&files);
    let upward = graph.upward(&["variants", "http", "config"]);
    assert_eq!(upward, ["config:1: config -> variants (variants stands above config)"]);
    let circles = graph.circles();
    assert_eq!(circles.len(), 2, "{circles:?}");
    assert!(circles.iter().any(|c| c.contains("http::rerank -> http::tei") && c.contains("http::tei -> http::rerank")), "{circles:?}");
    assert!(!circles.iter().any(|c| c.contains("http::error")), "{circles:?}");
}

/// Each `.rs` file of `dir` as (module path, text), `mod.rs` and `lib.rs`
/// standing for their folder; `main.rs` (the binary, above everything) is left out.
fn source_files(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.file_name().is_some_and(|n| n == "main.rs") {
                continue;
            }
            let relative = path.strip_prefix(dir).unwrap().with_extension("");
            let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            files.push((parts.join("::"), std::fs::read_to_string(&path).unwrap()));
        }
    }
    files
}

struct Graph {
    modules: BTreeSet<String>,
    /// from -> to -> the first line that imports it.
    arrows: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Graph {
    fn of(files: &[(String, String)]) -> Self {
        let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
        let mut arrows: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for (module, text) in files {
            for (n, line) in code_lines(text) {
                for path in paths(line) {
                    let Some(target) = resolve(module, &path, &modules) else { continue };
                    // A module's own items, or its ancestors': nesting, not an arrow.
                    if target == *module || module.starts_with(&format!("{target}::")) || target.is_empty() {
                        continue;
                    }
                    arrows.entry(module.clone()).or_default().entry(target).or_insert(n);
                }
            }
        }
        Graph { modules, arrows }
    }

    /// Arrows between top-level modules that point up `layers`.
    fn upward(&self, layers: &[&str]) -> Vec<String> {
        let rank = |m: &str| layers.iter().position(|l| *l == m.split("::").next().unwrap_or(m));
        let mut found = Vec::new();
        for (from, targets) in &self.arrows {
            for (to, line) in targets {
                if let (Some(a), Some(b)) = (rank(from), rank(to)) {
                    if b < a {
                        let (from_top, to_top) = (layers[a], layers[b]);
                        found.push(format!("{from}:{line}: {from} -> {to} ({to_top} stands above {from_top})"));
                    }
                }
            }
        }
        found
    }

    /// Each circle among files, as its arrows with the lines that make them.
    fn circles(&self) -> Vec<String> {
        // Tarjan's strongly connected components; each of more than one file is a circle.
        struct Walk<'a> {
            graph: &'a Graph,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            components: Vec<Vec<&'a str>>,
        }
        impl<'a> Walk<'a> {
            fn visit(&mut self, v: &'a str) {
                let n = self.index.len();
                self.index.insert(v, n);
                self.low.insert(v, n);
                self.stack.push(v);
                for w in self.graph.arrows.get(v).into_iter().flat_map(|t| t.keys()) {
                    if !self.index.contains_key(w.as_str()) {
                        self.visit(w);
                        let low = self.low[v].min(self.low[w.as_str()]);
                        self.low.insert(v, low);
                    } else if self.stack.contains(&w.as_str()) {
                        let low = self.low[v].min(self.index[w.as_str()]);
                        self.low.insert(v, low);
                    }
                }
                if self.low[v] == self.index[v] {
                    let at = self.stack.iter().rposition(|x| *x == v).unwrap();
                    let component = self.stack.split_off(at);
                    if component.len() > 1 {
                        self.components.push(component);
                    }
                }
            }
        }
        let mut walk = Walk { graph: self, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), components: Vec::new() };
        for m in &self.modules {
            if !walk.index.contains_key(m.as_str()) {
                walk.visit(m);
            }
        }
        walk.components
            .iter()
            .map(|component| {
                let inside: Vec<String> = component
                    .iter()
                    .flat_map(|from| {
                        self.arrows[*from]
                            .iter()
                            .filter(|(to, _)| component.contains(&to.as_str()))
                            .map(move |(to, line)| format!("  {from}:{line}: {from} -> {to}"))
                    })
                    .collect();
                inside.join("\n")
            })
            .collect()
    }
}

/// The lines of `text` that are code, numbered from 1: comments and the
/// test module at the end of a file (`#[cfg(test)]`) are left out.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(n, l)| (n + 1, l.split(" // ").next().unwrap_or(l)))
}

/// The paths a line names from `crate::` or `super::`, each as its segments;
/// a `use` group (`super::{a, b::c}`) gives one path per item.
fn paths(line: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes = line.as_bytes();
    let mut at = 0;
    while at < line.len() {
        let rest = &line[at..];
        let start = match (rest.find("crate::"), rest.find("super::")) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => break,
        };
        let begin = at + start;
        // Not the tail of a longer name (`eeane_crate::`).
        if begin > 0 && (bytes[begin - 1].is_ascii_alphanumeric() || bytes[begin - 1] == b'_') {
            at = begin + 1;
            continue;
        }
        let mut end = begin;
        while end < line.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_' || bytes[end] == b':') {
            end += 1;
        }
        let head: Vec<String> = line[begin..end].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
        if end < line.len() && bytes[end] == b'{' {
            let close = line[end..].find('}').map_or(line.len(), |c| end + c);
            for item in line[end + 1..close].split(',') {
                let first: Vec<String> =
                    item.trim().split("::").next().map(|s| s.trim_matches(|c: char| c == '{' || c == ' ').to_string()).into_iter().collect();
                if first.iter().any(|s| !s.is_empty() && s != "self") {
                    found.push(head.iter().cloned().chain(first).collect());
                }
            }
            at = close;
        } else {
            found.push(head);
            at = end;
        }
    }
    found
}

/// The module a path from `module` lands in: the longest known module that
/// its segments name.
fn resolve(module: &str, path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let mut base: Vec<&str> = if module.is_empty() { Vec::new() } else { module.split("::").collect() };
    let mut segments = path.iter().map(String::as_str).peekable();
    match segments.peek() {
        Some(&"crate") => {
            base.clear();
            segments.next();
        }
        _ => {
            while segments.peek() == Some(&"super") {
                base.pop();
                segments.next();
            }
        }
    }
    let full: Vec<&str> = base.into_iter().chain(segments).collect();
    (0..=full.len()).rev().map(|n| full[..n].join("::")).find(|m| modules.contains(m))
}

#[test]
fn no_result_in_src_or_backends_fails_with_a_string() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut folders = vec![root.join("src"), root.join("backends")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    folders.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let shown = path.strip_prefix(root).unwrap().display().to_string();
                found.extend(string_errors(&std::fs::read_to_string(&path).unwrap()).into_iter().map(|line| format!("{shown}:{line}")));
            }
        }
    }
    found.sort();
    assert!(found.is_empty(), "a Result whose error is a String; give it an error type (thiserror), as src/pull/mod.rs's PullError:\n{}", found.join("\n"));
}

#[test]
fn the_string_error_check_sees_nested_and_spread_results_and_not_comments_or_strings() {
    let text = "fn a() -> Result<Vec<u8>, String> {}\n\
                fn b() -> std::io::Result<String> {}\n\
                // fn c() -> Result<(), String>\n\
                /// Result<u8, String> in a doc comment\n\
                fn d() -> Result <\n    HashMap<String, Vec<(u8, u16)>>,\n    std::string::String,\n> {}\n\
                fn e() -> Result<Box<dyn Fn(u8) -> u8>, String> {}\n\
                fn f() -> Result<String, Error> {}\n\
                /* Result<u8, String> */ fn g() -> MyResult<u8, String> {}\n\
                const GLOB: &str = \"models/*\"; const QUOTE: char = '\"';\n\
                fn h() -> Result<u8, String> {} // */\n\
                const SAID: &str = \"Result<u8, String>\"; const RAW: &str = r#\"a \" Result<u8, String>\"#;\n\
                fn i() -> Result<u8, String> {}\n";
    assert_eq!(string_errors(text), vec![1, 5, 9, 13, 15]);
}

/// The lines (from 1) where a `Result<T, E>` names `String` as `E`, comments
/// and string literals left out; `T` may nest generics, tuples and closures' `->`, and the type
/// may spread over lines.
fn string_errors(text: &str) -> Vec<usize> {
    let code = without_comments_and_strings(text);
    let mut lines = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("Result").map(|i| from + i) {
        from = at + "Result".len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(open) = code[from..].trim_start().strip_prefix('<') else { continue };
        let mut depth = 0usize;
        let mut args = vec![String::new()];
        let mut chars = open.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '-' if chars.peek() == Some(&'>') => {
                    chars.next();
                    args.last_mut().unwrap().push_str("->");
                    continue;
                }
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth == 0 => break,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    args.push(String::new());
                    continue;
                }
                _ => {}
            }
            args.last_mut().unwrap().push(c);
        }
        // A trailing comma leaves an empty argument.
        if args.last().is_some_and(|a| a.trim().is_empty()) {
            args.pop();
        }
        if args.len() == 2 && ["String", "std::string::String", "::std::string::String"].contains(&args[1].split_whitespace().collect::<String>().as_str()) {
            lines.push(code[..at].matches('\n').count() + 1);
        }
    }
    lines
}

/// `text` with its comments (`//`, `/* */`) and the contents of its string
/// literals blanked, newlines kept so that line numbers hold: a `"//"` in a
/// string starts no comment, and a message that quotes a type is no type.
fn without_comments_and_strings(text: &str) -> String {
    let newlines = |s: &str| s.chars().filter(|&c| c == '\n').collect::<String>();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(quote) = ["'\"'", "'\\\"'"].into_iter().find(|q| rest.starts_with(q)) {
            out.push_str(quote);
            rest = &rest[quote.len()..];
        } else if let Some(after) = rest.strip_prefix("r#\"") {
            let end = after.find("\"#").map_or(after.len(), |e| e + 2);
            out.push_str(&newlines(&after[..end]));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('"') {
            let mut end = after.len();
            let mut escaped = false;
            for (i, c) in after.char_indices() {
                match c {
                    '"' if !escaped => {
                        end = i + 1;
                        break;
                    }
                    '\\' => escaped = !escaped,
                    _ => escaped = false,
                }
            }
            out.push_str(&newlines(&after[..end]));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix("//") {
            let end = after.find('\n').unwrap_or(after.len());
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").map_or(after.len(), |e| e + 2);
            out.push_str(&newlines(&after[..end]));
            rest = &after[end..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}
