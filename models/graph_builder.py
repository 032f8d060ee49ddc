"""The few helpers every graph builder here uses (`bert_onnx.py`,
`decoder_onnx.py`, `modernbert_onnx.py`): initializers from a checkpoint's
weights, nodes named by their op and a counter (so that a graph built twice
is the same), and the parts the rotary families share: RoPE tables and the
attention bias of full, causal and sliding-window layers. Each has its
float64 numpy twin (`numpy_*`) for the reference networks."""
import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    def __init__(self, weights, prefix=""):
        self.weights = weights
        self.prefix = prefix
        self.inits, self.nodes = [], []
        self.count = 0

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name, transpose=False, plus_one=False):
        """The checkpoint's `prefix + name` as float32 (transposed for MatMul;
        plus one for Gemma's norms, which scale by 1 + weight), named `name`."""
        array = self.weights[self.prefix + name].astype(np.float32)
        if plus_one:
            array = array + np.float32(1.0)
        return self.const(name, array.T.copy() if transpose else array)

    def node(self, op, inputs, **attrs):
        self.count += 1
        out = f"{op.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def constant(self, stem, array):
        """An unnamed constant: named by a counter, like nodes."""
        self.count += 1
        return self.const(f"{stem}_{self.count}", array)

    def sequence_length(self):
        """S of input_ids [B, S], as an int64 scalar (one node per graph)."""
        if not hasattr(self, "_seq"):
            self._seq = self.node("Gather", [self.node("Shape", ["input_ids"]), self.constant("one", np.array(1, np.int64))], axis=0)
        return self._seq

    def positions(self):
        """0..S-1 (int64)."""
        if not hasattr(self, "_positions"):
            self._positions = self.node("Range", [self.constant("zero", np.array(0, np.int64)), self.sequence_length(),
                                                  self.constant("one", np.array(1, np.int64))])
        return self._positions

    def rope_tables(self, theta, head_dim):
        """cos and sin [S, head_dim] of positions 0..S-1 at `theta` (rotate-half layout)."""
        positions = self.node("Cast", [self.positions()], to=TensorProto.FLOAT)
        freqs = self.node("MatMul", [self.node("Unsqueeze", [positions, self.constant("axis", np.array([1], np.int64))]),
                                     self.constant("inv_freq", inverse_frequencies(theta, head_dim).astype(np.float32).reshape(1, -1))])
        angles = self.node("Concat", [freqs, freqs], axis=-1)
        return self.node("Cos", [angles]), self.node("Sin", [angles])

    def rope(self, x, tables, head_dim):
        """RoPE on x [..., S, head_dim]: x * cos + rotate_half(x) * sin."""
        cos, sin = tables
        half = head_dim // 2
        axis = self.constant("last_axis", np.array([-1], np.int64))
        x1 = self.node("Slice", [x, self.constant("h0", np.array([0], np.int64)), self.constant("h1", np.array([half], np.int64)), axis])
        x2 = self.node("Slice", [x, self.constant("h2", np.array([half], np.int64)), self.constant("h3", np.array([head_dim], np.int64)), axis])
        rotated = self.node("Concat", [self.node("Neg", [x2]), x1], axis=-1)
        return self.node("Add", [self.node("Mul", [x, cos]), self.node("Mul", [rotated, sin])])

    def attention_bias(self, causal, window=None):
        """The additive bias [B, 1, S, S]: 0 where a query may attend a key,
        float32 min elsewhere. A key is allowed when it is a real token, and,
        per `window` (see `allowed_keys`), near enough; when `causal`, only at
        or before the query. Every row keeps some finite entry, so softmax
        never divides by zero, even for padded query rows."""
        rows = self.node("Unsqueeze", [self.positions(), self.constant("axis", np.array([1], np.int64))])
        cols = self.node("Unsqueeze", [self.positions(), self.constant("axis", np.array([0], np.int64))])
        distance = self.node("Sub", [cols, rows])  # key - query
        allowed = None

        def both(a, b):
            return b if a is None else self.node("And", [a, b])

        if causal:
            allowed = both(allowed, self.node("Not", [self.node("Greater", [distance, self.constant("zero", np.array(0, np.int64))])]))
        if window is not None:
            kind, size = window
            if kind == "before":  # q - size < k (with causal: the last `size` keys)
                allowed = both(allowed, self.node("Greater", [distance, self.constant("neg_window", np.array(-size, np.int64))]))
            else:  # "within": |k - q| <= size
                allowed = both(allowed, self.node("Not", [self.node("Greater", [self.node("Abs", [distance]),
                                                                                  self.constant("window", np.array(size, np.int64))])]))
        real = self.node("Cast", [self.node("Unsqueeze", ["attention_mask", self.constant("axes", np.array([1, 2], np.int64))])],
                         to=TensorProto.BOOL)
        allowed = both(allowed, real)
        return self.node("Where", [allowed, self.constant("zero_f", np.array(0.0, np.float32)),
                                   self.constant("mask_min", np.array(np.finfo(np.float32).min, np.float32))])


def inverse_frequencies(theta, head_dim):
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def numpy_rope(t, theta):
    """RoPE on t [heads, S, d] in float64."""
    n, d = t.shape[-2], t.shape[-1]
    angles = np.arange(n, dtype=np.float64)[:, None] * inverse_frequencies(theta, d)[None, :]
    angles = np.concatenate([angles, angles], -1)
    rotated = np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1)
    return t * np.cos(angles) + rotated * np.sin(angles)


def numpy_allowed(n, causal, window=None):
    """[S, S] booleans, query by key, as `GraphBuilder.attention_bias` for one unpadded sequence."""
    distance = np.arange(n)[None, :] - np.arange(n)[:, None]
    allowed = np.ones((n, n), bool)
    if causal:
        allowed &= distance <= 0
    if window is not None:
        kind, size = window
        allowed &= distance > -size if kind == "before" else np.abs(distance) <= size
    return allowed


def numpy_attention(q, k, v, allowed, scale, softcap=None):
    """softmax(q k^T * scale) v, per head, float64: q [h, S, d], k and v [h, S, d]."""
    scores = q @ k.transpose(0, 2, 1) * scale
    if softcap:
        scores = np.tanh(scores / softcap) * softcap
    scores = np.where(allowed, scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
