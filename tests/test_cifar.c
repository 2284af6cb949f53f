/* CIFAR-10 and CIFAR-100 binaries: the real archives cannot be downloaded here, so these tests
 * write archives in the published layout themselves (a small ustar writer plus zlib) and read
 * them back from the .tar.gz, a plain tar and unpacked folders; LMDB conversion; and every
 * error the reader promises, with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "files.h"
#include "kiln/data.h"

enum { IMG = KILN_CIFAR_IMAGE_BYTES, REC10 = 1 + IMG, REC100 = 2 + IMG };

/* ---- fixture ----------------------------------------------------------------------------- */

static int setup_dir(void **state) { return tmpdir_setup(state, "cifar"); }

/* Expects `rc` and a message holding every one of the NULL-terminated substrings. */
static void expect_error(int rc, int want, ...) {
  assert_int_equal(rc, want);
  va_list ap;
  va_start(ap, want);
  for (const char *s; (s = va_arg(ap, const char *));) {
    if (!strstr(kiln_last_error(), s)) fail_msg("message '%s' lacks '%s'", kiln_last_error(), s);
  }
  va_end(ap);
}

/* ---- the published layout ---------------------------------------------------------------- */

/* Pixel k of record r of file `file`: hashed so that gzip cannot squeeze it, which puts a cut
 * in the compressed archive inside the members rather than in the end padding. */
static uint8_t pixel(int file, int r, int k) {
  uint32_t x = (uint32_t)file * 1000003u + (uint32_t)r * 7919u + (uint32_t)k;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return (uint8_t)x;
}

/* CIFAR-10: files 0..4 are data_batch_1..5 (3 records each), file 5 is test_batch (2). */
enum { C10_PER_BATCH = 3, C10_TEST = 2, C10_TRAIN = 5 * C10_PER_BATCH };
static const char *const C10_FILES[6] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                         "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
static int c10_records(int file) { return file < 5 ? C10_PER_BATCH : C10_TEST; }
static uint8_t c10_label(int file, int r) { return (uint8_t)((file * 3 + r + 4) % 10); }

/* CIFAR-100: file 0 is train.bin (4 records), file 1 test.bin (3); labels reach 19 and 99. */
static const char *const C100_FILES[2] = {"train.bin", "test.bin"};
static int c100_records(int file) { return file == 0 ? 4 : 3; }
static uint8_t c100_coarse(int file, int r) { return (uint8_t)(19 - (file * 4 + r) * 3); }
static uint8_t c100_fine(int file, int r) { return (uint8_t)(99 - (file * 4 + r) * 13); }

/* The bytes of one .bin file; *len receives its size. */
static uint8_t *c10_file(int file, size_t *len) {
  int n = c10_records(file);
  uint8_t *b = malloc((size_t)n * REC10);
  assert_non_null(b);
  for (int r = 0; r < n; r++) {
    uint8_t *rec = b + (size_t)r * REC10;
    rec[0] = c10_label(file, r);
    for (int k = 0; k < IMG; k++)
      rec[1 + k] = pixel(file, r, k);
  }
  *len = (size_t)n * REC10;
  return b;
}

static uint8_t *c100_file(int file, size_t *len) {
  int n = c100_records(file);
  uint8_t *b = malloc((size_t)n * REC100);
  assert_non_null(b);
  for (int r = 0; r < n; r++) {
    uint8_t *rec = b + (size_t)r * REC100;
    rec[0] = c100_coarse(file, r);
    rec[1] = c100_fine(file, r);
    for (int k = 0; k < IMG; k++)
      rec[2 + k] = pixel(100 + file, r, k);
  }
  *len = (size_t)n * REC100;
  return b;
}

/* ---- a small tar writer ------------------------------------------------------------------ */

typedef struct tarbuf {
  uint8_t *data;
  size_t len, cap;
  bool gnu; /* GNU tar's magic ("ustar  \0"), as Debian's tar writes by default */
} tarbuf;

static void tb_put(tarbuf *t, const void *p, size_t n) {
  if (t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : 1 << 16;
    while (cap < t->len + n)
      cap *= 2;
    t->data = realloc(t->data, cap);
    assert_non_null(t->data);
    t->cap = cap;
  }
  if (n) memcpy(t->data + t->len, p, n);
  t->len += n;
}

static void tb_zeros(tarbuf *t, size_t n) {
  static const uint8_t z[512];
  while (n) {
    size_t k = n < sizeof z ? n : sizeof z;
    tb_put(t, z, k);
    n -= k;
  }
}

/* Fills in the checksum field of header h (after any change to it). */
static void tar_checksum(uint8_t h[512]) {
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++)
    sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum); /* six digits, NUL, and the space left in place */
}

