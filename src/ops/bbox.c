/* Boxes (sizes, overlaps, clipping), their coding against prior boxes, PriorBox's boxes, the
 * ground truth grouped by image, and the helpers the other detection files share
 * (detect_internal.h). The arithmetic follows the fork's bbox_util.cpp and prior_box_layer.cpp
 * operation for operation, in float where the fork is in float and through double where it
 * divides by a double literal, so that the boxes a Caffe-trained SSD net was matched and
 * decoded against are the ones kiln computes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/detect.h"
#include "kiln/status.h"
#include "ops/detect_internal.h"

/* ---- boxes ---------------------------------------------------------------------------------- */

float kiln_bbox_size(const kiln_bbox *b, bool normalized) {
  if (b->xmax < b->xmin || b->ymax < b->ymin) return 0;
  const float w = b->xmax - b->xmin, h = b->ymax - b->ymin;
  return normalized ? w * h : (w + 1) * (h + 1);
}

bool kiln_bbox_intersect(const kiln_bbox *a, const kiln_bbox *b, kiln_bbox *out) {
  if (b->xmin > a->xmax || b->xmax < a->xmin || b->ymin > a->ymax || b->ymax < a->ymin) {
    out->xmin = out->ymin = out->xmax = out->ymax = 0;
    return false;
  }
  out->xmin = a->xmin > b->xmin ? a->xmin : b->xmin;
  out->ymin = a->ymin > b->ymin ? a->ymin : b->ymin;
  out->xmax = a->xmax < b->xmax ? a->xmax : b->xmax;
  out->ymax = a->ymax < b->ymax ? a->ymax : b->ymax;
  return true;
}

/* An intersection of no width or height (boxes that only touch, or an inverted box) is no
 * overlap, as in the fork's JaccardOverlap, so a degenerate ground truth box never matches. */
float kiln_bbox_iou(const kiln_bbox *a, const kiln_bbox *b) {
  kiln_bbox in;
  kiln_bbox_intersect(a, b, &in);
  const float iw = in.xmax - in.xmin, ih = in.ymax - in.ymin;
  if (!(iw > 0 && ih > 0)) return 0;
  const float inter = iw * ih;
  return inter / (kiln_bbox_size(a, true) + kiln_bbox_size(b, true) - inter);
}

/* The fork's std::min(std::max(v, 0), 1): a NaN stays NaN. */
static float clip01(float v) {
  v = v < 0 ? 0 : v;
  return 1 < v ? 1 : v;
}

void kiln_bbox_clip(kiln_bbox *b) {
  b->xmin = clip01(b->xmin);
  b->ymin = clip01(b->ymin);
  b->xmax = clip01(b->xmax);
  b->ymax = clip01(b->ymax);
}

/* ---- coding --------------------------------------------------------------------------------- */

void kiln_bbox_encode(kiln_bbox *out, const kiln_bbox *p, const float var[4], const kiln_bbox *g,
                      kiln_box_code code, bool variance_in_target) {
  /* With the variances in the target they are left out, which dividing by 1 does exactly. */
  const float one[4] = {1, 1, 1, 1};
  const float *v = variance_in_target ? one : var;
  switch (code) {
    case KILN_BOX_CORNER:
      out->xmin = (g->xmin - p->xmin) / v[0];
      out->ymin = (g->ymin - p->ymin) / v[1];
      out->xmax = (g->xmax - p->xmax) / v[2];
      out->ymax = (g->ymax - p->ymax) / v[3];
      return;
    case KILN_BOX_CENTER_SIZE: {
      const float pw = p->xmax - p->xmin, ph = p->ymax - p->ymin;
      const float pcx = (float)((p->xmin + p->xmax) / 2.), pcy = (float)((p->ymin + p->ymax) / 2.);
      const float gw = g->xmax - g->xmin, gh = g->ymax - g->ymin;
      const float gcx = (float)((g->xmin + g->xmax) / 2.), gcy = (float)((g->ymin + g->ymax) / 2.);
      out->xmin = (gcx - pcx) / pw / v[0];
      out->ymin = (gcy - pcy) / ph / v[1];
      out->xmax = logf(gw / pw) / v[2];
      out->ymax = logf(gh / ph) / v[3];
      return;
    }
    case KILN_BOX_CORNER_SIZE: {
      const float pw = p->xmax - p->xmin, ph = p->ymax - p->ymin;
      out->xmin = (g->xmin - p->xmin) / pw / v[0];
      out->ymin = (g->ymin - p->ymin) / ph / v[1];
      out->xmax = (g->xmax - p->xmax) / pw / v[2];
      out->ymax = (g->ymax - p->ymax) / ph / v[3];
      return;
    }
  }
  out->xmin = out->ymin = out->xmax = out->ymax = NAN; /* no such code: visibly no box */
}

