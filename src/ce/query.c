/* Questions asked of the CE history from the command line: the series of one model's KPIs over
 * the recorded runs (`kiln ce history`), which run an id or `latest~N` names, and two runs side
 * by side (`kiln ce compare`). Rows come back as data; the `kiln` command prints them. When
 * nothing matches, the message says what the history does hold, so that a misspelt model or KPI
 * is answered with the names there are. */
#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ce/internal.h"
#include "kiln/ce.h"

static int query_error(kiln_ce_history *h) {
  return kiln_errorf(KILN_ERR_IO, "%s: query: %s", ce_history_path(h),
                     sqlite3_errmsg(ce_history_db(h)));
}

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *text) {
  if (text && *text) sqlite3_bind_text(s, i, text, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(s, i);
}

/* The distinct values of one column of kpi_history under the query's filters (those of q that
 * `use` allows), comma-separated in `buf`: what the message of an empty answer lists. */
enum { USE_MODEL = 1, USE_KPI = 2, USE_CLASS = 4, USE_REST = 8 };
static int distinct_values(kiln_ce_history *h, const char *column, const kiln_ce_query *q,
                           int use, char *buf, size_t n) {
  char sql[512];
  snprintf(sql, sizeof sql,
           "SELECT DISTINCT %s FROM kpi_history WHERE (?1 IS NULL OR model = ?1) AND "
           "(?2 IS NULL OR kpi = ?2) AND (?3 IS NULL OR machine_class = ?3) AND "
           "(?4 IS NULL OR suite = ?4) AND (?5 <= 0 OR workers = ?5) ORDER BY %s",
           column, column);
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(ce_history_db(h), sql, -1, &s, NULL) != SQLITE_OK) return query_error(h);
  bind_text_or_null(s, 1, use & USE_MODEL ? q->model : NULL);
  bind_text_or_null(s, 2, use & USE_KPI ? q->kpi : NULL);
  bind_text_or_null(s, 3, use & USE_CLASS ? q->machine_class : NULL);
  bind_text_or_null(s, 4, use & USE_REST ? q->suite : NULL);
  sqlite3_bind_int(s, 5, use & USE_REST ? q->workers : 0);
  size_t len = 0;
  buf[0] = '\0';
  int step;
  while ((step = sqlite3_step(s)) == SQLITE_ROW && len + 8 < n) {
    const unsigned char *t = sqlite3_column_text(s, 0);
    int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", t ? (const char *)t : "");
    len = w < 0 || (size_t)w >= n - len ? n - 1 : len + (size_t)w;
  }
  sqlite3_finalize(s);
  return step == SQLITE_ROW || step == SQLITE_DONE ? KILN_OK : query_error(h);
}

/* Why nothing matched, naming what there is: the models, the model's KPIs, or the worker counts
 * and suites of the series. */
static int nothing_matched(kiln_ce_history *h, const kiln_ce_query *q) {
  char have[1024], on[192] = "";
  if (q->machine_class && *q->machine_class)
    snprintf(on, sizeof on, " on machine class %s", q->machine_class);
  KILN_TRY(distinct_values(h, "model", q, USE_MODEL | USE_CLASS, have, sizeof have));
  if (!have[0]) {
    char models[1024], classes[512];
    KILN_TRY(distinct_values(h, "model", q, USE_CLASS, models, sizeof models));
    KILN_TRY(distinct_values(h, "machine_class", q, USE_MODEL, classes, sizeof classes));
    if (classes[0])
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s: model '%s' has no history%s; it has on machine class %s",
                         ce_history_path(h), q->model, on, classes);
    return kiln_errorf(KILN_ERR_INVALID, "%s: no model '%s' in the history%s (%s%s)",
                       ce_history_path(h), q->model, on, models[0] ? "models: " : "no runs",
                       models);
  }
  if (q->kpi && *q->kpi) {
    KILN_TRY(distinct_values(h, "kpi", q, USE_MODEL | USE_KPI | USE_CLASS, have, sizeof have));
    if (!have[0]) {
      char kpis[1024];
      KILN_TRY(distinct_values(h, "kpi", q, USE_MODEL | USE_CLASS, kpis, sizeof kpis));
      return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s' has no KPI '%s' in the history%s "
                         "(its KPIs: %s)",
                         ce_history_path(h), q->model, q->kpi, on, kpis);
    }
  }
  char workers[256], suites[512];
  KILN_TRY(distinct_values(h, "workers", q, USE_MODEL | USE_KPI | USE_CLASS, workers,
                           sizeof workers));
  KILN_TRY(distinct_values(h, "suite", q, USE_MODEL | USE_KPI | USE_CLASS, suites,
                           sizeof suites));
  char asked[256] = "";
  if (q->workers > 0) snprintf(asked, sizeof asked, " with %d workers", q->workers);
  if (q->suite && *q->suite)
    ce_fmt(asked + strlen(asked), sizeof asked - strlen(asked), " in suite '%s'", q->suite);
  return kiln_errorf(KILN_ERR_INVALID,
                     "%s: no history of model '%s'%s%s%s%s (recorded: workers %s; suites %s)",
                     ce_history_path(h), q->model, q->kpi && *q->kpi ? " KPI '" : "",
                     q->kpi && *q->kpi ? q->kpi : "", q->kpi && *q->kpi ? "'" : "", asked,
                     workers, suites);
}

