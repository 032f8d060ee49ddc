"""Would OpenVINO on the CPU gain from packing texts side by side into one
row, as the ncnn engine does, instead of padding each to its batch's
longest? Python OpenVINO at bf16, one thread, on cpu_peers.py's model and
corpus; nothing of eeane runs.

From the model's graph (eeane's own all-MiniLM-L6-v2 `model.onnx`, built by
models/families/bert.py) it derives a packed graph: position ids and an additive
attention bias [rows, 1, seq, seq] are inputs, in place of the positions the
graph counts and the bias it makes from the mask. Several texts then share
a row, each with positions from 0 and attending only to itself.

1. Fidelity: texts run alone (the padded graph, one text a call) against the
   same texts packed, mean-pooled per text: the least cosine.
2. Cost: the corpus in order, as pools of N texts (what the batcher has to
   choose from: about 18 with 32 single texts in flight, hundreds in bulk).
   - padded: each pool cut by eeane's length buckets in cpu_peers.py (24,
     40, 64, 96, 160, 256 tokens), each run padded to its longest rounded up
     to 16, at most 32 rows; one call a run.
   - packed: each pool's texts, longest first, into rows of at most P tokens
     or the pool's longest text (first fit), rows padded to the fullest
     rounded up to 16; one call a pool (at most 32 rows).
   Calls run as they come, so shapes change from call to call as in a server.
   Printed: calls, tokens computed, ms, and us a real token; the ratio of
   packed to padded for each pool size.

--unpadded measures another way around padding instead: a graph that runs
the per-token layers (projections, feed-forward, layer norms) on the real
tokens only, gathered from the padded batch by the mask, and scatters them
back to [rows, seq] for each layer's attention and for the output. Its
inputs and outputs are the model's, so eeane can serve it as it is
(`--write-unpadded PATH`, then `cpu_phases.py --graph PATH`). Printed: its
least cosine to the padded graph over the padded calls' texts (mean-pooled
real tokens), and both graphs' time on the same padded calls, in turn.

Usage:
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_packing.py [--pools 18,32,256] [--pack 128,256]
  ~/.cache/eeane/venv/bin/python tests/peer/cpu_packing.py --unpadded [--write-unpadded PATH]
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_peers as peers  # noqa: E402

BUCKETS = (24, 40, 64, 96, 160, 256)
MULTIPLE = 16
MAX_ROWS = 32


def round_up(n):
    return -(-n // MULTIPLE) * MULTIPLE


def packed_graph(path):
    """The model's graph with `position_ids` [B, S] and `attention_bias`
    [B, 1, S, S] as inputs instead of the counted positions and the bias made
    from `attention_mask`."""
    import onnx
    from onnx import TensorProto, helper
    model = onnx.load(str(path))
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    gather_positions = next(n for n in graph.node if n.op_type == "Gather" and n.input[0] == "embeddings.position_embeddings.weight")
    counted = producer[gather_positions.input[1]]
    if counted.op_type != "Range":
        raise SystemExit(f"{path}: positions come from {counted.op_type}, not Range: not a graph this script knows")
    gather_positions.input[1] = "position_ids"
    # The bias: the Unsqueeze that every layer's scores add.
    adds = [n for n in graph.node if n.op_type == "Add" and any(producer.get(i) is not None and producer[i].op_type == "Unsqueeze" for i in n.input)]
    bias = {i for n in adds for i in n.input if producer.get(i) is not None and producer[i].op_type == "Unsqueeze"}
    if len(bias) != 1:
        raise SystemExit(f"{path}: {len(bias)} attention biases found, expected one")
    (bias,) = bias
    for n in adds:
        for k, i in enumerate(n.input):
            if i == bias:
                n.input[k] = "attention_bias"
    # Drop what no longer feeds anything, attention_mask's path and the counted positions.
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    while True:
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for i in [i for i in graph.input if i.name not in used]:
        graph.input.remove(i)
    graph.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]))
    graph.input.append(helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, ["batch", 1, "sequence", "sequence"]))
    return model


def unpadded_graph(path):
    """The model's graph with its per-token layers on the real tokens only:
    the embeddings' output is gathered by the mask into [tokens, hidden];
    each layer's query, key and value projections are scattered back to
    [rows, seq, hidden] before the heads are split (a padded position reads a
    zero row), and the merged heads gathered again; the last layer's output is
    scattered back into `last_hidden_state`. Relies on models/families/bert.py's
    names (`split_heads`, `merge_heads`)."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(path))
    graph = model.graph
    nodes = list(graph.node)
    producer = {o: n for n in nodes for o in n.output}
    splits = [n for n in nodes if n.op_type == "Reshape" and n.input[1] == "split_heads"]
    merges = [n for n in nodes if n.op_type == "Reshape" and n.input[1] == "merge_heads"]
    if not splits or len(splits) != 3 * len(merges):
        raise SystemExit(f"{path}: {len(splits)} head splits and {len(merges)} merges: not a graph this script knows")
    first_projection = producer[producer[splits[0].input[0]].input[0]]
    embeddings = first_projection.input[0]
    hidden = next(i for i in graph.initializer if i.name == first_projection.input[1]).dims[1]
    graph.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), "unpad_flat"),
                              numpy_helper.from_array(np.array([-1, hidden], np.int64), "unpad_token_rows"),
                              numpy_helper.from_array(np.array([hidden], np.int64), "unpad_hidden"),
                              numpy_helper.from_array(np.zeros((1, hidden), np.float32), "unpad_zero_row"),
                              numpy_helper.from_array(np.array(0, np.int64), "unpad_axis_0")])
    added = []

    def node(op, inputs, out, **attrs):
        added.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    mask = node("Reshape", ["attention_mask", "unpad_flat"], "unpad_mask")
    # Where each real token sits in the flat batch, and for each position its
    # token's place in [zero row; tokens] (0 for padding).
    real = node("Reshape", [node("NonZero", [mask], "unpad_nonzero"), "unpad_flat"], "unpad_real")
    place = node("Mul", [node("CumSum", [mask, "unpad_axis_0"], "unpad_cumsum"), mask], "unpad_place")
    padded_shape = node("Concat", [node("Shape", ["input_ids"], "unpad_rows_seq"), "unpad_hidden"], "unpad_padded_shape", axis=0)

    def gather(t):
        return node("Gather", [node("Reshape", [t, "unpad_token_rows"], t + "_flat"), real], t + "_tokens", axis=0)

    def scatter(t, out=None):
        with_zero = node("Concat", ["unpad_zero_row", t], t + "_with_zero", axis=0)
        return node("Reshape", [node("Gather", [with_zero, place], t + "_positions", axis=0), padded_shape], out or t + "_padded")

    def reroute(old, new):
        for n in nodes:
            n.input[:] = [new if i == old else i for i in n.input]

    reroute(embeddings, gather(embeddings))
    for n in splits:
        n.input[0] = scatter(n.input[0])
    for n in merges:
        reroute(n.output[0], gather(n.output[0]))
    last = producer[graph.output[0].name]
    last.output[0] = graph.output[0].name + "_tokens"
    scatter(last.output[0], graph.output[0].name)
    # Topological order: each added node once its inputs exist.
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    ordered, pending = [], nodes + added
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input if i)]
        if not ready:
            raise SystemExit(f"{path}: the unpadded graph has a cycle")
        for n in ready:
            ordered.append(n)
            known.update(n.output)
        pending = [n for n in pending if n not in ready]
    del graph.node[:]
    graph.node.extend(ordered)
    onnx.checker.check_model(model)
    return model


