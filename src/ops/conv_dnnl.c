/* 2-D convolution through oneDNN's JIT kernels (C API), behind the same contract as
 * kiln_conv2d_forward / kiln_conv2d_backward in conv.c, which stays the reference.
 *
 * kiln's blobs are plain NCHW. oneDNN picks its own (blocked) layouts for source, weights and
 * destination ("any"); each call reorders into them and back. Every buffer a call needs (the
 * blocked copies and oneDNN's scratchpad) is carved from the caller's workspace, which the net
 * shares across layers, so the JIT path adds no memory that lives from one layer to the next.
 *
 * Weight and bias gradients are ACCUMULATED (+=) as the op contract asks: oneDNN writes them
 * whole into workspace and a reorder with a sum post-op adds them to the parameter gradient.
 *
 * In bf16 (the cpu-bf16 backend) the primitives read their inputs in bfloat16 and write fp32:
 * the forward reads x and w in bf16 and writes y in fp32, backward data dy and w in bf16 into an
 * fp32 dx, backward weights x and dy in bf16 into fp32 dw and db. The reorders into oneDNN's
 * layouts are also the conversions (round to nearest even), so kiln's blobs stay fp32 and the
 * bf16 copies live in the workspace. Only JIT kernels are taken: a shape oneDNN serves with its
 * reference kernel is refused, and the route falls back to fp32. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/ops.h"
#include "dnnl_rt.h"

#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

/* The process's engine and stream (dnnl_rt.c), fetched by kiln_dnnl_conv_create. */
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

/* A reorder between a plain and a blocked layout; prim is NULL when the two are the same. */
typedef struct {
  dnnl_primitive_t prim;
  dnnl_memory_t from, to;
} reorder;

/* One primitive and the layouts it chose. */
typedef struct {
  dnnl_primitive_t prim;
  dnnl_memory_desc_t src, wei, dst, scratch;
  /* Memory objects for its arguments, made once; each call only sets their data handles, so a
   * training step allocates nothing. arg_* are the DNNL_ARG_* each one is passed as. */
  dnnl_memory_t m_src, m_wei, m_bia, m_dst, m_scratch;
  int arg_src, arg_wei, arg_bia, arg_dst;
} conv_prim;

struct kiln_dnnl_conv {
  bool bias;
  conv_prim fwd, bwd_data, bwd_weights;
  /* plain descriptors */
  dnnl_memory_desc_t x_md, w_md, b_md, y_md;
  /* forward */
  reorder x_in, w_in, y_out;
  /* backward data: dy in, w in (its own layout), dx out */
  reorder dy_in_d, w_in_d, dx_out;
  /* backward weights: x in, dy in, dw out (+=), db out (+=) */
  reorder x_in_w, dy_in_w, dw_out, db_out;
  bool share_dy; /* both backward primitives take dy in the same blocked layout: reorder once */
  /* The primitives are made for a batch of N / chunks images and run once per chunk (a
   * Winograd scratchpad that would be larger than the layer's output otherwise); x_chunk and
   * y_chunk are the floats of one chunk's input and output, in either layout (the batch is
   * the outermost axis of both). */
  int chunks;
  int64_t x_chunk, y_chunk;
  /* workspace offsets in floats */
  int64_t ws_floats;
  char impl[3][64];
};

