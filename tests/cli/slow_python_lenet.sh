# LeNet fed by a Python data layer (NumPy reading Debian's Fashion-MNIST files) and scored by a
# NumPy softmax loss (examples/python), trained by the kiln command at the zoo's budget (10,000
# iterations of 64): at least 0.89 test accuracy, as models/lenet reaches with kiln's own layers.
# Skips (exit 77) without Python in kiln or without the Debian package's files.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] \
  || { echo "skipped: Debian's dataset-fashion-mnist is not installed"; exit 77; }
cp "$SRC"/examples/python/lenet_python_*.prototxt .
sed -i -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/lp\"#" -e "s#^snapshot: .*#snapshot: 0#" \
  lenet_python_solver.prototxt
PYTHONPATH="$SRC/examples/python" "$KILN" train --solver lenet_python_solver.prototxt \
  --metrics m.jsonl > train.log 2>&1; rc=$?
if [ $rc != 0 ] && grep -q "where kiln has Python" train.log; then
  echo "skipped: kiln was built without Python"
  exit 77
fi
[ $rc = 0 ] && pass || fail "training: $(tail -n 5 train.log)"
last=$(grep '"event":"test"' m.jsonl | tail -n 1)
echo "$last"
echo "$last" | grep -q '"iter":10000' && pass || fail "last test not at 10000: $last"
acc=$(echo "$last" | sed -n 's/.*"accuracy":\([0-9.e-]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.89) }' && pass || fail "accuracy $acc < 0.89"
finish
