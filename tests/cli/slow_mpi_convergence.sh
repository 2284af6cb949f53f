# Convergence of the three sync modes on real data: LeNet on Fashion-MNIST for 1,500 iterations
# (one thread per worker), tested on all 10,000 test images.
#   GRADIENT, 2 workers:              accuracy >= the single worker's - 0.005
#   MODEL, K = 10, 2 workers:         accuracy >= the single worker's - 0.01
#   TIME, 1 s rounds, rank 1 slowed:  accuracy >= the single worker's - 0.01, and rank 0's
#                                     throughput (its waits counted) >= 0.9 of the same run's
#                                     without the slowdown (confirmed on a second pair of
#                                     runs before it fails), while rank 1 runs at most 0.75 of
#                                     rank 0's rate. Ranks are bound to cores.
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
if ! command -v mpirun >/dev/null 2>&1 || [ "${KILN_HAVE_MPI:-1}" = 0 ]; then
  echo "SKIP: no MPI (mpirun missing or kiln built without it)"
  exit 77
fi
export OMP_NUM_THREADS=1 NO_COLOR=1
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }
ITERS=1500
sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
    -e "s#^max_iter: .*#max_iter: $ITERS#" -e "s#^test_interval: .*#test_interval: $ITERS#" \
    -e "s#^snapshot: .*#snapshot: 0#" -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/lenet\"#" \
    "$SRC/models/lenet/lenet_solver.prototxt" > solver.prototxt

run() {  # run NAME NP [OPTIONS...]: trains, leaves NAME.jsonl and NAME.log
  local name=$1 np=$2
  shift 2
  if [ "$np" = 1 ]; then
    "$KILN" train --solver solver.prototxt --metrics "$name.jsonl" "$@" > "$name.log" 2>&1
  else
    timeout -k 5 600 mpirun -np "$np" --oversubscribe --allow-run-as-root \
      --bind-to core:overload-allowed \
      -x OMP_NUM_THREADS=1 "$KILN" train --solver solver.prototxt --metrics "$name.jsonl" "$@" \
      > "$name.log" 2>&1
  fi || fail "$name: training failed: $(tail -n 5 "$name.log")"
}
accuracy() {  # the last test accuracy in NAME.jsonl
  sed -n 's/.*"event":"test".*"accuracy":\([0-9.e-]*\).*/\1/p' "$1.jsonl" | tail -n 1
}
wall_rate() {  # rank R's samples/s with its waits counted, from NAME.jsonl
  sed -n "s/.*\"event\":\"worker\".*\"rank\":$2,.*\"wall_samples_per_s\":\([0-9.e+-]*\).*/\1/p" "$1.jsonl"
}
at_least() {  # at_least WHAT VALUE FLOOR
  if [ -n "$2" ] && awk -v a="$2" -v b="$3" 'BEGIN { exit !(a >= b) }'; then
    pass
  else
    fail "$1: $2 is under $3"
  fi
}

run one 1
run grad 2 --sync grad
run model 2 --sync model:10
run time 2 --sync time:1
# Rank 1 sleeps as long as an iteration takes it (about 25 ms here): half speed.
run slow 2 --sync time:1 --debug-slow-rank 1:25
a1=$(accuracy one)
echo "accuracy after $ITERS iterations: 1 worker $a1, GRADIENT $(accuracy grad)," \
  "MODEL K=10 $(accuracy model), TIME $(accuracy time), TIME with rank 1 slowed $(accuracy slow)"
at_least "1 worker accuracy" "$a1" 0.80
at_least "GRADIENT accuracy" "$(accuracy grad)" "$(awk -v a="$a1" 'BEGIN { print a - 0.005 }')"
at_least "MODEL accuracy" "$(accuracy model)" "$(awk -v a="$a1" 'BEGIN { print a - 0.01 }')"
at_least "TIME (slowed) accuracy" "$(accuracy slow)" "$(awk -v a="$a1" 'BEGIN { print a - 0.01 }')"
fast=$(wall_rate time 0)
slowed=$(wall_rate slow 0)
echo "rank 0 samples/s, waits counted: $fast unslowed, $slowed with rank 1 slowed"
grep '^worker' slow.log
# A timing on a shared machine: a shortfall is confirmed on a second pair of runs before it
# fails, as kiln ce confirms a suspected timing regression (a CI run once saw rank 0 compute 11%
# slower in the slowed run while rank 1 slept: the machine, not the mode).
if ! awk -v s="$slowed" -v f="$fast" 'BEGIN { exit !(s >= 0.9 * f) }'; then
  echo "rank 0 throughput with rank 1 slowed under 0.9 of unslowed; running the pair again"
  run time 2 --sync time:1
  run slow 2 --sync time:1 --debug-slow-rank 1:25
  fast=$(wall_rate time 0)
  slowed=$(wall_rate slow 0)
  echo "again: rank 0 samples/s, waits counted: $fast unslowed, $slowed with rank 1 slowed"
  grep '^worker' slow.log
fi
at_least "rank 0 throughput with rank 1 slowed" "$slowed" "$(awk -v a="$fast" 'BEGIN { print 0.9 * a }')"
# The slowdown was real: rank 1 ran at most 0.75 of rank 0's rate (about half, by the sleep), so
# the accuracy and throughput above were measured with one worker well behind the other.
laggard=$(wall_rate slow 1)
echo "rank 1 samples/s with its sleep: $laggard"
at_least "rank 1 slowed (0.75 x rank 0's rate over its own)" \
  "$(awk -v a="$slowed" -v b="$laggard" 'BEGIN { if (b > 0) print 0.75 * a / b }')" 1
finish
