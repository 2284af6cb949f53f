/* RNN and LSTM (Caffe's RNNLayer and LSTMLayer), run natively rather than as Caffe's unrolled net
 * of InnerProduct, Scale, Eltwise, TanH and LSTMUnit layers, with that net's arithmetic, its
 * parameter blobs in its order and shapes (a Caffe .caffemodel loads unchanged) and its state
 * rules; and GRU, which Caffe lacks, with PyTorch's nn.GRU arithmetic and blob layout under the
 * same bottoms, tops and state rules.
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
 * GRU (gates in PyTorch's order of the 3H rows: reset, update, new), with h' = cont_t h_{t-1}:
 *   gi = W_ih x_t + b_ih [+ W_static x_static],  gh = W_hh h' + b_hh
 *   r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r gh_n)
 *   h_t = (1 - z) n + z h';  the output is h.
 *   blobs: W_ih (3H x D), b_ih (3H), [W_static (3H x S)], W_hh (3H x H), b_hh (3H).
 * D and S are the features of x from axis 2 and of x_static from axis 1.
 *
 * Without expose_hidden the state carries over from one forward pass to the next, as Caffe's
 * does: h0 and c0 are the previous pass's hT and cT (zeros before the first pass, or when the
 * number of streams changed), so a stream whose cont is 1 at t = 0 continues where the last
 * batch left it; no gradient crosses batches. With expose_hidden, h0 and c0 are the bottoms.
 *
 * recurrent_param.bidirectional (kiln's) runs a second set of blobs, shaped as the first, over
 * the steps from T - 1 down to 0 and writes its H features after the forward direction's
 * (T x N x 2H). Step t of the reverse direction takes the state of step t + 1 times cont_{t+1}
 * (step t + 1 continues the sequence of step t), and step T - 1 starts from zeros: nothing
 * carries across batches backwards in time. It walks the blobs in place, with the steps' order
 * and the neighbour a step takes its state from swapped, rather than on reversed copies.
 *
 * The input projection of all T steps is one GEMM; the recurrence is one GEMM per step;
 * backward through time gathers every step's gate gradients so that the weight gradients and
 * the input gradient are one GEMM each again. A pass of small steps runs its GEMMs on one thread
 * (REC_SERIAL_STEP_MACS), which the layer tells each GEMM op through its context (c->nthreads
 * 1); the cells and copies take the layer's threads. */
#include <limits.h>
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__RecurrentParameter recurrent_defaults = CAFFE__RECURRENT_PARAMETER__INIT;

/* The buffers, each holding one slice per direction. */
enum { BUF_GATES, BUF_CELLS, BUF_HPREV, BUF_STATE }; /* LSTM's */
enum { BUF_HIDDEN, BUF_OUT };                        /* RNN's first two (then HPREV, STATE) */
enum { BUF_GH_N = 1 };                               /* GRU's second: W_hn h' + b_hn per step */

typedef enum { REC_RNN, REC_LSTM, REC_GRU } rec_kind;

typedef struct {
  rec_kind kind;
  bool expose, static_input;
  int nrec;                 /* recurrent state blobs: 1 (h) or 2 (h, c) */
  int ndir;                 /* 1, or 2 when bidirectional */
  int64_t T, N, D, S, H, G; /* steps, streams, x and x_static features, num_output, gate rows */
  int64_t carried_n;        /* streams the carried state belongs to; -1: none yet */
  /* parameter indices within one direction's blobs (-1: none), and how many it has */
  int p_wx, p_b, p_ws, p_wh, p_bh, p_wo, p_bo, nparam_dir;
  kiln_packed_gemm *pg[2]; /* the per-step products of forward and backward (step_gemm) */
  int gemm_threads;        /* the threads of this pass's GEMMs (each_direction) */
} rec_state;

/* What one direction works on: its blobs, its slice of every buffer, and its H features of each
 * output row (ldy apart). */
typedef struct {
  bool rev;
  kiln_blob **param;
  float *buf[4];
  float *y;
  const float *dy;
  int64_t ldy;
  float beta; /* on the bottoms' gradients: the second direction adds to the first's */
} rec_dir;

static bool fits_int(int64_t a, int64_t b) {
  return a <= INT_MAX && b <= INT_MAX && a * b <= INT_MAX;
}

/* p + k, where p may be the NULL of an empty blob (or of a diff a TEST net does not keep). */
static float *at(float *p, int64_t k) { return p ? p + k : NULL; }

