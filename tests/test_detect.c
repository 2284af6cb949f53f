/* Object detection's host arithmetic, part one (include/kiln/detect.h; src/ops/bbox.c and
 * multibox.c): box sizes and overlaps, the three codings and their inverses, PriorBox's boxes
 * (SSD300's 8732 and conv4_3's first cell by hand), the ground truth grouped by image, the
 * matching of priors to boxes, the mining of negatives, MultiBoxLoss's value on hand cases (its
 * gradient against finite differences is test_detect_grad.c's). Boxes in the hand cases sit
 * on multiples of 1/8, where every size and overlap is exact in float, so the edges (an overlap
 * of exactly 0.5) are tested as such. Suppression, DetectionOutput,
 * DetectionEvaluate and average precision are in test_detect_eval.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/detect.h"
#include "ops/detect_internal.h"

static void near(const char *what, double got, double want, double tol) {
  if (!(fabs(got - want) <= tol)) fail_msg("%s: got %.9g, want %.9g (tolerance %g)", what, got, want, tol);
}

static void box_near(const char *what, const kiln_bbox *b, double x0, double y0, double x1,
                     double y1, double tol) {
  char w[160];
  snprintf(w, sizeof w, "%s xmin", what);
  near(w, b->xmin, x0, tol);
  snprintf(w, sizeof w, "%s ymin", what);
  near(w, b->ymin, y0, tol);
  snprintf(w, sizeof w, "%s xmax", what);
  near(w, b->xmax, x1, tol);
  snprintf(w, sizeof w, "%s ymax", what);
  near(w, b->ymax, y1, tol);
}

static void error_names(int rc, int want, const char *part) {
  assert_int_equal(rc, want);
  if (!strstr(kiln_last_error(), part))
    fail_msg("error message '%s' does not name '%s'", kiln_last_error(), part);
}

/* A prior blob (P boxes, then P copies of var) from boxes. */
static float *prior_blob(const kiln_bbox *b, int P, const float var[4]) {
  float *v = malloc(sizeof(float) * 8 * (size_t)P);
  assert_non_null(v);
  for (int p = 0; p < P; p++) {
    const float c[4] = {b[p].xmin, b[p].ymin, b[p].xmax, b[p].ymax};
    memcpy(v + 4 * p, c, sizeof c);
    memcpy(v + 4 * (P + p), var, sizeof(float) * 4);
  }
  return v;
}

/* One ground truth row. */
static void gt_row(float *r, float item, float label, kiln_bbox b, float difficult) {
  const float v[8] = {item, label, 0, b.xmin, b.ymin, b.xmax, b.ymax, difficult};
  memcpy(r, v, sizeof v);
}

static const float ONES[4] = {1, 1, 1, 1};

/* ---- boxes ---------------------------------------------------------------------------------- */

static void test_bbox_size(void **state) {
  (void)state;
  const kiln_bbox a = {0.125f, 0.25f, 0.5f, 0.75f}; /* 0.375 x 0.5 */
  near("normalized", kiln_bbox_size(&a, true), 0.1875, 0);
  const kiln_bbox px = {10, 20, 29, 59}; /* 19 x 39 pixels, counted inclusively: 20 x 40 */
  near("pixels", kiln_bbox_size(&px, false), 800, 0);
  const kiln_bbox inv = {0.5f, 0.25f, 0.25f, 0.75f};
  near("inverted", kiln_bbox_size(&inv, true), 0, 0);
  near("inverted, pixels", kiln_bbox_size(&inv, false), 0, 0);
  const kiln_bbox line = {0.5f, 0.125f, 0.5f, 0.875f}; /* no width: 0, or 1 x 1.75 in pixels */
  near("line", kiln_bbox_size(&line, true), 0, 0);
  near("line, pixels", kiln_bbox_size(&line, false), 1.75, 0);
}

static void test_bbox_iou(void **state) {
  (void)state;
  kiln_bbox in;
  /* disjoint: no intersection, out all zero */
  const kiln_bbox a = {0.125f, 0.125f, 0.25f, 0.25f}, b = {0.5f, 0.5f, 0.75f, 0.75f};
  assert_false(kiln_bbox_intersect(&a, &b, &in));
  box_near("disjoint intersection", &in, 0, 0, 0, 0, 0);
  near("disjoint", kiln_bbox_iou(&a, &b), 0, 0);
  /* touching at x = 0.25: they meet in a box of no width, which is no overlap */
  const kiln_bbox t = {0.25f, 0.125f, 0.5f, 0.25f};
  assert_true(kiln_bbox_intersect(&a, &t, &in));
  box_near("touching intersection", &in, 0.25, 0.125, 0.25, 0.25, 0);
  near("touching", kiln_bbox_iou(&a, &t), 0, 0);
  /* nested: inner 0.25 x 0.25 = 0.0625 in outer 0.5 x 0.5 = 0.25: 0.0625 / 0.25 */
  const kiln_bbox outer = {0, 0, 0.5f, 0.5f}, inner = {0.125f, 0.125f, 0.375f, 0.375f};
  near("nested", kiln_bbox_iou(&outer, &inner), 0.25, 0);
  near("nested, swapped", kiln_bbox_iou(&inner, &outer), 0.25, 0);
  /* partial: (0, 0, .5, .5) and (.25, .125, .75, .625): intersection .25 x .375 = .09375,
   * union .25 + .25 - .09375 = .40625: 0.230769... */
  const kiln_bbox p = {0.25f, 0.125f, 0.75f, 0.625f};
  assert_true(kiln_bbox_intersect(&outer, &p, &in));
  box_near("partial intersection", &in, 0.25, 0.125, 0.5, 0.5, 0);
  near("partial", kiln_bbox_iou(&outer, &p), 0.09375 / 0.40625, 1e-7);
  near("identical", kiln_bbox_iou(&p, &p), 1, 0);
  /* clipping: each coordinate into [0, 1] */
  kiln_bbox c = {-0.25f, 0.5f, 1.25f, 0.75f};
  kiln_bbox_clip(&c);
  box_near("clipped", &c, 0, 0.5, 1, 0.75, 0);
}

/* ---- coding --------------------------------------------------------------------------------- */

