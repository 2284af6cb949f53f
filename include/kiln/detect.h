/* Object detection's host arithmetic (SSD, the fork of Caffe by Wei Liu): boxes and their
 * coding against prior boxes, PriorBox's boxes, the matching of priors to ground truth,
 * hard-negative mining, MultiBox's loss and its gradient, non-maximum suppression, a batch's
 * detections, their true and false positives, and average precision.
 *
 * This is host code over host arrays, as in the fork, whose MultiBoxLoss, DetectionOutput and
 * DetectionEvaluate run on the CPU in GPU mode too: the work is data-dependent selection
 * (sorting, greedy matching, suppression) over a few thousand boxes an image, not arithmetic
 * over tensors. The layers copy their inputs to the host, call these, and copy the results back
 * (src/layers/multibox_loss.c, detection_output.c, detection_evaluate.c); the solver and
 * `kiln test` turn DetectionEvaluate's rows into mAP; `kiln detect` decodes a deploy net's
 * detections. Nothing here keeps memory behind the caller's back: what outlives a call is in
 * the `kiln_det_buf` growing arrays, a selection or a kiln_map, each said so; scratch is
 * allocated and freed within the call (KILN_ERR_NOMEM when it cannot be). Nothing prints, every
 * error is a status code with a message (kiln_errorf). The arithmetic is the fork's operation
 * for operation (float where it is in float), so that boxes, matches and mAP are Caffe's.
 *
 * Conventions, the fork's:
 *   - boxes are normalised to the image ([0, 1], x right, y down) unless a function takes
 *     `normalized` false, in which case sizes count pixels inclusively (w = xmax - xmin + 1);
 *   - a prior blob is 1 x 2 x (4 P): P boxes (xmin, ymin, xmax, ymax) then their P variances;
 *   - a ground-truth blob is 1 x 1 x G x 8 rows (item, label, instance, xmin, ymin, xmax, ymax,
 *     difficult), item being the image's index in the batch; a batch without any object is one
 *     row of -1;
 *   - predictions: loc N x (P L 4) (L = 1 when locations are shared among classes, else C),
 *     conf N x (P C) scores, or probabilities for DetectionOutput;
 *   - a detection row is 7 floats (item, label, score, xmin, ymin, xmax, ymax);
 *   - DetectionEvaluate's rows are 5 floats: (-1, label, positives, -1, -1) once per class
 *     with ground truth, then (item, label, score, tp, fp) per detection. */
#ifndef KILN_DETECT_H
#define KILN_DETECT_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/backend.h"

typedef struct kiln_bbox {
  float xmin, ymin, xmax, ymax;
} kiln_bbox;

/* PriorBoxParameter.CodeType's values. */
typedef enum { KILN_BOX_CORNER = 1, KILN_BOX_CENTER_SIZE = 2, KILN_BOX_CORNER_SIZE = 3 } kiln_box_code;

/* Area; 0 for a box with xmax < xmin or ymax < ymin. Not normalized: (w + 1) (h + 1). */
float kiln_bbox_size(const kiln_bbox *b, bool normalized);
/* Intersection over union (the fork's JaccardOverlap, normalized); 0 when the intersection has
 * no width or no height (boxes that only touch; an inverted box). */
float kiln_bbox_iou(const kiln_bbox *a, const kiln_bbox *b);
/* Intersection of a and b into *out; false (and *out all zero) when they do not meet (boxes
 * that touch meet, in a box of no area). */
bool kiln_bbox_intersect(const kiln_bbox *a, const kiln_bbox *b, kiln_bbox *out);
/* Each coordinate into [0, 1]. */
void kiln_bbox_clip(kiln_bbox *b);

/* The regression target of box `gt` against `prior` (EncodeBBox) and its inverse (DecodeBBox).
 * var: the prior's four variances. variance_in_target: the variances are already in the
 * target, so encoding and decoding leave them out. CENTER_SIZE: ((cx - pcx) / pw / v0,
 * (cy - pcy) / ph / v1, log(w / pw) / v2, log(h / ph) / v3); CORNER: (x - px) / v per corner;
 * CORNER_SIZE: the corner offsets divided by the prior's width and height. Decoding is the
 * exact inverse, without clipping. A code outside the three gives NaN coordinates. */
