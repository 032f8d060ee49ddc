#!/usr/bin/env python3
"""The Hub look-alike's repositories for tests/hub_bin.rs: PyTorch
checkpoints only, made without torch (the payloads are pickle opcodes
written here, in zips written by the standard library's zipfile):

  eeane-test/bert-bin-tiny          tests/hub/fixtures/bert-bin-tiny: pytorch_model.bin
  eeane-test/bert-bin-sharded-tiny  the same weights in two shards and an index
  eeane-test/bin-os-system          bert-bin-tiny whose pickle calls os.system first
                                    (GLOBAL 'os system', REDUCE), as torch's zip lays it out
  eeane-test/bin-sharded-eval       the sharded one whose second shard calls
                                    builtins.eval (STACK_GLOBAL, REDUCE)
  eeane-test/bin-legacy-exec        bert-bin-tiny in torch's legacy (pre-1.6)
                                    format whose pickle calls __builtin__.exec

Each payload would create OUT/PWNED-<repository> if it ran: under plain
pickle it does (tests/hub/torch_bin_cases.py shows it), under eeane it must not.

    python3 tests/hub/make_bin_repos.py OUT
"""
import io
import pickle
import pickletools
import shutil
import struct
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"


def text(value):
    """A pickle BINUNICODE string, with no memo opcode."""
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def call(module, name, argument, stack_global=False):
    """Opcodes that call module.name(argument): GLOBAL (protocol 0-3) or STACK_GLOBAL (4)."""
    callable_ = text(module) + text(name) + b"\x93" if stack_global else f"c{module}\n{name}\n".encode()
    return callable_ + text(argument) + b"\x85R"


def with_first_item(pkl, key, value_opcodes):
    """A state dict pickle with (key, value) inserted as its first item: right after the
    first MARK, so that the value is built before any of the dict's tensors."""
    mark = next(pos for op, _, pos in pickletools.genops(pkl) if op.name == "MARK")
    return pkl[: mark + 1] + text(key) + value_opcodes + pkl[mark + 1:]


def zip_pickle(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def rewrite_zip(src, dst, pkl):
    """torch's zip `src` with its data.pkl replaced by `pkl`, every other record as it is (stored, as torch stores them)."""
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            out.writestr(info, pkl if info.filename.endswith("/data.pkl") else z.read(info))


def legacy_parts(data):
    """torch's legacy file cut into its five pickles (magic, protocol, system info, state dict, storage keys) and the storages' bytes."""
    parts, pos = [], 0
    for _ in range(5):
        end = pos + max(p for _, _, p in pickletools.genops(data[pos:])) + 1
        parts.append(data[pos:end])
        pos = end
    return parts, data[pos:]


def legacy_from_zip(src):
    """A torch zip checkpoint rewritten in torch's legacy format, with the standard library
    alone: magic number, protocol and system info; the same pickle, each persistent id
    given legacy's sixth field (None: no view); the storage keys; then each storage's
    element count and bytes."""
    with zipfile.ZipFile(src) as z:
        prefix = next(n for n in z.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]
        pkl = z.read(prefix + "data.pkl")
        ops = list(pickletools.genops(pkl))
        closes = []
        for i, (op, _, _) in enumerate(ops):
            if op.name == "BINPERSID":
                j = i - 1
                while ops[j][0].name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
                    j -= 1
                assert ops[j][0].name == "TUPLE", ops[j]
                closes.append(ops[j][2])
        body, last = bytearray(), 0
        for close in closes:
            body += pkl[last:close] + b"N"
            last = close
        body += pkl[last:]
        keys = sorted({n.rsplit("/", 1)[1] for n in z.namelist() if n.startswith(prefix + "data/")}, key=int)
        sizes = storage_sizes(pkl)
        storages = b"".join(struct.pack("<q", len(z.read(f"{prefix}data/{k}")) // sizes[k]) + z.read(f"{prefix}data/{k}") for k in keys)
    header = b"".join(pickle.dumps(v, protocol=2) for v in (0x1950A86A20F9469CFC6C, 1001,
                                                              {"protocol_version": 1001, "little_endian": True,
                                                               "type_sizes": {"short": 2, "int": 4, "long": 4}}))
    return header + bytes(body) + pickle.dumps(keys, protocol=2) + storages


def storage_sizes(pkl):
    """Each storage key's element size, from the persistent ids (read by models/torch_bin.py's
    restricted Unpickler, which imports nothing)."""
    import numpy as np

    sys.path.insert(0, str(HERE.parents[1] / "models"))
    import torch_bin

    unpickler = torch_bin._Unpickler(io.BytesIO(pkl))
    unpickler.load()
    return {key: 2 if s.kind.dtype == "bf16" else np.dtype(s.kind.dtype).itemsize for key, s in unpickler.storages.items()}


def copy_fixture(name, out):
    shutil.copytree(FIXTURES / name, out, ignore=shutil.ignore_patterns("reference.json"))


def main():
    out = Path(sys.argv[1])
    repos = out / "eeane-test"
    for name in ("bert-bin-tiny", "bert-bin-sharded-tiny"):
        copy_fixture(name, repos / name)

    marker = out / "PWNED-bin-os-system"
    evil = repos / "bin-os-system"
    copy_fixture("bert-bin-tiny", evil)
    pkl = with_first_item(zip_pickle(FIXTURES / "bert-bin-tiny/pytorch_model.bin"), "evil", call("os", "system", f"touch {marker}"))
    rewrite_zip(FIXTURES / "bert-bin-tiny/pytorch_model.bin", evil / "pytorch_model.bin", pkl)

    marker = out / "PWNED-bin-sharded-eval"
    evil = repos / "bin-sharded-eval"
    copy_fixture("bert-bin-sharded-tiny", evil)
    shard = FIXTURES / "bert-bin-sharded-tiny/pytorch_model-00002-of-00002.bin"
    payload = call("builtins", "eval", f"__import__('pathlib').Path({str(marker)!r}).touch()", stack_global=True)
    rewrite_zip(shard, evil / shard.name, with_first_item(zip_pickle(shard), "evil", payload))

    marker = out / "PWNED-bin-legacy-exec"
    evil = repos / "bin-legacy-exec"
    copy_fixture("bert-bin-tiny", evil)
    parts, storages = legacy_parts(legacy_from_zip(FIXTURES / "bert-bin-tiny/pytorch_model.bin"))
    parts[3] = with_first_item(parts[3], "evil", call("__builtin__", "exec", f"open({str(marker)!r}, 'w').close()"))
    (evil / "pytorch_model.bin").write_bytes(b"".join(parts) + storages)


if __name__ == "__main__":
    main()
