# Bad input through the `kiln` command: every case must give a clear message naming the file,
# line or field, a non-zero exit, and no crash.
source "$(dirname "$0")/lib.bash"
cd "$WORK"

# A tiny LMDB with one label out of range for a 10-class net.
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00\x04' > img.idx
head -c 32 /dev/urandom >> img.idx
printf '\x00\x00\x08\x01\x00\x00\x00\x02\x03\x0c' > lab.idx   # labels 3 and 12
"$KILN" convert idx img.idx lab.idx tiny_lmdb >/dev/null || fail "convert tiny"

net() {  # net TEXT_OF_EXTRA_LAYERS > file
  cat <<NET
name: "t"
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "$1" batch_size: 2 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
}
solver() { printf 'net: "%s"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\nsnapshot_after_train: false\n' "$1"; }

net tiny_lmdb > ok.prototxt
solver ok.prototxt > ok_solver.prototxt
expect_error "label out of range" "out of range" -- "$KILN" train --solver ok_solver.prototxt

printf 'name: "x"\nlayer {\n  name: "a"\n  type: "Input"\n' > unclosed.prototxt
expect_error "malformed prototxt" "unclosed.prototxt:" -- "$KILN" describe --model unclosed.prototxt

printf 'layer {\n  name: "c" type: "Convolution" bottom: "data" top: "c"\n  convolution_param { num_ouput: 3 }\n}\n' > typo.prototxt
expect_error "unknown field" "did you mean 'num_output'" -- "$KILN" describe --model typo.prototxt
expect_error "unknown field location" "typo.prototxt:3:" -- "$KILN" describe --model typo.prototxt

printf 'layer { name: "c" type: "Convolution" convolution_param { num_output: "three" } }\n' > type.prototxt
expect_error "wrong type" "num_output" -- "$KILN" describe --model type.prototxt

printf 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 4 } } }\nlayer { name: "r" type: "ReLU" bottom: "nothere" top: "r" }\n' > bottom.prototxt
expect_error "missing bottom" "bottom 'nothere'" -- "$KILN" describe --model bottom.prototxt

printf 'layer { name: "in" type: "Input" top: "data" top: "label" input_param { shape { dim: 2 dim: 10 } shape { dim: 3 } } }\nlayer { name: "loss" type: "SoftmaxWithLoss" bottom: "data" bottom: "label" top: "loss" }\n' > shape.prototxt
expect_error "shape mismatch" "label count 3" -- "$KILN" describe --model shape.prototxt

printf 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }\nlayer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 4 kernel_size: 3 group: 2 } }\n' > group.prototxt
expect_error "group not dividing channels" "group 2 must divide both the input channels (3)" -- "$KILN" describe --model group.prototxt

printf 'layers { name: "x" type: NONE }\n' > v1.prototxt
expect_error "V1 layer without a type" "v1.prototxt: V1 layer 0 ('x') has no layer type" -- "$KILN" describe --model v1.prototxt

net "$WORK/does_not_exist" > missing.prototxt
solver missing.prototxt > missing_solver.prototxt
expect_error "missing LMDB" "does_not_exist" -- "$KILN" train --solver missing_solver.prototxt

mkdir corrupt_lmdb && head -c 65536 /dev/urandom > corrupt_lmdb/data.mdb
net corrupt_lmdb > corrupt.prototxt
solver corrupt.prototxt > corrupt_solver.prototxt
expect_error "corrupt LMDB" "corrupt_lmdb" -- "$KILN" train --solver corrupt_solver.prototxt

head -c 20 img.idx > trunc.idx
expect_error "truncated IDX" "truncated" -- "$KILN" convert idx trunc.idx lab.idx out1
[ -e out1 ] && fail "truncated IDX left an output behind" || pass

printf '\x00\x00\x08\x09\x00\x00\x00\x02' > magic.idx
expect_error "wrong magic" "magic.idx" -- "$KILN" convert idx magic.idx lab.idx out2
[ -e out2 ] && fail "wrong magic left an output behind" || pass

printf 'net: "ok.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\ntype: "Adamm"\n' > badtype.prototxt
expect_error "unknown solver type" "unknown solver type 'Adamm'" -- "$KILN" train --solver badtype.prototxt

printf 'net: "ok.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\n' > mem_solver.prototxt
expect_error "memory limit" "memory limit" -- "$KILN" train --solver mem_solver.prototxt --max-memory 1K

# A net that trains, for the cases below that need one.
printf '\x00\x00\x08\x01\x00\x00\x00\x02\x03\x04' > lab_ok.idx
"$KILN" convert idx img.idx lab_ok.idx good_lmdb >/dev/null || fail "convert good"
net good_lmdb > good.prototxt
solver good.prototxt > good_solver.prototxt
"$KILN" train --solver good_solver.prototxt --metrics m.jsonl 2>/dev/null && pass \
  || fail "the good net does not train"

