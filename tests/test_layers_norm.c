/* Normalisation and per-channel affine layers: BatchNorm, Scale, Bias, LRN, and the SSD fork's
 * Normalize. Each has a forward (and where it matters backward) worked out by hand, a
 * finite-difference gradient check (tests/support/gradcheck.c), its bad-parameter errors (a
 * status and a message naming the layer), and in-place runs where Caffe nets use them in place.
 * BatchNorm also has its statistics checked: the normalised output, the stored sums after two
 * passes, TEST mode on the stored statistics, and the frozen blobs inside a net. LRN is also
 * checked against the formula in double precision on random input; Normalize runs in a net as
 * SSD writes it. */
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

/* ---- BatchNorm ------------------------------------------------------------------------------ */

/* (N 2, C 2, H 1, W 2), eps 4 so that var + eps is a square:
 *   channel 0 holds 1 3 | 5 7:  mean 4, biased var 5, sqrt(5 + 4) = 3 -> (x - 4) / 3
 *   channel 1 holds 2 2 | 2 10: mean 4, biased var 12, sqrt(12 + 4) = 4 -> (x - 4) / 4
 * m = N*H*W = 4, so the stored variance is the unbiased 4/3 var: 20/3 and 16. */
static const float bn_x[8] = {1, 3, 2, 2, 5, 7, 2, 10};
static const float bn_y[8] = {-1, -1.0f / 3, -0.5f, -0.5f, 1.0f / 3, 1, -0.5f, 1.5f};

static void test_bn_forward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 2, 1, 2), bn_x);
  built bn = build("name: 'bn' type: 'BatchNorm' batch_norm_param { eps: 4 "
                   "moving_average_fraction: 0.5 }",
                   TRAIN, &x, 1, 1);
  assert_int_equal(bn.l->nparam, 3);
  expect_shape(bn.l->param[0], 1, SHAPE(2));
  expect_shape(bn.l->param[1], 1, SHAPE(2));
  expect_shape(bn.l->param[2], 1, SHAPE(1));
  for (int p = 0; p < 3; p++) {
    assert_true(bn.l->param_frozen[p]);
    for (int64_t i = 0; i < bn.l->param[p]->count; i++) assert_float_equal(bn.l->param[p]->data[i], 0, 0);
  }
  forward(&bn);
  expect_shape(bn.top[0], 4, SHAPE(2, 2, 1, 2));
  expect_close("bn y", bn.top[0]->data, bn_y, 8, 1e-6);
  expect_close("bn mean sum", bn.l->param[0]->data, (const float[]){4, 4}, 2, 1e-6);
  expect_close("bn var sum", bn.l->param[1]->data, (const float[]){20.0f / 3, 16}, 2, 1e-6);
  expect_close("bn factor", bn.l->param[2]->data, (const float[]){1}, 1, 0);

  /* The same input again gives the same output (the stored sums do not enter TRAIN mode). */
  forward(&bn);
  expect_close("bn y again", bn.top[0]->data, bn_y, 8, 0);

  /* Backward through the batch statistics, dx = (dy - mean(dy) - mean(dy y) y) / 3 for channel 0:
   * dy = 1 at the first element only: mean(dy) = 1/4, mean(dy y) = -1/4, so
   *   dx = (delta - 1/4 + y/4) / 3 = 1/6, -1/9 | -1/18, 0; channel 1 gets dy = 0 and dx = 0.
   * A constant dy gives dx = 0 (shifting x shifts nothing after normalisation). */
  fill(bn.top[0]->diff, 8, 0);
  bn.top[0]->diff[0] = 1;
  fill(x->diff, 8, 99);
  backward(&bn);
  expect_close("bn dx", x->diff,
               (const float[]){1.0f / 6, -1.0f / 9, 0, 0, -1.0f / 18, 0, 0, 0}, 8, 1e-6);
  fill(bn.top[0]->diff, 8, 2.5f);
  backward(&bn);
  expect_close("bn dx of constant dy", x->diff, (const float[]){0, 0, 0, 0, 0, 0, 0, 0}, 8, 1e-6);
  for (int p = 0; p < 3; p++)
    for (int64_t i = 0; i < bn.l->param[p]->count; i++) assert_float_equal(bn.l->param[p]->diff[i], 0, 0);
  unbuild(&bn);
  kiln_blob_free(x);
}

/* Two forwards with moving_average_fraction 0.5, the second on 2x (mean 8, biased var 20 and 48):
 *   mean_sum = 0.5 * 4 + 8 = 10 (both channels)
 *   var_sum  = 0.5 * 20/3 + 4/3 * 20 = 30,  0.5 * 16 + 4/3 * 48 = 72
 *   factor   = 0.5 * 1 + 1 = 1.5
 * and then the default maf 0.999 with its formula. */
