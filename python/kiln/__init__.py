"""kiln from Python, in pycaffe's terms.

    import kiln
    net = kiln.Net("deploy.prototxt", "weights.caffemodel", kiln.TEST)
    net.blobs["data"].data[...] = images
    out = net.forward()
    solver = kiln.get_solver("solver.prototxt")
    solver.step(100)

Blobs' ``data`` and ``diff`` are NumPy views of kiln's memory: no copy, valid while the net
lives, and writes go straight into the net. Errors are ``kiln.Error`` (a RuntimeError) with
kiln's message. docs/python.md has the whole interface.
"""
from collections import OrderedDict

import _kiln
from _kiln import Blob, Error, TEST, TRAIN, get_threads, set_device, set_random_seed, set_threads

from . import io  # noqa: F401  (kiln.io, as caffe.io)

__all__ = [
    "Blob", "Error", "Layer", "Net", "Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver",
    "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "get_solver", "TRAIN", "TEST",
    "set_threads", "get_threads", "set_device", "set_mode_cpu", "set_mode_gpu", "set_device_id",
    "set_random_seed", "io",
]


def set_mode_cpu():
    """pycaffe's spelling of set_device('cpu')."""
    set_device("cpu")


_gpu_id = [0]


def set_device_id(n):
    """pycaffe's caffe.set_device(n): the GPU set_mode_gpu() picks."""
    _gpu_id[0] = int(n)


def set_mode_gpu():
    """pycaffe's spelling of set_device('cuda:N') (N from set_device_id, else 0)."""
    set_device("cuda:%d" % _gpu_id[0])


