/* Layers: every registered layer that has a backward pass is checked against finite differences
 * (Caffe's gradient checker, tests/support/gradcheck.c), its forward pass against values worked
 * out by hand, the gradient conventions (bottom diffs OVERWRITTEN, parameter diffs ACCUMULATED)
 * and the errors that bad parameters give (a status and a message naming the layer). */
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

/* The layer types this file checks; test_registry_backward_layers_covered fails when a layer with
 * a backward pass is registered without being added here (and tested). */
static const char *const tested_types[] = {
    "Convolution", "Pooling", "InnerProduct", "ReLU",  "Sigmoid",  "TanH",    "Dropout",
    "Softmax",     "SoftmaxWithLoss", "Accuracy", "Flatten", "Split",
    /* checked in test_layers2.c */
    "BatchNorm", "Scale", "Bias", "Eltwise", "Concat", "Slice", "Reshape",
    /* tests/test_layers3.c */
    "LRN", "Power", "AbsVal", "ELU", "PReLU", "ArgMax", "EuclideanLoss", "SigmoidCrossEntropyLoss",
    "DummyData",
};

static void test_registry_backward_layers_covered(void **state) {
  (void)state;
  const char *const *names = kiln_layer_type_names();
  int n = 0;
  for (; names[n]; n++) {
    const kiln_layer_ops *ops = kiln_layer_find(names[n]);
    assert_non_null(ops);
    assert_string_equal(ops->type, names[n]);
    if (!ops->backward) continue;
    bool found = false;
    for (size_t i = 0; i < sizeof tested_types / sizeof tested_types[0]; i++)
      found |= strcmp(tested_types[i], names[n]) == 0;
    if (!found) {
      print_error("layer type '%s' has a backward pass but no test in test_layers.c\n", names[n]);
      fail();
    }
  }
  assert_true(n >= 14);
  assert_null(kiln_layer_find("Convolutoin"));
  for (size_t i = 0; i < sizeof tested_types / sizeof tested_types[0]; i++)
    assert_non_null(kiln_layer_find(tested_types[i]));
}

/* ---- Convolution ------------------------------------------------------------------------- */

/* 1x1x3x3 input, one 2x2 filter and a bias, pad 1, stride 2: out = (3 + 2 - 2) / 2 + 1 = 2.
 *   x = 1 2 3     w = 1 2     b = 0.5
 *       4 5 6         3 4
 *       7 8 9
 * Each window starts at (2*oh - 1, 2*ow - 1) in the zero-padded input:
 *   (0,0): only x00 under w11:           4*1               = 4   -> 4.5
 *   (0,1): x01, x02 under w10, w11:      3*2 + 4*3         = 18  -> 18.5
 *   (1,0): x10, x20 under w01, w11:      2*4 + 4*7         = 36  -> 36.5
 *   (1,1): x11 x12 x21 x22 under w:      5 + 12 + 24 + 36  = 77  -> 77.5
 * Backward with dy = 1 everywhere:
 *   db = 4 (four outputs);
 *   dw[ki][kj] = sum of the inputs each tap saw: w00 saw only x11 = 5; w01 saw x10 + x12 = 10;
 *   w10 saw x01 + x21 = 10; w11 saw x00 + x02 + x20 + x22 = 20;
 *   dx: each input row/column is under exactly one tap (rows 0, 2 under ki = 1, row 1 under
 *   ki = 0; the same for columns), so dx = 4 3 4 / 2 1 2 / 4 3 4. */
static void test_conv_forward_backward_hand(void **state) {
  (void)state;
  const float xv[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 3, 3), xv);
  built c = build("name: 'c' type: 'Convolution' convolution_param { num_output: 1 "
                  "kernel_size: 2 pad: 1 stride: 2 }",
                  TRAIN, &x, 1, 1);
  assert_int_equal(c.l->nparam, 2);
  expect_shape(c.l->param[0], 4, SHAPE(1, 1, 2, 2));
  expect_shape(c.l->param[1], 1, SHAPE(1));
  set_params(&c, 0, (const float[]){1, 2, 3, 4});
  set_params(&c, 1, (const float[]){0.5f});
  forward(&c);
  expect_shape(c.top[0], 4, SHAPE(1, 1, 2, 2));
  expect_close("conv out", c.top[0]->data, (const float[]){4.5f, 18.5f, 36.5f, 77.5f}, 4, 1e-6);

  fill(c.top[0]->diff, 4, 1.0f);
  fill(c.l->param[0]->diff, 4, 0.0f);
  fill(c.l->param[1]->diff, 1, 0.0f);
  fill(x->diff, 9, 1e3f); /* garbage: backward must overwrite it */
  backward(&c);
  const float dx[] = {4, 3, 4, 2, 1, 2, 4, 3, 4};
  expect_close("conv dx", x->diff, dx, 9, 1e-6);
  expect_close("conv dw", c.l->param[0]->diff, (const float[]){5, 10, 10, 20}, 4, 1e-6);
  expect_close("conv db", c.l->param[1]->diff, (const float[]){4}, 1, 1e-6);
  /* A second pass: parameter gradients add up, the input gradient is the same. */
  backward(&c);
  expect_close("conv dx again", x->diff, dx, 9, 1e-6);
  expect_close("conv dw accumulated", c.l->param[0]->diff, (const float[]){10, 20, 20, 40}, 4,
               1e-6);
  expect_close("conv db accumulated", c.l->param[1]->diff, (const float[]){8}, 1, 1e-6);
  unbuild(&c);
  kiln_blob_free(x);
}

/* Dilation, groups and a rectangular kernel, each on a case small enough to do by hand. */
static void test_conv_forward_dilation_group_rect_hand(void **state) {
  (void)state;
  const float xv[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 3, 3), xv);

  /* Dilation 2: a 2x2 kernel spans 3x3 and reads the corners: 1*1 + 2*3 + 3*7 + 4*9 = 64. */
  built d = build("name: 'dil' type: 'Convolution' convolution_param { num_output: 1 "
                  "kernel_size: 2 dilation: 2 bias_term: false }",
                  TRAIN, &x, 1, 1);
  assert_int_equal(d.l->nparam, 1);
  set_params(&d, 0, (const float[]){1, 2, 3, 4});
  forward(&d);
  expect_shape(d.top[0], 4, SHAPE(1, 1, 1, 1));
  expect_close("dilated", d.top[0]->data, (const float[]){64}, 1, 1e-6);
  unbuild(&d);

  /* kernel_h 1, kernel_w 2, stride_h 2, stride_w 1, w = (1, 10): out is (3-1)/2+1 = 2 rows by
   * (3-2)/1+1 = 2 columns over input rows 0 and 2:
   *   row 0: 1 + 10*2 = 21, 2 + 10*3 = 32;  row 2: 7 + 10*8 = 87, 8 + 10*9 = 98. */
  built r = build("name: 'rect' type: 'Convolution' convolution_param { num_output: 1 "
                  "kernel_h: 1 kernel_w: 2 stride_h: 2 stride_w: 1 bias_term: false }",
                  TRAIN, &x, 1, 1);
  expect_shape(r.l->param[0], 4, SHAPE(1, 1, 1, 2));
  set_params(&r, 0, (const float[]){1, 10});
  forward(&r);
  expect_shape(r.top[0], 4, SHAPE(1, 1, 2, 2));
  expect_close("rect", r.top[0]->data, (const float[]){21, 32, 87, 98}, 4, 1e-6);
  unbuild(&r);
  kiln_blob_free(x);

  /* group 2 on two channels with 1x1 kernels: each output sees only its own channel.
   *   ch0 = 1 2 3 4, ch1 = 5 6 7 8; w = (2, -1), b = (0.5, 1)
   *   out0 = 2*ch0 + 0.5 = 2.5 4.5 6.5 8.5;  out1 = -ch1 + 1 = -4 -5 -6 -7 */
  const float gv[] = {1, 2, 3, 4, 5, 6, 7, 8};
  kiln_blob *g = blob_of("g", 4, SHAPE(1, 2, 2, 2), gv);
  built gr = build("name: 'grp' type: 'Convolution' convolution_param { num_output: 2 "
                   "kernel_size: 1 group: 2 }",
                   TRAIN, &g, 1, 1);
  expect_shape(gr.l->param[0], 4, SHAPE(2, 1, 1, 1));
  set_params(&gr, 0, (const float[]){2, -1});
  set_params(&gr, 1, (const float[]){0.5f, 1});
  forward(&gr);
  expect_shape(gr.top[0], 4, SHAPE(1, 2, 2, 2));
  expect_close("group", gr.top[0]->data, (const float[]){2.5f, 4.5f, 6.5f, 8.5f, -4, -5, -6, -7},
               8, 1e-6);
  unbuild(&gr);
  kiln_blob_free(g);
}

