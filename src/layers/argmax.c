/* ArgMax: the indices (and with out_max_val the values) of the top_k largest inputs, as Caffe's
 * ArgMaxLayer lays them out:
 *   without axis: over each item's count(1) values; top N x 1 x top_k (N x 2 x top_k with
 *     out_max_val: the indices, then the values), padded with trailing 1s to the input's axes;
 *   with axis: along that axis, which becomes top_k long; out_max_val gives values instead of
 *     indices.
 * Order: larger values first; equal values put the larger index first (Caffe sorts (value,
 * index) pairs in descending order). Indices are written as floats. No backward pass. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__ArgMaxParameter argmax_defaults = CAFFE__ARG_MAX_PARAMETER__INIT;

typedef struct {
  int64_t dim, axis_dist, num; /* values per ranking, their stride, rankings */
  void *pairs;                 /* the op's workspace for one ranking */
  int64_t cap;
} argmax_state;

static int argmax_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "cannot run in place (its top has another shape)");
  return KILN_OK;
}

static int argmax_reshape(kiln_layer *l) {
  const Caffe__ArgMaxParameter *p = KILN_PARAM_OR(l->lp->argmax_param, argmax_defaults);
  const kiln_blob *x = l->bottom[0];
  argmax_state *s = l->priv;
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    l->priv = s;
  }
  if (p->top_k < 1) return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "top_k must be at least 1");
  int64_t shape[KILN_MAX_AXES];
  int naxes;
  if (p->has_axis) {
    int axis;
    int rc = kiln_blob_canonical_axis(x, p->axis, &axis);
    if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
    s->dim = x->shape[axis];
    if ((int64_t)p->top_k > s->dim)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "top_k %u is larger than axis %d, which has %lld values", p->top_k,
                              axis, (long long)s->dim);
    s->axis_dist = kiln_count(x, axis + 1, x->naxes);
    naxes = x->naxes;
    for (int i = 0; i < naxes; i++) shape[i] = x->shape[i];
    shape[axis] = p->top_k;
  } else {
    if (x->naxes < 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input needs at least one axis (N x ...)");
    s->dim = kiln_count(x, 1, x->naxes);
    if ((int64_t)p->top_k > s->dim)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "top_k %u is larger than the %lld values of each item", p->top_k,
                              (long long)s->dim);
    s->axis_dist = 1;
    naxes = x->naxes < 3 ? 3 : x->naxes;
    for (int i = 0; i < naxes; i++) shape[i] = 1;
    shape[0] = x->shape[0];
    shape[1] = p->out_max_val ? 2 : 1;
    shape[2] = p->top_k;
  }
  s->num = s->dim ? x->count / s->dim : 0;
  if (s->dim > s->cap) {
    void *pairs = realloc(s->pairs, (size_t)kiln_argmax_workspace_bytes(s->dim));
    if (!pairs) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->pairs = pairs;
    s->cap = s->dim;
  }
  l->flops = (double)x->count;
  return kiln_blob_reshape(l->top[0], naxes, shape);
}

static int argmax_forward(kiln_layer *l) {
  const Caffe__ArgMaxParameter *p = KILN_PARAM_OR(l->lp->argmax_param, argmax_defaults);
  argmax_state *s = l->priv;
  return KILN_OP(l, argmax_fwd, l->top[0]->data, s->pairs, l->bottom[0]->data, s->num, s->dim,
                 s->axis_dist, p->top_k, p->out_max_val, p->has_axis);
}

static void argmax_destroy(kiln_layer *l) {
  argmax_state *s = l->priv;
  if (s) free(s->pairs);
  free(s);
}

const kiln_layer_ops kiln_layer_argmax = {
    .type = "ArgMax", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = argmax_setup, .reshape = argmax_reshape, .forward = argmax_forward,
    .destroy = argmax_destroy, .kernels = KILN_KERNELS(KILN_OP_argmax_fwd),
};
