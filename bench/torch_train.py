"""PyTorch side of `make bench` and bench/gpu: trains the same architecture as
bench/nets/<case>.prototxt on random input with SGD (momentum 0.9, weight decay 5e-4), with a
given number of threads, and prints `samples_per_s peak_mb`, a sample being a label (one step of
a sequence in the sequence cases, lstm and transformer). On the CPU (the default; run with
Debian's /usr/bin/python3, python3-torch) peak_mb is the peak RSS.

usage: torch_train.py CASE THREADS ITERS [--params] [--device cuda] [--tf32] [--batch N]
                       [--autocast]
  --params      print the parameter count and stop (to check the nets)
  --device D    train on D (cuda, cuda:N): model and data on the GPU, cudnn.benchmark on, the
                clock read after torch.cuda.synchronize(); peak_mb is then
                torch.cuda.max_memory_allocated() in MiB
  --tf32        let cuBLAS and cuDNN use TF32 tensor cores (without it both are kept off on
                CUDA); no effect on the CPU, which has no TF32
  --batch N     the batch: the first axis of an image case, the second (N) of a time-major
                T x N x D sequence case
  --autocast    bf16 mixed precision as PyTorch's AMP recipe has it: the forward and the loss
                under torch.autocast("cpu", dtype=torch.bfloat16) (on CUDA, "cuda"), the
                backward and the optimizer step outside it; the weights stay fp32 (bench/run's
                bf16 table, against kiln --precision bf16)"""
import contextlib
import os
import resource
import sys
import time
import warnings

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


# The big ImageNet nets of `make bench` (their kiln side: models/<name>/deploy.prototxt made
# trainable by bench/run), written here as those deploy nets are: Caffe's pooling rounds up
# (ceil_mode), LRN is across channels with alpha over the window as Caffe's, dropout as in the
# deploy nets. No torchvision: Debian's python3-torch comes without it.


def pool(x, k, s, pad=0, avg=False):
    f = F.avg_pool2d if avg else F.max_pool2d
    return f(x, k, s, pad, ceil_mode=True)


class AlexNet(nn.Module):
    """CaffeNet-style AlexNet: grouped conv2, conv4, conv5; LRN after conv1 and conv2."""

    def __init__(self):
        super().__init__()
        self.c = nn.ModuleList([nn.Conv2d(3, 96, 11, 4), nn.Conv2d(96, 256, 5, 1, 2, groups=2),
                                nn.Conv2d(256, 384, 3, 1, 1), nn.Conv2d(384, 384, 3, 1, 1, groups=2),
                                nn.Conv2d(384, 256, 3, 1, 1, groups=2)])
        self.lrn = nn.LocalResponseNorm(5, 1e-4, 0.75, 1.0)
        self.fc6, self.fc7, self.fc8 = nn.Linear(9216, 4096), nn.Linear(4096, 4096), nn.Linear(4096, 1000)

    def forward(self, x):
        x = pool(self.lrn(F.relu(self.c[0](x))), 3, 2)
        x = pool(self.lrn(F.relu(self.c[1](x))), 3, 2)
        x = F.relu(self.c[4](F.relu(self.c[3](F.relu(self.c[2](x))))))
        x = pool(x, 3, 2).flatten(1)
        x = F.dropout(F.relu(self.fc6(x)), 0.5, self.training)
        x = F.dropout(F.relu(self.fc7(x)), 0.5, self.training)
        return self.fc8(x)


class VGG16(nn.Module):
    """Configuration D: thirteen 3x3 convolutions, five 2x2 max pools, three fully connected."""

    def __init__(self):
        super().__init__()
        cfg, layers, cin = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                            512, 512, 512, "M"), [], 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
            else:
                layers += [nn.Conv2d(cin, v, 3, 1, 1), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*layers)
        self.fc6, self.fc7, self.fc8 = nn.Linear(25088, 4096), nn.Linear(4096, 4096), nn.Linear(4096, 1000)

    def forward(self, x):
        x = self.features(x).flatten(1)
        x = F.dropout(F.relu(self.fc6(x)), 0.5, self.training)
        x = F.dropout(F.relu(self.fc7(x)), 0.5, self.training)
        return self.fc8(x)


