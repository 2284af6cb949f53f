# Files Caffe 1.0 reads: `kiln upgrade --caffe IN OUT` on every net and solver of models/ and
# bench/nets/. Those whose layer types are all Caffe 1.0's must be written, with each field kiln
# adds named on stderr, and the nets then read by OpenCV's Caffe reader (cv2.dnn.readNetFromCaffe,
# which parses with protobuf's text parser as Caffe does); those with a kiln-only layer type (or
# a bidirectional LSTM, which Caffe 1.0 cannot express), or a layer type of the SSD fork's (or its
# solvers' eval_type "detection"), must be refused naming it, writing nothing. Each original that had kiln fields must be one OpenCV refuses ("has no field named"),
# which is why the command exists; a binary file with them is one it reads (protobuf skips
# unknown fields there). Also: `kiln upgrade` says what it wrote for a current file, OUT may not
# be IN (by any name) nor a device or a folder, a solver's own fields and those of its inline
# nets are dropped, and `kiln test` names what its HDF5Output layers wrote.
#
# Which nets OpenCV reads: deploy nets (and bench/nets/, one phase each) whole. A train/test net
# has two Data layers, one per phase, both with top "data"; OpenCV ignores `include { phase }`
# and stops at the second ("Duplicate blobs produced by multiple sources") after parsing the
# file. For those the whole file must parse (an import error, never a parse error), and the net
# of its TEST phase (the output with its TRAIN-only layer blocks cut out) must be read whole.
# Solvers are not nets: OpenCV has no reader for them; their output is checked for kiln's fields.
source "$(dirname "$0")/lib.bash"
cd "$WORK"

# OpenCV's reader through Debian's python3-opencv, which Debian's own /usr/bin/python3 sees (a
# python3 of pyenv or a virtual environment first on PATH may not).
PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import cv2' >/dev/null 2>&1; then
    PY=$p
    break
  fi
done
[ -n "$PY" ] || echo "SKIP: python3-opencv not installed (OpenCV's reads are not checked; the rest runs)"

# Each argument KIND:FILE (KIND:FIELD:FILE for rejected): read (readNetFromCaffe reads it),
# parsed (its text parser takes it, whatever the importer says after), test-phase (the file's
# TEST-phase net, TRAIN-only layer blocks cut out, is read), rejected (the text parser refuses it,
# naming FIELD), weights (FILE is a binary net read as the weights of the text net given as
# FIELD). One line per argument: "ok ..." or "FAIL ...".
cat > cv.py <<'PY'
import re, sys
import cv2

def load(path, weights=None):
    try:
        net = cv2.dnn.readNetFromCaffe(path, weights) if weights else cv2.dnn.readNetFromCaffe(path)
        return 'read', '%d layers' % len(net.getLayerNames())
    except cv2.error as e:
        text = str(e).strip().splitlines()[-1]
        return ('parse' if 'Failed to parse NetParameter' in text else 'import'), text

for arg in sys.argv[1:]:
    kind, rest = arg.split(':', 1)
    field = None
    if kind in ('rejected', 'weights'):
        field, path = rest.split(':', 1)
    else:
        path = rest
    if kind == 'test-phase':
        blocks = re.split(r'(?m)^(?=layer \{)', open(path).read())
        keep = [b for b in blocks if not re.search(r'\n  include \{\n    phase: TRAIN\n', b)]
        if len(keep) == len(blocks):
            print('FAIL %s: no TRAIN-only layer to cut' % arg)
            continue
        cut = path + '.test-phase.prototxt'
        open(cut, 'w').write(''.join(keep))
        path = cut
    if kind == 'weights':
        got, why = load(field, path)
    else:
        got, why = load(path)
    good = {'read': got == 'read', 'test-phase': got == 'read', 'weights': got == 'read',
            'parsed': got == 'read' or (got == 'import' and 'Duplicate blobs' in why),
            'rejected': got == 'parse'}[kind]
    print('%s %s: OpenCV: %s (%s)' % ('ok' if good else 'FAIL', arg, got, why))
