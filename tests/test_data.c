/* Data: SHA-256 against the FIPS test vectors, IDX reading (plain, gzip, broken files), IDX to
 * LMDB conversion, the Datum reader (order, wrap-around, seek, bad records) and the writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "kiln/data.h"
#include "kiln/proto.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static int setup_dir(void **state) { return tmpdir_setup(state, "data"); }

/* An IDX image: header for `ndims` dims of element type `type`, then `nbytes` of payload. */
static size_t make_idx(uint8_t *buf, int type, int ndims, const uint32_t *dims,
                       const uint8_t *payload, size_t nbytes) {
  size_t o = 0;
  buf[o++] = 0;
  buf[o++] = 0;
  buf[o++] = (uint8_t)type;
  buf[o++] = (uint8_t)ndims;
  for (int i = 0; i < ndims; i++) {
    buf[o++] = (uint8_t)(dims[i] >> 24);
    buf[o++] = (uint8_t)(dims[i] >> 16);
    buf[o++] = (uint8_t)(dims[i] >> 8);
    buf[o++] = (uint8_t)dims[i];
  }
  memcpy(buf + o, payload, nbytes);
  return o + nbytes;
}

/* 5 images of 4x3 pixels: pixel j of image i is 10*i + j; labels 7, 3, 9, 0, 5. */
enum { N_IMG = 5, IMG_H = 4, IMG_W = 3 };
static const uint8_t small_labels[N_IMG] = {7, 3, 9, 0, 5};

static void write_small_pair(const tmpdir_fixture *f, const char *images, const char *labels,
                             uint32_t n_labels) {
  uint8_t pixels[N_IMG * IMG_H * IMG_W], buf[256];
  for (int i = 0; i < N_IMG; i++)
    for (int j = 0; j < IMG_H * IMG_W; j++) pixels[i * IMG_H * IMG_W + j] = (uint8_t)(10 * i + j);
  char path[256];
  uint32_t idims[3] = {N_IMG, IMG_H, IMG_W};
  write_gz(path_in(f, images, path, sizeof path), buf,
           make_idx(buf, 0x08, 3, idims, pixels, sizeof pixels));
  uint8_t lab[16] = {0};
  memcpy(lab, small_labels, N_IMG);
  write_plain(path_in(f, labels, path, sizeof path), buf,
              make_idx(buf, 0x08, 1, &n_labels, lab, n_labels));
}