static rec_dir direction(kiln_layer *l, const rec_state *s, int d) {
  const int64_t rows = s->T * s->N, nh = s->N * s->H;
  rec_dir r = {.rev = d == 1,
               .param = l->param + d * s->nparam_dir,
               .ldy = s->ndir * s->H,
               .beta = (float)d};
  r.buf[0] = at(l->buffer[0]->data, d * rows * s->G);
  r.buf[1] = at(l->buffer[1]->data, d * rows * s->H);
  r.buf[BUF_HPREV] = at(l->buffer[BUF_HPREV]->data, d * rows * s->H);
  r.buf[BUF_STATE] = at(l->buffer[BUF_STATE]->data, d * 2 * s->nrec * nh);
  r.y = at(l->top[0]->data, d * s->H);
  r.dy = at(l->top[0]->diff, d * s->H);
  return r;
}

/* The step that is k-th in the direction's order, and the one before it there (whose state it
 * takes). */
static inline int64_t step_time(const rec_dir *r, int64_t T, int64_t k) {
  return r->rev ? T - 1 - k : k;
}
static inline int64_t prev_time(const rec_dir *r, int64_t t) { return r->rev ? t + 1 : t - 1; }

/* The factors on the state step t takes, one per stream: cont_t forwards; cont_{t+1} in
 * reverse, where the last step has none to take (NULL: all 0). */
static const float *carry(kiln_layer *l, const rec_state *s, const rec_dir *r, int64_t t) {
  const float *cont = l->bottom[1]->data;
  if (!r->rev) return cont + t * s->N;
  return t + 1 < s->T ? cont + (t + 1) * s->N : NULL;
}

/* A weight matrix rows x cols, or with cols < 0 a bias vector of rows. */
static bool add_param(kiln_layer *l, int64_t rows, int64_t cols, const Caffe__FillerParameter *f) {
  const int64_t shape[2] = {rows, cols};
  return kiln_layer_add_param(l, cols < 0 ? 1 : 2, shape, f, 0) != NULL;
}

static int rec_setup(kiln_layer *l, rec_kind kind) {
  const Caffe__RecurrentParameter *p = KILN_PARAM_OR(l->lp->recurrent_param, recurrent_defaults);
  if (p->num_output == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "recurrent_param.num_output must be set and > 0");
  rec_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  const bool lstm = kind == REC_LSTM;
  s->kind = kind;
  s->nrec = lstm ? 2 : 1;
  s->expose = p->expose_hidden;
  s->ndir = p->bidirectional ? 2 : 1;
  s->carried_n = -1;
  /* The reverse direction starts at the batch's last step with nothing before it, so there is
   * no initial state to take in, and its final state (at t = 0) is no one's to continue. */
  if (s->expose && s->ndir == 2)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "recurrent_param.expose_hidden cannot be used with bidirectional");
  const char *state_names = lstm ? "h0 and c0" : "h0";
  const int base = 2 + (s->expose ? s->nrec : 0);
  if (l->nbottom != base && l->nbottom != base + 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "takes %d or %d bottoms (x, cont%s%s%s), got %d",
                            base, base + 1, ", optional x_static", s->expose ? ", " : "",
                            s->expose ? state_names : "", l->nbottom);
  const int ntops = 1 + (s->expose ? s->nrec : 0);
  if (l->ntop != ntops)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "takes %d top(s)%s, got %d", ntops,
                            !s->expose        ? ""
                            : lstm            ? " (h, hT, cT)"
                            : kind == REC_RNN ? " (o, hT)"
                                              : " (h, hT)",
                            l->ntop);
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
  s->G = (lstm ? 4 : kind == REC_GRU ? 3 : 1) * s->H;
  s->D = kiln_count(x, 2, x->naxes);
  if (s->static_input) {
    const kiln_blob *xs = l->bottom[2];
    if (xs->naxes < 2)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "x_static must have at least 2 axes (N x features), has %d",
                              xs->naxes);
    s->S = kiln_count(xs, 1, xs->naxes);
  }
  /* Caffe's order: the blobs of its unrolled net's layers in the order they appear (GRU:
   * PyTorch's, with the static weights where LSTM has them). The reverse direction's blobs
   * repeat the forward direction's, as PyTorch's *_reverse parameters do. */
  int64_t rows[6], cols[6]; /* one direction's blobs (add_param's sizes) */
  int n = 0;
#define SLOT(idx, r, c) (s->idx = n, rows[n] = (r), cols[n++] = (c))
  s->p_ws = s->p_bh = s->p_wo = s->p_bo = -1;
  SLOT(p_wx, s->G, s->D);
  SLOT(p_b, s->G, -1);
  if (s->static_input) SLOT(p_ws, s->G, s->S);
  SLOT(p_wh, s->G, s->H);
  if (kind == REC_GRU) SLOT(p_bh, s->G, -1);
  if (kind == REC_RNN) {
    SLOT(p_wo, s->H, s->H);
    SLOT(p_bo, s->H, -1);
  }
