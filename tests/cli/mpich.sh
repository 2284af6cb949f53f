# MPICH, Debian's other MPI ("MPICH must work too"): kiln built against MPICH (`make test` builds
# build-mpich/kiln with mpicc.mpich; KILN_MPICH may name another) under MPICH's own launcher
# (mpiexec.mpich, Hydra), on the tiny LMDB and nets of mpi_gradient.sh:
#   (a) 2 workers with --deterministic give the bits of 1 worker with iter_size 2, and 4 workers
#       those of iter_size 4; a resume from the 2-worker snapshot at 10 ends on the same bits;
#   (b) the overlapped sum over several buckets gives the bits of the sum after backward
#       (--no-overlap), and so does the communication thread (MPI_THREAD_SERIALIZED);
#   (c) the same runs under Open MPI (the main build, mpirun) give the same bits: GRADIENT and
#       MODEL K=5 with --deterministic; those summed through shared memory (one host), and
#       MPICH's own transport (KILN_COMM_SHM=0) gives the bits of iter_size 4 too;
#   (d) SIGSTOP of rank 1 of 3 with --comm-timeout 5: kiln's watchdog ends the job, naming rank 1
#       with its pid and host;
#   (f) rank 1 of 2 stopped before MPI_Init (KILN_FAULT=stop:start:1), --comm-timeout 5: the other
#       rank's start-up watch ends the job, naming rank 1;
#   (e) SIGKILL of rank 1 of 2: Hydra ends the job with a non-zero exit within 30 s. Its message
#       names the dead process by id ("PID N RUNNING AT host"), and kiln's start-up table of the
#       ranks' hosts and processes reads that id as rank 1: together the log names the rank.
# Skips (exit 77, a CTest skip) when there is no MPICH build or no mpiexec.mpich; otherwise a failure fails.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"
KM=${KILN_MPICH:-$SRC/build-mpich/kiln}
if [ ! -x "$KM" ] || ! command -v mpiexec.mpich >/dev/null 2>&1; then
  echo "SKIP: no kiln built against MPICH at $KM, or no mpiexec.mpich (make test builds it after scripts/install-deps)"
  exit 77
fi
ldd "$KM" | grep -q libmpich && pass || fail "$KM is not linked against MPICH: $(ldd "$KM" | grep -i mpi)"

mpich() {  # mpich NP ARGS...: MPICH's launcher, one OpenMP thread per rank, killed after 60 s
  local np=$1
  shift
  timeout -k 5 60 mpiexec.mpich -np "$np" -genv OMP_NUM_THREADS 1 "$@"
}
solver() {  # solver NAME NET ITER_SIZE MAX_ITER [EXTRA]: writes NAME.prototxt
  {
    printf 'net: "%s"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\nweight_decay: 0.005\n' "$2"
    printf 'max_iter: %s\niter_size: %s\ndisplay: 0\nrandom_seed: 5\nsnapshot_prefix: "%s"\n%s' \
      "$4" "$3" "$WORK/$1" "${5:-}"
  } > "$1.prototxt"
}
run() {  # run NAME LAUNCH...: the command's output in NAME.log; a failure is reported
  local name=$1
  shift
  "$@" > "$name.log" 2>&1 || fail "$name: exit $?: $(grep -v '^iter' "$name.log" | tail -n 4)"
}
same() {  # same A B WHAT: bit-identical .caffemodel files
  if [ ! -f "$1" ] || [ ! -f "$2" ]; then fail "$3: missing $1 or $2"; return; fi
  cmp -s "$1" "$2" && pass || fail "$3: $1 and $2 differ: $("$KILN" compare-weights "$1" "$2" | head -n 2)"
}

mpi_tiny_lmdb
mpi_tiny_net 4 > net.prototxt
mpi_wide_net > wide_net.prototxt

