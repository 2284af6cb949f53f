/* The norm family's kernels besides BatchNorm's (batch_norm.c), include/kiln/backend.h's
 * KILN_OPS_NORM: Scale and Bias (a per-channel, or per-(axes), affine broadcast over the other
 * axes), LayerNorm, LRN, MVN and Reduction. Every sum is in double in an order fixed by the
 * sizes: a row, a channel or a window is one thread's, so results do not depend on the thread
 * count. */
#include <math.h>
#include <string.h>

#include "ops/kernels.h"
#include "ops/norm_sums.h"

/* LRN's window sums go parallel from this many values: each costs a window's worth of work. */
#define LRN_PARALLEL_FROM 8192

/* ---- Scale ---------------------------------------------------------------------------------- */

int kiln_ref_scale_fwd(const kiln_op_ctx *c, float *y, float *keep, const float *x,
                       const float *gamma, const float *beta, int64_t outer, int64_t dim,
                       int64_t inner, int block) {
  const float *g = gamma, *b = beta;
  const int64_t rows = outer * dim, count = rows * inner;
  if (block == 16) { /* 16 channels of one image at a time */
    const int64_t CB = dim / 16, S = inner, blocks = outer * CB;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
    for (int64_t r = 0; r < blocks; r++) {
      const int64_t cb = r % CB, off = r * S * 16;
      float gk[16], bk[16];
      for (int k = 0; k < 16; k++) gk[k] = g[cb * 16 + k], bk[k] = b ? b[cb * 16 + k] : 0.0f;
      if (keep) memcpy(keep + off, x + off, sizeof(float) * (size_t)(S * 16));
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) y[off + i * 16 + k] = x[off + i * 16 + k] * gk[k] + bk[k];
    }
    return KILN_OK;
  }
  if (block != 0) return kiln_errorf(KILN_ERR_INVALID, "scale: channel block %d (0 or 16)", block);
  /* Row by row (one channel of one image each), threaded when the blob is big. */
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t d = r % dim, off = r * inner;
    const float gd = g[d], bd = b ? b[d] : 0.0f;
    if (keep) memcpy(keep + off, x + off, sizeof(float) * (size_t)inner);
#pragma omp simd
    for (int64_t i = 0; i < inner; i++) y[off + i] = x[off + i] * gd + bd;
  }
  return KILN_OK;
}

/* gamma and beta gradients are taken before the input's, which in place overwrites dy. */
int kiln_ref_scale_bwd(const kiln_op_ctx *c, float *dx, float *dgamma, float *dbeta,
                       const float *dy, const float *x, const float *gamma, int64_t outer,
                       int64_t dim, int64_t inner, int block, bool accumulate) {
  float *dg = dgamma, *db = dbeta;
  const int64_t stride = dim * inner;
  if (block == 16) {
    const int64_t CB = dim / 16, S = inner;
    if (dg || db)
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (outer * stride > KILN_PARALLEL_FROM)
      for (int64_t cb = 0; cb < CB; cb++) {
        double sg[16], sb[16];
        if (dg && db) kiln_block16_sum_dot(sb, sg, dy, x, outer, CB, cb, S);
        if (dg) {
          if (!db) kiln_block16_sums(sg, dy, x, outer, CB, cb, S);
          for (int k = 0; k < 16; k++)
            dg[cb * 16 + k] = (accumulate ? dg[cb * 16 + k] : 0.0f) + (float)sg[k];
        }
        if (db) {
          if (!dg) kiln_block16_sums(sb, dy, NULL, outer, CB, cb, S);
          for (int k = 0; k < 16; k++) db[cb * 16 + k] += (float)sb[k];
        }
      }
    if (dx) {
      const float *g = gamma;
      const int64_t blocks = outer * CB;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (blocks * S * 16 > KILN_PARALLEL_FROM)
      for (int64_t r = 0; r < blocks; r++) {
        const int64_t cb = r % CB, off = r * S * 16;
        float gk[16];
        for (int k = 0; k < 16; k++) gk[k] = g[cb * 16 + k];
        for (int64_t i = 0; i < S; i++)
#pragma omp simd
          for (int k = 0; k < 16; k++) dx[off + i * 16 + k] = dy[off + i * 16 + k] * gk[k];
      }
    }
    return KILN_OK;
  }
  if (block != 0) return kiln_errorf(KILN_ERR_INVALID, "scale: channel block %d (0 or 16)", block);
  if (dg || db)
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (outer * stride > KILN_PARALLEL_FROM)
    for (int64_t d = 0; d < dim; d++) {
      const float *dyd = dy + d * inner, *xd = x + d * inner;
      if (dg) {
        float sg = (float)kiln_plane_dot(dyd, xd, outer, stride, inner);
        dg[d] = (accumulate ? dg[d] : 0.0f) + sg;
      }
      if (db) db[d] += (float)kiln_plane_sum(dyd, outer, stride, inner);
    }
  if (dx) {
    const float *g = gamma;
    const int64_t rows = outer * dim;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * inner > KILN_PARALLEL_FROM)
    for (int64_t r = 0; r < rows; r++) {
      const int64_t off = r * inner;
      const float gd = g[r % dim];
#pragma omp simd
      for (int64_t i = 0; i < inner; i++) dx[off + i] = dy[off + i] * gd;
    }
  }
  return KILN_OK;
}

