/* Element-wise layers of Caffe's neuron family: Exp (y = base^(shift + scale x)), Log
 * (y = log_base(shift + scale x)), BNLL (y = log(1 + e^x)) and Threshold (y = x > t ? 1 : 0).
 * All may run in place. Exp's backward reads its output, Log's and BNLL's their input; in place
 * each keeps a copy of what it reads (as Power does), since a later layer in place on the same
 * blob may overwrite it. Threshold has no gradient: Caffe's backward is
 * NOT_IMPLEMENTED, and kiln's net refuses a backward pass that would need one (its table has no
 * backward). The constants are Caffe's: base -1 stands for e, and BNLL's gradient clamps its
 * input at 50 so that e^x stays finite. The arithmetic is in src/ops/neuron.c. */
#include <math.h>
#include <stdlib.h>

#include "layer_util.h"

static int neuron_reshape(kiln_layer *l) {
  l->flops = 2.0 * (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

/* In place, the backward pass of a layer needs a copy of what it reads (its input, or Exp's
 * output): the blob holds the next in-place layer's output by then. */
static int input_copy_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static const float *saved_input(const kiln_layer *l) {
  return l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
}

static int save_input(kiln_layer *l) {
  if (l->nbuffer == 0) return KILN_OK;
  return KILN_OP(l, copy, l->buffer[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

/* log(base) for Exp and Log: base -1 is e (exactly 1); any other base must be > 0 with a finite
 * logarithm (Caffe's checks). */
static int log_of_base(kiln_layer *l, const char *field, float base, double *out) {
  if (base == -1) {
    *out = 1;
    return KILN_OK;
  }
  double lb = log((double)base);
  if (!(base > 0) || !isfinite(lb))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "%s %g must be > 0 with a finite logarithm (or -1 for e)", field, base);
  *out = lb;
  return KILN_OK;
}

/* ---- Exp ----------------------------------------------------------------------------------- */
/* y = base^(shift + scale x) = outer e^(inner x) with inner = ln(base) scale and
 * outer = base^shift; dx = dy y inner. */

static const Caffe__ExpParameter exp_defaults = CAFFE__EXP_PARAMETER__INIT;

typedef struct {
  float inner, outer;
} exp_state;

static int exp_setup(kiln_layer *l) {
  const Caffe__ExpParameter *p = KILN_PARAM_OR(l->lp->exp_param, exp_defaults);
  double lb;
  KILN_TRY(log_of_base(l, "exp_param.base", p->base, &lb));
  exp_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->inner = (float)(lb * p->scale);
  s->outer = p->shift == 0 ? 1.0f : p->base == -1 ? expf(p->shift) : powf(p->base, p->shift);
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "output"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int exp_forward(kiln_layer *l) {
  const exp_state *s = l->priv;
  float *y = l->top[0]->data;
  const int64_t n = l->bottom[0]->count;
  KILN_TRY(KILN_OP(l, exp_fwd, y, l->bottom[0]->data, n, s->inner, s->outer));
  if (l->nbuffer > 0) KILN_TRY(KILN_OP(l, copy, l->buffer[0]->data, y, n));
  return KILN_OK;
}

static int exp_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const exp_state *s = l->priv;
  const float *y = l->nbuffer > 0 ? l->buffer[0]->data : l->top[0]->data;
  return KILN_OP(l, exp_bwd, l->bottom[0]->diff, l->top[0]->diff, y, l->bottom[0]->count,
                 s->inner);
}

static void free_priv(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_exp = {
    .type = "Exp", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = exp_setup, .reshape = neuron_reshape, .forward = exp_forward,
    .backward = exp_backward, .destroy = free_priv, .layout_role = kiln_layout_any,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_exp_fwd, KILN_OP_exp_bwd),
};

/* ---- Log ----------------------------------------------------------------------------------- */
/* y = ln(shift + scale x) / ln(base); dx = dy scale / (ln(base) (shift + scale x)). */

static const Caffe__LogParameter log_defaults = CAFFE__LOG_PARAMETER__INIT;

typedef struct {
  float base_scale, scale, shift, backward_scale;
} log_state;

static int log_setup(kiln_layer *l) {
  const Caffe__LogParameter *p = KILN_PARAM_OR(l->lp->log_param, log_defaults);
  double lb;
  KILN_TRY(log_of_base(l, "log_param.base", p->base, &lb));
  if (lb == 0) /* base 1: 1 / log(base) is infinite */
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "log_param.base 1 has no logarithm");
  log_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->base_scale = (float)(1 / lb);
  s->scale = p->scale;
  s->shift = p->shift;
  s->backward_scale = (float)(p->scale / lb);
  return input_copy_setup(l);
}

static int log_forward(kiln_layer *l) {
  const log_state *s = l->priv;
  KILN_TRY(save_input(l));
  return KILN_OP(l, log_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count, s->scale,
                 s->shift, s->base_scale);
}

static int log_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const log_state *s = l->priv;
  return KILN_OP(l, log_bwd, l->bottom[0]->diff, l->top[0]->diff, saved_input(l),
                 l->bottom[0]->count, s->scale, s->shift, s->backward_scale);
}

const kiln_layer_ops kiln_layer_log = {
    .type = "Log", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = log_setup, .reshape = neuron_reshape, .forward = log_forward,
    .backward = log_backward, .destroy = free_priv, .layout_role = kiln_layout_any,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_log_fwd, KILN_OP_log_bwd),
};

/* ---- BNLL ---------------------------------------------------------------------------------- */
/* y = log(1 + e^x), as x + log(1 + e^-x) for x > 0 so that e^x never overflows;
 * dx = dy e^x / (1 + e^x) with x clamped at 50 (Caffe's kBNLL_THRESHOLD). */

static int bnll_forward(kiln_layer *l) {
  KILN_TRY(save_input(l));
  return KILN_OP(l, bnll_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static int bnll_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, bnll_bwd, l->bottom[0]->diff, l->top[0]->diff, saved_input(l),
                 l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_bnll = {
    .type = "BNLL", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = input_copy_setup, .reshape = neuron_reshape, .forward = bnll_forward,
    .backward = bnll_backward, .layout_role = kiln_layout_any,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_bnll_fwd, KILN_OP_bnll_bwd),
};

/* ---- Threshold ----------------------------------------------------------------------------- */

static const Caffe__ThresholdParameter threshold_defaults = CAFFE__THRESHOLD_PARAMETER__INIT;

static int threshold_forward(kiln_layer *l) {
  const float t = KILN_PARAM_OR(l->lp->threshold_param, threshold_defaults)->threshold;
  return KILN_OP(l, threshold_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count, t);
}

const kiln_layer_ops kiln_layer_threshold = {
    .type = "Threshold", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .reshape = neuron_reshape, .forward = threshold_forward, .layout_role = kiln_layout_any,
    .kernels = KILN_KERNELS(KILN_OP_threshold_fwd),
};
