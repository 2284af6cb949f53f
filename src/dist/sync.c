/* Synchronisation strategies. GRADIENT: the workers' gradients are summed every iteration, so
 * every rank applies the same update to the same parameters (the solver divides by the number
 * of gradients summed, workers x iter_size, after clipping, as one worker with iter_size N
 * would). MODEL and TIME (parameter averaging every K iterations or T seconds) are parsed and
 * checked here so that solver files and command lines can name them; they are not implemented
 * yet and are refused with a clear message. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/dist.h"

static const char *const mode_names[] = {"default", "gradient", "model", "time"};
_Static_assert(sizeof mode_names / sizeof mode_names[0] == KILN_SYNC_MODE_COUNT,
               "sync mode names out of step with kiln_sync_mode");

const char *kiln_sync_mode_name(kiln_sync_mode m) {
  return (unsigned)m < KILN_SYNC_MODE_COUNT ? mode_names[m] : "?";
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
                       "--sync '%s': expected grad, model:K (iterations) or time:T (seconds)", text);
  if (!arg || !*arg)
    return kiln_errorf(KILN_ERR_INVALID, "--sync %s: give the interval, as in %s", text,
                       model ? "model:10" : "time:30");
  char *end;
  errno = 0;
  if (model) {
    long k = strtol(arg, &end, 10);
    if (errno || *end || k < 1 || k > 1000000000L)
      return kiln_errorf(KILN_ERR_INVALID, "--sync %s: '%s' is not a positive number of iterations",
                         text, arg);
    out->mode = KILN_SYNC_MODEL;
    out->interval_iters = (int)k;
  } else {
    double t = strtod(arg, &end);
    if (errno || *end || !(t > 0) || !isfinite(t))
      return kiln_errorf(KILN_ERR_INVALID, "--sync %s: '%s' is not a positive number of seconds",
                         text, arg);
    out->mode = KILN_SYNC_TIME;
    out->interval_seconds = t;
  }
  return KILN_OK;
}

int kiln_sync_check(const kiln_sync_config *cfg, int nworkers) {
  switch (cfg->mode) {
    case KILN_SYNC_DEFAULT:
    case KILN_SYNC_GRADIENT:
      return KILN_OK;
    case KILN_SYNC_MODEL:
      if (cfg->interval_iters < 1)
        return kiln_errorf(KILN_ERR_INVALID, "sync mode MODEL needs interval_iters >= 1");
      break;
    case KILN_SYNC_TIME:
      if (!(cfg->interval_seconds > 0))
        return kiln_errorf(KILN_ERR_INVALID, "sync mode TIME needs interval_seconds > 0");
      break;
    default:
      return kiln_errorf(KILN_ERR_INVALID, "unknown sync mode %d", (int)cfg->mode);
  }
  /* One worker has nothing to average with: any mode trains the same way. */
  if (nworkers <= 1) return KILN_OK;
  return kiln_errorf(KILN_ERR_UNSUPPORTED,
                     "sync mode %s is not implemented yet; use GRADIENT (--sync grad) to train on "
                     "%d workers",
                     cfg->mode == KILN_SYNC_MODEL ? "MODEL" : "TIME", nworkers);
}

int kiln_sync_gradients(kiln_comm *c, const kiln_sync_config *cfg, float *diff, int64_t n) {
  int rc = kiln_comm_allreduce_sum(c, diff, n, cfg->deterministic);
  if (rc) return kiln_error_context(rc, "gradient sync: ");
  return KILN_OK;
}
