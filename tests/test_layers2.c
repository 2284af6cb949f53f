/* Layers, second set: BatchNorm, Scale, Bias, Eltwise, Concat, Slice, Reshape. Each has a forward
 * (and where it matters backward) worked out by hand, a finite-difference gradient check
 * (tests/support/gradcheck.c), its bad-parameter errors (a status and a message naming the
 * layer), and in-place runs where Caffe nets use them in place. BatchNorm also has its
 * statistics checked: the normalised output, the stored sums after two passes, TEST mode on the
 * stored statistics, and the frozen blobs inside a net. */
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

/* Runs `text` once out of place and once in place (top = bottom 0) on copies of `bottoms` with
 * the same parameters and top gradient: outputs, bottom gradients and parameter gradients must
 * agree exactly. */
static void expect_in_place_same(const char *text, int phase, kiln_blob **bottoms, int nbottom) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 5, 5);
  kiln_blob *a[4], *b[4];
  for (int i = 0; i < nbottom; i++) {
    a[i] = blob_copy("a", bottoms[i]);
    b[i] = blob_copy("b", bottoms[i]);
  }
  built out = build(text, phase, a, nbottom, 1);
  built in = build_on(text, phase, b, nbottom, &b[0], 1);
  assert_int_equal(out.l->nparam, in.l->nparam);
  for (int p = 0; p < out.l->nparam; p++) {
    set_params(&in, p, out.l->param[p]->data);
    fill(out.l->param[p]->diff, out.l->param[p]->count, 0);
    fill(in.l->param[p]->diff, in.l->param[p]->count, 0);
  }
  forward(&out);
  forward(&in);
  int64_t n = out.top[0]->count;
  expect_close("in-place output", b[0]->data, out.top[0]->data, n, 0);
  for (int64_t i = 0; i < n; i++) out.top[0]->diff[i] = b[0]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
  backward(&out);
  backward(&in);
  for (int i = 0; i < nbottom; i++) expect_close("in-place bottom diff", b[i]->diff, a[i]->diff, a[i]->count, 0);
  for (int p = 0; p < out.l->nparam; p++)
    expect_close("in-place param diff", in.l->param[p]->diff, out.l->param[p]->diff,
                 out.l->param[p]->count, 0);
  unbuild(&out);
  unbuild(&in);
  for (int i = 0; i < nbottom; i++) {
    kiln_blob_free(a[i]);
    kiln_blob_free(b[i]);
  }
}

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

/* Builds a TRAIN net from `text` with random 'x' in [-1, 1) and zero labels, runs forward and
 * backward and checks the loss is finite and positive. */
static kiln_net *net_run(const char *text, Caffe__NetParameter **np) {
  if (kiln_net_param_from_text(text, "test.prototxt", np)) {
    print_error("%s\n", kiln_last_error());
    fail();
  }
  kiln_net_options opt = {.phase = TRAIN, .seed = 3, .config = kiln_test_config()};
  kiln_net *net;
  if (kiln_net_create(*np, &opt, &net)) {
    print_error("%s\n", kiln_last_error());
    fail();
  }
  kiln_rng rng;
  kiln_rng_seed(&rng, 33, 1);
  kiln_blob *x = kiln_net_blob(net, "x");
  assert_non_null(x);
  for (int64_t i = 0; i < x->count; i++) x->data[i] = kiln_rng_uniform(&rng, -1, 1);
  float loss = 0;
  kiln_net_zero_param_diff(net);
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_true(isfinite(loss) && loss > 0);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  return net;
}

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

