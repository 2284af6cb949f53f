/* Caffe's layers that move blobs or pick items of the batch: Silence, Parameter, Tile, Crop,
 * Filter and BatchReindex. Forward and backward passes against values worked out by hand,
 * finite-difference gradient checks, the gradients Caffe refuses (Filter's selector,
 * BatchReindex's indices), the errors bad parameters and shapes give (a status and a message
 * naming the layer and the field), and Filter's varying batch inside a net. */
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

static kiln_net *make_net(const char *text, Caffe__NetParameter **np) {
  if (kiln_net_param_from_text(text, "<net>", np)) {
    print_error("parse: %s\n", kiln_last_error());
    fail();
  }
  kiln_net_options opt = {.phase = TRAIN, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *net = NULL;
  if (kiln_net_create(*np, &opt, &net)) {
    print_error("net: %s\n", kiln_last_error());
    fail();
  }
  return net;
}

/* d loss / d blob `name` against central differences of the net's loss (step 1e-2, relative
 * tolerance 2e-3); the net has run forward and backward. */
static void expect_net_gradient(kiln_net *net, const char *name) {
  kiln_blob *b = kiln_net_blob(net, name);
  assert_non_null(b);
  float *g = malloc(sizeof(float) * (size_t)b->count + 1);
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

/* ---- Silence ----------------------------------------------------------------------------- */

/* No tops; forward does nothing; backward writes a zero gradient into every bottom. */
static void test_silence(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 71, 1);
  kiln_blob *b[2] = {gc_blob("a", 2, SHAPE(2, 3), -1, 1, &rng),
                     gc_blob("b", 4, SHAPE(1, 2, 2, 2), -1, 1, &rng)};
  built s = build("name: 's' type: 'Silence'", TRAIN, b, 2, 0);
  forward(&s);
  fill(b[0]->diff, b[0]->count, 5);
  fill(b[1]->diff, b[1]->count, -5);
  backward(&s);
  const float zeros[8] = {0};
  expect_close("silence a diff", b[0]->diff, zeros, 6, 0);
  expect_close("silence b diff", b[1]->diff, zeros, 8, 0);
  unbuild(&s);
  check_grad("name: 's' type: 'Silence'", b, 2, 0, NULL);
  expect_create_fails("name: 'none' type: 'Silence'", TRAIN, NULL, 0, 0, KILN_ERR_INVALID,
                      "layer 'none' (Silence)", "bottom");
  expect_create_fails("name: 'top' type: 'Silence'", TRAIN, b, 1, 1, KILN_ERR_INVALID,
                      "layer 'top' (Silence)", "top");
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

/* ---- Parameter --------------------------------------------------------------------------- */

/* The blob of parameter_param.shape, zero until set, is the top; the top's gradient adds into
 * the blob's (twice: doubled). No parameter_param: a scalar. */
static void test_parameter(void **state) {
  (void)state;
  built p = build("name: 'p' type: 'Parameter' parameter_param { shape { dim: 2 dim: 3 } }",
                  TRAIN, NULL, 0, 1);
  assert_int_equal(p.l->nparam, 1);
  expect_shape(p.l->param[0], 2, SHAPE(2, 3));
  expect_shape(p.top[0], 2, SHAPE(2, 3));
  const float zeros[6] = {0}, w[6] = {1, -2, 3, 0.5f, 4, -1}, dy[6] = {6, 5, 4, 3, 2, 1};
  expect_close("parameter starts at zero", p.l->param[0]->data, zeros, 6, 0);
  set_params(&p, 0, w);
  forward(&p);
  expect_close("parameter top", p.top[0]->data, w, 6, 0);
  memcpy(p.top[0]->diff, dy, sizeof dy);
  fill(p.l->param[0]->diff, 6, 0);
  backward(&p);
  expect_close("parameter gradient", p.l->param[0]->diff, dy, 6, 0);
  backward(&p);
  expect_close("parameter gradient accumulated", p.l->param[0]->diff,
               (const float[]){12, 10, 8, 6, 4, 2}, 6, 0);
  unbuild(&p);
  built s = build("name: 's' type: 'Parameter'", TRAIN, NULL, 0, 1);
  expect_shape(s.top[0], 0, NULL);
  assert_int_equal(s.top[0]->count, 1);
  unbuild(&s);
  check_grad("name: 'p' type: 'Parameter' parameter_param { shape { dim: 3 dim: 1 dim: 2 } }",
             NULL, 0, 1, NULL);
  expect_create_fails("name: 'neg' type: 'Parameter' parameter_param { shape { dim: 2 dim: -1 } }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'neg' (Parameter)",
                      "parameter_param.shape");
}

/* A Parameter blob plus an input, against a zero target: loss = |w + x|^2 / (2 N) with N = 2,
 * so dw = (w + x) / 2; the solver sees the blob as learnable. */
static void test_parameter_in_a_net(void **state) {
  (void)state;
  const char *text =
      "name: 'n' "
      "layer { name: 'in' type: 'Input' top: 'x' top: 't' input_param { shape { dim: 2 dim: 3 } } "
      "} "
      "layer { name: 'w' type: 'Parameter' top: 'w' parameter_param { shape { dim: 2 dim: 3 } } } "
      "layer { name: 'sum' type: 'Eltwise' bottom: 'w' bottom: 'x' top: 's' } "
      "layer { name: 'l' type: 'EuclideanLoss' bottom: 's' bottom: 't' top: 'loss' } ";
  Caffe__NetParameter *np;
  kiln_net *net = make_net(text, &np);
  kiln_layer *w = kiln_net_layer(net, "w");
  kiln_blob *x = kiln_net_blob(net, "x");
  assert_non_null(w);
  assert_non_null(x);
  for (int i = 0; i < 6; i++) w->param[0]->data[i] = (float)i, x->data[i] = 1;
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  /* (1 + 4 + 9 + 16 + 25 + 36) / 4 */
  assert_float_equal(loss, 91.0f / 4, 1e-5);
  kiln_net_zero_param_diff(net);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  expect_close("dw", w->param[0]->diff, (const float[]){0.5f, 1, 1.5f, 2, 2.5f, 3}, 6, 1e-6);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* ---- Tile -------------------------------------------------------------------------------- */

/* x (2, 3) = 0 .. 5. Axis 1, 2 tiles: (2, 6) = 0 1 2 0 1 2 | 3 4 5 3 4 5. Axis 0, 3 tiles:
 * (6, 3), the whole blob three times. Gradients sum the copies: for axis 1 and dy = 0 .. 11,
 * dx = (0 + 3, 1 + 4, 2 + 5 | 6 + 9, 7 + 10, 8 + 11). */
static void test_tile_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 2, SHAPE(2, 3), 0);
  built t = build("name: 't' type: 'Tile' tile_param { tiles: 2 }", TRAIN, &x, 1, 1);
  forward(&t);
  expect_shape(t.top[0], 2, SHAPE(2, 6));
  expect_close("tile axis 1", t.top[0]->data, (const float[]){0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5},
               12, 0);
  for (int i = 0; i < 12; i++) t.top[0]->diff[i] = (float)i;
  fill(x->diff, 6, 99);
  backward(&t);
  expect_close("tile axis 1 dx", x->diff, (const float[]){3, 5, 7, 15, 17, 19}, 6, 0);
  unbuild(&t);
  built a0 = build("name: 't' type: 'Tile' tile_param { axis: 0 tiles: 3 }", TRAIN, &x, 1, 1);
  forward(&a0);
  expect_shape(a0.top[0], 2, SHAPE(6, 3));
  for (int k = 0; k < 3; k++) expect_close("tile axis 0", a0.top[0]->data + 6 * k, x->data, 6, 0);
  unbuild(&a0);
  built neg = build("name: 't' type: 'Tile' tile_param { axis: -1 tiles: 2 }", TRAIN, &x, 1, 1);
  forward(&neg);
  expect_shape(neg.top[0], 2, SHAPE(2, 6));
  unbuild(&neg);
  kiln_blob_free(x);
}

static void test_tile_gradients_and_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 72, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 2, 2), -1, 1, &rng);
  check_grad("name: 't' type: 'Tile' tile_param { tiles: 3 }", &x, 1, 1, NULL);
  check_grad("name: 't' type: 'Tile' tile_param { axis: 0 tiles: 2 }", &x, 1, 1, NULL);
  check_grad("name: 't' type: 'Tile' tile_param { axis: 3 tiles: 2 }", &x, 1, 1, NULL);
  expect_create_fails("name: 'nt' type: 'Tile'", TRAIN, &x, 1, 1, KILN_ERR_INVALID,
                      "layer 'nt' (Tile)", "tile_param.tiles must be given");
  expect_create_fails("name: 'z' type: 'Tile' tile_param { tiles: 0 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'z' (Tile)", "tile_param.tiles 0");
  expect_create_fails("name: 'ax' type: 'Tile' tile_param { tiles: 2 axis: 4 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'ax' (Tile)", "tile_param.axis 4");
  kiln_blob_free(x);
}

