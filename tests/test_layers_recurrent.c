/* Sequence layers: Embed, RNN and LSTM. Forward passes against values worked out by hand, the
 * state carried from one pass to the next, gradients against finite differences (with a
 * sequence restarting in the middle of a batch, with and without a static input, with the
 * hidden state exposed), the gradient convention, Caffe's parameter blobs (order, shapes,
 * fillers, a .caffemodel written as Caffe writes it), the errors of bad indices, parameters and
 * shapes, shapes that change between passes, LRCN-style nets and a TextData sentence
 * classifier built and run through kiln_net, and an LSTM that learns a task. GRU and the
 * bidirectional layers have their own tests in test_layers_gru.c; the tests here that every
 * recurrent type shares (blobs, gradient convention, empty batches, shape changes, the
 * classifier, learning) take them too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "files.h"
#include "kiln/data.h"
#include "layer_test.h"

/* ---- Embed ------------------------------------------------------------------------------- */

static const char *embed_text =
    "name: 'emb' type: 'Embed' embed_param { num_output: 2 input_dim: 4 "
    "weight_filler { type: 'uniform' min: -1 max: 1 } bias_filler { type: 'uniform' min: -1 "
    "max: 1 } }";

/* Each index picks a row of W (4 x 2) and adds the bias; index 3 twice, 0 twice. The weight
 * gradient adds the top gradients of every position into the row it read (rows 0 and 3 get two
 * each, row 2 none); the bias gradient sums them all. */
static void test_embed_forward_backward_hand(void **state) {
  (void)state;
  const float idx[6] = {3, 0, 1, 3, 0, 2};
  kiln_blob *x = blob_of("idx", 2, SHAPE(2, 3), idx);
  built e = build(embed_text, TRAIN, &x, 1, 1);
  assert_int_equal(e.l->nparam, 2);
  expect_shape(e.l->param[0], 2, SHAPE(4, 2));
  expect_shape(e.l->param[1], 1, SHAPE(2));
  const float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[2] = {0.5f, -1};
  set_params(&e, 0, w);
  set_params(&e, 1, b);
  forward(&e);
  expect_shape(e.top[0], 3, SHAPE(2, 3, 2));
  const float want[12] = {7.5f, 7, 1.5f, 1, 3.5f, 3, 7.5f, 7, 1.5f, 1, 5.5f, 5};
  expect_close("embed y", e.top[0]->data, want, 12, 0);
  for (int i = 0; i < 12; i++) e.top[0]->diff[i] = (float)(i + 1);
  for (int p = 0; p < 2; p++) fill(e.l->param[p]->diff, e.l->param[p]->count, 0);
  e.l->propagate_down[0] = false;
  backward(&e);
  /* dy rows: pos0 (1,2) -> row 3, pos1 (3,4) -> row 0, pos2 (5,6) -> row 1, pos3 (7,8) -> row 3,
   * pos4 (9,10) -> row 0, pos5 (11,12) -> row 2. */
  const float dw[8] = {3 + 9, 4 + 10, 5, 6, 11, 12, 1 + 7, 2 + 8};
  const float db[2] = {1 + 3 + 5 + 7 + 9 + 11, 2 + 4 + 6 + 8 + 10 + 12};
  expect_close("embed dW", e.l->param[0]->diff, dw, 8, 0);
  expect_close("embed db", e.l->param[1]->diff, db, 2, 0);
  /* Accumulated, not overwritten. */
  backward(&e);
  for (int i = 0; i < 8; i++) assert_true(e.l->param[0]->diff[i] == 2 * dw[i]);
  unbuild(&e);

  /* Without a bias: rows copied as they are; indices of any shape (here 3-D). */
  kiln_blob *x3 = blob_of("idx", 3, SHAPE(1, 2, 1), (const float[]){2, 1});
  built nb = build(
      "name: 'emb' type: 'Embed' embed_param { num_output: 2 input_dim: 4 "
      "bias_term: false }",
      TRAIN, &x3, 1, 1);
  assert_int_equal(nb.l->nparam, 1);
  set_params(&nb, 0, w);
  forward(&nb);
  expect_shape(nb.top[0], 4, SHAPE(1, 2, 1, 2));
  expect_close("embed y without bias", nb.top[0]->data, (const float[]){5, 6, 3, 4}, 4, 0);
  unbuild(&nb);
  kiln_blob_free(x3);
  kiln_blob_free(x);
}

static void test_embed_gradients(void **state) {
  (void)state;
  const float idx[8] = {3, 0, 1, 3, 0, 0, 2, 3};
  kiln_blob *x = blob_of("idx", 2, SHAPE(4, 2), idx);
  /* Parameters only: bit 1 names no bottom, so the indices get no propagate_down. */
  gradcheck_opts o = {.bottom_mask = 1u << 1};
  check_grad(
      "name: 'emb' type: 'Embed' embed_param { num_output: 3 input_dim: 5 "
      "weight_filler { type: 'uniform' min: -1 max: 1 } "
      "bias_filler { type: 'uniform' min: -1 max: 1 } }",
      &x, 1, 1, &o);
  check_grad(
      "name: 'emb' type: 'Embed' embed_param { num_output: 2 input_dim: 4 "
      "bias_term: false weight_filler { type: 'uniform' min: -1 max: 1 } }",
      &x, 1, 1, &o);
  kiln_blob_free(x);
}

/* The weight gradient of many positions sharing rows is the same, bit for bit, whatever the
 * thread count (positions are added in order; threads split the columns). */
static void test_embed_weight_gradient_thread_independent(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 3, 3);
  kiln_blob *x = label_blob("idx", 2, SHAPE(64, 40), 7, &rng);
  const char *text = "name: 'emb' type: 'Embed' embed_param { num_output: 300 input_dim: 7 }";
  float *dw[2];
  for (int run = 0; run < 2; run++) {
    built e = build(text, TRAIN, &x, 1, 1);
    e.l->nthreads = run ? 4 : 1;
    e.l->propagate_down[0] = false;
    forward(&e);
    kiln_rng r2;
    kiln_rng_seed(&r2, 8, 8);
    for (int64_t i = 0; i < e.top[0]->count; i++) e.top[0]->diff[i] = kiln_rng_uniform(&r2, -1, 1);
    fill(e.l->param[0]->diff, e.l->param[0]->count, 0);
    fill(e.l->param[1]->diff, e.l->param[1]->count, 0);
    backward(&e);
    dw[run] = malloc(sizeof(float) * 7 * 300);
    assert_non_null(dw[run]);
    memcpy(dw[run], e.l->param[0]->diff, sizeof(float) * 7 * 300);
    unbuild(&e);
  }
  assert_memory_equal(dw[0], dw[1], sizeof(float) * 7 * 300);
  free(dw[0]);
  free(dw[1]);
  kiln_blob_free(x);
}

/* Runs forward with `v` at position 1 of the indices: an error naming the layer and the value,
 * not a read outside the table. */
static void expect_bad_index(float v, const char *shown) {
  kiln_blob *x = blob_of("idx", 1, SHAPE(3), (const float[]){0, v, 1});
  built e = build(embed_text, TRAIN, &x, 1, 1);
  kiln_clear_error();
  assert_int_equal(layer_forward(e.l), KILN_ERR_INVALID);
  expect_message("layer 'emb' (Embed)", shown, "[0, 4)");
  unbuild(&e);
  kiln_blob_free(x);
}

