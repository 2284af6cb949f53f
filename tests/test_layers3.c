/* Layers LRN, Power, AbsVal, ELU, PReLU, ArgMax, EuclideanLoss, SigmoidCrossEntropyLoss and
 * DummyData: forward passes against values worked out by hand (and, for ELU, Power and LRN,
 * against the formula in double precision on random input), backward passes against finite
 * differences (tests/support/gradcheck.c), in-place runs against out-of-place ones, and the
 * errors that bad parameters and shapes give (a status and a message naming the layer). */
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

/* ---- helpers ----------------------------------------------------------------------------- */

/* Like expect_close against double references, with a relative tolerance. */
static void expect_rel(const char *what, const float *got, const double *want, int64_t n,
                       double rel) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= rel * fmax(1e-3, fabs(want[i])))) {
      print_error("%s[%lld]: got %.9g, want %.12g\n", what, (long long)i, (double)got[i],
                  want[i]);
      fail();
    }
}

/* Runs `text` on a copy of `x` out of place and on another copy in place, with the same top
 * gradient, twice each (the second pass checks that a saved input is refreshed, and that
 * parameter gradients accumulate alike); outputs, input gradients and parameter gradients must
 * agree exactly. */
static void expect_in_place_matches(const char *text, const kiln_blob *x, kiln_rng *rng) {
  kiln_blob *a = blob_copy("a", x), *b = blob_copy("b", x);
  built out = build(text, TRAIN, &a, 1, 1);
  built in = build_on(text, TRAIN, &b, 1, &b, 1);
  for (int p = 0; p < out.l->nparam; p++) {
    set_params(&in, p, out.l->param[p]->data);
    fill(out.l->param[p]->diff, out.l->param[p]->count, 0);
    fill(in.l->param[p]->diff, in.l->param[p]->count, 0);
  }
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) { /* new input values, same shape */
      for (int64_t i = 0; i < x->count; i++) a->data[i] = kiln_rng_uniform(rng, -2, 2);
      memcpy(b->data, a->data, sizeof(float) * (size_t)x->count);
    }
    forward(&out);
    forward(&in);
    char what[300];
    snprintf(what, sizeof what, "%s: in-place output (pass %d)", text, pass);
    expect_close(what, b->data, out.top[0]->data, x->count, 0);
    for (int64_t i = 0; i < x->count; i++)
      out.top[0]->diff[i] = b->diff[i] = kiln_rng_uniform(rng, -1, 1);
    fill(a->diff, x->count, 1e3f);
    backward(&out);
    backward(&in);
    snprintf(what, sizeof what, "%s: in-place input gradient (pass %d)", text, pass);
    expect_close(what, b->diff, a->diff, x->count, 0);
    for (int p = 0; p < out.l->nparam; p++) {
      snprintf(what, sizeof what, "%s: in-place param %d gradient (pass %d)", text, p, pass);
      expect_close(what, in.l->param[p]->diff, out.l->param[p]->diff, out.l->param[p]->count, 0);
    }
  }
  unbuild(&in);
  unbuild(&out);
  kiln_blob_free(a);
  kiln_blob_free(b);
}

/* ---- LRN --------------------------------------------------------------------------------- */

/* ACROSS_CHANNELS on 1x3x1x1, x = (1, 2, 3), local_size 3, alpha 3 (alpha / n = 1), beta 1, k 2:
 *   s0 = 2 + 0 + 1 + 4 = 7, s1 = 2 + 1 + 4 + 9 = 16, s2 = 2 + 4 + 9 + 0 = 15
 *   y = x / s = 1/7, 2/16, 3/15
 * Backward with dy = (1, 0, 0): y0 = x0 / (2 + x0^2 + x1^2) only depends on x0 and x1:
 *   dx0 = (s0 - 2 x0^2) / s0^2 = 5/49, dx1 = -2 x0 x1 / s0^2 = -4/49, dx2 = 0. */
static void test_lrn_across_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 3, 1, 1), (const float[]){1, 2, 3});
  built l = build("name: 'n' type: 'LRN' lrn_param { local_size: 3 alpha: 3 beta: 1 k: 2 }",
                  TRAIN, &x, 1, 1);
  forward(&l);
  expect_shape(l.top[0], 4, SHAPE(1, 3, 1, 1));
  expect_close("lrn across y", l.top[0]->data, (const float[]){1.0f / 7, 2.0f / 16, 3.0f / 15}, 3,
               1e-6);
  memcpy(l.top[0]->diff, (const float[]){1, 0, 0}, 3 * sizeof(float));
  fill(x->diff, 3, 1e3f);
  backward(&l);
  expect_close("lrn across dx", x->diff, (const float[]){5.0f / 49, -4.0f / 49, 0}, 3, 1e-6);
  unbuild(&l);
  kiln_blob_free(x);
}

