/* GRU, and the bidirectional form of RNN, LSTM and GRU (recurrent_param.bidirectional). GRU's
 * forward pass against values worked out by hand, against a plain per-element recomputation
 * (with a static input, a sequence restarting mid-batch, an initial state, both directions) and
 * against PyTorch's nn.GRU; gradients against finite differences; the reverse half of a
 * bidirectional layer against a unidirectional layer run on each sequence reversed; the refused
 * combinations and shapes. The blobs' order and shapes are checked with RNN's and LSTM's in
 * test_layers_recurrent.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_test.h"

#define FILLERS                                           \
  "weight_filler { type: 'uniform' min: -0.6 max: 0.6 } " \
  "bias_filler { type: 'uniform' min: -0.5 max: 0.5 }"

/* ---- forward ----------------------------------------------------------------------------- */

/* T = 2 steps, N = 1 stream, one input feature, H = 1; rows of the 3H blobs in the order r, z, n:
 * W_ih = (0.5, -0.4, 0.9), b_ih = (0.1, 0.2, -0.1), W_hh = (0.3, -0.6, 0.7),
 * b_hh = (0.05, -0.1, 0.2); x = (1, -2), cont = (0, 1).
 *   t1: h' = 0; gi = W_ih x + b_ih = (0.6, -0.2, 0.8), gh = W_hh h' + b_hh = (0.05, -0.1, 0.2)
 *       r = sigmoid(0.65) = 0.657010, z = sigmoid(-0.3) = 0.425557,
 *       n = tanh(0.8 + r 0.2) = 0.731247; h1 = (1 - z) n + z h' = 0.420059
 *   t2: h' = h1; gi = (-0.9, 1.0, -1.9), gh = (0.3 h1 + 0.05, -0.6 h1 - 0.1, 0.7 h1 + 0.2)
 *       = (0.176018, -0.352036, 0.494042); r = sigmoid(-0.723982) = 0.326517,
 *       z = sigmoid(0.647964) = 0.656552, n = tanh(-1.9 + r 0.494042) = -0.940074
 *       h2 = (1 - z) n + z h1 = -0.047076
 * A second pass with cont = (1, 1) starts from h0 = h2: h1' = 0.388687, h2' = -0.062369.
 * Bidirectional with the same blobs for both directions, cont = (0, 1): the reverse direction
 * starts at t2 from zeros, h2r = step(x = -2, h' = 0) = -0.274831 (r = 0.299433, z = 0.710950,
 * n = -0.950806), and t1 continues it (cont_2 = 1): h1r = step(x = 1, h' = h2r) = 0.227711. */
static const float hand_wi[3] = {0.5f, -0.4f, 0.9f}, hand_bi[3] = {0.1f, 0.2f, -0.1f},
                   hand_wh[3] = {0.3f, -0.6f, 0.7f}, hand_bh[3] = {0.05f, -0.1f, 0.2f};

static void set_hand_params(built *g, int first) {
  set_params(g, first + 0, hand_wi);
  set_params(g, first + 1, hand_bi);
  set_params(g, first + 2, hand_wh);
  set_params(g, first + 3, hand_bh);
}

