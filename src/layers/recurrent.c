/* RNN and LSTM (Caffe's RNNLayer and LSTMLayer), run natively rather than as Caffe's unrolled net
 * of InnerProduct, Scale, Eltwise, TanH and LSTMUnit layers, with that net's arithmetic, its
 * parameter blobs in its order and shapes (a Caffe .caffemodel loads unchanged) and its state
 * rules.
 *
 * Bottoms: x (T x N x ...: T steps of N independent streams), cont (T x N: 0 where a stream
 * starts a new sequence), optionally x_static (N x ...), and with recurrent_param.expose_hidden
 * the initial state h0 (and c0 for LSTM), 1 x N x H each. Tops: the output (T x N x H, H =
 * num_output) and, with expose_hidden, the final state hT (and cT).
 *
 * LSTM, per step t (gates in the order of the 4H rows: input, forget, output, candidate):
 *   a_t = W_hc (cont_t h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static]
 *   i = sigmoid(a_i), f = cont_t sigmoid(a_f) (0 when cont_t is 0), o = sigmoid(a_o), g = tanh(a_g)
 *   c_t = f c_{t-1} + i g,  h_t = o tanh(c_t);  the output is h.
 *   blobs: W_xc (4H x D), b_c (4H), [W_xc_static (4H x S)], W_hc (4H x H).
 * RNN:
 *   h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static])
 *   o_t = tanh(W_ho h_t + b_o);  the output is o, hT is h_T.
 *   blobs: W_xh (H x D), b_h (H), [W_xh_static (H x S)], W_hh (H x H), W_ho (H x H), b_o (H).
 * D and S are the features of x from axis 2 and of x_static from axis 1.
 *
 * Without expose_hidden the state carries over from one forward pass to the next, as Caffe's
 * does: h0 and c0 are the previous pass's hT and cT (zeros before the first pass, or when the
 * number of streams changed), so a stream whose cont is 1 at t = 0 continues where the last
 * batch left it; no gradient crosses batches. With expose_hidden, h0 and c0 are the bottoms.
 *
 * The input projection of all T steps is one GEMM; the recurrence is one GEMM per step;
 * backward through time gathers every step's gate gradients so that the weight gradients and
 * the input gradient are one GEMM each again. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__RecurrentParameter recurrent_defaults = CAFFE__RECURRENT_PARAMETER__INIT;

enum { BUF_GATES, BUF_CELLS, BUF_HPREV, BUF_STATE }; /* LSTM's buffers */
enum { BUF_HIDDEN, BUF_OUT };                        /* RNN's first two (then HPREV, STATE) */

typedef struct {
  bool lstm, expose, static_input;
  int nrec;                 /* recurrent state blobs: 1 (h) or 2 (h, c) */
  int64_t T, N, D, S, H, G; /* steps, streams, x and x_static features, num_output, gate rows */
  int64_t carried_n;        /* streams the carried state belongs to; -1: none yet */
  /* parameter indices */
  int p_wx, p_b, p_ws, p_wh, p_wo, p_bo;
} rec_state;

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static bool fits_int(int64_t a, int64_t b) {
  return a <= INT_MAX && b <= INT_MAX && a * b <= INT_MAX;
}

static int rec_setup(kiln_layer *l, bool lstm) {
  const Caffe__RecurrentParameter *p = KILN_PARAM_OR(l->lp->recurrent_param, recurrent_defaults);
  if (p->num_output == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "recurrent_param.num_output must be set and > 0");
  rec_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->lstm = lstm;
  s->nrec = lstm ? 2 : 1;
  s->expose = p->expose_hidden;
  s->carried_n = -1;
  const char *state_names = lstm ? "h0 and c0" : "h0";
  const int base = 2 + (s->expose ? s->nrec : 0);
  if (l->nbottom != base && l->nbottom != base + 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "takes %d or %d bottoms (x, cont%s%s%s), got %d",
                            base, base + 1, ", optional x_static", s->expose ? ", " : "",
                            s->expose ? state_names : "", l->nbottom);
  const int ntops = 1 + (s->expose ? s->nrec : 0);
  if (l->ntop != ntops)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "takes %d top(s)%s, got %d", ntops,
                            s->expose ? (lstm ? " (h, hT, cT)" : " (o, hT)") : "", l->ntop);
  s->static_input = l->nbottom == base + 1;
  const kiln_blob *x = l->bottom[0], *cont = l->bottom[1];
  /* Caffe's unrolled net projects x with an InnerProduct on axis 2, which needs a third axis. */
  if (x->naxes < 3)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "x must have at least 3 axes (T x N x features), has %d", x->naxes);
  if (cont->naxes != 2)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "cont must have 2 axes (T x N), has %d",
                            cont->naxes);
  s->H = p->num_output;
  s->G = lstm ? 4 * s->H : s->H;
  s->D = kiln_count(x, 2, x->naxes);
  if (s->static_input) {
    const kiln_blob *xs = l->bottom[2];
    if (xs->naxes < 2)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "x_static must have at least 2 axes (N x features), has %d",
                              xs->naxes);
    s->S = kiln_count(xs, 1, xs->naxes);
  }
  const Caffe__FillerParameter *wf = p->weight_filler, *bf = p->bias_filler;
  int64_t shape[2];