#undef SLOT
  s->nparam_dir = n;
  for (int d = 0; d < s->ndir; d++)
    for (int i = 0; i < n; i++)
      if (!add_param(l, rows[i], cols[i], cols[i] < 0 ? p->bias_filler : p->weight_filler))
        return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  const char *names[3][2] = {{"hidden", "output"}, {"gates", "cells"}, {"gates", "gh_n"}};
  const char *all[4] = {names[kind][0], names[kind][1], "h_prev", "state"};
  for (int i = 0; i < 4; i++)
    if (!kiln_layer_add_buffer(l, all[i])) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int lstm_setup(kiln_layer *l) { return rec_setup(l, REC_LSTM); }
static int rnn_setup(kiln_layer *l) { return rec_setup(l, REC_RNN); }
static int gru_setup(kiln_layer *l) { return rec_setup(l, REC_GRU); }

static int rec_reshape(kiln_layer *l) {
  rec_state *s = l->priv;
  const kiln_blob *x = l->bottom[0], *cont = l->bottom[1];
  char b1[64], b2[64];
  if (x->naxes < 3 || kiln_count(x, 2, x->naxes) != s->D)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "x is %s; the weights expect T x N x ... with %lld features per step",
                            kiln_blob_shape_string(x, b1, sizeof b1), (long long)s->D);
  const int64_t T = x->shape[0], N = x->shape[1], H = s->H, G = s->G, nd = s->ndir;
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
  KILN_TRY(kiln_blob_reshape(l->top[0], 3, (const int64_t[]){T, N, nd * H}));
  for (int r = 0; s->expose && r < s->nrec; r++)
    KILN_TRY(kiln_blob_reshape(l->top[1 + r], 3, state_shape));
  /* Each buffer holds the directions' slices one after the other. */
  KILN_TRY(kiln_blob_reshape(l->buffer[0], 3, (const int64_t[]){nd * T, N, G}));
  KILN_TRY(kiln_blob_reshape(l->buffer[1], 3, (const int64_t[]){nd * T, N, H}));
  KILN_TRY(kiln_blob_reshape(l->buffer[BUF_HPREV], 3, (const int64_t[]){nd * T, N, H}));
  /* Initial state (h0[, c0]) of this pass, then the final one (hT[, cT]), per direction. */
  KILN_TRY(kiln_blob_reshape(l->buffer[BUF_STATE], 3, (const int64_t[]){nd * 2 * s->nrec, N, H}));
  const int64_t ng = N * G, nh = N * H, st = s->static_input ? ng : 0;
  const int64_t fwd = s->kind == REC_GRU ? ng : st; /* GRU: one step's recurrent terms */
  const int64_t bwd = s->kind == REC_LSTM  ? rows * G + 2 * nh + st
                      : s->kind == REC_GRU ? 2 * rows * G + nh + st
                                           : 2 * rows * H + nh + st;
  l->workspace_floats = bwd > fwd ? bwd : fwd;
  const double gemm = 2.0 * rows * G * (s->D + H) + (s->static_input ? 2.0 * N * G * s->S : 0);
  const double pointwise = s->kind == REC_LSTM  ? 10.0 * rows * H
                           : s->kind == REC_GRU ? 12.0 * rows * H
                                                : 2.0 * rows * H * H + 4.0 * rows * H;
  l->flops = (double)nd * (gemm + pointwise);
  return KILN_OK;
}

/* An op of the pass's products (its GEMMs and the packed step products), on the threads
 * each_direction chose for them (rec_state.gemm_threads). */
#define GEMM_OP(l, s, op, ...)                                                                  \
  ((l)->backend->op(&(kiln_op_ctx){(s)->gemm_threads, (l)->config, (l)->backend->device},      \
                    __VA_ARGS__))

/* The initial state of this pass into the state buffer's first slots: the bottoms with
 * expose_hidden, else what the last pass left (zeros when there is none for these streams). The
 * reverse direction's is zeros. */
static int load_state(kiln_layer *l, rec_state *s) {
  float *st = l->buffer[BUF_STATE]->data;
  const int64_t nh = s->N * s->H;
  for (int r = 0; r < s->nrec; r++) {
    float *init = at(st, r * nh);
    if (s->expose)
      KILN_TRY(KILN_OP(l, copy, init, l->bottom[2 + s->static_input + r]->data, nh));
    else if (s->carried_n == s->N)
      KILN_TRY(KILN_OP(l, copy, init, at(st, (s->nrec + r) * nh), nh));
    else
      KILN_TRY(KILN_OP(l, fill, init, 0.0f, nh));
  }
  if (s->ndir == 2 && nh) KILN_TRY(KILN_OP(l, fill, st + 2 * s->nrec * nh, 0.0f, s->nrec * nh));
  return KILN_OK;
}

