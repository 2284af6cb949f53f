/* From predictions to numbers: non-maximum suppression, DetectionOutput's detections,
 * DetectionEvaluate's true and false positives, average precision and a test pass's mAP, as the
 * fork's ApplyNMSFast, DetectionOutputLayer, DetectionEvaluateLayer, ComputeAP and
 * Solver::TestDetection compute them. Precision and recall are floats compared with double
 * literals as in ComputeAP, so the mAP kiln reports is the one Caffe prints for the same rows
 * (a recall of exactly 0.7 or 0.9 is a float just below, and does not reach that 11-point
 * threshold). Where the fork sorts without stability, ties keep their input order. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/detect.h"
#include "kiln/status.h"
#include "ops/detect_internal.h"

/* ---- suppression ---------------------------------------------------------------------------- */

void kiln_nms(const kiln_bbox *boxes, const float *scores, int n, float score_threshold,
              float nms_threshold, float eta, int top_k, int *order, int *keep, int *nkeep) {
  int m = 0;
  for (int i = 0; i < n; i++)
    if (scores[i] > score_threshold) order[m++] = i;
  kiln_det_sort_desc(order, m, scores);
  if (top_k > 0 && top_k < m) m = top_k;
  float adaptive = nms_threshold;
  int kept = 0;
  for (int k = 0; k < m; k++) {
    const int i = order[k];
    bool ok = true;
    for (int j = 0; j < kept && ok; j++) ok = kiln_bbox_iou(&boxes[i], &boxes[keep[j]]) <= adaptive;
    if (!ok) continue;
    keep[kept++] = i;
    if (eta < 1 && adaptive > 0.5f) adaptive *= eta;
  }
  *nkeep = kept;
}

/* ---- DetectionOutput ------------------------------------------------------------------------ */

/* One image's detections before keep_top_k, in class order and, within a class, in the order
 * suppression kept them (descending score). */
typedef struct dets {
  int *label, *idx;
  float *score;
  kiln_bbox *box;
  uint8_t *kept;
  int n, cap;
} dets;

static void dets_free(dets *d) {
  free(d->label);
  free(d->idx);
  free(d->score);
  free(d->box);
  free(d->kept);
}

static int dets_reserve(dets *d, int more) {
  if (d->n + more <= d->cap) return KILN_OK;
  int cap = d->cap * 2 > d->n + more ? d->cap * 2 : d->n + more;
  if (cap < 64) cap = 64;
  int *label = realloc(d->label, sizeof(int) * (size_t)cap);
  if (label) d->label = label;
  int *idx = realloc(d->idx, sizeof(int) * (size_t)cap);
  if (idx) d->idx = idx;
  float *score = realloc(d->score, sizeof(float) * (size_t)cap);
  if (score) d->score = score;
  kiln_bbox *box = realloc(d->box, sizeof(kiln_bbox) * (size_t)cap);
  if (box) d->box = box;
  uint8_t *kept = realloc(d->kept, (size_t)cap);
  if (kept) d->kept = kept;
  if (!label || !idx || !score || !box || !kept)
    return kiln_errorf(KILN_ERR_NOMEM, "DetectionOutput: no memory for %d detections", cap);
  d->cap = cap;
  return KILN_OK;
}

static int check_detect_spec(const kiln_detect_spec *s, int num, int priors) {
  if (num < 0 || priors < 0)
    return kiln_errorf(KILN_ERR_SHAPE, "DetectionOutput: %d images of %d priors", num, priors);
  if (s->num_classes < 1)
    return kiln_errorf(KILN_ERR_INVALID, "DetectionOutput: num_classes %d: expected at least 1",
                       s->num_classes);
  if (s->background_label < -1 || s->background_label >= s->num_classes)
    return kiln_errorf(KILN_ERR_INVALID, "DetectionOutput: background_label_id %d is no class of "
                       "num_classes %d (nor -1)", s->background_label, s->num_classes);
  if (s->code < KILN_BOX_CORNER || s->code > KILN_BOX_CORNER_SIZE)
    return kiln_errorf(KILN_ERR_INVALID, "DetectionOutput: code_type %d is no such value",
                       (int)s->code);
  if (!(s->nms_threshold >= 0 && isfinite(s->nms_threshold)))
    return kiln_errorf(KILN_ERR_INVALID, "DetectionOutput: nms_threshold %g: expected a value "
                       ">= 0", s->nms_threshold);
  if (!(s->eta > 0 && s->eta <= 1))
    return kiln_errorf(KILN_ERR_INVALID, "DetectionOutput: eta %g: expected a value in (0, 1]",
                       s->eta);
  if (isnan(s->confidence_threshold))
    return kiln_errorf(KILN_ERR_INVALID, "DetectionOutput: confidence_threshold is not a number");
  return KILN_OK;
}