# A metrics file that cannot be written (a full disk) is an error naming it, not a finished run.
if [ -w /dev/full ]; then
  expect_error "metrics on a full disk" "/dev/full: cannot write the metrics" -- \
    "$KILN" train --solver good_solver.prototxt --metrics /dev/full
  printf 'name: "i"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 4 } } }\nlayer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }\n' > input.prototxt
  "$KILN" time --model input.prototxt --iterations 1 >/dev/null 2>&1 && pass \
    || fail "the net for kiln time does not run"
  expect_error "time metrics on a full disk" "/dev/full: cannot write the metrics" -- \
    "$KILN" time --model input.prototxt --iterations 1 --metrics /dev/full
fi

# A mean_file whose count is not the data's C x H x W: an error naming both (the count was read
# after the message was freed; the sanitizer build checks).
printf '\x2a\x0c\x00\x00\x80\x3f\x00\x00\x80\x3f\x00\x00\x80\x3f' > mean3.binaryproto
sed 's|data_param {|transform_param { mean_file: "mean3.binaryproto" } data_param {|' ok.prototxt \
  > mean_net.prototxt
expect_error "mean_file of the wrong size" "mean3.binaryproto: mean has 3 values, the data 1x4x4" -- \
  "$KILN" describe --model mean_net.prototxt

# kiln test: a net whose output is NaN is an error, not a result; missing or unreadable weights
# are errors that free what was built (LeakSanitizer checks in the sanitizer build).
printf 'name: "nan"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }\nlayer { name: "p" type: "Power" bottom: "data" top: "p" power_param { power: 0.5 shift: -1 } }\n' > nan.prototxt
expect_error "kiln test with a NaN output" "output p is not finite (NaN or infinite) over 2 iterations" -- \
  "$KILN" test --model nan.prototxt --iterations 2
expect_error "kiln test with missing weights" "absent.caffemodel" -- \
  "$KILN" test --model nan.prototxt --weights absent.caffemodel --iterations 1
: > empty.caffemodel
expect_error "kiln test with a net that does not build" "unclosed.prototxt" -- \
  "$KILN" test --model unclosed.prototxt --weights empty.caffemodel --iterations 1

# --weights that cannot be the net's: an empty file, a V1 model whose layer has no type, a model none of whose layer
# names match, and a blob shape whose element count overflows 64 bits (it wrapped before).
: > empty.caffemodel
expect_error "empty weights" "empty.caffemodel: holds no layers" -- \
  "$KILN" train --solver good_solver.prototxt --weights empty.caffemodel
printf '\x12\x00' > v1.caffemodel
expect_error "V1 weights" "v1.caffemodel: V1 layer 0 ('') has no layer type" -- \
  "$KILN" train --solver good_solver.prototxt --weights v1.caffemodel
sed 's/name: "ip"/name: "fc"/; s/bottom: "ip"/bottom: "fc"/; s/top: "ip"/top: "fc"/' good.prototxt > fc.prototxt
printf 'net: "fc.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\nsnapshot_prefix: "fc"\n' > fc_solver.prototxt
"$KILN" train --solver fc_solver.prototxt 2>/dev/null && [ -f fc_iter_1.caffemodel ] && pass \
  || fail "the fc net does not train"
expect_error "weights of another net" "fc_iter_1.caffemodel: no layer of the file matches" -- \
  "$KILN" train --solver good_solver.prototxt --weights fc_iter_1.caffemodel
blob='\x3a\x0e\x3a\x0c\x0a\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x40\x04'
printf "\xa2\x06\x24\x0a\x02ip$blob$blob" > huge_dim.caffemodel
expect_error "a blob of 2^64 elements" "huge_dim.caffemodel: layer 'ip' blob 0 has a shape of more elements than fit 64 bits" -- \
  "$KILN" train --solver good_solver.prototxt --weights huge_dim.caffemodel

# Window sizes past int are refused, naming the field (they were truncated and the net accepted
# with a wrong shape, or overflowed in the window arithmetic).
geom() {  # geom LAYER_TEXT > file
  printf 'name: "g"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 dim: 8 dim: 8 } } }\n%s\n' "$1"
}
geom 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 pad: 2147483647 } }' > bigpad.prototxt
expect_error "conv pad past int" "layer 'c' (Convolution): pad 2147483647 is too large (at most 65536)" -- \
  "$KILN" describe --model bigpad.prototxt
geom 'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 kernel_h: 3 kernel_w: 4294967295 } }' > bigkw.prototxt
expect_error "conv kernel_w past int" "kernel 4294967295 is too large" -- \
  "$KILN" describe --model bigkw.prototxt
geom 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 2 stride: 4294967295 } }' > bigstride.prototxt
expect_error "pool stride past int" "layer 'p' (Pooling): stride 4294967295 is too large (at most 65536)" -- \
  "$KILN" describe --model bigstride.prototxt

