"""ncnn models (Vulkan) of the families an engine converts (families.toml
`converted`): the family's graph in its ncnn-friendly form, converted by pnnx
(its binary, from its pinned wheel), attention rewritten into ncnn's SDPA
layer, checked with ncnn's own Python build against ONNX Runtime.

ncnn's Python package is imported by the check that runs it: only the ncnn
commands need it."""
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx

import families
import graph_builder
from checks import cosine, fixture_texts, mean_states_alone, tokenizer as check_tokenizer
from manifest import write_manifest
from runtimes import catalog_wheel, fetch_wheel

PNNX_WHEEL = catalog_wheel("pnnx")


def pnnx_binary(cache):
    """pnnx's converter binary from its wheel (the wheel's console script imports
    torch, which the binary does not need), unpacked once."""
    dest = cache / "runtimes" / "pnnx" / "20261020" / "pnnx"
    if not dest.exists():
        wheel = fetch_wheel(cache, *PNNX_WHEEL)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            dest.with_suffix(".tmp").write_bytes(z.read("pnnx/pnnx"))
        dest.with_suffix(".tmp").chmod(0o755)
        os.replace(dest.with_suffix(".tmp"), dest)
    return dest


def ncnn_vectors(param, weights, seqs, pack_tokens=1):
    """Mean-pooled token states from ncnn's own Python build (CPU, fp16 off).
    Consecutive sequences are packed side by side into runs of at most
    `pack_tokens` tokens, as eeane's engine does (positions restarting, a
    block-diagonal mask); 1 runs each alone."""
    import ncnn

    net = ncnn.Net()
    net.opt.use_vulkan_compute = False
    net.opt.use_fp16_packed = False
    net.opt.use_fp16_storage = False
    net.opt.use_fp16_arithmetic = False
    net.load_param(str(param))
    net.load_model(str(weights))
    runs, run = [], []
    for ids in seqs:
        if run and sum(map(len, run)) + len(ids) > pack_tokens:
            runs.append(run)
            run = []
        run.append(ids)
    runs.append(run)
    out = []
    for run in runs:
        n = sum(map(len, run))
        ids = np.concatenate([np.array(r, np.int32) for r in run])
        positions = np.concatenate([np.arange(len(r), dtype=np.int32) for r in run])
        mask = np.zeros((n, n), np.float32)
        at = 0
        for r in run:
            mask[at:at + len(r), at:at + len(r)] = 1.0
            at += len(r)
        ex = net.create_extractor()
        # A Mat over numpy memory only borrows it (the arrays must outlive it)
        # and has no refcount, while the mask's first operation runs in place
        # (ncnn dereferences the refcount: a crash): clone each, arrays alive.
        arrays = [ids, positions, mask]
        mats = [ncnn.Mat(a).clone() for a in arrays]
        for name, mat in zip(("in0", "in1", "in2"), mats):
            ex.input(name, mat)
        _, states = ex.extract("out0")
        states = np.array(states).reshape(n, -1).astype(np.float64)
        at = 0
        for r in run:
            out.append(states[at:at + len(r)].mean(0))
            at += len(r)
    return out