static int append_row7(kiln_det_buf *out, float item, float label, float score,
                       const kiln_bbox *b) {
  KILN_TRY(kiln_det_buf_reserve(out, 1, 7));
  float *r = out->v + out->rows * 7;
  r[0] = item;
  r[1] = label;
  r[2] = score;
  r[3] = b->xmin;
  r[4] = b->ymin;
  r[5] = b->xmax;
  r[6] = b->ymax;
  out->rows++;
  return KILN_OK;
}

/* One image: every class suppressed apart, then the keep_top_k best of the image's, written
 * in class order. *written counts the rows. */
static int output_image(const kiln_detect_spec *s, int i, int P, const float *loc,
                        const float *conf, const float *prior, kiln_bbox *boxes, float *scores,
                        int *order, int *keep, dets *d, kiln_det_buf *out, int64_t *written) {
  const int C = s->num_classes, L = s->share_location ? 1 : C;
  d->n = 0;
  if (s->share_location)
    kiln_det_decode_all(boxes, prior, P, loc, 1, 0, s->code, s->variance_in_target);
  for (int c = 0; c < C; c++) {
    if (c == s->background_label) continue;
    if (!s->share_location)
      kiln_det_decode_all(boxes, prior, P, loc, L, c, s->code, s->variance_in_target);
    for (int p = 0; p < P; p++) scores[p] = conf[(int64_t)p * C + c];
    int nk = 0;
    kiln_nms(boxes, scores, P, s->confidence_threshold, s->nms_threshold, s->eta, s->top_k,
             order, keep, &nk);
    KILN_TRY(dets_reserve(d, nk));
    for (int k = 0; k < nk; k++) {
      d->label[d->n] = c;
      d->idx[d->n] = keep[k];
      d->score[d->n] = scores[keep[k]];
      d->box[d->n] = boxes[keep[k]];
      d->kept[d->n] = 1;
      d->n++;
    }
  }
  if (s->keep_top_k >= 0 && d->n > s->keep_top_k) {
    /* The best across classes, ties in class order; writing the survivors in their class order
     * is the fork's regrouping by label. */
    int *rank = d->idx; /* the prior indices are no longer needed */
    for (int k = 0; k < d->n; k++) rank[k] = k;
    kiln_det_sort_desc(rank, d->n, d->score);
    memset(d->kept, 0, (size_t)d->n);
    for (int k = 0; k < s->keep_top_k; k++) d->kept[rank[k]] = 1;
  }
  for (int k = 0; k < d->n; k++) {
    if (!d->kept[k]) continue;
    KILN_TRY(append_row7(out, (float)i, (float)d->label[k], d->score[k], &d->box[k]));
    (*written)++;
  }
  return KILN_OK;
}

