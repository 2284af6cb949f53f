/* Element-wise layers: ReLU, Sigmoid, TanH, Dropout, Power, AbsVal, ELU and PReLU (one slope per
 * channel). Forward passes against values worked out by hand (and, for ELU and Power, against
 * the formula in double precision on random input), backward passes against finite differences
 * (tests/support/gradcheck.c), in-place runs against out-of-place ones, the errors that bad
 * parameters and shapes give (a status and a message naming the layer), and a chain of them in
 * place inside a net. */
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

/* ---- ReLU, Sigmoid, TanH ----------------------------------------------------------------- */

static const float act_x[5] = {-2, -0.5f, 0, 0.5f, 3};
static const float act_dy[5] = {1, 2, 3, 4, 5};

/* Runs `text` on act_x (1 x 5) out of place or in place with act_dy as the top gradient and
 * compares the output and the input gradient with the wanted ones (to `tol`); out of place, the
 * input must be left as it was. */
static void neuron_case(const char *text, bool in_place, const float *want_y,
                        const float *want_dx, double tol) {
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), act_x);
  kiln_blob *y = in_place ? x : kiln_blob_new("y");
  built r = build_on(text, TRAIN, &x, 1, &y, 1);
  char what[300];
  forward(&r);
  snprintf(what, sizeof what, "%s%s: y", text, in_place ? " (in place)" : "");
  expect_close(what, y->data, want_y, 5, tol);
  if (!in_place) expect_close("input kept", x->data, act_x, 5, 0);
  memcpy(y->diff, act_dy, sizeof act_dy);
  if (!in_place) fill(x->diff, 5, 42);
  backward(&r);
  snprintf(what, sizeof what, "%s%s: dx", text, in_place ? " (in place)" : "");
  expect_close(what, x->diff, want_dx, 5, tol);
  unbuild(&r);
  if (!in_place) kiln_blob_free(y);
  kiln_blob_free(x);
}

/* ReLU(x) = x > 0 ? x : slope * x; dx = dy where x > 0, slope * dy elsewhere (x = 0 included,
 * as Caffe). */
static void test_relu_forward_backward_hand(void **state) {
  (void)state;
  const float y0[5] = {0, 0, 0, 0.5f, 3}, dx0[5] = {0, 0, 0, 4, 5};
  const float y1[5] = {-0.2f, -0.05f, 0, 0.5f, 3}, dx1[5] = {0.1f, 0.2f, 0.3f, 4, 5};
  const char *plain = "name: 'r' type: 'ReLU'";
  const char *leaky = "name: 'r' type: 'ReLU' relu_param { negative_slope: 0.1 }";
  neuron_case(plain, false, y0, dx0, 1e-7);
  neuron_case(plain, true, y0, dx0, 1e-7);
  neuron_case(leaky, false, y1, dx1, 1e-7);
  neuron_case(leaky, true, y1, dx1, 1e-7);
}

static void test_relu_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 14, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 3, 4), -2, 2, &rng);
  /* Skip inputs within a step of the kink at 0, as Caffe's ReLU tests do. */
  gradcheck_opts o = {.step = 1e-2, .threshold = 1e-3, .kink = 0, .kink_range = 0.02f};
  check_grad("name: 'r' type: 'ReLU'", &x, 1, 1, &o);
  check_grad("name: 'r' type: 'ReLU' relu_param { negative_slope: 0.1 }", &x, 1, 1, &o);
  kiln_blob_free(x);
}

static void test_relu_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), act_x);
  /* A negative slope in place would lose the input sign the backward pass needs. */
  Caffe__LayerParameter *lp = gc_layer_param("name: 'neg' type: 'ReLU' relu_param { "
                                             "negative_slope: -0.5 }");
  kiln_layer *l = NULL;
  assert_int_equal(kiln_layer_create(lp, TRAIN, &x, 1, &x, 1, 1, kiln_test_config(), &l),
                   KILN_ERR_UNSUPPORTED);
  assert_null(l);
  expect_message("layer 'neg' (ReLU)", "in place", NULL);
  protobuf_c_message_free_unpacked(&lp->base, NULL);
  kiln_blob_free(x);
}

