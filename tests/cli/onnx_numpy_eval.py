# A helper of tests/cli/onnx_export_seq.sh (not a test): an ONNX evaluator in NumPy for the ops
# `kiln export onnx` writes for the sequence and text layers (and the shape ops, MatMul and Split
# of the transformer blocks `kiln import onnx` reads), written from the ONNX operator
# definitions (opset 13; LSTM, GRU and RNN as in opset 14 with layout 0), not from kiln's code,
# computing in float64. Onnx 1.12 has no reference evaluator and OpenCV's dnn does not run LSTM
# or attention graphs, so this is the independent side of the comparison.
#
#   onnx_numpy_eval.py MODEL.onnx DIR [MODEL.onnx DIR ...]
#
# Each model is first given to onnx.checker.check_model (full_check: with shape inference), then
# run on DIR's inputs (tests/support/onnx_ref.c's manifest and raw float32 files); every output
# ("blob") must be within 1e-4 of kiln's, every inner blob within 1e-4 of its largest magnitude
# (at least 1). One line per model: "ok MODEL: NAME max|d| X, ..." or "FAIL MODEL: why".
import math
import sys

import numpy as np
import onnx
from onnx_manifest import read_manifest
from onnx import numpy_helper

_erf = np.vectorize(math.erf, otypes=[np.float64])


def attrs(node):
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def recurrent(op, a, X, W, R, B=None, seq_lens=None, h0=None, c0=None, P=None):
    """ONNX's LSTM (gates i, o, f, c), GRU (z, r, h) and RNN, default activations, layout 0.
    Y is T x num_directions x N x H."""
    if a.get("layout", 0) != 0 or P is not None or seq_lens is not None or "clip" in a \
            or a.get("input_forget", 0) or "activations" in a:
        raise NotImplementedError(f"{op} with attributes or inputs beyond the exporter's")
    H = a["hidden_size"]
    ndir = 2 if a.get("direction", "forward") == "bidirectional" else 1
    reverse_only = a.get("direction", "forward") == "reverse"
    T, N, _ = X.shape
    ng = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    if B is None:
        B = np.zeros((ndir, 2 * ng * H))
    Y = np.zeros((T, ndir, N, H))
    for d in range(ndir):
        Wd, Rd, Wb, Rb = W[d], R[d], B[d][: ng * H], B[d][ng * H:]
        h = np.zeros((N, H)) if h0 is None else h0[d]
        c = np.zeros((N, H)) if c0 is None else c0[d]
        steps = range(T - 1, -1, -1) if (d == 1 or reverse_only) else range(T)
        gate = lambda M, k: M[k * H:(k + 1) * H]
        for t in steps:
            x = X[t]
            if op == "LSTM":
                pre = lambda k: x @ gate(Wd, k).T + h @ gate(Rd, k).T + gate(Wb, k) + gate(Rb, k)
                i, o, f, cc = sigmoid(pre(0)), sigmoid(pre(1)), sigmoid(pre(2)), np.tanh(pre(3))
                c = f * c + i * cc
                h = o * np.tanh(c)
            elif op == "GRU":
                z = sigmoid(x @ gate(Wd, 0).T + h @ gate(Rd, 0).T + gate(Wb, 0) + gate(Rb, 0))
                r = sigmoid(x @ gate(Wd, 1).T + h @ gate(Rd, 1).T + gate(Wb, 1) + gate(Rb, 1))
                if a.get("linear_before_reset", 0):
                    n = np.tanh(x @ gate(Wd, 2).T + r * (h @ gate(Rd, 2).T + gate(Rb, 2)) + gate(Wb, 2))
                else:
                    n = np.tanh(x @ gate(Wd, 2).T + (r * h) @ gate(Rd, 2).T + gate(Rb, 2) + gate(Wb, 2))
                h = (1 - z) * n + z * h
            else:
                h = np.tanh(x @ Wd.T + h @ Rd.T + Wb + Rb)
            Y[t, d] = h
    return Y


