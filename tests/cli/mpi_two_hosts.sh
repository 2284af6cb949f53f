# Data-parallel training across two "hosts" on one machine: two network namespaces joined by a
# veth pair (10.213.7.1/24 and .2/24, each with its own host name), Open MPI told to use TCP only
# (pml ob1, btl self,tcp, on the veth subnet) and to start its daemon on the second host with
# tests/support/netns-agent.sh (`ip netns exec`) instead of ssh. mpirun itself runs in the first
# namespace. The data and the snapshots are in $WORK, seen by both (a shared file system), except
# in (d).
#   (a) the ranks run in different network namespaces, with the addresses and names of their
#       hosts, and kiln's start-up table gives each rank on its own host;
#   (b) 2 workers, one per host, with --deterministic: 20 iterations give the bits of 1 worker
#       with iter_size 2; the training ranks themselves ran in the two namespaces, the TCP BTL
#       connected them across the veth, and the gradients went over it (its byte counters);
#   (c) MODEL sync (--sync model:5) across the hosts gives the bits of the same run on one host;
#   (d) without a shared file system (a directory only the first host sees), rank 0's snapshots
#       resume on both hosts bit for bit, and --weights works;
#   (e) shared memory alone cannot join two hosts: a clear error, no hang.
# Skips (exit 77, a CTest skip) when not root, without `ip netns` (no CAP_SYS_ADMIN, e.g. in a container),
# without mpirun, or when kiln was built without MPI. Otherwise a failure fails.
# The namespaces are removed on every exit path (a trap); every mpirun runs under a timeout. The
# hosts and mpirun's options are tests/support/netns-hosts.bash's, which bench/mpi shares.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"
# The hosts, the agent and mpirun's options: tests/support/netns-hosts.bash.
source "$SRC/tests/support/netns-hosts.bash"
NET=$NETNS_NET
IP1=$NETNS_IP1
IP2=$NETNS_IP2
IF=$NETNS_IF
cleanup() {
  netns_hosts_down
  rm -rf "$WORK"
}
trap cleanup EXIT
# A signal ends the test at once (the runs below are waited for in the background, so that the
# trap does not wait for them), through cleanup.
trap 'exit 1' INT TERM HUP
if ! netns_hosts_up "$WORK"; then
  if [ "$NETNS_SKIP" = 1 ]; then
    echo "SKIP: $NETNS_ERR"
    exit 77
  fi
  fail "$NETNS_ERR"
  finish
  exit 1
fi

# on_hosts [MPIRUN OPTIONS...] COMMAND...: mpirun in the first namespace (under the name
# kiln-host1, as the agent names the second), one rank per host, TCP only, on the veth subnet.
on_hosts() { netns_on_hosts -x OMP_NUM_THREADS "${FORWARD[@]}" "$@"; }
counters() { netns_counters; }

# (a) where the ranks run. Each prints its rank, host name, network namespace and address.
on_hosts bash -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(readlink /proc/self/ns/net) $(ip -o -4 addr show dev '$IF' | awk "{print \$4}")"' \
  > where.log 2>&1 || fail "a shell on each host: exit $?: $(tail -n 5 where.log)"
r0=$(grep '^0 ' where.log)
r1=$(grep '^1 ' where.log)
[ "$r0" != "${r0#0 kiln-host1 net:}" ] && [ "${r0##* }" = "$IP1/24" ] && pass \
  || fail "rank 0 is not on kiln-host1 ($IP1): $(cat where.log)"
[ "$r1" != "${r1#1 kiln-host2 net:}" ] && [ "${r1##* }" = "$IP2/24" ] && pass \
  || fail "rank 1 is not on kiln-host2 ($IP2): $(cat where.log)"
ns0=$(echo "$r0" | awk '{print $3}')
ns1=$(echo "$r1" | awk '{print $3}')
[ -n "$ns0" ] && [ "$ns0" != "$ns1" ] && [ "$ns0" != "$(readlink /proc/self/ns/net)" ] && pass \
  || fail "the ranks share a network namespace: $(cat where.log)"

solver() {  # solver NAME ITER_SIZE [EXTRA]: 20 iterations, snapshots NAME_iter_20
  printf 'net: "net.prototxt"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\nweight_decay: 0.005\n'
  printf 'max_iter: 20\niter_size: %s\ndisplay: 0\nrandom_seed: 5\nsnapshot_prefix: "%s"\n%s' \
    "$2" "$WORK/$1" "${3:-}"
}

