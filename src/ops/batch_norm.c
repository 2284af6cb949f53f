/* BatchNorm's kernels (include/kiln/backend.h, KILN_OPS_NORM): the batch statistics and the
 * running sums, the normalisation with the fused Scale and ReLU, its recomputation, and the
 * gradient, in the plain layout (channel by channel, one channel a thread) and in oneDNN's
 * nChw16c (16 channels at a time, one per vector lane, the work dealt to threads by channel
 * block and chunk of KILN_BN_CHUNK images). Every sum is in double, in an order fixed by the
 * sizes: the plain layout's in eight lanes (norm_sums.h), the blocked one's lane by lane and
 * chunk by chunk, the chunks added in order. */
#include <math.h>

#include "ops/kernels.h"
#include "ops/norm_sums.h"

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

static int bad_block(int block) {
  return kiln_errorf(KILN_ERR_INVALID, "batch norm: channel block %d (0 or 16)", block);
}

/* The scratch: partial sums (2 x 16 doubles per chunk and block), the blocks' means (16 doubles
 * each), then two floats a channel (kiln_batch_norm_scratch). */
static double *scratch_part(void *scratch) { return scratch; }
static float *scratch_chan(void *scratch, int64_t N, int64_t C) {
  const int64_t blocks = (C + 15) / 16, chunks = (N + KILN_BN_CHUNK - 1) / KILN_BN_CHUNK;
  return (float *)((double *)scratch + blocks * chunks * 32 + blocks * 16);
}

/* ---- the plain layout ----------------------------------------------------------------------- */

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

/* Channel by channel, each channel's statistics, normalisation and running sums on one thread.
 * With batch statistics the running sums change but the output does not depend on them:
 * repeated forwards on the same input give the same output. */
static void fwd_plain(const kiln_op_ctx *c, float *y, float *xn, float *mean, float *inv,
                      float *mean_sum, float *var_sum, float *factor, const float *x,
                      const float *gam, const float *bet, int64_t N, int64_t C, int64_t S,
                      bool global, float maf, float eps, float slope) {
  const int64_t m = N * S;
  if (global) {
    float f = factor[0] == 0 ? 0.0f : 1.0f / factor[0];
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * S > KILN_PARALLEL_FROM)
    for (int64_t ch = 0; ch < C; ch++) {
      float mu = f * mean_sum[ch], var = f * var_sum[ch];
      float is = 1.0f / sqrtf(var + eps);
      mean[ch] = mu;
      inv[ch] = is;
      plain_normalise(y, xn, x, mu, is, gam, bet, slope, ch, N, C, S);
    }
    return;
  }
  double correction = m > 1 ? (double)m / (double)(m - 1) : 1.0;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * S > KILN_PARALLEL_FROM)
  for (int64_t ch = 0; ch < C; ch++) {
    double mu = m ? kiln_plane_sum(x + ch * S, N, C * S, S) / (double)m : 0.0;
    double sq = plane_sq(x + ch * S, mu, N, C * S, S);
    double var = m ? sq / (double)m : 0.0; /* biased, as Caffe normalises with */
    float is = (float)(1.0 / sqrt(var + eps)), mf = (float)mu;
    inv[ch] = is;
    mean[ch] = mf;
    plain_normalise(y, xn, x, mf, is, gam, bet, slope, ch, N, C, S);
    mean_sum[ch] = maf * mean_sum[ch] + (float)mu;
    var_sum[ch] = maf * var_sum[ch] + (float)(correction * var);
  }
  factor[0] = maf * factor[0] + 1.0f;
}

static void apply_plain(const kiln_op_ctx *c, float *y, float *xn, const float *x,
                        const float *mean, const float *inv, const float *gam, const float *bet,
                        int64_t N, int64_t C, int64_t S, float slope) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * S > KILN_PARALLEL_FROM)
  for (int64_t ch = 0; ch < C; ch++)
    plain_normalise(y, xn, x, mean[ch], inv[ch], gam, bet, slope, ch, N, C, S);
}

