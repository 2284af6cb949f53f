/* LMDB and LevelDB databases of Caffe Datum records: the sequential, wrapping reader behind the
 * Data layer (which decodes encoded records, PNG or JPEG, through image.c) and the writer that
 * builds new databases atomically (into PATH.tmp, renamed on commit). LMDB is read here; a
 * LevelDB's raw records come from datum_leveldb.c, and both are decoded and checked here. In
 * annotated mode a record is an AnnotatedDatum, unpacked by annotated_db.c, whose Datum is then
 * checked and decoded here. */
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"
#include "kiln/data.h"
#include "kiln/proto.h"

/* Largest C x H x W we accept in one record; beyond this a header is surely garbage. */
#define DATUM_MAX_VALUES ((uint64_t)1 << 31)

/* Keys are printed as text when they are printable, else in hex, and cut short when long. */
const char *kiln_data_key_string(const void *key, size_t len, char *buf, size_t n) {
  const unsigned char *k = key;
  bool printable = len > 0;
  for (size_t i = 0; i < len && printable; i++) printable = k[i] >= 0x20 && k[i] < 0x7f;
  size_t o = 0;
  if (printable) {
    snprintf(buf, n, "%.*s%s", (int)(len > 64 ? 64 : len), (const char *)k, len > 64 ? "..." : "");
  } else {
    o = (size_t)snprintf(buf, n, "0x");
    for (size_t i = 0; i < len && i < 32 && o + 3 < n; i++)
      o += (size_t)snprintf(buf + o, n - o, "%02x", k[i]);
    if (len > 32 && o + 4 < n) snprintf(buf + o, n - o, "...");
  }
  return buf;
}

/* Product of a record's dimensions, or 0 when one is not positive or the product is absurd. */
static uint64_t shape_count(int64_t c, int64_t h, int64_t w) {
  if (c <= 0 || h <= 0 || w <= 0) return 0;
  uint64_t n = (uint64_t)c * (uint64_t)h; /* < 2^62 */
  if (n > DATUM_MAX_VALUES) return 0;
  n *= (uint64_t)w;
  return n > DATUM_MAX_VALUES ? 0 : n;
}

int kiln_data_remove_lmdb_dir(const char *dir) {
  size_t len = strlen(dir) + 16;
  char *p = malloc(len);
  if (!p) return ENOMEM;
  static const char *const files[] = {"data.mdb", "lock.mdb"};
  for (size_t i = 0; i < 2; i++) {
    snprintf(p, len, "%s/%s", dir, files[i]);
    if (unlink(p) != 0 && errno != ENOENT && errno != ENOTDIR) {
      int e = errno;
      free(p);
      return e;
    }
  }
  free(p);
  if (rmdir(dir) != 0 && errno != ENOENT) return errno;
  return 0;
}

/* ---- reader ------------------------------------------------------------------------------ */

struct kiln_datum_db {
  char *path;
  kiln_ldb *ldb; /* a LevelDB; else the LMDB fields below */
  MDB_env *env;
  MDB_txn *txn; /* one read-only snapshot for the life of the handle */
  MDB_cursor *cursor;
  uint64_t size;
  uint64_t position; /* records consumed */
  uint64_t index;    /* record under the cursor, in [0, size) */
  ProtobufCMessage *current; /* the last record read: a Datum, or the AnnotatedDatum holding it */
  kiln_anno_records *anno;   /* annotated mode (annotated_db.c), else NULL */
  bool have_shape;
  int channels, height, width;
  char *last_key;
  size_t last_key_cap;
  MDB_dbi dbi;
  MDB_val *keys; /* key of each record in key order, built on the first random read; the
                    pointers stay valid for the read transaction's life */
  kiln_image image; /* the last encoded record, decoded */
  kiln_image_color color;
};

static int mdb_failure(const kiln_datum_db *db, int rc, const char *what) {
  int code = rc > 0 && rc != ENOENT ? KILN_ERR_IO : KILN_ERR_DATA;
  return kiln_errorf(code, "%s: %s: %s", db->path, what, mdb_strerror(rc));
}

/* Whether `dir`/`name` exists (errno is left as stat set it). */
static bool has_file(const char *dir, const char *name) {
  char p[4200];
  struct stat st;
  return (size_t)snprintf(p, sizeof p, "%s/%s", dir, name) < sizeof p && stat(p, &st) == 0;
}

