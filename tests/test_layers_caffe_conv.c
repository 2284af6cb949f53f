/* Caffe's window layers beyond Convolution and Pooling: Deconvolution (convolution's transpose,
 * on the convolution kernels), Im2col and SPP (spatial pyramid pooling). Forward and backward
 * passes against values worked out by hand, Deconvolution as the adjoint of Convolution with the
 * same weights, finite-difference gradient checks, and the errors bad parameters and shapes
 * give. */
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

static const float x22[4] = {1, 2, 3, 4};
static const float w22[4] = {1, 2, 3, 4};

/* ---- Deconvolution ----------------------------------------------------------------------- */

/* One channel in and out, x = 1 2 | 3 4, w = 1 2 | 3 4: each input value stamps x[i][j] w at
 * (i, j) of the output and the stamps add up.
 *   kernel 2, stride 1: 3x3 (1 (2 - 1) + 2) = 1 4 4 | 6 20 16 | 9 24 16 (y[1][1] = 1 4 + 2 3 +
 *   3 2 + 4 1); with bias 0.5 every value + 0.5.
 *   kernel 2, stride 2: 4x4, the stamps side by side: 1 2 2 4 | 3 4 6 8 | 3 6 4 8 | 9 12 12 16.
 *   kernel 2, stride 2, pad 1: 2x2, the middle of the 4x4: 4 6 | 6 4. */
static void test_deconvolution_hand(void **state) {
  (void)state;
  const struct {
    const char *text;
    int64_t side;
    float y[16];
  } cases[] = {
      {"name: 'd' type: 'Deconvolution' convolution_param { num_output: 1 kernel_size: 2 "
       "bias_term: false }",
       3, {1, 4, 4, 6, 20, 16, 9, 24, 16}},
      {"name: 'd' type: 'Deconvolution' convolution_param { num_output: 1 kernel_size: 2 "
       "bias_filler { type: 'constant' value: 0.5 } }",
       3, {1.5f, 4.5f, 4.5f, 6.5f, 20.5f, 16.5f, 9.5f, 24.5f, 16.5f}},
      {"name: 'd' type: 'Deconvolution' convolution_param { num_output: 1 kernel_size: 2 "
       "stride: 2 bias_term: false }",
       4, {1, 2, 2, 4, 3, 4, 6, 8, 3, 6, 4, 8, 9, 12, 12, 16}},
      {"name: 'd' type: 'Deconvolution' convolution_param { num_output: 1 kernel_size: 2 "
       "stride: 2 pad: 1 bias_term: false }",
       2, {4, 6, 6, 4}},
  };
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 2, 2), x22);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    built d = build(cases[k].text, TRAIN, &x, 1, 1);
    expect_shape(d.l->param[0], 4, SHAPE(1, 1, 2, 2));
    set_params(&d, 0, w22);
    forward(&d);
    expect_shape(d.top[0], 4, SHAPE(1, 1, cases[k].side, cases[k].side));
    expect_close(cases[k].text, d.top[0]->data, cases[k].y, cases[k].side * cases[k].side, 1e-6);
    unbuild(&d);
  }
  /* the gradient of x for kernel 2, stride 1 with dy = 1 everywhere: every input value stamps
   * all of w, so dx = sum w = 10; db = 9 (the output's size), dw[a][b] = sum of x = 10 */
  built d = build(cases[1].text, TRAIN, &x, 1, 1);
  set_params(&d, 0, w22);
  forward(&d);
  fill(d.top[0]->diff, 9, 1);
  fill(d.l->param[0]->diff, 4, 0);
  fill(d.l->param[1]->diff, 1, 0);
  fill(x->diff, 4, 99);
  backward(&d);
  expect_close("deconv dx", x->diff, (const float[]){10, 10, 10, 10}, 4, 1e-6);
  expect_close("deconv dw", d.l->param[0]->diff, (const float[]){10, 10, 10, 10}, 4, 1e-6);
  expect_close("deconv db", d.l->param[1]->diff, (const float[]){9}, 1, 1e-6);
  unbuild(&d);
  kiln_blob_free(x);
}

/* Caffe's weight shape [C_in, num_output / group, kh, kw], and the output size
 * stride (H - 1) + dilation (k - 1) + 1 - 2 pad. */