/* Writes raw key/value pairs with LMDB directly, bypassing kiln's writer. */
static void write_raw_lmdb(const char *dir, int n, const char *const *keys, const MDB_val *vals) {
  assert_int_equal(mkdir(dir, 0775), 0);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_open(env, dir, 0, 0664), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  for (int i = 0; i < n; i++) {
    MDB_val k = {strlen(keys[i]), (void *)keys[i]}, v = vals[i];
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
  }
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* Packs a Datum by hand so tests can make records that kiln's writer would refuse. */
static MDB_val pack_datum(int c, int h, int w, const uint8_t *data, size_t len, bool encoded) {
  Caffe__Datum m = CAFFE__DATUM__INIT;
  m.has_channels = m.has_height = m.has_width = m.has_label = 1;
  m.channels = c;
  m.height = h;
  m.width = w;
  m.label = 1;
  m.has_data = 1;
  m.data.len = len;
  m.data.data = (uint8_t *)data;
  if (encoded) m.has_encoded = m.encoded = 1;
  MDB_val v;
  v.mv_size = caffe__datum__get_packed_size(&m);
  v.mv_data = malloc(v.mv_size);
  assert_non_null(v.mv_data);
  caffe__datum__pack(&m, v.mv_data);
  return v;
}

/* ---- SHA-256 ----------------------------------------------------------------------------- */

static void expect_sha(const void *data, size_t len, const char *want) {
  uint8_t d[32];
  char hex[65];
  kiln_sha256(data, len, d);
  kiln_sha256_hex(d, hex);
  assert_string_equal(hex, want);
}

static void test_sha256_vectors(void **state) {
  (void)state;
  /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf" and the short-message test vectors). */
  expect_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  expect_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  expect_sha(m448, strlen(m448),
             "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_sha256_streaming_and_file(void **state) {
  tmpdir_fixture *f = *state;
  /* One million 'a' (the long FIPS vector), fed in uneven pieces that straddle block edges. */
  size_t n = 1000000;
  char *a = malloc(n);
  assert_non_null(a);
  memset(a, 'a', n);
  kiln_sha256_ctx c;
  kiln_sha256_init(&c);
  size_t off = 0, step = 1;
  while (off < n) {
    size_t take = step < n - off ? step : n - off;
    kiln_sha256_update(&c, a + off, take);
    off += take;
    step = step * 7 % 131 + 1;
  }
  uint8_t d[32];
  char hex[65], fhex[65], path[256];
  kiln_sha256_final(&c, d);
  kiln_sha256_hex(d, hex);
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  write_plain(path_in(f, "a.bin", path, sizeof path), a, n);
  assert_int_equal(kiln_sha256_file(path, fhex), KILN_OK);
  assert_string_equal(fhex, hex);
  free(a);
  /* Lengths around the padding boundary (55, 56, 63, 64 bytes) agree between one-shot and
   * streaming byte by byte. */
  for (size_t len = 50; len < 70; len++) {
    uint8_t one[32], many[32], buf[70];
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(i * 31 + 7);
    kiln_sha256(buf, len, one);
    kiln_sha256_init(&c);
    for (size_t i = 0; i < len; i++) kiln_sha256_update(&c, buf + i, 1);
    kiln_sha256_final(&c, many);
    assert_memory_equal(one, many, 32);
  }
  assert_int_equal(kiln_sha256_file(path_in(f, "absent", path, sizeof path), fhex), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "absent"));
}

/* ---- IDX --------------------------------------------------------------------------------- */

static void test_idx_plain_and_gzip(void **state) {
  tmpdir_fixture *f = *state;
  uint8_t payload[2 * 3 * 4], buf[128];
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(255 - i);
  uint32_t dims[3] = {2, 3, 4};
  size_t len = make_idx(buf, 0x08, 3, dims, payload, sizeof payload);
  char plain[256], gz[256];
  write_plain(path_in(f, "x.idx", plain, sizeof plain), buf, len);
  write_gz(path_in(f, "x.idx.gz", gz, sizeof gz), buf, len);
  const char *paths[] = {plain, gz};
  for (int k = 0; k < 2; k++) {
    kiln_idx idx;
    assert_int_equal(kiln_idx_read(paths[k], &idx), KILN_OK);
    assert_int_equal(idx.ndims, 3);
    assert_int_equal(idx.dims[0], 2);
    assert_int_equal(idx.dims[1], 3);
    assert_int_equal(idx.dims[2], 4);
    assert_int_equal(idx.count, 24);
    assert_memory_equal(idx.data, payload, sizeof payload);
    kiln_idx_free(&idx);
    assert_null(idx.data);
  }
  /* A 1-d labels file. */
  uint32_t n = 5;
  write_gz(path_in(f, "l.gz", gz, sizeof gz), buf, make_idx(buf, 0x08, 1, &n, small_labels, 5));
  kiln_idx idx;
  assert_int_equal(kiln_idx_read(gz, &idx), KILN_OK);
  assert_int_equal(idx.ndims, 1);
  assert_int_equal(idx.count, 5);
  assert_memory_equal(idx.data, small_labels, 5);
  kiln_idx_free(&idx);
}

static void test_idx_errors(void **state) {
  tmpdir_fixture *f = *state;
  uint8_t payload[12] = {1, 2, 3, 4, 5, 6, 7}, buf[128];
  uint32_t dims[2] = {3, 4};
  char path[256], msg[512];
  kiln_idx idx;

  /* Truncated: header promises 12 bytes, 7 follow (plain and gzipped). */
  size_t len = make_idx(buf, 0x08, 2, dims, payload, 7);
  write_plain(path_in(f, "short.idx", path, sizeof path), buf, len);
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_DATA);
  snprintf(msg, sizeof msg, "%s: truncated: expected 12 bytes of data, found 7", path);
  assert_string_equal(kiln_last_error(), msg);
  assert_null(idx.data);
  write_gz(path_in(f, "short.idx.gz", path, sizeof path), buf, len);
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "truncated: expected 12 bytes of data, found 7"));

  /* Truncated inside the header. */
  write_plain(path_in(f, "head.idx", path, sizeof path), buf, 6);
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "truncated"));

  /* Wrong magic. */
  write_plain(path_in(f, "png.idx", path, sizeof path), "\x89PNG\r\n\x1a\n", 8);
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_DATA);
  snprintf(msg, sizeof msg, "%s: not an IDX file (magic 0x89504e47)", path);
  assert_string_equal(kiln_last_error(), msg);

  /* A known element type other than unsigned bytes. */
  write_plain(path_in(f, "float.idx", path, sizeof path), buf,
              make_idx(buf, 0x0D, 2, dims, payload, 0));
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_UNSUPPORTED);
  assert_non_null(strstr(kiln_last_error(), "0x0d"));

  /* Bytes after the data. */
  uint8_t extra[16] = {0};
  write_plain(path_in(f, "long.idx", path, sizeof path), buf,
              make_idx(buf, 0x08, 2, dims, extra, sizeof extra));
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "4 unexpected bytes after the 12 bytes"));

  /* Absurd dimensions are refused before any allocation. */
  uint32_t huge[3] = {60000, 60000, 60000};
  write_plain(path_in(f, "huge.idx", path, sizeof path), buf,
              make_idx(buf, 0x08, 3, huge, payload, 0));
  assert_int_equal(kiln_idx_read(path, &idx), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "60000x60000"));

  /* Missing file, and a directory. */
  assert_int_equal(kiln_idx_read(path_in(f, "nope.gz", path, sizeof path), &idx), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), path));
  assert_non_null(strstr(kiln_last_error(), "No such file"));
  assert_int_equal(kiln_idx_read(f->dir, &idx), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "directory"));

  /* A gzip file cut in the middle of its stream. */
  uint8_t big[4096];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
  uint32_t bd[1] = {sizeof big};
  static uint8_t full[5000];
  write_gz(path_in(f, "cut.gz", path, sizeof path), full,
           make_idx(full, 0x08, 1, bd, big, sizeof big));
  char *whole;
  size_t wlen;
  assert_int_equal(kiln_read_file(path, &whole, &wlen), KILN_OK);
  write_plain(path, whole, wlen / 2);
  free(whole);
  int rc = kiln_idx_read(path, &idx);
  assert_true(rc == KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), path));
}

