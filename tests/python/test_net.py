"""kiln.Net: construction, blobs as NumPy views, forward and backward against kiln's command
and hand-computed values, reshapes, weights in and out, errors."""
import resource

import numpy as np
import pytest

import kiln
from conftest import events, models, needs_data, run_kiln, zoo_solver

LENET_DEPLOY = models("lenet", "lenet_deploy.prototxt")


def deploy_net(**kw):
    kiln.set_random_seed(1701)
    return kiln.Net(LENET_DEPLOY, kiln.TEST, **kw)


@needs_data
@pytest.mark.parametrize("model", ["lenet", "cifar10_quick", "resnet20"])
def test_forward_equals_kiln_test(tmp_path, model):
    """Three TEST batches through kiln.Net.forward, averaged as kiln test averages them, equal
    kiln test's figures bit for bit on the same weights (two training iterations', so that
    BatchNorm has statistics)."""
    run_kiln("train", "--solver", zoo_solver(tmp_path, model, 2))
    w = tmp_path / (model + "_iter_2.caffemodel")
    net = kiln.Net(models(model, model + "_train_test.prototxt"), str(w), kiln.TEST)
    sums = {}
    for _ in range(3):
        out = net.forward()
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(np.float64(v.reshape(-1)[0]))
    run_kiln("test", "--model", models(model, model + "_train_test.prototxt"), "--weights", w,
             "--iterations", 3, "--metrics", tmp_path / "m.jsonl")
    ev = events(tmp_path / "m.jsonl", "test")[0]
    assert set(sums) <= set(ev)
    for k, s in sums.items():
        assert np.float32(s / 3) == np.float32(ev[k]), (k, s / 3, ev[k])


def test_construction_spellings(tmp_path):
    net = deploy_net()
    w = tmp_path / "w.caffemodel"
    net.save(str(w))
    x = np.random.RandomState(0).rand(64, 1, 28, 28).astype(np.float32)
    ref = net.forward(data=x)["prob"].copy()
    for other in (kiln.Net(LENET_DEPLOY, str(w), kiln.TEST),
                  kiln.Net(LENET_DEPLOY, kiln.TEST, weights=str(w)),
                  kiln.Net(LENET_DEPLOY, weights=w, phase=kiln.TEST)):
        assert other.phase == kiln.TEST
        assert np.array_equal(other.forward(data=x)["prob"], ref)
    assert kiln.Net(LENET_DEPLOY).phase == kiln.TEST  # TEST by default
    with pytest.raises(TypeError):
        kiln.Net(LENET_DEPLOY, str(w), kiln.TEST, 3)


def test_names_layers_inputs_outputs():
    net = deploy_net()
    assert net.inputs == ["data"]
    assert net.outputs == ["prob"]
    assert list(net.blobs) == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "ip2", "prob"]
    assert [l.type for l in net.layers] == ["Input", "Convolution", "Pooling", "Convolution",
                                            "Pooling", "InnerProduct", "ReLU", "InnerProduct",
                                            "Softmax"]
    assert list(net.params) == ["conv1", "conv2", "ip1", "ip2"]
    assert [b.shape for b in net.params["conv1"]] == [(20, 1, 5, 5), (20,)]
    assert net.top_names["relu1"] == ["ip1"] and net.bottom_names["relu1"] == ["ip1"]
    assert net.layer_dict["ip2"].blobs[0].shape == (10, 500)
    b = net.blobs["data"]
    assert (b.num, b.channels, b.height, b.width, b.count) == (64, 1, 28, 28, 64 * 784)


def test_views_are_kilns_memory():
    """data and diff are views: no copy, the same memory on every access, writes seen by the
    net, and the arrays keep the net alive."""
    net = deploy_net()
    a = net.blobs["data"].data
    assert not a.flags["OWNDATA"] and a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    assert np.shares_memory(a, net.blobs["data"].data)
    assert isinstance(a.base, kiln.Blob)
    x = np.random.RandomState(1).rand(64, 1, 28, 28).astype(np.float32)
    a[...] = x  # through the old view
    ref = net.forward()["prob"].copy()
    assert np.array_equal(net.forward(data=x)["prob"], ref)
    # the net outlives its name while a view lives
    p = net.params["ip2"][1].data
    del net
    p[...] = 1.0
    assert p.sum() == 10.0


