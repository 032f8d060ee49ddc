"""Before/after for models/: the same Hub fixtures (tests/hub/make_repos.py's
repositories) and catalog targets prepared by two checkouts' models/prepare.py,
each into a cache of its own; every file of each prepared folder compared by
sha256 (manifest.json apart), and the manifests' "checks" and "parameters"
compared value by value.

    python3 tests/tools/compare_prepared.py OLD/models NEW/models --repos REPOS --work DIR
        [--python PY] [--only CASE ...] [--catalog TARGET ...] [--without-family]

REPOS is make_repos.py's output (`python tests/hub/make_repos.py --cache
CACHE REPOS`). The new checkout is given the family as `eeane pull` names it
(settings' "family"); the old one, which predates it, is not. With
--without-family the new checkout also runs without it (an older caller: the
family found by config.json's model_type). Or compare two prepared folders:

    python3 tests/tools/compare_prepared.py --dirs OLD_MODEL_DIR NEW_MODEL_DIR
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from torch_bin import sha256  # noqa: E402  the hash manifests are written with

# name: (repository under REPOS, family, settings beyond the common ones, extra flags, extra environment)
MEAN, CLS, LAST = "mean", "cls", "last_token"
DENSE = {"dense": [{"path": "2_Dense", "activation": "torch.nn.modules.activation.Tanh"}], "graph_pooling": MEAN}
CASES = {
    "minilm": ("sentence-transformers/all-MiniLM-L6-v2", "bert", {}, [], {}),
    "minilm-cuda-fp16": ("sentence-transformers/all-MiniLM-L6-v2", "bert", {}, ["--cuda-fp16"], {}),
    "minilm-ncnn": ("sentence-transformers/all-MiniLM-L6-v2", "bert", {}, ["--ncnn"], {}),
    "minilm-cls": ("eeane-test/minilm-cls-raw", "bert", {"pooling": CLS}, [], {}),
    "roberta": ("eeane-test/minilm-roberta", "bert", {}, [], {}),
    "roberta-ncnn": ("eeane-test/minilm-roberta", "bert", {}, ["--ncnn"], {}),
    "camembert": ("eeane-test/minilm-camembert", "bert", {}, [], {}),
    "xlm-roberta": ("eeane-test/multilingual-e5-small-enpt", "bert", {}, [], {}),
    "distilbert": ("eeane-test/minilm-distilbert", "bert", {}, [], {}),
    "cross-encoder": ("eeane-test/minilm-cross-encoder", "bert", {"kind": "reranker"}, [], {}),
    "distilbert-cross-encoder": ("eeane-test/minilm-distilbert-cross-encoder", "bert", {"kind": "reranker"}, [], {}),
    "dense": ("eeane-test/minilm-dense", "bert", DENSE, [], {}),
    "dense-cuda-fp16": ("eeane-test/minilm-dense", "bert", DENSE, ["--cuda-fp16"], {}),
    "dense-onnx-only": ("eeane-test/minilm-dense-onnx-only", None, DENSE, [], {}),
    "onnx-only": ("eeane-test/minilm-onnx-only", None, {}, [], {}),
    "onnx-variant": ("eeane-test/minilm-onnx-variants", None, {}, ["--onnx-file", "onnx/model_O2.onnx"], {}),
    "bert-bin": ("eeane-test/bert-bin-tiny", "bert", {}, [], {}),
    "bert-vocab": ("eeane-test/bert-vocab-tiny", "bert", {}, [], {}),
    "roberta-vocab": ("eeane-test/roberta-vocab-tiny", "bert", {}, [], {}),
    "xlmr-spm": ("eeane-test/xlmr-spm-tiny", "bert", {}, [], {}),
    "mpnet": ("eeane-test/mpnet-tiny", "mpnet", {}, [], {}),
    "mpnet-cuda-fp16": ("eeane-test/mpnet-tiny", "mpnet", {}, ["--cuda-fp16"], {}),
    "modernbert": ("eeane-test/modernbert-tiny", "modernbert", {}, [], {}),
    "modernbert-cuda-fp16": ("eeane-test/modernbert-tiny", "modernbert", {}, ["--cuda-fp16"], {}),
    "qwen3": ("eeane-test/qwen3-tiny", "decoder", {"pooling": LAST}, [], {}),
    "qwen3-cuda-fp16": ("eeane-test/qwen3-tiny", "decoder", {"pooling": LAST}, ["--cuda-fp16"], {}),
    "qwen3-external-data": ("eeane-test/qwen3-tiny", "decoder", {"pooling": LAST}, ["--cuda-fp16"], {"EEANE_EXTERNAL_DATA_MIN_BYTES": "0"}),
    "qwen3-sharded-bf16": ("eeane-test/qwen3-tiny-bf16-sharded", "decoder", {"pooling": LAST}, [], {}),
    "qwen3-reranker": ("eeane-test/qwen3-reranker-tiny", "decoder", {"kind": "reranker", "score_tokens": {"true": "yes", "false": "no"}}, [], {}),
    "gemma-reranker": ("eeane-test/bge-gemma-reranker-tiny", "decoder", {"kind": "reranker", "score_tokens": {"true": "Yes", "false": None}}, [], {}),
    "qwen2": ("eeane-test/qwen2-tiny", "decoder", {"pooling": LAST}, [], {}),
    "llama": ("eeane-test/llama-tiny", "decoder", {"pooling": LAST}, [], {}),
    "mistral": ("eeane-test/mistral-tiny", "decoder", {"pooling": LAST}, [], {}),
    "gemma": ("eeane-test/gemma-tiny", "decoder", {"pooling": LAST}, [], {}),
    "gemma2": ("eeane-test/gemma2-tiny", "decoder", {"pooling": LAST}, [], {}),
    "gemma3": ("eeane-test/gemma3-tiny", "decoder", {}, ["--cuda-fp16"], {}),
}


def settings_of(snapshot, extra):
    """Settings shaped as src/pull/st.rs StModel::settings() writes them."""
    config = json.loads((snapshot / "config.json").read_text())
    extra = dict(extra)
    pooling = extra.pop("pooling", MEAN)
    settings = {
        "architecture": (config.get("architectures") or [""])[0],
        "kind": extra.pop("kind", "embedding"),
        "weights": "model.safetensors",
        "pooling": {"value": pooling, "from": "1_Pooling/config.json"},
        "normalize": {"value": True, "from": "modules.json"},
        "max_tokens": {"value": 256, "from": "sentence_bert_config.json"},
        "prompts": {"value": {}, "from": "none"},
    }
    settings.update(extra)
    return settings


def differences(a, b, at=""):
    """Where two JSON values differ, as 'path: old != new' lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at or '.'}: {a!r} != {b!r}"]


