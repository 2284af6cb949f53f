/* The update rules and learning-rate policies (see include/kiln/solver.h). Caffe's update, once
 * the iteration's gradients are summed: clip by global L2 norm, normalise by 1 / (workers x
 * iter_size), regularise (L2 or L1), compute the step with the solver's rule (SGD, Nesterov,
 * AdaGrad, RMSProp, AdaDelta, Adam), subtract. The parameters, gradients and histories are flat
 * buffers, so each stage is one loop per blob.
 *
 * The sum is divided once, by workers x iter_size, after clipping: clip_gradients sees the same
 * sum as on one worker with iter_size N (Caffe's multi-GPU solver clips each worker's mean
 * instead). */
#include <float.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "solver_internal.h"

static const char *const type_names[] = {"SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"};
_Static_assert(sizeof type_names / sizeof type_names[0] == KILN_SOLVER_TYPE_COUNT,
               "solver names out of step with kiln_solver_type");

const char *kiln_solver_type_name(kiln_solver_type t) {
  return t < KILN_SOLVER_TYPE_COUNT ? type_names[t] : "?";
}

int update_resolve_type(kiln_solver *s) {
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

int update_history_count(kiln_solver_type t) {
  return (t == KILN_SOLVER_ADAM || t == KILN_SOLVER_ADADELTA) ? 2 : 1;
}

/* ---- learning rate --------------------------------------------------------------------------- */

/* The lr_policy's rate at the current iteration. */
static double policy_rate(kiln_solver *s) {
  const Caffe__SolverParameter *p = s->param;
  const char *pol = p->lr_policy;
  double base = p->base_lr, g = p->gamma, it = s->iter;
  if (strcmp(pol, "fixed") == 0) return base;
  if (strcmp(pol, "step") == 0) return base * pow(g, floor(it / p->stepsize));
  if (strcmp(pol, "exp") == 0) return base * pow(g, it);
  if (strcmp(pol, "inv") == 0) return base * pow(1.0 + g * it, -(double)p->power);
  if (strcmp(pol, "multistep") == 0) {
    while ((size_t)s->current_step < p->n_stepvalue && s->iter >= p->stepvalue[s->current_step])
      s->current_step++;
    return base * pow(g, s->current_step);
  }
  if (strcmp(pol, "poly") == 0) {
    double frac = s->max_iter > 0 ? it / s->max_iter : 0;
    return base * pow(1.0 - frac, p->power);
  }
  /* sigmoid */
  return base * (1.0 / (1.0 + exp(-g * (it - p->stepsize))));
}

/* A KILN_FAULT=lr:FACTOR scales the rate here, so the update and the events (which report the
 * rate applied) see the same value. */
float kiln_solver_learning_rate(kiln_solver *s) {
  double rate = policy_rate(s);
  if (s->fault.kind == KILN_FAULT_LR) rate *= s->fault.lr_factor;
  return (float)rate;
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

bool update_apply(kiln_solver *s, float rate, int workers) {
  const Caffe__SolverParameter *p = s->param;
  kiln_net *net = s->net;
  clip_gradients(s);
  bool l1 = p->regularization_type && strcmp(p->regularization_type, "L1") == 0;
  /* One division for the whole sum (workers x passes), after clipping, as one worker with
   * iter_size N divides its passes' sum. */
  int summed = p->iter_size * workers;
  float norm = summed > 1 ? 1.0f / (float)summed : 1.0f;
  float m = p->momentum, delta = p->delta;
  int64_t hstride = net->nparam_floats;
  /* Adam's bias correction uses t = iter + 1. */
  double t = s->iter + 1.0;
  double b1 = p->momentum, b2 = p->momentum2;
  float adam_rate = (float)(rate * sqrt(1.0 - pow(b2, t)) / (1.0 - pow(b1, t)));
  bool all_finite = s->type == KILN_SOLVER_SGD && !l1;
  for (int k = 0; k < net->nlearnable; k++) {
    kiln_blob *b = net->learnable[k];
    float *w = b->data, *g = b->diff;
    float *h = s->history + net->learnable_offset[k];
    float *h2 = h + hstride;
    int64_t n = b->count;
    float lr = rate * net->lr_mult[k];
    float wd = p->weight_decay * net->decay_mult[k];
    if (s->type == KILN_SOLVER_SGD && !l1) {
      /* The steps below fused into one pass over memory (the update reads three arrays the
       * size of the model; apart, the passes made it memory-bound), with the finite check of
       * the new weights: per element the same operations in the same order, so the same bits. */
      int bad = 0;
#pragma omp simd reduction(| : bad)
      for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        if (norm != 1.0f) gi *= norm;
        if (wd != 0) gi += wd * w[i];
        g[i] = gi;
        h[i] = m * h[i] + lr * gi;
        w[i] -= h[i];
        bad |= !(fabsf(w[i]) <= FLT_MAX);
      }
      if (bad) all_finite = false;
      continue;
    }
    /* `omp simd`: w, g and h never overlap, which the compiler cannot see; vectorised, the
     * same operations in the same order per element, so the same bits. Scalar, these loops were
     * a visible share of a small net's step (LeNet's, profiled with perf: docs/PERF.md). */
    if (norm != 1.0f) {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) g[i] *= norm;
    }
    if (wd != 0) {
      if (l1) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) g[i] += wd * (float)((w[i] > 0) - (w[i] < 0));
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) g[i] += wd * w[i];
      }
    }
    switch (s->type) {
      case KILN_SOLVER_SGD:
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
          h[i] = m * h[i] + lr * g[i];
          w[i] -= h[i];
        }
        break;
      case KILN_SOLVER_NESTEROV:
#pragma omp simd
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
  return all_finite;
}

/* The loss alone can miss a divergence (a loss layer that clamps its probabilities reports a
 * finite loss from NaN inputs), so the parameters are checked after every update as well. */
int update_check_finite(kiln_solver *s, float rate) {
  const kiln_net *net = s->net;
  for (int k = 0; k < net->nlearnable; k++) {
    const kiln_blob *b = net->learnable[k];
    /* a vectorised scan first (every step reads every parameter), the search only on a hit */
    int bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < b->count; i++) bad |= !(fabsf(b->data[i]) <= FLT_MAX);
    if (!bad) continue;
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
