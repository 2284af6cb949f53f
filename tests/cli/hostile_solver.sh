# Hostile solver files and kiln train options: fields out of range, not finite or misspelt, nets
# that cannot be found, snapshots and metrics that cannot be written. Each case wants a clean
# error (exit 1 or 2) naming the file and the line or field, no sanitizer report, and nothing
# left under the final name of a file the command was to write.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
cd "$WORK"

tiny_lmdb tiny_lmdb || fail "convert the tiny LMDB"
tiny_net tiny_lmdb > net.prototxt
# solver FILE LINE...: a solver that trains net.prototxt (lines 1-4), then LINE... from line 5.
solver() {
  local f=$1
  shift
  { printf 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\n'; printf '%s\n' "$@"; } > "$f"
}
T=("$KILN" train --solver)
solver ok.prototxt 'snapshot_after_train: false'
need "the solver that trains" -- "${T[@]}" ok.prototxt

# ---- fields -----------------------------------------------------------------------------------
solver typo.prototxt 'base_rl: 0.1'
expect_refusal "a misspelt field" --want "typo.prototxt:5:1:" --want "did you mean 'base_lr'" -- "${T[@]}" typo.prototxt

printf 'net: "net.prototxt"\nbase_lr: 0.01\nmax_iter: 2\n' > nopolicy.prototxt
expect_refusal "no lr_policy" --want "nopolicy.prototxt" --want "lr_policy is required" -- "${T[@]}" nopolicy.prototxt

printf 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "cosine"\n' > policy.prototxt
expect_refusal "an unknown lr_policy" --want "policy.prototxt" --want "unknown lr_policy 'cosine'" -- "${T[@]}" policy.prototxt

printf 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "step"\nmax_iter: 2\n' > step.prototxt
expect_refusal "step without stepsize" --want "step.prototxt" --want "stepsize" -- "${T[@]}" step.prototxt

printf 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "multistep"\nstepvalue: 5\nstepvalue: 3\n' > steps.prototxt
expect_refusal "stepvalue decreasing" --want "steps.prototxt" --want "stepvalue must increase" -- "${T[@]}" steps.prototxt

for spec in "base_lr: nan|base_lr is nan" "base_lr: -0.1|base_lr is -0.1" "momentum: 1|momentum is 1" \
            "weight_decay: -1|weight_decay is -1" "clip_gradients: inf|clip_gradients is inf" \
            "max_iter: -1|max_iter is -1" "display: -5|display is -5" "snapshot: -1|snapshot is -1" \
            "iter_size: 0|iter_size must be >= 1" "average_loss: 0|average_loss must be >= 1" \
            "divergence_factor: 0.5|divergence_factor is 0.5" "divergence_iters: 0|divergence_iters is 0" \
            "regularization_type: \"L3\"|regularization_type 'L3'"; do
  field=${spec%%|*}
  solver bad.prototxt "$field"
  expect_refusal "$field" --want "bad.prototxt" --want "${spec#*|}" -- "${T[@]}" bad.prototxt
done

solver delta.prototxt 'type: "Adam"' 'delta: 0'
expect_refusal "Adam with delta 0" --want "delta.prototxt" --want "delta is 0" -- "${T[@]}" delta.prototxt

solver solvertype.prototxt 'solver_type: ADAMM'
expect_refusal "an unknown solver_type" --want "solvertype.prototxt:5:" --want "solver_type" -- "${T[@]}" solvertype.prototxt

solver testiter.prototxt 'test_iter: 0' 'test_interval: 1'
expect_refusal "test_iter 0" --want "testiter.prototxt" --want "test_iter 0" -- "${T[@]}" testiter.prototxt

solver testiters.prototxt 'test_iter: 1' 'test_iter: 1' 'test_interval: 1' 'test_net: "net.prototxt"'
expect_refusal "two test_iter for one test net" --want "testiters.prototxt" --want "test_iter values for 1 test nets" -- "${T[@]}" testiters.prototxt

solver sync.prototxt 'sync { mode: MODEL interval_iters: 0 }'
expect_refusal "model sync every 0 iterations" --want "sync.prototxt" --want "interval_iters" -- "${T[@]}" sync.prototxt

solver synct.prototxt 'sync { mode: TIME interval_seconds: nan }'
expect_refusal "time sync every NaN seconds" --want "synct.prototxt" --want "interval_seconds" -- "${T[@]}" synct.prototxt

: > empty.prototxt
expect_refusal "an empty solver" --want "empty.prototxt" --want "lr_policy" -- "${T[@]}" empty.prototxt

# ---- the nets it names ------------------------------------------------------------------------
solver two.prototxt 'net_param { name: "x" }'
expect_refusal "net and net_param" --want "two.prototxt" --want "exactly one of net" -- "${T[@]}" two.prototxt

printf 'base_lr: 0.01\nlr_policy: "fixed"\n' > nonet.prototxt
expect_refusal "no net at all" --want "nonet.prototxt" --want "(0 given)" -- "${T[@]}" nonet.prototxt

printf 'net: "gone.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\n' > gone.prototxt.solver
expect_refusal "a missing net" --want "gone.prototxt: cannot open" -- "${T[@]}" gone.prototxt.solver

mkdir netdir
printf 'net: "netdir"\nbase_lr: 0.01\nlr_policy: "fixed"\n' > netdir.prototxt
expect_refusal "a folder as the net" --want "netdir: not a regular file" -- "${T[@]}" netdir.prototxt

printf 'train_net: "net.prototxt"\ntest_net: "nothere.prototxt"\ntest_iter: 1\nbase_lr: 0.01\nlr_policy: "fixed"\n' > testnet.prototxt
expect_refusal "a missing test net" --want "nothere.prototxt: cannot open" -- "${T[@]}" testnet.prototxt

printf 'net_param {\n  name: "x"\n  layer { nme: "a" }\n}\nbase_lr: 0.01\nlr_policy: "fixed"\n' > inline.prototxt
expect_refusal "a typo in an inline net" --want "inline.prototxt:3:11:" --want "did you mean 'name'" -- "${T[@]}" inline.prototxt

printf 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\nnet_param {\n' > cut.prototxt
expect_refusal "a solver cut short" --want "cut.prototxt:" --want "missing '}'" -- "${T[@]}" cut.prototxt

mkdir solverdir
expect_refusal "a folder as the solver" --want "solverdir: not a regular file" -- "${T[@]}" solverdir
expect_refusal "a missing solver" --want "absent.prototxt: cannot open" -- "${T[@]}" absent.prototxt

# ---- options ----------------------------------------------------------------------------------
expect_refusal "--snapshot and --weights" --code 2 --want "--snapshot or --weights" -- \
  "${T[@]}" ok.prototxt --snapshot a.solverstate --weights b.caffemodel
expect_refusal "--sync of no mode" --code 2 --want "bogus" -- "${T[@]}" ok.prototxt --sync bogus
expect_refusal "--comm-timeout -1" --code 2 --want "--comm-timeout '-1'" -- "${T[@]}" ok.prototxt --comm-timeout -1
expect_refusal "--debug-slow-rank without MS" --code 2 --want "R:MS" -- "${T[@]}" ok.prototxt --debug-slow-rank 0
expect_refusal "an unknown option" --code 2 --want "--solverr" -- "$KILN" train --solverr ok.prototxt
expect_refusal "no --solver" --code 2 --want "--solver is required" -- "$KILN" train --weights x

# ---- outputs: snapshots and metrics -----------------------------------------------------------
solver nodir.prototxt 'snapshot_prefix: "nodir/sub/snap"' 'snapshot_after_train: true'
expect_refusal "snapshot into a missing folder" --want "nodir/sub/snap_iter_2.caffemodel" \
  --gone nodir/sub/snap_iter_2.caffemodel --gone nodir/sub/snap_iter_2.solverstate -- "${T[@]}" nodir.prototxt

mkdir -p taken/s_iter_2.caffemodel
solver taken.prototxt 'snapshot_prefix: "taken/s"' 'snapshot_after_train: true'
expect_refusal "a folder where the snapshot goes" --want "taken/s_iter_2.caffemodel" \
  --same taken/s_iter_2.caffemodel --gone taken/s_iter_2.solverstate -- "${T[@]}" taken.prototxt

: > plainfile
solver underfile.prototxt 'snapshot_prefix: "plainfile/s"' 'snapshot_after_train: true'
expect_refusal "snapshot under a plain file" --want "plainfile/s_iter_2.caffemodel" \
  --gone plainfile/s_iter_2.caffemodel -- "${T[@]}" underfile.prototxt

expect_refusal "metrics into a folder" --want "netdir: is a folder" -- "${T[@]}" ok.prototxt --metrics netdir
expect_refusal "metrics under a missing folder" --want "nodir2/m.jsonl: cannot create" --gone nodir2/m.jsonl -- \
  "${T[@]}" ok.prototxt --metrics nodir2/m.jsonl
expect_refusal "metrics of a solver that fails" --want "policy.prototxt" --gone policy.jsonl -- \
  "${T[@]}" policy.prototxt --metrics policy.jsonl
expect_refusal "metrics of a net that does not build" --want "gone.prototxt" --gone gone.jsonl -- \
  "${T[@]}" gone.prototxt.solver --metrics gone.jsonl
printf 'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\nlayer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 2 } }\n' > noloss.prototxt
printf 'net: "noloss.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\nsnapshot_prefix: "noloss"\n' > noloss_solver.prototxt
expect_refusal "a train net without a loss" --want "noloss.prototxt: the train net has no loss" --gone noloss_iter_2.caffemodel -- \
  "${T[@]}" noloss_solver.prototxt
finish
