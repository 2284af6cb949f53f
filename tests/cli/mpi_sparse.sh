# Sparse data under data-parallel training: the zoo's spam_bow_mlp (LibSVMData into a sparse
# InnerProduct, ReLU, InnerProduct) on small generated libsvm files put in a cache of their own
# under the names the net reads. 2 workers in deterministic GRADIENT mode, each taking every
# other batch, end bit-identical to 1 worker with iter_size 2, and a 2-worker run resumed from
# its half-way snapshot ends as the uninterrupted one. Skips (77) where mpi.bash says there is no
# MPI to test.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

export KILN_DATA="$WORK/cache"
mkdir -p cache/spam-bow
# rows of 2 classes over the net's 20,000 features: class 1 holds one of 1-100, class 0 one of
# 19901-20000, both 20 more in increasing order between them
rows() {
  awk -v n="$1" -v seed="$2" 'BEGIN {
    srand(seed)
    for (r = 0; r < n; r++) {
      y = r % 2
      line = y (y ? " " 1 + int(rand() * 100) ":0.218" : "")
      c = 100
      for (k = 0; k < 20; k++) {
        c += 1 + int(rand() * 900)
        line = line " " c ":0.218"
      }
      print line (y ? "" : " " 19901 + int(rand() * 100) ":0.218")
    }
  }'
}
rows 512 1 > cache/spam-bow/train.svm
echo "test" > cache/spam-bow/READY

solver() { mpi_zoo_solver spam_bow/spam_bow_mlp "$@"; }  # solver NAME ITER_SIZE MAX_ITER [EXTRA]

solver ref 2 6 > ref.prototxt
solver w2 1 6 'snapshot: 3
' > w2.prototxt
solver w2r 1 6 > w2r.prototxt
"$KILN" train --solver ref.prototxt > ref.log 2>&1 || fail "1 worker, iter_size 2: $(tail -n 3 ref.log)"
mpi 2 "$KILN" train --solver w2.prototxt --deterministic > w2.log 2>&1 \
  || fail "2 workers: $(tail -n 5 w2.log)"
mpi_same ref_iter_6.caffemodel w2_iter_6.caffemodel "spam_bow_mlp: 2 workers --deterministic vs iter_size 2"
mpi 2 "$KILN" train --solver w2r.prototxt --deterministic --snapshot w2_iter_3.solverstate \
  > w2r.log 2>&1 || fail "2 workers resumed: $(tail -n 5 w2r.log)"
mpi_same w2_iter_6.caffemodel w2r_iter_6.caffemodel "spam_bow_mlp: 2 workers resumed at 3"
cmp -s w2_iter_3.caffemodel w2_iter_6.caffemodel && fail "weights did not change" || pass
finish