/* sigmoid(-2) = 0.11920292, sigmoid(-0.5) = 0.37754067, sigmoid(0) = 0.5,
 * sigmoid(0.5) = 0.62245933, sigmoid(3) = 0.95257413; dx = dy * y (1 - y).
 * tanh: -0.96402758, -0.46211716, 0, 0.46211716, 0.99505475; dx = dy (1 - y^2). */
static void test_sigmoid_tanh_hand(void **state) {
  (void)state;
  const float sig[5] = {0.11920292f, 0.37754067f, 0.5f, 0.62245933f, 0.95257413f};
  const float th[5] = {-0.96402758f, -0.46211716f, 0, 0.46211716f, 0.99505475f};
  const struct {
    const char *text;
    const float *y;
    bool tanh;
  } cases[] = {{"name: 's' type: 'Sigmoid'", sig, false}, {"name: 't' type: 'TanH'", th, true}};
  for (int c = 0; c < 2; c++)
    for (int in_place = 0; in_place < 2; in_place++) {
      kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), act_x);
      kiln_blob *y = in_place ? x : kiln_blob_new("y");
      built b = build_on(cases[c].text, TRAIN, &x, 1, &y, 1);
      forward(&b);
      expect_close(cases[c].text, y->data, cases[c].y, 5, 1e-6);
      memcpy(y->diff, act_dy, sizeof act_dy);
      backward(&b);
      float want[5];
      for (int i = 0; i < 5; i++) {
        double v = cases[c].y[i];
        want[i] = (float)(act_dy[i] * (cases[c].tanh ? 1 - v * v : v * (1 - v)));
      }
      expect_close(cases[c].text, x->diff, want, 5, 1e-6);
      unbuild(&b);
      if (!in_place) kiln_blob_free(y);
      kiln_blob_free(x);
    }
}

static void test_sigmoid_tanh_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 15, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 3), -3, 3, &rng);
  check_grad("name: 's' type: 'Sigmoid'", &x, 1, 1, NULL);
  check_grad("name: 't' type: 'TanH'", &x, 1, 1, NULL);
  kiln_blob_free(x);
}

/* ---- AbsVal and ELU ---------------------------------------------------------------------- */

/* |x|; dx = sign(x) dy with sign(0) = 0. */
static void test_absval_hand(void **state) {
  (void)state;
  const float y[5] = {2, 0.5f, 0, 0.5f, 3}, dx[5] = {-1, -2, 0, 4, 5};
  neuron_case("name: 'a' type: 'AbsVal'", false, y, dx, 1e-6);
  neuron_case("name: 'a' type: 'AbsVal'", true, y, dx, 1e-6);
}

/* ELU, alpha 1: e^-2 - 1 = -0.86466472, e^-0.5 - 1 = -0.39346934; dx = dy (y + alpha) = dy e^x
 * for x <= 0 (at 0: alpha dy), dy above. alpha 0.5 halves the negative side; alpha -0.5 flips it.
 * In place, the layer works from its saved input. */
static void test_elu_hand(void **state) {
  (void)state;
  const double e2 = exp(-2.0), e05 = exp(-0.5);
  const float alphas[3] = {1, 0.5f, -0.5f};
  for (int k = 0; k < 3; k++) {
    float a = alphas[k];
    const float y[5] = {(float)(a * (e2 - 1)), (float)(a * (e05 - 1)), 0, 0.5f, 3};
    const float dx[5] = {(float)(1 * a * e2), (float)(2 * a * e05), 3 * a, 4, 5};
    char text[128];
    snprintf(text, sizeof text, "name: 'e' type: 'ELU' elu_param { alpha: %g }", a);
    neuron_case(text, false, y, dx, 1e-6);
    neuron_case(text, true, y, dx, 1e-6);
  }
  /* no elu_param: alpha 1 */
  const float y1[5] = {(float)(e2 - 1), (float)(e05 - 1), 0, 0.5f, 3};
  const float dx1[5] = {(float)e2, (float)(2 * e05), 3, 4, 5};
  neuron_case("name: 'e' type: 'ELU'", false, y1, dx1, 1e-6);
}

