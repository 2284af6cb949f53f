/* Caffe's element-wise layers beyond the common activations: Exp, Log, BNLL, Threshold and
 * Swish.
 * Forward and backward passes against values worked out by hand, finite-difference gradient
 * checks, in-place runs against out-of-place ones, the errors bad parameters give (a status and a
 * message naming the layer and the field), and Threshold's missing gradient inside a net (refused
 * when a backward pass needs it, as Caffe's NOT_IMPLEMENTED backward is). */
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

static const float act_x[5] = {-2, -0.5f, 0, 0.5f, 3};
static const float act_dy[5] = {1, 2, 3, 4, 5};

/* Runs `text` on x (1 x 5) out of place and in place with act_dy as the top gradient and
 * compares the output and the input gradient with the wanted ones (to `tol`); out of place, the
 * input must be left as it was. want_dx NULL: no backward pass. */
static void neuron_case(const char *text, const float *xv, const float *want_y,
                        const float *want_dx, double tol) {
  for (int in_place = 0; in_place < 2; in_place++) {
    kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), xv);
    kiln_blob *y = in_place ? x : kiln_blob_new("y");
    built r = build_on(text, TRAIN, &x, 1, &y, 1);
    char what[300];
    forward(&r);
    snprintf(what, sizeof what, "%s%s: y", text, in_place ? " (in place)" : "");
    expect_close(what, y->data, want_y, 5, tol);
    if (!in_place) expect_close("input kept", x->data, xv, 5, 0);
    if (want_dx) {
      memcpy(y->diff, act_dy, sizeof act_dy);
      if (!in_place) fill(x->diff, 5, 42);
      backward(&r);
      snprintf(what, sizeof what, "%s%s: dx", text, in_place ? " (in place)" : "");
      expect_close(what, x->diff, want_dx, 5, tol);
    }
    unbuild(&r);
    if (!in_place) kiln_blob_free(y);
    kiln_blob_free(x);
  }
}

/* ---- Exp --------------------------------------------------------------------------------- */

/* Default (base e): y = e^x = 0.13533528, 0.60653066, 1, 1.64872127, 20.08553692; dx = dy y.
 * base 2, scale 0.5, shift 1: y = 2^(1 + x/2) = 2^0, 2^0.75, 2^1, 2^1.25, 2^2.5
 *   = 1, 1.68179283, 2, 2.37841423, 5.65685425; dx = dy y ln(2) / 2.
 * base e with shift 1 (e^(1 + x), the outer factor is e, not (-1)^1): e^-1, e^0.5, e, e^1.5,
 *   e^4. */
static void test_exp_hand(void **state) {
  (void)state;
  float y[5], dx[5];
  const double e[5] = {0.13533528, 0.60653066, 1, 1.64872127, 20.08553692};
  for (int i = 0; i < 5; i++) y[i] = (float)e[i], dx[i] = (float)(act_dy[i] * e[i]);
  neuron_case("name: 'e' type: 'Exp'", act_x, y, dx, 1e-6);
  const double p2[5] = {1, 1.68179283, 2, 2.37841423, 5.65685425};
  for (int i = 0; i < 5; i++) y[i] = (float)p2[i], dx[i] = (float)(act_dy[i] * p2[i] * log(2) / 2);
  neuron_case("name: 'e' type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }", act_x, y, dx,
              1e-6);
  const double s1[5] = {0.36787944, 1.64872127, 2.71828183, 4.48168907, 54.59815003};
  for (int i = 0; i < 5; i++) y[i] = (float)s1[i], dx[i] = (float)(act_dy[i] * s1[i]);
  neuron_case("name: 'e' type: 'Exp' exp_param { shift: 1 }", act_x, y, dx, 1e-6);
  /* base 1: the constant 1, gradient 0 */
  const float ones[5] = {1, 1, 1, 1, 1}, zeros[5] = {0};
  neuron_case("name: 'e' type: 'Exp' exp_param { base: 1 scale: 3 shift: 2 }", act_x, ones, zeros,
              0);
}

/* ---- Log --------------------------------------------------------------------------------- */

/* Default (base e): y = ln x for x = 0.5, 1, 2, e, 10: -0.69314718, 0, 0.69314718, 1,
 *   2.30258509; dx = dy / x.
 * base 10, scale 2, shift 1 on x = 0, 4.5, 49.5, 0.05, 499.5 (shift + scale x = 1, 10, 100,
 *   1.1, 1000): y = 0, 1, 2, 0.04139269, 3; dx = dy 2 / (ln(10) (1 + 2x)). */