int kiln_detection_output(const kiln_detect_spec *s, int num, int priors, const float *loc,
                          const float *conf, const float *prior, kiln_det_buf *out) {
  KILN_TRY(check_detect_spec(s, num, priors));
  const int P = priors, C = s->num_classes, L = s->share_location ? 1 : C;
  const size_t np = (size_t)(P > 0 ? P : 1);
  kiln_bbox *boxes = malloc(sizeof(kiln_bbox) * np);
  float *scores = malloc(sizeof(float) * np);
  int *order = malloc(sizeof(int) * np), *keep = malloc(sizeof(int) * np);
  dets d = {0};
  int rc = KILN_OK;
  if (!boxes || !scores || !order || !keep)
    rc = kiln_errorf(KILN_ERR_NOMEM, "DetectionOutput: no memory for %d priors", P);
  int64_t written = 0;
  const int64_t rows0 = out->rows;
  for (int i = 0; i < num && rc == KILN_OK; i++)
    rc = output_image(s, i, P, loc + (int64_t)i * P * L * 4, conf + (int64_t)i * P * C, prior,
                      boxes, scores, order, keep, &d, out, &written);
  /* Nothing detected anywhere: one row of -1 per image, its index first, as the fork writes. */
  const kiln_bbox none = {-1, -1, -1, -1};
  for (int i = 0; i < num && rc == KILN_OK && written == 0; i++)
    rc = append_row7(out, (float)i, -1, -1, &none);
  if (rc != KILN_OK) out->rows = rows0;
  free(boxes);
  free(scores);
  free(order);
  free(keep);
  dets_free(&d);
  return rc;
}

/* ---- DetectionEvaluate ---------------------------------------------------------------------- */

static bool whole(float v) { return isfinite(v) && v == floorf(v); }

/* Detection rows by image, label, descending score, then row. */
static bool det_before(int a, int b, const void *ctx) {
  const float *ra = (const float *)ctx + 7 * (int64_t)a, *rb = (const float *)ctx + 7 * (int64_t)b;
  if (ra[0] != rb[0]) return ra[0] < rb[0];
  if (ra[1] != rb[1]) return ra[1] < rb[1];
  const bool na = isnan(ra[2]), nb = isnan(rb[2]);
  if (na != nb) return nb;
  if (!na && ra[2] != rb[2]) return ra[2] > rb[2];
  return a < b;
}

/* A box in the item's pixels, as the fork's OutputBBox without resize_param: clipped to the
 * image, then scaled. */
static kiln_bbox to_pixels(kiln_bbox b, int h, int w) {
  kiln_bbox_clip(&b);
  b.xmin *= w;
  b.xmax *= w;
  b.ymin *= h;
  b.ymax *= h;
  return b;
}

/* The fork's JaccardOverlap in pixels: sizes counted inclusively (unless the image is a single
 * pixel), and the intersection too, even that of boxes that do not meet (its [0, 0, 0, 0] then
 * counts one pixel), so a detection's overlaps are never all zero. */
static float iou_pixels(const kiln_bbox *a, const kiln_bbox *b, bool unit_image) {
  kiln_bbox in;
  kiln_bbox_intersect(a, b, &in);
  const float iw = in.xmax - in.xmin + 1, ih = in.ymax - in.ymin + 1;
  if (!(iw > 0 && ih > 0)) return 0;
  const float inter = iw * ih;
  return inter / (kiln_bbox_size(a, unit_image) + kiln_bbox_size(b, unit_image) - inter);
}

static int check_eval_spec(const kiln_evaluate_spec *s, int num, int64_t ndet, int64_t ngt) {
  if (num < 0 || ndet < 0 || ngt < 0)
    return kiln_errorf(KILN_ERR_SHAPE, "DetectionEvaluate: %d images, %lld detection rows, %lld "
                       "ground truth rows", num, (long long)ndet, (long long)ngt);
  if (s->num_classes < 1 || s->background_label < -1 || s->background_label >= s->num_classes)
    return kiln_errorf(KILN_ERR_INVALID, "DetectionEvaluate: num_classes %d with "
                       "background_label_id %d", s->num_classes, s->background_label);
  if (!isfinite(s->overlap_threshold))
    return kiln_errorf(KILN_ERR_INVALID, "DetectionEvaluate: overlap_threshold is not a number");
  if (s->img_h && (s->n_sizes < 1 || s->offset < 0 || !s->img_w))
    return kiln_errorf(KILN_ERR_INVALID, "DetectionEvaluate: %lld image sizes from offset %lld",
                       (long long)s->n_sizes, (long long)s->offset);
  return KILN_OK;
}

