/* DetectionEvaluate (the SSD fork's, Wei Liu's Caffe): a batch's true and false positives, for
 * the mAP of a test pass. Bottoms: the detections (1 x 1 x D x 7, DetectionOutput's rows) and the
 * ground truth (1 x 1 x G x 8, the data layer's rows); one top 1 x 1 x R x 5 of rows:
 * (-1, label, positives, -1, -1) once for each class but the background (positives: its boxes in
 * the batch, difficult ones only with evaluate_difficult_gt), then per image, per label in
 * ascending order, its detections by descending score as (item, label, score, tp, fp), where
 * tp = fp = 0 marks a detection of a difficult box that is not evaluated
 * (kiln_detection_evaluate, include/kiln/detect.h). A test pass adds every batch's rows up
 * (kiln_map_add); kiln_layer_is_detection_evaluate tells the solver which tops they are.
 *
 * R depends on the values: reshape plans a row per class and per detection row, and forward gives
 * the top the rows of the pass and marks the layer reshaped. Host code, as in the fork: forward
 * copies the bottoms to the host (on the host device it reads them where they are) and the rows
 * back through the device table.
 *
 * detection_evaluate_param: num_classes (required), background_label_id (0), overlap_threshold
 * (0.5), evaluate_difficult_gt (true), name_size_file (a text file of "NAME HEIGHT WIDTH" lines,
 * one per image of the test set in order, read once at setup: boxes are then clipped and scaled
 * to each image's pixels before the overlaps, counted inclusively as the fork does);
 * resize_param only in its WARP mode, which changes nothing there.
 *
 * Which image of the size list an item is: the images evaluated so far by this layer (a running
 * offset, starting over at the end of the list, as the fork's count does) plus the item's index.
 * The batch's image count is not in either bottom's shape; it is taken as the greatest item
 * index in either bottom plus one. That is the batch unless its last images have neither a
 * detection row nor a ground truth box (DetectionOutput writes a row for every image when it
 * detects nothing at all; an image with objects has ground truth rows). The fork counts the
 * images that have detection rows instead, so that an image without detections in the middle of
 * a batch shifts its sizes; kiln's count does not. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "detection_util.h"
#include "kiln/data.h"
#include "kiln/files.h"

static const Caffe__DetectionEvaluateParameter deteval_defaults =
    CAFFE__DETECTION_EVALUATE_PARAMETER__INIT;

typedef struct {
  kiln_evaluate_spec spec;
  int *img_h, *img_w; /* name_size_file's sizes (NULL: none) */
  int64_t n_sizes;
  int64_t offset;     /* images evaluated so far, modulo n_sizes */
  det_host det, gt;   /* host copies (devices other than the host) */
  kiln_det_buf out;   /* the rows of the pass */
} deteval_state;

/* A line's next whitespace-separated token: [*s, end) into tok (NUL-terminated, at most n - 1
 * characters); false at the end of the line. */
static bool next_token(const char **s, const char *end, char *tok, size_t n) {
  const char *p = *s;
  while (p < end && isspace((unsigned char)*p)) p++;
  if (p == end) return false;
  const char *q = p;
  while (q < end && !isspace((unsigned char)*q)) q++;
  const size_t len = (size_t)(q - p) < n - 1 ? (size_t)(q - p) : n - 1;
  memcpy(tok, p, len);
  tok[len] = '\0';
  *s = q;
  return true;
}

static bool parse_size(const char *tok, int *out) {
  char *e;
  errno = 0;
  const long v = strtol(tok, &e, 10);
  if (errno || *e || e == tok || v < 1 || v > INT_MAX) return false;
  *out = (int)v;
  return true;
}