/* ---- conversion and reading -------------------------------------------------------------- */

static void expect_record(kiln_datum_db *db, int i) {
  kiln_datum d;
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  assert_int_equal(d.channels, 1);
  assert_int_equal(d.height, IMG_H);
  assert_int_equal(d.width, IMG_W);
  assert_int_equal(d.label, small_labels[i]);
  assert_non_null(d.u8);
  assert_null(d.f32);
  for (int j = 0; j < IMG_H * IMG_W; j++) assert_int_equal(d.u8[j], 10 * i + j);
  char key[16];
  snprintf(key, sizeof key, "%08d", i);
  assert_string_equal(kiln_datum_db_last_key(db), key);
}

static void test_convert_and_read(void **state) {
  tmpdir_fixture *f = *state;
  write_small_pair(f, "img.gz", "lab", N_IMG);
  char img[256], lab[256], out[256], tmp[300], sub[300];
  path_in(f, "img.gz", img, sizeof img);
  path_in(f, "lab", lab, sizeof lab);
  path_in(f, "db", out, sizeof out);
  uint64_t n = 0;
  assert_int_equal(kiln_convert_idx_to_lmdb(img, lab, out, &n), KILN_OK);
  assert_int_equal(n, N_IMG);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  assert_false(exists(tmp));
  snprintf(sub, sizeof sub, "%s/data.mdb", out);
  assert_true(exists(sub));
  snprintf(sub, sizeof sub, "%s/lock.mdb", out);
  assert_true(exists(sub));

  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_size(db), N_IMG);
  assert_int_equal(kiln_datum_db_position(db), 0);
  for (int i = 0; i < N_IMG; i++) expect_record(db, i);
  expect_record(db, 0); /* wraps round */
  expect_record(db, 1);
  assert_int_equal(kiln_datum_db_position(db), N_IMG + 2);

  assert_int_equal(kiln_datum_db_seek(db, 12), KILN_OK); /* 12 % 5 = 2 */
  assert_int_equal(kiln_datum_db_position(db), 12);
  expect_record(db, 2);
  expect_record(db, 3);
  assert_int_equal(kiln_datum_db_position(db), 14);
  assert_int_equal(kiln_datum_db_seek(db, 1), KILN_OK); /* backwards */
  expect_record(db, 1);
  assert_int_equal(kiln_datum_db_seek(db, 4), KILN_OK); /* the last record, then wrap */
  expect_record(db, 4);
  expect_record(db, 0);
  assert_int_equal(kiln_datum_db_seek(db, 0), KILN_OK);
  assert_int_equal(kiln_datum_db_position(db), 0);
  expect_record(db, 0);
  /* Every target from every starting point. */
  for (int from = 0; from < N_IMG; from++)
    for (int to = 0; to < 2 * N_IMG; to++) {
      assert_int_equal(kiln_datum_db_seek(db, (uint64_t)from), KILN_OK);
      assert_int_equal(kiln_datum_db_seek(db, (uint64_t)to), KILN_OK);
      expect_record(db, to % N_IMG);
    }
  kiln_datum_db_close(db);

  /* The output exists now: a second conversion refuses and leaves it alone. */
  assert_int_equal(kiln_convert_idx_to_lmdb(img, lab, out, &n), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), out));
  assert_non_null(strstr(kiln_last_error(), "exists"));
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  kiln_datum_db_close(db);
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open(out, &w), KILN_ERR_INVALID);
}

