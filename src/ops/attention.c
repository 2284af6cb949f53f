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
#include <pthread.h>
#include <stdlib.h>

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

/* ---- attention in bf16 (the cpu-bf16 backend) ------------------------------------------------ */

/* The scores, the weighted sums and their gradients as batched bf16 products over the (sequence,
 * head) items (kiln_bmm_bf16): each operand is first rounded into a bf16 copy laid out item by
 * item, (N, H, rows, hd) or its transpose where oneDNN needs the contracted axis inside; the masked
 * softmax and its gradient stay fp32, on the fp32 scores. The copies are a buffer kept between
 * calls (grown to the largest), as the GEMMs' are. Without a JIT kernel for a shape the op is the
 * fp32 one. */
static pthread_mutex_t att_lock = PTHREAD_MUTEX_INITIALIZER;
static uint16_t *att_buf;
static size_t att_cap;
static float *att_dp;
static size_t att_dp_cap;

static uint16_t *att_take(size_t n16, size_t nf) {
  if (n16 > att_cap) {
    free(att_buf);
    att_buf = aligned_alloc(64, (n16 * 2 + 63) / 64 * 64);
    att_cap = att_buf ? n16 : 0;
  }
  if (nf > att_dp_cap) {
    free(att_dp);
    att_dp = aligned_alloc(64, (nf * 4 + 63) / 64 * 64);
    att_dp_cap = att_dp ? nf : 0;
  }
  return att_buf && (nf == 0 || att_dp) ? att_buf : NULL;
}

/* y (N, H, R, hd) = x (R x N x D, time-major) rounded, item by item. */
static void gather_rows(const kiln_op_ctx *c, uint16_t *y, const float *x, int R, int N, int H,
                        int hd) {
  const int64_t items = (int64_t)N * H, D = (int64_t)H * hd;
#pragma omp parallel for schedule(static) num_threads(team_size(c->nthreads, items))
  for (int64_t it = 0; it < items; it++) {
    const int64_t n = it / H, h = it % H;
    for (int r = 0; r < R; r++)
      kiln_bf16_from_f32(y + (it * R + r) * hd, x + (int64_t)r * N * D + n * D + h * hd, hd);
  }
}

/* y = x rounded ((items, R, C) both), or transposed into (items, C, R). */
static void round_items(const kiln_op_ctx *c, uint16_t *y, const float *x, int64_t items, int R,
                        int C, bool transpose) {
#pragma omp parallel for schedule(static) num_threads(team_size(c->nthreads, items))
  for (int64_t it = 0; it < items; it++) {
    const float *xi = x + it * R * C;
    uint16_t *yi = y + it * R * C;
    if (!transpose) kiln_bf16_from_f32(yi, xi, (int64_t)R * C);
    else
      for (int r = 0; r < R; r++)
        for (int cc = 0; cc < C; cc++) yi[(int64_t)cc * R + r] = kiln_bf16_of(xi[(int64_t)r * C + cc]);
  }
}

/* One batched product on the op's threads. */
static bool bmm(const kiln_op_ctx *c, int N, int H, int64_t M, int64_t Nc, int64_t K, float alpha,
                const uint16_t *A, const uint16_t *B, const int64_t bs[4], float *C,
                const int64_t cs[4]) {
  bool ok = false;
  KILN_ON_OP_THREADS(c, ok = kiln_bmm_bf16(N, H, M, Nc, K, alpha, A, B, bs, C, cs));
  return ok;
}