static void test_embed_errors(void **state) {
  (void)state;
  expect_bad_index(4, "index 4 ");
  expect_bad_index(-1, "index -1 ");
  expect_bad_index(1.5f, "index 1.5 ");
  expect_bad_index(NAN, "index nan ");
  expect_bad_index(1e30f, "index 1e+30 ");
  kiln_blob *x = blob_of("idx", 1, SHAPE(3), (const float[]){0, 3, 1});
  const char *who = "layer 'emb' (Embed)";
  expect_create_fails("name: 'emb' type: 'Embed' embed_param { input_dim: 4 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, who, "num_output");
  expect_create_fails("name: 'emb' type: 'Embed' embed_param { num_output: 3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, who, "input_dim");
  /* No gradient to the indices: a propagate_down set on them is refused, as Caffe does. */
  built e = build(embed_text, TRAIN, &x, 1, 1);
  forward(&e);
  e.l->propagate_down[0] = true;
  kiln_clear_error();
  assert_int_equal(layer_backward(e.l), KILN_ERR_INVALID);
  expect_message(who, "index input", NULL);
  assert_true(e.l->ops->no_gradient_bottoms & 1u);
  unbuild(&e);
  kiln_blob_free(x);
}

/* ---- RNN and LSTM: forward by hand ------------------------------------------------------- */

/* T = 2 steps, N = 1 stream, one input feature, H = 1. Blobs W_xh 0.5, b_h 0.1, W_hh -0.8,
 * W_ho 1.5, b_o -0.2; x = (1, -2); cont = (0, 1).
 *   h1 = tanh(0.5 * 1 + 0.1 + (-0.8) * 0 * h0) = tanh(0.6) = 0.537050
 *   o1 = tanh(1.5 h1 - 0.2) = 0.541004
 *   h2 = tanh(0.5 * -2 + 0.1 - 0.8 h1) = tanh(-1.329640) = -0.869161
 *   o2 = tanh(1.5 h2 - 0.2) = -0.905822
 * A second pass with cont = (1, 1) starts from the first's last state, h0 = h2:
 *   h1' = tanh(0.6 - 0.8 h2) = 0.860516,  o1' = tanh(1.5 h1' - 0.2) = 0.797160
 *   h2' = tanh(-0.9 - 0.8 h1') = -0.919906, o2' = tanh(1.5 h2' - 0.2) = -0.918580 */
static void test_rnn_forward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 1, 1), (const float[]){1, -2});
  kiln_blob *cont = blob_of("cont", 2, SHAPE(2, 1), (const float[]){0, 1});
  kiln_blob *b[2] = {x, cont};
  built r = build("name: 'rnn' type: 'RNN' recurrent_param { num_output: 1 }", TRAIN, b, 2, 1);
  const float p[6] = {0.5f, 0.1f, -0.8f, 1.5f, -0.2f};
  set_params(&r, 0, &p[0]); /* W_xh */
  set_params(&r, 1, &p[1]); /* b_h */
  set_params(&r, 2, &p[2]); /* W_hh */
  set_params(&r, 3, &p[3]); /* W_ho */
  set_params(&r, 4, &p[4]); /* b_o */
  forward(&r);
  expect_shape(r.top[0], 3, SHAPE(2, 1, 1));
  expect_close("rnn o", r.top[0]->data, (const float[]){0.5410042707f, -0.9058221456f}, 2, 1e-6);
  cont->data[0] = 1;
  forward(&r);
  expect_close("rnn o carried over", r.top[0]->data, (const float[]){0.7971603783f, -0.9185797758f},
               2, 1e-6);
  /* cont 0 at t = 0 forgets the carried state again. */
  cont->data[0] = 0;
  forward(&r);
  expect_close("rnn o after a reset", r.top[0]->data,
               (const float[]){0.5410042707f, -0.9058221456f}, 2, 1e-6);
  unbuild(&r);
  kiln_blob_free(x);
  kiln_blob_free(cont);
}

/* T = 2, N = 1, one input feature, H = 1; rows of the 4H blobs in the order i, f, o, g:
 * W_xc = (0.5, -0.3, 0.8, 1.2), b_c = (0.1, 0.2, -0.1, 0.05), W_hc = (0.4, -0.6, 0.3, -0.7);
 * x = (1, -0.5), cont = (0, 1).
 *   t1: a = W_xc x + b_c + W_hc (0 h0) = (0.6, -0.1, 0.7, 1.25)
 *       i = sigmoid(0.6) = 0.645656, f = 0 (cont 0), o = sigmoid(0.7) = 0.668188,
 *       g = tanh(1.25) = 0.848284; c1 = i g = 0.547700; h1 = o tanh(c1) = 0.333288
 *   t2: a = W_xc (-0.5) + b_c + W_hc h1 = (-0.016685, 0.150027, -0.400014, -0.783302)
 *       i = 0.495829, f = 0.537437, o = 0.401309, g = -0.654598
 *       c2 = f c1 + i g = -0.030215; h2 = o tanh(c2) = -0.012122
 * With expose_hidden, h0 = 0.3, c0 = -0.4 and cont = (1, 1):
 *   h1 = 0.231999, c1 = 0.351031; h2 = hT = -0.040595, c2 = cT = -0.103391 */
static void test_lstm_forward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 1, 1), (const float[]){1, -0.5f});
  kiln_blob *cont = blob_of("cont", 2, SHAPE(2, 1), (const float[]){0, 1});
  const float wx[4] = {0.5f, -0.3f, 0.8f, 1.2f}, bc[4] = {0.1f, 0.2f, -0.1f, 0.05f},
              wh[4] = {0.4f, -0.6f, 0.3f, -0.7f};
  kiln_blob *b[4] = {x, cont};
  built l = build("name: 'lstm' type: 'LSTM' recurrent_param { num_output: 1 }", TRAIN, b, 2, 1);
  set_params(&l, 0, wx);
  set_params(&l, 1, bc);
  set_params(&l, 2, wh);
  forward(&l);
  expect_shape(l.top[0], 3, SHAPE(2, 1, 1));
  expect_close("lstm h", l.top[0]->data, (const float[]){0.3332881755f, -0.0121217194f}, 2, 1e-6);
  unbuild(&l);

  kiln_blob *h0 = blob_of("h0", 3, SHAPE(1, 1, 1), (const float[]){0.3f});
  kiln_blob *c0 = blob_of("c0", 3, SHAPE(1, 1, 1), (const float[]){-0.4f});
  cont->data[0] = 1;
  b[2] = h0;
  b[3] = c0;
  built e = build("name: 'lstm' type: 'LSTM' recurrent_param { num_output: 1 expose_hidden: true }",
                  TRAIN, b, 4, 3);
  set_params(&e, 0, wx);
  set_params(&e, 1, bc);
  set_params(&e, 2, wh);
  forward(&e);
  expect_close("lstm h (exposed)", e.top[0]->data, (const float[]){0.2319986158f, -0.0405945606f},
               2, 1e-6);
  expect_shape(e.top[1], 3, SHAPE(1, 1, 1));
  expect_shape(e.top[2], 3, SHAPE(1, 1, 1));
  expect_close("lstm hT", e.top[1]->data, (const float[]){-0.0405945606f}, 1, 1e-6);
  expect_close("lstm cT", e.top[2]->data, (const float[]){-0.1033906812f}, 1, 1e-6);
  /* Exposed, the state does not carry over: the same bottoms give the same tops. */
  forward(&e);
  expect_close("lstm h (exposed, again)", e.top[0]->data,
               (const float[]){0.2319986158f, -0.0405945606f}, 2, 1e-6);
  unbuild(&e);

  /* Not exposed, a continued stream starts from the last pass's hT and cT: two passes of one
   * step each equal one pass of two steps. */
  kiln_blob *x1 = blob_of("x1", 3, SHAPE(1, 1, 1), (const float[]){1});
  kiln_blob *k1 = blob_of("k1", 2, SHAPE(1, 1), (const float[]){0});
  kiln_blob *b1[2] = {x1, k1};
  built s = build("name: 'lstm' type: 'LSTM' recurrent_param { num_output: 1 }", TRAIN, b1, 2, 1);
  set_params(&s, 0, wx);
  set_params(&s, 1, bc);
  set_params(&s, 2, wh);
  forward(&s);
  expect_close("lstm h, step 1", s.top[0]->data, (const float[]){0.3332881755f}, 1, 1e-6);
  x1->data[0] = -0.5f;
  k1->data[0] = 1;
  forward(&s);
  expect_close("lstm h, step 2 carried", s.top[0]->data, (const float[]){-0.0121217194f}, 1, 1e-6);
  unbuild(&s);
  kiln_blob_free(x1);
  kiln_blob_free(k1);
  kiln_blob_free(h0);
  kiln_blob_free(c0);
  kiln_blob_free(x);
  kiln_blob_free(cont);
}

/* ---- RNN and LSTM: parameters ------------------------------------------------------------- */

/* Caffe's blobs in Caffe's order (those of its unrolled net, in the order its layers hold them),
 * GRU's in PyTorch's with the static weights where LSTM has them, filled by recurrent_param's
 * weight_filler and bias_filler; a bidirectional layer's are its direction's twice (a
 * bidirectional RNN with a static input has 12), and its output is T x N x 2H; the tops' shapes.
 * x is T x N x 2 x 3 (6 features from axis 2), x_static N x 5. */
