/* Helpers shared by the files of src/data/ and not part of the public API. */
#ifndef KILN_DATA_INTERNAL_H
#define KILN_DATA_INTERNAL_H

/* Removes an LMDB directory that kiln wrote (data.mdb, lock.mdb, then the directory itself).
 * Returns 0 or an errno value; a missing directory counts as success. Anything else inside makes
 * rmdir fail, so a directory that is not ours is never emptied. */
int kiln_data_remove_lmdb_dir(const char *dir);

/* mkdir -p; returns 0 or an errno value. */
int kiln_data_mkdir_p(const char *path);

#endif
