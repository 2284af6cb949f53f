# SSD300 (models/ssd300: ssd300_train_test.prototxt and ssd300_solver.prototxt, the SSD fork's
# ssd_pascal.py layout on VGG-16) builds and trains 2 iterations, with a test pass reporting a
# finite mAP, on data from the cache's synthetic shapes-det set, in two ways:
#   - VOC's 21 classes, the net as committed: a voc2007 entry (`kiln data fetch voc2007 --from`)
#     from two tars laid out as VOC 2007's, of 4 + 4 shapes-det images whose classes are renamed
#     to VOC's (disc: dog, square: tvmonitor, triangle: aeroplane, cross: person), so that the
#     net reads `$KILN_DATA/voc2007/` as committed; only its two batch_size lines are rewritten;
#   - shapes-det's 5 classes (the background and 4 shapes): the data sources, label map and
#     name-size file moved to `$KILN_DATA/shapes-det/`, num_classes 21 -> 5 wherever it appears
#     (MultiBoxLoss, the Reshape before the softmax, DetectionOutput, DetectionEvaluate) and with
#     it the confidence heads' outputs (classes x priors a cell: 84 -> 20, 126 -> 30), and the
#     batch sizes; nothing else may differ from the committed net.
# Each net must build with the parameters summed from the layers' shapes (ssd300.bash:
# 26,285,486 for 21 classes, 24,146,894 for 5), the heads' shapes at a batch of 2 and 8,732
# priors; its solver runs as committed but for 2 iterations, a test pass of 2 batches of 2 and
# the learning rate scaled to the batch of 2 (0.001 x 2 / 32). Slow: SSD300 takes 63 GFLOP an
# image forward (about 12 s for each net's 2 iterations and test pass on a busy 2-core machine).
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/ssd300.bash"
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
export KILN_DATA="$WORK/cache"
NET="$SRC/models/ssd300/ssd300_train_test.prototxt"
need "fetch shapes-det" -- "$KILN" data fetch shapes-det || { finish; exit 1; }
E=cache/shapes-det

# ---- a voc2007 entry of shapes-det images ------------------------------------------------------
source "$SRC/tests/cli/voc.bash"
voc_tree tv trainval 000001 000002 000003 000004
tar cf VOCtrainval_06-Nov-2007.tar -C tv VOCdevkit
voc_tree te test 004001 004002 004003 004004
tar cf VOCtest_06-Nov-2007.tar -C te VOCdevkit
need "fetch voc2007" -- "$KILN" data fetch voc2007 --from VOCtrainval_06-Nov-2007.tar --from VOCtest_06-Nov-2007.tar \
  || { finish; exit 1; }
[ -d cache/voc2007/trainval_lmdb ] && [ -d cache/voc2007/test_lmdb ] && [ "$(wc -l < cache/voc2007/test_name_size.txt)" = 4 ] \
  && pass || fail "voc2007 entry: $(ls cache/voc2007)"