PY
# the rejection names the field: protobuf prints it to stderr, before the exception
cat > cvfield.py <<'PY'
import sys, cv2
try:
    cv2.dnn.readNetFromCaffe(sys.argv[1])
except cv2.error:
    pass
PY

# What kiln has and Caffe 1.0 lacks (the library's table is checked by tests/test_caffe_compat.c)
KILN_TYPES="TextData LibSVMData F1 SequencePool GRU GELU LayerNorm PositionalEncoding MultiHeadAttention Swish"
# What the SSD fork added to Caffe after 1.0 (models/ssd, models/ssd300), and its solvers' test
# figure, eval_type "detection"
FORK_TYPES="AnnotatedData Normalize Permute PriorBox MultiBoxLoss DetectionOutput DetectionEvaluate"

cv_args=()
fields_named=()
accepted=0 refused=0 with_drops=0
mkdir caffe
for f in "$SRC"/models/*/*.prototxt "$SRC"/bench/nets/*.prototxt; do
  rel=${f#"$SRC"/}
  out="$WORK/caffe/$(echo "$rel" | tr / _)"
  own=()
  for t in $KILN_TYPES; do grep -q "type: *\"$t\"" "$f" && own+=("$t"); done
  fork=()
  for t in $FORK_TYPES; do grep -q "type: *\"$t\"" "$f" && fork+=("$t"); done
  bidir=false detection=false
  grep -q 'bidirectional: *true' "$f" && bidir=true
  grep -q '^eval_type: *"detection"' "$f" && detection=true
  "$KILN" upgrade --caffe "$f" "$out" > up.out 2> up.err
  rc=$?
  if [ ${#own[@]} -gt 0 ] || [ ${#fork[@]} -gt 0 ] || $bidir || $detection; then
    # refused, naming the type (or the field), and nothing written
    ok=false
    for t in "${own[@]}"; do grep -q "type '$t' is kiln's own; Caffe 1.0 has no such layer type" up.err && ok=true; done
    for t in "${fork[@]}"; do grep -q "type '$t' was added to Caffe after 1.0; Caffe 1.0 has no such layer type" up.err && ok=true; done
    $bidir && grep -q "recurrent_param.bidirectional: true (kiln only) has no Caffe 1.0 equivalent" up.err && ok=true
    $detection && grep -q "eval_type: a value other than its default (the SSD fork's) has no Caffe 1.0 equivalent" up.err && ok=true
    if [ $rc -eq 1 ] && $ok && grep -qE "^kiln: upgrade --caffe \(nothing written\): $f: (layer '|eval_type: )" up.err \
      && [ -z "$(left_behind "$out")" ] && [ ! -s up.out ]; then
      pass
      refused=$((refused + 1))
    else
      fail "$rel (types ${own[*]:-none} ${fork[*]:-}, bidirectional $bidir, detection $detection): exit $rc, expected a refusal naming it: $(cat up.err up.out)"
    fi
    continue
  fi
  if [ $rc -ne 0 ]; then
    fail "$rel: exit $rc: $(cat up.err)"
    continue
  fi
  accepted=$((accepted + 1))
  kind=net
  grep -q "^wrote a Caffe 1.0 solver to $out from $f " up.out && kind=solver
  # every dropped field on its own line; the count in the summary matches
  n=$(sed -n 's/.*; \([0-9]*\) fields\{0,1\} dropped)$/\1/p' up.out)
  lines=$(grep -c "^kiln upgrade: .*dropped .* Caffe 1.0 has no such field" up.err)
  if grep -q "^wrote a Caffe 1.0 $kind to $out from $f (already current; " up.out && [ -n "$n" ] \
    && [ "$n" -eq "$lines" ] && [ "$lines" -eq "$(wc -l < up.err)" ]; then
    pass
  else
    fail "$rel: summary and warnings disagree: $(cat up.out up.err)"
  fi
  if [ "$kind" = solver ]; then
    grep -qE '^(sync|divergence_factor|divergence_iters|weights)\b' "$out" \
      && fail "$rel: kiln's solver fields left in $out" || pass
    continue
  fi
  if [ "$n" -gt 0 ]; then
    with_drops=$((with_drops + 1))
    # the original: OpenCV's text parser refuses it, naming the first dropped field
    first=$(sed -n '1s/.*dropped \([a-z_.]*\) (.*/\1/p' up.err)
    fields_named+=("${first##*.}:$f")
    cv_args+=("rejected:${first##*.}:$f")
  fi
  if grep -q '^    phase: ' "$out"; then
    cv_args+=("parsed:$out" "test-phase:$out")
  else
    cv_args+=("read:$out")
  fi