static void test_bn_stored_statistics(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 2, 1, 2), bn_x);
  built bn = build("name: 'bn' type: 'BatchNorm' batch_norm_param { eps: 4 "
                   "moving_average_fraction: 0.5 }",
                   TRAIN, &x, 1, 1);
  forward(&bn);
  for (int i = 0; i < 8; i++) x->data[i] = 2 * bn_x[i];
  forward(&bn);
  expect_close("mean sum", bn.l->param[0]->data, (const float[]){10, 10}, 2, 1e-6);
  expect_close("var sum", bn.l->param[1]->data, (const float[]){30, 72}, 2, 1e-6);
  expect_close("factor", bn.l->param[2]->data, (const float[]){1.5f}, 1, 1e-7);
  /* Normalised output of 2x: the same as for x up to eps (var 20 + 4, 48 + 4). */
  const float want[8] = {-6 / sqrtf(24), -2 / sqrtf(24), -4 / sqrtf(52), -4 / sqrtf(52),
                         2 / sqrtf(24),  6 / sqrtf(24),  -4 / sqrtf(52), 12 / sqrtf(52)};
  expect_close("bn y of 2x", bn.top[0]->data, want, 8, 1e-6);
  unbuild(&bn);

  /* Default maf 0.999, (N, C) input of 3 samples (m = 3). */
  kiln_blob *v = blob_of("v", 2, SHAPE(3, 2), (const float[]){1, 0, 2, 0, 6, 3});
  built d = build("name: 'bnd' type: 'BatchNorm'", TRAIN, &v, 1, 1);
  forward(&d);
  /* ch0 1 2 6: mean 3, biased var (4 + 1 + 9)/3 = 14/3, unbiased 7; ch1 0 0 3: mean 1, var 2 -> 3 */
  forward(&d);
  expect_close("maf mean", d.l->param[0]->data, (const float[]){0.999f * 3 + 3, 0.999f * 1 + 1}, 2, 1e-6);
  expect_close("maf var", d.l->param[1]->data, (const float[]){0.999f * 7 + 7, 0.999f * 3 + 3}, 2, 1e-6);
  expect_close("maf factor", d.l->param[2]->data, (const float[]){1.999f}, 1, 1e-6);
  const float want_d[6] = {-2 / sqrtf(14.0f / 3 + 1e-5f), -1 / sqrtf(2 + 1e-5f),
                           -1 / sqrtf(14.0f / 3 + 1e-5f), -1 / sqrtf(2 + 1e-5f),
                           3 / sqrtf(14.0f / 3 + 1e-5f),  2 / sqrtf(2 + 1e-5f)};
  expect_close("(N, C) y", d.top[0]->data, want_d, 6, 1e-5);
  unbuild(&d);
  kiln_blob_free(v);
  kiln_blob_free(x);
}

/* TEST phase uses the stored statistics by default: mean = sum / factor, var = sum / factor.
 * mean_sum (6, 4), var_sum (24, 10), factor 2: mean (3, 2), var (12, 5); eps 4: y = (x - 3) / 4
 * on channel 0 and (x - 2) / 3 on channel 1; backward is dy / 4 and dy / 3. The stored blobs do
 * not change. With factor 0 the statistics count as 0: y = x / sqrt(eps) = x / 2. */
static void test_bn_global_stats(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 2, 1, 2), bn_x);
  built bn = build("name: 'bn' type: 'BatchNorm' batch_norm_param { eps: 4 }", TEST, &x, 1, 1);
  forward(&bn); /* factor 0 */
  const float half[8] = {0.5f, 1.5f, 1, 1, 2.5f, 3.5f, 1, 5};
  expect_close("bn factor 0", bn.top[0]->data, half, 8, 1e-6);
  set_params(&bn, 0, (const float[]){6, 4});
  set_params(&bn, 1, (const float[]){24, 10});
  set_params(&bn, 2, (const float[]){2});
  forward(&bn);
  const float want[8] = {-0.5f, 0, 0, 0, 0.5f, 1, 0, 8.0f / 3};
  expect_close("bn global y", bn.top[0]->data, want, 8, 1e-6);
  expect_close("mean sum kept", bn.l->param[0]->data, (const float[]){6, 4}, 2, 0);
  expect_close("var sum kept", bn.l->param[1]->data, (const float[]){24, 10}, 2, 0);
  expect_close("factor kept", bn.l->param[2]->data, (const float[]){2}, 1, 0);
  for (int i = 0; i < 8; i++) bn.top[0]->diff[i] = (float)(i + 1);
  backward(&bn);
  expect_close("bn global dx", x->diff,
               (const float[]){0.25f, 0.5f, 1, 4.0f / 3, 1.25f, 1.5f, 7.0f / 3, 8.0f / 3}, 8, 1e-6);
  unbuild(&bn);

  /* use_global_stats: true in TRAIN, false in TEST. */
  built g = build("name: 'bng' type: 'BatchNorm' batch_norm_param { use_global_stats: true eps: 4 }",
                  TRAIN, &x, 1, 1);
  forward(&g);
  expect_close("global in TRAIN", g.top[0]->data, half, 8, 1e-6);
  assert_float_equal(g.l->param[2]->data[0], 0, 0);
  unbuild(&g);
  built b = build("name: 'bnb' type: 'BatchNorm' batch_norm_param { use_global_stats: false eps: 4 }",
                  TEST, &x, 1, 1);
  forward(&b);
  expect_close("batch stats in TEST", b.top[0]->data, bn_y, 8, 1e-6);
  assert_float_equal(b.l->param[2]->data[0], 1, 0);
  unbuild(&b);
  kiln_blob_free(x);
}

/* TRAIN output: every channel has mean ~0 and (biased) variance ~1 - eps terms. */
static void test_bn_train_statistics(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 30, 1);
  const int64_t N = 4, C = 3, S = 25;
  kiln_blob *x = blob_of("x", 4, SHAPE(4, 3, 5, 5), NULL);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t i = 0; i < S; i++)
        x->data[(n * C + c) * S + i] = kiln_rng_gaussian(&rng, (float)c * 5 - 3, 0.5f + (float)c * 2);
  built bn = build("name: 'bn' type: 'BatchNorm'", TRAIN, &x, 1, 1);
  forward(&bn);
  for (int64_t c = 0; c < C; c++) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < S; i++) sum += bn.top[0]->data[(n * C + c) * S + i];
    double mean = sum / (N * S);
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < S; i++) {
        double d = bn.top[0]->data[(n * C + c) * S + i] - mean;
        sq += d * d;
      }
    double var = sq / (N * S);
    if (fabs(mean) > 1e-5 || fabs(var - 1) > 1e-3) {
      print_error("channel %lld: mean %g, variance %g\n", (long long)c, mean, var);
      fail();
    }
  }
  unbuild(&bn);
  kiln_blob_free(x);
}

