/* The neuron family on the CUDA backend (KILN_OPS_NEURON): one thread an element, the reference's
 * formulas (src/ops/neuron.c) term for term; PReLU's slope gradients one thread a channel, its
 * values summed in image order in double, as the reference does. The reference's vectorisable
 * exp, logistic and erfc (src/ops/vmath.h) are host code; here libm's stand in for them, which
 * compute the same functions more exactly. */
#include "cuda/kcuda.h"

#define KCUDA_SQRT1_2 0.70710678118654752440f      /* 1 / sqrt(2) */
#define KCUDA_INV_SQRT_2PI 0.39894228040143267794f /* 1 / sqrt(2 pi) */
#define KCUDA_SQRT_2_PI 0.79788456080286535588f    /* sqrt(2 / pi) */
#define KCUDA_GELU_C 0.044715f
/* Caffe's kBNLL_THRESHOLD: the gradient's e^x stays finite. */
#define KCUDA_BNLL_THRESHOLD 50.0

KCUDA_DEV float kcuda_sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

/* ---- AbsVal, ELU ----------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_absval_fwd(float *y, const float *x, int64_t n) {
  KCUDA_FOR(i, n) y[i] = fabsf(x[i]);
}

KCUDA_OP(absval_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  KCUDA_LAUNCH(c, n, k_absval_fwd, y, x, n);
  return kcuda_launched(c, "absval_fwd");
}

KCUDA_GLOBAL void k_absval_bwd(float *dx, const float *dy, const float *x, int64_t n) {
  KCUDA_FOR(i, n) dx[i] = (float)((x[i] > 0) - (x[i] < 0)) * dy[i];
}

KCUDA_OP(absval_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                     int64_t n) {
  KCUDA_LAUNCH(c, n, k_absval_bwd, dx, dy, x, n);
  return kcuda_launched(c, "absval_bwd");
}

/* expm1 where Caffe writes exp(x) - 1: no cancellation for small negative inputs. */
KCUDA_GLOBAL void k_elu_fwd(float *y, const float *x, int64_t n, float alpha) {
  KCUDA_FOR(i, n) y[i] = x[i] > 0 ? x[i] : alpha * expm1f(x[i]);
}

KCUDA_OP(elu_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float alpha) {
  KCUDA_LAUNCH(c, n, k_elu_fwd, y, x, n, alpha);
  return kcuda_launched(c, "elu_fwd");
}

KCUDA_GLOBAL void k_elu_bwd(float *dx, const float *dy, const float *x, int64_t n, float alpha) {
  KCUDA_FOR(i, n) dx[i] = x[i] > 0 ? dy[i] : dy[i] * alpha * expf(x[i]);
}

KCUDA_OP(elu_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                  float alpha) {
  KCUDA_LAUNCH(c, n, k_elu_bwd, dx, dy, x, n, alpha);
  return kcuda_launched(c, "elu_bwd");
}

/* ---- BNLL, Threshold ------------------------------------------------------------------------- */

/* In double, x + log(1 + e^-x) for x > 0 so that e^x never overflows. */
KCUDA_GLOBAL void k_bnll_fwd(float *y, const float *x, int64_t n) {
  KCUDA_FOR(i, n) {
    const double v = x[i];
    y[i] = (float)(v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)));
  }
}

KCUDA_OP(bnll_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  KCUDA_LAUNCH(c, n, k_bnll_fwd, y, x, n);
  return kcuda_launched(c, "bnll_fwd");
}

KCUDA_GLOBAL void k_bnll_bwd(float *dx, const float *dy, const float *x, int64_t n) {
  KCUDA_FOR(i, n) {
    const double e = exp(fmin((double)x[i], KCUDA_BNLL_THRESHOLD));
    dx[i] = (float)(dy[i] * e / (e + 1));
  }
}

KCUDA_OP(bnll_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                   int64_t n) {
  KCUDA_LAUNCH(c, n, k_bnll_bwd, dx, dy, x, n);
  return kcuda_launched(c, "bnll_bwd");
}

KCUDA_GLOBAL void k_threshold_fwd(float *y, const float *x, int64_t n, float t) {
  KCUDA_FOR(i, n) y[i] = x[i] > t ? 1.0f : 0.0f;
}