/* WITHIN_CHANNEL on the 3x3 plane 1..9, local_size 3, alpha 9 (alpha / 9 = 1), beta 1; k 5 is
 * ignored (Caffe's form is 1 + alpha * average over the zero-padded 3x3 window, divisor always 9):
 *   s = 1 + sum of the squares in the clipped window around each element:
 *   (0,0) 1+4+16+25 = 46 -> 47      (0,1) 91 -> 92      (0,2) 4+9+25+36 = 74 -> 75
 *   (1,0) 159 -> 160                (1,1) 285 -> 286    (1,2) 219 -> 220
 *   (2,0) 16+25+49+64 = 154 -> 155  (2,1) 271 -> 272    (2,2) 25+36+64+81 = 206 -> 207
 *   y = x / s. */
static void test_lrn_within_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 3, 3), (const float[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
  built l = build("name: 'w' type: 'LRN' lrn_param { local_size: 3 alpha: 9 beta: 1 k: 5 "
                  "norm_region: WITHIN_CHANNEL }",
                  TRAIN, &x, 1, 1);
  forward(&l);
  const float s[9] = {47, 92, 75, 160, 286, 220, 155, 272, 207};
  float want[9];
  for (int i = 0; i < 9; i++) want[i] = (float)(i + 1) / s[i];
  expect_close("lrn within y", l.top[0]->data, want, 9, 1e-6);
  /* dy = 1 at (0,0) only: y00 = x00 / (1 + x00^2 + x01^2 + x10^2 + x11^2), so
   * dx00 = (47 - 2) / 47^2, dx01 = -2*1*2 / 47^2, dx10 = -2*1*4 / 47^2, dx11 = -2*1*5 / 47^2. */
  fill(l.top[0]->diff, 9, 0);
  l.top[0]->diff[0] = 1;
  fill(x->diff, 9, 1e3f);
  backward(&l);
  const float q = 47.0f * 47.0f;
  expect_close("lrn within dx", x->diff,
               (const float[]){45 / q, -4 / q, 0, -8 / q, -10 / q, 0, 0, 0, 0}, 9, 1e-6);
  unbuild(&l);
  kiln_blob_free(x);
}

/* Caffe's definition in double: ACROSS sums the zero-padded channel window; WITHIN is
 * 1 + alpha * AVE-pool(x^2) with kernel local_size, stride 1, pad (local_size - 1) / 2, where the
 * pool divides by the window clipped to the padded input (Caffe's pooling rule). */
static void lrn_reference(double *y, const float *x, int64_t N, int64_t C, int64_t H, int64_t W,
                          int size, double alpha, double beta, double k, bool across) {
  int pad = (size - 1) / 2;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
          double scale;
          if (across) {
            double sum = 0;
            for (int64_t cc = c - pad; cc <= c + pad; cc++)
              if (cc >= 0 && cc < C) {
                double v = x[((n * C + cc) * H + h) * W + w];
                sum += v * v;
              }
            scale = k + alpha / size * sum;
          } else {
            int64_t hs = h - pad, ws = w - pad;
            int64_t he = hs + size < H + pad ? hs + size : H + pad;
            int64_t we = ws + size < W + pad ? ws + size : W + pad;
            double pool_size = (double)((he - hs) * (we - ws));
            double sum = 0;
            for (int64_t hh = hs < 0 ? 0 : hs; hh < (he > H ? H : he); hh++)
              for (int64_t ww = ws < 0 ? 0 : ws; ww < (we > W ? W : we); ww++) {
                double v = x[((n * C + c) * H + hh) * W + ww];
                sum += v * v;
              }
            scale = 1 + alpha * (sum / pool_size);
          }
          int64_t i = ((n * C + c) * H + h) * W + w;
          y[i] = x[i] * pow(scale, -beta);
        }
}

static void test_lrn_reference(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 31, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 7, 5, 6), -2, 2, &rng);
  double *want = malloc(sizeof(double) * (size_t)x->count);
  assert_non_null(want);
  const struct {
    int size;
    double alpha, beta, k;
    bool across;
  } cases[] = {
      {5, 1, 0.75, 1, true},     {3, 1e-4, 0.75, 2, true}, {1, 2, 0.5, 1, true},
      {9, 0.5, 1.5, 1.5, true},  {3, 1, 0.75, 1, false},   {5, 3, 0.6, 7, false},
      {1, 0.5, 2, 1, false},     {7, 0.2, 0.75, 1, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[256];
    snprintf(text, sizeof text,
             "name: 'n' type: 'LRN' lrn_param { local_size: %d alpha: %.9g beta: %.9g k: %.9g "
             "norm_region: %s }",
             cases[i].size, cases[i].alpha, cases[i].beta, cases[i].k,
             cases[i].across ? "ACROSS_CHANNELS" : "WITHIN_CHANNEL");
    built l = build(text, TRAIN, &x, 1, 1);
    forward(&l);
    lrn_reference(want, x->data, 2, 7, 5, 6, cases[i].size, (float)cases[i].alpha,
                  (float)cases[i].beta, (float)cases[i].k, cases[i].across);
    expect_rel(text, l.top[0]->data, want, x->count, 2e-6);
    unbuild(&l);
  }
  free(want);
  kiln_blob_free(x);
}