static void test_conv_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 11, 1);
  const char *fillers = "weight_filler { type: 'gaussian' std: 0.5 } "
                        "bias_filler { type: 'uniform' min: -1 max: 1 }";
  char text[512];

  /* pad, stride, bias */
  kiln_blob *a = gc_blob("a", 4, SHAPE(2, 3, 5, 5), -1, 1, &rng);
  snprintf(text, sizeof text,
           "name: 'c1' type: 'Convolution' convolution_param { num_output: 4 kernel_size: 3 "
           "pad: 1 stride: 2 %s }",
           fillers);
  check_grad(text, &a, 1, 1, NULL);
  kiln_blob_free(a);

  /* dilation and group, no bias */
  kiln_blob *b = gc_blob("b", 4, SHAPE(2, 4, 6, 6), -1, 1, &rng);
  snprintf(text, sizeof text,
           "name: 'c2' type: 'Convolution' convolution_param { num_output: 6 kernel_size: 2 "
           "dilation: 2 group: 2 pad: 1 bias_term: false %s }",
           fillers);
  check_grad(text, &b, 1, 1, NULL);
  kiln_blob_free(b);

  /* rectangular kernel, per-axis stride and pad, groups with bias */
  kiln_blob *c = gc_blob("c", 4, SHAPE(1, 4, 4, 5), -1, 1, &rng);
  snprintf(text, sizeof text,
           "name: 'c3' type: 'Convolution' convolution_param { num_output: 2 kernel_h: 2 "
           "kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0 group: 2 %s }",
           fillers);
  check_grad(text, &c, 1, 1, NULL);

  /* the repeated form: kernel_size 3 then 2 (h, w), stride 2 then 1, dilation 1 then 2 */
  snprintf(text, sizeof text,
           "name: 'c4' type: 'Convolution' convolution_param { num_output: 3 kernel_size: 3 "
           "kernel_size: 2 stride: 2 stride: 1 dilation: 1 dilation: 2 pad: 1 %s }",
           fillers);
  check_grad(text, &c, 1, 1, NULL);
  kiln_blob_free(c);

  /* 5 kernel rows at stride 1 into 7 outputs: the shifted-row route (LeNet's shapes take it),
   * with padding and a column dilation; plain under KILN_ENGINE=ref */
  kiln_blob *d = gc_blob("d", 4, SHAPE(2, 3, 7, 9), -1, 1, &rng);
  snprintf(text, sizeof text,
           "name: 'c5' type: 'Convolution' convolution_param { num_output: 7 kernel_size: 5 "
           "pad: 2 dilation: 1 dilation: 2 %s }",
           fillers);
  check_grad(text, &d, 1, 1, NULL);
  kiln_blob_free(d);
}

static void test_conv_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 4, 3, 3), NULL);
  /* group 3 divides num_output 6 but not the 4 input channels */
  expect_create_fails("name: 'bad_group' type: 'Convolution' convolution_param { num_output: 6 "
                      "kernel_size: 1 group: 3 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'bad_group' (Convolution)",
                      "group 3");
  /* group that divides the channels but not num_output */
  expect_create_fails("name: 'bad_group2' type: 'Convolution' convolution_param { num_output: 3 "
                      "kernel_size: 1 group: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'bad_group2' (Convolution)",
                      "group 2");
  /* 6x6 kernel on a 3x3 input padded to 5x5 */
  expect_create_fails("name: 'too_big' type: 'Convolution' convolution_param { num_output: 2 "
                      "kernel_size: 6 pad: 1 }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'too_big' (Convolution)",
                      "does not fit");
  /* dilation makes a 3x3 kernel span 5x5 */
  expect_create_fails("name: 'too_wide' type: 'Convolution' convolution_param { num_output: 2 "
                      "kernel_size: 3 dilation: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_SHAPE, "layer 'too_wide' (Convolution)",
                      "does not fit");
  expect_create_fails("name: 'no_out' type: 'Convolution' convolution_param { kernel_size: 3 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'no_out' (Convolution)",
                      "num_output");
  expect_create_fails("name: 'no_kernel' type: 'Convolution' convolution_param { num_output: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'no_kernel' (Convolution)",
                      "kernel");
  expect_create_fails("name: 'half_kernel' type: 'Convolution' convolution_param { num_output: 2 "
                      "kernel_h: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'half_kernel' (Convolution)",
                      "kernel_h");
  expect_create_fails("name: 'both_kernel' type: 'Convolution' convolution_param { num_output: 2 "
                      "kernel_size: 2 kernel_h: 2 kernel_w: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'both_kernel' (Convolution)",
                      "not both");
  kiln_blob_free(x);
  kiln_blob *flat = blob_of("flat", 2, SHAPE(2, 3), NULL);
  expect_create_fails("name: 'flat_in' type: 'Convolution' convolution_param { num_output: 2 "
                      "kernel_size: 1 }",
                      TRAIN, &flat, 1, 1, KILN_ERR_SHAPE, "layer 'flat_in' (Convolution)",
                      "N x C x H x W");
  kiln_blob_free(flat);
}

/* ---- Pooling ----------------------------------------------------------------------------- */

/* The 4x4 plane the pooling tests use:
 *    1 5 2 4
 *    3 2 8 1
 *    7 0 4 6
 *    2 9 3 1          (sum 58) */
static const float pool_x[16] = {1, 5, 2, 4, 3, 2, 8, 1, 7, 0, 4, 6, 2, 9, 3, 1};

/* Runs pooling `param` on pool_x and compares the top with want (oh x ow). */
static void pool_expect(const char *param, int oh, int ow, const float *want) {
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 4, 4), pool_x);
  char text[256];
  snprintf(text, sizeof text, "name: 'p' type: 'Pooling' pooling_param { %s }", param);
  built p = build(text, TRAIN, &x, 1, 1);
  forward(&p);
  expect_shape(p.top[0], 4, SHAPE(1, 1, oh, ow));
  expect_close(param, p.top[0]->data, want, oh * ow, 1e-6);
  unbuild(&p);
  kiln_blob_free(x);
}

