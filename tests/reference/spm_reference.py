"""Independent reference for SentencePiece models, in Python with the
`sentencepiece` package and onnxruntime on the same files eeane serves.

stdin {"mode": "ids", "model": PATH, "convention": "raw"|"fairseq", "max_tokens": N, "texts": [...]}
  -> {"ids": [[...]]}: [bos] + ids[: N - 2] + [eos]. raw: the .model's own ids;
     fairseq: XLM-R's HF numbering (<s>=0 <pad>=1 </s>=2 <unk>=3, pieces + 1),
     as transformers' XLMRobertaTokenizer computes it.
stdin {"mode": "embed", "model": PATH, "onnx": PATH, "max_tokens": N,
       "window": W, "stride": S (optional), "texts": [...]}
  -> {"vectors": [[...]], "token_counts": [...]}: each sequence run alone
     (no padding), the pooled graph's output as it comes; with a window, the
     content is split into windows of W - 2 tokens starting S apart (the last
     reaching the end), and the windows' vectors are averaged and renormalized.
"""
import json
import sys

import numpy as np
import sentencepiece as spm


def sequences(sp, convention, text, max_tokens):
    ids = sp.encode(text)
    if convention == "fairseq":
        unk = sp.unk_id()
        return [0] + [3 if i == unk else i + 1 for i in ids[: max_tokens - 2]] + [2]
    return [sp.bos_id()] + ids[: max_tokens - 2] + [sp.eos_id()]


def windows(content, per, stride):
    out, start = [], 0
    while True:
        end = min(start + per, len(content))
        out.append(content[start:end])
        if end >= len(content):
            return out
        start += stride


def main():
    req = json.load(sys.stdin)
    sp = spm.SentencePieceProcessor(model_file=req["model"])
    if req["mode"] == "ids":
        ids = [sequences(sp, req["convention"], t, req["max_tokens"]) for t in req["texts"]]
        json.dump({"ids": ids}, sys.stdout)
        return
    import onnxruntime as ort

    sess = ort.InferenceSession(req["onnx"], providers=["CPUExecutionProvider"])

    def run(seq):
        ids = np.array([seq], np.int64)
        return sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0].astype(np.float64)

    vectors, counts = [], []
    for text in req["texts"]:
        if req.get("window"):
            content = sp.encode(text)
            seqs = [[sp.bos_id()] + w + [sp.eos_id()] for w in windows(content, req["window"] - 2, req["stride"])]
            v = np.mean([run(s) for s in seqs], axis=0)
            v /= np.linalg.norm(v)
        else:
            seqs = [sequences(sp, "raw", text, req["max_tokens"])]
            v = run(seqs[0])
        vectors.append(v.tolist())
        counts.append(sum(len(s) for s in seqs))
    json.dump({"vectors": vectors, "token_counts": counts}, sys.stdout)


if __name__ == "__main__":
    main()
