/* Layers over time-major sequences that are not recurrent: SequencePool (the last valid step,
 * the mean or the maximum over the steps a mask marks valid), against hand-worked values and
 * finite differences, with and without a mask, and its refusals. */
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

/* x: T=3, N=2, D=2; step t of sequence n holds (10t + n, -(10t + n)). Sequence 0 is valid at
 * steps 0 and 1, sequence 1 at all three. */
static kiln_blob *seq_x(void) {
  float v[12];
  for (int t = 0; t < 3; t++)
    for (int n = 0; n < 2; n++) {
      v[(t * 2 + n) * 2] = (float)(10 * t + n);
      v[(t * 2 + n) * 2 + 1] = -(float)(10 * t + n);
    }
  return blob_of("x", 3, SHAPE(3, 2, 2), v);
}

static kiln_blob *seq_mask(void) {
  const float m[6] = {1, 1, 1, 1, 0, 1};
  return blob_of("mask", 2, SHAPE(3, 2), m);
}

static void pool_case(const char *pool, bool with_mask, const float *want_y,
                      const float *want_dx /* for dy = (1, 2, 3, 4) */) {
  kiln_blob *b[2] = {seq_x(), seq_mask()};
  char text[160];
  snprintf(text, sizeof text, "name: 'p' type: 'SequencePool' sequence_pool_param { pool: %s }", pool);
  built p = build(text, TRAIN, b, with_mask ? 2 : 1, 1);
  forward(&p);
  expect_shape(p.top[0], 2, SHAPE(2, 2));
  expect_close(pool, p.top[0]->data, want_y, 4, 1e-6);
  const float dy[4] = {1, 2, 3, 4};
  memcpy(p.top[0]->diff, dy, sizeof dy);
  fill(b[0]->diff, 12, 99); /* every element must be written */
  backward(&p);
  expect_close(pool, b[0]->diff, want_dx, 12, 1e-6);
  unbuild(&p);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

static void test_sequence_pool_hand(void **state) {
  (void)state;
  /* masked: sequence 0 is steps 0..1 ((0,0), (10,-10)); sequence 1 steps 0..2 ((1,-1), (11,-11),
   * (21,-21)) */
  const float last_y[4] = {10, -10, 21, -21};
  const float last_dx[12] = {0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 3, 4};
  pool_case("LAST", true, last_y, last_dx);
  const float mean_y[4] = {5, -5, 11, -11};
  const float mean_dx[12] = {0.5f, 1, 1, 4.f / 3, 0.5f, 1, 1, 4.f / 3, 0, 0, 1, 4.f / 3};
  pool_case("MEAN", true, mean_y, mean_dx);
  const float max_y[4] = {10, 0, 21, -1};
  const float max_dx[12] = {0, 2, 0, 4, 1, 0, 0, 0, 0, 0, 3, 0};
  pool_case("MAX", true, max_y, max_dx);
  /* no mask: every step counts; sequence 0's last step is 2, (20, -20) */
  const float last_all[4] = {20, -20, 21, -21};
  const float last_all_dx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
  pool_case("LAST", false, last_all, last_all_dx);
}

static void test_sequence_pool_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 41, 1);
  /* values far apart, so that no finite-difference step changes which step is the maximum */
  kiln_blob *x = distinct_blob("x", 4, SHAPE(4, 3, 2, 3), &rng);
  /* sequence 0 valid at steps 0..1, sequence 1 at 1..3 (not a prefix), sequence 2 at all */
  const float m[12] = {1, 0, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1};
  kiln_blob *mask = blob_of("mask", 2, SHAPE(4, 3), m);
  kiln_blob *b[2] = {x, mask};
  gradcheck_opts o = {.bottom_mask = 1};
  const char *pools[] = {"LAST", "MEAN", "MAX"};
  for (int k = 0; k < 3; k++) {
    char text[160];
    snprintf(text, sizeof text, "name: 'p' type: 'SequencePool' sequence_pool_param { pool: %s }",
             pools[k]);
    check_grad(text, b, 2, 1, &o);
    check_grad(text, b, 1, 1, NULL);
  }
  kiln_blob_free(x);
  kiln_blob_free(mask);
}

static void test_sequence_pool_refusals(void **state) {
  (void)state;
  kiln_blob *x = seq_x();
  const float bad[4] = {1, 1, 1, 1};
  kiln_blob *wrong = blob_of("mask", 2, SHAPE(2, 2), bad);
  kiln_blob *b[2] = {x, wrong};
  expect_create_fails("name: 'p' type: 'SequencePool'", TRAIN, b, 2, 1, KILN_ERR_SHAPE,
                      "layer 'p' (SequencePool)", "mask 'mask' must be T x N = 3 x 2");
  /* a sequence with no valid step */
  const float none[6] = {1, 0, 1, 0, 1, 0};
  kiln_blob *empty = blob_of("mask", 2, SHAPE(3, 2), none);
  b[1] = empty;
  built p = build("name: 'p' type: 'SequencePool'", TRAIN, b, 2, 1);
  assert_int_equal(layer_forward(p.l), KILN_ERR_DATA);
  expect_message("layer 'p' (SequencePool)", "sequence 1 of the batch has no valid step", NULL);
  unbuild(&p);
  kiln_blob *flat = blob_of("flat", 1, SHAPE(3), bad);
  expect_create_fails("name: 'p' type: 'SequencePool'", TRAIN, &flat, 1, 1, KILN_ERR_SHAPE,
                      "layer 'p' (SequencePool)", "it must be T x N x ...");
  kiln_blob_free(flat);
  kiln_blob_free(empty);
  kiln_blob_free(wrong);
  kiln_blob_free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sequence_pool_hand),
      cmocka_unit_test(test_sequence_pool_gradients),
      cmocka_unit_test(test_sequence_pool_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