static void test_encode_hand_values(void **state) {
  (void)state;
  /* prior (.1, .2, .5, .4): w .4, h .2, centre (.3, .3); box (.2, .25, .8, .45): w .6, h .2,
   * centre (.5, .35); variances (.1, .1, .2, .2) */
  const kiln_bbox pr = {0.1f, 0.2f, 0.5f, 0.4f}, g = {0.2f, 0.25f, 0.8f, 0.45f};
  const float var[4] = {0.1f, 0.1f, 0.2f, 0.2f};
  kiln_bbox e, d;
  /* CENTER_SIZE: (.2 / .4 / .1, .05 / .2 / .1, log(.6 / .4) / .2, log(.2 / .2) / .2) */
  kiln_bbox_encode(&e, &pr, var, &g, KILN_BOX_CENTER_SIZE, false);
  box_near("center-size", &e, 5, 2.5, log(1.5) / 0.2, 0, 2e-5);
  kiln_bbox_encode(&e, &pr, var, &g, KILN_BOX_CENTER_SIZE, true);
  box_near("center-size, variance in target", &e, 0.5, 0.25, log(1.5), 0, 2e-6);
  kiln_bbox_decode(&d, &pr, var, &e, KILN_BOX_CENTER_SIZE, true);
  box_near("center-size decoded", &d, 0.2, 0.25, 0.8, 0.45, 1e-6);
  /* CORNER: (.1 / .1, .05 / .1, .3 / .2, .05 / .2) */
  kiln_bbox_encode(&e, &pr, var, &g, KILN_BOX_CORNER, false);
  box_near("corner", &e, 1, 0.5, 1.5, 0.25, 2e-6);
  kiln_bbox_encode(&e, &pr, var, &g, KILN_BOX_CORNER, true);
  box_near("corner, variance in target", &e, 0.1, 0.05, 0.3, 0.05, 1e-6);
  /* CORNER_SIZE: the corner offsets over w .4 and h .2: (.1/.4/.1, .05/.2/.1, .3/.4/.2,
   * .05/.2/.2) */
  kiln_bbox_encode(&e, &pr, var, &g, KILN_BOX_CORNER_SIZE, false);
  box_near("corner-size", &e, 2.5, 2.5, 3.75, 1.25, 2e-5);
  kiln_bbox_encode(&e, &pr, var, &g, KILN_BOX_CORNER_SIZE, true);
  box_near("corner-size, variance in target", &e, 0.25, 0.25, 0.75, 0.25, 2e-6);
  /* a decoded prediction is not clipped: CORNER (.1, .2, .5, .4) + (-2, 0, 3, 0) x var */
  const kiln_bbox off = {-2, 0, 3, 0};
  kiln_bbox_decode(&d, &pr, var, &off, KILN_BOX_CORNER, false);
  box_near("unclipped", &d, -0.1, 0.2, 1.1, 0.4, 1e-6);
}

static void test_encode_decode_round_trip(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 7, 1);
  const kiln_box_code codes[3] = {KILN_BOX_CORNER, KILN_BOX_CENTER_SIZE, KILN_BOX_CORNER_SIZE};
  for (int n = 0; n < 200; n++) {
    const float x = kiln_rng_uniform(&r, 0, 0.6f), y = kiln_rng_uniform(&r, 0, 0.6f);
    const kiln_bbox pr = {x, y, x + kiln_rng_uniform(&r, 0.05f, 0.4f),
                          y + kiln_rng_uniform(&r, 0.05f, 0.4f)};
    const float gx = kiln_rng_uniform(&r, 0, 0.6f), gy = kiln_rng_uniform(&r, 0, 0.6f);
    const kiln_bbox g = {gx, gy, gx + kiln_rng_uniform(&r, 0.05f, 0.4f),
                         gy + kiln_rng_uniform(&r, 0.05f, 0.4f)};
    const float var[4] = {kiln_rng_uniform(&r, 0.05f, 1), kiln_rng_uniform(&r, 0.05f, 1),
                          kiln_rng_uniform(&r, 0.05f, 1), kiln_rng_uniform(&r, 0.05f, 1)};
    for (int c = 0; c < 3; c++)
      for (int in = 0; in < 2; in++) {
        kiln_bbox e, d, e2;
        kiln_bbox_encode(&e, &pr, var, &g, codes[c], in);
        kiln_bbox_decode(&d, &pr, var, &e, codes[c], in);
        char what[64];
        snprintf(what, sizeof what, "code %d, in target %d, case %d", (int)codes[c], in, n);
        box_near(what, &d, g.xmin, g.ymin, g.xmax, g.ymax, 2e-6);
        /* and the other way: an encoding decoded and encoded again */
        kiln_bbox_encode(&e2, &pr, var, &d, codes[c], in);
        box_near(what, &e2, e.xmin, e.ymin, e.xmax, e.ymax, 1e-4 * (1 + fabs(e.xmin) + fabs(e.xmax)));
      }
  }
}

/* ---- PriorBox ------------------------------------------------------------------------------- */

/* One of SSD300's six PriorBox layers: min and max size, ratios {2} or {2, 3} flipped (expanded:
 * 1, 2, 1/2[, 3, 1/3]), variances (.1, .1, .2, .2), no clipping. */
static kiln_prior_spec ssd300_layer(int cells, float step, float mn, float mx, bool three) {
  kiln_prior_spec s;
  memset(&s, 0, sizeof s);
  s.layer_h = s.layer_w = cells;
  s.img_h = s.img_w = 300;
  s.step_h = s.step_w = step;
  s.offset = 0.5f;
  s.n_min = s.n_max = 1;
  s.min_size[0] = mn;
  s.max_size[0] = mx;
  const float r[5] = {1, 2, 0.5f, 3, (float)(1. / 3)};
  s.n_ratio = three ? 5 : 3;
  memcpy(s.ratio, r, sizeof(float) * (size_t)s.n_ratio);
  s.n_variance = 4;
  const float v[4] = {0.1f, 0.1f, 0.2f, 0.2f};
  memcpy(s.variance, v, sizeof v);
  return s;
}

