/* CE reports: the terminal table people read first, JSON Lines for machines, and one HTML file
 * with no external assets (CSS and SVG inline) so it can be archived or mailed as it is: a
 * pass/fail grid, the reasons in words and one trend plot per KPI over the history. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
  char machine[700] = "";
  if (r->machine.cores) kiln_ce_machine_summary(&r->machine, machine, sizeof machine);
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
  /* timings are judged against baselines of this class only */
  kiln_strbuf_printf(&b, "\nmachine class %s%s%s%s\n", r->machine_class, machine[0] ? " (" : "",
                     machine, machine[0] ? ")" : "");
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
  int rc = ce_utf8_repair(&b, "\\ufffd");
  if (rc == KILN_OK) rc = kiln_write_file_atomic(path, b.s ? b.s : "", b.len);
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

enum { MAX_SERIES = CE_NCOLOURS, MAX_POINTS = 60 };

/* A commit as the x axis shows it: the hash of `git describe` (after its "-g"), 7 characters,
 * "+" when the tree was dirty. */
static void short_commit(const char *commit, char *buf, size_t n) {
  const char *g = strstr(commit, "-g"), *h = commit;
  for (; g; g = strstr(g + 2, "-g")) h = g + 2;
  size_t k = 0;
  while (k < 7 && h[k] && h[k] != '-') k++;
  snprintf(buf, n, "%.*s%s", (int)k, h, strstr(commit, "-dirty") ? "+" : "");
}

/* One run on a trend plot's x axis: its place, date ("12-01") and short commit. */
typedef struct {
  int64_t id;
  char date[8], commit[16];
  bool shown;
} run_tick;

static int cmp_tick(const void *a, const void *b) {
  int64_t x = ((const run_tick *)a)->id, y = ((const run_tick *)b)->id;
  return (x > y) - (x < y);
}

/* Which runs get their date and commit under the axis: from the left, each whose two lines
 * clear the previous label by 6 px; the newest always (the label before it gives way). */
static void thin_ticks(run_tick *t, int n, const double *cx, double w) {
  int last = -1;
  for (int i = 0; i < n; i++) {
    bool last_one = i == n - 1;
    while (last_one && last >= 0 && cx[last] + w / 2 + 6 > cx[i] - w / 2) {
      t[last].shown = false;
      last = -1;
      for (int k = i - 1; k >= 0 && last < 0; k--)
        if (t[k].shown) last = k;
    }
    if (last < 0 || cx[last] + w / 2 + 6 <= cx[i] - w / 2) {
      t[i].shown = true;
      last = i;
    }
  }
}

