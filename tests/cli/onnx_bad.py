# A helper of tests/cli/onnx_import.sh (not a test): malformed and unsupported ONNX models, made
# with onnx.helper and written without the checker (which would refuse most of them), for the
# importer's refusals.
#
#   onnx_bad.py OUTDIR
#
# cycle.onnx (two Relu nodes reading each other's output), unknown.onnx (a Hardmax node named
# "hm"), badinit.onnx (a Conv weight of dims 4x1x3x3 holding 10 floats), opset1.onnx (opset 1),
# dangling.onnx (a node reading a tensor nothing writes), external.onnx (an initializer whose
# data is in another file), badpool.onnx (a MaxPool whose asymmetric pads Caffe cannot express),
# mean.onnx (a ReduceMean that does not begin a layer normalization), constmatmul.onnx (a
# constant matrix by a computed one), rnn.onnx (ONNX's RNN alone, as PyTorch's nn.RNN exports).
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

out = sys.argv[1]
X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def save(name, nodes, inits=(), opset=13, inputs=(X,)):
    g = helper.make_graph(nodes, name, list(inputs), [Y], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    onnx.save(m, f"{out}/{name}.onnx")


save("cycle", [helper.make_node("Relu", ["b"], ["a"], name="r1"),
               helper.make_node("Add", ["x", "a"], ["b"], name="r2"),
               helper.make_node("Relu", ["b"], ["y"], name="r3")])
save("unknown", [helper.make_node("Hardmax", ["x"], ["y"], name="hm")])
w = helper.make_tensor("w", TensorProto.FLOAT, [4, 1, 3, 3], np.zeros(36, np.float32).tobytes(), raw=True)
w.raw_data = np.zeros(10, np.float32).tobytes()
save("badinit", [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [w])
save("opset1", [helper.make_node("Relu", ["x"], ["y"], name="relu")], opset=1)
save("dangling", [helper.make_node("Add", ["x", "nowhere"], ["y"], name="add")])
e = helper.make_tensor("e", TensorProto.FLOAT, [4, 1, 3, 3], np.zeros(36, np.float32))
e.ClearField("float_data")
e.data_location = TensorProto.EXTERNAL
e.external_data.add(key="location", value="weights.bin")
save("external", [helper.make_node("Conv", ["x", "e"], ["y"], name="conv")], [e])
save("badpool", [helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[2, 2, 0, 0])])
save("mean", [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[-1]),
              helper.make_node("Sub", ["x", "m"], ["y"], name="center")])
c = helper.make_tensor("c", TensorProto.FLOAT, [8, 8], np.ones(64, np.float32))
save("constmatmul", [helper.make_node("MatMul", ["c", "x"], ["y"], name="cx")], [c])
S = helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 2, 4])
rw = helper.make_tensor("rw", TensorProto.FLOAT, [1, 5, 4], np.ones(20, np.float32))
rr = helper.make_tensor("rr", TensorProto.FLOAT, [1, 5, 5], np.ones(25, np.float32))
save("rnn", [helper.make_node("RNN", ["s", "rw", "rr"], ["y"], name="rnn", hidden_size=5)],
     [rw, rr], inputs=(S,))
