# The detection path on the command line, on the zoo's small SSD (models/ssd, as committed) and
# the cache's shapes-det set fetched into a private cache:
#   - kiln train --check says the solver's test figure; 40 iterations of training with one test
#     pass at 40 over 8 batches of 25 images: the metrics' test event carries a finite mAP in
#     [0, 1] and no figure of the DetectionEvaluate output's own;
#   - kiln test of the snapshot over the same 8 batches: "mAP = " and one "class N: AP" line for
#     each of the 4 classes, each with the positives counted here from the 200 images'
#     annotations (their objects that are not difficult), the 11point mAP the training's test
#     pass gave; the three ap_versions' figures all in [0, 1], each mAP the mean of its classes'
#     APs, and MaxIntegral's AP at least Integral's for every class (VOC2012's precision is the
#     envelope of the precisions that Integral sums: true by definition);
#   - refused, naming the field: ap_version "12point"; eval_type "detection" on a solver whose
#     test net has no DetectionEvaluate; eval_type "segmentation"; kiln test --ap-version bogus;
#     and a label_map_file with two items of one label, naming the file and the item's line.
# (Two workers against one with iter_size 2 on models/ssd: mpi_ssd.sh.)
source "$(dirname "$0")/lib.bash"
cd "$WORK"
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
export KILN_DATA="$WORK/cache"
Z="$SRC/models/ssd"
need "fetch shapes-det" -- "$KILN" data fetch shapes-det || { finish; exit 1; }

# The zoo's solver on the committed net: 40 iterations, a test pass at 40 over 8 batches, the
# final snapshot here.
sed -e "s#^net: .*#net: \"$Z/ssd_train_test.prototxt\"#" -e 's#^max_iter: .*#max_iter: 40#' \
  -e 's#^test_iter: .*#test_iter: 8#' -e 's#^test_interval: .*#test_interval: 40#' -e 's#^display: .*#display: 10#' \
  -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/ssd\"#" "$Z/ssd_solver.prototxt" > solver.prototxt
[ "$(grep -cE '^(max_iter: 40|test_iter: 8|test_interval: 40|eval_type: "detection"|ap_version: "11point")$' solver.prototxt)" = 5 ] \
  && pass || fail "the solver lacks a line the test cuts: $(cat solver.prototxt)"
out=$("$KILN" train --solver solver.prototxt --check 2>/dev/null) \
  && [ "$(echo "$out" | tail -n 1)" = "solver.prototxt: test passes report mAP (eval_type: detection, ap_version: 11point)" ] \
  && pass || fail "train --check: $out"

"$KILN" train --solver solver.prototxt --metrics m.jsonl > train.log 2>&1 || fail "training: $(tail -n 5 train.log)"
[ -f ssd_iter_40.caffemodel ] && pass || fail "no snapshot at 40: $(ls)"
python3 - m.jsonl <<'PY' && pass || fail "metrics: $(cat m.jsonl)"
import json, math, sys
events = [json.loads(line) for line in open(sys.argv[1])]
train = [e for e in events if e["event"] == "train"]
assert [e["iter"] for e in train] == [0, 10, 20, 30], train
assert all(math.isfinite(e["loss"]) and e["loss"] > 0 for e in train), train
tests = [e for e in events if e["event"] == "test"]
assert len(tests) == 1 and tests[0]["iter"] == 40, tests
t = tests[0]
assert isinstance(t["mAP"], float) and math.isfinite(t["mAP"]) and 0 <= t["mAP"] <= 1, t
assert not any(k.startswith("detection_eval") for k in t), t
print(f"training: loss {train[0]['loss']:.3f} at 0, {train[-1]['loss']:.3f} at 30; test mAP {t['mAP']:.4f} at 40")
PY

# The positives of the 8 x 25 test images: their objects that are not difficult, by class
# (the test LMDB holds the test list's images in order).
E=cache/shapes-det
python3 - "$E" > positives.txt <<'PY'
import sys, xml.etree.ElementTree as ET
root = sys.argv[1]
labels = {"disc": 1, "square": 2, "triangle": 3, "cross": 4}
count = {k: 0 for k in labels.values()}
for line in open(f"{root}/test.txt").readlines()[:200]:
    for o in ET.parse(f"{root}/{line.split()[1]}").getroot().iter("object"):
        if o.findtext("difficult", "0").strip() == "0":
            count[labels[o.findtext("name")]] += 1
for label in sorted(count):
    print(label, count[label])
PY
[ "$(grep -c '^item {' $E/labelmap.prototxt)" = 5 ] && grep -A1 'name: "cross"' $E/labelmap.prototxt | grep -q "label: 4" \
  && pass || fail "shapes-det's label map: $(cat $E/labelmap.prototxt)"

