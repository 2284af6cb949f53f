# kiln detect. A deploy net whose detections are known without training: its loc comes from a
# Convolution with weights and biases 0 (so each box is its prior), its priors are one 0.6 x 0.6
# box centred on each quadrant of the image (a 2 x 2 PriorBox on img_size 100), and its class
# logits at each quadrant are the quadrant's pixels (B, G, R) themselves, permuted and softmaxed.
# The images (PNG, written here) are four flat quadrants, so whatever the resize each quadrant's
# scores are the softmax of its colour times the scale: the exact lines printed, in the image's
# pixels, clipped, best first, through a batch of 2 (the last one part filled) and with an
# image that cannot be read among them; the threshold; names from the label map or numbers;
# --mean per channel; --transform-from (the TEST phase's transform_param and label map);
# --json parsed line by line; --draw's PNGs read back (the box lines in each class's colour, the
# label strip, the rest of the picture untouched) and its refusals (an input, two images of one
# name, a file for the folder); bad options and a classifier refused, naming its output. Then
# models/ssd trained for two iterations on shapes-det and its deploy net run on test images.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
command -v python3 >/dev/null || { echo "detect.sh: needs python3 to write and read PNG files"; exit 77; }
export HOME=$WORK/home KILN_DATA=$WORK/data XDG_DATA_HOME=$WORK/xdg OMP_NUM_THREADS=2
mkdir -p "$HOME"

cat > png.py <<'PY'
import struct, sys, zlib

def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

def write(path, w, h, px):  # px(x, y) -> (r, g, b)
    raw = b''.join(b'\0' + bytes(c for x in range(w) for c in px(x, y)) for y in range(h))
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))

def read(path):  # -> w, h, rows of (r, g, b); 8-bit gray or RGB, every filter
    d = open(path, 'rb').read()
    assert d[:8] == b'\x89PNG\r\n\x1a\n', path
    pos, idat = 8, b''
    while pos < len(d):
        n, kind = struct.unpack('>I4s', d[pos:pos + 8])
        body = d[pos + 8:pos + 8 + n]
        if kind == b'IHDR':
            w, h, depth, ctype, _, _, interlace = struct.unpack('>IIBBBBB', body)
            assert depth == 8 and ctype in (0, 2) and not interlace, (depth, ctype, interlace)
        elif kind == b'IDAT':
            idat += body
        pos += 12 + n
    bpp = 3 if ctype == 2 else 1
    raw, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:(x + 1) * bpp]) * (3 if bpp == 1 else 1) for x in range(w)])
        prev = line
    return w, h, rows
PY

# The quadrants' colours (r, g, b); the logits are (B, G, R) x 1/16: TL (0, 4, 0) is a disc at
# e^4 / (e^4 + 2) = 0.9647, TR (0, 0, 3) a square at 0.9094, BL (0, 1, 1) both at 0.4223, BR
# (4, 0, 0) background (0.0177 each).
python3 - <<'PY'
import png
TL, TR, BL, BR = (0, 64, 0), (48, 0, 0), (16, 16, 0), (0, 0, 64)
def quads(tl, tr, bl, br, w, h):
    return lambda x, y: [[tl, tr], [bl, br]][y >= h // 2][x >= w // 2]
png.write('quads.png', 200, 100, quads(TL, TR, BL, BR, 200, 100))
png.write('swapped.png', 120, 80, quads(TR, TL, BR, BL, 120, 80))
png.write('empty.png', 40, 40, quads(BR, BR, BR, BR, 40, 40))
PY
cat > det.prototxt <<'EOF'
name: "fixed-detector"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 2 dim: 2 } } }
layer { name: "loc" type: "Convolution" bottom: "data" top: "loc"
  convolution_param { num_output: 4 kernel_size: 1
    weight_filler { type: "constant" value: 0 } bias_filler { type: "constant" value: 0 } } }
layer { name: "loc_flat" type: "Flatten" bottom: "loc" top: "loc_flat" }
layer { name: "conf_perm" type: "Permute" bottom: "data" top: "conf_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "conf_reshape" type: "Reshape" bottom: "conf_perm" top: "conf_reshape"
  reshape_param { shape { dim: 0 dim: -1 dim: 3 } } }
