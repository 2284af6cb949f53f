# Hostile continuous-evaluation input: suites with fields out of range, misspelt or repeated,
# baselines with NaN values, negative spreads, duplicates, unknown KPIs or the wrong place, and
# `kiln ce accept` over baselines it must not overwrite. kiln ce exits 3 when the harness cannot
# run (docs/ce.md), so these cases want exit 3, the file and the line or field named, no
# sanitizer report, no report folder made for a suite that cannot be read, and no baseline
# written (nor a temporary of it left) by an accept that failed.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
cd "$WORK"
export NO_COLOR=1

tiny_lmdb "$WORK/tiny_lmdb" || fail "convert the tiny LMDB"
tiny_net "$WORK/tiny_lmdb" > net.prototxt
tiny_solver net.prototxt > solver.prototxt
# suite FILE SUITE_LINES MODEL_LINES: a suite (name on line 1, SUITE_LINES from line 2) of one
# model 'm' training solver.prototxt, MODEL_LINES inside its block after the solver.
suite() {
  printf 'name: "h"\n%s\nmodel {\n  name: "m"\n  solver: "solver.prototxt"\n  threads: 1\n%s\n  kpi { name: "train_loss" }\n}\n' \
    "$2" "$3" > "$1"
}
DB=("--db" "$WORK/ce.db")
suite good.prototxt 'repeats: 1' ''
need "the good suite runs" -- "$KILN" ce run good.prototxt "${DB[@]}" --report-dir "$WORK/r_good" --machine-class hc

# ---- suites -----------------------------------------------------------------------------------
n=0
# suite_case NAME SUITE_LINES MODEL_LINES WANT...: that suite must not run, naming WANT...
suite_case() {
  local name=$1
  n=$((n + 1))
  suite "s$n.prototxt" "$2" "$3"
  shift 3
  local -a w=(--want "s$n.prototxt")
  for x in "$@"; do w+=(--want "$x"); done
  expect_refusal "suite: $name" --code 3 "${w[@]}" --gone "r$n" -- \
    "$KILN" ce run "s$n.prototxt" "${DB[@]}" --report-dir "r$n"
}
suite_case "a misspelt field" 'repets: 1' '' "s1.prototxt:2:1:" "did you mean 'repeats'"
suite_case "a misspelt kpi field" '' '  kpi { nme: "accuracy" }' "s2.prototxt:7:9:" "'nme'"
suite_case "repeats 0" 'repeats: 0' '' "repeats must be in 1..16"
suite_case "repeats 17" 'repeats: 17' '' "repeats must be in 1..16"
suite_case "noise_k NaN" 'noise_k: nan' '' "noise_k must be >= 0"
suite_case "timeout_seconds -1" 'timeout_seconds: -1' '' "timeout_seconds must be positive"
suite_case "workers 0" '' '  workers: 0' "model 'm': workers 0"
suite_case "workers given twice" '' '  workers: 2 workers: 2' "workers 2 given twice"
suite_case "nine worker counts" '' '  workers: [1, 2, 3, 4, 5, 6, 7, 8, 9]' "at most 8 worker counts"
suite_case "max_iter 0" '' '  max_iter: 0' "max_iter must be positive"
suite_case "test_iter 0" '' '  test_iter: 0' "test_iter must be positive"
suite_case "test_interval -1" '' '  test_interval: -1' "test_interval -1 is negative"
suite_case "threads 0" '' '  threads: 0' "threads 0"
suite_case "iters_per_epoch inf" '' '  iters_per_epoch: inf' "iters_per_epoch inf"
suite_case "min_epochs_learning -1" '' '  min_epochs_learning: -1' "min_epochs_learning -1"
suite_case "model repeats 0" '' '  repeats: 0' "model 'm': repeats must be in"
suite_case "an unknown KPI" '' '  kpi { name: "acuracy" }' "unknown KPI 'acuracy'"
suite_case "a KPI given twice" '' '  kpi { name: "train_loss" }' "KPI 'train_loss' given twice"
suite_case "a negative tolerance" '' '  kpi { name: "accuracy" rel_tolerance: -0.1 }' "rel_tolerance -0.1 is negative"
suite_case "floor above ceiling" '' '  kpi { name: "accuracy" floor: 0.9 ceiling: 0.1 }' "floor 0.9 is above ceiling 0.1"
suite_case "mean_last_n 0" '' '  kpi { name: "test_loss" reduction: MEAN_LAST mean_last_n: 0 }' "mean_last_n"
suite_case "an unknown reduction" '' '  kpi { name: "test_loss" reduction: MEDIAN }' "s22.prototxt:7:" "'reduction'"

