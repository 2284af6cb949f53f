/* Deconvolution (convolution's transpose) and Im2col, on the plain convolution kernels of
 * src/ops/conv.c, with Caffe's convolution_param (kernel, pad, stride, dilation, group, bias).
 *
 * Deconvolution is Caffe's: the convolution that maps the top (num_output channels, H_out x
 * W_out) to the bottom (C channels, H x W), run backwards. Its weights are [C, num_output / group,
 * kh, kw], that convolution's weights, and H_out = stride (H - 1) + dilation (kh - 1) + 1 - 2 pad
 * (the same for W). So forward is that convolution's input gradient, the gradient of the bottom
 * is its forward pass, and the weight gradient is its weight gradient with the top's gradient as
 * the input and the bottom as the output gradient. Always the plain route: the faster
 * convolution routes (oneDNN, shifted rows) are chosen for Convolution's own shapes.
 *
 * Im2col lays each image's kh x kw windows out as columns: top (N, C kh kw, H_out, W_out) with
 * Caffe's convolution output size; backward scatters the columns' gradients back (col2im). */
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
#include "layer_util.h"

static const Caffe__ConvolutionParameter conv_defaults = CAFFE__CONVOLUTION_PARAMETER__INIT;

static const Caffe__ConvolutionParameter *conv_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->convolution_param, conv_defaults);
}

static void free_priv(kiln_layer *l) { free(l->priv); }

/* ---- Deconvolution ------------------------------------------------------------------------- */

typedef struct {
  kiln_conv_geom g; /* the convolution from the top (its input) to the bottom (its output) */
  int C, M, group;  /* bottom channels, num_output, group */
  bool bias;
} deconv_state;

static int deconv_setup(kiln_layer *l) {
  const Caffe__ConvolutionParameter *p = conv_param(l);
  deconv_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  KILN_TRY(kiln_conv_param_geom(l, p, &s->g));
  if (!p->has_num_output || p->num_output == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "convolution_param.num_output must be set and > 0");
  if (p->num_output > KILN_CONV_MAX_PARAM)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "convolution_param.num_output %u is too large",
                            p->num_output);
  s->M = (int)p->num_output;
  s->group = (int)p->group;
  s->bias = p->bias_term;
  s->C = (int)l->bottom[0]->shape[1];
  if (s->group <= 0 || s->C % s->group || s->M % s->group)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "convolution_param.group %d must divide both the input channels (%d) "
                            "and num_output (%d)",
                            s->group, s->C, s->M);
  int64_t wshape[4] = {s->C, s->M / s->group, s->g.kernel_h, s->g.kernel_w};
  if (!kiln_layer_add_param(l, 4, wshape, p->weight_filler, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (s->bias) {
    int64_t bshape[1] = {s->M};
    if (!kiln_layer_add_param(l, 1, bshape, p->bias_filler, 0))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  return KILN_OK;
}

static int deconv_reshape(kiln_layer *l) {
  deconv_state *s = l->priv;
  kiln_conv_geom *g = &s->g;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4 || x->shape[1] != s->C)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x %d x H x W", s->C);
  if (x->shape[2] > KILN_CONV_MAX_SIDE || x->shape[3] > KILN_CONV_MAX_SIDE)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %lldx%lld is larger than %dx%d",
                            (long long)x->shape[2], (long long)x->shape[3], KILN_CONV_MAX_SIDE,
                            KILN_CONV_MAX_SIDE);
  const int64_t ext_h = (int64_t)g->dilation_h * (g->kernel_h - 1) + 1;
  const int64_t ext_w = (int64_t)g->dilation_w * (g->kernel_w - 1) + 1;
  const int64_t oh = g->stride_h * (x->shape[2] - 1) + ext_h - 2 * (int64_t)g->pad_h;
  const int64_t ow = g->stride_w * (x->shape[3] - 1) + ext_w - 2 * (int64_t)g->pad_w;
  if (x->shape[2] < 1 || x->shape[3] < 1 || oh < 1 || ow < 1 || oh > KILN_CONV_MAX_SIDE ||
      ow > KILN_CONV_MAX_SIDE)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the %lldx%lld input gives a %lldx%lld output (kernel %dx%d, stride "
                            "%d, pad %d)",
                            (long long)x->shape[2], (long long)x->shape[3], (long long)oh,
                            (long long)ow, g->kernel_h, g->kernel_w, g->stride_h, g->pad_h);
  g->channels = s->M;
  g->height = (int)oh;
  g->width = (int)ow;
  if (kiln_conv_out_size(g) != 0 || g->out_h != x->shape[2] || g->out_w != x->shape[3])
    return kiln_errorf(KILN_ERR_INTERNAL, "layer '%s' (Deconvolution): geometry", l->name);
  /* (the convolution from the top: C output channels of the M/group the weights hold) */
  l->workspace_floats = kiln_im2col_conv_workspace(g, s->group, s->C, l->nthreads);
  l->flops = 2.0 * x->shape[0] * s->C * x->shape[2] * x->shape[3] * (s->M / s->group) *
             g->kernel_h * g->kernel_w;
  int64_t shape[4] = {x->shape[0], s->M, oh, ow};
  return kiln_blob_reshape(l->top[0], 4, shape);
}

