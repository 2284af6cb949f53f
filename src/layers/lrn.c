/* LRN: local response normalisation, y = x s^-beta with s = k + alpha / n * (sum of x^2 over a
 * window around the element), Caffe's two regions:
 *   ACROSS_CHANNELS: the window is local_size channels centred on c (zero padded), n = local_size;
 *   WITHIN_CHANNEL: a local_size x local_size spatial square centred on (h, w), zero padded,
 *     n = local_size^2 and k = 1 whatever lrn_param says (Caffe builds this region from
 *     1 + alpha * AVE-pool(x^2) with pad (local_size - 1) / 2, whose divisor is always the full
 *     window, padding included).
 * Input N x C x H x W. The scale s is kept for the backward pass:
 *   dx_j = dy_j s_j^-beta - (2 alpha beta / n) x_j * sum over windows i containing j of
 *          dy_i x_i s_i^(-beta-1)
 * (windows are symmetric, so "windows containing j" is the window around j). Caffe writes
 * x_i s_i^(-beta-1) as y_i / s_i; kiln reads only the input and s, never the output, so a later
 * layer working in place on the output cannot corrupt this gradient. In place, the input is
 * copied aside in forward; the backward pass first gathers dy x s^(-beta-1) for the whole image
 * into the workspace, so overwriting dy with dx afterwards is safe. */
#include <math.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__LRNParameter lrn_defaults = CAFFE__LRNPARAMETER__INIT;

enum { LRN_SCALE, LRN_INPUT }; /* buffers */

typedef struct {
  int64_t N, C, H, W;
  int64_t size, half;
  bool across;
  float alpha_over_n, beta, k;
} lrn_dims;

static lrn_dims dims_of(const kiln_layer *l) {
  const Caffe__LRNParameter *p = KILN_PARAM_OR(l->lp->lrn_param, lrn_defaults);
  const kiln_blob *x = l->bottom[0];
  lrn_dims d = {.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                .size = p->local_size, .half = ((int64_t)p->local_size - 1) / 2,
                .across = p->norm_region == CAFFE__LRNPARAMETER__NORM_REGION__ACROSS_CHANNELS,
                .beta = p->beta};
  double n = d.across ? (double)d.size : (double)d.size * (double)d.size;
  d.alpha_over_n = (float)(p->alpha / n);
  d.k = d.across ? p->k : 1.0f;
  return d;
}

static int lrn_setup(kiln_layer *l) {
  const Caffe__LRNParameter *p = KILN_PARAM_OR(l->lp->lrn_param, lrn_defaults);
  if (p->local_size % 2 != 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "local_size %u must be odd (the window is centred on the element)",
                            p->local_size);
  if (p->norm_region != CAFFE__LRNPARAMETER__NORM_REGION__ACROSS_CHANNELS &&
      p->norm_region != CAFFE__LRNPARAMETER__NORM_REGION__WITHIN_CHANNEL)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "unknown norm_region %d", (int)p->norm_region);
  if (!kiln_layer_add_buffer(l, "scale")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int lrn_reshape(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4) {
    char buf[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %s must have 4 axes (N x C x H x W)",
                            kiln_blob_shape_string(x, buf, sizeof buf));
  }
  lrn_dims d = dims_of(l);
  int64_t window = d.across ? d.size : d.size * d.size;
  l->flops = (double)x->count * (double)(window + 4);
  l->workspace_floats = 2 * d.C * d.H * d.W; /* backward: s^-beta and the ratios, one image */
  KILN_TRY(kiln_blob_reshape_like(l->buffer[LRN_SCALE], x));
  if (l->nbuffer > LRN_INPUT) KILN_TRY(kiln_blob_reshape_like(l->buffer[LRN_INPUT], x));
  return kiln_blob_reshape_like(l->top[0], x);
}

