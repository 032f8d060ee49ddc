"""Where the GPU's time goes in ONNX Runtime's CUDA provider, the engine
alone: the fp16 graph eeane serves, on the texts tests/gpu/cuda.sh makes,
in batches of 256 sorted by length (lengths rounded up to --seq-step, 32 by
default), against torch's forward pass on the same batches.

One process a variant, because ONNX Runtime reads its attention switches
(`ORT_DISABLE_*`) from the environment once:
  ort_kernels.py TEXTS.json MODEL_DIR GRAPH [--profile] [--no-torch]
      [--sessions N] [--rows R] [--seq-step S] [--packed] [--sdpa-kernel K]
MODEL_DIR holds tokenizer.json; MODEL_DIR.torch the safetensors torch loads
(tests/gpu/cuda.sh makes both).

It prints JSON: texts/s for one session with inputs and outputs on the
host (as eeane runs it), one session with both on the GPU (IO binding, as
torch_peer.py gives torch its tensors), N sessions (8) on threads of their
own (eeane's x8-thread model without HTTP), and with --profile the kernels
that took the GPU's time, ONNX Runtime's and torch's, recorded by torch's
profiler (CUPTI sees every kernel of the process).

ONNX Runtime's Python package is the onnxruntime-gpu wheel's (PYTHONPATH);
torch is imported first so that its CUDA 13 and cuDNN libraries are the
ones the CUDA provider finds."""
import argparse
import json
import queue
import threading
import time

import numpy as np
import torch  # noqa: F401  (loads CUDA's libraries for the provider)
import onnxruntime as ort
from tokenizers import Tokenizer

from length_batches import length_sorted_batches

parser = argparse.ArgumentParser()
parser.add_argument("texts")
parser.add_argument("model_dir")
parser.add_argument("graph")
parser.add_argument("--sdpa-kernel", type=int, default=0)
parser.add_argument("--rows", type=int, default=256)
parser.add_argument("--sessions", type=int, default=8)
parser.add_argument("--profile", action="store_true")
parser.add_argument("--seq-step", type=int, default=32)
parser.add_argument("--packed", action="store_true", help="the graph in ONNX Runtime's packing mode (RemovePadding, PackedAttention)")
parser.add_argument("--no-torch", action="store_true")
parser.add_argument("--calls", action="store_true", help="what one call costs: host tensors, buffers bound on the GPU, and CUDA graphs per shape")
args = parser.parse_args()

texts = json.load(open(args.texts))
tok = Tokenizer.from_file(f"{args.model_dir}/tokenizer.json")
tok.no_padding()
tok.enable_truncation(256)
encoded = [tok.encode(t).ids for t in texts]
real_tokens = sum(len(e) for e in encoded)


