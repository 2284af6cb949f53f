/* MultiHeadAttention: PyTorch's nn.MultiheadAttention (time-major, D = kdim = vdim, no dropout
 * on the weights) on Caffe's recurrent layout. Bottoms: the query input x (T x N x D), then
 * optionally the key/value input (S x N x D; without it the keys and values come from x) and
 * optionally a key padding mask (S x N, 1 = valid, 0 = padding: the `mask` top of TextData's
 * SEQUENCES mode); a 2-axis second bottom is the mask, a 3-axis one the key/value input.
 *
 *   q = x W_q^T + b_q, k = kv W_k^T + b_k, v = kv W_v^T + b_v       (T or S) x N x D
 *   per sequence n and head h (features [h hd, (h+1) hd), hd = D / num_heads):
 *     a = softmax over the keys query t may see of q_t . k_s / sqrt(hd)
 *     ctx_t = sum_s a_ts v_s
 *   y = ctx W_o^T + b_o                                               T x N x D
 *
 * The keys query t may see: those the mask marks valid, and with `causal` only s <= t. A query
 * with none (every key padding) gets attention weights all 0, so ctx is 0 there and y is b_o;
 * PyTorch gives NaN in that case. The parameter blobs are PyTorch's, in its order and layout:
 * in_proj_weight [3D, D] (W_q, W_k, W_v stacked), in_proj_bias [3D], out_proj.weight [D, D],
 * out_proj.bias [D] (the biases absent with bias_term false), so weights copy across as they
 * are.
 *
 * Under the reference engine, and for small shapes on any engine, every GEMM runs on one BLAS
 * thread (kiln_blas_serial_begin) in blocks of rows fixed by the shapes alone, which the threads
 * share out; reductions over the batch (bias gradients) add in a fixed order. So those results
 * do not depend on the thread count. Larger projections are whole GEMMs through kiln_sgemm
 * (gemm_rows). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
#include "layer_util.h"

static const Caffe__MultiHeadAttentionParameter mha_defaults =
    CAFFE__MULTI_HEAD_ATTENTION_PARAMETER__INIT;
static const Caffe__FillerParameter filler_init = CAFFE__FILLER_PARAMETER__INIT;

typedef struct {
  int kv, mask; /* bottom index of the key/value input and of the mask; -1: none */
  int H, hd, team;
  int64_t T, S, N, D;
  bool causal, bias;
  float scale;
  /* The fillers used when the prototxt names none (they must outlive setup: the net fills the
   * parameters later). */
  Caffe__FillerParameter weight_filler, bias_filler;
} mha_state;

enum { B_QKV, B_PROBS, B_CTX }; /* buffers */
enum { P_IN_W, P_IN_B, P_OUT_W, P_OUT_B }; /* parameters, with biases; without: 0 and 1 */

static const Caffe__MultiHeadAttentionParameter *mha_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->multihead_attention_param, mha_defaults);
}

