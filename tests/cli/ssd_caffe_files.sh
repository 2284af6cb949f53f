# The SSD fork's own published SSD300 files (tests/data/ssd: train, test, deploy and solver as its
# ssd_pascal.py writes them, and its VOC label map; README.md there says where each comes from)
# read and build in kiln unchanged. The nets name their data relative to the fork's root, where
# Caffe is run, so the test lays such a root out here: the files copied byte for byte into
# models/VGGNet/VOC0712/SSD_300x300/ and data/VOC0712/, and a tiny VOC set of images drawn here
# written by `kiln convert annoset` with the published label map into the LMDBs the nets name
# (examples/VOC0712/VOC0712_{trainval,test}_lmdb) and the name-size file DetectionEvaluate reads.
# No line of any file is rewritten. Then:
#   - the label map reads: its 21 items, every one of VOC's 20 names given the map's label, and a
#     name it lacks refused naming the map;
#   - deploy.prototxt builds (TEST phase, as Caffe loads a deploy net): the heads' shapes, 8,732
#     priors, the detections of one image and 26,285,486 parameters (summed from the layers'
#     shapes in ssd300.bash), with a warning that DetectionOutput's save_output_param (the
#     script's author's output_directory) is ignored;
#   - train.prototxt (TRAIN, batch 4, MultiBoxLoss) and test.prototxt (TEST, batch 8,
#     DetectionOutput and DetectionEvaluate) build with the same parameters;
#   - the solver reads and builds both nets with `kiln train --check`, and says that its test
#     passes report mAP by eval_type "detection" and ap_version "11point";
#   - `kiln test` runs the test net (random weights, one batch of 8) to an mAP in [0, 1] over
#     VOC's 20 classes, each with the positives of the images read.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/anno.bash"   # anno_tool (tests/support/annoset_tool, for the images), anno_voc
source "$SRC/tests/cli/ssd300.bash" # ssd300_params, ssd300_head_lines
anno_tool
PUB="$SRC/tests/data/ssd"
THEIRS=/home/weiying1 # where the published save_output_param points
[ -e $THEIRS ] && THEIRS_BEFORE=yes || THEIRS_BEFORE=no
FILES="train.prototxt test.prototxt deploy.prototxt solver.prototxt"
(cd "$PUB" && sha256sum --quiet -c SHA256SUMS) && pass || fail "tests/data/ssd: not the published files (SHA256SUMS)"

# ---- the fork's root -------------------------------------------------------------------------
M=models/VGGNet/VOC0712/SSD_300x300
mkdir -p $M data/VOC0712 examples/VOC0712 VOC2007/JPEGImages VOC2007/Annotations
for f in $FILES; do cp "$PUB/$f" $M/; done
cp "$PUB/labelmap_voc.prototxt" data/VOC0712/
MAP=data/VOC0712/labelmap_voc.prototxt

# The label map: 21 items, the background first; VOC's 20 names in its order.
[ "$(grep -c '^item {' $MAP)" = 21 ] && grep -A1 'name: "none_of_the_above"' $MAP | grep -q "label: 0" \
  && pass || fail "labelmap_voc.prototxt: not 21 items from the background: $(cat $MAP)"