static void test_prior_ssd300(void **state) {
  (void)state;
  const kiln_prior_spec layers[6] = {
      ssd300_layer(38, 8, 30, 60, false),    ssd300_layer(19, 16, 60, 111, true),
      ssd300_layer(10, 32, 111, 162, true),  ssd300_layer(5, 64, 162, 213, true),
      ssd300_layer(3, 100, 213, 264, false), ssd300_layer(1, 300, 264, 315, false)};
  const int per_cell[6] = {4, 6, 6, 6, 4, 4};
  int total = 0;
  for (int l = 0; l < 6; l++) {
    assert_int_equal(kiln_prior_check(&layers[l]), KILN_OK);
    assert_int_equal(kiln_prior_per_cell(&layers[l]), per_cell[l]);
    total += layers[l].layer_h * layers[l].layer_w * per_cell[l];
  }
  /* 38^2 4 + 19^2 6 + 10^2 6 + 5^2 6 + 3^2 4 + 1^2 4 = 5776 + 2166 + 600 + 150 + 36 + 4 */
  assert_int_equal(total, 8732);

  /* conv4_3's first cell, centre (0.5 x 8, 0.5 x 8) = (4, 4) pixels: the square of 30:
   * (4 -+ 15) / 300; the square of sqrt(30 x 60) = 42.4264: (4 -+ 21.2132) / 300; ratio 2:
   * 42.4264 x 21.2132; ratio 1/2: 21.2132 x 42.4264. */
  const kiln_prior_spec *c43 = &layers[0];
  const int P = 38 * 38 * 4;
  float *out = malloc(sizeof(float) * 8 * P);
  assert_non_null(out);
  kiln_prior_boxes(out, c43);
  const double s1 = sqrt(1800.) / 2, w2 = 30 * sqrt(2.) / 2, h2 = 30 / sqrt(2.) / 2;
  const double want[4][4] = {{-11 / 300., -11 / 300., 19 / 300., 19 / 300.},
                             {(4 - s1) / 300, (4 - s1) / 300, (4 + s1) / 300, (4 + s1) / 300},
                             {(4 - w2) / 300, (4 - h2) / 300, (4 + w2) / 300, (4 + h2) / 300},
                             {(4 - h2) / 300, (4 - w2) / 300, (4 + h2) / 300, (4 + w2) / 300}};
  for (int b = 0; b < 4; b++) {
    const kiln_bbox got = {out[4 * b], out[4 * b + 1], out[4 * b + 2], out[4 * b + 3]};
    box_near("conv4_3 first cell", &got, want[b][0], want[b][1], want[b][2], want[b][3], 1e-7);
  }
  /* the last cell, centre (37.5 x 8) = 300 on both axes: the square of 30 reaches past the
   * image, unclipped: (285, 285, 315, 315) / 300 */
  const float *last = out + 4 * (P - 4);
  near("last cell xmin", last[0], 0.95, 1e-7);
  near("last cell xmax", last[2], 1.05, 1e-7);
  /* the second cell along x (w = 1) is centred at 12: its square starts at -3 / 300 */
  near("second cell xmin", out[16], -3 / 300., 1e-7);
  near("second cell ymin", out[17], -11 / 300., 1e-7);
  for (int p = 0; p < P; p++) {
    near("variance x", out[4 * P + 4 * p], 0.1f, 0);
    near("variance h", out[4 * P + 4 * p + 3], 0.2f, 0);
  }
  /* clipped, the first square is (0, 0, 19 / 300, 19 / 300) */
  kiln_prior_spec clipped = *c43;
  clipped.clip = true;
  kiln_prior_boxes(out, &clipped);
  const kiln_bbox first = {out[0], out[1], out[2], out[3]};
  box_near("clipped first cell", &first, 0, 0, 19 / 300., 19 / 300., 1e-7);
  near("clipped last cell", out[4 * (P - 4) + 2], 1, 0);
  /* one variance is all four; none is the fork's 0.1 */
  kiln_prior_spec one = *c43;
  one.n_variance = 1;
  one.variance[0] = 0.3f;
  kiln_prior_boxes(out, &one);
  for (int k = 0; k < 4 * P; k++) near("one variance", out[4 * P + k], 0.3f, 0);
  one.n_variance = 0;
  kiln_prior_boxes(out, &one);
  for (int k = 0; k < 4 * P; k++) near("default variance", out[4 * P + k], 0.1f, 0);
  free(out);
}

static void test_prior_sizes_truncated(void **state) {
  (void)state;
  /* SSD512's first layer has min_size 35.84 and max_size 76.8; the fork's layer reads them into
   * ints: one cell centred at 50 of a 100-pixel image draws squares of 35 and sqrt(35 x 76) =
   * sqrt(2660) = 51.575, not of 35.84 and 52.47 */
  kiln_prior_spec s;
  memset(&s, 0, sizeof s);
  s.layer_h = s.layer_w = 1;
  s.img_h = s.img_w = 100;
  s.step_h = s.step_w = 100;
  s.offset = 0.5f;
  s.n_min = s.n_max = 1;
  s.min_size[0] = 35.84f;
  s.max_size[0] = 76.8f;
  s.n_ratio = 1;
  s.ratio[0] = 1;
  assert_int_equal(kiln_prior_check(&s), KILN_OK);
  float out[16];
  kiln_prior_boxes(out, &s);
  near("square of 35", out[0], (50 - 17.5) / 100, 1e-7);
  near("square of 35", out[2], (50 + 17.5) / 100, 1e-7);
  near("square of sqrt(35 x 76)", out[4], (50 - sqrt(2660.) / 2) / 100, 1e-7);
}

static void test_prior_check_errors(void **state) {
  (void)state;
  const kiln_prior_spec good = ssd300_layer(38, 8, 30, 60, false);
  kiln_prior_spec s = good;
  s.min_size[0] = 0.5f; /* 0 pixels once truncated */
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "min_size[0]");
  s = good;
  s.max_size[0] = 30;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "max_size[0]");
  s = good;
  s.n_max = 2;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "max_size");
  s = good;
  s.ratio[0] = 2;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "ratio[0]");
  s = good;
  s.ratio[2] = 1.0000001f;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "ratio[2]");
  s = good;
  s.ratio[1] = -2;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "ratio[1]");
  s = good;
  s.n_variance = 2;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "variance");
  s = good;
  s.variance[3] = 0;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "variance[3]");
  s = good;
  s.step_w = 0;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "step_w");
  s = good;
  s.layer_w = 0;
  error_names(kiln_prior_check(&s), KILN_ERR_INVALID, "feature map");
}

/* ---- ground truth --------------------------------------------------------------------------- */

