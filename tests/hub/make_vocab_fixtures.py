#!/usr/bin/env python3
"""Makes the fixtures of repositories without tokenizer.json once, with
torch, transformers and sentence-transformers (not in CI: the fixtures are
committed, kilobytes each).

- roberta-vocab-tiny: microsoft/unixcoder-base's shape: a tiny random
  RobertaModel (2 layers, hidden 64) whose weights are only pytorch_model.bin
  and whose tokenizer is only vocab.json + merges.txt (byte-level BPE trained on
  tests/fixtures/texts.json) and tokenizer_config.json naming
  RobertaTokenizer; no modules.json, so sentence-transformers pools by mean
  and does not normalize.
- bert-vocab-tiny: a tiny random BertModel whose tokenizer is only vocab.txt
  (WordPiece) with do_lower_case in tokenizer_config.json.
- xlmr-spm-tiny: a tiny random XLMRobertaModel whose tokenizer is only
  sentencepiece.bpe.model (a unigram model trained by the sentencepiece
  package on the texts, numbered as XLM-R's: <unk> 0, <s> 1, </s> 2).

Beside each, reference.json: transformers' own token ids for the texts
(AutoTokenizer builds its tokenizer from the same files) and
sentence-transformers' vectors, one text at a time and as one batch.

    python3 tests/hub/make_vocab_fixtures.py OUT_DIR [NAME ...]
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from tokenizers import ByteLevelBPETokenizer, BertWordPieceTokenizer
from transformers import AutoTokenizer, BertConfig, BertModel, RobertaConfig, RobertaModel, XLMRobertaConfig, XLMRobertaModel

HERE = Path(__file__).resolve().parent
TEXTS = json.loads((HERE.parent / "fixtures" / "texts.json").read_text())


def roberta(out):
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 4, vocab_size=512, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(out))  # vocab.json, merges.txt
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer", "model_max_length": 128}, indent=2))
    config = RobertaConfig(vocab_size=bpe.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=130, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    return RobertaModel(config, add_pooling_layer=False)


def bert(out):
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(TEXTS * 4, vocab_size=512)
    wordpiece.save_model(str(out))  # vocab.txt
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True,
                                                           "model_max_length": 128}, indent=2))
    vocab = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    config = BertConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=128, pad_token_id=0)
    return BertModel(config, add_pooling_layer=False)


def xlmr(out):
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS * 4), model_writer=model, vocab_size=400, model_type="unigram",
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0, hard_vocab_limit=False)
    (out / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 128}, indent=2))
    pieces = spm.SentencePieceProcessor(model_proto=model.getvalue()).get_piece_size()
    # fairseq's numbering: 4 specials, the pieces from the fourth on, <mask>.
    config = XLMRobertaConfig(vocab_size=pieces + 2, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=130, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    return XLMRobertaModel(config, add_pooling_layer=False)


def fixture(name, make, out):
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(20261204)
    model = make(out).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        for n, p in model.named_parameters():
            if n.endswith("LayerNorm.weight"):
                p.add_(1.0)
    if name == "roberta-vocab":
        # microsoft/unixcoder-base's shape: weights in pytorch_model.bin only.
        # transformers 5 writes safetensors only, so the .bin is written as
        # transformers 4 wrote it: torch.save of the state dict.
        model.config.save_pretrained(out)
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    else:
        model.save_pretrained(out, safe_serialization=True)
    assert not (out / "tokenizer.json").exists()
    tok = AutoTokenizer.from_pretrained(str(out))
    texts = TEXTS[:20] + ["a", "x " * 200, "Ünïcödé ÀÉÎ façade naïve", "UPPER lower MiXeD <mask> [MASK]"]
    ids = [tok(t, truncation=True, max_length=128)["input_ids"] for t in texts]
    st = SentenceTransformer(str(out), device="cpu")
    st.max_seq_length = 128
    assert not (out / "tokenizer.json").exists()
    one = [st.encode([t], convert_to_numpy=True)[0] for t in texts]
    batch = st.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    agree = min(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(one, batch))
    print(f"{name}: {type(tok).__name__}, {sum(p.numel() for p in model.parameters())} parameters; one vs batch min cosine {agree:.8f}")
    (out / "reference.json").write_text(json.dumps({
        "texts": texts, "max_tokens": 128, "ids": ids,
        "vectors": [v.tolist() for v in one], "batch": batch.tolist(),
        "made_by": f"sentence-transformers {__import__('sentence_transformers').__version__}, transformers "
                   f"{__import__('transformers').__version__}, torch {torch.__version__}",
    }))


def main():
    out = Path(sys.argv[1])
    only = set(sys.argv[2:])
    if only:
        for name, make in (("roberta-vocab", roberta), ("bert-vocab", bert), ("xlmr-spm", xlmr)):
            if name in only:
                fixture(name, make, out / f"{name}-tiny")
        return
    fixture("roberta-vocab", roberta, out / "roberta-vocab-tiny")
    fixture("bert-vocab", bert, out / "bert-vocab-tiny")
    fixture("xlmr-spm", xlmr, out / "xlmr-spm-tiny")


if __name__ == "__main__":
    main()