printf 'name: "h"\nmodel { name: "a/b" solver: "solver.prototxt" kpi { name: "train_loss" } }\n' > name.prototxt
expect_refusal "suite: a model name with a slash" --code 3 --want "name.prototxt" --want "name 'a/b'" --gone r_name -- \
  "$KILN" ce run name.prototxt "${DB[@]}" --report-dir r_name
printf 'name: "h"\nmodel { name: "m" solver: "gone.prototxt" kpi { name: "train_loss" } }\n' > nosolver.prototxt
expect_refusal "suite: a missing solver" --code 3 --want "nosolver.prototxt" --want "gone.prototxt" --gone r_nos -- \
  "$KILN" ce run nosolver.prototxt "${DB[@]}" --report-dir r_nos
printf 'name: "h"\nmodel { name: "m" kpi { name: "train_loss" } }\n' > nosolver2.prototxt
expect_refusal "suite: a model with no solver" --code 3 --want "nosolver2.prototxt" --want "no solver" --gone r_nos2 -- \
  "$KILN" ce run nosolver2.prototxt "${DB[@]}" --report-dir r_nos2
printf 'name: "h"\nmodel { name: "m" solver: "solver.prototxt" kpi { name: "train_loss" } }\nmodel { name: "m" solver: "solver.prototxt" kpi { name: "train_loss" } }\n' > twice.prototxt
expect_refusal "suite: a model given twice" --code 3 --want "twice.prototxt" --want "model 'm' given twice" --gone r_tw -- \
  "$KILN" ce run twice.prototxt "${DB[@]}" --report-dir r_tw
printf 'name: "h"\nrepeats: 1\n' > nomodel.prototxt
expect_refusal "suite: no model" --code 3 --want "nomodel.prototxt: the suite has no model" --gone r_nm -- \
  "$KILN" ce run nomodel.prototxt "${DB[@]}" --report-dir r_nm
mkdir suitedir
expect_refusal "suite: a folder" --code 3 --want "suitedir: not a regular file" --gone r_sd -- \
  "$KILN" ce run suitedir "${DB[@]}" --report-dir r_sd
mkfifo suite.fifo
expect_refusal "suite: a FIFO" --code 3 --timeout 20 --want "suite.fifo: not a regular file" --gone r_sf -- \
  "$KILN" ce run suite.fifo "${DB[@]}" --report-dir r_sf
expect_refusal "suite: missing" --code 3 --want "absent.prototxt: cannot open" --gone r_sa -- \
  "$KILN" ce run absent.prototxt "${DB[@]}" --report-dir r_sa

# ---- the command line, history and report folder ---------------------------------------------
noise 300 > noise.db
expect_refusal "ce: a history that is no database" --code 3 --want "noise.db" --want "not a usable CE history" --gone r_db -- \
  "$KILN" ce run good.prototxt --db noise.db --report-dir r_db
expect_refusal "ce: a folder as the history" --code 3 --want "suitedir" --gone r_dbd -- \
  "$KILN" ce run good.prototxt --db suitedir --report-dir r_dbd
: > plainfile
expect_refusal "ce: a report folder that is a file" --code 3 --want "plainfile: cannot create folder" -- \
  "$KILN" ce run good.prototxt "${DB[@]}" --report-dir plainfile
expect_refusal "ce: --model of no model" --code 3 --want "no model named 'nope'" -- \
  "$KILN" ce run good.prototxt "${DB[@]}" --report-dir r_nope --model nope
expect_refusal "ce: --repeats 0" --code 3 --want "--repeats: '0'" --gone r_rep -- \
  "$KILN" ce run good.prototxt "${DB[@]}" --report-dir r_rep --repeats 0
expect_refusal "ce: KILN_FAULT of no kind" --code 3 --want "KILN_FAULT" --gone r_fault -- \
  env KILN_FAULT=bogus "$KILN" ce run good.prototxt "${DB[@]}" --report-dir r_fault