void kiln_bbox_encode(kiln_bbox *out, const kiln_bbox *prior, const float var[4],
                      const kiln_bbox *gt, kiln_box_code code, bool variance_in_target);
void kiln_bbox_decode(kiln_bbox *out, const kiln_bbox *prior, const float var[4],
                      const kiln_bbox *pred, kiln_box_code code, bool variance_in_target);

/* ---- PriorBox ---------------------------------------------------------------------------- */

#define KILN_PRIOR_MAX_SIZES 16
#define KILN_PRIOR_MAX_RATIOS 32

/* One PriorBox layer's configuration, as the fork reads prior_box_param: the aspect ratios
 * already expanded (1 first, each given ratio once, within 1e-6, and its inverse when flipped),
 * min_size[i] paired with max_size[i] when there are max sizes (as many as min sizes). */
typedef struct kiln_prior_spec {
  int layer_h, layer_w; /* the feature map's cells */
  int img_h, img_w;     /* the image's size (img_size, img_h/img_w, else the data blob's) */
  float step_h, step_w; /* step, step_h/step_w, else img / layer */
  float offset;         /* of a cell's centre, in cells (0.5) */
  int n_min, n_max, n_ratio;
  float min_size[KILN_PRIOR_MAX_SIZES], max_size[KILN_PRIOR_MAX_SIZES];
  float ratio[KILN_PRIOR_MAX_RATIOS];
  bool clip;
  int n_variance; /* 1 (used for all four) or 4; 0: 0.1 for all four, the fork's default */
  float variance[4];
} kiln_prior_spec;

/* Priors a cell: n_min (1 + (n_ratio - 1)) + n_max. */
int kiln_prior_per_cell(const kiln_prior_spec *s);
/* The 2 x (4 P) values of the layer's top, P = layer_h layer_w per_cell: for each cell in rows,
 * centred at ((w + offset) step_w, (h + offset) step_h), for each min size: the square of min
 * size, then (with max sizes) the square of sqrt(min max), then one box for each ratio r other
 * than 1 of min_size sqrt(r) by min_size / sqrt(r), divided by the image's size; clipped to
 * [0, 1] with `clip`; then the variances. The sizes are truncated to whole pixels first, as the
 * fork's layer reads them into ints (SSD512's min_size 35.84 draws 35-pixel squares). The spec
 * must have passed kiln_prior_check. */
void kiln_prior_boxes(float *out, const kiln_prior_spec *s);
/* Checks a spec (cells, image and steps positive, min sizes of at least one pixel, max > min,
 * ratio[0] 1 and no other within 1e-6 of it, ratios and variances positive, at most the limits,
 * P within int): KILN_ERR_INVALID with a message naming the field. */
int kiln_prior_check(const kiln_prior_spec *s);

/* ---- growing arrays --------------------------------------------------------------------- */

/* A float array the functions below fill and grow (realloc); zero-initialise, free with
 * kiln_det_buf_free. rows: rows written, of `width` floats each. */
typedef struct kiln_det_buf {
  float *v;
  int64_t rows, cap; /* cap in floats */
} kiln_det_buf;
void kiln_det_buf_free(kiln_det_buf *b);

/* ---- ground truth ------------------------------------------------------------------------ */

typedef struct kiln_gt_box {
  int item, label;
  bool difficult;
  kiln_bbox box;
} kiln_gt_box;

/* The ground truth of a G x 8 blob's rows grouped by item: *out (malloc'd, grown; *cap its
 * capacity in boxes) holds the boxes in row order, first[i] .. first[i + 1] those of item i
 * (first has num + 1 entries). Rows whose item is -1 (no object) are skipped; a row whose item
 * is not an integer in [0, num), whose label is not an integer >= 0, or whose box is not finite
 * is KILN_ERR_DATA naming the row. Difficult boxes (a non-zero flag) are dropped unless
 * keep_difficult. */
int kiln_gt_group(const float *rows, int64_t nrows, int num, bool keep_difficult,
                  kiln_gt_box **out, int64_t *cap, int64_t *first);

/* ---- MultiBoxLoss ----------------------------------------------------------------------- */

