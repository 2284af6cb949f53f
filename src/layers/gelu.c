/* GELU, element-wise: y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), PyTorch's nn.GELU (its
 * default, exact form), or with gelu_param { approximate: TANH } PyTorch's approximate='tanh',
 * y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The gradient needs the input, so an
 * in-place GELU keeps a copy of it, as Power does. Phi(x) is taken as erfc(-x / sqrt 2) / 2
 * rather than (1 + erf(x / sqrt 2)) / 2: in float the sum loses most of its digits where erf is
 * near -1 (relative errors of 3e-4 at x = -4, 4% at x = -5); erfc keeps them. Likewise the
 * tanh form is computed as x sigmoid(2u), u the tanh's argument, which equals 0.5 x (1 + tanh u)
 * without the sum. erfc and exp are the vectorizable forms of src/ops/vmath.h (GELU within
 * 1.4e-5 relative down to x = -12), as libm's scalar erfcf was the slowest part of a transformer
 * block. The arithmetic, both forms, is in src/ops/neuron.c. */
#include "layer_util.h"

static const Caffe__GELUParameter gelu_defaults = CAFFE__GELUPARAMETER__INIT;

static bool gelu_tanh(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->gelu_param, gelu_defaults)->approximate ==
         CAFFE__GELUPARAMETER__APPROXIMATE__TANH;
}

static int gelu_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int gelu_reshape(kiln_layer *l) {
  l->flops = 10.0 * (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

static int gelu_forward(kiln_layer *l) {
  const float *x = l->bottom[0]->data;
  const int64_t n = l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(KILN_OP(l, copy, l->buffer[0]->data, x, n));
  return KILN_OP(l, gelu_fwd, l->top[0]->data, x, n, gelu_tanh(l));
}

/* Exact: dy/dx = Phi(x) + x phi(x); tanh form: s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2) with
 * s = sigmoid(2u), u = sqrt(2/pi) (x + c x^3). */
static int gelu_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  return KILN_OP(l, gelu_bwd, l->bottom[0]->diff, l->top[0]->diff, x, l->bottom[0]->count,
                 gelu_tanh(l));
}

const kiln_layer_ops kiln_layer_gelu = {
    .type = "GELU", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = gelu_setup, .reshape = gelu_reshape, .forward = gelu_forward,
    .backward = gelu_backward, .layout_role = kiln_layout_any,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_gelu_fwd, KILN_OP_gelu_bwd),
};