/* A header for `name` (at most 100 bytes) holding `size` bytes, type `type`. */
static void tar_header(const tarbuf *t, uint8_t h[512], const char *name, uint64_t size,
                       char type) {
  memset(h, 0, 512);
  size_t nl = strlen(name);
  memcpy(h, name, nl < 100 ? nl : 100);
  snprintf((char *)h + 100, 8, "%07o", type == '5' ? 0755 : 0644);
  snprintf((char *)h + 108, 8, "%07o", 1000);
  snprintf((char *)h + 116, 8, "%07o", 1000);
  snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
  snprintf((char *)h + 136, 12, "%011o", 1234567890);
  h[156] = (uint8_t)type;
  if (t->gnu)
    memcpy(h + 257, "ustar  ", 8);
  else
    memcpy(h + 257,
           "ustar\0"
           "00",
           8);
  memcpy(h + 265, "kiln", 4);
  memcpy(h + 297, "kiln", 4);
  tar_checksum(h);
}

static void tar_add(tarbuf *t, const char *name, const void *data, size_t len, char type) {
  uint8_t h[512];
  tar_header(t, h, name, len, type);
  tb_put(t, h, 512);
  tb_put(t, data, len);
  tb_zeros(t, (512 - len % 512) % 512);
}

/* Two zero blocks, then zeros up to tar's 10240-byte record. */
static void tar_end(tarbuf *t) {
  tb_zeros(t, 1024);
  tb_zeros(t, (10240 - t->len % 10240) % 10240);
}

/* What goes wrong with one member of an archive written by write_archive(). */
typedef struct damage {
  const char *file;   /* the member to damage (name inside the folder), or NULL */
  bool omit;          /* leave it out */
  size_t extra_bytes; /* append this many bytes to it */
  int bad_label_rec;  /* >= 0: give this record a bad label ... */
  uint8_t bad_label;  /* ... this one (CIFAR-10), or this coarse label (CIFAR-100) ... */
  uint8_t bad_fine;   /* ... and this fine label (CIFAR-100) */
} damage;

static const damage NO_DAMAGE = {.bad_label_rec = -1};

/* The bytes of .bin file `file` (CIFAR-100 or CIFAR-10) with `d` done to it if it is the member
 * `d` names; NULL if `d` leaves it out. *len receives its size. */
static uint8_t *damaged_file(bool cifar100, int file, const damage *d, size_t *len) {
  const char *fname = cifar100 ? C100_FILES[file] : C10_FILES[file];
  bool hit = d->file && !strcmp(d->file, fname);
  if (hit && d->omit) return NULL;
  uint8_t *data = cifar100 ? c100_file(file, len) : c10_file(file, len);
  if (hit && d->bad_label_rec >= 0) {
    uint8_t *rec = data + (size_t)d->bad_label_rec * (cifar100 ? REC100 : REC10);
    rec[0] = d->bad_label;
    if (cifar100) rec[1] = d->bad_fine;
  }
  if (hit && d->extra_bytes) {
    data = realloc(data, *len + d->extra_bytes);
    assert_non_null(data);
    memset(data + *len, 7, d->extra_bytes);
    *len += d->extra_bytes;
  }
  return data;
}

/* Builds the archive of `cifar100` ? CIFAR-100 : CIFAR-10 with its members out of order (a
 * reader must not rely on it) and the extra files a real one has. */
static tarbuf build_archive(bool cifar100, bool gnu, const damage *d) {
  tarbuf t = {.gnu = gnu};
  const char *folder = cifar100 ? "cifar-100-binary" : "cifar-10-batches-bin";
  char name[128];
  snprintf(name, sizeof name, "%s/", folder);
  tar_add(&t, name, NULL, 0, '5');
  static const int c10_order[] = {0, -1, 2, 3, 5, -2, 4, 1};
  static const int c100_order[] = {-3, 0, -4, 1};
  const int *order = cifar100 ? c100_order : c10_order;
  int n_order = cifar100 ? 4 : 8;
  for (int i = 0; i < n_order; i++) {
    int file = order[i];
    if (file < 0) {
      static const char *const extras[] = {"batches.meta.txt", "readme.html",
                                           "coarse_label_names.txt", "fine_label_names.txt"};
      const char *extra = extras[-file - 1];
      snprintf(name, sizeof name, "%s/%s", folder, extra);
      tar_add(&t, name, "airplane\nautomobile\nbird\n", 25, '0');
      continue;
    }
    const char *fname = cifar100 ? C100_FILES[file] : C10_FILES[file];
    size_t len;
    uint8_t *data = damaged_file(cifar100, file, d, &len);
    if (!data) continue;
    snprintf(name, sizeof name, "%s/%s", folder, fname);
    tar_add(&t, name, data, len, '0');
    free(data);
  }
  tar_end(&t);
  return t;
}

