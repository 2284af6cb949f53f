/* MultiHeadAttention's kernels (include/kiln/backend.h, KILN_OPS_SEQUENCE): the projections' GEMMs
 * in fixed blocks of rows, the bias gradients' column sums, the padding mask's check, and
 * scaled dot-product attention of several heads over time-major projections.
 *
 * In attention one (sequence, head) pair is one work item: its scores, masked softmax and
 * weighted sum are GEMMs over strided views of the T x N x D arrays, so no head is ever copied
 * out. Items write disjoint memory and each is the same GEMM calls on one BLAS thread whichever
 * OpenMP thread runs it, so the results do not depend on the thread count; so do the blocked
 * projections (gemm_rows). Every GEMM here is kiln_sgemm_blas, the reference gemm's OpenBLAS
 * call, or (the cpu backend's large projections) the gemm op itself. */
#include <math.h>
#include <omp.h>

#include "kiln/ops.h"
#include "ops/kernels.h"

/* ---- the projections ------------------------------------------------------------------------- */

/* Rows of C fall in fixed blocks of this many, whatever the thread count. */
enum { ROW_BLOCK = 64 };

/* Products of this many multiply-adds and more run whole on the cpu backend (oneDNN's kernels
 * where they win): each block would copy all of B again. */
#define WHOLE_MACS (1 << 19)

/* C in blocks of ROW_BLOCK rows spread over the threads: each block is the same single-threaded
 * GEMM call on any thread, so C's bits do not depend on the thread count. */
static void gemm_blocks(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                        const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                        int64_t K, float alpha, float beta) {
  const int64_t nblk = (M + ROW_BLOCK - 1) / ROW_BLOCK;
  int team = c->nthreads < 1 ? 1 : c->nthreads;
  if (team > nblk) team = nblk < 1 ? 1 : (int)nblk;
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t b = 0; b < nblk; b++) {
    const int64_t r0 = b * ROW_BLOCK, mb = M - r0 < ROW_BLOCK ? M - r0 : ROW_BLOCK;
    kiln_sgemm_blas(ta, tb, mb, N, K, alpha, ta ? A + r0 : A + r0 * lda, lda, B, ldb, beta,
                    C + r0 * ldc, ldc);
  }
  kiln_blas_serial_end(blas_prev);
}

