/* The sequence family's kernels besides attention (include/kiln/backend.h, KILN_OPS_SEQUENCE;
 * attention.c holds MultiHeadAttention's): the packed GEMMs of a recurrent layer's per-step
 * products, the cells of LSTM, GRU and RNN steps, PositionalEncoding and SequencePool.
 *
 * A recurrent layer's step is a product with its recurrent weights W_h, the same over the T
 * steps of a pass, then a cell over the N x H state: a packed GEMM serves the product with W_h
 * packed once (gemm.c's kiln_packed_gemm: oneDNN's blocked layout on the cpu backend where it
 * wins, OpenBLAS as it lies on the reference), and the cells are loops over the state, each
 * element its own arithmetic (vectorised through vmath.h's tanh and logistic function), split
 * over the op's threads from KILN_PARALLEL_FROM elements. Nothing here depends on the thread
 * count for its bits. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kiln/ops.h"
#include "ops/kernels.h"
#include "ops/vmath.h"

/* ---- the packed GEMMs of the per-step products --------------------------------------------- */

/* The reference's packed GEMMs are OpenBLAS's route alone: what kiln_packed_gemm takes under the
 * reference engine, whatever the layer's configuration. */
static const kiln_config blas_only = {.engine = KILN_ENGINE_REF};

static int pg_update(const kiln_op_ctx *c, const kiln_config *cfg, kiln_packed_gemm **pg,
                     bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                     int64_t ldc, float beta) {
  int rc = KILN_OK;
  /* made on the threads it will run on: oneDNN fixes a primitive's threads when making it */
  KILN_ON_OP_THREADS(c, rc = kiln_packed_gemm_update(pg, cfg, tb, M, N, K, lda, ldb, beta, ldc));
  return rc;
}

int kiln_ref_packed_gemm_update(const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M,
                                int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                                float beta) {
  return pg_update(c, &blas_only, pg, tb, M, N, K, lda, ldb, ldc, beta);
}

int kiln_cpu_packed_gemm_update(const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M,
                                int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                                float beta) {
  return pg_update(c, c->config, pg, tb, M, N, K, lda, ldb, ldc, beta);
}

int kiln_ref_packed_gemm_set_b(const kiln_op_ctx *c, kiln_packed_gemm *pg, const float *B) {
  KILN_ON_OP_THREADS(c, kiln_packed_gemm_set_b(pg, B));
  return KILN_OK;
}

int kiln_ref_packed_gemm_run(const kiln_op_ctx *c, kiln_packed_gemm *pg, float *C, const float *A) {
  KILN_ON_OP_THREADS(c, kiln_packed_gemm_run(pg, A, C));
  return KILN_OK;
}

int kiln_ref_packed_gemm_free(const kiln_op_ctx *c, kiln_packed_gemm *pg) {
  (void)c;
  kiln_packed_gemm_destroy(pg);
  return KILN_OK;
}

/* ---- the state a step takes ------------------------------------------------------------------ */

int kiln_ref_carry_rows(const kiln_op_ctx *c, float *y, const float *x, int64_t ldx,
                        const float *m, int64_t N, int64_t H) {
  (void)c;
  for (int64_t n = 0; n < N; n++)
    for (int64_t d = 0; d < H; d++) y[n * H + d] = m ? m[n] * x[n * ldx + d] : 0.0f;
  return KILN_OK;
}

/* ---- LSTM (Caffe's LSTMUnit arithmetic, for the LSTM layer and LSTMUnit alike) ------------- */

/* One cell. a[0], a[H], a[2H], a[3H]: the pre-activations of the unit's gates (input, forget,
 * output, candidate), replaced by the gates' values. Caffe folds cont into the forget gate (0
 * when cont is 0) and its backward takes f (1 - f) of that product as the gate's derivative;
 * both are kept (exact for cont in {0, 1}). Returns the cell c = f c_prev + i g; *h = o tanh(c).
 * Written to vectorise inside an `omp simd` loop over the units. */
