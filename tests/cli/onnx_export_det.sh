# `kiln export onnx --outputs` of the detection nets (docs/onnx.md, "Detection nets"): the zoo's
# small SSD (models/ssd, five sources with PriorBox, Permute, Flatten, Concat, the confidences'
# Softmax) and a net of Normalize in each form, with random weights (tests/support/onnx_ref.c).
# DetectionOutput has no ONNX form: the deploy net as it is is refused naming it, and exports up
# to its bottoms. The heads (mbox_loc, mbox_conf_flatten, Normalize's outputs) run in OpenCV's
# ONNX importer to kiln's values within 1e-4; the priors, a constant of the model that OpenCV
# folds away, are checked by the NumPy evaluator (bit for bit: they are kiln's own values); the
# model of all three is accepted by ONNX's checker; both models import back bit for bit. Then
# --outputs' errors. SSD300 (VGG-16 and
# conv4_3's Normalize) is in slow_onnx_zoo.sh.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/onnx.bash"
NET=$SRC/models/ssd/ssd_deploy.prototxt

# the deploy net as it is: refused at DetectionOutput, with the way out named, nothing written
mkdir -p ssd.d
need "onnx_ref ssd" -- "$ONNX_REF" "$NET" ssd.caffemodel ssd.d 7 mbox_loc mbox_conf_flatten mbox_priorbox
expect_refusal "ssd's deploy net with its DetectionOutput" \
  --want "layer 'detection_out' (DetectionOutput): has no ONNX form" \
  --want "--outputs with its bottoms" --gone ssd.onnx \
  -- "$KILN" export onnx --model "$NET" --weights ssd.caffemodel ssd.onnx

