/* Synchronisation strategies. GRADIENT: the workers' gradients are summed every iteration, so
 * every rank applies the same update to the same parameters (the solver divides by the number
 * of gradients summed, workers x iter_size, after clipping, as one worker with iter_size N
 * would). MODEL and TIME: every worker steps on its own and the solver averages parameters and
 * history through kiln_sync_average every K iterations or T seconds (src/solver/worker_sync.c
 * decides when and with which weights). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/parallel.h"

static const char *const mode_names[] = {"default", "gradient", "model", "time"};
_Static_assert(sizeof mode_names / sizeof mode_names[0] == KILN_SYNC_MODE_COUNT,
               "sync mode names out of step with kiln_sync_mode");

const char *kiln_sync_mode_name(kiln_sync_mode m) {
  return (unsigned)m < KILN_SYNC_MODE_COUNT ? mode_names[m] : "?";
}

/* "K" or "K:W" after "model:", "T" or "T:W" after "time:". */
static int parse_interval(const char *text, const char *arg, bool model, kiln_sync_config *out) {
  char *end;
  errno = 0;
  if (model) {
    long k = strtol(arg, &end, 10);
    if (errno || end == arg || (*end && *end != ':') || k < 1 || k > 1000000000L)
      return kiln_errorf(KILN_ERR_INVALID, "--sync %s: '%s' is not a positive number of iterations",
                         text, arg);
    out->interval_iters = (int)k;
  } else {
    double t = strtod(arg, &end);
    if (errno || end == arg || (*end && *end != ':') || !(t > 0) || !isfinite(t))
      return kiln_errorf(KILN_ERR_INVALID, "--sync %s: '%s' is not a positive number of seconds",
                         text, arg);
    out->interval_seconds = t;
  }
  out->warmup_iters = 0;
  if (*end == ':') {
    const char *w = end + 1;
    errno = 0;
    long v = strtol(w, &end, 10);
    if (errno || end == w || *end || v < 0 || v > 1000000000L)
      return kiln_errorf(KILN_ERR_INVALID,
                         "--sync %s: warm-up '%s' is not a number of iterations (>= 0)", text, w);
    out->warmup_iters = (int)v;
  }
  return KILN_OK;
}

int kiln_sync_parse(const char *text, kiln_sync_config *out) {
  const char *colon = strchr(text, ':');
  size_t head = colon ? (size_t)(colon - text) : strlen(text);
  const char *arg = colon ? colon + 1 : NULL;
  if ((head == 4 && !strncmp(text, "grad", 4)) || (head == 8 && !strncmp(text, "gradient", 8))) {
    if (arg)
      return kiln_errorf(KILN_ERR_INVALID, "--sync %s: gradient sync takes no interval", text);
    out->mode = KILN_SYNC_GRADIENT;
    return KILN_OK;
  }
  bool model = head == 5 && !strncmp(text, "model", 5);
  bool time = head == 4 && !strncmp(text, "time", 4);
  if (!model && !time)
    return kiln_errorf(KILN_ERR_INVALID,
                       "--sync '%s': expected grad, model:K[:W] (every K iterations, after W in "
                       "GRADIENT mode) or time:T[:W] (every T seconds)",
                       text);
  if (!arg || !*arg)
    return kiln_errorf(KILN_ERR_INVALID, "--sync %s: give the interval, as in %s", text,
                       model ? "model:10" : "time:30");
  kiln_sync_config c = *out;
  KILN_TRY(parse_interval(text, arg, model, &c));
  c.mode = model ? KILN_SYNC_MODEL : KILN_SYNC_TIME;
  *out = c;
  return KILN_OK;
}

int kiln_sync_check(const kiln_sync_config *cfg, int nworkers) {
  (void)nworkers; /* one worker has nothing to average with, but the settings must still be sound */
  switch (cfg->mode) {
    case KILN_SYNC_DEFAULT:
    case KILN_SYNC_GRADIENT:
      return KILN_OK;
    case KILN_SYNC_MODEL:
      if (cfg->interval_iters < 1)
        return kiln_errorf(KILN_ERR_INVALID, "sync mode MODEL needs interval_iters >= 1");
      break;
    case KILN_SYNC_TIME:
      if (!(cfg->interval_seconds > 0) || !isfinite(cfg->interval_seconds))
        return kiln_errorf(KILN_ERR_INVALID, "sync mode TIME needs interval_seconds > 0");
      break;
    default:
      return kiln_errorf(KILN_ERR_INVALID, "unknown sync mode %d", (int)cfg->mode);
  }
  if (cfg->warmup_iters < 0)
    return kiln_errorf(KILN_ERR_INVALID, "sync warmup_iters %d must be >= 0", cfg->warmup_iters);
  return KILN_OK;
}

bool kiln_sync_is_local(const kiln_sync_config *cfg, int nworkers, int64_t iter) {
  return nworkers > 1 && (cfg->mode == KILN_SYNC_MODEL || cfg->mode == KILN_SYNC_TIME) &&
         iter >= cfg->warmup_iters;
}

int kiln_sync_gradients(kiln_comm *c, const kiln_sync_config *cfg, float *diff, int64_t n) {
  int rc = kiln_comm_allreduce_sum(c, diff, n, cfg->deterministic);
  if (rc) return kiln_error_context(rc, "gradient sync: ");
  return KILN_OK;
}

int kiln_sync_average(kiln_comm *c, const kiln_sync_config *cfg, float *buf, int64_t n,
                      float weight) {
  if (kiln_comm_size(c) <= 1 || n == 0) return KILN_OK;
  for (int64_t i = 0; i < n; i++) buf[i] *= weight;
  int rc = kiln_comm_allreduce_sum(c, buf, n, cfg->deterministic);
  if (rc) return kiln_error_context(rc, "model average: ");
  return KILN_OK;
}
