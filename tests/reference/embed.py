"""Independent reference vectors: onnxruntime + HF tokenizers on the same ONNX
file eeane serves, each text run alone (no padding), mask-mean pooled and
L2-normalized in numpy.

stdin:  {"model_dir": ..., "max_tokens": 256, "texts": [...]}
stdout: {"vectors": [[...]], "content_ids": [[...]], "token_counts": [...]}
"""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


def main():
    request = json.load(sys.stdin)
    model_dir = Path(request["model_dir"])
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(request["max_tokens"])
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    takes_types = any(i.name == "token_type_ids" for i in sess.get_inputs())
    vectors, content_ids, counts = [], [], []
    for text in request["texts"]:
        enc = tok.encode(text)
        ids = np.array([enc.ids], np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if takes_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = sess.run(None, feeds)[0][0].astype(np.float64)
        v = hidden.mean(axis=0)
        vectors.append((v / np.linalg.norm(v)).tolist())
        content_ids.append(tok.encode(text, add_special_tokens=False).ids)
        counts.append(len(enc.ids))
    json.dump({"vectors": vectors, "content_ids": content_ids, "token_counts": counts}, sys.stdout)


if __name__ == "__main__":
    main()
