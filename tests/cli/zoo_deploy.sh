# Caffe-style deploy nets of AlexNet (grouped convolutions, LRN), ZF Net, VGG-16, GoogLeNet
# (Concat), ResNet-50 (BatchNorm, Scale, Eltwise; the old input_dim header) and SSD300 (Normalize,
# Permute, PriorBox, DetectionOutput) parse and build with the published output sizes and
# parameter counts, and `kiln time` runs on each.
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
# ZF Net (Zeiler & Fergus 2013, their figure 3) with the padding that gives the figure's map sizes
# under Caffe's rules (convolutions round down, pooling rounds up): conv1 7x7 stride 2 pad 1
# (224 -> 110), pool1 3x3 stride 2 (55), conv2 5x5 stride 2 without padding (26), pool2 (13),
# conv3-5 3x3 pad 1 (13), pool5 (6). Parameters, weights + biases: conv1 96*3*7*7 + 96 = 14,208;
# conv2 256*96*5*5 + 256 = 614,656; conv3 384*256*9 + 384 = 885,120; conv4 384*384*9 + 384 =
# 1,327,488; conv5 256*384*9 + 256 = 884,992; fc6 4096*(256*6*6) + 4096 = 37,752,832; fc7
# 4096*4096 + 4096 = 16,781,312; fc8 1000*4096 + 1000 = 4,097,000: 62,357,608.
check zfnet '^conv1 +Convolution +10x96x110x110 ' '^pool1 +Pooling +10x96x55x55 ' '^norm1 +LRN +10x96x55x55 ' \
  '^conv2 +Convolution +10x256x26x26 ' '^pool2 +Pooling +10x256x13x13 ' '^conv5 +Convolution +10x256x13x13 ' \
  '^pool5 +Pooling +10x256x6x6 ' '^fc6 +InnerProduct +10x4096 ' '^fc8 +InnerProduct +10x1000 ' \
  '^total: 62357608 parameters'
# VGG-16 (configuration D): 13 3x3 convolutions, weights 9*(3*64 + 64*64 + 64*128 + 128*128 +
# 128*256 + 2*256*256 + 256*512 + 5*512*512) = 9*1,634,496 = 14,710,464 and biases 2*64 + 2*128 +
# 3*256 + 6*512 = 4,224; fc6 (512*7*7)*4096 + 4096 = 102,764,544; fc7 16,781,312; fc8 4,097,000:
# 138,357,544, the paper's 138 million.
check vgg16 '^conv1_2 +Convolution +10x64x224x224 ' '^pool1 +Pooling +10x64x112x112 ' \
  '^pool2 +Pooling +10x128x56x56 ' '^pool3 +Pooling +10x256x28x28 ' '^conv4_3 +Convolution +10x512x28x28 ' \
  '^pool4 +Pooling +10x512x14x14 ' '^conv5_3 +Convolution +10x512x14x14 ' '^pool5 +Pooling +10x512x7x7 ' \
  '^fc6 +InnerProduct +10x4096 ' '^fc8 +InnerProduct +10x1000 ' '^total: 138357544 parameters'
# ResNet-50's 25,557,032 parameters (conv, fc, and the BatchNorm affine pair, here in Scale)
# plus Caffe's BatchNorm statistics blobs: mean and variance (26,560 channels each) and one scale
# factor per BatchNorm layer (53): 25,557,032 + 53,120 + 53.
check resnet50 '^input +Input +1x3x224x224 ' '^res5c +Eltwise +1x2048x7x7 ' '^pool5 +Pooling +1x2048x1x1 ' \
  '^fc1000 +InnerProduct +1x1000 ' '^total: 25610205 parameters'
# SSD300 (models/ssd300, the SSD fork's ssd_pascal.py layout): VGG-16 reduced (pool5 3x3 stride 1,
# fc6 and fc7 as convolutions) and the extra layers conv6 to conv9, the heads on six sources and
# 8,732 priors, the detections of one image (keep_top_k 200). Its parameters and priors are
# summed from the layers' shapes in ssd300.bash: 26,285,486 for VOC's 21 classes, the figure of
# the fork's published SSD300 (tests/data/ssd, ssd_caffe_files.sh).
source "$SRC/tests/cli/ssd300.bash"
[ "$(ssd300_params 21)" = 26285486 ] && [ "$SSD300_PRIORS" = 8732 ] && pass \
  || fail "ssd300.bash: $(ssd300_params 21) parameters, $SSD300_PRIORS priors"
out=$("$KILN" describe --model "$SRC/models/ssd300/ssd300_deploy.prototxt" 2>&1) || fail "ssd300: describe failed: $out"
while read -r pat; do
  echo "$out" | grep -Eq "$pat" && pass || fail "ssd300: no line matching '$pat'"
done < <(ssd300_head_lines 1 21
  printf '%s\n' '^data +Input +1x3x300x300 ' '^conv4_3 +Convolution +1x512x38x38 ' '^conv4_3_norm +Normalize +1x512x38x38 +512 ' \
    '^pool5 +Pooling +1x512x19x19 ' '^fc6 +Convolution +1x1024x19x19 ' '^fc7 +Convolution +1x1024x19x19 ' \
    '^conv6_2 +Convolution +1x512x10x10 ' '^conv7_2 +Convolution +1x256x5x5 ' '^conv8_2 +Convolution +1x256x3x3 ' \
    '^conv9_2 +Convolution +1x256x1x1 ' '^mbox_conf_reshape +Reshape +1x8732x21 ' '^mbox_conf_softmax +Softmax +1x8732x21 ' \
    '^detection_out +DetectionOutput +1x1x200x7 ' "^total: $(ssd300_params 21) parameters")
# ZF Net and VGG-16 (23 and 310 GFLOP forward at their batch of 10) are timed at batch 1.
for model in zfnet vgg16; do
  sed 's/dim: 10 dim: 3 /dim: 1 dim: 3 /' "$SRC/models/$model/deploy.prototxt" > "$model-1.prototxt"
done
# SSD300's deploy net (63 GFLOP an image forward, one image) as committed.
for net in "$SRC"/models/{alexnet,googlenet,resnet50}/deploy.prototxt zfnet-1.prototxt vgg16-1.prototxt \
  "$SRC/models/ssd300/ssd300_deploy.prototxt"; do
  t=$(basename "${net%.prototxt}").time.txt
  [ "$t" = deploy.time.txt ] && t=$(basename "$(dirname "$net")").time.txt
  "$KILN" time --model "$net" --iterations 1 > "$t" 2>&1 \
    && grep -q "samples/s" "$t" && pass || { cat "$t"; fail "$net: kiln time failed"; }
done
grep -q "(batch 1)" vgg16-1.time.txt && pass || fail "vgg16 not timed at batch 1: $(grep samples/s vgg16-1.time.txt)"
grep -Eq "^detection_out +DetectionOutput +[0-9.]+ " ssd300_deploy.time.txt && grep -q "(batch 1)" ssd300_deploy.time.txt \
  && pass || fail "ssd300: no DetectionOutput timing: $(cat ssd300_deploy.time.txt)"
finish
