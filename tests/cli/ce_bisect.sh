# kiln ce bisect on a small repository made here: its "build" writes build/kiln, a wrapper of the
# kiln under test that plants the fault its commit's file `fault` names (KILN_FAULT), so that
# one commit makes the model slower (sleep:) and a later one makes it learn worse (lr:). The
# search must name each planted commit, step over a commit whose build fails, say when a
# regression does not reproduce, refuse bad arguments, and leave the repository's own tree,
# index, HEAD and worktree list as they were.
source "$(dirname "$0")/lib.bash"
source "$(dirname "$0")/tiny.bash"
cd "$WORK"
export NO_COLOR=1 GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
command -v git >/dev/null || { echo "SKIP: no git"; exit 77; }
tiny_lmdb

mkdir repo && cd repo
git init -q -b main .
tiny_accuracy_net > net.prototxt
tiny_accuracy_solver | sed 's/^max_iter: 100$/max_iter: 500/; s/^test_interval: 100$/test_interval: 500/' \
  > solver.prototxt
mkdir ce
# The planted sleep adds about 1 s to a training of about 0.01 s: a slower commit is one 0.4 s
# slower, far above what a busy machine adds to the clean one.
cat > ce/suite.prototxt <<'SUITE'
name: "bisect"
repeats: 3
model {
  name: "tiny"
  solver: "../solver.prototxt"
  threads: 1
  kpi { name: "accuracy" }
  kpi { name: "duration_s" abs_tolerance: 0.4 }
  kpi { name: "train_loss" }
}
SUITE
# The build: build/kiln runs the kiln under test, with the commit's fault when it names one; a
# file `broken` makes the build fail.
cat > build.sh <<BUILD
#!/bin/sh
[ -e broken ] && { echo "build.sh: this commit does not build" >&2; exit 1; }
mkdir -p build
fault=\$(cat fault 2>/dev/null)
{ echo '#!/bin/sh'
  [ -n "\$fault" ] && echo "export KILN_FAULT='\$fault'"
  echo 'exec "$KILN" "\$@"'; } > build/kiln
chmod +x build/kiln
BUILD
chmod +x build.sh
echo build/ > .gitignore
: > fault
git add -A && git commit -q -m "A: the model as it was"
echo "a note" > note && git add note && git commit -q -m "N: a note"
touch broken && git add broken && git commit -q -m "B: a commit that does not build"
git rm -q broken && git commit -q -m "C: builds again"
echo "sleep:ip:2" > fault && git commit -q -am "D: plant a slowdown"
git rm -q note && git commit -q -m "F: note removed"
# The search over A..F (5 commits after A): A and F, then the middle, B (untestable), so its
# neighbour C (good), then D (bad): D is the first bad one.
trees_before=$(git worktree list --porcelain | grep '^worktree ')
A=$(git rev-parse HEAD~5) C=$(git rev-parse HEAD~2) D=$(git rev-parse HEAD~1)
cd "$WORK"

bisect() { "$KILN" ce bisect "$@" --suite "$WORK/repo/ce/suite.prototxt" --build ./build.sh; }

# 1. the slowdown: GOOD A, BAD F; B (untestable) is stepped over and D named
out=$(bisect tiny duration_s "$A" main --work-dir "$WORK/w1" 2>err1.txt)
rc=$?
[ $rc -eq 0 ] && pass || fail "slowdown bisect: exit $rc: $out $(cat err1.txt)"
echo "$out" | grep -q "^first bad commit: $D D: plant a slowdown$" && pass \
  || fail "slowdown: D not named: $out"
echo "$out" | grep -Eq "^ +3 +2  [0-9a-f]{12} +- +- +- +untestable +B: a commit that does not build$" \
  && pass || fail "B not shown untestable: $out"
echo "$out" | grep -q "the build failed (exit 1): build.sh: this commit does not build" && pass \
  || fail "B's reason: $out"
echo "$out" | grep -Eq "^ +5 +4  ${D:0:12} +[0-9.]+ s +[0-9.e-]+ s +\+[0-9.]+% +bad +D: plant a slowdown$" \
  && pass || fail "D's row: $out"
echo "$out" | grep -Eq "^ +4 +3  ${C:0:12} .* good +C: builds again$" && pass \
  || fail "C's row: $out"
[ "$(echo "$out" | grep -Ec '^ +[0-9]+ +[0-9]+  [0-9a-f]{12} ')" -eq 5 ] && pass \
  || fail "five steps (A, F, B, C, D): $out"
