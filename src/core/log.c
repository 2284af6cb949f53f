/* Logging for library code: messages go to a handler the tool installs (default: stderr), never
 * to stdout, which belongs to the tools. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/core.h"

static kiln_log_fn log_fn;
static void *log_user;
static kiln_log_level log_min = KILN_LOG_INFO;

void kiln_log_set_handler(kiln_log_fn fn, void *user) {
  log_fn = fn;
  log_user = user;
}

void kiln_log_set_level(kiln_log_level min_level) { log_min = min_level; }

void kiln_log(kiln_log_level level, const char *fmt, ...) {
  if (level < log_min) return;
  char msg[2048];
  va_list ap, copy;
  va_start(ap, fmt);
  va_copy(copy, ap);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *full = n >= (int)sizeof msg ? malloc((size_t)n + 1) : NULL;
  if (full) { /* too long: its middle shortened, its end (the reason) kept */
    vsnprintf(full, (size_t)n + 1, fmt, copy);
    kiln_shorten_middle(msg, sizeof msg, full, (size_t)n);
    free(full);
  }
  va_end(copy);
  if (log_fn) {
    log_fn(level, msg, log_user);
  } else {
    static const char *const tags[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "kiln %s: %s\n", tags[level], msg);
  }
}
