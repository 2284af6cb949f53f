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
 * the input gradient are one GEMM each again. */
#include <omp.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
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
  kiln_gemm_plan *plan[2]; /* the per-step products of forward and backward (step_plan) */
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

/* The initial state of this pass into the state buffer's first slots: the bottoms with
 * expose_hidden, else what the last pass left (zeros when there is none for these streams). The
 * reverse direction's is zeros. */
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
  if (s->ndir == 2 && nh) memset(st + 2 * s->nrec * nh, 0, sizeof(float) * (size_t)(s->nrec * nh));
}

/* The forward direction's final state (last step's h, rows ld apart[, c]) into the state
 * buffer, and the tops with expose_hidden. */
static void save_state(kiln_layer *l, rec_state *s, const float *hT, int64_t ld, const float *cT) {
  float *st = l->buffer[BUF_STATE]->data;
  const int64_t N = s->N, H = s->H, nh = N * H;
  float *h = st + s->nrec * nh;
  for (int64_t n = 0; n < N; n++) memcpy(h + n * H, hT + n * ld, sizeof(float) * (size_t)H);
  if (cT) memcpy(st + (s->nrec + 1) * nh, cT, sizeof(float) * (size_t)nh);
  if (s->expose) {
    memcpy(l->top[1]->data, h, sizeof(float) * (size_t)nh);
    if (cT) memcpy(l->top[2]->data, cT, sizeof(float) * (size_t)nh);
  }
  s->carried_n = s->N;
}

/* pre (rows x G) = x W_x^T + b [+ (x_static W_s^T) for every step]: the input terms of every
 * step at once. `ws` holds N x G floats of scratch when there is a static input. */
static void input_projection(kiln_layer *l, rec_state *s, const rec_dir *r, float *pre, float *ws) {
  const int64_t rows = s->T * s->N, G = s->G;
  kiln_sgemm(l->config, false, true, rows, G, s->D, 1.0f, l->bottom[0]->data, s->D,
             r->param[s->p_wx]->data, s->D, 0.0f, pre, G);
  const float *b = r->param[s->p_b]->data;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t g = 0; g < G; g++) pre[i * G + g] += b[g];
  if (s->static_input) {
    kiln_sgemm(l->config, false, true, s->N, G, s->S, 1.0f, l->bottom[2]->data, s->S,
               r->param[s->p_ws]->data, s->S, 0.0f, ws, G);
    for (int64_t t = 0; t < s->T; t++)
      for (int64_t i = 0; i < s->N * G; i++) pre[t * s->N * G + i] += ws[i];
  }
}

/* The per-step product of a pass (which 0: forward, hp W_h^T; 1: backward, d_t W_h), with this
 * direction's W_h packed once for its T steps; NULL when no plan could be made (the steps then
 * take plain GEMMs). Called at a direction's first step, since each direction has its own W_h. */
static kiln_gemm_plan *step_plan(kiln_layer *l, rec_state *s, const rec_dir *r, int which,
                                 float beta) {
  const int64_t N = s->N, H = s->H, G = s->G;
  const int rc =
      which == 0 ? kiln_gemm_plan_update(&s->plan[0], l->config, true, N, G, H, H, H, beta, G)
                 : kiln_gemm_plan_update(&s->plan[1], l->config, false, N, H, G, G, H, beta, H);
  if (rc) return NULL;
  kiln_gemm_plan_set_b(s->plan[which], r->param[s->p_wh]->data);
  return s->plan[which];
}

/* hp = carry_t h_prev (N x H, h_prev's rows ld apart; kept for backward), then
 * out = hp W_h^T + beta out: the recurrent term of step t (beta the same at every step). */
static void recurrent_term(kiln_layer *l, rec_state *s, const rec_dir *r, int64_t t,
                           const float *h_prev, int64_t ld, float *out, float beta) {
  const int64_t N = s->N, H = s->H;
  const float *m = carry(l, s, r, t);
  float *hp = r->buf[BUF_HPREV] + t * N * H;
  for (int64_t n = 0; n < N; n++)
    for (int64_t d = 0; d < H; d++) hp[n * H + d] = m ? m[n] * h_prev[n * ld + d] : 0.0f;
  kiln_gemm_plan *plan = t == step_time(r, s->T, 0) ? step_plan(l, s, r, 0, beta) : s->plan[0];
  if (plan)
    kiln_gemm_plan_run(plan, hp, out);
  else
    kiln_sgemm(l->config, false, true, N, s->G, H, 1.0f, hp, H, r->param[s->p_wh]->data, H, beta,
               out, s->G);
}

