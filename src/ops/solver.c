/* The solver's kernels: the six update rules, one pass each over one parameter blob, its gradient
 * and its histories (SGD's with the normalisation, the L2 weight decay and the finite check of
 * the new weights in the same pass); the normalisation and weight decay of the other rules; the
 * sum of squares that gradient clipping reads; the search for a parameter that is not finite;
 * and the workers' sum in rank order over shared memory. The learning rates and the rules'
 * settings are scalars the solver computes on the host.
 *
 * Each loop is the arithmetic src/solver/update.c ran before it called ops, unchanged (the same
 * operations in the same order and types per element, vectorised where it was), so the bits are
 * the same; the loops run on one thread, as they did: the update streams memory once per step,
 * and the sums must add in one order. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ops/kernels.h"

/* ---- clipping and regularisation ---- -------------------------------------------------------- */

/* In order into one double, as one loop over every gradient would: calls for successive blobs
 * continue the same sum. */
int kiln_ref_sumsq_acc(const kiln_op_ctx *c, double *sum, const float *x, int64_t n) {
  (void)c;
  double s = *sum;
  for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  *sum = s;
  return KILN_OK;
}

/* `omp simd`: g and w never overlap, which the compiler cannot see; vectorised, the same
 * operations in the same order per element. */
int kiln_ref_regularize(const kiln_op_ctx *c, float *g, const float *w, int64_t n, float norm,
                        float wd, bool l1) {
  (void)c;
  if (norm != 1.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) g[i] *= norm;
  }
  if (wd != 0) {
    if (l1) {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) g[i] += wd * (float)((w[i] > 0) - (w[i] < 0));
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) g[i] += wd * w[i];
    }
  }
  return KILN_OK;
}

/* ---- the update rules ---- ------------------------------------------------------------------- */

/* The steps fused into one pass over memory (the update reads three arrays the size of the model;
 * apart, the passes made it memory-bound), with the finite check of the new weights: per element
 * the same operations in the same order as the separate passes, so the same bits. Scalar, these
 * loops were a visible share of a small net's step (LeNet's, profiled with perf: docs/PERF.md). */
int kiln_ref_sgd_update(const kiln_op_ctx *c, float *w, float *h, float *g, int32_t *bad,
                        int64_t n, float norm, float wd, float lr, float m) {
  (void)c;
  int found = 0;
#pragma omp simd reduction(| : found)
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i];
    if (norm != 1.0f) gi *= norm;
    if (wd != 0) gi += wd * w[i];
    g[i] = gi;
    h[i] = m * h[i] + lr * gi;
    w[i] -= h[i];
    found |= !(fabsf(w[i]) <= FLT_MAX);
  }
  if (found) *bad = 1;
  return KILN_OK;
}

int kiln_ref_nesterov_update(const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n,
                             float lr, float m) {
  (void)c;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float old = h[i];
    h[i] = m * h[i] + lr * g[i];
    w[i] -= (1 + m) * h[i] - m * old;
  }
  return KILN_OK;
}

int kiln_ref_adagrad_update(const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n,
                            float lr, float delta) {
  (void)c;
  for (int64_t i = 0; i < n; i++) {
    h[i] += g[i] * g[i];
    w[i] -= lr * g[i] / (sqrtf(h[i]) + delta);
  }
  return KILN_OK;
}

int kiln_ref_rmsprop_update(const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n,
                            float lr, float decay, float delta) {
  (void)c;
  for (int64_t i = 0; i < n; i++) {
    h[i] = decay * h[i] + (1 - decay) * g[i] * g[i];
    w[i] -= lr * g[i] / (sqrtf(h[i]) + delta);
  }
  return KILN_OK;
}

/* h: running mean of g^2; h2: running mean of squared updates (Caffe's update history). */
int kiln_ref_adadelta_update(const kiln_op_ctx *c, float *w, float *h, float *h2, const float *g,
                             int64_t n, float lr, float m, float delta) {
  (void)c;
  for (int64_t i = 0; i < n; i++) {
    h[i] = m * h[i] + (1 - m) * g[i] * g[i];
    float u = g[i] * sqrtf((h2[i] + delta) / (h[i] + delta));
    h2[i] = m * h2[i] + (1 - m) * u * u;
    w[i] -= lr * u;
  }
  return KILN_OK;
}

/* The moments in double (b1 and b2 are), stored as floats. */
int kiln_ref_adam_update(const kiln_op_ctx *c, float *w, float *h, float *h2, const float *g,
                         int64_t n, float lr, double b1, double b2, float delta) {
  (void)c;
  for (int64_t i = 0; i < n; i++) {
    h[i] = (float)(b1 * h[i] + (1 - b1) * g[i]);
    h2[i] = (float)(b2 * h2[i] + (1 - b2) * g[i] * g[i]);
    w[i] -= lr * h[i] / (sqrtf(h2[i]) + delta);
  }
  return KILN_OK;
}

/* ---- checks and sums ---- -------------------------------------------------------------------- */

/* A vectorised scan first (every step reads every parameter), the search only on a hit. */
int kiln_ref_find_nonfinite(const kiln_op_ctx *c, int64_t *at, const float *x, int64_t n) {
  (void)c;
  int bad = 0;
#pragma omp simd reduction(| : bad)
  for (int64_t i = 0; i < n; i++) bad |= !(fabsf(x[i]) <= FLT_MAX);
  *at = -1;
  if (bad)
    for (int64_t i = 0; i < n; i++)
      if (!isfinite(x[i])) {
        *at = i;
        break;
      }
  return KILN_OK;
}

/* Element-wise, so vectorising changes nothing: each element gets exactly one rounding per
 * addition. */
static void add_into(float *restrict acc, const float *restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

/* Block by block, so that the blocks stay in L1 between the passes. */
int kiln_ref_ordered_sum(const kiln_op_ctx *c, float *const *p, int np, int64_t n) {
  (void)c;
  enum { BLOCK = 1024 }; /* 4 KiB on the stack */
  float acc[BLOCK];
  for (int64_t i = 0; i < n; i += BLOCK) {
    int64_t m = n - i < BLOCK ? n - i : BLOCK;
    memcpy(acc, p[0] + i, sizeof(float) * (size_t)m);
    for (int r = 1; r < np; r++) add_into(acc, p[r] + i, m);
    for (int r = 0; r < np; r++) memcpy(p[r] + i, acc, sizeof(float) * (size_t)m);
  }
  return KILN_OK;
}
