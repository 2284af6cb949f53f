/* Reads the JSON Lines metrics `kiln train --metrics` writes (one flat object per event, written
 * by src/solver/metrics.c under the names of include/kiln/metrics.h) into the series CE reduces
 * to KPIs, and the "decode" event of `kiln decode --metrics`. The stream is the contract between
 * the trainer and everything that judges it; the human log is never parsed. */
#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ce.h"
#include "kiln/metrics.h"

static int series_push(kiln_ce_series *s, int iter, double time_s, double v) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 32;
    int *ni = realloc(s->iter, (size_t)cap * sizeof *ni);
    if (!ni) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->iter = ni;
    double *nv = realloc(s->value, (size_t)cap * sizeof *nv);
    if (!nv) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->value = nv;
    double *nt = realloc(s->time_s, (size_t)cap * sizeof *nt);
    if (!nt) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->time_s = nt;
    s->cap = cap;
  }
  s->iter[s->n] = iter;
  s->time_s[s->n] = time_s;
  s->value[s->n++] = v;
  return KILN_OK;
}

static void series_free(kiln_ce_series *s) {
  free(s->iter);
  free(s->value);
  free(s->time_s);
  memset(s, 0, sizeof *s);
}

void kiln_ce_metrics_free(kiln_ce_metrics *m) {
  series_free(&m->train_loss);
  series_free(&m->train_accuracy);
  series_free(&m->test_loss);
  series_free(&m->accuracy);
  series_free(&m->f1);
  series_free(&m->map);
  series_free(&m->perplexity);
  series_free(&m->window_sps);
  series_free(&m->window_time_ms);
  series_free(&m->window_wait_ms);
}

/* A number field: its value, NaN for null (kiln's spelling of a non-finite figure); `present`
 * tells the two apart from a missing field. */
static double field(const cJSON *o, const char *name, bool *present) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
  if (present) *present = f != NULL && (cJSON_IsNumber(f) || cJSON_IsNull(f));
  return cJSON_IsNumber(f) ? f->valuedouble : NAN;
}

/* Ranks seen, and ranks that sent a "worker" event: small sets (a job has few workers). */
typedef struct {
  int *rank;
  int n;
} rank_set;

static int set_add(rank_set *s, int rank, int *count) {
  for (int i = 0; i < s->n; i++)
    if (s->rank[i] == rank) return KILN_OK;
  int *nr = realloc(s->rank, (size_t)(s->n + 1) * sizeof *nr);
  if (!nr) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  s->rank = nr;
  s->rank[s->n++] = rank;
  *count = s->n;
  return KILN_OK;
}

typedef struct {
  rank_set ranks, workers;
} parse_state;

/* An integer field (an iteration, a rank): `fallback` when missing or null; an error naming the
 * line when it is no whole number in 0..INT_MAX (a damaged file, not a figure to cast). */
static int int_field(const cJSON *o, const char *key, int fallback, const char *name, int line,
                     int *out) {
  double v = field(o, key, NULL);
  *out = fallback;
  if (isnan(v)) return KILN_OK;
  if (!(v >= 0 && v <= INT_MAX && v == floor(v)))
    return kiln_errorf(KILN_ERR_PARSE, "%s:%d: \"%s\" is %g, not a whole number in 0..%d", name,
                       line, key, v, INT_MAX);
  *out = (int)v;
  return KILN_OK;
}