static void write_archive(const char *path, bool cifar100, bool gzip, const damage *d) {
  tarbuf t = build_archive(cifar100, true, d);
  if (gzip)
    write_gz(path, t.data, t.len);
  else
    write_plain(path, t.data, t.len);
  free(t.data);
}

/* The unpacked archive: the .bin files in PARENT/cifar-10-batches-bin (or cifar-100-binary). */
static void write_folder(const char *parent, bool cifar100, const damage *d) {
  char path[512];
  assert_int_equal(mkdir(parent, 0775), 0);
  const char *folder = cifar100 ? "cifar-100-binary" : "cifar-10-batches-bin";
  snprintf(path, sizeof path, "%s/%s", parent, folder);
  assert_int_equal(mkdir(path, 0775), 0);
  for (int file = 0; file < (cifar100 ? 2 : 6); file++) {
    const char *fname = cifar100 ? C100_FILES[file] : C10_FILES[file];
    size_t len;
    uint8_t *data = damaged_file(cifar100, file, d, &len);
    if (!data) continue;
    snprintf(path, sizeof path, "%s/%s/%s", parent, folder, fname);
    write_plain(path, data, len);
    free(data);
  }
}

/* ---- checks ------------------------------------------------------------------------------ */

static void expect_c10(const kiln_cifar_set *s, bool train) {
  assert_int_equal(s->n, train ? C10_TRAIN : C10_TEST);
  uint32_t i = 0;
  for (int file = train ? 0 : 5; file < (train ? 5 : 6); file++)
    for (int r = 0; r < c10_records(file); r++, i++) {
      assert_int_equal(s->labels[i], c10_label(file, r));
      const uint8_t *px = s->pixels + (size_t)i * IMG;
      for (int k = 0; k < IMG; k++)
        if (px[k] != pixel(file, r, k))
          fail_msg("record %u (file %d record %d) pixel %d: %u, expected %u", i, file, r, k, px[k],
                   pixel(file, r, k));
    }
}

static void expect_c100(const kiln_cifar_set *s, bool train, bool coarse) {
  int file = train ? 0 : 1;
  assert_int_equal(s->n, c100_records(file));
  for (int r = 0; r < c100_records(file); r++) {
    assert_int_equal(s->labels[r], coarse ? c100_coarse(file, r) : c100_fine(file, r));
    for (int k = 0; k < IMG; k++)
      assert_int_equal(s->pixels[(size_t)r * IMG + k], pixel(100 + file, r, k));
  }
}

static void read_and_check_c10(const char *source) {
  kiln_cifar_set s;
  assert_int_equal(kiln_cifar_read(source, KILN_CIFAR10, true, &s), KILN_OK);
  expect_c10(&s, true);
  kiln_cifar_free(&s);
  assert_null(s.pixels);
  assert_int_equal(kiln_cifar_read(source, KILN_CIFAR10, false, &s), KILN_OK);
  expect_c10(&s, false);
  kiln_cifar_free(&s);
}

/* ---- reading ----------------------------------------------------------------------------- */

static void test_constants(void **state) {
  (void)state;
  assert_int_equal(KILN_CIFAR_IMAGE_BYTES, 3072);
  assert_int_equal(kiln_cifar_record_bytes(KILN_CIFAR10), 3073);
  assert_int_equal(kiln_cifar_record_bytes(KILN_CIFAR100_FINE), 3074);
  assert_int_equal(kiln_cifar_record_bytes(KILN_CIFAR100_COARSE), 3074);
  assert_int_equal(kiln_cifar_num_classes(KILN_CIFAR10), 10);
  assert_int_equal(kiln_cifar_num_classes(KILN_CIFAR100_FINE), 100);
  assert_int_equal(kiln_cifar_num_classes(KILN_CIFAR100_COARSE), 20);
  assert_int_equal(kiln_cifar_num_classes(KILN_CIFAR_KIND_COUNT), 0);
  kiln_cifar_set s;
  assert_int_equal(kiln_cifar_read("/nonexistent", KILN_CIFAR_KIND_COUNT, true, &s),
                   KILN_ERR_INVALID);
  kiln_cifar_free(NULL);
}

