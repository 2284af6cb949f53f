/* Convergence curves: what a run's metrics say about training loss and the test figure against
 * iteration and seconds, picked down to at most CE_CURVE_POINTS points each, read from the first
 * repeat's run folder; and the same curves as a baseline keeps them (CeCurve), written by
 * `kiln ce accept` and checked when a baseline is read. The report draws both
 * (report_curves.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ce/internal.h"

int ce_run_file(const char *report_dir, const char *model, int workers, const char *file,
                char *buf, size_t n) {
  if (!report_dir || !*report_dir)
    return kiln_errorf(KILN_ERR_INVALID, "%s x%d: the result names no report folder", model,
                       workers);
  if (snprintf(buf, n, "%s/runs/%s-w%d-r1/%s", report_dir, model, workers, file) >= (int)n)
    return kiln_errorf(KILN_ERR_INVALID, "%s: run folder path too long", report_dir);
  return KILN_OK;
}

int ce_curves_metrics(const char *report_dir, const char *model, int workers,
                      kiln_ce_metrics *m, bool *found) {
  char path[4096];
  memset(m, 0, sizeof *m);
  *found = false;
  if (!report_dir || !*report_dir) return KILN_OK;
  KILN_TRY(ce_run_file(report_dir, model, workers, "metrics.jsonl", path, sizeof path));
  if (access(path, R_OK) != 0) return KILN_OK;
  KILN_TRY(kiln_ce_metrics_read(path, m));
  *found = true;
  return KILN_OK;
}

const char *ce_test_metric(const kiln_ce_metrics *m) {
  if (m->accuracy.n > 0) return "accuracy";
  if (m->f1.n > 0) return "f1";
  if (m->map.n > 0) return "mAP";
  if (m->perplexity.n > 0) return "perplexity";
  return NULL;
}

static const kiln_ce_series *series_of(const kiln_ce_metrics *m, const char *metric) {
  return !strcmp(metric, "train_loss")   ? &m->train_loss
         : !strcmp(metric, "accuracy")   ? &m->accuracy
         : !strcmp(metric, "f1")         ? &m->f1
         : !strcmp(metric, "mAP")        ? &m->map
         : !strcmp(metric, "perplexity") ? &m->perplexity
                                         : NULL;
}

void ce_curve_from_metrics(const kiln_ce_metrics *m, const char *metric, int workers,
                           ce_curve *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->metric, sizeof c->metric, "%s", metric);
  c->workers = workers;
  const kiln_ce_series *s = series_of(m, metric);
  if (!s) return;
  /* the finite points, then evenly spaced ones of them, the first and the last included */
  int finite = 0;
  for (int i = 0; i < s->n; i++) finite += isfinite(s->value[i]) != 0;
  int keep = finite < CE_CURVE_POINTS ? finite : CE_CURVE_POINTS;
  c->has_seconds = keep > 0;
  for (int i = 0, f = 0; i < s->n && c->n < keep; i++) {
    if (!isfinite(s->value[i])) continue;
    long want = keep > 1 ? lround((double)c->n * (finite - 1) / (keep - 1)) : 0;
    if (f++ != want) continue;
    c->iter[c->n] = s->iter[i];
    /* to the millisecond: the metrics' own resolution is finer than a chart needs */
    c->seconds[c->n] = s->time_s ? round(s->time_s[i] * 1e3) / 1e3 : NAN;
    c->has_seconds &= isfinite(c->seconds[c->n]) != 0;
    c->value[c->n++] = s->value[i];
  }
}

bool ce_curve_from_baseline(const Caffe__CeBaseline *b, const char *metric, int workers,
                            ce_curve *c) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; b && i < b->n_curve; i++) {
    const Caffe__CeCurve *k = b->curve[i];
    if (!k->metric || strcmp(k->metric, metric) || k->workers != workers) continue;
    snprintf(c->metric, sizeof c->metric, "%s", metric);
    c->workers = workers;
    c->n = (int)(k->n_iter < CE_CURVE_POINTS ? k->n_iter : CE_CURVE_POINTS);
    c->has_seconds = k->n_seconds == k->n_iter && c->n > 0;
    for (int j = 0; j < c->n; j++) {
      c->iter[j] = k->iter[j];
      c->seconds[j] = c->has_seconds ? k->seconds[j] : NAN;
      c->value[j] = k->value[j];
    }
    return c->n > 0;
  }
  return false;
}

