/* Private helpers shared by the CE files: paths, times and HTML text. */
#ifndef KILN_CE_INTERNAL_H
#define KILN_CE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include "kiln/core.h"

/* The folder part of a path ("." when there is none). */
void ce_dirname(const char *path, char *buf, size_t n);
/* `rel` when absolute, else dir/rel. */
void ce_join(const char *dir, const char *rel, char *buf, size_t n);
/* Now, UTC, ISO 8601 ("2026-11-30T14:02:11Z"); `compact` gives "20261130-140211". */
void ce_utc_now(char *buf, size_t n, int compact);

/* snprintf for messages and paths where cutting a too-long text short is acceptable (checked
 * paths use the return value instead). */
void ce_fmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Text with &, <, >, " and ' escaped for HTML. */
void ce_html(kiln_strbuf *b, const char *text);

#endif
