/* Object detection's host arithmetic, part two (include/kiln/detect.h; src/ops/detect_eval.c):
 * non-maximum suppression (threshold, top_k, eta, ties), DetectionOutput on a tiny batch
 * (two classes, keep_top_k, the rows of an empty result), DetectionEvaluate's true and false
 * positives (duplicates, difficult boxes, wrong labels, an image without boxes, the overlap
 * threshold's edge, pixel sizes), average precision in its three versions on a hand-worked list
 * and its edges, and a test pass's mAP over two batches. Boxes sit on multiples of 1/8, where
 * every overlap is exact in float, so the edges are tested as such. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/detect.h"

static void near(const char *what, double got, double want, double tol) {
  if (!(fabs(got - want) <= tol)) fail_msg("%s: got %.9g, want %.9g (tolerance %g)", what, got, want, tol);
}

static void error_names(int rc, int want, const char *part) {
  assert_int_equal(rc, want);
  if (!strstr(kiln_last_error(), part))
    fail_msg("error message '%s' does not name '%s'", kiln_last_error(), part);
}

/* Rows of `width` floats against the expected ones, exactly except for the scores and boxes
 * kiln computes in float (tolerance tol). */
static void rows_are(const char *what, const kiln_det_buf *b, int width, const float *want,
                     int64_t n, double tol) {
  if (b->rows != n) fail_msg("%s: %lld rows, want %lld", what, (long long)b->rows, (long long)n);
  for (int64_t r = 0; r < n; r++)
    for (int k = 0; k < width; k++)
      if (!(fabs(b->v[r * width + k] - want[r * width + k]) <= tol))
        fail_msg("%s: row %lld column %d is %.9g, want %.9g", what, (long long)r, k,
                 b->v[r * width + k], want[r * width + k]);
}

/* ---- suppression ---------------------------------------------------------------------------- */

/* b0 (0, 0, .5, .5) .9; b1 (0, 0, .5, .375) .8, overlapping b0 .75; b2 (.5, .5, 1, 1) .7, apart;
 * b3 (0, 0, .5, .25) .6, overlapping b0 .5 exactly and b1 .125 / .1875 = .667; b4 .05. */
static const kiln_bbox B5[5] = {{0, 0, 0.5f, 0.5f},
                                {0, 0, 0.5f, 0.375f},
                                {0.5f, 0.5f, 1, 1},
                                {0, 0, 0.5f, 0.25f},
                                {0.5f, 0, 1, 0.5f}};

static void nms_keeps(const float *scores, float thr, float eta, int top_k, const int *want,
                      int n) {
  int order[5], keep[5], nk = -1;
  kiln_nms(B5, scores, 5, 0.1f, thr, eta, top_k, order, keep, &nk);
  if (nk != n) fail_msg("nms %g, eta %g, top_k %d: kept %d, want %d", thr, eta, top_k, nk, n);
  for (int k = 0; k < n; k++)
    if (keep[k] != want[k])
      fail_msg("nms %g, eta %g, top_k %d: kept[%d] = %d, want %d", thr, eta, top_k, k, keep[k],
               want[k]);
}

