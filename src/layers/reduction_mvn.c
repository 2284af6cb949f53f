/* Reductions over the trailing axes: Reduction (SUM, ASUM, SUMSQ or MEAN of everything from
 * `axis` on, times coeff) and MVN (each channel's values, or each sample's with across_channels,
 * less their mean and, with normalize_variance, over their standard deviation plus eps), with
 * Caffe's semantics. Sums are taken in double in a fixed order, so results do not depend on the
 * thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static int reduction_forward(kiln_layer *l) {
  const Caffe__ReductionParameter *p = reduction_param(l);
  const reduction_state *s = l->priv;
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  const int64_t dim = s->dim;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (s->num * dim > 32768)
  for (int64_t n = 0; n < s->num; n++) {
    const float *v = x + n * dim;
    double t = 0;
    switch (p->operation) {
      case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__ASUM:
        for (int64_t i = 0; i < dim; i++) t += fabsf(v[i]);
        break;
      case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__SUMSQ:
        for (int64_t i = 0; i < dim; i++) t += (double)v[i] * v[i];
        break;
      default: /* SUM, MEAN */
        for (int64_t i = 0; i < dim; i++) t += v[i];
        break;
    }
    y[n] = (float)(t * s->coeff);
  }
  return KILN_OK;
}

static int reduction_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__ReductionParameter *p = reduction_param(l);
  const reduction_state *s = l->priv;
  const float *x = l->bottom[0]->data, *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  const int64_t dim = s->dim;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (s->num * dim > 32768)
  for (int64_t n = 0; n < s->num; n++) {
    const float g = dy[n] * s->coeff;
    const float *v = x + n * dim;
    float *d = dx + n * dim;
    switch (p->operation) {
      case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__ASUM:
        for (int64_t i = 0; i < dim; i++) d[i] = (float)((v[i] > 0) - (v[i] < 0)) * g;
        break;
      case CAFFE__REDUCTION_PARAMETER__REDUCTION_OP__SUMSQ:
        for (int64_t i = 0; i < dim; i++) d[i] = 2 * v[i] * g;
        break;
      default:
        for (int64_t i = 0; i < dim; i++) d[i] = g;
        break;
    }
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_reduction = {
    .type = "Reduction", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = reduction_setup, .reshape = reduction_reshape, .forward = reduction_forward,
    .backward = reduction_backward, .destroy = free_priv,
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
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data, *sd = l->buffer[0]->data;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (rows * dim > 32768)
  for (int64_t r = 0; r < rows; r++) {
    const float *v = x + r * dim;
    float *o = y + r * dim;
    double sum = 0;
    for (int64_t i = 0; i < dim; i++) sum += v[i];
    const float mean = (float)(sum / (double)dim);
    for (int64_t i = 0; i < dim; i++) o[i] = v[i] - mean;
    sd[r] = 1;
    if (!p->normalize_variance) continue;
    double sq = 0;
    for (int64_t i = 0; i < dim; i++) sq += (double)o[i] * o[i];
    sd[r] = sqrtf((float)(sq / (double)dim)) + p->eps;
    for (int64_t i = 0; i < dim; i++) o[i] /= sd[r];
  }
  if (l->nbuffer > 1)
    memcpy(l->buffer[1]->data, y, sizeof(float) * (size_t)l->bottom[0]->count);
  return KILN_OK;
}

static int mvn_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__MVNParameter *p = mvn_param(l);
  const int64_t rows = mvn_rows(l);
  const int64_t dim = rows ? l->bottom[0]->count / rows : 0;
  const float *y = l->nbuffer > 1 ? l->buffer[1]->data : l->top[0]->data;
  const float *dy = l->top[0]->diff, *sd = l->buffer[0]->data;
  float *dx = l->bottom[0]->diff;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (rows * dim > 32768)
  for (int64_t r = 0; r < rows; r++) {
    const float *o = y + r * dim, *g = dy + r * dim;
    float *d = dx + r * dim;
    double sg = 0, syg = 0;
    for (int64_t i = 0; i < dim; i++) {
      sg += g[i];
      syg += (double)o[i] * g[i];
    }
    const float mg = (float)(sg / (double)dim), myg = (float)(syg / (double)dim);
    if (p->normalize_variance)
      for (int64_t i = 0; i < dim; i++) d[i] = (g[i] - mg - o[i] * myg) / sd[r];
    else
      for (int64_t i = 0; i < dim; i++) d[i] = g[i] - mg;
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_mvn = {
    .type = "MVN", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = mvn_setup, .reshape = mvn_reshape, .forward = mvn_forward,
    .backward = mvn_backward,
};