def rounded(ids, mask, step):
    seq = -(-ids.shape[1] // step) * step
    pad = seq - ids.shape[1]
    return np.pad(ids, ((0, 0), (0, pad))), np.pad(mask, ((0, 0), (0, pad)))


batches = [rounded(ids, mask, args.seq_step) for _, ids, mask in length_sorted_batches(encoded, args.rows)]
run_tokens = sum(ids.size for ids, _ in batches)
report = {
    "onnxruntime": ort.__version__,
    "device": torch.cuda.get_device_name(0),
    "rows": args.rows,
    "batches": len(batches),
    "real_tokens_share": real_tokens / run_tokens,
    "sdpa_kernel": args.sdpa_kernel,
    "seq_step": args.seq_step,
    "packed": args.packed,
}
graph = args.graph
if args.packed:
    from onnxruntime.transformers.convert_to_packing_mode import PackingMode
    from onnxruntime.transformers.onnx_model import OnnxModel
    import onnx

    model = OnnxModel(onnx.load(args.graph))
    PackingMode(model).convert(use_symbolic_shape_infer=False)
    graph = "/tmp/packed.fp16.onnx"
    model.save_model_to_file(graph)
    report["packed_ops"] = sorted({n.op_type for n in model.model.graph.node if "Pad" in n.op_type or "Attention" in n.op_type})
cuda_options = {"device_id": 0, "arena_extend_strategy": "kSameAsRequested", "use_tf32": 0}
if args.sdpa_kernel:
    cuda_options["sdpa_kernel"] = str(args.sdpa_kernel)


def session():
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(graph, options, providers=[("CUDAExecutionProvider", cuda_options)])


def feeds(ids, mask):
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def min_row_cosine(a, b):
    """The least cosine between matching rows of two [rows, dim] arrays."""
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def best_of(run, passes=3):
    run()  # every shape once
    best = None
    for _ in range(passes):
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        best = seconds if best is None else min(best, seconds)
    return len(texts) / best


one = session()
report["providers"] = one.get_providers()


def host_pass():
    for ids, mask in batches:
        one.run(None, feeds(ids, mask))


report["one_session_host_texts_per_s"] = best_of(host_pass)

# IO binding: the inputs already on the GPU, the output left there.
bindings = []
for ids, mask in batches:
    binding = one.io_binding()
    for name, array in feeds(ids, mask).items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    binding.bind_output("sentence_embedding", "cuda", 0)
    bindings.append(binding)


def device_pass():
    for binding in bindings:
        one.run_with_iobinding(binding)
    torch.cuda.synchronize()


report["one_session_device_texts_per_s"] = best_of(device_pass)

# Eight sessions on eight threads, batches from one queue (eeane's x8-thread
# layout without tokenizing or HTTP). Each pass runs the batches four times.
many = [one] + [session() for _ in range(args.sessions - 1)]


work = queue.Queue()


def worker(s):
    # One thread a session for the whole run, as eeane's engine threads:
    # ONNX Runtime's CUDA provider keeps per-thread state (handles, plans).
    while True:
        s.run(None, feeds(*work.get()))
        work.task_done()


workers = [threading.Thread(target=worker, args=(s,), daemon=True) for s in many]
for t in workers:
    t.start()


def queue_pass(q, repeat):
    """Every batch `repeat` times through the sessions' queue `q`, until all ran."""
    for _ in range(repeat):
        for b in batches:
            q.put(b)
    q.join()


def threaded_pass(repeat=4):
    queue_pass(work, repeat)


for _ in range(3):
    threaded_pass(len(many))  # every session meets every shape, most likely
report[f"{args.sessions}_sessions_host_texts_per_s"] = best_of(threaded_pass) * 4


if args.calls:
    # What a call costs besides the card's kernels, by how its tensors move:
    #   host:  numpy in, numpy out (ONNX Runtime copies both ways), as eeane runs it;
    #   bound: one set of GPU buffers per shape, filled in place (IO binding);
    #   graph: the same buffers, and a CUDA graph captured per shape
    #          (enable_cuda_graph, gpu_graph_id), replayed with one launch.
    # One session, then N on threads; the process's CPU time a call beside the
    # wall time says how much of a call the host spends launching.
    class Runner:
        def __init__(self, mode):
            self.mode = mode
            options = dict(cuda_options, enable_cuda_graph="1") if mode == "graph" else cuda_options
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads = 1
            self.s = ort.InferenceSession(graph, so, providers=[("CUDAExecutionProvider", options)])
            self.shapes = {}

        def run(self, ids, mask):
            if self.mode == "host":
                return self.s.run(None, feeds(ids, mask))[0]
            if ids.shape not in self.shapes:
                values = {k: ort.OrtValue.ortvalue_from_numpy(v.copy(), "cuda", 0) for k, v in feeds(ids, mask).items()}
                output = self.s.get_outputs()[0]
                shape = [ids.shape[0]] + ([ids.shape[1]] if len(output.shape) == 3 else []) + [output.shape[-1]]
                out = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0)
                binding = self.s.io_binding()
                for k, v in values.items():
                    binding.bind_ortvalue_input(k, v)
                binding.bind_ortvalue_output(output.name, out)
                ro = ort.RunOptions()
                if self.mode == "graph":
                    ro.add_run_config_entry("gpu_graph_id", str(len(self.shapes) + 1))
                self.shapes[ids.shape] = (values, out, binding, ro)
            values, out, binding, ro = self.shapes[ids.shape]
            for k, v in feeds(ids, mask).items():
                values[k].update_inplace(v)
            self.s.run_with_iobinding(binding, ro)
            return out.numpy()

    reference = [one.run(None, feeds(ids, mask))[0] for ids, mask in batches]

    # ONNX Runtime keeps a session's CUDA graphs per thread, and captures on
    # the third run of a shape (two plain runs first) in CUDA's global mode,
    # which fails other threads' synchronous CUDA calls meanwhile: each
    # session warms and captures on the thread that serves it, one session at
    # a time, before any serves.
    capture_lock = threading.Lock()

    def warm(r):
        with capture_lock:
            for _ in range(3):
                got = [r.run(ids, mask).copy() for ids, mask in batches]
        return got

    def measure_calls(mode):
        r0 = Runner(mode)
        got = warm(r0)
        flat = [(a.reshape(len(a), -1), b.reshape(len(b), -1)) for a, b in zip(got, reference)]
        low = min(min_row_cosine(a, b) for a, b in flat)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        one_rate = best_of(lambda: [r0.run(ids, mask) for ids, mask in batches])
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        runners = [Runner(mode) for _ in range(args.sessions)]
        q = queue.Queue()
        ready = threading.Barrier(len(runners) + 1)

        def work(r):
            try:
                warm(r)
            except Exception:
                ready.abort()  # the main thread's wait raises: the mode's error
                raise
            ready.wait()
            while True:
                item = q.get()
                if item is None:
                    q.task_done()
                    return
                r.run(*item)
                q.task_done()

        threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in runners]
        for t in threads:
            t.start()
        ready.wait()

        queue_pass(q, 1)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        many_rate = best_of(lambda: queue_pass(q, 4)) * 4
        many_cpu = time.process_time() - cpu0
        many_wall = time.perf_counter() - wall0
        for _ in threads:
            q.put(None)
        q.join()
        calls_made = 4 * len(batches)  # best_of: a pass to warm, three timed
        return {
            "one_session_texts_per_s": one_rate,
            "one_session_wall_ms_a_call": 1e3 * wall / calls_made,
            "one_session_cpu_ms_a_call": 1e3 * cpu / calls_made,
            f"{args.sessions}_sessions_texts_per_s": many_rate,
            f"{args.sessions}_sessions_cpu_cores": many_cpu / many_wall,
            "min_cosine_to_host": low,
        }

    calls = {}
    for mode in ["host", "bound", "graph"]:
        try:
            calls[mode] = measure_calls(mode)
        except Exception as e:  # e.g. a graph the CUDA provider cannot capture whole
            calls[mode] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    report["calls"] = calls