/* Sorting: by KPI in the order the newest run lists them, then worker count, then run. */
typedef struct keyed {
  kiln_ce_history_row row;
  int group, index;
} keyed;

static int cmp_keyed(const void *pa, const void *pb) {
  const keyed *a = pa, *b = pb;
  if (a->group != b->group) return a->group < b->group ? -1 : 1;
  if (a->row.workers != b->row.workers) return a->row.workers < b->row.workers ? -1 : 1;
  if (a->row.run_id != b->row.run_id) return a->row.run_id < b->row.run_id ? -1 : 1;
  return (a->index > b->index) - (a->index < b->index);
}

int kiln_ce_history_query(kiln_ce_history *h, const kiln_ce_query *q, kiln_ce_history_row **out,
                          int *n) {
  *out = NULL;
  *n = 0;
  if (!q->model || !*q->model) return kiln_errorf(KILN_ERR_INVALID, "history: no model given");
  sqlite3_stmt *s;
  /* newest run first, each run's rows in the order it recorded them */
  if (sqlite3_prepare_v2(ce_history_db(h),
                         "SELECT k.run_id, r.started_at, r.git_commit, r.suite, r.machine_class, "
                         "k.model, k.workers, k.kpi, k.unit, k.higher_is_better, k.value, "
                         "k.spread, k.baseline, k.change, k.verdict, k.reason FROM kpis k "
                         "JOIN runs r ON r.id = k.run_id WHERE k.model = ?1 AND "
                         "(?2 IS NULL OR k.kpi = ?2) AND (?3 IS NULL OR r.machine_class = ?3) "
                         "AND (?4 IS NULL OR r.suite = ?4) AND (?5 <= 0 OR k.workers = ?5) "
                         "ORDER BY k.run_id DESC, k.rowid",
                         -1, &s, NULL) != SQLITE_OK)
    return query_error(h);
  sqlite3_bind_text(s, 1, q->model, -1, SQLITE_TRANSIENT);
  bind_text_or_null(s, 2, q->kpi);
  bind_text_or_null(s, 3, q->machine_class);
  bind_text_or_null(s, 4, q->suite);
  sqlite3_bind_int(s, 5, q->workers);
  keyed *k = NULL;
  int count = 0, cap = 0, step, rc = KILN_OK;
  char(*kpis)[32] = NULL; /* the KPIs in the order first seen: their groups */
  int nkpis = 0;
  while (rc == KILN_OK && (step = sqlite3_step(s)) == SQLITE_ROW) {
    if (count == cap) {
      int nc = cap ? 2 * cap : 64;
      keyed *nk = realloc(k, (size_t)nc * sizeof *nk);
      char(*nkp)[32] = realloc(kpis, (size_t)nc * sizeof *nkp);
      if (nk) k = nk;
      if (nkp) kpis = nkp;
      if (!nk || !nkp) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        break;
      }
      cap = nc;
    }
    kiln_ce_history_row *r = &k[count].row;
    memset(r, 0, sizeof *r);
    r->run_id = sqlite3_column_int64(s, 0);
    ce_column_text(s, 1, r->time, sizeof r->time);
    ce_column_text(s, 2, r->git_commit, sizeof r->git_commit);
    ce_column_text(s, 3, r->suite, sizeof r->suite);
    ce_column_text(s, 4, r->machine_class, sizeof r->machine_class);
    ce_column_text(s, 5, r->model, sizeof r->model);
    r->workers = sqlite3_column_int(s, 6);
    ce_column_text(s, 7, r->kpi, sizeof r->kpi);
    ce_column_text(s, 8, r->unit, sizeof r->unit);
    r->higher_is_better = sqlite3_column_int(s, 9) != 0;
    r->value = ce_column_real(s, 10);
    r->spread = ce_column_real(s, 11);
    r->baseline = ce_column_real(s, 12);
    r->change = ce_column_real(s, 13);
    ce_column_text(s, 14, r->verdict, sizeof r->verdict);
    ce_column_text(s, 15, r->reason, sizeof r->reason);
    int g = 0;
    while (g < nkpis && strcmp(kpis[g], r->kpi)) g++;
    if (g == nkpis) snprintf(kpis[nkpis++], sizeof kpis[0], "%s", r->kpi);
    k[count].group = g;
    k[count].index = count;
    count++;
  }
  sqlite3_finalize(s);
  free(kpis);
  if (rc == KILN_OK && step != SQLITE_DONE) rc = query_error(h);
  if (rc == KILN_OK && count == 0) rc = nothing_matched(h, q);
  if (rc) {
    free(k);
    return rc;
  }
  qsort(k, (size_t)count, sizeof *k, cmp_keyed);
  kiln_ce_history_row *rows = malloc((size_t)count * sizeof *rows);
  if (!rows) {
    free(k);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  /* --last: the newest `last` of each series (KPI and worker count), still oldest first */
  int kept = 0;
  for (int i = 0; i < count; i++) {
    int end = i;
    while (end + 1 < count && k[end + 1].group == k[i].group &&
           k[end + 1].row.workers == k[i].row.workers)
      end++;
    int from = q->last > 0 && end - i + 1 > q->last ? end + 1 - q->last : i;
    for (int j = from; j <= end; j++) rows[kept++] = k[j].row;
    i = end;
  }
  free(k);
  *out = rows;
  *n = kept;
  return KILN_OK;
}

