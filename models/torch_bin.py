"""PyTorch checkpoints (`pytorch_model.bin`, or its shards and
`pytorch_model.bin.index.json`) read without torch and without running any
of their pickled code, and converted once to safetensors.

torch.save writes a zip (torch 1.6 and later): `PREFIX/data.pkl`, a pickle
of the state dict whose tensors name their storages by persistent id, and
each storage's bytes in `PREFIX/data/KEY` (`PREFIX/byteorder` says their
byte order). Before 1.6 it wrote the legacy format, read here too: pickles
one after another (magic number, protocol 1001, system info, the state
dict, the storage keys), then each storage's element count and bytes.
torch 0.3's tar format is refused.

A pickle can call any importable function. The one here is read by an
Unpickler whose find_class answers only the globals torch's own
`weights_only=True` loader allows that a plain state dict needs:
collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
_rebuild_parameter, and the typed storage classes (torch.FloatStorage,
torch.HalfStorage, torch.BFloat16Storage, torch.LongStorage, ...). Each is
answered by an inert stand-in written here: nothing from torch or any other
module is ever called. Every other global (os.system, builtins.eval,
__builtin__.exec, torch._utils._rebuild_tensor_v3, ...) is refused with its
name, before anything it names is imported. The state dict must map names to
tensors; a tensor's storage offset, size and strides are checked against its
storage before it is read.

Dtypes: float32, float16 and the integer and bool types are kept as they
are; bfloat16 (which numpy, and so safetensors.numpy, cannot hold) is widened
to float32, exactly. The graph builders compute in float32 either way.

    python models/torch_bin.py CHECKPOINT_OR_SNAPSHOT OUT.safetensors
"""
import collections
import hashlib
import json
import os
import pickle
import struct
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

WEIGHTS = "pytorch_model.bin"
INDEX = "pytorch_model.bin.index.json"
# The key of a converted file's metadata that records its conversion: its sources and their sha256.
CONVERSION = "eeane_conversion"

# torch's typed storage classes: their element type (little-endian), "bf16" for bfloat16.
STORAGES = {
    "DoubleStorage": "f8",
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "BFloat16Storage": "bf16",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "b1",
}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


class Refused(Exception):
    """A checkpoint that is not a plain state dict, or names a global it may not."""


class _StorageType:
    def __init__(self, name):
        self.name = name
        self.dtype = STORAGES[name]

    def __call__(self, *args):
        raise Refused(f"calls torch.{self.name}, which a state dict never does")


class _Storage:
    """A storage named by persistent id: its element type, key and element count (bytes read later)."""

    def __init__(self, kind, key, numel):
        self.kind, self.key, self.numel = kind, key, numel
        self.view_of = None  # legacy views: (root storage, offset in elements)


class _Tensor:
    """What _rebuild_tensor_v2 describes: read once the whole pickle is."""

    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    def __setstate__(self, state):
        raise Refused("sets the state of a tensor, which a state dict never does")

    def __reduce__(self):
        raise Refused("a tensor stand-in is not to be pickled")


class _StateDict(collections.OrderedDict):
    """collections.OrderedDict, whose state (the `_metadata` torch keeps on
    a state dict) is dropped rather than set as attributes."""

    def __setstate__(self, state):
        pass


def _ordered_dict(*args):
    if args:
        raise Refused("builds an OrderedDict from arguments, which torch never pickles")
    return _StateDict()


def _is_ints(value):
    return isinstance(value, tuple) and all(type(v) is int for v in value)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    if not isinstance(storage, _Storage) or type(storage_offset) is not int or not _is_ints(size) or not _is_ints(stride) or len(size) != len(stride):
        raise Refused("calls torch._utils._rebuild_tensor_v2 with arguments that do not describe a tensor")
    if not isinstance(requires_grad, bool) or not isinstance(backward_hooks, dict) or backward_hooks:
        raise Refused("calls torch._utils._rebuild_tensor_v2 with backward hooks, which a state dict never has")
    return _Tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    if not isinstance(data, _Tensor) or not isinstance(backward_hooks, dict) or backward_hooks:
        raise Refused("calls torch._utils._rebuild_parameter with arguments that do not describe a parameter")
    return data