static void test_nms(void **state) {
  (void)state;
  const float s[5] = {0.9f, 0.8f, 0.7f, 0.6f, 0.05f};
  /* .5: b1 goes (.75), b3 stays (.5 is not above .5); b4 is under the score threshold .1 */
  nms_keeps(s, 0.5f, 1, 0, (const int[]){0, 2, 3}, 3);
  nms_keeps(s, 0.45f, 1, -1, (const int[]){0, 2}, 2);
  /* top_k 2: only b0 and b1 are candidates */
  nms_keeps(s, 0.5f, 1, 2, (const int[]){0}, 1);
  /* .8 keeps all four; eta .5 lowers it to .4 after b0 (and no further once at or under .5):
   * b1 (.75) and b3 (.5) go; eta .9: .72 after b0 (b1 goes), .648 after b2 (b3 stays) */
  nms_keeps(s, 0.8f, 1, 0, (const int[]){0, 1, 2, 3}, 4);
  nms_keeps(s, 0.8f, 0.5f, 0, (const int[]){0, 2}, 2);
  nms_keeps(s, 0.8f, 0.9f, 0, (const int[]){0, 2, 3}, 3);
  /* ties go to the lower index: b0 and b1 at .8, b0 kept and b1 suppressed; the same with b1
   * first in index order keeps b1 */
  const float tie[5] = {0.8f, 0.8f, 0.7f, 0.6f, 0.05f};
  nms_keeps(tie, 0.5f, 1, 0, (const int[]){0, 2, 3}, 3);
  const float tie2[5] = {0.8f, 0.8f, 0.05f, 0.05f, 0.05f};
  int order[5], keep[5], nk = 0;
  const kiln_bbox swapped[5] = {B5[1], B5[0], B5[2], B5[3], B5[4]};
  kiln_nms(swapped, tie2, 5, 0.1f, 0.5f, 1, 0, order, keep, &nk);
  assert_int_equal(nk, 1);
  assert_int_equal(keep[0], 0);
  /* a NaN score is never a candidate; a score equal to the threshold is not above it */
  const float odd[5] = {NAN, 0.1f, 0.7f, 0.05f, 0.05f};
  nms_keeps(odd, 0.5f, 1, 0, (const int[]){2}, 1);
}

/* ---- DetectionOutput ------------------------------------------------------------------------ */

/* Three priors with variances .5 (CORNER): p0 (0, 0, .5, .5), p1 (0, 0, .5, .375), p2
 * (.5, .5, 1, 1); image 0 moves p2 by (.125, 0, 0, 0) x .5 to (.5625, .5, 1, 1). Image 0's
 * probabilities p0 (.1, .6, .3), p1 (.2, .7, .1), p2 (.3, .2, .5); image 1's all (.9, .05, .05).
 * At confidence .15 and nms .45: class 1 ranks p1 .7, p0 .6 (suppressed by p1, .75), p2 .2;
 * class 2 p2 .5, p0 .3 (p1's .1 too low). Image 1 has nothing above .15. */
static float DO_PRIOR[24];
static const float DO_CONF[2 * 9] = {0.1f, 0.6f, 0.3f, 0.2f, 0.7f, 0.1f, 0.3f, 0.2f, 0.5f,
                                     0.9f, 0.05f, 0.05f, 0.9f, 0.05f, 0.05f, 0.9f, 0.05f, 0.05f};

static kiln_detect_spec do_spec(void) {
  kiln_detect_spec s;
  memset(&s, 0, sizeof s);
  s.num_classes = 3;
  s.background_label = 0;
  s.share_location = true;
  s.nms_threshold = 0.45f;
  s.eta = 1;
  s.top_k = 400;
  s.keep_top_k = -1;
  s.confidence_threshold = 0.15f;
  s.code = KILN_BOX_CORNER;
  return s;
}

static void setup_priors(void) {
  const float b[12] = {0, 0, 0.5f, 0.5f, 0, 0, 0.5f, 0.375f, 0.5f, 0.5f, 1, 1};
  memcpy(DO_PRIOR, b, sizeof b);
  for (int k = 12; k < 24; k++) DO_PRIOR[k] = 0.5f;
}

