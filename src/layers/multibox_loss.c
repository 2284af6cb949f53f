/* MultiBoxLoss (the SSD fork's, Wei Liu's Caffe): SSD's training loss. Bottoms: the location
 * predictions loc (N x 4PL: for each image, prior and location class, the four offsets; L = 1
 * with share_location, else C), the confidences conf (N x PC scores), the priors (1 x 2 x 4P,
 * PriorBox's, concatenated) and the ground truth (1 x 1 x G x 8 rows: item, label, instance,
 * xmin, ymin, xmax, ymax, difficult; a batch without any object is one row of -1). One top: the
 * loss, loc_weight x the location loss of the matched priors plus the confidence loss of the
 * matched priors and the mined negatives, each over the normalizer of loss_param.normalization.
 *
 * As in the fork, whose MultiBoxLoss runs on the CPU in GPU mode too, this is host code over host
 * copies: forward copies the bottoms to buffers of the layer's (on the host device it reads them
 * where they are), matches and mines (kiln_multibox_select), computes the loss and its gradient
 * for a top gradient of 1 (kiln_multibox_loss) into host buffers, and writes the loss to the top
 * through the device table; backward hands the gradients to loc's and conf's diffs and scales
 * them there by the top's gradient (the loss weight times what comes from above) with the
 * `scale` op. So backward reads no bottom's data, and the selection is the one forward made.
 * Matching and mining break ties to the lower index: results do not depend on the thread count.
 *
 * multibox_loss_param as the fork reads it (num_classes required; mining_type default
 * MAX_NEGATIVE; the deprecated do_neg_mining, when given alone, false meaning NONE; an absent
 * nms_param no suppression in HARD_EXAMPLE mining), with loss_param.normalization (default
 * VALID; the deprecated normalize when normalization is not given: true VALID, false
 * BATCH_SIZE). No gradient goes to the priors or the ground truth: a backward pass that asks
 * one is refused, as the fork refuses it (SSD's nets say propagate_down: false for both). */
#include <limits.h>
#include <stdlib.h>

#include "detection_util.h"

static const Caffe__MultiBoxLossParameter mbox_defaults = CAFFE__MULTI_BOX_LOSS_PARAMETER__INIT;
static const Caffe__LossParameter loss_defaults = CAFFE__LOSS_PARAMETER__INIT;

typedef struct {
  kiln_multibox_spec spec;
  int num, P, L; /* images, priors, location classes */
  int64_t G;     /* ground truth rows */
  det_host loc, conf, prior, gt; /* host copies (devices other than the host) */
  det_host dloc, dconf;          /* the gradient for a top gradient of 1, from forward */
  kiln_multibox_selection sel;
  int64_t grad_loc, grad_conf; /* the sizes of the gradients forward left in dloc and dconf
                                  (0: none yet) */
} mbox_state;

static kiln_loss_norm mbox_norm(const kiln_layer *l) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  Caffe__LossParameter__NormalizationMode m = p->normalization;
  if (!p->has_normalization && p->has_normalize)
    m = p->normalize ? CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID
                     : CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE;
  switch (m) {
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL: return KILN_LOSS_FULL;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID: return KILN_LOSS_VALID;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE: return KILN_LOSS_BATCH;
    default: return KILN_LOSS_NONE;
  }
}

static const char *mining_name(int m) {
  return m == 0 ? "NONE" : m == 1 ? "MAX_NEGATIVE" : m == 2 ? "HARD_EXAMPLE" : "unknown";
}

