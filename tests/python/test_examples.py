"""The examples of examples/python run and show what they say."""
import os
import re
import subprocess
import sys

import pytest

from conftest import SRC, needs_data, run_kiln, zoo_solver

EX = os.path.join(SRC, "examples", "python")
HAVE_FMNIST = os.path.exists("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")


def example(name, *args, cwd):
    env = dict(os.environ)
    paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([EX] + paths)
    p = subprocess.run([sys.executable, os.path.join(EX, name)] + [str(a) for a in args],
                       capture_output=True, text=True, env=env, cwd=str(cwd))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_pycaffe_style(tmp_path):
    text = open(os.path.join(EX, "pycaffe_style.py")).read()
    assert "import kiln as caffe" in text and "kiln." not in text.replace("import kiln as", "")
    out = example("pycaffe_style.py", "", tmp_path / "e.caffemodel", cwd=tmp_path)
    assert "predicted class" in out and (tmp_path / "e.caffemodel").exists()


def test_net_surgery(tmp_path):
    out = example("net_surgery.py", "", tmp_path / "fc.caffemodel", cwd=tmp_path)
    assert "28x28: LeNet and its convolutional form differ by at most" in out
    assert "a 8x8 map of class scores" in out and (tmp_path / "fc.caffemodel").exists()


@needs_data
def test_train_loop(tmp_path):
    out = example("train_loop.py", 200, tmp_path / "t.png", cwd=tmp_path)
    acc = float(re.findall(r"test accuracy ([0-9.]+)", out)[-1])
    assert acc > 0.6, out


@needs_data
@pytest.mark.skipif(not HAVE_FMNIST, reason="Debian's dataset-fashion-mnist is not installed")
def test_classify(tmp_path):
    run_kiln("train", "--solver", zoo_solver(tmp_path, "lenet", 300))
    out = example("classify.py", tmp_path / "lenet_iter_300.caffemodel", "--count", 1000,
                  cwd=tmp_path)
    acc = float(re.search(r"accuracy ([0-9.]+) on 1000 test images", out).group(1))
    assert acc > 0.7, out
    assert "truth" in out
