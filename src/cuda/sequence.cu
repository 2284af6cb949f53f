/* The sequence family on the CUDA backend (KILN_OPS_SEQUENCE): the recurrent layers' cells and
 * packed per-step products, PositionalEncoding, SequencePool, MultiHeadAttention's pieces.
 *
 * The cells are one thread a state element, each its own arithmetic as on the host (tanhf where
 * the host takes its vectorised tanh: within the rows' tolerance). The products are the backend's
 * gemm: cuBLAS gives the same bits for the same shapes, so the host's fixed row blocks and packed
 * B (which exist for the host's threads and caches) have nothing to add. Attention runs its GEMMs
 * per (sequence, head) over strided views of the time-major arrays, as the host does, with one
 * kernel for the masked softmax of every row between them. */
#include <stdlib.h>

#include "cuda/kcuda.h"

/* ---- the packed GEMMs of the per-step products ----------------------------------------------- */

/* A plan is the product's shape remembered, and B: nothing to pack on the GPU. */
typedef struct {
  bool tb;
  int64_t M, N, K, lda, ldb, ldc;
  float beta;
  const float *B;
} kcuda_packed;

KCUDA_OP(packed_gemm_update)(const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M,
                             int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                             float beta) {
  (void)c;
  kcuda_packed *p = (kcuda_packed *)*pg;
  if (p && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda &&
      p->ldb == ldb && p->ldc == ldc && p->beta == beta)
    return KILN_OK;
  if (!p) {
    p = (kcuda_packed *)calloc(1, sizeof *p);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a packed GEMM");
    *pg = (kiln_packed_gemm *)p;
  }
  /* a new shape: B is set anew for it, as for a plan made fresh */
  p->tb = tb, p->M = M, p->N = N, p->K = K, p->lda = lda, p->ldb = ldb, p->ldc = ldc;
  p->beta = beta, p->B = NULL;
  return KILN_OK;
}

KCUDA_OP(packed_gemm_set_b)(const kiln_op_ctx *c, kiln_packed_gemm *pg, const float *B) {
  (void)c;
  ((kcuda_packed *)pg)->B = B;
  return KILN_OK;
}

KCUDA_OP(packed_gemm_run)(const kiln_op_ctx *c, kiln_packed_gemm *pg, float *C, const float *A) {
  const kcuda_packed *p = (const kcuda_packed *)pg;
  if (!p->B && p->M > 0 && p->N > 0 && p->K > 0)
    return kiln_errorf(KILN_ERR_INVALID, "packed GEMM run before its B was set");
  return KCUDA_FN(gemm)(c, C, p->ldc, A, p->lda, p->B, p->ldb, false, p->tb, p->M, p->N, p->K,
                        1.0f, p->beta);
}

KCUDA_OP(packed_gemm_free)(const kiln_op_ctx *c, kiln_packed_gemm *pg) {
  (void)c;
  free(pg);
  return KILN_OK;
}

/* ---- the state a step takes ------------------------------------------------------------------ */

KCUDA_GLOBAL void k_carry_rows(float *y, const float *x, int64_t ldx, const float *m, int64_t N,
                               int64_t H) {
  KCUDA_FOR(i, N * H) {
    const int64_t n = i / H, d = i % H;
    y[i] = m ? m[n] * x[n * ldx + d] : 0.0f;
  }
}

/* In place (y == x, ldx == H) each element is read and written by its own thread alone. */
KCUDA_OP(carry_rows)(const kiln_op_ctx *c, float *y, const float *x, int64_t ldx, const float *m,
                     int64_t N, int64_t H) {
  KCUDA_LAUNCH(c, N * H, k_carry_rows, y, x, ldx, m, N, H);
  return kcuda_launched(c, "carry_rows");
}

