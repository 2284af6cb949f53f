/* The CE runner: runs a suite (read and checked in suite.c), training each model as a child
 * `kiln train` process (under `mpirun -np N` for N workers) in its own run folder with a
 * timeout, so a crash, a hang or a divergence is a recorded failure and never takes the harness
 * down; for a model with a decode entry, `kiln decode` of the final weights follows as a second
 * child. It turns the metrics of each repeat into KPI samples, judges them (absolute checks,
 * then the baseline), and re-runs a configuration once when a timing KPI looks like a
 * regression, to tell noise from a real slowdown. Timings leave out the time the trainer waited
 * for a CPU that other processes held (see kiln_ce_metrics_discount_wait), so a busy machine is
 * not taken for a slower kiln. The child processes themselves (fork, exec, process groups,
 * timeouts) are in child.c. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"
#include "kiln/data.h"

enum { MAX_KPIS = CE_MAX_KPIS, DEFAULT_SEED = 1701 };

/* The child is this same executable, so whether it can train on several workers is known when
 * it is built: without MPI, `mpirun -np N kiln train` would run N separate trainings. */
#ifdef KILN_HAVE_MPI
static const bool kiln_ce_mpi_built = true;
#else
static const bool kiln_ce_mpi_built = false;
#endif

/* ---- the solver as run ---------------------------------------------------------------------- */

typedef struct prepared {
  char *solver_text;       /* the derived solver; the run folder's solver.prototxt */
  char config_hash[17];
  int max_iter;
  int64_t seed;
  char decode_model[4096]; /* the decode entry's deploy net, absolute; "" without one */
} prepared;

/* Caffe's (and kiln's) rule for a net path: as given, else relative to the solver's folder. The
 * child runs in its run folder, so the path is made absolute here. */
static int absolute_net_path(char **slot, const char *solver_dir) {
  if (!*slot || !**slot || (*slot)[0] == '/') return KILN_OK;
  char joined[4096], real[PATH_MAX];
  const char *use = *slot;
  if (access(*slot, R_OK) != 0) {
    ce_join(solver_dir, *slot, joined, sizeof joined);
    use = joined;
  }
  char *abs = realpath(use, real) ? strdup(real) : strdup(use);
  if (!abs) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  free(*slot);
  *slot = abs;
  return KILN_OK;
}

static void hash_file(kiln_sha256_ctx *c, const char *path) {
  char *text;
  size_t len;
  if (!path || kiln_read_file(path, &text, &len)) return;
  kiln_sha256_update(c, text, len);
  free(text);
}

/* `decode_model`: the model's decode net (its decode entry resolved), NULL without one. */
static int prepare_solver(const char *solver_path, const Caffe__CeModel *m,
                          const char *decode_model, prepared *p) {
  memset(p, 0, sizeof *p);
  if (decode_model) ce_fmt(p->decode_model, sizeof p->decode_model, "%s", decode_model);
  ProtobufCMessage *msg;
  KILN_TRY(kiln_text_parse_file(solver_path, &caffe__solver_parameter__descriptor, &msg));
  Caffe__SolverParameter *sp = (Caffe__SolverParameter *)msg;
  char dir[4096];
  ce_dirname(solver_path, dir, sizeof dir);
  int rc = KILN_OK;
  if (m->has_max_iter) {
    sp->has_max_iter = 1;
    sp->max_iter = m->max_iter;
  }
  if (!rc && m->has_test_interval) {
    sp->has_test_interval = 1;
    sp->test_interval = m->test_interval;
  }
  if (!rc && m->has_test_iter) {
    if (sp->n_test_iter == 0) {
      int32_t *t = malloc(sizeof *t);
      if (!t) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      else {
        free(sp->test_iter);
        sp->test_iter = t;
        sp->n_test_iter = 1;
      }
    }
    for (size_t i = 0; !rc && i < sp->n_test_iter; i++) sp->test_iter[i] = m->test_iter;
  }
  if (!rc && m->has_random_seed) {
    sp->has_random_seed = 1;
    sp->random_seed = m->random_seed;
  }
  if (!rc) {
    /* CE needs no weights, only figures: no snapshots but, for a model judged by decoding, the
     * final weights (in the run folder, where the child runs), and a display interval so that
     * train loss and throughput reach the metrics. */
    sp->has_snapshot = 1;
    sp->snapshot = 0;
    sp->has_snapshot_after_train = 1;
    sp->snapshot_after_train = m->decode != NULL;
    if (m->decode) {
      sp->has_snapshot_format = 1;
      sp->snapshot_format = CAFFE__SOLVER_PARAMETER__SNAPSHOT_FORMAT__BINARYPROTO;
    }
    char *prefix = strdup("snapshot");
    if (!prefix) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    else {
      free(sp->snapshot_prefix);
      sp->snapshot_prefix = prefix;
    }
    if (!sp->has_display || sp->display <= 0 || sp->display > sp->max_iter / 10) {
      /* at least ten windows: the throughput median and the loss reductions need several */
      sp->has_display = 1;
      sp->display = sp->max_iter >= 10 ? sp->max_iter / 10 : 1;
    }
  }
  p->max_iter = sp->max_iter;
  p->seed = sp->has_random_seed && sp->random_seed >= 0 ? sp->random_seed : DEFAULT_SEED;
  char *text = NULL, *hashed = NULL;
  if (!rc && sp->max_iter < 1)
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: max_iter is %d: nothing to train", solver_path,
                     sp->max_iter);
  /* The hash sees the net paths as the solver wrote them, so that two checkouts of one commit
   * in different folders have one config hash; the net files' contents are hashed below. */
  if (!rc) rc = kiln_text_format(&sp->base, &hashed);
  if (!rc) rc = absolute_net_path(&sp->net, dir);
  if (!rc) rc = absolute_net_path(&sp->train_net, dir);
  for (size_t i = 0; !rc && i < sp->n_test_net; i++) rc = absolute_net_path(&sp->test_net[i], dir);
  if (!rc) rc = kiln_text_format(&sp->base, &text);
  if (!rc) {
    size_t n = strlen(text) + strlen(solver_path) + 128;
    p->solver_text = malloc(n);
    if (!p->solver_text) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    else
      snprintf(p->solver_text, n, "# written by kiln ce from %s with the suite's overrides\n%s",
               solver_path, text);
  }
  if (!rc) {
    /* The hash covers what decides the numbers: the solver as run and the nets it names. */
    kiln_sha256_ctx c;
    kiln_sha256_init(&c);
    kiln_sha256_update(&c, hashed, strlen(hashed));
    hash_file(&c, sp->net);
    hash_file(&c, sp->train_net);
    for (size_t i = 0; i < sp->n_test_net; i++) hash_file(&c, sp->test_net[i]);
    /* and, for a model judged by decoding, how it is decoded (the data are the cache's) */
    if (m->decode) {
      char *dtext = NULL;
      rc = kiln_text_format(&m->decode->base, &dtext);
      if (!rc) kiln_sha256_update(&c, dtext, strlen(dtext));
      free(dtext);
      hash_file(&c, decode_model);
    }
    /* and the number format, where the model asks for bf16 (fp32's hash stays as it was) */
    if (m->precision && !strcmp(m->precision, "bf16")) kiln_sha256_update(&c, "precision bf16", 14);
    uint8_t d[32];
    char hex[65];
    kiln_sha256_final(&c, d);
    kiln_sha256_hex(d, hex);
    memcpy(p->config_hash, hex, 16);
    p->config_hash[16] = '\0';
  }
  free(text);
  free(hashed);
  protobuf_c_message_free_unpacked(msg, NULL);
  if (rc) {
    free(p->solver_text);
    p->solver_text = NULL;
  }
  return rc;
}

