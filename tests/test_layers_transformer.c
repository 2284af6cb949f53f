/* The transformer's layers on time-major T x N x D data: GELU, LayerNorm, PositionalEncoding and
 * MultiHeadAttention, and MatMul (attention's products written out). Forward passes against values worked out by hand and against the
 * definitions computed here in double precision with plain loops (for attention also against
 * values from scripts/mha-reference.py, which follows PyTorch's multi_head_attention_forward);
 * backward passes against finite differences; in-place runs against out-of-place ones; results
 * that do not depend on the thread count; the errors of bad parameters and shapes; and a
 * pre-norm transformer block built as a net from these layers (docs/sequence.md), checked
 * against finite differences of its loss and trained by the solver. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "kiln/solver.h"
#include "layer_test.h"

static double *doubles(int64_t n) {
  double *d = calloc((size_t)(n ? n : 1), sizeof *d);
  assert_non_null(d);
  return d;
}

/* ---- GELU -------------------------------------------------------------------------------- */

static const float gelu_x[5] = {-2, -0.5f, 0, 0.5f, 3};
static const float gelu_dy[5] = {1, 2, 3, 4, 5};

/* Runs `text` on gelu_x out of place and in place, with gelu_dy as the top gradient. */
static void gelu_case(const char *text, const float *want_y, const float *want_dx) {
  for (int in_place = 0; in_place < 2; in_place++) {
    kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), gelu_x);
    kiln_blob *y = in_place ? x : kiln_blob_new("y");
    built b = build_on(text, TRAIN, &x, 1, &y, 1);
    forward(&b);
    expect_close(text, y->data, want_y, 5, 1e-6);
    if (!in_place) expect_close("input kept", x->data, gelu_x, 5, 0);
    memcpy(y->diff, gelu_dy, sizeof gelu_dy);
    backward(&b);
    expect_close(text, x->diff, want_dx, 5, 1e-6);
    unbuild(&b);
    if (!in_place) kiln_blob_free(y);
    kiln_blob_free(x);
  }
}

/* Exact: y = x Phi(x), with Phi(-2) = 0.0227501319, Phi(-0.5) = 0.308537539, Phi(0.5) =
 * 0.691462461, Phi(3) = 0.998650102: y = -0.0455002639, -0.154268769, 0, 0.345731231,
 * 2.99595031. dy/dx = Phi(x) + x phi(x), phi(2) = 0.0539909665, phi(0.5) = 0.352065327, phi(3) =
 * 0.00443184841: -0.0852318011, 0.132504876, 0.5, 0.867495125, 1.01194565, times dy 1..5.
 * Tanh form: y = 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))), its derivative likewise
 * (python's math module, double). */
static void test_gelu_hand(void **state) {
  (void)state;
  const float y[5] = {-0.0455002639f, -0.154268769f, 0, 0.345731231f, 2.99595031f};
  const float dx[5] = {-0.0852318011f, 0.265009751f, 1.5f, 3.4699805f, 5.05972824f};
  gelu_case("name: 'g' type: 'GELU'", y, dx);
  gelu_case("name: 'g' type: 'GELU' gelu_param { approximate: NONE }", y, dx);
  const float ty[5] = {-0.0454023059f, -0.15428599f, 0, 0.34571401f, 2.99636261f};
  const float tdx[5] = {-0.0860992566f, 0.265260193f, 1.5f, 3.46947961f, 5.05792083f};
  gelu_case("name: 'g' type: 'GELU' gelu_param { approximate: TANH }", ty, tdx);
}

/* On random T x N x D input, both forms against the formulas in double. */
static void test_gelu_reference(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 41, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(4, 3, 7), -5, 5, &rng);
  double *want = doubles(x->count);
  for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
    const char *text = tanh_form ? "name: 'g' type: 'GELU' gelu_param { approximate: TANH }"
                                 : "name: 'g' type: 'GELU'";
    built g = build(text, TRAIN, &x, 1, 1);
    forward(&g);
    for (int64_t i = 0; i < x->count; i++) {
      double v = x->data[i];
      want[i] = tanh_form ? 0.5 * v * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)))
                          : 0.5 * v * (1 + erf(v / sqrt(2.0)));
    }
    expect_rel(text, g.top[0]->data, want, x->count, 2e-5);
    unbuild(&g);
  }
  free(want);
  kiln_blob_free(x);
}

static void test_gelu_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 42, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(3, 2, 5), -3, 3, &rng);
  check_grad("name: 'g' type: 'GELU'", &x, 1, 1, NULL);
  check_grad("name: 'g' type: 'GELU' gelu_param { approximate: TANH }", &x, 1, 1, NULL);
  expect_in_place_matches("name: 'g' type: 'GELU'", x, &rng);
  expect_in_place_matches("name: 'g' type: 'GELU' gelu_param { approximate: TANH }", x, &rng);
  kiln_blob_free(x);
}

/* ---- LayerNorm --------------------------------------------------------------------------- */

/* One sample [1, 2, 3, 4]: mean 2.5, biased variance 1.25, 1 / sqrt(1.25 + 1e-5) = 0.894423613,
 * x_hat = [-1.5, -0.5, 0.5, 1.5] x 0.894423613 = [-1.34163542, -0.447211807, 0.447211807,
 * 1.34163542]; with gain [1, 2, 0.5, -1] and bias [0, 0.1, -0.2, 0.3]: y = [-1.34163542,
 * -0.794423613, 0.0236059033, -1.04163542]. dy = [1, 0, 0, 0]: dh = dy gain = [1, 0, 0, 0],
 * mean(dh) = 0.25, mean(dh x_hat) = -0.335408855, dx = r (dh - 0.25 - x_hat (-0.335408855)) =
 * [0.268330304, -0.357768372, -0.0894434346, 0.178881503] (r = 0.894423613; about r [0.3, -0.4,
 * -0.1, 0.2]). */
static void test_layer_norm_hand(void **state) {
  (void)state;
  const float xv[4] = {1, 2, 3, 4}, gain[4] = {1, 2, 0.5f, -1}, bias[4] = {0, 0.1f, -0.2f, 0.3f};
  const double r = 1 / sqrt(1.25 + 1e-5), h[4] = {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r};
  const double c = h[0] / 4; /* mean(dh x_hat) with dh = [1, 0, 0, 0] */
  float want_y[4], want_dx[4];
  for (int k = 0; k < 4; k++) {
    want_y[k] = (float)(h[k] * gain[k] + bias[k]);
    want_dx[k] = (float)(r * ((k == 0) - 0.25 - h[k] * c));
  }
  const float hand_y[4] = {-1.34163542f, -0.794423613f, 0.0236059033f, -1.04163542f};
  const float hand_dx[4] = {0.268330304f, -0.357768372f, -0.0894434346f, 0.178881503f};
  expect_close("the working above, y", want_y, hand_y, 4, 1e-7);
  expect_close("the working above, dx", want_dx, hand_dx, 4, 1e-7);
  for (int in_place = 0; in_place < 2; in_place++) {
    kiln_blob *x = blob_of("x", 3, SHAPE(1, 1, 4), xv);
    kiln_blob *y = in_place ? x : kiln_blob_new("y");
    built b = build_on("name: 'ln' type: 'LayerNorm'", TRAIN, &x, 1, &y, 1);
    assert_int_equal(b.l->nparam, 2);
    expect_shape(b.l->param[0], 1, SHAPE(4));
    const float ones[4] = {1, 1, 1, 1}, zeros[4] = {0};
    expect_close("gain filled with 1", b.l->param[0]->data, ones, 4, 0);
    expect_close("bias filled with 0", b.l->param[1]->data, zeros, 4, 0);
    set_params(&b, 0, gain);
    set_params(&b, 1, bias);
    forward(&b);
    expect_close("layer norm y", y->data, want_y, 4, 1e-6);
    const float dy[4] = {1, 0, 0, 0};
    memcpy(y->diff, dy, sizeof dy);
    fill(b.l->param[0]->diff, 4, 0);
    fill(b.l->param[1]->diff, 4, 0);
    backward(&b);
    expect_close("layer norm dx", x->diff, want_dx, 4, 1e-6);
    /* dgain = dy x_hat, dbias = dy */
    const float dg[4] = {(float)h[0], 0, 0, 0};
    expect_close("layer norm dgain", b.l->param[0]->diff, dg, 4, 1e-6);
    expect_close("layer norm dbias", b.l->param[1]->diff, dy, 4, 0);
    unbuild(&b);
    if (!in_place) kiln_blob_free(y);
    kiln_blob_free(x);
  }
}