#define ADD(idx, n, a, b, filler)                          \
  do {                                                     \
    shape[0] = (a), shape[1] = (b);                        \
    s->idx = l->nparam;                                    \
    if (!kiln_layer_add_param(l, (n), shape, (filler), 0)) \
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory"); \
  } while (0)
  /* Caffe's order: the blobs of its unrolled net's layers in the order they appear. */
  ADD(p_wx, 2, s->G, s->D, wf);
  ADD(p_b, 1, s->G, 0, bf);
  s->p_ws = -1;
  if (s->static_input) ADD(p_ws, 2, s->G, s->S, wf);
  ADD(p_wh, 2, s->G, s->H, wf);
  s->p_wo = s->p_bo = -1;
  if (!lstm) {
    ADD(p_wo, 2, s->H, s->H, wf);
    ADD(p_bo, 1, s->H, 0, bf);
  }
#undef ADD
  const char *names[4] = {lstm ? "gates" : "hidden", lstm ? "cells" : "output", "h_prev", "state"};
  for (int i = 0; i < 4; i++)
    if (!kiln_layer_add_buffer(l, names[i])) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int lstm_setup(kiln_layer *l) { return rec_setup(l, true); }
static int rnn_setup(kiln_layer *l) { return rec_setup(l, false); }

static int rec_reshape(kiln_layer *l) {
  rec_state *s = l->priv;
  const kiln_blob *x = l->bottom[0], *cont = l->bottom[1];
  char b1[64], b2[64];
  if (x->naxes < 3 || kiln_count(x, 2, x->naxes) != s->D)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "x is %s; the weights expect T x N x ... with %lld features per step",
                            kiln_blob_shape_string(x, b1, sizeof b1), (long long)s->D);
  const int64_t T = x->shape[0], N = x->shape[1], H = s->H, G = s->G;
  if (cont->naxes != 2 || cont->shape[0] != T || cont->shape[1] != N)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "cont is %s, x is %s: cont must be T x N",
                            kiln_blob_shape_string(cont, b1, sizeof b1),
                            kiln_blob_shape_string(x, b2, sizeof b2));
  if (s->static_input) {
    const kiln_blob *xs = l->bottom[2];
    if (xs->naxes < 2 || xs->shape[0] != N || kiln_count(xs, 1, xs->naxes) != s->S)
      return KILN_LAYER_ERROR(
          l, KILN_ERR_SHAPE,
          "x_static is %s; it must be N x ... (N = %lld) with %lld features from axis 1",
          kiln_blob_shape_string(xs, b1, sizeof b1), (long long)N, (long long)s->S);
  }
  const int64_t state_shape[3] = {1, N, H};
  if (s->expose)
    for (int r = 0; r < s->nrec; r++) {
      const kiln_blob *b = l->bottom[2 + s->static_input + r];
      bool same = b->naxes == 3;
      for (int a = 0; same && a < 3; a++) same = b->shape[a] == state_shape[a];
      if (!same)
        return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "%s is %s; it must be 1x%lldx%lld",
                                r ? "c0" : "h0", kiln_blob_shape_string(b, b1, sizeof b1),
                                (long long)N, (long long)H);
    }
  const int64_t rows = T * N;
  if (!fits_int(rows, G) || !fits_int(rows, s->D) || !fits_int(N, s->S) || !fits_int(G, s->D) ||
      !fits_int(G, s->S) || !fits_int(rows, H))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "too large for BLAS's int sizes");
  s->T = T;
  s->N = N;
  KILN_TRY(kiln_blob_reshape(l->top[0], 3, (const int64_t[]){T, N, H}));
  for (int r = 0; s->expose && r < s->nrec; r++)
    KILN_TRY(kiln_blob_reshape(l->top[1 + r], 3, state_shape));
  if (s->lstm) {
    KILN_TRY(kiln_blob_reshape(l->buffer[BUF_GATES], 3, (const int64_t[]){T, N, G}));
    KILN_TRY(kiln_blob_reshape(l->buffer[BUF_CELLS], 3, (const int64_t[]){T, N, H}));
  } else {
    KILN_TRY(kiln_blob_reshape(l->buffer[BUF_HIDDEN], 3, (const int64_t[]){T, N, H}));
    KILN_TRY(kiln_blob_reshape(l->buffer[BUF_OUT], 3, (const int64_t[]){T, N, H}));
  }
  KILN_TRY(kiln_blob_reshape(l->buffer[BUF_HPREV], 3, (const int64_t[]){T, N, H}));
  /* Initial state (h0[, c0]) of this pass, then the final one (hT[, cT]). */
  KILN_TRY(kiln_blob_reshape(l->buffer[BUF_STATE], 3, (const int64_t[]){2 * s->nrec, N, H}));
  const int64_t st = s->static_input ? N * G : 0;
  const int64_t bwd = s->lstm ? rows * G + 3 * N * H + st : 2 * rows * H + 3 * N * H;
  l->workspace_floats = bwd > st ? bwd : st;
  const double gemm = 2.0 * rows * G * (s->D + H) + (s->static_input ? 2.0 * N * G * s->S : 0);
  l->flops = gemm + (s->lstm ? 10.0 * rows * H : 2.0 * rows * H * H + 4.0 * rows * H);
  return KILN_OK;
}

