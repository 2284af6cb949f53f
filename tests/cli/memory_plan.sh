# Memory plans with activation data shared by lifetime (the default) and without
# (KILN_SHARE_DATA=0), as docs/architecture.md and docs/PERF.md give them: ResNet-50's training
# net at batch 32 (bench/trainable-net on the deploy net), where the sums' inputs die in forward,
# and forward-only TEST nets, where every activation and layer buffer lives only while forward
# needs it. Planned, not allocated: a --max-memory of 1 MiB refuses each net with its total.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
python3 "$SRC/bench/trainable-net" "$SRC/models/resnet50/deploy.prototxt" 32 > r50.prototxt ||
  fail "bench/trainable-net resnet50"
plan() {  # plan MODEL PHASE PATTERN [KILN_SHARE_DATA value]
  local msg
  msg=$(KILN_SHARE_DATA=${4-} "$KILN" describe --max-memory 1M --model "$1" --phase "$2" 2>&1) &&
    fail "$1 ($2) was not refused"
  echo "$msg" | grep -Eq "$3" && pass || fail "$1 ($2): '$msg' does not match '$3'"
}
plan r50.prototxt TRAIN "needs 3.14 GiB .* activations: 1.53 GiB"
plan r50.prototxt TRAIN "needs 3.88 GiB .* activations: 2.27 GiB" 0
plan r50.prototxt TEST "needs 650.8 MiB .* activations: 312.4 MiB"
plan r50.prototxt TEST "needs 3.88 GiB .* activations: 2.27 GiB" 0
plan "$SRC/bench/nets/densenet40.prototxt" TEST "needs 84.3 MiB .* activations: 55.3 MiB"
# VGG-16's training net at batch 16: its Winograd convolutions at 112x112 run in chunks of the
# batch, which takes the shared workspace from 449.8 to 235.3 MiB (src/ops/conv_dnnl.c)
python3 "$SRC/bench/trainable-net" "$SRC/models/vgg16/deploy.prototxt" 16 > vgg16.prototxt ||
  fail "bench/trainable-net vgg16"
plan vgg16.prototxt TRAIN "needs 2.65 GiB .* activations: 1.30 GiB"
plan "$SRC/bench/nets/densenet40.prototxt" TEST "needs 606.8 MiB .* activations: 388.9 MiB" 0
# kiln time runs backward passes training would not, so it builds with every blob's own data
# (the TEST net above would refuse them): it times the TEST phase of a small net
"$KILN" time --model "$SRC/bench/nets/lenet.prototxt" --phase TEST --iterations 1 \
  > time.txt 2>&1 && pass || fail "kiln time --phase TEST: $(tail -3 time.txt)"
finish