# (a) exactness, and a resume
solver ref2 net.prototxt 2 20
solver ref4 net.prototxt 4 20
solver m2 net.prototxt 1 20 "snapshot: 10
"
solver m4 net.prototxt 1 20
solver r2 net.prototxt 1 20
run ref2 "$KILN" train --solver ref2.prototxt
run ref4 "$KILN" train --solver ref4.prototxt
run m2 mpich 2 "$KM" train --solver m2.prototxt --deterministic
grep -q "2 workers, gradient sync (deterministic: rank-order sum), global batch 8" m2.log && pass \
  || fail "no 2-worker line under MPICH: $(grep -i workers m2.log)"
same ref2_iter_20.caffemodel m2_iter_20.caffemodel "MPICH, 2 workers --deterministic vs iter_size 2"
run m4 mpich 4 "$KM" train --solver m4.prototxt --deterministic
same ref4_iter_20.caffemodel m4_iter_20.caffemodel "MPICH, 4 workers --deterministic vs iter_size 4"
run r2 mpich 2 "$KM" train --solver r2.prototxt --deterministic --snapshot "$WORK/m2_iter_10.solverstate"
same m2_iter_20.caffemodel r2_iter_20.caffemodel "MPICH, resumed at 10 vs the straight run"

# (b) overlapped buckets, polled and on the communication thread, against the sum after backward
solver wov wide_net.prototxt 1 5
solver wno wide_net.prototxt 1 5
solver wth wide_net.prototxt 1 5
run wov mpich 2 "$KM" train --solver wov.prototxt
run wno mpich 2 "$KM" train --solver wno.prototxt --no-overlap
same wov_iter_5.caffemodel wno_iter_5.caffemodel "MPICH, overlapped buckets vs one sum after backward"
run wth mpich 2 -genv KILN_COMM_THREAD 50 "$KM" train --solver wth.prototxt
grep -q "a communication thread tests the overlapped sums every 50 us" wth.log && pass \
  || fail "no communication thread under MPICH: $(grep kiln wth.log | head -n 3)"
same wno_iter_5.caffemodel wth_iter_5.caffemodel "MPICH, communication thread vs one sum after backward"

# (c) the same bits under Open MPI
solver o2 net.prototxt 1 20
solver mm net.prototxt 1 20
solver om net.prototxt 1 20
ompi() { timeout -k 5 60 mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 "${FORWARD[@]}" "$@"; }
run o2 ompi "$KILN" train --solver o2.prototxt --deterministic
same m2_iter_20.caffemodel o2_iter_20.caffemodel "GRADIENT --deterministic, MPICH vs Open MPI"
run mm mpich 2 "$KM" train --solver mm.prototxt --deterministic --sync model:5
run om ompi "$KILN" train --solver om.prototxt --deterministic --sync model:5
same mm_iter_20.caffemodel om_iter_20.caffemodel "MODEL K=5 --deterministic, MPICH vs Open MPI"
cmp -s mm_iter_20.caffemodel m2_iter_20.caffemodel && fail "MODEL K=5 trained as GRADIENT" || pass
# ... where both summed through shared memory (one host); MPICH's own transport with every sum in
# MPI (KILN_COMM_SHM=0): the ordered sum on 4 workers, and overlapped buckets within rounding.
grep -q "sums go through shared memory" m2.log && pass || fail "no shared-memory sums under MPICH: $(grep kiln m2.log | head -n 3)"
solver n4 net.prototxt 1 20
solver nov wide_net.prototxt 1 5
run n4 mpich 4 -genv KILN_COMM_SHM 0 "$KM" train --solver n4.prototxt --deterministic
grep -q "shared memory" n4.log && fail "KILN_COMM_SHM=0 under MPICH: shared memory used" || pass
same ref4_iter_20.caffemodel n4_iter_20.caffemodel "MPICH through MPI, 4 workers --deterministic vs iter_size 4"
run nov mpich 2 -genv KILN_COMM_SHM 0 "$KM" train --solver nov.prototxt
"$KILN" compare-weights wno_iter_5.caffemodel nov_iter_5.caffemodel --rtol 1e-5 --atol 1e-9 > cmp_nov.txt \
  && pass || fail "MPICH through MPI, overlapped buckets vs shared memory: $(cat cmp_nov.txt)"

