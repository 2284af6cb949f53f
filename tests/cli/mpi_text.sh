# The zoo's character language model (models/char_lm) under data-parallel training, on a small
# generated corpus put in a cache of its own under the names the net reads:
#   (a) 2 workers in deterministic GRADIENT mode end bit-identical to 1 worker with iter_size 2
#       (the LSTM's weights, the embedding and the classifier, after Adam with clipping);
#   (b) MODEL (every 2 iterations) and TIME sync train it too, to a finite loss and a snapshot.
# Skips (77) where mpi.bash says there is no MPI to test.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

export KILN_DATA="$WORK/cache"
mkdir -p cache/moby-dick
python3 - <<'PY'
import random
random.seed(11)
words = "the whale sea ship captain ahab ishmael white of and a to in was his that it".split()
def text(n):
    out = []
    while sum(map(len, out)) < n:
        s = " ".join(random.choice(words) for _ in range(random.randint(4, 12)))
        out.append(s.capitalize() + random.choice([". ", "; ", "! ", ".\n"]))
    return "".join(out)
open("cache/moby-dick/train.txt", "w").write(text(40000))
open("cache/moby-dick/valid.txt", "w").write(text(8000))
PY
need "vocabulary" -- "$KILN" convert text cache/moby-dick/train.txt cache/moby-dick/vocab.txt --level char
echo "test" > cache/moby-dick/READY

solver() { mpi_zoo_solver char_lm "$@"; }  # solver NAME ITER_SIZE MAX_ITER [EXTRA]

# (a)
solver ref 2 4 > ref.prototxt
solver w2 1 4 > w2.prototxt
"$KILN" train --solver ref.prototxt > ref.log 2>&1 || fail "1 worker, iter_size 2: $(tail -n 3 ref.log)"
mpi 2 "$KILN" train --solver w2.prototxt --deterministic > w2.log 2>&1 \
  || fail "2 workers: $(tail -n 5 w2.log)"
mpi_same ref_iter_4.caffemodel w2_iter_4.caffemodel "char_lm: 2 workers --deterministic vs iter_size 2"

# (b)
for mode in "model:2" "time:0.2"; do
  name=sync_${mode%%:*}
  solver "$name" 1 6 > "$name.prototxt"
  mpi 2 "$KILN" train --solver "$name.prototxt" --sync "$mode" --metrics "$name.jsonl" > "$name.log" 2>&1 \
    || fail "--sync $mode: $(tail -n 5 "$name.log")"
  [ -f "${name}_iter_6.caffemodel" ] && pass || fail "--sync $mode: no final snapshot: $(ls)"
  python3 - "$name.jsonl" <<'PY' && pass || fail "--sync $mode: losses: $(grep '"train"' "$name.jsonl" | head)"
import json, math, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"train"' in l]
assert losses and all(math.isfinite(x) for x in losses), losses
assert losses[-1] < losses[0], losses  # it learns: 4.42 (ln 83) at the start
PY
done
finish
