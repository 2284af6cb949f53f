# `kiln import onnx` (docs/onnx.md). PyTorch 1.13's torch.onnx.export of a LeNet (its view()
# left unfolded: Shape, Gather, Unsqueeze, Concat feed its Reshape), a ResNet-20 with BatchNorm, an
# MLP, a 2-layer LSTM over an Embedding, a 2-layer bidirectional LSTM and GRUs one way and both
# ways, a net of the other ops and transformer encoders (PyTorch's
# nn.TransformerEncoderLayer as it is by default; two pre-norm GELU blocks, batch-first, with a
# classifier, at opset 14, LayerNorm and GELU written out, and at opset 17) is imported, and
# kiln's outputs on PyTorch's inputs are within 1e-4 of PyTorch's (tests/cli/onnx_torch.py makes
# the models, onnx_ref --compare runs the imported nets). The
# zoo's deploy CNNs exported by `kiln export onnx` import back to nets whose outputs are kiln's
# own bit for bit. Then the refusals, each with neither file written: a truncated file, a
# cycle, an unknown op, an initializer whose bytes disagree with its dims, opset 1, an input no
# node writes, external data, pads Caffe cannot express, unwritable outputs.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/onnx.bash"

# ---- round trip: export, import, the same outputs bit for bit ---------------------------------
rt() { # NAME PROTOTXT
  local name=$1 net=$2
  mkdir -p "$name.d"
  need "$name: onnx_ref" -- "$ONNX_REF" "$net" "$name.caffemodel" "$name.d" 7 || return
  need "$name: export" -- "$KILN" export onnx --model "$net" --weights "$name.caffemodel" "$name.onnx" || return
  if "$KILN" import onnx "$name.onnx" "$name-i.prototxt" "$name-i.caffemodel" > "$name.imp" 2>&1; then
    pass
  else
    fail "$name: import: $(cat "$name.imp")"
    return
  fi
  if "$ONNX_REF" --compare "$name-i.prototxt" "$name-i.caffemodel" "$name.d" 0 > "$name.cmp" 2>&1; then
    pass
    echo "round trip $name: $(tr '\n' ' ' < "$name.cmp")"
  else
    fail "$name: round trip: $(cat "$name.cmp")"
  fi
}
sed 's/dim: 64 /dim: 2 /' "$SRC/models/lenet/lenet_deploy.prototxt" > lenet.prototxt
rt lenet lenet.prototxt
for n in cifar10_quick/cifar10_quick cifar10_full/cifar10_full_norm resnet20/resnet20 vgg/vgg \
  densenet/densenet40; do
  b=$(basename "$n")
  need "deploy form of $b" -- "${ONNX_PY:-python3}" "$SRC/tests/cli/onnx_deploy.py" \
    "$SRC/models/${n}_train_test.prototxt" "$b.prototxt" 2 1 28 28 || continue
  rt "$b" "$b.prototxt"
done
sed 's/dim: 10 dim: 3 /dim: 1 dim: 3 /' "$SRC/models/googlenet/deploy.prototxt" > googlenet.prototxt
rt googlenet googlenet.prototxt
# an imported net's Flatten-before-Gemm is no layer, and BatchNorm with its Scale comes back as the two
grep -q 'type: "Reshape"' lenet-i.prototxt && fail "lenet: a Reshape layer in the imported net" || pass
[ "$(grep -c 'type: "BatchNorm"' resnet20-i.prototxt)" = "$(grep -c 'type: "BatchNorm"' resnet20.prototxt)" ] \
  && pass || fail "resnet20: BatchNorm layers $(grep -c 'type: "BatchNorm"' resnet20-i.prototxt), want $(grep -c 'type: "BatchNorm"' resnet20.prototxt)"

# ---- PyTorch's models ---------------------------------------------------------------------------
TORCH_PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, numpy' >/dev/null 2>&1; then
    TORCH_PY=$p
    break
  fi
done
if [ -z "$TORCH_PY" ]; then
  echo "SKIP: python3-torch not installed: PyTorch's models are not imported"
