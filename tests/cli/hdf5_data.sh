# HDF5Data against Data: the same 64 records written as an LMDB and as two HDF5 files of 40 and
# 24 records (kiln convert idx, to a folder and to OUT.h5), a small net trained on each with the
# same seed and no shuffle (batches of 16 running across the files and wrapping: 3 passes) ends
# with bit-identical weights; the HDF5 run resumed half-way ends the same, with and without
# shuffle. HDF5Output writes a test pass's scores and labels, which read back (a net reading
# them with HDF5Data finds the test's accuracy). Bad files, and a FIFO or a device in the list,
# are refused naming them; Caffe's V0 and V1 HDF5 layers upgrade.
source "$(dirname "$0")/lib.bash"
cd "$WORK"

# 64 records of 1x8x8 bytes (a fixed pseudo-random pattern), labels 0..3; IDX files of all of
# them and of the first 40 and the last 24
idx3() {  # idx3 COUNT < BYTES
  printf '\x00\x00\x08\x03\x00\x00\x00'"\\x$(printf %02x "$1")"'\x00\x00\x00\x08\x00\x00\x00\x08'
  cat
}
idx1() {  # idx1 COUNT < BYTES
  printf '\x00\x00\x08\x01\x00\x00\x00'"\\x$(printf %02x "$1")"
  cat
}
LC_ALL=C awk 'BEGIN { srand(7); for (i = 0; i < 4096; i++) printf "%c", int(rand() * 256) }' > pixels
for i in $(seq 0 63); do printf "\\x0$((i % 4))"; done > labels
idx3 64 < pixels > img.idx
idx1 64 < labels > lab.idx
head -c 2560 pixels | idx3 40 > imgA.idx
tail -c 1536 pixels | idx3 24 > imgB.idx
head -c 40 labels | idx1 40 > labA.idx
tail -c 24 labels | idx1 24 > labB.idx
need "convert to LMDB" -- "$KILN" convert idx img.idx lab.idx lmdb
need "convert to HDF5 (first 40)" -- "$KILN" convert idx imgA.idx labA.idx a.h5
need "convert to HDF5 (last 24)" -- "$KILN" convert idx imgB.idx labB.idx b.h5
[ "$(head -c 8 a.h5 | od -An -c | tr -d ' ')" = '211HDF\r\n032\n' ] && pass || fail "a.h5 is not HDF5"
printf '%s\n%s\n' "$WORK/a.h5" "$WORK/b.h5" > list.txt

# the net after its data layer, the same for both (the pixels scaled by a layer: HDF5Data, as
# Caffe's, takes no transform_param)
net() {  # net DATA_LAYER
  cat <<NET
name: "t"
$1
layer { name: "scale" type: "Power" bottom: "data" top: "scaled" power_param { scale: 0.00390625 } }
layer { name: "conv" type: "Convolution" bottom: "scaled" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
}
lmdb_layer='layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "'"$WORK"'/lmdb" batch_size: 16 backend: LMDB } }'
h5_layer() {  # h5_layer [EXTRA]
  echo 'layer { name: "d" type: "HDF5Data" top: "data" top: "label"
  hdf5_data_param { source: "'"$WORK"'/list.txt" batch_size: 16 '"${1:-}"' } }'
}
net "$lmdb_layer" > lmdb.prototxt
net "$(h5_layer)" > h5.prototxt
net "$(h5_layer 'shuffle: true')" > h5s.prototxt
solver() {  # solver NET PREFIX
  printf 'net: "%s/%s"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 12\n' "$WORK" "$1"
  printf 'display: 0\nrandom_seed: 9\nsnapshot: 6\nsnapshot_prefix: "%s/%s"\n' "$WORK" "$2"
}
solver lmdb.prototxt lmdb > s_lmdb.prototxt
solver h5.prototxt h5 > s_h5.prototxt
solver h5.prototxt h5r > s_h5r.prototxt
solver h5s.prototxt h5s > s_h5s.prototxt
solver h5s.prototxt h5sr > s_h5sr.prototxt
"$KILN" train --solver s_lmdb.prototxt > lmdb.log 2>&1 || fail "LMDB run: $(tail -n 3 lmdb.log)"
"$KILN" train --solver s_h5.prototxt > h5.log 2>&1 || fail "HDF5 run: $(tail -n 3 h5.log)"
"$KILN" compare-weights lmdb_iter_12.caffemodel h5_iter_12.caffemodel --rtol 0 --atol 0 > cmp.txt 2>&1 \
  && pass || fail "HDF5 weights differ from LMDB's: $(cat cmp.txt)"
cmp -s lmdb_iter_6.caffemodel lmdb_iter_12.caffemodel && fail "the weights did not change" || pass

# resumed half-way: the same bits, in order and shuffled
"$KILN" train --solver s_h5r.prototxt --snapshot "$WORK/h5_iter_6.solverstate" > h5r.log 2>&1 \
  || fail "resumed HDF5 run: $(tail -n 3 h5r.log)"
cmp -s h5_iter_12.caffemodel h5r_iter_12.caffemodel && pass || fail "resumed HDF5 weights differ"
"$KILN" train --solver s_h5s.prototxt > h5s.log 2>&1 || fail "shuffled run: $(tail -n 3 h5s.log)"
"$KILN" train --solver s_h5sr.prototxt --snapshot "$WORK/h5s_iter_6.solverstate" > h5sr.log 2>&1 \
  || fail "resumed shuffled run: $(tail -n 3 h5sr.log)"
