/* Power: y = (shift + scale x)^power, element-wise (Caffe's PowerLayer). When power * scale is 0
 * the output is the constant shift^power (1 for power 0) and the gradient is 0; when power is 1
 * the gradient is the constant scale. Otherwise the backward pass needs the input, so an in-place
 * Power keeps a copy of it. The arithmetic, every case of it, is in src/ops/neuron.c. */
#include "layer_util.h"

static const Caffe__PowerParameter power_defaults = CAFFE__POWER_PARAMETER__INIT;

static const Caffe__PowerParameter *power_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->power_param, power_defaults);
}

static bool gradient_is_constant(const Caffe__PowerParameter *p) {
  return p->power * p->scale == 0 || p->power == 1;
}

static int power_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !gradient_is_constant(power_param(l)) &&
      !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int power_reshape(kiln_layer *l) {
  l->flops = 3.0 * (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

/* The buffer exists only when the gradient reads the input (not a constant output). */
static int power_forward(kiln_layer *l) {
  const Caffe__PowerParameter *p = power_param(l);
  const int64_t n = l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(KILN_OP(l, copy, l->buffer[0]->data, l->bottom[0]->data, n));
  return KILN_OP(l, power_fwd, l->top[0]->data, l->bottom[0]->data, n, p->power, p->scale,
                 p->shift);
}

/* dy/dx = power scale (shift + scale x)^(power - 1); the input is not read when that is a
 * constant. */
static int power_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const Caffe__PowerParameter *p = power_param(l);
  const float *x = gradient_is_constant(p) ? NULL
                   : l->nbuffer > 0        ? l->buffer[0]->data
                                           : l->bottom[0]->data;
  return KILN_OP(l, power_bwd, l->bottom[0]->diff, l->top[0]->diff, x, l->bottom[0]->count,
                 p->power, p->scale, p->shift);
}

const kiln_layer_ops kiln_layer_power = {
    .type = "Power", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = power_setup, .reshape = power_reshape, .forward = power_forward,
    .backward = power_backward,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_power_fwd, KILN_OP_power_bwd),
};