def ncnn_fuse_attention(param_text):
    """Rewrites a pnnx-converted BERT's attention into ncnn's SDPA layer, which
    runs on Vulkan: pnnx leaves Q.K^T and P.V as MatMul layers, which ncnn runs
    only on the CPU, so every layer's scores went down to the host and back
    (12 of 170 layers; on the H200 a 512-token run took 52 ms, most of it
    there). Per layer, MatMul(q, k^T) -> mul(scale) -> add(mask) -> Softmax ->
    MatMul(., v) becomes SDPA(q, k, v, mask) with that scale, k's Permute
    keeping [heads, S, d] as q's does; the mask's ExpandDims (CPU-only too) is
    dropped, SDPA taking the [S, S] mask as it is. The weights do not move, so
    the .bin is unchanged. Returns the new text and the number of attentions fused."""
    lines = param_text.strip().split("\n")
    magic, layers = lines[0], []
    for line in lines[2:]:
        f = line.split()
        nin, nout = int(f[2]), int(f[3])
        layers.append({"type": f[0], "name": f[1], "inputs": f[4:4 + nin], "outputs": f[4 + nin:4 + nin + nout], "params": f[4 + nin + nout:]})
    producer = {o: layer for layer in layers for o in layer["outputs"]}
    consumers = {}
    for layer in layers:
        for i in layer["inputs"]:
            consumers.setdefault(i, []).append(layer)
    only = lambda blob: consumers.get(blob, [None])[0] if len(consumers.get(blob, [])) == 1 else None
    # The mask's ExpandDims goes; whoever read its output reads its input.
    for layer in [l for l in layers if l["type"] == "ExpandDims"]:
        (src,), (dst,) = layer["inputs"], layer["outputs"]
        for user in consumers.get(dst, []):
            user["inputs"] = [src if i == dst else i for i in user["inputs"]]
        layers.remove(layer)
    fused, drop = 0, []
    for qk in [l for l in layers if l["type"] == "MatMul"]:
        scale, add = only(qk["outputs"][0]), None
        if scale and scale["type"] == "BinaryOp" and "0=2" in scale["params"] and "1=1" in scale["params"]:
            add = only(scale["outputs"][0])
        softmax = add and add["type"] == "BinaryOp" and "0=0" in add["params"] and only(add["outputs"][0])
        pv = softmax and softmax["type"] == "Softmax" and only(softmax["outputs"][0])
        if not (pv and pv["type"] == "MatMul" and pv["inputs"][0] == softmax["outputs"][0]):
            continue
        k_permute = producer[qk["inputs"][1]]
        if k_permute["type"] != "Permute" or k_permute["params"] != ["0=3"]:
            continue
        k_permute["params"] = ["0=2"]
        factor = next(p for p in scale["params"] if p.startswith("2="))[2:]
        mask = next(i for i in add["inputs"] if i != scale["outputs"][0])
        qk.update(type="SDPA", name=qk["name"].replace("matmul", "sdpa"), inputs=[qk["inputs"][0], qk["inputs"][1], pv["inputs"][1], mask],
                  outputs=pv["outputs"], params=["5=1", f"6={factor}"])
        drop += [scale, add, softmax, pv]
        fused += 1
    layers = [l for l in layers if not any(l is d for d in drop)]
    blobs = {o for l in layers for o in l["outputs"]}
    body = [f"{l['type']:<24} {l['name']:<24} {len(l['inputs'])} {len(l['outputs'])} " + " ".join(l["inputs"] + l["outputs"] + l["params"]) for l in layers]
    return "\n".join([magic, f"{len(layers)} {len(blobs)}"] + body) + "\n", fused


# The ncnn graph contract: input_ids, position_ids and a [S, S] float mask, so
# that sequences can be packed, masked with -10000 so that fp16 arithmetic
# holds it; a cached conversion of an older recipe is redone.
NCNN_RECIPE = "packed-mask-sdpa-fp16-mask"


