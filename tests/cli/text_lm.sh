# A character language model end to end: an LSTM trained on a text that repeats one sentence
# learns it (perplexity near 1); `kiln test` and the solver's test passes report the perplexity
# as exp of the mean cross-entropy per token; `kiln sample` at temperature 0 continues the
# sentence exactly, one token a pass or a window at a time, draws the same text from the same
# seed, and refuses a prime it cannot encode, a net it cannot sample from and a cont blob of the
# wrong shape, naming the cause. A small causal transformer learns the sentence too and is
# sampled a window at a time.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export OMP_NUM_THREADS=1

for i in $(seq 400); do printf 'the cat sat. '; done > corpus.txt
need "vocabulary" -- "$KILN" convert text corpus.txt vocab.txt --level char
# <pad> <unk> and the 8 characters of the sentence
[ "$(sed -n 1p vocab.txt)" = "# kiln vocabulary: level char, lowercase 0, 10 tokens" ] && pass \
  || fail "vocabulary header: $(sed -n 1p vocab.txt)"

layers() { # the layers after the inputs, shared by the training and the sampling net
  cat <<'NET'
layer { name: "embed" type: "Embed" bottom: "data" top: "embed"
  embed_param { num_output: 8 input_dim: 10 bias_term: false
                weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "lstm" type: "LSTM" bottom: "embed" bottom: "cont" top: "lstm"
  recurrent_param { num_output: 24 weight_filler { type: "uniform" min: -0.2 max: 0.2 } } }
layer { name: "logits" type: "InnerProduct" bottom: "lstm" top: "logits"
  inner_product_param { num_output: 10 axis: 2 weight_filler { type: "xavier" } } }
NET
}
{
  cat <<'NET'
name: "tiny_lm"
layer { name: "data" type: "TextData" top: "data" top: "label" top: "cont"
  include { phase: TRAIN }
  text_data_param { source: "corpus.txt" batch_size: 8 seq_len: 16 shuffle: true } }
layer { name: "data" type: "TextData" top: "data" top: "label" top: "cont"
  include { phase: TEST }
  text_data_param { source: "corpus.txt" batch_size: 8 seq_len: 16 } }
NET
  layers
  echo 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" softmax_param { axis: 2 } }'
} > net.prototxt
{
  cat <<'NET'
name: "tiny_lm"
input: "data" input_shape { dim: 1 dim: 1 }
input: "cont" input_shape { dim: 1 dim: 1 }
NET
  layers
} > deploy.prototxt
cat > solver.prototxt <<'S'
net: "net.prototxt"
test_iter: 4
test_interval: 300
base_lr: 0.01
type: "Adam"
momentum: 0.9
momentum2: 0.999
lr_policy: "fixed"
display: 100
max_iter: 300
snapshot_prefix: "lm"
random_seed: 5
S
need "training" -- "$KILN" train --solver solver.prototxt --metrics train.jsonl

# The solver's test event carries the perplexity beside the loss it comes from.
python3 - train.jsonl <<'PY' && pass || fail "test events: $(grep '"test"' train.jsonl)"
import json, math, sys
tests = [json.loads(l) for l in open(sys.argv[1]) if '"test"' in l]
last = tests[-1]
assert last["iter"] == 300, last
assert abs(last["perplexity"] - math.exp(last["loss"])) < 1e-4 * last["perplexity"], last
assert last["perplexity"] < 1.2, last  # the sentence is learned
PY

out=$("$KILN" test --model net.prototxt --weights lm_iter_300.caffemodel --iterations 4 \
  --metrics test.jsonl 2>/dev/null)
loss=$(echo "$out" | sed -n 's/^loss = //p')
ppl=$(echo "$out" | sed -n 's/^perplexity = \([0-9.]*\) (exp of loss)$/\1/p')
python3 -c "import math,sys; l,p=float('$loss'),float('$ppl'); sys.exit(not(abs(p-math.exp(l))<2e-4 and p<1.2))" \
  && pass || fail "kiln test: $out"
grep -q '"perplexity":' test.jsonl && pass || fail "kiln test metrics: $(cat test.jsonl)"

# --stage picks the TEST data layer a NetState rule selects (Caffe's -stage spelling too): the
# learned sentence, or the same characters in another order, which the model cannot predict.
for i in $(seq 100); do printf 'tas .hetca '; done > other.txt
sed -e 's/  include { phase: TEST }/  include { phase: TEST stage: "same" }/' net.prototxt > staged.prototxt
python3 - <<'PY'
s = open("staged.prototxt").read()
i = s.index('layer { name: "data" type: "TextData"', s.index('stage: "same"') - 200)
j = s.index("\n", s.index("text_data_param", i)) + 1
other = s[i:j].replace('"same"', '"other"').replace("corpus.txt", "other.txt")
open("staged.prototxt", "w").write(s[:j] + other + s[j:])
PY
same=$("$KILN" test --model staged.prototxt --weights lm_iter_300.caffemodel --iterations 2 --stage same 2>/dev/null | sed -n 's/^perplexity = \([0-9.]*\).*/\1/p')
other=$("$KILN" test -model=staged.prototxt -weights=lm_iter_300.caffemodel -iterations=2 -stage=other 2>/dev/null | sed -n 's/^perplexity = \([0-9.]*\).*/\1/p')
python3 -c "import sys; sys.exit(not (float('$same') < 1.2 and float('$other') > 3))" && pass \
  || fail "--stage: perplexity '$same' on the sentence, '$other' on the other text"

sample() { "$KILN" sample --model deploy.prototxt --weights lm_iter_300.caffemodel --vocab vocab.txt "$@"; }
out=$(sample --prime "the c" --temperature 0 --length 40 2>&1)
[ "$out" = "the cat sat. the cat sat. the cat sat. the ca" ] && pass || fail "greedy sample: '$out'"
a=$(sample --prime "sat" --length 60 --seed 7 2>&1)
b=$(sample --prime "sat" --length 60 --seed 7 2>&1)
[ "$a" = "$b" ] && [ ${#a} -eq 63 ] && pass || fail "same seed, other text: '$a' / '$b'"

# A window of 8 steps read again at every token (a transformer's way): the LSTM restarts at
# step 0 of each window, and 8 characters are enough context for this sentence.
sed 's/dim: 1 dim: 1/dim: 8 dim: 1/' deploy.prototxt > window.prototxt
out=$("$KILN" sample --model window.prototxt --weights lm_iter_300.caffemodel --vocab vocab.txt \
  --prime "the c" --temperature 0 --length 40 2>&1)
[ "$out" = "the cat sat. the cat sat. the cat sat. the ca" ] && pass || fail "windowed greedy sample: '$out'"

# A causal transformer block (docs/sequence.md) on the same text, sampled a window at a time.
tlayers() {
  cat <<'NET'
layer { name: "embed" type: "Embed" bottom: "data" top: "embed"
  embed_param { num_output: 16 input_dim: 10 bias_term: false weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pos" type: "PositionalEncoding" bottom: "embed" top: "h0"
  positional_encoding_param { mode: LEARNED max_len: 16 filler { type: "gaussian" std: 0.3 } } }
layer { name: "ln1" type: "LayerNorm" bottom: "h0" top: "ln1" }
layer { name: "attn" type: "MultiHeadAttention" bottom: "ln1" top: "attn"
  multihead_attention_param { num_heads: 2 causal: true } }
layer { name: "res1" type: "Eltwise" bottom: "h0" bottom: "attn" top: "h1" eltwise_param { operation: SUM } }
layer { name: "ln2" type: "LayerNorm" bottom: "h1" top: "ln2" }
layer { name: "ff1" type: "InnerProduct" bottom: "ln2" top: "ff1"
  inner_product_param { num_output: 32 axis: 2 weight_filler { type: "xavier" } } }
layer { name: "gelu" type: "GELU" bottom: "ff1" top: "ff1" }
layer { name: "ff2" type: "InnerProduct" bottom: "ff1" top: "ff2"
  inner_product_param { num_output: 16 axis: 2 weight_filler { type: "xavier" } } }
layer { name: "res2" type: "Eltwise" bottom: "h1" bottom: "ff2" top: "h2" eltwise_param { operation: SUM } }
layer { name: "lnf" type: "LayerNorm" bottom: "h2" top: "lnf" }
layer { name: "logits" type: "InnerProduct" bottom: "lnf" top: "logits"
  inner_product_param { num_output: 10 axis: 2 weight_filler { type: "xavier" } } }
NET
}
{
  sed -n '/^name:/,/phase: TEST/p' net.prototxt | sed '$d' | sed '$d'
  echo 'layer { name: "silence" type: "Silence" bottom: "cont" }'
  tlayers
  echo 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" softmax_param { axis: 2 } }'
} > tnet.prototxt
printf 'name: "tiny_transformer"\ninput: "data" input_shape { dim: 16 dim: 1 }\n' > tdeploy.prototxt
tlayers >> tdeploy.prototxt
sed -e 's/^net: .*/net: "tnet.prototxt"/' -e '/^test_/d' -e 's/^snapshot_prefix: .*/snapshot_prefix: "tlm"/' \
  solver.prototxt > tsolver.prototxt
need "transformer training" -- "$KILN" train --solver tsolver.prototxt
out=$("$KILN" sample --model tdeploy.prototxt --weights tlm_iter_300.caffemodel --vocab vocab.txt \
  --prime "the c" --temperature 0 --length 40 2>&1)
[ "$out" = "the cat sat. the cat sat. the cat sat. the ca" ] && pass || fail "transformer greedy sample: '$out'"

# A prime with a token the vocabulary lacks, when it has no <unk>.
grep -v '^<unk>$' vocab.txt | sed '1s/10 tokens/9 tokens/' > vocab_nounk.txt
expect_refusal "prime outside the vocabulary" --code 2 --want "--prime: token 5 is not in vocab_nounk.txt" -- \
  "$KILN" sample --model deploy.prototxt --weights lm_iter_300.caffemodel --vocab vocab_nounk.txt \
  --prime "the dog"
expect_refusal "no --vocab" --code 2 --want "--vocab" -- \
  "$KILN" sample --model deploy.prototxt --weights lm_iter_300.caffemodel
# The training net is no sampling net: its ids come from a data layer, many at a time.
expect_refusal "not a sampling net" --want "net.prototxt: a sampling net takes the token ids as an input of W steps" -- \
  "$KILN" sample --model net.prototxt --weights lm_iter_300.caffemodel --vocab vocab.txt
# A cont blob that is not T x N.
sed 's/input: "cont" input_shape { dim: 1 dim: 1 }/input: "cont" input_shape { dim: 2 dim: 1 }/' \
  deploy.prototxt > badcont.prototxt
expect_refusal "cont of the wrong shape" --want "layer 'lstm' (LSTM)" --want "cont is 2x1" -- \
  "$KILN" sample --model badcont.prototxt --weights lm_iter_300.caffemodel --vocab vocab.txt
finish
