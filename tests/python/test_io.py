"""kiln.io: images through kiln's reader, and the Transformer's arithmetic by hand."""
import zlib
import struct

import numpy as np
import pytest

import kiln
import kiln.io


def png(path, rgb):
    """A plain 8-bit RGB PNG written here (zlib from Python), no imaging library needed."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_load_image(tmp_path):
    rgb = np.random.RandomState(0).randint(0, 256, (5, 7, 3)).astype(np.uint8)
    png(tmp_path / "a.png", rgb)
    im = kiln.io.load_image(str(tmp_path / "a.png"))
    assert im.shape == (5, 7, 3) and im.dtype == np.float32
    assert np.array_equal(im, rgb / np.float32(255))  # RGB order, [0, 1]
    gray = kiln.io.load_image(str(tmp_path / "a.png"), color=False)
    assert gray.shape == (5, 7, 1)
    luma = (0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]) / 255
    assert np.abs(gray[..., 0] - luma).max() <= 1.0 / 255 + 1e-6
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(kiln.Error, match="bad.png"):
        kiln.io.load_image(str(tmp_path / "bad.png"))


def test_transformer_by_hand():
    t = kiln.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    im = np.random.RandomState(1).rand(4, 5, 3).astype(np.float32)
    x = t.preprocess("data", im)
    assert x.shape == (3, 4, 5) and x.dtype == np.float32
    # channel 0 of the blob is the image's blue (channel 2), scaled, less its mean, halved
    assert np.allclose(x[0], (im[:, :, 2] * 255 - 10) * 0.5, atol=1e-4)
    assert np.allclose(x[2], (im[:, :, 0] * 255 - 30) * 0.5, atol=1e-4)
    assert np.allclose(t.deprocess("data", x), im, atol=1e-5)
    # an image of another size is resized to the input's
    big = kiln.io.resize_image(im, (8, 10))
    assert big.shape == (8, 10, 3)
    assert t.preprocess("data", big).shape == (3, 4, 5)
    with pytest.raises(kiln.Error, match="3 channels"):
        t.set_mean("data", np.zeros(4))
    with pytest.raises(kiln.Error, match="not one of the inputs"):
        t.set_raw_scale("nope", 1)


def test_resize_constant_and_linear():
    flat = np.full((3, 3, 1), 0.25, np.float32)
    assert np.allclose(kiln.io.resize_image(flat, (7, 5)), 0.25)
    ramp = np.tile(np.arange(4, dtype=np.float32)[None, :, None], (2, 1, 1))
    up = kiln.io.resize_image(ramp, (2, 8))[0, :, 0]
    assert np.all(np.diff(up) >= 0) and up[0] == 0 and up[-1] == 3
