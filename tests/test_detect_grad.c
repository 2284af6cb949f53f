/* MultiBoxLoss's gradient (kiln_multibox_loss, src/ops/multibox.c) against central differences.
 * With the selection fixed (kiln_multibox_select's, on a two-image batch of six priors and three
 * classes), the loss is a smooth function of the predictions; it is written again here in
 * double precision from the formulas alone (CENTER_SIZE targets with the SSD variances, smooth
 * L1 or half squares, softmax or logistic cross-entropy, the four normalizations), its value
 * compared with kiln's and its central differences with kiln's gradient, for every location and
 * confidence value, selected or not (the unselected must be exactly zero in both). The
 * differences are taken in double with step 1e-4, so they err by about 1e-8 (the step squared
 * times the third derivative, here at most of order 1): the tolerance 1e-4 (relative past 1)
 * covers kiln's float arithmetic (a few ulps of values of order 1) with room, and is far below
 * any real mistake (a missing normalizer or loc_weight, a wrong class, a lost 0.5). Location
 * differences are drawn away from smooth L1's kink at 1, where the loss has no derivative. */
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

enum { NUM = 2, P = 6, C = 3 };

/* ---- the reference loss --------------------------------------------------------------------- */

typedef struct ref {
  const kiln_multibox_spec *s;
  const kiln_multibox_selection *sel;
  const float *prior;
  /* with the variances in the target: the objective whose gradient the fork passes back,
   * v x loss((pred - t) / v) per coordinate, rather than the loss it reports */
  bool fork_objective;
} ref;

static void ref_target(double t[4], const float *pb, const float *var, const kiln_bbox *g,
                       bool in_target) {
  double v[4];
  for (int k = 0; k < 4; k++) v[k] = in_target ? 1 : var[k];
  const double pw = (double)pb[2] - pb[0], ph = (double)pb[3] - pb[1];
  const double pcx = ((double)pb[0] + pb[2]) / 2, pcy = ((double)pb[1] + pb[3]) / 2;
  const double gw = (double)g->xmax - g->xmin, gh = (double)g->ymax - g->ymin;
  const double gcx = ((double)g->xmin + g->xmax) / 2, gcy = ((double)g->ymin + g->ymax) / 2;
  t[0] = (gcx - pcx) / pw / v[0];
  t[1] = (gcy - pcy) / ph / v[1];
  t[2] = log(gw / pw) / v[2];
  t[3] = log(gh / ph) / v[3];
}

static double ref_elem(double d, kiln_loc_loss type) {
  if (type == KILN_LOC_SMOOTH_L1 && fabs(d) >= 1) return fabs(d) - 0.5;
  return 0.5 * d * d;
}

static double ref_conf(const double *x, int t, kiln_conf_loss type) {
  double loss = 0;
  if (type == KILN_CONF_SOFTMAX) {
    double sum = 0;
    for (int c = 0; c < C; c++) sum += exp(x[c]);
    return log(sum) - x[t];
  }
  for (int c = 0; c < C; c++) loss += log(1 + exp(x[c])) - (c == t ? x[c] : 0);
  return loss;
}

static double ref_loss(const ref *r, const double *loc, const double *conf) {
  const kiln_multibox_spec *s = r->s;
  const int L = s->share_location ? 1 : C;
  double lsum = 0, csum = 0;
  int64_t npos = 0;
  for (int i = 0; i < NUM; i++)
    for (int p = 0; p < P; p++) {
      const int ip = i * P + p, g = r->sel->match[ip];
      int target;
      if (g >= 0) {
        const kiln_gt_box *gt = &r->sel->gt[g];
        const float *pb = r->prior + 4 * p, *var = r->prior + 4 * (P + p);
        double t[4];
        ref_target(t, pb, var, &gt->box, s->encode_variance_in_target);
        const double *pred = loc + (ip * L + (s->share_location ? 0 : gt->label)) * 4;
        for (int k = 0; k < 4; k++) {
          if (s->bp_inside && (pb[k] < 0 || pb[k] > 1)) continue;
          if (!s->encode_variance_in_target) {
            lsum += ref_elem(pred[k] - t[k], s->loc_loss);
            continue;
          }
          const double d = (pred[k] - t[k]) / var[k];
          lsum += (r->fork_objective ? var[k] : 1) * ref_elem(d, s->loc_loss);
        }
        target = s->map_object_to_agnostic ? s->background_label + 1 : gt->label;
        npos++;
      } else if (r->sel->neg[ip]) {
        target = s->background_label;
      } else {
        continue;
      }
      csum += ref_conf(conf + ip * C, target, s->conf_loss);
    }
  double n = 1;
  switch (s->normalization) {
    case KILN_LOSS_FULL: n = NUM * P; break;
    case KILN_LOSS_VALID: n = (double)npos; break;
    case KILN_LOSS_BATCH: n = NUM; break;
    case KILN_LOSS_NONE: n = 1; break;
  }
  n = n < 1 ? 1 : n;
  return s->loc_weight * lsum / n + csum / n;
}

