/* LevelDB databases of Datum records: a database written with LevelDB's own calls as Caffe leaves
 * one (keys put out of order, one replaced, the records still in the log) read in key order,
 * wrapping, by seek and by index, with the database's files byte for byte as they were and two
 * handles open at once; kiln's LevelDB writer against its LMDB writer (the same records, the
 * same fingerprint); damaged, missing and empty databases, a log cut short, bad records and a
 * backend that is not what the path holds (to the reader and to the Data layer), refused naming
 * the path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <leveldb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "layer_test.h"
#include "kiln/core.h"
#include "kiln/data.h"
#include "kiln/proto.h"

static int setup_dir(void **state) { return tmpdir_setup(state, "ldb"); }

/* Record r: 1 x 2 x 3 bytes 10r + j, label 100 + r. */
enum { NREC = 7, RC = 1, RH = 2, RW = 3 };

static void record_pixels(int r, uint8_t px[RC * RH * RW]) {
  for (int j = 0; j < RC * RH * RW; j++) px[j] = (uint8_t)(10 * r + j);
}

/* The Datum of record r packed as kiln's writers pack it; the caller frees it. */
static uint8_t *packed_record(int r, size_t *len) {
  uint8_t px[RC * RH * RW];
  record_pixels(r, px);
  Caffe__Datum m = CAFFE__DATUM__INIT;
  m.has_channels = m.has_height = m.has_width = m.has_label = m.has_data = 1;
  m.channels = RC, m.height = RH, m.width = RW, m.label = 100 + r;
  m.data.len = sizeof px;
  m.data.data = px;
  *len = caffe__datum__get_packed_size(&m);
  uint8_t *buf = malloc(*len);
  assert_non_null(buf);
  caffe__datum__pack(&m, buf);
  return buf;
}

static leveldb_t *raw_open(const char *path) {
  leveldb_options_t *o = leveldb_options_create();
  leveldb_options_set_create_if_missing(o, 1);
  char *err = NULL;
  leveldb_t *db = leveldb_open(o, path, &err);
  leveldb_options_destroy(o);
  assert_null(err);
  return db;
}

static void raw_put(leveldb_t *db, const char *key, const void *value, size_t len) {
  leveldb_writeoptions_t *w = leveldb_writeoptions_create();
  char *err = NULL;
  leveldb_put(db, w, key, strlen(key), value, len, &err);
  leveldb_writeoptions_destroy(w);
  assert_null(err);
}

/* Records 0..n-1 keyed "%08d", put in a scrambled order, record 2 first put with record 5's
 * value then replaced; closed without compaction, so the records are in the log, as Caffe's
 * convert tools leave a database. */
static void write_caffe_like(const char *path, int n) {
  leveldb_t *db = raw_open(path);
  size_t len;
  uint8_t *v = packed_record(5, &len);
  raw_put(db, "00000002", v, len);
  free(v);
  for (int i = 0; i < n; i++) {
    int r = (i * 3 + 1) % n; /* n = 7: 1 4 0 3 6 2 5 */
    char key[16];
    snprintf(key, sizeof key, "%08d", r);
    v = packed_record(r, &len);
    raw_put(db, key, v, len);
    free(v);
  }
  leveldb_close(db);
}

/* Every file of a folder, name and bytes, in name order, into one buffer; the caller frees it. */
static char *folder_bytes(const char *dir, size_t *total) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  assert_true(n > 2);
  char *out = NULL;
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, names[i]->d_name);
    struct stat st;
    if (!strcmp(names[i]->d_name, ".") || !strcmp(names[i]->d_name, "..") || stat(p, &st) ||
        !S_ISREG(st.st_mode)) {
      free(names[i]);
      continue;
    }
    size_t nl = strlen(names[i]->d_name) + 1;
    out = realloc(out, len + nl + (size_t)st.st_size);
    assert_non_null(out);
    memcpy(out + len, names[i]->d_name, nl);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    assert_int_equal(fread(out + len + nl, 1, (size_t)st.st_size, f), (size_t)st.st_size);
    fclose(f);
    len += nl + (size_t)st.st_size;
    free(names[i]);
  }
  free(names);
  *total = len;
  return out;
}

