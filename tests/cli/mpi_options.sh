# Every worker of an MPI job must be given the same options that change what is trained or how
# the workers meet (docs/distributed.md, Settings): --snapshot, --weights, --sync,
# --deterministic, --no-overlap, --check, --comm-timeout and --debug-slow-rank. Started in
# mpirun's MPMD form (`-np 1 kiln train ... : -np 1 kiln train ... --weights W`), ranks given
# different ones are refused before anything is read or trained: on every rank, a message
# naming the option, the rank that differs and both values, a non-zero exit within seconds (no
# hang), no snapshot written. Before, rank 1 alone with --weights trained from scratch and exited
# 0 (only rank 0 reads the weights), and rank 1 alone with --snapshot failed with MPI_ERR_TRUNCATE.
# What may differ does not stop a job: --threads and --metrics, and spellings of one setting
# (--sync grad and gradient, --comm-timeout 300 and the default).
# Every mpirun runs under `timeout -k 5 60`, so a hang fails the test instead of blocking CI.
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

mpi_tiny_lmdb
mpi_tiny_net 4 > net.prototxt
solver() {  # solver PREFIX: 4 iterations, a snapshot at the end under $WORK/PREFIX
  printf 'net: "%s/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 4\n' "$WORK"
  printf 'display: 1\nrandom_seed: 5\nsnapshot_prefix: "%s/%s"\n' "$WORK" "$1"
}
solver seed > seed.prototxt
solver run > run.prototxt
# the inputs: one worker's weights and solver state after 4 iterations
"$KILN" train --solver seed.prototxt > seed.log 2>&1 || fail "the one-worker run: $(tail -n 3 seed.log)"
cp seed_iter_4.caffemodel w.caffemodel
cp seed_iter_4.caffemodel w2.caffemodel
cp seed_iter_4.solverstate s.solverstate

# mpmd NAME "RANK 0'S OPTIONS" "RANK 1'S OPTIONS" ["RANK 2'S OPTIONS"]: one kiln train a rank on
# run.prototxt; RC is mpirun's exit code, TOOK its seconds; the output is in NAME.log.
mpmd() {
  local name=$1 start
  shift
  local -a apps=()
  local opts
  for opts in "$@"; do
    [ ${#apps[@]} -gt 0 ] && apps+=(:)
    # shellcheck disable=SC2206 # the options split at spaces, on purpose
    apps+=(-np 1 "$KILN" train --solver "$WORK/run.prototxt" $opts)
  done
  rm -f run_iter_*
  start=$(date +%s)
  timeout -k 5 60 mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 \
    "${FORWARD[@]}" "${apps[@]}" > "$name.log" 2>&1
  RC=$?
  TOOK=$(($(date +%s) - start))
  if has_sanitizer_report "$(cat "$name.log")"; then
    fail "$name: sanitizer report: $(grep -m 3 "Sanitizer\|runtime error" "$name.log")"
  fi
}

# refused NAME NP WANT "RANK 0'S OPTIONS" "RANK 1'S OPTIONS" ...: the job of NP ranks must end
# non-zero within 30 s (not by the timeout), every rank printing WANT after "kiln: rank R of NP:
# train: the NP workers were given different options: ", nothing trained, no snapshot.
refused() {
  local name=$1 np=$2 want=$3 r line
  shift 3
  mpmd "$name" "$@"
  if [ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] && [ "$TOOK" -lt 30 ]; then
    pass
  else
    fail "$name: exit $RC after $TOOK s (expected a refusal within 30 s): $(tail -n 5 "$name.log")"
  fi
  for r in $(seq 0 $((np - 1))); do
    line="kiln: rank $r of $np: train: the $np workers were given different options: $want"
    grep -qF -- "$line" "$name.log" && pass \
      || fail "$name: no '$line' in: $(grep 'kiln' "$name.log" | grep -v 'kiln info' | head -n 4)"
  done
  grep -qF "every worker must be given the same --snapshot, --weights, --sync, --deterministic, --no-overlap, --check, --comm-timeout and --debug-slow-rank (docs/distributed.md)" "$name.log" \
    && pass || fail "$name: the message does not list the options that must agree: $(grep -m 1 'different options' "$name.log")"
  ! grep -q '^iter [0-9]' "$name.log" && pass || fail "$name: it trained: $(grep -m 2 '^iter' "$name.log")"
  [ -z "$(ls run_iter_* 2>/dev/null)" ] && pass || fail "$name: wrote $(ls run_iter_*)"
}

# Rank 1 alone given the weights, or the solver state (the cases of the report).
refused weights 2 "--weights is 'w.caffemodel' on rank 1 but not given on rank 0;" \
  "" "--weights w.caffemodel"
refused snapshot 2 "--snapshot is 's.solverstate' on rank 1 but not given on rank 0;" \
  "" "--snapshot s.solverstate"
# Both given weights, other files.
refused weights_differ 2 "--weights is 'w2.caffemodel' on rank 1 but 'w.caffemodel' on rank 0;" \
  "--weights w.caffemodel" "--weights w2.caffemodel"
# Rank 0 alone given the state.
refused snapshot_rank0 2 "--snapshot is not given on rank 1 but 's.solverstate' on rank 0;" \
  "--snapshot s.solverstate" ""
# The sync settings, the watchdog, the testing aid and --check.
refused sync 2 "--sync is 'model:2:0' on rank 1 but not given on rank 0;" "" "--sync model:2"
refused sync_interval 2 "--sync is 'model:3:0' on rank 1 but 'model:2:0' on rank 0;" \
  "--sync model:2" "--sync model:3"
refused deterministic 2 "--deterministic is given on rank 1 but not given on rank 0;" \
  "" "--deterministic"
refused no_overlap 2 "--no-overlap is not given on rank 1 but given on rank 0;" "--no-overlap" ""
refused check 2 "--check is given on rank 1 but not given on rank 0;" "" "--check"
refused comm_timeout 2 "--comm-timeout is '60' on rank 1 but '300' on rank 0;" \
  "" "--comm-timeout 60"
refused slow_rank 2 "--debug-slow-rank is '1:5' on rank 1 but not given on rank 0;" \
  "" "--debug-slow-rank 1:5"
# Two options differ: the first is told in full, the other named.
refused two 2 "--weights is 'w.caffemodel' on rank 1 but not given on rank 0 (--deterministic differs too);" \
  "" "--weights w.caffemodel --deterministic"
# Three ranks: the one that differs is named.
refused third 3 "--weights is 'w.caffemodel' on rank 2 but not given on rank 0;" "" "" "--weights w.caffemodel"
refused two_ranks 3 "--weights is 'w.caffemodel' on rank 1 (and 1 more rank) but not given on rank 0;" \
  "" "--weights w.caffemodel" "--weights w.caffemodel"

# What may differ: threads and the metrics file (rank 0 writes it), and spellings of one setting.
mpmd allowed "--weights w.caffemodel --sync grad --threads 1 --metrics $WORK/m.jsonl" \
  "--weights w.caffemodel --sync gradient --comm-timeout 300 --threads 2"
[ "$RC" -eq 0 ] && pass || fail "allowed differences: exit $RC: $(tail -n 5 allowed.log)"
[ -f run_iter_4.caffemodel ] && pass || fail "allowed differences: no run_iter_4.caffemodel"
grep -q '"event":"done"' m.jsonl 2>/dev/null && pass || fail "allowed differences: no done event in m.jsonl"
! grep -q "different options" allowed.log && pass || fail "allowed differences refused: $(grep -m 1 'different options' allowed.log)"

finish