ALLOWED = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in STORAGES},
}


class _Unpickler(pickle.Unpickler):
    """Answers only ALLOWED's globals, with stand-ins; storages by persistent id."""

    def __init__(self, file, legacy=False):
        super().__init__(file, encoding="utf-8")
        self.legacy = legacy
        self.storages = {}

    def find_class(self, module, name):
        # Called for GLOBAL, STACK_GLOBAL, INST, OBJ and the extension registry's codes alike,
        # with the names as the pickle spells them (Python 2's __builtin__ included).
        allowed = ALLOWED.get((module, name))
        if allowed is None:
            raise Refused(f"its pickle names the global {module}.{name}, which eeane does not allow (only what a plain state dict "
                          f"needs); nothing of it was run or kept")
        return allowed

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or len(pid) != (6 if self.legacy else 5) or pid[0] != "storage":
            raise Refused(f"its pickle names a persistent object that is not a storage: {pid!r:.80}")
        kind, key, _location, numel = pid[1:5]
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or "/" in key or type(numel) is not int or numel < 0:
            raise Refused(f"its pickle names a storage it does not describe: {pid!r:.80}")
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(kind, key, numel)
        elif storage.kind is not kind:
            raise Refused(f"its pickle gives storage {key} two types")
        if self.legacy and pid[5] is not None:
            view = pid[5]
            if not (isinstance(view, tuple) and len(view) == 3 and isinstance(view[0], str) and _is_ints(view[1:])):
                raise Refused(f"its pickle names a storage view it does not describe: {pid!r:.80}")
            view_key, offset, view_size = view
            view = _Storage(kind, view_key, view_size)
            view.view_of = (storage, offset)
            return view
        return storage


def _element(kind, little):
    order = "<" if little else ">"
    return np.dtype(order + ("u2" if kind == "bf16" else kind))


def _materialize(name, tensor, storage_array):
    """The tensor's elements from its storage (a 1-D array of the storage's type), as a C-contiguous array."""
    size, stride, offset = tensor.size, tensor.stride, tensor.offset
    data = storage_array(tensor.storage)
    if offset < 0 or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise Refused(f"tensor {name!r} has a negative size, stride or offset")
    if 0 in size:
        array = np.zeros(size, data.dtype)
    else:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= data.size:
            raise Refused(f"tensor {name!r} (offset {offset}, size {list(size)}, stride {list(stride)}) reaches element {last} "
                          f"of a storage of {data.size}")
        if np.prod(size, dtype=object) > 1024 * data.size:
            raise Refused(f"tensor {name!r} (size {list(size)}) repeats its storage of {data.size} elements more than 1024 times")
        array = np.ndarray(size, data.dtype, buffer=data, offset=offset * data.itemsize, strides=[s * data.itemsize for s in stride]).copy()
    if tensor.storage.kind.dtype == "bf16":
        # bfloat16 is float32's top half: widened exactly.
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(array.dtype.newbyteorder("="), copy=False)


def _state_dict(name, obj, storage_array, widened, release=None):
    """The tensors of a state dict, each read from its storage; `release(key)`
    once the last tensor of a storage is (so that a storage's bytes need not
    outlive its tensors)."""
    if not isinstance(obj, dict):
        raise Refused(f"holds a {type(obj).__name__}, not a state dict")
    remaining = collections.Counter(v.storage.key for v in obj.values() if isinstance(v, _Tensor))
    tensors = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise Refused(f"has a key that is not a name: {key!r:.80}")
        if isinstance(value, _Tensor):
            tensors[key] = _materialize(key, value, storage_array)
            if value.storage.kind.dtype == "bf16":
                widened.append(key)
            remaining[value.storage.key] -= 1
            if release and not remaining[value.storage.key]:
                release(value.storage.key)
        elif value is None or isinstance(value, (bool, int, float, str)):
            print(f"{name}: {key!r} is a {type(value).__name__}, not a tensor: left out", file=sys.stderr)
        else:
            kind = "dict" if isinstance(value, dict) else "list" if isinstance(value, list) else type(value).__name__
            raise Refused(f"is not a flat state dict of tensors: its {key!r} is a {kind}")
    return tensors


