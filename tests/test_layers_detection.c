/* The SSD fork's detection layers: PriorBox, MultiBoxLoss, DetectionOutput, DetectionEvaluate
 * (src/layers/prior_box.c, multibox_loss.c, detection_output.c, detection_evaluate.c, over the
 * host library of include/kiln/detect.h, whose own tests are tests/test_detect*.c). Forward
 * passes against values worked out by hand (or, for MultiBoxLoss, by an independent computation
 * in double from a selection written down by hand), MultiBoxLoss's gradients against finite
 * differences, the tops whose shapes change from pass to pass, the parameters' defaults and
 * errors, and two small SSD nets built from prototxt text: a training net (convolutions, Permute,
 * Flatten, Concat, PriorBox, MultiBoxLoss) run forward and backward, and a test net (Reshape,
 * Softmax, Flatten, DetectionOutput, DetectionEvaluate). CTest runs this file again on the
 * reference kernels, on hostsim and on the emulated CUDA backend; the nets are built on the
 * configuration's device, so they run there too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "kiln/detect.h"
#include "kiln/device.h"
#include "layer_test.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static const float VAR[4] = {0.1f, 0.1f, 0.2f, 0.2f};

/* A prior blob 1 x 2 x 4P: the P boxes, then P copies of the variances. */
static kiln_blob *priors_of(const float (*box)[4], int P, const float var[4]) {
  kiln_blob *b = blob_of("priors", 3, SHAPE(1, 2, 4 * P), NULL);
  for (int p = 0; p < P; p++) {
    memcpy(b->data + 4 * p, box[p], sizeof(float) * 4);
    memcpy(b->data + 4 * (P + p), var, sizeof(float) * 4);
  }
  return b;
}

/* A ground truth blob 1 x 1 x G x 8 of the given rows. */
static kiln_blob *gt_of(const float (*rows)[8], int G) {
  return blob_of("label", 4, SHAPE(1, 1, G, 8), &rows[0][0]);
}

/* The rows of a layer's top (1 x 1 x R x width) against `want` (R rows). */
static void expect_rows(const char *what, const kiln_blob *top, const float *want, int R,
                        int width) {
  expect_shape(top, 4, SHAPE(1, 1, R, width));
  expect_close(what, top->data, want, (int64_t)R * width, 1e-6);
}

/* ---- PriorBox --------------------------------------------------------------------------------- */

/* SSD300's conv4_3 priors: a 38 x 38 feature map on a 300 x 300 image, min 30, max 60, ratio 2
 * flipped, step 8: 4 boxes a cell, 38 x 38 x 4 = 5776 priors, a top of 1 x 2 x 23104. The first
 * cell is centred at (0.5 x 8, 0.5 x 8) = (4, 4) pixels: the square of 30, (4 -+ 15) / 300 =
 * (-11, -11, 19, 19) / 300; the square of sqrt(30 x 60) = 42.4264, (4 -+ 21.2132) / 300; ratio 2,
 * 30 sqrt 2 = 42.4264 wide and 30 / sqrt 2 = 21.2132 high; ratio 1/2, the transpose. Clipped, the
 * first square is (0, 0, 19, 19) / 300. */
static void test_prior_box_ssd300_conv4_3(void **state) {
  (void)state;
  kiln_blob *fm = blob_of("conv4_3_norm", 4, SHAPE(1, 2, 38, 38), NULL);
  kiln_blob *img = blob_of("data", 4, SHAPE(1, 1, 300, 300), NULL);
  kiln_blob *b[2] = {fm, img};
  const char *param = "prior_box_param { min_size: 30 max_size: 60 aspect_ratio: 2 flip: true "
                      "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: 8 "
                      "offset: 0.5 %s }";
  char text[512];
  for (int clip = 0; clip < 2; clip++) {
    char p[400];
    snprintf(p, sizeof p, param, clip ? "clip: true" : "clip: false");
    snprintf(text, sizeof text, "name: 'conv4_3_norm_mbox_priorbox' type: 'PriorBox' %s", p);
    built l = build(text, TRAIN, b, 2, 1);
    expect_shape(l.top[0], 3, SHAPE(1, 2, 23104));
    fill(l.top[0]->data, l.top[0]->count, 7); /* forward writes every value */
    forward(&l);
    const double s1 = sqrt(1800.) / 2, w2 = 30 * sqrt(2.) / 2, h2 = 30 / sqrt(2.) / 2;
    double want[4][4] = {{-11 / 300., -11 / 300., 19 / 300., 19 / 300.},
                         {(4 - s1) / 300, (4 - s1) / 300, (4 + s1) / 300, (4 + s1) / 300},
                         {(4 - w2) / 300, (4 - h2) / 300, (4 + w2) / 300, (4 + h2) / 300},
                         {(4 - h2) / 300, (4 - w2) / 300, (4 + h2) / 300, (4 + w2) / 300}};
    float wantf[16];
    for (int k = 0; k < 16; k++) {
      double v = want[k / 4][k % 4];
      wantf[k] = (float)(clip ? fmin(fmax(v, 0), 1) : v);
    }
    expect_close("conv4_3 first cell", l.top[0]->data, wantf, 16, 1e-6);
    /* the last cell is centred at 37.5 x 8 = 300: its square reaches (285 .. 315) / 300 */
    const float *last = l.top[0]->data + 4 * (5776 - 4);
    const float want_last[4] = {0.95f, 0.95f, clip ? 1.0f : 1.05f, clip ? 1.0f : 1.05f};
    expect_close("conv4_3 last cell", last, want_last, 4, 1e-6);
    for (int p = 0; p < 5776; p++)
      expect_close("variances", l.top[0]->data + 23104 + 4 * p, VAR, 4, 0);
    unbuild(&l);
  }
  kiln_blob_free(fm);
  kiln_blob_free(img);
}

/* The image's size and the step by default: a 3 x 3 feature map on a 300 x 300 image has a step
 * of 300 / 3 = 100, so with min_size 100 and no other size or ratio each cell is its own square:
 * cell (0, 0) is (0, 0, 100, 100) / 300, cell (h 1, w 2) is centred at (250, 150), (200, 100, 300,
 * 200) / 300; the variance is 0.1. img_size 600 on the same map: step 200, the first square
 * centred at (100, 100), (50, 50, 150, 150) / 600. Ratios given twice or as another's inverse
 * count once: 2, 0.5 and 2 flipped are 1, 2, 1/2 (3 boxes a cell); without flip, 1 and 2. */
static void test_prior_box_defaults(void **state) {
  (void)state;
  kiln_blob *fm = blob_of("fm", 4, SHAPE(2, 1, 3, 3), NULL);
  kiln_blob *img = blob_of("data", 4, SHAPE(2, 3, 300, 300), NULL);
  kiln_blob *b[2] = {fm, img};
  built l = build("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 100 }", TRAIN, b, 2, 1);
  expect_shape(l.top[0], 3, SHAPE(1, 2, 36));
  forward(&l);
  const float c00[4] = {0, 0, 1 / 3.f, 1 / 3.f}, c12[4] = {2 / 3.f, 1 / 3.f, 1, 2 / 3.f};
  expect_close("cell (0, 0)", l.top[0]->data, c00, 4, 1e-6);
  expect_close("cell (1, 2)", l.top[0]->data + 4 * 5, c12, 4, 1e-6);
  for (int k = 0; k < 36; k++) expect_close("default variance", l.top[0]->data + 36 + k,
                                            (const float[]){0.1f}, 1, 0);
  unbuild(&l);

  l = build("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 100 img_size: 600 }", TRAIN,
            b, 2, 1);
  forward(&l);
  const float big[4] = {50 / 600.f, 50 / 600.f, 150 / 600.f, 150 / 600.f};
  expect_close("img_size 600, step 200", l.top[0]->data, big, 4, 1e-6);
  unbuild(&l);

  /* img_h / img_w and step_h / step_w: a 200 x 400 image, steps 50 down and 100 across */
  l = build("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 40 img_h: 200 img_w: 400 "
            "step_h: 50 step_w: 100 offset: 0 variance: 0.3 }",
            TRAIN, b, 2, 1);
  forward(&l);
  /* cell (1, 1) centred at (100, 50): (80, 30, 120, 70) / (400, 200, 400, 200) */
  const float c11[4] = {0.2f, 0.15f, 0.3f, 0.35f};
  expect_close("img_h/img_w, step_h/step_w", l.top[0]->data + 4 * 4, c11, 4, 1e-6);
  expect_close("one variance", l.top[0]->data + 36 + 4 * 8 + 3, (const float[]){0.3f}, 1, 0);
  unbuild(&l);

  l = build("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 aspect_ratio: 2 "
            "aspect_ratio: 0.5 aspect_ratio: 2 aspect_ratio: 1 }",
            TRAIN, b, 2, 1);
  expect_shape(l.top[0], 3, SHAPE(1, 2, 3 * 3 * 3 * 4));
  forward(&l);
  /* the first cell (centre 50, 50): 30 x 30, then ratio 2 (42.43 x 21.21), then 1/2 */
  const double w = 30 * sqrt(2.) / 2, h = 30 / sqrt(2.) / 2;
  const float r2[4] = {(float)((50 - w) / 300), (float)((50 - h) / 300), (float)((50 + w) / 300),
                       (float)((50 + h) / 300)};
  const float rh[4] = {r2[1], r2[0], r2[3], r2[2]};
  expect_close("ratio 2", l.top[0]->data + 4, r2, 4, 1e-6);
  expect_close("ratio 1/2", l.top[0]->data + 8, rh, 4, 1e-6);
  unbuild(&l);
  l = build("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 max_size: 50 "
            "aspect_ratio: 2 flip: false }",
            TRAIN, b, 2, 1);
  expect_shape(l.top[0], 3, SHAPE(1, 2, 3 * 3 * 3 * 4)); /* 30, sqrt(30 50), ratio 2 */
  unbuild(&l);
  kiln_blob_free(fm);
  kiln_blob_free(img);
}

