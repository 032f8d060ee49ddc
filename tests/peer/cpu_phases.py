"""Where a load's time goes on one eeane server: the CPU seconds of the server,
its engine processes and this client over each phase, with the engines' batch
counters from /health.

One model entry (cpu_peers.py's model, buckets and corpus; `precision =
"auto"` unless --entry says otherwise) on a fresh server, then ROUNDS times a
bulk phase (32 texts a request, 8 clients) and a one-text phase (32 at once).
Each phase prints its rate, wall time, the server's and each engine process's
utime+stime, this process's, the engine batches, rows a batch, and padded and
real tokens. A fresh engine's rounds show how much its first shapes cost.

--first-call times, from Python OpenVINO at bf16 on one core, the first and
the next two calls of shapes this process has not run, to show what a new
shape costs an engine that prepares each one.

Usage:
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_phases.py --eeane target/release/eeane [--rounds 3] [--entry TOML]
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_phases.py --first-call
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_peers as peers  # noqa: E402


def cpu_seconds(pid):
    """utime + stime of a process, its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def model_health(port, model):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/health")
    return next(m for m in json.loads(conn.getresponse().read())["models"] if m["id"] == model)


def phases(args):
    texts = peers.corpus(args.texts)
    work = Path(tempfile.mkdtemp(prefix="eeane-phases-"))
    port = peers.free_port()
    (work / "eeane.toml").write_text(f"[server]\nport = {port}\nkeep_alive = -1\ncoalesce_requests = false\n\n"
                                     + peers.model_entry("m", args.entry))
    server = subprocess.Popen([args.eeane, "--config", str(work / "eeane.toml"), "serve"], stdout=subprocess.DEVNULL,
                              stderr=open(work / "eeane.log", "w"))
    try:
        peers.wait_ready(port, "m", server)
        health = model_health(port, "m")
        engines = [pid for pid in health.get("engine_pids") or [] if pid]
        print(f"served: {health.get('variant', {}).get('chosen') or health.get('engine')}, engine processes {engines}")
        for r in range(args.rounds):
            for phase, per_request, clients in (("bulk", 32, 8), ("one text a request", 1, 32)):
                calls0, server0, engines0, client0 = model_health(port, "m")["engine_calls"], cpu_seconds(server.pid), [cpu_seconds(p) for p in engines], os.times()
                started = time.perf_counter()
                rate = peers.load_rate(port, "m", texts, per_request, clients)
                wall = time.perf_counter() - started
                calls1, server1, engines1, client1 = model_health(port, "m")["engine_calls"], cpu_seconds(server.pid), [cpu_seconds(p) for p in engines], os.times()
                d = {k: calls1[k] - calls0[k] for k in ("batches", "rows", "padded_tokens", "real_tokens")}
                engine_cpu = [round(b - a, 2) for a, b in zip(engines0, engines1)]
                client_cpu = client1.user + client1.system - client0.user - client0.system
                print(f"round {r + 1}, {phase}: {rate:.1f} texts/s, wall {wall:.2f} s, CPU s: server {server1 - server0:.2f}, "
                      f"engines {engine_cpu}, client {client_cpu:.2f}; {d['batches']} batches of {d['rows'] / max(1, d['batches']):.1f} rows, "
                      f"{d['padded_tokens']} padded and {d['real_tokens']} real tokens", flush=True)
    finally:
        server.terminate()
        server.wait()


def first_call():
    import numpy as np
    import openvino as ov
    core = ov.Core()
    model = core.read_model(str(peers.MODEL_DIR / "model.onnx"))
    shape = ov.PartialShape([ov.Dimension(1, 64), ov.Dimension(1, 256)])
    model.reshape({i.get_any_name(): shape for i in model.inputs})
    request = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
                                                "INFERENCE_NUM_THREADS": 1}).create_infer_request()
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

    def call(rows, seq):
        feed = {name: np.ones((rows, seq), np.int64) for name in ("input_ids", "attention_mask")}
        feed["token_type_ids"] = np.zeros((rows, seq), np.int64)
        started = time.perf_counter()
        request.infer(feed)
        return (time.perf_counter() - started) * 1e3

    call(8, 64)
    for rows, seq in [(5, 80), (7, 96), (11, 112), (13, 64), (17, 48), (19, 128), (6, 144), (9, 32), (21, 80), (3, 176)]:
        print(f"{rows}x{seq}: first call {call(rows, seq):.1f} ms, then {call(rows, seq):.1f} and {call(rows, seq):.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eeane", help="the eeane binary")
    parser.add_argument("--entry", default='precision = "auto"', help="TOML lines of the model entry beyond cpu_peers.py's")
    parser.add_argument("--texts", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-call", action="store_true", help="time first calls of new shapes in Python OpenVINO instead")
    args = parser.parse_args()
    if args.first_call:
        first_call()
    elif args.eeane:
        phases(args)
    else:
        parser.error("--eeane or --first-call")


if __name__ == "__main__":
    main()
