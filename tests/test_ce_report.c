/* The CE report's charts read back from its HTML: the trend plots over the history (labels in
 * their plot, colours away from the regression red). Files live in a mkdtemp() folder. */
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

#include "ce_support.h"
#include "files.h"
#include "kiln/ce.h"

static char dir[64];

static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-cerep-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  rm_tree(dir);
  return 0;
}

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

/* The plots of a KPI on 1 and 2 workers with large values (12019.4 samples/s), the 2-worker one a
 * regression: its red points stand out from every series' colour, and every label (the y axis's
 * in particular) fits inside the plot. Small and huge values too, and a legend of eight worker
 * counts, which wraps under the plot. */
static void test_report_plots(void **state) {
  (void)state;
  char db[128], html[128];
  snprintf(db, sizeof db, "%s/plots.db", dir);
  snprintf(html, sizeof html, "%s/plots.html", dir);
  kiln_ce_history *h;
  assert_int_equal(kiln_ce_history_open(db, &h), KILN_OK);
  kiln_ce_result r;
  for (int i = 0; i < 3; i++) {
    memset(&r, 0, sizeof r);
    snprintf(r.suite_name, sizeof r.suite_name, "plots");
    snprintf(r.suite_path, sizeof r.suite_path, "/suites/plots.prototxt");
    snprintf(r.started_at, sizeof r.started_at, "2026-12-0%dT12:00:00Z", i + 1);
    snprintf(r.git_commit, sizeof r.git_commit, "abc1234");
    snprintf(r.machine_class, sizeof r.machine_class, "test-class-2c");
    bool last = i == 2;
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
  free(text);
  kiln_ce_result_free(&r);
  kiln_ce_history_close(h);
}

int main(void) {
  kiln_log_set_level(KILN_LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_report_plots),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