static void test_prior_box_errors(void **state) {
  (void)state;
  kiln_blob *fm = blob_of("fm", 4, SHAPE(1, 1, 3, 3), NULL);
  kiln_blob *img = blob_of("data", 4, SHAPE(1, 3, 30, 30), NULL);
  kiln_blob *b[2] = {fm, img};
  const char *who = "layer 'pb' (PriorBox)";
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 max_size: 30 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "max_size[0]");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 max_size: 20 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "max_size[0]");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 min_size: 40 "
                      "max_size: 60 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "1 max_size values for 2 min_size");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 img_size: 300 "
                      "img_h: 300 img_w: 300 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "img_size and img_h/img_w");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 img_h: 300 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "img_w");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 step: 8 "
                      "step_h: 8 step_w: 8 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "step and step_h/step_w");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { max_size: 60 }", TRAIN, b, 2,
                      1, KILN_ERR_INVALID, who, "min_size is required");
  expect_create_fails("name: 'pb' type: 'PriorBox'", TRAIN, b, 2, 1, KILN_ERR_INVALID, who,
                      "min_size is required");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 variance: 0.1 "
                      "variance: 0.2 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "variance");
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 "
                      "aspect_ratio: -2 }",
                      TRAIN, b, 2, 1, KILN_ERR_INVALID, who, "aspect_ratio[0]");
  kiln_blob *flat = blob_of("flat", 2, SHAPE(1, 9), NULL);
  kiln_blob *bf[2] = {flat, img};
  expect_create_fails("name: 'pb' type: 'PriorBox' prior_box_param { min_size: 30 }", TRAIN, bf,
                      2, 1, KILN_ERR_SHAPE, who, "feature map");
  kiln_blob_free(flat);
  kiln_blob_free(fm);
  kiln_blob_free(img);
}

/* ---- MultiBoxLoss --------------------------------------------------------------------------- */

/* The hand case: 2 images, 4 priors (the quarters of the image), 3 classes (0 the background).
 * Image 0: A (label 1) = (0, 0, .5, .45) overlaps prior 0 by .9; D (label 2) = (.5, 0, 1, .25)
 * overlaps prior 1 by exactly .5 (and is its only box: bipartite matching takes it anyway).
 * Image 1: C (label 1) = (.05, .5, .5, 1) overlaps prior 2 by .9, B (label 2) is prior 3. No box
 * touches another prior, so each image has 2 matches and 2 unmatched priors of overlap 0. With
 * CENTER_SIZE coding and variances (.1, .1, .2, .2) the targets are: A (0, -.5, 0, ln .9 / .2),
 * D (0, -2.5, 0, ln .5 / .2), C (.5, 0, ln .9 / .2, 0), B 0: D's are far into smooth L1's linear
 * part, the others in its square part, for the predictions below (|pred| <= .25).
 *
 * The confidences make the background losses of the unmatched priors far apart (softmax: image
 * 0 prior 2 .37, prior 3 2.18; image 1 prior 0 .92, prior 1 .21; logistic: 1.59, 3.09, 1.95,
 * 1.35), so MAX_NEGATIVE with neg_pos_ratio .5 (one negative an image) takes prior 3 of image 0
 * and prior 0 of image 1, and no step of a finite difference changes that. */
static const float HAND_PRIORS[4][4] = {
    {0, 0, .5f, .5f}, {.5f, 0, 1, .5f}, {0, .5f, .5f, 1}, {.5f, .5f, 1, 1}};
static const float HAND_GT[4][8] = {
    {0, 1, 0, 0, 0, .5f, .45f, 0},   /* A */
    {0, 2, 0, .5f, 0, 1, .25f, 0},   /* D */
    {1, 1, 0, .05f, .5f, .5f, 1, 0}, /* C */
    {1, 2, 0, .5f, .5f, 1, 1, 0},    /* B */
};
static const float HAND_CONF[2 * 4 * 3] = {
    0.1f,  0.5f,  -0.3f, 0.2f, -0.1f, 0.4f, 1.5f,  0,    0,    -1.0f, 0.5f,  0.2f,
    0.3f,  0.2f,  -0.2f, 2.0f, -0.5f, 0.1f, -0.2f, 0.6f, 0.1f, 0.0f,  -0.4f, 0.7f,
};
/* the selection, by hand: per (image, prior) the ground truth row it regresses to, or -1; and the
 * negatives MAX_NEGATIVE at ratio .5 mines */
static const int HAND_MATCH[8] = {0, 1, -1, -1, -1, -1, 2, 3};
static const int HAND_NEG_MINED[8] = {0, 0, 0, 1, 1, 0, 0, 0};

/* Predictions loc[k] = 0.05 ((7k) mod 11) - 0.25, in [-.25, .25]. */
static void hand_loc(float *loc, int n) {
  for (int k = 0; k < n; k++) loc[k] = 0.05f * (float)((7 * k) % 11) - 0.25f;
}

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* MultiBoxLoss of a given selection in double, from the definitions: CENTER_SIZE targets, smooth
 * L1 (or half the square) per coordinate, softmax cross-entropy (or logistic, summed over the
 * classes) against the box's label for matches and the background for negatives, each over
 * `norm`. neg[ip] true marks a negative. */
static double ref_multibox(const float *loc, const float *conf, const float (*prior)[4],
                           const float (*gt)[8], const int *match, const int *neg, int num, int P,
                           int C, bool smooth_l1, bool softmax, double norm) {
  double loc_sum = 0, conf_sum = 0;
  for (int i = 0; i < num; i++)
    for (int p = 0; p < P; p++) {
      const int ip = i * P + p;
      int target;
      if (match[ip] >= 0) {
        const float *g = gt[match[ip]] + 3, *q = prior[p];
        const double pw = (double)q[2] - q[0], ph = (double)q[3] - q[1];
        const double pcx = ((double)q[0] + q[2]) / 2, pcy = ((double)q[1] + q[3]) / 2;
        const double gw = (double)g[2] - g[0], gh = (double)g[3] - g[1];
        const double gcx = ((double)g[0] + g[2]) / 2, gcy = ((double)g[1] + g[3]) / 2;
        const double t[4] = {(gcx - pcx) / pw / VAR[0], (gcy - pcy) / ph / VAR[1],
                             log(gw / pw) / VAR[2], log(gh / ph) / VAR[3]};
        for (int k = 0; k < 4; k++) {
          const double d = loc[4 * ip + k] - t[k];
          loc_sum += smooth_l1 && fabs(d) >= 1 ? fabs(d) - 0.5 : 0.5 * d * d;
        }
        target = (int)gt[match[ip]][1];
      } else if (neg[ip]) {
        target = 0;
      } else {
        continue;
      }
      const float *x = conf + ip * C;
      if (softmax) {
        double m = x[0], s = 0;
        for (int c = 1; c < C; c++) m = fmax(m, x[c]);
        for (int c = 0; c < C; c++) s += exp(x[c] - m);
        conf_sum += log(s) + m - x[target];
      } else {
        for (int c = 0; c < C; c++) conf_sum += softplus(x[c]) - (c == target ? x[c] : 0);
      }
    }
  return (loc_sum + conf_sum) / norm;
}

