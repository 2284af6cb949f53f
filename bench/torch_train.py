"""PyTorch side of `make bench`: trains the same architecture as bench/nets/<case>.prototxt on
random input with SGD (momentum 0.9, weight decay 5e-4), with a given number of threads, and
prints `samples_per_s peak_rss_mb`, a sample being a label (one step of a sequence in the
sequence cases, lstm and transformer). Run with Debian's /usr/bin/python3 (python3-torch)."""
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.ip1 = nn.Linear(800, 500)
        self.ip2 = nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(self.conv1(x), 2, 2)
        x = F.max_pool2d(self.conv2(x), 2, 2)
        return self.ip2(F.relu(self.ip1(x.flatten(1))))


class Cifar10Quick(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 32, 5, padding=2)
        self.conv3 = nn.Conv2d(32, 64, 5, padding=2)
        self.ip1 = nn.Linear(64 * 4 * 4, 64)
        self.ip2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 3, 2, ceil_mode=True))
        x = F.avg_pool2d(F.relu(self.conv2(x)), 3, 2, ceil_mode=True)
        x = F.avg_pool2d(F.relu(self.conv3(x)), 3, 2, ceil_mode=True)
        return self.ip2(self.ip1(x.flatten(1)))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


class ResNet20(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for stage, width in enumerate((16, 32, 64)):
            for i in range(3):
                layers.append(Block(cin, width, 2 if (i == 0 and stage > 0) else 1))
                cin = width
        self.blocks = nn.Sequential(*layers)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.avg_pool2d(x, 8).flatten(1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


# The sequence cases: time-major T x N x 512 input, a class per step, the loss over all steps.
SEQ_T, SEQ_N, SEQ_D, SEQ_CLASSES = 64, 32, 512, 10


class LSTM(nn.Module):
    """Two LSTM layers of 512 from a zero state (kiln's cont is 0 at t = 0), a classifier per
    step. PyTorch's two biases per layer against kiln's one change no product."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(SEQ_D, 512, num_layers=2)
        self.cls = nn.Linear(512, SEQ_CLASSES)

    def forward(self, x):
        return self.cls(self.lstm(x)[0])


class PreNormBlock(nn.Module):
    """x + attn(ln1(x)), then h + ff2(gelu(ff1(ln2(h)))): docs/sequence.md's block, no dropout."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.gelu = nn.GELU()
        self.ff2 = nn.Linear(ff, d)

    def forward(self, x, mask):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.ff2(self.gelu(self.ff1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(PreNormBlock(SEQ_D, 8, 2048) for _ in range(2))
        self.ln_f = nn.LayerNorm(SEQ_D)
        self.cls = nn.Linear(SEQ_D, SEQ_CLASSES)
        # causal: query t sees keys s <= t (True marks a key it may not see)
        self.register_buffer("mask", torch.ones(SEQ_T, SEQ_T, dtype=torch.bool).triu(1))

    def forward(self, x):
        for b in self.blocks:
            x = b(x, self.mask)
        return self.cls(self.ln_f(x))


# case: (module, input shape, label shape); a sample is a label, so for the sequence cases a
# sample is one step of one sequence (T x N per iteration) and samples/s are tokens/s
CASES = {
    "lenet": (LeNet, (64, 1, 28, 28), (64,)),
    "cifar10_quick": (Cifar10Quick, (100, 3, 32, 32), (100,)),
    "resnet20": (ResNet20, (128, 3, 32, 32), (128,)),
    "mlp": (MLP, (256, 784), (256,)),
    "lstm": (LSTM, (SEQ_T, SEQ_N, SEQ_D), (SEQ_T, SEQ_N)),
    "transformer": (Transformer, (SEQ_T, SEQ_N, SEQ_D), (SEQ_T, SEQ_N)),
}


def main():
    case, threads, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    make, shape, label_shape = CASES[case]
    model = make()
    x = torch.rand(shape)
    y = torch.full(label_shape, 3, dtype=torch.long).flatten()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad()
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), y).backward()
        opt.step()

    step()  # warm-up, as kiln's first iteration is not timed either
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    dt = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{iters * y.numel() / dt:.1f} {rss_mb:.1f}")


if __name__ == "__main__":
    main()