/* A batch of no steps or no streams: the final state is the initial one (Caffe's h_T is then
 * h_0). */
static int empty_forward(kiln_layer *l, rec_state *s) {
  const float *st = l->buffer[BUF_STATE]->data;
  if (s->N * s->H > 0) save_state(l, s, st, s->H, s->kind == REC_LSTM ? st + s->N * s->H : NULL);
  s->carried_n = s->N;
  return KILN_OK;
}

typedef void (*dir_pass)(kiln_layer *l, rec_state *s, const rec_dir *r);

/* A forward or backward pass of one direction, for each direction in turn: the reverse one
 * second, as its bottom gradients add to the forward one's. */
/* A step's recurrent GEMM (N x H by H x G) below this many multiply-adds runs on one thread
 * (of OpenBLAS and of OpenMP, which oneDNN's matmul uses): OpenBLAS splits any GEMM above 2^18 of them across its threads, and for a step of a
 * few hundred thousand the hand-over costs more than the second core gives; when the cores are
 * shared with other processes, its spinning workers wait for descheduled ones at every one of
 * the T steps, which on a busy machine made a 64-wide LSTM over 800 steps some 40 times
 * slower. Larger steps keep every thread. */
#define REC_SERIAL_STEP_MACS (1 << 22)

static int each_direction(kiln_layer *l, rec_state *s, dir_pass pass) {
  const bool serial = (double)s->N * (double)s->G * (double)s->H < REC_SERIAL_STEP_MACS;
  const int prev = serial ? kiln_blas_serial_begin() : 0;
  const int omp_prev = omp_get_max_threads();
  if (serial) omp_set_num_threads(1);
  for (int d = 0; d < s->ndir; d++) {
    const rec_dir r = direction(l, s, d);
    pass(l, s, &r);
  }
  if (serial) {
    omp_set_num_threads(omp_prev);
    kiln_blas_serial_end(prev);
  }
  return KILN_OK;
}

static int rec_forward(kiln_layer *l, dir_pass pass) {
  rec_state *s = l->priv;
  load_state(l, s);
  if (s->T * s->N == 0) return empty_forward(l, s);
  return each_direction(l, s, pass);
}

static void lstm_forward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  float *gates = r->buf[BUF_GATES], *cells = r->buf[BUF_CELLS];
  const float *st = r->buf[BUF_STATE];
  input_projection(l, s, r, gates, l->workspace);
  for (int64_t k = 0; k < T; k++) {
    const int64_t t = step_time(r, T, k), p = prev_time(r, t);
    const float *c_prev = k ? cells + p * nh : st + nh;
    float *a = gates + t * N * G, *h = r->y + t * N * ld;
    recurrent_term(l, s, r, t, k ? r->y + p * N * ld : st, k ? ld : H, a, 1.0f);
    const float *m = carry(l, s, r, t);
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (nh > 32768)
    for (int64_t n = 0; n < N; n++) {
      float *an = a + n * G;
      const float cn = m ? m[n] : 0.0f;
#pragma omp simd
      for (int64_t d = 0; d < H; d++)
        cells[t * nh + n * H + d] =
            kiln_lstm_cell(an + d, H, cn, c_prev[n * H + d], &h[n * ld + d]);
    }
  }
  if (!r->rev) save_state(l, s, r->y + (T - 1) * N * ld, ld, cells + (T - 1) * nh);
}

static void rnn_forward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, nh = N * H, rows = T * N;
  float *hid = r->buf[BUF_HIDDEN], *out = r->buf[BUF_OUT];
  input_projection(l, s, r, hid, l->workspace);
  for (int64_t k = 0; k < T; k++) {
    const int64_t t = step_time(r, T, k);
    float *z = hid + t * nh;
    recurrent_term(l, s, r, t, k ? hid + prev_time(r, t) * nh : r->buf[BUF_STATE], H, z, 1.0f);
#pragma omp simd
    for (int64_t i = 0; i < nh; i++) z[i] = kiln_vtanhf(z[i]);
  }
  /* o = tanh(h W_ho^T + b_o) for every step at once; kept in a buffer of the layer's own, as
   * backward needs it and a layer after this one may overwrite the top in place. */
  kiln_sgemm(l->config, false, true, rows, H, H, 1.0f, hid, H, r->param[s->p_wo]->data, H, 0.0f,
             out, H);
  const float *bo = r->param[s->p_bo]->data;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t d = 0; d < H; d++) {
      out[i * H + d] = kiln_vtanhf(out[i * H + d] + bo[d]);
      r->y[i * r->ldy + d] = out[i * H + d];
    }
  if (!r->rev) save_state(l, s, hid + (T - 1) * nh, H, NULL);
}

