#!/usr/bin/env python3
"""Prints the expected outputs of test_mha_tiny_cases (tests/test_layers_transformer.c): the tiny
multi-head attention case (D = 4, 2 heads, T = 3, N = 1) computed step by step as PyTorch's
torch.nn.functional.multi_head_attention_forward does it (time-major, no dropout): the
in-projection split into W_q, W_k, W_v; q, k, v viewed as (T, N H, hd) and transposed to N H
batches; q scaled by 1/sqrt(hd); the causal mask -inf above the diagonal; key_padding_mask True
on padding; softmax; the batches put back to (T, N, D); the out-projection. Plain Python floats
(double), so the tests need neither PyTorch nor NumPy; the values are committed in the test."""
import math

T, N, D, H = 3, 1, 4, 2
HD = D // H
X = [[0.5, -1.0, 0.25, 0.8], [-0.3, 0.7, 1.2, -0.6], [1.1, 0.2, -0.9, 0.4]]
IN_PROJ_WEIGHT = [
    [0.2, -0.1, 0.4, 0.0], [-0.3, 0.5, 0.1, 0.2], [0.1, 0.1, -0.2, 0.6], [0.0, -0.4, 0.3, 0.1],
    [0.5, 0.2, -0.1, -0.3], [-0.2, 0.3, 0.2, 0.4], [0.3, -0.5, 0.0, 0.2], [0.1, 0.4, -0.3, -0.1],
    [-0.4, 0.1, 0.5, 0.2], [0.2, 0.2, 0.1, -0.5], [0.6, -0.1, -0.2, 0.1], [-0.1, 0.3, 0.4, 0.3]]
IN_PROJ_BIAS = [0.01, -0.02, 0.03, 0.0, 0.05, -0.01, 0.02, 0.04, -0.03, 0.01, 0.0, 0.02]
OUT_PROJ_WEIGHT = [[0.3, -0.2, 0.1, 0.4], [0.1, 0.5, -0.3, 0.2], [-0.4, 0.1, 0.2, 0.3],
                   [0.2, 0.3, 0.4, -0.1]]
OUT_PROJ_BIAS = [0.1, -0.1, 0.05, 0.0]


def linear(x, w, b):
    return [sum(x[j] * w[i][j] for j in range(len(x))) + b[i] for i in range(len(w))]


def attention(causal, key_padding_mask):
    """key_padding_mask: per key step, True where it is padding (PyTorch's sense), or None."""
    q = [linear(X[t], IN_PROJ_WEIGHT[0:D], IN_PROJ_BIAS[0:D]) for t in range(T)]
    k = [linear(X[t], IN_PROJ_WEIGHT[D:2 * D], IN_PROJ_BIAS[D:2 * D]) for t in range(T)]
    v = [linear(X[t], IN_PROJ_WEIGHT[2 * D:], IN_PROJ_BIAS[2 * D:]) for t in range(T)]
    scaling = 1 / math.sqrt(HD)
    heads = []
    for h in range(H):  # batch b = n H + h of the (T, N H, hd) view; N = 1
        qh = [[q[t][h * HD + j] * scaling for j in range(HD)] for t in range(T)]
        kh = [[k[t][h * HD + j] for j in range(HD)] for t in range(T)]
        vh = [[v[t][h * HD + j] for j in range(HD)] for t in range(T)]
        rows = []
        for t in range(T):
            scores = [sum(qh[t][j] * kh[s][j] for j in range(HD)) for s in range(T)]
            for s in range(T):
                if (causal and s > t) or (key_padding_mask and key_padding_mask[s]):
                    scores[s] = -math.inf
            top = max(scores)
            if top == -math.inf:  # PyTorch: NaN; kiln: zero weights (docs/sequence.md)
                weights = [0.0] * T
            else:
                e = [math.exp(a - top) if a != -math.inf else 0.0 for a in scores]
                weights = [a / sum(e) for a in e]
            rows.append([sum(weights[s] * vh[s][j] for s in range(T)) for j in range(HD)])
        heads.append(rows)
    ctx = [[heads[h][t][j] for h in range(H) for j in range(HD)] for t in range(T)]
    return [linear(ctx[t], OUT_PROJ_WEIGHT, OUT_PROJ_BIAS) for t in range(T)]


for name, causal, mask in [("plain", False, None), ("causal", True, None),
                           ("padding", False, [False, False, True]),
                           ("causal_padding", True, [False, False, True])]:
    y = attention(causal, mask)
    print(f"torch_{name}: " + ", ".join(f"{v:.9g}" for row in y for v in row))