/* The rows to evaluate into idx (sorted), their count into *n; a bad row is KILN_ERR_DATA. */
static int pick_detections(const kiln_evaluate_spec *s, int num, const float *det, int64_t ndet,
                           int *idx, int *n) {
  int m = 0;
  for (int64_t r = 0; r < ndet; r++) {
    const float *v = det + 7 * r;
    if (v[0] == -1) continue;
    if (!whole(v[0]) || v[0] < 0 || v[0] >= num)
      return kiln_errorf(KILN_ERR_DATA, "detection row %lld: item %g is no image of the batch "
                         "[0, %d)", (long long)r, v[0], num);
    if (!whole(v[1]) || v[1] > 1e9)
      return kiln_errorf(KILN_ERR_DATA, "detection row %lld: label %g is not a class",
                         (long long)r, v[1]);
    if (v[1] < 0) continue; /* DetectionOutput's row for an image without detections */
    if (v[1] == s->background_label)
      return kiln_errorf(KILN_ERR_DATA, "detection row %lld: label %g is the background",
                         (long long)r, v[1]);
    idx[m++] = (int)r;
  }
  kiln_det_sort(idx, m, det_before, det);
  *n = m;
  return KILN_OK;
}

static int append_row5(kiln_det_buf *out, float a, float b, float c, float d, float e) {
  KILN_TRY(kiln_det_buf_reserve(out, 1, 5));
  float *r = out->v + out->rows * 5;
  r[0] = a;
  r[1] = b;
  r[2] = c;
  r[3] = d;
  r[4] = e;
  out->rows++;
  return KILN_OK;
}

/* The detections idx[0 .. n) of one image and label against that image's boxes gt[0 .. G). */
static int evaluate_group(const kiln_evaluate_spec *s, const float *det, const int *idx, int n,
                          const kiln_gt_box *gt, int G, int *cand, uint8_t *visited,
                          kiln_det_buf *out) {
  const int item = (int)det[7 * (int64_t)idx[0]], label = (int)det[7 * (int64_t)idx[0] + 1];
  int nc = 0;
  for (int g = 0; g < G; g++)
    if (gt[g].label == label) {
      cand[nc] = g;
      visited[nc++] = 0;
    }
  int h = 1, w = 1;
  if (s->img_h) {
    const int64_t at = (s->offset + item) % s->n_sizes;
    h = s->img_h[at];
    w = s->img_w[at];
    if (h < 1 || w < 1)
      return kiln_errorf(KILN_ERR_INVALID, "DetectionEvaluate: image %lld of the size list is "
                         "%d x %d", (long long)at, h, w);
  }
  const bool unit = !(w > 1 || h > 1);
  for (int k = 0; k < n; k++) {
    const float *v = det + 7 * (int64_t)idx[k];
    float tp = 0, fp = 1;
    if (nc > 0) {
      kiln_bbox b = kiln_det_box(v + 3);
      if (s->img_h) b = to_pixels(b, h, w);
      float best = -1;
      int jmax = -1;
      for (int j = 0; j < nc; j++) {
        kiln_bbox g = gt[cand[j]].box;
        float o;
        if (s->img_h) {
          g = to_pixels(g, h, w);
          o = iou_pixels(&b, &g, unit);
        } else {
          o = kiln_bbox_iou(&b, &g);
        }
        if (o > best) {
          best = o;
          jmax = j;
        }
      }
      if (best >= s->overlap_threshold) {
        fp = 0;
        if (s->evaluate_difficult_gt || !gt[cand[jmax]].difficult) {
          tp = !visited[jmax];
          fp = visited[jmax];
          visited[jmax] = 1;
        }
      }
    }
    KILN_TRY(append_row5(out, (float)item, (float)label, v[2], tp, fp));
  }
  return KILN_OK;
}