static void test_pool_forward_hand(void **state) {
  (void)state;
  /* 2x2 windows, stride 2: max 5 8 / 9 6; mean (1+5+3+2)/4, (2+4+8+1)/4 / (7+0+2+9)/4,
   * (4+6+3+1)/4. */
  pool_expect("pool: MAX kernel_size: 2 stride: 2", 2, 2, (const float[]){5, 8, 9, 6});
  pool_expect("pool: AVE kernel_size: 2 stride: 2", 2, 2, (const float[]){2.75f, 3.75f, 4.5f, 3.5f});

  /* 3x3 windows, stride 2: span 4 - 3 = 1 gives ceil(1/2) + 1 = 2 (CEIL, the default) or
   * floor(1/2) + 1 = 1 (FLOOR). CEIL windows: rows/cols {0,1,2} and {2,3} (clipped).
   *   max: {0-2}x{0-2} = 8, {0-2}x{2,3} = 8, {2,3}x{0-2} = 9, {2,3}x{2,3} = 6
   *   ave (no padding: divide by the clipped window): 32/9, 25/6, 25/6, 14/4 */
  pool_expect("pool: MAX kernel_size: 3 stride: 2", 2, 2, (const float[]){8, 8, 9, 6});
  pool_expect("pool: AVE kernel_size: 3 stride: 2", 2, 2,
              (const float[]){32.f / 9, 25.f / 6, 25.f / 6, 3.5f});
  pool_expect("pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR", 1, 1, (const float[]){8});
  pool_expect("pool: AVE kernel_size: 3 stride: 2 round_mode: FLOOR", 1, 1,
              (const float[]){32.f / 9});

  /* 3x3 windows, stride 2, pad 1: span 4 + 2 - 3 = 3; CEIL: ceil(3/2) + 1 = 3, and the last
   * window starts at 3, inside the image, so it stays. Windows start at -1, 1, 3 and cover image
   * rows R0 = {0,1}, R1 = {1,2,3}, R2 = {3} (columns alike).
   *   max: R0: 5 8 4 / R1: 9 9 6 / R2: 9 9 1
   *   ave divides by the window clipped to [-1, 5): extents 3, 3, 2 (padding counts):
   *     R0: (1+5+3+2)/9 = 11/9, (5+2+4+2+8+1)/9 = 22/9, (4+1)/6 = 5/6
   *     R1: (3+2+7+0+2+9)/9 = 23/9, (2+8+1+0+4+6+9+3+1)/9 = 34/9, (1+6+1)/6 = 8/6
   *     R2: (2+9)/6 = 11/6, (9+3+1)/6 = 13/6, 1/4
   * FLOOR: floor(3/2) + 1 = 2: only the first two rows and columns of those. */
  pool_expect("pool: MAX kernel_size: 3 stride: 2 pad: 1", 3, 3,
              (const float[]){5, 8, 4, 9, 9, 6, 9, 9, 1});
  pool_expect("pool: AVE kernel_size: 3 stride: 2 pad: 1", 3, 3,
              (const float[]){11.f / 9, 22.f / 9, 5.f / 6, 23.f / 9, 34.f / 9, 8.f / 6, 11.f / 6,
                              13.f / 6, 0.25f});
  pool_expect("pool: MAX kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR", 2, 2,
              (const float[]){5, 8, 9, 9});
  pool_expect("pool: AVE kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR", 2, 2,
              (const float[]){11.f / 9, 22.f / 9, 23.f / 9, 34.f / 9});

  /* Rectangular: kernel 1x4 (whole rows), stride 1: row maxima 5 8 7 9, row means 3 3.5 4.25
   * 3.75. */
  pool_expect("pool: MAX kernel_h: 1 kernel_w: 4", 4, 1, (const float[]){5, 8, 7, 9});
  pool_expect("pool: AVE kernel_h: 1 kernel_w: 4", 4, 1,
              (const float[]){3, 3.5f, 4.25f, 3.75f});

  /* Global: the whole plane; max 9, mean 58/16. */
  pool_expect("pool: MAX global_pooling: true", 1, 1, (const float[]){9});
  pool_expect("pool: AVE global_pooling: true", 1, 1, (const float[]){58.f / 16});
}

/* Backward by hand on the 2x2 / stride 2 case, dy = 1 2 / 3 4: MAX routes each dy to its argmax
 * (5 at (0,1), 8 at (1,2), 9 at (3,1), 6 at (2,3)); AVE spreads dy/4 over its window. */
static void test_pool_backward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 4, 4), pool_x);
  built mx = build("name: 'mx' type: 'Pooling' pooling_param { pool: MAX kernel_size: 2 stride: 2 }",
                   TRAIN, &x, 1, 1);
  forward(&mx);
  memcpy(mx.top[0]->diff, (const float[]){1, 2, 3, 4}, sizeof(float) * 4);
  fill(x->diff, 16, -5.0f);
  backward(&mx);
  const float want_max[16] = {0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 4, 0, 3, 0, 0};
  expect_close("max dx", x->diff, want_max, 16, 0);
  unbuild(&mx);

  built av = build("name: 'av' type: 'Pooling' pooling_param { pool: AVE kernel_size: 2 stride: 2 }",
                   TRAIN, &x, 1, 1);
  forward(&av);
  memcpy(av.top[0]->diff, (const float[]){1, 2, 3, 4}, sizeof(float) * 4);
  fill(x->diff, 16, -5.0f);
  backward(&av);
  const float want_ave[16] = {.25f, .25f, .5f, .5f, .25f, .25f, .5f, .5f,
                              .75f, .75f, 1,   1,   .75f, .75f, 1,   1};
  expect_close("ave dx", x->diff, want_ave, 16, 1e-7);
  unbuild(&av);
  kiln_blob_free(x);
}

static void test_pool_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 12, 1);
  static const char *const geoms[] = {
      "kernel_size: 3 stride: 2 pad: 1",                       /* CEIL with padding */
      "kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR",     /* FLOOR with padding */
      "kernel_size: 2 stride: 2",                              /* CEIL: partial last window */
      "kernel_size: 2 stride: 2 round_mode: FLOOR",            /* FLOOR: last row unused */
      "kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 1",
      "kernel_size: 3 stride: 1",                              /* overlapping windows */
      "global_pooling: true",
  };
  char text[256];
  /* Max pooling: distinct inputs and a small step, so no perturbation changes an argmax. */
  kiln_blob *d = distinct_blob("d", 4, SHAPE(2, 2, 5, 5), &rng);
  gradcheck_opts max_opts = {.step = 1e-4, .threshold = 1e-2, .kink_range = -1};
  for (size_t i = 0; i < sizeof geoms / sizeof geoms[0]; i++) {
    snprintf(text, sizeof text, "name: 'pm' type: 'Pooling' pooling_param { pool: MAX %s }",
             geoms[i]);
    check_grad(text, &d, 1, 1, &max_opts);
  }
  kiln_blob_free(d);
  kiln_blob *r = gc_blob("r", 4, SHAPE(2, 2, 5, 5), -1, 1, &rng);
  for (size_t i = 0; i < sizeof geoms / sizeof geoms[0]; i++) {
    snprintf(text, sizeof text, "name: 'pa' type: 'Pooling' pooling_param { pool: AVE %s }",
             geoms[i]);
    check_grad(text, &r, 1, 1, NULL);
  }
  kiln_blob_free(r);
}

static void test_pool_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(1, 1, 4, 4), pool_x);
  expect_create_fails("name: 'both' type: 'Pooling' pooling_param { kernel_size: 2 kernel_h: 2 "
                      "kernel_w: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'both' (Pooling)", "not both");
  expect_create_fails("name: 'nok' type: 'Pooling' pooling_param { pool: AVE }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'nok' (Pooling)", "kernel_size");
  expect_create_fails("name: 'bigpad' type: 'Pooling' pooling_param { kernel_size: 2 pad: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'bigpad' (Pooling)", "pad");
  expect_create_fails("name: 'huge' type: 'Pooling' pooling_param { kernel_size: 5 }", TRAIN, &x,
                      1, 1, KILN_ERR_SHAPE, "layer 'huge' (Pooling)", "does not fit");
  expect_create_fails("name: 'glob' type: 'Pooling' pooling_param { global_pooling: true "
                      "kernel_size: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'glob' (Pooling)",
                      "global_pooling");
  expect_create_fails("name: 'sto' type: 'Pooling' pooling_param { pool: STOCHASTIC "
                      "kernel_size: 2 }",
                      TRAIN, &x, 1, 1, KILN_ERR_UNSUPPORTED, "layer 'sto' (Pooling)",
                      "STOCHASTIC");
  kiln_blob_free(x);
}

