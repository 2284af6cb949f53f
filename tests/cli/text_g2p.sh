# An encoder-decoder end to end: spelling to phonemes on 40 made-up words (letters read by a few
# rules, with context: c is S before e, th is one phoneme, a final e is silent). TextData's
# PAIRS records through a bidirectional LSTM encoder, an LSTM decoder and attention learn them;
# `kiln decode` then spells every word out exactly, greedily and with beam search (PER 0, every
# word right, the decoded file the pairs file itself). A model stopped early shows that a beam of
# one chooses what greedy does and that the printed PER is the decoded file's, and `kiln test
# --decode` prints the same figures after the test net's. Bad inputs are
# refused naming the file and line: a target vocabulary without <s>, a record without a tab, a
# deploy net without the decoder's inputs. The zoo's seq2seq_g2p builds, trains and decodes on a
# cache whose cmudict is these words.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/toy_g2p.bash"
cd "$WORK"
export OMP_NUM_THREADS=1

toy_g2p_pairs pairs.tsv
need "source vocabulary" -- "$KILN" convert text pairs.tsv vocab.txt --pairs source
need "target vocabulary" -- "$KILN" convert text pairs.tsv target_vocab.txt --pairs target --level word
# the 10 letters, and the 11 phonemes after <pad> <unk> <s> </s>
[ "$(sed -n 1p vocab.txt)" = "# kiln vocabulary: level char, lowercase 0, 12 tokens" ] && \
  [ "$(sed -n 1p target_vocab.txt)" = "# kiln vocabulary: level word, lowercase 0, 15 tokens" ] && \
  [ "$(sed -n 4,5p target_vocab.txt | tr '\n' ' ')" = "<s> </s> " ] && pass \
  || fail "vocabularies: $(head -1 vocab.txt) / $(head -5 target_vocab.txt | tr '\n' ' ')"

data() { # data PHASE SHUFFLE [TARGET_VOCAB]
  local tv=""
  [ -n "${3:-}" ] && tv="target_vocab: '$3'"
  cat <<NET
layer { name: "data" type: "TextData" top: "source" top: "source_mask" top: "source_cont"
  top: "target_in" top: "target_out" top: "target_cont" include { phase: $1 }
  text_data_param { source: "pairs.tsv" mode: PAIRS batch_size: 8 seq_len: 8 target_len: 8
                    shuffle: $2 $tv } }
NET
}
train_net() { # train_net [TARGET_VOCAB]
  echo 'name: "tiny_g2p"'
  data TRAIN true "${1:-}"
  data TEST false "${1:-}"
  toy_g2p_layers
  cat <<'NET'
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "target_out" top: "loss"
  softmax_param { axis: 2 } loss_param { ignore_label: -1 } }
layer { name: "accuracy" type: "Accuracy" bottom: "logits" bottom: "target_out" top: "accuracy"
  accuracy_param { axis: 2 ignore_label: -1 } include { phase: TEST } }
NET
}
train_net > net.prototxt
{
  echo 'name: "tiny_g2p"'
  for i in source source_mask source_cont target_in target_cont; do
    echo "input: \"$i\" input_shape { dim: 1 dim: 1 }"
  done
  toy_g2p_layers
} > deploy.prototxt
solver() { # solver ITERATIONS PREFIX
  cat <<S
net: "net.prototxt"
test_iter: 5
test_interval: $1
base_lr: 0.01
type: "Adam"
lr_policy: "fixed"
display: 100
max_iter: $1
snapshot_prefix: "$2"
random_seed: 5
S
}
solver 400 g2p > solver.prototxt
need "training" -- "$KILN" train --solver solver.prototxt --metrics train.jsonl
# teacher-forced, every phoneme and every </s> right
python3 - train.jsonl <<'PY' && pass || fail "test events: $(grep '"test"' train.jsonl)"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"test"' in l][-1]
assert last["iter"] == 400 and last["accuracy"] == 1 and last["loss"] < 0.05, last
PY

# the decoding command but for the weights and what a case adds (a later option wins)
DECODE=("$KILN" decode --model deploy.prototxt --vocab vocab.txt --target-vocab target_vocab.txt
  --input pairs.tsv)
decode() { "${DECODE[@]}" "$@"; }
out=$(decode --weights g2p_iter_400.caffemodel --output greedy.tsv 2>&1)
echo "$out" | grep -q "^per = 0.000000 (0 edits / 146 reference tokens)$" && \
  echo "$out" | grep -q "^word_accuracy = 1.000000 (40 / 40 exactly right)$" && pass \
  || fail "greedy decode: $out"