/* The forward direction's final state (last step's h, rows ld apart[, c]) into the state
 * buffer, and the tops with expose_hidden. */
static int save_state(kiln_layer *l, rec_state *s, const float *hT, int64_t ld, const float *cT) {
  float *st = l->buffer[BUF_STATE]->data;
  const int64_t N = s->N, H = s->H, nh = N * H;
  float *h = st + s->nrec * nh;
  KILN_TRY(KILN_OP(l, copy_blocks, h, H, hT, ld, H, N));
  if (cT) KILN_TRY(KILN_OP(l, copy, st + (s->nrec + 1) * nh, cT, nh));
  if (s->expose) {
    KILN_TRY(KILN_OP(l, copy, l->top[1]->data, h, nh));
    if (cT) KILN_TRY(KILN_OP(l, copy, l->top[2]->data, cT, nh));
  }
  s->carried_n = s->N;
  return KILN_OK;
}

/* pre (rows x G) = x W_x^T + b [+ (x_static W_s^T) for every step]: the input terms of every
 * step at once. `ws` holds N x G floats of scratch when there is a static input. */
static int input_projection(kiln_layer *l, rec_state *s, const rec_dir *r, float *pre,
                            float *ws) {
  const int64_t rows = s->T * s->N, G = s->G;
  KILN_TRY(GEMM_OP(l, s, gemm, pre, G, l->bottom[0]->data, s->D, r->param[s->p_wx]->data, s->D,
                   false, true, rows, G, s->D, 1.0f, 0.0f));
  KILN_TRY(KILN_OP(l, add_bias_rows, pre, r->param[s->p_b]->data, rows, G));
  if (s->static_input) {
    KILN_TRY(GEMM_OP(l, s, gemm, ws, G, l->bottom[2]->data, s->S, r->param[s->p_ws]->data, s->S,
                     false, true, s->N, G, s->S, 1.0f, 0.0f));
    /* the same terms at every step: a bias row of N G values over the T steps */
    KILN_TRY(KILN_OP(l, add_bias_rows, pre, ws, s->T, s->N * G));
  }
  return KILN_OK;
}

/* The per-step product of a pass (which 0: forward, hp W_h^T; 1: backward, d_t W_h), with this
 * direction's W_h packed once for its T steps; NULL when none could be made (the steps then
 * take plain GEMMs). Called at a direction's first step, since each direction has its own W_h. */
static kiln_packed_gemm *step_gemm(kiln_layer *l, rec_state *s, const rec_dir *r, int which,
                                   float beta) {
  const int64_t N = s->N, H = s->H, G = s->G;
  const int rc =
      which == 0 ? GEMM_OP(l, s, packed_gemm_update, &s->pg[0], true, N, G, H, H, H, G, beta)
                 : GEMM_OP(l, s, packed_gemm_update, &s->pg[1], false, N, H, G, G, H, H, beta);
  if (rc || GEMM_OP(l, s, packed_gemm_set_b, s->pg[which], r->param[s->p_wh]->data))
    return NULL;
  return s->pg[which];
}

/* hp = carry_t h_prev (N x H, h_prev's rows ld apart; kept for backward), then
 * out = hp W_h^T + beta out: the recurrent term of step t (beta the same at every step). */
static int recurrent_term(kiln_layer *l, rec_state *s, const rec_dir *r, int64_t t,
                          const float *h_prev, int64_t ld, float *out, float beta) {
  const int64_t N = s->N, H = s->H;
  float *hp = r->buf[BUF_HPREV] + t * N * H;
  KILN_TRY(KILN_OP(l, carry_rows, hp, h_prev, ld, carry(l, s, r, t), N, H));
  kiln_packed_gemm *pg = t == step_time(r, s->T, 0) ? step_gemm(l, s, r, 0, beta) : s->pg[0];
  if (pg) return GEMM_OP(l, s, packed_gemm_run, pg, out, hp);
  return GEMM_OP(l, s, gemm, out, s->G, hp, H, r->param[s->p_wh]->data, H, false, true, N, s->G,
                 H, 1.0f, beta);
}

/* A batch of no steps or no streams: the final state is the initial one (Caffe's h_T is then
 * h_0). */