/* Slice, Concat, Eltwise (with a fan-out the net splits), Reshape and Bias wired in a net. */
static void test_shape_layers_in_net(void **state) {
  (void)state;
  const char *text =
      "name: 'shapenet'\n"
      "layer { name: 'in' type: 'Input' top: 'x' top: 'label' input_param {\n"
      "  shape { dim: 4 dim: 3 dim: 2 dim: 2 } shape { dim: 4 dim: 4 } } }\n"
      "layer { name: 'sl' type: 'Slice' bottom: 'x' top: 'h1' top: 'h2' slice_param { slice_point: 1 } }\n"
      "layer { name: 'cat' type: 'Concat' bottom: 'h2' bottom: 'h1' top: 'hc' }\n"
      "layer { name: 'sum' type: 'Eltwise' bottom: 'hc' bottom: 'x' top: 'e' }\n"
      "layer { name: 'rs' type: 'Reshape' bottom: 'e' top: 'r' reshape_param { shape { dim: 0 dim: 3 dim: -1 } } }\n"
      "layer { name: 'b' type: 'Bias' bottom: 'r' top: 'rb' bias_param { filler { type: 'gaussian' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'rb' bottom: 'label' top: 'loss' }\n";
  Caffe__NetParameter *np;
  kiln_net *net = net_run(text, &np);
  kiln_blob *r = kiln_net_blob(net, "r");
  assert_non_null(r);
  expect_shape(r, 3, SHAPE(4, 3, 4));
  kiln_layer *b = kiln_net_layer(net, "b");
  assert_non_null(b);
  /* the bias gradient of a softmax loss sums to 0 over the classes of each position: 3 classes,
   * so the three entries of db add up to 0 */
  double sum = 0, mag = 0;
  for (int i = 0; i < 3; i++) {
    sum += b->param[0]->diff[i];
    mag += fabs(b->param[0]->diff[i]);
  }
  assert_true(mag > 0);
  assert_true(fabs(sum) < 1e-5);
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

/* ---- Eltwise -------------------------------------------------------------------------------- */

/* a = 1 -2 3 0.5, b = 2 2 -1 0.5, c = 0 1 4 -3:
 *   SUM                 3    1    6   -2
 *   SUM coeff 1 -2 0.5  -3  -5.5  7   -2
 *   PROD                0   -4  -12   -0.75
 *   MAX                 2    2    4    0.5  (winners b b c b: b wins the tie with a)
 * Backward, dy = 1 2 3 4: SUM coeff: a dy, b -2 dy, c 0.5 dy; MAX: each dy to its winner;
 * PROD with dy = 1: da = bc = 0 2 -4 -1.5, db = ac = 0 -2 12 -1.5, dc = ab = 2 -4 -3 0.25. */
static const float el_a[4] = {1, -2, 3, 0.5f}, el_b[4] = {2, 2, -1, 0.5f}, el_c[4] = {0, 1, 4, -3};

static void eltwise_run(const char *param, const float *dy, const float *want_y,
                        const float *want_da, const float *want_db, const float *want_dc) {
  kiln_blob *a = blob_of("a", 2, SHAPE(2, 2), el_a);
  kiln_blob *b = blob_of("b", 2, SHAPE(2, 2), el_b);
  kiln_blob *c = blob_of("c", 2, SHAPE(2, 2), el_c);
  kiln_blob *bot[3] = {a, b, c};
  char text[256];
  snprintf(text, sizeof text, "name: 'el' type: 'Eltwise' %s", param);
  built e = build(text, TRAIN, bot, 3, 1);
  assert_int_equal(e.l->nparam, 0);
  forward(&e);
  expect_shape(e.top[0], 2, SHAPE(2, 2));
  expect_close(text, e.top[0]->data, want_y, 4, 1e-6);
  memcpy(e.top[0]->diff, dy, sizeof(float) * 4);
  for (int i = 0; i < 3; i++) fill(bot[i]->diff, 4, 77);
  backward(&e);
  expect_close("da", a->diff, want_da, 4, 1e-6);
  expect_close("db", b->diff, want_db, 4, 1e-6);
  expect_close("dc", c->diff, want_dc, 4, 1e-6);
  unbuild(&e);
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
}

static void test_eltwise_hand(void **state) {
  (void)state;
  const float dy[4] = {1, 2, 3, 4}, ones[4] = {1, 1, 1, 1};
  eltwise_run("", dy, (const float[]){3, 1, 6, -2}, dy, dy, dy);
  eltwise_run("eltwise_param { operation: SUM coeff: 1 coeff: -2 coeff: 0.5 }", dy,
              (const float[]){-3, -5.5f, 7, -2}, dy, (const float[]){-2, -4, -6, -8},
              (const float[]){0.5f, 1, 1.5f, 2});
  eltwise_run("eltwise_param { operation: PROD }", ones, (const float[]){0, -4, -12, -0.75f},
              (const float[]){0, 2, -4, -1.5f}, (const float[]){0, -2, 12, -1.5f},
              (const float[]){2, -4, -3, 0.25f});
  eltwise_run("eltwise_param { operation: MAX }", dy, (const float[]){2, 2, 4, 0.5f},
              (const float[]){0, 0, 0, 0}, (const float[]){1, 2, 0, 4}, (const float[]){0, 0, 3, 0});
}

static void test_eltwise_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 50, 1);
  kiln_blob *a = gc_blob("a", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  kiln_blob *b = gc_blob("b", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  kiln_blob *c = gc_blob("c", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  kiln_blob *bot[3] = {a, b, c};
  check_grad("name: 'el' type: 'Eltwise'", bot, 2, 1, NULL);
  check_grad("name: 'el' type: 'Eltwise' eltwise_param { coeff: 0.5 coeff: -1.5 coeff: 2 }", bot,
             3, 1, NULL);
  check_grad("name: 'el' type: 'Eltwise' eltwise_param { operation: PROD }", bot, 3, 1, NULL);
  /* The unstable form divides by the input: keep inputs away from 0. */
  kiln_blob *p = gc_blob("p", 2, SHAPE(3, 4), 0.5f, 1.5f, &rng);
  kiln_blob *q = gc_blob("q", 2, SHAPE(3, 4), -1.5f, -0.5f, &rng);
  kiln_blob *pq[2] = {p, q};
  check_grad("name: 'el' type: 'Eltwise' eltwise_param { operation: PROD stable_prod_grad: false }",
             pq, 2, 1, NULL);
  kiln_blob_free(p);
  kiln_blob_free(q);
  /* MAX: every value distinct across the three bottoms (0.05 apart), step well below the gap. */
  kiln_blob *all = distinct_blob("all", 1, SHAPE(3 * 24), &rng);
  for (int i = 0; i < 3; i++) memcpy(bot[i]->data, all->data + 24 * i, sizeof(float) * 24);
  const gradcheck_opts small = {.step = 1e-3};
  check_grad("name: 'el' type: 'Eltwise' eltwise_param { operation: MAX }", bot, 3, 1, &small);
  check_grad("name: 'el' type: 'Eltwise' eltwise_param { operation: MAX }", bot, 2, 1, &small);
  kiln_blob_free(all);
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
}

static void test_eltwise_in_place(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 51, 1);
  kiln_blob *all = distinct_blob("all", 1, SHAPE(3 * 12), &rng);
  kiln_blob *a = blob_of("a", 2, SHAPE(3, 4), all->data);
  kiln_blob *b = blob_of("b", 2, SHAPE(3, 4), all->data + 12);
  kiln_blob *c = blob_of("c", 2, SHAPE(3, 4), all->data + 24);
  kiln_blob *bot[3] = {a, b, c};
  expect_in_place_same("name: 'el' type: 'Eltwise' eltwise_param { coeff: 2 coeff: -1 coeff: 3 }",
                       TRAIN, bot, 3);
  expect_in_place_same("name: 'el' type: 'Eltwise' eltwise_param { operation: PROD }", TRAIN, bot, 3);
  expect_in_place_same("name: 'el' type: 'Eltwise' eltwise_param { operation: PROD "
                       "stable_prod_grad: false }",
                       TRAIN, bot, 2);
  expect_in_place_same("name: 'el' type: 'Eltwise' eltwise_param { operation: MAX }", TRAIN, bot, 3);
  kiln_blob_free(all);
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
}

static void test_eltwise_bad_parameters(void **state) {
  (void)state;
  kiln_blob *a = blob_of("a", 2, SHAPE(2, 3), NULL);
  kiln_blob *b = blob_of("b", 2, SHAPE(2, 3), NULL);
  kiln_blob *c = blob_of("c", 2, SHAPE(3, 2), NULL);
  kiln_blob *d = blob_of("d", 3, SHAPE(2, 3, 1), NULL);
  kiln_blob *ab[2] = {a, b}, *ac[3] = {a, b, c}, *ad[2] = {a, d};
  expect_fails_ex("name: 'el_shape' type: 'Eltwise'", TRAIN, ac, 3, 1, false, KILN_ERR_SHAPE,
                  "layer 'el_shape' (Eltwise)", "bottom 2 'c' has shape 3x2", "2x3");
  expect_fails_ex("name: 'el_axes' type: 'Eltwise'", TRAIN, ad, 2, 1, false, KILN_ERR_SHAPE,
                  "layer 'el_axes' (Eltwise)", "2x3x1", "same shape");
  expect_create_fails("name: 'el_coeff' type: 'Eltwise' eltwise_param { coeff: 1 coeff: 2 coeff: 3 }",
                      TRAIN, ab, 2, 1, KILN_ERR_INVALID, "layer 'el_coeff' (Eltwise)",
                      "3 coeff values for 2 bottoms");
  expect_create_fails("name: 'el_prod' type: 'Eltwise' eltwise_param { operation: PROD coeff: 1 "
                      "coeff: 2 }",
                      TRAIN, ab, 2, 1, KILN_ERR_INVALID, "layer 'el_prod' (Eltwise)", "SUM only");
  expect_create_fails("name: 'el_one' type: 'Eltwise'", TRAIN, ab, 1, 1, KILN_ERR_INVALID,
                      "layer 'el_one' (Eltwise)", "bottom");
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
  kiln_blob_free(d);
}

/* ---- Concat --------------------------------------------------------------------------------- */

/* a (2, 1, 2) = 1 2 | 3 4, b (2, 2, 2) = 10..17 on axis 1: 1 2 10 11 12 13 | 3 4 14 15 16 17;
 * dy = 0..11: da = 0 1 | 6 7, db = 2 3 4 5 | 8 9 10 11. */
static void test_concat_hand(void **state) {
  (void)state;
  kiln_blob *a = iota_blob("a", 3, SHAPE(2, 1, 2), 1);
  kiln_blob *b = iota_blob("b", 3, SHAPE(2, 2, 2), 10);
  kiln_blob *ab[2] = {a, b};
  built c = build("name: 'cat' type: 'Concat'", TRAIN, ab, 2, 1);
  forward(&c);
  expect_shape(c.top[0], 3, SHAPE(2, 3, 2));
  expect_close("concat y", c.top[0]->data, (const float[]){1, 2, 10, 11, 12, 13, 3, 4, 14, 15, 16, 17},
               12, 0);
  for (int i = 0; i < 12; i++) c.top[0]->diff[i] = (float)i;
  fill(a->diff, 4, -1);
  fill(b->diff, 8, -1);
  backward(&c);
  expect_close("concat da", a->diff, (const float[]){0, 1, 6, 7}, 4, 0);
  expect_close("concat db", b->diff, (const float[]){2, 3, 4, 5, 8, 9, 10, 11}, 8, 0);
  unbuild(&c);
  kiln_blob_free(a);
  kiln_blob_free(b);

  /* axis 0, the deprecated concat_dim 0, and axis -1 */
  kiln_blob *p = iota_blob("p", 2, SHAPE(1, 2), 1);
  kiln_blob *q = iota_blob("q", 2, SHAPE(2, 2), 3);
  kiln_blob *pq[2] = {p, q};
  const char *rows[2] = {"name: 'cat' type: 'Concat' concat_param { axis: 0 }",
                         "name: 'cat' type: 'Concat' concat_param { concat_dim: 0 }"};
  for (int k = 0; k < 2; k++) {
    built r = build(rows[k], TRAIN, pq, 2, 1);
    forward(&r);
    expect_shape(r.top[0], 2, SHAPE(3, 2));
    expect_close(rows[k], r.top[0]->data, (const float[]){1, 2, 3, 4, 5, 6}, 6, 0);
    unbuild(&r);
  }
  kiln_blob *s = iota_blob("s", 2, SHAPE(2, 1), 1);
  kiln_blob *sq[2] = {s, q};
  built last = build("name: 'cat' type: 'Concat' concat_param { axis: -1 }", TRAIN, sq, 2, 1);
  forward(&last);
  expect_shape(last.top[0], 2, SHAPE(2, 3));
  expect_close("concat axis -1", last.top[0]->data, (const float[]){1, 3, 4, 2, 5, 6}, 6, 0);
  unbuild(&last);
  /* one bottom: a copy */
  built one = build("name: 'cat' type: 'Concat'", TRAIN, &q, 1, 1);
  forward(&one);
  expect_close("concat of one", one.top[0]->data, q->data, 4, 0);
  unbuild(&one);
  kiln_blob_free(s);
  kiln_blob_free(p);
  kiln_blob_free(q);
}

static void test_concat_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 60, 1);
  kiln_blob *a = gc_blob("a", 4, SHAPE(2, 3, 2, 3), -1, 1, &rng);
  kiln_blob *b = gc_blob("b", 4, SHAPE(2, 1, 2, 3), -1, 1, &rng);
  kiln_blob *c = gc_blob("c", 4, SHAPE(2, 2, 2, 3), -1, 1, &rng);
  kiln_blob *bot[3] = {a, b, c};
  check_grad("name: 'cat' type: 'Concat'", bot, 3, 1, NULL);
  kiln_blob *d = gc_blob("d", 4, SHAPE(2, 3, 4, 3), -1, 1, &rng);
  kiln_blob *ad[2] = {a, d};
  check_grad("name: 'cat' type: 'Concat' concat_param { axis: 2 }", ad, 2, 1, NULL);
  const gradcheck_opts only_second = {.bottom_mask = 2};
  check_grad("name: 'cat' type: 'Concat' concat_param { axis: -2 }", ad, 2, 1, &only_second);
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
  kiln_blob_free(d);
}

