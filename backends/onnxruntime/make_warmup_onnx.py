"""Writes src/warmup.onnx: a 4x4 MatMul and a Softmax, which eeane runs once
when it opens ONNX Runtime, so the runtime's one-time state (operator schemas,
kernel registries) is built at start-up, checked, and counted in the idle
server's memory rather than left behind by the first model. Run with the
models/ venv: python backends/onnxruntime/make_warmup_onnx.py"""
from pathlib import Path

import onnx
from onnx import TensorProto, helper

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.0] * 16)
nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
model = helper.make_model(helper.make_graph(nodes, "warmup", [x], [y], initializer=[w]),
                          opset_imports=[helper.make_opsetid("", 17)], producer_name="eeane")
model.ir_version = 8
onnx.checker.check_model(model)
(Path(__file__).parent / "src" / "warmup.onnx").write_bytes(model.SerializeToString())
