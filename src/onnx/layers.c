/* The ONNX forms of the layers that compute (docs/onnx.md's table): convolution, pooling, inner
 * product, the neurons, normalisation, Eltwise, Softmax and ArgMax. Each emitter reads the
 * layer's Caffe parameters and its blobs' shapes as the net built them, and writes nodes whose
 * result is what kiln computes at inference, to float rounding. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "onnx_internal.h"

/* A Caffe value given once, per axis (repeated) or as *_h / *_w, into out[0] (h) and out[1]. */
static void pick2(size_t n, const uint32_t *v, bool has_h, uint32_t h, bool has_w, uint32_t w,
                  int64_t dflt, int64_t *out) {
  if (has_h || has_w) {
    out[0] = has_h ? h : dflt;
    out[1] = has_w ? w : dflt;
  } else if (n == 0) {
    out[0] = out[1] = dflt;
  } else {
    out[0] = v[0];
    out[1] = n > 1 ? v[1] : v[0];
  }
}

/* One node from bottom 0 to top 0. */
static Onnx__NodeProto *unary(ox_graph *g, const char *op) {
  const char *out = ox_top(g, 0);
  Onnx__NodeProto *n = ox_node1(g, op, ox_bottom(g, 0), out);
  if (n) ox_set_top(g, 0, out);
  return n;
}

/* ---- convolution and pooling ------------------------------------------------------------- */