layer { name: "conf_softmax" type: "Softmax" bottom: "conf_reshape" top: "conf_softmax"
  softmax_param { axis: 2 } }
layer { name: "conf_flat" type: "Flatten" bottom: "conf_softmax" top: "conf_flat" }
layer { name: "prior" type: "PriorBox" bottom: "data" bottom: "data" top: "prior"
  prior_box_param { min_size: 60 img_size: 100 step: 50 offset: 0.5 clip: false
    variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }
layer { name: "detection_out" type: "DetectionOutput" bottom: "loc_flat" bottom: "conf_flat"
  bottom: "prior" top: "detection_out"
  detection_output_param { num_classes: 3 share_location: true background_label_id: 0
    nms_param { nms_threshold: 0.45 top_k: 100 } code_type: CENTER_SIZE keep_top_k: 20
    confidence_threshold: 0.01 } }
EOF
cat > labelmap.prototxt <<'EOF'
item { name: "none_of_the_above" label: 0 display_name: "background" }
item { name: "disc" label: 1 display_name: "disc" }
item { name: "square" label: 2 }
EOF
# det ARGS...: kiln detect, its stderr kept in stderr.log too, which must hold no sanitizer report
# at the end (a leak report changes the exit code alone, which a check of the output misses);
# expect_refusal checks its own commands (R)
det() {
  local e rc
  e=$(mktemp "$WORK/.det.XXXXXX")
  "$KILN" detect "$@" 2>"$e"
  rc=$?
  cat "$e" >&2
  cat "$e" >> "$WORK/stderr.log"
  rm -f "$e"
  return $rc
}
D=(det --model det.prototxt)
R=("$KILN" detect --model det.prototxt)

# ---- the lines: pixels of each image, best first, clipped; a batch of 2 with an unreadable image
out=$("${D[@]}" --scale 0.0625 --labels labelmap.prototxt quads.png nosuch.png swapped.png empty.png 2>err.txt)
rc=$?
cat > want.txt <<'EOF'
quads.png  disc (1)  0.9647  0.0 0.0 110.0 55.0
quads.png  square (2)  0.9094  90.0 0.0 200.0 55.0
swapped.png  disc (1)  0.9647  54.0 0.0 120.0 44.0
swapped.png  square (2)  0.9094  0.0 0.0 66.0 44.0
empty.png  no detections
EOF
[ "$out" = "$(cat want.txt)" ] && pass || fail "detections: $out"
[ $rc -eq 1 ] && grep -q "^kiln detect: nosuch.png: cannot open: No such file or directory$" err.txt \
  && grep -q "1 of 4 images not processed in full" err.txt && grep -q "no --weights given" err.txt \
  && pass || fail "the missing image: exit $rc: $(cat err.txt)"
# in order with the output where both go to one file
both=$("${R[@]}" --scale 0.0625 quads.png nosuch.png empty.png 2>&1 | grep -v weights)
[ "$(echo "$both" | sed -n 3p)" = "kiln detect: nosuch.png: cannot open: No such file or directory" ] \
  && [ "$(echo "$both" | sed -n 4p)" = "empty.png  no detections" ] && pass || fail "order: $both"

# ---- the threshold, numbers without a label map, the mean per channel
out=$("${D[@]}" --scale 0.0625 --threshold 0.4 quads.png 2>/dev/null)
[ "$out" = "quads.png  1  0.9647  0.0 0.0 110.0 55.0
quads.png  2  0.9094  90.0 0.0 200.0 55.0
quads.png  1  0.4223  0.0 45.0 110.0 100.0
quads.png  2  0.4223  0.0 45.0 110.0 100.0" ] && pass || fail "threshold 0.4: $out"
out=$("${D[@]}" --scale 0.0625 --threshold 0.95 quads.png 2>/dev/null)
[ "$out" = "quads.png  1  0.9647  0.0 0.0 110.0 55.0" ] && pass || fail "threshold 0.95: $out"
out=$("${D[@]}" --scale 0.0625 --threshold 1 quads.png 2>/dev/null)
[ "$out" = "quads.png  no detections" ] && pass || fail "threshold 1: $out"
n=$("${D[@]}" --scale 0.0625 --threshold 0 quads.png 2>/dev/null | wc -l)
[ "$n" = 8 ] && pass || fail "threshold 0: $n lines"
# B, G, R means: G 64 taken away leaves TL all even (1/3 each), and TR (0, -4, 3) a square at
# 0.9517, BL (0, -3, 1) one at 0.7214
out=$("${D[@]}" --scale 0.0625 --mean 0,64,0 --threshold 0.3 quads.png 2>/dev/null)
[ "$(echo "$out" | head -n 2)" = "quads.png  2  0.9517  90.0 0.0 200.0 55.0
quads.png  2  0.7214  0.0 45.0 110.0 100.0" ] && [ "$(echo "$out" | tail -n 2 | sort)" = "quads.png  1  0.3333  0.0 0.0 110.0 55.0
quads.png  2  0.3333  0.0 0.0 110.0 55.0" ] && pass || fail "--mean: $out"
# without a mean or scale: the pixels as they are, said
"${D[@]}" quads.png >/dev/null 2>err.txt && grep -q "no --mean, --scale or --transform-from" err.txt \
  && pass || fail "no mean: $(cat err.txt)"
# every interpolation warps flat quadrants to the same pixels
for m in linear area nearest cubic LANCZOS4; do
  out=$("${D[@]}" --scale 0.0625 --labels labelmap.prototxt --interp $m quads.png swapped.png empty.png 2>/dev/null)
  [ "$out" = "$(cat want.txt)" ] && pass || fail "--interp $m: $out"
done

# ---- --transform-from: the TEST phase's data layer (not the TRAIN one before it)
cat > train_test.prototxt <<'EOF'
name: "fixed-detector"
layer { name: "data" type: "AnnotatedData" top: "data" top: "label" include { phase: TRAIN }
  transform_param { mean_value: 99 scale: 0.5 resize_param { height: 2 width: 2 } }
  data_param { source: "nowhere_lmdb" batch_size: 4 }
  annotated_data_param { label_map_file: "nowhere.prototxt" } }
layer { name: "data" type: "AnnotatedData" top: "data" top: "label" include { phase: TEST }
  transform_param { mean_value: 0 scale: 0.0625
    resize_param { resize_mode: WARP height: 2 width: 2 interp_mode: AREA } }
  data_param { source: "nowhere_lmdb" batch_size: 4 }
  annotated_data_param { label_map_file: "$KILN_DATA/maps/labelmap.prototxt" } }
EOF
mkdir -p data/maps && cp labelmap.prototxt data/maps/
out=$("${D[@]}" --transform-from train_test.prototxt quads.png swapped.png empty.png 2>err.txt)
[ "$out" = "$(cat want.txt)" ] && ! grep -q "no --mean" err.txt && pass || fail "--transform-from: $out $(cat err.txt)"
# the command line wins: another scale (TL's disc at e^2 / (e^2 + 2)), names from another map
# (whose label 2 is not named: its number)
printf 'item { name: "bg" label: 0 }\nitem { name: "one" label: 1 }\n' > other.prototxt
out=$("${D[@]}" --transform-from train_test.prototxt --scale 0.03125 --labels other.prototxt quads.png 2>/dev/null)
[ "$out" = "quads.png  one (1)  0.7870  0.0 0.0 110.0 55.0
quads.png  2  0.6914  90.0 0.0 200.0 55.0" ] && pass || fail "--transform-from with --scale: $out"
sed 's/height: 2 width: 2 interp_mode/height: 3 width: 2 interp_mode/' train_test.prototxt > three.prototxt
expect_refusal "a resize of another size" --code 2 \
  --want "layer 'data' of three.prototxt resizes to 3 x 2 (height x width), the input of det.prototxt is 2 x 2" \
  -- "${R[@]}" --transform-from three.prototxt quads.png
sed 's|\$KILN_DATA/maps/|missing/|' train_test.prototxt > nomap.prototxt
expect_refusal "its label map missing" --want "the label map of layer 'data' of nomap.prototxt (--labels to give another)" \
  --want "missing/labelmap.prototxt" -- "${R[@]}" --transform-from nomap.prototxt quads.png
printf 'name: "x"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 } } }\n' > notrans.prototxt
expect_refusal "no TEST transform" --want "notrans.prototxt: no layer of the TEST phase has a transform_param" \
  -- "${R[@]}" --transform-from notrans.prototxt quads.png
sed 's/resize_mode: WARP/resize_mode: FIT_SMALL_SIZE/' train_test.prototxt > fit.prototxt
expect_refusal "FIT_SMALL_SIZE" --want "resize_param.resize_mode 2: kiln detect warps the whole image" \
  -- "${R[@]}" --transform-from fit.prototxt quads.png

# ---- --json: one object a line, the same detections; an error object for an unreadable image
"${D[@]}" --scale 0.0625 --labels labelmap.prototxt --threshold 0.4 --json quads.png nosuch.png empty.png \
  > json.txt 2>/dev/null
python3 - json.txt <<'PY' && pass || fail "json: $(cat json.txt)"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 3, lines
q, missing, empty = lines
assert q["image"] == "quads.png" and q["width"] == 200 and q["height"] == 100, q
d = q["detections"]
assert [x["label"] for x in d] == [1, 2, 1, 2] and [x["name"] for x in d] == ["disc", "square"] * 2, d
assert d[0]["score"] == 0.9647 and d[0]["box"] == [0.0, 0.0, 110.0, 55.0], d[0]
assert d[3]["score"] == 0.4223 and d[3]["box"] == [0.0, 45.0, 110.0, 100.0], d[3]
assert missing == {"image": "nosuch.png", "error": "nosuch.png: cannot open: No such file or directory"}, missing
assert empty == {"image": "empty.png", "width": 40, "height": 40, "detections": []}, empty
PY
# a name JSON must escape, and no label map: null names
cp quads.png 'odd "name".png'
"${D[@]}" --scale 0.0625 --json 'odd "name".png' 2>/dev/null | python3 -c '
import json, sys
o = json.loads(sys.stdin.readline())
assert o["image"] == "odd \"name\".png" and o["detections"][0]["name"] is None, o' && pass || fail "json escaping"

# ---- --draw: the pictures read back
"${D[@]}" --scale 0.0625 --labels labelmap.prototxt --draw pics/sub quads.png swapped.png empty.png >/dev/null 2>err.txt \
  && pass || fail "draw: $(cat err.txt)"
python3 - <<'PY' && pass || fail "the drawn pictures"
import png
red, green = (230, 40, 40), (40, 180, 60)  # disc, square
TL, TR, BL, BR = (0, 64, 0), (48, 0, 0), (16, 16, 0), (0, 0, 64)
w, h, p = png.read('pics/sub/quads.png')
assert (w, h) == (200, 100), (w, h)
# the disc's box 0..109 x 0..54, two pixels thick inside it; the square's 90..199 x 0..54, under
# the disc's where they cross (the best is drawn last)
for y in range(12, 53):
    assert p[y][0] == p[y][1] == p[y][108] == p[y][109] == red, (y, p[y][0], p[y][109])
    assert p[y][90] == p[y][91] == p[y][198] == p[y][199] == green, (y, p[y][199])
    assert p[y][2] == p[y][89] == (TL if y < 50 else BL) and p[y][197] == (TR if y < 50 else BR), y
assert p[53][:110] == p[54][:110] == [red] * 110, p[53][:110]
for x in range(112, 200):
    assert p[53][x] == p[54][x] == green and p[55][x] == BR, (x, p[53][x], p[55][x])
# both boxes touch the top: their label strips lie inside them, at rows 0..9, over every box,
# in white ink on both colours, dark enough for it ("disc 0.96", "square 0.91", 55 and 67 pixels
# wide)
disc = [[p[y][x] for x in range(0, 55)] for y in range(10)]
assert all(c in (red, (255, 255, 255)) for r in disc for c in r), disc
assert sum(c == (255, 255, 255) for r in disc for c in r) > 40
square = [[p[y][x] for x in range(90, 90 + 67)] for y in range(10)]
assert all(c in (green, (255, 255, 255)) for r in square for c in r), square
assert sum(c == (255, 255, 255) for r in square for c in r) > 40
# nothing else is changed: the lower half below the boxes is the image's own
for y in range(56, 100):
    assert p[y][:100] == [BL] * 100 and p[y][100:] == [BR] * 100, y
w, h, p = png.read('pics/sub/swapped.png')
assert (w, h) == (120, 80) and p[20][54] == red and p[20][119] == red and p[20][0] == green, p[20][:3]
w, h, p = png.read('pics/sub/empty.png')
assert (w, h) == (40, 40) and all(c == BR for r in p for c in r)
PY
ls pics/sub | grep -q tmp && fail "temporaries left: $(ls pics/sub)" || pass
# never an input, by its name or another; two images of one name; a file for the folder
mkdir -p a b && cp quads.png a/same.png && cp swapped.png b/same.png
expect_refusal "--draw over its input" --want "--draw: ./quads.png is the image quads.png: an input is never replaced" \
  --same quads.png -- "${R[@]}" --scale 0.0625 --draw . quads.png
ln -s ../quads.png a/empty.png
expect_refusal "--draw over an input by a link" --want "--draw: a/empty.png is the image quads.png" \
  --same quads.png --gone a/quads.png -- "${R[@]}" --scale 0.0625 --draw a quads.png empty.png
expect_refusal "two images of one name" --want "--draw: a/same.png and b/same.png would both be drawn to out/same.png" \
  --gone out -- "${R[@]}" --scale 0.0625 --draw out a/same.png b/same.png
cp det.prototxt model.png && cp quads.png a/model.png
expect_refusal "--draw over the model" --want "model.png" --same model.png \
  -- "$KILN" detect --model model.png --scale 0.0625 --draw . a/model.png
expect_refusal "--draw a file" --want "--draw quads.png: exists and is not a folder" --same quads.png \
  -- "${R[@]}" --scale 0.0625 --draw quads.png empty.png

# ---- bad options and models
expect_refusal "--threshold 1.5" --code 2 --want "--threshold: '1.5' is not a number from 0 to 1" -- "${R[@]}" --threshold 1.5 quads.png
expect_refusal "--threshold x" --code 2 --want "--threshold: 'x' is not a number from 0 to 1" -- "${R[@]}" --threshold x quads.png
expect_refusal "--mean 1,2" --code 2 --want "--mean: '1,2' is not one number or three" -- "${R[@]}" --mean 1,2 quads.png
expect_refusal "--scale nan" --code 2 --want "--scale: 'nan' is not a finite number" -- "${R[@]}" --scale nan quads.png
expect_refusal "--interp" --code 2 --want "--interp: 'bicubic' is not linear, area, nearest, cubic or lanczos4" \
  -- "${R[@]}" --interp bicubic quads.png
expect_refusal "no image" --code 2 --want "no IMAGE given" -- "${R[@]}" --scale 1
expect_refusal "no model" --code 2 --want "--model is required" -- "$KILN" detect quads.png
expect_refusal "an empty image" --code 2 --want "IMAGE is empty" -- "${R[@]}" ""
expect_refusal "--metrics" --code 2 --want "detect writes no events" -- "${R[@]}" --metrics m.jsonl quads.png
expect_refusal "a classifier" --want "lenet_deploy.prototxt: no output of the net is a DetectionOutput layer's rows of 7" \
  --want "Its outputs: 'prob' (64 x 10)" -- "$KILN" detect --model "$SRC/models/lenet/lenet_deploy.prototxt" quads.png
printf 'name: "two"\nlayer { name: "a" type: "Input" top: "a" input_param { shape { dim: 1 dim: 3 dim: 2 dim: 2 } } }\nlayer { name: "b" type: "Input" top: "b" input_param { shape { dim: 1 dim: 3 dim: 2 dim: 2 } } }\n' > two.prototxt
expect_refusal "two inputs" --want "two.prototxt: a detection net takes one input" -- "$KILN" detect --model two.prototxt quads.png
# an image after "--" that looks like an option
cp quads.png ./--odd.png
out=$("${D[@]}" --scale 0.0625 --threshold 0.95 -- --odd.png 2>/dev/null)
[ "$out" = "--odd.png  1  0.9647  0.0 0.0 110.0 55.0" ] && pass || fail "after --: $out"

# ---- models/ssd: two iterations of training on shapes-det, its deploy net on test images --------
if need "fetch shapes-det" -- "$KILN" data fetch shapes-det; then
  # a batch of 4 (the net's is 32) to keep the sanitizer build quick
  sed 's/batch_size: 32/batch_size: 4/' "$SRC/models/ssd/ssd_train_test.prototxt" > ssd_train_test.prototxt
  sed -e 's/^max_iter: .*/max_iter: 2/' -e 's/^snapshot_prefix: .*/snapshot_prefix: "ssd"/' \
    "$SRC/models/ssd/ssd_solver.prototxt" > ssd_solver.prototxt
  if need "train models/ssd" -- "$KILN" train --solver ssd_solver.prototxt; then
    imgs=(data/shapes-det/JPEGImages/004001.jpg data/shapes-det/JPEGImages/004003.jpg data/shapes-det/JPEGImages/004010.jpg)
    S=(det --model "$SRC/models/ssd/ssd_deploy.prototxt" --weights ssd_iter_2.caffemodel)
    "${S[@]}" --transform-from ssd_train_test.prototxt --threshold 0.05 "${imgs[@]}" > ssd.txt 2>err.txt \
      && pass || fail "ssd: $(cat err.txt)"
    # each line one image's detection, named from the set's label map, in its pixels
    bad=$(grep -Ev '^data/shapes-det/JPEGImages/0040(01|03|10)\.jpg  ((disc \(1\)|square \(2\)|triangle \(3\)|cross \(4\))  [01]\.[0-9]{4}  [0-9.]+ [0-9.]+ [0-9.]+ [0-9.]+|no detections)$' ssd.txt)
    [ -s ssd.txt ] && [ -z "$bad" ] && pass || fail "ssd lines: $bad $(head -3 ssd.txt)"
    for i in "${imgs[@]}"; do grep -q "^$i  " ssd.txt || fail "ssd: nothing said of $i"; done
    # the same with the mean and scale on the command line, as JSON, and drawn
    "${S[@]}" --mean 127.5 --scale 0.0078125 --labels data/shapes-det/labelmap.prototxt --threshold 0.05 \
      --json --draw ssd_pics "${imgs[@]}" > ssd.json 2>err.txt && pass || fail "ssd json: $(cat err.txt)"
    python3 - ssd.txt ssd.json "${imgs[@]}" <<'PY' && pass || fail "ssd json: $(head -c 600 ssd.json)"
import json, os, re, sys
import png
text = [l.split('  ') for l in open(sys.argv[1]).read().splitlines()]
objs = [json.loads(l) for l in open(sys.argv[2])]
assert [o["image"] for o in objs] == sys.argv[3:], objs
sizes = {l.split()[0]: (int(l.split()[2]), int(l.split()[1])) for l in open('data/shapes-det/test_name_size.txt')}
for o in objs:
    w, h = sizes[os.path.basename(o["image"])[:-4]]
    assert (o["width"], o["height"]) == (w, h), o
    for d in o["detections"]:
        assert d["name"] in ("disc", "square", "triangle", "cross") and 0.05 <= d["score"] <= 1, d
        x0, y0, x1, y1 = d["box"]
        assert 0 <= x0 <= x1 <= w and 0 <= y0 <= y1 <= h, d
    assert [d["score"] for d in o["detections"]] == sorted((d["score"] for d in o["detections"]), reverse=True)
    # the text lines say the same
    lines = [l for l in text if l[0] == o["image"] and l[1] != "no detections"]
    assert len(lines) == len(o["detections"]), (lines, o)
    for l, d in zip(lines, o["detections"]):
        assert l[1] == "%s (%d)" % (d["name"], d["label"]) and float(l[2]) == d["score"], (l, d)
        assert [float(v) for v in l[3].split()] == d["box"], (l, d)
    pw, ph, _ = png.read('ssd_pics/' + os.path.basename(o["image"])[:-4] + '.png')
    assert (pw, ph) == (w, h), (pw, ph, w, h)
PY
  fi
fi
has_sanitizer_report "$(cat stderr.log)" && fail "a sanitizer report: $(grep -m 5 -i sanitizer stderr.log)" || pass
finish
