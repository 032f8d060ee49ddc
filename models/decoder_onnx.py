"""Build an fp32 ONNX graph of a decoder embedder (Qwen3, Qwen2, Llama,
Mistral) from its safetensors, without torch.

The graph takes input_ids and attention_mask (int64 [B, S], right-padded)
and returns last_hidden_state [B, S, H] after the final RMSNorm; pooling
(the last real token's state, for these models) stays in eeane's shared
code, which reads each row's length, so padding never moves the token it
takes. Per layer, as transformers computes it:
- RMSNorm: x / sqrt(mean(x^2) + eps) * weight;
- attention with grouped query heads (each key/value head serves
  num_attention_heads / num_key_value_heads query heads), Qwen2's q/k/v
  biases, Qwen3's RMSNorm of each query and key head, RoPE with the config's
  theta on positions 0..S-1 (rotate-half layout), scores scaled by
  1/sqrt(head_dim), causal, padded keys masked;
- SwiGLU: down(silu(gate(x)) * up(x)).
`numpy_forward` is an independent float64 implementation of the same
network, used to check the graph before it is published.
"""
import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from graph_builder import GraphBuilder

OPSET = 17

FAMILIES = ("qwen3", "qwen2", "llama", "mistral")


class Unsupported(SystemExit):
    pass


def shape(cfg):
    """The network's sizes and options from config.json (transformers 4's
    top-level rope_theta, or 5's rope_parameters); what it does not build is
    refused, naming the key."""
    kind = cfg.get("model_type")
    if kind not in FAMILIES:
        raise Unsupported(f"model_type {kind!r}: decoder graphs are built for {', '.join(FAMILIES)}")
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise Unsupported(f"rope type {rope_type!r} (rope_scaling): eeane builds the default RoPE only")
    if cfg.get("use_sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or []):
        raise Unsupported("sliding-window attention layers: eeane builds full attention only")
    if cfg.get("hidden_act", "silu") != "silu":
        raise Unsupported(f"hidden_act {cfg.get('hidden_act')!r}: eeane builds SwiGLU with silu")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return {
        "kind": kind,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or hidden // heads),
        "layers": int(cfg["num_hidden_layers"]),
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "theta": float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0),
        "qk_norm": kind == "qwen3",
    }


def _prefix(weights):
    return "model." if "model.embed_tokens.weight" in weights else ""


