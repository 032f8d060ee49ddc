"""Build an fp32 ONNX graph of a decoder embedder (Qwen3, Qwen2, Llama,
Mistral; Gemma3 text, as EmbeddingGemma) from its safetensors, without torch.

The graph takes input_ids and attention_mask (int64 [B, S], right-padded)
and returns last_hidden_state [B, S, H] after the final norm; pooling (the
last real token's state, or the mean for EmbeddingGemma) stays in eeane's
shared code or the appended sentence-transformers tail, which read each
row's length, so padding never moves what they take. Per layer, as
transformers computes it:
- RMSNorm: x / sqrt(mean(x^2) + eps) * weight, or * (1 + weight) for Gemma;
- attention with grouped query heads (each key/value head serves
  num_attention_heads / num_key_value_heads query heads), Qwen2's q/k/v
  biases, Qwen3's and Gemma3's RMSNorm of each query and key head, RoPE on
  positions 0..S-1 (rotate-half layout) with the theta of the layer's type,
  scores scaled by 1/sqrt(head_dim) (Gemma: 1/sqrt(query_pre_attn_scalar)),
  causal unless the config asks for bidirectional attention, sliding-window
  layers limited to their window, padded keys masked;
- the gated MLP: down(act(gate(x)) * up(x)), act silu (SwiGLU) or Gemma's
  tanh-approximated GELU (GeGLU);
- Gemma3 only: embeddings scaled by sqrt(hidden), and norms after attention
  and around the MLP as well as before attention.
`numpy_forward` is an independent float64 implementation of the same
network, used to check the graph before it is published.
"""
import math

import numpy as np
from onnx import TensorProto, helper

import checks
from graph_builder import GraphBuilder, gelu_exact, gelu_tanh, numpy_allowed, numpy_attention, numpy_rope

OPSET = 17

MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral", "gemma", "gemma2", "gemma3_text")

# Activations of the gated MLP, by config name.
SILU = ("silu", "swish")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")
GELU_EXACT = ("gelu",)


class Unsupported(SystemExit):
    pass


def _rope_theta(cfg, layer_type, per_type):
    """The RoPE theta of a layer type: transformers 5's rope_parameters (one
    dict, or one per layer type), else 4's rope_theta and, for Gemma3's
    sliding layers (`per_type`), rope_local_base_freq. Non-default RoPE is
    refused."""
    params = cfg.get("rope_parameters") or {}
    if layer_type in params:
        params = params[layer_type]
    scaling = cfg.get("rope_scaling") or {}
    if per_type and layer_type == "sliding_attention":
        scaling = {}  # transformers applies Gemma3's rope_scaling to its full-attention layers only
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise Unsupported(f"rope type {rope_type!r} (rope_scaling): eeane builds the default RoPE only")
    if params.get("rope_theta"):
        return float(params["rope_theta"])
    if per_type and layer_type == "sliding_attention":
        return float(cfg.get("rope_local_base_freq") or 10000.0)
    return float(cfg.get("rope_theta") or (1000000.0 if per_type else 10000.0))


# What each family does beyond Llama's layer, as transformers 5 computes it:
# - gemma_norm: norms scale by (1 + weight), embeddings by sqrt(hidden);
# - sandwich: norms after attention and around the MLP too (Gemma2, Gemma3);
# - qk_norm: an RMSNorm of each query and key head (Qwen3, Gemma3);
# - sliding: the layers' pattern when the config lists no layer_types
#   (Gemma2 alternates from a sliding first layer; Gemma3 has one global
#   layer in six), and whether the theta is per layer type;
# - activation: the config key transformers reads for the MLP.
# Scores are not soft-capped (attn_logit_softcapping): transformers runs
# these models with SDPA by default, which does not apply it, and
# sentence-transformers' vectors are those (the gemma2 fixture's cap of 5
# moves them to cosine 0.951 when applied).
FAMILY_TRAITS = {
    "qwen3": {"qk_norm": True},
    "qwen2": {},
    "llama": {},
    "mistral": {},
    "gemma": {"gemma_norm": True, "activation_key": "hidden_act", "default_activation": "gelu_pytorch_tanh"},
    "gemma2": {"gemma_norm": True, "sandwich": True, "sliding_every": 2, "query_scalar": True,
               "activation_key": "hidden_activation", "default_activation": "gelu_pytorch_tanh"},
    "gemma3_text": {"gemma_norm": True, "sandwich": True, "qk_norm": True, "sliding_every": 6, "theta_per_type": True,
                    "query_scalar": True, "activation_key": "hidden_activation",
                    "default_activation": "gelu_pytorch_tanh"},
}