/* ---- one model --------------------------------------------------------------------------- */

typedef struct config_state {
  int workers, threads;
  bool skipped, failed;
  kiln_ce_verdict run_verdict;
  char run_reason[512];
  int n;                                        /* repeats with samples */
  double v[MAX_KPIS][KILN_CE_MAX_SAMPLES];      /* per KPI of the model, per repeat */
  double sps[KILN_CE_MAX_SAMPLES];              /* throughput per repeat (for speedup) */
  double busy[KILN_CE_MAX_SAMPLES];             /* per repeat: the share of the wall clock taken
                                                   out of its timings (waiting for a CPU other
                                                   processes held); NaN when unknown */
  kiln_ce_run_facts facts;
} config_state;

typedef struct ctx {
  const kiln_ce_options *o;
  const kiln_config *cfg; /* o->config, or the defaults */
  const Caffe__CeSuite *suite;
  kiln_ce_result *r;
  char suite_dir[4096];
  char baseline_dir[4096];
  char mpirun[4096];
  bool have_mpirun;
  int cores; /* what the workers share: timings of more workers than this are not judged */
} ctx;

static void progress(const ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(const ctx *x, const char *fmt, ...) {
  if (!x->o->progress) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  x->o->progress(buf, x->o->user);
}

static bool cancelled(const ctx *x) { return x->o->cancel && *x->o->cancel; }

static int ensure_dataset(const kiln_config *cfg, const char *name) {
  char dir[4096], ready[4200];
  if (!strcmp(name, "fashion-mnist")) {
    int rc = kiln_data_cache_dir(cfg, dir, sizeof dir);
    if (!rc) rc = kiln_data_fetch_fashion_mnist(NULL, dir, NULL);
    if (rc)
      return kiln_error_context(rc, "data set fashion-mnist (kiln data fetch fashion-mnist): ");
    return KILN_OK;
  }
  KILN_TRY(kiln_data_cache_dir(cfg, dir, sizeof dir));
  if (!strcmp(name, "shapes-det")) { /* drawn here, in seconds */
    const int rc = kiln_data_fetch_shapes_det(dir, NULL);
    return rc ? kiln_error_context(rc, "data set shapes-det (kiln data fetch shapes-det): ") : KILN_OK;
  }
  if (kiln_text_set_find(name)) {
    /* in the cache, with the vocabulary the zoo reads (written now if an older fetch lacks it) */
    int rc = kiln_data_fetch_text(name, NULL, dir, NULL);
    return rc ? kiln_error_context(rc, "data set %s (kiln data fetch %s): ", name, name) : KILN_OK;
  }
  snprintf(ready, sizeof ready, "%s/%s/READY", dir, name);
  if (access(ready, F_OK) != 0)
    return kiln_errorf(KILN_ERR_IO, "data set '%s' is not in the cache (%s/%s)", name, dir, name);
  return KILN_OK;
}

/* Where a model with a decode entry has its final weights: the run folder, the solver's
 * snapshot_prefix "snapshot" (relative: the child runs in the folder). */
static void final_weights(const char *folder, const prepared *p, char *buf, size_t n) {
  ce_fmt(buf, n, "%s/snapshot_iter_%d.caffemodel", folder, p->max_iter);
}

/* For a model with a decode entry, after a successful training in `folder`: `kiln decode` of
 * the final weights as a second child (decode.log, decode.jsonl), under the same timeout, its
 * figures taken into the training's metrics `met`. False when it failed (reason in the state,
 * naming the log). */
static bool run_decode(const ctx *x, const Caffe__CeModel *m, const prepared *p, config_state *cs,
                       const char *tag, const char *folder, double timeout,
                       kiln_ce_metrics *met) {
  const Caffe__CeDecode *d = m->decode;
  char cache[4096], weights[4200], metrics[4200], input[8200], vocab[8200], target_vocab[8200];
  if (kiln_data_cache_dir(x->cfg, cache, sizeof cache)) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_ERROR;
    ce_fmt(cs->run_reason, sizeof cs->run_reason, "decode: %s", kiln_last_error());
    return false;
  }
  final_weights(folder, p, weights, sizeof weights);
  ce_fmt(metrics, sizeof metrics, "%s/decode.jsonl", folder);
  ce_join(cache, d->input, input, sizeof input);
  ce_join(cache, d->vocab, vocab, sizeof vocab);
  ce_join(cache, d->target_vocab, target_vocab, sizeof target_vocab);
  remove(metrics);
  if (access(weights, R_OK) != 0) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_FAIL;
    ce_fmt(cs->run_reason, sizeof cs->run_reason,
           "the training left no final weights to decode (%s: %s; log: %s/train.log)", weights,
           strerror(errno), folder);
    return false;
  }
  char threads[16], beam[16], limit[16];
  snprintf(threads, sizeof threads, "%d", cs->threads);
  snprintf(beam, sizeof beam, "%d", d->beam);
  snprintf(limit, sizeof limit, "%d", d->limit);
  char *argv[32];
  int a = 0;
  argv[a++] = (char *)x->o->kiln_path;
  argv[a++] = "decode";
  argv[a++] = "--model";
  argv[a++] = (char *)p->decode_model;
  argv[a++] = "--weights";
  argv[a++] = weights;
  argv[a++] = "--vocab";
  argv[a++] = vocab;
  argv[a++] = "--target-vocab";
  argv[a++] = target_vocab;
  argv[a++] = "--input";
  argv[a++] = input;
  if (d->beam > 1) { /* a beam of 1 chooses what greedy does, by a slower route */
    argv[a++] = "--beam";
    argv[a++] = beam;
  }
  if (d->limit > 0) {
    argv[a++] = "--limit";
    argv[a++] = limit;
  }
  argv[a++] = "--metrics";
  argv[a++] = metrics;
  argv[a++] = "--threads";
  argv[a++] = threads;
  argv[a] = NULL;
  progress(x, "%s x%d %s: decoding %s%s", m->name, cs->workers, tag, d->input,
           d->beam > 1 ? " (beam search)" : "");
  kiln_ce_child child;
  ce_run_child(argv, folder, "decode.log", timeout, x->o->cancel, &child);
  if (cancelled(x)) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_ERROR;
    snprintf(cs->run_reason, sizeof cs->run_reason, "interrupted");
    return false;
  }
  kiln_ce_metrics dm;
  int mrc = access(metrics, F_OK) == 0 ? kiln_ce_metrics_read(metrics, &dm) : KILN_ERR_IO;
  char reason[512];
  bool failed = kiln_ce_decode_failed(&child, mrc ? NULL : &dm, reason, sizeof reason);
  if (!failed) kiln_ce_metrics_take_decode(met, &dm);
  if (!mrc) kiln_ce_metrics_free(&dm);
  if (failed) {
    cs->failed = true;
    cs->run_verdict = child.end == KILN_CE_CHILD_NOT_STARTED ? KILN_CE_ERROR : KILN_CE_FAIL;
    ce_fmt(cs->run_reason, sizeof cs->run_reason, "%.400s (log: %s/decode.log)", reason, folder);
    progress(x, "%s x%d %s: %s", m->name, cs->workers, tag, reason);
    return false;
  }
  progress(x, "%s x%d %s: decoded %d records in %.1f s: per %.4f, word accuracy %.4f", m->name,
           cs->workers, tag, met->decode_words, child.wall_s, met->per, met->word_accuracy);
  return true;
}

