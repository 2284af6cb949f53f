/* SPP, spatial pyramid pooling (Caffe's SPPLayer): level i of pyramid_height pools the whole
 * N x C x H x W input into 2^i x 2^i bins, MAX or AVE, with Caffe's window for the level:
 * kernel = ceil(H / 2^i), stride = kernel, pad = (kernel 2^i - H + 1) / 2 (the same for W), and
 * Caffe's pooling (ceil rounding, AVE divided by the window clipped to the padded input). The top
 * is each level's output flattened per image and concatenated, (N, C sum_i bins_i); with one
 * level it is the pooling output itself, (N, C, 1, 1), as in Caffe. A level whose padding would
 * reach its kernel (an input smaller than its bins) is refused, as Caffe's pooling refuses it. */
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
#include "layer_util.h"

static const Caffe__SPPParameter spp_defaults = CAFFE__SPPPARAMETER__INIT;

enum { SPP_MAX_LEVELS = 16 };

typedef struct {
  int levels;
  bool max;
  kiln_conv_geom g[SPP_MAX_LEVELS];
  int64_t off[SPP_MAX_LEVELS + 1]; /* level i's outputs at [off[i], off[i + 1]) per image */
} spp_state;

static int spp_setup(kiln_layer *l) {
  const Caffe__SPPParameter *p = KILN_PARAM_OR(l->lp->spp_param, spp_defaults);
  if (!p->has_pyramid_height || p->pyramid_height == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "spp_param.pyramid_height must be given and > 0");
  if (p->pyramid_height > SPP_MAX_LEVELS)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "spp_param.pyramid_height %u is more than %d",
                            p->pyramid_height, SPP_MAX_LEVELS);
  if (p->pool == CAFFE__SPPPARAMETER__POOL_METHOD__STOCHASTIC)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "spp_param.pool STOCHASTIC is not supported (as in Pooling)");
  if (p->pool != CAFFE__SPPPARAMETER__POOL_METHOD__MAX &&
      p->pool != CAFFE__SPPPARAMETER__POOL_METHOD__AVE)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "spp_param.pool %d is unknown", (int)p->pool);
  spp_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->levels = (int)p->pyramid_height;
  s->max = p->pool == CAFFE__SPPPARAMETER__POOL_METHOD__MAX;
  /* every level's pooled output (and its gradient in backward), the argmax of MAX, and one
   * level's input gradient before it is added to the others' */
  if (!kiln_layer_add_buffer(l, "pooled") || !kiln_layer_add_buffer(l, "argmax") ||
      !kiln_layer_add_buffer(l, "level_dx"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int spp_reshape(kiln_layer *l) {
  spp_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x C x H x W (got %d axes)",
                            x->naxes);
  if (x->shape[1] < 1 || x->shape[2] < 1 || x->shape[3] < 1 || x->shape[1] > KILN_CONV_MAX_SIDE ||
      x->shape[2] > KILN_CONV_MAX_SIDE || x->shape[3] > KILN_CONV_MAX_SIDE)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %lldx%lldx%lld: empty or too large",
                            (long long)x->shape[1], (long long)x->shape[2], (long long)x->shape[3]);
  const int C = (int)x->shape[1], H = (int)x->shape[2], W = (int)x->shape[3];
  s->off[0] = 0;
  double flops = 0;
  for (int i = 0; i < s->levels; i++) {
    kiln_conv_geom *g = &s->g[i];
    const int64_t bins = (int64_t)1 << i;
    memset(g, 0, sizeof *g);
    g->channels = C;
    g->height = H;
    g->width = W;
    g->kernel_h = (int)((H + bins - 1) / bins);
    g->kernel_w = (int)((W + bins - 1) / bins);
    g->pad_h = (int)((g->kernel_h * bins - H + 1) / 2);
    g->pad_w = (int)((g->kernel_w * bins - W + 1) / 2);
    g->stride_h = g->kernel_h;
    g->stride_w = g->kernel_w;
    g->dilation_h = g->dilation_w = 1;
    if (kiln_pool_out_size(g, 1) != 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "spp_param.pyramid_height %d is too high for the %dx%d input: level "
                              "%d (%lldx%lld bins) pools %dx%d windows with padding %dx%d, which "
                              "must be smaller",
                              s->levels, H, W, i, (long long)bins, (long long)bins, g->kernel_h,
                              g->kernel_w, g->pad_h, g->pad_w);
    s->off[i + 1] = s->off[i] + (int64_t)C * g->out_h * g->out_w;
    flops += (double)C * g->out_h * g->out_w * g->kernel_h * g->kernel_w;
  }
  const int64_t N = x->shape[0], per = s->off[s->levels];
  const int64_t pooled = N * per;
  KILN_TRY(kiln_blob_reshape(l->buffer[0], 1, &pooled));
  KILN_TRY(kiln_blob_reshape(l->buffer[1], 1, &pooled)); /* int32 fits in a float slot */
  KILN_TRY(kiln_blob_reshape_like(l->buffer[2], x));
  l->flops = flops * (double)N;
  if (s->levels == 1) {
    int64_t shape[4] = {N, C, s->g[0].out_h, s->g[0].out_w};
    return kiln_blob_reshape(l->top[0], 4, shape);
  }
  int64_t shape[2] = {N, per};
  return kiln_blob_reshape(l->top[0], 2, shape);
}