static void test_elu_reference(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 35, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 4, 5), -6, 4, &rng);
  double *want = malloc(sizeof(double) * (size_t)x->count);
  assert_non_null(want);
  const double alphas[] = {1, 0.3, 2.5, -0.7};
  for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
    char text[128];
    snprintf(text, sizeof text, "name: 'e' type: 'ELU' elu_param { alpha: %.9g }", alphas[k]);
    built e = build(text, TRAIN, &x, 1, 1);
    forward(&e);
    for (int64_t i = 0; i < x->count; i++) {
      double v = x->data[i];
      want[i] = v > 0 ? v : (float)alphas[k] * expm1(v);
    }
    expect_rel(text, e.top[0]->data, want, x->count, 2e-6);
    unbuild(&e);
  }
  free(want);
  kiln_blob_free(x);
}

static void test_absval_elu_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 36, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 3, 4), -2, 2, &rng);
  gradcheck_opts kink = {.kink = 0, .kink_range = 0.02f};
  check_grad("name: 'a' type: 'AbsVal'", &x, 1, 1, &kink);
  expect_in_place_matches("name: 'a' type: 'AbsVal'", x, &rng);
  /* ELU with alpha 1 is smooth at 0 (both sides have slope 1); other alphas have a kink. */
  check_grad("name: 'e' type: 'ELU'", &x, 1, 1, NULL);
  const char *elus[] = {"name: 'e' type: 'ELU' elu_param { alpha: 0.3 }",
                        "name: 'e' type: 'ELU' elu_param { alpha: 2 }",
                        "name: 'e' type: 'ELU' elu_param { alpha: -0.5 }"};
  for (size_t i = 0; i < sizeof elus / sizeof elus[0]; i++) {
    check_grad(elus[i], &x, 1, 1, &kink);
    expect_in_place_matches(elus[i], x, &rng);
  }
  expect_in_place_matches("name: 'e' type: 'ELU'", x, &rng);
  kiln_blob_free(x);
}

/* ---- Dropout ----------------------------------------------------------------------------- */

static void test_dropout_test_phase_identity(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 16, 1);
  kiln_blob *x = gc_blob("x", 2, SHAPE(4, 25), -1, 1, &rng);
  built d = build("name: 'd' type: 'Dropout' dropout_param { dropout_ratio: 0.5 }", TEST, &x, 1, 1);
  forward(&d);
  expect_close("dropout TEST y", d.top[0]->data, x->data, 100, 0);
  for (int64_t i = 0; i < 100; i++) d.top[0]->diff[i] = (float)i;
  fill(x->diff, 100, -1);
  backward(&d);
  expect_close("dropout TEST dx", x->diff, d.top[0]->diff, 100, 0);
  unbuild(&d);
  kiln_blob_free(x);
}

/* TRAIN: each value is kept with probability 1 - r and scaled by 1 / (1 - r); the mask drawn in
 * forward is the one backward applies. */
