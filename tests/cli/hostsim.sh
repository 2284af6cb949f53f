# The host behind a device's walls (KILN_DEVICE=hostsim, include/kiln/device.h): a net's memory
# is then mappings that fault when touched outside its backend's kernels and the device table's
# copies, so a missing copy or a host read of device memory ends the run. LeNet trains 50
# iterations there, test passes, a snapshot half-way and a resume from it included, to the same
# bits as on the host: the weights of both runs are byte for byte the same file, and so are the
# losses and test figures of their metrics. kiln time and kiln test run the zoo's CNN nets there
# too.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }
mk() {  # mk PREFIX: LeNet's solver, 50 iterations, tests every 25, a snapshot at 25 and 50
  sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
      -e "s#^max_iter: .*#max_iter: 50#" -e "s#^snapshot: .*#snapshot: 25#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$1\"#" -e "s#^test_interval: .*#test_interval: 25#" \
      -e "s#^test_iter: .*#test_iter: 3#" -e "s#^display: .*#display: 5#" \
      "$SRC/models/lenet/lenet_solver.prototxt"
}
# the same snapshot prefix for both (a solver state names its weights file), in two folders
mkdir -p host sim
mk lenet > host/solver.prototxt
mk lenet > sim/solver.prototxt
(cd host && "$KILN" train --solver solver.prototxt --metrics ../host.jsonl --threads 2 > ../host.log 2>&1) \
  || fail "host run: $(tail -3 host.log)"
(cd sim && KILN_DEVICE=hostsim "$KILN" train --solver solver.prototxt --metrics ../sim.jsonl --threads 2 \
  > ../sim.log 2>&1)
rc=$?
[ $rc -eq 0 ] && pass || fail "hostsim run: exit $rc: $(tail -3 sim.log)"
grep -q '"event":"done".*"peak_device_mb":[1-9]' sim.jsonl && ! grep -q peak_device_mb host.jsonl && pass \
  || fail "the hostsim run's metrics lack its device memory, or the host's have one: $(grep done sim.jsonl host.jsonl)"
grep -q "^memory on hostsim: " sim.log && ! grep -q "^memory on" host.log && pass \
  || fail "the hostsim run's memory plan does not say it is on hostsim: $(grep memory sim.log)"
cmp -s host/lenet_iter_50.caffemodel sim/lenet_iter_50.caffemodel && pass \
  || fail "the weights after 50 iterations differ between the host and hostsim"
cmp -s host/lenet_iter_50.solverstate sim/lenet_iter_50.solverstate && pass \
  || fail "the solver states after 50 iterations differ"
figures() { grep -E '"event":"(train|test)"' "$1" | sed -E 's/"(time_ms|samples_per_s|peak_rss_mb|peak_device_mb|cpu_wait_ms)":[^,}]*,?//g'; }
[ -n "$(figures host.jsonl)" ] && [ "$(figures host.jsonl)" = "$(figures sim.jsonl)" ] && pass \
  || fail "losses or test figures differ: $(diff <(figures host.jsonl) <(figures sim.jsonl) | head -5)"
# resumed half-way on hostsim from the host's snapshot: the same final weights again
mk "$WORK/simr" > simr.prototxt
KILN_DEVICE=hostsim "$KILN" train --solver simr.prototxt --snapshot "$WORK/host/lenet_iter_25.solverstate" \
  --threads 2 > simr.log 2>&1 || fail "hostsim resume: $(tail -3 simr.log)"
cmp -s host/lenet_iter_50.caffemodel simr_iter_50.caffemodel && pass \
  || fail "hostsim resumed from the host's snapshot ends elsewhere"
# a negative control: the weights moved (the comparisons above compare training, not two copies
# of the start); that the walls fault on a host read is test_hostsim_walls in test_backend_ops.c
cmp -s host/lenet_iter_25.caffemodel host/lenet_iter_50.caffemodel && fail "the weights did not move" || pass
# kiln test and kiln time on hostsim, against the host
test_out() { "$KILN" test --model "$SRC/models/lenet/lenet_train_test.prototxt" \
  --weights host/lenet_iter_50.caffemodel --iterations 3 2>/dev/null | grep -v "^kiln info"; }
a=$(test_out) b=$(KILN_DEVICE=hostsim test_out)
[ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "kiln test: host '$a', hostsim '$b'"
for net in models/lenet/lenet_deploy models/googlenet/deploy bench/nets/resnet20 bench/nets/densenet40; do
  KILN_DEVICE=hostsim "$KILN" time --model "$SRC/$net.prototxt" --iterations 1 > t.log 2>&1 \
    && pass || fail "kiln time $net on hostsim: $(tail -2 t.log)"
done
finish