done
[ $accepted -ge 30 ] && [ $refused -ge 10 ] && [ $with_drops -ge 3 ] && pass \
  || fail "the zoo's nets: $accepted written, $refused refused, $with_drops with fields dropped: fewer than expected"

# a binary net with kiln's fields: OpenCV reads it (as weights: protobuf skips unknown fields in
# binary), and --caffe takes it too, dropping them
"$KILN" upgrade "$SRC/models/resnet20/resnet20_train_test.prototxt" r20.caffemodel > /dev/null 2>&1 \
  || fail "binary resnet20"
"$KILN" upgrade --caffe r20.caffemodel r20.prototxt > bin.out 2> bin.err \
  && grep -q "^kiln upgrade: layer 'data': dropped data_param.shuffle (kiln only; Caffe 1.0 has no such field" bin.err \
  && grep -q "^wrote a Caffe 1.0 net to r20.prototxt from r20.caffemodel (already current; 1 field dropped)$" bin.out \
  && pass || fail "--caffe of a binary net: $(cat bin.out bin.err)"
cv_args+=("test-phase:$WORK/r20.prototxt" "weights:$WORK/r20.prototxt.test-phase.prototxt:$WORK/r20.caffemodel")

if [ -n "$PY" ]; then
  "$PY" cv.py "${cv_args[@]}" > cv.log 2> cv.err
  [ "$(grep -c '^ok ' cv.log)" -eq ${#cv_args[@]} ] && pass \
    || fail "OpenCV: $(grep -v '^ok ' cv.log; tail -n 5 cv.err)"
  for a in "${fields_named[@]}"; do
    "$PY" cvfield.py "${a#*:}" 2>&1 | grep -q "has no field named \"${a%%:*}\"" && pass \
      || fail "OpenCV's refusal of ${a#*:} does not name ${a%%:*}"
  done
fi

# a solver with kiln's fields, and a net written inside it: all dropped, each named
cat > solver.prototxt <<'S'
net_param { name: "n" layer { name: "d" type: "Data" top: "x" data_param { source: "s" batch_size: 2 shuffle: true } } }
base_lr: 0.1 lr_policy: "fixed" max_iter: 10 weights: "w.caffemodel"
sync { mode: MODEL interval_iters: 4 } divergence_factor: 0
S
"$KILN" upgrade --caffe solver.prototxt s.prototxt > s.out 2> s.err
[ $? -eq 0 ] && grep -q "^kiln upgrade: net_param: layer 'd': dropped data_param.shuffle (kiln only;" s.err \
  && grep -q "^kiln upgrade: dropped weights (Caffe's after 1.0; Caffe 1.0 has no such field: " s.err \
  && grep -q "^kiln upgrade: dropped sync (kiln only;" s.err && grep -q "^kiln upgrade: dropped divergence_factor " s.err \
  && grep -q "^wrote a Caffe 1.0 solver to s.prototxt from solver.prototxt (already current; 4 fields dropped)$" s.out \
  && ! grep -qE 'shuffle|weights|sync|divergence' s.prototxt && grep -q 'base_lr: 0.1' s.prototxt \
  && pass || fail "--caffe of a solver: $(cat s.out s.err s.prototxt)"

# what Caffe 1.0 cannot express is refused, nothing written
printf 'layer { name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: MAX kernel_size: 2 round_mode: FLOOR } }\n' > floor.prototxt
expect_refusal "round_mode FLOOR" --want "floor.prototxt: layer 'p': pooling_param.round_mode: FLOOR (Caffe's after 1.0) has no Caffe 1.0 equivalent" \
  --gone floor_out.prototxt -- "$KILN" upgrade --caffe floor.prototxt floor_out.prototxt

# kiln upgrade of a current file says what it wrote; of an old one, that it upgraded
cp "$SRC/models/lenet/lenet_deploy.prototxt" lenet.prototxt
"$KILN" upgrade lenet.prototxt lenet2.prototxt > cur.out 2>&1 \
  && [ "$(cat cur.out)" = "already current: lenet.prototxt (nothing to upgrade); wrote the same net to lenet2.prototxt (comments and layout are not kept)" ] \
  && [ -s lenet2.prototxt ] && pass || fail "current net: $(cat cur.out)"
"$KILN" upgrade lenet2.prototxt lenet3.prototxt > /dev/null 2>&1 && cmp -s lenet2.prototxt lenet3.prototxt \
  && pass || fail "kiln's own output, upgraded again, is not the same file"
"$KILN" upgrade lenet2.prototxt lenet.caffemodel > bin.out 2>&1 \
  && [ "$(cat bin.out)" = "already current: lenet2.prototxt (nothing to upgrade); wrote the same net to lenet.caffemodel" ] \
  && pass || fail "current net to binary: $(cat bin.out)"
printf 'name: "v1"\nlayers { name: "r" type: RELU bottom: "x" top: "x" }\n' > v1.prototxt
"$KILN" upgrade v1.prototxt v1_up.prototxt > v1.out 2>&1 && [ "$(cat v1.out)" = "upgraded v1.prototxt to v1_up.prototxt" ] \
  && grep -q 'type: "ReLU"' v1_up.prototxt && pass || fail "V1 net: $(cat v1.out)"
"$KILN" upgrade --caffe v1.prototxt v1_caffe.prototxt > v1c.out 2>&1 \
  && [ "$(cat v1c.out)" = "wrote a Caffe 1.0 net to v1_caffe.prototxt from v1.prototxt (upgraded from Caffe's old format; 0 fields dropped)" ] \
  && pass || fail "--caffe of a V1 net: $(cat v1c.out)"

# OUT may not be IN, by its own name or another, nor a device or a folder
ln -s lenet.prototxt lenet_link.prototxt
for mode in "" --caffe; do
  expect_refusal "OUT is IN ${mode:-plain}" --want "lenet.prototxt: is the input lenet.prototxt itself" \
    --same lenet.prototxt -- "$KILN" upgrade $mode lenet.prototxt lenet.prototxt
  expect_refusal "OUT is IN through a link ${mode:-plain}" --want "lenet_link.prototxt: is the input lenet.prototxt itself" \
    --same lenet.prototxt -- "$KILN" upgrade $mode lenet.prototxt lenet_link.prototxt
done
mkdir folder
expect_refusal "OUT a folder" --want "folder: is a folder" -- "$KILN" upgrade lenet.prototxt folder
[ -d folder ] && [ -z "$(ls folder)" ] && pass || fail "the folder changed"
expect_refusal "OUT a device" --want "/dev/null: is a device" -- "$KILN" upgrade --caffe lenet.prototxt /dev/null
[ -c /dev/null ] && pass || fail "/dev/null is no longer a device"

# kiln test of a net whose only output goes to an HDF5Output layer says what it wrote
cat > h5out.prototxt <<NET
name: "h5out"
layer { name: "d" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
    data_filler { type: "gaussian" } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "out" type: "HDF5Output" bottom: "ip" bottom: "y"
  hdf5_output_param { file_name: "$WORK/scores.h5" } }
NET
"$KILN" test --model h5out.prototxt --iterations 3 > t.out 2> t.err \
  && [ "$(cat t.out)" = "wrote 3 batches of 'ip' and 'y' to $WORK/scores.h5 (datasets data and label; layer 'out')" ] \
  && [ -s scores.h5 ] && pass || fail "kiln test with HDF5Output: $(cat t.out t.err)"
[ -n "$PY" ] && echo "OpenCV: $(grep -c "^ok " cv.log) reads and refusals as expected, $accepted files written, $refused refused"
finish
