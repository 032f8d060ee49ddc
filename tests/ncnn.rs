//! The ncnn engine over real HTTP against ONNX Runtime on the default model:
//! on the CPU and on a Vulkan device pinned by name (lavapipe, "llvmpipe",
//! from Debian's mesa-vulkan-drivers, which tests/run.sh installs along with
//! ncnn and the converted model).

mod common;

use common::{as_f64, cosine, fixture_texts, minilm_dir, Server};
use serde_json::json;

fn entry(id: &str, device: &str) -> String {
    entry_with(id, device, "")
}

fn entry_with(id: &str, device: &str, extra: &str) -> String {
    let dir = common::cache_dir().join("models/all-minilm-l6-v2-ncnn");
    assert!(dir.join("manifest.json").exists(), "{} is missing: run models/prepare.py all-minilm-l6-v2-ncnn", dir.display());
    format!(
        "[[models]]\nid = \"{id}\"\nengine = \"ncnn\"\ndevice = \"{device}\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n{extra}\n",
        dir.join("model.ncnn.param").display(),
        dir.join("tokenizer.json").display()
    )
}

#[test]
fn ncnn_on_cpu_and_vulkan_by_name_matches_onnxruntime() {
    let ort = format!(
        "[[models]]\nid = \"ort\"\nengine = \"onnxruntime\"\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n",
        minilm_dir().join("model.onnx").display(),
        minilm_dir().join("tokenizer.json").display()
    );
    // The fixture texts go in one request, so each ncnn model packs several
    // sequences into one run (128 tokens a run on the CPU, 512 on Vulkan);
    // "-alone" runs each sequence by itself.
    let config = [
        ort,
        entry("ncnn-cpu", "cpu"),
        entry("ncnn-vulkan", "vulkan:llvmpipe"),
        entry_with("ncnn-vulkan-alone", "vulkan:llvmpipe", "pack_tokens = 1"),
        // fp16 storage and arithmetic: the graph's mask (-10000) is one fp16
        // holds; with float32's min it was -inf, and 0 * -inf gave NaN.
        entry_with("ncnn-vulkan-fp16", "vulkan:llvmpipe", "precision = \"fp16\""),
        entry_with("ncnn-cpu-fp16", "cpu", "precision = \"fp16\""),
        entry("by-index", "vulkan:0"),
        entry("absent", "vulkan:GeForce GTX 1080"),
    ]
    .concat();
    let server = Server::start(Some(&config), &[]);
    let texts = fixture_texts();
    let (_, want) = server.post("/v1/embeddings", &json!({"model": "ort", "input": texts}));
    let want = common::vectors(&want);
    let mut by_id = std::collections::HashMap::new();
    for id in ["ncnn-cpu", "ncnn-vulkan", "ncnn-vulkan-alone", "ncnn-vulkan-fp16", "ncnn-cpu-fp16"] {
        let (status, got) = server.post("/v1/embeddings", &json!({"model": id, "input": texts}));
        assert_eq!(status, 200, "{id}: {got}");
        let got = common::vectors(&got);
        let worst = got.iter().zip(&want).map(|(g, w)| cosine(g, &as_f64(w))).fold(1.0f64, f64::min);
        let health = server.model_health(id);
        println!(
            "{id}: {} texts, min cosine to ONNX Runtime {worst:.8}; device {}, precision {}, layers on the device {}",
            texts.len(),
            health["device"],
            health["precision"],
            health["accelerated_layers"]
        );
        assert!(worst >= 0.9999, "{id}: min cosine {worst}");
        by_id.insert(id, got);
    }
    let packed_vs_alone = by_id["ncnn-vulkan"].iter().zip(&by_id["ncnn-vulkan-alone"]).map(|(p, a)| cosine(p, &as_f64(a))).fold(1.0f64, f64::min);
    println!("Vulkan, packed vs each sequence alone: min cosine {packed_vs_alone:.8}");
    assert!(packed_vs_alone >= 0.99999, "packing changed the vectors: min cosine {packed_vs_alone}");
    let devices = server.get("/health").1["devices"]["vulkan"].clone();
    assert!(devices.as_array().unwrap().iter().any(|d| d["name"].as_str().unwrap().contains("llvmpipe")), "/health devices: {devices}");
    let vulkan = server.model_health("ncnn-vulkan");
    assert!(vulkan["device"].as_str().unwrap().starts_with("vulkan:llvmpipe"), "{vulkan}");
    assert!(vulkan["accelerated_layers"]["on_device"].as_u64().unwrap() > 0, "no layer reached Vulkan: {vulkan}");
    // isolation = "auto": a Vulkan model runs in the server (one Vulkan
    // instance for every GPU model), a CPU one in its own process.
    assert_eq!(vulkan["isolation"], "thread", "{vulkan}");
    assert_eq!(server.model_health("ncnn-cpu")["isolation"], "process");
    for (id, needle) in [("by-index", "not by an index"), ("absent", "visible")] {
        let (status, response) = server.post("/v1/embeddings", &json!({"model": id, "input": "x"}));
        assert_eq!(status, 503, "{id}: {response}");
        assert!(response["error"]["message"].as_str().unwrap().contains(needle), "{id}: {response}");
    }
}