/* The initial state of this pass into the state buffer's first slots: the bottoms with
 * expose_hidden, else what the last pass left (zeros when there is none for these streams). */
static void load_state(kiln_layer *l, rec_state *s) {
  float *st = l->buffer[BUF_STATE]->data;
  const int64_t nh = s->N * s->H;
  for (int r = 0; r < s->nrec; r++) {
    float *init = st + r * nh;
    if (s->expose)
      memcpy(init, l->bottom[2 + s->static_input + r]->data, sizeof(float) * (size_t)nh);
    else if (s->carried_n == s->N)
      memcpy(init, st + (s->nrec + r) * nh, sizeof(float) * (size_t)nh);
    else
      memset(init, 0, sizeof(float) * (size_t)nh);
  }
}

/* The final state (last step's h[, c]) into the state buffer, and the tops with expose_hidden. */
static void save_state(kiln_layer *l, rec_state *s, const float *hT, const float *cT) {
  float *st = l->buffer[BUF_STATE]->data;
  const int64_t nh = s->N * s->H;
  memcpy(st + s->nrec * nh, hT, sizeof(float) * (size_t)nh);
  if (cT) memcpy(st + (s->nrec + 1) * nh, cT, sizeof(float) * (size_t)nh);
  if (s->expose) {
    memcpy(l->top[1]->data, hT, sizeof(float) * (size_t)nh);
    if (cT) memcpy(l->top[2]->data, cT, sizeof(float) * (size_t)nh);
  }
  s->carried_n = s->N;
}

/* pre (rows x G) = x W_x^T + b [+ (x_static W_s^T) for every step]: the input terms of every
 * step at once. `ws` holds N x G floats of scratch when there is a static input. */
static void input_projection(kiln_layer *l, rec_state *s, float *pre, float *ws) {
  const int64_t rows = s->T * s->N, G = s->G;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)G, (int)s->D, 1.0f,
              l->bottom[0]->data, (int)s->D, l->param[s->p_wx]->data, (int)s->D, 0.0f, pre, (int)G);
  const float *b = l->param[s->p_b]->data;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t g = 0; g < G; g++) pre[r * G + g] += b[g];
  if (s->static_input) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)s->N, (int)G, (int)s->S, 1.0f,
                l->bottom[2]->data, (int)s->S, l->param[s->p_ws]->data, (int)s->S, 0.0f, ws,
                (int)G);
    for (int64_t t = 0; t < s->T; t++)
      for (int64_t i = 0; i < s->N * G; i++) pre[t * s->N * G + i] += ws[i];
  }
}

