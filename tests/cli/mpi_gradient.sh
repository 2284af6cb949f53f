# Data-parallel training with GRADIENT sync under mpirun, on a tiny LMDB written from hand-made
# IDX files (Data -> Convolution -> ReLU -> InnerProduct -> SoftmaxWithLoss, momentum and weight
# decay, 20 iterations):
#   (a, b) 2 workers x batch b with --deterministic give the bits of 1 worker x batch b x iter_size 2;
#   (c)    the same for 4 workers against iter_size 4, with shuffle + last_batch KEEP, and on two
#          databases mixed by source_weight;
#   (d)    without --deterministic, 1 iteration is within 1e-5 relative of the reference;
#   (e)    a solver that differs between ranks, data that differs under the same path, or a rank
#          that cannot open its data, ends the job with a clear message and a non-zero exit
#          within seconds (no hang);
#   (f)    a 2-worker snapshot at 10 resumed on 2 workers ends bit-identical to the straight run
#          (with dropout too: every worker's generator is saved), and resumed on 1 worker with
#          iter_size 2 as well (the data cursor is global); a 1-worker snapshot resumed on 2 and
#          on 4 workers, bit-identical too; a 4-worker one on 2 workers x iter_size 2, within
#          rounding;
#   (g, h) MODEL and TIME sync (below);
#   (i, j) sums overlapped with backward, plain and ordered, with iter_size 1 and 2;
#   (k)    the same sums driven by a communication thread;
#   (l)    gradients summed where they lie in shared memory, copied, or both at once.
# On one host every sum goes through shared memory (src/parallel/comm_mpi_shm.c);
# mpi_gradient_no_shm.sh runs all of this again with KILN_COMM_SHM=0, through MPI.
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

# 64 records of 1x8x8 bytes (a fixed pseudo-random pattern), labels 0..3.
mpi_tiny_lmdb

net() { mpi_tiny_net "$@"; }  # net BATCH EXTRA_DATA_PARAM
net 4 "" > net.prototxt
net 6 "shuffle: true last_batch: KEEP" > shuffle_net.prototxt
solver() {  # solver NAME NET ITER_SIZE MAX_ITER [EXTRA]: writes NAME.prototxt, snapshots NAME_iter_*
  printf 'net: "%s"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\nweight_decay: 0.005\n' "$2"
  printf 'max_iter: %s\niter_size: %s\ndisplay: 0\nrandom_seed: 5\nsnapshot_prefix: "%s"\n%s' \
    "$4" "$3" "$WORK/$1" "${5:-}"
}
train1() {  # train1 NAME: one worker, no mpirun
  "$KILN" train --solver "$1.prototxt" 2>"$1.log" || fail "$1: one-worker run: $(tail -n 3 "$1.log")"
}
trainN() {  # trainN NP NAME [OPTIONS...]
  local np=$1 name=$2
  shift 2
  mpi "$np" "$KILN" train --solver "$name.prototxt" "$@" >"$name.log" 2>&1 \
    || fail "$name: $np-worker run: $(tail -n 5 "$name.log")"
}
same() {  # same A B WHAT: bit-identical .caffemodel files
  if [ ! -f "$1" ] || [ ! -f "$2" ]; then fail "$3: missing $1 or $2"; return; fi
  cmp -s "$1" "$2" && pass || fail "$3: $1 and $2 differ: $("$KILN" compare-weights "$1" "$2" | head -n 2)"
}

# (a, b) 2 workers with --deterministic = 1 worker with iter_size 2, bit for bit; the straight
# 2-worker run also snapshots at 10 for (f).
solver ref2 net.prototxt 2 20 > ref2.prototxt
solver w2 net.prototxt 1 20 "snapshot: 10
" > w2.prototxt
train1 ref2
trainN 2 w2 --deterministic --metrics w2.jsonl
same ref2_iter_20.caffemodel w2_iter_20.caffemodel "2 workers --deterministic vs iter_size 2"
grep -q "2 workers, gradient sync (deterministic: rank-order sum), global batch 8 = batch 4 x 2 workers x iter_size 1" w2.log \
  && pass || fail "no global batch line on rank 0: $(grep workers w2.log)"