static void expect_record(const kiln_datum *d, int r) {
  uint8_t px[RC * RH * RW];
  record_pixels(r, px);
  assert_int_equal(d->channels, RC);
  assert_int_equal(d->height, RH);
  assert_int_equal(d->width, RW);
  assert_int_equal(d->label, 100 + r);
  assert_non_null(d->u8);
  assert_null(d->f32);
  assert_memory_equal(d->u8, px, sizeof px);
}

static void expect_key(kiln_datum_db *db, int r) {
  char key[16];
  snprintf(key, sizeof key, "%08d", r);
  assert_string_equal(kiln_datum_db_last_key(db), key);
}

static void test_reads_caffe_like_database(void **state) {
  tmpdir_fixture *f = *state;
  char path[256];
  path_in(f, "ldb", path, sizeof path);
  write_caffe_like(path, NREC);
  size_t before_len, after_len;
  char *before = folder_bytes(path, &before_len);

  kiln_datum_db *db = NULL, *other = NULL;
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_OK);
  /* a second handle while the first is open: LevelDB's lock would refuse it on the folder */
  assert_int_equal(kiln_datum_db_open_as(path, KILN_DB_LEVELDB, &other), KILN_OK);
  assert_int_equal(kiln_datum_db_size(db), NREC);
  kiln_datum d;
  for (int i = 0; i < NREC + 3; i++) { /* key order, then round to the first */
    assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
    expect_record(&d, i % NREC);
    expect_key(db, i % NREC);
  }
  assert_int_equal(kiln_datum_db_position(db), NREC + 3);
  assert_int_equal(kiln_datum_db_seek(db, 2 * NREC + 5), KILN_OK);
  assert_int_equal(kiln_datum_db_position(db), 2 * NREC + 5);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  expect_record(&d, 5);
  assert_int_equal(kiln_datum_db_seek(db, 1), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  expect_record(&d, 1);
  /* random access, backwards, leaves the sequential cursor where it was */
  for (int r = NREC - 1; r >= 0; r--) {
    assert_int_equal(kiln_datum_db_read(other, (uint64_t)r, &d), KILN_OK);
    expect_record(&d, r);
    expect_key(other, r);
  }
  assert_int_equal(kiln_datum_db_read(db, 4, &d), KILN_OK);
  expect_record(&d, 4);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  expect_record(&d, 2);
  assert_int_equal(kiln_datum_db_read(db, NREC, &d), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), path));
  kiln_datum_db_close(db);
  kiln_datum_db_close(other);

  char *after = folder_bytes(path, &after_len);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len); /* not a byte of the database changed */
  free(before);
  free(after);
}

/* kiln's writer into either backend: the same records read back, the same fingerprint. */
static void write_with_kiln(const char *path, kiln_db_backend backend, int n) {
  kiln_datum_writer *w = NULL;
  assert_int_equal(kiln_datum_writer_open_as(path, backend, &w), KILN_OK);
  for (int r = n - 1; r >= 0; r--) {
    uint8_t px[RC * RH * RW];
    record_pixels(r, px);
    kiln_datum d = {.channels = RC, .height = RH, .width = RW, .label = 100 + r, .u8 = px};
    char key[16];
    snprintf(key, sizeof key, "%08d", r);
    assert_int_equal(kiln_datum_writer_put(w, key, &d), KILN_OK);
  }
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
}

