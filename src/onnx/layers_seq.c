/* The ONNX forms of the sequence and text layers (docs/onnx.md): Embed, LSTM, GRU, RNN,
 * LayerNorm, GELU, Swish, PositionalEncoding, MultiHeadAttention and SequencePool. Time-major as
 * kiln's layers are (T x N x ...): ONNX's LSTM, GRU and RNN read that layout (layout 0).
 * Everything is opset 13 (LayerNorm decomposed; docs/onnx.md says why).
 *
 * The recurrent layers' `cont` input is not read: the model computes what kiln computes for a
 * pass of whole sequences, cont 0 at the first step and 1 after it (the state starts at zero,
 * as kiln's does on a net's first pass), which is how `kiln sample` and `kiln decode` start and
 * what a deploy net's caller gives for a whole sequence. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "onnx_internal.h"

/* A Reshape of `in` to `shape` (0 copies the input's axis) into `out`. */
static const char *reshape(ox_graph *g, const char *in, int n, const int64_t *shape,
                           const char *out) {
  return ox_op2(g, "Reshape", in, ox_init_int64(g, "shape", n, shape), out);
}

static const char *transpose(ox_graph *g, const char *in, int n, const int64_t *perm,
                             const char *out) {
  Onnx__NodeProto *t = ox_node1(g, "Transpose", in, out);
  if (!t || ox_attr_ints(g, t, "perm", n, perm)) return NULL;
  return out;
}

/* The transpose of a rows x cols block of `w` (row stride ld), as a cols x rows initializer. */
static const char *init_transposed(ox_graph *g, const char *what, const float *w, int64_t rows,
                                   int64_t cols, int64_t ld) {
  float *t = ox_alloc(g, sizeof(float) * (size_t)(rows * cols));
  if (!t) return NULL;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) t[j * rows + i] = w[i * ld + j];
  const int64_t dims[2] = {cols, rows};
  return ox_init_float(g, what, 2, dims, t);
}

/* ---- Embed ------------------------------------------------------------------------------ */

/* Gather of the table's rows by the ids (floats in kiln, as Caffe's Embed reads them: Cast to
 * int64 first), plus the bias. */