[ "$(grep -c 'global batch' w2.log)" = 1 ] && pass || fail "the global batch line is not printed once"
grep -q '^worker 1 of 2: 20 iterations, [0-9]* samples/s computing' w2.log && pass || fail "no per-worker throughput line"
grep -q '"event":"worker".*"rank":1' w2.jsonl && pass || fail "no worker event for rank 1 in the metrics"
grep -q '"event":"snapshot","iter":10,"time_ms":[0-9.]*,"rank":0' w2.jsonl && pass \
  || fail "no rank 0 snapshot event: $(grep snapshot w2.jsonl)"
# Negative control: one worker with the small batch and no iter_size trains differently.
solver one net.prototxt 1 20 > one.prototxt
train1 one
cmp -s one_iter_20.caffemodel ref2_iter_20.caffemodel && fail "iter_size 2 changed nothing" || pass

# (c) 4 workers against iter_size 4; 2 workers on shuffled data with a short last batch (KEEP).
solver ref4 net.prototxt 4 20 > ref4.prototxt
solver w4 net.prototxt 1 20 "snapshot: 10
" > w4.prototxt
train1 ref4
trainN 4 w4 --deterministic
same ref4_iter_20.caffemodel w4_iter_20.caffemodel "4 workers --deterministic vs iter_size 4"
solver sref shuffle_net.prototxt 2 20 > sref.prototxt
solver sw shuffle_net.prototxt 1 20 "sync { mode: GRADIENT deterministic: true }
" > sw.prototxt
train1 sref
trainN 2 sw
same sref_iter_20.caffemodel sw_iter_20.caffemodel "shuffle + KEEP, 2 workers (deterministic in the solver file) vs iter_size 2"
# ... and on two databases mixed by weight (a second, smaller one of 24 other records).
{
  printf '\x00\x00\x08\x03\x00\x00\x00\x18\x00\x00\x00\x08\x00\x00\x00\x08'
  LC_ALL=C awk 'BEGIN { srand(8); for (i = 0; i < 1536; i++) printf "%c", int(rand() * 256) }'
} > img2.idx
{
  printf '\x00\x00\x08\x01\x00\x00\x00\x18'
  for i in $(seq 0 23); do printf "\\x0$(((i + 1) % 4))"; done
} > lab2.idx
"$KILN" convert idx img2.idx lab2.idx tiny2_lmdb >/dev/null || fail "convert tiny2_lmdb"
net 4 "source: \"$WORK/tiny2_lmdb\" source_weight: 0.6 source_weight: 0.4 shuffle: true" \
  > mix_net.prototxt
solver mref mix_net.prototxt 2 20 > mref.prototxt
solver mw mix_net.prototxt 1 20 > mw.prototxt
train1 mref
trainN 2 mw --deterministic
same mref_iter_20.caffemodel mw_iter_20.caffemodel "two sources mixed 0.6/0.4, 2 workers --deterministic vs iter_size 2"

# (d) the library's own reduction: within 1e-5 relative after one iteration.
for np in 2 4; do
  solver ref1_$np net.prototxt $np 1 > ref1_$np.prototxt
  solver nd_$np net.prototxt 1 1 > nd_$np.prototxt
  train1 ref1_$np
  trainN $np nd_$np --sync grad
  if "$KILN" compare-weights ref1_${np}_iter_1.caffemodel nd_${np}_iter_1.caffemodel --rtol 1e-5 --atol 1e-9 > cmp_$np.txt; then
    pass
  else
    fail "$np workers without --deterministic: $(cat cmp_$np.txt)"
  fi
  cmp -s ref1_${np}_iter_1.caffemodel one_iter_20.caffemodel && fail "compared the wrong files" || pass
done
# ... and the comparison itself can fail.
"$KILN" compare-weights ref2_iter_20.caffemodel one_iter_20.caffemodel --rtol 1e-5 >/dev/null \
  && fail "compare-weights accepted different weights" || pass
