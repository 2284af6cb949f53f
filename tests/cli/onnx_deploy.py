# A helper of tests/cli/onnx_export.sh (not a test): the deploy form of one of the zoo's
# train/test nets, as Caffe's deploy files are written: the Data layers replaced by an Input
# layer "data" of the given shape, the Accuracy layers dropped, SoftmaxWithLoss become Softmax
# "prob" on the same scores.
#
#   onnx_deploy.py TRAIN_TEST.prototxt OUT.prototxt N C H W
import re
import sys

src, out, *shape = sys.argv[1:]
text = "\n".join(line.split("#", 1)[0] for line in open(src).read().splitlines())


def blocks(t):
    """The top-level statements: `layer { ... }` blocks and `name: "..."` lines."""
    i, n = 0, len(t)
    while i < n:
        m = re.compile(r"\s*(\w+)\s*(:\s*\"[^\"]*\"|\{)").match(t, i)
        if not m:
            break
        if m.group(2) != "{":
            yield m.group(0).strip()
            i = m.end()
            continue
        depth, j = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(t[j], 0)
            j += 1
        yield t[m.start():j].strip()
        i = j


lines = []
for b in blocks(text):
    kind = re.search(r'type:\s*"(\w+)"', b)
    kind = kind.group(1) if kind else None
    if kind in ("Data", "Accuracy"):
        continue
    if kind == "SoftmaxWithLoss":
        bottom = re.search(r'bottom:\s*"([^"]+)"', b).group(1)
        b = f'layer {{ name: "prob" type: "Softmax" bottom: "{bottom}" top: "prob" }}'
    lines.append(b)
    if b.startswith("name:"):
        dims = " ".join(f"dim: {d}" for d in shape)
        lines.append(f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}')
open(out, "w").write("\n".join(lines) + "\n")
