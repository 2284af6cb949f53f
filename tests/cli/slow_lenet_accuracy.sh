# LeNet with Caffe's solver settings on Fashion-MNIST: at least 0.89 test accuracy after 10,000
# iterations, read from the metrics file; and the run snapshotted at 5,000 and resumed ends with
# weights bit-identical to the uninterrupted run.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
mk() {  # mk PREFIX
  sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/$1\"#" -e "s#^test_interval: .*#test_interval: 2500#" \
      "$SRC/models/lenet/lenet_solver.prototxt"
}
mk lenet > solver.prototxt
"$KILN" train --solver solver.prototxt --metrics m.jsonl 2>train.log || { tail -5 train.log; fail "training failed"; }
last=$(grep '"event":"test"' m.jsonl | tail -n 1)
echo "$last"
echo "$last" | grep -q '"iter":10000' && pass || fail "last test not at 10000"
acc=$(echo "$last" | sed -n 's/.*"accuracy":\([0-9.e-]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.89) }' && pass || fail "accuracy $acc < 0.89"

mk resumed > resumed.prototxt
"$KILN" train --solver resumed.prototxt --snapshot "$WORK/lenet_iter_5000.solverstate" 2>resume.log \
  || { tail -5 resume.log; fail "resumed training failed"; }
cmp -s lenet_iter_10000.caffemodel resumed_iter_10000.caffemodel && pass \
  || fail "weights after resuming at 5000 differ from the uninterrupted run"
finish
