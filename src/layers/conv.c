/* Convolution (2-D, Caffe's parameters: kernel/pad/stride/dilation as a single value or h/w
 * pair, group, bias). The backend's route (src/ops/conv_route.c) runs it by the route it chooses
 * for the shape: on the cpu backend the one measured fastest (shifted rows, oneDNN, or im2col +
 * GEMM), on the reference im2col + GEMM. */
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
#include "layer_util.h"

static const Caffe__ConvolutionParameter conv_defaults = CAFFE__CONVOLUTION_PARAMETER__INIT;

typedef struct {
  kiln_conv_geom g;
  int M, group;
  bool bias;
  kiln_conv_route *route; /* the backend's route and state for the current shape */
  kiln_conv_route_info info;
} conv_state;

_Static_assert((int)KILN_CONV_ROLE_BOTTOM == (int)KILN_LAYOUT_ROLE_BOTTOM &&
                   (int)KILN_CONV_ROLE_TOP == (int)KILN_LAYOUT_ROLE_TOP,
               "a route's layout roles are the layer's");

/* Caffe allows a value given once (both axes) or per axis (repeated), or as *_h / *_w. */
static int pick2(kiln_layer *l, const char *what, size_t n, const uint32_t *vals, bool has_h,
                 uint32_t h, bool has_w, uint32_t w, uint32_t dflt, int *oh, int *ow) {
  /* Checked while still unsigned: a value past int would otherwise turn negative or wrap. */
  for (size_t i = 0; i < n + 2; i++) {
    const uint32_t v = i < n ? vals[i] : i == n ? (has_h ? h : 0) : (has_w ? w : 0);
    if (v > KILN_CONV_MAX_PARAM)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s %u is too large (at most %d)", what, v,
                              KILN_CONV_MAX_PARAM);
  }
  if (has_h || has_w) {
    if (n > 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "give either %s or %s_h/%s_w, not both", what,
                              what, what);
    if (!(has_h && has_w))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s_h and %s_w must be given together", what,
                              what);
    *oh = (int)h;
    *ow = (int)w;
  } else if (n == 0) {
    *oh = *ow = (int)dflt;
  } else if (n == 1) {
    *oh = *ow = (int)vals[0];
  } else if (n == 2) {
    *oh = (int)vals[0];
    *ow = (int)vals[1];
  } else {
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "%zu values of %s: only 2-D convolution", n,
                            what);
  }
  return KILN_OK;
}

/* The window of convolution_param (Convolution, Deconvolution, Im2col): a 4-D input with
 * channels on axis 1, kernel, pad, stride and dilation into g, checked as Caffe does. */
int kiln_conv_param_geom(kiln_layer *l, const Caffe__ConvolutionParameter *p, kiln_conv_geom *g) {
  if (l->bottom[0]->naxes != 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x C x H x W (got %d axes)",
                            l->bottom[0]->naxes);
  if (p->axis != 1 && p->axis != -3)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "axis %d: only channel axis 1", p->axis);
  KILN_TRY(pick2(l, "kernel", p->n_kernel_size, p->kernel_size, p->has_kernel_h, p->kernel_h,
                 p->has_kernel_w, p->kernel_w, 0, &g->kernel_h, &g->kernel_w));
  KILN_TRY(pick2(l, "pad", p->n_pad, p->pad, p->has_pad_h, p->pad_h, p->has_pad_w, p->pad_w, 0,
                 &g->pad_h, &g->pad_w));
  KILN_TRY(pick2(l, "stride", p->n_stride, p->stride, p->has_stride_h, p->stride_h,
                 p->has_stride_w, p->stride_w, 1, &g->stride_h, &g->stride_w));
  KILN_TRY(pick2(l, "dilation", p->n_dilation, p->dilation, false, 0, false, 0, 1,
                 &g->dilation_h, &g->dilation_w));
  if (g->kernel_h <= 0 || g->kernel_w <= 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "kernel size must be given and > 0");
  if (g->stride_h <= 0 || g->stride_w <= 0 || g->dilation_h <= 0 || g->dilation_w <= 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "stride and dilation must be > 0");
  return KILN_OK;
}

