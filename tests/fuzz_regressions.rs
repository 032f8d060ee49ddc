//! The fuzz targets' seeds and every input a fuzz run ever crashed on
//! (tests/fuzz/regressions/TARGET/), replayed through the same target bodies
//! on stable: a regression fails the ordinary suite. The runs themselves:
//! docs/reliability.md.

#[path = "fuzz/targets.rs"]
mod targets;

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut count = 0;
    for dir in ["seeds", "regressions"] {
        for file in std::fs::read_dir(root.join(dir).join(target)).into_iter().flatten().flatten() {
            run(&std::fs::read(file.path()).unwrap());
            count += 1;
        }
    }
    assert!(count > 0, "no seeds for {target}");
    println!("{target}: {count} inputs replayed");
}

#[test]
fn request_bodies() {
    replay("request_bodies", targets::request_bodies);
}

#[test]
fn tokenizers() {
    replay("tokenizers", targets::tokenizers);
}

#[test]
fn config() {
    replay("config", targets::config);
}
