# HDF5Data on several workers (docs/distributed.md): 2 workers with --deterministic read global
# batches r, r + 2, ... of the one-worker stream, so they end on the bits of one worker with
# iter_size 2, in order and shuffled, with batches running across two files and wrapping; a
# 2-worker snapshot resumed on one worker with iter_size 2 ends the same; a worker whose files
# differ from rank 0's is refused at start, naming the layer and the list.
# Skips (exit 77, a CTest skip) only when mpirun is missing or kiln was built without MPI.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
source "$(dirname "$0")/mpi.bash"

# 64 records of 1x8x8 bytes and labels 0..3 (tiny.bash's), as two HDF5 files of 40 and 24
mpi_tiny_lmdb
{ printf '\x00\x00\x08\x03\x00\x00\x00\x28\x00\x00\x00\x08\x00\x00\x00\x08'; tail -c +17 img.idx | head -c 2560; } > imgA.idx
{ printf '\x00\x00\x08\x03\x00\x00\x00\x18\x00\x00\x00\x08\x00\x00\x00\x08'; tail -c 1536 img.idx; } > imgB.idx
{ printf '\x00\x00\x08\x01\x00\x00\x00\x28'; tail -c +9 lab.idx | head -c 40; } > labA.idx
{ printf '\x00\x00\x08\x01\x00\x00\x00\x18'; tail -c 24 lab.idx; } > labB.idx
need "convert (first 40)" -- "$KILN" convert idx imgA.idx labA.idx a.h5
need "convert (last 24)" -- "$KILN" convert idx imgB.idx labB.idx b.h5
printf '%s\n%s\n' "$WORK/a.h5" "$WORK/b.h5" > list.txt

net() {  # net EXTRA_HDF5_DATA_PARAM: tiny_net on the HDF5 files, scaled by a layer (HDF5Data
         # takes no transform_param)
  mpi_tiny_net 6 | sed -e 's/type: "Data"/type: "HDF5Data"/' \
    -e "s#data_param { source: \"[^\"]*\" batch_size: 6 backend: LMDB *}#hdf5_data_param { source: \"$WORK/list.txt\" batch_size: 6 $1 }#" \
    -e 's/  transform_param { scale: 0.00390625 } }/}\nlayer { name: "scale" type: "Power" bottom: "data" top: "scaled" power_param { scale: 0.00390625 } }/' \
    -e 's/bottom: "data" top: "conv"/bottom: "scaled" top: "conv"/'
}
net "" > net.prototxt
net "shuffle: true" > shuffle_net.prototxt
grep -q 'type: "HDF5Data"' net.prototxt && grep -q 'hdf5_data_param' net.prototxt \
  && ! grep -q transform_param net.prototxt && grep -q 'bottom: "scaled" top: "conv"' net.prototxt \
  && pass || fail "net: $(cat net.prototxt)"
solver() {  # solver NAME NET ITER_SIZE [EXTRA]
  printf 'net: "%s"\nbase_lr: 0.05\nlr_policy: "fixed"\nmomentum: 0.9\nmax_iter: 12\n' "$2"
  printf 'iter_size: %s\ndisplay: 0\nrandom_seed: 5\nsnapshot_prefix: "%s"\n%s' "$3" "$WORK/$1" "${4:-}"
}
for kind in net shuffle_net; do
  solver "ref_$kind" "$kind.prototxt" 2 > "ref_$kind.prototxt"
  solver "w2_$kind" "$kind.prototxt" 1 'snapshot: 6
' > "w2_$kind.prototxt"
  solver "re_$kind" "$kind.prototxt" 2 > "re_$kind.prototxt"
  "$KILN" train --solver "ref_$kind.prototxt" > "ref_$kind.log" 2>&1 || fail "$kind: one worker: $(tail -n 3 "ref_$kind.log")"
  mpi 2 "$KILN" train --solver "w2_$kind.prototxt" --deterministic > "w2_$kind.log" 2>&1 \
    || fail "$kind: 2 workers: $(tail -n 5 "w2_$kind.log")"
  mpi_same "ref_${kind}_iter_12.caffemodel" "w2_${kind}_iter_12.caffemodel" "$kind: 2 workers vs iter_size 2"
  "$KILN" train --solver "re_$kind.prototxt" --snapshot "$WORK/w2_${kind}_iter_6.solverstate" > "re_$kind.log" 2>&1 \
    || fail "$kind: resumed on one worker: $(tail -n 3 "re_$kind.log")"
  mpi_same "ref_${kind}_iter_12.caffemodel" "re_${kind}_iter_12.caffemodel" "$kind: 2-worker snapshot resumed on one"
done

# rank 1 reads other files under the same path: each rank starts in a folder of its own, where
# the net's relative list.txt names another file (24 records, not 40)
"$KILN" convert idx imgB.idx labB.idx short.h5 > /dev/null
cat > pick.sh <<SH
#!/bin/bash
# each rank in its own folder: the same relative list.txt, other files
if [ "\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-0}}" = 1 ]; then cd "$WORK/r1"; else cd "$WORK/r0"; fi
exec "$KILN" "\$@"
SH
chmod +x pick.sh
mkdir -p r0 r1
printf '%s\n' "$WORK/a.h5" > r0/list.txt
printf '%s\n' "$WORK/short.h5" > r1/list.txt
sed "s#$WORK/list.txt#list.txt#" net.prototxt > rel_net.prototxt
solver rel "$WORK/rel_net.prototxt" 1 > rel.prototxt
out=$(mpi 2 ./pick.sh train --solver "$WORK/rel.prototxt" 2>&1)
case "$out" in
  *"layer 'd' reads list.txt"*"compared by their sizes, record counts"*) pass ;;
  *) fail "workers with other files: not refused by the fingerprint: $(echo "$out" | tail -n 5)" ;;
esac
finish