else
  OMP_NUM_THREADS=1 "$TORCH_PY" "$SRC/tests/cli/onnx_torch.py" . lenet resnet20 mlp lstm birnn ops \
    encoder encoder_gelu encoder17 > torch.log 2> torch.err
  for n in lenet resnet20 mlp lstm birnn ops encoder encoder_gelu encoder17; do
    if ! grep -q "^ok $n$" torch.log; then
      fail "$n: PyTorch's export: $(grep "$n" torch.log) $(tail -n 3 torch.err)"
      continue
    fi
    if "$KILN" import onnx "$n.onnx" "t-$n.prototxt" "t-$n.caffemodel" > "t-$n.imp" 2>&1; then
      pass
    else
      fail "torch $n: import: $(cat "t-$n.imp")"
      continue
    fi
    if "$ONNX_REF" --compare "t-$n.prototxt" "t-$n.caffemodel" "$n.d" 1e-4 > "t-$n.cmp" 2>&1; then
      pass
      echo "torch $n: $(head -n 1 "t-$n.imp" | sed 's/^wrote [^:]*: //'); $(tr '\n' ' ' < "t-$n.cmp")"
    else
      fail "torch $n: against PyTorch: $(cat "t-$n.cmp")"
    fi
  done
  # import then export: PyTorch's models through kiln and out again as ONNX give PyTorch's
  # outputs within 1e-4 (the CNNs and the MLP run by OpenCV; the recurrent nets and the encoders,
  # which OpenCV 4.6 does not run, by the NumPy evaluator)
  if [ -n "$ONNX_PY" ]; then
    rt=()
    rtn=()
    for n in lenet resnet20 mlp lstm birnn encoder encoder_gelu encoder17; do
      if "$KILN" export onnx --model "t-$n.prototxt" --weights "t-$n.caffemodel" "rt-$n.onnx" \
        > "rt-$n.out" 2>&1; then
        pass
        case $n in
          lstm | birnn | encoder*) rtn+=("rt-$n.onnx" "$n.d") ;;
          *) rt+=("rt-$n.onnx" "$n.d") ;;
        esac
      else
        fail "torch $n: exported again: $(cat "rt-$n.out")"
      fi
    done
    "$ONNX_PY" "$SRC/tests/cli/onnx_check.py" "${rt[@]}" > rt.log 2>&1 && pass \
      || fail "PyTorch's models exported again, run by OpenCV: $(cat rt.log)"
    "$ONNX_PY" "$SRC/tests/cli/onnx_numpy_eval.py" "${rtn[@]}" >> rt.log 2>&1 && pass \
      || fail "PyTorch's recurrent nets and encoders exported again, run by the NumPy evaluator: $(tail -n 4 rt.log)"
    sed 's/^/exported again: /' rt.log
  fi
  # PyTorch's ResNet-20 keeps its BatchNorm (exported with TrainingMode.PRESERVE): BatchNorm and
  # Scale layers for its 21 BatchNorm2d
  [ "$(grep -c 'type: "BatchNorm"' t-resnet20.prototxt)" = 21 ] && pass \
    || fail "torch resnet20: $(grep -c 'type: "BatchNorm"' t-resnet20.prototxt) BatchNorm layers, want 21"
  # the view() chain was folded, the LSTM's zero state too
  grep -q "(7 folded as constants" t-lenet.imp && pass || fail "torch lenet: folding: $(cat t-lenet.imp)"
  grep -q 'type: "LSTM"' t-lstm.prototxt && grep -q 'type: "Embed"' t-lstm.prototxt && pass \
    || fail "torch lstm: no LSTM or Embed layer"
  # the bidirectional LSTMs and GRU as kiln's layers, their Transpose and Reshape no layers
  [ "$(grep -c 'bidirectional: true' t-birnn.prototxt) $(grep -c 'type: "GRU"' t-birnn.prototxt) $(grep -c 'type: "Permute"' t-birnn.prototxt)" = "3 2 0" ] \
    && pass || fail "torch birnn: $(grep 'type:\|bidirectional' t-birnn.prototxt | tr '\n' ' ')"
  # the encoders: attention's products of computed tensors as MatMul layers, LayerNorm and GELU
  # (written out at opset 14, LayerNormalization at 17) as those layers: 2 MatMuls a block, a
  # LayerNorm for each norm, a GELU for each pre-norm block; nothing of them left as Power layers
  # but attention's scaling of q (one a block); q, k and v cut by one Slice layer
  for t in encoder:MatMul:2 encoder:LayerNorm:2 encoder:Power:1 encoder:Slice:1 encoder:Silence:0 encoder_gelu:MatMul:4 \
    encoder_gelu:LayerNorm:5 encoder_gelu:GELU:2 encoder_gelu:Power:2 encoder17:LayerNorm:5 \
    encoder17:GELU:2; do
    IFS=: read -r n ty want <<< "$t"
    got=$(grep -c "type: \"$ty\"" "t-$n.prototxt")
    [ "$got" = "$want" ] && pass || fail "torch $n: $got $ty layers, want $want"
  done
fi

