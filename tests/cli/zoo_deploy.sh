# Caffe-style deploy nets of AlexNet (grouped convolutions, LRN), ZF Net, VGG-16, GoogLeNet
# (Concat) and ResNet-50 (BatchNorm, Scale, Eltwise; the old input_dim header) parse and build
# with the published output sizes and parameter counts, and `kiln time` runs on each.
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
# ZF Net and VGG-16 (23 and 310 GFLOP forward at their batch of 10) are timed at batch 1.
for model in zfnet vgg16; do
  sed 's/dim: 10 dim: 3 /dim: 1 dim: 3 /' "$SRC/models/$model/deploy.prototxt" > "$model-1.prototxt"
done
for net in "$SRC"/models/{alexnet,googlenet,resnet50}/deploy.prototxt zfnet-1.prototxt vgg16-1.prototxt; do
  "$KILN" time --model "$net" --iterations 1 > time.txt 2>&1 \
    && grep -q "samples/s" time.txt && pass || { cat time.txt; fail "$net: kiln time failed"; }
done
grep -q "(batch 1)" time.txt && pass || fail "vgg16 not timed at batch 1: $(grep samples/s time.txt)"
finish
