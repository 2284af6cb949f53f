# scripts/caffe-sweep on a small folder of Caffe-style prototxt files written here: a V1 net
# (`layers`, a DATA layer with the old data_param fields, a loss without a top), a net with a
# Python layer, a WindowData net, a net reading HDF5Data, ImageData and Data sources (one phase
# or stage each), a net with absolute sources and a gray image list under a root folder, a
# net reading LevelDB (Caffe's default backend, named or not, and a mean file of it: the sweep
# makes LevelDBs for them, as Caffe's siamese example needs), a
# solver with `solver_type`, one with its net inside (whose data the sweep makes too), and a
# solver whose net is not in the folder. The
# table must say built, refused or read for each with its reason, the exit status 0; a net that
# cannot build makes a FAIL row naming the cause and exit status 1; the folder swept is left as
# it was. Then `kiln train --check` directly: it reads and builds, trains and writes nothing, and
# still refuses a bad solver.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
command -v python3 >/dev/null || { echo "caffe_sweep.sh: needs python3 to write PNG files"; exit 77; }
SWEEP="$SRC/scripts/caffe-sweep"

mkdir -p caffe/examples/toy caffe/models/toy
cat > caffe/examples/toy/v1_train_test.prototxt <<'EOF'
name: "ToyV1"
layers {
  name: "digits" type: DATA top: "data" top: "label"
  data_param { source: "examples/toy/mnist_toy_train_lmdb" backend: LMDB batch_size: 5 scale: 0.00390625 }
  include: { phase: TRAIN }
}
layers {
  name: "digits" type: DATA top: "data" top: "label"
  data_param { source: "examples/toy/mnist_toy_test_lmdb" backend: LMDB batch_size: 3 }
  transform_param { mean_file: "examples/toy/mnist_toy_mean.binaryproto" }
  include: { phase: TEST }
}
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 4 kernel_size: 5 weight_filler { type: "xavier" } } }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "fc" type: INNER_PRODUCT bottom: "pool" top: "fc" inner_product_param { num_output: 3 } }
layers { name: "acc" type: ACCURACY bottom: "fc" bottom: "label" top: "acc" include: { phase: TEST } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "fc" bottom: "label" }
EOF
cat > caffe/examples/toy/python_loss.prototxt <<'EOF'
name: "ToyPython"
layer { name: "x" type: "DummyData" top: "x" dummy_data_param { shape { dim: 2 dim: 3 } } }
layer { name: "loss" type: "Python" bottom: "x" top: "loss" python_param { module: "m" layer: "L" } }
EOF
# a pycaffe-style loss (it imports caffe) in a folder of its own, as examples/pycaffe/layers
mkdir -p caffe/examples/toy/layers
cat > caffe/examples/toy/layers/toyloss.py <<'EOF'
import caffe
import numpy as np


