/* Power: y = (shift + scale x)^power, element-wise (Caffe's PowerLayer). When power * scale is 0
 * the output is the constant shift^power (1 for power 0) and the gradient is 0; when power is 1
 * the gradient is the constant scale. Otherwise the backward pass needs the input, so an in-place
 * Power keeps a copy of it. */
#include <math.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__PowerParameter power_defaults = CAFFE__POWER_PARAMETER__INIT;

static const Caffe__PowerParameter *power_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->power_param, power_defaults);
}

static bool gradient_is_constant(const Caffe__PowerParameter *p) {
  return p->power * p->scale == 0 || p->power == 1;
}

static int power_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !gradient_is_constant(power_param(l)) &&
      !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int power_reshape(kiln_layer *l) {
  l->flops = 3.0 * (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

static int power_forward(kiln_layer *l) {
  const Caffe__PowerParameter *p = power_param(l);
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  int64_t n = l->bottom[0]->count;
  float power = p->power, scale = p->scale, shift = p->shift;
  if (power * scale == 0) {
    float v = power == 0 ? 1.0f : powf(shift, power);
    for (int64_t i = 0; i < n; i++) y[i] = v;
    return KILN_OK;
  }
  if (l->nbuffer > 0) memcpy(l->buffer[0]->data, x, sizeof(float) * (size_t)n);
  if (power == 1) {
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) y[i] = scale * x[i] + shift;
  } else {
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) y[i] = powf(scale * x[i] + shift, power);
  }
  return KILN_OK;
}

/* dy/dx = power scale (shift + scale x)^(power - 1). Written directly rather than as Caffe's
 * power scale y / (shift + scale x), which is 0/0 where the base is 0; the two agree elsewhere. */
static int power_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__PowerParameter *p = power_param(l);
  const float *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  int64_t n = l->bottom[0]->count;
  float power = p->power, scale = p->scale, shift = p->shift, diff_scale = power * scale;
  if (gradient_is_constant(p)) {
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) dx[i] = diff_scale * dy[i];
    return KILN_OK;
  }
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  if (power == 2) {
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) dx[i] = diff_scale * (scale * x[i] + shift) * dy[i];
  } else {
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++)
      dx[i] = diff_scale * powf(scale * x[i] + shift, power - 1) * dy[i];
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_power = {
    .type = "Power", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = power_setup, .reshape = power_reshape, .forward = power_forward,
    .backward = power_backward,
};