static void test_recurrent_param_blobs(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 4, 4);
  kiln_blob *x = gc_blob("x", 4, SHAPE(3, 2, 2, 3), -1, 1, &rng);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(3, 2), (const float[]){0, 0, 1, 1, 1, 1});
  kiln_blob *xs = gc_blob("xs", 2, SHAPE(2, 5), -1, 1, &rng);
  kiln_blob *h0 = blob_of("h0", 3, SHAPE(1, 2, 4), NULL),
            *c0 = blob_of("c0", 3, SHAPE(1, 2, 4), NULL);
  const char *fill_text =
      "weight_filler { type: 'constant' value: 0.25 } "
      "bias_filler { type: 'constant' value: 0.5 }";
  char text[512];
  static const struct {
    const char *type;
    bool static_input, expose, bidir;
    int nparam;
    int64_t shape[6][2]; /* one direction's {rows, cols}; cols 0: a vector */
  } cases[] = {
      {"LSTM", false, false, false, 3, {{16, 6}, {16, 0}, {16, 4}}},
      {"LSTM", true, false, false, 4, {{16, 6}, {16, 0}, {16, 5}, {16, 4}}},
      {"LSTM", true, true, false, 4, {{16, 6}, {16, 0}, {16, 5}, {16, 4}}},
      {"RNN", false, false, false, 5, {{4, 6}, {4, 0}, {4, 4}, {4, 4}, {4, 0}}},
      {"RNN", true, false, false, 6, {{4, 6}, {4, 0}, {4, 5}, {4, 4}, {4, 4}, {4, 0}}},
      {"RNN", true, true, false, 6, {{4, 6}, {4, 0}, {4, 5}, {4, 4}, {4, 4}, {4, 0}}},
      {"GRU", false, false, false, 4, {{12, 6}, {12, 0}, {12, 4}, {12, 0}}},
      {"GRU", true, false, false, 5, {{12, 6}, {12, 0}, {12, 5}, {12, 4}, {12, 0}}},
      {"GRU", true, true, false, 5, {{12, 6}, {12, 0}, {12, 5}, {12, 4}, {12, 0}}},
      {"GRU", true, false, true, 10, {{12, 6}, {12, 0}, {12, 5}, {12, 4}, {12, 0}}},
      {"LSTM", true, false, true, 8, {{16, 6}, {16, 0}, {16, 5}, {16, 4}}},
      {"RNN", false, false, true, 10, {{4, 6}, {4, 0}, {4, 4}, {4, 4}, {4, 0}}},
      {"RNN", true, false, true, 12, {{4, 6}, {4, 0}, {4, 5}, {4, 4}, {4, 4}, {4, 0}}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const bool lstm = cases[k].type[0] == 'L';
    snprintf(text, sizeof text,
             "name: 'r' type: '%s' recurrent_param { num_output: 4 expose_hidden: %s "
             "bidirectional: %s %s }",
             cases[k].type, cases[k].expose ? "true" : "false", cases[k].bidir ? "true" : "false",
             fill_text);
    kiln_blob *b[5] = {x, cont};
    int nb = 2;
    if (cases[k].static_input) b[nb++] = xs;
    if (cases[k].expose) {
      b[nb++] = h0;
      if (lstm) b[nb++] = c0;
    }
    const int ntop = cases[k].expose ? (lstm ? 3 : 2) : 1;
    built r = build(text, TRAIN, b, nb, ntop);
    assert_int_equal(r.l->nparam, cases[k].nparam);
    const int per = cases[k].nparam / (cases[k].bidir ? 2 : 1);
    for (int p = 0; p < r.l->nparam; p++) {
      const int64_t *sh = cases[k].shape[p % per];
      const kiln_blob *w = r.l->param[p];
      if (sh[1])
        expect_shape(w, 2, sh);
      else
        expect_shape(w, 1, sh);
      /* Vectors are the biases (b_c; b_h, b_o; b_ih, b_hh), matrices the weights. */
      for (int64_t i = 0; i < w->count; i++) assert_true(w->data[i] == (sh[1] ? 0.25f : 0.5f));
    }
    expect_shape(r.top[0], 3, SHAPE(3, 2, cases[k].bidir ? 8 : 4));
    for (int t = 1; t < ntop; t++) expect_shape(r.top[t], 3, SHAPE(1, 2, 4));
    unbuild(&r);
  }
  kiln_blob_free(x);
  kiln_blob_free(cont);
  kiln_blob_free(xs);
  kiln_blob_free(h0);
  kiln_blob_free(c0);
}

/* ---- RNN and LSTM: gradients ------------------------------------------------------------- */

/* T = 3 steps of N = 2 streams. Stream 0 runs one sequence through the batch; stream 1 starts
 * a new one at t = 1 (cont 0 there). Without expose_hidden both start at t = 0 (cont 0: the
 * carried state does not enter, so repeated passes agree); with it both continue from h0 / c0
 * at t = 0, so the initial state's gradients are not zero. */
static const float cont_fresh[6] = {0, 0, 1, 0, 1, 1};
static const float cont_exposed[6] = {1, 1, 1, 0, 1, 1};

/* The bottoms of a gradient check in b[]: x (3 x 2 x 2 x 2: 4 features a step), cont,
 * x_static (2 x 3) if asked, and with the state exposed h0 (and c0 for LSTM); their count.
 * *mask selects every bottom but cont (bottom 1), which takes no gradient. */
static int recurrent_bottoms(kiln_blob **b, bool lstm, bool static_input, bool expose,
                             unsigned *mask) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 17, static_input * 2 + expose);
  int nb = 0;
  b[nb++] = gc_blob("x", 4, SHAPE(3, 2, 2, 2), -1, 1, &rng);
  b[nb++] = blob_of("cont", 2, SHAPE(3, 2), expose ? cont_exposed : cont_fresh);
  if (static_input) b[nb++] = gc_blob("xs", 2, SHAPE(2, 3), -1, 1, &rng);
  if (expose) {
    b[nb++] = gc_blob("h0", 3, SHAPE(1, 2, 3), -1, 1, &rng);
    if (lstm) b[nb++] = gc_blob("c0", 3, SHAPE(1, 2, 3), -1, 1, &rng);
  }
  *mask = ((1u << nb) - 1) & ~(1u << 1);
  return nb;
}

#define RECURRENT_FILLERS                                 \
  "weight_filler { type: 'uniform' min: -0.6 max: 0.6 } " \
  "bias_filler { type: 'uniform' min: -0.5 max: 0.5 } }"

/* Without and with x_static, without and with the state exposed (tops o and hT). */
static void test_rnn_gradients(void **state) {
  (void)state;
  for (int k = 0; k < 4; k++) {
    const bool static_input = k & 1, expose = k & 2;
    kiln_blob *b[5];
    gradcheck_opts o = {0};
    const int nb = recurrent_bottoms(b, false, static_input, expose, &o.bottom_mask);
    check_grad(expose ? "name: 'r' type: 'RNN' recurrent_param { num_output: 3 "
                        "expose_hidden: true " RECURRENT_FILLERS
                      : "name: 'r' type: 'RNN' recurrent_param { num_output: 3 " RECURRENT_FILLERS,
               b, nb, expose ? 2 : 1, &o);
    for (int i = 0; i < nb; i++) kiln_blob_free(b[i]);
  }
}

/* The same for LSTM (tops h, hT and cT; bottoms h0 and c0). */
static void test_lstm_gradients(void **state) {
  (void)state;
  for (int k = 0; k < 4; k++) {
    const bool static_input = k & 1, expose = k & 2;
    kiln_blob *b[5];
    gradcheck_opts o = {0};
    const int nb = recurrent_bottoms(b, true, static_input, expose, &o.bottom_mask);
    check_grad(expose ? "name: 'r' type: 'LSTM' recurrent_param { num_output: 3 "
                        "expose_hidden: true " RECURRENT_FILLERS
                      : "name: 'r' type: 'LSTM' recurrent_param { num_output: 3 " RECURRENT_FILLERS,
               b, nb, expose ? 3 : 1, &o);
    for (int i = 0; i < nb; i++) kiln_blob_free(b[i]);
  }
}

/* Backward twice after one forward, with garbage in the bottom diffs before each: every bottom
 * diff comes out the same (overwritten), every parameter diff doubles (accumulated). With the
 * static input and the state exposed, so every bottom but cont takes a gradient; and
 * bidirectional (no state bottoms), where the reverse direction's gradients add to the
 * forward one's in the same bottom diffs. */