static int open_leveldb(const char *path, kiln_datum_db **out) {
  kiln_datum_db *db = calloc(1, sizeof *db);
  if (!db || !(db->path = kiln_strdup(path))) {
    free(db);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  int rc = kiln_ldb_open(path, &db->ldb, &db->size);
  if (rc) {
    kiln_datum_db_close(db);
    return rc;
  }
  *out = db;
  return KILN_OK;
}

static int open_lmdb(const char *path, kiln_datum_db **out);

int kiln_datum_db_open(const char *path, kiln_datum_db **out) {
  return kiln_datum_db_open_as(path, KILN_DB_ANY, out);
}

int kiln_datum_db_open_as(const char *path, kiln_db_backend backend, kiln_datum_db **out) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot open %s: %s", path,
                       backend == KILN_DB_LEVELDB ? "LevelDB" : "LMDB", strerror(errno));
  const bool dir = S_ISDIR(st.st_mode), mdb = !dir || has_file(path, "data.mdb");
  const bool leveldb = dir && !mdb && has_file(path, "CURRENT");
  if (backend == KILN_DB_LMDB && leveldb)
    return kiln_errorf(KILN_ERR_DATA,
                       "%s: holds a LevelDB database (CURRENT, no data.mdb), but backend LMDB was "
                       "asked for",
                       path);
  if (backend == KILN_DB_LEVELDB && !leveldb)
    return kiln_errorf(KILN_ERR_DATA, "%s: %s, but backend LEVELDB was asked for", path,
                       S_ISREG(st.st_mode) ? "a file, so an LMDB database"
                       : mdb               ? "holds an LMDB database (data.mdb)"
                       : dir ? "not a LevelDB database (no CURRENT inside)"
                             : "not a LevelDB database (not a directory)");
  return leveldb ? open_leveldb(path, out) : open_lmdb(path, out);
}

static int open_lmdb(const char *path, kiln_datum_db **out) {
  struct stat st;
  if (stat(path, &st) != 0)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot open LMDB: %s", path, strerror(errno));
  unsigned flags = MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS;
  if (S_ISREG(st.st_mode)) {
    flags |= MDB_NOSUBDIR;
    if (st.st_size == 0)
      return kiln_errorf(KILN_ERR_DATA, "%s: not an LMDB database (empty file)", path);
  } else if (S_ISDIR(st.st_mode)) {
    size_t len = strlen(path) + 16;
    char *data = malloc(len);
    if (!data) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
    snprintf(data, len, "%s/data.mdb", path);
    int missing = stat(data, &st) != 0;
    int e = errno;
    free(data);
    if (missing && e == ENOENT)
      return kiln_errorf(KILN_ERR_DATA, "%s: not an LMDB database (no data.mdb inside)", path);
    if (missing) return kiln_errorf(KILN_ERR_IO, "%s/data.mdb: %s", path, strerror(e));
    if (st.st_size == 0)
      return kiln_errorf(KILN_ERR_DATA, "%s: not an LMDB database (data.mdb is empty)", path);
  } else {
    return kiln_errorf(KILN_ERR_DATA, "%s: not an LMDB database (neither a directory nor a file)",
                       path);
  }

  const off_t data_size = st.st_size; /* of data.mdb, or of the file itself */
  kiln_datum_db *db = calloc(1, sizeof *db);
  if (!db || !(db->path = kiln_strdup(path))) {
    free(db);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  int rc = mdb_env_create(&db->env);
  if (rc) {
    db->env = NULL;
    rc = mdb_failure(db, rc, "cannot create LMDB environment");
    goto fail;
  }
  rc = mdb_env_open(db->env, path, flags, 0664);
  if (rc) {
    /* Permission and device errors are about access; anything else means the bytes are wrong. */
    int code = rc == EACCES || rc == EPERM || rc == EIO ? KILN_ERR_IO
               : rc == ENOMEM                           ? KILN_ERR_NOMEM
                                                        : KILN_ERR_DATA;
    rc = kiln_errorf(code, "%s: not a readable LMDB database: %s", path, mdb_strerror(rc));
    goto fail;
  }
  /* LMDB maps the file and trusts its meta page: a file cut short (a copy that stopped, a full
   * disk) would fault with SIGBUS on the first page past its end. The pages the meta page says
   * are in use must all be in the file. */
  MDB_envinfo info;
  MDB_stat est;
  if (mdb_env_info(db->env, &info) == 0 && mdb_env_stat(db->env, &est) == 0) {
    const uint64_t need = ((uint64_t)info.me_last_pgno + 1) * est.ms_psize;
    if (need > (uint64_t)data_size) {
      rc = kiln_errorf(KILN_ERR_DATA,
                       "%s: truncated LMDB database: its pages need %llu bytes, the file has %llu",
                       path, (unsigned long long)need, (unsigned long long)data_size);
      goto fail;
    }
  }
  rc = mdb_txn_begin(db->env, NULL, MDB_RDONLY, &db->txn);
  if (rc) {
    db->txn = NULL;
    rc = mdb_failure(db, rc, "cannot begin a read transaction");
    goto fail;
  }
  MDB_dbi dbi;
  rc = mdb_dbi_open(db->txn, NULL, 0, &dbi);
  db->dbi = dbi;
  if (rc) {
    rc = mdb_failure(db, rc, "cannot open the main database");
    goto fail;
  }
  MDB_stat ms;
  rc = mdb_stat(db->txn, dbi, &ms);
  if (rc) {
    rc = mdb_failure(db, rc, "cannot read database statistics");
    goto fail;
  }
  db->size = ms.ms_entries;
  if (db->size == 0) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s: the database holds no records", path);
    goto fail;
  }
  rc = mdb_cursor_open(db->txn, dbi, &db->cursor);
  if (rc) {
    db->cursor = NULL;
    rc = mdb_failure(db, rc, "cannot open a cursor");
    goto fail;
  }
  MDB_val k, v;
  rc = mdb_cursor_get(db->cursor, &k, &v, MDB_FIRST);
  if (rc) {
    rc = mdb_failure(db, rc, "cannot read the first record");
    goto fail;
  }
  *out = db;
  return KILN_OK;
fail:
  kiln_datum_db_close(db);
  return rc;
}

