/* CE suites (CeSuite in kiln.proto): the file parsed and every model checked before anything
 * runs, so that a misspelt solver, an unknown KPI or a KPI the model cannot have is an error
 * naming the suite file and the model, not a failed row an hour later. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"

enum { MAX_WORKER_COUNTS = 8 };

/* A model's decode entry: the deploy net exists (relative to the suite's folder); the data files
 * are named (they are in the cache, which may be filled only when the model runs). */
static int check_decode(const char *path, const char *dir, const Caffe__CeModel *m) {
  const Caffe__CeDecode *d = m->decode;
  if (!d->model || !*d->model)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': decode: no model (the deploy net)", path,
                       m->name);
  char deploy[4096];
  ce_join(dir, d->model, deploy, sizeof deploy);
  if (access(deploy, R_OK) != 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': decode: model %s: %s", path, m->name,
                       deploy, strerror(errno));
  const char *const files[][2] = {
      {"input", d->input}, {"vocab", d->vocab}, {"target_vocab", d->target_vocab}};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
    if (!files[i][1] || !*files[i][1])
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s: model '%s': decode: no %s (a path in the data set cache)", path,
                         m->name, files[i][0]);
  if (d->beam < 1 || d->beam > 1024)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': decode: beam %d is not in 1..1024", path,
                       m->name, d->beam);
  if (d->limit < 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': decode: limit %d is negative", path,
                       m->name, d->limit);
  return KILN_OK;
}

static int check_model(const char *path, const char *dir, const Caffe__CeModel *m, int index) {
  if (!ce_valid_name(m->name))
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: model %d: name '%s' must be 1 to 63 letters, digits, '_', '-' or '.', "
                       "not starting with '.' (it names the baseline file)",
                       path, index + 1, m->name ? m->name : "");
  if (!m->solver || !*m->solver)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': no solver", path, m->name);
  char solver[4096];
  ce_join(dir, m->solver, solver, sizeof solver);
  if (access(solver, R_OK) != 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': solver %s: %s", path, m->name, solver,
                       strerror(errno));
  if (m->n_workers > MAX_WORKER_COUNTS)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': at most %d worker counts", path, m->name,
                       MAX_WORKER_COUNTS);
  for (size_t w = 0; w < m->n_workers; w++) {
    if (m->workers[w] < 1 || m->workers[w] > 1024)
      return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': workers %d is not in 1..1024", path,
                         m->name, m->workers[w]);
    for (size_t v = 0; v < w; v++)
      if (m->workers[v] == m->workers[w])
        return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': workers %d given twice", path,
                           m->name, m->workers[w]);
  }
  if (m->has_max_iter && m->max_iter < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': max_iter must be positive", path,
                       m->name);
  if (m->has_repeats && (m->repeats < 1 || m->repeats > KILN_CE_MAX_SAMPLES / 2))
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': repeats must be in 1..%d", path, m->name,
                       KILN_CE_MAX_SAMPLES / 2);
  if (m->has_timeout_seconds && m->timeout_seconds < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': timeout_seconds must be positive", path,
                       m->name);
  if (m->has_threads && (m->threads < 1 || m->threads > 1024))
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': threads %d is not in 1..1024", path,
                       m->name, m->threads);
  if (m->has_test_interval && m->test_interval < 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': test_interval %d is negative", path,
                       m->name, m->test_interval);
  if (m->has_test_iter && m->test_iter < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': test_iter must be positive", path,
                       m->name);
  if (m->has_iters_per_epoch && !(m->iters_per_epoch > 0 && isfinite(m->iters_per_epoch)))
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': iters_per_epoch %g must be a positive number",
                       path, m->name, m->iters_per_epoch);
  if (!(m->min_epochs_learning >= 0 && isfinite(m->min_epochs_learning)))
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': min_epochs_learning %g must be >= 0",
                       path, m->name, m->min_epochs_learning);
  if (m->precision && strcmp(m->precision, "fp32") && strcmp(m->precision, "bf16"))
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': precision '%s' is not fp32 or bf16",
                       path, m->name, m->precision);
  if (m->decode) KILN_TRY(check_decode(path, dir, m));
  if (m->n_kpi == 0 || m->n_kpi > CE_MAX_KPIS)
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': give 1 to %d kpi entries", path, m->name,
                       CE_MAX_KPIS);
  for (size_t k = 0; k < m->n_kpi; k++) {
    kiln_ce_kpi_spec spec;
    if (kiln_ce_kpi_resolve(m->kpi[k], &spec))
      return kiln_error_context(KILN_ERR_INVALID, "%s: model '%s': ", path, m->name);
    for (size_t j = 0; j < k; j++)
      if (!strcmp(m->kpi[j]->name, m->kpi[k]->name))
        return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s': KPI '%s' given twice", path, m->name,
                           m->kpi[k]->name);
    if (spec.info->decoded && !m->decode)
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s: model '%s': KPI '%s' comes from `kiln decode`: the model needs a "
                         "decode { model: ... input: ... } entry",
                         path, m->name, m->kpi[k]->name);
  }
  return KILN_OK;
}

int kiln_ce_suite_load(const char *path, Caffe__CeSuite **out) {
  ProtobufCMessage *msg;
  *out = NULL;
  KILN_TRY(kiln_text_parse_file(path, &caffe__ce_suite__descriptor, &msg));
  Caffe__CeSuite *s = (Caffe__CeSuite *)msg;
  char dir[4096];
  ce_dirname(path, dir, sizeof dir);
  int rc = KILN_OK;
  if (s->n_model == 0) rc = kiln_errorf(KILN_ERR_INVALID, "%s: the suite has no model", path);
  if (!rc && (s->repeats < 1 || s->repeats > KILN_CE_MAX_SAMPLES / 2))
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: repeats must be in 1..%d", path,
                     KILN_CE_MAX_SAMPLES / 2);
  if (!rc && !(s->noise_k >= 0))
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: noise_k must be >= 0", path);
  if (!rc && s->timeout_seconds < 1)
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: timeout_seconds must be positive", path);
  for (size_t i = 0; !rc && i < s->n_model; i++) {
    rc = check_model(path, dir, s->model[i], (int)i);
    for (size_t j = 0; !rc && j < i; j++)
      if (!strcmp(s->model[i]->name, s->model[j]->name))
        rc = kiln_errorf(KILN_ERR_INVALID, "%s: model '%s' given twice", path, s->model[i]->name);
  }
  if (rc) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc;
  }
  *out = s;
  return KILN_OK;
}

void kiln_ce_suite_baseline_dir(const Caffe__CeSuite *s, const char *suite_path, char *buf,
                                size_t n) {
  char dir[4096];
  ce_dirname(suite_path, dir, sizeof dir);
  ce_join(dir, s->baseline_dir && *s->baseline_dir ? s->baseline_dir : "baselines", buf, n);
}
