#!/usr/bin/env python3
"""models/torch_bin.py on its own, without torch (tests/hub_bin.rs runs it):

- tests/fixtures/torch_bin/views.bin and views-legacy.bin (written by torch:
  views with strides and offsets, shared storages, a Parameter, every typed
  storage's dtype) read exactly as torch read them (expected.json);
- each forbidden global refused by name, whichever opcode names it (GLOBAL
  with REDUCE, STACK_GLOBAL, INST, a global never called, a torch function
  outside the list), in torch's zip and in its legacy format, with the
  payload shown live under plain pickle first;
- malformed files refused: torch 0.3's tar, a tensor reaching past its
  storage, a storage shorter than its pickle says, not a state dict, a
  nested one;
- weights_file: a refused shard leaves no folder; a good checkpoint is
  converted once (kept on the second call) with its sources' sha256, and the
  snapshot's files are left as they were.

    python tests/hub/torch_bin_cases.py   (prints one line per case; exits non-zero on a failure)
"""
import hashlib
import io
import json
import pickle
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "models"))
sys.path.insert(0, str(HERE))
import make_bin_repos as craft  # noqa: E402
import torch_bin  # noqa: E402

VIEWS = HERE.parent / "fixtures" / "torch_bin"
BERT = HERE / "fixtures" / "bert-bin-tiny" / "pytorch_model.bin"
failures = []


def case(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)


def refused(path, *wanted):
    """Whether torch_bin refuses `path` with a message holding each of `wanted`; the message."""
    try:
        torch_bin.load(path)
    except torch_bin.Refused as e:
        return all(w in str(e) for w in wanted), str(e)
    return False, "read without refusal"


def views():
    expected = json.loads((VIEWS / "expected.json").read_text())["tensors"]
    for name in ("views.bin", "views-legacy.bin"):
        widened = []
        got = torch_bin.load(VIEWS / name, widened)
        wrong = [k for k, e in expected.items()
                 if k not in got or str(got[k].dtype) != e["dtype"] or list(got[k].shape) != e["shape"]
                 or not np.array_equal(got[k].ravel(), np.asarray(e["values"], dtype=e["dtype"]))
                 or not got[k].flags.c_contiguous]
        case(f"{name}: {len(got)} tensors (views, offsets, stride 0, shared storage, Parameter, 10 dtypes) as torch read them",
             not wrong and len(got) == len(expected) and sorted(widened) == ["bfloat16", "bfloat16_transposed"], f"differ: {wrong}" if wrong else "")


def forbidden_globals(work):
    bert_pkl = craft.zip_pickle(BERT)

    # The payload is live: plain pickle (persistent ids answered with None) runs it before failing on torch.
    marker = work / "PWNED-plain-pickle"
    live = craft.with_first_item(bert_pkl, "evil", craft.call("os", "system", f"touch {marker}"))

    class Plain(pickle.Unpickler):
        def persistent_load(self, pid):
            return None

    try:
        Plain(io.BytesIO(live)).load()
    except Exception:
        pass
    case("the os.system payload runs under plain pickle", marker.exists())
    marker.unlink(missing_ok=True)

    cases = [
        ("GLOBAL os.system, REDUCE", "os.system", craft.call("os", "system", f"touch {marker}")),
        ("STACK_GLOBAL builtins.eval, REDUCE", "builtins.eval", craft.call("builtins", "eval", f"open({str(marker)!r}, 'w')", stack_global=True)),
        ("Python 2's __builtin__.exec", "__builtin__.exec", craft.call("__builtin__", "exec", f"open({str(marker)!r}, 'w')")),
        ("INST posix.system", "posix.system", b"(" + craft.text(f"touch {marker}") + b"iposix\nsystem\n"),
        ("subprocess.Popen, never called", "subprocess.Popen", b"csubprocess\nPopen\n"),
        ("a torch function outside the list", "torch._utils._rebuild_tensor_v3", b"ctorch._utils\n_rebuild_tensor_v3\n"),
        ("copyreg._reconstructor", "copyreg._reconstructor", b"ccopyreg\n_reconstructor\n"),
        ("torch.load itself", "torch.load", b"ctorch\nload\n"),
    ]
    for what, name, value in cases:
        bad = work / "bad.bin"
        craft.rewrite_zip(BERT, bad, craft.with_first_item(bert_pkl, "evil", value))
        ok, message = refused(bad, name, "bad.bin")
        case(f"zip, {what}: refused naming {name}", ok and not marker.exists(), message)
    # The global inside a tensor's arguments rather than a value of the dict.
    hooks = bert_pkl.replace(b"h\x00)R", b"cos\nsystem\n", 1)
    bad = work / "hooks.bin"
    craft.rewrite_zip(BERT, bad, hooks)
    ok, message = refused(bad, "os.system")
    case("zip, os.system as a tensor's backward hooks: refused naming it", ok, message)

    parts, storages = craft.legacy_parts(craft.legacy_from_zip(BERT))
    legacy = work / "legacy.bin"
    legacy.write_bytes(b"".join(parts) + storages)
    same = torch_bin.load(legacy)
    zipped = torch_bin.load(BERT)
    case("legacy format written from the zip reads the same tensors", set(same) == set(zipped) and all(np.array_equal(same[k], zipped[k]) for k in zipped))
    parts[3] = craft.with_first_item(parts[3], "evil", craft.call("__builtin__", "exec", f"open({str(marker)!r}, 'w').close()"))
    legacy.write_bytes(b"".join(parts) + storages)
    ok, message = refused(legacy, "__builtin__.exec")
    case("legacy, __builtin__.exec: refused naming it", ok and not marker.exists(), message)
    parts, storages = craft.legacy_parts(craft.legacy_from_zip(BERT))
    parts[2] = craft.call("os", "system", f"touch {marker}").join([b"\x80\x02", b"."])
    legacy.write_bytes(b"".join(parts) + storages)
    ok, message = refused(legacy, "os.system")
    case("legacy, os.system in the system-info pickle: refused naming it", ok and not marker.exists(), message)