static void test_gt_group(void **state) {
  (void)state;
  const kiln_bbox b = {0.125f, 0.125f, 0.5f, 0.5f};
  float rows[5 * 8];
  gt_row(rows + 0, 1, 2, b, 0);
  gt_row(rows + 8, 0, 1, b, 1); /* difficult */
  gt_row(rows + 16, -1, -1, b, -1);
  gt_row(rows + 24, 1, 3, b, 0);
  gt_row(rows + 32, 0, 4, b, 0);
  kiln_gt_box *g = NULL;
  int64_t cap = 0, first[4];
  /* by item, in row order within each: item 0 rows 1 and 4, item 1 rows 0 and 3, item 2 none */
  assert_int_equal(kiln_gt_group(rows, 5, 3, true, &g, &cap, first), KILN_OK);
  assert_int_equal(first[0], 0);
  assert_int_equal(first[1], 2);
  assert_int_equal(first[2], 4);
  assert_int_equal(first[3], 4);
  const int labels[4] = {1, 4, 2, 3}, items[4] = {0, 0, 1, 1};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(g[k].label, labels[k]);
    assert_int_equal(g[k].item, items[k]);
  }
  assert_true(g[0].difficult);
  assert_false(g[1].difficult);
  box_near("grouped box", &g[3].box, 0.125, 0.125, 0.5, 0.5, 0);
  /* without difficult boxes item 0 keeps row 4 alone */
  assert_int_equal(kiln_gt_group(rows, 5, 3, false, &g, &cap, first), KILN_OK);
  assert_int_equal(first[1], 1);
  assert_int_equal(first[2], 3);
  assert_int_equal(g[0].label, 4);
  /* bad rows, each named */
  float bad[8 * 3];
  memcpy(bad, rows, sizeof(float) * 16);
  gt_row(bad + 16, 3, 1, b, 0);
  error_names(kiln_gt_group(bad, 3, 3, true, &g, &cap, first), KILN_ERR_DATA, "row 2");
  gt_row(bad + 16, 0.5f, 1, b, 0);
  error_names(kiln_gt_group(bad, 3, 3, true, &g, &cap, first), KILN_ERR_DATA, "row 2");
  gt_row(bad + 16, 0, -2, b, 0);
  error_names(kiln_gt_group(bad, 3, 3, true, &g, &cap, first), KILN_ERR_DATA, "label");
  const kiln_bbox nanbox = {0, NAN, 1, 1};
  gt_row(bad + 16, 0, 1, nanbox, 0);
  error_names(kiln_gt_group(bad, 3, 3, true, &g, &cap, first), KILN_ERR_DATA, "row 2");
  free(g);
}

/* ---- matching ------------------------------------------------------------------------------- */

static kiln_multibox_spec base_spec(int C) {
  kiln_multibox_spec s;
  memset(&s, 0, sizeof s);
  s.num_classes = C;
  s.background_label = 0;
  s.share_location = true;
  s.match_type = KILN_MATCH_PER_PREDICTION;
  s.overlap_threshold = 0.5f;
  s.use_prior_for_matching = true;
  s.use_difficult_gt = true;
  s.mining = KILN_MINE_MAX_NEGATIVE;
  s.neg_pos_ratio = 3;
  s.neg_overlap = 0.5f;
  s.sample_size = 64;
  s.code = KILN_BOX_CORNER;
  s.loc_loss = KILN_LOC_SMOOTH_L1;
  s.conf_loss = KILN_CONF_SOFTMAX;
  s.loc_weight = 1;
  s.normalization = KILN_LOSS_VALID;
  return s;
}

/* Five priors and two boxes, A = (0, 0, .5, .5) and B = (.5, .5, 1, 1), every box .25 in area:
 *   p0 (0, 0, .5, .25):      A: .125 / .25 = .5 exactly          B: 0
 *   p1 (0, 0, .5, .5):       A: 1                                B: 0 (they touch)
 *   p2 (.5, .5, 1, .875):    A: 0 (corner)                       B: .1875 / .25 = .75
 *   p3 (.125, .125, .625, .625): A: .140625 / .359375 = .3913    B: .015625 / .484375 = .0323
 *   p4 (.25, .25, .75, .75): A: .0625 / .4375 = .142857           B: the same, a tie
 * Bipartite takes p1-A (1), then of B's p2 (.75); per prediction at .5 adds p0 to A (at
 * exactly the threshold); at .1 also p3 to A and p4 to A (the tie goes to the lower box). */
static const kiln_bbox FIVE[5] = {{0, 0, 0.5f, 0.25f},
                                  {0, 0, 0.5f, 0.5f},
                                  {0.5f, 0.5f, 1, 0.875f},
                                  {0.125f, 0.125f, 0.625f, 0.625f},
                                  {0.25f, 0.25f, 0.75f, 0.75f}};

static void select_five(kiln_multibox_spec *s, const float *loc, const float *prior,
                        kiln_multibox_selection *sel, const int want[5]) {
  float rows[16], conf[10] = {0};
  gt_row(rows, 0, 1, (kiln_bbox){0, 0, 0.5f, 0.5f}, 0);
  gt_row(rows + 8, 0, 1, (kiln_bbox){0.5f, 0.5f, 1, 1}, 0);
  assert_int_equal(kiln_multibox_select(s, 1, 5, loc, conf, prior, rows, 2, sel), KILN_OK);
  for (int p = 0; p < 5; p++)
    if (sel->match[p] != want[p])
      fail_msg("threshold %g: prior %d matched %d, want %d", s->overlap_threshold, p,
               sel->match[p], want[p]);
}