static void test_writer_matches_lmdb(void **state) {
  tmpdir_fixture *f = *state;
  char lpath[256], mpath[256], tmp[300];
  path_in(f, "kiln_ldb", lpath, sizeof lpath);
  path_in(f, "kiln_lmdb", mpath, sizeof mpath);
  enum { MANY = 2500 }; /* more than one write batch */
  write_with_kiln(lpath, KILN_DB_LEVELDB, MANY);
  write_with_kiln(mpath, KILN_DB_LMDB, MANY);
  snprintf(tmp, sizeof tmp, "%s.tmp", lpath);
  assert_false(exists(tmp));
  snprintf(tmp, sizeof tmp, "%s/CURRENT", lpath);
  assert_true(exists(tmp));

  kiln_datum_db *l = NULL, *m = NULL;
  assert_int_equal(kiln_datum_db_open_as(lpath, KILN_DB_LEVELDB, &l), KILN_OK);
  assert_int_equal(kiln_datum_db_open_as(mpath, KILN_DB_LMDB, &m), KILN_OK);
  assert_int_equal(kiln_datum_db_size(l), MANY);
  uint8_t dl[32], dm[32], d3[32];
  assert_int_equal(kiln_datum_db_fingerprint(l, 16, dl), KILN_OK);
  assert_int_equal(kiln_datum_db_fingerprint(m, 16, dm), KILN_OK);
  assert_memory_equal(dl, dm, sizeof dl);
  assert_int_equal(kiln_datum_db_fingerprint(l, 3, d3), KILN_OK);
  assert_memory_not_equal(dl, d3, sizeof dl);
  kiln_datum a, b;
  for (int i = 0; i < MANY; i += 97) {
    assert_int_equal(kiln_datum_db_read(l, (uint64_t)i, &a), KILN_OK);
    expect_record(&a, i);
  }
  for (int i = 0; i < MANY + 2; i++) {
    assert_int_equal(kiln_datum_db_next(l, &a), KILN_OK);
    assert_int_equal(kiln_datum_db_next(m, &b), KILN_OK);
    assert_int_equal(a.label, b.label);
    assert_memory_equal(a.u8, b.u8, RC * RH * RW);
    assert_string_equal(kiln_datum_db_last_key(l), kiln_datum_db_last_key(m));
  }
  kiln_datum_db_close(l);
  kiln_datum_db_close(m);

  /* an existing path is refused and left as it is */
  kiln_datum_writer *w = (kiln_datum_writer *)1;
  assert_int_equal(kiln_datum_writer_open_as(lpath, KILN_DB_LEVELDB, &w), KILN_ERR_INVALID);
  assert_null(w);
  assert_non_null(strstr(kiln_last_error(), lpath));
  /* an aborted writer leaves nothing */
  path_in(f, "aborted", lpath, sizeof lpath);
  assert_int_equal(kiln_datum_writer_open_as(lpath, KILN_DB_LEVELDB, &w), KILN_OK);
  kiln_datum d = {.channels = 1, .height = 1, .width = 1, .label = 0, .u8 = (const uint8_t *)"x"};
  assert_int_equal(kiln_datum_writer_put(w, "k", &d), KILN_OK);
  kiln_datum_writer_abort(w);
  snprintf(tmp, sizeof tmp, "%s.tmp", lpath);
  assert_false(exists(tmp));
  assert_false(exists(lpath));
}

/* Opening `path` fails with `code`, naming the path and each of `want` (NULL-terminated). */
static void expect_refused(const char *path, kiln_db_backend backend, int code, ...) {
  kiln_datum_db *db = (kiln_datum_db *)1;
  assert_int_equal(kiln_datum_db_open_as(path, backend, &db), code);
  assert_null(db);
  const char *msg = kiln_last_error();
  if (!strstr(msg, path)) fail_msg("'%s' does not name %s", msg, path);
  va_list ap;
  va_start(ap, code);
  for (const char *w; (w = va_arg(ap, const char *));)
    if (!strstr(msg, w)) fail_msg("'%s' does not say '%s'", msg, w);
  va_end(ap);
}

/* The path of the one table file (.ldb) of a database kiln wrote. */
static void table_of(const char *dir, char *out, size_t n) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  const struct dirent *e;
  out[0] = '\0';
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".ldb")) snprintf(out, n, "%s/%s", dir, e->d_name);
  closedir(d);
  assert_true(out[0] != '\0');
}

static void copy_db(const tmpdir_fixture *f, const char *from, const char *to) {
  char cmd[600], a[256], b[256];
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", path_in(f, from, a, sizeof a),
           path_in(f, to, b, sizeof b));
  assert_int_equal(system(cmd), 0);
}