static void test_recurrent_backward_contract(void **state) {
  (void)state;
  static const char *const types[3] = {"RNN", "LSTM", "GRU"};
  for (int k = 0; k < 6; k++) {
    const char *type = types[k % 3];
    const bool lstm = k % 3 == 1, bidir = k >= 3;
    kiln_rng rng;
    kiln_rng_seed(&rng, 40, k);
    kiln_blob *b[5];
    int nb = 0;
    b[nb++] = gc_blob("x", 3, SHAPE(4, 3, 5), -1, 1, &rng);
    b[nb++] = blob_of("cont", 2, SHAPE(4, 3), (const float[]){1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1});
    b[nb++] = gc_blob("xs", 2, SHAPE(3, 2), -1, 1, &rng);
    if (!bidir) {
      b[nb++] = gc_blob("h0", 3, SHAPE(1, 3, 4), -1, 1, &rng);
      if (lstm) b[nb++] = gc_blob("c0", 3, SHAPE(1, 3, 4), -1, 1, &rng);
    }
    char text[400], who[32];
    snprintf(text, sizeof text,
             "name: 'r' type: '%s' recurrent_param { num_output: 4 %s "
             "weight_filler { type: 'gaussian' std: 0.4 } bias_filler { type: 'gaussian' } }",
             type, bidir ? "bidirectional: true" : "expose_hidden: true");
    snprintf(who, sizeof who, "layer 'r' (%s)", type);
    built r = build(text, TRAIN, b, nb, bidir ? 1 : lstm ? 3 : 2);
    r.l->propagate_down[1] = false;
    forward(&r);
    for (int t = 0; t < r.ntop; t++)
      for (int64_t i = 0; i < r.top[t]->count; i++)
        r.top[t]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
    for (int p = 0; p < r.l->nparam; p++) fill(r.l->param[p]->diff, r.l->param[p]->count, 0);
    for (int i = 0; i < nb; i++) fill(b[i]->diff, b[i]->count, 123.0f);
    backward(&r);
    float *d1[5], *p1[KILN_MAX_LAYER_PARAMS];
    for (int i = 0; i < nb; i++) {
      d1[i] = malloc(sizeof(float) * (size_t)b[i]->count);
      assert_non_null(d1[i]);
      memcpy(d1[i], b[i]->diff, sizeof(float) * (size_t)b[i]->count);
      fill(b[i]->diff, b[i]->count, -77.0f);
    }
    for (int p = 0; p < r.l->nparam; p++) {
      p1[p] = malloc(sizeof(float) * (size_t)r.l->param[p]->count);
      assert_non_null(p1[p]);
      for (int64_t i = 0; i < r.l->param[p]->count; i++) p1[p][i] = 2 * r.l->param[p]->diff[i];
    }
    backward(&r);
    for (int i = 0; i < nb; i++) {
      if (i != 1)
        expect_close("bottom diff after a second backward", b[i]->diff, d1[i], b[i]->count, 0);
      free(d1[i]);
    }
    for (int p = 0; p < r.l->nparam; p++) {
      expect_close("param diff after a second backward", r.l->param[p]->diff, p1[p],
                   r.l->param[p]->count, 1e-6);
      free(p1[p]);
    }
    /* A gradient asked of cont is refused, naming the layer. */
    r.l->propagate_down[1] = true;
    kiln_clear_error();
    assert_int_equal(layer_backward(r.l), KILN_ERR_INVALID);
    expect_message(who, "sequence indicators", NULL);
    assert_true(r.l->ops->no_gradient_bottoms == 1u << 1);
    unbuild(&r);
    for (int i = 0; i < nb; i++) kiln_blob_free(b[i]);
  }
}

/* Batches of no steps and of no streams, as Caffe allows blobs of no elements: with no step the
 * final state is the initial one, in both directions; with no stream there is nothing to do. */
static void test_recurrent_empty_batches(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(0, 2, 3), NULL);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(0, 2), NULL);
  kiln_blob *xs = blob_of("xs", 2, SHAPE(2, 2), (const float[]){1, 2, 3, 4});
  kiln_blob *h0 = blob_of("h0", 3, SHAPE(1, 2, 2), (const float[]){0.1f, 0.2f, 0.3f, 0.4f});
  kiln_blob *c0 = blob_of("c0", 3, SHAPE(1, 2, 2), (const float[]){-1, -2, -3, -4});
  kiln_blob *b[5] = {x, cont, xs, h0, c0};
  built l = build("name: 'l' type: 'LSTM' recurrent_param { num_output: 2 expose_hidden: true "
                  "weight_filler { type: 'gaussian' } }",
                  TRAIN, b, 5, 3);
  forward(&l);
  expect_shape(l.top[0], 3, SHAPE(0, 2, 2));
  expect_close("hT with no steps", l.top[1]->data, h0->data, 4, 0);
  expect_close("cT with no steps", l.top[2]->data, c0->data, 4, 0);
  for (int p = 0; p < l.l->nparam; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
  fill(l.top[1]->diff, 4, 5);
  fill(l.top[2]->diff, 4, 6);
  fill(xs->diff, 4, 9);
  l.l->propagate_down[1] = false;
  backward(&l);
  expect_close("dh0 with no steps", h0->diff, (const float[]){5, 5, 5, 5}, 4, 0);
  expect_close("dc0 with no steps", c0->diff, (const float[]){6, 6, 6, 6}, 4, 0);
  expect_close("dx_static with no steps", xs->diff, (const float[]){0, 0, 0, 0}, 4, 0);
  for (int p = 0; p < l.l->nparam; p++)
    for (int64_t i = 0; i < l.l->param[p]->count; i++) assert_true(l.l->param[p]->diff[i] == 0);
  unbuild(&l);

  /* Bidirectional: neither direction has a step to run. */
  built g = build("name: 'g' type: 'GRU' recurrent_param { num_output: 2 bidirectional: true "
                  "weight_filler { type: 'gaussian' } }",
                  TRAIN, b, 3, 1);
  forward(&g);
  expect_shape(g.top[0], 3, SHAPE(0, 2, 4));
  for (int p = 0; p < g.l->nparam; p++) fill(g.l->param[p]->diff, g.l->param[p]->count, 0);
  fill(xs->diff, 4, 9);
  g.l->propagate_down[1] = false;
  backward(&g);
  expect_close("dx_static with no steps, bidirectional", xs->diff, (const float[]){0, 0, 0, 0}, 4,
               0);
  for (int p = 0; p < g.l->nparam; p++)
    for (int64_t i = 0; i < g.l->param[p]->count; i++) assert_true(g.l->param[p]->diff[i] == 0);
  unbuild(&g);

  kiln_blob *xn = blob_of("x", 3, SHAPE(3, 0, 3), NULL);
  kiln_blob *cn = blob_of("cont", 2, SHAPE(3, 0), NULL);
  kiln_blob *bn[2] = {xn, cn};
  built r = build("name: 'r' type: 'RNN' recurrent_param { num_output: 2 }", TRAIN, bn, 2, 1);
  forward(&r);
  expect_shape(r.top[0], 3, SHAPE(3, 0, 2));
  r.l->propagate_down[1] = false;
  backward(&r);
  unbuild(&r);
  kiln_blob *all[] = {x, cont, xs, h0, c0, xn, cn};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_blob_free(all[i]);
}

/* The number of steps and of streams may change from one pass to the next (TextData's
 * SEQUENCES batches do: T is the longest sequence of the bucket, N its size). After a reshape
 * the layer gives what a layer built for the new shape gives, with the same parameters: RNN,
 * LSTM, GRU, and LSTM and GRU bidirectional (whose buffers hold a slice per direction). */
static void test_recurrent_shape_changes(void **state) {
  (void)state;
#define SHAPE_FILLERS \
  "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' } }"
  const char *texts[5] = {
      "name: 'r' type: 'RNN' recurrent_param { num_output: 3 " SHAPE_FILLERS,
      "name: 'l' type: 'LSTM' recurrent_param { num_output: 3 " SHAPE_FILLERS,
      "name: 'g' type: 'GRU' recurrent_param { num_output: 3 " SHAPE_FILLERS,
      "name: 'l' type: 'LSTM' recurrent_param { num_output: 3 bidirectional: true " SHAPE_FILLERS,
      "name: 'g' type: 'GRU' recurrent_param { num_output: 3 bidirectional: true " SHAPE_FILLERS};
#undef SHAPE_FILLERS
  kiln_rng rng;
  kiln_rng_seed(&rng, 61, 0);
  for (int k = 0; k < 5; k++) {
    const int64_t features = k < 3 ? 3 : 6; /* H, or 2H when bidirectional */
    kiln_blob *x = gc_blob("x", 3, SHAPE(4, 3, 2), -1, 1, &rng);
    kiln_blob *cont =
        blob_of("cont", 2, SHAPE(4, 3), (const float[]){0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1});
    kiln_blob *b[2] = {x, cont};
    built big = build(texts[k], TRAIN, b, 2, 1);
    forward(&big);
    /* Fewer steps and streams: x 2 x 2 x 2, cont 2 x 2, as the next bucket might be. */
    kiln_blob *x2 = gc_blob("x2", 3, SHAPE(2, 2, 2), -1, 1, &rng);
    kiln_blob *c2 = blob_of("c2", 2, SHAPE(2, 2), (const float[]){0, 0, 1, 0});
    assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(2, 2, 2)), KILN_OK);
    assert_int_equal(kiln_blob_reshape(cont, 2, SHAPE(2, 2)), KILN_OK);
    memcpy(x->data, x2->data, sizeof(float) * 8);
    memcpy(cont->data, c2->data, sizeof(float) * 4);
    assert_int_equal(big.l->ops->reshape(big.l), KILN_OK);
    expect_shape(big.top[0], 3, SHAPE(2, 2, features));
    forward(&big);
    kiln_blob *b2[2] = {x2, c2};
    built small = build(texts[k], TRAIN, b2, 2, 1);
    for (int p = 0; p < big.l->nparam; p++) set_params(&small, p, big.l->param[p]->data);
    forward(&small);
    const int64_t count = 4 * features;
    expect_close("output after the reshape", big.top[0]->data, small.top[0]->data, count, 0);
    /* And the gradients. */
    for (int64_t i = 0; i < count; i++)
      big.top[0]->diff[i] = small.top[0]->diff[i] = (float)i / (float)count - 0.5f;
    for (int p = 0; p < big.l->nparam; p++) {
      fill(big.l->param[p]->diff, big.l->param[p]->count, 0);
      fill(small.l->param[p]->diff, small.l->param[p]->count, 0);
    }
    big.l->propagate_down[1] = small.l->propagate_down[1] = false;
    backward(&big);
    backward(&small);
    expect_close("x gradient after the reshape", x->diff, x2->diff, 8, 0);
    for (int p = 0; p < big.l->nparam; p++)
      expect_close("param gradient after the reshape", big.l->param[p]->diff,
                   small.l->param[p]->diff, big.l->param[p]->count, 0);
    unbuild(&big);
    unbuild(&small);
    kiln_blob *all[] = {x, cont, x2, c2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_blob_free(all[i]);
  }
}

