# `kiln export onnx` (docs/onnx.md): the zoo's small deploy CNNs (LeNet; the deploy forms of
# cifar10_quick, cifar10_full with WITHIN_CHANNEL LRN, resnet20, vgg and densenet40 on
# Fashion-MNIST's 1x28x28; GoogLeNet at batch 1) and a net of every exported layer type are
# exported with random weights; ONNX's checker takes each model and OpenCV's ONNX importer runs it
# to kiln's outputs within 1e-4 (and named inner blobs within 1e-4 of their magnitude). Two nets
# again with --dynamic-batch, run at another batch size. Then what is refused, each with nothing
# written: a layer type with no ONNX form (named), a sequence layer with none (LSTMUnit), a data
# layer, a missing weights file, an output that cannot be written. AlexNet, ZF Net, VGG-16 and
# ResNet-50 are in slow_onnx_zoo.sh.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/onnx.bash"

# the zoo's train/test CNNs in their deploy form, batch 2
for n in cifar10_quick/cifar10_quick cifar10_full/cifar10_full_norm resnet20/resnet20 vgg/vgg \
  densenet/densenet40; do
  b=$(basename "$n")
  need "deploy form of $b" -- "${ONNX_PY:-python3}" "$SRC/tests/cli/onnx_deploy.py" \
    "$SRC/models/${n}_train_test.prototxt" "$b.prototxt" 2 1 28 28 || continue
  # the scores under the final Softmax too
  logits=$(sed -n 's/.*name: "prob" type: "Softmax" bottom: "\([^"]*\)".*/\1/p' "$b.prototxt")
  onnx_round_trip "$b" "$b.prototxt" "$logits"
done
sed 's/dim: 64 /dim: 2 /' "$SRC/models/lenet/lenet_deploy.prototxt" > lenet.prototxt
onnx_round_trip lenet lenet.prototxt ip2
sed 's/dim: 10 dim: 3 /dim: 1 dim: 3 /' "$SRC/models/googlenet/deploy.prototxt" > googlenet.prototxt
onnx_round_trip googlenet googlenet.prototxt loss3/classifier inception_3a/output