static int mbox_spec(kiln_layer *l, kiln_multibox_spec *s) {
  const Caffe__MultiBoxLossParameter *p =
      KILN_PARAM_OR(l->lp->multibox_loss_param, mbox_defaults);
  if (!p->has_num_classes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "multibox_loss_param.num_classes is required");
  if (p->num_classes < 1 || p->num_classes > INT_MAX / 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "multibox_loss_param.num_classes %u: expected "
                            "at least 1", p->num_classes);
  if (p->background_label_id >= p->num_classes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "multibox_loss_param.background_label_id %u is "
                            "no class of num_classes %u", p->background_label_id, p->num_classes);
  int mining = (int)p->mining_type;
  if (p->has_do_neg_mining) {
    if (!p->has_mining_type) {
      mining = p->do_neg_mining ? KILN_MINE_MAX_NEGATIVE : KILN_MINE_NONE;
    } else if (p->do_neg_mining != (mining != KILN_MINE_NONE)) {
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "multibox_loss_param.do_neg_mining %s "
                              "contradicts mining_type %s (do_neg_mining is deprecated: give "
                              "mining_type alone)", p->do_neg_mining ? "true" : "false",
                              mining_name(mining));
    }
  }
  const Caffe__NonMaximumSuppressionParameter *nms = p->nms_param;
  *s = (kiln_multibox_spec){
      .num_classes = (int)p->num_classes,
      .background_label = (int)p->background_label_id,
      .share_location = p->share_location,
      .match_type = (kiln_match_type)p->match_type,
      .overlap_threshold = p->overlap_threshold,
      .use_prior_for_matching = p->use_prior_for_matching,
      .use_difficult_gt = p->use_difficult_gt,
      .mining = (kiln_mining)mining,
      .neg_pos_ratio = p->neg_pos_ratio,
      .neg_overlap = p->neg_overlap,
      .sample_size = p->sample_size,
      .nms_threshold = nms ? nms->nms_threshold : 0,
      .nms_top_k = nms && nms->has_top_k && nms->top_k > 0 ? nms->top_k : 0,
      .use_prior_for_nms = p->use_prior_for_nms,
      .code = (kiln_box_code)p->code_type,
      .encode_variance_in_target = p->encode_variance_in_target,
      .map_object_to_agnostic = p->map_object_to_agnostic,
      .ignore_cross_boundary_bbox = p->ignore_cross_boundary_bbox,
      .bp_inside = p->bp_inside,
      .loc_loss = (kiln_loc_loss)p->loc_loss_type,
      .conf_loss = (kiln_conf_loss)p->conf_loss_type,
      .loc_weight = p->loc_weight,
      .normalization = mbox_norm(l),
  };
  /* The library's checks of the spec alone (what the fork refuses), on an empty selection. */
  kiln_multibox_selection none = {0};
  float loss;
  return det_in_layer(l, kiln_multibox_loss(s, &none, NULL, NULL, NULL, &loss, NULL, NULL));
}

static int mbox_setup(kiln_layer *l) {
  mbox_state *st = calloc(1, sizeof *st);
  if (!st) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = st;
  return mbox_spec(l, &st->spec);
}

static int mbox_reshape(kiln_layer *l) {
  mbox_state *st = l->priv;
  const kiln_blob *loc = l->bottom[0], *conf = l->bottom[1], *prior = l->bottom[2],
                  *gt = l->bottom[3];
  const int C = st->spec.num_classes, L = st->spec.share_location ? 1 : C;
  char s0[128];
  if (gt->naxes < 1 || gt->shape[gt->naxes - 1] != 8)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the ground truth (bottom 3, '%s') is %s: expected "
                            "1 x 1 x G x 8 rows", gt->name, det_shape(gt, s0, sizeof s0));
  int64_t N = 0, P = 0;
  KILN_TRY(det_check_predictions(l, L, C, &N, &P));
  st->num = (int)N;
  st->P = (int)P;
  st->L = L;
  st->G = gt->count / 8;
  if (!kiln_device_is_host(det_device(l))) {
    KILN_TRY(det_host_reserve(&st->loc, loc->count));
    KILN_TRY(det_host_reserve(&st->conf, conf->count));
    KILN_TRY(det_host_reserve(&st->prior, prior->count));
    KILN_TRY(det_host_reserve(&st->gt, gt->count));
  }
  KILN_TRY(det_host_reserve(&st->dloc, loc->count));
  KILN_TRY(det_host_reserve(&st->dconf, conf->count));
  l->extra_bytes = det_host_bytes(&st->loc) + det_host_bytes(&st->conf) +
                   det_host_bytes(&st->prior) + det_host_bytes(&st->gt) +
                   det_host_bytes(&st->dloc) + det_host_bytes(&st->dconf) +
                   N * P * (int64_t)(sizeof(int32_t) + 1); /* the selection */
  l->flops = 2.0 * (double)(loc->count + conf->count);
  return kiln_blob_reshape(l->top[0], 0, NULL);
}