/* y from the definition in double: samples are the first `axis` axes, each normalized over the
 * rest. */
static void layer_norm_ref(double *y, const float *x, int64_t M, int64_t K, double eps,
                           const float *gain, const float *bias) {
  for (int64_t m = 0; m < M; m++) {
    double mean = 0, var = 0;
    for (int64_t k = 0; k < K; k++) mean += x[m * K + k];
    mean /= (double)K;
    for (int64_t k = 0; k < K; k++) var += (x[m * K + k] - mean) * (x[m * K + k] - mean);
    var /= (double)K;
    for (int64_t k = 0; k < K; k++) {
      double h = (x[m * K + k] - mean) / sqrt(var + eps);
      y[m * K + k] = h * (gain ? gain[k] : 1) + (bias ? bias[k] : 0);
    }
  }
}

static void test_layer_norm_reference(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 43, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(3, 2, 6), -2, 3, &rng);
  double *want = doubles(x->count);
  static const struct {
    const char *text;
    int64_t M, K;
    double eps;
    int nparam;
  } cases[] = {
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { weight_filler { type: 'gaussian' } "
       "bias_filler { type: 'gaussian' } }",
       6, 6, 1e-5, 2},
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { axis: 1 eps: 0.5 "
       "weight_filler { type: 'gaussian' } bias_filler { type: 'gaussian' } }",
       3, 12, 0.5, 2},
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { axis: -2 bias_term: false "
       "weight_filler { type: 'gaussian' } }",
       3, 12, 1e-5, 1},
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { elementwise_affine: false }", 6, 6, 1e-5,
       0},
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { axis: 0 }", 1, 36, 1e-5, 2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    built b = build(cases[c].text, TEST, &x, 1, 1);
    assert_int_equal(b.l->nparam, cases[c].nparam);
    if (b.l->nparam) assert_int_equal(b.l->param[0]->count, cases[c].K);
    forward(&b);
    layer_norm_ref(want, x->data, cases[c].M, cases[c].K, cases[c].eps,
                   b.l->nparam > 0 ? b.l->param[0]->data : NULL,
                   b.l->nparam > 1 ? b.l->param[1]->data : NULL);
    expect_rel(cases[c].text, b.top[0]->data, want, x->count, 1e-5);
    unbuild(&b);
  }
  free(want);
  kiln_blob_free(x);
}

static void test_layer_norm_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 44, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(3, 2, 5), -2, 2, &rng);
  check_grad("name: 'ln' type: 'LayerNorm' layer_norm_param { weight_filler { type: 'gaussian' } "
             "bias_filler { type: 'gaussian' } }",
             &x, 1, 1, NULL);
  check_grad("name: 'ln' type: 'LayerNorm' layer_norm_param { axis: 1 "
             "weight_filler { type: 'uniform' min: 0.5 max: 1.5 } }",
             &x, 1, 1, NULL);
  check_grad("name: 'ln' type: 'LayerNorm' layer_norm_param { elementwise_affine: false }", &x,
             1, 1, NULL);
  check_grad("name: 'ln' type: 'LayerNorm' layer_norm_param { bias_term: false eps: 0.1 }", &x,
             1, 1, NULL);
  expect_in_place_matches("name: 'ln' type: 'LayerNorm' layer_norm_param { weight_filler { "
                          "type: 'gaussian' } bias_filler { type: 'gaussian' } }",
                          x, &rng);
  expect_in_place_matches("name: 'ln' type: 'LayerNorm' layer_norm_param { axis: 1 "
                          "elementwise_affine: false }",
                          x, &rng);
  kiln_blob_free(x);
}

static void test_layer_norm_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 2, 4), NULL);
  const char *who = "layer 'ln' (LayerNorm)";
  expect_create_fails("name: 'ln' type: 'LayerNorm' layer_norm_param { axis: 3 }", TRAIN, &x, 1,
                      1, KILN_ERR_INVALID, who, "axis 3");
  expect_create_fails("name: 'ln' type: 'LayerNorm' layer_norm_param { axis: -4 }", TRAIN, &x, 1,
                      1, KILN_ERR_INVALID, who, "axis -4");
  expect_create_fails("name: 'ln' type: 'LayerNorm' layer_norm_param { eps: -1 }", TRAIN, &x, 1,
                      1, KILN_ERR_INVALID, who, "eps");
  /* The normalized axes may not change shape once the gain is made. */
  built b = build("name: 'ln' type: 'LayerNorm'", TRAIN, &x, 1, 1);
  assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(5, 2, 4)), KILN_OK);
  assert_int_equal(b.l->ops->reshape(b.l), KILN_OK); /* more steps: fine */
  expect_shape(b.top[0], 3, SHAPE(5, 2, 4));
  assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(5, 2, 3)), KILN_OK);
  assert_int_equal(b.l->ops->reshape(b.l), KILN_ERR_SHAPE);
  expect_message(who, "normalized axes", NULL);
  unbuild(&b);
  kiln_blob_free(x);
}

/* ---- PositionalEncoding ------------------------------------------------------------------ */

/* D = 4: pe[t] = [sin t, cos t, sin(t / 100), cos(t / 100)] (10000^(2/4) = 100): t = 0: [0, 1,
 * 0, 1]; t = 1: [0.841470985, 0.540302306, 0.00999983333, 0.99995]; t = 2: [0.909297427,
 * -0.416146837, 0.0199986667, 0.999800007]. Every sequence n gets the same rows.
 * D = 5 has the frequencies 1, 10000^(-2/5) and 10000^(-4/5) and ends on a sine:
 * [sin t, cos t, sin(t / 39.8107171), cos(t / 39.8107171), sin(t / 1584.89319)]. */
static void test_positional_encoding_sinusoidal_hand(void **state) {
  (void)state;
  const float pe4[3][4] = {{0, 1, 0, 1},
                           {0.841470985f, 0.540302306f, 0.00999983333f, 0.99995f},
                           {0.909297427f, -0.416146837f, 0.0199986667f, 0.999800007f}};
  for (int in_place = 0; in_place < 2; in_place++) {
    kiln_blob *x = iota_blob("x", 3, SHAPE(3, 2, 4), -5); /* x[t, n, j] = (t 2 + n) 4 + j - 5 */
    kiln_blob *y = in_place ? x : kiln_blob_new("y");
    built b = build_on("name: 'pe' type: 'PositionalEncoding'", TRAIN, &x, 1, &y, 1);
    assert_int_equal(b.l->nparam, 0);
    forward(&b);
    float want[24];
    for (int t = 0; t < 3; t++)
      for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++) want[(t * 2 + n) * 4 + j] = (t * 2 + n) * 4 + j - 5 + pe4[t][j];
    expect_close("sinusoidal y", y->data, want, 24, 1e-6);
    for (int i = 0; i < 24; i++) y->diff[i] = (float)i;
    backward(&b);
    float id[24];
    for (int i = 0; i < 24; i++) id[i] = (float)i;
    expect_close("sinusoidal dx = dy", x->diff, id, 24, 0);
    unbuild(&b);
    if (!in_place) kiln_blob_free(y);
    kiln_blob_free(x);
  }
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 1, 5), NULL);
  built b = build("name: 'pe' type: 'PositionalEncoding' positional_encoding_param { "
                  "mode: SINUSOIDAL max_len: 3 }",
                  TRAIN, &x, 1, 1);
  forward(&b);
  for (int t = 0; t < 3; t++) {
    const double f1 = pow(10000.0, 0.4), f2 = pow(10000.0, 0.8);
    const float want[5] = {(float)sin(t), (float)cos(t), (float)sin(t / f1), (float)cos(t / f1),
                           (float)sin(t / f2)};
    expect_close("sinusoidal, odd D", b.top[0]->data + t * 5, want, 5, 1e-6);
  }
  unbuild(&b);
  kiln_blob_free(x);
}

