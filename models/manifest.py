"""A prepared model's manifest.json: every file of its folder with its
sha256, where it came from and the checks it passed. A folder with a current
manifest (this converter's version, every file's hash still matching) has
nothing to do; the manifest is written last, so a folder with one is complete."""
import json
import os
import shutil

from torch_bin import sha256  # one way to hash a file, for manifests and converted weights

CONVERTER_VERSION = 1


def manifest_is_current(out, recipe=None):
    """Whether `out` holds a complete model of this converter (made by
    `recipe`, when given) whose files are those its manifest lists."""
    manifest = out / "manifest.json"
    if not manifest.exists():
        return False
    m = json.loads(manifest.read_text())
    if m.get("converter_version") != CONVERTER_VERSION:
        return False
    if recipe is not None and m.get("source", {}).get("recipe") != recipe:
        return False
    return all((out / name).exists() and sha256(out / name) == digest for name, digest in m["files"].items())


def write_manifest(out, source, checks, parameters=None):
    """Every file of `out` with its sha256 (a graph's external data too, so
    that a changed data file makes the model stale and fails its load), the
    source and the checks; `parameters` ({"count", "from"}) when known."""
    files = {p.name: sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name not in ("manifest.json", "manifest.json.tmp")}
    manifest = {"converter_version": CONVERTER_VERSION, "source": source, "checks": checks, "files": files}
    if parameters:
        manifest["parameters"] = parameters
    # Written last and renamed into place: a directory with a manifest is complete.
    (out / "manifest.json.tmp").write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(out / "manifest.json.tmp", out / "manifest.json")


def derived_target(cache, name, source, prepare_source, recipe=None):
    """The output directory of a model made from the model `source`, or None
    when its manifest says it is current (and was made by `recipe`, when
    given); runs `prepare_source(cache)` first when `source` is not."""
    out = cache / "models" / name
    if manifest_is_current(out, recipe):
        print(f"{name}: up to date in {out}")
        return None
    if not manifest_is_current(cache / "models" / source):
        prepare_source(cache)
    return out


def publish(build, out, source, checks, parameters=None):
    """Moves what `build` holds into `out`, then writes the manifest. The old
    manifest goes first, so that from the first rename on the folder reads as
    not prepared until the new manifest is written; each file arrives whole,
    by rename; the graph comes after its external data; a file of an earlier
    build that this one did not make (its external data) is removed."""
    (out / "manifest.json").unlink(missing_ok=True)
    made = sorted((p for p in build.iterdir() if p.is_file()), key=lambda p: p.name == "model.onnx")
    for path in made:
        os.replace(path, out / path.name)
    names = {p.name for p in made}
    for path in out.iterdir():
        if path.is_file() and path.name not in names:
            path.unlink()
    shutil.rmtree(build)
    write_manifest(out, source, checks, parameters)
