/* DetectionOutput (the SSD fork's, Wei Liu's Caffe): a batch's detections. Bottoms: the location
 * predictions loc (N x 4PL), the confidences conf (N x PC, probabilities: after a Softmax over
 * the classes) and the priors (1 x 2 x 4P); one top 1 x 1 x D x 7 of rows (item, label, score,
 * xmin, ymin, xmax, ymax), boxes normalised to the image. Each image's boxes are decoded against
 * the priors, each class but the background suppressed (non-maximum suppression over the scores
 * above confidence_threshold, top_k of them at most), then the keep_top_k best of the image's
 * kept; when nothing is detected in the whole batch, one row (i, -1, -1, -1, -1, -1, -1) per
 * image, as the fork writes (kiln_detection_output, include/kiln/detect.h).
 *
 * D depends on the values: reshape plans N x keep_top_k rows (N without keep_top_k), and forward
 * gives the top the rows of the pass and marks the layer reshaped, so the net reshapes the
 * layers after it. As in the fork this is host code: forward copies the bottoms to the host (on
 * the host device it reads them where they are) and the rows back through the device table.
 *
 * detection_output_param as the fork reads it: num_classes (required), share_location (true),
 * background_label_id (0; -1: none), nms_param (nms_threshold 0.3, top_k unset: all, eta 1),
 * keep_top_k (-1: all), confidence_threshold (unset: every score), code_type (CORNER),
 * variance_encoded_in_target. The fork's writing of result files (save_output_param's
 * output_directory) is ignored with a warning, as the fork's published nets all carry it; its
 * display (visualize) is refused: `kiln detect` writes a deploy net's detections. No backward:
 * nothing trains through it. */
#include <float.h>
#include <limits.h>
#include <stdlib.h>

#include "detection_util.h"

static const Caffe__DetectionOutputParameter detout_defaults =
    CAFFE__DETECTION_OUTPUT_PARAMETER__INIT;
static const Caffe__NonMaximumSuppressionParameter nms_defaults =
    CAFFE__NON_MAXIMUM_SUPPRESSION_PARAMETER__INIT;

typedef struct {
  kiln_detect_spec spec;
  int num, P;
  det_host loc, conf, prior; /* host copies (devices other than the host) */
  kiln_det_buf out;          /* the rows of the pass */
} detout_state;

static int detout_spec(kiln_layer *l, kiln_detect_spec *s) {
  const Caffe__DetectionOutputParameter *p =
      KILN_PARAM_OR(l->lp->detection_output_param, detout_defaults);
  if (!p->has_num_classes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "detection_output_param.num_classes is required");
  if (p->num_classes < 1 || p->num_classes > INT_MAX / 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "detection_output_param.num_classes %u: "
                            "expected at least 1", p->num_classes);
  if (p->background_label_id < -1 || p->background_label_id >= (int64_t)p->num_classes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "detection_output_param.background_label_id %d "
                            "is no class of num_classes %u (nor -1, none)",
                            p->background_label_id, p->num_classes);
  /* The fork's ssd_pascal.py writes save_output_param into every test and deploy net it makes
   * (its own output_directory, a path on the author's machine): refusing it would refuse the
   * fork's published nets, so it is ignored, with a warning. */
  if (p->save_output_param && p->save_output_param->output_directory &&
      p->save_output_param->output_directory[0])
    kiln_log(KILN_LOG_WARN, "layer '%s' (DetectionOutput): save_output_param.output_directory "
             "'%s' is ignored: kiln writes no result files from this layer (`kiln detect` writes "
             "a net's detections)", l->name, p->save_output_param->output_directory);
  if (p->visualize)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "visualize: true: kiln does not display "
                            "detections from this layer; `kiln detect` writes a net's "
                            "detections");
  const Caffe__NonMaximumSuppressionParameter *nms = KILN_PARAM_OR(p->nms_param, nms_defaults);
  if (nms->has_top_k && nms->top_k == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "nms_param.top_k 0 keeps no box (leave it out "
                            "to keep every box)");
  *s = (kiln_detect_spec){
      .num_classes = (int)p->num_classes,
      .background_label = p->background_label_id,
      .share_location = p->share_location,
      .nms_threshold = nms->nms_threshold,
      .eta = nms->eta,
      .top_k = nms->has_top_k && nms->top_k > 0 ? nms->top_k : -1,
      .keep_top_k = p->keep_top_k,
      .confidence_threshold = p->has_confidence_threshold ? p->confidence_threshold : -FLT_MAX,
      .code = (kiln_box_code)p->code_type,
      .variance_in_target = p->variance_encoded_in_target,
  };
  /* the library's checks of the spec (code_type, eta, nms_threshold), on an empty batch */
  kiln_det_buf none = {0};
  const int rc = kiln_detection_output(s, 0, 0, NULL, NULL, NULL, &none);
  kiln_det_buf_free(&none);
  return det_in_layer(l, rc);
}