static void test_log_hand(void **state) {
  (void)state;
  const float x1[5] = {0.5f, 1, 2, 2.71828183f, 10};
  const float y1[5] = {-0.69314718f, 0, 0.69314718f, 1, 2.30258509f};
  float dx[5];
  for (int i = 0; i < 5; i++) dx[i] = act_dy[i] / x1[i];
  neuron_case("name: 'l' type: 'Log'", x1, y1, dx, 1e-6);
  const float x2[5] = {0, 4.5f, 49.5f, 0.05f, 499.5f};
  const float y2[5] = {0, 1, 2, 0.04139269f, 3};
  const double base[5] = {1, 10, 100, 1.1, 1000};
  for (int i = 0; i < 5; i++) dx[i] = (float)(act_dy[i] * 2 / (log(10) * base[i]));
  neuron_case("name: 'l' type: 'Log' log_param { base: 10 scale: 2 shift: 1 }", x2, y2, dx, 1e-6);
}

/* ---- BNLL -------------------------------------------------------------------------------- */

/* y = log(1 + e^x): 0.12692801, 0.47407698, 0.69314718, 0.97407698, 3.04858735;
 * dx = dy e^x / (1 + e^x) = dy sigmoid(x): 0.11920292, 0.37754067, 0.5, 0.62245933, 0.95257413
 * (times dy). Far from 0 the forward stays finite: y(100) = 100, y(-100) ~ 3.7e-44, and the
 * gradient of 100 (clamped at 50) is dy e^50 / (1 + e^50) = dy. */
static void test_bnll_hand(void **state) {
  (void)state;
  const float y[5] = {0.12692801f, 0.47407698f, 0.69314718f, 0.97407698f, 3.04858735f};
  const double s[5] = {0.11920292, 0.37754067, 0.5, 0.62245933, 0.95257413};
  float dx[5];
  for (int i = 0; i < 5; i++) dx[i] = (float)(act_dy[i] * s[i]);
  neuron_case("name: 'b' type: 'BNLL'", act_x, y, dx, 1e-6);
  const float big[5] = {100, -100, 60, -60, 0};
  const float ybig[5] = {100, 0, 60, 0, 0.69314718f};
  const float dbig[5] = {1, 0, 3, 0, 2.5f};
  neuron_case("name: 'b' type: 'BNLL'", big, ybig, dbig, 1e-6);
}

/* ---- Threshold --------------------------------------------------------------------------- */

/* y = 1 where x > threshold (strictly), else 0; the default threshold is 0. */
static void test_threshold_hand(void **state) {
  (void)state;
  neuron_case("name: 't' type: 'Threshold'", act_x, (const float[]){0, 0, 0, 1, 1}, NULL, 0);
  neuron_case("name: 't' type: 'Threshold' threshold_param { threshold: 0.5 }", act_x,
              (const float[]){0, 0, 0, 0, 1}, NULL, 0);
  neuron_case("name: 't' type: 'Threshold' threshold_param { threshold: -1 }", act_x,
              (const float[]){0, 1, 1, 1, 1}, NULL, 0);
  assert_null(kiln_layer_find("Threshold")->backward);
}

/* ---- gradients and in place ---------------------------------------------------------------- */

/* ---- Swish -------------------------------------------------------------------------------- */

/* y = x sigmoid(x), dy/dx = s + x s (1 - s) (beta 1); then beta 2 by finite differences. */
static void test_swish(void **state) {
  (void)state;
  neuron_case("name: 's' type: 'Swish'", act_x,
              (const float[]){-0.238405844f, -0.188770334f, 0, 0.311229666f, 2.857722380f},
              (const float[]){-0.090784249f, 0.520077625f, 1.5f, 2.959844749f, 5.440520530f},
              1e-6);
  kiln_rng rng;
  kiln_rng_seed(&rng, 62, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 3), -3, 3, &rng);
  check_grad("name: 's' type: 'Swish' swish_param { beta: 2 }", &x, 1, 1, NULL);
  check_grad("name: 's' type: 'Swish' swish_param { beta: -0.5 }", &x, 1, 1, NULL);
  expect_in_place_matches("name: 's' type: 'Swish' swish_param { beta: 1.5 }", x, &rng);
  kiln_blob_free(x);
}