static void dropout_train_case(float r, bool in_place) {
  const int64_t n = 100000;
  kiln_blob *x = blob_of("x", 2, SHAPE(100, 1000), NULL);
  for (int64_t i = 0; i < n; i++) x->data[i] = 1.0f + (float)(i % 7);
  kiln_blob *y = in_place ? x : kiln_blob_new("y");
  char text[128];
  snprintf(text, sizeof text, "name: 'd' type: 'Dropout' dropout_param { dropout_ratio: %g }", r);
  built d = build_on(text, TRAIN, &x, 1, &y, 1);
  forward(&d);
  const float scale = 1.0f / (1.0f - r);
  float *mask = malloc(sizeof(float) * (size_t)n); /* what forward applied to each value */
  assert_non_null(mask);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    float xi = 1.0f + (float)(i % 7);
    if (y->data[i] != 0) {
      kept++;
      if (fabsf(y->data[i] - xi * scale) > 1e-5f * xi * scale) {
        print_error("kept value %lld: %g, want %g\n", (long long)i, y->data[i], xi * scale);
        fail();
      }
      mask[i] = scale;
    } else {
      mask[i] = 0;
    }
  }
  double frac = (double)kept / n;
  if (fabs(frac - (1 - r)) > 0.01) {
    print_error("kept fraction %.4f, want %.4f +- 0.01\n", frac, 1 - r);
    fail();
  }
  /* Backward twice (dy = 1 + i % 3): the same mask both times, no new draw. */
  for (int pass = 0; pass < 2; pass++) {
    for (int64_t i = 0; i < n; i++) y->diff[i] = 1.0f + (float)(i % 3);
    backward(&d);
    for (int64_t i = 0; i < n; i++)
      if (fabsf(x->diff[i] - (1.0f + (float)(i % 3)) * mask[i]) > 1e-5f) {
        print_error("pass %d dx[%lld] = %g, mask %g\n", pass, (long long)i, x->diff[i], mask[i]);
        fail();
      }
  }
  /* A new forward draws a new mask. */
  if (in_place)
    for (int64_t i = 0; i < n; i++) x->data[i] = 1.0f + (float)(i % 7);
  forward(&d);
  int64_t changed = 0;
  for (int64_t i = 0; i < n; i++) changed += (y->data[i] != 0) != (mask[i] != 0);
  assert_true(changed > n / 10);
  free(mask);
  unbuild(&d);
  if (!in_place) kiln_blob_free(y);
  kiln_blob_free(x);
}

static void test_dropout_train_statistics(void **state) {
  (void)state;
  dropout_train_case(0.5f, false);
  dropout_train_case(0.3f, false);
  dropout_train_case(0.3f, true);
  dropout_train_case(0.8f, false);
}

static void test_dropout_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 17, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 4, 4), -1, 1, &rng);
  /* TRAIN: the checker restores the generator before every forward, so each one draws the same
   * mask, as Caffe's test does. */
  check_grad("name: 'd' type: 'Dropout' dropout_param { dropout_ratio: 0.4 }", &x, 1, 1, NULL);
  gradcheck_opts test_phase = {.phase = TEST, .kink_range = -1};
  check_grad("name: 'd' type: 'Dropout' dropout_param { dropout_ratio: 0.4 }", &x, 1, 1,
             &test_phase);
  kiln_blob_free(x);
}

static void test_dropout_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), NULL);
  expect_create_fails("name: 'd1' type: 'Dropout' dropout_param { dropout_ratio: 1.0 }", TRAIN,
                      &x, 1, 1, KILN_ERR_INVALID, "layer 'd1' (Dropout)", "dropout_ratio 1");
  expect_create_fails("name: 'd2' type: 'Dropout' dropout_param { dropout_ratio: -0.1 }", TRAIN,
                      &x, 1, 1, KILN_ERR_INVALID, "layer 'd2' (Dropout)", "dropout_ratio");
  kiln_blob_free(x);
}

/* ---- Power ------------------------------------------------------------------------------- */