#define DN(call)                                                      \
  do {                                                                \
    dnnl_status_t st_ = (call);                                       \
    if (st_ != dnnl_success) return kiln_errorf(KILN_ERR_UNSUPPORTED, \
                                                "oneDNN: %s failed (status %d)", #call, (int)st_); \
  } while (0)

static int64_t floats_of(const dnnl_memory_desc_t *md) {
  size_t b = dnnl_memory_desc_get_size(md);
  return (int64_t)((b + 63) / 64 * 16); /* rounded up to 64 bytes so carved buffers stay aligned */
}

/* Reorder from -> to, optionally adding into `to` (sum post-op); none when the layouts agree and
 * no sum is asked for. */
static int reorder_make(reorder *r, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                        bool accumulate) {
  memset(r, 0, sizeof *r);
  if (!accumulate && dnnl_memory_desc_equal(from, to)) return KILN_OK;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  if (accumulate) {
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_post_ops_create(&po));
    DN(dnnl_post_ops_append_sum(po, 1.0f));
    DN(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_post_ops_destroy(po);
  }
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, from, g_engine, to, g_engine, attr);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (st != dnnl_success)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: no reorder for this layout (status %d)",
                       (int)st);
  st = dnnl_primitive_create(&r->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  if (st != dnnl_success) return kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: reorder create");
  DN(dnnl_memory_create(&r->from, from, g_engine, DNNL_MEMORY_NONE));
  DN(dnnl_memory_create(&r->to, to, g_engine, DNNL_MEMORY_NONE));
  return KILN_OK;
}

static void reorder_free(reorder *r) {
  if (r->prim) dnnl_primitive_destroy(r->prim);
  if (r->from) dnnl_memory_destroy(r->from);
  if (r->to) dnnl_memory_destroy(r->to);
  memset(r, 0, sizeof *r);
}

static int reorder_run(reorder *r, const void *from, void *to) {
  if (!r->prim) return KILN_OK;
  DN(dnnl_memory_set_data_handle(r->from, (void *)from));
  DN(dnnl_memory_set_data_handle(r->to, to));
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, r->from}, {DNNL_ARG_TO, r->to}};
  DN(dnnl_primitive_execute(r->prim, g_stream, 2, args));
  return KILN_OK;
}

static const dnnl_memory_desc_t *q(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
  return dnnl_primitive_desc_query_md(pd, what, 0);
}

/* Create the primitive from its op descriptor; fills the chosen layouts. */
static int prim_make(conv_prim *p, const dnnl_convolution_desc_t *desc,
                     const_dnnl_primitive_desc_t hint, int kind, const dnnl_memory_desc_t *bias_md,
                     char *impl) {
  dnnl_primitive_attr_t attr;
  DN(dnnl_primitive_attr_create(&attr));
  DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t st = dnnl_primitive_desc_create(&pd, desc, attr, g_engine, hint);
  dnnl_primitive_attr_destroy(attr);
  if (st != dnnl_success)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: no convolution for this shape (status %d)",
                       (int)st);
  const char *name = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
    snprintf(impl, 64, "%s", name);
  if (kind == 0) {
    p->src = *q(pd, dnnl_query_src_md);
    p->wei = *q(pd, dnnl_query_weights_md);
    p->dst = *q(pd, dnnl_query_dst_md);
    p->arg_src = DNNL_ARG_SRC, p->arg_wei = DNNL_ARG_WEIGHTS;
    p->arg_bia = DNNL_ARG_BIAS, p->arg_dst = DNNL_ARG_DST;
  } else if (kind == 1) {
    p->src = *q(pd, dnnl_query_diff_src_md);
    p->wei = *q(pd, dnnl_query_weights_md);
    p->dst = *q(pd, dnnl_query_diff_dst_md);
    p->arg_src = DNNL_ARG_DIFF_SRC, p->arg_wei = DNNL_ARG_WEIGHTS;
    p->arg_bia = 0, p->arg_dst = DNNL_ARG_DIFF_DST;
  } else {
    p->src = *q(pd, dnnl_query_src_md);
    p->wei = *q(pd, dnnl_query_diff_weights_md);
    p->dst = *q(pd, dnnl_query_diff_dst_md);
    p->arg_src = DNNL_ARG_SRC, p->arg_wei = DNNL_ARG_DIFF_WEIGHTS;
    p->arg_bia = DNNL_ARG_DIFF_BIAS, p->arg_dst = DNNL_ARG_DIFF_DST;
  }
  if (!bias_md) p->arg_bia = 0;
  p->scratch = *q(pd, dnnl_query_scratchpad_md);
  st = dnnl_primitive_create(&p->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  if (st != dnnl_success) return kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: primitive create");
  DN(dnnl_memory_create(&p->m_src, &p->src, g_engine, DNNL_MEMORY_NONE));
  DN(dnnl_memory_create(&p->m_wei, &p->wei, g_engine, DNNL_MEMORY_NONE));
  DN(dnnl_memory_create(&p->m_dst, &p->dst, g_engine, DNNL_MEMORY_NONE));
  DN(dnnl_memory_create(&p->m_scratch, &p->scratch, g_engine, DNNL_MEMORY_NONE));
  if (p->arg_bia) DN(dnnl_memory_create(&p->m_bia, bias_md, g_engine, DNNL_MEMORY_NONE));
  return KILN_OK;
}

