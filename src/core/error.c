/* Thread-local error messages: library calls return a status and leave a human-readable reason
 * here for the caller (only tools/ print it). One too long to keep is shortened in its middle,
 * so that a huge path in it cannot push out the reason that follows it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"

static _Thread_local char error_msg[4096];

/* A byte that continues a UTF-8 character: no cut falls before one. */
static bool continues(unsigned char c) { return (c & 0xC0) == 0x80; }

void kiln_shorten_middle(char *buf, size_t cap, const char *text, size_t len) {
  if (cap == 0) return;
  if (len < cap) {
    memmove(buf, text, len);
    buf[len] = '\0';
    return;
  }
  static const char dots[] = "...";
  if (cap < sizeof dots + 2) { /* no room for both ends: the end, where the reason is */
    size_t keep = cap - 1;
    memmove(buf, text + len - keep, keep);
    buf[keep] = '\0';
    return;
  }
  /* A third of the room for the start, the rest for the end: the reason follows the long part
   * (a path, a list), so the end holds it whole. Neither cut splits a UTF-8 character. */
  size_t room = cap - 1 - (sizeof dots - 1), head = room / 3, tail = room - head;
  while (head > 0 && continues((unsigned char)text[head])) head--;
  size_t from = len - tail;
  while (from < len && continues((unsigned char)text[from])) from++;
  tail = len - from;
  memmove(buf, text, head); /* text may be buf itself: the head stays where it is */
  memmove(buf + head, dots, sizeof dots - 1);
  memmove(buf + head + sizeof dots - 1, text + from, tail);
  buf[head + sizeof dots - 1 + tail] = '\0';
}

/* The formatted message in full (malloc'd), or NULL when out of memory. */
static char *format_all(const char *fmt, va_list ap, size_t *len) {
  va_list again;
  va_copy(again, ap);
  int n = vsnprintf(NULL, 0, fmt, again);
  va_end(again);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
  *len = (size_t)n;
  return s;
}

int kiln_errorf(int code, const char *fmt, ...) {
  va_list ap, copy;
  va_start(ap, fmt);
  va_copy(copy, ap);
  int n = vsnprintf(error_msg, sizeof error_msg, fmt, ap);
  va_end(ap);
  if (n >= (int)sizeof error_msg) { /* too long: shortened in the middle, the end kept */
    size_t len;
    char *full = format_all(fmt, copy, &len);
    if (full) kiln_shorten_middle(error_msg, sizeof error_msg, full, len);
    free(full);
  }
  va_end(copy);
  return code;
}

int kiln_error_context(int code, const char *fmt, ...) {
  size_t plen = 0, olen = strnlen(error_msg, sizeof error_msg);
  va_list ap;
  va_start(ap, fmt);
  char *prefix = format_all(fmt, ap, &plen);
  va_end(ap);
  if (!prefix) return code; /* out of memory: the message stands without its context */
  char *both = malloc(plen + olen + 1);
  if (both) {
    memcpy(both, prefix, plen);
    memcpy(both + plen, error_msg, olen);
    kiln_shorten_middle(error_msg, sizeof error_msg, both, plen + olen);
  }
  free(both);
  free(prefix);
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
