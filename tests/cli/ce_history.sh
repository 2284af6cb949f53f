# kiln ce history and kiln ce compare on a history written by real CE runs of a tiny suite (one
# worker, a tiny net: a second a run): commits set through KILN_GIT_COMMIT, an accepted baseline,
# a run judged against a doctored one (a regression), a shorter suite (a worse loss), a run on
# another machine class and one on this machine's. Checks the tables, the tab-separated output,
# the filters, run names (latest~N), the change and its direction, and the bad arguments: exit 1
# when the history has no such model, KPI or run (naming what it has), 3 for bad usage.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/tiny.bash"
cd "$WORK"
export NO_COLOR=1
tiny_lmdb

tiny_accuracy_net > net.prototxt
tiny_accuracy_solver > solver.prototxt
suite() {  # suite NAME MAX_ITER: baselines of its own (baselines-NAME)
  printf 'name: "%s"\nrepeats: 1\nbaseline_dir: "baselines-%s"\nmodel { name: "tiny" solver: "solver.prototxt" max_iter: %d test_interval: %d threads: 1\n  kpi { name: "accuracy" floor: 0 } kpi { name: "train_loss" } kpi { name: "duration_s" rel_tolerance: 100 } }\n' \
    "$1" "$1" "$2" "$2"
}
suite four 100 > four.prototxt
suite short 30 > short.prototxt
DB="$WORK/ce.db"
run() {  # run COMMIT SUITE [ARGS...]: a CE run, its output in last.txt
  local commit=$1 s=$2
  shift 2
  KILN_GIT_COMMIT=$commit "$KILN" ce run "$s" --db "$DB" --report-dir "$WORK/r-$commit" "$@" \
    > last.txt 2>&1
}
run c1 four.prototxt --machine-class test-2c || fail "run 1: $(cat last.txt)"
"$KILN" ce accept four.prototxt --db "$DB" > acc.txt 2>&1 || fail "accept: $(cat acc.txt)"
run c2 four.prototxt --machine-class test-2c || fail "run 2: $(cat last.txt)"
cp baselines-four/test-2c/tiny.prototxt accepted.prototxt
sed -i '/kpi: "train_loss"/,/}/s/value: .*/value: 0.1/' baselines-four/test-2c/tiny.prototxt
run c3 four.prototxt --machine-class test-2c
[ $? -eq 1 ] && pass || fail "run 3 must regress: $(cat last.txt)"
cp accepted.prototxt baselines-four/test-2c/tiny.prototxt
run c4 short.prototxt --machine-class test-2c || fail "run 4: $(cat last.txt)"
run c5 four.prototxt --machine-class other-1c || fail "run 5: $(cat last.txt)"
run c6 four.prototxt || fail "run 6: $(cat last.txt)"
grep -q "history: $DB (run 6)" last.txt && pass || fail "six runs: $(cat last.txt)"
here=$(sed -n 's/^suite four: .* on \(.*\)$/\1/p' last.txt)
[ -n "$here" ] && pass || fail "this machine's class: $(cat last.txt)"

h() { "$KILN" ce history "$@" --db "$DB"; }
# a table per KPI: runs oldest first, with commit, suite, value, baseline, change and verdict
out=$(h tiny train_loss --machine-class test-2c)
[ $? -eq 0 ] && pass || fail "history: $out"
echo "$out" | head -n 2 | grep -q '^tiny train_loss (lower is better; machine class test-2c)$' && pass \
  || fail "history heading: $out"
echo "$out" | sed -n 2p | grep -Eq '^ +run +time \(UTC\) +commit +suite +workers +value +spread +baseline +change +verdict$' \
  && pass || fail "history columns: $out"
[ "$(echo "$out" | grep -Ec '^ +[0-9]+ +20[0-9-]+ [0-9:]+ +c[0-9] ')" -eq 4 ] && pass || fail "4 rows: $out"
echo "$out" | grep -Eq '^ +1 +[0-9-]+ [0-9:]+ +c1 +four +1 +0\.[0-9]+ +0 +- +- +new$' && pass || fail "row 1: $out"
echo "$out" | grep -Eq '^ +2 +[0-9-]+ [0-9:]+ +c2 +four +1 +0\.[0-9]+ +0 +0\.[0-9]+ +\+0\.0% +pass$' && pass \
  || fail "row 2: $out"
echo "$out" | grep -Eq '^ +3 +[0-9-]+ [0-9:]+ +c3 +four +1 +0\.[0-9]+ +0 +0\.1 +\+[0-9.]+% +regression$' && pass \
  || fail "row 3: $out"
