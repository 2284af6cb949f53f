/* The HDF5 layers. HDF5Data: shapes and values from float, double and integer datasets, batches
 * across file boundaries and the wrap at the end of a pass, shuffle (reproducible from the seed,
 * another order every pass, a file's records together), exact resume mid-file, workers dealing
 * whole global batches, the fingerprint, and bad input, each refused naming the file (and the
 * dataset). HDF5Output: the records of every forward, in Caffe's shapes, read back; written whole
 * under its name. The HDF5 data reader itself: conversions, compressed chunks, the files it
 * refuses, and files that crash libhdf5 (read in a child process). Test files are written with
 * libhdf5 directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "files.h"
#include "kiln/data.h"
#include "layer_test.h"

/* ---- test files ---------------------------------------------------------------------------- */

static char dir[64];

static const char *at(const char *name) {
  static char buf[8][256];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 256, "%s/%s", dir, name);
  return p;
}

/* Dataset `name` of `type` and shape dims[0 .. rank) holding values[] (converted from double). */
static void put(hid_t f, const char *name, hid_t type, int rank, const hsize_t *dims,
                const double *values) {
  hid_t space = H5Screate_simple(rank, dims, NULL);
  hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  assert_true(d >= 0);
  assert_true(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
  H5Dclose(d);
  H5Sclose(space);
}

enum { PER = 6 }; /* values in a record of "data": 2 x 3 */

/* A record's values: its id * 8 + k, exact in float. */
static double value(int id, int k) { return id * 8.0 + k; }

/* A data file of `rows` records with ids first, first + 1, ...: "data" (rows x 2 x 3),
 * "label" (rows) holding the id, "idx" (rows) holding 2 x id, each of the given type. */
static void write_records(const char *path, int rows, int first, hid_t data_type,
                          hid_t label_type, hid_t idx_type) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  assert_true(f >= 0);
  double data[64 * PER], label[64], idx[64];
  assert_true(rows <= 64);
  for (int r = 0; r < rows; r++) {
    for (int k = 0; k < PER; k++) data[r * PER + k] = value(first + r, k);
    label[r] = first + r;
    idx[r] = 2.0 * (first + r);
  }
  put(f, "data", data_type, 3, (hsize_t[]){(hsize_t)rows, 2, 3}, data);
  put(f, "label", label_type, 1, (hsize_t[]){(hsize_t)rows}, label);
  put(f, "idx", idx_type, 1, (hsize_t[]){(hsize_t)rows}, idx);
  H5Fclose(f);
}

static void write_text(const char *path, const char *text) {
  write_plain(path, text, strlen(text));
}

/* a.h5: ids 0-4, b.h5: 10-12, c.h5: 20-23, d.h5: 30-31 (of float, double and integer types). */
enum { NA = 5, NB = 3, NC = 4, ND = 2 };