static void test_concat_bad_parameters(void **state) {
  (void)state;
  kiln_blob *a = blob_of("a", 4, SHAPE(2, 3, 4, 4), NULL);
  kiln_blob *b = blob_of("b", 4, SHAPE(2, 5, 4, 5), NULL);
  kiln_blob *c = blob_of("c", 3, SHAPE(2, 3, 4), NULL);
  kiln_blob *ab[2] = {a, b}, *ac[2] = {a, c};
  /* differs on axis 3 as well as on the concat axis 1 */
  expect_fails_ex("name: 'cat_shape' type: 'Concat'", TRAIN, ab, 2, 1, false, KILN_ERR_SHAPE,
                  "layer 'cat_shape' (Concat)", "2x5x4x5", "2x3x4x4");
  expect_message("on axis 3", "concatenation axis 1", NULL);
  expect_fails_ex("name: 'cat_axes' type: 'Concat'", TRAIN, ac, 2, 1, false, KILN_ERR_SHAPE,
                  "layer 'cat_axes' (Concat)", "2x3x4", "2x3x4x4");
  expect_create_fails("name: 'cat_both' type: 'Concat' concat_param { axis: 1 concat_dim: 1 }",
                      TRAIN, ab, 2, 1, KILN_ERR_INVALID, "layer 'cat_both' (Concat)", "not both");
  expect_create_fails("name: 'cat_axis' type: 'Concat' concat_param { axis: 4 }", TRAIN, ab, 2, 1,
                      KILN_ERR_SHAPE, "layer 'cat_axis' (Concat)", "axis 4");
  expect_create_fails("name: 'cat_dim' type: 'Concat' concat_param { concat_dim: 7 }", TRAIN, ab,
                      2, 1, KILN_ERR_SHAPE, "layer 'cat_dim' (Concat)", "concat_dim 7");
  kiln_blob *aa[2] = {a, a};
  expect_fails_ex("name: 'cat_in_place' type: 'Concat'", TRAIN, aa, 2, 1, true, KILN_ERR_INVALID,
                  "layer 'cat_in_place' (Concat)", "in place", NULL);
  kiln_blob_free(a);
  kiln_blob_free(b);
  kiln_blob_free(c);
}