/* LEARNED: y[t, n, :] = x[t, n, :] + P[t, :]; dP[t, :] += sum over n of dy[t, n, :]. */
static void test_positional_encoding_learned_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 3, SHAPE(2, 3, 2), 0);
  built b = build("name: 'pe' type: 'PositionalEncoding' positional_encoding_param { "
                  "mode: LEARNED max_len: 4 }",
                  TRAIN, &x, 1, 1);
  assert_int_equal(b.l->nparam, 1);
  expect_shape(b.l->param[0], 2, SHAPE(4, 2));
  /* default filler: gaussian, std 0.02 */
  double sq = 0;
  for (int i = 0; i < 8; i++) sq += (double)b.l->param[0]->data[i] * b.l->param[0]->data[i];
  assert_true(sq > 0 && sqrt(sq / 8) < 0.1);
  const float P[8] = {10, 20, 30, 40, 50, 60, 70, 80};
  set_params(&b, 0, P);
  forward(&b);
  const float want[12] = {10, 21, 12, 23, 14, 25, 36, 47, 38, 49, 40, 51};
  expect_close("learned y", b.top[0]->data, want, 12, 0);
  for (int i = 0; i < 12; i++) b.top[0]->diff[i] = (float)(i + 1);
  fill(b.l->param[0]->diff, 8, 1);
  backward(&b);
  /* t = 0: rows 1 2, 3 4, 5 6 -> 9, 12; t = 1: 7 8, 9 10, 11 12 -> 27, 30; rows 2, 3 unused */
  const float dP[8] = {10, 13, 28, 31, 1, 1, 1, 1};
  expect_close("learned dP accumulated", b.l->param[0]->diff, dP, 8, 0);
  expect_close("learned dx", x->diff, b.top[0]->diff, 12, 0);
  unbuild(&b);
  kiln_blob_free(x);
}

static void test_positional_encoding_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 45, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(3, 2, 4), -1, 1, &rng);
  const char *learned = "name: 'pe' type: 'PositionalEncoding' positional_encoding_param { "
                        "mode: LEARNED max_len: 5 filler { type: 'gaussian' std: 0.5 } }";
  check_grad(learned, &x, 1, 1, NULL);
  check_grad("name: 'pe' type: 'PositionalEncoding'", &x, 1, 1, NULL);
  expect_in_place_matches(learned, x, &rng);
  expect_in_place_matches("name: 'pe' type: 'PositionalEncoding'", x, &rng);
  kiln_blob_free(x);
}

/* More steps than max_len are refused when built and when a later batch grows past it; fewer
 * steps take the leading rows of the table. */
static void test_positional_encoding_max_len(void **state) {
  (void)state;
  const char *who = "layer 'pe' (PositionalEncoding)";
  kiln_blob *x = blob_of("x", 3, SHAPE(6, 2, 4), NULL);
  expect_create_fails("name: 'pe' type: 'PositionalEncoding' positional_encoding_param { "
                      "max_len: 5 }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, who, "6 time steps, more than "
                      "positional_encoding_param.max_len 5");
  expect_create_fails("name: 'pe' type: 'PositionalEncoding' positional_encoding_param { "
                      "mode: LEARNED max_len: 5 }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, who, "max_len 5");
  expect_create_fails("name: 'pe' type: 'PositionalEncoding' positional_encoding_param { "
                      "max_len: 0 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, who, "max_len");
  kiln_blob *flat = blob_of("flat", 2, SHAPE(6, 8), NULL);
  expect_create_fails("name: 'pe' type: 'PositionalEncoding'", TRAIN, &flat, 1, 1,
                      KILN_ERR_SHAPE, who, "T x N x D");
  kiln_blob_free(flat);
  for (int learned = 0; learned < 2; learned++) {
    assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(5, 2, 4)), KILN_OK);
    fill(x->data, x->count, 0);
    built b = build(learned ? "name: 'pe' type: 'PositionalEncoding' positional_encoding_param "
                              "{ mode: LEARNED max_len: 5 }"
                            : "name: 'pe' type: 'PositionalEncoding' positional_encoding_param "
                              "{ max_len: 5 }",
                    TRAIN, &x, 1, 1);
    forward(&b);
    float *full = malloc(sizeof(float) * 40);
    assert_non_null(full);
    memcpy(full, b.top[0]->data, sizeof(float) * 40);
    assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(2, 2, 4)), KILN_OK);
    assert_int_equal(b.l->ops->reshape(b.l), KILN_OK);
    forward(&b);
    expect_close("fewer steps", b.top[0]->data, full, 16, 0);
    assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(5, 2, 4)), KILN_OK);
    assert_int_equal(b.l->ops->reshape(b.l), KILN_OK);
    forward(&b);
    expect_close("steps again", b.top[0]->data, full, 40, 0);
    assert_int_equal(kiln_blob_reshape(x, 3, SHAPE(7, 2, 4)), KILN_OK);
    assert_int_equal(b.l->ops->reshape(b.l), KILN_ERR_SHAPE);
    expect_message(who, "7 time steps", "max_len 5");
    free(full);
    unbuild(&b);
  }
  kiln_blob_free(x);
}

/* ---- MultiHeadAttention ------------------------------------------------------------------ */

/* Multi-head attention from its definition, in double, with plain loops: x (T, N, D), kv (S, N,
 * D), mask (S, N) or NULL, in_proj w_in (3D, D) and b_in (3D) (NULL: none), out_proj w_out
 * (D, D) and b_out (D). A query whose keys are all masked gets zero weights. */
static void mha_ref(double *y, const float *x, const float *kv, const float *mask, int T, int S,
                    int N, int D, int H, const float *w_in, const float *b_in, const float *w_out,
                    const float *b_out, bool causal) {
  const int hd = D / H;
  double *q = doubles((int64_t)T * N * D), *k = doubles((int64_t)S * N * D);
  double *v = doubles((int64_t)S * N * D), *ctx = doubles((int64_t)T * N * D);
  double *a = doubles(S);
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++)
      for (int i = 0; i < D; i++) {
        double acc = b_in ? b_in[i] : 0;
        for (int j = 0; j < D; j++) acc += (double)w_in[i * D + j] * x[(t * N + n) * D + j];
        q[(t * N + n) * D + i] = acc;
      }
  for (int s = 0; s < S; s++)
    for (int n = 0; n < N; n++)
      for (int i = 0; i < D; i++) {
        double ak = b_in ? b_in[D + i] : 0, av = b_in ? b_in[2 * D + i] : 0;
        for (int j = 0; j < D; j++) {
          ak += (double)w_in[(D + i) * D + j] * kv[(s * N + n) * D + j];
          av += (double)w_in[(2 * D + i) * D + j] * kv[(s * N + n) * D + j];
        }
        k[(s * N + n) * D + i] = ak;
        v[(s * N + n) * D + i] = av;
      }
  for (int n = 0; n < N; n++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s < S; s++) {
          bool on = (!causal || s <= t) && (!mask || mask[s * N + n] != 0);
          double dot = 0;
          for (int j = 0; j < hd; j++)
            dot += q[(t * N + n) * D + h * hd + j] * k[(s * N + n) * D + h * hd + j];
          a[s] = on ? dot / sqrt((double)hd) : -INFINITY;
          if (a[s] > mx) mx = a[s];
        }
        for (int s = 0; s < S; s++) sum += a[s] = mx == -INFINITY ? 0 : exp(a[s] - mx);
        for (int j = 0; j < hd; j++) {
          double c = 0;
          for (int s = 0; s < S; s++) c += (sum > 0 ? a[s] / sum : 0) * v[(s * N + n) * D + h * hd + j];
          ctx[(t * N + n) * D + h * hd + j] = c;
        }
      }
  for (int r = 0; r < T * N; r++)
    for (int i = 0; i < D; i++) {
      double acc = b_out ? b_out[i] : 0;
      for (int j = 0; j < D; j++) acc += (double)w_out[i * D + j] * ctx[r * D + j];
      y[r * D + i] = acc;
    }
  free(q);
  free(k);
  free(v);
  free(ctx);
  free(a);
}