# manifests of the outputs each model has (onnx_ref wrote the bottoms as inner blobs)
part() { # DIR BLOB...: DIR with ssd.d's input and the BLOBs as outputs
  local dir=$1
  shift
  mkdir -p "$dir" && cp ssd.d/*.f32 "$dir"/
  grep '^input ' ssd.d/manifest.txt > "$dir/manifest.txt"
  for b in "$@"; do grep "^inner $b " ssd.d/manifest.txt | sed 's/^inner /blob /' >> "$dir/manifest.txt"; done
}
part heads.d mbox_loc mbox_conf_flatten
part priors.d mbox_priorbox
need "export the heads" -- "$KILN" export onnx --model "$NET" --weights ssd.caffemodel heads.onnx \
  --outputs mbox_loc,mbox_conf_flatten
"$KILN" export onnx --model "$NET" --weights ssd.caffemodel priors.onnx --outputs mbox_priorbox \
  > priors.out 2>&1 && pass || fail "export the priors: $(cat priors.out)"
"$KILN" export onnx --model "$NET" --weights ssd.caffemodel all.onnx --outputs mbox_loc \
  --outputs mbox_conf_flatten,mbox_priorbox > all.out 2>&1 && pass || fail "export all three: $(cat all.out)"
grep -q "^output mbox_loc 1x12256$" all.out && grep -q "^output mbox_conf_flatten 1x15320$" all.out \
  && grep -q "^output mbox_priorbox 1x2x12256$" all.out && pass || fail "outputs: $(cat all.out)"
# the priors' model needs none of the convolutions (PriorBox reads its bottoms' shapes alone)
grep -q "^wrote priors.onnx: ONNX opset 13, 1 nodes, 5 initializers" priors.out && pass \
  || fail "the priors' model holds more than its Concat of 5 constants: $(head -n 1 priors.out)"

# Normalize in each form: across the channels of each position with a scale a channel, across
# the whole image with one scale (OpenCV); and on a 3-axis input with eps 0 (the NumPy evaluator:
# OpenCV 4.6 reduces 4-axis tensors only)
cat > norm.prototxt <<'NET'
name: "norm"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 6 dim: 5 dim: 4 } } }
layer { name: "n_c" type: "Normalize" bottom: "x" top: "n_c"
  norm_param { across_spatial: false channel_shared: false scale_filler { type: "uniform" min: 0.5 max: 2 } } }
layer { name: "n_a" type: "Normalize" bottom: "x" top: "n_a" norm_param { eps: 0.001 scale_filler { type: "constant" value: 20 } } }
NET
onnx_round_trip norm norm.prototxt
cat > norm3.prototxt <<'NET'
name: "norm3"
layer { name: "in" type: "Input" top: "x3" input_param { shape { dim: 2 dim: 5 dim: 7 } } }
layer { name: "n_3" type: "Normalize" bottom: "x3" top: "n_3" norm_param { across_spatial: false eps: 0 } }
NET
mkdir -p norm3.d
need "norm3" -- "$ONNX_REF" norm3.prototxt norm3.caffemodel norm3.d 7
need "export norm3" -- "$KILN" export onnx --model norm3.prototxt --weights norm3.caffemodel norm3.onnx
if [ -n "$ONNX_PY" ]; then
  ONNX_CHECKS+=(heads.onnx heads.d)
  onnx_check_all
  "$ONNX_PY" "$SRC/tests/cli/onnx_numpy_eval.py" priors.onnx priors.d > priors.log 2>&1 \
    && grep -q "mbox_priorbox max|d| 0$" priors.log && pass || fail "the priors: $(cat priors.log)"
  cat priors.log
  "$ONNX_PY" "$SRC/tests/cli/onnx_numpy_eval.py" norm3.onnx norm3.d > norm3.log 2>&1 && pass \
    || fail "Normalize of a 3-axis input: $(cat norm3.log)"
  cat norm3.log
  "$ONNX_PY" -c 'import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)' all.onnx \
    > all.log 2>&1 && pass || fail "onnx.checker on the model of all three: $(cat all.log)"
fi

# back into kiln bit for bit: the heads and priors (the priors a Parameter layer that does not
# learn: the constant the model holds), Normalize in both forms as Normalize layers
all_d() { mkdir -p all.d && cp ssd.d/*.f32 all.d/ && { grep '^input ' ssd.d/manifest.txt; grep '^inner mbox_' ssd.d/manifest.txt | sed 's/^inner /blob /'; } > all.d/manifest.txt; }
all_d
if "$KILN" import onnx all.onnx all-back.prototxt all-back.caffemodel > back.out 2>&1 \
  && "$KILN" import onnx norm.onnx norm-back.prototxt norm-back.caffemodel >> back.out 2>&1; then
  pass
  "$ONNX_REF" --compare all-back.prototxt all-back.caffemodel all.d 0 > back.cmp 2>&1 \
    && "$ONNX_REF" --compare norm-back.prototxt norm-back.caffemodel norm.d 0 >> back.cmp 2>&1 \
    && pass || fail "the detection heads through import: $(cat back.cmp)"
  echo "exported and imported again: $(tr '\n' ' ' < back.cmp)"
  # (conv7 is 1 x 1: its two Permutes move axes of size 1 alone, and import as views)
  [ "$(grep -c 'type: "Normalize"' norm-back.prototxt) $(grep -c 'type: "Permute"' all-back.prototxt)" = "2 8" ] \
    && pass || fail "imported as: $(grep 'type:' norm-back.prototxt all-back.prototxt | sort | uniq -c | tr '\n' ' ')"
else
  fail "import of the detection heads: $(cat back.out)"
fi

# --outputs' errors: a blob the net does not have, one named twice, an empty list
expect_refusal "an unknown output" --want "output 'mbox_nothing' is no blob of net" --gone o.onnx \
  -- "$KILN" export onnx --model "$NET" --weights ssd.caffemodel o.onnx --outputs mbox_loc,mbox_nothing
expect_refusal "an output named twice" --want "output 'mbox_loc' is named twice" --gone o.onnx \
  -- "$KILN" export onnx --model "$NET" --weights ssd.caffemodel o.onnx --outputs mbox_loc,mbox_loc
expect_refusal "an empty --outputs" --code 2 --want "--outputs: no blob named" --gone o.onnx \
  -- "$KILN" export onnx --model "$NET" --weights ssd.caffemodel o.onnx --outputs ,
expect_refusal "the priors with --dynamic-batch" \
  --want "layer 'conv3_mbox_priorbox' (PriorBox): its output's first axis is 1 at any batch size" \
  --gone o.onnx \
  -- "$KILN" export onnx --model "$NET" --weights ssd.caffemodel o.onnx --outputs mbox_priorbox --dynamic-batch
finish
