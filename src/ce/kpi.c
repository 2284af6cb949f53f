/* CE judgement: the KPI catalogue and its defaults, reductions of a run's series, the absolute
 * checks that need no baseline, the baseline comparison with its noise rule, and the result
 * container the runner fills. Pure functions over numbers, so the unit tests drive them
 * directly. */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ce.h"

/* Default tolerances are deliberately loose for timings (shared machines jitter by several per
 * cent) and tight for accuracy (a fixed seed on one machine gives the same run twice). */
static const kiln_ce_kpi_info kpis[] = {
    {"accuracy", "", true, false, false, false, false, 0, 0.01},
    {"f1", "", true, false, false, false, false, 0, 0.01},
    /* a detection test pass's mean average precision, over every class and image of the pass */
    {"mAP", "", true, false, false, false, false, 0, 0.01},
    {"perplexity", "", false, false, false, false, false, 0.05, 0},
    {"train_loss", "", false, false, false, false, false, 0.10, 0.01},
    /* one batch's figure at each display: noisier than a test pass over many batches */
    {"train_accuracy", "", true, false, false, false, false, 0, 0.02},
    {"test_loss", "", false, false, false, false, false, 0.05, 0.01},
    {"peak_rss_mb", "MB", false, true, false, false, false, 0.10, 8},
    /* a GPU's memory at its peak (the "gpu_memory" KPI of model-evaluation suites): the pool's
     * high-water mark, which a given net and batch reproduce closely */
    {"peak_device_mb", "MB", false, true, false, false, false, 0.05, 4},
    {"duration_s", "s", false, true, true, false, false, 0.15, 0},
    {"samples_per_s", "samples/s", true, true, true, false, false, 0.15, 0},
    {"speedup", "x", true, true, true, true, false, 0.15, 0},
    {"efficiency", "", true, true, true, true, false, 0.15, 0},
    {"per", "", false, false, false, false, true, 0, 0.01},
    {"word_accuracy", "", true, false, false, false, true, 0, 0.01},
};

const kiln_ce_kpi_info *kiln_ce_kpi_lookup(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof kpis / sizeof kpis[0]; i++)
    if (!strcmp(kpis[i].name, name)) return &kpis[i];
  return NULL;
}

const char *kiln_ce_kpi_names(void) {
  return "accuracy, f1, mAP, perplexity, train_loss, train_accuracy, test_loss, peak_rss_mb, "
         "peak_device_mb, "
         "duration_s, samples_per_s, speedup, efficiency, per, word_accuracy";
}

int kiln_ce_kpi_resolve(const Caffe__CeKpi *k, kiln_ce_kpi_spec *out) {
  memset(out, 0, sizeof *out);
  const kiln_ce_kpi_info *info = kiln_ce_kpi_lookup(k->name);
  if (!info)
    return kiln_errorf(KILN_ERR_INVALID, "unknown KPI '%s' (known: %s)", k->name ? k->name : "",
                       kiln_ce_kpi_names());
  out->info = info;
  out->higher_is_better = k->has_direction ? k->direction == CAFFE__CE_KPI__DIRECTION__HIGHER
                                           : info->higher_is_better;
  out->reduction = k->reduction;
  out->mean_last_n = k->mean_last_n;
  if (out->mean_last_n < 1)
    return kiln_errorf(KILN_ERR_INVALID, "KPI '%s': mean_last_n must be at least 1", k->name);
  const struct {
    bool has;
    double v;
    const char *field;
  } nums[] = {{k->has_floor, k->floor, "floor"},
              {k->has_ceiling, k->ceiling, "ceiling"},
              {k->has_rel_tolerance, k->rel_tolerance, "rel_tolerance"},
              {k->has_abs_tolerance, k->abs_tolerance, "abs_tolerance"}};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
    if (nums[i].has && !isfinite(nums[i].v))
      return kiln_errorf(KILN_ERR_INVALID, "KPI '%s': %s %g is not a finite number", k->name,
                         nums[i].field, nums[i].v);
    if (nums[i].has && i >= 2 && nums[i].v < 0)
      return kiln_errorf(KILN_ERR_INVALID, "KPI '%s': %s %g is negative (a tolerance is >= 0)",
                         k->name, nums[i].field, nums[i].v);
  }
  if (k->has_rel_tolerance || k->has_abs_tolerance) {
    out->rel_tolerance = k->has_rel_tolerance ? k->rel_tolerance : 0;
    out->abs_tolerance = k->has_abs_tolerance ? k->abs_tolerance : 0;
  } else {
    out->rel_tolerance = info->default_rel_tolerance;
    out->abs_tolerance = info->default_abs_tolerance;
  }
  out->floor = k->has_floor ? k->floor : !strcmp(info->name, "accuracy") ? 0.5 : NAN;
  out->ceiling = k->has_ceiling ? k->ceiling : NAN;
  if (out->floor > out->ceiling) /* false when either is NaN (not set) */
    return kiln_errorf(KILN_ERR_INVALID, "KPI '%s': floor %g is above ceiling %g: nothing could pass",
                       k->name, out->floor, out->ceiling);
  return KILN_OK;
}