class Inception(nn.Module):
    def __init__(self, cin, c1, r3, c3, r5, c5, cp):
        super().__init__()
        self.b1 = nn.Conv2d(cin, c1, 1)
        self.b3 = nn.Sequential(nn.Conv2d(cin, r3, 1), nn.ReLU(inplace=True), nn.Conv2d(r3, c3, 3, 1, 1))
        self.b5 = nn.Sequential(nn.Conv2d(cin, r5, 1), nn.ReLU(inplace=True), nn.Conv2d(r5, c5, 5, 1, 2))
        self.bp = nn.Conv2d(cin, cp, 1)

    def forward(self, x):
        return torch.cat([F.relu(self.b1(x)), F.relu(self.b3(x)), F.relu(self.b5(x)),
                          F.relu(self.bp(pool(x, 3, 1, 1)))], 1)


class GoogLeNet(nn.Module):
    """Inception v1 as models/googlenet's deploy net: LRN after pool1 and conv2, no auxiliary
    classifiers (the deploy net has none)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3)
        self.conv2r, self.conv2 = nn.Conv2d(64, 64, 1), nn.Conv2d(64, 192, 3, 1, 1)
        self.lrn = nn.LocalResponseNorm(5, 1e-4, 0.75, 1.0)
        cfg = {"3a": (192, 64, 96, 128, 16, 32, 32), "3b": (256, 128, 128, 192, 32, 96, 64),
               "4a": (480, 192, 96, 208, 16, 48, 64), "4b": (512, 160, 112, 224, 24, 64, 64),
               "4c": (512, 128, 128, 256, 24, 64, 64), "4d": (512, 112, 144, 288, 32, 64, 64),
               "4e": (528, 256, 160, 320, 32, 128, 128), "5a": (832, 256, 160, 320, 32, 128, 128),
               "5b": (832, 384, 192, 384, 48, 128, 128)}
        self.inc = nn.ModuleDict({k: Inception(*v) for k, v in cfg.items()})
        self.fc = nn.Linear(1024, 1000)

    def forward(self, x):
        x = self.lrn(pool(F.relu(self.conv1(x)), 3, 2))
        x = pool(self.lrn(F.relu(self.conv2(F.relu(self.conv2r(x))))), 3, 2)
        for k in ("3a", "3b", "P", "4a", "4b", "4c", "4d", "4e", "P", "5a", "5b"):
            x = pool(x, 3, 2) if k == "P" else self.inc[k](x)
        x = F.dropout(pool(x, 7, 1, avg=True).flatten(1), 0.4, self.training)
        return self.fc(x)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                               nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                               nn.Conv2d(width, width * 4, 1, bias=False), nn.BatchNorm2d(width * 4))
        self.short = None
        if stride != 1 or cin != width * 4:
            self.short = nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride, bias=False), nn.BatchNorm2d(width * 4))

    def forward(self, x):
        return F.relu(self.a(x) + (self.short(x) if self.short is not None else x))


class ResNet50(nn.Module):
    """As models/resnet50's deploy net: the stride in each stage's first 1x1 convolution."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for stage, (n, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
            for i in range(n):
                blocks.append(Bottleneck(cin, width, 2 if (i == 0 and stage > 0) else 1))
                cin = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(2048, 1000)

    def forward(self, x):
        x = pool(F.relu(self.bn1(self.conv1(x))), 3, 2)
        return self.fc(pool(self.blocks(x), 7, 1, avg=True).flatten(1))


