# Hostile data sets: IDX files for kiln convert idx, LMDBs (cut, patched records, files that are no
# database) and mean files read by the Data layer, and CIFAR archives for kiln convert cifar10 /
# cifar100. Each case wants a clean error naming the file (and the record, dimension or field),
# no sanitizer report, and no database left under the output name (nor its OUT.tmp) when the
# conversion failed.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
cd "$WORK"

# be32 N: N as 4 big-endian bytes.
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
# idx FILE TYPE DIMS... then the payload on stdin.
idx() {
  local f=$1 type=$2
  shift 2
  { printf "\\x00\\x00\\x$type\\x$(printf %02x $#)"; for d in "$@"; do be32 "$d"; done; cat; } > "$f"
}
head -c 32 /dev/urandom | idx img.idx 08 2 4 4
printf '\x03\x04' | idx lab.idx 08 2
C=("$KILN" convert idx)
need "the IDX pair converts" -- "${C[@]}" img.idx lab.idx ok_lmdb

# ---- IDX --------------------------------------------------------------------------------------
idx zero.idx 08 0 4 4 < /dev/null
idx zero_lab.idx 08 0 < /dev/null
expect_refusal "an IDX of 0 images" --want "zero.idx" --want "holds no images" --gone out_zero -- \
  "${C[@]}" zero.idx zero_lab.idx out_zero

head -c 32 /dev/urandom | idx img2d.idx 08 2 16
expect_refusal "images of 2 dimensions" --want "img2d.idx" --want "3 dimensions" --gone out_2d -- "${C[@]}" img2d.idx lab.idx out_2d
expect_refusal "labels given as images" --want "lab.idx" --want "found 1" --gone out_swap -- "${C[@]}" lab.idx lab.idx out_swap
head -c 128 /dev/urandom | idx float.idx 0d 2 4 4
expect_refusal "an IDX of floats" --want "float.idx" --want "element type 0x0d" --gone out_f -- "${C[@]}" float.idx lab.idx out_f
idx nodims.idx 08 < /dev/null
expect_refusal "an IDX of 0 dimensions" --want "nodims.idx" --want "not an IDX file" --gone out_nd -- "${C[@]}" nodims.idx lab.idx out_nd
printf '\x00\x00\x08\x09' > ninedims.idx
expect_refusal "an IDX of 9 dimensions" --want "ninedims.idx" --want "9 dimensions" --gone out_9 -- "${C[@]}" ninedims.idx lab.idx out_9
idx huge.idx 08 65536 65536 65536 < /dev/null
expect_refusal "2^48 elements announced" --want "huge.idx" --want "65536x65536x65536" --gone out_h -- "${C[@]}" huge.idx lab.idx out_h
head -c 20 /dev/urandom | idx short.idx 08 2 4 4
expect_refusal "an IDX cut short" --want "short.idx" --want "truncated: expected 32 bytes of data, found 20" --gone out_s -- \
  "${C[@]}" short.idx lab.idx out_s
head -c 35 /dev/urandom | idx long.idx 08 2 4 4
expect_refusal "bytes after the data" --want "long.idx" --want "3 unexpected bytes" --gone out_l -- "${C[@]}" long.idx lab.idx out_l
printf '\x03\x04\x05' | idx lab3.idx 08 3
expect_refusal "3 labels for 2 images" --want "img.idx holds 2 images but lab3.idx holds 3 labels" --gone out_3 -- \
  "${C[@]}" img.idx lab3.idx out_3
idx wide0.idx 08 2 4 0 < /dev/null
expect_refusal "images 0 pixels wide" --want "wide0.idx" --want "4x0 pixels" --gone out_w -- "${C[@]}" wide0.idx lab.idx out_w
gzip -c img.idx > img.idx.gz
size=$(stat -c %s img.idx.gz)
head -c $((size - 12)) img.idx.gz > cutgz.idx.gz
expect_refusal "a gzipped IDX cut short" --want "cutgz.idx.gz" --gone out_gc -- "${C[@]}" cutgz.idx.gz lab.idx out_gc
perl -e 'local $/; $_ = <STDIN>; substr($_, length($_) - 8, 4) = "ZZZZ"; print' < img.idx.gz > crc.idx.gz
expect_refusal "a gzipped IDX with a wrong CRC" --want "crc.idx.gz: corrupt gzip data" --gone out_crc -- "${C[@]}" crc.idx.gz lab.idx out_crc
: > empty.idx
expect_refusal "an empty IDX" --want "empty.idx" --want "0 bytes" --gone out_e -- "${C[@]}" empty.idx lab.idx out_e
expect_refusal "a folder as the IDX" --want "ok_lmdb: is a directory" --gone out_d -- "${C[@]}" ok_lmdb lab.idx out_d
mkfifo fifo.idx
expect_refusal "a FIFO as the IDX" --timeout 20 --want "fifo.idx: not a regular file" --gone out_fifo -- "${C[@]}" img.idx fifo.idx out_fifo
expect_refusal "a device as the IDX" --timeout 20 --want "/dev/zero: not a regular file" --gone out_dev -- "${C[@]}" /dev/zero lab.idx out_dev
expect_refusal "missing labels" --want "nolab.idx: cannot open" --gone out_m -- "${C[@]}" img.idx nolab.idx out_m

