/* BatchNorm (Caffe's): normalises each channel of an (N, C) or (N, C, ...) input to zero mean and
 * unit variance. No learnable scale or shift (a Scale layer with bias_term follows it in Caffe
 * nets). Three blobs hold running statistics that the solver never touches: the decayed sums of
 * the batch means and of the (unbiased) batch variances, and the decayed count they are divided
 * by. With use_global_stats (default in TEST) those stored statistics are used instead of the
 * batch's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__BatchNormParameter bn_defaults = CAFFE__BATCH_NORM_PARAMETER__INIT;

typedef struct {
  bool global;    /* normalise with the stored statistics */
  float maf, eps; /* moving_average_fraction, eps */
  int64_t N, C, S; /* batch, channels, spatial (everything after the channel axis) */
  /* Blocked layout: per-channel sums in double over chunks of BN_CHUNK images (2 per chunk and
   * channel), and two per-channel floats (shift and scale), sized at reshape; after those, the
   * plain layout's batch means as forward used them (for bn_recompute). */
  double *part;
  float *chan;
  int64_t part_cap, chan_cap;
  /* Fusion (bn_fuse): the gamma and beta of the Scale working in place on this layer's top,
   * which this layer applies, and the slope of the ReLU after it (1: none). gamma NULL: not
   * fused. */
  kiln_blob *gamma, *beta;
  float slope;
} bn_state;

/* Fused, one normalised value v through Scale (gamma g, beta b) and ReLU: the expression Scale
 * and ReLU compute on their own, so the output has the same bits. */
static inline float fused_out(float v, float g, float b, float slope) {
  const float z = v * g + b;
  return z > 0 ? z : slope * z;
}

/* Fused backward: the gradient reaching Scale's output, from ReLU's dy. The sign of Scale's
 * output is recomputed from v (the same expression as forward, so the same mask) instead of read
 * from the top: one stream less over memory. */
static inline float fused_dz(float v, float g, float b, float slope, float dy) {
  return v * g + b > 0 ? dy : slope * dy;
}

/* Images per partial sum in the blocked layout. The work goes to threads by (channel block,
 * chunk of images), so a layer with one 16-channel block (resnet20's first stage) uses every
 * thread; a fixed chunk keeps the order of the additions, hence the bits, independent of the
 * thread count. */
#define BN_CHUNK 8

/* Buffers: 0 = the normalised output, kept apart from the top so that an in-place layer after
 * this one (or this one in place) cannot spoil backward; 1 = per channel 1/sqrt(var + eps). */
enum { BN_XNORM, BN_INVSTD };