static int setup_files(void **state) {
  (void)state;
  make_tmpdir(dir, sizeof dir, "hdf5");
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  write_records(at("a.h5"), NA, 0, H5T_IEEE_F32LE, H5T_IEEE_F64LE, H5T_STD_I32LE);
  write_records(at("b.h5"), NB, 10, H5T_IEEE_F64LE, H5T_IEEE_F32LE, H5T_STD_U8LE);
  write_records(at("c.h5"), NC, 20, H5T_IEEE_F64BE, H5T_STD_I64LE, H5T_STD_I16BE);
  write_records(at("d.h5"), ND, 30, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
  char list[1024];
  snprintf(list, sizeof list, "%s\n%s\n", at("a.h5"), at("b.h5"));
  write_text(at("ab.txt"), list);
  /* white space of any kind between paths, as Caffe reads them */
  snprintf(list, sizeof list, "  %s\n\n %s\t%s\r\n%s", at("a.h5"), at("b.h5"), at("c.h5"),
           at("d.h5"));
  write_text(at("abcd.txt"), list);
  return 0;
}

static int remove_files(void **state) {
  (void)state;
  rm_tree(dir);
  return 0;
}

/* ---- the layer ----------------------------------------------------------------------------- */

typedef struct {
  Caffe__LayerParameter *lp;
  kiln_blob *top[3];
  int ntop;
  kiln_layer *l;
  kiln_config cfg;
} h5layer;

/* The allowance of HDF5 data the layers opened get (KILN_HDF5_FILE_LIMIT); 0: the default. */
static uint64_t file_limit;

/* An HDF5Data layer on `list` with tops data, label (and idx when ntop is 3). */
static int open_h5(h5layer *d, const char *list, const char *extra, int ntop, uint64_t seed) {
  char text[2048];
  snprintf(text, sizeof text,
           "name: 'h' type: 'HDF5Data' top: 'data' top: 'label' %s hdf5_data_param { source: "
           "'%s' %s }",
           ntop == 3 ? "top: 'idx'" : "", list, extra);
  d->lp = gc_layer_param(text);
  d->ntop = ntop;
  for (int t = 0; t < ntop; t++)
    d->top[t] = kiln_blob_new(t == 0 ? "data" : t == 1 ? "label" : "idx");
  d->cfg = *kiln_test_config();
  d->cfg.hdf5_file_limit = file_limit;
  return kiln_layer_create(d->lp, TRAIN, NULL, 0, d->top, ntop, seed, &d->cfg, &d->l);
}

static void close_h5(h5layer *d) {
  kiln_layer_free(d->l);
  for (int t = 0; t < d->ntop; t++) kiln_blob_free(d->top[t]);
  protobuf_c_message_free_unpacked(&d->lp->base, NULL);
}

/* One batch: its ids (from the labels), after checking that every record's data are its id's. */
static int next_ids(h5layer *d, int *ids) {
  assert_int_equal(layer_forward(d->l), KILN_OK);
  const int n = (int)d->top[1]->shape[0];
  for (int i = 0; i < n; i++) {
    ids[i] = (int)d->top[1]->data[i];
    for (int k = 0; k < PER; k++)
      if (d->top[0]->data[i * PER + k] != (float)value(ids[i], k))
        fail_msg("record %d (id %d): value %d is %g, want %g", i, ids[i], k,
                 (double)d->top[0]->data[i * PER + k], value(ids[i], k));
    if (d->ntop == 3 && d->top[2]->data[i] != 2.0f * ids[i])
      fail_msg("record %d (id %d): idx %g", i, ids[i], (double)d->top[2]->data[i]);
  }
  return n;
}

static void test_shapes_values_files_and_wrap(void **state) {
  (void)state;
  h5layer d;
  assert_int_equal(open_h5(&d, at("ab.txt"), "batch_size: 3", 3, 1), KILN_OK);
  assert_true(d.l->ops->is_data);
  assert_null(d.l->ops->backward);
  expect_shape(d.top[0], 3, SHAPE(3, 2, 3));
  expect_shape(d.top[1], 1, SHAPE(3));
  expect_shape(d.top[2], 1, SHAPE(3));
  /* 8 records a pass: batches run across a.h5's end into b.h5, and wrap into the next pass */
  const int want[4][3] = {{0, 1, 2}, {3, 4, 10}, {11, 12, 0}, {1, 2, 3}};
  for (int b = 0; b < 4; b++) {
    int ids[3];
    assert_int_equal(next_ids(&d, ids), 3);
    assert_memory_equal(ids, want[b], sizeof ids);
  }
  assert_int_equal(d.l->ops->get_cursor(d.l), 12);
  close_h5(&d);
  /* four files of float, double and integer types, listed with odd white space; a batch larger
   * than a file and than a pass */
  assert_int_equal(open_h5(&d, at("abcd.txt"), "batch_size: 16 prefetch: 1", 3, 1), KILN_OK);
  const int order[14] = {0, 1, 2, 3, 4, 10, 11, 12, 20, 21, 22, 23, 30, 31};
  for (int b = 0; b < 3; b++) {
    int ids[16];
    assert_int_equal(next_ids(&d, ids), 16);
    for (int i = 0; i < 16; i++) assert_int_equal(ids[i], order[(b * 16 + i) % 14]);
  }
  close_h5(&d);
}

/* Reads `batches` batches of `batch` records: every id in order. */
static void read_ids(h5layer *d, int batches, int batch, int *ids) {
  for (int b = 0; b < batches; b++) assert_int_equal(next_ids(d, ids + b * batch), batch);
}

static int file_of_id(int id) { return id / 10; }

static void test_shuffle_per_pass_and_seed(void **state) {
  (void)state;
  enum { PASS = NA + NB + NC + ND, PASSES = 4 };
  int a[PASS * PASSES], b[PASS * PASSES], c[PASS * PASSES], plain[PASS * PASSES];
  h5layer d;
  /* batch 7 of a 14-record pass: two batches a pass */
  assert_int_equal(open_h5(&d, at("abcd.txt"), "batch_size: 7 shuffle: true", 3, 5), KILN_OK);
  read_ids(&d, 2 * PASSES, 7, a);
  close_h5(&d);
  assert_int_equal(open_h5(&d, at("abcd.txt"), "batch_size: 7 shuffle: true", 3, 5), KILN_OK);
  read_ids(&d, 2 * PASSES, 7, b);
  close_h5(&d);
  assert_memory_equal(a, b, sizeof a); /* the same seed: the same order */
  assert_int_equal(open_h5(&d, at("abcd.txt"), "batch_size: 7 shuffle: true", 3, 6), KILN_OK);
  read_ids(&d, 2 * PASSES, 7, c);
  close_h5(&d);
  assert_memory_not_equal(a, c, sizeof a); /* another seed, another order */
  assert_int_equal(open_h5(&d, at("abcd.txt"), "batch_size: 7", 3, 5), KILN_OK);
  read_ids(&d, 2 * PASSES, 7, plain);
  close_h5(&d);
  int passes_differ = 0, files_moved = 0;
  for (int p = 0; p < PASSES; p++) {
    const int *q = a + p * PASS;
    /* every record once a pass */
    int seen[40] = {0};
    for (int i = 0; i < PASS; i++) seen[q[i]]++;
    for (int i = 0; i < PASS; i++) assert_int_equal(seen[plain[i]], 1);
    /* a file's records together (Caffe does not interleave files), in another order */
    int runs = 1;
    for (int i = 1; i < PASS; i++) runs += file_of_id(q[i]) != file_of_id(q[i - 1]);
    assert_int_equal(runs, 4);
    files_moved += file_of_id(q[0]) != 0 || file_of_id(q[PASS - 1]) != 3;
    if (p && memcmp(q, a + (p - 1) * PASS, sizeof(int) * PASS)) passes_differ++;
  }
  assert_int_equal(passes_differ, PASSES - 1); /* another order every pass */
  assert_true(files_moved > 0);
  /* the rows within a file too: a file's records in one pass against the pass before */
  int rows_moved = 0;
  for (int p = 1; p < PASSES; p++)
    for (int f = 0; f < 4; f++) {
      int now[8], before[8], n = 0, m = 0;
      for (int i = 0; i < PASS; i++) {
        if (file_of_id(a[p * PASS + i]) == f) now[n++] = a[p * PASS + i];
        if (file_of_id(a[(p - 1) * PASS + i]) == f) before[m++] = a[(p - 1) * PASS + i];
      }
      assert_int_equal(n, m);
      rows_moved += memcmp(now, before, sizeof(int) * (size_t)n) != 0;
    }
  assert_true(rows_moved >= PASSES); /* of 4 files in 3 pairs of passes, most */
}

/* Resume: a second layer set to the first's cursor reads what the first reads next, bit for bit:
 * mid-file, across files and the wrap, with and without shuffle. */
static void test_resume_mid_file(void **state) {
  (void)state;
  const char *cases[] = {"batch_size: 3", "batch_size: 3 shuffle: true",
                         "batch_size: 5 prefetch: 1", "batch_size: 4 shuffle: true prefetch: 2"};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int skip = 1; skip <= 4; skip++) {
      h5layer a, b;
      assert_int_equal(open_h5(&a, at("abcd.txt"), cases[c], 3, 9), KILN_OK);
      assert_int_equal(open_h5(&b, at("abcd.txt"), cases[c], 3, 9), KILN_OK);
      int ids[16];
      for (int i = 0; i < skip; i++) next_ids(&a, ids);
      const uint64_t cur = a.l->ops->get_cursor(a.l);
      assert_int_equal(b.l->ops->set_cursor(b.l, cur), KILN_OK);
      for (int i = 0; i < 8; i++) {
        int x[16], y[16];
        const int n = next_ids(&a, x);
        assert_int_equal(next_ids(&b, y), n);
        assert_memory_equal(x, y, sizeof(int) * (size_t)n);
        for (int t = 0; t < 3; t++)
          assert_memory_equal(a.top[t]->data, b.top[t]->data, sizeof(float) * a.top[t]->count);
      }
      assert_true(a.l->ops->get_cursor(a.l) == b.l->ops->get_cursor(b.l));
      /* set back on itself: the layer goes on from there, too */
      const uint64_t back = a.l->ops->get_cursor(a.l);
      int x[16], y[16];
      const int n = next_ids(&a, x);
      assert_int_equal(a.l->ops->set_cursor(a.l, back), KILN_OK);
      assert_int_equal(next_ids(&a, y), n);
      assert_memory_equal(x, y, sizeof(int) * (size_t)n);
      close_h5(&a);
      close_h5(&b);
    }
}

/* N workers read global batches r, r + N, ... of one worker's stream, and the cursor after a
 * round is one worker's after as many batches: resumable on N workers or on one. */