static int deconv_forward(kiln_layer *l) {
  deconv_state *s = l->priv;
  const int N = (int)l->bottom[0]->shape[0];
  if (N == 0) return KILN_OK;
  float *y = l->top[0]->data;
  KILN_TRY(KILN_OP(l, im2col_conv_bwd, y, NULL, NULL, l->bottom[0]->data, NULL, l->param[0]->data,
                   N, s->C, s->group, &s->g, l->workspace));
  if (s->bias)
    KILN_TRY(KILN_OP(l, plane_bias_add, y, l->param[1]->data, N, s->M,
                     (int64_t)s->g.height * s->g.width));
  return KILN_OK;
}

static int deconv_backward(kiln_layer *l) {
  deconv_state *s = l->priv;
  const int N = (int)l->bottom[0]->shape[0];
  if (N == 0) return KILN_OK;
  const float *dy = l->top[0]->diff, *x = l->bottom[0]->data, *w = l->param[0]->data;
  if (s->bias)
    KILN_TRY(KILN_OP(l, plane_bias_grad, l->param[1]->diff, dy, N, s->M,
                     (int64_t)s->g.height * s->g.width));
  KILN_TRY(KILN_OP(l, im2col_conv_bwd, NULL, l->param[0]->diff, NULL, x, dy, w, N, s->C, s->group,
                   &s->g, l->workspace));
  if (l->propagate_down[0])
    KILN_TRY(KILN_OP(l, im2col_conv_fwd, l->bottom[0]->diff, dy, w, NULL, N, s->C, s->group,
                     &s->g, l->workspace));
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_deconvolution = {
    .type = "Deconvolution", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = deconv_setup, .reshape = deconv_reshape, .forward = deconv_forward,
    .backward = deconv_backward, .destroy = free_priv,
    .kernels = KILN_KERNELS(KILN_OP_im2col_conv_fwd, KILN_OP_im2col_conv_bwd,
                            KILN_OP_plane_bias_add, KILN_OP_plane_bias_grad),
};

/* ---- Im2col -------------------------------------------------------------------------------- */

typedef struct {
  kiln_conv_geom g;
} im2col_state;

static int im2col_setup(kiln_layer *l) {
  im2col_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  return kiln_conv_param_geom(l, conv_param(l), &s->g);
}

static int im2col_reshape(kiln_layer *l) {
  im2col_state *s = l->priv;
  kiln_conv_geom *g = &s->g;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x C x H x W (got %d axes)",
                            x->naxes);
  if (x->shape[1] > KILN_CONV_MAX_PARAM || x->shape[2] > KILN_CONV_MAX_SIDE ||
      x->shape[3] > KILN_CONV_MAX_SIDE)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %lldx%lldx%lld is too large",
                            (long long)x->shape[1], (long long)x->shape[2], (long long)x->shape[3]);
  g->channels = (int)x->shape[1];
  g->height = (int)x->shape[2];
  g->width = (int)x->shape[3];
  if (kiln_conv_out_size(g) != 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "kernel %dx%d (dilation %d) does not fit the %dx%d input with pad %d",
                            g->kernel_h, g->kernel_w, g->dilation_h, g->height, g->width, g->pad_h);
  int64_t shape[4] = {x->shape[0], (int64_t)g->channels * g->kernel_h * g->kernel_w, g->out_h,
                      g->out_w};
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], 4, shape);
}

static int im2col_forward(kiln_layer *l) {
  const im2col_state *s = l->priv;
  return KILN_OP(l, im2col, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->shape[0], &s->g);
}

static int im2col_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  const im2col_state *s = l->priv;
  return KILN_OP(l, col2im, l->bottom[0]->diff, l->top[0]->diff, l->bottom[0]->shape[0], &s->g);
}

const kiln_layer_ops kiln_layer_im2col = {
    .type = "Im2col", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = im2col_setup, .reshape = im2col_reshape, .forward = im2col_forward,
    .backward = im2col_backward, .destroy = free_priv,
    .kernels = KILN_KERNELS(KILN_OP_im2col, KILN_OP_col2im),
};
