/* Element-wise layers: ReLU (with negative_slope), Sigmoid, TanH, Dropout. All may run in place
 * (top == bottom). */
#include "layer_util.h"

static int neuron_reshape(kiln_layer *l) {
  l->flops = (double)l->bottom[0]->count;
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

/* ---- ReLU ------------------------------------------------------------------------------ */

static const Caffe__ReLUParameter relu_defaults = CAFFE__RE_LUPARAMETER__INIT;

static int relu_forward(kiln_layer *l) {
  float slope = KILN_PARAM_OR(l->lp->relu_param, relu_defaults)->negative_slope;
  return KILN_OP(l, relu_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count, slope);
}

/* In place, bottom data has been overwritten by the output; the sign is unchanged for slope >= 0,
 * so the mask can be read from the top. */
static int relu_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  float slope = KILN_PARAM_OR(l->lp->relu_param, relu_defaults)->negative_slope;
  const float *v = l->bottom[0] == l->top[0] ? l->top[0]->data : l->bottom[0]->data;
  return KILN_OP(l, relu_bwd, l->bottom[0]->diff, l->top[0]->diff, v, l->bottom[0]->count, slope);
}

/* In place with negative_slope >= 0, the layer before may apply it (BatchNorm, Eltwise SUM). */
static bool relu_absorbable(const kiln_layer *l, kiln_absorb_kind kind, const kiln_blob *blob,
                            kiln_absorb *offer) {
  if (kind != KILN_ABSORB_RELU || !kiln_in_place_without_loss(l, blob)) return false;
  offer->slope = KILN_PARAM_OR(l->lp->relu_param, relu_defaults)->negative_slope;
  return offer->slope >= 0;
}

/* The sign backward reads: the top's in place, the bottom's otherwise. */
static unsigned relu_backward_reads(const kiln_layer *l) {
  return l->bottom[0] == l->top[0] ? KILN_READS_TOP(0) : KILN_READS_BOTTOM(0);
}

static int relu_setup(kiln_layer *l) {
  float slope = KILN_PARAM_OR(l->lp->relu_param, relu_defaults)->negative_slope;
  if (slope < 0 && l->bottom[0] == l->top[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "negative_slope %g in place: the input sign cannot be recovered", slope);
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_relu = {
    .type = "ReLU", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = relu_setup, .reshape = neuron_reshape, .forward = relu_forward,
    .backward = relu_backward, .layout_role = kiln_layout_any, .absorbable = relu_absorbable,
    .backward_reads = relu_backward_reads,
    .kernels = KILN_KERNELS(KILN_OP_relu_fwd, KILN_OP_relu_bwd),
};

/* ---- Sigmoid --------------------------------------------------------------------------- */

static int sigmoid_forward(kiln_layer *l) {
  return KILN_OP(l, sigmoid_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static int sigmoid_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, sigmoid_bwd, l->bottom[0]->diff, l->top[0]->diff, l->top[0]->data,
                 l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_sigmoid = {
    .type = "Sigmoid", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .reshape = neuron_reshape, .forward = sigmoid_forward, .backward = sigmoid_backward,
    .backward_reads = kiln_reads_top0,
    .kernels = KILN_KERNELS(KILN_OP_sigmoid_fwd, KILN_OP_sigmoid_bwd),
};

/* ---- TanH ------------------------------------------------------------------------------ */

static int tanh_forward(kiln_layer *l) {
  return KILN_OP(l, tanh_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static int tanh_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, tanh_bwd, l->bottom[0]->diff, l->top[0]->diff, l->top[0]->data,
                 l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_tanh = {
    .type = "TanH", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .reshape = neuron_reshape, .forward = tanh_forward, .backward = tanh_backward,
    .backward_reads = kiln_reads_top0,
    .kernels = KILN_KERNELS(KILN_OP_tanh_fwd, KILN_OP_tanh_bwd),
};

/* ---- Dropout --------------------------------------------------------------------------- */
/* TRAIN: keep each value with probability 1 - r and scale kept ones by 1/(1 - r) (Caffe's
 * inverted dropout); TEST: identity. The mask is drawn from the net's generator, whose state
 * snapshots save. */

static const Caffe__DropoutParameter dropout_defaults = CAFFE__DROPOUT_PARAMETER__INIT;

static int dropout_setup(kiln_layer *l) {
  float r = KILN_PARAM_OR(l->lp->dropout_param, dropout_defaults)->dropout_ratio;
  if (!(r >= 0 && r < 1))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "dropout_ratio %g is not in [0, 1)", r);
  if (!kiln_layer_add_buffer(l, "mask")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int dropout_reshape(kiln_layer *l) {
  KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return neuron_reshape(l);
}

static int dropout_forward(kiln_layer *l) {
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data, *mask = l->buffer[0]->data;
  int64_t n = l->bottom[0]->count;
  if (l->phase != CAFFE__PHASE__TRAIN) return KILN_OP(l, copy, y, x, n);
  float r = KILN_PARAM_OR(l->lp->dropout_param, dropout_defaults)->dropout_ratio;
  KILN_TRY(KILN_OP(l, dropout_mask, mask, n, r, 1.0f / (1.0f - r), l->rng));
  return KILN_OP(l, mul, y, x, mask, n);
}

static int dropout_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const float *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  int64_t n = l->bottom[0]->count;
  if (l->phase != CAFFE__PHASE__TRAIN) return KILN_OP(l, copy, dx, dy, n);
  return KILN_OP(l, mul, dx, dy, l->buffer[0]->data, n);
}

const kiln_layer_ops kiln_layer_dropout = {
    .type = "Dropout", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = dropout_setup, .reshape = dropout_reshape, .forward = dropout_forward,
    .backward = dropout_backward, .backward_reads = kiln_reads_none, /* the mask is a buffer */
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_dropout_mask, KILN_OP_mul),
};
