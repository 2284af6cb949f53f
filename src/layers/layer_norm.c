/* LayerNorm, PyTorch's nn.LayerNorm: every sample (the axes before `axis`) is normalized over the
 * axes from `axis` to the last, with their mean and biased variance,
 *   x_hat = (x - mean) / sqrt(var + eps),   y = x_hat * gain + bias,
 * gain and bias shaped like the normalized axes (gain filled with 1, bias with 0), or y = x_hat
 * with elementwise_affine false. Unlike BatchNorm it keeps no statistics: TRAIN and TEST compute
 * the same. Each sample's statistics are taken in double. The normalized input and each sample's
 * 1 / sqrt(var + eps) are kept for backward, so the layer may run in place. */
#include <math.h>
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__LayerNormParameter ln_defaults = CAFFE__LAYER_NORM_PARAMETER__INIT;

typedef struct {
  int axis;
  int64_t M, K; /* samples, and the values normalized together */
  bool gain, bias;
  float eps;
} ln_state;

enum { B_XHAT, B_RSTD };

static int ln_setup(kiln_layer *l) {
  const Caffe__LayerNormParameter *p = KILN_PARAM_OR(l->lp->layer_norm_param, ln_defaults);
  ln_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  const kiln_blob *x = l->bottom[0];
  if (kiln_blob_canonical_axis(x, p->axis, &s->axis))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "layer_norm_param.axis %d is out of range for "
                            "an input of %d axes", p->axis, x->naxes);
  if (!(p->eps >= 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "layer_norm_param.eps %g must be >= 0", p->eps);
  s->eps = p->eps;
  s->gain = p->elementwise_affine;
  s->bias = p->elementwise_affine && p->bias_term;
  const int naxes = x->naxes - s->axis;
  if (s->gain && !kiln_layer_add_param(l, naxes, x->shape + s->axis, p->weight_filler, 1.0f))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (s->bias && !kiln_layer_add_param(l, naxes, x->shape + s->axis, p->bias_filler, 0.0f))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!kiln_layer_add_buffer(l, "normalized") || !kiln_layer_add_buffer(l, "rstd"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int ln_reshape(kiln_layer *l) {
  ln_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes <= s->axis)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the input has %d axes, fewer than axis %d + 1",
                            x->naxes, s->axis);
  if (l->nparam > 0) {
    const kiln_blob *g = l->param[0];
    bool same = g->naxes == x->naxes - s->axis;
    for (int i = 0; same && i < g->naxes; i++) same = g->shape[i] == x->shape[s->axis + i];
    if (!same)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "the normalized axes changed shape (the gain has %lld values, the "
                              "input %lld per sample)",
                              (long long)g->count, (long long)kiln_count(x, s->axis, x->naxes));
  }
  s->M = kiln_count(x, 0, s->axis);
  s->K = kiln_count(x, s->axis, x->naxes);
  const int64_t m[1] = {s->M};
  KILN_TRY(kiln_blob_reshape_like(l->buffer[B_XHAT], x));
  KILN_TRY(kiln_blob_reshape(l->buffer[B_RSTD], 1, m));
  l->flops = 8.0 * (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

static int ln_forward(kiln_layer *l) {
  ln_state *s = l->priv;
  const int64_t M = s->M, K = s->K;
  const float *x = l->bottom[0]->data;
  const float *g = s->gain ? l->param[0]->data : NULL;
  const float *b = s->bias ? l->param[1]->data : NULL;
  float *y = l->top[0]->data, *xhat = l->buffer[B_XHAT]->data, *rstd = l->buffer[B_RSTD]->data;
  const double eps = s->eps;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (M * K > 32768)
  for (int64_t m = 0; m < M; m++) {
    const float *xr = x + m * K;
    /* omp simd: the sums run in vector lanes that are added at the end, in an order fixed by
     * the build, not by the thread count (a row is one thread's). */
    double sum = 0, sq = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < K; k++) sum += xr[k];
    const double mean = sum / (double)K;
#pragma omp simd reduction(+ : sq)
    for (int64_t k = 0; k < K; k++) {
      double d = xr[k] - mean;
      sq += d * d;
    }
    const double r = 1.0 / sqrt(sq / (double)K + eps);
    rstd[m] = (float)r;
    float *hr = xhat + m * K, *yr = y + m * K; /* yr may be xr (in place): read before written */
    for (int64_t k = 0; k < K; k++) {
      const float h = (float)((xr[k] - mean) * r);
      hr[k] = h;
      yr[k] = g ? (b ? h * g[k] + b[k] : h * g[k]) : h;
    }
  }
  return KILN_OK;
}

/* With dh = dy * gain: dx = rstd (dh - mean(dh) - x_hat mean(dh x_hat)) per sample;
 * dgain += sum over samples of dy x_hat, dbias += sum of dy. The parameter gradients are taken
 * first, since in place dx overwrites dy; each of their elements adds the samples in order on
 * one thread, whatever the thread count. */
static int ln_backward(kiln_layer *l) {
  ln_state *s = l->priv;
  const int64_t M = s->M, K = s->K;
  const float *dy = l->top[0]->diff, *xhat = l->buffer[B_XHAT]->data;
  const float *rstd = l->buffer[B_RSTD]->data;
  if (s->gain) {
    enum { W = 64 };
    float *dg = l->param[0]->diff, *db = s->bias ? l->param[1]->diff : NULL;
    const int64_t nblk = (K + W - 1) / W;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (M * K > 32768)
    for (int64_t cb = 0; cb < nblk; cb++) {
      const int64_t k0 = cb * W, w = K - k0 < W ? K - k0 : W;
      double ag[W] = {0}, ab[W] = {0};
      for (int64_t m = 0; m < M; m++) {
        const float *dr = dy + m * K + k0, *hr = xhat + m * K + k0;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) {
          ag[j] += (double)dr[j] * hr[j];
          ab[j] += dr[j];
        }
      }
      for (int64_t j = 0; j < w; j++) {
        dg[k0 + j] += (float)ag[j];
        if (db) db[k0 + j] += (float)ab[j];
      }
    }
  }
  if (!l->propagate_down[0]) return KILN_OK;
  const float *g = s->gain ? l->param[0]->data : NULL;
  float *dx = l->bottom[0]->diff;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (M * K > 32768)
  for (int64_t m = 0; m < M; m++) {
    const float *dr = dy + m * K, *hr = xhat + m * K;
    double a = 0, c = 0;
#pragma omp simd reduction(+ : a, c)
    for (int64_t k = 0; k < K; k++) {
      const double dh = g ? (double)dr[k] * g[k] : dr[k];
      a += dh;
      c += dh * hr[k];
    }
    a /= (double)K;
    c /= (double)K;
    const float r = rstd[m], fa = (float)a, fc = (float)c;
    float *xr = dx + m * K; /* may be dr (in place): each element read before written */
    for (int64_t k = 0; k < K; k++) {
      const float dh = g ? dr[k] * g[k] : dr[k];
      xr[k] = r * (dh - fa - hr[k] * fc);
    }
  }
  return KILN_OK;
}

static void ln_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_layer_norm = {
    .type = "LayerNorm", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = ln_setup, .reshape = ln_reshape, .forward = ln_forward, .backward = ln_backward,
    .destroy = ln_destroy,
};
