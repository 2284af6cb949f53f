/* Convolution routes and the conv family's kernels (include/kiln/backend.h, KILN_OPS_CONV).
 *
 * A route (kiln_conv_route) is what one Convolution layer runs for its current shape: which
 * kernels, and on oneDNN's route its primitives. The cpu backend chooses the route measured
 * fastest for the shape: shifted rows (conv_shift.c), oneDNN (conv_dnnl.c), or im2col + GEMM
 * (conv.c); the reference backend always takes im2col + GEMM; the cpu-bf16 backend oneDNN's bf16
 * primitives for every shape cpu would give oneDNN, and those the shifted rows take in fp32
 * (LeNet's conv2: 6.1 against 8.8 ms forward and backward), and cpu's fp32 routes for the rest
 * (a few input channels: LeNet's conv1 took 6.5 ms in bf16 against 1.5 on the shifted rows).
 * Pooling, im2col and col2im, and
 * the plane-wise bias of Deconvolution are kernels of this family too. */
#include <stdlib.h>

#include "kiln/ops.h"
#include "ops/kernels.h"

typedef enum { ROUTE_IM2COL, ROUTE_SHIFT, ROUTE_DNNL } route_kind;

struct kiln_conv_route {
  route_kind route;
  kiln_conv_spec spec; /* what the route was last updated for */
  kiln_dnnl_conv *dn;  /* oneDNN primitives for the current shape, or NULL */
  int64_t dn_n;        /* batch the primitives were made for */
  int dn_h, dn_w;
  int dn_xl, dn_yl;    /* the layouts of input and output they were made for */
  /* The largest batch primitives were made for (the planned one) and the images each of their
   * calls ran (kiln_dnnl_conv_chunks): primitives for a smaller batch run no more at once, so
   * they need no more workspace than the net planned. */
  int64_t dn_planned_n;
  int dn_call_images;
  bool plain_din;      /* with oneDNN: the input gradient still on the plain route */
  bool dn_bf16;        /* the primitives read bf16 */
  bool dn_bf16_failed; /* oneDNN had no bf16 kernel for the layer's shape */
  int nthreads;        /* the im2col route's workspace is per thread */
};

/* oneDNN unless the build lacks it, or the shape gains nothing there: a few input channels into
 * a count off oneDNN's 16-blocks (LeNet's conv1, 1 -> 20) runs no faster on oneDNN
 * (`kiln-conv-routes`), whose padded 32-channel copies cost megabytes of workspace. */
static bool want_dnnl(const kiln_conv_spec *s) {
  if (!kiln_dnnl_available()) return false;
  return !(s->g.channels / s->group < 16 && (s->M / s->group) % 16 != 0);
}

/* The shifted-row direct kernels where they were measured to beat every other route
 * (`kiln-conv-routes`, docs/PERF.md): stride 1 and group 1, an output channel count off oneDNN's
 * 16-blocks, and 5 or more kernel rows (the register blocks hold 4-6 kernel rows of the weight
 * and input gradients; with 3 they are a third empty). LeNet's conv2 (20 -> 50 5x5 on 12x12)
 * and conv1 (1 -> 20 on 28x28) are the shapes it wins on; docs/PERF.md quotes the figures.
 * Per-image shifted planes over 512 KiB would leave the caches: not taken. Only in a build with
 * AVX-512 (kiln_conv_shift_fast). */
static bool want_shift(const kiln_conv_spec *s) {
  /* It reads and writes Caffe's layout only (a blocked neighbour means oneDNN was chosen at
   * the first reshape; a later reshape keeps that route). */
  if (s->x_layout != KILN_LAYOUT_PLAIN || s->y_layout != KILN_LAYOUT_PLAIN) return false;
  const kiln_conv_geom *g = &s->g;
  if (!kiln_conv_shift_fast() || !kiln_conv_shift_supported(g, s->group) || s->M % 16 == 0 ||
      g->kernel_h < 5)
    return false;
  int64_t per_image = kiln_conv_shift_workspace(g, (int)s->N, s->M, 1, false);
  return per_image * (int64_t)sizeof(float) <= 512 * 1024;
}