static void test_convert_errors(void **state) {
  tmpdir_fixture *f = *state;
  write_small_pair(f, "img.gz", "lab4", 4);
  char img[256], lab[256], out[256], tmp[300];
  path_in(f, "img.gz", img, sizeof img);
  path_in(f, "lab4", lab, sizeof lab);
  path_in(f, "db", out, sizeof out);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  uint64_t n = 99;
  assert_int_equal(kiln_convert_idx_to_lmdb(img, lab, out, &n), KILN_ERR_DATA);
  assert_int_equal(n, 0);
  assert_non_null(strstr(kiln_last_error(), img));
  assert_non_null(strstr(kiln_last_error(), lab));
  assert_non_null(strstr(kiln_last_error(), "5 images"));
  assert_non_null(strstr(kiln_last_error(), "4 labels"));
  assert_false(exists(out));
  assert_false(exists(tmp));

  /* Labels must be 1-d: give the images file as labels. */
  assert_int_equal(kiln_convert_idx_to_lmdb(img, img, out, &n), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "1 dimension"));
  assert_false(exists(tmp));

  /* Output in a directory that does not exist. */
  char deep[300];
  snprintf(deep, sizeof deep, "%s/no/such/db", f->dir);
  write_small_pair(f, "img.gz", "lab5", N_IMG);
  path_in(f, "lab5", lab, sizeof lab);
  assert_int_equal(kiln_convert_idx_to_lmdb(img, lab, deep, &n), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "no/such/db.tmp"));

  /* A stale temporary from an interrupted run is replaced. */
  assert_int_equal(mkdir(tmp, 0775), 0);
  char junk[320];
  snprintf(junk, sizeof junk, "%s/data.mdb", tmp);
  write_plain(junk, "junk", 4);
  assert_int_equal(kiln_convert_idx_to_lmdb(img, lab, out, &n), KILN_OK);
  assert_int_equal(n, N_IMG);
  assert_false(exists(tmp));

  /* A writer that is abandoned leaves nothing behind. */
  char other[256];
  path_in(f, "abandoned", other, sizeof other);
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open(other, &w), KILN_OK);
  uint8_t px[6] = {1, 2, 3, 4, 5, 6};
  kiln_datum d = {.channels = 1, .height = 2, .width = 3, .label = 4, .u8 = px};
  assert_int_equal(kiln_datum_writer_put(w, "a", &d), KILN_OK);
  kiln_datum bad = d;
  bad.f32 = (const float *)px; /* both u8 and f32 */
  assert_int_equal(kiln_datum_writer_put(w, "b", &bad), KILN_ERR_INVALID);
  bad = d;
  bad.height = 0;
  assert_int_equal(kiln_datum_writer_put(w, "c", &bad), KILN_ERR_INVALID);
  assert_int_equal(kiln_datum_writer_put(w, "", &d), KILN_ERR_INVALID);
  kiln_datum_writer_abort(w);
  snprintf(tmp, sizeof tmp, "%s.tmp", other);
  assert_false(exists(tmp));
  assert_false(exists(other));
}

/* An images IDX of 4 dimensions is N x C x H x W: each record gets C channels, its planes in
 * the file's order, in the LMDB and in an HDF5 data file alike; 2 dimensions are refused. */
