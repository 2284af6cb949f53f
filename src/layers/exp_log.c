/* Element-wise layers of Caffe's neuron family: Exp (y = base^(shift + scale x)), Log
 * (y = log_base(shift + scale x)), BNLL (y = log(1 + e^x)) and Threshold (y = x > t ? 1 : 0).
 * All may run in place. Exp's backward reads its output, Log's and BNLL's their input; in place
 * each keeps a copy of what it reads (as Power does), since a later layer in place on the same
 * blob may overwrite it. Threshold has no gradient: Caffe's backward is
 * NOT_IMPLEMENTED, and kiln's net refuses a backward pass that would need one (its table has no
 * backward). The constants are Caffe's: base -1 stands for e, and BNLL's gradient clamps its
 * input at 50 so that e^x stays finite. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static void save_input(kiln_layer *l) {
  if (l->nbuffer > 0)
    memcpy(l->buffer[0]->data, l->bottom[0]->data, sizeof(float) * (size_t)l->bottom[0]->count);
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
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  const float inner = s->inner, outer = s->outer;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) y[i] = outer * expf(inner * x[i]);
  if (l->nbuffer > 0) memcpy(l->buffer[0]->data, y, sizeof(float) * (size_t)n);
  return KILN_OK;
}

static int exp_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const exp_state *s = l->priv;
  const float *y = l->nbuffer > 0 ? l->buffer[0]->data : l->top[0]->data, *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  const float inner = s->inner;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) dx[i] = y[i] * dy[i] * inner;
  return KILN_OK;
}

static void free_priv(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_exp = {
    .type = "Exp", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = exp_setup, .reshape = neuron_reshape, .forward = exp_forward,
    .backward = exp_backward, .destroy = free_priv, .layout_role = kiln_layout_any,
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
  save_input(l);
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  const float scale = s->scale, shift = s->shift, base_scale = s->base_scale;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) y[i] = logf(scale * x[i] + shift) * base_scale;
  return KILN_OK;
}

static int log_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const log_state *s = l->priv;
  const float *x = saved_input(l), *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  const float scale = s->scale, shift = s->shift, bs = s->backward_scale;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (bs / (scale * x[i] + shift));
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_log = {
    .type = "Log", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = log_setup, .reshape = neuron_reshape, .forward = log_forward,
    .backward = log_backward, .destroy = free_priv, .layout_role = kiln_layout_any,
};

/* ---- BNLL ---------------------------------------------------------------------------------- */
/* y = log(1 + e^x), as x + log(1 + e^-x) for x > 0 so that e^x never overflows;
 * dx = dy e^x / (1 + e^x) with x clamped at 50 (Caffe's kBNLL_THRESHOLD). */

#define BNLL_THRESHOLD 50.0

static int bnll_forward(kiln_layer *l) {
  save_input(l);
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    const double v = x[i];
    y[i] = (float)(v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)));
  }
  return KILN_OK;
}

static int bnll_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *x = saved_input(l), *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    const double e = exp(fmin((double)x[i], BNLL_THRESHOLD));
    dx[i] = (float)(dy[i] * e / (e + 1));
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_bnll = {
    .type = "BNLL", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = input_copy_setup, .reshape = neuron_reshape, .forward = bnll_forward,
    .backward = bnll_backward, .layout_role = kiln_layout_any,
};

/* ---- Threshold ----------------------------------------------------------------------------- */

static const Caffe__ThresholdParameter threshold_defaults = CAFFE__THRESHOLD_PARAMETER__INIT;

static int threshold_forward(kiln_layer *l) {
  const float t = KILN_PARAM_OR(l->lp->threshold_param, threshold_defaults)->threshold;
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (parallel: n > 32768)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > t ? 1.0f : 0.0f;
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_threshold = {
    .type = "Threshold", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .reshape = neuron_reshape, .forward = threshold_forward, .layout_role = kiln_layout_any,
};