/* The tiny case: D = 4, 2 heads, T = 3, N = 1, with these weights (PyTorch's in_proj_weight,
 * in_proj_bias, out_proj.weight, out_proj.bias). */
static const float tiny_x[12] = {0.5f, -1.0f, 0.25f, 0.8f, -0.3f, 0.7f,
                                 1.2f, -0.6f, 1.1f,  0.2f, -0.9f, 0.4f};
static const float tiny_w_in[48] = {
    0.2f,  -0.1f, 0.4f,  0.0f,  -0.3f, 0.5f,  0.1f,  0.2f,  0.1f,  0.1f, -0.2f, 0.6f,
    0.0f,  -0.4f, 0.3f,  0.1f,  0.5f,  0.2f,  -0.1f, -0.3f, -0.2f, 0.3f, 0.2f,  0.4f,
    0.3f,  -0.5f, 0.0f,  0.2f,  0.1f,  0.4f,  -0.3f, -0.1f, -0.4f, 0.1f, 0.5f,  0.2f,
    0.2f,  0.2f,  0.1f,  -0.5f, 0.6f,  -0.1f, -0.2f, 0.1f,  -0.1f, 0.3f, 0.4f,  0.3f};
static const float tiny_b_in[12] = {0.01f, -0.02f, 0.03f, 0.0f,  0.05f, -0.01f,
                                    0.02f, 0.04f,  -0.03f, 0.01f, 0.0f,  0.02f};
static const float tiny_w_out[16] = {0.3f,  -0.2f, 0.1f, 0.4f, 0.1f, 0.5f, -0.3f, 0.2f,
                                     -0.4f, 0.1f,  0.2f, 0.3f, 0.2f, 0.3f, 0.4f,  -0.1f};
static const float tiny_b_out[4] = {0.1f, -0.1f, 0.05f, 0.0f};

/* The tiny case with and without the causal and padding masks (mask [1, 1, 0]: the last step is
 * padding), against mha_ref and against the values scripts/mha-reference.py prints, working as
 * PyTorch's multi_head_attention_forward does (q, k, v viewed as (T, N H, hd) batches,
 * key_padding_mask True on padding, the causal mask -inf above the diagonal). Causal query 0
 * sees key 0 alone, so its output is v_0's projection: [0.2265, -0.464, 0.1105, 0.0225]. Every
 * key padding leaves b_o. */
static void test_mha_tiny_cases(void **state) {
  (void)state;
  static const float torch_plain[12] = {0.108442949f, -0.210555707f, 0.188521158f, 0.106050355f,
                                        0.148816456f, -0.102199156f, 0.159725186f, 0.0356532545f,
                                        0.131514166f, -0.19850318f,  0.164207733f, 0.108474386f};
  static const float torch_causal[12] = {0.2265f,        -0.464f,      0.1105f,
                                         0.0225f,        0.308668289f, 0.0890715273f,
                                         -0.00408444771f, -0.0262952539f, 0.131514166f,
                                         -0.19850318f,   0.164207733f, 0.108474386f};
  static const float torch_padding[12] = {0.285990961f,  -0.0122185614f, 0.0104138453f,
                                          0.0332748318f, 0.308668289f,   0.0890715273f,
                                          -0.00408444771f, -0.0262952539f, 0.273057837f,
                                          -0.0600534813f, 0.0153700492f, 0.076165383f};
  static const float torch_causal_padding[12] = {
      0.2265f,      -0.464f,         0.1105f,        0.0225f,
      0.308668289f, 0.0890715273f,   -0.00408444771f, -0.0262952539f,
      0.273057837f, -0.0600534813f,  0.0153700492f,  0.076165383f};
  const float pad[3] = {1, 1, 0}, none[3] = {0, 0, 0};
  const float only_bias[12] = {0.1f, -0.1f, 0.05f, 0, 0.1f, -0.1f, 0.05f, 0, 0.1f, -0.1f, 0.05f, 0};
  const struct {
    bool causal;
    const float *mask, *want;
  } cases[] = {{false, NULL, torch_plain},  {true, NULL, torch_causal},
               {false, pad, torch_padding}, {true, pad, torch_causal_padding},
               {false, none, only_bias},    {true, none, only_bias}};
  double ref[12];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    kiln_blob *x = blob_of("x", 3, SHAPE(3, 1, 4), tiny_x);
    kiln_blob *m = blob_of("mask", 2, SHAPE(3, 1), cases[c].mask);
    kiln_blob *b[2] = {x, m};
    char text[200];
    snprintf(text, sizeof text,
             "name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 2 "
             "causal: %s }",
             cases[c].causal ? "true" : "false");
    built l = build(text, TRAIN, b, cases[c].mask ? 2 : 1, 1);
    assert_int_equal(l.l->nparam, 4);
    expect_shape(l.l->param[0], 2, SHAPE(12, 4));
    expect_shape(l.l->param[1], 1, SHAPE(12));
    expect_shape(l.l->param[2], 2, SHAPE(4, 4));
    expect_shape(l.l->param[3], 1, SHAPE(4));
    set_params(&l, 0, tiny_w_in);
    set_params(&l, 1, tiny_b_in);
    set_params(&l, 2, tiny_w_out);
    set_params(&l, 3, tiny_b_out);
    forward(&l);
    expect_shape(l.top[0], 3, SHAPE(3, 1, 4));
    mha_ref(ref, tiny_x, tiny_x, cases[c].mask, 3, 3, 1, 4, 2, tiny_w_in, tiny_b_in, tiny_w_out,
            tiny_b_out, cases[c].causal);
    expect_rel(text, l.top[0]->data, ref, 12, 1e-5);
    expect_close(text, l.top[0]->data, cases[c].want, 12, 1e-6);
    unbuild(&l);
    kiln_blob_free(m);
    kiln_blob_free(x);
  }
}

/* Random shapes against mha_ref: self-attention, cross-attention (S != T), masks with whole
 * sequences of padding, causal, one head and several, without biases. */
