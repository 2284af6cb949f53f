# Hostile net files through kiln describe, time and test: malformed text, values out of range or
# not finite, shapes that cannot work, names that clash, files that are no net at all. Each case
# wants a clean error (exit 1 or 2) naming the file and the line or field, no sanitizer report,
# and no --metrics file left behind when the command failed.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
cd "$WORK"

# net FILE LAYER...: line 1 names the net, line 2 is an Input of 2x3x8x8 ('data'), then each
# LAYER on a line of its own (so a layer's fields are on line 3).
net() {
  local f=$1
  shift
  {
    printf 'name: "h"\n'
    printf 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }\n'
    printf '%s\n' "$@"
  } > "$f"
}
D=("$KILN" describe --model)

# ---- the text itself --------------------------------------------------------------------------
net nme.prototxt 'layer { nme: "x" type: "ReLU" bottom: "data" top: "r" }'
expect_refusal "unknown field" --want "nme.prototxt:3:9:" --want "did you mean 'name'" -- "${D[@]}" nme.prototxt

net unterm.prototxt 'layer { name: "r' '  type: "ReLU" bottom: "data" top: "r" }'
expect_refusal "unterminated string" --want "unterm.prototxt:3:" --want "unterminated string" -- "${D[@]}" unterm.prototxt

net esc.prototxt 'layer { name: "r\q" type: "ReLU" bottom: "data" top: "r" }'
expect_refusal "invalid escape" --want "esc.prototxt:3:" --want "escape" -- "${D[@]}" esc.prototxt

printf 'name: "h"\n\x00\x01\x02' > nul.prototxt
expect_refusal "NUL bytes" --want "nul.prototxt:2:1:" --want "0x00" -- "${D[@]}" nul.prototxt

printf '\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR' > picture.prototxt
expect_refusal "a PNG picture as the net" --want "picture.prototxt:1:1:" --want "0x89" -- "${D[@]}" picture.prototxt

net range.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4294967296 } }'
expect_refusal "num_output past uint32" --want "range.prototxt:3:" --want "num_output" -- "${D[@]}" range.prototxt

net negout.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: -3 } }'
expect_refusal "negative num_output" --want "negout.prototxt:3:" --want "num_output" -- "${D[@]}" negout.prototxt

net frac.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3.5 } }'
expect_refusal "fractional num_output" --want "frac.prototxt:3:" --want "num_output" -- "${D[@]}" frac.prototxt

net enum.prototxt 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { pool: MEDIAN kernel_size: 2 } }'
expect_refusal "unknown enum value" --want "enum.prototxt:3:" --want "'pool'" -- "${D[@]}" enum.prototxt

net notmsg.prototxt 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param: 3 }'
expect_refusal "a number for a message" --want "notmsg.prototxt:3:" --want "convolution_param" -- "${D[@]}" notmsg.prototxt

net colon.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output 3 } }'
expect_refusal "missing colon" --want "colon.prototxt:3:" --want "num_output" -- "${D[@]}" colon.prototxt

net list.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: [3, 4] } }'
expect_refusal "a list for a single field" --want "list.prototxt:3:" --want "num_output" -- "${D[@]}" list.prototxt

net bool.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 bias_term: maybe } }'
expect_refusal "not a boolean" --want "bool.prototxt:3:" --want "bias_term" -- "${D[@]}" bool.prototxt

net close.prototxt 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" } }'
expect_refusal "a closing brace too many" --want "close.prototxt:3:" --want "'}'" -- "${D[@]}" close.prototxt

net open.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"' '  inner_product_param { num_output: 3 }'
expect_refusal "an unclosed layer" --want "open.prototxt:" --want "opened at 3:" -- "${D[@]}" open.prototxt

printf 'layers {\n  name: "c"\n  type: NONE\n}\n' > v1.prototxt
expect_refusal "V1 layer without a type, for kiln time" --want "v1.prototxt: V1 layer 0 ('c') has no layer type" -- \
  "$KILN" time --model v1.prototxt --iterations 1

printf 'input: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 8\n' > deploy.prototxt
expect_refusal "a deploy header of 3 input_dim" --want "deploy.prototxt" --want "input_dim" -- "${D[@]}" deploy.prototxt

# ---- values the net cannot use ----------------------------------------------------------------
net power.prototxt 'layer { name: "p" type: "Power" bottom: "data" top: "p" power_param { power: nan } }'
expect_refusal "a NaN power" --want "power.prototxt" --want "power_param.power is nan" -- "${D[@]}" power.prototxt

net slope.prototxt 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" relu_param { negative_slope: -inf } }'
expect_refusal "an infinite negative_slope" --want "slope.prototxt" --want "relu_param.negative_slope is -inf" -- "${D[@]}" slope.prototxt

net lw.prototxt 'layer { name: "e" type: "EuclideanLoss" bottom: "data" bottom: "data" top: "e" loss_weight: nan }'
expect_refusal "a NaN loss_weight" --want "lw.prototxt" --want "loss_weight is nan" -- "${D[@]}" lw.prototxt