static kiln_blob **hand_bottoms(kiln_blob **b) {
  b[0] = blob_of("loc", 2, SHAPE(2, 16), NULL);
  hand_loc(b[0]->data, 32);
  b[1] = blob_of("conf", 2, SHAPE(2, 12), HAND_CONF);
  b[2] = priors_of(HAND_PRIORS, 4, VAR);
  b[3] = gt_of(HAND_GT, 4);
  return b;
}

static void free_bottoms(kiln_blob **b, int n) {
  for (int i = 0; i < n; i++) kiln_blob_free(b[i]);
}

#define MBOX(extra)                                                                            \
  "name: 'mbox_loss' type: 'MultiBoxLoss' multibox_loss_param { num_classes: 3 "               \
  "background_label_id: 0 code_type: CENTER_SIZE overlap_threshold: 0.5 neg_overlap: 0.5 " extra \
  " } "

static void test_multibox_loss_hand(void **state) {
  (void)state;
  kiln_blob *b[4];
  hand_bottoms(b);
  static const int all_neg[8] = {0, 0, 1, 1, 1, 1, 0, 0}; /* NONE: every unmatched prior */
  static const struct {
    const char *text;
    const int *neg;
    bool smooth, softmax;
    double norm;
  } cases[] = {
      /* SSD's settings: 4 matches, VALID normalisation divides by 4 */
      {MBOX("neg_pos_ratio: 0.5") "loss_param { normalization: VALID }", HAND_NEG_MINED, true,
       true, 4},
      {MBOX("neg_pos_ratio: 0.5 match_type: BIPARTITE"), HAND_NEG_MINED, true, true, 4},
      {MBOX("mining_type: NONE loc_loss_type: L2 conf_loss_type: LOGISTIC"), all_neg, false,
       false, 4},
      {MBOX("neg_pos_ratio: 0.5 loc_loss_type: L2 conf_loss_type: LOGISTIC"), HAND_NEG_MINED,
       false, false, 4},
      /* ratio 3: every unmatched prior is mined (only 2 an image) */
      {MBOX("neg_pos_ratio: 3"), all_neg, true, true, 4},
      /* the deprecated switches: do_neg_mining false alone is NONE; normalize false is
       * BATCH_SIZE (2 images); normalization wins over normalize */
      {MBOX("do_neg_mining: false") "loss_param { normalize: false }", all_neg, true, true, 2},
      {MBOX("neg_pos_ratio: 0.5") "loss_param { normalize: false normalization: FULL }",
       HAND_NEG_MINED, true, true, 8},
      {MBOX("neg_pos_ratio: 0.5") "loss_param { normalization: NONE }", HAND_NEG_MINED, true,
       true, 1},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    built l = build(cases[k].text, TRAIN, b, 4, 1);
    expect_shape(l.top[0], 0, NULL);
    forward(&l);
    const double want = ref_multibox(b[0]->data, b[1]->data, HAND_PRIORS, HAND_GT, HAND_MATCH,
                                     cases[k].neg, 2, 4, 3, cases[k].smooth, cases[k].softmax,
                                     cases[k].norm);
    char what[600];
    snprintf(what, sizeof what, "%s: loss", cases[k].text);
    expect_rel(what, l.top[0]->data, &want, 1, 1e-5);
    unbuild(&l);
  }
  free_bottoms(b, 4);
}

/* Gradients against finite differences, for loc and conf (the priors and the ground truth take
 * none), with the selection stable under the steps (see the hand case): NONE, and MAX_NEGATIVE
 * whose mined priors are far from a tie; SMOOTH_L1 with SOFTMAX (no prediction within a step of
 * smooth L1's kink at 1) and L2 with LOGISTIC; shared and per-class locations; VALID and
 * BATCH_SIZE normalisation; and a loss weight of 3. */
static void test_multibox_loss_gradients(void **state) {
  (void)state;
  kiln_blob *b[4];
  hand_bottoms(b);
  const gradcheck_opts opts = {.bottom_mask = 3};
  /* SSD's own settings, spelled out */
  check_grad("name: 'mbox_loss' type: 'MultiBoxLoss' multibox_loss_param { loc_loss_type: "
             "SMOOTH_L1 conf_loss_type: SOFTMAX loc_weight: 1 num_classes: 3 share_location: "
             "true match_type: PER_PREDICTION overlap_threshold: 0.5 use_prior_for_matching: true "
             "background_label_id: 0 use_difficult_gt: true neg_pos_ratio: 0.5 neg_overlap: 0.5 "
             "code_type: CENTER_SIZE mining_type: MAX_NEGATIVE } "
             "loss_param { normalization: VALID }",
             b, 4, 1, &opts);
  check_grad(MBOX("mining_type: NONE"), b, 4, 1, &opts);
  check_grad(MBOX("neg_pos_ratio: 0.5"), b, 4, 1, &opts);
  check_grad(MBOX("mining_type: NONE loc_loss_type: L2 conf_loss_type: LOGISTIC"), b, 4, 1,
             &opts);
  check_grad(MBOX("neg_pos_ratio: 0.5 loc_loss_type: L2 conf_loss_type: LOGISTIC") "loss_weight: 3 "
             "loss_param { normalization: BATCH_SIZE }",
             b, 4, 1, &opts);
  /* one location prediction per class (L = 3): each match regresses its label's */
  kiln_blob *loc3 = blob_of("loc", 2, SHAPE(2, 48), NULL);
  hand_loc(loc3->data, 96);
  kiln_blob *b3[4] = {loc3, b[1], b[2], b[3]};
  check_grad(MBOX("mining_type: NONE share_location: false"), b3, 4, 1, &opts);
  kiln_blob_free(loc3);
  free_bottoms(b, 4);
}

/* Backward scales the gradient by the top's (the loss weight times what comes from above): a top
 * gradient of 2 doubles every value of a top gradient of 1; loc and conf diffs are overwritten
 * (garbage before), and only the bottoms asked for are written. */
static void test_multibox_loss_top_gradient(void **state) {
  (void)state;
  kiln_blob *b[4];
  hand_bottoms(b);
  built l = build(MBOX("neg_pos_ratio: 0.5"), TRAIN, b, 4, 1);
  l.l->propagate_down[2] = l.l->propagate_down[3] = false;
  forward(&l);
  float one_loc[32], one_conf[24];
  l.top[0]->diff[0] = 1;
  fill(b[0]->diff, 32, 55);
  fill(b[1]->diff, 24, -55);
  backward(&l);
  memcpy(one_loc, b[0]->diff, sizeof one_loc);
  memcpy(one_conf, b[1]->diff, sizeof one_conf);
  /* prior 2 of image 0 is neither matched nor mined: no gradient */
  expect_close("unselected conf row", b[1]->diff + 2 * 3, (const float[]){0, 0, 0}, 3, 0);
  expect_close("unmatched loc", b[0]->diff + 2 * 4, (const float[]){0, 0, 0, 0}, 4, 0);
  /* a matched prior's conf gradient: softmax - onehot(label 1), over the 4 matches */
  {
    const float *x = HAND_CONF; /* image 0 prior 0, label 1 */
    const double s = exp(x[0]) + exp(x[1]) + exp(x[2]);
    const float want[3] = {(float)(exp(x[0]) / s / 4), (float)((exp(x[1]) / s - 1) / 4),
                           (float)(exp(x[2]) / s / 4)};
    expect_close("matched conf gradient", b[1]->diff, want, 3, 1e-6);
  }
  l.top[0]->diff[0] = 2;
  fill(b[0]->diff, 32, 1e3f);
  fill(b[1]->diff, 24, 1e3f);
  backward(&l);
  float two_loc[32], two_conf[24];
  for (int i = 0; i < 32; i++) two_loc[i] = 2 * one_loc[i];
  for (int i = 0; i < 24; i++) two_conf[i] = 2 * one_conf[i];
  expect_close("loc gradient, top gradient 2", b[0]->diff, two_loc, 32, 1e-6);
  expect_close("conf gradient, top gradient 2", b[1]->diff, two_conf, 24, 1e-6);
  /* conf alone: loc's diff is left as it was */
  l.l->propagate_down[0] = false;
  fill(b[0]->diff, 32, 9);
  backward(&l);
  expect_close("loc diff untouched", b[0]->diff, (const float[]){9}, 1, 0);
  expect_close("conf gradient again", b[1]->diff, two_conf, 24, 1e-6);
  /* the priors and the ground truth take no gradient */
  l.l->propagate_down[2] = true;
  assert_int_equal(layer_backward(l.l), KILN_ERR_UNSUPPORTED);
  expect_message("layer 'mbox_loss' (MultiBoxLoss)", "bottom 2 ('priors')", "propagate_down");
  assert_false(kiln_layer_allows_gradient(l.l, 2));
  assert_false(kiln_layer_allows_gradient(l.l, 3));
  assert_true(kiln_layer_allows_gradient(l.l, 0) && kiln_layer_allows_gradient(l.l, 1));
  unbuild(&l);
  free_bottoms(b, 4);
}