cmp -s greedy.tsv pairs.tsv && pass || fail "greedy decode wrote: $(diff greedy.tsv pairs.tsv)"
out=$(decode --weights g2p_iter_400.caffemodel --beam 3 --output beam.tsv 2>&1)
echo "$out" | grep -q "^per = 0.000000 " && echo "$out" | grep -q "^beam = 3$" && \
  cmp -s beam.tsv pairs.tsv && pass || fail "beam decode: $out $(diff beam.tsv pairs.tsv)"
out=$(decode --weights g2p_iter_400.caffemodel --limit 7 2>&1)
echo "$out" | grep -q "^records = 7 (greedy)$" && pass || fail "--limit 7: $out"

# Stopped early the model errs; a beam of one errs exactly as greedy does (prefixes recomputed
# against state carried), and the PER printed is the decoded file's against the pairs file.
solver 60 early > early.prototxt
need "short training" -- "$KILN" train --solver early.prototxt
g=$(decode --weights early_iter_60.caffemodel --output early_greedy.tsv 2>&1)
b=$(decode --weights early_iter_60.caffemodel --beam 1 --output early_beam1.tsv 2>&1)
cmp -s early_greedy.tsv early_beam1.tsv && ! cmp -s early_greedy.tsv pairs.tsv && pass \
  || fail "beam 1 against greedy: $(diff early_greedy.tsv early_beam1.tsv | head)"
decode --weights early_iter_60.caffemodel --beam 4 --output early_beam4.tsv > beam4.txt 2>&1
for f in greedy beam4; do
  [ $f = greedy ] && echo "$g" > greedy.txt
  python3 - pairs.tsv early_$f.tsv $f.txt <<'PY' && pass || fail "$f PER: $(cat $f.txt)"
import re, sys
def lev(a, b):
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        diag, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            up = row[j]
            row[j] = min(diag + (a[i - 1] != b[j - 1]), up + 1, row[j - 1] + 1)
            diag = up
    return row[-1]
ref = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
got = [l.rstrip("\n").split("\t") for l in open(sys.argv[2])]
assert [r[0] for r in ref] == [g[0] for g in got]
edits = sum(lev(g[1].split(), r[1].split()) for g, r in zip(got, ref))
total = sum(len(r[1].split()) for r in ref)
right = sum(g[1] == r[1] for g, r in zip(got, ref))
text = open(sys.argv[3]).read()
m = re.search(r"^per = ([0-9.]+) \((\d+) edits / (\d+) reference tokens\)$", text, re.M)
w = re.search(r"^word_accuracy = ([0-9.]+) \((\d+) / 40 exactly right\)$", text, re.M)
assert m and w, text
assert int(m.group(2)) == edits and int(m.group(3)) == total == 146, (edits, total, text)
assert abs(float(m.group(1)) - edits / total) < 1e-6 and int(w.group(2)) == right, text
PY
done

# kiln test --decode: after the test net's figures, the test pairs decoded by the deploy net with
# the same weights, greedy and with a beam: the figures kiln decode prints (the early model errs,
# so they are not trivially equal), and a "decode" event after the "test" one. Without --decode
# it says that the PER needs decoding; --decode without pairs to decode, or --beam without
# --decode, is refused.
t=$("$KILN" test --model net.prototxt --weights early_iter_60.caffemodel --iterations 5 \
  --decode deploy.prototxt --metrics test.jsonl 2>&1)
echo "$t" | grep -q "^accuracy = " && [ "$(echo "$t" | grep '^per = ')" = "$(echo "$g" | grep '^per = ')" ] \
  && [ "$(echo "$t" | grep '^word_accuracy = ')" = "$(echo "$g" | grep '^word_accuracy = ')" ] \
  && pass || fail "kiln test --decode: $t / kiln decode: $g"
[ "$(grep -o '"event":"[a-z]*"' test.jsonl | tr '\n' ' ')" = '"event":"test" "event":"decode" ' ] \
  && pass || fail "kiln test --decode events: $(cat test.jsonl)"
t=$("$KILN" test --model net.prototxt --weights early_iter_60.caffemodel --iterations 5 \
  --decode deploy.prototxt --beam 4 2>&1)
[ "$(echo "$t" | grep '^per = ')" = "$(grep '^per = ' beam4.txt)" ] && pass \
  || fail "kiln test --decode --beam 4: $t / $(cat beam4.txt)"
t=$("$KILN" test --model net.prototxt --weights early_iter_60.caffemodel --iterations 5 2>&1)
echo "$t" | grep -q "^per: not computed (the token error rate needs decoding: give --decode " \
  && ! echo "$t" | grep -q "^per = " && pass || fail "kiln test without --decode: $t"
