"""Writes a tiny ONNX graph whose token states are sqrt(8 - n) for a sequence
of n tokens: finite for short inputs (the load's warm-up passes), NaN past 8
tokens, to test that a non-finite output becomes a 500 naming the model.

    python nan_model.py OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", 1])
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["mask_f", "axis_1"], ["length"], keepdims=1),
        helper.make_node("Sub", ["eight", "length"], ["room"]),
        helper.make_node("Sqrt", ["room"], ["root"]),
        helper.make_node("Mul", ["mask_f", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "root"], ["states"]),
        helper.make_node("Unsqueeze", ["states", "axis_2"], ["last_hidden_state"]),
    ]
    inits = [numpy_helper.from_array(np.array(8.0, np.float32), "eight"), numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "axis_1"), numpy_helper.from_array(np.array([2], np.int64), "axis_2")]
    graph = helper.make_graph(nodes, "nan", [ids, mask], [out], initializer=inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])


if __name__ == "__main__":
    main()