# On one host the sums go through shared memory, in rank order: without --deterministic too, 2
# workers then give the bits of iter_size 2. KILN_COMM_SHM=0 (mpi_gradient_no_shm.sh) keeps
# every sum in MPI.
if [ "${KILN_COMM_SHM:-1}" = 0 ]; then
  ! grep -q "sums go through shared memory" w2.log && pass || fail "KILN_COMM_SHM=0: shared memory used"
else
  grep -q "the 2 workers share this host: sums go through shared memory" w2.log && pass \
    || fail "no shared-memory sums on one host: $(grep kiln w2.log | head -n 3)"
  solver nd20 net.prototxt 1 20 > nd20.prototxt
  trainN 2 nd20
  same ref2_iter_20.caffemodel nd20_iter_20.caffemodel "shared-memory sums without --deterministic vs iter_size 2"
  # KILN_COMM_SHM=0 on one rank only turns it off on both (no rank left waiting in a setup the
  # other skipped).
  solver half net.prototxt 1 20 > half.prototxt
  export KILN
  mpi 2 bash -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && export KILN_COMM_SHM=0
    exec "$KILN" train --solver half.prototxt --deterministic' > half.log 2>&1 \
    || fail "KILN_COMM_SHM=0 on rank 1 only: $(tail -n 5 half.log)"
  ! grep -q "shared memory" half.log && pass || fail "KILN_COMM_SHM=0 on rank 1 only: shared memory used"
  same ref2_iter_20.caffemodel half_iter_20.caffemodel "KILN_COMM_SHM=0 on rank 1 only vs iter_size 2"
fi

# (e) ranks that disagree, or a rank that fails alone, end the job quickly with a clear message.
solver mm_0 net.prototxt 1 20 > mm_0.prototxt
sed 's/^base_lr: .*/base_lr: 0.06/' mm_0.prototxt > mm_1.prototxt
sed "s#$WORK/tiny_lmdb#$WORK/no_such_lmdb#" net.prototxt > missing_net.prototxt
cp mm_0.prototxt miss_0.prototxt
sed 's#^net: .*#net: "missing_net.prototxt"#' mm_0.prototxt > miss_1.prototxt
export KILN
for case in mm miss; do
  start=$(date +%s)
  mpi 2 bash -c "exec \"\$KILN\" train --solver ${case}_\${OMPI_COMM_WORLD_RANK}.prototxt" > $case.log 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && pass || fail "$case: exit $rc: $(tail -n 5 $case.log)"
  [ $took -lt 30 ] && pass || fail "$case: took $took s (a hang?)"
done
grep -q "workers disagree on the solver and train net: rank 1 differs from rank 0" mm.log && pass \
  || fail "mismatch message: $(grep kiln: mm.log)"
grep -q "rank 1 of 2: train: missing_net.prototxt: layer 'd' (Data): .*no_such_lmdb" miss.log && pass \
  || fail "missing data message: $(grep kiln: miss.log)"
[ ! -e "$WORK/mm_0_iter_20.caffemodel" ] && pass || fail "the mismatched run trained"
# Different data under the same path (each rank's $KILN_DATA holds its own copy): one changed
# byte in the last record is refused, naming the source; identical copies train.
mkdir -p same0 same1 diff1
for d in same0 same1; do cp -r tiny_lmdb $d/tiny_lmdb; done
{ head -c -1 img.idx; printf '\x01'; } > img_changed.idx
cmp -s img.idx img_changed.idx && fail "the changed image file is the same" || pass
"$KILN" convert idx img_changed.idx lab.idx diff1/tiny_lmdb >/dev/null || fail "convert changed data"
sed 's#source: "[^"]*"#source: "$KILN_DATA/tiny_lmdb"#' net.prototxt > cache_net.prototxt
solver dd cache_net.prototxt 1 4 > dd.prototxt
export WORK
datarun() {  # datarun NAME DIR_OF_RANK_1: rank 0 reads same0, rank 1 the given one
  mpi 2 bash -c "d=same0; [ \$OMPI_COMM_WORLD_RANK = 1 ] && d=$2
    KILN_DATA=\$WORK/\$d exec \"\$KILN\" train --solver dd.prototxt" > "$1.log" 2>&1
}
datarun dsame same1 && pass || fail "identical data in two places refused: $(grep kiln: dsame.log)"
start=$(date +%s)
datarun ddiff diff1 && fail "different data accepted" || pass
[ $(($(date +%s) - start)) -lt 30 ] && pass || fail "different data: took too long (a hang?)"
grep -q "workers disagree on the training data: rank 1 differs from rank 0 .*every worker must hold the same data under the same path: layer 'd' reads .*/tiny_lmdb (64 records" ddiff.log \
  && pass || fail "data mismatch message: $(grep kiln: ddiff.log)"