# A layer that changes its shape cannot run in place (top = bottom): refused naming it, as Caffe
# refuses it (it overflowed the heap or ran on with a wrong shape).
for spec in 'InnerProduct:inner_product_param { num_output: 3 }' \
            'Convolution:convolution_param { num_output: 2 kernel_size: 3 }' \
            'Pooling:pooling_param { pool: MAX kernel_size: 2 stride: 2 }'; do
  type=${spec%%:*}
  geom "layer { name: \"x\" type: \"$type\" bottom: \"data\" top: \"data\" ${spec#*:} }" > inplace.prototxt
  expect_error "$type in place" "layer 'x' ($type): cannot run in place (top 'data' is its bottom)" -- \
    "$KILN" describe --model inplace.prototxt
done
geom 'layer { name: "r" type: "ReLU" bottom: "data" top: "data" }' > relu_inplace.prototxt
"$KILN" describe --model relu_inplace.prototxt >/dev/null 2>&1 && pass || fail "ReLU in place refused"

# A chain of 160,000 layers builds in seconds: building is linear in the layers (quadratic, it took
# minutes).
awk 'BEGIN { print "name: \"chain\""
  print "layer { name: \"in\" type: \"Input\" top: \"b0\" input_param { shape { dim: 1 dim: 4 } } }"
  for (i = 0; i < 160000; i++)
    printf "layer { name: \"p%d\" type: \"Power\" bottom: \"b%d\" top: \"b%d\" }\n", i, i, i + 1 }' \
  > chain.prototxt
out=$(timeout 60 "$KILN" describe --model chain.prototxt 2>&1 | tail -n 2)
rc=$?
echo "$out" | grep -q "^total: 0 parameters" && pass || fail "a 160,000-layer chain (exit $rc): $out"

# A batch_size far past memory is refused by the memory plan before anything is allocated, with
# the part that dominates and the field to change (it allocated for a minute, then said "out of
# memory").
sed 's/batch_size: 2 /batch_size: 2147483647 /' good.prototxt > bigbatch.prototxt
grep -q "batch_size: 2147483647" bigbatch.prototxt && pass || fail "bigbatch.prototxt: $(cat bigbatch.prototxt)"
expect_error "batch_size past memory" "the largest part is data prefetch queues" -- \
  timeout 20 "$KILN" describe --model bigbatch.prototxt --max-memory 1G
expect_error "batch_size past memory: the field" "reduce data_param.batch_size or prefetch" -- \
  timeout 20 "$KILN" describe --model bigbatch.prototxt --max-memory 1G

# An LMDB cut short (a copy that stopped, a full disk) is refused naming it at every cut, never a
# SIGBUS from LMDB's map past the end of the file.
printf '\x00\x00\x08\x03\x00\x00\x07\xd0\x00\x00\x00\x1c\x00\x00\x00\x1c' > big_img.idx
head -c $((2000 * 784)) /dev/urandom >> big_img.idx
printf '\x00\x00\x08\x01\x00\x00\x07\xd0' > big_lab.idx
head -c 2000 /dev/zero >> big_lab.idx
"$KILN" convert idx big_img.idx big_lab.idx big_lmdb >/dev/null || fail "convert big"
net cut_lmdb > cut.prototxt
printf 'net: "cut.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 30\nsnapshot_after_train: false\n' > cut_solver.prototxt
size=$(stat -c %s big_lmdb/data.mdb)
for pct in 10 50 75 90 99; do
  rm -rf cut_lmdb && mkdir cut_lmdb
  head -c $((size * pct / 100)) big_lmdb/data.mdb > cut_lmdb/data.mdb
  expect_error "LMDB cut at $pct%" "cut_lmdb: truncated LMDB database" -- \
    "$KILN" train --solver cut_solver.prototxt
done

# Endless or huge text files are refused before they are read (not read until memory runs out).
expect_error "net from a device" "/dev/zero: not a regular file" -- \
  timeout 20 "$KILN" describe --model /dev/zero
printf 'net: "/dev/zero"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n' > zero_solver.prototxt
expect_error "solver naming a device as its net" "/dev/zero: not a regular file" -- \
  timeout 20 "$KILN" train --solver zero_solver.prototxt
truncate -s 65M huge.prototxt
expect_error "a 65 MiB net" "huge.prototxt: 68157440 bytes, more than the 67108864 kiln reads here" -- \
  timeout 20 "$KILN" describe --model huge.prototxt
mkfifo fifo.prototxt
expect_error "a FIFO as the net" "fifo.prototxt: not a regular file" -- \
  timeout 20 "$KILN" describe --model fifo.prototxt

expect_error "missing solver" "nope.prototxt" -- "$KILN" train --solver nope.prototxt
expect_error "unknown command" "unknown command" -- "$KILN" frobnicate
finish