static int evaluate(const kiln_evaluate_spec *s, int num, const float *det, int64_t ndet,
                    const float *gt_rows, int64_t gt_nrows, kiln_gt_box **gt, int64_t *gt_cap,
                    int64_t *first, int *idx, kiln_det_buf *out) {
  KILN_TRY(kiln_gt_group(gt_rows, gt_nrows, num, true, gt, gt_cap, first));
  for (int64_t r = 0; r < gt_nrows; r++)
    if (gt_rows[8 * r] != -1 && gt_rows[8 * r + 1] == s->background_label)
      return kiln_errorf(KILN_ERR_DATA, "ground truth row %lld: label %g is the background",
                         (long long)r, gt_rows[8 * r + 1]);
  for (int c = 0; c < s->num_classes; c++) {
    if (c == s->background_label) continue;
    int64_t pos = 0;
    for (int64_t g = 0; g < first[num]; g++)
      pos += (*gt)[g].label == c && (s->evaluate_difficult_gt || !(*gt)[g].difficult);
    KILN_TRY(append_row5(out, -1, (float)c, (float)pos, -1, -1));
  }
  int n = 0;
  KILN_TRY(pick_detections(s, num, det, ndet, idx, &n));
  int64_t gmax = 1;
  for (int i = 0; i < num; i++)
    if (first[i + 1] - first[i] > gmax) gmax = first[i + 1] - first[i];
  int *cand = malloc(sizeof(int) * (size_t)gmax);
  uint8_t *visited = malloc((size_t)gmax);
  int rc = cand && visited ? KILN_OK
                           : kiln_errorf(KILN_ERR_NOMEM, "DetectionEvaluate: no memory for %lld "
                                         "boxes", (long long)gmax);
  for (int k = 0; k < n && rc == KILN_OK;) {
    const float *v = det + 7 * (int64_t)idx[k];
    int e = k + 1;
    while (e < n && det[7 * (int64_t)idx[e]] == v[0] && det[7 * (int64_t)idx[e] + 1] == v[1]) e++;
    const int item = (int)v[0];
    rc = evaluate_group(s, det, idx + k, e - k, *gt + first[item],
                        (int)(first[item + 1] - first[item]), cand, visited, out);
    k = e;
  }
  free(cand);
  free(visited);
  return rc;
}

int kiln_detection_evaluate(const kiln_evaluate_spec *s, int num, const float *det,
                            int64_t ndet, const float *gt_rows, int64_t gt_nrows,
                            kiln_det_buf *out) {
  KILN_TRY(check_eval_spec(s, num, ndet, gt_nrows));
  if (ndet > INT32_MAX)
    return kiln_errorf(KILN_ERR_SHAPE, "DetectionEvaluate: %lld detection rows",
                       (long long)ndet);
  kiln_gt_box *gt = NULL;
  int64_t gt_cap = 0;
  int64_t *first = malloc(sizeof(int64_t) * ((size_t)num + 1));
  int *idx = malloc(sizeof(int) * (size_t)(ndet > 0 ? ndet : 1));
  const int64_t rows0 = out->rows;
  int rc = first && idx ? evaluate(s, num, det, ndet, gt_rows, gt_nrows, &gt, &gt_cap, first, idx,
                                   out)
                        : kiln_errorf(KILN_ERR_NOMEM, "DetectionEvaluate: no memory for %lld "
                                      "detections", (long long)ndet);
  if (rc != KILN_OK) out->rows = rows0;
  free(gt);
  free(first);
  free(idx);
  return rc;
}

/* ---- average precision ---------------------------------------------------------------------- */

static const char *const ap_names[] = {"11point", "MaxIntegral", "Integral"};

int kiln_ap_version_parse(const char *name, kiln_ap_version *v) {
  for (int i = 0; i < 3; i++)
    if (name && strcmp(name, ap_names[i]) == 0) {
      *v = (kiln_ap_version)i;
      return KILN_OK;
    }
  return kiln_errorf(KILN_ERR_INVALID, "ap_version '%s': expected 11point, MaxIntegral or "
                     "Integral", name ? name : "(none)");
}

const char *kiln_ap_version_name(kiln_ap_version v) {
  return (unsigned)v < 3 ? ap_names[v] : "unknown";
}