/* One training run of a configuration: write the solver, run, read the metrics into the
 * samples at index `slot`. False when the run failed (reason in the state). */
static bool run_once(const ctx *x, const Caffe__CeModel *m, const prepared *p,
                     const kiln_ce_kpi_spec *specs, config_state *cs, int slot, const char *tag) {
  char folder[4096];
  int len = snprintf(folder, sizeof folder, "%s/runs/%s-w%d-%s", x->r->report_dir, m->name,
                     cs->workers, tag);
  if (len < 0 || (size_t)len >= sizeof folder - 32) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_ERROR;
    snprintf(cs->run_reason, sizeof cs->run_reason, "the report folder's path is too long");
    return false;
  }
  if (kiln_mkdir_p(folder)) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_ERROR;
    snprintf(cs->run_reason, sizeof cs->run_reason, "%s", kiln_last_error());
    return false;
  }
  char solver[4200], metrics[4200];
  snprintf(solver, sizeof solver, "%s/solver.prototxt", folder);
  snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", folder);
  remove(metrics);
  if (m->decode) { /* a folder used before must not hand a decode the weights of another run */
    char weights[4200];
    final_weights(folder, p, weights, sizeof weights);
    remove(weights);
  }
  if (kiln_write_file_atomic(solver, p->solver_text, strlen(p->solver_text))) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_ERROR;
    snprintf(cs->run_reason, sizeof cs->run_reason, "%s", kiln_last_error());
    return false;
  }
  char threads[16], np[16];
  snprintf(threads, sizeof threads, "%d", cs->threads);
  snprintf(np, sizeof np, "%d", cs->workers);
  char *argv[24];
  int a = 0;
  if (cs->workers > 1) {
    argv[a++] = (char *)x->mpirun;
    argv[a++] = "-np";
    argv[a++] = np;
    argv[a++] = "--oversubscribe";
    argv[a++] = "--allow-run-as-root";
    /* Open MPI binds each rank to one core by default, which would stack a rank's threads */
    argv[a++] = "--bind-to";
    argv[a++] = "none";
  }
  argv[a++] = (char *)x->o->kiln_path;
  argv[a++] = "train";
  argv[a++] = "--solver";
  argv[a++] = solver;
  argv[a++] = "--metrics";
  argv[a++] = metrics;
  argv[a++] = "--threads";
  argv[a++] = threads;
  if (m->precision) {
    argv[a++] = "--precision";
    argv[a++] = m->precision;
  }
  argv[a] = NULL;
  double timeout = m->has_timeout_seconds ? m->timeout_seconds : x->suite->timeout_seconds;
  kiln_ce_child child;
  ce_run_child(argv, folder, "train.log", timeout, x->o->cancel, &child);
  if (cancelled(x)) {
    cs->failed = true;
    cs->run_verdict = KILN_CE_ERROR;
    snprintf(cs->run_reason, sizeof cs->run_reason, "interrupted");
    return false;
  }
  kiln_ce_metrics met;
  int mrc = access(metrics, F_OK) == 0 ? kiln_ce_metrics_read(metrics, &met) : KILN_ERR_IO;
  if (mrc) {
    memset(&met, 0, sizeof met);
    met.last_iter = -1;
    met.nonfinite_iter = -1;
  }
  if (!mrc) kiln_ce_metrics_discount_wait(&met, child.others_cpu_s);
  char reason[512];
  bool failed = kiln_ce_run_failed(&child, mrc ? NULL : &met, reason, sizeof reason);
  if (!failed && mrc) {
    failed = true;
    snprintf(reason, sizeof reason, "no readable metrics: %s", kiln_last_error());
  }
  /* A bf16 model on a machine without bf16 kernels is not this commit's failure. */
  if (failed && (strstr(child.last_error, "built without MPI") ||
                 strstr(child.last_error, "precision BF16 needs"))) {
    cs->skipped = true;
    ce_fmt(cs->run_reason, sizeof cs->run_reason, "%s", child.last_error);
    if (!mrc) kiln_ce_metrics_free(&met);
    return false;
  }
  if (!failed && cs->workers > 1 && met.nworkers_reported != cs->workers)
    kiln_ce_result_warn(x->r,
                        "%s x%d %s: the metrics report %d worker%s (\"worker\" events), not %d",
                        m->name, cs->workers, tag, met.nworkers_reported,
                        met.nworkers_reported == 1 ? "" : "s", cs->workers);
  if (failed) {
    cs->failed = true;
    cs->run_verdict = child.end == KILN_CE_CHILD_NOT_STARTED ? KILN_CE_ERROR : KILN_CE_FAIL;
    ce_fmt(cs->run_reason, sizeof cs->run_reason, "%.400s (log: %s/train.log)", reason, folder);
    if (!mrc) kiln_ce_metrics_free(&met);
    progress(x, "%s x%d %s: %s", m->name, cs->workers, tag, reason);
    return false;
  }
  if (m->decode && !run_decode(x, m, p, cs, tag, folder, timeout, &met)) {
    kiln_ce_metrics_free(&met);
    return false;
  }
  for (size_t k = 0; k < m->n_kpi; k++) {
    double v = specs[k].info->multi_worker ? NAN : kiln_ce_kpi_value(&met, &specs[k]);
    /* A series KPI the metrics never had is a configuration problem, not a NaN of training:
     * ±inf marks it so the judge can say which. */
    if (isnan(v) && !specs[k].info->multi_worker) {
      const char *name = specs[k].info->name;
      bool missing = (!strcmp(name, "accuracy") && met.accuracy.n == 0) ||
                     (!strcmp(name, "f1") && met.f1.n == 0) ||
                     (!strcmp(name, "mAP") && met.map.n == 0) ||
                     ((!strcmp(name, "test_loss") || !strcmp(name, "perplexity")) &&
                      met.test_loss.n == 0) ||
                     (!strcmp(name, "train_loss") && met.train_loss.n == 0) ||
                     (!strcmp(name, "train_accuracy") && met.train_accuracy.n == 0) ||
                     (!strcmp(name, "samples_per_s") && isnan(met.samples_per_s)) ||
                     (!strcmp(name, "peak_rss_mb") && isnan(met.peak_rss_mb)) ||
                     (!strcmp(name, "peak_device_mb") && isnan(met.peak_device_mb)) ||
                     (specs[k].info->decoded && !met.decoded);
      if (missing) v = INFINITY;
    }
    cs->v[k][slot] = v;
  }
  cs->sps[slot] = met.samples_per_s;
  cs->busy[slot] = isfinite(met.cpu_wait_s) && met.wall_duration_s > 0
                       ? met.discounted_wait_s / met.wall_duration_s
                       : NAN;
  cs->facts.planned_iter = p->max_iter;
  cs->facts.reached_iter = met.last_iter;
  cs->facts.min_epochs_learning = m->min_epochs_learning;
  cs->facts.epochs = m->has_iters_per_epoch && m->iters_per_epoch > 0
                         ? (double)met.last_iter * cs->workers / m->iters_per_epoch
                         : NAN;
  progress(x, "%s x%d %s: done in %.1f s (iteration %d)", m->name, cs->workers, tag, child.wall_s,
           met.last_iter);
  kiln_ce_metrics_free(&met);
  return true;
}

