/* CE history in SQLite: one `runs` row per suite run (time, commit, machine, suite) and one `kpis`
 * row per model, worker count and KPI (value, raw samples, baseline, verdict, seed, config
 * hash); the view `kpi_history` joins them into one row per run and KPI. WAL mode and one
 * transaction per run mean a run killed half-way leaves the database exactly as the last
 * finished run left it, and readers (the HTML report, people with sqlite3) never block the
 * writer. */
#include <cJSON.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ce/internal.h"
#include "kiln/ce.h"

struct kiln_ce_history {
  sqlite3 *db;
  char path[4096];
  bool in_tx;
};

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS runs("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  started_at TEXT NOT NULL,"
    "  suite TEXT NOT NULL,"
    "  suite_path TEXT NOT NULL,"
    "  git_commit TEXT,"
    "  machine_class TEXT NOT NULL,"
    "  machine TEXT,"       /* JSON: cpu, cores, mem_gib, compiler, blas, threads, os */
    "  report_dir TEXT,"
    "  duration_s REAL,"
    "  exit_code INTEGER);"
    "CREATE TABLE IF NOT EXISTS kpis("
    "  run_id INTEGER NOT NULL REFERENCES runs(id),"
    "  model TEXT NOT NULL,"
    "  workers INTEGER NOT NULL,"
    "  kpi TEXT NOT NULL,"
    "  unit TEXT,"
    "  higher_is_better INTEGER,"
    "  value REAL,"
    "  spread REAL,"
    "  samples TEXT,"       /* JSON array, one value per repeat */
    "  baseline REAL,"
    "  baseline_spread REAL,"
    "  change REAL,"
    "  tolerance REAL,"
    "  verdict TEXT NOT NULL,"
    "  reason TEXT,"
    "  seed INTEGER,"
    "  threads INTEGER,"
    "  iterations INTEGER,"
    "  config_hash TEXT);"
    "CREATE INDEX IF NOT EXISTS kpis_by_series ON kpis(model, workers, kpi);"
    "CREATE INDEX IF NOT EXISTS kpis_by_run ON kpis(run_id);"
    "CREATE INDEX IF NOT EXISTS runs_by_suite ON runs(suite_path);"
    "CREATE VIEW IF NOT EXISTS kpi_history AS"
    "  SELECT r.started_at AS time, r.git_commit, r.machine_class, r.machine, r.suite, k.*"
    "  FROM kpis k JOIN runs r ON r.id = k.run_id;"
    "PRAGMA user_version = 1;";

sqlite3 *ce_history_db(kiln_ce_history *h) { return h->db; }
const char *ce_history_path(const kiln_ce_history *h) { return h->path; }

static int db_error(kiln_ce_history *h, const char *what) {
  return kiln_errorf(KILN_ERR_IO, "%s: %s: %s", h->path, what, sqlite3_errmsg(h->db));
}

int kiln_ce_history_default_path(const kiln_config *cfg, char *buf, size_t n) {
  if (!cfg) cfg = kiln_config_defaults();
  if (!cfg->ce_db[0])
    return kiln_errorf(KILN_ERR_INVALID, "neither XDG_DATA_HOME nor HOME is set: give --db");
  int w = snprintf(buf, n, "%s", cfg->ce_db);
  if (w < 0 || w >= (int)n) return kiln_errorf(KILN_ERR_INVALID, "history path too long");
  return KILN_OK;
}

int kiln_ce_history_open(const char *path, kiln_ce_history **out) {
  *out = NULL;
  kiln_ce_history *h = calloc(1, sizeof *h);
  if (!h) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  snprintf(h->path, sizeof h->path, "%s", path);
  char dir[4096];
  ce_dirname(path, dir, sizeof dir);
  int rc = kiln_mkdir_p(dir);
  if (rc) {
    free(h);
    return rc;
  }
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  if (sqlite3_open_v2(path, &h->db, flags, NULL) != SQLITE_OK) {
    rc = db_error(h, "cannot open");
    kiln_ce_history_close(h);
    return rc;
  }
  sqlite3_busy_timeout(h->db, 10000);
  char *err = NULL;
  if (sqlite3_exec(h->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL,
                   &err) != SQLITE_OK ||
      sqlite3_exec(h->db, schema, NULL, NULL, &err) != SQLITE_OK) {
    rc = kiln_errorf(KILN_ERR_IO, "%s: not a usable CE history: %s", path, err ? err : "?");
    sqlite3_free(err);
    kiln_ce_history_close(h);
    return rc;
  }
  *out = h;
  return KILN_OK;
}

int kiln_ce_history_open_existing(const char *path, kiln_ce_history **out) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0)
    return kiln_errorf(KILN_ERR_IO,
                       "%s: no CE history there (`kiln ce run` writes it; --db F reads another)",
                       path);
  if (!S_ISREG(st.st_mode))
    return kiln_errorf(KILN_ERR_IO, "%s: not a CE history (not a regular file)", path);
  kiln_ce_history *h = calloc(1, sizeof *h);
  if (!h) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  snprintf(h->path, sizeof h->path, "%s", path);
  /* Read-only: a file that is not a history stays exactly as it was (no tables created in it,
   * no journal mode changed). */
  if (sqlite3_open_v2(path, &h->db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    int rc = db_error(h, "cannot open");
    kiln_ce_history_close(h);
    return rc;
  }
  sqlite3_busy_timeout(h->db, 10000);
  sqlite3_stmt *s = NULL;
  int tables = -1;
  if (sqlite3_prepare_v2(h->db,
                         "SELECT count(*) FROM sqlite_master WHERE (type = 'table' AND name IN "
                         "('runs', 'kpis')) OR (type = 'view' AND name = 'kpi_history')",
                         -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    tables = sqlite3_column_int(s, 0);
  const char *why = tables < 0 ? sqlite3_errmsg(h->db) : NULL;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", why ? why : "");
  sqlite3_finalize(s);
  if (tables != 3) {
    int rc = tables < 0 ? kiln_errorf(KILN_ERR_IO, "%s: not a CE history: %s", path, msg)
                        : kiln_errorf(KILN_ERR_IO,
                                      "%s: not a CE history (it has no runs and kpis tables of "
                                      "kiln ce)",
                                      path);
    kiln_ce_history_close(h);
    return rc;
  }
  *out = h;
  return KILN_OK;
}

void kiln_ce_history_close(kiln_ce_history *h) {
  if (!h) return;
  if (h->in_tx) sqlite3_exec(h->db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(h->db);
  free(h);
}

static void bind_real(sqlite3_stmt *s, int i, double v) {
  if (isfinite(v)) sqlite3_bind_double(s, i, v);
  else sqlite3_bind_null(s, i);
}

double ce_column_real(sqlite3_stmt *s, int i) {
  return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

void ce_column_text(sqlite3_stmt *s, int i, char *buf, size_t n) {
  const unsigned char *t = sqlite3_column_text(s, i);
  snprintf(buf, n, "%s", t ? (const char *)t : "");
}

int kiln_ce_history_begin(kiln_ce_history *h, kiln_ce_result *r) {
  if (h->in_tx)
    return kiln_errorf(KILN_ERR_INTERNAL, "%s: a run is already being recorded", h->path);
  /* IMMEDIATE takes the write lock now, so a second writer waits here, not half-way. */
  if (sqlite3_exec(h->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return db_error(h, "cannot begin");
  h->in_tx = true;
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(h->db,
                         "INSERT INTO runs(started_at, suite, suite_path, git_commit, "
                         "machine_class, machine, report_dir, duration_s, exit_code) "
                         "VALUES(?,?,?,?,?,?,?,?,?)",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "insert run");
  char *machine = kiln_ce_machine_json(&r->machine);
  sqlite3_bind_text(s, 1, r->started_at, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, r->suite_name, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 3, r->suite_path, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 4, r->git_commit, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 5, r->machine_class, -1, SQLITE_TRANSIENT);
  if (machine) sqlite3_bind_text(s, 6, machine, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 7, r->report_dir, -1, SQLITE_TRANSIENT);
  bind_real(s, 8, r->duration_s);
  sqlite3_bind_int(s, 9, kiln_ce_result_exit_code(r));
  int step = sqlite3_step(s);
  sqlite3_finalize(s);
  free(machine);
  if (step != SQLITE_DONE) return db_error(h, "insert run");
  r->run_id = sqlite3_last_insert_rowid(h->db);
  return KILN_OK;
}

static char *samples_json(const kiln_ce_row *row) {
  size_t n = 32 + (size_t)row->nsamples * 26;
  char *out = malloc(n);
  if (!out) return NULL;
  size_t k = (size_t)snprintf(out, n, "[");
  for (int i = 0; i < row->nsamples; i++) {
    if (isfinite(row->samples[i]))
      k += (size_t)snprintf(out + k, n - k, "%s%.12g", i ? "," : "", row->samples[i]);
    else
      k += (size_t)snprintf(out + k, n - k, "%snull", i ? "," : "");
  }
  snprintf(out + k, n - k, "]");
  return out;
}

int kiln_ce_history_add_row(kiln_ce_history *h, const kiln_ce_result *r, const kiln_ce_row *row) {
  if (!h->in_tx || r->run_id <= 0)
    return kiln_errorf(KILN_ERR_INTERNAL, "%s: add_row outside a run", h->path);
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(h->db,
                         "INSERT INTO kpis(run_id, model, workers, kpi, unit, higher_is_better, "
                         "value, spread, samples, baseline, baseline_spread, change, tolerance, "
                         "verdict, reason, seed, threads, iterations, config_hash) "
                         "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "insert KPI");
  char *samples = samples_json(row);
  sqlite3_bind_int64(s, 1, r->run_id);
  sqlite3_bind_text(s, 2, row->model, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 3, row->workers);
  sqlite3_bind_text(s, 4, row->kpi, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 5, row->unit, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 6, row->higher_is_better);
  bind_real(s, 7, row->value);
  bind_real(s, 8, row->spread);
  if (samples) sqlite3_bind_text(s, 9, samples, -1, SQLITE_TRANSIENT);
  bind_real(s, 10, row->has_baseline ? row->baseline : NAN);
  bind_real(s, 11, row->has_baseline ? row->baseline_spread : NAN);
  bind_real(s, 12, row->change);
  bind_real(s, 13, row->tolerance);
  sqlite3_bind_text(s, 14, kiln_ce_verdict_name(row->verdict), -1, SQLITE_STATIC);
  sqlite3_bind_text(s, 15, row->reason, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 16, row->seed);
  sqlite3_bind_int(s, 17, row->threads);
  sqlite3_bind_int(s, 18, row->iterations);
  sqlite3_bind_text(s, 19, row->config_hash, -1, SQLITE_TRANSIENT);
  int step = sqlite3_step(s);
  sqlite3_finalize(s);
  free(samples);
  if (step != SQLITE_DONE) return db_error(h, "insert KPI");
  return KILN_OK;
}

int kiln_ce_history_commit(kiln_ce_history *h) {
  if (!h->in_tx) return kiln_errorf(KILN_ERR_INTERNAL, "%s: commit outside a run", h->path);
  if (sqlite3_exec(h->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) return db_error(h, "commit");
  h->in_tx = false;
  return KILN_OK;
}

int kiln_ce_history_record(kiln_ce_history *h, kiln_ce_result *r) {
  int rc = kiln_ce_history_begin(h, r);
  for (int i = 0; rc == KILN_OK && i < r->nrows; i++)
    rc = kiln_ce_history_add_row(h, r, &r->rows[i]);
  if (rc == KILN_OK) return kiln_ce_history_commit(h);
  if (h->in_tx) sqlite3_exec(h->db, "ROLLBACK", NULL, NULL, NULL);
  h->in_tx = false;
  r->run_id = 0;
  return rc;
}

int kiln_ce_history_last_run(kiln_ce_history *h, const char *suite_path, int64_t *run_id) {
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(h->db, "SELECT id FROM runs WHERE suite_path = ? ORDER BY id DESC LIMIT 1",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "query");
  sqlite3_bind_text(s, 1, suite_path, -1, SQLITE_TRANSIENT);
  int step = sqlite3_step(s);
  if (step == SQLITE_ROW) *run_id = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  if (step == SQLITE_ROW) return KILN_OK;
  if (step != SQLITE_DONE) return db_error(h, "query");
  return kiln_errorf(KILN_ERR_INVALID, "%s: no run of %s recorded", h->path, suite_path);
}

static void parse_samples(const char *json, kiln_ce_row *row) {
  row->nsamples = 0;
  cJSON *a = json ? cJSON_Parse(json) : NULL;
  const cJSON *e;
  cJSON_ArrayForEach(e, a) {
    if (row->nsamples == KILN_CE_MAX_SAMPLES) break;
    row->samples[row->nsamples++] = cJSON_IsNumber(e) ? e->valuedouble : NAN;
  }
  cJSON_Delete(a);
}

static kiln_ce_verdict verdict_by_name(const char *name) {
  for (int v = 0; v < KILN_CE_VERDICT_COUNT; v++)
    if (!strcmp(kiln_ce_verdict_name(v), name)) return v;
  return KILN_CE_ERROR;
}

int kiln_ce_history_load_run(kiln_ce_history *h, int64_t run_id, kiln_ce_result *out) {
  memset(out, 0, sizeof *out);
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(h->db,
                         "SELECT started_at, suite, suite_path, git_commit, machine_class, "
                         "report_dir, duration_s FROM runs WHERE id = ?",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "query");
  sqlite3_bind_int64(s, 1, run_id);
  int step = sqlite3_step(s);
  if (step == SQLITE_ROW) {
    out->run_id = run_id;
    ce_column_text(s, 0, out->started_at, sizeof out->started_at);
    ce_column_text(s, 1, out->suite_name, sizeof out->suite_name);
    ce_column_text(s, 2, out->suite_path, sizeof out->suite_path);
    ce_column_text(s, 3, out->git_commit, sizeof out->git_commit);
    ce_column_text(s, 4, out->machine_class, sizeof out->machine_class);
    ce_column_text(s, 5, out->report_dir, sizeof out->report_dir);
    out->duration_s = ce_column_real(s, 6);
  }
  sqlite3_finalize(s);
  if (step == SQLITE_DONE)
    return kiln_errorf(KILN_ERR_INVALID, "%s: no run %lld", h->path, (long long)run_id);
  if (step != SQLITE_ROW) return db_error(h, "query");

  if (sqlite3_prepare_v2(h->db,
                         "SELECT model, workers, kpi, unit, higher_is_better, value, spread, "
                         "samples, baseline, baseline_spread, change, tolerance, verdict, reason, "
                         "seed, threads, iterations, config_hash FROM kpis WHERE run_id = ? "
                         "ORDER BY rowid",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "query");
  sqlite3_bind_int64(s, 1, run_id);
  int rc = KILN_OK;
  while (rc == KILN_OK && (step = sqlite3_step(s)) == SQLITE_ROW) {
    kiln_ce_row row;
    memset(&row, 0, sizeof row);
    ce_column_text(s, 0, row.model, sizeof row.model);
    row.workers = sqlite3_column_int(s, 1);
    ce_column_text(s, 2, row.kpi, sizeof row.kpi);
    ce_column_text(s, 3, row.unit, sizeof row.unit);
    row.higher_is_better = sqlite3_column_int(s, 4) != 0;
    row.value = ce_column_real(s, 5);
    row.spread = ce_column_real(s, 6);
    row.busy = NAN; /* not kept in the history */
    parse_samples((const char *)sqlite3_column_text(s, 7), &row);
    row.baseline = ce_column_real(s, 8);
    row.has_baseline = isfinite(row.baseline);
    row.baseline_spread = ce_column_real(s, 9);
    row.change = ce_column_real(s, 10);
    row.tolerance = ce_column_real(s, 11);
    char verdict[32];
    ce_column_text(s, 12, verdict, sizeof verdict);
    row.verdict = verdict_by_name(verdict);
    ce_column_text(s, 13, row.reason, sizeof row.reason);
    row.seed = sqlite3_column_int64(s, 14);
    row.threads = sqlite3_column_int(s, 15);
    row.iterations = sqlite3_column_int(s, 16);
    ce_column_text(s, 17, row.config_hash, sizeof row.config_hash);
    rc = kiln_ce_result_add_row(out, &row);
  }
  sqlite3_finalize(s);
  if (rc == KILN_OK && step != SQLITE_DONE) rc = db_error(h, "query");
  if (rc) kiln_ce_result_free(out);
  return rc;
}

int kiln_ce_history_count(kiln_ce_history *h, int64_t *runs, int64_t *rows) {
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(h->db, "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM kpis)",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "query");
  int step = sqlite3_step(s);
  if (step == SQLITE_ROW) {
    if (runs) *runs = sqlite3_column_int64(s, 0);
    if (rows) *rows = sqlite3_column_int64(s, 1);
  }
  sqlite3_finalize(s);
  return step == SQLITE_ROW ? KILN_OK : db_error(h, "query");
}

int kiln_ce_history_series(kiln_ce_history *h, const char *model, int workers, const char *kpi,
                           const char *machine_class, int max_points, kiln_ce_point **out,
                           int *n) {
  *out = NULL;
  *n = 0;
  if (max_points <= 0) return KILN_OK;
  sqlite3_stmt *s;
  if (sqlite3_prepare_v2(h->db,
                         "SELECT k.run_id, r.started_at, k.value, k.verdict, r.git_commit "
                         "FROM kpis k JOIN runs r ON r.id = k.run_id "
                         "WHERE k.model = ? AND k.workers = ? "
                         "AND k.kpi = ? AND r.machine_class = ? AND k.value IS NOT NULL "
                         "ORDER BY k.run_id DESC LIMIT ?",
                         -1, &s, NULL) != SQLITE_OK)
    return db_error(h, "query");
  sqlite3_bind_text(s, 1, model, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 2, workers);
  sqlite3_bind_text(s, 3, kpi, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 4, machine_class, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 5, max_points);
  kiln_ce_point *p = calloc((size_t)max_points, sizeof *p);
  if (!p) {
    sqlite3_finalize(s);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  int count = 0, step;
  while (count < max_points && (step = sqlite3_step(s)) == SQLITE_ROW) {
    p[count].run_id = sqlite3_column_int64(s, 0);
    ce_column_text(s, 1, p[count].time, sizeof p[count].time);
    p[count].value = ce_column_real(s, 2);
    ce_column_text(s, 3, p[count].verdict, sizeof p[count].verdict);
    ce_column_text(s, 4, p[count].git_commit, sizeof p[count].git_commit);
    count++;
  }
  sqlite3_finalize(s);
  /* newest first from the query; oldest first for plotting */
  for (int i = 0; i < count / 2; i++) {
    kiln_ce_point t = p[i];
    p[i] = p[count - 1 - i];
    p[count - 1 - i] = t;
  }
  *out = p;
  *n = count;
  return KILN_OK;
}
