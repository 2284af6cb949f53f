/* SigmoidCrossEntropyLoss: the cross-entropy of sigmoid(x) against targets t in [0, 1], Caffe's
 * SigmoidCrossEntropyLossLayer. Per element, in the form that never overflows:
 *   l = max(x, 0) - x t + log(1 + exp(-|x|))
 * Elements whose target, truncated to an integer, equals loss_param.ignore_label are skipped (so
 * with ignore_label 0 a target of 0.5 is skipped too, as in Caffe). The sum is divided by the
 * normaliser of loss_param: normalization if given, else the legacy normalize (true: VALID,
 * false: BATCH_SIZE), else BATCH_SIZE (this layer's default in Caffe, unlike SoftmaxWithLoss).
 * Gradient: (sigmoid(x) - t) * loss_weight / normaliser to x, 0 for ignored elements; none to the
 * targets. */
#include <math.h>
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__LossParameter loss_defaults = CAFFE__LOSS_PARAMETER__INIT;

typedef struct {
  float normalizer; /* from the last forward pass, for backward */
} sce_state;

static Caffe__LossParameter__NormalizationMode sce_mode(const kiln_layer *l) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  if (p->has_normalization) return p->normalization;
  if (p->has_normalize)
    return p->normalize ? CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID
                        : CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE;
  return CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE;
}

/* (int)target == ignore_label, without the undefined cast of an out-of-range target. */
static bool ignored(const Caffe__LossParameter *p, float target) {
  return p->has_ignore_label && trunc((double)target) == (double)p->ignore_label;
}

static int sce_setup(kiln_layer *l) {
  sce_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  s->normalizer = 1;
  l->priv = s;
  return KILN_OK;
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

static float sce_normalizer(const kiln_layer *l, int64_t valid) {
  const kiln_blob *x = l->bottom[0];
  double n;
  switch (sce_mode(l)) {
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL: n = (double)x->count; break;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID: n = (double)valid; break;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE: n = (double)x->shape[0]; break;
    default: n = 1; break;
  }
  return (float)(n < 1 ? 1 : n); /* Caffe: every target ignored gives loss 0, not NaN */
}

static int sce_forward(kiln_layer *l) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  sce_state *s = l->priv;
  const float *x = l->bottom[0]->data, *t = l->bottom[1]->data;
  int64_t n = l->bottom[0]->count, valid = 0;
  double loss = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ignored(p, t[i])) continue;
    double xi = x[i];
    loss += (xi > 0 ? xi : 0) - xi * t[i] + log1p(exp(-fabs(xi)));
    valid++;
  }
  s->normalizer = sce_normalizer(l, valid);
  l->top[0]->data[0] = (float)(loss / s->normalizer);
  return KILN_OK;
}

static int sce_backward(kiln_layer *l) {
  if (l->propagate_down[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot backpropagate to the target input");
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  const sce_state *s = l->priv;
  const float *x = l->bottom[0]->data, *t = l->bottom[1]->data;
  float *dx = l->bottom[0]->diff;
  float scale = l->top[0]->diff[0] / s->normalizer;
  int64_t n = l->bottom[0]->count;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    float sig = 0.5f * tanhf(0.5f * x[i]) + 0.5f;
    dx[i] = ignored(p, t[i]) ? 0.0f : (sig - t[i]) * scale;
  }
  return KILN_OK;
}

static void sce_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_sigmoid_ce_loss = {
    .type = "SigmoidCrossEntropyLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1,
    .max_tops = 1, .is_loss = true, .setup = sce_setup, .reshape = sce_reshape,
    .forward = sce_forward, .backward = sce_backward, .destroy = sce_destroy,
};
