"""The graph a Hub embedding model runs on an NVIDIA GPU (ONNX Runtime's
CUDA execution provider): `model.fp16.onnx`, beside the fp32 model.onnx
that every engine reads.

- **Fused attention**, in the form the family's row of models/families.toml
  names (`gpu_graph`): "fused", the builder's own `fused` graph (decoders
  and Gemma: one GroupQueryAttention (causal) or MultiHeadAttention
  (bidirectional) per layer and RMSNorm as SimplifiedLayerNormalization, the
  operators ONNX Runtime's own decoder exports use; ModernBERT: one
  MultiHeadAttention per layer); "optimized", the builder's `fusable` graph
  whose attention ONNX Runtime's transformer optimizer fuses into its
  Attention operator (the BERT family, as models/catalog_recipes.py does for
  the catalog's all-minilm-l6-v2-cuda), then split into Q, K and V matmuls
  and one MultiHeadAttention (`split_attention`; weights inline only, so not
  at BERT-large's size, whose fp16 weights go to a data file); "unfused",
  the builder's plain graph (MPNet: its relative position bias has no fused
  pattern), still fp16.
- **Pooled inside.** The graph ends in the model's pooling (mean, cls or
  last token) and its Dense modules, so that a batch brings back one vector
  a text from the GPU, not every token's state; eeane's `normalize` stays
  outside. Pooling, the Dense modules and the RoPE angles stay fp32;
  everything else is fp16 (norms sum in fp32 inside their kernels).
- **GELU in the epilogue.** The fp16 graph computes GELU in the tanh form
  (com.microsoft's FastGelu) and hands each feed-forward matmul with its
  bias and GELU to one ai.eeane.cuda:GemmFastGelu (cuBLASLt's GELU
  epilogue, backends/onnxruntime/src/cuda_ops.rs): BiasGelu was 16 % of
  all-MiniLM-L6-v2's kernel time on an H100. Attention's Q, K and V
  matmuls get their bias in the epilogue the same way (ai.eeane.cuda:
  GemmBias). The fp16 check below is made on the graph just before these
  fusions (the CPU has no such operators).
- **Checked twice on the CPU** before it is published: the fused fp32
  graph against the float64 numpy network (at 0.99999: fusion must not move
  the vectors) and the fp16 graph against the same (published at 0.9999;
  else only the reason is kept). On the card, `precision = "auto"` gates it
  again against the fp32 graph before it is served.

Not made: a reranker (cross-encoder or language model) keeps
its fp32 graph; a repository's own ONNX graph is served as it is.
"""
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

import families
import graph_builder
import graph_tail
from checks import CHECK_TEXTS, cosine, right_padded, run, session, tokenizer as check_tokenizer

GRAPH = "model.fp16.onnx"
# What made a GPU graph: a Hub model prepared by another is prepared again
# (since 2026-12-07: the feed-forward's GELU in cuBLASLt's epilogue;
# since 2026-12-07 too: attention's Q, K and V apart, their bias likewise).
RECIPE = "gelu-epilogue-qkv-apart"
DATA = "model.fp16.onnx_data"
# Pooling the graph can end in (eeane's names).
POOLINGS = ("mean", "cls", "last_token")


def why_not(settings, repository_onnx):
    """Why this model gets no GPU graph, or None when it gets one."""
    settings = settings or {}
    if repository_onnx:
        return "the repository's own ONNX graph is served as it is"
    if settings.get("kind") == "reranker" or settings.get("score_tokens"):
        return "rerankers keep their fp32 graph"
    pooling = settings.get("graph_pooling") or (settings.get("pooling") or {}).get("value")
    if pooling not in POOLINGS:
        return f"pooling {pooling!r} is not one the GPU graph does inside ({', '.join(POOLINGS)})"
    return None


