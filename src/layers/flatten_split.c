/* Layers that move data without arithmetic: Flatten (a view of its bottom in fewer axes) and
 * Split (the net inserts it where one blob feeds several layers, so their gradients add up). */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

/* ---- Flatten --------------------------------------------------------------------------- */

static const Caffe__FlattenParameter flatten_defaults = CAFFE__FLATTEN_PARAMETER__INIT;

static int flatten_reshape(kiln_layer *l) {
  const Caffe__FlattenParameter *p = KILN_PARAM_OR(l->lp->flatten_param, flatten_defaults);
  const kiln_blob *x = l->bottom[0];
  int a, e;
  KILN_TRY(kiln_blob_canonical_axis(x, p->axis, &a));
  KILN_TRY(kiln_blob_canonical_axis(x, p->end_axis, &e));
  if (e < a) return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "end_axis before axis");
  int64_t shape[KILN_MAX_AXES];
  int n = 0;
  for (int i = 0; i < a; i++) shape[n++] = x->shape[i];
  shape[n++] = kiln_count(x, a, e + 1);
  for (int i = e + 1; i < x->naxes; i++) shape[n++] = x->shape[i];
  return kiln_blob_reshape(l->top[0], n, shape);
}

static int copy_forward(kiln_layer *l) {
  return KILN_OP(l, copy, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static int copy_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, copy, l->bottom[0]->diff, l->top[0]->diff, l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_flatten = {
    .type = "Flatten", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .reshape = flatten_reshape, .forward = copy_forward, .backward = copy_backward,
    .backward_reads = kiln_reads_none, .kernels = KILN_KERNELS(KILN_OP_copy),
};

/* ---- Split ----------------------------------------------------------------------------- */

static int split_reshape(kiln_layer *l) {
  for (int t = 0; t < l->ntop; t++) KILN_TRY(kiln_blob_reshape_like(l->top[t], l->bottom[0]));
  return KILN_OK;
}

static int split_forward(kiln_layer *l) {
  const int64_t n = l->bottom[0]->count;
  for (int t = 0; t < l->ntop; t++)
    KILN_TRY(KILN_OP(l, copy, l->top[t]->data, l->bottom[0]->data, n));
  return KILN_OK;
}

/* dx = sum of the tops' diffs, in one pass for the usual two tops. */
static int split_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  float *dx = l->bottom[0]->diff;
  const int64_t n = l->bottom[0]->count;
  const float *d0 = l->top[0]->diff;
  if (l->ntop > 1) KILN_TRY(KILN_OP(l, add, dx, d0, l->top[1]->diff, n));
  else KILN_TRY(KILN_OP(l, copy, dx, d0, n));
  for (int t = 2; t < l->ntop; t++) KILN_TRY(KILN_OP(l, acc, dx, l->top[t]->diff, n));
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_split = {
    .type = "Split", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = -1,
    .passes_through = true, .reshape = split_reshape, .forward = split_forward,
    .backward = split_backward, .layout_role = kiln_layout_any, .backward_reads = kiln_reads_none,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_add, KILN_OP_acc),
};