static void test_mha_reference(void **state) {
  (void)state;
  static const struct {
    const char *param;
    int T, S, N, D, H;
    bool kv, mask, causal, bias;
  } cases[] = {
      {"num_heads: 3", 4, 4, 3, 6, 3, false, false, false, true},
      {"num_heads: 1", 4, 4, 3, 6, 1, false, true, false, true},
      {"num_heads: 2 causal: true", 5, 5, 2, 8, 2, false, true, true, true},
      {"num_heads: 3", 4, 6, 3, 6, 3, true, false, false, true},
      {"num_heads: 6 bias_term: false", 3, 5, 2, 6, 6, true, true, false, false},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 46, 1);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int T = cases[c].T, S = cases[c].S, N = cases[c].N, D = cases[c].D;
    kiln_blob *x = gc_blob("x", 3, SHAPE(T, N, D), -1, 1, &rng);
    kiln_blob *kv = gc_blob("kv", 3, SHAPE(S, N, D), -1, 1, &rng);
    kiln_blob *m = blob_of("mask", 2, SHAPE(S, N), NULL);
    /* sequence n has S - n valid steps (the last sequence of a batch of 3 keeps S - 2);
     * sequence 1 of the causal case is all padding */
    for (int s = 0; s < S; s++)
      for (int n = 0; n < N; n++)
        m->data[s * N + n] = (cases[c].causal && n == 1) ? 0.0f : (float)(s < S - n);
    kiln_blob *b[3] = {x, cases[c].kv ? kv : m, m};
    int nb = 1 + cases[c].kv + cases[c].mask;
    char text[300];
    snprintf(text, sizeof text,
             "name: 'att' type: 'MultiHeadAttention' multihead_attention_param { %s "
             "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' std: "
             "0.3 } }",
             cases[c].param);
    built l = build(text, TRAIN, b, nb, 1);
    assert_int_equal(l.l->nparam, cases[c].bias ? 4 : 2);
    forward(&l);
    double *ref = doubles((int64_t)T * N * D);
    const float *w_in = l.l->param[0]->data;
    const float *b_in = cases[c].bias ? l.l->param[1]->data : NULL;
    const float *w_out = l.l->param[cases[c].bias ? 2 : 1]->data;
    const float *b_out = cases[c].bias ? l.l->param[3]->data : NULL;
    mha_ref(ref, x->data, cases[c].kv ? kv->data : x->data, cases[c].mask ? m->data : NULL, T,
            cases[c].kv ? S : T, N, D, cases[c].H, w_in, b_in, w_out, b_out, cases[c].causal);
    /* Each output is a sum of products of order-1 terms (weights of std 0.5 over D inputs), so
     * fp32's rounding is relative to those terms, not to an output that cancels to near zero:
     * the bound is 2e-5 of the largest output wherever an output is smaller than that (an
     * output of 0.0047 came out 1.0e-7 off on oneDNN's AVX-512 kernels of an Intel host). */
    double top_abs = 0;
    for (int64_t i = 0; i < (int64_t)T * N * D; i++) top_abs = fmax(top_abs, fabs(ref[i]));
    for (int64_t i = 0; i < (int64_t)T * N * D; i++)
      if (!(fabs((double)l.top[0]->data[i] - ref[i]) <= 2e-5 * fmax(top_abs, fabs(ref[i])))) {
        print_error("%s[%lld]: got %.9g, want %.12g (largest output %.6g)\n", text,
                    (long long)i, (double)l.top[0]->data[i], ref[i], top_abs);
        fail();
      }
    free(ref);
    unbuild(&l);
    kiln_blob_free(m);
    kiln_blob_free(kv);
    kiln_blob_free(x);
  }
}

static void test_mha_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 47, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(3, 2, 4), -1, 1, &rng);
  kiln_blob *kv = gc_blob("kv", 3, SHAPE(4, 2, 4), -1, 1, &rng);
  /* sequence 0: all 3 steps valid; sequence 1: the first 2 */
  const float mask3[6] = {1, 1, 1, 1, 1, 0}, mask4[8] = {1, 1, 1, 1, 1, 0, 0, 0};
  kiln_blob *m3 = blob_of("m3", 2, SHAPE(3, 2), mask3), *m4 = blob_of("m4", 2, SHAPE(4, 2), mask4);
  const char *fillers = "weight_filler { type: 'gaussian' std: 0.5 } "
                     "bias_filler { type: 'gaussian' std: 0.3 }";
  char text[300];
  snprintf(text, sizeof text,
           "name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 2 %s }",
           fillers);
  check_grad(text, &x, 1, 1, NULL);
  gradcheck_opts xonly = {.bottom_mask = 1}, xkv = {.bottom_mask = 3};
  kiln_blob *self_mask[2] = {x, m3};
  check_grad(text, self_mask, 2, 1, &xonly);
  kiln_blob *cross[2] = {x, kv};
  check_grad(text, cross, 2, 1, NULL);
  kiln_blob *cross_mask[3] = {x, kv, m4};
  check_grad(text, cross_mask, 3, 1, &xkv);
  snprintf(text, sizeof text,
           "name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 2 "
           "causal: true %s }",
           fillers);
  check_grad(text, &x, 1, 1, NULL);
  check_grad(text, self_mask, 2, 1, &xonly);
  snprintf(text, sizeof text,
           "name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 4 "
           "bias_term: false %s }",
           fillers);
  check_grad(text, cross, 2, 1, NULL);
  /* A sequence of nothing but padding: its output is b_o, and no gradient flows into x there. */
  const float m_empty[6] = {1, 0, 1, 0, 0, 0};
  kiln_blob *me = blob_of("me", 2, SHAPE(3, 2), m_empty);
  kiln_blob *empty[2] = {x, me};
  check_grad("name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 1 "
             "weight_filler { type: 'gaussian' std: 0.5 } }",
             empty, 2, 1, &xonly);
  kiln_blob_free(me);
  kiln_blob_free(m4);
  kiln_blob_free(m3);
  kiln_blob_free(kv);
  kiln_blob_free(x);
}

/* The same bits for 1, 2 and 3 threads (forward, input and parameter gradients), on shapes
 * large enough for several row blocks and (sequence, head) items per thread. */
