/* The l2norm family's kernels (include/kiln/backend.h's KILN_OPS_L2NORM): Normalize, the SSD
 * fork's L2 normalisation of each position's channels (or of each image) times a learned scale.
 * Every sum is in double, in an order fixed by the sizes: a group of positions, an image or a
 * channel is one thread's, its terms added in memory order (per position: channel by channel),
 * so results do not depend on the thread count. */
#include <math.h>

#include "ops/kernels.h"

/* Positions a block of the per-position form takes: its sums run over the channels for this many
 * positions side by side, each position's in channel order. */
#define L2_BLOCK 64

static inline float l2_scale(const float *scale, bool shared, int64_t ch) {
  return shared ? scale[0] : scale[ch];
}

int kiln_ref_l2norm_fwd(const kiln_op_ctx *c, float *y, float *norm, const float *x,
                        const float *scale, int64_t N, int64_t C, int64_t S, bool across,
                        bool shared, float eps) {
  const int64_t cs = C * S, count = N * cs;
  const double e = eps;
  if (across) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
    for (int64_t n = 0; n < N; n++) {
      const float *xn = x + n * cs;
      double t = 0;
      for (int64_t i = 0; i < cs; i++) t += (double)xn[i] * xn[i];
      norm[n] = (float)sqrt(t + e);
    }
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
    for (int64_t r = 0; r < N * C; r++) {
      const float nr = norm[r / C], sc = l2_scale(scale, shared, r % C);
      const float *xr = x + r * S;
      float *yr = y + r * S;
      for (int64_t s = 0; s < S; s++) yr[s] = xr[s] / nr * sc;
    }
    return KILN_OK;
  }
  const int64_t nblk = (S + L2_BLOCK - 1) / L2_BLOCK;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
  for (int64_t b = 0; b < N * nblk; b++) {
    const int64_t n = b / nblk, s0 = b % nblk * L2_BLOCK;
    const int64_t w = S - s0 < L2_BLOCK ? S - s0 : L2_BLOCK;
    const float *xb = x + n * cs + s0;
    float *yb = y + n * cs + s0;
    double t[L2_BLOCK] = {0};
    float nr[L2_BLOCK];
    for (int64_t ch = 0; ch < C; ch++)
      for (int64_t j = 0; j < w; j++) t[j] += (double)xb[ch * S + j] * xb[ch * S + j];
    for (int64_t j = 0; j < w; j++) norm[n * S + s0 + j] = nr[j] = (float)sqrt(t[j] + e);
    for (int64_t ch = 0; ch < C; ch++) {
      const float sc = l2_scale(scale, shared, ch);
      for (int64_t j = 0; j < w; j++) yb[ch * S + j] = xb[ch * S + j] / nr[j] * sc;
    }
  }
  return KILN_OK;
}

/* The scale's gradient first, channel by channel (with shared, the channels' sums then added in
 * channel order), then dx group by group: each group's sum before any of its dx. */
int kiln_ref_l2norm_bwd(const kiln_op_ctx *c, float *dx, float *dscale, float *ws,
                        const float *dy, const float *x, const float *norm, const float *scale,
                        int64_t N, int64_t C, int64_t S, bool across, bool shared) {
  const int64_t cs = C * S, count = N * cs;
  if (dscale) {
    double *part = (double *)(void *)ws; /* with shared: each channel's sum */
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
    for (int64_t ch = 0; ch < C; ch++) {
      double t = 0;
      for (int64_t n = 0; n < N; n++) {
        const int64_t off = n * cs + ch * S;
        for (int64_t s = 0; s < S; s++)
          t += (double)dy[off + s] * x[off + s] / norm[across ? n : n * S + s];
      }
      if (shared) part[ch] = t;
      else dscale[ch] += (float)t;
    }
    if (shared) {
      double t = 0;
      for (int64_t ch = 0; ch < C; ch++) t += part[ch];
      dscale[0] += (float)t;
    }
  }
  if (!dx) return KILN_OK;
  if (across) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
    for (int64_t n = 0; n < N; n++) {
      const int64_t off = n * cs;
      double a = 0;
      for (int64_t ch = 0; ch < C; ch++) {
        const float sc = l2_scale(scale, shared, ch);
        const float *dyc = dy + off + ch * S, *xc = x + off + ch * S;
        for (int64_t s = 0; s < S; s++) a += (double)(dyc[s] * sc) * xc[s];
      }
      const float nr = norm[n], k = (float)(a / ((double)nr * nr));
      for (int64_t ch = 0; ch < C; ch++) {
        const float sc = l2_scale(scale, shared, ch);
        for (int64_t s = 0; s < S; s++) {
          const int64_t i = off + ch * S + s;
          dx[i] = (dy[i] * sc - x[i] * k) / nr;
        }
      }
    }
    return KILN_OK;
  }
  const int64_t nblk = (S + L2_BLOCK - 1) / L2_BLOCK;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (count > KILN_PARALLEL_FROM)
  for (int64_t b = 0; b < N * nblk; b++) {
    const int64_t n = b / nblk, s0 = b % nblk * L2_BLOCK;
    const int64_t w = S - s0 < L2_BLOCK ? S - s0 : L2_BLOCK, off = n * cs + s0;
    double a[L2_BLOCK] = {0};
    float k[L2_BLOCK];
    for (int64_t ch = 0; ch < C; ch++) {
      const float sc = l2_scale(scale, shared, ch);
      for (int64_t j = 0; j < w; j++) {
        const int64_t i = off + ch * S + j;
        a[j] += (double)(dy[i] * sc) * x[i];
      }
    }
    const float *nr = norm + n * S + s0;
    for (int64_t j = 0; j < w; j++) k[j] = (float)(a[j] / ((double)nr[j] * nr[j]));
    for (int64_t ch = 0; ch < C; ch++) {
      const float sc = l2_scale(scale, shared, ch);
      for (int64_t j = 0; j < w; j++) {
        const int64_t i = off + ch * S + j;
        dx[i] = (dy[i] * sc - x[i] * k[j]) / nr[j];
      }
    }
  }
  return KILN_OK;
}