static void prim_free(conv_prim *p) {
  if (p->prim) dnnl_primitive_destroy(p->prim);
  dnnl_memory_t *ms[] = {&p->m_src, &p->m_wei, &p->m_bia, &p->m_dst, &p->m_scratch};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
    if (*ms[i]) dnnl_memory_destroy(*ms[i]);
}

void kiln_dnnl_conv_destroy(kiln_dnnl_conv *c) {
  if (!c) return;
  prim_free(&c->fwd);
  prim_free(&c->bwd_data);
  prim_free(&c->bwd_weights);
  reorder *rs[] = {&c->x_in, &c->w_in, &c->y_out, &c->dy_in_d, &c->w_in_d,
                   &c->dx_out, &c->x_in_w, &c->dy_in_w, &c->dw_out, &c->db_out};
  for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) reorder_free(rs[i]);
  free(c);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Workspace of one call: the blocked tensors it uses that differ from kiln's plain ones, and the
 * primitive's scratchpad. */
static int64_t fwd_ws(const kiln_dnnl_conv *c) {
  const conv_prim *p = &c->fwd;
  return (c->x_in.prim ? floats_of(&p->src) : 0) + (c->w_in.prim ? floats_of(&p->wei) : 0) +
         (c->y_out.prim ? floats_of(&p->dst) : 0) + floats_of(&p->scratch);
}
static int64_t bwd_ws(const kiln_dnnl_conv *c) {
  const conv_prim *d = &c->bwd_data, *w = &c->bwd_weights;
  int64_t data = (c->dy_in_d.prim ? floats_of(&d->dst) : 0) +
                 (c->w_in_d.prim ? floats_of(&d->wei) : 0) +
                 (c->dx_out.prim ? floats_of(&d->src) : 0) + floats_of(&d->scratch);
  int64_t weights = (c->x_in_w.prim ? floats_of(&w->src) : 0) +
                    (c->dy_in_w.prim ? floats_of(&w->dst) : 0) + floats_of(&w->wei) +
                    (c->bias ? floats_of(&c->b_md) : 0) + floats_of(&w->scratch);
  if (!c->share_dy) return max64(data, weights);
  const int64_t dy = floats_of(&d->dst);
  return dy + max64(data - dy, weights - dy);
}

