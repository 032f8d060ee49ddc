"""MPNet (sentence-transformers' all-mpnet-base-v2 and its kin) as the BERT
graph it is (families/bert.py) with one term more: its relative position
bias, added to every layer's attention scores. Its layers are renamed to
BERT's (`prepare_weights`), its positions numbered as RoBERTa's, and it has
no token types. The bias has no fused pattern for ONNX Runtime's optimizer,
so the GPU graph keeps this attention unfused (families.toml: gpu_graph)."""
import math
from functools import partial

import numpy as np

import checks
from families import bert
from graph_builder import Renamed

MODEL_TYPES = ("mpnet",)
# Why gpu_graph.py leaves this family's attention unfused (the manifest says it).
UNFUSED_ATTENTION = "MPNet's relative position bias"
RELATIVE_BIAS = "encoder.relative_attention_bias.weight"

LAYER_NAMES = {
    "attention.attn.q": "attention.self.query",
    "attention.attn.k": "attention.self.key",
    "attention.attn.v": "attention.self.value",
    "attention.attn.o": "attention.output.dense",
    "attention.LayerNorm": "attention.output.LayerNorm",
}


def relative_position_table(cfg, heads_bias, max_len):
    """MPNet's attention bias for each distance j - i in [-(max_len - 1),
    max_len - 1], [2 * max_len - 1, heads]: the bucket of the distance (half
    the buckets for keys before the query; exact up to a quarter of them, then
    logarithmic up to max_distance 128) looked up in encoder.relative_attention_bias.
    The logarithm is taken in float32 and truncated, as transformers does, so
    that the buckets at the boundaries (distances 16, 32, 64) are the same."""
    buckets = int(cfg.get("relative_attention_num_buckets", 32)) // 2
    max_exact = buckets // 2
    distance = np.arange(-(max_len - 1), max_len, dtype=np.int64)
    n = -distance
    bucket = (n < 0).astype(np.int64) * buckets
    n = np.abs(n)
    # Distances under max_exact take the exact bucket; the log is for the others.
    large = max_exact + (np.log(np.maximum(n, max_exact).astype(np.float32) / np.float32(max_exact)) / np.float32(math.log(128 / max_exact))
                         * np.float32(buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, buckets - 1)
    bucket += np.where(n < max_exact, n, large)
    return np.asarray(heads_bias, np.float32)[bucket]


def prepare_weights(weights, cfg):
    """An MPNet as BERT's names: its q, k, v, o and attention LayerNorm
    renamed, positions numbered from pad_token_id + 1 as RoBERTa's, no token
    types (a zero row), and its relative attention bias kept under its own
    name, which the graph and the numpy network add to every layer's scores.
    The result reads `weights` lazily (graph_builder.Renamed)."""
    kind = cfg.get("model_type")
    if kind not in MODEL_TYPES:
        raise SystemExit(f"model_type {kind!r}: this family's graphs are built for {', '.join(MODEL_TYPES)}")
    names = {}
    for k, old in bert.stripped(weights, "mpnet.").items():
        if k.startswith("encoder.layer."):
            k = bert.bert_layer_name(k, LAYER_NAMES)
        names[k] = old
    offset = int(cfg.get("pad_token_id", 1)) + 1
    hidden = int(cfg["hidden_size"])
    positions = names["embeddings.position_embeddings.weight"]
    computed = {
        "embeddings.position_embeddings.weight": lambda: weights[positions][offset:],
        "embeddings.token_type_embeddings.weight": lambda: np.zeros((1, hidden), np.float32),
    }
    return Renamed(weights, names, computed), {**cfg, "model_type": "bert", "type_vocab_size": 1, "pooler_activation": "tanh",
                                               "max_position_embeddings": int(cfg["max_position_embeddings"]) - offset}


def _graph_bias(weights, cfg, builder, positions, bias):
    """`bias` plus the relative term, [1, heads, S, S]: the table's row for
    each (query i, key j) at j - i + max_len - 1."""
    const, node = builder.const, builder.node
    max_len = int(cfg["max_position_embeddings"])
    table = const("relative_bias_table", relative_position_table(cfg, weights[RELATIVE_BIAS], max_len))
    keys = node("Unsqueeze", [positions, const("axes_0", np.array([0], np.int64))])
    queries = node("Unsqueeze", [positions, const("axes_1_q", np.array([1], np.int64))])
    index = node("Add", [node("Sub", [keys, queries]), const("distance_offset", np.array(max_len - 1, np.int64))])
    relative = node("Unsqueeze", [node("Transpose", [node("Gather", [table, index])], perm=[2, 0, 1]), "axes_0"])
    return node("Add", [bias, relative])


def _numpy_bias(weights, cfg, length):
    """The same term in float64, [heads, S, S], by each key's distance from the query."""
    max_len = int(cfg["max_position_embeddings"])
    table = relative_position_table(cfg, weights[RELATIVE_BIAS], max_len).astype(np.float64)
    at = np.arange(length)
    return table[at[None, :] - at[:, None] + max_len - 1].transpose(2, 0, 1)


def build_graph(weights, cfg, data=None, **options):
    """bert.build_graph with the relative position bias; ONNX Runtime's and
    OpenVINO's graph only (not ncnn's, nor the optimizer's fusable form)."""
    if options.get("ncnn_friendly") or options.get("fusable"):
        raise SystemExit("MPNet's relative attention bias: built for ONNX Runtime and OpenVINO's graph only")
    return bert.build_graph(weights, cfg, data=data, score_bias=partial(_graph_bias, weights, cfg), **options)


def numpy_forward(weights, cfg, ids, type_ids=None):
    """bert.numpy_forward with the relative position bias."""
    return bert.numpy_forward(weights, cfg, ids, type_ids, score_bias=partial(_numpy_bias, weights, cfg))


check_tokens = bert.check_tokens
check_states = checks.mean_state_check(numpy_forward, check_tokens)