static void test_cifar10_archive(void **state) {
  tmpdir_fixture *f = *state;
  char path[256];
  /* gzipped, as published */
  write_archive(path_in(f, "cifar-10-binary.tar.gz", path, sizeof path), false, true, &NO_DAMAGE);
  read_and_check_c10(path);
  /* the same tar without gzip */
  write_archive(path_in(f, "cifar-10-binary.tar", path, sizeof path), false, false, &NO_DAMAGE);
  read_and_check_c10(path);
  /* POSIX ustar headers instead of GNU ones */
  tarbuf t = build_archive(false, false, &NO_DAMAGE);
  write_gz(path_in(f, "posix.tar.gz", path, sizeof path), t.data, t.len);
  free(t.data);
  read_and_check_c10(path);
  /* CIFAR-100 readers do not find their members in a CIFAR-10 archive. */
  kiln_cifar_set s;
  path_in(f, "cifar-10-binary.tar.gz", path, sizeof path);
  expect_error(kiln_cifar_read(path, KILN_CIFAR100_FINE, true, &s), KILN_ERR_DATA, path,
               "missing member cifar-100-binary/train.bin", NULL);
}

/* Archives made other ways: `tar -C dir .` names (./cifar-10-batches-bin/...), a ustar prefix
 * field, GNU long names and pax headers in between, no end-of-archive blocks. */
static void test_cifar10_archive_variants(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], name[256];
  tarbuf t = {.gnu = false};
  /* A GNU long name: an 'L' entry whose data is the real name; kiln skips both. */
  char longname[300];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  tar_add(&t, "././@LongLink", longname, sizeof longname, 'L');
  tar_add(&t,
          "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
          "junk", 4, '0');
  /* A pax extended header. */
  tar_add(&t, "PaxHeaders/x", "30 mtime=1234567890.123456789\n", 30, 'x');
  for (int file = 5; file >= 0; file--) {
    size_t len;
    uint8_t *data = c10_file(file, &len);
    if (file == 2) {
      /* ustar prefix + name: the prefix holds the folder */
      uint8_t h[512];
      tar_header(&t, h, C10_FILES[file], len, '0');
      memcpy(h + 345, "cifar-10-batches-bin", 20);
      tar_checksum(h);
      tb_put(&t, h, 512);
      tb_put(&t, data, len);
      tb_zeros(&t, (512 - len % 512) % 512);
    } else {
      snprintf(name, sizeof name, "./cifar-10-batches-bin/%s", C10_FILES[file]);
      tar_add(&t, name, data, len, '0');
    }
    free(data);
  }
  /* A symbolic link whose size field is not zero (its data is absent, as the spec says). */
  uint8_t h[512];
  tar_header(&t, h, "cifar-10-batches-bin/link", 999, '2');
  tb_put(&t, h, 512);
  write_gz(path_in(f, "variants.tar.gz", path, sizeof path), t.data, t.len); /* no end blocks */
  read_and_check_c10(path);

  /* A member given twice: the later copy wins, as when tar extracts. */
  size_t len;
  uint8_t *data = c10_file(5, &len);
  data[0] = 9;
  snprintf(name, sizeof name, "cifar-10-batches-bin/%s", C10_FILES[5]);
  tar_add(&t, name, data, len, '0');
  free(data);
  tar_end(&t);
  write_gz(path, t.data, t.len);
  free(t.data);
  kiln_cifar_set s;
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_OK);
  assert_int_equal(s.n, C10_TEST);
  assert_int_equal(s.labels[0], 9);
  assert_int_equal(s.labels[1], c10_label(5, 1));
  kiln_cifar_free(&s);
}

/* A member bigger than the reader's chunks and first allocation, with records straddling both. */
static void test_many_records(void **state) {
  tmpdir_fixture *f = *state;
  enum { N = 2500 };
  uint8_t *data = malloc((size_t)N * REC10);
  assert_non_null(data);
  for (int r = 0; r < N; r++) {
    data[(size_t)r * REC10] = (uint8_t)(r % 10);
    for (int k = 0; k < IMG; k++) data[(size_t)r * REC10 + 1 + k] = pixel(7, r, k);
  }
  tarbuf t = {.gnu = true};
  tar_add(&t, "cifar-10-batches-bin/test_batch.bin", data, (size_t)N * REC10, '0');
  tar_end(&t);
  free(data);
  char path[256];
  gzFile gz = gzopen(path_in(f, "big.tar.gz", path, sizeof path), "wb1");
  assert_non_null(gz);
  assert_int_equal(gzwrite(gz, t.data, (unsigned)t.len), (int)t.len);
  assert_int_equal(gzclose(gz), Z_OK);
  free(t.data);
  kiln_cifar_set s;
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_OK);
  assert_int_equal(s.n, N);
  for (int r = 0; r < N; r++) {
    assert_int_equal(s.labels[r], r % 10);
    for (int k = 0; k < IMG; k++)
      if (s.pixels[(size_t)r * IMG + k] != pixel(7, r, k)) fail_msg("record %d pixel %d", r, k);
  }
  kiln_cifar_free(&s);
}

