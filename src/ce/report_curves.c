/* The report's convergence charts: per model, training loss and the test figure (accuracy, f1,
 * mAP or perplexity) against iteration and against seconds, one curve per worker count from the
 * first repeat's metrics, the accepted baseline's curves dashed in the same colour; and, when
 * the model ran at more than one worker count, samples/s against workers beside the ideal line
 * of the 1-worker rate. They show whether data-parallel training converges as one worker does,
 * and how much sooner. Axis labels, colours and legends follow the trend plots' rules (svg.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ce/internal.h"

enum { MAX_WORKERS = CE_NCOLOURS, MAX_LINES = 2 * MAX_WORKERS, MAX_ENTRIES = 2 * MAX_WORKERS };
#define IDEAL_GREY "#7f7f7f"

typedef struct {
  const char *colour, *kind; /* kind: "run", "baseline", "scaling" or "ideal" */
  bool dashed;
  int workers, n;
  const double *x, *y;
  char title[160];
} chart_line;

typedef struct {
  char caption[160];
  const char *cls, *xname, *yname; /* the axes' titles, with their units */
  chart_line line[MAX_LINES];
  int nlines;
  char entry[MAX_ENTRIES][48]; /* the legend: text, swatch colour (NULL: none), dashed */
  const char *entry_colour[MAX_ENTRIES];
  bool entry_dashed[MAX_ENTRIES];
  int nentries;
} chart;

/* A legend entry: its text, its swatch's colour (NULL: none) and dash. */
static void legend_add(chart *c, const char *colour, bool dashed, const char *text) {
  if (c->nentries == MAX_ENTRIES) return;
  snprintf(c->entry[c->nentries], sizeof c->entry[0], "%s", text);
  c->entry_colour[c->nentries] = colour;
  c->entry_dashed[c->nentries++] = dashed;
}

static chart_line *line_add(chart *c, const char *colour, const char *kind, bool dashed,
                            int workers) {
  chart_line *l = &c->line[c->nlines++];
  memset(l, 0, sizeof *l);
  l->colour = colour;
  l->kind = kind;
  l->dashed = dashed;
  l->workers = workers;
  return l;
}

/* Draws a chart: the plot area, the y range's labels at its left (the margin sized to them), the
 * x range's under it with the x axis's title, the y axis's title above, every line (points with
 * a non-finite coordinate left out; a line of one point gets a dot), the legend in rows below. */