static void test_mha_thread_count_independent(void **state) {
  (void)state;
  const int saved = kiln_get_num_threads();
  kiln_rng rng;
  kiln_rng_seed(&rng, 48, 1);
  kiln_blob *x0 = gc_blob("x", 3, SHAPE(12, 11, 16), -1, 1, &rng);
  kiln_blob *kv0 = gc_blob("kv", 3, SHAPE(9, 11, 16), -1, 1, &rng);
  kiln_blob *dy = gc_blob("dy", 3, SHAPE(12, 11, 16), -1, 1, &rng);
  kiln_blob *m = blob_of("m", 2, SHAPE(9, 11), NULL);
  for (int64_t i = 0; i < m->count; i++) m->data[i] = (float)((i * 7) % 5 != 0);
  const char *text = "name: 'att' type: 'MultiHeadAttention' multihead_attention_param { "
                     "num_heads: 4 weight_filler { type: 'gaussian' std: 0.3 } "
                     "bias_filler { type: 'gaussian' std: 0.3 } }";
  float *first[7] = {0};
  for (int threads = 1; threads <= 3; threads++) {
    kiln_set_num_threads(threads);
    kiln_blob *x = blob_copy("x", x0), *kv = blob_copy("kv", kv0);
    kiln_blob *b[3] = {x, kv, m};
    built l = build(text, TRAIN, b, 3, 1);
    assert_int_equal(l.l->nthreads, threads);
    forward(&l);
    memcpy(l.top[0]->diff, dy->data, sizeof(float) * (size_t)dy->count);
    for (int p = 0; p < 4; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
    l.l->propagate_down[2] = false;
    backward(&l);
    const float *got[7] = {l.top[0]->data, x->diff, kv->diff, l.l->param[0]->diff,
                           l.l->param[1]->diff, l.l->param[2]->diff, l.l->param[3]->diff};
    const int64_t n[7] = {dy->count,          x->count,           kv->count,
                          l.l->param[0]->count, l.l->param[1]->count, l.l->param[2]->count,
                          l.l->param[3]->count};
    for (int k = 0; k < 7; k++) {
      if (threads == 1) {
        first[k] = malloc(sizeof(float) * (size_t)n[k]);
        assert_non_null(first[k]);
        memcpy(first[k], got[k], sizeof(float) * (size_t)n[k]);
      } else {
        char what[64];
        snprintf(what, sizeof what, "%d threads, result %d", threads, k);
        expect_close(what, got[k], first[k], n[k], 0);
      }
    }
    unbuild(&l);
    kiln_blob_free(kv);
    kiln_blob_free(x);
  }
  kiln_set_num_threads(saved);
  for (int k = 0; k < 7; k++) free(first[k]);
  kiln_blob_free(m);
  kiln_blob_free(dy);
  kiln_blob_free(kv0);
  kiln_blob_free(x0);
}

static void test_mha_bad_parameters(void **state) {
  (void)state;
  const char *who = "layer 'att' (MultiHeadAttention)";
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 2, 6), NULL);
  expect_create_fails("name: 'att' type: 'MultiHeadAttention' multihead_attention_param { "
                      "num_heads: 4 }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, who, "not a multiple of num_heads 4");
  expect_create_fails("name: 'att' type: 'MultiHeadAttention' multihead_attention_param { "
                      "num_heads: 0 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, who, "num_heads");
  expect_fails_ex("name: 'att' type: 'MultiHeadAttention'", TRAIN, &x, 1, 1, true,
                  KILN_ERR_UNSUPPORTED, who, "in place", NULL);
  kiln_blob *flat = blob_of("flat", 2, SHAPE(6, 6), NULL);
  expect_create_fails("name: 'att' type: 'MultiHeadAttention'", TRAIN, &flat, 1, 1,
                      KILN_ERR_SHAPE, who, "T x N x D");
  kiln_blob *four = blob_of("four", 4, SHAPE(3, 2, 6, 1), NULL);
  kiln_blob *b4[2] = {x, four};
  expect_create_fails("name: 'att' type: 'MultiHeadAttention'", TRAIN, b4, 2, 1, KILN_ERR_SHAPE,
                      who, "padding mask S x N");
  kiln_blob *badmask = blob_of("badmask", 2, SHAPE(3, 3), NULL);
  kiln_blob *bm[2] = {x, badmask};
  expect_create_fails("name: 'att' type: 'MultiHeadAttention'", TRAIN, bm, 2, 1, KILN_ERR_SHAPE,
                      who, "S x N = 3 x 2");
  kiln_blob *kv = blob_of("kv", 3, SHAPE(4, 2, 5), NULL);
  kiln_blob *bkv[2] = {x, kv};
  expect_create_fails("name: 'att' type: 'MultiHeadAttention'", TRAIN, bkv, 2, 1, KILN_ERR_SHAPE,
                      who, "key/value input must be S x 2 x 6");
  assert_int_equal(kiln_blob_reshape(kv, 3, SHAPE(4, 2, 6)), KILN_OK);
  expect_create_fails("name: 'att' type: 'MultiHeadAttention' multihead_attention_param { "
                      "causal: true }",
                      TRAIN, bkv, 2, 1, KILN_ERR_SHAPE, who, "as many key steps");
  kiln_blob *b3[3] = {x, badmask, kv};
  expect_create_fails("name: 'att' type: 'MultiHeadAttention'", TRAIN, b3, 3, 1, KILN_ERR_SHAPE,
                      who, "with three bottoms");
  /* A mask must hold 0 and 1 only (a blob of token ids wired by mistake fails its forward). */
  kiln_blob *ids = blob_of("ids", 2, SHAPE(3, 2), (const float[]){1, 1, 7, 1, 0, 0});
  kiln_blob *bi[2] = {x, ids};
  built l = build("name: 'att' type: 'MultiHeadAttention'", TRAIN, bi, 2, 1);
  assert_int_equal(layer_forward(l.l), KILN_ERR_DATA);
  expect_message(who, "holds 7 at step 1 of sequence 0", NULL);
  unbuild(&l);
  kiln_blob_free(ids);
  kiln_blob_free(kv);
  kiln_blob_free(badmask);
  kiln_blob_free(four);
  kiln_blob_free(flat);
  kiln_blob_free(x);
}

/* ---- a pre-norm transformer block as a net ---------------------------------------------- */

/* docs/sequence.md's block between a positional encoding and a per-step classifier: x (T x N x
 * D = 3 x 2 x 4), a padding mask for the attention and labels with ignore_label on the padding.
 * %s: the Input layer's extra text; %g: the dropout ratio. */
static const char *block_net_fmt =
    "name: 'block'\n"
    "%s"
    "layer { name: 'in' type: 'Input' top: 'x' top: 'mask' top: 'label'\n"
    "        input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 }\n"
    "                      shape { dim: 3 dim: 2 } } }\n"
    "layer { name: 'pos' type: 'PositionalEncoding' bottom: 'x' top: 'h0' }\n"
    "layer { name: 'ln1' type: 'LayerNorm' bottom: 'h0' top: 'ln1' }\n"
    "layer { name: 'attn' type: 'MultiHeadAttention' bottom: 'ln1' bottom: 'mask' top: 'attn'\n"
    "        multihead_attention_param { num_heads: 2 causal: true } }\n"
    "layer { name: 'attn_drop' type: 'Dropout' bottom: 'attn' top: 'attn'\n"
    "        dropout_param { dropout_ratio: %g } }\n"
    "layer { name: 'res1' type: 'Eltwise' bottom: 'h0' bottom: 'attn' top: 'h1'\n"
    "        eltwise_param { operation: SUM } }\n"
    "layer { name: 'ln2' type: 'LayerNorm' bottom: 'h1' top: 'ln2' }\n"
    "layer { name: 'ff1' type: 'InnerProduct' bottom: 'ln2' top: 'ff1'\n"
    "        inner_product_param { num_output: 16 axis: 2 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'gelu' type: 'GELU' bottom: 'ff1' top: 'ff1' }\n"
    "layer { name: 'ff2' type: 'InnerProduct' bottom: 'ff1' top: 'ff2'\n"
    "        inner_product_param { num_output: 4 axis: 2 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'ff_drop' type: 'Dropout' bottom: 'ff2' top: 'ff2'\n"
    "        dropout_param { dropout_ratio: %g } }\n"
    "layer { name: 'res2' type: 'Eltwise' bottom: 'h1' bottom: 'ff2' top: 'h2'\n"
    "        eltwise_param { operation: SUM } }\n"
    "layer { name: 'ln_f' type: 'LayerNorm' bottom: 'h2' top: 'ln_f' }\n"
    "layer { name: 'cls' type: 'InnerProduct' bottom: 'ln_f' top: 'logits'\n"
    "        inner_product_param { num_output: 5 axis: 2 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'logits' bottom: 'label' top: 'loss'\n"
    "        softmax_param { axis: 2 } loss_param { ignore_label: -1 } }\n";

/* Sequence 0 has 3 steps, sequence 1 two (its last step is padding, labelled -1). */
static void set_block_inputs(kiln_net *net) {
  kiln_blob *x = kiln_net_blob(net, "x"), *mask = kiln_net_blob(net, "mask");
  kiln_blob *label = kiln_net_blob(net, "label");
  assert_non_null(x);
  assert_non_null(mask);
  assert_non_null(label);
  kiln_rng r;
  kiln_rng_seed(&r, 49, 2);
  for (int64_t i = 0; i < x->count; i++) x->data[i] = kiln_rng_uniform(&r, -1, 1);
  const float m[6] = {1, 1, 1, 1, 1, 0}, lab[6] = {0, 3, 2, 4, 1, -1};
  memcpy(mask->data, m, sizeof m);
  memcpy(label->data, lab, sizeof lab);
}

static double block_loss(kiln_net *net) {
  float loss = 0;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  return loss;
}

/* Central differences of the net's loss with respect to x[0..n) against `analytic`. */
static int net_fd_mismatches(kiln_net *net, float *x, const float *analytic, int64_t n,
                             const char *what) {
  const double h = 1e-2, thr = 2e-3;
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float keep = x[i];
    x[i] = keep + (float)h;
    double up = block_loss(net);
    x[i] = keep - (float)h;
    double down = block_loss(net);
    x[i] = keep;
    double num = (up - down) / (2 * h);
    if (fabs(num - analytic[i]) > thr * fmax(1.0, fmax(fabs(num), fabs(analytic[i])))) {
      if (bad++ < 10)
        fprintf(stderr, "%s[%lld]: analytic %.6g numeric %.6g\n", what, (long long)i,
                analytic[i], num);
    }
  }
  return bad;
}