net lrmult.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" param { lr_mult: inf } inner_product_param { num_output: 3 } }'
expect_refusal "an infinite lr_mult" --want "lrmult.prototxt" --want "param.lr_mult is inf" -- "${D[@]}" lrmult.prototxt

net fillerinf.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 bias_filler { type: "constant" value: inf } } }'
expect_refusal "an infinite filler value" --want "fillerinf.prototxt" --want "inner_product_param.bias_filler.value is inf" -- "${D[@]}" fillerinf.prototxt

net std.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: -1 } } }'
expect_refusal "a negative gaussian std" --want "std.prototxt" --want "std -1" -- "${D[@]}" std.prototxt

net uniform.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "uniform" min: 2 max: 1 } } }'
expect_refusal "a uniform filler with max < min" --want "uniform.prototxt" --want "max 1 < min 2" -- "${D[@]}" uniform.prototxt

net filler.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 weight_filler { type: "xaviar" } } }'
expect_refusal "an unknown filler" --want "filler.prototxt" --want "unknown filler type 'xaviar'" -- "${D[@]}" filler.prototxt

net zero.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 0 } }'
expect_refusal "num_output 0" --want "zero.prototxt" --want "num_output" -- "${D[@]}" zero.prototxt

net drop.prototxt 'layer { name: "dr" type: "Dropout" bottom: "data" top: "dr" dropout_param { dropout_ratio: 1.5 } }'
expect_refusal "dropout_ratio 1.5" --want "drop.prototxt" --want "dropout_ratio 1.5" -- "${D[@]}" drop.prototxt

net stride.prototxt 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 2 stride: 0 } }'
expect_refusal "stride 0" --want "stride.prototxt" --want "stride" -- "${D[@]}" stride.prototxt

net kernel.prototxt 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 9 } }'
expect_refusal "a kernel larger than the input" --want "kernel.prototxt" --want "kernel 9x9" -- "${D[@]}" kernel.prototxt

net dil.prototxt 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 dilation: 0 } }'
expect_refusal "dilation 0" --want "dil.prototxt" --want "dilation" -- "${D[@]}" dil.prototxt

net k3d.prototxt 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 kernel_size: 3 kernel_size: 3 } }'
expect_refusal "a 3-d kernel" --want "k3d.prototxt" --want "kernel" -- "${D[@]}" k3d.prototxt

net axis.prototxt 'layer { name: "s" type: "Softmax" bottom: "data" top: "s" softmax_param { axis: 7 } }'
expect_refusal "softmax axis out of range" --want "axis.prototxt" --want "axis 7" -- "${D[@]}" axis.prototxt

net lrn.prototxt 'layer { name: "n" type: "LRN" bottom: "data" top: "n" lrn_param { local_size: 4 } }'
expect_refusal "an even LRN window" --want "lrn.prototxt" --want "local_size 4" -- "${D[@]}" lrn.prototxt

net eps.prototxt 'layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" batch_norm_param { eps: -1 } }'
expect_refusal "a negative BatchNorm eps" --want "eps.prototxt" --want "eps -1" -- "${D[@]}" eps.prototxt

# ---- shapes -----------------------------------------------------------------------------------
printf 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: -4 } } }\n' > negdim.prototxt
expect_refusal "a negative Input dim" --want "negdim.prototxt" --want "negative dimension -4" -- "${D[@]}" negdim.prototxt

printf 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1099511627776 dim: 1099511627776 } } }\n' > overflow.prototxt
expect_refusal "Input dims whose product overflows" --want "overflow.prototxt" --want "too many elements" -- "${D[@]}" overflow.prototxt

printf 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1000000 dim: 1000000 } } }\n' > toobig.prototxt
expect_refusal "Input past the memory limit" --want "toobig.prototxt" --want "memory limit" -- \
  "${D[@]}" toobig.prototxt --max-memory 1G

net concat.prototxt 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 2 stride: 2 } }' \
  'layer { name: "c" type: "Concat" bottom: "data" bottom: "p" top: "c" }'
expect_refusal "Concat of different shapes" --want "concat.prototxt" --want "layer 'c' (Concat)" -- "${D[@]}" concat.prototxt

net eltwise.prototxt 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 2 stride: 2 } }' \
  'layer { name: "e" type: "Eltwise" bottom: "data" bottom: "p" top: "e" }'
expect_refusal "Eltwise of different shapes" --want "eltwise.prototxt" --want "layer 'e' (Eltwise)" -- "${D[@]}" eltwise.prototxt

net slice.prototxt 'layer { name: "s" type: "Slice" bottom: "data" top: "x" top: "y" top: "z" slice_param { axis: 1 slice_point: 2 slice_point: 1 } }'
expect_refusal "slice points out of order" --want "slice.prototxt" --want "slice_point" -- "${D[@]}" slice.prototxt

net reshape.prototxt 'layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: -1 dim: -1 } } }'
expect_refusal "Reshape with two -1" --want "reshape.prototxt" --want "reshape_param.shape" -- "${D[@]}" reshape.prototxt

net reshape2.prototxt 'layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { shape { dim: 5 dim: 5 } } }'
expect_refusal "Reshape to another count" --want "reshape2.prototxt" --want "25 elements" -- "${D[@]}" reshape2.prototxt