static int mha_setup(kiln_layer *l) {
  const Caffe__MultiHeadAttentionParameter *p = mha_param(l);
  mha_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 3)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the query input must be T x N x D (time-major), got %d axes",
                            x->naxes);
  s->kv = s->mask = -1;
  if (l->nbottom == 2) {
    int a = l->bottom[1]->naxes;
    if (a != 2 && a != 3)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "the second bottom must be a key/value input S x N x D or a "
                              "padding mask S x N, got %d axes",
                              a);
    if (a == 3) s->kv = 1;
    else s->mask = 1;
  } else if (l->nbottom == 3) {
    if (l->bottom[1]->naxes != 3 || l->bottom[2]->naxes != 2)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "with three bottoms: query T x N x D, key/value S x N x D, padding "
                              "mask S x N; got %d and %d axes for the last two",
                              l->bottom[1]->naxes, l->bottom[2]->naxes);
    s->kv = 1;
    s->mask = 2;
  }
  for (int b = 0; b < l->nbottom; b++)
    if (l->top[0] == l->bottom[b])
      return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                              "cannot run in place: backward reads its inputs");
  s->D = x->shape[2];
  if (p->num_heads < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "num_heads must be at least 1");
  if (s->D < 1 || s->D % p->num_heads)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the embedding dimension D = %lld is not a multiple of num_heads %u",
                            (long long)s->D, p->num_heads);
  s->H = (int)p->num_heads;
  s->hd = (int)(s->D / s->H);
  s->scale = (float)(1.0 / sqrt((double)s->hd));
  s->causal = p->causal;
  s->bias = p->bias_term;
  s->weight_filler = filler_init;
  s->weight_filler.type = "xavier";
  s->weight_filler.variance_norm = CAFFE__FILLER_PARAMETER__VARIANCE_NORM__AVERAGE;
  s->bias_filler = filler_init;
  const Caffe__FillerParameter *wf = p->weight_filler ? p->weight_filler : &s->weight_filler;
  const Caffe__FillerParameter *bf = p->bias_filler ? p->bias_filler : &s->bias_filler;
  const int64_t in_w[2] = {3 * s->D, s->D}, in_b[1] = {3 * s->D};
  const int64_t out_w[2] = {s->D, s->D}, out_b[1] = {s->D};
  if (!kiln_layer_add_param(l, 2, in_w, wf, 0) ||
      (s->bias && !kiln_layer_add_param(l, 1, in_b, bf, 0)) ||
      !kiln_layer_add_param(l, 2, out_w, wf, 0) ||
      (s->bias && !kiln_layer_add_param(l, 1, out_b, bf, 0)) ||
      !kiln_layer_add_buffer(l, "qkv") || !kiln_layer_add_buffer(l, "attention") ||
      !kiln_layer_add_buffer(l, "context"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int mha_reshape(kiln_layer *l) {
  mha_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 3 || x->shape[2] != s->D)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the query input must be T x N x %lld (the weights' D)",
                            (long long)s->D);
  s->T = x->shape[0];
  s->N = x->shape[1];
  s->S = s->T;
  if (s->kv >= 0) {
    const kiln_blob *kv = l->bottom[s->kv];
    if (kv->naxes != 3 || kv->shape[1] != s->N || kv->shape[2] != s->D)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "the key/value input must be S x %lld x %lld (as the query's N "
                              "and D)",
                              (long long)s->N, (long long)s->D);
    s->S = kv->shape[0];
  }
  if (s->mask >= 0) {
    const kiln_blob *m = l->bottom[s->mask];
    if (m->naxes != 2 || m->shape[0] != s->S || m->shape[1] != s->N)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "the padding mask must be S x N = %lld x %lld (one value per key "
                              "step and sequence)",
                              (long long)s->S, (long long)s->N);
  }
  if (s->causal && s->S != s->T)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "causal attention needs as many key steps as query steps (S %lld, "
                            "T %lld)",
                            (long long)s->S, (long long)s->T);
  const int64_t big = (int64_t)1 << 31;
  if (s->T * s->N * s->D >= big || s->S * s->N * s->D >= big || s->T * s->S >= big)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the input is too large for 32-bit GEMM sizes");
  const int64_t TND = s->T * s->N * s->D, SND = s->S * s->N * s->D;
  const int64_t qkv[1] = {TND + 2 * SND};
  const int64_t probs[4] = {s->N, s->H, s->T, s->S};
  KILN_TRY(kiln_blob_reshape(l->buffer[B_QKV], 1, qkv));
  KILN_TRY(kiln_blob_reshape(l->buffer[B_PROBS], 4, probs));
  KILN_TRY(kiln_blob_reshape_like(l->buffer[B_CTX], x));
  s->team = l->nthreads < 1 ? 1 : l->nthreads;
  /* backward: dctx and dq (T N D each), dk and dv (S N D each), the attention kernel's */
  l->workspace_floats =
      2 * TND + 2 * SND + kiln_attention_workspace((int)s->T, (int)s->S, s->team);
  l->flops = 2.0 * s->D * s->D * (2.0 * s->T * s->N + 2.0 * s->S * s->N) +
             4.0 * s->N * s->T * s->S * s->D;
  return kiln_blob_reshape_like(l->top[0], x);
}

/* Rows of C fall in fixed blocks of this many, whatever the thread count. */
enum { ROW_BLOCK = 64 };

/* C (M, Nc) = alpha op(A) (M, K) op(B) (K, Nc) + beta C. Under the reference engine, and for
 * products below WHOLE_MACS, in blocks of ROW_BLOCK rows of C spread over the threads: each
 * block is the same single-threaded GEMM call on any thread, so C's bits do not depend on the
 * thread count. Larger products are one kiln_sgemm on
 * every thread (oneDNN's kernels where they win): each block would copy all of B again. */
