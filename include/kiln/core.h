/* kiln core: status codes and error messages, logging, blobs (shaped float tensors with data and
 * gradient), the seeded random generator, aligned memory and small helpers every module uses. */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- status and errors ------------------------------------------------------------------ */

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERR_IO,          /* a file could not be opened, read or written */
  KILN_ERR_PARSE,       /* malformed text or binary input */
  KILN_ERR_INVALID,     /* well-formed input that makes no sense (bad field value, missing blob) */
  KILN_ERR_SHAPE,       /* shapes that do not agree */
  KILN_ERR_DATA,        /* bad records in a data set (wrong size, label out of range) */
  KILN_ERR_NOMEM,       /* allocation failed or the memory limit would be exceeded */
  KILN_ERR_UNSUPPORTED, /* valid Caffe input that kiln does not implement */
  KILN_ERR_NUMERIC,     /* NaN or infinity where a number was needed */
  KILN_ERR_INTERNAL,
  KILN_ERR_COMM,        /* workers disagree or a message between them failed (MPI) */
  KILN_STATUS_COUNT
} kiln_status;

/* Sets this thread's error message (printf-style) and returns `code`, so a failing path reads
 * `return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));`. */
int kiln_errorf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends context ("layer 'conv1': ") to the current message; returns `code`. A message longer
 * than the 4 KiB kept (a huge path in it) is shortened in its middle, by both calls, so that its
 * start and its end, where the reason is, survive (kiln_shorten_middle). */
