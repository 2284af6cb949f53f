/* Reshape (Caffe's): gives the data a new shape without changing it. reshape_param.shape replaces
 * the bottom's axes [axis, axis + num_axes) (axis may be negative, counted so that -1 is the end;
 * num_axes -1: to the end); in it 0 copies the bottom's size on that axis and one -1 is inferred
 * from the count. kiln blobs do not share storage, so the top holds a copy (one memcpy each way). */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__ReshapeParameter reshape_defaults = CAFFE__RESHAPE_PARAMETER__INIT;

static int reshape_setup(kiln_layer *l) {
  const Caffe__ReshapeParameter *p = KILN_PARAM_OR(l->lp->reshape_param, reshape_defaults);
  if (l->top[0] == l->bottom[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot run in place: give the top its own name");
  size_t ndim = p->shape ? p->shape->n_dim : 0;
  int inferred = -1;
  for (size_t i = 0; i < ndim; i++) {
    int64_t d = p->shape->dim[i];
    if (d < -1)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "reshape_param.shape dim %zu is %lld: sizes must be > 0, 0 (copy) or "
                              "-1 (infer)",
                              i, (long long)d);
    if (d == -1) {
      if (inferred >= 0)
        return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                                "reshape_param.shape has -1 at dims %d and %zu: at most one size "
                                "can be inferred",
                                inferred, i);
      inferred = (int)i;
    }
  }
  if (p->num_axes < -1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "reshape_param.num_axes %d must be >= 0, or -1 for all", p->num_axes);
  return KILN_OK;
}

/* known *= d, saturating (a mistyped huge size must give a clear count error, not overflow). */
static int64_t times(int64_t known, int64_t d) {
  return d > 0 && known > INT64_MAX / d ? INT64_MAX : known * d;
}

static int reshape_reshape(kiln_layer *l) {
  const Caffe__ReshapeParameter *p = KILN_PARAM_OR(l->lp->reshape_param, reshape_defaults);
  const kiln_blob *x = l->bottom[0];
  char xs[128];
  kiln_blob_shape_string(x, xs, sizeof xs);
  int start = p->axis >= 0 ? p->axis : x->naxes + p->axis + 1;
  if (start < 0 || start > x->naxes)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "reshape_param.axis %d out of range for input %s",
                            p->axis, xs);
  int end = p->num_axes == -1 ? x->naxes : start + p->num_axes;
  if (end > x->naxes)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "reshape_param axis %d + num_axes %d runs past the %d axes of input %s",
                            p->axis, p->num_axes, x->naxes, xs);
  int ndim = p->shape ? (int)p->shape->n_dim : 0;
  int naxes = start + ndim + (x->naxes - end);
  if (naxes > KILN_MAX_AXES)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the new shape has %d axes (at most %d)", naxes,
                            KILN_MAX_AXES);
  int64_t shape[KILN_MAX_AXES];
  int n = 0, inferred = -1;
  int64_t known = 1; /* product of every top size but the inferred one */
  for (int i = 0; i < start; i++) known = times(known, shape[n++] = x->shape[i]);
  for (int i = 0; i < ndim; i++) {
    int64_t d = p->shape->dim[i];
    if (d == 0) {
      if (start + i >= x->naxes)
        return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                                "reshape_param.shape dim %d is 0 (copy) but input %s has no axis "
                                "%d to copy",
                                i, xs, start + i);
      d = x->shape[start + i];
    }
    if (d == -1) {
      inferred = n;
      shape[n++] = 1;
      continue;
    }
    known = times(known, shape[n++] = d);
  }
  for (int i = end; i < x->naxes; i++) known = times(known, shape[n++] = x->shape[i]);
  if (inferred >= 0) {
    if (known == 0 || x->count % known != 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "input %s has %lld elements, not divisible by %lld (the product of "
                              "the other sizes), so the -1 cannot be inferred",
                              xs, (long long)x->count, (long long)known);
    shape[inferred] = x->count / known;
    known = times(known, shape[inferred]);
  }
  if (known != x->count)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the new shape holds %lld elements, input %s has %lld", (long long)known,
                            xs, (long long)x->count);
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], n, shape);
}

static int reshape_forward(kiln_layer *l) {
  return KILN_OP(l, copy, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static int reshape_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, copy, l->bottom[0]->diff, l->top[0]->diff, l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_reshape = {
    .type = "Reshape", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = reshape_setup, .reshape = reshape_reshape, .forward = reshape_forward,
    .backward = reshape_backward, .backward_reads = kiln_reads_none,
    .kernels = KILN_KERNELS(KILN_OP_copy),
};