def convert_to_ncnn(cache, out, family, weights, cfg, tokenizer, max_tokens, fp16_weights, source):
    """An encoder of `family` (its builder module; its weights and config as
    its prepare_weights gives them) and its tokenizer.json to ncnn in
    `out`: the graph made ncnn-friendly (position
    ids as an input, a float [S, S] mask for packing, no token types; pooling
    stays in eeane), converted by pnnx, attention fused into SDPA, and checked
    with ncnn itself (CPU, fp32 arithmetic) against ONNX Runtime on an ONNX
    graph of the same weights, each sequence alone and packed; refuses to
    publish below cosine 0.9999. `fp16_weights` stores the weights as fp16
    (half the file; ncnn widens them to fp32 on load, so not the VRAM)."""
    name = out.name
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        onnx.save_model(family.build_graph(weights, cfg, ncnn_friendly=True), work / "model.onnx")
        onnx.save_model(family.build_graph(weights, cfg), work / "reference.onnx")
        # inputshape2 makes the sequence length dynamic.
        subprocess.run([str(pnnx_binary(cache)), str(work / "model.onnx"), "inputshape=[1,16]i64,[1,16]i64,[1,16,16]f32",
                        "inputshape2=[1,32]i64,[1,32]i64,[1,32,32]f32", f"fp16={int(fp16_weights)}"],
                       cwd=work, check=True, capture_output=True)
        param, fused = ncnn_fuse_attention((work / "model.ncnn.param").read_text())
        if fused != cfg["num_hidden_layers"]:
            raise SystemExit(f"{name}: fused {fused} attentions into SDPA, expected {cfg['num_hidden_layers']}: pnnx's output changed shape")
        (out / "model.ncnn.param.tmp").write_text(param)
        shutil.copy2(work / "model.ncnn.bin", out / "model.ncnn.bin.tmp")
        shutil.copy2(tokenizer, out / "tokenizer.json")
        texts = fixture_texts()
        tok = check_tokenizer(out / "tokenizer.json", max_tokens)
        seqs = [tok.encode(t).ids for t in texts]
        want = mean_states_alone(work / "reference.onnx", seqs)
    param, weights_file = out / "model.ncnn.param.tmp", out / "model.ncnn.bin.tmp"
    alone = ncnn_vectors(param, weights_file, seqs)
    packed = ncnn_vectors(param, weights_file, seqs, pack_tokens=512)
    cosines = [cosine(a, b) for a, b in zip(alone, want)]
    packed_vs_alone = [cosine(a, b) for a, b in zip(packed, alone)]
    print(f"{name}: ncnn (CPU, fp32 arithmetic) vs ONNX Runtime over {len(texts)} texts: min cosine {min(cosines):.8f}; "
          f"packed 512 tokens a run vs alone: min {min(packed_vs_alone):.8f}")
    if min(cosines) < 0.9999 or min(packed_vs_alone) < 0.99999:
        raise SystemExit(f"{name}: the ncnn model drifts from ONNX Runtime (or packing changes it); not publishing it")
    for ext in ("param", "bin"):
        os.replace(out / f"model.ncnn.{ext}.tmp", out / f"model.ncnn.{ext}")
    write_manifest(out, {**source, "pnnx": PNNX_WHEEL[0], "recipe": NCNN_RECIPE, "weights": "fp16" if fp16_weights else "fp32"},
                   {"min_cosine_vs_onnxruntime": min(cosines), "min_cosine_packed_vs_alone": min(packed_vs_alone)})
    print(f"{name}: ready in {out}")


def converted_family(settings, cfg):
    """The builder of the family to convert (families.of), refused when
    families.toml says engines that convert take none of it."""
    name = families.of(settings, cfg)
    if not families.row(name)["converted"]:
        raise SystemExit(f"family {name!r}: models/families.toml has converted = false (no ncnn graph is built for it)")
    return families.builder(name)


def ncnn_from_hf(cache, directory, name, fp16_weights):
    """Any checkpoint of a converted family (BERT, RoBERTa, XLM-RoBERTa,
    DistilBERT) in a local directory (config.json,
    model.safetensors, tokenizer.json: what `huggingface-cli download` and
    `AutoTokenizer(...).save_pretrained` leave) to `{cache}/models/NAME`."""
    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text())
    family = converted_family(None, cfg)
    weights, bert_cfg = family.prepare_weights(graph_builder.open_checkpoint(directory), cfg)
    max_tokens = int(bert_cfg["max_position_embeddings"])
    convert_to_ncnn(cache, cache / "models" / name, family, weights, bert_cfg, directory / "tokenizer.json",
                    min(max_tokens, 512), fp16_weights, {"converted_from": str(directory)})
    print(f"{name}: serve it with engine = \"ncnn\", model = \"{{cache}}/models/{name}/model.ncnn.param\", "
          f"tokenizer = \"{{cache}}/models/{name}/tokenizer.json\", max_tokens <= {max_tokens}")