static void test_cifar10_folder(void **state) {
  tmpdir_fixture *f = *state;
  char parent[256], batches[300];
  write_folder(path_in(f, "unpacked", parent, sizeof parent), false, &NO_DAMAGE);
  read_and_check_c10(parent); /* the folder holding cifar-10-batches-bin/ */
  snprintf(batches, sizeof batches, "%s/cifar-10-batches-bin", parent);
  read_and_check_c10(batches); /* the folder of .bin files itself */
}

static void test_cifar100(void **state) {
  tmpdir_fixture *f = *state;
  char gz[256], parent[256], bins[300];
  write_archive(path_in(f, "cifar-100-binary.tar.gz", gz, sizeof gz), true, true, &NO_DAMAGE);
  write_folder(path_in(f, "unpacked", parent, sizeof parent), true, &NO_DAMAGE);
  snprintf(bins, sizeof bins, "%s/cifar-100-binary", parent);
  const char *sources[] = {gz, parent, bins};
  for (int i = 0; i < 3; i++)
    for (int train = 0; train < 2; train++)
      for (int coarse = 0; coarse < 2; coarse++) {
        kiln_cifar_set s;
        assert_int_equal(kiln_cifar_read(sources[i],
                                         coarse ? KILN_CIFAR100_COARSE : KILN_CIFAR100_FINE, train,
                                         &s),
                         KILN_OK);
        expect_c100(&s, train, coarse);
        kiln_cifar_free(&s);
      }
  /* A CIFAR-10 reader does not find its members in a CIFAR-100 archive or folder. */
  kiln_cifar_set s;
  expect_error(kiln_cifar_read(gz, KILN_CIFAR10, true, &s), KILN_ERR_DATA,
               "missing member cifar-10-batches-bin/data_batch_1.bin", NULL);
  expect_error(kiln_cifar_read(parent, KILN_CIFAR10, false, &s), KILN_ERR_IO,
               "missing file test_batch.bin", NULL);
}

/* ---- conversion -------------------------------------------------------------------------- */