printf 'layer { name: "in" type: "Input" top: "a" top: "l" input_param { shape { dim: 2 dim: 6 } shape { dim: 2 } } }\nlayer { name: "acc" type: "Accuracy" bottom: "a" bottom: "l" top: "acc" accuracy_param { top_k: 7 } }\n' > topk.prototxt
expect_refusal "top_k above the classes" --want "topk.prototxt" --want "top_k 7" -- "${D[@]}" topk.prototxt

net bottoms.prototxt 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "data" top: "loss" }'
expect_refusal "a loss with one bottom" --want "bottoms.prototxt" --want "takes 2 bottom(s), got 1" -- "${D[@]}" bottoms.prototxt

net params.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } inner_product_param { num_output: 2 } }'
expect_refusal "three param specs for two blobs" --want "params.prototxt" --want "3 param specs" -- "${D[@]}" params.prototxt

net lwcount.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" loss_weight: 1 loss_weight: 2 inner_product_param { num_output: 2 } }'
expect_refusal "two loss_weight for one top" --want "lwcount.prototxt" --want "loss_weight" -- "${D[@]}" lwcount.prototxt

# ---- names ------------------------------------------------------------------------------------
net type.prototxt 'layer { name: "x" type: "Convolutino" bottom: "data" top: "c" }'
expect_refusal "an unknown layer type" --want "type.prototxt" --want "unknown layer type 'Convolutino'" -- "${D[@]}" type.prototxt

net dupname.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a" inner_product_param { num_output: 2 } }' \
  'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "b" inner_product_param { num_output: 2 } }'
expect_refusal "two InnerProducts of one name" --want "dupname.prototxt" --want "layer 'ip': two layers have this name" -- "${D[@]}" dupname.prototxt

net duptop.prototxt 'layer { name: "a" type: "ReLU" bottom: "data" top: "x" }' 'layer { name: "b" type: "Sigmoid" bottom: "data" top: "x" }'
expect_refusal "two layers producing one top" --want "duptop.prototxt" --want "top 'x' is already produced by layer 'a'" -- "${D[@]}" duptop.prototxt

net bottom.prototxt 'layer { name: "r" type: "ReLU" bottom: "nothere" top: "r" }'
expect_refusal "a bottom nothing produces" --want "bottom.prototxt" --want "bottom 'nothere'" -- "${D[@]}" bottom.prototxt

net incexc.prototxt 'layer { name: "r" type: "ReLU" bottom: "data" top: "r" include { phase: TRAIN } exclude { phase: TEST } }'
expect_refusal "include and exclude together" --want "incexc.prototxt" --want "include or exclude" -- "${D[@]}" incexc.prototxt

# ---- files that are no net --------------------------------------------------------------------
: > empty.prototxt
expect_refusal "an empty net file" --want "empty.prototxt" --want "no layers" -- "${D[@]}" empty.prototxt

printf 'name: "h"\nlayer { name: "in" type: "Input" top: "data" include { phase: TEST } input_param { shape { dim: 1 } } }\n' > testonly.prototxt
expect_refusal "a net with no layer in TRAIN" --want "testonly.prototxt" --want "no layers in phase TRAIN" -- "${D[@]}" testonly.prototxt

mkdir folder.prototxt
expect_refusal "a folder as the net" --want "folder.prototxt: not a regular file" -- "${D[@]}" folder.prototxt

expect_refusal "a missing net" --want "missing.prototxt: cannot open" -- "${D[@]}" missing.prototxt

ln -s nowhere.prototxt dangling.prototxt
expect_refusal "a dangling link as the net" --want "dangling.prototxt: cannot open" -- "${D[@]}" dangling.prototxt

# ---- options, and no metrics file left by a command that failed -------------------------------
net ok.prototxt 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }'
need "a net that describes" -- "${D[@]}" ok.prototxt
expect_refusal "--iterations 0" --want "--iterations" -- "$KILN" test --model ok.prototxt --iterations 0
expect_refusal "--phase VALIDATE" --want "--phase" -- "$KILN" time --model ok.prototxt --phase VALIDATE
expect_refusal "--max-memory of no size" --want "--max-memory" --want "12Q" -- "${D[@]}" ok.prototxt --max-memory 12Q
expect_refusal "--threads 0" --want "--threads" -- "${D[@]}" ok.prototxt --threads 0
expect_refusal "an option without its value" --want "--model" -- "$KILN" describe --model
expect_refusal "kiln time of a broken net, with --metrics" --want "power.prototxt" --gone time.jsonl -- \
  "$KILN" time --model power.prototxt --iterations 1 --metrics time.jsonl
expect_refusal "kiln test of a broken net, with --metrics" --want "dupname.prototxt" --gone test.jsonl -- \
  "$KILN" test --model dupname.prototxt --iterations 1 --metrics test.jsonl
expect_refusal "--metrics into a folder" --want "folder.prototxt: is a folder" -- \
  "$KILN" time --model ok.prototxt --iterations 1 --metrics folder.prototxt
finish