static int handle_event(kiln_ce_metrics *m, const cJSON *o, parse_state *st, const char *name,
                        int line) {
  const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, KILN_MF_EVENT);
  if (!cJSON_IsString(ev)) return KILN_OK; /* not an event of ours: ignored */
  const char *event = ev->valuestring;
  int iter, rank;
  KILN_TRY(int_field(o, KILN_MF_ITER, -1, name, line, &iter));
  KILN_TRY(int_field(o, KILN_MF_RANK, 0, name, line, &rank));
  m->nevents++;
  if (iter > m->last_iter) m->last_iter = iter;
  KILN_TRY(set_add(&st->ranks, rank, &m->nranks));
  if (!strcmp(event, KILN_EV_WORKER)) KILN_TRY(set_add(&st->workers, rank, &m->nworkers_reported));

  bool have;
  double rss = field(o, KILN_MF_PEAK_RSS_MB, &have);
  if (isfinite(rss) && (isnan(m->peak_rss_mb) || rss > m->peak_rss_mb)) m->peak_rss_mb = rss;
  double dev = field(o, KILN_MF_PEAK_DEVICE_MB, &have);
  if (isfinite(dev) && (isnan(m->peak_device_mb) || dev > m->peak_device_mb))
    m->peak_device_mb = dev;

  bool train = !strcmp(event, KILN_EV_TRAIN), test = !strcmp(event, KILN_EV_TEST);
  if (train || test) {
    double loss = field(o, KILN_MF_LOSS, &have);
    if (have && !isfinite(loss) && (m->nonfinite_iter < 0 || iter < m->nonfinite_iter))
      m->nonfinite_iter = iter;
  }
  if (rank != 0) return KILN_OK; /* the figures of the model come from rank 0 */
  double time_ms = field(o, KILN_MF_TIME_MS, NULL), t = time_ms / 1e3; /* NaN when missing */
  if (train) {
    double loss = field(o, KILN_MF_LOSS, &have);
    if (have) KILN_TRY(series_push(&m->train_loss, iter, t, loss));
    double acc = field(o, KILN_MF_ACCURACY, &have);
    if (have) KILN_TRY(series_push(&m->train_accuracy, iter, t, acc));
    double sps = field(o, KILN_MF_SAMPLES_PER_S, &have);
    if (have) {
      KILN_TRY(series_push(&m->window_sps, iter, t, sps));
      KILN_TRY(series_push(&m->window_time_ms, iter, t, time_ms));
      KILN_TRY(series_push(&m->window_wait_ms, iter, t, field(o, KILN_MF_CPU_WAIT_MS, NULL)));
    }
  } else if (test) {
    double net = field(o, KILN_MF_TEST_NET, &have);
    if (have && net != 0) return KILN_OK;
    double loss = field(o, KILN_MF_LOSS, &have);
    if (have) {
      KILN_TRY(series_push(&m->test_loss, iter, t, loss));
      bool hp;
      double ppl = field(o, KILN_MF_PERPLEXITY, &hp);
      KILN_TRY(series_push(&m->perplexity, iter, t, hp ? ppl : exp(loss)));
    }
    double acc = field(o, KILN_MF_ACCURACY, &have);
    if (have) KILN_TRY(series_push(&m->accuracy, iter, t, acc));
    double f1 = field(o, KILN_MF_F1, &have);
    if (have) KILN_TRY(series_push(&m->f1, iter, t, f1));
    double map = field(o, KILN_MF_MAP, &have);
    if (have) KILN_TRY(series_push(&m->map, iter, t, map));
  } else if (!strcmp(event, KILN_EV_DECODE)) {
    int words;
    KILN_TRY(int_field(o, KILN_MF_WORDS, 0, name, line, &words));
    m->decoded = true;
    m->per = field(o, KILN_MF_PER, NULL);
    m->word_accuracy = field(o, KILN_MF_WORD_ACCURACY, NULL);
    m->decode_words = words;
  } else if (!strcmp(event, KILN_EV_DONE)) {
    m->done = true;
    m->duration_s = t;
    m->cpu_wait_s = field(o, KILN_MF_CPU_WAIT_MS, NULL) / 1e3;
  }
  return KILN_OK;
}

int kiln_ce_metrics_parse(const char *text, size_t len, const char *name, kiln_ce_metrics *out) {
  memset(out, 0, sizeof *out);
  out->peak_rss_mb = NAN;
  out->peak_device_mb = NAN;
  out->duration_s = NAN;
  out->samples_per_s = NAN;
  out->cpu_wait_s = NAN;
  out->last_iter = -1;
  out->nonfinite_iter = -1;
  out->per = NAN;
  out->word_accuracy = NAN;
  parse_state st;
  memset(&st, 0, sizeof st);
  int rc = KILN_OK, line = 0;
  size_t pos = 0;
  while (pos < len && rc == KILN_OK) {
    const char *start = text + pos;
    const char *nl = memchr(start, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - start) : len - pos;
    pos += n + (nl ? 1 : 0);
    line++;
    size_t b = 0;
    while (b < n && (start[b] == ' ' || start[b] == '\t' || start[b] == '\r')) b++;
    if (b == n) continue;
    cJSON *o = cJSON_ParseWithLength(start, n);
    if (!o || !cJSON_IsObject(o)) {
      cJSON_Delete(o);
      /* A writer killed mid-line leaves a cut-off last line. */
      if (pos >= len) {
        out->truncated_tail = true;
        break;
      }
      rc = kiln_errorf(KILN_ERR_PARSE, "%s:%d: not a JSON object", name, line);
      break;
    }
    rc = handle_event(out, o, &st, name, line);
    cJSON_Delete(o);
  }
  if (rc == KILN_OK && out->window_sps.n > 0) {
    /* The first display window holds the start-up (allocation, first data reads), so it is
     * left out when there are later ones. */
    int skip = out->window_sps.n > 1 ? 1 : 0;
    out->samples_per_s = kiln_ce_median(out->window_sps.value + skip, out->window_sps.n - skip);
  }
  out->wall_duration_s = out->duration_s;
  out->wall_samples_per_s = out->samples_per_s;
  free(st.ranks.rank);
  free(st.workers.rank);
  if (rc != KILN_OK) kiln_ce_metrics_free(out);
  return rc;
}

