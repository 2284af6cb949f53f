"""Net surgery: LeNet's fully connected layers cast into convolutions (pycaffe's classic
example, in kiln). The InnerProduct weights (outputs x inputs) are the convolution filters
(outputs x channels x height x width) in the same order, so they are copied by reshaping.

    PYTHONPATH=build/python python3 examples/python/net_surgery.py [LENET.caffemodel] [OUT]

Without weights it uses LeNet's random initial ones. It checks that the convolutional net gives
LeNet's scores on a 28x28 image, shows the map of scores it gives on a 56x56 image made of four
images, and saves the convolutional weights (OUT, default lenet_full_conv.caffemodel).
"""
import os
import sys

import numpy as np

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
LENET = os.path.join(HERE, "..", "..", "models", "lenet", "lenet_deploy.prototxt")
FULL_CONV = os.path.join(HERE, "lenet_full_conv.prototxt")


def main():
    weights = (sys.argv[1] if len(sys.argv) > 1 else "") or None
    out = sys.argv[2] if len(sys.argv) > 2 else "lenet_full_conv.caffemodel"
    net = kiln.Net(LENET, weights, kiln.TEST)
    conv = kiln.Net(FULL_CONV, kiln.TEST)

    # the layers both nets share by name: copy them as they are
    for name in ("conv1", "conv2"):
        for mine, theirs in zip(conv.params[name], net.params[name]):
            mine.data[...] = theirs.data
    # the fully connected ones: the same numbers in the filters' shape
    for fc, cv in (("ip1", "ip1-conv"), ("ip2", "ip2-conv")):
        w, b = net.params[fc]
        print("%s weights %s -> %s weights %s" % (fc, w.shape, cv, conv.params[cv][0].shape))
        conv.params[cv][0].data.flat = w.data.flat
        conv.params[cv][1].data[...] = b.data

    rs = np.random.RandomState(0)
    image = rs.rand(1, 1, 28, 28).astype(np.float32)
    net.blobs["data"].reshape(1, 1, 28, 28)
    net.reshape()
    lenet_scores = net.forward(data=image)["prob"].reshape(10)
    conv.blobs["data"].reshape(1, 1, 28, 28)
    conv.reshape()
    conv_scores = conv.forward(data=image)["prob"].reshape(10)
    err = np.abs(lenet_scores - conv_scores).max()
    print("28x28: LeNet and its convolutional form differ by at most %.2e" % err)
    if err > 1e-5:
        raise SystemExit("net surgery: the convolutional net does not give LeNet's scores")

    big = np.zeros((1, 1, 56, 56), np.float32)
    quads = [rs.rand(28, 28).astype(np.float32) for _ in range(4)]
    for q, (y, x) in zip(quads, ((0, 0), (0, 28), (28, 0), (28, 28))):
        big[0, 0, y:y + 28, x:x + 28] = q
    conv.blobs["data"].reshape(1, 1, 56, 56)
    conv.reshape()
    scores = conv.forward(data=big)["prob"]
    print("56x56: a %dx%d map of class scores; the best class at each place:" % scores.shape[2:])
    print(scores[0].argmax(axis=0))
    # the corners of the map are the four 28x28 images on their own
    for q, (y, x) in zip(quads, ((0, 0), (0, 7), (7, 0), (7, 7))):
        alone = net.forward(data=q.reshape(1, 1, 28, 28))["prob"].reshape(10)
        if np.abs(alone - scores[0, :, y, x]).max() > 1e-5:
            raise SystemExit("net surgery: the map's corner (%d, %d) is not its image's score" % (y, x))
    conv.save(out)
    print("saved %s" % out)


if __name__ == "__main__":
    main()
