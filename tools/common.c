/* Option parsing, error reporting, metrics JSON Lines and the progress line for the tools. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

int tool_fail(const char *what) {
  fprintf(stderr, "kiln: %s: %s\n", what, kiln_last_error());
  return 1;
}

bool tool_parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0) return false;
  double mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return false;
  *out = (uint64_t)(v * mult);
  return true;
}

bool tool_parse_int(const char *s, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < -2147483647L || v > 2147483647L) return false;
  *out = (int)v;
  return true;
}

int tool_common_option(tool_common *c, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  bool known = !strcmp(a, "--metrics") || !strcmp(a, "--threads") || !strcmp(a, "--max-memory");
  if (!known) return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "kiln: %s needs a value\n", a);
    return -1;
  }
  const char *v = argv[++*i];
  if (!strcmp(a, "--metrics")) {
    c->metrics = v;
  } else if (!strcmp(a, "--threads")) {
    if (!tool_parse_int(v, &c->threads) || c->threads < 1) {
      fprintf(stderr, "kiln: --threads: '%s' is not a positive integer\n", v);
      return -1;
    }
    kiln_set_num_threads(c->threads);
  } else if (!tool_parse_size(v, &c->max_memory) || c->max_memory == 0) {
    fprintf(stderr, "kiln: --max-memory: '%s' is not a size (e.g. 512M, 4G)\n", v);
    return -1;
  }
  return 1;
}

int tool_metrics_open(tool_metrics *m, const char *path) {
  memset(m, 0, sizeof *m);
  m->tty = isatty(STDERR_FILENO);
  if (!path) return KILN_OK;
  m->f = fopen(path, "w");
  if (!m->f) return kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  return KILN_OK;
}

void tool_metrics_close(tool_metrics *m) {
  if (m->f) fclose(m->f);
  m->f = NULL;
}

void tool_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void json_number(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.9g", v);
  else fputs("null", f); /* JSON has no NaN; readers see a missing figure */
}

void tool_metrics_write(tool_metrics *m, const char *event, int iter, double time_ms,
                        int nfields, const char *const *names, const double *values) {
  if (!m->f) return;
  fprintf(m->f, "{\"event\":");
  tool_json_string(m->f, event);
  fprintf(m->f, ",\"iter\":%d,\"time_ms\":%.3f,\"rank\":%d", iter, time_ms, m->rank);
  for (int i = 0; i < nfields; i++) {
    bool dup = false;
    for (int j = 0; j < i; j++) dup |= strcmp(names[i], names[j]) == 0;
    if (dup) continue;
    fputc(',', m->f);
    tool_json_string(m->f, names[i]);
    fputc(':', m->f);
    json_number(m->f, values[i]);
  }
  fputs("}\n", m->f);
  fflush(m->f);
}

static void eta_string(double seconds, char *buf, size_t n) {
  if (!isfinite(seconds) || seconds < 0) {
    snprintf(buf, n, "?");
    return;
  }
  long s = (long)seconds;
  if (s >= 3600) snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
  else snprintf(buf, n, "%lds", s);
}

void tool_on_event(const kiln_event *e, void *user) {
  tool_metrics *m = user;
  const char *names[80];
  double values[80];
  int n = 0;
  if (!strcmp(e->event, "progress")) {
    if (!m->tty) return;
    double now = kiln_now_ms();
    if (now - m->last_progress_ms < 200 && e->iter != e->max_iter) return;
    m->last_progress_ms = now;
    char eta[32];
    double per_iter_s = e->iter > 0 ? e->time_ms / 1e3 / e->iter : NAN;
    eta_string(per_iter_s * (e->max_iter - e->iter), eta, sizeof eta);
    fprintf(stderr, "\r\033[Kiter %d/%d  loss %.4f  %.0f samples/s  ETA %s", e->iter, e->max_iter,
            e->loss, e->samples_per_s, eta);
    fflush(stderr);
    return;
  }
  if (m->tty) fprintf(stderr, "\r\033[K");
  if (!strcmp(e->event, "train")) {
    names[n] = "loss", values[n++] = e->loss;
    names[n] = "lr", values[n++] = e->lr;
    names[n] = "samples_per_s", values[n++] = e->samples_per_s;
    names[n] = "peak_rss_mb", values[n++] = e->peak_rss_mb;
    names[n] = "cpu_wait_ms", values[n++] = e->cpu_wait_ms;
    if (!m->tty)
      fprintf(stderr, "iter %d  loss %.4f  lr %.6g  %.0f samples/s\n", e->iter, e->loss, e->lr,
              e->samples_per_s);
  } else if (!strcmp(e->event, "test")) {
    names[n] = "loss", values[n++] = e->loss;
    names[n] = "test_net", values[n++] = e->test_net;
    fprintf(stderr, "iter %d  test net %d:", e->iter, e->test_net);
    for (int i = 0; i < e->noutputs && n < 78; i++) {
      names[n] = e->output_names[i], values[n++] = e->output_values[i];
      fprintf(stderr, "  %s = %.4f", e->output_names[i], e->output_values[i]);
    }
    fputc('\n', stderr);
    names[n] = "peak_rss_mb", values[n++] = e->peak_rss_mb;
  } else if (!strcmp(e->event, "snapshot")) {
    fprintf(stderr, "iter %d  snapshot %s\n", e->iter, e->path);
    names[n] = "peak_rss_mb", values[n++] = e->peak_rss_mb;
  } else if (!strcmp(e->event, "worker")) {
    /* One line per worker: the slowest sets the pace, and its peers wait in the sync. */
    names[n] = "samples_per_s", values[n++] = e->samples_per_s;
    names[n] = "sync_ms", values[n++] = e->sync_ms;
    names[n] = "wall_samples_per_s", values[n++] = e->wall_samples_per_s;
    names[n] = "iters", values[n++] = (double)e->worker_iters;
    fprintf(stderr,
            "worker %d of %d: %lld iterations, %.0f samples/s computing, %.0f counting %.1f s "
            "waiting in sync\n",
            e->rank, e->nworkers, (long long)e->worker_iters, e->samples_per_s,
            e->wall_samples_per_s, e->sync_ms / 1e3);
  } else if (!strcmp(e->event, "done")) {
    names[n] = "peak_rss_mb", values[n++] = e->peak_rss_mb;
    names[n] = "cpu_wait_ms", values[n++] = e->cpu_wait_ms;
    fprintf(stderr, "done at iteration %d in %.1f s, peak RSS %.1f MB\n", e->iter, e->time_ms / 1e3,
            e->peak_rss_mb);
  }
  int own_rank = m->rank;
  m->rank = e->rank; /* the worker the figures describe */
  tool_metrics_write(m, e->event, e->iter, e->time_ms, n, names, values);
  m->rank = own_rank;
}
