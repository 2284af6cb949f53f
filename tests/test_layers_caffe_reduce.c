/* Caffe's reductions over trailing axes: Reduction (SUM, ASUM, SUMSQ, MEAN, coeff) and MVN
 * (mean and variance normalisation per channel or per sample). Forward and backward passes
 * against values worked out by hand, finite-difference gradient checks, MVN in place, and the
 * errors bad parameters give. */
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

/* ---- Reduction --------------------------------------------------------------------------- */

static const float red_x[6] = {1, -2, 3, -4, 5, -6};

/* x (2, 3) = 1 -2 3 | -4 5 -6.
 *   axis 0 (the default), SUM: one value, -3, a blob with no axes;
 *   axis 1: SUM (2, -5); ASUM (6, 15); SUMSQ (1 + 4 + 9, 16 + 25 + 36) = (14, 77);
 *   MEAN (2/3, -5/3); SUM with coeff 2: (4, -10); axis -1 is axis 1.
 * Backward with dy = (1, 2): SUM coeff 2: 2 dy each; ASUM: sign(x) dy; SUMSQ: 2 x dy; MEAN:
 * dy / 3. */
static void test_reduction_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), red_x);
  built all = build("name: 'r' type: 'Reduction'", TRAIN, &x, 1, 1);
  forward(&all);
  expect_shape(all.top[0], 0, NULL);
  expect_close("sum of all", all.top[0]->data, (const float[]){-3}, 1, 1e-6);
  all.top[0]->diff[0] = 0.5f;
  backward(&all);
  expect_close("sum of all dx", x->diff, (const float[]){0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, 6, 0);
  unbuild(&all);
  const struct {
    const char *param;
    float y[2], dx[6];
  } cases[] = {
      {"axis: 1", {2, -5}, {1, 1, 1, 2, 2, 2}},
      {"axis: 1 operation: ASUM", {6, 15}, {1, -1, 1, -2, 2, -2}},
      {"axis: 1 operation: SUMSQ", {14, 77}, {2, -4, 6, -16, 20, -24}},
      {"axis: 1 operation: MEAN", {2.0f / 3, -5.0f / 3}, {1.0f / 3, 1.0f / 3, 1.0f / 3, 2.0f / 3,
                                                           2.0f / 3, 2.0f / 3}},
      {"axis: -1 coeff: 2", {4, -10}, {2, 2, 2, 4, 4, 4}},
      {"axis: 1 operation: ASUM coeff: -0.5", {-3, -7.5f}, {-0.5f, 0.5f, -0.5f, 1, -1, 1}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char text[200];
    snprintf(text, sizeof text, "name: 'r' type: 'Reduction' reduction_param { %s }",
             cases[k].param);
    built r = build(text, TRAIN, &x, 1, 1);
    forward(&r);
    expect_shape(r.top[0], 1, SHAPE(2));
    expect_close(text, r.top[0]->data, cases[k].y, 2, 1e-6);
    r.top[0]->diff[0] = 1;
    r.top[0]->diff[1] = 2;
    fill(x->diff, 6, 99);
    backward(&r);
    expect_close(text, x->diff, cases[k].dx, 6, 1e-6);
    unbuild(&r);
  }
  /* ASUM's gradient at 0 is 0 (Caffe's sign) */
  kiln_blob *z = blob_of("z", 1, SHAPE(3), (const float[]){0, 2, -1});
  built a = build("name: 'r' type: 'Reduction' reduction_param { operation: ASUM }", TRAIN, &z, 1,
                  1);
  forward(&a);
  a.top[0]->diff[0] = 1;
  backward(&a);
  expect_close("asum at 0", z->diff, (const float[]){0, 1, -1}, 3, 0);
  unbuild(&a);
  kiln_blob_free(z);
  kiln_blob_free(x);
}

static void test_reduction_gradients_and_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 81, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -2, 2, &rng);
  const char *ops[] = {"SUM", "ASUM", "SUMSQ", "MEAN"};
  const char *axes[] = {"axis: 0", "axis: 1", "axis: 2 coeff: 1.5", "axis: -1 coeff: -0.7"};
  gradcheck_opts kink = {.kink = 0, .kink_range = 0.02f};
  for (int o = 0; o < 4; o++)
    for (int a = 0; a < 4; a++) {
      char text[200];
      snprintf(text, sizeof text,
               "name: 'r' type: 'Reduction' reduction_param { operation: %s %s }", ops[o],
               axes[a]);
      check_grad(text, &x, 1, 1, &kink);
    }
  expect_create_fails("name: 'ax' type: 'Reduction' reduction_param { axis: 4 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'ax' (Reduction)", "reduction_param.axis 4");
  kiln_blob_free(x);
}