uint64_t kiln_datum_db_size(const kiln_datum_db *db) { return db->size; }

uint64_t kiln_datum_db_position(const kiln_datum_db *db) { return db->position; }

const char *kiln_datum_db_last_key(const kiln_datum_db *db) {
  return db->last_key ? db->last_key : "";
}

kiln_anno_records *kiln_datum_db_anno(const kiln_datum_db *db) { return db->anno; }
void kiln_datum_db_set_anno(kiln_datum_db *db, kiln_anno_records *a) { db->anno = a; }

/* Moves the cursor `steps` records with `op` (MDB_NEXT or MDB_PREV). */
static int cursor_walk(kiln_datum_db *db, MDB_cursor_op op, uint64_t steps) {
  MDB_val k, v;
  for (uint64_t i = 0; i < steps; i++) {
    int rc = mdb_cursor_get(db->cursor, &k, &v, op);
    if (rc) return mdb_failure(db, rc, "cannot move the cursor");
  }
  return KILN_OK;
}

int kiln_datum_db_seek(kiln_datum_db *db, uint64_t position) {
  uint64_t target = position % db->size, here = db->index;
  if (db->ldb) { /* the iterator moves to it on the next read */
    db->index = target;
    db->position = position;
    return KILN_OK;
  }
  /* Walk from whichever of the current record, the first or the last is nearest. */
  uint64_t from_first = target, from_last = db->size - 1 - target;
  uint64_t from_here = target >= here ? target - here : here - target;
  MDB_val k, v;
  int rc;
  if (from_here <= from_first && from_here <= from_last) {
    KILN_TRY(cursor_walk(db, target >= here ? MDB_NEXT : MDB_PREV, from_here));
  } else if (from_first <= from_last) {
    if ((rc = mdb_cursor_get(db->cursor, &k, &v, MDB_FIRST))) return mdb_failure(db, rc, "seek");
    KILN_TRY(cursor_walk(db, MDB_NEXT, from_first));
  } else {
    if ((rc = mdb_cursor_get(db->cursor, &k, &v, MDB_LAST))) return mdb_failure(db, rc, "seek");
    KILN_TRY(cursor_walk(db, MDB_PREV, from_last));
  }
  db->index = target;
  db->position = position;
  return KILN_OK;
}

void kiln_datum_db_set_color(kiln_datum_db *db, kiln_image_color color) { db->color = color; }

/* An encoded record: its image decoded into db->image. Caffe ignores the shape fields of such a
 * record (convert_imageset leaves them unset), and so does kiln. */
static int decode_encoded(kiln_datum_db *db, const Caffe__Datum *m, const char *key,
                          kiln_datum *out) {
  char what[400];
  snprintf(what, sizeof what, "%s: record %s", db->path, key);
  if (!m->has_data || m->data.len == 0)
    return kiln_errorf(KILN_ERR_DATA, "%s: encoded, but holds no image bytes", what);
  KILN_TRY(kiln_image_decode(m->data.data, m->data.len, db->color, 0, 0, what, &db->image));
  memset(out, 0, sizeof *out);
  out->channels = db->image.channels;
  out->height = db->image.height;
  out->width = db->image.width;
  out->label = m->label;
  out->u8 = db->image.data;
  return KILN_OK;
}

