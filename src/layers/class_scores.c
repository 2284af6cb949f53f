/* Softmax, SoftmaxWithLoss (multinomial logistic loss of the softmax, with ignore_label and
 * Caffe's normalization modes), Accuracy (top_k, ignore_label) and kiln's F1 (one class's
 * true positives, false positives and false negatives), which read scores the same way. */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__SoftmaxParameter softmax_defaults = CAFFE__SOFTMAX_PARAMETER__INIT;
static const Caffe__LossParameter loss_defaults = CAFFE__LOSS_PARAMETER__INIT;
static const Caffe__AccuracyParameter accuracy_defaults = CAFFE__ACCURACY_PARAMETER__INIT;

typedef struct {
  int axis;
  int64_t outer, C, inner;
} softmax_state;

static int softmax_dims(kiln_layer *l, int axis_param) {
  softmax_state *s = l->priv;
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    l->priv = s;
  }
  const kiln_blob *x = l->bottom[0];
  int rc = kiln_blob_canonical_axis(x, axis_param, &s->axis);
  if (rc) return kiln_error_context(rc, "layer '%s': ", l->name);
  s->outer = kiln_count(x, 0, s->axis);
  s->C = x->shape[s->axis];
  s->inner = kiln_count(x, s->axis + 1, x->naxes);
  return KILN_OK;
}

static void free_priv(kiln_layer *l) { free(l->priv); }

/* The labels (bottom 1) hold one class per prediction: the scores' shape without the class
 * axis. Checked on reshape by the layers that read scores and labels. */
static int check_label_count(kiln_layer *l) {
  const softmax_state *s = l->priv;
  if (l->bottom[1]->count != s->outer * s->inner)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "label count %lld does not match prediction count %lld (%lld x %lld); "
                            "labels must be N x ... without the class axis",
                            (long long)l->bottom[1]->count, (long long)(s->outer * s->inner),
                            (long long)s->outer, (long long)s->inner);
  return KILN_OK;
}

/* An op's error (a label that is no class) with the layer's name before it. */
static int in_layer(const kiln_layer *l, int rc) {
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

/* ---- Softmax --------------------------------------------------------------------------- */

static int softmax_reshape(kiln_layer *l) {
  KILN_TRY(softmax_dims(l, KILN_PARAM_OR(l->lp->softmax_param, softmax_defaults)->axis));
  l->flops = 4.0 * l->bottom[0]->count;
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

static int softmax_forward(kiln_layer *l) {
  softmax_state *s = l->priv;
  return KILN_OP(l, softmax_fwd, l->top[0]->data, l->bottom[0]->data, s->outer, s->C, s->inner);
}

static int softmax_backward(kiln_layer *l) {
  softmax_state *s = l->priv;
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, softmax_bwd, l->bottom[0]->diff, l->top[0]->data, l->top[0]->diff, s->outer,
                 s->C, s->inner);
}

const kiln_layer_ops kiln_layer_softmax = {
    .type = "Softmax", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .reshape = softmax_reshape, .forward = softmax_forward, .backward = softmax_backward,
    .destroy = free_priv, .backward_reads = kiln_reads_top0,
    .kernels = KILN_KERNELS(KILN_OP_softmax_fwd, KILN_OP_softmax_bwd),
};

/* ---- SoftmaxWithLoss ------------------------------------------------------------------- */

static Caffe__LossParameter__NormalizationMode loss_mode(const kiln_layer *l) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  if (p->has_normalize && !p->has_normalization)
    return p->normalize ? CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID
                        : CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE;
  return p->normalization;
}

