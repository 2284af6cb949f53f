# The ImageNet training nets of the zoo (models/{alexnet,googlenet,resnet50}/train_val.prototxt
# and solver.prototxt) train on the synthetic set of scripts/make-tiny-imagenet: each net as
# committed, with only its data paths (source, root_folder) and batch sizes rewritten to read the
# tiny set in batches of 2 (ResNet-50 trains on 4), and each solver with its iterations cut to 2
# and a test pass at the end. Slow (a minute or more on a busy 2-core machine): the three nets
# take 1.5 (AlexNet) to 3.9 (ResNet-50) GFLOP an image forward.
# The nets must build with the published parameter counts and the crops' shapes, the training
# and test losses must be finite and short of the softmax's saturation, and the test pass must
# report top-1 and top-5 accuracy for every classifier (GoogLeNet's two auxiliary ones too).
source "$(dirname "$0")/lib.bash"
cd "$WORK"
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
TEST_BATCH=2
TEST_ITER=2 # the test pass reads 4 of the 20 validation images
need "make-tiny-imagenet" -- "$SRC/scripts/make-tiny-imagenet" tiny --classes 10 --train 2 --val 2 || { finish; exit 1; }
[ "$(wc -l < tiny/train.txt)" -eq 20 ] && [ "$(wc -l < tiny/val.txt)" -eq 20 ] && [ -s tiny/train/c09/0001.png ] \
  && pass || fail "make-tiny-imagenet: not the 20 + 20 images asked for"