/* ---- Crop -------------------------------------------------------------------------------- */

/* x (1, 1, 4, 5) = 0 .. 19, reference (1, 1, 2, 3), axis 2 (the default):
 *   offsets (1, 2): rows 1-2, columns 2-4 = 7 8 9 | 12 13 14;
 *   offset 1 (both axes): rows 1-2, columns 1-3 = 6 7 8 | 11 12 13;
 *   no offset: 0 1 2 | 5 6 7.
 * Backward puts the top's gradient into its window of a zero input gradient; the reference gets
 * a zero gradient. */
static void test_crop_hand(void **state) {
  (void)state;
  kiln_blob *b[2] = {iota_blob("x", 4, SHAPE(1, 1, 4, 5), 0), blob_of("r", 4, SHAPE(1, 1, 2, 3), NULL)};
  const struct {
    const char *text;
    float y[6];
    int64_t off_h, off_w;
  } cases[] = {
      {"name: 'c' type: 'Crop' crop_param { offset: 1 offset: 2 }", {7, 8, 9, 12, 13, 14}, 1, 2},
      {"name: 'c' type: 'Crop' crop_param { offset: 1 }", {6, 7, 8, 11, 12, 13}, 1, 1},
      {"name: 'c' type: 'Crop'", {0, 1, 2, 5, 6, 7}, 0, 0},
      {"name: 'c' type: 'Crop' crop_param { axis: -2 offset: 1 offset: 2 }", {7, 8, 9, 12, 13, 14},
       1, 2},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    built c = build(cases[k].text, TRAIN, b, 2, 1);
    forward(&c);
    expect_shape(c.top[0], 4, SHAPE(1, 1, 2, 3));
    expect_close(cases[k].text, c.top[0]->data, cases[k].y, 6, 0);
    for (int i = 0; i < 6; i++) c.top[0]->diff[i] = (float)(i + 1);
    fill(b[0]->diff, 20, 99);
    fill(b[1]->diff, 6, 99);
    backward(&c);
    float want[20] = {0};
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++)
        want[(i + cases[k].off_h) * 5 + j + cases[k].off_w] = (float)(i * 3 + j + 1);
    expect_close(cases[k].text, b[0]->diff, want, 20, 0);
    expect_close("reference gradient", b[1]->diff, (const float[6]){0}, 6, 0);
    unbuild(&c);
  }
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