/* ---- MVN --------------------------------------------------------------------------------- */

/* x (1, 2, 1, 3): channel 0 = 1 2 3 (mean 2, var 2/3, sd 0.81649658), channel 1 = 2 4 12
 * (mean 6, deviations -4 -2 6, var 56/3, sd 4.32049379):
 *   y = -1.22474487 0 1.22474487 | -0.92582010 -0.46291005 1.38873015.
 * across_channels: all six values, mean 4, deviations -3 -2 -1 -2 0 8, var 82/6, sd 3.69684550.
 * normalize_variance false: y = the deviations, dx = dy - mean(dy). */
static void test_mvn_hand(void **state) {
  (void)state;
  const float xv[6] = {1, 2, 3, 2, 4, 12};
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 2, 1, 3), xv);
  built m = build("name: 'm' type: 'MVN'", TRAIN, &x, 1, 1);
  forward(&m);
  expect_close("mvn", m.top[0]->data,
               (const float[]){-1.22474487f, 0, 1.22474487f, -0.92582010f, -0.46291005f,
                               1.38873015f},
               6, 1e-6);
  unbuild(&m);
  built a = build("name: 'm' type: 'MVN' mvn_param { across_channels: true }", TRAIN, &x, 1, 1);
  forward(&a);
  float want[6];
  const float dev[6] = {-3, -2, -1, -2, 0, 8};
  for (int i = 0; i < 6; i++) want[i] = dev[i] / 3.69684550f;
  expect_close("mvn across channels", a.top[0]->data, want, 6, 1e-6);
  unbuild(&a);
  built c = build("name: 'm' type: 'MVN' mvn_param { normalize_variance: false }", TRAIN, &x, 1, 1);
  forward(&c);
  expect_close("mvn mean only", c.top[0]->data, (const float[]){-1, 0, 1, -4, -2, 6}, 6, 1e-6);
  memcpy(c.top[0]->diff, (const float[]){1, 2, 6, 0, 3, 3}, 6 * sizeof(float));
  backward(&c);
  expect_close("mvn mean only dx", x->diff, (const float[]){-2, -1, 3, -2, 1, 1}, 6, 1e-6);
  unbuild(&c);
  /* eps adds to the standard deviation: 1 3 has sd 1, with eps 1 y = -1/2 1/2 */
  kiln_blob *e = blob_of("e", 2, SHAPE(1, 2), (const float[]){1, 3});
  built ec = build("name: 'm' type: 'MVN' mvn_param { eps: 1 across_channels: true }", TRAIN, &e,
                   1, 1);
  forward(&ec);
  expect_close("mvn eps", ec.top[0]->data, (const float[]){-0.5f, 0.5f}, 2, 1e-7);
  unbuild(&ec);
  kiln_blob_free(e);
  /* A constant row has no spread: y = 0 / (0 + eps) = 0. */
  kiln_blob *k = blob_of("k", 2, SHAPE(1, 4), (const float[]){3, 3, 3, 3});
  built kc = build("name: 'm' type: 'MVN' mvn_param { across_channels: true }", TRAIN, &k, 1,
                   1);
  forward(&kc);
  expect_close("mvn constant", kc.top[0]->data, (const float[4]){0}, 4, 0);
  unbuild(&kc);
  kiln_blob_free(k);
  kiln_blob_free(x);
}

static void test_mvn_gradients_in_place(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 82, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 3), -2, 2, &rng);
  kiln_blob *flat = gc_blob("flat", 2, SHAPE(3, 5), -2, 2, &rng);
  const char *texts[] = {
      "name: 'm' type: 'MVN'",
      "name: 'm' type: 'MVN' mvn_param { across_channels: true }",
      "name: 'm' type: 'MVN' mvn_param { normalize_variance: false }",
      "name: 'm' type: 'MVN' mvn_param { normalize_variance: false across_channels: true }",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    check_grad(texts[i], &x, 1, 1, NULL);
    expect_in_place_matches(texts[i], x, &rng);
  }
  check_grad("name: 'm' type: 'MVN' mvn_param { across_channels: true }", &flat, 1, 1, NULL);
  kiln_blob_free(flat);
  kiln_blob_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduction_hand),
      cmocka_unit_test(test_reduction_gradients_and_errors),
      cmocka_unit_test(test_mvn_hand),
      cmocka_unit_test(test_mvn_gradients_in_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
