/* Sequence layers: Embed. Forward and backward passes against values worked out by hand, the
 * weight gradient against finite differences and across thread counts, and the errors of bad
 * indices and parameters. */
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

/* ---- Embed ------------------------------------------------------------------------------- */

static const char *embed_text =
    "name: 'emb' type: 'Embed' embed_param { num_output: 2 input_dim: 4 "
    "weight_filler { type: 'uniform' min: -1 max: 1 } bias_filler { type: 'uniform' min: -1 "
    "max: 1 } }";

/* Each index picks a row of W (4 x 2) and adds the bias; index 3 twice, 0 twice. The weight
 * gradient adds the top gradients of every position into the row it read (rows 0 and 3 get two
 * each, row 2 none); the bias gradient sums them all. */
static void test_embed_forward_backward_hand(void **state) {
  (void)state;
  const float idx[6] = {3, 0, 1, 3, 0, 2};
  kiln_blob *x = blob_of("idx", 2, SHAPE(2, 3), idx);
  built e = build(embed_text, TRAIN, &x, 1, 1);
  assert_int_equal(e.l->nparam, 2);
  expect_shape(e.l->param[0], 2, SHAPE(4, 2));
  expect_shape(e.l->param[1], 1, SHAPE(2));
  const float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[2] = {0.5f, -1};
  set_params(&e, 0, w);
  set_params(&e, 1, b);
  forward(&e);
  expect_shape(e.top[0], 3, SHAPE(2, 3, 2));
  const float want[12] = {7.5f, 7, 1.5f, 1, 3.5f, 3, 7.5f, 7, 1.5f, 1, 5.5f, 5};
  expect_close("embed y", e.top[0]->data, want, 12, 0);
  for (int i = 0; i < 12; i++) e.top[0]->diff[i] = (float)(i + 1);
  for (int p = 0; p < 2; p++) fill(e.l->param[p]->diff, e.l->param[p]->count, 0);
  e.l->propagate_down[0] = false;
  backward(&e);
  /* dy rows: pos0 (1,2) -> row 3, pos1 (3,4) -> row 0, pos2 (5,6) -> row 1, pos3 (7,8) -> row 3,
   * pos4 (9,10) -> row 0, pos5 (11,12) -> row 2. */
  const float dw[8] = {3 + 9, 4 + 10, 5, 6, 11, 12, 1 + 7, 2 + 8};
  const float db[2] = {1 + 3 + 5 + 7 + 9 + 11, 2 + 4 + 6 + 8 + 10 + 12};
  expect_close("embed dW", e.l->param[0]->diff, dw, 8, 0);
  expect_close("embed db", e.l->param[1]->diff, db, 2, 0);
  /* Accumulated, not overwritten. */
  backward(&e);
  for (int i = 0; i < 8; i++) assert_true(e.l->param[0]->diff[i] == 2 * dw[i]);
  unbuild(&e);

  /* Without a bias: rows copied as they are; indices of any shape (here 3-D). */
  kiln_blob *x3 = blob_of("idx", 3, SHAPE(1, 2, 1), (const float[]){2, 1});
  built nb = build("name: 'emb' type: 'Embed' embed_param { num_output: 2 input_dim: 4 "
                   "bias_term: false }",
                   TRAIN, &x3, 1, 1);
  assert_int_equal(nb.l->nparam, 1);
  set_params(&nb, 0, w);
  forward(&nb);
  expect_shape(nb.top[0], 4, SHAPE(1, 2, 1, 2));
  expect_close("embed y without bias", nb.top[0]->data, (const float[]){5, 6, 3, 4}, 4, 0);
  unbuild(&nb);
  kiln_blob_free(x3);
  kiln_blob_free(x);
}