/* ---- Slice ---------------------------------------------------------------------------------- */

/* x (2, 5) = 0..9 cut at 1 and 3 on axis 1: (2,1) 0 5 | (2,2) 1 2 6 7 | (2,2) 3 4 8 9. */
static void test_slice_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 2, SHAPE(2, 5), 0);
  built s = build("name: 'sl' type: 'Slice' slice_param { slice_point: 1 slice_point: 3 }", TRAIN,
                  &x, 1, 3);
  forward(&s);
  expect_shape(s.top[0], 2, SHAPE(2, 1));
  expect_shape(s.top[1], 2, SHAPE(2, 2));
  expect_shape(s.top[2], 2, SHAPE(2, 2));
  expect_close("slice 0", s.top[0]->data, (const float[]){0, 5}, 2, 0);
  expect_close("slice 1", s.top[1]->data, (const float[]){1, 2, 6, 7}, 4, 0);
  expect_close("slice 2", s.top[2]->data, (const float[]){3, 4, 8, 9}, 4, 0);
  /* backward reassembles: give each top diff its data + 100 */
  for (int t = 0; t < 3; t++)
    for (int64_t i = 0; i < s.top[t]->count; i++) s.top[t]->diff[i] = s.top[t]->data[i] + 100;
  fill(x->diff, 10, -1);
  backward(&s);
  for (int i = 0; i < 10; i++) assert_float_equal(x->diff[i], 100 + i, 0);
  unbuild(&s);

  /* equal split along axis 0, by axis and by the deprecated slice_dim */
  kiln_blob *y = iota_blob("y", 2, SHAPE(4, 3), 0);
  const char *eq[2] = {"name: 'sl' type: 'Slice' slice_param { axis: 0 }",
                       "name: 'sl' type: 'Slice' slice_param { slice_dim: 0 }"};
  for (int k = 0; k < 2; k++) {
    built e = build(eq[k], TRAIN, &y, 1, 2);
    forward(&e);
    expect_shape(e.top[0], 2, SHAPE(2, 3));
    expect_shape(e.top[1], 2, SHAPE(2, 3));
    expect_close(eq[k], e.top[0]->data, (const float[]){0, 1, 2, 3, 4, 5}, 6, 0);
    expect_close(eq[k], e.top[1]->data, (const float[]){6, 7, 8, 9, 10, 11}, 6, 0);
    unbuild(&e);
  }
  /* default axis 1 into three, axis -1 with a point */
  built three = build("name: 'sl' type: 'Slice'", TRAIN, &y, 1, 3);
  forward(&three);
  expect_shape(three.top[2], 2, SHAPE(4, 1));
  expect_close("third column", three.top[2]->data, (const float[]){2, 5, 8, 11}, 4, 0);
  unbuild(&three);
  built neg = build("name: 'sl' type: 'Slice' slice_param { axis: -1 slice_point: 2 }", TRAIN, &y,
                    1, 2);
  expect_shape(neg.top[0], 2, SHAPE(4, 2));
  expect_shape(neg.top[1], 2, SHAPE(4, 1));
  unbuild(&neg);
  kiln_blob_free(y);
  kiln_blob_free(x);
}

