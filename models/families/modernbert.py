"""Build an fp32 ONNX graph of ModernBERT (answerdotai/ModernBERT-base and
the embedders built on it) from its safetensors, without torch.

Inputs input_ids and attention_mask (int64 [B, S], right-padded); output
last_hidden_state [B, S, H] after the final LayerNorm. As transformers
computes it (the padded path, not the unpadded FlashAttention one, which
gives the same states):
- embeddings: token embeddings, then LayerNorm; no position table;
- per layer: LayerNorm before attention (none on layer 0), one Wqkv
  projection split into query, key and value heads, RoPE with the theta of
  the layer's type (global or local), bidirectional attention scaled by
  1/sqrt(head_dim); local (sliding) layers attend only keys within
  local_attention / 2 positions; then LayerNorm and the GeGLU MLP:
  Wo(act(input) * gate) where Wi(x) = [input, gate];
- LayerNorms and linears without biases unless the config asks for them.
`numpy_forward` is an independent float64 implementation of the same
network, used to check the graph before it is published.
"""
import math

import numpy as np
from onnx import helper

import checks
from graph_builder import GraphBuilder, gelu_exact, gelu_tanh, numpy_allowed, numpy_attention, numpy_rope

OPSET = 17

MODEL_TYPES = ("modernbert",)


class Unsupported(SystemExit):
    pass


def shape(cfg):
    if cfg.get("model_type") not in MODEL_TYPES:
        raise Unsupported(f"model_type {cfg.get('model_type')!r}: this builder is for ModernBERT")
    layers = int(cfg["num_hidden_layers"])
    every = int(cfg.get("global_attn_every_n_layers") or 3)
    layer_types = cfg.get("layer_types") or ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}

    def theta(layer_type):
        own = params.get(layer_type) or {}
        rope_type = own.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if rope_type != "default":
            raise Unsupported(f"rope type {rope_type!r} (rope_scaling): eeane builds the default RoPE only")
        if own.get("rope_theta"):
            return float(own["rope_theta"])
        if layer_type == "sliding_attention":
            return float(cfg.get("local_rope_theta") or 10000.0)
        return float(cfg.get("global_rope_theta") or 160000.0)

    act = cfg.get("hidden_activation", "gelu")
    if act not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        raise Unsupported(f"hidden_activation {act!r}: eeane builds ModernBERT's GeGLU with gelu")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    window = ("within", int(cfg.get("local_attention") or 128) // 2)
    return {
        "hidden": hidden,
        "heads": heads,
        "head_dim": hidden // heads,
        "intermediate": int(cfg["intermediate_size"]),
        "layers": layers,
        "eps": float(cfg.get("norm_eps", 1e-5)),
        "layer_rope": [theta(t) for t in layer_types[:layers]],
        "layer_window": [window if t == "sliding_attention" else None for t in layer_types[:layers]],
        "exact_gelu": act == "gelu",
    }


def _prefix(weights):
    return "model." if "model.embeddings.tok_embeddings.weight" in weights else ""


def build_graph(weights, cfg, data=None, fused=False):
    """As families/decoder.py's build_graph: `data` takes the large initializers;
    `fused`, one MultiHeadAttention per layer over [B, S, heads, d] states."""
    s = shape(cfg)
    p = _prefix(weights)
    hidden, heads, hd, inter = s["hidden"], s["heads"], s["head_dim"], s["intermediate"]
    builder = GraphBuilder(weights, p, data)
    const, weight, node, constant = builder.const, builder.weight, builder.node, builder.constant

    def part(name, rows):
        """Rows [start, end) of a weight, transposed for MatMul."""
        array = weights[p + name].astype(np.float32)[rows[0]:rows[1]]
        return constant(name.replace(".", "_"), array.T.copy())

    def linear(x, name, rows=None):
        w = part(name + ".weight", rows) if rows else weight(name + ".weight", transpose=True)
        y = node("MatMul", [x, w])
        if p + name + ".bias" in weights:
            bias = weights[p + name + ".bias"].astype(np.float32)
            y = node("Add", [y, constant(name.replace(".", "_") + "_bias", bias[rows[0]:rows[1]] if rows else bias)])
        return y

    def layer_norm(x, name):
        inputs = [x, weight(name + ".weight")]
        if p + name + ".bias" in weights:
            inputs.append(weight(name + ".bias"))
        return node("LayerNormalization", inputs, axis=-1, epsilon=s["eps"])

    tables = {theta: builder.rope_tables(theta, hd, heads_axis=fused) for theta in sorted(set(s["layer_rope"]))}
    # Windows in layer order (not a set's): the same graph every run.
    biases = {window: builder.attention_bias(False, window) for window in dict.fromkeys(s["layer_window"])}
    heads_shape = const("heads_shape", np.array([0, 0, heads, hd], np.int64))
    merge = const("merge", np.array([0, 0, hidden], np.int64))
    scale = None if fused else const("scale", np.array(1.0 / math.sqrt(hd), np.float32))

    x = layer_norm(node("Gather", [weight("embeddings.tok_embeddings.weight"), "input_ids"]), "embeddings.norm")
    for i in range(s["layers"]):
        lp = f"layers.{i}"
        h = x if i == 0 else layer_norm(x, lp + ".attn_norm")
        rope, bias = tables[s["layer_rope"][i]], biases[s["layer_window"][i]]
        if fused:
            q, k = (node("Reshape", [builder.rope(node("Reshape", [linear(h, lp + ".attn.Wqkv", (j * hidden, (j + 1) * hidden)), heads_shape]),
                                                  rope, hd), merge]) for j in range(2))
            v = linear(h, lp + ".attn.Wqkv", (2 * hidden, 3 * hidden))
            context = builder.fused_attention(q, k, v, heads, heads, hd, 1.0 / math.sqrt(hd), False, s["layer_window"][i], bias)
        else:
            q, k, v = (node("Transpose", [node("Reshape", [linear(h, lp + ".attn.Wqkv", (j * hidden, (j + 1) * hidden)), heads_shape])],
                            perm=[0, 2, 1, 3]) for j in range(3))
            q, k = builder.rope(q, rope, hd), builder.rope(k, rope, hd)
            scores = node("Add", [node("Mul", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), bias])
            context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
            context = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]), merge])
        x = node("Add", [x, linear(context, lp + ".attn.Wo")])
        h = layer_norm(x, lp + ".mlp_norm")
        value, gate = linear(h, lp + ".mlp.Wi", (0, inter)), linear(h, lp + ".mlp.Wi", (inter, 2 * inter))
        activated = builder.gelu(value, exact=s["exact_gelu"])
        x = node("Add", [x, linear(node("Mul", [activated, gate]), lp + ".mlp.Wo")])
    builder.nodes.append(helper.make_node("Identity", [layer_norm(x, "final_norm")], ["last_hidden_state"]))
    return builder.model("modernbert", "last_hidden_state", ["batch", "sequence", hidden], OPSET)