/* The logistic function as the host's cells take it. */
KCUDA_DEV float seq_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- LSTM (Caffe's LSTMUnit arithmetic) ------------------------------------------------------ */

KCUDA_GLOBAL void k_lstm_cell_fwd(float *cell, float *h, int64_t ldh, float *gates,
                                  const float *c_prev, const float *cont, int64_t N, int64_t H) {
  KCUDA_FOR(e, N * H) {
    const int64_t n = e / H, d = e % H;
    float *a = gates + n * 4 * H + d;
    const float cn = cont ? cont[n] : 0.0f;
    const float i = seq_sigmoid(a[0]);
    /* cont folded into the forget gate, 0 where cont is 0, as Caffe does */
    const float f = cn == 0 ? 0.0f : cn * seq_sigmoid(a[H]);
    const float o = seq_sigmoid(a[2 * H]);
    const float g = tanhf(a[3 * H]);
    const float cc = f * c_prev[e] + i * g;
    a[0] = i, a[H] = f, a[2 * H] = o, a[3 * H] = g;
    cell[e] = cc;
    h[n * ldh + d] = o * tanhf(cc);
  }
}

KCUDA_OP(lstm_cell_fwd)(const kiln_op_ctx *c, float *cell, float *h, int64_t ldh, float *gates,
                        const float *c_prev, const float *cont, int64_t N, int64_t H) {
  KCUDA_LAUNCH(c, N * H, k_lstm_cell_fwd, cell, h, ldh, gates, c_prev, cont, N, H);
  return kcuda_launched(c, "lstm_cell_fwd");
}

/* dgates or dc_prev may be NULL (not both: the op launches nothing then); dc_prev may be dc,
 * each element read before its own thread writes it. */
KCUDA_GLOBAL void k_lstm_cell_bwd(float *dc_prev, float *dgates, const float *gates,
                                  const float *cell, const float *c_prev, const float *dc,
                                  const float *dh, int64_t ldh, const float *dh2, int64_t N,
                                  int64_t H) {
  KCUDA_FOR(e, N * H) {
    const int64_t n = e / H, j = e % H;
    const float *a = gates + n * 4 * H + j;
    const float dh_e = dh2 ? dh[n * ldh + j] + dh2[e] : dh[n * ldh + j];
    const float i = a[0], f = a[H], o = a[2 * H], g = a[3 * H];
    const float tc = tanhf(cell[e]);
    const float dc_t = dc[e] + dh_e * o * (1 - tc * tc);
    if (dgates) {
      float *da = dgates + n * 4 * H + j;
      da[0] = dc_t * g * i * (1 - i);
      da[H] = dc_t * c_prev[e] * f * (1 - f);
      da[2 * H] = dh_e * tc * o * (1 - o);
      da[3 * H] = dc_t * i * (1 - g * g);
    }
    if (dc_prev) dc_prev[e] = dc_t * f;
  }
}

KCUDA_OP(lstm_cell_bwd)(const kiln_op_ctx *c, float *dc_prev, float *dgates, const float *gates,
                        const float *cell, const float *c_prev, const float *dc, const float *dh,
                        int64_t ldh, const float *dh2, int64_t N, int64_t H) {
  if (!dgates && !dc_prev) return KILN_OK;
  KCUDA_LAUNCH(c, N * H, k_lstm_cell_bwd, dc_prev, dgates, gates, cell, c_prev, dc, dh, ldh, dh2,
               N, H);
  return kcuda_launched(c, "lstm_cell_bwd");
}

/* ---- GRU (PyTorch's nn.GRU arithmetic) ------------------------------------------------------- */

KCUDA_GLOBAL void k_gru_cell_fwd(float *h, int64_t ldh, float *ghn, float *gates, const float *gh,
                                 const float *bh, const float *hp, int64_t N, int64_t H) {
  KCUDA_FOR(e, N * H) {
    const int64_t n = e / H, d = e % H;
    float *an = gates + n * 3 * H;
    const float *hn = gh + n * 3 * H;
    const float rr = seq_sigmoid(an[d] + hn[d] + bh[d]);
    const float z = seq_sigmoid(an[H + d] + hn[H + d] + bh[H + d]);
    const float g = hn[2 * H + d] + bh[2 * H + d];
    const float cc = tanhf(an[2 * H + d] + rr * g);
    /* kept for backward: the gates, and r's factor in n apart from the input's part */
    an[d] = rr, an[H + d] = z, an[2 * H + d] = cc;
    ghn[e] = g;
    h[n * ldh + d] = (1 - z) * cc + z * hp[e];
  }
}

KCUDA_OP(gru_cell_fwd)(const kiln_op_ctx *c, float *h, int64_t ldh, float *ghn, float *gates,
                       const float *gh, const float *bh, const float *hp, int64_t N, int64_t H) {
  KCUDA_LAUNCH(c, N * H, k_gru_cell_fwd, h, ldh, ghn, gates, gh, bh, hp, N, H);
  return kcuda_launched(c, "gru_cell_fwd");
}

/* h = (1 - z) n + z h', n = tanh(a_n + r g): dn = dh (1 - z), dz = dh (h' - n),
 * dr = dn (1 - n^2) g, and h' gets dh z directly. */
KCUDA_GLOBAL void k_gru_cell_bwd(float *d_in, float *d_rec, float *dh, const float *dy,
                                 int64_t ldy, const float *gates, const float *ghn,
                                 const float *hp, int64_t N, int64_t H) {
  KCUDA_FOR(e, N * H) {
    const int64_t n = e / H, j = e % H;
    const float *an = gates + n * 3 * H;
    const float rr = an[j], z = an[H + j], cc = an[2 * H + j];
    const float dh_t = dy[n * ldy + j] + dh[e];
    const float da_n = dh_t * (1 - z) * (1 - cc * cc);
    const float da_z = dh_t * (hp[e] - cc) * z * (1 - z);
    const float da_r = da_n * ghn[e] * rr * (1 - rr);
    float *din = d_in + n * 3 * H, *drn = d_rec + n * 3 * H;
    din[j] = drn[j] = da_r;
    din[H + j] = drn[H + j] = da_z;
    din[2 * H + j] = da_n;
    drn[2 * H + j] = da_n * rr;
    dh[e] = dh_t * z;
  }
}

KCUDA_OP(gru_cell_bwd)(const kiln_op_ctx *c, float *d_in, float *d_rec, float *dh,
                       const float *dy, int64_t ldy, const float *gates, const float *ghn,
                       const float *hp, int64_t N, int64_t H) {
  KCUDA_LAUNCH(c, N * H, k_gru_cell_bwd, d_in, d_rec, dh, dy, ldy, gates, ghn, hp, N, H);
  return kcuda_launched(c, "gru_cell_bwd");
}

/* ---- RNN ------------------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_rnn_step_fwd(float *h, int64_t n) {
  KCUDA_FOR(i, n) h[i] = tanhf(h[i]);
}

KCUDA_OP(rnn_step_fwd)(const kiln_op_ctx *c, float *h, int64_t n) {
  KCUDA_LAUNCH(c, n, k_rnn_step_fwd, h, n);
  return kcuda_launched(c, "rnn_step_fwd");
}

KCUDA_GLOBAL void k_rnn_step_bwd(float *d, const float *dh, const float *h, int64_t n) {
  KCUDA_FOR(i, n) d[i] = (d[i] + dh[i]) * (1 - h[i] * h[i]);
}

KCUDA_OP(rnn_step_bwd)(const kiln_op_ctx *c, float *d, const float *dh, const float *h,
                       int64_t n) {
  KCUDA_LAUNCH(c, n, k_rnn_step_bwd, d, dh, h, n);
  return kcuda_launched(c, "rnn_step_bwd");
}

KCUDA_GLOBAL void k_rnn_out_fwd(float *y, int64_t ldy, float *out, const float *b, int64_t M,
                                int64_t H) {
  KCUDA_FOR(e, M * H) {
    const int64_t m = e / H, d = e % H;
    const float v = tanhf(out[e] + b[d]);
    out[e] = v;
    y[m * ldy + d] = v;
  }
}

KCUDA_OP(rnn_out_fwd)(const kiln_op_ctx *c, float *y, int64_t ldy, float *out, const float *b,
                      int64_t M, int64_t H) {
  KCUDA_LAUNCH(c, M * H, k_rnn_out_fwd, y, ldy, out, b, M, H);
  return kcuda_launched(c, "rnn_out_fwd");
}

KCUDA_GLOBAL void k_rnn_out_bwd(float *dz, const float *dy, int64_t ldy, const float *out,
                                int64_t M, int64_t H) {
  KCUDA_FOR(e, M * H) {
    const int64_t m = e / H, d = e % H;
    dz[e] = dy[m * ldy + d] * (1 - out[e] * out[e]);
  }
}

KCUDA_OP(rnn_out_bwd)(const kiln_op_ctx *c, float *dz, const float *dy, int64_t ldy,
                      const float *out, int64_t M, int64_t H) {
  KCUDA_LAUNCH(c, M * H, k_rnn_out_bwd, dz, dy, ldy, out, M, H);
  return kcuda_launched(c, "rnn_out_bwd");
}

/* ---- PositionalEncoding ---------------------------------------------------------------------- */

/* In double, as the host's table: the same floats on either device. */
KCUDA_GLOBAL void k_sinusoid_table(float *table, int64_t from, int64_t rows, int64_t D) {
  KCUDA_FOR(i, rows * D) {
    const int64_t t = from + i / D, j = i % D;
    const double angle = (double)t / pow(10000.0, (double)(j - j % 2) / (double)D);
    table[t * D + j] = (float)(j % 2 ? cos(angle) : sin(angle));
  }
}

KCUDA_OP(sinusoid_table)(const kiln_op_ctx *c, float *table, int64_t from, int64_t T, int64_t D) {
  if (from >= T) return KILN_OK;
  KCUDA_LAUNCH(c, (T - from) * D, k_sinusoid_table, table, from, T - from, D);
  return kcuda_launched(c, "sinusoid_table");
}

KCUDA_GLOBAL void k_step_add(float *y, const float *x, const float *v, int64_t N, int64_t D,
                             int64_t n) {
  KCUDA_FOR(i, n) y[i] = x[i] + v[(i / (N * D)) * D + i % D];
}

KCUDA_OP(step_add)(const kiln_op_ctx *c, float *y, const float *x, const float *v, int64_t T,
                   int64_t N, int64_t D) {
  KCUDA_LAUNCH(c, T * N * D, k_step_add, y, x, v, N, D, T * N * D);
  return kcuda_launched(c, "step_add");
}

/* One thread a value of dv, the sequences added in order: the host's sum, bit for bit. */
KCUDA_GLOBAL void k_step_sum_into(float *dv, const float *dy, int64_t T, int64_t N, int64_t D) {
  KCUDA_FOR(i, T * D) {
    const int64_t t = i / D, j = i % D;
    float s = dv[i];
    for (int64_t n = 0; n < N; n++) s += dy[(t * N + n) * D + j];
    dv[i] = s;
  }
}

KCUDA_OP(step_sum_into)(const kiln_op_ctx *c, float *dv, const float *dy, int64_t T, int64_t N,
                        int64_t D) {
  KCUDA_LAUNCH(c, T * D, k_step_sum_into, dv, dy, T, N, D);
  return kcuda_launched(c, "step_sum_into");
}

/* ---- SequencePool ---------------------------------------------------------------------------- */

KCUDA_DEV bool seq_valid(const float *mask, int64_t t, int64_t n, int64_t N) {
  return !mask || mask[t * N + n] != 0;
}

/* count[n] and last[n] (-1: none) of sequence n's valid steps. */
KCUDA_GLOBAL void k_seq_valid(int64_t *count, int64_t *last, const float *mask, int64_t T,
                              int64_t N) {
  KCUDA_FOR(n, N) {
    int64_t k = 0, at = -1;
    for (int64_t t = 0; t < T; t++)
      if (seq_valid(mask, t, n, N)) k++, at = t;
    count[n] = k;
    last[n] = at;
  }
}

/* bad[0] = the first sequence without a valid step, -1 when none: one thread, N values. */
KCUDA_GLOBAL void k_seq_first_empty(int64_t *bad, const int64_t *count, int64_t N) {
  KCUDA_FOR(i, 1) {
    int64_t at = -1;
    for (int64_t n = 0; n < N && at < 0; n++)
      if (count[n] == 0) at = n;
    bad[0] = at;
  }
}

KCUDA_GLOBAL void k_seq_pool_fwd(float *y, float *arg, const float *x, const float *mask,
                                 const int64_t *count, const int64_t *last, int64_t T, int64_t N,
                                 int64_t D, int pool) {
  KCUDA_FOR(i, N * D) {
    const int64_t n = i / D, d = i % D, k = count[n], ln = last[n];
    if (k == 0) continue; /* the op reports it */
    if (pool == KILN_SEQ_POOL_LAST) {
      y[i] = x[(ln * N + n) * D + d];
    } else if (pool == KILN_SEQ_POOL_MEAN) {
      double sum = 0;
      for (int64_t t = 0; t < T; t++)
        if (seq_valid(mask, t, n, N)) sum += x[(t * N + n) * D + d];
      y[i] = (float)(sum / (double)k);
    } else {
      float best = -INFINITY;
      int64_t at = ln;
      for (int64_t t = 0; t < T; t++) {
        const float v = x[(t * N + n) * D + d];
        if (seq_valid(mask, t, n, N) && v > best) best = v, at = t;
      }
      y[i] = best;
      arg[i] = (float)at;
    }
  }
}

/* The valid steps' counts and last steps into scratch (count, last, then one more value). */
static int seq_valid_steps(const kiln_op_ctx *c, int64_t **scratch, const float *mask, int64_t T,
                           int64_t N) {
  void *s;
  KILN_TRY(kcuda_scratch(c, sizeof(int64_t) * (size_t)(2 * N + 1), &s));
  *scratch = (int64_t *)s;
  KCUDA_LAUNCH(c, N, k_seq_valid, *scratch, *scratch + N, mask, T, N);
  return KILN_OK;
}

KCUDA_OP(seq_pool_fwd)(const kiln_op_ctx *c, float *y, float *arg, const float *x,
                       const float *mask, int64_t T, int64_t N, int64_t D, kiln_seq_pool pool) {
  if (N <= 0) return KILN_OK;
  if (T <= 0)
    return kiln_errorf(KILN_ERR_DATA, "sequence 0 of the batch has no valid step in the mask");
  int64_t *s;
  KILN_TRY(seq_valid_steps(c, &s, mask, T, N));
  KCUDA_LAUNCH(c, N * D, k_seq_pool_fwd, y, arg, x, mask, s, s + N, T, N, D, (int)pool);
  if (mask) KCUDA_LAUNCH(c, 1, k_seq_first_empty, s + 2 * N, s, N);
  KILN_TRY(kcuda_launched(c, "seq_pool_fwd"));
  if (!mask) return KILN_OK; /* every step valid, T > 0 */
  int64_t bad = -1;
  KILN_TRY(kiln_device_to_host(c->device, &bad, s + 2 * N, sizeof bad));
  if (bad >= 0)
    return kiln_errorf(KILN_ERR_DATA, "sequence %lld of the batch has no valid step in the mask",
                       (long long)bad);
  return KILN_OK;
}

/* One thread a value of dx: dy where the forward took the step, 0 elsewhere. */
KCUDA_GLOBAL void k_seq_pool_bwd(float *dx, const float *dy, const float *arg, const float *mask,
                                 const int64_t *count, const int64_t *last, int64_t T, int64_t N,
                                 int64_t D, int pool) {
  KCUDA_FOR(i, T * N * D) {
    const int64_t t = i / (N * D), n = (i / D) % N, d = i % D, k = count[n];
    float v = 0.0f;
    if (k > 0) {
      const float g = dy[n * D + d];
      if (pool == KILN_SEQ_POOL_LAST) v = t == last[n] ? g : 0.0f;
      else if (pool == KILN_SEQ_POOL_MEAN) v = seq_valid(mask, t, n, N) ? g / (float)k : 0.0f;
      else v = (int64_t)arg[n * D + d] == t ? g : 0.0f;
    }
    dx[i] = v;
  }
}

KCUDA_OP(seq_pool_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *arg,
                       const float *mask, int64_t T, int64_t N, int64_t D, kiln_seq_pool pool) {
  if (N <= 0 || T <= 0) return KILN_OK;
  int64_t *s;
  KILN_TRY(seq_valid_steps(c, &s, mask, T, N));
  KCUDA_LAUNCH(c, T * N * D, k_seq_pool_bwd, dx, dy, arg, mask, s, s + N, T, N, D, (int)pool);
  return kcuda_launched(c, "seq_pool_bwd");
}

/* ---- the projections ------------------------------------------------------------------------- */

/* The host's row blocks keep its bits off its thread count; cuBLAS's bits are the shapes' already. */
KCUDA_OP(gemm_rows)(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                    const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                    int64_t K, float alpha, float beta) {
  return KCUDA_FN(gemm)(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
}

/* part[p][n] = the sum in double of column n over rows [p KCUDA_CHUNK, (p + 1) KCUDA_CHUNK). */
KCUDA_GLOBAL void k_col_parts(double *part, const float *dy, int64_t M, int64_t N, int64_t parts) {
  KCUDA_FOR(i, parts * N) {
    const int64_t p = i / N, n = i % N;
    const int64_t m1 = (p + 1) * KCUDA_CHUNK < M ? (p + 1) * KCUDA_CHUNK : M;
    double s = 0;
    for (int64_t m = p * KCUDA_CHUNK; m < m1; m++) s += dy[m * N + n];
    part[i] = s;
  }
}

KCUDA_GLOBAL void k_col_sum_into(float *db, const double *part, int64_t N, int64_t parts) {
  KCUDA_FOR(n, N) {
    double s = 0;
    for (int64_t p = 0; p < parts; p++) s += part[p * N + n];
    db[n] += (float)s;
  }
}

/* Two passes over fixed chunks of rows: the sum's order is the shapes', never the grid's. */
KCUDA_OP(sum_rows_double_into)(const kiln_op_ctx *c, float *db, const float *dy, int64_t M,
                               int64_t N) {
  if (M <= 0 || N <= 0) return KILN_OK;
  const int64_t parts = (M + KCUDA_CHUNK - 1) / KCUDA_CHUNK;
  void *s;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(parts * N), &s));
  double *part = (double *)s;
  KCUDA_LAUNCH(c, parts * N, k_col_parts, part, dy, M, N, parts);
  KCUDA_LAUNCH(c, N, k_col_sum_into, db, part, N, parts);
  return kcuda_launched(c, "sum_rows_double_into");
}

