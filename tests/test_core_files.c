/* The core's file checks (src/core/files.c, memory.c, sha256.c): what an output path may be
 * (never an input by any name, nor a device, FIFO, socket or folder that a rename would replace;
 * a stream may go into a character device or a FIFO), the atomic writer refusing such a path
 * with the node left as it was, the NUL byte named with its line and column, and the digest of a
 * FIFO refused rather than waited on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "files.h"
#include "kiln/core.h"

static int setup(void **state) { return tmpdir_setup(state, "cf"); }

static void expect_error(int rc, const char *want) {
  assert_int_equal(rc, KILN_ERR_INVALID);
  if (!strstr(kiln_last_error(), want)) fail_msg("'%s' does not say '%s'", kiln_last_error(), want);
}

/* The output may not be an input, by any name, nor a file of an input folder, nor anything but
 * a regular file (a stream: a character device or a FIFO is written into). */
static void test_check_output(void **state) {
  const tmpdir_fixture *t = *state;
  char in[256], other[256], sym[256], hard[256], dir[256], fifo[256], fresh[256], sock[100],
      inside[300], dangling[256];
  path_in(t, "in.prototxt", in, sizeof in);
  path_in(t, "other.prototxt", other, sizeof other);
  path_in(t, "link.prototxt", sym, sizeof sym);
  path_in(t, "hard.prototxt", hard, sizeof hard);
  path_in(t, "dir", dir, sizeof dir);
  path_in(t, "fifo", fifo, sizeof fifo);
  path_in(t, "fresh.prototxt", fresh, sizeof fresh);
  path_in(t, "sock", sock, sizeof sock);
  path_in(t, "dangling", dangling, sizeof dangling);
  write_plain(in, "name: 'n'\n", 10);
  write_plain(other, "name: 'o'\n", 10);
  assert_int_equal(symlink(in, sym), 0);
  assert_int_equal(symlink("/nonexistent/kiln", dangling), 0);
  if (link(in, hard) != 0) hard[0] = '\0'; /* a file system without hard links */
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  snprintf(inside, sizeof inside, "%s/data.mdb", dir);
  write_plain(inside, "x", 1);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
  const bool have_sock = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0;
  if (s >= 0) close(s);

  const char *const ins[] = {NULL, in};
  assert_int_equal(kiln_check_output(fresh, KILN_OUTPUT_RENAMED, ins, 2), KILN_OK);
  assert_int_equal(kiln_check_output(other, KILN_OUTPUT_RENAMED, ins, 2), KILN_OK);
  assert_int_equal(kiln_check_output(dangling, KILN_OUTPUT_RENAMED, ins, 2), KILN_OK);
  assert_int_equal(kiln_check_output(in, KILN_OUTPUT_RENAMED, NULL, 0), KILN_OK);
  assert_int_equal(kiln_check_output(NULL, KILN_OUTPUT_RENAMED, ins, 2), KILN_OK);
  assert_int_equal(kiln_check_output(in, KILN_OUTPUT_RENAMED, ins, 2), KILN_ERR_INVALID);
  char want[700];
  snprintf(want, sizeof want, "%s: is the input %s itself: the output would replace it; give "
           "another name", in, in);
  assert_string_equal(kiln_last_error(), want);
  snprintf(want, sizeof want, "%s: is the input %s itself", sym, in);
  expect_error(kiln_check_output(sym, KILN_OUTPUT_RENAMED, ins, 2), want);
  const char *const by_link[] = {sym};
  snprintf(want, sizeof want, "%s: is the input %s itself", in, sym);
  expect_error(kiln_check_output(in, KILN_OUTPUT_RENAMED, by_link, 1), want);
  if (hard[0]) expect_error(kiln_check_output(hard, KILN_OUTPUT_RENAMED, ins, 2), "is the input");
  /* another spelling of the same path */
  char dotted[300];
  snprintf(dotted, sizeof dotted, "%s/./in.prototxt", t->dir);
  expect_error(kiln_check_output(dotted, KILN_OUTPUT_STREAMED, ins, 2), "is the input");
  /* a file of an input folder (a database's), but not a new one there */
  const char *const db[] = {dir};
  snprintf(want, sizeof want, "%s: is a file of the input %s (a folder)", inside, dir);
  expect_error(kiln_check_output(inside, KILN_OUTPUT_RENAMED, db, 1), want);
  char new_inside[300];
  snprintf(new_inside, sizeof new_inside, "%s/mean.binaryproto", dir);
  assert_int_equal(kiln_check_output(new_inside, KILN_OUTPUT_RENAMED, db, 1), KILN_OK);
  expect_error(kiln_check_output(dir, KILN_OUTPUT_RENAMED, db, 1), "is the input");

  /* what a rename would replace */
  expect_error(kiln_check_output(dir, KILN_OUTPUT_RENAMED, NULL, 0), ": is a folder");
  expect_error(kiln_check_output(fifo, KILN_OUTPUT_RENAMED, NULL, 0), ": is a FIFO");
  if (have_sock)
    expect_error(kiln_check_output(sock, KILN_OUTPUT_RENAMED, NULL, 0), ": is a socket");
  assert_int_equal(kiln_check_output("/dev/null", KILN_OUTPUT_RENAMED, NULL, 0), KILN_ERR_INVALID);
  assert_string_equal(kiln_last_error(), "/dev/null: is a device: the output is written to a new "
                      "file under that name, and this one would be replaced; give a file name");
  /* a stream is written into a character device or a FIFO; never into a folder or a socket */
  assert_int_equal(kiln_check_output("/dev/null", KILN_OUTPUT_STREAMED, NULL, 0), KILN_OK);
  assert_int_equal(kiln_check_output(fifo, KILN_OUTPUT_STREAMED, NULL, 0), KILN_OK);
  expect_error(kiln_check_output(dir, KILN_OUTPUT_STREAMED, NULL, 0),
               ": is a folder; give a file name");
  if (have_sock)
    expect_error(kiln_check_output(sock, KILN_OUTPUT_STREAMED, NULL, 0), ": is a socket");
  expect_error(kiln_check_output(in, KILN_OUTPUT_STREAMED, ins, 2), "is the input");
}