def _fused_fp32(work, family_name, weights_folder, cfg, fp32_bytes):
    """work/model.onnx: the fused fp32 graph, token states out, in the form
    the family's row names (families.toml `gpu_graph`), with external data
    when large. Returns (the path, what fused the attention, the numpy
    network of one text, the tokens a check text is cut to)."""
    family = families.builder(family_name)
    form = families.row(family_name)["gpu_graph"]
    weights, cfg = family.prepare_weights(graph_builder.open_checkpoint(weights_folder), cfg)
    max_tokens = family.check_tokens(cfg)

    def network(ids):
        return family.numpy_forward(weights, cfg, ids)

    if form == "fused":
        path = graph_builder.build_into(work, family.build_graph, weights, cfg, fp32_bytes, fused=True)
        ops = sorted({n.op_type for n in _load(path, data=False).graph.node if n.op_type.endswith("Attention")})
        return path, ", ".join(ops), network, max_tokens
    if form not in ("optimized", "unfused"):
        raise SystemExit(f"family {family_name!r}: gpu_graph {form!r} in models/families.toml is none of fused, optimized, unfused")
    if fp32_bytes >= 2 << 30:
        raise SystemExit(f"a graph over 2 GiB in the {form!r} form, which is written as one protobuf (the transformer optimizer reads one)")
    work.mkdir(parents=True, exist_ok=True)
    path = work / "model.onnx"
    if form == "unfused":
        onnx.save_model(family.build_graph(weights, cfg), path)
        return path, f"unfused ({family.UNFUSED_ATTENTION})", network, max_tokens
    # The transformer optimizer loads much of onnxruntime.transformers: only for this form.
    from onnxruntime.transformers.optimizer import optimize_model

    plain = work / "plain.onnx"
    onnx.save_model(family.build_graph(weights, cfg, fusable=True), plain)
    optimized = optimize_model(str(plain), model_type=family.OPTIMIZER_MODEL_TYPE, num_heads=cfg["num_attention_heads"],
                               hidden_size=cfg["hidden_size"], opt_level=0, use_gpu=True)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    attentions = fused.get("Attention", 0) + fused.get("MultiHeadAttention", 0)
    if attentions == cfg["num_hidden_layers"]:
        optimized.save_model_to_file(str(path))
        how = "Attention (ONNX Runtime's transformer optimizer)"
    else:
        os.replace(plain, path)
        how = f"unfused (the optimizer fused {attentions} of {cfg['num_hidden_layers']} layers' attention)"
    plain.unlink(missing_ok=True)
    return path, how, network, max_tokens


# eeane's own CUDA operators (backends/onnxruntime/src/cuda_ops.rs).
EEANE_CUDA_DOMAIN = "ai.eeane.cuda"


def tanh_gelu(model):
    """Each BiasGelu (erf GELU, with its bias) becomes com.microsoft's
    FastGelu (the tanh form, with the same bias): the function that
    cuBLASLt's GELU epilogue computes, so that the CPU can check the graph
    that `gemm_fast_gelu` then hands to that epilogue. Returns the count."""
    count = 0
    for node in model.graph.node:
        if node.op_type == "BiasGelu" and node.domain == "com.microsoft":
            node.op_type = "FastGelu"
            count += 1
    return count


def gemm_fast_gelu(model):
    """MatMul(X, W) feeding only FastGelu(·, bias), W [K, N] and bias [N]
    fp16 initializers, becomes one ai.eeane.cuda:GemmFastGelu(X, W, bias):
    the matmul whose epilogue adds the bias and applies GELU, so that the
    GELU's input never goes through memory. The same function as the pair
    (docs/performance.md gives the kernels' times). Returns the count."""

    def gelu_bias(node, is_matmul, readers_of):
        if node.op_type == "FastGelu" and node.domain == "com.microsoft" and len(node.input) == 2 and is_matmul(node.input[0]):
            return node.input[0], node.input[1]
        return None

    return _fuse_into_matmuls(model, gelu_bias, "GemmFastGelu")


def gemm_bias(model):
    """MatMul(X, W) feeding only Add(·, bias) whose sum only
    MultiHeadAttention reads (`split_attention`'s Q, K and V), W [K, N] and
    bias [N] fp16 initializers, becomes one ai.eeane.cuda:GemmBias(X, W,
    bias): the bias added in cuBLASLt's epilogue, not by a kernel of its
    own. Other MatMul + Add pairs are left as they are. Returns the count."""

    def attention_input(node, is_matmul, readers_of):
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            return None
        readers = readers_of(node.output[0])
        if not readers or any(r.op_type != "MultiHeadAttention" for r in readers):
            return None
        a, b = node.input
        return (a, b) if is_matmul(a) else (b, a) if is_matmul(b) else None

    return _fuse_into_matmuls(model, attention_input, "GemmBias")