def unpadded_run(args, texts, real):
    """The padded calls of each pool size through the padded and the
    unpadded graph, in turn; the unpadded graph's fidelity on them."""
    import onnx
    import openvino as ov
    model = unpadded_graph(peers.MODEL_DIR / "model.onnx")
    work = Path(args.write_unpadded or Path(os.environ.get("TMPDIR", "/tmp")) / f"eeane-unpadded-{os.getpid()}.onnx")
    onnx.save(model, str(work))
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1}
    requests = []
    for path in (peers.MODEL_DIR / "model.onnx", work):
        graph = core.read_model(str(path))
        graph.reshape({i.get_any_name(): ov.PartialShape([ov.Dimension(1, MAX_ROWS), ov.Dimension(1, 256)]) for i in graph.inputs})
        requests.append(core.compile_model(graph, "CPU", config).create_infer_request())
    if not args.write_unpadded:
        work.unlink()
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    padded, unpadded = requests
    print(f"OpenVINO {ov.__version__} bf16, one thread; {len(texts)} texts, {real} real tokens")
    print("| pool | calls | tokens computed | padded ms | unpadded ms | unpadded / padded | least cosine |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for pool_size in [int(p) for p in args.pools.split(",")]:
        calls = [padded_feed(run, round_up(len(run[-1]))) for run in bucket_runs(texts, pool_size)]
        worst = 1.0
        for feed, mask in calls:
            a, b = padded.infer(feed)[0].copy(), unpadded.infer(feed)[0]
            for r in range(len(mask)):
                n = int(mask[r].sum())
                worst = min(worst, float(mean_pool(a, r, 0, n) @ mean_pool(b, r, 0, n)))
        best = {"padded": float("inf"), "unpadded": float("inf")}
        for _ in range(2):
            for name, request in (("padded", padded), ("unpadded", unpadded)):
                started = time.perf_counter()
                for feed, _ in calls:
                    request.infer(feed)
                best[name] = min(best[name], time.perf_counter() - started)
        tokens = sum(f["input_ids"].size for f, _ in calls)
        print(f"| {pool_size} | {len(calls)} | {tokens} | {best['padded'] * 1e3:.0f} | {best['unpadded'] * 1e3:.0f} | "
              f"{best['unpadded'] / best['padded']:.2f} | {worst:.6f} |", flush=True)


def bucket_runs(texts, pool_size):
    """The corpus as pools of `pool_size` in order, each cut by the length
    buckets into runs sorted by length, of at most MAX_ROWS."""
    runs = []
    for i in range(0, len(texts), pool_size):
        by_bucket = {}
        for t in texts[i:i + pool_size]:
            by_bucket.setdefault(next((b for b in BUCKETS if len(t) <= b), BUCKETS[-1]), []).append(t)
        for run in by_bucket.values():
            run.sort(key=len)
            runs += [run[k:k + MAX_ROWS] for k in range(0, len(run), MAX_ROWS)]
    return runs


def compile_both(max_seq):
    import openvino as ov
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1}
    padded = core.read_model(str(peers.MODEL_DIR / "model.onnx"))
    padded.reshape({i.get_any_name(): ov.PartialShape([ov.Dimension(1, MAX_ROWS), ov.Dimension(1, 256)]) for i in padded.inputs})
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"eeane-packed-{os.getpid()}.onnx"
    import onnx
    onnx.save(packed_graph(peers.MODEL_DIR / "model.onnx"), str(work))
    packed = core.read_model(str(work))
    work.unlink()
    rows, seq = ov.Dimension(1, MAX_ROWS), ov.Dimension(1, max_seq)
    packed.reshape({i.get_any_name(): ov.PartialShape([rows, 1, seq, seq] if i.get_any_name() == "attention_bias" else [rows, seq])
                    for i in packed.inputs})
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    return (core.compile_model(padded, "CPU", config).create_infer_request(),
            core.compile_model(packed, "CPU", config).create_infer_request(), ov.__version__)


