/* The ONNX forms of the layers that only arrange values: Concat, Slice, Flatten, Reshape and
 * Permute; and MatMul, the product of two computed blobs, whose transposes are Transposes.
 * Shapes come from the blobs the net built; with --dynamic-batch, the first axis is copied from
 * the input (0 in a Reshape target) and a layer that would have to fix it is refused. */
#include <stdio.h>
#include <string.h>

#include "onnx_internal.h"

/* The axis of Concat and Slice: the deprecated *_dim when given, else axis (negative from the
 * end). */
static int arrange_axis(const ox_graph *g, bool has_dim, uint32_t dim, int axis, int *out) {
  if (has_dim) {
    *out = (int)dim;
    return KILN_OK;
  }
  return kiln_blob_canonical_axis(g->l->bottom[0], axis, out);
}

static int emit_concat(ox_graph *g) {
  const kiln_layer *l = g->l;
  const Caffe__ConcatParameter *p = l->lp->concat_param;
  int axis;
  KILN_TRY(arrange_axis(g, p && p->has_concat_dim, p ? p->concat_dim : 0, p ? p->axis : 1,
                        &axis));
  const char **in = ox_alloc(g, sizeof(char *) * (size_t)l->nbottom);
  if (!in) return KILN_ERR_NOMEM;
  for (int b = 0; b < l->nbottom; b++) in[b] = ox_bottom(g, b);
  const char *out = ox_top(g, 0);
  Onnx__NodeProto *n = ox_node(g, l->nbottom == 1 ? "Identity" : "Concat", l->nbottom, in, 1,
                               &out);
  TRY_NODE(n);
  if (l->nbottom > 1) KILN_TRY(ox_attr_int(g, n, "axis", axis));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Slice: Split along the axis into equal pieces, or one Slice node a top for pieces of different
 * sizes (Split's sizes are an input since opset 13, which OpenCV 4.6 does not read). */
static int emit_slice(ox_graph *g) {
  const kiln_layer *l = g->l;
  const Caffe__SliceParameter *p = l->lp->slice_param;
  int axis;
  KILN_TRY(arrange_axis(g, p && p->has_slice_dim, p ? p->slice_dim : 0, p ? p->axis : 1, &axis));
  if (axis == 0 && g->opt->dynamic_batch)
    return ox_refuse(g, "a slice of the batch axis fixes the batch size: not exported with "
                     "--dynamic-batch");
  const char **outs = ox_alloc(g, sizeof(char *) * (size_t)l->ntop);
  if (!outs) return KILN_ERR_NOMEM;
  bool equal = true;
  for (int t = 0; t < l->ntop; t++) {
    outs[t] = ox_top(g, t);
    equal &= l->top[t]->shape[axis] == l->top[0]->shape[axis];
  }
  const char *in = ox_bottom(g, 0);
  if (l->ntop == 1) {
    TRY_NODE(ox_node1(g, "Identity", in, outs[0]));
  } else if (equal) {
    Onnx__NodeProto *n = ox_node(g, "Split", 1, &in, l->ntop, outs);
    TRY_NODE(n);
    KILN_TRY(ox_attr_int(g, n, "axis", axis));
  } else {
    const int64_t ax = axis;
    const char *axes = ox_init_int64(g, "axes", 1, &ax);
    int64_t start = 0;
    for (int t = 0; t < l->ntop; t++) {
      const int64_t end = start + l->top[t]->shape[axis];
      const char *sin[4] = {in, ox_init_int64(g, "starts", 1, &start),
                            ox_init_int64(g, "ends", 1, &end), axes};
      TRY_NODE(ox_node(g, "Slice", 4, sin, 1, &outs[t]));
      start = end;
    }
  }
  for (int t = 0; t < l->ntop; t++) ox_set_top(g, t, outs[t]);
  return KILN_OK;
}

/* A Reshape of bottom 0 to top 0's shape; `keeps_batch`: the first axis is the input's, copied
 * (0) with --dynamic-batch; otherwise that is refused. */
static int reshape_to_top(ox_graph *g, bool keeps_batch) {
  const kiln_blob *y = g->l->top[0];
  if (g->opt->dynamic_batch && !keeps_batch)
    return ox_refuse(g, "the output's first axis is not the input's batch axis: not exported "
                     "with --dynamic-batch");
  int64_t shape[KILN_MAX_AXES];
  for (int a = 0; a < y->naxes; a++) shape[a] = y->shape[a];
  if (g->opt->dynamic_batch) shape[0] = 0;
  const char *in[2] = {ox_bottom(g, 0), ox_init_int64(g, "shape", y->naxes, shape)};
  const char *out = ox_top(g, 0);
  TRY_NODE(ox_node(g, "Reshape", 2, in, 1, &out));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Flatten: axes axis .. end_axis into one. From axis 1 to the end it is ONNX's Flatten; any other
 * range a Reshape. */
static int emit_flatten(ox_graph *g) {
  const Caffe__FlattenParameter *p = g->l->lp->flatten_param;
  const kiln_blob *x = g->l->bottom[0];
  int axis, end;
  KILN_TRY(kiln_blob_canonical_axis(x, p ? p->axis : 1, &axis));
  KILN_TRY(kiln_blob_canonical_axis(x, p ? p->end_axis : -1, &end));
  if (axis == 1 && end == x->naxes - 1) {
    const char *out = ox_top(g, 0);
    Onnx__NodeProto *n = ox_node1(g, "Flatten", ox_bottom(g, 0), out);
    TRY_NODE(n);
    KILN_TRY(ox_attr_int(g, n, "axis", 1));
    ox_set_top(g, 0, out);
    return KILN_OK;
  }
  return reshape_to_top(g, axis > 0);
}

/* Reshape: to the shape the net computed; the batch axis is kept when the reshape starts after
 * it, or copies it (dim 0). */
static int emit_reshape(ox_graph *g) {
  const Caffe__ReshapeParameter *p = g->l->lp->reshape_param;
  const kiln_blob *x = g->l->bottom[0], *y = g->l->top[0];
  bool keeps = false;
  if (p) {
    int axis = p->axis;
    if (axis < 0) axis += x->naxes + 1; /* Caffe: -1 is after the last axis */
    keeps = axis > 0 || (p->shape && p->shape->n_dim > 0 && p->shape->dim[0] == 0);
  }
  keeps = keeps && y->naxes > 0 && y->shape[0] == x->shape[0];
  return reshape_to_top(g, keeps);
}

/* A Transpose of bottom b's last two axes (a MatMul's transposed operand). */
static const char *swap_last_two(ox_graph *g, int b) {
  const int nd = g->l->bottom[b]->naxes;
  int64_t perm[KILN_MAX_AXES];
  for (int a = 0; a < nd; a++) perm[a] = a;
  perm[nd - 2] = nd - 1;
  perm[nd - 1] = nd - 2;
  const char *t = ox_tmp(g, b ? "b_t" : "a_t");
  Onnx__NodeProto *n = t ? ox_node1(g, "Transpose", ox_bottom(g, b), t) : NULL;
  if (!n || ox_attr_ints(g, n, "perm", nd, perm)) return NULL;
  return t;
}

/* MatMul: ONNX's MatMul is the layer's product with NumPy's broadcasting of the batch axes. */
static int emit_matmul(ox_graph *g) {
  const Caffe__MatMulParameter *p = g->l->lp->matmul_param;
  const char *in[2] = {ox_bottom(g, 0), ox_bottom(g, 1)};
  if (p && p->transpose_a) TRY_NODE(in[0] = swap_last_two(g, 0));
  if (p && p->transpose_b) TRY_NODE(in[1] = swap_last_two(g, 1));
  const char *out = ox_top(g, 0);
  TRY_NODE(ox_node(g, "MatMul", 2, in, 1, &out));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Permute: a Transpose by the layer's full order (the given axes, then the others in order). */
static int emit_permute(ox_graph *g) {
  const Caffe__PermuteParameter *p = g->l->lp->permute_param;
  const int nd = g->l->bottom[0]->naxes;
  int64_t perm[KILN_MAX_AXES];
  bool used[KILN_MAX_AXES] = {false};
  int n = 0;
  for (size_t i = 0; p && i < p->n_order && n < nd; i++) {
    perm[n++] = p->order[i];
    used[p->order[i]] = true;
  }
  for (int a = 0; a < nd; a++)
    if (!used[a]) perm[n++] = a;
  const char *out = ox_top(g, 0);
  Onnx__NodeProto *node = ox_node1(g, "Transpose", ox_bottom(g, 0), out);
  TRY_NODE(node);
  KILN_TRY(ox_attr_ints(g, node, "perm", nd, perm));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Silence: consumes its bottoms and writes nothing; no node (an ONNX tensor that nothing reads
 * is simply not read). */
static int emit_silence(ox_graph *g) {
  (void)g;
  return KILN_OK;
}

const ox_layer_form ox_forms_shape[] = {
    {"Silence", emit_silence},
    {"MatMul", emit_matmul},
    {"Permute", emit_permute},
    {"Concat", emit_concat},
    {"Slice", emit_slice},
    {"Flatten", emit_flatten},
    {"Reshape", emit_reshape},
    {NULL, NULL},
};
