/* The matmul family on the CUDA backend (KILN_OPS_MATMUL): GEMMs through cuBLAS (the reference
 * GEMM in the emulation), the bias rows and the sparse products as kernels. */
#include "cuda/kcuda.h"
#ifndef KCUDA_EMU
#include <cublas_v2.h>
#include <limits.h>
#endif

/* cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T,
 * the same memory, so the operands swap and nothing is transposed in memory. */
KCUDA_OP(gemm)(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
               const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
               float alpha, float beta) {
  if (M <= 0 || N <= 0) return KILN_OK;
#ifdef KCUDA_EMU
  /* the reference backend's GEMM (OpenBLAS), standing in for cuBLAS */
  return kiln_backend_ref()->gemm(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
#else
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "cuda gemm: %lld x %lld x %lld is past cuBLAS's int sizes",
                       (long long)M, (long long)N, (long long)K);
  cublasHandle_t h = (cublasHandle_t)kiln_cuda_blas(c);
  if (!h) return kiln_errorf(KILN_ERR_IO, "cuda gemm: no cuBLAS handle");
  cublasStatus_t st =
      cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                  (int)(K > 0 ? K : 0), &alpha, B, (int)(ldb > 0 ? ldb : 1), A,
                  (int)(lda > 0 ? lda : 1), &beta, C, (int)ldc);
  if (st != CUBLAS_STATUS_SUCCESS)
    return kiln_errorf(KILN_ERR_IO, "cuda gemm (%lld x %lld x %lld): cuBLAS status %d",
                       (long long)M, (long long)N, (long long)K, (int)st);
  return kcuda_launched(c, "gemm");
#endif
}

KCUDA_GLOBAL void k_add_bias_rows(float *y, const float *b, int64_t M, int64_t N) {
  KCUDA_FOR(i, M * N) y[i] += b[i % N];
}

KCUDA_OP(add_bias_rows)(const kiln_op_ctx *c, float *y, const float *b, int64_t M, int64_t N) {
  KCUDA_LAUNCH(c, M * N, k_add_bias_rows, y, b, M, N);
  return kcuda_launched(c, "add_bias_rows");
}

/* One thread a column, its rows in order: the host's sum, bit for bit. */
KCUDA_GLOBAL void k_sum_rows_into(float *db, const float *dy, int64_t M, int64_t N) {
  KCUDA_FOR(n, N) {
    float s = db[n];
    for (int64_t m = 0; m < M; m++) s += dy[m * N + n];
    db[n] = s;
  }
}

KCUDA_OP(sum_rows_into)(const kiln_op_ctx *c, float *db, const float *dy, int64_t M, int64_t N) {
  KCUDA_LAUNCH(c, N, k_sum_rows_into, db, dy, M, N);
  return kcuda_launched(c, "sum_rows_into");
}

/* A sparse bottom's matrix is host memory (the data layer builds it row by row): its rows go to
 * the device for the op, into scratch, as one block of row offsets, columns and values. */
typedef struct {
  const int64_t *row_ptr;
  const int32_t *col;
  const float *val;
} csr_on_device;

static int csr_upload(const kiln_op_ctx *c, const kiln_csr *x, int64_t M, csr_on_device *out) {
  const int64_t nnz = x->row_ptr[M];
  const size_t rp = sizeof(int64_t) * (size_t)(M + 1), cb = sizeof(int32_t) * (size_t)nnz;
  const size_t cpad = (cb + 15) / 16 * 16, vb = sizeof(float) * (size_t)nnz;
  void *s;
  KILN_TRY(kcuda_scratch(c, rp + cpad + vb, &s));
  char *p = (char *)s;
  KILN_TRY(kiln_device_to_device(c->device, p, x->row_ptr, rp));
  if (nnz > 0) {
    KILN_TRY(kiln_device_to_device(c->device, p + rp, x->col, cb));
    KILN_TRY(kiln_device_to_device(c->device, p + rp + cpad, x->val, vb));
  }
  out->row_ptr = (const int64_t *)(void *)p;
  out->col = (const int32_t *)(void *)(p + rp);
  out->val = (const float *)(void *)(p + rp + cpad);
  return KILN_OK;
}

/* One thread an output, its row's entries in order, then the bias: the host's sums. */
KCUDA_GLOBAL void k_csr_matmul(float *y, csr_on_device x, const float *w, const float *b,
                               int64_t M, int64_t N, int64_t K, bool transposed) {
  KCUDA_FOR(i, M * N) {
    const int64_t m = i / N, n = i % N;
    float s = 0;
    for (int64_t k = x.row_ptr[m]; k < x.row_ptr[m + 1]; k++)
      s += x.val[k] * (transposed ? w[(int64_t)x.col[k] * N + n] : w[n * K + x.col[k]]);
    y[i] = b ? s + b[n] : s;
  }
}

KCUDA_OP(csr_matmul)(const kiln_op_ctx *c, float *y, const kiln_csr *x, const float *w,
                     const float *b, int64_t M, int64_t N, int64_t K, bool transposed) {
  if (M <= 0 || N <= 0) return KILN_OK;
  csr_on_device xd;
  KILN_TRY(csr_upload(c, x, M, &xd));
  KCUDA_LAUNCH(c, M * N, k_csr_matmul, y, xd, w, b, M, N, K, transposed);
  return kcuda_launched(c, "csr_matmul");
}

/* One thread an output column n: it alone writes dW's column n (transposed) or row n, over the
 * rows and their entries in order, as the host does. */
KCUDA_GLOBAL void k_csr_weight_grad(float *dw, csr_on_device x, const float *dy, int64_t M,
                                    int64_t N, int64_t K, bool transposed) {
  KCUDA_FOR(n, N) {
    for (int64_t m = 0; m < M; m++) {
      const float g = dy[m * N + n];
      for (int64_t k = x.row_ptr[m]; k < x.row_ptr[m + 1]; k++) {
        if (transposed) dw[(int64_t)x.col[k] * N + n] += x.val[k] * g;
        else dw[n * K + x.col[k]] += g * x.val[k];
      }
    }
  }
}

KCUDA_OP(csr_weight_grad)(const kiln_op_ctx *c, float *dw, const kiln_csr *x, const float *dy,
                          int64_t M, int64_t N, int64_t K, bool transposed) {
  if (M <= 0 || N <= 0) return KILN_OK;
  csr_on_device xd;
  KILN_TRY(csr_upload(c, x, M, &xd));
  KCUDA_LAUNCH(c, N, k_csr_weight_grad, dw, xd, dy, M, N, K, transposed);
  return kcuda_launched(c, "csr_weight_grad");
}

KCUDA_REGISTER(matmul) {
  b->csr_matmul = KCUDA_FN(csr_matmul);
  b->csr_weight_grad = KCUDA_FN(csr_weight_grad);
  b->gemm = KCUDA_FN(gemm);
  b->add_bias_rows = KCUDA_FN(add_bias_rows);
  b->sum_rows_into = KCUDA_FN(sum_rows_into);
}