static void test_sharded_workers_deal_whole_batches(void **state) {
  (void)state;
  const char *cases[] = {"batch_size: 3", "batch_size: 2 shuffle: true", "batch_size: 5",
                         "batch_size: 4 shuffle: true prefetch: 1"};
  enum { ROUNDS = 6, MAXN = 3 };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int n = 2; n <= MAXN; n++) {
      const int total = (ROUNDS + 1) * n;
      int single[(ROUNDS + 1) * MAXN][8], count[(ROUNDS + 1) * MAXN];
      uint64_t cursor_after[(ROUNDS + 1) * MAXN];
      h5layer one;
      assert_int_equal(open_h5(&one, at("abcd.txt"), cases[c], 2, 4), KILN_OK);
      for (int j = 0; j < total; j++) {
        count[j] = next_ids(&one, single[j]);
        cursor_after[j] = one.l->ops->get_cursor(one.l);
      }
      close_h5(&one);
      h5layer w[MAXN];
      for (int r = 0; r < n; r++) {
        assert_int_equal(open_h5(&w[r], at("abcd.txt"), cases[c], 2, 4), KILN_OK);
        w[r].l->shard_rank = r;
        w[r].l->shard_count = n;
      }
      for (int k = 0; k < ROUNDS; k++)
        for (int r = 0; r < n; r++) {
          int ids[8];
          const int j = k * n + r, got = next_ids(&w[r], ids);
          if (got != count[j] || memcmp(ids, single[j], sizeof(int) * (size_t)got))
            fail_msg("case '%s', %d workers: rank %d batch %d is not global batch %d", cases[c], n,
                     r, k, j);
        }
      const uint64_t cursor = w[0].l->ops->get_cursor(w[0].l);
      for (int r = 0; r < n; r++) assert_true(w[r].l->ops->get_cursor(w[r].l) == cursor);
      assert_true(cursor == cursor_after[ROUNDS * n - 1]);
      for (int r = 0; r < n; r++) {
        assert_int_equal(w[r].l->ops->set_cursor(w[r].l, cursor), KILN_OK);
        int ids[8];
        const int got = next_ids(&w[r], ids);
        assert_int_equal(got, count[ROUNDS * n + r]);
        assert_memory_equal(ids, single[ROUNDS * n + r], sizeof(int) * (size_t)got);
        close_h5(&w[r]);
      }
      h5layer again;
      assert_int_equal(open_h5(&again, at("abcd.txt"), cases[c], 2, 4), KILN_OK);
      assert_int_equal(again.l->ops->set_cursor(again.l, cursor), KILN_OK);
      for (int j = ROUNDS * n; j < total; j++) {
        int ids[8];
        assert_int_equal(next_ids(&again, ids), count[j]);
        assert_memory_equal(ids, single[j], sizeof(int) * (size_t)count[j]);
      }
      close_h5(&again);
    }
}

/* Many small files through the two file buffers, with a ring of 1 and of 8 batches: the same
 * batches. */