static void test_lrn_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 32, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 5, 3, 4), -1.5f, 1.5f, &rng);
  const char *params[] = {
      "local_size: 1",
      "local_size: 3",
      "",                                          /* Caffe's defaults: 5, 1, 0.75, 1 */
      "local_size: 7 alpha: 2 beta: 1.5 k: 2",     /* window wider than the 5 channels */
      "local_size: 3 alpha: 0.5 beta: 0.6 k: 0.8",
      "local_size: 1 norm_region: WITHIN_CHANNEL",
      "local_size: 3 norm_region: WITHIN_CHANNEL",
      "local_size: 5 alpha: 2 beta: 1 norm_region: WITHIN_CHANNEL", /* wider than H = 3 */
  };
  char text[256];
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    snprintf(text, sizeof text, "name: 'n' type: 'LRN' lrn_param { %s }", params[i]);
    check_grad(text, &x, 1, 1, NULL);
    expect_in_place_matches(text, x, &rng);
  }
  kiln_blob_free(x);
}

static void test_lrn_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 3, 2, 2), NULL);
  expect_create_fails("name: 'even' type: 'LRN' lrn_param { local_size: 4 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'even' (LRN)", "local_size 4 must be odd");
  expect_create_fails("name: 'even2' type: 'LRN' lrn_param { local_size: 2 norm_region: "
                      "WITHIN_CHANNEL }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'even2' (LRN)", "odd");
  expect_create_fails("name: 'zero' type: 'LRN' lrn_param { local_size: 0 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'zero' (LRN)", "odd");
  kiln_blob_free(x);
  kiln_blob *flat = blob_of("flat", 2, SHAPE(2, 6), NULL);
  expect_create_fails("name: 'flat' type: 'LRN'", TRAIN, &flat, 1, 1, KILN_ERR_SHAPE,
                      "layer 'flat' (LRN)", "4 axes");
  kiln_blob_free(flat);
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

/* ---- AbsVal and ELU ---------------------------------------------------------------------- */

static const float act_x[5] = {-2, -0.5f, 0, 0.5f, 3};
static const float act_dy[5] = {1, 2, 3, 4, 5};

static void neuron_case(const char *text, bool in_place, const float *want_y,
                        const float *want_dx) {
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), act_x);
  kiln_blob *y = in_place ? x : kiln_blob_new("y");
  built r = build_on(text, TRAIN, &x, 1, &y, 1);
  forward(&r);
  expect_close(text, y->data, want_y, 5, 1e-6);
  if (!in_place) expect_close("input kept", x->data, act_x, 5, 0);
  memcpy(y->diff, act_dy, sizeof act_dy);
  if (!in_place) fill(x->diff, 5, 42);
  backward(&r);
  expect_close(text, x->diff, want_dx, 5, 1e-6);
  unbuild(&r);
  if (!in_place) kiln_blob_free(y);
  kiln_blob_free(x);
}

/* |x|; dx = sign(x) dy with sign(0) = 0. */
static void test_absval_hand(void **state) {
  (void)state;
  const float y[5] = {2, 0.5f, 0, 0.5f, 3}, dx[5] = {-1, -2, 0, 4, 5};
  neuron_case("name: 'a' type: 'AbsVal'", false, y, dx);
  neuron_case("name: 'a' type: 'AbsVal'", true, y, dx);
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
    neuron_case(text, false, y, dx);
    neuron_case(text, true, y, dx);
  }
  /* no elu_param: alpha 1 */
  const float y1[5] = {(float)(e2 - 1), (float)(e05 - 1), 0, 0.5f, 3};
  const float dx1[5] = {(float)e2, (float)(2 * e05), 3, 4, 5};
  neuron_case("name: 'e' type: 'ELU'", false, y1, dx1);
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
      "name: 'pr' type: 'PReLU' prelu_param { channel_shared: true filler { type: 'constant' "
      "value: -0.3 } }",
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

/* ---- ArgMax ------------------------------------------------------------------------------ */

/* Runs ArgMax with `param` (inside argmax_param) on x and compares the top with want, which has
 * the shape the top must have. */
static void argmax_expect(const char *what, const char *param, kiln_blob *x, int naxes,
                          const int64_t *shape, const float *want) {
  char text[256];
  snprintf(text, sizeof text, "name: 'am' type: 'ArgMax' argmax_param { %s }", param);
  built a = build(text, TRAIN, &x, 1, 1);
  forward(&a);
  expect_shape(a.top[0], naxes, shape);
  expect_close(what, a.top[0]->data, want, a.top[0]->count, 0);
  unbuild(&a);
}