expect_refusal "test: --beam without --decode" --code 2 --want "go with --decode" -- \
  "$KILN" test --model net.prototxt --weights early_iter_60.caffemodel --beam 2
expect_refusal "test: --decode of a deploy net" --code 2 --want "no TextData layer of mode PAIRS" -- \
  "$KILN" test --model deploy.prototxt --weights early_iter_60.caffemodel --decode deploy.prototxt

# Refused, naming the file (and the line): a target vocabulary without <s>, for decoding and for
# training; a record without a tab; a net whose inputs are not the decoder's.
grep -v '^<s>$' target_vocab.txt | sed '1s/15 tokens/14 tokens/' > nostart.txt
expect_refusal "decode: no <s>" --code 2 --want "nostart.txt has no <s> token" -- \
  "${DECODE[@]}" --weights g2p_iter_400.caffemodel --target-vocab nostart.txt
train_net nostart.txt > nostart.prototxt
expect_refusal "train: no <s>" --want "layer 'data' (TextData)" \
  --want "nostart.txt has no <s> token" -- \
  "$KILN" test --model nostart.prototxt --weights g2p_iter_400.caffemodel
printf 'AB\tAE1 B\nABC AE1 B K\n' > notab.tsv
expect_refusal "decode: no tab" --want "notab.tsv:2: no tab: a line is SOURCE<TAB>TARGET" -- \
  "${DECODE[@]}" --weights g2p_iter_400.caffemodel --input notab.tsv
sed 's/source: "pairs.tsv"/source: "notab.tsv"/' net.prototxt > notab.prototxt
expect_refusal "train: no tab" --want "notab.tsv:2: no tab" -- \
  "$KILN" test --model notab.prototxt --weights g2p_iter_400.caffemodel
expect_refusal "not a decoding net" --want "net.prototxt: a decoding net takes" \
  --want "it has no 'source'" -- "${DECODE[@]}" --model net.prototxt --weights g2p_iter_400.caffemodel
sed 's/input: "target_cont"/input: "cont"/; s/bottom: "target_cont"/bottom: "cont"/' \
  deploy.prototxt > cont.prototxt
expect_refusal "an input of another name" --want "cont.prototxt: input 'cont' is none of" -- \
  "${DECODE[@]}" --model cont.prototxt --weights g2p_iter_400.caffemodel
expect_refusal "output left behind" --gone "$WORK/none.tsv" --want "notab.tsv:2" -- \
  "${DECODE[@]}" --weights g2p_iter_400.caffemodel --input notab.tsv --output "$WORK/none.tsv"

# The zoo's seq2seq_g2p on a cache whose cmudict is these pairs: a fetch adds the two
# vocabularies to the cache as it stands, the nets build on them, two iterations train, and the
# deploy net decodes.
mkdir -p cache/cmudict
for split in train valid test; do cp pairs.tsv cache/cmudict/$split.tsv; done
echo ready > cache/cmudict/READY
out=$(KILN_DATA="$WORK/cache" "$KILN" data fetch cmudict 2>&1)
cmp -s cache/cmudict/vocab.txt vocab.txt && cmp -s cache/cmudict/target_vocab.txt target_vocab.txt \
  && pass || fail "fetch into a cache without vocabularies: $out; $(ls cache/cmudict)"
zoo="$SRC/models/seq2seq_g2p"
sed -e "s#^net: \"#net: \"$zoo/#" -e 's/^max_iter: .*/max_iter: 2/' -e 's/^test_iter: .*/test_iter: 1/' \
  -e 's/^test_interval: .*/test_interval: 2/' -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$WORK/zoo\"#" \
  "$zoo/seq2seq_g2p_solver.prototxt" > zoo_solver.prototxt
KILN_DATA="$WORK/cache" need "zoo model" -- "$KILN" train --solver zoo_solver.prototxt \
  --metrics zoo.jsonl
[ "$(grep -c '"event":"test"' zoo.jsonl)" -eq 4 ] && pass || fail "zoo test events: $(cat zoo.jsonl)"
# its scores are over the real cache's 73 target tokens: these 15 and made-up ones
{ sed '1s/15 tokens/73 tokens/' target_vocab.txt; for i in $(seq 58); do echo "X$i"; done; } > tv73.txt
out=$(KILN_DATA="$WORK/cache" "$KILN" decode --model "$zoo/seq2seq_g2p_deploy.prototxt" \
  --weights zoo_iter_2.caffemodel --vocab '$KILN_DATA/cmudict/vocab.txt' --target-vocab tv73.txt \
  --input '$KILN_DATA/cmudict/test.tsv' --limit 3 --beam 2 --max-len 5 2>&1)
echo "$out" | grep -q "^records = 3 (beam search)$" && pass || fail "zoo decode: $out"
finish