# ---- the nets ----------------------------------------------------------------------------------
mkdir -p voc shapes
# VOC's 21 classes: the batch sizes alone (the TRAIN layer's first, the TEST layer's second)
awk '/batch_size: [0-9]+/ { sub(/batch_size: [0-9]+/, "batch_size: 2") } 1' "$NET" > voc/train_test.prototxt
[ "$(diff "$NET" voc/train_test.prototxt | grep '^>' | tr -s ' ')" = "> batch_size: 2
> batch_size: 2" ] && pass || fail "voc: the rewrite changed more than the 2 batch sizes: $(diff "$NET" voc/train_test.prototxt)"

# shapes-det's 5 classes: each confidence head (a Convolution named *_mbox_conf) gives 5 / 21 of
# its outputs.
awk '
  /^layer \{ name: "/ { split($0, q, "\""); layer = q[2] }
  { gsub(/\$KILN_DATA\/voc2007\//, "$KILN_DATA/shapes-det/") }
  /batch_size: [0-9]+/ { sub(/batch_size: [0-9]+/, "batch_size: 2") }
  { sub(/num_classes: 21 /, "num_classes: 5 "); sub(/ dim: 21 }/, " dim: 5 }") }
  layer ~ /_mbox_conf$/ && match($0, /num_output: [0-9]+ /) {
    n = substr($0, RSTART + 12, RLENGTH - 13)
    sub(/num_output: [0-9]+ /, "num_output: " (n / 21 * 5) " ")
  }
  1' "$NET" > shapes/train_test.prototxt
# Nothing but those lines may differ: 2 sources, 2 batch sizes, 2 label maps, DetectionEvaluate's
# line (its num_classes and name_size_file), MultiBoxLoss's and DetectionOutput's num_classes,
# the Reshape's dim, and the 6 confidence heads: 16 lines; and those lines say what they must.
keep='source:|batch_size:|label_map_file:|num_classes:|dim: 21 }|dim: 5 }|convolution_param \{ num_output: (84|126|20|30) '
if diff <(grep -Ev "$keep" "$NET") <(grep -Ev "$keep" shapes/train_test.prototxt) >/dev/null \
  && [ "$(diff "$NET" shapes/train_test.prototxt | grep -c '^>')" = 16 ] \
  && [ "$(grep -c 'KILN_DATA/shapes-det/' shapes/train_test.prototxt)" = 5 ] \
  && ! grep -q 'KILN_DATA/voc2007\|num_classes: 21\|dim: 21 ' shapes/train_test.prototxt \
  && [ "$(grep -Ec 'convolution_param \{ num_output: 20 ' shapes/train_test.prototxt)" = 3 ] \
  && [ "$(grep -Ec 'convolution_param \{ num_output: 30 ' shapes/train_test.prototxt)" = 3 ]; then
  pass
else
  fail "shapes: the rewrite is not the 16 lines: $(diff "$NET" shapes/train_test.prototxt)"
fi

# The solver as committed, but 2 iterations with a test pass of 2 batches after them and no
# snapshot, and the learning rate scaled to the batch (2 against 32).
for d in voc shapes; do
  sed -E -e 's#^net: .*#net: "train_test.prototxt"#' -e "s#^base_lr: .*#base_lr: $(python3 -c 'print(0.001 * 2 / 32)')#" \
    -e 's#^max_iter: .*#max_iter: 2#' -e 's#^test_iter: .*#test_iter: 2#' -e 's#^test_interval: .*#test_interval: 2#' \
    -e 's#^display: .*#display: 1#' -e 's#^snapshot: .*#snapshot: 0#' \
    "$SRC/models/ssd300/ssd300_solver.prototxt" > $d/solver.prototxt
  echo 'snapshot_after_train: false' >> $d/solver.prototxt
  [ "$(grep -cE '^(max_iter: 2|test_iter: 2|test_interval: 2|snapshot: 0|base_lr: 6.25e-05|eval_type: "detection")$' $d/solver.prototxt)" = 6 ] \
    && pass || fail "$d: the solver lacks a line the test cuts: $(cat $d/solver.prototxt)"
done

# run DIR CLASSES: describe the net in both phases, then train it
run() {
  local d=$1 classes=$2 out pat params
  params=$(ssd300_params "$classes")
  out=$("$KILN" describe --model $d/train_test.prototxt --phase TRAIN 2>&1) || { fail "$d: describe TRAIN: $out"; return; }
  while read -r pat; do
    echo "$out" | grep -Eq "$pat" && pass || fail "$d TRAIN: no line matching '$pat'"
  done < <(ssd300_head_lines 2 "$classes"
    printf '%s\n' '^data +AnnotatedData +2x3x300x300 ' '^mbox_loss +MultiBoxLoss +scalar ' "^total: $params parameters")
  out=$("$KILN" describe --model $d/train_test.prototxt --phase TEST 2>&1) || { fail "$d: describe TEST: $out"; return; }
  while read -r pat; do
    echo "$out" | grep -Eq "$pat" && pass || fail "$d TEST: no line matching '$pat'"
  done < <(printf '%s\n' '^data +AnnotatedData +2x3x300x300 ' "^mbox_conf_reshape +Reshape +2x8732x$classes " \
    '^detection_out +DetectionOutput +1x1x400x7 ' '^detection_eval +DetectionEvaluat' "^total: $params parameters")
  echo "$out" | grep -q MultiBoxLoss && fail "$d: a MultiBoxLoss in TEST" || pass

  echo "$d ($classes classes, $params parameters):"
  if ! (cd $d && "$KILN" train --solver solver.prototxt --metrics m.jsonl > log.txt 2>&1); then
    fail "$d: training failed: $(tail -n 5 $d/log.txt)"
    return
  fi
  python3 - $d/m.jsonl <<'PY' && pass || fail "$d: $(cat $d/m.jsonl)"
import json, math, sys
events = [json.loads(line) for line in open(sys.argv[1])]
train = [e for e in events if e["event"] == "train"]
assert [e["iter"] for e in train] == [0, 1], train
# MultiBoxLoss: the matched priors' smooth L1 and softmax losses, normalised by the matches
assert all(math.isfinite(e["loss"]) and 0 < e["loss"] < 100 and e["mbox_loss"] > 0 for e in train), train
tests = [e for e in events if e["event"] == "test"]
assert len(tests) == 1 and tests[0]["iter"] == 2, tests
t = tests[0]
assert math.isfinite(t["mAP"]) and 0 <= t["mAP"] <= 1, t
assert not any(k.startswith("detection_eval") for k in t), t
print("  train loss", " ".join(f"{e['loss']:.4f}" for e in train), f" test mAP {t['mAP']:.4g}")
PY
}
run voc 21
run shapes 5
finish