/* Fused backward, plain layout: per channel, the sums of dz and dz x_norm (beta's and gamma's
 * gradients, from which BatchNorm's means of dy gamma follow), then dx. */
static void bwd_fused_plain(const kiln_op_ctx *c, float *dx, float *dgam, float *dbet,
                            const float *dy, const float *xn, const float *inv, const float *gam,
                            const float *bet, int64_t N, int64_t C, int64_t S, bool global,
                            float slope) {
  const int64_t m = N * S;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * S > KILN_PARALLEL_FROM)
  for (int64_t ch = 0; ch < C; ch++) {
    const float g = gam[ch], b = bet[ch], is = inv[ch];
    double ad[KILN_SUM_LANES] = {0}, ax[KILN_SUM_LANES] = {0};
    for (int64_t n = 0; n < N; n++) {
      const float *pv = xn + (n * C + ch) * S, *pd = dy + (n * C + ch) * S;
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
    dbet[ch] += (float)sd;
    dgam[ch] += (float)sx;
    if (!dx) continue;
    const bool batch = !global && m;
    const float a = batch ? (float)((double)g * sd / (double)m) : 0.0f;
    const float q = batch ? (float)((double)g * sx / (double)m) : 0.0f;
    for (int64_t n = 0; n < N; n++) {
      const int64_t o = (n * C + ch) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; i++) {
        const float v = xn[o + i], d = fused_dz(v, g, b, slope, dy[o + i]);
        dx[o + i] = (d * g - a - q * v) * is;
      }
    }
  }
}

static void bwd_plain(const kiln_op_ctx *c, float *dx, const float *dy, const float *xn,
                      const float *inv, int64_t N, int64_t C, int64_t S, bool global) {
  const int64_t m = N * S;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * S > KILN_PARALLEL_FROM)
  for (int64_t ch = 0; ch < C; ch++) {
    float is = inv[ch];
    if (global) {
      for (int64_t n = 0; n < N; n++) {
        int64_t o = (n * C + ch) * S;
#pragma omp simd
        for (int64_t i = 0; i < S; i++) dx[o + i] = dy[o + i] * is;
      }
      continue;
    }
    double sum_dy = kiln_plane_sum(dy + ch * S, N, C * S, S);
    double sum_dy_y = kiln_plane_dot(dy + ch * S, xn + ch * S, N, C * S, S);
    float mean_dy = m ? (float)(sum_dy / (double)m) : 0.0f;
    float mean_dy_y = m ? (float)(sum_dy_y / (double)m) : 0.0f;
    for (int64_t n = 0; n < N; n++) {
      int64_t o = (n * C + ch) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; i++) dx[o + i] = (dy[o + i] - mean_dy - mean_dy_y * xn[o + i]) * is;
    }
  }
}

/* ---- the blocked layout (nChw16c) ----------------------------------------------------------- */

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

/* xn and y, image by image and block by block. */
static void apply_blocked(const kiln_op_ctx *c, float *y, float *xn, const float *x,
                          const float *mf, const float *inv, const float *gam, const float *bet,
                          int64_t N, int64_t C, int64_t S, float slope) {
  const int64_t CB = C / 16;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * C * S > KILN_PARALLEL_FROM)
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

/* The statistics in two parallel passes over (block, chunk) items, each combined serially in
 * chunk order: the sums, then the squared deviations from the means. */
