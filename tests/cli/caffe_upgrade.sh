# Caffe's old formats, upgraded on load as Caffe does: a V1 net (`layers { type: CONVOLUTION
# blobs_lr: ... }`, data transformation fields in data_param) and a V0 net (`layers { layer {
# type: "conv" kernelsize: 3 } }` with a "padding" layer) train to the same bits as the same nets
# written in the current format; `kiln upgrade` writes the current format (nets and a solver's
# solver_type), and its output trains the same again; broken old files are refused by name.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/tiny.bash"
tiny_lmdb

cat > v2.prototxt <<NET
name: "t"
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "$WORK/tiny_lmdb" batch_size: 4 backend: LMDB }
  transform_param { scale: 0.00390625 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
cat > v1.prototxt <<NET
name: "t"
layers { name: "d" type: DATA top: "data" top: "label"
  data_param { source: "$WORK/tiny_lmdb" batch_size: 4 backend: LMDB scale: 0.00390625 } }
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "pool" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss" }
NET
cat > v0.prototxt <<NET
name: "t"
layers { layer { name: "d" type: "data" source: "$WORK/tiny_lmdb" batchsize: 4 scale: 0.00390625 }
  top: "data" top: "label" }
layers { layer { name: "pad" type: "padding" pad: 1 } bottom: "data" top: "padded" }
layers { layer { name: "conv" type: "conv" num_output: 4 kernelsize: 3
    weight_filler { type: "xavier" } bias_filler { type: "constant" value: 0.1 }
    blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0 }
  bottom: "padded" top: "conv" }
layers { layer { name: "relu" type: "relu" } bottom: "conv" top: "conv" }
layers { layer { name: "pool" type: "pool" pool: MAX kernelsize: 2 stride: 2 } bottom: "conv" top: "pool" }
layers { layer { name: "ip" type: "innerproduct" num_output: 4 weight_filler { type: "xavier" } }
  bottom: "pool" top: "ip" }
layers { layer { name: "loss" type: "softmax_loss" } bottom: "ip" bottom: "label" top: "loss" }
NET
solver() {  # solver NET PREFIX [EXTRA]
  printf 'net: "%s/%s"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 8\ndisplay: 0\nrandom_seed: 9\n' "$WORK" "$1"
  printf 'snapshot_after_train: true\nsnapshot_prefix: "%s/%s"\n%s\n' "$WORK" "$2" "${3:-}"
}
solver v2.prototxt v2 > s2.prototxt
solver v1.prototxt v1 > s1.prototxt
"$KILN" train --solver s2.prototxt > v2.log 2>&1 || fail "current format: $(tail -n 3 v2.log)"
"$KILN" train --solver s1.prototxt > v1.log 2>&1 || fail "V1: $(tail -n 3 v1.log)"
cmp -s v2_iter_8.caffemodel v1_iter_8.caffemodel && pass || fail "V1 net trains to other weights"

# V0: its data layer has no backend field (LevelDB in Caffe): give it the LMDB through the upgrade
"$KILN" upgrade v0.prototxt v0_up.prototxt > up0.log 2>&1 && pass || fail "upgrade V0: $(cat up0.log)"
grep -q 'pad: 1' v0_up.prototxt && ! grep -q '"padding"' v0_up.prototxt && pass \
  || fail "the padding layer is not folded into the convolution: $(cat v0_up.prototxt)"
sed -i 's/batch_size: 4/batch_size: 4\n    backend: LMDB/' v0_up.prototxt
solver v0_up.prototxt v0 > s0.prototxt
"$KILN" train --solver s0.prototxt > v0.log 2>&1 || fail "V0: $(tail -n 3 v0.log)"
cmp -s v2_iter_8.caffemodel v0_iter_8.caffemodel && pass || fail "V0 net trains to other weights"

# kiln upgrade of the V1 net: the current format, which trains the same
"$KILN" upgrade v1.prototxt v1_up.prototxt > up1.log 2>&1 && grep -q '^upgraded ' up1.log && pass \
  || fail "upgrade V1: $(cat up1.log)"
grep -q '^layers' v1_up.prototxt && fail "upgraded file still has V1 layers" || pass
solver v1_up.prototxt v1u > s1u.prototxt
"$KILN" train --solver s1u.prototxt > v1u.log 2>&1 && cmp -s v2_iter_8.caffemodel v1u_iter_8.caffemodel \
  && pass || fail "the upgraded V1 net trains to other weights"
"$KILN" upgrade v2.prototxt same.prototxt | grep -q "^already current: " && pass || fail "current net reported upgraded"

# a solver's solver_type: NESTEROV trains as type "Nesterov", and kiln upgrade writes the type
solver v2.prototxt nt 'type: "Nesterov"' > snt.prototxt
solver v2.prototxt ne 'solver_type: NESTEROV' > sne.prototxt
"$KILN" train --solver snt.prototxt > nt.log 2>&1 && "$KILN" train --solver sne.prototxt > ne.log 2>&1 \
  && cmp -s nt_iter_8.caffemodel ne_iter_8.caffemodel && pass || fail "solver_type NESTEROV: $(tail -n 2 ne.log)"
"$KILN" upgrade sne.prototxt sne_up.prototxt > ups.log 2>&1 && grep -q '^type: "Nesterov"$' sne_up.prototxt \
  && ! grep -q solver_type sne_up.prototxt && pass || fail "solver upgrade: $(cat ups.log; cat sne_up.prototxt)"

# broken old files: refused by name
printf 'layers { name: "x" type: NONE }\n' > none.prototxt
expect_error "V1 layer without a type" "none.prototxt: V1 layer 0 ('x') has no layer type" -- "$KILN" describe --model none.prototxt
printf 'layers { layer { name: "x" type: "warp" } }\n' > warp.prototxt
expect_error "unknown V0 type" "warp.prototxt: V0 layer 0 ('x'): unknown V0 layer type 'warp'" -- "$KILN" describe --model warp.prototxt
printf 'layer { name: "a" type: "ReLU" }\nlayers { name: "b" type: RELU }\n' > both.prototxt
expect_error "both formats" "both.prototxt: holds both 'layer'" -- "$KILN" describe --model both.prototxt
printf 'layers { layer { name: "p" type: "padding" pad: 1 } bottom: "a" top: "b" }\nlayers { layer { name: "r" type: "relu" } bottom: "b" top: "c" }\n' > pad.prototxt
expect_error "padding into relu" "padding layer 'p' feeds a 'relu' layer" -- "$KILN" describe --model pad.prototxt
printf 'layers { name: "w" type: WINDOW_DATA window_data_param { source: "w.txt" } }\n' > win.prototxt
expect_error "V1 block of a missing type" "'window_data_param' is the parameter block of Caffe's WindowData layer" -- "$KILN" describe --model win.prototxt
# a V1 block of a type kiln has: carried over by the upgrade
printf 'input: "x"\ninput_dim: 1\ninput_dim: 2\ninput_dim: 1\ninput_dim: 1\nlayers { name: "e" type: EXP bottom: "x" top: "y" exp_param { base: 2 } }\n' > exp.prototxt
"$KILN" upgrade exp.prototxt exp_up.prototxt > upe.log 2>&1 && grep -q 'type: "Exp"' exp_up.prototxt && grep -q 'base: 2' exp_up.prototxt \
  && pass || fail "V1 EXP with exp_param: $(cat upe.log exp_up.prototxt)"
expect_error "upgrade to nowhere" "cannot" -- "$KILN" upgrade v1.prototxt /nonexistent/dir/out.prototxt
[ ! -e /nonexistent/dir/out.prototxt ] && pass || fail "file left"
finish