static void test_bn_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 31, 1);
  const gradcheck_opts opts = {.phase = TRAIN};
  kiln_blob *a = gc_blob("a", 4, SHAPE(2, 3, 3, 2), -2, 2, &rng);
  check_grad("name: 'bn' type: 'BatchNorm' batch_norm_param { use_global_stats: false }", &a, 1,
             1, &opts);
  check_grad("name: 'bn' type: 'BatchNorm' batch_norm_param { use_global_stats: false "
             "eps: 0.1 moving_average_fraction: 0.9 }",
             &a, 1, 1, &opts);
  kiln_blob_free(a);
  kiln_blob *b = gc_blob("b", 2, SHAPE(5, 3), -2, 2, &rng);
  check_grad("name: 'bn' type: 'BatchNorm' batch_norm_param { use_global_stats: false }", &b, 1,
             1, &opts);
  kiln_blob_free(b);
}

static void test_bn_in_place(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 32, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(3, 2, 2, 3), -2, 2, &rng);
  expect_in_place_same("name: 'bn' type: 'BatchNorm'", TRAIN, &x, 1);
  expect_in_place_same("name: 'bn' type: 'BatchNorm'", TEST, &x, 1);
  kiln_blob_free(x);
}

static void test_bn_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), NULL);
  expect_create_fails("name: 'bn_eps' type: 'BatchNorm' batch_norm_param { eps: -1 }", TRAIN, &x,
                      1, 1, KILN_ERR_INVALID, "layer 'bn_eps' (BatchNorm)", "eps");
  expect_create_fails("name: 'bn_maf' type: 'BatchNorm' batch_norm_param { "
                      "moving_average_fraction: 1.5 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'bn_maf' (BatchNorm)",
                      "moving_average_fraction");
  kiln_blob_free(x);
  kiln_blob *s = blob_of("s", 0, NULL, NULL);
  expect_create_fails("name: 'bn_scalar' type: 'BatchNorm'", TRAIN, &s, 1, 1, KILN_ERR_SHAPE,
                      "layer 'bn_scalar' (BatchNorm)", "axis");
  kiln_blob_free(s);
}

/* ---- in a net ---------------------------------------------------------------------------- */

/* In a net: BatchNorm and Scale in place as ResNet writes them; the solver-facing multipliers of
 * the three statistics blobs are 0 whatever the ParamSpec says, Scale's are not; forward and
 * backward run and the statistics are updated. (Kept to few layers: see the report on
 * need_backward in src/net/net.c, whose `needs` list overflows on longer in-place chains.) */