typedef enum { KILN_MATCH_BIPARTITE = 0, KILN_MATCH_PER_PREDICTION = 1 } kiln_match_type;
typedef enum { KILN_MINE_NONE = 0, KILN_MINE_MAX_NEGATIVE = 1, KILN_MINE_HARD_EXAMPLE = 2 } kiln_mining;
typedef enum { KILN_LOC_L2 = 0, KILN_LOC_SMOOTH_L1 = 1 } kiln_loc_loss;
typedef enum { KILN_CONF_SOFTMAX = 0, KILN_CONF_LOGISTIC = 1 } kiln_conf_loss;
/* The normalization is backend.h's kiln_loss_norm (LossParameter.NormalizationMode's values in
 * its order: KILN_LOSS_FULL, _VALID, _BATCH, _NONE), as the other losses take it. */

/* multibox_loss_param, with loss_param's normalization. */
typedef struct kiln_multibox_spec {
  int num_classes, background_label;
  bool share_location;
  kiln_match_type match_type;
  float overlap_threshold;
  bool use_prior_for_matching; /* match the priors themselves (else the decoded predictions) */
  bool use_difficult_gt;
  kiln_mining mining;
  float neg_pos_ratio, neg_overlap;
  int sample_size;        /* HARD_EXAMPLE: examples kept an image */
  float nms_threshold;    /* HARD_EXAMPLE: nms_param's; 0: no suppression */
  int nms_top_k;          /* 0: all */
  bool use_prior_for_nms; /* HARD_EXAMPLE: suppress over the priors, not the decoded boxes */
  kiln_box_code code;
  bool encode_variance_in_target;
  bool map_object_to_agnostic;
  bool ignore_cross_boundary_bbox;
  bool bp_inside; /* a matched box's coordinate off the image adds no location loss */
  kiln_loc_loss loc_loss;
  kiln_conf_loss conf_loss;
  float loc_weight;
  kiln_loss_norm normalization;
} kiln_multibox_spec;

/* Which predictions a MultiBoxLoss pass uses: per item and prior (num x P, in that order), the
 * ground truth box it regresses to (an index into the grouped boxes, kiln_gt_group's order) or
 * -1, and whether it is a negative kept for the confidence loss. Fixed, the loss is a smooth
 * function of loc and conf, which is what the gradient tests use. Zero-initialise; grown by
 * kiln_multibox_select; free with kiln_multibox_selection_free. */
typedef struct kiln_multibox_selection {
  int num, priors;
  int32_t *match;  /* num x priors: gt index or -1 */
  uint8_t *neg;    /* num x priors: 1 for a mined negative */
  int64_t num_pos, num_neg; /* the matches (after HARD_EXAMPLE's) and the negatives */
  int64_t cap;     /* entries allocated in match and neg */
  /* the grouped ground truth the indices refer to */
  kiln_gt_box *gt;
  int64_t gt_cap;
  int64_t *first; /* num + 1 */
  int first_cap;
} kiln_multibox_selection;
void kiln_multibox_selection_free(kiln_multibox_selection *s);

/* Matches the priors of each item to its ground truth and mines the negatives, as the fork's
 * MultiBoxLoss forward does: bipartite matching (repeatedly the greatest overlap above 1e-6
 * between a free box and an unmatched prior; ties to the lower prior, then box), then for
 * PER_PREDICTION every other prior whose best overlap is at least overlap_threshold; the
 * location predictions decoded against the priors when !use_prior_for_matching; with
 * ignore_cross_boundary_bbox a box with a coordinate off [0, 1] is neither matched nor mined
 * (except by NONE). Mining per item with ground truth: MAX_NEGATIVE keeps the
 * floor(positives x neg_pos_ratio) (a float product, as the fork's) unmatched priors of best
 * overlap below neg_overlap with the largest background loss (softmax or logistic over conf, as
 * conf_loss); HARD_EXAMPLE ranks every prior by its loss (confidence against its target, plus
 * location when matched), suppresses at nms_threshold when positive (over the decoded boxes, or
 * the priors with use_prior_for_nms; boxes under 1e-5 in area dropped, nms_top_k candidates at
 * most), keeps the sample_size largest, unmatches the matched priors not kept and takes the
 * unmatched kept ones as negatives. NONE (the fork's conf loss over every prediction): every
 * unmatched prior of every item, with ground truth or not, is a negative. Ties in the losses go
 * to the lower prior index (a stable sort), so the selection is a function of the inputs.
 * A ground truth label equal to background_label, or not below num_classes (unless mapped to
 * agnostic with shared locations), is KILN_ERR_DATA naming the row, as are kiln_gt_group's. The spec is refused
 * (KILN_ERR_INVALID) where the fork's layer refuses it: mining without share_location,
 * SOFTMAX without a background class, map_object_to_agnostic with num_classes other than 2 (1
 * without background), HARD_EXAMPLE with sample_size < 1; and share_location false with
 * use_prior_for_matching false is KILN_ERR_UNSUPPORTED (the fork then matches each class apart,
 * so one prior may regress to several boxes, which a selection cannot hold). */