static int conv_create(kiln_dnnl_conv **out, int N, int M, int group, const kiln_conv_geom *g,
                       bool bias, bool backward, int x_layout, int y_layout, dnnl_alg_kind_t alg,
                       kiln_dnnl_layout forced, bool bf16) {
  *out = NULL;
  dnnl_primitive_desc_t hint = NULL;
  if ((x_layout == KILN_LAYOUT_BLOCKED16 && (g->channels % 16 || group != 1)) ||
      (y_layout == KILN_LAYOUT_BLOCKED16 && (M % 16 || group != 1)))
    return kiln_errorf(KILN_ERR_INVALID, "oneDNN: blocked layout needs 16 | channels, group 1");
  dnnl_status_t rt = kiln_dnnl_runtime(&g_engine, &g_stream);
  if (rt != dnnl_success)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: no CPU engine (status %d)", (int)rt);
  kiln_dnnl_conv *c = calloc(1, sizeof *c);
  if (!c) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  c->bias = bias;
  int rc = KILN_OK;
#define TRY(x)                       \
  do {                               \
    if ((rc = (x)) != KILN_OK) goto fail; \
  } while (0)
#define TRYD(x)                                                                        \
  do {                                                                                 \
    dnnl_status_t st_ = (x);                                                           \
    if (st_ != dnnl_success) {                                                         \
      rc = kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: %s failed (status %d)", #x, (int)st_); \
      goto fail;                                                                       \
    }                                                                                  \
  } while (0)
  dnnl_dims_t xd = {N, g->channels, g->height, g->width};
  dnnl_dims_t yd = {N, M, g->out_h, g->out_w};
  dnnl_dims_t bd = {M};
  dnnl_dims_t wd;
  int wnd;
  dnnl_format_tag_t wtag;
  if (group == 1) {
    wnd = 4;
    wd[0] = M, wd[1] = g->channels, wd[2] = g->kernel_h, wd[3] = g->kernel_w;
    wtag = dnnl_oihw;
  } else {
    wnd = 5;
    wd[0] = group, wd[1] = M / group, wd[2] = g->channels / group, wd[3] = g->kernel_h;
    wd[4] = g->kernel_w;
    wtag = dnnl_goihw;
  }
  /* kiln's side of each activation: plain NCHW, or nChw16c where the net keeps it blocked. */
  TRYD(dnnl_memory_desc_init_by_tag(
      &c->x_md, 4, xd, dnnl_f32, x_layout == KILN_LAYOUT_BLOCKED16 ? dnnl_nChw16c : dnnl_nchw));
  TRYD(dnnl_memory_desc_init_by_tag(
      &c->y_md, 4, yd, dnnl_f32, y_layout == KILN_LAYOUT_BLOCKED16 ? dnnl_nChw16c : dnnl_nchw));
  TRYD(dnnl_memory_desc_init_by_tag(&c->w_md, wnd, wd, dnnl_f32, wtag));
  TRYD(dnnl_memory_desc_init_by_tag(&c->b_md, 1, bd, dnnl_f32, dnnl_x));
  dnnl_memory_desc_t xa, ya, wa;
  /* bf16: the primitives' inputs (xb, wb, yb for dy) in bfloat16; their outputs as xa, wa, ya */
  const dnnl_data_type_t in_t = bf16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t xb, yb, wb;
  /* Channel counts that fill oneDNN's 16-wide blocks get its blocked layouts, and so do first
   * layers with a few input channels (oneDNN reads those plain). Others (LeNet's 20 -> 50) waste
   * less in channels-last, where oneDNN has batch-reduce GEMM kernels than in padded blocks
   * (`kiln-conv-routes` times both; docs/PERF.md). */
  const int cg = g->channels / group, mg = M / group;
  const bool blocks = cg < 16 || (cg % 16 == 0 && mg % 16 == 0);
  /* kiln_config.dnnl_layout overrides the rule, for kiln-conv-routes to time each route. */
  dnnl_format_tag_t atag = forced == KILN_DNNL_LAYOUT_NHWC  ? dnnl_nhwc
                           : forced == KILN_DNNL_LAYOUT_ANY ? dnnl_format_tag_any
                           : blocks                         ? dnnl_format_tag_any
                                                            : dnnl_nhwc;
  /* A blocked side is given to oneDNN as it is, so no reorder is made for it. */
  const dnnl_format_tag_t xtag = x_layout == KILN_LAYOUT_BLOCKED16 ? dnnl_nChw16c : atag;
  const dnnl_format_tag_t ytag = y_layout == KILN_LAYOUT_BLOCKED16 ? dnnl_nChw16c : atag;
  TRYD(dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, xtag));
  TRYD(dnnl_memory_desc_init_by_tag(&ya, 4, yd, dnnl_f32, ytag));
  TRYD(dnnl_memory_desc_init_by_tag(&wa, wnd, wd, dnnl_f32, dnnl_format_tag_any));
  TRYD(dnnl_memory_desc_init_by_tag(&xb, 4, xd, in_t, xtag));
  TRYD(dnnl_memory_desc_init_by_tag(&yb, 4, yd, in_t, ytag));
  TRYD(dnnl_memory_desc_init_by_tag(&wb, wnd, wd, in_t, dnnl_format_tag_any));
  /* Caffe's output size rounds down; oneDNN wants the right padding that makes it exact. */
  const int ext_h = g->dilation_h * (g->kernel_h - 1) + 1;
  const int ext_w = g->dilation_w * (g->kernel_w - 1) + 1;
  dnnl_dims_t strides = {g->stride_h, g->stride_w};
  dnnl_dims_t dil = {g->dilation_h - 1, g->dilation_w - 1};
  dnnl_dims_t pl = {g->pad_h, g->pad_w};
  dnnl_dims_t pr = {(int64_t)(g->out_h - 1) * g->stride_h + ext_h - g->height - g->pad_h,
                    (int64_t)(g->out_w - 1) * g->stride_w + ext_w - g->width - g->pad_w};
  dnnl_convolution_desc_t fd;
  const int training = backward;
  TRYD(dnnl_dilated_convolution_forward_desc_init(
      &fd, training ? dnnl_forward_training : dnnl_forward_inference, alg, &xb,
      &wb, bias ? &c->b_md : NULL, &ya, strides, dil, pl, pr));
  /* The forward descriptor is created again as the hint for the backward ones. */
  TRYD(dnnl_primitive_desc_create(&hint, &fd, NULL, g_engine, NULL));
  TRY(prim_make(&c->fwd, &fd, NULL, 0, bias ? &c->b_md : NULL, c->impl[0]));
  TRY(reorder_make(&c->x_in, &c->x_md, &c->fwd.src, false));
  TRY(reorder_make(&c->w_in, &c->w_md, &c->fwd.wei, false));
  TRY(reorder_make(&c->y_out, &c->fwd.dst, &c->y_md, false));
  if (backward) {
    dnnl_convolution_desc_t dd, wdsc;
    TRYD(dnnl_dilated_convolution_backward_data_desc_init(&dd, alg, &xa, &wb,
                                                          &yb, strides, dil, pl, pr));
    TRY(prim_make(&c->bwd_data, &dd, hint, 1, NULL, c->impl[1]));
    TRYD(dnnl_dilated_convolution_backward_weights_desc_init(
        &wdsc, alg, &xb, &wa, bias ? &c->b_md : NULL, &yb, strides, dil, pl, pr));
    TRY(prim_make(&c->bwd_weights, &wdsc, hint, 2, bias ? &c->b_md : NULL, c->impl[2]));
    TRY(reorder_make(&c->dy_in_d, &c->y_md, &c->bwd_data.dst, false));
    TRY(reorder_make(&c->w_in_d, &c->w_md, &c->bwd_data.wei, false));
    TRY(reorder_make(&c->dx_out, &c->bwd_data.src, &c->x_md, false));
    TRY(reorder_make(&c->x_in_w, &c->x_md, &c->bwd_weights.src, false));
    TRY(reorder_make(&c->dy_in_w, &c->y_md, &c->bwd_weights.dst, false));
    TRY(reorder_make(&c->dw_out, &c->bwd_weights.wei, &c->w_md, true));
    if (bias) TRY(reorder_make(&c->db_out, &c->b_md, &c->b_md, true));
    c->share_dy = c->dy_in_d.prim && c->dy_in_w.prim &&
                  dnnl_memory_desc_equal(&c->bwd_data.dst, &c->bwd_weights.dst);
  }
  if (hint) dnnl_primitive_desc_destroy(hint);
  hint = NULL;
  /* oneDNN's reference kernels would be an emulation, many times slower than fp32's JIT ones */
  for (int i = 0; bf16 && i < (backward ? 3 : 1); i++)
    if (!strncmp(c->impl[i], "ref", 3)) {
      rc = kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: no bf16 kernel for this shape (%s)",
                       c->impl[i]);
      goto fail;
    }
  c->ws_floats = backward ? max64(fwd_ws(c), bwd_ws(c)) : fwd_ws(c);
  *out = c;
  return KILN_OK;
fail:
  if (hint) dnnl_primitive_desc_destroy(hint);
  kiln_dnnl_conv_destroy(c);
  return rc;
#undef TRY
#undef TRYD
}