/* In bf16, 3x3 stride-1 layers of 64 channels and more stay on fp32's Winograd: it does about a
 * quarter of the multiplications, which oneDNN's bf16 kernels (direct only) do not make up for
 * there. VGG-16 trained at 4.42 samples/s in bf16 against 5.68 in fp32 with every convolution in
 * bf16; resnet20's 64-channel backward ran at 0.88x fp32's, its 16- and 32-channel layers at
 * 1.15-1.39x (docs/PERF.md). */
static bool winograd_over_bf16(const kiln_conv_spec *s, const kiln_config *cfg) {
  const kiln_conv_geom *g = &s->g;
  return !cfg->conv_direct && g->kernel_h == 3 && g->kernel_w == 3 && g->stride_h == 1 &&
         g->stride_w == 1 && g->dilation_h == 1 && g->dilation_w == 1 && s->group == 1 &&
         g->channels % 16 == 0 && s->M % 16 == 0 && g->channels >= 64 && s->M >= 64;
}

static int64_t im2col_workspace(const kiln_conv_spec *s, int nthreads) {
  const kiln_conv_geom *g = &s->g;
  const int64_t wcount = (int64_t)s->M * (g->channels / s->group) * g->kernel_h * g->kernel_w;
  return kiln_conv_workspace(g, s->group, nthreads) + (int64_t)nthreads * wcount;
}

static void drop_dnnl(kiln_conv_route *p) {
  kiln_dnnl_conv_destroy(p->dn);
  p->dn = NULL;
}

/* The route and its state for spec; fills info. `fast`: the cpu backend's choice of routes,
 * else im2col alone (the reference); `bf16`: oneDNN's bf16 primitives first. */
