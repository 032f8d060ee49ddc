"""eeane against its CPU peers, interleaved in one run, on one ONNX file.

Rows, each measured in every round, in turn (this machine's figures move
20-30 % within an hour; interleaving keeps the ratios honest), best round kept:
- the limit: Python onnxruntime in process on the same model.onnx, batches of
  32 sorted by length, tokenization outside the timer;
- where the CPU has bf16, a second limit at bf16: Python OpenVINO on the same
  batches, asynchronously on its THROUGHPUT streams;
- eeane, one model entry per precision it offers here (ONNX Runtime fp32,
  OpenVINO f32, OpenVINO bf16 where the CPU has bf16) and the default,
  precision = "auto";
- TEI, when --tei-router names a text-embeddings-router binary
  (tests/peer/build_tei.sh builds it from TEI's source at a pinned commit,
  with its `ort` feature only).

Every row is timed warm: the limits after a pass over their batches, each
server after one untimed bulk pass.

Each server row: bulk (32 texts a request, 8 clients), one text a request
(32 at once), and the p50 latency of one text on the idle server. Requests
go to /v1/embeddings with base64 vectors on both servers, so the client
decodes the same bytes for each.

--cpus N runs everything (the limit with N threads, eeane, TEI) on N logical
CPUs of N different physical cores: a small machine carved out of a large one.
Both servers size themselves from the affinity mask they inherit.

Usage (the venv models/setup.sh makes has onnxruntime and tokenizers):
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_peers.py \\
      --eeane target/release/eeane [--tei-router PATH --tei-ort-lib DIR] \\
      [--cpus N] [--rows auto,ort-fp32] [--json OUT]
"""
import argparse
import asyncio
import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

CACHE = Path(os.environ.get("EEANE_CACHE_DIR", Path.home() / ".cache/eeane"))
MODEL_DIR = CACHE / "models/all-minilm-l6-v2"
MAX_TOKENS = 256
BUCKETS = """buckets = [
  { max_tokens = 24, max_batch = 64 },
  { max_tokens = 40, max_batch = 64 },
  { max_tokens = 64, max_batch = 32 },
  { max_tokens = 96, max_batch = 32 },
  { max_tokens = 160, max_batch = 32 },
]"""


def corpus(n):
    """Paragraphs of Python's standard library (code, docstrings, comments), 80-1200 characters, in a fixed order."""
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        for paragraph in path.read_text(errors="replace").split("\n\n"):
            paragraph = paragraph.strip("\n")
            if 80 <= len(paragraph) <= 1200:
                texts.append(paragraph)
            if len(texts) == n:
                return texts
    return texts


def model_entry(id, lines, graph=None):
    """An eeane [[models]] entry for the model, its settings plus `lines`;
    `graph`, another ONNX file with the same inputs and outputs."""
    return (f'[[models]]\nid = "{id}"\nmodel = "{graph or MODEL_DIR / "model.onnx"}"\ntokenizer = "{MODEL_DIR}/tokenizer.json"\n'
            f'pooling = "mean"\nmax_tokens = {MAX_TOKENS}\nload_policy = "resident"\n{BUCKETS}\n{lines}\n')


