/* Slice (Caffe's): cuts the bottom along slice_param.axis (default 1; the deprecated slice_dim
 * when axis is not given) at the slice_point offsets, one piece per top; without slice points
 * the axis is split into equal parts. Backward puts the tops' gradients back together. */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__SliceParameter slice_defaults = CAFFE__SLICE_PARAMETER__INIT;

typedef struct {
  int axis;
  int64_t outer, inner, bottom_dim; /* bottom_dim: the bottom's size on the axis */
  int64_t *size;                    /* per top, its size on the axis */
} slice_state;

static int slice_setup(kiln_layer *l) {
  const Caffe__SliceParameter *p = KILN_PARAM_OR(l->lp->slice_param, slice_defaults);
  const kiln_blob *x = l->bottom[0];
  slice_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->size = calloc((size_t)l->ntop, sizeof *s->size);
  if (!s->size) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (p->has_axis && p->has_slice_dim)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "give slice_param.axis or the deprecated slice_dim, not both");
  if (p->has_slice_dim) {
    if (p->slice_dim >= (uint32_t)x->naxes)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "slice_dim %u out of range for a %d-axis bottom",
                              p->slice_dim, x->naxes);
    s->axis = (int)p->slice_dim;
  } else {
    int rc = kiln_blob_canonical_axis(x, p->axis, &s->axis);
    if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  }
  if (p->n_slice_point && (int)p->n_slice_point != l->ntop - 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "%zu slice_point values for %d tops (give one fewer than the tops, "
                            "or none to split equally)",
                            p->n_slice_point, l->ntop);
  for (int t = 0; t < l->ntop; t++)
    if (l->top[t] == l->bottom[0])
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot run in place (top %d is the bottom)", t);
  return KILN_OK;
}

static int slice_reshape(kiln_layer *l) {
  const Caffe__SliceParameter *p = KILN_PARAM_OR(l->lp->slice_param, slice_defaults);
  slice_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  int a = s->axis;
  if (a >= x->naxes)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "axis %d out of range for a %d-axis bottom", a,
                            x->naxes);
  int64_t dim = x->shape[a];
  if (p->n_slice_point) {
    int64_t prev = 0;
    for (size_t i = 0; i < p->n_slice_point; i++) {
      int64_t pt = p->slice_point[i];
      if (pt <= prev)
        return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                                "slice_point %lld (index %zu) must be greater than %lld: points "
                                "must increase and be > 0",
                                (long long)pt, i, (long long)prev);
      if (pt >= dim)
        return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                                "slice_point %lld (index %zu) out of range: axis %d has size %lld",
                                (long long)pt, i, a, (long long)dim);
      s->size[i] = pt - prev;
      prev = pt;
    }
    s->size[l->ntop - 1] = dim - prev;
  } else {
    if (dim % l->ntop != 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "axis %d of size %lld cannot be split equally into %d tops (give "
                              "slice_point)",
                              a, (long long)dim, l->ntop);
    for (int t = 0; t < l->ntop; t++) s->size[t] = dim / l->ntop;
  }
  s->outer = kiln_count(x, 0, a);
  s->inner = kiln_count(x, a + 1, x->naxes);
  s->bottom_dim = dim;
  int64_t shape[KILN_MAX_AXES];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->naxes);
  for (int t = 0; t < l->ntop; t++) {
    shape[a] = s->size[t];
    KILN_TRY(kiln_blob_reshape(l->top[t], x->naxes, shape));
  }
  l->flops = 0;
  return KILN_OK;
}

static int slice_forward(kiln_layer *l) {
  slice_state *s = l->priv;
  const float *x = l->bottom[0]->data;
  int64_t at = 0;
  for (int t = 0; t < l->ntop; t++) {
    int64_t block = s->size[t] * s->inner;
    KILN_TRY(KILN_OP(l, copy_blocks, l->top[t]->data, block, x + at * s->inner,
                     s->bottom_dim * s->inner, block, s->outer));
    at += s->size[t];
  }
  return KILN_OK;
}

static int slice_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  slice_state *s = l->priv;
  float *dx = l->bottom[0]->diff;
  int64_t at = 0;
  for (int t = 0; t < l->ntop; t++) {
    int64_t block = s->size[t] * s->inner;
    KILN_TRY(KILN_OP(l, copy_blocks, dx + at * s->inner, s->bottom_dim * s->inner,
                     l->top[t]->diff, block, block, s->outer));
    at += s->size[t];
  }
  return KILN_OK;
}

static void slice_destroy(kiln_layer *l) {
  slice_state *s = l->priv;
  if (s) free(s->size);
  free(s);
}

const kiln_layer_ops kiln_layer_slice = {
    .type = "Slice", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = -1,
    .setup = slice_setup, .reshape = slice_reshape, .forward = slice_forward,
    .backward = slice_backward, .destroy = slice_destroy,
    .kernels = KILN_KERNELS(KILN_OP_copy_blocks),
};
