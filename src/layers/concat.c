/* Concat (Caffe's): joins the bottoms along concat_param.axis (default 1, the channels; the
 * deprecated concat_dim when axis is not given); every other axis must agree. Backward hands
 * each bottom its part of the top's gradient. */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__ConcatParameter concat_defaults = CAFFE__CONCAT_PARAMETER__INIT;

typedef struct {
  int axis;
  int64_t outer, inner, top_dim; /* top_dim: the top's size on the axis */
} concat_state;

static int concat_setup(kiln_layer *l) {
  const Caffe__ConcatParameter *p = KILN_PARAM_OR(l->lp->concat_param, concat_defaults);
  const kiln_blob *x = l->bottom[0];
  concat_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  if (p->has_axis && p->has_concat_dim)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "give concat_param.axis or the deprecated concat_dim, not both");
  if (p->has_concat_dim) {
    if (p->concat_dim >= (uint32_t)x->naxes)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "concat_dim %u out of range for %d-axis bottoms",
                              p->concat_dim, x->naxes);
    s->axis = (int)p->concat_dim;
  } else {
    int rc = kiln_blob_canonical_axis(x, p->axis, &s->axis);
    if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  }
  for (int b = 0; b < l->nbottom; b++)
    if (l->top[0] == l->bottom[b])
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot run in place (top is bottom %d)", b);
  return KILN_OK;
}

static int concat_reshape(kiln_layer *l) {
  concat_state *s = l->priv;
  const kiln_blob *x0 = l->bottom[0];
  int a = s->axis;
  if (a >= x0->naxes)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "axis %d out of range for %d-axis bottoms", a,
                            x0->naxes);
  int64_t total = 0;
  for (int b = 0; b < l->nbottom; b++) {
    const kiln_blob *xb = l->bottom[b];
    char s0[128], sb[128];
    if (xb->naxes != x0->naxes)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "bottom %d '%s' has shape %s (%d axes), bottom 0 '%s' has %s (%d "
                              "axes): all bottoms need the same number of axes",
                              b, xb->name, kiln_blob_shape_string(xb, sb, sizeof sb), xb->naxes,
                              x0->name, kiln_blob_shape_string(x0, s0, sizeof s0), x0->naxes);
    for (int i = 0; i < x0->naxes; i++)
      if (i != a && xb->shape[i] != x0->shape[i])
        return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                                "bottom %d '%s' has shape %s, bottom 0 '%s' has %s: they differ on "
                                "axis %d, but only the concatenation axis %d may differ",
                                b, xb->name, kiln_blob_shape_string(xb, sb, sizeof sb), x0->name,
                                kiln_blob_shape_string(x0, s0, sizeof s0), i, a);
    total += xb->shape[a];
  }
  s->outer = kiln_count(x0, 0, a);
  s->inner = kiln_count(x0, a + 1, x0->naxes);
  s->top_dim = total;
  int64_t shape[KILN_MAX_AXES];
  memcpy(shape, x0->shape, sizeof(int64_t) * (size_t)x0->naxes);
  shape[a] = total;
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], x0->naxes, shape);
}

static int concat_forward(kiln_layer *l) {
  concat_state *s = l->priv;
  float *y = l->top[0]->data;
  int64_t at = 0; /* offset on the axis */
  for (int b = 0; b < l->nbottom; b++) {
    int64_t block = l->bottom[b]->shape[s->axis] * s->inner;
    KILN_TRY(KILN_OP(l, copy_blocks, y + at * s->inner, s->top_dim * s->inner,
                     l->bottom[b]->data, block, block, s->outer));
    at += l->bottom[b]->shape[s->axis];
  }
  return KILN_OK;
}

static int concat_backward(kiln_layer *l) {
  concat_state *s = l->priv;
  const float *dy = l->top[0]->diff;
  int64_t at = 0;
  for (int b = 0; b < l->nbottom; b++) {
    int64_t block = l->bottom[b]->shape[s->axis] * s->inner;
    if (l->propagate_down[b])
      KILN_TRY(KILN_OP(l, copy_blocks, l->bottom[b]->diff, block, dy + at * s->inner,
                       s->top_dim * s->inner, block, s->outer));
    at += l->bottom[b]->shape[s->axis];
  }
  return KILN_OK;
}

static void concat_destroy(kiln_layer *l) { free(l->priv); }

/* The first bottom is the start of the top along the axis; backward copies diffs only. */
static int concat_prefix_axis(const kiln_layer *l) {
  return ((const concat_state *)l->priv)->axis;
}

const kiln_layer_ops kiln_layer_concat = {
    .type = "Concat", .min_bottoms = 1, .max_bottoms = -1, .min_tops = 1, .max_tops = 1,
    .setup = concat_setup, .reshape = concat_reshape, .forward = concat_forward,
    .backward = concat_backward, .destroy = concat_destroy, .prefix_axis = concat_prefix_axis,
    .backward_reads = kiln_reads_none, .kernels = KILN_KERNELS(KILN_OP_copy_blocks),
};