KCUDA_OP(threshold_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float t) {
  KCUDA_LAUNCH(c, n, k_threshold_fwd, y, x, n, t);
  return kcuda_launched(c, "threshold_fwd");
}

/* ---- Exp, Log -------------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_exp_fwd(float *y, const float *x, int64_t n, float inner, float outer) {
  KCUDA_FOR(i, n) y[i] = outer * expf(inner * x[i]);
}

KCUDA_OP(exp_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float inner,
                  float outer) {
  KCUDA_LAUNCH(c, n, k_exp_fwd, y, x, n, inner, outer);
  return kcuda_launched(c, "exp_fwd");
}

KCUDA_GLOBAL void k_exp_bwd(float *dx, const float *dy, const float *y, int64_t n, float inner) {
  KCUDA_FOR(i, n) dx[i] = y[i] * dy[i] * inner;
}

KCUDA_OP(exp_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n,
                  float inner) {
  KCUDA_LAUNCH(c, n, k_exp_bwd, dx, dy, y, n, inner);
  return kcuda_launched(c, "exp_bwd");
}

KCUDA_GLOBAL void k_log_fwd(float *y, const float *x, int64_t n, float scale, float shift,
                            float base_scale) {
  KCUDA_FOR(i, n) y[i] = logf(scale * x[i] + shift) * base_scale;
}

KCUDA_OP(log_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float scale,
                  float shift, float base_scale) {
  KCUDA_LAUNCH(c, n, k_log_fwd, y, x, n, scale, shift, base_scale);
  return kcuda_launched(c, "log_fwd");
}

KCUDA_GLOBAL void k_log_bwd(float *dx, const float *dy, const float *x, int64_t n, float scale,
                            float shift, float bscale) {
  KCUDA_FOR(i, n) dx[i] = dy[i] * (bscale / (scale * x[i] + shift));
}

KCUDA_OP(log_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                  float scale, float shift, float bscale) {
  KCUDA_LAUNCH(c, n, k_log_bwd, dx, dy, x, n, scale, shift, bscale);
  return kcuda_launched(c, "log_bwd");
}

/* ---- Power ----------------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_fill(float *y, int64_t n, float v) {
  KCUDA_FOR(i, n) y[i] = v;
}

KCUDA_GLOBAL void k_power_linear(float *y, const float *x, int64_t n, float scale, float shift) {
  KCUDA_FOR(i, n) y[i] = scale * x[i] + shift;
}

KCUDA_GLOBAL void k_power_fwd(float *y, const float *x, int64_t n, float power, float scale,
                              float shift) {
  KCUDA_FOR(i, n) y[i] = powf(scale * x[i] + shift, power);
}

/* A zero power scale is a constant, computed once on the host (x is not read: it may be NULL). */
KCUDA_OP(power_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float power,
                    float scale, float shift) {
  if (power * scale == 0) {
    const float v = power == 0 ? 1.0f : powf(shift, power);
    KCUDA_LAUNCH(c, n, k_fill, y, n, v);
  } else if (power == 1) {
    KCUDA_LAUNCH(c, n, k_power_linear, y, x, n, scale, shift);
  } else {
    KCUDA_LAUNCH(c, n, k_power_fwd, y, x, n, power, scale, shift);
  }
  return kcuda_launched(c, "power_fwd");
}

KCUDA_GLOBAL void k_scale(float *dx, const float *dy, int64_t n, float s) {
  KCUDA_FOR(i, n) dx[i] = s * dy[i];
}

KCUDA_GLOBAL void k_power_bwd_square(float *dx, const float *dy, const float *x, int64_t n,
                                     float diff_scale, float scale, float shift) {
  KCUDA_FOR(i, n) dx[i] = diff_scale * (scale * x[i] + shift) * dy[i];
}

KCUDA_GLOBAL void k_power_bwd(float *dx, const float *dy, const float *x, int64_t n,
                              float diff_scale, float power, float scale, float shift) {
  KCUDA_FOR(i, n) dx[i] = diff_scale * powf(scale * x[i] + shift, power - 1) * dy[i];
}

/* The derivative written directly, as the reference's (not Caffe's power scale y / base, which
 * is 0/0 where the base is 0). */
