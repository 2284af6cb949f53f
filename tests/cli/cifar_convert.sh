# kiln convert cifar10 / cifar100 through the `kiln` command. The real archives cannot be
# downloaded here, so the test writes them in the published binary layout with tar and gzip:
# record counts for both splits, archives and unpacked folders, the LMDB fed to `kiln train`, and
# clean errors (exit 1, a message naming the problem, no output left behind).
source "$(dirname "$0")/lib.bash"
cd "$WORK"

# record LABEL...: the label byte(s), then 3072 random pixel bytes.
record() {
  for l in "$@"; do printf "\\$(printf %03o "$l")"; done
  head -c 3072 /dev/urandom
}

# CIFAR-10: data_batch_1..5.bin with 3 records each, test_batch.bin with 2.
mkdir cifar-10-batches-bin
for b in 1 2 3 4 5; do
  for r in 0 1 2; do record $(((b * 3 + r) % 10)); done > cifar-10-batches-bin/data_batch_$b.bin
done
{ record 9; record 0; } > cifar-10-batches-bin/test_batch.bin
printf 'airplane\nautomobile\n' > cifar-10-batches-bin/batches.meta.txt
tar czf cifar-10-binary.tar.gz cifar-10-batches-bin

# CIFAR-100: train.bin with 4 records, test.bin with 3; coarse labels < 20, fine ones up to 99.
mkdir cifar-100-binary
{ record 19 99; record 0 57; record 7 3; record 12 80; } > cifar-100-binary/train.bin
{ record 1 21; record 18 64; record 3 3; } > cifar-100-binary/test.bin
tar czf cifar-100-binary.tar.gz cifar-100-binary

# expect_output NAME WANT -- command...: exit 0 and exactly WANT on stdout.
expect_output() {
  local name=$1 want=$2 out rc
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ]; then fail "$name: exit $rc: $out"; return; fi
  [ "$out" = "$want" ] && pass || fail "$name: printed '$out', expected '$want'"
}

expect_output "cifar10 train" "wrote 15 records to c10_train" -- \
  "$KILN" convert cifar10 cifar-10-binary.tar.gz c10_train
expect_output "cifar10 test" "wrote 2 records to c10_test" -- \
  "$KILN" convert cifar10 cifar-10-binary.tar.gz c10_test --test
expect_output "cifar10 from the unpacked folder" "wrote 15 records to c10_dir" -- \
  "$KILN" convert cifar10 . c10_dir
expect_output "cifar10 from the batches folder" "wrote 2 records to c10_bins" -- \
  "$KILN" convert cifar10 --test cifar-10-batches-bin c10_bins
expect_output "cifar100 train" "wrote 4 records to c100_fine" -- \
  "$KILN" convert cifar100 cifar-100-binary.tar.gz c100_fine
expect_output "cifar100 test coarse" "wrote 3 records to c100_coarse" -- \
  "$KILN" convert cifar100 cifar-100-binary.tar.gz c100_coarse --test --coarse
expect_output "cifar100 train coarse" "wrote 4 records to c100_train_coarse" -- \
  "$KILN" convert cifar100 cifar-100-binary --coarse c100_train_coarse
for db in c10_train c10_test c10_dir c10_bins c100_fine c100_coarse c100_train_coarse; do
  [ -f $db/data.mdb ] && pass || fail "$db/data.mdb missing"
done

# The LMDBs feed a Data layer; with 20 outputs the coarse labels fit and the fine ones do not.
net() {
  cat <<NET
name: "t"
layer { name: "d" type: "Data" top: "data" top: "label"
  transform_param { scale: 0.00390625 }
  data_param { source: "$1" batch_size: 2 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: $2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
NET
}
solver() {
  printf 'net: "%s"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 3\n' "$1"
  printf 'snapshot_after_train: false\n'
}
net c10_train 10 > c10.prototxt && solver c10.prototxt > c10_solver.prototxt
net c100_train_coarse 20 > coarse.prototxt && solver coarse.prototxt > coarse_solver.prototxt
net c100_fine 20 > fine.prototxt && solver fine.prototxt > fine_solver.prototxt
for s in c10 coarse; do
  "$KILN" train --solver ${s}_solver.prototxt >/dev/null 2>train.log && pass ||
    fail "train on $s LMDB: $(cat train.log)"
done
expect_error "fine labels past 20 classes" "out of range" -- \
  "$KILN" train --solver fine_solver.prototxt

# expect_fail NAME WANT OUT -- command...: exit exactly 1, WANT in the message, OUT not created.
expect_fail() {
  local name=$1 want=$2 out=$3 err rc
  shift 4
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 1 ] || { fail "$name: exit $rc, expected 1: $err"; return; }
  case "$err" in *"$want"*) pass ;; *) fail "$name: message lacks '$want': $err" ;; esac
  [ -e "$out" ] || [ -e "$out.tmp" ] && fail "$name: left $out behind" || pass
}