static void draw_chart(kiln_strbuf *b, const chart *c) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (int i = 0; i < c->nlines; i++)
    for (int k = 0; k < c->line[i].n; k++) {
      double x = c->line[i].x[k], y = c->line[i].y[k];
      if (!isfinite(x) || !isfinite(y)) continue;
      xmin = fmin(xmin, x);
      xmax = fmax(xmax, x);
      ymin = fmin(ymin, y);
      ymax = fmax(ymax, y);
    }
  bool any = isfinite(xmin);
  char ylo[32] = "", yhi[32] = "", xlo[32] = "", xhi[32] = "";
  if (any) {
    ce_pad_range(&ymin, &ymax);
    if (xmax <= xmin) ce_pad_range(&xmin, &xmax);
    ce_axis_labels(ymin, ymax, ylo, yhi, sizeof ylo);
    ce_axis_labels(xmin, xmax, xlo, xhi, sizeof xlo);
  }
  const double W = 360, R = 10, T = 22, PB = 130;
  const double L = fmax(40, 8 + fmax(ce_text_px(ylo), ce_text_px(yhi)));
  const char *texts[MAX_ENTRIES];
  for (int e = 0; e < c->nentries; e++) texts[e] = c->entry[e];
  double ex[MAX_ENTRIES];
  int erow[MAX_ENTRIES];
  int rows = ce_legend_layout(texts, c->nentries, 16, L, W - R, L, W - R, ex, erow);
  const double LY = PB + 40, H = LY + 12 * (rows > 0 ? rows - 1 : 0) + 6;
  kiln_strbuf_printf(b, "<figure><figcaption>");
  ce_html(b, c->caption);
  kiln_strbuf_printf(b, "</figcaption>\n<svg class=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
                        "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n",
                     c->cls, W, H, W, H);
  kiln_strbuf_printf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
                        "fill=\"#fafafa\" stroke=\"#ccc\"/>\n",
                     L, T, W - L - R, PB - T);
  kiln_strbuf_printf(b, "<text x=\"4\" y=\"12\" font-size=\"10\" fill=\"#555555\">%s</text>\n",
                     c->yname);
  kiln_strbuf_printf(b, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"middle\" "
                        "fill=\"#555555\">%s</text>\n",
                     (L + W - R) / 2, PB + 26, c->xname);
  if (!any) {
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#888\">no values"
                          "</text>\n", L + 10, (T + PB) / 2);
  } else {
#define PX(v) (L + ((v) - xmin) / (xmax - xmin) * (W - L - R))
#define PY(v) (T + (1 - ((v) - ymin) / (ymax - ymin)) * (PB - T))
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s"
                          "</text>\n", L - 4, T + 8, yhi);
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s"
                          "</text>\n", L - 4, PB, ylo);
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">%s</text>\n", L, PB + 13,
                       xlo);
    kiln_strbuf_printf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"end\">%s"
                          "</text>\n", W - R, PB + 13, xhi);
    for (int i = 0; i < c->nlines; i++) {
      const chart_line *l = &c->line[i];
      int drawable = 0;
      for (int k = 0; k < l->n; k++) drawable += isfinite(l->x[k]) && isfinite(l->y[k]);
      if (drawable == 0) continue;
      kiln_strbuf_printf(b, "<polyline class=\"curve\" data-kind=\"%s\" data-workers=\"%d\" "
                            "fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
                         l->kind, l->workers, l->colour,
                         l->dashed ? " stroke-dasharray=\"5 3\"" : "");
      int drawn = 0;
      for (int k = 0; k < l->n; k++)
        if (isfinite(l->x[k]) && isfinite(l->y[k]))
          kiln_strbuf_printf(b, "%s%.1f,%.1f", drawn++ ? " " : "", PX(l->x[k]), PY(l->y[k]));
      kiln_strbuf_printf(b, "\"><title>");
      ce_html(b, l->title);
      kiln_strbuf_printf(b, "</title></polyline>\n");
      /* the scaling chart's measurements, and a curve of one point, as dots */
      bool scaling = !strcmp(l->kind, "scaling");
      for (int k = 0; k < l->n && (drawn == 1 || scaling); k++) {
        if (!isfinite(l->x[k]) || !isfinite(l->y[k])) continue;
        kiln_strbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>",
                           PX(l->x[k]), PY(l->y[k]), l->colour);
        if (scaling)
          kiln_strbuf_printf(b, "%g worker%s: %.4g samples/s", l->x[k], l->x[k] == 1 ? "" : "s",
                             l->y[k]);
        else ce_html(b, l->title);
        kiln_strbuf_printf(b, "</title></circle>\n");
      }
    }
#undef PX
#undef PY
  }
  for (int e = 0; e < c->nentries; e++) {
    double x = ex[e], y = LY + 12 * erow[e];
    const char *col = c->entry_colour[e];
    if (col)
      kiln_strbuf_printf(b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                            "stroke-width=\"1.5\"%s/>\n",
                         x, x + 12, y - 3.5, y - 3.5, col,
                         c->entry_dashed[e] ? " stroke-dasharray=\"5 3\"" : "");
    kiln_strbuf_printf(b, "<text class=\"legend\" x=\"%.1f\" y=\"%.0f\" font-size=\"10\" "
                          "fill=\"%s\">",
                       x + 16, y, col ? col : "#555555");
    ce_html(b, c->entry[e]);
    kiln_strbuf_printf(b, "</text>\n");
  }
  kiln_strbuf_printf(b, "</svg></figure>\n");
}

/* What one model's charts are drawn from. */
typedef struct {
  int nw, workers[MAX_WORKERS];
  kiln_ce_metrics m[MAX_WORKERS];
  bool have[MAX_WORKERS];
  ce_curve run[2][MAX_WORKERS], base[2][MAX_WORKERS]; /* [0] train loss, [1] the test figure */
  bool has_base[2][MAX_WORKERS];
  bool base_same_class; /* the baseline's seconds compare with this machine's */
  const char *test_metric;
} model_curves;