def test_forward_by_hand():
    """ip2 = ip1 . W^T + b from the parameters' views, and an edit of the bias moves the output
    by exactly the edit (net surgery)."""
    net = deploy_net()
    x = np.random.RandomState(2).rand(64, 1, 28, 28).astype(np.float32)
    net.forward(data=x)
    ip1 = net.blobs["ip1"].data.astype(np.float64)  # after ReLU, in place
    W, b = (p.data.astype(np.float64) for p in net.params["ip2"])
    assert np.allclose(net.blobs["ip2"].data, ip1 @ W.T + b, rtol=1e-5, atol=1e-5)
    z = net.blobs["ip2"].data.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    assert np.allclose(net.blobs["prob"].data, e / e.sum(axis=1, keepdims=True), atol=1e-6)
    before = net.blobs["ip2"].data.copy()
    net.params["ip2"][1].data[3] += 2.5
    net.forward(start="ip2")
    delta = net.blobs["ip2"].data - before
    assert np.allclose(delta[:, 3], 2.5, atol=1e-5) and np.allclose(np.delete(delta, 3, 1), 0)


def test_forward_start_end_and_blobs():
    net = deploy_net()
    x = np.random.RandomState(3).rand(64, 1, 28, 28).astype(np.float32)
    full = net.forward(data=x, blobs=["pool2"])
    assert set(full) == {"prob", "pool2"}
    pool2, prob = full["pool2"].copy(), full["prob"].copy()
    net.blobs["pool2"].data[...] = 0
    part = net.forward(end="pool2")
    assert set(part) == {"pool2"} and np.array_equal(part["pool2"], pool2)
    net.blobs["prob"].data[...] = 0
    assert np.array_equal(net.forward(start="ip1")["prob"], prob)
    with pytest.raises(kiln.Error, match="no layer"):
        net.forward(start="nope")
    with pytest.raises(kiln.Error, match="not an input"):
        net.forward(conv1=x)


def test_reshape_keeps_views_valid():
    """A smaller batch keeps the memory (old views write through); a larger one moves the blob,
    and views made before stay readable (the old memory lives as long as the net)."""
    net = deploy_net()
    x = np.random.RandomState(4).rand(64, 1, 28, 28).astype(np.float32)
    ref = net.forward(data=x)["prob"].copy()
    old = net.blobs["data"].data
    old_prob = net.blobs["prob"].data
    net.blobs["data"].reshape(2, 1, 28, 28)
    net.reshape()
    assert net.blobs["prob"].data.shape == (2, 10)
    assert np.shares_memory(net.blobs["data"].data, old)
    out = net.forward(data=x[:2])["prob"]
    assert np.allclose(out, ref[:2], atol=1e-6)
    net.blobs["data"].reshape(200, 1, 28, 28)
    net.reshape()
    big = np.concatenate([x, x, x, x[:8]])
    out = net.forward(data=big)["prob"]
    assert out.shape == (200, 10) and np.allclose(out[64:128], ref, atol=1e-6)
    assert float(old.sum()) > 0 and np.isfinite(old_prob).all()  # still readable
    with pytest.raises(kiln.Error, match="items"):
        net.forward(data=x)


def test_forward_all():
    net = deploy_net()
    x = np.random.RandomState(5).rand(150, 1, 28, 28).astype(np.float32)
    out = net.forward_all(data=x)["prob"]
    assert out.shape == (150, 10)
    assert np.allclose(out[64:128], net.forward(data=x[64:128])["prob"], atol=1e-6)