static void test_exp_log_bnll_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 61, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 3), -2, 2, &rng);
  kiln_blob *pos = gc_blob("pos", 4, SHAPE(2, 3, 2, 3), 0.5f, 3, &rng);
  const char *exps[] = {
      "name: 'e' type: 'Exp'",
      "name: 'e' type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }",
      "name: 'e' type: 'Exp' exp_param { base: 0.3 scale: -1.2 shift: -0.4 }",
      "name: 'e' type: 'Exp' exp_param { shift: 0.7 scale: 0.9 }",
  };
  for (size_t i = 0; i < sizeof exps / sizeof exps[0]; i++) {
    check_grad(exps[i], &x, 1, 1, NULL);
    expect_in_place_matches(exps[i], x, &rng);
  }
  /* shift + scale x > 0 on [-2, 2] for the in-place runs (their second pass draws there) */
  const char *logs[] = {
      "name: 'l' type: 'Log' log_param { shift: 3 }",
      "name: 'l' type: 'Log' log_param { base: 2 scale: 0.5 shift: 2 }",
      "name: 'l' type: 'Log' log_param { base: 0.5 scale: -0.7 shift: 2 }",
  };
  check_grad("name: 'l' type: 'Log'", &pos, 1, 1, NULL);
  for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
    check_grad(logs[i], &x, 1, 1, NULL);
    expect_in_place_matches(logs[i], x, &rng);
  }
  check_grad("name: 'b' type: 'BNLL'", &x, 1, 1, NULL);
  expect_in_place_matches("name: 'b' type: 'BNLL'", x, &rng);
  kiln_blob_free(pos);
  kiln_blob_free(x);
}

static void test_exp_log_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), act_x);
  expect_create_fails("name: 'e0' type: 'Exp' exp_param { base: 0 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'e0' (Exp)", "exp_param.base 0");
  expect_create_fails("name: 'en' type: 'Exp' exp_param { base: -2 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'en' (Exp)", "exp_param.base -2");
  expect_create_fails("name: 'ei' type: 'Exp' exp_param { base: inf }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'ei' (Exp)", "exp_param.base inf");
  expect_create_fails("name: 'l1' type: 'Log' log_param { base: 1 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'l1' (Log)", "log_param.base 1");
  expect_create_fails("name: 'ln' type: 'Log' log_param { base: -0.5 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'ln' (Log)", "log_param.base -0.5");
  kiln_blob_free(x);
}

/* ---- in a net ---------------------------------------------------------------------------- */

