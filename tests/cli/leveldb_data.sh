# Data on LevelDB (Caffe's default backend) against LMDB: the same 64 records written by
# `kiln convert idx` as an LMDB and, with --backend leveldb, as a LevelDB; a small net trained on
# each with the same seed (in key order, and shuffled) ends with bit-identical weights, with
# `backend: LEVELDB` and with no backend (Caffe's default); a shuffled LevelDB run resumed
# half-way ends the same. Training leaves the database's files byte for byte as they were (kiln
# reads a private view: LevelDB's own open rewrites its MANIFEST and log). A garbled, cut or
# incomplete database is refused naming it, without a crash; --backend takes lmdb or leveldb.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/tiny.bash"

tiny_lmdb # img.idx, lab.idx, tiny_lmdb
need "convert to LevelDB" -- "$KILN" convert idx img.idx lab.idx tiny_ldb --backend leveldb
[ -f tiny_ldb/CURRENT ] && [ ! -e tiny_ldb/data.mdb ] && [ ! -e tiny_ldb.tmp ] && pass \
  || fail "tiny_ldb is not a LevelDB: $(ls tiny_ldb tiny_ldb.tmp 2>&1)"
need "convert to LMDB with --backend lmdb" -- "$KILN" convert idx img.idx lab.idx lmdb2 --backend lmdb
[ -f lmdb2/data.mdb ] && pass || fail "--backend lmdb wrote no LMDB: $(ls lmdb2 2>&1)"

# the nets: tiny.bash's on the LMDB, and the same on the LevelDB (backend LEVELDB, and none)
ldb_net() {  # ldb_net BACKEND_TEXT [EXTRA]
  tiny_net 16 "${2:-}" | sed "s#$WORK/tiny_lmdb\" batch_size: 16 backend: LMDB#$WORK/tiny_ldb\" batch_size: 16 $1#"
}
tiny_net 16 > lmdb.prototxt
tiny_net 16 "shuffle: true" > lmdb_s.prototxt
ldb_net "backend: LEVELDB" > ldb.prototxt
ldb_net "" > ldb_default.prototxt
ldb_net "backend: LEVELDB" "shuffle: true" > ldb_s.prototxt
grep -q 'tiny_ldb" batch_size: 16 *}' ldb_default.prototxt && pass || fail "ldb_default.prototxt names a backend"
solver() {  # solver NET PREFIX
  printf 'net: "%s/%s"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 12\n' "$WORK" "$1"
  printf 'display: 0\nrandom_seed: 9\nsnapshot: 6\nsnapshot_prefix: "%s/%s"\n' "$WORK" "$2"
}
before=$(fingerprint tiny_ldb; cd tiny_ldb && ls && sha256sum ./*)
for run in lmdb:lmdb ldb:ldb ldb_default:ldbd lmdb_s:lmdbs ldb_s:ldbs ldb_s:ldbsr; do
  solver "${run%%:*}.prototxt" "${run#*:}" > "s_${run#*:}.prototxt"
done
for p in lmdb ldb ldbd lmdbs ldbs; do
  "$KILN" train --solver "s_$p.prototxt" > "$p.log" 2>&1 || fail "$p run: $(tail -n 3 "$p.log")"
done
same() {  # same A B WHAT
  "$KILN" compare-weights "$1" "$2" --rtol 0 --atol 0 > cmp.txt 2>&1 && cmp -s "$1" "$2" && pass \
    || fail "$3: $(cat cmp.txt)"
}
same lmdb_iter_12.caffemodel ldb_iter_12.caffemodel "LevelDB weights differ from LMDB's"
same lmdb_iter_12.caffemodel ldbd_iter_12.caffemodel "no backend: weights differ from LMDB's"
same lmdbs_iter_12.caffemodel ldbs_iter_12.caffemodel "shuffled: LevelDB weights differ from LMDB's"
cmp -s lmdb_iter_12.caffemodel lmdbs_iter_12.caffemodel && fail "shuffle changed nothing" || pass
cmp -s ldb_iter_6.caffemodel ldb_iter_12.caffemodel && fail "the weights did not change" || pass
"$KILN" train --solver s_ldbsr.prototxt --snapshot "$WORK/ldbs_iter_6.solverstate" > ldbsr.log 2>&1 \
  || fail "resumed LevelDB run: $(tail -n 3 ldbsr.log)"
same ldbs_iter_12.caffemodel ldbsr_iter_12.caffemodel "resumed shuffled LevelDB run differs"
after=$(fingerprint tiny_ldb; cd tiny_ldb && ls && sha256sum ./*)
[ "$before" = "$after" ] && pass || fail "training changed the database: $before / $after"

# damaged databases: refused naming the path, never a crash
damaged() {  # damaged NAME HOW WANT...: a copy of tiny_ldb damaged by HOW (run inside it)
  local name=$1 how=$2
  shift 2
  rm -rf "$name"
  cp -r tiny_ldb "$name"
  (cd "$name" && eval "$how")
  ldb_net "backend: LEVELDB" | sed "s#$WORK/tiny_ldb\"#$WORK/$name\"#" > "$name.prototxt"
  local -a w=(--want "$WORK/$name")
  for x in "$@"; do w+=(--want "$x"); done
  solver "$name.prototxt" "$name" > "s_$name.prototxt"
  expect_refusal "$name" "${w[@]}" -- "$KILN" train --solver "s_$name.prototxt"
}
damaged garbled 'printf "garbage!garbage!" | dd of="$(ls ./*.ldb)" bs=1 seek=300 conv=notrunc 2>/dev/null' \
  "checksum mismatch"
damaged cut 'truncate -s 1000 ./*.ldb' "layer 'd' (Data)"
damaged no_table 'rm ./*.ldb' "not a readable LevelDB database" "missing files"
damaged no_manifest 'rm MANIFEST-*' "not a readable LevelDB database" "CURRENT points to a non-existent file"
damaged garbled_manifest 'printf "garbage!" | dd of="$(ls MANIFEST-*)" bs=1 seek=10 conv=notrunc 2>/dev/null' \
  "not a readable LevelDB database"
damaged no_current 'rm CURRENT' "not a LevelDB database (no CURRENT inside)"
damaged empty_current ': > CURRENT' "not a readable LevelDB database"

# --backend: lmdb or leveldb, and not for an HDF5 file
expect_refusal "--backend bad" --code 2 --want "--backend takes lmdb or leveldb, not 'bad'" --gone bad \
  -- "$KILN" convert idx img.idx lab.idx bad --backend bad
expect_refusal "--backend on .h5" --code 2 --want "x.h5 is an HDF5 data file" --gone x.h5 \
  -- "$KILN" convert idx img.idx lab.idx x.h5 --backend leveldb
expect_refusal "LevelDB over an existing path" --want "$WORK/tiny_ldb: already exists" --same tiny_ldb \
  -- "$KILN" convert idx img.idx lab.idx "$WORK/tiny_ldb" --backend leveldb
finish