grep -q "ce bisect: .*checking out and building" err1.txt && pass || fail "no progress: $(cat err1.txt)"
[ ! -e "$WORK/w1/tree" ] && pass || fail "worktree not removed"
ls "$WORK"/w1/logs/build-*.log >/dev/null 2>&1 && ls -d "$WORK"/w1/runs/04-* >/dev/null 2>&1 \
  && pass || fail "logs and run folders: $(ls -R "$WORK/w1" | head -20)"

# 2. the accuracy drop: E's commit plants lr:0.05 through the wrapper as well
cd repo
printf 'lr:0.05\n' > fault && git commit -q -am "G: plant an accuracy drop (and end the slowdown)"
git commit -q --allow-empty -m "H: after"
git commit -q --allow-empty -m "I: after"
G=$(git rev-parse HEAD~2)
head_before=$(git rev-parse HEAD)
cd "$WORK"
out=$(bisect tiny accuracy "$D" main --repeats 1 --work-dir "$WORK/w2" --keep-worktree 2>err2.txt)
rc=$?
[ $rc -eq 0 ] && pass || fail "accuracy bisect: exit $rc: $out $(cat err2.txt)"
echo "$out" | grep -q "^first bad commit: $G G: plant an accuracy drop (and end the slowdown)$" && pass \
  || fail "accuracy: G not named: $out"
echo "$out" | grep -Eq "^ +[0-9]+ +0  ${D:0:12} +1 +0 +- +GOOD" && pass || fail "GOOD's row: $out"
echo "$out" | grep -q "accuracy of 1 worker (higher is better)" && pass || fail "header: $out"
[ -d "$WORK/w2/tree" ] && pass || fail "--keep-worktree"
git -C repo worktree list | grep -q "$WORK/w2/tree" && pass || fail "kept worktree not listed"
# the same work folder again reuses the kept worktree (and its build)
out=$(bisect tiny accuracy "$D" main --repeats 1 --work-dir "$WORK/w2" 2>&1)
echo "$out" | grep -q "^first bad commit: $G " && pass || fail "reused worktree: $out"
[ ! -e "$WORK/w2/tree" ] && pass || fail "worktree left after the second search"

# 3. no regression between GOOD and BAD: exit 1, said
out=$(bisect tiny duration_s "$A" "$C" --work-dir "$WORK/w3" 2>/dev/null)
rc=$?
[ $rc -eq 1 ] && pass || fail "not reproduced: exit $rc, expected 1: $out"
echo "$out" | grep -q "^not reproduced: BAD's duration_s is not worse than GOOD's" && pass \
  || fail "not reproduced message: $out"

# 4. bad arguments: exit 3 with what is wrong
expect3() {
  local name=$1 want=$2 err rc
  shift 2
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  [ $rc -eq 3 ] && pass || fail "$name: exit $rc, expected 3: $err"
  case "$err" in *"$want"*) pass ;; *) fail "$name: message lacks '$want': $err" ;; esac
}
expect3 "unknown KPI" "model 'tiny' declares no KPI 'speed' (its KPIs: accuracy, duration_s, train_loss)" \
  bisect tiny speed "$A" main --work-dir "$WORK/w4"
expect3 "unknown model" "no model named 'tinny' (its models: tiny)" \
  bisect tinny accuracy "$A" main --work-dir "$WORK/w4"
expect3 "swapped" "is not an ancestor of BAD" bisect tiny accuracy main "$A" --work-dir "$WORK/w4"
expect3 "no such commit" "GOOD 'nosuch' is not a commit of the repository" \
  bisect tiny accuracy nosuch main --work-dir "$WORK/w4"
expect3 "same commit" "GOOD and BAD are the same commit" \
  bisect tiny accuracy main main --work-dir "$WORK/w4"
expect3 "missing arguments" "needs MODEL KPI GOOD BAD" "$KILN" ce bisect tiny accuracy
B=$(git -C repo rev-parse main~6)
expect3 "GOOD does not build" "GOOD ${B:0:12} cannot be measured: the build failed (exit 1)" \
  bisect tiny accuracy "$B" main --work-dir "$WORK/w5"
mkdir -p "$WORK/w6/tree"
expect3 "foreign tree" "is not a worktree of" bisect tiny accuracy "$A" main --work-dir "$WORK/w6"

# the repository's own tree is as it was: HEAD, a clean status, no worktree left, no build
cd repo
[ "$(git rev-parse HEAD)" = "$head_before" ] && pass || fail "HEAD moved"
[ -z "$(git status --porcelain)" ] && pass || fail "tree changed: $(git status --porcelain)"
[ "$(git worktree list --porcelain | grep '^worktree ')" = "$trees_before" ] && pass \
  || fail "worktrees left: $(git worktree list)"
[ ! -e build ] && pass || fail "built in the user's tree"
finish