static int loss_setup(kiln_layer *l) {
  if (!kiln_layer_add_buffer(l, "prob")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int loss_reshape(kiln_layer *l) {
  KILN_TRY(softmax_dims(l, KILN_PARAM_OR(l->lp->softmax_param, softmax_defaults)->axis));
  KILN_TRY(check_label_count(l));
  l->flops = 5.0 * l->bottom[0]->count;
  KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  KILN_TRY(kiln_blob_reshape(l->top[0], 0, NULL));
  if (l->ntop > 1) KILN_TRY(kiln_blob_reshape_like(l->top[1], l->bottom[0]));
  return KILN_OK;
}

/* The mode as the loss ops take it; an unknown one divides by 1, as NONE. */
static kiln_loss_norm loss_norm(const kiln_layer *l) {
  switch (loss_mode(l)) {
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL: return KILN_LOSS_FULL;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID: return KILN_LOSS_VALID;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE: return KILN_LOSS_BATCH;
    default: return KILN_LOSS_NONE;
  }
}

static int loss_forward(kiln_layer *l) {
  softmax_state *s = l->priv;
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  float *prob = l->buffer[0]->data;
  KILN_TRY(KILN_OP(l, softmax_fwd, prob, l->bottom[0]->data, s->outer, s->C, s->inner));
  KILN_TRY(in_layer(l, KILN_OP(l, softmax_loss_fwd, l->top[0]->data, prob, l->bottom[1]->data,
                               s->outer, s->C, s->inner, p->has_ignore_label, p->ignore_label,
                               loss_norm(l))));
  if (l->ntop > 1) KILN_TRY(KILN_OP(l, copy, l->top[1]->data, prob, l->bottom[0]->count));
  return KILN_OK;
}

static unsigned loss_backward_reads(const kiln_layer *l) {
  (void)l;
  return KILN_READS_BOTTOM(1);
}

static int loss_backward(kiln_layer *l) {
  if (l->nbottom > 1 && l->propagate_down[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot backpropagate to the label input");
  if (!l->propagate_down[0]) return KILN_OK;
  softmax_state *s = l->priv;
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  return KILN_OP(l, softmax_loss_bwd, l->bottom[0]->diff, l->buffer[0]->data, l->bottom[1]->data,
                 l->top[0]->diff, s->outer, s->C, s->inner, p->has_ignore_label, p->ignore_label,
                 loss_norm(l));
}

const kiln_layer_ops kiln_layer_softmax_loss = {
    .type = "SoftmaxWithLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 2,
    .is_loss = true, .setup = loss_setup, .reshape = loss_reshape, .forward = loss_forward,
    .backward = loss_backward, .destroy = free_priv,
    .backward_reads = loss_backward_reads, /* the labels; the probabilities are a buffer */
    .kernels = KILN_KERNELS(KILN_OP_softmax_fwd, KILN_OP_softmax_loss_fwd,
                            KILN_OP_softmax_loss_bwd, KILN_OP_copy),
};

/* ---- Accuracy -------------------------------------------------------------------------- */

/* With the per-class top, a buffer counts each class's samples (any number of classes). */
static int accuracy_setup(kiln_layer *l) {
  if (l->ntop > 1 && !kiln_layer_add_buffer(l, "class_count"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int accuracy_reshape(kiln_layer *l) {
  const Caffe__AccuracyParameter *p = KILN_PARAM_OR(l->lp->accuracy_param, accuracy_defaults);
  KILN_TRY(softmax_dims(l, p->axis));
  softmax_state *s = l->priv;
  if (p->top_k < 1 || p->top_k > s->C)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "top_k %u must be in [1, %lld]", p->top_k,
                            (long long)s->C);
  KILN_TRY(check_label_count(l));
  KILN_TRY(kiln_blob_reshape(l->top[0], 0, NULL));
  if (l->ntop > 1) {
    int64_t shape[1] = {s->C};
    KILN_TRY(kiln_blob_reshape(l->top[1], 1, shape));
    KILN_TRY(kiln_blob_reshape(l->buffer[0], 1, shape));
  }
  return KILN_OK;
}

static int accuracy_forward(kiln_layer *l) {
  const Caffe__AccuracyParameter *p = KILN_PARAM_OR(l->lp->accuracy_param, accuracy_defaults);
  softmax_state *s = l->priv;
  float *per_class = l->ntop > 1 ? l->top[1]->data : NULL;
  float *class_count = l->ntop > 1 ? l->buffer[0]->data : NULL;
  return in_layer(l, KILN_OP(l, accuracy_fwd, l->top[0]->data, per_class, class_count,
                             l->bottom[0]->data, l->bottom[1]->data, s->outer, s->C, s->inner,
                             (int)p->top_k, p->has_ignore_label, p->ignore_label));
}

const kiln_layer_ops kiln_layer_accuracy = {
    .type = "Accuracy", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 2,
    .setup = accuracy_setup, .reshape = accuracy_reshape, .forward = accuracy_forward,
    .destroy = free_priv, .backward_reads = kiln_reads_none, /* no backward */
    .kernels = KILN_KERNELS(KILN_OP_accuracy_fwd),
};

bool kiln_layer_is_token_xent(const kiln_layer *l) {
  if (strcmp(l->ops->type, "SoftmaxWithLoss") != 0 || !l->priv) return false;
  const softmax_state *s = l->priv;
  Caffe__LossParameter__NormalizationMode m = loss_mode(l);
  return s->axis >= 2 && (m == CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID ||
                          m == CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL);
}

/* ---- F1 -------------------------------------------------------------------------------- */

/* One class's counts under the top-1 prediction: tp, fp, fn, each the batch's count. Counts,
 * not the batch's F1, because a test pass averages every output: the averaged counts keep the
 * ratios of the pooled ones, so precision, recall and F1 derived from them afterwards are those
 * of the whole pass (kiln_net_derived_metrics), where a mean of batch F1s would not be. */
static const Caffe__F1Parameter f1_defaults = CAFFE__F1_PARAMETER__INIT;

static int f1_reshape(kiln_layer *l) {
  const Caffe__F1Parameter *p = KILN_PARAM_OR(l->lp->f1_param, f1_defaults);
  KILN_TRY(softmax_dims(l, p->axis));
  softmax_state *s = l->priv;
  if (p->positive_label < 0 || p->positive_label >= s->C)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "positive_label %d is not a class in [0, %lld)",
                            p->positive_label, (long long)s->C);
  KILN_TRY(check_label_count(l));
  for (int t = 0; t < l->ntop; t++) KILN_TRY(kiln_blob_reshape(l->top[t], 0, NULL));
  return KILN_OK;
}

static int f1_forward(kiln_layer *l) {
  const Caffe__F1Parameter *p = KILN_PARAM_OR(l->lp->f1_param, f1_defaults);
  softmax_state *s = l->priv;
  return in_layer(l, KILN_OP(l, f1_fwd, l->top[0]->data, l->top[1]->data, l->top[2]->data,
                             l->bottom[0]->data, l->bottom[1]->data, s->outer, s->C, s->inner,
                             p->positive_label, p->has_ignore_label, p->ignore_label));
}

const kiln_layer_ops kiln_layer_f1 = {
    .type = "F1", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 3, .max_tops = 3,
    .reshape = f1_reshape, .forward = f1_forward, .destroy = free_priv,
    .backward_reads = kiln_reads_none, /* no backward */
    .kernels = KILN_KERNELS(KILN_OP_f1_fwd),
};

bool kiln_layer_is_f1(const kiln_layer *l) {
  return l->ops == &kiln_layer_f1;
}