static void test_convert_channels(void **state) {
  tmpdir_fixture *f = *state;
  enum { N = 3, C = 2, H = 2, W = 3 };
  uint8_t pixels[N * C * H * W], buf[256], lab[N] = {1, 0, 2};
  for (size_t i = 0; i < sizeof pixels; i++) pixels[i] = (uint8_t)(7 * i + 1);
  char img[256], labp[256], out[256], h5[256];
  const uint32_t idims[4] = {N, C, H, W}, ldims[1] = {N};
  write_plain(path_in(f, "img4", img, sizeof img), buf,
              make_idx(buf, 0x08, 4, idims, pixels, sizeof pixels));
  write_plain(path_in(f, "lab3", labp, sizeof labp), buf, make_idx(buf, 0x08, 1, ldims, lab, N));
  uint64_t n = 0;
  assert_int_equal(kiln_convert_idx_to_lmdb(img, labp, path_in(f, "db4", out, sizeof out), &n),
                   KILN_OK);
  assert_int_equal(n, N);
  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  for (int i = 0; i < N; i++) {
    kiln_datum d;
    assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
    assert_int_equal(d.channels, C);
    assert_int_equal(d.height, H);
    assert_int_equal(d.width, W);
    assert_int_equal(d.label, lab[i]);
    assert_memory_equal(d.u8, pixels + i * C * H * W, C * H * W);
  }
  kiln_datum_db_close(db);
  assert_int_equal(kiln_convert_idx_to_h5(img, labp, path_in(f, "c.h5", h5, sizeof h5), &n),
                   KILN_OK);
  const char *const names[2] = {"data", "label"};
  kiln_h5data_shape shapes[2];
  assert_int_equal(kiln_h5data_inspect(h5, 2, names, 0, shapes, NULL), KILN_OK);
  assert_int_equal(shapes[0].naxes, 4);
  const int64_t want[4] = {N, C, H, W};
  for (int a = 0; a < 4; a++) assert_int_equal(shapes[0].dims[a], want[a]);

  const uint32_t flat[2] = {N, 4};
  write_plain(img, buf, make_idx(buf, 0x08, 2, flat, pixels, N * 4));
  assert_int_equal(kiln_convert_idx_to_lmdb(img, labp, path_in(f, "db2", out, sizeof out), &n),
                   KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "N x C x H x W"));
  assert_false(exists(out));
}

static void test_writer_float_and_growth(void **state) {
  tmpdir_fixture *f = *state;
  char out[256];
  path_in(f, "float_db", out, sizeof out);
  /* 12 records of 3x512x512 floats (3 MiB each) overflow the writer's first map and its first
   * chunk, so the map has to grow and the chunk be written again. */
  enum { NREC = 12, C = 3, H = 512, W = 512 };
  float *px = malloc(sizeof(float) * C * H * W);
  assert_non_null(px);
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open(out, &w), KILN_OK);
  for (int r = NREC - 1; r >= 0; r--) { /* out of key order on purpose */
    for (int i = 0; i < C * H * W; i++) px[i] = (float)r + (float)i * 1e-3f;
    char key[16];
    snprintf(key, sizeof key, "%05d", r);
    kiln_datum d = {.channels = C, .height = H, .width = W, .label = r, .f32 = px};
    assert_int_equal(kiln_datum_writer_put(w, key, &d), KILN_OK);
  }
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_size(db), NREC);
  for (int r = 0; r < NREC; r++) {
    kiln_datum d;
    assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
    assert_int_equal(d.label, r);
    assert_null(d.u8);
    assert_non_null(d.f32);
    assert_true(d.f32[0] == (float)r);
    assert_true(d.f32[C * H * W - 1] == (float)r + (float)(C * H * W - 1) * 1e-3f);
  }
  kiln_datum_db_close(db);
  free(px);
}

/* compute-mean: the per-pixel mean of byte and float records, read back as Caffe's
 * binaryproto with the legacy 1 x C x H x W header; records of another shape refused naming
 * the record, and nothing written. */
