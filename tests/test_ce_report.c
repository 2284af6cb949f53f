/* The CE report's charts read back from its HTML: the trend plots over the history (labels in
 * their plot, runs labelled by date and commit, a tooltip on every point, colours away from the
 * regression red, a legend) and the convergence and scaling charts drawn from the run folders'
 * metrics and the baseline's curves (as many curves as worker counts and baselines, every point
 * inside its plot, dashed baselines in their run's colour, "no baseline curve" where there is
 * none), the grid's links to each run's files, and the curves `kiln ce accept` keeps. Files live
 * in a mkdtemp() folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ce/internal.h"
#include "ce_support.h"
#include "files.h"
#include "kiln/ce.h"

static int setup_dir(void **state) { return tmpdir_setup(state, "cerep"); }

/* ---- the report's plots, read back -------------------------------------------------------- */

/* An attribute's value in the tag starting at `tag` (up to its '>'), or "" when absent. */
static void attr_of(const char *tag, const char *name, char *out, size_t n) {
  out[0] = '\0';
  const char *end = strchr(tag, '>');
  char key[64];
  snprintf(key, sizeof key, " %s=\"", name);
  const char *a = strstr(tag, key);
  if (!a || !end || a > end) return;
  a += strlen(key);
  size_t len = strcspn(a, "\"");
  snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), a);
}

/* The hue (degrees) and saturation (0..1) of "#rgb" or "#rrggbb". */
static void hue_of(const char *colour, double *hue, double *sat) {
  unsigned v[3];
  if (strlen(colour) == 4) {
    assert_int_equal(sscanf(colour, "#%1x%1x%1x", &v[0], &v[1], &v[2]), 3);
    for (int i = 0; i < 3; i++) v[i] *= 17;
  } else {
    assert_int_equal(sscanf(colour, "#%2x%2x%2x", &v[0], &v[1], &v[2]), 3);
  }
  double r = v[0] / 255.0, g = v[1] / 255.0, b = v[2] / 255.0;
  double mx = fmax(r, fmax(g, b)), mn = fmin(r, fmin(g, b)), d = mx - mn;
  *sat = mx > 0 ? d / mx : 0;
  double h = d == 0 ? 0 : mx == r ? fmod((g - b) / d, 6) : mx == g ? (b - r) / d + 2 : (r - g) / d + 4;
  *hue = h * 60 < 0 ? h * 60 + 360 : h * 60;
}

/* A series colour must not read as the regression red: equal to it, or a saturated colour
 * within 40 degrees of its hue. */
static void assert_not_red(const char *colour, const char *red, const char *where) {
  if (!strcasecmp(colour, red)) fail_msg("%s: series colour %s is the regression red", where, colour);
  double h, sat, rh, rsat;
  hue_of(colour, &h, &sat);
  hue_of(red, &rh, &rsat);
  double dist = fabs(h - rh);
  if (dist > 180) dist = 360 - dist;
  if (sat > 0.25 && dist < 40)
    fail_msg("%s: series colour %s (hue %.0f) reads as the regression red %s (hue %.0f)", where,
             colour, h, red, rh);
}

/* Checks every inline SVG plot of a report: each <text> lies inside the viewBox, its width
 * estimated as the report does (0.65 em a character), and no series colour (lines, the legend,
 * points that are not regressions) reads as the red of the regression points. Returns the
 * number of plots; *nred the regression points seen. */