static int emit_embed(ox_graph *g) {
  const kiln_layer *l = g->l;
  const kiln_blob *w = l->param[0];
  const char *out = ox_top(g, 0);
  const char *ids = ox_tmp(g, "ids");
  Onnx__NodeProto *c = ox_node1(g, "Cast", ox_bottom(g, 0), ids);
  TRY_NODE(c);
  KILN_TRY(ox_attr_int(g, c, "to", ONNX__TENSOR_PROTO__DATA_TYPE__INT64));
  const char *table = ox_init_float(g, "weight", 2, w->shape, ox_param(g, 0));
  const bool bias = l->nparam > 1;
  const char *rows = bias ? ox_tmp(g, "rows") : out;
  Onnx__NodeProto *n = ox_node(g, "Gather", 2, (const char *[]){table, ids}, 1, &rows);
  TRY_NODE(n);
  KILN_TRY(ox_attr_int(g, n, "axis", 0));
  if (bias && !ox_op2(g, "Add", rows, ox_init_float(g, "bias", 1, l->param[1]->shape,
                                                  ox_param(g, 1)), out))
    return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- LSTM, GRU, RNN --------------------------------------------------------------------- */

/* ONNX's LSTM, GRU or RNN node on x (T x N x D) with the layer's weights in ONNX's gate order,
 * zero initial state, and the output as kiln's T x N x H (x 2 for bidirectional: each step's
 * forward features, then the reverse ones). RNN's output layer (Caffe's o = tanh(W_ho h + b_o))
 * follows it. */
static int emit_recurrent(ox_graph *g) {
  const kiln_layer *l = g->l;
  const char *type = l->ops->type;
  static const Caffe__RecurrentParameter defaults = CAFFE__RECURRENT_PARAMETER__INIT;
  const Caffe__RecurrentParameter *p = l->lp->recurrent_param ? l->lp->recurrent_param
                                                                : &defaults;
  const bool lstm = !strcmp(type, "LSTM"), gru = !strcmp(type, "GRU");
  if (p->expose_hidden)
    return ox_refuse(g, "expose_hidden (the initial state as bottoms, the final state as tops, "
                     "carried between passes) is not exported: the model starts every pass "
                     "from a zero state");
  if (l->nbottom > 2)
    return ox_refuse(g, "a static input (x_static, the third bottom) adds a per-sequence term "
                     "to the gates, which ONNX's %s has no input for", type);
  const int ndir = p->bidirectional ? 2 : 1;
  const int64_t H = p->num_output;
  const int64_t D = l->param[0]->shape[1];
  const int ngates = lstm ? 4 : gru ? 3 : 1;
  const int64_t G = ngates * H;
  /* the ONNX gate k takes kiln's gate from[k]: LSTM iofc from kiln's i, f, o, g; GRU zrh from
   * r, z, n */
  static const int lstm_from[4] = {0, 2, 1, 3}, gru_from[3] = {1, 0, 2}, rnn_from[1] = {0};
  const int *from = lstm ? lstm_from : gru ? gru_from : rnn_from;
  const int per_dir = l->nparam / ndir; /* W_x, b, W_h [, b_h] [, W_o, b_o] */
  float *W = ox_alloc(g, sizeof(float) * (size_t)(ndir * G * D));
  float *R = ox_alloc(g, sizeof(float) * (size_t)(ndir * G * H));
  float *B = ox_alloc(g, sizeof(float) * (size_t)(ndir * 2 * G));
  if (!W || !R || !B) return KILN_ERR_NOMEM;
  for (int d = 0; d < ndir; d++) {
    const int base = d * per_dir;
    const float *wx = ox_param(g, base), *b = ox_param(g, base + 1), *wh = ox_param(g, base + 2);
    const float *bh = gru ? ox_param(g, base + 3) : NULL;
    for (int k = 0; k < ngates; k++) {
      const int64_t src = from[k] * H, dst = k * H;
      memcpy(W + (d * G + dst) * D, wx + src * D, sizeof(float) * (size_t)(H * D));
      memcpy(R + (d * G + dst) * H, wh + src * H, sizeof(float) * (size_t)(H * H));
      memcpy(B + d * 2 * G + dst, b + src, sizeof(float) * (size_t)H);
      if (bh) memcpy(B + d * 2 * G + G + dst, bh + src, sizeof(float) * (size_t)H);
    }
  }
  const char *x = ox_bottom(g, 0);
  if (l->bottom[0]->naxes != 3) { /* features from axis 2 */
    const int64_t shape[3] = {0, 0, -1};
    if (!(x = reshape(g, x, 3, shape, ox_tmp(g, "x")))) return KILN_ERR_NOMEM;
  }
  const int64_t wd[3] = {ndir, G, D}, rd[3] = {ndir, G, H}, bd[2] = {ndir, 2 * G};
  const char *in[4] = {x, ox_init_float(g, "W", 3, wd, W), ox_init_float(g, "R", 3, rd, R),
                       ox_init_float(g, "B", 2, bd, B)};
  const char *y = ox_tmp(g, "Y"); /* T x ndir x N x H */
  Onnx__NodeProto *n = ox_node(g, type, 4, in, 1, &y);
  TRY_NODE(n);
  KILN_TRY(ox_attr_int(g, n, "hidden_size", H));
  if (ndir == 2) KILN_TRY(ox_attr_string(g, n, "direction", "bidirectional"));
  if (gru) KILN_TRY(ox_attr_int(g, n, "linear_before_reset", 1));
  if (!lstm && !gru) { /* Caffe's RNN output: o = tanh(W_ho h + b_o), per direction */
    float *wo = ox_alloc(g, sizeof(float) * (size_t)(ndir * H * H));
    float *bo = ox_alloc(g, sizeof(float) * (size_t)(ndir * H));
    if (!wo || !bo) return KILN_ERR_NOMEM;
    for (int d = 0; d < ndir; d++) {
      const float *w = ox_param(g, d * per_dir + 3);
      for (int64_t i = 0; i < H; i++)
        for (int64_t j = 0; j < H; j++) wo[(d * H + j) * H + i] = w[i * H + j];
      memcpy(bo + d * H, ox_param(g, d * per_dir + 4), sizeof(float) * (size_t)H);
    }
    const int64_t wod[3] = {ndir, H, H}, bod[3] = {ndir, 1, H};
    const char *pre = ox_op2(g, "MatMul", y, ox_init_float(g, "W_o", 3, wod, wo), ox_tmp(g, "o_pre"));
    const char *sum = pre ? ox_op2(g, "Add", pre, ox_init_float(g, "b_o", 3, bod, bo),
                                ox_tmp(g, "o_sum")) : NULL;
    const char *o = ox_tmp(g, "o");
    if (!sum || !ox_node1(g, "Tanh", sum, o)) return KILN_ERR_NOMEM;
    y = o;
  }
  const char *out = ox_top(g, 0);
  if (ndir == 1) {
    const int64_t axis = 1;
    if (!ox_op2(g, "Squeeze", y, ox_init_int64(g, "axes", 1, &axis), out)) return KILN_ERR_NOMEM;
  } else {
    const int64_t perm[4] = {0, 2, 1, 3}, shape[3] = {0, 0, -1};
    const char *t = transpose(g, y, 4, perm, ox_tmp(g, "Y_steps"));
    if (!t || !reshape(g, t, 3, shape, out)) return KILN_ERR_NOMEM;
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- LayerNorm, GELU, Swish ------------------------------------------------------------- */

/* (x - mean) / sqrt(var + eps) [* gain + bias] over the axes from `axis` to the last, with the
 * biased variance: ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div [, Mul, Add]. */
static int emit_layer_norm(ox_graph *g) {
  const kiln_layer *l = g->l;
  static const Caffe__LayerNormParameter defaults = CAFFE__LAYER_NORM_PARAMETER__INIT;
  const Caffe__LayerNormParameter *p = l->lp->layer_norm_param ? l->lp->layer_norm_param
                                                                : &defaults;
  const kiln_blob *xb = l->bottom[0];
  int axis;
  KILN_TRY(kiln_blob_canonical_axis(xb, p->axis, &axis));
  if (axis == 0 && g->opt->dynamic_batch)
    return ox_refuse(g, "axis 0 normalises across the first axis, which --dynamic-batch leaves "
                     "open");
  int64_t axes[KILN_MAX_AXES];
  int na = 0;
  for (int a = axis; a < xb->naxes; a++) axes[na++] = a;
  const char *x = ox_bottom(g, 0), *out = ox_top(g, 0);
  const char *mean = ox_tmp(g, "mean");
  Onnx__NodeProto *m = ox_node1(g, "ReduceMean", x, mean);
  TRY_NODE(m);
  KILN_TRY(ox_attr_ints(g, m, "axes", na, axes));
  KILN_TRY(ox_attr_int(g, m, "keepdims", 1));
  const char *d = ox_op2(g, "Sub", x, mean, ox_tmp(g, "centered"));
  const char *sq = d ? ox_op2(g, "Mul", d, d, ox_tmp(g, "square")) : NULL;
  const char *var = ox_tmp(g, "var");
  Onnx__NodeProto *v = sq ? ox_node1(g, "ReduceMean", sq, var) : NULL;
  TRY_NODE(v);
  KILN_TRY(ox_attr_ints(g, v, "axes", na, axes));
  KILN_TRY(ox_attr_int(g, v, "keepdims", 1));
  const char *ve = ox_op2(g, "Add", var, ox_init_scalar(g, "eps", p->eps), ox_tmp(g, "var_eps"));
  const char *sd = ox_tmp(g, "std");
  if (!ve || !ox_node1(g, "Sqrt", ve, sd)) return KILN_ERR_NOMEM;
  const bool gain = l->nparam > 0, bias = l->nparam > 1;
  const char *xhat = ox_op2(g, "Div", d, sd, gain ? ox_tmp(g, "normalized") : out);
  if (!xhat) return KILN_ERR_NOMEM;
  if (gain) {
    const kiln_blob *gb = l->param[0];
    const char *scaled = ox_op2(g, "Mul", xhat, ox_init_float(g, "gain", gb->naxes, gb->shape,
                                                           ox_param(g, 0)),
                             bias ? ox_tmp(g, "scaled") : out);
    if (!scaled) return KILN_ERR_NOMEM;
    if (bias && !ox_op2(g, "Add", scaled, ox_init_float(g, "bias", l->param[1]->naxes,
                                                     l->param[1]->shape, ox_param(g, 1)), out))
      return KILN_ERR_NOMEM;
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* 0.5 x (1 + erf(x / sqrt 2)); the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static int emit_gelu(ox_graph *g) {
  const Caffe__GELUParameter *p = g->l->lp->gelu_param;
  const bool tanh_form = p && p->approximate == CAFFE__GELUPARAMETER__APPROXIMATE__TANH;
  const char *x = ox_bottom(g, 0), *out = ox_top(g, 0), *phi2;
  if (tanh_form) {
    const char *x2 = ox_op2(g, "Mul", x, x, ox_tmp(g, "x2"));
    const char *x3 = x2 ? ox_op2(g, "Mul", x2, x, ox_tmp(g, "x3")) : NULL;
    const char *cx3 = x3 ? ox_op2(g, "Mul", x3, ox_init_scalar(g, "c", 0.044715f), ox_tmp(g, "cx3"))
                         : NULL;
    const char *in = cx3 ? ox_op2(g, "Add", x, cx3, ox_tmp(g, "inner")) : NULL;
    const char *u = in ? ox_op2(g, "Mul", in, ox_init_scalar(g, "sqrt_2_over_pi",
                                                          (float)sqrt(2.0 / M_PI)),
                             ox_tmp(g, "u")) : NULL;
    phi2 = ox_tmp(g, "tanh");
    if (!u || !ox_node1(g, "Tanh", u, phi2)) return KILN_ERR_NOMEM;
  } else {
    const char *s = ox_op2(g, "Mul", x, ox_init_scalar(g, "inv_sqrt2", (float)(1.0 / sqrt(2.0))),
                        ox_tmp(g, "scaled"));
    phi2 = ox_tmp(g, "erf");
    if (!s || !ox_node1(g, "Erf", s, phi2)) return KILN_ERR_NOMEM;
  }
  const char *one = ox_op2(g, "Add", phi2, ox_init_scalar(g, "one", 1.0f), ox_tmp(g, "one_plus"));
  const char *xp = one ? ox_op2(g, "Mul", x, one, ox_tmp(g, "x_times")) : NULL;
  if (!xp || !ox_op2(g, "Mul", xp, ox_init_scalar(g, "half", 0.5f), out)) return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* x sigmoid(beta x). */
static int emit_swish(ox_graph *g) {
  const Caffe__SwishParameter *p = g->l->lp->swish_param;
  const float beta = p ? p->beta : 1.0f;
  const char *x = ox_bottom(g, 0), *out = ox_top(g, 0), *bx = x;
  if (beta != 1.0f &&
      !(bx = ox_op2(g, "Mul", x, ox_init_scalar(g, "beta", beta), ox_tmp(g, "beta_x"))))
    return KILN_ERR_NOMEM;
  const char *s = ox_tmp(g, "sigmoid");
  if (!ox_node1(g, "Sigmoid", bx, s) || !ox_op2(g, "Mul", x, s, out)) return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- PositionalEncoding ----------------------------------------------------------------- */

/* x + pe[t] for step t: a constant T x 1 x D table added, the learned rows or the sinusoids as
 * kiln works them out (in double, rounded to float). */
static int emit_positional(ox_graph *g) {
  const kiln_layer *l = g->l;
  if (g->opt->dynamic_batch)
    return ox_refuse(g, "the first axis is the time steps here, whose positions the table "
                     "fixes: not exported with --dynamic-batch");
  const int64_t T = l->bottom[0]->shape[0], D = l->bottom[0]->shape[2];
  const float *table;
  if (l->nparam > 0) {
    table = ox_param(g, 0); /* rows 0 .. T - 1 of [max_len, D] */
  } else {
    float *t = ox_alloc(g, sizeof(float) * (size_t)(T * D));
    if (!t) return KILN_ERR_NOMEM;
    for (int64_t s = 0; s < T; s++)
      for (int64_t j = 0; j < D; j++) {
        const double angle = (double)s / pow(10000.0, (double)(j - j % 2) / (double)D);
        t[s * D + j] = (float)(j % 2 ? cos(angle) : sin(angle));
      }
    table = t;
  }
  const int64_t dims[3] = {T, 1, D};
  const char *out = ox_top(g, 0);
  if (!ox_op2(g, "Add", ox_bottom(g, 0), ox_init_float(g, "table", 3, dims, table), out))
    return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- MultiHeadAttention ----------------------------------------------------------------- */

/* in (L x N x D) W^T + b, split into heads: N x H x L x hd (perm 1 2 0 3), or for the keys
 * N x H x hd x L (perm 1 2 3 0). */
static const char *project_heads(ox_graph *g, const char *in, const char *what, const float *w,
                                 const float *b, int64_t D, int64_t H, bool keys) {
  char name[64];
  snprintf(name, sizeof name, "W_%s", what);
  const char *wt = init_transposed(g, name, w, D, D, D);
  snprintf(name, sizeof name, "%s_proj", what);
  const char *y = ox_op2(g, "MatMul", in, wt, ox_tmp(g, name));
  if (!y) return NULL;
  if (b) {
    const int64_t dd = D;
    snprintf(name, sizeof name, "b_%s", what);
    const char *bn = ox_init_float(g, name, 1, &dd, b);
    snprintf(name, sizeof name, "%s_biased", what);
    if (!(y = ox_op2(g, "Add", y, bn, ox_tmp(g, name)))) return NULL;
  }
  const int64_t shape[4] = {0, 0, H, D / H};
  snprintf(name, sizeof name, "%s_split", what);
  if (!(y = reshape(g, y, 4, shape, ox_tmp(g, name)))) return NULL;
  const int64_t perm_q[4] = {1, 2, 0, 3}, perm_k[4] = {1, 2, 3, 0};
  snprintf(name, sizeof name, "%s_heads", what);
  return transpose(g, y, 4, keys ? perm_k : perm_q, ox_tmp(g, name));
}

/* PyTorch's attention, time-major: the projections, per head softmax(q k^T / sqrt(hd)) v over
 * the keys each query may see, the heads joined and projected. Keys hidden by the causal rule
 * or the padding mask get -1e30 added to their scores (exp gives 0 there); where a padding mask
 * is given, the weights are then multiplied by which keys are visible, so that a query with no
 * key to see gets weights 0 (kiln's rule), not a softmax of hidden keys. */
static int emit_attention(ox_graph *g) {
  const kiln_layer *l = g->l;
  static const Caffe__MultiHeadAttentionParameter defaults =
      CAFFE__MULTI_HEAD_ATTENTION_PARAMETER__INIT;
  const Caffe__MultiHeadAttentionParameter *p =
      l->lp->multihead_attention_param ? l->lp->multihead_attention_param : &defaults;
  int kv = -1, mask = -1;
  if (l->nbottom == 2) {
    if (l->bottom[1]->naxes == 3) kv = 1;
    else mask = 1;
  } else if (l->nbottom == 3) {
    kv = 1;
    mask = 2;
  }
  if (p->causal && g->opt->dynamic_batch)
    return ox_refuse(g, "causal attention fixes the steps (the first axis) in its mask: not "
                     "exported with --dynamic-batch");
  const int64_t T = l->bottom[0]->shape[0], D = l->bottom[0]->shape[2], H = p->num_heads;
  const int64_t S = kv >= 0 ? l->bottom[kv]->shape[0] : T, hd = D / H;
  const bool bias = p->bias_term;
  const float *w_in = ox_param(g, 0), *b_in = bias ? ox_param(g, 1) : NULL;
  const float *w_out = ox_param(g, bias ? 2 : 1), *b_out = bias ? ox_param(g, 3) : NULL;
  const char *x = ox_bottom(g, 0), *kvx = kv >= 0 ? ox_bottom(g, kv) : x;
  const char *q = project_heads(g, x, "q", w_in, b_in, D, H, false);
  const char *k = project_heads(g, kvx, "k", w_in + D * D, b_in ? b_in + D : NULL, D, H, true);
  const char *v = project_heads(g, kvx, "v", w_in + 2 * D * D, b_in ? b_in + 2 * D : NULL, D, H,
                                false);
  if (!q || !k || !v) return KILN_ERR_NOMEM;
  const char *raw = ox_op2(g, "MatMul", q, k, ox_tmp(g, "dot")); /* N x H x T x S */
  const char *scores = raw ? ox_op2(g, "Mul", raw, ox_init_scalar(g, "scale",
                                                                (float)(1.0 / sqrt((double)hd))),
                                 ox_tmp(g, "scores")) : NULL;
  if (!scores) return KILN_ERR_NOMEM;
  float *causal_vis = NULL;
  if (p->causal) {
    float *hide = ox_alloc(g, sizeof(float) * (size_t)(T * S));
    causal_vis = ox_alloc(g, sizeof(float) * (size_t)(T * S));
    if (!hide || !causal_vis) return KILN_ERR_NOMEM;
    for (int64_t t = 0; t < T; t++)
      for (int64_t s = 0; s < S; s++) {
        hide[t * S + s] = s <= t ? 0.0f : -1e30f;
        causal_vis[t * S + s] = s <= t ? 1.0f : 0.0f;
      }
    const int64_t dims[2] = {T, S};
    if (!(scores = ox_op2(g, "Add", scores, ox_init_float(g, "causal_mask", 2, dims, hide),
                       ox_tmp(g, "causal_scores"))))
      return KILN_ERR_NOMEM;
  }
  const char *vis = NULL;
  if (mask >= 0) { /* S x N of 1 (valid) and 0 (padding) -> N x 1 x 1 x S */
    const int64_t perm[2] = {1, 0}, shape[4] = {0, 1, 1, S};
    const char *mt = transpose(g, ox_bottom(g, mask), 2, perm, ox_tmp(g, "mask_t"));
    vis = mt ? reshape(g, mt, 4, shape, ox_tmp(g, "visible")) : NULL;
    const char *big =
        vis ? ox_op2(g, "Mul", vis, ox_init_scalar(g, "big", 1e30f), ox_tmp(g, "vis_big")) : NULL;
    const char *hide = big ? ox_op2(g, "Sub", big, ox_init_scalar(g, "big2", 1e30f),
                                 ox_tmp(g, "pad_mask")) : NULL;
    if (!hide || !(scores = ox_op2(g, "Add", scores, hide, ox_tmp(g, "masked_scores"))))
      return KILN_ERR_NOMEM;
  }
  const char *a = ox_tmp(g, "weights");
  Onnx__NodeProto *sm = ox_node1(g, "Softmax", scores, a);
  TRY_NODE(sm);
  KILN_TRY(ox_attr_int(g, sm, "axis", -1));
  if (vis) {
    if (!(a = ox_op2(g, "Mul", a, vis, ox_tmp(g, "visible_weights")))) return KILN_ERR_NOMEM;
    if (causal_vis) {
      const int64_t dims[2] = {T, S};
      if (!(a = ox_op2(g, "Mul", a, ox_init_float(g, "causal_visible", 2, dims, causal_vis),
                    ox_tmp(g, "causal_weights"))))
        return KILN_ERR_NOMEM;
    }
  }
  const char *ctx = ox_op2(g, "MatMul", a, v, ox_tmp(g, "context")); /* N x H x T x hd */
  const int64_t perm[4] = {2, 0, 1, 3}, shape[3] = {0, 0, D};
  const char *ct = ctx ? transpose(g, ctx, 4, perm, ox_tmp(g, "context_steps")) : NULL;
  const char *joined = ct ? reshape(g, ct, 3, shape, ox_tmp(g, "joined")) : NULL;
  const char *out = ox_top(g, 0);
  const char *wo = init_transposed(g, "W_out", w_out, D, D, D);
  const char *y = joined ? ox_op2(g, "MatMul", joined, wo, b_out ? ox_tmp(g, "out_proj") : out)
                         : NULL;
  if (!y) return KILN_ERR_NOMEM;
  if (b_out) {
    const int64_t dd = D;
    if (!ox_op2(g, "Add", y, ox_init_float(g, "b_out", 1, &dd, b_out), out)) return KILN_ERR_NOMEM;
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- SequencePool ---------------------------------------------------------------------- */

/* Over axis 0 of x (T x N x D) into N x D, then the top's shape: without a mask ReduceMean,
 * ReduceMax or the last step (Slice); with one, over the steps whose mask is not 0: the sum of
 * the valid steps (Where, ReduceSum) over their count, ReduceMax of x with -inf on the others,
 * and the last valid step (ArgMax of the valid flags, select_last_index, picked by Equal against
 * the step numbers). A sequence with no valid step, which kiln refuses when it runs, is not
 * checked. */
static int emit_sequence_pool(ox_graph *g) {
  const kiln_layer *l = g->l;
  static const Caffe__SequencePoolParameter defaults = CAFFE__SEQUENCE_POOL_PARAMETER__INIT;
  const Caffe__SequencePoolParameter *p = l->lp->sequence_pool_param ? l->lp->sequence_pool_param
                                                                      : &defaults;
  if (g->opt->dynamic_batch)
    return ox_refuse(g, "its output's first axis is the streams (axis 1), not the input's first "
                     "axis (the steps): not exported with --dynamic-batch");
  const kiln_blob *xb = l->bottom[0], *yb = l->top[0];
  const int64_t T = xb->shape[0];
  const char *x = ox_bottom(g, 0), *out = ox_top(g, 0);
  if (xb->naxes != 3) {
    const int64_t shape[3] = {0, 0, -1};
    if (!(x = reshape(g, x, 3, shape, ox_tmp(g, "x")))) return KILN_ERR_NOMEM;
  }
  const bool masked = l->nbottom > 1;
  const int64_t zero_axis = 0, two = 2;
  const char *valid = NULL, *valid3 = NULL; /* bool T x N, and T x N x 1 */
  if (masked) {
    const char *m = ox_bottom(g, 1);
    if (l->bottom[1]->naxes != 2) {
      const int64_t shape[2] = {T, xb->shape[1]};
      if (!(m = reshape(g, m, 2, shape, ox_tmp(g, "mask")))) return KILN_ERR_NOMEM;
    }
    const char *pad = ox_op2(g, "Equal", m, ox_init_scalar(g, "zero", 0.0f), ox_tmp(g, "padding"));
    valid = ox_tmp(g, "valid");
    if (!pad || !ox_node1(g, "Not", pad, valid)) return KILN_ERR_NOMEM;
    if (!(valid3 = ox_op2(g, "Unsqueeze", valid, ox_init_int64(g, "axes", 1, &two),
                       ox_tmp(g, "valid3"))))
      return KILN_ERR_NOMEM;
  }
  const char *r = ox_tmp(g, "pooled"); /* N x D */
  switch (p->pool) {
  case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__MEAN:
    if (!masked) {
      Onnx__NodeProto *n = ox_node1(g, "ReduceMean", x, r);
      TRY_NODE(n);
      KILN_TRY(ox_attr_ints(g, n, "axes", 1, &zero_axis));
      KILN_TRY(ox_attr_int(g, n, "keepdims", 0));
    } else {
      const char *vf = ox_tmp(g, "valid_f");
      Onnx__NodeProto *c = ox_node1(g, "Cast", valid3, vf);
      TRY_NODE(c);
      KILN_TRY(ox_attr_int(g, c, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT));
      const char *kept = ox_op2(g, "Mul", x, vf, ox_tmp(g, "kept"));
      const char *axes = ox_init_int64(g, "axes0", 1, &zero_axis);
      const char *sum = ox_tmp(g, "sum"), *cnt = ox_tmp(g, "count");
      Onnx__NodeProto *s1 = kept ? ox_node(g, "ReduceSum", 2, (const char *[]){kept, axes}, 1,
                                           &sum) : NULL;
      Onnx__NodeProto *s2 = s1 ? ox_node(g, "ReduceSum", 2, (const char *[]){vf, axes}, 1, &cnt)
                               : NULL;
      TRY_NODE(s2);
      KILN_TRY(ox_attr_int(g, s1, "keepdims", 0));
      KILN_TRY(ox_attr_int(g, s2, "keepdims", 0));
      if (!ox_op2(g, "Div", sum, cnt, r)) return KILN_ERR_NOMEM;
    }
    break;
  case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__MAX: {
    const char *in = x;
    if (masked) {
      const char *w = ox_tmp(g, "valid_values");
      if (!ox_node(g, "Where", 3, (const char *[]){valid3, x,
                                                   ox_init_scalar(g, "minus_inf", -INFINITY)},
                   1, &w))
        return KILN_ERR_NOMEM;
      in = w;
    }
    Onnx__NodeProto *n = ox_node1(g, "ReduceMax", in, r);
    TRY_NODE(n);
    KILN_TRY(ox_attr_ints(g, n, "axes", 1, &zero_axis));
    KILN_TRY(ox_attr_int(g, n, "keepdims", 0));
    break;
  }
  default: /* LAST */
    if (!masked) {
      const int64_t start = T - 1;
      const char *sin[4] = {x, ox_init_int64(g, "starts", 1, &start),
                            ox_init_int64(g, "ends", 1, &T), ox_init_int64(g, "axes0", 1,
                                                                          &zero_axis)};
      if (!ox_node(g, "Slice", 4, sin, 1, &r)) return KILN_ERR_NOMEM; /* 1 x N x D */
    } else {
      const char *vi = ox_tmp(g, "valid_i"), *last = ox_tmp(g, "last");
      Onnx__NodeProto *c = ox_node1(g, "Cast", valid, vi);
      TRY_NODE(c);
      KILN_TRY(ox_attr_int(g, c, "to", ONNX__TENSOR_PROTO__DATA_TYPE__INT32));
      Onnx__NodeProto *a = ox_node1(g, "ArgMax", vi, last); /* 1 x N */
      TRY_NODE(a);
      KILN_TRY(ox_attr_int(g, a, "axis", 0));
      KILN_TRY(ox_attr_int(g, a, "keepdims", 1));
      KILN_TRY(ox_attr_int(g, a, "select_last_index", 1));
      int64_t *steps = ox_alloc(g, sizeof(int64_t) * (size_t)T);
      if (!steps) return KILN_ERR_NOMEM;
      for (int64_t t = 0; t < T; t++) steps[t] = t;
      const int64_t tshape[2] = {T, 1};
      const char *st = reshape(g, ox_init_int64(g, "steps", T, steps), 2, tshape,
                               ox_tmp(g, "steps_col"));
      const char *pick = st ? ox_op2(g, "Equal", st, last, ox_tmp(g, "pick")) : NULL;
      const char *pick3 = pick ? ox_op2(g, "Unsqueeze", pick, ox_init_int64(g, "axes", 1, &two),
                                     ox_tmp(g, "pick3")) : NULL;
      const char *w = ox_tmp(g, "picked");
      if (!pick3 || !ox_node(g, "Where", 3, (const char *[]){pick3, x,
                                                             ox_init_scalar(g, "zero_f", 0.0f)},
                             1, &w))
        return KILN_ERR_NOMEM;
      const char *axes = ox_init_int64(g, "axes0", 1, &zero_axis);
      Onnx__NodeProto *s = ox_node(g, "ReduceSum", 2, (const char *[]){w, axes}, 1, &r);
      TRY_NODE(s);
      KILN_TRY(ox_attr_int(g, s, "keepdims", 0));
    }
  }
  int64_t shape[KILN_MAX_AXES];
  for (int a = 0; a < yb->naxes; a++) shape[a] = yb->shape[a];
  if (!reshape(g, r, yb->naxes, shape, out)) return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

const ox_layer_form ox_forms_seq[] = {
    {"SequencePool", emit_sequence_pool},
    {"Embed", emit_embed},
    {"LSTM", emit_recurrent},
    {"GRU", emit_recurrent},
    {"RNN", emit_recurrent},
    {"LayerNorm", emit_layer_norm},
    {"GELU", emit_gelu},
    {"Swish", emit_swish},
    {"PositionalEncoding", emit_positional},
    {"MultiHeadAttention", emit_attention},
    {NULL, NULL},
};