def padded_feed(texts_ids, seq):
    rows = len(texts_ids)
    ids = np.zeros((rows, seq), np.int64)
    mask = np.zeros((rows, seq), np.int64)
    for r, t in enumerate(texts_ids):
        ids[r, :len(t)] = t
        mask[r, :len(t)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((rows, seq), np.int64)}, mask


def pack(texts_ids, limit):
    """Texts (longest first) into rows of at most `limit` tokens, or of the
    longest text where that is longer (every row is padded to the fullest),
    first fit. Returns rows as lists of text indices."""
    limit = max(limit, max(len(t) for t in texts_ids))
    rows, fill = [], []
    for i in sorted(range(len(texts_ids)), key=lambda i: -len(texts_ids[i])):
        n = len(texts_ids[i])
        at = next((r for r in range(len(rows)) if fill[r] + n <= limit), None)
        if at is None:
            rows.append([i])
            fill.append(n)
        else:
            rows[at].append(i)
            fill[at] += n
    return rows


def packed_feed(texts_ids, rows):
    seq = round_up(max(sum(len(texts_ids[i]) for i in row) for row in rows))
    ids = np.zeros((len(rows), seq), np.int64)
    positions = np.zeros((len(rows), seq), np.int64)
    bias = np.full((len(rows), 1, seq, seq), np.finfo(np.float32).min, np.float32)
    spans = {}
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = len(texts_ids[i])
            ids[r, at:at + n] = texts_ids[i]
            positions[r, at:at + n] = np.arange(n)
            bias[r, 0, at:at + n, at:at + n] = 0.0
            spans[i] = (r, at, n)
            at += n
        # Padding at a row's end attends to itself only, so that no softmax row is all masked.
        for p in range(at, seq):
            bias[r, 0, p, p] = 0.0
    feed = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "position_ids": positions, "attention_bias": bias}
    return feed, spans, len(rows) * seq


