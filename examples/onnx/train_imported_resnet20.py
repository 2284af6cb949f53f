"""A ResNet-20 written in PyTorch, exported with torch.onnx.export, imported into kiln with
`kiln import onnx`, and trained by `kiln train` on Fashion-MNIST from PyTorch's initial weights,
with the zoo's resnet20 data, solver and budget (models/resnet20).

    kiln data fetch fashion-mnist
    /usr/bin/python3 examples/onnx/train_imported_resnet20.py --kiln build/kiln --out run/

Needs PyTorch (Debian's python3-torch). Writes in OUT: resnet20.onnx, the imported deploy net
and weights, the train/test net (the deploy net with the zoo's two Data layers in place of its
Input layer, and a loss and an accuracy on its output), the solver, the metrics file and the
snapshots; prints the last test accuracy. --max-iter shortens the run (the tests use it).
"""
import argparse
import os
import re
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ZOO = os.path.join(HERE, "..", "..", "models", "resnet20")


class Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm, and the shortcut (a 1x1 projection where the shape
    changes)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet20(nn.Module):
    """He et al.'s CIFAR ResNet-20: 16, 32 and 64 channels, three blocks a stage."""

    def __init__(self, channels=1, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(3):
                layers.append(Block(cin, cout, stride if b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def layer_blocks(text):
    """The top-level `layer { ... }` blocks of a prototxt, as text."""
    blocks, i = [], 0
    while True:
        m = re.compile(r"^layer\s*\{", re.M).search(text, i)
        if not m:
            return blocks
        depth, j = 0, m.start()
        while True:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        blocks.append(text[m.start():j + 1])
        i = j + 1


def run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "..", "build", "kiln"))
    ap.add_argument("--out", default="imported_resnet20")
    ap.add_argument("--max-iter", type=int, default=0, help="a shorter run (default: the zoo's)")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)

    torch.manual_seed(1701)
    model = ResNet20().eval()
    onnx_path = os.path.join(out, "resnet20.onnx")
    # PRESERVE: an inference graph (the model is in eval mode) whose BatchNormalization nodes
    # stay, where the default (EVAL) folds each into the convolution before it, which would
    # leave a ResNet without BatchNorm to train
    torch.onnx.export(model, torch.zeros(1, 1, 28, 28), onnx_path, input_names=["data"],
                      output_names=["scores"], training=torch.onnx.TrainingMode.PRESERVE)
    deploy = os.path.join(out, "resnet20_deploy.prototxt")
    weights = os.path.join(out, "resnet20_torch.caffemodel")
    run([a.kiln, "import", "onnx", onnx_path, deploy, weights])

    # the deploy net's layers after its Input, between the zoo's Data layers and a loss
    zoo_net = open(os.path.join(ZOO, "resnet20_train_test.prototxt")).read()
    data_layers = [b for b in layer_blocks(zoo_net) if 'type: "Data"' in b]
    assert len(data_layers) == 2, "the zoo's net has a TRAIN and a TEST Data layer"
    body = [b for b in layer_blocks(open(deploy).read()) if 'type: "Input"' not in b]
    net = os.path.join(out, "resnet20_train_test.prototxt")
    with open(net, "w") as f:
        f.write('name: "ResNet-20 from PyTorch"\n')
        f.write("\n".join(data_layers + body) + "\n")
        f.write('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "scores" bottom: "label" '
                'top: "loss" }\n')
        f.write('layer { name: "accuracy" type: "Accuracy" bottom: "scores" bottom: "label" '
                'top: "accuracy" include { phase: TEST } }\n')
    solver = os.path.join(out, "resnet20_solver.prototxt")
    text = open(os.path.join(ZOO, "resnet20_solver.prototxt")).read()
    text = re.sub(r'^net: .*$', 'net: "%s"' % net, text, flags=re.M)
    text = re.sub(r'^snapshot_prefix: .*$', 'snapshot_prefix: "%s"' % os.path.join(out, "resnet20_torch"),
                  text, flags=re.M)
    if a.max_iter:
        text = re.sub(r'^max_iter: .*$', "max_iter: %d" % a.max_iter, text, flags=re.M)
        text = re.sub(r'^snapshot: .*$', "snapshot: %d" % a.max_iter, text, flags=re.M)
        text = re.sub(r'^test_interval: .*$', "test_interval: %d" % a.max_iter, text, flags=re.M)
    open(solver, "w").write(text)
    metrics = os.path.join(out, "metrics.jsonl")
    cmd = [a.kiln, "train", "--solver", solver, "--weights", weights, "--metrics", metrics]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    run(cmd)
    tests = [l for l in open(metrics) if '"event":"test"' in l]
    acc = float(re.search(r'"accuracy":([0-9.eE+-]+)', tests[-1]).group(1))
    print("test accuracy %.4f after %s iterations" %
          (acc, re.search(r'"iter":(\d+)', tests[-1]).group(1)))


if __name__ == "__main__":
    sys.exit(main())
