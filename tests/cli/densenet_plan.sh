# DenseNet-BC nets (scripts/gen-deploy-nets.py) build with the map sizes and parameter counts
# worked out by hand, and their memory plans are the figures docs/PERF.md gives: the plain plan
# (every activation kept: KILN_RECOMPUTE=0 KILN_SHARE_DATA=0), recomputation in backward alone
# (KILN_SHARE_DATA=0), and the default, recomputation with activation data shared by lifetime.
# Depth 100 and 160 are planned, not allocated: a --max-memory of 1 MiB refuses them with the
# planned total.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
# Parameters, growth k = 12, L = (depth - 4) / 6 bottleneck layers a block: conv0 9 * 24; a
# bottleneck on c channels: BatchNorm 2c + 1 (mean, variance, factor), Scale 2c, 1x1 conv c * 48,
# BatchNorm 97, Scale 96, 3x3 conv 48 * 12 * 9; a transition on c: 2c + 1, 2c and c * c/2; the
# final BatchNorm and Scale on c: 4c + 1; fc c * 10 + 10. Depth 40 (c = 132 at the end): 175,690
# learnable + 5,127 statistics = 180,817; depth 100: 768,730 + 24,087; depth 160: 1,738,570 +
# 56,247.
out=$(KILN_RECOMPUTE=0 KILN_SHARE_DATA=0 "$KILN" describe --model "$SRC/bench/nets/densenet40.prototxt") ||
  fail "describe densenet40"
for pat in '^b1_6_concat +Concat +64x96x28x28 ' '^trans1_pool +Pooling +64x48x14x14 ' \
  '^b2_6_concat +Concat +64x120x14x14 ' '^trans2_pool +Pooling +64x60x7x7 ' '^b3_6_concat +Concat +64x132x7x7 ' \
  '^pool +Pooling +64x132x1x1 ' '^total: 180817 parameters' \
  '^memory: 606.8 MiB = .* activations 388.9 MiB \+ buffers 188.9 MiB \+ workspace 27.6 MiB'; do
  echo "$out" | grep -Eq "$pat" && pass || fail "densenet40: no line matching '$pat'"
done
out=$(KILN_SHARE_DATA=0 "$KILN" describe --model "$SRC/bench/nets/densenet40.prototxt") || fail "describe densenet40"
echo "$out" | grep -Eq '^memory: 359.3 MiB = .* activations 239.6 MiB \+ buffers 90.7 MiB \+ workspace 27.6 MiB' &&
  pass || fail "densenet40 with recomputation: $(echo "$out" | tail -1)"
out=$("$KILN" describe --model "$SRC/bench/nets/densenet40.prototxt") || fail "describe densenet40"
echo "$out" | grep -Eq '^memory: 338.3 MiB = .* activations 218.6 MiB \+ buffers 90.7 MiB \+ workspace 27.6 MiB' &&
  pass || fail "densenet40 with recomputation and shared data: $(echo "$out" | tail -1)"
plan() {  # plan DEPTH PATTERN [KILN_RECOMPUTE value] [KILN_SHARE_DATA value]
  local msg
  msg=$(KILN_RECOMPUTE=${3-} KILN_SHARE_DATA=${4-} "$KILN" describe --max-memory 1M \
    --model "$SRC/bench/nets/densenet$1.prototxt" 2>&1) && fail "densenet$1 was not refused"
  echo "$msg" | grep -Eq "$2" && pass || fail "densenet$1: '$msg' does not match '$2'"
}
plan 100 "needs 2.41 GiB .* activations: 1.57 GiB" 0 0
plan 160 "needs 5.35 GiB .* activations: 3.50 GiB" 0 0
plan 100 "needs 884.6 MiB .* activations: 582.0 MiB" "" 0
plan 160 "needs 1.38 GiB .* activations: 924.4 MiB" "" 0
plan 100 "needs 829.2 MiB .* activations: 526.6 MiB"
plan 160 "needs 1.29 GiB .* activations: 834.6 MiB"
finish