def _fuse_into_matmuls(model, match, op_type):
    """Each node for which `match(node, is_matmul, readers_of)` names (the
    product of a MatMul(X, W) that only it reads, its bias), W [K, N] and
    the bias [N] constant fp16 initializers, becomes
    ai.eeane.cuda:`op_type`(X, W, bias) with the node's outputs, and the
    MatMul goes. Returns the count."""
    graph = model.graph
    half = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT16}
    dims = {t.name: list(t.dims) for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    # An initializer that a graph input of the same name can override is not a constant.
    graph_inputs = {i.name for i in graph.input}

    def is_matmul(name):
        node = producer.get(name)
        return node is not None and node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(readers.get(name, [])) == 1 and name not in graph_outputs

    fused, dropped = [], set()
    for node in graph.node:
        found = match(node, is_matmul, lambda name: readers.get(name, []))
        if found is None:
            continue
        product, bias = found
        matmul = producer[product]
        x, w = matmul.input
        if w not in half or bias not in half or {w, bias} & graph_inputs or len(dims[w]) != 2 or dims[bias] != dims[w][1:]:
            continue
        fused.append((node, helper.make_node(op_type, [x, w, bias], list(node.output), name=node.name or matmul.name, domain=EEANE_CUDA_DOMAIN)))
        dropped.add(id(matmul))
    if not fused:
        return 0
    replacement = {id(old): new for old, new in fused}
    gone = {out for n in graph.node if id(n) in dropped for out in n.output}
    nodes = [replacement.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    # The matmuls' outputs no longer exist: their recorded types go too.
    kept = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    if not any(o.domain == EEANE_CUDA_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(EEANE_CUDA_DOMAIN, 1))
    return len(fused)


def split_attention(model):
    """Each com.microsoft Attention over a packed Q/K/V weight [K, 3N] and
    bias [3N] (inline initializers), with EmbedLayerNormalization's mask
    index (the texts' lengths) and no past, becomes three MatMul + Add (Q,
    K and V, each [.., N]) and one com.microsoft MultiHeadAttention over
    them, the lengths as its key padding mask: the same function.

    Why: the CUDA provider runs Attention as one matmul into a packed
    buffer, then a kernel that adds the bias and transposes it into the
    layout of cuDNN's flash attention, 11 % of all-MiniLM-L6-v2's kernel
    time on an H100 (docs/performance.md). MultiHeadAttention takes Q, K
    and V as [batch, tokens, N] with no bias straight into its attention
    kernel, and `gemm_bias` then hands each MatMul + Add to cuBLASLt with
    the bias in its epilogue. Weights in an external data file (fp16
    graphs of BERT-large size) are left packed. Returns the count."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    producer = {out: (node, i) for node in graph.node for i, out in enumerate(node.output)}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1

    def inline(name):
        t = initializers.get(name)
        return t is not None and name not in graph_inputs and t.data_location != TensorProto.EXTERNAL and readers.get(name) == 1

    nodes, added, dropped, count = [], [], set(), 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inputs = list(node.input) + [""] * 4
        x, w, b, mask = inputs[:4]
        mask_from = producer.get(mask)
        if (node.op_type != "Attention" or node.domain != "com.microsoft" or any(inputs[4:]) or any(node.output[1:])
                or set(attrs) - {"num_heads", "mask_filter_value", "scale", "unidirectional"} or attrs.get("unidirectional", 0)
                or not (inline(w) and inline(b)) or mask_from is None
                or (mask_from[0].op_type, mask_from[1]) != ("EmbedLayerNormalization", 1)):
            nodes.append(node)
            continue
        weight, bias = numpy_helper.to_array(initializers[w]), numpy_helper.to_array(initializers[b])
        if weight.ndim != 2 or weight.shape[1] % 3 or bias.shape != (weight.shape[1],):
            nodes.append(node)
            continue
        n = weight.shape[1] // 3
        name = node.name or node.output[0]
        parts = []
        for i, part in enumerate("qkv"):
            pw, pb, mm, out = f"{name}_{part}_weight", f"{name}_{part}_bias", f"{name}_{part}_matmul", f"{name}_{part}"
            added += [numpy_helper.from_array(np.ascontiguousarray(weight[:, i * n:(i + 1) * n]), pw),
                      numpy_helper.from_array(np.ascontiguousarray(bias[i * n:(i + 1) * n]), pb)]
            nodes.append(helper.make_node("MatMul", [x, pw], [mm], name=f"{name}_{part}_matmul"))
            nodes.append(helper.make_node("Add", [mm, pb], [out], name=f"{name}_{part}_add"))
            parts.append(out)
        kept = {k: v for k, v in attrs.items() if k != "unidirectional"}
        nodes.append(helper.make_node("MultiHeadAttention", parts + ["", mask], node.output[:1], name=name, domain="com.microsoft", **kept))
        dropped |= {w, b}
        count += 1
    if count:
        inits = [t for t in graph.initializer if t.name not in dropped] + added
        del graph.initializer[:]
        graph.initializer.extend(inits)
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _load(path, data=True):
    return onnx.load(str(path), load_external_data=data)


def _check(graph, tokenizer, max_tokens, states_of, pooling, dense):
    """The graph's pooled vectors of the check texts (one right-padded
    batch) against the numpy network's, each text alone: the lowest cosine."""
    tok = check_tokenizer(tokenizer, max_tokens)
    seqs = [tok.encode(t).ids for t in CHECK_TEXTS]
    ids, mask = right_padded(seqs)
    got = run(session(graph), {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    worst = 1.0
    for row, seq in zip(got, seqs):
        want = graph_tail.numpy_pooling_and_dense(states_of(seq)[None], np.ones((1, len(seq))), pooling, dense)[0]
        if not np.isfinite(row).all():
            return float("nan")
        worst = min(worst, cosine(row.astype(np.float64), want))
    return worst


def build(build_dir, snapshot, weights_folder, cfg, settings, family_name, tokenizer, fp32_bytes):
    """build_dir/model.fp16.onnx (and its data file when its weights reach
    graph_builder.external_data_min_bytes()) for the GPU, a graph of the
    family `family_name` (families.toml), checked on the check texts; returns what
    goes into the manifest's checks under "cuda_fp16" ({"graph": None,
    "why": ...} when none is published)."""
    pooling = settings.get("graph_pooling") or settings["pooling"]["value"]
    dense = graph_tail.dense_modules(snapshot, settings)
    work = build_dir / "gpu"
    shutil.rmtree(work, ignore_errors=True)
    try:
        path, attention, network, max_tokens = _fused_fp32(work, family_name, weights_folder, cfg, fp32_bytes)
        # The float64 network runs once per check text, for both checks.
        memo = {}

        def states_of(ids):
            if tuple(ids) not in memo:
                memo[tuple(ids)] = network(ids)
            return memo[tuple(ids)]

        model = graph_tail.append_pooling_and_dense(_load(path, data=False), pooling, dense)
        onnx.save_model(model, str(path))
        fused32 = _check(path, tokenizer, max_tokens, states_of, pooling, dense)
        print(f"GPU graph ({attention}), fused fp32, pooled ({pooling}, {len(dense)} Dense) vs numpy float64: min cosine {fused32:.8f}")
        if not fused32 >= 0.99999:
            raise SystemExit("the fused GPU graph drifts from the reference network; not publishing it")
        keep = fp32_nodes(path)
        # GELU in the tanh form from here on (the fp32 graph above and the
        # served model.onnx keep erf): the fp16 check below measures it.
        model = _load(path, data=False)
        gelus = tanh_gelu(model)
        if gelus:
            onnx.save_model(model, str(path))
        out = build_dir / GRAPH
        to_fp16(path, out, keep, build_dir / DATA if fp32_bytes // 2 >= graph_builder.external_data_min_bytes() else None)
        checks = {"attention": attention, "pooling_in_graph": pooling, "fused_fp32_min_cosine_vs_numpy_float64": fused32}
        # Q, K and V apart before the fp16 check, so that it measures them.
        model = _load(out, data=False)
        split = split_attention(model)
        if split:
            onnx.save_model(model, str(out))
            checks["attention"] = f"{attention}, as MultiHeadAttention over Q, K and V apart ({split} layers)"
        try:
            half = _check(out, tokenizer, max_tokens, states_of, pooling, dense)
        except Exception as e:  # noqa: BLE001 - an older CPU runtime without these fp16 kernels
            # The card's survey still gates it against the fp32 graph.
            print(f"GPU graph, fp16: this ONNX Runtime cannot run it on the CPU ({e}); the survey on the card checks it")
            return {"graph": GRAPH, **checks, **epilogues(out, gelus), "fp16_on_cpu": f"not run: {e}"}
        print(f"GPU graph, fp16 (ONNX Runtime on the CPU) vs numpy float64: min cosine {half:.8f}")
        checks["fp16_min_cosine_vs_numpy_float64_on_cpu"] = half
        if not half >= 0.9999:
            out.unlink()
            (build_dir / DATA).unlink(missing_ok=True)
            return {"graph": None, "why": f"fp16 min cosine {half:.6f} < 0.9999 on the check texts", **checks}
        return {"graph": GRAPH, **checks, **epilogues(out, gelus)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def expand_cuda_operators(model, gelu="FastGelu", ops=("GemmFastGelu", "GemmBias")):
    """`gemm_fast_gelu` and `gemm_bias` undone (those of `ops`): each
    ai.eeane.cuda:GemmFastGelu back to MatMul and com.microsoft's `gelu`
    (FastGelu, the same function; BiasGelu, the erf form the graph had
    before), each GemmBias back to MatMul and Add, for a runtime without
    eeane's operators: the CPU, or a measurement against the unfused graph.
    Returns the count written back."""
    nodes, count = [], 0
    for node in model.graph.node:
        if node.op_type in ops and node.domain == EEANE_CUDA_DOMAIN:
            x, w, bias = node.input
            product = node.output[0] + "_matmul"
            nodes.append(helper.make_node("MatMul", [x, w], [product], name=node.name + "_matmul"))
            if node.op_type == "GemmFastGelu":
                nodes.append(helper.make_node(gelu, [product, bias], list(node.output), name=node.name, domain="com.microsoft"))
            else:
                nodes.append(helper.make_node("Add", [product, bias], list(node.output), name=node.name))
            count += 1
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(n.domain == EEANE_CUDA_DOMAIN for n in nodes):
        kept = [o for o in model.opset_import if o.domain != EEANE_CUDA_DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return count


def epilogues(graph, gelus):
    """The checked fp16 graph at `graph` with its matmuls' bias (and GELU)
    handed to cuBLASLt's epilogues (`gemm_fast_gelu` for the feed-forward,
    `gemm_bias` for attention's Q, K and V), after the CPU check, which
    cannot run eeane's operators; what goes into the manifest."""
    model = _load(graph, data=False)
    fused = gemm_fast_gelu(model) if gelus else 0
    biased = gemm_bias(model)
    if not (fused or biased):
        return {}
    onnx.save_model(model, str(graph))
    checks = {}
    if gelus:
        print(f"GPU graph: GELU in the tanh form ({gelus} layers), {fused} matmuls with cuBLASLt's GELU epilogue")
        checks.update({"gelu": "tanh (FastGelu)", "gemm_fast_gelu": fused})
    if biased:
        print(f"GPU graph: {biased} Q, K and V matmuls with cuBLASLt's bias epilogue")
        checks["gemm_bias"] = biased
    return checks


def fp32_nodes(path):
    """The nodes of the fp32 graph at `path` that its fp16 copy keeps in
    fp32: those its builder listed (the RoPE tables) and the pooling and
    Dense tail (`st_*`, graph_tail.append_pooling_and_dense)."""
    model = _load(path, data=False)
    props = {p.key: p.value for p in model.metadata_props}
    listed = [n for n in props.get(graph_builder.FP32_NODES_KEY, "").split(",") if n]
    return set(listed) | {n.name for n in model.graph.node if n.name.startswith("st_")}


def to_fp16(src, dst, keep, data_file):
    """`dst`: the graph at `src` with its float tensors in fp16, except the
    nodes named in `keep`, which compute in fp32 as they did; a Cast goes
    on every float edge between the two, and before every float output, so
    the graph's inputs and outputs keep their types. Weights are converted
    one at a time (clipped to fp16's range), into `data_file` (external
    data beside `dst`) when given: no copy of the whole model is held.

    Written here rather than with onnxruntime.transformers.float16, whose
    blocked nodes lose their types at the border when ONNX's shape
    inference does not know an operator (GroupQueryAttention,
    SimplifiedLayerNormalization) and then give graphs that do not load."""
    FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
    model = onnx.load(str(src), load_external_data=False)
    graph = model.graph
    inferred = shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
    initializers = {t.name: t for t in graph.initializer}
    types.update({name: t.data_type for name, t in initializers.items()})
    # An operator ONNX does not know leaves its results untyped: here those
    # are ONNX Runtime's attention, norm and GELU operators, all float.
    is_float = lambda name: types.get(name, 0) in (FLOAT, 0)
    produced_by_kept = {out: node.name in keep for node in graph.node for out in node.output}

    nodes, casts, fp32_copies = [], {}, set()

    def cast(value, to):
        if (value, to) not in casts:
            name = f"{value}_{'fp32' if to == FLOAT else 'fp16'}"
            nodes.append(helper.make_node("Cast", [value], [name], name=f"cast_{name}", to=to))
            casts[value, to] = name
        return casts[value, to]

    float_initializers = {n for n, t in initializers.items() if t.data_type == FLOAT}
    for node in graph.node:
        kept = node.name in keep
        for i, value in enumerate(node.input):
            if value in float_initializers:
                if kept:
                    fp32_copies.add(value)
                    node.input[i] = value + "__fp32"
            elif value in produced_by_kept and is_float(value) and produced_by_kept[value] != kept:
                node.input[i] = cast(value, FLOAT if kept else HALF)
        if not kept:
            for attribute in node.attribute:
                if attribute.name == "to" and attribute.i == FLOAT:
                    attribute.i = HALF
                if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == FLOAT:
                    attribute.t.CopyFrom(numpy_helper.from_array(_half(numpy_helper.to_array(attribute.t)), attribute.t.name))
        nodes.append(node)
    for output in graph.output:
        if output.type.tensor_type.elem_type == FLOAT and not produced_by_kept.get(output.name, True):
            inner = output.name + "_fp16_result"
            for node in nodes:
                node.output[:] = [inner if o == output.name else o for o in node.output]
            nodes.append(helper.make_node("Cast", [inner], [output.name], name=f"cast_{output.name}", to=FLOAT))
    used_half = {v for node in nodes if node.name not in keep for v in node.input if v in float_initializers}
    data = graph_builder.ExternalData(data_file, location=Path(data_file).name) if data_file else None
    converted = []
    try:
        for tensor in graph.initializer:
            if tensor.name not in float_initializers:
                converted.append(tensor)
                continue
            array = numpy_helper.to_array(tensor, base_dir=str(Path(src).parent))
            if tensor.name in used_half:
                converted.append(_tensor(data, _half(array), tensor.name))
            if tensor.name in fp32_copies:
                converted.append(_tensor(data, array, tensor.name + "__fp32"))
    finally:
        if data:
            data.close()
    del graph.initializer[:]
    graph.initializer.extend(converted)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    onnx.save_model(model, str(dst))


def _tensor(data, array, name):
    return data.tensor(array, name) if data else numpy_helper.from_array(array, name)


def _half(array):
    """fp16 of a float32 array, clipped to fp16's finite range (a mask's
    float32 minimum becomes -65504, still far below every score)."""
    return np.clip(array, -65504.0, 65504.0).astype(np.float16)