size=$(stat -c %s cifar-10-binary.tar.gz)
head -c $((size / 2)) cifar-10-binary.tar.gz > cut.tar.gz
# (The cut most likely falls inside a member, which the message would name; it may fall in a
# header, so only the common part is checked.)
expect_fail "truncated archive" "cut.tar.gz: " cut_lmdb -- \
  "$KILN" convert cifar10 cut.tar.gz cut_lmdb
expect_fail "truncated archive says so" "archive truncated" cut_lmdb -- \
  "$KILN" convert cifar10 cut.tar.gz cut_lmdb
head -c $((size - 4)) cifar-10-binary.tar.gz > tail.tar.gz
expect_fail "gzip trailer cut" "gzip stream is cut short" tail_lmdb -- \
  "$KILN" convert cifar10 tail.tar.gz tail_lmdb --test

tar czf no4.tar.gz --exclude data_batch_4.bin cifar-10-batches-bin
expect_fail "missing member" "missing member cifar-10-batches-bin/data_batch_4.bin" no4_lmdb -- \
  "$KILN" convert cifar10 no4.tar.gz no4_lmdb
expect_fail "cifar10 archive read as cifar100" "missing member cifar-100-binary/train.bin" \
  x_lmdb -- "$KILN" convert cifar100 cifar-10-binary.tar.gz x_lmdb

mkdir odd && cp -r cifar-10-batches-bin odd/
printf 'x' >> odd/cifar-10-batches-bin/test_batch.bin
expect_fail "wrong record size" "wrong record size: 6147 bytes is not a multiple of the 3073-byte" \
  odd_lmdb -- "$KILN" convert cifar10 odd odd_lmdb --test

mkdir badlabel && { record 3; record 10; } > badlabel/test_batch.bin
expect_fail "label out of range" "record 1 (byte offset 3073): label 10 out of range" \
  bad_lmdb -- "$KILN" convert cifar10 badlabel bad_lmdb --test

printf 'not an archive at all\n' > notes.txt
expect_fail "not an archive" "not a gzip or tar archive" notes_lmdb -- \
  "$KILN" convert cifar10 notes.txt notes_lmdb
expect_fail "missing source" "nothere.tar.gz: cannot open" nothere_lmdb -- \
  "$KILN" convert cifar10 nothere.tar.gz nothere_lmdb

err=$("$KILN" convert cifar10 cifar-10-binary.tar.gz c10_train 2>&1 >/dev/null)
[ $? -eq 1 ] && [[ "$err" == *"already exists"* ]] && pass || fail "existing output: $err"

# Usage errors exit 2.
for args in "cifar10 cifar-10-binary.tar.gz" "cifar10 a b c" "cifar10 a b --coarse" \
  "cifar100 a b --fine" "cifar7 a b"; do
  "$KILN" convert $args >/dev/null 2>&1
  rc=$?
  [ $rc -eq 2 ] && pass || fail "convert $args: exit $rc, expected 2"
done
# A FIFO where a batch file or the archive should be is refused, naming it, and nothing waits on
# it forever (the timeout would say so with exit 124).
cp -r cifar-10-batches-bin fifo-batches
rm fifo-batches/data_batch_3.bin
mkfifo fifo-batches/data_batch_3.bin
expect_error "a FIFO batch file" "data_batch_3.bin: not a regular file" -- \
  timeout 20 "$KILN" convert cifar10 fifo-batches c10_fifo
[ -e c10_fifo ] && fail "a FIFO batch file left an output behind" || pass
mkfifo archive.fifo
expect_error "a FIFO as the archive" "archive.fifo: neither a regular file nor a folder" -- \
  timeout 20 "$KILN" convert cifar10 archive.fifo c10_fifo2
finish