class HalfSquare(caffe.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(1)

    def forward(self, bottom, top):
        top[0].data[...] = 0.5 * np.sum(bottom[0].data ** 2)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff[0] * bottom[0].data
EOF
cat > caffe/examples/toy/pylinreg.prototxt <<'EOF'
name: "ToyPythonFound"
layer { name: "x" type: "DummyData" top: "x" dummy_data_param { shape { dim: 4 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "Python" bottom: "ip" top: "loss"
  python_param { module: 'toyloss' layer: 'HalfSquare' } loss_weight: 1 }
EOF
cat > caffe/examples/toy/windows.prototxt <<'EOF'
name: "ToyWindows"
layer { name: "w" type: "WindowData" top: "data" top: "label"
  window_data_param { source: "examples/toy/windows.txt" batch_size: 2 } }
EOF
cat > caffe/models/toy/sources.prototxt <<'EOF'
name: "ToySources"
layer { name: "h5" type: "HDF5Data" top: "data" top: "label" include { phase: TRAIN }
  hdf5_data_param { source: "models/toy/h5_list.txt" batch_size: 2 } }
layer { name: "img" type: "ImageData" top: "data" top: "label" include { phase: TEST stage: "images" }
  transform_param { crop_size: 12 mean_file: "models/toy/image_mean.binaryproto" }
  image_data_param { source: "models/toy/images.txt" batch_size: 2 new_height: 20 new_width: 20 } }
layer { name: "db" type: "Data" top: "data" top: "label" include { phase: TEST stage: "lmdb" }
  data_param { source: "models/toy/cifar_toy_lmdb" backend: LMDB batch_size: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
EOF
# an absolute source and mean file (made under the work copy, the line rewritten there), and an
# image list under a root folder, gray
cat > caffe/models/toy/places.prototxt <<EOF
name: "ToyPlaces"
layer { name: "db" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  data_param { source: "$WORK/elsewhere/cifar_abs_lmdb" backend: LMDB batch_size: 2 }
  transform_param { mean_file: "$WORK/elsewhere/mean.binaryproto" } }
layer { name: "img" type: "ImageData" top: "data" top: "label" include { phase: TEST }
  image_data_param { source: "models/toy/gray.txt" root_folder: "pictures/" batch_size: 2 is_color: false } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" }
EOF
# Caffe's default backend (LevelDB) in TRAIN, named in TEST with a mean file; pairs: 2x28x28
cat > caffe/examples/toy/siamese_train_test.prototxt <<'EOF'
name: "ToySiamese"
layer { name: "pairs" type: "Data" top: "pair_data" top: "sim" include { phase: TRAIN }
  data_param { source: "examples/toy/toy_siamese_train_leveldb" batch_size: 4 } }
layer { name: "pairs" type: "Data" top: "pair_data" top: "sim" include { phase: TEST }
  transform_param { mean_file: "examples/toy/toy_siamese_mean.binaryproto" }
  data_param { source: "examples/toy/toy_siamese_test_leveldb" batch_size: 2 backend: LEVELDB } }
layer { name: "fc" type: "InnerProduct" bottom: "pair_data" top: "fc" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "sim" }
EOF
cat > caffe/examples/toy/solver.prototxt <<'EOF'
net: "examples/toy/v1_train_test.prototxt"
test_iter: 1
test_interval: 10
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
max_iter: 10
solver_type: NESTEROV
EOF
cat > caffe/examples/toy/inline_solver.prototxt <<'EOF'
base_lr: 0.1
lr_policy: "fixed"
type: "AdaDelta"
net_param {
  name: "Inline"
  layer { name: "d" type: "Data" top: "data" top: "label"
    data_param { source: "examples/toy/inline_only_lmdb" backend: LMDB batch_size: 2 } }
  layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 2 } }
  layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" }
}
EOF
cat > caffe/models/toy/lost_solver.prototxt <<'EOF'
net: "models/toy/not_here.prototxt"
base_lr: 0.1
lr_policy: "fixed"
solver_type: ADAGRAD
EOF
find caffe -type f | LC_ALL=C sort | xargs cksum > before.txt

"$SWEEP" --kiln "$KILN" caffe > table.txt 2> sweep.err
rc=$?
[ $rc = 0 ] && pass || fail "sweep exit $rc: $(cat sweep.err; tail -n 5 table.txt)"
row() {  # row FILE PHASE RESULT REASON_FRAGMENT
  local line
  line=$(grep -E "^$1 +$2 +" table.txt)
  case $line in
    *" $3 "*"$4"*) pass ;;
    *) fail "row $1 $2: want '$3 ... $4', got '${line:-nothing}'" ;;
  esac
}
row examples/toy/v1_train_test.prototxt TRAIN built "total: "
row examples/toy/v1_train_test.prototxt TEST built "total: "
# a Python layer whose module is nowhere: refused naming it (kiln built with Python), or the
# type (without); one whose module is in the folder: built
if grep -q "where kiln has Python" <<< "$("$KILN" describe --model caffe/examples/toy/python_loss.prototxt 2>&1)"; then
  row examples/toy/python_loss.prototxt TRAIN refused "Caffe's layer type 'Python'"
  row examples/toy/pylinreg.prototxt TRAIN refused "Caffe's layer type 'Python'"
  python_rows=0
else
  row examples/toy/python_loss.prototxt TRAIN refused "No module named 'm'"
  row examples/toy/python_loss.prototxt TEST refused "No module named 'm'"
  row examples/toy/pylinreg.prototxt TRAIN built "total: 8 parameters"
  row examples/toy/pylinreg.prototxt TEST built "total: 8 parameters"
  python_rows=1
fi
[ ! -e caffe/examples/toy/layers/__pycache__ ] && pass || fail "the sweep wrote into the folder's layers"
row examples/toy/windows.prototxt read refused "the parameter block of Caffe's WindowData layer"
row models/toy/sources.prototxt TRAIN built "total: "
row models/toy/sources.prototxt TEST:images built "total: "
row models/toy/sources.prototxt TEST:lmdb built "total: "
row models/toy/places.prototxt TRAIN built "total: 6146 parameters"
row models/toy/places.prototxt TEST built "total: 514 parameters"
[ ! -e "$WORK/elsewhere" ] && pass || fail "the sweep wrote outside its copy: $(ls -R "$WORK/elsewhere")"
row examples/toy/siamese_train_test.prototxt TRAIN built "total: 3138 parameters"
row examples/toy/siamese_train_test.prototxt TEST built "total: 3138 parameters"
row examples/toy/solver.prototxt solver built "read (Nesterov), train net and 1 test net built"
row examples/toy/inline_solver.prototxt solver built "read (AdaDelta), train net and 0 test nets built"
row models/toy/lost_solver.prototxt solver read "models/toy/not_here.prototxt is not in the folder"
if [ $python_rows = 1 ]; then summary="13 built, 1 read, 3 refused"; else summary="11 built, 1 read, 5 refused"; fi
grep -q "^10 files (7 nets, 3 solvers): $summary, 0 failed$" table.txt && pass \
  || fail "summary: $(tail -n 1 table.txt)"
find caffe -type f | LC_ALL=C sort | xargs cksum | cmp -s - before.txt && pass \
  || fail "the swept folder changed"

# a net that cannot build: a FAIL row naming the cause, and exit status 1
printf 'name: "broken"\nlayer { name: "fc" type: "InnerProduct" bottom: "nowhere" top: "fc" inner_product_param { num_output: 2 } }\n' \
  > caffe/models/toy/broken.prototxt
"$SWEEP" --kiln "$KILN" caffe > table2.txt 2>&1
rc=$?
[ $rc = 1 ] && pass || fail "sweep with a broken net: exit $rc, want 1"
cp table2.txt table.txt
row models/toy/broken.prototxt TRAIN FAIL "nowhere"
expect_error "no folder" "not a folder" -- "$SWEEP" --kiln "$KILN" "$WORK/none"

# kiln train --check: reads the solver and builds its nets, trains nothing, writes nothing
source "$(dirname "$0")/tiny.bash"
tiny_lmdb
tiny_net 4 > net.prototxt
printf 'net: "%s/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 3\nsnapshot_prefix: "%s/snap"\nsolver_type: ADAM\n' \
  "$WORK" "$WORK" > s.prototxt
out=$("$KILN" train --solver s.prototxt --check 2>check.err) && pass || fail "--check: $(cat check.err)"
[ "$out" = "s.prototxt: read (Adam), train net and 0 test nets built; not trained (--check)" ] && pass \
  || fail "--check said '$out'"
[ -z "$(ls snap* 2>/dev/null)" ] && pass || fail "--check wrote $(ls snap*)"
sed 's/"fixed"/"sometimes"/' s.prototxt > bad.prototxt
expect_error "--check of a bad solver" "unknown lr_policy 'sometimes'" -- "$KILN" train --solver bad.prototxt --check
finish