/* first[p] = the first index of chunk p whose value is neither 0 nor 1, -1 when none. */
KCUDA_GLOBAL void k_mask_parts(int64_t *first, const float *mask, int64_t n, int64_t parts) {
  KCUDA_FOR(p, parts) {
    const int64_t i1 = (p + 1) * KCUDA_CHUNK < n ? (p + 1) * KCUDA_CHUNK : n;
    int64_t at = -1;
    for (int64_t i = p * KCUDA_CHUNK; i < i1 && at < 0; i++)
      if (mask[i] != 0 && mask[i] != 1) at = i;
    first[p] = at;
  }
}

KCUDA_GLOBAL void k_mask_first(int64_t *bad, const int64_t *first, int64_t parts) {
  KCUDA_FOR(i, 1) {
    int64_t at = -1;
    for (int64_t p = 0; p < parts && at < 0; p++) at = first[p];
    bad[0] = at;
  }
}

KCUDA_OP(mask_check)(const kiln_op_ctx *c, const float *mask, int64_t S, int64_t N) {
  const int64_t n = S * N;
  if (n <= 0) return KILN_OK;
  const int64_t parts = (n + KCUDA_CHUNK - 1) / KCUDA_CHUNK;
  void *s;
  KILN_TRY(kcuda_scratch(c, sizeof(int64_t) * (size_t)(parts + 1), &s));
  int64_t *first = (int64_t *)s;
  KCUDA_LAUNCH(c, parts, k_mask_parts, first, mask, n, parts);
  KCUDA_LAUNCH(c, 1, k_mask_first, first + parts, first, parts);
  KILN_TRY(kcuda_launched(c, "mask_check"));
  int64_t bad = -1;
  KILN_TRY(kiln_device_to_host(c->device, &bad, first + parts, sizeof bad));
  if (bad < 0) return KILN_OK;
  float v = 0;
  KILN_TRY(kiln_device_to_host(c->device, &v, mask + bad, sizeof v));
  return kiln_errorf(KILN_ERR_DATA,
                     "the padding mask holds %g at step %lld of sequence %lld: expected 1 "
                     "(valid) or 0 (padding)",
                     (double)v, (long long)(bad / N), (long long)(bad % N));
}