/* Axis 1 on (2, 3, 4, 5) to (2, 2, 2, 3) with offsets (1, 2, 1): y[n][c][h][w] =
 * x[n][c + 1][h + 2][w + 1]; gradients against finite differences; the errors. */
static void test_crop_axes_gradients_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 73, 1);
  kiln_blob *b[2] = {gc_blob("x", 4, SHAPE(2, 3, 4, 5), -1, 1, &rng),
                     gc_blob("r", 4, SHAPE(2, 2, 2, 3), -1, 1, &rng)};
  const char *text = "name: 'c' type: 'Crop' crop_param { axis: 1 offset: 1 offset: 2 offset: 1 }";
  built c = build(text, TRAIN, b, 2, 1);
  forward(&c);
  expect_shape(c.top[0], 4, SHAPE(2, 2, 2, 3));
  float want[24];
  for (int n = 0; n < 2; n++)
    for (int ch = 0; ch < 2; ch++)
      for (int h = 0; h < 2; h++)
        for (int w = 0; w < 3; w++)
          want[((n * 2 + ch) * 2 + h) * 3 + w] =
              b[0]->data[((n * 3 + ch + 1) * 4 + h + 2) * 5 + w + 1];
  expect_close(text, c.top[0]->data, want, 24, 0);
  unbuild(&c);
  check_grad(text, b, 2, 1, NULL);
  check_grad("name: 'c' type: 'Crop' crop_param { offset: 1 }", b, 2, 1, NULL);
  check_grad("name: 'c' type: 'Crop' crop_param { axis: 0 }", b, 2, 1, NULL);
  expect_create_fails("name: 'n3' type: 'Crop' crop_param { offset: 1 offset: 1 offset: 1 }", TRAIN,
                      b, 2, 1, KILN_ERR_INVALID, "layer 'n3' (Crop)", "crop_param.offset has 3");
  expect_create_fails("name: 'big' type: 'Crop' crop_param { offset: 0 offset: 3 }", TRAIN, b, 2,
                      1, KILN_ERR_SHAPE, "layer 'big' (Crop)", "crop_param.offset 3 on axis 3");
  expect_create_fails("name: 'ax' type: 'Crop' crop_param { axis: 4 }", TRAIN, b, 2, 1,
                      KILN_ERR_SHAPE, "layer 'ax' (Crop)", "crop_param.axis 4");
  kiln_blob *r2 = blob_of("r2", 2, SHAPE(2, 2), NULL);
  kiln_blob *few[2] = {b[0], r2};
  expect_create_fails("name: 'few' type: 'Crop'", TRAIN, few, 2, 1, KILN_ERR_SHAPE,
                      "layer 'few' (Crop)", "fewer than the input's 4");
  kiln_blob_free(r2);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