/* ---- the batch -------------------------------------------------------------------------------- */

/* Six priors: the first four inside the image, the last two crossing its left and top edges
 * (which only bp_inside treats apart). Boxes: image 0 has p0 and p3 jittered (labels 1 and 2,
 * overlaps about .8 and .74), image 1 has p1 jittered (label 1, .77) and a box that p4, across
 * the left edge, overlaps by .66 (label 2). */
static const float PRIORS[P][4] = {{0.05f, 0.1f, 0.45f, 0.5f},   {0.5f, 0.5f, 0.9f, 0.95f},
                                   {0.3f, 0.2f, 0.7f, 0.6f},     {0.55f, 0.05f, 0.95f, 0.4f},
                                   {-0.1f, 0.55f, 0.3f, 0.95f},  {0.4f, -0.05f, 0.8f, 0.3f}};

static void make_prior(float *prior) {
  const float var[4] = {0.1f, 0.1f, 0.2f, 0.2f};
  for (int p = 0; p < P; p++) {
    memcpy(prior + 4 * p, PRIORS[p], sizeof(float) * 4);
    memcpy(prior + 4 * (P + p), var, sizeof var);
  }
}

static void make_gt(float rows[4 * 8]) {
  const float g[4][8] = {{0, 1, 0, 0.08f, 0.12f, 0.47f, 0.55f, 0},
                         {0, 2, 0, 0.5f, 0.08f, 0.93f, 0.42f, 0},
                         {1, 1, 0, 0.52f, 0.48f, 0.88f, 0.9f, 0},
                         {1, 2, 0, 0.0f, 0.56f, 0.32f, 0.93f, 0}};
  memcpy(rows, g, sizeof g);
}

/* A location difference away from smooth L1's kink at |d| = 1. */
static double safe_diff(kiln_rng *r) {
  const double mag = kiln_rng_below(r, 2) ? kiln_rng_uniform(r, 0.05f, 0.85f)
                                          : kiln_rng_uniform(r, 1.15f, 2.0f);
  return kiln_rng_below(r, 2) ? mag : -mag;
}

/* One configuration: select, place the matched predictions at known distances from their
 * targets, then compare value and gradient. Returns the number of mismatches (printed). */
static int check_config(const kiln_multibox_spec *s, bool fork_objective, uint64_t seed) {
  const int L = s->share_location ? 1 : C;
  float prior[8 * P], rows[32], loc[NUM * P * C * 4], conf[NUM * P * C];
  make_prior(prior);
  make_gt(rows);
  kiln_rng r;
  kiln_rng_seed(&r, seed, 5);
  for (int k = 0; k < NUM * P * C; k++) conf[k] = kiln_rng_uniform(&r, -2, 2);
  for (int k = 0; k < NUM * P * L * 4; k++) loc[k] = kiln_rng_uniform(&r, -1.5f, 1.5f);
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(s, NUM, P, loc, conf, prior, rows, 4, &sel), KILN_OK);
  /* p0 and p3 of image 0, p1 and p4 of image 1 */
  assert_true(sel.num_pos >= 4);
  assert_true(sel.num_neg >= 1);
  for (int i = 0; i < NUM; i++)
    for (int p = 0; p < P; p++) {
      const int g = sel.match[i * P + p];
      if (g < 0) continue;
      double t[4];
      const float *var = prior + 4 * (P + p);
      ref_target(t, prior + 4 * p, var, &sel.gt[g].box, s->encode_variance_in_target);
      float *pred = loc + ((i * P + p) * L + (s->share_location ? 0 : sel.gt[g].label)) * 4;
      for (int k = 0; k < 4; k++)
        pred[k] = (float)(t[k] + safe_diff(&r) * (s->encode_variance_in_target ? var[k] : 1));
    }
  const int nl = NUM * P * L * 4, nc = NUM * P * C;
  double dl[NUM * P * C * 4], dc[NUM * P * C];
  for (int k = 0; k < nl; k++) dl[k] = loc[k];
  for (int k = 0; k < nc; k++) dc[k] = conf[k];
  float loss, gl[NUM * P * C * 4], gc[NUM * P * C];
  assert_int_equal(kiln_multibox_loss(s, &sel, loc, conf, prior, &loss, gl, gc), KILN_OK);
  const ref rf = {s, &sel, prior, fork_objective};
  int bad = 0;
  const ref rv = {s, &sel, prior, false};
  const double want = ref_loss(&rv, dl, dc);
  if (!(fabs(loss - want) <= 1e-5 * fmax(1, fabs(want)))) {
    printf("seed %llu: loss %.9g, reference %.9g\n", (unsigned long long)seed, loss, want);
    bad++;
  }
  const double h = 1e-4;
  for (int pass = 0; pass < 2; pass++) {
    double *x = pass ? dc : dl;
    const float *g = pass ? gc : gl;
    for (int k = 0; k < (pass ? nc : nl); k++) {
      const double x0 = x[k];
      x[k] = x0 + h;
      const double up = ref_loss(&rf, dl, dc);
      x[k] = x0 - h;
      const double down = ref_loss(&rf, dl, dc);
      x[k] = x0;
      const double fd = (up - down) / (2 * h);
      if (!(fabs(g[k] - fd) <= 1e-4 * fmax(1, fabs(fd)))) {
        printf("seed %llu: d%s[%d] = %.9g, differences %.9g\n", (unsigned long long)seed,
               pass ? "conf" : "loc", k, g[k], fd);
        bad++;
      }
    }
  }
  kiln_multibox_selection_free(&sel);
  return bad;
}

