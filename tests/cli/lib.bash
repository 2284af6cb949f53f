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

# has_sanitizer_report TEXT: true when TEXT holds a report of AddressSanitizer, LeakSanitizer or
# UndefinedBehaviorSanitizer. Under the sanitizers a report exits 1 (LeakSanitizer: 23), which
# an exit code alone cannot tell from a clean error.
has_sanitizer_report() {
  case "$1" in
    *AddressSanitizer* | *LeakSanitizer* | *UndefinedBehaviorSanitizer* | *"runtime error:"*) return 0 ;;
  esac
  return 1
}

# expect_error NAME EXPECTED_SUBSTRING -- command...: the command must exit 1 or 2 (a clean
# error, not a signal), print the substring on stderr and no sanitizer report.
expect_error() {
  local name=$1 want=$2
  shift 3
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit 0, expected an error"; return; fi
  if has_sanitizer_report "$err"; then fail "$name: sanitizer report (exit $rc): $err"; return; fi
  if [ $rc -gt 2 ]; then fail "$name: exit $rc (crash?): $err"; return; fi
  case "$err" in
    *"$want"*) pass ;;
    *) fail "$name: message lacks '$want': $err" ;;
  esac
}

# left_behind PATH: what is under PATH or a temporary of it (PATH.tmp, PATH.tmp.PID), one a
# line; nothing when neither exists.
left_behind() {
  local p
  for p in "$1" "$1".tmp*; do
    [ -e "$p" ] || [ -L "$p" ] && echo "$p"
  done
}

# fingerprint PATH: a file's checksum, or a folder's listing.
fingerprint() {
  if [ -d "$1" ]; then ls -lA --time-style=+%s.%N "$1"; else cksum < "$1" 2>&1; fi
}

# expect_refusal NAME [options] -- command...: one hostile-input case. The command must end with
# a clean error: exit 1 or 2 (--code N: exactly N), within --timeout seconds (default 60), with
# no sanitizer report on stdout or stderr, and stderr (--any: stdout or stderr) holding every
# --want substring (give the file and the line or field, each as its own --want).
#   --gone PATH   the command was to write PATH: neither PATH nor a PATH.tmp* temporary may
#                 exist afterwards (give one that does not exist before)
#   --absent PATH PATH itself must not exist afterwards (when its temporary exists before)
#   --same PATH   PATH exists and must be left as it was (a file byte for byte, a folder's
#                 listing), with no PATH.tmp* temporary beside it
# Counts one pass, or one failure naming every check that did not hold.
expect_refusal() {
  local name=$1
  shift
  local -a want=() gone=() same=() sums=() absent=()
  local code="" timeout=60 any=false
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --want) want+=("$2"); shift 2 ;;
      --gone) gone+=("$2"); shift 2 ;;
      --same) same+=("$2"); shift 2 ;;
      --absent) absent+=("$2"); shift 2 ;;
      --code) code=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --any) any=true; shift ;;
      *) fail "$name: expect_refusal: unknown option '$1'"; return ;;
    esac
  done
  shift
  local p
  for p in "${gone[@]}"; do
    [ -z "$(left_behind "$p")" ] || { fail "$name: $p exists before the command"; return; }
  done
  for p in "${same[@]}"; do sums+=("$(fingerprint "$p")"); done
  local outf errf rc out err
  outf=$(mktemp "$WORK/.out.XXXXXX")
  errf=$(mktemp "$WORK/.err.XXXXXX")
  timeout -k 5 "$timeout" "$@" >"$outf" 2>"$errf"
  rc=$?
  out=$(cat "$outf")
  err=$(cat "$errf")
  rm -f "$outf" "$errf"
  local -a why=()
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why+=("timed out after ${timeout}s")
  elif [ -n "$code" ]; then
    [ "$rc" -eq "$code" ] || why+=("exit $rc, expected $code")
  elif [ "$rc" -eq 0 ]; then
    why+=("exit 0, expected an error")
  elif [ "$rc" -gt 2 ]; then
    why+=("exit $rc (a crash or a signal?)")
  fi
  if has_sanitizer_report "$err$out"; then why+=("sanitizer report"); fi
  local text=$err
  $any && text="$out
$err"
  local w
  for w in "${want[@]}"; do
    case "$text" in *"$w"*) ;; *) why+=("message lacks '$w'") ;; esac
  done
  for p in "${gone[@]}"; do
    local left
    left=$(left_behind "$p")
    [ -z "$left" ] || why+=("left behind: $(echo $left)")
  done
  for p in "${absent[@]}"; do
    [ -e "$p" ] || [ -L "$p" ] && why+=("left behind: $p")
  done
  local i
  for i in "${!same[@]}"; do
    [ "$(fingerprint "${same[$i]}")" = "${sums[$i]}" ] || why+=("${same[$i]} changed")
    for p in "${same[$i]}".tmp*; do [ -e "$p" ] && why+=("left behind: $p"); done
  done
  if [ ${#why[@]} -eq 0 ]; then
    pass
  else
    local IFS=';'
    fail "$name: ${why[*]}
--- stderr:
$err
--- stdout:
$(printf '%s' "$out" | tail -n 20)"
  fi
}

# need NAME -- command...: a step the cases rely on (no case itself): fails the test, with the
# command's output, when it exits non-zero; counts nothing when it succeeds.
need() {
  local name=$1 out
  shift 2
  out=$("$@" 2>&1) && return 0
  fail "$name: $out"
  return 1
}

finish() {
  echo "$PASSES passed, $FAILS failed"
  [ $FAILS -eq 0 ]
}
