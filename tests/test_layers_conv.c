/* Layers that slide learned filters or windows over the spatial axes, and the fully connected
 * layer (the same product over one cell): Convolution, Pooling, InnerProduct. Forward passes
 * against values worked out by hand, backward passes against hand values and finite differences
 * (tests/support/gradcheck.c), and the errors that bad parameters give (a status and a message
 * naming the layer). CTest runs this file twice: on the build's routes (oneDNN where it has it)
 * and with KILN_ENGINE=ref on the plain reference kernels. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
