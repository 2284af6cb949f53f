/* The training loop (see include/kiln/solver.h): creation, iterations, tests, display and
 * events. Caffe's order per iteration: test (every test_interval), iter_size forward/backward
 * passes accumulating gradients, smoothed loss, display, then the update (update.c); iter += 1;
 * snapshot every `snapshot` (snapshot.c). With several workers the loop calls the hooks of
 * worker_sync.h at fixed points of each iteration; with one they return at once.
 *
 * iter_size > 1: each pass computes its gradient from zero and the passes are added in order,
 * ((g0 + g1) + g2) ..., with the net's backend's acc (layers accumulating inside their GEMMs would
 * round differently). N workers with the ordered reduction add the same way (the same kernel, in
 * kiln_parallel_accumulate), so N workers x one pass and one worker x iter_size N give the same
 * bits. */
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "solver_internal.h"
#include "worker_sync.h"

void solver_emit(kiln_solver *s, kiln_event *e) {
  if (!s->opt.on_event || s->rank != 0) return; /* rank 0 speaks for the workers */
  e->max_iter = s->max_iter;
  e->nworkers = s->nworkers;
  e->time_ms = kiln_now_ms() - s->start_ms;
  /* /proc reads: not for the per-iteration progress event */
  bool progress = !strcmp(e->event, "progress");
  e->peak_rss_mb = progress ? 0 : kiln_peak_rss_mb();
  size_t peak;
  e->peak_device_mb = !progress && s->net && s->net->device &&
                              kiln_device_memory(s->net->device, NULL, &peak) == KILN_OK
                          ? (double)peak / (1 << 20)
                          : NAN;
  e->cpu_wait_ms = progress ? 0 : kiln_thread_cpu_wait_ms() - s->start_cpu_wait_ms;
  s->opt.on_event(e, s->opt.user);
}

