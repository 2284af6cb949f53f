/* Scale (Caffe's): y = x * gamma, plus beta with bias_term. gamma spans the input's axes
 * [axis, axis + num_axes) (num_axes -1: to the end; 0: one scalar) and is broadcast over the
 * others; it is a learnable blob (filler default constant 1), or the second bottom, which then
 * receives the gradient instead. beta (bias_filler default constant 0) has gamma's shape. Follows
 * BatchNorm in Caffe nets, usually in place. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__ScaleParameter scale_defaults = CAFFE__SCALE_PARAMETER__INIT;

typedef struct {
  bool from_bottom; /* gamma is bottom[1] */
  int bias_index;   /* parameter index of beta, -1 without bias_term */
  bool in_place;    /* the input is copied to buffer 0 before it is overwritten */
  bool borrowed;    /* in place, but the layer before keeps a copy of the input (input_copy) */
  int64_t outer, dim, inner;
} scale_state;

static int axis_error(kiln_layer *l, int rc) {
  return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
}

static int scale_setup(kiln_layer *l) {
  const Caffe__ScaleParameter *p = KILN_PARAM_OR(l->lp->scale_param, scale_defaults);
  const kiln_blob *x = l->bottom[0];
  scale_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->bias_index = -1;
  s->from_bottom = l->nbottom > 1;
  s->in_place = l->top[0] == l->bottom[0];
  int naxes;
  const int64_t *shape;
  if (s->from_bottom) { /* its axes are checked against the input's in reshape */
    naxes = l->bottom[1]->naxes;
    shape = l->bottom[1]->shape;
  } else {
    int axis, rc = kiln_blob_canonical_axis(x, p->axis, &axis);
    if (rc) return axis_error(l, rc);
    if (p->num_axes < -1)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "scale_param.num_axes %d must be >= 0, or -1 for all axes from axis",
                              p->num_axes);
    if (p->num_axes >= 0 && axis + p->num_axes > x->naxes) {
      char buf[128];
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "scale_param axis %d + num_axes %d runs past the %d axes of input %s",
                              axis, p->num_axes, x->naxes, kiln_blob_shape_string(x, buf, sizeof buf));
    }
    naxes = p->num_axes == -1 ? x->naxes - axis : p->num_axes;
    shape = x->shape + axis;
    if (!kiln_layer_add_param(l, naxes, shape, p->filler, 1.0f))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  if (p->bias_term) {
    s->bias_index = l->nparam;
    if (!kiln_layer_add_param(l, naxes, shape, p->bias_filler, 0.0f))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  if (s->in_place && !kiln_layer_add_buffer(l, "bottom_copy"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int scale_reshape(kiln_layer *l) {
  const Caffe__ScaleParameter *p = KILN_PARAM_OR(l->lp->scale_param, scale_defaults);
  scale_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  const kiln_blob *g = s->from_bottom ? l->bottom[1] : l->param[0];
  int axis = 0; /* a scalar gamma applies the same at any axis */
  if (g->naxes > 0) {
    int rc = kiln_blob_canonical_axis(x, p->axis, &axis);
    if (rc) return axis_error(l, rc);
  }
  bool ok = axis + g->naxes <= x->naxes;
  for (int i = 0; ok && i < g->naxes; i++) ok = x->shape[axis + i] == g->shape[i];
  if (!ok) {
    char xs[128], gs[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "scale %s (%s) does not match input %s from axis %d",
                            kiln_blob_shape_string(g, gs, sizeof gs),
                            s->from_bottom ? "bottom 1" : "parameter",
                            kiln_blob_shape_string(x, xs, sizeof xs), axis);
  }
  if (s->bias_index >= 0 && l->param[s->bias_index]->count != g->count) {
    char bs[128], gs[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "bias %s does not match scale %s",
                            kiln_blob_shape_string(l->param[s->bias_index], bs, sizeof bs),
                            kiln_blob_shape_string(g, gs, sizeof gs));
  }
  s->outer = kiln_count(x, 0, axis);
  s->dim = g->count;
  s->inner = kiln_count(x, axis + g->naxes, x->naxes);
  s->borrowed = s->in_place && l->input_copy && l->input_copy->naxes == x->naxes &&
                l->input_copy->count == x->count;
  if (s->borrowed) {
    int64_t one[1] = {1};
    KILN_TRY(kiln_blob_reshape(l->buffer[0], 1, one));
  } else if (s->in_place) {
    KILN_TRY(kiln_blob_reshape_like(l->buffer[0], x));
  }
  l->flops = (s->bias_index >= 0 ? 2.0 : 1.0) * (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

/* The ops' channel block: 16 in the blocked layout (nChw16c), whose dim is the channels. */
static int scale_block(const kiln_layer *l) {
  return l->bottom[0]->layout == KILN_LAYOUT_BLOCKED16 ? 16 : 0;
}

/* In place (and no copy borrowed from the layer before), the input is kept in buffer 0 in the
 * same pass, before the output overwrites it. */
static int scale_forward(kiln_layer *l) {
  scale_state *s = l->priv;
  const float *g = (s->from_bottom ? l->bottom[1] : l->param[0])->data;
  const float *b = s->bias_index >= 0 ? l->param[s->bias_index]->data : NULL;
  float *keep = s->in_place && !s->borrowed ? l->buffer[0]->data : NULL;
  return KILN_OP(l, scale_fwd, l->top[0]->data, keep, l->bottom[0]->data, g, b, s->outer, s->dim,
                 s->inner, scale_block(l));
}

/* The input for gamma's gradient (in place a copy of it, a buffer or the kept output of the
 * layer before), and a gamma given as the second bottom. */
static unsigned scale_backward_reads(const kiln_layer *l) {
  const scale_state *s = l->priv;
  return (s->in_place ? 0 : KILN_READS_BOTTOM(0)) | (s->from_bottom ? KILN_READS_BOTTOM(1) : 0);
}

/* gamma and beta gradients are taken before the input's, which in place overwrites dy. A gamma
 * from the second bottom gets its gradient overwritten, not accumulated. */
static int scale_backward(kiln_layer *l) {
  scale_state *s = l->priv;
  const float *x = s->borrowed   ? l->input_copy->data
                   : s->in_place ? l->buffer[0]->data
                                 : l->bottom[0]->data;
  float *dg = NULL;
  bool accumulate = true;
  if (!s->from_bottom) {
    dg = l->param[0]->diff;
  } else if (l->propagate_down[1]) {
    dg = l->bottom[1]->diff;
    accumulate = false; /* bottom diffs are overwritten */
  }
  float *db = s->bias_index >= 0 ? l->param[s->bias_index]->diff : NULL;
  float *dx = l->propagate_down[0] ? l->bottom[0]->diff : NULL;
  const float *g = (s->from_bottom ? l->bottom[1] : l->param[0])->data;
  return KILN_OP(l, scale_bwd, dx, dg, db, l->top[0]->diff, x, g, s->outer, s->dim, s->inner,
                 scale_block(l), accumulate);
}

static void scale_destroy(kiln_layer *l) { free(l->priv); }

/* A learnable per-channel gamma with a beta (bias_term) over an (N, C, ...) input, in place: the
 * layer before may apply it (BatchNorm). */
static bool scale_absorbable(const kiln_layer *l, kiln_absorb_kind kind, const kiln_blob *blob,
                             kiln_absorb *offer) {
  if (kind != KILN_ABSORB_CHANNEL_AFFINE || !kiln_in_place_without_loss(l, blob)) return false;
  const scale_state *s = l->priv;
  if (!s || s->from_bottom || s->bias_index < 0 || blob->naxes < 2 || s->outer != blob->shape[0] ||
      s->dim != blob->shape[1])
    return false;
  offer->gamma = l->param[0];
  offer->beta = l->param[s->bias_index];
  return true;
}

/* A learnable per-channel scale of a 4-D input reads either layout. */
static int scale_layout_role(const kiln_layer *l) {
  const scale_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  bool per_channel = s && !s->from_bottom && x->naxes == 4 && s->dim == x->shape[1] &&
                     s->outer == x->shape[0];
  return per_channel ? KILN_LAYOUT_ROLE_SAME : KILN_LAYOUT_ROLE_NONE;
}

const kiln_layer_ops kiln_layer_scale = {
    .type = "Scale", .min_bottoms = 1, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = scale_setup, .reshape = scale_reshape, .forward = scale_forward,
    .backward = scale_backward, .destroy = scale_destroy, .layout_role = scale_layout_role,
    .absorbable = scale_absorbable, .backward_reads = scale_backward_reads,
    .kernels = KILN_KERNELS(KILN_OP_scale_fwd, KILN_OP_scale_bwd),
};
