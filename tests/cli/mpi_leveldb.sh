# Two workers reading one LevelDB at once: LevelDB lets one process open a database (an fcntl
# lock on its LOCK file), so kiln opens a private view of it in each process
# (src/data/datum_leveldb.c). 2 workers under mpirun on the LevelDB, in key order and shuffled,
# end with the bits of the same 2 workers on an LMDB of the same records, the database's files
# left as they were; 2 workers on the LevelDB also give the bits of 1 worker x iter_size 2
# (--deterministic). Skips (exit 77) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

mpi_tiny_lmdb # img.idx, lab.idx, tiny_lmdb
need "convert to LevelDB" -- "$KILN" convert idx img.idx lab.idx tiny_ldb --backend leveldb
ldb() { sed "s#$WORK/tiny_lmdb\" batch_size: \([0-9]*\) backend: LMDB#$WORK/tiny_ldb\" batch_size: \1 backend: LEVELDB#"; }
mpi_tiny_net 4 "" > lmdb.prototxt
mpi_tiny_net 4 "shuffle: true" > lmdb_s.prototxt
ldb < lmdb.prototxt > ldb.prototxt
ldb < lmdb_s.prototxt > ldb_s.prototxt
grep -q "tiny_ldb\" batch_size: 4 backend: LEVELDB" ldb_s.prototxt && pass || fail "no LevelDB net"
solver() {  # solver NAME NET ITER_SIZE
  {
    printf 'net: "%s"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\nmax_iter: 10\n' "$WORK/$2"
    printf 'iter_size: %s\ndisplay: 0\nrandom_seed: 5\nsnapshot_prefix: "%s"\n' "$3" "$WORK/$1"
  } > "$1.prototxt"
}
before=$(cd tiny_ldb && ls && sha256sum ./*)
for run in lmdb ldb lmdb_s ldb_s; do
  solver "w2_$run" "$run.prototxt" 1
  mpi 2 "$KILN" train --deterministic --solver "w2_$run.prototxt" > "w2_$run.log" 2>&1 \
    || fail "2 workers on $run: $(tail -n 5 "w2_$run.log")"
done
solver one_ldb ldb.prototxt 2
"$KILN" train --solver one_ldb.prototxt > one_ldb.log 2>&1 || fail "1 worker: $(tail -n 3 one_ldb.log)"
mpi_same w2_lmdb_iter_10.caffemodel w2_ldb_iter_10.caffemodel "2 workers, LevelDB against LMDB"
mpi_same w2_lmdb_s_iter_10.caffemodel w2_ldb_s_iter_10.caffemodel "2 workers shuffled, LevelDB against LMDB"
mpi_same one_ldb_iter_10.caffemodel w2_ldb_iter_10.caffemodel "LevelDB, 2 workers against 1 x iter_size 2"
cmp -s w2_ldb_iter_10.caffemodel w2_ldb_s_iter_10.caffemodel && fail "shuffle changed nothing" || pass
after=$(cd tiny_ldb && ls && sha256sum ./*)
[ "$before" = "$after" ] && pass || fail "the workers changed the database"
finish
