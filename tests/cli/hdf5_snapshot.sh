# snapshot_format: HDF5 (Caffe's .caffemodel.h5 and .solverstate.h5): a run snapshotting in HDF5
# ends on the bits of the same run in binary protobuf; resuming from the .solverstate.h5 at 3 ends
# on the same bits again; the .caffemodel.h5 serves kiln test and --weights; damaged files are
# refused by name, and nothing is left under a final name when a snapshot cannot be written.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/tiny.bash"
tiny_lmdb
tiny_net 4 > net.prototxt
solver() {  # solver PREFIX FORMAT
  printf 'net: "%s/net.prototxt"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 6\n' "$WORK"
  printf 'display: 0\nrandom_seed: 4\nsnapshot: 3\nsnapshot_prefix: "%s/%s"\nsnapshot_format: %s\n' "$WORK" "$1" "$2"
}
solver bin BINARYPROTO > bin.prototxt
solver h5 HDF5 > h5.prototxt
solver re HDF5 > re.prototxt
"$KILN" train --solver bin.prototxt > bin.log 2>&1 || fail "binary run: $(tail -n 3 bin.log)"
"$KILN" train --solver h5.prototxt > h5.log 2>&1 || fail "HDF5 run: $(tail -n 3 h5.log)"
for f in h5_iter_3.caffemodel.h5 h5_iter_3.solverstate.h5 h5_iter_6.caffemodel.h5 h5_iter_6.solverstate.h5; do
  [ -f "$f" ] && [ "$(head -c 8 "$f" | od -An -c | tr -d ' ')" = '211HDF\r\n032\n' ] && pass || fail "$f: missing or not HDF5"
done
ls ./*.tmp.* 2>/dev/null && fail "temporary files left" || pass
"$KILN" compare-weights bin_iter_6.caffemodel h5_iter_6.caffemodel.h5 --rtol 0 --atol 0 > cmp1.txt 2>&1 \
  && pass || fail "HDF5 weights differ from binary: $(cat cmp1.txt)"
"$KILN" train --solver re.prototxt --snapshot h5_iter_3.solverstate.h5 > re.log 2>&1 || fail "resume: $(tail -n 3 re.log)"
"$KILN" compare-weights h5_iter_6.caffemodel.h5 re_iter_6.caffemodel.h5 --rtol 0 --atol 0 > cmp2.txt 2>&1 \
  && pass || fail "resumed from .solverstate.h5: $(cat cmp2.txt)"
"$KILN" test --model net.prototxt --weights h5_iter_6.caffemodel.h5 --iterations 2 > t_h5.txt 2>&1
"$KILN" test --model net.prototxt --weights bin_iter_6.caffemodel --iterations 2 > t_bin.txt 2>&1
diff -q <(grep loss t_h5.txt) <(grep loss t_bin.txt) >/dev/null && grep -q loss t_h5.txt && pass \
  || fail "kiln test on the .h5 weights: $(tail -n 2 t_h5.txt)"

# damage: a cut file, a file of another kind, an HDF5 weights file passed as state
head -c 1000 h5_iter_3.solverstate.h5 > cut.solverstate.h5
expect_error "cut .solverstate.h5" "cut.solverstate.h5: not a readable HDF5 file" -- \
  "$KILN" train --solver re.prototxt --snapshot cut.solverstate.h5
printf 'not hdf5' > fake.caffemodel.h5
expect_error "not HDF5" "fake.caffemodel.h5: not an HDF5 file" -- \
  "$KILN" test --model net.prototxt --weights fake.caffemodel.h5 --iterations 1
expect_error "weights file as state" "h5_iter_3.caffemodel.h5: dataset 'iter' is missing" -- \
  "$KILN" train --solver re.prototxt --snapshot h5_iter_3.caffemodel.h5
expect_error "state file as weights" "no group 'data'" -- \
  "$KILN" test --model net.prototxt --weights h5_iter_3.solverstate.h5 --iterations 1
# a snapshot that cannot be written: an error, and no file under the final name
mkdir ro && chmod 555 ro
solver ro/x HDF5 > ro.prototxt
if [ "$(id -u)" -ne 0 ]; then
  expect_error "unwritable snapshot" "ro/x_iter_3.caffemodel.h5" -- "$KILN" train --solver ro.prototxt
  [ -z "$(ls ro)" ] && pass || fail "files left in ro: $(ls ro)"
fi
finish
