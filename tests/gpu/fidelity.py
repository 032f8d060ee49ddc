"""Fidelity of a served model against reference vectors (make_reference.py),
over HTTP: every text's cosine to ONNX Runtime.

    python3 tests/gpu/fidelity.py URL REFERENCE.json MODEL [MODEL_ALONE [fp32|fp16]] > report.json

MODEL is sent the texts 64 to a request (so the engine packs them); when
MODEL_ALONE (the same file with pack_tokens = 1) is given, it gets them too
and the two are compared, text by text. Exits 1 if any cosine to the
reference of the same weights falls below 0.9999.
"""
import base64
import json
import statistics
import sys
import urllib.request

import numpy as np


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def embed(url, model, texts):
    out = []
    for i in range(0, len(texts), 64):
        answer = post(f"{url}/v1/embeddings", {"model": model, "input": texts[i:i + 64], "encoding_format": "base64"})
        out += [np.frombuffer(base64.b64decode(d["embedding"]), "<f4").astype(np.float64) for d in answer["data"]]
    return out


def cosines(a, b):
    return [float(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b)]


def summary(values):
    return {"min": min(values), "median": statistics.median(values), "below_0.9999": sum(v < 0.9999 for v in values)}


def main():
    url, reference, model = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
    alone = sys.argv[4] if len(sys.argv) > 4 else None
    decode = lambda rows: [np.frombuffer(base64.b64decode(r), "<f4").astype(np.float64) for r in rows]
    texts = reference["texts"]
    # Which weights the served file holds: its manifest says (fp32 or fp16).
    weights = sys.argv[5] if len(sys.argv) > 5 else "fp16"
    got = embed(url, model, texts)
    report = {
        "model": model,
        "weights": weights,
        "texts": len(texts),
        "tokens": {"min": min(reference["tokens"]), "max": max(reference["tokens"])},
        "vs_onnxruntime_same_weights": summary(cosines(got, decode(reference["fp32" if weights == "fp32" else "fp16_weights"]))),
        "vs_onnxruntime_fp32_weights": summary(cosines(got, decode(reference["fp32"]))),
    }
    if alone:
        report["packed_vs_alone"] = summary(cosines(got, embed(url, alone, texts)))
    health = json.load(urllib.request.urlopen(f"{url}/health"))
    report["health"] = {"devices": health.get("devices"),
                        "models": [{k: m.get(k) for k in ("id", "device", "accelerated_layers", "engine_calls")} for m in health["models"] if m.get("device")]}
    print(json.dumps(report, indent=1))
    sys.exit(0 if report["vs_onnxruntime_same_weights"]["min"] >= 0.9999 else 1)


if __name__ == "__main__":
    main()
