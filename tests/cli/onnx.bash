# Shared by tests/cli/onnx_export.sh and slow_onnx_zoo.sh (sourced after lib.bash, in $WORK):
# the Python that has ONNX and OpenCV, and the round trip of one net.
#
# Debian's python3-onnx and python3-opencv, which Debian's own /usr/bin/python3 sees (a python3
# of pyenv or a virtual environment first on PATH may not). Empty, with a visible SKIP line,
# where they are missing: the exports still run, their checks do not.
ONNX_PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import onnx, cv2, numpy' >/dev/null 2>&1; then
    ONNX_PY=$p
    break
  fi
done
[ -n "$ONNX_PY" ] || echo "SKIP: python3-onnx or python3-opencv not installed: the models are exported but neither checked by onnx.checker nor run by OpenCV"
ONNX_REF=${KILN_ONNX_REF:-}
if [ -z "$ONNX_REF" ] || [ ! -x "$ONNX_REF" ]; then
  echo "onnx.bash: KILN_ONNX_REF (tests/support/onnx_ref) is not set: run this test through ctest" >&2
  exit 1
fi
ONNX_CHECKS=() # MODEL.onnx DIR pairs for onnx_check.py

# onnx_round_trip NAME PROTOTXT [BLOB...]: random weights, inputs and kiln's outputs (and BLOBs)
# into NAME.d, the export to NAME.onnx; the pair queued for onnx_check_all.
onnx_round_trip() {
  local name=$1 net=$2
  shift 2
  mkdir -p "$name.d"
  if ! "$ONNX_REF" "$net" "$name.caffemodel" "$name.d" 7 "$@" > "$name.ref.log" 2>&1; then
    fail "$name: onnx_ref: $(cat "$name.ref.log")"
    return
  fi
  if "$KILN" export onnx --model "$net" --weights "$name.caffemodel" "$name.onnx" > "$name.out" 2>&1 \
    && grep -q "^wrote $name.onnx: ONNX opset 13, " "$name.out" && [ -s "$name.onnx" ]; then
    pass
    ONNX_CHECKS+=("$name.onnx" "$name.d")
  else
    fail "$name: export: $(cat "$name.out")"
  fi
}

# onnx_check_all: onnx.checker and OpenCV on every queued model, one pass and a printed line each
# (the differences), or a failure.
onnx_check_all() {
  [ -n "$ONNX_PY" ] && [ ${#ONNX_CHECKS[@]} -gt 0 ] || return 0
  "$ONNX_PY" "$SRC/tests/cli/onnx_check.py" "${ONNX_CHECKS[@]}" > check.log 2> check.err
  local line
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      "ok "*" opset 13: "*) pass ;;
      *) fail "$line" ;;
    esac
  done < check.log
  [ "$(grep -c '' check.log)" -eq $((${#ONNX_CHECKS[@]} / 2)) ] && pass \
    || fail "onnx_check.py answered for $(grep -c '' check.log) of $((${#ONNX_CHECKS[@]} / 2)) models: $(tail -n 5 check.err)"
  ONNX_CHECKS=()
}