/* A batch without any object: the ground truth is one row of -1. MAX_NEGATIVE mines only in
 * images with ground truth: nothing is selected, the loss and every gradient are 0. NONE takes
 * every prior as a negative: the loss is the background's softmax loss of all 8 rows over
 * max(1, 0 matches) = 1. */
static void test_multibox_loss_no_object(void **state) {
  (void)state;
  kiln_blob *b[4];
  hand_bottoms(b);
  kiln_blob_free(b[3]);
  const float none[1][8] = {{-1, -1, -1, -1, -1, -1, -1, -1}};
  b[3] = gt_of(none, 1);
  built l = build(MBOX(""), TRAIN, b, 4, 1);
  forward(&l);
  expect_close("loss without objects", l.top[0]->data, (const float[]){0}, 1, 0);
  l.top[0]->diff[0] = 1;
  l.l->propagate_down[2] = l.l->propagate_down[3] = false;
  fill(b[0]->diff, 32, 5);
  fill(b[1]->diff, 24, 5);
  backward(&l);
  for (int i = 0; i < 32; i++) expect_close("loc gradient", b[0]->diff + i, (const float[]){0}, 1, 0);
  for (int i = 0; i < 24; i++) expect_close("conf gradient", b[1]->diff + i, (const float[]){0}, 1, 0);
  unbuild(&l);
  l = build(MBOX("mining_type: NONE"), TRAIN, b, 4, 1);
  forward(&l);
  static const int no_match[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  static const int every[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  const double want = ref_multibox(b[0]->data, b[1]->data, HAND_PRIORS, HAND_GT, no_match, every,
                                   2, 4, 3, true, true, 1);
  expect_rel("NONE without objects", l.top[0]->data, &want, 1, 1e-5);
  unbuild(&l);
  free_bottoms(b, 4);
}

static void test_multibox_loss_errors(void **state) {
  (void)state;
  kiln_blob *b[4];
  hand_bottoms(b);
  const char *who = "layer 'mbox_loss' (MultiBoxLoss)";
  expect_create_fails("name: 'mbox_loss' type: 'MultiBoxLoss'", TRAIN, b, 4, 1, KILN_ERR_INVALID,
                      who, "num_classes is required");
  expect_create_fails("name: 'mbox_loss' type: 'MultiBoxLoss' multibox_loss_param { "
                      "num_classes: 3 background_label_id: 3 }",
                      TRAIN, b, 4, 1, KILN_ERR_INVALID, who, "background_label_id 3");
  expect_create_fails(MBOX("do_neg_mining: true mining_type: NONE"), TRAIN, b, 4, 1,
                      KILN_ERR_INVALID, who, "do_neg_mining true contradicts mining_type NONE");
  expect_create_fails(MBOX("share_location: false"), TRAIN, b, 4, 1, KILN_ERR_INVALID, who,
                      "share_location");
  /* num_classes 4: conf has 3 an prior */
  expect_create_fails("name: 'mbox_loss' type: 'MultiBoxLoss' multibox_loss_param { "
                      "num_classes: 4 }",
                      TRAIN, b, 4, 1, KILN_ERR_SHAPE, who, "conf (bottom 1)");
  kiln_blob *loc = blob_of("loc", 2, SHAPE(2, 12), NULL);
  kiln_blob *bl[4] = {loc, b[1], b[2], b[3]};
  expect_create_fails(MBOX(""), TRAIN, bl, 4, 1, KILN_ERR_SHAPE, who, "loc (bottom 0)");
  kiln_blob *conf1 = blob_of("conf", 2, SHAPE(1, 24), NULL);
  kiln_blob *bc[4] = {b[0], conf1, b[2], b[3]};
  expect_create_fails(MBOX(""), TRAIN, bc, 4, 1, KILN_ERR_SHAPE, who, "same N images");
  kiln_blob *pri = blob_of("priors", 2, SHAPE(2, 16), NULL);
  kiln_blob *bp[4] = {b[0], b[1], pri, b[3]};
  expect_create_fails(MBOX(""), TRAIN, bp, 4, 1, KILN_ERR_SHAPE, who, "the priors (bottom 2");
  kiln_blob *gt7 = blob_of("label", 4, SHAPE(1, 1, 4, 7), NULL);
  kiln_blob *bg[4] = {b[0], b[1], b[2], gt7};
  expect_create_fails(MBOX(""), TRAIN, bg, 4, 1, KILN_ERR_SHAPE, who, "ground truth (bottom 3");
  /* a ground truth label of the background: refused when forward reads it, naming the row */
  b[3]->data[8 + 1] = 0;
  built l = build(MBOX(""), TRAIN, b, 4, 1);
  assert_int_equal(layer_forward(l.l), KILN_ERR_DATA);
  expect_message(who, "row 1", NULL);
  unbuild(&l);
  kiln_blob_free(loc);
  kiln_blob_free(conf1);
  kiln_blob_free(pri);
  kiln_blob_free(gt7);
  free_bottoms(b, 4);
}

/* ---- DetectionOutput ------------------------------------------------------------------------ */

/* Two priors, 3 classes, CORNER coding with variance .1: prior 0 = (.1, .1, .5, .5) with zero
 * offsets decodes to itself; prior 1 = (.15, .1, .55, .5) with offsets (.5, 0, .5, 0) decodes to
 * (.2, .1, .6, .5). Their overlap is (.3 x .4) / (.16 + .16 - .12) = .6, above the suppression
 * threshold .45. Probabilities: prior 0 (.35, .6, .05), prior 1 (.2, .5, .3).
 *   class 1: .6 (prior 0) kept, .5 (prior 1) suppressed by it;
 *   class 2: .05 (prior 0) at or below the confidence threshold .1, .3 (prior 1) kept.
 * Rows, class by class: (0, 1, .6, .1, .1, .5, .5), (0, 2, .3, .2, .1, .6, .5). keep_top_k 1 keeps
 * the best of the image's: the first row alone. Without a threshold, class 2 keeps prior 1 (.3)
 * and suppresses prior 0 (.05). */
static const float DO_PRIORS[2][4] = {{.1f, .1f, .5f, .5f}, {.15f, .1f, .55f, .5f}};
static const float DO_LOC[8] = {0, 0, 0, 0, .5f, 0, .5f, 0};
static const float DO_CONF[6] = {.35f, .6f, .05f, .2f, .5f, .3f};

#define DETOUT_NMS(nms, extra)                                                               \
  "name: 'detection_out' type: 'DetectionOutput' detection_output_param { num_classes: 3 "   \
  "share_location: true background_label_id: 0 code_type: CORNER nms_param { nms_threshold: " \
  "0.45 " nms " } " extra " }"
#define DETOUT(extra) DETOUT_NMS("", extra)

static void test_detection_output_hand(void **state) {
  (void)state;
  kiln_blob *b[3] = {blob_of("loc", 2, SHAPE(1, 8), DO_LOC), blob_of("conf", 2, SHAPE(1, 6), DO_CONF),
                     priors_of(DO_PRIORS, 2, (const float[]){.1f, .1f, .1f, .1f})};
  const float two[14] = {0, 1, .6f, .1f, .1f, .5f, .5f, 0, 2, .3f, .2f, .1f, .6f, .5f};
  built l = build(DETOUT("confidence_threshold: 0.1"), TEST, b, 3, 1);
  forward(&l);
  expect_rows("threshold .1", l.top[0], two, 2, 7);
  unbuild(&l);
  l = build(DETOUT("confidence_threshold: 0.1 keep_top_k: 1"), TEST, b, 3, 1);
  expect_shape(l.top[0], 4, SHAPE(1, 1, 1, 7)); /* planned: N x keep_top_k rows */
  forward(&l);
  expect_rows("keep_top_k 1", l.top[0], two, 1, 7);
  unbuild(&l);
  l = build(DETOUT(""), TEST, b, 3, 1);
  forward(&l);
  expect_rows("no threshold", l.top[0], two, 2, 7);
  unbuild(&l);
  /* nms_param.top_k 1: only the best score of each class is a candidate (the same rows here) */
  l = build(DETOUT_NMS("top_k: 1", ""), TEST, b, 3, 1);
  forward(&l);
  expect_rows("top_k 1", l.top[0], two, 2, 7);
  unbuild(&l);
  /* no background: class 0 is a class like the others, (.35 prior 0, .2 prior 1 suppressed) */
  l = build("name: 'd' type: 'DetectionOutput' detection_output_param { num_classes: 3 "
            "background_label_id: -1 confidence_threshold: 0.1 nms_param { nms_threshold: 0.45 } }",
            TEST, b, 3, 1);
  forward(&l);
  const float three[21] = {0, 0, .35f, .1f, .1f, .5f, .5f, 0, 1, .6f, .1f, .1f, .5f, .5f,
                           0, 2, .3f, .2f, .1f, .6f, .5f};
  expect_rows("no background", l.top[0], three, 3, 7);
  unbuild(&l);
  free_bottoms(b, 3);
}

/* Two images: both detected (2 rows each, 4 in all, against the 10 planned), the same again (the
 * same shape), then nothing detected in either, one row (i, -1, -1, -1, -1, -1, -1) per image,
 * then the second image alone. The top's shape follows from pass to pass, and the layer says so
 * when it changes (reshaped), so that a net reshapes the layers after it. */
static void test_detection_output_rows_change(void **state) {
  (void)state;
  kiln_blob *loc = blob_of("loc", 2, SHAPE(2, 8), NULL);
  kiln_blob *conf = blob_of("conf", 2, SHAPE(2, 6), NULL);
  memcpy(loc->data, DO_LOC, sizeof DO_LOC);
  memcpy(loc->data + 8, DO_LOC, sizeof DO_LOC);
  memcpy(conf->data, DO_CONF, sizeof DO_CONF);
  memcpy(conf->data + 6, DO_CONF, sizeof DO_CONF);
  const float low[6] = {.9f, .05f, .05f, .9f, .02f, .08f}; /* every class at most .1 */
  kiln_blob *b[3] = {loc, conf, priors_of(DO_PRIORS, 2, (const float[]){.1f, .1f, .1f, .1f})};
  built l = build(DETOUT("confidence_threshold: 0.1 keep_top_k: 5"), TEST, b, 3, 1);
  expect_shape(l.top[0], 4, SHAPE(1, 1, 10, 7));
  l.l->reshaped = false;
  forward(&l);
  assert_true(l.l->reshaped);
  const float both[28] = {0, 1, .6f, .1f, .1f, .5f, .5f, 0, 2, .3f, .2f, .1f, .6f, .5f,
                          1, 1, .6f, .1f, .1f, .5f, .5f, 1, 2, .3f, .2f, .1f, .6f, .5f};
  expect_rows("both images detected", l.top[0], both, 4, 7);
  l.l->reshaped = false;
  forward(&l);
  assert_false(l.l->reshaped);
  expect_rows("again", l.top[0], both, 4, 7);
  memcpy(conf->data, low, sizeof low);
  memcpy(conf->data + 6, low, sizeof low);
  forward(&l);
  assert_true(l.l->reshaped);
  const float none[14] = {0, -1, -1, -1, -1, -1, -1, 1, -1, -1, -1, -1, -1, -1};
  expect_rows("nothing detected", l.top[0], none, 2, 7);
  l.l->reshaped = false;
  memcpy(conf->data + 6, DO_CONF, sizeof DO_CONF);
  forward(&l);
  assert_false(l.l->reshaped); /* 2 rows again */
  expect_rows("the second image detected", l.top[0], both + 14, 2, 7);
  unbuild(&l);
  free_bottoms(b, 3);
}

static void test_detection_output_errors(void **state) {
  (void)state;
  kiln_blob *b[3] = {blob_of("loc", 2, SHAPE(1, 8), DO_LOC), blob_of("conf", 2, SHAPE(1, 6), DO_CONF),
                     priors_of(DO_PRIORS, 2, VAR)};
  const char *who = "layer 'detection_out' (DetectionOutput)";
  expect_create_fails("name: 'detection_out' type: 'DetectionOutput'", TEST, b, 3, 1,
                      KILN_ERR_INVALID, who, "num_classes is required");
  expect_create_fails(DETOUT("visualize: true"), TEST, b, 3, 1, KILN_ERR_UNSUPPORTED, who,
                      "kiln detect");
  expect_create_fails(DETOUT_NMS("eta: 1.5", ""), TEST, b, 3, 1, KILN_ERR_INVALID, who, "eta");
  expect_create_fails(DETOUT_NMS("top_k: 0", ""), TEST, b, 3, 1, KILN_ERR_INVALID, who,
                      "top_k 0");
  expect_create_fails(DETOUT("background_label_id: 3"), TEST, b, 3, 1, KILN_ERR_INVALID, who,
                      "background_label_id 3");
  expect_create_fails(DETOUT("share_location: false"), TEST, b, 3, 1, KILN_ERR_SHAPE, who,
                      "loc (bottom 0)");
  /* an empty output directory writes nothing: accepted, as the fork's default */
  built l = build(DETOUT("save_output_param { output_name_prefix: 'x' }"), TEST, b, 3, 1);
  unbuild(&l);
  free_bottoms(b, 3);
}

typedef struct {
  int n;
  char text[1024];
} det_warnings;

static void keep_det_warning(kiln_log_level level, const char *msg, void *user) {
  det_warnings *w = user;
  if (level != KILN_LOG_WARN) return;
  const size_t used = strlen(w->text);
  snprintf(w->text + used, sizeof w->text - used, "%s\n", msg);
  w->n++;
}

/* The fork's ssd_pascal.py writes save_output_param (its author's output_directory, a label map,
 * a name-size file, VOC's format) into every test and deploy net it makes, so its published nets
 * carry one (tests/data/ssd): the layer builds, warns once naming the layer, the field and the
 * directory, writes nothing there, and detects as without it. */
static void test_detection_output_save_output_ignored(void **state) {
  (void)state;
  kiln_blob *b[3] = {blob_of("loc", 2, SHAPE(1, 8), DO_LOC), blob_of("conf", 2, SHAPE(1, 6), DO_CONF),
                     priors_of(DO_PRIORS, 2, (const float[]){.1f, .1f, .1f, .1f})};
  const char *dir = "/nonexistent/kiln-test/results/VOC2007/SSD_300x300/Main";
  char text[1024];
  snprintf(text, sizeof text, DETOUT("confidence_threshold: 0.1 save_output_param { "
                                     "output_directory: '%s' output_name_prefix: 'comp4_det_test_' "
                                     "output_format: 'VOC' label_map_file: 'labelmap_voc.prototxt' "
                                     "name_size_file: 'test_name_size.txt' num_test_image: 4952 }"),
           dir);
  det_warnings w = {.n = 0};
  kiln_log_set_handler(keep_det_warning, &w);
  built l = build(text, TEST, b, 3, 1);
  kiln_log_set_handler(NULL, NULL);
  assert_int_equal(w.n, 1);
  assert_non_null(strstr(w.text, "layer 'detection_out' (DetectionOutput)"));
  assert_non_null(strstr(w.text, "save_output_param.output_directory"));
  assert_non_null(strstr(w.text, dir));
  assert_non_null(strstr(w.text, "ignored"));
  forward(&l);
  const float two[14] = {0, 1, .6f, .1f, .1f, .5f, .5f, 0, 2, .3f, .2f, .1f, .6f, .5f};
  expect_rows("with save_output_param", l.top[0], two, 2, 7);
  unbuild(&l);
  free_bottoms(b, 3);
}

/* ---- DetectionEvaluate ---------------------------------------------------------------------- */

/* Ground truth: image 0 has g0 (label 1, (.1, .1, .5, .5)) and g1 (label 2, (.5, .5, .9, .9),
 * difficult); image 1 has g2 (label 1, (.2, .2, .6, .6)). Detections, given out of order:
 *   d0 (0, 1, .9) on g0 exactly: a true positive;
 *   d1 (0, 1, .8) on g0 again, overlap (.38 x .4) / .16 = .95: a false positive (taken);
 *   d2 (0, 2, .7) on g1: difficult: neither, unless difficult boxes are evaluated (then tp);
 *   d3 (1, 1, .6) at (.6, .6, .9, .9), which only touches g2: a false positive;
 *   d4 (1, 2, .5): image 1 has no box of label 2: a false positive.
 * Rows: a positives row per class (label 1: 2; label 2: 0, or 1 with difficult boxes), then by
 * image, label, descending score. A row of DetectionOutput's "none" form is skipped. */
static const float DE_GT[3][8] = {
    {0, 1, 0, .1f, .1f, .5f, .5f, 0}, {0, 2, 0, .5f, .5f, .9f, .9f, 1}, {1, 1, 0, .2f, .2f, .6f, .6f, 0}};
static const float DE_DET[6][7] = {
    {1, 2, .5f, .2f, .2f, .6f, .6f}, {0, 1, .8f, .12f, .1f, .5f, .5f},
    {1, -1, -1, -1, -1, -1, -1},     {0, 2, .7f, .5f, .5f, .9f, .9f},
    {0, 1, .9f, .1f, .1f, .5f, .5f}, {1, 1, .6f, .6f, .6f, .9f, .9f}};

#define DETEVAL(extra)                                                                        \
  "name: 'detection_eval' type: 'DetectionEvaluate' detection_evaluate_param { num_classes: 3 " \
  "background_label_id: 0 overlap_threshold: 0.5 " extra " }"

static void test_detection_evaluate_hand(void **state) {
  (void)state;
  kiln_blob *b[2] = {blob_of("detection_out", 4, SHAPE(1, 1, 6, 7), &DE_DET[0][0]),
                     gt_of(DE_GT, 3)};
  built l = build(DETEVAL("evaluate_difficult_gt: false"), TEST, b, 2, 1);
  expect_shape(l.top[0], 4, SHAPE(1, 1, 2 + 6, 5)); /* planned: a row per class and detection */
  forward(&l);
  const float want[7][5] = {{-1, 1, 2, -1, -1}, {-1, 2, 0, -1, -1}, {0, 1, .9f, 1, 0},
                            {0, 1, .8f, 0, 1},   {0, 2, .7f, 0, 0},  {1, 1, .6f, 0, 1},
                            {1, 2, .5f, 0, 1}};
  expect_rows("difficult boxes left out", l.top[0], &want[0][0], 7, 5);
  unbuild(&l);
  l = build(DETEVAL(""), TEST, b, 2, 1);
  forward(&l);
  float with[7][5];
  memcpy(with, want, sizeof with);
  with[1][2] = 1;                        /* label 2 has a positive */
  with[4][3] = 1, with[4][4] = 0;        /* d2 is a true positive */
  expect_rows("difficult boxes evaluated", l.top[0], &with[0][0], 7, 5);
  /* the predicate the solver's mAP uses: this layer, and no other */
  assert_true(kiln_layer_is_detection_evaluate(l.l));
  unbuild(&l);
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), NULL), *lab = blob_of("y", 1, SHAPE(2), NULL);
  kiln_blob *xb[2] = {x, lab};
  l = build("name: 'f1' type: 'F1' f1_param { positive_label: 1 }", TEST, xb, 2, 3);
  assert_false(kiln_layer_is_detection_evaluate(l.l));
  unbuild(&l);
  kiln_blob_free(x);
  kiln_blob_free(lab);
  /* no ground truth at all (a row of -1): positives 0, every detection a false positive */
  kiln_blob_free(b[1]);
  const float none[1][8] = {{-1, -1, -1, -1, -1, -1, -1, -1}};
  b[1] = gt_of(none, 1);
  l = build(DETEVAL(""), TEST, b, 2, 1);
  forward(&l);
  const float fp[7][5] = {{-1, 1, 0, -1, -1}, {-1, 2, 0, -1, -1}, {0, 1, .9f, 0, 1},
                          {0, 1, .8f, 0, 1},   {0, 2, .7f, 0, 1},  {1, 1, .6f, 0, 1},
                          {1, 2, .5f, 0, 1}};
  expect_rows("no ground truth", l.top[0], &fp[0][0], 7, 5);
  unbuild(&l);
  free_bottoms(b, 2);
}