static int empty_forward(kiln_layer *l, rec_state *s) {
  const float *st = l->buffer[BUF_STATE]->data;
  if (s->N * s->H > 0)
    KILN_TRY(save_state(l, s, st, s->H, s->kind == REC_LSTM ? st + s->N * s->H : NULL));
  s->carried_n = s->N;
  return KILN_OK;
}

typedef int (*dir_pass)(kiln_layer *l, rec_state *s, const rec_dir *r);

/* A step's recurrent GEMM (N x H by H x G) below this many multiply-adds runs on one thread
 * (of OpenBLAS and of oneDNN): OpenBLAS splits any GEMM above 2^18 of them across its threads,
 * and for a step of a few hundred thousand the hand-over costs more than the second core
 * gives; when the cores are shared with other processes, its spinning workers wait for
 * descheduled ones at every one of the T steps, which on a busy machine made a 64-wide LSTM
 * over 800 steps some 40 times slower. Larger steps keep every thread. The pass's other GEMMs
 * take the same threads as its steps. */
#define REC_SERIAL_STEP_MACS (1 << 22)

/* A forward or backward pass of one direction, for each direction in turn: the reverse one
 * second, as its bottom gradients add to the forward one's. */
static int each_direction(kiln_layer *l, rec_state *s, dir_pass pass) {
  const bool serial = (double)s->N * (double)s->G * (double)s->H < REC_SERIAL_STEP_MACS;
  s->gemm_threads = serial ? 1 : l->nthreads;
  for (int d = 0; d < s->ndir; d++) {
    const rec_dir r = direction(l, s, d);
    KILN_TRY(pass(l, s, &r));
  }
  return KILN_OK;
}

static int rec_forward(kiln_layer *l, dir_pass pass) {
  rec_state *s = l->priv;
  KILN_TRY(load_state(l, s));
  if (s->T * s->N == 0) return empty_forward(l, s);
  return each_direction(l, s, pass);
}

static int lstm_forward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  float *gates = r->buf[BUF_GATES], *cells = r->buf[BUF_CELLS];
  const float *st = r->buf[BUF_STATE];
  KILN_TRY(input_projection(l, s, r, gates, l->workspace));
  for (int64_t k = 0; k < T; k++) {
    const int64_t t = step_time(r, T, k), p = prev_time(r, t);
    const float *c_prev = k ? cells + p * nh : st + nh;
    float *a = gates + t * N * G, *h = r->y + t * N * ld;
    KILN_TRY(recurrent_term(l, s, r, t, k ? r->y + p * N * ld : st, k ? ld : H, a, 1.0f));
    KILN_TRY(KILN_OP(l, lstm_cell_fwd, cells + t * nh, h, ld, a, c_prev, carry(l, s, r, t), N, H));
  }
  if (!r->rev) KILN_TRY(save_state(l, s, r->y + (T - 1) * N * ld, ld, cells + (T - 1) * nh));
  return KILN_OK;
}

static int rnn_forward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, nh = N * H, rows = T * N;
  float *hid = r->buf[BUF_HIDDEN], *out = r->buf[BUF_OUT];
  KILN_TRY(input_projection(l, s, r, hid, l->workspace));
  for (int64_t k = 0; k < T; k++) {
    const int64_t t = step_time(r, T, k);
    float *z = hid + t * nh;
    KILN_TRY(recurrent_term(l, s, r, t, k ? hid + prev_time(r, t) * nh : r->buf[BUF_STATE], H, z,
                            1.0f));
    KILN_TRY(KILN_OP(l, rnn_step_fwd, z, nh));
  }
  /* o = tanh(h W_ho^T + b_o) for every step at once; kept in a buffer of the layer's own, as
   * backward needs it and a layer after this one may overwrite the top in place. */
  KILN_TRY(GEMM_OP(l, s, gemm, out, H, hid, H, r->param[s->p_wo]->data, H, false, true, rows, H,
                   H, 1.0f, 0.0f));
  KILN_TRY(KILN_OP(l, rnn_out_fwd, r->y, r->ldy, out, r->param[s->p_bo]->data, rows, H));
  if (!r->rev) KILN_TRY(save_state(l, s, hid + (T - 1) * nh, H, NULL));
  return KILN_OK;
}

