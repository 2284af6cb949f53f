# The modules include downward only (scripts/check-layering against docs/architecture.md's
# layering block), and the check catches what it is for: in a copy of the tree, an upward include
# planted in core, a sideways one between data and parallel, a public header including a higher
# one and an unplaced header each make it fail, naming the file.
source "$(dirname "$0")/lib.bash"
check="$SRC/scripts/check-layering"
out=$("$check" "$SRC" 2>&1) && pass || fail "the tree breaks the layering: $out"

copy() {
  rm -rf "$WORK/t"
  mkdir -p "$WORK/t"
  cp -r "$SRC/src" "$SRC/include" "$SRC/tools" "$SRC/docs" "$WORK/t/"
}
plant() {  # plant NAME FILE LINE WANT: LINE added to FILE of the copy must fail naming WANT
  copy
  printf '%s\n' "$3" >> "$WORK/t/$2"
  local out rc
  out=$("$check" "$WORK/t" 2>&1)
  rc=$?
  [ $rc -eq 1 ] && pass || fail "$1: exit $rc, expected 1: $out"
  case "$out" in *"$4"*) pass ;; *) fail "$1: the report lacks '$4': $out" ;; esac
}
plant "core includes solver" src/core/blob.c '#include "kiln/solver.h"' \
  'src/core/blob.c: module core (level 1) includes "kiln/solver.h" of module solver'
plant "ops includes net" src/ops/pool.c '#include "kiln/net.h"' 'src/ops/pool.c: module ops'
plant "data includes parallel" src/data/idx.c '#include "kiln/parallel.h"' \
  'module data (level 4) includes "kiln/parallel.h" of module parallel (level 4)'
plant "a public header includes a higher one" include/kiln/core.h '#include "kiln/ce.h"' \
  'include/kiln/core.h: module core'
plant "solver includes ce" src/solver/solver.c '#include "kiln/ce.h"' 'module solver'
plant "an unplaced header" src/net/net.c '#include "kiln/nowhere.h"' \
  'includes "kiln/nowhere.h", which the layering block of docs/architecture.md does not place'
copy
touch "$WORK/t/include/kiln/extra.h"
out=$("$check" "$WORK/t" 2>&1)
[ $? -eq 1 ] && [[ $out == *"include/kiln/extra.h: a header the layering block"* ]] && pass \
  || fail "an unplaced public header: $out"
finish
