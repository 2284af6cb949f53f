/* MultiBoxLoss's host arithmetic, as the fork's MultiBoxLossLayer with bbox_util.cpp's
 * FindMatches, MineHardExamples, EncodeLocPrediction and EncodeConfPrediction compute it: which
 * priors regress to which ground truth box and which are mined as negatives (a selection), then
 * the loss of a selection and its gradient. Splitting the two is what lets the gradient be
 * checked: with the selection fixed the loss is a smooth function of the predictions.
 *
 * The fork's quirks that change numbers are kept on purpose, because a Caffe user's SSD net
 * must train to the same place: sizes and overlaps in float, the number of mined negatives
 * truncated from a float product, and with encode_variance_in_target both the prediction and
 * its target divided by the prior's variances before the location loss, whose gradient the fork
 * passes back without the chain rule's 1/variance. Where the fork leaves an order to an
 * unstable sort, ties go to the lower prior index. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/detect.h"
#include "kiln/status.h"
#include "ops/detect_internal.h"

void kiln_multibox_selection_free(kiln_multibox_selection *s) {
  free(s->match);
  free(s->neg);
  free(s->gt);
  free(s->first);
  memset(s, 0, sizeof *s);
}

static bool finite_all(float a, float b, float c, float d) {
  return isfinite(a) && isfinite(b) && isfinite(c) && isfinite(d);
}

/* What both entry points need of a spec; the messages name multibox_loss_param's fields. */
static int check_spec(const kiln_multibox_spec *s, int num, int priors) {
  if (num < 0 || priors < 0)
    return kiln_errorf(KILN_ERR_SHAPE, "MultiBoxLoss: %d images of %d priors", num, priors);
  if (s->num_classes < 1)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: num_classes %d: expected at least 1",
                       s->num_classes);
  if (s->background_label < -1 || s->background_label >= s->num_classes)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: background_label_id %d is no class of "
                       "num_classes %d", s->background_label, s->num_classes);
  if (s->conf_loss == KILN_CONF_SOFTMAX && s->background_label < 0)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: conf_loss_type SOFTMAX needs a "
                       "background class (background_label_id in [0, %d))", s->num_classes);
  if ((unsigned)s->match_type > KILN_MATCH_PER_PREDICTION ||
      (unsigned)s->mining > KILN_MINE_HARD_EXAMPLE || (unsigned)s->loc_loss > KILN_LOC_SMOOTH_L1 ||
      (unsigned)s->conf_loss > KILN_CONF_LOGISTIC || (unsigned)s->normalization > KILN_LOSS_NONE)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: match_type %d, mining_type %d, "
                       "loc_loss_type %d, conf_loss_type %d or normalization %d is no such value",
                       (int)s->match_type, (int)s->mining, (int)s->loc_loss, (int)s->conf_loss,
                       (int)s->normalization);
  if (s->code < KILN_BOX_CORNER || s->code > KILN_BOX_CORNER_SIZE)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: code_type %d is no such value",
                       (int)s->code);
  if (s->mining != KILN_MINE_NONE && !s->share_location)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: mining_type %s needs share_location "
                       "(the fork mines negatives only for shared locations)",
                       s->mining == KILN_MINE_MAX_NEGATIVE ? "MAX_NEGATIVE" : "HARD_EXAMPLE");
  if (!s->share_location && !s->use_prior_for_matching)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "MultiBoxLoss: share_location false with "
                       "use_prior_for_matching false: the fork then matches each class's "
                       "predictions apart, so that one prior may regress to several boxes, "
                       "which kiln does not implement");
  if (s->map_object_to_agnostic && s->num_classes != (s->background_label >= 0 ? 2 : 1))
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: map_object_to_agnostic needs "
                       "num_classes %d (background and object), not %d",
                       s->background_label >= 0 ? 2 : 1, s->num_classes);
  if (s->mining == KILN_MINE_HARD_EXAMPLE && s->sample_size < 1)
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: sample_size %d: HARD_EXAMPLE keeps at "
                       "least one example an image", s->sample_size);
  if (!finite_all(s->overlap_threshold, s->neg_overlap, s->loc_weight, s->nms_threshold) ||
      !(s->neg_pos_ratio >= 0 && isfinite(s->neg_pos_ratio)))
    return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: overlap_threshold %g, neg_overlap %g, "
                       "neg_pos_ratio %g, loc_weight %g, nms_threshold %g: expected finite "
                       "values (neg_pos_ratio >= 0)", s->overlap_threshold, s->neg_overlap,
                       s->neg_pos_ratio, s->loc_weight, s->nms_threshold);
  return KILN_OK;
}

