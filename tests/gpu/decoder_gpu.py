"""Issue 43's H200 table: a decoder embedder with Qwen3-Embedding-0.6B's
shapes (random weights, as tests/peer/decoder_cpu.py makes it), its GPU
graph made by eeane's own preparation (models/prepare.py --cuda-fp16), and
the peers in one process on the same card and texts.

  make DIR [tiny]   the repository: transformers' Qwen3Model written by
                    save_pretrained in bfloat16 (as Qwen3-Embedding ships),
                    sentence-transformers' module files written beside it
                    (last-token pooling, Normalize), the tokenizer of
                    tests/hub/fixtures/qwen3-tiny (it appends the end-of-text
                    token). `tiny` makes a 2-layer one for a dry run.
  settings DIR      the JSON eeane reads from such a repository (what
                    `eeane pull` passes to prepare.py as --settings).
  peers DIR TEXTS.json OUT_PREFIX
                    (1) transformers' Qwen3Model in fp32 on the GPU (TF32
                    off), last-token pooled and normalized: the independent
                    reference, saved as OUT_PREFIX.reference.npy; (2) the same
                    model in fp16 with SDPA attention, forward pass and
                    pooling only (tokenized beforehand, tensors on the GPU,
                    texts sorted by length, batches of 256): the torch row;
                    (3) sentence-transformers' encode in fp16 (batch 256),
                    when the package is installed. Prints JSON.
  http URL MODEL TEXTS.json REFERENCE.npy
                    the served model's vectors of every text (64 a request)
                    against the reference: min and mean cosine, as JSON.
Texts are cut at 256 tokens everywhere, as the served entry cuts them.
"""
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURE = ROOT / "tests/hub/fixtures/qwen3-tiny"
MAX_TOKENS = 256


def make(out, tiny=False):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(FIXTURE / f, out / f)
    eos = json.loads((FIXTURE / "config.json").read_text())["eos_token_id"]
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=512) if tiny else \
        dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             vocab_size=151669)
    common = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=eos,
                  pad_token_id=eos, bos_token_id=eos)
    try:
        import torch
        from transformers import Qwen3Config, Qwen3Model
    except ImportError as e:
        # A transformers without Qwen3 (older than 4.51): the same files by hand.
        print(f"transformers' Qwen3Model is not here ({e}); writing the checkpoint with numpy")
        parameters = write_numpy_checkpoint(out, shape, common)
    else:
        torch.manual_seed(0)
        model = Qwen3Model(Qwen3Config(**shape, **common)).eval().to(torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)
        parameters = sum(p.numel() for p in model.parameters())
    # sentence-transformers' files, as SentenceTransformer.save writes them.
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling/config.json").write_text(json.dumps({"word_embedding_dimension": shape["hidden_size"], "pooling_mode_lasttoken": True,
                                                           "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False}, indent=2))
    (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_TOKENS, "do_lower_case": False}))
    (out / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "Instruct: find the code\nQuery:"},
                                                                       "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    print(f"{out}: {parameters / 1e6:.0f}M parameters, bfloat16")