static void test_slice_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 70, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 6, 2, 3), -1, 1, &rng);
  check_grad("name: 'sl' type: 'Slice' slice_param { slice_point: 1 slice_point: 4 }", &x, 1, 3,
             NULL);
  check_grad("name: 'sl' type: 'Slice' slice_param { axis: 2 }", &x, 1, 2, NULL);
  check_grad("name: 'sl' type: 'Slice' slice_param { axis: 0 }", &x, 1, 1, NULL);
  kiln_blob_free(x);
}

static void test_slice_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 5, 3), NULL);
  expect_create_fails("name: 'sl_order' type: 'Slice' slice_param { slice_point: 3 slice_point: 2 }",
                      TRAIN, &x, 1, 3, KILN_ERR_INVALID, "layer 'sl_order' (Slice)",
                      "slice_point 2 (index 1) must be greater than 3");
  expect_create_fails("name: 'sl_zero' type: 'Slice' slice_param { slice_point: 0 }", TRAIN, &x,
                      1, 2, KILN_ERR_INVALID, "layer 'sl_zero' (Slice)", "slice_point 0");
  expect_create_fails("name: 'sl_range' type: 'Slice' slice_param { slice_point: 2 slice_point: 5 }",
                      TRAIN, &x, 1, 3, KILN_ERR_INVALID, "layer 'sl_range' (Slice)",
                      "out of range");
  expect_create_fails("name: 'sl_count' type: 'Slice' slice_param { slice_point: 2 }", TRAIN, &x,
                      1, 3, KILN_ERR_INVALID, "layer 'sl_count' (Slice)", "1 slice_point values for 3 tops");
  expect_create_fails("name: 'sl_split' type: 'Slice'", TRAIN, &x, 1, 2, KILN_ERR_SHAPE,
                      "layer 'sl_split' (Slice)", "size 5 cannot be split equally into 2");
  expect_create_fails("name: 'sl_both' type: 'Slice' slice_param { axis: 1 slice_dim: 1 }", TRAIN,
                      &x, 1, 5, KILN_ERR_INVALID, "layer 'sl_both' (Slice)", "not both");
  expect_create_fails("name: 'sl_axis' type: 'Slice' slice_param { axis: 3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'sl_axis' (Slice)", "axis 3");
  expect_fails_ex("name: 'sl_in_place' type: 'Slice' slice_param { axis: 0 }", TRAIN, &x, 1, 1,
                  true, KILN_ERR_INVALID, "layer 'sl_in_place' (Slice)", "in place", NULL);
  kiln_blob_free(x);
}

