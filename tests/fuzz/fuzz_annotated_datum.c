/* The AnnotatedDatum decoder behind kiln_datum_db's annotated mode: the input is the value of
 * every record (the first byte says how many, 1 to 4) of a database written here with LMDB's
 * own calls, opened annotated (which reads the first record), then read sequentially and by
 * index. Every box a read gives must hold finite coordinates. */
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "kiln/data.h"

static void check(const kiln_annotated_datum *a) {
  for (size_t i = 0; i < a->n_box; i++)
    if (!isfinite(a->box[i].box.xmin) || !isfinite(a->box[i].box.ymin) ||
        !isfinite(a->box[i].box.xmax) || !isfinite(a->box[i].box.ymax))
      abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  char path[128];
  snprintf(path, sizeof path, "/tmp/kiln-fuzz-anno-%ld.mdb", (long)getpid());
  remove(path);
  MDB_env *env;
  if (mdb_env_create(&env)) return 0;
  mdb_env_set_mapsize(env, 64 << 20);
  MDB_txn *txn;
  MDB_dbi dbi;
  int n = 1 + data[0] % 4;
  if (mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOLOCK, 0644) || mdb_txn_begin(env, NULL, 0, &txn)) {
    mdb_env_close(env);
    return 0;
  }
  int rc = mdb_dbi_open(txn, NULL, 0, &dbi);
  for (int i = 0; !rc && i < n; i++) {
    char key[16];
    snprintf(key, sizeof key, "%08d", i);
    MDB_val k = {strlen(key), key}, v = {size - 1, (void *)(data + 1)};
    rc = mdb_put(txn, dbi, &k, &v, 0);
  }
  if (!rc) rc = mdb_txn_commit(txn);
  else mdb_txn_abort(txn);
  mdb_env_close(env);
  if (!rc) {
    kiln_datum_db *db = NULL;
    if (kiln_datum_db_open_annotated(path, KILN_DB_ANY, &db) == KILN_OK) {
      kiln_annotated_datum a;
      for (int i = 0; i < n + 1; i++) {
        if (kiln_datum_db_next_annotated(db, &a) != KILN_OK) break;
        check(&a);
      }
      if (kiln_datum_db_read_annotated(db, (uint64_t)(n - 1), &a) == KILN_OK) check(&a);
      kiln_datum_db_close(db);
    }
  }
  remove(path);
  char lock[160];
  snprintf(lock, sizeof lock, "%s-lock", path);
  remove(lock);
  return 0;
}