# case: (module, input shape, label shape); a sample is a label, so for the sequence cases a
# sample is one step of one sequence (T x N per iteration) and samples/s are tokens/s
CASES = {
    "lenet": (LeNet, (64, 1, 28, 28), (64,)),
    "cifar10_quick": (Cifar10Quick, (100, 3, 32, 32), (100,)),
    "resnet20": (ResNet20, (128, 3, 32, 32), (128,)),
    "mlp": (MLP, (256, 784), (256,)),
    "lstm": (LSTM, (SEQ_T, SEQ_N, SEQ_D), (SEQ_T, SEQ_N)),
    "transformer": (Transformer, (SEQ_T, SEQ_N, SEQ_D), (SEQ_T, SEQ_N)),
    "alexnet": (AlexNet, (64, 3, 227, 227), (64,)),
    "vgg16": (VGG16, (16, 3, 224, 224), (16,)),
    "googlenet": (GoogLeNet, (32, 3, 224, 224), (32,)),
    "resnet50": (ResNet50, (32, 3, 224, 224), (32,)),
}


def options(argv):
    """The flags after the three positional arguments: (params, device, tf32, batch, autocast)."""
    params, device, tf32, batch, autocast = False, "cpu", False, None, False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--params":
            params = True
        elif a == "--tf32":
            tf32 = True
        elif a == "--autocast":
            autocast = True
        elif a in ("--device", "--batch") and i + 1 < len(argv):
            i += 1
            if a == "--device":
                device = argv[i]
            else:
                batch = int(argv[i])
        else:
            sys.exit(f"torch_train.py: unknown option {a!r} (see the usage in its docstring)")
        i += 1
    return params, device, tf32, batch, autocast


def with_batch(shape, label_shape, batch):
    """The case's input and label shapes at another batch: the first axis of an image case, the
    second of a time-major sequence case (its labels T x N)."""
    axis = 1 if len(label_shape) == 2 else 0
    shape, label_shape = list(shape), list(label_shape)
    shape[axis] = label_shape[axis] = batch
    return tuple(shape), tuple(label_shape)


def main():
    case, threads, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    params, device, tf32, batch, autocast = options(sys.argv[4:])
    cuda = device.startswith("cuda")
    # Subnormal floats flushed to zero, as kiln flushes them (KILN_DENORMALS): the labels are
    # constant, the loss falls to 0, and the gradients fade into the subnormal range, where
    # many x86 processors take a microcode assist per operand. Before any thread is started,
    # so that each inherits it. BENCH_TORCH_DENORMALS=keep leaves PyTorch's default.
    if os.environ.get("BENCH_TORCH_DENORMALS") != "keep":
        torch.set_flush_denormal(True)
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    make, shape, label_shape = CASES[case]
    if batch is not None:
        shape, label_shape = with_batch(shape, label_shape, batch)
    model = make()
    if params:  # the parameter count, to check the nets
        print(sum(p.numel() for p in model.parameters()))
        return
    if cuda:
        # TF32 set both ways explicitly: PyTorch's defaults differ between cuBLAS (off) and
        # cuDNN (on), and the comparison needs both sides on the same arithmetic. The legacy
        # flags, which set cudnn's conv and rnn alike; newer PyTorch warns that they will go.
        warnings.filterwarnings("ignore", message=".*new API settings to control TF32.*")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        # what a PyTorch user training fixed shapes sets: cuDNN picks its fastest algorithms
        # in the warm-up step
        torch.backends.cudnn.benchmark = True
        model = model.to(device)
    x = torch.rand(shape, device=device)
    y = torch.full(label_shape, 3, dtype=torch.long, device=device).flatten()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    # --autocast: the forward and the loss in the autocast region, the backward (which runs
    # each op in the dtype its forward had) and the step outside, as PyTorch's AMP recipe.
    # bf16 has fp32's exponent range, so no GradScaler; without the flag, no region at all
    amp = (torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16) if autocast
           else contextlib.nullcontext())

    def step():
        opt.zero_grad()
        with amp:
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        loss.backward()
        opt.step()

    step()  # warm-up, as kiln's first iteration is not timed either
    if cuda:  # the clock starts and stops with the GPU idle: kernels run asynchronously
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    if cuda:  # the caching allocator's peak of live tensors: with the warm-up's, and the
        # workspaces of cuDNN's algorithm trials
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"{iters * y.numel() / dt:.1f} {peak_mb:.1f}")


if __name__ == "__main__":
    main()