# The fixture of mpi_gradient.sh: 64 records of 1x8x8 bytes, labels 0..3, and a small conv net.
mpi_tiny_lmdb
mpi_tiny_net 4 > net.prototxt
# 40 + 580 parameters: 2480 bytes of gradient each way per iteration in GRADIENT mode.
PARAM_BYTES=2480
same() {  # same A B WHAT: bit-identical .caffemodel files
  if [ ! -f "$1" ] || [ ! -f "$2" ]; then fail "$3: missing $1 or $2"; return; fi
  cmp -s "$1" "$2" && pass || fail "$3: $1 and $2 differ: $("$KILN" compare-weights "$1" "$2" | head -n 2)"
}

# (b) GRADIENT: 2 workers on two hosts = 1 worker with iter_size 2. Each training rank records
# its namespace; the TCP BTL logs its connection; the veth counts the bytes.
cat > rank.sh <<'RANK'
readlink /proc/self/ns/net > "ns.$OMPI_COMM_WORLD_RANK"
hostname >> "ns.$OMPI_COMM_WORLD_RANK"
exec "$@"
RANK
solver ref2 2 > ref2.prototxt
solver w2 1 > w2.prototxt
"$KILN" train --solver ref2.prototxt 2>ref2.log || fail "one-worker run: $(tail -n 3 ref2.log)"
read -r rx0 tx0 <<< "$(counters)"
start=$(date +%s%N)
on_hosts --mca btl_base_verbose 100 bash rank.sh "$KILN" train --solver w2.prototxt --deterministic > w2.log 2>&1 \
  || fail "2 workers on two hosts: exit $?: $(grep -v 'btl' w2.log | tail -n 5)"
took=$((($(date +%s%N) - start) / 1000000))
read -r rx1 tx1 <<< "$(counters)"
echo "2 workers on two hosts, 20 iterations: $took ms; veth of kiln-host2: $((rx1 - rx0)) bytes in, $((tx1 - tx0)) out"
same ref2_iter_20.caffemodel w2_iter_20.caffemodel "2 workers on two hosts --deterministic vs iter_size 2"
grep -q "2 workers, gradient sync (deterministic: rank-order sum), global batch 8 = batch 4 x 2 workers x iter_size 1" w2.log \
  && pass || fail "no global batch line on rank 0: $(grep workers w2.log)"
grep -q '^worker 1 of 2: 20 iterations' w2.log && pass || fail "no throughput line for worker 1: $(grep '^worker' w2.log)"
[ -f ns.0 ] && [ -f ns.1 ] && [ "$(head -n 1 ns.0)" = "$ns0" ] && [ "$(head -n 1 ns.1)" = "$ns1" ] \
  && [ "$(sed -n 2p ns.0)" = kiln-host1 ] && [ "$(sed -n 2p ns.1)" = kiln-host2 ] && pass \
  || fail "the training ranks did not run on the two hosts: rank 0 $(cat ns.0 2>/dev/null), rank 1 $(cat ns.1 2>/dev/null)"
grep -q '^kiln info: host kiln-host1: rank 0 (pid [0-9]*)$' w2.log \
  && grep -q '^kiln info: host kiln-host2: rank 1 (pid [0-9]*)$' w2.log && pass \
  || fail "kiln's table of the ranks' hosts: $(grep '^kiln info: host' w2.log)"
# Only TCP (the ob1 PML with the self and tcp BTLs): the ranks connected across the veth (one
# side connects, whichever sends first: both directions were seen), and each sends to the other
# with the tcp BTL.
{ grep -q "\[kiln-host2:[0-9]*\] btl:tcp: connect() to $IP1:[0-9]* completed" w2.log \
    || grep -q "\[kiln-host1:[0-9]*\] btl:tcp: connect() to $IP2:[0-9]* completed" w2.log; } && pass \
  || fail "no TCP connection between kiln-host1 ($IP1) and kiln-host2 ($IP2): $(grep -i 'tcp' w2.log | tail -n 8)"
grep -q "\[kiln-host2:[0-9]*\] mca: bml: Using tcp btl for send to \[\[[0-9]*,1\],0\] on node kiln-host1" w2.log \
  && grep -q "\[kiln-host1:[0-9]*\] mca: bml: Using tcp btl for send to \[\[[0-9]*,1\],1\]" w2.log && pass \
  || fail "the ranks do not send with the tcp BTL: $(grep 'bml' w2.log)"
# Rank 1 sends its gradient to rank 0 and receives the sum, 20 times: at least that many bytes
# crossed the veth in each direction.
[ $((rx1 - rx0)) -ge $((20 * PARAM_BYTES)) ] && [ $((tx1 - tx0)) -ge $((20 * PARAM_BYTES)) ] && pass \
  || fail "too little traffic on the veth: $((rx1 - rx0)) bytes in, $((tx1 - tx0)) out, expected >= $((20 * PARAM_BYTES)) each"

