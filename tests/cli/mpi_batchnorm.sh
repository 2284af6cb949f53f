# BatchNorm's running statistics under 2 workers, in each sync mode. Each worker normalises with
# its own batch's statistics and folds them into its own running mean; the workers then average
# their statistics (GRADIENT: before the snapshot; MODEL and TIME: with the parameters). After one
# iteration from the same start, the first BatchNorm layer's running mean over 2 workers x batch
# 4 must therefore be the mean of the 8 samples: what 1 worker with batch 8 holds (global batch
# j goes to worker j mod 2, so the two batches are records 0-3 and 4-7), up to rounding. The
# variance is not compared: the average of two batches' variances lacks the spread between them.
# Negative control: 1 worker with batch 4 (rank 0's batch alone), which a missing average leaves.
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"
mpi_tiny_lmdb

tiny_bn_net 4 > net4.prototxt
tiny_bn_net 8 > net8.prototxt
solver() {  # solver NAME NET MAX_ITER: snapshots NAME_iter_MAX_ITER at the end
  printf 'net: "%s"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\nmax_iter: %s\n' "$2" "$3"
  printf 'display: 0\nrandom_seed: 5\nsnapshot_prefix: "%s"\n' "$WORK/$1"
}
one() {  # one NAME NET
  solver "$1" "$2" 1 > "$1.prototxt"
  "$KILN" train --solver "$1.prototxt" 2>"$1.log" || fail "$1: one-worker run: $(tail -n 3 "$1.log")"
}
one one8 net8.prototxt
one one4 net4.prototxt
cmpbn() {  # cmpbn A B BLOB [TOLERANCES...]: the BatchNorm layer's blob BLOB in A and B
  local a=$1 b=$2 k=$3
  shift 3
  "$KILN" compare-weights "$a" "$b" --blob "bn:$k" "$@"
}
# Both references hold the statistics, and they differ: the control can tell.
cmpbn one8_iter_1.caffemodel one4_iter_1.caffemodel 0 --rtol 1e-3 >/dev/null \
  && fail "the mean over 8 samples equals rank 0's batch alone: no control" || pass
cmpbn one8_iter_1.caffemodel one4_iter_1.caffemodel 2 > /dev/null \
  && pass || fail "the scale factors after one iteration differ: $(cmpbn one8_iter_1.caffemodel one4_iter_1.caffemodel 2)"
for mode in grad model:1 time:1000; do
  name=w_${mode%%:*}
  solver "$name" net4.prototxt 1 > "$name.prototxt"
  mpi 2 "$KILN" train --solver "$name.prototxt" --sync "$mode" > "$name.log" 2>&1 \
    || fail "$name: 2-worker run: $(tail -n 5 "$name.log")"
  if cmpbn one8_iter_1.caffemodel "${name}_iter_1.caffemodel" 0 --rtol 1e-5 --atol 1e-8 > "$name.cmp"; then
    pass
  else
    fail "--sync $mode: the running mean is not the 8 samples' mean: $(cat "$name.cmp")"
  fi
  cmpbn one4_iter_1.caffemodel "${name}_iter_1.caffemodel" 0 --rtol 1e-3 >/dev/null \
    && fail "--sync $mode: the running mean is rank 0's alone (not averaged)" || pass
  cmpbn one8_iter_1.caffemodel "${name}_iter_1.caffemodel" 2 > "$name.cmp2" \
    && pass || fail "--sync $mode: scale factor: $(cat "$name.cmp2")"
done
# The comparison is limited to the one blob (the rest of the model differs after a step), and
# a name that is not there compares nothing, which fails.
"$KILN" compare-weights one8_iter_1.caffemodel w_grad_iter_1.caffemodel --rtol 1e-5 >/dev/null \
  && fail "the whole models are equal: the --blob comparison proves nothing" || pass
"$KILN" compare-weights one8_iter_1.caffemodel one8_iter_1.caffemodel --blob nosuch:0 >/dev/null \
  && fail "--blob with a missing layer passed" || pass
finish
