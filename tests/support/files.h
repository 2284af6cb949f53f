/* Test support for tests that write files: temporary folders (one per test as a cmocka fixture,
 * or made and removed by hand), paths in them, and files written whole, plain or gzipped. A
 * failed write fails the running test. */
#ifndef KILN_TEST_FILES_H
#define KILN_TEST_FILES_H

#include <stdbool.h>
#include <stddef.h>

/* The state of a test set up by tmpdir_setup(): a fresh folder. */
typedef struct tmpdir_fixture {
  char dir[64];
} tmpdir_fixture;

/* A cmocka setup making a fresh folder /tmp/kiln-test-TAG-XXXXXX (TAG: a few letters naming the
 * test program) into *state; each program wraps it in a setup function of its own. Returns -1
 * when the folder cannot be made. */
int tmpdir_setup(void **state, const char *tag);
/* The matching cmocka teardown: removes the folder and everything in it. */
int tmpdir_teardown(void **state);
/* "DIR/name" in buf (n bytes); returns buf. */
const char *path_in(const tmpdir_fixture *f, const char *name, char *buf, size_t n);

/* A fresh folder /tmp/kiln-test-TAG-XXXXXX in dir (n bytes, 64 are enough). */
void make_tmpdir(char *dir, size_t n, const char *tag);
/* Removes `dir` and everything in it. */
void rm_tree(const char *dir);

bool exists(const char *path);
/* Writes `len` bytes of `data` to `path`, as they are or gzip-compressed. */
void write_plain(const char *path, const void *data, size_t len);
void write_gz(const char *path, const void *data, size_t len);

#endif
