"""Classify Fashion-MNIST test images with a trained LeNet, from Python.

    kiln data fetch fashion-mnist
    kiln train --solver models/lenet/lenet_solver.prototxt      # writes lenet_iter_10000.caffemodel
    PYTHONPATH=build/python python3 examples/python/classify.py lenet_iter_10000.caffemodel

Reads the test images from Debian's dataset-fashion-mnist files with NumPy, runs them through
models/lenet/lenet_deploy.prototxt batch by batch (net.forward_all), and prints the accuracy
and the first predictions with their class names.
"""
import argparse
import os

import numpy as np

import kiln
from pylayers import _idx

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weights", help="a .caffemodel of models/lenet")
    ap.add_argument("--model", default=os.path.join(HERE, "..", "..", "models", "lenet",
                                                    "lenet_deploy.prototxt"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--count", type=int, default=10000, help="test images to classify")
    ap.add_argument("--show", type=int, default=8, help="predictions to print")
    a = ap.parse_args()

    images = _idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))[:a.count]
    labels = _idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))[:a.count]
    net = kiln.Net(a.model, a.weights, kiln.TEST)
    # the zoo's nets scale pixels by 1/256 (transform_param scale: 0.00390625)
    x = images.reshape(-1, 1, 28, 28).astype(np.float32) * np.float32(1 / 256)
    prob = net.forward_all(data=x)["prob"]
    pred = prob.argmax(axis=1)
    print("accuracy %.4f on %d test images" % ((pred == labels).mean(), len(labels)))
    for i in range(min(a.show, len(labels))):
        print("image %d: %-12s (%.3f)  truth %s" % (i, CLASSES[pred[i]], prob[i, pred[i]],
                                                    CLASSES[labels[i]]))


if __name__ == "__main__":
    main()