def numpy_forward(weights, cfg, ids):
    """One unpadded sequence's last_hidden_state [S, H], float64."""
    s = shape(cfg)
    p = _prefix(weights)
    w = lambda name: weights[p + name].astype(np.float64)
    hidden, heads, hd, inter = s["hidden"], s["heads"], s["head_dim"], s["intermediate"]

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        y = (x - mu) / np.sqrt(var + s["eps"]) * w(name + ".weight")
        return y + w(name + ".bias") if p + name + ".bias" in weights else y

    def lin(x, name):
        y = x @ w(name + ".weight").T
        return y + w(name + ".bias") if p + name + ".bias" in weights else y

    n = len(ids)
    x = ln(weights[p + "embeddings.tok_embeddings.weight"][np.asarray(ids)].astype(np.float64), "embeddings.norm")
    for i in range(s["layers"]):
        lp = f"layers.{i}"
        h = x if i == 0 else ln(x, lp + ".attn_norm")
        qkv = lin(h, lp + ".attn.Wqkv").reshape(n, 3, heads, hd)
        q, k, v = (qkv[:, j].transpose(1, 0, 2) for j in range(3))
        theta = s["layer_rope"][i]
        q, k = numpy_rope(q, theta), numpy_rope(k, theta)
        context = numpy_attention(q, k, v, numpy_allowed(n, False, s["layer_window"][i]), 1.0 / math.sqrt(hd))
        x = x + lin(context.transpose(1, 0, 2).reshape(n, hidden), lp + ".attn.Wo")
        value_gate = lin(ln(x, lp + ".mlp_norm"), lp + ".mlp.Wi")
        value, gate = value_gate[:, :inter], value_gate[:, inter:]
        activated = gelu_exact(value) if s["exact_gelu"] else gelu_tanh(value)
        x = x + lin(activated * gate, lp + ".mlp.Wo")
    return ln(x, "final_norm")


def prepare_weights(weights, cfg):
    """The checkpoint as it is: this builder reads its own names."""
    return weights, cfg


def check_tokens(cfg):
    """The check texts' truncation (RoPE has no position table to stay within)."""
    return checks.CHECK_TOKENS


check_states = checks.every_state_check(numpy_forward, check_tokens)
