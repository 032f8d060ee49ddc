"""Client side of tests/gpu/churn.sh.

    python3 churn.py expect URL EXPECTED.json             # answers of the resident server
    python3 churn.py churn URL EXPECTED.json SECONDS PID  # churn against them

Churn: four threads send the requests in a mix without pause; every 15 s they
pause, all models unload, and VRAM (nvidia-smi) and the server's RSS are
sampled. Prints one JSON object; exits 1 on any failed or differing answer.
"""
import base64
import json
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

TEXTS = [
    "hello",
    "def parse(source: str) -> Ast:\n    return Parser(source).parse()",
    "Como faço para ordenar uma lista em Python?",
    "SELECT id, name FROM users WHERE active = 1 ORDER BY name",
] + [f"fn handler_{i}(request: Request) -> Response {{ respond(request, {i}) }}" * (1 + i % 5) for i in range(12)]
REQUESTS = [{"model": m, "input": inp, "encoding_format": "base64"} for m in "abc" for inp in (TEXTS[0], TEXTS[:4], TEXTS)]


def post(url, body):
    request = urllib.request.Request(url + "/v1/embeddings", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def vectors(answer):
    return [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in answer["data"]]


def health(url):
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.load(response)


def vram_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    except FileNotFoundError:  # a dry run on lavapipe
        return None
    return int(out.split()[0]) if out.strip() else None


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])


def main():
    mode, url, path = sys.argv[1:4]
    if mode == "expect":
        answers = []
        for r in REQUESTS:
            status, body = post(url, r)
            assert status == 200, body
            answers.append([v.tolist() for v in vectors(body)])
        json.dump(answers, open(path, "w"))
        return
    seconds, pid = float(sys.argv[4]), int(sys.argv[5])
    expected = [[np.array(v, "<f4") for v in a] for a in json.load(open(path))]
    stop, pause = threading.Event(), threading.Event()
    lock = threading.Lock()
    stats = {"requests": 0, "failed": 0, "identical": 0, "min_cosine": 1.0}

    def client(c):
        i = c * 5
        while not stop.is_set():
            if pause.is_set():
                time.sleep(0.02)
                continue
            k = (i * 7 + c) % len(REQUESTS)
            status, body = post(url, REQUESTS[k])
            with lock:
                stats["requests"] += 1
                if status != 200:
                    stats["failed"] += 1
                    print(f"request {k}: {status} {body}", file=sys.stderr)
                else:
                    got = vectors(body)
                    if all(np.array_equal(g, e) for g, e in zip(got, expected[k])):
                        stats["identical"] += 1
                    cos = min(float(np.dot(g, e) / np.linalg.norm(g) / np.linalg.norm(e)) for g, e in zip(got, expected[k]))
                    stats["min_cosine"] = min(stats["min_cosine"], cos)
            i += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(4)]
    [t.start() for t in threads]
    samples, started = [], time.time()
    while time.time() - started < seconds:
        time.sleep(min(15, max(0, seconds - (time.time() - started))))
        pause.set()
        for _ in range(600):
            h = health(url)
            if h["pending_requests"] == 0 and all(m["state"] == "unloaded" for m in h["models"]):
                break
            time.sleep(0.1)
        time.sleep(1)
        samples.append({"t": round(time.time() - started), "vram_mib": vram_mib(), "rss_kib": rss_kib(pid)})
        pause.clear()
    stop.set()
    [t.join() for t in threads]
    loads = sum(m["counters"]["loads"] for m in health(url)["models"])
    print(json.dumps({**stats, "loads": loads, "unloaded_samples": samples}, indent=1))
    sys.exit(1 if stats["failed"] or stats["min_cosine"] < 0.9999 else 0)


if __name__ == "__main__":
    main()
