//! Cross-request batching over HTTP: vectors do not depend on which batch a
//! text lands in, every request gets its vectors in input order, and a huge
//! request does not hold up small ones.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{as_f64, cosine, fixture_texts, Server};
use serde_json::json;

#[test]
fn concurrent_requests_share_batches_and_keep_their_order_and_vectors() {
    let server = Server::start(None, &[]);
    let texts = fixture_texts();
    // One text per request, one at a time: the vectors every batch must reproduce.
    let single: Vec<Vec<f32>> = texts.iter().map(|t| server.embed(json!(t), json!({})).remove(0)).collect();
    let floor = server.fidelity_floor("all-minilm-l6-v2");
    let batches_before = server.model_health("all-minilm-l6-v2")["engine_calls"]["batches"].as_u64().unwrap();
    let handles: Vec<_> = (0..16)
        .map(|c| {
            let url = server.url.clone();
            // Each client a different rotation and subset of the texts.
            let order: Vec<usize> = (0..texts.len()).map(|i| (i * 7 + c * 5) % texts.len()).take(8 + c).collect();
            let input: Vec<String> = order.iter().map(|&i| texts[i].clone()).collect();
            thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                let mut answers = Vec::new();
                for _ in 0..3 {
                    let r = client.post(format!("{url}/v1/embeddings")).body(json!({"input": input}).to_string()).send().unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    answers.push(common::vectors(&r.json().unwrap()));
                }
                (order, answers)
            })
        })
        .collect();
    let mut requests = 0;
    let mut worst = 1.0f64;
    for handle in handles {
        let (order, answers) = handle.join().unwrap();
        for vectors in answers {
            requests += 1;
            assert_eq!(vectors.len(), order.len());
            for (v, &i) in vectors.iter().zip(&order) {
                let c = cosine(v, &as_f64(&single[i]));
                assert!(c >= floor, "text {i}: cosine {c} between its batched and single vectors (order kept?)");
                worst = worst.min(c);
            }
        }
    }
    let health = server.model_health("all-minilm-l6-v2");
    let batches = health["engine_calls"]["batches"].as_u64().unwrap() - batches_before;
    println!("{requests} concurrent requests ran in {batches} engine batches; min cosine to single-request vectors {worst:.8}");
    assert!(batches < requests, "requests were batched together: {batches} batches for {requests} requests");
}

#[test]
fn small_requests_complete_while_a_huge_one_runs() {
    let server = Server::start(None, &[]);
    let texts = fixture_texts();
    let huge: Vec<String> = (0..2048).map(|i| format!("{} {i}", texts[i % texts.len()])).collect();
    let expected_first = server.embed(json!(huge[0].clone()), json!({})).remove(0);
    let url = server.url.clone();
    let big = thread::spawn(move || {
        let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(600)).build().unwrap();
        let r = client.post(format!("{url}/v1/embeddings")).body(json!({"input": huge}).to_string()).send().unwrap();
        assert_eq!(r.status().as_u16(), 200);
        (Instant::now(), common::vectors(&r.json().unwrap()))
    });
    server.wait_for_health("the huge request", Duration::from_secs(60), |h| h["models"][0]["in_flight"].as_u64() >= Some(1));
    let mut small_done = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        let v = server.embed(json!([format!("small request {i}"), "fn main() {}"]), json!({}));
        assert_eq!(v.len(), 2);
        small_done.push((Instant::now(), started.elapsed()));
    }
    let (big_done, vectors) = big.join().unwrap();
    assert_eq!(vectors.len(), 2048);
    assert!(cosine(&vectors[0], &as_f64(&expected_first)) >= server.fidelity_floor("all-minilm-l6-v2"));
    let slowest = small_done.iter().map(|(_, d)| *d).max().unwrap();
    println!("small requests during a 2048-text request: slowest {:.0} ms", slowest.as_secs_f64() * 1e3);
    assert!(small_done.iter().all(|(done, _)| *done < big_done), "every small request finished before the huge one");
}

