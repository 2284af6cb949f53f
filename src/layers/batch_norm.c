/* BatchNorm (Caffe's): normalises each channel of an (N, C) or (N, C, ...) input to zero mean and
 * unit variance. No learnable scale or shift (a Scale layer with bias_term follows it in Caffe
 * nets). Three blobs hold running statistics that the solver never touches: the decayed sums of
 * the batch means and of the (unbiased) batch variances, and the decayed count they are divided
 * by. With use_global_stats (default in TEST) those stored statistics are used instead of the
 * batch's. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__BatchNormParameter bn_defaults = CAFFE__BATCH_NORM_PARAMETER__INIT;

typedef struct {
  bool global;    /* normalise with the stored statistics */
  float maf, eps; /* moving_average_fraction, eps */
  int64_t N, C, S; /* batch, channels, spatial (everything after the channel axis) */
  /* On the backend's device: the ops' scratch (kiln_batch_norm_scratch bytes, sized at reshape),
   * and the per-channel means forward normalised with (for bn_recompute). */
  const kiln_device *dev;
  void *scratch;
  size_t scratch_bytes;
  float *mean;
  /* Fusion (bn_fuse): the gamma and beta of the Scale working in place on this layer's top,
   * which this layer applies, and the slope of the ReLU after it (1: none). gamma NULL: not
   * fused. */
  kiln_blob *gamma, *beta;
  float slope;
} bn_state;

/* Buffers: 0 = the normalised output, kept apart from the top so that an in-place layer after
 * this one (or this one in place) cannot spoil backward; 1 = per channel 1/sqrt(var + eps). */
enum { BN_XNORM, BN_INVSTD };

/* The ops' channel block: 16 channels a vector in the blocked layout (nChw16c), 0 in the plain
 * one. In the blocked layout the work goes to threads by (channel block, chunk of images), so a
 * layer with one 16-channel block (resnet20's first stage) uses every thread. */
static int bn_block(const kiln_layer *l) {
  return l->bottom[0]->layout == KILN_LAYOUT_BLOCKED16 ? 16 : 0;
}

