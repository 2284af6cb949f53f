/* The ONNX forms of the SSD fork's layers that a detection net's heads are made of: Normalize
 * (L2 normalisation times a learned scale) and PriorBox (the default boxes, which depend on the
 * shapes alone and so are a constant of the model). Permute is layers_shape.c's. DetectionOutput
 * (decoding, per-class NMS, top-k) has no form: a detection net exports up to its inputs
 * (--outputs mbox_loc,mbox_conf_flatten,mbox_priorbox) and the caller decodes, as OpenCV's and
 * TensorRT's SSD samples do. */
#include <string.h>

#include "onnx_internal.h"

/* Normalize: x / sqrt(sum of x^2 over the group + eps) * scale: ReduceSumSquare (the channels,
 * or with across_spatial every axis after the batch), Add, Sqrt, Div, Mul by the scale (one
 * value, or one a channel shaped C x 1 x ...). */
static int emit_normalize(ox_graph *g) {
  static const Caffe__NormalizeParameter defaults = CAFFE__NORMALIZE_PARAMETER__INIT;
  const kiln_layer *l = g->l;
  const Caffe__NormalizeParameter *p = l->lp->norm_param ? l->lp->norm_param : &defaults;
  const kiln_blob *x = l->bottom[0];
  const char *in = ox_bottom(g, 0);
  int64_t axes[KILN_MAX_AXES];
  int na = 0;
  for (int a = 1; a < (p->across_spatial ? x->naxes : 2); a++) axes[na++] = a;
  /* ReduceSumSquare takes its axes as an attribute in opset 13 (ReduceSum as an input, which
   * OpenCV 4.6's importer does not read) */
  const char *sum = ox_tmp(g, "sum");
  Onnx__NodeProto *rs = ox_node1(g, "ReduceSumSquare", in, sum);
  TRY_NODE(rs);
  KILN_TRY(ox_attr_ints(g, rs, "axes", na, axes));
  KILN_TRY(ox_attr_int(g, rs, "keepdims", 1));
  const char *se = ox_op2(g, "Add", sum, ox_init_scalar(g, "eps", p->eps), ox_tmp(g, "sum_eps"));
  const char *nrm = ox_tmp(g, "norm");
  TRY_NODE(se && ox_node1(g, "Sqrt", se, nrm));
  const char *y = ox_op2(g, "Div", in, nrm, ox_tmp(g, "normalized"));
  int64_t dims[KILN_MAX_AXES];
  int nd = 1;
  dims[0] = p->channel_shared ? 1 : x->shape[1];
  if (!p->channel_shared)
    for (int a = 2; a < x->naxes; a++) dims[nd++] = 1;
  const char *out = ox_top(g, 0);
  TRY_NODE(y && ox_op2(g, "Mul", y, ox_init_float(g, "scale", nd, dims, ox_param(g, 0)), out));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* PriorBox: the layer's own boxes (1 x 2 x 4P: the corners, then the variances), worked out by
 * one forward of the layer, as a constant. */
static int emit_prior_box(ox_graph *g) {
  if (g->opt->dynamic_batch)
    return ox_refuse(g, "its output's first axis is 1 at any batch size: not exported with "
                     "--dynamic-batch");
  /* the layer's forward writes its top from the shapes alone (nothing else of the net's) */
  kiln_layer *l = (kiln_layer *)g->l;
  KILN_TRY(l->ops->forward(l));
  const kiln_blob *y = l->top[0];
  float *v = ox_alloc(g, sizeof(float) * (size_t)y->count);
  if (!v) return KILN_ERR_NOMEM;
  KILN_TRY(kiln_net_blob_read(g->net, y, v, y->count));
  int64_t dims[KILN_MAX_AXES];
  for (int a = 0; a < y->naxes; a++) dims[a] = y->shape[a];
  /* the initializer itself is the top's value (no node: OpenCV's importer folds constants
   * into the nodes that read them, but not an Identity of one) */
  const char *c = ox_init_float(g, "boxes", y->naxes, dims, v);
  TRY_NODE(c);
  ox_set_top(g, 0, c);
  return KILN_OK;
}

const ox_layer_form ox_forms_det[] = {
    {"Normalize", emit_normalize},
    {"PriorBox", emit_prior_box},
    {NULL, NULL},
};
