/* Private helpers shared by the CE files: paths and folders. */
#ifndef KILN_CE_INTERNAL_H
#define KILN_CE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

/* mkdir -p; a kiln status with the folder named on failure. */
int ce_mkdir_p(const char *path);
/* The folder part of a path ("." when there is none). */
void ce_dirname(const char *path, char *buf, size_t n);
/* `rel` when absolute, else dir/rel. */
void ce_join(const char *dir, const char *rel, char *buf, size_t n);
/* Now, UTC, ISO 8601 ("2026-11-30T14:02:11Z"); `compact` gives "20261130-140211". */
void ce_utc_now(char *buf, size_t n, int compact);

/* snprintf for messages and paths where cutting a too-long text short is acceptable (checked
 * paths use the return value instead). */
void ce_fmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A growing string for reports; `failed` once an allocation failed (later appends do nothing). */
typedef struct ce_buf {
  char *s;
  size_t len, cap;
  int failed;
} ce_buf;
void ce_printf(ce_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Text with &, <, >, " and ' escaped for HTML. */
void ce_html(ce_buf *b, const char *text);

#endif