static void test_bn_scale_in_net(void **state) {
  (void)state;
  const char *text =
      "name: 'bnnet'\n"
      "layer { name: 'in' type: 'Input' top: 'x' top: 'label' input_param {\n"
      "  shape { dim: 4 dim: 3 dim: 2 dim: 2 } shape { dim: 4 dim: 2 dim: 2 } } }\n"
      "layer { name: 'pre' type: 'Scale' bottom: 'x' top: 'h' scale_param { bias_term: true } }\n"
      "layer { name: 'bn' type: 'BatchNorm' bottom: 'h' top: 'h'\n"
      "  param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } }\n"
      "layer { name: 'sc' type: 'Scale' bottom: 'h' top: 'h' scale_param { bias_term: true } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'h' bottom: 'label' top: 'loss' }\n";
  Caffe__NetParameter *np;
  kiln_net *net = net_run(text, &np);
  kiln_layer *bn = kiln_net_layer(net, "bn"), *sc = kiln_net_layer(net, "sc");
  assert_non_null(bn);
  assert_non_null(sc);
  int found = 0;
  for (int k = 0; k < net->nlearnable; k++) {
    for (int p = 0; p < bn->nparam; p++)
      if (net->learnable[k] == bn->param[p]) {
        assert_float_equal(net->lr_mult[k], 0, 0);
        assert_float_equal(net->decay_mult[k], 0, 0);
        found++;
      }
    for (int p = 0; p < sc->nparam; p++)
      if (net->learnable[k] == sc->param[p]) {
        assert_float_equal(net->lr_mult[k], 1, 0);
        found++;
      }
  }
  assert_int_equal(found, 5);
  assert_float_equal(bn->param[2]->data[0], 1, 0);
  for (int p = 0; p < bn->nparam; p++)
    for (int64_t i = 0; i < bn->param[p]->count; i++) assert_float_equal(bn->param[p]->diff[i], 0, 0);
  double g = 0;
  for (int64_t i = 0; i < sc->param[0]->count; i++) g += fabs(sc->param[0]->diff[i]);
  assert_true(g > 0);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* ---- Scale ---------------------------------------------------------------------------------- */

/* x (2, 3, 2) = 1..12, gamma (1, 2, -1), beta (0.5, 0, 1) on axis 1:
 *   n0: 1.5 2.5 | 6 8 | -4 -5      n1: 7.5 8.5 | 18 20 | -10 -11
 * dy = 1: dgamma = channel sums of x (1+2+7+8, 3+4+9+10, 5+6+11+12) = 18 26 34, dbeta = 4 each,
 * dx = gamma broadcast. */
static void test_scale_forward_backward_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 3, SHAPE(2, 3, 2), 1);
  built s = build("name: 'sc' type: 'Scale' scale_param { bias_term: true }", TRAIN, &x, 1, 1);
  assert_int_equal(s.l->nparam, 2);
  expect_shape(s.l->param[0], 1, SHAPE(3));
  expect_shape(s.l->param[1], 1, SHAPE(3));
  expect_close("default gamma", s.l->param[0]->data, (const float[]){1, 1, 1}, 3, 0);
  expect_close("default beta", s.l->param[1]->data, (const float[]){0, 0, 0}, 3, 0);
  set_params(&s, 0, (const float[]){1, 2, -1});
  set_params(&s, 1, (const float[]){0.5f, 0, 1});
  forward(&s);
  expect_shape(s.top[0], 3, SHAPE(2, 3, 2));
  expect_close("scale y", s.top[0]->data,
               (const float[]){1.5f, 2.5f, 6, 8, -4, -5, 7.5f, 8.5f, 18, 20, -10, -11}, 12, 1e-6);
  fill(s.top[0]->diff, 12, 1);
  fill(s.l->param[0]->diff, 3, 0);
  fill(s.l->param[1]->diff, 3, 0);
  fill(x->diff, 12, 55);
  backward(&s);
  expect_close("scale dx", x->diff, (const float[]){1, 1, 2, 2, -1, -1, 1, 1, 2, 2, -1, -1}, 12, 0);
  expect_close("scale dgamma", s.l->param[0]->diff, (const float[]){18, 26, 34}, 3, 1e-6);
  expect_close("scale dbeta", s.l->param[1]->diff, (const float[]){4, 4, 4}, 3, 1e-6);
  backward(&s);
  expect_close("scale dgamma accumulates", s.l->param[0]->diff, (const float[]){36, 52, 68}, 3, 1e-6);
  expect_close("scale dbeta accumulates", s.l->param[1]->diff, (const float[]){8, 8, 8}, 3, 1e-6);
  unbuild(&s);

  /* no bias: one blob; filler honoured */
  built nb = build("name: 'sc' type: 'Scale' scale_param { filler { type: 'constant' value: 3 } }",
                   TRAIN, &x, 1, 1);
  assert_int_equal(nb.l->nparam, 1);
  expect_close("filled gamma", nb.l->param[0]->data, (const float[]){3, 3, 3}, 3, 0);
  forward(&nb);
  assert_float_equal(nb.top[0]->data[11], 36, 0);
  unbuild(&nb);
  kiln_blob_free(x);
}

/* Shapes of gamma: num_axes -1 (to the end), 0 (a scalar), axis 2, axis -1. */
static void test_scale_axes(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 3, SHAPE(2, 3, 2), 1);
  built all = build("name: 'sc' type: 'Scale' scale_param { num_axes: -1 }", TRAIN, &x, 1, 1);
  expect_shape(all.l->param[0], 2, SHAPE(3, 2));
  set_params(&all, 0, (const float[]){1, 2, 3, 4, 5, 6});
  forward(&all);
  expect_close("gamma (3, 2)", all.top[0]->data,
               (const float[]){1, 4, 9, 16, 25, 36, 7, 16, 27, 40, 55, 72}, 12, 1e-6);
  unbuild(&all);

  built sc = build("name: 'sc' type: 'Scale' scale_param { num_axes: 0 bias_term: true }", TRAIN,
                   &x, 1, 1);
  expect_shape(sc.l->param[0], 0, NULL);
  expect_shape(sc.l->param[1], 0, NULL);
  set_params(&sc, 0, (const float[]){-2});
  set_params(&sc, 1, (const float[]){1});
  forward(&sc);
  for (int i = 0; i < 12; i++) assert_float_equal(sc.top[0]->data[i], -2.0f * (float)(i + 1) + 1, 0);
  unbuild(&sc);

  built a2 = build("name: 'sc' type: 'Scale' scale_param { axis: 2 }", TRAIN, &x, 1, 1);
  expect_shape(a2.l->param[0], 1, SHAPE(2));
  set_params(&a2, 0, (const float[]){10, -1});
  forward(&a2);
  expect_close("gamma on axis 2", a2.top[0]->data,
               (const float[]){10, -2, 30, -4, 50, -6, 70, -8, 90, -10, 110, -12}, 12, 1e-6);
  unbuild(&a2);

  built am = build("name: 'sc' type: 'Scale' scale_param { axis: -1 }", TRAIN, &x, 1, 1);
  expect_shape(am.l->param[0], 1, SHAPE(2));
  unbuild(&am);
  kiln_blob_free(x);
}

/* gamma from a second bottom: x (2, 3) = 1..6, s = (2, -1, 0.5): y = 2 -2 1.5 | 8 -5 3; with
 * dy = 1, ds = column sums of x = 5 7 9 (overwritten), dx = s. No gamma parameter; with bias_term
 * a beta of s's shape. */