def cpu_has_bf16():
    flags = next((l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")), "")
    return "avx512_bf16" in flags.split() or "amx_bf16" in flags.split()


def one_cpu_per_core(n):
    """The first n allowed logical CPUs that sit on n different physical cores."""
    chosen, cores = [], set()
    for cpu in sorted(os.sched_getaffinity(0)):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()
        except OSError:
            core = ("?", str(cpu))
        if core not in cores:
            cores.add(core)
            chosen.append(cpu)
        if len(chosen) == n:
            return chosen
    raise SystemExit(f"--cpus {n}: only {len(chosen)} physical cores are allowed here")


class Limit:
    """The in-process limit: onnxruntime on the same file, sorted batches of 32."""

    def __init__(self, texts, threads=0):
        tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
        tok.enable_truncation(MAX_TOKENS)
        tok.no_padding()
        self.tokenizer = tok
        encoded = sorted((e.ids for e in tok.encode_batch(texts)), key=len)
        self.batches = []
        for i in range(0, len(encoded), 32):
            rows = encoded[i:i + 32]
            seq = max(map(len, rows))
            ids = np.zeros((len(rows), seq), np.int64)
            mask = np.zeros((len(rows), seq), np.int64)
            for r, row in enumerate(rows):
                ids[r, :len(row)] = row
                mask[r, :len(row)] = 1
            self.batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime's own choice, one per physical core
        self.session = ort.InferenceSession(str(MODEL_DIR / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.texts = len(texts)
        # The first runs allocate; the servers were warmed by their ready probe.
        for feed in self.batches[:2]:
            self.session.run(None, feed)

    def vector(self, text):
        """One text alone, unpadded: the reference vector the servers are held to."""
        ids = np.array([self.tokenizer.encode(text).ids], np.int64)
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})[0][0]
        v = hidden.mean(0)
        return v / np.linalg.norm(v)

    def run(self):
        started = time.perf_counter()
        for feed in self.batches:
            hidden = self.session.run(None, feed)[0]
            mask = feed["attention_mask"][..., None]
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        return self.texts / (time.perf_counter() - started)


class OpenVinoLimit:
    """A second in-process limit where the CPU has bf16: Python OpenVINO at
    bf16 on the same file and the same sorted batches of 32 (lengths padded
    to 16, as eeane's bf16 engine pads them), run asynchronously on the
    streams of OpenVINO's THROUGHPUT hint: its own best use of the cores."""

    def __init__(self, limit, threads=0):
        import openvino as ov
        self.version = ov.__version__
        core = ov.Core()
        model = core.read_model(str(MODEL_DIR / "model.onnx"))
        seq = max(b["input_ids"].shape[1] for b in limit.batches)
        shape = ov.PartialShape([ov.Dimension(1, 32), ov.Dimension(1, -(-seq // 16) * 16)])
        model.reshape({i.get_any_name(): shape for i in model.inputs})
        config = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "THROUGHPUT"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(model, "CPU", config)
        self.batches = []
        for feed in limit.batches:
            pad = -(-feed["input_ids"].shape[1] // 16) * 16 - feed["input_ids"].shape[1]
            self.batches.append({k: np.pad(v, ((0, 0), (0, pad))) for k, v in feed.items()})
        self.texts = limit.texts
        self.padded_tokens = sum(feed["input_ids"].size for feed in self.batches)
        self.queue = ov.AsyncInferQueue(self.compiled, self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.queue.set_callback(self.pool)
        self.run()  # the first calls of each shape compile kernels

    def pool(self, request, mask):
        hidden = request.get_output_tensor(0).data
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)

    def run(self):
        started = time.perf_counter()
        for feed in self.batches:
            self.queue.start_async(feed, feed["attention_mask"])
        self.queue.wait_all()
        return self.texts / (time.perf_counter() - started)


def post(conn, path, body, headers=None):
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def vectors(answer):
    return [np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32) for d in answer["data"]]


def load_rate(port, model, texts, per_request, clients):
    """Texts a second for `texts` sent `per_request` at a time by `clients`
    concurrent keep-alive connections. One asyncio loop drives them all: 32
    Python threads (the first version of this client) spent 0.5 CPU-seconds a
    one-text phase handing the GIL around, on the cores the servers use, and
    that CPU counted against every server row but none of the limits. Each
    answer is still parsed and its vectors counted."""
    chunks = [texts[i:i + per_request] for i in range(0, len(texts), per_request)]
    bodies = [json.dumps({"input": chunk, "model": model, "encoding_format": "base64"}).encode() for chunk in chunks]
    return asyncio.run(_load(port, bodies, [len(c) for c in chunks], clients, len(texts)))


async def _load(port, bodies, counts, clients, n_texts):
    queue = list(range(len(bodies)))[::-1]

    async def client():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                i = queue.pop()
                writer.write(b"POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(bodies[i]), bodies[i]))
                status = await reader.readline()
                length = None
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length is None:
                    raise RuntimeError(f"no content-length in the answer ({status!r})")
                data = await reader.readexactly(length)
                if not status.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"HTTP {status.decode().strip()}: {data[:300]!r}")
                if len(json.loads(data)["data"]) != counts[i]:
                    raise RuntimeError(f"{counts[i]} texts sent, a different number of vectors back")
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return n_texts / (time.perf_counter() - started)


def idle_p50(port, model, texts, n=40):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies = []
    for text in texts[:n]:
        started = time.perf_counter()
        post(conn, "/v1/embeddings", {"input": [text], "model": model, "encoding_format": "base64"})
        latencies.append((time.perf_counter() - started) * 1e3)
    return statistics.median(latencies)


def wait_ready(port, model, proc, limit=600):
    started = time.time()
    while time.time() - started < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {model} exited ({proc.returncode})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            post(conn, "/v1/embeddings", {"input": ["ready?"], "model": model, "encoding_format": "base64"})
            return
        except (ConnectionError, OSError, RuntimeError):
            time.sleep(0.5)
    raise RuntimeError(f"{model} not ready after {limit} s")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_precision_line(best, chosen):
    """auto's bulk against the in-process limit at the precision auto serves:
    the OpenVINO bf16 limit for a bf16 variant, onnxruntime's for the rest."""
    bf16 = "bf16" in chosen.split()
    limit = best["openvino_bf16_limit"] if bf16 else best["limit"]
    name = "OpenVINO bf16 limit" if bf16 else "limit"
    if not limit:
        return f"auto ({chosen}) bulk / {name}: not measured"
    return f"auto ({chosen}) bulk / the {name}, the same precision: {best['eeane auto (the default)']['bulk'] / limit:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eeane", required=True, help="the eeane binary")
    parser.add_argument("--tei-router", help="a text-embeddings-router binary (TEI), built from source with its ort feature")
    parser.add_argument("--tei-ort-lib", help="the directory holding the libonnxruntime.so.1 that binary links")
    parser.add_argument("--texts", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=0, help="run on this many physical cores, one logical CPU each (default: all)")
    parser.add_argument("--rows", default="auto,ort-fp32,ov-f32,ov-bf16",
                        help="which eeane entries to measure, of auto, ort-fp32, ov-f32, ov-bf16 (default: all)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.cpus:
        cpus = one_cpu_per_core(args.cpus)
        os.sched_setaffinity(0, cpus)  # the servers started below inherit it
        print(f"running on CPUs {cpus}", file=sys.stderr)

    texts = corpus(args.texts)
    work = Path(tempfile.mkdtemp(prefix="eeane-peers-"))
    eeane_models = {"eeane auto (the default)": ("auto", 'precision = "auto"'),
                    "eeane ONNX Runtime fp32": ("ort-fp32", 'engine = "onnxruntime"'),
                    "eeane OpenVINO f32": ("ov-f32", 'engine = "openvino"\nprecision = "f32"')}
    if cpu_has_bf16():
        eeane_models["eeane OpenVINO bf16"] = ("ov-bf16", 'engine = "openvino"\nprecision = "bf16"')
    rows = set(args.rows.split(","))
    if "auto" not in rows or not rows <= {"auto", "ort-fp32", "ov-f32", "ov-bf16"}:
        raise SystemExit(f"--rows {args.rows}: a subset of auto,ort-fp32,ov-f32,ov-bf16 that includes auto")
    eeane_models = {label: entry for label, entry in eeane_models.items() if entry[0] in rows}
    port = free_port()
    config = f"[server]\nport = {port}\nkeep_alive = -1\ncoalesce_requests = false\n\n" + "\n".join(model_entry(i, l) for i, l in eeane_models.values())
    (work / "eeane.toml").write_text(config)
    servers = [subprocess.Popen([args.eeane, "--config", str(work / "eeane.toml"), "serve"], stdout=subprocess.DEVNULL,
                                stderr=open(work / "eeane.log", "w"))]
    targets = [(label, port, model) for label, (model, _) in eeane_models.items()]
    if args.tei_router:
        tei_port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if args.tei_ort_lib:
            env["LD_LIBRARY_PATH"] = args.tei_ort_lib
        servers.append(subprocess.Popen([args.tei_router, "--model-id", str(MODEL_DIR), "--pooling", "mean", "--hostname", "127.0.0.1",
                                         "--port", str(tei_port), "--prometheus-port", str(free_port())],
                                        stdout=open(work / "tei.log", "w"), stderr=subprocess.STDOUT, env=env))
        targets.append(("TEI 1.9.3, ONNX Runtime backend", tei_port, "all-minilm-l6-v2"))
    try:
        for label, p, model in targets:
            wait_ready(p, model, servers[0] if p == port else servers[-1])
        # Same vectors: every row embeds the same text to within cosine 0.9999 of the limit's.
        probe = texts[:8]
        limit = Limit(texts, threads=args.cpus)
        want = [limit.vector(t) for t in probe]
        fidelity = {}
        for label, p, model in targets:
            got = vectors(post(http.client.HTTPConnection("127.0.0.1", p, timeout=60), "/v1/embeddings",
                               {"input": probe, "model": model, "encoding_format": "base64"}))
            fidelity[label] = min(float(a @ b / np.linalg.norm(a)) for a, b in zip(got, want))

        ov_limit = OpenVinoLimit(limit, threads=args.cpus) if cpu_has_bf16() else None
        # The limits ran a pass over their batches before timing (OpenVINO
        # prepares each new shape on its first call); each server gets one
        # untimed bulk pass too, so every row is timed warm.
        for label, p, model in targets:
            load_rate(p, model, texts, 32, 8)
        best = {"limit": 0.0, "openvino_bf16_limit": 0.0}
        for label, *_ in targets:
            best[label] = {"bulk": 0.0, "single": 0.0}
        for r in range(args.rounds):
            best["limit"] = max(best["limit"], limit.run())
            if ov_limit:
                best["openvino_bf16_limit"] = max(best["openvino_bf16_limit"], ov_limit.run())
            print(f"round {r + 1}: limit {best['limit']:.1f}, OpenVINO bf16 limit {best['openvino_bf16_limit']:.1f} texts/s", file=sys.stderr)
            for label, p, model in targets:
                bulk = load_rate(p, model, texts, 32, 8)
                single = load_rate(p, model, texts, 1, 32)
                best[label]["bulk"] = max(best[label]["bulk"], bulk)
                best[label]["single"] = max(best[label]["single"], single)
                print(f"round {r + 1}: {label}: bulk {bulk:.1f}, one text a request {single:.1f} texts/s", file=sys.stderr)
        for label, p, model in targets:
            best[label]["idle_p50_ms"] = idle_p50(p, model, texts)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        auto = next(m for m in health["models"] if m["id"] == "auto")
    finally:
        for s in servers:
            s.terminate()
        for s in servers:
            s.wait()

    lim = best["limit"]
    tei = next((best[l] for l, *_ in targets if l.startswith("TEI")), None)
    lines = [f"{len(texts)} texts (Python stdlib paragraphs, 80-1200 characters), all-MiniLM-L6-v2 model.onnx, "
             f"{len(os.sched_getaffinity(0))} CPUs ({os.cpu_count()} on the machine), best of {args.rounds} interleaved rounds",
             f"limit: Python onnxruntime {ort.__version__} in process, sorted batches of 32: {lim:.1f} texts/s",
             *([f"OpenVINO bf16 limit: Python OpenVINO {ov_limit.version} in process, the same batches, async on THROUGHPUT streams: "
                f"{best['openvino_bf16_limit']:.1f} texts/s ({ov_limit.padded_tokens} padded tokens a pass)"
                + (f"; eeane OpenVINO bf16 bulk / it: {best['eeane OpenVINO bf16']['bulk'] / best['openvino_bf16_limit']:.2f}"
                   if "eeane OpenVINO bf16" in best else "")]
               if ov_limit else []),
             f"auto chose: {auto.get('variant', {}).get('chosen')} ({auto.get('variant', {}).get('reason')})",
             same_precision_line(best, auto.get("variant", {}).get("chosen") or ""), "",
             "| server | bulk / limit | one text a request / limit | one text / bulk | idle p50 ms | min cosine to limit |"
             + (" bulk vs TEI |" if tei else ""),
             "| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if tei else "")]
    for label, *_ in targets:
        b = best[label]
        row = (f"| {label} | {b['bulk'] / lim:.2f} | {b['single'] / lim:.2f} | {b['single'] / b['bulk']:.2f} | "
               f"{b['idle_p50_ms']:.1f} | {fidelity[label]:.6f} |")
        if tei:
            row += f" {b['bulk'] / tei['bulk']:.2f} |"
        lines.append(row)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"limit": lim, "openvino_bf16_limit": best["openvino_bf16_limit"], "rows": best, "fidelity": fidelity, "auto": auto.get("variant"), "texts": len(texts),
                                               "cpus": sorted(os.sched_getaffinity(0))}, indent=2))


if __name__ == "__main__":
    main()
