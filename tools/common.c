/* Option parsing, error reporting, metrics JSON Lines and the progress line for the tools. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
  /* NaN, infinity and sizes past 2^64 bytes are no size (and no defined conversion) */
  if (!(v * mult < 18446744073709551616.0)) return false;
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

bool tool_int_option(const char *cmd, const char *opt, const char *v, long long lo, long long hi,
                     long long *out) {
  const char *d = v + (*v == '+' || *v == '-');
  bool digits = *d != '\0';
  for (; *d && digits; d++) digits = *d >= '0' && *d <= '9';
  char *end;
  errno = 0;
  long long n = digits ? strtoll(v, &end, 10) : 0;
  const char *sep = cmd ? " " : "", *name = cmd ? cmd : "";
  if (!digits) {
    fprintf(stderr, "kiln%s%s: %s: '%s' is not a whole number (%s takes %lld to %lld)\n", sep,
            name, opt, v, opt, lo, hi);
    return false;
  }
  if (errno == ERANGE || n < lo || n > hi) {
    fprintf(stderr, "kiln%s%s: %s: '%s' is out of range: %s takes %lld to %lld\n", sep, name, opt,
            v, opt, lo, hi);
    return false;
  }
  *out = n;
  return true;
}

bool tool_int_option_int(const char *cmd, const char *opt, const char *v, int lo, int hi,
                         int *out) {
  long long n;
  if (!tool_int_option(cmd, opt, v, lo, hi, &n)) return false;
  *out = (int)n;
  return true;
}

bool tool_nonempty(const char *cmd, const char *what, const char *v) {
  if (v[0]) return true;
  if (what[0] == '-')
    fprintf(stderr, "kiln%s%s: %s: the value is empty\n", cmd ? " " : "", cmd ? cmd : "", what);
  else
    fprintf(stderr, "kiln%s%s: %s is empty\n", cmd ? " " : "", cmd ? cmd : "", what);
  return false;
}

int tool_unexpected(const char *cmd, const char *arg) {
  fprintf(stderr, "kiln %s: unexpected %sargument '%s' (see kiln %s --help)\n", cmd,
          arg[0] ? "" : "empty ", arg, cmd);
  return 2;
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
    if (!tool_nonempty(NULL, a, v)) return -1;
    c->metrics = v;
  } else if (!strcmp(a, "--threads")) {
    if (!tool_int_option_int(NULL, a, v, 1, TOOL_MAX_THREADS, &c->threads)) return -1;
    kiln_set_num_threads(c->threads);
  } else if (!tool_parse_size(v, &c->max_memory) || c->max_memory == 0) {
    fprintf(stderr, "kiln: --max-memory: '%s' is not a size of 1 byte to 16E (e.g. 512M, 4G)\n",
            v);
    return -1;
  }
  return 1;
}

int tool_option_value(const char *cmd, const char *const *names, void (*usage)(FILE *f),
                      tool_common *c, int argc, char **argv, int *i, const char **opt,
                      const char **val) {
  if (tool_is_help(argv[*i])) tool_help(usage);
  int r = tool_common_option(c, argc, argv, i);
  if (r) return r < 0 ? -1 : 0;
  *opt = argv[*i];
  if ((*opt)[0] != '-') { /* these commands take options only */
    tool_unexpected(cmd, *opt);
    return -1;
  }
  bool known = false;
  for (const char *const *n = names; *n && !known; n++) known = !strcmp(*n, *opt);
  if (!known) {
    fprintf(stderr, "kiln %s: unknown option '%s' (see kiln %s --help)\n", cmd, *opt, cmd);
    return -1;
  }
  if (*i + 1 >= argc) {
    fprintf(stderr, "kiln %s: %s needs a value\n", cmd, *opt);
    return -1;
  }
  *val = argv[++*i];
  return tool_nonempty(cmd, *opt, *val) ? 1 : -1;
}

bool tool_is_help(const char *arg) { return !strcmp(arg, "--help") || !strcmp(arg, "-h"); }

_Noreturn void tool_help(void (*usage)(FILE *f)) {
  usage(stdout);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "kiln: writing the help: %s\n", strerror(errno));
    exit(1);
  }
  exit(0);
}

void tool_common_usage(FILE *f, const char *metrics) {
  if (metrics)
    fprintf(f, "  --metrics FILE         write the events (%s) as JSON Lines\n", metrics);
  fprintf(f, "  --threads N            threads for kernels and BLAS (default: OMP_NUM_THREADS, else\n"
             "                         every core)\n"
             "  --max-memory SIZE      refuse a net that needs more memory than SIZE (e.g. 512M, 4G;\n"
             "                         default: the memory available)\n");
}

void tool_help_usage(FILE *f) { fprintf(f, "  -h, --help             print this help and exit\n"); }

