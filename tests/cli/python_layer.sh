# Python layers (type: "Python") in the kiln command, which starts an interpreter for them:
# a NumPy Euclidean loss trains to the built-in EuclideanLoss's weights bit for bit; a run with
# a Python loss resumes exactly from its snapshot; on 2 workers (mpirun, --deterministic) LeNet
# with a NumPy softmax loss ends where 1 worker with iter_size 2 does, bit for bit; a layer that
# raises stops training naming the layer with Python's traceback; a module not on PYTHONPATH is
# named. Skips (exit 77) when kiln was built without Python.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
cat > probe.prototxt <<'NET'
name: "probe"
input: "a" input_shape { dim: 1 }
layer { name: "p" type: "Python" bottom: "a" top: "b" python_param { module: "m" layer: "L" } }
NET
if "$KILN" describe --model probe.prototxt 2>&1 | grep -q "where kiln has Python"; then
  echo "skipped: kiln was built without Python (python3-dev, python3-numpy)"
  exit 77
fi
export PYTHONPATH="$SRC/examples/python"

net() { # net LOSS_LAYER
  cat <<NET
name: "reg"
layer { name: "x" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 8 dim: 5 } shape { dim: 8 dim: 3 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
$1
NET
}
net 'layer { name: "loss" type: "Python" bottom: "ip" bottom: "y" top: "loss"
  python_param { module: "pylayers" layer: "EuclideanLossLayer" } loss_weight: 1 }' > py.prototxt
net 'layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "y" top: "loss" }' > c.prototxt
solver() { # solver NET PREFIX [EXTRA]
  printf 'net: "%s"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "step"\nstepsize: 7\ngamma: 0.5\nmax_iter: 20\nsnapshot: 10\nsnapshot_prefix: "%s"\nrandom_seed: 9\ndisplay: 5\n%s' "$WORK/$1" "$WORK/$2" "${3:-}"
}
solver py.prototxt py > py_solver.prototxt
solver c.prototxt c > c_solver.prototxt

# ---- a Python loss against the built-in one ---------------------------------------------------
"$KILN" train --solver py_solver.prototxt > py.log 2>&1 || fail "python loss: $(tail -n 5 py.log)"
"$KILN" train --solver c_solver.prototxt > c.log 2>&1 || fail "built-in loss: $(tail -n 3 c.log)"
has_sanitizer_report "$(cat py.log)" && fail "sanitizer: $(grep -m 3 -A 5 Sanitizer py.log)"
"$KILN" compare-weights py_iter_20.caffemodel c_iter_20.caffemodel > cmp.txt \
  && pass || fail "Python Euclidean against EuclideanLoss: $(cat cmp.txt)"
grep -q "iter 10  loss" py.log && pass || fail "no display: $(cat py.log)"

# ---- exact resume of a run with a Python layer --------------------------------------------------
solver py.prototxt pr > pr_solver.prototxt
"$KILN" train --solver pr_solver.prototxt --snapshot py_iter_10.solverstate > pr.log 2>&1 \
  || fail "resume: $(tail -n 5 pr.log)"
cmp -s pr_iter_20.caffemodel py_iter_20.caffemodel && pass \
  || fail "resumed run: $("$KILN" compare-weights pr_iter_20.caffemodel py_iter_20.caffemodel)"

# ---- a layer that raises, a module Python cannot find ---------------------------------------------
cat > boom.py <<'PY'
import kiln

class Boom(kiln.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)

    def forward(self, bottom, top):
        self.deeper()

    def deeper(self):
        raise ZeroDivisionError("boom at " + self.param_str)
PY
net 'layer { name: "explode" type: "Python" bottom: "ip" top: "e"
  python_param { module: "boom" layer: "Boom" param_str: "step 0" } }
layer { name: "loss" type: "EuclideanLoss" bottom: "e" bottom: "y" top: "loss" }' > boom.prototxt
solver boom.prototxt boom > boom_solver.prototxt
err=$(PYTHONPATH="$WORK" "$KILN" train --solver boom_solver.prototxt 2>&1); rc=$?
[ $rc = 1 ] && pass || fail "raising layer: exit $rc: $err"
has_sanitizer_report "$err" && fail "sanitizer: $err"
for want in "kiln: train: layer 'explode' (Python boom.Boom): forward raised:" \
    "Traceback (most recent call last):" "in deeper" "ZeroDivisionError: boom at step 0"; do
  grep -qF "$want" <<< "$err" && pass || fail "raising layer: no '$want' in: $err"
done
[ ! -e boom_iter_20.caffemodel ] && pass || fail "a snapshot after the failure"
expect_error "module not on PYTHONPATH" "No module named 'boom'" -- \
  env PYTHONPATH= "$KILN" train --solver boom_solver.prototxt

# ---- 2 workers with a Python loss -------------------------------------------------------------------
if [ "${KILN_HAVE_MPI:-0}" = 1 ] && command -v mpirun > /dev/null; then
  source "$SRC/tests/cli/mpi.bash"
  export KILN_DATA=${KILN_DATA:-}
  if "$KILN" data list 2>/dev/null | grep -q "^fashion-mnist  *yes"; then
    sed 's/type: "SoftmaxWithLoss"/type: "Python" python_param { module: "pylayers" layer: "SoftmaxLossLayer" } loss_weight: 1/' \
      "$SRC/models/lenet/lenet_train_test.prototxt" > lenet_py.prototxt
    grep -q SoftmaxLossLayer lenet_py.prototxt && pass || fail "lenet_py.prototxt"
    mpi_zoo_solver lenet w2 1 3 | sed "s|^net: .*|net: \"$WORK/lenet_py.prototxt\"|" > w2.prototxt
    mpi_zoo_solver lenet one 2 3 | sed "s|^net: .*|net: \"$WORK/lenet_py.prototxt\"|" > one.prototxt
    mpi 2 -x PYTHONPATH "$KILN" train --deterministic --solver w2.prototxt > w2.log 2>&1 \
      || fail "2 workers: $(tail -n 5 w2.log)"
    "$KILN" train --solver one.prototxt > one.log 2>&1 || fail "1 worker: $(tail -n 3 one.log)"
    mpi_same w2_iter_3.caffemodel one_iter_3.caffemodel "2 workers with a Python loss against iter_size 2"
  else
    echo "no Fashion-MNIST in the cache: the 2-worker case is not run"
  fi
else
  echo "no MPI: the 2-worker case is not run"
fi
finish
