/* GELU, element-wise: y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), PyTorch's nn.GELU (its
 * default, exact form), or with gelu_param { approximate: TANH } PyTorch's approximate='tanh',
 * y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The gradient needs the input, so an
 * in-place GELU keeps a copy of it, as Power does. Phi(x) is taken as erfc(-x / sqrt 2) / 2
 * rather than (1 + erf(x / sqrt 2)) / 2: in float the sum loses most of its digits where erf is
 * near -1 (relative errors of 3e-4 at x = -4, 4% at x = -5); erfc keeps them. Likewise the
 * tanh form is computed as x sigmoid(2u), u the tanh's argument, which equals 0.5 x (1 + tanh u)
 * without the sum. erfc and exp are the vectorizable forms of layer_util.h (GELU within 1.4e-5
 * relative down to x = -12), as libm's scalar erfcf was the slowest part of a transformer block. */
#include <math.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__GELUParameter gelu_defaults = CAFFE__GELUPARAMETER__INIT;

static bool gelu_tanh(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->gelu_param, gelu_defaults)->approximate ==
         CAFFE__GELUPARAMETER__APPROXIMATE__TANH;
}

static int gelu_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int gelu_reshape(kiln_layer *l) {
  l->flops = 10.0 * (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

#define SQRT1_2 0.70710678118654752440f   /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794f /* 1 / sqrt(2 pi) */
#define SQRT_2_PI 0.79788456080286535588f  /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* The tanh form's s = sigmoid(2u), u = sqrt(2/pi) (x + c x^3): y = x s. */
static inline float gelu_s(float v) {
  return kiln_vsigmoidf(2.0f * SQRT_2_PI * (v + GELU_C * v * v * v));
}

static int gelu_forward(kiln_layer *l) {
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  int64_t n = l->bottom[0]->count;
  if (l->nbuffer > 0) memcpy(l->buffer[0]->data, x, sizeof(float) * (size_t)n);
  if (gelu_tanh(l)) {
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * gelu_s(x[i]);
  } else {
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * kiln_verfcf(-x[i] * SQRT1_2);
  }
  return KILN_OK;
}

/* Exact: dy/dx = Phi(x) + x phi(x). Tanh form, with u = sqrt(2/pi) (x + c x^3), t = tanh u and
 * s = (1 + t) / 2 = sigmoid(2u): dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u'
 * = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2). */
static int gelu_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  const float *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  int64_t n = l->bottom[0]->count;
  if (gelu_tanh(l)) {
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float sg = gelu_s(v);
      float g = sg + 2.0f * v * sg * (1.0f - sg) * SQRT_2_PI * (1.0f + 3.0f * GELU_C * v * v);
      dx[i] = g * dy[i];
    }
  } else {
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float g = 0.5f * kiln_verfcf(-v * SQRT1_2) + v * INV_SQRT_2PI * kiln_vexpf(-0.5f * v * v);
      dx[i] = g * dy[i];
    }
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_gelu = {
    .type = "GELU", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = gelu_setup, .reshape = gelu_reshape, .forward = gelu_forward,
    .backward = gelu_backward, .layout_role = kiln_layout_any,
};
