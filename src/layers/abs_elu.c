/* Element-wise layers AbsVal (y = |x|) and ELU (y = x for x > 0, alpha (exp(x) - 1) otherwise).
 * Both may run in place. Their backward passes read the input, never the output (which a later
 * in-place layer may have changed), so in place they keep a copy of the input.
 * ELU uses expm1(x) where Caffe writes exp(x) - 1: the same function, without the cancellation
 * that loses most digits of small negative inputs. */
#include <math.h>
#include <string.h>

#include "layer_util.h"

static int same_shape_reshape(kiln_layer *l) {
  l->flops = (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

/* ---- AbsVal ---------------------------------------------------------------------------- */

static int absval_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int absval_forward(kiln_layer *l) {
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  int64_t n = l->bottom[0]->count;
  if (l->nbuffer > 0) memcpy(l->buffer[0]->data, x, sizeof(float) * (size_t)n);
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]);
  return KILN_OK;
}

/* dx = sign(x) dy, with sign(0) = 0 as Caffe's caffe_cpu_sign. */
static int absval_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  const float *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) dx[i] = (float)((x[i] > 0) - (x[i] < 0)) * dy[i];
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_absval = {
    .type = "AbsVal", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = absval_setup, .reshape = same_shape_reshape, .forward = absval_forward,
    .backward = absval_backward,
};

/* ---- ELU ------------------------------------------------------------------------------- */

static const Caffe__ELUParameter elu_defaults = CAFFE__ELUPARAMETER__INIT;

static float elu_alpha(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->elu_param, elu_defaults)->alpha;
}

static int elu_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int elu_forward(kiln_layer *l) {
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  float alpha = elu_alpha(l);
  int64_t n = l->bottom[0]->count;
  if (l->nbuffer > 0) memcpy(l->buffer[0]->data, x, sizeof(float) * (size_t)n);
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : alpha * expm1f(x[i]);
  return KILN_OK;
}

/* dx = dy for x > 0, dy alpha exp(x) otherwise (Caffe writes alpha exp(x) as y + alpha). */
static int elu_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  const float *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  float alpha = elu_alpha(l);
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0 ? dy[i] : dy[i] * alpha * expf(x[i]);
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_elu = {
    .type = "ELU", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = elu_setup, .reshape = same_shape_reshape, .forward = elu_forward,
    .backward = elu_backward,
};
