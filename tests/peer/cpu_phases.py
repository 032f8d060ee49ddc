"""Where a load's time goes on one eeane server: the CPU seconds of the server,
its engine processes and this client over each phase, with the engines' batch
counters from /health.

One model entry (cpu_peers.py's model, buckets and corpus; `precision =
"auto"` unless --entry says otherwise; --graph serves another ONNX file of
the same inputs and outputs) on a fresh server, then ROUNDS times a
bulk phase (32 texts a request, 8 clients) and a one-text phase (32 at once,
or --one-clients).
Each phase prints its rate, wall time, the server's and each engine process's
utime+stime, this process's, the engine batches, rows a batch, and padded and
real tokens; after a one-text phase, the latency of one text a second later
(the first request on an idle server) and then the idle p50. A fresh engine's rounds show how much its first shapes cost.

--plan-log runs the server with the batcher's trace on and prints, for each
phase, how many sequences waited in the pool when a batch was planned against
how many the batch took.

--first-call times, from Python OpenVINO at bf16 on one core, the first and
the next two calls of shapes this process has not run, to show what a new
shape costs an engine that prepares each one.

--call-cost fits, from the same engine warm (every shape run before), a call's
time as a fixed cost plus a cost per token, prints each shape's time run
again, and times small shapes taken in turn against each run again: what a
call of few rows pays beyond its tokens, and what a change of shape adds.
--openvino-property KEY=VALUE (repeatable) compiles with extra properties.

Usage:
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_phases.py --eeane target/release/eeane [--rounds 3] [--entry TOML]
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_phases.py --first-call
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_phases.py --call-cost [--openvino-property SNIPPETS_MODE=DISABLE]
"""
import argparse
import http.client
import json
import os
import re
import statistics
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
                                     + peers.model_entry("m", args.entry, args.graph))
    env = {**os.environ, "EEANE_LOG": "info,eeane::batcher=trace"} if args.plan_log else None
    log = work / "eeane.log"
    server = subprocess.Popen([args.eeane, "--config", str(work / "eeane.toml"), "serve"], stdout=subprocess.DEVNULL,
                              stderr=open(log, "w"), env=env)
    try:
        peers.wait_ready(port, "m", server)
        health = model_health(port, "m")
        engines = [pid for pid in health.get("engine_pids") or [] if pid]
        print(f"served: {health.get('variant', {}).get('chosen') or health.get('engine')}, engine processes {engines}")
        for r in range(args.rounds):
            for phase, per_request, clients in (("bulk", 32, 8), (f"one text a request, {args.one_clients} at once", 1, args.one_clients)):
                log_at = log.stat().st_size
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
                if per_request == 1:
                    # An idle server again: the batcher must not hold the next request back.
                    time.sleep(1)
                    started = time.perf_counter()
                    peers.post(http.client.HTTPConnection("127.0.0.1", port, timeout=60), "/v1/embeddings",
                               {"input": [texts[0]], "model": "m", "encoding_format": "base64"})
                    print(f"  one text, 1 s after the phase: {(time.perf_counter() - started) * 1e3:.1f} ms; "
                          f"idle p50 {peers.idle_p50(port, 'm', texts, 10):.1f} ms")
                if args.plan_log:
                    with open(log, errors="replace") as f:
                        f.seek(log_at)
                        plans = [(int(m[1]), int(m[2])) for m in re.finditer(r"batch planned waiting=(\d+) rows=(\d+)", f.read())]
                    if plans:
                        print(f"  {len(plans)} batches planned: sequences waiting in the pool, mean {statistics.mean(w for w, _ in plans):.1f}, "
                              f"median {statistics.median(w for w, _ in plans):.0f}; rows taken, mean {statistics.mean(r for _, r in plans):.1f}")
    finally:
        server.terminate()
        server.wait()


def openvino_call(extra=None):
    """Python OpenVINO at bf16 on one core (bounded shapes up to 64x256, as
    eeane's last bucket), with `extra` compile properties, and a function
    that times one call of a shape in ms."""
    import numpy as np
    import openvino as ov
    core = ov.Core()
    model = core.read_model(str(peers.MODEL_DIR / "model.onnx"))
    shape = ov.PartialShape([ov.Dimension(1, 64), ov.Dimension(1, 256)])
    model.reshape({i.get_any_name(): shape for i in model.inputs})
    request = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
                                                "INFERENCE_NUM_THREADS": 1, **(extra or {})}).create_infer_request()
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

    def call(rows, seq):
        feed = {name: np.ones((rows, seq), np.int64) for name in ("input_ids", "attention_mask")}
        feed["token_type_ids"] = np.zeros((rows, seq), np.int64)
        started = time.perf_counter()
        request.infer(feed)
        return (time.perf_counter() - started) * 1e3

    return ov.__version__, call