# (f) resume the 2-worker run from its snapshot at 10: on 2 workers, and on 1 with iter_size 2.
solver r2 net.prototxt 1 20 > r2.prototxt
trainN 2 r2 --deterministic --snapshot "$WORK/w2_iter_10.solverstate" --metrics r2.jsonl
same w2_iter_20.caffemodel r2_iter_20.caffemodel "2-worker resume at 10 vs the straight 2-worker run"
grep -q "resumed from .*w2_iter_10.solverstate at iteration 10" r2.log && pass \
  || fail "resume did not start at 10: $(grep kiln r2.log)"
solver r1 net.prototxt 2 20 > r1.prototxt
"$KILN" train --solver r1.prototxt --snapshot "$WORK/w2_iter_10.solverstate" 2>r1.log || fail "1-worker resume"
same ref2_iter_20.caffemodel r1_iter_20.caffemodel "2-worker snapshot resumed on 1 worker with iter_size 2"
cmp -s w2_iter_10.caffemodel w2_iter_20.caffemodel && fail "weights did not change after 10" || pass
# ... and the other way: one worker's snapshot (iter_size 2 or 4) resumed on 2 or 4 workers; and
# the 4-worker run's resumed on 2 workers with iter_size 2, whose passes add up in another order
# ((g0 + g1) + (g2 + g3) against ((g0 + g1) + g2) + g3), so equal within rounding.
for np in 2 4; do
  solver s$np net.prototxt $np 20 "snapshot: 10
" > s$np.prototxt
  train1 s$np
  solver g$np net.prototxt 1 20 > g$np.prototxt
  trainN $np g$np --deterministic --snapshot "$WORK/s${np}_iter_10.solverstate"
  same ref${np}_iter_20.caffemodel g${np}_iter_20.caffemodel "1-worker snapshot resumed on $np workers"
done
solver h2 net.prototxt 2 20 > h2.prototxt
trainN 2 h2 --deterministic --snapshot "$WORK/w4_iter_10.solverstate"
if "$KILN" compare-weights ref4_iter_20.caffemodel h2_iter_20.caffemodel --rtol 1e-4 --atol 1e-7 > cmp_h2.txt; then
  pass
else
  fail "4-worker snapshot resumed on 2 workers x iter_size 2: $(cat cmp_h2.txt)"
fi
cmp -s w4_iter_10.caffemodel ref4_iter_20.caffemodel && fail "4-worker weights did not change after 10" || pass
# Rank 0 reads the snapshot for everyone: when it cannot, the job ends with its message (rank 1
# learns it too, but rank 0's MPI_Abort may end it before it prints).
mpi 2 "$KILN" train --solver r2.prototxt --snapshot "$WORK/no_such.solverstate" > nosnap.log 2>&1 \
  && fail "a missing snapshot was accepted" || pass
grep -q "rank 0 of 2: resume: .*no_such.solverstate: cannot open" nosnap.log \
  && pass || fail "missing snapshot message: $(grep kiln: nosnap.log)"
# With dropout each worker draws from its own generator stream; the snapshot keeps all of them.
sed 's#^layer { name: "relu".*#&\nlayer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" dropout_param { dropout_ratio: 0.3 } }#' \
  net.prototxt > dropout_net.prototxt