/* Items (1, 3, 2, 3, 0) and (5, 4, 6, 0, 1). Ties put the larger index first (Caffe sorts
 * (value, index) pairs in descending order): item 0's maximum 3 is at index 3. */
static void test_argmax_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 5), (const float[]){1, 3, 2, 3, 0, 5, 4, 6, 0, 1});
  built a = build("name: 'am' type: 'ArgMax'", TRAIN, &x, 1, 1);
  assert_null(a.l->ops->backward);
  forward(&a);
  expect_shape(a.top[0], 3, SHAPE(2, 1, 1));
  expect_close("argmax", a.top[0]->data, (const float[]){3, 2}, 2, 0);
  unbuild(&a);

  /* top_k 2 with values: per item the k indices, then the k values */
  argmax_expect("argmax top2 values", "top_k: 2 out_max_val: true", x, 3, SHAPE(2, 2, 2),
                (const float[]){3, 1, 3, 3, 2, 0, 6, 5});
  /* top_k 5: the whole order */
  argmax_expect("argmax top5", "top_k: 5", x, 3, SHAPE(2, 1, 5),
                (const float[]){3, 1, 2, 0, 4, 2, 0, 1, 4, 3});
  kiln_blob_free(x);

  /* Four axes without axis: each item's count(1) values; the top keeps 4 axes. */
  kiln_blob *x4 = blob_of("x4", 4, SHAPE(2, 1, 2, 2), (const float[]){0, 7, 1, 2, 9, 8, -1, 9});
  argmax_expect("argmax 4-d", "top_k: 3", x4, 4, SHAPE(2, 1, 3, 1),
                (const float[]){1, 3, 2, 3, 0, 1});
  kiln_blob_free(x4);
}

/* With axis: x is 2x3x2 (n, c, w), ranked along c for each (n, w):
 *   n0: c0 = (1, 9), c1 = (5, 2), c2 = (3, 7):  w0 ranks 1, 2 (5, 3); w1 ranks 0, 2 (9, 7)
 *   n1: c0 = (0, 0), c1 = (4, -1), c2 = (4, 8): w0 ranks 2, 1 (4, 4: tie, larger index first);
 *                                                 w1 ranks 2, 0 (8, 0)
 * The top is 2x2x2 (n, rank, w). */
static void test_argmax_axis_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 3, 2),
                         (const float[]){1, 9, 5, 2, 3, 7, 0, 0, 4, -1, 4, 8});
  argmax_expect("argmax axis", "axis: 1 top_k: 2", x, 3, SHAPE(2, 2, 2),
                (const float[]){1, 0, 2, 2, 2, 2, 1, 0});
  argmax_expect("argmax axis values", "axis: 1 top_k: 2 out_max_val: true", x, 3, SHAPE(2, 2, 2),
                (const float[]){5, 9, 3, 7, 4, 8, 4, 0});
  /* axis -1 (w, 2 values) with top_k 1: n0: c0 -> 1, c1 -> 0, c2 -> 1; n1: 1 (tie), 0, 1 */
  argmax_expect("argmax axis -1", "axis: -1", x, 3, SHAPE(2, 3, 1),
                (const float[]){1, 0, 1, 1, 0, 1});
  kiln_blob_free(x);
}

static void test_argmax_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 3, 2), NULL);
  expect_create_fails("name: 'big' type: 'ArgMax' argmax_param { axis: 1 top_k: 4 }", TRAIN, &x,
                      1, 1, KILN_ERR_INVALID, "layer 'big' (ArgMax)", "top_k 4");
  expect_create_fails("name: 'big2' type: 'ArgMax' argmax_param { top_k: 7 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'big2' (ArgMax)", "top_k 7");
  expect_create_fails("name: 'k0' type: 'ArgMax' argmax_param { top_k: 0 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'k0' (ArgMax)", "top_k");
  expect_create_fails("name: 'ax' type: 'ArgMax' argmax_param { axis: 3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'ax' (ArgMax)", "axis 3");
  /* top_k 6 = count(1) is allowed */
  built ok = build("name: 'all' type: 'ArgMax' argmax_param { top_k: 6 }", TRAIN, &x, 1, 1);
  unbuild(&ok);
  kiln_blob_free(x);
}

/* ---- EuclideanLoss ----------------------------------------------------------------------- */

/* a = (1, 2, 3, 4), b = (0, 2, 5, 1) as 2x2: a - b = (1, 0, -2, 3), sum of squares 14,
 * L = 14 / (2 * 2) = 3.5. With loss weight 2 in the top's diff: da = 2 / 2 (a - b), db = -da. */