void kiln_bbox_decode(kiln_bbox *out, const kiln_bbox *p, const float var[4], const kiln_bbox *d,
                      kiln_box_code code, bool variance_in_target) {
  const float one[4] = {1, 1, 1, 1};
  const float *v = variance_in_target ? one : var;
  switch (code) {
    case KILN_BOX_CORNER:
      out->xmin = p->xmin + v[0] * d->xmin;
      out->ymin = p->ymin + v[1] * d->ymin;
      out->xmax = p->xmax + v[2] * d->xmax;
      out->ymax = p->ymax + v[3] * d->ymax;
      return;
    case KILN_BOX_CENTER_SIZE: {
      const float pw = p->xmax - p->xmin, ph = p->ymax - p->ymin;
      const float pcx = (float)((p->xmin + p->xmax) / 2.), pcy = (float)((p->ymin + p->ymax) / 2.);
      const float cx = v[0] * d->xmin * pw + pcx, cy = v[1] * d->ymin * ph + pcy;
      const float w = expf(v[2] * d->xmax) * pw, h = expf(v[3] * d->ymax) * ph;
      out->xmin = (float)(cx - w / 2.);
      out->ymin = (float)(cy - h / 2.);
      out->xmax = (float)(cx + w / 2.);
      out->ymax = (float)(cy + h / 2.);
      return;
    }
    case KILN_BOX_CORNER_SIZE: {
      const float pw = p->xmax - p->xmin, ph = p->ymax - p->ymin;
      out->xmin = p->xmin + v[0] * d->xmin * pw;
      out->ymin = p->ymin + v[1] * d->ymin * ph;
      out->xmax = p->xmax + v[2] * d->xmax * pw;
      out->ymax = p->ymax + v[3] * d->ymax * ph;
      return;
    }
  }
  out->xmin = out->ymin = out->xmax = out->ymax = NAN;
}

void kiln_det_decode_all(kiln_bbox *out, const float *prior, int P, const float *loc, int L,
                         int c, kiln_box_code code, bool variance_in_target) {
  for (int p = 0; p < P; p++) {
    const kiln_bbox pb = kiln_det_box(prior + 4 * (int64_t)p);
    const kiln_bbox d = kiln_det_box(loc + ((int64_t)p * L + c) * 4);
    kiln_bbox_decode(&out[p], &pb, prior + 4 * ((int64_t)P + p), &d, code, variance_in_target);
  }
}

/* ---- the index sort ------------------------------------------------------------------------ */

static void sift_down(int *idx, int root, int n, kiln_det_before before, const void *ctx) {
  for (;;) {
    int child = 2 * root + 1;
    if (child >= n) return;
    /* a max-heap of the order: the element that goes last sits at the root */
    if (child + 1 < n && before(idx[child], idx[child + 1], ctx)) child++;
    if (!before(idx[root], idx[child], ctx)) return;
    const int t = idx[root];
    idx[root] = idx[child];
    idx[child] = t;
    root = child;
  }
}