# ---- baselines read by a run ------------------------------------------------------------------
mkdir -p baselines/hc
k=0
# base_case NAME TEXT WANT...: with TEXT as the model's baseline the run must end in an error
# row (exit 3) whose reason names the baseline file and WANT...
base_case() {
  local name=$1
  k=$((k + 1))
  printf '%b' "$2" > baselines/hc/m.prototxt
  shift 2
  local -a w=(--want "baselines/hc/m.prototxt")
  for x in "$@"; do w+=(--want "$x"); done
  expect_refusal "baseline: $name" --code 3 --any "${w[@]}" -- \
    "$KILN" ce run good.prototxt "${DB[@]}" --report-dir "b$k" --machine-class hc
}
V='value { kpi: "train_loss" workers: 1 value: 1 }\n'
base_case "a NaN value" 'value { kpi: "train_loss" value: nan }\n' "KPI 'train_loss' (1 workers): value is not a finite number"
base_case "a value past double" 'value { kpi: "train_loss" value: 1e400 }\n' "value is not a finite number"
base_case "a negative spread" 'value { kpi: "train_loss" value: 1 spread: -0.5 }\n' "spread -0.5 must be >= 0"
base_case "an infinite spread" 'value { kpi: "train_loss" value: 1 spread: inf }\n' "spread inf"
base_case "a KPI given twice" "$V$V" "KPI 'train_loss' (1 workers) given twice"
base_case "workers 0" 'value { kpi: "train_loss" workers: 0 value: 1 }\n' "workers 0"
base_case "samples 0" 'value { kpi: "train_loss" value: 1 samples: 0 }\n' "samples 0"
base_case "a value with no kpi" 'value { value: 1 }\n' "value 1 has no kpi"
base_case "a value missing" 'value { kpi: "train_loss" }\n' "value is missing"
base_case "an unknown kpi" 'value { kpi: "train_los" value: 1 }\n' "unknown kpi 'train_los'"
base_case "no values" 'model: "m"\n' "holds no values"
base_case "a misspelt field" 'model: "m"\nvalue {\n  kpi: "train_loss"\n  vlue: 1\n}\n' "m.prototxt:4:3:" "did you mean 'value'"
base_case "another model's file" "model: \"other\"\n$V" "model 'other', but it is the baseline file of 'm'"
base_case "another class's file" "machine_class: \"zz\"\n$V" "machine_class 'zz', but it lies in the folder of class 'hc'"
base_case "binary garbage" '\x89\x00\x01garbage' "m.prototxt:1:1:"
rm -f baselines/hc/m.prototxt && mkdir baselines/hc/m.prototxt
expect_refusal "baseline: a folder" --code 3 --any --want "baselines/hc/m.prototxt: not a regular file" -- \
  "$KILN" ce run good.prototxt "${DB[@]}" --report-dir b_dir --machine-class hc
rmdir baselines/hc/m.prototxt

# ---- kiln ce accept ---------------------------------------------------------------------------
rm -rf baselines
need "a good run to accept" -- "$KILN" ce run good.prototxt "${DB[@]}" --report-dir "$WORK/r_acc" --machine-class hc
mkdir -p baselines/hc
A=("$KILN" ce accept good.prototxt "${DB[@]}")
printf 'value {\n  kpi: "train_loss"\n  value: nan\n}\n' > baselines/hc/m.prototxt
expect_refusal "accept over a NaN baseline" --code 3 --want "baselines/hc/m.prototxt" --want "value is not a finite number" \
  --same baselines/hc/m.prototxt -- "${A[@]}"
printf 'value {\n  kpi: "train_loss"\n  vlue: 1\n}\n' > baselines/hc/m.prototxt
expect_refusal "accept over a misspelt baseline" --code 3 --want "baselines/hc/m.prototxt:3:3:" --want "'vlue'" \
  --same baselines/hc/m.prototxt -- "${A[@]}"
printf 'model: "other"\nvalue { kpi: "train_loss" value: 1 }\n' > baselines/hc/m.prototxt
expect_refusal "accept over another model's baseline" --code 3 --want "baselines/hc/m.prototxt" --want "model 'other'" \
  --same baselines/hc/m.prototxt -- "${A[@]}"
rm baselines/hc/m.prototxt && mkdir baselines/hc/m.prototxt
expect_refusal "accept onto a folder" --code 3 --want "baselines/hc/m.prototxt: not a regular file" \
  --same baselines/hc/m.prototxt -- "${A[@]}"
expect_refusal "accept into a baseline folder that is a file" --code 3 --want "plainfile/hc: cannot create folder" \
  --gone plainfile/hc/m.prototxt -- "${A[@]}" --baseline-dir plainfile
mkdir -p classfile && : > classfile/hc
expect_refusal "accept where the class folder is a file" --code 3 --want "classfile/hc: cannot create folder" \
  --same classfile/hc -- "${A[@]}" --baseline-dir classfile
expect_refusal "accept a run the history lacks" --code 3 --want "ce.db: no run 999" -- \
  "$KILN" ce accept 999 "${DB[@]}" --baseline-dir nb999
expect_refusal "accept a missing suite" --code 3 --want "absent.prototxt: no such suite file" -- \
  "$KILN" ce accept absent.prototxt "${DB[@]}"
expect_refusal "accept from a history that is no database" --code 3 --want "noise.db" -- \
  "$KILN" ce accept good.prototxt --db noise.db
suite failing.prototxt 'repeats: 1' '  kpi { name: "test_loss" }'
"$KILN" ce run failing.prototxt "${DB[@]}" --report-dir "$WORK/r_fail" --machine-class hc >/dev/null 2>&1
expect_refusal "accept a run that failed" --code 1 --want "m: not accepted" --gone nbfail/hc/m.prototxt -- \
  "$KILN" ce accept failing.prototxt "${DB[@]}" --baseline-dir nbfail
