/* Scaled dot-product attention of several heads over time-major projections (the core of the
 * MultiHeadAttention layer, between its in- and out-projections). One (sequence, head) pair is
 * one work item: its scores, masked softmax and weighted sum are GEMMs over strided views of the
 * T x N x D arrays, so no head is ever copied out. Items write disjoint memory and each is the
 * same GEMM calls on one BLAS thread whichever OpenMP thread runs it, so the results do not
 * depend on the thread count. */
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "kiln/ops.h"

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

void kiln_attention_forward(float *ctx, float *probs, const float *q, const float *k,
                            const float *v, const float *valid, int T, int S, int N, int H,
                            int hd, float scale, bool causal, int nthreads) {
  const int D = H * hd, ld = N * D;
  const int64_t items = (int64_t)N * H;
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static) num_threads(team_size(nthreads, items))
  for (int64_t it = 0; it < items; it++) {
    const int n = (int)(it / H), h = (int)(it % H);
    const int64_t off = (int64_t)n * D + (int64_t)h * hd;
    float *p = probs + it * T * S;
    /* scores (T, S) = scale q_nh (T, hd) k_nh^T (hd, S) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, S, hd, scale, q + off, ld, k + off,
                ld, 0.0f, p, S);
    for (int t = 0; t < T; t++)
      masked_softmax_row(p + (int64_t)t * S, t, S, valid ? valid + n : NULL, N, causal);
    /* ctx_nh (T, hd) = p (T, S) v_nh (S, hd) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, S, 1.0f, p, S, v + off, ld,
                0.0f, ctx + off, ld);
  }
  kiln_blas_serial_end(blas_prev);
}

void kiln_attention_backward(float *dq, float *dk, float *dv, const float *dctx,
                             const float *probs, const float *q, const float *k, const float *v,
                             int T, int S, int N, int H, int hd, float scale, float *work,
                             int nthreads) {
  const int D = H * hd, ld = N * D;
  const int64_t items = (int64_t)N * H;
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static) num_threads(team_size(nthreads, items))
  for (int64_t it = 0; it < items; it++) {
    const int n = (int)(it / H), h = (int)(it % H);
    const int64_t off = (int64_t)n * D + (int64_t)h * hd;
    const float *p = probs + it * T * S;
    float *dp = work + (int64_t)omp_get_thread_num() * T * S;
    /* dp (T, S) = dctx_nh (T, hd) v_nh^T; dv_nh (S, hd) = p^T (S, T) dctx_nh */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, S, hd, 1.0f, dctx + off, ld, v + off,
                ld, 0.0f, dp, S);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, T, 1.0f, p, S, dctx + off, ld,
                0.0f, dv + off, ld);
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, S, scale, dp, S, k + off, ld,
                0.0f, dq + off, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, T, scale, dp, S, q + off, ld,
                0.0f, dk + off, ld);
  }
  kiln_blas_serial_end(blas_prev);
}