int ce_curve_check(const char *path, const Caffe__CeCurve *c, size_t index) {
  const char *metric = c->metric ? c->metric : "";
  if (strcmp(metric, "train_loss") && strcmp(metric, "accuracy") && strcmp(metric, "f1") &&
      strcmp(metric, "mAP") && strcmp(metric, "perplexity"))
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: curve %zu: metric '%s' is none of train_loss, accuracy, f1, mAP, "
                       "perplexity",
                       path, index + 1, metric);
  if (c->workers < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: curve %zu (%s): workers %d must be >= 1", path,
                       index + 1, metric, c->workers);
  if (c->n_iter == 0 || c->n_iter > CE_CURVE_POINTS || c->n_value != c->n_iter ||
      (c->n_seconds != 0 && c->n_seconds != c->n_iter))
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: curve %zu (%s, %d workers): %zu iter, %zu value and %zu seconds "
                       "entries; it needs 1 to %d iter, as many values and as many seconds or "
                       "none",
                       path, index + 1, metric, c->workers, c->n_iter, c->n_value, c->n_seconds,
                       CE_CURVE_POINTS);
  for (size_t i = 0; i < c->n_iter; i++)
    if (!isfinite(c->value[i]) || (c->n_seconds && !isfinite(c->seconds[i])) ||
        (i > 0 && c->iter[i] < c->iter[i - 1]))
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s: curve %zu (%s, %d workers): point %zu is not finite or goes back "
                         "in iterations",
                         path, index + 1, metric, c->workers, i + 1);
  return KILN_OK;
}

/* A curve as a baseline keeps it; NULL when out of memory. */
static Caffe__CeCurve *to_proto(const ce_curve *c) {
  Caffe__CeCurve *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  caffe__ce_curve__init(k);
  k->metric = strdup(c->metric);
  k->iter = malloc((size_t)c->n * sizeof *k->iter);
  k->value = malloc((size_t)c->n * sizeof *k->value);
  k->seconds = c->has_seconds ? malloc((size_t)c->n * sizeof *k->seconds) : NULL;
  if (!k->metric || !k->iter || !k->value || (c->has_seconds && !k->seconds)) {
    protobuf_c_message_free_unpacked(&k->base, NULL);
    return NULL;
  }
  k->has_workers = 1;
  k->workers = c->workers;
  k->n_iter = k->n_value = (size_t)c->n;
  k->n_seconds = c->has_seconds ? (size_t)c->n : 0;
  for (int i = 0; i < c->n; i++) {
    k->iter[i] = c->iter[i];
    k->value[i] = c->value[i];
    if (c->has_seconds) k->seconds[i] = c->seconds[i];
  }
  return k;
}

/* The baseline's curves with `fresh` in place of those of the same metric and worker count
 * (freed), the others kept before them. Takes `fresh`'s messages; frees them on failure. */
static int merge_curves(Caffe__CeBaseline *b, Caffe__CeCurve **fresh, size_t nfresh) {
  Caffe__CeCurve **all = malloc((b->n_curve + nfresh) * sizeof *all);
  if (!all) {
    for (size_t i = 0; i < nfresh; i++) protobuf_c_message_free_unpacked(&fresh[i]->base, NULL);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  size_t n = 0;
  for (size_t i = 0; i < b->n_curve; i++) {
    const Caffe__CeCurve *old = b->curve[i];
    bool superseded = false;
    for (size_t k = 0; k < nfresh && !superseded; k++)
      superseded = old->metric && !strcmp(old->metric, fresh[k]->metric) &&
                   old->workers == fresh[k]->workers;
    if (superseded) protobuf_c_message_free_unpacked(&b->curve[i]->base, NULL);
    else all[n++] = b->curve[i];
  }
  for (size_t k = 0; k < nfresh; k++) all[n++] = fresh[k];
  free(b->curve);
  b->curve = all;
  b->n_curve = n;
  return KILN_OK;
}

int ce_curves_accept(Caffe__CeBaseline *b, const kiln_ce_result *r, const char *model) {
  enum { MAX_FRESH = 64 };
  Caffe__CeCurve *fresh[MAX_FRESH];
  size_t nfresh = 0;
  int done[MAX_FRESH / 2], ndone = 0, rc = KILN_OK;
  for (int i = 0; i < r->nrows && ndone < MAX_FRESH / 2 && rc == KILN_OK; i++) {
    const kiln_ce_row *row = &r->rows[i];
    bool seen = false;
    for (int k = 0; k < ndone && !seen; k++) seen = done[k] == row->workers;
    if (seen || strcmp(row->model, model) || row->verdict == KILN_CE_SKIP) continue;
    done[ndone++] = row->workers;
    kiln_ce_metrics m;
    bool found;
    rc = ce_curves_metrics(r->report_dir, model, row->workers, &m, &found);
    if (rc || !found) continue; /* a run folder that is gone: the curves kept are kept */
    const char *metrics[2] = {"train_loss", ce_test_metric(&m)};
    for (int k = 0; k < 2 && rc == KILN_OK; k++) {
      if (!metrics[k]) continue;
      ce_curve c;
      ce_curve_from_metrics(&m, metrics[k], row->workers, &c);
      if (c.n == 0) continue;
      if (!(fresh[nfresh] = to_proto(&c))) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      else nfresh++;
    }
    kiln_ce_metrics_free(&m);
  }
  if (rc == KILN_OK) return merge_curves(b, fresh, nfresh);
  for (size_t i = 0; i < nfresh; i++) protobuf_c_message_free_unpacked(&fresh[i]->base, NULL);
  return rc;
}