# ---- the output -------------------------------------------------------------------------------
expect_refusal "an output that exists" --want "ok_lmdb: already exists" --same ok_lmdb -- "${C[@]}" img.idx lab.idx ok_lmdb
expect_refusal "an output under a missing folder" --want "nodir/out.tmp: cannot create" --gone nodir/out -- \
  "${C[@]}" img.idx lab.idx nodir/out
: > stale.tmp
expect_refusal "OUT.tmp a plain file" --want "stale.tmp: exists and is no folder" \
  --absent stale --same stale.tmp -- \
  "${C[@]}" img.idx lab.idx stale
expect_refusal "an empty output path" --want "the output path is empty" --gone .tmp -- "${C[@]}" img.idx lab.idx ""
expect_refusal "convert with a missing argument" --code 2 --want "usage: kiln convert idx" -- "${C[@]}" img.idx lab.idx

# ---- LMDBs read by the Data layer -------------------------------------------------------------
# lmdb_case NAME SOURCE WANT...: a net reading SOURCE must fail to train, naming WANT...
lmdb_case() {
  local name=$1 src=$2
  shift 2
  tiny_net "$src" > "lmdb_net.prototxt"
  tiny_solver lmdb_net.prototxt > lmdb_solver.prototxt
  local -a w=()
  for x in "$@"; do w+=(--want "$x"); done
  expect_refusal "$name" "${w[@]}" -- "$KILN" train --solver lmdb_solver.prototxt
}
# patched NAME PERL_SUBSTITUTION: a copy of ok_lmdb with its data.mdb edited in place. Records
# are Datum messages (channels 1, height 4, width 4, 16 bytes of data, label) stored as they
# are; LMDB keeps no checksum, so the edit is what the reader sees.
patched() {
  rm -rf "$1" && mkdir "$1"
  perl -0777 -pe "$2" ok_lmdb/data.mdb > "$1/data.mdb"
  cmp -s ok_lmdb/data.mdb "$1/data.mdb" && fail "$1: the edit changed nothing"
}
D='\x08\x01\x10\x04\x18\x04\x22\x10'
patched chan_lmdb "s/$D/\\x08\\x02\\x10\\x04\\x18\\x04\\x22\\x10/"
lmdb_case "a record of 2 channels and 16 bytes" chan_lmdb "chan_lmdb: record 0000000" "channels x height x width = 2x4x4 = 32"
patched zero_lmdb "s/$D/\\x08\\x00\\x10\\x04\\x18\\x04\\x22\\x10/"
lmdb_case "a record of 0 channels" zero_lmdb "zero_lmdb: record 0000000" "invalid shape channels 0"
patched shape_lmdb "s/$D/\\x08\\x01\\x10\\x02\\x18\\x08\\x22\\x10/"
lmdb_case "records of two shapes" shape_lmdb "shape_lmdb: record 0000000" "differs from the earlier records'"
patched enc_lmdb "s/($D.{16})\\x28./\$1\\x38\\x01/s"
lmdb_case "an encoded record whose bytes are no image" enc_lmdb "enc_lmdb: record 0000000" \
  "not a PNG or JPEG image"
patched datum_lmdb "s/$D/\\x08\\x01\\x10\\x04\\x18\\x04\\x22\\x7f/"
lmdb_case "a record that is no Datum" datum_lmdb "datum_lmdb: record 0000000" "not a Datum"
mkdir -p empty_lmdb
lmdb_case "a folder without data.mdb" empty_lmdb "empty_lmdb: not an LMDB database (no data.mdb inside)"
mkdir -p dirmdb_lmdb/data.mdb
lmdb_case "data.mdb a folder" dirmdb_lmdb "dirmdb_lmdb: not a readable LMDB database"
noise 8192 > noise.mdb
lmdb_case "random bytes as an LMDB file" noise.mdb "noise.mdb: not a readable LMDB database"
mkdir -p zeromdb_lmdb && : > zeromdb_lmdb/data.mdb
lmdb_case "an empty data.mdb" zeromdb_lmdb "zeromdb_lmdb: not an LMDB database (data.mdb is empty)"
mkfifo fifo_lmdb
lmdb_case "a FIFO as the source" fifo_lmdb "fifo_lmdb: not an LMDB database (neither a directory nor a file)"
lmdb_case "a device as the source" /dev/null "/dev/null: not an LMDB database"
size=$(stat -c %s ok_lmdb/data.mdb)
mkdir -p half_lmdb && head -c $((size / 2)) ok_lmdb/data.mdb > half_lmdb/data.mdb
lmdb_case "an LMDB cut in half" half_lmdb "half_lmdb: truncated LMDB database"