def reshape(x, shape):
    shape = [int(s) for s in shape]
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def run_node(node, v):
    op, a = node.op_type, attrs(node)
    x = [v[n] if n else None for n in node.input]
    binary = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
              "Pow": np.power, "Equal": np.equal, "Max": np.maximum}
    unary = {"Sqrt": np.sqrt, "Erf": _erf, "Tanh": np.tanh, "Sigmoid": sigmoid, "Exp": np.exp,
             "Log": np.log, "Abs": np.abs, "Relu": lambda t: np.maximum(t, 0),
             "Identity": lambda t: t, "Neg": np.negative}
    if op in binary:
        return [binary[op](x[0], x[1])]
    if op in unary:
        return [unary[op](x[0])]
    if op == "Cast":
        to = a["to"]
        if to == onnx.TensorProto.INT64:
            return [np.trunc(x[0]).astype(np.int64)]
        if to == onnx.TensorProto.INT32:
            return [np.trunc(x[0]).astype(np.int32)]
        if to == onnx.TensorProto.FLOAT:
            return [x[0].astype(np.float64)]
        raise NotImplementedError(f"Cast to {to}")
    if op == "Gather":
        return [np.take(x[0], x[1], axis=a.get("axis", 0))]
    if op == "MatMul":
        return [np.matmul(x[0], x[1])]
    if op == "Gemm":
        A = x[0].T if a.get("transA", 0) else x[0]
        Bm = x[1].T if a.get("transB", 0) else x[1]
        y = a.get("alpha", 1.0) * (A @ Bm)
        if len(x) > 2 and x[2] is not None:
            y = y + a.get("beta", 1.0) * x[2]
        return [y]
    if op == "Softmax":
        return [softmax(x[0], a.get("axis", -1))]
    if op == "Transpose":
        return [np.transpose(x[0], a.get("perm"))]
    if op == "Reshape":
        return [reshape(x[0], x[1])]
    if op == "Flatten":
        ax = a.get("axis", 1)
        return [x[0].reshape(int(np.prod(x[0].shape[:ax])), -1)]
    if op == "Squeeze":
        return [np.squeeze(x[0], axis=tuple(int(i) for i in x[1]))]
    if op == "Unsqueeze":
        y = x[0]
        for ax in sorted(int(i) % (y.ndim + len(x[1])) for i in x[1]):
            y = np.expand_dims(y, ax)
        return [y]
    if op == "Concat":
        return [np.concatenate(x, axis=a["axis"])]
    if op == "ReduceSumSquare":
        axes = tuple(a["axes"]) if "axes" in a else None
        return [np.sum(x[0] * x[0], axis=axes, keepdims=bool(a.get("keepdims", 1)))]
    if op in ("ReduceMean", "ReduceMax"):
        f = np.mean if op == "ReduceMean" else np.max
        axes = tuple(a["axes"]) if "axes" in a else None
        return [f(x[0], axis=axes, keepdims=bool(a.get("keepdims", 1)))]
    if op == "ArgMax":
        ax, y = a.get("axis", 0), x[0]
        if a.get("select_last_index", 0):
            idx = y.shape[ax] - 1 - np.argmax(np.flip(y, axis=ax), axis=ax)
        else:
            idx = np.argmax(y, axis=ax)
        return [np.expand_dims(idx, ax) if a.get("keepdims", 1) else idx]
    if op == "Not":
        return [np.logical_not(x[0])]
    if op == "ReduceSum":  # opset 13: the axes an input
        axes = tuple(int(i) for i in x[1]) if len(x) > 1 and x[1] is not None else None
        return [np.sum(x[0], axis=axes, keepdims=bool(a.get("keepdims", 1)))]
    if op == "Slice":
        axes = x[3] if len(x) > 3 and x[3] is not None else range(len(x[1]))
        steps = x[4] if len(x) > 4 and x[4] is not None else [1] * len(x[1])
        idx = [slice(None)] * x[0].ndim
        for st, en, ax, sp in zip(x[1], x[2], axes, steps):
            idx[int(ax)] = slice(int(st), int(en), int(sp))
        return [x[0][tuple(idx)]]
    if op == "Split":  # opset 13: the sizes an input (absent: equal pieces)
        ax = a.get("axis", 0)
        if len(x) > 1 and x[1] is not None:
            cuts = np.cumsum([int(i) for i in x[1]])[:-1]
        else:
            cuts = [x[0].shape[ax] * k // len(node.output) for k in range(1, len(node.output))]
        return np.split(x[0], cuts, axis=ax)
    if op == "Where":
        return [np.where(x[0], x[1], x[2])]
    if op in ("LSTM", "GRU", "RNN"):
        names = ["X", "W", "R", "B", "seq_lens", "h0", "c0", "P"]
        kw = {names[i]: t for i, t in enumerate(x) if i > 0 and t is not None}
        if op != "LSTM" and "c0" in kw:
            raise NotImplementedError
        return [recurrent(op, a, x[0], **kw)]
    raise NotImplementedError(f"op {op}")


def evaluate(model, inputs):
    v = {t.name: numpy_helper.to_array(t).astype(np.float64)
         if t.data_type == onnx.TensorProto.FLOAT else numpy_helper.to_array(t)
         for t in model.graph.initializer}
    v.update(inputs)
    for node in model.graph.node:
        if node.op_type == "Constant":
            v[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            continue
        outs = run_node(node, v)
        for name, val in zip(node.output, outs):
            if name:
                v[name] = val
    return v


def check(path, dir_):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    entries = read_manifest(dir_)
    graph_inputs = {i.name for i in model.graph.input}
    graph_outputs = [o.name for o in model.graph.output]
    inputs = {}
    for kind, name, value in entries:
        if kind == "input":
            if name not in graph_inputs:
                return False, f"input {name} is not among the model's inputs"
            inputs[name] = value.astype(np.float64)
    v = evaluate(model, inputs)
    report, ok = [], True
    for kind, name, ref in entries:
        if kind == "input":
            continue
        if kind == "blob" and name not in graph_outputs:
            return False, f"output {name} is not among the model's outputs {graph_outputs}"
        if name not in v:
            return False, f"no tensor {name} in the model"
        out = np.asarray(v[name])
        if out.size != ref.size:
            return False, f"{name}: the model gives shape {out.shape}, kiln {ref.shape}"
        d = float(np.max(np.abs(out.reshape(ref.shape) - ref))) if ref.size else 0.0
        bound = 1e-4 if kind == "blob" else 1e-4 * max(1.0, float(np.max(np.abs(ref))))
        ok &= d <= bound  # a NaN fails
        report.append(f"{name} max|d| {d:.3g}" + ("" if d <= bound else f" > {bound:.3g}"))
    return ok, ", ".join(report)


failed = False
args = sys.argv[1:]
for path, dir_ in zip(args[0::2], args[1::2]):
    try:
        ok, why = check(path, dir_)
    except Exception as e:  # the checker's refusal, an op not written here
        ok, why = False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else e}"
    print(f"{'ok' if ok else 'FAIL'} {path}: {why}", flush=True)
    failed |= not ok
sys.exit(1 if failed else 0)
