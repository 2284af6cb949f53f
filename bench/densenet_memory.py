"""PyTorch side of the DenseNet memory figures in docs/PERF.md: builds the DenseNet-BC of
bench/nets/densenet<depth>.prototxt (growth 12, compression 0.5, 1x28x28 input, no biases in the
convolutions), runs training steps of SGD (momentum 0.9) on random input at batch 64, and prints
`depth peak_rss_mb`. The plain module, as torchvision's DenseNet with memory_efficient=False:
every BatchNorm-ReLU output and every concatenation is kept for backward. Run with Debian's
/usr/bin/python3 (python3-torch): `python3 bench/densenet_memory.py DEPTH [STEPS]`."""
import resource
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def bn_relu(c):
    return nn.Sequential(nn.BatchNorm2d(c), nn.ReLU())


class Bottleneck(nn.Module):
    def __init__(self, c, k):
        super().__init__()
        self.a = nn.Sequential(bn_relu(c), nn.Conv2d(c, 4 * k, 1, bias=False))
        self.b = nn.Sequential(bn_relu(4 * k), nn.Conv2d(4 * k, k, 3, padding=1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.b(self.a(x))], 1)


class DenseNet(nn.Module):
    def __init__(self, depth, k=12, compression=0.5):
        super().__init__()
        n = (depth - 4) // 6
        c = 2 * k
        mods = [nn.Conv2d(1, c, 3, padding=1, bias=False)]
        for block in range(3):
            for _ in range(n):
                mods.append(Bottleneck(c, k))
                c += k
            if block < 2:
                out = int(c * compression)
                mods += [bn_relu(c), nn.Conv2d(c, out, 1, bias=False), nn.AvgPool2d(2, 2)]
                c = out
        mods += [bn_relu(c), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)]
        self.body = nn.Sequential(*mods)

    def forward(self, x):
        return self.body(x)


def main():
    depth = int(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    torch.manual_seed(0)
    net = DenseNet(depth)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(64, 1, 28, 28)
    y = torch.full((64,), 3, dtype=torch.long)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    params = sum(p.numel() for p in net.parameters())
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{depth} {rss_mb:.1f} {params}")


if __name__ == "__main__":
    main()