static void test_deconvolution_shapes(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 4, 3, 5), NULL);
  built a = build("name: 'd' type: 'Deconvolution' convolution_param { num_output: 6 "
                  "kernel_size: 3 stride: 2 pad: 1 }",
                  TRAIN, &x, 1, 1);
  expect_shape(a.l->param[0], 4, SHAPE(4, 6, 3, 3));
  expect_shape(a.l->param[1], 1, SHAPE(6));
  expect_shape(a.top[0], 4, SHAPE(2, 6, 5, 9)); /* 2 (3 - 1) + 3 - 2, 2 (5 - 1) + 3 - 2 */
  unbuild(&a);
  built g = build("name: 'd' type: 'Deconvolution' convolution_param { num_output: 6 "
                  "kernel_h: 2 kernel_w: 3 group: 2 dilation: 2 }",
                  TRAIN, &x, 1, 1);
  expect_shape(g.l->param[0], 4, SHAPE(4, 3, 2, 3));
  expect_shape(g.top[0], 4, SHAPE(2, 6, 5, 9)); /* 3 - 1 + 2 (2 - 1) + 1, 5 - 1 + 2 (3 - 1) + 1 */
  unbuild(&g);
  expect_create_fails("name: 'no' type: 'Deconvolution' convolution_param { kernel_size: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'no' (Deconvolution)",
                      "num_output");
  expect_create_fails("name: 'gr' type: 'Deconvolution' convolution_param { num_output: 5 "
                      "kernel_size: 2 group: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'gr' (Deconvolution)",
                      "convolution_param.group 2");
  expect_create_fails("name: 'k' type: 'Deconvolution' convolution_param { num_output: 2 }", TRAIN,
                      &x, 1, 1, KILN_ERR_INVALID, "layer 'k' (Deconvolution)", "kernel size");
  kiln_blob *one = blob_of("one", 4, SHAPE(1, 1, 1, 1), NULL);
  expect_create_fails("name: 'sz' type: 'Deconvolution' convolution_param { num_output: 1 "
                      "kernel_size: 1 pad: 1 }",
                      TRAIN, &one, 1, 1, KILN_ERR_SHAPE, "layer 'sz' (Deconvolution)",
                      "gives a -1x-1 output");
  kiln_blob_free(one);
  kiln_blob_free(x);
}

/* Deconvolution is the transpose of Convolution with the same weights: for r and a of the
 * shapes each maps from, <conv(a), r> = <a, deconv(r)>, with stride, pad, dilation and groups;
 * and the convolution maps deconv's output shape back to r's. */
static void test_deconvolution_is_conv_transpose(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 101, 1);
  const char *geom[] = {"kernel_size: 3 stride: 2 pad: 1", "kernel_size: 2",
                        "kernel_h: 3 kernel_w: 2 stride: 2 dilation: 2 group: 2",
                        "kernel_size: 1 stride: 1", "kernel_size: 3 stride: 3 pad: 2 group: 2"};
  for (size_t k = 0; k < sizeof geom / sizeof geom[0]; k++) {
    char ctext[256], dtext[256];
    snprintf(ctext, sizeof ctext,
             "name: 'c' type: 'Convolution' convolution_param { num_output: 6 bias_term: false %s "
             "}",
             geom[k]);
    snprintf(dtext, sizeof dtext,
             "name: 'd' type: 'Deconvolution' convolution_param { num_output: 4 bias_term: false "
             "weight_filler { type: 'gaussian' } %s }",
             geom[k]);
    kiln_blob *r = gc_blob("r", 4, SHAPE(2, 6, 3, 4), -1, 1, &rng);
    built d = build(dtext, TRAIN, &r, 1, 1);
    forward(&d);
    kiln_blob *a = gc_blob("a", 4, d.top[0]->shape, -1, 1, &rng);
    built c = build(ctext, TRAIN, &a, 1, 1);
    expect_shape(c.l->param[0], 4, d.l->param[0]->shape);
    set_params(&c, 0, d.l->param[0]->data);
    forward(&c);
    expect_shape(c.top[0], 4, r->shape);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < r->count; i++) lhs += (double)c.top[0]->data[i] * r->data[i];
    for (int64_t i = 0; i < a->count; i++) rhs += (double)a->data[i] * d.top[0]->data[i];
    if (fabs(lhs - rhs) > 1e-4 * fmax(1, fabs(lhs)))
      fail_msg("%s: <conv a, r> %.8g, <a, deconv r> %.8g", geom[k], lhs, rhs);
    unbuild(&c);
    unbuild(&d);
    kiln_blob_free(a);
    kiln_blob_free(r);
  }
}