/* The class a matched prior is trained to: the box's label, or the one object class. */
static int conf_target(const kiln_multibox_spec *s, const kiln_gt_box *g) {
  return s->map_object_to_agnostic ? s->background_label + 1 : g->label;
}

/* The location class whose prediction regresses to g. */
static int loc_class(const kiln_multibox_spec *s, const kiln_gt_box *g) {
  return s->share_location ? 0 : g->label;
}

/* ---- the two losses of one prediction ------------------------------------------------------ */

/* Softmax cross-entropy of the row x against class t through log-sum-exp (no overflow, and
 * none of the fork's clamp of the probability at FLT_MIN, which only matters past a loss of 87);
 * logistic: sigmoid cross-entropy summed over the classes, target 1 at t only (t = -1: none). */
static double conf_loss_row(const float *x, int C, int t, kiln_conf_loss type) {
  if (type == KILN_CONF_SOFTMAX) {
    float m = x[0];
    for (int c = 1; c < C; c++) m = x[c] > m ? x[c] : m;
    double sum = 0;
    for (int c = 0; c < C; c++) sum += exp((double)x[c] - m);
    return log(sum) - ((double)x[t] - m);
  }
  double loss = 0;
  for (int c = 0; c < C; c++) {
    const double v = x[c];
    loss += (v > 0 ? v : 0) - (c == t ? v : 0) + log1p(exp(-fabs(v)));
  }
  return loss;
}

/* Its gradient with respect to x, times `scale`, into g. */
static void conf_grad_row(float *g, const float *x, int C, int t, kiln_conf_loss type,
                          double scale) {
  if (type == KILN_CONF_SOFTMAX) {
    float m = x[0];
    for (int c = 1; c < C; c++) m = x[c] > m ? x[c] : m;
    double sum = 0;
    for (int c = 0; c < C; c++) sum += exp((double)x[c] - m);
    for (int c = 0; c < C; c++)
      g[c] = (float)(scale * (exp((double)x[c] - m) / sum - (c == t)));
    return;
  }
  for (int c = 0; c < C; c++) g[c] = (float)(scale * (1 / (1 + exp(-(double)x[c])) - (c == t)));
}

static double loc_elem(float d, kiln_loc_loss type) {
  const double a = fabs((double)d);
  if (type == KILN_LOC_SMOOTH_L1 && a >= 1) return a - 0.5;
  return 0.5 * (double)d * d;
}

static double loc_elem_grad(float d, kiln_loc_loss type) {
  if (type == KILN_LOC_SMOOTH_L1 && fabs(d) >= 1) return d > 0 ? 1 : -1;
  return d;
}

/* The four differences the fork's location loss sees for the prediction `pred` of a prior
 * matched to `gt`: prediction minus encoded target, both divided by the variances when they
 * are in the target; with bp_inside a coordinate of `mbox` (the matched box: the prior, or the
 * decoded prediction) off the image counts nothing, as the fork's copy of the target into the
 * prediction makes it. */
static void loc_diffs(const kiln_multibox_spec *s, const float *pred, const kiln_bbox *prior,
                      const float *var, const kiln_bbox *gt, const kiln_bbox *mbox, float d[4]) {
  kiln_bbox t;
  kiln_bbox_encode(&t, prior, var, gt, s->code, s->encode_variance_in_target);
  const float tv[4] = {t.xmin, t.ymin, t.xmax, t.ymax};
  const float mv[4] = {mbox->xmin, mbox->ymin, mbox->xmax, mbox->ymax};
  for (int k = 0; k < 4; k++) {
    float pk = pred[k], tk = tv[k];
    if (s->encode_variance_in_target) {
      pk /= var[k];
      tk /= var[k];
    }
    d[k] = s->bp_inside && kiln_det_off(mv[k]) ? 0 : pk - tk;
  }
}