# ---- the Data layer's settings and mean file --------------------------------------------------
# data_case NAME SETTINGS WANT...: a Data layer on ok_lmdb with SETTINGS must not build.
data_case() {
  local name=$1
  printf 'name: "d"\nlayer {\n  name: "d" type: "Data" top: "data" top: "label"\n  %s\n}\n' "$2" > data.prototxt
  shift 2
  local -a w=(--want data.prototxt)
  for x in "$@"; do w+=(--want "$x"); done
  expect_refusal "$name" "${w[@]}" -- "$KILN" describe --model data.prototxt
}
data_case "batch_size 0" 'data_param { source: "ok_lmdb" batch_size: 0 backend: LMDB }' "batch_size"
data_case "no source" 'data_param { batch_size: 2 backend: LMDB }' "data_param.source is required"
data_case "backend LEVELDB on an LMDB" 'data_param { source: "ok_lmdb" batch_size: 2 backend: LEVELDB }' \
  "ok_lmdb: holds an LMDB database (data.mdb), but backend LEVELDB was asked for"
data_case "no backend (LEVELDB) on an LMDB" 'data_param { source: "ok_lmdb" batch_size: 2 }' \
  "data_param names no backend, which in Caffe means LEVELDB" "ok_lmdb: holds an LMDB database"
data_case "a crop larger than the images" 'transform_param { crop_size: 5 } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' "crop_size 5"
data_case "a NaN scale" 'transform_param { scale: nan } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' "transform_param.scale is nan"
data_case "two mean values for one channel" 'transform_param { mean_value: 1 mean_value: 2 } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' "mean_value"
data_case "mean_file and mean_value" 'transform_param { mean_value: 1 mean_file: "m" } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' "mean_file or mean_value"
perl -e 'print pack("H*", "2a40" . ("0000803f" x 5) . "0000c07f" . ("0000803f" x 10))' > nan.binaryproto
data_case "a mean with a NaN" 'transform_param { mean_file: "nan.binaryproto" } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' \
  "nan.binaryproto: value 5 is nan"
data_case "a prototxt as the mean" 'transform_param { mean_file: "data.prototxt" } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' \
  "not a valid binary BlobProto"
data_case "a missing mean" 'transform_param { mean_file: "absent.binaryproto" } data_param { source: "ok_lmdb" batch_size: 2 backend: LMDB }' \
  "absent.binaryproto: cannot open"

# ---- CIFAR archives (cifar_convert.sh has the published layout; these are damaged ones) ---------
record() {
  for l in "$@"; do printf "\\$(printf %03o "$l")"; done
  head -c 3072 /dev/urandom
}
mkdir cifar-10-batches-bin
{ record 1; record 2; } > cifar-10-batches-bin/test_batch.bin
tar cf plain.tar cifar-10-batches-bin
CF=("$KILN" convert cifar10)
need "the small archive converts" -- "${CF[@]}" plain.tar c10_ok --test
# header SRC DST OFFSET TEXT: a copy of SRC with TEXT written at OFFSET of its first member's
# header (the second 512-byte block: the first is the folder's).
header() { cp "$1" "$2" && printf '%s' "$4" | dd of="$2" bs=1 seek=$((512 + $3)) conv=notrunc 2>/dev/null; }
header plain.tar octal.tar 124 'zz9zz9zz9zz'
expect_refusal "a tar size that is no octal number" --want "octal.tar" --want "corrupt tar header at byte offset 512" \
  --gone c10_octal -- "${CF[@]}" octal.tar c10_octal --test
header plain.tar checksum.tar 148 'X'
expect_refusal "a tar header checksum" --want "checksum.tar" --want "checksum mismatch" --gone c10_sum -- \
  "${CF[@]}" checksum.tar c10_sum --test
head -c 1000 plain.tar > cut.tar
expect_refusal "a tar cut in a header" --want "cut.tar: archive truncated" --gone c10_cut -- "${CF[@]}" cut.tar c10_cut --test
: > empty.tar.gz
expect_refusal "an empty archive" --want "empty.tar.gz: not a gzip or tar archive" --gone c10_empty -- \
  "${CF[@]}" empty.tar.gz c10_empty --test
echo "<html>404</html>" | gzip -c > page.tar.gz
expect_refusal "a gzipped web page" --want "page.tar.gz: not a tar archive inside the gzip data" --gone c10_page -- \
  "${CF[@]}" page.tar.gz c10_page --test
mkdir -p c100/cifar-100-binary && record 20 5 > c100/cifar-100-binary/test.bin
expect_refusal "a coarse label of 20" --want "c100/cifar-100-binary/test.bin: record 0" --want "coarse label 20" \
  --gone c100_coarse -- "$KILN" convert cifar100 c100 c100_coarse --test --coarse
mkdir -p batches && for b in 1 3 4 5; do record 1 > batches/data_batch_$b.bin; done && mkdir batches/data_batch_2.bin
expect_refusal "a folder as a batch file" --want "batches/data_batch_2.bin: not a regular file" --gone c10_dir -- \
  "${CF[@]}" batches c10_dir
expect_refusal "a CIFAR output that exists" --want "c10_ok: already exists" --same c10_ok -- "${CF[@]}" plain.tar c10_ok --test
finish