static void test_compute_mean(void **state) {
  tmpdir_fixture *f = *state;
  char db[256], out[256];
  path_in(f, "mean_db", db, sizeof db);
  path_in(f, "mean.binaryproto", out, sizeof out);
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open(db, &w), KILN_OK);
  const uint8_t a[4] = {0, 10, 20, 255}, b[4] = {10, 21, 30, 0};
  const float c[4] = {2.0f, 2.0f, 1.0f, 0.5f};
  kiln_datum d1 = {.channels = 1, .height = 2, .width = 2, .label = 0, .u8 = a};
  kiln_datum d2 = {.channels = 1, .height = 2, .width = 2, .label = 1, .u8 = b};
  kiln_datum d3 = {.channels = 1, .height = 2, .width = 2, .label = 2, .f32 = c};
  assert_int_equal(kiln_datum_writer_put(w, "00000", &d1), KILN_OK);
  assert_int_equal(kiln_datum_writer_put(w, "00001", &d2), KILN_OK);
  assert_int_equal(kiln_datum_writer_put(w, "00002", &d3), KILN_OK);
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
  uint64_t n = 0;
  assert_int_equal(kiln_compute_mean(db, out, &n), KILN_OK);
  assert_int_equal(n, 3);
  ProtobufCMessage *m;
  assert_int_equal(kiln_proto_read_binary(out, &caffe__blob_proto__descriptor, &m), KILN_OK);
  Caffe__BlobProto *bp = (Caffe__BlobProto *)m;
  assert_int_equal(bp->num, 1);
  assert_int_equal(bp->channels, 1);
  assert_int_equal(bp->height, 2);
  assert_int_equal(bp->width, 2);
  assert_int_equal(bp->n_data, 4);
  const float want[4] = {4.0f, 11.0f, 17.0f, 85.1666667f};
  for (int i = 0; i < 4; i++) assert_true(fabsf(bp->data[i] - want[i]) < 1e-4f);
  protobuf_c_message_free_unpacked(m, NULL);
  /* another shape */
  char db2[256], out2[256];
  path_in(f, "mixed_db", db2, sizeof db2);
  path_in(f, "mixed.binaryproto", out2, sizeof out2);
  assert_int_equal(kiln_datum_writer_open(db2, &w), KILN_OK);
  const uint8_t big[8] = {0};
  kiln_datum e = {.channels = 2, .height = 2, .width = 2, .label = 0, .u8 = big};
  assert_int_equal(kiln_datum_writer_put(w, "00000", &d1), KILN_OK);
  assert_int_equal(kiln_datum_writer_put(w, "00001", &e), KILN_OK);
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
  assert_int_equal(kiln_compute_mean(db2, out2, NULL), KILN_ERR_DATA);
  if (!strstr(kiln_last_error(), "record 00001: shape 2x2x2"))
    fail_msg("%s", kiln_last_error());
  assert_int_equal(access(out2, F_OK), -1);
}

/* n records of 1x2x2 bytes, keys 00000.., record `changed` with its first pixel flipped. */
static void write_fp_db(const char *path, int n, int changed) {
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open(path, &w), KILN_OK);
  for (int r = 0; r < n; r++) {
    uint8_t px[4] = {(uint8_t)(7 * r), (uint8_t)(7 * r + 1), (uint8_t)(7 * r + 2), (uint8_t)(7 * r + 3)};
    if (r == changed) px[0] ^= 1;
    char key[16];
    snprintf(key, sizeof key, "%05d", r);
    kiln_datum d = {.channels = 1, .height = 2, .width = 2, .label = r % 10, .u8 = px};
    assert_int_equal(kiln_datum_writer_put(w, key, &d), KILN_OK);
  }
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
}

static void fingerprint_of(const char *path, uint8_t digest[32]) {
  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_fingerprint(db, 64, digest), KILN_OK);
  kiln_datum d; /* the sequential cursor has not moved */
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  assert_string_equal(kiln_datum_db_last_key(db), "00000");
  kiln_datum_db_close(db);
}

/* The fingerprint that workers compare: the same records at another path give the same digest;
 * another record count, or a change in a sampled record (the first, the last, one in the middle),
 * gives another. 64 samples over 100 records are records floor(i x 99 / 63): record 2 lies
 * between samples 1 and 3, so a change there goes unseen, which is the price of not reading
 * the whole database. */
static void test_fingerprint(void **state) {
  tmpdir_fixture *f = *state;
  static const struct { const char *name; int n, changed; bool same; } cases[] = {
      {"copy", 100, -1, true}, {"first", 100, 0, false}, {"middle", 100, 50, false},
      {"last", 100, 99, false}, {"longer", 101, -1, false}, {"between", 100, 2, true},
  };
  char base[256], path[256];
  write_fp_db(path_in(f, "fp_base", base, sizeof base), 100, -1);
  uint8_t want[32], got[32];
  fingerprint_of(base, want);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "fp_%s", cases[i].name);
    write_fp_db(path_in(f, name, path, sizeof path), cases[i].n, cases[i].changed);
    fingerprint_of(path, got);
    if ((memcmp(got, want, 32) == 0) != cases[i].same)
      fail_msg("%s: the fingerprint %s", cases[i].name, cases[i].same ? "changed" : "did not change");
  }
}