class Layer:
    """The base of a Python layer (``type: "Python"``), as pycaffe's caffe.Layer: kiln sets
    ``self.param_str`` and ``self.phase`` and calls setup, reshape (also before each forward),
    forward and backward with lists of kiln.Blob."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


class LayerInfo:
    """A layer of a net: its name, type, learnable blobs, and the names of its bottoms and
    tops (pycaffe's net.layers[i] has .type and .blobs)."""

    __slots__ = ("name", "type", "blobs", "bottom_names", "top_names")

    def __init__(self, name, type_, blobs, bottoms, tops):
        self.name, self.type, self.blobs = name, type_, blobs
        self.bottom_names, self.top_names = bottoms, tops

    def __repr__(self):
        return "<kiln layer %r (%s)>" % (self.name, self.type)


def _parse_net_args(args, weights, phase):
    """pycaffe's spellings: Net(model, phase), Net(model, weights, phase), Net(model, phase,
    weights=...), and kiln's keywords."""
    rest = list(args)
    if rest and isinstance(rest[0], int) and not isinstance(rest[0], bool):
        if phase is not None:
            raise TypeError("Net: the phase given twice")
        phase = rest.pop(0)
    elif rest:
        if weights is not None:
            raise TypeError("Net: the weights given twice")
        weights = rest.pop(0)
        if rest:
            if phase is not None:
                raise TypeError("Net: the phase given twice")
            phase = rest.pop(0)
    if rest:
        raise TypeError("Net(model, [weights,] phase): too many arguments")
    return weights, TEST if phase is None else phase


class Net(_kiln.Net):
    """A net: ``kiln.Net(model, weights=None, phase=kiln.TEST, stages=(), level=0)``, or
    pycaffe's positional ``kiln.Net(model, weights, kiln.TEST)`` and ``kiln.Net(model,
    kiln.TEST)``."""

    def __init__(self, model, *args, weights=None, phase=None, stages=(), level=0):
        weights, phase = _parse_net_args(args, weights, phase)
        super().__init__(str(model), None if weights is None else str(weights), phase,
                         tuple(stages), level)

    # The mappings are made once: the Blob objects stay valid across reshapes (their data
    # and diff are read anew on each access).
    @property
    def blobs(self):
        """Every activation blob by name, in the order the net makes them."""
        d = self.__dict__.get("_blobs")
        if d is None:
            d = OrderedDict((n, self._blob(n)) for n in self._blob_names())
            self.__dict__["_blobs"] = d
        return d

    @property
    def layers(self):
        """The layers, in order (each with .name, .type, .blobs, .bottom_names, .top_names)."""
        ls = self.__dict__.get("_layer_list")
        if ls is None:
            ls = [LayerInfo(*t) for t in self._layers()]
            self.__dict__["_layer_list"] = ls
        return ls

    @property
    def params(self):
        """The learnable blobs of each layer that has any, by layer name (pycaffe's
        net.params['conv1'][0] is the weights, [1] the bias)."""
        return OrderedDict((l.name, l.blobs) for l in self.layers if l.blobs)

    @property
    def layer_dict(self):
        return OrderedDict((l.name, l) for l in self.layers)

    @property
    def _layer_names(self):
        return [l.name for l in self.layers]

    @property
    def inputs(self):
        """The blobs the caller fills (the tops of Input layers)."""
        return self._input_names()

    @property
    def outputs(self):
        """The blobs no layer reads (losses, accuracies, a deploy net's output)."""
        return self._output_names()

    @property
    def top_names(self):
        return OrderedDict((l.name, list(l.top_names)) for l in self.layers)

    @property
    def bottom_names(self):
        return OrderedDict((l.name, list(l.bottom_names)) for l in self.layers)

    def _index(self, name, what):
        try:
            return self._layer_names.index(name)
        except ValueError:
            raise Error("%s=%r: the net has no layer of that name" % (what, name)) from None

    def reshape(self):
        """After blob.reshape(...) on inputs: every layer follows the new shapes."""
        self._reshape()

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """Runs the layers from start to end (names; both included; default all) after copying
        kwargs (input name: array) into the input blobs. Returns {name: array} of the outputs,
        or of the end layer's tops, and of the blobs named in `blobs`. A layer whose work the
        layer before it does (a Scale or ReLU absorbed into a convolution) runs with that one."""
        a = 0 if start is None else self._index(start, "start")
        b = len(self.layers) - 1 if end is None else self._index(end, "end")
        if end is not None:
            outputs = set(self.top_names[end]) | set(blobs or [])
        else:
            outputs = set(self.outputs) | set(blobs or [])
        for name, value in kwargs.items():
            if name not in self.inputs:
                raise Error("forward: %r is not an input of the net (inputs: %s)" %
                            (name, ", ".join(self.inputs)))
            blob = self.blobs[name]
            if getattr(value, "shape", None) is not None and len(value.shape) and \
                    value.shape[0] != blob.shape[0]:
                raise Error("forward: %r has %d items, the blob %d" %
                            (name, value.shape[0], blob.shape[0]))
            blob.data = value  # a copy into the blob (on a GPU, too)
        self._forward(a, b)
        return {name: self.blobs[name].data for name in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """Runs backward from start down to end (names; default all) after copying kwargs
        (output name: array) into those blobs' diffs. Returns {name: diff} of the inputs, or of
        the end layer's bottoms, and of the blobs named in `diffs`."""
        a = len(self.layers) - 1 if start is None else self._index(start, "start")
        b = 0 if end is None else self._index(end, "end")
        if end is not None:
            outputs = set(self.bottom_names[end]) | set(diffs or [])
        else:
            outputs = set(self.inputs) | set(diffs or [])
        for name, value in kwargs.items():
            if name not in self.outputs:
                raise Error("backward: %r is not an output of the net (outputs: %s)" %
                            (name, ", ".join(self.outputs)))
            self.blobs[name].diff = value
        self._backward(a, b)
        return {name: self.blobs[name].diff for name in outputs}

    def forward_all(self, blobs=None, **kwargs):
        """forward() over inputs with more items than the batch: batch by batch, outputs
        concatenated (the last batch padded, its padding cut off)."""
        import numpy as np
        if not kwargs:
            return self.forward(blobs=blobs)
        n = len(next(iter(kwargs.values())))
        batch = self.blobs[self.inputs[0]].shape[0]
        outs = {}
        for i in range(0, n, batch):
            chunk = {}
            for k, v in kwargs.items():
                part = np.asarray(v[i:i + batch], dtype=np.float32)
                if len(part) < batch:
                    pad = np.zeros((batch - len(part),) + part.shape[1:], np.float32)
                    part = np.concatenate([part, pad])
                chunk[k] = part
            got = self.forward(blobs=blobs, **chunk)
            for k, v in got.items():
                outs.setdefault(k, []).append(v[:min(batch, n - i)].copy())
        return {k: np.concatenate(v) for k, v in outs.items()}


class Solver(_kiln.Solver):
    """A solver over its file, with the update rule the file names:
    ``kiln.get_solver(path)``. ``on_event`` (a callable) receives the training events (train,
    test, snapshot, done) as dicts."""

    _rule = None

    def __init__(self, path, on_event=None):
        super().__init__(str(path), self._rule, on_event)

    @property
    def net(self):
        """The train net (its blobs hold the last iteration's values)."""
        n = self.__dict__.get("_net_obj")
        if n is None:
            n = self._net(Net)
            self.__dict__["_net_obj"] = n
        return n

    @property
    def test_nets(self):
        ts = self.__dict__.get("_test_objs")
        if ts is None:
            ts = [self._test_net(Net, k) for k in range(self._test_count)]
            self.__dict__["_test_objs"] = ts
        return ts


def _rule_class(rule):
    return type(rule + "Solver", (Solver,), {
        "_rule": rule,
        "__doc__": "pycaffe's %sSolver: the file's type must be %s (or unset for SGD)." %
                   (rule, rule)})


SGDSolver = _rule_class("SGD")
NesterovSolver = _rule_class("Nesterov")
AdaGradSolver = _rule_class("AdaGrad")
RMSPropSolver = _rule_class("RMSProp")
AdaDeltaSolver = _rule_class("AdaDelta")
AdamSolver = _rule_class("Adam")


def get_solver(path, on_event=None):
    """The solver its file describes, whatever its type."""
    return Solver(path, on_event=on_event)