static void test_scale_from_bottom_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 2, SHAPE(2, 3), 1);
  kiln_blob *g = blob_of("g", 1, SHAPE(3), (const float[]){2, -1, 0.5f});
  kiln_blob *b[2] = {x, g};
  built s = build("name: 'sc' type: 'Scale'", TRAIN, b, 2, 1);
  assert_int_equal(s.l->nparam, 0);
  forward(&s);
  expect_close("scale by bottom", s.top[0]->data, (const float[]){2, -2, 1.5f, 8, -5, 3}, 6, 1e-6);
  fill(s.top[0]->diff, 6, 1);
  fill(g->diff, 3, 100);
  fill(x->diff, 6, 100);
  backward(&s);
  expect_close("ds", g->diff, (const float[]){5, 7, 9}, 3, 1e-6);
  expect_close("dx", x->diff, (const float[]){2, -1, 0.5f, 2, -1, 0.5f}, 6, 0);
  unbuild(&s);

  built sb = build("name: 'sc' type: 'Scale' scale_param { bias_term: true axis: -1 "
                   "bias_filler { type: 'constant' value: 1 } }",
                   TRAIN, b, 2, 1);
  assert_int_equal(sb.l->nparam, 1);
  expect_shape(sb.l->param[0], 1, SHAPE(3));
  forward(&sb);
  expect_close("scale by bottom + bias", sb.top[0]->data, (const float[]){3, -1, 2.5f, 9, -4, 4},
               6, 1e-6);
  unbuild(&sb);
  kiln_blob_free(g);
  kiln_blob_free(x);
}

static void test_scale_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 40, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  check_grad("name: 'sc' type: 'Scale' scale_param { bias_term: true "
             "filler { type: 'uniform' min: -1 max: 1 } bias_filler { type: 'gaussian' } }",
             &x, 1, 1, NULL);
  check_grad("name: 'sc' type: 'Scale' scale_param { num_axes: -1 axis: 2 "
             "filler { type: 'uniform' min: -1 max: 1 } }",
             &x, 1, 1, NULL);
  check_grad("name: 'sc' type: 'Scale' scale_param { num_axes: 0 bias_term: true "
             "filler { type: 'uniform' min: -1 max: 1 } }",
             &x, 1, 1, NULL);
  kiln_blob *g = gc_blob("g", 2, SHAPE(3, 2), -1, 1, &rng);
  kiln_blob *b[2] = {x, g};
  check_grad("name: 'sc' type: 'Scale' scale_param { axis: 1 }", b, 2, 1, NULL);
  check_grad("name: 'sc' type: 'Scale' scale_param { axis: 1 bias_term: true "
             "bias_filler { type: 'gaussian' } }",
             b, 2, 1, NULL);
  kiln_blob *s = gc_blob("s", 0, NULL, -1, 1, &rng);
  kiln_blob *bs[2] = {x, s};
  check_grad("name: 'sc' type: 'Scale'", bs, 2, 1, NULL);
  kiln_blob_free(s);
  kiln_blob_free(g);
  kiln_blob_free(x);
}

static void test_scale_in_place(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 41, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  expect_in_place_same("name: 'sc' type: 'Scale' scale_param { bias_term: true "
                       "filler { type: 'uniform' min: -1 max: 1 } bias_filler { type: 'gaussian' } }",
                       TRAIN, &x, 1);
  kiln_blob *g = gc_blob("g", 1, SHAPE(3), -1, 1, &rng);
  kiln_blob *b[2] = {x, g};
  expect_in_place_same("name: 'sc' type: 'Scale'", TRAIN, b, 2);
  kiln_blob_free(g);
  kiln_blob_free(x);
}

static void test_scale_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 3, 4), NULL);
  kiln_blob *g = blob_of("g", 1, SHAPE(4), NULL);
  kiln_blob *b[2] = {x, g};
  /* gamma of 4 against the 3 channels at axis 1 */
  expect_fails_ex("name: 'sc_shape' type: 'Scale'", TRAIN, b, 2, 1, false, KILN_ERR_SHAPE,
                  "layer 'sc_shape' (Scale)", "does not match", "2x3x4");
  kiln_blob *g2 = blob_of("g2", 2, SHAPE(4, 5), NULL);
  kiln_blob *b2[2] = {x, g2};
  expect_fails_ex("name: 'sc_long' type: 'Scale' scale_param { axis: 2 }", TRAIN, b2, 2, 1, false,
                  KILN_ERR_SHAPE, "layer 'sc_long' (Scale)", "4x5", "does not match");
  expect_create_fails("name: 'sc_past' type: 'Scale' scale_param { axis: 2 num_axes: 2 }", TRAIN,
                      &x, 1, 1, KILN_ERR_SHAPE, "layer 'sc_past' (Scale)", "num_axes 2");
  expect_create_fails("name: 'sc_neg' type: 'Scale' scale_param { num_axes: -2 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'sc_neg' (Scale)", "num_axes -2");
  expect_create_fails("name: 'sc_axis' type: 'Scale' scale_param { axis: 3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'sc_axis' (Scale)", "axis 3");
  kiln_blob *three[3] = {x, g, g};
  expect_create_fails("name: 'sc_three' type: 'Scale'", TRAIN, three, 3, 1, KILN_ERR_INVALID,
                      "layer 'sc_three' (Scale)", "bottom");
  kiln_blob_free(g2);
  kiln_blob_free(g);
  kiln_blob_free(x);
}

/* ---- Bias ----------------------------------------------------------------------------------- */

/* x (2, 3, 2) = 1..12, b (0.5, -1, 2) on axis 1: 1.5 2.5 | 2 3 | 7 8 | 7.5 8.5 | 8 9 | 13 14;
 * dy = 1: db = 4 each (accumulated), dx = dy. From a second bottom: x (2, 3) = 1..6, b (1, 2, 3):
 * y = 2 4 6 5 7 9; dy = 1..6: db = 5 7 9 (overwritten). */
