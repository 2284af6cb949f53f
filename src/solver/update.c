/* The update rules and learning-rate policies (see include/kiln/solver.h). Caffe's update, once
 * the iteration's gradients are summed: clip by global L2 norm, normalise by 1 / (workers x
 * iter_size), regularise (L2 or L1), compute the step with the solver's rule (SGD, Nesterov,
 * AdaGrad, RMSProp, AdaDelta, Adam), subtract. The parameters, gradients and histories are flat
 * buffers, so each stage is one op per blob, run by the net's backend where they live.
 *
 * The sum is divided once, by workers x iter_size, after clipping: clip_gradients sees the same
 * sum as on one worker with iter_size N (Caffe's multi-GPU solver clips each worker's mean
 * instead). */
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

/* Every loop over the parameters, gradients and histories is an op of the net's backend
 * (include/kiln/backend.h, src/ops/solver.c), so it runs where they live; the learning rates
 * and the rules' settings are scalars computed here, and the sums and flags the ops reduce
 * into (s->scalars, on the net's device) come back through the device table. */
#define OP(s, op, ...) KILN_NET_OP((s)->net, op, __VA_ARGS__)

static int clip_gradients(kiln_solver *s) {
  float clip = s->param->clip_gradients;
  if (clip < 0) return KILN_OK;
  kiln_net *net = s->net;
  /* one sum in double over every gradient in order, the blobs one after another */
  double *dev_sumsq = &s->scalars->sumsq, sumsq;
  KILN_TRY(kiln_device_set(net->device, dev_sumsq, 0, sizeof *dev_sumsq));
  for (int k = 0; k < net->nlearnable; k++)
    KILN_TRY(OP(s, sumsq_acc, dev_sumsq, net->learnable[k]->diff, net->learnable[k]->count));
  KILN_TRY(kiln_device_to_host(net->device, &sumsq, dev_sumsq, sizeof sumsq));
  double norm = sqrt(sumsq);
  if (norm > clip) {
    float f = (float)(clip / norm);
    kiln_log(KILN_LOG_DEBUG, "gradient clipping: scaling down gradients (L2 norm %g > %g) by %g",
             norm, clip, f);
    for (int k = 0; k < net->nlearnable; k++) {
      float *g = net->learnable[k]->diff;
      KILN_TRY(OP(s, scale, g, g, f, net->learnable[k]->count));
    }
  }
  return KILN_OK;
}

int update_apply(kiln_solver *s, float rate, int workers, bool *all_finite) {
  const Caffe__SolverParameter *p = s->param;
  kiln_net *net = s->net;
  *all_finite = false;
  KILN_TRY(clip_gradients(s));
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
  /* SGD checks the new weights in its own pass: a flag on the device, set by any blob */
  int32_t *dev_bad = &s->scalars->bad;
  if (s->type == KILN_SOLVER_SGD)
    KILN_TRY(kiln_device_set(net->device, dev_bad, 0, sizeof *dev_bad));
  for (int k = 0; k < net->nlearnable; k++) {
    kiln_blob *b = net->learnable[k];
    float *w = b->data, *g = b->diff;
    float *h = s->history + net->learnable_offset[k];
    float *h2 = h + hstride;
    int64_t n = b->count;
    float lr = rate * net->lr_mult[k];
    float wd = p->weight_decay * net->decay_mult[k];
    if (s->type == KILN_SOLVER_SGD) {
      /* the normalisation and L2's decay in SGD's pass; L1's decay in a pass before it */
      if (l1) {
        KILN_TRY(OP(s, regularize, g, w, n, norm, wd, true));
        KILN_TRY(OP(s, sgd_update, w, h, g, dev_bad, n, 1.0f, 0.0f, lr, m));
      } else {
        KILN_TRY(OP(s, sgd_update, w, h, g, dev_bad, n, norm, wd, lr, m));
      }
      continue;
    }
    KILN_TRY(OP(s, regularize, g, w, n, norm, wd, l1));
    switch (s->type) {
      case KILN_SOLVER_NESTEROV: KILN_TRY(OP(s, nesterov_update, w, h, g, n, lr, m)); break;
      case KILN_SOLVER_ADAGRAD: KILN_TRY(OP(s, adagrad_update, w, h, g, n, lr, delta)); break;
      case KILN_SOLVER_RMSPROP:
        KILN_TRY(OP(s, rmsprop_update, w, h, g, n, lr, p->rms_decay, delta));
        break;
      case KILN_SOLVER_ADADELTA:
        /* Caffe's rate x lr_mult: the same product as lr, float multiplication commuting */
        KILN_TRY(OP(s, adadelta_update, w, h, h2, g, n, lr, m, delta));
        break;
      case KILN_SOLVER_ADAM:
        KILN_TRY(OP(s, adam_update, w, h, h2, g, n, adam_rate * net->lr_mult[k], b1, b2, delta));
        break;
      default: break;
    }
  }
  if (s->type == KILN_SOLVER_SGD) {
    int32_t bad;
    KILN_TRY(kiln_device_to_host(net->device, &bad, dev_bad, sizeof bad));
    *all_finite = !bad;
  }
  return KILN_OK;
}

/* The loss alone can miss a divergence (a loss layer that clamps its probabilities reports a
 * finite loss from NaN inputs), so the parameters are checked after every update as well. */
int update_check_finite(kiln_solver *s, float rate) {
  const kiln_net *net = s->net;
  int64_t *dev_at = &s->scalars->at;
  for (int k = 0; k < net->nlearnable; k++) {
    const kiln_blob *b = net->learnable[k];
    int64_t at;
    KILN_TRY(KILN_NET_OP(net, find_nonfinite, dev_at, b->data, b->count));
    KILN_TRY(kiln_device_to_host(net->device, &at, dev_at, sizeof at));
    if (at < 0) continue;
    float v;
    KILN_TRY(kiln_device_to_host(net->device, &v, b->data + at, sizeof v));
    return kiln_errorf(KILN_ERR_NUMERIC,
                       "iteration %d: parameter '%s' became %g after the update (lr %g); "
                       "training diverged (lower base_lr, or clip gradients with "
                       "clip_gradients)",
                       s->iter, b->name, v, rate);
  }
  return KILN_OK;
}