static void test_gru_forward_hand(void **state) {
  (void)state;
  kiln_blob *b[2] = {blob_of("x", 3, SHAPE(2, 1, 1), (const float[]){1, -2}),
                     blob_of("cont", 2, SHAPE(2, 1), (const float[]){0, 1})};
  float *cont = b[1]->data;
  built g = build("name: 'g' type: 'GRU' recurrent_param { num_output: 1 }", TRAIN, b, 2, 1);
  assert_int_equal(g.l->nparam, 4);
  set_hand_params(&g, 0);
  /* Passes with cont_1 0 (from zeros), 1 (from the last pass's h2), 0 again (forgotten). */
  static const struct {
    float cont_1, h[2];
  } passes[3] = {{0, {0.4200593257f, -0.0470763590f}},
                 {1, {0.3886870953f, -0.0623694570f}},
                 {0, {0.4200593257f, -0.0470763590f}}};
  for (int i = 0; i < 3; i++) {
    cont[0] = passes[i].cont_1;
    forward(&g);
    expect_shape(g.top[0], 3, SHAPE(2, 1, 1));
    expect_close("gru h", g.top[0]->data, passes[i].h, 2, 1e-6);
  }
  unbuild(&g);

  built bi = build("name: 'g' type: 'GRU' recurrent_param { num_output: 1 bidirectional: true }",
                   TRAIN, b, 2, 1);
  assert_int_equal(bi.l->nparam, 8);
  set_hand_params(&bi, 0);
  set_hand_params(&bi, 4);
  forward(&bi);
  expect_shape(bi.top[0], 3, SHAPE(2, 1, 2));
  /* Rows t1, t2: (forward, reverse). */
  expect_close("bidirectional gru", bi.top[0]->data,
               (const float[]){0.4200593257f, 0.2277114045f, -0.0470763590f, -0.2748309558f}, 4,
               1e-6);
  /* cont_2 = 0: t2 starts a new sequence, so neither direction crosses between the steps; the
   * reverse direction at t1 is then a fresh step on x = 1, as the forward one is. */
  cont[1] = 0;
  forward(&bi);
  expect_close("bidirectional gru, two sequences", bi.top[0]->data,
               (const float[]){0.4200593257f, 0.4200593257f, -0.2748309558f, -0.2748309558f}, 4,
               1e-6);
  unbuild(&bi);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

/* One direction of a GRU, written out per element in double, independently of the layer: for
 * each stream, step by step in the direction's order, h' = keep h with keep = cont_t (forward)
 * or cont_{t+1} (reverse; 0 at the last step), then PyTorch's gates. w: W_ih, b_ih, [W_s],
 * W_hh, b_hh. h0 (N x H) or NULL for zeros. Writes H features of each row of y, ldy apart. */
static void gru_reference(const float *x, const float *cont, const float *xs, const float *h0,
                          const float *const *w, int T, int N, int D, int S, int H, bool reverse,
                          double *y, int ldy) {
  const float *wi = w[0], *bi = w[1], *ws = xs ? w[2] : NULL, *wh = w[xs ? 3 : 2],
              *bh = w[xs ? 4 : 3];
  for (int n = 0; n < N; n++) {
    double h[8] = {0}, hp[8], gi[3][8], gh[3][8];
    assert_true(H <= 8);
    for (int j = 0; j < H; j++) h[j] = h0 ? h0[n * H + j] : 0;
    for (int k = 0; k < T; k++) {
      const int t = reverse ? T - 1 - k : k;
      const double keep = reverse ? (t + 1 < T ? cont[(t + 1) * N + n] : 0) : cont[t * N + n];
      for (int j = 0; j < H; j++) hp[j] = keep * h[j];
      for (int q = 0; q < 3; q++)
        for (int j = 0; j < H; j++) {
          const int row = q * H + j;
          double a = bi[row], b = bh[row];
          for (int d = 0; d < D; d++) a += (double)wi[row * D + d] * x[(t * N + n) * D + d];
          for (int s = 0; ws && s < S; s++) a += (double)ws[row * S + s] * xs[n * S + s];
          for (int i = 0; i < H; i++) b += (double)wh[row * H + i] * hp[i];
          gi[q][j] = a;
          gh[q][j] = b;
        }
      for (int j = 0; j < H; j++) {
        const double r = 1 / (1 + exp(-(gi[0][j] + gh[0][j])));
        const double z = 1 / (1 + exp(-(gi[1][j] + gh[1][j])));
        const double c = tanh(gi[2][j] + r * gh[2][j]);
        h[j] = (1 - z) * c + z * hp[j];
        y[(t * N + n) * ldy + j] = h[j];
      }
    }
  }
}

/* T = 4 steps of N = 3 streams: stream 0 one sequence, stream 1 restarting at t = 2, stream 2 a
 * sequence of two steps and then padding, as TextData's SEQUENCES batches have it (cont 0 at a
 * sequence's first step and on every padding step). */
static const float cont_padded[12] = {0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0};

/* The layer against gru_reference, forward and bidirectional, with and without a static input;
 * with expose_hidden from h0 (cont 1 at t = 0 for two streams, so h0 enters). */
static void test_gru_matches_plain_recomputation(void **state) {
  (void)state;
  enum { T = 4, N = 3, D = 3, S = 2, H = 3 };
  kiln_rng rng;
  kiln_rng_seed(&rng, 23, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(T, N, D), -1, 1, &rng);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(T, N), cont_padded);
  kiln_blob *xs = gc_blob("xs", 2, SHAPE(N, S), -1, 1, &rng);
  kiln_blob *h0 = gc_blob("h0", 3, SHAPE(1, N, H), -1, 1, &rng);
  char text[512];
  for (int k = 0; k < 6; k++) {
    const bool static_input = k & 1, bidir = (k >> 1) == 1, expose = (k >> 1) == 2;
    snprintf(text, sizeof text,
             "name: 'g' type: 'GRU' recurrent_param { num_output: %d bidirectional: %s "
             "expose_hidden: %s " FILLERS " }",
             H, bidir ? "true" : "false", expose ? "true" : "false");
    kiln_blob *b[4] = {x, cont};
    int nb = 2;
    if (static_input) b[nb++] = xs;
    if (expose) {
      b[nb++] = h0;
      cont->data[0] = cont->data[2] = 1;
    }
    built g = build(text, TRAIN, b, nb, expose ? 2 : 1);
    forward(&g);
    const int ndir = bidir ? 2 : 1, per = g.l->nparam / ndir;
    double want[T * N * 2 * H];
    for (int d = 0; d < ndir; d++) {
      const float *w[5];
      for (int p = 0; p < per; p++) w[p] = g.l->param[d * per + p]->data;
      gru_reference(x->data, cont->data, static_input ? xs->data : NULL, expose ? h0->data : NULL,
                    w, T, N, D, S, H, d == 1, want + d * H, ndir * H);
    }
    expect_rel("gru against the recomputation", g.top[0]->data, want, T * N * ndir * H, 1e-5);
    if (expose) /* hT: the last step's h */
      expect_rel("gru hT", g.top[1]->data, want + (T - 1) * N * H, N * H, 1e-5);
    unbuild(&g);
    memcpy(cont->data, cont_padded, sizeof cont_padded);
  }
  kiln_blob_free(x);
  kiln_blob_free(cont);
  kiln_blob_free(xs);
  kiln_blob_free(h0);
}