static void test_reader_errors(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], msg[512];
  kiln_datum_db *db = (kiln_datum_db *)1;

  /* Missing. */
  path_in(f, "missing_lmdb", path, sizeof path);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_ERR_IO);
  assert_null(db);
  assert_non_null(strstr(kiln_last_error(), path));

  /* A directory without data.mdb, one with an empty data.mdb, one full of garbage. */
  path_in(f, "empty_dir", path, sizeof path);
  assert_int_equal(mkdir(path, 0775), 0);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "not an LMDB"));
  snprintf(msg, sizeof msg, "%s/data.mdb", path);
  write_plain(msg, "", 0);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), path));

  path_in(f, "garbage_lmdb", path, sizeof path);
  assert_int_equal(mkdir(path, 0775), 0);
  uint8_t junk[16384];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 2654435761u >> 11);
  snprintf(msg, sizeof msg, "%s/data.mdb", path);
  write_plain(msg, junk, sizeof junk);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_ERR_DATA);
  assert_null(db);
  assert_non_null(strstr(kiln_last_error(), path));
  assert_non_null(strstr(kiln_last_error(), "not a readable LMDB"));

  /* A plain file that is not an LMDB. */
  path_in(f, "file.mdb", path, sizeof path);
  write_plain(path, junk, sizeof junk);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_ERR_DATA);

  /* An LMDB with no records. */
  path_in(f, "no_records", path, sizeof path);
  write_raw_lmdb(path, 0, NULL, NULL);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "no records"));
}

static void test_bad_records(void **state) {
  tmpdir_fixture *f = *state;
  uint8_t px[12] = {0};
  char path[256];
  /* Record 1 is not a protobuf at all: a bytes field whose length runs past the end. */
  static const uint8_t garbage[] = {0x22, 0x7f, 0x01, 0x02, 0x03};
  const char *keys[] = {"00000000", "00000001"};
  MDB_val vals[2] = {pack_datum(1, 3, 4, px, 12, false), {sizeof garbage, (void *)garbage}};
  path_in(f, "not_datum", path, sizeof path);
  write_raw_lmdb(path, 2, keys, vals);
  kiln_datum_db *db;
  kiln_datum d;
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  assert_int_equal(d.label, 1);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA);
  char msg[512];
  snprintf(msg, sizeof msg, "%s: record 00000001: not a Datum", path);
  assert_string_equal(kiln_last_error(), msg);
  assert_int_equal(kiln_datum_db_position(db), 1); /* the cursor did not move */
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA);
  kiln_datum_db_close(db);
  free(vals[0].mv_data);

  /* Wrong data size, an encoded record that holds no image, a shape change, no pixels. */
  const char *keys2[] = {"a", "b", "c", "d", "e"};
  MDB_val vals2[5] = {pack_datum(1, 3, 4, px, 12, false), pack_datum(1, 3, 4, px, 11, false),
                      pack_datum(1, 3, 4, px, 12, true), pack_datum(1, 4, 3, px, 12, false),
                      pack_datum(1, 3, 4, px, 0, false)};
  path_in(f, "bad_records", path, sizeof path);
  write_raw_lmdb(path, 5, keys2, vals2);
  assert_int_equal(kiln_datum_db_open(path, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "record b: data holds 11 bytes"));
  assert_non_null(strstr(kiln_last_error(), "1x3x4 = 12"));
  assert_int_equal(kiln_datum_db_seek(db, 2), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA); /* encoded, but no image */
  assert_non_null(strstr(kiln_last_error(), "record c: not a PNG or JPEG image"));
  assert_int_equal(kiln_datum_db_seek(db, 3), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "record d: shape 1x4x3 differs"));
  assert_int_equal(kiln_datum_db_seek(db, 4), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "record e: holds neither data nor float_data"));
  kiln_datum_db_close(db);
  for (int i = 0; i < 5; i++) free(vals2[i].mv_data);
}

/* ---- cache and fetch --------------------------------------------------------------------- */