static int64_t largest_scratch(const kiln_dnnl_conv *c) {
  return max64(floats_of(&c->fwd.scratch),
               max64(floats_of(&c->bwd_data.scratch), floats_of(&c->bwd_weights.scratch)));
}

/* 3x3 kernels at stride 1 go through Winograd's F(4x4, 3x3) where oneDNN has it for the shape
 * (its kernels need 16 | channels): four times fewer multiplications, at the price of fp32
 * rounding that differs from the direct sum (tested against the same double-precision reference
 * and tolerance). Not 16 channels into 16: there each transformed tile feeds a 16 x 16 product,
 * the transforms' memory traffic outweighs the multiplications saved, and the direct kernel
 * wins (`kiln-conv-routes`, docs/PERF.md: resnet20's first stage). kiln_config.conv_direct
 * (KILN_CONV_ALGO=direct) turns it off. Everything else, and any shape Winograd refuses, is
 * direct.
 *
 * Some of oneDNN's Winograd schedules transform the whole batch at once, into a scratchpad
 * several times the layer's output (VGG-16's conv2_2 at batch 16: 471 MB against its 103 MB
 * output), and the net's shared workspace is as large as its largest. Such a convolution runs
 * in chunks of the batch: halved while its scratchpad is larger than its output and halving
 * takes at least 40% off it. Past that the scratchpad's fixed part (transformed weights,
 * per-thread sums) dominates, and smaller chunks would only cost time (VGG-16's conv5 layers
 * ran 5 times slower one image at a time for 22% less scratchpad). The chunks' weight
 * gradients add up as the contract's += does. */
