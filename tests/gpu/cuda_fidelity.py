"""Over HTTP, against a running eeane: each model's vectors for every text
against the independent fp32 reference (min and mean cosine), and, for the
churn model (keep_alive = 0, so every request loads and unloads it), the
same request repeated: failures counted, vectors compared bit for bit, VRAM
read from NVML (nvidia-smi) at each step.
Usage: cuda_fidelity.py URL TEXTS.json REFERENCE.npy CHURN_MODEL ROUNDS MODEL..."""
import base64
import json
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

url, texts, reference = sys.argv[1], json.load(open(sys.argv[2])), np.load(sys.argv[3])
churn_model, rounds, models = sys.argv[4], int(sys.argv[5]), sys.argv[6:]


def embed(model, batch):
    body = json.dumps({"model": model, "input": batch, "encoding_format": "base64"}).encode()
    request = urllib.request.Request(f"{url}/v1/embeddings", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        data = json.load(response)["data"]
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data])


def vram_mib():
    """The GPU's used memory from NVML (through nvidia-smi); 0 on a machine without one (a dry run)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return 0
    return int(out.split()[0]) if out.strip() else 0


def state(model):
    with urllib.request.urlopen(f"{url}/health") as response:
        return next(m["state"] for m in json.load(response)["models"] if m["id"] == model)


report = {"models": {}}
# Churn first, so that the floor is the server with nothing loaded.
batch, failures, identical, steps = texts[:64], 0, 0, []
first = None
floor = vram_mib()
for i in range(rounds):
    peak, done = [0], threading.Event()

    def sample():  # the model unloads as soon as it answers: read VRAM while it works
        while not done.is_set():
            peak[0] = max(peak[0], vram_mib())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        v = embed(churn_model, batch)
        if first is None:
            first = v
        identical += int(np.array_equal(v.view(np.uint32), first.view(np.uint32)))
    except Exception as e:  # counted, and the run goes on
        failures += 1
        print(f"round {i}: {e}", file=sys.stderr)
    done.set()
    sampler.join()
    for _ in range(100):
        if state(churn_model) != "loaded":
            break
        time.sleep(0.05)
    # The engine process ends after the state turns: VRAM until it is back
    # at the floor (at most 10 s), and how long that took.
    unloaded, after = time.time(), vram_mib()
    while after > floor and time.time() - unloaded < 10:
        time.sleep(0.05)
        after = vram_mib()
    steps.append({"round": i, "vram_peak_while_loaded_mib": peak[0], "vram_after_unload_mib": after,
                  "seconds_to_floor": round(time.time() - unloaded, 2) if after <= floor else None})
report["churn"] = {"model": churn_model, "rounds": rounds, "failed_requests": failures, "bit_identical_to_first": identical,
                   "vram_at_rest_mib": floor, "steps": steps,
                   "max_after_unload_over_rest_mib": max(s["vram_after_unload_mib"] - floor for s in steps)}

for model in models:
    vectors = np.concatenate([embed(model, texts[i:i + 64]) for i in range(0, len(texts), 64)])
    cos = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    report["models"][model] = {"min_cosine_vs_reference": float(cos.min()), "mean_cosine_vs_reference": float(cos.mean()),
                               "texts": len(texts), "nonfinite": int((~np.isfinite(vectors)).sum())}
print(json.dumps(report, indent=2))