static inline float lstm_cell(float *a, int64_t H, float cont, float c_prev, float *h) {
  const float i = kiln_vsigmoidf(a[0]);
  const float f = cont == 0 ? 0.0f : cont * kiln_vsigmoidf(a[H]);
  const float o = kiln_vsigmoidf(a[2 * H]);
  const float g = kiln_vtanhf(a[3 * H]);
  const float c = f * c_prev + i * g;
  a[0] = i, a[H] = f, a[2 * H] = o, a[3 * H] = g;
  *h = o * kiln_vtanhf(c);
  return c;
}

/* Its backward: from the gates' values a (as lstm_cell left them), the cell c and c_prev, and
 * the gradients dc of the cell (from later steps) and dh of the output, writes the four
 * pre-activations' gradients at da[0], da[H], da[2H], da[3H] and returns c_prev's gradient. */
static inline float lstm_cell_backward(const float *a, int64_t H, float c, float c_prev, float dc,
                                       float dh, float *da) {
  const float i = a[0], f = a[H], o = a[2 * H], g = a[3 * H];
  const float tc = kiln_vtanhf(c);
  const float dc_t = dc + dh * o * (1 - tc * tc);
  da[0] = dc_t * g * i * (1 - i);
  da[H] = dc_t * c_prev * f * (1 - f);
  da[2 * H] = dh * tc * o * (1 - o);
  da[3 * H] = dc_t * i * (1 - g * g);
  return dc_t * f;
}

/* c_prev's gradient alone, by the same expressions. */
static inline float lstm_cell_dc_prev(const float *a, int64_t H, float c, float dc, float dh) {
  const float f = a[H], o = a[2 * H];
  const float tc = kiln_vtanhf(c);
  const float dc_t = dc + dh * o * (1 - tc * tc);
  return dc_t * f;
}

int kiln_ref_lstm_cell_fwd(const kiln_op_ctx *c, float *cell, float *h, int64_t ldh, float *gates,
                           const float *c_prev, const float *cont, int64_t N, int64_t H) {
  const int64_t G = 4 * H;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * H > KILN_PARALLEL_FROM)
  for (int64_t n = 0; n < N; n++) {
    float *an = gates + n * G;
    const float cn = cont ? cont[n] : 0.0f;
#pragma omp simd
    for (int64_t d = 0; d < H; d++)
      cell[n * H + d] = lstm_cell(an + d, H, cn, c_prev[n * H + d], &h[n * ldh + d]);
  }
  return KILN_OK;
}

int kiln_ref_lstm_cell_bwd(const kiln_op_ctx *c, float *dc_prev, float *dgates,
                           const float *gates, const float *cell, const float *c_prev,
                           const float *dc, const float *dh, int64_t ldh, const float *dh2,
                           int64_t N, int64_t H) {
  const int64_t G = 4 * H;
  if (dgates) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * H > KILN_PARALLEL_FROM)
    for (int64_t n = 0; n < N; n++)
#pragma omp simd
      for (int64_t j = 0; j < H; j++) {
        const int64_t e = n * H + j;
        const float dh_e = dh2 ? dh[n * ldh + j] + dh2[e] : dh[n * ldh + j];
        const float d = lstm_cell_backward(gates + n * G + j, H, cell[e], c_prev[e], dc[e], dh_e,
                                           dgates + n * G + j);
        if (dc_prev) dc_prev[e] = d;
      }
  } else if (dc_prev) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * H > KILN_PARALLEL_FROM)
    for (int64_t n = 0; n < N; n++)
#pragma omp simd
      for (int64_t j = 0; j < H; j++) {
        const int64_t e = n * H + j;
        const float dh_e = dh2 ? dh[n * ldh + j] + dh2[e] : dh[n * ldh + j];
        dc_prev[e] = lstm_cell_dc_prev(gates + n * G + j, H, cell[e], dc[e], dh_e);
      }
  }
  return KILN_OK;
}

/* ---- GRU (PyTorch's nn.GRU arithmetic) ------------------------------------------------------- */