/* ---- creation -------------------------------------------------------------------------------- */

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
  int up = kiln_net_param_upgrade((Caffe__NetParameter *)m, use, NULL);
  if (up) {
    protobuf_c_message_free_unpacked(m, NULL);
    return up;
  }
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
  o.share_data = !s->opt.keep_diffs;
  o.source = source;
  o.config = s->opt.config;
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
  /* Without a loss there is nothing to learn: every gradient is zero (Caffe trains such a net
   * to the end without a word). */
  bool has_loss = false;
  for (int i = 0; i < s->net->nlayers && !has_loss; i++)
    for (int t = 0; t < s->net->layers[i]->ntop; t++) has_loss |= s->net->layers[i]->loss_weight[t] != 0;
  if (!has_loss)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: the train net has no loss (no top with a loss_weight): nothing to "
                       "learn; add a loss layer, or give loss_weight on the top to minimise",
                       train_src);
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
    if (p->eval_type && !strcmp(p->eval_type, "detection")) {
      kiln_net_map *m;
      KILN_TRY(kiln_net_map_new(s->test_nets[i], &m));
      kiln_net_map_free(m);
      if (!m)
        return kiln_errorf(KILN_ERR_INVALID, "%s: eval_type is detection, but test net %d (%s) "
                           "has no DetectionEvaluate layer whose top is an output",
                           s->source, i, src);
    }
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
  for (size_t i = 1; i < p->n_stepvalue; i++)
    if (p->stepvalue[i] <= p->stepvalue[i - 1])
      return kiln_errorf(KILN_ERR_INVALID, "%s: stepvalue must increase", s->source);
  /* Counts that cannot be negative, and reals whose range the update rules assume: a value out
   * of range is refused naming its field rather than surfacing later as a diverged run. */
  const struct {
    const char *name;
    int32_t value;
  } counts[] = {{"max_iter", p->max_iter},   {"display", p->display},
                {"snapshot", p->snapshot},   {"test_interval", p->test_interval},
                {"stepsize", p->stepsize},   {"average_loss", p->average_loss},
                {"divergence_iters", p->divergence_iters}};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
    if (counts[i].value < 0)
      return kiln_errorf(KILN_ERR_INVALID, "%s: %s is %d; it cannot be negative", s->source,
                         counts[i].name, (int)counts[i].value);
  for (size_t i = 0; i < p->n_test_iter; i++)
    if (p->test_iter[i] < 1)
      return kiln_errorf(KILN_ERR_INVALID, "%s: test_iter %d (test net %zu) must be at least 1",
                         s->source, (int)p->test_iter[i], i);
  const struct {
    const char *name;
    float value, lo, hi;
    bool hi_open; /* value < hi rather than <= hi */
  } reals[] = {
      {"base_lr", p->base_lr, 0, INFINITY, false},
      {"momentum", p->momentum, 0, 1, true},
      {"momentum2", p->momentum2, 0, 1, true},
      {"rms_decay", p->rms_decay, 0, 1, true},
      {"weight_decay", p->weight_decay, 0, INFINITY, false},
      {"delta", p->delta, 0, INFINITY, false},
      {"gamma", p->gamma, -INFINITY, INFINITY, false},
      {"power", p->power, -INFINITY, INFINITY, false},
      {"clip_gradients", p->clip_gradients, -INFINITY, INFINITY, false},
  };
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
    const float v = reals[i].value;
    if (!isfinite(v) || v < reals[i].lo || v > reals[i].hi || (reals[i].hi_open && v == reals[i].hi))
      return kiln_errorf(KILN_ERR_INVALID, "%s: %s is %g; it must be finite%s", s->source,
                         reals[i].name, (double)v,
                         reals[i].hi == 1      ? ", at least 0 and below 1"
                         : reals[i].lo == 0    ? " and at least 0"
                                               : "");
  }
  if (!(p->divergence_factor == 0 || (p->divergence_factor > 1 && isfinite(p->divergence_factor))))
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: divergence_factor is %g; it must be above 1 (or 0 for no check)",
                       s->source, (double)p->divergence_factor);
  if (p->divergence_iters < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: divergence_iters is %d; it must be at least 1",
                       s->source, (int)p->divergence_iters);
  /* The SSD fork's test figures (eval_type, ap_version): kiln reports a detection net's mAP
   * whatever eval_type says, and checks in build_nets that a "detection" solver's test nets
   * give one. */
  const char *eval = p->eval_type ? p->eval_type : "classification";
  if (strcmp(eval, "classification") && strcmp(eval, "detection"))
    return kiln_errorf(KILN_ERR_INVALID, "%s: eval_type '%s' is neither classification nor "
                       "detection", s->source, eval);
  if (kiln_ap_version_parse(p->ap_version ? p->ap_version : "Integral", &s->ap_version))
    return kiln_error_context(KILN_ERR_INVALID, "%s: ", s->source);
  if (p->delta == 0 && (s->type == KILN_SOLVER_ADAGRAD || s->type == KILN_SOLVER_RMSPROP ||
                        s->type == KILN_SOLVER_ADADELTA || s->type == KILN_SOLVER_ADAM))
    return kiln_errorf(KILN_ERR_INVALID, "%s: delta is 0; %s divides by it", s->source,
                       kiln_solver_type_name(s->type));
  return KILN_OK;
}

/* Caffe trains on a GPU when the solver file says solver_mode: GPU (device_id picks which) or
 * when `-gpu` says so; so does kiln, on its CUDA backend. As in Caffe's tool, the mode counts only
 * when the file gives it (the field's default, GPU, does not), and -gpu replaces both fields; a
 * device chosen by kiln's own --device (KILN_DEVICE) replaces all three. One GPU a worker: the
 * workers on one host take theirs by their rank among the host's (local rank), from device_id
 * on, around the GPUs there are (two workers share a machine's only GPU). A device number that
 * cannot exist is a mistake in the file (Caffe would fail on it), refused naming the field. Where
 * kiln has no GPU (built without CUDA, or none in the machine) it says so once, so that nobody
 * takes a CPU run for a GPU one, and trains on the CPU. Every worker checks; rank 0 speaks. */
static int gpu_from_flag(const kiln_solver *s, int local, int count, int *want) {
  const char *f = s->opt.gpu_flag;
  if (!strcmp(f, "all")) {
    *want = local % count;
    return KILN_OK;
  }
  int ids[64], n = 0;
  for (const char *q = f; *q && n < 64;) {
    char *end;
    long v = strtol(q, &end, 10);
    if (end == q || v < 0 || v > 1023)
      return kiln_errorf(KILN_ERR_INVALID, "-gpu %s: not a device list", f);
    ids[n++] = (int)v;
    q = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return kiln_errorf(KILN_ERR_INVALID, "-gpu %s: not a device list", f);
  }
  if (n == 0) return kiln_errorf(KILN_ERR_INVALID, "-gpu %s: not a device list", f);
  if (n > 1 && s->nworkers <= 1 && s->rank == 0)
    kiln_log(KILN_LOG_WARN,
             "-gpu %s: one process trains on one GPU (cuda:%d); for all of them start one worker "
             "a GPU: mpirun -np %d kiln train ...",
             f, ids[0], n);
  *want = ids[local % n];
  if (*want >= count)
    return kiln_errorf(KILN_ERR_INVALID, "-gpu %s: no GPU %d (this machine has %d)", f, *want,
                       count);
  return KILN_OK;
}