# Every exported layer type, in the forms that take different ONNX nodes: grouped and dilated
# convolution, BatchNorm alone and with its Scale, PReLU, AVE pooling with padding and a ceil
# overhang (and either alone), MAX with an overhang, global pooling, the neurons with their
# parameters, Eltwise's three operations (SUM with coefficients), Concat, both LRNs, Scale and
# Bias alone, Slice into unequal pieces, Deconvolution, Flatten of axis 1 and of a middle range,
# Reshape, InnerProduct over axis 1 and 2 (transposed), Softmax over axis 2, ArgMax's forms,
# Dropout, and fan-out through the Splits kiln inserts.
cat > every.prototxt <<'NET'
name: "every_layer"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 12 dim: 12 } } }
layer { name: "conv_a" type: "Convolution" bottom: "data" top: "conv_a" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "relu_a" type: "ReLU" bottom: "conv_a" top: "conv_a" relu_param { negative_slope: 0.1 } }
layer { name: "conv_g" type: "Convolution" bottom: "conv_a" top: "conv_g" convolution_param { num_output: 8 kernel_size: 3 pad: 2 dilation: 2 group: 2 } }
layer { name: "bn_g" type: "BatchNorm" bottom: "conv_g" top: "conv_g" }
layer { name: "prelu_g" type: "PReLU" bottom: "conv_g" top: "conv_g" }
layer { name: "pool_ave" type: "Pooling" bottom: "conv_g" top: "pool_ave" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "pool_ave0" type: "Pooling" bottom: "conv_g" top: "pool_ave0" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "pool_max" type: "Pooling" bottom: "conv_g" top: "pool_max" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "pool_ave_a" type: "Pooling" bottom: "conv_g" top: "pool_ave_a" pooling_param { pool: AVE kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "gap" type: "Pooling" bottom: "conv_g" top: "gap" pooling_param { pool: AVE global_pooling: true } }
layer { name: "gmp" type: "Pooling" bottom: "pool_ave0" top: "gmp" pooling_param { pool: MAX global_pooling: true } }
layer { name: "sig" type: "Sigmoid" bottom: "pool_max" top: "sig" }
layer { name: "tanh" type: "TanH" bottom: "pool_max" top: "tanh" }
layer { name: "abs" type: "AbsVal" bottom: "pool_max" top: "abs" }
layer { name: "elu" type: "ELU" bottom: "pool_max" top: "elu" elu_param { alpha: 0.5 } }
layer { name: "bnll" type: "BNLL" bottom: "pool_max" top: "bnll" }
layer { name: "power" type: "Power" bottom: "pool_max" top: "power" power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "exp" type: "Exp" bottom: "pool_max" top: "exp" exp_param { base: 2 scale: 0.5 shift: 0.1 } }
layer { name: "log" type: "Log" bottom: "sig" top: "log" log_param { base: 10 scale: 2 shift: 0.5 } }
layer { name: "sum" type: "Eltwise" bottom: "sig" bottom: "tanh" bottom: "abs" top: "sum" eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 } }
layer { name: "prod" type: "Eltwise" bottom: "elu" bottom: "bnll" top: "prod" eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "power" bottom: "exp" bottom: "log" top: "max" eltwise_param { operation: MAX } }
layer { name: "cat" type: "Concat" bottom: "pool_ave" bottom: "pool_max" bottom: "pool_ave_a" bottom: "sum" bottom: "prod" bottom: "max" top: "cat" }
layer { name: "lrn_across" type: "LRN" bottom: "cat" top: "lrn_across" lrn_param { local_size: 5 alpha: 0.5 beta: 0.75 k: 2 } }
layer { name: "lrn_within" type: "LRN" bottom: "cat" top: "lrn_within" lrn_param { local_size: 3 alpha: 0.8 beta: 0.6 norm_region: WITHIN_CHANNEL } }
layer { name: "scale_s" type: "Scale" bottom: "lrn_within" top: "scale_s" scale_param { bias_term: true } }
layer { name: "bias_b" type: "Bias" bottom: "lrn_across" top: "bias_b" }
layer { name: "mix" type: "Eltwise" bottom: "scale_s" bottom: "bias_b" top: "mix" }
layer { name: "slice" type: "Slice" bottom: "mix" top: "s1" top: "s2" top: "s3" slice_param { axis: 1 slice_point: 16 slice_point: 40 } }
layer { name: "deconv" type: "Deconvolution" bottom: "s1" top: "deconv" convolution_param { num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: 2 } }
layer { name: "dgp" type: "Pooling" bottom: "deconv" top: "dgp" pooling_param { pool: MAX global_pooling: true } }
layer { name: "dgf" type: "Flatten" bottom: "dgp" top: "dgf" flatten_param { axis: 2 } }
layer { name: "flat" type: "Flatten" bottom: "s2" top: "flat" }
layer { name: "ip" type: "InnerProduct" bottom: "flat" top: "ip" inner_product_param { num_output: 10 } }
layer { name: "reshape" type: "Reshape" bottom: "s3" top: "r3" reshape_param { shape { dim: 0 dim: 8 dim: -1 } } }
layer { name: "ip_axis2" type: "InnerProduct" bottom: "r3" top: "ip2" inner_product_param { num_output: 5 axis: 2 } }
layer { name: "ip_t" type: "InnerProduct" bottom: "r3" top: "ipt" inner_product_param { num_output: 4 axis: 2 transpose: true bias_term: false } }
layer { name: "sm2" type: "Softmax" bottom: "ip2" top: "sm2" softmax_param { axis: 2 } }
layer { name: "argmax" type: "ArgMax" bottom: "ip" top: "argmax" argmax_param { axis: 1 } }
layer { name: "argmax_v" type: "ArgMax" bottom: "ipt" top: "argmax_v" argmax_param { axis: 2 out_max_val: true } }
layer { name: "argmax_f" type: "ArgMax" bottom: "ipt" top: "argmax_f" argmax_param { out_max_val: true } }
layer { name: "conv_b" type: "Convolution" bottom: "data" top: "conv_b" convolution_param { num_output: 4 kernel_size: 1 bias_term: false } }
layer { name: "bn_b" type: "BatchNorm" bottom: "conv_b" top: "conv_b" batch_norm_param { eps: 0.001 } }
layer { name: "sc_b" type: "Scale" bottom: "conv_b" top: "conv_b" scale_param { bias_term: true } }
layer { name: "relu_b" type: "ReLU" bottom: "conv_b" top: "conv_b" }
layer { name: "gb" type: "Pooling" bottom: "conv_b" top: "gb" pooling_param { pool: AVE kernel_size: 5 stride: 3 pad: 2 } }
layer { name: "drop" type: "Dropout" bottom: "ip" top: "ip_drop" }
layer { name: "prob" type: "Softmax" bottom: "ip_drop" top: "prob" }
NET
onnx_round_trip every every.prototxt conv_g pool_ave pool_ave0 pool_ave_a pool_max lrn_within \
  lrn_across mix deconv log exp power bnll elu ip r3 ipt
