"""A Hub repository's snapshot (`eeane pull hf:ORG/NAME`) to a served model
in {cache}/models/NAME: the repository's own ONNX graph, checked to run, or
the graph its family's builder makes from its weights (families/, the family
that `eeane pull` names in --settings), checked against the family's float64
network, with the repository's pooling and Dense modules inside when it has
Dense modules (graph_tail.py), and with `cuda_fp16` the GPU's graph
(gpu_graph.py); or, for engines that convert, an ncnn model (convert_ncnn.py).
The repository's config.json is read once, here, and handed down."""
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx

import families
import gpu_graph
import graph_builder
import graph_tail
import torch_bin
import vocab_tokenizer
from checks import (CHECK_TEXTS, CHECK_TOKENS, MIN_COSINE, cosine, logits_held, language_model_reranker_figure,
                    mean_hidden, run, sequence_classifier_figure, session, token_ids, tokenizer as check_tokenizer)
from convert_ncnn import convert_to_ncnn, converted_family
from manifest import manifest_is_current, publish


def hub_tokenizer(snapshot, out):
    """The repository's tokenizer.json, copied to `out`; for a repository
    that ships only vocabulary files, one built from them as transformers
    builds it (models/vocab_tokenizer.py). Returns what was done, for the
    manifest."""
    snapshot, out = Path(snapshot), Path(out)
    if (snapshot / "tokenizer.json").is_file():
        shutil.copyfile(snapshot / "tokenizer.json", out)
        return "the repository's tokenizer.json"
    kind = vocab_tokenizer.tokenizer_class(snapshot)
    vocab_tokenizer.write(snapshot, out)
    files = [f for f in ("vocab.json", "merges.txt", "vocab.txt", "sentencepiece.bpe.model") if (snapshot / f).is_file()]
    built = f"built from {' + '.join(files)} as transformers' {kind} builds it"
    print(f"{snapshot.name}: no tokenizer.json; {built}")
    return built


def checkpoint_parameters(weights_folder, snapshot, settings):
    """{"count", "from"}: the numbers in the checkpoint's safetensors (their
    headers' shapes, no data read), its Dense modules' included."""
    files = graph_builder.checkpoint_files(weights_folder)
    count = graph_builder.Checkpoint(files).parameters()
    where = files[0].name if len(files) == 1 else f"model.safetensors.index.json's {len(files)} shards"
    for module in (settings or {}).get("dense") or []:
        count += graph_builder.Checkpoint([Path(snapshot) / module["path"] / "model.safetensors"]).parameters()
        where += f", {module['path']}/model.safetensors"
    return {"count": count, "from": f"safetensors headers ({where})"}


