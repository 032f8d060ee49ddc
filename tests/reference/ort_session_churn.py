"""ONNX Runtime's own memory per session created and destroyed, without eeane:
what a model loaded and unloaded on a thread of the server (isolation =
"thread") leaves in its heap; in an engine process it ends with the process.

    ~/.cache/eeane/venv/bin/python tests/reference/ort_session_churn.py [MODEL.onnx] [CYCLES] [VARIANT]

Prints the process's anonymous RSS (KiB) after 0, 10, 20, 50, 100, 200 and
CYCLES cycles of: create a session, run one small batch, destroy it, gc,
malloc_trim; then the growth per session after the first 20. glibc is tuned
as eeane tunes it (two arenas, a fixed 128 KiB mmap threshold). VARIANT:
"default" (2 intra-op threads), "one-thread", "no-arena" (CPU memory arena
off), "basic-opt" (basic graph optimization).
"""
import ctypes
import gc
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

M_ARENA_MAX, M_MMAP_THRESHOLD = -8, -3


def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1])


def options_for(variant):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1 if variant in ("one-thread", "no-arena", "basic-opt") else 2
    if variant == "no-arena":
        options.enable_cpu_mem_arena = False
    if variant == "basic-opt":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return options


def main():
    model = (sys.argv[1] if len(sys.argv) > 1 else "") or str(Path.home() / ".cache/eeane/models/all-minilm-l6-v2/model.onnx")
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    variant = sys.argv[3] if len(sys.argv) > 3 else "default"
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_ARENA_MAX, 2)
    libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    ids = np.ones((2, 16), np.int64)
    after_20 = None
    for i in range(cycles + 1):
        session = ort.InferenceSession(model, options_for(variant), providers=["CPUExecutionProvider"])
        session.run(None, {"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)})
        del session
        gc.collect()
        libc.malloc_trim(0)
        if i == 20:
            after_20 = anon_kib()
        if i in (0, 10, 20, 50, 100, 200, cycles):
            print(f"after {i} sessions: RssAnon {anon_kib()} KiB", flush=True)
    if cycles > 20:
        print(f"{variant}: {(anon_kib() - after_20) / (cycles - 20):.2f} KiB per session after the first 20")


if __name__ == "__main__":
    main()