static int check_plots(const char *html, int *nred, char *ylabels, size_t nlabels) {
  int nplots = 0;
  *nred = 0;
  ylabels[0] = '\0';
  char red[16] = "";
  /* the regression red: the fill of a point whose title says regression */
  for (const char *c = strstr(html, "<circle "); c; c = strstr(c + 1, "<circle ")) {
    const char *close = strstr(c, "</circle>");
    assert_non_null(close);
    char whole[512];
    snprintf(whole, sizeof whole, "%.*s", (int)(close - c), c);
    if (!strstr(whole, "(regression,")) continue;
    attr_of(c, "fill", red, sizeof red);
    (*nred)++;
  }
  for (const char *svg = strstr(html, "<svg "); svg; svg = strstr(svg + 1, "<svg ")) {
    nplots++;
    const char *end = strstr(svg, "</svg>");
    assert_non_null(end);
    char vb[64];
    attr_of(svg, "viewBox", vb, sizeof vb);
    double x0, y0, w, h;
    assert_int_equal(sscanf(vb, "%lf %lf %lf %lf", &x0, &y0, &w, &h), 4);
    for (const char *t = strstr(svg, "<text "); t && t < end; t = strstr(t + 1, "<text ")) {
      char xs[32], ys[32], fs[32], anchor[32], fill[32];
      attr_of(t, "x", xs, sizeof xs);
      attr_of(t, "y", ys, sizeof ys);
      attr_of(t, "font-size", fs, sizeof fs);
      attr_of(t, "text-anchor", anchor, sizeof anchor);
      attr_of(t, "fill", fill, sizeof fill);
      const char *body = strchr(t, '>') + 1;
      int len = (int)(strstr(body, "</text>") - body);
      double x = atof(xs), y = atof(ys), size = atof(fs), width = 0.65 * size * len;
      double left = !strcmp(anchor, "end") ? x - width : !strcmp(anchor, "middle") ? x - width / 2 : x;
      if (left < x0 || left + width > x0 + w || y - size < y0 || y > y0 + h)
        fail_msg("plot %d: text '%.*s' at x %g (%s) spans %g..%g, outside the viewBox %s", nplots,
                 len, body, x, anchor[0] ? anchor : "start", left, left + width, vb);
      if (!strcmp(anchor, "end") && x < w / 2) { /* a y label */
        size_t used = strlen(ylabels);
        snprintf(ylabels + used, nlabels - used, "%.*s|", len, body);
      }
      if (fill[0] && strcmp(fill, "#888") && red[0]) assert_not_red(fill, red, "legend");
    }
    for (const char *k = strstr(svg, "<polyline "); k && k < end; k = strstr(k + 1, "<polyline ")) {
      char c[32];
      attr_of(k, "stroke", c, sizeof c);
      if (red[0]) assert_not_red(c, red, "trend line");
    }
    for (const char *k = strstr(svg, "<line "); k && k < end; k = strstr(k + 1, "<line ")) {
      char c[32];
      attr_of(k, "stroke", c, sizeof c);
      if (red[0]) assert_not_red(c, red, "baseline");
    }
  }
  return nplots;
}

/* The run labels (date above commit) under one plot, in order: none may overlap the next at the
 * report's width estimate. Returns how many there are; `first` and `last` get the first and
 * last commit shown. */
static int check_run_labels(const char *svg, char *first, char *last, size_t n) {
  const char *end = strstr(svg, "</svg>");
  if (!end) end = svg + strlen(svg);
  double prev_right = -1e9;
  int count = 0;
  first[0] = last[0] = '\0';
  for (const char *t = strstr(svg, "<text class=\"run\""); t && t < end;
       t = strstr(t + 1, "<text class=\"run\"")) {
    char xs[32], fill[32];
    attr_of(t, "x", xs, sizeof xs);
    attr_of(t, "fill", fill, sizeof fill);
    const char *body = strchr(t, '>') + 1;
    int len = (int)(strstr(body, "</text>") - body);
    if (!fill[0]) { /* the date line; its commit follows */
      double x = atof(xs), w = 0.65 * 10 * 7; /* centred, as wide as a 7-character commit */
      if (x - w / 2 < prev_right) fail_msg("run label at x %g overlaps the one before", x);
      prev_right = x + w / 2;
      count++;
    } else {
      if (!first[0]) snprintf(first, n, "%.*s", len, body);
      snprintf(last, n, "%.*s", len, body);
    }
  }
  return count;
}

/* The plots of a KPI on 1 and 2 workers with large values (12019.4 samples/s), the 2-worker one a
 * regression: its red points stand out from every series' colour, and every label (the y axis's
 * in particular) fits inside the plot. Small and huge values too, and a legend of eight worker
 * counts, which wraps under the plot. Twelve runs, each of its own commit: more than the axis
 * has room to label, so labels are left out, the newest kept. */
