# kiln ce end to end on a tiny suite (LeNet, 200 iterations, 1 worker): the table, the reports
# and the history of a first run; accept writing a baseline; a run on another machine class
# comparing only the machine-independent KPIs (the timings and memory `new`, with the reason),
# and catching a planted accuracy drop there; a doctored baseline caught as a regression.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export NO_COLOR=1
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }

cat > suite.prototxt <<SUITE
name: "tiny"
repeats: 1
model {
  name: "lenet"
  solver: "$SRC/models/lenet/lenet_solver.prototxt"
  workers: 1
  max_iter: 200
  test_interval: 200
  test_iter: 10
  threads: 1
  dataset: "fashion-mnist"
  iters_per_epoch: 937.5
  kpi { name: "accuracy" floor: 0.5 }
  kpi { name: "train_loss" }
  kpi { name: "test_loss" }
  kpi { name: "peak_rss_mb" }
  kpi { name: "duration_s" }
  kpi { name: "samples_per_s" }
}
SUITE

out=$("$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/r1" 2>err1.txt)
rc=$?
[ $rc -eq 0 ] && pass || fail "first run: exit $rc: $out $(cat err1.txt)"
for want in "model" "workers" "KPI" "baseline" "verdict" "accuracy" "samples_per_s" "new" \
            "report: $WORK/r1/report.html" "history: $WORK/ce.db (run 1)"; do
  case "$out" in *"$want"*) pass ;; *) fail "table lacks '$want': $out" ;; esac
done
[ -s r1/report.html ] && grep -q '<table class="grid">' r1/report.html && pass || fail "report.html"
[ "$(grep -c '<svg class="trend"' r1/report.html)" -eq 6 ] && pass \
  || fail "one trend plot per KPI: $(grep -c '<svg class="trend"' r1/report.html)"
[ "$(grep -c '<svg class="curves"' r1/report.html)" -eq 4 ] && pass \
  || fail "four convergence charts: $(grep -c '<svg class="curves"' r1/report.html)"
[ "$(wc -l < r1/results.jsonl)" -eq 7 ] && pass || fail "results.jsonl: $(cat r1/results.jsonl)"
grep -q '"kpi":"accuracy".*"verdict":"new"' r1/results.jsonl && pass || fail "accuracy row"
[ -s r1/runs/lenet-w1-r1/metrics.jsonl ] && [ -s r1/runs/lenet-w1-r1/solver.prototxt ] && pass \
  || fail "run folder"
grep -q '^max_iter: 200$' r1/runs/lenet-w1-r1/solver.prototxt && pass || fail "max_iter override"

# accept: a baseline per machine class, from the newest run of the suite
"$KILN" ce accept suite.prototxt --db "$WORK/ce.db" > acc.txt 2>&1 && pass || fail "accept: $(cat acc.txt)"
base=$(ls baselines/*/lenet.prototxt 2>/dev/null | head -n 1)
[ -n "$base" ] && grep -q 'kpi: "accuracy"' "$base" && grep -q 'kpi: "duration_s"' "$base" && pass \
  || fail "baseline file: $(ls -R baselines 2>&1)"
class=$(basename "$(dirname "$base")")

# another machine class: accuracy and losses compared (same seed: same values), timings not
out=$("$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/r2" --machine-class other-1c 2>/dev/null)
rc=$?
[ $rc -eq 0 ] && pass || fail "second run: exit $rc: $out"
echo "$out" | grep -Eq '^lenet +1 +accuracy .* pass$' && pass || fail "accuracy not compared: $out"
echo "$out" | grep -q "warning: lenet: no baseline for machine class other-1c" && pass || fail "class warning: $out"
echo "$out" | grep -q "^new lenet x1 duration_s: no baseline for machine class other-1c; \`kiln ce accept\` records one$" \
  && pass || fail "timing compared across classes: $out"
echo "$out" | grep -Eq '^lenet +1 +duration_s .* new$' && pass || fail "duration not new: $out"
echo "$out" | grep -Eq '^lenet +1 +peak_rss_mb .* new$' && pass || fail "memory not new: $out"
# the table's last lines name the class the run was judged as
echo "$out" | grep -q "suite tiny: pass (exit 0) in .* s on other-1c" && pass || fail "class in the summary: $out"

# on that class with a planted accuracy drop: still caught (timings stay new)
out=$(KILN_FAULT=lr:0.05 "$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/r2f" \
  --machine-class other-1c 2>/dev/null)
rc=$?
[ $rc -eq 1 ] || [ $rc -eq 2 ] && pass || fail "planted accuracy drop on another class: exit $rc: $out"
echo "$out" | grep -Eq '^lenet +1 +accuracy .* (regression|FAIL)$' && pass \
  || fail "accuracy drop not caught on another class: $out"
echo "$out" | grep -Eq '^lenet +1 +duration_s .* new$' && pass || fail "duration judged: $out"

# a baseline doctored to expect more accuracy: a regression (exit 1), with the reason
sed -i '/kpi: "accuracy"/,/}/s/value: .*/value: 0.99/' "$base"
out=$("$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/r3" --machine-class "$class" 2>/dev/null)
rc=$?
[ $rc -eq 1 ] && pass || fail "doctored baseline: exit $rc, expected 1: $out"
echo "$out" | grep -q "regression lenet x1 accuracy: accuracy .* is worse than the baseline 0.99" && pass \
  || fail "regression reason: $out"
"$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/r4" --machine-class "$class" --warn-only \
  >/dev/null 2>&1 && pass || fail "--warn-only must exit 0"
grep -q "<svg" r4/report.html && grep -q "<polyline" r4/report.html && pass || fail "trend over 3 runs"
finish