int kiln_ref_gemm_rows(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                       const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                       int64_t K, float alpha, float beta) {
  gemm_blocks(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
  return KILN_OK;
}

/* Under the reference engine (hostsim runs these kernels whatever the engine) the blocks too. */
int kiln_cpu_gemm_rows(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                       const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                       int64_t K, float alpha, float beta) {
  if (c->config->engine != KILN_ENGINE_REF && (double)M * N * K >= WHOLE_MACS)
    return kiln_cpu_gemm(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
  gemm_blocks(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
  return KILN_OK;
}

/* Blocks of 16 columns over the threads, each column's sum in double over the rows in order. */
int kiln_ref_sum_rows_double_into(const kiln_op_ctx *c, float *db, const float *dy, int64_t M,
                                  int64_t N) {
  enum { W = 16 };
  const int64_t nblk = (N + W - 1) / W;
#pragma omp parallel for schedule(static) num_threads(c->nthreads < 1 ? 1 : c->nthreads) if (M * N > 65536)
  for (int64_t cb = 0; cb < nblk; cb++) {
    const int64_t c0 = cb * W, w = N - c0 < W ? N - c0 : W;
    double acc[W] = {0};
    for (int64_t m = 0; m < M; m++)
      for (int64_t j = 0; j < w; j++) acc[j] += dy[m * N + c0 + j];
    for (int64_t j = 0; j < w; j++) db[c0 + j] += (float)acc[j];
  }
  return KILN_OK;
}

int kiln_ref_mask_check(const kiln_op_ctx *c, const float *mask, int64_t S, int64_t N) {
  (void)c;
  for (int64_t i = 0; i < S * N; i++)
    if (mask[i] != 0 && mask[i] != 1)
      return kiln_errorf(KILN_ERR_DATA,
                         "the padding mask holds %g at step %lld of sequence %lld: expected 1 "
                         "(valid) or 0 (padding)",
                         mask[i], (long long)(i / N), (long long)(i % N));
  return KILN_OK;
}

/* ---- attention ------------------------------------------------------------------------------- */

static int team_size(int nthreads, int64_t items) {
  if (nthreads > items) nthreads = (int)items;
  return nthreads < 1 ? 1 : nthreads;
}

int64_t kiln_attention_workspace(int T, int S, int nthreads) {
  return (int64_t)T * S * (nthreads < 1 ? 1 : nthreads);
}

/* Row t of one item's scores (S values) into weights, in place: softmax over the keys query t
 * may see, the others 0; no key at all leaves the whole row 0. The maximum is subtracted before
 * exp so that large scores cannot overflow, and the sum is taken in double. */
static void masked_softmax_row(float *row, int t, int S, const float *valid, int64_t vstride,
                               bool causal) {
  const int send = causal && t + 1 < S ? t + 1 : S;
  float mx = -INFINITY;
  for (int s = 0; s < send; s++)
    if ((!valid || valid[s * vstride] != 0) && row[s] > mx) mx = row[s];
  if (mx == -INFINITY) {
    for (int s = 0; s < S; s++) row[s] = 0;
    return;
  }
  double sum = 0;
  for (int s = 0; s < S; s++) {
    const bool on = s < send && (!valid || valid[s * vstride] != 0);
    const float e = on ? expf(row[s] - mx) : 0.0f;
    row[s] = e;
    sum += e;
  }
  const float inv = (float)(1.0 / sum);
  for (int s = 0; s < S; s++) row[s] *= inv;
}

int kiln_ref_attention_fwd(const kiln_op_ctx *c, float *ctx, float *probs, const float *q,
                           const float *k, const float *v, const float *valid, int T, int S, int N,
                           int H, int hd, float scale, bool causal) {
  const int D = H * hd, ld = N * D;
  const int64_t items = (int64_t)N * H;
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static) num_threads(team_size(c->nthreads, items))
  for (int64_t it = 0; it < items; it++) {
    const int n = (int)(it / H), h = (int)(it % H);
    const int64_t off = (int64_t)n * D + (int64_t)h * hd;
    float *p = probs + it * T * S;
    /* scores (T, S) = scale q_nh (T, hd) k_nh^T (hd, S) */
    kiln_sgemm_blas(false, true, T, S, hd, scale, q + off, ld, k + off, ld, 0.0f, p, S);
    for (int t = 0; t < T; t++)
      masked_softmax_row(p + (int64_t)t * S, t, S, valid ? valid + n : NULL, N, causal);
    /* ctx_nh (T, hd) = p (T, S) v_nh (S, hd) */
    kiln_sgemm_blas(false, false, T, hd, S, 1.0f, p, S, v + off, ld, 0.0f, ctx + off, ld);
  }
  kiln_blas_serial_end(blas_prev);
  return KILN_OK;
}

int kiln_ref_attention_bwd(const kiln_op_ctx *c, float *dq, float *dk, float *dv, float *work,
                           const float *dctx, const float *probs, const float *q, const float *k,
                           const float *v, int T, int S, int N, int H, int hd, float scale) {
  const int D = H * hd, ld = N * D;
  const int64_t items = (int64_t)N * H;
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static) num_threads(team_size(c->nthreads, items))
  for (int64_t it = 0; it < items; it++) {
    const int n = (int)(it / H), h = (int)(it % H);
    const int64_t off = (int64_t)n * D + (int64_t)h * hd;
    const float *p = probs + it * T * S;
    float *dp = work + (int64_t)omp_get_thread_num() * T * S;
    /* dp (T, S) = dctx_nh (T, hd) v_nh^T; dv_nh (S, hd) = p^T (S, T) dctx_nh */
    kiln_sgemm_blas(false, true, T, S, hd, 1.0f, dctx + off, ld, v + off, ld, 0.0f, dp, S);
    kiln_sgemm_blas(true, false, S, hd, T, 1.0f, p, S, dctx + off, ld, 0.0f, dv + off, ld);
    /* Through the softmax: ds = p (dp - sum_s p dp), row by row. Masked keys have p = 0 and
     * so get no gradient; a row with no key to see is all 0 and passes none. */
    for (int t = 0; t < T; t++) {
      const float *pr = p + (int64_t)t * S;
      float *dr = dp + (int64_t)t * S;
      double dot = 0;
      for (int s = 0; s < S; s++) dot += (double)pr[s] * dr[s];
      for (int s = 0; s < S; s++) dr[s] = pr[s] * (dr[s] - (float)dot);
    }
    /* dq_nh (T, hd) = scale ds k_nh; dk_nh (S, hd) = scale ds^T q_nh */
    kiln_sgemm_blas(false, false, T, hd, S, scale, dp, S, k + off, ld, 0.0f, dq + off, ld);
    kiln_sgemm_blas(true, false, S, hd, T, scale, dp, S, q + off, ld, 0.0f, dk + off, ld);
  }
  kiln_blas_serial_end(blas_prev);
  return KILN_OK;
}
