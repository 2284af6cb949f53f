# The CUDA backend on a GPU (GPU 0; a build with -DKILN_CUDA=ON on a machine with a GPU; skipped,
# saying so, elsewhere): Caffe's spelling picks the GPU (solver_mode: GPU, -gpu 0, --device
# cuda:0); LeNet's first 50 iterations there track the host's losses (to 1e-3: cuBLAS sums in
# another order), as do resnet20's (to 2e-2 over 50 iterations: BatchNorm and 20 layers amplify
# the rounding); a snapshot from the GPU resumes on the host and the other way round; the zoo's
# nets build and run there; the metrics carry peak device memory; two workers sharing the GPU
# with --deterministic end on the bits of one with iter_size 2 (where mpirun exists); and LeNet
# trained at the zoo's budget on the GPU reaches 0.89 test accuracy.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
if ! "$KILN" devices 2>/dev/null | grep -q "^cuda:0"; then
  echo "skipped: no CUDA device ($("$KILN" devices 2>/dev/null | sed -n 's/^(no GPU: \(.*\))$/\1/p'))"
  exit 77
fi
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }
mk() {  # mk MODEL SOLVER PREFIX ITERS: a zoo solver, ITERS iterations, tests every half
  sed -e "s#^net: .*#net: \"$SRC/models/$1/$(sed -n 's/^net: "\(.*\)".*/\1/p' "$SRC/models/$1/$2")\"#" \
      -e "s#^max_iter: .*#max_iter: $4#" -e "s#^snapshot: .*#snapshot: $(($4 / 2))#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$3\"#" -e "s#^test_interval: .*#test_interval: $(($4 / 2))#" \
      -e "s#^test_iter: .*#test_iter: 3#" -e "s#^display: .*#display: 5#" -e "/^solver_mode/d" \
      "$SRC/models/$1/$2"
}
figures() { grep -E '"event":"(train|test)"' "$1" | grep -oE '"(loss|accuracy)":[-0-9.e]+' | cut -d: -f2; }
close() {  # close A.jsonl B.jsonl TOL WHAT: every loss and accuracy of two runs within TOL
  local n
  n=$(figures "$1" | wc -l)
  [ "$n" -ge 6 ] && [ "$n" = "$(figures "$2" | wc -l)" ] || { fail "$4: $n figures against $(figures "$2" | wc -l)"; return; }
  paste <(figures "$1") <(figures "$2") | awk -v tol="$3" '{d = $1 - $2; if (d < 0) d = -d;
    m = $1 < 0 ? -$1 : $1; if (d > tol * (m > 1 ? m : 1)) { print $1 " " $2; bad = 1 } } END { exit bad }' \
    > far.txt && pass || fail "$4: figures differ by more than $3: $(head -3 far.txt)"
}
# LeNet: the host, then the GPU in each spelling
mkdir -p host gpu1 gpu2 gpu3
for d in host gpu1 gpu2 gpu3; do mk lenet lenet_solver.prototxt lenet 50 > $d/solver.prototxt; done
echo "solver_mode: GPU" >> gpu1/solver.prototxt
(cd host && "$KILN" train --solver solver.prototxt --metrics ../host.jsonl > ../host.log 2>&1) || fail "host: $(tail -3 host.log)"
(cd gpu1 && "$KILN" train --solver solver.prototxt --metrics ../gpu1.jsonl > ../gpu1.log 2>&1) \
  && grep -q "solver_mode: GPU: training on cuda:0" gpu1.log && pass || fail "solver_mode: GPU: $(tail -3 gpu1.log)"
(cd gpu2 && "$KILN" train -solver solver.prototxt -gpu 0 --metrics ../gpu2.jsonl > ../gpu2.log 2>&1) \
  && grep -q -- "-gpu 0: training on cuda:0" gpu2.log && pass || fail "-gpu 0: $(tail -3 gpu2.log)"
(cd gpu3 && "$KILN" train --solver solver.prototxt --device cuda:0 --metrics ../gpu3.jsonl > ../gpu3.log 2>&1) \
  && grep -q "^memory on cuda:0: " gpu3.log && pass || fail "--device cuda:0: $(tail -3 gpu3.log)"
close host.jsonl gpu1.jsonl 1e-3 "LeNet on the GPU against the host"
cmp -s gpu1/lenet_iter_50.caffemodel gpu2/lenet_iter_50.caffemodel && cmp -s gpu1/lenet_iter_50.caffemodel gpu3/lenet_iter_50.caffemodel \
  && pass || fail "the three spellings of the GPU run end on different weights (the GPU run is not deterministic?)"
