# Shared by the MPI shell tests (sourced after lib.bash, in $WORK; not a test itself):
#   - exits 77 (a CTest skip) when there is no MPI to test (mpirun missing, or kiln built without MPI);
#   - FORWARD: the sanitizer build's settings (tests/CMakeLists.txt), as `-x` options for mpirun,
#     so that every rank gets them;
#   - one OpenMP thread per worker (a small machine runs several ranks), and `mpi NP ARGS...`;
#   - mpi_tiny_lmdb, mpi_tiny_net: tiny.bash's tiny_lmdb and tiny_net (a tiny LMDB, a small conv net);
#   - mpi_wide_net: an MLP on it whose 607,854 parameters span several gradient buckets;
#   - mpi_same A B WHAT: the weight files A and B both there and bit-identical;
#   - mpi_zoo_solver MODEL NAME ITER_SIZE MAX_ITER [EXTRA]: a zoo model's solver, short and
#     without tests, snapshots under $WORK/NAME;
#   - mpi_await_rank ROOT R LOG [VAR]: once the job under ROOT has rank R running (VAR in its
#     environment: OMPI_COMM_WORLD_RANK, or PMI_RANK for MPICH) and LOG shows a training line,
#     the rank's pid; nothing if the job ended or 60 s passed first.
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (scripts/install-deps installs openmpi-bin libopenmpi-dev)"
  exit 77
fi
if [ "${KILN_HAVE_MPI:-1}" = 0 ]; then
  echo "SKIP: kiln was built without MPI (libopenmpi-dev missing when CMake ran?)"
  exit 77
fi
FORWARD=()
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS OMPI_MCA_mca_base_component_disable_dlclose; do
  [ -n "${!v:-}" ] && FORWARD+=(-x "$v")
done
export OMP_NUM_THREADS=1
# mpi NP ARGS...: mpirun as root (CI), with more ranks than cores allowed and no core binding
# (so that they share the cores), one OpenMP thread and the sanitizer settings on every rank;
# killed after 60 s, so that a hang fails the test instead of blocking CI.
mpi() {
  local np=$1
  shift
  timeout -k 5 60 mpirun -np "$np" --oversubscribe --allow-run-as-root --bind-to none \
    -x OMP_NUM_THREADS=1 "${FORWARD[@]}" "$@"
}

mpi_same() {
  if [ ! -f "$1" ] || [ ! -f "$2" ]; then fail "$3: missing $1 or $2"; return; fi
  cmp -s "$1" "$2" && pass || fail "$3: $1 and $2 differ: $("$KILN" compare-weights "$1" "$2" | head -n 2)"
}

# The zoo's MODEL_solver.prototxt on MODEL_train_test.prototxt (MODEL: a folder of models/ named
# like its net, or FOLDER/NET), with max_iter MAX_ITER, no test passes, no snapshots but the
# last, a display every iteration, iter_size ITER_SIZE and EXTRA.
mpi_zoo_solver() {
  local zoo="$SRC/models/${1%/*}" net=${1#*/}
  sed -e "s|^net: .*|net: \"$zoo/${net}_train_test.prototxt\"|" -e '/^test_/d' \
      -e "s|^max_iter: .*|max_iter: $4|" -e '/^snapshot: /d' -e '/^display: /d' \
      -e "s|^snapshot_prefix: .*|snapshot_prefix: \"$WORK/$2\"|" "$zoo/${net}_solver.prototxt"
  printf 'iter_size: %s\ndisplay: 1\n%s' "$3" "${5:-}"
}

source "$(dirname "${BASH_SOURCE[0]}")/tiny.bash"
mpi_tiny_lmdb() { tiny_lmdb; }
mpi_tiny_net() { tiny_net "$@"; }

mpi_wide_net() {
  cat <<NET
name: "wide"
layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "$WORK/tiny_lmdb" batch_size: 4 backend: LMDB }
  transform_param { scale: 0.00390625 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 4500 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 70 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip3" bottom: "label" top: "loss" }
NET
}

mpi_descendants() {  # every process under PID
  local k
  for k in $(pgrep -P "$1"); do
    echo "$k"
    mpi_descendants "$k"
  done
}
mpi_rank_pid() {  # mpi_rank_pid ROOT R VAR: the process under ROOT with VAR=R in its environment
  local p
  for p in $(mpi_descendants "$1"); do
    tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" | grep -qx "$3=$2" && { echo "$p"; return 0; }
  done
  return 1
}
mpi_await_rank() {
  local root=$1 rank=$2 log=$3 var=${4:-OMPI_COMM_WORLD_RANK} pid="" i
  # A loaded machine can take a while to start the ranks: up to 60 s.
  for i in $(seq 1 300); do
    [ -z "$pid" ] && pid=$(mpi_rank_pid "$root" "$rank" "$var")
    if [ -n "$pid" ] && grep -q '^iter [0-9]* *loss' "$log"; then
      echo "$pid"
      return 0
    fi
    kill -0 "$root" 2>/dev/null || break
    sleep 0.2
  done
  return 1
}
