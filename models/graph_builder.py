"""The few helpers every graph builder here uses (`bert_onnx.py`,
`decoder_onnx.py`): initializers from a checkpoint's weights, and nodes
named by their op and a counter, so that a graph built twice is the same."""
import numpy as np
from onnx import helper, numpy_helper


class GraphBuilder:
    def __init__(self, weights, prefix=""):
        self.weights = weights
        self.prefix = prefix
        self.inits, self.nodes = [], []
        self.count = 0

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name, transpose=False):
        """The checkpoint's `prefix + name` as float32 (transposed for MatMul), named `name`."""
        array = self.weights[self.prefix + name].astype(np.float32)
        return self.const(name, array.T.copy() if transpose else array)

    def node(self, op, inputs, **attrs):
        self.count += 1
        out = f"{op.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out