static void test_euclidean_hand(void **state) {
  (void)state;
  kiln_blob *a = blob_of("a", 2, SHAPE(2, 2), (const float[]){1, 2, 3, 4});
  kiln_blob *b = blob_of("b", 2, SHAPE(2, 2), (const float[]){0, 2, 5, 1});
  kiln_blob *ab[2] = {a, b};
  built e = build("name: 'eu' type: 'EuclideanLoss' loss_weight: 2", TRAIN, ab, 2, 1);
  assert_float_equal(e.l->loss_weight[0], 2.0f, 0);
  forward(&e);
  expect_shape(e.top[0], 0, NULL);
  expect_close("euclidean loss", e.top[0]->data, (const float[]){3.5f}, 1, 1e-6);
  e.top[0]->diff[0] = e.l->loss_weight[0];
  fill(a->diff, 4, 1e3f);
  fill(b->diff, 4, 1e3f);
  backward(&e);
  expect_close("euclidean da", a->diff, (const float[]){1, 0, -2, 3}, 4, 1e-6);
  expect_close("euclidean db", b->diff, (const float[]){-1, 0, 2, -3}, 4, 1e-6);
  /* only the second input */
  e.l->propagate_down[0] = false;
  fill(a->diff, 4, 7);
  backward(&e);
  expect_close("euclidean da untouched", a->diff, (const float[]){7, 7, 7, 7}, 4, 0);
  expect_close("euclidean db again", b->diff, (const float[]){-1, 0, 2, -3}, 4, 1e-6);
  unbuild(&e);
  /* the same count per item in another shape is accepted (Caffe compares count(1)) */
  kiln_blob *c = blob_of("c", 3, SHAPE(2, 2, 1), (const float[]){0, 2, 5, 1});
  kiln_blob *ac[2] = {a, c};
  built f = build("name: 'eu' type: 'EuclideanLoss'", TRAIN, ac, 2, 1);
  forward(&f);
  expect_close("euclidean reshaped", f.top[0]->data, (const float[]){3.5f}, 1, 1e-6);
  unbuild(&f);
  kiln_blob_free(c);
  kiln_blob_free(b);
  kiln_blob_free(a);
}

static void test_euclidean_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 38, 1);
  kiln_blob *a = gc_blob("a", 4, SHAPE(3, 2, 2, 3), -2, 2, &rng);
  kiln_blob *b = gc_blob("b", 4, SHAPE(3, 2, 2, 3), -2, 2, &rng);
  kiln_blob *ab[2] = {a, b};
  check_grad("name: 'eu' type: 'EuclideanLoss'", ab, 2, 1, NULL);
  check_grad("name: 'eu' type: 'EuclideanLoss' loss_weight: 3", ab, 2, 1, NULL);
  gradcheck_opts second = {.bottom_mask = 2};
  check_grad("name: 'eu' type: 'EuclideanLoss'", ab, 2, 1, &second);
  kiln_blob_free(b);
  kiln_blob_free(a);
}

static void test_euclidean_bad_shapes(void **state) {
  (void)state;
  kiln_blob *a = blob_of("a", 2, SHAPE(2, 3), NULL);
  kiln_blob *b = blob_of("b", 2, SHAPE(2, 2), NULL);
  kiln_blob *c = blob_of("c", 2, SHAPE(3, 2), NULL); /* same count as a, other first axis */
  kiln_blob *ab[2] = {a, b}, *ac[2] = {a, c};
  expect_create_fails("name: 'eu1' type: 'EuclideanLoss'", TRAIN, ab, 2, 1, KILN_ERR_SHAPE,
                      "layer 'eu1' (EuclideanLoss)", "count 6");
  expect_create_fails("name: 'eu2' type: 'EuclideanLoss'", TRAIN, ac, 2, 1, KILN_ERR_SHAPE,
                      "layer 'eu2' (EuclideanLoss)", "do not match");
  expect_create_fails("name: 'eu3' type: 'EuclideanLoss'", TRAIN, ab, 1, 1, KILN_ERR_INVALID,
                      "layer 'eu3' (EuclideanLoss)", "bottom");
  kiln_blob_free(c);
  kiln_blob_free(b);
  kiln_blob_free(a);
}

/* ---- SigmoidCrossEntropyLoss ------------------------------------------------------------- */

/* x = (0, 2, -1, 3), t = (1, 0, 0.5, 1) as 2x2; l = max(x, 0) - x t + log(1 + exp(-|x|)):
 *   log 2 = 0.693147181;  2 + log(1 + e^-2) = 2.126928011;
 *   0.5 + log(1 + e^-1) = 0.813261687;  log(1 + e^-3) = 0.048587352;  sum 3.681924231.
 * sigmoid(x) - t = -0.5, 0.880797078, -0.231058579, -0.047425873. */