/* name_size_file's "NAME HEIGHT WIDTH" lines (blank lines skipped) into the state. */
static int read_sizes(kiln_layer *l, deteval_state *st, const char *given) {
  char path[4096];
  KILN_TRY(det_in_layer(l, kiln_data_source_path(l->config, given, path, sizeof path)));
  char *text = NULL;
  size_t len = 0;
  int rc = kiln_read_file(path, &text, &len);
  if (rc)
    return kiln_error_context(rc, "layer '%s' (%s): detection_evaluate_param.name_size_file: ",
                              l->name, l->ops->type);
  int64_t lines = 0, cap = 0;
  for (size_t i = 0; i < len; i++) cap += text[i] == '\n';
  cap += 1;
  st->img_h = malloc(sizeof(int) * (size_t)cap);
  st->img_w = malloc(sizeof(int) * (size_t)cap);
  if (!st->img_h || !st->img_w) {
    free(text);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  rc = KILN_OK;
  for (const char *line = text; line < text + len && rc == KILN_OK;) {
    const char *nl = memchr(line, '\n', (size_t)(text + len - line));
    const char *end = nl ? nl : text + len;
    lines++;
    const char *p = line;
    char name[1024], h[64], w[64], extra[8];
    if (next_token(&p, end, name, sizeof name)) {
      if (!next_token(&p, end, h, sizeof h) || !next_token(&p, end, w, sizeof w) ||
          next_token(&p, end, extra, sizeof extra) || !parse_size(h, &st->img_h[st->n_sizes]) ||
          !parse_size(w, &st->img_w[st->n_sizes]))
        rc = KILN_LAYER_ERROR(l, KILN_ERR_DATA, "detection_evaluate_param.name_size_file %s, "
                              "line %lld: expected NAME HEIGHT WIDTH (positive whole sizes)",
                              path, (long long)lines);
      else
        st->n_sizes++;
    }
    line = end + 1;
  }
  if (rc == KILN_OK && st->n_sizes == 0)
    rc = KILN_LAYER_ERROR(l, KILN_ERR_DATA, "detection_evaluate_param.name_size_file %s names no "
                          "image", path);
  free(text);
  return rc;
}

static int deteval_setup(kiln_layer *l) {
  deteval_state *st = calloc(1, sizeof *st);
  if (!st) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = st;
  const Caffe__DetectionEvaluateParameter *p =
      KILN_PARAM_OR(l->lp->detection_evaluate_param, deteval_defaults);
  if (!p->has_num_classes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "detection_evaluate_param.num_classes is required");
  if (p->num_classes < 1 || p->num_classes > INT_MAX / 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "detection_evaluate_param.num_classes %u: "
                            "expected at least 1", p->num_classes);
  if (p->background_label_id >= p->num_classes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "detection_evaluate_param.background_label_id "
                            "%u is no class of num_classes %u", p->background_label_id,
                            p->num_classes);
  if (!isfinite(p->overlap_threshold))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "detection_evaluate_param.overlap_threshold is not a number");
  if (p->resize_param && p->resize_param->resize_mode != CAFFE__RESIZE_PARAMETER__RESIZE_MODE__WARP)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "detection_evaluate_param.resize_param: "
                            "resize_mode %d: kiln evaluates boxes of warped images only (WARP)",
                            (int)p->resize_param->resize_mode);
  st->spec = (kiln_evaluate_spec){
      .num_classes = (int)p->num_classes,
      .background_label = (int)p->background_label_id,
      .overlap_threshold = p->overlap_threshold,
      .evaluate_difficult_gt = p->evaluate_difficult_gt,
  };
  if (p->name_size_file && p->name_size_file[0]) KILN_TRY(read_sizes(l, st, p->name_size_file));
  return KILN_OK;
}

static int deteval_shape(kiln_layer *l, int64_t rows) {
  const int64_t shape[4] = {1, 1, rows, 5};
  return kiln_blob_reshape(l->top[0], 4, shape);
}

/* Rows of `width` in b: its last axis must be `width`. */
static int rows_of(kiln_layer *l, int b, int width, const char *what, int64_t *rows) {
  const kiln_blob *x = l->bottom[b];
  char s[128];
  if (x->naxes < 1 || x->shape[x->naxes - 1] != width || x->count / width > INT_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "%s (bottom %d, '%s') is %s: expected 1 x 1 x n "
                            "x %d rows", what, b, x->name, det_shape(x, s, sizeof s), width);
  *rows = x->count / width;
  return KILN_OK;
}