static void test_report_plots(void **state) {
  const char *dir = ((tmpdir_fixture *)*state)->dir;
  char db[128], html[128];
  snprintf(db, sizeof db, "%s/plots.db", dir);
  snprintf(html, sizeof html, "%s/plots.html", dir);
  kiln_ce_history *h;
  assert_int_equal(kiln_ce_history_open(db, &h), KILN_OK);
  kiln_ce_result r;
  enum { RUNS = 12 };
  for (int i = 0; i < RUNS; i++) {
    memset(&r, 0, sizeof r);
    snprintf(r.suite_name, sizeof r.suite_name, "plots");
    snprintf(r.suite_path, sizeof r.suite_path, "/suites/plots.prototxt");
    snprintf(r.started_at, sizeof r.started_at, "2026-11-%02dT12:00:00Z", i + 10);
    snprintf(r.git_commit, sizeof r.git_commit, "v1.0-%d-gabc12%02d%s", i, i,
             i == RUNS - 1 ? "-dirty" : "");
    snprintf(r.machine_class, sizeof r.machine_class, "test-class-2c");
    bool last = i == RUNS - 1;
    kiln_ce_row row = make_row("lenet", 1, "samples_per_s", 12019.4 - 7.3 * i, KILN_CE_PASS);
    row.has_baseline = true;
    row.baseline = 12019.4;
    kiln_ce_result_add_row(&r, &row);
    row = make_row("lenet", 2, "samples_per_s", last ? 16871.2 : 21500.6 + 3.1 * i,
                   last ? KILN_CE_REGRESSION : KILN_CE_PASS);
    row.has_baseline = true;
    row.baseline = 21500.6;
    kiln_ce_result_add_row(&r, &row);
    row = make_row("lenet", 1, "weight_norm", 1.2345e-5 * (1 + 0.01 * i), KILN_CE_PASS);
    kiln_ce_result_add_row(&r, &row);
    row = make_row("lenet", 1, "peak_rss_bytes", 1234567890.0 + 1e6 * i, KILN_CE_PASS);
    kiln_ce_result_add_row(&r, &row);
    /* eight worker counts: more legend entries than fit beside the run labels */
    for (int w = 1; w <= 128; w *= 2) {
      row = make_row("lenet", w, "duration_s", 100.0 / w + i, KILN_CE_PASS);
      kiln_ce_result_add_row(&r, &row);
    }
    assert_int_equal(kiln_ce_history_record(h, &r), KILN_OK);
    if (!last) kiln_ce_result_free(&r);
  }
  assert_int_equal(kiln_ce_report_html(&r, h, html), KILN_OK);
  char *text;
  size_t len;
  assert_int_equal(kiln_read_file(html, &text, &len), KILN_OK);
  int nred;
  char ylabels[512];
  assert_int_equal(check_plots(text, &nred, ylabels, sizeof ylabels), 4);
  assert_int_equal(nred, 1); /* the 2-worker run that regressed */
  assert_contains(text, "2 workers</text>");
  assert_contains(text, "128 workers</text>");
  /* the eight entries took more than the row beside the run labels: the plot grew rows */
  const char *fig = strstr(text, "lenet &middot; duration_s");
  assert_non_null(fig);
  char vb[64];
  attr_of(strstr(fig, "<svg "), "viewBox", vb, sizeof vb);
  double vw, vh;
  assert_int_equal(sscanf(vb, "0 0 %lf %lf", &vw, &vh), 2);
  assert_true(vh > 150);
  /* short labels: 3 significant digits and a suffix, more only to tell the two apart */
  assert_contains(ylabels, "k|");
  assert_contains(ylabels, "G|");
  for (const char *p = ylabels; *p;) {
    size_t n = strcspn(p, "|");
    if (n > 8) fail_msg("y label '%.*s' is long (labels: %s)", (int)n, p, ylabels);
    p += n + (p[n] == '|');
  }
  /* runs labelled by date and short commit, thinned out; the newest always */
  fig = strstr(text, "lenet &middot; samples_per_s");
  assert_non_null(fig);
  *strstr(fig, "</svg>") = '\0'; /* this plot alone */
  char first[32], newest[32];
  int shown = check_run_labels(strstr(fig, "<svg "), first, newest, sizeof first);
  if (!(shown >= 3 && shown < RUNS)) fail_msg("%d run labels shown", shown);
  assert_string_equal(first, "abc1200");
  assert_string_equal(newest, "abc1211+");
  assert_contains(fig, ">11-10</text>");
  assert_contains(fig, ">11-21</text>");
  /* every point's tooltip: value, verdict, commit, date; the legend names all it shows */
  assert_int_equal(count_of(fig, "<title>"), 2 * RUNS + 2);
  assert_contains(fig, "<title>16871.2 (regression, 2 workers), commit v1.0-11-gabc1211-dirty, "
                       "2026-11-21T12:00:00Z, run 12</title>");
  assert_contains(fig, "<title>12019.4 (pass, 1 worker), commit v1.0-0-gabc1200, "
                       "2026-11-10T12:00:00Z, run 1</title>");
  assert_contains(fig, ">1 worker</text>");
  assert_contains(fig, ">baseline</text>");
  assert_contains(fig, ">regression</text>");
  free(text);
  kiln_ce_result_free(&r);
  kiln_ce_history_close(h);
}