grep -q '"event":"done".*"peak_device_mb":[1-9]' gpu1.jsonl && pass || fail "no peak_device_mb: $(grep done gpu1.jsonl)"
# across devices
mk lenet lenet_solver.prototxt "$WORK/h_from_g" 50 > h_from_g.prototxt
"$KILN" train --solver h_from_g.prototxt --snapshot gpu1/lenet_iter_25.solverstate > hfg.log 2>&1 || fail "host resume: $(tail -3 hfg.log)"
"$KILN" compare-weights host/lenet_iter_50.caffemodel h_from_g_iter_50.caffemodel --rtol 1e-3 --atol 1e-5 > cw1.txt 2>&1 \
  && pass || fail "GPU snapshot resumed on the host: $(head -3 cw1.txt)"
mk lenet lenet_solver.prototxt "$WORK/g_from_h" 50 > g_from_h.prototxt
"$KILN" train --solver g_from_h.prototxt --device cuda:0 --snapshot host/lenet_iter_25.solverstate > gfh.log 2>&1 || fail "GPU resume: $(tail -3 gfh.log)"
"$KILN" compare-weights host/lenet_iter_50.caffemodel g_from_h_iter_50.caffemodel --rtol 1e-3 --atol 1e-5 > cw2.txt 2>&1 \
  && pass || fail "host snapshot resumed on the GPU: $(head -3 cw2.txt)"
# resnet20: 50 iterations on both
mkdir -p rh rg
mk resnet20 resnet20_solver.prototxt r 50 > rh/solver.prototxt
cp rh/solver.prototxt rg/solver.prototxt
(cd rh && "$KILN" train --solver solver.prototxt --metrics ../rh.jsonl > ../rh.log 2>&1) || fail "resnet20 host: $(tail -3 rh.log)"
(cd rg && "$KILN" train --solver solver.prototxt --device cuda:0 --metrics ../rg.jsonl > ../rg.log 2>&1) || fail "resnet20 GPU: $(tail -3 rg.log)"
close rh.jsonl rg.jsonl 2e-2 "resnet20 on the GPU against the host"
# the zoo builds and runs on the GPU
for net in models/lenet/lenet_deploy models/alexnet/deploy models/zfnet/deploy models/googlenet/deploy \
    models/resnet50/deploy models/vgg16/deploy models/char_lm/char_lm_deploy \
    models/transformer_lm/transformer_lm_deploy models/seq2seq_g2p/seq2seq_g2p_deploy bench/nets/resnet20 \
    bench/nets/densenet40 bench/nets/lstm; do
  "$KILN" time --model "$SRC/$net.prototxt" --iterations 2 --device cuda:0 > t.log 2>&1 \
    && grep -q "^peak device memory: " t.log && pass || fail "kiln time $net on the GPU: $(tail -2 t.log)"
done
# two workers sharing the GPU, through the host copies of MPI's path
if command -v mpirun >/dev/null 2>&1 && [ "${KILN_HAVE_MPI:-1}" != 0 ]; then
  mkdir -p m2 m1
  mk lenet lenet_solver.prototxt w 20 | sed -e "s/^test_interval: .*/test_interval: 1000/" > m2/solver.prototxt
  sed 's/^base_lr/iter_size: 2\nbase_lr/' m2/solver.prototxt > m1/solver.prototxt
  (cd m2 && timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=2 "$KILN" train \
    --solver solver.prototxt --device cuda --deterministic > ../m2.log 2>&1) || fail "2 workers on one GPU: $(tail -3 m2.log)"
  (cd m1 && "$KILN" train --solver solver.prototxt --device cuda:0 > ../m1.log 2>&1) || fail "iter_size 2 on the GPU: $(tail -3 m1.log)"
  "$KILN" compare-weights m1/w_iter_20.caffemodel m2/w_iter_20.caffemodel > cw3.txt 2>&1 && pass \
    || fail "2 workers on one GPU are not iter_size 2: $(head -3 cw3.txt)"
else
  echo "(no mpirun: the 2-worker run on one GPU is left out)"
fi
# LeNet at the zoo's budget (10,000 iterations) on the GPU
mkdir -p full
sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" -e "s#^snapshot_prefix: .*#snapshot_prefix: \"full/lenet\"#" \
  -e "s/^solver_mode: .*/solver_mode: GPU/" "$SRC/models/lenet/lenet_solver.prototxt" > full.prototxt
"$KILN" train --solver full.prototxt --metrics full.jsonl > full.log 2>&1 || fail "LeNet on the GPU: $(tail -3 full.log)"
acc=$(grep '"event":"test"' full.jsonl | tail -1 | grep -oE '"accuracy":[0-9.e-]+' | cut -d: -f2)
echo "LeNet on the GPU, 10000 iterations: test accuracy $acc; $(grep '^done' full.log)"
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.89) }' && pass || fail "LeNet on the GPU: accuracy ${acc:-none} below 0.89"
finish