/* ---- matching ------------------------------------------------------------------------------- */

/* One select call's scratch, sized once for the priors and the largest image's ground truth. */
typedef struct work {
  kiln_bbox *prior, *boxes, *dec; /* the priors; the boxes matched; decoded predictions */
  uint8_t *ign, *chosen;          /* cross-boundary priors; HARD_EXAMPLE's picks */
  float *mov, *loss, *row, *ov;   /* best overlap a prior; mining loss; one prior's overlaps */
  int *cand, *order;
  uint8_t *gfree;
  int64_t ov_cap;
} work;

static void work_free(work *w) {
  free(w->prior);
  free(w->boxes);
  free(w->dec);
  free(w->ign);
  free(w->chosen);
  free(w->mov);
  free(w->loss);
  free(w->row);
  free(w->ov);
  free(w->cand);
  free(w->order);
  free(w->gfree);
}

static int work_alloc(work *w, int P, int64_t G) {
  const size_t p = (size_t)(P > 0 ? P : 1), g = (size_t)(G > 0 ? G : 1);
  w->prior = malloc(sizeof(kiln_bbox) * p);
  w->boxes = malloc(sizeof(kiln_bbox) * p);
  w->dec = malloc(sizeof(kiln_bbox) * p);
  w->ign = malloc(p);
  w->chosen = malloc(p);
  w->mov = malloc(sizeof(float) * p);
  w->loss = malloc(sizeof(float) * p);
  w->row = malloc(sizeof(float) * g);
  w->cand = malloc(sizeof(int) * p);
  w->order = malloc(sizeof(int) * p);
  w->gfree = malloc(g);
  w->ov = NULL;
  w->ov_cap = 0;
  if (!w->prior || !w->boxes || !w->dec || !w->ign || !w->chosen || !w->mov || !w->loss ||
      !w->row || !w->cand || !w->order || !w->gfree)
    return kiln_errorf(KILN_ERR_NOMEM, "MultiBoxLoss: no memory for the matching of %d priors",
                       P);
  return KILN_OK;
}

/* Matches the P boxes w->boxes of one image to its G ground truth boxes gt (global indices from
 * gt0) into match, the best overlap of each prior into w->mov: the fork's MatchBBox. Only the
 * priors that overlap some box (by more than 1e-6) take part, kept with their overlaps in
 * w->cand and w->ov, so the greedy passes scan a few hundred priors, not all. */