/* ---- RNN and LSTM: errors ---------------------------------------------------------------- */

static void test_recurrent_errors(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 2, 4), NULL), *x2 = blob_of("x2", 2, SHAPE(3, 2), NULL);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(3, 2), NULL),
            *cont3 = blob_of("c3", 2, SHAPE(3, 3), NULL);
  kiln_blob *h0 = blob_of("h0", 3, SHAPE(1, 2, 5), NULL),
            *hbad = blob_of("hb", 2, SHAPE(2, 5), NULL);
  kiln_blob *xs1 = blob_of("xs1", 1, SHAPE(2), NULL), *xs3 = blob_of("xs3", 2, SHAPE(3, 2), NULL);
  const char *lstm = "name: 'l' type: 'LSTM' recurrent_param { num_output: 5 }";
  const char *lstm_exp =
      "name: 'l' type: 'LSTM' recurrent_param { num_output: 5 expose_hidden: true }";
  const char *rnn_exp =
      "name: 'r' type: 'RNN' recurrent_param { num_output: 5 expose_hidden: true }";
  const char *wl = "layer 'l' (LSTM)", *wr = "layer 'r' (RNN)";
  kiln_blob *b[5] = {x, cont};
  expect_create_fails("name: 'l' type: 'LSTM'", TRAIN, b, 2, 1, KILN_ERR_INVALID, wl, "num_output");
  expect_create_fails("name: 'r' type: 'RNN' recurrent_param { }", TRAIN, b, 2, 1, KILN_ERR_INVALID,
                      wr, "num_output");
  b[0] = x2; /* T x N alone: no feature axis for Caffe's InnerProduct on axis 2 */
  expect_create_fails(lstm, TRAIN, b, 2, 1, KILN_ERR_SHAPE, wl, "at least 3 axes");
  b[0] = x;
  b[1] = cont3;
  expect_create_fails(lstm, TRAIN, b, 2, 1, KILN_ERR_SHAPE, wl, "cont must be T x N");
  b[1] = x;
  expect_create_fails(lstm, TRAIN, b, 2, 1, KILN_ERR_SHAPE, wl, "cont must have 2 axes");
  b[1] = cont;
  b[2] = xs1;
  expect_create_fails(lstm, TRAIN, b, 3, 1, KILN_ERR_SHAPE, wl, "x_static must have at least 2");
  b[2] = xs3;
  expect_create_fails(lstm, TRAIN, b, 3, 1, KILN_ERR_SHAPE, wl, "x_static is 3x2");
  /* Tops and bottoms that expose_hidden adds. */
  expect_create_fails(lstm, TRAIN, b, 2, 3, KILN_ERR_INVALID, wl, "takes 1 top");
  b[2] = h0;
  expect_create_fails(lstm_exp, TRAIN, b, 3, 3, KILN_ERR_INVALID, wl, "takes 4 or 5 bottoms");
  b[3] = h0;
  expect_create_fails(lstm_exp, TRAIN, b, 4, 1, KILN_ERR_INVALID, wl, "(h, hT, cT)");
  b[2] = hbad;
  expect_create_fails(rnn_exp, TRAIN, b, 3, 2, KILN_ERR_SHAPE, wr, "h0 is 2x5");
  b[2] = h0;
  b[3] = hbad;
  expect_create_fails(lstm_exp, TRAIN, b, 4, 3, KILN_ERR_SHAPE, wl, "c0 is 2x5");
  kiln_blob *free_list[] = {x, x2, cont, cont3, h0, hbad, xs1, xs3};
  for (size_t i = 0; i < sizeof free_list / sizeof free_list[0]; i++) kiln_blob_free(free_list[i]);
}

/* ---- in a net ---------------------------------------------------------------------------- */

/* The shape of Caffe's LRCN captioning nets: sequences of T steps of N streams, an LSTM over
 * them, a classifier on every step (InnerProduct on axis 2) and a softmax loss over the class
 * axis 2, with ignore_label for padding and LRCN's loss weight. */
static const char *lrcn_text =
    "name: 'lrcn_fragment' %s\n"
    "layer { name: 'x' type: 'Input' top: 'x' input_param { shape { dim: 4 dim: 3 dim: 5 } } }\n"
    "layer { name: 'cont' type: 'Input' top: 'cont' input_param { shape { dim: 4 dim: 3 } } }\n"
    "layer { name: 'label' type: 'Input' top: 'label' input_param { shape { dim: 4 dim: 3 } } }\n"
    "layer { name: 'lstm1' type: 'LSTM' bottom: 'x' bottom: 'cont' top: 'lstm1'\n"
    "  recurrent_param { num_output: 6 weight_filler { type: 'uniform' min: -0.3 max: 0.3 }\n"
    "    bias_filler { type: 'constant' value: 0 } } }\n"
    "layer { name: 'predict' type: 'InnerProduct' bottom: 'lstm1' top: 'predict'\n"
    "  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }\n"
    "  inner_product_param { num_output: 7 weight_filler { type: 'uniform' min: -0.3 max: 0.3 }\n"
    "    bias_filler { type: 'constant' value: 0 } axis: 2 } }\n"
    "layer { name: 'cross_entropy_loss' type: 'SoftmaxWithLoss' bottom: 'predict'\n"
    "  bottom: 'label' top: 'cross_entropy_loss' loss_weight: 20\n"
    "  loss_param { ignore_label: -1 } softmax_param { axis: 2 } }\n";