/* ---- attention ------------------------------------------------------------------------------- */

/* Row r = (n H + h) T + t of the scores (S values) into weights, in place: softmax over the keys
 * query t may see (valid[s N + n] != 0, causal: s <= t), the others 0, a row that sees no key all
 * 0; the maximum subtracted before exp, the sum in double, as the host's. */
KCUDA_GLOBAL void k_att_softmax(float *p, const float *valid, int64_t rows, int64_t T, int64_t S,
                                int64_t N, int64_t H, bool causal) {
  KCUDA_FOR(r, rows) {
    float *row = p + r * S;
    const int64_t t = r % T, n = r / T / H;
    const int64_t send = causal && t + 1 < S ? t + 1 : S;
    float mx = -INFINITY;
    for (int64_t s = 0; s < send; s++)
      if ((!valid || valid[s * N + n] != 0) && row[s] > mx) mx = row[s];
    if (mx == -INFINITY) {
      for (int64_t s = 0; s < S; s++) row[s] = 0;
      continue;
    }
    double sum = 0;
    for (int64_t s = 0; s < S; s++) {
      const bool on = s < send && (!valid || valid[s * N + n] != 0);
      const float e = on ? expf(row[s] - mx) : 0.0f;
      row[s] = e;
      sum += e;
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t s = 0; s < S; s++) row[s] *= inv;
  }
}