static int gru_forward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  float *gates = r->buf[BUF_GATES], *ghn = r->buf[BUF_GH_N];
  float *gh = l->workspace; /* N x G: one step's W_hh h' (after the projection's scratch) */
  const float *bh = r->param[s->p_bh]->data;
  KILN_TRY(input_projection(l, s, r, gates, l->workspace));
  for (int64_t k = 0; k < T; k++) {
    const int64_t t = step_time(r, T, k), p = prev_time(r, t);
    KILN_TRY(recurrent_term(l, s, r, t, k ? r->y + p * N * ld : r->buf[BUF_STATE], k ? ld : H, gh,
                            0.0f));
    KILN_TRY(KILN_OP(l, gru_cell_fwd, r->y + t * N * ld, ld, ghn + t * nh, gates + t * N * G, gh,
                     bh, r->buf[BUF_HPREV] + t * nh, N, H));
  }
  if (!r->rev) KILN_TRY(save_state(l, s, r->y + (T - 1) * N * ld, ld, NULL));
  return KILN_OK;
}

static int lstm_forward(kiln_layer *l) { return rec_forward(l, lstm_forward_dir); }
static int rnn_forward(kiln_layer *l) { return rec_forward(l, rnn_forward_dir); }
static int gru_forward(kiln_layer *l) { return rec_forward(l, gru_forward_dir); }

/* After the pre-activation gradients of every step are known (d_in, rows x G, of the input
 * terms; d_rec of the recurrent ones, the same for LSTM and RNN): the weight and bias gradients
 * of the input, static and recurrent terms (accumulated), and the gradients of x and x_static
 * (the first direction overwrites them, the second adds) where wanted. `ws` holds N x G floats
 * of scratch. */
static int input_backward(kiln_layer *l, rec_state *s, const rec_dir *r, const float *d_in,
                          const float *d_rec, float *ws) {
  const int64_t rows = s->T * s->N, G = s->G, D = s->D, H = s->H;
  KILN_TRY(GEMM_OP(l, s, gemm, r->param[s->p_wx]->diff, D, d_in, G, l->bottom[0]->data, D, true,
                   false, G, D, rows, 1.0f, 1.0f));
  KILN_TRY(KILN_OP(l, sum_rows_into, r->param[s->p_b]->diff, d_in, rows, G));
  KILN_TRY(GEMM_OP(l, s, gemm, r->param[s->p_wh]->diff, H, d_rec, G, r->buf[BUF_HPREV], H, true,
                   false, G, H, rows, 1.0f, 1.0f));
  if (s->p_bh >= 0) KILN_TRY(KILN_OP(l, sum_rows_into, r->param[s->p_bh]->diff, d_rec, rows, G));
  if (l->propagate_down[0])
    KILN_TRY(GEMM_OP(l, s, gemm, l->bottom[0]->diff, D, d_in, G, r->param[s->p_wx]->data, D,
                     false, false, rows, D, G, 1.0f, r->beta));
  if (s->static_input) {
    /* The static term is added at every step: its gradient is the sum over the steps. */
    const int64_t ng = s->N * G, S = s->S;
    KILN_TRY(KILN_OP(l, copy, ws, d_in, ng));
    KILN_TRY(KILN_OP(l, sum_rows_into, ws, d_in + ng, s->T - 1, ng));
    KILN_TRY(GEMM_OP(l, s, gemm, r->param[s->p_ws]->diff, S, ws, G, l->bottom[2]->data, S, true,
                     false, G, S, s->N, 1.0f, 1.0f));
    if (l->propagate_down[2])
      KILN_TRY(GEMM_OP(l, s, gemm, l->bottom[2]->diff, S, ws, G, r->param[s->p_ws]->data, S,
                       false, false, s->N, S, G, 1.0f, r->beta));
  }
  return KILN_OK;
}

/* dh = carry_t (d_t W_h + beta dh): the gradient step t sends to the state it took (d_t: N x G
 * of the recurrent term's pre-activations; beta 1 adds a gradient already in dh). */
static int recurrent_backward(kiln_layer *l, rec_state *s, const rec_dir *r, int64_t t,
                              const float *d_t, float *dh, float beta) {
  const int64_t N = s->N, H = s->H;
  kiln_packed_gemm *pg =
      t == step_time(r, s->T, s->T - 1) ? step_gemm(l, s, r, 1, beta) : s->pg[1];
  if (pg)
    KILN_TRY(GEMM_OP(l, s, packed_gemm_run, pg, dh, d_t));
  else
    KILN_TRY(GEMM_OP(l, s, gemm, dh, H, d_t, s->G, r->param[s->p_wh]->data, H, false, false, N, H,
                     s->G, 1.0f, beta));
  return KILN_OP(l, carry_rows, dh, dh, H, carry(l, s, r, t), N, H);
}

