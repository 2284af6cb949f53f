/* CE reports: the terminal table people read first, JSON Lines for machines, and one HTML file
 * with no external assets (CSS and SVG inline) so it can be archived or mailed as it is: a
 * pass/fail grid, the reasons in words and one trend plot per KPI over the history. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ce/internal.h"
#include "kiln/ce.h"

void kiln_ce_format_value(char *buf, size_t n, double v, const char *unit) {
  if (!isfinite(v)) {
    snprintf(buf, n, "-");
    return;
  }
  const char *sp = unit && unit[0] ? " " : "";
  if (fabs(v) >= 1000) snprintf(buf, n, "%.0f%s%s", v, sp, unit ? unit : "");
  else snprintf(buf, n, "%.4g%s%s", v, sp, unit ? unit : "");
}

static void fmt_change(char *buf, size_t n, const kiln_ce_row *row) {
  if (!row->has_baseline || !isfinite(row->change)) snprintf(buf, n, "-");
  else snprintf(buf, n, "%+.1f%%", 100 * row->change);
}

static const char *verdict_colour(kiln_ce_verdict v) {
  switch (v) {
  case KILN_CE_PASS: return "\033[32m";
  case KILN_CE_IMPROVED: return "\033[36m";
  case KILN_CE_NEW: return "\033[34m";
  case KILN_CE_SKIP:
  case KILN_CE_NA: return "\033[2m";
  case KILN_CE_REGRESSION: return "\033[1;33m";
  case KILN_CE_ERROR: return "\033[1;35m";
  default: return "\033[1;31m";
  }
}

char *kiln_ce_report_table(const kiln_ce_result *r, bool colour) {
  kiln_strbuf b = {0};
  int wm = 5, wk = 3;
  for (int i = 0; i < r->nrows; i++) {
    int m = (int)strlen(r->rows[i].model), k = (int)strlen(r->rows[i].kpi);
    if (m > wm) wm = m;
    if (k > wk) wk = k;
  }
  kiln_strbuf_printf(&b, "%s%-*s  %7s  %-*s  %16s  %16s  %8s  %s%s\n", colour ? "\033[1m" : "", wm,
            "model", "workers", wk, "KPI", "value", "baseline", "change", "verdict",
            colour ? "\033[0m" : "");
  bool any_reason = false;
  for (int i = 0; i < r->nrows; i++) {
    const kiln_ce_row *row = &r->rows[i];
    char value[48], base[48], change[24];
    kiln_ce_format_value(value, sizeof value, row->value, row->unit);
    if (row->has_baseline) kiln_ce_format_value(base, sizeof base, row->baseline, row->unit);
    else snprintf(base, sizeof base, "-");
    fmt_change(change, sizeof change, row);
    kiln_strbuf_printf(&b, "%-*s  %7d  %-*s  %16s  %16s  %8s  %s%s%s\n", wm, row->model, row->workers, wk,
              row->kpi, value, base, change, colour ? verdict_colour(row->verdict) : "",
              kiln_ce_verdict_name(row->verdict), colour ? "\033[0m" : "");
    any_reason |= row->reason[0] != '\0';
  }
  if (any_reason) {
    kiln_strbuf_printf(&b, "\n");
    for (int i = 0; i < r->nrows; i++) {
      const kiln_ce_row *row = &r->rows[i];
      if (!row->reason[0]) continue;
      kiln_strbuf_printf(&b, "%s%s%s %s x%d %s: %s\n", colour ? verdict_colour(row->verdict) : "",
                kiln_ce_verdict_name(row->verdict), colour ? "\033[0m" : "", row->model,
                row->workers, row->kpi, row->reason);
    }
  }
  for (int i = 0; i < r->nwarnings; i++) kiln_strbuf_printf(&b, "warning: %s\n", r->warnings[i]);
  if (b.failed) {
    free(b.s);
    return NULL;
  }
  return b.s;
}

/* ---- JSON Lines ----------------------------------------------------------------------------- */

static int append_json_line(kiln_strbuf *b, cJSON *o) {
  char *line = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!line) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  kiln_strbuf_printf(b, "%s\n", line);
  cJSON_free(line);
  return KILN_OK;
}

static void add_real(cJSON *o, const char *name, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(o, name, v);
  else cJSON_AddNullToObject(o, name);
}

