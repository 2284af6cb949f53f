"""Shared fixtures of the kiln Python module's tests (run by CTest: tests/CMakeLists.txt sets
PYTHONPATH to the build's python folder, KILN_BIN and KILN_SOURCE_DIR)."""
import json
import os
import subprocess

import numpy as np
import pytest

SRC = os.environ.get("KILN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__),
                                                                      "..", "..")))
KILN = os.environ.get("KILN_BIN", os.path.join(SRC, "build", "kiln"))


def models(*parts):
    return os.path.join(SRC, "models", *parts)


def run_kiln(*args, env=None, check=True):
    """The kiln command; its CompletedProcess (text)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([KILN] + [str(a) for a in args], capture_output=True, text=True, env=e)
    if check and p.returncode != 0:
        raise AssertionError("kiln %s: exit %d\n%s" % (" ".join(map(str, args)), p.returncode,
                                                      p.stderr[-3000:]))
    return p


def events(path, kind):
    with open(path) as f:
        return [e for e in map(json.loads, f) if e.get("event") == kind]


def fashion_mnist_cached():
    p = run_kiln("data", "list", check=False)
    return any(line.split()[:2] == ["fashion-mnist", "yes"] for line in p.stdout.splitlines())


needs_data = pytest.mark.skipif(not fashion_mnist_cached(),
                                reason="no Fashion-MNIST in kiln's cache (kiln data fetch "
                                       "fashion-mnist)")


def zoo_solver(tmp_path, model, max_iter, extra=""):
    """The zoo's solver of `model` with max_iter, no test passes, no snapshots but the last
    (prefix in tmp_path), display every iteration."""
    src = models(model, model + "_solver.prototxt")
    lines = []
    for line in open(src):
        key = line.split(":")[0].strip()
        if key.startswith("test_") or key in ("snapshot", "display", "max_iter",
                                               "snapshot_prefix", "net"):
            continue
        lines.append(line)
    lines.append('net: "%s"\n' % models(model, model + "_train_test.prototxt"))
    lines.append("max_iter: %d\ndisplay: 1\n" % max_iter)
    lines.append('snapshot_prefix: "%s"\n' % (tmp_path / model))
    lines.append(extra)
    path = tmp_path / (model + "_solver.prototxt")
    path.write_text("".join(lines))
    return path


def weights_equal(a, b):
    """Two kiln nets' parameters bit for bit."""
    for name in a.params:
        for x, y in zip(a.params[name], b.params[name]):
            if not np.array_equal(x.data, y.data):
                return False
    return True