static int detout_setup(kiln_layer *l) {
  detout_state *st = calloc(1, sizeof *st);
  if (!st) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = st;
  return detout_spec(l, &st->spec);
}

/* The top with `rows` rows of 7. */
static int detout_shape(kiln_layer *l, int64_t rows) {
  const int64_t shape[4] = {1, 1, rows, 7};
  return kiln_blob_reshape(l->top[0], 4, shape);
}

static int detout_reshape(kiln_layer *l) {
  detout_state *st = l->priv;
  const kiln_blob *loc = l->bottom[0], *conf = l->bottom[1], *prior = l->bottom[2];
  const int C = st->spec.num_classes, L = st->spec.share_location ? 1 : C;
  int64_t N = 0, P = 0;
  KILN_TRY(det_check_predictions(l, L, C, &N, &P));
  st->num = (int)N;
  st->P = (int)P;
  if (!kiln_device_is_host(det_device(l))) {
    KILN_TRY(det_host_reserve(&st->loc, loc->count));
    KILN_TRY(det_host_reserve(&st->conf, conf->count));
    KILN_TRY(det_host_reserve(&st->prior, prior->count));
  }
  l->extra_bytes = det_host_bytes(&st->loc) + det_host_bytes(&st->conf) +
                   det_host_bytes(&st->prior) + st->out.cap * (int64_t)sizeof(float);
  l->flops = 10.0 * (double)(N * P * L);
  const int keep = st->spec.keep_top_k;
  return detout_shape(l, keep > 0 ? N * keep : N);
}

static int detout_forward(kiln_layer *l) {
  detout_state *st = l->priv;
  const float *loc, *conf, *prior;
  KILN_TRY(det_read(l, l->bottom[0], &st->loc, &loc));
  KILN_TRY(det_read(l, l->bottom[1], &st->conf, &conf));
  KILN_TRY(det_read(l, l->bottom[2], &st->prior, &prior));
  st->out.rows = 0;
  KILN_TRY(det_in_layer(l, kiln_detection_output(&st->spec, st->num, st->P, loc, conf, prior,
                                                 &st->out)));
  const kiln_blob *top = l->top[0];
  if (top->naxes != 4 || top->shape[2] != st->out.rows) {
    KILN_TRY(detout_shape(l, st->out.rows));
    l->reshaped = true;
  }
  l->extra_bytes = det_host_bytes(&st->loc) + det_host_bytes(&st->conf) +
                   det_host_bytes(&st->prior) + st->out.cap * (int64_t)sizeof(float);
  return det_write(l, l->top[0]->data, st->out.v, 7 * st->out.rows);
}

static void detout_destroy(kiln_layer *l) {
  detout_state *st = l->priv;
  if (!st) return;
  det_host_free(&st->loc);
  det_host_free(&st->conf);
  det_host_free(&st->prior);
  kiln_det_buf_free(&st->out);
  free(st);
}

static bool detout_allows_gradient(const kiln_layer *l, int b) {
  (void)l, (void)b;
  return false;
}

const kiln_layer_ops kiln_layer_detection_output = {
    .type = "DetectionOutput", .min_bottoms = 3, .max_bottoms = 3, .min_tops = 1, .max_tops = 1,
    .setup = detout_setup, .reshape = detout_reshape, .forward = detout_forward,
    .allows_gradient = detout_allows_gradient, .destroy = detout_destroy,
    .kernels = KILN_NO_KERNELS,
};