/* ---- Reshape -------------------------------------------------------------------------------- */

static void reshape_expect(const char *param, int naxes, const int64_t *shape) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 80, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 4, 5), -1, 1, &rng);
  char text[256];
  snprintf(text, sizeof text, "name: 'rs' type: 'Reshape' reshape_param { %s }", param);
  built r = build(text, TRAIN, &x, 1, 1);
  expect_shape(r.top[0], naxes, shape);
  forward(&r);
  expect_close(text, r.top[0]->data, x->data, 120, 0);
  for (int i = 0; i < 120; i++) r.top[0]->diff[i] = (float)i;
  fill(x->diff, 120, -1);
  backward(&r);
  expect_close(text, x->diff, r.top[0]->diff, 120, 0);
  unbuild(&r);
  kiln_blob_free(x);
}

/* On a 2x3x4x5 input. */
static void test_reshape_shapes(void **state) {
  (void)state;
  reshape_expect("shape { dim: 6 dim: 20 }", 2, SHAPE(6, 20));
  reshape_expect("shape { dim: 0 dim: -1 }", 2, SHAPE(2, 60));
  reshape_expect("shape { dim: -1 dim: 0 dim: 0 dim: 5 }", 4, SHAPE(2, 3, 4, 5));
  reshape_expect("shape { dim: 0 dim: 0 dim: -1 }", 3, SHAPE(2, 3, 20));
  reshape_expect("shape { dim: 4 dim: -1 dim: 5 }", 3, SHAPE(4, 6, 5));
  reshape_expect("shape { dim: 120 }", 1, SHAPE(120));
  /* axis and num_axes: replace only part of the shape */
  reshape_expect("axis: 1 num_axes: 2 shape { dim: -1 }", 3, SHAPE(2, 12, 5));
  reshape_expect("axis: 1 shape { dim: 3 dim: -1 }", 3, SHAPE(2, 3, 20));
  reshape_expect("axis: -3 shape { dim: 20 }", 3, SHAPE(2, 3, 20)); /* -3: from axis 2 */
  reshape_expect("axis: 0 num_axes: 0 shape { dim: 1 }", 5, SHAPE(1, 2, 3, 4, 5));
  reshape_expect("axis: -1 num_axes: 0 shape { dim: 1 }", 5, SHAPE(2, 3, 4, 5, 1));
  reshape_expect("axis: 2 num_axes: 1 shape { dim: 2 dim: 2 }", 5, SHAPE(2, 3, 2, 2, 5));
  reshape_expect("axis: 1 num_axes: 1 shape { dim: 0 }", 4, SHAPE(2, 3, 4, 5));
}