/* name_size_file: boxes clipped, scaled to the image's pixels and sized inclusively, as the
 * fork's evaluation with original sizes. Ground truth (0, 0, .3, .3), a detection
 * (.16, 0, .3, .3): normalised, their overlap is .042 / .09 = .467, a false positive at .5. On a
 * 10 x 10 image they are (0, 0, 3, 3), 4 x 4 = 16 pixels, and (1.6, 0, 3, 3), 2.4 x 4 = 9.6
 * pixels, inside it: overlap .6, a true positive. On a 1000 x 1000 image: 301 x 301 and
 * 141 x 301, overlap .468, a false positive again. One image a batch: the first pass takes the
 * file's first size, the second its second, the third starts the list over. */
static int deteval_setup(void **state) { return tmpdir_setup(state, "det"); }

static void test_detection_evaluate_name_size(void **state) {
  tmpdir_fixture *f = *state;
  char sizes[256], bad[256], text[512];
  path_in(f, "test_name_size.txt", sizes, sizeof sizes);
  const char *list = "000001 10 10\n\n000002 1000 1000\n";
  write_plain(sizes, list, strlen(list));
  const float gt[1][8] = {{0, 1, 0, 0, 0, .3f, .3f, 0}};
  const float det[1][7] = {{0, 1, .9f, .16f, 0, .3f, .3f}};
  kiln_blob *b[2] = {blob_of("det", 4, SHAPE(1, 1, 1, 7), &det[0][0]), gt_of(gt, 1)};
  built l = build(DETEVAL(""), TEST, b, 2, 1);
  forward(&l);
  const float normalised[3][5] = {{-1, 1, 1, -1, -1}, {-1, 2, 0, -1, -1}, {0, 1, .9f, 0, 1}};
  expect_rows("normalised", l.top[0], &normalised[0][0], 3, 5);
  unbuild(&l);
  snprintf(text, sizeof text, DETEVAL("name_size_file: '%s'"), sizes);
  l = build(text, TEST, b, 2, 1);
  const float pixels[3][5] = {{-1, 1, 1, -1, -1}, {-1, 2, 0, -1, -1}, {0, 1, .9f, 1, 0}};
  for (int pass = 0; pass < 3; pass++) {
    forward(&l);
    expect_rows(pass == 1 ? "1000 x 1000" : "10 x 10", l.top[0],
                pass == 1 ? &normalised[0][0] : &pixels[0][0], 3, 5);
  }
  unbuild(&l);
  /* resize_param in its WARP mode changes nothing */
  snprintf(text, sizeof text,
           DETEVAL("name_size_file: '%s' resize_param { resize_mode: WARP height: 300 "
                   "width: 300 }"),
           sizes);
  l = build(text, TEST, b, 2, 1);
  forward(&l);
  expect_rows("WARP", l.top[0], &pixels[0][0], 3, 5);
  unbuild(&l);

  const char *who = "layer 'detection_eval' (DetectionEvaluate)";
  path_in(f, "missing.txt", bad, sizeof bad);
  snprintf(text, sizeof text, DETEVAL("name_size_file: '%s'"), bad);
  expect_create_fails(text, TEST, b, 2, 1, KILN_ERR_IO, who, "missing.txt");
  path_in(f, "bad.txt", bad, sizeof bad);
  const char *bad_list = "a 10 10\nb 10\nc 10 10\n";
  write_plain(bad, bad_list, strlen(bad_list));
  snprintf(text, sizeof text, DETEVAL("name_size_file: '%s'"), bad);
  expect_fails_ex(text, TEST, b, 2, 1, false, KILN_ERR_DATA, who, "bad.txt, line 2",
                  "NAME HEIGHT WIDTH");
  bad_list = "a 10 10\nb 0 10\n";
  write_plain(bad, bad_list, strlen(bad_list));
  expect_fails_ex(text, TEST, b, 2, 1, false, KILN_ERR_DATA, who, "bad.txt, line 2", NULL);
  bad_list = "\n \n";
  write_plain(bad, bad_list, strlen(bad_list));
  expect_create_fails(text, TEST, b, 2, 1, KILN_ERR_DATA, who, "names no image");
  expect_create_fails(DETEVAL("resize_param { resize_mode: FIT_SMALL_SIZE }"), TEST, b, 2, 1,
                      KILN_ERR_UNSUPPORTED, who, "WARP");
  free_bottoms(b, 2);
}

