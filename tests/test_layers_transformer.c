/* The transformer's layers on time-major T x N x D data: GELU. Forward passes against values
 * worked out by hand and against the definitions computed here in double precision; backward
 * passes against finite differences; in-place runs against out-of-place ones. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gelu_hand),
      cmocka_unit_test(test_gelu_reference),
      cmocka_unit_test(test_gelu_gradients),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