static void test_reshape_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 81, 1);
  kiln_blob *x = gc_blob("x", 3, SHAPE(2, 3, 4), -1, 1, &rng);
  check_grad("name: 'rs' type: 'Reshape' reshape_param { shape { dim: 0 dim: -1 dim: 2 } }", &x, 1,
             1, NULL);
  kiln_blob_free(x);
}

static void test_reshape_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 3, 4, 5), NULL);
  expect_create_fails("name: 'rs_two' type: 'Reshape' reshape_param { shape { dim: -1 dim: 2 "
                      "dim: -1 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'rs_two' (Reshape)",
                      "-1 at dims 0 and 2");
  expect_create_fails("name: 'rs_div' type: 'Reshape' reshape_param { shape { dim: 7 dim: -1 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'rs_div' (Reshape)",
                      "120 elements, not divisible by 7");
  expect_create_fails("name: 'rs_count' type: 'Reshape' reshape_param { shape { dim: 6 dim: 21 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'rs_count' (Reshape)",
                      "holds 126 elements, input 2x3x4x5 has 120");
  expect_create_fails("name: 'rs_copy' type: 'Reshape' reshape_param { axis: 3 shape { dim: 0 "
                      "dim: 0 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'rs_copy' (Reshape)",
                      "no axis 4 to copy");
  expect_create_fails("name: 'rs_neg' type: 'Reshape' reshape_param { shape { dim: -2 dim: 60 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'rs_neg' (Reshape)", "-2");
  expect_create_fails("name: 'rs_axis' type: 'Reshape' reshape_param { axis: 5 shape { dim: 1 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'rs_axis' (Reshape)", "axis 5");
  expect_create_fails("name: 'rs_num' type: 'Reshape' reshape_param { axis: 2 num_axes: 3 "
                      "shape { dim: 1 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'rs_num' (Reshape)", "num_axes 3");
  expect_create_fails("name: 'rs_huge' type: 'Reshape' reshape_param { shape { dim: 4611686018427387904 "
                      "dim: 4 } }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'rs_huge' (Reshape)", "input 2x3x4x5");
  expect_fails_ex("name: 'rs_in_place' type: 'Reshape' reshape_param { shape { dim: -1 } }", TRAIN,
                  &x, 1, 1, true, KILN_ERR_INVALID, "layer 'rs_in_place' (Reshape)", "in place",
                  NULL);
  kiln_blob_free(x);
}

/* ---- the gradient contract for these layers ------------------------------------------------- */

/* Backward twice after one forward with garbage in the bottom diffs before each: bottom diffs
 * come out the same (every element overwritten), parameter diffs double (accumulated). */
