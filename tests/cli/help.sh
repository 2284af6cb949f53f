# Every command answers --help. The commands are read from `kiln --help` itself (the "commands:"
# block) and a command's forms from its own help (`usage: kiln CMD FORM ...` lines, as convert,
# data and ce have), so a command or form added without a help of its own fails here. For each
# command and form: `kiln CMD [FORM] --help`, `-h` and `kiln help CMD [FORM]` exit 0 with the same
# text on stdout, starting `usage: kiln CMD [FORM]`, and nothing on stderr; every option the text
# lists (a line `  --NAME ...`) is one the command knows (it never answers "unknown option
# '--NAME'"), and a command that lists options does refuse one it does not know. `kiln help` is
# `kiln --help`; an unknown command is refused with exit 2; --help as another option's value is
# that value, not a request for help.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
# nothing below may touch the user's history or data set cache
export HOME=$WORK/home XDG_DATA_HOME=$WORK/xdg KILN_DATA=$WORK/data
mkdir -p "$HOME"

top=$("$KILN" --help 2>err.txt)
rc=$?
[ $rc -eq 0 ] && [ ! -s err.txt ] && pass || fail "kiln --help: exit $rc, stderr: $(cat err.txt)"
for spelling in help -h -help; do # -help: Caffe's (gflags) spelling
  [ "$("$KILN" $spelling 2>err.txt)" = "$top" ] && [ ! -s err.txt ] && pass \
    || fail "kiln $spelling is not kiln --help: $(cat err.txt)"
done

commands=$(printf '%s\n' "$top" |
  awk '/^commands:/ { on = 1; next } on && /^$/ { exit } on && /^  [a-z]/ { print $1 }' | sort -u)
[ "$(echo $commands | wc -w)" -ge 10 ] && pass || fail "kiln --help lists too few commands: $commands"
commands="$commands compare-weights" # hidden, but it answers --help too

HELP=
# check_help WORD...: `kiln WORD... --help`, `kiln WORD... -h` and `kiln help WORD...`; the text
# in HELP. False when a check failed.
check_help() {
  local what="kiln $*" out rc first
  out=$(timeout 20 "$KILN" "$@" --help 2>err.txt)
  rc=$?
  if [ $rc -ne 0 ] || [ -s err.txt ]; then
    fail "$what --help: exit $rc, stderr: $(head -c 2000 err.txt)"
    return 1
  fi
  first=$(printf '%s\n' "$out" | head -n 1)
  case "$first" in
    "usage: $what" | "usage: $what "*) pass ;;
    *) fail "$what --help: first line is '$first', not 'usage: $what ...'"; return 1 ;;
  esac
  [ "$(printf '%s\n' "$out" | wc -l)" -ge 3 ] && pass || fail "$what --help: a line or two: $out"
  local other
  for other in "-h" "help"; do
    local again
    if [ "$other" = help ]; then again=$(timeout 20 "$KILN" help "$@" 2>err.txt)
    else again=$(timeout 20 "$KILN" "$@" -h 2>err.txt); fi
    rc=$?
    [ $rc -eq 0 ] && [ ! -s err.txt ] && [ "$again" = "$out" ] && pass \
      || fail "$what: '$other' (exit $rc) does not print what --help does: $(head -c 2000 err.txt)"
  done
  HELP=$out
}

# check_options WORD...: every option HELP lists is known to `kiln WORD...`, and an unknown one
# is refused.
check_options() {
  local what="kiln $*" opt err rc n=0
  for opt in $(printf '%s\n' "$HELP" | sed -n 's/^  \(--[a-z][a-z0-9-]*\).*/\1/p' | sort -u); do
    n=$((n + 1))
    err=$(timeout 20 "$KILN" "$@" "$opt" 2>&1 >/dev/null)
    rc=$?
    if has_sanitizer_report "$err" || [ $rc -ge 124 ]; then
      fail "$what $opt: exit $rc: $err"
      continue
    fi
    case "$err" in
      *"unknown option"*) fail "$what --help lists $opt, which it refuses: $err" ;;
      *) pass ;;
    esac
  done
  [ $n -eq 0 ] && return
  err=$(timeout 20 "$KILN" "$@" --no-such-option 2>&1 >/dev/null)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 124 ] && case "$err" in *"unknown option '--no-such-option'"*) true ;; *) false ;; esac \
    && pass || fail "$what --no-such-option: exit $rc, no 'unknown option': $err"
}

for cmd in $commands; do
  check_help "$cmd" || continue
  check_options "$cmd"
  forms=$(printf '%s\n' "$HELP" | sed -n "s/^\(usage: \|       \)kiln $cmd \([a-z][a-z0-9-]*\).*/\2/p" | sort -u)
  for form in $forms; do
    check_help "$cmd" "$form" && check_options "$cmd" "$form"
    CHECKED="${CHECKED:-}|$cmd $form|"
  done
done
# the forms issue 34 named are among those checked (a form missing from its command's usage
# lines would drop out of the loop above unseen)
for form in "convert text" "ce history" "ce compare" "data fetch" "data verify"; do
  case "${CHECKED:-}" in *"|$form|"*) pass ;; *) fail "kiln $form --help was not checked (not in kiln ${form% *} --help's usage lines?)" ;; esac
done

# the same help through Caffe's spelling, and wherever an option may stand
[ "$("$KILN" train -help 2>/dev/null | head -n 1)" = "$("$KILN" train --help | head -n 1)" ] && pass \
  || fail "kiln train -help"
"$KILN" convert idx a b --help 2>/dev/null | head -n 1 | grep -q "^usage: kiln convert idx" && pass \
  || fail "kiln convert idx a b --help"
"$KILN" test --iterations 3 --help 2>/dev/null | head -n 1 | grep -q "^usage: kiln test" && pass \
  || fail "kiln test --iterations 3 --help"
# the value of an option is never a request for help
out=$("$KILN" describe --model --help 2>&1)
rc=$?
[ $rc -ne 0 ] && case "$out" in *usage:*) false ;; *--help*) true ;; *) false ;; esac && pass \
  || fail "describe --model --help: exit $rc: $out"

expect_error "help nosuch" "unknown command 'nosuch'" -- "$KILN" help nosuch
"$KILN" help nosuch >/dev/null 2>&1
[ $? -eq 2 ] && pass || fail "kiln help nosuch: not exit 2"
expect_error "nosuch --help" "unknown command 'nosuch'" -- "$KILN" nosuch --help
finish