# (d, e) a stopped and a killed worker (VICTIM: the signalled process id)
printf 'net: "%s/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1000000\ndisplay: 50\nrandom_seed: 5\nsnapshot_after_train: false\n' \
  "$WORK" > long.prototxt
signal_case() {  # signal_case NAME NP RANK SIGNAL [OPTIONS...]: sets RC and TOOK (s, signal to exit)
  local name=$1 np=$2 victim=$3 sig=$4 pid
  shift 4
  mpich "$np" "$KM" train --solver "$WORK/long.prototxt" "$@" > "$name.log" 2>&1 &
  local root=$!
  pid=$(mpi_await_rank "$root" "$victim" "$name.log" PMI_RANK)
  if [ -z "$pid" ]; then
    fail "$name: the $np workers did not start training: $(tail -n 3 "$name.log")"
    kill -KILL "$root" 2>/dev/null
    wait "$root"
    RC=0 TOOK=0
    return
  fi
  VICTIM=$pid
  local t0=$(date +%s.%N)
  kill "-$sig" "$pid"
  wait "$root"
  RC=$?
  TOOK=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  kill -KILL "$pid" 2>/dev/null  # a stopped rank left behind
}
signal_case stop 3 1 STOP --comm-timeout 5
echo "MPICH, SIGSTOP of rank 1 of 3: exit $RC after $TOOK s"
[ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] && pass || fail "stop: exit $RC: $(tail -n 4 stop.log)"
awk -v t="$TOOK" 'BEGIN { exit !(t >= 5 && t < 30) }' && pass || fail "stop: ended after $TOOK s (limit 5 s)"
grep -q "kiln: rank [02] of 3: .*waited [0-9.]* s for the other workers, past the limit of 5 s (--comm-timeout): rank 1 (pid $VICTIM on [^)]*) did not answer" stop.log \
  && pass || fail "stop: the watchdog did not name rank 1: $(grep kiln: stop.log | head -n 2)"
signal_case kill 2 1 KILL
echo "MPICH, SIGKILL of rank 1 of 2: exit $RC after $TOOK s"
[ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] && pass || fail "kill: exit $RC: $(tail -n 4 kill.log)"
awk -v t="$TOOK" 'BEGIN { exit !(t < 30) }' && pass || fail "kill: ended after $TOOK s"
grep -q "BAD TERMINATION" kill.log && pass || fail "kill: no word from Hydra: $(tail -n 4 kill.log)"
dead=$(sed -n 's/^= *PID \([0-9]*\) RUNNING AT .*/\1/p' kill.log | head -n 1)
[ -n "$dead" ] && grep -q "^kiln info: host [^:]*: .*rank 1 (pid $dead)" kill.log && [ "$dead" = "$VICTIM" ] \
  && pass || fail "kill: Hydra's PID '$dead' (killed: $VICTIM) is not rank 1 in kiln's table: $(grep -E '^kiln info: host|PID' kill.log)"
# (f) stopped before MPI is up: Hydra's PMI barrier in MPI_Init has no limit of its own
t0=$(date +%s.%N)
mpich 2 -genv KILN_FAULT stop:start:1 "$KM" train --solver "$WORK/long.prototxt" --comm-timeout 5 > start.log 2>&1
RC=$?
TOOK=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "MPICH, rank 1 of 2 stopped before MPI_Init: exit $RC after $TOOK s"
[ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] && pass || fail "start: exit $RC: $(tail -n 4 start.log)"
awk -v t="$TOOK" 'BEGIN { exit !(t >= 5 && t < 30) }' && pass || fail "start: ended after $TOOK s (limit 5 s)"
grep -q "kiln: rank 0 of 2 (pid [0-9]* on [^)]*): MPI start-up (MPI_Init) waited [0-9.]* s for the other workers, past the limit of 5 s (--comm-timeout): rank 1 did not join it" start.log \
  && pass || fail "start: rank 1 not named: $(grep kiln: start.log | head -n 2)"
finish