int kiln_dnnl_conv_create(kiln_dnnl_conv **out, int N, int M, int group, const kiln_conv_geom *g,
                          bool bias, bool backward, int x_layout, int y_layout,
                          const kiln_config *cfg, int max_images, bool bf16) {
  if (!cfg) cfg = kiln_config_defaults();
  /* oneDNN's Winograd is fp32 alone */
  const bool wino = !bf16 && !cfg->conv_direct && g->kernel_h == 3 && g->kernel_w == 3 &&
                    g->stride_h == 1 && g->stride_w == 1 && g->dilation_h == 1 &&
                    g->dilation_w == 1 && group == 1 && g->channels % 16 == 0 && M % 16 == 0 &&
                    g->channels + M > 32;
  const int64_t x_image = (int64_t)g->channels * g->height * g->width;
  const int64_t y_image = (int64_t)M * g->out_h * g->out_w;
  kiln_dnnl_conv *c = NULL;
  int k = 1;
  /* A cap (another batch than the planned one): the fewest chunks of at most max_images each
   * that divide N (one image each for a prime N past the cap). */
  if (max_images > 0)
    while (N / k > max_images || N % k) k++;
  if (wino && conv_create(&c, N / k, M, group, g, bias, backward, x_layout, y_layout,
                          dnnl_convolution_winograd, cfg->dnnl_layout, false) == KILN_OK) {
    while (max_images <= 0 && largest_scratch(c) > (int64_t)N * y_image && N % (2 * k) == 0) {
      kiln_dnnl_conv *half;
      if (conv_create(&half, N / (2 * k), M, group, g, bias, backward, x_layout, y_layout,
                      dnnl_convolution_winograd, cfg->dnnl_layout, false) != KILN_OK)
        break;
      if (largest_scratch(half) * 5 > largest_scratch(c) * 3) {
        kiln_dnnl_conv_destroy(half);
        break;
      }
      kiln_dnnl_conv_destroy(c);
      c = half;
      k *= 2;
    }
    c->chunks = k;
    c->x_chunk = (int64_t)(N / k) * x_image;
    c->y_chunk = (int64_t)(N / k) * y_image;
    *out = c;
    return KILN_OK;
  }
  KILN_TRY(conv_create(out, N, M, group, g, bias, backward, x_layout, y_layout,
                       dnnl_convolution_direct, cfg->dnnl_layout, bf16));
  (*out)->chunks = 1;
  (*out)->x_chunk = (int64_t)N * x_image;
  (*out)->y_chunk = (int64_t)N * y_image;
  return KILN_OK;
}