static void test_detection_output(void **state) {
  (void)state;
  setup_priors();
  float loc[2 * 3 * 4] = {0};
  loc[8] = 0.125f; /* image 0, p2's xmin */
  kiln_detect_spec s = do_spec();
  kiln_det_buf out = {0};
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_OK);
  const float all[4 * 7] = {0, 1, 0.7f, 0, 0, 0.5f, 0.375f,       0, 1, 0.2f, 0.5625f, 0.5f, 1, 1,
                            0, 2, 0.5f, 0.5625f, 0.5f, 1, 1,     0, 2, 0.3f, 0, 0, 0.5f, 0.5f};
  rows_are("all", &out, 7, all, 4, 1e-7);
  /* keep_top_k 3: the three best of the image (.7, .5, .3), written in class order */
  s.keep_top_k = 3;
  out.rows = 0;
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_OK);
  const float top3[3 * 7] = {0, 1, 0.7f, 0, 0, 0.5f, 0.375f, 0, 2, 0.5f, 0.5625f, 0.5f, 1, 1,
                             0, 2, 0.3f, 0, 0, 0.5f, 0.5f};
  rows_are("keep_top_k 3", &out, 7, top3, 3, 1e-7);
  s.keep_top_k = 1;
  out.rows = 0;
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_OK);
  rows_are("keep_top_k 1", &out, 7, top3, 1, 1e-7);
  /* nothing above the threshold anywhere (and keep_top_k 0 keeps nothing): one row of -1 per
   * image after its index, appended after the row already there */
  const float none[3 * 7] = {9, 9, 9, 9, 9, 9, 9,   0, -1, -1, -1, -1, -1, -1,
                             1, -1, -1, -1, -1, -1, -1};
  s.keep_top_k = -1;
  s.confidence_threshold = 0.95f;
  out.rows = 1;
  for (int k = 0; k < 7; k++) out.v[k] = 9;
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_OK);
  rows_are("no detection", &out, 7, none, 3, 0);
  s.confidence_threshold = 0.15f;
  s.keep_top_k = 0;
  out.rows = 1;
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_OK);
  rows_are("keep_top_k 0", &out, 7, none, 3, 0);
  /* locations per class: class 2's p0 moves its xmax by .25 x .5 to .625, class 1's does not */
  float loc3[2 * 3 * 3 * 4] = {0};
  loc3[(2 * 3 + 1) * 4 + 0] = 0.125f; /* image 0, p2, class 1 */
  loc3[(2 * 3 + 2) * 4 + 0] = 0.125f; /* image 0, p2, class 2 */
  loc3[(0 * 3 + 2) * 4 + 2] = 0.25f;  /* image 0, p0, class 2 */
  s.keep_top_k = -1;
  s.share_location = false;
  out.rows = 0;
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc3, DO_CONF, DO_PRIOR, &out), KILN_OK);
  float moved[4 * 7];
  memcpy(moved, all, sizeof moved);
  moved[3 * 7 + 5] = 0.625f;
  rows_are("per class", &out, 7, moved, 4, 1e-7);
  /* without a background class, class 0 is detected too: image 1's three .9 (p1 suppressed) */
  s.share_location = true;
  s.background_label = -1;
  out.rows = 0;
  assert_int_equal(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_OK);
  int class0 = 0;
  for (int64_t r = 0; r < out.rows; r++) class0 += out.v[7 * r] == 1 && out.v[7 * r + 1] == 0;
  assert_int_equal(class0, 2);
  s.background_label = 0;
  s.eta = 0;
  error_names(kiln_detection_output(&s, 2, 3, loc, DO_CONF, DO_PRIOR, &out), KILN_ERR_INVALID,
              "eta");
  kiln_det_buf_free(&out);
  assert_null(out.v);
}

/* ---- DetectionEvaluate ---------------------------------------------------------------------- */

/* Image 0's boxes: g0 (0, 0, .5, .5) label 1; g1 (.5, .5, 1, 1) label 1, difficult; g2
 * (0, .5, .5, 1) label 2. Image 1 has none. Detections (rows out of score order):
 *   r0 1 .8 = g0 (1.0)            r1 1 .9 (0, 0, .5, .375): g0 .75, taken first (higher score)
 *   r2 1 .7 = g1 (difficult)      r3 1 .6 (0, 0, .5, .25): g0 .5, but g0 is taken
 *   r4 2 .5 (0, .5, .5, .75): g2 .5 exactly    r5 2 .4 (.5, 0, 1, .5): touches g2 only
 *   r6 image 1, 1 .3              r7 1 .2 on g2's place: no label-1 box overlaps it
 *   r8 image 1's "none" row       r9 item -1 */