grep -q Dropout dropout_net.prototxt && pass || fail "no dropout layer in the net"
solver dw dropout_net.prototxt 1 20 "snapshot: 10
" > dw.prototxt
solver dr dropout_net.prototxt 1 20 > dr.prototxt
trainN 2 dw --deterministic
trainN 2 dr --deterministic --snapshot "$WORK/dw_iter_10.solverstate"
same dw_iter_20.caffemodel dr_iter_20.caffemodel "2-worker resume with dropout"

# (g) MODEL: local steps, parameters and history averaged every K iterations.
#   K = 1 is GRADIENT up to rounding (the average of w - h_r is w minus the average of h_r);
#   K = 5 trains differently; its snapshot at 10 (a sync point) resumes bit-identical; a warm-up
#   covering the whole run is GRADIENT bit for bit; TIME with an interval longer than the run is
#   one round of 20 steps on each worker, weighted 20/40, which is MODEL with K = 20 exactly.
solver m1 net.prototxt 1 20 > m1.prototxt
trainN 2 m1 --deterministic --sync model:1
if "$KILN" compare-weights w2_iter_20.caffemodel m1_iter_20.caffemodel --rtol 1e-4 --atol 1e-6 > cmp_m1.txt; then
  pass
else
  fail "MODEL K=1 vs GRADIENT: $(cat cmp_m1.txt)"
fi
grep -q "2 workers, model sync every 1 iterations (deterministic" m1.log && pass || fail "MODEL line: $(grep workers m1.log)"
solver m5 net.prototxt 1 20 "snapshot: 10
sync { mode: MODEL interval_iters: 5 }
" > m5.prototxt
trainN 2 m5 --deterministic
cmp -s m5_iter_20.caffemodel w2_iter_20.caffemodel && fail "MODEL K=5 trained as GRADIENT" || pass
cp m5.prototxt m5r.prototxt
sed -i "s#$WORK/m5\"#$WORK/m5r\"#" m5r.prototxt
trainN 2 m5r --deterministic --snapshot "$WORK/m5_iter_10.solverstate"
same m5_iter_20.caffemodel m5r_iter_20.caffemodel "MODEL K=5 resumed at 10 vs straight"
solver mw net.prototxt 1 20 > mw.prototxt
trainN 2 mw --deterministic --sync model:5:20
same w2_iter_20.caffemodel mw_iter_20.caffemodel "MODEL with a 20-iteration warm-up vs GRADIENT"
solver m20 net.prototxt 1 20 > m20.prototxt
solver t20 net.prototxt 1 20 > t20.prototxt
trainN 2 m20 --deterministic --sync model:20
trainN 2 t20 --deterministic --sync time:1000
same m20_iter_20.caffemodel t20_iter_20.caffemodel "TIME, one round of 20 vs MODEL K=20"
cmp -s m20_iter_20.caffemodel m5_iter_20.caffemodel && fail "K=20 and K=5 trained alike" || pass

# (h) TIME with rank 1 slowed down: rounds of 0.2 s; rank 0 runs more iterations than rank 1,
#     the run ends at max_iter with finite weights, and rank 0's throughput counts its waits.
solver ts net.prototxt 1 200 "snapshot: 100
" > ts.prototxt
trainN 2 ts --sync time:0.2 --debug-slow-rank 1:10 --metrics ts.jsonl
[ -f ts_iter_200.caffemodel ] && pass || fail "TIME run did not end at 200: $(tail -n 5 ts.log)"
it0=$(sed -n 's/^worker 0 of 2: \([0-9]*\) iterations.*/\1/p' ts.log)
it1=$(sed -n 's/^worker 1 of 2: \([0-9]*\) iterations.*/\1/p' ts.log)
[ -n "$it0" ] && [ -n "$it1" ] && [ "$it0" -gt $((it1 * 2)) ] && pass \
  || fail "the fast worker did not run ahead: rank 0 $it0, rank 1 $it1 iterations: $(grep '^worker' ts.log)"
