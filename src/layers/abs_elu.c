/* Element-wise layers AbsVal (y = |x|) and ELU (y = x for x > 0, alpha (exp(x) - 1) otherwise).
 * Both may run in place. Their backward passes read the input, never the output (which a later
 * in-place layer may have changed), so in place they keep a copy of the input.
 * ELU uses expm1(x) where Caffe writes exp(x) - 1: the same function, without the cancellation
 * that loses most digits of small negative inputs. The arithmetic is in src/ops/neuron.c. */
#include "layer_util.h"

static int same_shape_reshape(kiln_layer *l) {
  l->flops = (double)l->bottom[0]->count;
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

/* ---- AbsVal ---------------------------------------------------------------------------- */

static int absval_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

/* In place, the input into its buffer before the output overwrites it. */
static int save_input(kiln_layer *l) {
  if (l->nbuffer == 0) return KILN_OK;
  return KILN_OP(l, copy, l->buffer[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static const float *saved_input(const kiln_layer *l) {
  return l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
}

static int absval_forward(kiln_layer *l) {
  KILN_TRY(save_input(l));
  return KILN_OP(l, absval_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

/* dx = sign(x) dy, with sign(0) = 0 as Caffe's caffe_cpu_sign. */
static int absval_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, absval_bwd, l->bottom[0]->diff, l->top[0]->diff, saved_input(l),
                 l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_absval = {
    .type = "AbsVal", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = absval_setup, .reshape = same_shape_reshape, .forward = absval_forward,
    .backward = absval_backward,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_absval_fwd, KILN_OP_absval_bwd),
};

/* ---- ELU ------------------------------------------------------------------------------- */

static const Caffe__ELUParameter elu_defaults = CAFFE__ELUPARAMETER__INIT;

static float elu_alpha(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->elu_param, elu_defaults)->alpha;
}

static int elu_setup(kiln_layer *l) {
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int elu_forward(kiln_layer *l) {
  KILN_TRY(save_input(l));
  return KILN_OP(l, elu_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count,
                 elu_alpha(l));
}

/* dx = dy for x > 0, dy alpha exp(x) otherwise (Caffe writes alpha exp(x) as y + alpha). */
static int elu_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, elu_bwd, l->bottom[0]->diff, l->top[0]->diff, saved_input(l),
                 l->bottom[0]->count, elu_alpha(l));
}

const kiln_layer_ops kiln_layer_elu = {
    .type = "ELU", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = elu_setup, .reshape = same_shape_reshape, .forward = elu_forward,
    .backward = elu_backward,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_elu_fwd, KILN_OP_elu_bwd),
};