def shape(cfg):
    """The network's sizes and options from config.json; what it does not
    build is refused, naming the key."""
    kind = cfg.get("model_type")
    if kind not in MODEL_TYPES:
        raise Unsupported(f"model_type {kind!r}: decoder graphs are built for {', '.join(MODEL_TYPES)}")
    traits = FAMILY_TRAITS[kind]
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    # True only: some configs write "vision" (bidirectional among image tokens, causal for text).
    bidirectional = cfg.get("use_bidirectional_attention") is True or cfg.get("is_causal") is False
    if bidirectional and kind == "gemma2":
        raise Unsupported("use_bidirectional_attention on gemma2: transformers 5 still builds its masks causal; eeane does not guess")
    layer_types = cfg.get("layer_types")
    if not layer_types:
        every = traits.get("sliding_every")
        if every:
            pattern = int(cfg.get("sliding_window_pattern") or every)
            layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        else:
            layer_types = ["full_attention"] * layers
    if not traits.get("sliding_every") and (cfg.get("use_sliding_window") or any(t != "full_attention" for t in layer_types)):
        raise Unsupported("sliding-window attention layers: eeane builds them for Gemma2 and Gemma3 only")
    window = None
    if "sliding_attention" in layer_types:
        size = int(cfg["sliding_window"])
        # transformers 5 (Gemma3TextConfig) turns a bidirectional model's
        # window w into w // 2 + 1, exclusive on both sides.
        window = ("within", size // 2) if bidirectional else ("before", size)
    key = traits.get("activation_key")
    act = (cfg.get(key) if key else cfg.get("hidden_activation") or cfg.get("hidden_act")) or traits.get("default_activation", "silu")
    if act not in SILU + GELU_TANH + GELU_EXACT:
        raise Unsupported(f"hidden activation {act!r}: eeane builds gated MLPs with silu or gelu")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    per_type = bool(traits.get("theta_per_type"))
    return {
        "kind": kind,
        "gemma_norm": bool(traits.get("gemma_norm")),
        "sandwich": bool(traits.get("sandwich")),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "layers": layers,
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "causal": not bidirectional,
        "layer_rope": [_rope_theta(cfg, t, per_type) for t in layer_types[:layers]],
        "layer_window": [window if t == "sliding_attention" else None for t in layer_types[:layers]],
        "scale": float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5 if traits.get("query_scalar") else 1.0 / math.sqrt(head_dim),
        "activation": "silu" if act in SILU else "gelu" if act in GELU_EXACT else "gelu_tanh",
        "qk_norm": bool(traits.get("qk_norm")),
    }


def _prefix(weights):
    return "model." if "model.embed_tokens.weight" in weights else ""


def _lm_rows(weights, cfg, ids):
    """Rows of the language-model head (tied to the token embeddings where
    the config says so or the checkpoint has no head) for token `ids`."""
    p = _prefix(weights)
    head = "lm_head.weight" if "lm_head.weight" in weights else p + "embed_tokens.weight"
    table = weights[head]
    return np.stack([np.asarray(table[i], np.float64) for i in ids])


def build_graph(weights, cfg, data=None, score_tokens=None, fused=False):
    """The graph of `weights` (any mapping of name to array, read as the
    builder goes); with `data` (graph_builder.ExternalData), its large
    initializers written to that file as they are made.

    With `fused`, the form for ONNX Runtime's GPU kernels (gpu_graph.py):
    RMSNorm as SimplifiedLayerNormalization, states kept [B, S, heads, d]
    (no transposes), and one fused attention operator per layer
    (GraphBuilder.fused_attention): the same network, the same vectors.

    With `score_tokens` (true id, false id or None), a reranker that is a
    language model (Qwen3-Reranker): the output is `logits` [B, 1], the
    head's logit of the true token at each row's last real token, less the
    false token's when there is one (sentence-transformers' LogitScore), so
    that a sigmoid gives p(true) over the two."""
    s = shape(cfg)
    p = _prefix(weights)
    hidden, heads, kv_heads, hd = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"]
    group = heads // kv_heads

    builder = GraphBuilder(weights, p, data)
    const, weight, node, constant = builder.const, builder.weight, builder.node, builder.constant
    nodes = builder.nodes

    def linear(x, prefix):
        y = node("MatMul", [x, weight(prefix + ".weight", transpose=True)])
        return node("Add", [y, weight(prefix + ".bias")]) if p + prefix + ".bias" in weights else y

    eps = None if fused else const("eps", np.array(s["eps"], np.float32))

    def rms_norm(x, name):
        if fused:
            return builder.rms_norm_op(x, name, s["eps"], plus_one=s["gemma_norm"])
        mean_square = node("ReduceMean", [node("Mul", [x, x])], axes=[-1], keepdims=1)
        return node("Mul", [node("Div", [x, node("Sqrt", [node("Add", [mean_square, eps])])]), weight(name, plus_one=s["gemma_norm"])])

    tables = {theta: builder.rope_tables(theta, hd, heads_axis=fused) for theta in sorted(set(s["layer_rope"]))}
    # Windows in layer order (not a set's): the same graph every run. A
    # fused causal layer needs none (GroupQueryAttention reads lengths).
    biases = {} if fused and s["causal"] else {window: builder.attention_bias(s["causal"], window) for window in dict.fromkeys(s["layer_window"])}

    q_shape = const("q_shape", np.array([0, 0, heads, hd], np.int64))
    kv_shape = const("kv_shape", np.array([0, 0, kv_heads, hd], np.int64))
    scale = None if fused else const("scale", np.array(s["scale"], np.float32))
    merge = const("merge", np.array([0, 0, heads * hd], np.int64))

    def repeat(t):
        """Each key/value head repeated for its group of query heads: [B, kv, S, d] -> [B, kv * group, S, d]."""
        t_shape = node("Shape", [t])
        target = node("Concat", [node("Slice", [t_shape, constant("s0", np.array([0], np.int64)), constant("s1", np.array([2], np.int64))]),
                                 constant("group", np.array([group], np.int64)),
                                 node("Slice", [t_shape, constant("s2", np.array([2], np.int64)), constant("s3", np.array([4], np.int64))])],
                      axis=0)
        expanded = node("Expand", [node("Unsqueeze", [t, constant("axis", np.array([2], np.int64))]), target])
        return node("Reshape", [expanded, constant("merge_heads", np.array([0, heads, -1, hd], np.int64))])

    x = node("Gather", [weight("embed_tokens.weight"), "input_ids"])
    if s["gemma_norm"]:
        # GemmaTextScaledWordEmbedding: sqrt(hidden), rounded to the weights' dtype (float32 here).
        x = node("Mul", [x, const("embed_scale", np.array(math.sqrt(hidden), np.float32))])
    def layer_rest(x, context, lp):
        """The layer after attention: the output projection, the residual,
        the norms and the gated MLP."""
        attended = linear(context, lp + ".self_attn.o_proj")
        if s["sandwich"]:
            attended = rms_norm(attended, lp + ".post_attention_layernorm.weight")
            x = node("Add", [x, attended])
            h = rms_norm(x, lp + ".pre_feedforward_layernorm.weight")
        else:
            x = node("Add", [x, attended])
            h = rms_norm(x, lp + ".post_attention_layernorm.weight")
        gate = linear(h, lp + ".mlp.gate_proj")
        if s["activation"] != "silu":
            activated = builder.gelu(gate, exact=s["activation"] == "gelu")
        else:
            activated = node("Mul", [gate, node("Sigmoid", [gate])])
        mlp = linear(node("Mul", [activated, linear(h, lp + ".mlp.up_proj")]), lp + ".mlp.down_proj")
        if s["sandwich"]:
            mlp = rms_norm(mlp, lp + ".post_feedforward_layernorm.weight")
        return node("Add", [x, mlp])

    kv_merge = const("kv_merge", np.array([0, 0, kv_heads * hd], np.int64)) if fused else None
    for i in range(s["layers"]):
        lp = f"layers.{i}"
        h = rms_norm(x, lp + ".input_layernorm.weight")
        q = node("Reshape", [linear(h, lp + ".self_attn.q_proj"), q_shape])
        k = node("Reshape", [linear(h, lp + ".self_attn.k_proj"), kv_shape])
        v = node("Reshape", [linear(h, lp + ".self_attn.v_proj"), kv_shape])
        if s["qk_norm"]:
            q = rms_norm(q, lp + ".self_attn.q_norm.weight")
            k = rms_norm(k, lp + ".self_attn.k_norm.weight")
        rope = tables[s["layer_rope"][i]]
        window = s["layer_window"][i]
        if fused:
            # [B, S, heads, d] throughout: RoPE on the last axis, then one operator.
            q = node("Reshape", [builder.rope(q, rope, hd), merge])
            k = node("Reshape", [builder.rope(k, rope, hd), kv_merge])
            context = builder.fused_attention(q, k, node("Reshape", [v, kv_merge]), heads, kv_heads, hd, s["scale"], s["causal"], window,
                                              biases.get(window))
        else:
            q = builder.rope(node("Transpose", [q], perm=[0, 2, 1, 3]), rope, hd)
            k = builder.rope(node("Transpose", [k], perm=[0, 2, 1, 3]), rope, hd)
            v = node("Transpose", [v], perm=[0, 2, 1, 3])
            if group > 1:
                k, v = repeat(k), repeat(v)
            scores = node("Mul", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
            scores = node("Add", [scores, biases[window]])
            context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
            context = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), merge])
        x = layer_rest(x, context, lp)
    states = rms_norm(x, "norm.weight")
    if score_tokens is None:
        nodes.append(helper.make_node("Identity", [states], ["last_hidden_state"]))
        output = ("last_hidden_state", ["batch", "sequence", hidden])
    else:
        # The last real token of each right-padded row: position == length - 1.
        length = node("ReduceSum", ["attention_mask", constant("axis", np.array([1], np.int64))], keepdims=1)
        last = node("Cast", [node("Equal", [node("Unsqueeze", [builder.positions(), constant("axis", np.array([0], np.int64))]),
                                            node("Sub", [length, constant("one", np.array(1, np.int64))])])], to=TensorProto.FLOAT)
        pooled = node("ReduceSum", [node("Mul", [states, node("Unsqueeze", [last, constant("axis", np.array([2], np.int64))])]),
                                    constant("axis", np.array([1], np.int64))], keepdims=0)
        true_id, false_id = score_tokens
        rows = _lm_rows(weights, cfg, [true_id])[0] - (_lm_rows(weights, cfg, [false_id])[0] if false_id is not None else 0.0)
        score = node("MatMul", [pooled, constant("score_head", rows.astype(np.float32).reshape(-1, 1))])
        nodes.append(helper.make_node("Identity", [score], ["logits"]))
        output = ("logits", ["batch", 1])
    return builder.model(f"{s['kind']}_decoder", *output, OPSET)


