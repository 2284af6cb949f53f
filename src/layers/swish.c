/* Swish (Caffe's SwishLayer, after 1.0): y = x sigmoid(beta x), swish_param.beta (default 1;
 * beta 1 is SiLU). dy/dx = s + beta x s (1 - s) with s = sigmoid(beta x), which is
 * beta y + s (1 - beta y). May run in place: backward then reads a copy of the input. The
 * arithmetic is in src/ops/neuron.c. */
#include <math.h>

#include "layer_util.h"

static const Caffe__SwishParameter swish_defaults = CAFFE__SWISH_PARAMETER__INIT;

static float beta_of(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->swish_param, swish_defaults)->beta;
}

static int swish_setup(kiln_layer *l) {
  const float beta = beta_of(l);
  if (!isfinite(beta))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "swish_param.beta is %g; it must be finite",
                            (double)beta);
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int swish_reshape(kiln_layer *l) {
  l->flops = 4.0 * (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

static int swish_forward(kiln_layer *l) {
  const float *x = l->bottom[0]->data;
  const int64_t n = l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(KILN_OP(l, copy, l->buffer[0]->data, x, n));
  return KILN_OP(l, swish_fwd, l->top[0]->data, x, n, beta_of(l));
}

static int swish_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  return KILN_OP(l, swish_bwd, l->bottom[0]->diff, l->top[0]->diff, x, l->bottom[0]->count,
                 beta_of(l));
}

const kiln_layer_ops kiln_layer_swish = {
    .type = "Swish", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true, .setup = swish_setup, .reshape = swish_reshape, .forward = swish_forward,
    .backward = swish_backward, .layout_role = kiln_layout_any,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_swish_fwd, KILN_OP_swish_bwd),
};
