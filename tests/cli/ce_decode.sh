# Continuous evaluation of an encoder-decoder by decoding. A tiny spelling-to-phonemes net (as in
# text_g2p.sh) is trained by `kiln ce run` on a temporary cache; the model's `decode` entry makes
# the runner keep the final weights and run `kiln decode` on them, whose "decode" event gives the
# KPIs per and word_accuracy: finite in the table, results.jsonl and the history, and the same
# figures `kiln decode` gives for those weights by hand. A decode that fails (a deploy net with an
# input the decoder does not know) fails the run with the reason and the decode's log; a KPI per
# asked of a model without `decode` is refused when the suite is read. First `kiln decode
# --metrics` itself: one "decode" event, and no file when the decode fails.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/toy_g2p.bash"
cd "$WORK"
export OMP_NUM_THREADS=1 NO_COLOR=1
export KILN_DATA="$WORK/cache"

mkdir -p cache/toy
toy_g2p_pairs cache/toy/pairs.tsv
need "source vocabulary" -- "$KILN" convert text cache/toy/pairs.tsv cache/toy/vocab.txt \
  --pairs source
need "target vocabulary" -- "$KILN" convert text cache/toy/pairs.tsv cache/toy/target_vocab.txt \
  --pairs target --level word

{
  echo 'name: "tiny_g2p"'
  for phase in TRAIN TEST; do
    cat <<NET
layer { name: "data" type: "TextData" top: "source" top: "source_mask" top: "source_cont"
  top: "target_in" top: "target_out" top: "target_cont" include { phase: $phase }
  text_data_param { source: "\$KILN_DATA/toy/pairs.tsv" mode: PAIRS batch_size: 8 seq_len: 8
                    target_len: 8 shuffle: $([ $phase = TRAIN ] && echo true || echo false) } }
NET
  done
  toy_g2p_layers
  cat <<'NET'
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "target_out" top: "loss"
  softmax_param { axis: 2 } loss_param { ignore_label: -1 } }
layer { name: "accuracy" type: "Accuracy" bottom: "logits" bottom: "target_out" top: "accuracy"
  accuracy_param { axis: 2 ignore_label: -1 } include { phase: TEST } }
NET
} > net.prototxt
{
  echo 'name: "tiny_g2p"'
  for i in source source_mask source_cont target_in target_cont; do
    echo "input: \"$i\" input_shape { dim: 1 dim: 1 }"
  done
  toy_g2p_layers
} > deploy.prototxt
# an input the decoder does not know: `kiln decode` refuses the net
sed 's/input: "target_cont"/input: "cont"/; s/bottom: "target_cont"/bottom: "cont"/' \
  deploy.prototxt > broken_deploy.prototxt
cat > solver.prototxt <<'S'
net: "net.prototxt"
test_iter: 5
test_interval: 1000
base_lr: 0.01
type: "Adam"
lr_policy: "fixed"
display: 20
max_iter: 1000
snapshot_prefix: "g2p"
random_seed: 5
S

# kiln decode --metrics: the event CE reads (random weights: the figures need not be good)
sed -e 's/^max_iter: .*/max_iter: 1/' -e 's/^test_interval: .*/test_interval: 1/' solver.prototxt \
  > one.prototxt
need "one iteration" -- "$KILN" train --solver one.prototxt
DECODE=("$KILN" decode --model deploy.prototxt --weights g2p_iter_1.caffemodel
  --vocab '$KILN_DATA/toy/vocab.txt' --target-vocab '$KILN_DATA/toy/target_vocab.txt'
  --input '$KILN_DATA/toy/pairs.tsv')
out=$("${DECODE[@]}" --limit 12 --beam 2 --metrics decode.jsonl 2>&1)
python3 - decode.jsonl "$out" <<'PY' && pass || fail "decode --metrics: $(cat decode.jsonl) / $out"
import json, math, re, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
e = json.loads(lines[0])
assert e["event"] == "decode" and e["rank"] == 0 and e["iter"] == 0, e
assert e["words"] == 12 and e["beam"] == 2 and e["time_ms"] >= 0 and e["peak_rss_mb"] > 0, e
per = float(re.search(r"^per = ([0-9.]+) ", sys.argv[2], re.M).group(1))
wa = float(re.search(r"^word_accuracy = ([0-9.]+) ", sys.argv[2], re.M).group(1))
assert math.isfinite(e["per"]) and abs(e["per"] - per) < 1e-6, (e, per)
assert 0 <= e["word_accuracy"] <= 1 and abs(e["word_accuracy"] - wa) < 1e-6, (e, wa)
PY
expect_refusal "decode --metrics of a failed decode" --gone "$WORK/none.jsonl" \
  --want "input 'cont' is none of" -- "${DECODE[@]}" --model broken_deploy.prototxt \
  --metrics "$WORK/none.jsonl"

