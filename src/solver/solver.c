/* The training loop and update rules (see include/kiln/solver.h). Caffe's order per iteration:
 * test (every test_interval), iter_size forward/backward passes accumulating gradients, smoothed
 * loss, display, then the update: clip by global L2 norm, normalise by 1/iter_size, regularise,
 * compute the step with the solver's rule, subtract; iter += 1; snapshot every `snapshot`. The
 * parameters, gradients and histories are flat buffers, so each stage is one loop per blob. */
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kiln/solver.h"

static const char *const type_names[] = {"SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"};
_Static_assert(sizeof type_names / sizeof type_names[0] == KILN_SOLVER_TYPE_COUNT,
               "solver names out of step with kiln_solver_type");

const char *kiln_solver_type_name(kiln_solver_type t) {
  return t < KILN_SOLVER_TYPE_COUNT ? type_names[t] : "?";
}

static void emit(kiln_solver *s, kiln_event *e) {
  if (!s->opt.on_event) return;
  e->max_iter = s->max_iter;
  e->time_ms = kiln_now_ms() - s->start_ms;
  /* /proc read: not for the per-iteration progress event */
  e->peak_rss_mb = strcmp(e->event, "progress") ? kiln_peak_rss_mb() : 0;
  s->opt.on_event(e, s->opt.user);
}

