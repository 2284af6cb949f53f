/* A growing string. */
#ifndef KILN_STRBUF_H
#define KILN_STRBUF_H

#include <stddef.h>

/* Text appended printf-style into one malloc'd buffer `s` (NUL-terminated once anything was
 * appended; the owner frees it). `failed` is set once an allocation or a format failed, after
 * which appends do nothing, so a caller checks once at the end. Zero-initialise to start. */
typedef struct kiln_strbuf {
  char *s;
  size_t len, cap;
  int failed;
} kiln_strbuf;
void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