int kiln_ref_gru_cell_fwd(const kiln_op_ctx *c, float *h, int64_t ldh, float *ghn, float *gates,
                          const float *gh, const float *bh, const float *hp, int64_t N,
                          int64_t H) {
  const int64_t G = 3 * H;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * H > KILN_PARALLEL_FROM)
  for (int64_t n = 0; n < N; n++) {
    float *an = gates + n * G;
    const float *hn = gh + n * G;
#pragma omp simd
    for (int64_t d = 0; d < H; d++) {
      const float rr = kiln_vsigmoidf(an[d] + hn[d] + bh[d]);
      const float z = kiln_vsigmoidf(an[H + d] + hn[H + d] + bh[H + d]);
      const float g = hn[2 * H + d] + bh[2 * H + d];
      const float cc = kiln_vtanhf(an[2 * H + d] + rr * g);
      /* Kept for backward: the gates, and r's factor in n (which r scales, so it is kept apart
       * from the input's part of n). */
      an[d] = rr, an[H + d] = z, an[2 * H + d] = cc;
      ghn[n * H + d] = g;
      h[n * ldh + d] = (1 - z) * cc + z * hp[n * H + d];
    }
  }
  return KILN_OK;
}

/* With h = (1 - z) n + z h' and n = tanh(a_n + r g): dn = dh (1 - z), dz = dh (h' - n),
 * dr = dn (1 - n^2) g, and h' gets dh z directly besides what the recurrent terms send back. */
int kiln_ref_gru_cell_bwd(const kiln_op_ctx *c, float *d_in, float *d_rec, float *dh,
                          const float *dy, int64_t ldy, const float *gates, const float *ghn,
                          const float *hp, int64_t N, int64_t H) {
  const int64_t G = 3 * H;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N * H > KILN_PARALLEL_FROM)
  for (int64_t n = 0; n < N; n++)
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
      const int64_t e = n * H + j;
      const float *an = gates + n * G;
      const float rr = an[j], z = an[H + j], cc = an[2 * H + j];
      const float dh_t = dy[n * ldy + j] + dh[e];
      const float da_n = dh_t * (1 - z) * (1 - cc * cc);
      const float da_z = dh_t * (hp[e] - cc) * z * (1 - z);
      const float da_r = da_n * ghn[e] * rr * (1 - rr);
      float *din = d_in + n * G, *drn = d_rec + n * G;
      din[j] = drn[j] = da_r;
      din[H + j] = drn[H + j] = da_z;
      din[2 * H + j] = da_n;
      drn[2 * H + j] = da_n * rr;
      dh[e] = dh_t * z;
    }
  return KILN_OK;
}

/* ---- RNN ------------------------------------------------------------------------------------- */

int kiln_ref_rnn_step_fwd(const kiln_op_ctx *c, float *h, int64_t n) {
  (void)c;
#pragma omp simd
  for (int64_t i = 0; i < n; i++) h[i] = kiln_vtanhf(h[i]);
  return KILN_OK;
}

int kiln_ref_rnn_step_bwd(const kiln_op_ctx *c, float *d, const float *dh, const float *h,
                          int64_t n) {
  (void)c;
  for (int64_t i = 0; i < n; i++) d[i] = (d[i] + dh[i]) * (1 - h[i] * h[i]);
  return KILN_OK;
}

int kiln_ref_rnn_out_fwd(const kiln_op_ctx *c, float *y, int64_t ldy, float *out, const float *b,
                         int64_t M, int64_t H) {
  (void)c;
  for (int64_t i = 0; i < M; i++)
    for (int64_t d = 0; d < H; d++) {
      out[i * H + d] = kiln_vtanhf(out[i * H + d] + b[d]);
      y[i * ldy + d] = out[i * H + d];
    }
  return KILN_OK;
}

int kiln_ref_rnn_out_bwd(const kiln_op_ctx *c, float *dz, const float *dy, int64_t ldy,
                         const float *out, int64_t M, int64_t H) {
  (void)c;
  for (int64_t i = 0; i < M; i++)
    for (int64_t d = 0; d < H; d++)
      dz[i * H + d] = dy[i * ldy + d] * (1 - out[i * H + d] * out[i * H + d]);
  return KILN_OK;
}

/* ---- PositionalEncoding ---------------------------------------------------------------------- */

int kiln_ref_sinusoid_table(const kiln_op_ctx *c, float *table, int64_t from, int64_t T,
                            int64_t D) {
  (void)c;
  for (int64_t t = from; t < T; t++)
    for (int64_t j = 0; j < D; j++) {
      const double angle = (double)t / pow(10000.0, (double)(j - j % 2) / (double)D);
      table[t * D + j] = (float)(j % 2 ? cos(angle) : sin(angle));
    }
  return KILN_OK;
}

