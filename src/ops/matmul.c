/* Dense products and bias rows: GEMM (the reference through OpenBLAS alone; the cpu backend's
 * through kiln_sgemm, oneDNN's matmul where it wins), a bias added to every row, the bias
 * gradient as column sums in row order; and the products of a sparse (CSR) left operand, which
 * loop over its entries, so their cost and memory follow the entries and nothing of its dense
 * size is ever formed. On one thread (c->nthreads 1) a product runs on one thread of either
 * library (KILN_ON_OP_THREADS). */
#include <omp.h>

#include "kiln/ops.h"
#include "ops/kernels.h"

int kiln_ref_gemm(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                  const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, float beta) {
  KILN_ON_OP_THREADS(c, kiln_sgemm_blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
  return KILN_OK;
}

int kiln_cpu_gemm(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                  const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, float beta) {
  KILN_ON_OP_THREADS(c, kiln_sgemm(c->config, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                    ldc));
  return KILN_OK;
}

int kiln_ref_add_bias_rows(const kiln_op_ctx *c, float *y, const float *b, int64_t M, int64_t N) {
  (void)c;
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) y[m * N + n] += b[n];
  return KILN_OK;
}

int kiln_ref_sum_rows_into(const kiln_op_ctx *c, float *db, const float *dy, int64_t M,
                           int64_t N) {
  (void)c;
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) db[n] += dy[m * N + n];
  return KILN_OK;
}

/* ---- a sparse left operand ------------------------------------------------------------------ */

/* Every sum runs in a fixed order (entries in row order, rows in order) on each output, whatever
 * the thread count. Threads are used only for a batch of SPARSE_PARALLEL_FROM multiply-adds or
 * more: below that, waking them costs more than the work (logistic regression's 64 rows of 300
 * entries into 2 outputs took 0.27 ms on one thread and 15 ms on two on a loaded machine). */
#define SPARSE_PARALLEL_FROM (1 << 18)

int kiln_ref_csr_matmul(const kiln_op_ctx *c, float *y, const kiln_csr *x, const float *w,
                        const float *b, int64_t M, int64_t N, int64_t K, bool transposed) {
  const bool par = x->nnz * N >= SPARSE_PARALLEL_FROM;
#pragma omp parallel for schedule(static) num_threads(c->nthreads > 0 ? c->nthreads : 1) if (par)
  for (int64_t m = 0; m < M; m++) {
    float *ym = y + m * N;
    for (int64_t n = 0; n < N; n++) ym[n] = 0;
    for (int64_t k = x->row_ptr[m]; k < x->row_ptr[m + 1]; k++) {
      const float v = x->val[k];
      const int64_t col = x->col[k];
      if (transposed) { /* W is K x N: row col of W, scaled */
        const float *wc = w + col * N;
        for (int64_t n = 0; n < N; n++) ym[n] += v * wc[n];
      } else { /* W is N x K: column col of W */
        for (int64_t n = 0; n < N; n++) ym[n] += v * w[n * K + col];
      }
    }
    if (b)
      for (int64_t n = 0; n < N; n++) ym[n] += b[n];
  }
  return KILN_OK;
}

int kiln_ref_csr_weight_grad(const kiln_op_ctx *c, float *dw, const kiln_csr *x, const float *dy,
                             int64_t M, int64_t N, int64_t K, bool transposed) {
  const bool par = x->nnz * N >= SPARSE_PARALLEL_FROM;
  const int nthreads = c->nthreads > 0 ? c->nthreads : 1;
  if (transposed) {
    /* dW (K x N): row col += v dy[m]; each thread takes a range of outputs n, so every element
     * sums over the rows in order */
#pragma omp parallel num_threads(nthreads) if (par)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = N * t / nt, hi = N * (t + 1) / nt;
      for (int64_t m = 0; m < M; m++)
        for (int64_t k = x->row_ptr[m]; k < x->row_ptr[m + 1]; k++) {
          float *dwc = dw + (int64_t)x->col[k] * N;
          const float v = x->val[k];
          for (int64_t n = lo; n < hi; n++) dwc[n] += v * dy[m * N + n];
        }
    }
  } else {
    /* dW (N x K): row n += dy[m][n] x_m, over the entries of x_m */
#pragma omp parallel for schedule(static) num_threads(nthreads) if (par)
    for (int64_t n = 0; n < N; n++) {
      float *dwn = dw + n * K;
      for (int64_t m = 0; m < M; m++) {
        const float g = dy[m * N + n];
        for (int64_t k = x->row_ptr[m]; k < x->row_ptr[m + 1]; k++) dwn[x->col[k]] += g * x->val[k];
      }
    }
  }
  return KILN_OK;
}