/* ---- InnerProduct ------------------------------------------------------------------------ */

/* x = 1 2 3 / 4 5 6, W = 1 0 -1 / 2 1 0, b = 0.5 -1:
 *   y = x W^T + b = (1-3+0.5, 2+2-1) / (4-6+0.5, 8+5-1) = -1.5 3 / -1.5 12
 * Backward with dy = 1 2 / 3 4:
 *   dx = dy W = (1*(1,0,-1) + 2*(2,1,0)) / (3*(1,0,-1) + 4*(2,1,0)) = 5 2 -1 / 11 4 -3
 *   dW = dy^T x = (1*(1,2,3) + 3*(4,5,6)) / (2*(1,2,3) + 4*(4,5,6)) = 13 17 21 / 18 24 30
 *   db = column sums of dy = 4 6 */
static const float ip_x[6] = {1, 2, 3, 4, 5, 6};
static const float ip_w[6] = {1, 0, -1, 2, 1, 0};
static const float ip_wt[6] = {1, 2, 0, 1, -1, 0}; /* the same W stored (K, N) for transpose */
static const float ip_b[2] = {0.5f, -1};
static const float ip_dy[4] = {1, 2, 3, 4};

static void test_ip_forward_backward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), ip_x);
  built p = build("name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 2 }", TRAIN,
                  &x, 1, 1);
  expect_shape(p.l->param[0], 2, SHAPE(2, 3));
  expect_shape(p.l->param[1], 1, SHAPE(2));
  set_params(&p, 0, ip_w);
  set_params(&p, 1, ip_b);
  forward(&p);
  expect_shape(p.top[0], 2, SHAPE(2, 2));
  expect_close("ip y", p.top[0]->data, (const float[]){-1.5f, 3, -1.5f, 12}, 4, 1e-6);
  memcpy(p.top[0]->diff, ip_dy, sizeof ip_dy);
  fill(p.l->param[0]->diff, 6, 0);
  fill(p.l->param[1]->diff, 2, 0);
  fill(x->diff, 6, 99);
  backward(&p);
  const float dx[6] = {5, 2, -1, 11, 4, -3};
  expect_close("ip dx", x->diff, dx, 6, 1e-6);
  expect_close("ip dW", p.l->param[0]->diff, (const float[]){13, 17, 21, 18, 24, 30}, 6, 1e-6);
  expect_close("ip db", p.l->param[1]->diff, (const float[]){4, 6}, 2, 1e-6);
  backward(&p); /* accumulates into dW, db; overwrites dx */
  expect_close("ip dx again", x->diff, dx, 6, 1e-6);
  expect_close("ip dW x2", p.l->param[0]->diff, (const float[]){26, 34, 42, 36, 48, 60}, 6, 1e-6);
  expect_close("ip db x2", p.l->param[1]->diff, (const float[]){8, 12}, 2, 1e-6);
  unbuild(&p);

  /* No bias: y = x W^T = -2 4 / -2 13. */
  built nb = build("name: 'ipnb' type: 'InnerProduct' inner_product_param { num_output: 2 "
                   "bias_term: false }",
                   TRAIN, &x, 1, 1);
  assert_int_equal(nb.l->nparam, 1);
  set_params(&nb, 0, ip_w);
  forward(&nb);
  expect_close("ip no bias", nb.top[0]->data, (const float[]){-2, 4, -2, 13}, 4, 1e-6);
  unbuild(&nb);

  /* transpose: W stored as (K, N) = W^T; same outputs; dW comes back as (dy^T x)^T. */
  built tr = build("name: 'ipt' type: 'InnerProduct' inner_product_param { num_output: 2 "
                   "transpose: true }",
                   TRAIN, &x, 1, 1);
  expect_shape(tr.l->param[0], 2, SHAPE(3, 2));
  set_params(&tr, 0, ip_wt);
  set_params(&tr, 1, ip_b);
  forward(&tr);
  expect_close("ip transpose y", tr.top[0]->data, (const float[]){-1.5f, 3, -1.5f, 12}, 4, 1e-6);
  memcpy(tr.top[0]->diff, ip_dy, sizeof ip_dy);
  fill(tr.l->param[0]->diff, 6, 0);
  fill(tr.l->param[1]->diff, 2, 0);
  backward(&tr);
  expect_close("ip transpose dx", x->diff, dx, 6, 1e-6);
  expect_close("ip transpose dW", tr.l->param[0]->diff, (const float[]){13, 18, 17, 24, 21, 30},
               6, 1e-6);
  unbuild(&tr);
  kiln_blob_free(x);

  /* axis 2 on a 1x2x3 input: the two rows of x are two samples along axis 1; top is 1x2x2. */
  kiln_blob *x3 = blob_of("x3", 3, SHAPE(1, 2, 3), ip_x);
  built ax = build("name: 'ipa' type: 'InnerProduct' inner_product_param { num_output: 2 axis: 2 }",
                   TRAIN, &x3, 1, 1);
  expect_shape(ax.l->param[0], 2, SHAPE(2, 3));
  set_params(&ax, 0, ip_w);
  set_params(&ax, 1, ip_b);
  forward(&ax);
  expect_shape(ax.top[0], 3, SHAPE(1, 2, 2));
  expect_close("ip axis 2", ax.top[0]->data, (const float[]){-1.5f, 3, -1.5f, 12}, 4, 1e-6);
  unbuild(&ax);
  kiln_blob_free(x3);

  /* axis 1 (default) flattens C x H x W: a 2x1x1x3 input gives a 2x2 top. */
  kiln_blob *x4 = blob_of("x4", 4, SHAPE(2, 1, 1, 3), ip_x);
  built a4 = build("name: 'ip4' type: 'InnerProduct' inner_product_param { num_output: 2 }", TRAIN,
                   &x4, 1, 1);
  set_params(&a4, 0, ip_w);
  set_params(&a4, 1, ip_b);
  forward(&a4);
  expect_shape(a4.top[0], 2, SHAPE(2, 2));
  expect_close("ip 4-d", a4.top[0]->data, (const float[]){-1.5f, 3, -1.5f, 12}, 4, 1e-6);
  unbuild(&a4);
  kiln_blob_free(x4);
}

static void test_ip_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 13, 1);
  const char *fill_text = "weight_filler { type: 'gaussian' std: 0.5 } "
                          "bias_filler { type: 'uniform' min: -1 max: 1 }";
  char text[512];
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  const char *variants[] = {"", "bias_term: false", "transpose: true",
                            "transpose: true bias_term: false"};
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
    snprintf(text, sizeof text,
             "name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 4 %s %s }",
             variants[i], fill_text);
    check_grad(text, &x, 1, 1, NULL);
  }
  kiln_blob_free(x);
  kiln_blob *y = gc_blob("y", 3, SHAPE(2, 3, 4), -1, 1, &rng);
  snprintf(text, sizeof text,
           "name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 axis: 2 %s }",
           fill_text);
  check_grad(text, &y, 1, 1, NULL);
  snprintf(text, sizeof text,
           "name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 axis: -1 "
           "transpose: true %s }",
           fill_text);
  check_grad(text, &y, 1, 1, NULL);
  kiln_blob_free(y);
}

