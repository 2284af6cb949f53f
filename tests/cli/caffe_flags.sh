# Caffe's command-line spelling (gflags): -solver F, --solver=F, -solver=F and -model/-weights/
# -iterations/-snapshot work as kiln's --solver F, -gpu is accepted (where kiln has no GPU, with
# one warning, and the run is on the CPU; a negative device is refused), and -weights takes
# Caffe's comma-separated list. Each run is compared with the same run in kiln's own spelling. A
# solver file's solver_mode: GPU gets the same warning once, naming the file and the field, unless
# -gpu replaces it. On a machine with a GPU these runs are tests/cli/gpu.sh's.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/tiny.bash"
if [ "$("$KILN" devices 2>/dev/null | grep -c "^cuda:")" != 0 ]; then
  echo "skipped: this machine has a GPU (tests/cli/gpu.sh)"; exit 77
fi
tiny_lmdb
tiny_net 4 > net.prototxt
printf 'net: "%s/net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 6\ndisplay: 0\nrandom_seed: 3\nsnapshot: 3\nsnapshot_prefix: "%s/%%s"\n' "$WORK" "$WORK" > s.tmpl
for who in kiln caffe1 caffe2 caffe3; do sed "s/%s/$who/" s.tmpl > "$who.prototxt"; done

"$KILN" train --solver kiln.prototxt > kiln.log 2>&1 || fail "kiln spelling: $(tail -n 3 kiln.log)"
"$KILN" train -solver caffe1.prototxt -gpu 0 > caffe1.log 2>&1 || fail "-solver F -gpu 0: $(tail -n 3 caffe1.log)"
"$KILN" train --solver=caffe2.prototxt --gpu=all > caffe2.log 2>&1 || fail "--solver=F: $(tail -n 3 caffe2.log)"
"$KILN" train -solver=caffe3.prototxt > caffe3.log 2>&1 || fail "-solver=F: $(tail -n 3 caffe3.log)"
for who in caffe1 caffe2 caffe3; do
  cmp -s kiln_iter_6.caffemodel "${who}_iter_6.caffemodel" && pass || fail "$who: weights differ from kiln's spelling"
done
grep -q "^kiln warning: -gpu 0: no GPU (.*); training on the CPU$" caffe1.log && pass \
  || fail "no -gpu warning: $(head -n 3 caffe1.log)"
grep -q "warning: -gpu all: no GPU (" caffe2.log && pass || fail "no --gpu=all warning"
[ "$(grep -c "no GPU (" caffe1.log)" = 1 ] && pass || fail "-gpu: not one warning: $(grep GPU caffe1.log)"
# a device that cannot exist, or no device at all: refused before anything runs
expect_error "-gpu -1" "-gpu -1: no such device" -- "$KILN" train -solver kiln.prototxt -gpu -1
expect_error "-gpu=0,-2" "-gpu 0,-2: no such device" -- "$KILN" train -solver kiln.prototxt -gpu=0,-2
expect_error "-gpu x" "-gpu x: not a device" -- "$KILN" train -solver kiln.prototxt -gpu x
# the solver file's solver_mode: GPU (Caffe's own way to ask for a GPU), once; device_id: -1 is
# refused naming the field, unless -gpu replaces the file's device as in Caffe
sed 's/%s/gpu/' s.tmpl > gpu.prototxt
printf 'solver_mode: GPU\ndevice_id: 1\n' >> gpu.prototxt
"$KILN" train -solver gpu.prototxt > gpu.log 2>&1 || fail "solver_mode: GPU: $(tail -n 3 gpu.log)"
cmp -s kiln_iter_6.caffemodel gpu_iter_6.caffemodel && pass || fail "solver_mode: GPU: weights differ"
grep -q "^kiln warning: gpu.prototxt: solver_mode: GPU (device_id: 1): no GPU (.*); training on the CPU$" gpu.log \
  && pass || fail "no solver_mode warning: $(grep -i gpu gpu.log)"
[ "$(grep -c "no GPU (" gpu.log)" = 1 ] && pass || fail "solver_mode: not one warning: $(grep GPU gpu.log)"
sed 's/device_id: 1/device_id: -1/' gpu.prototxt > gpuneg.prototxt
expect_error "device_id: -1" "gpuneg.prototxt: solver_mode: GPU with device_id: -1: no such device" -- \
  "$KILN" train -solver gpuneg.prototxt
"$KILN" train -solver gpuneg.prototxt -gpu 0 > gpuneg.log 2>&1 && pass || fail "-gpu over device_id: -1: $(tail -n 3 gpuneg.log)"
[ "$(grep -c "no GPU (" gpuneg.log)" = 1 ] && grep -q "warning: -gpu 0:" gpuneg.log && pass \
  || fail "-gpu over solver_mode: GPU: $(grep GPU gpuneg.log)"

# resume with -snapshot=, test with -model -weights -iterations, time with -model= -iterations=
"$KILN" train -solver caffe3.prototxt -snapshot=caffe3_iter_3.solverstate > resume.log 2>&1 \
  && cmp -s kiln_iter_6.caffemodel caffe3_iter_6.caffemodel && pass || fail "-snapshot=: $(tail -n 3 resume.log)"
"$KILN" test --model net.prototxt --weights kiln_iter_6.caffemodel --iterations 2 > t_kiln.txt 2>&1
"$KILN" test -model net.prototxt -weights kiln_iter_6.caffemodel -iterations 2 > t_caffe.txt 2>&1 \
  && diff -q <(grep -v "^kiln info" t_kiln.txt) <(grep -v "^kiln info" t_caffe.txt) >/dev/null && pass \
  || fail "test in Caffe's spelling: $(diff t_kiln.txt t_caffe.txt | head -n 5)"
"$KILN" time -model=net.prototxt -iterations=2 > time.txt 2>&1 && pass || fail "time: $(tail -n 3 time.txt)"
"$KILN" time -model=net.prototxt -iterations=1 -gpu 0 > timegpu.txt 2>&1 \
  && grep -q "^kiln warning: -gpu 0: no GPU (.*); running on the CPU$" timegpu.txt && pass \
  || fail "time -gpu 0: $(grep -i gpu timegpu.txt)"

# -weights A,B: both loaded, in order (the last file's copy of a layer wins)
printf 'net: "%s/net.prototxt"\nbase_lr: 0\nlr_policy: "fixed"\nmax_iter: 1\ndisplay: 0\nsnapshot_after_train: true\nsnapshot_prefix: "%s/ft"\n' "$WORK" "$WORK" > ft.prototxt
"$KILN" train -solver ft.prototxt -weights caffe1_iter_3.caffemodel,kiln_iter_6.caffemodel > ft.log 2>&1 \
  && cmp -s ft_iter_1.caffemodel kiln_iter_6.caffemodel && pass || fail "-weights A,B: $(tail -n 3 ft.log)"
expect_error "-weights with a missing file in the list" "nothere.caffemodel" -- \
  "$KILN" train -solver ft.prototxt -weights kiln_iter_6.caffemodel,nothere.caffemodel
# a value that looks like a flag but is not one of kiln's passes unchanged
expect_error "unknown Caffe flag" "unknown option '-sigterm_effect'" -- "$KILN" train -solver ft.prototxt -sigterm_effect stop
finish
