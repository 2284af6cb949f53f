# Shared helpers for the shell tests (sourced, not a test): each test is `bash tests/cli/NAME.sh KILN SOURCE_DIR`.
set -u
KILN=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILS=0
PASSES=0

pass() { PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }

# expect_error NAME EXPECTED_SUBSTRING -- command...: the command must exit 1 or 2 (a clean
# error, not a signal) and print the substring on stderr.
expect_error() {
  local name=$1 want=$2
  shift 3
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit 0, expected an error"; return; fi
  if [ $rc -gt 2 ]; then fail "$name: exit $rc (crash?): $err"; return; fi
  case "$err" in
    *"$want"*) pass ;;
    *) fail "$name: message lacks '$want': $err" ;;
  esac
}

finish() {
  echo "$PASSES passed, $FAILS failed"
  [ $FAILS -eq 0 ]
}