# A suite of one seq2seq model judged by decoding, trained 60 iterations: it still errs.
model() { # model NAME MAX_ITER DEPLOY KPIS...
  local name=$1 iters=$2 deploy=$3
  shift 3
  cat <<M
model {
  name: "$name" solver: "solver.prototxt" max_iter: $iters test_interval: $iters test_iter: 5
  threads: 1
  decode { model: "$deploy" input: "toy/pairs.tsv" vocab: "toy/vocab.txt"
           target_vocab: "toy/target_vocab.txt" beam: 2 limit: 20 }
  $*
}
M
}
{
  echo 'repeats: 1 timeout_seconds: 300'
  model g2p 60 deploy.prototxt 'kpi { name: "per" ceiling: 5 } kpi { name: "word_accuracy" }' \
    'kpi { name: "accuracy" floor: 0 } kpi { name: "train_loss" }'
} > suite.prototxt
out=$("$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/ok" 2>&1)
rc=$?
[ $rc -eq 0 ] && pass || fail "ce run: exit $rc: $out"
echo "$out" | grep -Eq '^ *g2p +1 +per +[0-9.]+ ' && \
  echo "$out" | grep -Eq '^ *g2p +1 +word_accuracy +[0-9.]+ ' && pass || fail "table: $out"
run="$WORK/ok/runs/g2p-w1-r1"
[ -s "$run/decode.log" ] && [ -s "$run/decode.jsonl" ] && \
  [ -s "$run/snapshot_iter_60.caffemodel" ] && \
  grep -q '^snapshot_after_train: true' "$run/solver.prototxt" && pass \
  || fail "run folder: $(ls "$run")"
# the figures of the run are the decode's, and `kiln decode` of the kept weights gives them again
by_hand=$("${DECODE[@]}" --weights "$run/snapshot_iter_60.caffemodel" --beam 2 --limit 20 2>&1)
python3 - "$WORK/ok/results.jsonl" "$WORK/ce.db" "$run/decode.jsonl" "$by_hand" <<'PY' && pass \
  || fail "per and word_accuracy: $(grep -E '"(per|word_accuracy)"' ok/results.jsonl) / $by_hand"
import json, math, re, sqlite3, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
kpi = {r["kpi"]: r for r in rows if r.get("model") == "g2p"}
event = json.loads(open(sys.argv[3]).read())
assert event["words"] == 20, event
hand = {k: float(re.search(rf"^{k} = ([0-9.]+) ", sys.argv[4], re.M).group(1))
        for k in ("per", "word_accuracy")}
db = sqlite3.connect(sys.argv[2])
for k in ("per", "word_accuracy"):
    v = kpi[k]["value"]
    assert isinstance(v, (int, float)) and math.isfinite(v), kpi[k]
    assert abs(v - event[k]) < 1e-9 and abs(v - hand[k]) < 1e-6, (k, v, event, hand)
    assert kpi[k]["verdict"] == "new", kpi[k]
    assert 0 < v < 1, (k, v)  # stopped early, the model still errs: the figures are its own
    (h,) = db.execute("SELECT value FROM kpi_history WHERE model = 'g2p' AND kpi = ?",
                      (k,)).fetchone()
    assert h is not None and math.isfinite(h) and abs(h - v) < 1e-9, (k, h, v)
PY

# A decode that fails fails the run: the reason names the decode and its log.
{
  echo 'repeats: 1 timeout_seconds: 300'
  model broken 10 broken_deploy.prototxt 'kpi { name: "per" } kpi { name: "train_loss" }'
} > broken.prototxt
out=$("$KILN" ce run broken.prototxt --db "$WORK/ce.db" --report-dir "$WORK/broken" 2>&1)
rc=$?
[ $rc -eq 2 ] && pass || fail "broken decode: exit $rc, expected 2: $out"
log="$WORK/broken/runs/broken-w1-r1/decode.log"
want="FAIL broken x1 run: kiln decode failed (exit 1): kiln: decode: "
case "$out" in
  *"$want"*"input 'cont' is none of"*"(log: $log)"*) pass ;;
  *) fail "broken decode: the reason: $out" ;;
esac
grep -q "input 'cont' is none of" "$log" && pass || fail "decode.log: $(cat "$log")"

# per asked of a model without decode: refused when the suite is read, naming the model
printf 'model { name: "plain" solver: "solver.prototxt" kpi { name: "per" } }\n' > nodecode.prototxt
expect_refusal "per without decode" --code 3 --any \
  --want "nodecode.prototxt: model 'plain': KPI 'per' comes from \`kiln decode\`" -- \
  "$KILN" ce run nodecode.prototxt --db "$WORK/ce.db" --report-dir "$WORK/nodecode"
finish
