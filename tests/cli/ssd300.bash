# SSD300's figures worked out here from the layers' shapes, independently of kiln (sourced by
# zoo_deploy.sh, slow_ssd300_train.sh and ssd_caffe_files.sh; not a test):
#   - ssd300_params CLASSES: the learnable parameters of SSD300 (VGG-16 reduced, the extra layers,
#     the Normalize scale, the heads) for CLASSES classes, the background included: 26,285,486 for
#     VOC's 21, the figure of the fork's published nets;
#   - SSD300_PRIORS: the prior boxes, 8,732;
#   - ssd300_head_lines N CLASSES: describe's lines for the heads at batch N (patterns for grep -E).

_ssd300_conv() { _ssd300_n=$((_ssd300_n + $1 * $2 * $3 * $3 + $2)); } # IN OUT K: weights, biases

# The sources of the six heads: name (as describe cuts it to 24 characters), channels, map size,
# priors a cell (1 + 1 for the min and max squares, 2 for each aspect ratio and its inverse:
# ratio 2 on conv4_3, conv8_2 and conv9_2, ratios 2 and 3 on the others).
SSD300_SOURCES="conv4_3_norm:512:38:4 fc7:1024:19:6 conv6_2:512:10:6 conv7_2:256:5:6 conv8_2:256:3:4 conv9_2:256:1:4"

ssd300_params() {
  local classes=$1 s name c m p
  _ssd300_n=0
  # VGG-16's 13 3x3 convolutions (14,714,688: the figure zoo_deploy.sh checks for VGG-16 without
  # its fully connected layers)
  _ssd300_conv 3 64 3; _ssd300_conv 64 64 3
  _ssd300_conv 64 128 3; _ssd300_conv 128 128 3
  _ssd300_conv 128 256 3; _ssd300_conv 256 256 3; _ssd300_conv 256 256 3
  _ssd300_conv 256 512 3; _ssd300_conv 512 512 3; _ssd300_conv 512 512 3
  _ssd300_conv 512 512 3; _ssd300_conv 512 512 3; _ssd300_conv 512 512 3
  _ssd300_conv 512 1024 3  # fc6 as a 3x3 convolution (dilation 6), fc7 as a 1x1
  _ssd300_conv 1024 1024 1
  _ssd300_conv 1024 256 1; _ssd300_conv 256 512 3 # conv6_1, conv6_2 (stride 2)
  _ssd300_conv 512 128 1; _ssd300_conv 128 256 3  # conv7
  _ssd300_conv 256 128 1; _ssd300_conv 128 256 3  # conv8 (no padding)
  _ssd300_conv 256 128 1; _ssd300_conv 128 256 3  # conv9 (no padding)
  _ssd300_n=$((_ssd300_n + 512))                   # conv4_3_norm's scale, one a channel
  # each source's heads: 3x3 convolutions of 4 locations and CLASSES confidences a prior
  for s in $SSD300_SOURCES; do
    IFS=: read -r name c m p <<<"$s"
    _ssd300_conv "$c" $((4 * p)) 3
    _ssd300_conv "$c" $((classes * p)) 3
  done
  echo "$_ssd300_n"
}

# priors: the sum over the sources of map x map x priors a cell
SSD300_PRIORS=0
for _s in $SSD300_SOURCES; do
  IFS=: read -r _name _c _m _p <<<"$_s"
  SSD300_PRIORS=$((SSD300_PRIORS + _m * _m * _p))
done
unset _s _name _c _m _p

ssd300_head_lines() {
  local n=$1 classes=$2 s name c m p
  for s in $SSD300_SOURCES; do
    IFS=: read -r name c m p <<<"$s"
    echo "^${name}_mbox_loc +Convolution +${n}x$((4 * p))x${m}x${m} "
    echo "^${name}_mbox_conf +Convolution +${n}x$((classes * p))x${m}x${m} "
    echo "^$(printf %.24s "${name}_mbox_priorbox") +PriorBox +1x2x$((4 * m * m * p)) "
  done
  echo "^mbox_loc +Concat +${n}x$((4 * SSD300_PRIORS)) "
  echo "^mbox_conf +Concat +${n}x$((classes * SSD300_PRIORS)) "
  echo "^mbox_priorbox +Concat +1x2x$((4 * SSD300_PRIORS)) "
}