# every layer type of the net is one the exporter claims, and the summary counts the Dropout
grep -q "^1 Dropout layer left out (the identity at inference)$" every.out && pass \
  || fail "every: no Dropout line: $(cat every.out)"
# BatchNorm and the Scale after it are one BatchNormalization; BatchNorm alone is one too
if [ -n "$ONNX_PY" ]; then
  ops=$("$ONNX_PY" -c 'import onnx, sys; m = onnx.load(sys.argv[1]); print(" ".join(n.op_type + ":" + n.name for n in m.graph.node))' every.onnx)
  case " $ops " in
    *" BatchNormalization:bn_g "*" BatchNormalization:bn_b "*) pass ;;
    *) fail "every: no BatchNormalization for bn_g and bn_b: $ops" ;;
  esac
  case " $ops " in *":sc_b "*) fail "every: sc_b not folded into bn_b: $ops" ;; *) pass ;; esac
fi
onnx_check_all

# --dynamic-batch: exported from a batch-1 net, run by OpenCV on the batch-2 inputs
for b in lenet resnet20; do
  sed 's/dim: 2 dim: 1 dim: 28/dim: 1 dim: 1 dim: 28/' "$b.prototxt" > "$b-1.prototxt"
  "$KILN" export onnx --model "$b-1.prototxt" --weights "$b.caffemodel" --dynamic-batch \
    "$b-dyn.onnx" > "$b-dyn.out" 2>&1 && grep -q "^input data N=1x1x28x28$" "$b-dyn.out" \
    && grep -q "^output prob N=1x10$" "$b-dyn.out" && pass \
    || fail "$b --dynamic-batch: $(cat "$b-dyn.out")"
  ONNX_CHECKS+=("$b-dyn.onnx" "$b.d")
done
if [ -n "$ONNX_PY" ]; then
  "$ONNX_PY" -c 'import onnx, sys; m = onnx.load(sys.argv[1]); d = m.graph.input[0].type.tensor_type.shape.dim[0]; sys.exit(d.dim_param != "N")' \
    lenet-dyn.onnx && pass || fail "lenet-dyn.onnx: the input's first axis is not N"
fi
onnx_check_all

# ---- refusals: a clear message, exit 1 or 2, nothing written -----------------------------------
W=lenet.caffemodel
cat > thresh.prototxt <<'NET'
name: "thresh"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 } } }
layer { name: "cut" type: "Threshold" bottom: "data" top: "cut" }
NET
expect_refusal "a type with no ONNX form" --want "thresh.prototxt: layer 'cut' (Threshold): has no ONNX form" \
  --want "nothing written" --gone thresh.onnx -- "$KILN" export onnx --model thresh.prototxt --weights $W thresh.onnx
cp lenet.onnx kept.onnx
expect_refusal "an existing OUT is left as it was" --want "layer 'cut' (Threshold)" --same kept.onnx \
  -- "$KILN" export onnx --model thresh.prototxt --weights $W kept.onnx