static const float EV_DET[10 * 7] = {
    0, 1, 0.8f, 0, 0, 0.5f, 0.5f,     0, 1, 0.9f, 0, 0, 0.5f, 0.375f,
    0, 1, 0.7f, 0.5f, 0.5f, 1, 1,     0, 1, 0.6f, 0, 0, 0.5f, 0.25f,
    0, 2, 0.5f, 0, 0.5f, 0.5f, 0.75f, 0, 2, 0.4f, 0.5f, 0, 1, 0.5f,
    1, 1, 0.3f, 0, 0, 0.5f, 0.5f,     0, 1, 0.2f, 0, 0.5f, 0.5f, 1,
    1, -1, -1, -1, -1, -1, -1,        -1, 1, 0.1f, 0, 0, 1, 1};
static const float EV_GT[3 * 8] = {0, 1, 0, 0, 0, 0.5f, 0.5f, 0, 0, 1, 0, 0.5f, 0.5f, 1, 1, 1,
                                   0, 2, 0, 0, 0.5f, 0.5f, 1, 0};

static kiln_evaluate_spec ev_spec(void) {
  kiln_evaluate_spec s;
  memset(&s, 0, sizeof s);
  s.num_classes = 3;
  s.background_label = 0;
  s.overlap_threshold = 0.5f;
  return s;
}

static void test_detection_evaluate(void **state) {
  (void)state;
  kiln_evaluate_spec s = ev_spec();
  kiln_det_buf out = {0};
  assert_int_equal(kiln_detection_evaluate(&s, 2, EV_DET, 10, EV_GT, 3, &out), KILN_OK);
  /* positives (difficult g1 not counted), then by image, label and descending score */
  float want[10 * 5] = {-1, 1, 1, -1, -1,    -1, 2, 1, -1, -1,
                        0, 1, 0.9f, 1, 0,    0, 1, 0.8f, 0, 1,   0, 1, 0.7f, 0, 0,
                        0, 1, 0.6f, 0, 1,    0, 1, 0.2f, 0, 1,
                        0, 2, 0.5f, 1, 0,    0, 2, 0.4f, 0, 1,
                        1, 1, 0.3f, 0, 1};
  rows_are("evaluate", &out, 5, want, 10, 0);
  /* difficult boxes evaluated: two positives of label 1, and r2 is a true positive */
  s.evaluate_difficult_gt = true;
  out.rows = 0;
  assert_int_equal(kiln_detection_evaluate(&s, 2, EV_DET, 10, EV_GT, 3, &out), KILN_OK);
  want[2] = 2;
  want[4 * 5 + 3] = 1;
  want[4 * 5 + 4] = 0;
  rows_are("evaluate difficult", &out, 5, want, 10, 0);
  /* just above r4's .5 it is a false positive; r1's .75 still counts */
  s.overlap_threshold = nextafterf(0.5f, 1);
  out.rows = 0;
  assert_int_equal(kiln_detection_evaluate(&s, 2, EV_DET, 10, EV_GT, 3, &out), KILN_OK);
  want[7 * 5 + 3] = 0;
  want[7 * 5 + 4] = 1;
  rows_are("evaluate above .5", &out, 5, want, 10, 0);
  /* bad rows, named */
  s = ev_spec();
  float det[7] = {2, 1, 0.5f, 0, 0, 1, 1};
  error_names(kiln_detection_evaluate(&s, 2, det, 1, EV_GT, 3, &out), KILN_ERR_DATA,
              "detection row 0");
  det[0] = 0;
  det[1] = 0;
  error_names(kiln_detection_evaluate(&s, 2, det, 1, EV_GT, 3, &out), KILN_ERR_DATA,
              "background");
  float gt[8] = {0, 0, 0, 0, 0, 1, 1, 0};
  det[1] = 1;
  error_names(kiln_detection_evaluate(&s, 2, det, 1, gt, 1, &out), KILN_ERR_DATA,
              "ground truth row 0");
  kiln_det_buf_free(&out);
}