KCUDA_OP(attention_fwd)(const kiln_op_ctx *c, float *ctx, float *probs, const float *q,
                        const float *k, const float *v, const float *valid, int T, int S, int N,
                        int H, int hd, float scale, bool causal) {
  const int64_t D = (int64_t)H * hd, ld = (int64_t)N * D, items = (int64_t)N * H;
  const int64_t TS = (int64_t)T * S;
  if (T <= 0 || items <= 0) return KILN_OK;
  /* scores (T, S) = scale q_nh (T, hd) k_nh^T, a head's rows ld apart in the T x N x D arrays */
  for (int64_t it = 0; it < items; it++) {
    const int64_t off = (it / H) * D + (it % H) * hd;
    KILN_TRY(KCUDA_FN(gemm)(c, probs + it * TS, S, q + off, ld, k + off, ld, false, true, T, S, hd,
                            scale, 0.0f));
  }
  KCUDA_LAUNCH(c, items * T, k_att_softmax, probs, valid, items * T, (int64_t)T, (int64_t)S,
               (int64_t)N, (int64_t)H, causal);
  KILN_TRY(kcuda_launched(c, "attention_fwd"));
  /* ctx_nh (T, hd) = p (T, S) v_nh (S, hd) */
  for (int64_t it = 0; it < items; it++) {
    const int64_t off = (it / H) * D + (it % H) * hd;
    KILN_TRY(KCUDA_FN(gemm)(c, ctx + off, ld, probs + it * TS, S, v + off, ld, false, false, T, hd,
                            S, 1.0f, 0.0f));
  }
  return kcuda_launched(c, "attention_fwd");
}