def _read_zip(path, archive, widened):
    pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise Refused(f"is a zip but not torch.save's: {len(pickles)} data.pkl records")
    prefix = pickles[0][: -len("data.pkl")]
    names = set(archive.namelist())
    little = archive.read(prefix + "byteorder").strip() != b"big" if prefix + "byteorder" in names else True
    with archive.open(pickles[0]) as f:
        unpickler = _Unpickler(f)
        obj = unpickler.load()
    cache = {}

    def storage_array(storage):
        if storage.key not in cache:
            dtype = _element(storage.kind.dtype, little)
            record = f"{prefix}data/{storage.key}"
            if record not in names:
                raise Refused(f"names storage {storage.key}, which it does not hold")
            info = archive.getinfo(record)
            if info.file_size != storage.numel * dtype.itemsize:
                raise Refused(f"storage {storage.key} holds {info.file_size} bytes, not the {storage.numel * dtype.itemsize} its pickle says")
            cache[storage.key] = np.frombuffer(archive.read(record), dtype, count=storage.numel)
        return cache[storage.key]

    return _state_dict(path.name, obj, storage_array, widened, release=lambda key: cache.pop(key, None))


def _read_legacy(path, f, widened):
    magic = _Unpickler(f).load()
    if magic != LEGACY_MAGIC:
        raise Refused("is neither a zip nor torch's legacy format")
    protocol = _Unpickler(f).load()
    if protocol != LEGACY_PROTOCOL:
        raise Refused(f"is in torch's legacy format, protocol {protocol!r:.40}, not {LEGACY_PROTOCOL}")
    info = _Unpickler(f).load()
    little = not isinstance(info, dict) or info.get("little_endian", True)
    unpickler = _Unpickler(f, legacy=True)
    obj = unpickler.load()
    keys = _Unpickler(f).load()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise Refused("is in torch's legacy format without its list of storage keys")
    roots = {}
    for key in keys:
        storage = unpickler.storages.get(key)
        if storage is None:
            raise Refused(f"holds storage {key}, which its pickle never names")
        dtype = _element(storage.kind.dtype, little)
        (numel,) = struct.unpack("<q" if little else ">q", f.read(8))
        data = f.read(numel * dtype.itemsize) if numel == storage.numel else b""
        if numel != storage.numel or len(data) != numel * dtype.itemsize:
            raise Refused(f"storage {key} holds {len(data)} bytes, not the {storage.numel * dtype.itemsize} its pickle says")
        roots[key] = np.frombuffer(data, dtype)

    def storage_array(storage):
        if storage.view_of is not None:
            root, offset = storage.view_of
            data = storage_array(root)
            if offset < 0 or offset + storage.numel > data.size:
                raise Refused(f"storage view {storage.key} reaches past storage {root.key}")
            return data[offset: offset + storage.numel]
        if storage.key not in roots:
            raise Refused(f"names storage {storage.key}, which it does not hold")
        return roots[storage.key]

    return _state_dict(path.name, obj, storage_array, widened)


def load(path, widened=None):
    """A checkpoint's tensors by name, as numpy arrays (the names of those
    widened from bfloat16 appended to `widened`); Refused names what is wrong."""
    path, widened = Path(path), [] if widened is None else widened
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return _read_zip(path, archive, widened)
        if tarfile.is_tarfile(path):
            raise Refused("is in torch 0.3's tar format, which eeane does not read: save it again with a torch of 1.6 or later, "
                          "or as safetensors")
        with open(path, "rb") as f:
            if f.peek(1)[:1] != b"\x80":
                raise Refused("is not a PyTorch checkpoint (neither a zip nor a pickle)")
            return _read_legacy(path, f, widened)
    except Refused as e:
        raise Refused(f"{path.name}: {e}") from None
    except Exception as e:  # a malformed pickle or zip: whatever the reader raised
        raise Refused(f"{path.name}: cannot be read as a PyTorch checkpoint: {type(e).__name__}: {e}") from None