static void run_repeats(const ctx *x, const Caffe__CeModel *m, const prepared *p,
                        const kiln_ce_kpi_spec *specs, config_state *cs, int repeats,
                        const char *prefix) {
  int start = cs->n;
  for (int i = 0; i < repeats && start + i < KILN_CE_MAX_SAMPLES && !cancelled(x); i++) {
    char tag[32];
    snprintf(tag, sizeof tag, "%s%d", prefix, i + 1);
    progress(x, "%s x%d %s: training %d iterations, %d thread%s per worker", m->name, cs->workers,
             tag, p->max_iter, cs->threads, cs->threads == 1 ? "" : "s");
    if (!run_once(x, m, p, specs, cs, start + i, tag)) return;
    cs->n = start + i + 1;
  }
}

static void fill_row_head(kiln_ce_row *row, const Caffe__CeModel *m, const config_state *cs,
                          const prepared *p, const char *kpi) {
  memset(row, 0, sizeof *row);
  snprintf(row->model, sizeof row->model, "%s", m->name);
  row->workers = cs->workers;
  snprintf(row->kpi, sizeof row->kpi, "%s", kpi);
  row->value = row->spread = row->baseline = row->baseline_spread = row->busy = NAN;
  row->change = row->tolerance = NAN;
  row->threads = cs->threads;
  if (p) {
    row->seed = p->seed;
    row->iterations = p->max_iter;
    snprintf(row->config_hash, sizeof row->config_hash, "%s", p->config_hash);
  }
}

