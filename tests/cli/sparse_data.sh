# Sparse data end to end: logistic regression on a libsvm file (LibSVMData into a sparse
# InnerProduct) learns a separable problem, a run resumed from its half-way snapshot ends with
# weights bit-identical to the uninterrupted run, and a file with index 0, non-increasing
# indices, a junk token or an index past dim is refused naming the file and the line, before
# anything is written.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export OMP_NUM_THREADS=1

# Class 1 rows hold one of features 1-10, class 0 one of 91-100, both 4 more of 11-90: records
# of 2 classes over 100 features, 5 entries a row. awk's rand() with a fixed seed.
rows() {
  awk -v n="$1" -v seed="$2" 'BEGIN {
    srand(seed)
    for (r = 0; r < n; r++) {
      y = r % 2
      delete f
      f[y ? 1 + int(rand() * 10) : 91 + int(rand() * 10)] = 1
      while (length(f) < 5) f[11 + int(rand() * 80)] = 1
      line = y
      for (i = 1; i <= 100; i++) if (i in f) line = line " " i ":" sprintf("%.3f", 0.5 + rand() / 2)
      print line
    }
  }'
}
rows 400 1 > train.svm
rows 100 2 > test.svm

net() { # net FILE_TRAIN
  cat <<NET
name: "sparse_lr"
layer { name: "data" type: "LibSVMData" top: "x" top: "label" include { phase: TRAIN }
  libsvm_data_param { source: "$1" batch_size: 16 dim: 100 shuffle: true } }
layer { name: "data" type: "LibSVMData" top: "x" top: "label" include { phase: TEST }
  libsvm_data_param { source: "test.svm" batch_size: 25 dim: 100 } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy"
  include { phase: TEST } }
NET
}
solver() { # solver NET PREFIX
  cat <<S
net: "$1"
test_iter: 4
test_interval: 100
base_lr: 0.5
momentum: 0.9
lr_policy: "fixed"
display: 0
max_iter: 200
snapshot: 100
snapshot_prefix: "$2"
random_seed: 7
S
}
net train.svm > net.prototxt
solver net.prototxt straight > straight.prototxt
solver net.prototxt resumed > resumed.prototxt
need "training" -- "$KILN" train --solver straight.prototxt --metrics straight.jsonl
acc=$(grep '"event":"test","iter":200' straight.jsonl | sed 's/.*"accuracy":\([0-9.]*\).*/\1/')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }' && pass || fail "test accuracy '$acc' below 0.95"
need "resumed run" -- "$KILN" train --solver resumed.prototxt \
  --snapshot straight_iter_100.solverstate --metrics resumed.jsonl
cmp -s straight_iter_200.caffemodel resumed_iter_200.caffemodel && pass \
  || fail "resumed weights differ from the uninterrupted run"
cmp -s straight_iter_100.caffemodel straight_iter_200.caffemodel && fail "weights did not change" \
  || pass
b=$(grep '"event":"test","iter":200' resumed.jsonl | sed 's/.*"accuracy":\([0-9.]*\).*/\1/')
[ "$acc" = "$b" ] && pass || fail "test pass at 200: uninterrupted '$acc', resumed '$b'"

# Bad files: each refused at set-up naming the file, the line and the token; no snapshot written.
bad() { # bad NAME LINE3 WANT...
  local name=$1 line=$2
  shift 2
  { head -n 2 train.svm; echo "$line"; tail -n 5 train.svm; } > "$name.svm"
  net "$name.svm" > "$name.prototxt"
  solver "$name.prototxt" "$name" > "$name.solver"
  local -a wants=()
  for w in "$@"; do wants+=(--want "$w"); done
  expect_refusal "$name" --want "$name.svm:3: token" "${wants[@]}" \
    --gone "${name}_iter_100.caffemodel" -- "$KILN" train --solver "$name.solver"
}
bad index0 "1 0:1 5:1" "'0:1'" "index 0"
bad decreasing "1 5:1 3:1" "'3:1'" "must increase"
bad repeated "0 5:1 5:1" "'5:1'" "does not follow 5"
bad junk "1 5:1 oops" "'oops'" "not INDEX:VALUE"
bad past_dim "1 5:1 101:1" "'101:1'" "past the 100 features"
finish