static void test_ip_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), ip_x);
  expect_create_fails("name: 'ipn' type: 'InnerProduct' inner_product_param { bias_term: false }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'ipn' (InnerProduct)",
                      "num_output");
  /* Built for 3 features; the input then grows to 4 features per sample. */
  built p = build("name: 'ipr' type: 'InnerProduct' inner_product_param { num_output: 2 }", TRAIN,
                  &x, 1, 1);
  assert_int_equal(kiln_blob_reshape(x, 2, SHAPE(2, 4)), KILN_OK);
  kiln_clear_error();
  assert_int_equal(p.l->ops->reshape(p.l), KILN_ERR_SHAPE);
  expect_message("layer 'ipr' (InnerProduct)", "4 features", "expect 3");
  /* A different batch size with the same features is fine. */
  assert_int_equal(kiln_blob_reshape(x, 2, SHAPE(5, 3)), KILN_OK);
  assert_int_equal(p.l->ops->reshape(p.l), KILN_OK);
  expect_shape(p.top[0], 2, SHAPE(5, 2));
  unbuild(&p);
  kiln_blob_free(x);
}

/* ---- ReLU, Sigmoid, TanH ----------------------------------------------------------------- */

static const float act_x[5] = {-2, -0.5f, 0, 0.5f, 3};
static const float act_dy[5] = {1, 2, 3, 4, 5};

/* ReLU(x) = x > 0 ? x : slope * x; dx = dy where x > 0, slope * dy elsewhere (x = 0 included,
 * as Caffe). */
static void relu_case(const char *text, bool in_place, const float *want_y, const float *want_dx) {
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 5), act_x);
  kiln_blob *y = in_place ? x : kiln_blob_new("y");
  built r = build_on(text, TRAIN, &x, 1, &y, 1);
  forward(&r);
  expect_close(in_place ? "relu y (in place)" : "relu y", y->data, want_y, 5, 1e-7);
  if (!in_place) expect_close("relu keeps x", x->data, act_x, 5, 0);
  memcpy(y->diff, act_dy, sizeof act_dy);
  if (!in_place) fill(x->diff, 5, 42);
  backward(&r);
  expect_close(in_place ? "relu dx (in place)" : "relu dx", x->diff, want_dx, 5, 1e-7);
  unbuild(&r);
  if (!in_place) kiln_blob_free(y);
  kiln_blob_free(x);
}

static void test_relu_forward_backward_hand(void **state) {
  (void)state;
  const float y0[5] = {0, 0, 0, 0.5f, 3}, dx0[5] = {0, 0, 0, 4, 5};
  const float y1[5] = {-0.2f, -0.05f, 0, 0.5f, 3}, dx1[5] = {0.1f, 0.2f, 0.3f, 4, 5};
  const char *plain = "name: 'r' type: 'ReLU'";
  const char *leaky = "name: 'r' type: 'ReLU' relu_param { negative_slope: 0.1 }";
  relu_case(plain, false, y0, dx0);
  relu_case(plain, true, y0, dx0);
  relu_case(leaky, false, y1, dx1);
  relu_case(leaky, true, y1, dx1);
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
  assert_int_equal(kiln_layer_create(lp, TRAIN, &x, 1, &x, 1, 1, kiln_test_config(), &l), KILN_ERR_UNSUPPORTED);
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

/* ---- Softmax ----------------------------------------------------------------------------- */

/* softmax(1, 2, 3) = (e, e^2, e^3) / (e + e^2 + e^3) = 0.09003057 0.24472847 0.66524096 */
static const float sm123[3] = {0.09003057f, 0.24472847f, 0.66524096f};

static void test_softmax_forward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 3), (const float[]){1, 2, 3});
  built s = build("name: 'sm' type: 'Softmax'", TRAIN, &x, 1, 1);
  forward(&s);
  expect_close("softmax(1,2,3)", s.top[0]->data, sm123, 3, 1e-6);
  unbuild(&s);
  kiln_blob_free(x);

  /* Axis 1 of a 2x3x2x2 input: every (n, h, w) column holds (1, 2, 3) + shift, with shifts up to
   * 1000 (softmax does not change under a shift, and must not overflow). */
  kiln_blob *y = blob_of("y", 4, SHAPE(2, 3, 2, 2), NULL);
  const float shift[8] = {0, -5, 10, 1000, -1000, 0.5f, 7, -3};
  float want[24];
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int j = 0; j < 4; j++) {
        y->data[(n * 3 + c) * 4 + j] = (float)(c + 1) + shift[n * 4 + j];
        want[(n * 3 + c) * 4 + j] = sm123[c];
      }
  built s4 = build("name: 'sm4' type: 'Softmax' softmax_param { axis: 1 }", TRAIN, &y, 1, 1);
  forward(&s4);
  expect_shape(s4.top[0], 4, SHAPE(2, 3, 2, 2));
  expect_close("softmax axis 1", s4.top[0]->data, want, 24, 1e-5);
  unbuild(&s4);
  kiln_blob_free(y);
}

static void test_softmax_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 18, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 2, 3), -2, 2, &rng);
  check_grad("name: 'sm' type: 'Softmax' softmax_param { axis: 1 }", &x, 1, 1, NULL);
  check_grad("name: 'sm' type: 'Softmax' softmax_param { axis: -1 }", &x, 1, 1, NULL);
  kiln_blob_free(x);
}

/* ---- SoftmaxWithLoss --------------------------------------------------------------------- */

/* A 2x3x1x2 input whose every column is (1, 2, 3), so every column's probabilities are sm123
 * and -log p = 2.40760596, 1.40760596, 0.40760596 for labels 0, 1, 2. Labels (n, w):
 * (0,0) = 2, (0,1) = 0, (1,0) = 1, (1,1) = 5 (ignored where ignore_label is 5).
 * Sum over the three counted: 0.40760596 + 2.40760596 + 1.40760596 = 4.22281789. */
static kiln_blob *loss_input(void) {
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 3, 1, 2), NULL);
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int j = 0; j < 2; j++) x->data[(n * 3 + c) * 2 + j] = (float)(c + 1);
  return x;
}

static float loss_of(const char *loss_param, kiln_blob **bottoms) {
  char text[256];
  snprintf(text, sizeof text, "name: 'loss' type: 'SoftmaxWithLoss' %s", loss_param);
  built b = build(text, TRAIN, bottoms, 2, 1);
  expect_shape(b.top[0], 0, NULL);
  assert_int_equal(b.top[0]->count, 1);
  forward(&b);
  float v = b.top[0]->data[0];
  unbuild(&b);
  return v;
}