static void test_match_five_priors(void **state) {
  (void)state;
  float *prior = prior_blob(FIVE, 5, ONES);
  float loc[20] = {0};
  kiln_multibox_selection sel = {0};
  kiln_multibox_spec s = base_spec(2);
  s.mining = KILN_MINE_NONE;
  s.match_type = KILN_MATCH_BIPARTITE;
  select_five(&s, loc, prior, &sel, (const int[5]){-1, 0, 1, -1, -1});
  assert_int_equal(sel.num_pos, 2);
  s.match_type = KILN_MATCH_PER_PREDICTION;
  select_five(&s, loc, prior, &sel, (const int[5]){0, 0, 1, -1, -1});
  assert_int_equal(sel.num_pos, 3);
  s.overlap_threshold = nextafterf(0.5f, 1); /* just above p0's .5 */
  select_five(&s, loc, prior, &sel, (const int[5]){-1, 0, 1, -1, -1});
  s.overlap_threshold = 0.1f;
  select_five(&s, loc, prior, &sel, (const int[5]){0, 0, 1, 0, 0});
  assert_int_equal(sel.num_pos, 5);
  /* Decoded predictions instead of the priors: priors of no size (CORNER needs none) and
   * predictions that decode to the five boxes match as the priors did. */
  const kiln_bbox zero[5] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  float *zp = prior_blob(zero, 5, ONES);
  for (int p = 0; p < 5; p++) {
    const float c[4] = {FIVE[p].xmin, FIVE[p].ymin, FIVE[p].xmax, FIVE[p].ymax};
    memcpy(loc + 4 * p, c, sizeof c);
  }
  s.use_prior_for_matching = false;
  s.overlap_threshold = 0.5f;
  select_five(&s, loc, zp, &sel, (const int[5]){0, 0, 1, -1, -1});
  free(zp);
  free(prior);
  kiln_multibox_selection_free(&sel);
}

static void test_match_ties(void **state) {
  (void)state;
  /* one box C = (.25, .25, .75, .75) overlapped equally (.0625 / .4375) by q0 = (0, 0, .5, .5)
   * and q1 = (.5, .5, 1, 1): bipartite gives it the lower prior */
  const kiln_bbox q[2] = {{0, 0, 0.5f, 0.5f}, {0.5f, 0.5f, 1, 1}};
  float *prior = prior_blob(q, 2, ONES);
  float rows[16], loc[8] = {0}, conf[4] = {0};
  gt_row(rows, 0, 1, (kiln_bbox){0.25f, 0.25f, 0.75f, 0.75f}, 0);
  kiln_multibox_spec s = base_spec(2);
  s.mining = KILN_MINE_NONE;
  s.match_type = KILN_MATCH_BIPARTITE;
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, 1, 2, loc, conf, prior, rows, 1, &sel), KILN_OK);
  assert_int_equal(sel.match[0], 0);
  assert_int_equal(sel.match[1], -1);
  free(prior);
  /* one prior p4 = (.25, .25, .75, .75) overlapping two boxes equally: it goes to the lower box,
   * and the other box, with no prior left, stays unmatched */
  const kiln_bbox one = {0.25f, 0.25f, 0.75f, 0.75f};
  prior = prior_blob(&one, 1, ONES);
  gt_row(rows, 0, 1, (kiln_bbox){0, 0, 0.5f, 0.5f}, 0);
  gt_row(rows + 8, 0, 1, (kiln_bbox){0.5f, 0.5f, 1, 1}, 0);
  assert_int_equal(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 2, &sel), KILN_OK);
  assert_int_equal(sel.match[0], 0);
  assert_int_equal(sel.num_pos, 1);
  free(prior);
  kiln_multibox_selection_free(&sel);
}

static void test_match_cross_boundary(void **state) {
  (void)state;
  /* box (0, 0, .5, .5); p0 is the box, p1 = (-.125, 0, .5, .5) overlaps it .25 / .3125 = .8
   * but crosses the image's edge, p2 = (.75, .75, 1, 1) is far */
  const kiln_bbox q[3] = {{0, 0, 0.5f, 0.5f}, {-0.125f, 0, 0.5f, 0.5f}, {0.75f, 0.75f, 1, 1}};
  float *prior = prior_blob(q, 3, ONES);
  float rows[8], loc[12] = {0}, conf[6] = {0};
  gt_row(rows, 0, 1, q[0], 0);
  kiln_multibox_spec s = base_spec(2);
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, 1, 3, loc, conf, prior, rows, 1, &sel), KILN_OK);
  assert_int_equal(sel.match[1], 0); /* per prediction at .8 */
  s.ignore_cross_boundary_bbox = true;
  assert_int_equal(kiln_multibox_select(&s, 1, 3, loc, conf, prior, rows, 1, &sel), KILN_OK);
  assert_int_equal(sel.match[0], 0);
  assert_int_equal(sel.match[1], -1);
  /* neither matched nor mined: of 3 x 1 negatives only p2 is eligible */
  assert_int_equal(sel.neg[1], 0);
  assert_int_equal(sel.neg[2], 1);
  assert_int_equal(sel.num_neg, 1);
  /* NONE trains every other prediction as background, the ignored one included (the fork) */
  s.mining = KILN_MINE_NONE;
  assert_int_equal(kiln_multibox_select(&s, 1, 3, loc, conf, prior, rows, 1, &sel), KILN_OK);
  assert_int_equal(sel.neg[1], 1);
  assert_int_equal(sel.num_neg, 2);
  free(prior);
  kiln_multibox_selection_free(&sel);
}

/* ---- mining --------------------------------------------------------------------------------- */

/* Eight priors of one image with box (0, 0, .5, .5) and a second image without any: p0 is the
 * box, p2 = (0, 0, .5, .375) overlaps it .75 (no bipartite match, but too close to be a
 * negative at neg_overlap .5), the rest lie far away. Scores (0, a, 0): the softmax background
 * loss log(2 + e^a) grows with a = 5, 1, 5, .5, 3, 3, -1, 2 for p0..p7: the candidates by loss
 * are p4, p5 (a tie: the lower first), p7, p1, p3, p6. */
static void mine_eight(kiln_multibox_spec *s, kiln_multibox_selection *sel) {
  kiln_bbox q[8];
  for (int p = 0; p < 8; p++) q[p] = (kiln_bbox){0.75f, 0.75f, 1, 1};
  q[0] = (kiln_bbox){0, 0, 0.5f, 0.5f};
  q[2] = (kiln_bbox){0, 0, 0.5f, 0.375f};
  float *prior = prior_blob(q, 8, ONES);
  const float a[8] = {5, 1, 5, 0.5f, 3, 3, -1, 2};
  float conf[2 * 8 * 3] = {0}, loc[2 * 8 * 4] = {0}, rows[8];
  for (int p = 0; p < 8; p++) conf[3 * p + 1] = conf[24 + 3 * p + 1] = a[p];
  gt_row(rows, 0, 1, q[0], 0);
  assert_int_equal(kiln_multibox_select(s, 2, 8, loc, conf, prior, rows, 1, sel), KILN_OK);
  free(prior);
}

