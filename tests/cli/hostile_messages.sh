# Messages that name what is wrong (issue 34): a huge path is shortened in its middle so that the
# reason after it survives; a field or an option set to a value out of range says so, with the
# value and the range (never "must be set"); a malformed number says it is not one; a beam the
# model cannot hold names --beam and --max-len; an empty value or argument says it is empty,
# naming the option; an argument a command does not take is "unexpected". Each case wants a
# clean error (exit 1 or 2) with the exact substrings, no sanitizer report, and no output file
# left behind.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
source "$(dirname "$0")/toy_g2p.bash"
cd "$WORK"
export OMP_NUM_THREADS=1
# nothing below may touch the user's data set cache or CE history
export HOME=$WORK/home KILN_DATA=$WORK/data XDG_DATA_HOME=$WORK/xdg
mkdir -p "$HOME" "$KILN_DATA"

tiny_lmdb db
tiny_net db > net.prototxt
tiny_solver net.prototxt > solver.prototxt

# ---- a path of 100 KB -------------------------------------------------------------------------
# 500 folders of 200 letters between a start and an end that must both show, and the reason after
# it: the 4 KiB message is shortened in the middle ("..."), its end kept.
LONG="$WORK/start_marker/$(for i in $(seq 500); do printf 'a%.0s' $(seq 200); printf /; done)end_marker.prototxt"
[ ${#LONG} -gt 100000 ] && pass || fail "the long path has ${#LONG} bytes"
long_case() {  # long_case NAME WANT_REASON -- command...
  local name=$1 reason=$2
  shift 3
  expect_refusal "$name" --want "$WORK/start_marker/aaaa" --want "..." \
    --want "aaaa/end_marker.prototxt$reason" -- "$@"
  local err
  err=$("$@" 2>&1 >/dev/null)
  [ ${#err} -lt 4400 ] && pass || fail "$name: a message of ${#err} bytes"
}
long_case "describe --model LONG" ": cannot open: File name too long" -- "$KILN" describe --model "$LONG"
long_case "train --solver LONG" ": cannot open: File name too long" -- "$KILN" train --solver "$LONG"
long_case "test --weights LONG" ": cannot open: File name too long" -- \
  "$KILN" test --model net.prototxt --weights "$LONG" --iterations 1
long_case "upgrade LONG OUT" ": cannot open: File name too long" -- "$KILN" upgrade "$LONG" up.prototxt
[ ! -e up.prototxt ] && pass || fail "upgrade LONG OUT left up.prototxt"
# the output's temporary (its pid varies): the name up to it, and the reason
long_case "upgrade IN LONG" ".tmp." -- "$KILN" upgrade net.prototxt "$LONG"
expect_refusal "upgrade IN LONG: the reason" --want ": cannot create: File name too long" -- \
  "$KILN" upgrade net.prototxt "$LONG"

# ---- fields set out of range: the value and the range, not "must be set" -----------------------
printf 'the quick brown fox jumps over the lazy dog\n' > corpus.txt
need "a vocabulary" -- "$KILN" convert text corpus.txt vocab.txt
text_net() {  # text_net FIELDS: a TextData layer of corpus.txt with FIELDS
  printf 'name: "t"\nlayer { name: "t" type: "TextData" top: "data" top: "label" top: "cont"\n'
  printf '  text_data_param { source: "corpus.txt" vocab: "vocab.txt" %s } }\n' "$1"
}
text_net "batch_size: 2 seq_len: 2147483647" > seq_len.prototxt
expect_refusal "seq_len 2147483647" --want "layer 't' (TextData)" \
  --want "text_data_param.seq_len 2147483647 is out of range: 1 to 1048576" -- "$KILN" describe --model seq_len.prototxt
text_net "batch_size: 2 seq_len: 0" > seq_len0.prototxt
expect_refusal "seq_len 0" --want "text_data_param.seq_len 0 is out of range: 1 to 1048576" -- \
  "$KILN" describe --model seq_len0.prototxt
text_net "batch_size: 4294967295 seq_len: 4" > batch.prototxt
expect_refusal "TextData batch_size 4294967295" \
  --want "text_data_param.batch_size 4294967295 is out of range: 1 to 1048576" -- "$KILN" describe --model batch.prototxt
printf '1 1:0.5 3:1\n0 2:1\n' > rows.svm
printf 'name: "s"\nlayer { name: "s" type: "LibSVMData" top: "data" top: "label"\n  libsvm_data_param { source: "rows.svm" batch_size: 2 dim: 0 } }\n' > dim0.prototxt
expect_refusal "LibSVMData dim 0" --want "layer 's' (LibSVMData)" \
  --want "libsvm_data_param.dim (the feature count) 0 is out of range: 1 to" -- "$KILN" describe --model dim0.prototxt
printf 'name: "s"\nlayer { name: "s" type: "LibSVMData" top: "data" top: "label"\n  libsvm_data_param { source: "rows.svm" batch_size: 2000000 dim: 3 } }\n' > svmbatch.prototxt
expect_refusal "LibSVMData batch_size 2000000" \
  --want "libsvm_data_param.batch_size 2000000 is out of range: 1 to 1048576" -- "$KILN" describe --model svmbatch.prototxt

# ---- whole-number options: the range when out of it, "not a whole number" when malformed -------
# int_case NAME OPTION VALUE RANGE_TEXT -- command...: VALUE of OPTION refused (exit 2), saying
# it is out of range (a number) or not a whole number (anything else), with the range.
int_case() {
  local name=$1 opt=$2 v=$3 range=$4
  shift 5
  local want
  if [[ $v =~ ^[+-]?[0-9]+$ ]]; then want="$opt: '$v' is out of range: $opt takes $range"
  else want="$opt: '$v' is not a whole number ($opt takes $range)"; fi
  expect_refusal "$name $opt $v" --code 2 --want "$want" --gone out.jsonl -- "$@" "$opt" "$v" --metrics out.jsonl
}
for v in 2147483648 0 -1 99999999999999999999 x 1.5 12abc; do
  int_case train --threads "$v" "1 to 1024" -- "$KILN" train --solver solver.prototxt
  int_case time --threads "$v" "1 to 1024" -- "$KILN" time --model net.prototxt
done
for v in 2147483648 0 ten; do
  int_case test --iterations "$v" "1 to 2147483647" -- "$KILN" test --model net.prototxt
  int_case time --iterations "$v" "1 to 2147483647" -- "$KILN" time --model net.prototxt
done
# a size past 2^64 bytes (or no number at all) had no defined conversion and was taken
for v in 1e30 99999999999999999999T nan inf; do
  expect_refusal "--max-memory $v" --code 2 --want "kiln: --max-memory: '$v' is not a size of 1 byte to 16E" -- \
    "$KILN" describe --model net.prototxt --max-memory "$v"
done
SAMPLE=("$KILN" sample --model net.prototxt --weights w.caffemodel --vocab vocab.txt)
for v in 2147483648 -1 ten; do
  expect_refusal "sample --length $v" --code 2 \
    --want "$([[ $v =~ ^-?[0-9]+$ ]] && echo "--length: '$v' is out of range: --length takes 0 to 16777216" \
              || echo "--length: '$v' is not a whole number (--length takes 0 to 16777216)")" -- "${SAMPLE[@]}" --length "$v"
done
expect_refusal "sample --seed 2^63" --code 2 \
  --want "--seed: '9223372036854775808' is out of range: --seed takes 0 to 9223372036854775807" -- "${SAMPLE[@]}" --seed 9223372036854775808
expect_refusal "sample --seed -1" --code 2 --want "--seed: '-1' is out of range: --seed takes 0 to 9223372036854775807" -- "${SAMPLE[@]}" --seed -1

# ---- kiln decode and kiln test --decode: --beam, --max-len, --limit ----------------------------
toy_g2p_pairs pairs.tsv
need "source vocabulary" -- "$KILN" convert text pairs.tsv g2p_vocab.txt --pairs source
need "target vocabulary" -- "$KILN" convert text pairs.tsv g2p_target.txt --pairs target --level word
{
  echo 'name: "g2p"'
  echo 'layer { name: "data" type: "TextData" top: "source" top: "source_mask" top: "source_cont"'
  echo '  top: "target_in" top: "target_out" top: "target_cont"'
  echo '  text_data_param { source: "pairs.tsv" vocab: "g2p_vocab.txt" target_vocab: "g2p_target.txt" mode: PAIRS batch_size: 8 seq_len: 8 target_len: 8 } }'
  toy_g2p_layers
  echo 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "target_out" top: "loss"'
  echo '  softmax_param { axis: 2 } loss_param { ignore_label: -1 } }'
} > g2p.prototxt
{
  echo 'name: "g2p"'
  for i in source source_mask source_cont target_in target_cont; do
    echo "input: \"$i\" input_shape { dim: 1 dim: 1 }"
  done
  toy_g2p_layers
} > deploy.prototxt
printf 'net: "g2p.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\nsnapshot_prefix: "g2p"\n' > g2p_solver.prototxt
need "the g2p model trains" -- "$KILN" train --solver g2p_solver.prototxt
DECODE=("$KILN" decode --model deploy.prototxt --weights g2p_iter_1.caffemodel --vocab g2p_vocab.txt
  --target-vocab g2p_target.txt --input pairs.tsv)
TESTD=("$KILN" test --model g2p.prototxt --weights g2p_iter_1.caffemodel --iterations 1 --decode deploy.prototxt)
for cmd in decode test; do
  if [ $cmd = decode ]; then C=("${DECODE[@]}"); else C=("${TESTD[@]}"); fi
  expect_refusal "$cmd --beam 1000000" --code 2 --want "kiln $cmd: --beam: '1000000' is out of range: --beam takes 1 to 1024" \
    --gone out.tsv -- "${C[@]}" --beam 1000000 --metrics out.tsv
  expect_refusal "$cmd --beam 0" --code 2 --want "--beam: '0' is out of range: --beam takes 1 to 1024" -- "${C[@]}" --beam 0
  expect_refusal "$cmd --beam four" --code 2 --want "--beam: 'four' is not a whole number (--beam takes 1 to 1024)" -- "${C[@]}" --beam four
  expect_refusal "$cmd --max-len 2^31" --code 2 \
    --want "--max-len: '2147483648' is out of range: --max-len takes 1 to 1048576" -- "${C[@]}" --max-len 2147483648
  expect_refusal "$cmd --limit 0" --code 2 --want "--limit: '0' is out of range: --limit takes 1 to 2147483647" -- "${C[@]}" --limit 0
  # in range, but more than the model can hold at once: both options named, the net's reason kept
  # (kiln test's metrics hold its test pass, done before the decode: no --metrics here)
  expect_refusal "$cmd --beam 1024 --max-len 100000" --want "--beam 1024 with --max-len 100000: deploy.prototxt cannot decode 1024 hypotheses of 100000 steps at once" \
    --want "too large for BLAS's int sizes" --want "give a smaller --beam or --max-len" -- \
    "${C[@]}" --beam 1024 --max-len 100000
  expect_refusal "$cmd --beam 1024 --max-len 1000 --max-memory 16M" \
    --want "--beam 1024 with --max-len 1000: deploy.prototxt cannot decode 1024 hypotheses of 1000 steps at once" \
    --want "the memory limit is 16.0 MiB (--max-memory)" -- "${C[@]}" --beam 1024 --max-len 1000 --max-memory 16M
done
# neither the decoded file nor the metrics are written when the beam is refused
expect_refusal "decode --beam 1024 --max-len 100000 --output" --want "cannot decode 1024 hypotheses" --gone dec.tsv \
  --gone out.jsonl -- "${DECODE[@]}" --beam 1024 --max-len 100000 --output dec.tsv --metrics out.jsonl

# ---- empty values and arguments, and arguments a command does not take ------------------------
# empty_case NAME WANT -- command...: exit 2 with WANT
empty_case() {
  local name=$1 want=$2
  shift 3
  expect_refusal "$name" --code 2 --want "$want" --gone out.jsonl -- "$@"
}
for cmd in describe time test; do
  empty_case "$cmd --model ''" "kiln $cmd: --model: the value is empty" -- "$KILN" $cmd --model ""
  empty_case "$cmd --stage ''" "kiln $cmd: --stage: the value is empty" -- "$KILN" $cmd --model net.prototxt --stage ""
  empty_case "$cmd --model M extra" "kiln $cmd: unexpected argument 'extra' (see kiln $cmd --help)" -- \
    "$KILN" $cmd --model net.prototxt extra
  empty_case "$cmd --model M ''" "kiln $cmd: unexpected empty argument ''" -- "$KILN" $cmd --model net.prototxt ""
done
empty_case "test --weights ''" "kiln test: --weights: the value is empty" -- "$KILN" test --model net.prototxt --weights ""
empty_case "sample --model ''" "kiln sample: --model: the value is empty" -- "${SAMPLE[@]}" --model ""
empty_case "sample --vocab ''" "kiln sample: --vocab: the value is empty" -- "${SAMPLE[@]}" --vocab ""
empty_case "sample extra" "kiln sample: unexpected argument 'extra'" -- "${SAMPLE[@]}" extra
empty_case "decode --input ''" "kiln decode: --input: the value is empty" -- "${DECODE[@]}" --input ""
empty_case "decode --output ''" "kiln decode: --output: the value is empty" -- "${DECODE[@]}" --output ""
empty_case "decode extra" "kiln decode: unexpected argument 'extra'" -- "${DECODE[@]}" extra
empty_case "--metrics ''" "kiln: --metrics: the value is empty" -- "$KILN" time --model net.prototxt --metrics ""
# kiln train: its own options, and the list of --weights
empty_case "train --solver ''" "kiln train: --solver: the value is empty" -- "$KILN" train --solver ""
empty_case "train --weights ''" "kiln train: --weights: the value is empty" -- "$KILN" train --solver solver.prototxt --weights ""
empty_case "train --snapshot ''" "kiln train: --snapshot: the value is empty" -- "$KILN" train --solver solver.prototxt --snapshot ""
for list in , w.caffemodel, ,w.caffemodel a,,b; do
  empty_case "train --weights '$list'" "kiln train: --weights '$list': an empty file name in the list (A[,B...])" -- \
    "$KILN" train --solver solver.prototxt --weights "$list"
done
empty_case "train extra" "kiln train: unexpected argument 'extra' (see kiln train --help)" -- \
  "$KILN" train --solver solver.prototxt extra
# commands of file arguments
empty_case "upgrade '' OUT" "kiln upgrade: IN is empty" -- "$KILN" upgrade "" up.prototxt
empty_case "upgrade IN ''" "kiln upgrade: OUT is empty" -- "$KILN" upgrade net.prototxt ""
empty_case "upgrade IN OUT extra" "kiln upgrade: unexpected argument 'extra'" -- "$KILN" upgrade net.prototxt up.prototxt extra
[ ! -e up.prototxt ] && pass || fail "a refused upgrade wrote up.prototxt"
empty_case "compute-mean '' OUT" "kiln compute-mean: DB is empty" -- "$KILN" compute-mean "" mean.binaryproto
empty_case "compute-mean DB ''" "kiln compute-mean: OUT.binaryproto is empty" -- "$KILN" compute-mean db ""
empty_case "compute-mean DB OUT extra" "kiln compute-mean: unexpected argument 'extra'" -- "$KILN" compute-mean db mean.binaryproto extra
[ ! -e mean.binaryproto ] && pass || fail "a refused compute-mean wrote mean.binaryproto"
empty_case "convert idx ''" "kiln convert idx: IMAGES is empty" -- "$KILN" convert idx "" db.labels.idx idx_out
empty_case "convert idx extra" "kiln convert idx: unexpected argument 'extra'" -- \
  "$KILN" convert idx db.images.idx db.labels.idx idx_out extra
[ -z "$(left_behind idx_out)" ] && pass || fail "a refused convert idx left $(left_behind idx_out)"
empty_case "convert cifar10 ''" "kiln convert cifar10: ARCHIVE_OR_DIR is empty" -- "$KILN" convert cifar10 "" c_out
empty_case "convert cifar100 extra" "kiln convert cifar100: unexpected argument 'extra'" -- "$KILN" convert cifar100 a c_out extra
empty_case "convert images ''" "kiln convert images: ROOT is empty" -- "$KILN" convert images list.txt "" i_out
empty_case "convert images extra" "kiln convert images: unexpected argument 'extra'" -- "$KILN" convert images list.txt . i_out extra
empty_case "convert text ''" "kiln convert text: a file argument (TEXT... OUT_VOCAB) is empty" -- "$KILN" convert text "" v_out.txt
empty_case "convert text OUT ''" "kiln convert text: a file argument (TEXT... OUT_VOCAB) is empty" -- "$KILN" convert text corpus.txt ""
[ ! -e v_out.txt ] && pass || fail "a refused convert text wrote v_out.txt"
empty_case "data fetch --from ''" "kiln data fetch: --from: the value is empty" -- "$KILN" data fetch moby-dick --from ""
[ -z "$(ls -A "$KILN_DATA")" ] && pass || fail "a refused data fetch wrote $(ls -A "$KILN_DATA")"
empty_case "data list extra" "kiln data list: unexpected argument 'extra'" -- "$KILN" data list extra
empty_case "data dir extra" "kiln data dir: unexpected argument 'extra'" -- "$KILN" data dir extra
empty_case "compare-weights ''" "kiln compare-weights: A.caffemodel is empty" -- "$KILN" compare-weights "" w.caffemodel
empty_case "compare-weights extra" "kiln compare-weights: unexpected argument 'extra'" -- "$KILN" compare-weights a b extra
# kiln ce's options (exit 3: CE's code for bad usage)
expect_refusal "ce history --db ''" --code 3 --want "kiln ce history: --db: the value is empty" -- "$KILN" ce history tiny --db ""
expect_refusal "ce stability --times 2^31" --code 3 --want "--times: '2147483648' is out of range: --times takes 1 to 2147483647" -- \
  "$KILN" ce stability tiny --times 2147483648
expect_refusal "ce history --last x" --code 3 --want "--last: 'x' is not a whole number (--last takes 1 to 2147483647)" -- \
  "$KILN" ce history tiny --last x
[ ! -e "$XDG_DATA_HOME/kiln/ce.db" ] && [ ! -e "$HOME/.local/share/kiln/ce.db" ] && pass || fail "a refused ce command made a history"

finish
