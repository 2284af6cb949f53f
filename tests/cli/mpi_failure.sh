# A worker that dies or stops mid-run ends the whole job with a non-zero exit and a message that
# names it, within a bounded time (docs/distributed.md, Failures), on a tiny LMDB written from
# hand-made IDX files:
#   (a) SIGKILL of rank 1 of 2: Open MPI's mpirun ends the job (about 1 s here) and names rank 1;
#       kiln's start-up table of the ranks' hosts and processes gives the killed pid as rank 1;
#   (b) SIGSTOP of rank 1 of 3 with --comm-timeout 5: kiln's watchdog on the ranks left waiting
#       ends the job after 5 s + a 2 s roll call, naming the collective, the wait, rank 1 (with
#       its pid and host) as the one that did not answer and the ranks that waited with it;
#   (c) a healthy run with a short --comm-timeout trains to the end (no false alarm);
#   (e) a rank stopped during the start-up (KILN_FAULT=stop:STAGE:1): before MPI_Init (the others
#       wait in MPI_Init, watched by the command's own thread), after it (in the duplication of
#       kiln's communicators) and before the first collective of the set-up, with --comm-timeout 5:
#       the job ends within bounds, naming rank 1;
#   (d) bad --comm-timeout values are refused with a clear message.
# Every mpirun runs under `timeout -k 5 90`, so a hang fails the test instead of blocking CI.
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

# (d) first: no mpirun needed, the option is checked before anything starts.
for bad in abc -1 nan inf 5s ""; do
  expect_error "--comm-timeout '$bad'" "--comm-timeout '$bad': expected the seconds" -- \
    "$KILN" train --solver none.prototxt --comm-timeout "$bad"
done
expect_error "--comm-timeout without a value" "missing value for '--comm-timeout'" -- \
  "$KILN" train --solver none.prototxt --comm-timeout

mpi_tiny_lmdb
mpi_tiny_net 4 > net.prototxt
solver() {  # solver MAX_ITER DISPLAY
  printf 'net: "%s/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: %s\n' "$WORK" "$1"
  printf 'display: %s\nrandom_seed: 5\nsnapshot_prefix: "%s/snap"\nsnapshot_after_train: false\n' "$2" "$WORK"
}
# Runs "forever": the test ends them (a million iterations, a display line every 50).
solver 1000000 50 > long.prototxt
solver 200 0 > short.prototxt

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
STRAYS=()
cleanup_strays() {  # a rank mpirun left behind (never expected): ours by its solver path under $WORK
  local p
  for p in "${STRAYS[@]}"; do
    if tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" | grep -q "$WORK/long.prototxt"; then
      fail "rank process $p outlived its job"
      kill -KILL "$p" 2>/dev/null
    fi
  done
}
trap 'cleanup_strays; rm -rf "$WORK"' EXIT

