/* Pooling: MAX and AVE, CEIL or FLOOR rounding, padding, global pooling (Caffe's semantics). */
#include <stdlib.h>

#include "kiln/ops.h"
#include "layer_util.h"

static const Caffe__PoolingParameter pool_defaults = CAFFE__POOLING_PARAMETER__INIT;

typedef struct {
  kiln_conv_geom g;
  bool global;
  int method;
} pool_state;

static int pool_setup(kiln_layer *l) {
  const Caffe__PoolingParameter *p = KILN_PARAM_OR(l->lp->pooling_param, pool_defaults);
  pool_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  kiln_conv_geom *g = &s->g;
  s->method = p->pool;
  if (s->method == CAFFE__POOLING_PARAMETER__POOL_METHOD__STOCHASTIC)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "STOCHASTIC pooling is not supported");
  const struct {
    const char *name;
    uint32_t v;
  } sizes[] = {{"kernel_size", p->kernel_size}, {"kernel_h", p->kernel_h},
               {"kernel_w", p->kernel_w},       {"pad", p->pad},
               {"pad_h", p->pad_h},             {"pad_w", p->pad_w},
               {"stride", p->stride},           {"stride_h", p->stride_h},
               {"stride_w", p->stride_w}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v > KILN_CONV_MAX_PARAM) /* still unsigned: past int it would wrap */
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s %u is too large (at most %d)",
                              sizes[i].name, sizes[i].v, KILN_CONV_MAX_PARAM);
  s->global = p->global_pooling;
  if (s->global) {
    if (p->has_kernel_size || p->has_kernel_h || p->has_kernel_w)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "global_pooling takes no kernel size");
  } else if (p->has_kernel_size) {
    if (p->has_kernel_h || p->has_kernel_w)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "give kernel_size or kernel_h/kernel_w, not both");
    g->kernel_h = g->kernel_w = (int)p->kernel_size;
  } else if (p->has_kernel_h && p->has_kernel_w) {
    g->kernel_h = (int)p->kernel_h;
    g->kernel_w = (int)p->kernel_w;
  } else {
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "kernel_size (or kernel_h and kernel_w) is required");
  }
  g->pad_h = (int)(p->has_pad_h ? p->pad_h : p->pad);
  g->pad_w = (int)(p->has_pad_w ? p->pad_w : p->pad);
  g->stride_h = (int)(p->has_stride_h ? p->stride_h : p->stride);
  g->stride_w = (int)(p->has_stride_w ? p->stride_w : p->stride);
  g->dilation_h = g->dilation_w = 1;
  if (!s->global && (g->kernel_h <= 0 || g->kernel_w <= 0 || g->stride_h <= 0 || g->stride_w <= 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "kernel and stride must be > 0");
  if (!s->global && (g->pad_h >= g->kernel_h || g->pad_w >= g->kernel_w))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "pad must be smaller than the kernel");
  if (l->bottom[0]->naxes != 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x C x H x W (got %d axes)",
                            l->bottom[0]->naxes);
  if (s->method == CAFFE__POOLING_PARAMETER__POOL_METHOD__MAX && !kiln_layer_add_buffer(l, "argmax"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int pool_reshape(kiln_layer *l) {
  const Caffe__PoolingParameter *p = KILN_PARAM_OR(l->lp->pooling_param, pool_defaults);
  pool_state *s = l->priv;
  kiln_conv_geom *g = &s->g;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4) return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x C x H x W");
  g->channels = (int)x->shape[1];
  if (x->shape[2] > KILN_CONV_MAX_SIDE || x->shape[3] > KILN_CONV_MAX_SIDE)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %lldx%lld is larger than %dx%d",
                            (long long)x->shape[2], (long long)x->shape[3], KILN_CONV_MAX_SIDE,
                            KILN_CONV_MAX_SIDE);
  g->height = (int)x->shape[2];
  g->width = (int)x->shape[3];
  if (s->global) {
    g->kernel_h = g->height;
    g->kernel_w = g->width;
    g->pad_h = g->pad_w = 0;
    g->stride_h = g->stride_w = 1;
  }
  if (kiln_pool_out_size(g, p->round_mode == CAFFE__POOLING_PARAMETER__ROUND_MODE__CEIL) != 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "kernel %dx%d does not fit the %dx%d input",
                            g->kernel_h, g->kernel_w, g->height, g->width);
  int64_t shape[4] = {x->shape[0], g->channels, g->out_h, g->out_w};
  l->flops = (double)x->shape[0] * g->channels * g->out_h * g->out_w * g->kernel_h * g->kernel_w;
  if (l->nbuffer) KILN_TRY(kiln_blob_reshape(l->buffer[0], 4, shape)); /* int32 fits in a float slot */
  return kiln_blob_reshape(l->top[0], 4, shape);
}

static int pool_forward(kiln_layer *l) {
  pool_state *s = l->priv;
  const bool max = s->method == CAFFE__POOLING_PARAMETER__POOL_METHOD__MAX;
  return KILN_OP(l, pool_fwd, l->top[0]->data, max ? (int32_t *)l->buffer[0]->data : NULL,
                 l->bottom[0]->data, (int)l->bottom[0]->shape[0], &s->g, max, l->bottom[0]->layout);
}

static int pool_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  pool_state *s = l->priv;
  const bool max = s->method == CAFFE__POOLING_PARAMETER__POOL_METHOD__MAX;
  return KILN_OP(l, pool_bwd, l->bottom[0]->diff, l->top[0]->diff,
                 max ? (const int32_t *)l->buffer[0]->data : NULL, (int)l->bottom[0]->shape[0],
                 &s->g, max, l->bottom[0]->layout);
}

static void pool_destroy(kiln_layer *l) { free(l->priv); }

/* MAX and AVE read either layout, the top in the bottom's (per channel, 16 channels a vector). */
static int pool_layout_role(const kiln_layer *l) {
  const pool_state *s = l->priv;
  return s && (s->method == CAFFE__POOLING_PARAMETER__POOL_METHOD__MAX ||
               s->method == CAFFE__POOLING_PARAMETER__POOL_METHOD__AVE)
             ? KILN_LAYOUT_ROLE_SAME
             : KILN_LAYOUT_ROLE_NONE;
}

const kiln_layer_ops kiln_layer_pooling = {
    .type = "Pooling", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = pool_setup, .reshape = pool_reshape, .forward = pool_forward,
    .backward = pool_backward, .destroy = pool_destroy, .layout_role = pool_layout_role,
    .backward_reads = kiln_reads_none, /* MAX's winners are a buffer */
    .kernels = KILN_KERNELS(KILN_OP_pool_fwd, KILN_OP_pool_bwd),
};