static const float sce_x[4] = {0, 2, -1, 3}, sce_t[4] = {1, 0, 0.5f, 1};
static const double sce_l[4] = {0.693147181, 2.126928011, 0.813261687, 0.048587352};
static const double sce_g[4] = {-0.5, 0.880797078, -0.231058579, -0.047425873};

static void sce_case(const char *param, const bool *counted, double normalizer) {
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 2), sce_x);
  kiln_blob *t = blob_of("t", 2, SHAPE(2, 2), sce_t);
  kiln_blob *xt[2] = {x, t};
  char text[256];
  snprintf(text, sizeof text, "name: 'sce' type: 'SigmoidCrossEntropyLoss' loss_weight: 2 %s",
           param);
  built s = build(text, TRAIN, xt, 2, 1);
  forward(&s);
  expect_shape(s.top[0], 0, NULL);
  double loss = 0;
  float dx[4];
  for (int i = 0; i < 4; i++) {
    loss += counted[i] ? sce_l[i] : 0;
    dx[i] = counted[i] ? (float)(sce_g[i] * 2 / normalizer) : 0;
  }
  expect_close(text, s.top[0]->data, (const float[]){(float)(loss / normalizer)}, 1, 1e-6);
  s.top[0]->diff[0] = s.l->loss_weight[0];
  s.l->propagate_down[1] = false;
  fill(x->diff, 4, 1e3f);
  backward(&s);
  expect_close(text, x->diff, dx, 4, 1e-6);
  unbuild(&s);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

static void test_sigmoid_ce_hand(void **state) {
  (void)state;
  const bool all[4] = {true, true, true, true};
  /* Caffe's default for this layer is BATCH_SIZE (N = 2), not VALID */
  sce_case("", all, 2);
  sce_case("loss_param { normalization: FULL }", all, 4);
  sce_case("loss_param { normalization: NONE }", all, 1);
  sce_case("loss_param { normalization: VALID }", all, 4);
  sce_case("loss_param { normalize: true }", all, 4);
  sce_case("loss_param { normalize: false }", all, 2);
  /* ignore_label 1: targets 1 are skipped, VALID counts the other two */
  const bool not_ones[4] = {false, true, true, false};
  sce_case("loss_param { ignore_label: 1 normalization: VALID }", not_ones, 2);
  sce_case("loss_param { ignore_label: 1 normalization: FULL }", not_ones, 4);
  /* ignore_label 0 compares the truncated target: 0 and 0.5 are both skipped (as in Caffe) */
  const bool ones[4] = {true, false, false, true};
  sce_case("loss_param { ignore_label: 0 normalize: true }", ones, 2);
  /* everything ignored: the normaliser stays at least 1, loss 0 */
  const bool none[4] = {false, false, false, false};
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 2), sce_x);
  kiln_blob *t = blob_of("t", 2, SHAPE(2, 2), (const float[]){1, 1, 1, 1});
  kiln_blob *xt[2] = {x, t};
  built s = build("name: 's' type: 'SigmoidCrossEntropyLoss' loss_param { ignore_label: 1 "
                  "normalization: VALID }",
                  TRAIN, xt, 2, 1);
  forward(&s);
  expect_close("all ignored", s.top[0]->data, (const float[]){0}, 1, 0);
  (void)none;
  unbuild(&s);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

/* Large |x| neither overflows nor loses the loss: l(100, 0) = l(-100, 1) = 100. */
static void test_sigmoid_ce_stable(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 4), (const float[]){100, -100, 100, -100});
  kiln_blob *t = blob_of("t", 2, SHAPE(1, 4), (const float[]){0, 1, 1, 0});
  kiln_blob *xt[2] = {x, t};
  built s = build("name: 's' type: 'SigmoidCrossEntropyLoss'", TRAIN, xt, 2, 1);
  forward(&s);
  expect_close("stable loss", s.top[0]->data, (const float[]){200}, 1, 1e-6);
  s.top[0]->diff[0] = 1;
  s.l->propagate_down[1] = false;
  backward(&s);
  expect_close("stable dx", x->diff, (const float[]){1, -1, 0, 0}, 4, 1e-6);
  unbuild(&s);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

static void test_sigmoid_ce_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 39, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(3, 2, 2, 3), -3, 3, &rng);
  kiln_blob *t = gc_blob("t", 4, SHAPE(3, 2, 2, 3), 0, 1, &rng);
  t->data[2] = t->data[9] = t->data[20] = 1; /* for ignore_label 1 */
  t->data[5] = 0;
  kiln_blob *xt[2] = {x, t};
  gradcheck_opts o = {.bottom_mask = 1};
  const char *params[] = {
      "",
      "loss_param { normalization: VALID }",
      "loss_param { normalization: FULL ignore_label: 1 }",
      "loss_param { normalization: VALID ignore_label: 1 }",
      "loss_param { normalization: NONE }",
      "loss_param { normalize: true }",
      "loss_weight: 0.5 loss_param { normalization: BATCH_SIZE ignore_label: 1 }",
  };
  char text[256];
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    snprintf(text, sizeof text, "name: 'sce' type: 'SigmoidCrossEntropyLoss' %s", params[i]);
    check_grad(text, xt, 2, 1, &o);
  }
  kiln_blob_free(t);
  kiln_blob_free(x);
}