static void test_backward_overwrites_bottom_accumulates_params(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int nbottom, ntop;
    int naxes2; /* second bottom: 0 = same shape as the first, 1 = (4), -1 = none */
  } cases[] = {
      {"name: 'bn' type: 'BatchNorm'", 1, 1, -1},
      {"name: 'bn' type: 'BatchNorm' batch_norm_param { use_global_stats: true }", 1, 1, -1},
      {"name: 'sc' type: 'Scale' scale_param { bias_term: true filler { type: 'gaussian' } }", 1, 1, -1},
      {"name: 'sc' type: 'Scale' scale_param { bias_term: true }", 2, 1, 1},
      {"name: 'bi' type: 'Bias' bias_param { filler { type: 'gaussian' } }", 1, 1, -1},
      {"name: 'bi' type: 'Bias'", 2, 1, 1},
      {"name: 'el' type: 'Eltwise' eltwise_param { coeff: 2 coeff: -1 }", 2, 1, 0},
      {"name: 'el' type: 'Eltwise' eltwise_param { operation: PROD }", 2, 1, 0},
      {"name: 'el' type: 'Eltwise' eltwise_param { operation: MAX }", 2, 1, 0},
      {"name: 'cat' type: 'Concat'", 2, 1, 0},
      {"name: 'sl' type: 'Slice' slice_param { slice_point: 1 }", 1, 2, -1},
      {"name: 'rs' type: 'Reshape' reshape_param { shape { dim: 0 dim: -1 } }", 1, 1, -1},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 90, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kiln_blob *b[2];
    b[0] = gc_blob("x", 4, SHAPE(2, 4, 3, 3), -1, 1, &rng);
    b[1] = cases[k].naxes2 == 0 ? gc_blob("x2", 4, SHAPE(2, 4, 3, 3), -1, 1, &rng)
                                : gc_blob("x2", 1, SHAPE(4), -1, 1, &rng);
    built l = build(cases[k].text, TRAIN, b, cases[k].nbottom, cases[k].ntop);
    assert_non_null(l.l->ops->backward);
    forward(&l);
    for (int t = 0; t < l.ntop; t++)
      for (int64_t i = 0; i < l.top[t]->count; i++) l.top[t]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
    for (int p = 0; p < l.l->nparam; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
    float *dx1[2], *dp1[KILN_MAX_LAYER_PARAMS];
    for (int i = 0; i < cases[k].nbottom; i++) fill(b[i]->diff, b[i]->count, 123.0f);
    backward(&l);
    for (int i = 0; i < cases[k].nbottom; i++) {
      dx1[i] = malloc(sizeof(float) * (size_t)b[i]->count);
      assert_non_null(dx1[i]);
      memcpy(dx1[i], b[i]->diff, sizeof(float) * (size_t)b[i]->count);
      fill(b[i]->diff, b[i]->count, -77.0f);
    }
    for (int p = 0; p < l.l->nparam; p++) {
      dp1[p] = malloc(sizeof(float) * (size_t)l.l->param[p]->count);
      assert_non_null(dp1[p]);
      for (int64_t i = 0; i < l.l->param[p]->count; i++) dp1[p][i] = 2 * l.l->param[p]->diff[i];
    }
    backward(&l);
    char what[300];
    for (int i = 0; i < cases[k].nbottom; i++) {
      snprintf(what, sizeof what, "%s: bottom %d diff after a second backward", cases[k].text, i);
      expect_close(what, b[i]->diff, dx1[i], b[i]->count, 0);
      free(dx1[i]);
    }
    for (int p = 0; p < l.l->nparam; p++) {
      snprintf(what, sizeof what, "%s: param %d diff after a second backward", cases[k].text, p);
      expect_close(what, l.l->param[p]->diff, dp1[p], l.l->param[p]->count, 1e-6);
      free(dp1[p]);
    }
    unbuild(&l);
    kiln_blob_free(b[0]);
    kiln_blob_free(b[1]);
  }
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
      cmocka_unit_test(test_shape_layers_in_net),
      cmocka_unit_test(test_scale_forward_backward_hand),
      cmocka_unit_test(test_scale_axes),
      cmocka_unit_test(test_scale_from_bottom_hand),
      cmocka_unit_test(test_scale_gradients),
      cmocka_unit_test(test_scale_in_place),
      cmocka_unit_test(test_scale_bad_parameters),
      cmocka_unit_test(test_bias_hand),
      cmocka_unit_test(test_bias_gradients),
      cmocka_unit_test(test_bias_bad_parameters),
      cmocka_unit_test(test_eltwise_hand),
      cmocka_unit_test(test_eltwise_gradients),
      cmocka_unit_test(test_eltwise_in_place),
      cmocka_unit_test(test_eltwise_bad_parameters),
      cmocka_unit_test(test_concat_hand),
      cmocka_unit_test(test_concat_gradients),
      cmocka_unit_test(test_concat_bad_parameters),
      cmocka_unit_test(test_slice_hand),
      cmocka_unit_test(test_slice_gradients),
      cmocka_unit_test(test_slice_bad_parameters),
      cmocka_unit_test(test_reshape_shapes),
      cmocka_unit_test(test_reshape_gradients),
      cmocka_unit_test(test_reshape_bad_parameters),
      cmocka_unit_test(test_backward_overwrites_bottom_accumulates_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
