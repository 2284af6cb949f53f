/* PReLU: y = max(x, 0) + a_c min(x, 0) with a learned slope a_c per channel (axis 1), or one slope
 * for all channels with channel_shared (Caffe's PReLULayer). The slopes start at 0.25 unless a
 * filler says otherwise. Learned slopes may be negative, so the output does not tell the input's
 * sign: in place, the layer keeps a copy of its input for the backward pass. The arithmetic is in
 * src/ops/neuron.c. */
#include "layer_util.h"

static const Caffe__PReLUParameter prelu_defaults = CAFFE__PRE_LUPARAMETER__INIT;

static bool prelu_shared(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->prelu_param, prelu_defaults)->channel_shared;
}

static int prelu_check_axes(kiln_layer *l) {
  if (l->bottom[0]->naxes < 2) {
    char buf[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %s needs at least 2 axes (N x C x ...)",
                            kiln_blob_shape_string(l->bottom[0], buf, sizeof buf));
  }
  return KILN_OK;
}

static int prelu_setup(kiln_layer *l) {
  const Caffe__PReLUParameter *p = KILN_PARAM_OR(l->lp->prelu_param, prelu_defaults);
  KILN_TRY(prelu_check_axes(l));
  /* Caffe's shapes: a scalar blob when shared, (C) otherwise. */
  int64_t channels = l->bottom[0]->shape[1];
  kiln_blob *slope = p->channel_shared ? kiln_layer_add_param(l, 0, NULL, p->filler, 0.25f)
                                       : kiln_layer_add_param(l, 1, &channels, p->filler, 0.25f);
  if (!slope) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int prelu_reshape(kiln_layer *l) {
  KILN_TRY(prelu_check_axes(l));
  int64_t channels = l->bottom[0]->shape[1];
  if (!prelu_shared(l) && l->param[0]->count != channels)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "%lld slopes for an input with %lld channels (axis 1); "
                            "channel_shared uses one slope for all",
                            (long long)l->param[0]->count, (long long)channels);
  l->flops = 2.0 * (double)l->bottom[0]->count;
  l->workspace_floats = 2 * channels; /* per-channel slope gradient sums, as doubles */
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->bottom[0]));
  return kiln_blob_reshape_like(l->top[0], l->bottom[0]);
}

/* The input viewed as (N, C, D): D = count(2). Shared: every element uses slope 0. */
typedef struct {
  int64_t N, C, D;
  bool shared;
} prelu_dims;

static prelu_dims dims_of(const kiln_layer *l) {
  const kiln_blob *x = l->bottom[0];
  return (prelu_dims){.N = x->shape[0], .C = x->shape[1], .D = kiln_count(x, 2, x->naxes),
                      .shared = prelu_shared(l)};
}

static int prelu_forward(kiln_layer *l) {
  prelu_dims d = dims_of(l);
  const float *x = l->bottom[0]->data;
  if (l->nbuffer > 0) KILN_TRY(KILN_OP(l, copy, l->buffer[0]->data, x, l->bottom[0]->count));
  return KILN_OP(l, prelu_fwd, l->top[0]->data, x, l->param[0]->data, d.N, d.C, d.D, d.shared);
}

/* Slopes: da_c += sum over x <= 0 in channel c of dy x (accumulated), through per-channel sums
 * in the workspace. Input: dx = dy where x > 0, a_c dy elsewhere. The slope gradient reads dy
 * before dx overwrites it (they are the same memory in place). */
static int prelu_backward(kiln_layer *l) {
  prelu_dims d = dims_of(l);
  const float *x = l->nbuffer > 0 ? l->buffer[0]->data : l->bottom[0]->data;
  const float *dy = l->top[0]->diff;
  KILN_TRY(KILN_OP(l, prelu_slope_bwd, l->param[0]->diff, x, dy, (double *)l->workspace, d.N,
                   d.C, d.D, d.shared));
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, prelu_bwd, l->bottom[0]->diff, dy, x, l->param[0]->data, d.N, d.C, d.D,
                 d.shared);
}

const kiln_layer_ops kiln_layer_prelu = {
    .type = "PReLU", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = prelu_setup, .reshape = prelu_reshape, .forward = prelu_forward,
    .backward = prelu_backward,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_prelu_fwd, KILN_OP_prelu_bwd,
                            KILN_OP_prelu_slope_bwd),
};