echo "$out" | grep -Eq '^ +4 +[0-9-]+ [0-9:]+ +c4 +short +1 ' && pass || fail "row 4: $out"
echo "$out" | grep -q '^  run 3 x1 regression: train_loss .* is worse than the baseline 0.1' && pass \
  || fail "reason of run 3: $out"

# tab-separated: exact fields, the change being (value - baseline) / baseline
tsv=$(h tiny train_loss --machine-class test-2c --format tsv)
[ "$(echo "$tsv" | head -n 1)" = "$(printf 'run_id\ttime\tgit_commit\tsuite\tmachine_class\tmodel\tworkers\tkpi\tunit\tvalue\tspread\tbaseline\tchange\tverdict\treason')" ] \
  && pass || fail "tsv header: $tsv"
[ "$(echo "$tsv" | awk -F'\t' 'NR > 1 { print $1, $3, $4, $5, $6, $7, $8, $14 }' | tr '\n' ';')" = \
  "1 c1 four test-2c tiny 1 train_loss new;2 c2 four test-2c tiny 1 train_loss pass;3 c3 four test-2c tiny 1 train_loss regression;4 c4 short test-2c tiny 1 train_loss new;" ] \
  && pass || fail "tsv rows: $tsv"
echo "$tsv" | awk -F'\t' 'NR == 4 { d = ($10 - 0.1) / 0.1 - $13; exit !($12 == 0.1 && d < 1e-9 && d > -1e-9) }' \
  && pass || fail "tsv change of run 3: $tsv"
v1=$(echo "$tsv" | awk -F'\t' 'NR == 2 { print $10 }')
echo "$tsv" | awk -F'\t' -v v="$v1" 'NR == 3 { exit !($10 == v && $12 == v && $13 == 0) }' && pass \
  || fail "run 2 equals its baseline (run 1): $tsv"

# every KPI, grouped; the filters
out=$(h tiny --machine-class test-2c)
[ "$(echo "$out" | grep -E '^tiny [a-z_]+ \(' | cut -d' ' -f2 | tr '\n' ' ')" = "accuracy train_loss duration_s " ] \
  && pass || fail "KPI groups: $out"
[ "$(h tiny accuracy --machine-class test-2c --last 2 --format tsv | cut -f1 | tr '\n' ' ')" = "run_id 3 4 " ] \
  && pass || fail "--last 2"
[ "$(h tiny accuracy --machine-class test-2c --suite short --format tsv | cut -f1 | tr '\n' ' ')" = "run_id 4 " ] \
  && pass || fail "--suite"
[ "$(h tiny accuracy --all-classes --format tsv | cut -f1,5 | tail -n +2 | tr '\t\n' ': ')" = \
  "1:test-2c 2:test-2c 3:test-2c 4:test-2c 5:other-1c 6:$here " ] && pass || fail "--all-classes"
h tiny accuracy --all-classes | sed -n 2p | grep -q ' class ' && pass || fail "class column with --all-classes"
# by default this machine's class
[ "$(h tiny accuracy --format tsv | cut -f1 | tr '\n' ' ')" = "run_id 6 " ] && pass || fail "default class"
[ "$(h tiny accuracy --workers 1 --format tsv | wc -l)" -eq 2 ] && pass || fail "--workers 1"

# nothing matches: exit 1, naming what there is
expect_code() {  # expect_code NAME CODE WANT -- command...
  local name=$1 code=$2 want=$3 err rc
  shift 4
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq "$code" ] && pass || fail "$name: exit $rc, expected $code: $err"
  case "$err" in *"$want"*) pass ;; *) fail "$name: message lacks '$want': $err" ;; esac
}
expect_code model 1 "no model 'tinny' in the history on machine class test-2c (models: tiny)" -- \
  h tinny --machine-class test-2c
expect_code kpi 1 "model 'tiny' has no KPI 'acuracy' in the history on machine class test-2c (its KPIs: accuracy, duration_s, train_loss)" -- \
  h tiny acuracy --machine-class test-2c
expect_code class 1 "model 'tiny' has no history on machine class nowhere-9c; it has on machine class $(printf '%s\n' other-1c test-2c "$here" | sort -u | paste -sd, | sed 's/,/, /g')" -- \
  h tiny --machine-class nowhere-9c
expect_code workers 1 "no history of model 'tiny' with 4 workers (recorded: workers 1; suites four, short)" -- \
  h tiny --machine-class test-2c --workers 4