/* ---- convergence curves ------------------------------------------------------------------- */

/* Writes a first repeat's metrics: `ntrain` train events every `step` iterations (`ms_per_iter`
 * ms apart, loss falling, `sps` samples/s), a test event at the first, middle and last of them
 * (accuracy rising), and the done event; and the training log when `log`. */
static void write_run(const char *report, const char *model, int workers, int ntrain, int step,
                      double ms_per_iter, double sps, bool log) {
  char path[512];
  snprintf(path, sizeof path, "%s/runs/%s-w%d-r1", report, model, workers);
  assert_int_equal(kiln_mkdir_p(path), KILN_OK);
  kiln_strbuf b = {0};
  int last = (ntrain - 1) * step;
  for (int i = 0; i < ntrain; i++) {
    int it = i * step;
    kiln_strbuf_printf(&b, "{\"event\":\"train\",\"iter\":%d,\"time_ms\":%.3f,\"rank\":0,"
                           "\"loss\":%.6f,\"samples_per_s\":%g}\n",
                       it, 5 + ms_per_iter * it, 2.0 * exp(-it / 50.0) + 0.1, sps);
    if (i == 0 || i == ntrain / 2 || i == ntrain - 1)
      kiln_strbuf_printf(&b, "{\"event\":\"test\",\"iter\":%d,\"time_ms\":%.3f,\"rank\":0,"
                             "\"test_net\":0,\"loss\":%.4f,\"accuracy\":%.4f}\n",
                         it, 6 + ms_per_iter * it, 1.0 - 0.4 * it / last, 0.1 + 0.7 * it / last);
  }
  kiln_strbuf_printf(&b, "{\"event\":\"done\",\"iter\":%d,\"time_ms\":%.3f,\"rank\":0}\n", last,
                     10 + ms_per_iter * last);
  char file[600];
  snprintf(file, sizeof file, "%s/metrics.jsonl", path);
  write_plain(file, b.s, b.len);
  free(b.s);
  if (log) {
    snprintf(file, sizeof file, "%s/train.log", path);
    write_plain(file, "training\n", 9);
  }
}

/* The <svg> after the figcaption that reads `caption`; fails when there is none. */
static const char *chart_after(const char *html, const char *caption) {
  char want[160];
  snprintf(want, sizeof want, "<figcaption>%s</figcaption>", caption);
  const char *f = strstr(html, want);
  if (!f) fail_msg("no chart '%s'", caption);
  return strstr(f, "<svg ");
}

typedef struct {
  int n;             /* points */
  double x0, xn;     /* the first and last point's x */
  char stroke[16];
  bool dashed;
} curve_seen;

/* The polylines of kind `kind` (run, baseline, scaling, ideal) in one chart, by worker count
 * (index: data-workers; scaling and ideal lines at 0). Every point must lie inside the plot area
 * (the chart's <rect>) and so inside the viewBox. Returns how many there are. */
static int curves_of(const char *svg, const char *kind, curve_seen seen[16]) {
  const char *end = strstr(svg, "</svg>");
  char rx[32], ry[32], rw[32], rh[32];
  const char *rect = strstr(svg, "<rect ");
  attr_of(rect, "x", rx, sizeof rx);
  attr_of(rect, "y", ry, sizeof ry);
  attr_of(rect, "width", rw, sizeof rw);
  attr_of(rect, "height", rh, sizeof rh);
  double x0 = atof(rx), y0 = atof(ry), x1 = x0 + atof(rw), y1 = y0 + atof(rh);
  memset(seen, 0, 16 * sizeof *seen);
  int count = 0;
  for (const char *p = strstr(svg, "<polyline "); p && p < end; p = strstr(p + 1, "<polyline ")) {
    char k[16], w[16], points[8192];
    attr_of(p, "data-kind", k, sizeof k);
    if (strcmp(k, kind)) continue;
    attr_of(p, "data-workers", w, sizeof w);
    int wi = atoi(w);
    assert_true(wi >= 0 && wi < 16);
    curve_seen *c = &seen[wi];
    assert_int_equal(c->n, 0); /* one line per kind and worker count */
    count++;
    attr_of(p, "stroke", c->stroke, sizeof c->stroke);
    char dash[16];
    attr_of(p, "stroke-dasharray", dash, sizeof dash);
    c->dashed = dash[0] != '\0';
    attr_of(p, "points", points, sizeof points);
    for (const char *q = points; *q;) {
      double x, y;
      int used;
      assert_int_equal(sscanf(q, "%lf,%lf%n", &x, &y, &used), 2);
      if (x < x0 - 0.05 || x > x1 + 0.05 || y < y0 - 0.05 || y > y1 + 0.05)
        fail_msg("%s curve (%d workers): point %g,%g outside the plot %g,%g..%g,%g", kind, wi, x,
                 y, x0, y0, x1, y1);
      if (c->n == 0) c->x0 = x;
      else if (x < c->xn) fail_msg("%s curve (%d workers) goes back at x %g", kind, wi, x);
      c->xn = x;
      c->n++;
      q += used;
      while (*q == ' ') q++;
    }
  }
  return count;
}

