#!/usr/bin/env python3
"""Makes the decoder embedders' fixtures once, with torch, transformers and
sentence-transformers (not in CI: the fixtures are committed, kilobytes each).

For each family (qwen3, qwen2, mistral, llama, gemma3; and the encoders
mpnet and modernbert): a tiny random model (2 layers, hidden 64, 4 query
and, for decoders, 2 key/value heads) written by transformers' own
save_pretrained,
a small byte-level BPE tokenizer trained on tests/fixtures/texts.json that
appends the end-of-text token as Qwen3-Embedding's does, and the files
sentence-transformers writes (modules.json, 1_Pooling with last-token
pooling, Normalize, config_sentence_transformers.json with a query prompt).
gemma3 is shaped as google/embeddinggemma-300m is: bidirectional attention,
a sliding-window layer and a global one, mean pooling, two Dense modules
without bias, and its query and document prompts. Its window (16, so 8 each
side) and modernbert's (local_attention 16) are shorter than the long test
text, so the windows change the vectors.
Beside each, reference.json: sentence-transformers' own vectors for the
texts, with and without prompt_name="query", one text at a time and as one
padded batch.

qwen3-reranker is laid out as Qwen/Qwen3-Reranker-0.6B is: a
Qwen3ForCausalLM with tied embeddings, no sentence-transformers files, and a
tokenizer with the chat tokens and single "yes" and "no" tokens; its
reference.json holds the scores of its model card's own code (the prefix,
the instruction template and the suffix, tokenized apart; p(yes) over yes
and no at the last position, left-padded batch), for the default
instruction and a given one.

    python3 tests/hub/make_decoder_fixtures.py OUT_DIR [FAMILY ...]
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, processors, trainers
from transformers import (AutoTokenizer, Gemma2Config, Gemma2Model, Gemma3TextConfig, Gemma3TextModel, GemmaConfig, GemmaForCausalLM, GemmaModel,
                          Qwen3ForCausalLM, LlamaConfig, LlamaModel, MistralConfig, MistralModel, ModernBertConfig,
                          ModernBertModel, MPNetConfig, MPNetModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2Model, Qwen3Config,
                          Qwen3Model)

HERE = Path(__file__).resolve().parent
TEXTS = json.loads((HERE.parent / "fixtures" / "texts.json").read_text())
EOS = "<|endoftext|>"


def gemma_tokenizer(out):
    """Gemma's specials (<pad>=0, <eos>=1, <bos>=2), each text as <bos> ... <eos>, as EmbeddingGemma's tokenizer does."""
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>",
                                                       special_tokens=[("<bos>", 2), ("<eos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                   model_max_length=128)
    fast.save_pretrained(out)
    return fast.vocab_size


def tokenizer(out):
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4, trainer)
    eos = tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, model_max_length=128)
    fast.save_pretrained(out)
    return fast.vocab_size, eos


def encoder_tokenizer(out):
    """A byte-level BPE with RoBERTa's specials (<s>=0, <pad>=1, </s>=2),
    wrapping each text as <s> ... </s>."""
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                   model_max_length=128)
    fast.save_pretrained(out)
    return fast.vocab_size


def family(name, config_cls, model_cls, out, extra):
    # Imported here: bge-gemma-reranker runs under transformers 4, which sentence-transformers 6 refuses.
    from sentence_transformers import SentenceTransformer, models

    out.mkdir(parents=True, exist_ok=True)
    extra = dict(extra)
    extra_bf16 = extra.pop("bf16", False)
    torch.manual_seed(20261204)
    dense = []
    prompts = {"query": "Instruct: Given a question, retrieve passages that answer it\nQuery: "}
    if name in ("mpnet", "modernbert"):
        vocab = encoder_tokenizer(out)
        if name == "mpnet":
            extra = dict(max_position_embeddings=514, relative_attention_num_buckets=32, **extra)
        else:
            extra = dict(max_position_embeddings=512, cls_token_id=0, sep_token_id=2, **extra)
        config = config_cls(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            pad_token_id=1, bos_token_id=0, eos_token_id=2, **extra)
        pooling_mode = "mean"
    elif name in ("gemma", "gemma2"):
        # Causal, last-token pooled, as BAAI/bge-multilingual-gemma2 pools.
        vocab = gemma_tokenizer(out)
        config = config_cls(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
                            bos_token_id=2, **extra)
        pooling_mode = "lasttoken"
    elif name == "gemma3":
        vocab = gemma_tokenizer(out)
        config = config_cls(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
                            bos_token_id=2, **extra)
        pooling_mode = "mean"
        dense = [models.Dense(64, 128, bias=False, activation_function=torch.nn.Identity()),
                 models.Dense(128, 64, bias=False, activation_function=torch.nn.Identity())]
        prompts = {"query": "task: search result | query: ", "document": "title: none | text: "}
    else:
        vocab, eos = tokenizer(out)
        config = config_cls(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6,
                            eos_token_id=eos, pad_token_id=eos, bos_token_id=eos, tie_word_embeddings=False, **extra)
        pooling_mode = "lasttoken"
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            # Larger than the default init, so that every layer moves the vectors.
            p.normal_(0.0, 0.2)
        for n, p in model.named_parameters():
            # Gemma's norms scale by 1 + weight already.
            if n.endswith("norm.weight") and not name.startswith("gemma"):
                p.add_(1.0)
    if extra_bf16:
        # Weights on disk in bfloat16, as Qwen3-Embedding ships them; the
        # reference computes in float32 from those same rounded weights.
        model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    transformer = models.Transformer(str(out), max_seq_length=128, model_kwargs={"dtype": torch.float32})
    pooling = models.Pooling(64, pooling_mode=pooling_mode)
    st = SentenceTransformer(modules=[transformer, pooling, *dense, models.Normalize()], prompts=prompts)
    st.save(str(out))
    if extra_bf16:
        model.save_pretrained(out, safe_serialization=True)  # sentence-transformers saved its float32 copy
    st = SentenceTransformer(str(out), device="cpu", model_kwargs={"dtype": torch.float32})
    texts = TEXTS[:16] + ["a", "x " * 200]
    one = [st.encode([t], convert_to_numpy=True)[0] for t in texts]
    batch = st.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    query = st.encode(texts, prompt_name="query", batch_size=8, convert_to_numpy=True)
    agree = min(float(np.dot(a, b)) for a, b in zip(one, batch))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters; one at a time vs padded batch min cosine {agree:.8f}")
    (out / "reference.json").write_text(json.dumps({
        "texts": texts, "max_tokens": 128,
        "vectors": [v.tolist() for v in one], "batch": batch.tolist(), "query": query.tolist(),
        "made_by": f"sentence-transformers {__import__('sentence_transformers').__version__}, transformers "
                   f"{__import__('transformers').__version__}, torch {torch.__version__}",
    }))


FAMILIES = [
    ("qwen3", Qwen3Config, Qwen3Model, {"head_dim": 16}),
    # The same family with its weights in bfloat16 on disk.
    ("qwen3-bf16", Qwen3Config, Qwen3Model, {"head_dim": 16, "bf16": True}),
    ("qwen2", Qwen2Config, Qwen2Model, {}),
    # No sliding window: eeane caps a Mistral's length at its window instead.
    ("mistral", MistralConfig, MistralModel, {"sliding_window": None}),
    ("llama", LlamaConfig, LlamaModel, {}),
    # An encoder whose relative position buckets no other family here has.
    ("mpnet", MPNetConfig, MPNetModel, {}),
    # EmbeddingGemma's shape: bidirectional, one sliding-window layer and one
    # global, per-type RoPE theta, query scale from query_pre_attn_scalar.
    ("gemma3", Gemma3TextConfig, Gemma3TextModel,
     {"head_dim": 16, "use_bidirectional_attention": True, "sliding_window": 16, "query_pre_attn_scalar": 32,
      "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True}),
    # Gemma 1 (the backbone of BAAI/bge-reranker-v2-gemma): exact GELU as its
    # config's hidden_act names it, (1 + w) norms, scaled embeddings, causal.
    ("gemma", GemmaConfig, GemmaModel, {"head_dim": 16, "hidden_act": "gelu"}),
    # Gemma2 (BAAI/bge-multilingual-gemma2): sandwich norms, a causal sliding
    # window (8) on every other layer, score soft-capping, query scalar.
    ("gemma2", Gemma2Config, Gemma2Model, {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 32, "attn_logit_softcapping": 5.0}),
    # Global then local attention (window 16, so 8 each side), RoPE, GeGLU, no biases.
    ("modernbert", ModernBertConfig, ModernBertModel, {"global_attn_every_n_layers": 2, "local_attention": 16}),
]


RERANK_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. "
                 "Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def qwen3_reranker(out):
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(20261204)
    specials = [EOS, "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4 + ["yes", "no"] * 200 + [RERANK_PREFIX, RERANK_SUFFIX] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, model_max_length=256, padding_side="left")
    fast.save_pretrained(out)
    config = Qwen3Config(vocab_size=fast.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=True,
                         architectures=["Qwen3ForCausalLM"])
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.normal_(0.0, 0.2)
            if n.endswith("norm.weight"):
                p.add_(1.0)
    model.save_pretrained(out, safe_serialization=True)

    # The model card's code, as it is.
    tokenizer = AutoTokenizer.from_pretrained(str(out), padding_side="left")
    model = Qwen3ForCausalLM.from_pretrained(str(out)).eval()
    true_id, false_id = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    assert tokenizer.unk_token_id not in (true_id, false_id) and None not in (true_id, false_id)
    max_length = 256
    prefix_tokens = tokenizer.encode(RERANK_PREFIX, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(RERANK_SUFFIX, add_special_tokens=False)

    def scores(instruction, query, documents):
        pairs = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {d}" for d in documents]
        inputs = tokenizer(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                           max_length=max_length - len(prefix_tokens) - len(suffix_tokens))
        for i, ids in enumerate(inputs["input_ids"]):
            inputs["input_ids"][i] = prefix_tokens + ids + suffix_tokens
        inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
        with torch.no_grad():
            logits = model(**inputs).logits[:, -1, :]
        pair = torch.stack([logits[:, false_id], logits[:, true_id]], dim=1)
        return torch.nn.functional.log_softmax(pair, dim=1)[:, 1].exp().tolist()

    query = "What is the capital of Portugal?"
    documents = TEXTS[:12] + ["Lisbon is the capital of Portugal.", "yes", "x " * 300]
    given = "Given a question, find the passage that answers it"
    reference = {"query": query, "documents": documents, "max_tokens": max_length, "true_id": true_id, "false_id": false_id,
                 "default_instruction": RERANK_INSTRUCTION, "scores": scores(RERANK_INSTRUCTION, query, documents),
                 "instruction": given, "scores_with_instruction": scores(given, query, documents),
                 "made_by": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}"}
    print(f"qwen3-reranker: yes {true_id}, no {false_id}; scores {[round(x, 4) for x in reference['scores'][:4]]}")
    (out / "reference.json").write_text(json.dumps(reference))


BGE_PROMPT = ("Given a query A and a passage B, determine whether the passage contains an answer to the query by providing a "
              "prediction of either 'Yes' or 'No'.")


def bge_gemma_reranker(out):
    """Laid out as BAAI/bge-reranker-v2-gemma: a GemmaForCausalLM, no
    sentence-transformers files, a tokenizer with Gemma's specials and a
    single "Yes" token; scored by its model card's own get_inputs, which
    calls prepare_for_model: transformers 5 dropped it from fast tokenizers,
    so this one runs under transformers 4, as the card was written."""
    import transformers
    if not transformers.__version__.startswith("4."):
        raise SystemExit(f"bge-gemma-reranker: the card's get_inputs needs transformers 4 (prepare_for_model), not {transformers.__version__}")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(20261205)
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4 + ["Yes", "No"] * 200 + [BGE_PROMPT, "A: ", "B: "] * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                   padding_side="left")
    fast.save_pretrained(out)
    config = GemmaConfig(vocab_size=fast.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6, pad_token_id=0,
                         eos_token_id=1, bos_token_id=2, hidden_act="gelu_pytorch_tanh", architectures=["GemmaForCausalLM"])
    model = GemmaForCausalLM(config).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)

    # The model card's code (get_inputs, then the logit of "Yes" at the last
    # position, normalized by a sigmoid as FlagEmbedding's normalize=True does).
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    model = GemmaForCausalLM.from_pretrained(str(out)).eval()
    yes_loc = tokenizer("Yes", add_special_tokens=False)["input_ids"][0]
    assert tokenizer.convert_ids_to_tokens(yes_loc) == "Yes"

    def get_inputs(pairs, prompt, max_length=1024):
        sep = "\n"
        prompt_inputs = tokenizer(prompt, return_tensors=None, add_special_tokens=False)["input_ids"]
        sep_inputs = tokenizer(sep, return_tensors=None, add_special_tokens=False)["input_ids"]
        inputs = []
        for query, passage in pairs:
            query_inputs = tokenizer(f"A: {query}", return_tensors=None, add_special_tokens=False, max_length=max_length * 3 // 4,
                                     truncation=True)
            passage_inputs = tokenizer(f"B: {passage}", return_tensors=None, add_special_tokens=False, max_length=max_length,
                                       truncation=True)
            item = tokenizer.prepare_for_model([tokenizer.bos_token_id] + query_inputs["input_ids"], sep_inputs + passage_inputs["input_ids"],
                                               truncation="only_second", max_length=max_length, padding=False, return_attention_mask=False,
                                               return_token_type_ids=False, add_special_tokens=False)
            item["input_ids"] = item["input_ids"] + sep_inputs + prompt_inputs
            item["attention_mask"] = [1] * len(item["input_ids"])
            inputs.append(item)
        return tokenizer.pad(inputs, padding=True, max_length=max_length + len(sep_inputs) + len(prompt_inputs), pad_to_multiple_of=8,
                             return_tensors="pt")

    def scores(prompt, query, documents):
        inputs = get_inputs([(query, d) for d in documents], prompt)
        with torch.no_grad():
            logits = model(**inputs, return_dict=True).logits[:, -1, yes_loc].view(-1).float()
        return torch.sigmoid(logits).tolist(), int(inputs["input_ids"].shape[1])

    query = "What is the capital of Portugal?"
    # The last document is longer than the card's max_length, so it is cut
    # (only_second); the long query is longer than three quarters of it.
    documents = TEXTS[:10] + ["Lisbon is the capital of Portugal.", "Yes", "x " * 1400]
    long_query = "capital city " * 500
    given = "Given a question A and a passage B, say 'Yes' when B answers A."
    default, padded = scores(BGE_PROMPT, query, documents)
    with_instruction, _ = scores(given, query, documents)
    long, long_padded = scores(BGE_PROMPT, long_query, documents)
    reference = {"query": query, "documents": documents, "yes_id": yes_loc, "default_instruction": BGE_PROMPT, "scores": default,
                 "instruction": given, "scores_with_instruction": with_instruction, "long_query": long_query, "scores_long_query": long,
                 "made_by": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}"}
    print(f"bge-gemma-reranker: Yes {yes_loc}, padded to {padded} and {long_padded}; scores {[round(x, 4) for x in default[:4]]}")
    (out / "reference.json").write_text(json.dumps(reference))


def main():
    out = Path(sys.argv[1])
    only = set(sys.argv[2:])
    for name, config_cls, model_cls, extra in FAMILIES:
        if not only or name in only:
            family(name, config_cls, model_cls, out / f"{name}-tiny", extra)
    if not only or "qwen3-reranker" in only:
        qwen3_reranker(out / "qwen3-reranker-tiny")
    if not only or "bge-gemma-reranker" in only:
        bge_gemma_reranker(out / "bge-gemma-reranker-tiny")


if __name__ == "__main__":
    main()
