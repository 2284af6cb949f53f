/* Files, folders and pipes: whole-file reads, atomic writes, the checks on an output path,
 * readers run in a child process, descriptor transfers. */
#ifndef KILN_FILES_H
#define KILN_FILES_H

#include <stdbool.h>
#include <stddef.h>

/* Whole file into a NUL-terminated buffer (caller frees with free()). Only regular files: a
 * device or a FIFO (`/dev/zero`, a pipe) is KILN_ERR_IO naming the path, not an endless read. */
int kiln_read_file(const char *path, char **out, size_t *len);
/* The same, refusing a file of more than `max` bytes (KILN_ERR_INVALID naming the path and the
 * limit) before reading it. */
int kiln_read_file_max(const char *path, size_t max, char **out, size_t *len);
/* Writes `len` bytes to `path` through a temporary file and rename(): a reader never sees a
 * partial file under the final name. A `path` that exists as anything but a regular file (a
 * device, FIFO, socket or folder, which the rename would replace) is refused, as
 * kiln_check_output does. */
int kiln_write_file_atomic(const char *path, const void *data, size_t len);
/* How an output is written: through a temporary name and rename(), which replaces whatever the
 * name held (kiln_write_file_atomic), or into the file as it stands (a stream: the metrics
 * file, for which a character device or a FIFO is written to, not replaced). */
typedef enum { KILN_OUTPUT_RENAMED, KILN_OUTPUT_STREAMED } kiln_output_kind;
/* Whether `out` may be written by a command that reads `inputs` (n paths; NULL ones skipped).
 * KILN_ERR_INVALID, naming `out` and what it is, when it
 *   - is one of the inputs by any name (the same device and inode: a symbolic or hard link, a
 *     "./" spelling), naming that input; or an existing file directly inside an input that is a
 *     folder (a database's data.mdb, CURRENT or MANIFEST);
 *   - exists as a folder, a socket or a block device (a disk), or (RENAMED) as anything but a
 *     regular file: a device node or a FIFO would be replaced by a regular file.
 * A path that does not exist yet (or cannot be looked at: the write then says why) is KILN_OK. */
int kiln_check_output(const char *out, kiln_output_kind kind, const char *const *inputs,
                      size_t n);
/* KILN_ERR_PARSE "PATH:LINE:COL: a NUL byte ..." at the first NUL of text[0 .. n) (a binary or
 * UTF-16 file read as text); KILN_OK when there is none. Text readers check what they read with
 * it, so the message says what is wrong instead of blaming the token the NUL cut short. */
int kiln_text_check_nul(const char *path, const char *text, size_t n);
/* All n bytes to / from a descriptor (a pipe between processes), past short transfers and
 * EINTR: false on an error or, reading, an end before n bytes. */
bool kiln_fd_write_all(int fd, const void *p, size_t n);
bool kiln_fd_read_all(int fd, void *p, size_t n);
/* Reading an untrusted file in a forked child (libhdf5 crashes on some damaged files). In the
 * child: the fatal signals back to their default action, so that a crash ends it (handlers it
 * inherited, a test harness's or a sanitizer's, would carry on in the parent's code). In the
 * parent, for a child that gave no whole answer (its wait status, or -1 when unknown):
 * KILN_ERR_PARSE naming the path and either the signal that `library` crashed on or the
 * `reader`'s exit code; a child ended by SIGPIPE (its answer no longer wanted) counts as one
 * that gave no answer. */
void kiln_child_default_signals(void);
int kiln_child_failed(const char *path, const char *library, const char *reader, int status);
/* Removes what kiln_write_file_atomic leaves behind when its process is killed mid-write: files
 * named `<base>...tmp.<pid>` beside `path_prefix` (its folder, names starting with its last part)
 * whose process no longer runs. *removed (may be NULL) gets the count. A file of a live process
 * (a write in progress) is left alone. */
int kiln_remove_stale_temporaries(const char *path_prefix, int *removed);
/* Creates `path` and its missing parents (mode 0775, as `mkdir -p`); KILN_ERR_IO naming the
 * folder that could not be made, or the path when it exists but is not a folder. */
int kiln_mkdir_p(const char *path);

#endif