static void negatives_are(const kiln_multibox_selection *sel, int item, const int *want, int n) {
  int got = 0;
  for (int p = 0; p < sel->priors; p++) got += sel->neg[item * sel->priors + p];
  for (int k = 0; k < n; k++)
    if (!sel->neg[item * sel->priors + want[k]]) fail_msg("prior %d is not a negative", want[k]);
  if (got != n) fail_msg("image %d: %d negatives, want %d", item, got, n);
}

static void test_mine_max_negative(void **state) {
  (void)state;
  kiln_multibox_spec s = base_spec(3);
  s.match_type = KILN_MATCH_BIPARTITE;
  kiln_multibox_selection sel = {0};
  mine_eight(&s, &sel); /* 1 positive x 3 */
  assert_int_equal(sel.num_pos, 1);
  negatives_are(&sel, 0, (const int[]){4, 5, 7}, 3);
  negatives_are(&sel, 1, NULL, 0); /* no ground truth: no negatives */
  assert_int_equal(sel.num_neg, 3);
  s.neg_pos_ratio = 2.9f; /* floor(2.9) */
  mine_eight(&s, &sel);
  negatives_are(&sel, 0, (const int[]){4, 5}, 2);
  s.neg_pos_ratio = 1; /* the tie between p4 and p5 goes to p4 */
  mine_eight(&s, &sel);
  negatives_are(&sel, 0, (const int[]){4}, 1);
  s.neg_pos_ratio = 100; /* at most every candidate; never p2, too close to the box */
  mine_eight(&s, &sel);
  negatives_are(&sel, 0, (const int[]){1, 3, 4, 5, 6, 7}, 6);
  /* per prediction p2 (.75) is a second positive: floor(2 x 1.4) = 2 of the six others */
  s.match_type = KILN_MATCH_PER_PREDICTION;
  s.neg_pos_ratio = 1.4f;
  mine_eight(&s, &sel);
  assert_int_equal(sel.num_pos, 2);
  negatives_are(&sel, 0, (const int[]){4, 5}, 2);
  /* NONE: every unmatched prior of every image, p2 and the boxless image included */
  s.mining = KILN_MINE_NONE;
  mine_eight(&s, &sel);
  negatives_are(&sel, 0, (const int[]){1, 3, 4, 5, 6, 7}, 6);
  negatives_are(&sel, 1, (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
  assert_int_equal(sel.num_neg, 14);
  kiln_multibox_selection_free(&sel);
}

static void test_mine_logistic_ranks_differently(void **state) {
  (void)state;
  /* p0 is the box; p1 scores (-3, -3, -3), p2 (0, 1, 0). Softmax background losses: p1 log 3 =
   * 1.0986, p2 log(2 + e) = 1.5514: p2 is mined. Logistic (sum of sigmoid cross-entropies,
   * target 1 at class 0): p1 softplus(3) + 2 softplus(-3) = 3.0486 + 0.0972 = 3.1458, p2
   * 2 log 2 + softplus(1) = 1.3863 + 1.3133 = 2.6996: p1 is mined. */
  const kiln_bbox q[3] = {{0, 0, 0.5f, 0.5f}, {0.75f, 0.75f, 1, 1}, {0.75f, 0.75f, 1, 1}};
  float *prior = prior_blob(q, 3, ONES);
  float conf[9] = {0, 0, 0, -3, -3, -3, 0, 1, 0}, loc[12] = {0}, rows[8];
  gt_row(rows, 0, 1, q[0], 0);
  kiln_multibox_spec s = base_spec(3);
  s.neg_pos_ratio = 1;
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, 1, 3, loc, conf, prior, rows, 1, &sel), KILN_OK);
  negatives_are(&sel, 0, (const int[]){2}, 1);
  s.conf_loss = KILN_CONF_LOGISTIC;
  assert_int_equal(kiln_multibox_select(&s, 1, 3, loc, conf, prior, rows, 1, &sel), KILN_OK);
  negatives_are(&sel, 0, (const int[]){1}, 1);
  free(prior);
  kiln_multibox_selection_free(&sel);
}

/* HARD_EXAMPLE on four priors, two classes: p0 is the box (0, 0, .5, .5), predicted exactly
 * (location loss 0) and confidently (scores (0, 5): loss log(1 + e^-5) = .0067); the others
 * unmatched with background losses log(1 + e^a) for scores (0, a): p1 a = 2: 2.1269,
 * p2 a = 1: 1.3133, p3 a = 0: .6931. Ranked p1, p2, p3, p0. p2 = (.5, .5, 1, .875) overlaps
 * p1 = (.5, .5, 1, 1) by .75; p3 = (0, .5, .5, 1) touches the others. */
static void hard_four(kiln_multibox_spec *s, kiln_multibox_selection *sel, kiln_bbox p3) {
  const kiln_bbox q[4] = {{0, 0, 0.5f, 0.5f}, {0.5f, 0.5f, 1, 1}, {0.5f, 0.5f, 1, 0.875f}, p3};
  float *prior = prior_blob(q, 4, ONES);
  float conf[8] = {0, 5, 0, 2, 0, 1, 0, 0}, loc[16] = {0}, rows[8];
  gt_row(rows, 0, 1, q[0], 0);
  assert_int_equal(kiln_multibox_select(s, 1, 4, loc, conf, prior, rows, 1, sel), KILN_OK);
  free(prior);
}