/* hp = cont_t h_prev (N x H), then pre_t += hp W_h^T: the recurrent term of step t. */
static void recurrent_term(kiln_layer *l, rec_state *s, int64_t t, const float *h_prev,
                           float *pre_t) {
  const int64_t N = s->N, H = s->H;
  const float *cont = l->bottom[1]->data + t * N;
  float *hp = l->buffer[BUF_HPREV]->data + t * N * H;
  for (int64_t n = 0; n < N; n++)
    for (int64_t d = 0; d < H; d++) hp[n * H + d] = cont[n] * h_prev[n * H + d];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)s->G, (int)H, 1.0f, hp, (int)H,
              l->param[s->p_wh]->data, (int)H, 1.0f, pre_t, (int)s->G);
}

/* A batch of no steps or no streams: the final state is the initial one (Caffe's h_T is then
 * h_0). */
static int empty_forward(kiln_layer *l, rec_state *s) {
  const float *st = l->buffer[BUF_STATE]->data;
  if (s->N * s->H > 0) save_state(l, s, st, s->lstm ? st + s->N * s->H : NULL);
  s->carried_n = s->N;
  return KILN_OK;
}

static int lstm_forward(kiln_layer *l) {
  rec_state *s = l->priv;
  const int64_t N = s->N, H = s->H, G = s->G, nh = N * H;
  float *gates = l->buffer[BUF_GATES]->data, *cells = l->buffer[BUF_CELLS]->data;
  float *h = l->top[0]->data;
  const float *st = l->buffer[BUF_STATE]->data;
  load_state(l, s);
  if (s->T * N == 0) return empty_forward(l, s);
  input_projection(l, s, gates, l->workspace);
  for (int64_t t = 0; t < s->T; t++) {
    const float *h_prev = t ? h + (t - 1) * nh : st;
    const float *c_prev = t ? cells + (t - 1) * nh : st + nh;
    float *a = gates + t * N * G;
    recurrent_term(l, s, t, h_prev, a);
    const float *cont = l->bottom[1]->data + t * N;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (nh > 32768)
    for (int64_t n = 0; n < N; n++) {
      float *an = a + n * G;
      const float cn = cont[n];
      for (int64_t d = 0; d < H; d++) {
        const float i = sigmoidf(an[d]);
        /* Caffe's LSTMUnit folds cont into the forget gate, and its backward takes f (1 - f) of
         * that product as the gate's derivative; both are kept (exact for cont in {0, 1}). */
        const float f = cn == 0 ? 0.0f : cn * sigmoidf(an[H + d]);
        const float o = sigmoidf(an[2 * H + d]);
        const float g = tanhf(an[3 * H + d]);
        const float c = f * c_prev[n * H + d] + i * g;
        an[d] = i, an[H + d] = f, an[2 * H + d] = o, an[3 * H + d] = g;
        cells[t * nh + n * H + d] = c;
        h[t * nh + n * H + d] = o * tanhf(c);
      }
    }
  }
  save_state(l, s, h + (s->T - 1) * nh, cells + (s->T - 1) * nh);
  return KILN_OK;
}

static int rnn_forward(kiln_layer *l) {
  rec_state *s = l->priv;
  const int64_t N = s->N, H = s->H, nh = N * H, rows = s->T * N;
  float *hid = l->buffer[BUF_HIDDEN]->data, *out = l->buffer[BUF_OUT]->data;
  const float *st = l->buffer[BUF_STATE]->data;
  load_state(l, s);
  if (rows == 0) return empty_forward(l, s);
  input_projection(l, s, hid, l->workspace);
  for (int64_t t = 0; t < s->T; t++) {
    float *z = hid + t * nh;
    recurrent_term(l, s, t, t ? z - nh : st, z);
    for (int64_t i = 0; i < nh; i++) z[i] = tanhf(z[i]);
  }
  /* o = tanh(h W_ho^T + b_o) for every step at once; kept in a buffer of the layer's own, as
   * backward needs it and a layer after this one may overwrite the top in place. */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)H, (int)H, 1.0f, hid, (int)H,
              l->param[s->p_wo]->data, (int)H, 0.0f, out, (int)H);
  const float *bo = l->param[s->p_bo]->data;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d = 0; d < H; d++) out[r * H + d] = tanhf(out[r * H + d] + bo[d]);
  memcpy(l->top[0]->data, out, sizeof(float) * (size_t)(rows * H));
  save_state(l, s, hid + (s->T - 1) * nh, NULL);
  return KILN_OK;
}

/* After the pre-activation gradients d (rows x G) of every step are known: the weight and bias
 * gradients of the input, static and recurrent terms (accumulated), and the gradients of x and
 * x_static (overwritten) where wanted. `ws` holds N x G floats of scratch. */