static void test_convert(void **state) {
  tmpdir_fixture *f = *state;
  char gz[256], out[256], tmp[300];
  write_archive(path_in(f, "cifar-10-binary.tar.gz", gz, sizeof gz), false, true, &NO_DAMAGE);
  path_in(f, "cifar10_train_lmdb", out, sizeof out);
  uint64_t n = 0;
  assert_int_equal(kiln_convert_cifar_to_lmdb(gz, KILN_CIFAR10, true, out, &n), KILN_OK);
  assert_int_equal(n, C10_TRAIN);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  assert_false(exists(tmp));

  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_size(db), C10_TRAIN);
  int i = 0;
  for (int file = 0; file < 5; file++)
    for (int r = 0; r < C10_PER_BATCH; r++, i++) {
      kiln_datum d;
      assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
      char key[16];
      snprintf(key, sizeof key, "%05d", i);
      assert_string_equal(kiln_datum_db_last_key(db), key);
      assert_int_equal(d.channels, 3);
      assert_int_equal(d.height, 32);
      assert_int_equal(d.width, 32);
      assert_int_equal(d.label, c10_label(file, r));
      assert_non_null(d.u8);
      assert_null(d.f32);
      for (int k = 0; k < IMG; k++)
        assert_int_equal(d.u8[k], pixel(file, r, k));
    }
  kiln_datum_db_close(db);

  /* The output exists now: refused, and left alone. */
  expect_error(kiln_convert_cifar_to_lmdb(gz, KILN_CIFAR10, true, out, &n), KILN_ERR_INVALID, out,
               "already exists", NULL);
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  kiln_datum_db_close(db);

  /* CIFAR-100 test split with coarse labels, from a folder; n_written may be NULL. */
  char parent[256];
  write_folder(path_in(f, "c100", parent, sizeof parent), true, &NO_DAMAGE);
  path_in(f, "c100_test_lmdb", out, sizeof out);
  assert_int_equal(kiln_convert_cifar_to_lmdb(parent, KILN_CIFAR100_COARSE, false, out, NULL),
                   KILN_OK);
  assert_int_equal(kiln_datum_db_open(out, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_size(db), c100_records(1));
  for (int r = 0; r < c100_records(1); r++) {
    kiln_datum d;
    assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
    char key[16];
    snprintf(key, sizeof key, "%05d", r);
    assert_string_equal(kiln_datum_db_last_key(db), key);
    assert_int_equal(d.label, c100_coarse(1, r));
    for (int k = 0; k < IMG; k++)
      assert_int_equal(d.u8[k], pixel(101, r, k));
  }
  kiln_datum_db_close(db);

  /* A failing conversion leaves nothing behind and writes 0. */
  char bad[256];
  damage d = NO_DAMAGE;
  d.file = "test_batch.bin";
  d.bad_label_rec = 1;
  d.bad_label = 10;
  write_archive(path_in(f, "bad.tar.gz", bad, sizeof bad), false, true, &d);
  path_in(f, "bad_lmdb", out, sizeof out);
  n = 99;
  expect_error(kiln_convert_cifar_to_lmdb(bad, KILN_CIFAR10, false, out, &n), KILN_ERR_DATA,
               "label 10", NULL);
  assert_int_equal(n, 0);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  assert_false(exists(out));
  assert_false(exists(tmp));
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_truncated_archive(void **state) {
  tmpdir_fixture *f = *state;
  char gz[256], cut[256], msg[1024];
  write_archive(path_in(f, "cifar-10-binary.tar.gz", gz, sizeof gz), false, true, &NO_DAMAGE);
  char *whole;
  size_t len;
  assert_int_equal(kiln_read_file(gz, &whole, &len), KILN_OK);
  path_in(f, "cut.tar.gz", cut, sizeof cut);

  /* Cut in the middle: the member being read is named, and the gzip stream blamed. */
  write_plain(cut, whole, len / 2);
  kiln_cifar_set s = {.n = 7};
  expect_error(kiln_cifar_read(cut, KILN_CIFAR10, true, &s), KILN_ERR_DATA, cut,
               "archive truncated", "member cifar-10-batches-bin/",
               "(the gzip stream is cut short)", NULL);
  assert_int_equal(s.n, 0);
  assert_null(s.labels);
  assert_null(s.pixels);

  /* Cut anywhere, even inside the gzip trailer or the tar padding after the last member: always
   * an error (never a crash, never a silently short set). */
  for (size_t at = 0; at < len; at += at < 64 || at > len - 64 ? 1 : 211) {
    write_plain(cut, whole, at);
    int rc = kiln_cifar_read(cut, KILN_CIFAR10, at % 2 == 0, &s);
    if (rc != KILN_ERR_DATA)
      fail_msg("cut at %zu of %zu: rc %d: %s", at, len, rc, kiln_last_error());
    if (at > 20 && !strstr(kiln_last_error(), "truncated"))
      fail_msg("cut at %zu of %zu: %s", at, len, kiln_last_error());
  }
  free(whole);

  /* A tar whose last member is shorter than its header says (the gzip stream itself is whole). */
  tarbuf t = {.gnu = true};
  size_t blen;
  uint8_t *data = c10_file(5, &blen);
  uint8_t h[512];
  tar_header(&t, h, "cifar-10-batches-bin/test_batch.bin", blen, '0');
  tb_put(&t, h, 512);
  tb_put(&t, data, 3000);
  free(data);
  write_gz(cut, t.data, t.len);
  snprintf(msg, sizeof msg,
           "%s: member cifar-10-batches-bin/test_batch.bin: archive truncated: the member ends "
           "after 3000 of its 6146 bytes, in record 0",
           cut);
  assert_int_equal(kiln_cifar_read(cut, KILN_CIFAR10, false, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  /* The same as a plain tar. */
  write_plain(cut, t.data, t.len);
  assert_int_equal(kiln_cifar_read(cut, KILN_CIFAR10, false, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  /* And a member we skip, cut short. */
  t.len = 0;
  tar_add(&t, "cifar-10-batches-bin/readme.html", "x", 1, '0');
  tar_header(&t, h, "cifar-10-batches-bin/batches.meta.txt", 5000, '0');
  tb_put(&t, h, 512);
  tb_zeros(&t, 100);
  write_gz(cut, t.data, t.len);
  expect_error(kiln_cifar_read(cut, KILN_CIFAR10, false, &s), KILN_ERR_DATA,
               "member cifar-10-batches-bin/batches.meta.txt: archive truncated: the member ends "
               "after 100 of its 5000 bytes",
               NULL);
  free(t.data);
}

static void test_archive_errors(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], msg[1024];
  kiln_cifar_set s;
  path_in(f, "a.tar.gz", path, sizeof path);

  /* Wrong record size. */
  damage d = NO_DAMAGE;
  d.file = "data_batch_3.bin";
  d.extra_bytes = 5;
  write_archive(path, false, true, &d);
  snprintf(msg, sizeof msg,
           "%s: member cifar-10-batches-bin/data_batch_3.bin: wrong record size: 9224 bytes is not "
           "a multiple of the 3073-byte CIFAR-10 record (3 whole records and 5 bytes over)",
           path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  /* The test split does not read that member, so it is fine. */
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_OK);
  kiln_cifar_free(&s);

  /* CIFAR-10 records read as CIFAR-100 have the wrong size. */
  write_archive(path, false, true, &NO_DAMAGE);
  tarbuf t = {.gnu = true};
  size_t len;
  uint8_t *data = c10_file(0, &len);
  tar_add(&t, "cifar-100-binary/test.bin", data, len, '0');
  free(data);
  tar_end(&t);
  write_gz(path, t.data, t.len);
  free(t.data);
  expect_error(kiln_cifar_read(path, KILN_CIFAR100_FINE, false, &s), KILN_ERR_DATA,
               "member cifar-100-binary/test.bin: wrong record size: 9219 bytes",
               "multiple of the 3074-byte CIFAR-100 record", NULL);

  /* An empty member. */
  t = (tarbuf){.gnu = true};
  tar_add(&t, "cifar-100-binary/test.bin", NULL, 0, '0');
  tar_end(&t);
  write_gz(path, t.data, t.len);
  free(t.data);
  expect_error(kiln_cifar_read(path, KILN_CIFAR100_FINE, false, &s), KILN_ERR_DATA,
               "member cifar-100-binary/test.bin: holds no records", NULL);

  /* Missing member. */
  d = NO_DAMAGE;
  d.file = "data_batch_4.bin";
  d.omit = true;
  write_archive(path, false, true, &d);
  snprintf(msg, sizeof msg,
           "%s: missing member cifar-10-batches-bin/data_batch_4.bin (is this the CIFAR-10 binary "
           "archive?)",
           path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);

  /* Labels out of range: CIFAR-10 label 10; CIFAR-100 fine 100 and coarse 20. */
  d = NO_DAMAGE;
  d.file = "data_batch_2.bin";
  d.bad_label_rec = 1;
  d.bad_label = 10;
  write_archive(path, false, true, &d);
  snprintf(msg, sizeof msg,
           "%s: member cifar-10-batches-bin/data_batch_2.bin: record 1 (byte offset 3073): label "
           "10 out of range (CIFAR-10 labels are 0..9)",
           path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  d.file = "train.bin";
  d.bad_label_rec = 2;
  d.bad_label = 19;
  d.bad_fine = 100;
  write_archive(path, true, true, &d);
  snprintf(msg, sizeof msg,
           "%s: member cifar-100-binary/train.bin: record 2 (byte offset 6149): fine label 100 out "
           "of range (CIFAR-100 fine labels are 0..99)",
           path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR100_FINE, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  /* Both labels are checked whichever is kept. */
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR100_COARSE, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  d.bad_label = 20;
  d.bad_fine = 99;
  write_archive(path, true, true, &d);
  snprintf(msg, sizeof msg,
           "%s: member cifar-100-binary/train.bin: record 2 (byte offset 6148): coarse label 20 "
           "out of range (CIFAR-100 coarse labels are 0..19)",
           path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR100_COARSE, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  d.bad_label = 19; /* the largest valid labels are accepted */
  write_archive(path, true, true, &d);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR100_FINE, true, &s), KILN_OK);
  assert_int_equal(s.labels[2], 99);
  kiln_cifar_free(&s);
}

static void test_not_an_archive(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], msg[1024];
  kiln_cifar_set s;
  path_in(f, "x", path, sizeof path);

  /* Missing. */
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_IO, path, "No such file",
               NULL);

  /* Text; random bytes; empty; a .bin file given instead of the archive. */
  write_plain(path, "<html>404 Not Found</html>\n", 27);
  snprintf(msg, sizeof msg,
           "%s: not a gzip or tar archive (27 bytes, shorter than one tar header); give the binary "
           ".tar.gz or the folder of .bin files",
           path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  uint8_t junk[4096];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)(i * 2654435761u >> 11);
  write_plain(path, junk, sizeof junk);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA, path,
               "not a gzip or tar archive (no tar header at the start)", NULL);
  write_plain(path, "", 0);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA, path,
               "not a gzip or tar archive (0 bytes", NULL);
  size_t len;
  uint8_t *bin = c10_file(5, &len);
  write_plain(path, bin, len);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_ERR_DATA, path,
               "not a gzip or tar archive", NULL);

  /* gzip, but not a tar inside. */
  write_gz(path, bin, len);
  free(bin);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_ERR_DATA, path,
               "not a tar archive inside the gzip data (no tar header at the start)", NULL);
  write_gz(path, "hello", 5);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_ERR_DATA, path,
               "not a tar archive inside the gzip data (5 bytes", NULL);

  /* A corrupt second header, and a malformed size field (checksum right). */
  tarbuf t = build_archive(false, true, &NO_DAMAGE);
  t.data[512 + 10] ^= 0x20; /* the first member's header starts at 512 (after the folder's) */
  write_gz(path, t.data, t.len);
  snprintf(msg, sizeof msg, "%s: corrupt tar header at byte offset 512 (checksum mismatch)", path);
  assert_int_equal(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);
  free(t.data);
  t = (tarbuf){.gnu = true};
  uint8_t h[512];
  tar_header(&t, h, "cifar-10-batches-bin/test_batch.bin", 0, '0');
  memcpy(h + 124, "00000009999", 11); /* 9 is not an octal digit */
  tar_checksum(h);
  tb_put(&t, h, 512);
  tar_end(&t);
  write_gz(path, t.data, t.len);
  free(t.data);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, false, &s), KILN_ERR_DATA,
               "corrupt tar header at byte offset 0: member cifar-10-batches-bin/test_batch.bin "
               "has a malformed size field",
               NULL);

  /* Corrupt compressed data: flipped bits somewhere in the deflate stream. */
  write_archive(path, false, true, &NO_DAMAGE);
  char *whole;
  assert_int_equal(kiln_read_file(path, &whole, &len), KILN_OK);
  whole[len / 3] ^= 0x5a;
  whole[len / 3 + 1] ^= 0xa5;
  write_plain(path, whole, len);
  free(whole);
  expect_error(kiln_cifar_read(path, KILN_CIFAR10, true, &s), KILN_ERR_DATA, path, NULL);
}

