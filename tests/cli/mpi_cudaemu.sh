# Workers on the CUDA backend's kernels, emulated on hostsim (KILN_DEVICE=hostsim
# KILN_ENGINE=cuda): the way two ranks share one machine's only GPU. Two workers there with
# --deterministic end on the bits of one worker with iter_size 2 there (the kernels are
# deterministic, as on the host); gradient sums overlapped with backward, whole after it, and
# model averaging every K end where the same runs on the host do, to 1e-4 (other kernels: the
# last bits differ).
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"
mpi_tiny_lmdb

# BatchNorm's statistics are each worker's own batch's, unlike iter_size's passes: the exact
# comparison takes the plain net, the others the BatchNorm one (its statistics averaged)
tiny_net 4 > plain.prototxt
tiny_bn_net 4 > bn.prototxt
net=bn.prototxt
solver() {  # solver PREFIX TYPE ITER_SIZE: 6 iterations of TYPE, a snapshot at the end
  printf 'net: "%s"\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\nmax_iter: 6\n' "$WORK/$net"
  printf 'type: "%s"\ndisplay: 0\nrandom_seed: 3\nsnapshot_prefix: "%s"\niter_size: %s\n' "$2" "$1" "${3:-1}"
}
emu() { KILN_DEVICE=hostsim KILN_ENGINE=cuda "$@"; }
# 2 workers --deterministic = 1 worker x iter_size 2, both on the emulated GPU
mkdir -p two one
net=plain.prototxt solver w SGD > two/solver.prototxt
net=plain.prototxt solver w SGD 2 > one/solver.prototxt
(cd two && mpi 2 -x KILN_DEVICE=hostsim -x KILN_ENGINE=cuda "$KILN" train --solver solver.prototxt \
  --deterministic > ../two.log 2>&1) || fail "2 workers on cudaemu: $(tail -n 3 two.log)"
(cd one && emu "$KILN" train --solver solver.prototxt > ../one.log 2>&1) \
  || fail "1 worker x iter_size 2 on cudaemu: $(tail -n 3 one.log)"
mpi_same two/w_iter_6.caffemodel one/w_iter_6.caffemodel "2 workers = iter_size 2 on cudaemu"
near() {  # near NAME TYPE [kiln train options]: the same 2-worker run on the host and on cudaemu
  local name=$1 type=$2
  shift 2
  mkdir -p "host_$name" "emu_$name"
  solver w "$type" > "host_$name/solver.prototxt"
  solver w "$type" > "emu_$name/solver.prototxt"
  (cd "host_$name" && mpi 2 "$KILN" train --solver solver.prototxt "$@" > ../"host_$name.log" 2>&1) \
    || { fail "$name: host run: $(tail -n 3 "host_$name.log")"; return; }
  (cd "emu_$name" && mpi 2 -x KILN_DEVICE=hostsim -x KILN_ENGINE=cuda "$KILN" train \
    --solver solver.prototxt "$@" > ../"emu_$name.log" 2>&1) \
    || { fail "$name: cudaemu run: $(tail -n 3 "emu_$name.log")"; return; }
  "$KILN" compare-weights "host_$name/w_iter_6.caffemodel" "emu_$name/w_iter_6.caffemodel" \
    --rtol 1e-4 --atol 1e-6 > "cw_$name.txt" 2>&1 && pass \
    || fail "$name: cudaemu's weights are not the host's: $(head -n 3 "cw_$name.txt")"
}
near buckets SGD
near whole SGD --no-overlap
near model Adam --sync model:2
grep -q "^memory on hostsim: " emu_buckets.log && grep -q "^memory on hostsim: " two.log && pass \
  || fail "the cudaemu runs do not say their memory is on hostsim"
finish