/* The initial state's gradients to the h0 (and c0) bottoms, where exposed and wanted. */
static int state_backward(kiln_layer *l, rec_state *s, const float *dh0, const float *dc0) {
  if (!s->expose) return KILN_OK;
  const int b = 2 + s->static_input;
  const int64_t nh = s->N * s->H;
  if (l->propagate_down[b]) KILN_TRY(KILN_OP(l, copy, l->bottom[b]->diff, dh0, nh));
  if (dc0 && l->propagate_down[b + 1]) KILN_TRY(KILN_OP(l, copy, l->bottom[b + 1]->diff, dc0, nh));
  return KILN_OK;
}

/* With expose_hidden, the gradient arriving at a final-state top (else zeros: Caffe does not
 * carry gradients across batches, and the reverse direction's final state is no one's). */
static int final_state_grad(kiln_layer *l, rec_state *s, int r, float *into) {
  const int64_t nh = s->N * s->H;
  if (s->expose) return KILN_OP(l, copy, into, l->top[1 + r]->diff, nh);
  return KILN_OP(l, fill, into, 0.0f, nh);
}

static int rec_refuse_cont(kiln_layer *l) {
  return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                          "cannot backpropagate to the sequence indicators (cont)");
}

/* The backward of empty_forward: the final state's gradient passes straight to the initial one;
 * nothing reaches the weights, and x_static's gradient is zero. */
static int empty_backward(kiln_layer *l, rec_state *s) {
  if (s->static_input && l->propagate_down[2] && l->bottom[2]->count)
    KILN_TRY(KILN_OP(l, fill, l->bottom[2]->diff, 0.0f, l->bottom[2]->count));
  if (s->N * s->H == 0) return KILN_OK;
  const bool lstm = s->kind == REC_LSTM;
  float *dh = l->workspace, *dc = dh + s->N * s->H;
  KILN_TRY(final_state_grad(l, s, 0, dh));
  if (lstm) KILN_TRY(final_state_grad(l, s, 1, dc));
  return state_backward(l, s, dh, lstm ? dc : NULL);
}

static int rec_backward(kiln_layer *l, dir_pass pass) {
  if (l->propagate_down[1]) return rec_refuse_cont(l);
  rec_state *s = l->priv;
  if (s->T * s->N == 0) return empty_backward(l, s);
  return each_direction(l, s, pass);
}

static int lstm_backward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  const float *gates = r->buf[BUF_GATES], *cells = r->buf[BUF_CELLS], *st = r->buf[BUF_STATE];
  float *dgates = l->workspace; /* rows x G */
  float *dh = dgates + T * N * G, *dc = dh + nh, *ws = dc + nh;
  KILN_TRY(final_state_grad(l, s, 0, dh));
  KILN_TRY(final_state_grad(l, s, 1, dc));
  for (int64_t k = T - 1; k >= 0; k--) {
    const int64_t t = step_time(r, T, k);
    const float *c_prev = k ? cells + prev_time(r, t) * nh : st + nh;
    float *da = dgates + t * N * G;
    /* dc becomes c_prev's gradient in place; the output's gradient is dy plus the state's */
    KILN_TRY(KILN_OP(l, lstm_cell_bwd, dc, da, gates + t * N * G, cells + t * nh, c_prev, dc,
                     r->dy + t * N * ld, ld, dh, N, H));
    KILN_TRY(recurrent_backward(l, s, r, t, da, dh, 0.0f));
  }
  if (!r->rev) KILN_TRY(state_backward(l, s, dh, dc));
  return input_backward(l, s, r, dgates, dgates, ws);
}

static int rnn_backward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, nh = N * H, rows = T * N;
  const float *hid = r->buf[BUF_HIDDEN], *out = r->buf[BUF_OUT];
  float *dz = l->workspace;   /* rows x H: the gradient of h's pre-activation */
  float *dzo = dz + rows * H; /* rows x H: of o's pre-activation */
  float *dh = dzo + rows * H, *ws = dh + nh;
  KILN_TRY(KILN_OP(l, rnn_out_bwd, dzo, r->dy, r->ldy, out, rows, H));
  KILN_TRY(GEMM_OP(l, s, gemm, r->param[s->p_wo]->diff, H, dzo, H, hid, H, true, false, H, H,
                   rows, 1.0f, 1.0f));
  KILN_TRY(KILN_OP(l, sum_rows_into, r->param[s->p_bo]->diff, dzo, rows, H));
  /* What the outputs send to every h_t, for all steps at once; the recurrence adds the rest. */
  KILN_TRY(GEMM_OP(l, s, gemm, dz, H, dzo, H, r->param[s->p_wo]->data, H, false, false, rows, H,
                   H, 1.0f, 0.0f));
  KILN_TRY(final_state_grad(l, s, 0, dh));
  for (int64_t k = T - 1; k >= 0; k--) {
    const int64_t t = step_time(r, T, k);
    float *d = dz + t * nh;
    KILN_TRY(KILN_OP(l, rnn_step_bwd, d, dh, hid + t * nh, nh));
    KILN_TRY(recurrent_backward(l, s, r, t, d, dh, 0.0f));
  }
  if (!r->rev) KILN_TRY(state_backward(l, s, dh, NULL));
  return input_backward(l, s, r, dz, dz, ws);
}

