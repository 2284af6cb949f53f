# AnnotatedData on 2 workers (mpirun, --deterministic): they read whole global batches of the one
# stream, augmented from (seed, position), so they end with the weights of 1 worker with
# iter_size 2 bit for bit (anno.bash's set and net, labels included in the loss). Skips (exit 77)
# when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/mpi.bash"
source "$SRC/tests/cli/anno.bash"
anno_set
anno_net > net.prototxt
anno_solver w2 net.prototxt | sed -e '/^test_/d' -e '/^snapshot: /d' > w2.prototxt
anno_solver one net.prototxt 'iter_size: 2
' | sed -e '/^test_/d' -e '/^snapshot: /d' > one.prototxt
mpi 2 "$KILN" train --deterministic --solver w2.prototxt > w2.log 2>&1 \
  || fail "2 workers: $(tail -n 5 w2.log)"
"$KILN" train --solver one.prototxt > one.log 2>&1 || fail "1 worker: $(tail -n 3 one.log)"
mpi_same one_iter_6.caffemodel w2_iter_6.caffemodel "AnnotatedData, 2 workers against 1 x iter_size 2"
# negative control: one worker with iter_size 1 reads other batches
anno_solver one1 net.prototxt | sed -e '/^test_/d' -e '/^snapshot: /d' > one1.prototxt
"$KILN" train --solver one1.prototxt > one1.log 2>&1 || fail "1 worker, iter_size 1: $(tail -n 3 one1.log)"
cmp -s one1_iter_6.caffemodel w2_iter_6.caffemodel && fail "iter_size 1 gives the 2 workers' weights" || pass
finish