KCUDA_OP(power_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                    float power, float scale, float shift) {
  const float diff_scale = power * scale;
  if (power * scale == 0 || power == 1) {
    KCUDA_LAUNCH(c, n, k_scale, dx, dy, n, diff_scale);
  } else if (power == 2) {
    KCUDA_LAUNCH(c, n, k_power_bwd_square, dx, dy, x, n, diff_scale, scale, shift);
  } else {
    KCUDA_LAUNCH(c, n, k_power_bwd, dx, dy, x, n, diff_scale, power, scale, shift);
  }
  return kcuda_launched(c, "power_bwd");
}

/* ---- PReLU: x as N x C x D, one slope per channel (or one for all) --------------------------- */

KCUDA_GLOBAL void k_prelu_fwd(float *y, const float *x, const float *a, int64_t n, int64_t C,
                              int64_t D, bool shared) {
  KCUDA_FOR(i, n) {
    const float slope = a[shared ? 0 : (i / D) % C];
    y[i] = x[i] > 0 ? x[i] : slope * x[i];
  }
}

KCUDA_OP(prelu_fwd)(const kiln_op_ctx *c, float *y, const float *x, const float *a, int64_t N,
                    int64_t C, int64_t D, bool shared) {
  if (D <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, N * C * D, k_prelu_fwd, y, x, a, N * C * D, C, D, shared);
  return kcuda_launched(c, "prelu_fwd");
}

/* dx may be dy: each element reads its own dy before it writes. */
KCUDA_GLOBAL void k_prelu_bwd(float *dx, const float *dy, const float *x, const float *a,
                              int64_t n, int64_t C, int64_t D, bool shared) {
  KCUDA_FOR(i, n) {
    const float slope = a[shared ? 0 : (i / D) % C];
    dx[i] = x[i] > 0 ? dy[i] : slope * dy[i];
  }
}

KCUDA_OP(prelu_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                    const float *a, int64_t N, int64_t C, int64_t D, bool shared) {
  if (D <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, N * C * D, k_prelu_bwd, dx, dy, x, a, N * C * D, C, D, shared);
  return kcuda_launched(c, "prelu_bwd");
}

/* One thread a channel, its values in image order in double, as the reference; the slopes of
 * unshared channels take their sums in the same pass. */
KCUDA_GLOBAL void k_prelu_channel_sums(float *da, double *sums, const float *x, const float *dy,
                                       int64_t N, int64_t C, int64_t D, bool shared) {
  KCUDA_FOR(ch, C) {
    double sum = 0;
    for (int64_t n = 0; n < N; n++) {
      const float *xr = x + (n * C + ch) * D, *dyr = dy + (n * C + ch) * D;
      for (int64_t j = 0; j < D; j++)
        if (xr[j] <= 0) sum += (double)dyr[j] * xr[j];
    }
    sums[ch] = sum;
    if (!shared) da[ch] += (float)sum;
  }
}

/* The shared slope: the channel sums added in channel order, by one thread. */
KCUDA_GLOBAL void k_prelu_shared_total(float *da, const double *sums, int64_t C) {
  KCUDA_FOR(i, 1) {
    double total = 0;
    for (int64_t ch = 0; ch < C; ch++) total += sums[ch];
    da[0] += (float)total;
  }
}

KCUDA_OP(prelu_slope_bwd)(const kiln_op_ctx *c, float *da, const float *x, const float *dy,
                          double *sums, int64_t N, int64_t C, int64_t D, bool shared) {
  KCUDA_LAUNCH(c, C, k_prelu_channel_sums, da, sums, x, dy, N, C, D, shared);
  if (shared) KCUDA_LAUNCH(c, 1, k_prelu_shared_total, da, sums, C);
  return kcuda_launched(c, "prelu_slope_bwd");
}

