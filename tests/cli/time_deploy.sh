# `kiln time` on deploy nets: an Input layer (LeNet deploy) and a Caffe deploy header.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
out=$("$KILN" time --model "$SRC/models/lenet/lenet_deploy.prototxt" --iterations 3 --metrics t.jsonl) \
  || fail "kiln time failed"
for layer in conv1 pool1 conv2 pool2 ip1 relu1 ip2 prob; do
  echo "$out" | grep -q "^$layer " && pass || fail "no timing line for $layer"
done
echo "$out" | grep -q "samples/s (batch 64)" && pass || fail "no throughput line: $out"
[ "$(grep -c '"event":"layer_time"' t.jsonl)" -eq 9 ] && pass || fail "expected 9 layer_time events"
grep -q '"event":"time".*"forward_ms":.*"backward_ms":' t.jsonl && pass || fail "no time event"
# conv1 backward must be measured (deploy nets have no loss, timing forces backward).
awk '/"layer":"conv1"/ { if ($0 ~ /"backward_ms":0[,}]/) exit 1 }' t.jsonl && pass || fail "conv1 backward not timed"

cat > header.prototxt <<'NET'
name: "header"
input: "data"
input_dim: 2
input_dim: 3
input_dim: 16
input_dim: 16
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: AVE global_pooling: true } }
NET
out=$("$KILN" describe --model header.prototxt) || fail "describe header net"
echo "$out" | grep -q "conv .*2x4x16x16" && pass || fail "conv shape: $out"
echo "$out" | grep -q "pool .*2x4x1x1" && pass || fail "pool shape: $out"
"$KILN" time --model header.prototxt --iterations 2 >/dev/null && pass || fail "time header net"

# A fused group (BatchNorm + Scale + ReLU): its forward is timed on BatchNorm, its backward on the
# ReLU, and the table says so; KILN_FUSE=0 times the three apart.
cat > bn.prototxt <<'NET'
name: "bn"
input: "data"
input_dim: 4
input_dim: 16
input_dim: 8
input_dim: 8
layer { name: "conv" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 16 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
NET
ms() { echo "$1" | awk -v l="$2" -v c="$3" '$1 == l { print $c }'; }  # ms OUTPUT LAYER COLUMN
out=$("$KILN" time --model bn.prototxt --iterations 3) || fail "time bn net"
echo "$out" | grep -q "^1 fused groups" && pass || fail "no fused-group line: $out"
[ "$(ms "$out" sc 3)" = 0.0000 ] && [ "$(ms "$out" relu 3)" = 0.0000 ] && [ "$(ms "$out" bn 4)" = 0.0000 ] \
  && pass || fail "fused layers timed apart: $out"
awk -v t="$(ms "$out" relu 4)" 'BEGIN { exit !(t > 0) }' && pass || fail "no backward on relu: $out"
out=$(KILN_FUSE=0 "$KILN" time --model bn.prototxt --iterations 3) || fail "time bn net unfused"
echo "$out" | grep -q "fused groups" && fail "KILN_FUSE=0 still fused: $out" || pass
awk -v t="$(ms "$out" sc 3)" 'BEGIN { exit !(t > 0) }' && pass || fail "Scale not timed unfused: $out"

# A train net whose labels come from an Input layer (as Caffe's `time` runs it): the labels are
# filled as class 0, not random reals that name no class.
cat > input_labels.prototxt <<'NET'
name: "labels"
layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 8 dim: 1 dim: 12 dim: 12 } shape { dim: 8 } } }
layer { name: "cv" type: "Convolution" bottom: "data" top: "cv" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "cv" top: "ip" inner_product_param { num_output: 10 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }
NET
out=$("$KILN" time --model input_labels.prototxt --iterations 2 2>&1) && pass \
  || fail "kiln time with labels from an Input layer: $out"
echo "$out" | grep -q "^loss " && pass || fail "no timing line for the loss: $out"

# Sequence layers: word indices and sequence indicators from Input layers are filled with zeros
# (index 0; every step a sequence start), not random reals, and neither is asked for a gradient.
cat > lm.prototxt <<'NET'
name: "lm"
layer { name: "in" type: "Input" top: "words" top: "cont"
  input_param { shape { dim: 6 dim: 4 } shape { dim: 6 dim: 4 } } }
layer { name: "embed" type: "Embed" bottom: "words" top: "emb" embed_param { num_output: 8 input_dim: 20 } }
layer { name: "lstm" type: "LSTM" bottom: "emb" bottom: "cont" top: "lstm" recurrent_param { num_output: 5 } }
layer { name: "rnn" type: "RNN" bottom: "lstm" bottom: "cont" top: "rnn" recurrent_param { num_output: 3 } }
NET
out=$("$KILN" time --model lm.prototxt --iterations 2 2>&1) && pass || fail "kiln time on Embed, LSTM, RNN: $out"
for layer in embed lstm rnn; do
  echo "$out" | grep -q "^$layer " && pass || fail "no timing line for $layer: $out"
done

# Blobs of no elements (a batch of 0, as Caffe allows): every layer runs on them without
# handing NULL to the C library (the sanitizer build checks), forward and backward.
cat > empty.prototxt <<'NET'
name: "empty"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 0 dim: 4 dim: 3 dim: 3 } } }
layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: 0 dim: 36 } } }
layer { name: "lrn" type: "LRN" bottom: "data" top: "n" }
layer { name: "cv" type: "Convolution" bottom: "n" top: "cv" convolution_param { num_output: 2 kernel_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "r" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "cat" type: "Concat" bottom: "ip" bottom: "ip" top: "cat" }
NET
out=$("$KILN" time --model empty.prototxt --iterations 2 2>&1) && pass || fail "a net of empty blobs: $out"
echo "$out" | grep -q "batch 0" && pass || fail "a net of empty blobs: no throughput line: $out"
finish