/* ---- statistics --------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double kiln_ce_median(const double *v, int n) {
  if (n <= 0) return NAN;
  double tmp[KILN_CE_MAX_SAMPLES];
  double *s = n <= KILN_CE_MAX_SAMPLES ? tmp : malloc((size_t)n * sizeof *s);
  if (!s) return NAN;
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  if (s != tmp) free(s);
  return m;
}

double kiln_ce_stddev(const double *v, int n) {
  if (n < 2) return 0;
  double mean = 0, ss = 0;
  for (int i = 0; i < n; i++) mean += v[i];
  mean /= n;
  for (int i = 0; i < n; i++) ss += (v[i] - mean) * (v[i] - mean);
  return sqrt(ss / (n - 1));
}

double kiln_ce_reduce(const double *v, int n, int reduction, int mean_last_n,
                      bool higher_is_better) {
  if (n <= 0) return NAN;
  for (int i = 0; i < n; i++)
    if (!isfinite(v[i])) return NAN; /* a NaN anywhere in the run must not be reduced away */
  switch (reduction) {
  case CAFFE__CE_KPI__REDUCTION__BEST: {
    double best = v[0];
    for (int i = 1; i < n; i++)
      if (higher_is_better ? v[i] > best : v[i] < best) best = v[i];
    return best;
  }
  case CAFFE__CE_KPI__REDUCTION__MEAN_LAST: {
    int k = mean_last_n < 1 ? 1 : mean_last_n > n ? n : mean_last_n;
    double s = 0;
    for (int i = n - k; i < n; i++) s += v[i];
    return s / k;
  }
  default: return v[n - 1];
  }
}

/* ---- verdicts ----------------------------------------------------------------------------- */

const char *kiln_ce_verdict_name(kiln_ce_verdict v) {
  static const char *const names[] = {
      [KILN_CE_PASS] = "pass",         [KILN_CE_IMPROVED] = "improved",
      [KILN_CE_NEW] = "new",           [KILN_CE_SKIP] = "skipped",
      [KILN_CE_NA] = "n/a",
      [KILN_CE_REGRESSION] = "regression", [KILN_CE_ERROR] = "error",
      [KILN_CE_FAIL] = "FAIL",
  };
  _Static_assert(sizeof names / sizeof names[0] == KILN_CE_VERDICT_COUNT,
                 "verdict names out of step");
  return (unsigned)v < KILN_CE_VERDICT_COUNT ? names[v] : "?";
}