/* y = (shift + scale x)^power; dx = dy * power * scale * (shift + scale x)^(power - 1). */
static void test_power_hand(void **state) {
  (void)state;
  const struct {
    const char *param;
    float x[4], y[4], dx[4]; /* dx for dy = 1 */
  } cases[] = {
      /* bases -1, 1, 2, 5 */
      {"power: 2 scale: 2 shift: 1", {-1, 0, 0.5f, 2}, {1, 1, 4, 25}, {-4, 4, 8, 20}},
      /* bases 1, 4, 9, 0.25: sqrt and 0.5 / sqrt */
      {"power: 0.5", {1, 4, 9, 0.25f}, {1, 2, 3, 0.5f}, {0.5f, 0.25f, 1.0f / 6, 1}},
      /* bases 1, 2, 4, 0.5 with shift: 1 / base^2 and -2 * 0.5 / base^3 */
      {"power: -2 scale: 0.5 shift: 1", {0, 2, 6, -1}, {1, 0.25f, 0.0625f, 4},
       {-1, -0.125f, -1.0f / 64, -8}},
      /* power 1: affine, constant gradient */
      {"scale: 3 shift: -1", {-1, 0, 0.5f, 2}, {-4, -1, 0.5f, 5}, {3, 3, 3, 3}},
      /* power 0: 1 whatever the input; scale 0: shift^power */
      {"power: 0 scale: 2 shift: 3", {-1, 0, 0.5f, 2}, {1, 1, 1, 1}, {0, 0, 0, 0}},
      {"power: 3 scale: 0 shift: 2", {-1, 0, 0.5f, 2}, {8, 8, 8, 8}, {0, 0, 0, 0}},
      /* a base of 0 with power 3: gradient 0, not 0/0 */
      {"power: 3 shift: 1", {-1, 0, 1, -2}, {0, 1, 8, -1}, {0, 3, 12, 3}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "name: 'p' type: 'Power' power_param { %s }", cases[i].param);
    for (int in_place = 0; in_place < 2; in_place++) {
      kiln_blob *x = blob_of("x", 2, SHAPE(2, 2), cases[i].x);
      kiln_blob *y = in_place ? x : kiln_blob_new("y");
      built p = build_on(text, TRAIN, &x, 1, &y, 1);
      forward(&p);
      expect_close(text, y->data, cases[i].y, 4, 1e-6);
      fill(y->diff, 4, 1);
      if (!in_place) fill(x->diff, 4, 1e3f);
      backward(&p);
      expect_close(text, x->diff, cases[i].dx, 4, 1e-6);
      unbuild(&p);
      if (!in_place) kiln_blob_free(y);
      kiln_blob_free(x);
    }
  }
}

static void test_power_reference(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 33, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(3, 4, 5), 0, 3, &rng);
  double want[60];
  const struct {
    double power, scale, shift;
  } cases[] = {{0.37, 0.83, 1.37}, {2, -1.5, 0.2}, {3, 1, -1}, {-1.5, 2, 0.5}, {1, 0.25, 7},
               {2.5, 1, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[256];
    snprintf(text, sizeof text,
             "name: 'p' type: 'Power' power_param { power: %.9g scale: %.9g shift: %.9g }",
             cases[i].power, cases[i].scale, cases[i].shift);
    built p = build(text, TRAIN, &x, 1, 1);
    forward(&p);
    for (int64_t j = 0; j < x->count; j++)
      want[j] = pow((float)cases[i].shift + (double)(float)cases[i].scale * x->data[j],
                    (float)cases[i].power);
    expect_rel(text, p.top[0]->data, want, x->count, 2e-6);
    unbuild(&p);
  }
  kiln_blob_free(x);
}

static void test_power_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 34, 1);
  /* Positive bases for the fractional and negative powers: x in [0.1, 2]. */
  kiln_blob *pos = gc_blob("pos", 4, SHAPE(2, 3, 2, 2), 0.1f, 2, &rng);
  kiln_blob *any = gc_blob("any", 4, SHAPE(2, 3, 2, 2), -2, 2, &rng);
  const char *pos_params[] = {"power: 0.37 scale: 0.83 shift: 1.37", "power: -1.5 shift: 0.5",
                              "power: 0.5", "power: 2.5 scale: 2"};
  const char *any_params[] = {"power: 2",         "power: 2 scale: -0.5 shift: 0.3",
                              "power: 3 shift: 1", "scale: 2 shift: -1",
                              "power: 0 shift: 2", "power: 2 scale: 0 shift: 2"};
  char text[256];
  for (size_t i = 0; i < sizeof pos_params / sizeof pos_params[0]; i++) {
    snprintf(text, sizeof text, "name: 'p' type: 'Power' power_param { %s }", pos_params[i]);
    check_grad(text, &pos, 1, 1, NULL);
  }
  for (size_t i = 0; i < sizeof any_params / sizeof any_params[0]; i++) {
    snprintf(text, sizeof text, "name: 'p' type: 'Power' power_param { %s }", any_params[i]);
    check_grad(text, &any, 1, 1, NULL);
    expect_in_place_matches(text, any, &rng);
  }
  kiln_blob_free(any);
  kiln_blob_free(pos);
}