static void test_cache_dir(void **state) {
  tmpdir_fixture *f = *state;
  char want[256], got[512];
  snprintf(want, sizeof want, "%s/a/b/c", f->dir);
  char *saved = getenv("KILN_DATA") ? kiln_strdup(getenv("KILN_DATA")) : NULL;
  setenv("KILN_DATA", want, 1);
  kiln_config cfg;
  assert_int_equal(kiln_config_from_env(&cfg), KILN_OK);
  assert_int_equal(kiln_data_cache_dir(&cfg, got, sizeof got), KILN_OK);
  assert_string_equal(got, want);
  struct stat st;
  assert_int_equal(stat(want, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  assert_int_equal(kiln_data_cache_dir(&cfg, got, 8), KILN_ERR_INVALID);
  /* the defaults know no cache: the message says which variables would give one */
  assert_int_equal(kiln_data_cache_dir(NULL, got, sizeof got), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "set KILN_DATA (or HOME)"));
  /* a text source's vocabulary: the one named (resolved as sources are), else beside the source */
  char vocab[512], want_vocab[512];
  assert_int_equal(kiln_data_vocab_path(&cfg, "$KILN_DATA/v.txt", "/x/y/train.txt", "vocab.txt",
                                        vocab, sizeof vocab), KILN_OK);
  snprintf(want_vocab, sizeof want_vocab, "%s/v.txt", want);
  assert_string_equal(vocab, want_vocab);
  assert_int_equal(kiln_data_vocab_path(&cfg, "", "/x/y/train.txt", "target_vocab.txt", vocab,
                                        sizeof vocab), KILN_OK);
  assert_string_equal(vocab, "/x/y/target_vocab.txt");
  assert_int_equal(kiln_data_vocab_path(&cfg, NULL, "train.txt", "vocab.txt", vocab,
                                        sizeof vocab), KILN_OK);
  assert_string_equal(vocab, "./vocab.txt");
  assert_int_equal(kiln_data_vocab_path(&cfg, NULL, "/x/y/train.txt", "vocab.txt", vocab, 12),
                   KILN_ERR_INVALID);
  if (saved) {
    setenv("KILN_DATA", saved, 1);
    free(saved);
  } else {
    unsetenv("KILN_DATA");
  }
}

static void test_fetch_checks_hashes(void **state) {
  tmpdir_fixture *f = *state;
  char src[256], cache[256], path[300];
  path_in(f, "src", src, sizeof src);
  path_in(f, "cache", cache, sizeof cache);
  assert_int_equal(mkdir(src, 0775), 0);
  bool already = true;
  /* Missing sources. */
  assert_int_equal(kiln_data_fetch_fashion_mnist(src, cache, &already), KILN_ERR_IO);
  assert_false(already);
  assert_non_null(strstr(kiln_last_error(), "train-images-idx3-ubyte.gz"));
  /* A file with the right name and the wrong content. */
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", src);
  write_plain(path, "abc", 3);
  assert_int_equal(kiln_data_fetch_fashion_mnist(src, cache, &already), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), path));
  assert_non_null(strstr(kiln_last_error(),
                         "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7"));
  assert_non_null(strstr(kiln_last_error(),
                         "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  snprintf(path, sizeof path, "%s/fashion-mnist/READY", cache);
  assert_false(exists(path));
  /* With READY present nothing is checked or converted. */
  snprintf(path, sizeof path, "%s/fashion-mnist/READY", cache);
  write_plain(path, "x", 1);
  assert_int_equal(kiln_data_fetch_fashion_mnist(src, cache, &already), KILN_OK);
  assert_true(already);
}

static void test_fashion_mnist_idx(void **state) {
  (void)state;
  const char *dir = KILN_FASHION_MNIST_SYSTEM_DIR;
  char labels[256], images[256];
  snprintf(labels, sizeof labels, "%s/t10k-labels-idx1-ubyte.gz", dir);
  snprintf(images, sizeof images, "%s/t10k-images-idx3-ubyte.gz", dir);
  if (!exists(labels) || !exists(images)) skip();
  kiln_idx idx;
  assert_int_equal(kiln_idx_read(labels, &idx), KILN_OK);
  assert_int_equal(idx.ndims, 1);
  assert_int_equal(idx.dims[0], 10000);
  int per_class[10] = {0};
  for (size_t i = 0; i < idx.count; i++) {
    assert_true(idx.data[i] <= 9);
    per_class[idx.data[i]]++;
  }
  for (int c = 0; c < 10; c++)
    assert_int_equal(per_class[c], 1000); /* the test split is balanced */
  kiln_idx_free(&idx);
  assert_int_equal(kiln_idx_read(images, &idx), KILN_OK);
  assert_int_equal(idx.ndims, 3);
  assert_int_equal(idx.dims[0], 10000);
  assert_int_equal(idx.dims[1], 28);
  assert_int_equal(idx.dims[2], 28);
  assert_int_equal(idx.count, 10000 * 28 * 28);
  kiln_idx_free(&idx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256_vectors),
      cmocka_unit_test_setup_teardown(test_sha256_streaming_and_file, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_idx_plain_and_gzip, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_idx_errors, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_and_read, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_errors, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_channels, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_writer_float_and_growth, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_fingerprint, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_compute_mean, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_reader_errors, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_bad_records, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_cache_dir, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_fetch_checks_hashes, setup_dir, tmpdir_teardown),
      cmocka_unit_test(test_fashion_mnist_idx),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
