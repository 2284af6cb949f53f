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

bool ce_valid_name(const char *s) {
  if (!s || !*s || *s == '.' || strlen(s) >= sizeof(((kiln_ce_row *)0)->model)) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '-' || *s == '.'))
      return false;
  return true;
}

/* The length of the well-formed UTF-8 sequence at p (1..4), 0 when the bytes there are not one:
 * a stray continuation byte, a sequence cut short, an overlong form, a surrogate or a code point
 * past U+10FFFF. */
static size_t utf8_sequence(const unsigned char *p) {
  if (p[0] < 0x80) return 1;
  size_t n = p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : p[0] >= 0xe0 && p[0] <= 0xef ? 3
           : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : 0;
  for (size_t i = 1; i < n; i++)
    if ((p[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) return 0;
  if (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))) return 0;
  return n;
}

int ce_utf8_repair(kiln_strbuf *b, const char *replacement) {
  if (!b->s) return KILN_OK;
  size_t bad = 0;
  for (size_t i = 0; i < b->len;) {
    size_t n = utf8_sequence((const unsigned char *)b->s + i);
    if (!n) bad++;
    i += n ? n : 1;
  }
  if (!bad) return KILN_OK;
  kiln_strbuf out = {0};
  for (size_t i = 0; i < b->len;) {
    size_t n = utf8_sequence((const unsigned char *)b->s + i);
    if (n) kiln_strbuf_printf(&out, "%.*s", (int)n, b->s + i);
    else kiln_strbuf_printf(&out, "%s", replacement);
    i += n ? n : 1;
  }
  if (out.failed) {
    free(out.s);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  free(b->s);
  *b = out;
  return KILN_OK;
}