/* ---- PReLU ------------------------------------------------------------------------------- */

/* 1x2x1x3: channel 0 = (-1, 0.5, -2), channel 1 = (2, -3, 1); slopes (0.1, -0.5):
 *   y = (-0.1, 0.5, -0.2, 2, 1.5, 1)
 * dy = (1 .. 6): dx = (0.1, 2, 0.3, 4, -2.5, 6); slope gradients sum dy x where x <= 0:
 *   da0 = 1*(-1) + 3*(-2) = -7, da1 = 5*(-3) = -15 (shared: -22). */
static void test_prelu_hand(void **state) {
  (void)state;
  const float xv[6] = {-1, 0.5f, -2, 2, -3, 1}, dy[6] = {1, 2, 3, 4, 5, 6};
  for (int in_place = 0; in_place < 2; in_place++) {
    kiln_blob *x = blob_of("x", 4, SHAPE(1, 2, 1, 3), xv);
    kiln_blob *y = in_place ? x : kiln_blob_new("y");
    built p = build_on("name: 'pr' type: 'PReLU'", TRAIN, &x, 1, &y, 1);
    assert_int_equal(p.l->nparam, 1);
    expect_shape(p.l->param[0], 1, SHAPE(2));
    expect_close("prelu default slopes", p.l->param[0]->data, (const float[]){0.25f, 0.25f}, 2,
                 0);
    set_params(&p, 0, (const float[]){0.1f, -0.5f});
    forward(&p);
    expect_close("prelu y", y->data, (const float[]){-0.1f, 0.5f, -0.2f, 2, 1.5f, 1}, 6, 1e-6);
    memcpy(y->diff, dy, sizeof dy);
    fill(p.l->param[0]->diff, 2, 0);
    if (!in_place) fill(x->diff, 6, 1e3f);
    backward(&p);
    expect_close("prelu dx", x->diff, (const float[]){0.1f, 2, 0.3f, 4, -2.5f, 6}, 6, 1e-6);
    expect_close("prelu da", p.l->param[0]->diff, (const float[]){-7, -15}, 2, 1e-6);
    /* parameter gradients accumulate over passes */
    memcpy(y->diff, dy, sizeof dy);
    backward(&p);
    expect_close("prelu da accumulated", p.l->param[0]->diff, (const float[]){-14, -30}, 2,
                 1e-6);
    unbuild(&p);
    if (!in_place) kiln_blob_free(y);
    kiln_blob_free(x);
  }
  /* channel_shared: one scalar slope (Caffe stores it as a blob with no axes) */
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 2, 1, 3), xv);
  built s = build("name: 'ps' type: 'PReLU' prelu_param { channel_shared: true filler { "
                  "type: 'constant' value: 0.1 } }",
                  TRAIN, &x, 1, 1);
  expect_shape(s.l->param[0], 0, NULL);
  assert_int_equal(s.l->param[0]->count, 1);
  expect_close("prelu shared slope", s.l->param[0]->data, (const float[]){0.1f}, 1, 0);
  forward(&s);
  expect_close("prelu shared y", s.top[0]->data, (const float[]){-0.1f, 0.5f, -0.2f, 2, -0.3f, 1},
               6, 1e-6);
  memcpy(s.top[0]->diff, dy, sizeof dy);
  fill(s.l->param[0]->diff, 1, 0);
  backward(&s);
  expect_close("prelu shared dx", x->diff, (const float[]){0.1f, 2, 0.3f, 4, 0.5f, 6}, 6, 1e-6);
  expect_close("prelu shared da", s.l->param[0]->diff, (const float[]){-22}, 1, 1e-6);
  unbuild(&s);
  kiln_blob_free(x);
}

