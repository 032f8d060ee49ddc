"""A copy of a prepared CUDA model folder whose fp16 graph runs GELU as it
did before cuBLASLt's epilogue: each ai.eeane.cuda:GemmFastGelu written back
to MatMul and com.microsoft's BiasGelu (erf, its own kernel), the manifest's
sha256 set to match (eeane refuses a file its manifest does not name).
For the A/B of tests/gpu/cuda_load.sh (LOAD_MODEL_DIR).

    python tests/gpu/unfused_twin.py SRC_DIR DST_DIR
"""
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
import onnx  # noqa: E402

import gpu_graph  # noqa: E402
from torch_bin import sha256  # noqa: E402  the manifests' one way to hash a file

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
graph = dst / gpu_graph.GRAPH
model = onnx.load(str(graph), load_external_data=False)
count = gpu_graph.expand_gemm_fast_gelu(model, gelu="BiasGelu")
onnx.save_model(model, str(graph))
manifest = json.loads((dst / "manifest.json").read_text())
manifest["files"][gpu_graph.GRAPH] = sha256(graph)
(dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
print(f"{dst}: {count} GemmFastGelu written back to MatMul + BiasGelu")