/* Checks a decoded record; fills `out` on success. */
static int check_datum(kiln_datum_db *db, const Caffe__Datum *m, const char *key, kiln_datum *out) {
  if (m->has_encoded && m->encoded) return decode_encoded(db, m, key, out);
  uint64_t n = shape_count(m->channels, m->height, m->width);
  if (n == 0)
    return kiln_errorf(KILN_ERR_DATA,
                       "%s: record %s: invalid shape channels %d x height %d x width %d", db->path,
                       key, (int)m->channels, (int)m->height, (int)m->width);
  memset(out, 0, sizeof *out);
  if (m->has_data && m->data.len > 0) {
    if (m->data.len != n)
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: record %s: data holds %zu bytes, but channels x height x width = "
                         "%dx%dx%d = %llu",
                         db->path, key, m->data.len, (int)m->channels, (int)m->height,
                         (int)m->width, (unsigned long long)n);
    out->u8 = m->data.data;
  } else if (m->n_float_data > 0) {
    if (m->n_float_data != n)
      return kiln_errorf(
          KILN_ERR_DATA,
          "%s: record %s: float_data holds %zu values, but channels x height x width = "
          "%dx%dx%d = %llu",
          db->path, key, m->n_float_data, (int)m->channels, (int)m->height, (int)m->width,
          (unsigned long long)n);
    out->f32 = m->float_data;
  } else {
    return kiln_errorf(KILN_ERR_DATA, "%s: record %s: holds neither data nor float_data", db->path,
                       key);
  }
  if (db->have_shape && !db->anno && /* detection images differ in size */
      (m->channels != db->channels || m->height != db->height || m->width != db->width))
    return kiln_errorf(KILN_ERR_DATA,
                       "%s: record %s: shape %dx%dx%d differs from the earlier records' %dx%dx%d",
                       db->path, key, (int)m->channels, (int)m->height, (int)m->width, db->channels,
                       db->height, db->width);
  out->channels = m->channels;
  out->height = m->height;
  out->width = m->width;
  out->label = m->label;
  return KILN_OK;
}

/* Decodes and checks the record (k, v); on success it becomes db->current and its key
 * db->last_key. */
static int decode_record(kiln_datum_db *db, const void *k, size_t k_len, const void *v,
                         size_t v_len, kiln_datum *out) {
  char key[160];
  kiln_data_key_string(k, k_len, key, sizeof key);
  ProtobufCMessage *msg;
  const Caffe__Datum *m;
  if (db->anno) {
    KILN_TRY(kiln_anno_unpack(db->anno, db->path, key, v, v_len, &msg, &m));
  } else {
    Caffe__Datum *datum = caffe__datum__unpack(NULL, v_len, v);
    if (!datum) return kiln_errorf(KILN_ERR_DATA, "%s: record %s: not a Datum", db->path, key);
    msg = &datum->base, m = datum;
  }
  kiln_datum d;
  int rc = check_datum(db, m, key, &d);
  if (rc) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc;
  }
  if (db->last_key_cap < k_len + 1) {
    char *grown = realloc(db->last_key, k_len + 1);
    if (!grown) {
      protobuf_c_message_free_unpacked(msg, NULL);
      return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", db->path);
    }
    db->last_key = grown;
    db->last_key_cap = k_len + 1;
  }
  memcpy(db->last_key, k, k_len);
  db->last_key[k_len] = '\0';
  if (db->current) protobuf_c_message_free_unpacked(db->current, NULL);
  db->current = msg;
  if (!db->have_shape && !(m->has_encoded && m->encoded)) {
    db->have_shape = true;
    db->channels = d.channels;
    db->height = d.height;
    db->width = d.width;
  }
  *out = d;
  return KILN_OK;
}

int kiln_datum_db_next(kiln_datum_db *db, kiln_datum *out) {
  if (db->ldb) {
    kiln_ldb_rec r;
    KILN_TRY(kiln_ldb_record(db->ldb, KILN_LDB_SEQUENTIAL, db->index, &r));
    KILN_TRY(decode_record(db, r.key, r.key_len, r.value, r.value_len, out));
  } else {
    MDB_val k, v;
    int rc = mdb_cursor_get(db->cursor, &k, &v, MDB_GET_CURRENT);
    if (rc) return mdb_failure(db, rc, "cannot read a record");
    KILN_TRY(decode_record(db, k.mv_data, k.mv_size, v.mv_data, v.mv_size, out));
    /* on error the cursor has not moved */
    rc = mdb_cursor_get(db->cursor, &k, &v, db->index + 1 < db->size ? MDB_NEXT : MDB_FIRST);
    if (rc) return mdb_failure(db, rc, "cannot advance the cursor");
  }
  db->index = db->index + 1 < db->size ? db->index + 1 : 0;
  db->position++;
  return KILN_OK;
}

/* The key of every record in key order (one pass over the keys), for random access. */
static int build_key_index(kiln_datum_db *db) {
  if (db->keys) return KILN_OK;
  MDB_val *keys = malloc(sizeof *keys * (size_t)db->size);
  if (!keys) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the key index", db->path);
  MDB_cursor *c;
  int rc = mdb_cursor_open(db->txn, db->dbi, &c);
  if (rc) {
    free(keys);
    return mdb_failure(db, rc, "cannot open a cursor");
  }
  MDB_val k, v;
  uint64_t n = 0;
  for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0 && n < db->size;
       rc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
    keys[n++] = k;
  mdb_cursor_close(c);
  if (n != db->size) {
    free(keys);
    return kiln_errorf(KILN_ERR_DATA, "%s: found %llu records, the database says %llu", db->path,
                       (unsigned long long)n, (unsigned long long)db->size);
  }
  db->keys = keys;
  return KILN_OK;
}

