# Images through the `kiln` command: PNG files (RGB, gray and palette ones, written here with
# Python's zlib) in a list train a small net through an ImageData layer, and through Data layers
# on the raw and the encoded LMDBs that `kiln convert images` makes of the same list; with the
# same seed and no shuffle the three trainings end with the same weights, bit for bit. A V1
# net's IMAGE_DATA layer is upgraded on load. Then clean errors: a list line without a label, a truncated image met while training, a damaged
# image in a conversion (nothing left behind), bad options.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
command -v python3 >/dev/null || { echo "images.sh: needs python3 to write PNG files"; exit 77; }

mkdir imgs
python3 - <<'PY'
import struct, zlib

def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

def png(path, w, h, ctype, rows, extra=b''):
    raw = b''.join(b'\x00' + bytes(r) for r in rows)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, ctype, 0, 0, 0))
                + extra + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))

palette = bytes(v for i in range(16) for v in ((i * 53) % 256, (i * 97) % 256, (i * 31) % 256))
with open('list.txt', 'w') as lst:
    for i in range(24):
        label = i % 4
        # each class its own pattern, each image its own noise
        px = lambda x, y, k: (label * 60 + x * 9 * (k + 1) + y * 5 + (i * 37 + x * y * 11) % 23) % 256
        name = 'img%02d.png' % i
        if i % 6 == 4:    # gray
            png('imgs/' + name, 8, 8, 0, [[px(x, y, 1) for x in range(8)] for y in range(8)])
        elif i % 6 == 5:  # palette
            png('imgs/' + name, 8, 8, 3, [[(px(x, y, 0) + label) % 16 for x in range(8)] for y in range(8)],
                chunk(b'PLTE', palette))
        else:
            png('imgs/' + name, 8, 8, 2, [[px(x, y, k) for x in range(8) for k in range(3)] for y in range(8)])
        lst.write('%s %d\n' % (name, label))
PY

out=$("$KILN" convert images list.txt imgs/ raw_lmdb 2>&1) && [ "$out" = "wrote 24 records to raw_lmdb" ] &&
  pass || fail "convert images: $out"
out=$("$KILN" convert images list.txt imgs/ enc_lmdb --encoded 2>&1) &&
  [ "$out" = "wrote 24 records to enc_lmdb" ] && pass || fail "convert images --encoded: $out"
out=$("$KILN" convert images list.txt imgs/ small_lmdb --resize 4 6 --gray --shuffle --seed 3 2>&1) &&
  [ "$out" = "wrote 24 records to small_lmdb" ] && pass || fail "convert images --resize: $out"