static void test_bias_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 3, SHAPE(2, 3, 2), 1);
  built b = build("name: 'bi' type: 'Bias'", TRAIN, &x, 1, 1);
  assert_int_equal(b.l->nparam, 1);
  expect_shape(b.l->param[0], 1, SHAPE(3));
  expect_close("default bias", b.l->param[0]->data, (const float[]){0, 0, 0}, 3, 0);
  set_params(&b, 0, (const float[]){0.5f, -1, 2});
  forward(&b);
  expect_close("bias y", b.top[0]->data,
               (const float[]){1.5f, 2.5f, 2, 3, 7, 8, 7.5f, 8.5f, 8, 9, 13, 14}, 12, 1e-6);
  fill(b.top[0]->diff, 12, 1);
  fill(b.l->param[0]->diff, 3, 0);
  fill(x->diff, 12, 9);
  backward(&b);
  expect_close("bias dx", x->diff, b.top[0]->diff, 12, 0);
  expect_close("bias db", b.l->param[0]->diff, (const float[]){4, 4, 4}, 3, 0);
  backward(&b);
  expect_close("bias db accumulates", b.l->param[0]->diff, (const float[]){8, 8, 8}, 3, 0);
  unbuild(&b);

  built all = build("name: 'bi' type: 'Bias' bias_param { axis: 1 num_axes: -1 "
                    "filler { type: 'constant' value: 2 } }",
                    TRAIN, &x, 1, 1);
  expect_shape(all.l->param[0], 2, SHAPE(3, 2));
  expect_close("bias filler", all.l->param[0]->data, (const float[]){2, 2, 2, 2, 2, 2}, 6, 0);
  unbuild(&all);
  built sc = build("name: 'bi' type: 'Bias' bias_param { num_axes: 0 }", TRAIN, &x, 1, 1);
  expect_shape(sc.l->param[0], 0, NULL);
  unbuild(&sc);
  kiln_blob_free(x);

  kiln_blob *v = iota_blob("v", 2, SHAPE(2, 3), 1);
  kiln_blob *bb = blob_of("bb", 1, SHAPE(3), (const float[]){1, 2, 3});
  kiln_blob *bot[2] = {v, bb};
  built f = build("name: 'bi' type: 'Bias'", TRAIN, bot, 2, 1);
  assert_int_equal(f.l->nparam, 0);
  forward(&f);
  expect_close("bias by bottom", f.top[0]->data, (const float[]){2, 4, 6, 5, 7, 9}, 6, 0);
  for (int i = 0; i < 6; i++) f.top[0]->diff[i] = (float)(i + 1);
  fill(bb->diff, 3, 100);
  backward(&f);
  expect_close("db bottom", bb->diff, (const float[]){5, 7, 9}, 3, 0);
  expect_close("dx", v->diff, f.top[0]->diff, 6, 0);
  unbuild(&f);
  kiln_blob_free(bb);
  kiln_blob_free(v);
}

static void test_bias_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 42, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  check_grad("name: 'bi' type: 'Bias' bias_param { filler { type: 'gaussian' } }", &x, 1, 1, NULL);
  check_grad("name: 'bi' type: 'Bias' bias_param { axis: 0 num_axes: 2 filler { type: 'gaussian' } }",
             &x, 1, 1, NULL);
  kiln_blob *b = gc_blob("b", 2, SHAPE(2, 2), -1, 1, &rng);
  kiln_blob *bot[2] = {x, b};
  check_grad("name: 'bi' type: 'Bias' bias_param { axis: 2 }", bot, 2, 1, NULL);
  expect_in_place_same("name: 'bi' type: 'Bias' bias_param { axis: 2 }", TRAIN, bot, 2);
  expect_in_place_same("name: 'bi' type: 'Bias' bias_param { filler { type: 'gaussian' } }", TRAIN,
                       &x, 1);
  kiln_blob_free(b);
  kiln_blob_free(x);
}

static void test_bias_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 3, 4), NULL);
  kiln_blob *b = blob_of("b", 1, SHAPE(2), NULL);
  kiln_blob *bot[2] = {x, b};
  expect_fails_ex("name: 'bi_shape' type: 'Bias'", TRAIN, bot, 2, 1, false, KILN_ERR_SHAPE,
                  "layer 'bi_shape' (Bias)", "does not match", "2x3x4");
  expect_create_fails("name: 'bi_past' type: 'Bias' bias_param { axis: 1 num_axes: 3 }", TRAIN,
                      &x, 1, 1, KILN_ERR_SHAPE, "layer 'bi_past' (Bias)", "num_axes 3");
  expect_create_fails("name: 'bi_neg' type: 'Bias' bias_param { num_axes: -3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'bi_neg' (Bias)", "num_axes -3");
  expect_create_fails("name: 'bi_axis' type: 'Bias' bias_param { axis: -4 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'bi_axis' (Bias)", "axis -4");
  kiln_blob_free(b);
  kiln_blob_free(x);
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

/* ---- Normalize (the SSD fork's) ------------------------------------------------------------ */

/* Per position, a scale per channel: x (1, 2, 1, 2) holds channel 0 = 3 5, channel 1 = 4 12, so
 * position 0 is (3, 4), norm 5, and position 1 is (5, 12), norm 13 (eps 1e-10 changes neither in
 * float): x / norm = 0.6 5/13 | 0.8 12/13; times the scale (2, -1): 1.2 10/13 | -0.8 -12/13.
 * Across the image instead (default), with the default scale (one value, 1): x (2, 2, 1, 2) =
 * 1 2 2 4 | 0 3 0 4 has one norm an image, sqrt(1 + 4 + 4 + 16) = 5 and sqrt(9 + 16) = 5:
 * y = x / 5; with SSD's scale_filler constant 20, y = 4 x. */
