# `kiln export onnx` of the zoo's large ImageNet deploy nets at batch 1: AlexNet (grouped
# convolutions, LRN), ZF Net, VGG-16 (a 553 MB model) and ResNet-50 (BatchNorm folded with its
# Scale, Eltwise, the old input_dim header), each with random weights (BatchNorm statistics from
# what reaches it, so the scores stay unsaturated), checked by ONNX's checker and run by OpenCV's
# ONNX importer to kiln's probabilities within 1e-4 and its scores within 1e-4 of their magnitude.
# Then SSD300's heads (docs/onnx.md, "Detection nets"). GoogLeNet and the small nets are in
# onnx_export.sh. About a minute on 2 cores.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/onnx.bash"
for n in alexnet zfnet vgg16 resnet50; do
  sed 's/dim: 10 dim: 3 /dim: 1 dim: 3 /' "$SRC/models/$n/deploy.prototxt" > "$n.prototxt"
  logits=fc8
  [ $n = resnet50 ] && logits=fc1000
  onnx_round_trip "$n" "$n.prototxt" "$logits"
  onnx_check_all # one at a time: each model's files go before the next is made
  rm -rf "$n.d" "$n.caffemodel" "$n.onnx"
done
# SSD300 (VGG-16 reduced, conv4_3's Normalize, six sources) up to its DetectionOutput's inputs:
# the heads (--outputs mbox_loc,mbox_conf_flatten) and conv4_3_norm, which OpenCV returns as an
# inner blob
mkdir -p ssd300.d
if need "onnx_ref ssd300" -- "$ONNX_REF" "$SRC/models/ssd300/ssd300_deploy.prototxt" ssd300.caffemodel ssd300.d 7 \
  mbox_loc mbox_conf_flatten conv4_3_norm; then
  sed -i '/^blob detection_out /d; s/^inner mbox_/blob mbox_/' ssd300.d/manifest.txt
  need "export ssd300's heads" -- "$KILN" export onnx --model "$SRC/models/ssd300/ssd300_deploy.prototxt" \
    --weights ssd300.caffemodel ssd300.onnx --outputs mbox_loc,mbox_conf_flatten \
    && ONNX_CHECKS+=(ssd300.onnx ssd300.d)
  onnx_check_all
fi
finish