static kiln_multibox_spec spec(void) {
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
  s.code = KILN_BOX_CENTER_SIZE;
  s.loc_weight = 0.7f; /* not 1, so that a lost factor shows */
  return s;
}

static void test_loss_gradients(void **state) {
  (void)state;
  int bad = 0, n = 0;
  /* every location loss x confidence loss x normalization x shared or not (not shared: one
   * location per class, and no mining, which the fork allows only for shared locations) */
  for (int share = 0; share < 2; share++)
    for (int ll = 0; ll < 2; ll++)
      for (int cl = 0; cl < 2; cl++)
        for (int nm = 0; nm < 4; nm++) {
          kiln_multibox_spec s = spec();
          s.share_location = share;
          s.mining = share ? KILN_MINE_MAX_NEGATIVE : KILN_MINE_NONE;
          s.loc_loss = ll ? KILN_LOC_SMOOTH_L1 : KILN_LOC_L2;
          s.conf_loss = cl ? KILN_CONF_LOGISTIC : KILN_CONF_SOFTMAX;
          s.normalization = (kiln_loss_norm)nm;
          bad += check_config(&s, false, 100 + (uint64_t)n++);
        }
  /* the variances in the target (the fork's gradient: of v x loss((pred - t) / v)) */
  kiln_multibox_spec s = spec();
  s.loc_loss = KILN_LOC_SMOOTH_L1;
  s.encode_variance_in_target = true;
  bad += check_config(&s, true, 200);
  s.loc_loss = KILN_LOC_L2;
  bad += check_config(&s, true, 201);
  /* bp_inside: p4, matched in image 1, crosses the left edge; its xmin counts nothing */
  s = spec();
  s.loc_loss = KILN_LOC_SMOOTH_L1;
  s.bp_inside = true;
  bad += check_config(&s, false, 202);
  /* logistic without a background class: negatives have no positive target at all */
  s = spec();
  s.conf_loss = KILN_CONF_LOGISTIC;
  s.background_label = -1;
  bad += check_config(&s, false, 203);
  if (bad) fail_msg("%d mismatches", bad);
}

/* The reference matches the fork's reported loss, not its gradient, when the variances are in
 * the target: the two objectives differ, so the test above would notice the wrong one. */
static void test_variance_objectives_differ(void **state) {
  (void)state;
  kiln_multibox_spec s = spec();
  s.encode_variance_in_target = true;
  s.loc_loss = KILN_LOC_L2;
  float prior[8 * P], rows[32], loc[NUM * P * 4] = {0}, conf[NUM * P * C] = {0};
  make_prior(prior);
  make_gt(rows);
  kiln_multibox_selection sel = {0};
  assert_int_equal(kiln_multibox_select(&s, NUM, P, loc, conf, prior, rows, 4, &sel), KILN_OK);
  double dl[NUM * P * 4], dc[NUM * P * C];
  for (int k = 0; k < NUM * P * 4; k++) dl[k] = 0.3;
  for (int k = 0; k < NUM * P * C; k++) dc[k] = 0;
  const ref reported = {&s, &sel, prior, false}, fork = {&s, &sel, prior, true};
  assert_true(fabs(ref_loss(&reported, dl, dc) - ref_loss(&fork, dl, dc)) > 0.1);
  kiln_multibox_selection_free(&sel);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loss_gradients),
      cmocka_unit_test(test_variance_objectives_differ),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