static void test_prelu_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 37, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 3), -2, 2, &rng);
  kiln_blob *flat = gc_blob("flat", 2, SHAPE(4, 5), -2, 2, &rng);
  gradcheck_opts kink = {.kink = 0, .kink_range = 0.02f};
  const char *params[] = {
      "name: 'pr' type: 'PReLU'",
      "name: 'pr' type: 'PReLU' prelu_param { filler { type: 'uniform' min: -1 max: 1 } }",
      ("name: 'pr' type: 'PReLU' prelu_param { channel_shared: true filler { type: 'constant' "
       "value: -0.3 } }"),
  };
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    check_grad(params[i], &x, 1, 1, &kink);
    check_grad(params[i], &flat, 1, 1, &kink);
    expect_in_place_matches(params[i], x, &rng);
  }
  kiln_blob_free(flat);
  kiln_blob_free(x);
}

static void test_prelu_bad_shapes(void **state) {
  (void)state;
  kiln_blob *v = blob_of("v", 1, SHAPE(5), NULL);
  expect_create_fails("name: 'vec' type: 'PReLU'", TRAIN, &v, 1, 1, KILN_ERR_SHAPE,
                      "layer 'vec' (PReLU)", "at least 2 axes");
  kiln_blob_free(v);
  /* slopes made for 3 channels, then the input grows to 4 */
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 3, 2, 2), NULL);
  built p = build("name: 'grow' type: 'PReLU'", TRAIN, &x, 1, 1);
  assert_int_equal(kiln_blob_reshape(x, 4, SHAPE(2, 4, 2, 2)), KILN_OK);
  kiln_clear_error();
  assert_int_equal(p.l->ops->reshape(p.l), KILN_ERR_SHAPE);
  expect_message("layer 'grow' (PReLU)", "3 slopes", "4 channels");
  unbuild(&p);
  /* a shared slope follows any channel count */
  built s = build("name: 'shared' type: 'PReLU' prelu_param { channel_shared: true }", TRAIN, &x,
                  1, 1);
  assert_int_equal(kiln_blob_reshape(x, 4, SHAPE(2, 6, 2, 2)), KILN_OK);
  assert_int_equal(s.l->ops->reshape(s.l), KILN_OK);
  unbuild(&s);
  kiln_blob_free(x);
}

/* ---- in a net ---------------------------------------------------------------------------- */

/* The layers inside a net, in place where they can be, against finite differences of the net's
 * loss: data -> LRN -> PReLU (in place) -> ELU (in place) -> Power (in place) -> AbsVal (in
 * place) -> EuclideanLoss against a DummyData target, plus a SigmoidCrossEntropyLoss on the
 * data and an ArgMax that nothing consumes. The in-place chain overwrites each layer's output
 * with the next one's, so this also checks that no backward pass reads its own output. */