static kiln_net *make_net(const char *text, int phase, Caffe__NetParameter **np) {
  if (kiln_net_param_from_text(text, "<net>", np)) {
    print_error("parse: %s\n", kiln_last_error());
    fail();
  }
  kiln_net_options opt = {.phase = phase, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *net = NULL;
  if (kiln_net_create(*np, &opt, &net)) {
    print_error("net: %s\n", kiln_last_error());
    fail();
  }
  return net;
}

/* d loss / d blob `name` of a net against central differences of its loss (step 1e-2, relative
 * tolerance 2e-3); the net has run forward and backward. */
static void expect_net_gradient(kiln_net *net, const char *name) {
  kiln_blob *b = kiln_net_blob(net, name);
  assert_non_null(b);
  float *g = malloc(sizeof(float) * (size_t)b->count);
  assert_non_null(g);
  memcpy(g, b->diff, sizeof(float) * (size_t)b->count);
  int bad = 0;
  for (int64_t i = 0; i < b->count; i++) {
    float keep = b->data[i], up, down;
    b->data[i] = keep + 1e-2f;
    assert_int_equal(kiln_net_forward(net, &up), KILN_OK);
    b->data[i] = keep - 1e-2f;
    assert_int_equal(kiln_net_forward(net, &down), KILN_OK);
    b->data[i] = keep;
    double numeric = ((double)up - down) / 2e-2;
    if (fabs(numeric - g[i]) > 2e-3 * fmax(1, fmax(fabs(numeric), fabs(g[i]))) && bad++ < 10)
      print_error("%s[%lld]: analytic %.6g numeric %.6g\n", name, (long long)i, g[i], numeric);
  }
  assert_int_equal(bad, 0);
  free(g);
}

/* An InnerProduct feeds Threshold feeds a loss: the forward pass runs (TRAIN and TEST), the
 * backward pass is refused with the layer and the bottom named; with propagate_down: false on
 * the Threshold, the gradient stops there and the backward pass runs. */
static void test_threshold_in_a_net(void **state) {
  (void)state;
  const char *fmt =
      "name: 'n' "
      "layer { name: 'in' type: 'Input' top: 'x' top: 't' input_param { shape { dim: 2 dim: 3 } "
      "shape { dim: 2 dim: 4 } } } "
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'h' inner_product_param { "
      "num_output: 4 weight_filler { type: 'gaussian' std: 0.5 } } } "
      "layer { name: 'th' type: 'Threshold' bottom: 'h' top: 's' %s } "
      "layer { name: 'l' type: 'EuclideanLoss' bottom: 's' bottom: 't' top: 'loss' } ";
  char text[2048];
  snprintf(text, sizeof text, fmt, "");
  for (int phase = TRAIN; phase <= TEST; phase++) {
    Caffe__NetParameter *np;
    kiln_net *net = make_net(text, phase, &np);
    float loss;
    assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
    if (phase == TRAIN) {
      kiln_clear_error();
      assert_int_equal(kiln_net_backward(net), KILN_ERR_UNSUPPORTED);
      expect_message("layer 'th' (Threshold)", "has no gradient", "bottom 'h'");
    }
    kiln_net_free(net);
    protobuf_c_message_free_unpacked(&np->base, NULL);
  }
  snprintf(text, sizeof text, fmt, "propagate_down: false");
  Caffe__NetParameter *np;
  kiln_net *net = make_net(text, TRAIN, &np);
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* BNLL, Exp, Log and MVN one after another in place on an InnerProduct's output,
 * mvn(ln(1 + e^(bnll(h) / 2))): each keeps what its backward pass needs (its input, or Exp's
 * and MVN's output) although the next overwrites the blob. The input gradient against finite
 * differences of the net's loss. */
static void test_chain_in_place_in_a_net(void **state) {
  (void)state;
  const char *text =
      "name: 'n' force_backward: true "
      "layer { name: 'in' type: 'Input' top: 'x' top: 't' input_param { shape { dim: 2 dim: 3 } "
      "shape { dim: 2 dim: 4 } } } "
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'h' inner_product_param { "
      "num_output: 4 weight_filler { type: 'gaussian' std: 0.5 } } } "
      "layer { name: 'bn' type: 'BNLL' bottom: 'h' top: 'h' } "
      "layer { name: 'ex' type: 'Exp' bottom: 'h' top: 'h' exp_param { scale: 0.5 } } "
      "layer { name: 'lg' type: 'Log' bottom: 'h' top: 'h' log_param { shift: 1 } } "
      "layer { name: 'mvn' type: 'MVN' bottom: 'h' top: 'h' mvn_param { across_channels: true } } "
      "layer { name: 'pw' type: 'Power' bottom: 'h' top: 'h' power_param { shift: 0.5 } } "
      "layer { name: 'l' type: 'EuclideanLoss' bottom: 'h' bottom: 't' top: 'loss' } ";
  Caffe__NetParameter *np;
  kiln_net *net = make_net(text, TRAIN, &np);
  kiln_blob *x = kiln_net_blob(net, "x");
  assert_non_null(x);
  kiln_rng rng;
  kiln_rng_seed(&rng, 62, 1);
  for (int64_t i = 0; i < x->count; i++) x->data[i] = kiln_rng_uniform(&rng, -2, 2);
  kiln_blob *t = kiln_net_blob(net, "t"); /* a target that makes the loss depend on x */
  for (int64_t i = 0; i < t->count; i++) t->data[i] = kiln_rng_uniform(&rng, -2, 2);
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_true(isfinite(loss) && loss > 0);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  expect_net_gradient(net, "x");
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exp_hand),
      cmocka_unit_test(test_log_hand),
      cmocka_unit_test(test_bnll_hand),
      cmocka_unit_test(test_threshold_hand),
      cmocka_unit_test(test_exp_log_bnll_gradients),
      cmocka_unit_test(test_swish),
      cmocka_unit_test(test_exp_log_bad_parameters),
      cmocka_unit_test(test_threshold_in_a_net),
      cmocka_unit_test(test_chain_in_place_in_a_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