static void fwd_blocked(const kiln_op_ctx *c, float *y, float *xn, float *mf, float *inv,
                        float *mean_sum, float *var_sum, float *factor, double *part,
                        const float *x, const float *gam, const float *bet, int64_t N,
                        int64_t C, int64_t S, bool global, float maf, float eps, float slope) {
  const int64_t CB = C / 16, m = N * S;
  const int64_t nchunks = (N + KILN_BN_CHUNK - 1) / KILN_BN_CHUNK, items = CB * nchunks;
  const bool big = N * C * S > KILN_PARALLEL_FROM;
  if (global) {
    const float f = factor[0] == 0 ? 0.0f : 1.0f / factor[0];
    for (int64_t ch = 0; ch < C; ch++) {
      mf[ch] = f * mean_sum[ch];
      inv[ch] = 1.0f / sqrtf(f * var_sum[ch] + eps);
    }
  } else {
    const double correction = m > 1 ? (double)m / (double)(m - 1) : 1.0;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (big)
    for (int64_t t = 0; t < items; t++) {
      const int64_t cb = t / nchunks, n0 = (t % nchunks) * KILN_BN_CHUNK;
      block16_chunk_sums(part + t * 32, NULL, x, NULL, NULL, n0,
                         n0 + KILN_BN_CHUNK < N ? n0 + KILN_BN_CHUNK : N, CB, cb, S);
    }
    double *mean = part + items * 32; /* after the partial sums: CB * 16 more doubles */
    for (int64_t cb = 0; cb < CB; cb++) {
      block16_combine(mean + cb * 16, part, cb, nchunks, 0);
      for (int k = 0; k < 16; k++) mean[cb * 16 + k] = m ? mean[cb * 16 + k] / (double)m : 0.0;
    }
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (big)
    for (int64_t t = 0; t < items; t++) {
      const int64_t cb = t / nchunks, n0 = (t % nchunks) * KILN_BN_CHUNK;
      block16_chunk_sums(part + t * 32 + 16, NULL, x, NULL, mean + cb * 16, n0,
                         n0 + KILN_BN_CHUNK < N ? n0 + KILN_BN_CHUNK : N, CB, cb, S);
    }
    for (int64_t cb = 0; cb < CB; cb++) {
      double sq[16];
      block16_combine(sq, part, cb, nchunks, 1);
      for (int k = 0; k < 16; k++) {
        const int64_t ch = cb * 16 + k;
        const double var = m ? sq[k] / (double)m : 0.0; /* biased, as Caffe normalises with */
        mf[ch] = (float)mean[ch];
        inv[ch] = (float)(1.0 / sqrt(var + eps));
        mean_sum[ch] = maf * mean_sum[ch] + (float)mean[ch];
        var_sum[ch] = maf * var_sum[ch] + (float)(correction * var);
      }
    }
    factor[0] = maf * factor[0] + 1.0f;
  }
  apply_blocked(c, y, xn, x, mf, inv, gam, bet, N, C, S, slope);
}

/* Fused backward, blocked layout. Pass 1 (by 16-channel block and chunk of images, summed in
 * chunk order): per channel, the sums of dz (Scale's output gradient after ReLU's mask) and of
 * dz * x_norm, which are beta's and gamma's gradients; BatchNorm's own means of dy * gamma
 * follow from them. Pass 2: dx. Two passes over (dy, x_norm) where BatchNorm, Scale and ReLU
 * apart make six over larger sets of streams. */
