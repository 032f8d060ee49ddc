//! tests/gpu/load.sh, the project's load generator (wrk with a body per
//! request), run briefly against a started server on the CPU: it waits for
//! the model, measures bulk and one text a request, and reports every run;
//! each request carried its own body (nothing coalesced), and where the CPU
//! went (the machine's, wrk's, the server's). Its figures are for
//! docs/performance.md, never asserted here.

mod common;

use std::process::Command;

use common::{model_entry, Server};
use serde_json::Value;

#[test]
fn the_load_generator_measures_bulk_and_one_text_a_request() {
    let server = Server::start(Some(&model_entry("all-minilm-l6-v2", "all-minilm-l6-v2", "")), &[]);
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..400).map(|i| format!("text {i}: {}", common::fixture_texts()[i % common::fixture_texts().len()])).collect();
    std::fs::write(dir.path().join("texts.json"), serde_json::to_string(&texts).unwrap()).unwrap();
    let out = dir.path().join("load.json");
    let pid = server.pid().to_string();
    let run = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/gpu/load.sh"))
        .arg(&server.url)
        .arg("all-minilm-l6-v2")
        .arg(dir.path().join("texts.json"))
        .arg(&out)
        .envs([
            ("LOAD_SECONDS", "2"),
            ("LOAD_BULK", "8"),
            ("LOAD_BULK_CONNECTIONS", "3"),
            ("LOAD_IN_FLIGHT", "4 16"),
            ("LOAD_THREADS", "2"),
            ("LOAD_SERVER_PID", pid.as_str()),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    println!("{stdout}");
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let shape: Vec<(&str, u64)> = rows.iter().map(|r| (r["mode"].as_str().unwrap(), r["connections"].as_u64().unwrap())).collect();
    assert_eq!(shape, [("bulk", 3), ("one", 4), ("one", 16)]);
    for row in &rows {
        assert!(row["texts_per_s"].as_f64().unwrap() > 0.0 && row["p50_ms"].as_f64() <= row["p99_ms"].as_f64(), "{row}");
        assert_eq!((row["not_2xx"].as_u64(), row["socket_errors"].as_u64()), (Some(0), Some(0)), "{row}");
        // Every text of the run computed: no request answered from an identical one in flight.
        assert_eq!(row["coalesced"].as_u64(), Some(0), "{row}");
        // No part of the CPU accounting is more than the machine has.
        let cores = row["cores"].as_f64().unwrap();
        for key in ["machine_busy_cores", "server_cores", "wrk_cores", "engine_process_cores", "server_cpu_us_per_text"] {
            let part = row[key].as_f64().unwrap_or_else(|| panic!("{key} missing: {row}"));
            assert!(key == "server_cpu_us_per_text" || (0.0..=cores * 1.05).contains(&part), "{key} outside 0..{cores}: {row}");
        }
        // wrk opens connections / threads a thread: its threads divide the connections.
        let (connections, threads) = (row["connections"].as_u64().unwrap(), row["wrk_threads"].as_u64().unwrap());
        assert_eq!(connections % threads, 0, "{row}");
        // The CPU counted covers wrk's measured seconds, not its start.
        assert!(row["measured_span_s"].as_f64().unwrap() <= row["seconds"].as_f64().unwrap() + 0.5, "{row}");
        // The server's CPU by thread name: its HTTP workers' group among them.
        assert!(row["server_threads_cores"].get("tokio-rt-worker").is_some_and(Value::is_f64), "{row}");
        // How the run was batched, from the model's /metrics around it: a
        // bulk request of 3 texts or more fills batches of more than one row.
        let rows_per_batch = row["rows_per_batch"].as_f64().unwrap_or_else(|| panic!("rows_per_batch missing: {row}"));
        assert!(row["batches"].as_u64() > Some(0) && rows_per_batch >= 1.0 && row["tokens_per_batch"].as_f64() >= Some(rows_per_batch), "{row}");
        if row["mode"] == "bulk" {
            assert!(rows_per_batch > 1.0, "{row}");
        }
    }
    // The server tokenized and answered every run: its CPU, counted in clock
    // ticks, is not zero over them all.
    assert!(rows.iter().map(|r| r["server_cores"].as_f64().unwrap()).sum::<f64>() > 0.0, "{rows:?}");
    let counters = &server.model_health("all-minilm-l6-v2")["counters"];
    assert_eq!(counters["coalesced"], 0, "two requests in flight carried the same body: {counters}");
}
