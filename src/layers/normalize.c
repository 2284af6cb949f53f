/* Normalize (the SSD fork's, Wei Liu's Caffe): L2 normalisation times a learned scale. The bottom
 * is N x C x (the rest: its S spatial positions; any number of axes from 2 on, as the fork
 * takes). With across_spatial false, each position's C values are divided by their norm,
 * sqrt(sum of x^2 + eps); with across_spatial true (the default), each image's C x S values by
 * one norm. The result is multiplied by `scale`, a learnable blob of one value (channel_shared,
 * the default: a blob of no axes, as the fork's) or of C (one a channel), filled by scale_filler
 * (default constant 1). eps (default 1e-10) is added once, inside the square root; it may be 0
 * (an all-zero group then gives NaN, as in the fork), not negative.
 *
 * Backward, with d = dy scale: dx = (d - x (sum over the group of d x) / norm^2) / norm, the
 * chain rule's gradient; the fork multiplies by the scale after the group's sum instead, which
 * is the same for a shared scale only. The scale's gradient adds the sum of dy x / norm over
 * each channel (over everything when shared). Backward reads the input and the norms, which
 * forward keeps in a buffer (N x S, or N across), so the layer does not run in place: SSD's nets
 * write it out of place (conv4_3 -> conv4_3_norm). Plain layout only; the arithmetic is the
 * l2norm ops' (src/ops/l2norm.c). */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__NormalizeParameter normalize_defaults = CAFFE__NORMALIZE_PARAMETER__INIT;

typedef struct {
  bool across, shared;
  float eps;
  int64_t N, C, S;
} normalize_state;

static int normalize_setup(kiln_layer *l) {
  const Caffe__NormalizeParameter *p = KILN_PARAM_OR(l->lp->norm_param, normalize_defaults);
  const kiln_blob *x = l->bottom[0];
  normalize_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  if (l->top[0] == l->bottom[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "cannot run in place (its backward reads the input): give the top "
                            "its own name");
  if (x->naxes < 2) {
    char xs[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the input %s has %d axes; it needs 2 or more (N x C x ...)",
                            kiln_blob_shape_string(x, xs, sizeof xs), x->naxes);
  }
  if (!(p->eps >= 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "norm_param.eps %g must be >= 0", p->eps);
  s->across = p->across_spatial;
  s->shared = p->channel_shared;
  s->eps = p->eps;
  /* the fork's shapes, so that its .caffemodel files load: a scalar blob when shared, else (C) */
  const int64_t channels = x->shape[1];
  if (!kiln_layer_add_param(l, s->shared ? 0 : 1, s->shared ? NULL : &channels, p->scale_filler,
                            1.0f) ||
      !kiln_layer_add_buffer(l, "norm"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int normalize_reshape(kiln_layer *l) {
  normalize_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  char xs[128];
  if (x->naxes < 2)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the input %s has %d axes; it needs 2 or more (N x C x ...)",
                            kiln_blob_shape_string(x, xs, sizeof xs), x->naxes);
  if (!s->shared && l->param[0]->count != x->shape[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the input %s has %lld channels, the scale %lld (one a channel)",
                            kiln_blob_shape_string(x, xs, sizeof xs), (long long)x->shape[1],
                            (long long)l->param[0]->count);
  s->N = x->shape[0];
  s->C = x->shape[1];
  s->S = kiln_count(x, 2, x->naxes);
  const int64_t norms[2] = {s->N, s->S};
  KILN_TRY(kiln_blob_reshape(l->buffer[0], s->across ? 1 : 2, norms));
  l->workspace_floats = s->shared ? 2 * s->C : 0; /* the channels' sums, in double */
  l->flops = 4.0 * (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

static int normalize_forward(kiln_layer *l) {
  normalize_state *s = l->priv;
  return KILN_OP(l, l2norm_fwd, l->top[0]->data, l->buffer[0]->data, l->bottom[0]->data,
                 l->param[0]->data, s->N, s->C, s->S, s->across, s->shared, s->eps);
}

/* The scale's gradient accumulates even when the input takes none. */
static int normalize_backward(kiln_layer *l) {
  normalize_state *s = l->priv;
  float *dx = l->propagate_down[0] ? l->bottom[0]->diff : NULL;
  return KILN_OP(l, l2norm_bwd, dx, l->param[0]->diff, s->shared ? l->workspace : NULL,
                 l->top[0]->diff, l->bottom[0]->data, l->buffer[0]->data, l->param[0]->data,
                 s->N, s->C, s->S, s->across, s->shared);
}

static void normalize_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_normalize = {
    .type = "Normalize", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = normalize_setup, .reshape = normalize_reshape, .forward = normalize_forward,
    .backward = normalize_backward, .destroy = normalize_destroy,
    .backward_reads = kiln_reads_bottom0,
    .kernels = KILN_KERNELS(KILN_OP_l2norm_fwd, KILN_OP_l2norm_bwd),
};