int kiln_bf16_attention_fwd(const kiln_op_ctx *c, float *ctx, float *probs, const float *q,
                            const float *k, const float *v, const float *valid, int T, int S,
                            int N, int H, int hd, float scale, bool causal) {
  const int64_t D = (int64_t)H * hd, items = (int64_t)N * H;
  const size_t nq = (size_t)(items * T * hd), nk = (size_t)(items * S * hd);
  const size_t np = (size_t)(items * T * S);
  pthread_mutex_lock(&att_lock);
  uint16_t *q16 = att_take(nq + 2 * nk + np, 0);
  bool ok = q16 != NULL;
  if (ok) {
    uint16_t *k16 = q16 + nq, *v16 = k16 + nk, *p16 = v16 + nk;
    gather_rows(c, q16, q, T, N, H, hd);
    gather_rows(c, k16, k, S, N, H, hd);
    gather_rows(c, v16, v, S, N, H, hd);
    /* scores (N, H, T, S) = scale q k^T: k's copy (N, H, S, hd) read as (N, H, hd, S) */
    const int64_t kt[4] = {H * S * hd, S * hd, 1, hd}, pc[4] = {H * T * S, T * S, S, 1};
    ok = bmm(c, N, H, T, S, hd, scale, q16, k16, kt, probs, pc);
    if (ok) {
#pragma omp parallel for schedule(static) num_threads(team_size(c->nthreads, items))
      for (int64_t it = 0; it < items; it++)
        for (int t = 0; t < T; t++)
          masked_softmax_row(probs + (it * T + t) * S, t, S, valid ? valid + it / H : NULL, N,
                             causal);
      round_items(c, p16, probs, items, T, S, false);
      /* ctx (T x N x D, as (N, H, T, hd)) = p v */
      const int64_t vb[4] = {H * S * hd, S * hd, hd, 1}, cc[4] = {D, hd, N * D, 1};
      ok = bmm(c, N, H, T, hd, S, 1.0f, p16, v16, vb, ctx, cc);
    }
  }
  pthread_mutex_unlock(&att_lock);
  if (ok) return KILN_OK;
  return kiln_ref_attention_fwd(c, ctx, probs, q, k, v, valid, T, S, N, H, hd, scale, causal);
}

int kiln_bf16_attention_bwd(const kiln_op_ctx *c, float *dq, float *dk, float *dv, float *work,
                            const float *dctx, const float *probs, const float *q, const float *k,
                            const float *v, int T, int S, int N, int H, int hd, float scale) {
  const int64_t D = (int64_t)H * hd, items = (int64_t)N * H;
  const size_t nq = (size_t)(items * T * hd), nk = (size_t)(items * S * hd);
  const size_t np = (size_t)(items * T * S);
  pthread_mutex_lock(&att_lock);
  /* dctx, q (N, H, T, hd); k, v (N, H, S, hd); p^T, ds, ds^T (N, H, .., ..) */
  uint16_t *g16 = att_take(2 * nq + 2 * nk + 3 * np, np);
  bool ok = g16 != NULL;
  if (ok) {
    uint16_t *q16 = g16 + nq, *k16 = q16 + nq, *v16 = k16 + nk, *pt16 = v16 + nk;
    uint16_t *ds16 = pt16 + np, *dst16 = ds16 + np;
    float *dp = att_dp;
    gather_rows(c, g16, dctx, T, N, H, hd);
    gather_rows(c, q16, q, T, N, H, hd);
    gather_rows(c, k16, k, S, N, H, hd);
    gather_rows(c, v16, v, S, N, H, hd);
    round_items(c, pt16, probs, items, T, S, true);
    const int64_t pc[4] = {H * T * S, T * S, S, 1}, oc[4] = {D, hd, N * D, 1};
    const int64_t vt[4] = {H * S * hd, S * hd, 1, hd};   /* v's copy as (N, H, hd, S) */
    const int64_t tb[4] = {H * T * hd, T * hd, hd, 1};   /* dctx's or q's copy as it is */
    const int64_t sb[4] = {H * S * hd, S * hd, hd, 1};   /* k's copy as it is */
    /* dp (N, H, T, S) = dctx v^T; dv (S x N x D) = p^T dctx */
    ok = bmm(c, N, H, T, S, hd, 1.0f, g16, v16, vt, dp, pc) &&
         bmm(c, N, H, S, hd, T, 1.0f, pt16, g16, tb, dv, oc);
    if (ok) {
      /* through the softmax in fp32, as the fp32 kernel */
#pragma omp parallel for schedule(static) num_threads(team_size(c->nthreads, items))
      for (int64_t it = 0; it < items; it++)
        for (int t = 0; t < T; t++) {
          const float *pr = probs + (it * T + t) * S;
          float *dr = dp + (it * T + t) * S;
          double dot = 0;
          for (int s = 0; s < S; s++) dot += (double)pr[s] * dr[s];
          for (int s = 0; s < S; s++) dr[s] = pr[s] * (dr[s] - (float)dot);
        }
      round_items(c, ds16, dp, items, T, S, false);
      round_items(c, dst16, dp, items, T, S, true);
      /* dq = scale ds k; dk = scale ds^T q */
      ok = bmm(c, N, H, T, hd, S, scale, ds16, k16, sb, dq, oc) &&
           bmm(c, N, H, S, hd, T, scale, dst16, q16, tb, dk, oc);
    }
  }
  pthread_mutex_unlock(&att_lock);
  if (ok) return KILN_OK;
  return kiln_ref_attention_bwd(c, dq, dk, dv, work, dctx, probs, q, k, v, T, S, N, H, hd, scale);
}