static kiln_net *lrcn_net(const char *extra, Caffe__NetParameter **np) {
  char text[2048];
  snprintf(text, sizeof text, lrcn_text, extra);
  if (kiln_net_param_from_text(text, "lrcn.prototxt", np)) fail_msg("%s", kiln_last_error());
  kiln_net_options opt = {.phase = TRAIN, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *net;
  if (kiln_net_create(*np, &opt, &net)) fail_msg("%s", kiln_last_error());
  kiln_rng rng;
  kiln_rng_seed(&rng, 12, 0);
  kiln_blob *x = kiln_net_blob(net, "x"), *cont = kiln_net_blob(net, "cont");
  kiln_blob *label = kiln_net_blob(net, "label");
  for (int64_t i = 0; i < x->count; i++) x->data[i] = kiln_rng_uniform(&rng, -1, 1);
  /* Stream 0 one sequence; stream 1 restarts at t = 2; stream 2 at t = 1, padded after t = 2. */
  const float c[12] = {0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1};
  memcpy(cont->data, c, sizeof c);
  for (int64_t i = 0; i < label->count; i++) label->data[i] = (float)kiln_rng_below(&rng, 7);
  label->data[3 * 3 + 2] = -1;
  return net;
}

static double net_loss(kiln_net *net) {
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  return loss;
}

static void test_lrcn_net_forward_backward(void **state) {
  (void)state;
  Caffe__NetParameter *np;
  kiln_net *net = lrcn_net("", &np);
  expect_shape(kiln_net_blob(net, "lstm1"), 3, SHAPE(4, 3, 6));
  expect_shape(kiln_net_blob(net, "predict"), 3, SHAPE(4, 3, 7));
  kiln_layer *lstm = kiln_net_layer(net, "lstm1");
  assert_non_null(lstm);
  assert_int_equal(lstm->nparam, 3);
  assert_false(lstm->propagate_down[0]); /* x is an input nobody learns */
  assert_false(lstm->propagate_down[1]);
  kiln_net_zero_param_diff(net);
  const double loss = net_loss(net);
  assert_true(isfinite(loss) && loss > 0);
  /* 11 labelled positions of 7 classes, small weights: near 20 ln 7 (their mean, weighted). */
  assert_true(fabs(loss - 20 * log(7.0)) < 10);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  /* Every LSTM parameter gradient against finite differences of the net's loss. */
  const double step = 1e-2;
  int bad = 0;
  for (int p = 0; p < lstm->nparam; p++) {
    kiln_blob *w = lstm->param[p];
    float *analytic = malloc(sizeof(float) * (size_t)w->count);
    assert_non_null(analytic);
    memcpy(analytic, w->diff, sizeof(float) * (size_t)w->count);
    for (int64_t i = 0; i < w->count; i++) {
      const float keep = w->data[i];
      w->data[i] = keep + (float)step;
      const double up = net_loss(net);
      w->data[i] = keep - (float)step;
      const double down = net_loss(net);
      w->data[i] = keep;
      const double numeric = (up - down) / (2 * step);
      const double scale = fmax(fmax(fabs(numeric), fabs(analytic[i])), 1.0);
      if (fabs(numeric - analytic[i]) > 2e-3 * scale) {
        if (bad++ < 10)
          print_error("lstm1 param %d element %lld: analytic %g numeric %g\n", p, (long long)i,
                      (double)analytic[i], numeric);
      }
    }
    free(analytic);
  }
  assert_int_equal(bad, 0);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);

  /* force_backward asks for x's gradient, but leaves cont alone, as Caffe's AllowForceBackward
   * does. */
  net = lrcn_net("force_backward: true", &np);
  lstm = kiln_net_layer(net, "lstm1");
  assert_true(lstm->propagate_down[0]);
  assert_false(lstm->propagate_down[1]);
  kiln_net_zero_param_diff(net);
  net_loss(net);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  kiln_blob *x = kiln_net_blob(net, "x");
  double norm = 0;
  for (int64_t i = 0; i < x->count; i++) norm += fabs(x->diff[i]);
  assert_true(isfinite(norm) && norm > 0);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* An LRCN language-model front: word indices -> Embed -> LSTM with a static input (an image
 * feature, as LRCN's factored models feed it) -> per-step classifier. Only rows of the embedding
 * that some word used get a gradient; a forced backward leaves the indices alone. */
static void test_embed_lstm_net(void **state) {
  (void)state;
  const char *text =
      "name: 'lm' force_backward: true\n"
      "layer { name: 'words' type: 'Input' top: 'words' top: 'cont' top: 'image' top: 'target'\n"
      "  input_param { shape { dim: 3 dim: 2 } shape { dim: 3 dim: 2 } shape { dim: 2 dim: 4 }\n"
      "    shape { dim: 3 dim: 2 } } }\n"
      "layer { name: 'embed' type: 'Embed' bottom: 'words' top: 'embedded'\n"
      "  embed_param { num_output: 5 input_dim: 10 bias_term: false\n"
      "    weight_filler { type: 'uniform' min: -0.1 max: 0.1 } } }\n"
      "layer { name: 'lstm' type: 'LSTM' bottom: 'embedded' bottom: 'cont' bottom: 'image'\n"
      "  top: 'lstm' recurrent_param { num_output: 4 weight_filler { type: 'uniform' min: -0.1\n"
      "    max: 0.1 } } }\n"
      "layer { name: 'predict' type: 'InnerProduct' bottom: 'lstm' top: 'predict'\n"
      "  inner_product_param { num_output: 10 axis: 2 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'predict' bottom: 'target'\n"
      "  top: 'loss' softmax_param { axis: 2 } }\n";
  Caffe__NetParameter *np;
  if (kiln_net_param_from_text(text, "lm.prototxt", &np)) fail_msg("%s", kiln_last_error());
  kiln_net_options opt = {.phase = TRAIN, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *net;
  if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());
  const float words[6] = {1, 4, 4, 7, 2, 4}, cont[6] = {0, 0, 1, 1, 1, 0};
  const float target[6] = {4, 7, 2, 4, 9, 0};
  memcpy(kiln_net_blob(net, "words")->data, words, sizeof words);
  memcpy(kiln_net_blob(net, "cont")->data, cont, sizeof cont);
  memcpy(kiln_net_blob(net, "target")->data, target, sizeof target);
  kiln_blob *image = kiln_net_blob(net, "image");
  for (int64_t i = 0; i < image->count; i++) image->data[i] = (float)i / 8;
  expect_shape(kiln_net_blob(net, "embedded"), 3, SHAPE(3, 2, 5));
  kiln_layer *embed = kiln_net_layer(net, "embed"), *lstm = kiln_net_layer(net, "lstm");
  assert_false(embed->propagate_down[0]);
  assert_true(lstm->propagate_down[0] && !lstm->propagate_down[1] && lstm->propagate_down[2]);
  assert_int_equal(lstm->nparam, 4);
  expect_shape(lstm->param[2], 2, SHAPE(16, 4)); /* W_xc_static: 4H x image features */
  kiln_net_zero_param_diff(net);
  const double loss = net_loss(net);
  assert_true(isfinite(loss) && fabs(loss - log(10.0)) < 0.5);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  const kiln_blob *w = embed->param[0];
  for (int row = 0; row < 10; row++) {
    const bool used = row == 1 || row == 2 || row == 4 || row == 7;
    double sum = 0;
    for (int c = 0; c < 5; c++) sum += fabs(w->diff[row * 5 + c]);
    if (used != (sum > 0)) fail_msg("embedding row %d: gradient %g", row, sum);
  }
  /* An index outside the table stops the forward pass with the layer's name. */
  kiln_net_blob(net, "words")->data[3] = 10;
  float l;
  assert_int_equal(kiln_net_forward(net, &l), KILN_ERR_INVALID);
  expect_message("layer 'embed' (Embed)", "index 10", NULL);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* A sentence classifier end to end: TextData's labelled sequences (batched by length, so T and
 * N change from batch to batch, padded at the end), Embed, an LSTM (or a bidirectional GRU,
 * whose reverse direction restarts at each sequence's last valid step), SequencePool taking the
 * last valid step, InnerProduct and SoftmaxWithLoss; forward and backward over a whole epoch and
 * into the next. */
static void test_text_classifier_net(void **state) {
  (void)state;
  char dir[64], path[256], text[2048];
  make_tmpdir(dir, sizeof dir, "rec");
  const char *records = "0\tabc\n1\td\n0\tefgh\n1\tij\n0\tkl\n";
  snprintf(path, sizeof path, "%s/records.tsv", dir);
  write_plain(path, records, strlen(records));
  kiln_vocab_builder *vb;
  assert_int_equal(kiln_vocab_builder_new(KILN_TOKENS_CHAR, false, &vb), KILN_OK);
  assert_int_equal(kiln_vocab_builder_add(vb, "abcdefghijkl", 12), KILN_OK);
  kiln_vocab *v;
  assert_int_equal(kiln_vocab_builder_finish(vb, 1, 0, &v), KILN_OK);
  kiln_vocab_builder_free(vb);
  snprintf(path, sizeof path, "%s/vocab.txt", dir);
  assert_int_equal(kiln_vocab_write(v, path), KILN_OK);
  const int V = kiln_vocab_size(v);
  kiln_vocab_free(v);
  for (int k = 0; k < 2; k++) {
    const bool bidir = k == 1;
    const int64_t features = bidir ? 10 : 5;
    snprintf(text, sizeof text,
             "name: 'classify'\n"
             "layer { name: 'text' type: 'TextData' top: 'words' top: 'label' top: 'cont'\n"
             "  top: 'mask' text_data_param { source: '%s/records.tsv' mode: SEQUENCES\n"
             "    batch_size: 2 seq_len: 4 } }\n"
             "layer { name: 'embed' type: 'Embed' bottom: 'words' top: 'emb'\n"
             "  embed_param { num_output: 4 input_dim: %d weight_filler { type: 'uniform'\n"
             "    min: -0.5 max: 0.5 } } }\n"
             "layer { name: 'rec' type: '%s' bottom: 'emb' bottom: 'cont' top: 'h'\n"
             "  recurrent_param { num_output: 5 bidirectional: %s weight_filler { type: 'uniform'\n"
             "    min: -0.5 max: 0.5 } } }\n"
             "layer { name: 'last' type: 'SequencePool' bottom: 'h' bottom: 'mask' top: 'last' }\n"
             "layer { name: 'ip' type: 'InnerProduct' bottom: 'last' top: 'ip'\n"
             "  inner_product_param { num_output: 2 weight_filler { type: 'xavier' } } }\n"
             "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label'\n"
             "  top: 'loss' }\n",
             dir, V, bidir ? "GRU" : "LSTM", bidir ? "true" : "false");
    Caffe__NetParameter *np;
    if (kiln_net_param_from_text(text, "classify.prototxt", &np)) fail_msg("%s", kiln_last_error());
    kiln_net_options opt = {.phase = TRAIN, .seed = 5, .config = kiln_test_net_config()};
    kiln_net *net;
    if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());
    kiln_layer *rec = kiln_net_layer(net, "rec");
    /* Buckets by length (1, 2 | 2, 3 | 4): T x N = 2 x 2, 3 x 2, 4 x 1, then 2 x 2 again. */
    const int64_t shapes[4][2] = {{2, 2}, {3, 2}, {4, 1}, {2, 2}};
    for (int batch = 0; batch < 4; batch++) {
      kiln_net_zero_param_diff(net);
      float loss;
      assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
      expect_shape(kiln_net_blob(net, "h"), 3, SHAPE(shapes[batch][0], shapes[batch][1], features));
      expect_shape(kiln_net_blob(net, "last"), 2, SHAPE(shapes[batch][1], features));
      assert_true(isfinite(loss) && loss > 0);
      assert_int_equal(kiln_net_backward(net), KILN_OK);
      double g = 0;
      for (int p = 0; p < rec->nparam; p++)
        for (int64_t i = 0; i < rec->param[p]->count; i++) g += fabs(rec->param[p]->diff[i]);
      assert_true(isfinite(g) && g > 0);
    }
    kiln_net_free(net);
    protobuf_c_message_free_unpacked(&np->base, NULL);
  }
  rm_tree(dir);
}

/* A .caffemodel as Caffe writes an LSTM with a static input and an RNN: each layer's blobs in
 * its unrolled net's order and shapes. kiln loads them into its own blobs unchanged. */
static void test_recurrent_caffemodel_loads(void **state) {
  (void)state;
  const char *text =
      "name: 'rec'\n"
      "layer { name: 'in' type: 'Input' top: 'x' top: 'cont' top: 'xs'\n"
      "  input_param { shape { dim: 2 dim: 1 dim: 3 } shape { dim: 2 dim: 1 }\n"
      "    shape { dim: 1 dim: 4 } } }\n"
      "layer { name: 'lstm' type: 'LSTM' bottom: 'x' bottom: 'cont' bottom: 'xs' top: 'h'\n"
      "  recurrent_param { num_output: 2 } }\n"
      "layer { name: 'rnn' type: 'RNN' bottom: 'h' bottom: 'cont' top: 'o'\n"
      "  recurrent_param { num_output: 3 } }\n";
  Caffe__NetParameter *np;
  if (kiln_net_param_from_text(text, "rec.prototxt", &np)) fail_msg("%s", kiln_last_error());
  kiln_net_options opt = {.phase = TEST, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *net;
  if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());

  /* The file: LSTM W_xc 8x3, b_c 8, W_xc_static 8x4, W_hc 8x2; RNN W_xh 3x2, b_h 3, W_hh 3x3,
   * W_ho 3x3, b_o 3. Values 0.01 k, k counting through the layers' blobs. */
  static const int64_t dims[9][2] = {{8, 3}, {8, 0}, {8, 4}, {8, 2}, {3, 2},
                                     {3, 0}, {3, 3}, {3, 3}, {3, 0}};
  Caffe__BlobShape shapes[9];
  Caffe__BlobProto blobs[9], *bp[9];
  float values[128];
  int k = 0;
  for (int i = 0; i < 9; i++) {
    caffe__blob_shape__init(&shapes[i]);
    shapes[i].n_dim = dims[i][1] ? 2 : 1;
    shapes[i].dim = (int64_t *)dims[i];
    caffe__blob_proto__init(&blobs[i]);
    blobs[i].shape = &shapes[i];
    blobs[i].n_data = (size_t)(dims[i][0] * (dims[i][1] ? dims[i][1] : 1));
    blobs[i].data = &values[k];
    for (size_t j = 0; j < blobs[i].n_data; j++, k++) values[k] = 0.01f * (float)k;
    bp[i] = &blobs[i];
  }
  Caffe__LayerParameter layers[2], *lp[2];
  const char *names[2] = {"lstm", "rnn"}, *types[2] = {"LSTM", "RNN"};
  for (int i = 0; i < 2; i++) {
    caffe__layer_parameter__init(&layers[i]);
    layers[i].name = (char *)names[i];
    layers[i].type = (char *)types[i];
    layers[i].n_blobs = i ? 5 : 4;
    layers[i].blobs = i ? &bp[4] : &bp[0];
    lp[i] = &layers[i];
  }
  Caffe__NetParameter file = CAFFE__NET_PARAMETER__INIT;
  file.n_layer = 2;
  file.layer = lp;
  char dir[64], path[128];
  make_tmpdir(dir, sizeof dir, "rec");
  snprintf(path, sizeof path, "%s/rec.caffemodel", dir);
  assert_int_equal(kiln_proto_write_binary(path, &file.base), KILN_OK);
  assert_int_equal(kiln_net_load_weights(net, path), KILN_OK);
  k = 0;
  for (int i = 0; i < 2; i++) {
    kiln_layer *l = kiln_net_layer(net, names[i]);
    assert_int_equal(l->nparam, i ? 5 : 4);
    for (int p = 0; p < l->nparam; p++)
      for (int64_t j = 0; j < l->param[p]->count; j++, k++)
        if (l->param[p]->data[j] != 0.01f * (float)k)
          fail_msg("%s blob %d element %lld: %g", names[i], p, (long long)j,
                   (double)l->param[p]->data[j]);
  }
  /* The same blobs in another order (W_hc where W_xc_static belongs) do not fit. */
  Caffe__BlobProto *swapped[4] = {bp[0], bp[1], bp[3], bp[2]};
  layers[0].blobs = swapped;
  file.n_layer = 1;
  assert_int_equal(kiln_proto_write_binary(path, &file.base), KILN_OK);
  assert_int_equal(kiln_net_load_weights(net, path), KILN_ERR_SHAPE);
  expect_message("'lstm'", NULL, NULL);
  rm_tree(dir);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* ---- learning ---------------------------------------------------------------------------- */

enum { PAR_T = 20, PAR_N = 32, PAR_H = 16 };

/* Random bits, one sequence per stream (cont 0 at t = 0); the label at each step is the parity
 * of the ones seen so far. */
static void parity_batch(kiln_net *net, kiln_rng *rng) {
  float *x = kiln_net_blob(net, "x")->data, *cont = kiln_net_blob(net, "cont")->data;
  float *label = kiln_net_blob(net, "label")->data;
  for (int n = 0; n < PAR_N; n++) {
    int parity = 0;
    for (int t = 0; t < PAR_T; t++) {
      const int bit = (int)kiln_rng_below(rng, 2);
      parity ^= bit;
      x[t * PAR_N + n] = (float)bit;
      cont[t * PAR_N + n] = t > 0;
      label[t * PAR_N + n] = (float)parity;
    }
  }
}

/* An LSTM (or a GRU) of 16 cells learns to say at every one of 20 steps whether it has seen an
 * odd number of ones so far (a flip-flop it must keep in its state through the sequence: no
 * single step's input tells), trained with Adam for 400 batches of 32 sequences from a fixed
 * seed (the LSTM gets there in about 150; 400 take under a second), and scores at least 99% of
 * the steps of 256 fresh sequences. A model that sees only the current input scores about 52%
 * (the first step, where the parity is the input, and half of the rest); the untrained net 60%. */
static void learns_running_parity(const char *type) {
  char text[2048];
  snprintf(text, sizeof text,
           "name: 'parity'\n"
           "layer { name: 'in' type: 'Input' top: 'x' top: 'cont' top: 'label'\n"
           "  input_param { shape { dim: %d dim: %d dim: 1 } shape { dim: %d dim: %d }\n"
           "    shape { dim: %d dim: %d } } }\n"
           "layer { name: 'rec' type: '%s' bottom: 'x' bottom: 'cont' top: 'h'\n"
           "  recurrent_param { num_output: %d weight_filler { type: 'uniform' min: -0.3\n"
           "    max: 0.3 } bias_filler { type: 'constant' value: 0 } } }\n"
           "layer { name: 'predict' type: 'InnerProduct' bottom: 'h' top: 'predict'\n"
           "  inner_product_param { num_output: 2 axis: 2 weight_filler { type: 'xavier' } } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'predict' bottom: 'label'\n"
           "  top: 'loss' softmax_param { axis: 2 } }\n",
           PAR_T, PAR_N, PAR_T, PAR_N, PAR_T, PAR_N, type, PAR_H);
  Caffe__NetParameter *np;
  if (kiln_net_param_from_text(text, "parity.prototxt", &np)) fail_msg("%s", kiln_last_error());
  /* One thread: these GEMMs are a few thousand multiply-adds each, too small to gain from a
   * second thread, and on a busy machine waiting for one made the run ten times longer. */
  const int threads = kiln_get_num_threads();
  kiln_set_num_threads(1);
  kiln_net_options opt = {
      .phase = TRAIN, .seed = 1701, .nthreads = 1, .config = kiln_test_net_config()};
  kiln_net *net;
  if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());
  kiln_rng rng;
  kiln_rng_seed(&rng, 2024, 1);
  /* Adam (lr 0.01, beta1 0.9, beta2 0.999) over the flat parameter buffer. */
  const int64_t P = net->nparam_floats;
  float *m = calloc((size_t)P, sizeof(float)), *v = calloc((size_t)P, sizeof(float));
  assert_true(m && v);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const int iters = 400;
  float loss = 0;
  for (int it = 1; it <= iters; it++) {
    parity_batch(net, &rng);
    kiln_net_zero_param_diff(net);
    assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
    assert_int_equal(kiln_net_backward(net), KILN_OK);
    const double c1 = 1 - pow(0.9, it), c2 = 1 - pow(0.999, it);
    for (int64_t i = 0; i < P; i++) {
      const float g = net->param_diff[i];
      m[i] = 0.9f * m[i] + 0.1f * g;
      v[i] = 0.999f * v[i] + 0.001f * g * g;
      net->param_data[i] -= (float)(0.01 * (m[i] / c1) / (sqrt(v[i] / c2) + 1e-8));
    }
  }
  int right = 0, total = 0;
  for (int batch = 0; batch < 8; batch++) {
    parity_batch(net, &rng);
    assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
    const float *pred = kiln_net_blob(net, "predict")->data;
    const float *label = kiln_net_blob(net, "label")->data;
    for (int i = 0; i < PAR_T * PAR_N; i++, total++)
      right += (pred[2 * i + 1] > pred[2 * i]) == (label[i] > 0.5f);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  const double accuracy = (double)right / total;
  print_message("running parity (%s): %.4f of %d steps right after %d iterations (%.1f s)\n",
                type, accuracy, total, iters, seconds);
  kiln_set_num_threads(threads);
  assert_true(accuracy >= 0.99);
  free(m);
  free(v);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

static void test_lstm_learns_running_parity(void **state) {
  (void)state;
  learns_running_parity("LSTM");
}

static void test_gru_learns_running_parity(void **state) {
  (void)state;
  learns_running_parity("GRU");
}

/* ---- LSTMUnit ------------------------------------------------------------------------------ */

/* N = 2 streams, D = 1; the gate inputs in Caffe's order i, f, o, g. Stream 0 starts a sequence
 * (cont 0: the forget gate is 0), stream 1 continues one:
 *   n0: i = sigmoid(0.6), o = sigmoid(0.7), g = tanh(1.25): C = i g = 0.547700, H = o tanh(C)
 *   n1: i = sigmoid(-0.2), f = sigmoid(0.4), o = sigmoid(0.1), g = tanh(-0.5):
 *       C = f (-0.8) + i g = -0.686980, H = -0.312908
 * Backward with dC = 0.5, dH = 1 (values from the formulas in src/layers/lstm_unit.c, worked
 * in double). */
static void test_lstm_unit_hand(void **state) {
  (void)state;
  kiln_blob *c = blob_of("c_prev", 3, SHAPE(1, 2, 1), (const float[]){0.3f, -0.8f});
  kiln_blob *x = blob_of("x", 3, SHAPE(1, 2, 4),
                         (const float[]){0.6f, -0.1f, 0.7f, 1.25f, -0.2f, 0.4f, 0.1f, -0.5f});
  kiln_blob *cont = blob_of("cont", 2, SHAPE(1, 2), (const float[]){0, 1});
  kiln_blob *b[3] = {c, x, cont};
  built r = build("name: 'u' type: 'LSTMUnit'", TRAIN, b, 3, 2);
  r.l->propagate_down[2] = false;
  forward(&r);
  expect_shape(r.top[0], 3, SHAPE(1, 2, 1));
  expect_shape(r.top[1], 3, SHAPE(1, 2, 1));
  expect_close("C", r.top[0]->data, (const float[]){0.547699682f, -0.686979562f}, 2, 1e-6);
  expect_close("H", r.top[1]->data, (const float[]){0.333288176f, -0.312907604f}, 2, 1e-6);
  fill(r.top[0]->diff, 2, 0.5f);
  fill(r.top[1]->diff, 2, 1.0f);
  backward(&r);
  expect_close("dc_prev", c->diff, (const float[]){0, 0.501984234f}, 2, 1e-6);
  expect_close("dX", x->diff,
               (const float[]){0.194451512f, 0, 0.110589092f, 0.181403875f, -0.095906081f,
                               -0.161161974f, -0.148637624f, 0.296846771f},
               8, 1e-6);
  /* no gradient reaches cont */
  r.l->propagate_down[2] = true;
  assert_int_equal(layer_backward(r.l), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "sequence indicators"));
  unbuild(&r);
  kiln_blob_free(c);
  kiln_blob_free(x);
  kiln_blob_free(cont);
}

/* Finite differences through c_prev and the gate inputs, with cont 0 and 1 mixed; the shape
 * errors name the bottom. */
static void test_lstm_unit_gradients_and_shapes(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 77, 1);
  kiln_blob *c = gc_blob("c_prev", 3, SHAPE(1, 3, 4), -1, 1, &rng);
  kiln_blob *x = gc_blob("x", 3, SHAPE(1, 3, 16), -2, 2, &rng);
  kiln_blob *cont = blob_of("cont", 2, SHAPE(1, 3), (const float[]){1, 0, 1});
  kiln_blob *b[3] = {c, x, cont};
  gradcheck_opts o = {.bottom_mask = 3};
  assert_int_equal(gradcheck_layer("name: 'u' type: 'LSTMUnit'", b, 3, 2, &o), 0);
  Caffe__LayerParameter *lp = gc_layer_param("name: 'u' type: 'LSTMUnit'");
  kiln_blob *tops[2] = {kiln_blob_new("C"), kiln_blob_new("H")};
  kiln_layer *l;
  kiln_blob *bad = blob_of("x", 3, SHAPE(1, 3, 15), NULL);
  kiln_blob *bb[3] = {c, bad, cont};
  assert_int_equal(kiln_layer_create(lp, TRAIN, bb, 3, tops, 2, 1, kiln_test_config(), &l),
                   KILN_ERR_SHAPE);
  assert_non_null(strstr(kiln_last_error(), "gate input must be 1 x N x 4D = 1 x 3 x 16"));
  kiln_blob *cont3 = blob_of("cont", 2, SHAPE(1, 2), NULL);
  kiln_blob *bc[3] = {c, x, cont3};
  assert_int_equal(kiln_layer_create(lp, TRAIN, bc, 3, tops, 2, 1, kiln_test_config(), &l),
                   KILN_ERR_SHAPE);
  assert_non_null(strstr(kiln_last_error(), "cont must be 1 x N = 1 x 3"));
  protobuf_c_message_free_unpacked(&lp->base, NULL);
  kiln_blob_free(tops[0]);
  kiln_blob_free(tops[1]);
  kiln_blob_free(bad);
  kiln_blob_free(cont3);
  kiln_blob_free(c);
  kiln_blob_free(x);
  kiln_blob_free(cont);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lstm_unit_hand),
      cmocka_unit_test(test_lstm_unit_gradients_and_shapes),
      cmocka_unit_test(test_embed_forward_backward_hand),
      cmocka_unit_test(test_embed_gradients),
      cmocka_unit_test(test_embed_weight_gradient_thread_independent),
      cmocka_unit_test(test_embed_errors),
      cmocka_unit_test(test_rnn_forward_hand),
      cmocka_unit_test(test_lstm_forward_hand),
      cmocka_unit_test(test_recurrent_param_blobs),
      cmocka_unit_test(test_rnn_gradients),
      cmocka_unit_test(test_lstm_gradients),
      cmocka_unit_test(test_recurrent_backward_contract),
      cmocka_unit_test(test_recurrent_empty_batches),
      cmocka_unit_test(test_recurrent_shape_changes),
      cmocka_unit_test(test_recurrent_errors),
      cmocka_unit_test(test_lrcn_net_forward_backward),
      cmocka_unit_test(test_embed_lstm_net),
      cmocka_unit_test(test_text_classifier_net),
      cmocka_unit_test(test_recurrent_caffemodel_loads),
      cmocka_unit_test(test_lstm_learns_running_parity),
      cmocka_unit_test(test_gru_learns_running_parity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
