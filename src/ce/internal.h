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

/* A model's or a machine class's name: 1 to 63 letters, digits, '_', '-' or '.', not starting
 * with '.'. Both name a file or folder under the baselines, so nothing else may reach a path. */
bool ce_valid_name(const char *s);

/* Replaces every byte of `b` that is not part of well-formed UTF-8 (a folder or file name in
 * another encoding, a model name of a CPU) by `replacement`: "\\ufffd" in JSON, whose strings
 * are the only place such bytes can be, or U+FFFD itself in HTML. So the reports stay valid JSON
 * and UTF-8 whatever the names they quote. */
int ce_utf8_repair(kiln_strbuf *b, const char *replacement);

/* Text with &, <, >, " and ' escaped for HTML. */
void ce_html(kiln_strbuf *b, const char *text);

/* history.c: the open database and its path, for the queries of query.c; a column of a result
 * row as a number (NaN for NULL) or as text ("" for NULL). */
sqlite3 *ce_history_db(kiln_ce_history *h);
const char *ce_history_path(const kiln_ce_history *h);
double ce_column_real(sqlite3_stmt *s, int i);
void ce_column_text(sqlite3_stmt *s, int i, char *buf, size_t n);

/* svg.c: what the report's SVG charts share. Red marks regressions and failures only; the
 * series' colours keep at least 40 degrees of hue away from it. */
#define CE_REGRESSION_RED "#d00"
enum { CE_NCOLOURS = 8 };
const char *ce_series_colour(int i); /* the i-th series' colour (they repeat after 8) */
#define CE_FONT_PX 10.0              /* the charts' text size */
/* A text's width at CE_FONT_PX, estimated at 0.65 em a character. */
double ce_text_px(const char *text);
/* An axis label of v with `digits` significant digits and k, M, G, T suffixes. */
void ce_fmt_axis(char *buf, size_t n, double v, int digits);
/* The labels of an axis from lo to hi: as few digits (from 3) as keep the two apart. */
void ce_axis_labels(double lo, double hi, char *lo_text, char *hi_text, size_t n);
/* Widens a value range a little (8% each side; 5% of the value, or 1, for a single value). */
void ce_pad_range(double *lo, double *hi);
/* Places legend entries (each `key` px of swatch, its text, 12 px of gap) from x, wrapping to a
 * new row at `left` when an entry would pass `right` (`full_right` from the second row on).
 * Fills each entry's x and row; returns the number of rows. */
int ce_legend_layout(const char *const *entries, int n, double key, double x, double right,
                     double left, double full_right, double *xs, int *rows);

/* curves.c: convergence curves of a run and of a baseline. */
enum { CE_CURVE_POINTS = 100 }; /* at most, per curve */
typedef struct ce_curve {
  char metric[32]; /* "train_loss", or the test figure: "accuracy", "f1", "mAP", "perplexity" */
  int workers;
  int n;
  bool has_seconds; /* every point has its time (metrics written before it had none) */
  double iter[CE_CURVE_POINTS], seconds[CE_CURVE_POINTS], value[CE_CURVE_POINTS];
} ce_curve;
/* <report_dir>/runs/<model>-w<workers>-r1/<file>: a file of the first repeat's run folder. */
int ce_run_file(const char *report_dir, const char *model, int workers, const char *file,
                char *buf, size_t n);
/* The first repeat's metrics; *found false (and KILN_OK) when there is no such file. */
int ce_curves_metrics(const char *report_dir, const char *model, int workers,
                      kiln_ce_metrics *m, bool *found);
/* The test figure the curves show: accuracy, else f1, else mAP, else perplexity; NULL with no
 * test. */
const char *ce_test_metric(const kiln_ce_metrics *m);
/* A metric's finite points, at most CE_CURVE_POINTS of them evenly picked (first and last in). */
void ce_curve_from_metrics(const kiln_ce_metrics *m, const char *metric, int workers,
                           ce_curve *c);
/* The baseline's curve of that metric and worker count; false when it has none. */
bool ce_curve_from_baseline(const Caffe__CeBaseline *b, const char *metric, int workers,
                            ce_curve *c);
/* Refuses a curve a baseline cannot be drawn from, naming the file and the curve. */
int ce_curve_check(const char *path, const Caffe__CeCurve *c, size_t index);
/* Stores the curves of every worker count of `model` the run measured into `b` (replacing
 * those of the same metric and worker count; curves of run folders that are gone are kept). */
int ce_curves_accept(Caffe__CeBaseline *b, const kiln_ce_result *r, const char *model);

/* report_curves.c: per model, the convergence charts and the scaling chart. */
int ce_report_curves(kiln_strbuf *b, const kiln_ce_result *r, const char *model);

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