/* The atomic writer refuses a FIFO, a device node (made here, when the test may) and a folder
 * under the name, leaving each as it was and no temporary; a temporary left by a killed process
 * of the same id is written over, never written through. */
static void test_atomic_write_refuses_nodes(void **state) {
  const tmpdir_fixture *t = *state;
  char fifo[256], node[256], dir[256], out[256], tmp[320], target[256];
  path_in(t, "fifo", fifo, sizeof fifo);
  path_in(t, "full", node, sizeof node);
  path_in(t, "dir", dir, sizeof dir);
  path_in(t, "out.txt", out, sizeof out);
  path_in(t, "target.txt", target, sizeof target);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  assert_int_equal(mkdir(dir, 0755), 0);
  const bool have_node = mknod(node, S_IFCHR | 0644, makedev(1, 7)) == 0;
  struct stat st;
  expect_error(kiln_write_file_atomic(fifo, "x", 1), ": is a FIFO");
  assert_int_equal(lstat(fifo, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
  expect_error(kiln_write_file_atomic(dir, "x", 1), ": is a folder");
  assert_int_equal(lstat(dir, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  if (have_node) {
    expect_error(kiln_write_file_atomic(node, "x", 1), ": is a device");
    assert_int_equal(lstat(node, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(st.st_rdev, makedev(1, 7));
  }
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", fifo, (long)getpid());
  assert_false(exists(tmp));

  /* the temporary name holds a link to another file (a killed run, the same process id) */
  write_plain(target, "keep", 4);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
  assert_int_equal(symlink(target, tmp), 0);
  assert_int_equal(kiln_write_file_atomic(out, "new", 3), KILN_OK);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(kiln_read_file(target, &text, &len), KILN_OK);
  assert_memory_equal(text, "keep", 4);
  free(text);
  assert_int_equal(kiln_read_file(out, &text, &len), KILN_OK);
  assert_int_equal(len, 3);
  assert_memory_equal(text, "new", 3);
  free(text);
  assert_false(exists(tmp));
}

/* A NUL byte named with its line and column (bytes, from 1). */
static void test_text_check_nul(void **state) {
  (void)state;
  assert_int_equal(kiln_text_check_nul("t.txt", "abc\ndef\n", 8), KILN_OK);
  assert_int_equal(kiln_text_check_nul("t.txt", "", 0), KILN_OK);
  assert_int_equal(kiln_text_check_nul("t.txt", "ab\0", 2), KILN_OK); /* past n */
  assert_int_equal(kiln_text_check_nul("t.txt", "\0abc", 4), KILN_ERR_PARSE);
  assert_non_null(strstr(kiln_last_error(), "t.txt:1:1: a NUL byte"));
  assert_int_equal(kiln_text_check_nul("t.svm", "1 1:1\n0 2:1\0\n", 13), KILN_ERR_PARSE);
  assert_non_null(strstr(kiln_last_error(), "t.svm:2:6: a NUL byte"));
  assert_int_equal(kiln_text_check_nul("u.txt", "\n\n\nx\0", 5), KILN_ERR_PARSE);
  assert_non_null(strstr(kiln_last_error(), "u.txt:4:2: a NUL byte"));
  assert_non_null(strstr(kiln_last_error(), "UTF-16"));
}

/* A digest of a FIFO or a folder is refused at once (a FIFO with no writer is not waited on). */
static void test_sha256_regular_only(void **state) {
  const tmpdir_fixture *t = *state;
  char fifo[256], dir[256], hex[65];
  path_in(t, "fifo", fifo, sizeof fifo);
  path_in(t, "dir", dir, sizeof dir);
  assert_int_equal(mkfifo(fifo, 0644), 0);
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(kiln_sha256_file(fifo, hex), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "fifo: not a regular file"));
  assert_int_equal(kiln_sha256_file(dir, hex), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "dir: not a regular file"));
  assert_int_equal(kiln_sha256_file("/dev/zero", hex), KILN_ERR_IO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_check_output, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_atomic_write_refuses_nodes, setup, tmpdir_teardown),
      cmocka_unit_test(test_text_check_nul),
      cmocka_unit_test_setup_teardown(test_sha256_regular_only, setup, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