static void gru_forward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  float *gates = r->buf[BUF_GATES], *ghn = r->buf[BUF_GH_N];
  float *gh = l->workspace; /* N x G: one step's W_hh h' (after the projection's scratch) */
  const float *bh = r->param[s->p_bh]->data;
  input_projection(l, s, r, gates, l->workspace);
  for (int64_t k = 0; k < T; k++) {
    const int64_t t = step_time(r, T, k), p = prev_time(r, t);
    recurrent_term(l, s, r, t, k ? r->y + p * N * ld : r->buf[BUF_STATE], k ? ld : H, gh, 0.0f);
    float *a = gates + t * N * G, *h = r->y + t * N * ld, *gn = ghn + t * nh;
    const float *hp = r->buf[BUF_HPREV] + t * nh;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (nh > 32768)
    for (int64_t n = 0; n < N; n++) {
      float *an = a + n * G;
      const float *hn = gh + n * G;
#pragma omp simd
      for (int64_t d = 0; d < H; d++) {
        const float rr = kiln_vsigmoidf(an[d] + hn[d] + bh[d]);
        const float z = kiln_vsigmoidf(an[H + d] + hn[H + d] + bh[H + d]);
        const float g = hn[2 * H + d] + bh[2 * H + d];
        const float c = kiln_vtanhf(an[2 * H + d] + rr * g);
        /* Kept for backward: the gates, and r's factor in n (which r scales, so it is kept
         * apart from the input's part of n). */
        an[d] = rr, an[H + d] = z, an[2 * H + d] = c;
        gn[n * H + d] = g;
        h[n * ld + d] = (1 - z) * c + z * hp[n * H + d];
      }
    }
  }
  if (!r->rev) save_state(l, s, r->y + (T - 1) * N * ld, ld, NULL);
}

static int lstm_forward(kiln_layer *l) { return rec_forward(l, lstm_forward_dir); }
static int rnn_forward(kiln_layer *l) { return rec_forward(l, rnn_forward_dir); }
static int gru_forward(kiln_layer *l) { return rec_forward(l, gru_forward_dir); }

/* Column sums of a (rows x cols) added into b. */
static void add_column_sums(float *b, const float *a, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t g = 0; g < cols; g++) b[g] += a[i * cols + g];
}

/* After the pre-activation gradients of every step are known (d_in, rows x G, of the input
 * terms; d_rec of the recurrent ones, the same for LSTM and RNN): the weight and bias gradients
 * of the input, static and recurrent terms (accumulated), and the gradients of x and x_static
 * (the first direction overwrites them, the second adds) where wanted. `ws` holds N x G floats
 * of scratch. */
static void input_backward(kiln_layer *l, rec_state *s, const rec_dir *r, const float *d_in,
                           const float *d_rec, float *ws) {
  const int64_t rows = s->T * s->N, G = s->G, D = s->D, H = s->H;
  kiln_sgemm(l->config, true, false, G, D, rows, 1.0f, d_in, G, l->bottom[0]->data, D, 1.0f,
             r->param[s->p_wx]->diff, D);
  add_column_sums(r->param[s->p_b]->diff, d_in, rows, G);
  kiln_sgemm(l->config, true, false, G, H, rows, 1.0f, d_rec, G, r->buf[BUF_HPREV], H, 1.0f,
             r->param[s->p_wh]->diff, H);
  if (s->p_bh >= 0) add_column_sums(r->param[s->p_bh]->diff, d_rec, rows, G);
  if (l->propagate_down[0])
    kiln_sgemm(l->config, false, false, rows, D, G, 1.0f, d_in, G, r->param[s->p_wx]->data, D,
               r->beta, l->bottom[0]->diff, D);
  if (s->static_input) {
    /* The static term is added at every step: its gradient is the sum over the steps. */
    const int64_t ng = s->N * G, S = s->S;
    memcpy(ws, d_in, sizeof(float) * (size_t)ng);
    for (int64_t t = 1; t < s->T; t++)
      for (int64_t i = 0; i < ng; i++) ws[i] += d_in[t * ng + i];
    kiln_sgemm(l->config, true, false, G, S, s->N, 1.0f, ws, G, l->bottom[2]->data, S, 1.0f,
               r->param[s->p_ws]->diff, S);
    if (l->propagate_down[2])
      kiln_sgemm(l->config, false, false, s->N, S, G, 1.0f, ws, G, r->param[s->p_ws]->data, S,
                 r->beta, l->bottom[2]->diff, S);
  }
}