def build_graph(weights, cfg):
    s = shape(cfg)
    p = _prefix(weights)
    hidden, heads, kv_heads, hd = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"]
    group = heads // kv_heads

    builder = GraphBuilder(weights, p)
    const, weight, node = builder.const, builder.weight, builder.node
    inits, nodes = builder.inits, builder.nodes

    def linear(x, prefix):
        y = node("MatMul", [x, weight(prefix + ".weight", transpose=True)])
        return node("Add", [y, weight(prefix + ".bias")]) if p + prefix + ".bias" in weights else y

    eps = const("eps", np.array(s["eps"], np.float32))
    last_axis = const("last_axis", np.array([-1], np.int64))

    def rms_norm(x, name):
        mean_square = node("ReduceMean", [node("Mul", [x, x])], axes=[-1], keepdims=1)
        return node("Mul", [node("Div", [x, node("Sqrt", [node("Add", [mean_square, eps])])]), weight(name)])

    # Positions 0..S-1 and their RoPE tables [S, head_dim].
    one = const("one_i64", np.array(1, np.int64))
    seq = node("Gather", [node("Shape", ["input_ids"]), one], axis=0)
    positions = node("Cast", [node("Range", [const("zero_i64", np.array(0, np.int64)), seq, one])], to=TensorProto.FLOAT)
    inv_freq = 1.0 / (s["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = node("MatMul", [node("Unsqueeze", [positions, const("axis_1", np.array([1], np.int64))]),
                            const("inv_freq", inv_freq.astype(np.float32).reshape(1, -1))])
    angles = node("Concat", [freqs, freqs], axis=-1)
    cos, sin = node("Cos", [angles]), node("Sin", [angles])
    half = hd // 2
    first_half = (const("h0", np.array([0], np.int64)), const("h1", np.array([half], np.int64)))
    second_half = (const("h2", np.array([half], np.int64)), const("h3", np.array([hd], np.int64)))

    def rope(x):
        x1 = node("Slice", [x, *first_half, last_axis])
        x2 = node("Slice", [x, *second_half, last_axis])
        rotated = node("Concat", [node("Neg", [x2]), x1], axis=-1)
        return node("Add", [node("Mul", [x, cos]), node("Mul", [rotated, sin])])

    # Attention bias [B, 1, S, S]: float32 min above the diagonal and at padded keys.
    rows = node("Unsqueeze", [node("Range", ["zero_i64", seq, one]), const("axis_1b", np.array([1], np.int64))])
    cols = node("Unsqueeze", [node("Range", ["zero_i64", seq, one]), const("axis_0", np.array([0], np.int64))])
    minimum = const("mask_min", np.array(np.finfo(np.float32).min, np.float32))
    zero = const("zero_f", np.array(0.0, np.float32))
    causal = node("Where", [node("Greater", [cols, rows]), minimum, zero])
    padded = node("Mul", [node("Sub", [const("one_f", np.array(1.0, np.float32)), node("Cast", ["attention_mask"], to=TensorProto.FLOAT)]), minimum])
    padded = node("Unsqueeze", [padded, const("axes_1_2", np.array([1, 2], np.int64))])
    # min + min overflows to -inf, which softmax still takes as 0 weight; a
    # row keeps its own (real) first key, so no row is all -inf.
    bias = node("Add", [causal, padded])

    q_shape = const("q_shape", np.array([0, 0, heads, hd], np.int64))
    kv_shape = const("kv_shape", np.array([0, 0, kv_heads, hd], np.int64))
    scale = const("scale", np.array(1.0 / math.sqrt(hd), np.float32))
    merge = const("merge", np.array([0, 0, heads * hd], np.int64))

    x = node("Gather", [weight("embed_tokens.weight"), "input_ids"])
    for i in range(s["layers"]):
        lp = f"layers.{i}"
        h = rms_norm(x, lp + ".input_layernorm.weight")
        q = node("Reshape", [linear(h, lp + ".self_attn.q_proj"), q_shape])
        k = node("Reshape", [linear(h, lp + ".self_attn.k_proj"), kv_shape])
        v = node("Reshape", [linear(h, lp + ".self_attn.v_proj"), kv_shape])
        if s["qk_norm"]:
            q = rms_norm(q, lp + ".self_attn.q_norm.weight")
            k = rms_norm(k, lp + ".self_attn.k_norm.weight")
        q = rope(node("Transpose", [q], perm=[0, 2, 1, 3]))
        k = rope(node("Transpose", [k], perm=[0, 2, 1, 3]))
        v = node("Transpose", [v], perm=[0, 2, 1, 3])
        if group > 1:
            # Each key/value head repeated for its group of query heads: [B, kv, S, d] -> [B, kv * group, S, d].
            def repeat(t, name):
                expanded = node("Expand", [node("Unsqueeze", [t, const(f"{name}_axis_{i}", np.array([2], np.int64))]),
                                           node("Concat", [node("Slice", [node("Shape", [t]), const(f"{name}_s0_{i}", np.array([0], np.int64)),
                                                                          const(f"{name}_s1_{i}", np.array([2], np.int64))]),
                                                           const(f"{name}_g_{i}", np.array([group], np.int64)),
                                                           node("Slice", [node("Shape", [t]), const(f"{name}_s2_{i}", np.array([2], np.int64)),
                                                                          const(f"{name}_s3_{i}", np.array([4], np.int64))])], axis=0)])
                return node("Reshape", [expanded, const(f"{name}_merge_{i}", np.array([0, heads, -1, hd], np.int64))])

            k, v = repeat(k, "k"), repeat(v, "v")
        scores = node("Add", [node("Mul", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), bias])
        context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        context = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), merge])
        x = node("Add", [x, linear(context, lp + ".self_attn.o_proj")])
        h = rms_norm(x, lp + ".post_attention_layernorm.weight")
        gate = linear(h, lp + ".mlp.gate_proj")
        silu = node("Mul", [gate, node("Sigmoid", [gate])])
        x = node("Add", [x, linear(node("Mul", [silu, linear(h, lp + ".mlp.up_proj")]), lp + ".mlp.down_proj")])
    nodes.append(helper.make_node("Identity", [rms_norm(x, "norm.weight")], ["last_hidden_state"]))
    int_input = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
    output = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    graph = helper.make_graph(nodes, f"{s['kind']}_decoder", [int_input("input_ids"), int_input("attention_mask")], [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="eeane-models")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def numpy_forward(weights, cfg, ids):
    """One unpadded sequence's last_hidden_state [S, H], float64."""
    s = shape(cfg)
    p = _prefix(weights)
    w = lambda name: weights[p + name].astype(np.float64)
    hd, heads, kv_heads = s["head_dim"], s["heads"], s["kv_heads"]

    def norm(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + s["eps"]) * w(name)

    def lin(x, prefix):
        y = x @ w(prefix + ".weight").T
        return y + w(prefix + ".bias") if p + prefix + ".bias" in weights else y

    n = len(ids)
    inv_freq = 1.0 / (s["theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], -1)
    cos, sin = np.cos(angles), np.sin(angles)

    def rope(t):  # [heads, S, d]
        rotated = np.concatenate([-t[..., hd // 2:], t[..., :hd // 2]], -1)
        return t * cos + rotated * sin

    causal = np.triu(np.full((n, n), -np.inf), 1)
    x = w("embed_tokens.weight")[np.asarray(ids)]
    for i in range(s["layers"]):
        lp = f"layers.{i}"
        h = norm(x, lp + ".input_layernorm.weight")
        q = lin(h, lp + ".self_attn.q_proj").reshape(n, heads, hd)
        k = lin(h, lp + ".self_attn.k_proj").reshape(n, kv_heads, hd)
        v = lin(h, lp + ".self_attn.v_proj").reshape(n, kv_heads, hd)
        if s["qk_norm"]:
            q, k = norm(q, lp + ".self_attn.q_norm.weight"), norm(k, lp + ".self_attn.k_norm.weight")
        q, k, v = rope(q.transpose(1, 0, 2)), rope(k.transpose(1, 0, 2)), v.transpose(1, 0, 2)
        k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ v
        x = x + lin(context.transpose(1, 0, 2).reshape(n, heads * hd), lp + ".self_attn.o_proj")
        h = norm(x, lp + ".post_attention_layernorm.weight")
        gate = lin(h, lp + ".mlp.gate_proj")
        x = x + lin(gate / (1 + np.exp(-gate)) * lin(h, lp + ".mlp.up_proj"), lp + ".mlp.down_proj")
    return norm(x, "norm.weight")
