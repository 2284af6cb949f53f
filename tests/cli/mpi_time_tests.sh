# Test passes and snapshots of a 2-worker TIME run land on their own iterations, as with one
# worker and with the other sync modes: with test_interval 10 and max_iter 40 the `test` events
# of the metrics file are at iterations 0 (test_initialization), 10, 20, 30 and 40, each once,
# and the snapshots at 20 and 40 are written under those iterations. A round that would run past
# a test or snapshot iteration ends there, so the rounds are cut short at these points whatever
# the clock does; rank 1 is slowed (--debug-slow-rank) so that the workers' step counts differ.
# Cases: one worker (the reference); MODEL K = 5; TIME with T = 0.2 s; TIME with a warm-up in
# GRADIENT mode that ends between two tests; TIME with test_initialization off (no test at 0).
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

mpi_tiny_lmdb
mpi_tiny_net 4 > net.prototxt
solver() {  # solver NAME [EXTRA]: writes NAME.prototxt (tests every 10, snapshots every 20)
  printf 'net: "net.prototxt"\ntest_iter: 2\ntest_interval: 10\nbase_lr: 0.05\nlr_policy: "fixed"\n'
  printf 'momentum: 0.9\nmax_iter: 40\ndisplay: 0\nrandom_seed: 5\nsnapshot: 20\n'
  printf 'snapshot_prefix: "%s"\n%s' "$WORK/$1" "${2:-}"
}
# test_iters FILE: the iterations of the test events, on one line
test_iters() { sed -n 's/.*"event":"test","iter":\([0-9]*\),.*/\1/p' "$1" | tr '\n' ' '; }
snapshot_iters() { sed -n 's/.*"event":"snapshot","iter":\([0-9]*\),.*/\1/p' "$1" | tr '\n' ' '; }
check() {  # check NAME WANT_TESTS: the test events and snapshots of run NAME
  local got
  got=$(test_iters "$1.jsonl")
  [ "$got" = "$2" ] && pass || fail "$1: test events at iterations '$got', expected '$2'"
  got=$(snapshot_iters "$1.jsonl")
  [ "$got" = "20 40 " ] && pass || fail "$1: snapshot events at iterations '$got', expected '20 40 '"
  [ -f "$1_iter_20.caffemodel" ] && [ -f "$1_iter_40.caffemodel" ] && pass \
    || fail "$1: snapshots: $(ls "$1"_iter_* 2>/dev/null | tr '\n' ' ')"
}
all="0 10 20 30 40 "

solver one > one.prototxt
"$KILN" train --solver one.prototxt --metrics one.jsonl > one.log 2>&1 \
  || fail "one worker: $(tail -n 3 one.log)"
check one "$all"

solver model > model.prototxt
mpi 2 "$KILN" train --solver model.prototxt --sync model:5 --metrics model.jsonl > model.log 2>&1 \
  || fail "MODEL: $(tail -n 5 model.log)"
check model "$all"

solver time > time.prototxt
mpi 2 "$KILN" train --solver time.prototxt --sync time:0.2 --debug-slow-rank 1:2 \
  --metrics time.jsonl > time.log 2>&1 || fail "TIME: $(tail -n 5 time.log)"
check time "$all"
# the rounds' averages happened: the workers ran different numbers of steps
it0=$(sed -n 's/^worker 0 of 2: \([0-9]*\) iterations.*/\1/p' time.log)
it1=$(sed -n 's/^worker 1 of 2: \([0-9]*\) iterations.*/\1/p' time.log)
[ -n "$it0" ] && [ -n "$it1" ] && [ "$it0" -le 40 ] && [ "$it1" -ge 4 ] && pass \
  || fail "TIME: worker steps rank 0 '$it0', rank 1 '$it1': $(grep '^worker' time.log)"

# GRADIENT for the first 15 iterations (tests at 0 and 10 in step), TIME from 15 on.
solver warm > warm.prototxt
mpi 2 "$KILN" train --solver warm.prototxt --sync time:0.2:15 --debug-slow-rank 1:2 \
  --metrics warm.jsonl > warm.log 2>&1 || fail "TIME after a warm-up: $(tail -n 5 warm.log)"
check warm "$all"

solver noinit "test_initialization: false
" > noinit.prototxt
mpi 2 "$KILN" train --solver noinit.prototxt --sync time:0.2 --metrics noinit.jsonl \
  > noinit.log 2>&1 || fail "TIME without test_initialization: $(tail -n 5 noinit.log)"
check noinit "10 20 30 40 "
finish
