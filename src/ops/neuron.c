/* The neuron kernels: element-wise functions of one input besides ReLU, Sigmoid and TanH (AbsVal,
 * ELU, BNLL, Threshold, Exp, Log, Power, Swish, GELU), PReLU's per-channel slopes, and their
 * gradients. Each loop is the arithmetic the layers ran before they called ops, unchanged, so the
 * bits are too: from KILN_PARALLEL_FROM elements a loop is split over the op's threads, and the
 * only sums (PReLU's slope gradients) add in a fixed order whatever the thread count. */
#include <math.h>

#include "ops/kernels.h"
#include "ops/vmath.h"

/* ---- AbsVal, ELU ----------------------------------------------------------------------------- */

int kiln_ref_absval_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]);
  return KILN_OK;
}

int kiln_ref_absval_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                        int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) dx[i] = (float)((x[i] > 0) - (x[i] < 0)) * dy[i];
  return KILN_OK;
}

/* expm1(x) where Caffe writes exp(x) - 1: the same function, without the cancellation that loses
 * most digits of small negative inputs. */
int kiln_ref_elu_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float alpha) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : alpha * expm1f(x[i]);
  return KILN_OK;
}

/* Caffe writes alpha e^x as y + alpha; this reads the input, so in place needs its copy. */
int kiln_ref_elu_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                     float alpha) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0 ? dy[i] : dy[i] * alpha * expf(x[i]);
  return KILN_OK;
}

/* ---- BNLL, Threshold ------------------------------------------------------------------------- */

/* Caffe's kBNLL_THRESHOLD: the gradient's e^x stays finite. */
#define BNLL_THRESHOLD 50.0

/* x + log(1 + e^-x) for x > 0, so that e^x never overflows. */
int kiln_ref_bnll_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) {
    const double v = x[i];
    y[i] = (float)(v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)));
  }
  return KILN_OK;
}

int kiln_ref_bnll_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                      int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) {
    const double e = exp(fmin((double)x[i], BNLL_THRESHOLD));
    dx[i] = (float)(dy[i] * e / (e + 1));
  }
  return KILN_OK;
}

int kiln_ref_threshold_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float t) {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (parallel: n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > t ? 1.0f : 0.0f;
  return KILN_OK;
}

/* ---- Exp, Log -------------------------------------------------------------------------------- */

int kiln_ref_exp_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float inner,
                     float outer) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = outer * expf(inner * x[i]);
  return KILN_OK;
}

int kiln_ref_exp_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n,
                     float inner) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) dx[i] = y[i] * dy[i] * inner;
  return KILN_OK;
}

int kiln_ref_log_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float scale,
                     float shift, float base_scale) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = logf(scale * x[i] + shift) * base_scale;
  return KILN_OK;
}

int kiln_ref_log_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                     float scale, float shift, float bscale) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (bscale / (scale * x[i] + shift));
  return KILN_OK;
}

/* ---- Power ----------------------------------------------------------------------------------- */

int kiln_ref_power_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float power,
                       float scale, float shift) {
  if (power * scale == 0) { /* a constant: a serial fill */
    float v = power == 0 ? 1.0f : powf(shift, power);
    for (int64_t i = 0; i < n; i++) y[i] = v;
    return KILN_OK;
  }
  if (power == 1) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) y[i] = scale * x[i] + shift;
  } else {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) y[i] = powf(scale * x[i] + shift, power);
  }
  return KILN_OK;
}

/* Written directly rather than as Caffe's power scale y / (shift + scale x), which is 0/0 where
 * the base is 0; the two agree elsewhere. */
int kiln_ref_power_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                       int64_t n, float power, float scale, float shift) {
  const float diff_scale = power * scale;
  if (power * scale == 0 || power == 1) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) dx[i] = diff_scale * dy[i];
    return KILN_OK;
  }
  if (power == 2) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) dx[i] = diff_scale * (scale * x[i] + shift) * dy[i];
  } else {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++)
      dx[i] = diff_scale * powf(scale * x[i] + shift, power - 1) * dy[i];
  }
  return KILN_OK;
}

/* ---- PReLU: x as N x C x D, one slope per channel (or one for all) --------------------------- */