static void test_deconvolution_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 102, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 3, 3), -1, 1, &rng);
  const char *texts[] = {
      "name: 'd' type: 'Deconvolution' convolution_param { num_output: 3 kernel_size: 3 stride: 2 "
      "pad: 1 weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' } }",
      "name: 'd' type: 'Deconvolution' convolution_param { num_output: 4 kernel_size: 2 group: 2 "
      "dilation: 2 weight_filler { type: 'gaussian' std: 0.5 } }",
      "name: 'd' type: 'Deconvolution' convolution_param { num_output: 2 kernel_size: 1 "
      "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' } }",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) check_grad(texts[i], &x, 1, 1, NULL);
  kiln_blob_free(x);
}

/* ---- Im2col ------------------------------------------------------------------------------ */

/* x (1, 1, 3, 3) = 0 .. 8, kernel 2: top (1, 4, 2, 2), one row per kernel position (0,0),
 * (0,1), (1,0), (1,1): 0 1 3 4 | 1 2 4 5 | 3 4 6 7 | 4 5 7 8. Backward with dy = 1: each pixel
 * gets the number of windows that hold it, 1 2 1 | 2 4 2 | 1 2 1. */
static void test_im2col_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 4, SHAPE(1, 1, 3, 3), 0);
  built c = build("name: 'i' type: 'Im2col' convolution_param { kernel_size: 2 }", TRAIN, &x, 1, 1);
  forward(&c);
  expect_shape(c.top[0], 4, SHAPE(1, 4, 2, 2));
  expect_close("im2col", c.top[0]->data,
               (const float[]){0, 1, 3, 4, 1, 2, 4, 5, 3, 4, 6, 7, 4, 5, 7, 8}, 16, 0);
  fill(c.top[0]->diff, 16, 1);
  fill(x->diff, 9, 99);
  backward(&c);
  expect_close("col2im", x->diff, (const float[]){1, 2, 1, 2, 4, 2, 1, 2, 1}, 9, 0);
  unbuild(&c);
  /* kernel 3, pad 1, stride 2: 2x2 windows centred on the corners; the first row of the top is
   * kernel position (0, 0), which reads padding for every window but the last (x[1][1] = 4) */
  built p = build("name: 'i' type: 'Im2col' convolution_param { kernel_size: 3 pad: 1 stride: 2 }",
                  TRAIN, &x, 1, 1);
  forward(&p);
  expect_shape(p.top[0], 4, SHAPE(1, 9, 2, 2));
  expect_close("im2col padded", p.top[0]->data, (const float[]){0, 0, 0, 4}, 4, 0);
  expect_close("im2col centre row", p.top[0]->data + 16, (const float[]){0, 2, 6, 8}, 4, 0);
  unbuild(&p);
  kiln_blob_free(x);
}

static void test_im2col_gradients_and_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 103, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 4, 5), -1, 1, &rng);
  check_grad("name: 'i' type: 'Im2col' convolution_param { kernel_size: 3 pad: 1 stride: 2 }", &x,
             1, 1, NULL);
  check_grad("name: 'i' type: 'Im2col' convolution_param { kernel_h: 2 kernel_w: 3 dilation: 2 }",
             &x, 1, 1, NULL);
  expect_create_fails("name: 'k' type: 'Im2col'", TRAIN, &x, 1, 1, KILN_ERR_INVALID,
                      "layer 'k' (Im2col)", "kernel size");
  expect_create_fails("name: 'big' type: 'Im2col' convolution_param { kernel_size: 6 }", TRAIN, &x,
                      1, 1, KILN_ERR_SHAPE, "layer 'big' (Im2col)", "does not fit");
  kiln_blob *flat = blob_of("flat", 2, SHAPE(2, 3), NULL);
  expect_create_fails("name: 'f' type: 'Im2col' convolution_param { kernel_size: 1 }", TRAIN,
                      &flat, 1, 1, KILN_ERR_SHAPE, "layer 'f' (Im2col)", "N x C x H x W");
  kiln_blob_free(flat);
  kiln_blob_free(x);
}

/* ---- SPP --------------------------------------------------------------------------------- */

/* x (1, 1, 4, 4) = 0 .. 15, pyramid_height 2: level 0 pools all 16 values (kernel 4), level 1
 * four 2x2 bins (kernel 2, stride 2, no pad). MAX: 15 | 5 7 13 15; AVE: 7.5 | 2.5 4.5 10.5 12.5.
 * One level: the pooling output itself, (1, 1, 1, 1).
 * x (1, 1, 5, 5) = 0 .. 24, AVE, level 1: kernel ceil(5 / 2) = 3, pad (6 - 5 + 1) / 2 = 1,
 * stride 3; bin (0, 0) sums rows and columns 0-1 (0 + 1 + 5 + 6 = 12) over Caffe's 3x3 window
 * clipped to the padded input: 12 / 9; bin (1, 1) rows and columns 2-4: 162 / 9 = 18. */