def append_dense_modules(snapshot, graph_path, settings, tokenizer_path):
    """With the Dense modules eeane read from the repository (settings'
    "dense", after its "graph_pooling"): the graph at `graph_path` ends in
    that pooling and those modules, checked on the check texts against the
    same tail in float64 numpy on the graph's own token states. Returns the
    check's figures, or None when the repository has no Dense module."""
    dense = (settings or {}).get("dense")
    if not dense:
        return None
    layers = graph_tail.dense_modules(snapshot, settings)
    pooling = settings["graph_pooling"]
    model = graph_tail.append_pooling_and_dense(onnx.load(str(graph_path), load_external_data=False), pooling, layers)
    ended = graph_path.with_name(graph_path.name + ".dense")
    onnx.save_model(model, str(ended))
    tok = check_tokenizer(tokenizer_path, CHECK_TOKENS)
    sessions = [session(p) for p in (graph_path, ended)]
    worst, max_abs = 1.0, 0.0
    for text in CHECK_TEXTS:
        ids = np.asarray([tok.encode(text).ids], np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        states, got = (run(sess, feed) for sess in sessions)
        want = graph_tail.numpy_pooling_and_dense(states, feed["attention_mask"], pooling, layers)[0]
        worst = min(worst, cosine(got[0], want))
        max_abs = max(max_abs, float(np.abs(got[0] - want).max()))
    print(f"{graph_path.parent.name}: {pooling} pooling and {len(layers)} Dense module(s) in the graph vs numpy float64: "
          f"min cosine {worst:.8f}, max |diff| {max_abs:.2e}")
    if worst < MIN_COSINE or max_abs > 1e-4:
        ended.unlink()
        raise SystemExit("the graph's pooling and Dense modules drift from the reference; not publishing it")
    os.replace(ended, graph_path)
    return {"dense_min_cosine_vs_numpy_float64": worst, "dense_max_abs_diff": max_abs}


def onnx_from_hub_snapshot(cache, snapshot, name, source, settings=None, onnx_file=None, cuda_fp16=False):
    """A Hub repository's snapshot (`eeane pull hf:...`) to `{cache}/models/NAME`:
    its own onnx/model.onnx (and external data) when it ships one, checked to
    run; else the graph built from its safetensors (one file or an index's
    shards; or its pytorch_model.bin, read without running its pickle and
    converted to safetensors first) by its family's builder (families/:
    encoders, their sequence classifiers, decoders and rerankers that are
    language models) and checked against the float64 numpy network
    before it is published. Everything is made in NAME/.build and moved into
    NAME only once checked (`publish`): an interrupted or refused run leaves
    nothing that is served. With `cuda_fp16`, the GPU's graph too
    (gpu_graph.py: model.fp16.onnx, or the reason there is none)."""
    snapshot = Path(snapshot)
    out = cache / "models" / name
    manifest = json.loads((out / "manifest.json").read_text()) if manifest_is_current(out) else {}
    recorded = manifest.get("source", {})
    # A GPU graph of an older recipe (gpu_graph.RECIPE) is made again.
    has_gpu_graph = manifest.get("checks", {}).get("cuda_fp16", {}).get("recipe") == gpu_graph.RECIPE
    if {"hub": recorded.get("hub"), "inferred": recorded.get("inferred")} == {"hub": source, "inferred": settings} and has_gpu_graph >= cuda_fp16:
        print(f"{name}: up to date in {out}")
        return
    cfg = json.loads((snapshot / "config.json").read_text())
    # PyTorch weights only: converted to safetensors in a folder of their
    # own, before anything is written to NAME, and not kept once the graph
    # is built (the graph holds the weights).
    converted_dir = cache / "models" / ".converted" / name
    shutil.rmtree(converted_dir, ignore_errors=True)
    converted_dir.mkdir(parents=True)
    try:
        _, converted = torch_bin.weights_file(snapshot, converted_dir, needed=not (snapshot / "onnx" / "model.onnx").is_file())
        weights_folder = converted_dir if converted else snapshot
        out.mkdir(parents=True, exist_ok=True)
        build = out / ".build"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        try:
            checks, parameters = _onnx_from_hub_snapshot(build, snapshot, weights_folder, cfg, name, settings, onnx_file)
            if cuda_fp16:
                checks["cuda_fp16"] = {**gpu_graph_of(build, snapshot, weights_folder, cfg, settings, onnx_file), "recipe": gpu_graph.RECIPE}
            publish(build, out, {"hub": source, "inferred": settings, **torch_bin.provenance(converted)}, checks, parameters)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    finally:
        shutil.rmtree(converted_dir, ignore_errors=True)
    print(f"{name}: ready in {out}")


def gpu_graph_of(build, snapshot, weights_folder, cfg, settings, onnx_file):
    """build/model.fp16.onnx for ONNX Runtime on the GPU (gpu_graph.py);
    what the manifest's checks keep of it, or why there is none."""
    why = gpu_graph.why_not(settings, repository_onnx=bool(onnx_file) or (snapshot / "onnx" / "model.onnx").is_file())
    if why:
        print(f"no GPU graph: {why}")
        return {"graph": None, "why": why}
    fp32_bytes = 4 * graph_builder.open_checkpoint(weights_folder).parameters()
    try:
        return gpu_graph.build(build, snapshot, weights_folder, cfg, settings, families.of(settings, cfg), build / "tokenizer.json", fp32_bytes)
    except (SystemExit, Exception) as e:  # the fp32 graph still serves; the survey names why there is no other
        for leftover in (gpu_graph.GRAPH, gpu_graph.DATA):
            (build / leftover).unlink(missing_ok=True)
        print(f"no GPU graph: {e}")
        return {"graph": None, "why": f"its preparation failed: {e}"}


def _onnx_from_hub_snapshot(build, snapshot, weights_folder, cfg, name, settings, onnx_file):
    """onnx_from_hub_snapshot's work in `build`: the checked graph as
    build/model.onnx (with its data files) and the tokenizer; returns
    (checks, parameters). The weights are read from `weights_folder`."""
    tokenizer = build / "tokenizer.json"
    tokenizer_from = hub_tokenizer(snapshot, tokenizer)
    parameters = None
    if onnx_file:
        checks = _variant(build, snapshot, weights_folder, cfg, name, settings, onnx_file, tokenizer)
    elif (snapshot / "onnx" / "model.onnx").is_file():
        checks = _repository_onnx(build, snapshot, name)
    else:
        checks, parameters, scores = _built(build, snapshot, weights_folder, cfg, name, settings, tokenizer)
        if scores:  # a reranker's logits: no pooling, no Dense module
            return {**checks, "tokenizer": tokenizer_from}, parameters
    checks.update(append_dense_modules(snapshot, build / "model.onnx", settings, tokenizer) or {})
    checks["tokenizer"] = tokenizer_from
    return checks, parameters


def _variant(build, snapshot, weights_folder, cfg, name, settings, onnx_file, tokenizer):
    """A variant of the repository's graph (optimized, quantized) as
    build/model.onnx: served only when it stays within 0.9999 cosine of the
    fp32 graph (the repository's, else the one its family builds)."""
    variant = snapshot / onnx_file
    for data in variant.parent.glob(variant.name + "[._]data*"):
        shutil.copyfile(data, build / data.name)
    shutil.copyfile(variant, build / "model.onnx")
    if (snapshot / "onnx" / "model.onnx").is_file():
        reference_graph = snapshot / "onnx" / "model.onnx"
    else:
        family = families.builder(families.of(settings, cfg))
        checkpoint = graph_builder.open_checkpoint(weights_folder)
        weights, family_cfg = family.prepare_weights(checkpoint, cfg)
        reference_graph = graph_builder.build_into(build / "reference", family.build_graph, weights, family_cfg, 4 * checkpoint.parameters())
    ours = mean_hidden(build / "model.onnx", tokenizer, CHECK_TEXTS)
    theirs = mean_hidden(reference_graph, tokenizer, CHECK_TEXTS)
    shutil.rmtree(build / "reference", ignore_errors=True)
    worst = min(cosine(a, b) for a, b in zip(ours, theirs))
    print(f"{name}: {onnx_file} vs the fp32 graph on {len(CHECK_TEXTS)} texts: min cosine {worst:.6f}")
    if worst < 0.9999:
        raise SystemExit(f"{name}: {onnx_file} drifts from the fp32 graph (min cosine {worst:.6f} < 0.9999 on "
                         f"{len(CHECK_TEXTS)} check texts); not serving it: serve the fp32 graph (no onnx_file)")
    return {"variant": onnx_file, "min_cosine_vs_fp32": worst}


def _repository_onnx(build, snapshot, name):
    """The repository's onnx/model.onnx (and its data files) as
    build/model.onnx, checked to run."""
    graph = build / "model.onnx"
    for data in (snapshot / "onnx").glob("model.onnx[._]data*"):
        shutil.copyfile(data, build / data.name)
    shutil.copyfile(snapshot / "onnx" / "model.onnx", graph)
    sess = session(graph)
    names = [i.name for i in sess.get_inputs()]
    feed = {n: np.ones((1, 4), np.int64) if n != "token_type_ids" else np.zeros((1, 4), np.int64) for n in names}
    outputs = [o.name for o in sess.get_outputs()]
    sess.run(None, feed)
    del sess
    print(f"{name}: the repository's ONNX runs (inputs {names}, outputs {outputs})")
    return {"repository_onnx": True, "inputs": names, "outputs": outputs}


def _built(build, snapshot, weights_folder, cfg, name, settings, tokenizer):
    """build/model.onnx made by the family's builder from the checkpoint and
    held to its float64 network: a language-model reranker's score logits
    (settings' "score_tokens"), a sequence classifier's logits, or an
    embedder's token states. Returns (checks, parameters, whether the
    graph gives scores rather than token states)."""
    family_name = families.of(settings, cfg)
    family = families.builder(family_name)
    checkpoint = graph_builder.open_checkpoint(weights_folder)
    parameters = checkpoint_parameters(weights_folder, snapshot, settings)
    weights, cfg = family.prepare_weights(checkpoint, cfg)
    fp32_bytes = 4 * checkpoint.parameters()
    graph = build / "model.onnx"

    def needs(capability, what):
        if not hasattr(family, capability):
            raise SystemExit(f"{name}: the {family_name!r} family's builder makes no {what}")
        return getattr(family, capability)

    if (settings or {}).get("score_tokens"):
        # A reranker that is a language model: its head's logits of the
        # true and false tokens at the last position.
        numpy_score = needs("numpy_score", "language-model reranker")
        score_tokens = token_ids(tokenizer, settings["score_tokens"])
        graph_builder.build_into(build, family.build_graph, weights, cfg, fp32_bytes, score_tokens=score_tokens)
        worst = language_model_reranker_figure(graph, tokenizer, lambda ids: numpy_score(weights, cfg, ids, score_tokens))
        logits_held(name, worst, "score logits")
        return {"max_abs_logit_diff": worst, "score_token_ids": list(score_tokens)}, parameters, True
    if any(a.endswith("ForSequenceClassification") for a in cfg.get("architectures", [])):
        numpy_logits = needs("numpy_sequence_logits", "sequence classifier")
        graph_builder.build_into(build, family.build_graph, weights, cfg, fp32_bytes, sequence_classifier=True)
        worst = sequence_classifier_figure(graph, tokenizer, lambda ids, type_ids: numpy_logits(weights, cfg, ids, type_ids))
        logits_held(name, worst, "logits")
        return {"max_abs_logit_diff": worst}, parameters, True
    graph_builder.build_into(build, family.build_graph, weights, cfg, fp32_bytes)
    return family.check_states(name, graph, weights, cfg, tokenizer), parameters, False


def ncnn_from_hub_snapshot(cache, snapshot, name, source, settings):
    """A Hub repository's snapshot to ncnn in `{cache}/models/NAME`: the same
    graph builder as its ONNX model (its family's, from its safetensors),
    made ncnn-friendly and checked by convert_to_ncnn."""
    snapshot, out = Path(snapshot), cache / "models" / name
    if manifest_is_current(out) and (out / "model.ncnn.param").is_file():
        recorded = json.loads((out / "manifest.json").read_text())["source"]
        if recorded.get("hub") == source and recorded.get("inferred") == settings:
            print(f"{name}: up to date in {out}")
            return
    cfg = json.loads((snapshot / "config.json").read_text())
    family = converted_family(settings, cfg)
    weights_file, converted = torch_bin.weights_file(snapshot, out)
    checkpoint = graph_builder.open_checkpoint(weights_file.parent if converted else snapshot)
    weights, cfg = family.prepare_weights(checkpoint, cfg)
    max_tokens = min(int((settings or {}).get("max_tokens", {}).get("value", 512)), int(cfg.get("max_position_embeddings", 512)))
    # The tokenizer outside `out`, whose every file the manifest lists.
    with tempfile.TemporaryDirectory() as work:
        tokenizer = Path(work) / "tokenizer.json"
        hub_tokenizer(snapshot, tokenizer)
        convert_to_ncnn(cache, out, family, weights, cfg, tokenizer, max_tokens, False,
                        {"hub": source, "inferred": settings, **torch_bin.provenance(converted)})
