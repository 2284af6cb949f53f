/* Paths, folders, timestamps and a string builder for the CE files. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ce/internal.h"
#include "kiln/core.h"

int ce_mkdir_p(const char *path) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = '\0';
    if (mkdir(p, 0775) != 0 && errno != EEXIST)
      return kiln_errorf(KILN_ERR_IO, "%s: cannot create folder: %s", p, strerror(errno));
    *s = '/';
  }
  if (mkdir(p, 0775) != 0 && errno != EEXIST)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot create folder: %s", p, strerror(errno));
  return KILN_OK;
}

void ce_dirname(const char *path, char *buf, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(buf, n, ".");
  else if (slash == path) snprintf(buf, n, "/");
  else snprintf(buf, n, "%.*s", (int)(slash - path), path);
}

void ce_join(const char *dir, const char *rel, char *buf, size_t n) {
  if (rel[0] == '/' || !dir || !dir[0]) snprintf(buf, n, "%s", rel);
  else snprintf(buf, n, "%s/%s", dir, rel);
}

void ce_utc_now(char *buf, size_t n, int compact) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, n, compact ? "%Y%m%d-%H%M%S" : "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void ce_fmt(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, n, fmt, ap);
  va_end(ap);
}

void ce_printf(ce_buf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->s ? b->cap - b->len : 0;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = 1;
      return;
    }
    if (b->s && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap <= b->len + (size_t)n) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->failed = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
}

void ce_html(ce_buf *b, const char *text) {
  for (const char *p = text; *p; p++) {
    switch (*p) {
    case '&': ce_printf(b, "&amp;"); break;
    case '<': ce_printf(b, "&lt;"); break;
    case '>': ce_printf(b, "&gt;"); break;
    case '"': ce_printf(b, "&quot;"); break;
    case '\'': ce_printf(b, "&#39;"); break;
    default: ce_printf(b, "%c", *p); break;
    }
  }
}