def numpy_forward(weights, cfg, ids):
    """One unpadded sequence's last_hidden_state [S, H], float64."""
    s = shape(cfg)
    p = _prefix(weights)
    w = lambda name: weights[p + name].astype(np.float64)
    hd, heads, kv_heads = s["head_dim"], s["heads"], s["kv_heads"]

    def norm(x, name):
        scale = 1.0 + w(name) if s["gemma_norm"] else w(name)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + s["eps"]) * scale

    def lin(x, prefix):
        y = x @ w(prefix + ".weight").T
        return y + w(prefix + ".bias") if p + prefix + ".bias" in weights else y

    n = len(ids)
    # The rows of the text's tokens, widened after the lookup (not the whole table).
    x = weights[p + "embed_tokens.weight"][np.asarray(ids)].astype(np.float64)
    if s["gemma_norm"]:
        x = x * float(np.float32(math.sqrt(s["hidden"])))
    for i in range(s["layers"]):
        lp = f"layers.{i}"
        h = norm(x, lp + ".input_layernorm.weight")
        q = lin(h, lp + ".self_attn.q_proj").reshape(n, heads, hd)
        k = lin(h, lp + ".self_attn.k_proj").reshape(n, kv_heads, hd)
        v = lin(h, lp + ".self_attn.v_proj").reshape(n, kv_heads, hd)
        if s["qk_norm"]:
            q, k = norm(q, lp + ".self_attn.q_norm.weight"), norm(k, lp + ".self_attn.k_norm.weight")
        theta = s["layer_rope"][i]
        q, k, v = numpy_rope(q.transpose(1, 0, 2), theta), numpy_rope(k.transpose(1, 0, 2), theta), v.transpose(1, 0, 2)
        k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
        allowed = numpy_allowed(n, s["causal"], s["layer_window"][i])
        context = numpy_attention(q, k, v, allowed, s["scale"])
        attended = lin(context.transpose(1, 0, 2).reshape(n, heads * hd), lp + ".self_attn.o_proj")
        if s["sandwich"]:
            x = x + norm(attended, lp + ".post_attention_layernorm.weight")
            h = norm(x, lp + ".pre_feedforward_layernorm.weight")
        else:
            x = x + attended
            h = norm(x, lp + ".post_attention_layernorm.weight")
        gate = lin(h, lp + ".mlp.gate_proj")
        activated = {"silu": lambda g: g / (1 + np.exp(-g)), "gelu_tanh": gelu_tanh, "gelu": gelu_exact}[s["activation"]](gate)
        mlp = lin(activated * lin(h, lp + ".mlp.up_proj"), lp + ".mlp.down_proj")
        x = x + (norm(mlp, lp + ".post_feedforward_layernorm.weight") if s["sandwich"] else mlp)
    return norm(x, "norm.weight")


def numpy_score(weights, cfg, ids, score_tokens):
    """A language-model reranker's score logit for one unpadded sequence, float64."""
    true_id, false_id = score_tokens
    state = numpy_forward(weights, cfg, ids)[-1]
    rows = _lm_rows(weights, cfg, [true_id] + ([false_id] if false_id is not None else []))
    logits = rows @ state
    return float(logits[0] - (logits[1] if false_id is not None else 0.0))


def prepare_weights(weights, cfg):
    """The checkpoint as it is: this builder reads its own names."""
    return weights, cfg


def check_tokens(cfg):
    """The check texts' truncation (RoPE has no position table to stay within)."""
    return checks.CHECK_TOKENS


check_states = checks.every_state_check(numpy_forward, check_tokens)
