#!/usr/bin/env python3
"""Reference vectors for a Hub snapshot, computed without eeane's converter:
the float64 numpy network (models/bert_onnx.py numpy_forward) on the
repository's own model.safetensors, or Python onnxruntime on the repository's
own onnx/model.onnx; then the pooling and normalization the repository's
sentence-transformers files declare, read here independently of eeane.

    reference.py SNAPSHOT_DIR < '{"texts": [...], "max_tokens": N}'  ->  {"vectors": [[...], ...]}
    reference.py SNAPSHOT_DIR < '{"query": Q, "documents": [...]}'  ->  {"logits": [...]}  (a cross-encoder)
"""
import json
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))


def logits(snapshot, request):
    """A sequence classifier's logit per (query, document), float64 numpy."""
    import bert_onnx
    from safetensors.numpy import load_file

    weights = load_file(snapshot / "model.safetensors")
    cfg = json.loads((snapshot / "config.json").read_text())
    tok = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(512, strategy="only_second")
    out = []
    for document in request["documents"]:
        enc = tok.encode(request["query"], document)
        out.append(float(bert_onnx.numpy_sequence_logits(weights, cfg, enc.ids, enc.type_ids)[0]))
    return out


def main():
    snapshot = Path(sys.argv[1])
    request = json.load(sys.stdin)
    if "query" in request:
        json.dump({"logits": logits(snapshot, request)}, sys.stdout)
        return
    modules = json.loads((snapshot / "modules.json").read_text())
    pooling_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
    pooling = json.loads((snapshot / pooling_dir / "config.json").read_text())
    mode = pooling.get("pooling_mode") or next(k[len("pooling_mode_"):] for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True)
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    tok = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(request["max_tokens"])
    if (snapshot / "onnx/model.onnx").exists():
        import onnxruntime as ort

        sess = ort.InferenceSession(str(snapshot / "onnx/model.onnx"), providers=["CPUExecutionProvider"])

        def hidden(ids):
            ids = np.asarray([ids], np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            feed = {i.name: feed[i.name] for i in sess.get_inputs()}
            return sess.run(None, feed)[0][0].astype(np.float64)
    else:
        import bert_onnx
        from safetensors.numpy import load_file

        weights = load_file(snapshot / "model.safetensors")
        cfg = json.loads((snapshot / "config.json").read_text())

        def hidden(ids):
            return bert_onnx.numpy_forward(weights, cfg, ids)

    vectors = []
    for text in request["texts"]:
        h = hidden(tok.encode(text).ids)
        v = {"cls": h[0], "cls_token": h[0], "mean": h.mean(0), "mean_tokens": h.mean(0), "max_tokens": h.max(0), "max": h.max(0),
             "lasttoken": h[-1], "mean_sqrt_len_tokens": h.sum(0) / np.sqrt(len(h))}[mode]
        if normalize:
            v = v / np.linalg.norm(v)
        vectors.append(v.tolist())
    json.dump({"vectors": vectors}, sys.stdout)


if __name__ == "__main__":
    main()
