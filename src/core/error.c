/* Thread-local error messages: library calls return a status and leave a human-readable reason
 * here for the caller (only tools/ print it). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kiln/core.h"

static _Thread_local char error_msg[4096];

int kiln_errorf(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_msg, sizeof error_msg, fmt, ap);
  va_end(ap);
  return code;
}

int kiln_error_context(int code, const char *fmt, ...) {
  char prefix[1024], old[sizeof error_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, error_msg, sizeof old);
  size_t plen = strlen(prefix);
  if (plen >= sizeof error_msg) plen = sizeof error_msg - 1;
  memcpy(error_msg, prefix, plen);
  size_t rest = sizeof error_msg - 1 - plen, olen = strnlen(old, rest);
  memcpy(error_msg + plen, old, olen);
  error_msg[plen + olen] = '\0';
  return code;
}

const char *kiln_last_error(void) { return error_msg[0] ? error_msg : "no error"; }

void kiln_clear_error(void) { error_msg[0] = '\0'; }

const char *kiln_status_name(int code) {
  static const char *const names[] = {
      [KILN_OK] = "ok",
      [KILN_ERR_IO] = "I/O error",
      [KILN_ERR_PARSE] = "parse error",
      [KILN_ERR_INVALID] = "invalid input",
      [KILN_ERR_SHAPE] = "shape mismatch",
      [KILN_ERR_DATA] = "bad data",
      [KILN_ERR_NOMEM] = "out of memory",
      [KILN_ERR_UNSUPPORTED] = "unsupported",
      [KILN_ERR_NUMERIC] = "numeric error",
      [KILN_ERR_INTERNAL] = "internal error",
      [KILN_ERR_COMM] = "communication error",
  };
  _Static_assert(sizeof names / sizeof names[0] == KILN_STATUS_COUNT, "status names out of step");
  if (code < 0 || code >= KILN_STATUS_COUNT) return "unknown status";
  return names[code];
}