def checkpoint_files(snapshot):
    """The PyTorch weights of a snapshot without safetensors, in order:
    pytorch_model.bin, else the shards pytorch_model.bin.index.json names;
    [] when it has safetensors or no PyTorch weights."""
    snapshot = Path(snapshot)
    if any(snapshot.glob("*.safetensors")):
        return []
    if (snapshot / WEIGHTS).is_file():
        return [WEIGHTS]
    if not (snapshot / INDEX).is_file():
        return []
    weight_map = json.loads((snapshot / INDEX).read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise Refused(f"{INDEX} has no weight_map")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not isinstance(shard, str) or "/" in shard or shard.startswith(".") or not shard.endswith(".bin"):
            raise Refused(f"{INDEX} names {shard!r} as a shard, not a .bin file beside it")
        if not (snapshot / shard).is_file():
            raise Refused(f"{INDEX} names the shard {shard}, which the snapshot does not hold")
    return shards


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_checkpoint(snapshot, files, widened=None):
    """Every tensor of `files` (a snapshot's checkpoint files), held to the index when sharded."""
    tensors = {}
    for name in files:
        for key, array in load(Path(snapshot) / name, widened).items():
            if key in tensors:
                raise Refused(f"{name} holds {key!r}, which another shard holds too")
            tensors[key] = array
    if files != [WEIGHTS]:
        missing = sorted(set(json.loads((Path(snapshot) / INDEX).read_text())["weight_map"]) - set(tensors))
        if missing:
            raise Refused(f"{INDEX} names {len(missing)} tensors its shards do not hold, e.g. {missing[0]!r}")
    return tensors


def conversion_of(path):
    """The conversion a safetensors file records (CONVERSION in its metadata), or None."""
    try:
        with safe_open(str(path), "np") as f:
            recorded = (f.metadata() or {}).get(CONVERSION)
        return json.loads(recorded) if recorded else None
    except Exception:
        return None


def weights_file(snapshot, out, needed=True):
    """The safetensors file a graph is built from, and the conversion's record
    for the manifest (None when nothing was converted): the snapshot's own
    model.safetensors; or, when the repository ships PyTorch weights only
    (and `needed`), `out/model.safetensors` converted from them. The
    conversion is done once: a model.safetensors in `out` that records the
    same files with the same sha256 is kept. The whole checkpoint is read
    (or refused, with SystemExit naming why) before anything is written;
    the file is written under a temporary name and renamed into place."""
    snapshot, out = Path(snapshot), Path(out)
    try:
        files = checkpoint_files(snapshot) if needed else []
        if not files:
            return snapshot / "model.safetensors", None
        sources = {name: sha256(snapshot / name) for name in files}
        target = out / "model.safetensors"
        kept = conversion_of(target) if target.is_file() else None
        if kept and kept.get("from") == sources:
            print(f"{out.name}: model.safetensors was converted from {', '.join(files)} before (same sha256): kept")
            return target, kept
        widened = []
        tensors = load_checkpoint(snapshot, files, widened)
    except Refused as e:
        raise SystemExit(f"{out.name}: refused: {e}") from None
    record = {"from": sources, "to": "model.safetensors", "tensors": len(tensors), "dtypes": _dtypes(tensors),
              "bfloat16_widened_to_float32": len(widened)}
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.tmp"
    try:
        save_file(tensors, str(tmp), metadata={"format": "pt", CONVERSION: json.dumps(record, sort_keys=True)})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as the folder's other files (safetensors writes 0600)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{out.name}: {len(tensors)} tensors read from {', '.join(files)} without running pickled code, written to model.safetensors "
          f"({', '.join(f'{n} {d}' for d, n in record['dtypes'].items())}; {len(widened)} bfloat16 widened to float32)")
    return target, record


def provenance(record):
    """What a prepared model's manifest records of a conversion (in its "source"): {} when none."""
    return {"converted_weights": record} if record else {}


def _dtypes(tensors):
    return dict(sorted(collections.Counter(str(a.dtype) for a in tensors.values()).items()))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    try:
        tensors = load_checkpoint(source, checkpoint_files(source)) if source.is_dir() else load(source)
    except Refused as e:
        raise SystemExit(f"refused: {e}") from None
    save_file(tensors, str(out), metadata={"format": "pt"})
    print(f"{out}: {len(tensors)} tensors ({_dtypes(tensors)})")


if __name__ == "__main__":
    main()