/* For a timing row: how busy the machine kept the repeats [from, nall) (the median share of the
 * wall clock taken out of their timings), said in the reason when it matters. */
static void note_busy(kiln_ce_row *row, const double *busy, int nall, int from) {
  double b[KILN_CE_MAX_SAMPLES];
  int n = 0;
  for (int i = from; i < nall; i++)
    if (isfinite(busy[i])) b[n++] = busy[i];
  row->busy = n ? kiln_ce_median(b, n) : NAN;
  if (!(row->busy >= 0.10)) return;
  char note[160];
  snprintf(note, sizeof note,
           "%s%.0f%% of the wall clock spent waiting for a CPU that other processes held is not "
           "counted",
           row->reason[0] ? "; " : "the machine was busy: ", 100 * row->busy);
  size_t len = strlen(row->reason);
  snprintf(row->reason + len, sizeof row->reason - len, "%s", note);
}

/* Judges one KPI row from samples [from, nall) (the value) with every sample kept. */
static void judge(const ctx *x, kiln_ce_row *row, const kiln_ce_kpi_spec *spec,
                  const double *samples, int nall, int from, const double *busy,
                  const kiln_ce_run_facts *facts, const Caffe__CeBaseline *base,
                  const char *base_class) {
  snprintf(row->unit, sizeof row->unit, "%s", spec->info->unit);
  row->higher_is_better = spec->higher_is_better;
  row->nsamples = nall;
  memcpy(row->samples, samples, (size_t)nall * sizeof *samples);
  /* run_once marks a figure the metrics never had with +inf (a NaN is a training failure) */
  bool missing = false;
  for (int i = 0; i < nall; i++) missing |= isinf(samples[i]) && samples[i] > 0;
  for (int i = 0; i < nall; i++)
    if (isinf(row->samples[i])) row->samples[i] = NAN;
  row->value = kiln_ce_median(row->samples + from, nall - from);
  row->spread = kiln_ce_stddev(row->samples + from, nall - from);
  for (int i = from; i < nall; i++)
    if (!isfinite(row->samples[i])) row->value = NAN; /* a NaN in any repeat counts */
  if (missing) {
    row->verdict = KILN_CE_ERROR;
    if (!strcmp(spec->info->name, "train_accuracy"))
      snprintf(row->reason, sizeof row->reason,
               "the metrics have no train_accuracy figure: the train net reports no accuracy (it "
               "needs an Accuracy layer in phase TRAIN whose top is named accuracy)");
    else
      snprintf(row->reason, sizeof row->reason,
               "the metrics have no %s figure (for accuracy the net needs an Accuracy layer, for "
               "f1 an F1 layer, for mAP a DetectionEvaluate layer, and a test pass at the end: "
               "test_interval dividing max_iter)",
               spec->info->name);
    return;
  }
  if (kiln_ce_kpi_not_applicable(spec->info, row->workers, x->cores, row->reason,
                                 sizeof row->reason)) {
    row->verdict = KILN_CE_NA;
    return;
  }
  if (kiln_ce_kpi_failed(spec, row->value, facts, row->reason, sizeof row->reason)) {
    row->verdict = KILN_CE_FAIL;
    return;
  }
  const Caffe__CeBaselineValue *bv = kiln_ce_baseline_find(base, row->kpi, row->workers);
  bool other_class = base_class && strcmp(base_class, x->r->machine_class) != 0;
  if (!base || (other_class && spec->info->machine_dependent)) {
    /* Timings and memory of another machine say nothing about this one's. */
    /* (the run's warnings name the other class whose machine-independent values judged) */
    row->verdict = KILN_CE_NEW;
    snprintf(row->reason, sizeof row->reason,
             "no baseline for machine class %s; `kiln ce accept` records one",
             x->r->machine_class);
    return;
  }
  if (!bv) {
    row->verdict = KILN_CE_NEW;
    snprintf(row->reason, sizeof row->reason, "the baseline has no %s for %d worker%s", row->kpi,
             row->workers, row->workers == 1 ? "" : "s");
    return;
  }
  row->has_baseline = true;
  row->baseline = bv->value;
  row->baseline_spread = bv->has_spread ? bv->spread : 0;
  row->verdict = kiln_ce_compare(spec, row->value, row->spread, row->baseline,
                                 row->baseline_spread, x->suite->noise_k, &row->tolerance,
                                 &row->change, row->reason, sizeof row->reason);
  if (spec->info->timing) note_busy(row, busy, nall, from);
}