static void input_backward(kiln_layer *l, rec_state *s, const float *d, float *ws) {
  const int64_t rows = s->T * s->N, G = s->G, D = s->D, H = s->H;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)G, (int)D, (int)rows, 1.0f, d, (int)G,
              l->bottom[0]->data, (int)D, 1.0f, l->param[s->p_wx]->diff, (int)D);
  float *db = l->param[s->p_b]->diff;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t g = 0; g < G; g++) db[g] += d[r * G + g];
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)G, (int)H, (int)rows, 1.0f, d, (int)G,
              l->buffer[BUF_HPREV]->data, (int)H, 1.0f, l->param[s->p_wh]->diff, (int)H);
  if (l->propagate_down[0])
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)D, (int)G, 1.0f, d,
                (int)G, l->param[s->p_wx]->data, (int)D, 0.0f, l->bottom[0]->diff, (int)D);
  if (s->static_input) {
    /* The static term is added at every step: its gradient is the sum over the steps. */
    const int64_t ng = s->N * G, S = s->S;
    memcpy(ws, d, sizeof(float) * (size_t)ng);
    for (int64_t t = 1; t < s->T; t++)
      for (int64_t i = 0; i < ng; i++) ws[i] += d[t * ng + i];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)G, (int)S, (int)s->N, 1.0f, ws,
                (int)G, l->bottom[2]->data, (int)S, 1.0f, l->param[s->p_ws]->diff, (int)S);
    if (l->propagate_down[2])
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s->N, (int)S, (int)G, 1.0f, ws,
                  (int)G, l->param[s->p_ws]->data, (int)S, 0.0f, l->bottom[2]->diff, (int)S);
  }
}

/* dh_prev = cont_t (d_t W_h): the gradient step t sends to h_{t-1} (d_t: N x G). */
static void recurrent_backward(kiln_layer *l, rec_state *s, int64_t t, const float *d_t,
                               float *dh_prev) {
  const int64_t N = s->N, H = s->H;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)H, (int)s->G, 1.0f, d_t,
              (int)s->G, l->param[s->p_wh]->data, (int)H, 0.0f, dh_prev, (int)H);
  const float *cont = l->bottom[1]->data + t * N;
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < H; k++) dh_prev[n * H + k] *= cont[n];
}

/* The initial state's gradients to the h0 (and c0) bottoms, where exposed and wanted. */
static void state_backward(kiln_layer *l, rec_state *s, const float *dh0, const float *dc0) {
  if (!s->expose) return;
  const int b = 2 + s->static_input;
  const size_t bytes = sizeof(float) * (size_t)(s->N * s->H);
  if (l->propagate_down[b]) memcpy(l->bottom[b]->diff, dh0, bytes);
  if (dc0 && l->propagate_down[b + 1]) memcpy(l->bottom[b + 1]->diff, dc0, bytes);
}

/* With expose_hidden, the gradient arriving at a final-state top (else zeros: Caffe does not
 * carry gradients across batches). */
static void final_state_grad(kiln_layer *l, rec_state *s, int r, float *into) {
  const size_t bytes = sizeof(float) * (size_t)(s->N * s->H);
  if (s->expose)
    memcpy(into, l->top[1 + r]->diff, bytes);
  else
    memset(into, 0, bytes);
}

static int rec_refuse_cont(kiln_layer *l) {
  return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                          "cannot backpropagate to the sequence indicators (cont)");
}

/* The backward of empty_forward: the final state's gradient passes straight to the initial one;
 * nothing reaches the weights, and x_static's gradient is zero. */
static int empty_backward(kiln_layer *l, rec_state *s) {
  if (s->static_input && l->propagate_down[2] && l->bottom[2]->count)
    memset(l->bottom[2]->diff, 0, sizeof(float) * (size_t)l->bottom[2]->count);
  if (s->N * s->H == 0) return KILN_OK;
  float *dh = l->workspace, *dc = dh + s->N * s->H;
  final_state_grad(l, s, 0, dh);
  if (s->lstm) final_state_grad(l, s, 1, dc);
  state_backward(l, s, dh, s->lstm ? dc : NULL);
  return KILN_OK;
}