static int check_device(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  const kiln_config *cfg = s->opt.config;
  const bool mode_gpu =
      p->has_solver_mode && p->solver_mode == CAFFE__SOLVER_PARAMETER__SOLVER_MODE__GPU;
  if (cfg->device != KILN_DEVICE_HOST || (!s->opt.gpu_flag && !mode_gpu)) return KILN_OK;
  if (!s->opt.gpu_flag && p->device_id < 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: solver_mode: GPU with device_id: %d: no such device (device numbers "
                       "start at 0)",
                       s->source, (int)p->device_id);
  char asked[4200];
  if (s->opt.gpu_flag) snprintf(asked, sizeof asked, "-gpu %s", s->opt.gpu_flag);
  else if (p->has_device_id)
    snprintf(asked, sizeof asked, "%s: solver_mode: GPU (device_id: %d)", s->source,
             (int)p->device_id);
  else snprintf(asked, sizeof asked, "%s: solver_mode: GPU", s->source);
  const int count = kiln_cuda_device_count();
  if (count == 0) {
    if (s->rank == 0)
      kiln_log(KILN_LOG_WARN, "%s: no GPU (%s); training on the CPU", asked,
               kiln_cuda_unavailable());
    return KILN_OK;
  }
  const int local = cfg->local_rank >= 0 ? cfg->local_rank : s->rank;
  int want = 0;
  if (s->opt.gpu_flag) {
    KILN_TRY(gpu_from_flag(s, local, count, &want));
  } else {
    if (p->device_id >= count)
      return kiln_errorf(KILN_ERR_INVALID, "%s: device_id: %d: no such GPU (this machine has %d)",
                         s->source, (int)p->device_id, count);
    want = (int)((p->device_id + local) % count);
  }
  s->device_config = *cfg;
  s->device_config.device = KILN_DEVICE_CUDA;
  s->device_config.device_index = want;
  s->opt.config = &s->device_config;
  if (s->rank == 0)
    kiln_log(KILN_LOG_INFO, "%s: training on cuda:%d%s", asked, want,
             s->nworkers > 1 ? " (each worker on its host's GPU by local rank)" : "");
  return KILN_OK;
}

/* The solver's `precision` where neither --precision nor KILN_PRECISION chose one. Whether the
 * CPU can is asked when the nets pick their kernels (kiln_backend_choose). */
static int check_precision(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  const kiln_config *cfg = s->opt.config;
  const bool bf16 = cfg->precision == KILN_PRECISION_BF16 ||
                    (cfg->precision == KILN_PRECISION_DEFAULT && p->has_precision &&
                     p->precision == CAFFE__SOLVER_PARAMETER__PRECISION__BF16);
  if (!bf16) return KILN_OK;
  if (cfg->precision != KILN_PRECISION_BF16) {
    if (cfg != &s->device_config) s->device_config = *cfg;
    s->device_config.precision = KILN_PRECISION_BF16;
    s->opt.config = &s->device_config;
  }
  if (s->rank == 0)
    kiln_log(KILN_LOG_INFO, "precision bf16: products in bfloat16 with fp32 sums; weights, "
                            "updates, normalisation and losses in fp32");
  return KILN_OK;
}

/* An injected fault must hit something: a sleep names a layer of the train net. The log says a
 * fault is on, so nobody mistakes the run for a real one. */
static int check_fault(kiln_solver *s) {
  if (s->fault.kind == KILN_FAULT_NONE) return KILN_OK;
  if ((s->fault.kind == KILN_FAULT_SLEEP || s->fault.kind == KILN_FAULT_SLOW_READ) &&
      !kiln_net_layer(s->net, s->fault.layer)) {
    char names[1024] = "";
    size_t used = 0;
    for (int i = 0; i < s->net->nlayers && used < sizeof names; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                               s->net->layers[i]->name);
    return kiln_errorf(KILN_ERR_INVALID, "%s=%s:%s:%g: the train net '%s' has no layer '%s' "
                       "(its layers: %s)",
                       KILN_FAULT_ENV, s->fault.kind == KILN_FAULT_SLEEP ? "sleep" : "slowread",
                       s->fault.layer, (double)s->fault.us / 1000.0, s->net->name,
                       s->fault.layer, names);
  }
  char what[256];
  kiln_log(KILN_LOG_WARN, "%s is set: injecting a fault: %s", KILN_FAULT_ENV,
           kiln_fault_describe(&s->fault, what, sizeof what));
  return KILN_OK;
}

/* The samples of one forward pass: the batch of the train net's first data layer. */
static int train_batch_size(const kiln_net *net) {
  for (int i = 0; i < net->nlayers; i++)
    if (net->layers[i]->ops->is_data && net->layers[i]->ntop > 0 &&
        net->layers[i]->top[0]->naxes > 0)
      return (int)net->layers[i]->top[0]->shape[0];
  return 1;
}

/* `bytes` zeroed where the net's parameters are (on the host from huge pages, as the flat
 * parameter and gradient buffers, when `huge`), and their release. NULL when it cannot. */
static void *solver_alloc(const kiln_net *net, size_t bytes, bool huge) {
  if (kiln_device_is_host(net->device)) return huge ? kiln_alloc_huge(bytes) : kiln_alloc(bytes);
  void *p = NULL;
  if (kiln_device_alloc(net->device, bytes, &p)) return NULL;
  if (kiln_device_set(net->device, p, 0, bytes)) {
    kiln_device_free(net->device, p);
    return NULL;
  }
  return p;
}

static void solver_release(const kiln_device *device, void *p) {
  if (kiln_device_is_host(device)) kiln_free(p);
  else kiln_device_free(device, p);
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
  /* nets written inline in the solver, in Caffe's old formats too */
  rc = kiln_solver_inline_nets_upgrade((Caffe__SolverParameter *)m, solver_path, NULL);
  if (rc) {
    kiln_solver_free(s);
    return rc;
  }
  const Caffe__SolverParameter *p = s->param;
  if (!s->opt.config) s->opt.config = kiln_config_defaults();
  s->fault = s->opt.config->fault;
  s->seed = p->random_seed >= 0 ? (uint64_t)p->random_seed : 1701; /* deterministic by default */
  s->max_iter = s->opt.max_iter_override > 0 ? s->opt.max_iter_override : p->max_iter;
  if (p->snapshot_prefix && p->snapshot_prefix[0]) {
    s->snapshot_prefix = kiln_strdup(p->snapshot_prefix);
  } else {
    s->snapshot_prefix = kiln_strdup(solver_path);
    char *dot = strrchr(s->snapshot_prefix, '.');
    if (dot && strchr(dot, '/') == NULL) *dot = '\0';
  }
  rc = update_resolve_type(s);
  if (!rc) rc = check_params(s); /* after the type: delta's range depends on it */
  if (!rc) rc = check_device(s);
  if (!rc) rc = check_precision(s);
  if (!rc) rc = worker_sync_configure(s);
  if (!rc) {
    s->history_per_param = update_history_count(s->type);
    rc = build_nets(s);
  }
  if (!rc) rc = check_fault(s);
  if (!rc) {
    size_t model = (size_t)s->net->nparam_floats * sizeof(float);
    s->history = solver_alloc(s->net, model * s->history_per_param, true);
    s->scalars = solver_alloc(s->net, sizeof *s->scalars, false);
    s->loss_window = calloc((size_t)p->average_loss, sizeof(float));
    if (p->iter_size > 1) s->grad_acc = solver_alloc(s->net, model, true);
    if (!s->history || !s->scalars || !s->loss_window || (p->iter_size > 1 && !s->grad_acc))
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  if (!rc) {
    s->batch_size = train_batch_size(s->net);
    rc = worker_sync_attach(s);
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
  const kiln_device *device = s->net ? s->net->device : NULL; /* the history's */
  for (int i = 0; i < s->ntest; i++) kiln_net_free(s->test_nets[i]);
  free(s->test_nets);
  kiln_net_free(s->net);
  worker_sync_release(s); /* after the net whose gradients may lie in its memory */
  for (int i = 0; i < s->nnet_params; i++) protobuf_c_message_free_unpacked(&s->net_params[i]->base, NULL);
  free(s->net_params);
  if (s->param) protobuf_c_message_free_unpacked(&s->param->base, NULL);
  solver_release(device, s->history);
  solver_release(device, s->grad_acc);
  solver_release(device, s->scalars);
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

/* ---- tests ----------------------------------------------------------------------------------- */

/* show_per_class_result: each class's average precision in the log, as the fork prints it. */
static void log_per_class(kiln_solver *s, kiln_net_map *m, int k) {
  enum { MAX_CLASSES = 1024 };
  int label[MAX_CLASSES], n = 0;
  double ap[MAX_CLASSES];
  int64_t pos[MAX_CLASSES];
  if (kiln_net_map_per_class(m, s->ap_version, MAX_CLASSES, label, ap, pos, &n)) return;
  for (int i = 0; i < n; i++)
    kiln_log(KILN_LOG_INFO, "test net %d, iteration %d: class %d AP %.4f (%lld positives)", k,
             s->iter, label[i], ap[i], (long long)pos[i]);
}

int kiln_solver_test(kiln_solver *s, int k) {
  kiln_net *net = s->test_nets[k];
  int iters = s->param->test_iter[k];
  int n = net->noutputs;
  double *sum = calloc((size_t)n + 1, sizeof(double));
  float *vals = calloc((size_t)n + KILN_NET_MAX_DERIVED + 1, sizeof(float));
  const char **names = calloc((size_t)n + KILN_NET_MAX_DERIVED + 1, sizeof(char *));
  kiln_net_map *map = NULL;
  int rc = sum && vals && names ? kiln_net_map_new(net, &map) : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  /* a detection net's DetectionEvaluate rows make its mAP, not a figure of their own */
  const int skip = map ? kiln_net_map_output(map) : -1;
  double loss = 0;
  for (int it = 0; it < iters && !rc; it++) {
    float l;
    rc = kiln_net_forward(net, &l);
    loss += l;
    if (!rc && map) rc = kiln_net_map_add(map, net);
    for (int o = 0; o < n && !rc; o++) {
      double v = 0;
      if (o != skip) rc = kiln_net_blob_sum(net, net->outputs[o], &v);
      sum[o] += v;
    }
  }
  const float test_loss = iters ? (float)(loss / iters) : 0;
  int nout = 0;
  if (!rc) {
    for (int o = 0; o < n; o++) {
      sum[o] = iters ? sum[o] / iters : 0; /* the mean, from here on */
      if (o == skip) continue;
      names[nout] = net->outputs[o]->name;
      vals[nout++] = (float)sum[o];
    }
    kiln_derived_metric d[KILN_NET_MAX_DERIVED];
    int nd = kiln_net_derived_metrics(net, sum, d);
    for (int j = 0; j < nd; j++) {
      names[nout] = d[j].name;
      vals[nout++] = (float)d[j].value;
    }
    double m_ap = 0;
    if (map && !(rc = kiln_net_map_result(map, s->ap_version, &m_ap, NULL))) {
      names[nout] = KILN_NET_MAP;
      vals[nout++] = (float)m_ap;
      if (s->param->show_per_class_result) log_per_class(s, map, k);
    }
  }
  if (!rc) {
    kiln_event e = {.event = "test", .iter = s->iter, .loss = test_loss, .test_net = k,
                    .noutputs = nout, .output_names = names, .output_values = vals};
    solver_emit(s, &e);
  }
  kiln_net_map_free(map);
  free(sum);
  free(vals);
  free(names);
  return rc;
}

static int test_all(kiln_solver *s) {
  for (int k = 0; k < s->ntest; k++) KILN_TRY(kiln_solver_test(s, k));
  return KILN_OK;
}

static bool test_due(const kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  return p->test_interval > 0 && s->iter % p->test_interval == 0 &&
         (s->iter > 0 || p->test_initialization);
}

static int run_tests(kiln_solver *s) {
  KILN_TRY(worker_sync_converge(s));
  return s->rank == 0 ? test_all(s) : KILN_OK;
}

/* ---- iterations ------------------------------------------------------------------------------ */

/* A diverged run: the loss became non-finite, or it stayed far above where it started (a loss
 * layer that clamps its probabilities reports ~87 per sample however far the net has gone, and
 * the run would otherwise go on to max_iter reporting nothing wrong). */
static int check_divergence(kiln_solver *s, float loss) {
  const Caffe__SolverParameter *p = s->param;
  if (!isfinite(loss))
    return kiln_errorf(KILN_ERR_NUMERIC,
                       "iteration %d: the loss is %g; training diverged (lower base_lr, or clip "
                       "gradients with clip_gradients)",
                       s->iter, loss);
  if (!s->have_first_loss) {
    s->first_loss = loss;
    s->have_first_loss = true;
  }
  if (p->divergence_factor == 0 || !(s->first_loss > 0)) return KILN_OK;
  s->divergence_run = loss > p->divergence_factor * s->first_loss ? s->divergence_run + 1 : 0;
  if (s->divergence_run < p->divergence_iters) return KILN_OK;
  return kiln_errorf(KILN_ERR_NUMERIC,
                     "iteration %d: the loss (%g) has stayed above divergence_factor %g times its "
                     "first value %g for %d iterations; training diverged (lower base_lr, or clip "
                     "gradients with clip_gradients; divergence_factor: 0 turns this check off)",
                     s->iter, loss, (double)p->divergence_factor, s->first_loss,
                     s->divergence_run);
}

/* iter_size forward/backward passes; param_diff ends as their gradients summed in pass order.
 * `loss_sum` gets the passes' losses added up. When the workers' sums overlap backward, the last
 * pass's backward starts each bucket's sum once the bucket is final, adding the earlier passes
 * into it first (worker_sync_before_backward), and worker_sync_after_backward finishes them. */
static int compute_gradients(kiln_solver *s, bool local, double *loss_sum) {
  kiln_net *net = s->net;
  int passes = s->param->iter_size;
  *loss_sum = 0;
  for (int i = 0; i < passes; i++) {
    kiln_net_zero_param_diff(net);
    float l;
    KILN_TRY(kiln_net_forward(net, &l));
    bool last = i == passes - 1;
    bool overlap = last && worker_sync_before_backward(s, local);
    int rc = kiln_net_backward(net);
    net->backward_hook = NULL;
    KILN_TRY(rc);
    *loss_sum += l;
    if (passes == 1) break;
    if (i == 0)
      KILN_TRY(KILN_NET_OP(net, copy, s->grad_acc, net->param_diff, net->nparam_floats));
    else if (!last)
      KILN_TRY(KILN_NET_OP(net, acc, s->grad_acc, net->param_diff, net->nparam_floats));
    else if (!overlap) /* the last pass adds the sum into its own gradient: a + b == b + a, and
                          no copy back */
      KILN_TRY(KILN_NET_OP(net, acc, net->param_diff, s->grad_acc, net->nparam_floats));
  }
  return KILN_OK;
}

typedef struct {
  double start_ms; /* the display window's start */
  int iters;
} rate_window;

/* One iteration: gradients, their sum over the workers unless `local`, the smoothed loss, display,
 * the update. The caller calls worker_sync_after_update next. */
static int one_iteration(kiln_solver *s, bool local, rate_window *w) {
  const Caffe__SolverParameter *p = s->param;
  double work_start = kiln_now_ms();
  double loss;
  KILN_TRY(compute_gradients(s, local, &loss));
  KILN_TRY(kiln_fault_leak(&s->fault)); /* nothing unless KILN_FAULT=leak:KB */
  int summed;
  double t = kiln_now_ms();
  KILN_TRY(worker_sync_after_backward(s, local, &summed));
  work_start += kiln_now_ms() - t; /* waiting for the other workers is not this one's work */
  float l = 0;
  KILN_TRY(worker_sync_loss(s, loss, local, &l));
  KILN_TRY(check_divergence(s, l));
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
      vals[o] = 0;
      KILN_TRY(kiln_net_blob_read(s->net, s->net->outputs[o], &vals[o], 1));
    }
    kiln_event e = {.event = "train", .iter = s->iter, .loss = (float)smoothed, .lr = rate,
                    .samples_per_s = sps, .noutputs = no, .output_names = names,
                    .output_values = vals};
    solver_emit(s, &e);
    w->start_ms = now;
    w->iters = 0;
  }
  bool finite;
  KILN_TRY(update_apply(s, rate, summed, &finite));
  if (!finite) KILN_TRY(update_check_finite(s, rate));
  if (s->opt.config->debug_slow_ms > 0 && s->rank == s->opt.config->debug_slow_rank)
    kiln_sleep_ms(s->opt.config->debug_slow_ms);
  s->work_ms += kiln_now_ms() - work_start;
  s->work_samples += (uint64_t)s->batch_size * (uint64_t)p->iter_size;
  s->work_iters++;
  s->iter++;
  kiln_event pe = {.event = "progress", .iter = s->iter, .loss = (float)smoothed, .lr = rate,
                   .samples_per_s = sps};
  solver_emit(s, &pe);
  return KILN_OK;
}

/* The next iteration after `iter` at which `every` falls due; INT_MAX when it never does. */
static int next_multiple(int iter, int every) {
  if (every <= 0) return INT_MAX;
  int64_t next = ((int64_t)iter / every + 1) * every;
  return next > INT_MAX ? INT_MAX : (int)next;
}

/* TIME mode, one round: local iterations for interval_seconds of this worker's own clock (at
 * least one), then the workers' average, after which the iteration count is the furthest
 * worker's (worker_sync_end_round). A round ends early at `stop` and at the next test or
 * snapshot iteration: the workers count their own iterations within a round, and only at its
 * end do they hold one model and one iteration count, so a test or snapshot falling inside a
 * round could neither see one model nor be labelled with its own iteration. Stopping there, every
 * worker stops at or before it, and the furthest one lands on it exactly. */
static int time_round(kiln_solver *s, int stop, rate_window *w) {
  const Caffe__SolverParameter *p = s->param;
  int start = s->iter;
  /* from the solver file, which every worker shares (only rank 0 builds the test nets) */
  int test_at = next_multiple(start, p->n_test_iter > 0 ? p->test_interval : 0);
  int snapshot_at = next_multiple(start, p->snapshot);
  int end = stop < test_at ? stop : test_at;
  if (snapshot_at < end) end = snapshot_at;
  /* The round started when the last one's average ended: rank 0's test pass counts against
   * its own round, so the others do not wait for it. */
  double t0 = s->round_start_ms > 0 ? s->round_start_ms : kiln_now_ms();
  double limit = s->sync.interval_seconds * 1e3;
  uint64_t steps = 0;
  do {
    KILN_TRY(one_iteration(s, true, w));
    KILN_TRY(worker_sync_after_update(s, true));
    steps++;
  } while (s->iter < end && kiln_now_ms() - t0 < limit);
  KILN_TRY(worker_sync_end_round(s, start, steps));
  s->round_start_ms = kiln_now_ms();
  return KILN_OK;
}

/* Each iteration: a test pass when one is due, one_iteration (the passes, the workers' gradient
 * sum, the update), worker_sync_after_update, a snapshot when one is due. Past its warm-up, TIME
 * mode runs a round of local iterations (time_round) where the others run one iteration; a round
 * ends on the iterations of tests and snapshots, so these fall due here as in the other modes. */
int kiln_solver_step(kiln_solver *s, int n) {
  const Caffe__SolverParameter *p = s->param;
  KILN_TRY(worker_sync_before_steps(s));
  int stop = s->iter + n;
  rate_window w = {kiln_now_ms(), 0};
  while (s->iter < stop) {
    bool local = kiln_sync_is_local(&s->sync, s->nworkers, s->iter);
    bool timed = local && s->sync.mode == KILN_SYNC_TIME;
    /* The first round starts before rank 0's test, as every later round does (time_round). */
    if (timed && !(s->round_start_ms > 0)) s->round_start_ms = kiln_now_ms();
    if (test_due(s)) KILN_TRY(run_tests(s));
    if (timed) {
      KILN_TRY(time_round(s, stop, &w));
    } else {
      KILN_TRY(one_iteration(s, local, &w));
      KILN_TRY(worker_sync_after_update(s, local));
    }
    if (p->snapshot > 0 && s->iter % p->snapshot == 0) KILN_TRY(kiln_solver_snapshot(s, NULL));
  }
  return KILN_OK;
}

int kiln_solver_solve(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  KILN_TRY(kiln_solver_step(s, s->max_iter - s->iter));
  /* MODEL and TIME: the job ends with one model (what rank 0 saves and tests). */
  KILN_TRY(worker_sync_converge(s));
  if (p->snapshot_after_train && (p->snapshot <= 0 || s->iter % p->snapshot != 0))
    KILN_TRY(kiln_solver_snapshot(s, NULL));
  if (s->rank == 0 && p->test_interval > 0 && s->iter % p->test_interval == 0)
    KILN_TRY(test_all(s));
  KILN_TRY(worker_sync_report(s));
  kiln_event e = {.event = "done", .iter = s->iter};
  solver_emit(s, &e);
  return KILN_OK;
}
