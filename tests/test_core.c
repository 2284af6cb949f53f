/* Core: blobs, errors, the random generator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "kiln/core.h"

static void test_blob_reshape_keeps_capacity(void **state) {
  (void)state;
  kiln_blob *b = kiln_blob_new("x");
  int64_t s1[] = {2, 3, 4};
  assert_int_equal(kiln_blob_reshape(b, 3, s1), KILN_OK);
  assert_int_equal(b->count, 24);
  float *d = b->data;
  int64_t s2[] = {4, 5};
  assert_int_equal(kiln_blob_reshape(b, 2, s2), KILN_OK);
  assert_ptr_equal(b->data, d); /* shrinking does not reallocate */
  assert_int_equal(kiln_blob_count_range(b, 0, 2), 20);
  int64_t bad[] = {2, -1};
  assert_int_equal(kiln_blob_reshape(b, 2, bad), KILN_ERR_SHAPE);
  assert_non_null(strstr(kiln_last_error(), "negative"));
  kiln_blob_free(b);
}

static void test_rng_reproducible_and_uniform(void **state) {
  (void)state;
  kiln_rng a, b;
  kiln_rng_seed(&a, 42, 1);
  kiln_rng_seed(&b, 42, 1);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; i++) {
    float x = kiln_rng_uniform(&a, 0, 1);
    assert_true(x == kiln_rng_uniform(&b, 0, 1));
    assert_true(x >= 0 && x < 1);
    sum += x;
  }
  assert_true(sum / 100000 > 0.49 && sum / 100000 < 0.51);
  sum = 0;
  for (int i = 0; i < 100000; i++) {
    float g = kiln_rng_gaussian(&a, 1, 2);
    sum += g;
    sq += (g - 1) * (g - 1);
  }
  assert_true(sum / 100000 > 0.97 && sum / 100000 < 1.03);
  assert_true(sq / 100000 > 3.9 && sq / 100000 < 4.1);
}

static void test_error_context(void **state) {
  (void)state;
  int rc = kiln_errorf(KILN_ERR_INVALID, "bad thing %d", 3);
  assert_int_equal(rc, KILN_ERR_INVALID);
  kiln_error_context(rc, "layer '%s': ", "conv1");
  assert_string_equal(kiln_last_error(), "layer 'conv1': bad thing 3");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blob_reshape_keeps_capacity),
      cmocka_unit_test(test_rng_reproducible_and_uniform),
      cmocka_unit_test(test_error_context),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