enum { WHOLE_MACS = 1 << 19 };
static void gemm_rows(const kiln_config *cfg, int team, bool ta, bool tb, int M, int Nc, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc) {
  if (!(cfg && cfg->engine == KILN_ENGINE_REF) && (double)M * Nc * K >= WHOLE_MACS) {
    kiln_sgemm(cfg, ta, tb, M, Nc, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int nblk = (M + ROW_BLOCK - 1) / ROW_BLOCK;
  if (team > nblk) team = nblk < 1 ? 1 : nblk;
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static) num_threads(team)
  for (int b = 0; b < nblk; b++) {
    const int r0 = b * ROW_BLOCK, mb = M - r0 < ROW_BLOCK ? M - r0 : ROW_BLOCK;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, mb,
                Nc, K, alpha, ta ? A + r0 : A + (int64_t)r0 * lda, lda, B, ldb, beta,
                C + (int64_t)r0 * ldc, ldc);
  }
  kiln_blas_serial_end(blas_prev);
}

/* y (M, Nc) = x (M, K) W^T + b, W (Nc, K). */
static void project(const kiln_config *cfg, int team, float *y, const float *x, const float *w, const float *b, int M,
                    int Nc, int K) {
  gemm_rows(cfg, team, false, true, M, Nc, K, 1.0f, x, K, w, K, 0.0f, y, Nc);
  if (!b) return;
#pragma omp parallel for schedule(static) num_threads(team) if (M > 256)
  for (int m = 0; m < M; m++)
    for (int c = 0; c < Nc; c++) y[(int64_t)m * Nc + c] += b[c];
}

/* db (Nc) += the column sums of dy (M, Nc), each column added in double, rows in order. */
static void colsum_add(int team, float *db, const float *dy, int64_t M, int64_t Nc) {
  enum { W = 16 };
  const int64_t nblk = (Nc + W - 1) / W;
#pragma omp parallel for schedule(static) num_threads(team) if (M * Nc > 65536)
  for (int64_t cb = 0; cb < nblk; cb++) {
    const int64_t c0 = cb * W, w = Nc - c0 < W ? Nc - c0 : W;
    double acc[W] = {0};
    for (int64_t m = 0; m < M; m++)
      for (int64_t j = 0; j < w; j++) acc[j] += dy[m * Nc + c0 + j];
    for (int64_t j = 0; j < w; j++) db[c0 + j] += (float)acc[j];
  }
}

static const float *weight(const kiln_layer *l, int which) { /* P_IN_W or P_OUT_W */
  const mha_state *s = l->priv;
  return l->param[s->bias ? which : which / 2]->data;
}

static float *weight_diff(const kiln_layer *l, int which) {
  const mha_state *s = l->priv;
  return l->param[s->bias ? which : which / 2]->diff;
}

static int check_mask(kiln_layer *l) {
  mha_state *s = l->priv;
  const kiln_blob *m = l->bottom[s->mask];
  for (int64_t i = 0; i < m->count; i++)
    if (m->data[i] != 0 && m->data[i] != 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                              "the padding mask holds %g at step %lld of sequence %lld: expected "
                              "1 (valid) or 0 (padding)",
                              m->data[i], (long long)(i / s->N), (long long)(i % s->N));
  return KILN_OK;
}

static int mha_forward(kiln_layer *l) {
  mha_state *s = l->priv;
  if (s->mask >= 0) KILN_TRY(check_mask(l));
  const int T = (int)s->T, S = (int)s->S, N = (int)s->N, D = (int)s->D;
  const float *x = l->bottom[0]->data;
  const float *kv = s->kv >= 0 ? l->bottom[s->kv]->data : x;
  const float *w_in = weight(l, P_IN_W), *w_out = weight(l, P_OUT_W);
  const float *b_in = s->bias ? l->param[P_IN_B]->data : NULL;
  const float *b_out = s->bias ? l->param[P_OUT_B]->data : NULL;
  float *q = l->buffer[B_QKV]->data, *k = q + (int64_t)T * N * D, *v = k + (int64_t)S * N * D;
  float *ctx = l->buffer[B_CTX]->data;
  project(l->config, s->team, q, x, w_in, b_in, T * N, D, D);
  project(l->config, s->team, k, kv, w_in + (int64_t)D * D, b_in ? b_in + D : NULL, S * N, D, D);
  project(l->config, s->team, v, kv, w_in + 2 * (int64_t)D * D, b_in ? b_in + 2 * D : NULL, S * N, D, D);
  kiln_attention_forward(ctx, l->buffer[B_PROBS]->data, q, k, v,
                         s->mask >= 0 ? l->bottom[s->mask]->data : NULL, T, S, N, s->H, s->hd,
                         s->scale, s->causal, s->team);
  project(l->config, s->team, l->top[0]->data, ctx, w_out, b_out, T * N, D, D);
  return KILN_OK;
}

