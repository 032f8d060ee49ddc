#!/usr/bin/env python3
"""Reference vectors for a Hub snapshot, computed without eeane's converter:
a float64 numpy encoder written here from transformers' definitions of BERT,
RoBERTa, XLM-RoBERTa and DistilBERT (their own weight names, position
numbering and classification heads) on the repository's own
model.safetensors, or Python onnxruntime on the repository's own
onnx/model.onnx; then the pooling and normalization the repository's
sentence-transformers files declare, read here independently of eeane.

    reference.py SNAPSHOT_DIR < '{"texts": [...], "max_tokens": N}'  ->  {"vectors": [[...], ...]}
    reference.py SNAPSHOT_DIR < '{"query": Q, "documents": [...]}'  ->  {"logits": [...]}  (a cross-encoder)
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ERF = np.vectorize(math.erf)


class Encoder:
    """One unpadded sequence at a time, float64, as transformers computes it."""

    def __init__(self, snapshot):
        from safetensors.numpy import load_file

        self.cfg = json.loads((snapshot / "config.json").read_text())
        self.kind = self.cfg["model_type"]
        weights = load_file(snapshot / "model.safetensors")
        base = {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta.", "camembert": "roberta.", "distilbert": "distilbert."}[self.kind]
        self.base = base if any(k.startswith(base) for k in weights) else ""
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}

    def p(self, name):
        return self.w[self.base + name]

    def ln(self, x, prefix, eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * self.p(prefix + ".weight") + self.p(prefix + ".bias")

    def lin(self, x, prefix, absolute=False):
        w = self.w if absolute else {prefix + s: self.p(prefix + s) for s in (".weight", ".bias")}
        return x @ w[prefix + ".weight"].T + w[prefix + ".bias"]

    def attention(self, x, heads, q, k, v):
        seq, hidden = x.shape
        d = hidden // heads
        split = lambda t: t.reshape(seq, heads, d).transpose(1, 0, 2)
        q, k, v = split(self.lin(x, q)), split(self.lin(x, k)), split(self.lin(x, v))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        return ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(seq, hidden)

    def hidden(self, ids, type_ids=None):
        ids = np.asarray(ids)
        cfg = self.cfg
        gelu = lambda h: 0.5 * h * (1 + ERF(h / math.sqrt(2)))
        if self.kind == "distilbert":
            eps = 1e-12
            x = self.p("embeddings.word_embeddings.weight")[ids] + self.p("embeddings.position_embeddings.weight")[np.arange(len(ids))]
            x = self.ln(x, "embeddings.LayerNorm", eps)
            for i in range(cfg["n_layers"]):
                lp = f"transformer.layer.{i}"
                ctx = self.attention(x, cfg["n_heads"], lp + ".attention.q_lin", lp + ".attention.k_lin", lp + ".attention.v_lin")
                x = self.ln(self.lin(ctx, lp + ".attention.out_lin") + x, lp + ".sa_layer_norm", eps)
                x = self.ln(self.lin(gelu(self.lin(x, lp + ".ffn.lin1")), lp + ".ffn.lin2") + x, lp + ".output_layer_norm", eps)
            return x
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        if self.kind == "bert":
            positions = np.arange(len(ids))
        else:
            # create_position_ids_from_input_ids: numbered from padding_idx + 1, pads keep padding_idx.
            pad = int(cfg.get("pad_token_id", 1))
            mask = (ids != pad).astype(np.int64)
            positions = np.cumsum(mask) * mask + pad
        type_ids = np.zeros_like(ids) if type_ids is None else np.asarray(type_ids)
        x = (self.p("embeddings.word_embeddings.weight")[ids] + self.p("embeddings.position_embeddings.weight")[positions]
             + self.p("embeddings.token_type_embeddings.weight")[type_ids])
        x = self.ln(x, "embeddings.LayerNorm", eps)
        for i in range(cfg["num_hidden_layers"]):
            lp = f"encoder.layer.{i}"
            ctx = self.attention(x, cfg["num_attention_heads"], *(f"{lp}.attention.self.{n}" for n in ("query", "key", "value")))
            x = self.ln(self.lin(ctx, lp + ".attention.output.dense") + x, lp + ".attention.output.LayerNorm", eps)
            x = self.ln(self.lin(gelu(self.lin(x, lp + ".intermediate.dense")), lp + ".output.dense") + x, lp + ".output.LayerNorm", eps)
        return x

    def logit(self, ids, type_ids):
        """The one-label head of *ForSequenceClassification on the first token."""
        first = self.hidden(ids, type_ids)[0]
        if self.kind == "bert":
            pooled = np.tanh(self.lin(first, "pooler.dense"))
            return float(self.lin(pooled, "classifier", absolute=True)[0])
        if self.kind == "distilbert":
            pooled = np.maximum(self.lin(first, "pre_classifier", absolute=True), 0)
            return float(self.lin(pooled, "classifier", absolute=True)[0])
        pooled = np.tanh(self.lin(first, "classifier.dense", absolute=True))
        return float(self.lin(pooled, "classifier.out_proj", absolute=True)[0])


def logits(snapshot, request):
    encoder = Encoder(snapshot)
    tok = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(512, strategy="only_second")
    out = []
    for document in request["documents"]:
        enc = tok.encode(request["query"], document)
        out.append(encoder.logit(enc.ids, enc.type_ids if encoder.kind == "bert" else None))
    return out


# sentence-transformers' Dense activations by their torch class, in float64.
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": np.tanh,
    "torch.nn.modules.activation.ReLU": lambda x: np.maximum(x, 0.0),
    "torch.nn.modules.activation.Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "torch.nn.modules.activation.GELU": lambda x: 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0))),
}


def dense_module(folder):
    """A Dense module as sentence-transformers runs it: linear (weight
    [out, in], optional bias) then the activation its config names."""
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    weights = load_file(folder / "model.safetensors")
    bias = weights["linear.bias"].astype(np.float64) if cfg.get("bias", True) else None
    return weights["linear.weight"].astype(np.float64), bias, ACTIVATIONS[cfg.get("activation_function", "torch.nn.modules.activation.Tanh")]


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
    dense = [dense_module(snapshot / m["path"]) for m in modules if m["type"].endswith("Dense")]
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
        hidden = Encoder(snapshot).hidden

    vectors = []
    for text in request["texts"]:
        h = hidden(tok.encode(text).ids)
        v = {"cls": h[0], "cls_token": h[0], "mean": h.mean(0), "mean_tokens": h.mean(0), "max_tokens": h.max(0), "max": h.max(0),
             "lasttoken": h[-1], "mean_sqrt_len_tokens": h.sum(0) / np.sqrt(len(h))}[mode]
        for weight, bias, activation in dense:
            v = activation(weight @ v + (bias if bias is not None else 0.0))
        if normalize:
            v = v / np.linalg.norm(v)
        vectors.append(v.tolist())
    json.dump({"vectors": vectors}, sys.stdout)


if __name__ == "__main__":
    main()
