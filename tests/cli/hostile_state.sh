# Hostile .solverstate files given to kiln train --snapshot: cut, garbage, another message type,
# history blobs of the wrong count or size, fields out of range, weights files that are missing
# or broken. The states are written byte by byte (protobuf.bash) for the tiny net of
# hostile.bash (SGD: one history blob per parameter, 10x16 and 10). Each case wants a clean error
# naming the file and the field, and no sanitizer report.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/hostile.bash"
source "$(dirname "$0")/protobuf.bash"
cd "$WORK"

tiny_lmdb tiny_lmdb || fail "convert the tiny LMDB"
tiny_net tiny_lmdb > net.prototxt
tiny_solver net.prototxt 'max_iter: 4' > solver.prototxt
tiny_solver net.prototxt 'max_iter: 2
snapshot_after_train: true
snapshot_prefix: "snap"' > snap_solver.prototxt
need "a real snapshot" -- "$KILN" train --solver snap_solver.prototxt

W=$(pb_bytes 7 "$(pb_blob 10,16 $(pb_fill 160 0.01))")
B=$(pb_bytes 7 "$(pb_blob 10 $(pb_fill 10 0))")
pb_write good.caffemodel "$(pb_string 1 tiny)$(pb_bytes 100 "$(pb_string 1 ip)$(pb_string 2 InnerProduct)$W$B")"
H1=$(pb_bytes 3 "$(pb_blob 10,16 $(pb_fill 160 0))")
H2=$(pb_bytes 3 "$(pb_blob 10 $(pb_fill 10 0))")
LN=$(pb_string 2 good.caffemodel)
# state FILE FIELDS...: a SolverState of the given fields (hex).
state() { local f=$1; shift; pb_write "$f" "$(printf '%s' "$@")"; }
R=("$KILN" train --solver solver.prototxt --snapshot)
state good.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2"
need "the hand-written state resumes" -- "${R[@]}" good.solverstate

# ---- files that are no .solverstate -----------------------------------------------------------
size=$(stat -c %s snap_iter_2.solverstate)
head -c $((size * 2 / 3)) snap_iter_2.solverstate > cut.solverstate
expect_refusal "a state cut short" --want "cut.solverstate" --want "not a valid binary SolverState" -- "${R[@]}" cut.solverstate

noise 2000 > noise.solverstate
expect_refusal "random bytes" --want "noise.solverstate" --want "SolverState" -- "${R[@]}" noise.solverstate

expect_refusal "a .caffemodel as the state" --want "snap_iter_2.caffemodel" --want "not a valid binary SolverState" -- \
  "${R[@]}" snap_iter_2.caffemodel

: > empty.solverstate
expect_refusal "an empty state" --want "empty.solverstate" --want "learned_net" -- "${R[@]}" empty.solverstate

mkdir folder.solverstate
expect_refusal "a folder as the state" --want "folder.solverstate: not a regular file" -- "${R[@]}" folder.solverstate
mkfifo fifo.solverstate
expect_refusal "a FIFO as the state" --timeout 20 --want "fifo.solverstate: not a regular file" -- "${R[@]}" fifo.solverstate
expect_refusal "a missing state" --want "absent.solverstate: cannot open" -- "${R[@]}" absent.solverstate

state wiretype.solverstate "$(pb_string 1 two)" "$LN" "$H1" "$H2"
expect_refusal "iter of the wrong wire type" --want "wiretype.solverstate" --want "corrupt" -- "${R[@]}" wiretype.solverstate

# ---- the history ------------------------------------------------------------------------------
state one.solverstate "$(pb_int 1 2)" "$LN" "$H1"
expect_refusal "one history blob for two" --want "one.solverstate" --want "1 history blobs" -- "${R[@]}" one.solverstate

state three.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$H2"
expect_refusal "three history blobs for two" --want "three.solverstate" --want "3 history blobs" -- "${R[@]}" three.solverstate

state swapped.solverstate "$(pb_int 1 2)" "$LN" "$H2" "$H1"
expect_refusal "history blobs in the wrong order" --want "swapped.solverstate" --want "history blob 0 has 10 values" -- \
  "${R[@]}" swapped.solverstate

state hshort.solverstate "$(pb_int 1 2)" "$LN" "$(pb_bytes 3 "$(pb_blob 10,16 1 2)")" "$H2"
expect_refusal "a history blob of 2 values" --want "hshort.solverstate" --want "history blob 0 has 2 values" -- \
  "${R[@]}" hshort.solverstate

tiny_solver net.prototxt 'max_iter: 4
type: "Adam"' > adam.prototxt
expect_refusal "an SGD state for Adam" --want "good.solverstate" --want "needs 4" -- \
  "$KILN" train --solver adam.prototxt --snapshot good.solverstate

