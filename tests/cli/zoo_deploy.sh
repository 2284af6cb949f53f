# Caffe-style deploy nets of AlexNet (grouped convolutions, LRN), GoogLeNet (Concat) and ResNet-50
# (BatchNorm, Scale, Eltwise; the old input_dim header) parse and build with the published output
# sizes and parameter counts, and `kiln time` runs on each.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
check() {  # check MODEL PATTERN...
  local model=$1 out
  shift
  out=$("$KILN" describe --model "$SRC/models/$model/deploy.prototxt") || { fail "$model: describe failed"; return; }
  for pat in "$@"; do
    echo "$out" | grep -Eq "$pat" && pass || fail "$model: no line matching '$pat'"
  done
}
check alexnet '^conv2 +Convolution +10x256x27x27 ' '^pool5 +Pooling +10x256x6x6 ' \
  '^fc8 +InnerProduct +10x1000 ' '^total: 60965224 parameters'
check googlenet '^inception_3a/output +Concat +10x256x28x28 ' '^inception_5b/output +Concat +10x1024x7x7 ' \
  '^pool5/7x7_s1 +Pooling +10x1024x1x1 ' '^total: 6998552 parameters'
# ResNet-50's 25,557,032 parameters (conv, fc, and the BatchNorm affine pair, here in Scale)
# plus Caffe's BatchNorm statistics blobs: mean and variance (26,560 channels each) and one scale
# factor per BatchNorm layer (53): 25,557,032 + 53,120 + 53.
check resnet50 '^input +Input +1x3x224x224 ' '^res5c +Eltwise +1x2048x7x7 ' '^pool5 +Pooling +1x2048x1x1 ' \
  '^fc1000 +InnerProduct +1x1000 ' '^total: 25610205 parameters'
for model in alexnet googlenet resnet50; do
  "$KILN" time --model "$SRC/models/$model/deploy.prototxt" --iterations 1 > "$model.txt" 2>&1 \
    && grep -q "samples/s" "$model.txt" && pass || { cat "$model.txt"; fail "$model: kiln time failed"; }
done
finish