/* dh = carry_t (d_t W_h + beta dh): the gradient step t sends to the state it took (d_t: N x G
 * of the recurrent term's pre-activations; beta 1 adds a gradient already in dh). */
static void recurrent_backward(kiln_layer *l, rec_state *s, const rec_dir *r, int64_t t,
                               const float *d_t, float *dh, float beta) {
  const int64_t N = s->N, H = s->H;
  kiln_gemm_plan *plan =
      t == step_time(r, s->T, s->T - 1) ? step_plan(l, s, r, 1, beta) : s->plan[1];
  if (plan)
    kiln_gemm_plan_run(plan, d_t, dh);
  else
    kiln_sgemm(l->config, false, false, N, H, s->G, 1.0f, d_t, s->G, r->param[s->p_wh]->data, H,
               beta, dh, H);
  const float *m = carry(l, s, r, t);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < H; k++) dh[n * H + k] = m ? m[n] * dh[n * H + k] : 0.0f;
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
 * carry gradients across batches, and the reverse direction's final state is no one's). */
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
  const bool lstm = s->kind == REC_LSTM;
  float *dh = l->workspace, *dc = dh + s->N * s->H;
  final_state_grad(l, s, 0, dh);
  if (lstm) final_state_grad(l, s, 1, dc);
  state_backward(l, s, dh, lstm ? dc : NULL);
  return KILN_OK;
}

static int rec_backward(kiln_layer *l, dir_pass pass) {
  if (l->propagate_down[1]) return rec_refuse_cont(l);
  rec_state *s = l->priv;
  if (s->T * s->N == 0) return empty_backward(l, s);
  return each_direction(l, s, pass);
}

static void lstm_backward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  const float *gates = r->buf[BUF_GATES], *cells = r->buf[BUF_CELLS], *st = r->buf[BUF_STATE];
  float *dgates = l->workspace; /* rows x G */
  float *dh = dgates + T * N * G, *dc = dh + nh, *ws = dc + nh;
  final_state_grad(l, s, 0, dh);
  final_state_grad(l, s, 1, dc);
  for (int64_t k = T - 1; k >= 0; k--) {
    const int64_t t = step_time(r, T, k);
    const float *a = gates + t * N * G, *c = cells + t * nh;
    const float *c_prev = k ? cells + prev_time(r, t) * nh : st + nh;
    float *da = dgates + t * N * G;
    const float *dy = r->dy + t * N * ld;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (nh > 32768)
    for (int64_t n = 0; n < N; n++)
#pragma omp simd
      for (int64_t j = 0; j < H; j++) {
        const int64_t e = n * H + j;
        dc[e] = kiln_lstm_cell_backward(a + n * G + j, H, c[e], c_prev[e], dc[e],
                                        dy[n * ld + j] + dh[e], da + n * G + j);
      }
    recurrent_backward(l, s, r, t, da, dh, 0.0f);
  }
  if (!r->rev) state_backward(l, s, dh, dc);
  input_backward(l, s, r, dgates, dgates, ws);
}