int kiln_multibox_select(const kiln_multibox_spec *s, int num, int priors, const float *loc,
                         const float *conf, const float *prior, const float *gt_rows,
                         int64_t gt_nrows, kiln_multibox_selection *sel);

/* The loss of a selection and its gradient: *loss = loc_weight x (location loss of the matched
 * predictions against their encoded targets, smooth L1 or half the square per coordinate) +
 * (confidence loss of the matched (target: the box's label, or background_label + 1, the one
 * object class, when map_object_to_agnostic) and the mined negatives (target: background)),
 * each divided by the normalizer N = max(1, n) (FULL: n = num x priors; VALID: the matches;
 * BATCH_SIZE: num; NONE: 1); dloc and dconf (the shapes of loc and conf, overwritten: zero
 * outside the selection; NULL: not computed) its gradient for a top gradient of 1. The
 * location prediction of a prior is loc[i][p][0] when shared, else loc[i][p][its box's label].
 * With encode_variance_in_target the fork divides both the prediction and its target by the
 * prior's variances before the location loss, and passes back the gradient with respect to
 * that quotient: kept, so dloc is then the gradient of the sum of v x loss((pred - t) / v),
 * not of *loss. With bp_inside a coordinate of the matched box (the prior, or the decoded
 * prediction) off [0, 1] adds no location loss and no gradient. A match that is no box of its
 * image is KILN_ERR_INVALID. */
int kiln_multibox_loss(const kiln_multibox_spec *s, const kiln_multibox_selection *sel,
                       const float *loc, const float *conf, const float *prior, float *loss,
                       float *dloc, float *dconf);

/* ---- suppression and DetectionOutput ----------------------------------------------------- */

/* Greedy non-maximum suppression (ApplyNMSFast): the n boxes of score above score_threshold,
 * by descending score (ties: lower index first), the first top_k of them (top_k <= 0: all);
 * each kept unless its overlap with a kept one exceeds the threshold, which after each kept
 * box is multiplied by eta while above 0.5 when eta < 1. keep (room for n) gets the kept
 * indices in order; *nkeep their count. order: scratch of n ints. */
void kiln_nms(const kiln_bbox *boxes, const float *scores, int n, float score_threshold,
              float nms_threshold, float eta, int top_k, int *order, int *keep, int *nkeep);

typedef struct kiln_detect_spec {
  int num_classes, background_label; /* background -1: none */
  bool share_location;
  float nms_threshold, eta;
  int top_k;       /* per class before suppression; <= 0: all */
  int keep_top_k;  /* per image after it, by score; -1: all */
  float confidence_threshold; /* scores at or below it are dropped */
  kiln_box_code code;
  bool variance_in_target;
} kiln_detect_spec;

/* DetectionOutput: each item's boxes decoded against the priors (not clipped), per class (the
 * background skipped) suppressed (kiln_nms with confidence_threshold as the score threshold:
 * -FLT_MAX when the layer has none), then the keep_top_k best of the item's (ties in class
 * order). Rows of 7 appended to out, items in order, classes in order within an item, by
 * descending score within a class; when no item has any detection, one row per item of
 * (item, -1, -1, -1, -1, -1, -1), as the fork writes. conf holds probabilities (after Softmax).
 * KILN_ERR_INVALID for a spec the fork refuses (eta outside (0, 1], nms_threshold < 0); on an
 * error out keeps its rows from before. */
int kiln_detection_output(const kiln_detect_spec *s, int num, int priors, const float *loc,
                          const float *conf, const float *prior, kiln_det_buf *out);

/* ---- DetectionEvaluate and average precision --------------------------------------------- */