static int emit_conv(ox_graph *g) {
  const kiln_layer *l = g->l;
  const Caffe__ConvolutionParameter *p = l->lp->convolution_param;
  static const Caffe__ConvolutionParameter defaults = CAFFE__CONVOLUTION_PARAMETER__INIT;
  if (!p) p = &defaults;
  const bool deconv = !strcmp(l->ops->type, "Deconvolution");
  int64_t k[2], pad[2], stride[2], dil[2];
  pick2(p->n_kernel_size, p->kernel_size, p->has_kernel_h, p->kernel_h, p->has_kernel_w,
        p->kernel_w, 0, k);
  pick2(p->n_pad, p->pad, p->has_pad_h, p->pad_h, p->has_pad_w, p->pad_w, 0, pad);
  pick2(p->n_stride, p->stride, p->has_stride_h, p->stride_h, p->has_stride_w, p->stride_w, 1,
        stride);
  pick2(p->n_dilation, p->dilation, false, 0, false, 0, 1, dil);
  if (l->bottom[0]->naxes != 4 || l->param[0]->naxes != 4)
    return ox_refuse(g, "only 2-D convolution (N x C x H x W) is exported");
  const bool bias = l->nparam > 1;
  const char *in[3] = {ox_bottom(g, 0), NULL, NULL};
  in[1] = ox_init_float(g, "weight", 4, l->param[0]->shape, ox_param(g, 0));
  if (bias) in[2] = ox_init_float(g, "bias", 1, l->param[1]->shape, ox_param(g, 1));
  const char *out = ox_top(g, 0);
  Onnx__NodeProto *n = ox_node(g, deconv ? "ConvTranspose" : "Conv", bias ? 3 : 2, in, 1, &out);
  TRY_NODE(n);
  const int64_t pads[4] = {pad[0], pad[1], pad[0], pad[1]};
  KILN_TRY(ox_attr_ints(g, n, "kernel_shape", 2, k));
  KILN_TRY(ox_attr_ints(g, n, "strides", 2, stride));
  KILN_TRY(ox_attr_ints(g, n, "pads", 4, pads));
  KILN_TRY(ox_attr_ints(g, n, "dilations", 2, dil));
  KILN_TRY(ox_attr_int(g, n, "group", p->group));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Caffe's pooling windows (src/ops/pool.c): out = ceil or floor of (in + 2 pad - k) / stride,
 * plus 1, less one where the last window would start past the input and its first padding;
 * windows clipped to the input for MAX; for AVE, the sum over the window clipped to the input,
 * divided by the window clipped to [-pad, in + pad): the padding counts, but not the part of the
 * last window that runs past in + pad. ONNX's pads are explicit here (no ceil_mode): the begin
 * pad, and at the end the pad plus the overhang of the last window, so that ONNX's floor rule
 * gives Caffe's size. MAX ignores padding (-inf). For AVE the padding is made real, a Pad node of
 * zeros, and the pooling then pads only the overhang, which count_include_pad 0 leaves out of
 * the divisor: exact whatever a runtime does with count_include_pad 1 and ceil_mode, on which
 * they differ (OpenCV 4.6 divides by the unpadded window). */
static int emit_pool(ox_graph *g) {
  const kiln_layer *l = g->l;
  const Caffe__PoolingParameter *p = l->lp->pooling_param;
  static const Caffe__PoolingParameter defaults = CAFFE__POOLING_PARAMETER__INIT;
  if (!p) p = &defaults;
  const bool max = p->pool == CAFFE__POOLING_PARAMETER__POOL_METHOD__MAX;
  if (!max && p->pool != CAFFE__POOLING_PARAMETER__POOL_METHOD__AVE)
    return ox_refuse(g, "STOCHASTIC pooling has no ONNX form");
  const kiln_blob *x = l->bottom[0], *y = l->top[0];
  if (p->global_pooling) {
    if (!unary(g, max ? "GlobalMaxPool" : "GlobalAveragePool")) return KILN_ERR_NOMEM;
    return KILN_OK;
  }
  int64_t k[2], pad[2], stride[2], over[2];
  k[0] = p->has_kernel_size ? p->kernel_size : p->kernel_h;
  k[1] = p->has_kernel_size ? p->kernel_size : p->kernel_w;
  pad[0] = p->has_pad_h ? p->pad_h : p->pad;
  pad[1] = p->has_pad_w ? p->pad_w : p->pad;
  stride[0] = p->has_stride_h ? p->stride_h : p->stride;
  stride[1] = p->has_stride_w ? p->stride_w : p->stride;
  for (int a = 0; a < 2; a++) {
    const int64_t in = x->shape[2 + a], out = y->shape[2 + a];
    over[a] = (out - 1) * stride[a] + k[a] - in - 2 * pad[a];
    if (over[a] < 0) over[a] = 0;
    /* ONNX's size (floor) with these pads must be Caffe's */
    if ((in + 2 * pad[a] + over[a] - k[a]) / stride[a] + 1 != out)
      return ox_fail(g, KILN_ERR_INTERNAL, "no ONNX padding gives Caffe's output size %lld "
                     "(axis %d)", (long long)out, 2 + a);
  }
  const char *in = ox_bottom(g, 0);
  int64_t pads[4] = {pad[0], pad[1], pad[0] + over[0], pad[1] + over[1]};
  if (!max && (pad[0] || pad[1])) {
    const int64_t zero_pads[8] = {0, 0, pad[0], pad[1], 0, 0, pad[0], pad[1]};
    const char *pv = ox_init_int64(g, "pads", 8, zero_pads);
    const char *padded = ox_tmp(g, "padded");
    const char *pin[2] = {in, pv};
    TRY_NODE(ox_node(g, "Pad", 2, pin, 1, &padded));
    in = padded;
    pads[0] = pads[1] = 0;
    pads[2] = over[0];
    pads[3] = over[1];
  }
  const char *out = ox_top(g, 0);
  Onnx__NodeProto *n = ox_node1(g, max ? "MaxPool" : "AveragePool", in, out);
  TRY_NODE(n);
  KILN_TRY(ox_attr_ints(g, n, "kernel_shape", 2, k));
  KILN_TRY(ox_attr_ints(g, n, "strides", 2, stride));
  KILN_TRY(ox_attr_ints(g, n, "pads", 4, pads));
  if (!max) KILN_TRY(ox_attr_int(g, n, "count_include_pad", 0));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- inner product ---------------------------------------------------------------------- */

/* y = x W^T + b over x flattened from `axis` (Caffe's InnerProduct): Flatten and Gemm for axis
 * 1; otherwise x reshaped to its first `axis` axes and one more, MatMul with W^T (K x N, written
 * transposed) and Add. */
static int emit_inner_product(ox_graph *g) {
  const kiln_layer *l = g->l;
  const Caffe__InnerProductParameter *p = l->lp->inner_product_param;
  static const Caffe__InnerProductParameter defaults = CAFFE__INNER_PRODUCT_PARAMETER__INIT;
  if (!p) p = &defaults;
  const kiln_blob *x = l->bottom[0];
  int axis;
  KILN_TRY(kiln_blob_canonical_axis(x, p->axis, &axis));
  const bool bias = l->nparam > 1;
  const int64_t nout = p->num_output, K = kiln_blob_count_range(x, axis, x->naxes);
  const char *in = ox_bottom(g, 0), *out = ox_top(g, 0);
  if (axis == 1) {
    if (x->naxes != 2) {
      const char *flat = ox_tmp(g, "flat");
      Onnx__NodeProto *f = ox_node1(g, "Flatten", in, flat);
      TRY_NODE(f);
      KILN_TRY(ox_attr_int(g, f, "axis", 1));
      in = flat;
    }
    const int64_t wdims[2] = {p->transpose ? K : nout, p->transpose ? nout : K};
    const char *gin[3] = {in, ox_init_float(g, "weight", 2, wdims, ox_param(g, 0)), NULL};
    if (bias) gin[2] = ox_init_float(g, "bias", 1, &nout, ox_param(g, 1));
    Onnx__NodeProto *n = ox_node(g, "Gemm", bias ? 3 : 2, gin, 1, &out);
    TRY_NODE(n);
    if (!p->transpose) KILN_TRY(ox_attr_int(g, n, "transB", 1));
    ox_set_top(g, 0, out);
    return KILN_OK;
  }
  if (axis == 0 && g->opt->dynamic_batch)
    return ox_refuse(g, "axis 0 takes the whole batch as one vector: not exported with "
                     "--dynamic-batch");
  if (x->naxes != axis + 1) {
    int64_t shape[KILN_MAX_AXES + 1];
    for (int a = 0; a < axis; a++) shape[a] = 0; /* copied from the input */
    shape[axis] = -1;
    const char *sv = ox_init_int64(g, "shape", axis + 1, shape);
    const char *flat = ox_tmp(g, "flat");
    const char *rin[2] = {in, sv};
    TRY_NODE(ox_node(g, "Reshape", 2, rin, 1, &flat));
    in = flat;
  }
  /* W^T as K x N */
  const float *w = ox_param(g, 0), *wt = w;
  if (!p->transpose) {
    float *t = ox_alloc(g, sizeof(float) * (size_t)(K * nout));
    if (!t) return KILN_ERR_NOMEM;
    for (int64_t i = 0; i < nout; i++)
      for (int64_t j = 0; j < K; j++) t[j * nout + i] = w[i * K + j];
    wt = t;
  }
  const int64_t wdims[2] = {K, nout};
  const char *min[2] = {in, ox_init_float(g, "weight", 2, wdims, wt)};
  const char *prod = bias ? ox_tmp(g, "matmul") : out;
  TRY_NODE(ox_node(g, "MatMul", 2, min, 1, &prod));
  if (bias) {
    const char *ain[2] = {prod, ox_init_float(g, "bias", 1, &nout, ox_param(g, 1))};
    TRY_NODE(ox_node(g, "Add", 2, ain, 1, &out));
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- neurons ---------------------------------------------------------------------------- */

static int emit_relu(ox_graph *g) {
  const Caffe__ReLUParameter *p = g->l->lp->relu_param;
  if (p && p->negative_slope != 0) {
    Onnx__NodeProto *n = unary(g, "LeakyRelu");
    TRY_NODE(n);
    return ox_attr_float(g, n, "alpha", p->negative_slope);
  }
  return unary(g, "Relu") ? KILN_OK : KILN_ERR_NOMEM;
}

static int emit_simple(ox_graph *g) {
  static const struct {
    const char *caffe, *onnx;
  } map[] = {{"Sigmoid", "Sigmoid"}, {"TanH", "Tanh"}, {"AbsVal", "Abs"}, {"BNLL", "Softplus"}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(g->l->ops->type, map[i].caffe))
      return unary(g, map[i].onnx) ? KILN_OK : KILN_ERR_NOMEM;
  return ox_fail(g, KILN_ERR_INTERNAL, "no simple form");
}

static int emit_elu(ox_graph *g) {
  const Caffe__ELUParameter *p = g->l->lp->elu_param;
  Onnx__NodeProto *n = unary(g, "Elu");
  TRY_NODE(n);
  return ox_attr_float(g, n, "alpha", p ? p->alpha : 1.0f);
}

/* The shape a per-channel vector of C values takes to broadcast against an input of `naxes`
 * axes (channels on axis 1): C, 1, 1, ... */
static int channel_dims(int naxes, int64_t C, int64_t *dims) {
  dims[0] = C;
  for (int a = 2; a < naxes; a++) dims[a - 1] = 1;
  return naxes > 1 ? naxes - 1 : 1;
}

static int emit_prelu(ox_graph *g) {
  const kiln_layer *l = g->l;
  int64_t dims[KILN_MAX_AXES];
  int nd;
  if (l->param[0]->count == 1 && l->param[0]->naxes == 0) { /* channel_shared */
    dims[0] = 1;
    nd = 1;
  } else {
    nd = channel_dims(l->bottom[0]->naxes, l->param[0]->count, dims);
  }
  const char *in[2] = {ox_bottom(g, 0), ox_init_float(g, "slope", nd, dims, ox_param(g, 0))};
  const char *out = ox_top(g, 0);
  TRY_NODE(ox_node(g, "PRelu", 2, in, 1, &out));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* `in` times a scalar (skipped when 1), plus a scalar (skipped when 0): the name of the result
 * (`in` itself when both are skipped), the last node writing `last` when it is not NULL. */
static const char *affine(ox_graph *g, const char *in, float scale, float shift,
                          const char *last) {
  const bool mul = scale != 1.0f, add = shift != 0.0f;
  if (mul) {
    const char *out = add || !last ? ox_tmp(g, "scaled") : last;
    const char *min[2] = {in, ox_init_scalar(g, "scale", scale)};
    if (!ox_node(g, "Mul", 2, min, 1, &out)) return NULL;
    in = out;
  }
  if (add) {
    const char *out = last ? last : ox_tmp(g, "shifted");
    const char *ain[2] = {in, ox_init_scalar(g, "shift", shift)};
    if (!ox_node(g, "Add", 2, ain, 1, &out)) return NULL;
    in = out;
  }
  return in;
}

/* Power: (shift + scale x)^power. */
static int emit_power(ox_graph *g) {
  static const Caffe__PowerParameter defaults = CAFFE__POWER_PARAMETER__INIT;
  const Caffe__PowerParameter *p = g->l->lp->power_param ? g->l->lp->power_param : &defaults;
  const char *out = ox_top(g, 0), *in = ox_bottom(g, 0);
  const bool pw = p->power != 1.0f;
  if (!pw && p->scale == 1.0f && p->shift == 0.0f) {
    TRY_NODE(ox_node1(g, "Identity", in, out));
  } else {
    const char *t = affine(g, in, p->scale, p->shift, pw ? NULL : out);
    if (!t) return KILN_ERR_NOMEM;
    if (pw) {
      const char *pin[2] = {t, ox_init_scalar(g, "power", p->power)};
      TRY_NODE(ox_node(g, "Pow", 2, pin, 1, &out));
    }
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Exp: base^(shift + scale x), as Caffe computes it: base^shift * exp(ln(base) scale x) (base -1:
 * e). */
static int emit_exp(ox_graph *g) {
  static const Caffe__ExpParameter defaults = CAFFE__EXP_PARAMETER__INIT;
  const Caffe__ExpParameter *p = g->l->lp->exp_param ? g->l->lp->exp_param : &defaults;
  const float log_base = p->base == -1.0f ? 1.0f : logf(p->base);
  const float inner = log_base * p->scale;
  const float outer = p->shift == 0.0f ? 1.0f : powf(p->base == -1.0f ? expf(1.0f) : p->base,
                                                      p->shift);
  const char *out = ox_top(g, 0);
  const char *t = affine(g, ox_bottom(g, 0), inner, 0.0f, NULL);
  if (!t) return KILN_ERR_NOMEM;
  const char *e = outer != 1.0f ? ox_tmp(g, "exp") : out;
  TRY_NODE(ox_node1(g, "Exp", t, e));
  if (outer != 1.0f && !affine(g, e, outer, 0.0f, out)) return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Log: log_base(shift + scale x) = ln(shift + scale x) / ln(base) (base -1: e). */
static int emit_log(ox_graph *g) {
  static const Caffe__LogParameter defaults = CAFFE__LOG_PARAMETER__INIT;
  const Caffe__LogParameter *p = g->l->lp->log_param ? g->l->lp->log_param : &defaults;
  const float base_scale = p->base == -1.0f ? 1.0f : 1.0f / logf(p->base);
  const char *out = ox_top(g, 0);
  const char *t = affine(g, ox_bottom(g, 0), p->scale, p->shift, NULL);
  if (!t) return KILN_ERR_NOMEM;
  const char *lg = base_scale != 1.0f ? ox_tmp(g, "ln") : out;
  TRY_NODE(ox_node1(g, "Log", t, lg));
  if (base_scale != 1.0f && !affine(g, lg, base_scale, 0.0f, out)) return KILN_ERR_NOMEM;
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- normalisation ---------------------------------------------------------------------- */

/* Whether layer j is a Scale that can be folded into the BatchNorm before it: it reads that
 * BatchNorm's top alone (nothing else can then read it: the net puts a Split before any second
 * reader) with its own per-channel gamma (axis 1, one axis). */
static bool foldable_scale(const kiln_net *net, int j, const kiln_blob *bn_top) {
  if (j >= net->nlayers) return false;
  const kiln_layer *s = net->layers[j];
  if (strcmp(s->ops->type, "Scale") || s->nbottom != 1 || s->bottom[0] != bn_top) return false;
  const Caffe__ScaleParameter *p = s->lp->scale_param;
  const int axis = p ? p->axis : 1, num_axes = p ? p->num_axes : 1;
  const int naxes = bn_top->naxes;
  return (axis == 1 || axis == 1 - naxes) && (num_axes == 1 || (num_axes == -1 && naxes == 2)) &&
         s->param[0]->count == bn_top->shape[1];
}

/* BatchNorm with the stored statistics (mean and variance scaled by the third blob's factor, 0
 * meaning 0) as BatchNormalization; a Scale after it that can be folded becomes its scale and
 * bias (and the Scale layer adds no node). */
static int emit_batch_norm(ox_graph *g) {
  const kiln_layer *l = g->l;
  const Caffe__BatchNormParameter *p = l->lp->batch_norm_param;
  if (p && p->has_use_global_stats && !p->use_global_stats)
    return ox_refuse(g, "use_global_stats: false normalises by each batch's own statistics; "
                     "ONNX's BatchNormalization (inference) uses the stored ones");
  const float eps = p ? p->eps : 1e-5f;
  const int64_t C = l->param[0]->count;
  if (l->bottom[0]->naxes < 2 || l->bottom[0]->shape[1] != C)
    return ox_fail(g, KILN_ERR_SHAPE, "the statistics do not match the input's channels");
  const float f0 = ox_param(g, 2)[0];
  const float factor = f0 == 0 ? 0.0f : 1.0f / f0;
  float *mean = ox_alloc(g, sizeof(float) * (size_t)C);
  float *var = ox_alloc(g, sizeof(float) * (size_t)C);
  if (!mean || !var) return KILN_ERR_NOMEM;
  const float *m = ox_param(g, 0), *v = ox_param(g, 1);
  for (int64_t c = 0; c < C; c++) {
    mean[c] = m[c] * factor;
    var[c] = v[c] * factor;
  }
  const float *gamma = NULL, *beta = NULL;
  const kiln_layer *scale = NULL;
  if (foldable_scale(g->net, g->li + 1, l->top[0])) {
    scale = g->net->layers[g->li + 1];
    gamma = g->params + (scale->param[0]->data - g->net->param_data);
    if (scale->nparam > 1) beta = g->params + (scale->param[1]->data - g->net->param_data);
  }
  float *ones = NULL, *zeros = NULL;
  if (!gamma || !beta) {
    ones = ox_alloc(g, sizeof(float) * (size_t)C);
    zeros = ox_alloc(g, sizeof(float) * (size_t)C);
    if (!ones || !zeros) return KILN_ERR_NOMEM;
    for (int64_t c = 0; c < C; c++) ones[c] = 1.0f;
  }
  const char *in[5] = {ox_bottom(g, 0),
                       ox_init_float(g, scale ? "gamma" : "scale", 1, &C, gamma ? gamma : ones),
                       ox_init_float(g, "beta", 1, &C, beta ? beta : zeros),
                       ox_init_float(g, "mean", 1, &C, mean),
                       ox_init_float(g, "var", 1, &C, var)};
  const char *out;
  if (scale) { /* the Scale's top, named as the Scale layer would name it */
    g->li++;
    g->l = scale;
    out = ox_top(g, 0);
    ox_set_top(g, 0, out);
    g->li--;
    g->l = l;
    g->skip = g->li + 1;
  } else {
    out = ox_top(g, 0);
    ox_set_top(g, 0, out);
  }
  Onnx__NodeProto *n = ox_node(g, "BatchNormalization", 5, in, 1, &out);
  TRY_NODE(n);
  /* ONNX's momentum is Caffe's moving_average_fraction (how much of the running statistics a
   * training batch keeps): no effect at inference, kept for a runtime or importer that trains */
  const float fraction = p ? p->moving_average_fraction : 0.999f;
  KILN_TRY(ox_attr_float(g, n, "momentum", fraction));
  return ox_attr_float(g, n, "epsilon", eps);
}

/* Scale (x * gamma [+ beta]) and Bias (x + b): gamma, beta and b span the input's axes [axis,
 * axis + num_axes) and are broadcast over the rest, as Mul and Add with the vector shaped to end
 * in 1s; a factor from a second bottom is reshaped so. */
static int emit_scale_bias(ox_graph *g) {
  const kiln_layer *l = g->l;
  const bool is_bias = !strcmp(l->ops->type, "Bias");
  const kiln_blob *x = l->bottom[0];
  int axis_p = 1, num_axes = 1;
  if (is_bias && l->lp->bias_param) {
    axis_p = l->lp->bias_param->axis;
    num_axes = l->lp->bias_param->num_axes;
  } else if (!is_bias && l->lp->scale_param) {
    axis_p = l->lp->scale_param->axis;
    num_axes = l->lp->scale_param->num_axes;
  }
  int axis;
  KILN_TRY(kiln_blob_canonical_axis(x, axis_p, &axis));
  const bool from_bottom = l->nbottom > 1;
  const kiln_blob *v = from_bottom ? l->bottom[1] : l->param[0];
  const int nv = from_bottom ? v->naxes : num_axes == -1 ? x->naxes - axis : num_axes;
  if (axis == 0 && nv > 0 && g->opt->dynamic_batch && !from_bottom)
    return ox_refuse(g, "axis 0: the parameters span the batch axis, which --dynamic-batch "
                     "leaves open");
  int64_t dims[KILN_MAX_AXES];
  int nd = 0;
  for (int a = 0; a < nv; a++) dims[nd++] = x->shape[axis + a];
  for (int a = axis + nv; a < x->naxes; a++) dims[nd++] = 1;
  if (nd == 0) dims[nd++] = 1;
  const char *in = ox_bottom(g, 0), *out = ox_top(g, 0);
  const char *factor;
  int next = 0; /* the parameter after the factor */
  if (from_bottom) {
    int64_t shape[KILN_MAX_AXES];
    for (int a = 0; a < nd; a++) shape[a] = a < nv ? 0 : 1; /* its own axes copied */
    const char *sv = ox_init_int64(g, "shape", nd, shape);
    factor = ox_tmp(g, "factor");
    const char *rin[2] = {ox_bottom(g, 1), sv};
    TRY_NODE(ox_node(g, "Reshape", 2, rin, 1, &factor));
  } else {
    factor = ox_init_float(g, is_bias ? "bias" : "gamma", nd, dims, ox_param(g, 0));
    next = 1;
  }
  const bool then_bias = !is_bias && l->nparam > next;
  const char *first = then_bias ? ox_tmp(g, "scaled") : out;
  const char *fin[2] = {in, factor};
  TRY_NODE(ox_node(g, is_bias ? "Add" : "Mul", 2, fin, 1, &first));
  if (then_bias) {
    const char *bin[2] = {first, ox_init_float(g, "beta", nd, dims, ox_param(g, next))};
    TRY_NODE(ox_node(g, "Add", 2, bin, 1, &out));
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* LRN: ACROSS_CHANNELS is ONNX's LRN (the same window and formula, k as bias); WITHIN_CHANNEL is
 * x (1 + alpha / n^2 * sum of x^2 over an n x n square, zero padded)^-beta, as Caffe builds it:
 * the square's mean through Pad and AveragePool. */
static int emit_lrn(ox_graph *g) {
  static const Caffe__LRNParameter defaults = CAFFE__LRNPARAMETER__INIT;
  const Caffe__LRNParameter *p = g->l->lp->lrn_param ? g->l->lp->lrn_param : &defaults;
  if (p->norm_region != CAFFE__LRNPARAMETER__NORM_REGION__WITHIN_CHANNEL) {
    Onnx__NodeProto *n = unary(g, "LRN");
    TRY_NODE(n);
    KILN_TRY(ox_attr_int(g, n, "size", p->local_size));
    KILN_TRY(ox_attr_float(g, n, "alpha", p->alpha));
    KILN_TRY(ox_attr_float(g, n, "beta", p->beta));
    return ox_attr_float(g, n, "bias", p->k);
  }
  const char *x = ox_bottom(g, 0), *out = ox_top(g, 0);
  const char *sq = ox_tmp(g, "square"), *avg = ox_tmp(g, "mean_square");
  const char *xx[2] = {x, x};
  TRY_NODE(ox_node(g, "Mul", 2, xx, 1, &sq));
  const int64_t size = p->local_size, pad = (size - 1) / 2;
  if (pad) { /* zeros around, counted in the mean (see emit_pool) */
    const int64_t zero_pads[8] = {0, 0, pad, pad, 0, 0, pad, pad};
    const char *pin[2] = {sq, ox_init_int64(g, "pads", 8, zero_pads)};
    const char *padded = ox_tmp(g, "padded");
    TRY_NODE(ox_node(g, "Pad", 2, pin, 1, &padded));
    sq = padded;
  }
  Onnx__NodeProto *n = ox_node1(g, "AveragePool", sq, avg);
  TRY_NODE(n);
  const int64_t k[2] = {size, size}, ones[2] = {1, 1};
  KILN_TRY(ox_attr_ints(g, n, "kernel_shape", 2, k));
  KILN_TRY(ox_attr_ints(g, n, "strides", 2, ones));
  const char *s = affine(g, avg, p->alpha, 1.0f, NULL);
  if (!s) return KILN_ERR_NOMEM;
  const char *pw = ox_tmp(g, "factor");
  const char *pin[2] = {s, ox_init_scalar(g, "neg_beta", -p->beta)};
  TRY_NODE(ox_node(g, "Pow", 2, pin, 1, &pw));
  const char *min[2] = {x, pw};
  TRY_NODE(ox_node(g, "Mul", 2, min, 1, &out));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* ---- Eltwise, Softmax, ArgMax ----------------------------------------------------------- */

/* SUM (each bottom times its coefficient, added in order), PROD, MAX: two inputs a node. */
static int emit_eltwise(ox_graph *g) {
  const kiln_layer *l = g->l;
  static const Caffe__EltwiseParameter defaults = CAFFE__ELTWISE_PARAMETER__INIT;
  const Caffe__EltwiseParameter *p = l->lp->eltwise_param ? l->lp->eltwise_param : &defaults;
  const char *op = p->operation == CAFFE__ELTWISE_PARAMETER__ELTWISE_OP__PROD  ? "Mul"
                   : p->operation == CAFFE__ELTWISE_PARAMETER__ELTWISE_OP__MAX ? "Max"
                                                                                : "Add";
  const bool sum = !strcmp(op, "Add");
  const char *out = ox_top(g, 0), *acc = NULL;
  for (int b = 0; b < l->nbottom; b++) {
    const char *term = ox_bottom(g, b);
    const float c = sum && p->n_coeff ? p->coeff[b] : 1.0f;
    const bool last = b == l->nbottom - 1;
    if (c != 1.0f && !(term = affine(g, term, c, 0.0f, last && b == 0 ? out : NULL)))
      return KILN_ERR_NOMEM;
    if (b == 0) {
      acc = term;
      continue;
    }
    const char *to = last ? out : ox_tmp(g, "partial");
    const char *in[2] = {acc, term};
    TRY_NODE(ox_node(g, op, 2, in, 1, &to));
    acc = to;
  }
  if (acc != out) TRY_NODE(ox_node1(g, "Identity", acc, out)); /* one bottom */
  ox_set_top(g, 0, out);
  return KILN_OK;
}

static int emit_softmax(ox_graph *g) {
  int axis;
  const Caffe__SoftmaxParameter *p = g->l->lp->softmax_param;
  KILN_TRY(kiln_blob_canonical_axis(g->l->bottom[0], p ? p->axis : 1, &axis));
  Onnx__NodeProto *n = unary(g, "Softmax");
  TRY_NODE(n);
  return ox_attr_int(g, n, "axis", axis);
}

/* ArgMax of top_k 1 (ties to the larger index, as kiln's): along an axis, the index (ArgMax,
 * Cast to float) or with out_max_val the value (ReduceMax); over each item (no axis), the index
 * and with out_max_val the value after it, reshaped to the top's shape. */
static int emit_argmax(ox_graph *g) {
  const kiln_layer *l = g->l;
  static const Caffe__ArgMaxParameter defaults = CAFFE__ARG_MAX_PARAMETER__INIT;
  const Caffe__ArgMaxParameter *p = l->lp->argmax_param ? l->lp->argmax_param : &defaults;
  if (p->top_k != 1)
    return ox_refuse(g, "top_k %u: only top_k 1 is exported (ArgMax); TopK's order of ties is "
                     "not kiln's", p->top_k);
  const kiln_blob *x = l->bottom[0];
  const char *in = ox_bottom(g, 0), *out = ox_top(g, 0);
  int axis = 1;
  if (p->has_axis) {
    KILN_TRY(kiln_blob_canonical_axis(x, p->axis, &axis));
  } else if (x->naxes != 2) {
    const char *flat = ox_tmp(g, "flat");
    Onnx__NodeProto *f = ox_node1(g, "Flatten", in, flat);
    TRY_NODE(f);
    KILN_TRY(ox_attr_int(g, f, "axis", 1));
    in = flat;
  }
  const int64_t axes[1] = {axis};
  if (p->has_axis && p->out_max_val) {
    Onnx__NodeProto *n = ox_node1(g, "ReduceMax", in, out);
    TRY_NODE(n);
    KILN_TRY(ox_attr_ints(g, n, "axes", 1, axes));
    KILN_TRY(ox_attr_int(g, n, "keepdims", 1));
    ox_set_top(g, 0, out);
    return KILN_OK;
  }
  const char *idx = ox_tmp(g, "index"), *fidx = p->has_axis ? out : ox_tmp(g, "findex");
  Onnx__NodeProto *n = ox_node1(g, "ArgMax", in, idx);
  TRY_NODE(n);
  KILN_TRY(ox_attr_int(g, n, "axis", axis));
  KILN_TRY(ox_attr_int(g, n, "keepdims", 1));
  KILN_TRY(ox_attr_int(g, n, "select_last_index", 1));
  Onnx__NodeProto *c = ox_node1(g, "Cast", idx, fidx);
  TRY_NODE(c);
  KILN_TRY(ox_attr_int(g, c, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT));
  if (!p->has_axis) {
    const char *r = fidx;
    if (p->out_max_val) {
      const char *val = ox_tmp(g, "value");
      Onnx__NodeProto *m = ox_node1(g, "ReduceMax", in, val);
      TRY_NODE(m);
      KILN_TRY(ox_attr_ints(g, m, "axes", 1, axes));
      KILN_TRY(ox_attr_int(g, m, "keepdims", 1));
      r = ox_tmp(g, "pair");
      const char *cin[2] = {fidx, val};
      Onnx__NodeProto *cc = ox_node(g, "Concat", 2, cin, 1, &r);
      TRY_NODE(cc);
      KILN_TRY(ox_attr_int(g, cc, "axis", 1));
    }
    const kiln_blob *y = l->top[0];
    int64_t shape[KILN_MAX_AXES];
    for (int a = 0; a < y->naxes; a++) shape[a] = y->shape[a];
    if (g->opt->dynamic_batch) shape[0] = 0;
    const char *rin[2] = {r, ox_init_int64(g, "shape", y->naxes, shape)};
    TRY_NODE(ox_node(g, "Reshape", 2, rin, 1, &out));
  }
  ox_set_top(g, 0, out);
  return KILN_OK;
}

/* Parameter (Caffe's): its blob as a constant, an initializer named as its top through an
 * Identity (an imported LSTM's `cont` is one) */
static int emit_parameter(ox_graph *g) {
  const kiln_blob *p = g->l->param[0];
  int64_t dims[KILN_MAX_AXES];
  for (int a = 0; a < p->naxes; a++) dims[a] = p->shape[a];
  const char *init = ox_init_float(g, "value", p->naxes, dims, ox_param(g, 0));
  if (!init) return KILN_ERR_NOMEM;
  const char *out = ox_top(g, 0);
  TRY_NODE(ox_node1(g, "Identity", init, out));
  ox_set_top(g, 0, out);
  return KILN_OK;
}

const ox_layer_form ox_forms_compute[] = {
    {"Convolution", emit_conv},
    {"Deconvolution", emit_conv},
    {"Pooling", emit_pool},
    {"InnerProduct", emit_inner_product},
    {"ReLU", emit_relu},
    {"PReLU", emit_prelu},
    {"ELU", emit_elu},
    {"Sigmoid", emit_simple},
    {"TanH", emit_simple},
    {"AbsVal", emit_simple},
    {"BNLL", emit_simple},
    {"Power", emit_power},
    {"Exp", emit_exp},
    {"Log", emit_log},
    {"BatchNorm", emit_batch_norm},
    {"Scale", emit_scale_bias},
    {"Bias", emit_scale_bias},
    {"LRN", emit_lrn},
    {"Eltwise", emit_eltwise},
    {"Softmax", emit_softmax},
    {"ArgMax", emit_argmax},
    {"Parameter", emit_parameter},
    {NULL, NULL},
};
