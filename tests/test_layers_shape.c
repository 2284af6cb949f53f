/* Layers that route, join, split and reshape blobs: Flatten, Split, Eltwise, Concat, Slice,
 * Reshape, and the SSD fork's Permute. Forward passes and shapes against values worked out by
 * hand, backward passes against finite differences (tests/support/gradcheck.c), in-place runs
 * where Caffe allows them, the errors that bad parameters give (a status and a message naming
 * the layer), and these layers wired together in a net. */
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
  const float xv[6] = {1, 2, 3, 4, 5, 6};
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), xv);
  built s = build("name: 'sp' type: 'Split'", TRAIN, &x, 1, 3);
  forward(&s);
  for (int t = 0; t < 3; t++) {
    expect_shape(s.top[t], 2, SHAPE(2, 3));
    expect_close("split copy", s.top[t]->data, xv, 6, 0);
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

/* ---- Permute (the SSD fork's) ---------------------------------------------------------------- */

/* Runs `param` on x and expects the top's shape and values; backward with dy = the top + 100
 * must give x + 100 everywhere (every bottom diff overwritten through the inverse order). */
static void permute_expect(const char *param, kiln_blob *x, int naxes, const int64_t *shape,
                           const float *want) {
  char text[160];
  snprintf(text, sizeof text, "name: 'pm' type: 'Permute' %s", param);
  built p = build(text, TRAIN, &x, 1, 1);
  forward(&p);
  expect_shape(p.top[0], naxes, shape);
  expect_close(text, p.top[0]->data, want, x->count, 0);
  for (int64_t i = 0; i < x->count; i++) p.top[0]->diff[i] = p.top[0]->data[i] + 100;
  fill(x->diff, x->count, -1);
  backward(&p);
  for (int64_t i = 0; i < x->count; i++) assert_float_equal(x->diff[i], x->data[i] + 100, 0);
  unbuild(&p);
}

/* x (2, 3, 2) = 0..11, x[i][j][k] = 6i + 2j + k. Order 2 0 1: top (2, 2, 3), top[k][i][j] =
 * x[i][j][k]: k = 0 gives 0 2 4 | 6 8 10, k = 1 gives 1 3 5 | 7 9 11. The partial order 2 is
 * completed with the axes not given, ascending (0, 1): the same. 1 0 (completed with 2): top
 * (3, 2, 2), top[j][i][k] = 0 1 6 7 | 2 3 8 9 | 4 5 10 11.
 * SSD's 0 2 3 1 on x (1, 2, 2, 3) = 0..11 (x[0][c][h][w] = 6c + 3h + w): top (1, 2, 3, 2), each
 * position's two channels side by side: 0 6 1 7 2 8 | 3 9 4 10 5 11. The partial 0 2 is 0 2 1 3:
 * top (1, 2, 2, 3), top[0][h][c][w]: 0 1 2 6 7 8 | 3 4 5 9 10 11. No order, or one in order: a
 * copy. */
static void test_permute_hand(void **state) {
  (void)state;
  kiln_blob *x = iota_blob("x", 3, SHAPE(2, 3, 2), 0);
  const float want201[12] = {0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11};
  permute_expect("permute_param { order: 2 order: 0 order: 1 }", x, 3, SHAPE(2, 2, 3), want201);
  permute_expect("permute_param { order: 2 }", x, 3, SHAPE(2, 2, 3), want201);
  permute_expect("permute_param { order: 1 order: 0 }", x, 3, SHAPE(3, 2, 2),
                 (const float[]){0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11});
  permute_expect("", x, 3, SHAPE(2, 3, 2), x->data);
  kiln_blob_free(x);

  kiln_blob *y = iota_blob("y", 4, SHAPE(1, 2, 2, 3), 0);
  permute_expect("permute_param { order: 0 order: 2 order: 3 order: 1 }", y, 4, SHAPE(1, 2, 3, 2),
                 (const float[]){0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11});
  permute_expect("permute_param { order: 0 order: 2 }", y, 4, SHAPE(1, 2, 2, 3),
                 (const float[]){0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11});
  permute_expect("permute_param { order: 0 order: 1 order: 2 order: 3 }", y, 4,
                 SHAPE(1, 2, 2, 3), y->data);
  kiln_blob_free(y);
}

static void test_permute_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 71, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 3, 4, 5), -1, 1, &rng);
  check_grad("name: 'pm' type: 'Permute' permute_param { order: 0 order: 2 order: 3 order: 1 }",
             &x, 1, 1, NULL);
  check_grad("name: 'pm' type: 'Permute' permute_param { order: 3 order: 1 }", &x, 1, 1, NULL);
  check_grad("name: 'pm' type: 'Permute'", &x, 1, 1, NULL);
  kiln_blob *x3 = gc_blob("x3", 3, SHAPE(3, 2, 4), -1, 1, &rng);
  check_grad("name: 'pm' type: 'Permute' permute_param { order: 2 order: 0 }", &x3, 1, 1, NULL);
  kiln_blob_free(x3);
  kiln_blob_free(x);
}