/* ---- Filter ------------------------------------------------------------------------------ */

/* x (4, 2) = 0 .. 7 and labels (4) = 10 .. 13 filtered by the selector (4, 1):
 *   (0, 1, 0, 1): rows 1 and 3, x -> 2 3 6 7, labels -> 11 13, tops of 2 items;
 *   all zero: tops of no items, and every input gradient zero;
 *   (2.5, 0, -1, 0): any value but 0 selects: rows 0 and 2.
 * The first reshape gives the whole batch; forward marks the layer reshaped when the selected
 * count changes. Backward copies each kept item's gradient back, zero for the others. */
static void test_filter_hand(void **state) {
  (void)state;
  kiln_blob *b[3] = {iota_blob("x", 2, SHAPE(4, 2), 0), iota_blob("lab", 1, SHAPE(4), 10),
                     blob_of("sel", 2, SHAPE(4, 1), (const float[]){0, 1, 0, 1})};
  built f = build("name: 'f' type: 'Filter'", TRAIN, b, 3, 2);
  expect_shape(f.top[0], 2, SHAPE(4, 2));
  expect_shape(f.top[1], 1, SHAPE(4));
  forward(&f);
  assert_true(f.l->reshaped);
  f.l->reshaped = false;
  expect_shape(f.top[0], 2, SHAPE(2, 2));
  expect_shape(f.top[1], 1, SHAPE(2));
  expect_close("filter x", f.top[0]->data, (const float[]){2, 3, 6, 7}, 4, 0);
  expect_close("filter labels", f.top[1]->data, (const float[]){11, 13}, 2, 0);
  forward(&f); /* the same selection: no reshape */
  assert_false(f.l->reshaped);
  memcpy(f.top[0]->diff, (const float[]){1, 2, 3, 4}, 4 * sizeof(float));
  fill(b[0]->diff, 8, 99);
  f.l->propagate_down[1] = false;
  f.l->propagate_down[2] = false;
  backward(&f);
  expect_close("filter dx", b[0]->diff, (const float[]){0, 0, 1, 2, 0, 0, 3, 4}, 8, 0);
  fill(b[2]->data, 4, 0);
  forward(&f);
  assert_true(f.l->reshaped);
  f.l->reshaped = false;
  expect_shape(f.top[0], 2, SHAPE(0, 2));
  fill(b[0]->diff, 8, 99);
  backward(&f);
  expect_close("filter dx, nothing kept", b[0]->diff, (const float[8]){0}, 8, 0);
  memcpy(b[2]->data, (const float[]){2.5f, 0, -1, 0}, 4 * sizeof(float));
  forward(&f);
  expect_close("filter x, non-zero selects", f.top[0]->data, (const float[]){0, 1, 4, 5}, 4, 0);
  /* Caffe refuses a gradient for the selector */
  f.l->propagate_down[2] = true;
  kiln_clear_error();
  assert_int_equal(layer_backward(f.l), KILN_ERR_UNSUPPORTED);
  expect_message("layer 'f' (Filter)", "selector", NULL);
  assert_false(kiln_layer_allows_gradient(f.l, 2));
  assert_true(kiln_layer_allows_gradient(f.l, 1));
  unbuild(&f);
  for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
}