def write_numpy_checkpoint(out, shape, common):
    """config.json and model.safetensors (bfloat16, random normal * 0.02,
    norms 1) of a Qwen3Model, as save_pretrained names them. Returns the
    parameter count."""
    import numpy as np

    h, n, kv, d, inter = (shape[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
    shapes = {"embed_tokens.weight": (shape["vocab_size"], h), "norm.weight": (h,)}
    for i in range(shape["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (n * d, h), p + "self_attn.k_proj.weight": (kv * d, h),
                       p + "self_attn.v_proj.weight": (kv * d, h), p + "self_attn.o_proj.weight": (h, n * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)})
    rng = np.random.default_rng(0)
    header, offset = {}, 0
    for name, dims in shapes.items():
        size = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, dims in shapes.items():
            values = np.ones(dims, np.float32) if name.endswith("norm.weight") else rng.standard_normal(dims, np.float32) * 0.02
            f.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())  # bfloat16: float32's upper half
    config = {"architectures": ["Qwen3Model"], "model_type": "qwen3", "hidden_act": "silu", "attention_bias": False,
              "torch_dtype": "bfloat16", **shape, **common}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return sum(int(np.prod(dims)) for dims in shapes.values())


def settings(repo):
    """What eeane reads from the repository (src/pull/st.rs `settings`)."""
    repo = Path(repo)
    prompts = json.loads((repo / "config_sentence_transformers.json").read_text())["prompts"]
    return {
        "architecture": "Qwen3Model", "kind": "embedding", "weights": "model.safetensors",
        "pooling": {"value": "last_token", "from": "1_Pooling/config.json"},
        "normalize": {"value": True, "from": "modules.json (2_Normalize)"},
        "max_tokens": {"value": MAX_TOKENS, "from": "sentence_bert_config.json"},
        "prompts": {"value": prompts, "from": "config_sentence_transformers.json"},
    }


def peers(repo, texts_file, prefix):
    import os

    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Model

    from length_batches import length_sorted_batches

    # PEERS_DEVICE=cpu: a dry run of this code on a machine without a GPU.
    device = os.environ.get("PEERS_DEVICE", "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    texts = json.loads(Path(texts_file).read_text())
    tok = Tokenizer.from_file(str(Path(repo) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(MAX_TOKENS)
    encoded = [tok.encode(t).ids for t in texts]
    lengths = np.array([len(e) for e in encoded])
    report = {"texts": len(texts), "mean_tokens": float(lengths.mean()), "max_tokens": int(lengths.max()), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "none (dry run)"}

    def batches(size):
        for rows, ids, mask in length_sorted_batches(encoded, size):
            yield rows, torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)

    def last_token(hidden, mask):
        last = mask.sum(1) - 1
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()
        return torch.nn.functional.normalize(pooled, dim=-1)

    # (1) The reference: fp32, TF32 off, eager attention.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = Qwen3Model.from_pretrained(repo, torch_dtype=torch.float32, attn_implementation="eager").to(device).eval()
    reference = np.zeros((len(texts), model.config.hidden_size), np.float32)
    with torch.inference_mode():
        for rows, ids, mask in batches(32):
            reference[rows] = last_token(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask).cpu().numpy()
    np.save(f"{prefix}.reference.npy", reference)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    # (2) fp16, SDPA: the forward pass and pooling, tensors already on the GPU.
    model = Qwen3Model.from_pretrained(repo, torch_dtype=torch.float16, attn_implementation="sdpa").to(device).eval()
    prepared = list(batches(256))
    with torch.inference_mode():
        got = np.zeros_like(reference)
        for rows, ids, mask in prepared:  # warm, and the fp16 vectors
            got[rows] = last_token(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask).cpu().numpy()
        best = float("inf")
        for _ in range(3):
            sync()
            started = time.perf_counter()
            for rows, ids, mask in prepared:
                last_token(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
            sync()
            best = min(best, time.perf_counter() - started)
    cosines = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    report["torch fp16 sdpa forward"] = {"texts_per_s": len(texts) / best, "min_cosine_vs_fp32": float(cosines.min())}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    # (3) sentence-transformers' encode, when installed: what its users run.
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        report["sentence-transformers encode fp16"] = {"not_run": f"sentence-transformers is not installed here ({e})"}
    else:
        st = SentenceTransformer(str(repo), device=device, model_kwargs={"torch_dtype": torch.float16})
        st.max_seq_length = MAX_TOKENS
        st.encode(texts[:256], batch_size=256)
        sync()
        started = time.perf_counter()
        vectors = st.encode(texts, batch_size=256, convert_to_numpy=True)
        sync()
        rate = len(texts) / (time.perf_counter() - started)
        cosines = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
        report["sentence-transformers encode fp16"] = {"texts_per_s": rate, "min_cosine_vs_fp32": float(cosines.min()),
                                                       "version": __import__("sentence_transformers").__version__}
    print(json.dumps(report, indent=2))


def http(url, model, texts_file, reference_file):
    import base64
    import urllib.request

    import numpy as np

    texts, reference = json.loads(Path(texts_file).read_text()), np.load(reference_file)
    got = []
    for start in range(0, len(texts), 64):
        body = json.dumps({"model": model, "input": texts[start:start + 64], "encoding_format": "base64"}).encode()
        request = urllib.request.Request(f"{url}/v1/embeddings", body, {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            got += [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in json.load(response)["data"]]
    got = np.stack(got)
    cosines = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    print(json.dumps({"model": model, "texts": len(texts), "min_cosine_vs_torch_fp32": float(cosines.min()),
                      "mean_cosine_vs_torch_fp32": float(cosines.mean())}))


def main():
    mode = sys.argv[1]
    if mode == "make":
        make(sys.argv[2], tiny=sys.argv[3:4] == ["tiny"])
    elif mode == "settings":
        print(json.dumps(settings(sys.argv[2])))
    elif mode == "peers":
        peers(*sys.argv[2:5])
    elif mode == "http":
        http(*sys.argv[2:6])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
