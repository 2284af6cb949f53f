# kiln ce run with more workers than cores: a tiny suite on 1 and 4 workers (4 MPI ranks share 2
# cores; on a larger machine the run is pinned to 2 with taskset). The 4-worker accuracy and loss
# are judged as usual; its duration, throughput, speedup and efficiency are "n/a" with the reason
# in the table, results.jsonl, the HTML grid's tooltips and the history; accept leaves them out of
# the baseline, and a second run judges the 4-worker accuracy against it.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/mpi.bash"
cd "$WORK"
export NO_COLOR=1
tiny_lmdb

PIN=()
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the CPUs this process may use
if [ "$cores" -gt 2 ]; then
  command -v taskset >/dev/null 2>&1 || { echo "SKIP: more than 2 cores and no taskset"; exit 77; }
  PIN=(taskset -c 0,1)
  cores=2
fi
cs=s; [ "$cores" -eq 1 ] && cs=
why="4 workers on $cores core$cs: timing not judged"

tiny_accuracy_net > net.prototxt
tiny_accuracy_solver > solver.prototxt
cat > suite.prototxt <<SUITE
name: "four"
repeats: 1
model {
  name: "tiny"
  solver: "solver.prototxt"
  workers: 1
  workers: 4
  threads: 1
  kpi { name: "accuracy" floor: 0.3 }
  kpi { name: "train_loss" }
  kpi { name: "duration_s" rel_tolerance: 100 }     # 1 worker's timings are judged, but a run
  kpi { name: "samples_per_s" rel_tolerance: 100 }  # of milliseconds must not make this flaky
  kpi { name: "speedup" }
  kpi { name: "efficiency" }
}
SUITE

ce() { "${PIN[@]}" "$KILN" ce run suite.prototxt --db "$WORK/ce.db" --machine-class test-2c "$@"; }
out=$(ce --report-dir "$WORK/r1" 2>err1.txt)
rc=$?
[ $rc -eq 0 ] && pass || fail "first run: exit $rc: $out $(cat err1.txt)"
grep -q "tiny x4 r1: done" err1.txt && pass || fail "the 4-worker training did not run: $(cat err1.txt)"
for kpi in accuracy train_loss; do
  echo "$out" | grep -Eq "^tiny +4 +$kpi .* new$" && pass || fail "x4 $kpi not judged: $out"
done
for kpi in duration_s samples_per_s speedup efficiency; do
  echo "$out" | grep -Eq "^tiny +4 +$kpi .* n/a$" && pass || fail "x4 $kpi: $out"
  echo "$out" | grep -qx "n/a tiny x4 $kpi: $why" && pass || fail "x4 $kpi reason: $out"
  grep -q "\"workers\":4,\"kpi\":\"$kpi\".*\"verdict\":\"n/a\",\"reason\":\"$why\"" r1/results.jsonl \
    && pass || fail "results.jsonl x4 $kpi: $(cat r1/results.jsonl)"
done
for kpi in duration_s samples_per_s; do  # one worker fits the cores: judged
  echo "$out" | grep -Eq "^tiny +1 +$kpi .* new$" && pass || fail "x1 $kpi: $out"
done
[ "$(grep -o "<td class=\"na\" title=\"$why\">" r1/report.html | wc -l)" -eq 4 ] && pass \
  || fail "report.html: $(grep -o '<td class="[a-z]*" title="[^"]*">' r1/report.html)"
# the 4 ranks really trained: the metrics have a "worker" event from each
[ "$(grep -c '"event":"worker"' r1/runs/tiny-w4-r1/metrics.jsonl)" -eq 4 ] && pass \
  || fail "4 workers: $(cat r1/runs/tiny-w4-r1/metrics.jsonl)"
if command -v sqlite3 >/dev/null 2>&1; then
  got=$(sqlite3 ce.db "SELECT kpi || ' ' || verdict || ' ' || reason FROM kpi_history WHERE workers = 4 ORDER BY rowid")
  none='no baseline for machine class test-2c; `kiln ce accept` records one'
  want=$(printf 'accuracy new %s\ntrain_loss new %s\n' "$none" "$none"; for k in duration_s samples_per_s speedup efficiency; do echo "$k n/a $why"; done)
  [ "$got" = "$want" ] && pass || fail "history: $got"
fi

# accept: the 4-worker timings stay out of the baseline
"$KILN" ce accept suite.prototxt --db "$WORK/ce.db" > acc.txt 2>&1 && pass || fail "accept: $(cat acc.txt)"
base=baselines/test-2c/tiny.prototxt
# (the value blocks' KPIs and worker counts; the curve blocks after them have workers too)
got=$(awk '/^value \{/ { v = 1 } /^curve \{/ { v = 0 } v && /^  kpi:/ { k = $2 } v && /^  workers:/ { print k, $2 }' \
  "$base" 2>/dev/null | sort | tr '\n' ';')
want='"accuracy" 1;"accuracy" 4;"duration_s" 1;"samples_per_s" 1;"train_loss" 1;"train_loss" 4;'
[ "$got" = "$want" ] && pass || fail "baseline values: $got ($(cat "$base" 2>&1))"

# again: 4 workers' accuracy compared with the baseline, their timings still not judged
out=$(ce --report-dir "$WORK/r2" 2>err2.txt)
rc=$?
[ $rc -eq 0 ] && pass || fail "second run: exit $rc: $out $(cat err2.txt)"
echo "$out" | grep -Eq '^tiny +4 +accuracy +1 +1 +\+0\.0% +pass$' && pass || fail "x4 accuracy vs baseline: $out"
echo "$out" | grep -Eq "^tiny +4 +samples_per_s .* - +- +n/a$" && pass || fail "x4 throughput: $out"
finish