def kernel_table(prof, wall, label, top=14):
    """The kernels by GPU time, and how much of the wall time some kernel ran."""
    events = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    busy, end = 0.0, None
    for s, e in spans:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    totals = {}
    for e in events:
        name = e.name[:90]
        t, n = totals.get(name, (0.0, 0))
        totals[name] = (t + (e.time_range.end - e.time_range.start), n + 1)
    kernel_us = sum(t for t, _ in totals.values())
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "label": label,
        "kernels": len(events),
        "kernel_ms": kernel_us / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "wall_ms": wall * 1e3,
        "top": [{"kernel": k, "ms": t / 1e3, "calls": n, "share": t / kernel_us} for k, (t, n) in rows],
    }


if args.packed:
    plain = ort.InferenceSession(args.graph, providers=[("CUDAExecutionProvider", cuda_options)])
    low = 1.0
    for ids, mask in batches:
        a = one.run(None, feeds(ids, mask))[0]
        b = plain.run(None, feeds(ids, mask))[0]
        low = min(low, min_row_cosine(a, b))
    report["packed_min_cosine_to_unpacked"] = low

if args.profile:
    from torch.profiler import ProfilerActivity, profile

    tables = []
    for label, run in [("onnxruntime, one session, IO binding", device_pass), (f"onnxruntime, {args.sessions} sessions, host tensors", lambda: threaded_pass(1))]:
        run()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            run()
            torch.cuda.synchronize()
            wall = time.perf_counter() - started
        tables.append(kernel_table(prof, wall, label))

if args.profile and not args.no_torch:
    # torch's forward pass on the same batches, as torch_peer.py runs it.
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    cfg = BertConfig.from_json_file(f"{args.model_dir}.torch/config.json")
    cfg._attn_implementation = "sdpa"
    net = BertModel(cfg, add_pooling_layer=False)
    net.load_state_dict(load_file(f"{args.model_dir}.torch/model.safetensors"), strict=False)
    net = net.cuda().eval().half()
    on_gpu = [(torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()) for ids, mask in batches]

    def torch_pass():
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            for ids, mask in on_gpu:
                hidden = net(input_ids=ids, attention_mask=mask).last_hidden_state.float()
                m = mask.unsqueeze(-1).float()
                torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)
        torch.cuda.synchronize()

    report["torch_same_batches_texts_per_s"] = best_of(torch_pass)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        torch_pass()
        wall = time.perf_counter() - started
    tables.append(kernel_table(prof, wall, "torch fp16 SDPA forward pass"))
report["profiles"] = tables if args.profile else []

print(json.dumps(report, indent=1))