static void test_detection_evaluate_errors(void **state) {
  (void)state;
  kiln_blob *b[2] = {blob_of("detection_out", 4, SHAPE(1, 1, 6, 7), &DE_DET[0][0]),
                     gt_of(DE_GT, 3)};
  const char *who = "layer 'detection_eval' (DetectionEvaluate)";
  expect_create_fails("name: 'detection_eval' type: 'DetectionEvaluate'", TEST, b, 2, 1,
                      KILN_ERR_INVALID, who, "num_classes is required");
  expect_create_fails("name: 'detection_eval' type: 'DetectionEvaluate' "
                      "detection_evaluate_param { num_classes: 2 background_label_id: 2 }",
                      TEST, b, 2, 1, KILN_ERR_INVALID, who, "background_label_id 2");
  kiln_blob *gt7 = blob_of("label", 4, SHAPE(1, 1, 3, 7), NULL);
  kiln_blob *bg[2] = {b[0], gt7};
  expect_create_fails(DETEVAL(""), TEST, bg, 2, 1, KILN_ERR_SHAPE, who, "the ground truth");
  kiln_blob *bd[2] = {b[1], b[1]}; /* rows of 8 where rows of 7 are due */
  expect_create_fails(DETEVAL(""), TEST, bd, 2, 1, KILN_ERR_SHAPE, who, "the detections");
  /* a detection of the background class: refused by forward, naming the row */
  b[0]->data[7 * 4 + 1] = 0;
  built l = build(DETEVAL(""), TEST, b, 2, 1);
  assert_int_equal(layer_forward(l.l), KILN_ERR_DATA);
  expect_message(who, "detection row 4", "background");
  unbuild(&l);
  kiln_blob_free(gt7);
  free_bottoms(b, 2);
}

