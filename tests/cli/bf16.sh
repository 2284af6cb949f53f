# bf16 mixed precision from the command line (docs/architecture.md, "bf16"): LeNet trains in bf16
# on Fashion-MNIST to the fp32 run's test accuracy (within 0.02 after 300 iterations) with other
# bits than fp32's; the solver's `precision: BF16` and `--precision bf16` give the same bits,
# `--precision fp32` overrides the solver's field; a bf16 run resumed from its snapshot ends on
# the uninterrupted run's weights bit for bit; and where the CPU has no bf16 kernels (forced
# here by holding oneDNN to AVX512_CORE, DNNL_MAX_CPU_ISA) bf16 is refused naming the feature,
# for train, test and time alike, as is an unknown precision. Skips (77) on a CPU without
# AVX512_BF16 or AMX-BF16, after checking that bf16 is refused there.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }
NET="$SRC/models/lenet/lenet_train_test.prototxt"
mk() {  # mk PREFIX ITERS [EXTRA LINE]: LeNet's solver, tests at the end, a snapshot every 150
  sed -e "s#^net: .*#net: \"$NET\"#" -e "s#^max_iter: .*#max_iter: $2#" -e "s#^snapshot: .*#snapshot: 150#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$1\"#" -e "s#^test_interval: .*#test_interval: 300#" \
      -e "s#^test_iter: .*#test_iter: 20#" -e "s#^display: .*#display: 50#" \
      "$SRC/models/lenet/lenet_solver.prototxt"
  [ -n "${3:-}" ] && echo "$3"
  return 0
}
refuse() {  # the forced refusal of each command
  expect_error "train refused" "AVX512_BF16" -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$KILN" train --solver fp32.prototxt --precision bf16
  expect_error "solver field refused" "AVX512_BF16" -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$KILN" train --solver field.prototxt
  expect_error "time refused" "AVX512_BF16" -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$KILN" time --model "$NET" --iterations 1 --precision bf16
  expect_error "test refused" "AVX512_BF16" -- env DNNL_MAX_CPU_ISA=AVX512_CORE KILN_PRECISION=bf16 "$KILN" test --model "$NET" --iterations 1
  [ -z "$(ls ./*.caffemodel ./*.solverstate 2>/dev/null)" ] && pass || fail "a refused run left files: $(ls)"
}
mk "$WORK/f32" 300 > fp32.prototxt
mk "$WORK/fld" 300 "precision: BF16" > field.prototxt
expect_error "unknown precision" "unknown precision 'fp16' (fp32, bf16)" -- "$KILN" train --solver fp32.prototxt --precision fp16
expect_error "bad KILN_PRECISION" "KILN_PRECISION: unknown precision" -- env KILN_PRECISION=half "$KILN" time --model "$NET" --iterations 1
if ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  expect_error "no bf16 CPU" "AVX512_BF16" -- "$KILN" time --model "$NET" --iterations 1 --precision bf16
  echo "SKIP: this CPU has neither AVX512_BF16 nor AMX-BF16 (bf16 is refused, as checked)" >&2
  finish
  [ "$FAILS" -eq 0 ] && exit 77 || exit 1
fi
refuse
train() {  # train NAME SOLVER ARGS...
  local name=$1 solver=$2
  shift 2
  "$KILN" train --solver "$solver" --threads 2 --metrics "$name.jsonl" "$@" > "$name.log" 2>&1 \
    && pass || fail "$name: $(tail -3 "$name.log")"
}
train fp32 fp32.prototxt
mk "$WORK/b16" 300 > b16.prototxt
train bf16 b16.prototxt --precision bf16
train field field.prototxt
mk "$WORK/over" 300 "precision: BF16" > over.prototxt
train over over.prototxt --precision fp32
grep -q "precision bf16" bf16.log && pass || fail "the bf16 run does not say so: $(head -5 bf16.log)"
acc() { grep '"event":"test"' "$1.jsonl" | tail -n 1 | sed -n 's/.*"accuracy":\([-0-9.e]*\).*/\1/p'; }
a32=$(acc fp32) a16=$(acc bf16)
awk -v a="$a32" -v b="$a16" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0.7 && d <= 0.02) }' \
  && pass || fail "test accuracy: fp32 $a32, bf16 $a16 (want within 0.02, above 0.7)"
cmp -s f32_iter_300.caffemodel b16_iter_300.caffemodel && fail "bf16 and fp32 weights are the same bits" || pass
cmp -s b16_iter_300.caffemodel fld_iter_300.caffemodel && pass || fail "precision: BF16 and --precision bf16 differ"
cmp -s f32_iter_300.caffemodel over_iter_300.caffemodel && pass || fail "--precision fp32 did not override precision: BF16"
# exact resume in bf16, from the snapshot at 150
mk "$WORK/res" 300 > res.prototxt
"$KILN" train --solver res.prototxt --snapshot b16_iter_150.solverstate --threads 2 --precision bf16 > res.log 2>&1 \
  && pass || fail "resume: $(tail -3 res.log)"
cmp -s b16_iter_300.caffemodel res_iter_300.caffemodel && pass || fail "the resumed bf16 run ends elsewhere"
# kiln test and time in bf16
"$KILN" test --model "$NET" --weights b16_iter_300.caffemodel --iterations 5 --precision bf16 > t.log 2>&1 \
  && grep -q "accuracy" t.log && pass || fail "kiln test in bf16: $(tail -3 t.log)"
"$KILN" time --model "$NET" --iterations 2 --precision bf16 > time.log 2>&1 && pass || fail "kiln time in bf16: $(tail -3 time.log)"
finish
