/* Convolution (2-D, Caffe's parameters: kernel/pad/stride/dilation as a single value or h/w
 * pair, group, bias) over the kernels in src/ops, by the route measured fastest for the shape:
 * shifted rows (conv_shift.c), oneDNN (conv_dnnl.c), or im2col + GEMM (conv.c, the reference,
 * and the only route under kiln_config.engine KILN_ENGINE_REF, KILN_ENGINE=ref). */
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
#include "layer_util.h"

static const Caffe__ConvolutionParameter conv_defaults = CAFFE__CONVOLUTION_PARAMETER__INIT;

typedef struct {
  kiln_conv_geom g;
  int M, group;
  bool bias;
  kiln_dnnl_conv *dn; /* oneDNN primitives for the current shape, or NULL: plain kernels */
  int64_t dn_n;       /* batch the primitives were made for */
  int dn_h, dn_w;
  int dn_xl, dn_yl;   /* the layouts of input and output they were made for */
  /* The largest batch primitives were made for (the planned one) and the images each of their
   * calls ran (kiln_dnnl_conv_chunks): primitives for a smaller batch run no more at once, so
   * they need no more workspace than the net planned. */
  int64_t dn_planned_n;
  int dn_call_images;
  bool plain_din;     /* with oneDNN: the input gradient still on the plain route */
  bool shift;         /* the shifted-row direct kernels (kiln_conv_shift_*) */
} conv_state;

/* oneDNN unless the build lacks it or the configuration asks for the plain C reference
 * (KILN_ENGINE_REF), or the shape gains nothing there: a few input channels into a count off
 * oneDNN's 16-blocks (LeNet's conv1, 1 -> 20) runs no faster on oneDNN (`kiln-conv-routes`),
 * whose padded 32-channel copies cost megabytes of workspace. */
static bool want_dnnl(const conv_state *s, const kiln_layer *l) {
  if (!kiln_dnnl_available() || l->config->engine == KILN_ENGINE_REF) return false;
  return !(s->g.channels / s->group < 16 && (s->M / s->group) % 16 != 0);
}

/* The shifted-row direct kernels where they were measured to beat every other route
 * (`kiln-conv-routes`, docs/PERF.md): stride 1 and group 1, an output channel count off oneDNN's
 * 16-blocks, and 5 or more kernel rows (the register blocks hold 4-6 kernel rows of the weight
 * and input gradients; with 3 they are a third empty). LeNet's conv2 (20 -> 50 5x5 on 12x12)
 * and conv1 (1 -> 20 on 28x28) are the shapes it wins on; docs/PERF.md quotes the figures.
 * Per-image shifted planes over 512 KiB would leave the caches: not taken. Only in a build with
 * AVX-512 (kiln_conv_shift_fast). */
static bool want_shift(const conv_state *s, const kiln_layer *l) {
  if (l->config->engine == KILN_ENGINE_REF) return false;
  /* It reads and writes Caffe's layout only (a blocked neighbour means oneDNN was chosen at
   * the first reshape; a later reshape keeps that route). */
  if (l->bottom[0]->layout != KILN_LAYOUT_PLAIN || l->top[0]->layout != KILN_LAYOUT_PLAIN)
    return false;
  const int64_t N = l->bottom[0]->shape[0];
  const kiln_conv_geom *g = &s->g;
  if (!kiln_conv_shift_fast() || !kiln_conv_shift_supported(g, s->group) || s->M % 16 == 0 ||
      g->kernel_h < 5)
    return false;
  int64_t per_image = kiln_conv_shift_workspace(g, (int)N, s->M, 1, false);
  return per_image * (int64_t)sizeof(float) <= 512 * 1024;
}

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
  int64_t wcount = (int64_t)s->M * (g->channels / s->group) * g->kernel_h * g->kernel_w;
  l->workspace_floats = kiln_conv_workspace(g, s->group, l->nthreads) + (int64_t)l->nthreads * wcount;
  s->shift = want_shift(s, l);
  if (s->shift) {
    kiln_dnnl_conv_destroy(s->dn);
    s->dn = NULL;
    l->workspace_floats = kiln_conv_shift_workspace(g, (int)x->shape[0], s->M, l->nthreads, true);
  } else if (want_dnnl(s, l)) {
    const int xl = x->layout, yl = l->top[0]->layout;
    /* A batch of no images has no work, and oneDNN divides by the batch: the primitives stay as
     * they are (forward and backward return at once). */
    if (x->shape[0] > 0 &&
        (!s->dn || s->dn_n != x->shape[0] || s->dn_h != g->height || s->dn_w != g->width ||
         s->dn_xl != xl || s->dn_yl != yl)) {
      kiln_dnnl_conv_destroy(s->dn);
      s->dn = NULL;
      const bool planned = x->shape[0] >= s->dn_planned_n;
      int rc = kiln_dnnl_conv_create(&s->dn, (int)x->shape[0], s->M, s->group, g, s->bias, true,
                                     xl, yl, l->config, planned ? 0 : s->dn_call_images);
      if (rc == KILN_OK) {
        if (planned) {
          s->dn_planned_n = x->shape[0];
          s->dn_call_images = (int)(x->shape[0] / kiln_dnnl_conv_chunks(s->dn));
        }
        s->dn_n = x->shape[0];
        s->dn_h = g->height;
        s->dn_w = g->width;
        s->dn_xl = xl;
        s->dn_yl = yl;
      } else if (xl != KILN_LAYOUT_PLAIN || yl != KILN_LAYOUT_PLAIN) {
        /* The net chose a blocked neighbour because this layer had oneDNN primitives. */
        return kiln_error_context(rc, "layer '%s' (Convolution): ", l->name);
      }
      /* Otherwise, where oneDNN has no kernel for a shape, the plain path runs it. */
    }
    if (s->dn) {
      /* A few input channels: oneDNN pads them to a block of 16 for the input gradient, many
       * times the plain route's work (LeNet's conv1; `kiln time` shows it), so that one gradient
       * takes the plain route. */
      s->plain_din = g->channels / s->group < 16;
      int64_t dn_ws = kiln_dnnl_conv_workspace(s->dn);
      int64_t col = kiln_conv_workspace(g, s->group, l->nthreads);
      l->workspace_floats = s->plain_din && col > dn_ws ? col : dn_ws;
    }
  }
  return kiln_blob_reshape(l->top[0], 4, shape);
}

