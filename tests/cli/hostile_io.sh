# Hostile paths and files around kiln's outputs and readers (issue 34): no output replaces one of
# the command's inputs (by any name or link) or a device node, FIFO, socket or folder; no reader
# hangs on a FIFO or a device (a LevelDB's files, `data fetch --from`); a LevelDB's private view
# does not outlive its process; figures that would be no figures (PER over no reference tokens,
# a vocabulary of an empty corpus, a single source of weight 0) are refused; a NUL byte in a text
# file is named, with its line and column. Each refusal wants a clean error naming the path, no
# sanitizer report, and the input, node or FIFO as it was. Device nodes are made with mknod in
# the test's own folder (root only; skipped, saying so, elsewhere).
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
source "$(dirname "$0")/toy_g2p.bash"
cd "$WORK"
export OMP_NUM_THREADS=1

# kind PATH: what PATH is, as stat says it (type, device numbers), without following a link.
kind() { stat -c '%F %t:%T' "$1" 2>&1; }
# still NAME PATH KIND: PATH is still of KIND, with no temporary beside it.
still() {
  local now left
  now=$(kind "$2")
  left=$(ls -d "$2".tmp* 2>/dev/null)
  if [ "$now" = "$3" ] && [ -z "$left" ]; then pass; else fail "$1: $2 is now '$now' (was '$3') ${left:+, left: $left}"; fi
}
# on_node NAME NODE [expect_refusal options] -- command...: a refusal after which NODE (a device,
# FIFO, socket or link, which fingerprint cannot read) is still what it was.
on_node() {
  local name=$1 node=$2 before
  shift 2
  before=$(kind "$node")
  expect_refusal "$name" --timeout 20 "$@"
  still "$name (the node)" "$node" "$before"
}

NODES=true
if mknod full c 1 7 2>/dev/null && mknod zero c 1 5 2>/dev/null && mknod null c 1 3 2>/dev/null; then
  :
else
  NODES=false
  echo "SKIP: mknod failed (not root?): the cases on device nodes are skipped" >&2
fi
mkfifo fifo
mkdir folder
python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")'

# ---- kiln convert text: the vocabulary never replaces a text, a node or a folder ---------------
printf 'the quick brown fox\njumps over the lazy dog\n' > corpus.txt
ln -s corpus.txt corpus_link.txt
ln corpus.txt corpus_hard.txt
T=("$KILN" convert text)
expect_refusal "convert text: OUT is the corpus" --want "corpus.txt: is the input corpus.txt itself" \
  --same corpus.txt -- "${T[@]}" corpus.txt corpus.txt
expect_refusal "convert text: OUT is the corpus as ./" --want "./corpus.txt: is the input corpus.txt itself" \
  --same corpus.txt -- "${T[@]}" corpus.txt ./corpus.txt
on_node "convert text: OUT is a link to the corpus" corpus_link.txt \
  --want "corpus_link.txt: is the input corpus.txt itself" --same corpus.txt -- "${T[@]}" corpus.txt corpus_link.txt
expect_refusal "convert text: OUT is a hard link to the corpus" --want "corpus_hard.txt: is the input corpus.txt itself" \
  --same corpus.txt -- "${T[@]}" corpus.txt corpus_hard.txt
cp corpus.txt second.txt
expect_refusal "convert text: OUT is the second text" --want "second.txt: is the input second.txt itself" \
  --same second.txt -- "${T[@]}" corpus.txt second.txt second.txt
on_node "convert text: OUT a FIFO" fifo --want "fifo: is a FIFO" -- "${T[@]}" corpus.txt fifo
on_node "convert text: OUT a socket" sock --want "sock: is a socket" -- "${T[@]}" corpus.txt sock
expect_refusal "convert text: OUT a folder" --want "folder: is a folder" --same folder -- "${T[@]}" corpus.txt folder
if $NODES; then
  on_node "convert text: OUT a character device" full --want "full: is a device" -- "${T[@]}" corpus.txt full
  ln -s full full_link
  on_node "convert text: OUT a link to a device" full --want "full_link: is a device" -- "${T[@]}" corpus.txt full_link