def first_call():
    _, call = openvino_call()
    call(8, 64)
    for rows, seq in [(5, 80), (7, 96), (11, 112), (13, 64), (17, 48), (19, 128), (6, 144), (9, 32), (21, 80), (3, 176)]:
        print(f"{rows}x{seq}: first call {call(rows, seq):.1f} ms, then {call(rows, seq):.1f} and {call(rows, seq):.1f}")


def in_turn_best(call, shapes, rounds):
    """Each shape's best time over `rounds` passes that take the shapes in
    turn (so every call changes shape), after two warm-up calls each."""
    for s in shapes:
        call(*s)
        call(*s)
    best = {s: float("inf") for s in shapes}
    for _ in range(rounds):
        for s in shapes:
            best[s] = min(best[s], call(*s))
    return best


def call_cost(extra=None):
    """A warm engine's call time as fixed + per-token cost (least squares over
    the best of 5 of each shape, shapes taken in turn), each shape's time run
    again, and what a change of shape costs: small shapes taken in turn
    against each run again."""
    import numpy as np
    version, call = openvino_call(extra)
    rows_list, seqs = (1, 2, 4, 8, 16, 32), (16, 32, 64, 128)
    shapes = [(rows, seq) for rows in rows_list for seq in seqs]
    best = in_turn_best(call, shapes, 5)
    tokens = np.array([r * q for r, q in shapes], float)
    fixed, per_token = np.linalg.lstsq(np.vstack([np.ones_like(tokens), tokens]).T, np.array([best[s] for s in shapes]), rcond=None)[0]
    print(f"OpenVINO {version} bf16 {extra or ''}, one thread, shapes taken in turn: {fixed:.2f} ms a call + {per_token * 1e3:.1f} us a token "
          f"(a call costs as much as {fixed / per_token:.0f} tokens); 1x32 {best[(1, 32)]:.2f} ms, 32x128 {best[(32, 128)]:.2f} ms")
    again = {s: min(call(*s) for _ in range(5)) for s in shapes}
    print("each shape run again, best of 5, ms (rows x length):")
    print("rows " + "".join(f"{q:>9}" for q in seqs))
    for rows in rows_list:
        print(f"{rows:>4} " + "".join(f"{again[(rows, q)]:9.2f}" for q in seqs))
    small = [(5, 48), (7, 64), (3, 96), (9, 32), (6, 80), (4, 128), (8, 48), (2, 160)]
    in_turn = in_turn_best(call, small, 6)
    repeated = {s: min(call(*s) for _ in range(6)) for s in small}
    print(f"{len(small)} small shapes: in turn {sum(in_turn.values()):.1f} ms, each run again {sum(repeated.values()):.1f} ms: "
          f"a change of shape costs {(sum(in_turn.values()) - sum(repeated.values())) / len(small):.2f} ms a call")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eeane", help="the eeane binary")
    parser.add_argument("--entry", default='precision = "auto"', help="TOML lines of the model entry beyond cpu_peers.py's")
    parser.add_argument("--texts", type=int, default=1536)
    parser.add_argument("--graph", help="serve this ONNX file (same inputs and outputs) in place of the model's, e.g. cpu_packing.py --write-unpadded's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one-clients", type=int, default=32, help="texts in flight in the one-text phase (32, as cpu_peers.py)")
    parser.add_argument("--plan-log", action="store_true", help="print the pool's size against the rows taken, per phase")
    parser.add_argument("--first-call", action="store_true", help="time first calls of new shapes in Python OpenVINO instead")
    parser.add_argument("--call-cost", action="store_true", help="fit a warm OpenVINO call's fixed and per-token cost instead")
    parser.add_argument("--openvino-property", action="append", default=[], metavar="KEY=VALUE",
                        help="with --call-cost: an extra OpenVINO compile property, e.g. SNIPPETS_MODE=DISABLE")
    args = parser.parse_args()
    if args.first_call:
        first_call()
    elif args.call_cost:
        call_cost(dict(p.split("=", 1) for p in args.openvino_property))
    elif args.eeane:
        phases(args)
    else:
        parser.error("--eeane, --first-call or --call-cost")


if __name__ == "__main__":
    main()