/* The values scripts/gru-reference.py prints: torch.nn.GRU (PyTorch 1.13, float32) on the inputs
 * that param_value, x_value and h0_value make (the script's docstring has the same formulas).
 * "uni" starts from h0 (expose_hidden, cont 1 throughout); "bidir" runs three sequences of
 * lengths 4, 2 and 3 packed with pack_padded_sequence, and lists the output of their valid
 * steps only (PyTorch pads the rest with zeros). */
static const float torch_uni_y[18] = {
    -0.0831630901f, -0.0423007011f, 0.128988266f,   0.00614975393f, 0.0586506352f, -0.152613744f,
    0.00637917221f, 0.105692521f,   -0.150413036f,  -0.120482862f,  0.192499042f,  -0.292675316f,
    -0.1334638f,    0.147264689f,   -0.0910053924f, -0.0803301409f, 0.241851807f,  -0.396928608f};
static const float torch_uni_hT[6] = {-0.1334638f,    0.147264689f, -0.0910053924f,
                                      -0.0803301409f, 0.241851807f, -0.396928608f};
static const float torch_bidir_y[36] = {
    0.0177488662f, 0.213142708f,  0.162359238f,  -0.384721071f, -0.0777476877f,  0.0498065166f,
    0.179386735f,  -0.398449272f, 0.0116181411f, 0.0390805379f, 0.35052368f,     -0.33262831f,
    0.0648969486f, 0.3422032f,    0.0912963897f, -0.351164371f, -0.0967612118f,  0.137307987f,
    0.0902032703f, -0.26461935f,  0.0270710513f, 0.109588474f,  0.253407121f,    -0.287240326f,
    0.107503615f,  0.432599604f,  0.0319067724f, -0.288032889f, 0.0495098904f,   0.192021549f,
    0.13850075f,   -0.192392394f, 0.13946633f,   0.505858183f,  -0.00426009577f, -0.179244354f};

static float param_value(int p, int k) { return (float)((37 * k + 11 * p) % 17 - 8) / 16; }
static float x_value(int k) { return (float)((13 * k + 5) % 11 - 5) / 8; }
static float h0_value(int k) { return (float)((7 * k + 3) % 9 - 4) / 8; }

static void set_reference_params(built *g) {
  for (int p = 0; p < g->l->nparam; p++)
    for (int64_t k = 0; k < g->l->param[p]->count; k++)
      g->l->param[p]->data[k] = param_value(p, (int)k);
}