double kiln_average_precision(const float *score, const uint8_t *tp, const uint8_t *fp,
                              int64_t n, int64_t npos, kiln_ap_version v, int *order) {
  if (npos <= 0 || n <= 0 || (unsigned)v > KILN_AP_INTEGRAL) return 0;
  int m = 0;
  int64_t ttp = 0, tfp = 0;
  for (int64_t i = 0; i < n; i++)
    if (tp[i] || fp[i]) {
      order[m++] = (int)i;
      ttp += tp[i] != 0;
      tfp += fp[i] != 0;
    }
  if (m == 0) return 0;
  kiln_det_sort_desc(order, m, score);
  const float eps = 1e-6f;
  float ap = 0;
  if (v == KILN_AP_11POINT || v == KILN_AP_INTEGRAL) {
    float max_prec[11] = {0}, prev_rec = 0;
    int64_t ctp = 0, cfp = 0;
    for (int k = 0; k < m; k++) {
      ctp += tp[order[k]] != 0;
      cfp += fp[order[k]] != 0;
      const float prec = (float)ctp / (float)(ctp + cfp), rec = (float)ctp / (float)npos;
      if (v == KILN_AP_INTEGRAL) {
        if (fabsf(rec - prev_rec) > eps) ap += prec * fabsf(rec - prev_rec);
        prev_rec = rec;
        continue;
      }
      for (int j = 0; j <= 10; j++)
        if (!(rec < j / 10.) && max_prec[j] < prec) max_prec[j] = prec;
    }
    if (v == KILN_AP_11POINT)
      for (int j = 10; j >= 0; j--) ap += max_prec[j] / 11;
    return ap;
  }
  /* MaxIntegral walks from the last point back: the counts there are the totals, and each step
   * back takes the later point's flags off. */
  int64_t ctp = ttp, cfp = tfp;
  float cur_rec = (float)ctp / (float)npos, cur_prec = (float)ctp / (float)(ctp + cfp);
  for (int k = m - 2; k >= 0; k--) {
    ctp -= tp[order[k + 1]] != 0;
    cfp -= fp[order[k + 1]] != 0;
    const float prec = (float)ctp / (float)(ctp + cfp), rec = (float)ctp / (float)npos;
    cur_prec = prec > cur_prec ? prec : cur_prec;
    if (fabsf(cur_rec - rec) > eps) ap += cur_prec * fabsf(cur_rec - rec);
    cur_rec = rec;
  }
  ap += cur_rec * cur_prec;
  return ap;
}

/* ---- mAP ------------------------------------------------------------------------------------ */

typedef struct map_class {
  int label;
  bool has_positives;
  int64_t positives;
  float *score;
  uint8_t *tp, *fp;
  int64_t n, cap;
} map_class;

struct kiln_map {
  map_class *c; /* by ascending label */
  int n, cap;
};

kiln_map *kiln_map_new(void) { return calloc(1, sizeof(kiln_map)); }

void kiln_map_reset(kiln_map *m) {
  for (int i = 0; i < m->n; i++) {
    free(m->c[i].score);
    free(m->c[i].tp);
    free(m->c[i].fp);
  }
  m->n = 0;
}

void kiln_map_free(kiln_map *m) {
  if (!m) return;
  kiln_map_reset(m);
  free(m->c);
  free(m);
}

/* The class of `label`, added in its place when new; NULL when out of memory. */
static map_class *map_class_of(kiln_map *m, int label) {
  int lo = 0, hi = m->n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (m->c[mid].label < label) lo = mid + 1;
    else hi = mid;
  }
  if (lo < m->n && m->c[lo].label == label) return &m->c[lo];
  if (m->n == m->cap) {
    const int cap = m->cap ? 2 * m->cap : 32;
    map_class *c = realloc(m->c, sizeof(map_class) * (size_t)cap);
    if (!c) return NULL;
    m->c = c;
    m->cap = cap;
  }
  memmove(&m->c[lo + 1], &m->c[lo], sizeof(map_class) * (size_t)(m->n - lo));
  memset(&m->c[lo], 0, sizeof(map_class));
  m->c[lo].label = label;
  m->n++;
  return &m->c[lo];
}

static int check_map_row(const float *v, int64_t r) {
  if (!whole(v[0]) || v[0] < -1)
    return kiln_errorf(KILN_ERR_DATA, "evaluation row %lld: item %g: expected -1 (positives) or "
                       "an image index", (long long)r, v[0]);
  if (!whole(v[1]) || v[1] < 0 || v[1] > 1e9)
    return kiln_errorf(KILN_ERR_DATA, "evaluation row %lld: label %g: expected a class >= 0",
                       (long long)r, v[1]);
  if (v[0] == -1) {
    if (!whole(v[2]) || v[2] < 0 || v[2] > 1e15)
      return kiln_errorf(KILN_ERR_DATA, "evaluation row %lld: %g positives: expected a count",
                         (long long)r, v[2]);
    return KILN_OK;
  }
  if (!((v[3] == 1 && v[4] == 0) || (v[3] == 0 && v[4] == 1) || (v[3] == 0 && v[4] == 0)))
    return kiln_errorf(KILN_ERR_DATA, "evaluation row %lld: tp %g, fp %g: expected (1, 0), "
                       "(0, 1) or (0, 0)", (long long)r, v[3], v[4]);
  return KILN_OK;
}