/* One detection (0, 0, .5, .5) against one box (0, 0, .5, .375): .75 normalized. In pixels,
 * counted inclusively: in 100 (h) x 200 (w), (0, 0, 100, 50) of 101 x 51 = 5151 and
 * (0, 0, 100, 37.5) of 101 x 38.5 = 3888.5 inside it: 3888.5 / 5151 = .7549; in 10 x 10,
 * (0, 0, 5, 5) of 36 and (0, 0, 5, 3.75) of 28.5: .7917. */
static void test_evaluate_pixel_sizes(void **state) {
  (void)state;
  const float det[7] = {0, 1, 0.9f, 0, 0, 0.5f, 0.5f}, gt[8] = {0, 1, 0, 0, 0, 0.5f, 0.375f, 0};
  const int h[2] = {10, 100}, w[2] = {10, 200};
  kiln_evaluate_spec s = ev_spec();
  kiln_det_buf out = {0};
  const struct {
    bool sizes;
    int64_t offset;
    float thr;
    float tp;
  } cases[] = {
      {false, 0, 0.752f, 0}, /* .75 */
      {true, 1, 0.752f, 1},  /* 100 x 200: .7549 */
      {true, 1, 0.76f, 0},   /* .7549 */
      {true, 2, 0.76f, 1},   /* (2 + 0) mod 2: 10 x 10, .7917 */
      {true, 3, 0.752f, 1},  /* (3 + 0) mod 2: 100 x 200 again */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    s.img_h = cases[c].sizes ? h : NULL;
    s.img_w = cases[c].sizes ? w : NULL;
    s.n_sizes = 2;
    s.offset = cases[c].offset;
    s.overlap_threshold = cases[c].thr;
    out.rows = 0;
    assert_int_equal(kiln_detection_evaluate(&s, 1, det, 1, gt, 1, &out), KILN_OK);
    assert_int_equal(out.rows, 3);
    if (out.v[2 * 5 + 3] != cases[c].tp) fail_msg("case %zu: tp %g", c, out.v[2 * 5 + 3]);
  }
  /* a detection past the image is clipped before scaling: (-.5, 0, .5, .5) is (0, 0, .5, .5) */
  const float past[7] = {0, 1, 0.9f, -0.5f, 0, 0.5f, 0.5f};
  s.img_h = h;
  s.img_w = w;
  s.offset = 1;
  s.overlap_threshold = 0.752f;
  out.rows = 0;
  assert_int_equal(kiln_detection_evaluate(&s, 1, past, 1, gt, 1, &out), KILN_OK);
  near("clipped tp", out.v[2 * 5 + 3], 1, 0);
  kiln_det_buf_free(&out);
}

/* ---- average precision ---------------------------------------------------------------------- */

/* Five detections (given out of order), four positives; by score: fp .9, tp .8, fp .7, tp .6,
 * tp .5. Cumulative precision and recall: (0, 0), (.5, .25), (.333, .25), (.5, .5), (.6, .75).
 *   11point: every t from 0 to .7 finds .6 at recall .75 (the best from there), t .8 to 1 none:
 *            8 x .6 / 11 = .436364
 *   MaxIntegral: from the end, precision .6 held over the recall steps .75 -> .5 -> .25 -> 0:
 *            .6 x .25 x 3 = .45
 *   Integral: .5 x .25 (at .25) + .5 x .25 (at .5) + .6 x .25 (at .75) = .4 */