/* lenet ran on 1 and 2 workers and its baseline, accepted from the 1-worker run's folder alone,
 * has 1-worker curves; "old" ran on 1 worker against a baseline without curves. */
static void test_report_curves(void **state) {
  const char *dir = ((tmpdir_fixture *)*state)->dir;
  char report[256], bdir[256], html[300];
  snprintf(report, sizeof report, "%s/curves", dir);
  snprintf(bdir, sizeof bdir, "%s/baselines", dir);
  snprintf(html, sizeof html, "%s/report.html", report);
  kiln_ce_result r;
  memset(&r, 0, sizeof r);
  snprintf(r.suite_name, sizeof r.suite_name, "curves");
  snprintf(r.started_at, sizeof r.started_at, "2026-12-01T12:00:00Z");
  snprintf(r.git_commit, sizeof r.git_commit, "abc1234");
  snprintf(r.machine_class, sizeof r.machine_class, "test-class-2c");
  snprintf(r.report_dir, sizeof r.report_dir, "%s", report);
  snprintf(r.baseline_dir, sizeof r.baseline_dir, "%s", bdir);
  r.run_id = 1;
  const struct { const char *model; int workers; const char *kpi; double value; } rows[] = {
      {"lenet", 1, "accuracy", 0.8}, {"lenet", 1, "samples_per_s", 1000},
      {"lenet", 2, "accuracy", 0.8}, {"lenet", 2, "samples_per_s", 1800},
      {"old", 1, "accuracy", 0.8},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    kiln_ce_row row = make_row(rows[i].model, rows[i].workers, rows[i].kpi, rows[i].value,
                               KILN_CE_NEW);
    kiln_ce_result_add_row(&r, &row);
  }

  /* accept: the 1-worker run's 150 train events kept as 100 evenly picked points */
  write_run(report, "lenet", 1, 150, 1, 10, 1000, true);
  int written;
  assert_int_equal(kiln_ce_accept(&r, bdir, &written), KILN_OK);
  assert_int_equal(written, 2);
  char path[512];
  snprintf(path, sizeof path, "%s/test-class-2c/lenet.prototxt", bdir);
  Caffe__CeBaseline *b;
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_OK);
  assert_int_equal(b->n_curve, 2);
  const Caffe__CeCurve *loss = b->curve[0], *acc = b->curve[1];
  assert_string_equal(loss->metric, "train_loss");
  assert_int_equal(loss->workers, 1);
  assert_int_equal(loss->n_iter, 100);
  assert_int_equal(loss->n_value, 100);
  assert_int_equal(loss->n_seconds, 100);
  assert_int_equal(loss->iter[0], 0);
  assert_int_equal(loss->iter[99], 149);
  assert_true(fabs(loss->seconds[0] - 0.005) < 1e-12);
  assert_true(fabs(loss->seconds[99] - 1.495) < 1e-12);
  assert_true(fabs(loss->value[99] - (2.0 * exp(-149 / 50.0) + 0.1)) < 1e-6);
  assert_string_equal(acc->metric, "accuracy");
  assert_int_equal(acc->n_iter, 3);
  assert_true(fabs(acc->value[2] - 0.8) < 1e-9);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  snprintf(path, sizeof path, "%s/test-class-2c/old.prototxt", bdir);
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_OK);
  assert_int_equal(b->n_curve, 0); /* its run folder was not there: values only */
  protobuf_c_message_free_unpacked(&b->base, NULL);

  /* the run the report draws: 2 workers too (30 events, twice as fast), and old */
  write_run(report, "lenet", 2, 30, 2, 6, 1800, true);
  write_run(report, "old", 1, 20, 5, 10, 500, false);
  assert_int_equal(kiln_ce_report_html(&r, NULL, html), KILN_OK);
  char *text;
  size_t len;
  assert_int_equal(kiln_read_file(html, &text, &len), KILN_OK);
  assert_int_equal(count_of(text, "<svg class=\"curves\""), 8);
  assert_int_equal(count_of(text, "<svg class=\"scaling\""), 1);
  int nred;
  char ylabels[1024];
  assert_int_equal(check_plots(text, &nred, ylabels, sizeof ylabels), 3 + 8 + 1);
  assert_int_equal(nred, 0);

  static const char *const lenet_charts[] = {
      "lenet \xc2\xb7 train loss vs iteration", "lenet \xc2\xb7 accuracy vs iteration",
      "lenet \xc2\xb7 train loss vs time", "lenet \xc2\xb7 accuracy vs time"};
  for (int c = 0; c < 4; c++) {
    const char *svg = chart_after(text, lenet_charts[c]);
    curve_seen run[16], base[16];
    /* one solid curve per worker count, the baseline's dashed in the 1-worker colour */
    assert_int_equal(curves_of(svg, "run", run), 2);
    assert_int_equal(curves_of(svg, "baseline", base), 1);
    assert_int_equal(run[1].n, c % 2 == 0 ? 100 : 3);
    assert_int_equal(run[2].n, c % 2 == 0 ? 30 : 3);
    assert_int_equal(base[1].n, c % 2 == 0 ? 100 : 3);
    assert_false(run[1].dashed || run[2].dashed);
    assert_true(base[1].dashed);
    assert_string_equal(base[1].stroke, run[1].stroke);
    assert_string_not_equal(run[1].stroke, run[2].stroke);
    /* x runs over the plot: the 1-worker curve spans it, the 2-worker one ends sooner */
    const char *rect = strstr(svg, "<rect ");
    char rx[16], rw[16];
    attr_of(rect, "x", rx, sizeof rx);
    attr_of(rect, "width", rw, sizeof rw);
    assert_true(fabs(run[1].xn - (atof(rx) + atof(rw))) < 0.06);
    assert_true(run[2].xn < run[1].xn);
    const char *end = strstr(svg, "</svg>");
    const char *legend = strstr(svg, ">1 worker</text>");
    assert_true(legend && legend < end);
    legend = strstr(svg, ">2 workers</text>");
    assert_true(legend && legend < end);
    legend = strstr(svg, ">baseline, 1 worker</text>");
    assert_true(legend && legend < end);
    legend = strstr(svg, ">no baseline curve, 2 workers</text>");
    assert_true(legend && legend < end);
  }
  assert_contains(text, "<title>1 worker (first repeat): 100 points</title>");
  assert_contains(text, "<title>baseline, 1 worker: 100 points</title>");
  assert_contains(text, ">wall clock since start (s)</text>");
  assert_contains(text, ">iteration</text>");

  /* old: its baseline has no curves */
  const char *svg = chart_after(text, "old \xc2\xb7 train loss vs iteration");
  curve_seen run[16], base[16];
  assert_int_equal(curves_of(svg, "run", run), 1);
  assert_int_equal(run[1].n, 20);
  assert_int_equal(curves_of(svg, "baseline", base), 0);
  assert_non_null(strstr(svg, ">no baseline curve</text>"));
  assert_true(strstr(svg, ">no baseline curve</text>") < strstr(svg, "</svg>"));

  /* scaling: 1000 and 1800 samples/s joined, the ideal 1000 -> 2000 dashed grey above */
  svg = chart_after(text, "lenet \xc2\xb7 scaling");
  curve_seen measured[16], ideal[16];
  assert_int_equal(curves_of(svg, "scaling", measured), 1);
  assert_int_equal(curves_of(svg, "ideal", ideal), 1);
  assert_int_equal(measured[0].n, 2);
  assert_int_equal(ideal[0].n, 2);
  assert_true(ideal[0].dashed);
  assert_string_equal(ideal[0].stroke, "#7f7f7f");
  assert_true(fabs(measured[0].x0 - ideal[0].x0) < 0.06);
  const char *p = strstr(svg, "data-kind=\"ideal\"");
  char pts[256];
  attr_of(p, "points", pts, sizeof pts);
  double ix0, iy0, ix1, iy1;
  assert_int_equal(sscanf(pts, "%lf,%lf %lf,%lf", &ix0, &iy0, &ix1, &iy1), 4);
  p = strstr(svg, "data-kind=\"scaling\"");
  attr_of(p, "points", pts, sizeof pts);
  double mx0, my0, mx1, my1;
  assert_int_equal(sscanf(pts, "%lf,%lf %lf,%lf", &mx0, &my0, &mx1, &my1), 4);
  assert_true(fabs(iy0 - my0) < 0.06 && iy1 < my1); /* same start, the ideal higher at 2 */
  assert_contains(svg, "<title>2 workers: 1800 samples/s</title>");
  assert_null(strstr(text, "old \xc2\xb7 scaling")); /* one worker count: no scaling chart */

  /* the grid links each run's files, where its folder has them */
  assert_contains(text, "<a href=\"runs/lenet-w1-r1/train.log\">log</a>");
  assert_contains(text, "<a href=\"runs/lenet-w2-r1/metrics.jsonl\">metrics</a>");
  assert_contains(text, "<a href=\"runs/old-w1-r1/metrics.jsonl\">metrics</a>");
  assert_null(strstr(text, "runs/old-w1-r1/train.log"));
  free(text);

  /* accepted again: the 2-worker curves join, the 1-worker ones are replaced, not repeated */
  assert_int_equal(kiln_ce_accept(&r, bdir, &written), KILN_OK);
  snprintf(path, sizeof path, "%s/test-class-2c/lenet.prototxt", bdir);
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_OK);
  assert_int_equal(b->n_curve, 4);
  int per_workers[3] = {0};
  for (size_t i = 0; i < b->n_curve; i++) {
    assert_true(b->curve[i]->workers == 1 || b->curve[i]->workers == 2);
    per_workers[b->curve[i]->workers]++;
  }
  assert_int_equal(per_workers[1], 2);
  assert_int_equal(per_workers[2], 2);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  kiln_ce_result_free(&r);
}