/* Speedup samples of an N-worker configuration against the median 1-worker throughput. */
static int derived_samples(const kiln_ce_kpi_spec *spec, const config_state *cs, double one,
                           double *out) {
  for (int i = 0; i < cs->n; i++) {
    if (!isfinite(cs->sps[i]) || !isfinite(one)) {
      out[i] = INFINITY; /* no throughput figures: missing, like any other */
      continue;
    }
    double s = cs->sps[i] / one;
    out[i] = !strcmp(spec->info->name, "efficiency") ? s / cs->workers : s;
  }
  return cs->n;
}

static void build_rows(const ctx *x, const Caffe__CeModel *m, const prepared *p,
                       const kiln_ce_kpi_spec *specs, config_state *cs,
                       const config_state *one, const Caffe__CeBaseline *base,
                       const char *base_class, kiln_ce_row *rows, int *nrows, int from) {
  if (cs->skipped || cs->failed) {
    kiln_ce_row *row = &rows[(*nrows)++];
    fill_row_head(row, m, cs, p, "run");
    row->verdict = cs->skipped ? KILN_CE_SKIP : cs->run_verdict;
    snprintf(row->reason, sizeof row->reason, "%s", cs->run_reason);
    return;
  }
  for (size_t k = 0; k < m->n_kpi; k++) {
    const kiln_ce_kpi_spec *spec = &specs[k];
    if (spec->info->multi_worker && cs->workers == 1) continue;
    kiln_ce_row *row = &rows[(*nrows)++];
    fill_row_head(row, m, cs, p, spec->info->name);
    if (spec->info->multi_worker) {
      if (!one || one->skipped || one->failed || one->n == 0) {
        snprintf(row->unit, sizeof row->unit, "%s", spec->info->unit);
        row->verdict = KILN_CE_SKIP;
        snprintf(row->reason, sizeof row->reason,
                 "needs a successful 1-worker run of the model to compare with");
        continue;
      }
      double d[KILN_CE_MAX_SAMPLES];
      int n = derived_samples(spec, cs, kiln_ce_median(one->sps, one->n), d);
      judge(x, row, spec, d, n, from, cs->busy, &cs->facts, base, base_class);
    } else {
      judge(x, row, spec, cs->v[k], cs->n, from, cs->busy, &cs->facts, base, base_class);
    }
  }
}

