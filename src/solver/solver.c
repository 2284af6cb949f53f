/* The training loop (see include/kiln/solver.h). Caffe's order per iteration: test (every
 * test_interval), iter_size forward/backward passes accumulating gradients, smoothed loss,
 * display, then the update (update.c); iter += 1; snapshot every `snapshot`.
 *
 * iter_size > 1: each pass computes its gradient from zero and the passes are added in order,
 * ((g0 + g1) + g2) ..., with kiln_parallel_accumulate (layers accumulating inside their GEMMs would
 * round differently). N workers with the ordered reduction add the same way, so N workers x one
 * pass and one worker x iter_size N give the same bits. */
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/data.h"
#include "solver_internal.h"

static void emit(kiln_solver *s, kiln_event *e) {
  if (!s->opt.on_event || s->rank != 0) return; /* rank 0 speaks for the workers */
  e->max_iter = s->max_iter;
  e->nworkers = s->nworkers;
  e->time_ms = kiln_now_ms() - s->start_ms;
  /* /proc reads: not for the per-iteration progress event */
  bool progress = !strcmp(e->event, "progress");
  e->peak_rss_mb = progress ? 0 : kiln_peak_rss_mb();
  e->cpu_wait_ms = progress ? 0 : kiln_thread_cpu_wait_ms() - s->start_cpu_wait_ms;
  s->opt.on_event(e, s->opt.user);
}

/* A net file path: as given, else relative to the solver file's folder. */
static int load_net_file(kiln_solver *s, const char *path, Caffe__NetParameter **out) {
  char buf[4096];
  const char *use = path;
  if (access(path, R_OK) != 0 && path[0] != '/') {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", s->source);
    snprintf(buf, sizeof buf, "%s/%s", dirname(tmp), path);
    if (access(buf, R_OK) == 0) use = buf;
  }
  ProtobufCMessage *m;
  KILN_TRY(kiln_text_parse_file(use, &caffe__net_parameter__descriptor, &m));
  Caffe__NetParameter **v = realloc(s->net_params, (size_t)(s->nnet_params + 1) * sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(m, NULL);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  s->net_params = v;
  s->net_params[s->nnet_params++] = (Caffe__NetParameter *)m;
  *out = (Caffe__NetParameter *)m;
  return KILN_OK;
}

static int make_net(kiln_solver *s, const Caffe__NetParameter *np, int phase,
                    const Caffe__NetState *state, const char *source, kiln_net **out) {
  const char *stages[64];
  kiln_net_options o = {0};
  o.phase = phase;
  if (np->state) {
    o.level = np->state->level;
  }
  if (state) {
    if (state->has_phase) o.phase = (int)state->phase;
    o.level = state->level;
    for (size_t i = 0; i < state->n_stage && i < 64; i++) stages[o.nstages++] = state->stage[i];
  }
  o.stages = stages;
  o.seed = s->seed;
  o.nthreads = s->opt.nthreads;
  o.max_memory = s->opt.max_memory;
  o.history_per_param = phase == CAFFE__PHASE__TRAIN ? s->history_per_param : 0;
  o.share_diffs = phase == CAFFE__PHASE__TRAIN && !s->opt.keep_diffs;
  o.source = source;
  o.fault = &s->fault;
  if (phase == CAFFE__PHASE__TRAIN) {
    o.shard_rank = s->rank;
    o.shard_count = s->nworkers;
  }
  return kiln_net_create(np, &o, out);
}

static int build_nets(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  const Caffe__NetParameter *train_np = NULL;
  const char *train_src = s->source;
  int given = !!p->net + !!p->net_param + !!p->train_net + !!p->train_net_param;
  if (given != 1)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: give exactly one of net, net_param, train_net, train_net_param (%d given)",
                       s->source, given);
  Caffe__NetParameter *loaded;
  if (p->net || p->train_net) {
    train_src = p->net ? p->net : p->train_net;
    KILN_TRY(load_net_file(s, train_src, &loaded));
    train_np = loaded;
  } else {
    train_np = p->net_param ? p->net_param : p->train_net_param;
  }
  s->train_param = train_np;
  KILN_TRY(make_net(s, train_np, CAFFE__PHASE__TRAIN, p->train_state, train_src, &s->net));
  /* Test nets: the listed ones, else the generic net once per test_iter. */
  int ntest = (int)(p->n_test_net + p->n_test_net_param);
  bool generic = ntest == 0 && (p->net || p->net_param);
  if (generic) ntest = (int)p->n_test_iter;
  if ((int)p->n_test_iter != ntest)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %zu test_iter values for %d test nets", s->source,
                       p->n_test_iter, ntest);
  if (ntest > 0 && p->test_interval <= 0)
    kiln_log(KILN_LOG_WARN, "%s: test nets given but test_interval is 0: testing only at the end",
             s->source);
  s->test_nets = calloc((size_t)ntest + 1, sizeof(kiln_net *));
  if (!s->test_nets) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  /* Only rank 0 tests, so only rank 0 builds test nets (and opens their data). */
  for (int i = 0; i < ntest && s->rank == 0; i++) {
    const Caffe__NetParameter *np;
    const char *src = s->source;
    if (generic) {
      np = train_np;
      src = train_src;
    } else if (i < (int)p->n_test_net_param) {
      np = p->test_net_param[i];
    } else {
      src = p->test_net[i - p->n_test_net_param];
      KILN_TRY(load_net_file(s, src, &loaded));
      np = loaded;
    }
    const Caffe__NetState *st = i < (int)p->n_test_state ? p->test_state[i] : NULL;
    KILN_TRY(make_net(s, np, CAFFE__PHASE__TEST, st, src, &s->test_nets[i]));
    s->ntest++;
    KILN_TRY(kiln_net_share_params(s->test_nets[i], s->net));
  }
  return KILN_OK;
}

