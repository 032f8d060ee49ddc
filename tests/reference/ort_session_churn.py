"""ONNX Runtime's own memory per session created and destroyed, without eeane:
the baseline for eeane's keep_alive=0 soak.

    ~/.cache/eeane/venv/bin/python tests/reference/ort_session_churn.py [MODEL.onnx] [CYCLES]

Prints the process's anonymous RSS (KiB) after 0, 10, 50, 100, 200 and CYCLES
cycles of: create a session, run one small batch, destroy it, gc, malloc_trim.
"""
import ctypes
import gc
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort


def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1])


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache/eeane/models/all-minilm-l6-v2/model.onnx")
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    libc = ctypes.CDLL("libc.so.6")
    ids = np.ones((2, 16), np.int64)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    for i in range(cycles + 1):
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        session.run(None, {"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)})
        del session
        gc.collect()
        libc.malloc_trim(0)
        if i in (0, 10, 50, 100, 200, cycles):
            print(f"after {i} sessions: RssAnon {anon_kib()} KiB", flush=True)


if __name__ == "__main__":
    main()