fi
need "convert text: a new vocabulary" -- "${T[@]}" corpus.txt vocab.txt

# ---- kiln decode --output and --metrics: never the pairs, a vocabulary, the net or a node ------
toy_g2p_pairs pairs.tsv
need "source vocabulary" -- "$KILN" convert text pairs.tsv g2p_vocab.txt --pairs source
need "target vocabulary" -- "$KILN" convert text pairs.tsv g2p_target.txt --pairs target --level word
g2p_data() { # g2p_data SOURCE: the TextData PAIRS layer
  cat <<NET
layer { name: "data" type: "TextData" top: "source" top: "source_mask" top: "source_cont"
  top: "target_in" top: "target_out" top: "target_cont"
  text_data_param { source: "$1" vocab: "g2p_vocab.txt" target_vocab: "g2p_target.txt"
                    mode: PAIRS batch_size: 4 seq_len: 8 target_len: 8 } }
NET
}
g2p_loss='layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "target_out" top: "loss"
  softmax_param { axis: 2 } loss_param { ignore_label: -1 } }'
{ echo 'name: "g2p"'; g2p_data pairs.tsv; toy_g2p_layers; echo "$g2p_loss"; } > g2p.prototxt
{
  echo 'name: "g2p"'
  for i in source source_mask source_cont target_in target_cont; do
    echo "input: \"$i\" input_shape { dim: 1 dim: 1 }"
  done
  toy_g2p_layers
} > g2p_deploy.prototxt
printf 'net: "g2p.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\nsnapshot_prefix: "g2p"\n' \
  > g2p_solver.prototxt
need "a g2p model" -- "$KILN" train --solver g2p_solver.prototxt
D=("$KILN" decode --model g2p_deploy.prototxt --weights g2p_iter_1.caffemodel --vocab g2p_vocab.txt
  --target-vocab g2p_target.txt --input pairs.tsv)
expect_refusal "decode --output the pairs" --want "kiln: decode: --output: pairs.tsv: is the input pairs.tsv itself" \
  --same pairs.tsv -- "${D[@]}" --output pairs.tsv
expect_refusal "decode --output ./pairs" --want "./pairs.tsv: is the input pairs.tsv itself" \
  --same pairs.tsv -- "${D[@]}" --output ./pairs.tsv
expect_refusal "decode --output the target vocabulary" --want "g2p_target.txt: is the input g2p_target.txt itself" \
  --same g2p_target.txt -- "${D[@]}" --output g2p_target.txt
expect_refusal "decode --output the weights" --want "g2p_iter_1.caffemodel: is the input" \
  --same g2p_iter_1.caffemodel -- "${D[@]}" --output g2p_iter_1.caffemodel
on_node "decode --output a FIFO" fifo --want "fifo: is a FIFO" -- "${D[@]}" --output fifo
$NODES && on_node "decode --output a device" full --want "full: is a device" -- "${D[@]}" --output full
expect_refusal "decode --metrics the pairs" --want "kiln: metrics: pairs.tsv: is the input pairs.tsv itself" \
  --same pairs.tsv -- "${D[@]}" --metrics pairs.tsv
need "decode --output a new file" -- "${D[@]}" --output decoded.tsv

# ---- kiln train, test, time: --metrics is no input; a FIFO without a reader is no wait --------
tiny_lmdb tiny_lmdb 3 4 5 6 || fail "convert the tiny LMDB"
tiny_net tiny_lmdb > net.prototxt
tiny_solver net.prototxt > solver.prototxt
need "the tiny net trains" -- "$KILN" train --solver solver.prototxt
expect_refusal "train --metrics the solver" --want "solver.prototxt: is the input solver.prototxt itself" \
  --same solver.prototxt -- "$KILN" train --solver solver.prototxt --metrics solver.prototxt