int kiln_map_add(kiln_map *m, const float *rows, int64_t nrows) {
  /* every row checked first, so that a bad one adds nothing */
  for (int64_t r = 0; r < nrows; r++) KILN_TRY(check_map_row(rows + 5 * r, r));
  for (int64_t r = 0; r < nrows; r++) {
    const float *v = rows + 5 * r;
    if (v[0] != -1 && v[3] == 0 && v[4] == 0) continue; /* matched a difficult box */
    map_class *c = map_class_of(m, (int)v[1]);
    if (!c) return kiln_errorf(KILN_ERR_NOMEM, "mAP: no memory for another class");
    if (v[0] == -1) {
      c->has_positives = true;
      c->positives += (int64_t)v[2];
      continue;
    }
    if (c->n == c->cap) {
      const int64_t cap = c->cap ? 2 * c->cap : 256;
      float *score = realloc(c->score, sizeof(float) * (size_t)cap);
      if (score) c->score = score;
      uint8_t *tp = realloc(c->tp, (size_t)cap);
      if (tp) c->tp = tp;
      uint8_t *fp = realloc(c->fp, (size_t)cap);
      if (fp) c->fp = fp;
      if (!score || !tp || !fp)
        return kiln_errorf(KILN_ERR_NOMEM, "mAP: no memory for %lld detections of class %d",
                           (long long)cap, c->label);
      c->cap = cap;
    }
    c->score[c->n] = v[2];
    c->tp[c->n] = v[3] == 1;
    c->fp[c->n] = v[4] == 1;
    c->n++;
  }
  return KILN_OK;
}

/* Each class with a positives row, ascending: its label, AP and positives; *count of them. */
static int map_classes(kiln_map *m, kiln_ap_version v, int cap, int *label, double *ap,
                       int64_t *positives, int *count, double *sum) {
  if ((unsigned)v > KILN_AP_INTEGRAL)
    return kiln_errorf(KILN_ERR_INVALID, "mAP: ap_version %d is no such version", (int)v);
  int64_t nmax = 1;
  for (int i = 0; i < m->n; i++)
    if (m->c[i].n > nmax) nmax = m->c[i].n;
  int *order = malloc(sizeof(int) * (size_t)nmax);
  if (!order) return kiln_errorf(KILN_ERR_NOMEM, "mAP: no memory to sort %lld detections",
                                 (long long)nmax);
  int k = 0;
  *sum = 0;
  for (int i = 0; i < m->n; i++) {
    const map_class *c = &m->c[i];
    if (!c->has_positives) continue;
    const double a = kiln_average_precision(c->score, c->tp, c->fp, c->n, c->positives, v, order);
    *sum += a;
    if (k < cap) {
      label[k] = c->label;
      ap[k] = a;
      positives[k] = c->positives;
    }
    k++;
  }
  free(order);
  *count = k;
  return KILN_OK;
}

int kiln_map_result(kiln_map *m, kiln_ap_version v, double *map, int *nclasses) {
  int k = 0;
  double sum = 0;
  KILN_TRY(map_classes(m, v, 0, NULL, NULL, NULL, &k, &sum));
  *map = k > 0 ? sum / k : 0;
  if (nclasses) *nclasses = k;
  return KILN_OK;
}

int kiln_map_per_class(kiln_map *m, kiln_ap_version v, int cap, int *label, double *ap,
                       int64_t *positives, int *n) {
  int k = 0;
  double sum = 0;
  KILN_TRY(map_classes(m, v, cap, label, ap, positives, &k, &sum));
  *n = k < cap ? k : cap;
  return KILN_OK;
}
