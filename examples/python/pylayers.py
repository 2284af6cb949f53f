"""Python layers for kiln nets (``type: "Python"``), in pycaffe's interface.

EuclideanLossLayer and SoftmaxLossLayer are losses written in NumPy (the built-in
EuclideanLoss and SoftmaxWithLoss do the same work in C); FashionMnistData is a data layer
that feeds Fashion-MNIST from Debian's dataset-fashion-mnist files. Use them from a prototxt:

    layer { name: "loss" type: "Python" bottom: "ip2" bottom: "label" top: "loss"
            python_param { module: "pylayers" layer: "SoftmaxLossLayer" }
            loss_weight: 1 }

with this folder on PYTHONPATH, from `kiln train` or from Python (kiln.Net, kiln.get_solver).
A Python layer's top is no loss unless the prototxt gives it a loss_weight, as in Caffe.
"""
import gzip
import os

import numpy as np

import kiln


class EuclideanLossLayer(kiln.Layer):
    """Half the squared distance between two blobs, per item: sum((a - b)^2) / N / 2."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise ValueError("EuclideanLossLayer: two bottoms, got %d" % len(bottom))

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise ValueError("EuclideanLossLayer: bottoms of %d and %d values" %
                             (bottom[0].count, bottom[1].count))
        self.diff = np.zeros(bottom[0].shape, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        top[0].data[...] = np.sum(self.diff.astype(np.float64) ** 2) / bottom[0].num / 2.0

    def backward(self, top, propagate_down, bottom):
        scale = top[0].diff[0] / bottom[0].num  # the loss weight, over the batch
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff[...] = (sign * scale * self.diff).reshape(bottom[i].shape)


class SoftmaxLossLayer(kiln.Layer):
    """Softmax over axis 1 and the mean negative log-likelihood of the labels (bottom 1)."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise ValueError("SoftmaxLossLayer: scores and labels, got %d bottoms" % len(bottom))

    def reshape(self, bottom, top):
        if bottom[1].count != bottom[0].num:
            raise ValueError("SoftmaxLossLayer: %d labels for %d items" %
                             (bottom[1].count, bottom[0].num))
        top[0].reshape(1)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(bottom[0].num, -1).astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        p = np.exp(x)
        p /= p.sum(axis=1, keepdims=True)
        self.labels = bottom[1].data.reshape(-1).astype(np.int64)
        if self.labels.min() < 0 or self.labels.max() >= p.shape[1]:
            raise ValueError("SoftmaxLossLayer: labels outside 0..%d" % (p.shape[1] - 1))
        self.prob = p
        picked = p[np.arange(len(self.labels)), self.labels]
        top[0].data[...] = -np.mean(np.log(np.maximum(picked, np.finfo(np.float32).tiny)))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError("SoftmaxLossLayer: no gradient for the labels")
        if propagate_down[0]:
            g = self.prob.copy()
            g[np.arange(len(self.labels)), self.labels] -= 1.0
            g *= top[0].diff[0] / len(self.labels)
            bottom[0].diff[...] = g.reshape(bottom[0].shape)


def _idx(path):
    """An IDX file (gzipped or not) as a NumPy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError("%s: not an IDX file of unsigned bytes" % path)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError("%s: %d values for dimensions %s" % (path, data.size, dims))
    return data.reshape(dims)


class FashionMnistData(kiln.Layer):
    """Fashion-MNIST batches: tops data (N x 1 x 28 x 28, scaled to [0, 1)) and label (N).
    param_str: "split batch_size [folder]", e.g. "train 64"; split is train or test; the folder
    defaults to Debian's /usr/share/datasets/fashion-mnist. The train split is shuffled once per
    pass with a fixed seed; the test split is read in order."""

    def setup(self, bottom, top):
        words = self.param_str.split()
        if len(words) not in (2, 3) or words[0] not in ("train", "test"):
            raise ValueError("FashionMnistData: param_str 'train|test BATCH [FOLDER]', got %r" %
                             self.param_str)
        self.split, self.batch = words[0], int(words[1])
        folder = words[2] if len(words) == 3 else "/usr/share/datasets/fashion-mnist"
        prefix = "train" if self.split == "train" else "t10k"
        self.images = _idx(os.path.join(folder, prefix + "-images-idx3-ubyte.gz"))
        self.labels = _idx(os.path.join(folder, prefix + "-labels-idx1-ubyte.gz"))
        if len(bottom) != 0 or len(top) != 2:
            raise ValueError("FashionMnistData: no bottoms and two tops (data, label)")
        self.rng = np.random.RandomState(1701)
        self.order = self._order()
        self.pos = 0

    def _order(self):
        n = len(self.labels)
        return self.rng.permutation(n) if self.split == "train" else np.arange(n)

    def reshape(self, bottom, top):
        top[0].reshape(self.batch, 1, 28, 28)
        top[1].reshape(self.batch)

    def forward(self, bottom, top):
        if self.pos + self.batch > len(self.order):
            self.order, self.pos = self._order(), 0
        pick = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        top[0].data[...] = self.images[pick].reshape(self.batch, 1, 28, 28) * np.float32(1 / 256)
        top[1].data[...] = self.labels[pick]