static int deteval_reshape(kiln_layer *l) {
  deteval_state *st = l->priv;
  int64_t ndet, ngt;
  KILN_TRY(rows_of(l, 0, 7, "the detections", &ndet));
  KILN_TRY(rows_of(l, 1, 8, "the ground truth", &ngt));
  if (!kiln_device_is_host(det_device(l))) {
    KILN_TRY(det_host_reserve(&st->det, l->bottom[0]->count));
    KILN_TRY(det_host_reserve(&st->gt, l->bottom[1]->count));
  }
  l->extra_bytes = det_host_bytes(&st->det) + det_host_bytes(&st->gt) +
                   st->out.cap * (int64_t)sizeof(float) + 2 * st->n_sizes * (int64_t)sizeof(int);
  l->flops = 0;
  const int classes = st->spec.num_classes - (st->spec.background_label >= 0);
  return deteval_shape(l, classes + ndet); /* at most a row per class and per detection */
}

/* The greatest image index in the first column of `n` rows of `width`, plus one: the batch's
 * images as far as the rows show them. Values that are no index are left to the library, which
 * names their row. */
static int images_in(const float *rows, int64_t n, int width, int num) {
  for (int64_t r = 0; r < n; r++) {
    const float v = rows[r * width];
    if (v >= 0 && v < (float)INT_MAX && v == floorf(v) && (int)v >= num) num = (int)v + 1;
  }
  return num;
}

static int deteval_forward(kiln_layer *l) {
  deteval_state *st = l->priv;
  const int64_t ndet = l->bottom[0]->count / 7, ngt = l->bottom[1]->count / 8;
  const float *det, *gt;
  KILN_TRY(det_read(l, l->bottom[0], &st->det, &det));
  KILN_TRY(det_read(l, l->bottom[1], &st->gt, &gt));
  const int num = images_in(gt, ngt, 8, images_in(det, ndet, 7, 0));
  kiln_evaluate_spec s = st->spec;
  if (st->n_sizes) {
    s.img_h = st->img_h;
    s.img_w = st->img_w;
    s.n_sizes = st->n_sizes;
    s.offset = st->offset;
  }
  st->out.rows = 0;
  KILN_TRY(det_in_layer(l, kiln_detection_evaluate(&s, num, det, ndet, gt, ngt, &st->out)));
  if (st->n_sizes) st->offset = (st->offset + num) % st->n_sizes;
  const kiln_blob *top = l->top[0];
  if (top->naxes != 4 || top->shape[2] != st->out.rows) {
    KILN_TRY(deteval_shape(l, st->out.rows));
    l->reshaped = true;
  }
  l->extra_bytes = det_host_bytes(&st->det) + det_host_bytes(&st->gt) +
                   st->out.cap * (int64_t)sizeof(float) + 2 * st->n_sizes * (int64_t)sizeof(int);
  return det_write(l, l->top[0]->data, st->out.v, 5 * st->out.rows);
}

static void deteval_destroy(kiln_layer *l) {
  deteval_state *st = l->priv;
  if (!st) return;
  free(st->img_h);
  free(st->img_w);
  det_host_free(&st->det);
  det_host_free(&st->gt);
  kiln_det_buf_free(&st->out);
  free(st);
}

static bool deteval_allows_gradient(const kiln_layer *l, int b) {
  (void)l, (void)b;
  return false;
}

const kiln_layer_ops kiln_layer_detection_evaluate = {
    .type = "DetectionEvaluate", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1,
    .max_tops = 1,
    .setup = deteval_setup, .reshape = deteval_reshape, .forward = deteval_forward,
    .allows_gradient = deteval_allows_gradient, .destroy = deteval_destroy,
    .kernels = KILN_NO_KERNELS,
};

bool kiln_layer_is_detection_evaluate(const kiln_layer *l) {
  return l->ops == &kiln_layer_detection_evaluate;
}
