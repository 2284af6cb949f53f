# A helper of tests/cli/onnx_export.sh and slow_onnx_zoo.sh (not a test): checks ONNX models
# written by `kiln export onnx` with ONNX's own checker (onnx.checker.check_model, full_check:
# with shape inference) and runs them with OpenCV's ONNX importer (cv2.dnn.readNetFromONNX) on
# the inputs kiln ran (tests/support/onnx_ref.c's raw float32 files), comparing every output
# and every inner blob asked for within 1e-4 of its largest magnitude (at least 1: probabilities
# within 1e-4).
#
#   onnx_check.py MODEL.onnx DIR [MODEL.onnx DIR ...]
#
# One line per model: "ok MODEL opset N: OUTPUT max|d| X, ..." or "FAIL MODEL: why".
import sys

import numpy as np
import onnx
from onnx_manifest import read_manifest
import cv2


def check(path, dir_):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    opset = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")][0]
    entries = read_manifest(dir_)
    graph_inputs = [i.name for i in model.graph.input]
    graph_outputs = [o.name for o in model.graph.output]
    net = cv2.dnn.readNetFromONNX(path)
    # OpenCV names a layer after its ONNX node ("onnx_node!NAME" in 4.6), and an inner blob is
    # asked for by its layer's name
    layers = set(net.getLayerNames())
    producer = {out: node.name for node in model.graph.node for out in node.output}
    names = []
    for kind, name, value in entries:
        if kind == "input":
            if name not in graph_inputs:
                return False, f"input {name} is not among the model's inputs {graph_inputs}"
            net.setInput(value, name)
        else:
            if kind == "blob" and name not in graph_outputs:
                return False, f"output {name} is not among the model's outputs {graph_outputs}"
            if kind == "inner" and name not in layers:
                if name not in producer:
                    return False, f"no node of the model writes {name}"
                name = next((n for n in (producer[name], "onnx_node!" + producer[name])
                             if n in layers), name)
            names.append(name)
    got = net.forward(names)
    report, ok = [], True
    refs = [(k, n, v) for k, n, v in entries if k != "input"]
    for (kind, name, ref), out in zip(refs, got):
        out = np.asarray(out)
        if out.size != ref.size:
            return False, f"{name}: OpenCV gives shape {out.shape}, kiln {ref.shape}"
        d = float(np.max(np.abs(out.reshape(ref.shape) - ref))) if ref.size else 0.0
        # probabilities (at most 1) within 1e-4; outputs and inner blobs of larger values (a
        # detector's box offsets, scores) within 1e-4 of their largest magnitude
        bound = 1e-4 * max(1.0, float(np.max(np.abs(ref))))
        ok &= d <= bound
        report.append(f"{'output' if kind == 'blob' else 'blob'} {name} max|d| {d:.3g}"
                      + ("" if d <= bound else f" > {bound:.3g}"))
    return ok, f"opset {opset}: " + ", ".join(report)


failed = False
args = sys.argv[1:]
for path, dir_ in zip(args[0::2], args[1::2]):
    try:
        ok, why = check(path, dir_)
    except Exception as e:  # the checker's or OpenCV's refusal
        ok, why = False, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else e}"
    print(f"{'ok' if ok else 'FAIL'} {path} {why}", flush=True)
    failed |= not ok
sys.exit(1 if failed else 0)