/* Sum of v over the window around (c, h, w) of one C x H x W image, squared first if `square`. */
static inline double window_sum(const float *v, const lrn_dims *d, int64_t c, int64_t h,
                                int64_t w, bool square) {
  double s = 0;
  int64_t HW = d->H * d->W;
  if (d->across) {
    int64_t c0 = c - d->half < 0 ? 0 : c - d->half;
    int64_t c1 = c + d->half >= d->C ? d->C - 1 : c + d->half;
    for (int64_t cc = c0; cc <= c1; cc++) {
      float t = v[cc * HW + h * d->W + w];
      s += square ? (double)t * t : t;
    }
  } else {
    int64_t h0 = h - d->half < 0 ? 0 : h - d->half;
    int64_t h1 = h + d->half >= d->H ? d->H - 1 : h + d->half;
    int64_t w0 = w - d->half < 0 ? 0 : w - d->half;
    int64_t w1 = w + d->half >= d->W ? d->W - 1 : w + d->half;
    const float *plane = v + c * HW;
    for (int64_t hh = h0; hh <= h1; hh++)
      for (int64_t ww = w0; ww <= w1; ww++) {
        float t = plane[hh * d->W + ww];
        s += square ? (double)t * t : t;
      }
  }
  return s;
}

static int lrn_forward(kiln_layer *l) {
  lrn_dims d = dims_of(l);
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data, *scale = l->buffer[LRN_SCALE]->data;
  int64_t chw = d.C * d.H * d.W;
  if (l->nbuffer > LRN_INPUT) {
    memcpy(l->buffer[LRN_INPUT]->data, x, sizeof(float) * (size_t)l->bottom[0]->count);
    x = l->buffer[LRN_INPUT]->data; /* the top overwrites the bottom below */
  }
  int64_t rows = d.N * d.C;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (rows * d.H * d.W > 8192)
  for (int64_t r = 0; r < rows; r++) {
    int64_t n = r / d.C, c = r % d.C;
    const float *img = x + n * chw;
    float *s = scale + r * d.H * d.W;
    for (int64_t h = 0; h < d.H; h++)
      for (int64_t w = 0; w < d.W; w++)
        s[h * d.W + w] = d.k + d.alpha_over_n * (float)window_sum(img, &d, c, h, w, true);
  }
  int64_t count = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (count > 32768)
  for (int64_t i = 0; i < count; i++) y[i] = x[i] * powf(scale[i], -d.beta);
  return KILN_OK;
}

static int lrn_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  lrn_dims d = dims_of(l);
  const float *x = l->nbuffer > LRN_INPUT ? l->buffer[LRN_INPUT]->data : l->bottom[0]->data;
  const float *dy = l->top[0]->diff, *scale = l->buffer[LRN_SCALE]->data;
  float *dx = l->bottom[0]->diff;
  int64_t chw = d.C * d.H * d.W;
  float *pw = l->workspace, *ratio = l->workspace + chw; /* s^-beta; dy x s^(-beta-1) */
  float coef = 2.0f * d.alpha_over_n * d.beta;
  for (int64_t n = 0; n < d.N; n++) {
    int64_t off = n * chw;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (chw > 32768)
    for (int64_t i = 0; i < chw; i++) {
      pw[i] = powf(scale[off + i], -d.beta);
      ratio[i] = dy[off + i] * x[off + i] * pw[i] / scale[off + i];
    }
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (chw > 8192)
    for (int64_t c = 0; c < d.C; c++)
      for (int64_t h = 0; h < d.H; h++)
        for (int64_t w = 0; w < d.W; w++) {
          int64_t j = (c * d.H + h) * d.W + w;
          float acc = (float)window_sum(ratio, &d, c, h, w, false);
          dx[off + j] = dy[off + j] * pw[j] - coef * x[off + j] * acc;
        }
  }
  return KILN_OK;
}

/* The input, unless a buffer keeps a copy of it. */
static unsigned lrn_backward_reads(const kiln_layer *l) {
  return l->nbuffer > LRN_INPUT ? 0 : KILN_READS_BOTTOM(0);
}

const kiln_layer_ops kiln_layer_lrn = {
    .type = "LRN", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = lrn_setup, .reshape = lrn_reshape, .forward = lrn_forward, .backward = lrn_backward,
    .backward_reads = lrn_backward_reads,
};