/* One convergence chart: `which` 0 (train loss) or 1 (the test figure), against seconds or
 * iterations. */
static void convergence_chart(kiln_strbuf *b, const char *model, const model_curves *mc,
                              int which, bool seconds) {
  chart c;
  memset(&c, 0, sizeof c);
  const char *yname = which == 0 ? "train loss" : mc->test_metric;
  snprintf(c.caption, sizeof c.caption, "%s \xc2\xb7 %s vs %s", model, yname,
           seconds ? "time" : "iteration");
  c.cls = "curves";
  c.xname = seconds ? "wall clock since start (s)" : "iteration";
  c.yname = yname;
  int nbase = 0, nmissing = 0;
  for (int w = 0; w < mc->nw; w++) {
    if (!mc->have[w]) continue;
    const char *colour = ce_series_colour(w);
    const ce_curve *run = &mc->run[which][w], *base = &mc->base[which][w];
    chart_line *l = line_add(&c, colour, "run", false, mc->workers[w]);
    l->n = seconds && !run->has_seconds ? 0 : run->n;
    l->x = seconds ? run->seconds : run->iter;
    l->y = run->value;
    snprintf(l->title, sizeof l->title, "%d worker%s (first repeat): %d points", mc->workers[w],
             mc->workers[w] == 1 ? "" : "s", run->n);
    char text[48];
    snprintf(text, sizeof text, "%d worker%s", mc->workers[w], mc->workers[w] == 1 ? "" : "s");
    legend_add(&c, colour, false, text);
    bool drawn = mc->has_base[which][w] && (!seconds || (base->has_seconds && mc->base_same_class));
    if (drawn) {
      l = line_add(&c, colour, "baseline", true, mc->workers[w]);
      l->n = base->n;
      l->x = seconds ? base->seconds : base->iter;
      l->y = base->value;
      snprintf(l->title, sizeof l->title, "baseline, %d worker%s: %d points", mc->workers[w],
               mc->workers[w] == 1 ? "" : "s", base->n);
      nbase++;
    } else {
      nmissing++;
    }
  }
  /* the baseline's entries: one "no baseline curve" when none is drawn */
  for (int w = 0; w < mc->nw && nbase > 0; w++) {
    if (!mc->have[w]) continue;
    bool drawn = mc->has_base[which][w] &&
                 (!seconds || (mc->base[which][w].has_seconds && mc->base_same_class));
    char text[48];
    snprintf(text, sizeof text, "%s, %d worker%s", drawn ? "baseline" : "no baseline curve",
             mc->workers[w], mc->workers[w] == 1 ? "" : "s");
    legend_add(&c, drawn ? ce_series_colour(w) : NULL, true, text);
  }
  if (nbase == 0 && nmissing > 0) legend_add(&c, NULL, false, "no baseline curve");
  draw_chart(b, &c);
}