static int resolve_type(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  /* `type` has a default ("SGD"), so protobuf-c never leaves it NULL: it was given only when it
   * is not the default's storage. */
  bool type_given = p->type && p->type != caffe__solver_parameter__type__default_value;
  if (p->has_solver_type && !type_given) {
    s->type = (kiln_solver_type)p->solver_type;
    return KILN_OK;
  }
  const char *t = p->type ? p->type : "SGD";
  for (int i = 0; i < KILN_SOLVER_TYPE_COUNT; i++)
    if (strcasecmp(t, type_names[i]) == 0) {
      s->type = (kiln_solver_type)i;
      return KILN_OK;
    }
  return kiln_errorf(KILN_ERR_INVALID,
                     "%s: unknown solver type '%s' (known: SGD, Nesterov, AdaGrad, RMSProp, "
                     "AdaDelta, Adam)",
                     s->source, t);
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
  o.source = source;
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
  for (int i = 0; i < ntest; i++) {
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

int kiln_solver_create(const char *solver_path, const kiln_solver_options *opt, kiln_solver **out) {
  *out = NULL;
  kiln_solver *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (opt) s->opt = *opt;
  s->start_ms = kiln_now_ms();
  s->source = kiln_strdup(solver_path);
  ProtobufCMessage *m;
  int rc = kiln_text_parse_file(solver_path, &caffe__solver_parameter__descriptor, &m);
  if (rc) {
    kiln_solver_free(s);
    return rc;
  }
  s->param = (Caffe__SolverParameter *)m;
  const Caffe__SolverParameter *p = s->param;
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
  if (!rc) rc = resolve_type(s);
  if (!rc) {
    s->history_per_param = (s->type == KILN_SOLVER_ADAM || s->type == KILN_SOLVER_ADADELTA) ? 2 : 1;
    rc = build_nets(s);
  }
  if (!rc) {
    s->history = kiln_alloc((size_t)s->net->nparam_floats * s->history_per_param * sizeof(float));
    s->loss_window = calloc((size_t)p->average_loss, sizeof(float));
    if (!s->history || !s->loss_window) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  if (!rc) {
    s->batch_size = 1;
    for (int i = 0; i < s->net->nlayers; i++)
      if (s->net->layers[i]->ops->is_data && s->net->layers[i]->ntop > 0 &&
          s->net->layers[i]->top[0]->naxes > 0) {
        s->batch_size = (int)s->net->layers[i]->top[0]->shape[0];
        break;
      }
    kiln_log(KILN_LOG_INFO, "solver %s: %s, seed %llu, %d threads", solver_path,
             kiln_solver_type_name(s->type), (unsigned long long)s->seed, s->net->nthreads);
  }
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
  for (int i = 0; i < s->nnet_params; i++) protobuf_c_message_free_unpacked(&s->net_params[i]->base, NULL);
  free(s->net_params);
  if (s->param) protobuf_c_message_free_unpacked(&s->param->base, NULL);
  kiln_free(s->history);
  free(s->loss_window);
  free(s->source);
  free(s->snapshot_prefix);
  free(s);
}

/* ---- learning rate ----------------------------------------------------------------------- */

float kiln_solver_learning_rate(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  const char *pol = p->lr_policy;
  double base = p->base_lr, g = p->gamma, it = s->iter;
  if (strcmp(pol, "fixed") == 0) return (float)base;
  if (strcmp(pol, "step") == 0) return (float)(base * pow(g, floor(it / p->stepsize)));
  if (strcmp(pol, "exp") == 0) return (float)(base * pow(g, it));
  if (strcmp(pol, "inv") == 0) return (float)(base * pow(1.0 + g * it, -(double)p->power));
  if (strcmp(pol, "multistep") == 0) {
    while ((size_t)s->current_step < p->n_stepvalue && s->iter >= p->stepvalue[s->current_step])
      s->current_step++;
    return (float)(base * pow(g, s->current_step));
  }
  if (strcmp(pol, "poly") == 0) {
    double frac = s->max_iter > 0 ? it / s->max_iter : 0;
    return (float)(base * pow(1.0 - frac, p->power));
  }
  /* sigmoid */
  return (float)(base * (1.0 / (1.0 + exp(-g * (it - p->stepsize)))));
}

/* ---- update ---------------------------------------------------------------------------------- */

static void clip_gradients(kiln_solver *s) {
  float clip = s->param->clip_gradients;
  if (clip < 0) return;
  kiln_net *net = s->net;
  double sumsq = 0;
  for (int k = 0; k < net->nlearnable; k++) {
    const float *g = net->learnable[k]->diff;
    for (int64_t i = 0; i < net->learnable[k]->count; i++) sumsq += (double)g[i] * g[i];
  }
  double norm = sqrt(sumsq);
  if (norm > clip) {
    float f = (float)(clip / norm);
    kiln_log(KILN_LOG_DEBUG, "gradient clipping: scaling down gradients (L2 norm %g > %g) by %g",
             norm, clip, f);
    for (int k = 0; k < net->nlearnable; k++) {
      float *g = net->learnable[k]->diff;
      for (int64_t i = 0; i < net->learnable[k]->count; i++) g[i] *= f;
    }
  }
}

static void apply_update(kiln_solver *s, float rate) {
  const Caffe__SolverParameter *p = s->param;
  kiln_net *net = s->net;
  clip_gradients(s);
  bool l1 = p->regularization_type && strcmp(p->regularization_type, "L1") == 0;
  float norm = p->iter_size > 1 ? 1.0f / p->iter_size : 1.0f;
  float m = p->momentum, delta = p->delta;
  int64_t hstride = net->nparam_floats;
  /* Adam's bias correction uses t = iter + 1. */
  double t = s->iter + 1.0;
  double b1 = p->momentum, b2 = p->momentum2;
  float adam_rate = (float)(rate * sqrt(1.0 - pow(b2, t)) / (1.0 - pow(b1, t)));
  for (int k = 0; k < net->nlearnable; k++) {
    kiln_blob *b = net->learnable[k];
    float *w = b->data, *g = b->diff;
    float *h = s->history + net->learnable_offset[k];
    float *h2 = h + hstride;
    int64_t n = b->count;
    float lr = rate * net->lr_mult[k];
    float wd = p->weight_decay * net->decay_mult[k];
    if (norm != 1.0f)
      for (int64_t i = 0; i < n; i++) g[i] *= norm;
    if (wd != 0) {
      if (l1)
        for (int64_t i = 0; i < n; i++) g[i] += wd * (float)((w[i] > 0) - (w[i] < 0));
      else
        for (int64_t i = 0; i < n; i++) g[i] += wd * w[i];
    }
    switch (s->type) {
      case KILN_SOLVER_SGD:
        for (int64_t i = 0; i < n; i++) {
          h[i] = m * h[i] + lr * g[i];
          w[i] -= h[i];
        }
        break;
      case KILN_SOLVER_NESTEROV:
        for (int64_t i = 0; i < n; i++) {
          float old = h[i];
          h[i] = m * h[i] + lr * g[i];
          w[i] -= (1 + m) * h[i] - m * old;
        }
        break;
      case KILN_SOLVER_ADAGRAD:
        for (int64_t i = 0; i < n; i++) {
          h[i] += g[i] * g[i];
          w[i] -= lr * g[i] / (sqrtf(h[i]) + delta);
        }
        break;
      case KILN_SOLVER_RMSPROP: {
        float d = p->rms_decay;
        for (int64_t i = 0; i < n; i++) {
          h[i] = d * h[i] + (1 - d) * g[i] * g[i];
          w[i] -= lr * g[i] / (sqrtf(h[i]) + delta);
        }
        break;
      }
      case KILN_SOLVER_ADADELTA:
        /* h: running mean of g^2; h2: running mean of squared updates (Caffe's update history). */
        for (int64_t i = 0; i < n; i++) {
          h[i] = m * h[i] + (1 - m) * g[i] * g[i];
          float u = g[i] * sqrtf((h2[i] + delta) / (h[i] + delta));
          h2[i] = m * h2[i] + (1 - m) * u * u;
          w[i] -= net->lr_mult[k] * rate * u;
        }
        break;
      case KILN_SOLVER_ADAM: {
        float lr_a = adam_rate * net->lr_mult[k];
        for (int64_t i = 0; i < n; i++) {
          h[i] = (float)(b1 * h[i] + (1 - b1) * g[i]);
          h2[i] = (float)(b2 * h2[i] + (1 - b2) * g[i] * g[i]);
          w[i] -= lr_a * h[i] / (sqrtf(h2[i]) + delta);
        }
        break;
      }
      default: break;
    }
  }
}

/* ---- loop -------------------------------------------------------------------------------------- */

static int check_finite(kiln_solver *s, float loss) {
  if (isfinite(loss)) return KILN_OK;
  return kiln_errorf(KILN_ERR_NUMERIC,
                     "iteration %d: the loss is %g; training diverged (lower base_lr, or clip "
                     "gradients with clip_gradients)",
                     s->iter, loss);
}

/* The loss alone can miss a divergence (a loss layer that clamps its probabilities reports a
 * finite loss from NaN inputs), so the parameters are checked after every update as well. */
static int check_params_finite(kiln_solver *s, float rate) {
  const kiln_net *net = s->net;
  for (int k = 0; k < net->nlearnable; k++) {
    const kiln_blob *b = net->learnable[k];
    for (int64_t i = 0; i < b->count; i++)
      if (!isfinite(b->data[i]))
        return kiln_errorf(KILN_ERR_NUMERIC,
                           "iteration %d: parameter '%s' became %g after the update (lr %g); "
                           "training diverged (lower base_lr, or clip gradients with "
                           "clip_gradients)",
                           s->iter, b->name, b->data[i], rate);
  }
  return KILN_OK;
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

int kiln_solver_step(kiln_solver *s, int n) {
  const Caffe__SolverParameter *p = s->param;
  int stop = s->iter + n;
  double window_start = kiln_now_ms();
  int window_iters = 0;
  while (s->iter < stop) {
    kiln_net_zero_param_diff(s->net);
    if (p->test_interval > 0 && s->iter % p->test_interval == 0 &&
        (s->iter > 0 || p->test_initialization))
      KILN_TRY(test_all(s));
    double loss = 0;
    for (int i = 0; i < p->iter_size; i++) {
      float l;
      KILN_TRY(kiln_net_forward(s->net, &l));
      KILN_TRY(kiln_net_backward(s->net));
      loss += l;
    }
    float l = (float)(loss / p->iter_size);
    KILN_TRY(check_finite(s, l));
    s->loss_window[s->loss_window_pos] = l;
    s->loss_window_pos = (s->loss_window_pos + 1) % p->average_loss;
    if (s->loss_window_n < p->average_loss) s->loss_window_n++;
    double smoothed = 0;
    for (int i = 0; i < s->loss_window_n; i++) smoothed += s->loss_window[i];
    smoothed /= s->loss_window_n;
    float rate = kiln_solver_learning_rate(s);
    window_iters++;
    double now = kiln_now_ms();
    double sps = (double)window_iters * s->batch_size * p->iter_size / ((now - window_start) / 1e3);
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
      window_start = now;
      window_iters = 0;
    }
    apply_update(s, rate);
    KILN_TRY(check_params_finite(s, rate));
    s->iter++;
    kiln_event pe = {.event = "progress", .iter = s->iter, .loss = (float)smoothed, .lr = rate,
                     .samples_per_s = sps};
    emit(s, &pe);
    if (p->snapshot > 0 && s->iter % p->snapshot == 0) KILN_TRY(kiln_solver_snapshot(s, NULL));
  }
  return KILN_OK;
}

int kiln_solver_solve(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  KILN_TRY(kiln_solver_step(s, s->max_iter - s->iter));
  if (p->snapshot_after_train && (p->snapshot <= 0 || s->iter % p->snapshot != 0))
    KILN_TRY(kiln_solver_snapshot(s, NULL));
  if (p->test_interval > 0 && s->iter % p->test_interval == 0) KILN_TRY(test_all(s));
  kiln_event e = {.event = "done", .iter = s->iter};
  emit(s, &e);
  return KILN_OK;
}

/* ---- snapshots ---------------------------------------------------------------------------------- */

int kiln_solver_snapshot(kiln_solver *s, char **path_out) {
  kiln_net *net = s->net;
  size_t n = strlen(s->snapshot_prefix) + 64;
  char *model = malloc(n), *state_path = malloc(n);
  if (!model || !state_path) {
    free(model);
    free(state_path);
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
  uint64_t cursors[64];
  if (!rc && (!bps || !bpp || !shapes)) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
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
    int nc = kiln_net_data_layer_count(net);
    if (nc > 64) nc = 64;
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
    rc = kiln_proto_write_binary(state_path, &st.base);
  }
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

int kiln_solver_restore(kiln_solver *s, const char *path) {
  ProtobufCMessage *m;
  KILN_TRY(kiln_proto_read_binary(path, &caffe__solver_state__descriptor, &m));
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
  if (!rc) {
    /* The weights file: as recorded, else beside the solverstate. */
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
  if (!rc && st->has_kiln_rng_state) {
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
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return rc;
}
