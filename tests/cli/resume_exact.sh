# A run snapshotted half-way and resumed ends with weights bit-identical to the uninterrupted
# run (LeNet on Fashion-MNIST from the cache; the data cursor and generator state are restored).
source "$(dirname "$0")/lib.bash"
cd "$WORK"
ITERS=${KILN_RESUME_ITERS:-200}
HALF=$((ITERS / 2))
mk() {  # mk PREFIX
  sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
      -e "s#^max_iter: .*#max_iter: $ITERS#" -e "s#^snapshot: .*#snapshot: $HALF#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/$1\"#" -e "s#^test_interval: .*#test_interval: $HALF#" \
      -e "s#^test_iter: .*#test_iter: 5#" \
      "$SRC/models/lenet/lenet_solver.prototxt"
}
mk straight > straight.prototxt
mk resumed > resumed.prototxt
"$KILN" train --solver straight.prototxt --metrics s.jsonl 2>/dev/null || fail "straight run"
# Temporary files of snapshots killed mid-write (their process gone) are removed by the next
# snapshot of the prefix; one of a live process, and other prefixes' files, are left alone.
true & dead=$!
wait $dead
touch "resumed_iter_7.caffemodel.tmp.$dead" "resumed_iter_7.solverstate.tmp.$dead" \
  "resumed_iter_8.caffemodel.tmp.$$" "other_iter_7.caffemodel.tmp.$dead"
"$KILN" train --solver resumed.prototxt --snapshot "$WORK/straight_iter_$HALF.solverstate" --metrics r.jsonl 2>resumed.log \
  || fail "resumed run"
[ ! -e "resumed_iter_7.caffemodel.tmp.$dead" ] && [ ! -e "resumed_iter_7.solverstate.tmp.$dead" ] \
  && pass || fail "a killed snapshot's temporary files were left: $(ls)"
grep -q "removed 2 temporary files left by killed snapshots" resumed.log && pass \
  || fail "the removal is not logged: $(grep kiln resumed.log)"
[ -e "resumed_iter_8.caffemodel.tmp.$$" ] && [ -e "other_iter_7.caffemodel.tmp.$dead" ] && pass \
  || fail "a live process's or another prefix's temporary file was removed"
cmp -s "straight_iter_$ITERS.caffemodel" "resumed_iter_$ITERS.caffemodel" && pass \
  || fail "resumed weights differ from the uninterrupted run"
# Its test passes test the same records as the uninterrupted run's (the test nets' data cursors
# are in the snapshot: 5 batches of 100 leave the test set's cursor at 500, not at its start).
test_at() { grep '"event":"test"' "$1" | grep "\"iter\":$ITERS," | sed -n 's/.*"loss":\([^,]*\),.*"accuracy":\([^,}]*\).*/\1 \2/p'; }
a=$(test_at s.jsonl); b=$(test_at r.jsonl)
[ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "test pass at $ITERS: uninterrupted '$a', resumed '$b'"
# The resumed run must start at HALF, not at 0.
head -n 1 r.jsonl | grep -q "\"iter\":$HALF" && pass || fail "resume did not start at $HALF: $(head -n 1 r.jsonl)"
# Negative control: the half-way weights differ from the final ones.
cmp -s "straight_iter_$HALF.caffemodel" "straight_iter_$ITERS.caffemodel" && fail "weights did not change" || pass

# kiln test on the trained weights: accuracy well above chance (0.1) after $ITERS iterations.
out=$("$KILN" test --model "$SRC/models/lenet/lenet_train_test.prototxt" \
  --weights "straight_iter_$ITERS.caffemodel" --iterations 10 --metrics t.jsonl 2>/dev/null) || fail "kiln test"
acc=$(echo "$out" | sed -n 's/^accuracy = //p')
awk -v a="$acc" 'BEGIN { exit !(a > 0.6) }' && pass || fail "kiln test accuracy '$acc' not above 0.6"
grep -q '"event":"test".*"accuracy":' t.jsonl && pass || fail "kiln test wrote no test event"
# --weights starts training from them: the first displayed loss is far below a fresh net's ~2.3.
mk fromweights | sed -e 's/^max_iter: .*/max_iter: 1/' -e 's/^display: .*/display: 1/' > fw.prototxt
"$KILN" train --solver fw.prototxt --weights "straight_iter_$ITERS.caffemodel" --metrics fw.jsonl 2>/dev/null \
  || fail "train --weights"
loss=$(grep '"event":"train"' fw.jsonl | head -n 1 | sed -n 's/.*"loss":\([0-9.e-]*\).*/\1/p')
awk -v l="$loss" 'BEGIN { exit !(l < 1.5) }' && pass || fail "first loss with --weights is $loss"

# The same on a net whose activations oneDNN keeps in its blocked layout (resnet20: 16-64
# channel convolutions, BatchNorm, Scale, Eltwise, Winograd), 6 iterations of batch 128.
mk20() {  # mk20 PREFIX
  sed -e "s#^net: .*#net: \"$SRC/models/resnet20/resnet20_train_test.prototxt\"#" \
      -e "s#^max_iter: .*#max_iter: 6#" -e "s#^snapshot: .*#snapshot: 3#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/$1\"#" -e "s#^test_interval: .*#test_interval: 3#" \
      -e "s#^test_iter: .*#test_iter: 1#" -e "s#^display: .*#display: 1#" \
      "$SRC/models/resnet20/resnet20_solver.prototxt"
}
mk20 r20straight > r20s.prototxt
mk20 r20resumed > r20r.prototxt
"$KILN" train --solver r20s.prototxt 2>/dev/null || fail "resnet20 straight run"
"$KILN" train --solver r20r.prototxt --snapshot "$WORK/r20straight_iter_3.solverstate" 2>/dev/null \
  || fail "resnet20 resumed run"
cmp -s r20straight_iter_6.caffemodel r20resumed_iter_6.caffemodel && pass \
  || fail "resnet20: resumed weights differ from the uninterrupted run"
cmp -s r20straight_iter_3.caffemodel r20straight_iter_6.caffemodel && fail "resnet20 weights did not change" || pass
finish