/* Metrics written without time_ms (an older trainer) still give curves against iteration, none
 * against seconds; a baseline whose curve does not hold together is refused, naming it. */
static void test_curves_old_files(void **state) {
  const char *dir = ((tmpdir_fixture *)*state)->dir;
  const char *text = "{\"event\":\"train\",\"iter\":0,\"rank\":0,\"loss\":2}\n"
                     "{\"event\":\"train\",\"iter\":10,\"rank\":0,\"loss\":1}\n"
                     "{\"event\":\"train\",\"iter\":20,\"time_ms\":300,\"rank\":0,\"loss\":0.5}\n";
  kiln_ce_metrics m;
  assert_int_equal(kiln_ce_metrics_parse(text, strlen(text), "old.jsonl", &m), KILN_OK);
  assert_int_equal(m.train_loss.n, 3);
  assert_true(isnan(m.train_loss.time_s[0]));
  assert_true(fabs(m.train_loss.time_s[2] - 0.3) < 1e-12);
  ce_curve c;
  ce_curve_from_metrics(&m, "train_loss", 1, &c);
  assert_int_equal(c.n, 3);
  assert_false(c.has_seconds);
  assert_true(c.iter[2] == 20 && c.value[2] == 0.5);
  kiln_ce_metrics_free(&m);

  char path[256];
  snprintf(path, sizeof path, "%s/bad-curve.prototxt", dir);
  const char *bad = "model: \"m\"\nvalue { kpi: \"accuracy\" value: 0.9 }\n"
                    "curve { metric: \"train_loss\" workers: 2 iter: 0 iter: 10 value: 1 }\n";
  write_plain(path, bad, strlen(bad));
  Caffe__CeBaseline *b;
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "curve 1 (train_loss, 2 workers): 2 iter, 1 value");
  bad = "model: \"m\"\nvalue { kpi: \"accuracy\" value: 0.9 }\n"
        "curve { metric: \"loss\" iter: 0 value: 1 }\n";
  write_plain(path, bad, strlen(bad));
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "curve 1: metric 'loss' is none of");
}

int main(void) {
  kiln_log_set_level(KILN_LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_report_plots, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_report_curves, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_curves_old_files, setup_dir, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
