/* LRN: local response normalisation, y = x s^-beta with s = k + alpha / n * (sum of x^2 over a
 * window around the element), Caffe's two regions:
 *   ACROSS_CHANNELS: the window is local_size channels centred on c (zero padded), n = local_size;
 *   WITHIN_CHANNEL: a local_size x local_size spatial square centred on (h, w), zero padded,
 *     n = local_size^2 and k = 1 whatever lrn_param says (Caffe builds this region from
 *     1 + alpha * AVE-pool(x^2) with pad (local_size - 1) / 2, whose divisor is always the full
 *     window, padding included).
 * Input N x C x H x W. The scale s is kept for the backward pass:
 *   dx_j = dy_j s_j^-beta - (2 alpha beta / n) x_j * sum over windows i containing j of
 *          dy_i x_i s_i^(-beta-1)
 * (windows are symmetric, so "windows containing j" is the window around j). Caffe writes
 * x_i s_i^(-beta-1) as y_i / s_i; kiln reads only the input and s, never the output, so a later
 * layer working in place on the output cannot corrupt this gradient. In place, the input is
 * copied aside in forward; the backward pass first gathers dy x s^(-beta-1) for the whole image
 * into the workspace, so overwriting dy with dx afterwards is safe. */
#include "layer_util.h"

static const Caffe__LRNParameter lrn_defaults = CAFFE__LRNPARAMETER__INIT;

enum { LRN_SCALE, LRN_INPUT }; /* buffers */

typedef struct {
  int64_t N, C, H, W;
  int64_t size;
  bool across;
  float alpha_over_n, beta, k;
} lrn_dims;

static lrn_dims dims_of(const kiln_layer *l) {
  const Caffe__LRNParameter *p = KILN_PARAM_OR(l->lp->lrn_param, lrn_defaults);
  const kiln_blob *x = l->bottom[0];
  lrn_dims d = {.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                .size = p->local_size,
                .across = p->norm_region == CAFFE__LRNPARAMETER__NORM_REGION__ACROSS_CHANNELS,
                .beta = p->beta};
  double n = d.across ? (double)d.size : (double)d.size * (double)d.size;
  d.alpha_over_n = (float)(p->alpha / n);
  d.k = d.across ? p->k : 1.0f;
  return d;
}

static int lrn_setup(kiln_layer *l) {
  const Caffe__LRNParameter *p = KILN_PARAM_OR(l->lp->lrn_param, lrn_defaults);
  if (p->local_size % 2 != 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "local_size %u must be odd (the window is centred on the element)",
                            p->local_size);
  if (p->norm_region != CAFFE__LRNPARAMETER__NORM_REGION__ACROSS_CHANNELS &&
      p->norm_region != CAFFE__LRNPARAMETER__NORM_REGION__WITHIN_CHANNEL)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "unknown norm_region %d", (int)p->norm_region);
  if (!kiln_layer_add_buffer(l, "scale")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (l->bottom[0] == l->top[0] && !kiln_layer_add_buffer(l, "input"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int lrn_reshape(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4) {
    char buf[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %s must have 4 axes (N x C x H x W)",
                            kiln_blob_shape_string(x, buf, sizeof buf));
  }
  lrn_dims d = dims_of(l);
  int64_t window = d.across ? d.size : d.size * d.size;
  l->flops = (double)x->count * (double)(window + 4);
  l->workspace_floats = 2 * d.C * d.H * d.W; /* backward: s^-beta and the ratios, one image */
  KILN_TRY(kiln_blob_reshape_like(l->buffer[LRN_SCALE], x));
  if (l->nbuffer > LRN_INPUT) KILN_TRY(kiln_blob_reshape_like(l->buffer[LRN_INPUT], x));
  return kiln_blob_reshape_like(l->top[0], x);
}

/* In place, the input is copied aside first: the top overwrites the bottom, and backward reads
 * the input. */
static int lrn_forward(kiln_layer *l) {
  lrn_dims d = dims_of(l);
  const float *x = l->bottom[0]->data;
  if (l->nbuffer > LRN_INPUT) {
    KILN_TRY(KILN_OP(l, copy, l->buffer[LRN_INPUT]->data, x, l->bottom[0]->count));
    x = l->buffer[LRN_INPUT]->data;
  }
  return KILN_OP(l, lrn_fwd, l->top[0]->data, l->buffer[LRN_SCALE]->data, x, d.N, d.C, d.H, d.W,
                 d.size, d.across, d.alpha_over_n, d.beta, d.k);
}

/* The workspace takes s^-beta and the ratios of one image. */
static int lrn_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  lrn_dims d = dims_of(l);
  const float *x = l->nbuffer > LRN_INPUT ? l->buffer[LRN_INPUT]->data : l->bottom[0]->data;
  return KILN_OP(l, lrn_bwd, l->bottom[0]->diff, l->workspace, l->top[0]->diff, x,
                 l->buffer[LRN_SCALE]->data, d.N, d.C, d.H, d.W, d.size, d.across,
                 d.alpha_over_n, d.beta);
}

/* The input, unless a buffer keeps a copy of it. */
static unsigned lrn_backward_reads(const kiln_layer *l) {
  return l->nbuffer > LRN_INPUT ? 0 : KILN_READS_BOTTOM(0);
}

const kiln_layer_ops kiln_layer_lrn = {
    .type = "LRN", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = lrn_setup, .reshape = lrn_reshape, .forward = lrn_forward, .backward = lrn_backward,
    .backward_reads = lrn_backward_reads,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_lrn_fwd, KILN_OP_lrn_bwd),
};
