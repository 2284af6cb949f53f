# `kiln export onnx` of the sequence and text layers (docs/onnx.md): the zoo's text deploy nets
# (char_lm, transformer_lm, seq2seq_g2p with its bidirectional encoder and masked
# cross-attention, word_lm, lstm_spam, bilstm_tagger, spam_bow's two), at more than one step and
# stream, and a net of every sequence form, get
# random weights and inputs (tests/support/onnx_ref.c: Embed ids, cont 0 at the first step and 1
# after, padding masks with a query that sees no key), ONNX's checker takes each model (with
# shape inference) and an evaluator of the ONNX ops in NumPy (onnx_numpy_eval.py, written from
# the operator definitions) runs it to kiln's outputs within 1e-4. char_lm and a net of LSTMs and
# GRUs one way and both ways, transformer_lm and seq2seq_g2p go back through `kiln import onnx`
# to kiln's outputs bit for bit. Then the forms with no ONNX export, each
# refused naming the layer with nothing written.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$SRC/tests/cli/onnx.bash"
EVAL_PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import onnx, numpy' >/dev/null 2>&1; then
    EVAL_PY=$p
    break
  fi
done
[ -n "$EVAL_PY" ] || echo "SKIP: python3-onnx not installed: the models are exported but neither checked nor evaluated"
EVALS=()