void kiln_det_sort(int *idx, int n, kiln_det_before before, const void *ctx) {
  for (int i = n / 2 - 1; i >= 0; i--) sift_down(idx, i, n, before, ctx);
  for (int end = n - 1; end > 0; end--) {
    const int t = idx[0];
    idx[0] = idx[end];
    idx[end] = t;
    sift_down(idx, 0, end, before, ctx);
  }
}

static bool desc_before(int a, int b, const void *ctx) {
  const float *key = ctx;
  const float ka = key[a], kb = key[b];
  const bool na = isnan(ka), nb = isnan(kb);
  if (na != nb) return nb;
  if (!na && ka != kb) return ka > kb;
  return a < b;
}

void kiln_det_sort_desc(int *idx, int n, const float *key) {
  kiln_det_sort(idx, n, desc_before, key);
}

void kiln_det_top_desc(int *idx, int n, const float *key, int k) {
  if (k >= n) {
    kiln_det_sort_desc(idx, n, key);
    return;
  }
  if (k <= 0) return;
  /* a heap of the first k whose root is the one of them that sorts last; each later index that
   * sorts before it takes its place */
  for (int i = k / 2 - 1; i >= 0; i--) sift_down(idx, i, k, desc_before, key);
  for (int i = k; i < n; i++)
    if (desc_before(idx[i], idx[0], key)) {
      const int t = idx[0];
      idx[0] = idx[i];
      idx[i] = t;
      sift_down(idx, 0, k, desc_before, key);
    }
  kiln_det_sort_desc(idx, k, key);
}

/* ---- PriorBox ------------------------------------------------------------------------------ */

int kiln_prior_per_cell(const kiln_prior_spec *s) { return s->n_min * s->n_ratio + s->n_max; }

/* One box of side bw x bh centred at (cx, cy) in pixels, as the fork writes it: the half side
 * through double, then divided by the image size. */
static void put_box(float *out, int64_t *k, float cx, float cy, float bw, float bh,
                    const kiln_prior_spec *s) {
  out[(*k)++] = (float)((cx - bw / 2.) / s->img_w);
  out[(*k)++] = (float)((cy - bh / 2.) / s->img_h);
  out[(*k)++] = (float)((cx + bw / 2.) / s->img_w);
  out[(*k)++] = (float)((cy + bh / 2.) / s->img_h);
}

void kiln_prior_boxes(float *out, const kiln_prior_spec *s) {
  const int64_t dim = (int64_t)s->layer_h * s->layer_w * kiln_prior_per_cell(s) * 4;
  int64_t k = 0;
  for (int h = 0; h < s->layer_h; h++) {
    for (int w = 0; w < s->layer_w; w++) {
      const float cx = (w + s->offset) * s->step_w, cy = (h + s->offset) * s->step_h;
      for (int m = 0; m < s->n_min; m++) {
        /* The fork's layer reads each size into an int: SSD512's 35.84 draws 35-pixel boxes. */
        const int mn = (int)s->min_size[m];
        put_box(out, &k, cx, cy, (float)mn, (float)mn, s);
        if (s->n_max > 0) {
          const float side = (float)sqrt((double)((int64_t)mn * (int)s->max_size[m]));
          put_box(out, &k, cx, cy, side, side, s);
        }
        for (int r = 0; r < s->n_ratio; r++) {
          const float ar = s->ratio[r];
          if (fabs(ar - 1.) < 1e-6) continue;
          put_box(out, &k, cx, cy, mn * sqrtf(ar), mn / sqrtf(ar), s);
        }
      }
    }
  }
  if (s->clip)
    for (int64_t d = 0; d < dim; d++) out[d] = clip01(out[d]);
  float *var = out + dim;
  for (int64_t d = 0; d < dim; d++)
    var[d] = s->n_variance == 4 ? s->variance[d % 4] : s->n_variance == 1 ? s->variance[0] : 0.1f;
}