@needs_data
def test_backward_by_hand():
    """On LeNet's TRAIN net: ip2's bias gradient is the batch mean of softmax - one-hot, and the
    input's gradient (force_backward) matches a finite difference of the loss."""
    net = kiln.Net(models("lenet", "lenet_train_test.prototxt"), kiln.TRAIN)
    loss = net.forward()["loss"]
    for ps in net.params.values():
        for p in ps:
            p.diff[...] = 0
    net.backward()
    z = net.blobs["ip2"].data.astype(np.float64)
    labels = net.blobs["label"].data.astype(int)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(labels)), labels] -= 1
    assert np.allclose(net.params["ip2"][1].diff, p.mean(axis=0), atol=1e-6)
    assert float(loss) > 0
    # the diffs accumulate, as Caffe's do: a second backward doubles them
    g = net.params["ip2"][1].diff.copy()
    net.backward()
    assert np.allclose(net.params["ip2"][1].diff, 2 * g, atol=1e-6)


def test_backward_force_and_ranges(tmp_path):
    """force_backward on a deploy net: backward(prob=...) gives d(sum(prob * g))/d data, checked
    by finite differences; backward(start, end) runs a part."""
    text = open(LENET_DEPLOY).read().replace('name: "LeNet"', 'name: "LeNet"\nforce_backward: true', 1)
    path = tmp_path / "fb.prototxt"
    path.write_text(text)
    kiln.set_random_seed(1701)
    net = kiln.Net(str(path), kiln.TEST)
    net.blobs["data"].reshape(1, 1, 28, 28)
    net.reshape()
    rs = np.random.RandomState(6)
    x = rs.rand(1, 1, 28, 28).astype(np.float32)
    g = rs.randn(1, 10).astype(np.float32)
    net.forward(data=x)
    dx = net.backward(prob=g)["data"].copy()

    def f(xx):
        return float((net.forward(data=xx)["prob"].astype(np.float64) * g).sum())

    for idx in [(0, 0, 14, 14), (0, 0, 10, 20), (0, 0, 20, 5)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += 1e-2
        xm[idx] -= 1e-2
        num = (f(xp) - f(xm)) / 2e-2
        assert abs(num - dx[idx]) < 2e-3 + 2e-2 * abs(num), (idx, num, dx[idx])
    net.blobs["ip1"].diff[...] = 0
    out = net.backward(start="prob", end="ip2")
    W = net.params["ip2"][0].data.astype(np.float64)
    want = net.blobs["ip2"].diff.astype(np.float64) @ W
    assert set(out) == {"ip1"} and np.allclose(out["ip1"], want, atol=1e-6)


def test_save_and_load(tmp_path):
    net = deploy_net()
    net.params["conv1"][0].data[...] = np.arange(500, dtype=np.float32).reshape(20, 1, 5, 5)
    for name in ("w.caffemodel", "w.caffemodel.h5"):
        net.save(str(tmp_path / name))
        other = kiln.Net(LENET_DEPLOY, str(tmp_path / name), kiln.TEST)
        for k in net.params:
            for a, b in zip(net.params[k], other.params[k]):
                assert np.array_equal(a.data, b.data)
    fresh = kiln.Net(LENET_DEPLOY, kiln.TEST)
    fresh.copy_from(str(tmp_path / "w.caffemodel"))
    assert np.array_equal(fresh.params["conv1"][0].data, net.params["conv1"][0].data)


def test_errors(tmp_path):
    assert issubclass(kiln.Error, RuntimeError)
    with pytest.raises(kiln.Error, match="missing.prototxt"):
        kiln.Net(str(tmp_path / "missing.prototxt"), kiln.TEST)
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "b"\nlayer { name: "x" type: "Nope" top: "x" }\n')
    with pytest.raises(kiln.Error, match="Nope"):
        kiln.Net(str(bad), kiln.TEST)
    with pytest.raises(kiln.Error, match="phase 7"):
        kiln.Net(LENET_DEPLOY, 7)
    with pytest.raises(kiln.Error, match="nothing.caffemodel"):
        kiln.Net(LENET_DEPLOY, str(tmp_path / "nothing.caffemodel"), kiln.TEST)
    net = deploy_net()
    with pytest.raises(kiln.Error, match="nothing.caffemodel"):
        net.copy_from(str(tmp_path / "nothing.caffemodel"))
    with pytest.raises(KeyError):
        net.blobs["nothing"]
    with pytest.raises(kiln.Error, match="at most 8"):
        net.blobs["data"].reshape(*([1] * 9))
    with pytest.raises(kiln.Error, match="negative"):
        net.blobs["data"].reshape(-1, 1, 28, 28)


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_no_growth_over_many_nets():
    """Nets, their views and reshapes come and go without memory left behind: the resident size
    after 40 more rounds stays within a few MB of where 5 rounds left it (each LeNet holds
    about 5 MB of its own, so a leaked net would show)."""
    x = np.random.RandomState(7).rand(64, 1, 28, 28).astype(np.float32)

    def round_():
        net = deploy_net()
        net.forward(data=x)
        v = net.blobs["prob"].data
        net.blobs["data"].reshape(128, 1, 28, 28)
        net.reshape()
        net.forward()
        return float(v.sum())

    for _ in range(5):
        round_()
    start = rss_mb()
    for _ in range(40):
        round_()
    assert rss_mb() - start < 12, (start, rss_mb())


def test_threads_and_device():
    n = kiln.get_threads()
    kiln.set_threads(1)
    assert kiln.get_threads() == 1
    kiln.set_threads(n)
    with pytest.raises(kiln.Error):
        kiln.set_threads(0)
    kiln.set_mode_cpu()
    with pytest.raises(kiln.Error, match="nodevice"):
        kiln.set_device("nodevice")


def test_device_copies_on_hostsim():
    """On a device (hostsim: the host's memory behind a device's walls, as a GPU's is) data and
    diff are read-only copies, `blob.data = x` writes, and the net computes what the host's
    does."""
    x = np.random.RandomState(8).rand(64, 1, 28, 28).astype(np.float32)
    host = deploy_net()
    ref = host.forward(data=x)["prob"].copy()
    kiln.set_device("hostsim")
    try:
        kiln.set_random_seed(1701)
        dev = kiln.Net(LENET_DEPLOY, kiln.TEST)
    finally:
        kiln.set_device("cpu")
    for k in host.params:
        for a, b in zip(host.params[k], dev.params[k]):
            b.data = a.data
    d = dev.blobs["data"].data
    assert not d.flags["WRITEABLE"]
    with pytest.raises(ValueError):
        d[...] = 0
    dev.blobs["data"].data = x
    dev.forward()
    assert np.allclose(dev.blobs["prob"].data, ref, atol=1e-5)
    rev = x[::-1].copy()
    assert np.allclose(dev.forward(data=rev)["prob"], ref[::-1], atol=1e-5)
    with pytest.raises(ValueError):
        dev.blobs["data"].data[...] = x


def test_stages_and_level(tmp_path):
    text = """name: "s"
input: "a" input_shape { dim: 1 dim: 2 }
layer { name: "p" type: "Power" bottom: "a" top: "b" power_param { scale: 2 }
  include { stage: "double" } }
layer { name: "q" type: "Power" bottom: "a" top: "b" power_param { scale: 3 }
  exclude { stage: "double" } }
layer { name: "r" type: "Power" bottom: "b" top: "c" power_param { scale: 5 }
  include { min_level: 1 } }
"""
    path = tmp_path / "s.prototxt"
    path.write_text(text)
    x = np.array([[1.0, 2.0]], np.float32)
    assert np.array_equal(kiln.Net(str(path), kiln.TEST).forward(a=x)["b"], 3 * x)
    assert np.array_equal(kiln.Net(str(path), kiln.TEST, stages=["double"]).forward(a=x)["b"],
                          2 * x)
    assert np.array_equal(kiln.Net(str(path), kiln.TEST, level=1).forward(a=x)["c"], 15 * x)