#[test]
fn a_forbidden_device_is_refused_whatever_the_model_says() {
    let config = format!("[server]\nforbidden_devices = [\"LLVMPIPE\"]\n{}{}", entry("pinned", "vulkan:llvmpipe"), entry("cpu", "cpu"));
    let server = Server::start(Some(&config), &[]);
    let (status, response) = server.post("/v1/embeddings", &json!({"model": "pinned", "input": "x"}));
    assert_eq!(status, 503, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("forbidden"), "{response}");
    let (status, _) = server.post("/v1/embeddings", &json!({"model": "cpu", "input": "x"}));
    assert_eq!(status, 200, "the CPU model keeps serving");
}

/// Identical cards are told apart by their Vulkan deviceUUID: /health lists
/// it, a model pinned by it (or a unique prefix) serves, and
/// `vulkan:llvmpipe*` (every matching device) becomes one session per
/// device, pinned by UUID; all three give the vectors of the name pin.
#[test]
fn vulkan_devices_are_pinned_by_uuid_and_a_pattern_takes_every_one() {
    let server = Server::start(Some(&entry("by-name", "vulkan:llvmpipe")), &[]);
    let texts = fixture_texts();
    let (status, want) = server.post("/v1/embeddings", &json!({"model": "by-name", "input": texts}));
    assert_eq!(status, 200, "{want}");
    let devices = server.get("/health").1["devices"]["vulkan"].clone();
    let lavapipe = devices.as_array().unwrap().iter().find(|d| d["name"].as_str().unwrap().contains("llvmpipe")).expect("lavapipe listed").clone();
    let uuid = lavapipe["uuid"].as_str().unwrap_or_else(|| panic!("no deviceUUID in /health: {devices}")).to_string();
    assert_eq!((uuid.len(), uuid.matches('-').count()), (36, 4), "{uuid}");
    drop(server);
    let config =
        [entry("by-uuid", &format!("vulkan:{uuid}")), entry("by-prefix", &format!("vulkan:{}", &uuid[..13])), entry("every", "vulkan:llvmpipe*")].concat();
    let server = Server::start(Some(&config), &[]);
    for id in ["by-uuid", "by-prefix", "every"] {
        let (status, got) = server.post("/v1/embeddings", &json!({"model": id, "input": texts}));
        assert_eq!(status, 200, "{id}: {got}");
        assert_eq!(common::vectors(&got), common::vectors(&want), "{id}");
    }
    let every = server.model_health("every");
    let lavapipes = devices.as_array().unwrap().iter().filter(|d| d["name"].as_str().unwrap().contains("llvmpipe")).count();
    assert_eq!(every["engine_calls"]["per_device"].as_array().unwrap().len(), lavapipes, "{every}");
    // Every sequence counted on the device that ran it (the load's warm-up text too).
    let rows: u64 = every["engine_calls"]["rows_per_device"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
    assert!(rows > texts.len() as u64, "{every}");
}

/// A model's sessions on one GPU, in `isolation = "process"`, share one
/// engine process (sessions of separate processes time-slice a card between
/// their contexts; those of one process run side by side): its two session
/// threads serve the vectors of the model in the server. Killed, the process
/// starts again once, and both sessions load in it; an unload ends it.
#[test]
fn sessions_on_one_gpu_share_one_engine_process() {
    let dir = common::cache_dir().join("models/all-minilm-l6-v2-ncnn");
    let shared = format!(
        "[[models]]\nid = \"shared\"\nengine = \"ncnn\"\ndevice = [\"vulkan:llvmpipe\", \"vulkan:llvmpipe\"]\nisolation = \"process\"\nkeep_alive = -1\nmodel = \"{}\"\ntokenizer = \"{}\"\nmax_tokens = 256\n",
        dir.join("model.ncnn.param").display(),
        dir.join("tokenizer.json").display()
    );
    let server = Server::start(Some(&[shared, entry("in-server", "vulkan:llvmpipe")].concat()), &[]);
    let texts = fixture_texts();
    let (status, want) = server.post("/v1/embeddings", &json!({"model": "in-server", "input": texts}));
    assert_eq!(status, 200, "{want}");
    let sessions = |pid: u64| -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
        let mut names: Vec<String> = tasks.iter().filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok()).map(|n| n.trim().to_string()).collect();
        // A runtime's own threads inherit the name of the session thread that started them.
        names.retain(|n| n.starts_with("session-"));
        names.sort();
        names.dedup();
        names
    };
    let one_pid = |health: &serde_json::Value| -> u64 {
        let pids: Vec<u64> =
            health["engine_pids"].as_array().unwrap_or_else(|| panic!("no engine_pids: {health}")).iter().map(|p| p.as_u64().unwrap()).collect();
        assert_eq!((pids.len(), pids.iter().all(|p| *p == pids[0])), (2, true), "two sessions, one process: {health}");
        pids[0]
    };
    let (status, got) = server.post("/v1/embeddings", &json!({"model": "shared", "input": texts}));
    assert_eq!(status, 200, "{got}");
    assert_eq!(common::vectors(&got), common::vectors(&want), "the shared process's vectors against the server's own");
    let first = one_pid(&server.model_health("shared"));
    assert!(common::descendants(server.pid()).contains(&(first as u32)), "the engine runs in a child of the server");
    assert_eq!(sessions(first), ["session-0", "session-1"]);

    assert!(std::process::Command::new("kill").arg("-KILL").arg(first.to_string()).status().unwrap().success());
    while std::fs::read_to_string(format!("/proc/{first}/status")).is_ok_and(|s| !s.contains("State:\tZ")) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Bursts of requests at once until both sessions have taken a batch again:
    // a session loads itself in the new process at its next batch.
    let url = server.url.clone();
    for _ in 0..10 {
        let answers: Vec<_> = (0..6)
            .map(|_| {
                let (url, texts) = (url.clone(), texts.clone());
                std::thread::spawn(move || {
                    let client = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(300)).build().unwrap();
                    let response = client.post(format!("{url}/v1/embeddings")).json(&json!({"model": "shared", "input": texts})).send().unwrap();
                    (response.status().as_u16(), response.json::<serde_json::Value>().unwrap())
                })
            })
            .collect();
        for answer in answers {
            let (status, got) = answer.join().unwrap();
            // A batch that met the dead process gets a 500 naming it; the others the same vectors.
            if status == 200 {
                assert_eq!(common::vectors(&got), common::vectors(&want));
            } else {
                assert!(status == 500 && got.to_string().contains("engine process"), "{status}: {got}");
            }
        }
        let health = server.model_health("shared");
        if health["engine_pids"].as_array().is_some_and(|pids| pids.iter().all(|p| p.as_u64() != Some(first))) {
            break;
        }
    }
    let (status, got) = server.post("/v1/embeddings", &json!({"model": "shared", "input": texts}));
    assert_eq!((status, common::vectors(&got)), (200, common::vectors(&want)), "after the restart");
    let health = server.model_health("shared");
    let second = one_pid(&health);
    assert_ne!(first, second);
    assert_eq!(health["engine_restarts"], 1, "one process started again, for both sessions: {health}");
    assert_eq!(sessions(second), ["session-0", "session-1"], "both sessions loaded again");

    let (status, _) = server.post("/v1/embeddings", &json!({"model": "shared", "input": "unload", "keep_alive": 0}));
    assert_eq!(status, 200);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{second}")).exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!std::path::Path::new(&format!("/proc/{second}")).exists(), "the engine process outlived its model's unload");
}