static void test_softmax_loss_forward_hand(void **state) {
  (void)state;
  /* One sample: loss = -log softmax(1,2,3)[2] = 0.40760596; for label 0, 2.40760596. */
  kiln_blob *x1 = blob_of("x1", 2, SHAPE(1, 3), (const float[]){1, 2, 3});
  kiln_blob *l1 = blob_of("l1", 1, SHAPE(1), (const float[]){2});
  kiln_blob *b1[2] = {x1, l1};
  assert_float_equal(loss_of("", b1), 0.40760596f, 1e-6);
  l1->data[0] = 0;
  assert_float_equal(loss_of("", b1), 2.40760596f, 1e-6);
  kiln_blob_free(x1);
  kiln_blob_free(l1);

  kiln_blob *x = loss_input();
  kiln_blob *lab = blob_of("label", 3, SHAPE(2, 1, 2), (const float[]){2, 0, 1, 5});
  kiln_blob *b[2] = {x, lab};
  /* 3 counted of 4 positions, batch 2:
   *   VALID 4.22281789 / 3 = 1.40760596;  FULL / 4 = 1.05570447;  BATCH_SIZE / 2 = 2.11140895;
   *   NONE 4.22281789; legacy normalize: false is BATCH_SIZE, normalize: true is VALID. */
  const double tol = 2e-6;
  assert_float_equal(loss_of("loss_param { ignore_label: 5 }", b), 1.40760596f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: VALID }", b),
                     1.40760596f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: FULL }", b),
                     1.05570447f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: BATCH_SIZE }", b),
                     2.11140895f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: NONE }", b),
                     4.22281789f, 4e-6);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalize: false }", b), 2.11140895f,
                     tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalize: true }", b), 1.40760596f,
                     tol);
  /* An explicit normalization wins over the legacy flag. */
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalize: false normalization: FULL }",
                             b),
                     1.05570447f, tol);
  /* ignore_label 0 instead: counted labels 2, 1 (5 is now out of range, so make it 2):
   * (0.40760596 + 1.40760596 + 0.40760596) / 3 = 0.74093929. */
  lab->data[3] = 2;
  assert_float_equal(loss_of("loss_param { ignore_label: 0 }", b), 0.74093929f, tol);
  /* Every label ignored: the VALID normalizer is clamped to 1 and the loss is 0. */
  fill(lab->data, 4, 1);
  assert_float_equal(loss_of("loss_param { ignore_label: 1 }", b), 0.0f, 0);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* loss_weight 2 (the net seeds the loss top's diff with it), VALID over the 3 counted positions:
 * dx = 2/3 * (p - onehot(label)) in counted columns, 0 in the ignored one; the optional second
 * top is the probabilities. */
static void test_softmax_loss_backward_hand(void **state) {
  (void)state;
  kiln_blob *x = loss_input();
  kiln_blob *lab = blob_of("label", 3, SHAPE(2, 1, 2), (const float[]){2, 0, 1, 5});
  kiln_blob *b[2] = {x, lab};
  built s = build("name: 'loss' type: 'SoftmaxWithLoss' loss_weight: 2 "
                  "loss_param { ignore_label: 5 }",
                  TRAIN, b, 2, 2);
  assert_true(s.l->ops->is_loss);
  assert_float_equal(s.l->loss_weight[0], 2.0f, 0);
  expect_shape(s.top[1], 4, SHAPE(2, 3, 1, 2));
  forward(&s);
  assert_float_equal(s.top[0]->data[0], 1.40760596f, 2e-6);
  float prob[12];
  for (int i = 0; i < 12; i++) prob[i] = sm123[(i / 2) % 3];
  expect_close("prob top", s.top[1]->data, prob, 12, 1e-6);

  s.top[0]->diff[0] = s.l->loss_weight[0];
  s.l->propagate_down[1] = false;
  fill(x->diff, 12, 7);
  backward(&s);
  const int labels[4] = {2, 0, 1, -1}; /* by (n, w); -1: ignored */
  float want[12];
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int j = 0; j < 2; j++) {
        int lb = labels[n * 2 + j];
        want[(n * 3 + c) * 2 + j] = lb < 0 ? 0.0f : 2.0f / 3.0f * (sm123[c] - (c == lb ? 1 : 0));
      }
  expect_close("loss dx", x->diff, want, 12, 1e-6);

  /* The label input takes no gradient: asking for one is an error naming the layer. */
  s.l->propagate_down[1] = true;
  kiln_clear_error();
  assert_int_equal(s.l->ops->backward(s.l), KILN_ERR_INVALID);
  expect_message("layer 'loss' (SoftmaxWithLoss)", "label", NULL);
  unbuild(&s);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_softmax_loss_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 19, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 2, 3), -2, 2, &rng);
  kiln_blob *lab = label_blob("label", 3, SHAPE(2, 2, 3), 4, &rng);
  lab->data[1] = 3; /* ignore_label 3 below: make sure some labels are 3 and some are not */
  lab->data[7] = 3;
  lab->data[4] = 0;
  kiln_blob *b[2] = {x, lab};
  gradcheck_opts o = {.bottom_mask = 1, .kink_range = -1};
  const char *params[] = {
      "",
      "loss_param { normalization: VALID ignore_label: 3 }",
      "loss_param { normalization: FULL ignore_label: 3 }",
      "loss_param { normalization: BATCH_SIZE ignore_label: 3 }",
      "loss_param { normalization: NONE }",
      "loss_param { normalize: false }",
      "loss_weight: 2 loss_param { normalization: FULL }",
  };
  char text[256];
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    snprintf(text, sizeof text, "name: 'loss' type: 'SoftmaxWithLoss' %s", params[i]);
    check_grad(text, b, 2, 1, &o);
  }
  /* The class axis last: a 2x3x4 input with softmax over axis 2, labels 2x3. */
  kiln_blob *y = gc_blob("y", 3, SHAPE(2, 3, 4), -2, 2, &rng);
  kiln_blob *ly = label_blob("ly", 2, SHAPE(2, 3), 4, &rng);
  kiln_blob *by[2] = {y, ly};
  check_grad("name: 'loss' type: 'SoftmaxWithLoss' softmax_param { axis: 2 }", by, 2, 1, &o);
  kiln_blob_free(y);
  kiln_blob_free(ly);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_softmax_loss_bad_labels(void **state) {
  (void)state;
  kiln_blob *x = loss_input();
  kiln_blob *lab = blob_of("label", 3, SHAPE(2, 1, 2), (const float[]){2, 0, 1, 5});
  kiln_blob *b[2] = {x, lab};
  const float bad[] = {5, 3, -1, 1.5f};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    built s = build("name: 'sloss' type: 'SoftmaxWithLoss'", TRAIN, b, 2, 1);
    lab->data[3] = bad[i];
    kiln_clear_error();
    assert_int_equal(s.l->ops->forward(s.l), KILN_ERR_DATA);
    expect_message("layer 'sloss' (SoftmaxWithLoss)", "out of range", "position 3");
    unbuild(&s);
  }
  /* A label count that does not match the predictions is caught on reshape. */
  kiln_blob *short_lab = blob_of("short", 1, SHAPE(3), (const float[]){0, 1, 2});
  kiln_blob *bs[2] = {x, short_lab};
  expect_create_fails("name: 'sloss2' type: 'SoftmaxWithLoss'", TRAIN, bs, 2, 1, KILN_ERR_SHAPE,
                      "layer 'sloss2' (SoftmaxWithLoss)", "label count 3");
  kiln_blob_free(short_lab);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* ---- Accuracy ---------------------------------------------------------------------------- */

/* Five samples over four classes:
 *   s0  0.1 0.7 0.2 0.0  label 1: nothing higher           top1 yes  top2 yes
 *   s1  0.5 0.3 0.2 0.0  label 1: one higher (0.5)          top1 no   top2 yes
 *   s2  0.5 0.3 0.2 0.0  label 2: two higher (0.5, 0.3)     top1 no   top2 no
 *   s3  0.6 0.3 0.1 0.0  label 0: nothing higher           top1 yes  top2 yes
 *   s4  0.1 0.2 0.7 0.0  label 2: nothing higher           top1 yes  top2 yes
 * top1 = 3/5, top2 = 4/5. Per class (top1): class 0 {s3} 1/1, class 1 {s0, s1} 1/2,
 * class 2 {s2, s4} 1/2, class 3 no samples: 0. With ignore_label 0 (s3 dropped): top1 2/4,
 * top2 3/4, per class 0 0.5 0.5 0. */
static const float acc_x[20] = {0.1f, 0.7f, 0.2f, 0, 0.5f, 0.3f, 0.2f, 0, 0.5f, 0.3f,
                                0.2f, 0,    0.6f, 0.3f, 0.1f, 0, 0.1f, 0.2f, 0.7f, 0};