typedef struct kiln_evaluate_spec {
  int num_classes, background_label;
  float overlap_threshold;
  bool evaluate_difficult_gt;
  /* name_size_file's sizes, per item of the whole test set in order (NULL: none, boxes stay
   * normalized); `offset` is the item index of this batch's first image in that list. */
  const int *img_h, *img_w;
  int64_t n_sizes, offset;
} kiln_evaluate_spec;

/* DetectionEvaluate: for each class but the background, one row (-1, label, positives, -1, -1),
 * positives counting the class's boxes of the batch (difficult ones only with
 * evaluate_difficult_gt); then per item, per label in ascending order, its detections by
 * descending score (item, label, score, tp, fp): a true positive when the ground truth box of
 * its item and label it overlaps most overlaps it by at least overlap_threshold and no
 * detection of higher score took that box; a false positive when the overlap is smaller, the
 * box was taken, or its item has no box of its label; neither (tp = fp = 0) when that box is
 * difficult and difficult boxes are not evaluated. With sizes, boxes are clipped to [0, 1] and
 * scaled to the item's pixels before the overlaps (sizes and intersections counted inclusively,
 * as the fork's name_size_file evaluation does); item i takes size (offset + i) mod n_sizes,
 * the list starting over as the fork's count does after a pass over the data. Detection rows of
 * item -1 or of a negative label (DetectionOutput's "none" rows) are skipped; a row whose item
 * is no integer in [0, num), or whose label is the background, and a ground truth row of the
 * background label, are KILN_ERR_DATA naming the row. Rows of 5 appended to out (on an error
 * it keeps those from before). */
int kiln_detection_evaluate(const kiln_evaluate_spec *s, int num, const float *det,
                            int64_t ndet, const float *gt_rows, int64_t gt_nrows,
                            kiln_det_buf *out);

typedef enum { KILN_AP_11POINT = 0, KILN_AP_MAX_INTEGRAL = 1, KILN_AP_INTEGRAL = 2 } kiln_ap_version;
/* "11point", "MaxIntegral", "Integral"; KILN_ERR_INVALID naming the three otherwise. */
int kiln_ap_version_parse(const char *name, kiln_ap_version *v);
const char *kiln_ap_version_name(kiln_ap_version v);

/* Average precision of one class's n detections (scores, tp and fp flags) against npos
 * positives, sorted here by descending score (ties: input order): 11point, the mean of the
 * greatest precision at recall >= t for t = 0, 0.1, ..., 1; MaxIntegral, the area under the
 * precision made non-increasing from the right; Integral, the sum of precision x recall step
 * (steps of at most 1e-6 left out). Precision and recall are floats compared with double
 * thresholds, as the fork's ComputeAP: a recall of exactly 0.7 or 0.9 is a float just below and
 * misses that 11-point threshold, as in Caffe's numbers. Detections with neither flag are left
 * out. 0 when npos is 0 or nothing is detected. order: scratch of n ints. */
double kiln_average_precision(const float *score, const uint8_t *tp, const uint8_t *fp,
                              int64_t n, int64_t npos, kiln_ap_version v, int *order);

/* A test pass's mAP (the fork's Solver::TestDetection): DetectionEvaluate's rows of every
 * batch added (positives summed per class; detections with tp = fp = 0 left out), then each
 * class's AP and their mean over every class that had a positives row, AP 0 for a class
 * without detections or positives. Opaque; kiln_map_new (NULL on out of memory),
 * kiln_map_free. */
typedef struct kiln_map kiln_map;
kiln_map *kiln_map_new(void);
void kiln_map_free(kiln_map *m);
void kiln_map_reset(kiln_map *m);
/* KILN_ERR_DATA naming the row for a row that is neither form (an item neither -1 nor an
 * image index, a label not an integer >= 0, a count not an integer >= 0; tp and fp other than
 * (1, 0), (0, 1) or (0, 0)); every row is checked before any is added. */
int kiln_map_add(kiln_map *m, const float *rows, int64_t nrows);
/* The mean AP; *nclasses (may be NULL) the classes it averages (none: *map is 0). */
int kiln_map_result(kiln_map *m, kiln_ap_version v, double *map, int *nclasses);
/* Class by class (those with a positives row), ascending label: label[i], ap[i], positives[i]
 * for i < *n, *n the classes written: all of them, or cap. */
int kiln_map_per_class(kiln_map *m, kiln_ap_version v, int cap, int *label, double *ap,
                       int64_t *positives, int *n);

#endif