/* ---- runs ------------------------------------------------------------------------------------ */

/* A whole number of decimal digits only, at most 2^63 - 1; false otherwise. */
static bool run_number(const char *p, long long *out) {
  if (*p < '0' || *p > '9') return false;
  errno = 0;
  char *end;
  *out = strtoll(p, &end, 10);
  return !*end && errno != ERANGE;
}

static int bad_run_name(const char *spec) {
  return kiln_errorf(KILN_ERR_PARSE,
                     "run '%s': expected a run id (1 to 9223372036854775807, as `kiln ce run` "
                     "prints it), latest or latest~N (N runs before it)",
                     spec);
}

int kiln_ce_history_resolve_run(kiln_ce_history *h, const char *spec, int64_t *run_id) {
  const char *p = spec;
  long long back = -1;
  if (!strncmp(p, "latest", 6)) {
    back = 0;
    if (p[6] == '~' && !run_number(p + 7, &back)) back = -1;
    else if (p[6] && p[6] != '~') back = -1;
    if (back < 0) return bad_run_name(spec);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(ce_history_db(h), "SELECT id FROM runs ORDER BY id DESC LIMIT 1 OFFSET ?",
                           -1, &s, NULL) != SQLITE_OK)
      return query_error(h);
    sqlite3_bind_int64(s, 1, back);
    int step = sqlite3_step(s);
    if (step == SQLITE_ROW) *run_id = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (step == SQLITE_ROW) return KILN_OK;
    if (step != SQLITE_DONE) return query_error(h);
    int64_t runs = 0;
    KILN_TRY(kiln_ce_history_count(h, &runs, NULL));
    return kiln_errorf(KILN_ERR_INVALID, "%s: run '%s': the history has %lld run%s",
                       ce_history_path(h), spec, (long long)runs, runs == 1 ? "" : "s");
  }
  long long id = 0;
  if (!run_number(p, &id) || id <= 0) return bad_run_name(spec);
  *run_id = id;
  return KILN_OK;
}

/* ---- two runs side by side ------------------------------------------------------------------- */

static const kiln_ce_row *find(const kiln_ce_result *r, const kiln_ce_row *like) {
  for (int i = 0; i < r->nrows; i++)
    if (r->rows[i].workers == like->workers && !strcmp(r->rows[i].model, like->model) &&
        !strcmp(r->rows[i].kpi, like->kpi))
      return &r->rows[i];
  return NULL;
}

static void fill_pair(kiln_ce_pair *p, const kiln_ce_row *a, const kiln_ce_row *b) {
  const kiln_ce_row *any = a ? a : b;
  memset(p, 0, sizeof *p);
  snprintf(p->model, sizeof p->model, "%s", any->model);
  p->workers = any->workers;
  snprintf(p->kpi, sizeof p->kpi, "%s", any->kpi);
  snprintf(p->unit, sizeof p->unit, "%s", any->unit);
  p->higher_is_better = any->higher_is_better;
  p->in_a = a != NULL;
  p->in_b = b != NULL;
  p->a = a ? a->value : NAN;
  p->b = b ? b->value : NAN;
  p->verdict_a = a ? a->verdict : KILN_CE_VERDICT_COUNT;
  p->verdict_b = b ? b->verdict : KILN_CE_VERDICT_COUNT;
  p->change = NAN;
  p->better = 0;
  if (isfinite(p->a) && isfinite(p->b)) {
    if (p->a != 0) p->change = (p->b - p->a) / fabs(p->a);
    double up = p->b - p->a;
    p->better = up == 0 ? 0 : (up > 0) == p->higher_is_better ? 1 : -1;
  }
}

int kiln_ce_compare_runs(const kiln_ce_result *a, const kiln_ce_result *b, kiln_ce_pair **out,
                         int *n) {
  *out = NULL;
  *n = 0;
  kiln_ce_pair *p = malloc((size_t)(a->nrows + b->nrows + 1) * sizeof *p);
  if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int k = 0;
  for (int i = 0; i < a->nrows; i++) fill_pair(&p[k++], &a->rows[i], find(b, &a->rows[i]));
  for (int i = 0; i < b->nrows; i++)
    if (!find(a, &b->rows[i])) fill_pair(&p[k++], NULL, &b->rows[i]);
  *out = p;
  *n = k;
  return KILN_OK;
}