/* One plot: every worker count of a model's KPI over the history, the baseline dashed; each run
 * labelled by date and commit under the axis, every point with a tooltip (value, verdict,
 * commit, date), a legend below. */
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
        snprintf(pts[s][0].git_commit, sizeof pts[s][0].git_commit, "%s", r->git_commit);
        snprintf(pts[s][0].verdict, sizeof pts[s][0].verdict, "%s",
                 kiln_ce_verdict_name(rows[s]->verdict));
        npts[s] = 1;
      }
    }
  }
  /* x: the runs of all series; y: values and baselines */
  run_tick ticks[MAX_SERIES * MAX_POINTS];
  int nticks = 0;
  double ymin = INFINITY, ymax = -INFINITY;
  bool any_bad = false, any_baseline = false;
  for (int s = 0; s < nseries; s++) {
    for (int k = 0; k < npts[s]; k++) {
      const kiln_ce_point *p = &pts[s][k];
      int t = 0;
      while (t < nticks && ticks[t].id != p->run_id) t++;
      if (t == nticks) {
        run_tick *nt = &ticks[nticks++];
        nt->id = p->run_id;
        nt->shown = false;
        snprintf(nt->date, sizeof nt->date, "%.5s", strlen(p->time) >= 10 ? p->time + 5 : "?");
        short_commit(p->git_commit, nt->commit, sizeof nt->commit);
      }
      ymin = fmin(ymin, p->value);
      ymax = fmax(ymax, p->value);
      any_bad |= !strcmp(p->verdict, "regression") || !strcmp(p->verdict, "FAIL");
    }
    if (rows[s]->has_baseline && isfinite(rows[s]->baseline)) {
      ymin = fmin(ymin, rows[s]->baseline);
      ymax = fmax(ymax, rows[s]->baseline);
      any_baseline = true;
    }
  }
  if (nticks > 1) qsort(ticks, (size_t)nticks, sizeof *ticks, cmp_tick);
  /* y labels first: the left margin fits the longer one (with 4 px each side) */
  char ylo[32] = "", yhi[32] = "";
  if (isfinite(ymin)) {
    ce_pad_range(&ymin, &ymax);
    ce_axis_labels(ymin, ymax, ylo, yhi, sizeof ylo);
  }
  const double W = 360, R = 10, T = 10, PB = 126; /* PB: the plot area's bottom */
  const double L = fmax(40, 8 + fmax(ce_text_px(ylo), ce_text_px(yhi)));
  /* Under the axis: the runs' dates and commits (two lines), then the legend's rows. */
  const char *entries[MAX_SERIES + 2];
  char names[MAX_SERIES][32];
  int nentries = 0;
  for (int s = 0; s < nseries; s++) {
    snprintf(names[s], sizeof names[s], "%d worker%s", workers[s], workers[s] == 1 ? "" : "s");
    entries[nentries++] = names[s];
  }
  if (any_baseline) entries[nentries++] = "baseline";
  if (any_bad) entries[nentries++] = "regression";
  double legend_x[MAX_SERIES + 2];
  int legend_row[MAX_SERIES + 2];
  int nrows = ce_legend_layout(entries, nentries, 16, L, W - R, L, W - R, legend_x, legend_row);
  const double LY = PB + 40; /* the legend's first row */
  const double H = LY + 12 * (nrows > 0 ? nrows - 1 : 0) + 6;
  kiln_strbuf_printf(b, "<figure><figcaption>");
  ce_html(b, model);
  kiln_strbuf_printf(b, " &middot; ");
  ce_html(b, kpi);
  kiln_strbuf_printf(b, "</figcaption>\n<svg class=\"trend\" xmlns=\"http://www.w3.org/2000/svg\" "
                        "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n",
                     W, H, W, H);
  kiln_strbuf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#fafafa\" "
               "stroke=\"#ccc\"/>\n",
            L, T, W - L - R, PB - T);
  if (!isfinite(ymin)) {
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#888\">no values</text>\n",
              L + 10, (T + PB) / 2);
  } else {
    /* runs evenly spaced, oldest left */
#define PX(t) (L + (nticks > 1 ? (double)(t) / (nticks - 1) : 0.5) * (W - L - R))
#define PY(v) (T + (1 - ((v) - ymin) / (ymax - ymin)) * (PB - T))
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
              L - 4, T + 8, yhi);
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
              L - 4, PB, ylo);
    double cx[MAX_SERIES * MAX_POINTS], tw = ce_text_px("12-01");
    for (int t = 0; t < nticks; t++) tw = fmax(tw, ce_text_px(ticks[t].commit));
    for (int t = 0; t < nticks; t++)
      cx[t] = fmin(fmax(PX(t), L + tw / 2), W - R - tw / 2);
    thin_ticks(ticks, nticks, cx, tw);
    for (int t = 0; t < nticks; t++) {
      if (!ticks[t].shown) continue;
      kiln_strbuf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" "
                            "stroke=\"#999999\"/>\n",
                         PX(t), PX(t), PB, PB + 3);
      kiln_strbuf_printf(b, "<text class=\"run\" x=\"%.1f\" y=\"%.0f\" font-size=\"10\" "
                            "text-anchor=\"middle\">%s</text>\n", cx[t], PB + 14, ticks[t].date);
      kiln_strbuf_printf(b, "<text class=\"run\" x=\"%.1f\" y=\"%.0f\" font-size=\"10\" "
                            "text-anchor=\"middle\" fill=\"#555555\">", cx[t], PB + 26);
      ce_html(b, ticks[t].commit);
      kiln_strbuf_printf(b, "</text>\n");
    }
    for (int s = 0; s < nseries; s++) {
      const char *c = ce_series_colour(s);
      if (rows[s]->has_baseline && isfinite(rows[s]->baseline))
        kiln_strbuf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                     "stroke-dasharray=\"4 3\"><title>baseline %.6g (%d worker%s)</title></line>\n",
                  L, W - R, PY(rows[s]->baseline), PY(rows[s]->baseline), c, rows[s]->baseline,
                  workers[s], workers[s] == 1 ? "" : "s");
      int at[MAX_POINTS];
      for (int k = 0; k < npts[s]; k++) {
        at[k] = 0;
        while (ticks[at[k]].id != pts[s][k].run_id) at[k]++;
      }
      if (npts[s] > 1) {
        kiln_strbuf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
        for (int k = 0; k < npts[s]; k++)
          kiln_strbuf_printf(b, "%s%.1f,%.1f", k ? " " : "", PX(at[k]), PY(pts[s][k].value));
        kiln_strbuf_printf(b, "\"/>\n");
      }
      for (int k = 0; k < npts[s]; k++) {
        const kiln_ce_point *p = &pts[s][k];
        bool bad = !strcmp(p->verdict, "regression") || !strcmp(p->verdict, "FAIL");
        kiln_strbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>"
                              "%.6g (%s, %d worker%s), commit ",
                           PX(at[k]), PY(p->value), bad ? CE_REGRESSION_RED : c, p->value,
                           p->verdict, workers[s], workers[s] == 1 ? "" : "s");
        ce_html(b, p->git_commit[0] ? p->git_commit : "unknown");
        kiln_strbuf_printf(b, ", %s, run %lld</title></circle>\n", p->time, (long long)p->run_id);
      }
    }
    /* the legend: a swatch and the entry's text */
    for (int e = 0; e < nentries; e++) {
      double x = legend_x[e], y = LY + 12 * legend_row[e];
      const char *fill = e < nseries ? ce_series_colour(e) : "#555555";
      bool baseline_entry = e == nseries && any_baseline;
      if (e < nseries || baseline_entry)
        kiln_strbuf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                              "stroke=\"%s\"%s/>\n",
                           x, x + 12, y - 3.5, y - 3.5, e < nseries ? fill : "#7f7f7f",
                           e < nseries ? " stroke-width=\"1.5\"" : " stroke-dasharray=\"4 3\"");
      else
        kiln_strbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x + 6,
                           y - 3.5, CE_REGRESSION_RED);
      kiln_strbuf_printf(b, "<text class=\"legend\" x=\"%.1f\" y=\"%.0f\" font-size=\"10\" "
                            "fill=\"%s\">%s</text>\n", x + 16, y, fill, entries[e]);
    }