cmp -s h5s_iter_12.caffemodel h5sr_iter_12.caffemodel && pass || fail "resumed shuffled weights differ"
cmp -s h5_iter_12.caffemodel h5s_iter_12.caffemodel && fail "shuffle changed nothing" || pass

# HDF5Output: a test pass writes its scores and labels; read back, they give the same accuracy
test_net() {  # test_net DATA_LAYER OUTPUT_LAYER
  net "$1" | sed 's/^layer { name: "loss".*//'
  cat <<NET
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" }
$2
NET
}
test_net "$(h5_layer)" 'layer { name: "out" type: "HDF5Output" bottom: "ip" bottom: "label"
  hdf5_output_param { file_name: "'"$WORK"'/scores.h5" } }' > dump.prototxt
acc1=$("$KILN" test --model dump.prototxt --weights h5_iter_12.caffemodel --iterations 4 2>dump.log \
  | sed -n 's/^accuracy = //p')
[ -n "$acc1" ] && [ -f scores.h5 ] && pass || fail "kiln test with HDF5Output: $(tail -n 3 dump.log)"
[ -z "$(ls scores.h5.tmp* 2>/dev/null)" ] && pass || fail "temporary files left: $(ls)"
printf '%s\n' "$WORK/scores.h5" > scores.txt
cat > back.prototxt <<NET
name: "back"
layer { name: "d" type: "HDF5Data" top: "data" top: "label"
  hdf5_data_param { source: "$WORK/scores.txt" batch_size: 16 } }
layer { name: "acc" type: "Accuracy" bottom: "data" bottom: "label" top: "accuracy" }
NET
acc2=$("$KILN" test --model back.prototxt --iterations 4 2>back.log | sed -n 's/^accuracy = //p')
[ -n "$acc2" ] && [ "$acc1" = "$acc2" ] && pass \
  || fail "accuracy of the written scores '$acc2', of the test '$acc1': $(tail -n 3 back.log)"

# bad files, refused naming them: a cut file, a list naming a missing one, a file over the
# allowance
head -c 1000 a.h5 > cut.h5
printf '%s\n' "$WORK/cut.h5" > cut.txt
printf '%s\n%s\n' "$WORK/a.h5" "$WORK/missing.h5" > gone.txt
sed "s#$WORK/list.txt#$WORK/cut.txt#" h5.prototxt > cut.prototxt
sed "s#$WORK/list.txt#$WORK/gone.txt#" h5.prototxt > gone.prototxt
expect_refusal "truncated file" --want "layer 'd' (HDF5Data)" --want "$WORK/cut.h5" \
  --want "not a readable HDF5 file (corrupt or truncated)" -- "$KILN" describe --model cut.prototxt
expect_refusal "missing file" --want "gone.txt, line 2" --want "$WORK/missing.h5: cannot open" \
  -- "$KILN" describe --model gone.prototxt
# a FIFO and a device named in the list: refused at once, never read
mkfifo pipe.h5
printf '%s\n' "$WORK/pipe.h5" > pipe.txt
printf '/dev/zero\n' > zero.txt
for l in pipe zero; do
  sed "s#$WORK/list.txt#$WORK/$l.txt#" h5.prototxt > $l.prototxt
  expect_refusal "$l in the list" --timeout 10 --want "$l.txt, line 1" --want "not a regular file" \
    -- "$KILN" describe --model $l.prototxt
done
KILN_HDF5_FILE_LIMIT=1K expect_refusal "over the allowance" --want "$WORK/a.h5" \
  --want "over the memory allowance of 1.0 KiB per HDF5 data file" -- "$KILN" describe --model h5.prototxt

# Caffe's V1 and V0 HDF5 layers upgrade to the current ones
cat > v1.prototxt <<NET
name: "old"
layers { name: "d" type: HDF5_DATA top: "data" top: "label"
  hdf5_data_param { source: "$WORK/list.txt" batch_size: 16 } }
layers { name: "o" type: HDF5_OUTPUT bottom: "data" bottom: "label"
  hdf5_output_param { file_name: "$WORK/v1.h5" } }
NET
cat > v0.prototxt <<NET
name: "old"
layers { layer { name: "d" type: "hdf5_data" source: "$WORK/list.txt" batchsize: 16 }
  top: "data" top: "label" }
layers { layer { name: "o" type: "hdf5_output" hdf5_output_param { file_name: "$WORK/v0.h5" } }
  bottom: "data" bottom: "label" }
NET
for v in v0 v1; do
  "$KILN" upgrade $v.prototxt ${v}_up.prototxt > up_$v.log 2>&1 || fail "upgrade $v: $(cat up_$v.log)"
  grep -q 'type: "HDF5Data"' ${v}_up.prototxt && grep -q "source: \"$WORK/list.txt\"" ${v}_up.prototxt \
    && grep -q 'batch_size: 16' ${v}_up.prototxt && grep -q 'type: "HDF5Output"' ${v}_up.prototxt \
    && grep -q "file_name: \"$WORK/$v.h5\"" ${v}_up.prototxt && pass \
    || fail "$v HDF5 layers upgraded to: $(cat ${v}_up.prototxt)"
  "$KILN" describe --model ${v}_up.prototxt > desc_$v.log 2>&1 && pass || fail "$v upgraded net: $(tail -n 3 desc_$v.log)"
done
finish
