//! The README's and docs' code blocks run: the curl and openai-python blocks
//! against a started server, the TOML blocks through `eeane check-config`, the
//! `eeane` commands that need no network, and every `cargo test --test NAME`
//! names a test that exists. A block that rots fails here.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced blocks of a Markdown file: (language, body).
fn blocks(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (line.strip_prefix("```"), open.take()) {
            (Some(lang), None) => open = Some((lang.trim().to_string(), String::new())),
            (Some(_), Some(block)) => out.push(block),
            (None, Some((lang, mut body))) => {
                body.push_str(line);
                body.push('\n');
                open = Some((lang, body));
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{file}: a code block is not closed");
    out
}

fn docs() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    for dir in ["docs", "docs/engines", "docs/history"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap().map(Result::unwrap) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    files.sort();
    files
}

fn run(command: &mut Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_readme_curl_and_python_blocks_answer() {
    let server = Server::start(None, &[]);
    let address = server.url.trim_start_matches("http://").to_string();
    let blocks = blocks("README.md");
    let curl: Vec<&String> = blocks.iter().filter(|(lang, body)| lang == "sh" && body.starts_with("curl ")).map(|(_, b)| b).collect();
    let python: Vec<&String> = blocks.iter().filter(|(lang, _)| lang == "python").map(|(_, b)| b).collect();
    assert!(!curl.is_empty() && !python.is_empty(), "the README has lost its curl or Python example");
    for block in curl {
        let script = block.replace("127.0.0.1:7997", &address);
        // Each curl line's answer on a line of its own, so each parses.
        let script = script.replace("curl -s ", "echo; curl -sf ");
        let out = run(Command::new("bash").args(["-euo", "pipefail", "-c", &script]), "the README's curl block");
        let answers: Vec<serde_json::Value> = out.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(answers.len(), 3, "{out}");
        assert_eq!(answers[0]["data"].as_array().map(Vec::len), Some(2), "{}", answers[0]);
        assert_eq!(answers[0]["data"][0]["embedding"].as_array().map(Vec::len), Some(384));
        assert_eq!(answers[2]["status"], "ok");
    }
    let python_bin = common::cache_dir().join("venv-examples/bin/python");
    assert!(python_bin.exists(), "{} is missing: run `bash tests/run.sh`", python_bin.display());
    for block in python {
        let script = block.replace("127.0.0.1:7997", &address);
        let out = run(Command::new(&python_bin).args(["-c", &script]), "the README's Python block");
        assert_eq!(out.trim(), "2 384", "the block's printed answer");
    }
}

#[test]
fn the_toml_blocks_pass_check_config() {
    for file in docs() {
        for (lang, body) in blocks(&file) {
            if lang != "toml" {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("eeane.toml");
            std::fs::write(&path, &body).unwrap();
            // Hub entries are read without the network: they warn, and the rest is checked.
            let out = Command::new(env!("CARGO_BIN_EXE_eeane"))
                .args(["check-config", "--config"])
                .arg(&path)
                .env("HF_HUB_OFFLINE", "1")
                .env("HF_HOME", dir.path())
                .env_remove("EEANE_API_KEY")
                .output()
                .unwrap();
            assert!(out.status.success(), "{file}'s TOML block fails check-config:\n{body}\n{}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

#[test]
fn the_eeane_commands_that_need_no_network_run() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_eeane"));
    let mut ran = 0;
    for file in docs() {
        for (lang, body) in blocks(&file) {
            if lang != "sh" {
                continue;
            }
            for line in body.lines() {
                let command = line.split("  #").next().unwrap().trim();
                // Read-only commands: the catalog's list and the cache's contents.
                for (written, args) in [("target/release/eeane pull --list", &["pull", "--list"][..]), ("target/release/eeane models", &["models"][..])] {
                    if command == written {
                        let out = run(Command::new(&binary).args(args), &format!("{file}: {command}"));
                        assert!(!out.trim().is_empty(), "{file}: {command} printed nothing");
                        ran += 1;
                    }
                }
                if command == "cargo run --release -- check-config --config eeane.example.toml" {
                    run(Command::new(&binary).args(["check-config", "--config"]).arg(root().join("eeane.example.toml")), command);
                    ran += 1;
                }
            }
        }
    }
    assert!(ran >= 3, "the docs lost their eeane pull --list / eeane models / check-config commands ({ran} ran)");
}

#[test]
fn every_cargo_test_command_names_a_test() {
    for file in docs() {
        for (_, body) in blocks(&file) {
            for line in body.lines() {
                let mut words = line.split_whitespace();
                while let Some(word) = words.next() {
                    if word == "--test" {
                        let name = words.next().unwrap_or("");
                        assert!(root().join("tests").join(format!("{name}.rs")).exists(), "{file}: `{line}` names no test {name:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_readme_is_a_front_door_and_its_links_resolve() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.lines().count() < 250, "README.md has {} lines; the depth goes in docs/", readme.lines().count());
    for file in docs() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        let base = root().join(&file).parent().unwrap().to_path_buf();
        for link in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            let (target, anchor) = link.split_once('#').unwrap_or((link, ""));
            if target.starts_with("http") {
                continue;
            }
            let linked = if target.is_empty() { root().join(&file) } else { base.join(target) };
            assert!(linked.exists(), "{file}: the link {link:?} points at nothing");
            // A heading that moved or was renamed leaves its links pointing at the top of the page.
            if !anchor.is_empty() && linked.extension().is_some_and(|e| e == "md") {
                let headings = heading_anchors(&std::fs::read_to_string(&linked).unwrap());
                assert!(headings.contains(anchor), "{file}: the link {link:?} names no heading of {}", linked.display());
            }
        }
    }
}

/// The anchors GitHub gives a Markdown file's headings: lowercased, spaces
/// as hyphens, punctuation but `-` and `_` dropped, and `-1`, `-2` after a
/// repeated one. Headings inside fenced code blocks are none.
fn heading_anchors(text: &str) -> std::collections::HashSet<String> {
    let mut anchors = std::collections::HashSet::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced).map(|h| h.trim_start_matches('#')).and_then(|h| h.strip_prefix(' ')) else {
            continue;
        };
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *count == 0 { slug } else { format!("{slug}-{count}") });
        *count += 1;
    }
    anchors
}

#[test]
fn the_anchors_are_githubs() {
    let anchors = heading_anchors(
        "# Performance\n## The test suite's time\n### NVIDIA H100: Q, K and V (2026-12-07, 15:51 UTC)\n```sh\n# a comment\n```\n## Mechanisms\n## Mechanisms\n",
    );
    let mut anchors: Vec<&str> = anchors.iter().map(String::as_str).collect();
    anchors.sort_unstable();
    assert_eq!(anchors, ["mechanisms", "mechanisms-1", "nvidia-h100-q-k-and-v-2026-12-07-1551-utc", "performance", "the-test-suites-time"]);
}

/// docs/performance.md is a reference: what each figure means, the commands
/// that make them and the latest table per machine and model. Without a
/// bound it grew into a log of every run (1,632 lines, issue 70).
const PERFORMANCE_MAX_LINES: usize = 300;

#[test]
fn performance_md_stays_a_reference() {
    let lines = std::fs::read_to_string(root().join("docs/performance.md")).unwrap().lines().count();
    assert!(
        lines <= PERFORMANCE_MAX_LINES,
        "docs/performance.md has {lines} lines, over its {PERFORMANCE_MAX_LINES}: it keeps what each figure means, the commands \
         and the latest table per machine and model; a new run replaces its machine's table, and the table it replaces, with \
         every dated run and its narrative, goes to docs/history/performance-log.md (raw logs in docs/runs/)"
    );
}