static void test_refusals(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], lmdb[256], file[320], table[320];
  write_with_kiln(path_in(f, "good", path, sizeof path), KILN_DB_LEVELDB, 300);
  write_with_kiln(path_in(f, "lmdb", lmdb, sizeof lmdb), KILN_DB_LMDB, 3);

  expect_refused(path_in(f, "missing", file, sizeof file), KILN_DB_LEVELDB, KILN_ERR_IO,
                 "cannot open LevelDB", NULL);
  /* the backend asked for against what the path holds, both named */
  expect_refused(path, KILN_DB_LMDB, KILN_ERR_DATA, "holds a LevelDB database",
                 "but backend LMDB was asked for", NULL);
  expect_refused(lmdb, KILN_DB_LEVELDB, KILN_ERR_DATA, "holds an LMDB database",
                 "but backend LEVELDB was asked for", NULL);
  path_in(f, "empty_dir", file, sizeof file);
  assert_int_equal(mkdir(file, 0775), 0);
  expect_refused(file, KILN_DB_LEVELDB, KILN_ERR_DATA, "not a LevelDB database (no CURRENT inside)",
                 NULL);

  /* a garbled table: the block checksums catch it */
  copy_db(f, "good", "garbled");
  table_of(path_in(f, "garbled", path, sizeof path), table, sizeof table);
  FILE *t = fopen(table, "r+b");
  assert_non_null(t);
  fseek(t, 200, SEEK_SET);
  fwrite("garbage!", 1, 8, t);
  fclose(t);
  expect_refused(path, KILN_DB_ANY, KILN_ERR_DATA, "checksum mismatch", NULL);

  /* a table cut short, a table gone, a MANIFEST gone */
  copy_db(f, "good", "cut");
  table_of(path_in(f, "cut", path, sizeof path), table, sizeof table);
  assert_int_equal(truncate(table, 1000), 0);
  kiln_datum_db *db = (kiln_datum_db *)1;
  assert_int_not_equal(kiln_datum_db_open(path, &db), KILN_OK);
  assert_null(db);
  assert_non_null(strstr(kiln_last_error(), path));
  copy_db(f, "good", "no_table");
  table_of(path_in(f, "no_table", path, sizeof path), table, sizeof table);
  assert_int_equal(unlink(table), 0);
  expect_refused(path, KILN_DB_ANY, KILN_ERR_DATA, "not a readable LevelDB database",
                 "missing files", NULL);
  copy_db(f, "good", "no_manifest");
  path_in(f, "no_manifest", path, sizeof path);
  snprintf(file, sizeof file, "%s/CURRENT", path);
  write_plain(file, "MANIFEST-999999\n", 16);
  expect_refused(path, KILN_DB_ANY, KILN_ERR_DATA, "not a readable LevelDB database",
                 "CURRENT points to a non-existent file", NULL);

  /* a database with no records; a record that is not a Datum, named by its key */
  path_in(f, "none", path, sizeof path);
  leveldb_close(raw_open(path));
  expect_refused(path, KILN_DB_LEVELDB, KILN_ERR_DATA, "holds no records", NULL);
  path_in(f, "junk", path, sizeof path);
  leveldb_t *raw = raw_open(path);
  raw_put(raw, "junk-key", "\xff\xff\xff", 3);
  leveldb_close(raw);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_OK);
  kiln_datum d;
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), path));
  assert_non_null(strstr(kiln_last_error(), "record junk-key: not a Datum"));
  kiln_datum_db_close(db);
}

/* The path of a database's log (*.log). */
static void log_of(const char *dir, char *out, size_t n) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  const struct dirent *e;
  out[0] = '\0';
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len > 4 && !strcmp(e->d_name + len - 4, ".log")) snprintf(out, n, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  assert_true(out[0] != '\0');
}

/* The log is read to its end: records of 20,000 bytes, cut in fragments across LevelDB's 32 KiB
 * blocks, read back whole; the same log cut inside its last record, or ending in a few bytes of a
 * header, is refused (LevelDB's reader would drop the cut record without a word, as a write
 * that a crash cut short). */