# seq_export NAME PROTOTXT [BLOB...]: onnx.bash's round trip (random weights, inputs and kiln's
# outputs, the export), the pair queued for the NumPy evaluator instead of OpenCV
seq_export() {
  local n=${#ONNX_CHECKS[@]}
  onnx_round_trip "$@"
  if [ ${#ONNX_CHECKS[@]} -gt "$n" ]; then
    EVALS+=("${ONNX_CHECKS[@]:$n}")
    ONNX_CHECKS=("${ONNX_CHECKS[@]:0:$n}")
  fi
}

M=$SRC/models
# the zoo's deploy nets, at several steps and streams
sed 's/dim: 1 dim: 1 }/dim: 6 dim: 2 }/g' "$M/char_lm/char_lm_deploy.prototxt" > char_lm.prototxt
seq_export char_lm char_lm.prototxt
sed 's/dim: 64 dim: 1 }/dim: 12 dim: 2 }/' "$M/transformer_lm/transformer_lm_deploy.prototxt" > transformer_lm.prototxt
seq_export transformer_lm transformer_lm.prototxt
# source, source_mask, source_cont: 7 x 3; target_in, target_cont: 5 x 3
sed 's/input_param { shape { dim: 1 dim: 1 } shape { dim: 1 dim: 1 } shape { dim: 1 dim: 1 }/input_param { shape { dim: 7 dim: 3 } shape { dim: 7 dim: 3 } shape { dim: 7 dim: 3 }/; s/^\( *\)shape { dim: 1 dim: 1 } shape { dim: 1 dim: 1 } } }/\1shape { dim: 5 dim: 3 } shape { dim: 5 dim: 3 } } }/' \
  "$M/seq2seq_g2p/seq2seq_g2p_deploy.prototxt" > seq2seq_g2p.prototxt
grep -q 'dim: 5 dim: 3' seq2seq_g2p.prototxt && pass || fail "seq2seq_g2p's inputs not resized"
seq_export seq2seq_g2p seq2seq_g2p.prototxt encoder decoder attention
# the other text models' deploy nets: word_lm (Embed, LSTM, logits of each step), lstm_spam (a
# mask's MAX SequencePool), bilstm_tagger (a bidirectional LSTM), spam_bow's MLP and logistic
# regression (a dense bag of words)
sed 's/dim: 1 dim: 1 }/dim: 6 dim: 2 }/g' "$M/word_lm/word_lm_deploy.prototxt" > word_lm.prototxt
seq_export word_lm word_lm.prototxt
sed 's/dim: 800 dim: 1 }/dim: 9 dim: 2 }/g' "$M/lstm_spam/lstm_spam_deploy.prototxt" > lstm_spam.prototxt
seq_export lstm_spam lstm_spam.prototxt
sed 's/dim: 100 dim: 1 }/dim: 8 dim: 2 }/g' "$M/bilstm_tagger/bilstm_tagger_deploy.prototxt" > bilstm_tagger.prototxt
seq_export bilstm_tagger bilstm_tagger.prototxt
for n in spam_bow_mlp spam_bow_lr; do
  sed 's/dim: 1 dim: 20000 }/dim: 3 dim: 20000 }/' "$M/spam_bow/${n}_deploy.prototxt" > $n.prototxt
  seq_export $n $n.prototxt
done
# the deploy nets as they are (one step of one stream) export too
for n in char_lm/char_lm transformer_lm/transformer_lm seq2seq_g2p/seq2seq_g2p word_lm/word_lm \
  lstm_spam/lstm_spam bilstm_tagger/bilstm_tagger spam_bow/spam_bow_mlp spam_bow/spam_bow_lr; do
  b=$(basename "$n")
  "$KILN" export onnx --model "$M/${n}_deploy.prototxt" --weights "$b.caffemodel" "$b-deploy.onnx" \
    > "$b-deploy.out" 2>&1 && pass || fail "$b's deploy net: $(cat "$b-deploy.out")"
done

# Every sequence form: Embed with a bias, sinusoidal and learned PositionalEncoding (odd D),
# LayerNorm of the last axis, of N x D (axis 1) and without gain, bias or both, GELU's two forms,
# Swish, SequencePool's three forms with and without a mask, attention causal with a padding mask (a query of sequence 2 sees no key), cross
# attention without biases, self attention with the mask alone, LSTM, GRU and RNN one way and
# both ways (one of 4-axis input), Softmax and ArgMax over the classes of each step.
cat > every_seq.prototxt <<'NET'
name: "every_seq"
layer { name: "in" type: "Input" top: "ids" top: "cont" top: "mask" top: "x" top: "kv" top: "x4"
  input_param { shape { dim: 5 dim: 3 } shape { dim: 5 dim: 3 } shape { dim: 5 dim: 3 }
                shape { dim: 5 dim: 3 dim: 7 } shape { dim: 4 dim: 3 dim: 8 } shape { dim: 5 dim: 3 dim: 2 dim: 3 } } }
layer { name: "embed" type: "Embed" bottom: "ids" top: "e" embed_param { num_output: 8 input_dim: 11 } }
layer { name: "pe" type: "PositionalEncoding" bottom: "e" top: "pe" }
layer { name: "pe_l" type: "PositionalEncoding" bottom: "x" top: "pe_l" positional_encoding_param { mode: LEARNED max_len: 9 } }
layer { name: "pe_s" type: "PositionalEncoding" bottom: "x" top: "pe_s" }
layer { name: "ln_a" type: "LayerNorm" bottom: "pe" top: "ln_a" }
layer { name: "ln_b" type: "LayerNorm" bottom: "pe" top: "ln_b" layer_norm_param { axis: 1 elementwise_affine: false } }
layer { name: "ln_c" type: "LayerNorm" bottom: "pe" top: "ln_c" layer_norm_param { bias_term: false eps: 0.01 } }
layer { name: "ln_d" type: "LayerNorm" bottom: "pe_l" top: "pe_l" }
layer { name: "gelu" type: "GELU" bottom: "ln_a" top: "g1" }
layer { name: "gelu_t" type: "GELU" bottom: "ln_b" top: "g2" gelu_param { approximate: TANH } }
layer { name: "swish" type: "Swish" bottom: "ln_c" top: "sw" swish_param { beta: 1.5 } }
layer { name: "swish1" type: "Swish" bottom: "pe_s" top: "sw1" }
layer { name: "attn_cm" type: "MultiHeadAttention" bottom: "g1" bottom: "mask" top: "a1"
  multihead_attention_param { num_heads: 2 causal: true } }
layer { name: "attn_x" type: "MultiHeadAttention" bottom: "g2" bottom: "kv" top: "a2"
  multihead_attention_param { num_heads: 4 bias_term: false } }
layer { name: "attn_p" type: "MultiHeadAttention" bottom: "sw" bottom: "mask" top: "a3"
  multihead_attention_param { num_heads: 1 } }
layer { name: "attn_c" type: "MultiHeadAttention" bottom: "a3" top: "a4"
  multihead_attention_param { num_heads: 2 causal: true } }
layer { name: "lstm_b" type: "LSTM" bottom: "pe_l" bottom: "cont" top: "lb" recurrent_param { num_output: 4 bidirectional: true } }
layer { name: "lstm4" type: "LSTM" bottom: "x4" bottom: "cont" top: "l4" recurrent_param { num_output: 3 } }
layer { name: "gru" type: "GRU" bottom: "a1" bottom: "cont" top: "gr" recurrent_param { num_output: 5 } }
layer { name: "gru_b" type: "GRU" bottom: "a2" bottom: "cont" top: "grb" recurrent_param { num_output: 3 bidirectional: true } }
layer { name: "rnn" type: "RNN" bottom: "a4" bottom: "cont" top: "rn" recurrent_param { num_output: 4 } }
layer { name: "rnn_b" type: "RNN" bottom: "lb" bottom: "cont" top: "rnb" recurrent_param { num_output: 3 bidirectional: true } }
layer { name: "sp_last" type: "SequencePool" bottom: "gr" top: "sp_last" }
layer { name: "sp_mean" type: "SequencePool" bottom: "l4" top: "sp_mean" sequence_pool_param { pool: MEAN } }
layer { name: "sp_max" type: "SequencePool" bottom: "lb" top: "sp_max" sequence_pool_param { pool: MAX } }
layer { name: "sp_last_m" type: "SequencePool" bottom: "grb" bottom: "mask" top: "sp_last_m" }
layer { name: "sp_mean_m" type: "SequencePool" bottom: "rn" bottom: "mask" top: "sp_mean_m" sequence_pool_param { pool: MEAN } }
layer { name: "sp_max_m" type: "SequencePool" bottom: "x4" bottom: "mask" top: "sp_max_m" sequence_pool_param { pool: MAX } }
layer { name: "sm" type: "Softmax" bottom: "gr" top: "sm" softmax_param { axis: 2 } }
layer { name: "am" type: "ArgMax" bottom: "rnb" top: "am" argmax_param { axis: 2 } }
NET
seq_export every_seq every_seq.prototxt a1 a2 a3 g1 g2 sw sw1 pe_l
if [ -n "$EVAL_PY" ] && [ ${#EVALS[@]} -gt 0 ]; then
  "$EVAL_PY" "$SRC/tests/cli/onnx_numpy_eval.py" "${EVALS[@]}" > eval.log 2> eval.err
  while IFS= read -r line; do
    echo "$line"
    case "$line" in "ok "*) pass ;; *) fail "$line" ;; esac
  done < eval.log
  [ "$(grep -c '^ok ' eval.log)" -eq $((${#EVALS[@]} / 2)) ] && pass \
    || fail "onnx_numpy_eval.py passed $(grep -c '^ok ' eval.log) of $((${#EVALS[@]} / 2)) models: $(tail -n 5 eval.err)"
  # the evaluator is no rubber stamp: a model whose LSTM gates are in kiln's order fails it
  "$EVAL_PY" - char_lm.onnx swapped.onnx <<'PY' && pass || fail "could not write swapped.onnx"
import sys, onnx
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
for t in m.graph.initializer:
    if t.name == "lstm.W":
        w = numpy_helper.to_array(t).copy()
        H = w.shape[1] // 4
        w[:, H:2 * H], w[:, 2 * H:3 * H] = w[:, 2 * H:3 * H].copy(), w[:, H:2 * H].copy()
        t.CopyFrom(numpy_helper.from_array(w, t.name))
onnx.save(m, sys.argv[2])
PY
  if "$EVAL_PY" "$SRC/tests/cli/onnx_numpy_eval.py" swapped.onnx char_lm.d > swapped.log 2>&1; then
    fail "an LSTM with its gates swapped passes the evaluator: $(cat swapped.log)"
  else
    grep -q "logits max|d| .* > 0.0001" swapped.log && pass || fail "swapped: $(cat swapped.log)"
  fi
fi

# the round trip: char_lm (Cast, Gather, LSTM, Squeeze, MatMul, Add) back into kiln, bit for bit
if "$KILN" import onnx char_lm.onnx char_lm-back.prototxt char_lm-back.caffemodel > back.out 2>&1; then
  pass
  "$ONNX_REF" --compare char_lm-back.prototxt char_lm-back.caffemodel char_lm.d 0 > back.cmp 2>&1 \
    && pass || fail "char_lm through import: $(cat back.cmp)"
  grep -q 'type: "Embed"' char_lm-back.prototxt && grep -q 'type: "LSTM"' char_lm-back.prototxt \
    && pass || fail "char_lm imported without its Embed and LSTM: $(cat char_lm-back.prototxt)"
else
  fail "import of char_lm.onnx: $(cat back.out)"
fi

# transformer_lm back into kiln: its attention, LayerNorms and GELUs, each written out as a group
# of nodes, come back as those layers, and the logits are kiln's bit for bit
if "$KILN" import onnx transformer_lm.onnx tlm-back.prototxt tlm-back.caffemodel > tback.out 2>&1; then
  pass
  "$ONNX_REF" --compare tlm-back.prototxt tlm-back.caffemodel transformer_lm.d 0 > tback.cmp 2>&1 \
    && pass || fail "transformer_lm through import: $(cat tback.cmp)"
  echo "transformer_lm exported and imported again: $(tr '\n' ' ' < tback.cmp)"
  for t in MultiHeadAttention:4 MatMul:0 Permute:0 LayerNorm:9 GELU:4; do
    [ "$(grep -c "type: \"${t%:*}\"" tlm-back.prototxt)" = "${t#*:}" ] && pass \
      || fail "transformer_lm imported: $(grep -c "type: \"${t%:*}\"" tlm-back.prototxt) ${t%:*} layers, want ${t#*:}"
  done
else
  fail "import of transformer_lm.onnx: $(cat tback.out)"
fi

# seq2seq_g2p back into kiln: its bidirectional LSTM encoder, LSTM decoder and masked
# cross-attention, the logits bit for bit
grep '^blob logits ' seq2seq_g2p.d/manifest.txt > s2s-logits.txt
mkdir -p s2s-back.d && cp seq2seq_g2p.d/* s2s-back.d/ && { grep '^input ' seq2seq_g2p.d/manifest.txt; cat s2s-logits.txt; } > s2s-back.d/manifest.txt
if "$KILN" import onnx seq2seq_g2p.onnx s2s-back.prototxt s2s-back.caffemodel > sback.out 2>&1; then
  pass
  "$ONNX_REF" --compare s2s-back.prototxt s2s-back.caffemodel s2s-back.d 0 > sback.cmp 2>&1 \
    && pass || fail "seq2seq_g2p through import: $(cat sback.cmp)"
  echo "seq2seq_g2p exported and imported again: $(tr '\n' ' ' < sback.cmp)"
  grep -q 'bidirectional: true' s2s-back.prototxt && pass || fail "seq2seq_g2p imported without its bidirectional LSTM"
  [ "$(grep -c 'type: "MultiHeadAttention"' s2s-back.prototxt)" = 1 ] && pass \
    || fail "seq2seq_g2p imported without its MultiHeadAttention layer"
else
  fail "import of seq2seq_g2p.onnx: $(cat sback.out)"
fi

# back_exact NAME WHAT: NAME.prototxt with random weights exported, imported again and run to
# kiln's outputs bit for bit; status 0 when the import was written (NAME-back.prototxt)
back_exact() {
  local name=$1 what=$2
  mkdir -p "$name.d"
  if "$ONNX_REF" "$name.prototxt" "$name.caffemodel" "$name.d" 5 > "$name.log" 2>&1 \
    && "$KILN" export onnx --model "$name.prototxt" --weights "$name.caffemodel" "$name.onnx" >> "$name.log" 2>&1 \
    && "$KILN" import onnx "$name.onnx" "$name-back.prototxt" "$name-back.caffemodel" >> "$name.log" 2>&1; then
    pass
    "$ONNX_REF" --compare "$name-back.prototxt" "$name-back.caffemodel" "$name.d" 0 > "$name.cmp" 2>&1 \
      && pass || fail "$what through export and import: $(cat "$name.cmp")"
    return 0
  fi
  fail "$what: $(cat "$name.log")"
  return 1
}

# the recurrent layers one way and both ways, back into kiln bit for bit (RNN with Caffe's output
# layer after ONNX's RNN)
cat > rec.prototxt <<'NET'
name: "rec"
layer { name: "in" type: "Input" top: "x" top: "cont" top: "x4"
  input_param { shape { dim: 5 dim: 3 dim: 7 } shape { dim: 5 dim: 3 } shape { dim: 5 dim: 3 dim: 2 dim: 3 } } }
layer { name: "lstm_b" type: "LSTM" bottom: "x" bottom: "cont" top: "lb" recurrent_param { num_output: 4 bidirectional: true } }
layer { name: "gru" type: "GRU" bottom: "lb" bottom: "cont" top: "gr" recurrent_param { num_output: 5 } }
layer { name: "gru_b" type: "GRU" bottom: "gr" bottom: "cont" top: "grb" recurrent_param { num_output: 3 bidirectional: true } }
layer { name: "lstm4" type: "LSTM" bottom: "x4" bottom: "cont" top: "l4" recurrent_param { num_output: 3 } }
layer { name: "rnn" type: "RNN" bottom: "grb" bottom: "cont" top: "rn" recurrent_param { num_output: 4 } }
layer { name: "rnn_b" type: "RNN" bottom: "rn" bottom: "cont" top: "rnb" recurrent_param { num_output: 3 bidirectional: true } }
layer { name: "cat" type: "Concat" bottom: "rnb" bottom: "l4" top: "out" concat_param { axis: 2 } }
NET
if back_exact rec "LSTM, GRU and RNN both ways"; then
  [ "$(grep -c 'type: "Permute"' rec-back.prototxt) $(grep -c 'type: "RNN"' rec-back.prototxt)" = "0 2" ] \
    && pass || fail "imported as: $(grep 'type:' rec-back.prototxt | tr '\n' ' ')"
fi

# attention in each form back into kiln bit for bit, as MultiHeadAttention layers: causal with a
# padding mask (a query that sees no key), cross-attention without biases, a padding mask alone,
# causal alone
cat > attn.prototxt <<'NET'
name: "attn"
layer { name: "in" type: "Input" top: "x" top: "kv" top: "mask"
  input_param { shape { dim: 5 dim: 3 dim: 8 } shape { dim: 4 dim: 3 dim: 8 } shape { dim: 5 dim: 3 } } }
layer { name: "attn_cm" type: "MultiHeadAttention" bottom: "x" bottom: "mask" top: "a1"
  multihead_attention_param { num_heads: 2 causal: true } }
layer { name: "attn_x" type: "MultiHeadAttention" bottom: "a1" bottom: "kv" top: "a2"
  multihead_attention_param { num_heads: 4 bias_term: false } }
layer { name: "attn_p" type: "MultiHeadAttention" bottom: "x" bottom: "mask" top: "a3"
  multihead_attention_param { num_heads: 1 } }
layer { name: "attn_c" type: "MultiHeadAttention" bottom: "a3" top: "a4"
  multihead_attention_param { num_heads: 2 causal: true } }
NET
if back_exact attn "attention in each form"; then
  [ "$(grep -c 'type: "MultiHeadAttention"' attn-back.prototxt) $(grep -c 'causal: true' attn-back.prototxt) $(grep -c 'bias_term: false' attn-back.prototxt)" = "4 2 1" ] \
    && pass || fail "attention imported as: $(grep 'type:\|multihead' attn-back.prototxt | tr '\n' ' ')"
fi

# ---- refusals: named, nothing written ----------------------------------------------------------
head='layer { name: "in" type: "Input" top: "x" top: "cont" top: "h0" top: "c0" top: "s" top: "g" top: "c1" input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } shape { dim: 1 dim: 2 dim: 5 } shape { dim: 1 dim: 2 dim: 5 } shape { dim: 2 dim: 3 } shape { dim: 1 dim: 2 dim: 20 } shape { dim: 1 dim: 2 } } }'
refuse_net() { # NAME LAYER WANT [OPTION]: the net's own random weights, then the refusal
  printf 'name: "%s"\n%s\n%s\n' "$1" "$head" "$2" > "$1.prototxt"
  mkdir -p "$1.d"
  "$ONNX_REF" "$1.prototxt" "$1.caffemodel" "$1.d" 3 > "$1.ref.log" 2>&1 || fail "$1: $(cat "$1.ref.log")"
  expect_refusal "$1" --want "$3" --want "nothing written" --gone "$1.onnx" \
    -- "$KILN" export onnx --model "$1.prototxt" --weights "$1.caffemodel" ${4:+"$4"} "$1.onnx"
}
refuse_net expose 'layer { name: "lstm_e" type: "LSTM" bottom: "x" bottom: "cont" bottom: "h0" bottom: "c0" top: "h" top: "hT" top: "cT" recurrent_param { num_output: 5 expose_hidden: true } }' \
  "layer 'lstm_e' (LSTM): expose_hidden"
refuse_net static 'layer { name: "gru_s" type: "GRU" bottom: "x" bottom: "cont" bottom: "s" top: "h" recurrent_param { num_output: 5 } }' \
  "layer 'gru_s' (GRU): a static input"
refuse_net unit 'layer { name: "unit" type: "LSTMUnit" bottom: "c0" bottom: "g" bottom: "c1" top: "c" top: "h" }' \
  "layer 'unit' (LSTMUnit): one step of Caffe's unrolled LSTM"
head='layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 3 dim: 2 dim: 4 } } }'
refuse_net pe_dyn 'layer { name: "pos" type: "PositionalEncoding" bottom: "x" top: "p" }' \
  "layer 'pos' (PositionalEncoding): the first axis is the time steps" --dynamic-batch
refuse_net pool_dyn 'layer { name: "sp" type: "SequencePool" bottom: "x" top: "p" }' \
  "layer 'sp' (SequencePool): its output's first axis is the streams" --dynamic-batch
refuse_net causal_dyn 'layer { name: "att" type: "MultiHeadAttention" bottom: "x" top: "a" multihead_attention_param { num_heads: 2 causal: true } }' \
  "layer 'att' (MultiHeadAttention): causal attention fixes the steps" --dynamic-batch
finish
