# A helper of tests/cli/onnx_import.sh (not a test): PyTorch models exported with
# torch.onnx.export, each with its inputs and PyTorch's outputs on them, for `kiln import onnx`
# and tests/support/onnx_ref.c's --compare.
#
#   onnx_torch.py OUTDIR NAME...
#
# For each NAME: OUTDIR/NAME.onnx and OUTDIR/NAME.d/manifest.txt ("input NAME FILE D0 D1 ..." and
# "blob NAME FILE D0 ...", raw float32; integer ids written as floats), and a line "ok NAME" or
# "FAIL NAME: why". The weights are PyTorch's initialisation from a fixed seed, BatchNorm's
# running statistics randomised so that they matter; every model is in eval mode.
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(800, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(self.conv1(x), 2)
        x = F.max_pool2d(self.conv2(x), 2)
        x = x.view(x.size(0), -1)  # Shape, Gather, Unsqueeze, Concat, Reshape unfolded
        return F.softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


# ResNet-20 as examples/onnx/train_imported_resnet20.py writes it (the model that example trains)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                                "onnx"))
from train_imported_resnet20 import ResNet20  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.5),
                                 nn.Linear(256, 128), nn.LeakyReLU(0.1), nn.Linear(128, 64),
                                 nn.Tanh(), nn.Linear(64, 10), nn.Softmax(dim=1))

    def forward(self, x):
        return self.net(x)


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2)
        self.out = nn.Linear(16, 20)

    def forward(self, ids):
        y, _ = self.lstm(self.embed(ids))
        return self.out(y)


class BiRNN(nn.Module):
    """A 2-layer bidirectional LSTM, then a GRU over its steps and a bidirectional GRU."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 5, num_layers=2, bidirectional=True)
        self.gru = nn.GRU(10, 4)
        self.bigru = nn.GRU(4, 3, bidirectional=True)
        self.out = nn.Linear(6, 7)

    def forward(self, x):
        y, _ = self.lstm(x)
        g, _ = self.gru(y)
        b, _ = self.bigru(torch.tanh(g))
        return self.out(b)


class Ops(nn.Module):
    """The other ops of the table: grouped, dilated and transposed convolution, PReLU, ELU,
    Sigmoid, Softplus, average pooling with ceil_mode and its padding, global max pooling,
    Concat, Mul and Add by constants per channel, Max, Split, Pow, Exp, Abs."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2)
        self.prelu = nn.PReLU(8)
        self.up = nn.ConvTranspose2d(16, 4, 3, stride=2, padding=1)
        self.gamma = nn.Parameter(torch.rand(1, 16, 1, 1) + 0.5)
        self.beta = nn.Parameter(torch.rand(16, 1, 1) - 0.5)
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        a = F.elu(self.c1(x), 0.5)
        b = self.prelu(self.c2(a))
        c = torch.cat([torch.sigmoid(a), F.softplus(b)], 1)
        c = c * self.gamma + self.beta
        p = F.avg_pool2d(c, 3, 2, 1, ceil_mode=True)
        q = F.max_pool2d(c, 3, 2, 1, ceil_mode=True)
        r = torch.max(p, q)
        s1, s2 = torch.split(r, [10, 6], dim=1)
        t = torch.cat([s1.abs().pow(2), torch.exp(-s2)], 1)
        u = self.up(t)
        g = F.adaptive_max_pool2d(u, 1).flatten(1)
        return torch.softmax(self.fc(g), 1), u


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer as PyTorch's defaults have it: post-norm, ReLU, time-major."""

    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)

    def forward(self, x):
        return self.block(x)


class EncoderGELU(nn.Module):
    """Pre-norm blocks with GELU, batch-first, and a classifier on the first position."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, activation="gelu",
                                           norm_first=True, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(self.norm(self.enc(x))[:, 0])


MODELS = {
    "lenet": (LeNet, [("data", (2, 1, 28, 28))], {"do_constant_folding": False}),
    # PRESERVE keeps the BatchNormalization nodes (EVAL folds them into the convolutions)
    "resnet20": (ResNet20, [("data", (2, 1, 28, 28))], {"training": torch.onnx.TrainingMode.PRESERVE}),
    "mlp": (MLP, [("data", (3, 1, 28, 28))], {"opset_version": 13}),
    "lstm": (LSTMNet, [("ids", (5, 3))], {}),
    "birnn": (BiRNN, [("data", (5, 3, 6))], {}),
    "ops": (Ops, [("data", (2, 3, 12, 12))], {"opset_version": 13}),
    "encoder": (Encoder, [("data", (4, 2, 16))], {}),
    # LayerNorm and GELU written out (opset 14), and as opset 17's LayerNormalization
    "encoder_gelu": (EncoderGELU, [("data", (3, 5, 16))], {}),
    "encoder17": (EncoderGELU, [("data", (3, 5, 16))], {"opset_version": 17}),
}


def build(name, outdir):
    cls, inputs, kw = MODELS[name]
    torch.manual_seed(7)
    model = cls()
    for m in model.modules():  # running statistics that matter
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    model.eval()
    args = []
    for iname, shape in inputs:
        if iname == "ids":
            args.append(torch.randint(0, 20, shape))
        else:
            args.append(torch.rand(shape) * 2 - 1)
    with torch.no_grad():
        outs = model(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    onames = ["out%d" % k for k in range(len(outs))]
    path = os.path.join(outdir, name + ".onnx")
    torch.onnx.export(model, tuple(args), path, input_names=[n for n, _ in inputs],
                      output_names=onames, **kw)
    d = os.path.join(outdir, name + ".d")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "manifest.txt"), "w") as mf:
        for k, ((iname, shape), a) in enumerate(zip(inputs, args)):
            a.numpy().astype("<f4").tofile(os.path.join(d, "input%d.f32" % k))
            mf.write("input %s input%d.f32 %s\n" % (iname, k, " ".join(map(str, shape))))
        for k, (oname, o) in enumerate(zip(onames, outs)):
            o.numpy().astype("<f4").tofile(os.path.join(d, "blob%d.f32" % k))
            mf.write("blob %s blob%d.f32 %s\n" % (oname, k, " ".join(map(str, o.shape))))


failed = False
for name in sys.argv[2:]:
    try:
        build(name, sys.argv[1])
        print("ok %s" % name, flush=True)
    except Exception as e:
        print("FAIL %s: %s: %s" % (name, type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else ""), flush=True)
        failed = True
sys.exit(1 if failed else 0)