static int run_model(const ctx *x, const Caffe__CeModel *m) {
  kiln_ce_result *r = x->r;
  kiln_ce_kpi_spec specs[MAX_KPIS];
  for (size_t k = 0; k < m->n_kpi; k++) KILN_TRY(kiln_ce_kpi_resolve(m->kpi[k], &specs[k]));
  int nw = m->n_workers ? (int)m->n_workers : 1;
  config_state *cs = calloc((size_t)nw, sizeof *cs);
  kiln_ce_row *rows = calloc((size_t)nw * (m->n_kpi + 1), sizeof *rows);
  if (!cs || !rows) {
    free(cs);
    free(rows);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  int cores = x->cores;
  /* only_workers: that count alone, and one worker beside it when a speedup needs it */
  bool needs_one = false;
  for (size_t k = 0; k < m->n_kpi; k++) needs_one |= specs[k].info->multi_worker;
  int kept = 0;
  for (int w = 0; w < nw; w++) {
    int workers = m->n_workers ? m->workers[w] : 1;
    if (x->o->only_workers > 0 && workers != x->o->only_workers &&
        !(workers == 1 && needs_one && x->o->only_workers > 1))
      continue;
    cs[kept++].workers = workers;
  }
  if (kept == 0) {
    free(cs);
    free(rows);
    return kiln_errorf(KILN_ERR_INVALID, "model '%s' has no run on %d worker%s in the suite",
                       m->name, x->o->only_workers, x->o->only_workers == 1 ? "" : "s");
  }
  nw = kept;
  for (int w = 0; w < nw; w++) {
    cs[w].threads = m->has_threads && m->threads > 0 ? m->threads
                    : cores / cs[w].workers > 0      ? cores / cs[w].workers
                                                     : 1;
  }
  int repeats = x->o->repeats > 0 ? x->o->repeats : m->has_repeats ? m->repeats : x->suite->repeats;
  if (repeats > KILN_CE_MAX_SAMPLES / 2) repeats = KILN_CE_MAX_SAMPLES / 2;

  /* Anything that stops the whole model before training is the harness's problem. */
  char solver_path[4096];
  ce_join(x->suite_dir, m->solver, solver_path, sizeof solver_path);
  prepared p = {0};
  char setup_error[512] = "";
  char decode_model[4096] = "";
  if (m->decode) ce_join(x->suite_dir, m->decode->model, decode_model, sizeof decode_model);
  if (prepare_solver(solver_path, m, m->decode ? decode_model : NULL, &p))
    snprintf(setup_error, sizeof setup_error, "%s", kiln_last_error());
  for (size_t d = 0; !setup_error[0] && d < m->n_dataset; d++)
    if (ensure_dataset(x->cfg, m->dataset[d]))
      snprintf(setup_error, sizeof setup_error, "%s", kiln_last_error());
  Caffe__CeBaseline *base = NULL;
  char base_class[128] = "";
  if (!setup_error[0] &&
      kiln_ce_baseline_lookup(x->baseline_dir, r->machine_class, m->name, &base, base_class,
                              sizeof base_class))
    snprintf(setup_error, sizeof setup_error, "baseline: %s", kiln_last_error());
  if (base && strcmp(base_class, r->machine_class))
    kiln_ce_result_warn(r,
                        "%s: no baseline for machine class %s; comparing only the "
                        "machine-independent KPIs with the baseline of %s",
                        m->name, r->machine_class, base_class);

  if (base && base->config_hash && p.solver_text && strcmp(base->config_hash, p.config_hash))
    kiln_ce_result_warn(r,
                        "%s: the solver or net changed since the baseline (config hash %s, "
                        "baseline %s): differences may be intended; accept them after review",
                        m->name, p.config_hash, base->config_hash);

  int nrows = 0;
  const config_state *one = NULL;
  for (int w = 0; w < nw; w++)
    if (cs[w].workers == 1) one = &cs[w];
  for (int w = 0; w < nw && !cancelled(x); w++) {
    if (setup_error[0]) {
      cs[w].failed = true;
      cs[w].run_verdict = KILN_CE_ERROR;
      snprintf(cs[w].run_reason, sizeof cs[w].run_reason, "%s", setup_error);
      continue;
    }
    if (cs[w].workers > 1 && !kiln_ce_mpi_built && !x->o->assume_mpi) {
      cs[w].skipped = true;
      snprintf(cs[w].run_reason, sizeof cs[w].run_reason,
               "this kiln was built without MPI: %d workers need it (install Open MPI and "
               "rebuild)",
               cs[w].workers);
      progress(x, "%s x%d: skipped, kiln built without MPI", m->name, cs[w].workers);
      continue;
    }
    if (cs[w].workers > 1 && !x->have_mpirun) {
      cs[w].skipped = true;
      snprintf(cs[w].run_reason, sizeof cs[w].run_reason,
               "mpirun not found: %d workers need MPI (Debian: openmpi-bin)", cs[w].workers);
      progress(x, "%s x%d: skipped, no mpirun", m->name, cs[w].workers);
      continue;
    }
    run_repeats(x, m, &p, specs, &cs[w], repeats, "r");
  }
  for (int w = 0; w < nw; w++)
    build_rows(x, m, &p, specs, &cs[w], one, base, base_class, rows, &nrows, 0);

  /* A timing regression is confirmed by running the configuration again: noise rarely repeats,
   * a real slowdown does. The re-run's median decides; every sample is kept. */
  for (int w = 0; w < nw && !cancelled(x); w++) {
    bool suspect = false;
    for (int i = 0; i < nrows; i++)
      if (rows[i].workers == cs[w].workers && rows[i].verdict == KILN_CE_REGRESSION &&
          kiln_ce_kpi_lookup(rows[i].kpi) && kiln_ce_kpi_lookup(rows[i].kpi)->timing)
        suspect = true;
    if (!suspect) continue;
    int first = cs[w].n;
    progress(x, "%s x%d: a timing KPI looks slower; re-running to confirm", m->name, cs[w].workers);
    run_repeats(x, m, &p, specs, &cs[w], repeats, "c");
    if (cs[w].failed || cs[w].n == first) {
      kiln_ce_result_warn(r,
                          "%s x%d: the confirming re-run failed (%s); the first measurement "
                          "stands",
                          m->name, cs[w].workers, cs[w].run_reason);
      cs[w].failed = false;
      cs[w].n = first;
      continue;
    }
    kiln_ce_row again[MAX_KPIS + 1];
    int nagain = 0;
    build_rows(x, m, &p, specs, &cs[w], one, base, base_class, again, &nagain, first);
    for (int i = 0; i < nrows; i++) {
      if (rows[i].workers != cs[w].workers) continue;
      const kiln_ce_kpi_info *info = kiln_ce_kpi_lookup(rows[i].kpi);
      if (!info || !info->timing) continue;
      for (int j = 0; j < nagain; j++) {
        if (strcmp(again[j].kpi, rows[i].kpi)) continue;
        double before = rows[i].value;
        kiln_ce_verdict v0 = rows[i].verdict;
        char why[512];
        snprintf(why, sizeof why, "%s", again[j].reason);
        rows[i] = again[j];
        if (v0 == KILN_CE_REGRESSION && again[j].verdict == KILN_CE_REGRESSION)
          snprintf(rows[i].reason, sizeof rows[i].reason,
                   "confirmed on a re-run (first median %.4g): %.400s", before, why);
        else if (v0 == KILN_CE_REGRESSION)
          snprintf(rows[i].reason, sizeof rows[i].reason,
                   "a suspected regression (median %.4g) was not confirmed on a re-run "
                   "(median %.4g)",
                   before, again[j].value);
      }
    }
  }
  int rc = KILN_OK;
  if (cancelled(x)) rc = kiln_errorf(KILN_ERR_INVALID, "interrupted during model '%s'", m->name);
  for (int i = 0; i < nrows && rc == KILN_OK; i++) rc = kiln_ce_result_add_row(r, &rows[i]);
  if (base) protobuf_c_message_free_unpacked(&base->base, NULL);
  free(p.solver_text);
  free(cs);
  free(rows);
  return rc;
}

/* ---- a suite ------------------------------------------------------------------------------- */

int kiln_ce_run(const char *suite_path, const kiln_ce_options *o, kiln_ce_result *out) {
  memset(out, 0, sizeof *out);
  if (!o->kiln_path || !o->report_dir)
    return kiln_errorf(KILN_ERR_INVALID, "kiln_ce_run: kiln_path and report_dir are required");
  /* The trainings inherit the environment, KILN_FAULT included: the caller's configuration
   * read it (a malformed one stops the harness there), and a valid one is said loudly. */
  const kiln_config *cfg = o->config ? o->config : kiln_config_defaults();
  const kiln_fault fault = cfg->fault;
  Caffe__CeSuite *suite;
  KILN_TRY(kiln_ce_suite_load(suite_path, &suite));
  ctx x = {.o = o, .cfg = cfg, .suite = suite, .r = out,
           .cores = o->cores > 0 ? o->cores : kiln_ce_usable_cores()};
  if (fault.kind != KILN_FAULT_NONE) {
    char what[256];
    kiln_ce_result_warn(out,
                        "%s is set: every training of this run has an injected fault (%s); do "
                        "not accept this run as a baseline",
                        KILN_FAULT_ENV, kiln_fault_describe(&fault, what, sizeof what));
  }
  char real[PATH_MAX];
  snprintf(out->suite_path, sizeof out->suite_path, "%s",
           realpath(suite_path, real) ? real : suite_path);
  ce_dirname(out->suite_path, x.suite_dir, sizeof x.suite_dir);
  if (suite->name && *suite->name) {
    snprintf(out->suite_name, sizeof out->suite_name, "%s", suite->name);
  } else {
    const char *b = strrchr(out->suite_path, '/');
    ce_fmt(out->suite_name, sizeof out->suite_name, "%s", b ? b + 1 : out->suite_path);
    char *dot = strrchr(out->suite_name, '.');
    if (dot && dot != out->suite_name) *dot = '\0';
  }
  if (o->baseline_dir && *o->baseline_dir)
    ce_fmt(x.baseline_dir, sizeof x.baseline_dir, "%s", o->baseline_dir);
  else
    kiln_ce_suite_baseline_dir(suite, out->suite_path, x.baseline_dir, sizeof x.baseline_dir);
  snprintf(out->baseline_dir, sizeof out->baseline_dir, "%s", x.baseline_dir);
  /* A folder that is not one would read as "no baselines" and pass every KPI as new. */
  struct stat bst;
  if (stat(x.baseline_dir, &bst) == 0 && !S_ISDIR(bst.st_mode)) {
    protobuf_c_message_free_unpacked(&suite->base, NULL);
    return kiln_errorf(KILN_ERR_INVALID, "%s: baseline_dir %s is not a folder", suite_path,
                       x.baseline_dir);
  }
  if (o->machine_class && *o->machine_class && !ce_valid_name(o->machine_class)) {
    protobuf_c_message_free_unpacked(&suite->base, NULL);
    return kiln_errorf(KILN_ERR_INVALID,
                       "machine class '%s' must be 1 to 63 letters, digits, '_', '-' or '.', not "
                       "starting with '.' (it names a folder of the baselines)",
                       o->machine_class);
  }
  ce_utc_now(out->started_at, sizeof out->started_at, 0);
  kiln_ce_machine_describe(&out->machine, cfg);
  if (o->machine_class && *o->machine_class)
    snprintf(out->machine_class, sizeof out->machine_class, "%s", o->machine_class);
  else
    kiln_ce_machine_class(&out->machine, out->machine_class, sizeof out->machine_class);
  if (cfg->git_commit[0])
    snprintf(out->git_commit, sizeof out->git_commit, "%s", cfg->git_commit);
  else
    kiln_ce_git_commit(x.suite_dir, out->git_commit, sizeof out->git_commit);
  snprintf(out->report_dir, sizeof out->report_dir, "%s", o->report_dir);
  int rc = kiln_mkdir_p(out->report_dir);
  if (rc == KILN_OK && realpath(out->report_dir, real))
    snprintf(out->report_dir, sizeof out->report_dir, "%s", real);
  if (o->mpirun && *o->mpirun) {
    snprintf(x.mpirun, sizeof x.mpirun, "%s", o->mpirun);
    x.have_mpirun =
        access(o->mpirun, X_OK) == 0 ||
        ce_find_in_path(cfg->search_path, o->mpirun, x.mpirun, sizeof x.mpirun);
  } else {
    x.have_mpirun = ce_find_in_path(cfg->search_path, "mpirun", x.mpirun, sizeof x.mpirun);
  }
  double t0 = ce_now_s();
  bool found = !o->only_model;
  for (size_t i = 0; rc == KILN_OK && i < suite->n_model; i++) {
    if (o->only_model && strcmp(o->only_model, suite->model[i]->name)) continue;
    found = true;
    rc = run_model(&x, suite->model[i]);
  }
  if (rc == KILN_OK && !found)
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: no model named '%s'", suite_path, o->only_model);
  out->duration_s = ce_now_s() - t0;
  protobuf_c_message_free_unpacked(&suite->base, NULL);
  if (rc) kiln_ce_result_free(out);
  return rc;
}