# ---- CE keeps to its own files ----------------------------------------------------------------
rm -rf baselines
# a machine class that would climb out of the baselines: refused by the run, and by accept when
# a history (written by an older kiln) holds one
expect_refusal "ce: a machine class with ../" --code 3 --want "machine class '../../ESCAPED' must be" \
  --gone r_esc -- "$KILN" ce run good.prototxt "${DB[@]}" --report-dir r_esc --machine-class ../../ESCAPED
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
cp ce.db esc.db
"$PY" -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute("UPDATE runs SET machine_class = ?", ("../../ESCAPED",)); c.commit()' esc.db
mkdir -p escb/x
expect_refusal "accept: a recorded class with ../" --code 3 --want "machine class '../../ESCAPED' must be" \
  --gone ESCAPED --gone escb/ESCAPED -- "$KILN" ce accept good.prototxt --db esc.db --baseline-dir escb/x/y
# history, compare and accept read a history and create nothing in any file given as --db
"$PY" -c 'import sqlite3, sys
c = sqlite3.connect(sys.argv[1]); c.execute("CREATE TABLE t(x)"); c.execute("INSERT INTO t VALUES (1)"); c.commit()' other.db
: > empty.db
for cmd in "history m" "compare 1 2" "accept good.prototxt"; do
  for db in other.db empty.db; do
    expect_refusal "ce $cmd: --db $db, no history" --code 3 --want "$db: not a CE history" --same "$db" \
      --gone "$db-wal" --gone "$db-shm" -- "$KILN" ce $cmd --db "$db"
  done
  expect_refusal "ce $cmd: --db missing.db" --code 3 --want "missing.db: no CE history there" \
    --gone missing.db -- "$KILN" ce $cmd --db missing.db
done
expect_refusal "ce run: --report-dir and --db the same" --code 3 --want "are the same path" \
  --gone X.db -- "$KILN" ce run good.prototxt --db X.db --report-dir X.db
expect_refusal "ce run: --report-dir and --db the same, spelt apart" --code 3 --want "are the same path" \
  --gone X.db -- "$KILN" ce run good.prototxt --db ./X.db --report-dir "$WORK/X.db"
expect_refusal "ce run: a report folder that cannot be made leaves no history" --code 3 \
  --want "plainfile/r: cannot create folder" --gone fresh.db -- \
  "$KILN" ce run good.prototxt --db fresh.db --report-dir plainfile/r
# a suite whose baseline_dir is a file would read as "no baselines" and pass everything as new
suite basefile.prototxt 'repeats: 1
baseline_dir: "plainfile"' ''
expect_refusal "suite: baseline_dir a regular file" --code 3 --want "baseline_dir" \
  --want "plainfile is not a folder" --gone r_bf -- \
  "$KILN" ce run basefile.prototxt "${DB[@]}" --report-dir r_bf
# run names: bad usage (3), not a run that is missing (1)
expect_refusal "accept: a run id past 2^63" --code 3 --want "run '99999999999999999999': expected a run id" -- \
  "$KILN" ce accept 99999999999999999999 "${DB[@]}" --baseline-dir nbhuge
expect_refusal "compare: a hex run id" --code 3 --want "run '0x1': expected a run id" -- \
  "$KILN" ce compare 0x1 1 "${DB[@]}"
# a report folder whose name is not UTF-8: results.jsonl is still JSON, report.html UTF-8
# (the suite, its solver and net in that folder: their paths are in both reports)
bad=$(printf 'r_\xff\xfe')
mkdir "$bad" && cp good.prototxt solver.prototxt net.prototxt "$bad/"
need "a run into a non-UTF-8 folder" -- "$KILN" ce run "$bad/good.prototxt" "${DB[@]}" \
  --report-dir "$WORK/$bad/r" --machine-class hu
"$PY" - "$WORK/$bad/r" <<'CHECK' && pass || fail "non-UTF-8 folder: reports not valid"
import json, sys, os
d = os.fsencode(sys.argv[1])
lines = open(os.path.join(d, b"results.jsonl"), "rb").read().decode("utf-8").splitlines()
run = json.loads(lines[0])
assert run["suite_path"].endswith("/r_\ufffd\ufffd/good.prototxt"), run["suite_path"]
for l in lines[1:]: json.loads(l)
html = open(os.path.join(d, b"report.html"), "rb").read().decode("utf-8")
assert "r_\ufffd\ufffd" in html
CHECK
# a run named latest is accepted (the newest: the one above)
"$KILN" ce accept latest "${DB[@]}" --baseline-dir nblatest >/dev/null 2>&1 && [ -s nblatest/hu/m.prototxt ] \
  && pass || fail "accept latest"
finish
