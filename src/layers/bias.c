/* Bias (Caffe's): y = x + b, with b spanning the input's axes [axis, axis + num_axes) (num_axes
 * -1: to the end; 0: one scalar) and broadcast over the others. b is a learnable blob
 * (bias_param.filler, default constant 0), or the second bottom, which then receives the
 * gradient. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__BiasParameter bias_defaults = CAFFE__BIAS_PARAMETER__INIT;

typedef struct {
  bool from_bottom; /* b is bottom[1] */
  int64_t outer, dim, inner;
} bias_state;

static int axis_error(kiln_layer *l, int rc) {
  return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
}

static int bias_setup(kiln_layer *l) {
  const Caffe__BiasParameter *p = KILN_PARAM_OR(l->lp->bias_param, bias_defaults);
  const kiln_blob *x = l->bottom[0];
  bias_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->from_bottom = l->nbottom > 1;
  if (s->from_bottom) return KILN_OK; /* its axes are checked against the input's in reshape */
  int axis, rc = kiln_blob_canonical_axis(x, p->axis, &axis);
  if (rc) return axis_error(l, rc);
  if (p->num_axes < -1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "bias_param.num_axes %d must be >= 0, or -1 for all axes from axis",
                            p->num_axes);
  if (p->num_axes >= 0 && axis + p->num_axes > x->naxes) {
    char buf[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "bias_param axis %d + num_axes %d runs past the %d axes of input %s",
                            axis, p->num_axes, x->naxes, kiln_blob_shape_string(x, buf, sizeof buf));
  }
  int naxes = p->num_axes == -1 ? x->naxes - axis : p->num_axes;
  if (!kiln_layer_add_param(l, naxes, x->shape + axis, p->filler, 0.0f))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int bias_reshape(kiln_layer *l) {
  const Caffe__BiasParameter *p = KILN_PARAM_OR(l->lp->bias_param, bias_defaults);
  bias_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  const kiln_blob *b = s->from_bottom ? l->bottom[1] : l->param[0];
  int axis = 0; /* a scalar bias applies the same at any axis */
  if (b->naxes > 0) {
    int rc = kiln_blob_canonical_axis(x, p->axis, &axis);
    if (rc) return axis_error(l, rc);
  }
  bool ok = axis + b->naxes <= x->naxes;
  for (int i = 0; ok && i < b->naxes; i++) ok = x->shape[axis + i] == b->shape[i];
  if (!ok) {
    char xs[128], bs[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "bias %s (%s) does not match input %s from axis %d",
                            kiln_blob_shape_string(b, bs, sizeof bs),
                            s->from_bottom ? "bottom 1" : "parameter",
                            kiln_blob_shape_string(x, xs, sizeof xs), axis);
  }
  s->outer = kiln_count(x, 0, axis);
  s->dim = b->count;
  s->inner = kiln_count(x, axis + b->naxes, x->naxes);
  l->flops = (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

static int bias_forward(kiln_layer *l) {
  bias_state *s = l->priv;
  const float *b = (s->from_bottom ? l->bottom[1] : l->param[0])->data;
  return KILN_OP(l, bias_fwd, l->top[0]->data, l->bottom[0]->data, b, s->outer, s->dim, s->inner);
}

/* dx = dy; a b from the second bottom gets its gradient overwritten, not accumulated. */
static int bias_backward(kiln_layer *l) {
  bias_state *s = l->priv;
  const float *dy = l->top[0]->diff;
  float *db = NULL;
  bool accumulate = true;
  if (!s->from_bottom) {
    db = l->param[0]->diff;
  } else if (l->propagate_down[1]) {
    db = l->bottom[1]->diff;
    accumulate = false; /* bottom diffs are overwritten */
  }
  if (db) KILN_TRY(KILN_OP(l, bias_bwd, db, dy, s->outer, s->dim, s->inner, accumulate));
  if (l->propagate_down[0])
    KILN_TRY(KILN_OP(l, copy, l->bottom[0]->diff, dy, l->bottom[0]->count));
  return KILN_OK;
}

static void bias_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_bias = {
    .type = "Bias", .min_bottoms = 1, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = bias_setup, .reshape = bias_reshape, .forward = bias_forward,
    .backward = bias_backward, .destroy = bias_destroy,
    .kernels = KILN_KERNELS(KILN_OP_bias_fwd, KILN_OP_bias_bwd, KILN_OP_copy),
};