int64_t kiln_dnnl_conv_workspace(const kiln_dnnl_conv *c) { return c->ws_floats; }
int kiln_dnnl_conv_chunks(const kiln_dnnl_conv *c) { return c->chunks; }

const char *kiln_dnnl_conv_impl(const kiln_dnnl_conv *c, int which) {
  return which >= 0 && which < 3 ? c->impl[which] : "";
}

/* Bump allocator over the workspace. */
static float *carve(float **at, const dnnl_memory_desc_t *md) {
  float *p = *at;
  *at += floats_of(md);
  return p;
}

/* Runs the primitive on these buffers (bia NULL: no bias argument). */
static int run_prim(conv_prim *p, const void *src, const void *wei, const void *bia,
                    const void *dst, void *scratch) {
  dnnl_exec_arg_t args[5];
  int n = 0;
  const struct {
    int arg;
    dnnl_memory_t m;
    const void *h;
  } in[] = {{p->arg_src, p->m_src, src},
            {p->arg_wei, p->m_wei, wei},
            {p->arg_bia, p->m_bia, bia},
            {p->arg_dst, p->m_dst, dst},
            {DNNL_ARG_SCRATCHPAD, p->m_scratch, scratch}};
  for (int i = 0; i < 5; i++) {
    if (!in[i].arg || !in[i].m || !in[i].h) continue;
    DN(dnnl_memory_set_data_handle(in[i].m, (void *)in[i].h));
    args[n++] = (dnnl_exec_arg_t){in[i].arg, in[i].m};
  }
  dnnl_status_t st = dnnl_primitive_execute(p->prim, g_stream, n, args);
  if (st != dnnl_success)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "oneDNN: convolution failed (status %d)", (int)st);
  return KILN_OK;
}

static int forward_chunk(kiln_dnnl_conv *c, float *out, const float *in, const float *w,
                         const float *bias, float *ws) {
  conv_prim *p = &c->fwd;
  float *at = ws;
  const float *x = c->x_in.prim ? carve(&at, &p->src) : in;
  const float *wb = c->w_in.prim ? carve(&at, &p->wei) : w;
  float *y = c->y_out.prim ? carve(&at, &p->dst) : out;
  KILN_TRY(reorder_run(&c->x_in, in, (void *)x));
  KILN_TRY(reorder_run(&c->w_in, w, (void *)wb));
  KILN_TRY(run_prim(p, x, wb, c->bias ? bias : NULL, y, at));
  return reorder_run(&c->y_out, y, out);
}

int kiln_dnnl_conv_forward(kiln_dnnl_conv *c, float *out, const float *in, const float *w,
                           const float *bias, float *ws) {
  for (int k = 0; k < c->chunks; k++)
    KILN_TRY(forward_chunk(c, out + k * c->y_chunk, in + k * c->x_chunk, w, bias, ws));
  DN(dnnl_stream_wait(g_stream));
  return KILN_OK;
}