static int match_image(const kiln_multibox_spec *s, int P, const kiln_gt_box *gt, int G,
                       int32_t gt0, work *w, int32_t *match) {
  int K = 0;
  for (int p = 0; p < P; p++) {
    match[p] = -1;
    w->mov[p] = 0;
    w->ign[p] = s->ignore_cross_boundary_bbox && kiln_det_cross_boundary(&w->boxes[p]);
    if (w->ign[p]) continue;
    bool any = false;
    for (int g = 0; g < G; g++) {
      const float o = kiln_bbox_iou(&w->boxes[p], &gt[g].box);
      w->row[g] = o > 1e-6f ? o : 0;
      if (o > 1e-6f) {
        any = true;
        if (o > w->mov[p]) w->mov[p] = o;
      }
    }
    if (!any) continue;
    if ((int64_t)(K + 1) * G > w->ov_cap) {
      const int64_t cap = w->ov_cap * 2 > (int64_t)(K + 1) * G ? w->ov_cap * 2 : (int64_t)64 * G;
      float *ov = realloc(w->ov, sizeof(float) * (size_t)cap);
      if (!ov)
        return kiln_errorf(KILN_ERR_NOMEM, "MultiBoxLoss: no memory for the overlaps of %d "
                           "priors with %d boxes", K + 1, G);
      w->ov = ov;
      w->ov_cap = cap;
    }
    memcpy(w->ov + (int64_t)K * G, w->row, sizeof(float) * (size_t)G);
    w->cand[K++] = p;
  }
  /* Bipartite: the greatest overlap between a free box and an unmatched prior, again and
   * again; strict > over priors, then boxes, ascending gives ties to the lower indices. */
  for (int g = 0; g < G; g++) w->gfree[g] = 1;
  for (int left = G; left > 0; left--) {
    int bk = -1, bg = -1;
    float best = -1;
    for (int k = 0; k < K; k++) {
      if (match[w->cand[k]] != -1) continue;
      const float *o = w->ov + (int64_t)k * G;
      for (int g = 0; g < G; g++)
        if (w->gfree[g] && o[g] > 1e-6f && o[g] > best) {
          best = o[g];
          bk = k;
          bg = g;
        }
    }
    if (bk < 0) break;
    match[w->cand[bk]] = gt0 + bg;
    w->mov[w->cand[bk]] = best;
    w->gfree[bg] = 0;
  }
  if (s->match_type == KILN_MATCH_PER_PREDICTION) {
    for (int k = 0; k < K; k++) {
      const int p = w->cand[k];
      if (match[p] != -1) continue;
      const float *o = w->ov + (int64_t)k * G;
      int bg = -1;
      float best = -1;
      for (int g = 0; g < G; g++)
        if (o[g] > 1e-6f && o[g] >= s->overlap_threshold && o[g] > best) {
          best = o[g];
          bg = g;
        }
      if (bg >= 0) {
        match[p] = gt0 + bg;
        w->mov[p] = best;
      }
    }
  }
  return KILN_OK;
}

/* ---- mining --------------------------------------------------------------------------------- */

/* MAX_NEGATIVE: of the unmatched priors (not cross-boundary) whose best overlap is below
 * neg_overlap, the floor(npos x neg_pos_ratio) of largest background loss. */
static int64_t mine_max_negative(const kiln_multibox_spec *s, int P, const float *conf,
                                 int64_t npos, const int32_t *match, work *w, uint8_t *neg) {
  const int C = s->num_classes;
  int nc = 0;
  for (int p = 0; p < P; p++) {
    if (match[p] != -1 || w->ign[p] || !(w->mov[p] < s->neg_overlap)) continue;
    w->loss[p] = (float)conf_loss_row(conf + (int64_t)p * C, C, s->background_label, s->conf_loss);
    w->cand[nc++] = p;
  }
  /* the fork's static_cast<int>(num_pos * neg_pos_ratio), a float product */
  const float want = (float)npos * s->neg_pos_ratio;
  const int nsel = want >= (float)nc ? nc : (int)want;
  kiln_det_top_desc(w->cand, nc, w->loss, nsel);
  for (int n = 0; n < nsel; n++) neg[w->cand[n]] = 1;
  return nsel;
}

/* HARD_EXAMPLE: every prior's loss (confidence against its target, plus location when matched),
 * suppressed at nms_threshold when it is positive (the fork's ApplyNMS: boxes under 1e-5 in area
 * dropped, at most nms_top_k candidates), the sample_size largest kept; a matched prior not kept
 * is unmatched, an unmatched one kept is a negative. Returns the negatives; *npos is lowered. */
