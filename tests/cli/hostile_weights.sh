# Hostile .caffemodel files given to kiln train --weights, kiln test --weights and kiln
# compare-weights: cut, garbage, another message type, blobs of the wrong count, shape or size,
# values that are not finite, layers given twice, files that are no file. The files are written
# byte by byte (protobuf.bash) for the tiny net of hostile.bash, whose layer 'ip' has a 10x16
# weight and a bias of 10. Each case wants a clean error naming the file and the layer, blob or
# field, and no sanitizer report.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
source "$(dirname "$0")/protobuf.bash"
cd "$WORK"

tiny_lmdb tiny_lmdb || fail "convert the tiny LMDB"
tiny_net tiny_lmdb > net.prototxt
tiny_solver net.prototxt 'snapshot_after_train: true
snapshot_prefix: "snap"' > solver.prototxt
need "a snapshot to cut" -- "$KILN" train --solver solver.prototxt

W=$(pb_bytes 7 "$(pb_blob 10,16 $(pb_fill 160 0.01))")
B=$(pb_bytes 7 "$(pb_blob 10 $(pb_fill 10 0))")
# model FILE LAYER_BODY...: a NetParameter named "tiny" whose layers have the given bodies.
model() {
  local f=$1 body=""
  shift
  for l in "$@"; do body+=$(pb_bytes 100 "$l"); done
  pb_write "$f" "$(pb_string 1 tiny)$body"
}
ip() { printf '%s%s%s' "$(pb_string 1 ip)" "$(pb_string 2 InnerProduct)" "$*"; }
model good.caffemodel "$(ip "$W$B")"
T=("$KILN" train --solver solver.prototxt --weights)
X=("$KILN" test --model net.prototxt --iterations 1 --weights)
need "the hand-written weights load" -- "${T[@]}" good.caffemodel

# ---- files that are no .caffemodel ------------------------------------------------------------
size=$(stat -c %s snap_iter_2.caffemodel)
head -c $((size / 2)) snap_iter_2.caffemodel > cut.caffemodel
expect_refusal "a snapshot cut in half" --want "cut.caffemodel" --want "corrupt or truncated" -- "${T[@]}" cut.caffemodel

noise 3000 > noise.caffemodel
expect_refusal "random bytes" --want "noise.caffemodel" --want "NetParameter" -- "${T[@]}" noise.caffemodel

expect_refusal "a .solverstate as weights" --want "snap_iter_2.solverstate" --want "not a valid binary NetParameter" -- \
  "${T[@]}" snap_iter_2.solverstate

expect_refusal "a prototxt as weights" --want "net.prototxt" --want "not a valid binary NetParameter" -- "${T[@]}" net.prototxt

pb_write text.caffemodel "$(pb_string 1 tiny)$(pb_string 100 'layer { name: "ip" }')"
expect_refusal "a layer field holding text" --want "text.caffemodel" --want "NetParameter" -- "${T[@]}" text.caffemodel

pb_write wiretype.caffemodel "$(pb_string 1 tiny)$(pb_int 100 7)"
expect_refusal "a layer field of the wrong wire type" --want "wiretype.caffemodel" --want "corrupt" -- "${T[@]}" wiretype.caffemodel

pb_write overlong.caffemodel "$(pb_string 1 tiny)$(pb_key 100 2)$(pb_uvarint 1000000)$(ip "$W")"
expect_refusal "a layer longer than the file" --want "overlong.caffemodel" --want "truncated" -- "${T[@]}" overlong.caffemodel

pb_write onlyname.caffemodel "$(pb_string 1 tiny)"
expect_refusal "a model with no layers" --want "onlyname.caffemodel: holds no layers" -- "${T[@]}" onlyname.caffemodel

mkdir folder.caffemodel
expect_refusal "a folder as weights" --want "folder.caffemodel: not a regular file" -- "${T[@]}" folder.caffemodel
mkfifo fifo.caffemodel
expect_refusal "a FIFO as weights" --timeout 20 --want "fifo.caffemodel: not a regular file" -- "${T[@]}" fifo.caffemodel
expect_refusal "a device as weights" --timeout 20 --want "/dev/zero: not a regular file" -- "${T[@]}" /dev/zero
expect_refusal "missing weights for kiln test" --want "nothere.caffemodel: cannot open" -- "${X[@]}" nothere.caffemodel

# ---- blobs that do not fit the net ------------------------------------------------------------
model oneblob.caffemodel "$(ip "$W")"
expect_refusal "one blob for two" --want "oneblob.caffemodel" --want "layer 'ip' has 1 blobs in the file, 2 in the net" -- \
  "${T[@]}" oneblob.caffemodel

model threeblobs.caffemodel "$(ip "$W$B$B")"
expect_refusal "three blobs for two" --want "threeblobs.caffemodel" --want "layer 'ip' has 3 blobs" -- "${T[@]}" threeblobs.caffemodel

model transposed.caffemodel "$(ip "$(pb_bytes 7 "$(pb_blob 16,10 $(pb_fill 160 0.01))")$B")"
expect_refusal "a transposed weight" --want "transposed.caffemodel" --want "layer 'ip' blob 0" --want "expects 10x16" -- \
  "${T[@]}" transposed.caffemodel

model short.caffemodel "$(ip "$(pb_bytes 7 "$(pb_blob 10,16 1 2 3)")$B")"
expect_refusal "3 values for a 10x16 shape" --want "short.caffemodel" --want "layer 'ip' blob 0 holds 3 values" -- \
  "${X[@]}" short.caffemodel

