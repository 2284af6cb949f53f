/* Caffe's layers that move or hold blobs without arithmetic of their own: Silence (consumes its
 * bottoms, no tops), Parameter (a learnable blob as its top), Tile (copies along an axis) and
 * Crop (the first bottom cut to the second's shape). Caffe's semantics, including its checks. */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

/* ---- Silence ------------------------------------------------------------------------------- */
/* Nothing forward; backward, a zero gradient for every bottom that wants one (nothing reads
 * what it consumed). */

static int silence_reshape(kiln_layer *l) {
  (void)l;
  return KILN_OK;
}

static int silence_forward(kiln_layer *l) {
  (void)l;
  return KILN_OK;
}

static int silence_backward(kiln_layer *l) {
  for (int b = 0; b < l->nbottom; b++)
    if (l->propagate_down[b]) KILN_TRY(KILN_OP(l, fill, l->bottom[b]->diff, 0.0f, l->bottom[b]->count));
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_silence = {
    .type = "Silence", .min_bottoms = 1, .max_bottoms = -1, .min_tops = 0, .max_tops = 0,
    .reshape = silence_reshape, .forward = silence_forward, .backward = silence_backward,
    .kernels = KILN_KERNELS(KILN_OP_fill),
};

/* ---- Parameter ----------------------------------------------------------------------------- */
/* Its one parameter blob, of parameter_param.shape (no axes: a scalar), as its top. Caffe makes
 * the top share the blob's data and gradient; here the top holds a copy and the gradient is
 * added into the blob's, which is the same gradient and keeps the convention that parameter
 * gradients accumulate over passes (iter_size). Without a filler, as in Caffe, the blob starts
 * at zero; a .caffemodel gives it its values. */

static const Caffe__ParameterParameter parameter_defaults = CAFFE__PARAMETER_PARAMETER__INIT;

static int parameter_setup(kiln_layer *l) {
  const Caffe__ParameterParameter *p = KILN_PARAM_OR(l->lp->parameter_param, parameter_defaults);
  const size_t n = p->shape ? p->shape->n_dim : 0;
  if (n > KILN_MAX_AXES)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "parameter_param.shape has %zu axes (at most %d)",
                            n, KILN_MAX_AXES);
  int64_t shape[KILN_MAX_AXES];
  for (size_t i = 0; i < n; i++) {
    shape[i] = p->shape->dim[i];
    if (shape[i] < 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "parameter_param.shape dim %lld on axis %zu is negative",
                              (long long)shape[i], i);
  }
  if (!kiln_layer_add_param(l, (int)n, shape, NULL, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int parameter_reshape(kiln_layer *l) { return kiln_blob_reshape_like(l->top[0], l->param[0]); }

static int parameter_forward(kiln_layer *l) {
  return KILN_OP(l, copy, l->top[0]->data, l->param[0]->data, l->param[0]->count);
}

static int parameter_backward(kiln_layer *l) {
  return KILN_OP(l, acc, l->param[0]->diff, l->top[0]->diff, l->param[0]->count);
}

const kiln_layer_ops kiln_layer_parameter = {
    .type = "Parameter", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 1,
    .setup = parameter_setup, .reshape = parameter_reshape, .forward = parameter_forward,
    .backward = parameter_backward, .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_acc),
};

/* ---- Tile ---------------------------------------------------------------------------------- */
/* For each item of the axes before `axis`, its block of the axes from `axis` on, `tiles` times
 * in a row; the gradient is the sum over the copies. */

static const Caffe__TileParameter tile_defaults = CAFFE__TILE_PARAMETER__INIT;

typedef struct {
  int64_t outer, inner, tiles;
} tile_state;

static int tile_setup(kiln_layer *l) {
  const Caffe__TileParameter *p = KILN_PARAM_OR(l->lp->tile_param, tile_defaults);
  if (!p->has_tiles)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "tile_param.tiles must be given");
  if (p->tiles <= 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "tile_param.tiles %d must be > 0", p->tiles);
  tile_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  return KILN_OK;
}

static int tile_reshape(kiln_layer *l) {
  const Caffe__TileParameter *p = KILN_PARAM_OR(l->lp->tile_param, tile_defaults);
  tile_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  int axis;
  if (kiln_blob_canonical_axis(x, p->axis, &axis))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "tile_param.axis %d is not an axis of a %d-axis input",
                            p->axis, x->naxes);
  s->outer = kiln_count(x, 0, axis);
  s->inner = kiln_count(x, axis, x->naxes);
  s->tiles = p->tiles;
  int64_t shape[KILN_MAX_AXES];
  memcpy(shape, x->shape, sizeof shape);
  shape[axis] *= p->tiles;
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], x->naxes, shape);
}