static int backward_chunk(kiln_dnnl_conv *c, float *din, float *dw, float *dbias,
                          const float *dout, const float *in, const float *w, float *ws) {
  /* dy in the blocked layout both primitives read, made once when both run. */
  float *base = ws, *dy_both = NULL;
  if (c->share_dy && din && (dw || dbias)) {
    dy_both = carve(&base, &c->bwd_data.dst);
    KILN_TRY(reorder_run(&c->dy_in_d, dout, dy_both));
  }
  if (din) {
    conv_prim *p = &c->bwd_data;
    float *at = base;
    const float *dy = dy_both ? dy_both : c->dy_in_d.prim ? carve(&at, &p->dst) : dout;
    const float *wb = c->w_in_d.prim ? carve(&at, &p->wei) : w;
    float *dx = c->dx_out.prim ? carve(&at, &p->src) : din;
    if (!dy_both) KILN_TRY(reorder_run(&c->dy_in_d, dout, (void *)dy));
    KILN_TRY(reorder_run(&c->w_in_d, w, (void *)wb));
    KILN_TRY(run_prim(p, dx, wb, NULL, dy, at));
    KILN_TRY(reorder_run(&c->dx_out, dx, din));
  }
  if (dw || dbias) {
    conv_prim *p = &c->bwd_weights;
    float *at = base;
    const float *x = c->x_in_w.prim ? carve(&at, &p->src) : in;
    const float *dy = dy_both ? dy_both : c->dy_in_w.prim ? carve(&at, &p->dst) : dout;
    float *dwb = carve(&at, &p->wei);
    float *dbb = c->bias ? carve(&at, &c->b_md) : NULL;
    KILN_TRY(reorder_run(&c->x_in_w, in, (void *)x));
    if (!dy_both) KILN_TRY(reorder_run(&c->dy_in_w, dout, (void *)dy));
    KILN_TRY(run_prim(p, x, dwb, dbb, dy, at));
    if (dw) KILN_TRY(reorder_run(&c->dw_out, dwb, dw));
    if (dbias && c->bias) KILN_TRY(reorder_run(&c->db_out, dbb, dbias));
  }
  return KILN_OK;
}

int kiln_dnnl_conv_backward(kiln_dnnl_conv *c, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, float *ws) {
  for (int k = 0; k < c->chunks; k++)
    KILN_TRY(backward_chunk(c, din ? din + k * c->x_chunk : NULL, dw, dbias,
                            dout + k * c->y_chunk, in + k * c->x_chunk, w, ws));
  DN(dnnl_stream_wait(g_stream));
  return KILN_OK;
}

bool kiln_dnnl_available(void) { return true; }
int kiln_dnnl_block_channels(void) { return 16; }

#else /* no oneDNN in this build: the plain path is the only one */

bool kiln_dnnl_available(void) { return false; }
int kiln_dnnl_block_channels(void) { return 0; }
int kiln_dnnl_conv_create(kiln_dnnl_conv **out, int N, int M, int group, const kiln_conv_geom *g,
                          bool bias, bool backward, int x_layout, int y_layout,
                          const kiln_config *cfg, int max_images, bool bf16) {
  (void)N, (void)M, (void)group, (void)g, (void)bias, (void)backward, (void)x_layout,
      (void)y_layout, (void)cfg, (void)max_images, (void)bf16;
  *out = NULL;
  return kiln_errorf(KILN_ERR_UNSUPPORTED, "this build has no oneDNN");
}
int64_t kiln_dnnl_conv_workspace(const kiln_dnnl_conv *c) { (void)c; return 0; }
int kiln_dnnl_conv_chunks(const kiln_dnnl_conv *c) { (void)c; return 1; }
const char *kiln_dnnl_conv_impl(const kiln_dnnl_conv *c, int which) { (void)c, (void)which; return ""; }
int kiln_dnnl_conv_forward(kiln_dnnl_conv *c, float *out, const float *in, const float *w,
                           const float *bias, float *ws) {
  (void)c, (void)out, (void)in, (void)w, (void)bias, (void)ws;
  return kiln_errorf(KILN_ERR_UNSUPPORTED, "this build has no oneDNN");
}
int kiln_dnnl_conv_backward(kiln_dnnl_conv *c, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, float *ws) {
  (void)c, (void)din, (void)dw, (void)dbias, (void)dout, (void)in, (void)w, (void)ws;
  return kiln_errorf(KILN_ERR_UNSUPPORTED, "this build has no oneDNN");
}
void kiln_dnnl_conv_destroy(kiln_dnnl_conv *c) { (void)c; }
#endif
