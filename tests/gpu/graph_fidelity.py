"""Over HTTP, against a running eeane whose model has run every batch shape
(so that CUDA graphs, where on, replay): every text's vector, 64 texts a
request, and the first 1,000 texts one a request from 32 threads (batches
of a few rows each), against the independent fp32 reference; the vectors
saved, so that a second server's can be compared bit for bit.
Usage: graph_fidelity.py URL MODEL TEXTS.json REFERENCE.npy SAVE.npy [OTHER.npy]"""
import base64
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

url, model, texts, reference, save = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), np.load(sys.argv[4]), sys.argv[5]


def embed(batch):
    body = json.dumps({"model": model, "input": batch, "encoding_format": "base64"}).encode()
    request = urllib.request.Request(f"{url}/v1/embeddings", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in json.load(response)["data"]])


def cosines(a, b):
    """Row by row."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


batched = np.concatenate([embed(texts[i:i + 64]) for i in range(0, len(texts), 64)])
ones = 1000
with ThreadPoolExecutor(32) as pool:
    single = np.concatenate(list(pool.map(lambda t: embed([t]), texts[:ones])))
report = {"model": model}
for label, vectors, rows in [("64_a_request", batched, slice(None)), ("one_a_request", single, slice(0, ones))]:
    cos = cosines(vectors, reference[rows])
    report[label] = {"texts": len(vectors), "min_cosine_vs_reference": float(cos.min()), "mean_cosine_vs_reference": float(cos.mean()),
                     "nonfinite": int((~np.isfinite(vectors)).sum())}
np.save(save, batched)
if len(sys.argv) > 6:
    other = np.load(sys.argv[6])
    same = np.all(other.view(np.uint32) == batched.view(np.uint32), axis=1)
    report["vs_other_server"] = {"bit_identical_texts": int(same.sum()), "texts": len(same),
                                 "max_abs_difference": float(np.abs(other - batched).max()),
                                 "min_cosine": float(cosines(other, batched).min())}
print(json.dumps(report, indent=1))