def malformed(work):
    tar = work / "old.bin"
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("pickle")
        info.size = 4
        t.addfile(info, io.BytesIO(b"\x80\x02N."))
    ok, message = refused(tar, "tar format")
    case("torch 0.3's tar format: refused", ok, message)

    pkl = craft.zip_pickle(BERT)
    # The first tensor (the word embeddings, size (512, 64), stride (64, 1)) made 512 x 65: past its storage.
    reach = work / "reach.bin"
    craft.rewrite_zip(BERT, reach, pkl.replace(b"M\x00\x02K\x40\x86", b"M\x00\x02K\x41\x86", 1))
    ok, message = refused(reach, "reaches element")
    case("a tensor reaching past its storage: refused", ok, message)

    short = work / "short.bin"
    with zipfile.ZipFile(BERT) as z, zipfile.ZipFile(short, "w") as out:
        for info in z.infolist():
            data = z.read(info)
            out.writestr(info, data[:-4] if "/data/" in info.filename and len(data) > 4 else data)
    ok, message = refused(short, "bytes, not the")
    case("a storage shorter than its pickle says: refused", ok, message)

    listed = work / "list.bin"
    craft.rewrite_zip(BERT, listed, pickle.dumps([1, 2, 3], protocol=2))
    ok, message = refused(listed, "not a state dict")
    case("a pickle that is not a state dict: refused", ok, message)

    nested = work / "nested.bin"
    craft.rewrite_zip(BERT, nested, pickle.dumps({"state_dict": {}, "epoch": 3}, protocol=2))
    ok, message = refused(nested, "not a flat state dict of tensors", "'state_dict' is a dict")
    case("a checkpoint nesting its state dict: refused", ok, message)

    junk = work / "junk.bin"
    junk.write_bytes(b"not a checkpoint at all")
    ok, message = refused(junk, "not a PyTorch checkpoint")
    case("bytes that are neither zip nor pickle: refused", ok, message)


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def weights_file(work):
    snapshot = work / "snapshot"
    shutil.copytree(HERE / "fixtures" / "bert-bin-sharded-tiny", snapshot)
    shard = snapshot / "pytorch_model-00002-of-00002.bin"
    good = shard.read_bytes()
    craft.rewrite_zip(HERE / "fixtures" / "bert-bin-sharded-tiny" / shard.name, shard,
                      craft.with_first_item(craft.zip_pickle(shard), "evil", craft.call("os", "system", "true")))
    out = work / "models" / "hf--x--y"
    try:
        torch_bin.weights_file(snapshot, out)
        message = "converted"
    except SystemExit as e:
        message = str(e)
    case("a snapshot whose second shard names os.system: refused, no folder made",
         "os.system" in message and "pytorch_model-00002-of-00002.bin" in message and not out.exists(), message)

    shard.write_bytes(good)
    before = digest(snapshot)
    path, record = torch_bin.weights_file(snapshot, out)
    files = sorted(p.name for p in out.iterdir())
    case("the sharded checkpoint converted to out/model.safetensors, nothing else left there",
         path == out / "model.safetensors" and files == ["model.safetensors"], f"{files}")
    case("the record names each shard's sha256", record["from"] == {k: v for k, v in before.items() if k.endswith(".bin")}, json.dumps(record))
    from safetensors.numpy import load_file

    converted = load_file(str(path))
    reference = torch_bin.load(BERT)
    case("the converted tensors are the single file's", set(converted) == set(reference) and all(np.array_equal(converted[k], reference[k]) for k in reference))
    stamp = path.stat().st_mtime_ns
    again, kept = torch_bin.weights_file(snapshot, out)
    case("converted once: the second call keeps the file", again == path and kept == record and path.stat().st_mtime_ns == stamp)
    case("the snapshot's files are left as they were", digest(snapshot) == before)
    own, none = torch_bin.weights_file(HERE / "fixtures" / "qwen3-tiny", out)
    case("a snapshot with safetensors is read as it is", own == HERE / "fixtures" / "qwen3-tiny" / "model.safetensors" and none is None)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        views()
        forbidden_globals(work)
        malformed(work)
        weights_file(work)
    print(f"{len(failures)} failures" if failures else "all cases passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