/* samples/s against workers, with the ideal line: the 1-worker rate times the workers. */
static void scaling_chart(kiln_strbuf *b, const kiln_ce_result *r, const char *model,
                          const model_curves *mc) {
  double xs[MAX_WORKERS], ys[MAX_WORKERS], ideal_x[2], ideal_y[2];
  int n = 0;
  double one = NAN;
  for (int w = 0; w < mc->nw; w++) {
    double sps = mc->have[w] ? mc->m[w].samples_per_s : NAN;
    for (int i = 0; i < r->nrows; i++) /* the median over the repeats, when there is one */
      if (!strcmp(r->rows[i].model, model) && r->rows[i].workers == mc->workers[w] &&
          !strcmp(r->rows[i].kpi, "samples_per_s") && isfinite(r->rows[i].value))
        sps = r->rows[i].value;
    if (!isfinite(sps)) continue;
    xs[n] = mc->workers[w];
    ys[n++] = sps;
    if (mc->workers[w] == 1) one = sps;
  }
  if (n < 2) return;
  chart c;
  memset(&c, 0, sizeof c);
  snprintf(c.caption, sizeof c.caption, "%s \xc2\xb7 scaling", model);
  c.cls = "scaling";
  c.xname = "workers";
  c.yname = "samples/s";
  chart_line *l = line_add(&c, ce_series_colour(0), "scaling", false, 0);
  l->n = n;
  l->x = xs;
  l->y = ys;
  snprintf(l->title, sizeof l->title, "measured samples/s at %d worker counts", n);
  legend_add(&c, ce_series_colour(0), false, "measured");
  if (isfinite(one)) {
    double wmax = xs[0];
    for (int i = 1; i < n; i++) wmax = fmax(wmax, xs[i]);
    ideal_x[0] = 1;
    ideal_y[0] = one;
    ideal_x[1] = wmax;
    ideal_y[1] = one * wmax;
    l = line_add(&c, IDEAL_GREY, "ideal", true, 0);
    l->n = 2;
    l->x = ideal_x;
    l->y = ideal_y;
    snprintf(l->title, sizeof l->title, "ideal: %.4g samples/s times the workers", one);
    legend_add(&c, IDEAL_GREY, true, "ideal: 1-worker rate x workers");
  }
  draw_chart(b, &c);
}

int ce_report_curves(kiln_strbuf *b, const kiln_ce_result *r, const char *model) {
  model_curves *mc = calloc(1, sizeof *mc);
  if (!mc) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < r->nrows && mc->nw < MAX_WORKERS; i++) {
    const kiln_ce_row *row = &r->rows[i];
    bool seen = false;
    for (int k = 0; k < mc->nw && !seen; k++) seen = mc->workers[k] == row->workers;
    if (!seen && !strcmp(row->model, model)) mc->workers[mc->nw++] = row->workers;
  }
  int nfound = 0;
  for (int w = 0; w < mc->nw; w++) {
    /* a metrics file that cannot be read leaves that worker count out, not the report */
    if (ce_curves_metrics(r->report_dir, model, mc->workers[w], &mc->m[w], &mc->have[w])) {
      mc->have[w] = false;
      kiln_clear_error();
    }
    nfound += mc->have[w];
    if (mc->have[w] && !mc->test_metric) mc->test_metric = ce_test_metric(&mc->m[w]);
  }
  Caffe__CeBaseline *base = NULL;
  char base_class[128] = "";
  if (nfound && r->baseline_dir[0] &&
      kiln_ce_baseline_lookup(r->baseline_dir, r->machine_class, model, &base, base_class,
                              sizeof base_class)) {
    base = NULL; /* an unreadable baseline: its rows say so; the charts go without it */
    kiln_clear_error();
  }
  mc->base_same_class = !strcmp(base_class, r->machine_class);
  const char *metrics[2] = {"train_loss", mc->test_metric};
  for (int k = 0; k < 2; k++)
    for (int w = 0; w < mc->nw && metrics[k]; w++) {
      if (!mc->have[w]) continue;
      ce_curve_from_metrics(&mc->m[w], metrics[k], mc->workers[w], &mc->run[k][w]);
      mc->has_base[k][w] = ce_curve_from_baseline(base, metrics[k], mc->workers[w],
                                                  &mc->base[k][w]);
    }
  if (base) protobuf_c_message_free_unpacked(&base->base, NULL);
  if (nfound == 0) {
    kiln_strbuf_printf(b, "<p class=\"nocurves\"><small>");
    ce_html(b, model);
    kiln_strbuf_printf(b, ": no metrics file in the run folders to draw curves from."
                          "</small></p>\n");
  } else {
    kiln_strbuf_printf(b, "<div class=\"model-curves\">\n");
    for (int seconds = 0; seconds < 2; seconds++)
      for (int k = 0; k < 2; k++)
        if (metrics[k]) convergence_chart(b, model, mc, k, seconds);
    scaling_chart(b, r, model, mc);
    kiln_strbuf_printf(b, "</div>\n");
  }
  for (int w = 0; w < mc->nw; w++)
    if (mc->have[w]) kiln_ce_metrics_free(&mc->m[w]);
  free(mc);
  return KILN_OK;
}
