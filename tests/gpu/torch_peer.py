"""The CUDA run's references, in one process: (1) an independent fp32
reference, Python onnxruntime on the CPU running the plain (unfused) fp32
graph; (2) plain torch on the GPU, transformers' BertModel with SDPA
attention, texts sorted by length, batches of 256, fp32 then fp16, the way a
user of sentence-transformers runs it (tokenization done beforehand, so the
figure is the forward pass and pooling alone: generous to torch).
Usage: torch_peer.py TEXTS.json MODEL_DIR PLAIN_ONNX OUT_PREFIX [--reference-only]
Writes OUT_PREFIX.reference.npy (mean-pooled, L2-normalized) and prints JSON."""
import json
import sys
import time

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from length_batches import length_sorted_batches

texts = json.load(open(sys.argv[1]))
model_dir, plain_onnx, prefix = sys.argv[2], sys.argv[3], sys.argv[4]
tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
tok.no_padding()
tok.enable_truncation(256)
encoded = [tok.encode(t).ids for t in texts]
lengths = np.array([len(e) for e in encoded])
report = {"texts": len(texts), "mean_tokens": float(lengths.mean()), "max_tokens": int(lengths.max())}


def batches(size):
    return length_sorted_batches(encoded, size)


def pooled(hidden, mask):
    summed = (hidden * mask[..., None]).sum(1)
    mean = summed / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)


# (1) The independent reference.
started = time.time()
session = ort.InferenceSession(plain_onnx, providers=["CPUExecutionProvider"])
reference = np.zeros((len(texts), 384), np.float32)
for rows, ids, mask in batches(64):
    hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    reference[rows] = pooled(hidden, mask)
np.save(f"{prefix}.reference.npy", reference)
report["reference"] = f"onnxruntime {ort.__version__} CPU, plain fp32 graph, {time.time() - started:.1f} s"

if sys.argv[5:] == ["--reference-only"]:
    print(json.dumps(report, indent=2))
    sys.exit(0)

# (2) torch on the GPU.
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel

cfg = BertConfig.from_json_file(f"{model_dir}/config.json")
cfg._attn_implementation = "sdpa"
net = BertModel(cfg, add_pooling_layer=False)
missing = net.load_state_dict(load_file(f"{model_dir}/model.safetensors"), strict=False)
report["torch_missing_keys"] = [k for k in missing.missing_keys]
net = net.cuda().eval()
report["torch"] = f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, attention {net.config._attn_implementation}"
gpu_batches = [(rows, torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()) for rows, ids, mask in batches(256)]


def run(dtype):
    out = torch.zeros((len(texts), 384), dtype=torch.float32, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        for rows, ids, mask in gpu_batches:
            hidden = net(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            m = mask.unsqueeze(-1).float()
            mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            out[torch.from_numpy(rows).cuda()] = torch.nn.functional.normalize(mean, dim=1)
    torch.cuda.synchronize()
    return out


for name, dtype, convert in [("fp32", torch.float32, None), ("fp16", torch.float16, torch.float16)]:
    if convert is not None:
        net = net.to(convert)
    run(dtype)  # warm-up: kernels chosen, memory pools grown
    best = None
    for _ in range(3):
        started = time.perf_counter()
        vectors = run(dtype)
        seconds = time.perf_counter() - started
        best = seconds if best is None else min(best, seconds)
    v = vectors.cpu().numpy()
    cos = (v * reference).sum(1)
    report[f"torch_{name}"] = {"texts_per_s": len(texts) / best, "min_cosine_vs_reference": float(cos.min()), "mean_cosine_vs_reference": float(cos.mean())}
print(json.dumps(report, indent=2))
