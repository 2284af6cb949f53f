"""Python layers (type: "Python") run from the kiln module: pycaffe's interface, gradients
against the built-in layers they mirror, errors with the layer's name and the traceback."""
import os
import sys

import numpy as np
import pytest

import kiln
from conftest import SRC, models, needs_data, run_kiln, weights_equal

sys.path.insert(0, os.path.join(SRC, "examples", "python"))
import recording  # noqa: E402

REGRESSION = """name: "reg"
force_backward: true
layer {{ name: "x" type: "DummyData" top: "x" top: "y"
  dummy_data_param {{ shape {{ dim: 8 dim: 5 }} shape {{ dim: 8 dim: 3 }}
    data_filler {{ type: "gaussian" std: 1 }} data_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }}
    bias_filler {{ type: "gaussian" std: 0.5 }} }} }}
{loss}
"""
PY_LOSS = ('layer { name: "loss" type: "Python" bottom: "ip" bottom: "y" top: "loss" '
           'python_param { module: "pylayers" layer: "EuclideanLossLayer" } loss_weight: 1 }')
C_LOSS = 'layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "y" top: "loss" }'


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_python_loss_equals_euclidean(tmp_path):
    """The NumPy Euclidean loss gives the built-in EuclideanLoss's loss and gradients (weights,
    bias and input) on the same net and data."""
    kiln.set_random_seed(11)
    py = kiln.Net(write(tmp_path, "py.prototxt", REGRESSION.format(loss=PY_LOSS)), kiln.TRAIN)
    kiln.set_random_seed(11)
    c = kiln.Net(write(tmp_path, "c.prototxt", REGRESSION.format(loss=C_LOSS)), kiln.TRAIN)
    assert weights_equal(py, c)
    assert np.array_equal(py.blobs["x"].data, c.blobs["x"].data)  # same seed, same draws
    for _ in range(2):
        lp, lc = py.forward()["loss"], c.forward()["loss"]
        assert np.allclose(lp, lc, rtol=1e-6), (lp, lc)
        py.backward()
        c.backward()
        for k in ("ip",):
            for a, b in zip(py.params[k], c.params[k]):
                assert np.allclose(a.diff, b.diff, rtol=1e-5, atol=1e-7)
        assert np.allclose(py.blobs["x"].diff, c.blobs["x"].diff, rtol=1e-5, atol=1e-7)
        assert np.abs(py.blobs["x"].diff).max() > 0


@needs_data
def test_python_softmax_loss_trains_like_the_builtin(tmp_path):
    """LeNet with the NumPy softmax loss in place of SoftmaxWithLoss: the same gradients on
    the same batch."""
    text = open(models("lenet", "lenet_train_test.prototxt")).read()
    py_text = text.replace('type: "SoftmaxWithLoss"', 'type: "Python"\n  python_param { module: '
                           '"pylayers" layer: "SoftmaxLossLayer" }\n  loss_weight: 1')
    assert py_text != text
    kiln.set_random_seed(3)
    py = kiln.Net(write(tmp_path, "py.prototxt", py_text), kiln.TRAIN)
    kiln.set_random_seed(3)
    c = kiln.Net(write(tmp_path, "c.prototxt", text), kiln.TRAIN)
    assert np.allclose(py.forward()["loss"], c.forward()["loss"], rtol=1e-6)
    py.backward()
    c.backward()
    for k in py.params:
        for a, b in zip(py.params[k], c.params[k]):
            assert np.allclose(a.diff, b.diff, rtol=1e-4, atol=1e-6), k


def test_interface_calls_and_views(tmp_path):
    """setup once with param_str and phase, reshape before each forward, backward with
    propagate_down; bottoms and tops are views of the net's blobs."""
    text = """name: "rec"
force_backward: true
input: "a" input_shape { dim: 2 dim: 3 }
layer { name: "rec" type: "Python" bottom: "a" top: "b"
  python_param { module: "recording" layer: "Recorder" param_str: "hello 1" } }
"""
    recording.CALLS.clear()
    net = kiln.Net(write(tmp_path, "rec.prototxt", text), kiln.TRAIN)
    assert recording.CALLS[0] == ("setup", "hello 1", kiln.TRAIN, 1, 1)
    assert recording.CALLS[1] == ("reshape", (2, 3))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = net.forward(a=x)
    assert np.array_equal(out["b"], 2 * x)
    assert recording.CALLS[-2:] == [("reshape", (2, 3)), ("forward",)]
    dx = net.backward(b=np.ones((2, 3), np.float32))["a"]
    assert recording.CALLS[-1] == ("backward", [True])
    assert np.array_equal(dx, np.full((2, 3), 2, np.float32))
    layer_view = net.layers[1]  # the Python layer in net.layers
    assert layer_view.type == "Python" and layer_view.name == "rec"
    net.blobs["a"].reshape(4, 3)
    net.reshape()
    out = net.forward(a=np.ones((4, 3), np.float32))
    assert out["b"].shape == (4, 3) and recording.CALLS[-2] == ("reshape", (4, 3))


def test_exception_names_layer_and_traceback(tmp_path):
    text = """name: "r"
input: "a" input_shape { dim: 2 }
layer { name: "bad" type: "Python" bottom: "a" top: "b"
  python_param { module: "recording" layer: "Raiser" param_str: "xyz" } }
"""
    net = kiln.Net(write(tmp_path, "r.prototxt", text), kiln.TEST)
    with pytest.raises(kiln.Error) as e:
        net.forward()
    msg = str(e.value)
    assert "layer 'bad' (Python recording.Raiser): forward raised" in msg
    assert "Traceback (most recent call last)" in msg
    assert "in helper" in msg and "ValueError: no good: xyz" in msg


