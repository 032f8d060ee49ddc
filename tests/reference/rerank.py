"""Independent reference scores for a cross-encoder: HF tokenizers' pair
encoding (truncation "only_second": the query whole, the document cut) and
onnxruntime on the same ONNX file eeane serves, each pair run alone.

stdin:  {"model_dir": ..., "max_tokens": 256, "query": "...", "documents": [...]}
stdout: {"logits": [...], "token_counts": [...]}
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
    tok.enable_truncation(request["max_tokens"], strategy="only_second")
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, counts = [], []
    for document in request["documents"]:
        enc = tok.encode(request["query"], document)
        feed = {"input_ids": np.array([enc.ids], np.int64), "attention_mask": np.array([enc.attention_mask], np.int64),
                "token_type_ids": np.array([enc.type_ids], np.int64)}
        logits.append(float(sess.run(None, feed)[0][0, 0]))
        counts.append(len(enc.ids))
    json.dump({"logits": logits, "token_counts": counts}, sys.stdout)


if __name__ == "__main__":
    main()