static void test_average_precision(void **state) {
  (void)state;
  const float score[5] = {0.6f, 0.9f, 0.5f, 0.7f, 0.8f};
  const uint8_t tp[5] = {1, 0, 1, 0, 1}, fp[5] = {0, 1, 0, 1, 0};
  int order[16];
  near("11point", kiln_average_precision(score, tp, fp, 5, 4, KILN_AP_11POINT, order), 4.8 / 11,
       1e-6);
  near("MaxIntegral", kiln_average_precision(score, tp, fp, 5, 4, KILN_AP_MAX_INTEGRAL, order),
       0.45, 1e-6);
  near("Integral", kiln_average_precision(score, tp, fp, 5, 4, KILN_AP_INTEGRAL, order), 0.4,
       1e-6);
  /* no positives, no detections: 0 */
  near("npos 0", kiln_average_precision(score, tp, fp, 5, 0, KILN_AP_INTEGRAL, order), 0, 0);
  near("none", kiln_average_precision(score, tp, fp, 0, 4, KILN_AP_11POINT, order), 0, 0);
  /* all three true of three: 1 in every version (11point sums eleven 1/11 in float, as the
   * fork does, which lands an ulp or so off 1) */
  const uint8_t all[3] = {1, 1, 1}, nof[3] = {0, 0, 0};
  for (int v = 0; v < 3; v++)
    near("all tp", kiln_average_precision(score, all, nof, 3, 3, (kiln_ap_version)v, order), 1,
         1e-6);
  /* a tie in score keeps the input order: fp then tp gives precision .5 at recall 1 (Integral
   * .5); tp then fp gives 1 */
  const float same[2] = {0.5f, 0.5f};
  const uint8_t t01[2] = {0, 1}, f10[2] = {1, 0};
  near("tie, fp first", kiln_average_precision(same, t01, f10, 2, 1, KILN_AP_INTEGRAL, order),
       0.5, 1e-7);
  near("tie, tp first", kiln_average_precision(same, f10, t01, 2, 1, KILN_AP_INTEGRAL, order), 1,
       1e-7);
  /* a detection with neither flag is left out */
  const uint8_t t3[3] = {0, 0, 1}, f3[3] = {0, 1, 0};
  const float s3[3] = {0.9f, 0.8f, 0.7f};
  near("neither", kiln_average_precision(s3, t3, f3, 3, 1, KILN_AP_INTEGRAL, order), 0.5, 1e-7);
  /* the fork's float recall: 7 true positives of 10 reach recall 7/10, a float just below the
   * double .7, so t = .7 finds nothing: 7/11, where the double arithmetic of VOC's devkit would
   * give 8/11 */
  float s10[7];
  uint8_t t10[7], f0[7] = {0};
  for (int k = 0; k < 7; k++) {
    s10[k] = 1 - k * 0.1f;
    t10[k] = 1;
  }
  near("recall 0.7", kiln_average_precision(s10, t10, f0, 7, 10, KILN_AP_11POINT, order),
       7. / 11, 1e-6);
}

static void test_ap_version_names(void **state) {
  (void)state;
  kiln_ap_version v;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(kiln_ap_version_parse(kiln_ap_version_name((kiln_ap_version)i), &v), KILN_OK);
    assert_int_equal(v, i);
  }
  assert_string_equal(kiln_ap_version_name(KILN_AP_MAX_INTEGRAL), "MaxIntegral");
  error_names(kiln_ap_version_parse("VOC2007", &v), KILN_ERR_INVALID, "11point, MaxIntegral or "
              "Integral");
}

/* ---- mAP ------------------------------------------------------------------------------------ */

/* Two batches. Class 1: 2 + 1 positives; detections .9 tp, .85 tp, .8 fp: precision 1, 1, .667
 * at recall .333, .667, .667: Integral .667, 11point 7/11 (t up to .6), MaxIntegral .667.
 * Class 2: 1 positive, one false positive (the (0, 0) row is left out): 0. Class 3: 0 positives,
 * no detections: 0, but counted. Class 4: a detection, no positives row: not counted. */