static void test_gru_matches_pytorch(void **state) {
  (void)state;
  float v[64];
  for (int k = 0; k < 64; k++) v[k] = x_value(k);
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 2, 2), v);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(3, 2), (const float[]){1, 1, 1, 1, 1, 1});
  for (int k = 0; k < 6; k++) v[k] = h0_value(k);
  kiln_blob *h0 = blob_of("h0", 3, SHAPE(1, 2, 3), v);
  kiln_blob *b[3] = {x, cont, h0};
  built u = build("name: 'g' type: 'GRU' recurrent_param { num_output: 3 expose_hidden: true }",
                  TRAIN, b, 3, 2);
  set_reference_params(&u);
  forward(&u);
  expect_close("gru against PyTorch", u.top[0]->data, torch_uni_y, 18, 2e-6);
  expect_close("gru hT against PyTorch", u.top[1]->data, torch_uni_hT, 6, 2e-6);
  unbuild(&u);

  const int lengths[3] = {4, 2, 3};
  float c[12];
  for (int t = 0; t < 4; t++)
    for (int n = 0; n < 3; n++) c[t * 3 + n] = t > 0 && t < lengths[n];
  for (int k = 0; k < 64; k++) v[k] = x_value(k);
  kiln_blob *xb = blob_of("x", 3, SHAPE(4, 3, 2), v), *cb = blob_of("cont", 2, SHAPE(4, 3), c);
  kiln_blob *bb[2] = {xb, cb};
  built bi = build("name: 'g' type: 'GRU' recurrent_param { num_output: 2 bidirectional: true }",
                   TRAIN, bb, 2, 1);
  set_reference_params(&bi);
  forward(&bi);
  float got[36];
  int m = 0;
  for (int t = 0; t < 4; t++)
    for (int n = 0; n < 3; n++)
      if (t < lengths[n])
        for (int j = 0; j < 4; j++) got[m++] = bi.top[0]->data[(t * 3 + n) * 4 + j];
  assert_int_equal(m, 36);
  expect_close("bidirectional gru against PyTorch", got, torch_bidir_y, 36, 2e-6);
  unbuild(&bi);
  kiln_blob *all[] = {x, cont, h0, xb, cb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_blob_free(all[i]);
}

/* ---- gradients --------------------------------------------------------------------------- */

/* T = 3 steps of N = 2 streams, x 3 x 2 x 2 x 2 (4 features a step), x_static 2 x 3, H = 3.
 * Stream 1 starts a new sequence at t = 1. Without expose_hidden both start at t = 0 (the
 * carried state does not enter, so the check's repeated passes agree); with it both continue
 * from h0 at t = 0. cont takes no gradient (bit 1 of the mask). */
static void test_gru_gradients(void **state) {
  (void)state;
  static const float cont_fresh[6] = {0, 0, 1, 0, 1, 1}, cont_exposed[6] = {1, 1, 1, 0, 1, 1};
  for (int k = 0; k < 4; k++) {
    const bool static_input = k & 1, expose = k & 2;
    kiln_rng rng;
    kiln_rng_seed(&rng, 31, (uint64_t)k);
    kiln_blob *b[4];
    int nb = 0;
    b[nb++] = gc_blob("x", 4, SHAPE(3, 2, 2, 2), -1, 1, &rng);
    b[nb++] = blob_of("cont", 2, SHAPE(3, 2), expose ? cont_exposed : cont_fresh);
    if (static_input) b[nb++] = gc_blob("xs", 2, SHAPE(2, 3), -1, 1, &rng);
    if (expose) b[nb++] = gc_blob("h0", 3, SHAPE(1, 2, 3), -1, 1, &rng);
    gradcheck_opts o = {.bottom_mask = ((1u << nb) - 1) & ~(1u << 1)};
    check_grad(expose ? "name: 'g' type: 'GRU' recurrent_param { num_output: 3 "
                        "expose_hidden: true " FILLERS " }"
                      : "name: 'g' type: 'GRU' recurrent_param { num_output: 3 " FILLERS " }",
               b, nb, expose ? 2 : 1, &o);
    for (int i = 0; i < nb; i++) kiln_blob_free(b[i]);
  }
}

/* Bidirectional RNN, LSTM and GRU, with and without x_static, over cont_padded: a restart
 * mid-batch and a sequence followed by padding, so the reverse direction restarts inside the
 * batch too. Every stream starts at t = 0, so the forward direction's carried state does not
 * enter. */