static int mbox_forward(kiln_layer *l) {
  mbox_state *st = l->priv;
  const float *loc, *conf, *prior, *gt;
  KILN_TRY(det_read(l, l->bottom[0], &st->loc, &loc));
  KILN_TRY(det_read(l, l->bottom[1], &st->conf, &conf));
  KILN_TRY(det_read(l, l->bottom[2], &st->prior, &prior));
  KILN_TRY(det_read(l, l->bottom[3], &st->gt, &gt));
  st->grad_loc = st->grad_conf = 0;
  KILN_TRY(det_in_layer(l, kiln_multibox_select(&st->spec, st->num, st->P, loc, conf, prior, gt,
                                                st->G, &st->sel)));
  float loss;
  KILN_TRY(det_in_layer(l, kiln_multibox_loss(&st->spec, &st->sel, loc, conf, prior, &loss,
                                              st->dloc.v, st->dconf.v)));
  st->grad_loc = l->bottom[0]->count;
  st->grad_conf = l->bottom[1]->count;
  return det_write(l, l->top[0]->data, &loss, 1);
}

/* diff = g x grad, for the n values of a bottom's diff on the layer's device: on the host the op
 * reads the host gradient directly; elsewhere it is copied over first and scaled in place. */
static int mbox_put_grad(kiln_layer *l, float *diff, const float *grad, float g, int64_t n) {
  if (kiln_device_is_host(det_device(l))) return KILN_OP(l, scale, diff, grad, g, n);
  KILN_TRY(det_write(l, diff, grad, n));
  return KILN_OP(l, scale, diff, diff, g, n);
}

static int mbox_backward(kiln_layer *l) {
  mbox_state *st = l->priv;
  for (int b = 2; b < 4; b++)
    if (l->propagate_down[b])
      return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "cannot backpropagate to bottom %d ('%s'), "
                              "the %s; set propagate_down: false for it", b, l->bottom[b]->name,
                              b == 2 ? "priors" : "ground truth");
  if (!l->propagate_down[0] && !l->propagate_down[1]) return KILN_OK;
  if (st->grad_loc != l->bottom[0]->count || st->grad_conf != l->bottom[1]->count)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "backward without a forward pass on bottoms of "
                            "these shapes");
  float g;
  KILN_TRY(kiln_device_to_host(det_device(l), &g, l->top[0]->diff, sizeof g));
  if (l->propagate_down[0])
    KILN_TRY(mbox_put_grad(l, l->bottom[0]->diff, st->dloc.v, g, l->bottom[0]->count));
  if (l->propagate_down[1])
    KILN_TRY(mbox_put_grad(l, l->bottom[1]->diff, st->dconf.v, g, l->bottom[1]->count));
  return KILN_OK;
}

static bool mbox_allows_gradient(const kiln_layer *l, int b) {
  (void)l;
  return b < 2;
}

static void mbox_destroy(kiln_layer *l) {
  mbox_state *st = l->priv;
  if (!st) return;
  det_host_free(&st->loc);
  det_host_free(&st->conf);
  det_host_free(&st->prior);
  det_host_free(&st->gt);
  det_host_free(&st->dloc);
  det_host_free(&st->dconf);
  kiln_multibox_selection_free(&st->sel);
  free(st);
}

const kiln_layer_ops kiln_layer_multibox_loss = {
    .type = "MultiBoxLoss", .min_bottoms = 4, .max_bottoms = 4, .min_tops = 1, .max_tops = 1,
    .is_loss = true,
    .setup = mbox_setup, .reshape = mbox_reshape, .forward = mbox_forward,
    .backward = mbox_backward, .allows_gradient = mbox_allows_gradient,
    .destroy = mbox_destroy,
    .backward_reads = kiln_reads_none, /* the gradient is computed in forward, kept on the host */
    .kernels = KILN_KERNELS(KILN_OP_scale),
};