static void test_folder_errors(void **state) {
  tmpdir_fixture *f = *state;
  char parent[256], file[512], msg[1200];
  kiln_cifar_set s;

  /* Neither the folder nor its cifar-10-batches-bin/ holds the files. */
  path_in(f, "empty", parent, sizeof parent);
  assert_int_equal(mkdir(parent, 0775), 0);
  snprintf(msg, sizeof msg,
           "%s: missing file data_batch_1.bin (looked for %s/data_batch_1.bin and "
           "%s/cifar-10-batches-bin/data_batch_1.bin)",
           parent, parent, parent);
  assert_int_equal(kiln_cifar_read(parent, KILN_CIFAR10, true, &s), KILN_ERR_IO);
  assert_string_equal(kiln_last_error(), msg);

  /* A missing batch. */
  damage d = NO_DAMAGE;
  d.file = "data_batch_5.bin";
  d.omit = true;
  write_folder(path_in(f, "no5", parent, sizeof parent), false, &d);
  snprintf(file, sizeof file, "%s/cifar-10-batches-bin/data_batch_5.bin", parent);
  snprintf(msg, sizeof msg, "%s: missing file data_batch_5.bin", file);
  assert_int_equal(kiln_cifar_read(parent, KILN_CIFAR10, true, &s), KILN_ERR_IO);
  assert_string_equal(kiln_last_error(), msg);

  /* Wrong record size. */
  d = NO_DAMAGE;
  d.file = "test_batch.bin";
  d.extra_bytes = 3072;
  write_folder(path_in(f, "long", parent, sizeof parent), false, &d);
  snprintf(file, sizeof file, "%s/cifar-10-batches-bin/test_batch.bin", parent);
  snprintf(msg, sizeof msg,
           "%s: wrong record size: 9218 bytes is not a multiple of the 3073-byte CIFAR-10 record "
           "(2 whole records and 3072 bytes over)",
           file);
  assert_int_equal(kiln_cifar_read(parent, KILN_CIFAR10, false, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);

  /* Label out of range. */
  d = NO_DAMAGE;
  d.file = "test.bin";
  d.bad_label_rec = 0;
  d.bad_label = 255;
  d.bad_fine = 255;
  write_folder(path_in(f, "bad100", parent, sizeof parent), true, &d);
  snprintf(file, sizeof file, "%s/cifar-100-binary/test.bin", parent);
  snprintf(msg, sizeof msg,
           "%s: record 0 (byte offset 0): coarse label 255 out of range (CIFAR-100 coarse labels "
           "are 0..19)",
           file);
  assert_int_equal(kiln_cifar_read(parent, KILN_CIFAR100_FINE, false, &s), KILN_ERR_DATA);
  assert_string_equal(kiln_last_error(), msg);

  /* A directory where a .bin file should be. */
  write_folder(path_in(f, "dirbin", parent, sizeof parent), false, &NO_DAMAGE);
  snprintf(file, sizeof file, "%s/cifar-10-batches-bin/data_batch_3.bin", parent);
  assert_int_equal(remove(file), 0);
  assert_int_equal(mkdir(file, 0775), 0);
  expect_error(kiln_cifar_read(parent, KILN_CIFAR10, true, &s), KILN_ERR_IO, file, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constants),
      cmocka_unit_test_setup_teardown(test_cifar10_archive, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_cifar10_archive_variants, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_many_records, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_cifar10_folder, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_cifar100, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_truncated_archive, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_archive_errors, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_not_an_archive, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_folder_errors, setup_dir, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
