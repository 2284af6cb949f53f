# Shared inputs of the hostile_*.sh tests (sourced after lib.bash, in $WORK): a tiny LMDB and a
# net and solver that train on it in a moment, so that each case changes one thing of inputs
# known to work.

# tiny_lmdb OUT [LABELS...]: an LMDB of 1x4x4 random images with the given labels (default 3 4).
tiny_lmdb() {
  local out=$1
  shift
  [ $# -gt 0 ] || set -- 3 4
  local n=$# l
  {
    printf '\x00\x00\x08\x03'
    printf "\\x$(printf %02x $((n >> 24 & 255)))\\x$(printf %02x $((n >> 16 & 255)))"
    printf "\\x$(printf %02x $((n >> 8 & 255)))\\x$(printf %02x $((n & 255)))"
    printf '\x00\x00\x00\x04\x00\x00\x00\x04'
    head -c $((16 * n)) /dev/urandom
  } > "$out.images.idx"
  {
    printf '\x00\x00\x08\x01'
    printf "\\x$(printf %02x $((n >> 24 & 255)))\\x$(printf %02x $((n >> 16 & 255)))"
    printf "\\x$(printf %02x $((n >> 8 & 255)))\\x$(printf %02x $((n & 255)))"
    for l in "$@"; do printf "\\x$(printf %02x "$l")"; done
  } > "$out.labels.idx"
  "$KILN" convert idx "$out.images.idx" "$out.labels.idx" "$out" >/dev/null
}

# tiny_net LMDB [EXTRA_LAYERS]: a Data layer reading LMDB (batch 2), an InnerProduct 'ip' of 10
# outputs (weights 10x16, bias 10) and a softmax loss.
tiny_net() {
  cat <<NET
name: "tiny"
layer { name: "d" type: "Data" top: "data" top: "label"
  transform_param { scale: 0.00390625 }
  data_param { source: "$1" batch_size: 2 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
${2:-}
NET
}

# tiny_solver NET [EXTRA_LINES]: SGD, fixed rate, 2 iterations, no snapshot at the end.
tiny_solver() {
  printf 'net: "%s"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 2\nsnapshot_after_train: false\n%s\n' \
    "$1" "${2:-}"
}

# noise N: N bytes of garbage, the same on every run (a seeded generator, not /dev/urandom), so a
# case that needs a file of no format never meets the one draw that parses.
noise() { perl -e 'srand(7); print pack("C*", map { int(rand(256)) } 1 .. $ARGV[0])' -- "$1"; }