tiny_solver net.prototxt 'snapshot_after_train: true
snapshot_prefix: "w"' | sed '/snapshot_after_train: false/d' > snap_solver.prototxt
need "a snapshot" -- "$KILN" train --solver snap_solver.prototxt
expect_refusal "train --metrics the weights" --want "w_iter_2.caffemodel: is the input w_iter_2.caffemodel itself" \
  --same w_iter_2.caffemodel -- "$KILN" train --solver solver.prototxt --weights w_iter_2.caffemodel \
  --metrics w_iter_2.caffemodel
expect_refusal "train --metrics the snapshot" --want "w_iter_2.solverstate: is the input" \
  --same w_iter_2.solverstate -- "$KILN" train --solver solver.prototxt --snapshot w_iter_2.solverstate \
  --metrics ./w_iter_2.solverstate
expect_refusal "test --metrics the net" --want "net.prototxt: is the input net.prototxt itself" \
  --same net.prototxt -- "$KILN" test --model net.prototxt --iterations 1 --metrics net.prototxt
expect_refusal "time --metrics the net" --want "net.prototxt: is the input net.prototxt itself" \
  --same net.prototxt -- "$KILN" time --model net.prototxt --iterations 1 --metrics net.prototxt
on_node "train --metrics a FIFO no one reads" fifo --want "fifo: a FIFO that no process reads" -- \
  "$KILN" train --solver solver.prototxt --metrics fifo
expect_refusal "train --metrics a folder" --want "folder: is a folder" --same folder -- \
  "$KILN" train --solver solver.prototxt --metrics folder
if $NODES; then # a stream into a character device is written to, the node kept
  null_kind=$(kind null)
  "$KILN" train --solver solver.prototxt --metrics null >/dev/null 2>&1 && pass || fail "train --metrics a null device"
  still "train --metrics a null device (the node)" null "$null_kind"
fi

# ---- snapshots: a node under a snapshot's name is refused, not replaced ------------------------
mkfifo s_iter_2.caffemodel
tiny_solver net.prototxt 'snapshot_after_train: true
snapshot_prefix: "s"' | sed '/snapshot_after_train: false/d' > s_solver.prototxt
on_node "a FIFO under the snapshot's name" s_iter_2.caffemodel --want "s_iter_2.caffemodel: is a FIFO" -- \
  "$KILN" train --solver s_solver.prototxt
if $NODES; then
  mknod h_iter_2.caffemodel.h5 c 1 7
  tiny_solver net.prototxt 'snapshot_after_train: true
snapshot_format: HDF5
snapshot_prefix: "h"' | sed '/snapshot_after_train: false/d' > h_solver.prototxt
  on_node "a device under the HDF5 snapshot's name" h_iter_2.caffemodel.h5 \
    --want "h_iter_2.caffemodel.h5: is a device" -- "$KILN" train --solver h_solver.prototxt
fi

