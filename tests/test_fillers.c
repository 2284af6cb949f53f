/* Fillers: each one's distribution against its definition (Caffe's): constant, uniform range,
 * gaussian mean and standard deviation (and sparsity), xavier's U[-sqrt(3/n), sqrt(3/n)], msra's
 * N(0, sqrt(2/n)) with n = fan_in, fan_out or their average; unknown types are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "gradcheck.h"

typedef struct {
  double mean, std, min, max, zeros;
} stats;

static stats fill_stats(const char *filler_text, int64_t out, int64_t in, int64_t kh) {
  ProtobufCMessage *m;
  assert_int_equal(kiln_text_parse(filler_text, strlen(filler_text), "<test>",
                                   &caffe__filler_parameter__descriptor, &m), KILN_OK);
  kiln_blob *b = kiln_blob_new("w");
  int64_t shape[4] = {out, in, kh, kh};
  assert_int_equal(kiln_blob_reshape(b, 4, shape), KILN_OK);
  kiln_rng r;
  kiln_rng_seed(&r, 11, 0);
  assert_int_equal(kiln_fill(b, (Caffe__FillerParameter *)m, 0, &r), KILN_OK);
  stats s = {.min = INFINITY, .max = -INFINITY};
  for (int64_t i = 0; i < b->count; i++) {
    double v = b->data[i];
    s.mean += v;
    s.min = fmin(s.min, v);
    s.max = fmax(s.max, v);
    s.zeros += v == 0;
  }
  s.mean /= b->count;
  for (int64_t i = 0; i < b->count; i++) s.std += (b->data[i] - s.mean) * (b->data[i] - s.mean);
  s.std = sqrt(s.std / b->count);
  s.zeros /= b->count;
  kiln_blob_free(b);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

static void test_constant_and_uniform(void **state) {
  (void)state;
  stats c = fill_stats("type: 'constant' value: 0.25", 10, 10, 3);
  assert_true(c.min == 0.25 && c.max == 0.25);
  stats u = fill_stats("type: 'uniform' min: -2 max: 3", 100, 100, 3);
  assert_true(u.min >= -2 && u.max < 3);
  assert_true(u.min < -1.99 && u.max > 2.99);
  assert_true(fabs(u.mean - 0.5) < 0.02);
  assert_true(fabs(u.std - 5 / sqrt(12)) < 0.02);
}

static void test_gaussian_and_sparse(void **state) {
  (void)state;
  stats g = fill_stats("type: 'gaussian' mean: 1 std: 0.5", 100, 100, 3);
  assert_true(fabs(g.mean - 1) < 0.01);
  assert_true(fabs(g.std - 0.5) < 0.01);
  /* sparse: 9 of 900 inputs per output kept on average */
  stats s = fill_stats("type: 'gaussian' std: 1 sparse: 9", 100, 100, 3);
  assert_true(fabs(s.zeros - 0.99) < 0.003);
}

static void test_xavier_and_msra(void **state) {
  (void)state;
  /* shape 64 x 32 x 3 x 3: fan_in 288, fan_out 576 */
  double fan_in = 288, fan_out = 576;
  stats x = fill_stats("type: 'xavier'", 64, 32, 3);
  double lim = sqrt(3 / fan_in);
  assert_true(x.max < lim && x.min >= -lim && x.max > 0.98 * lim);
  assert_true(fabs(x.std - lim / sqrt(3)) < 0.03 * lim);
  stats xo = fill_stats("type: 'xavier' variance_norm: FAN_OUT", 64, 32, 3);
  assert_true(xo.max < sqrt(3 / fan_out) && xo.max > 0.98 * sqrt(3 / fan_out));
  stats m = fill_stats("type: 'msra'", 64, 32, 3);
  assert_true(fabs(m.std - sqrt(2 / fan_in)) < 0.03 * sqrt(2 / fan_in));
  assert_true(fabs(m.mean) < 0.01 * sqrt(2 / fan_in) * 10);
  stats ma = fill_stats("type: 'msra' variance_norm: AVERAGE", 64, 32, 3);
  double avg = (fan_in + fan_out) / 2;
  assert_true(fabs(ma.std - sqrt(2 / avg)) < 0.03 * sqrt(2 / avg));
}

static void test_unknown_filler(void **state) {
  (void)state;
  kiln_blob *b = kiln_blob_new("w");
  int64_t shape[1] = {4};
  assert_int_equal(kiln_blob_reshape(b, 1, shape), KILN_OK);
  Caffe__FillerParameter f = CAFFE__FILLER_PARAMETER__INIT;
  f.type = "xaviar";
  kiln_rng r;
  kiln_rng_seed(&r, 1, 0);
  assert_int_equal(kiln_fill(b, &f, 0, &r), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "unknown filler type 'xaviar'"));
  kiln_blob_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_constant_and_uniform),
      cmocka_unit_test(test_gaussian_and_sparse),
      cmocka_unit_test(test_xavier_and_msra),
      cmocka_unit_test(test_unknown_filler),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
