# Planted failures through kiln ce run: each must give its exit code and the reason in words.
# A learning rate of 0 (accuracy stays at chance: exit 2), a huge one (NaN: exit 2), a run past its
# timeout (exit 2), a crash of the trainer (exit 2), a missing data set and a broken suite (the
# harness could not run: exit 3).
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export NO_COLOR=1
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }

solver() {  # solver BASE_LR > file
  sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
      -e "s#^base_lr: .*#base_lr: $1#" "$SRC/models/lenet/lenet_solver.prototxt"
}
solver 0 > lr0.prototxt
solver 1000 > lrhuge.prototxt
sed -e 's#^net: .*#net: "/nonexistent/net.prototxt"#' "$SRC/models/lenet/lenet_solver.prototxt" \
  > crash.prototxt

model() {  # model NAME SOLVER MAX_ITER [EXTRA]
  printf 'model { name: "%s" solver: "%s" max_iter: %d test_interval: %d test_iter: 5 threads: 1 iters_per_epoch: 10 %s\n  kpi { name: "accuracy" } kpi { name: "train_loss" } }\n' \
    "$1" "$2" "$3" "$3" "${4:-}"
}
expect() {  # expect NAME CODE WANT -- suite text
  local name=$1 code=$2 want=$3
  shift 4
  printf 'repeats: 1\n%s\n' "$*" > "suite-$name.prototxt"
  local out rc
  out=$("$KILN" ce run "suite-$name.prototxt" --db "$WORK/ce.db" --report-dir "$WORK/$name" 2>&1)
  rc=$?
  [ $rc -eq "$code" ] && pass || fail "$name: exit $rc, expected $code: $out"
  case "$out" in *"$want"*) pass ;; *) fail "$name: output lacks '$want': $out" ;; esac
}

expect lr0 2 "is still under the floor 0.5: the model is not learning" -- "$(model lr0 lr0.prototxt 40)"
expect lrhuge 2 "FAIL lrhuge x1 run: NaN or infinite loss" -- "$(model lrhuge lrhuge.prototxt 40)"
expect timeout 2 "timed out" -- "$(model slow "$SRC/models/lenet/lenet_solver.prototxt" 100000 'timeout_seconds: 2')"
expect crash 2 "kiln train failed (exit 1)" -- "$(model crash crash.prototxt 40)"
expect nodata 3 "data set 'nothere' is not in the cache" -- "$(model nodata lr0.prototxt 40 'dataset: "nothere"')"
expect badsuite 3 "unknown field 'flor'" -- 'model { name: "x" solver: "lr0.prototxt" kpi { name: "accuracy" flor: 1 } }'
expect badkpi 3 "unknown KPI 'acuracy'" -- 'model { name: "x" solver: "lr0.prototxt" kpi { name: "acuracy" } }'

# A harness killed outright (SIGKILL: no handler runs) leaves no training behind: the child gets
# SIGTERM when its parent dies.
printf 'repeats: 1\n%s\n' "$(model orphan "$SRC/models/lenet/lenet_solver.prototxt" 100000 'timeout_seconds: 300')" \
  > orphan.prototxt
"$KILN" ce run orphan.prototxt --db "$WORK/ce.db" --report-dir "$WORK/orphan" >/dev/null 2>&1 &
ce=$!
for i in $(seq 100); do  # the training has started when its log exists
  compgen -G "$WORK/orphan/runs/*/train.log" >/dev/null && break
  sleep 0.1
done
child=$(pgrep -P $ce | head -n 1)
[ -n "$child" ] && pass || fail "the CE run started no training"
kill -KILL $ce
wait $ce 2>/dev/null
for i in $(seq 50); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
kill -0 "$child" 2>/dev/null && { fail "the training outlived its killed harness"; kill -KILL "$child"; } || pass

# kiln ce stability: one model of a suite N times, the spread of each KPI
printf 'model { name: "st" solver: "lr0.prototxt" max_iter: 20 test_interval: 20 test_iter: 2 threads: 1\n  kpi { name: "accuracy" floor: 0 } kpi { name: "duration_s" } }\n' > stab.prototxt
out=$("$KILN" ce stability st --suite stab.prototxt --times 2 --report-dir "$WORK/stab" 2>/dev/null)
rc=$?
[ $rc -eq 0 ] && pass || fail "stability: exit $rc: $out"
echo "$out" | grep -Eq '^accuracy +1 +2 ' && echo "$out" | grep -Eq '^duration_s +1 +2 ' && pass \
  || fail "stability table: $out"

# the history holds the failed runs too, and a killed CE run would not have disturbed it
[ -s ce.db ] && pass || fail "history"
# --warn-only reports but exits 0
printf 'repeats: 1\n%s\n' "$(model lr0 lr0.prototxt 40)" > warn.prototxt
"$KILN" ce run warn.prototxt --db "$WORK/ce.db" --report-dir "$WORK/warn" --warn-only >/dev/null 2>&1 \
  && pass || fail "--warn-only exit"
finish
