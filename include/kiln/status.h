/* kiln status codes, error messages and logging: how library code reports what went wrong or
 * what it did (it never prints or exits; tools choose where messages go). */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <stddef.h>

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

#endif