/// The CPUs a process may run on, from /proc (`Cpus_allowed_list`, e.g. "0-3,8").
fn allowed_cpus(pid: u32, task: Option<&str>) -> Vec<usize> {
    let path = match task {
        Some(t) => format!("/proc/{pid}/task/{t}/status"),
        None => format!("/proc/{pid}/status"),
    };
    let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    cpu_list(status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list").trim())
}

/// A CPU list as Linux and `taskset -c` write it ("0-3,8").
fn cpu_list(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// The physical cores (package, core id) that `cpus` sit on; SMT siblings share one.
fn physical_cores(cpus: &[usize]) -> std::collections::HashSet<(String, String)> {
    cpus.iter()
        .filter_map(|c| {
            let read = |what: &str| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{c}/topology/{what}")).ok();
            Some((read("physical_package_id")?, read("core_id")?))
        })
        .collect()
}

/// Every thread of process `pid`, the runtime's compute threads included, may run only on `set`.
fn assert_threads_within(pid: u32, set: &[usize]) {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().file_name().into_string().unwrap();
        let allowed = allowed_cpus(pid, Some(&task));
        assert!(allowed.iter().all(|c| set.contains(c)), "thread {task} of engine {pid} may run on {allowed:?}, outside {set:?}");
    }
}

#[test]
fn two_cpu_engines_each_run_on_their_own_cores() {
    let config = format!(
        "{}{}",
        common::model_entry("pair", "all-minilm-l6-v2", "device = [\"cpu\", \"cpu\"]\nload_policy = \"resident\""),
        common::model_entry("one", "all-minilm-l6-v2", "load_policy = \"resident\"")
    );
    let server = Server::start(Some(&config), &[]);
    let texts = fixture_texts();
    let want: Vec<Vec<f32>> = texts.iter().map(|t| server.embed(json!(t), json!({"model": "one"})).remove(0)).collect();
    // Concurrent clients, so that both engines run batches.
    let handles: Vec<_> = (0..8)
        .map(|c| {
            let (url, texts) = (server.url.clone(), texts.clone());
            thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                let order: Vec<usize> = (0..texts.len()).map(|i| (i + c * 3) % texts.len()).collect();
                let input: Vec<&String> = order.iter().map(|&i| &texts[i]).collect();
                let r = client.post(format!("{url}/v1/embeddings")).json(&json!({"model": "pair", "input": input})).send().unwrap();
                assert_eq!(r.status().as_u16(), 200);
                (order, common::vectors(&r.json().unwrap()))
            })
        })
        .collect();
    let floor = server.fidelity_floor("pair");
    for handle in handles {
        let (order, got) = handle.join().unwrap();
        for (i, v) in order.iter().zip(&got) {
            assert!(cosine(v, &as_f64(&want[*i])) >= floor, "text {i}: the two-engine vector drifts from the one-engine vector");
        }
    }
    let health = server.model_health("pair");
    println!("two CPU engines: {}", health["device"]);
    let pids: Vec<u32> = health["engine_pids"].as_array().expect("engine_pids").iter().map(|p| p.as_u64().unwrap() as u32).collect();
    assert_eq!(pids.len(), 2, "{health}");
    // Physical cores (SMT siblings share one): the engines split whole cores.
    let cores = physical_cores(&allowed_cpus(std::process::id(), None));
    let sets: Vec<Vec<usize>> = pids.iter().map(|&pid| allowed_cpus(pid, None)).collect();
    if cores.len() >= 2 {
        assert!(sets[0].iter().all(|c| !sets[1].contains(c)), "the engines share CPUs: {sets:?}");
        assert!(health["device"].as_str().unwrap().contains("(cpus "), "{health}");
        // The runtime's compute threads, started inside the engine process, keep to its set.
        for (pid, set) in pids.iter().zip(&sets) {
            assert_threads_within(*pid, set);
        }
        println!("engine CPU sets: {sets:?}");
    }
    let batches = health["engine_calls"]["per_device"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect::<Vec<_>>();
    assert!(batches.iter().all(|&b| b > 0), "both engines ran batches: {batches:?}");
}