static void test_filter_gradients_and_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 74, 1);
  kiln_blob *b[3] = {gc_blob("x", 4, SHAPE(5, 2, 2, 3), -1, 1, &rng),
                     gc_blob("y", 2, SHAPE(5, 3), -1, 1, &rng),
                     blob_of("sel", 1, SHAPE(5), (const float[]){1, 0, 1, 1, 0})};
  gradcheck_opts data_only = {.bottom_mask = 3};
  check_grad("name: 'f' type: 'Filter'", b, 3, 2, &data_only);
  expect_fails_ex("name: 'nt' type: 'Filter'", TRAIN, b, 3, 1, false, KILN_ERR_INVALID,
                  "layer 'nt' (Filter)", "one top per bottom", NULL);
  kiln_blob *wide = blob_of("wide", 2, SHAPE(5, 2), NULL);
  kiln_blob *bw[2] = {b[0], wide};
  expect_create_fails("name: 'w' type: 'Filter'", TRAIN, bw, 2, 1, KILN_ERR_SHAPE,
                      "layer 'w' (Filter)", "N x 1");
  kiln_blob *short_sel = blob_of("s4", 1, SHAPE(4), NULL);
  kiln_blob *bs[2] = {b[0], short_sel};
  expect_create_fails("name: 's' type: 'Filter'", TRAIN, bs, 2, 1, KILN_ERR_SHAPE,
                      "layer 's' (Filter)", "4 items");
  kiln_blob_free(short_sel);
  kiln_blob_free(wide);
  for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
}

/* In a net: an InnerProduct's output and a target filtered by a selector, then a Euclidean loss.
 * Selections of 3, then 1, then 4 items: the loss layer is reshaped each time, the loss is that
 * of the kept items only, and the input gradient matches finite differences (items not kept get
 * none). */