static void test_many_files_through_the_loader(void **state) {
  (void)state;
  char list[4096] = "";
  enum { FILES = 9 };
  for (int i = 0; i < FILES; i++) {
    char name[32];
    snprintf(name, sizeof name, "m%d.h5", i);
    write_records(at(name), 1 + i % 3, 100 + 4 * i, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
    strcat(list, at(name));
    strcat(list, "\n");
  }
  write_text(at("many.txt"), list);
  int x[60], y[60], z[60];
  h5layer d;
  assert_int_equal(open_h5(&d, at("many.txt"), "batch_size: 2 prefetch: 1", 3, 1), KILN_OK);
  read_ids(&d, 30, 2, x);
  close_h5(&d);
  assert_int_equal(open_h5(&d, at("many.txt"), "batch_size: 2 prefetch: 8", 3, 1), KILN_OK);
  read_ids(&d, 30, 2, y);
  close_h5(&d);
  assert_memory_equal(x, y, sizeof x);
  for (int i = 0, k = 0; i < 60; k++) /* in list order, pass after pass */
    for (int f = 0; f < FILES && i < 60; f++)
      for (int r = 0; r < 1 + f % 3 && i < 60; r++) assert_int_equal(x[i++], 100 + 4 * f + r);
  assert_int_equal(open_h5(&d, at("many.txt"), "batch_size: 3 shuffle: true prefetch: 1", 3, 1),
                   KILN_OK);
  read_ids(&d, 20, 3, z);
  close_h5(&d);
  assert_int_equal(open_h5(&d, at("many.txt"), "batch_size: 3 shuffle: true prefetch: 8", 3, 1),
                   KILN_OK);
  read_ids(&d, 20, 3, y);
  close_h5(&d);
  assert_memory_equal(z, y, sizeof z);
}

/* Three files that fit in memory together stay there once loaded: moved away after the first
 * pass, they still give the second and third passes. With an allowance that holds two files'
 * buffers but not three, the layer keeps two and loads the third again when the walk reaches it,
 * which then fails naming the file that is gone (which of the three was let go depends on how
 * far the threads that read ahead had got). */
static void test_small_files_stay_resident(void **state) {
  (void)state;
  write_records(at("r1.h5"), 4, 40, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
  write_records(at("r2.h5"), 4, 50, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
  write_records(at("r3.h5"), 4, 60, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
  char list[1024];
  snprintf(list, sizeof list, "%s\n%s\n%s\n", at("r1.h5"), at("r2.h5"), at("r3.h5"));
  write_text(at("r.txt"), list);
  struct stat st;
  uint64_t largest = 0;
  for (int i = 1; i <= 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "r%d.h5", i);
    assert_int_equal(stat(at(name), &st), 0);
    if ((uint64_t)st.st_size > largest) largest = (uint64_t)st.st_size;
  }
  for (int mode = 0; mode < 2; mode++) {
    /* a buffer: 4 records of 6 + 1 + 1 floats = 128 bytes; two fit below 3 x 128 */
    file_limit = mode == 0 ? 0 : largest + 2 * 128 + 64;
    h5layer d;
    assert_int_equal(open_h5(&d, at("r.txt"), "batch_size: 4 prefetch: 1", 3, 1), KILN_OK);
    int ids[4];
    for (int b = 0; b < 3; b++) { /* the first pass: every file loaded */
      assert_int_equal(next_ids(&d, ids), 4);
      assert_int_equal(ids[0], 40 + 10 * b);
    }
    for (int i = 1; i <= 3; i++) {
      char from[16], to[16];
      snprintf(from, sizeof from, "r%d.h5", i);
      snprintf(to, sizeof to, "gone%d.h5", i);
      assert_int_equal(rename(at(from), at(to)), 0);
    }
    if (mode == 0) {
      for (int b = 0; b < 6; b++) {
        assert_int_equal(next_ids(&d, ids), 4);
        assert_int_equal(ids[0], 40 + 10 * (b % 3));
        assert_int_equal(ids[3], 43 + 10 * (b % 3));
      }
    } else {
      int rc = KILN_OK;
      for (int b = 0; b < 6 && rc == KILN_OK; b++) rc = layer_forward(d.l);
      assert_int_not_equal(rc, KILN_OK);
      /* r1.h5 most often, r2.h5 in about one run of twenty on a busy machine: the threads that
       * read ahead decide which file was let go before the files moved */
      const char *e = kiln_last_error();
      assert_non_null(strstr(e, "cannot open"));
      assert_true(strstr(e, "r1.h5") || strstr(e, "r2.h5") || strstr(e, "r3.h5"));
    }
    close_h5(&d);
    for (int i = 1; i <= 3; i++) {
      char from[16], to[16];
      snprintf(from, sizeof from, "gone%d.h5", i);
      snprintf(to, sizeof to, "r%d.h5", i);
      assert_int_equal(rename(at(from), at(to)), 0);
    }
  }
  file_limit = 0;
}

/* The same files give the same fingerprint; a changed byte, another. */
static void test_fingerprint(void **state) {
  (void)state;
  write_records(at("f1.h5"), 4, 40, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
  write_records(at("f2.h5"), 4, 40, H5T_IEEE_F32LE, H5T_IEEE_F32LE, H5T_STD_I32LE);
  write_text(at("f1.txt"), at("f1.h5"));
  write_text(at("f2.txt"), at("f2.h5"));
  uint8_t d1[32], d2[32], d3[32];
  char what[512];
  h5layer a;
  assert_int_equal(open_h5(&a, at("f1.txt"), "batch_size: 2", 2, 1), KILN_OK);
  assert_int_equal(a.l->ops->fingerprint(a.l, d1, what, sizeof what), KILN_OK);
  assert_non_null(strstr(what, "f1.txt (1 HDF5 file, 4 records, compared by their sizes"));
  close_h5(&a);
  assert_int_equal(open_h5(&a, at("f2.txt"), "batch_size: 2", 2, 1), KILN_OK);
  assert_int_equal(a.l->ops->fingerprint(a.l, d2, what, sizeof what), KILN_OK);
  close_h5(&a);
  assert_memory_equal(d1, d2, 32);
  /* the last value of the data, stored at the file's end by libhdf5, changed */
  hid_t f = H5Fopen(at("f2.h5"), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "idx", H5P_DEFAULT);
  int v[4] = {80, 82, 84, 87};
  assert_true(H5Dwrite(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  H5Dclose(d);
  H5Fclose(f);
  assert_int_equal(open_h5(&a, at("f2.txt"), "batch_size: 2", 2, 1), KILN_OK);
  assert_int_equal(a.l->ops->fingerprint(a.l, d3, what, sizeof what), KILN_OK);
  assert_memory_not_equal(d1, d3, 32);
  /* asked for after the data started flowing: refused */
  assert_int_equal(layer_forward(a.l), KILN_OK);
  assert_int_equal(a.l->ops->fingerprint(a.l, d3, what, sizeof what), KILN_ERR_INVALID);
  close_h5(&a);
}

/* ---- bad input ------------------------------------------------------------------------------ */

/* Setting up an HDF5Data layer on a list naming `file` (NULL: `list` is the list) fails with
 * `code` and a message holding the fragments. */
static void expect_refused(const char *file, const char *list, const char *extra, uint64_t limit,
                           int code, const char *a, const char *b, const char *c) {
  if (file) {
    write_text(at("one.txt"), file);
    list = at("one.txt");
  }
  char text[2048];
  snprintf(text, sizeof text, "name: 'h' type: 'HDF5Data' top: 'data' top: 'label' "
           "hdf5_data_param { source: '%s' batch_size: 2 } %s", list, extra ? extra : "");
  Caffe__LayerParameter *lp = gc_layer_param(text);
  kiln_blob *top[2] = {kiln_blob_new("data"), kiln_blob_new("label")};
  kiln_config cfg = *kiln_test_config();
  cfg.hdf5_file_limit = limit;
  kiln_layer *l = NULL;
  const int rc = kiln_layer_create(lp, TRAIN, NULL, 0, top, 2, 1, &cfg, &l);
  if (rc != code) fail_msg("got %s (%s), want %s", kiln_status_name(rc), kiln_last_error(),
                           kiln_status_name(code));
  expect_message("layer 'h' (HDF5Data)", a, b);
  expect_message(c, NULL, NULL);
  assert_null(l);
  kiln_blob_free(top[0]);
  kiln_blob_free(top[1]);
  protobuf_c_message_free_unpacked(&lp->base, NULL);
}

static void test_bad_input_named(void **state) {
  (void)state;
  /* a truncated file */
  char *bytes;
  size_t len;
  assert_int_equal(kiln_read_file(at("a.h5"), &bytes, &len), KILN_OK);
  write_plain(at("cut.h5"), bytes, len / 2);
  free(bytes);
  expect_refused(at("cut.h5"), NULL, NULL, 0, KILN_ERR_PARSE, at("cut.h5"),
                 "not a readable HDF5 file (corrupt or truncated)", "one.txt, line 1");
  /* a file that is no HDF5 at all, and a folder */
  write_text(at("text.h5"), "just text\n");
  expect_refused(at("text.h5"), NULL, NULL, 0, KILN_ERR_PARSE, at("text.h5"), "not an HDF5 file",
                 NULL);
  expect_refused(dir, NULL, NULL, 0, KILN_ERR_IO, dir, "not a regular file", NULL);
  /* a top with no dataset of its name */
  hid_t f = H5Fcreate(at("nolabel.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 2, (hsize_t[]){3, 2}, (double[]){1, 2, 3, 4, 5, 6});
  put(f, "labels", H5T_IEEE_F32LE, 1, (hsize_t[]){3}, (double[]){1, 2, 3});
  H5Fclose(f);
  expect_refused(at("nolabel.h5"), NULL, NULL, 0, KILN_ERR_DATA, at("nolabel.h5"),
                 "no dataset 'label'", NULL);
  /* datasets whose first axes disagree */
  f = H5Fcreate(at("rows.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 2, (hsize_t[]){3, 2}, (double[]){1, 2, 3, 4, 5, 6});
  put(f, "label", H5T_IEEE_F32LE, 1, (hsize_t[]){2}, (double[]){1, 2});
  H5Fclose(f);
  expect_refused(at("rows.h5"), NULL, NULL, 0, KILN_ERR_DATA, at("rows.h5"),
                 "dataset 'label' holds 2 records (its first axis), dataset 'data' 3",
                 "one row per record");
  /* an empty list, and one of white space alone */
  write_text(at("empty.txt"), "");
  expect_refused(NULL, at("empty.txt"), NULL, 0, KILN_ERR_INVALID, at("empty.txt"),
                 "names no HDF5 files", NULL);
  write_text(at("blank.txt"), " \n\n\t\n");
  expect_refused(NULL, at("blank.txt"), NULL, 0, KILN_ERR_INVALID, at("blank.txt"),
                 "names no HDF5 files", NULL);
  /* a list that is not there, and a list naming a file that is not there (its line named) */
  expect_refused(NULL, at("nolist.txt"), NULL, 0, KILN_ERR_IO, at("nolist.txt"),
                 "hdf5_data_param.source", NULL);
  char list[512];
  snprintf(list, sizeof list, "%s\n\n%s\n", at("a.h5"), at("missing.h5"));
  write_text(at("gone.txt"), list);
  expect_refused(NULL, at("gone.txt"), NULL, 0, KILN_ERR_IO, at("missing.h5"),
                 "gone.txt, line 3", "No such file");
  /* a file over the memory allowance: its bytes and its values as floats */
  expect_refused(at("a.h5"), NULL, NULL, 1024, KILN_ERR_NOMEM, at("a.h5"),
                 "over the memory allowance of 1.0 KiB per HDF5 data file",
                 "KILN_HDF5_FILE_LIMIT");
  /* records of another shape than the first file's */
  f = H5Fcreate(at("wide.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 3, (hsize_t[]){1, 3, 2}, (double[]){1, 2, 3, 4, 5, 6});
  put(f, "label", H5T_IEEE_F32LE, 1, (hsize_t[]){1}, (double[]){1});
  H5Fclose(f);
  snprintf(list, sizeof list, "%s %s", at("a.h5"), at("wide.h5"));
  write_text(at("wide.txt"), list);
  expect_refused(NULL, at("wide.txt"), NULL, 0, KILN_ERR_SHAPE, at("wide.h5"),
                 "dataset 'data' holds records of 3x2", "(the first file) of 2x3");
  /* strings are no numbers; a single value is no records */
  f = H5Fcreate(at("str.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 1, (hsize_t[]){1}, (double[]){1});
  hid_t st = H5Tcopy(H5T_C_S1);
  H5Tset_size(st, 4);
  hid_t space = H5Screate_simple(1, (hsize_t[]){1}, NULL);
  hid_t d = H5Dcreate2(f, "label", st, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, st, H5S_ALL, H5S_ALL, H5P_DEFAULT, "abc");
  H5Dclose(d);
  H5Sclose(space);
  H5Tclose(st);
  H5Fclose(f);
  expect_refused(at("str.h5"), NULL, NULL, 0, KILN_ERR_DATA, at("str.h5"),
                 "dataset 'label' holds strings, not numbers", NULL);
  f = H5Fcreate(at("scalar.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 1, (hsize_t[]){1}, (double[]){1});
  space = H5Screate(H5S_SCALAR);
  d = H5Dcreate2(f, "label", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, (double[]){1});
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
  expect_refused(at("scalar.h5"), NULL, NULL, 0, KILN_ERR_DATA, at("scalar.h5"),
                 "dataset 'label' holds a single value, not records", NULL);
  /* a link into another file (libhdf5 would open it by name) */
  f = H5Fcreate(at("link.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 1, (hsize_t[]){5}, (double[]){1, 2, 3, 4, 5});
  assert_true(H5Lcreate_external(at("a.h5"), "label", f, "label", H5P_DEFAULT, H5P_DEFAULT) >= 0);
  H5Fclose(f);
  expect_refused(at("link.h5"), NULL, NULL, 0, KILN_ERR_DATA, at("link.h5"),
                 "'label' is a external link", NULL);
  /* the layer's own parameters */
  expect_refused(at("a.h5"), NULL, "transform_param { scale: 2 }", 0, KILN_ERR_UNSUPPORTED,
                 "does not transform its data", NULL, NULL);
  expect_create_fails("name: 'h' type: 'HDF5Data' top: 'data' hdf5_data_param { batch_size: 2 }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'h' (HDF5Data)",
                      "hdf5_data_param.source is required");
  char text[512];
  snprintf(text, sizeof text, "name: 'h' type: 'HDF5Data' top: 'data' hdf5_data_param { source: "
           "'%s' }", at("ab.txt"));
  expect_create_fails(text, TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'h' (HDF5Data)",
                      "batch_size must be set");
  snprintf(text, sizeof text, "name: 'h' type: 'HDF5Data' top: 'data' hdf5_data_param { source: "
           "'%s' batch_size: 2 prefetch: 65 }", at("ab.txt"));
  expect_create_fails(text, TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'h' (HDF5Data)",
                      "prefetch 65 is more than 64");
}

/* A damaged value is found when its file is loaded: refused at the forward that needs it, naming
 * the file, the dataset and the record. */
static void test_bad_values_refused_when_loaded(void **state) {
  (void)state;
  hid_t f = H5Fcreate(at("nan.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F32LE, 2, (hsize_t[]){2, 2}, (double[]){1, 2, 3, NAN});
  put(f, "label", H5T_IEEE_F32LE, 1, (hsize_t[]){2}, (double[]){1, 2});
  H5Fclose(f);
  f = H5Fcreate(at("huge.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  put(f, "data", H5T_IEEE_F64LE, 2, (hsize_t[]){2, 2}, (double[]){1, 2, 1e300, 4});
  put(f, "label", H5T_IEEE_F32LE, 1, (hsize_t[]){2}, (double[]){1, 2});
  H5Fclose(f);
  const char *names[2] = {"nan.h5", "huge.h5"};
  const char *want[2] = {"dataset 'data', record 1: value 1 is nan; the values must be finite",
                         "dataset 'data' holds a value beyond the range of float"};
  for (int i = 0; i < 2; i++) {
    write_text(at("bad.txt"), at(names[i]));
    char text[512];
    snprintf(text, sizeof text, "name: 'h' type: 'HDF5Data' top: 'data' top: 'label' "
             "hdf5_data_param { source: '%s' batch_size: 1 }", at("bad.txt"));
    Caffe__LayerParameter *lp = gc_layer_param(text);
    kiln_blob *top[2] = {kiln_blob_new("data"), kiln_blob_new("label")};
    kiln_layer *l;
    assert_int_equal(kiln_layer_create(lp, TRAIN, NULL, 0, top, 2, 1, kiln_test_config(), &l),
                     KILN_OK);
    assert_int_equal(layer_forward(l), KILN_ERR_NUMERIC);
    expect_message("layer 'h' (HDF5Data)", at(names[i]), want[i]);
    kiln_layer_free(l);
    kiln_blob_free(top[0]);
    kiln_blob_free(top[1]);
    protobuf_c_message_free_unpacked(&lp->base, NULL);
  }
}

/* ---- the reader on its own ------------------------------------------------------------------ */

static void test_reader_conversions_and_images(void **state) {
  (void)state;
  const char *names[3] = {"data", "label", "idx"};
  kiln_h5data_shape shapes[3];
  uint64_t bytes;
  assert_int_equal(kiln_h5data_inspect(at("c.h5"), 3, names, 0, shapes, &bytes), KILN_OK);
  assert_int_equal(shapes[0].naxes, 3);
  assert_true(shapes[0].dims[0] == NC && shapes[0].dims[1] == 2 && shapes[0].dims[2] == 3);
  assert_int_equal(kiln_h5data_record_size(&shapes[0]), PER);
  assert_int_equal(kiln_h5data_record_size(&shapes[1]), 1);
  struct stat st;
  assert_int_equal(stat(at("c.h5"), &st), 0);
  assert_true(bytes == (uint64_t)st.st_size);
  /* big-endian doubles and integers, read as floats, from a file and from its image */
  float data[NC * PER], label[NC], idx[NC];
  float *dst[3] = {data, label, idx};
  const uint64_t room[3] = {NC * PER, NC, NC};
  for (int way = 0; way < 2; way++) {
    memset(data, 0, sizeof data);
    if (way == 0) {
      assert_int_equal(kiln_h5data_load(at("c.h5"), 3, names, 0, shapes, dst, room), KILN_OK);
    } else {
      char *image;
      size_t len;
      assert_int_equal(kiln_read_file(at("c.h5"), &image, &len), KILN_OK);
      assert_int_equal(kiln_h5data_inspect_image(image, len, "c-image", 3, names, 0, shapes),
                       KILN_OK);
      assert_int_equal(kiln_h5data_load_image(image, len, "c-image", 3, names, 0, shapes, dst,
                                              room), KILN_OK);
      free(image);
    }
    for (int r = 0; r < NC; r++) {
      assert_true(label[r] == 20 + r && idx[r] == 2 * (20 + r));
      for (int k = 0; k < PER; k++) assert_true(data[r * PER + k] == (float)value(20 + r, k));
    }
  }
  /* into a region, as HDF5Data loads: a shared memory file the worker fills in place, and the
   * plain memory used where there is none (through the pipe); the values land at their offsets
   * and the rest of the region is untouched */
  for (int shared = 1; shared >= 0; shared--) {
    kiln_h5data_region r;
    assert_int_equal(kiln_h5data_region_new(sizeof(float) * 64, &r), KILN_OK);
    if (shared) {
      assert_true(r.fd >= 0); /* Linux has memfd_create */
    } else {
      kiln_h5data_region_free(&r);
      r.base = kiln_alloc(sizeof(float) * 64);
      r.bytes = sizeof(float) * 64;
      r.fd = -1;
    }
    for (int i = 0; i < 64; i++) r.base[i] = -7;
    const uint64_t offset[3] = {16, 0, 48};
    assert_int_equal(kiln_h5data_load_region(at("c.h5"), 3, names, 0, shapes, &r, offset, room),
                     KILN_OK);
    for (int row = 0; row < NC; row++) {
      assert_true(r.base[row] == 20 + row && r.base[48 + row] == 2 * (20 + row));
      for (int k = 0; k < PER; k++)
        assert_true(r.base[16 + row * PER + k] == (float)value(20 + row, k));
    }
    assert_true(r.base[NC] == -7 && r.base[16 + NC * PER] == -7 && r.base[48 + NC] == -7);
    /* a dataset placed past the region's end is refused before anything is read */
    const uint64_t past[3] = {16, 0, 64 - NC + 1};
    assert_int_equal(kiln_h5data_load_region(at("c.h5"), 3, names, 0, shapes, &r, past, room),
                     KILN_ERR_INVALID);
    expect_message(at("c.h5"), "dataset 'idx' placed past the end of its buffer", NULL);
    if (shared) {
      kiln_h5data_region_free(&r);
    } else {
      kiln_free(r.base);
    }
  }
  /* too little room: refused, not overrun */
  const uint64_t small[3] = {NC * PER - 1, NC, NC};
  assert_int_equal(kiln_h5data_load(at("c.h5"), 3, names, 0, shapes, dst, small), KILN_ERR_DATA);
  expect_message(at("c.h5"), "dataset 'data' holds 24 values, more than the 23", NULL);
  /* a dataset name with a slash is looked for in the root group only, as Caffe does */
  const char *odd[1] = {"g/data"};
  assert_int_equal(kiln_h5data_inspect(at("c.h5"), 1, odd, 0, shapes, NULL), KILN_ERR_DATA);
  expect_message("no dataset 'g/data'", NULL, NULL);
  /* the allowance counts the file's bytes alone before reading it */
  assert_int_equal(kiln_h5data_load(at("c.h5"), 3, names, 100, shapes, dst, room), KILN_ERR_NOMEM);
  expect_message(at("c.h5"), "over the memory allowance of 100 bytes", NULL);
}

/* Compressed data as h5py writes them (chunks through shuffle, deflate and fletcher32) read as
 * the plain; a chunk that inflates to fewer bytes than a chunk holds, which libhdf5 1.10 would
 * read past its buffer for, refused; another filter refused by name. */
static void test_compressed_chunks(void **state) {
  (void)state;
  enum { ROWS = 6 };
  double v[ROWS * PER], lab[ROWS];
  for (int r = 0; r < ROWS; r++) {
    for (int k = 0; k < PER; k++) v[r * PER + k] = value(50 + r, k);
    lab[r] = 50 + r;
  }
  hid_t f = H5Fcreate(at("gz.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 3, (hsize_t[]){4, 2, 3}); /* the second chunk is an edge chunk */
  H5Pset_shuffle(dcpl);
  H5Pset_deflate(dcpl, 6);
  H5Pset_fletcher32(dcpl);
  hid_t space = H5Screate_simple(3, (hsize_t[]){ROWS, 2, 3}, NULL);
  hid_t d = H5Dcreate2(f, "data", H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  assert_true(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  H5Dclose(d);
  H5Sclose(space);
  H5Pclose(dcpl);
  put(f, "label", H5T_IEEE_F32LE, 1, (hsize_t[]){ROWS}, lab);
  H5Fclose(f);
  const char *names[2] = {"data", "label"};
  kiln_h5data_shape shapes[2];
  float data[ROWS * PER], label[ROWS];
  float *dst[2] = {data, label};
  const uint64_t room[2] = {ROWS * PER, ROWS};
  if (kiln_h5data_load(at("gz.h5"), 2, names, 0, shapes, dst, room))
    fail_msg("%s", kiln_last_error());
  for (int i = 0; i < ROWS * PER; i++) assert_true(data[i] == (float)v[i]);

  /* chunk 0 of 2 x 2 x 3 floats (48 bytes) stored as a deflate stream of 20 */
  f = H5Fcreate(at("short.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 3, (hsize_t[]){2, 2, 3});
  H5Pset_deflate(dcpl, 6);
  space = H5Screate_simple(3, (hsize_t[]){2, 2, 3}, NULL);
  d = H5Dcreate2(f, "data", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  uint8_t plain[20] = {1, 2, 3}, packed[128];
  uLongf packed_len = sizeof packed;
  assert_int_equal(compress2(packed, &packed_len, plain, sizeof plain, 6), Z_OK);
  assert_true(H5Dwrite_chunk(d, H5P_DEFAULT, 0, (hsize_t[]){0, 0, 0}, packed_len, packed) >= 0);
  H5Dclose(d);
  H5Sclose(space);
  H5Pclose(dcpl);
  put(f, "label", H5T_IEEE_F32LE, 1, (hsize_t[]){2}, lab);
  H5Fclose(f);
  assert_int_equal(kiln_h5data_inspect(at("short.h5"), 2, names, 0, shapes, NULL), KILN_OK);
  assert_int_equal(kiln_h5data_load(at("short.h5"), 2, names, 0, shapes, dst, room),
                   KILN_ERR_PARSE);
  expect_message(at("short.h5"), "dataset 'data': chunk 0 decompresses to another size, not the "
                 "chunk's 48 bytes", NULL);

  f = H5Fcreate(at("nbit.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, (hsize_t[]){2});
  H5Pset_scaleoffset(dcpl, H5Z_SO_FLOAT_DSCALE, 2);
  space = H5Screate_simple(1, (hsize_t[]){2}, NULL);
  d = H5Dcreate2(f, "label", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, lab);
  H5Dclose(d);
  H5Sclose(space);
  H5Pclose(dcpl);
  H5Fclose(f);
  assert_int_equal(kiln_h5data_inspect(at("nbit.h5"), 1, names + 1, 0, shapes, NULL),
                   KILN_ERR_UNSUPPORTED);
  expect_message(at("nbit.h5"), "dataset 'label' is stored through HDF5 filter 6",
                 "deflate (gzip), shuffle and fletcher32 only");
}

/* Files on which libhdf5 1.10.8 itself crashes (a group's local heap, or its symbol table's
 * node, claiming an impossible size; found by fuzz_h5data: tests/data/damaged-*.fuzz_h5data,
 * the fuzzer's selector byte, then the file). Inspected and loaded in a child process, each is
 * an error naming the file, and the test process lives on; so is the layer's set-up on it.
 * Under AddressSanitizer the child reports and exits instead of dying by the signal; either
 * way the file is called damaged. */
static void test_libhdf5_crash_is_an_error(void **state) {
  (void)state;
  const char *root = getenv("KILN_SOURCE_DIR");
  assert_non_null(root);
  const char *inputs[2] = {"damaged-heap", "damaged-btree"};
  for (int i = 0; i < 2; i++) {
    char path[4096], *bytes;
    size_t len;
    snprintf(path, sizeof path, "%s/tests/data/%s.fuzz_h5data", root, inputs[i]);
    assert_int_equal(kiln_read_file(path, &bytes, &len), KILN_OK);
    assert_true(len > 1);
    char name[64];
    snprintf(name, sizeof name, "%s.h5", inputs[i]);
    write_plain(at(name), bytes + 1, len - 1);
    free(bytes);
    const char *names[2] = {"data", "label"};
    kiln_h5data_shape shapes[2];
    float data[64], label[64];
    float *dst[2] = {data, label};
    assert_int_equal(kiln_h5data_inspect(at(name), 2, names, 0, shapes, NULL), KILN_ERR_PARSE);
    expect_message(at(name), "the file is damaged", NULL);
    assert_int_equal(kiln_h5data_load(at(name), 2, names, 0, shapes, dst, (uint64_t[]){64, 64}),
                     KILN_ERR_PARSE);
    expect_message(at(name), "the file is damaged", NULL);
    expect_refused(at(name), NULL, NULL, 0, KILN_ERR_PARSE, at(name), "the file is damaged",
                   "one.txt, line 1");
  }
}

/* A thread writing HDF5 files (as the main thread writes snapshots and HDF5Output's file) beside
 * one reading them in child processes (as HDF5Data's loader does). Children forked straight from
 * the reading thread hung here: one made while the writer was inside libhdf5 inherited its lock
 * held, and under AddressSanitizer one made while another thread allocated inherited the
 * allocator's. The reader server forks them instead. A hang shows as the test's timeout. */
enum { ROUNDS = 100 };

static void *write_rounds(void *path) {
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = (float)i;
  const char *names[2] = {"data", "label"};
  const kiln_h5data_shape shapes[2] = {{.naxes = 2, .dims = {8, 7}}, {.naxes = 1, .dims = {8}}};
  const float *data[2] = {v, v};
  for (int r = 0; r < ROUNDS; r++)
    if (kiln_h5data_write(path, 2, names, shapes, data)) return (void *)1;
  return NULL;
}

static void test_fork_beside_a_writer(void **state) {
  (void)state;
  char busy[256], a[256]; /* at() is not for two threads */
  snprintf(busy, sizeof busy, "%s", at("busy.h5"));
  snprintf(a, sizeof a, "%s", at("a.h5"));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, write_rounds, busy), 0);
  const char *names[3] = {"data", "label", "idx"};
  kiln_h5data_shape shapes[3];
  float data[NA * PER], label[NA], idx[NA];
  float *dst[3] = {data, label, idx};
  for (int r = 0; r < ROUNDS; r++) {
    assert_int_equal(kiln_h5data_inspect(a, 3, names, 0, shapes, NULL), KILN_OK);
    assert_int_equal(kiln_h5data_load(a, 3, names, 0, shapes, dst,
                                      (uint64_t[]){NA * PER, NA, NA}), KILN_OK);
  }
  void *failed;
  pthread_join(t, &failed);
  assert_null(failed);
  assert_true(label[NA - 1] == NA - 1);
}

/* Written whole, read back the same; a folder that is not there is an error naming the file. */
static void test_writer_round_trip(void **state) {
  (void)state;
  float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
  const char *names[2] = {"data", "label"};
  const kiln_h5data_shape shapes[2] = {{.naxes = 4, .dims = {2, 3, 1, 1}},
                                       {.naxes = 1, .dims = {2}}};
  const float *data[2] = {a, b};
  assert_int_equal(kiln_h5data_write(at("w.h5"), 2, names, shapes, data), KILN_OK);
  assert_false(exists(at("w.h5.tmp")));
  kiln_h5data_shape got[2];
  float ra[6], rb[2];
  float *dst[2] = {ra, rb};
  assert_int_equal(kiln_h5data_load(at("w.h5"), 2, names, 0, got, dst, (uint64_t[]){6, 2}),
                   KILN_OK);
  assert_int_equal(got[0].naxes, 4);
  assert_true(got[0].dims[1] == 3 && got[1].dims[0] == 2);
  assert_memory_equal(ra, a, sizeof a);
  assert_memory_equal(rb, b, sizeof b);
  /* a folder that is not there: an error naming the file */
  assert_int_not_equal(kiln_h5data_write(at("no/such/w.h5"), 2, names, shapes, data), KILN_OK);
  expect_message("no/such/w.h5", NULL, NULL);
}

/* ---- HDF5Output ----------------------------------------------------------------------------- */

static void test_output_writes_every_forward(void **state) {
  (void)state;
  char text[512];
  snprintf(text, sizeof text, "name: 'o' type: 'HDF5Output' bottom: 'p' bottom: 'y' "
           "hdf5_output_param { file_name: '%s' }", at("out.h5"));
  kiln_blob *p = iota_blob("p", 2, SHAPE(3, 4), 0.5f), *y = iota_blob("y", 1, SHAPE(3), 7);
  kiln_blob *in[2] = {p, y};
  built o = build(text, TEST, in, 2, 0);
  assert_null(o.l->ops->backward);
  assert_false(exists(at("out.h5"))); /* written by forward, not at set-up */
  forward(&o);
  assert_true(exists(at("out.h5")));
  for (int64_t i = 0; i < p->count; i++) p->data[i] += 100;
  for (int64_t i = 0; i < y->count; i++) y->data[i] += 100;
  forward(&o);
  /* both forwards' records, in Caffe's 4-D shapes */
  hid_t f = H5Fopen(at("out.h5"), H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  const char *sets[2] = {"data", "label"};
  const hsize_t want[2][4] = {{6, 4, 1, 1}, {6, 1, 1, 1}};
  for (int t = 0; t < 2; t++) {
    hid_t d = H5Dopen2(f, sets[t], H5P_DEFAULT);
    assert_true(d >= 0);
    hid_t sp = H5Dget_space(d);
    hsize_t dims[4];
    assert_int_equal(H5Sget_simple_extent_ndims(sp), 4);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    assert_memory_equal(dims, want[t], sizeof dims);
    hid_t type = H5Dget_type(d);
    assert_true(H5Tequal(type, H5T_IEEE_F32LE) > 0);
    H5Tclose(type);
    H5Sclose(sp);
    H5Dclose(d);
  }
  H5Fclose(f);
  /* and they read back through the data reader */
  kiln_h5data_shape shapes[2];
  float data[24], label[6];
  float *dst[2] = {data, label};
  assert_int_equal(kiln_h5data_load(at("out.h5"), 2, sets, 0, shapes, dst, (uint64_t[]){24, 6}),
                   KILN_OK);
  for (int i = 0; i < 12; i++) {
    assert_true(data[i] == 0.5f + i);
    assert_true(data[12 + i] == 100.5f + i);
  }
  for (int i = 0; i < 3; i++) assert_true(label[i] == 7 + i && label[3 + i] == 107 + i);
  /* no temporary left beside it */
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", at("out.h5"));
  assert_false(exists(tmp));
  unbuild(&o);
  /* bottoms of unequal record counts, a missing file name, a folder that is not there */
  kiln_blob *y2 = iota_blob("y2", 1, SHAPE(2), 0);
  kiln_blob *bad[2] = {p, y2};
  expect_create_fails(text, TEST, bad, 2, 0, KILN_ERR_SHAPE, "layer 'o' (HDF5Output)",
                      "hold 3 and 2 records");
  expect_create_fails("name: 'o' type: 'HDF5Output' bottom: 'p' bottom: 'y'", TEST, in, 2, 0,
                      KILN_ERR_INVALID, "layer 'o' (HDF5Output)", "file_name is required");
  snprintf(text, sizeof text, "name: 'o' type: 'HDF5Output' bottom: 'p' bottom: 'y' "
           "hdf5_output_param { file_name: '%s' }", at("nowhere/out.h5"));
  expect_create_fails(text, TEST, in, 2, 0, KILN_ERR_IO, "layer 'o' (HDF5Output)",
                      "its folder does not exist");
  kiln_blob_free(y2);
  kiln_blob_free(p);
  kiln_blob_free(y);
}

/* In a net: HDF5Data feeding a classifier, HDF5Output dumping its scores; TRAIN runs forward and
 * backward (no gradient is asked of HDF5Output: no loss depends on it), and the memory plan
 * counts the data layer's buffers. */
static void test_in_a_net(void **state) {
  (void)state;
  char text[2048];
  snprintf(text, sizeof text,
           "name: 'n'\n"
           "layer { name: 'h' type: 'HDF5Data' top: 'data' top: 'label'\n"
           "  hdf5_data_param { source: '%s' batch_size: 4 shuffle: true } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
           "  inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
           "layer { name: 'o' type: 'HDF5Output' bottom: 'ip' bottom: 'label'\n"
           "  hdf5_output_param { file_name: '%s' } }\n"
           "layer { name: 'z' type: 'DummyData' top: 'z' dummy_data_param { shape { dim: 4 "
           "dim: 3 } } }\n"
           "layer { name: 'loss' type: 'EuclideanLoss' bottom: 'ip' bottom: 'z' top: 'loss' }\n",
           at("ab.txt"), at("net_out.h5"));
  Caffe__NetParameter *np;
  assert_int_equal(kiln_net_param_from_text(text, "n.prototxt", &np), KILN_OK);
  kiln_net_options opt = {.phase = TRAIN, .seed = 3, .config = kiln_test_net_config()};
  kiln_net *net;
  if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());
  for (int i = 0; i < 3; i++) {
    float loss;
    kiln_net_zero_param_diff(net);
    if (kiln_net_forward(net, &loss) || kiln_net_backward(net)) fail_msg("%s", kiln_last_error());
  }
  uint64_t cursors[1];
  assert_int_equal(kiln_net_get_cursors(net, cursors), 1);
  assert_true(cursors[0] == 12);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
  kiln_h5data_shape shapes[2];
  const char *sets[2] = {"data", "label"};
  assert_int_equal(kiln_h5data_inspect(at("net_out.h5"), 2, sets, 0, shapes, NULL), KILN_OK);
  assert_true(shapes[0].dims[0] == 12 && shapes[0].dims[1] == 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes_values_files_and_wrap),
      cmocka_unit_test(test_shuffle_per_pass_and_seed),
      cmocka_unit_test(test_resume_mid_file),
      cmocka_unit_test(test_sharded_workers_deal_whole_batches),
      cmocka_unit_test(test_many_files_through_the_loader),
      cmocka_unit_test(test_small_files_stay_resident),
      cmocka_unit_test(test_fingerprint),
      cmocka_unit_test(test_bad_input_named),
      cmocka_unit_test(test_bad_values_refused_when_loaded),
      cmocka_unit_test(test_reader_conversions_and_images),
      cmocka_unit_test(test_compressed_chunks),
      cmocka_unit_test(test_libhdf5_crash_is_an_error),
      cmocka_unit_test(test_fork_beside_a_writer),
      cmocka_unit_test(test_writer_round_trip),
      cmocka_unit_test(test_output_writes_every_forward),
      cmocka_unit_test(test_in_a_net),
  };
  return cmocka_run_group_tests_name("HDF5", tests, setup_files, remove_files);
}