static void bwd_fused_blocked(const kiln_op_ctx *c, float *dx, float *dgam, float *dbet,
                              double *part, float *chan, const float *dy, const float *xn,
                              const float *inv, const float *gam, const float *bet, int64_t N,
                              int64_t C, int64_t S, bool global, float slope) {
  const int64_t CB = C / 16, m = N * S;
  const int64_t nchunks = (N + KILN_BN_CHUNK - 1) / KILN_BN_CHUNK, items = CB * nchunks;
  const bool big = N * C * S > KILN_PARALLEL_FROM;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (big)
  for (int64_t t = 0; t < items; t++) {
    const int64_t cb = t / nchunks, n0 = (t % nchunks) * KILN_BN_CHUNK;
    const int64_t n1 = n0 + KILN_BN_CHUNK < N ? n0 + KILN_BN_CHUNK : N;
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
  float *a = chan, *bq = chan + C; /* per channel: mean(dy * gamma), mean(dy * gamma * xn) */
  for (int64_t cb = 0; cb < CB; cb++) {
    double sd[16], sx[16];
    block16_combine(sd, part, cb, nchunks, 0);
    block16_combine(sx, part, cb, nchunks, 1);
    for (int k = 0; k < 16; k++) {
      const int64_t ch = cb * 16 + k;
      dbet[ch] += (float)sd[k];
      dgam[ch] += (float)sx[k];
      const bool batch = !global && m;
      a[ch] = batch ? (float)((double)gam[ch] * sd[k] / (double)m) : 0.0f;
      bq[ch] = batch ? (float)((double)gam[ch] * sx[k] / (double)m) : 0.0f;
    }
  }
  if (!dx) return;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (big)
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

static void bwd_blocked(const kiln_op_ctx *c, float *dx, double *part, float *chan,
                        const float *dy, const float *xn, const float *inv, int64_t N, int64_t C,
                        int64_t S, bool global) {
  const int64_t CB = C / 16, m = N * S;
  const int64_t nchunks = (N + KILN_BN_CHUNK - 1) / KILN_BN_CHUNK, items = CB * nchunks;
  const bool big = N * C * S > KILN_PARALLEL_FROM;
  float *a = chan, *bq = chan + C; /* per channel: mean(dy), mean(dy * y) */
  if (!global && m) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (big)
    for (int64_t t = 0; t < items; t++) {
      const int64_t cb = t / nchunks, n0 = (t % nchunks) * KILN_BN_CHUNK;
      block16_chunk_sums(part + t * 32, part + t * 32 + 16, dy, xn, NULL, n0,
                         n0 + KILN_BN_CHUNK < N ? n0 + KILN_BN_CHUNK : N, CB, cb, S);
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
    for (int64_t ch = 0; ch < C; ch++) a[ch] = bq[ch] = 0.0f;
  }
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (big)
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
}

/* ---- the ops -------------------------------------------------------------------------------- */

int kiln_ref_batch_norm_fwd(const kiln_op_ctx *c, float *y, float *xn, float *mean, float *inv,
                            float *run_mean, float *run_var, float *run_count, void *scratch,
                            const float *x, const float *gamma, const float *beta, int64_t N,
                            int64_t C, int64_t S, int block, bool global, float maf, float eps,
                            float slope) {
  if (block == 16)
    fwd_blocked(c, y, xn, mean, inv, run_mean, run_var, run_count, scratch_part(scratch), x,
                gamma, beta, N, C, S, global, maf, eps, slope);
  else if (block == 0)
    fwd_plain(c, y, xn, mean, inv, run_mean, run_var, run_count, x, gamma, beta, N, C, S, global,
              maf, eps, slope);
  else
    return bad_block(block);
  return KILN_OK;
}

int kiln_ref_batch_norm_apply(const kiln_op_ctx *c, float *y, float *xn, const float *x,
                              const float *mean, const float *inv, const float *gamma,
                              const float *beta, int64_t N, int64_t C, int64_t S, int block,
                              float slope) {
  if (block == 16)
    apply_blocked(c, y, xn, x, mean, inv, gamma, beta, N, C, S, slope);
  else if (block == 0)
    apply_plain(c, y, xn, x, mean, inv, gamma, beta, N, C, S, slope);
  else
    return bad_block(block);
  return KILN_OK;
}

/* With gamma (the fused Scale), Scale's parameter gradients are taken even without dx. */
int kiln_ref_batch_norm_bwd(const kiln_op_ctx *c, float *dx, float *dgamma, float *dbeta,
                            void *scratch, const float *dy, const float *xn, const float *inv,
                            const float *gamma, const float *beta, int64_t N, int64_t C,
                            int64_t S, int block, bool global, float slope) {
  if (block != 0 && block != 16) return bad_block(block);
  if (gamma) {
    if (block == 16)
      bwd_fused_blocked(c, dx, dgamma, dbeta, scratch_part(scratch), scratch_chan(scratch, N, C),
                        dy, xn, inv, gamma, beta, N, C, S, global, slope);
    else
      bwd_fused_plain(c, dx, dgamma, dbeta, dy, xn, inv, gamma, beta, N, C, S, global, slope);
    return KILN_OK;
  }
  if (!dx) return KILN_OK;
  if (block == 16)
    bwd_blocked(c, dx, scratch_part(scratch), scratch_chan(scratch, N, C), dy, xn, inv, N, C, S,
                global);
  else
    bwd_plain(c, dx, dy, xn, inv, N, C, S, global);
  return KILN_OK;
}