/* The raw key and value of record `index` (< size) in key order, without moving the sequential
 * cursor; valid until the next random read. */
static int raw_record(kiln_datum_db *db, uint64_t index, kiln_ldb_rec *r) {
  if (db->ldb) return kiln_ldb_record(db->ldb, KILN_LDB_RANDOM, index, r);
  KILN_TRY(build_key_index(db));
  MDB_val k = db->keys[index], v;
  int rc = mdb_get(db->txn, db->dbi, &k, &v);
  if (rc) return mdb_failure(db, rc, "cannot read a record");
  *r = (kiln_ldb_rec){.key = k.mv_data, .key_len = k.mv_size, .value = v.mv_data,
                      .value_len = v.mv_size};
  return KILN_OK;
}

int kiln_datum_db_read(kiln_datum_db *db, uint64_t index, kiln_datum *out) {
  if (index >= db->size)
    return kiln_errorf(KILN_ERR_INVALID, "%s: record index %llu out of range (%llu records)",
                       db->path, (unsigned long long)index, (unsigned long long)db->size);
  kiln_ldb_rec r;
  KILN_TRY(raw_record(db, index, &r));
  return decode_record(db, r.key, r.key_len, r.value, r.value_len, out);
}

int kiln_datum_db_fingerprint(kiln_datum_db *db, int samples, uint8_t digest[32]) {
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  uint64_t size = db->size;
  kiln_sha256_update(&h, &size, sizeof size);
  uint64_t n = samples > 0 && (uint64_t)samples < size ? (uint64_t)samples : size;
  for (uint64_t i = 0; i < n; i++) {
    /* evenly spread, the first and the last record among them */
    uint64_t index = n > 1 ? i * (size - 1) / (n - 1) : 0;
    kiln_ldb_rec r;
    KILN_TRY(raw_record(db, index, &r));
    uint64_t len[2] = {r.key_len, r.value_len};
    kiln_sha256_update(&h, len, sizeof len);
    kiln_sha256_update(&h, r.key, r.key_len);
    kiln_sha256_update(&h, r.value, r.value_len);
  }
  kiln_sha256_final(&h, digest);
  return KILN_OK;
}

void kiln_datum_db_close(kiln_datum_db *db) {
  if (!db) return;
  if (db->current) protobuf_c_message_free_unpacked(db->current, NULL);
  kiln_anno_records_free(db->anno);
  kiln_image_free(&db->image);
  free(db->keys);
  kiln_ldb_close(db->ldb);
  if (db->cursor) mdb_cursor_close(db->cursor);
  if (db->txn) mdb_txn_abort(db->txn);
  if (db->env) mdb_env_close(db->env);
  free(db->last_key);
  free(db->path);
  free(db);
}

/* ---- writer ------------------------------------------------------------------------------ */

#define WRITER_INITIAL_MAP ((size_t)16 << 20)
#define WRITER_MAX_MAP ((size_t)1 << 40)
#define WRITER_CHUNK_RECORDS 1000
#define WRITER_CHUNK_BYTES ((size_t)64 << 20)

/* Records put since the last commit, kept so that they can be written again into a larger map
 * when LMDB reports MDB_MAP_FULL (which spoils the whole transaction). */
typedef struct pending_record {
  size_t key_off, key_len, val_off, val_len;
} pending_record;

struct kiln_datum_writer {
  char *final_path, *tmp_path;
  bool leveldb;         /* writing a LevelDB; else the LMDB fields below */
  kiln_ldb_writer *ldb; /* until it is finished */
  MDB_env *env;
  MDB_txn *txn; /* NULL between chunks */
  MDB_dbi dbi;
  size_t map_size;
  uint8_t *arena;
  size_t arena_len, arena_cap;
  pending_record *pending;
  size_t n_pending, pending_cap;
};

static int writer_mdb_failure(const kiln_datum_writer *w, int rc, const char *what) {
  int code = rc == ENOMEM             ? KILN_ERR_NOMEM
             : rc == ENOSPC || rc > 0 ? KILN_ERR_IO
                                      : KILN_ERR_INTERNAL;
  return kiln_errorf(code, "%s: %s: %s", w->tmp_path, what, mdb_strerror(rc));
}

static void writer_free(kiln_datum_writer *w) {
  free(w->arena);
  free(w->pending);
  free(w->final_path);
  free(w->tmp_path);
  free(w);
}