/* ---- Bias ----------------------------------------------------------------------------------- */

int kiln_ref_bias_fwd(const kiln_op_ctx *c, float *y, const float *x, const float *b,
                      int64_t outer, int64_t dim, int64_t inner) {
  (void)c;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t d = 0; d < dim; d++) {
      int64_t off = (o * dim + d) * inner;
      float bd = b[d];
      for (int64_t i = 0; i < inner; i++) y[off + i] = x[off + i] + bd;
    }
  return KILN_OK;
}

int kiln_ref_bias_bwd(const kiln_op_ctx *c, float *db, const float *dy, int64_t outer,
                      int64_t dim, int64_t inner, bool accumulate) {
  (void)c;
  for (int64_t d = 0; d < dim; d++) {
    double sum = 0;
    for (int64_t o = 0; o < outer; o++) {
      const float *g = dy + (o * dim + d) * inner;
      for (int64_t i = 0; i < inner; i++) sum += g[i];
    }
    db[d] = (accumulate ? db[d] : 0.0f) + (float)sum;
  }
  return KILN_OK;
}

/* ---- LayerNorm ------------------------------------------------------------------------------ */

int kiln_ref_layer_norm_fwd(const kiln_op_ctx *c, float *y, float *xhat, float *rstd,
                            const float *x, const float *gain, const float *bias, int64_t M,
                            int64_t K, float eps_f) {
  const float *g = gain, *b = bias;
  const double eps = eps_f;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (M * K > KILN_PARALLEL_FROM)
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

/* The parameter gradients first, since in place dx overwrites dy; each of their elements adds
 * the rows in order on one thread, whatever the thread count. */
int kiln_ref_layer_norm_bwd(const kiln_op_ctx *c, float *dx, float *dgain, float *dbias,
                            const float *dy, const float *xhat, const float *rstd,
                            const float *gain, int64_t M, int64_t K) {
  if (dgain) {
    enum { W = 64 };
    float *dg = dgain, *db = dbias;
    const int64_t nblk = (K + W - 1) / W;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (M * K > KILN_PARALLEL_FROM)
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
  if (!dx) return KILN_OK;
  const float *g = gain;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (M * K > KILN_PARALLEL_FROM)
  for (int64_t m = 0; m < M; m++) {
    const float *dr = dy + m * K, *hr = xhat + m * K;
    double a = 0, cs = 0;
#pragma omp simd reduction(+ : a, cs)
    for (int64_t k = 0; k < K; k++) {
      const double dh = g ? (double)dr[k] * g[k] : dr[k];
      a += dh;
      cs += dh * hr[k];
    }
    a /= (double)K;
    cs /= (double)K;
    const float r = rstd[m], fa = (float)a, fc = (float)cs;
    float *xr = dx + m * K; /* may be dr (in place): each element read before written */
    for (int64_t k = 0; k < K; k++) {
      const float dh = g ? dr[k] * g[k] : dr[k];
      xr[k] = r * (dh - fa - hr[k] * fc);
    }
  }
  return KILN_OK;
}

/* ---- LRN ------------------------------------------------------------------------------------ */

typedef struct {
  int64_t C, H, W, half;
  bool across;
} lrn_window;

/* Sum of v over the window around (c, h, w) of one C x H x W image, squared first if `square`. */
static inline double window_sum(const float *v, const lrn_window *d, int64_t c, int64_t h,
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

/* The scale of every value first, then the output: y may be x. */
int kiln_ref_lrn_fwd(const kiln_op_ctx *c, float *y, float *scale, const float *x, int64_t N,
                     int64_t C, int64_t H, int64_t W, int64_t size, bool across,
                     float alpha_over_n, float beta, float k) {
  const lrn_window d = {.C = C, .H = H, .W = W, .half = (size - 1) / 2, .across = across};
  const int64_t chw = C * H * W, rows = N * C;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * H * W > LRN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    int64_t n = r / C, ch = r % C;
    const float *img = x + n * chw;
    float *s = scale + r * H * W;
    for (int64_t h = 0; h < H; h++)
      for (int64_t w = 0; w < W; w++)
        s[h * W + w] = k + alpha_over_n * (float)window_sum(img, &d, ch, h, w, true);
  }
  const int64_t count = N * chw;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < count; i++) y[i] = x[i] * powf(scale[i], -beta);
  return KILN_OK;
}

/* Image by image: s^-beta and dy x s^(-beta-1) of the whole image into ws first, so that dx may
 * overwrite dy. dx_j sums over the windows containing j, which (windows being symmetric) is the
 * window around j. */
int kiln_ref_lrn_bwd(const kiln_op_ctx *c, float *dx, float *ws, const float *dy, const float *x,
                     const float *scale, int64_t N, int64_t C, int64_t H, int64_t W,
                     int64_t size, bool across, float alpha_over_n, float beta) {
  const lrn_window d = {.C = C, .H = H, .W = W, .half = (size - 1) / 2, .across = across};
  const int64_t chw = C * H * W;
  float *pw = ws, *ratio = ws + chw; /* s^-beta; dy x s^(-beta-1) */
  const float coef = 2.0f * alpha_over_n * beta;
  for (int64_t n = 0; n < N; n++) {
    int64_t off = n * chw;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (chw > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < chw; i++) {
      pw[i] = powf(scale[off + i], -beta);
      ratio[i] = dy[off + i] * x[off + i] * pw[i] / scale[off + i];
    }
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (chw > LRN_PARALLEL_FROM)
    for (int64_t ch = 0; ch < C; ch++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
          int64_t j = (ch * H + h) * W + w;
          float acc = (float)window_sum(ratio, &d, ch, h, w, false);
          dx[off + j] = dy[off + j] * pw[j] - coef * x[off + j] * acc;
        }
  }
  return KILN_OK;
}

/* ---- MVN ------------------------------------------------------------------------------------ */

int kiln_ref_mvn_fwd(const kiln_op_ctx *c, float *y, float *sd, const float *x, int64_t rows,
                     int64_t dim, bool normalize, float eps) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * dim > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    const float *v = x + r * dim;
    float *o = y + r * dim;
    double sum = 0;
    for (int64_t i = 0; i < dim; i++) sum += v[i];
    const float mean = (float)(sum / (double)dim);
    for (int64_t i = 0; i < dim; i++) o[i] = v[i] - mean;
    sd[r] = 1;
    if (!normalize) continue;
    double sq = 0;
    for (int64_t i = 0; i < dim; i++) sq += (double)o[i] * o[i];
    sd[r] = sqrtf((float)(sq / (double)dim)) + eps;
    for (int64_t i = 0; i < dim; i++) o[i] /= sd[r];
  }
  return KILN_OK;
}