/* Sizes are truncated to whole pixels (kiln_prior_boxes) and multiplied as integers; this bound
 * keeps both defined. */
#define PRIOR_SIZE_LIMIT 1e7

int kiln_prior_check(const kiln_prior_spec *s) {
  if (s->layer_h < 1 || s->layer_w < 1)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: the feature map is %d x %d: it has no cells",
                       s->layer_h, s->layer_w);
  if (s->img_h < 1 || s->img_w < 1)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: the image is %d x %d (img_h x img_w): "
                       "expected positive sizes", s->img_h, s->img_w);
  if (!(s->step_h > 0 && s->step_w > 0 && isfinite(s->step_h) && isfinite(s->step_w)))
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: step_h %g, step_w %g: expected positive "
                       "steps", s->step_h, s->step_w);
  if (!isfinite(s->offset))
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: offset %g is not a number", s->offset);
  if (s->n_min < 1 || s->n_min > KILN_PRIOR_MAX_SIZES)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: %d min_size values: expected 1 to %d",
                       s->n_min, KILN_PRIOR_MAX_SIZES);
  if (s->n_max != 0 && s->n_max != s->n_min)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: %d max_size values for %d min_size values: "
                       "expected none or one for each", s->n_max, s->n_min);
  for (int i = 0; i < s->n_min; i++) {
    if (!(s->min_size[i] >= 1 && s->min_size[i] <= PRIOR_SIZE_LIMIT))
      return kiln_errorf(KILN_ERR_INVALID, "PriorBox: min_size[%d] = %g: expected a size in "
                         "pixels from 1 to %g (the fork truncates sizes to whole pixels)", i,
                         s->min_size[i], PRIOR_SIZE_LIMIT);
    if (s->n_max > 0 && !(s->max_size[i] > s->min_size[i] && s->max_size[i] <= PRIOR_SIZE_LIMIT))
      return kiln_errorf(KILN_ERR_INVALID, "PriorBox: max_size[%d] = %g: expected more than "
                         "min_size[%d] = %g and at most %g", i, s->max_size[i], i,
                         s->min_size[i], PRIOR_SIZE_LIMIT);
  }
  if (s->n_ratio < 1 || s->n_ratio > KILN_PRIOR_MAX_RATIOS)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: %d aspect ratios after expansion: expected "
                       "1 to %d", s->n_ratio, KILN_PRIOR_MAX_RATIOS);
  if (!(fabs(s->ratio[0] - 1.) < 1e-6))
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: expanded aspect ratio[0] = %g: the expanded "
                       "list starts with 1", s->ratio[0]);
  for (int r = 1; r < s->n_ratio; r++) {
    if (!(s->ratio[r] > 0 && isfinite(s->ratio[r])))
      return kiln_errorf(KILN_ERR_INVALID, "PriorBox: aspect ratio[%d] = %g: expected a "
                         "positive ratio", r, s->ratio[r]);
    /* a second 1 would draw no box, and the count per cell assumes every other ratio does */
    if (fabs(s->ratio[r] - 1.) < 1e-6)
      return kiln_errorf(KILN_ERR_INVALID, "PriorBox: expanded aspect ratio[%d] = %g repeats the "
                         "ratio 1", r, s->ratio[r]);
  }
  if (s->n_variance != 0 && s->n_variance != 1 && s->n_variance != 4)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: %d variance values: expected 1 or 4 (or "
                       "none, 0.1)", s->n_variance);
  for (int i = 0; i < s->n_variance; i++)
    if (!(s->variance[i] > 0 && isfinite(s->variance[i])))
      return kiln_errorf(KILN_ERR_INVALID, "PriorBox: variance[%d] = %g: expected a positive "
                         "value", i, s->variance[i]);
  /* the priors are counted in int by the layers and the functions that take them */
  const int64_t priors = (int64_t)s->layer_h * s->layer_w * kiln_prior_per_cell(s);
  if (priors > INT32_MAX / 8)
    return kiln_errorf(KILN_ERR_INVALID, "PriorBox: %d x %d cells of %d priors make %lld "
                       "priors: too many", s->layer_h, s->layer_w, kiln_prior_per_cell(s),
                       (long long)priors);
  return KILN_OK;
}