mapfile -t NAMES < <(sed -n 's/^  name: "\(.*\)"$/\1/p' $MAP | tail -n +2)
[ ${#NAMES[@]} = 20 ] && pass || fail "labelmap_voc.prototxt: ${#NAMES[@]} class names"
# Five images of 60 x 50 (the first two in gray), four objects each, one a quadrant: image i holds
# classes 4i + 1 .. 4i + 4 of the map, so every name appears once. The fourth box of each is
# difficult. The list is the fork's: IMAGE ANNOTATION, relative to the root.
: > trainval.txt
for i in 0 1 2 3 4; do
  need "image $i" -- "$TOOL" jpeg "VOC2007/JPEGImages/00000$i.jpg" 60 50 "$((i + 1))" $([ $i -lt 2 ] && echo gray)
  anno_voc 60 50 "${NAMES[$((4 * i))]}:0:2,2,28,23" "${NAMES[$((4 * i + 1))]}:0:31,2,58,23" \
    "${NAMES[$((4 * i + 2))]}:0:2,26,28,48" "${NAMES[$((4 * i + 3))]}:1:31,26,58,48" > "VOC2007/Annotations/00000$i.xml"
  echo "VOC2007/JPEGImages/00000$i.jpg VOC2007/Annotations/00000$i.xml" >> trainval.txt
done
need "convert annoset" -- "$KILN" convert annoset trainval.txt ./ examples/VOC0712/VOC0712_trainval_lmdb \
  --label-map $MAP --encoded --shuffle
need "convert annoset (test)" -- "$KILN" convert annoset trainval.txt ./ examples/VOC0712/VOC0712_test_lmdb \
  --label-map $MAP --encoded --name-size data/VOC0712/test_name_size.txt
# Every box read back with its name's label in the map (the i-th name is label i + 1).
"$TOOL" dump examples/VOC0712/VOC0712_test_lmdb > dump.txt || fail "dump: $(cat dump.txt)"
[ "$(awk '$1 == "box" { print $2 }' dump.txt | sort -n | tr '\n' ' ')" = "$(seq 1 20 | tr '\n' ' ')" ] \
  && [ "$(grep -c '^  box .* 1$' dump.txt)" = 5 ] && pass || fail "labels read back: $(cat dump.txt)"
[ "$(cat data/VOC0712/test_name_size.txt | tr '\n' ' ')" = "000000 50 60 000001 50 60 000002 50 60 000003 50 60 000004 50 60 " ] \
  && pass || fail "name-size file: $(cat data/VOC0712/test_name_size.txt)"
anno_voc 60 50 "person:0:2,2,28,23" "earthworks:0:31,2,58,23" > VOC2007/Annotations/unknown.xml
echo "VOC2007/JPEGImages/000000.jpg VOC2007/Annotations/unknown.xml" > unknown.txt
expect_refusal "a name the published map lacks" --want "unknown.txt:1:" \
  --want "'earthworks' is not in the label map $MAP" --gone unknown_lmdb \
  -- "$KILN" convert annoset unknown.txt ./ unknown_lmdb --label-map $MAP

# ---- the nets --------------------------------------------------------------------------------
PARAMS=$(ssd300_params 21)
[ "$PARAMS" = 26285486 ] && pass || fail "ssd300.bash: $PARAMS parameters for 21 classes"
# describe_has NAME PHASE FILE PATTERN...: kiln describe's table holds a line for each pattern
describe_has() {
  local name=$1 phase=$2 file=$3 out pat
  shift 3
  out=$("$KILN" describe --model "$file" --phase "$phase" 2> "$name.err") \
    || { fail "$name: describe failed: $(cat "$name.err")"; return; }
  echo "$out" > "$name.txt"
  for pat in "$@"; do
    echo "$out" | grep -Eq "$pat" && pass || fail "$name: no line matching '$pat'"
  done
}
WARN="layer 'detection_out' (DetectionOutput): save_output_param.output_directory '/home/weiying1/hyg/caffe-code/faster-rcnn/data/VOCdevkit/results/VOC2007/SSD_300x300/Main' is ignored"
mapfile -t HEADS1 < <(ssd300_head_lines 1 21)
describe_has deploy TEST $M/deploy.prototxt "${HEADS1[@]}" '^input +Input +1x3x300x300 ' \
  '^conv4_3_norm +Normalize +1x512x38x38 +512 ' '^fc7 +Convolution +1x1024x19x19 ' \
  '^mbox_conf_reshape +Reshape +1x8732x21 ' '^mbox_conf_flatten +Flatten +1x183372 ' \
  '^detection_out +DetectionOutput +1x1x200x7 ' "^total: $PARAMS parameters"
grep -qF "$WARN" deploy.err && pass || fail "deploy: no warning that save_output_param is ignored: $(cat deploy.err)"
mapfile -t HEADS4 < <(ssd300_head_lines 4 21)
describe_has train TRAIN $M/train.prototxt "${HEADS4[@]}" '^data +AnnotatedData +4x3x300x300 ' \
  '^mbox_loss +MultiBoxLoss +scalar ' "^total: $PARAMS parameters"
mapfile -t HEADS8 < <(ssd300_head_lines 8 21)
describe_has test TEST $M/test.prototxt "${HEADS8[@]}" '^data +AnnotatedData +8x3x300x300 ' \
  '^detection_out +DetectionOutput +1x1x1600x7 ' '^detection_eval +DetectionEvaluat' "^total: $PARAMS parameters"
grep -qF "$WARN" test.err && pass || fail "test: no warning that save_output_param is ignored: $(cat test.err)"
grep -q "MultiBoxLoss" test.txt && fail "test.prototxt built a MultiBoxLoss in TEST" || pass

# ---- the solver ------------------------------------------------------------------------------
# train_net and test_net name the files relative to the root, as the fork runs `caffe train`
out=$("$KILN" train --solver $M/solver.prototxt --check 2> check.err) || fail "solver --check: $(cat check.err)"
[ "$out" = "$M/solver.prototxt: read (SGD), train net and 1 test net built; not trained (--check)
$M/solver.prototxt: test passes report mAP (eval_type: detection, ap_version: 11point)" ] && pass \
  || fail "solver --check said: $out"
grep -q "^total: $PARAMS parameters" check.err && grep -qF "$WARN" check.err && pass \
  || fail "solver --check: the train net's table or the warning missing: $(grep -v '^[a-z0-9_]* ' check.err)"

# ---- the test net runs -----------------------------------------------------------------------
# One batch of the 5 test images (8: the stream wraps to images 0 to 2 again), random weights.
# As the fork's, the mAP is over every class but the background, 20, each with the positives of
# the batch: class k is image (k - 1) / 4's object (k - 1) % 4, whose fourth object is difficult
# (no positive); images 0 to 2 are read twice.
out=$("$KILN" test --model $M/test.prototxt --iterations 1 --ap-version 11point 2> kt.err) \
  || fail "kiln test: $(tail -n 3 kt.err)"
echo "$out" | awk '/^mAP = / { m = $3 + 0; ok = (m >= 0 && m <= 1) } END { exit !ok }' \
  && echo "$out" | grep -q "11point average precision over 20 classes" && pass || fail "kiln test: $out"
want=$(for k in $(seq 1 20); do
  i=$(((k - 1) / 4)) o=$(((k - 1) % 4))
  echo "class $k: $([ $o = 3 ] && echo 0 || { [ $i -lt 3 ] && echo 2 || echo 1; }) positives"
done)
[ "$(echo "$out" | sed -n 's/^\(class [0-9]*:\) AP [0-9.]* (\([0-9]*\) positives)$/\1 \2 positives/p')" = "$want" ] \
  && pass || fail "kiln test's classes: $out"

# Nothing was written where save_output_param points, and the files are as published.
{ [ $THEIRS_BEFORE = yes ] || [ ! -e $THEIRS ]; } && pass || fail "$THEIRS made"
for f in $FILES; do cmp -s "$PUB/$f" "$M/$f" && pass || fail "$f changed"; done
finish