for v in 11point MaxIntegral Integral; do
  "$KILN" test --model "$Z/ssd_train_test.prototxt" --weights ssd_iter_40.caffemodel --ap-version $v --iterations 8 \
    --metrics "test-$v.jsonl" > "test-$v.txt" 2> "test-$v.err" || fail "kiln test --ap-version $v: $(tail -n 3 "test-$v.err")"
  grep -q "^mAP = [0-9.]* ($v average precision over 4 classes)$" "test-$v.txt" && pass \
    || fail "kiln test --ap-version $v: $(cat "test-$v.txt")"
done
python3 - m.jsonl positives.txt <<'PY' && pass || fail "kiln test's figures: $(cat test-*.txt)"
import json, re, sys
positives = dict(tuple(map(int, l.split())) for l in open(sys.argv[2]))
aps, maps = {}, {}
for v in ("11point", "MaxIntegral", "Integral"):
    text = open(f"test-{v}.txt").read()
    rows = re.findall(r"^class (\d+): AP ([0-9.]+) \((\d+) positives\)$", text, re.M)
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4], (v, text)
    assert {int(r[0]): int(r[2]) for r in rows} == positives, (v, rows, positives)
    aps[v] = {int(r[0]): float(r[1]) for r in rows}
    maps[v] = float(re.search(r"^mAP = ([0-9.]+) ", text, re.M).group(1))
    assert all(0 <= a <= 1 for a in aps[v].values()) and 0 <= maps[v] <= 1, (v, text)
    # printed to 4 places: the mean of the rounded APs within rounding of the rounded mean
    assert abs(maps[v] - sum(aps[v].values()) / 4) <= 1e-4, (v, text)
# each class: VOC2012's interpolated precision is at least the precision Integral sums
assert all(aps["MaxIntegral"][c] >= aps["Integral"][c] for c in positives), aps
assert maps["MaxIntegral"] >= maps["Integral"], maps
# kiln test over the training's test batches (the first 8 of the test LMDB) gives its mAP
trained = [json.loads(l) for l in open(sys.argv[1]) if '"event":"test"' in l][0]["mAP"]
tested = [json.loads(l) for l in open("test-11point.jsonl") if '"event":"test"' in l][0]["mAP"]
assert abs(trained - tested) <= 1e-7, (trained, tested)
print("kiln test:", ", ".join(f"{v} {maps[v]:.4f}" for v in maps), "; positives", positives)
PY

# ---- refusals ----------------------------------------------------------------------------------
sed 's/^ap_version: .*/ap_version: "12point"/' solver.prototxt > ap12.prototxt
expect_refusal "ap_version 12point" --want "ap12.prototxt: ap_version" --want "12point" \
  -- "$KILN" train --solver ap12.prototxt --check
sed 's/^eval_type: .*/eval_type: "segmentation"/' solver.prototxt > seg.prototxt
expect_refusal "eval_type segmentation" --want "seg.prototxt: eval_type 'segmentation'" \
  -- "$KILN" train --solver seg.prototxt --check
# the committed net without its DetectionEvaluate layer (its three lines): DetectionOutput's rows
# are then the test net's output, no mAP
awk '/^layer \{ name: "detection_eval"/ { skip = 1 } skip { if (/\} \}$/) skip = 0; next } 1' \
  "$Z/ssd_train_test.prototxt" > noeval.prototxt
[ "$(diff "$Z/ssd_train_test.prototxt" noeval.prototxt | grep -c '^<')" = 3 ] && ! grep -q 'type: "DetectionEvaluate"' noeval.prototxt \
  && pass || fail "noeval.prototxt: $(diff "$Z/ssd_train_test.prototxt" noeval.prototxt)"
sed "s#^net: .*#net: \"$WORK/noeval.prototxt\"#" solver.prototxt > noeval_solver.prototxt
expect_refusal "eval_type detection without DetectionEvaluate" --want "noeval_solver.prototxt: eval_type is detection" \
  --want "no DetectionEvaluate" -- "$KILN" train --solver noeval_solver.prototxt --check
expect_refusal "kiln test --ap-version bogus" --code 2 --want "--ap-version" --want "'bogus'" \
  -- "$KILN" test --model "$Z/ssd_train_test.prototxt" --weights ssd_iter_40.caffemodel --ap-version bogus --iterations 1
# the TRAIN data layer's label map with two items of label 2
sed 's/label: 4$/label: 2/' $E/labelmap.prototxt > dup_labelmap.prototxt
awk -v m="$WORK/dup_labelmap.prototxt" 'NR == 1, /label_map_file:/ { sub(/label_map_file: ".*"/, "label_map_file: \"" m "\"") } 1' \
  "$Z/ssd_train_test.prototxt" > dupmap.prototxt
[ "$(grep -c dup_labelmap dupmap.prototxt)" = 1 ] && pass || fail "dupmap.prototxt: $(grep label_map_file dupmap.prototxt)"
sed "s#^net: .*#net: \"$WORK/dupmap.prototxt\"#" solver.prototxt > dupmap_solver.prototxt
expect_refusal "a label map with two items of one label" --want "dup_labelmap.prototxt:" \
  --want "same label 2" -- "$KILN" train --solver dupmap_solver.prototxt --check
finish