/* ---- in a net ------------------------------------------------------------------------------- */

/* A small SSD: 16 x 16 images, three stride-2 convolutions (8 x 8, 4 x 4, 2 x 2), heads on the
 * last two with 4 priors a cell (min and max size, ratio 2 flipped): 4 x 4 x 4 + 2 x 2 x 4 = 80
 * priors, 3 classes. */
#define SSD_BODY                                                                                \
  "name: 'ssd_tiny' "                                                                          \
  "layer { name: 'input' type: 'Input' top: 'data' top: 'label' input_param { "              \
  "  shape { dim: 2 dim: 3 dim: 16 dim: 16 } shape { dim: 1 dim: 1 dim: 3 dim: 8 } } } "      \
  "layer { name: 'conv1' type: 'Convolution' bottom: 'data' top: 'conv1' convolution_param { " \
  "  num_output: 4 kernel_size: 3 pad: 1 stride: 2 weight_filler { type: 'xavier' } } } "     \
  "layer { name: 'relu1' type: 'ReLU' bottom: 'conv1' top: 'conv1' } "                       \
  "layer { name: 'conv2' type: 'Convolution' bottom: 'conv1' top: 'conv2' convolution_param { " \
  "  num_output: 4 kernel_size: 3 pad: 1 stride: 2 weight_filler { type: 'xavier' } } } "     \
  "layer { name: 'relu2' type: 'ReLU' bottom: 'conv2' top: 'conv2' } "                       \
  "layer { name: 'conv3' type: 'Convolution' bottom: 'conv2' top: 'conv3' convolution_param { " \
  "  num_output: 4 kernel_size: 3 pad: 1 stride: 2 weight_filler { type: 'xavier' } } } "     \
  SSD_HEAD("conv2", "4", "8")                                                                  \
  SSD_HEAD("conv3", "8", "14")                                                                 \
  "layer { name: 'mbox_loc' type: 'Concat' bottom: 'conv2_loc_flat' bottom: 'conv3_loc_flat' " \
  "  top: 'mbox_loc' concat_param { axis: 1 } } "                                             \
  "layer { name: 'mbox_conf' type: 'Concat' bottom: 'conv2_conf_flat' "                      \
  "  bottom: 'conv3_conf_flat' top: 'mbox_conf' concat_param { axis: 1 } } "                  \
  "layer { name: 'mbox_priorbox' type: 'Concat' bottom: 'conv2_priorbox' "                    \
  "  bottom: 'conv3_priorbox' top: 'mbox_priorbox' concat_param { axis: 2 } } "

#define SSD_HEAD(src, mn, mx)                                                                   \
  "layer { name: '" src "_loc' type: 'Convolution' bottom: '" src "' top: '" src "_loc' "      \
  "  convolution_param { num_output: 16 kernel_size: 3 pad: 1 "                               \
  "  weight_filler { type: 'gaussian' std: 0.1 } } } "                                          \
  "layer { name: '" src "_loc_perm' type: 'Permute' bottom: '" src "_loc' top: '" src           \
  "_loc_perm' permute_param { order: 0 order: 2 order: 3 order: 1 } } "                       \
  "layer { name: '" src "_loc_flat' type: 'Flatten' bottom: '" src "_loc_perm' top: '" src      \
  "_loc_flat' flatten_param { axis: 1 } } "                                                   \
  "layer { name: '" src "_conf' type: 'Convolution' bottom: '" src "' top: '" src "_conf' "    \
  "  convolution_param { num_output: 12 kernel_size: 3 pad: 1 "                               \
  "  weight_filler { type: 'gaussian' std: 0.1 } } } "                                          \
  "layer { name: '" src "_conf_perm' type: 'Permute' bottom: '" src "_conf' top: '" src         \
  "_conf_perm' permute_param { order: 0 order: 2 order: 3 order: 1 } } "                      \
  "layer { name: '" src "_conf_flat' type: 'Flatten' bottom: '" src "_conf_perm' top: '" src    \
  "_conf_flat' flatten_param { axis: 1 } } "                                                  \
  "layer { name: '" src "_priorbox' type: 'PriorBox' bottom: '" src "' bottom: 'data' "        \
  "  top: '" src "_priorbox' prior_box_param { min_size: " mn " max_size: " mx                  \
  "  aspect_ratio: 2 flip: true clip: false variance: 0.1 variance: 0.1 variance: 0.2 "       \
  "  variance: 0.2 offset: 0.5 } } "

static const float NET_GT[3][8] = {{0, 1, 0, .1f, .1f, .45f, .5f, 0},
                                   {1, 2, 0, .5f, .5f, .9f, .95f, 0},
                                   {1, 1, 0, .05f, .6f, .4f, .9f, 1}};

/* Builds `text` on the configuration's device and fills its inputs (random images, NET_GT)
 * through the device table. */
static kiln_net *ssd_net(const char *text, int phase, Caffe__NetParameter **np) {
  if (kiln_net_param_from_text(text, "ssd_tiny.prototxt", np)) {
    print_error("%s\n", kiln_last_error());
    fail();
  }
  kiln_net_options opt = {.phase = phase, .seed = 3, .config = kiln_test_config()};
  kiln_net *net;
  if (kiln_net_create(*np, &opt, &net)) {
    print_error("%s\n", kiln_last_error());
    fail();
  }
  const char *dev = getenv("KILN_DEVICE"); /* CTest's hostsim runs: the net lives there */
  if (dev && strcmp(dev, "host") != 0) assert_false(kiln_device_is_host(net->device));
  kiln_blob *data = kiln_net_blob(net, "data"), *label = kiln_net_blob(net, "label");
  assert_non_null(data);
  assert_non_null(label);
  float *x = malloc(sizeof(float) * (size_t)data->count);
  assert_non_null(x);
  kiln_rng rng;
  kiln_rng_seed(&rng, 41, 1);
  for (int64_t i = 0; i < data->count; i++) x[i] = kiln_rng_uniform(&rng, -1, 1);
  assert_int_equal(kiln_device_to_device(net->device, data->data, x,
                                         sizeof(float) * (size_t)data->count),
                   KILN_OK);
  assert_int_equal(kiln_device_to_device(net->device, label->data, NET_GT, sizeof NET_GT),
                   KILN_OK);
  free(x);
  return net;
}