static void test_mine_hard_example(void **state) {
  (void)state;
  const kiln_bbox p3 = {0, 0.5f, 0.5f, 1};
  kiln_multibox_spec s = base_spec(2);
  s.mining = KILN_MINE_HARD_EXAMPLE;
  s.match_type = KILN_MATCH_BIPARTITE;
  s.sample_size = 2;
  kiln_multibox_selection sel = {0};
  /* the two hardest, p1 and p2: the well-predicted positive p0 is dropped */
  hard_four(&s, &sel, p3);
  assert_int_equal(sel.match[0], -1);
  assert_int_equal(sel.num_pos, 0);
  negatives_are(&sel, 0, (const int[]){1, 2}, 2);
  s.sample_size = 4; /* everything: p0 stays a positive, the rest are negatives */
  hard_four(&s, &sel, p3);
  assert_int_equal(sel.match[0], 0);
  negatives_are(&sel, 0, (const int[]){1, 2, 3}, 3);
  /* suppression over the priors at .5 drops p2 (.75 with p1): the two kept are p1 and p3 */
  s.sample_size = 2;
  s.nms_threshold = 0.5f;
  s.use_prior_for_nms = true;
  hard_four(&s, &sel, p3);
  assert_int_equal(sel.num_pos, 0);
  negatives_are(&sel, 0, (const int[]){1, 3}, 2);
  /* ... over the decoded predictions too, which here are the priors (CORNER, loc 0) */
  s.use_prior_for_nms = false;
  hard_four(&s, &sel, p3);
  negatives_are(&sel, 0, (const int[]){1, 3}, 2);
  /* only the first two candidates, p1 and p2, may be kept: p1 alone */
  s.nms_top_k = 2;
  hard_four(&s, &sel, p3);
  negatives_are(&sel, 0, (const int[]){1}, 1);
  /* a box under 1e-5 in area is dropped by suppression: p3 of 1e-3 x 1e-3 gives way to p0 */
  s.nms_top_k = 0;
  hard_four(&s, &sel, (kiln_bbox){0, 0.5f, 0.001f, 0.501f});
  assert_int_equal(sel.match[0], 0);
  assert_int_equal(sel.num_pos, 1);
  negatives_are(&sel, 0, (const int[]){1}, 1);
  kiln_multibox_selection_free(&sel);
}

/* ---- the loss ------------------------------------------------------------------------------- */

/* Three priors, two classes: p0 = (0, 0, .5, .5) with box (.125, 0, .5, .5) (overlap .75;
 * CORNER target with variances 1: (.125, 0, 0, 0)); p1 = (.5, .5, 1, 1) and p2 = (.5, 0, 1, .5)
 * touch the box. Location prediction of p0 (2.125, -.5, 0, .25): differences (2, -.5, 0, .25),
 * smooth L1 1.5 + .125 + 0 + .03125 = 1.65625. Scores p0 (1, 2), target 1: log(1 + e^-1) =
 * .3132617; p1 (0, 3): background loss log(1 + e^3) = 3.0485874; p2 (0, 1): 1.3132617. One
 * positive, ratio 1: p1 is the negative. */
static void test_loss_hand_case(void **state) {
  (void)state;
  const kiln_bbox q[3] = {{0, 0, 0.5f, 0.5f}, {0.5f, 0.5f, 1, 1}, {0.5f, 0, 1, 0.5f}};
  float *prior = prior_blob(q, 3, ONES);
  float loc[12] = {2.125f, -0.5f, 0, 0.25f}, conf[6] = {1, 2, 0, 3, 0, 1}, rows[8];
  gt_row(rows, 0, 1, (kiln_bbox){0.125f, 0, 0.5f, 0.5f}, 0);
  kiln_multibox_spec s = base_spec(2);
  s.neg_pos_ratio = 1;
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, 1, 3, loc, conf, prior, rows, 1, &sel), KILN_OK);
  assert_int_equal(sel.match[0], 0);
  assert_int_equal(sel.match[1], -1);
  negatives_are(&sel, 0, (const int[]){1}, 1);
  const double lconf = log1p(exp(-1.)) + log1p(exp(3.)), lloc = 1.65625;
  float loss, dloc[12], dconf[6];
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, dloc, dconf), KILN_OK);
  near("loss, VALID", loss, lloc + lconf, 1e-5);
  /* smooth L1's gradient: the sign past 1, the difference below; zero for unmatched priors */
  const float want_loc[12] = {1, -0.5f, 0, 0.25f};
  for (int k = 0; k < 12; k++) near("dloc", dloc[k], want_loc[k], 1e-7);
  /* softmax minus the target: p0 softmax(1, 2) = (.268941, .731059) - (0, 1); p1 softmax(0, 3)
   * = (.047426, .952574) - (1, 0); p2 not selected */
  const double s0 = 1 / (1 + exp(1.)), s1 = 1 / (1 + exp(3.));
  const double want_conf[6] = {s0, -s0, s1 - 1, 1 - s1, 0, 0};
  for (int k = 0; k < 6; k++) near("dconf", dconf[k], want_conf[k], 1e-6);
  /* loc_weight 2 over BATCH_SIZE (1 image); FULL divides by 3 priors; NONE by 1 */
  s.loc_weight = 2;
  s.normalization = KILN_LOSS_BATCH;
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, dloc, NULL), KILN_OK);
  near("loss, BATCH_SIZE", loss, 2 * lloc + lconf, 1e-5);
  near("dloc x loc_weight", dloc[0], 2, 1e-7);
  s.normalization = KILN_LOSS_FULL;
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, NULL, dconf), KILN_OK);
  near("loss, FULL", loss, (2 * lloc + lconf) / 3, 1e-5);
  near("dconf / 3", dconf[0], s0 / 3, 1e-7);
  /* L2: half the squares, (4 + .25 + 0 + .0625) / 2 = 2.15625 */
  s.loc_weight = 1;
  s.normalization = KILN_LOSS_NONE;
  s.loc_loss = KILN_LOC_L2;
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, dloc, NULL), KILN_OK);
  near("loss, L2", loss, 2.15625 + lconf, 1e-5);
  near("dloc, L2", dloc[0], 2, 1e-7);
  /* variances in the target: prediction and target both divided by the variances (.5 here)
   * before the loss, as the fork does: prediction (1.125, -.25, 0, .125) - (.125, 0, 0, 0)
   * over .5 is (2, -.5, 0, .25) again; the gradient passed back is the fork's, without the
   * chain rule's 1 / .5 */
  free(prior);
  const float half[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  prior = prior_blob(q, 3, half);
  const float loc2[12] = {1.125f, -0.25f, 0, 0.125f};
  s.loc_loss = KILN_LOC_SMOOTH_L1;
  s.encode_variance_in_target = true;
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc2, conf, prior, &loss, dloc, NULL), KILN_OK);
  near("loss, variance in target", loss, lloc + lconf, 1e-5);
  for (int k = 0; k < 4; k++) near("dloc, variance in target", dloc[k], want_loc[k], 1e-7);
  free(prior);
  kiln_multibox_selection_free(&sel);
}

