"""Build an fp32 ONNX graph of a BERT encoder from its safetensors, without torch.

The graph takes input_ids, attention_mask, token_type_ids (int64 [B, S]) and
returns last_hidden_state [B, S, H]; pooling stays outside, in eeane's shared
code. With `token_types=False` there is no token_type_ids input (type 0 is
added as a constant); with `pooled=True` the graph ends in mask-mean pooling
and L2 normalization and returns sentence_embedding [B, H], ready to use.
With `ncnn_friendly=True` (for pnnx): position_ids is an input, there is no
token-type input (pnnx's converter crashed on it), and the mask is a float
[B, S, S] matrix, key by query, so that several sequences can be packed into
one row (positions restarting, each attending only to itself) and run as one.
With `fusable=True` the mask and the attention scale take the shapes ONNX
Runtime's transformer optimizer recognizes (the mask unsqueezed twice before
its Cast, scores divided by sqrt(head_dim)), so that it fuses each layer's
attention into one Attention operator for the GPU, and the positions are
counted along input_ids' rows, so that no node needs the CPU; the values are
the same network's, within float rounding.
`numpy_forward` is an independent float64 implementation of the same network,
used to check the graph before it is published.

RoBERTa, XLM-RoBERTa, CamemBERT and DistilBERT are built as the BERT they
compute (`as_bert`, this family's `prepare_weights`); MPNet reuses this
graph with its relative attention bias (families/mpnet.py, `score_bias`).
"""
import math

import numpy as np
import onnx
from onnx import TensorProto, helper

import checks
from graph_builder import GraphBuilder, Renamed

OPSET = 17  # LayerNormalization is a single op from 17 on
# The model type under which ONNX Runtime's transformer optimizer fuses this
# graph's `fusable` form (families.toml: gpu_graph = "optimized").
OPTIMIZER_MODEL_TYPE = "bert"


def _prefix(weights):
    for prefix in ("bert.", "roberta."):
        if prefix + "embeddings.word_embeddings.weight" in weights:
            return prefix
    return ""


MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert")

DISTILBERT_LAYER_NAMES = {
    "attention.q_lin": "attention.self.query",
    "attention.k_lin": "attention.self.key",
    "attention.v_lin": "attention.self.value",
    "attention.out_lin": "attention.output.dense",
    "sa_layer_norm": "attention.output.LayerNorm",
    "ffn.lin1": "intermediate.dense",
    "ffn.lin2": "output.dense",
    "output_layer_norm": "output.LayerNorm",
}


def bert_layer_name(key, names):
    """`PART.layer.I.STEM.SUFFIX` as BERT's `encoder.layer.I.{names[STEM]}.SUFFIX`
    (a stem `names` does not list keeps its name)."""
    _, _, i, rest = key.split(".", 3)
    stem, suffix = rest.rsplit(".", 1)
    return f"encoder.layer.{i}.{names.get(stem, stem)}.{suffix}"