static void test_permute_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 3, 2, 2), NULL);
  expect_create_fails("name: 'pm_range' type: 'Permute' permute_param { order: 0 order: 4 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'pm_range' (Permute)",
                      "order 4 (index 1) is not an axis of the 4-axis bottom");
  expect_create_fails("name: 'pm_twice' type: 'Permute' permute_param { order: 1 order: 2 "
                      "order: 1 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'pm_twice' (Permute)",
                      "order 1 appears twice");
  expect_create_fails("name: 'pm_many' type: 'Permute' permute_param { order: 0 order: 1 "
                      "order: 2 order: 3 order: 0 }",
                      TRAIN, &x, 1, 1, KILN_ERR_INVALID, "layer 'pm_many' (Permute)",
                      "5 order values for a bottom of 4 axes");
  expect_fails_ex("name: 'pm_in_place' type: 'Permute' permute_param { order: 0 order: 2 }",
                  TRAIN, &x, 1, 1, true, KILN_ERR_INVALID, "layer 'pm_in_place' (Permute)",
                  "in place", NULL);
  kiln_blob_free(x);
}

/* ---- in a net ---------------------------------------------------------------------------- */

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

/* SSD's prediction head: a convolution's N x C x H x W put channels last with Permute 0 2 3 1 and
 * flattened, in a net; the permuted blob holds, position by position, the convolution's
 * channels. */
static void test_permute_in_net(void **state) {
  (void)state;
  const char *text =
      "name: 'mbox'\n"
      "layer { name: 'in' type: 'Input' top: 'x' top: 'label' input_param {\n"
      "  shape { dim: 2 dim: 3 dim: 3 dim: 4 } shape { dim: 2 } } }\n"
      "layer { name: 'loc' type: 'Convolution' bottom: 'x' top: 'loc'\n"
      "  convolution_param { num_output: 4 kernel_size: 3 pad: 1\n"
      "    weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'perm' type: 'Permute' bottom: 'loc' top: 'loc_perm'\n"
      "  permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
      "layer { name: 'flat' type: 'Flatten' bottom: 'loc_perm' top: 'loc_flat' }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'loc_flat' top: 'ip'\n"
      "  inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";
  Caffe__NetParameter *np;
  kiln_net *net = net_run(text, &np);
  kiln_blob *loc = kiln_net_blob(net, "loc"), *perm = kiln_net_blob(net, "loc_perm");
  assert_non_null(loc);
  assert_non_null(perm);
  expect_shape(perm, 4, SHAPE(2, 3, 4, 4));
  expect_shape(kiln_net_blob(net, "loc_flat"), 2, SHAPE(2, 48));
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 4; c++)
      for (int s = 0; s < 12; s++)
        assert_float_equal(perm->data[(n * 12 + s) * 4 + c], loc->data[(n * 4 + c) * 12 + s], 0);
  kiln_layer *conv = kiln_net_layer(net, "loc");
  double g = 0;
  for (int64_t i = 0; i < conv->param[0]->count; i++) g += fabs(conv->param[0]->diff[i]);
  assert_true(g > 0);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flatten_shapes),
      cmocka_unit_test(test_split_hand),
      cmocka_unit_test(test_flatten_split_gradients),
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
      cmocka_unit_test(test_permute_hand),
      cmocka_unit_test(test_permute_gradients),
      cmocka_unit_test(test_permute_bad_parameters),
      cmocka_unit_test(test_shape_layers_in_net),
      cmocka_unit_test(test_permute_in_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