/* The metrics file may not be an input: opening it truncates it before the input is read. */
static int check_metrics_path(const char *path, const char *const *inputs, size_t n) {
  for (size_t i = 0; path && i < n; i++) {
    struct stat st;
    if (!inputs[i]) continue;
    if (stat(inputs[i], &st) == 0 || !strchr(inputs[i], ',')) {
      KILN_TRY(kiln_check_output(path, KILN_OUTPUT_STREAMED, &inputs[i], 1));
      continue;
    }
    char *list = kiln_strdup(inputs[i]); /* kiln train's --weights A,B */
    if (!list) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    int rc = KILN_OK;
    char *save = NULL;
    for (char *w = strtok_r(list, ",", &save); w && !rc; w = strtok_r(NULL, ",", &save)) {
      const char *one = w;
      rc = kiln_check_output(path, KILN_OUTPUT_STREAMED, &one, 1);
    }
    free(list);
    KILN_TRY(rc);
  }
  return KILN_OK;
}

int tool_metrics_open(tool_metrics *m, const char *path, const char *const *inputs, size_t n) {
  memset(m, 0, sizeof *m);
  m->tty = isatty(STDERR_FILENO);
  KILN_TRY(check_metrics_path(path, inputs, n));
  return kiln_metrics_open(path, &m->file);
}

/* The first failed write is said at once (training goes on; the exit status tells). */
static void metrics_result(tool_metrics *m, int rc) {
  if (rc && !m->failed) {
    m->failed = true;
    fprintf(stderr, "%skiln: metrics: %s\n", m->tty ? "\r\033[K" : "", kiln_last_error());
  }
}

int tool_metrics_close(tool_metrics *m) {
  metrics_result(m, kiln_metrics_close(m->file));
  m->file = NULL;
  return m->failed ? -1 : 0;
}

void tool_metrics_write(tool_metrics *m, const char *event, int iter, double time_ms,
                        int nfields, const kiln_metric_field *fields) {
  metrics_result(m, kiln_metrics_write(m->file, event, iter, time_ms, m->rank, nfields, fields));
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
  if (!strcmp(e->event, KILN_EV_PROGRESS)) {
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
  if (!strcmp(e->event, KILN_EV_TRAIN)) {
    if (!m->tty)
      fprintf(stderr, "iter %d  loss %.4f  lr %.6g  %.0f samples/s\n", e->iter, e->loss, e->lr,
              e->samples_per_s);
  } else if (!strcmp(e->event, KILN_EV_TEST)) {
    fprintf(stderr, "iter %d  test net %d:", e->iter, e->test_net);
    for (int i = 0; i < e->noutputs; i++)
      fprintf(stderr, "  %s = %.4f", e->output_names[i], e->output_values[i]);
    fputc('\n', stderr);
  } else if (!strcmp(e->event, KILN_EV_SNAPSHOT)) {
    fprintf(stderr, "iter %d  snapshot %s\n", e->iter, e->path);
  } else if (!strcmp(e->event, KILN_EV_WORKER)) {
    /* One line per worker: the slowest sets the pace, and its peers wait in the sync. */
    fprintf(stderr,
            "worker %d of %d: %lld iterations, %.0f samples/s computing, %.0f counting %.1f s "
            "waiting in sync\n",
            e->rank, e->nworkers, (long long)e->worker_iters, e->samples_per_s,
            e->wall_samples_per_s, e->sync_ms / 1e3);
  } else if (!strcmp(e->event, KILN_EV_DONE)) {
    fprintf(stderr, "done at iteration %d in %.1f s, peak RSS %.1f MB", e->iter, e->time_ms / 1e3,
            e->peak_rss_mb);
    if (e->peak_device_mb > 0) fprintf(stderr, ", peak device memory %.1f MB", e->peak_device_mb);
    fputc('\n', stderr);
  }
  metrics_result(m, kiln_metrics_write_event(m->file, e));
}

int tool_load_net(const char *model, int phase, const char *const *stages, int nstages,
                  uint64_t max_memory, bool share_data, kiln_net **net, ProtobufCMessage **msg) {
  return tool_load_net_edited(model, phase, stages, nstages, max_memory, share_data, NULL, NULL,
                              net, msg);
}

int tool_load_net_edited(const char *model, int phase, const char *const *stages, int nstages,
                         uint64_t max_memory, bool share_data, tool_net_edit edit, void *user,
                         kiln_net **net, ProtobufCMessage **msg) {
  kiln_config cfg; /* copied into the net */
  *net = NULL;
  *msg = NULL;
  KILN_TRY(kiln_config_from_env(&cfg));
  KILN_TRY(kiln_text_parse_file(model, &caffe__net_parameter__descriptor, msg));
  int rc = kiln_net_param_upgrade((Caffe__NetParameter *)*msg, model, NULL);
  if (!rc && edit) rc = edit((Caffe__NetParameter *)*msg, user);
  if (!rc) {
    kiln_net_options o = {.phase = phase, .seed = 1701, .max_memory = max_memory,
                          .source = model, .share_diffs = true, .share_data = share_data,
                          .config = &cfg,
                          .stages = stages, .nstages = nstages};
    rc = kiln_net_create((Caffe__NetParameter *)*msg, &o, net);
  }
  if (rc) {
    protobuf_c_message_free_unpacked(*msg, NULL);
    *msg = NULL;
  }
  return rc;
}

void tool_free_net(kiln_net *net, ProtobufCMessage *msg) {
  kiln_net_free(net);
  if (msg) protobuf_c_message_free_unpacked(msg, NULL);
}
