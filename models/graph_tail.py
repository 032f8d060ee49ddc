"""The tail every family's graph can end in: sentence-transformers' pooling
(mean over the attention mask, the first token, or the last real token) and
its Dense modules, appended to a graph whose first output is token states
(`append_pooling_and_dense`), with the same tail in float64 numpy
(`numpy_pooling_and_dense`) to check it. Its nodes are named `st_*`, which
the GPU's fp16 graph keeps in fp32 (gpu_graph.fp32_nodes)."""
import json
import math
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graph_builder import open_checkpoint

# sentence-transformers' Dense activations by their torch class, as ONNX ops
# (GELU exact, by erf: ONNX's Gelu op needs opset 20).
DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": None,
    "torch.nn.modules.activation.Tanh": "Tanh",
    "torch.nn.modules.activation.ReLU": "Relu",
    "torch.nn.modules.activation.Sigmoid": "Sigmoid",
    "torch.nn.modules.activation.GELU": "gelu",
}


def dense_modules(snapshot, settings):
    """The Dense modules eeane read from the repository at `snapshot`
    (settings' "dense", in order), each (weight [out, in], bias or None,
    torch activation class), as append_pooling_and_dense takes them."""
    layers = []
    for module in (settings or {}).get("dense") or []:
        folder = Path(snapshot) / module["path"]
        cfg = json.loads((folder / "config.json").read_text())
        if not (folder / "model.safetensors").is_file():
            raise SystemExit(f"{module['path']} has no model.safetensors (eeane reads a Dense module's weights from safetensors only)")
        weights = open_checkpoint(folder)
        layers.append((weights["linear.weight"], weights.get("linear.bias") if cfg.get("bias", True) else None, module["activation"]))
    return layers


def append_pooling_and_dense(model, pooling, dense):
    """Ends a graph whose first output is token states [B, S, H] in
    sentence-transformers' pooling ("mean" over the attention mask, "cls",
    or "last_token" of right-padded rows) and its Dense modules, each (weight [out, in], bias or None, torch
    activation class), in order: the output becomes sentence_embedding
    [B, out]. Normalization stays outside (eeane's `normalize`)."""
    graph = model.graph
    states = graph.output[0].name
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:
        raise SystemExit(f"the graph's opset {opset} is older than 13; Dense modules are appended to graphs of opset 13 or later")
    counter = [0]

    def name(stem):
        counter[0] += 1
        return f"st_{stem}_{counter[0]}"

    def node(op, inputs, **attrs):
        out = name(op.lower())
        graph.node.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(stem, array):
        n = name(stem)
        graph.initializer.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    if pooling == "mean":
        mask = node("Unsqueeze", [node("Cast", ["attention_mask"], to=TensorProto.FLOAT), const("axes", np.array([2], np.int64))])
        axis = const("axis", np.array([1], np.int64))
        summed = node("ReduceSum", [node("Mul", [states, mask]), axis], keepdims=0)
        count = node("Max", [node("ReduceSum", [mask, axis], keepdims=0), const("tiny", np.array(1e-9, np.float32))])
        x = node("Div", [summed, count])
    elif pooling == "cls":
        x = node("Gather", [states, const("first", np.array(0, np.int64))], axis=1)
    elif pooling == "last_token":
        # Each right-padded row's last real token: index sum(mask) - 1.
        length = node("ReduceSum", ["attention_mask", const("axis", np.array([1], np.int64))], keepdims=1)
        x = node("GatherND", [states, node("Sub", [length, const("one", np.array(1, np.int64))])], batch_dims=1)
    else:
        raise SystemExit(f"pooling {pooling!r} in the graph: eeane pools there by mean, cls or last token")
    width = None
    for weight, bias, activation in dense:
        if activation not in DENSE_ACTIVATIONS:
            raise SystemExit(f"Dense activation {activation!r}: eeane applies {', '.join(DENSE_ACTIVATIONS)}")
        x = node("MatMul", [x, const("dense_w", np.asarray(weight, np.float32).T.copy())])
        if bias is not None:
            x = node("Add", [x, const("dense_b", np.asarray(bias, np.float32))])
        op = DENSE_ACTIVATIONS[activation]
        if op == "gelu":
            erf = node("Erf", [node("Div", [x, const("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
            x = node("Mul", [node("Mul", [x, const("half", np.array(0.5, np.float32))]), node("Add", [erf, const("one", np.array(1.0, np.float32))])])
        elif op is not None:
            x = node(op, [x])
        width = np.asarray(weight).shape[0]
    graph.node.append(helper.make_node("Identity", [x], ["sentence_embedding"], name="st_sentence_embedding"))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", width]))
    return model


def numpy_pooling_and_dense(states, mask, pooling, dense):
    """The same tail in float64: states [B, S, H], mask [B, S]."""
    states = np.asarray(states, np.float64)
    mask = np.asarray(mask, np.float64)[:, :, None]
    if pooling == "mean":
        x = (states * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    elif pooling == "last_token":
        x = states[np.arange(len(states)), mask[:, :, 0].sum(1).astype(np.int64) - 1]
    else:
        x = states[:, 0]
    activations = {None: lambda v: v, "Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0), "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
                   "gelu": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))}
    for weight, bias, activation in dense:
        x = x @ np.asarray(weight, np.float64).T + (np.asarray(bias, np.float64) if bias is not None else 0.0)
        x = activations[DENSE_ACTIVATIONS[activation]](x)
    return x