# kill_case NAME NP RANK SIGNAL [OPTIONS...]: starts NP workers on long.prototxt, waits for
# training to be under way (a display line), sends SIGNAL to RANK and sets RC, TOOK (seconds
# from the signal to mpirun's exit) and VICTIM (the signalled process id).
kill_case() {
  local name=$1 np=$2 victim=$3 sig=$4
  shift 4
  timeout -k 5 90 mpirun -np "$np" --oversubscribe --allow-run-as-root --bind-to none \
    -x OMP_NUM_THREADS=1 "${FORWARD[@]}" "$KILN" train --solver "$WORK/long.prototxt" "$@" \
    > "$name.log" 2>&1 &
  local root=$! pid
  pid=$(mpi_await_rank "$root" "$victim" "$name.log")
  if [ -z "$pid" ]; then
    fail "$name: the $np workers did not start training: $(tail -n 5 "$name.log")"
    kill -TERM "$root" 2>/dev/null
    wait "$root"
    RC=0 TOOK=0
    return 1
  fi
  STRAYS+=("$pid")
  VICTIM=$pid
  local t0
  t0=$(now)
  kill "-$sig" "$pid"
  wait "$root"
  RC=$?
  TOOK=$(elapsed "$t0" "$(now)")
  echo "$name: exit $RC, $TOOK s after SIG$sig to rank $victim"
  # A job ended by our signal, not by timeout(1) (124, or 137 after 90 + 5 s).
  if [ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && awk -v t="$TOOK" 'BEGIN { exit !(t < 30) }'; then
    pass
  else
    fail "$name: exit $RC after $TOOK s (expected non-zero within 30 s): $(tail -n 8 "$name.log")"
  fi
  # The sanitizers must stay quiet on every rank, even on these paths.
  grep -q "ERROR: AddressSanitizer\|runtime error:" "$name.log" \
    && fail "$name: sanitizer report: $(grep -m 3 "AddressSanitizer\|runtime error" "$name.log")" || pass
  return 0
}

# (a) SIGKILL: Open MPI sees the process die and ends the job itself.
if kill_case killed 2 1 KILL; then
  grep -Eq "rank 1[^0-9]" killed.log && pass \
    || fail "killed: the output does not name rank 1: $(grep -v '^iter' killed.log | tail -n 8)"
  grep -q "^kiln info: host [^:]*: rank 0 (pid [0-9]*), rank 1 (pid $VICTIM)$" killed.log && pass \
    || fail "killed: no start-up line giving pid $VICTIM as rank 1: $(grep '^kiln info: host' killed.log)"
fi

# (b) SIGSTOP: nothing dies, so only kiln's watchdog can end it. Ranks 0 and 2 wait in the
# gradient sum, time out after 5 s and ask every rank where it is; rank 1 cannot answer.
if kill_case stopped 3 1 STOP --comm-timeout 5; then
  line=$(grep -m 1 "^kiln: rank [02] of 3: train at iteration [0-9]*: " stopped.log)
  [ -n "$line" ] && pass || fail "stopped: no watchdog message: $(grep -v '^iter' stopped.log | tail -n 8)"
  for want in "waited [0-9.]+ s for the other workers, past the limit of 5 s \\(--comm-timeout\\)" \
              "rank 1 \\(pid $VICTIM on [^)]+\\) did not answer" "rank [02] is (waiting in it too|in [a-z])"; do
    echo "$line" | grep -Eq -- "$want" && pass || fail "stopped: message lacks '$want': $line"
  done
  # Not before the limit: the 5 s wait, then up to 2 s for the roll call.
  awk -v t="$TOOK" 'BEGIN { exit !(t >= 5) }' && pass || fail "stopped: ended after $TOOK s, before the limit"
fi

# (e) Stopped during the start-up. stage NP WANT...: the job must end non-zero, not before the
# 5 s limit, within 30 s, with a message holding each WANT (extended regular expressions).
startup_case() {
  local stage=$1 np=$2
  shift 2
  local t0 rc took
  t0=$(now)
  timeout -k 5 90 mpirun -np "$np" --oversubscribe --allow-run-as-root --bind-to none \
    -x OMP_NUM_THREADS=1 -x KILN_FAULT="stop:$stage:1" "${FORWARD[@]}" \
    "$KILN" train --solver "$WORK/long.prototxt" --comm-timeout 5 > "start_$stage.log" 2>&1
  rc=$?
  took=$(elapsed "$t0" "$(now)")
  echo "stopped at '$stage' ($np workers): exit $rc after $took s"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && awk -v t="$took" 'BEGIN { exit !(t >= 5 && t < 30) }'; then
    pass
  else
    fail "stopped at '$stage': exit $rc after $took s (expected non-zero within 5-30 s): $(tail -n 8 "start_$stage.log")"
  fi
  local line
  line=$(grep -m 1 "^kiln: rank [02] of $np" "start_$stage.log")
  for want in "$@"; do
    echo "$line" | grep -Eq -- "$want" && pass || fail "stopped at '$stage': message lacks '$want': $line"
  done
  grep -q "ERROR: AddressSanitizer\|runtime error:" "start_$stage.log" \
    && fail "stopped at '$stage': sanitizer report" || pass
}
startup_case start 2 "MPI start-up \\(MPI_Init\\) waited [0-9.]+ s for the other workers, past the limit of 5 s" \
  "rank 1 did not join it \\(stopped"
startup_case init 3 "start-up \\(communicator duplication\\) \\(collective 1\\) waited [0-9.]+ s" \
  "rank 1 did not answer" "rank [02] is waiting in it too"
startup_case setup 2 "allgather of [0-9]+ bytes \\(collective 2\\) waited [0-9.]+ s" "rank 1 did not answer"

# (c) No false alarm: a healthy run with a short limit trains to the end (10 s, not less: on a
# loaded machine a rank can be off its core for a few seconds).
timeout -k 5 90 mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 \
  "${FORWARD[@]}" "$KILN" train --solver "$WORK/short.prototxt" --comm-timeout 10 > short.log 2>&1 \
  && pass || fail "healthy run with --comm-timeout 10: $(tail -n 5 short.log)"
grep -q "done at iteration 200" short.log && pass || fail "healthy run did not finish: $(tail -n 3 short.log)"
finish