int kiln_error_context(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* text[0 .. len) into buf (cap bytes, NUL-terminated): whole when it fits, else its first third
 * and its last two thirds with "..." between, never cutting a UTF-8 character. */
void kiln_shorten_middle(char *buf, size_t cap, const char *text, size_t len);
const char *kiln_last_error(void);
void kiln_clear_error(void);
const char *kiln_status_name(int code);

/* Propagate a failing status unchanged. */
#define KILN_TRY(expr)            \
  do {                            \
    int kiln_try_rc_ = (expr);    \
    if (kiln_try_rc_ != KILN_OK)  \
      return kiln_try_rc_;        \
  } while (0)

/* ---- logging: library code reports through here; tools choose where it goes -------------- */

typedef enum { KILN_LOG_DEBUG, KILN_LOG_INFO, KILN_LOG_WARN, KILN_LOG_ERROR } kiln_log_level;
typedef void (*kiln_log_fn)(kiln_log_level level, const char *msg, void *user);
void kiln_log_set_handler(kiln_log_fn fn, void *user); /* NULL restores stderr */
void kiln_log_set_level(kiln_log_level min_level);
void kiln_log(kiln_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- memory ------------------------------------------------------------------------------ */

void *kiln_alloc(size_t bytes);       /* 64-byte aligned, zeroed; NULL on failure */
/* As kiln_alloc, but from 1 MiB up in whole 2 MiB pages the kernel is asked to back with
 * transparent huge pages (madvise): for the flat parameter, gradient and history buffers, which
 * every step streams through and which MPI's single-copy transfers pin page by page. */
void *kiln_alloc_huge(size_t bytes);
void kiln_free(void *p);
char *kiln_strdup(const char *s);
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
/* Peak resident set size of this process in MiB (VmHWM). */
double kiln_peak_rss_mb(void);
/* How long the calling thread has been runnable but waiting for a CPU since it started (the
 * kernel's run-queue delay, /proc/thread-self/schedstat), in ms: time other threads and
 * processes held the cores it wanted. NaN where the kernel does not report it. */
double kiln_thread_cpu_wait_ms(void);
/* Memory the OS reports as available (MemAvailable), in bytes; 0 if unknown. */
uint64_t kiln_mem_available(void);
double kiln_now_ms(void); /* monotonic clock */
void kiln_sleep_ms(double ms); /* sleeps (through signals) */

/* ---- blobs ------------------------------------------------------------------------------- */

#define KILN_MAX_AXES 8

/* A sparse matrix in compressed sparse rows: row r's entries are col[k], val[k] for k in
 * row_ptr[r] .. row_ptr[r + 1), columns 0-based and increasing within a row. Capacities only
 * grow (kiln_csr_reserve), so refilling a matrix no larger than one seen before allocates
 * nothing. */
typedef struct kiln_csr {
  int64_t rows, cols, nnz;
  int64_t *row_ptr; /* rows + 1 */
  int32_t *col;
  float *val;
  int64_t row_cap, nnz_cap; /* allocated rows (row_ptr holds row_cap + 1) and entries */
} kiln_csr;

/* Room for `rows` rows and `nnz` entries (contents kept); KILN_ERR_NOMEM when it cannot. */
int kiln_csr_reserve(kiln_csr *m, int64_t rows, int64_t nnz);
void kiln_csr_free(kiln_csr *m);
/* Bytes the matrix holds allocated. */
int64_t kiln_csr_bytes(const kiln_csr *m);

/* A blob is an N-d float tensor with a gradient of the same shape (Caffe's Blob). Activations own
 * their memory; parameter blobs are views into the net's flat parameter and gradient buffers.
 * A sparse blob (csr non-NULL, kiln_blob_make_sparse) holds its values in that CSR matrix: its
 * shape (N x dim) is nominal, and it has no dense data or diff. */
typedef struct kiln_blob {
  char *name;
  int naxes;
  int64_t shape[KILN_MAX_AXES];
  int64_t count;
  float *data;
  float *diff;
  int64_t capacity; /* floats allocated when owned */
  bool owned;
  bool defer_alloc; /* reshape records the shape only; kiln_blob_alloc() allocates later */
  bool no_diff;     /* storage for data only (layer buffers: masks, caches); diff stays NULL */
  int64_t diff_borrowed; /* > 0: diff is someone else's buffer of this many floats (never freed
                            here; the blob cannot grow past it) */
  int layout;            /* KILN_LAYOUT_*: how data and diff are laid out in memory */
  const struct kiln_blob *data_of; /* non-NULL: the data is that blob's (a Split's top reading
                                      its bottom's); only the diff is this blob's own */
  int id;                /* its index in its net's activation blobs; -1 for any other blob */
  kiln_csr *csr; /* non-NULL: a sparse blob; only layers whose table sets sparse_bottom read it */
  /* Where data and diff live (include/kiln/device.h); NULL: the host. Code other than its
   * backend's kernels moves values in and out only through the device's table. */
  const struct kiln_device *device;
} kiln_blob;

/* Activation layouts. PLAIN is Caffe's row-major N x C x H x W (and every blob that is not 4-D).
 * BLOCKED16 is oneDNN's nChw16c for a 4-D blob whose C is a multiple of 16: element (n, c, h, w)
 * at ((n * C/16 + c/16) * H*W + h*W + w) * 16 + c%16. The net chooses BLOCKED16 only between
 * layers that read it (docs/architecture.md); everything outside a net sees PLAIN. */
enum { KILN_LAYOUT_PLAIN = 0, KILN_LAYOUT_BLOCKED16 = 1 };
/* The layout that keeps channels in blocks of `channels` (what a convolution route asks for,
 * kiln_layer_ops.block_channels): BLOCKED16 for 16, PLAIN for a block kiln has no layout for
 * (0 included). */
int kiln_layout_for_block(int channels);

kiln_blob *kiln_blob_new(const char *name);
void kiln_blob_free(kiln_blob *b);
/* Sets the shape; an owned blob grows its storage when needed (new memory is zeroed) and keeps
 * it when shrinking, so steady-state reshapes never allocate. */
int kiln_blob_reshape(kiln_blob *b, int naxes, const int64_t *shape);
int kiln_blob_reshape_like(kiln_blob *b, const kiln_blob *other);
/* Allocates an owned blob's storage for its current shape (clears defer_alloc). */
int kiln_blob_alloc(kiln_blob *b);
/* Makes `b` a sparse blob (csr attached, empty; no dense data or diff ever allocated). */
int kiln_blob_make_sparse(kiln_blob *b);
/* Makes an owned blob's diff a borrowed buffer of `floats` (>= count) floats. */
void kiln_blob_borrow_diff(kiln_blob *b, float *diff, int64_t floats);
/* Makes `b` a view (no ownership) onto external data/diff. */
void kiln_blob_set_view(kiln_blob *b, float *data, float *diff);
/* Product of shape[start..end). */
int64_t kiln_blob_count_range(const kiln_blob *b, int start, int end);
/* Python-style negative axis to an index in [0, naxes); error if out of range. */
int kiln_blob_canonical_axis(const kiln_blob *b, int axis, int *out);
/* "64x20x24x24" */
const char *kiln_blob_shape_string(const kiln_blob *b, char *buf, size_t n);

/* ---- random numbers ---------------------------------------------------------------------- */

/* PCG32: small state that snapshots can store, so a resumed run draws the same numbers. */
typedef struct kiln_rng {
  uint64_t state;
  uint64_t inc;
} kiln_rng;

void kiln_rng_seed(kiln_rng *r, uint64_t seed, uint64_t stream);
uint32_t kiln_rng_u32(kiln_rng *r);
uint32_t kiln_rng_below(kiln_rng *r, uint32_t n); /* uniform in [0, n) without bias */
float kiln_rng_uniform(kiln_rng *r, float lo, float hi); /* [lo, hi) */
float kiln_rng_gaussian(kiln_rng *r, float mean, float std);

/* ---- a growing string -------------------------------------------------------------------- */

/* Text appended printf-style into one malloc'd buffer `s` (NUL-terminated once anything was
 * appended; the owner frees it). `failed` is set once an allocation or a format failed, after
 * which appends do nothing, so a caller checks once at the end. Zero-initialise to start. */
typedef struct kiln_strbuf {
  char *s;
  size_t len, cap;
  int failed;
} kiln_strbuf;
void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- SHA-256 (FIPS 180-4) ---------------------------------------------------------------- */

/* Computed by Nettle (src/core/sha256.c); the context is its state, kept opaque here. */
typedef struct kiln_sha256_ctx {
  _Alignas(8) unsigned char opaque[128];
} kiln_sha256_ctx;

void kiln_sha256_init(kiln_sha256_ctx *c);
void kiln_sha256_update(kiln_sha256_ctx *c, const void *data, size_t len);
void kiln_sha256_final(kiln_sha256_ctx *c, uint8_t digest[32]);
void kiln_sha256(const void *data, size_t len, uint8_t digest[32]);
/* Lowercase hex of a digest; `hex` receives 64 characters and a NUL. */
void kiln_sha256_hex(const uint8_t digest[32], char hex[65]);
/* Hashes a file's bytes as stored (streaming). */
int kiln_sha256_file(const char *path, char hex[65]);

/* ---- threads ----------------------------------------------------------------------------- */

/* Sets the threads used by kernels (OpenMP) and by the BLAS library together. */
void kiln_set_num_threads(int n);
int kiln_get_num_threads(void);

/* ---- fault injection --------------------------------------------------------------------- */

/* Deliberate faults that let tests plant a real regression in an unchanged trainer (the CE
 * harness's end-to-end tests; docs/ce.md). The environment variable KILN_FAULT chooses one:
 *   sleep:LAYER:MS   every forward of layer LAYER sleeps MS milliseconds (0.001..60000, at most
 *                    three decimals)
 *   slowread:LAYER:MS  data layer LAYER's reader (its prefetch thread) takes MS milliseconds (as
 *                    for sleep)
 *                    for each batch, reading included (it sleeps the rest): a slow disk, for
 *                    the prefetch measurement (bench/prefetch)
 *   leak:KB          every training iteration allocates and touches KB kilobytes (1..1048576)
 *                    that stay allocated (reachable, so LeakSanitizer stays quiet) until exit
 *   lr:FACTOR        every learning rate the solver applies is the lr_policy's times FACTOR
 *                    (a decimal number, 0 < FACTOR <= 1000): a planted accuracy drop
 *   stop:STAGE:RANK  the worker of rank RANK stops itself (SIGSTOP) at a point of the MPI start-up:
 *                    STAGE `start` (before MPI_Init), `init` (after it, before kiln's
 *                    communicators) or `setup` (before the first collective): a rank that stops
 *                    or hangs there, for the tests of the stall detection (docs/distributed.md)
 * Unset or empty: no fault. kiln_config_from_env (include/kiln/config.h) reads the variable. */
#define KILN_FAULT_ENV "KILN_FAULT"

typedef enum {
  KILN_FAULT_NONE,
  KILN_FAULT_SLEEP,
  KILN_FAULT_LEAK,
  KILN_FAULT_STOP,
  KILN_FAULT_SLOW_READ,
  KILN_FAULT_LR
} kiln_fault_kind;

typedef struct kiln_fault {
  kiln_fault_kind kind;
  char layer[128]; /* sleep, slowread: the layer's name */
  int64_t us;      /* sleep: per forward; slowread: per batch read (MS given to 0.001) */
  int64_t kb;      /* leak: per training iteration */
  char stage[8];   /* stop: "start", "init" or "setup" */
  int rank;        /* stop: the worker that stops */
  double lr_factor; /* lr: what every learning rate is multiplied by */
} kiln_fault;

/* Parses a KILN_FAULT value; a malformed one is KILN_ERR_INVALID with a message naming the
 * variable and the expected syntax. */
int kiln_fault_parse(const char *text, kiln_fault *out);
/* "sleep 20 ms in every forward of layer 'conv1'", for logs and warnings. */
const char *kiln_fault_describe(const kiln_fault *f, char *buf, size_t n);
/* The fault's effects; each does nothing for a fault of another kind. */
void kiln_fault_sleep(const kiln_fault *f);
int kiln_fault_leak(const kiln_fault *f);
/* Stops this process (SIGSTOP) when the fault is stop:STAGE:RANK with this stage and rank. */
void kiln_fault_stop(const kiln_fault *f, const char *stage, int rank);

#endif
