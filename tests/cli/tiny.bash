# A tiny data set and net for the shell tests (sourced after lib.bash, in $WORK; not a test):
#   - tiny_lmdb: tiny_lmdb, 64 records of 1x8x8 bytes (a fixed pseudo-random pattern) with labels
#     0..3, written through hand-made IDX files;
#   - tiny_net BATCH [EXTRA_DATA_PARAM]: a small conv net on it (Data, Convolution, ReLU,
#     InnerProduct, SoftmaxWithLoss; 40 + 580 parameters), on standard output;
#   - tiny_bn_net BATCH: the same with BatchNorm and Scale (bias) between the convolution and
#     the ReLU, all three in place, on standard output; the convolution has no bias, as before a
#     BatchNorm in Caffe's ResNets (its gradient would be zero but for rounding, and its values
#     rounding noise that no comparison between kernels could hold to a tolerance);
#   - tiny_accuracy_net: a linear classifier on it (batch 8) with an Accuracy layer in the TEST
#     phase, as CE reads accuracy from the test passes; tiny_accuracy_solver: its solver
#     (net.prototxt beside it, 100 iterations, a test pass of the 64 records at the end). Both on
#     standard output.
tiny_lmdb() {
  {
    printf '\x00\x00\x08\x03\x00\x00\x00\x40\x00\x00\x00\x08\x00\x00\x00\x08'
    LC_ALL=C awk 'BEGIN { srand(7); for (i = 0; i < 4096; i++) printf "%c", int(rand() * 256) }'
  } > img.idx
  {
    printf '\x00\x00\x08\x01\x00\x00\x00\x40'
    for i in $(seq 0 63); do printf "\\x0$((i % 4))"; done
  } > lab.idx
  "$KILN" convert idx img.idx lab.idx tiny_lmdb >/dev/null || { fail "convert"; finish; exit 1; }
}

tiny_net() {
  cat <<NET
name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "$WORK/tiny_lmdb" batch_size: $1 backend: LMDB ${2:-} }
  transform_param { scale: 0.00390625 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
}

tiny_bn_net() {
  cat <<NET
name: "bn"
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "$WORK/tiny_lmdb" batch_size: $1 backend: LMDB }
  transform_param { scale: 0.00390625 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 bias_term: false
    weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
}

tiny_accuracy_net() {
  cat <<NET
name: "tiny_accuracy"
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "$WORK/tiny_lmdb" batch_size: 8 backend: LMDB }
  transform_param { scale: 0.00390625 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy"
  include { phase: TEST } }
NET
}

tiny_accuracy_solver() {
  printf 'net: "net.prototxt"\nbase_lr: 0.1\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 100\n'
  printf 'test_iter: 8\ntest_interval: 100\nrandom_seed: 3\n'
}