# net NAME DATA_LAYER: a conv net over 3 x 8 x 8 images, cropped to 6 x 6 and mirrored at random.
net() {
  cat <<NET
name: "images"
layer { name: "d" top: "data" top: "label" $2
  transform_param { scale: 0.00390625 crop_size: 6 mirror: true mean_value: 100 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
  printf 'net: "%s.prototxt"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 12\n' "$1" \
    > "$1_solver.prototxt"
  printf 'random_seed: 11\nsnapshot_prefix: "%s"\ndisplay: 0\n' "$1" >> "$1_solver.prototxt"
}
net list 'type: "ImageData" image_data_param { source: "list.txt" root_folder: "imgs/" batch_size: 5 }' \
  > list.prototxt
net raw 'type: "Data" data_param { source: "raw_lmdb" batch_size: 5 backend: LMDB }' > raw.prototxt
net enc 'type: "Data" data_param { source: "enc_lmdb" batch_size: 5 backend: LMDB }' > enc.prototxt
for s in list raw enc; do
  "$KILN" train --solver ${s}_solver.prototxt >/dev/null 2>train_$s.log && [ -f ${s}_iter_12.caffemodel ] &&
    pass || fail "train from $s: $(tail -5 train_$s.log)"
done

# The LMDB nets differ only in the source, which a .caffemodel does not hold: the files are equal.
cmp raw_iter_12.caffemodel enc_iter_12.caffemodel && pass ||
  fail "raw and encoded LMDBs trained different weights"
# The ImageData net's file names its data layer's type (ImageData, not Data) and nothing else
# differs: past the first layer's record the bytes are equal, and so is every weight.
python3 - list_iter_12.caffemodel raw_iter_12.caffemodel <<'PY' && pass || fail "ImageData and Data trained different weights"
import sys

def fields(buf):
    """The top-level fields of a protobuf message: (tag, raw bytes) in order."""
    out, i = [], 0
    while i < len(buf):
        start, tag, shift = i, 0, 0
        while True:
            b = buf[i]; i += 1; tag |= (b & 0x7f) << shift; shift += 7
            if b < 0x80: break
        wire = tag & 7
        if wire == 0:
            while buf[i] >= 0x80: i += 1
            i += 1
        elif wire == 2:
            n, shift = 0, 0
            while True:
                b = buf[i]; i += 1; n |= (b & 0x7f) << shift; shift += 7
                if b < 0x80: break
            i += n
        elif wire == 5: i += 4
        elif wire == 1: i += 8
        else: sys.exit('wire type %d' % wire)
        out.append((tag >> 3, buf[start:i]))
    return out

a, b = (fields(open(p, 'rb').read()) for p in sys.argv[1:3])
layers = [i for i, (t, _) in enumerate(a) if t == 100]
first = layers[0]
assert b'ImageData' in a[first][1] and len(a) == len(b) and len(layers) > 3
for i, (x, y) in enumerate(zip(a, b)):
    if i != first and x != y: sys.exit('field %d differs' % i)
PY
"$KILN" compare-weights list_iter_12.caffemodel raw_iter_12.caffemodel >/dev/null && pass ||
  fail "compare-weights: ImageData against Data"
grep -q "error\|nan" train_list.log && fail "ImageData training log: $(cat train_list.log)" || pass

# A V1 net's IMAGE_DATA layer, its transformation in image_data_param (the old place), is
# upgraded on load: an ImageData layer cropping to 6 x 6.
cat > v1img.prototxt <<NET
name: "v1"
layers { name: "d" type: IMAGE_DATA top: "data" top: "label"
  image_data_param { source: "list.txt" root_folder: "imgs/" batch_size: 5 crop_size: 6
    mirror: true scale: 0.00390625 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip"
  inner_product_param { num_output: 4 } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss" }
NET
"$KILN" describe --model v1img.prototxt 2>&1 | grep -Eq '^d +ImageData +5x3x6x6 ' && pass ||
  fail "V1 IMAGE_DATA: $("$KILN" describe --model v1img.prototxt 2>&1)"
"$KILN" upgrade v1img.prototxt v1img_up.prototxt >/dev/null 2>&1 &&
  [ "$(grep -c crop_size v1img_up.prototxt)" = 1 ] &&
  grep -A4 transform_param v1img_up.prototxt | grep -q 'crop_size: 6' && pass ||
  fail "kiln upgrade of a V1 IMAGE_DATA net: $(cat v1img_up.prototxt)"

# Clean errors, each naming the file and the line.
printf 'img00.png 0\nimg01.png\n' > nolabel.txt
net nolabel 'type: "ImageData" image_data_param { source: "nolabel.txt" root_folder: "imgs/" batch_size: 2 }' \
  > nolabel.prototxt
expect_refusal "list line without a label" --want "nolabel.txt:2" --want "has no label" -- \
  "$KILN" train --solver nolabel_solver.prototxt
head -c 60 imgs/img03.png > imgs/cut.png
printf 'img00.png 0\nimg01.png 1\nimg02.png 2\ncut.png 3\n' > cut.txt
net cut 'type: "ImageData" image_data_param { source: "cut.txt" root_folder: "imgs/" batch_size: 2 }' \
  > cut.prototxt
expect_refusal "truncated image met while training" --want "cut.txt:4" --want "imgs/cut.png" \
  --want "damaged PNG image" -- "$KILN" train --solver cut_solver.prototxt
expect_refusal "convert a list with a truncated image" --want "cut.txt:4" --want "imgs/cut.png" \
  --gone cut_lmdb -- "$KILN" convert images cut.txt imgs/ cut_lmdb
expect_refusal "convert into an existing LMDB" --want "already exists" --same raw_lmdb -- \
  "$KILN" convert images list.txt imgs/ raw_lmdb
expect_refusal "convert with half a resize" --code 2 --want "--resize" --gone bad_lmdb -- \
  "$KILN" convert images list.txt imgs/ bad_lmdb --resize 4
expect_refusal "convert with a seed but no shuffle" --code 2 --want "--shuffle" --gone bad_lmdb -- \
  "$KILN" convert images list.txt imgs/ bad_lmdb --seed 4

finish
