/* Private helpers shared by the CE files: paths, times, HTML text, and the runner's child
 * processes. */
#ifndef KILN_CE_INTERNAL_H
#define KILN_CE_INTERNAL_H

#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "kiln/ce.h"
#include "kiln/core.h"

/* KPI entries a model may have. */
enum { CE_MAX_KPIS = 16 };

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

/* history.c: the open database and its path, for the queries of query.c; a column of a result
 * row as a number (NaN for NULL) or as text ("" for NULL). */
sqlite3 *ce_history_db(kiln_ce_history *h);
const char *ce_history_path(const kiln_ce_history *h);
double ce_column_real(sqlite3_stmt *s, int i);
void ce_column_text(sqlite3_stmt *s, int i, char *buf, size_t n);

/* child.c: the runner's trainings (and decodes) as child processes. */
/* Seconds on the monotonic clock. */
double ce_now_s(void);
/* Runs argv in `folder`, its output in folder/log_name ("train.log"), and waits for it, within
 * timeout_s and until *cancel (when given); c says how it ended, how long it took and the last
 * error line of its log. */
void ce_run_child(char *const argv[], const char *folder, const char *log_name, double timeout_s,
                  const volatile sig_atomic_t *cancel, kiln_ce_child *c);
/* Whether `name` is an executable file in a folder of `path` (a PATH list); its path in buf. */
bool ce_find_in_path(const char *path, const char *name, char *buf, size_t n);

#endif