int kiln_ce_metrics_read(const char *path, kiln_ce_metrics *out) {
  char *text;
  size_t len;
  memset(out, 0, sizeof *out);
  KILN_TRY(kiln_read_file(path, &text, &len));
  int rc = kiln_ce_metrics_parse(text, len, path, out);
  free(text);
  return rc;
}

void kiln_ce_metrics_discount_wait(kiln_ce_metrics *m, double others_cpu_s) {
  m->duration_s = m->wall_duration_s;
  m->samples_per_s = m->wall_samples_per_s;
  m->discounted_wait_s = 0;
  double wait = m->cpu_wait_s;
  if (!(wait > 0) || !(others_cpu_s > 0) || !isfinite(others_cpu_s)) return;
  /* Waiting for a CPU is the machine's doing only as far as other processes used CPUs
   * meanwhile; the rest the trainer did to itself. */
  double share = fmin(1, others_cpu_s / wait);
  m->discounted_wait_s = share * wait;
  if (isfinite(m->duration_s))
    m->duration_s = fmax(m->duration_s - m->discounted_wait_s, 0.01 * m->duration_s);
  int n = m->window_sps.n, skip = n > 1 ? 1 : 0;
  if (n == 0) return;
  double *adjusted = malloc((size_t)n * sizeof *adjusted);
  if (!adjusted) return; /* the wall-clock median stays */
  for (int i = skip; i < n; i++) {
    double sps = m->window_sps.value[i];
    adjusted[i - skip] = sps;
    if (i == 0) continue;
    double dt = m->window_time_ms.value[i] - m->window_time_ms.value[i - 1];
    double dw = share * (m->window_wait_ms.value[i] - m->window_wait_ms.value[i - 1]);
    if (!(dt > 0) || !(dw > 0) || !isfinite(dw)) continue;
    adjusted[i - skip] = sps * dt / fmax(dt - dw, 0.01 * dt);
  }
  m->samples_per_s = kiln_ce_median(adjusted, n - skip);
  free(adjusted);
}

double kiln_ce_kpi_value(const kiln_ce_metrics *m, const kiln_ce_kpi_spec *k) {
  const char *name = k->info->name;
  const kiln_ce_series *s = !strcmp(name, "accuracy")     ? &m->accuracy
                            : !strcmp(name, "f1")         ? &m->f1
                            : !strcmp(name, "mAP")        ? &m->map
                            : !strcmp(name, "perplexity") ? &m->perplexity
                            : !strcmp(name, "train_loss") ? &m->train_loss
                            : !strcmp(name, "train_accuracy") ? &m->train_accuracy
                            : !strcmp(name, "test_loss")  ? &m->test_loss
                                                          : NULL;
  if (s) return kiln_ce_reduce(s->value, s->n, k->reduction, k->mean_last_n, k->higher_is_better);
  if (!strcmp(name, "peak_rss_mb")) return m->peak_rss_mb;
  if (!strcmp(name, "peak_device_mb")) return m->peak_device_mb;
  if (!strcmp(name, "duration_s")) return m->duration_s;
  if (!strcmp(name, "samples_per_s")) return m->samples_per_s;
  if (!strcmp(name, "per")) return m->per;
  if (!strcmp(name, "word_accuracy")) return m->word_accuracy;
  return NAN;
}

void kiln_ce_metrics_take_decode(kiln_ce_metrics *m, const kiln_ce_metrics *decode) {
  m->decoded = decode->decoded;
  m->per = decode->per;
  m->word_accuracy = decode->word_accuracy;
  m->decode_words = decode->decode_words;
}
