"""Images in and out of nets, as pycaffe's caffe.io: load_image, resize_image, and the
Transformer that turns height x width x channel RGB images in [0, 1] into a net's input (scale,
channel order, mean, CHW)."""
import numpy as np

import _kiln


def load_image(filename, color=True):
    """A PNG or JPEG file through kiln's own reader: height x width x 3 (RGB) float32 in
    [0, 1], or height x width x 1 for color=False."""
    return _kiln._load_image(str(filename), bool(color))


def resize_image(im, new_dims, interp_order=1):
    """im (H x W x K) resized to new_dims (h, w): bilinear (interp_order 1) or nearest (0)."""
    im = np.asarray(im, dtype=np.float32)
    h, w = int(new_dims[0]), int(new_dims[1])
    H, W = im.shape[:2]
    if (H, W) == (h, w):
        return im.copy()
    # pixel centres mapped as OpenCV and scikit-image do: (i + 0.5) * H / h - 0.5
    ys = np.clip((np.arange(h) + 0.5) * H / h - 0.5, 0, H - 1)
    xs = np.clip((np.arange(w) + 0.5) * W / w - 0.5, 0, W - 1)
    if interp_order == 0:
        return im[np.rint(ys).astype(int)][:, np.rint(xs).astype(int)]
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, H - 1), np.minimum(x0 + 1, W - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = im[y0][:, x0] * (1 - fx) + im[y0][:, x1] * fx
    bot = im[y1][:, x0] * (1 - fx) + im[y1][:, x1] * fx
    return (top * (1 - fy) + bot * fy).astype(np.float32)


class Transformer:
    """pycaffe's Transformer: per input blob, a transpose (e.g. (2, 0, 1): HWC to CHW), a channel
    swap (e.g. (2, 1, 0): RGB to BGR), a raw scale (e.g. 255), a mean (per channel, or a whole
    C x H x W array) and an input scale, applied in that order by preprocess and undone by
    deprocess."""

    def __init__(self, inputs):
        self.inputs = dict(inputs)  # name: shape of the net's blob
        self.transpose, self.channel_swap, self.raw_scale = {}, {}, {}
        self.mean, self.input_scale = {}, {}

    def _check(self, name):
        if name not in self.inputs:
            raise _kiln.Error("Transformer: %r is not one of the inputs %s" %
                              (name, sorted(self.inputs)))

    def set_transpose(self, name, order):
        self._check(name)
        if len(order) != len(self.inputs[name]) - 1:
            raise _kiln.Error("Transformer: the transpose order needs %d axes" %
                              (len(self.inputs[name]) - 1))
        self.transpose[name] = tuple(order)

    def set_channel_swap(self, name, order):
        self._check(name)
        if len(order) != self.inputs[name][1]:
            raise _kiln.Error("Transformer: the channel order needs %d channels" %
                              self.inputs[name][1])
        self.channel_swap[name] = tuple(order)

    def set_raw_scale(self, name, scale):
        self._check(name)
        self.raw_scale[name] = scale

    def set_mean(self, name, mean):
        """A mean per channel (C values) or a whole C x H x W mean."""
        self._check(name)
        mean = np.asarray(mean, dtype=np.float32)
        shape = tuple(self.inputs[name][1:])
        if mean.ndim == 1:
            if mean.shape[0] != shape[0]:
                raise _kiln.Error("Transformer: a mean of %d values for %d channels" %
                                  (mean.shape[0], shape[0]))
            mean = mean[:, None, None]
        elif mean.shape != shape:
            raise _kiln.Error("Transformer: a mean of shape %s for inputs of %s" %
                              (mean.shape, shape))
        self.mean[name] = mean

    def set_input_scale(self, name, scale):
        self._check(name)
        self.input_scale[name] = scale

    def preprocess(self, name, data):
        """One image (H x W x K) into the blob's layout: resized to the input's size, then
        transposed, channels swapped, raw-scaled, the mean taken off, input-scaled."""
        self._check(name)
        x = np.asarray(data, dtype=np.float32)
        in_dims = self.inputs[name][2:]
        if x.shape[:2] != tuple(in_dims):
            x = resize_image(x, in_dims)
        if name in self.transpose:
            x = x.transpose(self.transpose[name])
        if name in self.channel_swap:
            x = x[list(self.channel_swap[name]), :, :]
        if name in self.raw_scale:
            x = x * self.raw_scale[name]
        if name in self.mean:
            x = x - self.mean[name]
        if name in self.input_scale:
            x = x * self.input_scale[name]
        return np.ascontiguousarray(x, dtype=np.float32)

    def deprocess(self, name, data):
        """preprocess undone: the blob's layout back to an H x W x K image."""
        self._check(name)
        x = np.array(data, dtype=np.float32).squeeze()
        if name in self.input_scale:
            x = x / self.input_scale[name]
        if name in self.mean:
            x = x + self.mean[name]
        if name in self.raw_scale:
            x = x / self.raw_scale[name]
        if name in self.channel_swap:
            x = x[np.argsort(self.channel_swap[name]), :, :]
        if name in self.transpose:
            x = x.transpose(np.argsort(self.transpose[name]))
        return x