int kiln_ref_step_add(const kiln_op_ctx *c, float *y, const float *x, const float *v, int64_t T,
                      int64_t N, int64_t D) {
  const int64_t rows = T * N;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (rows * D > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    const float *vr = v + (r / N) * D;
    for (int64_t j = 0; j < D; j++) y[r * D + j] = x[r * D + j] + vr[j];
  }
  return KILN_OK;
}

/* Each step's row on one thread, the sequences added in order. */
int kiln_ref_step_sum_into(const kiln_op_ctx *c, float *dv, const float *dy, int64_t T, int64_t N,
                           int64_t D) {
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (T * N * D > KILN_PARALLEL_FROM)
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t j = 0; j < D; j++) dv[t * D + j] += dy[(t * N + n) * D + j];
  return KILN_OK;
}

/* ---- SequencePool ---------------------------------------------------------------------------- */

static inline bool valid_step(const float *mask, int64_t t, int64_t n, int64_t N) {
  return !mask || mask[t * N + n] != 0;
}

/* The valid steps of sequence n: how many, and the last (-1: none). */
static int64_t valid_steps(const float *mask, int64_t T, int64_t N, int64_t n, int64_t *last) {
  int64_t count = 0;
  *last = -1;
  for (int64_t t = 0; t < T; t++)
    if (valid_step(mask, t, n, N)) {
      count++;
      *last = t;
    }
  return count;
}

int kiln_ref_seq_pool_fwd(const kiln_op_ctx *c, float *y, float *arg, const float *x,
                          const float *mask, int64_t T, int64_t N, int64_t D, kiln_seq_pool pool) {
  (void)c;
  for (int64_t n = 0; n < N; n++) {
    float *yn = y + n * D;
    int64_t last;
    const int64_t count = valid_steps(mask, T, N, n, &last);
    if (count == 0)
      return kiln_errorf(KILN_ERR_DATA, "sequence %lld of the batch has no valid step in the mask",
                         (long long)n);
    switch (pool) {
    case KILN_SEQ_POOL_LAST:
      memcpy(yn, x + (last * N + n) * D, sizeof(float) * (size_t)D);
      break;
    case KILN_SEQ_POOL_MEAN:
      for (int64_t d = 0; d < D; d++) {
        double sum = 0;
        for (int64_t t = 0; t < T; t++)
          if (valid_step(mask, t, n, N)) sum += x[(t * N + n) * D + d];
        yn[d] = (float)(sum / (double)count);
      }
      break;
    case KILN_SEQ_POOL_MAX:
      for (int64_t d = 0; d < D; d++) {
        float best = -INFINITY;
        int64_t at = last;
        for (int64_t t = 0; t < T; t++) {
          const float v = x[(t * N + n) * D + d];
          if (valid_step(mask, t, n, N) && v > best) {
            best = v;
            at = t;
          }
        }
        yn[d] = best;
        arg[n * D + d] = (float)at;
      }
      break;
    }
  }
  return KILN_OK;
}

int kiln_ref_seq_pool_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *arg,
                          const float *mask, int64_t T, int64_t N, int64_t D, kiln_seq_pool pool) {
  (void)c;
  memset(dx, 0, sizeof(float) * (size_t)(T * N * D));
  for (int64_t n = 0; n < N; n++) {
    const float *dyn = dy + n * D;
    int64_t last;
    const int64_t count = valid_steps(mask, T, N, n, &last);
    if (count == 0) continue;
    switch (pool) {
    case KILN_SEQ_POOL_LAST:
      memcpy(dx + (last * N + n) * D, dyn, sizeof(float) * (size_t)D);
      break;
    case KILN_SEQ_POOL_MEAN:
      for (int64_t t = 0; t < T; t++)
        if (valid_step(mask, t, n, N))
          for (int64_t d = 0; d < D; d++) dx[(t * N + n) * D + d] = dyn[d] / (float)count;
      break;
    case KILN_SEQ_POOL_MAX:
      for (int64_t d = 0; d < D; d++) {
        const int64_t t = (int64_t)arg[n * D + d];
        dx[(t * N + n) * D + d] = dyn[d];
      }
      break;
    }
  }
  return KILN_OK;
}
