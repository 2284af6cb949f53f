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

void ce_html(kiln_strbuf *b, const char *text) {
  for (const char *p = text; *p; p++) {
    switch (*p) {
    case '&': kiln_strbuf_printf(b, "&amp;"); break;
    case '<': kiln_strbuf_printf(b, "&lt;"); break;
    case '>': kiln_strbuf_printf(b, "&gt;"); break;
    case '"': kiln_strbuf_printf(b, "&quot;"); break;
    case '\'': kiln_strbuf_printf(b, "&#39;"); break;
    default: kiln_strbuf_printf(b, "%c", *p); break;
    }
  }
}