static void test_normalize_forward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 2, 1, 2), (const float[]){3, 5, 4, 12});
  built n = build("name: 'nz' type: 'Normalize' norm_param { across_spatial: false "
                  "channel_shared: false }",
                  TRAIN, &x, 1, 1);
  assert_int_equal(n.l->nparam, 1);
  expect_shape(n.l->param[0], 1, SHAPE(2));
  expect_close("default scale", n.l->param[0]->data, (const float[]){1, 1}, 2, 0);
  set_params(&n, 0, (const float[]){2, -1});
  forward(&n);
  expect_shape(n.top[0], 4, SHAPE(1, 2, 1, 2));
  expect_close("per position", n.top[0]->data,
               (const float[]){1.2f, 10.0f / 13, -0.8f, -12.0f / 13}, 4, 1e-6);
  unbuild(&n);
  kiln_blob_free(x);

  kiln_blob *x2 = blob_of("x2", 4, SHAPE(2, 2, 1, 2), (const float[]){1, 2, 2, 4, 0, 3, 0, 4});
  built a = build("name: 'nz' type: 'Normalize'", TRAIN, &x2, 1, 1);
  expect_shape(a.l->param[0], 0, NULL); /* shared: the fork's scalar blob */
  expect_close("default shared scale", a.l->param[0]->data, (const float[]){1}, 1, 0);
  forward(&a);
  expect_close("across", a.top[0]->data,
               (const float[]){0.2f, 0.4f, 0.4f, 0.8f, 0, 0.6f, 0, 0.8f}, 8, 1e-6);
  unbuild(&a);
  built f = build("name: 'nz' type: 'Normalize' norm_param { scale_filler { type: 'constant' "
                  "value: 20 } }",
                  TRAIN, &x2, 1, 1);
  expect_close("filled scale", f.l->param[0]->data, (const float[]){20}, 1, 0);
  forward(&f);
  expect_close("across, scale 20", f.top[0]->data, (const float[]){4, 8, 8, 16, 0, 12, 0, 16}, 8,
               1e-6);
  unbuild(&f);
  /* per position with a shared scale 2: image 0's positions are (1, 2) and (2, 4), norms
   * sqrt(5) and sqrt(20); image 1's are (0, 0), whose norm sqrt(eps) leaves 0 at 0, and (3, 4),
   * norm 5. Across with a scale per channel (3, -2): each image's norm is 5 as above. */
  built ps = build("name: 'nz' type: 'Normalize' norm_param { across_spatial: false "
                   "scale_filler { type: 'constant' value: 2 } }",
                   TRAIN, &x2, 1, 1);
  forward(&ps);
  const float r5 = 2 / sqrtf(5), r20 = 2 / sqrtf(20);
  expect_close("per position, shared", ps.top[0]->data,
               (const float[]){r5, 2 * r20, 2 * r5, 4 * r20, 0, 1.2f, 0, 1.6f}, 8, 1e-6);
  unbuild(&ps);
  built ac = build("name: 'nz' type: 'Normalize' norm_param { channel_shared: false }", TRAIN, &x2,
                   1, 1);
  set_params(&ac, 0, (const float[]){3, -2});
  forward(&ac);
  expect_close("across, per channel", ac.top[0]->data,
               (const float[]){0.6f, 1.2f, -0.8f, -1.6f, 0, 1.8f, 0, -1.6f}, 8, 1e-6);
  unbuild(&ac);
  kiln_blob_free(x2);
}

/* eps goes inside the square root, once: x (1, 2) = 3 4 with eps 11 gives sqrt(9 + 16 + 11) = 6
 * (once per value would give sqrt(47)), y = 0.5 2/3. A 2-axis input is N x C with one position.
 * Backward on x = 3 4, eps 0, dy = 1 0: y0 = x0 / r, r = 5, so dx0 = (r^2 - x0^2) / r^3 =
 * 16/125 and dx1 = -x0 x1 / r^3 = -12/125; the scale's gradient is dy . x / r = 3/5, added on
 * each backward. */
static void test_normalize_eps_and_backward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 2), (const float[]){3, 4});
  built e = build("name: 'nz' type: 'Normalize' norm_param { eps: 11 }", TRAIN, &x, 1, 1);
  forward(&e);
  expect_close("eps inside the root", e.top[0]->data, (const float[]){0.5f, 2.0f / 3}, 2, 1e-6);
  unbuild(&e);
  built b = build("name: 'nz' type: 'Normalize' norm_param { eps: 0 across_spatial: false }",
                  TRAIN, &x, 1, 1);
  forward(&b);
  expect_close("eps 0", b.top[0]->data, (const float[]){0.6f, 0.8f}, 2, 1e-6);
  b.top[0]->diff[0] = 1;
  b.top[0]->diff[1] = 0;
  fill(x->diff, 2, 99);
  fill(b.l->param[0]->diff, 1, 0);
  backward(&b);
  expect_close("dx", x->diff, (const float[]){16.0f / 125, -12.0f / 125}, 2, 1e-6);
  expect_close("dscale", b.l->param[0]->diff, (const float[]){0.6f}, 1, 1e-6);
  backward(&b);
  expect_close("dx again", x->diff, (const float[]){16.0f / 125, -12.0f / 125}, 2, 1e-6);
  expect_close("dscale accumulates", b.l->param[0]->diff, (const float[]){1.2f}, 1, 1e-6);
  /* no gradient wanted for the input: the scale's still accumulates, x's diff stays */
  b.l->propagate_down[0] = false;
  fill(x->diff, 2, 7);
  backward(&b);
  expect_close("dx untouched", x->diff, (const float[]){7, 7}, 2, 0);
  expect_close("dscale without dx", b.l->param[0]->diff, (const float[]){1.8f}, 1, 1e-6);
  unbuild(&b);
  kiln_blob_free(x);
}

