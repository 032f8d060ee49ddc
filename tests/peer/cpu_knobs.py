"""Which engine settings scale eeane on a CPU with many cores: one run.

Rows, each measured in every round, in turn (interleaved, best round kept),
against the same in-process limit as cpu_peers.py (Python onnxruntime fp32 on
the same model.onnx, sorted batches of 32, tokenization outside the timer):
- ONNX Runtime fp32 as eeane ships it (threads chosen by the runtime, spinning
  off), with spinning on, and as two engines (four on 8 cores or more), each
  on its own share of the cores (device = ["cpu", "cpu"]), spinning off and on;
- OpenVINO f32, and bf16 where the CPU has AVX512-BF16 or AMX: as shipped,
  and as two (four) engines on their own cores.

Each row: bulk (32 texts a request, 8 clients), one text a request (32 at
once), the idle p50 of one text, and the mean rows of an engine batch.

Usage (the venv models/setup.sh makes has onnxruntime and tokenizers):
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_knobs.py --eeane target/release/eeane [--json OUT]
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_peers as peers  # noqa: E402


def rows_for(cores):
    engines = [2, 4] if cores >= 8 else [2]
    rows = {"ONNX Runtime fp32, as shipped (spinning off)": 'engine = "onnxruntime"',
            "ONNX Runtime fp32, spinning on": 'engine = "onnxruntime"\nspin = true'}
    for n in engines:
        devices = ", ".join(['"cpu"'] * n)
        rows[f"ONNX Runtime fp32, {n} engines, each on its own cores"] = f'engine = "onnxruntime"\ndevice = [{devices}]'
        rows[f"ONNX Runtime fp32, {n} engines, each on its own cores, spinning on"] = f'engine = "onnxruntime"\ndevice = [{devices}]\nspin = true'
    for precision in ["f32", "bf16"] if peers.cpu_has_bf16() else ["f32"]:
        rows[f"OpenVINO {precision}, as shipped"] = f'engine = "openvino"\nprecision = "{precision}"'
        for n in engines:
            devices = ", ".join(['"CPU"'] * n)
            rows[f"OpenVINO {precision}, {n} engines, each on its own cores"] = f'engine = "openvino"\nprecision = "{precision}"\ndevice = [{devices}]'
    return rows


def metric(text, name, model):
    m = re.search(rf'^{name}{{model="{model}"}} (\S+)', text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eeane", required=True, help="the eeane binary")
    parser.add_argument("--texts", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    cores = os.cpu_count()
    rows = rows_for(cores)
    ids = {label: f"knob{i}" for i, label in enumerate(rows)}
    texts = peers.corpus(args.texts)
    work = Path(tempfile.mkdtemp(prefix="eeane-knobs-"))
    port = peers.free_port()
    (work / "eeane.toml").write_text(f"[server]\nport = {port}\nkeep_alive = -1\ncoalesce_requests = false\n\n"
                                     + "\n".join(peers.model_entry(ids[l], v) for l, v in rows.items()))
    server = subprocess.Popen([args.eeane, "--config", str(work / "eeane.toml"), "serve"], stdout=subprocess.DEVNULL,
                              stderr=open(work / "eeane.log", "w"))
    try:
        for label in rows:
            peers.wait_ready(port, ids[label], server)
        limit = peers.Limit(texts)
        best = {"limit": 0.0, **{label: {"bulk": 0.0, "single": 0.0} for label in rows}}
        for r in range(args.rounds):
            best["limit"] = max(best["limit"], limit.run())
            print(f"round {r + 1}: limit {best['limit']:.1f} texts/s", file=sys.stderr, flush=True)
            for label in rows:
                bulk = peers.load_rate(port, ids[label], texts, 32, 8)
                single = peers.load_rate(port, ids[label], texts, 1, 32)
                best[label]["bulk"] = max(best[label]["bulk"], bulk)
                best[label]["single"] = max(best[label]["single"], single)
                print(f"round {r + 1}: {label}: bulk {bulk:.1f}, one text a request {single:.1f} texts/s", file=sys.stderr, flush=True)
        for label in rows:
            best[label]["idle_p50_ms"] = peers.idle_p50(port, ids[label], texts)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
    finally:
        server.terminate()
        server.wait()

    lim = best["limit"]
    lines = [f"{len(texts)} texts (Python stdlib paragraphs), all-MiniLM-L6-v2 model.onnx, {cores} cores, best of {args.rounds} "
             f"interleaved rounds; limit: Python onnxruntime fp32 in process, sorted batches of 32: {lim:.1f} texts/s", "",
             "| eeane setting | bulk / limit | one text a request / limit | one text / bulk | idle p50 ms | mean rows a batch |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label in rows:
        b = best[label]
        b["mean_rows"] = metric(metrics, "eeane_batch_rows_sum", ids[label]) / metric(metrics, "eeane_batch_rows_count", ids[label])
        lines.append(f"| {label} | {b['bulk'] / lim:.2f} | {b['single'] / lim:.2f} | {b['single'] / b['bulk']:.2f} | "
                     f"{b['idle_p50_ms']:.1f} | {b['mean_rows']:.1f} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"limit": lim, "cores": cores, "rows": best, "texts": len(texts)}, indent=2))


if __name__ == "__main__":
    main()
