# The toy spelling-to-phonemes task of text_g2p.sh and ce_decode.sh: 40 made-up words (letters
# read by a few rules, with context: c is S before e, th is one phoneme, a final e is silent) and
# the layers of a tiny encoder-decoder over them (a bidirectional LSTM encoder, an LSTM decoder,
# attention), shared by a training net and a deploy net.
#   toy_g2p_pairs FILE: writes the words as SPELLING<TAB>PHONEMES records
#   toy_g2p_layers: prints the layers after the inputs (source, source_cont, source_mask,
#                   target_in, target_cont), up to the logits
toy_g2p_pairs() {
  PAIRS_OUT="$1" python3 - <<'PY'
import os
import random
r = random.Random(4)
ph = {"a": "AE1", "b": "B", "d": "D", "e": "EH1", "o": "OW1", "s": "S", "t": "T", "m": "M",
      "h": "HH"}
def pron(w):
    out, i = [], 0
    while i < len(w):
        if w[i:i + 2] == "th": out.append("TH"); i += 2; continue
        if w[i] == "c": out.append("S" if w[i + 1:i + 2] == "e" else "K"); i += 1; continue
        if w[i] == "e" and i == len(w) - 1 and len(w) > 2: i += 1; continue
        out.append(ph[w[i]]); i += 1
    return " ".join(out)
words = set()
while len(words) < 40:
    words.add("".join(r.choice("abcdehostm") for _ in range(r.randint(2, 6))))
with open(os.environ["PAIRS_OUT"], "w") as f:
    for w in sorted(words): f.write(f"{w.upper()}\t{pron(w)}\n")
PY
}

toy_g2p_layers() { # after the inputs, shared by the training and the decoding net
  cat <<'NET'
layer { name: "embed_src" type: "Embed" bottom: "source" top: "embed_src"
  embed_param { num_output: 16 input_dim: 12 bias_term: false
                weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "encoder" type: "LSTM" bottom: "embed_src" bottom: "source_cont" top: "encoder"
  recurrent_param { num_output: 16 bidirectional: true
                    weight_filler { type: "uniform" min: -0.2 max: 0.2 } } }
layer { name: "embed_tgt" type: "Embed" bottom: "target_in" top: "embed_tgt"
  embed_param { num_output: 16 input_dim: 15 bias_term: false
                weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "decoder" type: "LSTM" bottom: "embed_tgt" bottom: "target_cont" top: "decoder"
  recurrent_param { num_output: 32 weight_filler { type: "uniform" min: -0.2 max: 0.2 } } }
layer { name: "attention" type: "MultiHeadAttention" bottom: "decoder" bottom: "encoder"
  bottom: "source_mask" top: "attention" }
layer { name: "join" type: "Concat" bottom: "decoder" bottom: "attention" top: "join"
  concat_param { axis: 2 } }
layer { name: "logits" type: "InnerProduct" bottom: "join" top: "logits"
  inner_product_param { num_output: 15 axis: 2 weight_filler { type: "xavier" } } }
NET
}