static const float acc_label[5] = {1, 1, 2, 0, 2};

static void accuracy_expect(const char *param, float want, const float *want_per_class) {
  kiln_blob *x = blob_of("x", 2, SHAPE(5, 4), acc_x);
  kiln_blob *lab = blob_of("label", 1, SHAPE(5), acc_label);
  kiln_blob *b[2] = {x, lab};
  char text[256];
  snprintf(text, sizeof text, "name: 'acc' type: 'Accuracy' %s", param);
  built a = build(text, TEST, b, 2, want_per_class ? 2 : 1);
  assert_null(a.l->ops->backward);
  forward(&a);
  expect_shape(a.top[0], 0, NULL);
  expect_close(text, a.top[0]->data, &want, 1, 1e-6);
  if (want_per_class) {
    expect_shape(a.top[1], 1, SHAPE(4));
    expect_close(text, a.top[1]->data, want_per_class, 4, 1e-6);
  }
  unbuild(&a);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_accuracy_hand(void **state) {
  (void)state;
  accuracy_expect("", 0.6f, NULL);
  accuracy_expect("accuracy_param { top_k: 1 }", 0.6f, (const float[]){1, 0.5f, 0.5f, 0});
  accuracy_expect("accuracy_param { top_k: 2 }", 0.8f, (const float[]){1, 1, 0.5f, 0});
  accuracy_expect("accuracy_param { top_k: 4 }", 1.0f, (const float[]){1, 1, 1, 0});
  accuracy_expect("accuracy_param { ignore_label: 0 }", 0.5f, (const float[]){0, 0.5f, 0.5f, 0});
  accuracy_expect("accuracy_param { ignore_label: 0 top_k: 2 }", 0.75f,
                  (const float[]){0, 1, 0.5f, 0});
}

/* Caffe counts a class that scores the same as the true one as better than it (>=), so a net
 * whose scores are all equal (dead, or not trained yet) is right only when top_k reaches every
 * class: 0 for top 1 of 4, 1 for top 4 of 4. */
static void test_accuracy_ties_count_against(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(3, 4), NULL);
  kiln_blob *lab = blob_of("label", 1, SHAPE(3), (const float[]){0, 2, 3});
  kiln_blob *b[2] = {x, lab};
  const struct {
    int k;
    float want;
  } cases[] = {{1, 0.0f}, {3, 0.0f}, {4, 1.0f}};
  for (int i = 0; i < 3; i++) {
    char text[128];
    snprintf(text, sizeof text, "name: 'acc' type: 'Accuracy' accuracy_param { top_k: %d }",
             cases[i].k);
    built a = build(text, TEST, b, 2, 1);
    forward(&a);
    if (a.top[0]->data[0] != cases[i].want) {
      print_error("all-equal scores, top_k %d: accuracy %g, want %g\n", cases[i].k,
                  a.top[0]->data[0], cases[i].want);
      fail();
    }
    unbuild(&a);
  }
  /* One tie with the true class, top 2: s = 0.5 0.5 0.1 0.0, label 1 (class 0 ties it): one
   * class at or above it, so right for top 2, wrong for top 1. */
  kiln_blob *t = blob_of("t", 2, SHAPE(1, 4), (const float[]){0.5f, 0.5f, 0.1f, 0});
  kiln_blob *tl = blob_of("tl", 1, SHAPE(1), (const float[]){1});
  kiln_blob *bt[2] = {t, tl};
  built a1 = build("name: 'acc' type: 'Accuracy'", TEST, bt, 2, 1);
  forward(&a1);
  assert_float_equal(a1.top[0]->data[0], 0.0f, 0);
  unbuild(&a1);
  built a2 = build("name: 'acc' type: 'Accuracy' accuracy_param { top_k: 2 }", TEST, bt, 2, 1);
  forward(&a2);
  assert_float_equal(a2.top[0]->data[0], 1.0f, 0);
  unbuild(&a2);
  kiln_blob_free(t);
  kiln_blob_free(tl);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* Per-class accuracy for more classes than a small fixed table would hold (ImageNet has 1000):
 * 3 samples over 1000 classes, labels 999 (right), 300 (right), 300 (wrong). */
static void test_accuracy_per_class_many_classes(void **state) {
  (void)state;
  const int C = 1000;
  kiln_blob *x = blob_of("x", 2, SHAPE(3, C), NULL);
  x->data[0 * C + 999] = 1;
  x->data[1 * C + 300] = 1;
  x->data[2 * C + 5] = 1;
  kiln_blob *lab = blob_of("label", 1, SHAPE(3), (const float[]){999, 300, 300});
  kiln_blob *b[2] = {x, lab};
  built a = build("name: 'acc' type: 'Accuracy'", TEST, b, 2, 2);
  forward(&a);
  assert_float_equal(a.top[0]->data[0], 2.0f / 3.0f, 1e-6);
  expect_shape(a.top[1], 1, SHAPE(C));
  for (int c = 0; c < C; c++) {
    float want = c == 999 ? 1.0f : c == 300 ? 0.5f : 0.0f;
    if (fabsf(a.top[1]->data[c] - want) > 1e-6f) {
      print_error("per-class accuracy[%d] = %g, want %g\n", c, a.top[1]->data[c], want);
      fail();
    }
  }
  unbuild(&a);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_accuracy_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(5, 4), acc_x);
  kiln_blob *lab = blob_of("label", 1, SHAPE(5), acc_label);
  kiln_blob *b[2] = {x, lab};
  expect_create_fails("name: 'acc5' type: 'Accuracy' accuracy_param { top_k: 5 }", TEST, b, 2, 1,
                      KILN_ERR_INVALID, "layer 'acc5' (Accuracy)", "top_k 5");
  built a = build("name: 'accr' type: 'Accuracy'", TEST, b, 2, 1);
  lab->data[2] = 4;
  kiln_clear_error();
  assert_int_equal(a.l->ops->forward(a.l), KILN_ERR_DATA);
  expect_message("layer 'accr' (Accuracy)", "out of range", NULL);
  unbuild(&a);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* ---- Flatten and Split ------------------------------------------------------------------- */

static void flatten_expect(const char *param, int naxes, const int64_t *shape) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 20, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 4, 5), -1, 1, &rng);
  char text[128];
  snprintf(text, sizeof text, "name: 'f' type: 'Flatten' %s", param);
  built f = build(text, TRAIN, &x, 1, 1);
  expect_shape(f.top[0], naxes, shape);
  forward(&f);
  expect_close(text, f.top[0]->data, x->data, 120, 0);
  for (int i = 0; i < 120; i++) f.top[0]->diff[i] = (float)i;
  fill(x->diff, 120, -1);
  backward(&f);
  expect_close(text, x->diff, f.top[0]->diff, 120, 0);
  unbuild(&f);
  kiln_blob_free(x);
}

static void test_flatten_shapes(void **state) {
  (void)state;
  flatten_expect("", 2, SHAPE(2, 60));
  flatten_expect("flatten_param { axis: 2 }", 3, SHAPE(2, 3, 20));
  flatten_expect("flatten_param { axis: 0 end_axis: 1 }", 3, SHAPE(6, 4, 5));
  flatten_expect("flatten_param { axis: 1 end_axis: -2 }", 3, SHAPE(2, 12, 5));
  flatten_expect("flatten_param { axis: 0 }", 1, SHAPE(120));
  flatten_expect("flatten_param { axis: 3 }", 4, SHAPE(2, 3, 4, 5));
}