int kiln_ce_report_jsonl(const kiln_ce_result *r, const char *path) {
  kiln_strbuf b = {0};
  cJSON *run = cJSON_CreateObject();
  if (!run) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(run, "type", "run");
  cJSON_AddNumberToObject(run, "run_id", (double)r->run_id);
  cJSON_AddStringToObject(run, "suite", r->suite_name);
  cJSON_AddStringToObject(run, "suite_path", r->suite_path);
  cJSON_AddStringToObject(run, "started_at", r->started_at);
  add_real(run, "duration_s", r->duration_s);
  cJSON_AddStringToObject(run, "git_commit", r->git_commit);
  cJSON_AddStringToObject(run, "machine_class", r->machine_class);
  char *mj = kiln_ce_machine_json(&r->machine);
  cJSON *machine = mj ? cJSON_Parse(mj) : NULL;
  free(mj);
  if (machine) cJSON_AddItemToObject(run, "machine", machine);
  cJSON_AddNumberToObject(run, "exit_code", kiln_ce_result_exit_code(r));
  cJSON *warnings = cJSON_AddArrayToObject(run, "warnings");
  for (int i = 0; warnings && i < r->nwarnings; i++)
    cJSON_AddItemToArray(warnings, cJSON_CreateString(r->warnings[i]));
  KILN_TRY(append_json_line(&b, run));
  for (int i = 0; i < r->nrows; i++) {
    const kiln_ce_row *row = &r->rows[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) {
      free(b.s);
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    }
    cJSON_AddStringToObject(o, "type", "kpi");
    cJSON_AddStringToObject(o, "model", row->model);
    cJSON_AddNumberToObject(o, "workers", row->workers);
    cJSON_AddStringToObject(o, "kpi", row->kpi);
    cJSON_AddStringToObject(o, "unit", row->unit);
    add_real(o, "value", row->value);
    add_real(o, "spread", row->spread);
    cJSON *samples = cJSON_AddArrayToObject(o, "samples");
    for (int k = 0; samples && k < row->nsamples; k++)
      cJSON_AddItemToArray(samples, isfinite(row->samples[k]) ? cJSON_CreateNumber(row->samples[k])
                                                              : cJSON_CreateNull());
    add_real(o, "baseline", row->has_baseline ? row->baseline : NAN);
    add_real(o, "change", row->change);
    add_real(o, "tolerance", row->tolerance);
    add_real(o, "busy", row->busy);
    cJSON_AddStringToObject(o, "verdict", kiln_ce_verdict_name(row->verdict));
    cJSON_AddStringToObject(o, "reason", row->reason);
    cJSON_AddNumberToObject(o, "seed", (double)row->seed);
    cJSON_AddNumberToObject(o, "threads", row->threads);
    cJSON_AddNumberToObject(o, "iterations", row->iterations);
    cJSON_AddStringToObject(o, "config_hash", row->config_hash);
    int rc = append_json_line(&b, o);
    if (rc) {
      free(b.s);
      return rc;
    }
  }
  if (b.failed) {
    free(b.s);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  int rc = kiln_write_file_atomic(path, b.s ? b.s : "", b.len);
  free(b.s);
  return rc;
}

/* ---- HTML ------------------------------------------------------------------------------------ */

static const char *verdict_class(kiln_ce_verdict v) {
  switch (v) {
  case KILN_CE_PASS: return "pass";
  case KILN_CE_IMPROVED: return "improved";
  case KILN_CE_NEW: return "new";
  case KILN_CE_SKIP: return "skip";
  case KILN_CE_NA: return "na";
  case KILN_CE_REGRESSION: return "regression";
  case KILN_CE_ERROR: return "error";
  default: return "fail";
  }
}

/* The caption reserves red for regressions and failures: their points are drawn in it over the
 * series' lines. A series in red (or in a colour read as red: tab10's red and brown were the
 * second and sixth colours here) would hide them, so the palette keeps away from it: hues at
 * least 40 degrees from red, or grey. Blue first: most KPIs have a single worker count. */
#define REGRESSION_RED "#d00"
static const char *const series_colours[] = {"#1f77b4", "#2ca02c", "#9467bd", "#e69f00",
                                             "#17becf", "#7f7f7f", "#bcbd22", "#8c6d00"};

/* The distinct values of a string field of the rows, in first-seen order. */
static int distinct(const kiln_ce_result *r, size_t offset, const char **out, int max) {
  int n = 0;
  for (int i = 0; i < r->nrows && n < max; i++) {
    const char *s = (const char *)&r->rows[i] + offset;
    bool seen = false;
    for (int k = 0; k < n && !seen; k++) seen = !strcmp(out[k], s);
    if (!seen) out[n++] = s;
  }
  return n;
}

static const kiln_ce_row *find_row(const kiln_ce_result *r, const char *model, int workers,
                                   const char *kpi) {
  for (int i = 0; i < r->nrows; i++)
    if (!strcmp(r->rows[i].model, model) && r->rows[i].workers == workers &&
        !strcmp(r->rows[i].kpi, kpi))
      return &r->rows[i];
  return NULL;
}

enum { MAX_SERIES = 8, MAX_POINTS = 60 };
_Static_assert(sizeof series_colours / sizeof series_colours[0] >= MAX_SERIES,
               "a colour per series: two series of one plot must not share one");

/* The plots' text is 10 px. SVG text is not measured where it is written, so its width is
 * estimated from its length: 0.65 em a character is at least the advance of the digits, the
 * point and the suffixes in the sans-serif faces browsers fall back to (DejaVu Sans's digits:
 * 0.64 em), so a label given that room is not clipped. */
#define FONT_PX 10.0
static double text_px(const char *text) { return 0.65 * FONT_PX * (double)strlen(text); }

/* A y-axis label: `digits` significant digits, with k, M, G or T for thousands and up (12019.4
 * is "12k" at 3 digits), so that it stays short whatever the KPI's scale; %g's exponent form
 * (1.202e+04) took 9 characters and overflowed the margin. */
static void fmt_axis(char *buf, size_t n, double v, int digits) {
  static const struct {
    double scale;
    const char *suffix;
  } si[] = {{1, ""}, {1e3, "k"}, {1e6, "M"}, {1e9, "G"}, {1e12, "T"}};
  const int nsi = (int)(sizeof si / sizeof si[0]);
  if (v == 0 || !isfinite(v)) {
    snprintf(buf, n, v == 0 ? "0" : "-");
    return;
  }
  int k = 0;
  while (k + 1 < nsi && fabs(v) >= si[k + 1].scale) k++;
  snprintf(buf, n, "%.*g%s", digits, v / si[k].scale, si[k].suffix);
  /* 999.7 at 3 digits rounds to 1e+03: the next suffix's "1k" says it */
  if (strchr(buf, 'e') && fabs(v) >= 1 && k + 1 < nsi)
    snprintf(buf, n, "%.*g%s", digits, v / si[k + 1].scale, si[k + 1].suffix);
  /* tiny values keep the exponent, without its leading zero (1.2e-05 as 1.2e-5) */
  char *e = strstr(buf, "e-0");
  if (!e) e = strstr(buf, "e+0");
  if (e) memmove(e + 2, e + 3, strlen(e + 3) + 1);
}

/* The y labels of a plot from ymin to ymax: as few digits as keep the two apart (from 3 on). */
static void axis_labels(double ymin, double ymax, char *lo, char *hi, size_t n) {
  for (int digits = 3; digits <= 7; digits++) {
    fmt_axis(lo, n, ymin, digits);
    fmt_axis(hi, n, ymax, digits);
    if (strcmp(lo, hi)) return;
  }
}

/* One plot: every worker count of a model's KPI over the history, the baseline dashed. */
static int svg_plot(kiln_strbuf *b, const kiln_ce_result *r, kiln_ce_history *h, const char *model,
                    const char *kpi) {
  int workers[MAX_SERIES], nseries = 0;
  const kiln_ce_row *rows[MAX_SERIES];
  for (int i = 0; i < r->nrows && nseries < MAX_SERIES; i++) {
    const kiln_ce_row *row = &r->rows[i];
    if (strcmp(row->model, model) || strcmp(row->kpi, kpi)) continue;
    workers[nseries] = row->workers;
    rows[nseries++] = row;
  }
  kiln_ce_point *pts[MAX_SERIES] = {0};
  int npts[MAX_SERIES] = {0};
  int rc = KILN_OK;
  for (int s = 0; s < nseries && rc == KILN_OK; s++) {
    if (h)
      rc = kiln_ce_history_series(h, model, workers[s], kpi, r->machine_class, MAX_POINTS, &pts[s],
                                  &npts[s]);
    if (rc == KILN_OK && npts[s] == 0 && isfinite(rows[s]->value)) {
      /* no history (or none yet): this run's value alone */
      free(pts[s]);
      pts[s] = calloc(1, sizeof *pts[s]);
      if (!pts[s]) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      else {
        pts[s][0].run_id = r->run_id;
        pts[s][0].value = rows[s]->value;
        snprintf(pts[s][0].time, sizeof pts[s][0].time, "%s", r->started_at);
        snprintf(pts[s][0].verdict, sizeof pts[s][0].verdict, "%s",
                 kiln_ce_verdict_name(rows[s]->verdict));
        npts[s] = 1;
      }
    }
  }
  /* x: run ids across all series; y: values and baselines */
  int64_t xmin = INT64_MAX, xmax = INT64_MIN;
  double ymin = INFINITY, ymax = -INFINITY;
  for (int s = 0; s < nseries; s++) {
    for (int k = 0; k < npts[s]; k++) {
      if (pts[s][k].run_id < xmin) xmin = pts[s][k].run_id;
      if (pts[s][k].run_id > xmax) xmax = pts[s][k].run_id;
      ymin = fmin(ymin, pts[s][k].value);
      ymax = fmax(ymax, pts[s][k].value);
    }
    if (rows[s]->has_baseline && isfinite(rows[s]->baseline)) {
      ymin = fmin(ymin, rows[s]->baseline);
      ymax = fmax(ymax, rows[s]->baseline);
    }
  }
  /* y labels first: the left margin fits the longer one (with 4 px each side) */
  char ylo[32] = "", yhi[32] = "";
  if (isfinite(ymin)) {
    if (ymax - ymin < 1e-12 * fmax(1, fabs(ymax))) {
      double pad = fabs(ymax) > 0 ? 0.05 * fabs(ymax) : 1;
      ymin -= pad;
      ymax += pad;
    } else {
      double pad = 0.08 * (ymax - ymin);
      ymin -= pad;
      ymax += pad;
    }
    axis_labels(ymin, ymax, ylo, yhi, sizeof ylo);
  }
  const double W = 360, R = 10, T = 10, B = 24;
  const double L = fmax(40, 8 + fmax(text_px(ylo), text_px(yhi)));
  /* The legend follows the first run label under the plot and wraps to rows of its own when
   * the entries do not fit before the last run label. */
  char first_run[32] = "", last_run[32] = "";
  double legend_x[MAX_SERIES] = {0}, legend_row[MAX_SERIES] = {0};
  if (isfinite(ymin)) { /* with no values, no labels and no legend */
    snprintf(first_run, sizeof first_run, "run %lld", (long long)xmin);
    snprintf(last_run, sizeof last_run, "run %lld", (long long)xmax);
    double x = L + text_px(first_run) + 12, right = W - R - text_px(last_run) - 12;
    int row = 0;
    for (int s = 0; s < nseries; s++) {
      char entry[32];
      snprintf(entry, sizeof entry, "%d worker%s", workers[s], workers[s] == 1 ? "" : "s");
      if (x + text_px(entry) > right && x > L) {
        row++;
        x = L;
        right = W - R;
      }
      legend_x[s] = x;
      legend_row[s] = row;
      x += text_px(entry) + 12;
    }
  }
  const double H = 150 + 12 * (nseries ? legend_row[nseries - 1] : 0);
  kiln_strbuf_printf(b, "<figure><figcaption>");
  ce_html(b, model);
  kiln_strbuf_printf(b, " &middot; ");
  ce_html(b, kpi);
  kiln_strbuf_printf(b, "</figcaption>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n",
            W, H, W, H);
  /* the plot area keeps its 150 px layout; legend rows below it add to the height */
  const double PB = 150 - B; /* the plot area's bottom */
  kiln_strbuf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#fafafa\" "
               "stroke=\"#ccc\"/>\n",
            L, T, W - L - R, PB - T);
  if (!isfinite(ymin)) {
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#888\">no values</text>\n",
              L + 10, (T + PB) / 2);
  } else {
    double xspan = xmax > xmin ? (double)(xmax - xmin) : 1;
#define PX(id) (L + (xmax > xmin ? ((double)((id) - xmin)) / xspan : 0.5) * (W - L - R))
#define PY(v) (T + (1 - ((v) - ymin) / (ymax - ymin)) * (PB - T))
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
              L - 4, T + 8, yhi);
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
              L - 4, PB, ylo);
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">%s</text>\n", L, PB + 16,
              first_run);
    kiln_strbuf_printf(b,
              "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
              W - R, PB + 16, last_run);
    for (int s = 0; s < nseries; s++) {
      const char *c = series_colours[s];
      if (rows[s]->has_baseline && isfinite(rows[s]->baseline))
        kiln_strbuf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                     "stroke-dasharray=\"4 3\"><title>baseline %.6g (%d worker%s)</title></line>\n",
                  L, W - R, PY(rows[s]->baseline), PY(rows[s]->baseline), c, rows[s]->baseline,
                  workers[s], workers[s] == 1 ? "" : "s");
      if (npts[s] > 1) {
        kiln_strbuf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
        for (int k = 0; k < npts[s]; k++)
          kiln_strbuf_printf(b, "%s%.1f,%.1f", k ? " " : "", PX(pts[s][k].run_id), PY(pts[s][k].value));
        kiln_strbuf_printf(b, "\"/>\n");
      }
      for (int k = 0; k < npts[s]; k++) {
        bool bad = !strcmp(pts[s][k].verdict, "regression") || !strcmp(pts[s][k].verdict, "FAIL");
        kiln_strbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>run %lld %s: "
                     "%.6g (%s, %d worker%s)</title></circle>\n",
                  PX(pts[s][k].run_id), PY(pts[s][k].value), bad ? REGRESSION_RED : c,
                  (long long)pts[s][k].run_id, pts[s][k].time, pts[s][k].value, pts[s][k].verdict,
                  workers[s], workers[s] == 1 ? "" : "s");
      }
      kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" fill=\"%s\">%d worker%s</text>\n",
                legend_x[s], PB + 16 + 12 * legend_row[s], c, workers[s], workers[s] == 1 ? "" : "s");
    }