/* The block built through kiln_net (the TEST phase, where Dropout passes values through, with
 * force_backward): the gradients of the loss with respect to the input and to every parameter
 * of every layer match central differences of the whole net's loss. The padded step's input
 * gets no gradient: the mask keeps it out of the attention's keys, causality out of the other
 * queries, and its label is ignored. */
static void test_transformer_block_net_gradients(void **state) {
  (void)state;
  char text[4096];
  snprintf(text, sizeof text, block_net_fmt, "force_backward: true\n", 0.1, 0.1);
  Caffe__NetParameter *np = NULL;
  assert_int_equal(kiln_net_param_from_text(text, "block.prototxt", &np), KILN_OK);
  kiln_net_options opt = {.phase = TEST, .seed = 5, .nthreads = 2, .config = kiln_test_net_config()};
  kiln_net *net = NULL;
  int rc = kiln_net_create(np, &opt, &net);
  if (rc) print_error("%s\n", kiln_last_error());
  assert_int_equal(rc, KILN_OK);
  set_block_inputs(net);
  kiln_net_zero_param_diff(net);
  float loss = 0;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_true(isfinite(loss) && loss > 0);
  expect_shape(kiln_net_blob(net, "logits"), 3, SHAPE(3, 2, 5));
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  kiln_blob *x = kiln_net_blob(net, "x");
  float *dx = malloc(sizeof(float) * (size_t)x->count);
  float *dp = malloc(sizeof(float) * (size_t)net->nparam_floats);
  assert_non_null(dx);
  assert_non_null(dp);
  memcpy(dx, x->diff, sizeof(float) * (size_t)x->count);
  memcpy(dp, net->param_diff, sizeof(float) * (size_t)net->nparam_floats);
  /* the padded step is x[2, 1, :] */
  for (int j = 0; j < 4; j++) assert_true(dx[(2 * 2 + 1) * 4 + j] == 0);
  assert_int_equal(net_fd_mismatches(net, x->data, dx, x->count, "x"), 0);
  int nparam = 0;
  for (int k = 0; k < net->nlearnable; k++) {
    kiln_blob *p = net->learnable[k];
    nparam += (int)p->count;
    assert_int_equal(
        net_fd_mismatches(net, p->data, dp + net->learnable_offset[k], p->count, p->name), 0);
  }
  /* ln1, attn, ln2, ff1, ff2, ln_f, cls: 8 + 80 + 8 + 80 + 68 + 8 + 25 */
  assert_int_equal(nparam, 277);
  free(dp);
  free(dx);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

static int block_setup(void **state) { return tmpdir_setup(state, "tfm"); }

/* The block trained by the solver on one fixed batch, with dropout on (TRAIN), by SGD with
 * momentum: the loss of the 5 labelled steps, measured by a TEST-phase copy of the net that
 * shares the weights (dropout off), falls from about log 5 to under half of that in 50 steps
 * (to about a quarter; with dropout this small net then learns slowly, without it the loss goes
 * on to 0.02 by step 150). */
static void test_transformer_block_trains(void **state) {
  const tmpdir_fixture *f = *state;
  char text[4096], net_path[128], solver_path[128], solver[512];
  snprintf(text, sizeof text, block_net_fmt, "", 0.1, 0.1);
  path_in(f, "block.prototxt", net_path, sizeof net_path);
  write_plain(net_path, text, strlen(text));
  snprintf(solver, sizeof solver,
           "net: 'block.prototxt'\ntype: 'SGD'\nbase_lr: 0.02\nmomentum: 0.9\n"
           "lr_policy: 'fixed'\nmax_iter: 1000\ndisplay: 0\nrandom_seed: 3\n"
           "snapshot_after_train: false\n");
  path_in(f, "solver.prototxt", solver_path, sizeof solver_path);
  write_plain(solver_path, solver, strlen(solver));
  kiln_solver *s = NULL;
  kiln_solver_options o = {.config = kiln_test_net_config()};
  int rc = kiln_solver_create(solver_path, &o, &s);
  if (rc) print_error("%s\n", kiln_last_error());
  assert_int_equal(rc, KILN_OK);
  set_block_inputs(kiln_solver_net(s));
  Caffe__NetParameter *np = NULL;
  assert_int_equal(kiln_net_param_from_text(text, "block.prototxt", &np), KILN_OK);
  kiln_net_options topt = {.phase = TEST, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *eval = NULL;
  assert_int_equal(kiln_net_create(np, &topt, &eval), KILN_OK);
  assert_int_equal(kiln_net_share_params(eval, kiln_solver_net(s)), KILN_OK);
  set_block_inputs(eval);
  double first = block_loss(eval);
  assert_true(first > 0.5 * log(5.0) && first < 2 * log(5.0));
  assert_int_equal(kiln_solver_step(s, 50), KILN_OK);
  double last = block_loss(eval);
  if (!(last < 0.5 * first)) print_error("loss %g after 50 steps, %g at first\n", last, first);
  assert_true(last < 0.5 * first);
  kiln_net_free(eval);
  protobuf_c_message_free_unpacked(&np->base, NULL);
  kiln_solver_free(s);
}

/* ---- MatMul ------------------------------------------------------------------------------ */

/* [[1 2 3] [4 5 6]] (2 x 3) times [[1 0] [0 1] [1 1]] (3 x 2) = [[4 5] [10 11]], by hand; the
 * same with each operand stored transposed; and the gradients of sum(C * G) for G = [[1 2] [3
 * 4]]: dA = G B^T = [[1 2 3] [3 4 7]], dB = A^T G = [[13 18] [17 24] [21 30]]. */
static void test_matmul_hand(void **state) {
  (void)state;
  const float av[6] = {1, 2, 3, 4, 5, 6}, bv[6] = {1, 0, 0, 1, 1, 1};
  const float at[6] = {1, 4, 2, 5, 3, 6}, bt[6] = {1, 0, 1, 0, 1, 1};
  const float want[4] = {4, 5, 10, 11}, g[4] = {1, 2, 3, 4};
  const float da[6] = {1, 2, 3, 3, 4, 7}, db[6] = {13, 18, 17, 24, 21, 30};
  const float dat[6] = {1, 3, 2, 4, 3, 7}, dbt[6] = {13, 17, 21, 18, 24, 30};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      kiln_blob *a = blob_of("a", 2, ta ? SHAPE(3, 2) : SHAPE(2, 3), ta ? at : av);
      kiln_blob *b = blob_of("b", 2, tb ? SHAPE(2, 3) : SHAPE(3, 2), tb ? bt : bv);
      kiln_blob *ab[2] = {a, b};
      char text[160];
      snprintf(text, sizeof text,
               "name: 'mm' type: 'MatMul' matmul_param { transpose_a: %s transpose_b: %s }",
               ta ? "true" : "false", tb ? "true" : "false");
      built mm = build(text, TRAIN, ab, 2, 1);
      expect_shape(mm.top[0], 2, SHAPE(2, 2));
      forward(&mm);
      expect_close(text, mm.top[0]->data, want, 4, 0);
      memcpy(mm.top[0]->diff, g, sizeof g);
      fill(a->diff, 6, 99);
      fill(b->diff, 6, 99);
      backward(&mm);
      expect_close("dA", a->diff, ta ? dat : da, 6, 0);
      expect_close("dB", b->diff, tb ? dbt : db, 6, 0);
      unbuild(&mm);
      kiln_blob_free(a);
      kiln_blob_free(b);
    }
}

/* Batched products with NumPy's broadcasting against plain loops in double: A 2 x 1 x 3 x 4 by
 * B 3 x 4 x 5 (B's missing axis and A's axis of 1 broadcast: top 2 x 3 x 3 x 5), and attention's
 * pair, q (6 x 4 x 2) by k transposed (6 x 5 x 2); then finite differences of both bottoms for
 * these and a broadcast B whose gradient sums over the batch. */
static void matmul_reference(const char *text, kiln_blob *a, kiln_blob *b, bool ta, bool tb,
                             int naxes, const int64_t *shape) {
  kiln_blob *ab[2] = {a, b};
  built mm = build(text, TRAIN, ab, 2, 1);
  expect_shape(mm.top[0], naxes, shape);
  forward(&mm);
  const int na = a->naxes, nb = b->naxes, nt = naxes;
  const int64_t M = shape[nt - 2], N = shape[nt - 1];
  const int64_t K = ta ? a->shape[na - 2] : a->shape[na - 1];
  int64_t batch = 1;
  for (int i = 0; i < nt - 2; i++) batch *= shape[i];
  double *want = doubles(batch * M * N);
  for (int64_t p = 0; p < batch; p++) {
    /* the batch index's digits, each bottom's matrix from its own axes (1: index 0) */
    int64_t r = p, oa = 0, ob = 0, sa = M * K, sb = K * N;
    for (int i = nt - 3; i >= 0; i--) {
      const int64_t d = r % shape[i];
      r /= shape[i];
      const int ia = i - (nt - na), ib = i - (nt - nb);
      if (ia >= 0) {
        oa += (a->shape[ia] == 1 ? 0 : d) * sa;
        sa *= a->shape[ia];
      }
      if (ib >= 0) {
        ob += (b->shape[ib] == 1 ? 0 : d) * sb;
        sb *= b->shape[ib];
      }
    }
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++)
          acc += (double)a->data[oa + (ta ? k * M + i : i * K + k)] *
                 (double)b->data[ob + (tb ? j * K + k : k * N + j)];
        want[(p * M + i) * N + j] = acc;
      }
  }
  expect_rel(text, mm.top[0]->data, want, batch * M * N, 1e-5);
  free(want);
  unbuild(&mm);
}

