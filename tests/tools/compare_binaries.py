"""Before/after: the same TOML served by two eeane binaries; every model's
vectors (base64, so bytes) and rerank scores compared exactly.

    python3 tests/tools/compare_binaries.py OLD/eeane NEW/eeane tests/tools/compare_binaries.toml TEXTS.txt

TEXTS.txt: one text per line (docs/history/performance-log.md used tests/fixtures/texts.json's).
Each server's log goes to /tmp/cmp/."""
import base64, json, os, subprocess, sys, time, urllib.request, socket

old_bin, new_bin, config = sys.argv[1], sys.argv[2], sys.argv[3]
texts = [l.strip() for l in open(sys.argv[4]) if l.strip()][:64]
texts += ["a", "x " * 400, "naïve café — 東京 🚀", "def f(x):\n    return x * 2\n"]

os.makedirs("/tmp/cmp", exist_ok=True)

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def start(binary):
    port = free_port()
    p = subprocess.Popen([binary, "--config", config, "serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=open(f"/tmp/cmp/{os.path.basename(os.path.dirname(os.path.dirname(binary)))}-{port}.log", "w"))
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); return p, port
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{binary} did not start")

def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))

old, old_port = start(old_bin)
new, new_port = start(new_bin)
try:
    models = [m["id"] for m in json.load(urllib.request.urlopen(f"http://127.0.0.1:{old_port}/v1/models"))["data"]]
    kinds = {m["id"]: m.get("kind") for m in json.load(urllib.request.urlopen(f"http://127.0.0.1:{old_port}/v1/models"))["data"]}
    identical = True
    for model in models:
        if kinds[model] == "reranker":
            body = {"model": model, "query": texts[0], "documents": texts[1:40], "raw_scores": True}
            a, b = post(old_port, "/rerank", body), post(new_port, "/rerank", body)
            same = a["results"] == b["results"]
            print(f"{model:28s} rerank  {len(body['documents'])} documents: {'bit-identical' if same else 'DIFFERENT'}")
        else:
            body = {"model": model, "input": texts, "encoding_format": "base64"}
            a, b = post(old_port, "/v1/embeddings", body), post(new_port, "/v1/embeddings", body)
            same = [d["embedding"] for d in a["data"]] == [d["embedding"] for d in b["data"]] and a["usage"] == b["usage"]
            dim = len(base64.b64decode(a["data"][0]["embedding"])) // 4
            print(f"{model:28s} embed   {len(texts)} texts x {dim} floats: {'bit-identical' if same else 'DIFFERENT'}")
        identical &= same
    print("ALL BIT-IDENTICAL" if identical else "SOME DIFFER")
finally:
    old.terminate(); new.terminate(); old.wait(); new.wait()