static void test_log_read_to_its_end(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], log[320];
  enum { N = 5, W = 200 };
  static uint8_t px[100 * W];
  Caffe__Datum m = CAFFE__DATUM__INIT;
  m.has_channels = m.has_height = m.has_width = m.has_label = m.has_data = 1;
  m.channels = 1, m.height = 100, m.width = W;
  m.data.len = sizeof px;
  m.data.data = px;
  size_t len = caffe__datum__get_packed_size(&m);
  uint8_t *v = malloc(len);
  assert_non_null(v);
  leveldb_t *db = raw_open(path_in(f, "big", path, sizeof path));
  for (int r = 0; r < N; r++) {
    memset(px, r + 1, sizeof px);
    m.label = r;
    caffe__datum__pack(&m, v);
    char key[16];
    snprintf(key, sizeof key, "%08d", r);
    raw_put(db, key, v, len);
  }
  leveldb_close(db);
  free(v);
  log_of(path, log, sizeof log);
  struct stat st;
  assert_int_equal(stat(log, &st), 0);
  assert_true(st.st_size > 3 * 32768); /* the records are in the log, over several blocks */
  kiln_datum_db *d = NULL;
  assert_int_equal(kiln_datum_db_open(path, &d), KILN_OK);
  assert_int_equal(kiln_datum_db_size(d), N);
  for (int r = 0; r < N; r++) {
    kiln_datum rec;
    assert_int_equal(kiln_datum_db_next(d, &rec), KILN_OK);
    assert_int_equal(rec.label, r);
    assert_int_equal(rec.u8[12345], r + 1);
  }
  kiln_datum_db_close(d);

  copy_db(f, "big", "cut_record");
  log_of(path_in(f, "cut_record", path, sizeof path), log, sizeof log);
  assert_int_equal(truncate(log, st.st_size - 100), 0);
  expect_refused(path, KILN_DB_LEVELDB, KILN_ERR_DATA, ".log", "a write cut short", NULL);

  copy_db(f, "big", "cut_header");
  log_of(path_in(f, "cut_header", path, sizeof path), log, sizeof log);
  FILE *t = fopen(log, "ab");
  assert_non_null(t);
  fwrite("\x12\x34\x56", 1, 3, t); /* a header's first bytes, as a crash leaves them */
  fclose(t);
  expect_refused(path, KILN_DB_LEVELDB, KILN_ERR_DATA, "ends inside a record's header", NULL);
}

/* The Data layer: a backend that is not what the source holds is refused naming the layer, the
 * path and both; no backend is Caffe's default, LEVELDB, and the message says so. */
static void expect_layer_refused(const char *source, const char *backend, const char *a,
                                 const char *b) {
  char text[600];
  snprintf(text, sizeof text,
           "name: 'd' type: 'Data' top: 'data' data_param { source: '%s' batch_size: 2 %s }",
           source, backend);
  Caffe__LayerParameter *lp = gc_layer_param(text);
  kiln_blob *top = kiln_blob_new("data");
  kiln_layer *l = NULL;
  assert_int_equal(kiln_layer_create(lp, 0, NULL, 0, &top, 1, 1, kiln_test_config(), &l),
                   KILN_ERR_DATA);
  assert_null(l);
  expect_message(source, a, b);
  assert_non_null(strstr(kiln_last_error(), "layer 'd' (Data)"));
  protobuf_c_message_free_unpacked(&lp->base, NULL);
  kiln_blob_free(top);
}

static void test_data_layer_backend_mismatch(void **state) {
  tmpdir_fixture *f = *state;
  char ldb[256], lmdb[256];
  write_with_kiln(path_in(f, "ldb", ldb, sizeof ldb), KILN_DB_LEVELDB, 3);
  write_with_kiln(path_in(f, "lmdb", lmdb, sizeof lmdb), KILN_DB_LMDB, 3);
  expect_layer_refused(lmdb, "", "data_param names no backend, which in Caffe means LEVELDB",
                       "holds an LMDB database (data.mdb), but backend LEVELDB was asked for");
  expect_layer_refused(lmdb, "backend: LEVELDB", "holds an LMDB database (data.mdb)",
                       "but backend LEVELDB was asked for");
  expect_layer_refused(ldb, "backend: LMDB", "holds a LevelDB database (CURRENT, no data.mdb)",
                       "but backend LMDB was asked for");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reads_caffe_like_database, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_writer_matches_lmdb, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_refusals, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_log_read_to_its_end, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_data_layer_backend_mismatch, setup_dir, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