int kiln_ref_prelu_fwd(const kiln_op_ctx *c, float *y, const float *x, const float *a, int64_t N,
                       int64_t C, int64_t D, bool shared) {
  const int64_t rows = N * C;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * D > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    float slope = a[shared ? 0 : r % C];
    const float *xr = x + r * D;
    float *yr = y + r * D;
    for (int64_t j = 0; j < D; j++) yr[j] = xr[j] > 0 ? xr[j] : slope * xr[j];
  }
  return KILN_OK;
}

int kiln_ref_prelu_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                       const float *a, int64_t N, int64_t C, int64_t D, bool shared) {
  const int64_t rows = N * C;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * D > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    float slope = a[shared ? 0 : r % C];
    const float *xr = x + r * D, *dyr = dy + r * D;
    float *dxr = dx + r * D;
    for (int64_t j = 0; j < D; j++) dxr[j] = xr[j] > 0 ? dyr[j] : slope * dyr[j];
  }
  return KILN_OK;
}

/* Per-channel sums first (each channel summed in image order, one channel a thread, so the result
 * does not depend on the thread count), then added to the slope gradients in channel order. */
int kiln_ref_prelu_slope_bwd(const kiln_op_ctx *c, float *da, const float *x, const float *dy,
                             double *sums, int64_t N, int64_t C, int64_t D, bool shared) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * D > KILN_PARALLEL_FROM)
  for (int64_t ch = 0; ch < C; ch++) {
    double sum = 0;
    for (int64_t n = 0; n < N; n++) {
      const float *xr = x + (n * C + ch) * D, *dyr = dy + (n * C + ch) * D;
      for (int64_t j = 0; j < D; j++)
        if (xr[j] <= 0) sum += (double)dyr[j] * xr[j];
    }
    sums[ch] = sum;
  }
  if (shared) {
    double total = 0;
    for (int64_t ch = 0; ch < C; ch++) total += sums[ch];
    da[0] += (float)total;
  } else {
    for (int64_t ch = 0; ch < C; ch++) da[ch] += (float)sums[ch];
  }
  return KILN_OK;
}

/* ---- Swish ----------------------------------------------------------------------------------- */

int kiln_ref_swish_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float beta) {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * kiln_vsigmoidf(beta * x[i]);
  return KILN_OK;
}

/* s + beta x s (1 - s), s = sigmoid(beta x): beta y + s (1 - beta y). */
int kiln_ref_swish_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                       int64_t n, float beta) {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) {
    const float s = kiln_vsigmoidf(beta * x[i]);
    dx[i] = dy[i] * (s + beta * x[i] * s * (1 - s));
  }
  return KILN_OK;
}

/* ---- GELU ------------------------------------------------------------------------------------ */
/* Phi(x) as erfc(-x / sqrt 2) / 2 rather than (1 + erf(x / sqrt 2)) / 2: in float the sum loses
 * most of its digits where erf is near -1; erfc keeps them. The tanh form as x sigmoid(2u), u the
 * tanh's argument, which equals 0.5 x (1 + tanh u) without the sum. */

#define SQRT1_2 0.70710678118654752440f      /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794f /* 1 / sqrt(2 pi) */
#define SQRT_2_PI 0.79788456080286535588f    /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* The tanh form's s = sigmoid(2u), u = sqrt(2/pi) (x + c x^3): y = x s. */
static inline float gelu_s(float v) {
  return kiln_vsigmoidf(2.0f * SQRT_2_PI * (v + GELU_C * v * v * v));
}

int kiln_ref_gelu_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n,
                      bool approx_tanh) {
  if (approx_tanh) {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * gelu_s(x[i]);
  } else {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * kiln_verfcf(-x[i] * SQRT1_2);
  }
  return KILN_OK;
}

/* Exact: dy/dx = Phi(x) + x phi(x). Tanh form, with u = sqrt(2/pi) (x + c x^3), t = tanh u and
 * s = (1 + t) / 2 = sigmoid(2u): dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u'
 * = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2). */
int kiln_ref_gelu_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                      bool approx_tanh) {
  if (approx_tanh) {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float sg = gelu_s(v);
      float g = sg + 2.0f * v * sg * (1.0f - sg) * SQRT_2_PI * (1.0f + 3.0f * GELU_C * v * v);
      dx[i] = g * dy[i];
    }
  } else {
#pragma omp parallel for simd schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) {
      float v = x[i];
      float g = 0.5f * kiln_verfcf(-v * SQRT1_2) + v * INV_SQRT_2PI * kiln_vexpf(-0.5f * v * v);
      dx[i] = g * dy[i];
    }
  }
  return KILN_OK;
}