/* Split: every top is a copy; the bottom's gradient is the sum of the tops' (1 + 2 + 3 = 6). */
static void test_split_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), ip_x);
  built s = build("name: 'sp' type: 'Split'", TRAIN, &x, 1, 3);
  forward(&s);
  for (int t = 0; t < 3; t++) {
    expect_shape(s.top[t], 2, SHAPE(2, 3));
    expect_close("split copy", s.top[t]->data, ip_x, 6, 0);
    for (int i = 0; i < 6; i++) s.top[t]->diff[i] = (float)(t + 1) * (float)(i + 1);
  }
  fill(x->diff, 6, 100);
  backward(&s);
  expect_close("split dx", x->diff, (const float[]){6, 12, 18, 24, 30, 36}, 6, 0);
  unbuild(&s);
  kiln_blob_free(x);
}

static void test_flatten_split_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 21, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  check_grad("name: 'f' type: 'Flatten'", &x, 1, 1, NULL);
  check_grad("name: 'f' type: 'Flatten' flatten_param { axis: 2 }", &x, 1, 1, NULL);
  check_grad("name: 'sp' type: 'Split'", &x, 1, 3, NULL);
  check_grad("name: 'sp' type: 'Split'", &x, 1, 1, NULL);
  kiln_blob_free(x);
}

/* ---- the gradient contract, for every layer with a backward pass ------------------------- */

/* Backward twice after one forward, with different garbage in the bottom diff before each: the
 * bottom diff must come out the same (overwritten, every element written) and every parameter
 * diff doubled (accumulated). */
static void test_backward_overwrites_bottom_accumulates_params(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int phase, ntop;
    bool labels;
  } cases[] = {
      {"name: 'c' type: 'Convolution' convolution_param { num_output: 4 kernel_size: 3 pad: 1 "
       "stride: 2 group: 2 weight_filler { type: 'gaussian' std: 0.5 } "
       "bias_filler { type: 'gaussian' std: 0.5 } }",
       TRAIN, 1, false},
      {"name: 'p' type: 'Pooling' pooling_param { pool: MAX kernel_size: 2 stride: 3 }", TRAIN, 1,
       false},
      {"name: 'p' type: 'Pooling' pooling_param { pool: AVE kernel_size: 2 stride: 3 }", TRAIN, 1,
       false},
      {"name: 'p' type: 'Pooling' pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }",
       TRAIN, 1, false},
      {"name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 "
       "weight_filler { type: 'xavier' } bias_filler { type: 'gaussian' } }",
       TRAIN, 1, false},
      {"name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 transpose: true "
       "weight_filler { type: 'xavier' } bias_filler { type: 'gaussian' } }",
       TRAIN, 1, false},
      {"name: 'r' type: 'ReLU'", TRAIN, 1, false},
      {"name: 'r' type: 'ReLU' relu_param { negative_slope: 0.1 }", TRAIN, 1, false},
      {"name: 's' type: 'Sigmoid'", TRAIN, 1, false},
      {"name: 't' type: 'TanH'", TRAIN, 1, false},
      {"name: 'd' type: 'Dropout'", TRAIN, 1, false},
      {"name: 'd' type: 'Dropout'", TEST, 1, false},
      {"name: 'sm' type: 'Softmax'", TRAIN, 1, false},
      {"name: 'l' type: 'SoftmaxWithLoss' loss_param { ignore_label: 1 }", TRAIN, 1, true},
      {"name: 'l' type: 'SoftmaxWithLoss'", TRAIN, 2, true},
      {"name: 'f' type: 'Flatten'", TRAIN, 1, false},
      {"name: 'sp' type: 'Split'", TRAIN, 3, false},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 22, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 5, 5), -1, 1, &rng);
    kiln_blob *lab = label_blob("label", 3, SHAPE(2, 5, 5), 4, &rng);
    kiln_blob *b[2] = {x, lab};
    built l = build(cases[k].text, cases[k].phase, b, cases[k].labels ? 2 : 1, cases[k].ntop);
    assert_non_null(l.l->ops->backward);
    if (cases[k].labels) l.l->propagate_down[1] = false;
    forward(&l);
    for (int t = 0; t < l.ntop; t++)
      for (int64_t i = 0; i < l.top[t]->count; i++)
        l.top[t]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
    for (int p = 0; p < l.l->nparam; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
    fill(x->diff, x->count, 123.0f);
    backward(&l);
    float *dx1 = malloc(sizeof(float) * (size_t)x->count);
    float *dp1[KILN_MAX_LAYER_PARAMS];
    assert_non_null(dx1);
    memcpy(dx1, x->diff, sizeof(float) * (size_t)x->count);
    for (int p = 0; p < l.l->nparam; p++) {
      dp1[p] = malloc(sizeof(float) * (size_t)l.l->param[p]->count);
      assert_non_null(dp1[p]);
      for (int64_t i = 0; i < l.l->param[p]->count; i++) dp1[p][i] = 2 * l.l->param[p]->diff[i];
    }
    fill(x->diff, x->count, -77.0f);
    backward(&l);
    char what[600];
    snprintf(what, sizeof what, "%s: bottom diff after a second backward", cases[k].text);
    expect_close(what, x->diff, dx1, x->count, 0);
    snprintf(what, sizeof what, "%s: param diff after a second backward", cases[k].text);
    for (int p = 0; p < l.l->nparam; p++) {
      expect_close(what, l.l->param[p]->diff, dp1[p], l.l->param[p]->count, 1e-6);
      free(dp1[p]);
    }
    free(dx1);
    unbuild(&l);
    kiln_blob_free(lab);
    kiln_blob_free(x);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry_backward_layers_covered),
      cmocka_unit_test(test_conv_forward_backward_hand),
      cmocka_unit_test(test_conv_forward_dilation_group_rect_hand),
      cmocka_unit_test(test_conv_gradients),
      cmocka_unit_test(test_conv_bad_parameters),
      cmocka_unit_test(test_pool_forward_hand),
      cmocka_unit_test(test_pool_backward_hand),
      cmocka_unit_test(test_pool_gradients),
      cmocka_unit_test(test_pool_bad_parameters),
      cmocka_unit_test(test_ip_forward_backward_hand),
      cmocka_unit_test(test_ip_gradients),
      cmocka_unit_test(test_ip_bad_parameters),
      cmocka_unit_test(test_relu_forward_backward_hand),
      cmocka_unit_test(test_relu_gradients),
      cmocka_unit_test(test_relu_bad_parameters),
      cmocka_unit_test(test_sigmoid_tanh_hand),
      cmocka_unit_test(test_sigmoid_tanh_gradients),
      cmocka_unit_test(test_dropout_test_phase_identity),
      cmocka_unit_test(test_dropout_train_statistics),
      cmocka_unit_test(test_dropout_gradients),
      cmocka_unit_test(test_dropout_bad_parameters),
      cmocka_unit_test(test_softmax_forward_hand),
      cmocka_unit_test(test_softmax_gradients),
      cmocka_unit_test(test_softmax_loss_forward_hand),
      cmocka_unit_test(test_softmax_loss_backward_hand),
      cmocka_unit_test(test_softmax_loss_gradients),
      cmocka_unit_test(test_softmax_loss_bad_labels),
      cmocka_unit_test(test_accuracy_hand),
      cmocka_unit_test(test_accuracy_ties_count_against),
      cmocka_unit_test(test_accuracy_per_class_many_classes),
      cmocka_unit_test(test_accuracy_bad_parameters),
      cmocka_unit_test(test_flatten_shapes),
      cmocka_unit_test(test_split_hand),
      cmocka_unit_test(test_flatten_split_gradients),
      cmocka_unit_test(test_backward_overwrites_bottom_accumulates_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
