"""A copy of a prepared CUDA model folder whose fp16 graph is written back
to an earlier form, for the A/B of tests/gpu/cuda_load.sh (LOAD_MODEL_DIR),
the manifest's sha256 set to match (eeane refuses a file its manifest does
not name). What is written back, any of:

- `gelu`: each ai.eeane.cuda:GemmFastGelu to MatMul and com.microsoft's
  BiasGelu (erf, its own kernel), as before cuBLASLt's GELU epilogue
  (GemmBias stays);
- `qkv`: each MultiHeadAttention over three ai.eeane.cuda:GemmBias of one
  input to one com.microsoft Attention over the packed Q/K/V weight and
  bias, as before models/gpu_graph.py's `split_attention`.

    python tests/gpu/unfused_twin.py SRC_DIR DST_DIR [gelu] [qkv]   (default: gelu)
"""
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import gpu_graph  # noqa: E402
from torch_bin import sha256  # noqa: E402  the manifests' one way to hash a file


def join_attention(model):
    """`gpu_graph.split_attention` and its GemmBias undone: Q, K and V's
    weights and biases concatenated again into one Attention. Returns the
    count."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    nodes, gone, added, count = [], set(), [], 0
    for node in graph.node:
        if node.op_type != "MultiHeadAttention" or node.domain != "com.microsoft":
            continue
        inputs = list(node.input) + [""] * 5
        gemms = [producer.get(name) for name in inputs[:3]]
        readers = [n for n in graph.node for name in n.input if name in inputs[:3]]
        if (inputs[3] or any(inputs[5:]) or any(node.output[1:]) or len(readers) != 3
                or any(g is None or (g.op_type, g.domain) != ("GemmBias", gpu_graph.EEANE_CUDA_DOMAIN) for g in gemms)
                or len({g.input[0] for g in gemms}) != 1):
            continue
        weight = np.concatenate([numpy_helper.to_array(initializers[g.input[1]]) for g in gemms], axis=1)
        bias = np.concatenate([numpy_helper.to_array(initializers[g.input[2]]) for g in gemms])
        name = node.name
        added += [numpy_helper.from_array(weight, f"{name}_qkv_weight"), numpy_helper.from_array(bias, f"{name}_qkv_bias")]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        joined = helper.make_node("Attention", [gemms[0].input[0], f"{name}_qkv_weight", f"{name}_qkv_bias", inputs[4]], list(node.output)[:1],
                                  name=name, domain="com.microsoft", **attrs)
        nodes.append((node, joined))
        gone |= {id(g) for g in gemms}
        count += 1
    replacement = {id(old): new for old, new in nodes}
    dropped = {name for n in graph.node if id(n) in gone for name in n.input[1:]}
    kept = [replacement.get(id(n), n) for n in graph.node if id(n) not in gone]
    del graph.node[:]
    graph.node.extend(kept)
    still_read = {name for n in kept for name in n.input}
    inits = [t for t in graph.initializer if t.name not in dropped or t.name in still_read] + added
    del graph.initializer[:]
    graph.initializer.extend(inits)
    return count


src, dst = Path(sys.argv[1]), Path(sys.argv[2])
undo = set(sys.argv[3:]) or {"gelu"}
if undo - {"gelu", "qkv"}:
    raise SystemExit(f"unknown: {sorted(undo - {'gelu', 'qkv'})}; gelu, qkv")
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
graph = dst / gpu_graph.GRAPH
model = onnx.load(str(graph), load_external_data=False)
said = []
if "qkv" in undo:
    said.append(f"{join_attention(model)} MultiHeadAttention over GemmBias joined into Attention")
if "gelu" in undo:
    said.append(f"{gpu_graph.expand_cuda_operators(model, gelu='BiasGelu', ops=('GemmFastGelu',))} GemmFastGelu written back to MatMul + BiasGelu")
onnx.save_model(model, str(graph))
manifest = json.loads((dst / "manifest.json").read_text())
manifest["files"][gpu_graph.GRAPH] = sha256(graph)
(dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
print(f"{dst}: {'; '.join(said)}")
