/* The metrics file (include/kiln/metrics.h): JSON Lines written with stdio, one flushed line per
 * event. Errors are kept rather than dropped so that a run on a full disk cannot end looking
 * complete. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"
#include "kiln/metrics.h"

struct kiln_metrics_file {
  FILE *f;
  char *path;
  int err; /* the first errno of a failed write, or 0 */
  bool created; /* the file did not exist before: close removes it if no event came */
  bool written; /* an event was written (or its write tried) */
};

int kiln_metrics_open(const char *path, kiln_metrics_file **out) {
  *out = NULL;
  if (!path) return KILN_OK;
  KILN_TRY(kiln_check_output(path, KILN_OUTPUT_STREAMED, NULL, 0));
  kiln_metrics_file *m = calloc(1, sizeof *m);
  if (!m || !(m->path = kiln_strdup(path))) {
    free(m);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  struct stat st;
  const bool there = stat(path, &st) == 0, fifo = there && S_ISFIFO(st.st_mode);
  m->created = !there && errno == ENOENT;
  /* Without blocking, so that a FIFO no process reads is refused (ENXIO) rather than waited on;
   * the writes block again, as a stream's do. */
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
  int e = errno;
  if (fd >= 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) m->f = fdopen(fd, "w");
  if (!m->f) {
    if (fd >= 0) e = errno, close(fd);
    int rc = fifo && e == ENXIO
                 ? kiln_errorf(KILN_ERR_IO, "%s: a FIFO that no process reads: the metrics would "
                               "wait for a reader for ever", path)
                 : kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    free(m->path);
    free(m);
    return rc;
  }
  *out = m;
  return KILN_OK;
}

static int failed(const kiln_metrics_file *m) {
  return kiln_errorf(KILN_ERR_IO, "%s: cannot write the metrics: %s", m->path, strerror(m->err));
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

int kiln_metrics_write(kiln_metrics_file *m, const char *event, int iter, double time_ms,
                       int rank, int nfields, const kiln_metric_field *fields) {
  if (!m) return KILN_OK;
  if (m->err) return failed(m);
  m->written = true;
  FILE *f = m->f;
  fprintf(f, "{\"" KILN_MF_EVENT "\":");
  json_string(f, event);
  fprintf(f, ",\"" KILN_MF_ITER "\":%d,\"" KILN_MF_TIME_MS "\":%.3f,\"" KILN_MF_RANK "\":%d",
          iter, time_ms, rank);
  for (int i = 0; i < nfields; i++) {
    bool dup = false;
    for (int j = 0; j < i; j++) dup |= strcmp(fields[i].name, fields[j].name) == 0;
    if (dup) continue;
    fputc(',', f);
    json_string(f, fields[i].name);
    fputc(':', f);
    if (fields[i].text) json_string(f, fields[i].text);
    else if (isfinite(fields[i].value)) fprintf(f, "%.9g", fields[i].value);
    else fputs("null", f);
  }
  fputs("}\n", f);
  if (fflush(f) != 0 || ferror(f)) {
    m->err = errno ? errno : EIO;
    return failed(m);
  }
  return KILN_OK;
}

int kiln_metrics_write_event(kiln_metrics_file *m, const kiln_event *e) {
  if (!m || !strcmp(e->event, KILN_EV_PROGRESS)) return KILN_OK;
  enum { MAX_FIELDS = 80 };
  kiln_metric_field fl[MAX_FIELDS];
  int n = 0;
#define FIELD(NAME, VALUE) fl[n++] = (kiln_metric_field){.name = (NAME), .value = (VALUE)}
  /* only for nets on a device: a host run's files stay as they were */
#define DEVICE_FIELD()                                                   \
  do {                                                                   \
    if (e->peak_device_mb > 0) FIELD(KILN_MF_PEAK_DEVICE_MB, e->peak_device_mb); \
  } while (0)
  if (!strcmp(e->event, KILN_EV_TRAIN)) {
    FIELD(KILN_MF_LOSS, e->loss);
    FIELD(KILN_MF_LR, e->lr);
    FIELD(KILN_MF_SAMPLES_PER_S, e->samples_per_s);
    FIELD(KILN_MF_PEAK_RSS_MB, e->peak_rss_mb);
    DEVICE_FIELD();
    FIELD(KILN_MF_CPU_WAIT_MS, e->cpu_wait_ms);
    /* the train net's outputs on this iteration's batch (an Accuracy layer's, for CE's
     * train_accuracy); its "loss" output is left out, behind the smoothed loss above */
    for (int i = 0; i < e->noutputs && n < MAX_FIELDS - 1; i++)
      FIELD(e->output_names[i], e->output_values[i]);
  } else if (!strcmp(e->event, KILN_EV_TEST)) {
    FIELD(KILN_MF_LOSS, e->loss);
    FIELD(KILN_MF_TEST_NET, e->test_net);
    for (int i = 0; i < e->noutputs && n < MAX_FIELDS - 1; i++)
      FIELD(e->output_names[i], e->output_values[i]);
    FIELD(KILN_MF_PEAK_RSS_MB, e->peak_rss_mb);
    DEVICE_FIELD();
  } else if (!strcmp(e->event, KILN_EV_SNAPSHOT)) {
    FIELD(KILN_MF_PEAK_RSS_MB, e->peak_rss_mb);
    DEVICE_FIELD();
  } else if (!strcmp(e->event, KILN_EV_WORKER)) {
    FIELD(KILN_MF_SAMPLES_PER_S, e->samples_per_s);
    FIELD(KILN_MF_SYNC_MS, e->sync_ms);
    FIELD(KILN_MF_WALL_SAMPLES_PER_S, e->wall_samples_per_s);
    FIELD(KILN_MF_ITERS, (double)e->worker_iters);
  } else if (!strcmp(e->event, KILN_EV_DONE)) {
    FIELD(KILN_MF_PEAK_RSS_MB, e->peak_rss_mb);
    DEVICE_FIELD();
    FIELD(KILN_MF_CPU_WAIT_MS, e->cpu_wait_ms);
  }
#undef DEVICE_FIELD
#undef FIELD
  return kiln_metrics_write(m, e->event, e->iter, e->time_ms, e->rank, n, fl);
}

int kiln_metrics_close(kiln_metrics_file *m) {
  if (!m) return KILN_OK;
  int err = m->err;
  if (fclose(m->f) != 0 && !err) err = errno ? errno : EIO;
  /* A command that failed before its first event (a net that does not build, a missing file)
   * leaves no empty metrics file of its own making under the name. */
  struct stat st;
  if (!m->written && m->created && stat(m->path, &st) == 0 && S_ISREG(st.st_mode) &&
      st.st_size == 0)
    (void)unlink(m->path);
  int rc = KILN_OK;
  if (err) {
    m->err = err;
    rc = failed(m);
  }
  free(m->path);
  free(m);
  return rc;
}