grep -q '"event":"worker".*"rank":1.*"wall_samples_per_s"' ts.jsonl && pass || fail "no wall throughput in the worker event"
grep -q 'snapshot .*ts_iter_' ts.log && pass || fail "no snapshot in the TIME run: $(grep snapshot ts.log)"
"$KILN" compare-weights ts_iter_200.caffemodel ts_iter_200.caffemodel >/dev/null && pass || fail "TIME weights unreadable"
# A slowed rank that the job does not have is an error, not a silent no-op.
expect_error "slow rank out of range" "--debug-slow-rank 1: the job has 1 worker (rank 0)" -- \
  "$KILN" train --solver one.prototxt --debug-slow-rank 1:5
mpi 2 "$KILN" train --solver one.prototxt --debug-slow-rank 2:5 > slow2.log 2>&1 \
  && fail "--debug-slow-rank 2 on 2 workers was accepted" || pass
grep -q "the job has 2 workers (ranks 0 to 1)" slow2.log && pass || fail "slow rank message: $(grep kiln: slow2.log)"

# (i) GRADIENT sums overlapped with backward: a net whose gradient spans several 256 KiB buckets
#     gives, on 2 workers, the bits of the sum after backward (--no-overlap), and is within 1e-5
#     of 1 worker with iter_size 2.
mpi_wide_net > wide_net.prototxt
solver wref wide_net.prototxt 2 5 > wref.prototxt
solver wov wide_net.prototxt 1 5 > wov.prototxt
solver wno wide_net.prototxt 1 5 > wno.prototxt
train1 wref
trainN 2 wov
trainN 2 wno --no-overlap
same wov_iter_5.caffemodel wno_iter_5.caffemodel "overlapped buckets vs one sum after backward"
"$KILN" compare-weights wref_iter_5.caffemodel wov_iter_5.caffemodel --rtol 1e-5 --atol 1e-9 > cmp_wov.txt \
  && pass || fail "overlapped buckets vs iter_size 2: $(cat cmp_wov.txt)"

# (j) The ordered sum overlapped too, on that net's several buckets: 3 workers (segments of
#     unequal length) with --deterministic give the bits of 1 worker with iter_size 3; with
#     iter_size 2 on 2 workers, where each bucket gets the first pass added as it goes out, the
#     overlapped ordered sum gives the bits of the one after backward.
solver wref3 wide_net.prototxt 3 5 > wref3.prototxt
solver wd3 wide_net.prototxt 1 5 > wd3.prototxt
solver wi2 wide_net.prototxt 2 5 > wi2.prototxt
solver wi2no wide_net.prototxt 2 5 > wi2no.prototxt
train1 wref3
trainN 3 wd3 --deterministic
same wref3_iter_5.caffemodel wd3_iter_5.caffemodel "3 workers, overlapped ordered sum vs iter_size 3"
trainN 2 wi2 --deterministic
trainN 2 wi2no --deterministic --no-overlap
same wi2_iter_5.caffemodel wi2no_iter_5.caffemodel "iter_size 2 on 2 workers: overlapped ordered sum vs after backward"
cmp -s wi2_iter_5.caffemodel wov_iter_5.caffemodel && fail "iter_size 2 changed nothing" || pass

# (k) The communication thread (KILN_COMM_THREAD=POLL_US) in place of polling between layers:
#     the same bits, plain on 2 workers and ordered on 3.
solver wth wide_net.prototxt 1 5 > wth.prototxt
solver wth3 wide_net.prototxt 1 5 > wth3.prototxt
KILN_COMM_THREAD=50 trainN 2 wth
grep -q "a communication thread tests the overlapped sums every 50 us" wth.log && pass \
  || fail "no communication thread: $(grep kiln wth.log | head -n 3)"
