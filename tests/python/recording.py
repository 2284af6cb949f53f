"""Python layers for the tests: one that records what kiln calls, one that raises, one that
checks its bottoms are the net's memory."""
import numpy as np

import kiln

CALLS = []


class Recorder(kiln.Layer):
    def setup(self, bottom, top):
        CALLS.append(("setup", self.param_str, self.phase, len(bottom), len(top)))

    def reshape(self, bottom, top):
        CALLS.append(("reshape", bottom[0].shape))
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        CALLS.append(("forward",))
        top[0].data[...] = 2 * bottom[0].data
        self.last_bottom = bottom[0].data  # a view kept past the call

    def backward(self, top, propagate_down, bottom):
        CALLS.append(("backward", list(propagate_down)))
        if propagate_down[0]:
            bottom[0].diff[...] = 2 * top[0].diff


class Raiser(kiln.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        self.helper(bottom)

    def helper(self, bottom):
        raise ValueError("no good: " + self.param_str)


class NoClassHere:
    pass


class LearnedScale(kiln.Layer):
    """top = bottom * w (w per column, learnable, starting at 1.5 as setup writes it): pycaffe's
    self.blobs in a layer of kiln's."""

    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].shape[1])
        self.blobs[0].data[...] = 1.5

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.blobs[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * self.blobs[0].data


class LateBlob(kiln.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)
        self.blobs.add_blob(3)