cat > unit.prototxt <<'NET'
name: "seq"
layer { name: "data" type: "Input" top: "c0" top: "g" top: "cont" input_param { shape { dim: 1 dim: 2 dim: 3 } shape { dim: 1 dim: 2 dim: 12 } shape { dim: 1 dim: 2 } } }
layer { name: "unit" type: "LSTMUnit" bottom: "c0" bottom: "g" bottom: "cont" top: "c" top: "h" }
NET
expect_refusal "a sequence layer with no ONNX form" --want "layer 'unit' (LSTMUnit): one step of Caffe's unrolled LSTM" \
  --gone unit.onnx -- "$KILN" export onnx --model unit.prototxt --weights $W unit.onnx
cat > dummy.prototxt <<'NET'
name: "dummy"
layer { name: "data" type: "DummyData" top: "data" dummy_data_param { shape { dim: 1 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
NET
expect_refusal "a data layer" --want "layer 'data' (DummyData): a data layer reads files at training time: export the deploy net" \
  --gone dummy.onnx -- "$KILN" export onnx --model dummy.prototxt --weights $W dummy.onnx
sed 's/dim: 64 /dim: 1 /; s/type: "Softmax"/type: "ArgMax" argmax_param { top_k: 2 }/' "$SRC/models/lenet/lenet_deploy.prototxt" > topk.prototxt
expect_refusal "ArgMax top_k 2" --want "layer 'prob' (ArgMax): top_k 2: only top_k 1 is exported" \
  --gone topk.onnx -- "$KILN" export onnx --model topk.prototxt --weights $W topk.onnx
printf 'layer { name: "s" type: "Slice" bottom: "data" top: "a" top: "b" slice_param { axis: 0 } }\n' \
  | cat lenet-1.prototxt - | sed 's/dim: 1 dim: 1 dim: 28/dim: 2 dim: 1 dim: 28/' > slice0.prototxt
"$KILN" export onnx --model slice0.prototxt --weights $W slice0.onnx > /dev/null 2>&1 && pass \
  || fail "a Slice of the batch axis at a fixed batch size is exported"
expect_refusal "--dynamic-batch and a Slice of the batch axis" --want "layer 's' (Slice): a slice of the batch axis fixes the batch size" \
  --gone slice0-dyn.onnx -- "$KILN" export onnx --model slice0.prototxt --weights $W --dynamic-batch slice0-dyn.onnx
sed 's/dim: 64 /dim: 1 /' "$SRC/models/lenet/lenet_deploy.prototxt" > lenet1.prototxt
expect_refusal "missing weights" --want "no-such.caffemodel" --want "nothing written" --gone miss.onnx \
  -- "$KILN" export onnx --model lenet1.prototxt --weights no-such.caffemodel miss.onnx
expect_refusal "weights of another net" --want "resnet20.caffemodel: layer 'conv1' has 1 blobs in the file, 2 in the net" --gone other.onnx \
  -- "$KILN" export onnx --model lenet1.prototxt --weights resnet20.caffemodel other.onnx
touch plain-file
expect_refusal "OUT in a folder that is a file" --want "plain-file/x.onnx: cannot write into the folder 'plain-file'" \
  -- "$KILN" export onnx --model lenet1.prototxt --weights $W plain-file/x.onnx
expect_refusal "OUT in a missing folder" --want "cannot write into the folder 'no/such'" \
  -- "$KILN" export onnx --model lenet1.prototxt --weights $W no/such/x.onnx
mkdir out-folder
expect_refusal "OUT a folder" --want "out-folder: is a folder" -- "$KILN" export onnx --model lenet1.prototxt --weights $W out-folder
expect_refusal "OUT a device" --want "/dev/full: is a device" -- "$KILN" export onnx --model lenet1.prototxt --weights $W /dev/full
expect_refusal "OUT the weights" --want "is the input $W itself" --same $W \
  -- "$KILN" export onnx --model lenet1.prototxt --weights $W $W
expect_refusal "no --weights" --code 2 --want "kiln export onnx: --weights is required" \
  -- "$KILN" export onnx --model lenet1.prototxt x.onnx
expect_refusal "another format" --code 2 --want "kiln export: unknown format 'tflite'" \
  -- "$KILN" export tflite --model lenet1.prototxt --weights $W x.onnx
"$KILN" export onnx --help | grep -q "^usage: kiln export onnx --model DEPLOY.prototxt --weights W.caffemodel OUT.onnx" \
  && pass || fail "kiln export onnx --help"
finish