/* ---- growing arrays ------------------------------------------------------------------------ */

void kiln_det_buf_free(kiln_det_buf *b) {
  free(b->v);
  b->v = NULL;
  b->rows = b->cap = 0;
}

int kiln_det_buf_reserve(kiln_det_buf *b, int64_t more, int width) {
  const int64_t need = (b->rows + more) * width;
  if (need <= b->cap) return KILN_OK;
  int64_t cap = b->cap * 2 > need ? b->cap * 2 : need;
  if (cap < 64) cap = 64;
  float *v = realloc(b->v, sizeof(float) * (size_t)cap);
  if (!v)
    return kiln_errorf(KILN_ERR_NOMEM, "detection rows: cannot grow to %lld values",
                       (long long)cap);
  b->v = v;
  b->cap = cap;
  return KILN_OK;
}

/* ---- ground truth -------------------------------------------------------------------------- */

static bool whole(float v) { return isfinite(v) && v == floorf(v); }

int kiln_gt_group(const float *rows, int64_t nrows, int num, bool keep_difficult,
                  kiln_gt_box **out, int64_t *cap, int64_t *first) {
  if (num < 0) return kiln_errorf(KILN_ERR_INVALID, "ground truth: batch of %d images", num);
  for (int i = 0; i <= num; i++) first[i] = 0;
  for (int64_t r = 0; r < nrows; r++) {
    const float *v = rows + 8 * r;
    if (v[0] == -1) continue;
    if (!whole(v[0]) || v[0] < 0 || v[0] >= num)
      return kiln_errorf(KILN_ERR_DATA, "ground truth row %lld: item %g is no image of the "
                         "batch (expected an integer in [0, %d), or -1 for none)",
                         (long long)r, v[0], num);
    if (!whole(v[1]) || v[1] < 0 || v[1] > 1e9)
      return kiln_errorf(KILN_ERR_DATA, "ground truth row %lld: label %g: expected an integer "
                         ">= 0", (long long)r, v[1]);
    if (!(isfinite(v[3]) && isfinite(v[4]) && isfinite(v[5]) && isfinite(v[6])))
      return kiln_errorf(KILN_ERR_DATA, "ground truth row %lld: box (%g, %g, %g, %g) is not "
                         "finite", (long long)r, v[3], v[4], v[5], v[6]);
    if (!keep_difficult && v[7] != 0) continue;
    first[(int)v[0] + 1]++;
  }
  for (int i = 0; i < num; i++) first[i + 1] += first[i];
  const int64_t total = first[num];
  if (total > *cap) {
    kiln_gt_box *g = realloc(*out, sizeof(kiln_gt_box) * (size_t)total);
    if (!g)
      return kiln_errorf(KILN_ERR_NOMEM, "ground truth: cannot hold %lld boxes",
                         (long long)total);
    *out = g;
    *cap = total;
  }
  /* Each box goes to its item's next slot, first[item] counting up to the next item's start;
   * shifting first by one place afterwards restores the starts. */
  for (int64_t r = 0; r < nrows; r++) {
    const float *v = rows + 8 * r;
    if (v[0] == -1 || (!keep_difficult && v[7] != 0)) continue;
    const int item = (int)v[0];
    kiln_gt_box *g = &(*out)[first[item]++];
    g->item = item;
    g->label = (int)v[1];
    g->difficult = v[7] != 0;
    g->box = kiln_det_box(v + 3);
  }
  for (int i = num; i > 0; i--) first[i] = first[i - 1];
  first[0] = 0;
  return KILN_OK;
}