def compare_dirs(old, new):
    """(per-file lines, whether every file and the manifests' figures agree)."""
    names = sorted({p.name for p in old.iterdir() if p.is_file()} | {p.name for p in new.iterdir() if p.is_file()})
    lines, same = [], True
    for name in names:
        if name == "manifest.json":
            continue
        a, b = old / name, new / name
        if not (a.is_file() and b.is_file()):
            lines.append(f"  {name}: only in {'old' if a.is_file() else 'new'}")
            same = False
        elif sha256(a) == sha256(b):
            lines.append(f"  {name}: identical ({a.stat().st_size} bytes)")
        else:
            lines.append(f"  {name}: DIFFERENT")
            same = False
    manifests = [json.loads((d / "manifest.json").read_text()) if (d / "manifest.json").is_file() else {} for d in (old, new)]
    for key in ("checks", "parameters"):
        diff = differences(manifests[0].get(key), manifests[1].get(key))
        lines.append(f"  manifest {key}: " + ("equal" if not diff else "DIFFERENT: " + "; ".join(diff)))
        same = same and not diff
    return lines, same


def prepare(python, models, cache, args, env):
    run = subprocess.run([python, str(models / "prepare.py"), "--cache", str(cache)] + args, capture_output=True, text=True,
                         env={**os.environ, **env})
    if run.returncode:
        raise RuntimeError(f"{models}/prepare.py {' '.join(args)} failed:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
    return run.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, nargs="?")
    parser.add_argument("new", type=Path, nargs="?")
    parser.add_argument("--repos", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/compare-prepared"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", nargs="*", help=f"cases among: {', '.join(CASES)}")
    parser.add_argument("--catalog", nargs="*", default=[], help="catalog targets to prepare with both and compare")
    parser.add_argument("--without-family", action="store_true", help="the new checkout also without settings' family")
    parser.add_argument("--dirs", nargs=2, type=Path, metavar=("OLD_DIR", "NEW_DIR"))
    args = parser.parse_args()
    if args.dirs:
        lines, same = compare_dirs(*args.dirs)
        print("\n".join(lines))
        sys.exit(0 if same else 1)
    runs = [("new", True)] + ([("new-without-family", False)] if args.without_family else [])
    results = []
    for case in args.only if args.only is not None else list(CASES):
        repo, family, extra, flags, env = CASES[case]
        snapshot = args.repos / repo
        settings = settings_of(snapshot, extra)
        common = ["--hf-snapshot", str(snapshot), "--name", case, "--source", f"hf:{repo}@fixture"] + flags
        try:
            prepare(args.python, args.old, args.work / "old", common + ["--settings", json.dumps(settings)], env)
        except RuntimeError as e:
            results.append((case, "old", False, [str(e)]))
            continue
        for label, with_family in runs:
            named = {**settings, "family": family} if with_family and family else settings
            try:
                prepare(args.python, args.new, args.work / label, common + ["--settings", json.dumps(named)], env)
                lines, same = compare_dirs(args.work / "old" / "models" / case, args.work / label / "models" / case)
            except RuntimeError as e:
                lines, same = [str(e)], False
            results.append((case, label, same, lines))
    for target in args.catalog:
        try:
            for label, models in (("old", args.old), ("new", args.new)):
                prepare(args.python, models, args.work / label, [target], {})
            lines, same = compare_dirs(args.work / "old" / "models" / target, args.work / "new" / "models" / target)
        except RuntimeError as e:
            lines, same = [str(e)], False
        results.append((target, "new", same, lines))
    for case, label, same, lines in results:
        print(f"{case} ({label}): {'IDENTICAL' if same else 'DIFFERENT'}")
        print("\n".join(lines))
    print(f"\n{sum(r[2] for r in results)} of {len(results)} identical")
    sys.exit(0 if all(r[2] for r in results) else 1)


if __name__ == "__main__":
    main()