bool kiln_ce_run_failed(const kiln_ce_child *c, const kiln_ce_metrics *m, char *reason, size_t n) {
  const char *err = c->last_error[0] ? c->last_error : "no error message";
  /* the solver's divergence message ("the loss is nan; training diverged") */
  bool diverged = strstr(c->last_error, "diverged") || strstr(c->last_error, "NaN");
  switch (c->end) {
  case KILN_CE_CHILD_NOT_STARTED:
    snprintf(reason, n, "the training could not be started: %s", err);
    return true;
  case KILN_CE_CHILD_TIMEOUT: {
    char at[48] = "";
    if (m && m->last_iter >= 0) snprintf(at, sizeof at, ", at iteration %d", m->last_iter);
    snprintf(reason, n, "timed out: still training after %.0f s (timeout_seconds %.0f)%s",
             c->wall_s, c->timeout_s, at);
    return true;
  }
  case KILN_CE_CHILD_SIGNALED:
    snprintf(reason, n, "crashed: killed by signal %d (%s)%s%s", c->code, strsignal(c->code),
             c->last_error[0] ? ": " : "", c->last_error);
    return true;
  case KILN_CE_CHILD_EXITED:
    if (c->code != 0) {
      if (diverged || (m && m->nonfinite_iter >= 0))
        snprintf(reason, n, "NaN or infinite loss: %s", err);
      else
        snprintf(reason, n, "kiln train failed (exit %d): %s", c->code, err);
      return true;
    }
    break;
  }
  if (m && m->nonfinite_iter >= 0) {
    snprintf(reason, n, "NaN or infinite loss at iteration %d", m->nonfinite_iter);
    return true;
  }
  if (m && !m->done) {
    snprintf(reason, n, "the metrics end at iteration %d without a \"done\" event", m->last_iter);
    return true;
  }
  return false;
}

bool kiln_ce_decode_failed(const kiln_ce_child *c, const kiln_ce_metrics *d, char *reason,
                           size_t n) {
  const char *err = c->last_error[0] ? c->last_error : "no error message";
  switch (c->end) {
  case KILN_CE_CHILD_NOT_STARTED:
    snprintf(reason, n, "the decode could not be started: %s", err);
    return true;
  case KILN_CE_CHILD_TIMEOUT:
    snprintf(reason, n, "timed out: still decoding after %.0f s (timeout_seconds %.0f)", c->wall_s,
             c->timeout_s);
    return true;
  case KILN_CE_CHILD_SIGNALED:
    snprintf(reason, n, "kiln decode crashed: killed by signal %d (%s)%s%s", c->code,
             strsignal(c->code), c->last_error[0] ? ": " : "", c->last_error);
    return true;
  case KILN_CE_CHILD_EXITED:
    if (c->code != 0) {
      snprintf(reason, n, "kiln decode failed (exit %d): %s", c->code, err);
      return true;
    }
    break;
  }
  if (!d || !d->decoded) {
    snprintf(reason, n, "kiln decode wrote no \"decode\" event to its metrics");
    return true;
  }
  return false;
}

bool kiln_ce_kpi_failed(const kiln_ce_kpi_spec *k, double value, const kiln_ce_run_facts *f,
                        char *reason, size_t n) {
  const char *name = k->info->name;
  if (!isfinite(value)) {
    snprintf(reason, n, "%s is %g", name, value);
    return true;
  }
  if (isfinite(k->floor) && value < k->floor) {
    bool accuracy = !strcmp(name, "accuracy");
    if (accuracy && f && f->reached_iter >= 0 && f->reached_iter < f->planned_iter)
      snprintf(reason, n,
               "the run ended early, at iteration %d of %d, with accuracy %.4g under the floor "
               "%.4g",
               f->reached_iter, f->planned_iter, value, k->floor);
    else if (accuracy && f && isfinite(f->epochs) && f->epochs >= f->min_epochs_learning)
      snprintf(reason, n,
               "after %.1f epochs accuracy %.4g is still under the floor %.4g: the model is not "
               "learning (learning rate, initialisation, labels?)",
               f->epochs, value, k->floor);
    else if (accuracy && f && isfinite(f->epochs) && f->epochs < 0.25)
      snprintf(reason, n,
               "accuracy %.4g is under the floor %.4g after only %d iterations (%.2f epochs): the "
               "run is too short to mean anything",
               value, k->floor, f->reached_iter, f->epochs);
    else
      snprintf(reason, n, "%s %.4g is under the floor %.4g", name, value, k->floor);
    return true;
  }
  if (isfinite(k->ceiling) && value > k->ceiling) {
    snprintf(reason, n, "%s %.4g is above the ceiling %.4g", name, value, k->ceiling);
    return true;
  }
  return false;
}

