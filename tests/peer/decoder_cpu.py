"""A decoder embedder with Qwen3-Embedding-0.6B's shapes on this CPU: eeane
(pulled from a Hub look-alike on loopback, as a user pulls it, then served
over HTTP) against sentence-transformers on torch's CPU build, on the same
texts, in one run.

The weights are random (none of that size can be fetched here), so the
figures are speed, load time and memory; the vectors are held to
sentence-transformers' only as a check that both compute the same network.

  make:  a Qwen3Model with Qwen3-Embedding-0.6B's config (hidden 1024, 28
         layers, 16 query and 8 key/value heads of 128, vocab 151,669, tied
         embeddings: 596M parameters), written by transformers'
         save_pretrained, with sentence-transformers' modules (last-token
         pooling, Normalize) and the tokenizer of tests/hub/fixtures/qwen3-tiny
         (it appends the end-of-text token as Qwen3-Embedding's does).
         Needs torch, transformers and sentence-transformers.
  st:    sentence-transformers' row (run by `bench` in the torch venv).
  bench: the texts (paragraphs of Python's standard library, of 90..250
         tokens, so a mean near 135), then
         - sentence-transformers: load time, peak RSS, texts/s of encode
           (batch_size 16, torch's threads = the cores), warm;
         - eeane: `eeane pull` (its prepare time: the graph built from the
           safetensors and checked against the float64 numpy network), then
           per variant (onnxruntime fp32, openvino fp32, openvino bf16) a
           fresh `eeane serve`: the first request's wait (the load), the RSS
           of the server and its engine processes, and texts/s with 2
           clients of 8 texts a request, warm; each variant's min cosine to
           sentence-transformers' vectors.

  /tmp/torchvenv/bin/python tests/peer/decoder_cpu.py make DIR
  ~/.cache/eeane/venv/bin/python tests/peer/decoder_cpu.py bench --repo DIR \\
      --eeane target/release/eeane --st-python /tmp/torchvenv/bin/python [--texts 64]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REPO_ID = "bench/qwen3-embedding-0.6b-shaped"


def make(out):
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import Qwen3Config, Qwen3Model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fixture = ROOT / "tests/hub/fixtures/qwen3-tiny"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(fixture / f, out / f)
    eos = json.loads((fixture / "config.json").read_text())["eos_token_id"]
    config = Qwen3Config(vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos)
    torch.manual_seed(0)
    model = Qwen3Model(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    transformer = models.Transformer(str(out), max_seq_length=256)
    st = SentenceTransformer(modules=[transformer, models.Pooling(1024, pooling_mode="lasttoken"), models.Normalize()])
    st.save(str(out))
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")


def texts_for(tokenizer_path, n):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        for paragraph in path.read_text(errors="replace").split("\n\n"):
            paragraph = paragraph.strip("\n")
            if 90 <= len(tok.encode(paragraph).ids) <= 250:
                texts.append(paragraph)
            if len(texts) == n:
                return texts
    return texts


def rss_kib(pids):
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def tree(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    children = [int(p) for p in out]
    return [pid] + [q for c in children for q in tree(c)]


def st_row(repo, texts_file, out_file):
    import resource

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count())
    texts = json.loads(Path(texts_file).read_text())
    started = time.perf_counter()
    st = SentenceTransformer(str(repo), device="cpu")
    st.max_seq_length = 256
    load = time.perf_counter() - started
    st.encode(texts[:16], batch_size=16)
    started = time.perf_counter()
    vectors = st.encode(texts, batch_size=16, convert_to_numpy=True)
    rate = len(texts) / (time.perf_counter() - started)
    np.save(out_file, vectors)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"load_s": load, "texts_per_s": rate, "peak_rss_mib": rss / 1024, "torch": torch.__version__}))


WRK_SCRIPT = """
local bodies = {}
local counter = 0
init = function(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
end
request = function()
  counter = counter + 1
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, bodies[(counter % #bodies) + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %d\\n", summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout))
end
"""


def wrk_rate(work, port, model, texts, per_request=8, connections=2, seconds=60):
    """Texts a second under wrk: `connections` keep-alive connections, each
    request `per_request` texts, the slices taken in turn. Requests still in
    flight when the time is up are not counted."""
    bodies = work / "wrk-bodies.jsonl"
    chunks = [texts[i:i + per_request] for i in range(0, len(texts) - per_request + 1, per_request)]
    bodies.write_text("\n".join(json.dumps({"input": c, "model": model, "encoding_format": "base64"}) for c in chunks) + "\n")
    script = work / "bodies.lua"
    script.write_text(WRK_SCRIPT)
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "120s", "-s", str(script),
                          f"http://127.0.0.1:{port}", "--", str(bodies)], capture_output=True, text=True, check=True).stdout
    requests, duration_us, errors = (int(x) for x in next(l for l in out.splitlines() if l.startswith("WRK ")).split()[1:])
    if errors:
        raise SystemExit(f"wrk: {errors} errors\n{out}")
    return requests * per_request / (duration_us / 1e6)


def bench(args):
    import numpy as np
    from tokenizers import Tokenizer

    sys.path.insert(0, str(HERE))
    from cpu_peers import free_port, post, vectors

    import http.client

    repo = Path(args.repo).resolve()
    work = Path(tempfile.mkdtemp(prefix="decoder-cpu-"))
    texts = texts_for(repo / "tokenizer.json", args.texts)
    tok = Tokenizer.from_file(str(repo / "tokenizer.json"))
    mean_tokens = sum(len(tok.encode(t).ids) for t in texts) / len(texts)
    (work / "texts.json").write_text(json.dumps(texts))
    report = {"texts": len(texts), "mean_tokens": mean_tokens, "cores": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d"), "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                                         capture_output=True, text=True).stdout.strip()}
    print(f"{len(texts)} texts, mean {mean_tokens:.1f} tokens", flush=True)

    st = subprocess.run([args.st_python, __file__, "st", str(repo), str(work / "texts.json"), str(work / "st.npy")],
                        capture_output=True, text=True)
    if st.returncode != 0:
        raise SystemExit(st.stderr[-2000:])
    report["sentence-transformers"] = json.loads(st.stdout.strip().splitlines()[-1])
    print("sentence-transformers:", report["sentence-transformers"], flush=True)
    reference = np.load(work / "st.npy")

    # The repository on a Hub look-alike, pulled as a user pulls it.
    repos = work / "repos" / REPO_ID
    repos.parent.mkdir(parents=True)
    os.symlink(repo, repos)
    port_file = work / "hub.port"
    hub = subprocess.Popen([sys.executable, str(ROOT / "tests/hub/lookalike.py"), "--repos", str(work / "repos"), "--port-file", str(port_file)])
    try:
        while not port_file.exists() or not port_file.read_text().strip():
            time.sleep(0.2)
        env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port_file.read_text().split()[0]}", "HF_HOME": str(work / "hf"),
               "HF_TOKEN": "hf_lookalike_token"}
        started = time.perf_counter()
        pulled = subprocess.run([args.eeane, "pull", f"hf:{REPO_ID}"], env=env, capture_output=True, text=True)
        report["eeane pull"] = {"s": time.perf_counter() - started}
        if pulled.returncode != 0:
            raise SystemExit(pulled.stderr[-3000:])
        entry = pulled.stdout
        print(f"eeane pull: {report['eeane pull']['s']:.0f} s", flush=True)
        variants = {"onnxruntime fp32": 'engine = "onnxruntime"\n', "openvino fp32": 'engine = "openvino"\nprecision = "f32"\n',
                    "openvino bf16": 'engine = "openvino"\nprecision = "bf16"\n'}
        for name, keys in variants.items():
            body = "\n".join(line for line in entry.splitlines() if not line.startswith("engine ="))
            body = body.replace("[[models]]", "[[models]]\n" + keys.strip(), 1)
            port = free_port()
            config = work / f"{name.replace(' ', '-')}.toml"
            config.write_text(f"[server]\nport = {port}\n\n{body}\n")
            server = subprocess.Popen([args.eeane, "serve", "--config", str(config)], env=env, stdout=subprocess.DEVNULL,
                                      stderr=open(work / f"{config.stem}.log", "w"))
            try:
                started = time.perf_counter()
                while True:
                    try:
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
                        post(conn, "/v1/embeddings", {"input": ["ready?"], "model": REPO_ID, "encoding_format": "base64"})
                        break
                    except (ConnectionError, OSError):
                        if server.poll() is not None:
                            raise SystemExit(f"{name}: the server exited; see {work / (config.stem + '.log')}")
                        time.sleep(0.2)
                first = time.perf_counter() - started
                rss = rss_kib(tree(server.pid)) / 1024
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
                got = []
                for i in range(0, len(texts), 8):
                    got += vectors(post(conn, "/v1/embeddings", {"input": texts[i:i + 8], "model": REPO_ID, "encoding_format": "base64"}))
                worst = min(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(got, reference))
                rate = wrk_rate(work, port, REPO_ID, texts)
                report[f"eeane {name}"] = {"first_request_s": first, "rss_mib": rss, "texts_per_s": rate, "min_cosine_vs_st": worst}
                print(f"eeane {name}:", report[f"eeane {name}"], flush=True)
            finally:
                server.terminate()
                server.wait()
    finally:
        hub.terminate()
    base = report["sentence-transformers"]["texts_per_s"]
    for name in variants:
        row = report[f"eeane {name}"]
        row["vs_sentence_transformers"] = row["texts_per_s"] / base
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


def main():
    if sys.argv[1:2] == ["make"]:
        return make(sys.argv[2])
    if sys.argv[1:2] == ["st"]:
        return st_row(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["bench"])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--eeane", required=True)
    parser.add_argument("--st-python", required=True)
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--json")
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