#undef PX
#undef PY
  }
  kiln_strbuf_printf(b, "</svg></figure>\n");
  for (int s = 0; s < nseries; s++) free(pts[s]);
  return rc;
}

/* The grid row's last cell: links (relative to report.html) to the first repeat's training log
 * and metrics, where its run folder has them. */
static void run_links(kiln_strbuf *b, const kiln_ce_result *r, const char *model, int workers) {
  static const char *const files[][2] = {{"train.log", "log"}, {"metrics.jsonl", "metrics"}};
  kiln_strbuf_printf(b, "<td class=\"name\">");
  for (size_t i = 0, shown = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[4096];
    if (ce_run_file(r->report_dir, model, workers, files[i][0], path, sizeof path) ||
        access(path, R_OK)) {
      kiln_clear_error();
      continue;
    }
    kiln_strbuf_printf(b, "%s<a href=\"runs/", shown++ ? " &middot; " : "");
    ce_html(b, model);
    kiln_strbuf_printf(b, "-w%d-r1/%s\">%s</a>", workers, files[i][0], files[i][1]);
  }
  kiln_strbuf_printf(b, "</td>");
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
    char summary[700], desc[1200];
    kiln_ce_machine_summary(&r->machine, summary, sizeof summary);
    snprintf(desc, sizeof desc, " (%s, %.1f GiB, %s, %s)", summary, r->machine.mem_gib,
             r->machine.compiler, r->machine.blas);
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
  kiln_strbuf_printf(&b, "<th>first run</th></tr>\n");
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
      run_links(&b, r, models[m], ws[w]);
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

  kiln_strbuf_printf(&b, "<h2>Convergence</h2>\n<p><small>Each worker count's first repeat; "
                        "dashed in the same colour: the baseline's curves (against seconds only "
                        "from a baseline of this machine class); grey dashed: ideal scaling."
                        "</small></p>\n");
  int rc = KILN_OK;
  for (int m = 0; m < nm && rc == KILN_OK; m++) rc = ce_report_curves(&b, r, models[m]);
  kiln_strbuf_printf(&b, "<h2>Trends</h2>\n<p><small>History on machine class ");
  ce_html(&b, r->machine_class);
  kiln_strbuf_printf(&b, "; dashed: the baseline; red points: regressions and failures.</small></p>\n");
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
  if (rc == KILN_OK) rc = ce_utf8_repair(&b, "\xef\xbf\xbd"); /* U+FFFD */
  if (rc == KILN_OK) rc = kiln_write_file_atomic(path, b.s, b.len);
  free(b.s);
  return rc;
}
