"""A pycaffe script of the common kind, run by kiln after one change: `import caffe` became
`import kiln as caffe`. It loads LeNet, sets an input, runs forward, reads blobs, edits a
parameter (net surgery), and saves the weights.

    PYTHONPATH=build/python python3 examples/python/pycaffe_style.py [WEIGHTS] [OUT]
"""
import os
import sys

import numpy as np

import kiln as caffe

here = os.path.dirname(os.path.abspath(__file__))
model = os.path.join(here, "..", "..", "models", "lenet", "lenet_deploy.prototxt")
weights = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
out = sys.argv[2] if len(sys.argv) > 2 else "edited.caffemodel"

caffe.set_mode_cpu()
if weights:
    net = caffe.Net(model, weights, caffe.TEST)
else:
    net = caffe.Net(model, caffe.TEST)

# the blobs and parameters, as pycaffe lists them
for name, blob in net.blobs.items():
    print("%-6s %s" % (name, blob.data.shape))
for name, params in net.params.items():
    print("%-6s weights %s  bias %s" % (name, params[0].data.shape, params[1].data.shape))

# one image in, forward, read the output and an intermediate blob
net.blobs["data"].reshape(1, 1, 28, 28)
net.reshape()
image = np.random.RandomState(0).rand(28, 28).astype(np.float32)
net.blobs["data"].data[...] = image
out_blobs = net.forward()
prob = out_blobs["prob"][0].copy()  # a view: the next forward overwrites it
print("predicted class %d (%.3f)" % (prob.argmax(), prob.max()))
print("conv1 activations: mean %.4f" % net.blobs["conv1"].data.mean())

# net surgery: silence the predicted class through its bias, then run again
net.params["ip2"][1].data[prob.argmax()] = -1e3
prob2 = net.forward()["prob"][0]
print("after the edit: class %d (%.3f)" % (prob2.argmax(), prob2.max()))
assert prob2.argmax() != prob.argmax()

net.save(out)
print("saved %s" % out)