static void test_filter_in_a_net(void **state) {
  (void)state;
  const char *text =
      "name: 'n' "
      "layer { name: 'in' type: 'Input' top: 'x' top: 't' top: 'sel' input_param { "
      "shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } shape { dim: 4 } } } "
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'h' inner_product_param { "
      "num_output: 2 weight_filler { type: 'gaussian' std: 0.5 } } } "
      "layer { name: 'f' type: 'Filter' bottom: 'h' bottom: 't' bottom: 'sel' top: 'fh' "
      "top: 'ft' } "
      "layer { name: 'l' type: 'EuclideanLoss' bottom: 'fh' bottom: 'ft' top: 'loss' } ";
  Caffe__NetParameter *np;
  if (kiln_net_param_from_text(text, "<net>", &np)) fail_msg("%s", kiln_last_error());
  kiln_net_options opt = {.phase = TRAIN, .seed = 5, .config = kiln_test_net_config()};
  np->force_backward = true;
  kiln_net *net = NULL;
  if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());
  kiln_blob *x = kiln_net_blob(net, "x"), *t = kiln_net_blob(net, "t"),
            *sel = kiln_net_blob(net, "sel"), *h = kiln_net_blob(net, "h");
  kiln_rng rng;
  kiln_rng_seed(&rng, 75, 1);
  for (int64_t i = 0; i < x->count; i++) x->data[i] = kiln_rng_uniform(&rng, -1, 1);
  for (int64_t i = 0; i < t->count; i++) t->data[i] = kiln_rng_uniform(&rng, -1, 1);
  const float sels[3][4] = {{1, 1, 0, 1}, {0, 0, 1, 0}, {1, 1, 1, 1}};
  const int kept[3] = {3, 1, 4};
  for (int k = 0; k < 3; k++) {
    memcpy(sel->data, sels[k], sizeof sels[k]);
    float loss;
    assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
    expect_shape(kiln_net_blob(net, "fh"), 2, SHAPE(kept[k], 2));
    double want = 0;
    for (int n = 0; n < 4; n++)
      if (sels[k][n] != 0)
        for (int j = 0; j < 2; j++) {
          double d = (double)h->data[n * 2 + j] - t->data[n * 2 + j];
          want += d * d;
        }
    want /= 2.0 * kept[k];
    assert_float_equal(loss, want, 1e-5 * fmax(1, want));
    kiln_net_zero_param_diff(net);
    assert_int_equal(kiln_net_backward(net), KILN_OK);
    for (int n = 0; n < 4; n++)
      if (sels[k][n] == 0)
        expect_close("dropped item's gradient", h->diff + 2 * n, (const float[2]){0}, 2, 0);
    expect_net_gradient(net, "x");
  }
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* ---- BatchReindex ------------------------------------------------------------------------ */

/* x (3, 2) = 0 .. 5, indices (2, 0, 2, 1): top (4, 2) = 4 5 | 0 1 | 4 5 | 2 3. With dy = 1 .. 8
 * the gradient adds each top item into its source: item 0 <- (3, 4), item 1 <- (7, 8), item
 * 2 <- (1, 2) + (5, 6) = (6, 8). */
static void test_batch_reindex_hand(void **state) {
  (void)state;
  kiln_blob *b[2] = {iota_blob("x", 2, SHAPE(3, 2), 0),
                     blob_of("idx", 1, SHAPE(4), (const float[]){2, 0, 2, 1})};
  built r = build("name: 'r' type: 'BatchReindex'", TRAIN, b, 2, 1);
  forward(&r);
  expect_shape(r.top[0], 2, SHAPE(4, 2));
  expect_close("reindex", r.top[0]->data, (const float[]){4, 5, 0, 1, 4, 5, 2, 3}, 8, 0);
  for (int i = 0; i < 8; i++) r.top[0]->diff[i] = (float)(i + 1);
  fill(b[0]->diff, 6, 99);
  r.l->propagate_down[1] = false;
  backward(&r);
  expect_close("reindex dx", b[0]->diff, (const float[]){3, 4, 7, 8, 6, 8}, 6, 0);
  r.l->propagate_down[1] = true;
  kiln_clear_error();
  assert_int_equal(layer_backward(r.l), KILN_ERR_UNSUPPORTED);
  expect_message("layer 'r' (BatchReindex)", "indices", NULL);
  /* an index past the batch, or negative: refused when forward reads it */
  b[1]->data[3] = 3;
  kiln_clear_error();
  assert_int_equal(layer_forward(r.l), KILN_ERR_DATA);
  expect_message("layer 'r' (BatchReindex)", "index 3 at position 3", "past the batch of 3");
  b[1]->data[3] = -1;
  assert_int_equal(layer_forward(r.l), KILN_ERR_DATA);
  expect_message("layer 'r' (BatchReindex)", "negative", NULL);
  unbuild(&r);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

static void test_batch_reindex_gradients_and_errors(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 76, 1);
  kiln_blob *b[2] = {gc_blob("x", 4, SHAPE(3, 2, 2, 2), -1, 1, &rng),
                     blob_of("idx", 1, SHAPE(5), (const float[]){1, 1, 0, 2, 1})};
  gradcheck_opts data_only = {.bottom_mask = 1};
  check_grad("name: 'r' type: 'BatchReindex'", b, 2, 1, &data_only);
  kiln_blob *idx2 = blob_of("idx2", 2, SHAPE(5, 1), NULL);
  kiln_blob *bad[2] = {b[0], idx2};
  expect_create_fails("name: 'i2' type: 'BatchReindex'", TRAIN, bad, 2, 1, KILN_ERR_SHAPE,
                      "layer 'i2' (BatchReindex)", "must have 1 axis");
  kiln_blob_free(idx2);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_silence),
      cmocka_unit_test(test_parameter),
      cmocka_unit_test(test_parameter_in_a_net),
      cmocka_unit_test(test_tile_hand),
      cmocka_unit_test(test_tile_gradients_and_errors),
      cmocka_unit_test(test_crop_hand),
      cmocka_unit_test(test_crop_axes_gradients_errors),
      cmocka_unit_test(test_filter_hand),
      cmocka_unit_test(test_filter_gradients_and_errors),
      cmocka_unit_test(test_filter_in_a_net),
      cmocka_unit_test(test_batch_reindex_hand),
      cmocka_unit_test(test_batch_reindex_gradients_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