static int update(const kiln_op_ctx *c, kiln_conv_route **cr, const kiln_conv_spec *spec,
                  kiln_conv_route_info *info, bool fast, bool bf16) {
  kiln_conv_route *p = *cr;
  if (!p) {
    if (!(p = calloc(1, sizeof *p))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    *cr = p;
  }
  p->spec = *spec;
  p->nthreads = c->nthreads;
  const kiln_conv_geom *g = &spec->g;
  p->route = ROUTE_IM2COL;
  info->workspace_floats = im2col_workspace(spec, c->nthreads);
  /* A shape with no bf16 kernel keeps cpu's fp32 routes (remembered, not tried each reshape). */
  if (bf16 && (p->dn_bf16_failed || winograd_over_bf16(spec, c->config))) bf16 = false;
  if (fast && want_shift(spec) && !(bf16 && want_dnnl(spec))) {
    drop_dnnl(p);
    p->route = ROUTE_SHIFT;
    info->workspace_floats =
        kiln_conv_shift_workspace(g, (int)spec->N, spec->M, c->nthreads, true);
  } else if (fast && want_dnnl(spec)) {
    const int xl = spec->x_layout, yl = spec->y_layout;
    /* A batch of no images has no work, and oneDNN divides by the batch: the primitives stay as
     * they are (forward and backward return at once). */
    if (spec->N > 0 && (!p->dn || p->dn_n != spec->N || p->dn_h != g->height ||
                        p->dn_w != g->width || p->dn_xl != xl || p->dn_yl != yl ||
                        p->dn_bf16 != bf16)) {
      drop_dnnl(p);
      const bool planned = spec->N >= p->dn_planned_n;
      int rc = kiln_dnnl_conv_create(&p->dn, (int)spec->N, spec->M, spec->group, g, spec->bias,
                                     true, xl, yl, c->config, planned ? 0 : p->dn_call_images,
                                     bf16);
      if (rc != KILN_OK && bf16) {
        /* no bf16 kernel for the shape: fp32's routes, chosen afresh */
        p->dn_bf16_failed = true;
        return update(c, cr, spec, info, fast, false);
      }
      if (rc == KILN_OK) {
        p->dn_bf16 = bf16;
        if (planned) {
          p->dn_planned_n = spec->N;
          p->dn_call_images = (int)(spec->N / kiln_dnnl_conv_chunks(p->dn));
        }
        p->dn_n = spec->N;
        p->dn_h = g->height;
        p->dn_w = g->width;
        p->dn_xl = xl;
        p->dn_yl = yl;
      } else if (xl != KILN_LAYOUT_PLAIN || yl != KILN_LAYOUT_PLAIN) {
        /* The net chose a blocked neighbour because this layer had oneDNN primitives. */
        return rc;
      }
      /* Otherwise, where oneDNN has no kernel for a shape, the plain path runs it. */
    }
    if (p->dn) {
      p->route = ROUTE_DNNL;
      /* A few input channels: oneDNN pads them to a block of 16 for the input gradient, many
       * times the plain route's work (LeNet's conv1; `kiln time` shows it), so that one
       * gradient takes the plain route. */
      p->plain_din = g->channels / spec->group < 16;
      const int64_t dn_ws = kiln_dnnl_conv_workspace(p->dn);
      const int64_t col = kiln_conv_workspace(g, spec->group, c->nthreads);
      info->workspace_floats = p->plain_din && col > dn_ws ? col : dn_ws;
    }
  } else {
    drop_dnnl(p);
  }
  /* On oneDNN with group 1 the input and the output may each be blocked: the primitives read
   * and write that layout directly, with no reorder. The plain input-gradient route reads
   * plain. */
  info->layout_role = p->route == ROUTE_DNNL && spec->group == 1
                          ? KILN_CONV_ROLE_TOP | (p->plain_din ? 0 : KILN_CONV_ROLE_BOTTOM)
                          : 0;
  info->block_channels = p->route == ROUTE_DNNL ? kiln_dnnl_block_channels() : 0;
  return KILN_OK;
}

int kiln_ref_conv_route_update(const kiln_op_ctx *c, kiln_conv_route **cr,
                               const kiln_conv_spec *spec, kiln_conv_route_info *info) {
  return update(c, cr, spec, info, false, false);
}

int kiln_cpu_conv_route_update(const kiln_op_ctx *c, kiln_conv_route **cr,
                               const kiln_conv_spec *spec, kiln_conv_route_info *info) {
  return update(c, cr, spec, info, true, false);
}

int kiln_bf16_conv_route_update(const kiln_op_ctx *c, kiln_conv_route **cr,
                                const kiln_conv_spec *spec, kiln_conv_route_info *info) {
  return update(c, cr, spec, info, true, true);
}

int kiln_ref_conv_route_free(const kiln_op_ctx *c, kiln_conv_route *cr) {
  (void)c;
  if (cr) drop_dnnl(cr);
  free(cr);
  return KILN_OK;
}

int kiln_ref_conv_fwd(const kiln_op_ctx *c, const kiln_conv_route *cr, float *y,
                      const float *x, const float *w, const float *b, float *ws) {
  const kiln_conv_spec *s = &cr->spec;
  if (s->N == 0) return KILN_OK; /* a batch of no images */
  switch (cr->route) {
    case ROUTE_SHIFT:
      kiln_conv_shift_forward(y, x, w, b, (int)s->N, s->M, &s->g, ws, c->nthreads);
      return KILN_OK;
    case ROUTE_DNNL:
      return kiln_dnnl_conv_forward(cr->dn, y, x, w, b, ws);
    default:
      kiln_conv2d_forward(y, x, w, b, (int)s->N, s->M, s->group, &s->g, ws, c->nthreads);
      return KILN_OK;
  }
}

int kiln_ref_conv_bwd(const kiln_op_ctx *c, const kiln_conv_route *cr, float *dx, float *dw,
                      float *db, const float *dy, const float *x, const float *w, float *ws) {
  const kiln_conv_spec *s = &cr->spec;
  if (s->N == 0) return KILN_OK; /* nothing flows back, nothing accumulates */
  switch (cr->route) {
    case ROUTE_SHIFT:
      kiln_conv_shift_backward(dx, dw, db, dy, x, w, (int)s->N, s->M, &s->g, ws, c->nthreads);
      return KILN_OK;
    case ROUTE_DNNL:
      if (dx && cr->plain_din) {
        kiln_conv2d_backward(dx, NULL, NULL, dy, x, w, (int)s->N, s->M, s->group, &s->g, ws,
                             NULL, c->nthreads);
        dx = NULL;
      }
      return kiln_dnnl_conv_backward(cr->dn, dx, dw, db, dy, x, w, ws);
    default:
      kiln_conv2d_backward(dx, dw, db, dy, x, w, (int)s->N, s->M, s->group, &s->g, ws,
                           ws + kiln_conv_workspace(&s->g, s->group, c->nthreads), c->nthreads);
      return KILN_OK;
  }
}

/* ---- the im2col route as kernels of their own (Deconvolution runs it backwards) -------------- */

int64_t kiln_im2col_conv_workspace(const kiln_conv_geom *g, int group, int M, int nthreads) {
  const int64_t wcount = (int64_t)M * (g->channels / group) * g->kernel_h * g->kernel_w;
  return kiln_conv_workspace(g, group, nthreads) + (int64_t)nthreads * wcount;
}

int kiln_ref_im2col_conv_fwd(const kiln_op_ctx *c, float *y, const float *x, const float *w,
                             const float *b, int N, int M, int group, const kiln_conv_geom *g,
                             float *ws) {
  kiln_conv2d_forward(y, x, w, b, N, M, group, g, ws, c->nthreads);
  return KILN_OK;
}

int kiln_ref_im2col_conv_bwd(const kiln_op_ctx *c, float *dx, float *dw, float *db,
                             const float *dy, const float *x, const float *w, int N, int M,
                             int group, const kiln_conv_geom *g, float *ws) {
  kiln_conv2d_backward(dx, dw, db, dy, x, w, N, M, group, g, ws,
                       dw ? ws + kiln_conv_workspace(g, group, c->nthreads) : NULL, c->nthreads);
  return KILN_OK;
}

int kiln_ref_plane_bias_add(const kiln_op_ctx *c, float *y, const float *b, int64_t N,
                            int64_t M, int64_t P) {
  (void)c;
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
      float *o = y + (n * M + m) * P;
      for (int64_t i = 0; i < P; i++) o[i] += b[m];
    }
  return KILN_OK;
}

