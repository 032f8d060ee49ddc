"""Two eeane binaries (say, before and after a change) on the same models, interleaved in one run.

Rows: ONNX Runtime fp32 as shipped, two ONNX Runtime engines of half the cores
with spinning on, and OpenVINO at the fastest precision this CPU has (bf16
with AVX512-BF16 or AMX, else f32). Every row runs on both binaries in turn,
in every round (best round kept), against cpu_peers.py's in-process limit.
Each row also gives the mean rows of an engine batch and, where the binary
exports it, eeane_call_cost_tokens.

Usage:
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_ab.py --old OLD/eeane --new NEW/eeane [--texts N --rounds R]
"""
import argparse
import http.client
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_peers as peers  # noqa: E402
from cpu_knobs import metric  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the eeane binary before")
    parser.add_argument("--new", required=True, help="the eeane binary after")
    parser.add_argument("--texts", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    cores = os.cpu_count()
    half = max(1, cores // 2)
    ov = "bf16" if peers.cpu_has_bf16() else "f32"
    rows = {"ONNX Runtime fp32": 'engine = "onnxruntime"',
            f"ONNX Runtime fp32, 2 engines of {half} threads, spinning on":
                f'engine = "onnxruntime"\ndevice = ["cpu", "cpu"]\nthreads = {half}\nspin = true',
            f"OpenVINO {ov}": f'engine = "openvino"\nprecision = "{ov}"'}
    ids = {label: f"ab{i}" for i, label in enumerate(rows)}
    texts = peers.corpus(args.texts)
    work = Path(tempfile.mkdtemp(prefix="eeane-ab-"))
    servers, ports, metrics = {}, {}, {}
    for name, binary in (("old", args.old), ("new", args.new)):
        ports[name] = peers.free_port()
        (work / f"{name}.toml").write_text(f"[server]\nport = {ports[name]}\nkeep_alive = -1\ncoalesce_requests = false\n\n"
                                           + "\n".join(peers.model_entry(ids[l], v) for l, v in rows.items()))
        servers[name] = subprocess.Popen([binary, "--config", str(work / f"{name}.toml"), "serve"], stdout=subprocess.DEVNULL,
                                         stderr=open(work / f"{name}.log", "w"))
    try:
        for name, server in servers.items():
            for label in rows:
                peers.wait_ready(ports[name], ids[label], server)
        limit = peers.Limit(texts)
        best = {"limit": 0.0, **{(n, l): {"bulk": 0.0, "single": 0.0} for n in servers for l in rows}}
        for r in range(args.rounds):
            best["limit"] = max(best["limit"], limit.run())
            for label in rows:
                for name in servers:
                    bulk = peers.load_rate(ports[name], ids[label], texts, 32, 8)
                    single = peers.load_rate(ports[name], ids[label], texts, 1, 32)
                    b = best[(name, label)]
                    b["bulk"], b["single"] = max(b["bulk"], bulk), max(b["single"], single)
                    print(f"round {r + 1}: {name} {label}: bulk {bulk:.1f}, one text a request {single:.1f} texts/s", file=sys.stderr, flush=True)
        for name in servers:
            for label in rows:
                best[(name, label)]["idle_p50_ms"] = peers.idle_p50(ports[name], ids[label], texts)
            conn = http.client.HTTPConnection("127.0.0.1", ports[name], timeout=60)
            conn.request("GET", "/metrics")
            metrics[name] = conn.getresponse().read().decode()
    finally:
        for server in servers.values():
            server.terminate()
        for server in servers.values():
            server.wait()

    lim = best["limit"]
    print(f"{len(texts)} texts, {cores} cores, best of {args.rounds} interleaved rounds; limit (Python onnxruntime fp32 in process, "
          f"sorted batches of 32) {lim:.1f} texts/s\n")
    print("| row | binary | bulk / limit | one text a request / limit | one text / bulk | idle p50 ms | mean rows a batch | call cost tokens |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label in rows:
        for name in servers:
            b, m, i = best[(name, label)], metrics[name], ids[label]
            mean_rows = metric(m, "eeane_batch_rows_sum", i) / metric(m, "eeane_batch_rows_count", i)
            print(f"| {label} | {name} | {b['bulk'] / lim:.2f} | {b['single'] / lim:.2f} | {b['single'] / b['bulk']:.2f} | "
                  f"{b['idle_p50_ms']:.1f} | {mean_rows:.1f} | {metric(m, 'eeane_call_cost_tokens', i):.0f} |")


if __name__ == "__main__":
    main()