#undef PX
#undef PY
  }
  kiln_strbuf_printf(b, "</svg></figure>\n");
  for (int s = 0; s < nseries; s++) free(pts[s]);
  return rc;
}

int kiln_ce_report_html(const kiln_ce_result *r, kiln_ce_history *h, const char *path) {
  kiln_strbuf b = {0};
  int code = kiln_ce_result_exit_code(r);
  static const char *const outcome[] = {"pass", "regression", "absolute failure",
                                        "harness could not run everything"};
  kiln_strbuf_printf(&b, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                "<title>kiln CE: ");
  ce_html(&b, r->suite_name);
  kiln_strbuf_printf(&b, " (run %lld)</title>\n", (long long)r->run_id);
  kiln_strbuf_printf(&b,
            "<style>body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
            "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
            "padding:.3em .6em;text-align:right}th{background:#eee}td.name{text-align:left}"
            ".pass{background:#dff3df}.improved{background:#d8eefa}.new{background:#eef}"
            ".skip,.na{background:#f3f3f3;color:#777}.regression{background:#ffe9b3}"
            ".error{background:#f2d7f2}.fail{background:#f8c8c8;font-weight:bold}"
            "small{color:#555}figure{display:inline-block;margin:.5em 1em .5em 0}"
            "figcaption{font-weight:bold}.outcome{font-size:1.2em}</style>\n</head><body>\n");
  kiln_strbuf_printf(&b, "<h1>kiln CE: ");
  ce_html(&b, r->suite_name);
  kiln_strbuf_printf(&b, "</h1>\n<p class=\"outcome %s\">Outcome: <b>%s</b> (exit code %d)</p>\n",
            code == 0 ? "pass" : code == 1 ? "regression" : code == 2 ? "fail" : "error",
            outcome[code >= 0 && code <= 3 ? code : 3], code);
  kiln_strbuf_printf(&b, "<p>Run %lld, started %s, %.0f s; commit <code>", (long long)r->run_id,
            r->started_at, isfinite(r->duration_s) ? r->duration_s : 0);
  ce_html(&b, r->git_commit);
  kiln_strbuf_printf(&b, "</code>; machine class <code>");
  ce_html(&b, r->machine_class);
  kiln_strbuf_printf(&b, "</code>");
  if (r->machine.cores) {
    char desc[700];
    snprintf(desc, sizeof desc, " (%s, %d cores, %.1f GiB, %s, %s)", r->machine.cpu,
             r->machine.cores, r->machine.mem_gib, r->machine.compiler, r->machine.blas);
    ce_html(&b, desc);
  }
  kiln_strbuf_printf(&b, "; suite <code>");
  ce_html(&b, r->suite_path);
  kiln_strbuf_printf(&b, "</code>.</p>\n");

  /* The grid: a row per model and worker count, a column per KPI. */
  const char *kpis[64];
  int nk = distinct(r, offsetof(kiln_ce_row, kpi), kpis, 64);
  const char *models[256];
  int nm = distinct(r, offsetof(kiln_ce_row, model), models, 256);
  kiln_strbuf_printf(&b, "<h2>Results</h2>\n<table class=\"grid\"><tr><th>model</th><th>workers</th>");
  for (int k = 0; k < nk; k++) {
    kiln_strbuf_printf(&b, "<th>");
    ce_html(&b, kpis[k]);
    kiln_strbuf_printf(&b, "</th>");
  }
  kiln_strbuf_printf(&b, "</tr>\n");
  for (int m = 0; m < nm; m++) {
    int ws[64], nw = 0;
    for (int i = 0; i < r->nrows && nw < 64; i++) {
      if (strcmp(r->rows[i].model, models[m])) continue;
      bool seen = false;
      for (int k = 0; k < nw && !seen; k++) seen = ws[k] == r->rows[i].workers;
      if (!seen) ws[nw++] = r->rows[i].workers;
    }
    for (int w = 0; w < nw; w++) {
      kiln_strbuf_printf(&b, "<tr><td class=\"name\">");
      ce_html(&b, models[m]);
      kiln_strbuf_printf(&b, "</td><td>%d</td>", ws[w]);
      for (int k = 0; k < nk; k++) {
        const kiln_ce_row *row = find_row(r, models[m], ws[w], kpis[k]);
        if (!row) {
          kiln_strbuf_printf(&b, "<td></td>");
          continue;
        }
        char value[48], base[48], change[24];
        kiln_ce_format_value(value, sizeof value, row->value, row->unit);
        kiln_ce_format_value(base, sizeof base, row->baseline, row->unit);
        fmt_change(change, sizeof change, row);
        kiln_strbuf_printf(&b, "<td class=\"%s\" title=\"", verdict_class(row->verdict));
        ce_html(&b, row->reason);
        kiln_strbuf_printf(&b, "\">%s<br><small>%s", value, kiln_ce_verdict_name(row->verdict));
        if (row->has_baseline) kiln_strbuf_printf(&b, " &middot; base %s (%s)", base, change);
        kiln_strbuf_printf(&b, "</small></td>");
      }
      kiln_strbuf_printf(&b, "</tr>\n");
    }
  }
  kiln_strbuf_printf(&b, "</table>\n");

  bool any = false;
  for (int i = 0; i < r->nrows; i++) {
    const kiln_ce_row *row = &r->rows[i];
    if (!row->reason[0]) continue;
    if (!any) kiln_strbuf_printf(&b, "<h2>Reasons</h2>\n<ul>\n");
    any = true;
    kiln_strbuf_printf(&b, "<li class=\"%s\"><b>%s</b> ", verdict_class(row->verdict),
              kiln_ce_verdict_name(row->verdict));
    ce_html(&b, row->model);
    kiln_strbuf_printf(&b, " x%d ", row->workers);
    ce_html(&b, row->kpi);
    kiln_strbuf_printf(&b, ": ");
    ce_html(&b, row->reason);
    kiln_strbuf_printf(&b, "</li>\n");
  }
  if (any) kiln_strbuf_printf(&b, "</ul>\n");
  if (r->nwarnings) {
    kiln_strbuf_printf(&b, "<h2>Warnings</h2>\n<ul>\n");
    for (int i = 0; i < r->nwarnings; i++) {
      kiln_strbuf_printf(&b, "<li>");
      ce_html(&b, r->warnings[i]);
      kiln_strbuf_printf(&b, "</li>\n");
    }
    kiln_strbuf_printf(&b, "</ul>\n");
  }

  kiln_strbuf_printf(&b, "<h2>Trends</h2>\n<p><small>History on machine class ");
  ce_html(&b, r->machine_class);
  kiln_strbuf_printf(&b, "; dashed: the baseline; red points: regressions and failures.</small></p>\n");
  int rc = KILN_OK;
  for (int m = 0; m < nm && rc == KILN_OK; m++)
    for (int k = 0; k < nk && rc == KILN_OK; k++) {
      if (!strcmp(kpis[k], "run")) continue;
      bool has = false;
      for (int i = 0; i < r->nrows && !has; i++)
        has = !strcmp(r->rows[i].model, models[m]) && !strcmp(r->rows[i].kpi, kpis[k]);
      if (has) rc = svg_plot(&b, r, h, models[m], kpis[k]);
    }
  kiln_strbuf_printf(&b, "<p><small>Written by <code>kiln ce run</code>; see docs/ce.md.</small></p>\n"
                "</body></html>\n");
  if (rc == KILN_OK && b.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (rc == KILN_OK) rc = kiln_write_file_atomic(path, b.s, b.len);
  free(b.s);
  return rc;
}