bool kiln_ce_kpi_not_applicable(const kiln_ce_kpi_info *k, int workers, int cores, char *reason,
                                size_t n) {
  if (!k->timing || cores < 1 || workers <= cores) return false;
  snprintf(reason, n, "%d workers on %d core%s: timing not judged", workers, cores,
           cores == 1 ? "" : "s");
  return true;
}

kiln_ce_verdict kiln_ce_compare(const kiln_ce_kpi_spec *k, double value, double spread,
                                double baseline, double baseline_spread, double noise_k,
                                double *tolerance, double *change, char *reason, size_t n) {
  double declared = fmax(k->rel_tolerance * fabs(baseline), k->abs_tolerance);
  double s = fmax(isfinite(spread) ? spread : 0, isfinite(baseline_spread) ? baseline_spread : 0);
  double noise = noise_k * s;
  double tol = fmax(declared, noise);
  double worse = k->higher_is_better ? baseline - value : value - baseline;
  double rel = baseline != 0 ? (value - baseline) / fabs(baseline) : NAN;
  if (tolerance) *tolerance = tol;
  if (change) *change = rel;
  if (reason && n) reason[0] = '\0';
  char why[160] = "";
  if (noise > declared)
    snprintf(why, sizeof why, " (widened by noise: %g x spread %.3g)", noise_k, s);
  if (worse > tol) {
    if (reason)
      snprintf(reason, n, "%s %.4g is worse than the baseline %.4g by %.3g (%+.1f%%), more than "
               "the tolerance %.3g%s",
               k->info->name, value, baseline, worse, 100 * rel, tol, why);
    return KILN_CE_REGRESSION;
  }
  if (-worse > tol) {
    if (reason)
      snprintf(reason, n, "%s %.4g is better than the baseline %.4g by %.3g (%+.1f%%): "
               "`kiln ce accept` keeps it",
               k->info->name, value, baseline, -worse, 100 * rel);
    return KILN_CE_IMPROVED;
  }
  return KILN_CE_PASS;
}

/* ---- results ------------------------------------------------------------------------------ */

int kiln_ce_result_add_row(kiln_ce_result *r, const kiln_ce_row *row) {
  if (r->nrows == r->cap_rows) {
    int cap = r->cap_rows ? 2 * r->cap_rows : 16;
    kiln_ce_row *nr = realloc(r->rows, (size_t)cap * sizeof *nr);
    if (!nr) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    r->rows = nr;
    r->cap_rows = cap;
  }
  r->rows[r->nrows++] = *row;
  return KILN_OK;
}

void kiln_ce_result_warn(kiln_ce_result *r, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char **nw = realloc(r->warnings, (size_t)(r->nwarnings + 1) * sizeof *nw);
  if (!nw) return;
  r->warnings = nw;
  char *copy = strdup(buf);
  if (copy) r->warnings[r->nwarnings++] = copy;
}

void kiln_ce_result_free(kiln_ce_result *r) {
  free(r->rows);
  for (int i = 0; i < r->nwarnings; i++) free(r->warnings[i]);
  free(r->warnings);
  memset(r, 0, sizeof *r);
}

int kiln_ce_result_exit_code(const kiln_ce_result *r) {
  bool fail = false, error = false, regression = false;
  for (int i = 0; i < r->nrows; i++) {
    fail |= r->rows[i].verdict == KILN_CE_FAIL;
    error |= r->rows[i].verdict == KILN_CE_ERROR;
    regression |= r->rows[i].verdict == KILN_CE_REGRESSION;
  }
  return fail ? 2 : error ? 3 : regression ? 1 : 0;
}