static int mha_backward(kiln_layer *l) {
  mha_state *s = l->priv;
  const int T = (int)s->T, S = (int)s->S, N = (int)s->N, D = (int)s->D;
  const int64_t TND = (int64_t)T * N * D, SND = (int64_t)S * N * D, DD = (int64_t)D * D;
  const float *x = l->bottom[0]->data;
  const float *kv = s->kv >= 0 ? l->bottom[s->kv]->data : x;
  const float *dy = l->top[0]->diff;
  const float *w_in = weight(l, P_IN_W), *w_out = weight(l, P_OUT_W);
  float *dw_in = weight_diff(l, P_IN_W), *dw_out = weight_diff(l, P_OUT_W);
  const float *q = l->buffer[B_QKV]->data, *k = q + TND, *v = k + SND;
  const float *ctx = l->buffer[B_CTX]->data;
  float *dctx = l->workspace, *dq = dctx + TND, *dk = dq + TND, *dv = dk + SND;
  float *work = dv + SND;
  const int team = s->team;
  /* out-projection: dW_o += dy^T ctx, db_o += sum dy, dctx = dy W_o */
  gemm_rows(l->config, team, true, false, D, D, T * N, 1.0f, dy, D, ctx, D, 1.0f, dw_out, D);
  if (s->bias) colsum_add(team, l->param[P_OUT_B]->diff, dy, (int64_t)T * N, D);
  gemm_rows(l->config, team, false, false, T * N, D, D, 1.0f, dy, D, w_out, D, 0.0f, dctx, D);
  kiln_attention_backward(dq, dk, dv, dctx, l->buffer[B_PROBS]->data, q, k, v, T, S, N, s->H,
                          s->hd, s->scale, work, team);
  /* in-projections: dW_q += dq^T x, dW_k += dk^T kv, dW_v += dv^T kv, and their biases */
  gemm_rows(l->config, team, true, false, D, D, T * N, 1.0f, dq, D, x, D, 1.0f, dw_in, D);
  gemm_rows(l->config, team, true, false, D, D, S * N, 1.0f, dk, D, kv, D, 1.0f, dw_in + DD, D);
  gemm_rows(l->config, team, true, false, D, D, S * N, 1.0f, dv, D, kv, D, 1.0f, dw_in + 2 * DD, D);
  if (s->bias) {
    float *db = l->param[P_IN_B]->diff;
    colsum_add(team, db, dq, (int64_t)T * N, D);
    colsum_add(team, db + D, dk, (int64_t)S * N, D);
    colsum_add(team, db + 2 * D, dv, (int64_t)S * N, D);
  }
  /* dx = dq W_q (+ dk W_k + dv W_v when the keys and values come from x too) */
  if (l->propagate_down[0]) {
    float *dx = l->bottom[0]->diff;
    gemm_rows(l->config, team, false, false, T * N, D, D, 1.0f, dq, D, w_in, D, 0.0f, dx, D);
    if (s->kv < 0) {
      gemm_rows(l->config, team, false, false, T * N, D, D, 1.0f, dk, D, w_in + DD, D, 1.0f, dx, D);
      gemm_rows(l->config, team, false, false, T * N, D, D, 1.0f, dv, D, w_in + 2 * DD, D, 1.0f, dx, D);
    }
  }
  if (s->kv >= 0 && l->propagate_down[s->kv]) {
    float *dkv = l->bottom[s->kv]->diff;
    gemm_rows(l->config, team, false, false, S * N, D, D, 1.0f, dk, D, w_in + DD, D, 0.0f, dkv, D);
    gemm_rows(l->config, team, false, false, S * N, D, D, 1.0f, dv, D, w_in + 2 * DD, D, 1.0f, dkv, D);
  }
  /* The output is piecewise constant in the mask: its gradient is 0 (asked for only when a net
   * forces backward onto every bottom). */
  if (s->mask >= 0 && l->propagate_down[s->mask])
    memset(l->bottom[s->mask]->diff, 0, sizeof(float) * (size_t)l->bottom[s->mask]->count);
  return KILN_OK;
}

static void mha_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_multihead_attention = {
    .type = "MultiHeadAttention", .min_bottoms = 1, .max_bottoms = 3, .min_tops = 1,
    .max_tops = 1, .setup = mha_setup, .reshape = mha_reshape, .forward = mha_forward,
    .backward = mha_backward, .destroy = mha_destroy,
};