static int tile_forward(kiln_layer *l) {
  const tile_state *s = l->priv;
  return KILN_OP(l, tile_fwd, l->top[0]->data, l->bottom[0]->data, s->outer, s->tiles, s->inner);
}

static int tile_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const tile_state *s = l->priv;
  return KILN_OP(l, tile_bwd, l->bottom[0]->diff, l->top[0]->diff, s->outer, s->tiles, s->inner);
}

static void free_priv(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_tile = {
    .type = "Tile", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = tile_setup, .reshape = tile_reshape, .forward = tile_forward,
    .backward = tile_backward, .destroy = free_priv,
    .kernels = KILN_KERNELS(KILN_OP_tile_fwd, KILN_OP_tile_bwd),
};

/* ---- Crop ---------------------------------------------------------------------------------- */
/* Axes before `axis` keep the first bottom's size; each axis from it on takes the second
 * bottom's size, starting at its offset (one offset for all of them, one each, or none: 0). The
 * second bottom gives only a shape: its gradient is zero. */

static const Caffe__CropParameter crop_defaults = CAFFE__CROP_PARAMETER__INIT;

typedef struct {
  int64_t offset[KILN_MAX_AXES];
} crop_state;

static int crop_setup(kiln_layer *l) {
  crop_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  return KILN_OK;
}

static int crop_reshape(kiln_layer *l) {
  const Caffe__CropParameter *p = KILN_PARAM_OR(l->lp->crop_param, crop_defaults);
  crop_state *s = l->priv;
  const kiln_blob *x = l->bottom[0], *ref = l->bottom[1];
  const int n = x->naxes;
  int axis;
  if (kiln_blob_canonical_axis(x, p->axis, &axis))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "crop_param.axis %d is not an axis of a %d-axis input",
                            p->axis, n);
  if (ref->naxes < n)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the reference (second bottom) has %d axes, fewer than the input's %d",
                            ref->naxes, n);
  if (p->n_offset > 1 && (size_t)(n - axis) != p->n_offset)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "crop_param.offset has %zu values for the %d axes from axis %d on (give "
                            "one for all, or one each)",
                            p->n_offset, n - axis, axis);
  int64_t shape[KILN_MAX_AXES];
  for (int i = 0; i < n; i++) {
    s->offset[i] = 0;
    shape[i] = x->shape[i];
    if (i < axis) continue;
    s->offset[i] = p->n_offset == 0 ? 0 : p->offset[p->n_offset == 1 ? 0 : i - axis];
    shape[i] = ref->shape[i];
    if (x->shape[i] - s->offset[i] < ref->shape[i])
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "crop_param.offset %lld on axis %d: the crop of size %lld runs past "
                              "the input's %lld",
                              (long long)s->offset[i], i, (long long)ref->shape[i],
                              (long long)x->shape[i]);
  }
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], n, shape);
}

static int crop_forward(kiln_layer *l) {
  const crop_state *s = l->priv;
  return KILN_OP(l, crop_copy, l->top[0]->data, l->bottom[0]->data, l->top[0]->naxes,
                 l->bottom[0]->shape, l->top[0]->shape, s->offset, true);
}

/* The window's gradient into zeros; the reference (second bottom) gives a shape only. */
static int crop_backward(kiln_layer *l) {
  const crop_state *s = l->priv;
  if (l->propagate_down[0]) {
    KILN_TRY(KILN_OP(l, fill, l->bottom[0]->diff, 0.0f, l->bottom[0]->count));
    KILN_TRY(KILN_OP(l, crop_copy, l->top[0]->diff, l->bottom[0]->diff, l->top[0]->naxes,
                     l->bottom[0]->shape, l->top[0]->shape, s->offset, false));
  }
  if (l->propagate_down[1])
    KILN_TRY(KILN_OP(l, fill, l->bottom[1]->diff, 0.0f, l->bottom[1]->count));
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_crop = {
    .type = "Crop", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .setup = crop_setup, .reshape = crop_reshape, .forward = crop_forward,
    .backward = crop_backward, .destroy = free_priv,
    .kernels = KILN_KERNELS(KILN_OP_crop_copy, KILN_OP_fill),
};
