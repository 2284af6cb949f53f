# Workers whose nets live on a device (KILN_DEVICE=hostsim): MPI moves host memory, so every
# collective over a net's buffers goes through a host copy and back (worker_sync.c). Two workers
# on hostsim must end on the same bits as two on the host, in each way the buffers move: the
# gradient sum in buckets during backward, in rank order (--deterministic), whole after backward
# (--no-overlap), the broadcast of rank 0's start, and model averaging (parameters, Adam's two
# histories, BatchNorm's running statistics). A copy left out faults on hostsim's walled memory
# or sums stale values, and the weights differ.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"
mpi_tiny_lmdb

tiny_bn_net 4 > bn.prototxt
solver() {  # solver PREFIX TYPE: 6 iterations of TYPE, a snapshot at the end
  printf 'net: "%s"\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\nmax_iter: 6\n' "$WORK/bn.prototxt"
  printf 'type: "%s"\ndisplay: 0\nrandom_seed: 3\nsnapshot_prefix: "%s"\n' "$2" "$1"
}
both() {  # both NAME TYPE [kiln train options]: the same run on the host and on hostsim
  local name=$1 type=$2
  shift 2
  # one snapshot prefix (a solver state names its weights file), in two folders
  mkdir -p "host_$name" "sim_$name"
  solver w "$type" > "host_$name/solver.prototxt"
  solver w "$type" > "sim_$name/solver.prototxt"
  (cd "host_$name" && mpi 2 "$KILN" train --solver solver.prototxt "$@" > ../"host_$name.log" 2>&1) \
    || { fail "$name: host run: $(tail -n 3 "host_$name.log")"; return; }
  (cd "sim_$name" && mpi 2 -x KILN_DEVICE=hostsim "$KILN" train --solver solver.prototxt "$@" \
    > ../"sim_$name.log" 2>&1) || { fail "$name: hostsim run: $(tail -n 3 "sim_$name.log")"; return; }
  grep -q "^memory on hostsim: " "sim_$name.log" && pass \
    || fail "$name: the hostsim run does not say its memory is on hostsim"
  mpi_same "host_$name/w_iter_6.caffemodel" "sim_$name/w_iter_6.caffemodel" "$name: weights"
  mpi_same "host_$name/w_iter_6.solverstate" "sim_$name/w_iter_6.solverstate" "$name: solver state"
}
both buckets SGD
both ordered SGD --deterministic
both whole SGD --no-overlap
both model Adam --sync model:2
# a negative control: the weights moved from their start (a run that summed nothing would still
# give equal files on both sides)
mkdir -p one
solver "$WORK/one/w" SGD > one/solver.prototxt
sed -i 's/^max_iter: 6/max_iter: 1/' one/solver.prototxt
"$KILN" train --solver one/solver.prototxt > one.log 2>&1 || fail "one iteration: $(tail -n 3 one.log)"
cmp -s one/w_iter_1.caffemodel host_buckets/w_iter_6.caffemodel && fail "the weights did not move" || pass
finish
