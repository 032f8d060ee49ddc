"""The few helpers every graph builder here uses (families/*.py): the
checkpoint's weights, read one tensor at a time from its safetensors (one
file, or the shards an index names: `open_checkpoint`); initializers from
them, written as they are made to an external data file when the graph is
too large for one protobuf (`ExternalData`, `build_into`); nodes named by their op and a counter (so that a graph
built twice is the same); and the parts the rotary families share: RoPE
tables and the attention bias of full, causal and sliding-window layers.
Each has its float64 numpy twin (`numpy_*`) for the reference networks."""
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MICROSOFT = "com.microsoft"
# The model property listing the nodes an fp16 copy keeps in fp32.
FP32_NODES_KEY = "eeane_fp32_nodes"
# ONNX Runtime's own operators that it registers in ONNX's domain.
RUNTIME_ONNX_DOMAIN_OPS = ("SimplifiedLayerNormalization",)

# safetensors' dtypes as numpy reads them; BF16 is read as uint16 and widened
# to float32 (exactly: bfloat16 is float32's upper half).
SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


def safetensors_header(path):
    """A safetensors file's header: {name: {"dtype", "shape", "data_offsets"}}
    (offsets from the end of the header) and the data's start in the file. The
    file is an 8-byte little-endian header length, the JSON header, the data."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if size > 100 << 20:
            raise SystemExit(f"{path}: a safetensors header of {size} bytes; the file is not safetensors")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


class Checkpoint(Mapping):
    """A checkpoint's tensors by name, each read from its file when asked for
    (and not kept), so that a graph builder or a reference network holds one
    tensor at a time, never the whole model. Reads plain file bytes (no
    memory map, whose pages would stay in the process's resident set)."""

    def __init__(self, files):
        self.files = [Path(f) for f in files]
        self.where = {}
        for path in self.files:
            header, start = safetensors_header(path)
            for name, info in header.items():
                if info["dtype"] not in SAFETENSORS_DTYPES:
                    raise SystemExit(f"{path.name}: tensor {name} is {info['dtype']}, which eeane does not read")
                begin, end = info["data_offsets"]
                self.where[name] = (path, info["dtype"], tuple(info["shape"]), start + begin, end - begin)

    def __getitem__(self, name):
        path, dtype, shape, offset, length = self.where[name]
        with open(path, "rb") as f:
            f.seek(offset)
            count = int(np.prod(shape, dtype=np.int64))
            array = np.fromfile(f, dtype=SAFETENSORS_DTYPES[dtype], count=count)
        if array.nbytes != length:
            raise SystemExit(f"{path.name}: tensor {name} holds {array.nbytes} of its {length} bytes; the file is truncated")
        if dtype == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array.reshape(shape)

    def __iter__(self):
        return iter(self.where)

    def __len__(self):
        return len(self.where)

    def __contains__(self, name):
        return name in self.where

    def shape(self, name):
        return self.where[name][2]

    def parameters(self):
        """How many numbers the checkpoint holds (the sum of its tensors' shape products)."""
        return sum(int(np.prod(shape, dtype=np.int64)) for _, _, shape, _, _ in self.where.values())


def checkpoint_files(folder):
    """The safetensors files of a checkpoint folder: model.safetensors, else
    every shard model.safetensors.index.json names (as transformers looks
    for them)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise SystemExit(f"{folder} has neither model.safetensors nor model.safetensors.index.json")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise SystemExit(f"{index.name} names {', '.join(missing)}, which {folder} does not hold")
    return [folder / s for s in shards]


def open_checkpoint(folder):
    """The one loader of every builder: the checkpoint in `folder` (one file
    or its shards), read lazily. A tensor the index maps to a shard that does
    not hold it is refused."""
    folder = Path(folder)
    checkpoint = Checkpoint(checkpoint_files(folder))
    index = folder / "model.safetensors.index.json"
    if not (folder / "model.safetensors").is_file() and index.is_file():
        for name, shard in json.loads(index.read_text())["weight_map"].items():
            if checkpoint.where.get(name, (None,))[0] != folder / shard:
                raise SystemExit(f"{index.name} maps {name} to {shard}, which does not hold it")
    return checkpoint


class Renamed(Mapping):
    """`base` under other names, still read lazily: `names` maps a new name to
    the base's, `computed` a new name to a function that makes the tensor
    (a slice of a base tensor, a constant row)."""

    def __init__(self, base, names, computed=None):
        self.base, self.names, self.computed = base, dict(names), dict(computed or {})

    def __getitem__(self, name):
        if name in self.computed:
            return self.computed[name]()
        return self.base[self.names[name]]

    def __iter__(self):
        yield from self.names
        yield from (k for k in self.computed if k not in self.names)

    def __len__(self):
        return len(set(self.names) | set(self.computed))

    def __contains__(self, name):
        return name in self.names or name in self.computed


class ExternalData:
    """Initializers written to one data file as they are made, each as an
    external TensorProto (location, offset, length) that the graph names, so
    that the builder holds the graph's structure and one tensor at a time:
    the form a graph over protobuf's 2 GiB must take. `location` is the data
    file's name relative to the graph, which must sit beside it. Tensors
    under `min_bytes` stay inside the graph; each tensor starts on a
    4096-byte boundary, so that a runtime may map it."""

    ALIGN = 4096

    def __init__(self, path, location=None, min_bytes=1024):
        self.path = Path(path)
        self.location = location or self.path.name
        self.min_bytes = min_bytes
        self.file = open(self.path, "wb")
        self.offset = 0

    def tensor(self, array, name):
        array = np.asarray(array)
        if array.nbytes < self.min_bytes:
            return numpy_helper.from_array(array, name)
        # Little-endian and contiguous, flattened (np.ascontiguousarray would
        # make a 0-d array 1-d: the shape is kept apart).
        flat = np.ascontiguousarray(array.reshape(-1), dtype=array.dtype.newbyteorder("<"))
        pad = -self.offset % self.ALIGN
        self.file.write(b"\0" * pad)
        self.offset += pad
        if flat.nbytes:
            self.file.write(memoryview(flat).cast("B"))
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(self.offset)), ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += array.nbytes
        return tensor

    def close(self):
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


class GraphBuilder:
    """`weights` a mapping of name to array (a `Checkpoint`, a `Renamed`
    view, a dict); with `data` (an `ExternalData`), large initializers go to
    its file as they are made."""

    def __init__(self, weights, prefix="", data=None):
        self.weights = weights
        self.prefix = prefix
        self.data = data
        self.inits, self.nodes = [], []
        self.count = 0
        # Nodes whose results an fp16 copy of the graph must compute in fp32
        # (the RoPE angles: position x frequency reaches hundreds of radians,
        # where fp16 keeps a quarter of a radian).
        self.fp32_nodes = []

    def const(self, name, array):
        array = np.asarray(array)
        self.inits.append(self.data.tensor(array, name) if self.data else numpy_helper.from_array(array, name))
        return name

    def weight(self, name, transpose=False, plus_one=False):
        """The checkpoint's `prefix + name` as float32 (transposed for MatMul;
        plus one for Gemma's norms, which scale by 1 + weight), named `name`."""
        array = self.weights[self.prefix + name].astype(np.float32, copy=False)
        if plus_one:
            array = array + np.float32(1.0)
        return self.const(name, array.T.copy() if transpose else array)

    def node(self, op, inputs, domain=None, outputs=1, **attrs):
        """One node named by its op and a counter; its result (or, with
        `outputs` > 1, the first of its results; the others are named
        `{name}_1`...). `domain` "com.microsoft" for ONNX Runtime's own ops."""
        self.count += 1
        out = f"{op.lower()}_{self.count}"
        names = [out] + [f"{out}_{i}" for i in range(1, outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=out, domain=domain, **attrs))
        return out

    def constant(self, stem, array):
        """An unnamed constant: named by a counter, like nodes."""
        self.count += 1
        return self.const(f"{stem}_{self.count}", array)

    def model(self, name, output, output_shape, opset):
        """The finished model: inputs input_ids and attention_mask (int64 [B, S]),
        `output` (the name of its last node's result, as float32 of
        `output_shape`), checked here unless its weights go to external data
        (checked once saved beside it: build_into)."""
        int_input = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
        graph = helper.make_graph(self.nodes, name, [int_input("input_ids"), int_input("attention_mask")],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)], initializer=self.inits)
        opsets = [helper.make_opsetid("", opset)]
        runtime_ops = has_runtime_ops(graph)
        if any(n.domain == MICROSOFT for n in self.nodes):
            opsets.append(helper.make_opsetid(MICROSOFT, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="eeane-models")
        model.ir_version = 8
        if self.fp32_nodes and runtime_ops:
            helper.set_model_props(model, {FP32_NODES_KEY: ",".join(self.fp32_nodes)})
        # ONNX's checker knows no runtime's own operators: ONNX Runtime
        # loading the graph is the check of those (prepare's checks run it).
        if self.data is None and not runtime_ops:
            onnx.checker.check_model(model)
        return model

    def gelu(self, x, exact):
        """GELU of x: exact, 0.5 x (1 + erf(x / sqrt 2)); or tanh-approximated,
        0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (ONNX's Gelu op needs opset 20)."""
        node, constant = self.node, self.constant
        if exact:
            inner = node("Erf", [node("Div", [x, constant("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
        else:
            cube = node("Mul", [node("Mul", [x, x]), x])
            inner = node("Tanh", [node("Mul", [node("Add", [x, node("Mul", [cube, constant("c", np.array(0.044715, np.float32))])]),
                                               constant("k", np.array(math.sqrt(2.0 / math.pi), np.float32))])])
        return node("Mul", [node("Mul", [x, constant("half", np.array(0.5, np.float32))]),
                            node("Add", [inner, constant("one", np.array(1.0, np.float32))])])

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

    def rope_tables(self, theta, head_dim, heads_axis=False):
        """cos and sin [S, head_dim] of positions 0..S-1 at `theta` (rotate-half
        layout); with `heads_axis`, [S, 1, head_dim], for states laid out
        [B, S, heads, head_dim]. Kept in fp32 by an fp16 copy (`fp32_nodes`)."""
        first = len(self.nodes)
        positions = self.node("Cast", [self.positions()], to=TensorProto.FLOAT)
        freqs = self.node("MatMul", [self.node("Unsqueeze", [positions, self.constant("axis", np.array([1], np.int64))]),
                                     self.constant("inv_freq", inverse_frequencies(theta, head_dim).astype(np.float32).reshape(1, -1))])
        angles = self.node("Concat", [freqs, freqs], axis=-1)
        if heads_axis:
            angles = self.node("Unsqueeze", [angles, self.constant("axis", np.array([1], np.int64))])
        tables = self.node("Cos", [angles]), self.node("Sin", [angles])
        self.fp32_nodes += [n.name for n in self.nodes[first:]]
        return tables

    def rms_norm_op(self, x, weight_name, eps, plus_one=False):
        """RMSNorm as ONNX Runtime's SimplifiedLayerNormalization (its
        sums in fp32 whatever the input's type; the form ONNX Runtime's own
        decoder exports use)."""
        return self.node("SimplifiedLayerNormalization", [x, self.weight(weight_name, plus_one=plus_one)], axis=-1, epsilon=eps,
                         stash_type=1)

    def key_lengths_minus_one(self):
        """GroupQueryAttention's seqlens_k (int32 [B]: each right-padded
        row's real tokens less one) and total_sequence_length (int32 S)."""
        if not hasattr(self, "_gqa_lengths"):
            real = self.node("ReduceSum", ["attention_mask", self.constant("axis", np.array([1], np.int64))], keepdims=0)
            last = self.node("Sub", [real, self.constant("one", np.array(1, np.int64))])
            self._gqa_lengths = (self.node("Cast", [last], to=TensorProto.INT32), self.node("Cast", [self.sequence_length()], to=TensorProto.INT32))
        return self._gqa_lengths

    def fused_attention(self, q, k, v, heads, kv_heads, head_dim, scale, causal, window, bias):
        """One fused attention operator of ONNX Runtime over q [B, S, heads *
        head_dim] and k, v [B, S, kv_heads * head_dim], RoPE already applied;
        returns [B, S, heads * head_dim]. Causal layers (a window `("before",
        w)` or none) run GroupQueryAttention, which takes right-padded rows by
        their lengths and the grouped heads as they are (flash attention on
        the GPU); bidirectional layers run MultiHeadAttention with `bias`
        (`attention_bias`: padding and window), the key and value heads
        repeated for their query groups."""
        if causal:
            if window is not None and window[0] != "before":
                raise SystemExit(f"a causal layer with a {window[0]!r} window has no fused form")
            seqlens, total = self.key_lengths_minus_one()
            attrs = {"local_window_size": int(window[1])} if window is not None else {}
            return self.node("GroupQueryAttention", [q, k, v, "", "", seqlens, total], domain=MICROSOFT, outputs=3,
                             num_heads=heads, kv_num_heads=kv_heads, scale=float(scale), **attrs)
        group = heads // kv_heads
        if group > 1:
            split = self.constant("kv_split", np.array([0, 0, kv_heads, 1, head_dim], np.int64))
            target = self.node("Concat", [self.node("Slice", [self.node("Shape", [k]), self.constant("s0", np.array([0], np.int64)),
                                                              self.constant("s2", np.array([2], np.int64))]),
                                          self.constant("grouped", np.array([kv_heads, group, head_dim], np.int64))], axis=0)
            merged = self.constant("kv_merged", np.array([0, 0, heads * head_dim], np.int64))
            k, v = (self.node("Reshape", [self.node("Expand", [self.node("Reshape", [t, split]), target]), merged]) for t in (k, v))
        return self.node("MultiHeadAttention", [q, k, v, "", "", self.square_bias(bias)], domain=MICROSOFT, num_heads=heads,
                         scale=float(scale))

    def square_bias(self, bias):
        """`bias` ([B, 1, 1, S] where only padding masks keys) as the
        [B, 1, S, S] that MultiHeadAttention's attention_bias must be."""
        if not hasattr(self, "_square"):
            self._square = {}
        if bias not in self._square:
            length = self.node("Unsqueeze", [self.sequence_length(), self.constant("axis", np.array([0], np.int64))])
            shape = self.node("Concat", [self.constant("ones", np.array([1, 1], np.int64)), length, length], axis=0)
            self._square[bias] = self.node("Expand", [bias, shape])
        return self._square[bias]

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


def numpy_attention(q, k, v, allowed, scale):
    """softmax(q k^T * scale) v, per head, float64: q [h, S, d], k and v [h, S, d]."""
    scores = q @ k.transpose(0, 2, 1) * scale
    scores = np.where(allowed, scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_exact(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def has_runtime_ops(graph_or_model):
    """Whether a graph uses ONNX Runtime's own operators, which ONNX's
    checker does not know (ONNX Runtime loading it is their check)."""
    graph = getattr(graph_or_model, "graph", graph_or_model)
    return any(n.domain == MICROSOFT or n.op_type in RUNTIME_ONNX_DOMAIN_OPS for n in graph.node)


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
    folder.mkdir(parents=True, exist_ok=True)
    data = ExternalData(folder / EXTERNAL_DATA) if fp32_bytes >= external_data_min_bytes() else None
    try:
        model = build_graph(weights, cfg, data=data, **options)
    finally:
        if data:
            data.close()
    onnx.save_model(model, folder / "model.onnx")
    if data and not has_runtime_ops(model):
        onnx.checker.check_model(str(folder / "model.onnx"))
    return folder / "model.onnx"
