# A net trained with BatchNorm evaluates the same after a snapshot round trip: the TEST-phase
# figures at the last iteration of training (test net sharing the train net's weights and
# BatchNorm statistics) equal those of `kiln test` on the saved .caffemodel.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
cat > net.prototxt <<NET
name: "bn"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  transform_param { mean_value: 73 scale: 0.011 }
  data_param { source: "\$KILN_DATA/fashion-mnist/train_lmdb" batch_size: 32 backend: LMDB shuffle: true } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST }
  transform_param { mean_value: 73 scale: 0.011 }
  data_param { source: "\$KILN_DATA/fashion-mnist/test_lmdb" batch_size: 50 backend: LMDB } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 8 kernel_size: 3 stride: 2 bias_term: false weight_filler { type: "msra" } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
cat > solver.prototxt <<SOLVER
net: "net.prototxt"
test_iter: 4
test_interval: 60
test_initialization: false
base_lr: 0.05
momentum: 0.9
lr_policy: "fixed"
max_iter: 60
snapshot_prefix: "$WORK/bn"
SOLVER
"$KILN" train --solver solver.prototxt --metrics m.jsonl 2>train.log || { cat train.log; fail "training"; }
during=$(grep '"event":"test"' m.jsonl | tail -n 1)
acc1=$(echo "$during" | sed -n 's/.*"accuracy":\([0-9.e-]*\).*/\1/p')
loss1=$(echo "$during" | sed -n 's/.*"loss":\([0-9.e-]*\).*/\1/p')
"$KILN" test --model net.prototxt --weights bn_iter_60.caffemodel --iterations 4 --metrics t.jsonl >/dev/null 2>&1 \
  || fail "kiln test"
after=$(grep '"event":"test"' t.jsonl)
acc2=$(echo "$after" | sed -n 's/.*"accuracy":\([0-9.e-]*\).*/\1/p')
loss2=$(echo "$after" | sed -n 's/.*"loss":\([0-9.e-]*\).*/\1/p')
[ -n "$acc1" ] && [ "$acc1" = "$acc2" ] && pass || fail "accuracy during training $acc1, after reload $acc2"
[ -n "$loss1" ] && [ "$loss1" = "$loss2" ] && pass || fail "loss during training $loss1, after reload $loss2"
# The statistics matter: the trained net is far better than chance.
awk -v a="$acc1" 'BEGIN { exit !(a > 0.5) }' && pass || fail "accuracy $acc1 not above 0.5"
finish
