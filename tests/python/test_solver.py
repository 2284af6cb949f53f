"""kiln.get_solver and the rule classes: step and solve against kiln train bit for bit,
snapshot and restore, events, the solver's nets."""
import filecmp
import logging

import numpy as np
import pytest

import kiln
from conftest import models, needs_data, run_kiln, zoo_solver, weights_equal

pytestmark = needs_data


@pytest.mark.parametrize("model,iters", [("lenet", 30), ("resnet20", 4)])
def test_step_equals_kiln_train(tmp_path, model, iters):
    """solver.step in two calls gives kiln train's weights and history to the same iteration,
    bit for bit (the .caffemodel and .solverstate files are the same bytes)."""
    (tmp_path / "kp").mkdir()
    (tmp_path / "kc").mkdir()
    s = kiln.get_solver(str(zoo_solver(tmp_path / "kp", model, iters)))
    s.step(iters // 2)
    s.step(iters - iters // 2)
    assert s.iter == iters
    state = s.snapshot()
    assert state.endswith("%s_iter_%d.solverstate" % (model, iters))
    run_kiln("train", "--solver", zoo_solver(tmp_path / "kc", model, iters))
    for ext in ("caffemodel", "solverstate"):
        a = tmp_path / "kp" / ("%s_iter_%d.%s" % (model, iters, ext))
        b = tmp_path / "kc" / ("%s_iter_%d.%s" % (model, iters, ext))
        if ext == "solverstate":  # each names its own .caffemodel
            a_bytes = a.read_bytes().replace(b"/kp/", b"/kc/")
            b_bytes = b.read_bytes()
            assert a_bytes == b_bytes
        else:
            assert filecmp.cmp(a, b, shallow=False), ext


def test_solve_and_restore(tmp_path):
    """solve() runs to max_iter; a solver restored from the middle's snapshot ends with the same
    weights bit for bit."""
    path = zoo_solver(tmp_path, "lenet", 20)
    s = kiln.SGDSolver(str(path))
    s.step(10)
    mid = s.snapshot()
    s.solve()
    assert s.iter == 20
    r = kiln.get_solver(str(path))
    r.restore(mid)
    assert r.iter == 10
    r.step(10)
    assert weights_equal(s.net, r.net)
    again = kiln.get_solver(str(path))
    again.solve(mid)
    assert weights_equal(s.net, again.net)


def test_nets_and_blobs(tmp_path):
    path = zoo_solver(tmp_path, "lenet", 5, 'test_iter: 2\ntest_interval: 1000\n')
    seen = []
    s = kiln.get_solver(str(path), on_event=seen.append)
    s.step(3)
    assert s.type == "SGD" and s.lr > 0
    assert [e["iter"] for e in seen if e["event"] == "train"] == [0, 1, 2]
    assert s.net.phase == kiln.TRAIN and "loss" in s.net.outputs
    loss = float(s.net.blobs["loss"].data)
    assert np.isfinite(loss) and loss > 0
    assert s.net is s.net  # one object
    assert len(s.test_nets) == 1 and s.test_nets[0].phase == kiln.TEST
    out = s.test_nets[0].forward()
    assert 0 <= float(out["accuracy"]) <= 1
    # the test net reads the train net's weights
    assert np.shares_memory(s.test_nets[0].params["ip2"][0].data, s.net.params["ip2"][0].data)
    # views of the train net's parameters see the updates
    w = s.net.params["ip2"][0].data
    before = w.copy()
    s.step(1)
    assert not np.array_equal(w, before)
    s.test(0)
    assert [e["event"] for e in seen][-1] == "test" and "accuracy" in seen[-1]["outputs"]


def test_event_exception_propagates(tmp_path):
    def boom(e):
        raise KeyError("from the callback")

    s = kiln.get_solver(str(zoo_solver(tmp_path, "lenet", 5)), on_event=boom)
    with pytest.raises(KeyError, match="from the callback"):
        s.step(1)


def test_rule_classes(tmp_path):
    path = zoo_solver(tmp_path, "lenet", 5)
    assert kiln.SGDSolver(str(path)).type == "SGD"
    with pytest.raises(kiln.Error, match="is SGD, not Adam"):
        kiln.AdamSolver(str(path))
    adam = zoo_solver(tmp_path, "lenet", 5, 'type: "Adam"\n')
    assert kiln.AdamSolver(str(adam)).type == "Adam"
    assert kiln.get_solver(str(adam)).type == "Adam"
    with pytest.raises(kiln.Error, match="nothing.prototxt"):
        kiln.get_solver(str(tmp_path / "nothing.prototxt"))
    s = kiln.get_solver(str(path))
    with pytest.raises(kiln.Error, match="nothing.solverstate"):
        s.restore(str(tmp_path / "nothing.solverstate"))
    with pytest.raises(kiln.Error):
        s.step(-1)


def test_library_log_goes_to_logging(tmp_path, caplog):
    """kiln's own log lines reach Python's logging (logger "kiln"), not stderr directly."""
    caplog.set_level(logging.INFO, logger="kiln")
    kiln.get_solver(str(zoo_solver(tmp_path, "lenet", 5)))
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln"]
    assert any("SGD, seed" in m for m in lines), lines