expect_code nodb 3 "$WORK/none.db: no CE history there" -- "$KILN" ce history tiny --db "$WORK/none.db"
[ ! -e "$WORK/none.db" ] && pass || fail "reading a missing history created it"
expect_code noarg 3 "usage: kiln ce history MODEL" -- h
expect_code badworkers 3 "--workers: 'x' is not a whole number (--workers takes 1 to 2147483647)" -- h tiny --workers x
expect_code badlast 3 "--last: '0' is out of range: --last takes 1 to 2147483647" -- h tiny --last 0
expect_code badformat 3 "--format 'xml': expected table or tsv" -- h tiny --format xml
expect_code both 3 "--machine-class and --all-classes exclude each other" -- h tiny --all-classes --machine-class x
expect_code option 3 "unknown option '--lats'" -- h tiny --lats 2
expect_code extra 3 "unexpected argument 'more'" -- h tiny accuracy more

# compare: the header of each run, every KPI side by side with the change and its direction
c() { "$KILN" ce compare "$@" --db "$DB"; }
out=$(c 2 4)
[ $? -eq 0 ] && pass || fail "compare: $out"
echo "$out" | grep -Eq '^A: run 2, 20[0-9-]+ [0-9:]+ UTC, commit c2, suite four, machine class test-2c$' && pass \
  || fail "header A: $out"
echo "$out" | grep -Eq '^B: run 4, 20[0-9-]+ [0-9:]+ UTC, commit c4, suite short, machine class test-2c$' && pass \
  || fail "header B: $out"
echo "$out" | grep -q '^warning' && fail "same class, no warning: $out" || pass
echo "$out" | grep -Eq '^model +workers +KPI +A +B +change +verdict A +verdict B$' && pass || fail "columns: $out"
# 30 iterations leave a higher loss than 100: worse, by the relative change of the two values
a=$(h tiny train_loss --machine-class test-2c --format tsv | awk -F'\t' '$1 == 2 { print $10 }')
b=$(h tiny train_loss --machine-class test-2c --format tsv | awk -F'\t' '$1 == 4 { print $10 }')
want=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%+.1f%% worse", 100 * (b - a) / a }')
echo "$out" | grep -Eq "^tiny +1 +train_loss +[0-9.]+ +[0-9.]+ +\\$want +pass +new$" && pass \
  || fail "train_loss change '$want': $out"
[ "$(echo "$out" | grep -c '^tiny ')" -eq 3 ] && pass || fail "3 KPIs: $out"
out=$(c 4 2)
echo "$out" | grep -Eq "^tiny +1 +train_loss .* better +new +pass$" && pass || fail "reversed: better: $out"
# runs of one configuration: the deterministic figures are the same
out=$(c 1 2)
echo "$out" | grep -Eq '^tiny +1 +accuracy +[0-9.]+ +[0-9.]+ +same +new +pass$' && pass || fail "same: $out"
# latest and latest~N; machine classes that differ are said
out=$(c latest~1 latest)
echo "$out" | grep -q '^A: run 5, .* commit c5, suite four, machine class other-1c$' && pass || fail "latest~1: $out"
echo "$out" | grep -q "^B: run 6, .* commit c6, suite four, machine class $here\$" && pass || fail "latest: $out"
echo "$out" | grep -q "^warning: the runs are from different machine classes (other-1c, $here): their timings and memory are not comparable$" \
  && pass || fail "class warning: $out"
# a KPI only one run has is shown with a dash
sed -i 's/kpi { name: "train_loss" }/kpi { name: "train_loss" } kpi { name: "test_loss" }/' four.prototxt
run c7 four.prototxt --machine-class test-2c || fail "run 7: $(cat last.txt)"
out=$(c 2 7)
echo "$out" | grep -Eq '^tiny +1 +test_loss +- +[0-9.]+ +- +- +new$' && pass || fail "dash for a missing KPI: $out"
expect_code run 1 "no run 99" -- c 1 99
expect_code latest 1 "run 'latest~7': the history has 7 runs" -- c latest~7 latest
expect_code name 3 "run 'newest': expected a run id (1 to 9223372036854775807" -- c newest 1
expect_code hex 3 "run '0x1': expected a run id" -- c 0x1 1
expect_code huge 3 "run '99999999999999999999': expected a run id" -- c 1 99999999999999999999
expect_code one 3 "usage: kiln ce compare RUN_A RUN_B" -- c 1
expect_code flag 3 "usage: kiln ce compare RUN_A RUN_B" -- c 1 2 --workers 2
expect_code cnodb 3 "no CE history there" -- "$KILN" ce compare 1 2 --db "$WORK/none.db"
"$KILN" ce --help | grep -q 'kiln ce history MODEL \[KPI\]' && "$KILN" ce --help | grep -q 'kiln ce compare RUN_A RUN_B' \
  && pass || fail "usage text"
finish