static void test_layers_in_a_net(void **state) {
  (void)state;
  const char *text =
      "name: 'n' force_backward: true "
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 4 dim: 3 "
      "dim: 3 } } } "
      "layer { name: 'tgt' type: 'DummyData' top: 'target' top: 'prob' dummy_data_param { "
      "shape { dim: 2 dim: 4 dim: 3 dim: 3 } data_filler { type: 'constant' value: 0.25 } "
      "data_filler { type: 'constant' value: 0.75 } } } "
      "layer { name: 'lrn' type: 'LRN' bottom: 'data' top: 'norm' lrn_param { local_size: 3 "
      "alpha: 0.5 } } "
      "layer { name: 'pr' type: 'PReLU' bottom: 'norm' top: 'norm' prelu_param { filler { "
      "type: 'uniform' min: -0.5 max: 0.5 } } } "
      "layer { name: 'elu' type: 'ELU' bottom: 'norm' top: 'norm' elu_param { alpha: -0.4 } } "
      "layer { name: 'pow' type: 'Power' bottom: 'norm' top: 'norm' power_param { power: 2 "
      "scale: 0.7 shift: 0.1 } } "
      "layer { name: 'abs' type: 'AbsVal' bottom: 'norm' top: 'norm' } "
      "layer { name: 'am' type: 'ArgMax' bottom: 'norm' top: 'best' } "
      "layer { name: 'eu' type: 'EuclideanLoss' bottom: 'norm' bottom: 'target' top: 'l2' } "
      "layer { name: 'sce' type: 'SigmoidCrossEntropyLoss' bottom: 'data' bottom: 'prob' "
      "top: 'xent' loss_weight: 0.5 } ";
  Caffe__NetParameter *np = NULL;
  if (kiln_net_param_from_text(text, "<net>", &np)) {
    print_error("parse: %s\n", kiln_last_error());
    fail();
  }
  kiln_net_options opt = {.phase = TRAIN, .seed = 5, .history_per_param = 1,
                          .config = kiln_test_net_config()};
  kiln_net *net = NULL;
  if (kiln_net_create(np, &opt, &net)) {
    print_error("net: %s\n", kiln_last_error());
    fail();
  }
  kiln_blob *data = kiln_net_blob(net, "data");
  assert_non_null(data);
  kiln_rng rng;
  kiln_rng_seed(&rng, 40, 1);
  /* |x| >= 0.1: no finite-difference step crosses the kinks of PReLU and ELU at 0 */
  for (int64_t i = 0; i < data->count; i++)
    data->data[i] = kiln_rng_uniform(&rng, 0.1f, 2) * (kiln_rng_below(&rng, 2) ? 1 : -1);
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_true(isfinite(loss));
  kiln_net_zero_param_diff(net);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  expect_shape(kiln_net_blob(net, "best"), 4, SHAPE(2, 1, 1, 1)); /* N x 1 x top_k, then 1s */
  /* d loss / d data and d loss / d slopes against central differences of the net's loss */
  kiln_layer *pr = kiln_net_layer(net, "pr");
  assert_non_null(pr);
  float *dx = malloc(sizeof(float) * (size_t)data->count);
  float da[4];
  assert_non_null(dx);
  memcpy(dx, data->diff, sizeof(float) * (size_t)data->count);
  memcpy(da, pr->param[0]->diff, sizeof da);
  const double step = 1e-2;
  int bad = 0;
  for (int64_t i = 0; i < data->count + 4; i++) {
    float *v = i < data->count ? &data->data[i] : &pr->param[0]->data[i - data->count];
    float keep = *v, up, down;
    *v = keep + (float)step;
    assert_int_equal(kiln_net_forward(net, &up), KILN_OK);
    *v = keep - (float)step;
    assert_int_equal(kiln_net_forward(net, &down), KILN_OK);
    *v = keep;
    double numeric = ((double)up - down) / (2 * step);
    double analytic = i < data->count ? dx[i] : da[i - data->count];
    if (fabs(numeric - analytic) > 2e-3 * fmax(1, fmax(fabs(numeric), fabs(analytic)))) {
      if (bad++ < 10)
        print_error("net gradient %lld: analytic %.6g numeric %.6g\n", (long long)i, analytic,
                    numeric);
    }
  }
  assert_int_equal(bad, 0);
  free(dx);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relu_forward_backward_hand),
      cmocka_unit_test(test_relu_gradients),
      cmocka_unit_test(test_relu_bad_parameters),
      cmocka_unit_test(test_sigmoid_tanh_hand),
      cmocka_unit_test(test_sigmoid_tanh_gradients),
      cmocka_unit_test(test_absval_hand),
      cmocka_unit_test(test_elu_hand),
      cmocka_unit_test(test_elu_reference),
      cmocka_unit_test(test_absval_elu_gradients),
      cmocka_unit_test(test_dropout_test_phase_identity),
      cmocka_unit_test(test_dropout_train_statistics),
      cmocka_unit_test(test_dropout_gradients),
      cmocka_unit_test(test_dropout_bad_parameters),
      cmocka_unit_test(test_power_hand),
      cmocka_unit_test(test_power_reference),
      cmocka_unit_test(test_power_gradients),
      cmocka_unit_test(test_prelu_hand),
      cmocka_unit_test(test_prelu_gradients),
      cmocka_unit_test(test_prelu_bad_shapes),
      cmocka_unit_test(test_layers_in_a_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