static void rnn_backward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, nh = N * H, rows = T * N;
  const float *hid = r->buf[BUF_HIDDEN], *out = r->buf[BUF_OUT];
  float *dz = l->workspace;   /* rows x H: the gradient of h's pre-activation */
  float *dzo = dz + rows * H; /* rows x H: of o's pre-activation */
  float *dh = dzo + rows * H, *ws = dh + nh;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t d = 0; d < H; d++)
      dzo[i * H + d] = r->dy[i * r->ldy + d] * (1 - out[i * H + d] * out[i * H + d]);
  kiln_sgemm(l->config, true, false, H, H, rows, 1.0f, dzo, H, hid, H, 1.0f,
             r->param[s->p_wo]->diff, H);
  add_column_sums(r->param[s->p_bo]->diff, dzo, rows, H);
  /* What the outputs send to every h_t, for all steps at once; the recurrence adds the rest. */
  kiln_sgemm(l->config, false, false, rows, H, H, 1.0f, dzo, H, r->param[s->p_wo]->data, H, 0.0f,
             dz, H);
  final_state_grad(l, s, 0, dh);
  for (int64_t k = T - 1; k >= 0; k--) {
    const int64_t t = step_time(r, T, k);
    float *d = dz + t * nh;
    const float *h = hid + t * nh;
    for (int64_t i = 0; i < nh; i++) d[i] = (d[i] + dh[i]) * (1 - h[i] * h[i]);
    recurrent_backward(l, s, r, t, d, dh, 0.0f);
  }
  if (!r->rev) state_backward(l, s, dh, NULL);
  input_backward(l, s, r, dz, dz, ws);
}

/* With h = (1 - z) n + z h' and n = tanh(a_n + r g) (g = W_hn h' + b_hn): dn = dh (1 - z),
 * dz = dh (h' - n), dr = dn (1 - n^2) g, and h' gets dh z directly besides what the three gates'
 * recurrent terms send back. The input and the recurrent terms share the gradients of r and z;
 * of n's, the recurrent term's is r times the input's. */
static void gru_backward_dir(kiln_layer *l, rec_state *s, const rec_dir *r) {
  const int64_t T = s->T, N = s->N, H = s->H, G = s->G, nh = N * H, ld = r->ldy;
  const float *gates = r->buf[BUF_GATES], *ghn = r->buf[BUF_GH_N], *hprev = r->buf[BUF_HPREV];
  float *d_in = l->workspace, *d_rec = d_in + T * N * G; /* rows x G each */
  float *dh = d_rec + T * N * G, *ws = dh + nh;
  final_state_grad(l, s, 0, dh);
  for (int64_t k = T - 1; k >= 0; k--) {
    const int64_t t = step_time(r, T, k);
    const float *a = gates + t * N * G, *gn = ghn + t * nh, *hp = hprev + t * nh;
    const float *dy = r->dy + t * N * ld;
    float *di = d_in + t * N * G, *dr = d_rec + t * N * G;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (nh > 32768)
    for (int64_t n = 0; n < N; n++)
#pragma omp simd
      for (int64_t j = 0; j < H; j++) {
        const int64_t e = n * H + j;
        const float *an = a + n * G;
        const float rr = an[j], z = an[H + j], c = an[2 * H + j];
        const float dh_t = dy[n * ld + j] + dh[e];
        const float da_n = dh_t * (1 - z) * (1 - c * c);
        const float da_z = dh_t * (hp[e] - c) * z * (1 - z);
        const float da_r = da_n * gn[e] * rr * (1 - rr);
        float *din = di + n * G, *drn = dr + n * G;
        din[j] = drn[j] = da_r;
        din[H + j] = drn[H + j] = da_z;
        din[2 * H + j] = da_n;
        drn[2 * H + j] = da_n * rr;
        dh[e] = dh_t * z;
      }
    recurrent_backward(l, s, r, t, dr, dh, 1.0f);
  }
  if (!r->rev) state_backward(l, s, dh, NULL);
  input_backward(l, s, r, d_in, d_rec, ws);
}

static int lstm_backward(kiln_layer *l) { return rec_backward(l, lstm_backward_dir); }
static int rnn_backward(kiln_layer *l) { return rec_backward(l, rnn_backward_dir); }
static int gru_backward(kiln_layer *l) { return rec_backward(l, gru_backward_dir); }

static void rec_destroy(kiln_layer *l) {
  rec_state *s = l->priv;
  if (s) {
    kiln_gemm_plan_destroy(s->plan[0]);
    kiln_gemm_plan_destroy(s->plan[1]);
  }
  free(s);
}

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

const kiln_layer_ops kiln_layer_gru = {
    .type = "GRU", .min_bottoms = 2, .max_bottoms = 4, .min_tops = 1, .max_tops = 2,
    .no_gradient_bottoms = 1u << 1,
    .setup = gru_setup, .reshape = rec_reshape, .forward = gru_forward,
    .backward = gru_backward, .destroy = rec_destroy,
};