static int writer_begin(kiln_datum_writer *w) {
  if (w->txn) return KILN_OK;
  int rc = mdb_txn_begin(w->env, NULL, 0, &w->txn);
  if (rc) {
    w->txn = NULL;
    return writer_mdb_failure(w, rc, "cannot begin a write transaction");
  }
  return KILN_OK;
}

static int writer_grow(kiln_datum_writer *w) {
  if (w->map_size >= WRITER_MAX_MAP)
    return kiln_errorf(KILN_ERR_NOMEM, "%s: database would exceed %zu GiB", w->tmp_path,
                       WRITER_MAX_MAP >> 30);
  int rc = mdb_env_set_mapsize(w->env, w->map_size * 2);
  if (rc) return writer_mdb_failure(w, rc, "cannot grow the map");
  w->map_size *= 2;
  return KILN_OK;
}

/* Rewrites the pending records into a fresh transaction, growing the map until they fit. */
static int writer_replay(kiln_datum_writer *w) {
  for (;;) {
    if (w->txn) {
      mdb_txn_abort(w->txn);
      w->txn = NULL;
    }
    KILN_TRY(writer_grow(w));
    KILN_TRY(writer_begin(w));
    int rc = 0;
    for (size_t i = 0; i < w->n_pending && !rc; i++) {
      const pending_record *p = &w->pending[i];
      MDB_val k = {p->key_len, w->arena + p->key_off}, v = {p->val_len, w->arena + p->val_off};
      rc = mdb_put(w->txn, w->dbi, &k, &v, 0);
    }
    if (rc == MDB_MAP_FULL) continue;
    if (rc) return writer_mdb_failure(w, rc, "cannot write a record");
    return KILN_OK;
  }
}

/* Commits the pending chunk; afterwards doubles the map when it is over half full, so that the
 * next chunk rarely has to be replayed. */
static int writer_flush(kiln_datum_writer *w) {
  if (!w->txn) return KILN_OK;
  for (;;) {
    int rc = mdb_txn_commit(w->txn);
    w->txn = NULL; /* freed by commit whether or not it succeeded */
    if (rc == MDB_MAP_FULL) {
      KILN_TRY(writer_replay(w));
      continue;
    }
    if (rc) return writer_mdb_failure(w, rc, "cannot commit");
    break;
  }
  w->n_pending = 0;
  w->arena_len = 0;
  MDB_envinfo info;
  MDB_stat st;
  if (mdb_env_info(w->env, &info) == 0 && mdb_env_stat(w->env, &st) == 0) {
    size_t used = (info.me_last_pgno + 1) * (size_t)st.ms_psize;
    if (used > w->map_size / 2) KILN_TRY(writer_grow(w));
  }
  return KILN_OK;
}

int kiln_datum_writer_open(const char *final_path, kiln_datum_writer **out) {
  return kiln_datum_writer_open_as(final_path, KILN_DB_LMDB, out);
}

int kiln_datum_writer_open_as(const char *final_path, kiln_db_backend backend,
                              kiln_datum_writer **out) {
  *out = NULL;
  const bool leveldb = backend == KILN_DB_LEVELDB;
  if (!final_path || !final_path[0])
    return kiln_errorf(KILN_ERR_INVALID, "the output path is empty; name the %s to write",
                       leveldb ? "LevelDB" : "LMDB");
  struct stat st;
  if (stat(final_path, &st) == 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: already exists; remove it or choose another output path", final_path);
  if (errno != ENOENT) return kiln_errorf(KILN_ERR_IO, "%s: %s", final_path, strerror(errno));

  kiln_datum_writer *w = calloc(1, sizeof *w);
  size_t len = strlen(final_path) + 8;
  if (!w || !(w->final_path = kiln_strdup(final_path)) || !(w->tmp_path = malloc(len))) {
    if (w) writer_free(w);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", final_path);
  }
  snprintf(w->tmp_path, len, "%s.tmp", final_path);
  /* What an interrupted run leaves there is a folder; anything else (a link to another database,
   * whose files the clean-up below would delete through it, a file, a node) is not ours. */
  if (lstat(w->tmp_path, &st) == 0 && !S_ISDIR(st.st_mode)) {
    int rc = kiln_errorf(KILN_ERR_INVALID, "%s: exists and is no folder (a link, a file or a "
                         "node), so no database an interrupted run left: remove it or choose "
                         "another output path", w->tmp_path);
    writer_free(w);
    return rc;
  }
  if ((w->leveldb = leveldb)) {
    int rc = kiln_ldb_destroy(w->tmp_path); /* left by an interrupted run */
    if (!rc) rc = kiln_ldb_writer_open(w->tmp_path, &w->ldb);
    if (rc) writer_free(w);
    else *out = w;
    return rc;
  }
  int e = kiln_data_remove_lmdb_dir(w->tmp_path); /* left by an interrupted run */
  if (e) {
    int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot remove the leftover temporary database: %s",
                         w->tmp_path, strerror(e));
    writer_free(w);
    return rc;
  }
  if (mkdir(w->tmp_path, 0775) != 0) {
    int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", w->tmp_path, strerror(errno));
    writer_free(w);
    return rc;
  }
  int rc = mdb_env_create(&w->env);
  if (rc) {
    w->env = NULL;
    rc = writer_mdb_failure(w, rc, "cannot create LMDB environment");
    goto fail;
  }
  w->map_size = WRITER_INITIAL_MAP;
  if ((rc = mdb_env_set_mapsize(w->env, w->map_size))) {
    rc = writer_mdb_failure(w, rc, "cannot set the map size");
    goto fail;
  }
  /* No syncs per chunk: the temporary is useless until commit, which syncs once. */
  if ((rc = mdb_env_open(w->env, w->tmp_path, MDB_NOSYNC | MDB_NOMETASYNC, 0664))) {
    rc = writer_mdb_failure(w, rc, "cannot open LMDB environment");
    goto fail;
  }
  if ((rc = writer_begin(w))) goto fail;
  if ((rc = mdb_dbi_open(w->txn, NULL, 0, &w->dbi))) {
    rc = writer_mdb_failure(w, rc, "cannot open the main database");
    goto fail;
  }
  *out = w;
  return KILN_OK;
fail:
  kiln_datum_writer_abort(w);
  return rc;
}

