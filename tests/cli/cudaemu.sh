# The CUDA backend's kernels, emulated on hostsim (KILN_DEVICE=hostsim KILN_ENGINE=cuda;
# src/cuda/kcuda.h), under whole training runs: LeNet trains 20 iterations there with the same
# losses and test figures as on the host, to 1e-3 (the GEMMs and convolutions are other kernels,
# and the GPU's long sums, a convolution's bias gradient over 36,864 terms, are each one thread's
# in fp32 where the host's reference sums in double: the runs drift apart by 1e-5 a step, 1.6e-4
# in the loss after 20 on an Intel host, where the host's two engines stay within 1e-7; a wrong
# kernel moves them by whole per cent, and test_backend_ops and the _cudaemu layer tests check
# each kernel closely), a snapshot taken there resumes on the host and one of the host's
# resumes there, each to the uninterrupted run's weights; and the zoo's nets of every kind build
# on that backend (test_backend_ops checks that every layer type has its CUDA kernels). The
# emulation runs each kernel's threads one by one, so the runs are short. On a GPU the same runs
# are tests/cli/gpu.sh's, at length.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }
emu() { KILN_DEVICE=hostsim KILN_ENGINE=cuda "$@"; }
mk() {  # mk PREFIX: LeNet's solver, 20 iterations, tests every 10, a snapshot at 10 and 20
  sed -e "s#^net: .*#net: \"$SRC/models/lenet/lenet_train_test.prototxt\"#" \
      -e "s#^max_iter: .*#max_iter: 20#" -e "s#^snapshot: .*#snapshot: 10#" \
      -e "s#^snapshot_prefix: .*#snapshot_prefix: \"$1\"#" -e "s#^test_interval: .*#test_interval: 10#" \
      -e "s#^test_iter: .*#test_iter: 2#" -e "s#^display: .*#display: 2#" \
      "$SRC/models/lenet/lenet_solver.prototxt"
}
mkdir -p host emu
mk lenet > host/solver.prototxt
mk lenet > emu/solver.prototxt
(cd host && "$KILN" train --solver solver.prototxt --metrics ../host.jsonl --threads 2 > ../host.log 2>&1) \
  || fail "host run: $(tail -3 host.log)"
(cd emu && emu "$KILN" train --solver solver.prototxt --metrics ../emu.jsonl --threads 2 > ../emu.log 2>&1) \
  && pass || fail "cudaemu run: $(tail -3 emu.log)"
# every loss and accuracy of the two runs' events, side by side, within 1e-3 (relative)
figures() { grep -E '"event":"(train|test)"' "$1" | grep -oE '"(loss|accuracy)":[-0-9.e]+' | cut -d: -f2; }
n=$(figures host.jsonl | wc -l)
[ "$n" -ge 12 ] && [ "$n" = "$(figures emu.jsonl | wc -l)" ] && pass || fail "figures: $n on the host, $(figures emu.jsonl | wc -l) on cudaemu"
paste <(figures host.jsonl) <(figures emu.jsonl) | awk '{d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
  if (d > 1e-3 * (m > 1 ? m : 1)) { print "host " $1 " cudaemu " $2; bad = 1 } } END { exit bad }' > far.txt \
  && pass || fail "losses or accuracies differ by more than 1e-3: $(head -3 far.txt)"
"$KILN" compare-weights host/lenet_iter_20.caffemodel emu/lenet_iter_20.caffemodel --rtol 1e-2 --atol 1e-3 \
  > cw.txt 2>&1 && pass || fail "weights after 20 iterations: $(head -3 cw.txt)"
cmp -s host/lenet_iter_10.caffemodel host/lenet_iter_20.caffemodel && fail "the weights did not move" || pass
# across devices: the emulated GPU's snapshot on the host, the host's on the emulated GPU
mk "$WORK/h_from_e" > h_from_e.prototxt
"$KILN" train --solver h_from_e.prototxt --snapshot emu/lenet_iter_10.solverstate --threads 2 > hfe.log 2>&1 \
  || fail "host resume of a cudaemu snapshot: $(tail -3 hfe.log)"
"$KILN" compare-weights host/lenet_iter_20.caffemodel h_from_e_iter_20.caffemodel --rtol 1e-2 --atol 1e-3 \
  > cw2.txt 2>&1 && pass || fail "cudaemu snapshot resumed on the host ends elsewhere: $(head -3 cw2.txt)"
mk "$WORK/e_from_h" > e_from_h.prototxt
emu "$KILN" train --solver e_from_h.prototxt --snapshot host/lenet_iter_10.solverstate --threads 2 > efh.log 2>&1 \
  || fail "cudaemu resume of a host snapshot: $(tail -3 efh.log)"
"$KILN" compare-weights host/lenet_iter_20.caffemodel e_from_h_iter_20.caffemodel --rtol 1e-2 --atol 1e-3 \
  > cw3.txt 2>&1 && pass || fail "host snapshot resumed on cudaemu ends elsewhere: $(head -3 cw3.txt)"
# kiln test there, against the host
test_out() { "$KILN" test --model "$SRC/models/lenet/lenet_train_test.prototxt" \
  --weights host/lenet_iter_20.caffemodel --iterations 3 2>/dev/null | grep -v "^kiln info"; }
a=$(test_out) b=$(emu test_out)
[ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "kiln test: host '$a', cudaemu '$b'"
# the zoo builds there: the nets whose data is in the cache, and the deploy nets of the rest
# (the convolutions, BatchNorm, concatenation, LRN and inception, the recurrent and attention
# layers: the big ImageNet nets are the same layers larger)
for net in models/cifar10_quick/cifar10_quick_train_test models/resnet20/resnet20_train_test \
    models/densenet/densenet40_train_test models/googlenet/deploy models/char_lm/char_lm_deploy \
    models/transformer_lm/transformer_lm_deploy models/seq2seq_g2p/seq2seq_g2p_deploy; do
  emu "$KILN" describe --model "$SRC/$net.prototxt" > d.log 2>&1 && pass || fail "describe $net on cudaemu: $(tail -2 d.log)"
done
for net in models/lenet/lenet_deploy; do
  emu "$KILN" time --model "$SRC/$net.prototxt" --iterations 1 > t.log 2>&1 \
    && pass || fail "kiln time $net on cudaemu: $(tail -2 t.log)"
done
finish