# ---- fields out of range ----------------------------------------------------------------------
state negiter.solverstate "$(pb_int 1 -5)" "$LN" "$H1" "$H2"
expect_refusal "a negative iter" --want "negiter.solverstate" --want "iter is -5" -- "${R[@]}" negiter.solverstate

state step.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_int 4 -1)"
expect_refusal "a negative current_step" --want "step.solverstate" --want "current_step is -1" -- "${R[@]}" step.solverstate

tiny_solver net.prototxt 'max_iter: 4
lr_policy: "multistep"
stepvalue: 3' | sed '/lr_policy: "fixed"/d' > multistep.prototxt
state step5.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_int 4 5)"
expect_refusal "current_step past the schedule" --want "step5.solverstate" --want "current_step is 5" -- \
  "$KILN" train --solver multistep.prototxt --snapshot step5.solverstate

state first.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_float 1006 inf)"
expect_refusal "an infinite kiln_first_loss" --want "first.solverstate" --want "kiln_first_loss is inf" -- "${R[@]}" first.solverstate

state run.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_int 1007 -3)"
expect_refusal "a negative kiln_divergence_run" --want "run.solverstate" --want "kiln_divergence_run is -3" -- "${R[@]}" run.solverstate

state workers.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_int 1004 0)"
expect_refusal "kiln_workers 0" --want "workers.solverstate" --want "kiln_workers is 0" -- "${R[@]}" workers.solverstate

state rng.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_bytes 1001 00112233)"
expect_refusal "a generator state of 4 bytes" --want "rng.solverstate" --want "generator state has 4 bytes" -- "${R[@]}" rng.solverstate

state tcur.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_int 1005 1)"
expect_refusal "a test cursor for no test net" --want "tcur.solverstate" --want "test data cursors" -- "${R[@]}" tcur.solverstate

# ---- the weights it names ---------------------------------------------------------------------
state noln.solverstate "$(pb_int 1 2)" "$H1" "$H2"
expect_refusal "no learned_net" --want "noln.solverstate" --want "learned_net" -- "${R[@]}" noln.solverstate

head -c 100 snap_iter_2.caffemodel > cut.caffemodel
state cutln.solverstate "$(pb_int 1 2)" "$(pb_string 2 cut.caffemodel)" "$H1" "$H2"
expect_refusal "learned_net cut short" --want "cut.caffemodel" --want "corrupt or truncated" -- "${R[@]}" cutln.solverstate

state dirln.solverstate "$(pb_int 1 2)" "$(pb_string 2 folder.solverstate)" "$H1" "$H2"
expect_refusal "learned_net a folder" --want "folder.solverstate: not a regular file" -- "${R[@]}" dirln.solverstate

pb_write nan.caffemodel "$(pb_string 1 tiny)$(pb_bytes 100 "$(pb_string 1 ip)$(pb_string 2 InnerProduct)$W$(pb_bytes 7 "$(pb_blob 10 nan $(pb_fill 9 0))")")"
state nanln.solverstate "$(pb_int 1 2)" "$(pb_string 2 nan.caffemodel)" "$H1" "$H2"
expect_refusal "learned_net with a NaN bias" --want "nan.caffemodel" --want "layer 'ip' blob 1 value 0 is" -- \
  "${R[@]}" nanln.solverstate

state otherln.solverstate "$(pb_int 1 2)" "$(pb_string 2 snap_iter_2.solverstate)" "$H1" "$H2"
expect_refusal "learned_net naming a .solverstate" --want "snap_iter_2.solverstate" --want "NetParameter" -- \
  "${R[@]}" otherln.solverstate

# ---- values a resume would carry on with ------------------------------------------------------
state nanhist.solverstate "$(pb_int 1 2)" "$LN" "$(pb_bytes 3 "$(pb_blob 10,16 nan $(pb_fill 159 0))")" "$H2"
expect_refusal "a NaN in the history" --want "nanhist.solverstate: history blob 0 (parameter 'ip.param0') holds" --want "nan at 0" -- \
  "${R[@]}" nanhist.solverstate
state nanloss.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_floats 1002 nan nan)"
expect_refusal "a NaN in the loss window" --want "nanloss.solverstate: kiln_loss_history holds a value that is not finite" -- \
  "${R[@]}" nanloss.solverstate
state goneln.solverstate "$(pb_int 1 2)" "$(pb_string 2 gone/none.caffemodel)" "$H1" "$H2"
expect_refusal "learned_net nowhere" --want "goneln.solverstate: its learned_net 'gone/none.caffemodel'" -- \
  "${R[@]}" goneln.solverstate
state cursors.solverstate "$(pb_int 1 2)" "$LN" "$H1" "$H2" "$(pb_int 1000 1)" "$(pb_int 1000 2)"
expect_refusal "data cursors of another net" --want "cursors.solverstate: " --want "2 data cursors" -- \
  "${R[@]}" cursors.solverstate
finish