static const float MAP_B1[5 * 5] = {-1, 1, 2, -1, -1, -1, 2, 1, -1, -1, 0, 1, 0.9f, 1, 0,
                                    0, 1, 0.8f, 0, 1, 0, 2, 0.7f, 0, 0};
static const float MAP_B2[6 * 5] = {-1, 1, 1, -1, -1, -1, 2, 0, -1, -1, -1, 3, 0, -1, -1,
                                    1, 1, 0.85f, 1, 0, 1, 2, 0.6f, 0, 1, 0, 4, 0.9f, 1, 0};

static void test_map(void **state) {
  (void)state;
  kiln_map *m = kiln_map_new();
  assert_non_null(m);
  assert_int_equal(kiln_map_add(m, MAP_B1, 5), KILN_OK);
  assert_int_equal(kiln_map_add(m, MAP_B2, 6), KILN_OK);
  double map;
  int n = -1;
  assert_int_equal(kiln_map_result(m, KILN_AP_INTEGRAL, &map, &n), KILN_OK);
  assert_int_equal(n, 3);
  near("mAP Integral", map, (2. / 3) / 3, 1e-6);
  assert_int_equal(kiln_map_result(m, KILN_AP_11POINT, &map, NULL), KILN_OK);
  near("mAP 11point", map, (7. / 11) / 3, 1e-6);
  int label[8];
  double ap[8];
  int64_t pos[8];
  assert_int_equal(kiln_map_per_class(m, KILN_AP_MAX_INTEGRAL, 8, label, ap, pos, &n), KILN_OK);
  assert_int_equal(n, 3);
  const int want_label[3] = {1, 2, 3};
  const int64_t want_pos[3] = {3, 1, 0};
  const double want_ap[3] = {2. / 3, 0, 0};
  for (int k = 0; k < 3; k++) {
    assert_int_equal(label[k], want_label[k]);
    assert_int_equal(pos[k], want_pos[k]);
    near("per class AP", ap[k], want_ap[k], 1e-6);
  }
  assert_int_equal(kiln_map_per_class(m, KILN_AP_MAX_INTEGRAL, 2, label, ap, pos, &n), KILN_OK);
  assert_int_equal(n, 2);
  /* a bad row is named and adds nothing, not even the good rows before it */
  const float bad[3 * 5] = {-1, 1, 5, -1, -1, 0, 1, 0.5f, 1, 0, 0, 1, 0.4f, 1, 1};
  error_names(kiln_map_add(m, bad, 3), KILN_ERR_DATA, "row 2");
  const float badlabel[5] = {0, -1, 0.5f, 0, 1}, badcount[5] = {-1, 1, -2, -1, -1};
  error_names(kiln_map_add(m, badlabel, 1), KILN_ERR_DATA, "row 0");
  error_names(kiln_map_add(m, badcount, 1), KILN_ERR_DATA, "positives");
  assert_int_equal(kiln_map_result(m, KILN_AP_INTEGRAL, &map, &n), KILN_OK);
  near("unchanged", map, (2. / 3) / 3, 1e-6);
  error_names(kiln_map_result(m, (kiln_ap_version)7, &map, &n), KILN_ERR_INVALID, "ap_version");
  kiln_map_reset(m);
  assert_int_equal(kiln_map_result(m, KILN_AP_INTEGRAL, &map, &n), KILN_OK);
  assert_int_equal(n, 0);
  near("empty", map, 0, 0);
  kiln_map_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nms),
      cmocka_unit_test(test_detection_output),
      cmocka_unit_test(test_detection_evaluate),
      cmocka_unit_test(test_evaluate_pixel_sizes),
      cmocka_unit_test(test_average_precision),
      cmocka_unit_test(test_ap_version_names),
      cmocka_unit_test(test_map),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
