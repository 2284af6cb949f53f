# A character tagger end to end: TextData's TAGGED records (text without its spaces, 1 where a
# word starts) through a bidirectional LSTM learn the word boundaries of a few words; the
# solver's test events carry the F1 layer's mean counts and the precision, recall and f1
# derived from them, and `kiln test` prints and records the same figures.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export OMP_NUM_THREADS=1

python3 - <<'PY'
import random
words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it"]
r = random.Random(3)
with open("tags.tsv", "w") as tsv, open("text.txt", "w") as txt:
    for _ in range(300):
        ws = [r.choice(words) for _ in range(r.randint(2, 6))]
        tsv.write(" ".join("1" if i == 0 else "0" for w in ws for i in range(len(w))))
        tsv.write("\t" + "".join(ws) + "\n")
        txt.write("".join(ws) + "\n")
PY
need "vocabulary" -- "$KILN" convert text text.txt vocab.txt --level char

cat > net.prototxt <<'NET'
name: "tiny_tagger"
layer { name: "data" type: "TextData" top: "data" top: "label" top: "cont"
  include { phase: TRAIN }
  text_data_param { source: "tags.tsv" mode: TAGGED batch_size: 16 seq_len: 32 shuffle: true } }
layer { name: "data" type: "TextData" top: "data" top: "label" top: "cont"
  include { phase: TEST }
  text_data_param { source: "tags.tsv" mode: TAGGED batch_size: 25 seq_len: 32 } }
layer { name: "embed" type: "Embed" bottom: "data" top: "embed"
  embed_param { num_output: 8 input_dim: 19 bias_term: false
                weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "lstm" type: "LSTM" bottom: "embed" bottom: "cont" top: "lstm"
  recurrent_param { num_output: 16 bidirectional: true
                    weight_filler { type: "uniform" min: -0.2 max: 0.2 } } }
layer { name: "logits" type: "InnerProduct" bottom: "lstm" top: "logits"
  inner_product_param { num_output: 2 axis: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss"
  softmax_param { axis: 2 } loss_param { ignore_label: -1 } }
layer { name: "f1" type: "F1" bottom: "logits" bottom: "label" top: "tp" top: "fp" top: "fn"
  f1_param { axis: 2 ignore_label: -1 } include { phase: TEST } }
NET
cat > solver.prototxt <<'S'
net: "net.prototxt"
test_iter: 12
test_interval: 200
base_lr: 0.02
type: "Adam"
lr_policy: "fixed"
display: 100
max_iter: 200
snapshot_prefix: "tagger"
random_seed: 5
S
need "training" -- "$KILN" train --solver solver.prototxt --metrics train.jsonl

# The test events: the mean counts and the figures of the pooled counts, before training (where
# the counts are all far from 0) and after it, when the model gets nearly every boundary.
python3 - train.jsonl <<'PY' && pass || fail "test events: $(grep '"test"' train.jsonl)"
import json, sys
tests = [json.loads(l) for l in open(sys.argv[1]) if '"test"' in l]
assert [t["iter"] for t in tests] == [0, 200], tests
for t in tests:
    tp, fp, fn = t["tp"], t["fp"], t["fn"]
    close = lambda a, b: abs(a - b) < 1e-5
    assert close(t["precision"], tp / (tp + fp)), t
    assert close(t["recall"], tp / (tp + fn)), t
    assert close(t["f1"], 2 * tp / (2 * tp + fp + fn)), t
assert tests[0]["f1"] < 0.8 and tests[0]["fp"] > 1 and tests[0]["fn"] > 1, tests[0]
assert tests[1]["f1"] > 0.9, tests[1]
PY

out=$("$KILN" test --model net.prototxt --weights tagger_iter_200.caffemodel --iterations 12 \
  --metrics test.jsonl 2>/dev/null)
value() { echo "$out" | sed -n "s/^$1 = \([0-9.]*\).*/\1/p"; }
python3 -c "
import sys
tp, fp, fn, f1 = (float(v) for v in sys.argv[1:])
sys.exit(not abs(f1 - 2 * tp / (2 * tp + fp + fn)) < 1e-3)" \
  "$(value tp)" "$(value fp)" "$(value fn)" "$(value f1)" && pass || fail "kiln test: $out"
echo "$out" | grep -q "^f1 = [0-9.]* (2 tp / (2 tp + fp + fn))$" && pass || fail "kiln test: $out"
grep -q '"f1":' test.jsonl && grep -q '"precision":' test.jsonl && pass \
  || fail "kiln test metrics: $(cat test.jsonl)"
finish