static int arena_reserve(kiln_datum_writer *w, size_t more) {
  if (w->arena_len + more <= w->arena_cap) return KILN_OK;
  size_t cap = w->arena_cap ? w->arena_cap : 1 << 16;
  while (cap < w->arena_len + more) cap *= 2;
  uint8_t *grown = realloc(w->arena, cap);
  if (!grown) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", w->tmp_path);
  w->arena = grown;
  w->arena_cap = cap;
  return KILN_OK;
}

/* A key the database takes: LMDB's are 1 to its maximum bytes, LevelDB's any but empty. */
static int check_key(const kiln_datum_writer *w, const char *key, size_t *key_len) {
  *key_len = strlen(key);
  if (w->leveldb) {
    if (*key_len == 0) return kiln_errorf(KILN_ERR_INVALID, "%s: empty key", w->final_path);
    return KILN_OK;
  }
  if (*key_len == 0 || *key_len > (size_t)mdb_env_get_maxkeysize(w->env))
    return kiln_errorf(KILN_ERR_INVALID, "%s: key of %zu bytes; LMDB takes 1 to %d", w->final_path,
                       *key_len, mdb_env_get_maxkeysize(w->env));
  return KILN_OK;
}

int kiln_datum_writer_put(kiln_datum_writer *w, const char *key, const kiln_datum *d) {
  size_t key_len;
  KILN_TRY(check_key(w, key, &key_len));
  uint64_t n = shape_count(d->channels, d->height, d->width);
  if (n == 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: record '%s': invalid shape %dx%dx%d", w->final_path,
                       key, d->channels, d->height, d->width);
  if (!d->u8 == !d->f32)
    return kiln_errorf(KILN_ERR_INVALID, "%s: record '%s': give exactly one of u8 and f32",
                       w->final_path, key);
  Caffe__Datum m = CAFFE__DATUM__INIT;
  m.has_channels = m.has_height = m.has_width = m.has_label = 1;
  m.channels = d->channels;
  m.height = d->height;
  m.width = d->width;
  m.label = d->label;
  if (d->u8) {
    m.has_data = 1;
    m.data.len = (size_t)n;
    m.data.data = (uint8_t *)d->u8;
  } else {
    m.n_float_data = (size_t)n;
    m.float_data = (float *)d->f32;
  }
  return kiln_datum_writer_put_message(w, key, &m.base);
}