# run MODEL CROP PARAMS EFFECTIVE_BATCH TRAIN_BATCH CLASSIFIER... (each PREFIX:LOSS_WEIGHT; prefix
# '-': none)
run() {
  local model=$1 crop=$2 params=$3 batch=$4 train_batch=$5
  shift 5
  local dir="$WORK/$model"
  mkdir -p "$dir"
  # the TRAIN layer's batch_size comes first, the TEST layer's second
  sed -E "s#\\\$KILN_DATA/ilsvrc12/#$WORK/tiny/#" "$SRC/models/$model/train_val.prototxt" \
    | awk -v tb="$train_batch" -v eb="$TEST_BATCH" \
      '/batch_size: [0-9]+/ { sub(/batch_size: [0-9]+/, "batch_size: " (n++ ? eb : tb)) } 1' > "$dir/train_val.prototxt"
  # Nothing but those lines may differ from the committed net.
  local keep='source:|root_folder:|batch_size:'
  if diff <(grep -Ev "$keep" "$SRC/models/$model/train_val.prototxt") <(grep -Ev "$keep" "$dir/train_val.prototxt") >/dev/null \
    && [ "$(diff "$SRC/models/$model/train_val.prototxt" "$dir/train_val.prototxt" | grep -c '^>')" -eq 6 ]; then
    pass
  else
    fail "$model: the rewrite changed more than the 2 x 3 data lines"
  fi
  # The solver as committed, but 2 iterations with a test pass after them and no snapshot, and
  # the learning rate scaled by the batch (TRAIN_BATCH against the model's EFFECTIVE_BATCH) so
  # that a step moves the weights as far per image as the real schedule's first steps do.
  local lr
  lr=$(sed -nE 's/^base_lr: *([0-9.e-]+).*/\1/p' "$SRC/models/$model/solver.prototxt")
  sed -E -e "s#^net: .*#net: \"train_val.prototxt\"#" -e "s#^base_lr: .*#base_lr: $(python3 -c "print($lr * $train_batch / $batch)")#" \
    -e 's#^max_iter: .*#max_iter: 2#' -e "s#^test_iter: .*#test_iter: $TEST_ITER#" -e 's#^test_interval: .*#test_interval: 2#' \
    -e 's#^display: .*#display: 1#' -e 's#^snapshot: .*#snapshot: 0#' -e 's#^iter_size: .*#iter_size: 1#' \
    -e '/^test_initialization:/d' "$SRC/models/$model/solver.prototxt" > "$dir/solver.prototxt"
  printf 'test_initialization: false\nsnapshot_after_train: false\n' >> "$dir/solver.prototxt"
  [ "$(grep -cE '^(max_iter: 2|test_interval: 2|snapshot: 0|base_lr: [0-9])' "$dir/solver.prototxt")" -eq 4 ] \
    || { fail "$model: the solver lacks a line the test cuts: $(cat "$dir/solver.prototxt")"; return; }

  local out
  out=$("$KILN" describe --model "$dir/train_val.prototxt" --phase TRAIN 2>&1)
  echo "$out" | grep -Eq "^data +ImageData +${train_batch}x3x${crop}x${crop} " && pass \
    || fail "$model: TRAIN data not ${train_batch}x3x${crop}x${crop}: $(echo "$out" | grep -E '^data ')"
  echo "$out" | grep -Eq "^total: $params parameters" && pass \
    || fail "$model: not $params parameters: $(echo "$out" | grep -E '^total')"
  out=$("$KILN" describe --model "$dir/train_val.prototxt" --phase TEST 2>&1)
  echo "$out" | grep -Eq "^data +ImageData +${TEST_BATCH}x3x${crop}x${crop} " && pass \
    || fail "$model: TEST data not ${TEST_BATCH}x3x${crop}x${crop}: $(echo "$out" | grep -E '^data ')"

  echo "$model:"
  if ! "$KILN" train --solver "$dir/solver.prototxt" --metrics "$dir/m.jsonl" > "$dir/log.txt" 2>&1; then
    fail "$model: training failed: $(tail -5 "$dir/log.txt")"
    return
  fi
  python3 - "$dir/m.jsonl" "$TEST_BATCH" "$TEST_ITER" "$@" <<'PY' && pass || fail "$model: $(cat "$dir/m.jsonl")"
import json, math, sys
events = [json.loads(line) for line in open(sys.argv[1])]
batch, test_iter = int(sys.argv[2]), int(sys.argv[3])
classifiers = [(p.split(":")[0].lstrip("-"), float(p.split(":")[1])) for p in sys.argv[4:]]
# kiln clamps the softmax loss at -log(FLT_MIN) = 87.34: a net at that figure has saturated.
ok = lambda loss: loss is not None and math.isfinite(loss) and 0 < loss < 87
train = [e for e in events if e["event"] == "train"]
assert [e["iter"] for e in train] == [0, 1], train
assert all(ok(e["loss"]) for e in train), train
tests = [e for e in events if e["event"] == "test"]
assert len(tests) == 1 and tests[0]["iter"] == 2, tests
t, images = tests[0], batch * test_iter
for p, _ in classifiers:
    assert ok(t[p + "loss"]), (p, t)
    top1, top5 = t[p + "top-1"], t[p + "top-5"]
    # accuracies are counts of the test images: whole multiples of 1/images
    for a in (top1, top5):
        assert 0 <= a <= 1 and abs(a * images - round(a * images)) < 1e-4, (p, a)
    assert top5 >= top1, (p, top1, top5)
# the test pass's loss is the net's: each classifier's loss times its weight
total = sum(w * t[p + "loss"] for p, w in classifiers)
assert abs(t["loss"] - total) < 1e-4 * total, (t["loss"], total)
print("  train loss", " ".join(f"{e['loss']:.4f}" for e in train), " test",
      " ".join(f"{k} {v:.4g}" for k, v in t.items() if "loss" in k or "top-" in k))
PY
}

# Parameter counts: AlexNet and ResNet-50 train with their deploy nets' parameters (60,965,224;
# 25,610,205 with BatchNorm's statistics, zoo_deploy.sh). GoogLeNet adds its two auxiliary
# classifiers to the deploy net's 6,998,552: a 1x1 convolution of 128 (512 * 128 + 128 = 65,664
# on 4a, 528 * 128 + 128 = 67,712 on 4d), fc 1024 on 128 x 4 x 4 (2,048 * 1,024 + 1,024 =
# 2,098,176) and fc 1000 (1,024 * 1,000 + 1,000 = 1,025,000): 3,188,840 + 3,190,888, so
# 13,378,280.
# ResNet-50 trains on 4 images a batch: from BatchNorm's statistics of batches of 2 its TEST pass
# saturates (loss 87.3 after 2 iterations, 43.8 after 6; 9.3 after 2 iterations of 4).
# GoogLeNet's auxiliary losses count 0.3 each, the main one 1 (Caffe's default).
run alexnet 227 60965224 256 2 -:1
run googlenet 224 13378280 32 2 loss1/:0.3 loss2/:0.3 loss3/:1
run resnet50 224 25610205 256 4 -:1
finish