/* Through the softmax, row by row: ds = p (dp - sum_s p dp), the dot in double. Masked keys have
 * p = 0 and get no gradient. */
KCUDA_GLOBAL void k_att_softmax_bwd(float *dp, const float *p, int64_t rows, int64_t S) {
  KCUDA_FOR(r, rows) {
    const float *pr = p + r * S;
    float *dr = dp + r * S;
    double dot = 0;
    for (int64_t s = 0; s < S; s++) dot += (double)pr[s] * dr[s];
    for (int64_t s = 0; s < S; s++) dr[s] = pr[s] * (dr[s] - (float)dot);
  }
}

/* Every item's dp at once in scratch (the size of probs), so that one kernel takes all the rows;
 * `work` is sized for the host's per-thread rows and is not used. */
KCUDA_OP(attention_bwd)(const kiln_op_ctx *c, float *dq, float *dk, float *dv, float *work,
                        const float *dctx, const float *probs, const float *q, const float *k,
                        const float *v, int T, int S, int N, int H, int hd, float scale) {
  (void)work;
  const int64_t D = (int64_t)H * hd, ld = (int64_t)N * D, items = (int64_t)N * H;
  const int64_t TS = (int64_t)T * S;
  if (items <= 0 || hd <= 0) return KILN_OK;
  if (T <= 0 || S <= 0) {
    /* nothing attended: no gradient flows */
    if (T > 0) KILN_TRY(kiln_device_set(c->device, dq, 0, sizeof(float) * (size_t)(T * ld)));
    if (S > 0) {
      KILN_TRY(kiln_device_set(c->device, dk, 0, sizeof(float) * (size_t)(S * ld)));
      KILN_TRY(kiln_device_set(c->device, dv, 0, sizeof(float) * (size_t)(S * ld)));
    }
    return KILN_OK;
  }
  void *s;
  KILN_TRY(kcuda_scratch(c, sizeof(float) * (size_t)(items * TS), &s));
  float *dp = (float *)s;
  /* dp (T, S) = dctx_nh (T, hd) v_nh^T; dv_nh (S, hd) = p^T (S, T) dctx_nh */
  for (int64_t it = 0; it < items; it++) {
    const int64_t off = (it / H) * D + (it % H) * hd;
    KILN_TRY(KCUDA_FN(gemm)(c, dp + it * TS, S, dctx + off, ld, v + off, ld, false, true, T, S, hd,
                            1.0f, 0.0f));
    KILN_TRY(KCUDA_FN(gemm)(c, dv + off, ld, probs + it * TS, S, dctx + off, ld, true, false, S,
                            hd, T, 1.0f, 0.0f));
  }
  KCUDA_LAUNCH(c, items * T, k_att_softmax_bwd, dp, probs, items * T, (int64_t)S);
  KILN_TRY(kcuda_launched(c, "attention_bwd"));
  /* dq_nh (T, hd) = scale ds k_nh; dk_nh (S, hd) = scale ds^T q_nh */
  for (int64_t it = 0; it < items; it++) {
    const int64_t off = (it / H) * D + (it % H) * hd;
    KILN_TRY(KCUDA_FN(gemm)(c, dq + off, ld, dp + it * TS, S, k + off, ld, false, false, T, hd, S,
                            scale, 0.0f));
    KILN_TRY(KCUDA_FN(gemm)(c, dk + off, ld, dp + it * TS, S, q + off, ld, true, false, S, hd, T,
                            scale, 0.0f));
  }
  return kcuda_launched(c, "attention_bwd");
}