/* ---- Swish ----------------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_swish_fwd(float *y, const float *x, int64_t n, float beta) {
  KCUDA_FOR(i, n) y[i] = x[i] * kcuda_sigmoidf(beta * x[i]);
}

KCUDA_OP(swish_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float beta) {
  KCUDA_LAUNCH(c, n, k_swish_fwd, y, x, n, beta);
  return kcuda_launched(c, "swish_fwd");
}

KCUDA_GLOBAL void k_swish_bwd(float *dx, const float *dy, const float *x, int64_t n, float beta) {
  KCUDA_FOR(i, n) {
    const float s = kcuda_sigmoidf(beta * x[i]);
    dx[i] = dy[i] * (s + beta * x[i] * s * (1 - s));
  }
}

KCUDA_OP(swish_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                    float beta) {
  KCUDA_LAUNCH(c, n, k_swish_bwd, dx, dy, x, n, beta);
  return kcuda_launched(c, "swish_bwd");
}

/* ---- GELU ------------------------------------------------------------------------------------ */
/* Phi(x) as erfc(-x / sqrt 2) / 2, which keeps its digits where erf is near -1; the tanh form as
 * x sigmoid(2u), u the tanh's argument, which is 0.5 x (1 + tanh u) without the sum. */

/* The tanh form's s = sigmoid(2u), u = sqrt(2/pi) (x + c x^3): y = x s. */
KCUDA_DEV float kcuda_gelu_s(float v) {
  return kcuda_sigmoidf(2.0f * KCUDA_SQRT_2_PI * (v + KCUDA_GELU_C * v * v * v));
}

KCUDA_GLOBAL void k_gelu_fwd(float *y, const float *x, int64_t n, bool approx_tanh) {
  KCUDA_FOR(i, n) {
    const float v = x[i];
    y[i] = approx_tanh ? v * kcuda_gelu_s(v) : 0.5f * v * erfcf(-v * KCUDA_SQRT1_2);
  }
}

KCUDA_OP(gelu_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, bool approx_tanh) {
  KCUDA_LAUNCH(c, n, k_gelu_fwd, y, x, n, approx_tanh);
  return kcuda_launched(c, "gelu_fwd");
}

/* Exact: Phi(x) + x phi(x). Tanh form: s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2). */
KCUDA_GLOBAL void k_gelu_bwd(float *dx, const float *dy, const float *x, int64_t n,
                             bool approx_tanh) {
  KCUDA_FOR(i, n) {
    const float v = x[i];
    float g;
    if (approx_tanh) {
      const float sg = kcuda_gelu_s(v);
      g = sg + 2.0f * v * sg * (1.0f - sg) * KCUDA_SQRT_2_PI * (1.0f + 3.0f * KCUDA_GELU_C * v * v);
    } else {
      g = 0.5f * erfcf(-v * KCUDA_SQRT1_2) + v * KCUDA_INV_SQRT_2PI * expf(-0.5f * v * v);
    }
    dx[i] = g * dy[i];
  }
}

KCUDA_OP(gelu_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,
                   bool approx_tanh) {
  KCUDA_LAUNCH(c, n, k_gelu_bwd, dx, dy, x, n, approx_tanh);
  return kcuda_launched(c, "gelu_bwd");
}

KCUDA_REGISTER(neuron) {
  b->absval_fwd = KCUDA_FN(absval_fwd);
  b->absval_bwd = KCUDA_FN(absval_bwd);
  b->elu_fwd = KCUDA_FN(elu_fwd);
  b->elu_bwd = KCUDA_FN(elu_bwd);
  b->bnll_fwd = KCUDA_FN(bnll_fwd);
  b->bnll_bwd = KCUDA_FN(bnll_bwd);
  b->threshold_fwd = KCUDA_FN(threshold_fwd);
  b->exp_fwd = KCUDA_FN(exp_fwd);
  b->exp_bwd = KCUDA_FN(exp_bwd);
  b->log_fwd = KCUDA_FN(log_fwd);
  b->log_bwd = KCUDA_FN(log_bwd);
  b->power_fwd = KCUDA_FN(power_fwd);
  b->power_bwd = KCUDA_FN(power_bwd);
  b->prelu_fwd = KCUDA_FN(prelu_fwd);
  b->prelu_bwd = KCUDA_FN(prelu_bwd);
  b->prelu_slope_bwd = KCUDA_FN(prelu_slope_bwd);
  b->swish_fwd = KCUDA_FN(swish_fwd);
  b->swish_bwd = KCUDA_FN(swish_bwd);
  b->gelu_fwd = KCUDA_FN(gelu_fwd);
  b->gelu_bwd = KCUDA_FN(gelu_bwd);
}