static void test_spp_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 4, SHAPE(1, 1, 4, 4), 0);
  built m = build("name: 's' type: 'SPP' spp_param { pyramid_height: 2 }", TRAIN, &x, 1, 1);
  forward(&m);
  expect_shape(m.top[0], 2, SHAPE(1, 5));
  expect_close("spp max", m.top[0]->data, (const float[]){15, 5, 7, 13, 15}, 5, 0);
  /* dy = 1 2 3 4 5: 15 gets 1 (level 0) + 5 (its bin), the other maxima their bins' */
  memcpy(m.top[0]->diff, (const float[]){1, 2, 3, 4, 5}, 5 * sizeof(float));
  fill(x->diff, 16, 99);
  backward(&m);
  float want[16] = {0};
  want[5] = 2, want[7] = 3, want[13] = 4, want[15] = 6;
  expect_close("spp max dx", x->diff, want, 16, 0);
  unbuild(&m);
  built a = build("name: 's' type: 'SPP' spp_param { pyramid_height: 2 pool: AVE }", TRAIN, &x, 1,
                  1);
  forward(&a);
  expect_close("spp ave", a.top[0]->data, (const float[]){7.5f, 2.5f, 4.5f, 10.5f, 12.5f}, 5,
               1e-6);
  unbuild(&a);
  built one = build("name: 's' type: 'SPP' spp_param { pyramid_height: 1 }", TRAIN, &x, 1, 1);
  forward(&one);
  expect_shape(one.top[0], 4, SHAPE(1, 1, 1, 1));
  expect_close("spp one level", one.top[0]->data, (const float[]){15}, 1, 0);
  unbuild(&one);
  kiln_blob *x5 = iota_blob("x5", 4, SHAPE(1, 2, 5, 5), 0);
  built p = build("name: 's' type: 'SPP' spp_param { pyramid_height: 2 pool: AVE }", TRAIN, &x5, 1,
                  1);
  forward(&p);
  expect_shape(p.top[0], 2, SHAPE(1, 10)); /* channel 0: 1 + 4, channel 1: 1 + 4 */
  expect_close("spp padded bin (0, 0)", p.top[0]->data + 2, (const float[]){12.0f / 9}, 1, 1e-6);
  expect_close("spp padded bin (1, 1)", p.top[0]->data + 5, (const float[]){18}, 1, 1e-6);
  unbuild(&p);
  kiln_blob_free(x5);
  kiln_blob_free(x);
}

static void test_spp_gradients_and_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 104, 1);
  kiln_blob *x = distinct_blob("x", 4, SHAPE(2, 2, 7, 6), &rng);
  check_grad("name: 's' type: 'SPP' spp_param { pyramid_height: 3 }", &x, 1, 1, NULL);
  check_grad("name: 's' type: 'SPP' spp_param { pyramid_height: 3 pool: AVE }", &x, 1, 1, NULL);
  check_grad("name: 's' type: 'SPP' spp_param { pyramid_height: 1 }", &x, 1, 1, NULL);
  expect_create_fails("name: 'n' type: 'SPP'", TRAIN, &x, 1, 1, KILN_ERR_INVALID,
                      "layer 'n' (SPP)", "spp_param.pyramid_height must be given");
  expect_create_fails("name: 'st' type: 'SPP' spp_param { pyramid_height: 2 pool: STOCHASTIC }",
                      TRAIN, &x, 1, 1, KILN_ERR_UNSUPPORTED, "layer 'st' (SPP)", "STOCHASTIC");
  /* 3x3 in 4x4 bins: kernel 1 with padding 1 */
  kiln_blob *small = blob_of("small", 4, SHAPE(1, 1, 3, 3), NULL);
  expect_create_fails("name: 'hi' type: 'SPP' spp_param { pyramid_height: 3 }", TRAIN, &small, 1,
                      1, KILN_ERR_SHAPE, "layer 'hi' (SPP)",
                      "spp_param.pyramid_height 3 is too high for the 3x3 input");
  kiln_blob_free(small);
  kiln_blob_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deconvolution_hand),
      cmocka_unit_test(test_deconvolution_shapes),
      cmocka_unit_test(test_deconvolution_is_conv_transpose),
      cmocka_unit_test(test_deconvolution_gradients),
      cmocka_unit_test(test_im2col_hand),
      cmocka_unit_test(test_im2col_gradients_and_errors),
      cmocka_unit_test(test_spp_hand),
      cmocka_unit_test(test_spp_gradients_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