/* Each channel's sum in double over the batch and the plane, then added in float. */
int kiln_ref_plane_bias_grad(const kiln_op_ctx *c, float *db, const float *dy, int64_t N,
                             int64_t M, int64_t P) {
  (void)c;
  for (int64_t m = 0; m < M; m++) {
    double t = 0;
    for (int64_t n = 0; n < N; n++) {
      const float *d = dy + (n * M + m) * P;
      for (int64_t i = 0; i < P; i++) t += d[i];
    }
    db[m] += (float)t;
  }
  return KILN_OK;
}

int kiln_ref_im2col(const kiln_op_ctx *c, float *col, const float *x, int64_t N,
                    const kiln_conv_geom *g) {
  const int64_t in = (int64_t)g->channels * g->height * g->width;
  const int64_t out = (int64_t)g->channels * g->kernel_h * g->kernel_w * g->out_h * g->out_w;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N > 1)
  for (int64_t n = 0; n < N; n++) kiln_im2col(col + n * out, x + n * in, g);
  return KILN_OK;
}

int kiln_ref_col2im(const kiln_op_ctx *c, float *x, const float *col, int64_t N,
                    const kiln_conv_geom *g) {
  const int64_t in = (int64_t)g->channels * g->height * g->width;
  const int64_t out = (int64_t)g->channels * g->kernel_h * g->kernel_w * g->out_h * g->out_w;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (N > 1)
  for (int64_t n = 0; n < N; n++) kiln_col2im(x + n * in, col + n * out, g);
  return KILN_OK;
}

/* ---- pooling --------------------------------------------------------------------------------- */

int kiln_ref_pool_fwd(const kiln_op_ctx *c, float *y, int32_t *mask, const float *x, int N,
                      const kiln_conv_geom *g, bool max, int layout) {
  (void)c;
  if (layout == KILN_LAYOUT_BLOCKED16) kiln_pool_blocked16_forward(y, max ? mask : NULL, x, N, g, max);
  else if (max) kiln_maxpool_forward(y, mask, x, N, g);
  else kiln_avepool_forward(y, x, N, g);
  return KILN_OK;
}

int kiln_ref_pool_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const int32_t *mask,
                      int N, const kiln_conv_geom *g, bool max, int layout) {
  (void)c;
  if (layout == KILN_LAYOUT_BLOCKED16)
    kiln_pool_blocked16_backward(dx, dy, max ? mask : NULL, N, g, max);
  else if (max) kiln_maxpool_backward(dx, dy, mask, N, g);
  else kiln_avepool_backward(dx, dy, N, g);
  return KILN_OK;
}