static void test_loss_bp_inside(void **state) {
  (void)state;
  /* p0 = (-.125, 0, .5, .5) crosses the left edge; the box (.125, 0, .5, .5) overlaps it .6;
   * CORNER target (.25, 0, 0, 0); prediction (2.25, -.5, 0, .25): differences (2, -.5, 0, .25).
   * With bp_inside the off-image xmin adds nothing: .125 + .03125, and no gradient there. */
  const kiln_bbox q[1] = {{-0.125f, 0, 0.5f, 0.5f}};
  float *prior = prior_blob(q, 1, ONES);
  float loc[4] = {2.25f, -0.5f, 0, 0.25f}, conf[2] = {0, 0}, rows[8];
  gt_row(rows, 0, 1, (kiln_bbox){0.125f, 0, 0.5f, 0.5f}, 0);
  kiln_multibox_spec s = base_spec(2);
  s.mining = KILN_MINE_NONE;
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_OK);
  assert_int_equal(sel.match[0], 0);
  float loss, dloc[4];
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, dloc, NULL), KILN_OK);
  near("without bp_inside", loss, 1.65625 + log(2.), 1e-5);
  s.bp_inside = true;
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, dloc, NULL), KILN_OK);
  near("with bp_inside", loss, 0.15625 + log(2.), 1e-5);
  near("no gradient off the image", dloc[0], 0, 0);
  near("gradient inside", dloc[1], -0.5, 1e-7);
  free(prior);
  kiln_multibox_selection_free(&sel);
}

static void test_loss_agnostic(void **state) {
  (void)state;
  /* map_object_to_agnostic: a box of label 7 trains class 1 of two (background + object) */
  const kiln_bbox q[1] = {{0, 0, 0.5f, 0.5f}};
  float *prior = prior_blob(q, 1, ONES);
  float loc[4] = {0}, conf[2] = {0, 1}, rows[8];
  gt_row(rows, 0, 7, q[0], 0);
  kiln_multibox_spec s = base_spec(2);
  s.map_object_to_agnostic = true;
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_OK);
  float loss;
  assert_int_equal(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, NULL, NULL), KILN_OK);
  near("agnostic", loss, log1p(exp(-1.)), 1e-6);
  /* without the mapping label 7 is no class of two */
  s.map_object_to_agnostic = false;
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_ERR_DATA,
              "row 0");
  free(prior);
  kiln_multibox_selection_free(&sel);
}

static void test_select_errors(void **state) {
  (void)state;
  const kiln_bbox q[1] = {{0, 0, 0.5f, 0.5f}};
  float *prior = prior_blob(q, 1, ONES);
  float loc[12] = {0}, conf[3] = {0}, rows[16];
  gt_row(rows, 0, 1, q[0], 0);
  gt_row(rows + 8, 0, 0, q[0], 1); /* the background, even difficult */
  kiln_multibox_spec s = base_spec(3);
  kiln_multibox_selection sel = {0};
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 2, &sel), KILN_ERR_DATA,
              "row 1");
  gt_row(rows + 8, 0, 3, q[0], 0); /* no class of 3 */
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 2, &sel), KILN_ERR_DATA,
              "row 1");
  gt_row(rows + 8, 2, 1, q[0], 0); /* no image of 1 */
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 2, &sel), KILN_ERR_DATA,
              "row 1");
  s.share_location = false;
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_ERR_INVALID,
              "share_location");
  s.mining = KILN_MINE_NONE;
  s.use_prior_for_matching = false;
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel),
              KILN_ERR_UNSUPPORTED, "use_prior_for_matching");
  s = base_spec(3);
  s.map_object_to_agnostic = true;
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_ERR_INVALID,
              "num_classes");
  s = base_spec(3);
  s.mining = KILN_MINE_HARD_EXAMPLE;
  s.sample_size = 0;
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_ERR_INVALID,
              "sample_size");
  s = base_spec(3);
  s.background_label = -1;
  error_names(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_ERR_INVALID,
              "SOFTMAX");
  /* a selection whose match is no box of its image */
  s = base_spec(3);
  assert_int_equal(kiln_multibox_select(&s, 1, 1, loc, conf, prior, rows, 1, &sel), KILN_OK);
  sel.match[0] = 5;
  float loss;
  error_names(kiln_multibox_loss(&s, &sel, loc, conf, prior, &loss, NULL, NULL), KILN_ERR_INVALID,
              "prior 0");
  free(prior);
  kiln_multibox_selection_free(&sel);
}

/* Mining's partial sort: its first k are the full sort's first k, in order, whatever the ties
 * (keys from few values, so many are equal), the NaNs and k. */
static void test_top_desc_is_sort_prefix(void **state) {
  (void)state;
  enum { N = 300 };
  float key[N];
  int all[N], top[N];
  uint32_t r = 12345;
  for (int trial = 0; trial < 20; trial++) {
    for (int i = 0; i < N; i++) {
      r = r * 1664525u + 1013904223u;
      key[i] = (r >> 28) == 15 ? NAN : (float)((r >> 24) % 7);
      all[i] = top[i] = i;
    }
    const int k = trial * 17 % (N + 5);
    kiln_det_sort_desc(all, N, key);
    kiln_det_top_desc(top, N, key, k);
    for (int i = 0; i < (k < N ? k : N); i++) assert_int_equal(top[i], all[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bbox_size),
      cmocka_unit_test(test_bbox_iou),
      cmocka_unit_test(test_encode_hand_values),
      cmocka_unit_test(test_encode_decode_round_trip),
      cmocka_unit_test(test_prior_ssd300),
      cmocka_unit_test(test_prior_sizes_truncated),
      cmocka_unit_test(test_prior_check_errors),
      cmocka_unit_test(test_gt_group),
      cmocka_unit_test(test_match_five_priors),
      cmocka_unit_test(test_match_ties),
      cmocka_unit_test(test_match_cross_boundary),
      cmocka_unit_test(test_mine_max_negative),
      cmocka_unit_test(test_top_desc_is_sort_prefix),
      cmocka_unit_test(test_mine_logistic_ranks_differently),
      cmocka_unit_test(test_mine_hard_example),
      cmocka_unit_test(test_loss_hand_case),
      cmocka_unit_test(test_loss_bp_inside),
      cmocka_unit_test(test_loss_agnostic),
      cmocka_unit_test(test_select_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