int kiln_ref_mvn_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *y,
                     const float *sd, int64_t rows, int64_t dim, bool normalize) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * dim > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    const float *o = y + r * dim, *g = dy + r * dim;
    float *d = dx + r * dim;
    double sg = 0, syg = 0;
    for (int64_t i = 0; i < dim; i++) {
      sg += g[i];
      syg += (double)o[i] * g[i];
    }
    const float mg = (float)(sg / (double)dim), myg = (float)(syg / (double)dim);
    if (normalize)
      for (int64_t i = 0; i < dim; i++) d[i] = (g[i] - mg - o[i] * myg) / sd[r];
    else
      for (int64_t i = 0; i < dim; i++) d[i] = g[i] - mg;
  }
  return KILN_OK;
}

/* ---- Reduction ------------------------------------------------------------------------------ */

int kiln_ref_reduction_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t num,
                           int64_t dim, kiln_reduce_kind kind, float coeff) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (num * dim > KILN_PARALLEL_FROM)
  for (int64_t n = 0; n < num; n++) {
    const float *v = x + n * dim;
    double t = 0;
    switch (kind) {
      case KILN_REDUCE_ASUM:
        for (int64_t i = 0; i < dim; i++) t += fabsf(v[i]);
        break;
      case KILN_REDUCE_SUMSQ:
        for (int64_t i = 0; i < dim; i++) t += (double)v[i] * v[i];
        break;
      default: /* SUM */
        for (int64_t i = 0; i < dim; i++) t += v[i];
        break;
    }
    y[n] = (float)(t * coeff);
  }
  return KILN_OK;
}

int kiln_ref_reduction_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                           int64_t num, int64_t dim, kiln_reduce_kind kind, float coeff) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (num * dim > KILN_PARALLEL_FROM)
  for (int64_t n = 0; n < num; n++) {
    const float g = dy[n] * coeff;
    const float *v = x + n * dim;
    float *d = dx + n * dim;
    switch (kind) {
      case KILN_REDUCE_ASUM:
        for (int64_t i = 0; i < dim; i++) d[i] = (float)((v[i] > 0) - (v[i] < 0)) * g;
        break;
      case KILN_REDUCE_SUMSQ:
        for (int64_t i = 0; i < dim; i++) d[i] = 2 * v[i] * g;
        break;
      default:
        for (int64_t i = 0; i < dim; i++) d[i] = g;
        break;
    }
  }
  return KILN_OK;
}