# ---- HDF5Output: file_name a device, a FIFO, the net itself ----------------------------------
h5out_net() { # h5out_net FILE_NAME
  tiny_net tiny_lmdb "layer { name: \"out\" type: \"HDF5Output\" bottom: \"data\" bottom: \"label\"
  hdf5_output_param { file_name: \"$1\" } }"
}
if $NODES; then
  h5out_net full > h5full.prototxt
  on_node "HDF5Output file_name a device" full --want "layer 'out' (HDF5Output)" --want "full: is a device" -- \
    "$KILN" test --model h5full.prototxt --iterations 1
fi
h5out_net fifo > h5fifo.prototxt
on_node "HDF5Output file_name a FIFO" fifo --want "fifo: is a FIFO" -- "$KILN" test --model h5fifo.prototxt --iterations 1
h5out_net h5self.prototxt > h5self.prototxt
expect_refusal "HDF5Output file_name the net" --want "h5self.prototxt: is the input h5self.prototxt itself" \
  --same h5self.prototxt -- "$KILN" test --model h5self.prototxt --iterations 1

# ---- kiln upgrade, compute-mean, convert idx/cifar/images -------------------------------------
on_node "upgrade OUT a FIFO" fifo --want "fifo: is a FIFO" -- "$KILN" upgrade net.prototxt fifo
$NODES && on_node "upgrade OUT a device" full --want "full: is a device" -- "$KILN" upgrade net.prototxt full
expect_refusal "compute-mean OUT the LMDB's data.mdb" --want "tiny_lmdb/data.mdb: is a file of the input tiny_lmdb" \
  --same tiny_lmdb/data.mdb -- "$KILN" compute-mean tiny_lmdb tiny_lmdb/data.mdb
expect_refusal "compute-mean OUT the LMDB" --want "tiny_lmdb: is the input tiny_lmdb itself" \
  --same tiny_lmdb -- "$KILN" compute-mean tiny_lmdb tiny_lmdb
on_node "compute-mean OUT a FIFO" fifo --want "fifo: is a FIFO" -- "$KILN" compute-mean tiny_lmdb fifo
$NODES && on_node "compute-mean OUT a device" full --want "full: is a device" -- "$KILN" compute-mean tiny_lmdb full
need "a LevelDB" -- "$KILN" convert idx tiny_lmdb.images.idx tiny_lmdb.labels.idx ldb --backend leveldb
expect_refusal "compute-mean OUT the LevelDB's CURRENT" --want "ldb/CURRENT: is a file of the input ldb" \
  --same ldb -- "$KILN" compute-mean ldb ldb/CURRENT
# the database writers refuse any OUT that exists (a node, an input) before reading anything
I=("$KILN" convert idx tiny_lmdb.images.idx tiny_lmdb.labels.idx)
on_node "convert idx OUT a FIFO" fifo --want "fifo: already exists" -- "${I[@]}" fifo
expect_refusal "convert idx OUT the labels" --want "tiny_lmdb.labels.idx: already exists" \
  --same tiny_lmdb.labels.idx -- "${I[@]}" tiny_lmdb.labels.idx
mkfifo out.h5
on_node "convert idx OUT.h5 a FIFO" out.h5 --want "out.h5: already exists" -- "${I[@]}" out.h5
$NODES && on_node "convert idx OUT a device" full --want "full: already exists" -- "${I[@]}" full
# OUT.tmp, where a database is built, is a folder; a link there (to another database, which the
# clean-up of an interrupted run's folder would empty through it) is refused
ln -s tiny_lmdb linked.tmp
expect_refusal "convert idx: OUT.tmp a link to an LMDB" --want "linked.tmp: exists and is no folder" \
  --same tiny_lmdb -- "${I[@]}" linked
ln -s ldb linked_ldb.tmp
expect_refusal "convert idx: OUT.tmp a link to a LevelDB" --want "linked_ldb.tmp: exists and is no folder" \
  --same ldb -- "${I[@]}" linked_ldb --backend leveldb
on_node "convert cifar10 OUT a FIFO" fifo --want "fifo: already exists" -- "$KILN" convert cifar10 folder fifo
printf 'a.png 1\n' > list.txt
on_node "convert images OUT a FIFO" fifo --want "fifo: already exists" -- "$KILN" convert images list.txt ./ fifo

# ---- LevelDB: every kind of file in the database's folder; no reader hangs ---------------------
ldb_net() { tiny_net "$1" | sed 's/backend: LMDB/backend: LEVELDB/'; }
ldb_net ldb > ldb_net.prototxt
tiny_solver ldb_net.prototxt > ldb_solver.prototxt
need "the LevelDB trains" -- "$KILN" train --solver ldb_solver.prototxt
# views PIDFILE: the private views left under /tmp by the process whose id PIDFILE holds.
views() { [ -s "$1" ] && ls -d /tmp/kiln-leveldb-"$(cat "$1")"-* 2>/dev/null; }
# ldb_case NAME DIR WANT...: DIR (a damaged copy of ldb) refused within the timeout, naming WANT,
# its files as they were and no view of the process left behind.
ldb_case() {
  local name=$1 dir=$2
  shift 2
  local -a wants=()
  for w in "$@"; do wants+=(--want "$w"); done
  ldb_net "$dir" > "$dir.prototxt"
  tiny_solver "$dir.prototxt" > "$dir.solver"
  rm -f pid
  expect_refusal "LevelDB: $name" --timeout 20 --want "$dir" "${wants[@]}" --same "$dir" -- \
    sh -c 'echo $$ > "$0"; exec "$@"' "$WORK/pid" "$KILN" train --solver "$dir.solver"
  [ -z "$(views pid)" ] && pass || fail "LevelDB: $name: left its view $(views pid)"
}
manifest=$(cd ldb && ls MANIFEST-*)
table=$(cd ldb && ls *.ldb)
log=$(cd ldb && ls *.log)
fresh() { rm -rf "$1" && cp -a ldb "$1"; }
fresh l_manifest_fifo && rm "l_manifest_fifo/$manifest" && mkfifo "l_manifest_fifo/$manifest"
ldb_case "MANIFEST a FIFO" l_manifest_fifo "$manifest is a FIFO" "regular files only"
fresh l_current_fifo && rm l_current_fifo/CURRENT && mkfifo l_current_fifo/CURRENT
ldb_case "CURRENT a FIFO" l_current_fifo "CURRENT is a FIFO"
fresh l_table_fifo && rm "l_table_fifo/$table" && mkfifo "l_table_fifo/$table"
ldb_case "a table a FIFO" l_table_fifo "$table is a FIFO"
fresh l_log_fifo && rm "l_log_fifo/$log" && mkfifo "l_log_fifo/$log"
ldb_case "the log a FIFO" l_log_fifo "$log is a FIFO"
fresh l_folder && mkdir l_folder/extra
ldb_case "a folder inside" l_folder "extra is a folder"
fresh l_table_dir && rm "l_table_dir/$table" && mkdir "l_table_dir/$table"
ldb_case "a table a folder" l_table_dir "$table is a folder"
if $NODES; then
  fresh l_manifest_zero && rm "l_manifest_zero/$manifest" && ln -s "$WORK/zero" "l_manifest_zero/$manifest"
  ldb_case "MANIFEST a link to a device" l_manifest_zero "$manifest is a link to a device"
  fresh l_table_node && rm "l_table_node/$table" && mknod "l_table_node/$table" c 1 5
  ldb_case "a table a device" l_table_node "$table is a device"
fi
fresh l_manifest_link && rm "l_manifest_link/$manifest" && ln -s "$WORK/ldb/$manifest" "l_manifest_link/$manifest"
ldb_net l_manifest_link > l_manifest_link.prototxt
tiny_solver l_manifest_link.prototxt > l_manifest_link.solver
need "LevelDB: a link to a regular MANIFEST reads" -- "$KILN" train --solver l_manifest_link.solver
# a live log whose record claims 65,535 bytes and holds 4,993 (LevelDB drops it unsaid)
fresh l_log_torn
perl -e 'print pack("V", 0x12345678), pack("v", 65535), chr(1); srand(3); print map { chr(int(rand(256))) } 1 .. 4993' \
  > "l_log_torn/$log"
ldb_case "a log cut inside a record" l_log_torn "log $log" "claims 65535 bytes" "a write cut short"
fresh l_log_header && printf '\x12\x34\x56' > "l_log_header/$log"
ldb_case "a log cut inside a header" l_log_header "log $log ends inside a record's header"
# the MANIFEST is written as a log is: cut, LevelDB reads no edit and finds no records; with a few
# bytes more, it reads on as if they were not there
fresh l_manifest_cut && truncate -s -5 "l_manifest_cut/$manifest"
ldb_case "a MANIFEST cut inside a record" l_manifest_cut "$manifest: the record at byte" "a write cut short"
fresh l_manifest_more && printf '\x01\x02\x03' >> "l_manifest_more/$manifest"
ldb_case "a MANIFEST with bytes after its last record" l_manifest_more "$manifest ends inside a record's header"

# a run killed while it reads leaves its view; the next open of any LevelDB removes it
tiny_solver ldb_net.prototxt 'max_iter: 100000000' | sed '/^max_iter: 2$/d' > long_solver.prototxt
"$KILN" train --solver long_solver.prototxt > /dev/null 2>&1 &
victim=$!
echo "$victim" > victim
for _ in $(seq 100); do [ -n "$(views victim)" ] && break; sleep 0.2; done
left=$(views victim)
kill -KILL "$victim" 2>/dev/null
wait "$victim" 2>/dev/null
if [ -n "$left" ] && [ -d "$left" ]; then
  pass
  need "a LevelDB opened after the kill" -- "$KILN" train --solver ldb_solver.prototxt
  [ ! -e "$left" ] && pass || fail "the killed run's view $left was not removed by the next open"
else
  fail "the long run on the LevelDB made no view /tmp/kiln-leveldb-$victim-*"
fi

# ---- kiln data fetch --from: a device or a FIFO is no tarball -----------------------------------
export KILN_DATA=$WORK/cache
on_node "data fetch --from a FIFO" fifo --want "fifo: not a regular file" -- "$KILN" data fetch moby-dick --from fifo
$NODES && on_node "data fetch --from a device" zero --want "zero: not a regular file" -- \
  "$KILN" data fetch moby-dick --from zero
$NODES && on_node "data fetch cifar10 --from a device" zero --want "zero: not a regular file" -- \
  "$KILN" data fetch cifar10 --from zero
unset KILN_DATA

# ---- no figure from nothing -------------------------------------------------------------------
printf 'ABC\t\nBAD\t\nCAT\t\n' > no_targets.tsv
expect_refusal "decode: targets without tokens" --want "no_targets.tsv:1: a record without target tokens" \
  --any -- "$KILN" decode --model g2p_deploy.prototxt --weights g2p_iter_1.caffemodel --vocab g2p_vocab.txt \
  --target-vocab g2p_target.txt --input no_targets.tsv
{ echo 'name: "g2p"'; g2p_data no_targets.tsv; toy_g2p_layers; echo "$g2p_loss"; } > g2p_empty.prototxt
expect_refusal "test --decode: targets without tokens" --want "no_targets.tsv:1: a record without target tokens" \
  -- "$KILN" test --model g2p_empty.prototxt --weights g2p_iter_1.caffemodel --iterations 1 \
  --decode g2p_deploy.prototxt
: > empty.txt
expect_refusal "convert text: an empty corpus" --want "empty.txt: holds no tokens (an empty corpus)" \
  --gone empty_vocab.txt -- "${T[@]}" empty.txt empty_vocab.txt
printf '\n\n  \n' > blank.txt
expect_refusal "convert text: a corpus of white space" --want "blank.txt: holds no tokens" --gone blank_vocab.txt \
  -- "${T[@]}" corpus.txt blank.txt blank_vocab.txt --level word
expect_refusal "convert text --pairs target: no target tokens" --want "no_targets.tsv: holds no target tokens" \
  --gone nt_vocab.txt -- "${T[@]}" no_targets.tsv nt_vocab.txt --pairs target
for w in -1 0; do
  tiny_net tiny_lmdb | sed "s/backend: LMDB/backend: LMDB source_weight: $w/" > weight$w.prototxt
  tiny_solver "weight$w.prototxt" > weight$w.solver
  expect_refusal "one source of source_weight $w" --want "layer 'd' (Data)" --want "data_param.source_weight" \
    -- "$KILN" train --solver weight$w.solver
done

# ---- a NUL byte in a text file: named, with its line and column --------------------------------
printf '1 1:1\n0 2:1\0\n' > nul.svm
printf 'name: "s"\nlayer { name: "s" type: "LibSVMData" top: "data" top: "label"\n  libsvm_data_param { source: "nul.svm" batch_size: 2 dim: 4 } }\nlayer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }\nlayer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n' > svm.prototxt
expect_refusal "libsvm: a NUL byte" --want "nul.svm:2:6: a NUL byte" -- "$KILN" describe --model svm.prototxt
printf 'the quick\nbrown \0fox\n' > nul_corpus.txt
printf 'name: "t"\nlayer { name: "t" type: "TextData" top: "data" top: "label" top: "cont"\n  text_data_param { source: "nul_corpus.txt" vocab: "vocab.txt" batch_size: 1 seq_len: 2 } }\n' > nul_text.prototxt
expect_refusal "TextData: a NUL byte in the corpus" --want "nul_corpus.txt:2:7: a NUL byte" -- \
  "$KILN" describe --model nul_text.prototxt
expect_refusal "convert text: a NUL byte" --want "nul_corpus.txt:2:7: a NUL byte" --gone nul_vocab.txt -- \
  "${T[@]}" nul_corpus.txt nul_vocab.txt
{ head -3 vocab.txt; printf 'x\0y\n'; } > nul_vocab_file.txt
sed 's/vocab: "vocab.txt"/vocab: "nul_vocab_file.txt"/; s/nul_corpus.txt/corpus.txt/' nul_text.prototxt > nul_vocab.prototxt
expect_refusal "a NUL byte in a vocabulary" --want "nul_vocab_file.txt:4:2: a NUL byte" -- \
  "$KILN" describe --model nul_vocab.prototxt
{ head -2 pairs.tsv; printf 'AB\0C\tAE1 B\n'; } > nul_pairs.tsv
expect_refusal "a NUL byte in the pairs" --want "nul_pairs.tsv:3:3: a NUL byte" -- \
  "$KILN" decode --model g2p_deploy.prototxt --weights g2p_iter_1.caffemodel --vocab g2p_vocab.txt \
  --target-vocab g2p_target.txt --input nul_pairs.tsv
printf 'a.png 1\nb\0.png 2\n' > nul_list.txt
expect_refusal "a NUL byte in an image list" --want "nul_list.txt:2:2: a NUL byte" --gone nul_list_lmdb -- \
  "$KILN" convert images nul_list.txt ./ nul_list_lmdb
printf 'a.h5\n\0b.h5\n' > nul_h5.txt
printf 'name: "h"\nlayer { name: "h" type: "HDF5Data" top: "data" top: "label"\n  hdf5_data_param { source: "nul_h5.txt" batch_size: 1 } }\n' > nul_h5.prototxt
expect_refusal "a NUL byte in an HDF5 list" --want "nul_h5.txt:2:1: a NUL byte" -- \
  "$KILN" describe --model nul_h5.prototxt
printf 'name: "n"\nlayer {\0 name: "a" }\n' > nul_net.prototxt
expect_refusal "a NUL byte in a prototxt" --want "nul_net.prototxt:2:8" --want "0x00" -- \
  "$KILN" describe --model nul_net.prototxt

# ---- convert text --max-size: the library's one rule ------------------------------------------
expect_refusal "convert text --pairs target --max-size 3" --code 2 \
  --want "--max-size: the largest vocabulary 3: expected 0 (no limit) or 5 to 16777216 tokens" \
  --gone ms_vocab.txt -- "${T[@]}" pairs.tsv ms_vocab.txt --pairs target --max-size 3
expect_refusal "convert text --max-size -1" --code 2 --want "expected 0 (no limit) or 3 to 16777216" \
  --gone ms_vocab.txt -- "${T[@]}" corpus.txt ms_vocab.txt --max-size -1
expect_refusal "convert text --max-size x" --code 2 --want "--max-size 'x': not a whole number" \
  --gone ms_vocab.txt -- "${T[@]}" corpus.txt ms_vocab.txt --max-size x
"${T[@]}" pairs.tsv ms_vocab.txt --pairs target --max-size 0 >/dev/null 2>&1 && pass \
  || fail "convert text --max-size 0 (no limit) is refused"

finish
