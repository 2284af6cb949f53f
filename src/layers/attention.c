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
 * thread in blocks of rows fixed by the shapes alone, which the threads share out (the
 * gemm_rows op); reductions over the batch (bias gradients) add in a fixed order. So those
 * results do not depend on the thread count. Larger projections are whole GEMMs through the gemm
 * op (the cpu backend's gemm_rows). */
#include <math.h>
#include <stdlib.h>

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

/* y (M, Nc) = x (M, K) W^T + b (b NULL: none), W (Nc, K). */
static int project(kiln_layer *l, float *y, const float *x, const float *w, const float *b, int M,
                   int Nc, int K) {
  KILN_TRY(KILN_OP(l, gemm_rows, y, Nc, x, K, w, K, false, true, M, Nc, K, 1.0f, 0.0f));
  return b ? KILN_OP(l, add_bias_rows, y, b, M, Nc) : KILN_OK;
}

static const float *weight(const kiln_layer *l, int which) { /* P_IN_W or P_OUT_W */
  const mha_state *s = l->priv;
  return l->param[s->bias ? which : which / 2]->data;
}

static float *weight_diff(const kiln_layer *l, int which) {
  const mha_state *s = l->priv;
  return l->param[s->bias ? which : which / 2]->diff;
}

/* The padding mask's values, checked by an op (a host read would need a copy). */
static int check_mask(kiln_layer *l) {
  mha_state *s = l->priv;
  int rc = KILN_OP(l, mask_check, l->bottom[s->mask]->data, s->S, s->N);
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
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
  KILN_TRY(project(l, q, x, w_in, b_in, T * N, D, D));
  KILN_TRY(project(l, k, kv, w_in + (int64_t)D * D, b_in ? b_in + D : NULL, S * N, D, D));
  KILN_TRY(project(l, v, kv, w_in + 2 * (int64_t)D * D, b_in ? b_in + 2 * D : NULL, S * N, D, D));
  KILN_TRY(KILN_OP(l, attention_fwd, ctx, l->buffer[B_PROBS]->data, q, k, v,
                   s->mask >= 0 ? l->bottom[s->mask]->data : NULL, T, S, N, s->H, s->hd, s->scale,
                   s->causal));
  return project(l, l->top[0]->data, ctx, w_out, b_out, T * N, D, D);
}

/* C (M x Nc, Nc apart) = A (M x K, or K x M with ta) op(B) + beta C through gemm_rows, every
 * operand's rows as they lie. */
#define GEMM_ROWS(l, C, A, B, ta, tb, M, Nc, K, beta)                                          \
  KILN_OP(l, gemm_rows, C, Nc, A, (ta) ? (M) : (K), B, (tb) ? (K) : (Nc), ta, tb, M, Nc, K, 1.0f, \
          beta)

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
  /* out-projection: dW_o += dy^T ctx, db_o += sum dy, dctx = dy W_o */
  KILN_TRY(GEMM_ROWS(l, dw_out, dy, ctx, true, false, D, D, T * N, 1.0f));
  if (s->bias)
    KILN_TRY(KILN_OP(l, sum_rows_double_into, l->param[P_OUT_B]->diff, dy, (int64_t)T * N, D));
  KILN_TRY(GEMM_ROWS(l, dctx, dy, w_out, false, false, T * N, D, D, 0.0f));
  KILN_TRY(KILN_OP(l, attention_bwd, dq, dk, dv, work, dctx, l->buffer[B_PROBS]->data, q, k, v, T,
                   S, N, s->H, s->hd, s->scale));
  /* in-projections: dW_q += dq^T x, dW_k += dk^T kv, dW_v += dv^T kv, and their biases */
  KILN_TRY(GEMM_ROWS(l, dw_in, dq, x, true, false, D, D, T * N, 1.0f));
  KILN_TRY(GEMM_ROWS(l, dw_in + DD, dk, kv, true, false, D, D, S * N, 1.0f));
  KILN_TRY(GEMM_ROWS(l, dw_in + 2 * DD, dv, kv, true, false, D, D, S * N, 1.0f));
  if (s->bias) {
    float *db = l->param[P_IN_B]->diff;
    KILN_TRY(KILN_OP(l, sum_rows_double_into, db, dq, (int64_t)T * N, D));
    KILN_TRY(KILN_OP(l, sum_rows_double_into, db + D, dk, (int64_t)S * N, D));
    KILN_TRY(KILN_OP(l, sum_rows_double_into, db + 2 * D, dv, (int64_t)S * N, D));
  }
  /* dx = dq W_q (+ dk W_k + dv W_v when the keys and values come from x too) */
  if (l->propagate_down[0]) {
    float *dx = l->bottom[0]->diff;
    KILN_TRY(GEMM_ROWS(l, dx, dq, w_in, false, false, T * N, D, D, 0.0f));
    if (s->kv < 0) {
      KILN_TRY(GEMM_ROWS(l, dx, dk, w_in + DD, false, false, T * N, D, D, 1.0f));
      KILN_TRY(GEMM_ROWS(l, dx, dv, w_in + 2 * DD, false, false, T * N, D, D, 1.0f));
    }
  }
  if (s->kv >= 0 && l->propagate_down[s->kv]) {
    float *dkv = l->bottom[s->kv]->diff;
    KILN_TRY(GEMM_ROWS(l, dkv, dk, w_in + DD, false, false, S * N, D, D, 0.0f));
    KILN_TRY(GEMM_ROWS(l, dkv, dv, w_in + 2 * DD, false, false, S * N, D, D, 1.0f));
  }
  /* The output is piecewise constant in the mask: its gradient is 0 (asked for only when a net
   * forces backward onto every bottom). */
  if (s->mask >= 0 && l->propagate_down[s->mask])
    KILN_TRY(KILN_OP(l, fill, l->bottom[s->mask]->diff, 0.0f, l->bottom[s->mask]->count));
  return KILN_OK;
}

static void mha_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_multihead_attention = {
    .type = "MultiHeadAttention", .min_bottoms = 1, .max_bottoms = 3, .min_tops = 1,
    .max_tops = 1, .setup = mha_setup, .reshape = mha_reshape, .forward = mha_forward,
    .backward = mha_backward, .destroy = mha_destroy,
    .kernels = KILN_KERNELS(KILN_OP_gemm_rows, KILN_OP_add_bias_rows, KILN_OP_sum_rows_double_into,
                            KILN_OP_mask_check, KILN_OP_attention_fwd, KILN_OP_attention_bwd,
                            KILN_OP_fill),
};
