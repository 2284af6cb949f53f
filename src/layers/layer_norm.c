/* LayerNorm, PyTorch's nn.LayerNorm: every sample (the axes before `axis`) is normalized over the
 * axes from `axis` to the last, with their mean and biased variance,
 *   x_hat = (x - mean) / sqrt(var + eps),   y = x_hat * gain + bias,
 * gain and bias shaped like the normalized axes (gain filled with 1, bias with 0), or y = x_hat
 * with elementwise_affine false. Unlike BatchNorm it keeps no statistics: TRAIN and TEST compute
 * the same. Each sample's statistics are taken in double. The normalized input and each sample's
 * 1 / sqrt(var + eps) are kept for backward, so the layer may run in place. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__LayerNormParameter ln_defaults = CAFFE__LAYER_NORM_PARAMETER__INIT;

typedef struct {
  int axis;
  int64_t M, K; /* samples, and the values normalized together */
  bool gain, bias;
  float eps;
} ln_state;

enum { B_XHAT, B_RSTD };

static int ln_setup(kiln_layer *l) {
  const Caffe__LayerNormParameter *p = KILN_PARAM_OR(l->lp->layer_norm_param, ln_defaults);
  ln_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  const kiln_blob *x = l->bottom[0];
  if (kiln_blob_canonical_axis(x, p->axis, &s->axis))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "layer_norm_param.axis %d is out of range for "
                            "an input of %d axes", p->axis, x->naxes);
  if (!(p->eps >= 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "layer_norm_param.eps %g must be >= 0", p->eps);
  s->eps = p->eps;
  s->gain = p->elementwise_affine;
  s->bias = p->elementwise_affine && p->bias_term;
  const int naxes = x->naxes - s->axis;
  if (s->gain && !kiln_layer_add_param(l, naxes, x->shape + s->axis, p->weight_filler, 1.0f))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (s->bias && !kiln_layer_add_param(l, naxes, x->shape + s->axis, p->bias_filler, 0.0f))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!kiln_layer_add_buffer(l, "normalized") || !kiln_layer_add_buffer(l, "rstd"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int ln_reshape(kiln_layer *l) {
  ln_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes <= s->axis)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the input has %d axes, fewer than axis %d + 1",
                            x->naxes, s->axis);
  if (l->nparam > 0) {
    const kiln_blob *g = l->param[0];
    bool same = g->naxes == x->naxes - s->axis;
    for (int i = 0; same && i < g->naxes; i++) same = g->shape[i] == x->shape[s->axis + i];
    if (!same)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "the normalized axes changed shape (the gain has %lld values, the "
                              "input %lld per sample)",
                              (long long)g->count, (long long)kiln_count(x, s->axis, x->naxes));
  }
  s->M = kiln_count(x, 0, s->axis);
  s->K = kiln_count(x, s->axis, x->naxes);
  const int64_t m[1] = {s->M};
  KILN_TRY(kiln_blob_reshape_like(l->buffer[B_XHAT], x));
  KILN_TRY(kiln_blob_reshape(l->buffer[B_RSTD], 1, m));
  l->flops = 8.0 * (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

static int ln_forward(kiln_layer *l) {
  ln_state *s = l->priv;
  const float *g = s->gain ? l->param[0]->data : NULL;
  const float *b = s->bias ? l->param[1]->data : NULL;
  return KILN_OP(l, layer_norm_fwd, l->top[0]->data, l->buffer[B_XHAT]->data,
                 l->buffer[B_RSTD]->data, l->bottom[0]->data, g, b, s->M, s->K, s->eps);
}

/* With dh = dy * gain: dx = rstd (dh - mean(dh) - x_hat mean(dh x_hat)) per sample;
 * dgain += sum over samples of dy x_hat, dbias += sum of dy. The op takes the parameter
 * gradients first, since in place dx overwrites dy. */
static int ln_backward(kiln_layer *l) {
  ln_state *s = l->priv;
  float *dg = s->gain ? l->param[0]->diff : NULL, *db = s->bias ? l->param[1]->diff : NULL;
  float *dx = l->propagate_down[0] ? l->bottom[0]->diff : NULL;
  if (!dg && !dx) return KILN_OK;
  return KILN_OP(l, layer_norm_bwd, dx, dg, db, l->top[0]->diff, l->buffer[B_XHAT]->data,
                 l->buffer[B_RSTD]->data, s->gain ? l->param[0]->data : NULL, s->M, s->K);
}

static void ln_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_layer_norm = {
    .type = "LayerNorm", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = ln_setup, .reshape = ln_reshape, .forward = ln_forward, .backward = ln_backward,
    .destroy = ln_destroy,
    .kernels = KILN_KERNELS(KILN_OP_layer_norm_fwd, KILN_OP_layer_norm_bwd),
};