same wno_iter_5.caffemodel wth_iter_5.caffemodel "communication thread vs one sum after backward"
KILN_COMM_THREAD=50 trainN 3 wth3 --deterministic
same wref3_iter_5.caffemodel wth3_iter_5.caffemodel "communication thread, 3 workers ordered vs iter_size 3"
# A value that is not an interval is said, and polling between layers goes on.
solver wbad wide_net.prototxt 1 5 > wbad.prototxt
KILN_COMM_THREAD=5ms trainN 2 wbad
grep -q "KILN_COMM_THREAD='5ms' is not a polling interval in microseconds (1 to 100000)" wbad.log \
  && ! grep -q "a communication thread tests" wbad.log && pass || fail "bad KILN_COMM_THREAD: $(grep kiln wbad.log | head -n 3)"
same wno_iter_5.caffemodel wbad_iter_5.caffemodel "polling after a bad KILN_COMM_THREAD"

# (l) On one host the train net's gradients lie in shared memory (each rank's own segment) and
#     are summed there, with no copy in or out; KILN_COMM_SHM=copy keeps them in the process
#     and copies them through. Either way, and with rank 0 copying while ranks 1 and 2 sum in
#     place, 3 workers give the bits of iter_size 3; so do 2 workers summing in place after
#     backward (--no-overlap, (i): the allreduce of the whole gradient).
if [ "${KILN_COMM_SHM:-1}" = 0 ]; then
  ! grep -q "lie in shared memory" wd3.log && pass || fail "KILN_COMM_SHM=0: gradients in shared memory"
else
  grep -q "the gradients (607904 floats) lie in shared memory: summed in place" wd3.log && pass \
    || fail "gradients not in shared memory: $(grep kiln wd3.log | head -n 4)"
  grep -q "lie in shared memory" wno.log && pass || fail "--no-overlap: gradients not in shared memory"
  same wref_iter_5.caffemodel wno_iter_5.caffemodel "2 workers summing in place after backward vs iter_size 2"
  solver wcp3 wide_net.prototxt 1 5 > wcp3.prototxt
  KILN_COMM_SHM=copy trainN 3 wcp3 --deterministic
  grep -q "sums go through shared memory" wcp3.log && ! grep -q "lie in shared memory" wcp3.log \
    && pass || fail "KILN_COMM_SHM=copy: $(grep kiln wcp3.log | head -n 4)"
  same wref3_iter_5.caffemodel wcp3_iter_5.caffemodel "3 workers copying through shared memory vs iter_size 3"
  # Rank 0 says where its gradients are: with KILN_COMM_SHM=copy on rank 0 alone, it says
  # nothing, while ranks 1 and 2 (no such variable) sum in place.
  solver wmix3 wide_net.prototxt 1 5 > wmix3.prototxt
  export KILN
  mpi 3 bash -c '[ "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" = 0 ] && export KILN_COMM_SHM=copy
    exec "$KILN" train --solver wmix3.prototxt --deterministic' > wmix3.log 2>&1 \
    || fail "KILN_COMM_SHM=copy on rank 0 only: $(tail -n 5 wmix3.log)"
  grep -q "sums go through shared memory" wmix3.log && ! grep -q "lie in shared memory" wmix3.log \
    && pass || fail "KILN_COMM_SHM=copy on rank 0 only: $(grep kiln wmix3.log | head -n 4)"
  same wref3_iter_5.caffemodel wmix3_iter_5.caffemodel "rank 0 copying, ranks 1 and 2 in place vs iter_size 3"
fi

# Bad sync settings are refused with the field named.
solver bad net.prototxt 1 20 "sync { mode: MODEL }
" > bad.prototxt
mpi 2 "$KILN" train --solver bad.prototxt > bad.log 2>&1 && fail "MODEL without interval accepted" || pass
grep -q "sync mode MODEL needs interval_iters >= 1" bad.log && pass || fail "MODEL message: $(grep kiln: bad.log)"
"$KILN" train --solver m1.prototxt --sync model:5:x > badw.log 2>&1 && fail "bad warm-up accepted" || pass
grep -q "warm-up 'x' is not a number of iterations" badw.log && pass || fail "warm-up message: $(cat badw.log)"
finish