# ---- refusals: a clear message naming the node or field, exit 1, neither file written ----------
head -c 3000 lenet.onnx > trunc.onnx
expect_refusal "a truncated file" --want "trunc.onnx: not an ONNX model (3000 bytes" \
  --want "nothing written" --gone o.prototxt --gone o.caffemodel \
  -- "$KILN" import onnx trunc.onnx o.prototxt o.caffemodel
: > empty.onnx
expect_refusal "an empty file" --want "empty.onnx: an empty file" --gone o.prototxt --gone o.caffemodel \
  -- "$KILN" import onnx empty.onnx o.prototxt o.caffemodel
if [ -n "$ONNX_PY" ] && "$ONNX_PY" "$SRC/tests/cli/onnx_bad.py" . 2> bad.err; then
  r() { # NAME MODEL WANT...
    local name=$1 model=$2
    shift 2
    local -a w=()
    for x in "$@"; do w+=(--want "$x"); done
    expect_refusal "$name" "${w[@]}" --gone o.prototxt --gone o.caffemodel \
      -- "$KILN" import onnx "$model" o.prototxt o.caffemodel
  }
  r "a cycle" cycle.onnx "cycle.onnx: node 'r1' (Relu): the graph has a cycle"
  r "an unknown op" unknown.onnx "unknown.onnx: node 'hm' (Hardmax): an op kiln cannot express"
  r "an initializer of the wrong size" badinit.onnx \
    "badinit.onnx: initializer 'w': raw_data holds 40 bytes, its dims [4, 1, 3, 3] of float take 144"
  r "opset 1" opset1.onnx "opset1.onnx: opset_import: the model is of opset 1 of ai.onnx; kiln reads opsets 7 to 17"
  r "an input nothing writes" dangling.onnx "node 'add' (Add): input 'nowhere' is written by no node"
  r "external data" external.onnx "initializer 'e': its data is in an external file"
  r "pads Caffe cannot express" badpool.onnx "node 'pool' (MaxPool): pads 2, 2, 0, 0 with ceil_mode 0"
  r "a ReduceMean alone" mean.onnx "node 'mean' (ReduceMean): kiln imports ReduceMean only as the start of a layer normalization"
  r "a constant by a computed matrix" constmatmul.onnx "node 'cx' (MatMul): a constant by a computed tensor"
  r "ONNX's RNN alone" rnn.onnx "node 'rnn' (RNN): an RNN whose Y is not followed by Caffe's output layer"
else
  echo "SKIP: python3-onnx not installed: the malformed models are not made ($(tail -n 1 bad.err 2>/dev/null))"
fi
touch plain-file
expect_refusal "OUT_NET in a folder that is a file" --want "plain-file/x.prototxt" --gone o.caffemodel \
  -- "$KILN" import onnx lenet.onnx plain-file/x.prototxt o.caffemodel
mkdir out-folder
expect_refusal "OUT_WEIGHTS a folder" --want "out-folder: is a folder" --gone o.prototxt \
  -- "$KILN" import onnx lenet.onnx o.prototxt out-folder
expect_refusal "OUT_WEIGHTS the input" --want "is the input lenet.onnx itself" --same lenet.onnx --gone o.prototxt \
  -- "$KILN" import onnx lenet.onnx o.prototxt lenet.onnx
# an existing weights file stays as it was when the net cannot be written after it
cp lenet.onnx kept.caffemodel
expect_refusal "an existing OUT_WEIGHTS is left as it was" --want "plain-file/y.prototxt" \
  --same kept.caffemodel -- "$KILN" import onnx lenet.onnx plain-file/y.prototxt kept.caffemodel
ls | grep -q "\.tmp\." && fail "waiting files left: $(ls | grep '\.tmp\.')" || pass
cp lenet-i.prototxt kept.prototxt
expect_refusal "an existing OUT_NET is left as it was" --want "trunc.onnx: not an ONNX model" --same kept.prototxt \
  -- "$KILN" import onnx trunc.onnx kept.prototxt o.caffemodel
expect_refusal "no OUT_WEIGHTS" --code 2 --want "kiln import onnx: OUT_WEIGHTS.caffemodel is required" \
  -- "$KILN" import onnx lenet.onnx o.prototxt
expect_refusal "another format" --code 2 --want "kiln import: unknown format 'tflite'" \
  -- "$KILN" import tflite lenet.onnx o.prototxt o.caffemodel
"$KILN" import onnx --help | grep -q "^usage: kiln import onnx IN.onnx OUT_NET.prototxt OUT_WEIGHTS.caffemodel" \
  && pass || fail "kiln import onnx --help"
finish