def mean_pool(states, r, start, n):
    v = states[r, start:start + n].mean(axis=0)
    return v / np.linalg.norm(v)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", default="18,32,256", help="texts the batcher chooses from, comma-separated")
    parser.add_argument("--pack", default="128,256", help="most tokens in a packed row, comma-separated")
    parser.add_argument("--texts", type=int, default=1536)
    parser.add_argument("--unpadded", action="store_true", help="measure the unpadded graph against the padded one instead")
    parser.add_argument("--write-unpadded", metavar="PATH", help="with --unpadded: keep the unpadded graph at PATH")
    args = parser.parse_args()
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(peers.MODEL_DIR / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(peers.MAX_TOKENS)
    texts = [e.ids for e in tokenizer.encode_batch(peers.corpus(args.texts))]
    real = sum(len(t) for t in texts)
    if args.unpadded:
        unpadded_run(args, texts, real)
        return
    limits = [int(p) for p in args.pack.split(",")]
    padded, packed, version = compile_both(max(limits + [256]))

    # 1. Fidelity, on the first 32 texts.
    sample = texts[:32]
    alone = []
    for t in sample:
        feed, _ = padded_feed([t], len(t))
        alone.append(mean_pool(padded.infer(feed)[0], 0, 0, len(t)))
    for limit in limits:
        feed, spans, _ = packed_feed(sample, pack(sample, limit))
        states = packed.infer(feed)[0]
        cosines = [float(alone[i] @ mean_pool(states, *spans[i])) for i in range(len(sample))]
        print(f"fidelity, rows of at most {limit} tokens: least cosine of 32 texts packed against each alone {min(cosines):.6f}")

    # 2. Cost, the pools in turn through both graphs.
    print(f"OpenVINO {version} bf16, one thread; {len(texts)} texts, {real} real tokens")
    print("| pool | graph | calls | tokens computed | ms | us a real token | packed / padded |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for pool_size in [int(p) for p in args.pools.split(",")]:
        pools = [texts[i:i + pool_size] for i in range(0, len(texts), pool_size)]
        padded_calls = [padded_feed(run, round_up(len(run[-1])))[0] for run in bucket_runs(texts, pool_size)]
        for limit in limits:
            packed_calls = []
            for pool in pools:
                rows = pack(pool, limit)
                for k in range(0, len(rows), MAX_ROWS):
                    packed_calls.append(packed_feed(pool, rows[k:k + MAX_ROWS]))
            # Warm every shape once, then time both, in turn, best of two passes.
            for feed in padded_calls:
                padded.infer(feed)
            for feed, _, _ in packed_calls:
                packed.infer(feed)
            best_padded = best_packed = float("inf")
            for _ in range(2):
                started = time.perf_counter()
                for feed in padded_calls:
                    padded.infer(feed)
                best_padded = min(best_padded, time.perf_counter() - started)
                started = time.perf_counter()
                for feed, _, _ in packed_calls:
                    packed.infer(feed)
                best_packed = min(best_packed, time.perf_counter() - started)
            padded_tokens = sum(f["input_ids"].size for f in padded_calls)
            packed_tokens = sum(t for _, _, t in packed_calls)
            print(f"| {pool_size} | padded | {len(padded_calls)} | {padded_tokens} | {best_padded * 1e3:.0f} | {best_padded * 1e6 / real:.1f} | |")
            print(f"| {pool_size} | packed, rows of at most {limit} | {len(packed_calls)} | {packed_tokens} | {best_packed * 1e3:.0f} | "
                  f"{best_packed * 1e6 / real:.1f} | {best_packed / best_padded:.2f} |", flush=True)


if __name__ == "__main__":
    main()