/* GRU's step gradients (gru_cell_bwd): the input and the recurrent terms share the gradients of
 * r and z; of n's, the recurrent term's is r times the input's; h' also gets dh z directly
 * besides what the three gates' recurrent terms send back. */
static int gru_backward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  const float *gates = r->buf[BUF_GATES], *ghn = r->buf[BUF_GH_N], *hprev = r->buf[BUF_HPREV];
  float *d_in = l->workspace, *d_rec = d_in + T * N * G; /* rows x G each */
  float *dh = d_rec + T * N * G, *ws = dh + nh;
  KILN_TRY(final_state_grad(l, s, 0, dh));
  for (int64_t k = T - 1; k >= 0; k--) {
    const int64_t t = step_time(r, T, k);
    float *dr = d_rec + t * N * G;
    KILN_TRY(KILN_OP(l, gru_cell_bwd, d_in + t * N * G, dr, dh, r->dy + t * N * ld, ld,
                     gates + t * N * G, ghn + t * nh, hprev + t * nh, N, H));
    KILN_TRY(recurrent_backward(l, s, r, t, dr, dh, 1.0f));
  }
  if (!r->rev) KILN_TRY(state_backward(l, s, dh, NULL));
  return input_backward(l, s, r, d_in, d_rec, ws);
}

static int lstm_backward(kiln_layer *l) { return rec_backward(l, lstm_backward_dir); }
static int rnn_backward(kiln_layer *l) { return rec_backward(l, rnn_backward_dir); }
static int gru_backward(kiln_layer *l) { return rec_backward(l, gru_backward_dir); }

static void rec_destroy(kiln_layer *l) {
  rec_state *s = l->priv;
  if (s && l->backend) {
    KILN_OP(l, packed_gemm_free, s->pg[0]);
    KILN_OP(l, packed_gemm_free, s->pg[1]);
  }
  free(s);
}

/* The kernels every recurrent type runs, then the cells of its own. */
#define REC_KERNELS(...)                                                                        \
  KILN_KERNELS(KILN_OP_copy, KILN_OP_fill, KILN_OP_copy_blocks, KILN_OP_gemm,                  \
               KILN_OP_add_bias_rows, KILN_OP_sum_rows_into, KILN_OP_packed_gemm_update,       \
               KILN_OP_packed_gemm_set_b, KILN_OP_packed_gemm_run, KILN_OP_packed_gemm_free,   \
               KILN_OP_carry_rows, __VA_ARGS__)

const kiln_layer_ops kiln_layer_lstm = {
    .type = "LSTM", .min_bottoms = 2, .max_bottoms = 5, .min_tops = 1, .max_tops = 3,
    .no_gradient_bottoms = 1u << 1,
    .setup = lstm_setup, .reshape = rec_reshape, .forward = lstm_forward,
    .backward = lstm_backward, .destroy = rec_destroy,
    .kernels = REC_KERNELS(KILN_OP_lstm_cell_fwd, KILN_OP_lstm_cell_bwd),
};

const kiln_layer_ops kiln_layer_rnn = {
    .type = "RNN", .min_bottoms = 2, .max_bottoms = 4, .min_tops = 1, .max_tops = 2,
    .no_gradient_bottoms = 1u << 1,
    .setup = rnn_setup, .reshape = rec_reshape, .forward = rnn_forward,
    .backward = rnn_backward, .destroy = rec_destroy,
    .kernels = REC_KERNELS(KILN_OP_rnn_step_fwd, KILN_OP_rnn_step_bwd, KILN_OP_rnn_out_fwd,
                           KILN_OP_rnn_out_bwd),
};

const kiln_layer_ops kiln_layer_gru = {
    .type = "GRU", .min_bottoms = 2, .max_bottoms = 4, .min_tops = 1, .max_tops = 2,
    .no_gradient_bottoms = 1u << 1,
    .setup = gru_setup, .reshape = rec_reshape, .forward = gru_forward,
    .backward = gru_backward, .destroy = rec_destroy,
    .kernels = REC_KERNELS(KILN_OP_gru_cell_fwd, KILN_OP_gru_cell_bwd),
};