/// OpenVINO pins its compute threads by a CPU map of its own, one for the
/// whole process: two engines on threads of the server's process, kept to
/// CPU 0 and CPU 1, both computed on CPU 0 and served half as fast as in two
/// processes, their threads' masks rewritten. Each engine's thread keeps the
/// CPUs the server gave it.
#[test]
fn openvino_engines_on_threads_of_one_process_keep_their_own_cores() {
    let cores = physical_cores(&allowed_cpus(std::process::id(), None));
    if cores.len() < 2 {
        println!("skipped: {} physical core(s), nothing to split", cores.len());
        return;
    }
    let entry = common::model_entry("pair", "all-minilm-l6-v2", "device = [\"cpu\", \"cpu\"]\nisolation = \"thread\"\nload_policy = \"resident\"")
        .replace("engine = \"onnxruntime\"", "engine = \"openvino\"");
    let server = Server::start(Some(&entry), &[]);
    let texts = fixture_texts();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (url, texts) = (server.url.clone(), texts.clone());
            thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                for _ in 0..3 {
                    let r = client.post(format!("{url}/v1/embeddings")).json(&json!({"model": "pair", "input": texts})).send().unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let health = server.model_health("pair");
    assert_eq!(health["engine"], "openvino", "{health}");
    assert!(health["engine_pids"].as_array().is_none_or(Vec::is_empty), "engines should run on the server's threads: {health}");
    let device = health["device"].as_str().unwrap();
    let sets: Vec<Vec<usize>> = device.split("(cpus ").skip(1).map(|rest| cpu_list(rest.split(')').next().unwrap())).collect();
    assert_eq!(sets.len(), 2, "{health}");
    assert!(sets[0].iter().all(|c| !sets[1].contains(c)), "the engines share CPUs: {sets:?}");
    // The thread eeane started for engine i is the first of the threads named
    // after it (the runtime's own threads inherit the name).
    let pid = server.pid();
    let mut tasks: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let tid = t.unwrap().file_name().into_string().unwrap();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
            (tid.parse().unwrap(), comm.trim().to_string())
        })
        .collect();
    tasks.sort();
    for (i, set) in sets.iter().enumerate() {
        let name = format!("engine-pair-{i}");
        let (tid, _) = tasks.iter().find(|(_, comm)| *comm == name).unwrap_or_else(|| panic!("no thread {name}: {tasks:?}"));
        let allowed = allowed_cpus(pid, Some(&tid.to_string()));
        assert_eq!(&allowed, set, "engine {i}'s thread may run on {allowed:?}, not on the CPUs it was given");
    }
    println!("two OpenVINO engines on threads of one process: {device}");
}

#[test]
fn an_engine_in_a_cpu_restricted_server_keeps_to_its_cpus_and_threads() {
    let mine = allowed_cpus(std::process::id(), None);
    let cores = physical_cores(&mine);
    if cores.len() < 2 {
        println!("skipped: {} physical core(s); a mask of one CPU would not restrict anything", cores.len());
        return;
    }
    // The server inherits this thread's mask, as under `taskset -c N`.
    // SAFETY: cpu_set_t is plain data; CPU_SET is bounded by CPU_SETSIZE.
    unsafe {
        let mut mask: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(mine[0], &mut mask);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mask), 0);
    }
    let config = ["unset", "one", "two"]
        .iter()
        .zip(["", "threads = 1", "threads = 2"])
        .map(|(id, threads)| common::model_entry(id, "all-minilm-l6-v2", &format!("load_policy = \"resident\"\n{threads}")))
        .collect::<String>();
    let server = Server::start(Some(&config), &[]);
    let counts: Vec<usize> = ["unset", "one", "two"]
        .iter()
        .map(|id| {
            server.embed(json!("a text"), json!({"model": id}));
            let health = server.model_health(id);
            let pid = health["engine_pids"][0].as_u64().unwrap_or_else(|| panic!("{health}")) as u32;
            // Every thread: ONNX Runtime's default pool pins its threads to cores of its own choosing.
            assert_threads_within(pid, &[mine[0]]);
            std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count()
        })
        .collect();
    println!("engine threads on one CPU: unset {}, threads = 1 {}, threads = 2 {}", counts[0], counts[1], counts[2]);
    // ONNX Runtime's pool grows by one thread per intra-op thread: the
    // difference proves `threads` reached it, and unset must mean one.
    assert_eq!(counts[2], counts[1] + 1, "threads = 2 should start one more compute thread than threads = 1");
    assert_eq!(counts[0], counts[1], "with threads unset, an engine kept to one CPU should compute on one thread");
    assert!(server.model_health("unset")["device"].as_str().unwrap().contains(&format!("(cpus {})", mine[0])), "{}", server.model_health("unset"));
}

#[test]
fn eeane_bench_runs_all_four_phases_and_writes_json() {
    common::minilm_dir();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("bench.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_eeane"))
        .args(["bench", "--texts", "96", "--clients", "2", "--parallel", "4", "--json"])
        .arg(&json_path)
        .current_dir(dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("(2)/(1)") && stdout.contains("(1)/(4)"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json_path).unwrap()).unwrap();
    assert_eq!(report["texts"], 96);
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 4);
    assert!(phases.iter().all(|p| p["texts_per_s"].as_f64().unwrap() > 0.0));
    assert!(stdout.contains("tokenizer alone:"), "{stdout}");
    for rate in ["tokenizer_one_thread_per_s", "tokenizer_all_cores_per_s"] {
        assert!(report[rate].as_f64().unwrap() > 0.0, "{rate}: {report}");
    }
}
