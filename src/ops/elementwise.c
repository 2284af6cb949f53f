/* Element-wise kernels: copies, the neuron functions and their gradients, dropout's mask. Each
 * loop is its element's arithmetic and nothing else, vectorised (`simd`) and, from
 * KILN_PARALLEL_FROM elements, split over the op's threads; the results do not depend on the
 * thread count. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/kernels.h"

/* The `if` names `parallel`: an `if` without a modifier on a combined construct also applies to
 * `simd` (OpenMP 5.0) and would turn vectorisation off for every blob under the threshold. */
#define EACH(n)                                                                                  \
  _Pragma("omp parallel for simd schedule(static) num_threads(c->nthreads) if (parallel: n > KILN_PARALLEL_FROM)") \
  for (int64_t i = 0; i < (n); i++)

/* In one piece a thread from KILN_PARALLEL_FROM floats: a large activation's copy is bound by
 * memory bandwidth, which one core does not fill. */
int kiln_ref_copy(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  if (y == x || n <= 0) return KILN_OK;
#pragma omp parallel num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    if (hi > lo) memcpy(y + lo, x + lo, sizeof(float) * (size_t)(hi - lo));
  }
  return KILN_OK;
}

/* Without `simd` (gcc -O2) the select stays a branch on random signs, an order of magnitude
 * slower (fmaxf would be a libm call per element). */
int kiln_ref_relu_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float slope) {
  EACH(n) y[i] = x[i] > 0 ? x[i] : slope * x[i];
  return KILN_OK;
}

int kiln_ref_relu_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *v, int64_t n,
                      float slope) {
  EACH(n) dx[i] = v[i] > 0 ? dy[i] : slope * dy[i];
  return KILN_OK;
}

/* The logistic function through tanh: one libm call, and no overflow of e^-x for large |x|. */
int kiln_ref_sigmoid_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = 0.5f * tanhf(0.5f * x[i]) + 0.5f;
  return KILN_OK;
}

int kiln_ref_sigmoid_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *y,
                         int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i] * (1 - y[i]);
  return KILN_OK;
}

int kiln_ref_tanh_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
  return KILN_OK;
}

int kiln_ref_tanh_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *y,
                      int64_t n) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1 - y[i] * y[i]);
  return KILN_OK;
}

/* In order from one generator, so that a snapshot's generator state resumes the same masks. */
int kiln_ref_dropout_mask(const kiln_op_ctx *c, float *mask, int64_t n, float ratio, float scale,
                          kiln_rng *rng) {
  (void)c;
  for (int64_t i = 0; i < n; i++) mask[i] = kiln_rng_uniform(rng, 0, 1) >= ratio ? scale : 0.0f;
  return KILN_OK;
}

int kiln_ref_mul(const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n) {
  EACH(n) y[i] = a[i] * b[i];
  return KILN_OK;
}