model nodata.caffemodel "$(ip "$W$(pb_bytes 7 "$(pb_blob 10 -)")")"
expect_refusal "a blob with no data" --want "nodata.caffemodel" --want "layer 'ip' blob 1 holds 0 values" -- \
  "${T[@]}" nodata.caffemodel

model negdim.caffemodel "$(ip "$(pb_bytes 7 "$(pb_blob -10,-16 $(pb_fill 160 0.01))")$B")"
expect_refusal "a negative dimension" --want "negdim.caffemodel" --want "layer 'ip' blob 0 has a negative dimension -10" -- \
  "${T[@]}" negdim.caffemodel

model axes.caffemodel "$(ip "$(pb_bytes 7 "$(pb_blob 1,1,1,1,1,1,1,1,1,1,10,16 $(pb_fill 160 0.01))")$B")"
expect_refusal "twelve axes" --want "axes.caffemodel" --want "layer 'ip' blob 0 has a shape of too many axes" -- \
  "${T[@]}" axes.caffemodel

model huge.caffemodel "$(ip "$(pb_bytes 7 "$(pb_blob 4611686018427387904,4 1)")$B")"
expect_refusal "2^64 elements" --want "huge.caffemodel" --want "more elements than fit 64 bits" -- "${T[@]}" huge.caffemodel

# Caffe's legacy num/channels/height/width: 1x1x10x15 is 150 values, not the 160 of 10x16.
legacy=$(pb_int 1 1)$(pb_int 2 1)$(pb_int 3 10)$(pb_int 4 15)$(pb_floats 5 $(pb_fill 150 0.01))
model legacy.caffemodel "$(ip "$(pb_bytes 7 "$legacy")$B")"
expect_refusal "a legacy shape of the wrong count" --want "legacy.caffemodel" --want "layer 'ip' blob 0" -- \
  "${T[@]}" legacy.caffemodel

doubles=$(pb_bytes 7 "$(pb_varints 1 10 16)")$(pb_key 8 2)$(pb_uvarint 80)$(perl -e 'print unpack("H*", pack("d<*", (0.5) x 10))')
model doubles.caffemodel "$(ip "$(pb_bytes 7 "$doubles")$B")"
expect_refusal "10 doubles for 160 values" --want "doubles.caffemodel" --want "layer 'ip' blob 0 holds 10 values" -- \
  "${T[@]}" doubles.caffemodel

model lossblob.caffemodel "$(ip "$W$B")" "$(pb_string 1 loss)$(pb_string 2 SoftmaxWithLoss)$B"
expect_refusal "a blob for a layer with none" --want "lossblob.caffemodel" --want "layer 'loss' has 1 blobs in the file, 0 in the net" -- \
  "${T[@]}" lossblob.caffemodel

# ---- values and names -------------------------------------------------------------------------
model nan.caffemodel "$(ip "$(pb_bytes 7 "$(pb_blob 10,16 $(pb_fill 7 0.01) nan $(pb_fill 152 0.01))")$B")"
expect_refusal "a NaN weight" --want "nan.caffemodel" --want "layer 'ip' blob 0 value 7 is" -- "${T[@]}" nan.caffemodel

model inf.caffemodel "$(ip "$W$(pb_bytes 7 "$(pb_blob 10 $(pb_fill 9 0) -inf)")")"
expect_refusal "an infinite bias in kiln test" --want "inf.caffemodel" --want "layer 'ip' blob 1 value 9 is -inf" -- \
  "${X[@]}" inf.caffemodel

bigd=$(pb_bytes 7 "$(pb_varints 1 10)")$(pb_key 8 2)$(pb_uvarint 80)$(perl -e 'print unpack("H*", pack("d<*", 1e300, (0) x 9))')
model bigdouble.caffemodel "$(ip "$W$(pb_bytes 7 "$bigd")")"
expect_refusal "a double past float's range" --want "bigdouble.caffemodel" --want "layer 'ip' blob 1 value 0 is inf" -- \
  "${T[@]}" bigdouble.caffemodel

model twice.caffemodel "$(ip "$W$B")" "$(ip "$W$B")"
expect_refusal "a layer given twice" --want "twice.caffemodel" --want "layer 'ip' appears twice in the file" -- \
  "${T[@]}" twice.caffemodel

model other.caffemodel "$(pb_string 1 fc)$(pb_string 2 InnerProduct)$W$B"
expect_refusal "weights of another net" --want "other.caffemodel: no layer of the file matches" -- "${X[@]}" other.caffemodel

# ---- kiln compare-weights ---------------------------------------------------------------------
expect_refusal "compare-weights with a cut file" --want "cut.caffemodel" --want "corrupt or truncated" -- \
  "$KILN" compare-weights good.caffemodel cut.caffemodel
expect_refusal "compare-weights with a missing file" --want "absent.caffemodel: cannot open" -- \
  "$KILN" compare-weights absent.caffemodel good.caffemodel
expect_refusal "compare-weights --rtol nan" --code 2 --want "--rtol" -- \
  "$KILN" compare-weights good.caffemodel good.caffemodel --rtol nan
expect_refusal "compare-weights --blob without K" --code 2 --want "--blob needs LAYER:K" -- \
  "$KILN" compare-weights good.caffemodel good.caffemodel --blob ip
finish