static int spp_forward(kiln_layer *l) {
  const spp_state *s = l->priv;
  const int N = (int)l->bottom[0]->shape[0];
  const int64_t per = s->off[s->levels];
  float *pooled = l->buffer[0]->data, *y = l->top[0]->data;
  int32_t *mask = (int32_t *)l->buffer[1]->data;
  for (int i = 0; i < s->levels; i++) {
    const int64_t size = s->off[i + 1] - s->off[i], at = (int64_t)N * s->off[i];
    KILN_TRY(KILN_OP(l, pool_fwd, pooled + at, s->max ? mask + at : NULL, l->bottom[0]->data, N,
                     &s->g[i], s->max, KILN_LAYOUT_PLAIN));
    KILN_TRY(KILN_OP(l, copy_blocks, y + s->off[i], per, pooled + at, size, size, N));
  }
  return KILN_OK;
}

static int spp_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const spp_state *s = l->priv;
  const int N = (int)l->bottom[0]->shape[0];
  const int64_t per = s->off[s->levels], count = l->bottom[0]->count;
  float *dpooled = l->buffer[0]->data, *level_dx = l->buffer[2]->data;
  const int32_t *mask = (const int32_t *)l->buffer[1]->data;
  float *dx = l->bottom[0]->diff;
  for (int i = 0; i < s->levels; i++) {
    const int64_t size = s->off[i + 1] - s->off[i], at = (int64_t)N * s->off[i];
    KILN_TRY(KILN_OP(l, copy_blocks, dpooled + at, size, l->top[0]->diff + s->off[i], per, size, N));
    /* the first level's gradient straight into dx, each further one added to it */
    KILN_TRY(KILN_OP(l, pool_bwd, i == 0 ? dx : level_dx, dpooled + at, s->max ? mask + at : NULL,
                     N, &s->g[i], s->max, KILN_LAYOUT_PLAIN));
    if (i > 0) KILN_TRY(KILN_OP(l, acc, dx, level_dx, count));
  }
  return KILN_OK;
}

static void spp_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_spp = {
    .type = "SPP", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = spp_setup, .reshape = spp_reshape, .forward = spp_forward,
    .backward = spp_backward, .destroy = spp_destroy,
    .kernels = KILN_KERNELS(KILN_OP_pool_fwd, KILN_OP_pool_bwd, KILN_OP_copy_blocks, KILN_OP_acc),
};
