/* Temporary folders and file writing for tests (see files.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include "files.h"

static bool mkdtemp_tagged(char *dir, size_t n, const char *tag) {
  snprintf(dir, n, "/tmp/kiln-test-%s-XXXXXX", tag);
  return mkdtemp(dir) != NULL;
}

int tmpdir_setup(void **state, const char *tag) {
  tmpdir_fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  if (!mkdtemp_tagged(f->dir, sizeof f->dir, tag)) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

int tmpdir_teardown(void **state) {
  tmpdir_fixture *f = *state;
  rm_tree(f->dir);
  free(f);
  return 0;
}

const char *path_in(const tmpdir_fixture *f, const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/%s", f->dir, name);
  return buf;
}

void make_tmpdir(char *dir, size_t n, const char *tag) {
  assert_true(mkdtemp_tagged(dir, n, tag));
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

void write_plain(const char *path, const void *data, size_t len) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(data, 1, len, fp), len);
  assert_int_equal(fclose(fp), 0);
}

void write_gz(const char *path, const void *data, size_t len) {
  gzFile gz = gzopen(path, "wb");
  assert_non_null(gz);
  assert_int_equal(gzwrite(gz, data, (unsigned)len), (int)len);
  assert_int_equal(gzclose(gz), Z_OK);
}
