#!/usr/bin/env python3
"""Prints the expected outputs of test_gru_matches_pytorch (tests/test_layers_gru.c): torch.nn.GRU
(PyTorch 1.13, float32, CPU, time-major) on two small cases, so that the test checks kiln's GRU
against PyTorch itself without needing it. Run it with a Python that has torch (Debian's
python3-torch: /usr/bin/python3 scripts/gru-reference.py).

Every value is k/16 or k/8 for a small integer k, exact in float and in double, so the C test
makes the same inputs from the same formulas:
  parameter blob p (in kiln's order: weight_ih, bias_ih, weight_hh, bias_hh, then the same
  for the reverse direction), element k:  ((37 k + 11 p) mod 17 - 8) / 16
  x element k (T x N x D, row-major):     ((13 k + 5) mod 11 - 5) / 8
  h0 element k (1 x N x H):               ((7 k + 3) mod 9 - 4) / 8

"uni": T = 3, N = 2, D = 2, H = 3, starting from h0 (kiln: expose_hidden with cont 1 at every
step); the output T x N x H, then h_n.
"bidir": bidirectional, T = 4, N = 3, D = 2, H = 2, sequences of lengths 4, 2 and 3 padded at
the end and run packed (pack_padded_sequence), so the reverse direction of each starts at its
last valid step (kiln: cont 0 at each sequence's first step and on its padding); the output
T x N x 2H with the padding steps left out, in the order of t, then n."""
import torch

torch.set_default_dtype(torch.float32)


def param_value(p, k):
    return ((37 * k + 11 * p) % 17 - 8) / 16


def x_value(k):
    return ((13 * k + 5) % 11 - 5) / 8


def h0_value(k):
    return ((7 * k + 3) % 9 - 4) / 8


def filled(shape, value):
    n = 1
    for s in shape:
        n *= s
    return torch.tensor([value(k) for k in range(n)]).reshape(shape)


def set_params(gru, bidirectional):
    names = ["weight_ih_l0", "bias_ih_l0", "weight_hh_l0", "bias_hh_l0"]
    if bidirectional:
        names += [n + "_reverse" for n in names]
    with torch.no_grad():
        for p, name in enumerate(names):
            blob = getattr(gru, name)
            blob.copy_(filled(blob.shape, lambda k: param_value(p, k)))


def show(name, values):
    print(f"{name}: " + ", ".join(f"{v:.9g}" for v in values))


def uni():
    T, N, D, H = 3, 2, 2, 3
    gru = torch.nn.GRU(D, H)
    set_params(gru, False)
    x = filled((T, N, D), x_value)
    h0 = filled((1, N, H), h0_value)
    with torch.no_grad():
        y, hn = gru(x, h0)
    show("uni_y", y.flatten().tolist())
    show("uni_hT", hn.flatten().tolist())


def bidir():
    T, N, D, H = 4, 3, 2, 2
    lengths = [4, 2, 3]
    gru = torch.nn.GRU(D, H, bidirectional=True)
    set_params(gru, True)
    x = filled((T, N, D), x_value)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad():
        out, _ = gru(packed)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    valid = [v for t in range(T) for n in range(N) if t < lengths[n] for v in y[t, n].tolist()]
    show("bidir_y", valid)


uni()
bidir()