static void test_bidirectional_gradients(void **state) {
  (void)state;
  static const char *const types[3] = {"RNN", "LSTM", "GRU"};
  char text[400];
  for (int k = 0; k < 6; k++) {
    const bool static_input = k & 1;
    kiln_rng rng;
    kiln_rng_seed(&rng, 37, (uint64_t)k);
    kiln_blob *b[3];
    int nb = 0;
    b[nb++] = gc_blob("x", 3, SHAPE(4, 3, 2), -1, 1, &rng);
    b[nb++] = blob_of("cont", 2, SHAPE(4, 3), cont_padded);
    if (static_input) b[nb++] = gc_blob("xs", 2, SHAPE(3, 2), -1, 1, &rng);
    gradcheck_opts o = {.bottom_mask = ((1u << nb) - 1) & ~(1u << 1)};
    snprintf(text, sizeof text,
             "name: 'b' type: '%s' recurrent_param { num_output: 2 bidirectional: true " FILLERS
             " }",
             types[k / 2]);
    check_grad(text, b, nb, 1, &o);
    for (int i = 0; i < nb; i++) kiln_blob_free(b[i]);
  }
}

/* ---- the reverse direction ---------------------------------------------------------------- */

/* The forward half of a bidirectional layer's output is a unidirectional layer with the first
 * half of its blobs on the same batch; the reverse half is, for every sequence of every stream
 * (the steps from one where the next step's cont is not 1 back to the step after the previous
 * such one), a unidirectional layer with the second half of the blobs run on that sequence
 * reversed, from zeros. Stream 0 has cont 1 at t = 0 (it continues a sequence of an earlier
 * batch, which the reverse direction cannot see), stream 1 restarts at t = 2, stream 2 is a
 * sequence of two steps and then padding, each padding step a sequence of its own. */
