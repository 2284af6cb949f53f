/* The checks every writer and text reader shares: what an output path may be
 * (kiln_check_output: never one of the command's inputs, never a device, FIFO, socket or folder
 * that a rename would replace) and text that is not text (kiln_text_check_nul: a NUL byte named
 * where it is, not taken for the end of a token). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/core.h"

static const char *kind_of(mode_t m) {
  return S_ISDIR(m)                   ? "a folder"
         : S_ISFIFO(m)                ? "a FIFO"
         : S_ISCHR(m)                 ? "a device"
         : S_ISBLK(m)                 ? "a block device"
         : S_ISSOCK(m)                ? "a socket"
                                      : "not a regular file";
}

/* The folder `path` is in ("." for a bare name, "/" for "/name"), stat'ed into *st. */
static bool folder_of(const char *path, struct stat *st) {
  const char *slash = strrchr(path, '/');
  if (!slash) return stat(".", st) == 0;
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *dir = malloc(n + 1);
  if (!dir) return false;
  memcpy(dir, path, n);
  dir[n] = '\0';
  bool ok = stat(dir, st) == 0;
  free(dir);
  return ok;
}

int kiln_check_output(const char *out, kiln_output_kind kind, const char *const *inputs,
                      size_t n) {
  struct stat so;
  if (!out || stat(out, &so) != 0) return KILN_OK; /* new (a missing folder is the write's) */
  struct stat dir;
  bool have_dir = false, dir_tried = false;
  for (size_t i = 0; i < n; i++) {
    struct stat si;
    if (!inputs[i] || stat(inputs[i], &si) != 0) continue;
    if (si.st_dev == so.st_dev && si.st_ino == so.st_ino)
      return kiln_errorf(KILN_ERR_INVALID, "%s: is the input %s itself: the output would replace "
                         "it; give another name", out, inputs[i]);
    if (!S_ISDIR(si.st_mode) || S_ISDIR(so.st_mode)) continue;
    if (!dir_tried) have_dir = folder_of(out, &dir), dir_tried = true;
    if (have_dir && dir.st_dev == si.st_dev && dir.st_ino == si.st_ino)
      return kiln_errorf(KILN_ERR_INVALID, "%s: is a file of the input %s (a folder): the output "
                         "would replace it; give a name outside that folder", out, inputs[i]);
  }
  if (S_ISREG(so.st_mode)) return KILN_OK;
  if (kind == KILN_OUTPUT_STREAMED) {
    /* written into: /dev/null, a terminal, a pipe's reader; never a disk's blocks */
    if (S_ISCHR(so.st_mode) || S_ISFIFO(so.st_mode)) return KILN_OK;
    return kiln_errorf(KILN_ERR_INVALID, "%s: is %s; give a file name", out, kind_of(so.st_mode));
  }
  return kiln_errorf(KILN_ERR_INVALID, "%s: is %s: the output is written to a new file under that "
                     "name, and this one would be replaced; give a file name", out,
                     kind_of(so.st_mode));
}

int kiln_text_check_nul(const char *path, const char *text, size_t n) {
  const char *z = n ? memchr(text, '\0', n) : NULL;
  if (!z) return KILN_OK;
  int line = 1;
  const char *start = text;
  for (const char *p = text; p < z && (p = memchr(p, '\n', (size_t)(z - p))); p++) {
    line++;
    start = p + 1;
  }
  return kiln_errorf(KILN_ERR_PARSE, "%s:%d:%zu: a NUL byte: this is not text (a binary file, or "
                     "UTF-16? kiln reads UTF-8)", path, line, (size_t)(z - start) + 1);
}