static void test_matmul_batched_reference(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 61, 1);
  kiln_blob *a = gc_blob("a", 4, SHAPE(2, 1, 3, 4), -1, 1, &rng);
  kiln_blob *b = gc_blob("b", 3, SHAPE(3, 4, 5), -1, 1, &rng);
  matmul_reference("name: 'mm' type: 'MatMul'", a, b, false, false, 4, SHAPE(2, 3, 3, 5));
  kiln_blob *q = gc_blob("q", 3, SHAPE(6, 4, 2), -1, 1, &rng);
  kiln_blob *k = gc_blob("k", 3, SHAPE(6, 5, 2), -1, 1, &rng);
  matmul_reference("name: 'mm' type: 'MatMul' matmul_param { transpose_b: true }", q, k, false,
                   true, 3, SHAPE(6, 4, 5));
  kiln_blob *at = gc_blob("at", 3, SHAPE(2, 3, 4), -1, 1, &rng);
  kiln_blob *w = gc_blob("w", 2, SHAPE(5, 3), -1, 1, &rng);
  matmul_reference("name: 'mm' type: 'MatMul' matmul_param { transpose_a: true transpose_b: "
                   "true }",
                   at, w, true, true, 3, SHAPE(2, 4, 5));
  kiln_blob *c1 = gc_blob("c1", 4, SHAPE(1, 3, 2, 4), -1, 1, &rng);
  kiln_blob *c2 = gc_blob("c2", 4, SHAPE(2, 1, 4, 3), -1, 1, &rng);
  matmul_reference("name: 'mm' type: 'MatMul'", c1, c2, false, false, 4, SHAPE(2, 3, 2, 3));
  kiln_blob *pairs[4][2] = {{a, b}, {q, k}, {at, w}, {c1, c2}};
  const char *texts[4] = {"name: 'mm' type: 'MatMul'",
                          "name: 'mm' type: 'MatMul' matmul_param { transpose_b: true }",
                          "name: 'mm' type: 'MatMul' matmul_param { transpose_a: true "
                          "transpose_b: true }",
                          "name: 'mm' type: 'MatMul'"};
  for (int i = 0; i < 4; i++) check_grad(texts[i], pairs[i], 2, 1, NULL);
  kiln_blob *all[] = {a, b, q, k, at, w, c1, c2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_blob_free(all[i]);
}

static void test_matmul_bad_shapes(void **state) {
  (void)state;
  const char *who = "layer 'mm' (MatMul)";
  kiln_blob *a = blob_of("a", 3, SHAPE(2, 3, 4), NULL), *b = blob_of("b", 3, SHAPE(3, 5, 2), NULL);
  kiln_blob *ab[2] = {a, b};
  expect_create_fails("name: 'mm' type: 'MatMul'", TRAIN, ab, 2, 1, KILN_ERR_SHAPE, who,
                      "do not multiply");
  kiln_blob *c = blob_of("c", 3, SHAPE(3, 4, 2), NULL);
  kiln_blob *ac[2] = {a, c};
  expect_create_fails("name: 'mm' type: 'MatMul'", TRAIN, ac, 2, 1, KILN_ERR_SHAPE, who,
                      "batch axis 0: A has 2 and B 3");
  kiln_blob *v = blob_of("v", 1, SHAPE(4), NULL);
  kiln_blob *av[2] = {a, v};
  expect_create_fails("name: 'mm' type: 'MatMul'", TRAIN, av, 2, 1, KILN_ERR_SHAPE, who,
                      "at least 2");
  kiln_blob *d = blob_of("d", 3, SHAPE(2, 4, 4), NULL);
  kiln_blob *ad[2] = {a, d};
  expect_fails_ex("name: 'mm' type: 'MatMul'", TRAIN, ad, 2, 1, true, KILN_ERR_INVALID, who,
                  "in place", NULL);
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
  kiln_blob_free(v);
  kiln_blob_free(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gelu_hand),
      cmocka_unit_test(test_gelu_reference),
      cmocka_unit_test(test_gelu_gradients),
      cmocka_unit_test(test_layer_norm_hand),
      cmocka_unit_test(test_layer_norm_reference),
      cmocka_unit_test(test_layer_norm_gradients),
      cmocka_unit_test(test_layer_norm_bad_parameters),
      cmocka_unit_test(test_positional_encoding_sinusoidal_hand),
      cmocka_unit_test(test_positional_encoding_learned_hand),
      cmocka_unit_test(test_positional_encoding_gradients),
      cmocka_unit_test(test_positional_encoding_max_len),
      cmocka_unit_test(test_mha_tiny_cases),
      cmocka_unit_test(test_mha_reference),
      cmocka_unit_test(test_mha_gradients),
      cmocka_unit_test(test_mha_thread_count_independent),
      cmocka_unit_test(test_mha_bad_parameters),
      cmocka_unit_test(test_matmul_hand),
      cmocka_unit_test(test_matmul_batched_reference),
      cmocka_unit_test(test_matmul_bad_shapes),
      cmocka_unit_test(test_transformer_block_net_gradients),
      cmocka_unit_test_setup_teardown(test_transformer_block_trains, block_setup,
                                      tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
