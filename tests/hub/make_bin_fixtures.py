#!/usr/bin/env python3
"""Makes the PyTorch-checkpoint fixtures once, with torch, transformers and
sentence-transformers (not in CI: the fixtures are committed, kilobytes each).

tests/hub/fixtures/bert-bin-tiny: a tiny random BertForMaskedLM (2 layers,
hidden 64, 4 heads; its decoder tied to the word embeddings, so two tensors
share one storage) with a WordPiece tokenizer trained on
tests/fixtures/texts.json, its weights in pytorch_model.bin only, written as
transformers 4.x's save_pretrained(safe_serialization=False) wrote them:
torch.save of the state dict. (transformers 5 saves safetensors only, and
ignores safe_serialization.) Beside it the files sentence-transformers writes
(mean pooling, Normalize) and reference.json: sentence-transformers' own
vectors, the model loaded from that pytorch_model.bin, one text at a time
and as one padded batch.

tests/hub/fixtures/bert-bin-sharded-tiny: the same weights in two shards
(pytorch_model-00001-of-00002.bin, ...) and pytorch_model.bin.index.json,
split as transformers 4.x split them (huggingface_hub's
split_torch_state_dict_into_shards); sentence-transformers' vectors from it
must equal the first's.

tests/fixtures/torch_bin/: views.bin (torch.save's zip) and
views-legacy.bin (its legacy format, _use_new_zipfile_serialization=False)
of one state dict of views (transposed, sliced with a storage offset,
stepped, expanded with stride 0, sharing one storage), a 0-d and an empty
tensor, a Parameter, and every dtype a typed storage holds (float32,
float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool); and
expected.json, each tensor's dtype, shape and values as torch reads them
(bfloat16 widened to float32, as models/torch_bin.py writes it).

    /tmp/torchvenv/bin/python tests/hub/make_bin_fixtures.py
"""
import collections
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from huggingface_hub import split_torch_state_dict_into_shards
from sentence_transformers import SentenceTransformer, models
from tokenizers import Tokenizer, decoders, models as tok_models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
TEXTS = json.loads((HERE.parent / "fixtures" / "texts.json").read_text())
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece_tokenizer(out):
    """An uncased BERT WordPiece tokenizer: [CLS] A [SEP], token types 0 then 1 for pairs."""
    tok = Tokenizer(tok_models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(TEXTS * 4, trainers.WordPieceTrainer(vocab_size=512, special_tokens=SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                   mask_token="[MASK]", model_max_length=128)
    fast.save_pretrained(out)
    return fast.vocab_size


def vectors(folder, texts):
    st = SentenceTransformer(str(folder), device="cpu")
    one = np.stack([st.encode([t], convert_to_numpy=True)[0] for t in texts])
    batch = st.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    return one, batch


def bert_bin(fixtures):
    out, sharded = fixtures / "bert-bin-tiny", fixtures / "bert-bin-sharded-tiny"
    for folder in (out, sharded):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    torch.manual_seed(20261205)
    vocab = wordpiece_tokenizer(out)
    config = BertConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)
    model = BertForMaskedLM(config).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            # Larger than the default init, so that every layer moves the vectors.
            p.normal_(0.0, 0.2)
            if n.endswith("LayerNorm.weight"):
                p.add_(1.0)
    model.save_pretrained(out)  # config.json (BertForMaskedLM); its model.safetensors is replaced below
    (out / "model.safetensors").unlink()
    state = model.state_dict()
    assert state["cls.predictions.decoder.weight"].data_ptr() == state["bert.embeddings.word_embeddings.weight"].data_ptr()
    torch.save(state, out / "pytorch_model.bin")

    # The sentence-transformers files, written by sentence-transformers itself (in a
    # folder of its own: it saves the encoder as safetensors, which the fixture must not ship).
    with tempfile.TemporaryDirectory() as tmp:
        st = SentenceTransformer(modules=[models.Transformer(str(out), max_seq_length=128), models.Pooling(64, pooling_mode="mean"),
                                          models.Normalize()])
        st.save(tmp)
        for name in ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json",
                     "2_Normalize/config.json"]:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / name, out / name)
    assert not list(out.glob("*.safetensors")), "the fixture must hold PyTorch weights only"

    # The same repository, its weights in two shards as transformers 4.x split them.
    for f in out.rglob("*"):
        if f.is_file() and f.name != "pytorch_model.bin":
            (sharded / f.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, sharded / f.relative_to(out))
    total = sum(t.numel() * t.element_size() for t in state.values())
    split = split_torch_state_dict_into_shards(state, filename_pattern="pytorch_model{suffix}.bin", max_shard_size=total // 2 + 1)
    assert split.is_sharded and len(split.filename_to_tensors) == 2, split.filename_to_tensors.keys()
    for filename, names in split.filename_to_tensors.items():
        torch.save({name: state[name] for name in names}, sharded / filename)
    index = {"metadata": {"total_size": split.metadata.get("total_size", total)}, "weight_map": split.tensor_to_filename}
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    texts = TEXTS[:16] + ["a", "x " * 200]
    one, batch = vectors(out, texts)
    one_sharded, batch_sharded = vectors(sharded, texts)
    same = float(min(np.dot(a, b) for a, b in zip(one, one_sharded)))
    agree = float(min(np.dot(a, b) for a, b in zip(one, batch)))
    print(f"bert-bin-tiny: {sum(p.numel() for p in model.parameters())} parameters, {(out / 'pytorch_model.bin').stat().st_size} bytes; "
          f"sharded vs one file min cosine {same:.8f}; one at a time vs padded batch {agree:.8f}")
    assert np.array_equal(one, one_sharded) and np.array_equal(batch, batch_sharded)
    made_by = (f"sentence-transformers {__import__('sentence_transformers').__version__}, transformers "
               f"{__import__('transformers').__version__}, torch {torch.__version__}")
    for folder in (out, sharded):
        (folder / "reference.json").write_text(json.dumps({
            "texts": texts, "max_tokens": 128, "vectors": one.tolist(), "batch": batch.tolist(), "made_by": made_by,
        }))


def views(folder):
    folder.mkdir(parents=True, exist_ok=True)
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 0.5 - 3.0
    bf16 = (torch.linspace(-3, 3, 12) * 1.37).to(torch.bfloat16).reshape(3, 4)
    state = collections.OrderedDict(
        contiguous=base,
        transposed=base.transpose(0, 2),
        sliced=base[1, 1:, 2:],
        stepped=base[:, ::2, 1::2],
        expanded=torch.arange(3, dtype=torch.float32).unsqueeze(0).expand(4, 3),
        scalar=torch.tensor(2.5),
        empty=torch.zeros(0, 3),
        parameter=torch.nn.Parameter(torch.full((2, 2), 0.25)),
        float64=torch.tensor([1 / 3, 2 / 3, -1e300], dtype=torch.float64),
        float16=torch.linspace(-2, 2, 7).half(),
        float16_offset=torch.linspace(-2, 2, 7).half()[3:],
        bfloat16=bf16,
        bfloat16_transposed=bf16.t(),
        int64=torch.arange(-3, 3) * (1 << 40),
        int32=torch.arange(-3, 3, dtype=torch.int32) * 100000,
        int16=torch.tensor([-300, 0, 300], dtype=torch.int16),
        int8=torch.tensor([-128, 0, 127], dtype=torch.int8),
        uint8=torch.tensor([0, 7, 255], dtype=torch.uint8),
        bool=torch.tensor([True, False, True]),
    )
    state._metadata = collections.OrderedDict({"": {"version": 1}})
    torch.save(state, folder / "views.bin")
    torch.save(state, folder / "views-legacy.bin", _use_new_zipfile_serialization=False)
    expected = {}
    for name, t in state.items():
        t = t.detach()
        dtype = "float32" if t.dtype == torch.bfloat16 else str(t.dtype).removeprefix("torch.")
        values = t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
        expected[name] = {"dtype": dtype, "shape": list(t.shape), "values": values.flatten().tolist()}
    (folder / "expected.json").write_text(json.dumps({"tensors": expected, "made_by": f"torch {torch.__version__}"}, indent=1) + "\n")
    for f in ("views.bin", "views-legacy.bin"):
        reread = torch.load(folder / f, weights_only=True)
        assert all(torch.equal(reread[k], v.detach()) for k, v in state.items()), f
    print(f"torch_bin views: {len(state)} tensors, {(folder / 'views.bin').stat().st_size} and {(folder / 'views-legacy.bin').stat().st_size} bytes")


def main():
    bert_bin(HERE / "fixtures")
    views(HERE.parent / "fixtures" / "torch_bin")


if __name__ == "__main__":
    main()