static void test_normalize_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 42, 1);
  const char *params[] = {
      "across_spatial: false channel_shared: false",
      "across_spatial: false channel_shared: true",
      "across_spatial: true channel_shared: false",
      "across_spatial: true channel_shared: true eps: 0.5",
  };
  kiln_blob *x4 = gc_blob("x", 4, SHAPE(2, 5, 2, 3), -1, 1, &rng);
  kiln_blob *x3 = gc_blob("x", 3, SHAPE(2, 4, 5), -1, 1, &rng);
  kiln_blob *x2 = gc_blob("x", 2, SHAPE(3, 6), -1, 1, &rng);
  char text[256];
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    snprintf(text, sizeof text,
             "name: 'nz' type: 'Normalize' norm_param { %s scale_filler { type: 'uniform' "
             "min: -2 max: 2 } }",
             params[i]);
    check_grad(text, &x4, 1, 1, NULL);
    check_grad(text, &x3, 1, 1, NULL);
    check_grad(text, &x2, 1, 1, NULL);
  }
  kiln_blob_free(x2);
  kiln_blob_free(x3);
  kiln_blob_free(x4);
}

static void test_normalize_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 3, 2, 2), NULL);
  expect_create_fails("name: 'nz_eps' type: 'Normalize' norm_param { eps: -0.001 }", TRAIN, &x, 1,
                      1, KILN_ERR_INVALID, "layer 'nz_eps' (Normalize)", "eps");
  expect_fails_ex("name: 'nz_in_place' type: 'Normalize'", TRAIN, &x, 1, 1, true,
                  KILN_ERR_INVALID, "layer 'nz_in_place' (Normalize)", "in place", NULL);
  kiln_blob_free(x);
  kiln_blob *v = blob_of("v", 1, SHAPE(6), NULL);
  expect_create_fails("name: 'nz_1d' type: 'Normalize'", TRAIN, &v, 1, 1, KILN_ERR_SHAPE,
                      "layer 'nz_1d' (Normalize)", "2 or more");
  kiln_blob_free(v);
}

/* SSD's use in a net: conv4_3 -> Normalize (per position, a scale per channel, 20 to start)
 * -> three readers of its top; the scale's gradient reaches the solver's blob. */
static void test_normalize_in_net(void **state) {
  (void)state;
  Caffe__NetParameter *np = NULL;
  kiln_net *net = net_run(
      "name: 'ssd'\n"
      "layer { name: 'in' type: 'Input' top: 'x' top: 'label'\n"
      "  input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } shape { dim: 2 } } }\n"
      "layer { name: 'conv4_3' type: 'Convolution' bottom: 'x' top: 'conv4_3'\n"
      "  convolution_param { num_output: 4 kernel_size: 3 pad: 1\n"
      "    weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'conv4_3_norm' type: 'Normalize' bottom: 'conv4_3' top: 'conv4_3_norm'\n"
      "  norm_param { across_spatial: false channel_shared: false\n"
      "    scale_filler { type: 'constant' value: 20 } } }\n"
      "layer { name: 'loc' type: 'Convolution' bottom: 'conv4_3_norm' top: 'loc'\n"
      "  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'conf' type: 'Convolution' bottom: 'conv4_3_norm' top: 'conf'\n"
      "  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'sum' type: 'Eltwise' bottom: 'loc' bottom: 'conf' top: 'sum' }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'sum' top: 'ip'\n"
      "  inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
      &np);
  kiln_layer *nz = kiln_net_layer(net, "conv4_3_norm");
  assert_non_null(nz);
  expect_shape(nz->param[0], 1, SHAPE(4));
  bool moved = false;
  for (int c = 0; c < 4; c++) moved |= nz->param[0]->diff[c] != 0;
  assert_true(moved);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bn_forward_hand),
      cmocka_unit_test(test_bn_stored_statistics),
      cmocka_unit_test(test_bn_global_stats),
      cmocka_unit_test(test_bn_train_statistics),
      cmocka_unit_test(test_bn_gradients),
      cmocka_unit_test(test_bn_in_place),
      cmocka_unit_test(test_bn_bad_parameters),
      cmocka_unit_test(test_bn_scale_in_net),
      cmocka_unit_test(test_scale_forward_backward_hand),
      cmocka_unit_test(test_scale_axes),
      cmocka_unit_test(test_scale_from_bottom_hand),
      cmocka_unit_test(test_scale_gradients),
      cmocka_unit_test(test_scale_in_place),
      cmocka_unit_test(test_scale_bad_parameters),
      cmocka_unit_test(test_bias_hand),
      cmocka_unit_test(test_bias_gradients),
      cmocka_unit_test(test_bias_bad_parameters),
      cmocka_unit_test(test_lrn_across_hand),
      cmocka_unit_test(test_lrn_within_hand),
      cmocka_unit_test(test_lrn_reference),
      cmocka_unit_test(test_lrn_gradients),
      cmocka_unit_test(test_lrn_bad_parameters),
      cmocka_unit_test(test_normalize_forward_hand),
      cmocka_unit_test(test_normalize_eps_and_backward_hand),
      cmocka_unit_test(test_normalize_gradients),
      cmocka_unit_test(test_normalize_bad_parameters),
      cmocka_unit_test(test_normalize_in_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