static int check_params(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  const char *pol = p->lr_policy ? p->lr_policy : "";
  if (!p->lr_policy)
    return kiln_errorf(KILN_ERR_INVALID, "%s: lr_policy is required (fixed, step, exp, inv, "
                       "multistep, poly, sigmoid)", s->source);
  static const char *const policies[] = {"fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid"};
  bool known = false;
  for (size_t i = 0; i < 7; i++) known |= strcmp(pol, policies[i]) == 0;
  if (!known)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: unknown lr_policy '%s' (known: fixed, step, exp, inv, multistep, poly, "
                       "sigmoid)",
                       s->source, pol);
  if (strcmp(pol, "step") == 0 && p->stepsize <= 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: lr_policy 'step' needs stepsize > 0", s->source);
  if (p->iter_size < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: iter_size must be >= 1", s->source);
  if (p->average_loss < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: average_loss must be >= 1", s->source);
  const char *reg = p->regularization_type ? p->regularization_type : "L2";
  if (strcmp(reg, "L2") != 0 && strcmp(reg, "L1") != 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: unknown regularization_type '%s' (L1 or L2)",
                       s->source, reg);
  if (p->snapshot_format == CAFFE__SOLVER_PARAMETER__SNAPSHOT_FORMAT__HDF5)
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "%s: snapshot_format HDF5 is not supported; use BINARYPROTO", s->source);
  for (size_t i = 1; i < p->n_stepvalue; i++)
    if (p->stepvalue[i] <= p->stepvalue[i - 1])
      return kiln_errorf(KILN_ERR_INVALID, "%s: stepvalue must increase", s->source);
  return KILN_OK;
}

static int plan_buckets(kiln_solver *s);
static int place_gradients(kiln_solver *s);

/* ---- workers ------------------------------------------------------------------------------ */

/* The solver file's sync { } with the caller's overrides on top. */
static int resolve_sync(kiln_solver *s) {
  const Caffe__SyncParameter *f = s->param->sync;
  kiln_sync_config c = {.mode = KILN_SYNC_GRADIENT};
  if (f) {
    c.mode = f->mode == CAFFE__SYNC_PARAMETER__MODE__MODEL  ? KILN_SYNC_MODEL
             : f->mode == CAFFE__SYNC_PARAMETER__MODE__TIME ? KILN_SYNC_TIME
                                                            : KILN_SYNC_GRADIENT;
    c.interval_iters = f->interval_iters;
    c.interval_seconds = f->interval_seconds;
    c.warmup_iters = f->warmup_iters;
    c.deterministic = f->deterministic;
  }
  const kiln_sync_config *o = &s->opt.sync;
  if (o->mode != KILN_SYNC_DEFAULT) {
    c.mode = o->mode;
    c.interval_iters = o->interval_iters;
    c.interval_seconds = o->interval_seconds;
    c.warmup_iters = o->warmup_iters;
  }
  c.deterministic |= o->deterministic;
  s->sync = c;
  int rc = kiln_sync_check(&c, s->nworkers);
  return rc ? kiln_error_context(rc, "%s: ", s->source) : KILN_OK;
}

/* Rank 0 keeps the single-worker generator stream (so one worker trains as before); the others
 * draw dropout masks from streams of their own. */
static void seed_worker_rng(kiln_solver *s, uint64_t iter) {
  if (s->rank > 0)
    kiln_rng_seed(&s->net->rng, s->seed, 0x776f726b00000000ULL + ((uint64_t)s->rank << 40) + iter);
}

static int hash_message(kiln_sha256_ctx *h, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n + 1);
  if (!buf) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  protobuf_c_message_pack(m, buf);
  kiln_sha256_update(h, buf, n);
  free(buf);
  return KILN_OK;
}

/* What must be equal on every worker: the solver and train net as parsed (so comments and
 * layout do not matter) and the settings that change what the collectives do. */
static int config_digest(kiln_solver *s, uint8_t digest[32]) {
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  KILN_TRY(hash_message(&h, &s->param->base));
  KILN_TRY(hash_message(&h, &s->train_param->base));
  int64_t settings[] = {s->nworkers, s->sync.mode, s->sync.interval_iters,
                        (int64_t)(s->sync.interval_seconds * 1e6), s->sync.warmup_iters,
                        s->sync.deterministic,
                        s->max_iter, s->net->nparam_floats, s->batch_size, s->history_per_param};
  kiln_sha256_update(&h, settings, sizeof settings);
  kiln_sha256_final(&h, digest);
  return KILN_OK;
}

/* Every rank contributes a digest; all of them learn which ranks differ from rank 0, so all of
 * them fail together with the same message instead of hanging in a later collective. */
static int workers_agree(kiln_solver *s, const uint8_t digest[32], const char *what,
                         const char *hint) {
  if (s->nworkers <= 1) return KILN_OK;
  uint8_t *all = malloc((size_t)s->nworkers * 32);
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = kiln_comm_allgather(s->opt.comm, digest, 32, all);
  if (rc) {
    free(all);
    return kiln_error_context(rc, "checking that the workers agree on %s: ", what);
  }
  char ranks[512] = "";
  size_t used = 0;
  int ndiff = 0, first = -1;
  for (int r = 1; r < s->nworkers; r++) {
    if (memcmp(all + 32 * r, all, 32) == 0) continue;
    if (first < 0) first = r;
    if (used < sizeof ranks - 16)
      used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", ndiff ? ", " : "", r);
    ndiff++;
  }
  if (ndiff) {
    char h0[65], h1[65];
    kiln_sha256_hex(all, h0);
    kiln_sha256_hex(all + 32 * first, h1);
    rc = kiln_errorf(KILN_ERR_COMM,
                     "the %d workers disagree on %s: rank%s %s differ%s from rank 0 (hash "
                     "%.12s on rank 0, %.12s on rank %d); %s",
                     s->nworkers, what, ndiff > 1 ? "s" : "", ranks, ndiff > 1 ? "" : "s", h0, h1,
                     first, hint);
  }
  free(all);
  return rc;
}

/* The train net's data as this worker's files hold it (the layers' fingerprints), and in `what`
 * the sources; empty when no layer reads files. Two hosts with different files under the same
 * path would otherwise train on different data without a word. */
static int data_digest(kiln_solver *s, uint8_t digest[32], char *what, size_t n) {
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  size_t used = 0;
  what[0] = '\0';
  for (int i = 0; i < s->net->nlayers; i++) {
    kiln_layer *l = s->net->layers[i];
    if (!l->ops->fingerprint) continue;
    uint8_t d[32];
    char src[1024];
    KILN_TRY(l->ops->fingerprint(l, d, src, sizeof src));
    kiln_sha256_update(&h, l->name, strlen(l->name) + 1);
    kiln_sha256_update(&h, d, sizeof d);
    if (used + 1 < n) {
      int k = snprintf(what + used, n - used, "%slayer '%s' reads %s", used ? "; " : "", l->name, src);
      used = k < 0 ? used : used + (size_t)k < n ? used + (size_t)k : n - 1;
    }
  }
  kiln_sha256_final(&h, digest);
  return KILN_OK;
}

/* An injected fault must hit something: a sleep names a layer of the train net. The log says a
 * fault is on, so nobody mistakes the run for a real one. */
static int check_fault(kiln_solver *s) {
  if (s->fault.kind == KILN_FAULT_NONE) return KILN_OK;
  if (s->fault.kind == KILN_FAULT_SLEEP && !kiln_net_layer(s->net, s->fault.layer)) {
    char names[1024] = "";
    size_t used = 0;
    for (int i = 0; i < s->net->nlayers && used < sizeof names; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                               s->net->layers[i]->name);
    return kiln_errorf(KILN_ERR_INVALID, "%s=sleep:%s:%d: the train net '%s' has no layer '%s' "
                       "(its layers: %s)",
                       KILN_FAULT_ENV, s->fault.layer, s->fault.ms, s->net->name, s->fault.layer,
                       names);
  }
  char what[256];
  kiln_log(KILN_LOG_WARN, "%s is set: injecting a fault: %s", KILN_FAULT_ENV,
           kiln_fault_describe(&s->fault, what, sizeof what));
  return KILN_OK;
}

int kiln_solver_create(const char *solver_path, const kiln_solver_options *opt, kiln_solver **out) {
  *out = NULL;
  kiln_solver *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (opt) s->opt = *opt;
  s->rank = kiln_comm_rank(s->opt.comm);
  s->nworkers = kiln_comm_size(s->opt.comm);
  s->start_ms = kiln_now_ms();
  s->start_cpu_wait_ms = kiln_thread_cpu_wait_ms();
  s->source = kiln_strdup(solver_path);
  ProtobufCMessage *m;
  int rc = kiln_text_parse_file(solver_path, &caffe__solver_parameter__descriptor, &m);
  if (rc) {
    kiln_solver_free(s);
    return rc;
  }
  s->param = (Caffe__SolverParameter *)m;
  const Caffe__SolverParameter *p = s->param;
  if ((rc = kiln_fault_from_env(&s->fault))) {
    kiln_solver_free(s);
    return rc;
  }
  s->seed = p->random_seed >= 0 ? (uint64_t)p->random_seed : 1701; /* deterministic by default */
  s->max_iter = s->opt.max_iter_override > 0 ? s->opt.max_iter_override : p->max_iter;
  if (p->snapshot_prefix && p->snapshot_prefix[0]) {
    s->snapshot_prefix = kiln_strdup(p->snapshot_prefix);
  } else {
    s->snapshot_prefix = kiln_strdup(solver_path);
    char *dot = strrchr(s->snapshot_prefix, '.');
    if (dot && strchr(dot, '/') == NULL) *dot = '\0';
  }
  rc = check_params(s);
  if (!rc) rc = resolve_sync(s);
  if (!rc) rc = update_resolve_type(s);
  if (!rc) {
    s->history_per_param = update_history_count(s->type);
    rc = build_nets(s);
  }
  if (!rc) rc = check_fault(s);
  if (!rc) {
    size_t model = (size_t)s->net->nparam_floats * sizeof(float);
    s->history = kiln_alloc_huge(model * s->history_per_param);
    s->loss_window = calloc((size_t)p->average_loss, sizeof(float));
    if (p->iter_size > 1) s->grad_acc = kiln_alloc_huge(model);
    if (!s->history || !s->loss_window || (p->iter_size > 1 && !s->grad_acc))
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  if (!rc) {
    s->batch_size = 1;
    for (int i = 0; i < s->net->nlayers; i++)
      if (s->net->layers[i]->ops->is_data && s->net->layers[i]->ntop > 0 &&
          s->net->layers[i]->top[0]->naxes > 0) {
        s->batch_size = (int)s->net->layers[i]->top[0]->shape[0];
        break;
      }
    seed_worker_rng(s, 0);
    /* Summed in buckets during backward (the last pass's, with iter_size > 1), in rank order
     * with --deterministic; --no-overlap sums the whole buffer after backward instead. */
    s->overlap = s->nworkers > 1 && !s->opt.no_overlap;
    if (s->overlap) rc = plan_buckets(s);
  }
  if (!rc && s->nworkers > 1) rc = place_gradients(s);
  if (!rc) {
    uint8_t digest[32];
    rc = config_digest(s, digest);
    if (!rc)
      rc = workers_agree(s, digest, "the solver and train net",
                         "start every worker with the same solver and net files and the same "
                         "--sync / --deterministic options");
  }
  if (!rc && s->nworkers > 1) {
    uint8_t digest[32];
    char what[1536], hint[2048];
    rc = data_digest(s, digest, what, sizeof what);
    if (!rc && what[0]) {
      snprintf(hint, sizeof hint,
               "every worker must hold the same data under the same path: %s", what);
      rc = workers_agree(s, digest, "the training data", hint);
    }
  }
  if (!rc)
    kiln_log(KILN_LOG_INFO, "solver %s: %s, seed %llu, %d threads%s", solver_path,
             kiln_solver_type_name(s->type), (unsigned long long)s->seed, s->net->nthreads,
             s->nworkers > 1 ? " per worker" : "");
  if (rc) {
    kiln_solver_free(s);
    return rc;
  }
  *out = s;
  return KILN_OK;
}

void kiln_solver_free(kiln_solver *s) {
  if (!s) return;
  for (int i = 0; i < s->ntest; i++) kiln_net_free(s->test_nets[i]);
  free(s->test_nets);
  kiln_net_free(s->net);
  kiln_comm_release_sum_buffer(s->opt.comm, s->sum_buffer); /* after the net that used it */
  for (int i = 0; i < s->nnet_params; i++) protobuf_c_message_free_unpacked(&s->net_params[i]->base, NULL);
  free(s->net_params);
  if (s->param) protobuf_c_message_free_unpacked(&s->param->base, NULL);
  kiln_free(s->history);
  kiln_free(s->grad_acc);
  free(s->buckets);
  free(s->loss_window);
  free(s->source);
  free(s->snapshot_prefix);
  free(s);
}

/* ---- what the solver holds ------------------------------------------------------------------- */

kiln_net *kiln_solver_net(const kiln_solver *s) { return s->net; }
int kiln_solver_test_net_count(const kiln_solver *s) { return s->ntest; }
kiln_net *kiln_solver_test_net(const kiln_solver *s, int k) {
  return k >= 0 && k < s->ntest ? s->test_nets[k] : NULL;
}
int kiln_solver_iter(const kiln_solver *s) { return s->iter; }
const Caffe__SolverParameter *kiln_solver_param(const kiln_solver *s) { return s->param; }
kiln_solver_type kiln_solver_type_of(const kiln_solver *s) { return s->type; }
int kiln_solver_batch_size(const kiln_solver *s) { return s->batch_size; }
int kiln_solver_nworkers(const kiln_solver *s) { return s->nworkers; }
const kiln_sync_config *kiln_solver_sync(const kiln_solver *s) { return &s->sync; }
const float *kiln_solver_history(const kiln_solver *s, int *per_param) {
  if (per_param) *per_param = s->history_per_param;
  return s->history;
}

/* ---- loop -------------------------------------------------------------------------------------- */

static int check_finite(kiln_solver *s, float loss) {
  if (isfinite(loss)) return KILN_OK;
  return kiln_errorf(KILN_ERR_NUMERIC,
                     "iteration %d: the loss is %g; training diverged (lower base_lr, or clip "
                     "gradients with clip_gradients)",
                     s->iter, loss);
}

int kiln_solver_test(kiln_solver *s, int k) {
  kiln_net *net = s->test_nets[k];
  int iters = s->param->test_iter[k];
  int n = net->noutputs;
  double *sum = calloc((size_t)n + 1, sizeof(double));
  float *vals = calloc((size_t)n + 1, sizeof(float));
  const char **names = calloc((size_t)n + 1, sizeof(char *));
  if (!sum || !vals || !names) {
    free(sum);
    free(vals);
    free(names);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  int rc = KILN_OK;
  double loss = 0;
  for (int it = 0; it < iters && !rc; it++) {
    float l;
    rc = kiln_net_forward(net, &l);
    loss += l;
    for (int o = 0; o < n && !rc; o++) {
      const kiln_blob *b = net->outputs[o];
      double v = 0;
      for (int64_t i = 0; i < b->count; i++) v += b->data[i];
      sum[o] += v;
    }
  }
  if (!rc) {
    float test_loss = iters ? (float)(loss / iters) : 0;
    for (int o = 0; o < n; o++) {
      names[o] = net->outputs[o]->name;
      vals[o] = iters ? (float)(sum[o] / iters) : 0;
    }
    kiln_event e = {.event = "test", .iter = s->iter, .loss = test_loss, .test_net = k,
                    .noutputs = n, .output_names = names, .output_values = vals};
    emit(s, &e);
  }
  free(sum);
  free(vals);
  free(names);
  return rc;
}

static int test_all(kiln_solver *s) {
  for (int k = 0; k < s->ntest; k++) KILN_TRY(kiln_solver_test(s, k));
  return KILN_OK;
}

/* Rank 0's parameters and solver history to every worker: before the first step, and again
 * after a restore or a --weights load. */
static int sync_params(kiln_solver *s) {
  if (s->params_synced) return KILN_OK;
  if (s->nworkers > 1) {
    kiln_net *net = s->net;
    int rc = kiln_comm_broadcast(s->opt.comm, net->param_data, net->nparam_floats, 0);
    if (!rc)
      rc = kiln_comm_broadcast(s->opt.comm, s->history,
                               net->nparam_floats * (int64_t)s->history_per_param, 0);
    if (rc) return kiln_error_context(rc, "broadcast of rank 0's parameters: ");
  }
  s->params_synced = true;
  return KILN_OK;
}

static int backward_hook(void *user, int layer);

/* With workers on one host, the train net's gradients move into the communicator's shared
 * memory: backward writes them where the other workers add them up, and the sum lands where the
 * update reads it (no copy in or out). Elsewhere, or for a gradient too large, they stay. */
static int place_gradients(kiln_solver *s) {
  float *home = kiln_comm_claim_sum_buffer(s->opt.comm, s->net->nparam_floats);
  if (!home) return KILN_OK;
  kiln_net_place_param_diff(s->net, home);
  s->sum_buffer = home;
  for (int i = 0; i < s->ntest; i++) KILN_TRY(kiln_net_share_params(s->test_nets[i], s->net));
  if (s->rank == 0)
    kiln_log(KILN_LOG_INFO, "the gradients (%lld floats) lie in shared memory: summed in place",
             (long long)s->net->nparam_floats);
  return KILN_OK;
}

/* iter_size forward/backward passes; param_diff ends as their gradients summed in pass order.
 * `loss_sum` gets the passes' losses added up. With `overlap`, the last pass's backward starts
 * each bucket's sum over the workers once the bucket is final (start_ready_buckets adds the
 * earlier passes into it first), and the caller finishes them. */
static int compute_gradients(kiln_solver *s, bool overlap, double *loss_sum) {
  kiln_net *net = s->net;
  int passes = s->param->iter_size;
  *loss_sum = 0;
  for (int i = 0; i < passes; i++) {
    kiln_net_zero_param_diff(net);
    float l;
    KILN_TRY(kiln_net_forward(net, &l));
    bool last = i == passes - 1;
    if (overlap && last) {
      s->next_bucket = 0;
      net->backward_hook = backward_hook;
      net->backward_hook_user = s;
    }
    int rc = kiln_net_backward(net);
    net->backward_hook = NULL;
    KILN_TRY(rc);
    *loss_sum += l;
    if (passes == 1) break;
    if (i == 0)
      memcpy(s->grad_acc, net->param_diff, sizeof(float) * (size_t)net->nparam_floats);
    else if (!last)
      kiln_parallel_accumulate(s->grad_acc, net->param_diff, net->nparam_floats);
    else if (!overlap) /* the last pass adds the sum into its own gradient: a + b == b + a, and
                          no copy back */
      kiln_parallel_accumulate(net->param_diff, s->grad_acc, net->nparam_floats);
  }
  return KILN_OK;
}

/* The iteration's loss over every pass of every worker, added in rank order (the order one
 * worker adds its passes in, so the loss too matches one worker with iter_size N). A worker that
 * steps on its own (`local`) reports its own. */
static int global_loss(kiln_solver *s, double local, bool own, float *out) {
  double total = local;
  int workers = own ? 1 : s->nworkers;
  if (workers > 1) {
    double *all = malloc(sizeof(double) * (size_t)s->nworkers);
    if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    int rc = kiln_comm_allgather(s->opt.comm, &local, sizeof local, all);
    total = 0;
    for (int r = 0; r < s->nworkers && !rc; r++) total += all[r];
    free(all);
    if (rc) return kiln_error_context(rc, "gathering the workers' losses: ");
  }
  *out = (float)(total / ((double)s->param->iter_size * workers));
  return KILN_OK;
}

/* ---- overlapped gradient sums (GRADIENT) ------------------------------------------------------ */

struct kiln_grad_bucket {
  int64_t off, n;   /* a range of the flat gradient */
  int ready_layer;  /* final once backward has run this layer (the first layer using it) */
};

/* 256 KiB: big enough that a sum's fixed cost is small, small enough that the last layers'
 * gradients go out while the first layers still compute. 1 MiB left LeNet's and resnet20's
 * whole gradient (1.7 and 1.1 MB) in one or two buckets that started only at the end of
 * backward; 256 KiB took LeNet's wait per iteration from 0.47 to 0.13 ms (docs/PERF.md). */
enum { BUCKET_FLOATS = 1 << 16 };

static int plan_buckets(kiln_solver *s) {
  kiln_net *net = s->net;
  int nl = net->nlearnable;
  if (nl == 0) return KILN_OK;
  int *ready = malloc(sizeof(int) * (size_t)nl);
  s->buckets = malloc(sizeof *s->buckets * (size_t)nl);
  if (!ready || !s->buckets) {
    free(ready);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int k = 0; k < nl; k++) ready[k] = net->nlayers;
  /* a shared parameter is final only after the first layer using it */
  for (int j = 0; j < net->nlayers; j++)
    for (int p = 0; p < net->layers[j]->nparam; p++)
      for (int k = 0; k < nl; k++)
        if (net->learnable[k]->data == net->layers[j]->param[p]->data && j < ready[k]) ready[k] = j;
  int64_t end = net->nparam_floats;
  int r = net->nlayers;
  for (int k = nl - 1; k >= 0; k--) {
    if (ready[k] < r) r = ready[k];
    int64_t start = net->learnable_offset[k];
    if (end - start >= BUCKET_FLOATS || k == 0) {
      s->buckets[s->nbuckets++] = (struct kiln_grad_bucket){.off = start, .n = end - start,
                                                            .ready_layer = r};
      end = start;
      r = net->nlayers;
    }
  }
  free(ready);
  return KILN_OK;
}

/* Starts the sum of every bucket that backward is done with (all of them for layer -1). With
 * iter_size > 1 the earlier passes' sum is added in first, as compute_gradients would after
 * backward: the same additions, bucket by bucket. */
static int start_ready_buckets(kiln_solver *s, int layer) {
  while (s->next_bucket < s->nbuckets && s->buckets[s->next_bucket].ready_layer >= layer) {
    const struct kiln_grad_bucket *b = &s->buckets[s->next_bucket++];
    float *g = s->net->param_diff + b->off;
    if (s->param->iter_size > 1) kiln_parallel_accumulate(g, s->grad_acc + b->off, b->n);
    KILN_TRY(kiln_comm_bucket_start(s->opt.comm, g, b->n, s->sync.deterministic));
  }
  return kiln_comm_bucket_progress(s->opt.comm);
}

static int backward_hook(void *user, int layer) {
  int rc = start_ready_buckets(user, layer);
  return rc ? kiln_error_context(rc, "gradient sync: ") : KILN_OK;
}

/* ---- model averaging (MODEL and TIME) ------------------------------------------------------- */

/* Every worker's parameters (running statistics included) and solver history become
 * sum_r weight_r x theirs_r: one model again. */
static int average_model(kiln_solver *s, float weight) {
  kiln_net *net = s->net;
  double t = kiln_now_ms();
  int rc = kiln_sync_average(s->opt.comm, &s->sync, net->param_data, net->nparam_floats, weight);
  if (!rc)
    rc = kiln_sync_average(s->opt.comm, &s->sync, s->history,
                           net->nparam_floats * (int64_t)s->history_per_param, weight);
  s->sync_ms += kiln_now_ms() - t;
  if (rc) return rc;
  s->naverages++;
  s->diverged = s->state_diverged = false;
  return KILN_OK;
}

/* The running statistics alone (BatchNorm's): in GRADIENT mode every worker holds the same
 * parameters, but each updates its statistics from its own batches. The updates are linear
 * (decayed sums), so averaging before each test and snapshot gives what averaging every
 * iteration would, without a collective per iteration. */
static int average_state(kiln_solver *s) {
  kiln_net *net = s->net;
  float w = 1.0f / (float)s->nworkers;
  double t = kiln_now_ms();
  for (int k = 0; k < net->nlearnable; k++)
    if (net->is_state[k])
      KILN_TRY(kiln_sync_average(s->opt.comm, &s->sync, net->learnable[k]->data,
                                 net->learnable[k]->count, w));
  s->sync_ms += kiln_now_ms() - t;
  s->state_diverged = false;
  return KILN_OK;
}

/* Before a test pass, a snapshot or the end of training: one model on every worker (a
 * collective: every rank calls it at the same point). */
static int converge_workers(kiln_solver *s) {
  if (s->nworkers <= 1) return KILN_OK;
  if (s->diverged) return average_model(s, 1.0f / (float)s->nworkers);
  if (s->state_diverged) return average_state(s);
  return KILN_OK;
}

static bool test_due(const kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  return p->test_interval > 0 && s->iter % p->test_interval == 0 &&
         (s->iter > 0 || p->test_initialization);
}

static int run_tests(kiln_solver *s) {
  KILN_TRY(converge_workers(s));
  return s->rank == 0 ? test_all(s) : KILN_OK;
}

/* ---- iterations ------------------------------------------------------------------------------ */

typedef struct {
  double start_ms; /* the display window's start */
  int iters;
} rate_window;

/* One iteration: gradients, their sum over the workers unless `local`, the update. */
static int one_iteration(kiln_solver *s, bool local, rate_window *w) {
  const Caffe__SolverParameter *p = s->param;
  double work_start = kiln_now_ms();
  double loss;
  bool overlap = s->overlap && !local && s->nworkers > 1;
  KILN_TRY(compute_gradients(s, overlap, &loss));
  KILN_TRY(kiln_fault_leak(&s->fault)); /* nothing unless KILN_FAULT=leak:KB */
  int summed = 1;
  if (s->nworkers > 1 && !local) {
    double t = kiln_now_ms();
    if (overlap) {
      int rc = start_ready_buckets(s, -1); /* every layer is done */
      if (!rc) rc = kiln_comm_bucket_finish(s->opt.comm);
      if (rc) return kiln_error_context(rc, "gradient sync: ");
    } else {
      KILN_TRY(kiln_sync_gradients(s->opt.comm, &s->sync, s->net->param_diff,
                                   s->net->nparam_floats));
    }
    s->sync_ms += kiln_now_ms() - t;
    work_start += kiln_now_ms() - t;
    summed = s->nworkers;
  }
  float l = 0;
  KILN_TRY(global_loss(s, loss, local, &l));
  KILN_TRY(check_finite(s, l));
  s->loss_window[s->loss_window_pos] = l;
  s->loss_window_pos = (s->loss_window_pos + 1) % p->average_loss;
  if (s->loss_window_n < p->average_loss) s->loss_window_n++;
  double smoothed = 0;
  for (int i = 0; i < s->loss_window_n; i++) smoothed += s->loss_window[i];
  smoothed /= s->loss_window_n;
  float rate = kiln_solver_learning_rate(s);
  w->iters++;
  double now = kiln_now_ms();
  /* samples per iteration over all workers (in TIME mode: as if all ran at rank 0's pace) */
  double global_batch = (double)s->batch_size * p->iter_size * s->nworkers;
  double sps = (double)w->iters * global_batch / ((now - w->start_ms) / 1e3);
  if (p->display > 0 && s->iter % p->display == 0) {
    int no = s->net->noutputs;
    const char *names[64];
    float vals[64];
    if (no > 64) no = 64;
    for (int o = 0; o < no; o++) {
      names[o] = s->net->outputs[o]->name;
      vals[o] = s->net->outputs[o]->count ? s->net->outputs[o]->data[0] : 0;
    }
    kiln_event e = {.event = "train", .iter = s->iter, .loss = (float)smoothed, .lr = rate,
                    .samples_per_s = sps, .noutputs = no, .output_names = names,
                    .output_values = vals};
    emit(s, &e);
    w->start_ms = now;
    w->iters = 0;
  }
  if (!update_apply(s, rate, summed)) KILN_TRY(update_check_finite(s, rate));
  if (s->opt.debug_slow_ms > 0 && s->rank == s->opt.debug_slow_rank)
    kiln_sleep_ms(s->opt.debug_slow_ms);
  s->work_ms += kiln_now_ms() - work_start;
  s->work_samples += (uint64_t)s->batch_size * (uint64_t)p->iter_size;
  s->work_iters++;
  s->iter++;
  if (s->nworkers > 1) {
    s->state_diverged = true;
    if (local) s->diverged = true;
  }
  kiln_event pe = {.event = "progress", .iter = s->iter, .loss = (float)smoothed, .lr = rate,
                   .samples_per_s = sps};
  emit(s, &pe);
  return KILN_OK;
}

/* TIME mode, one round: local iterations for interval_seconds of this worker's own clock (at
 * least one, none past `stop`), then the average weighted by the iterations (hence samples)
 * each worker ran, so a slow worker's few steps pull the model as little as they moved it.
 * The iteration count and the data cursors then move to the furthest worker's: the schedule
 * follows the fastest worker, and batches dealt to a slower worker that it did not reach in
 * the round are skipped (docs/distributed.md). Tests and snapshots whose iteration the round
 * passed run after the average. */
static int time_round(kiln_solver *s, int stop, rate_window *w) {
  const Caffe__SolverParameter *p = s->param;
  int start = s->iter;
  /* The round started when the last one's average ended: rank 0's test pass counts against
   * its own round, so the others do not wait for it. */
  double t0 = s->round_start_ms > 0 ? s->round_start_ms : kiln_now_ms();
  double limit = s->sync.interval_seconds * 1e3;
  uint64_t steps = 0;
  do {
    KILN_TRY(one_iteration(s, true, w));
    steps++;
  } while (s->iter < stop && kiln_now_ms() - t0 < limit);
  int nc = kiln_net_data_layer_count(s->net);
  size_t per = (size_t)nc + 1;
  uint64_t *mine = calloc(per, sizeof(uint64_t));
  uint64_t *all = calloc(per * (size_t)s->nworkers, sizeof(uint64_t));
  int rc = mine && all ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) {
    mine[0] = steps;
    kiln_net_get_cursors(s->net, mine + 1); /* returns the count, nc */
  }
  double t = kiln_now_ms();
  if (!rc) rc = kiln_comm_allgather(s->opt.comm, mine, per * sizeof(uint64_t), all);
  s->sync_ms += kiln_now_ms() - t; /* waiting for the slowest worker's last step */
  uint64_t total = 0, most = 0;
  bool move = false;
  if (!rc) {
    for (int r = 0; r < s->nworkers; r++) {
      total += all[r * per];
      if (all[r * per] > most) most = all[r * per];
    }
    for (int c = 0; c < nc; c++) {
      uint64_t far = 0;
      for (int r = 0; r < s->nworkers; r++)
        if (all[r * per + 1 + (size_t)c] > far) far = all[r * per + 1 + (size_t)c];
      if (far != mine[1 + c]) move = true;
      mine[1 + c] = far;
    }
    rc = average_model(s, (float)((double)steps / (double)total));
  }
  if (!rc && move) rc = kiln_net_set_cursors(s->net, mine + 1, nc);
  free(mine);
  free(all);
  if (rc) return kiln_error_context(rc, "time sync after iteration %d: ", s->iter);
  s->iter = start + (int)most;
  s->round_start_ms = kiln_now_ms();
  if (p->test_interval > 0 && s->iter / p->test_interval > start / p->test_interval &&
      s->rank == 0)
    KILN_TRY(test_all(s));
  if (p->snapshot > 0 && s->iter / p->snapshot > start / p->snapshot)
    KILN_TRY(kiln_solver_snapshot(s, NULL));
  return KILN_OK;
}

int kiln_solver_step(kiln_solver *s, int n) {
  const Caffe__SolverParameter *p = s->param;
  KILN_TRY(sync_params(s));
  int stop = s->iter + n;
  rate_window w = {kiln_now_ms(), 0};
  while (s->iter < stop) {
    bool local = kiln_sync_is_local(&s->sync, s->nworkers, s->iter);
    if (local && s->sync.mode == KILN_SYNC_TIME) {
      KILN_TRY(time_round(s, stop, &w));
      continue;
    }
    if (test_due(s)) KILN_TRY(run_tests(s));
    KILN_TRY(one_iteration(s, local, &w));
    if (local && (s->iter - s->sync.warmup_iters) % s->sync.interval_iters == 0)
      KILN_TRY(average_model(s, 1.0f / (float)s->nworkers));
    if (p->snapshot > 0 && s->iter % p->snapshot == 0) KILN_TRY(kiln_solver_snapshot(s, NULL));
  }
  return KILN_OK;
}

/* One "worker" event per rank on rank 0: each worker's own throughput and time in sync, so a
 * slow worker (which every other one waits for) shows. */
static int report_workers(kiln_solver *s) {
  if (s->nworkers <= 1) return KILN_OK;
  double busy = s->work_ms + s->sync_ms;
  double mine[4] = {s->work_ms > 0 ? s->work_samples / (s->work_ms / 1e3) : 0, s->sync_ms,
                    busy > 0 ? s->work_samples / (busy / 1e3) : 0, (double)s->work_iters};
  double *all = malloc(sizeof mine * (size_t)s->nworkers);
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = kiln_comm_allgather(s->opt.comm, mine, sizeof mine, all);
  for (int r = 0; r < s->nworkers && !rc; r++) {
    kiln_event e = {.event = "worker", .iter = s->iter, .rank = r, .samples_per_s = all[4 * r],
                    .sync_ms = all[4 * r + 1], .wall_samples_per_s = all[4 * r + 2],
                    .worker_iters = (int64_t)all[4 * r + 3]};
    emit(s, &e);
  }
  free(all);
  return rc ? kiln_error_context(rc, "gathering the workers' throughput: ") : KILN_OK;
}

int kiln_solver_solve(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  KILN_TRY(kiln_solver_step(s, s->max_iter - s->iter));
  /* MODEL and TIME: the job ends with one model (what rank 0 saves and tests). */
  KILN_TRY(converge_workers(s));
  if (p->snapshot_after_train && (p->snapshot <= 0 || s->iter % p->snapshot != 0))
    KILN_TRY(kiln_solver_snapshot(s, NULL));
  if (s->rank == 0 && p->test_interval > 0 && s->iter % p->test_interval == 0)
    KILN_TRY(test_all(s));
  KILN_TRY(report_workers(s));
  kiln_event e = {.event = "done", .iter = s->iter};
  emit(s, &e);
  return KILN_OK;
}

int kiln_solver_load_weights(kiln_solver *s, const char *path) {
  s->params_synced = false;
  /* Rank 0's parameters go to the other workers before the first step (sync_params), so only
   * rank 0 needs the file. */
  return s->rank == 0 ? kiln_net_load_weights(s->net, path) : KILN_OK;
}

/* ---- snapshots ---------------------------------------------------------------------------------- */

int kiln_solver_snapshot(kiln_solver *s, char **path_out) {
  kiln_net *net = s->net;
  if (path_out) *path_out = NULL;
  /* One model to save: MODEL / TIME workers average first, GRADIENT workers their statistics. */
  KILN_TRY(converge_workers(s));
  /* Every worker's dropout generator, so that each resumes its own stream. */
  kiln_rng *rngs = NULL;
  if (s->nworkers > 1) {
    rngs = malloc(sizeof(kiln_rng) * (size_t)s->nworkers);
    if (!rngs) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    int rc = kiln_comm_allgather(s->opt.comm, &net->rng, sizeof net->rng, rngs);
    if (rc || s->rank != 0) {
      free(rngs);
      return rc ? kiln_error_context(rc, "snapshot: gathering generator states: ") : KILN_OK;
    }
  }
  size_t n = strlen(s->snapshot_prefix) + 64;
  char *model = malloc(n), *state_path = malloc(n);
  if (!model || !state_path) {
    free(model);
    free(state_path);
    free(rngs);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  snprintf(model, n, "%s_iter_%d.caffemodel", s->snapshot_prefix, s->iter);
  snprintf(state_path, n, "%s_iter_%d.solverstate", s->snapshot_prefix, s->iter);
  int rc = kiln_net_save_weights(net, model);

  Caffe__SolverState st = CAFFE__SOLVER_STATE__INIT;
  int nh = net->nlearnable * s->history_per_param;
  Caffe__BlobProto *bps = calloc((size_t)nh + 1, sizeof *bps);
  Caffe__BlobProto **bpp = calloc((size_t)nh + 1, sizeof *bpp);
  Caffe__BlobShape *shapes = calloc((size_t)nh + 1, sizeof *shapes);
  int nc = kiln_net_data_layer_count(net);
  uint64_t *cursors = calloc((size_t)nc + 1, sizeof *cursors); /* one per data layer */
  ProtobufCBinaryData *worker_rng = calloc((size_t)s->nworkers, sizeof *worker_rng);
  if (!rc && (!bps || !bpp || !shapes || !cursors || !worker_rng))
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) {
    st.has_iter = st.has_current_step = true;
    st.iter = s->iter;
    st.current_step = s->current_step;
    st.learned_net = model;
    /* Caffe's layout: all first histories, then (Adam, AdaDelta) all second ones. */
    for (int h = 0; h < s->history_per_param; h++)
      for (int k = 0; k < net->nlearnable; k++) {
        int i = h * net->nlearnable + k;
        caffe__blob_proto__init(&bps[i]);
        caffe__blob_shape__init(&shapes[i]);
        shapes[i].n_dim = (size_t)net->learnable[k]->naxes;
        shapes[i].dim = net->learnable[k]->shape;
        bps[i].shape = &shapes[i];
        bps[i].n_data = (size_t)net->learnable[k]->count;
        bps[i].data = s->history + (int64_t)h * net->nparam_floats + net->learnable_offset[k];
        bpp[i] = &bps[i];
      }
    st.n_history = (size_t)nh;
    st.history = bpp;
    kiln_net_get_cursors(net, cursors);
    st.n_kiln_data_cursor = (size_t)nc;
    st.kiln_data_cursor = cursors;
    st.has_kiln_rng_state = true;
    st.kiln_rng_state.len = sizeof net->rng;
    st.kiln_rng_state.data = (uint8_t *)&net->rng;
    float window[1024];
    int wn = s->loss_window_n < 1024 ? s->loss_window_n : 1024;
    /* oldest first, so a restore can replay them in order */
    int avg = s->param->average_loss;
    for (int i = 0; i < wn; i++)
      window[i] = s->loss_window[(s->loss_window_pos - wn + i + 2 * avg) % avg];
    st.n_kiln_loss_history = (size_t)wn;
    st.kiln_loss_history = window;
    if (s->nworkers > 1) {
      st.has_kiln_workers = true;
      st.kiln_workers = s->nworkers;
      for (int r = 1; r < s->nworkers; r++) {
        worker_rng[r - 1].len = sizeof(kiln_rng);
        worker_rng[r - 1].data = (uint8_t *)&rngs[r];
      }
      st.n_kiln_worker_rng_state = (size_t)s->nworkers - 1;
      st.kiln_worker_rng_state = worker_rng;
    }
    rc = kiln_proto_write_binary(state_path, &st.base);
  }
  free(worker_rng);
  free(cursors);
  free(rngs);
  free(bps);
  free(bpp);
  free(shapes);
  if (!rc) {
    kiln_event e = {.event = "snapshot", .iter = s->iter, .path = state_path};
    emit(s, &e);
  }
  free(model);
  if (!rc && path_out) *path_out = state_path;
  else free(state_path);
  return rc;
}

/* The .solverstate's bytes on every rank. Rank 0 reads the file and broadcasts them, so the
 * other workers need not see it: on hosts without a shared file system the snapshots are where
 * rank 0 wrote them. A rank 0 that cannot read it fails every rank with the same cause. */
static int snapshot_bytes(kiln_solver *s, const char *path, char **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  int rc = s->rank == 0 ? kiln_read_file(path, buf, len) : KILN_OK;
  if (s->nworkers <= 1) return rc;
  int64_t head[2] = {rc, (int64_t)*len};
  int brc = kiln_comm_broadcast_bytes(s->opt.comm, head, sizeof head, 0);
  if (brc || rc) {
    free(*buf);
    *buf = NULL;
    return brc ? kiln_error_context(brc, "sending the snapshot: ") : rc;
  }
  if (head[0] != KILN_OK)
    return kiln_errorf((int)head[0], "%s: rank 0 could not read the snapshot (its message says why)",
                       path);
  if (s->rank != 0) {
    *len = (size_t)head[1];
    *buf = malloc(*len ? *len : 1);
    /* alone in failing: the caller ends the job */
    if (!*buf) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for %zu bytes", path, *len);
  }
  int crc = kiln_comm_broadcast_bytes(s->opt.comm, *buf, *len, 0);
  if (crc) {
    free(*buf);
    *buf = NULL;
    return kiln_error_context(crc, "sending the snapshot: ");
  }
  return KILN_OK;
}

int kiln_solver_restore(kiln_solver *s, const char *path) {
  ProtobufCMessage *m;
  char *bytes;
  size_t nbytes;
  KILN_TRY(snapshot_bytes(s, path, &bytes, &nbytes));
  int urc = kiln_proto_unpack(bytes, nbytes, path, &caffe__solver_state__descriptor, &m);
  free(bytes);
  KILN_TRY(urc);
  Caffe__SolverState *st = (Caffe__SolverState *)m;
  kiln_net *net = s->net;
  int rc = KILN_OK;
  int nh = net->nlearnable * s->history_per_param;
  if (!st->learned_net || !st->learned_net[0]) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: names no learned_net (.caffemodel)", path);
  } else if ((int)st->n_history != nh) {
    rc = kiln_errorf(KILN_ERR_SHAPE,
                     "%s: %zu history blobs, but a %s solver for this net needs %d", path,
                     st->n_history, kiln_solver_type_name(s->type), nh);
  }
  for (int i = 0; !rc && i < nh; i++) {
    int k = i % net->nlearnable, h = i / net->nlearnable;
    if ((int64_t)st->history[i]->n_data != net->learnable[k]->count) {
      rc = kiln_errorf(KILN_ERR_SHAPE, "%s: history blob %d has %zu values, parameter '%s' has %lld",
                       path, i, st->history[i]->n_data, net->learnable[k]->name,
                       (long long)net->learnable[k]->count);
      break;
    }
    memcpy(s->history + (int64_t)h * net->nparam_floats + net->learnable_offset[k],
           st->history[i]->data, sizeof(float) * (size_t)net->learnable[k]->count);
  }
  if (!rc && s->rank == 0) {
    /* The weights file: as recorded, else beside the solverstate. Rank 0 alone reads it: its
     * parameters go to the other workers before the first step (sync_params). */
    const char *model = st->learned_net;
    char buf[4096];
    if (access(model, R_OK) != 0) {
      char tmp[4096], tmp2[4096];
      snprintf(tmp, sizeof tmp, "%s", path);
      snprintf(tmp2, sizeof tmp2, "%s", model);
      snprintf(buf, sizeof buf, "%s/%s", dirname(tmp), basename(tmp2));
      model = buf;
    }
    rc = kiln_net_load_weights(net, model);
  }
  if (!rc) {
    s->iter = st->iter;
    s->current_step = st->current_step;
    if (st->n_kiln_data_cursor)
      rc = kiln_net_set_cursors(net, st->kiln_data_cursor, (int)st->n_kiln_data_cursor);
  }
  if (!rc && s->rank > 0) {
    /* A worker's own saved stream when the snapshot came from as many workers; a fresh one,
     * distinct per rank and iteration, otherwise. */
    const ProtobufCBinaryData *mine = NULL;
    if (st->kiln_workers == s->nworkers && (int)st->n_kiln_worker_rng_state == s->nworkers - 1)
      mine = &st->kiln_worker_rng_state[s->rank - 1];
    if (mine && mine->len != sizeof net->rng)
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: generator state of rank %d has %zu bytes, expected %zu",
                       path, s->rank, mine->len, sizeof net->rng);
    else if (mine)
      memcpy(&net->rng, mine->data, sizeof net->rng);
    else
      seed_worker_rng(s, (uint64_t)st->iter);
  } else if (!rc && st->has_kiln_rng_state) {
    if (st->kiln_rng_state.len != sizeof net->rng)
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: generator state has %zu bytes, expected %zu", path,
                       st->kiln_rng_state.len, sizeof net->rng);
    else
      memcpy(&net->rng, st->kiln_rng_state.data, sizeof net->rng);
  }
  if (!rc) {
    s->loss_window_n = s->loss_window_pos = 0;
    int avg = s->param->average_loss;
    for (size_t i = 0; i < st->n_kiln_loss_history; i++) {
      s->loss_window[s->loss_window_pos] = st->kiln_loss_history[i];
      s->loss_window_pos = (s->loss_window_pos + 1) % avg;
      if (s->loss_window_n < avg) s->loss_window_n++;
    }
    kiln_log(KILN_LOG_INFO, "resumed from %s at iteration %d", path, s->iter);
    if (s->rank == 0 && st->kiln_workers != s->nworkers)
      kiln_log(KILN_LOG_INFO,
               "%s was written by %d worker(s), resuming on %d: the data stream continues from "
               "the saved cursor, with a global batch of %d x %d worker(s) x iter_size %d",
               path, st->kiln_workers, s->nworkers, s->batch_size, s->nworkers,
               s->param->iter_size);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  s->params_synced = false;
  if (!rc && s->nworkers > 1) {
    /* Every rank parsed rank 0's bytes; a check that they restored the same place costs one
     * small collective. */
    kiln_sha256_ctx h;
    uint8_t digest[32];
    int nc = kiln_net_data_layer_count(net);
    uint64_t *cursors = calloc((size_t)nc + 1, sizeof *cursors);
    if (!cursors) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    kiln_net_get_cursors(net, cursors);
    int64_t where[2] = {s->iter, s->current_step};
    kiln_sha256_init(&h);
    kiln_sha256_update(&h, where, sizeof where);
    kiln_sha256_update(&h, cursors, sizeof(uint64_t) * (size_t)nc);
    kiln_sha256_final(&h, digest);
    free(cursors);
    rc = workers_agree(s, digest, "the resumed state (iteration and data cursors)",
                       "give every worker the same --snapshot");
  }
  return rc;
}
