# LeNet with Caffe's solver settings on Fashion-MNIST: at least 0.89 test accuracy after 10,000
# iterations, read from the metrics file.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
    -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/lenet\"#" -e "s#^test_interval: .*#test_interval: 2500#" \
    "$SRC/models/lenet/lenet_solver.prototxt" > solver.prototxt
"$KILN" train --solver solver.prototxt --metrics m.jsonl 2>train.log || { tail -5 train.log; fail "training failed"; }
last=$(grep '"event":"test"' m.jsonl | tail -n 1)
echo "$last"
echo "$last" | grep -q '"iter":10000' && pass || fail "last test not at 10000"
acc=$(echo "$last" | sed -n 's/.*"accuracy":\([0-9.e-]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.89) }' && pass || fail "accuracy $acc < 0.89"
finish
