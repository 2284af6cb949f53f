/* What the report's SVG charts share: the series' colours (kept away from the red that marks
 * regressions), the estimated width of their text, the y-axis labels, the padding of a value
 * range and the placing of legend entries. The trend plots (report.c) and the convergence and
 * scaling charts (report_curves.c) are drawn with them, so one rule holds for all. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ce/internal.h"

/* The caption reserves red for regressions and failures: their points are drawn in it over the
 * series' lines. A series in red (or in a colour read as red: tab10's red and brown were the
 * second and sixth colours here) would hide them, so the palette keeps away from it: hues at
 * least 40 degrees from red, or grey. Blue first: most KPIs have a single worker count. */
static const char *const series_colours[] = {"#1f77b4", "#2ca02c", "#9467bd", "#e69f00",
                                             "#17becf", "#7f7f7f", "#bcbd22", "#8c6d00"};
_Static_assert(sizeof series_colours / sizeof series_colours[0] == CE_NCOLOURS,
               "a colour per series: two series of one chart must not share one");

const char *ce_series_colour(int i) { return series_colours[(unsigned)i % CE_NCOLOURS]; }

/* SVG text is not measured where it is written, so its width is estimated from its length: 0.65
 * em a character is at least the advance of the digits, the point and the suffixes in the
 * sans-serif faces browsers fall back to (DejaVu Sans's digits: 0.64 em), so a label given that
 * room is not clipped. */
double ce_text_px(const char *text) { return 0.65 * CE_FONT_PX * (double)strlen(text); }

/* `digits` significant digits, with k, M, G or T for thousands and up (12019.4 is "12k" at 3
 * digits), so that a label stays short whatever the scale; %g's exponent form (1.202e+04) took 9
 * characters and overflowed the margin. */
void ce_fmt_axis(char *buf, size_t n, double v, int digits) {
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

void ce_axis_labels(double lo, double hi, char *lo_text, char *hi_text, size_t n) {
  for (int digits = 3; digits <= 7; digits++) {
    ce_fmt_axis(lo_text, n, lo, digits);
    ce_fmt_axis(hi_text, n, hi, digits);
    if (strcmp(lo_text, hi_text)) return;
  }
}

void ce_pad_range(double *lo, double *hi) {
  if (*hi - *lo < 1e-12 * fmax(1, fabs(*hi))) {
    double pad = fabs(*hi) > 0 ? 0.05 * fabs(*hi) : 1;
    *lo -= pad;
    *hi += pad;
  } else {
    double pad = 0.08 * (*hi - *lo);
    *lo -= pad;
    *hi += pad;
  }
}

int ce_legend_layout(const char *const *entries, int n, double key, double x, double right,
                     double left, double full_right, double *xs, int *rows) {
  int row = 0;
  for (int i = 0; i < n; i++) {
    double w = ce_text_px(entries[i]) + key;
    if (x + w > right && x > left) {
      row++;
      x = left;
      right = full_right;
    }
    xs[i] = x;
    rows[i] = row;
    x += w + 12;
  }
  return n ? row + 1 : 0;
}