static int64_t mine_hard_examples(const kiln_multibox_spec *s, int P, const float *loc,
                                  const float *conf, const float *prior, const kiln_gt_box *gts,
                                  int32_t *match, work *w, uint8_t *neg, int64_t *npos) {
  const int C = s->num_classes;
  for (int p = 0; p < P; p++) {
    const float *x = conf + (int64_t)p * C;
    if (match[p] < 0) {
      w->loss[p] = (float)conf_loss_row(x, C, s->background_label, s->conf_loss);
      continue;
    }
    const kiln_gt_box *g = &gts[match[p]];
    double l = conf_loss_row(x, C, conf_target(s, g), s->conf_loss);
    const float *pred = loc + (int64_t)p * 4; /* mining needs shared locations */
    const kiln_bbox *mbox = s->use_prior_for_matching ? &w->prior[p] : &w->boxes[p];
    float d[4];
    loc_diffs(s, pred, &w->prior[p], prior + 4 * ((int64_t)P + p), &g->box, mbox, d);
    for (int k = 0; k < 4; k++) l += loc_elem(d[k], s->loc_loss);
    w->loss[p] = (float)l;
  }
  for (int p = 0; p < P; p++) w->order[p] = p;
  kiln_det_sort_desc(w->order, P, w->loss);
  int nsel = s->sample_size < P ? s->sample_size : P;
  memset(w->chosen, 0, (size_t)P);
  if (s->nms_threshold > 0) {
    const kiln_bbox *b = s->use_prior_for_nms ? w->prior : w->dec;
    if (!s->use_prior_for_nms) kiln_det_decode_all(w->dec, prior, P, loc, 1, 0, s->code,
                                                   s->encode_variance_in_target);
    const int ncand = s->nms_top_k > 0 && s->nms_top_k < P ? s->nms_top_k : P;
    /* The picks are the first nsel kept, so suppression stops there. */
    int kept = 0;
    for (int n = 0; n < ncand && kept < nsel; n++) {
      const int i = w->order[n];
      if (kiln_bbox_size(&b[i], true) < 1e-5f) continue;
      bool keep = true;
      for (int k = 0; k < kept && keep; k++)
        keep = !(kiln_bbox_iou(&b[w->cand[k]], &b[i]) > s->nms_threshold);
      if (keep) w->cand[kept++] = i;
    }
    for (int k = 0; k < kept; k++) w->chosen[w->cand[k]] = 1;
  } else {
    for (int n = 0; n < nsel; n++) w->chosen[w->order[n]] = 1;
  }
  int64_t nneg = 0;
  for (int p = 0; p < P; p++) {
    if (match[p] >= 0) {
      if (!w->chosen[p]) {
        match[p] = -1;
        (*npos)--;
      }
    } else if (!w->ign[p] && w->chosen[p]) {
      neg[p] = 1;
      nneg++;
    }
  }
  return nneg;
}

/* ---- the selection -------------------------------------------------------------------------- */

static int grow(void **p, int64_t *cap, int64_t need, size_t elem, const char *what) {
  if (need <= *cap) return KILN_OK;
  void *q = realloc(*p, elem * (size_t)(need > 0 ? need : 1));
  if (!q) return kiln_errorf(KILN_ERR_NOMEM, "MultiBoxLoss: no memory for %lld %s",
                             (long long)need, what);
  *p = q;
  *cap = need;
  return KILN_OK;
}

/* Labels the fork refuses or would read past the scores with; rows named as the data gives
 * them. */
static int check_gt_labels(const kiln_multibox_spec *s, const float *rows, int64_t nrows) {
  for (int64_t r = 0; r < nrows; r++) {
    const float *v = rows + 8 * r;
    if (v[0] == -1) continue;
    if (v[1] == s->background_label)
      return kiln_errorf(KILN_ERR_DATA, "ground truth row %lld: label %g is the background "
                         "(background_label_id)", (long long)r, v[1]);
    if ((!s->map_object_to_agnostic || !s->share_location) && v[1] >= s->num_classes)
      return kiln_errorf(KILN_ERR_DATA, "ground truth row %lld: label %g is no class of "
                         "num_classes %d", (long long)r, v[1], s->num_classes);
  }
  return KILN_OK;
}

