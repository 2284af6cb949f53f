# The AnnotatedData layer (the SSD fork's detection data) through the `kiln` command, on a tiny
# PASCAL VOC tree made here and converted by `kiln convert annoset` (anno.bash): `kiln
# describe` builds a net of it (SSD's training augmentation, a convolution on the data, an
# InnerProduct on the label rows) in TRAIN and TEST, the layer's prefetch memory in the plan;
# `kiln train` runs it with test passes; a run snapshotted half-way and resumed ends with the
# uninterrupted run's weights bit for bit; another seed gives other weights; a label the label
# map lacks is refused naming the layer, the record's database and the label. (2 workers
# against 1 with iter_size 2: mpi_anno_data.sh.)
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/anno.bash"
anno_set
anno_net > net.prototxt

out=$("$KILN" describe --model net.prototxt 2>&1) || fail "describe TRAIN: $out"
grep -q "^data  *AnnotatedData  *3x3x16x16 " <<<"$out" && pass || fail "describe TRAIN: $out"
grep -q "^rows  *InnerProduct  *1x1x[0-9]*x2 " <<<"$out" && pass || fail "describe: no label rows: $out"
grep -q "prefetch [1-9]" <<<"$out" && pass || fail "describe: no prefetch memory: $out"
out=$("$KILN" describe --model net.prototxt --phase TEST 2>&1) || fail "describe TEST: $out"
grep -q "^data  *AnnotatedData  *4x3x16x16 " <<<"$out" && pass || fail "describe TEST: $out"

anno_solver straight net.prototxt > straight.prototxt
anno_solver resumed net.prototxt > resumed.prototxt
"$KILN" train --solver straight.prototxt --metrics s.jsonl > straight.log 2>&1 \
  || fail "train: $(tail -n 5 straight.log)"
grep -q '"event":"train"' s.jsonl && grep -q '"event":"test"' s.jsonl && pass \
  || fail "no train or test events: $(head -c 600 s.jsonl)"
loss=$(grep '"event":"train"' s.jsonl | tail -n 1 | sed -n 's/.*"loss":\([0-9.e+-]*\).*/\1/p')
awk -v l="$loss" 'BEGIN { exit !(l > 0 && l < 1e6) }' && pass || fail "last loss '$loss'"
"$KILN" train --solver resumed.prototxt --snapshot "$WORK/straight_iter_3.solverstate" \
  > resumed.log 2>&1 || fail "resumed: $(tail -n 5 resumed.log)"
cmp -s straight_iter_6.caffemodel resumed_iter_6.caffemodel && pass \
  || fail "resumed weights differ: $("$KILN" compare-weights straight_iter_6.caffemodel resumed_iter_6.caffemodel 2>&1 | head -n 3)"
cmp -s straight_iter_3.caffemodel straight_iter_6.caffemodel && fail "the weights did not change" || pass
# the label rows' layer learns from them (its weights move between the snapshots)
"$KILN" compare-weights straight_iter_3.caffemodel straight_iter_6.caffemodel --blob rows:0 \
  > moved.txt 2>&1 && fail "the label rows' weights did not move: $(cat moved.txt)" || pass
anno_solver seed18 net.prototxt | sed 's/^random_seed: 17/random_seed: 18/' > seed18.prototxt
"$KILN" train --solver seed18.prototxt > seed18.log 2>&1 || fail "seed 18: $(tail -n 3 seed18.log)"
cmp -s straight_iter_6.caffemodel seed18_iter_6.caffemodel && fail "another seed, the same weights" || pass

# a label the label map lacks: refused naming the layer, the record and the label
grep -v cross labelmap.prototxt > short_map.prototxt
anno_net short_map.prototxt > short.prototxt
anno_solver short short.prototxt > short_solver.prototxt
expect_refusal "label not in the map" --want "layer 'data' (AnnotatedData)" --want "label 3" \
  --want "of $WORK/train_lmdb" --want "short_map.prototxt" -- "$KILN" train --solver short_solver.prototxt
finish