def stripped(weights, prefix):
    """New name -> the checkpoint's, `prefix` taken off the names that have it."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): k for k in weights}


def as_bert(weights, cfg):
    """A RoBERTa, XLM-RoBERTa, CamemBERT or DistilBERT checkpoint as the BERT encoder it
    computes, so that one graph builder and one numpy network serve all four:
    - (XLM-)RoBERTa numbers positions from pad_token_id + 1, not 0: drop those
      first rows of the position table, so that a graph counting from 0 reads
      row i + pad + 1; its classification head (classifier.dense, tanh,
      classifier.out_proj) is BERT's pooler and classifier under other names.
    - DistilBERT has no token types (a zero row stands in), other layer
      names, and a head of pre_classifier, ReLU, classifier.
    Returns (weights, cfg) with BERT's names and a "pooler_activation";
    the weights are a view that reads `weights` lazily (graph_builder.Renamed)."""
    kind = cfg.get("model_type", "bert")
    if kind not in MODEL_TYPES:
        raise SystemExit(f"model_type {kind!r}: this family's graphs are built for {', '.join(MODEL_TYPES)}")
    if kind == "bert":
        return weights, {**cfg, "pooler_activation": "tanh"}
    # CamemBERT is RoBERTa's network and layout under its own names.
    base = {"roberta": "roberta.", "xlm-roberta": "roberta.", "camembert": "roberta.", "distilbert": "distilbert."}[kind]
    names = stripped(weights, base)
    if kind == "distilbert":
        renamed = {}
        for k, old in names.items():
            if k.startswith("transformer.layer."):
                k = bert_layer_name(k, DISTILBERT_LAYER_NAMES)
            elif k.startswith("pre_classifier."):
                k = "pooler.dense." + k.split(".", 1)[1]
            renamed[k] = old
        hidden = int(cfg["dim"])
        computed = {"embeddings.token_type_embeddings.weight": lambda: np.zeros((1, hidden), np.float32)}
        bert_cfg = {"hidden_size": hidden, "type_vocab_size": 1, "num_attention_heads": cfg["n_heads"], "num_hidden_layers": cfg["n_layers"],
                    "intermediate_size": cfg["hidden_dim"], "hidden_act": cfg.get("activation", "gelu"), "layer_norm_eps": 1e-12,
                    "max_position_embeddings": cfg.get("max_position_embeddings", 512), "model_type": "bert",
                    "architectures": cfg.get("architectures", []), "pooler_activation": "relu"}
        return Renamed(weights, renamed, computed), bert_cfg
    offset = int(cfg.get("pad_token_id", 1)) + 1
    positions = names.pop("embeddings.position_embeddings.weight")
    for theirs, ours in (("classifier.dense.", "pooler.dense."), ("classifier.out_proj.", "classifier.")):
        for k in [k for k in names if k.startswith(theirs)]:
            names[ours + k[len(theirs):]] = names.pop(k)
    computed = {"embeddings.position_embeddings.weight": lambda: weights[positions][offset:]}
    return Renamed(weights, names, computed), {**cfg, "model_type": "bert", "max_position_embeddings": int(cfg["max_position_embeddings"]) - offset,
                                               "pooler_activation": "tanh"}


prepare_weights = as_bert


def build_graph(weights, cfg, token_types=True, pooled=False, ncnn_friendly=False, cls_head=None, sequence_classifier=False,
                fusable=False, data=None, score_bias=None):
    """`weights` any mapping of name to array, read as the builder goes; with
    `data` (graph_builder.ExternalData), the large initializers are written
    to that file as they are made. `score_bias(builder, positions, bias)`,
    when given, returns the attention bias with a term of its own added (a
    family built on this graph: MPNet's relative positions)."""
    p = _prefix(weights)
    # One token type (XLM-R, DistilBERT): the graph takes none, as the model
    # ignores them; BERT-style tokenizers still number a pair's second text 1.
    token_types = token_types and weights[p + "embeddings.token_type_embeddings.weight"].shape[0] > 1
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    head_dim = hidden // heads
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise SystemExit(f"unsupported hidden_act {cfg.get('hidden_act')!r}")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit("only absolute position embeddings are supported")

    builder = GraphBuilder(weights, p, data)
    const, weight, node = builder.const, builder.weight, builder.node
    inits, nodes = builder.inits, builder.nodes

    def layer_norm(x, prefix):
        return node("LayerNormalization", [x, weight(prefix + ".weight"), weight(prefix + ".bias")], axis=-1, epsilon=eps)

    def linear(x, prefix):
        return node("Add", [node("MatMul", [x, weight(prefix + ".weight", transpose=True)]), weight(prefix + ".bias")])

    # Embeddings: word + position (0..S-1) + token type, then LayerNorm.
    if ncnn_friendly:
        positions = "position_ids"
        token_types = False
    elif fusable:
        # 0..S-1 counted along each row of input_ids ([B, S]), not Range over
        # its Shape: ONNX Runtime runs shape arithmetic on the CPU, and a
        # graph with one node off the GPU cannot be captured as a CUDA graph.
        # For all-MiniLM-L6-v2 the optimizer then fuses the embeddings into
        # EmbedLayerNormalization, which it did not with Range.
        ones = node("Add", [node("Mul", ["input_ids", const("zero_i64", np.array(0, np.int64))]),
                            const("one_i64", np.array(1, np.int64))])
        positions = node("Sub", [node("CumSum", [ones, "one_i64"]), "one_i64"])
    else:
        seq_len = node("Gather", [node("Shape", ["input_ids"]), const("one_i64", np.array(1, np.int64))], axis=0)
        positions = node("Range", [const("zero_i64", np.array(0, np.int64)), seq_len, "one_i64"])
    x = node("Add", [
        node("Gather", [weight("embeddings.word_embeddings.weight"), "input_ids"]),
        node("Gather", [weight("embeddings.position_embeddings.weight"), positions]),
    ])
    if token_types:
        x = node("Add", [x, node("Gather", [weight("embeddings.token_type_embeddings.weight"), "token_type_ids"])])
    else:
        x = node("Add", [x, const("token_type_0", weights[p + "embeddings.token_type_embeddings.weight"][0].astype(np.float32))])
    x = layer_norm(x, "embeddings.LayerNorm")

    # Additive attention bias, 0 where attended, float32 min where masked (as
    # transformers does; -10000 for ncnn, below), so a padded key never receives weight: [B, 1, 1, S]
    # from a [B, S] mask, or [B, 1, S, S] from ncnn's packed [B, S, S] one.
    mask_f = "attention_mask" if ncnn_friendly else node("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    if fusable and not ncnn_friendly:
        # Unsqueeze, Unsqueeze, Cast, Sub, Mul: the optimizer's BERT mask pattern.
        unsqueezed = node("Unsqueeze", [node("Unsqueeze", ["attention_mask", const("axis_1", np.array([1], np.int64))]),
                                        const("axis_2", np.array([2], np.int64))])
        inverted = node("Sub", [const("one_f", np.array(1.0, np.float32)), node("Cast", [unsqueezed], to=TensorProto.FLOAT)])
    else:
        inverted = node("Sub", [const("one_f", np.array(1.0, np.float32)), mask_f])
    # ncnn may compute in fp16, where float32 min is -inf and an attended
    # position's 0 * -inf is NaN: its graph masks with -10000, which fp16
    # holds and which still gives a masked key exactly 0 weight (exp(-10000)
    # underflows in fp32 too).
    masked = -10000.0 if ncnn_friendly else np.finfo(np.float32).min
    bias = node("Mul", [inverted, const("mask_min", np.array(masked, np.float32))])
    if ncnn_friendly:
        bias = node("Unsqueeze", [bias, const("axes_1", np.array([1], np.int64))])
    elif not fusable:
        bias = node("Unsqueeze", [bias, const("axes_1_2", np.array([1, 2], np.int64))])

    if score_bias is not None:
        bias = score_bias(builder, positions, bias)

    split_shape = const("split_heads", np.array([0, 0, heads, head_dim], np.int64))
    merge_shape = const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = const("attn_scale", np.array(1.0 / math.sqrt(head_dim), np.float32))
    sqrt_d = const("attn_sqrt_d", np.array(math.sqrt(head_dim), np.float32)) if fusable else None
    sqrt2 = const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    half = const("half", np.array(0.5, np.float32))
    one = "one_f"

    for i in range(cfg["num_hidden_layers"]):
        lp = f"encoder.layer.{i}"
        q = node("Transpose", [node("Reshape", [linear(x, lp + ".attention.self.query"), split_shape])], perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(x, lp + ".attention.self.key"), split_shape])], perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(x, lp + ".attention.self.value"), split_shape])], perm=[0, 2, 1, 3])
        qk = node("MatMul", [q, k])
        scores = node("Add", [node("Div", [qk, sqrt_d]) if fusable else node("Mul", [qk, scale]), bias])
        context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        context = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), merge_shape])
        x = layer_norm(node("Add", [linear(context, lp + ".attention.output.dense"), x]), lp + ".attention.output.LayerNorm")
        # Exact GELU: 0.5 * h * (1 + erf(h / sqrt 2)), as BERT was trained.
        h = linear(x, lp + ".intermediate.dense")
        gelu = node("Mul", [node("Mul", [h, half]), node("Add", [node("Erf", [node("Div", [h, sqrt2])]), one])])
        x = layer_norm(node("Add", [linear(gelu, lp + ".output.dense"), x]), lp + ".output.LayerNorm")

    if cls_head is not None:
        # A cross-encoder's score: the first ([CLS]) token's state through a
        # linear head, logits [B, 1].
        w, b = cls_head
        cls_state = node("Gather", [x, const("zero_index", np.array(0, np.int64))], axis=1)
        logit = node("MatMul", [cls_state, const("head_w", np.asarray(w, np.float32).reshape(hidden, 1))])
        nodes.append(helper.make_node("Add", [logit, const("head_b", np.asarray(b, np.float32).reshape(1))], ["logits"]))
        output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    elif sequence_classifier:
        # transformers' BertForSequenceClassification: the [CLS] state through
        # the pooler (dense, tanh), then the classifier: logits [B, labels].
        cls_state = node("Gather", [x, const("zero_index", np.array(0, np.int64))], axis=1)
        activation = {"tanh": "Tanh", "relu": "Relu"}[cfg.get("pooler_activation", "tanh")]
        pooled_state = node(activation, [linear(cls_state, "pooler.dense")])
        classifier_w = np.asarray(weights["classifier.weight"], np.float32)
        logit = node("MatMul", [pooled_state, const("classifier_w", classifier_w.T.copy())])
        nodes.append(helper.make_node("Add", [logit, const("classifier_b", np.asarray(weights["classifier.bias"], np.float32))], ["logits"]))
        output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classifier_w.shape[0]])
    elif pooled:
        # Mask-mean over real tokens, then L2: sum(x * m) / sum(m), x / max(|x|, 1e-12).
        weights_m = node("Unsqueeze", [mask_f, const("axes_2", np.array([2], np.int64))])
        summed = node("ReduceSum", [node("Mul", [x, weights_m]), "one_i64_axes"], keepdims=0)
        const("one_i64_axes", np.array([1], np.int64))
        count = node("Max", [node("ReduceSum", [weights_m, "one_i64_axes"], keepdims=0), const("tiny_count", np.array(1e-9, np.float32))])
        mean = node("Div", [summed, count])
        norm = node("Max", [node("ReduceL2", [mean], axes=[-1], keepdims=1),
                            const("tiny_norm", np.array(1e-12, np.float32))])
        nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"]))
        output = helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])
    else:
        nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
        output = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    int_input = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
    if ncnn_friendly:
        inputs = [int_input("input_ids"), int_input("position_ids"),
                  helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "sequence", "sequence"])]
    else:
        inputs = [int_input("input_ids"), int_input("attention_mask")] + ([int_input("token_type_ids")] if token_types else [])
    graph = helper.make_graph(nodes, "bert_encoder", inputs, [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="eeane-models")
    model.ir_version = 8
    if data is None:  # with external data, checked once saved beside it (graph_builder.build_into)
        onnx.checker.check_model(model)
    return model


def numpy_sequence_logits(weights, cfg, ids, type_ids=None):
    """float64 BertForSequenceClassification logits of one pair's ids: the
    [CLS] state through the pooler (dense, then tanh, or ReLU for DistilBERT)
    and the classifier."""
    p = _prefix(weights)
    cls_state = numpy_forward(weights, cfg, ids, type_ids)[0]
    pooled = cls_state @ weights[p + "pooler.dense.weight"].astype(np.float64).T + weights[p + "pooler.dense.bias"]
    pooled = np.maximum(pooled, 0) if cfg.get("pooler_activation") == "relu" else np.tanh(pooled)
    return pooled @ weights["classifier.weight"].astype(np.float64).T + weights["classifier.bias"]


def numpy_forward(weights, cfg, ids, type_ids=None, score_bias=None):
    """float64 forward pass of one unpadded sequence; returns [S, H].
    `score_bias(length)`, when given, is added to every layer's attention
    scores ([heads, S, S]), as build_graph's `score_bias` adds it."""
    p = _prefix(weights)
    w = lambda name: weights[p + name].astype(np.float64)
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    heads = cfg["num_attention_heads"]
    ids = np.asarray(ids)
    one_type = weights[p + "embeddings.token_type_embeddings.weight"].shape[0] == 1
    type_ids = np.zeros_like(ids) if type_ids is None or one_type else np.asarray(type_ids)

    def ln(x, prefix):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w(prefix + ".weight") + w(prefix + ".bias")

    def lin(x, prefix):
        return x @ w(prefix + ".weight").T + w(prefix + ".bias")

    erf = np.vectorize(math.erf)
    x = weights[p + "embeddings.word_embeddings.weight"][ids].astype(np.float64) + w("embeddings.position_embeddings.weight")[: len(ids)]
    x = ln(x + w("embeddings.token_type_embeddings.weight")[type_ids], "embeddings.LayerNorm")
    seq, hidden = x.shape
    d = hidden // heads
    relative = 0.0 if score_bias is None else score_bias(seq)
    for i in range(cfg["num_hidden_layers"]):
        lp = f"encoder.layer.{i}"
        split = lambda t: t.reshape(seq, heads, d).transpose(1, 0, 2)
        q, k, v = (split(lin(x, f"{lp}.attention.self.{n}")) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d) + relative
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(seq, hidden)
        x = ln(lin(ctx, lp + ".attention.output.dense") + x, lp + ".attention.output.LayerNorm")
        h = lin(x, lp + ".intermediate.dense")
        x = ln(lin(0.5 * h * (1 + erf(h / math.sqrt(2))), lp + ".output.dense") + x, lp + ".output.LayerNorm")
    return x


def check_tokens(cfg):
    """The check texts' truncation: within the model's positions (as
    `as_bert` numbers them)."""
    return min(checks.CHECK_TOKENS, int(cfg.get("max_position_embeddings", 512)))


check_states = checks.mean_state_check(numpy_forward, check_tokens)