static int select_images(const kiln_multibox_spec *s, int num, int P, const float *loc,
                         const float *conf, const float *prior, kiln_multibox_selection *sel,
                         work *w) {
  const int C = s->num_classes, L = s->share_location ? 1 : C;
  for (int p = 0; p < P; p++) w->prior[p] = kiln_det_box(prior + 4 * (int64_t)p);
  sel->num_pos = sel->num_neg = 0;
  for (int i = 0; i < num; i++) {
    int32_t *match = sel->match + (int64_t)i * P;
    uint8_t *neg = sel->neg + (int64_t)i * P;
    const float *iloc = loc + (int64_t)i * P * L * 4, *iconf = conf + (int64_t)i * P * C;
    const int G = (int)(sel->first[i + 1] - sel->first[i]);
    memset(neg, 0, (size_t)P);
    if (G == 0) {
      /* no box: no match, and negatives only when every prior counts (NONE) */
      for (int p = 0; p < P; p++) {
        match[p] = -1;
        neg[p] = s->mining == KILN_MINE_NONE;
      }
      if (s->mining == KILN_MINE_NONE) sel->num_neg += P;
      continue;
    }
    if (s->use_prior_for_matching)
      memcpy(w->boxes, w->prior, sizeof(kiln_bbox) * (size_t)P);
    else
      kiln_det_decode_all(w->boxes, prior, P, iloc, 1, 0, s->code, s->encode_variance_in_target);
    const kiln_gt_box *gt = sel->gt + sel->first[i];
    KILN_TRY(match_image(s, P, gt, G, (int32_t)sel->first[i], w, match));
    int64_t npos = 0;
    for (int p = 0; p < P; p++) {
      if (match[p] < 0) continue;
      npos++;
      const kiln_bbox *pb = &w->prior[p];
      if (s->code != KILN_BOX_CORNER && !(pb->xmax - pb->xmin > 0 && pb->ymax - pb->ymin > 0))
        return kiln_errorf(KILN_ERR_DATA, "MultiBoxLoss: image %d: prior %d (%g, %g, %g, %g) "
                           "is matched but has no width or height to encode against", i, p,
                           pb->xmin, pb->ymin, pb->xmax, pb->ymax);
    }
    switch (s->mining) {
      case KILN_MINE_NONE:
        for (int p = 0; p < P; p++) neg[p] = match[p] == -1;
        sel->num_neg += P - npos;
        break;
      case KILN_MINE_MAX_NEGATIVE:
        sel->num_neg += mine_max_negative(s, P, iconf, npos, match, w, neg);
        break;
      case KILN_MINE_HARD_EXAMPLE:
        sel->num_neg += mine_hard_examples(s, P, iloc, iconf, prior, sel->gt, match, w, neg,
                                           &npos);
        break;
    }
    sel->num_pos += npos;
  }
  return KILN_OK;
}

int kiln_multibox_select(const kiln_multibox_spec *s, int num, int priors, const float *loc,
                         const float *conf, const float *prior, const float *gt_rows,
                         int64_t gt_nrows, kiln_multibox_selection *sel) {
  KILN_TRY(check_spec(s, num, priors));
  if (gt_nrows < 0)
    return kiln_errorf(KILN_ERR_SHAPE, "MultiBoxLoss: %lld ground truth rows",
                       (long long)gt_nrows);
  int64_t first_cap = sel->first_cap;
  KILN_TRY(grow((void **)&sel->first, &first_cap, (int64_t)num + 1, sizeof(int64_t),
                "image starts"));
  sel->first_cap = (int)first_cap;
  KILN_TRY(kiln_gt_group(gt_rows, gt_nrows, num, s->use_difficult_gt, &sel->gt, &sel->gt_cap,
                         sel->first));
  KILN_TRY(check_gt_labels(s, gt_rows, gt_nrows));
  const int64_t n = (int64_t)num * priors;
  int64_t cap = sel->cap;
  KILN_TRY(grow((void **)&sel->match, &cap, n, sizeof(int32_t), "matches"));
  cap = sel->cap;
  KILN_TRY(grow((void **)&sel->neg, &cap, n, 1, "negatives"));
  sel->cap = cap;
  sel->num = num;
  sel->priors = priors;
  int64_t gmax = 0;
  for (int i = 0; i < num; i++)
    if (sel->first[i + 1] - sel->first[i] > gmax) gmax = sel->first[i + 1] - sel->first[i];
  work w;
  int rc = work_alloc(&w, priors, gmax);
  if (rc == KILN_OK) rc = select_images(s, num, priors, loc, conf, prior, sel, &w);
  work_free(&w);
  if (rc != KILN_OK) sel->num = sel->priors = 0, sel->num_pos = sel->num_neg = 0;
  return rc;
}