int kiln_datum_writer_put_encoded(kiln_datum_writer *w, const char *key, const void *bytes,
                                  size_t n, int label) {
  size_t key_len;
  KILN_TRY(check_key(w, key, &key_len));
  if (n == 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: record '%s': no image bytes", w->final_path, key);
  Caffe__Datum m = CAFFE__DATUM__INIT;
  m.has_label = m.has_data = m.has_encoded = 1;
  m.label = label;
  m.encoded = 1;
  m.data.len = n;
  m.data.data = (uint8_t *)bytes;
  return kiln_datum_writer_put_message(w, key, &m.base);
}

/* Packs `m` into the pending chunk and puts it into the transaction. */
int kiln_datum_writer_put_message(kiln_datum_writer *w, const char *key,
                                  const ProtobufCMessage *m) {
  size_t key_len;
  KILN_TRY(check_key(w, key, &key_len));
  size_t val_len = protobuf_c_message_get_packed_size(m);
  if (w->leveldb) { /* the batch keeps its own copy */
    w->arena_len = 0;
    KILN_TRY(arena_reserve(w, val_len));
    return kiln_ldb_writer_put(w->ldb, key, key_len, w->arena,
                               protobuf_c_message_pack(m, w->arena));
  }
  KILN_TRY(arena_reserve(w, key_len + val_len));
  if (w->n_pending == w->pending_cap) {
    size_t cap = w->pending_cap ? 2 * w->pending_cap : 256;
    pending_record *grown = realloc(w->pending, cap * sizeof *grown);
    if (!grown) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", w->tmp_path);
    w->pending = grown;
    w->pending_cap = cap;
  }
  pending_record *p = &w->pending[w->n_pending];
  p->key_off = w->arena_len;
  p->key_len = key_len;
  memcpy(w->arena + w->arena_len, key, key_len);
  p->val_off = w->arena_len + key_len;
  p->val_len = protobuf_c_message_pack(m, w->arena + p->val_off);
  w->arena_len += key_len + p->val_len;
  w->n_pending++;

  KILN_TRY(writer_begin(w));
  MDB_val k = {key_len, w->arena + p->key_off}, v = {p->val_len, w->arena + p->val_off};
  int rc = mdb_put(w->txn, w->dbi, &k, &v, 0);
  if (rc == MDB_MAP_FULL) {
    KILN_TRY(writer_replay(w)); /* includes this record */
  } else if (rc) {
    return writer_mdb_failure(w, rc, "cannot write a record");
  }
  if (w->n_pending >= WRITER_CHUNK_RECORDS || w->arena_len >= WRITER_CHUNK_BYTES)
    KILN_TRY(writer_flush(w));
  return KILN_OK;
}

/* Makes the rename durable (best effort: some file systems cannot fsync a directory). */
static void sync_parent_dir(const char *path) {
  char *copy = kiln_strdup(path);
  if (!copy) return;
  char *slash = strrchr(copy, '/');
  const char *dir = ".";
  if (slash == copy) {
    dir = "/";
  } else if (slash) {
    *slash = '\0';
    dir = copy;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  free(copy);
}

int kiln_datum_writer_commit(kiln_datum_writer *w) {
  int rc;
  if (w->leveldb) {
    rc = kiln_ldb_writer_finish(w->ldb); /* frees it */
    w->ldb = NULL;
    if (rc) {
      kiln_datum_writer_abort(w);
      return rc;
    }
  } else {
    if ((rc = writer_flush(w))) {
      kiln_datum_writer_abort(w);
      return rc;
    }
    if ((rc = mdb_env_sync(w->env, 1))) {
      rc = writer_mdb_failure(w, rc, "cannot sync");
      kiln_datum_writer_abort(w);
      return rc;
    }
    mdb_env_close(w->env);
    w->env = NULL;
  }
  struct stat st;
  if (stat(w->final_path, &st) == 0) {
    rc = kiln_errorf(KILN_ERR_INVALID,
                     "%s: appeared while the database was being written; left as it is",
                     w->final_path);
    kiln_datum_writer_abort(w);
    return rc;
  }
  if (rename(w->tmp_path, w->final_path) != 0) {
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot rename %s into place: %s", w->final_path, w->tmp_path,
                     strerror(errno));
    kiln_datum_writer_abort(w);
    return rc;
  }
  sync_parent_dir(w->final_path);
  writer_free(w);
  return KILN_OK;
}

void kiln_datum_writer_abort(kiln_datum_writer *w) {
  if (!w) return;
  if (w->txn) mdb_txn_abort(w->txn);
  if (w->env) mdb_env_close(w->env);
  if (w->ldb) kiln_ldb_writer_discard(w->ldb);
  if (w->leveldb)
    (void)kiln_ldb_destroy(w->tmp_path);
  else
    (void)kiln_data_remove_lmdb_dir(w->tmp_path);
  writer_free(w);
}

int kiln_data_write_images(const char *out_path, kiln_db_backend backend, const char *source,
                           uint32_t n, int key_digits, int channels, int height, int width,
                           const uint8_t *pixels, const uint8_t *labels) {
  kiln_datum_writer *w = NULL;
  KILN_TRY(kiln_datum_writer_open_as(out_path, backend, &w));
  const size_t bytes = (size_t)channels * (size_t)height * (size_t)width;
  for (uint32_t i = 0; i < n; i++) {
    char key[16];
    snprintf(key, sizeof key, "%0*u", key_digits, (unsigned)i);
    kiln_datum d = {.channels = channels,
                    .height = height,
                    .width = width,
                    .label = labels[i],
                    .u8 = pixels + (size_t)i * bytes};
    int rc = kiln_datum_writer_put(w, key, &d);
    if (rc) {
      kiln_datum_writer_abort(w);
      return kiln_error_context(rc, "converting %s: ", source);
    }
  }
  return kiln_datum_writer_commit(w); /* frees it either way */
}