/* Every value of a net's blob, through the device table, finite. */
static float *read_blob(kiln_net *net, const char *name, bool diff) {
  kiln_blob *b = kiln_net_blob(net, name);
  assert_non_null(b);
  float *v = malloc(sizeof(float) * (size_t)(b->count + 1));
  assert_non_null(v);
  assert_int_equal(kiln_device_to_host(net->device, v, diff ? b->diff : b->data,
                                       sizeof(float) * (size_t)b->count),
                   KILN_OK);
  for (int64_t i = 0; i < b->count; i++)
    if (!isfinite(v[i])) fail_msg("%s %s[%lld] is %g", name, diff ? "diff" : "data", (long long)i, v[i]);
  return v;
}

static void test_ssd_train_net(void **state) {
  (void)state;
  const char *text =
      SSD_BODY
      "layer { name: 'mbox_loss' type: 'MultiBoxLoss' bottom: 'mbox_loc' bottom: 'mbox_conf' "
      "  bottom: 'mbox_priorbox' bottom: 'label' top: 'mbox_loss' "
      "  propagate_down: true propagate_down: true propagate_down: false propagate_down: false "
      "  loss_param { normalization: VALID } multibox_loss_param { loc_loss_type: SMOOTH_L1 "
      "  conf_loss_type: SOFTMAX loc_weight: 1 num_classes: 3 share_location: true "
      "  match_type: PER_PREDICTION overlap_threshold: 0.5 use_prior_for_matching: true "
      "  background_label_id: 0 use_difficult_gt: true neg_pos_ratio: 3 neg_overlap: 0.5 "
      "  code_type: CENTER_SIZE ignore_cross_boundary_bbox: false mining_type: MAX_NEGATIVE } } ";
  Caffe__NetParameter *np;
  kiln_net *net = ssd_net(text, TRAIN, &np);
  expect_shape(kiln_net_blob(net, "mbox_loc"), 2, SHAPE(2, 320));
  expect_shape(kiln_net_blob(net, "mbox_conf"), 2, SHAPE(2, 240));
  expect_shape(kiln_net_blob(net, "mbox_priorbox"), 3, SHAPE(1, 2, 320));
  expect_shape(kiln_net_blob(net, "mbox_loss"), 0, NULL);
  kiln_net_zero_param_diff(net);
  float loss = 0;
  if (kiln_net_forward(net, &loss)) fail_msg("forward: %s", kiln_last_error());
  assert_true(isfinite(loss) && loss > 0);
  if (kiln_net_backward(net)) fail_msg("backward: %s", kiln_last_error());
  free(read_blob(net, "mbox_priorbox", false));
  /* the first convolution's weights got a gradient, finite and not all zero */
  kiln_layer *c1 = kiln_net_layer(net, "conv1");
  assert_non_null(c1);
  float *dw = malloc(sizeof(float) * (size_t)c1->param[0]->count);
  assert_non_null(dw);
  assert_int_equal(kiln_device_to_host(net->device, dw, c1->param[0]->diff,
                                       sizeof(float) * (size_t)c1->param[0]->count),
                   KILN_OK);
  double norm = 0;
  for (int64_t i = 0; i < c1->param[0]->count; i++) {
    assert_true(isfinite(dw[i]));
    norm += fabs(dw[i]);
  }
  assert_true(norm > 0);
  free(dw);
  /* a second pass gives the same loss (nothing kept from the first but the weights) */
  float again = 0;
  if (kiln_net_forward(net, &again)) fail_msg("forward: %s", kiln_last_error());
  assert_true(again == loss);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

static void test_ssd_test_net(void **state) {
  (void)state;
  const char *text =
      SSD_BODY
      "layer { name: 'mbox_conf_reshape' type: 'Reshape' bottom: 'mbox_conf' "
      "  top: 'mbox_conf_reshape' reshape_param { shape { dim: 0 dim: -1 dim: 3 } } } "
      "layer { name: 'mbox_conf_softmax' type: 'Softmax' bottom: 'mbox_conf_reshape' "
      "  top: 'mbox_conf_softmax' softmax_param { axis: 2 } } "
      "layer { name: 'mbox_conf_flatten' type: 'Flatten' bottom: 'mbox_conf_softmax' "
      "  top: 'mbox_conf_flatten' flatten_param { axis: 1 } } "
      "layer { name: 'detection_out' type: 'DetectionOutput' bottom: 'mbox_loc' "
      "  bottom: 'mbox_conf_flatten' bottom: 'mbox_priorbox' top: 'detection_out' "
      "  detection_output_param { num_classes: 3 share_location: true background_label_id: 0 "
      "  nms_param { nms_threshold: 0.45 top_k: 40 } code_type: CENTER_SIZE keep_top_k: 10 "
      "  confidence_threshold: 0.01 } } "
      "layer { name: 'detection_eval' type: 'DetectionEvaluate' bottom: 'detection_out' "
      "  bottom: 'label' top: 'detection_eval' detection_evaluate_param { num_classes: 3 "
      "  background_label_id: 0 overlap_threshold: 0.5 evaluate_difficult_gt: false } } ";
  Caffe__NetParameter *np;
  kiln_net *net = ssd_net(text, TEST, &np);
  expect_shape(kiln_net_blob(net, "mbox_conf_flatten"), 2, SHAPE(2, 240));
  expect_shape(kiln_net_blob(net, "detection_out"), 4, SHAPE(1, 1, 20, 7)); /* planned */
  for (int pass = 0; pass < 2; pass++) {
    if (kiln_net_forward(net, NULL)) fail_msg("forward: %s", kiln_last_error());
    const kiln_blob *d = kiln_net_blob(net, "detection_out"), *e = kiln_net_blob(net, "detection_eval");
    assert_int_equal(d->naxes, 4);
    const int64_t D = d->shape[2];
    assert_true(D >= 1 && D <= 20);
    float *det = read_blob(net, "detection_out", false);
    int64_t valid = 0;
    for (int64_t r = 0; r < D; r++) {
      const float *v = det + 7 * r;
      assert_true(v[0] == 0 || v[0] == 1);
      if (v[1] == -1) continue;
      valid++;
      assert_true(v[1] == 1 || v[1] == 2);
      assert_true(v[2] > 0.01f && v[2] <= 1);
    }
    /* at most 10 an image */
    expect_shape(e, 4, SHAPE(1, 1, 2 + valid, 5));
    float *ev = read_blob(net, "detection_eval", false);
    /* the positives: label 1 has one box that is not difficult, label 2 one */
    const float pos[10] = {-1, 1, 1, -1, -1, -1, 2, 1, -1, -1};
    expect_close("positives rows", ev, pos, 10, 0);
    for (int64_t r = 2; r < 2 + valid; r++) {
      const float *v = ev + 5 * r;
      assert_true(v[3] + v[4] <= 1 && v[3] >= 0 && v[4] >= 0);
    }
    free(det);
    free(ev);
  }
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prior_box_ssd300_conv4_3),
      cmocka_unit_test(test_prior_box_defaults),
      cmocka_unit_test(test_prior_box_errors),
      cmocka_unit_test(test_multibox_loss_hand),
      cmocka_unit_test(test_multibox_loss_gradients),
      cmocka_unit_test(test_multibox_loss_top_gradient),
      cmocka_unit_test(test_multibox_loss_no_object),
      cmocka_unit_test(test_multibox_loss_errors),
      cmocka_unit_test(test_detection_output_hand),
      cmocka_unit_test(test_detection_output_rows_change),
      cmocka_unit_test(test_detection_output_errors),
    cmocka_unit_test(test_detection_output_save_output_ignored),
      cmocka_unit_test(test_detection_evaluate_hand),
      cmocka_unit_test_setup_teardown(test_detection_evaluate_name_size, deteval_setup,
                                      tmpdir_teardown),
      cmocka_unit_test(test_detection_evaluate_errors),
      cmocka_unit_test(test_ssd_train_net),
      cmocka_unit_test(test_ssd_test_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
