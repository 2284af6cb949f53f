/* Per-channel sums of the norm family's kernels (batch_norm.c, norm.c), for src/ops only: over
 * the planes of one channel in the plain layout and over the 16 channels of one block of the
 * blocked (nChw16c) layout, in double and in a fixed order, so that results do not depend on
 * the thread count. */
#ifndef KILN_OPS_NORM_SUMS_H
#define KILN_OPS_NORM_SUMS_H

#include <stdint.h>

/* Per-channel sums over a BLOCKED16 (nChw16c) tensor of N images, C channels and S = H*W: for
 * the 16 channels of block cb, sum[k] = sum over n, i of a(n, 16 cb + k, i) (times b's when b is
 * not NULL), in double, in a fixed order. */
static inline void kiln_block16_sums(double sum[16], const float *a, const float *b, int64_t N,
                                     int64_t CB, int64_t cb, int64_t S) {
  double acc[16] = {0};
  for (int64_t n = 0; n < N; n++) {
    const int64_t off = (n * CB + cb) * S * 16;
    const float *pa = a + off;
    if (b) {
      const float *pb = b + off;
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) acc[k] += (double)pa[i * 16 + k] * pb[i * 16 + k];
    } else {
      for (int64_t i = 0; i < S; i++)
#pragma omp simd
        for (int k = 0; k < 16; k++) acc[k] += pa[i * 16 + k];
    }
  }
  for (int k = 0; k < 16; k++) sum[k] = acc[k];
}

/* Both at once, in one pass: sum[k] of a, and dot[k] of a * b (the same bits as two calls). */
static inline void kiln_block16_sum_dot(double sum[16], double dot[16], const float *a,
                                        const float *b, int64_t N, int64_t CB, int64_t cb,
                                        int64_t S) {
  double as[16] = {0}, ad[16] = {0};
  for (int64_t n = 0; n < N; n++) {
    const int64_t off = (n * CB + cb) * S * 16;
    const float *pa = a + off, *pb = b + off;
    for (int64_t i = 0; i < S; i++)
#pragma omp simd
      for (int k = 0; k < 16; k++) {
        as[k] += pa[i * 16 + k];
        ad[k] += (double)pa[i * 16 + k] * pb[i * 16 + k];
      }
  }
  for (int k = 0; k < 16; k++) sum[k] = as[k], dot[k] = ad[k];
}

/* Sums over one channel's planes (N planes of S floats, `stride` apart), in double, with eight
 * partial sums taken in a fixed order: independent additions (one dependent chain waits ~4
 * cycles per element) that the compiler can vectorise, and the same result for any thread
 * count. kiln_plane_dot sums a * b the same way. */
enum { KILN_SUM_LANES = 8 };

static inline double kiln_plane_sum(const float *x, int64_t N, int64_t stride, int64_t S) {
  double acc[KILN_SUM_LANES] = {0};
  for (int64_t n = 0; n < N; n++) {
    const float *p = x + n * stride;
    int64_t i = 0;
    for (; i + KILN_SUM_LANES <= S; i += KILN_SUM_LANES)
      for (int k = 0; k < KILN_SUM_LANES; k++) acc[k] += p[i + k];
    for (; i < S; i++) acc[i % KILN_SUM_LANES] += p[i];
  }
  double t = 0;
  for (int k = 0; k < KILN_SUM_LANES; k++) t += acc[k];
  return t;
}

static inline double kiln_plane_dot(const float *a, const float *b, int64_t N, int64_t stride,
                                    int64_t S) {
  double acc[KILN_SUM_LANES] = {0};
  for (int64_t n = 0; n < N; n++) {
    const float *p = a + n * stride, *q = b + n * stride;
    int64_t i = 0;
    for (; i + KILN_SUM_LANES <= S; i += KILN_SUM_LANES)
      for (int k = 0; k < KILN_SUM_LANES; k++) acc[k] += (double)p[i + k] * q[i + k];
    for (; i < S; i++) acc[i % KILN_SUM_LANES] += (double)p[i] * q[i];
  }
  double t = 0;
  for (int k = 0; k < KILN_SUM_LANES; k++) t += acc[k];
  return t;
}

#endif
