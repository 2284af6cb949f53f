/* Reductions over the trailing axes: Reduction (SUM, ASUM, SUMSQ or MEAN of everything from
 * `axis` on, times coeff) and MVN (each channel's values, or each sample's with across_channels,
 * less their mean and, with normalize_variance, over their standard deviation plus eps), with
 * Caffe's semantics. Sums are taken in double in a fixed order, so results do not depend on the
 * thread count. */
#include <stdlib.h>

#include "layer_util.h"

static void free_priv(kiln_layer *l) { free(l->priv); }

/* ---- Reduction ----------------------------------------------------------------------------- */
/* top (shape[0 .. axis)) = coeff * op over each item's dim = count(axis ..) values, with MEAN
 * as SUM with coeff / dim. Gradients: coeff dy for SUM and MEAN, coeff sign(x) dy for ASUM
 * (sign(0) = 0, Caffe's caffe_cpu_sign), 2 coeff x dy for SUMSQ. */

static const Caffe__ReductionParameter reduction_defaults = CAFFE__REDUCTION_PARAMETER__INIT;

typedef struct {
  int64_t num, dim;
  float coeff; /* with MEAN's 1 / dim */
} reduction_state;

static const Caffe__ReductionParameter *reduction_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->reduction_param, reduction_defaults);
}

static int reduction_setup(kiln_layer *l) {
  const Caffe__ReductionParameter *p = reduction_param(l);
  switch (p->operation) {
    case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__SUM:
    case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__ASUM:
    case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__SUMSQ:
    case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__MEAN: break;
    default:
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "reduction_param.operation %d is unknown",
                              (int)p->operation);
  }
  reduction_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  return KILN_OK;
}

static int reduction_reshape(kiln_layer *l) {
  const Caffe__ReductionParameter *p = reduction_param(l);
  reduction_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  int axis;
  if (kiln_blob_canonical_axis(x, p->axis, &axis))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "reduction_param.axis %d is not an axis of a %d-axis input", p->axis,
                            x->naxes);
  s->num = kiln_count(x, 0, axis);
  s->dim = kiln_count(x, axis, x->naxes);
  s->coeff = p->coeff;
  if (p->operation == CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__MEAN) s->coeff /= (float)s->dim;
  l->flops = 2.0 * (double)x->count;
  return kiln_blob_reshape(l->top[0], axis, x->shape);
}

/* MEAN is SUM with coeff / dim (reduction_reshape). */
static kiln_reduce_kind reduction_kind(const kiln_layer *l) {
  switch (reduction_param(l)->operation) {
    case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__ASUM: return KILN_REDUCE_ASUM;
    case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__SUMSQ: return KILN_REDUCE_SUMSQ;
    default: return KILN_REDUCE_SUM; /* SUM, MEAN */
  }
}

static int reduction_forward(kiln_layer *l) {
  const reduction_state *s = l->priv;
  return KILN_OP(l, reduction_fwd, l->top[0]->data, l->bottom[0]->data, s->num, s->dim,
                 reduction_kind(l), s->coeff);
}

static int reduction_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const reduction_state *s = l->priv;
  return KILN_OP(l, reduction_bwd, l->bottom[0]->diff, l->top[0]->diff, l->bottom[0]->data,
                 s->num, s->dim, reduction_kind(l), s->coeff);
}

const kiln_layer_ops kiln_layer_reduction = {
    .type = "Reduction", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = reduction_setup, .reshape = reduction_reshape, .forward = reduction_forward,
    .backward = reduction_backward, .destroy = free_priv,
    .kernels = KILN_KERNELS(KILN_OP_reduction_fwd, KILN_OP_reduction_bwd),
};

/* ---- MVN ----------------------------------------------------------------------------------- */
/* Rows of dim values: one per (sample, channel), or one per sample with across_channels (Caffe's
 * num and channels: the first two axes, a missing one counting 1).
 *   y = (x - mean) / (sqrt(var) + eps) with var = mean((x - mean)^2), or y = x - mean;
 *   dx = (dy - mean(dy) - y mean(y dy)) / (sqrt(var) + eps), or dx = dy - mean(dy).
 * Backward reads the output and the kept sqrt(var) + eps per row, not the input, so the layer
 * may run in place; then it keeps a copy of its output, which a later layer in place on the same
 * blob may overwrite. */

static const Caffe__MVNParameter mvn_defaults = CAFFE__MVNPARAMETER__INIT;

static const Caffe__MVNParameter *mvn_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->mvn_param, mvn_defaults);
}

static int mvn_setup(kiln_layer *l) {
  if (!kiln_layer_add_buffer(l, "scale")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "output"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int64_t mvn_rows(const kiln_layer *l) {
  const kiln_blob *x = l->bottom[0];
  return kiln_count(x, 0, 1) * (mvn_param(l)->across_channels ? 1 : kiln_count(x, 1, 2));
}

static int mvn_reshape(kiln_layer *l) {
  const int64_t rows = mvn_rows(l);
  KILN_TRY(kiln_blob_reshape(l->buffer[0], 1, &rows));
  if (l->nbuffer > 1) KILN_TRY(kiln_blob_reshape_like(l->buffer[1], l->bottom[0]));
  l->flops = 5.0 * (double)l->bottom[0]->count;
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

static int mvn_forward(kiln_layer *l) {
  const Caffe__MVNParameter *p = mvn_param(l);
  const int64_t rows = mvn_rows(l);
  const int64_t dim = rows ? l->bottom[0]->count / rows : 0;
  float *y = l->top[0]->data;
  KILN_TRY(KILN_OP(l, mvn_fwd, y, l->buffer[0]->data, l->bottom[0]->data, rows, dim,
                   p->normalize_variance, p->eps));
  if (l->nbuffer > 1) KILN_TRY(KILN_OP(l, copy, l->buffer[1]->data, y, l->bottom[0]->count));
  return KILN_OK;
}

static int mvn_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__MVNParameter *p = mvn_param(l);
  const int64_t rows = mvn_rows(l);
  const int64_t dim = rows ? l->bottom[0]->count / rows : 0;
  const float *y = l->nbuffer > 1 ? l->buffer[1]->data : l->top[0]->data;
  return KILN_OP(l, mvn_bwd, l->bottom[0]->diff, l->top[0]->diff, y, l->buffer[0]->data, rows,
                 dim, p->normalize_variance);
}

const kiln_layer_ops kiln_layer_mvn = {
    .type = "MVN", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = mvn_setup, .reshape = mvn_reshape, .forward = mvn_forward,
    .backward = mvn_backward,
    .kernels = KILN_KERNELS(KILN_OP_mvn_fwd, KILN_OP_mvn_bwd, KILN_OP_copy),
};