static void test_sigmoid_ce_errors(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), NULL);
  kiln_blob *t = blob_of("t", 2, SHAPE(2, 2), NULL);
  kiln_blob *xt[2] = {x, t};
  expect_create_fails("name: 'sce1' type: 'SigmoidCrossEntropyLoss'", TRAIN, xt, 2, 1,
                      KILN_ERR_SHAPE, "layer 'sce1' (SigmoidCrossEntropyLoss)",
                      "target count 4");
  kiln_blob *t6 = blob_of("t6", 1, SHAPE(6), NULL);
  kiln_blob *xt6[2] = {x, t6};
  built s = build("name: 'sce2' type: 'SigmoidCrossEntropyLoss'", TRAIN, xt6, 2, 1);
  forward(&s);
  s.top[0]->diff[0] = 1;
  assert_true(s.l->propagate_down[1]); /* kiln_layer_create asks for every bottom */
  kiln_clear_error();
  assert_int_equal(s.l->ops->backward(s.l), KILN_ERR_INVALID);
  expect_message("layer 'sce2' (SigmoidCrossEntropyLoss)", "target", NULL);
  unbuild(&s);
  kiln_blob_free(t6);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

/* ---- DummyData --------------------------------------------------------------------------- */

static void expect_all(const char *what, const kiln_blob *b, float v) {
  for (int64_t i = 0; i < b->count; i++)
    if (b->data[i] != v) {
      print_error("%s[%lld] = %g, want %g\n", what, (long long)i, (double)b->data[i], (double)v);
      fail();
    }
}

static void test_dummy_data_shapes_and_constants(void **state) {
  (void)state;
  /* one shape and one filler for both tops */
  built a = build("name: 'dd' type: 'DummyData' dummy_data_param { shape { dim: 2 dim: 3 } "
                  "data_filler { type: 'constant' value: 3 } }",
                  TRAIN, NULL, 0, 2);
  assert_true(a.l->ops->is_data);
  assert_null(a.l->ops->backward);
  forward(&a);
  expect_shape(a.top[0], 2, SHAPE(2, 3));
  expect_shape(a.top[1], 2, SHAPE(2, 3));
  expect_all("constant top 0", a.top[0], 3);
  expect_all("constant top 1", a.top[1], 3);
  unbuild(&a);
  /* a shape per top, no filler: zeros */
  built b = build("name: 'dd' type: 'DummyData' dummy_data_param { shape { dim: 4 } shape { dim: "
                  "1 dim: 2 dim: 3 dim: 1 } }",
                  TRAIN, NULL, 0, 2);
  forward(&b);
  expect_shape(b.top[0], 1, SHAPE(4));
  expect_shape(b.top[1], 4, SHAPE(1, 2, 3, 1));
  expect_all("zero top 0", b.top[0], 0);
  expect_all("zero top 1", b.top[1], 0);
  unbuild(&b);
  /* legacy num/channels/height/width, each once or once per top */
  built c = build("name: 'dd' type: 'DummyData' dummy_data_param { num: 2 num: 5 channels: 3 "
                  "height: 1 width: 4 width: 2 }",
                  TRAIN, NULL, 0, 2);
  expect_shape(c.top[0], 4, SHAPE(2, 3, 1, 4));
  expect_shape(c.top[1], 4, SHAPE(5, 3, 1, 2));
  unbuild(&c);
}

/* Constant tops are filled once and never again (a value written into one stays); the others
 * are refilled on every forward pass, from the net's generator (so the same seed repeats). */
