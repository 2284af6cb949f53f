# The zoo's small SSD (models/ssd, as committed: AnnotatedData with SSD's augmentation,
# BatchNorm, MultiBoxLoss) on 2 workers (mpirun, --deterministic) against 1 worker with
# iter_size 2, 3 iterations on the cache's shapes-det set: every learnable parameter ends the
# same bit for bit (the workers read the global batches one worker reads, augmented from the
# seed and each record's position, and sum their gradients in rank order). BatchNorm's running
# statistics are the one difference, as docs/distributed.md says: each worker folds its own 3
# batches into them and the workers average them, where one worker folds all 6 passes, so the
# layers' scale factors are 1 + f + f^2 against 1 + f + ... + f^5 (f = 0.99, the net's
# moving_average_fraction), and every value that differs is one of BatchNorm's. Negative
# control: 1 worker with iter_size 1 reads other batches. Skips (exit 77) when mpirun is missing
# or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/mpi.bash"
export KILN_DATA="$WORK/cache"
need "fetch shapes-det" -- "$KILN" data fetch shapes-det || { finish; exit 1; }
mpi_zoo_solver ssd w2 1 3 > w2.prototxt
mpi_zoo_solver ssd one 2 3 > one.prototxt
mpi_zoo_solver ssd one1 1 3 > one1.prototxt
grep -q '^eval_type: "detection"$' w2.prototxt && ! grep -q '^test_' w2.prototxt && pass \
  || fail "w2.prototxt: $(cat w2.prototxt)"

mpi 2 -x KILN_DATA "$KILN" train --deterministic --solver w2.prototxt > w2.log 2>&1 \
  || fail "2 workers: $(tail -n 5 w2.log)"
grep -q "2 workers, gradient sync (deterministic: rank-order sum), global batch 64 = batch 32 x 2 workers x iter_size 1" w2.log \
  && pass || fail "2 workers: no sync line: $(grep workers w2.log)"
"$KILN" train --solver one.prototxt > one.log 2>&1 || fail "1 worker: $(tail -n 3 one.log)"
"$KILN" train --solver one1.prototxt > one1.log 2>&1 || fail "1 worker, iter_size 1: $(tail -n 3 one1.log)"
[ -f w2_iter_3.caffemodel ] && [ -f one_iter_3.caffemodel ] && [ -f one1_iter_3.caffemodel ] && pass \
  || fail "snapshots: $(ls)"

# Every value outside (tolerance 0) is a BatchNorm statistic: the whole files' count of values
# outside is the BatchNorm blobs' count.
BN=$(sed -n 's/^layer { name: "\([^"]*\)" type: "BatchNorm".*/\1/p' "$SRC/models/ssd/ssd_train_test.prototxt")
[ "$(echo $BN | wc -w)" = 7 ] && pass || fail "models/ssd's BatchNorm layers: $BN"
outside() { "$KILN" compare-weights "$@" | sed -n 's/.*; \([0-9]*\) outside .*/\1/p'; }
all=$(outside w2_iter_3.caffemodel one_iter_3.caffemodel)
bn=0
for l in $BN; do
  for k in 0 1 2; do bn=$((bn + $(outside w2_iter_3.caffemodel one_iter_3.caffemodel --blob "$l:$k"))); done
  # the scale factor: 3 folds on each worker, 6 passes on one
  "$KILN" compare-weights w2_iter_3.caffemodel one_iter_3.caffemodel --blob "$l:2" | sed -n 's/.*\]: \(.*\) vs \(.*\)$/\1 \2/p' \
    | awk '{ f = 0.99; exit !(($1 - (1 + f + f^2)) ^ 2 < 1e-12 && ($2 - (1 + f + f^2 + f^3 + f^4 + f^5)) ^ 2 < 1e-12) }' \
    && pass || fail "$l: scale factors: $("$KILN" compare-weights w2_iter_3.caffemodel one_iter_3.caffemodel --blob "$l:2")"
done
[ -n "$all" ] && [ "$all" = "$bn" ] && pass \
  || fail "2 workers against iter_size 2: $all values differ, $bn of them BatchNorm's: $("$KILN" compare-weights w2_iter_3.caffemodel one_iter_3.caffemodel)"
echo "2 workers against 1 x iter_size 2: $all values differ, all BatchNorm statistics ($bn)"
# negative control: iter_size 1 gives other weights (a convolution's, not only BatchNorm's)
"$KILN" compare-weights one1_iter_3.caffemodel w2_iter_3.caffemodel --blob conv1:0 > /dev/null \
  && fail "iter_size 1 gives the 2 workers' conv1" || pass
finish