KCUDA_REGISTER(sequence) {
  b->packed_gemm_update = KCUDA_FN(packed_gemm_update);
  b->packed_gemm_set_b = KCUDA_FN(packed_gemm_set_b);
  b->packed_gemm_run = KCUDA_FN(packed_gemm_run);
  b->packed_gemm_free = KCUDA_FN(packed_gemm_free);
  b->carry_rows = KCUDA_FN(carry_rows);
  b->lstm_cell_fwd = KCUDA_FN(lstm_cell_fwd);
  b->lstm_cell_bwd = KCUDA_FN(lstm_cell_bwd);
  b->gru_cell_fwd = KCUDA_FN(gru_cell_fwd);
  b->gru_cell_bwd = KCUDA_FN(gru_cell_bwd);
  b->rnn_step_fwd = KCUDA_FN(rnn_step_fwd);
  b->rnn_step_bwd = KCUDA_FN(rnn_step_bwd);
  b->rnn_out_fwd = KCUDA_FN(rnn_out_fwd);
  b->rnn_out_bwd = KCUDA_FN(rnn_out_bwd);
  b->sinusoid_table = KCUDA_FN(sinusoid_table);
  b->step_add = KCUDA_FN(step_add);
  b->step_sum_into = KCUDA_FN(step_sum_into);
  b->seq_pool_fwd = KCUDA_FN(seq_pool_fwd);
  b->seq_pool_bwd = KCUDA_FN(seq_pool_bwd);
  b->gemm_rows = KCUDA_FN(gemm_rows);
  b->sum_rows_double_into = KCUDA_FN(sum_rows_double_into);
  b->mask_check = KCUDA_FN(mask_check);
  b->attention_fwd = KCUDA_FN(attention_fwd);
  b->attention_bwd = KCUDA_FN(attention_bwd);
}