# (c) MODEL sync every 5 iterations across the hosts: the bits of the same run on one host.
solver m5 1 > m5.prototxt
solver m5l 1 > m5l.prototxt
on_hosts "$KILN" train --solver m5.prototxt --deterministic --sync model:5 > m5.log 2>&1 \
  || fail "MODEL on two hosts: exit $?: $(tail -n 5 m5.log)"
grep -q "2 workers, model sync every 5 iterations" m5.log && pass || fail "MODEL line: $(grep workers m5.log)"
timeout -k 5 120 mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS "${FORWARD[@]}" \
  "$KILN" train --solver m5l.prototxt --deterministic --sync model:5 > m5l.log 2>&1 &
wait $! || fail "MODEL on one host: exit $?: $(tail -n 5 m5l.log)"
same m5l_iter_20.caffemodel m5_iter_20.caffemodel "MODEL K=5 on two hosts vs on one host"
cmp -s m5_iter_20.caffemodel w2_iter_20.caffemodel && fail "MODEL K=5 trained as GRADIENT" || pass

# (d) Hosts without a shared file system: $WORK/host1 is seen by kiln-host1 alone (kiln-host2
#     sees an empty tmpfs there). Rank 0 writes the snapshots into it, and a resume from the one
#     at 10 on both hosts (rank 0 reads it and sends it) ends with the bits of the straight run;
#     --weights from there also needs the file on rank 0's host only. Rank 1 writes nothing
#     there: after its training its view of host1/ is still empty (snapshots and the metrics
#     file are rank 0's alone).
mkdir host1
touch host1/marker
export KILN_NETNS_LOCAL_DIR=$WORK/host1
on_hosts bash -c 'echo "$OMPI_COMM_WORLD_RANK $(ls -A "$KILN_NETNS_LOCAL_DIR" | wc -l)"' > local.log 2>&1 \
  || fail "a shell on each host with a local directory: $(tail -n 3 local.log)"
grep -q '^0 1$' local.log && grep -q '^1 0$' local.log && pass \
  || fail "host1/ is not local to kiln-host1: $(cat local.log)"
solver ls 1 "snapshot: 10
" | sed "s#snapshot_prefix: .*#snapshot_prefix: \"$WORK/host1/ls\"#" > ls.prototxt
# each rank lists its view of host1/ once it has trained (the first word: the rank)
on_hosts bash -c '"$@"; rc=$?; echo "$OMPI_COMM_WORLD_RANK" $(ls -A "$KILN_NETNS_LOCAL_DIR") \
  > "'"$WORK"'/seen.$OMPI_COMM_WORLD_RANK"; exit $rc' _ \
  "$KILN" train --solver ls.prototxt --deterministic --metrics "$WORK/host1/ls.jsonl" > ls.log 2>&1 \
  || fail "2 workers, snapshots local to rank 0: exit $?: $(tail -n 5 ls.log)"
[ "$(cat seen.1 2>/dev/null)" = 1 ] && grep -q "^0 .*ls_iter_10.caffemodel .*ls_iter_20.solverstate" seen.0 \
  && grep -q "^0 .*ls.jsonl" seen.0 && pass \
  || fail "only rank 0 writes snapshots and metrics: rank 0 saw $(cat seen.0 2>/dev/null), rank 1 $(cat seen.1 2>/dev/null)"
same ref2_iter_20.caffemodel host1/ls_iter_20.caffemodel "2 workers on two hosts, snapshots on host 1 only"
mv host1/ls_iter_20.caffemodel straight_20.caffemodel
on_hosts "$KILN" train --solver ls.prototxt --deterministic \
  --snapshot "$WORK/host1/ls_iter_10.solverstate" > lsr.log 2>&1 \
  || fail "resume from a snapshot on host 1 only: exit $?: $(grep kiln: lsr.log | tail -n 3)"
same straight_20.caffemodel host1/ls_iter_20.caffemodel "resumed on two hosts from rank 0's snapshot vs the straight run"
on_hosts "$KILN" train --solver ls.prototxt --weights "$WORK/host1/ls_iter_10.caffemodel" > lsw.log 2>&1 \
  && pass || fail "--weights on host 1 only: exit $?: $(grep kiln: lsw.log | tail -n 3)"
unset KILN_NETNS_LOCAL_DIR

# (e) Shared memory only (no TCP) cannot join two hosts: the ranks fail while setting up their
#     communicator, and the job must end with that error instead of hanging in MPI_Finalize.
start=$(date +%s)
BTL=self,vader on_hosts "$KILN" train --solver m5.prototxt > nobtl.log 2>&1
rc=$?
took=$(($(date +%s) - start))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ $took -lt 60 ] && pass \
  || fail "no usable BTL: exit $rc after $took s: $(tail -n 5 nobtl.log)"
grep -q "kiln: rank [01] of 2: starting MPI: " nobtl.log && pass || fail "no setup error named: $(grep -i kiln nobtl.log | head -n 3)"
finish