@pytest.mark.parametrize("param,want", [
    ('module: "no_such_module" layer: "L"', "No module named 'no_such_module'"),
    ('module: "recording" layer: "Nope"', "has no attribute 'Nope'"),
    ('layer: "Recorder"', "needs python_param's module and layer"),
])
def test_bad_python_param(tmp_path, param, want):
    text = """name: "r"
input: "a" input_shape { dim: 2 }
layer { name: "p" type: "Python" bottom: "a" top: "b" python_param { %s } }
""" % param
    with pytest.raises(kiln.Error, match="layer 'p'") as e:
        kiln.Net(write(tmp_path, "r.prototxt", text), kiln.TEST)
    assert want in str(e.value)


def test_python_data_layer(tmp_path):
    """The example Fashion-MNIST data layer fills its tops from Debian's files."""
    if not os.path.exists("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"):
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    text = """name: "d"
layer { name: "d" type: "Python" top: "data" top: "label"
  python_param { module: "pylayers" layer: "FashionMnistData" param_str: "test 50" } }
"""
    net = kiln.Net(write(tmp_path, "d.prototxt", text), kiln.TEST)
    net.forward()
    assert net.blobs["data"].shape == (50, 1, 28, 28) and net.blobs["label"].shape == (50,)
    d, lab = net.blobs["data"].data, net.blobs["label"].data
    assert 0 <= d.min() and d.max() < 1 and d.max() > 0.5
    assert set(np.unique(lab)) <= set(range(10)) and len(np.unique(lab)) > 3
    first = lab.copy()
    net.forward()
    assert not np.array_equal(first, net.blobs["label"].data)  # the next 50


def test_solver_with_python_layer_equals_kiln_train(tmp_path):
    """A solver over a net with a Python loss: solver.step in Python and kiln train (which starts
    its own interpreter) end with the same weights bit for bit."""
    net = write(tmp_path, "net.prototxt", REGRESSION.format(loss=PY_LOSS))
    for d in ("kp", "kc"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "s.prototxt").write_text(
            'net: "%s"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 12\n'
            'random_seed: 4\nsnapshot_prefix: "%s"\n' % (net, tmp_path / d / "r"))
    s = kiln.get_solver(str(tmp_path / "kp" / "s.prototxt"))
    s.step(12)
    s.snapshot()
    env = {"PYTHONPATH": os.path.join(SRC, "examples", "python")}
    run_kiln("train", "--solver", tmp_path / "kc" / "s.prototxt", env=env)
    a = (tmp_path / "kp" / "r_iter_12.caffemodel").read_bytes()
    b = (tmp_path / "kc" / "r_iter_12.caffemodel").read_bytes()
    assert a == b


LEARNED = """name: "learned"
layer {{ name: "x" type: "DummyData" top: "x" top: "y"
  dummy_data_param {{ shape {{ dim: 6 dim: 4 }} shape {{ dim: 6 dim: 4 }}
    data_filler {{ type: "gaussian" std: 1 }} data_filler {{ type: "gaussian" std: 1 }} }} }}
{scale}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "s" bottom: "y" top: "loss" }}
"""
PY_SCALE = ('layer { name: "scale" type: "Python" bottom: "x" top: "s" '
            'python_param { module: "recording" layer: "LearnedScale" } }')
C_SCALE = ('layer { name: "scale" type: "Scale" bottom: "x" top: "s" '
           'scale_param { axis: 1 filler { type: "constant" value: 1.5 } } }')


def test_learnable_python_layer(tmp_path):
    """A Python layer's own parameter (self.blobs.add_blob in setup, its first values written
    there): in net.params, trained by the solver as the built-in Scale layer is (the same
    weights after 10 steps), saved in the snapshot and loaded back."""
    nets = {}
    for name, layer in (("py", PY_SCALE), ("c", C_SCALE)):
        net = write(tmp_path, name + ".prototxt", LEARNED.format(scale=layer))
        (tmp_path / (name + "_s.prototxt")).write_text(
            'net: "%s"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 10\nrandom_seed: 2\n'
            'snapshot_prefix: "%s"\n' % (net, tmp_path / name))
        s = kiln.get_solver(str(tmp_path / (name + "_s.prototxt")))
        assert np.array_equal(s.net.params["scale"][0].data, np.full(4, 1.5, np.float32))
        s.step(10)
        s.snapshot()
        nets[name] = (s, net)
    w_py = nets["py"][0].net.params["scale"][0].data
    w_c = nets["c"][0].net.params["scale"][0].data
    assert not np.allclose(w_py, 1.5)
    assert np.allclose(w_py, w_c, rtol=1e-5, atol=1e-6), (w_py, w_c)
    back = kiln.Net(nets["py"][1], str(tmp_path / "py_iter_10.caffemodel"), kiln.TEST)
    assert np.array_equal(back.params["scale"][0].data, w_py)


def test_add_blob_outside_setup(tmp_path):
    text = """name: "late"
input: "a" input_shape { dim: 2 dim: 3 }
layer { name: "late" type: "Python" bottom: "a" top: "b"
  python_param { module: "recording" layer: "LateBlob" } }
"""
    with pytest.raises(kiln.Error, match="adds its parameters in setup"):
        kiln.Net(write(tmp_path, "late.prototxt", text), kiln.TEST)