static void test_embed_gradients(void **state) {
  (void)state;
  const float idx[8] = {3, 0, 1, 3, 0, 0, 2, 3};
  kiln_blob *x = blob_of("idx", 2, SHAPE(4, 2), idx);
  /* Parameters only: bit 1 names no bottom, so the indices get no propagate_down. */
  gradcheck_opts o = {.bottom_mask = 1u << 1};
  check_grad("name: 'emb' type: 'Embed' embed_param { num_output: 3 input_dim: 5 "
             "weight_filler { type: 'uniform' min: -1 max: 1 } "
             "bias_filler { type: 'uniform' min: -1 max: 1 } }",
             &x, 1, 1, &o);
  check_grad("name: 'emb' type: 'Embed' embed_param { num_output: 2 input_dim: 4 "
             "bias_term: false weight_filler { type: 'uniform' min: -1 max: 1 } }",
             &x, 1, 1, &o);
  kiln_blob_free(x);
}

/* The weight gradient of many positions sharing rows is the same, bit for bit, whatever the
 * thread count (positions are added in order; threads split the columns). */
static void test_embed_weight_gradient_thread_independent(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 3, 3);
  kiln_blob *x = label_blob("idx", 2, SHAPE(64, 40), 7, &rng);
  const char *text = "name: 'emb' type: 'Embed' embed_param { num_output: 300 input_dim: 7 }";
  float *dw[2];
  for (int run = 0; run < 2; run++) {
    built e = build(text, TRAIN, &x, 1, 1);
    e.l->nthreads = run ? 4 : 1;
    e.l->propagate_down[0] = false;
    forward(&e);
    kiln_rng r2;
    kiln_rng_seed(&r2, 8, 8);
    for (int64_t i = 0; i < e.top[0]->count; i++) e.top[0]->diff[i] = kiln_rng_uniform(&r2, -1, 1);
    fill(e.l->param[0]->diff, e.l->param[0]->count, 0);
    fill(e.l->param[1]->diff, e.l->param[1]->count, 0);
    backward(&e);
    dw[run] = malloc(sizeof(float) * 7 * 300);
    assert_non_null(dw[run]);
    memcpy(dw[run], e.l->param[0]->diff, sizeof(float) * 7 * 300);
    unbuild(&e);
  }
  assert_memory_equal(dw[0], dw[1], sizeof(float) * 7 * 300);
  free(dw[0]);
  free(dw[1]);
  kiln_blob_free(x);
}

/* Runs forward with `v` at position 1 of the indices: an error naming the layer and the value,
 * not a read outside the table. */
static void expect_bad_index(float v, const char *shown) {
  kiln_blob *x = blob_of("idx", 1, SHAPE(3), (const float[]){0, v, 1});
  built e = build(embed_text, TRAIN, &x, 1, 1);
  kiln_clear_error();
  assert_int_equal(e.l->ops->forward(e.l), KILN_ERR_INVALID);
  expect_message("layer 'emb' (Embed)", shown, "[0, 4)");
  unbuild(&e);
  kiln_blob_free(x);
}

static void test_embed_errors(void **state) {
  (void)state;
  expect_bad_index(4, "index 4 ");
  expect_bad_index(-1, "index -1 ");
  expect_bad_index(1.5f, "index 1.5 ");
  expect_bad_index(NAN, "index nan ");
  expect_bad_index(1e30f, "index 1e+30 ");
  kiln_blob *x = blob_of("idx", 1, SHAPE(3), (const float[]){0, 3, 1});
  const char *who = "layer 'emb' (Embed)";
  expect_create_fails("name: 'emb' type: 'Embed' embed_param { input_dim: 4 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, who, "num_output");
  expect_create_fails("name: 'emb' type: 'Embed' embed_param { num_output: 3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, who, "input_dim");
  /* No gradient to the indices: a propagate_down set on them is refused, as Caffe does. */
  built e = build(embed_text, TRAIN, &x, 1, 1);
  forward(&e);
  e.l->propagate_down[0] = true;
  kiln_clear_error();
  assert_int_equal(e.l->ops->backward(e.l), KILN_ERR_INVALID);
  expect_message(who, "index input", NULL);
  assert_true(e.l->ops->no_gradient_bottoms & 1u);
  unbuild(&e);
  kiln_blob_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embed_forward_backward_hand),
      cmocka_unit_test(test_embed_gradients),
      cmocka_unit_test(test_embed_weight_gradient_thread_independent),
      cmocka_unit_test(test_embed_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