static int lstm_backward(kiln_layer *l) {
  if (l->propagate_down[1]) return rec_refuse_cont(l);
  rec_state *s = l->priv;
  const int64_t N = s->N, H = s->H, G = s->G, nh = N * H;
  const float *gates = l->buffer[BUF_GATES]->data, *cells = l->buffer[BUF_CELLS]->data;
  if (s->T * N == 0) return empty_backward(l, s);
  const float *st = l->buffer[BUF_STATE]->data, *dtop = l->top[0]->diff;
  float *dgates = l->workspace; /* rows x G */
  float *dh = dgates + s->T * N * G, *dc = dh + nh, *dhp = dc + nh, *ws = dhp + nh;
  final_state_grad(l, s, 0, dh);
  final_state_grad(l, s, 1, dc);
  for (int64_t t = s->T - 1; t >= 0; t--) {
    const float *a = gates + t * N * G, *c = cells + t * nh;
    const float *c_prev = t ? cells + (t - 1) * nh : st + nh;
    float *da = dgates + t * N * G;
    const float *dy = dtop + t * nh;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (nh > 32768)
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < H; k++) {
        const int64_t e = n * H + k;
        const float *an = a + n * G;
        const float i = an[k], f = an[H + k], o = an[2 * H + k], g = an[3 * H + k];
        const float tc = tanhf(c[e]);
        const float dh_t = dy[e] + dh[e];
        const float dc_t = dc[e] + dh_t * o * (1 - tc * tc);
        float *dan = da + n * G;
        dan[k] = dc_t * g * i * (1 - i);
        dan[H + k] = dc_t * c_prev[e] * f * (1 - f);
        dan[2 * H + k] = dh_t * tc * o * (1 - o);
        dan[3 * H + k] = dc_t * i * (1 - g * g);
        dc[e] = dc_t * f;
      }
    recurrent_backward(l, s, t, da, dhp);
    memcpy(dh, dhp, sizeof(float) * (size_t)nh);
  }
  state_backward(l, s, dh, dc);
  input_backward(l, s, dgates, ws);
  return KILN_OK;
}

static int rnn_backward(kiln_layer *l) {
  if (l->propagate_down[1]) return rec_refuse_cont(l);
  rec_state *s = l->priv;
  const int64_t N = s->N, H = s->H, nh = N * H, rows = s->T * N;
  const float *hid = l->buffer[BUF_HIDDEN]->data, *out = l->buffer[BUF_OUT]->data;
  if (rows == 0) return empty_backward(l, s);
  const float *dtop = l->top[0]->diff;
  float *dz = l->workspace;   /* rows x H: the gradient of h's pre-activation */
  float *dzo = dz + rows * H; /* rows x H: of o's pre-activation */
  float *dh = dzo + rows * H, *dhp = dh + nh, *ws = dhp + nh;
  for (int64_t i = 0; i < rows * H; i++) dzo[i] = dtop[i] * (1 - out[i] * out[i]);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)H, (int)rows, 1.0f, dzo, (int)H,
              hid, (int)H, 1.0f, l->param[s->p_wo]->diff, (int)H);
  float *dbo = l->param[s->p_bo]->diff;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d = 0; d < H; d++) dbo[d] += dzo[r * H + d];
  /* What the outputs send to every h_t, for all steps at once; the recurrence adds the rest. */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)H, (int)H, 1.0f, dzo,
              (int)H, l->param[s->p_wo]->data, (int)H, 0.0f, dz, (int)H);
  final_state_grad(l, s, 0, dh);
  for (int64_t t = s->T - 1; t >= 0; t--) {
    float *d = dz + t * nh;
    const float *h = hid + t * nh;
    for (int64_t i = 0; i < nh; i++) d[i] = (d[i] + dh[i]) * (1 - h[i] * h[i]);
    recurrent_backward(l, s, t, d, dhp);
    memcpy(dh, dhp, sizeof(float) * (size_t)nh);
  }
  state_backward(l, s, dh, NULL);
  input_backward(l, s, dz, ws);
  return KILN_OK;
}

static void rec_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_lstm = {
    .type = "LSTM", .min_bottoms = 2, .max_bottoms = 5, .min_tops = 1, .max_tops = 3,
    .no_gradient_bottoms = 1u << 1,
    .setup = lstm_setup, .reshape = rec_reshape, .forward = lstm_forward,
    .backward = lstm_backward, .destroy = rec_destroy,
};

const kiln_layer_ops kiln_layer_rnn = {
    .type = "RNN", .min_bottoms = 2, .max_bottoms = 4, .min_tops = 1, .max_tops = 2,
    .no_gradient_bottoms = 1u << 1,
    .setup = rnn_setup, .reshape = rec_reshape, .forward = rnn_forward,
    .backward = rnn_backward, .destroy = rec_destroy,
};