static int bn_setup(kiln_layer *l) {
  const Caffe__BatchNormParameter *p = KILN_PARAM_OR(l->lp->batch_norm_param, bn_defaults);
  const kiln_blob *x = l->bottom[0];
  if (x->naxes < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must have at least one axis (N, C, ...)");
  if (!(p->eps >= 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "batch_norm_param.eps %g must be >= 0", p->eps);
  if (!(p->moving_average_fraction >= 0 && p->moving_average_fraction <= 1))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "batch_norm_param.moving_average_fraction %g is not in [0, 1]",
                            p->moving_average_fraction);
  bn_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->global = p->has_use_global_stats ? p->use_global_stats : l->phase == CAFFE__PHASE__TEST;
  s->maf = p->moving_average_fraction;
  s->eps = p->eps;
  s->C = x->naxes == 1 ? 1 : x->shape[1];
  int64_t cshape[1] = {s->C}, one[1] = {1};
  if (!kiln_layer_add_param(l, 1, cshape, NULL, 0) || !kiln_layer_add_param(l, 1, cshape, NULL, 0) ||
      !kiln_layer_add_param(l, 1, one, NULL, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < 3; i++) l->param_frozen[i] = true;
  if (!kiln_layer_add_buffer(l, "x_norm") || !kiln_layer_add_buffer(l, "inv_std"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int bn_reshape(kiln_layer *l) {
  bn_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  int64_t C = x->naxes == 1 ? 1 : x->shape[1];
  if (C != s->C) {
    char buf[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "input %s has %lld channels, the statistics were made for %lld",
                            kiln_blob_shape_string(x, buf, sizeof buf), (long long)C,
                            (long long)s->C);
  }
  s->N = x->shape[0];
  s->S = kiln_count(x, 2, x->naxes);
  const int64_t nchunks = (s->N + BN_CHUNK - 1) / BN_CHUNK;
  /* partial sums (2 x 16 per chunk and block), then the blocks' means (16 each) */
  const int64_t blocks = (s->C + 15) / 16, part = blocks * nchunks * 32 + blocks * 16;
  const int64_t chan = 3 * s->C; /* backward's two per-channel means; forward's batch means */
  if (part > s->part_cap) {
    double *p = realloc(s->part, sizeof(double) * (size_t)part);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->part = p;
    s->part_cap = part;
  }
  if (chan > s->chan_cap) {
    float *p = realloc(s->chan, sizeof(float) * (size_t)chan);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->chan = p;
    s->chan_cap = chan;
  }
  int64_t cshape[1] = {s->C};
  KILN_TRY(kiln_blob_reshape_like(l->buffer[BN_XNORM], x));
  KILN_TRY(kiln_blob_reshape(l->buffer[BN_INVSTD], 1, cshape));
  l->flops = 6.0 * (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

/* (x - mean)^2 summed over one channel's planes, as kiln_plane_sum does. */
static double plane_sq(const float *x, double mean, int64_t N, int64_t stride, int64_t S) {
  double acc[KILN_SUM_LANES] = {0};
  for (int64_t n = 0; n < N; n++) {
    const float *p = x + n * stride;
    int64_t i = 0;
    for (; i + KILN_SUM_LANES <= S; i += KILN_SUM_LANES)
      for (int k = 0; k < KILN_SUM_LANES; k++) {
        double d = p[i + k] - mean;
        acc[k] += d * d;
      }
    for (; i < S; i++) {
      double d = p[i] - mean;
      acc[i % KILN_SUM_LANES] += d * d;
    }
  }
  double t = 0;
  for (int k = 0; k < KILN_SUM_LANES; k++) t += acc[k];
  return t;
}

/* The same statistics and normalisation over oneDNN's nChw16c layout: 16 channels at a time,
 * one per vector lane. */
/* Sums over images [n0, n1) of one 16-channel block, lane by lane in double: of a, of a * b
 * (b non-NULL), or of (a - mean)^2 (mean non-NULL). */
static void block16_chunk_sums(double *sum, double *dot, const float *a, const float *b,
                               const double *mean, int64_t n0, int64_t n1, int64_t CB,
                               int64_t cb, int64_t S) {
  double as[16] = {0}, ad[16] = {0}, a2[16] = {0}; /* a2: odd cells, a second chain of adds */
  for (int64_t n = n0; n < n1; n++) {
    const int64_t off = (n * CB + cb) * S * 16;
    const float *pa = a + off;
    if (mean) {
      int64_t i = 0;
      for (; i + 2 <= S; i += 2)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          const double d = pa[i * 16 + k] - mean[k], e = pa[i * 16 + 16 + k] - mean[k];
          as[k] += d * d;
          a2[k] += e * e;
        }
      for (; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          const double d = pa[i * 16 + k] - mean[k];
          as[k] += d * d;
        }
    } else if (b) {
      const float *pb = b + off;
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          as[k] += pa[i * 16 + k];
          ad[k] += (double)pa[i * 16 + k] * pb[i * 16 + k];
        }
    } else {
      int64_t i = 0;
      for (; i + 2 <= S; i += 2)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          as[k] += pa[i * 16 + k];
          a2[k] += pa[i * 16 + 16 + k];
        }
      for (; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) as[k] += pa[i * 16 + k];
    }
  }
  for (int k = 0; k < 16; k++) sum[k] = as[k] + a2[k];
  if (dot)
    for (int k = 0; k < 16; k++) dot[k] = ad[k];
}

/* The chunks' partial sums of block cb added in chunk order. */
static void block16_combine(double out[16], const double *part, int64_t cb, int64_t nchunks,
                            int64_t which) {
  for (int k = 0; k < 16; k++) out[k] = 0.0;
  for (int64_t ch = 0; ch < nchunks; ch++) {
    const double *p = part + ((cb * nchunks + ch) * 2 + which) * 16;
    for (int k = 0; k < 16; k++) out[k] += p[k];
  }
}

static void bn_forward_blocked(kiln_layer *l, bn_state *s) {
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  float *xn = l->buffer[BN_XNORM]->data, *inv = l->buffer[BN_INVSTD]->data;
  float *mean_sum = l->param[0]->data, *var_sum = l->param[1]->data, *factor = l->param[2]->data;
  const int64_t N = s->N, CB = s->C / 16, S = s->S, m = N * S;
  const int64_t nchunks = (N + BN_CHUNK - 1) / BN_CHUNK, items = CB * nchunks;
  const bool big = N * s->C * S > 32768;
  float *mf = s->chan;
  if (s->global) {
    const float f = factor[0] == 0 ? 0.0f : 1.0f / factor[0];
    for (int64_t c = 0; c < s->C; c++) {
      mf[c] = f * mean_sum[c];
      inv[c] = 1.0f / sqrtf(f * var_sum[c] + s->eps);
    }
  } else {
    double *part = s->part;
    const double correction = m > 1 ? (double)m / (double)(m - 1) : 1.0;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
    for (int64_t t = 0; t < items; t++) {
      const int64_t cb = t / nchunks, n0 = (t % nchunks) * BN_CHUNK;
      block16_chunk_sums(part + t * 32, NULL, x, NULL, NULL, n0,
                         n0 + BN_CHUNK < N ? n0 + BN_CHUNK : N, CB, cb, S);
    }
    double *mean = part + items * 32; /* after the partial sums: CB * 16 more doubles */
    for (int64_t cb = 0; cb < CB; cb++) {
      block16_combine(mean + cb * 16, part, cb, nchunks, 0);
      for (int k = 0; k < 16; k++) mean[cb * 16 + k] = m ? mean[cb * 16 + k] / (double)m : 0.0;
    }
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
    for (int64_t t = 0; t < items; t++) {
      const int64_t cb = t / nchunks, n0 = (t % nchunks) * BN_CHUNK;
      block16_chunk_sums(part + t * 32 + 16, NULL, x, NULL, mean + cb * 16, n0,
                         n0 + BN_CHUNK < N ? n0 + BN_CHUNK : N, CB, cb, S);
    }
    for (int64_t cb = 0; cb < CB; cb++) {
      double sq[16];
      block16_combine(sq, part, cb, nchunks, 1);
      for (int k = 0; k < 16; k++) {
        const int64_t c = cb * 16 + k;
        const double var = m ? sq[k] / (double)m : 0.0; /* biased, as Caffe normalises with */
        mf[c] = (float)mean[c];
        inv[c] = (float)(1.0 / sqrt(var + s->eps));
        mean_sum[c] = s->maf * mean_sum[c] + (float)mean[c];
        var_sum[c] = s->maf * var_sum[c] + (float)(correction * var);
      }
    }
    factor[0] = s->maf * factor[0] + 1.0f;
  }
  const float *gam = s->gamma ? s->gamma->data : NULL;
  const float *bet = s->gamma ? s->beta->data : NULL;
  const float slope = s->slope;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
  for (int64_t t = 0; t < CB * N; t++) {
    const int64_t cb = t % CB, off = t * S * 16; /* image t / CB, block cb */
    const float *mk = mf + cb * 16, *is = inv + cb * 16;
    if (gam) {
      const float *gk = gam + cb * 16, *bk = bet + cb * 16;
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          const int64_t e = off + i * 16 + k;
          const float v = (x[e] - mk[k]) * is[k];
          xn[e] = v;
          y[e] = fused_out(v, gk[k], bk[k], slope);
        }
      continue;
    }
    for (int64_t i = 0; i < S; i++)
#pragma omp simd
      for (int k = 0; k < 16; k++) {
        const int64_t e = off + i * 16 + k;
        y[e] = xn[e] = (x[e] - mk[k]) * is[k];
      }
  }
}

/* One channel's planes of the plain layout: the normalised values kept in xn, the output in y
 * (through the fused Scale and ReLU when gam is set). */
static void plain_normalise(float *y, float *xn, const float *x, float mean, float is,
                            const float *gam, const float *bet, float slope, int64_t c,
                            int64_t N, int64_t C, int64_t S) {
  for (int64_t n = 0; n < N; n++) {
    const int64_t o = (n * C + c) * S;
    if (gam) {
      const float g = gam[c], b = bet[c];
#pragma omp simd
      for (int64_t i = 0; i < S; i++) {
        const float v = (x[o + i] - mean) * is;
        xn[o + i] = v;
        y[o + i] = fused_out(v, g, b, slope);
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < S; i++) y[o + i] = xn[o + i] = (x[o + i] - mean) * is;
    }
  }
}

static int bn_forward(kiln_layer *l) {
  bn_state *s = l->priv;
  if (l->bottom[0]->layout == KILN_LAYOUT_BLOCKED16) {
    bn_forward_blocked(l, s);
    return KILN_OK;
  }
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data, *xn = l->buffer[BN_XNORM]->data, *inv = l->buffer[BN_INVSTD]->data;
  float *mean_sum = l->param[0]->data, *var_sum = l->param[1]->data, *factor = l->param[2]->data;
  const int64_t N = s->N, C = s->C, S = s->S, m = N * S;
  const float *gam = s->gamma ? s->gamma->data : NULL;
  const float *bet = s->gamma ? s->beta->data : NULL;
  if (s->global) {
    float f = factor[0] == 0 ? 0.0f : 1.0f / factor[0];
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (N * C * S > 32768)
    for (int64_t c = 0; c < C; c++) {
      float mean = f * mean_sum[c], var = f * var_sum[c];
      float is = 1.0f / sqrtf(var + s->eps);
      inv[c] = is;
      plain_normalise(y, xn, x, mean, is, gam, bet, s->slope, c, N, C, S);
    }
  } else {
    /* The stored sums change below but the output does not depend on them: repeated forwards
     * on the same input give the same output. */
    double correction = m > 1 ? (double)m / (double)(m - 1) : 1.0;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (N * C * S > 32768)
    for (int64_t c = 0; c < C; c++) {
      double mean = m ? kiln_plane_sum(x + c * S, N, C * S, S) / (double)m : 0.0;
      double sq = plane_sq(x + c * S, mean, N, C * S, S);
      double var = m ? sq / (double)m : 0.0; /* biased, as Caffe normalises with */
      float is = (float)(1.0 / sqrt(var + s->eps)), mf = (float)mean;
      inv[c] = is;
      s->chan[2 * C + c] = mf;
      plain_normalise(y, xn, x, mf, is, gam, bet, s->slope, c, N, C, S);
      mean_sum[c] = s->maf * mean_sum[c] + (float)mean;
      var_sum[c] = s->maf * var_sum[c] + (float)(correction * var);
    }
    factor[0] = s->maf * factor[0] + 1.0f;
  }
  return KILN_OK;
}

/* Batch statistics: dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(var + eps), means over the
 * batch and spatial axes of each channel. Stored statistics: dx = dy / sqrt(var + eps). The
 * statistics blobs get no gradient. */
/* Fused backward, blocked layout. Pass 1 (by 16-channel block and chunk of images, summed in
 * chunk order): per channel, the sums of dz (Scale's output gradient after ReLU's mask) and of
 * dz * x_norm, which are beta's and gamma's gradients; BatchNorm's own means of dy * gamma
 * follow from them. Pass 2: dx. Two passes over (dy, x_norm) where BatchNorm, Scale and ReLU
 * apart make six over larger sets of streams. */
static void bn_backward_fused_blocked(kiln_layer *l, bn_state *s, const float *gam,
                                      const float *bet, float *dgam, float *dbet) {
  const float *dy = l->top[0]->diff, *xn = l->buffer[BN_XNORM]->data;
  const float *inv = l->buffer[BN_INVSTD]->data;
  const int64_t N = s->N, C = s->C, CB = C / 16, S = s->S, m = N * S;
  const int64_t nchunks = (N + BN_CHUNK - 1) / BN_CHUNK, items = CB * nchunks;
  const bool big = N * C * S > 32768;
  const float slope = s->slope;
  double *part = s->part;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
  for (int64_t t = 0; t < items; t++) {
    const int64_t cb = t / nchunks, n0 = (t % nchunks) * BN_CHUNK;
    const int64_t n1 = n0 + BN_CHUNK < N ? n0 + BN_CHUNK : N;
    const float *gk = gam + cb * 16, *bk = bet + cb * 16;
    double sd[16] = {0}, sx[16] = {0};
    for (int64_t n = n0; n < n1; n++) {
      const int64_t off = (n * CB + cb) * S * 16;
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          const int64_t e = off + i * 16 + k;
          const float v = xn[e], d = fused_dz(v, gk[k], bk[k], slope, dy[e]);
          sd[k] += d;
          sx[k] += (double)d * v;
        }
    }
    for (int k = 0; k < 16; k++) part[t * 32 + k] = sd[k], part[t * 32 + 16 + k] = sx[k];
  }
  float *a = s->chan, *bq = s->chan + C; /* per channel: mean(dy * gamma), mean(dy * gamma * xn) */
  for (int64_t cb = 0; cb < CB; cb++) {
    double sd[16], sx[16];
    block16_combine(sd, part, cb, nchunks, 0);
    block16_combine(sx, part, cb, nchunks, 1);
    for (int k = 0; k < 16; k++) {
      const int64_t c = cb * 16 + k;
      dbet[c] += (float)sd[k];
      dgam[c] += (float)sx[k];
      const bool batch = !s->global && m;
      a[c] = batch ? (float)((double)gam[c] * sd[k] / (double)m) : 0.0f;
      bq[c] = batch ? (float)((double)gam[c] * sx[k] / (double)m) : 0.0f;
    }
  }
  if (!l->propagate_down[0]) return;
  float *dx = l->bottom[0]->diff; /* may be dy itself (in place): each element read, then written */
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
  for (int64_t t = 0; t < CB * N; t++) {
    const int64_t cb = t % CB, off = t * S * 16; /* image t / CB, block cb */
    const float *gk = gam + cb * 16, *bk = bet + cb * 16, *ak = a + cb * 16, *qk = bq + cb * 16;
    const float *is = inv + cb * 16;
    for (int64_t i = 0; i < S; i++)
#pragma omp simd
      for (int k = 0; k < 16; k++) {
        const int64_t e = off + i * 16 + k;
        const float v = xn[e], d = fused_dz(v, gk[k], bk[k], slope, dy[e]);
        dx[e] = (d * gk[k] - ak[k] - qk[k] * v) * is[k];
      }
  }
}

/* Fused backward, plain layout: the same two passes, channel by channel. */
static void bn_backward_fused_plain(kiln_layer *l, bn_state *s, const float *gam,
                                    const float *bet, float *dgam, float *dbet) {
  const float *dy = l->top[0]->diff, *xn = l->buffer[BN_XNORM]->data;
  const float *inv = l->buffer[BN_INVSTD]->data;
  float *dx = l->bottom[0]->diff;
  const int64_t N = s->N, C = s->C, S = s->S, m = N * S;
  const float slope = s->slope;
  const bool down = l->propagate_down[0];
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (N * C * S > 32768)
  for (int64_t c = 0; c < C; c++) {
    const float g = gam[c], b = bet[c], is = inv[c];
    double ad[KILN_SUM_LANES] = {0}, ax[KILN_SUM_LANES] = {0};
    for (int64_t n = 0; n < N; n++) {
      const float *pv = xn + (n * C + c) * S, *pd = dy + (n * C + c) * S;
      int64_t i = 0;
      for (; i + KILN_SUM_LANES <= S; i += KILN_SUM_LANES)
        for (int k = 0; k < KILN_SUM_LANES; k++) {
          const float d = fused_dz(pv[i + k], g, b, slope, pd[i + k]);
          ad[k] += d;
          ax[k] += (double)d * pv[i + k];
        }
      for (; i < S; i++) {
        const float d = fused_dz(pv[i], g, b, slope, pd[i]);
        ad[i % KILN_SUM_LANES] += d;
        ax[i % KILN_SUM_LANES] += (double)d * pv[i];
      }
    }
    double sd = 0, sx = 0;
    for (int k = 0; k < KILN_SUM_LANES; k++) sd += ad[k], sx += ax[k];
    dbet[c] += (float)sd;
    dgam[c] += (float)sx;
    if (!down) continue;
    const bool batch = !s->global && m;
    const float a = batch ? (float)((double)g * sd / (double)m) : 0.0f;
    const float q = batch ? (float)((double)g * sx / (double)m) : 0.0f;
    for (int64_t n = 0; n < N; n++) {
      const int64_t o = (n * C + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; i++) {
        const float v = xn[o + i], d = fused_dz(v, g, b, slope, dy[o + i]);
        dx[o + i] = (d * g - a - q * v) * is;
      }
    }
  }
}

static int bn_backward(kiln_layer *l) {
  bn_state *s = l->priv;
  if (s->gamma) { /* Scale's parameter gradients are wanted even without propagate_down */
    const float *gam = s->gamma->data, *bet = s->beta->data;
    float *dgam = s->gamma->diff, *dbet = s->beta->diff;
    if (l->bottom[0]->layout == KILN_LAYOUT_BLOCKED16)
      bn_backward_fused_blocked(l, s, gam, bet, dgam, dbet);
    else
      bn_backward_fused_plain(l, s, gam, bet, dgam, dbet);
    return KILN_OK;
  }
  if (!l->propagate_down[0]) return KILN_OK;
  const float *dy = l->top[0]->diff, *xn = l->buffer[BN_XNORM]->data;
  const float *inv = l->buffer[BN_INVSTD]->data;
  float *dx = l->bottom[0]->diff; /* may be dy itself (in place): each element read, then written */
  const int64_t N = s->N, C = s->C, S = s->S, m = N * S;
  if (l->bottom[0]->layout == KILN_LAYOUT_BLOCKED16) {
    const int64_t CB = C / 16, nchunks = (N + BN_CHUNK - 1) / BN_CHUNK, items = CB * nchunks;
    const bool big = N * C * S > 32768;
    float *a = s->chan, *bq = s->chan + C; /* per channel: mean(dy), mean(dy * y) */
    if (!s->global && m) {
      double *part = s->part;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
      for (int64_t t = 0; t < items; t++) {
        const int64_t cb = t / nchunks, n0 = (t % nchunks) * BN_CHUNK;
        block16_chunk_sums(part + t * 32, part + t * 32 + 16, dy, xn, NULL, n0,
                           n0 + BN_CHUNK < N ? n0 + BN_CHUNK : N, CB, cb, S);
      }
      for (int64_t cb = 0; cb < CB; cb++) {
        double sum_dy[16], sum_dy_y[16];
        block16_combine(sum_dy, part, cb, nchunks, 0);
        block16_combine(sum_dy_y, part, cb, nchunks, 1);
        for (int k = 0; k < 16; k++) {
          a[cb * 16 + k] = (float)(sum_dy[k] / (double)m);
          bq[cb * 16 + k] = (float)(sum_dy_y[k] / (double)m);
        }
      }
    } else {
      for (int64_t c = 0; c < C; c++) a[c] = bq[c] = 0.0f;
    }
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (big)
    for (int64_t t = 0; t < CB * N; t++) {
      const int64_t cb = t % CB, off = t * S * 16; /* image t / CB, block cb */
      const float *ak = a + cb * 16, *bk = bq + cb * 16, *is = inv + cb * 16;
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) {
          const int64_t e = off + i * 16 + k;
          dx[e] = (dy[e] - ak[k] - bk[k] * xn[e]) * is[k];
        }
    }
    return KILN_OK;
  }
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (N * C * S > 32768)
  for (int64_t c = 0; c < C; c++) {
    float is = inv[c];
    if (s->global) {
      for (int64_t n = 0; n < N; n++) {
        int64_t o = (n * C + c) * S;
#pragma omp simd
        for (int64_t i = 0; i < S; i++) dx[o + i] = dy[o + i] * is;
      }
      continue;
    }
    double sum_dy = kiln_plane_sum(dy + c * S, N, C * S, S);
    double sum_dy_y = kiln_plane_dot(dy + c * S, xn + c * S, N, C * S, S);
    float mean_dy = m ? (float)(sum_dy / (double)m) : 0.0f;
    float mean_dy_y = m ? (float)(sum_dy_y / (double)m) : 0.0f;
    for (int64_t n = 0; n < N; n++) {
      int64_t o = (n * C + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; i++) dx[o + i] = (dy[o + i] - mean_dy - mean_dy_y * xn[o + i]) * is;
    }
  }
  return KILN_OK;
}

static void bn_destroy(kiln_layer *l) {
  bn_state *s = l->priv;
  if (s) free(s->part), free(s->chan);
  free(l->priv);
}

/* Forward again on the same bottom, from the means and inverse deviations forward stored: the
 * same expressions on the same values, so the top and x_norm get the bits forward gave them. The
 * stored statistics are not touched. */
static int bn_recompute(kiln_layer *l) {
  bn_state *s = l->priv;
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data, *xn = l->buffer[BN_XNORM]->data;
  const float *inv = l->buffer[BN_INVSTD]->data, *mean = s->chan + 2 * s->C;
  const float *gam = s->gamma ? s->gamma->data : NULL;
  const float *bet = s->gamma ? s->beta->data : NULL;
  const int64_t N = s->N, C = s->C, S = s->S;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (N * C * S > 32768)
  for (int64_t c = 0; c < C; c++)
    plain_normalise(y, xn, x, mean[c], inv[c], gam, bet, s->slope, c, N, C, S);
  return KILN_OK;
}

/* Batch statistics in the plain layout, the top not the bottom (which recompute reads). */
static bool bn_recomputable(const kiln_layer *l) {
  const bn_state *s = l->priv;
  return !s->global && l->bottom[0] != l->top[0] && l->bottom[0]->layout != KILN_LAYOUT_BLOCKED16;
}

/* The top is a copy of x_norm, which only this layer's forward writes. */
static const kiln_blob *bn_kept_output(const kiln_layer *l) { return l->buffer[BN_XNORM]; }

/* Fusion: the Scale (learnable per-channel gamma with beta) working in place on this layer's
 * top, and the in-place ReLU after it when there is one, are done in this layer's passes: in
 * forward, one pass writes x_norm and the final output where three wrote and rewrote the top;
 * in backward, see bn_backward_fused_blocked. Not when a loss reads one of the tops in between
 * (the fused top holds only the last value). */
static int bn_fuse(kiln_layer *l, kiln_layer *const *next, int n) {
  bn_state *s = l->priv;
  const kiln_blob *y = l->top[0];
  kiln_absorb affine, relu;
  if (n < 1 || l->loss_weight[0] != 0 ||
      !kiln_layer_absorbable(next[0], KILN_ABSORB_CHANNEL_AFFINE, y, &affine))
    return 0;
  s->gamma = affine.gamma;
  s->beta = affine.beta;
  s->slope = 1.0f;
  if (n < 2 || !kiln_layer_absorbable(next[1], KILN_ABSORB_RELU, y, &relu)) return 1;
  s->slope = relu.slope;
  return 2;
}

/* 4-D inputs in either layout (per channel, 16 channels a vector in the blocked one). */
static int bn_layout_role(const kiln_layer *l) {
  return l->bottom[0]->naxes == 4 ? KILN_LAYOUT_ROLE_SAME : KILN_LAYOUT_ROLE_NONE;
}

const kiln_layer_ops kiln_layer_batch_norm = {
    .type = "BatchNorm", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = bn_setup, .reshape = bn_reshape, .forward = bn_forward, .backward = bn_backward,
    .destroy = bn_destroy, .layout_role = bn_layout_role, .kept_output = bn_kept_output,
    .fuse = bn_fuse, .recomputable = bn_recomputable, .recompute = bn_recompute,
    .backward_reads = kiln_reads_none, /* the normalised output and 1/std are buffers */
};