static void test_dummy_data_refill(void **state) {
  (void)state;
  const char *text = "name: 'dd' type: 'DummyData' dummy_data_param { shape { dim: 3 dim: 4 } "
                     "data_filler { type: 'constant' value: 1.5 } "
                     "data_filler { type: 'uniform' min: 2 max: 3 } "
                     "data_filler { type: 'gaussian' std: 0.5 } }";
  built a = build(text, TRAIN, NULL, 0, 3);
  built twin = build(text, TRAIN, NULL, 0, 3);
  forward(&a);
  forward(&twin);
  expect_all("constant", a.top[0], 1.5f);
  for (int64_t i = 0; i < a.top[1]->count; i++)
    assert_true(a.top[1]->data[i] >= 2 && a.top[1]->data[i] < 3);
  for (int t = 1; t < 3; t++)
    expect_close("same seed, same fill", twin.top[t]->data, a.top[t]->data, 12, 0);
  float before[12], gauss[12];
  memcpy(before, a.top[1]->data, sizeof before);
  memcpy(gauss, a.top[2]->data, sizeof gauss);
  a.top[0]->data[5] = -9;
  forward(&a);
  assert_float_equal(a.top[0]->data[5], -9, 0); /* not refilled */
  assert_float_equal(a.top[0]->data[4], 1.5f, 0);
  int same = 0, same_g = 0;
  for (int i = 0; i < 12; i++) {
    same += a.top[1]->data[i] == before[i];
    same_g += a.top[2]->data[i] == gauss[i];
    assert_true(a.top[1]->data[i] >= 2 && a.top[1]->data[i] < 3);
  }
  assert_true(same < 12);
  assert_true(same_g < 12);
  unbuild(&twin);
  unbuild(&a);
}

static void test_dummy_data_bad_parameters(void **state) {
  (void)state;
  expect_create_fails("name: 'd1' type: 'DummyData' dummy_data_param { shape { dim: 2 } shape { "
                      "dim: 3 } }",
                      TRAIN, NULL, 0, 3, KILN_ERR_INVALID, "layer 'd1' (DummyData)",
                      "'shape' once or once per top (3 tops), got 2");
  expect_create_fails("name: 'd2' type: 'DummyData'", TRAIN, NULL, 0, 1, KILN_ERR_INVALID,
                      "layer 'd2' (DummyData)", "got 0");
  expect_create_fails("name: 'd3' type: 'DummyData' dummy_data_param { shape { dim: 2 } "
                      "data_filler { value: 1 } data_filler { value: 2 } }",
                      TRAIN, NULL, 0, 3, KILN_ERR_INVALID, "layer 'd3' (DummyData)",
                      "data_filler");
  expect_create_fails("name: 'd4' type: 'DummyData' dummy_data_param { num: 2 channels: 1 "
                      "height: 1 width: 1 shape { dim: 2 } }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'd4' (DummyData)", "both");
  expect_create_fails("name: 'd5' type: 'DummyData' dummy_data_param { num: 2 num: 3 channels: "
                      "1 height: 1 width: 1 }",
                      TRAIN, NULL, 0, 3, KILN_ERR_INVALID, "layer 'd5' (DummyData)", "'num'");
  expect_create_fails("name: 'd6' type: 'DummyData' dummy_data_param { num: 2 height: 1 width: "
                      "1 }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'd6' (DummyData)",
                      "'channels'");
  expect_create_fails("name: 'd7' type: 'DummyData' dummy_data_param { shape { dim: 2 } "
                      "data_filler { type: 'bogus' } }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'd7' (DummyData)", "bogus");
  kiln_blob *x = blob_of("x", 1, SHAPE(2), NULL);
  expect_create_fails("name: 'd8' type: 'DummyData' dummy_data_param { shape { dim: 2 } }", TRAIN,
                      &x, 1, 1, KILN_ERR_INVALID, "layer 'd8' (DummyData)", "bottom");
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
                          .config = kiln_test_config()};
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
      cmocka_unit_test(test_lrn_across_hand),
      cmocka_unit_test(test_lrn_within_hand),
      cmocka_unit_test(test_lrn_reference),
      cmocka_unit_test(test_lrn_gradients),
      cmocka_unit_test(test_lrn_bad_parameters),
      cmocka_unit_test(test_power_hand),
      cmocka_unit_test(test_power_reference),
      cmocka_unit_test(test_power_gradients),
      cmocka_unit_test(test_absval_hand),
      cmocka_unit_test(test_elu_hand),
      cmocka_unit_test(test_elu_reference),
      cmocka_unit_test(test_absval_elu_gradients),
      cmocka_unit_test(test_prelu_hand),
      cmocka_unit_test(test_prelu_gradients),
      cmocka_unit_test(test_prelu_bad_shapes),
      cmocka_unit_test(test_argmax_hand),
      cmocka_unit_test(test_argmax_axis_hand),
      cmocka_unit_test(test_argmax_bad_parameters),
      cmocka_unit_test(test_euclidean_hand),
      cmocka_unit_test(test_euclidean_gradients),
      cmocka_unit_test(test_euclidean_bad_shapes),
      cmocka_unit_test(test_sigmoid_ce_hand),
      cmocka_unit_test(test_sigmoid_ce_stable),
      cmocka_unit_test(test_sigmoid_ce_gradients),
      cmocka_unit_test(test_sigmoid_ce_errors),
      cmocka_unit_test(test_dummy_data_shapes_and_constants),
      cmocka_unit_test(test_dummy_data_refill),
      cmocka_unit_test(test_dummy_data_bad_parameters),
      cmocka_unit_test(test_layers_in_a_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
