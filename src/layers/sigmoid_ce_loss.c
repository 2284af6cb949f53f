/* SigmoidCrossEntropyLoss: the cross-entropy of sigmoid(x) against targets t in [0, 1], Caffe's
 * SigmoidCrossEntropyLossLayer. Per element, in the form that never overflows:
 *   l = max(x, 0) - x t + log(1 + exp(-|x|))
 * Elements whose target, truncated to an integer, equals loss_param.ignore_label are skipped (so
 * with ignore_label 0 a target of 0.5 is skipped too, as in Caffe). The sum is divided by the
 * normaliser of loss_param: normalization if given, else the legacy normalize (true: VALID,
 * false: BATCH_SIZE), else BATCH_SIZE (this layer's default in Caffe, unlike SoftmaxWithLoss).
 * Gradient: (sigmoid(x) - t) * loss_weight / normaliser to x, 0 for ignored elements; none to the
 * targets. Backward counts the targets that are not ignored again (the normaliser of VALID), as
 * forward did, rather than keep forward's normaliser. */
#include "layer_util.h"

static const Caffe__LossParameter loss_defaults = CAFFE__LOSS_PARAMETER__INIT;

static Caffe__LossParameter__NormalizationMode sce_mode(const kiln_layer *l) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  if (p->has_normalization) return p->normalization;
  if (p->has_normalize)
    return p->normalize ? CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID
                        : CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE;
  return CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE;
}

/* The mode as the loss ops take it; an unknown one divides by 1, as NONE. */
static kiln_loss_norm sce_norm(const kiln_layer *l) {
  switch (sce_mode(l)) {
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL: return KILN_LOSS_FULL;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID: return KILN_LOSS_VALID;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE: return KILN_LOSS_BATCH;
    default: return KILN_LOSS_NONE;
  }
}

static int sce_reshape(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0], *t = l->bottom[1];
  if (x->naxes < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input needs at least one axis (N x ...)");
  if (x->count != t->count) {
    char sx[128], st[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "target count %lld (%s) does not match input count %lld (%s)",
                            (long long)t->count, kiln_blob_shape_string(t, st, sizeof st),
                            (long long)x->count, kiln_blob_shape_string(x, sx, sizeof sx));
  }
  l->flops = 6.0 * (double)x->count;
  return kiln_blob_reshape(l->top[0], 0, NULL);
}

static int sce_forward(kiln_layer *l) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  const kiln_blob *x = l->bottom[0];
  return KILN_OP(l, sigmoid_ce_fwd, l->top[0]->data, x->data, l->bottom[1]->data, x->count,
                 x->shape[0], p->has_ignore_label, p->ignore_label, sce_norm(l));
}

static int sce_backward(kiln_layer *l) {
  if (l->propagate_down[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot backpropagate to the target input");
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  const kiln_blob *x = l->bottom[0];
  return KILN_OP(l, sigmoid_ce_bwd, l->bottom[0]->diff, x->data, l->bottom[1]->data,
                 l->top[0]->diff, x->count, x->shape[0], p->has_ignore_label, p->ignore_label,
                 sce_norm(l));
}

const kiln_layer_ops kiln_layer_sigmoid_ce_loss = {
    .type = "SigmoidCrossEntropyLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1,
    .max_tops = 1, .is_loss = true, .reshape = sce_reshape, .forward = sce_forward,
    .backward = sce_backward,
    .kernels = KILN_KERNELS(KILN_OP_sigmoid_ce_fwd, KILN_OP_sigmoid_ce_bwd),
};
