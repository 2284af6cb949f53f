"""Nets imported from PyTorch by `kiln import onnx` train as PyTorch's own would: their backward
pass gives PyTorch's autograd gradients, of the input and of the parameters (a transformer
encoder whose attention comes in as MatMul, Permute and Softmax layers and whose LayerNorm and
GELU chains come in as those layers; a bidirectional LSTM and GRU net). Needs python3-torch;
skipped under the sanitizers (PyTorch's libraries are not built with them)."""
import os

import numpy as np
import pytest

import kiln
from conftest import run_kiln

if os.environ.get("KILN_PY_ASAN") == "1":
    pytest.skip("PyTorch does not run under AddressSanitizer's preloaded runtime",
                allow_module_level=True)
torch = pytest.importorskip("torch")
nn = torch.nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, activation="gelu",
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(self.enc(x))


class BiRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 5, bidirectional=True)
        self.gru = nn.GRU(10, 4, bidirectional=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.gru(self.lstm(x)[0])[0])


def imported(tmp_path, model, x, opset):
    """The model through torch.onnx.export and kiln import onnx, as a kiln.Net with
    force_backward."""
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["data"], output_names=["out"],
                      opset_version=opset)
    run_kiln("import", "onnx", path, tmp_path / "m.prototxt", tmp_path / "m.caffemodel")
    text = (tmp_path / "m.prototxt").read_text()
    (tmp_path / "fb.prototxt").write_text("force_backward: true\n" + text)
    return kiln.Net(str(tmp_path / "fb.prototxt"), str(tmp_path / "m.caffemodel"), kiln.TEST)


def gradients(model, net, x):
    """PyTorch's and kiln's output, input gradient and parameter gradients of sum(out * r)."""
    torch.manual_seed(3)
    xt = x.clone().requires_grad_(True)
    out = model(xt)
    r = torch.rand(out.shape) * 2 - 1
    (out * r).sum().backward()
    net.forward(data=x.numpy())
    got_out = net.blobs["out"].data.copy()
    for ps in net.params.values():
        for p in ps:
            p.diff[...] = 0
    net.backward(out=r.numpy())
    return out.detach().numpy(), got_out, xt.grad.numpy(), net.blobs["data"].diff.copy()


def close(got, want, what):
    scale = max(1.0, float(np.abs(want).max()))
    d = float(np.abs(got - want).max())
    assert d <= 1e-4 * scale, "%s: max|d| %g (largest %g)" % (what, d, scale)


@pytest.mark.parametrize("opset", [14, 17])
def test_encoder_gradients_are_pytorchs(tmp_path, opset):
    torch.manual_seed(11)
    model = Encoder().eval()
    x = torch.rand(6, 3, 16) * 2 - 1
    net = imported(tmp_path, model, x, opset)
    want, got, gx_want, gx_got = gradients(model, net, x)
    close(got, want, "output")
    close(gx_got, gx_want, "input gradient")
    # the parameters: the two LayerNorms of each block, the final Linear and the first block's
    # out-projection
    layers = net.params
    for b in range(2):
        blk = model.enc.layers[b]
        for norm in ("norm1", "norm2"):
            ln = [n for n in layers if n.startswith("/enc/layers.%d/%s/" % (b, norm))]
            assert len(ln) == 1, (norm, list(layers))
            m = getattr(blk, norm)
            close(layers[ln[0]][0].diff, m.weight.grad.numpy(), "%s gain" % ln[0])
            close(layers[ln[0]][1].diff, m.bias.grad.numpy(), "%s bias" % ln[0])
    # the final Linear on T x N x 16 is a MatMul by W^T: an InnerProduct with transpose: true,
    # its weights stored K x N
    fc = [n for n in layers if n.startswith("/fc/")]
    close(layers[fc[0]][0].diff, model.fc.weight.grad.numpy().T, "fc weights")
    close(layers[fc[0]][1].diff, model.fc.bias.grad.numpy(), "fc bias")
    op = [n for n in layers if n.startswith("/enc/layers.0/self_attn/Gemm")]
    assert op, list(layers)
    close(layers[op[0]][0].diff, model.enc.layers[0].self_attn.out_proj.weight.grad.numpy(),
          "out-projection weights")


def test_bidirectional_rnn_gradients_are_pytorchs(tmp_path):
    torch.manual_seed(12)
    model = BiRNN().eval()
    x = torch.rand(7, 2, 6) * 2 - 1
    net = imported(tmp_path, model, x, 14)
    want, got, gx_want, gx_got = gradients(model, net, x)
    close(got, want, "output")
    close(gx_got, gx_want, "input gradient")
    # the LSTM's input weights, both directions: kiln's gates i, f, o, g are PyTorch's i, f, g, o
    lstm = [l.name for l in net.layers if l.type == "LSTM"]
    H = 5
    order = [0, 1, 3, 2]
    for d, suffix in enumerate(["", "_reverse"]):
        want_w = getattr(model.lstm, "weight_ih_l0" + suffix).grad.numpy()
        got_w = net.params[lstm[0]][3 * d].diff
        for g in range(4):
            close(got_w[g * H:(g + 1) * H], want_w[order[g] * H:(order[g] + 1) * H],
                  "LSTM %s gate %d" % (suffix or "forward", g))
