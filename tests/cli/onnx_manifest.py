# Shared by tests/cli/onnx_check.py and onnx_numpy_eval.py (not a test): the tensors that
# tests/support/onnx_ref.c wrote into a folder, as its manifest.txt lists them ("input NAME FILE
# D0 D1 ...", "blob NAME FILE ...", "inner NAME FILE ...", raw little-endian float32).
import numpy as np


def read_manifest(dir_):
    """[(kind, name, array)] in the manifest's order."""
    entries = []
    with open(f"{dir_}/manifest.txt") as f:
        for line in f:
            if not line.strip():
                continue
            kind, name, path, *dims = line.split()
            a = np.fromfile(f"{dir_}/{path}", dtype="<f4").reshape([int(d) for d in dims])
            entries.append((kind, name, a))
    return entries