static int bn_setup(kiln_layer *l) {
  const Caffe__BatchNormParameter *p = KILN_PARAM_OR(l->lp->batch_norm_param, bn_defaults);
  const kiln_blob *x = l->bottom[0];
  if (x->naxes < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must have at least one axis (N, C, ...)");
  if (!(p->eps >= 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "batch_norm_param.eps %g must be >= 0", p->eps);
  if (!(p->moving_average_fraction >= 0 && p->moving_average_fraction <= 1))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "batch_norm_param.moving_average_fraction %g is not in [0, 1]",
                            p->moving_average_fraction);
  bn_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->global = p->has_use_global_stats ? p->use_global_stats : l->phase == CAFFE__PHASE__TEST;
  s->maf = p->moving_average_fraction;
  s->eps = p->eps;
  s->C = x->naxes == 1 ? 1 : x->shape[1];
  s->dev = l->backend->device;
  KILN_TRY(kiln_device_alloc(s->dev, sizeof(float) * (size_t)s->C, (void **)&s->mean));
  int64_t cshape[1] = {s->C}, one[1] = {1};
  if (!kiln_layer_add_param(l, 1, cshape, NULL, 0) || !kiln_layer_add_param(l, 1, cshape, NULL, 0) ||
      !kiln_layer_add_param(l, 1, one, NULL, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < 3; i++) l->param_frozen[i] = true;
  if (!kiln_layer_add_buffer(l, "x_norm") || !kiln_layer_add_buffer(l, "inv_std"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int bn_reshape(kiln_layer *l) {
  bn_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  int64_t C = x->naxes == 1 ? 1 : x->shape[1];
  if (C != s->C) {
    char buf[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "input %s has %lld channels, the statistics were made for %lld",
                            kiln_blob_shape_string(x, buf, sizeof buf), (long long)C,
                            (long long)s->C);
  }
  s->N = x->shape[0];
  s->S = kiln_count(x, 2, x->naxes);
  const size_t need = kiln_batch_norm_scratch(s->N, s->C);
  if (need > s->scratch_bytes) { /* grows only: the steady state allocates nothing */
    void *p;
    KILN_TRY(kiln_device_alloc(s->dev, need, &p));
    kiln_device_free(s->dev, s->scratch);
    s->scratch = p;
    s->scratch_bytes = need;
  }
  int64_t cshape[1] = {s->C};
  KILN_TRY(kiln_blob_reshape_like(l->buffer[BN_XNORM], x));
  KILN_TRY(kiln_blob_reshape(l->buffer[BN_INVSTD], 1, cshape));
  l->flops = 6.0 * (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

static int bn_forward(kiln_layer *l) {
  bn_state *s = l->priv;
  const float *gam = s->gamma ? s->gamma->data : NULL;
  const float *bet = s->gamma ? s->beta->data : NULL;
  return KILN_OP(l, batch_norm_fwd, l->top[0]->data, l->buffer[BN_XNORM]->data, s->mean,
                 l->buffer[BN_INVSTD]->data, l->param[0]->data, l->param[1]->data,
                 l->param[2]->data, s->scratch, l->bottom[0]->data, gam, bet, s->N, s->C, s->S,
                 bn_block(l), s->global, s->maf, s->eps, s->slope);
}

/* Batch statistics: dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(var + eps), means over the
 * batch and spatial axes of each channel. Stored statistics: dx = dy / sqrt(var + eps). The
 * statistics blobs get no gradient. Fused, the op takes the sums that give gamma's and beta's
 * gradients (wanted even without propagate_down) and BatchNorm's means in one pass over
 * (dy, x_norm) and dx in a second, where BatchNorm, Scale and ReLU apart make six over larger
 * sets of streams. dx may be dy itself (in place): each element is read, then written. */
static int bn_backward(kiln_layer *l) {
  bn_state *s = l->priv;
  if (!s->gamma && !l->propagate_down[0]) return KILN_OK;
  float *dx = l->propagate_down[0] ? l->bottom[0]->diff : NULL;
  return KILN_OP(l, batch_norm_bwd, dx, s->gamma ? s->gamma->diff : NULL,
                 s->gamma ? s->beta->diff : NULL, s->scratch, l->top[0]->diff,
                 l->buffer[BN_XNORM]->data, l->buffer[BN_INVSTD]->data,
                 s->gamma ? s->gamma->data : NULL, s->gamma ? s->beta->data : NULL, s->N, s->C,
                 s->S, bn_block(l), s->global, s->slope);
}

static void bn_destroy(kiln_layer *l) {
  bn_state *s = l->priv;
  if (s) {
    kiln_device_free(s->dev, s->scratch);
    kiln_device_free(s->dev, s->mean);
  }
  free(l->priv);
}

/* Forward again on the same bottom, from the means and inverse deviations forward stored: the
 * same expressions on the same values, so the top and x_norm get the bits forward gave them. The
 * stored statistics are not touched. */
static int bn_recompute(kiln_layer *l) {
  bn_state *s = l->priv;
  const float *gam = s->gamma ? s->gamma->data : NULL;
  const float *bet = s->gamma ? s->beta->data : NULL;
  return KILN_OP(l, batch_norm_apply, l->top[0]->data, l->buffer[BN_XNORM]->data,
                 l->bottom[0]->data, s->mean, l->buffer[BN_INVSTD]->data, gam, bet, s->N, s->C,
                 s->S, bn_block(l), s->slope);
}

/* Batch statistics in the plain layout, the top not the bottom (which recompute reads). */
static bool bn_recomputable(const kiln_layer *l) {
  const bn_state *s = l->priv;
  return !s->global && l->bottom[0] != l->top[0] && l->bottom[0]->layout != KILN_LAYOUT_BLOCKED16;
}

/* The top is a copy of x_norm, which only this layer's forward writes. */
static const kiln_blob *bn_kept_output(const kiln_layer *l) { return l->buffer[BN_XNORM]; }

/* Fusion: the Scale (learnable per-channel gamma with beta) working in place on this layer's
 * top, and the in-place ReLU after it when there is one, are done in this layer's passes: in
 * forward, one pass writes x_norm and the final output where three wrote and rewrote the top;
 * in backward, see bn_backward. Not when a loss reads one of the tops in between
 * (the fused top holds only the last value). */
static int bn_fuse(kiln_layer *l, kiln_layer *const *next, int n) {
  bn_state *s = l->priv;
  const kiln_blob *y = l->top[0];
  kiln_absorb affine, relu;
  if (n < 1 || l->loss_weight[0] != 0 ||
      !kiln_layer_absorbable(next[0], KILN_ABSORB_CHANNEL_AFFINE, y, &affine))
    return 0;
  s->gamma = affine.gamma;
  s->beta = affine.beta;
  s->slope = 1.0f;
  if (n < 2 || !kiln_layer_absorbable(next[1], KILN_ABSORB_RELU, y, &relu)) return 1;
  s->slope = relu.slope;
  return 2;
}

/* 4-D inputs in either layout (per channel, 16 channels a vector in the blocked one). */
static int bn_layout_role(const kiln_layer *l) {
  return l->bottom[0]->naxes == 4 ? KILN_LAYOUT_ROLE_SAME : KILN_LAYOUT_ROLE_NONE;
}

const kiln_layer_ops kiln_layer_batch_norm = {
    .type = "BatchNorm", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = bn_setup, .reshape = bn_reshape, .forward = bn_forward, .backward = bn_backward,
    .destroy = bn_destroy, .layout_role = bn_layout_role, .kept_output = bn_kept_output,
    .fuse = bn_fuse, .recomputable = bn_recomputable, .recompute = bn_recompute,
    .backward_reads = kiln_reads_none, /* the normalised output and 1/std are buffers */
    .kernels = KILN_KERNELS(KILN_OP_batch_norm_fwd, KILN_OP_batch_norm_apply,
                            KILN_OP_batch_norm_bwd),
};