static int conv_setup(kiln_layer *l) {
  const Caffe__ConvolutionParameter *p = KILN_PARAM_OR(l->lp->convolution_param, conv_defaults);
  conv_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  kiln_conv_geom *g = &s->g;
  KILN_TRY(kiln_conv_param_geom(l, p, g));
  if (!p->has_num_output || p->num_output == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "convolution_param.num_output must be set and > 0");
  s->M = (int)p->num_output;
  s->group = (int)p->group;
  s->bias = p->bias_term;
  g->channels = (int)l->bottom[0]->shape[1];
  if (s->group <= 0 || g->channels % s->group || s->M % s->group)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "group %d must divide both the input channels (%d) and num_output (%d)",
                            s->group, g->channels, s->M);
  int64_t wshape[4] = {s->M, g->channels / s->group, g->kernel_h, g->kernel_w};
  if (!kiln_layer_add_param(l, 4, wshape, p->weight_filler, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (s->bias) {
    int64_t bshape[1] = {s->M};
    if (!kiln_layer_add_param(l, 1, bshape, p->bias_filler, 0))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  return KILN_OK;
}

static int conv_reshape(kiln_layer *l) {
  conv_state *s = l->priv;
  kiln_conv_geom *g = &s->g;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 4 || x->shape[1] != g->channels)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input must be N x %d x H x W", g->channels);
  if (x->shape[2] > KILN_CONV_MAX_SIDE || x->shape[3] > KILN_CONV_MAX_SIDE)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "input %lldx%lld is larger than %dx%d",
                            (long long)x->shape[2], (long long)x->shape[3], KILN_CONV_MAX_SIDE,
                            KILN_CONV_MAX_SIDE);
  g->height = (int)x->shape[2];
  g->width = (int)x->shape[3];
  if (kiln_conv_out_size(g) != 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "kernel %dx%d (dilation %d) does not fit the %dx%d input with pad %d",
                            g->kernel_h, g->kernel_w, g->dilation_h, g->height, g->width, g->pad_h);
  int64_t shape[4] = {x->shape[0], s->M, g->out_h, g->out_w};
  l->flops = 2.0 * x->shape[0] * s->M * g->out_h * g->out_w * (g->channels / s->group) *
             g->kernel_h * g->kernel_w;
  const kiln_conv_spec spec = {.N = x->shape[0], .M = s->M, .group = s->group, .g = *g,
                               .bias = s->bias, .x_layout = x->layout,
                               .y_layout = l->top[0]->layout};
  int rc = KILN_OP(l, conv_route_update, &s->route, &spec, &s->info);
  if (rc) return kiln_error_context(rc, "layer '%s' (Convolution): ", l->name);
  l->workspace_floats = s->info.workspace_floats;
  return kiln_blob_reshape(l->top[0], 4, shape);
}

static int conv_forward(kiln_layer *l) {
  conv_state *s = l->priv;
  return KILN_OP(l, conv_fwd, s->route, l->top[0]->data, l->bottom[0]->data, l->param[0]->data,
                 s->bias ? l->param[1]->data : NULL, l->workspace);
}

static int conv_backward(kiln_layer *l) {
  conv_state *s = l->priv;
  return KILN_OP(l, conv_bwd, s->route, l->propagate_down[0] ? l->bottom[0]->diff : NULL,
                 l->param[0]->diff, s->bias ? l->param[1]->diff : NULL, l->top[0]->diff,
                 l->bottom[0]->data, l->param[0]->data, l->workspace);
}

/* The layouts the route reads and writes without a reorder (oneDNN's, with group 1). */
static int conv_layout_role(const kiln_layer *l) {
  const conv_state *s = l->priv;
  return s && s->route ? s->info.layout_role : KILN_LAYOUT_ROLE_NONE;
}

/* The block of that layout (oneDNN's nChw16c: 16). */
static int conv_block_channels(const kiln_layer *l) {
  const conv_state *s = l->priv;
  return s && s->route ? s->info.block_channels : 0;
}

static void conv_destroy(kiln_layer *l) {
  conv_state *s = l->priv;
  if (s && l->backend) KILN_OP(l, conv_route_free, s->route);
  free(l->priv);
}

const kiln_layer_ops kiln_layer_convolution = {
    .type = "Convolution", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = conv_setup, .reshape = conv_reshape, .forward = conv_forward,
    .backward = conv_backward, .destroy = conv_destroy, .layout_role = conv_layout_role,
    .block_channels = conv_block_channels, .backward_reads = kiln_reads_bottom0,
    .kernels = KILN_KERNELS(KILN_OP_conv_route_update, KILN_OP_conv_route_free, KILN_OP_conv_fwd,
                            KILN_OP_conv_bwd),
};