/* ---- the loss ------------------------------------------------------------------------------- */

static double normalizer(const kiln_multibox_spec *s, int num, int P, int64_t npos) {
  double n = 1;
  switch (s->normalization) {
    case KILN_LOSS_FULL: n = (double)num * P; break;
    case KILN_LOSS_VALID: n = (double)npos; break;
    case KILN_LOSS_BATCH: n = num; break;
    case KILN_LOSS_NONE: n = 1; break;
  }
  return n < 1 ? 1 : n;
}

int kiln_multibox_loss(const kiln_multibox_spec *s, const kiln_multibox_selection *sel,
                       const float *loc, const float *conf, const float *prior, float *loss,
                       float *dloc, float *dconf) {
  const int num = sel->num, P = sel->priors;
  KILN_TRY(check_spec(s, num, P));
  const int C = s->num_classes, L = s->share_location ? 1 : C;
  /* The selection may come from elsewhere than kiln_multibox_select (the tests build some):
   * every match must name a box of its own image whose classes exist. */
  int64_t npos = 0;
  for (int i = 0; i < num; i++)
    for (int p = 0; p < P; p++) {
      const int32_t g = sel->match[(int64_t)i * P + p];
      if (g < 0) continue;
      if (g < sel->first[i] || g >= sel->first[i + 1])
        return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: image %d, prior %d: match %d is no "
                           "box of that image", i, p, g);
      const kiln_gt_box *gt = &sel->gt[g];
      if (conf_target(s, gt) >= C || loc_class(s, gt) >= L)
        return kiln_errorf(KILN_ERR_INVALID, "MultiBoxLoss: image %d, prior %d: box %d's label "
                           "%d is no class of num_classes %d", i, p, g, gt->label, C);
      npos++;
    }
  if (dloc) memset(dloc, 0, sizeof(float) * (size_t)num * (size_t)P * (size_t)L * 4);
  if (dconf) memset(dconf, 0, sizeof(float) * (size_t)num * (size_t)P * (size_t)C);
  const double N = normalizer(s, num, P, npos);
  const double gloc = s->loc_weight / N, gconf = 1 / N;
  double loc_sum = 0, conf_sum = 0;
  for (int i = 0; i < num; i++) {
    for (int p = 0; p < P; p++) {
      const int64_t ip = (int64_t)i * P + p;
      const int32_t g = sel->match[ip];
      const float *x = conf + ip * C;
      int target;
      if (g >= 0) {
        const kiln_gt_box *gt = &sel->gt[g];
        const int64_t at = (ip * L + loc_class(s, gt)) * 4;
        const kiln_bbox pb = kiln_det_box(prior + 4 * (int64_t)p);
        const float *var = prior + 4 * ((int64_t)P + p);
        kiln_bbox mbox = pb;
        if (!s->use_prior_for_matching) {
          const kiln_bbox d = kiln_det_box(loc + at);
          kiln_bbox_decode(&mbox, &pb, var, &d, s->code, s->encode_variance_in_target);
        }
        float d[4];
        loc_diffs(s, loc + at, &pb, var, &gt->box, &mbox, d);
        for (int k = 0; k < 4; k++) {
          loc_sum += loc_elem(d[k], s->loc_loss);
          if (dloc) dloc[at + k] = (float)(gloc * loc_elem_grad(d[k], s->loc_loss));
        }
        target = conf_target(s, gt);
      } else if (sel->neg[ip]) {
        target = s->background_label;
      } else {
        continue;
      }
      conf_sum += conf_loss_row(x, C, target, s->conf_loss);
      if (dconf) conf_grad_row(dconf + ip * C, x, C, target, s->conf_loss, gconf);
    }
  }
  *loss = (float)(s->loc_weight * loc_sum / N + conf_sum / N);
  return KILN_OK;
}