static void test_bidirectional_reverse_is_reversed_sequence(void **state) {
  (void)state;
  enum { T = 5, N = 3, D = 2, S = 2, H = 3 };
  static const float cont[T * N] = {1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0};
  static const char *const types[3] = {"RNN", "LSTM", "GRU"};
  char bi_text[400], uni_text[400];
  kiln_rng rng;
  kiln_rng_seed(&rng, 41, 0);
  kiln_blob *x = gc_blob("x", 3, SHAPE(T, N, D), -1, 1, &rng);
  kiln_blob *c = blob_of("cont", 2, SHAPE(T, N), cont);
  kiln_blob *xs = gc_blob("xs", 2, SHAPE(N, S), -1, 1, &rng);
  for (int k = 0; k < 6; k++) {
    const bool static_input = k & 1;
    const char *type = types[k / 2];
    snprintf(bi_text, sizeof bi_text,
             "name: 'b' type: '%s' recurrent_param { num_output: %d bidirectional: true " FILLERS
             " }",
             type, H);
    snprintf(uni_text, sizeof uni_text,
             "name: 'u' type: '%s' recurrent_param { num_output: %d " FILLERS " }", type, H);
    kiln_blob *b[3] = {x, c, xs};
    const int nb = static_input ? 3 : 2;
    built bi = build(bi_text, TRAIN, b, nb, 1);
    forward(&bi);
    const int per = bi.l->nparam / 2;
    const float *y = bi.top[0]->data;

    built fw = build(uni_text, TRAIN, b, nb, 1);
    for (int p = 0; p < per; p++) set_params(&fw, p, bi.l->param[p]->data);
    forward(&fw);
    for (int64_t row = 0; row < T * N; row++)
      expect_close("forward half", y + row * 2 * H, fw.top[0]->data + row * H, H, 1e-5);
    unbuild(&fw);

    int sequences = 0;
    for (int n = 0; n < N; n++)
      for (int last = T - 1, first; last >= 0; last = first - 1, sequences++) {
        for (first = last; first > 0 && cont[first * N + n] == 1;) first--;
        const int L = last - first + 1;
        float xr[T * D], cr[T];
        for (int j = 0; j < L; j++) {
          memcpy(xr + j * D, x->data + ((last - j) * N + n) * D, sizeof(float) * D);
          cr[j] = j > 0;
        }
        kiln_blob *sx = blob_of("sx", 3, SHAPE(L, 1, D), xr),
                  *sc = blob_of("sc", 2, SHAPE(L, 1), cr);
        kiln_blob *sxs = blob_of("sxs", 2, SHAPE(1, S), xs->data + n * S);
        kiln_blob *sb[3] = {sx, sc, sxs};
        built rv = build(uni_text, TRAIN, sb, nb, 1);
        for (int p = 0; p < per; p++) set_params(&rv, p, bi.l->param[per + p]->data);
        forward(&rv);
        for (int j = 0; j < L; j++)
          expect_close("reverse half", y + ((last - j) * N + n) * 2 * H + H,
                       rv.top[0]->data + j * H, H, 1e-5);
        unbuild(&rv);
        kiln_blob_free(sx);
        kiln_blob_free(sc);
        kiln_blob_free(sxs);
      }
    /* Stream 0 is one sequence, stream 1 two, stream 2 one and three padding steps. */
    assert_int_equal(sequences, 1 + 2 + 4);
    unbuild(&bi);
  }
  kiln_blob_free(x);
  kiln_blob_free(c);
  kiln_blob_free(xs);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_gru_bidirectional_errors(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 2, 4), NULL);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(3, 2), NULL);
  kiln_blob *cont_t = blob_of("ct", 2, SHAPE(2, 2), NULL),
            *cont_n = blob_of("cn", 2, SHAPE(3, 3), NULL);
  kiln_blob *cont3 = blob_of("c3", 3, SHAPE(3, 2, 1), NULL);
  kiln_blob *h0 = blob_of("h0", 3, SHAPE(1, 2, 5), NULL);
  const char *gru = "name: 'g' type: 'GRU' recurrent_param { num_output: 5 }";
  const char *gru_bi =
      "name: 'g' type: 'GRU' recurrent_param { num_output: 5 bidirectional: true }";
  const char *wg = "layer 'g' (GRU)";
  kiln_blob *b[3] = {x, cont, h0};
  /* No state to take in or give out in reverse: refused, for every type. */
  expect_create_fails(
      "name: 'g' type: 'GRU' recurrent_param { num_output: 5 expose_hidden: true "
      "bidirectional: true }",
      TRAIN, b, 3, 2, KILN_ERR_INVALID, wg, "expose_hidden cannot be used with bidirectional");
  expect_create_fails(
      "name: 'l' type: 'LSTM' recurrent_param { num_output: 5 expose_hidden: true "
      "bidirectional: true }",
      TRAIN, b, 3, 2, KILN_ERR_INVALID, "layer 'l' (LSTM)", "bidirectional");
  expect_create_fails(
      "name: 'r' type: 'RNN' recurrent_param { num_output: 5 expose_hidden: true "
      "bidirectional: true }",
      TRAIN, b, 3, 2, KILN_ERR_INVALID, "layer 'r' (RNN)", "bidirectional");
  /* cont of the wrong steps, streams or axes. */
  b[1] = cont_t;
  expect_create_fails(gru, TRAIN, b, 2, 1, KILN_ERR_SHAPE, wg,
                      "cont is 2x2, x is 3x2x4: cont must be T x N");
  b[1] = cont_n;
  expect_create_fails(gru_bi, TRAIN, b, 2, 1, KILN_ERR_SHAPE, wg, "cont must be T x N");
  b[1] = cont3;
  expect_create_fails(gru_bi, TRAIN, b, 2, 1, KILN_ERR_SHAPE, wg, "cont must have 2 axes");
  b[1] = cont;
  expect_create_fails("name: 'g' type: 'GRU'", TRAIN, b, 2, 1, KILN_ERR_INVALID, wg, "num_output");
  /* GRU's tops and bottoms with the state exposed: h0 in, hT out. */
  expect_create_fails("name: 'g' type: 'GRU' recurrent_param { num_output: 5 expose_hidden: true }",
                      TRAIN, b, 3, 1, KILN_ERR_INVALID, wg, "(h, hT)");
  expect_create_fails(gru_bi, TRAIN, b, 2, 2, KILN_ERR_INVALID, wg, "takes 1 top");
  /* A gradient asked of cont is refused by test_recurrent_backward_contract
   * (test_layers_recurrent.c), GRU and bidirectional layers among them. */
  kiln_blob *all[] = {x, cont, cont_t, cont_n, cont3, h0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_blob_free(all[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gru_forward_hand),
      cmocka_unit_test(test_gru_matches_plain_recomputation),
      cmocka_unit_test(test_gru_matches_pytorch),
      cmocka_unit_test(test_gru_gradients),
      cmocka_unit_test(test_bidirectional_gradients),
      cmocka_unit_test(test_bidirectional_reverse_is_reversed_sequence),
      cmocka_unit_test(test_gru_bidirectional_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