static int conv_forward(kiln_layer *l) {
  conv_state *s = l->priv;
  if (l->bottom[0]->shape[0] == 0) return KILN_OK; /* a batch of no images */
  if (s->shift) {
    kiln_conv_shift_forward(l->top[0]->data, l->bottom[0]->data, l->param[0]->data,
                            s->bias ? l->param[1]->data : NULL, (int)l->bottom[0]->shape[0], s->M,
                            &s->g, l->workspace, l->nthreads);
    return KILN_OK;
  }
  if (s->dn)
    return kiln_dnnl_conv_forward(s->dn, l->top[0]->data, l->bottom[0]->data, l->param[0]->data,
                                  s->bias ? l->param[1]->data : NULL, l->workspace);
  kiln_conv2d_forward(l->top[0]->data, l->bottom[0]->data, l->param[0]->data,
                      s->bias ? l->param[1]->data : NULL, (int)l->bottom[0]->shape[0], s->M,
                      s->group, &s->g, l->workspace, l->nthreads);
  return KILN_OK;
}

static int conv_backward(kiln_layer *l) {
  conv_state *s = l->priv;
  if (l->bottom[0]->shape[0] == 0) return KILN_OK; /* nothing flows back, nothing accumulates */
  if (s->shift) {
    kiln_conv_shift_backward(l->propagate_down[0] ? l->bottom[0]->diff : NULL, l->param[0]->diff,
                             s->bias ? l->param[1]->diff : NULL, l->top[0]->diff,
                             l->bottom[0]->data, l->param[0]->data, (int)l->bottom[0]->shape[0],
                             s->M, &s->g, l->workspace, l->nthreads);
    return KILN_OK;
  }
  if (s->dn) {
    float *din = l->propagate_down[0] ? l->bottom[0]->diff : NULL;
    if (din && s->plain_din) {
      kiln_conv2d_backward(din, NULL, NULL, l->top[0]->diff, l->bottom[0]->data,
                           l->param[0]->data, (int)l->bottom[0]->shape[0], s->M, s->group, &s->g,
                           l->workspace, NULL, l->nthreads);
      din = NULL;
    }
    return kiln_dnnl_conv_backward(s->dn, din, l->param[0]->diff,
                                   s->bias ? l->param[1]->diff : NULL, l->top[0]->diff,
                                   l->bottom[0]->data, l->param[0]->data, l->workspace);
  }
  float *col = l->workspace;
  float *dw_ws = l->workspace + kiln_conv_workspace(&s->g, s->group, l->nthreads);
  kiln_conv2d_backward(l->propagate_down[0] ? l->bottom[0]->diff : NULL, l->param[0]->diff,
                       s->bias ? l->param[1]->diff : NULL, l->top[0]->diff, l->bottom[0]->data,
                       l->param[0]->data, (int)l->bottom[0]->shape[0], s->M, s->group, &s->g, col,
                       dw_ws, l->nthreads);
  return KILN_OK;
}

/* On oneDNN with group 1 the input and the output may each be blocked: the primitives read and
 * write that layout directly, with no reorder. The plain input-gradient route reads plain. */
static int conv_layout_role(const kiln_layer *l) {
  const conv_state *s = l->priv;
  if (!s || !s->dn || s->group != 1) return KILN_LAYOUT_ROLE_NONE;
  return KILN_LAYOUT_ROLE_TOP | (s->plain_din ? 0 : KILN_LAYOUT_ROLE_BOTTOM);
}

/* The block of the layout oneDNN's primitives read and write without a reorder. */
static int conv_block_channels(const kiln_layer *l) {
  const conv_state *s = l->priv;
  return s && s->dn ? kiln_dnnl_block_channels() : 0;
}

static void conv_destroy(kiln_layer *l) {
  conv_state *s = l->priv;
  if (s) kiln_dnnl_conv_destroy(s->dn);
  free(l->priv);
}

const kiln_layer_ops kiln_layer_convolution = {
    .type = "Convolution", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = conv_setup, .reshape = conv_reshape, .forward = conv_forward,
    .backward = conv_backward, .destroy = conv_destroy, .layout_role = conv_layout_role,
    .block_channels = conv_block_channels, .backward_reads = kiln_reads_bottom0,
};
