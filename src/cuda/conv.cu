/* The conv family on the CUDA backend (KILN_OPS_CONV).
 *
 * A GPU build with cuDNN (KILN_HAVE_CUDNN) runs the convolution route through cuDNN's legacy
 * convolution API where it takes the shape, unless KILN_CUDNN=0 (kiln_config.no_cudnn); the
 * emulation, and every shape cuDNN refuses, take the im2col route below.
 *
 * The im2col route is Caffe's GPU path without cuDNN: for each image and group, the group's input
 * channels are unrolled into a column buffer (im2col) in the caller's workspace, one GEMM makes
 * the group's output planes, and a kernel adds the bias. Backward, a GEMM over the same columns
 * adds each image's weight gradient, and a GEMM into the columns followed by col2im makes the
 * input gradient. col2im and the pooling gradients are gathers (each input element sums, in a
 * fixed order, what maps to it), so that no two threads write one value: deterministic, with no
 * atomics, and in the reference's order of additions. */
#include <stdlib.h>

#include "cuda/kcuda.h"

/* cuDNN only on the GPU, and only where CMake found it; the emulation has the im2col route. */
#if !defined(KCUDA_EMU) && defined(KILN_HAVE_CUDNN)
#define KCUDA_CUDNN 1
#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>

/* cuDNN's state for one shape: the descriptors of x, y, w, the bias (1 x M x 1 x 1) and the
 * convolution, and the algorithm of each direction. One convolution descriptor a direction,
 * because each algorithm was chosen with its own math type (cudnnSetConvolutionMathType) and runs
 * with it. */
enum { DNN_FWD, DNN_BWD_DATA, DNN_BWD_FILTER, DNN_DIRS };
typedef struct {
  cudnnHandle_t handle; /* the device's (dnn_handle), bound to its stream */
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv[DNN_DIRS];
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t ws_bytes; /* the largest of the three algorithms' workspaces */
  /* What the descriptors and algorithms were last made for, and whether cuDNN took it: a spec
   * asked again (every reshape) costs no second search, nor a second refusal. */
  bool tried, ok, tf32;
  kiln_conv_spec spec;
} kcuda_dnn;
#endif

/* The route's state: the spec it was last updated for (the im2col route needs nothing else), and
 * with cuDNN whether that spec runs there, and cuDNN's state. */
typedef struct {
  kiln_conv_spec spec;
#ifdef KCUDA_CUDNN
  bool on_dnn;
  kcuda_dnn dn;
#endif
} kcuda_conv_route;

/* A 1x1 kernel with stride 1 and no padding makes the columns the input planes themselves. */
static bool is_pointwise(const kiln_conv_geom *g) {
  return g->kernel_h == 1 && g->kernel_w == 1 && g->stride_h == 1 && g->stride_w == 1 &&
         g->pad_h == 0 && g->pad_w == 0;
}

/* Floats of one group's column buffer for one image (none where the input is its own). */
static int64_t column_floats(const kiln_conv_geom *g, int group) {
  if (is_pointwise(g)) return 0;
  const int64_t K = (int64_t)(g->channels / group) * g->kernel_h * g->kernel_w;
  return K * g->out_h * g->out_w;
}

/* ---- im2col and col2im ------------------------------------------------------------------------ */

/* col (n x C kh kw x OH OW) from x (n x C x H x W), one thread a column entry; padding reads 0. */
KCUDA_GLOBAL void k_im2col(float *col, const float *x, kiln_conv_geom g, int64_t n) {
  const int64_t P = (int64_t)g.out_h * g.out_w, taps = (int64_t)g.kernel_h * g.kernel_w;
  const int64_t rows = g.channels * taps, HW = (int64_t)g.height * g.width;
  KCUDA_FOR(i, n * rows * P) {
    const int64_t q = i % P, r = i / P % rows, img = i / (P * rows);
    const int64_t ch = r / taps, kh = r % taps / g.kernel_w, kw = r % g.kernel_w;
    const int64_t ih = q / g.out_w * g.stride_h - g.pad_h + kh * g.dilation_h;
    const int64_t iw = q % g.out_w * g.stride_w - g.pad_w + kw * g.dilation_w;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    col[i] = inside ? x[(img * g.channels + ch) * HW + ih * g.width + iw] : 0.0f;
  }
}

/* x (n x C x H x W) = the sum of the column entries that read each element, one thread an
 * element, the kernel taps in row order: the reference's scatter order, bit for bit. */
KCUDA_GLOBAL void k_col2im(float *x, const float *col, kiln_conv_geom g, int64_t n) {
  const int64_t P = (int64_t)g.out_h * g.out_w, HW = (int64_t)g.height * g.width;
  const int64_t rows = (int64_t)g.channels * g.kernel_h * g.kernel_w;
  KCUDA_FOR(i, n * g.channels * HW) {
    const int64_t w = i % g.width, h = i / g.width % g.height;
    const int64_t ch = i / HW % g.channels, img = i / (HW * g.channels);
    const float *c0 = col + (img * rows + ch * g.kernel_h * g.kernel_w) * P;
    float s = 0.0f;
    for (int kh = 0; kh < g.kernel_h; kh++) {
      const int64_t t = h + g.pad_h - (int64_t)kh * g.dilation_h;
      if (t < 0) break; /* the later taps lie further up */
      if (t % g.stride_h) continue;
      const int64_t oh = t / g.stride_h;
      if (oh >= g.out_h) continue;
      for (int kw = 0; kw < g.kernel_w; kw++) {
        const int64_t u = w + g.pad_w - (int64_t)kw * g.dilation_w;
        if (u < 0) break;
        if (u % g.stride_w) continue;
        const int64_t ow = u / g.stride_w;
        if (ow >= g.out_w) continue;
        s += c0[((int64_t)kh * g.kernel_w + kw) * P + oh * g.out_w + ow];
      }
    }
    x[i] = s;
  }
}

KCUDA_OP(im2col)(const kiln_op_ctx *c, float *col, const float *x, int64_t N,
                 const kiln_conv_geom *g) {
  const int64_t rows = (int64_t)g->channels * g->kernel_h * g->kernel_w;
  KCUDA_LAUNCH(c, N * rows * g->out_h * g->out_w, k_im2col, col, x, *g, N);
  return kcuda_launched(c, "im2col");
}

KCUDA_OP(col2im)(const kiln_op_ctx *c, float *x, const float *col, int64_t N,
                 const kiln_conv_geom *g) {
  KCUDA_LAUNCH(c, N * g->channels * g->height * g->width, k_col2im, x, col, *g, N);
  return kcuda_launched(c, "col2im");
}

/* ---- the plane-wise bias ---------------------------------------------------------------------- */

KCUDA_GLOBAL void k_plane_bias_add(float *y, const float *b, int64_t N, int64_t M, int64_t P) {
  KCUDA_FOR(i, N * M * P) y[i] += b[i / P % M];
}

/* part[m][t]: the sum in double of channel m's t-th chunk of KCUDA_CHUNK values, its N planes of
 * P one after the other. */
KCUDA_GLOBAL void k_plane_chunk_sums(double *part, const float *dy, int64_t N, int64_t M,
                                     int64_t P, int64_t parts) {
  const int64_t len = N * P;
  KCUDA_FOR(i, M * parts) {
    const int64_t m = i / parts, j0 = i % parts * KCUDA_CHUNK;
    const int64_t j1 = j0 + KCUDA_CHUNK < len ? j0 + KCUDA_CHUNK : len;
    double s = 0;
    if (j0 < j1) {
      int64_t n = j0 / P, k = j0 % P;
      for (int64_t j = j0; j < j1; j++) {
        s += dy[(n * M + m) * P + k];
        if (++k == P) k = 0, n++;
      }
    }
    part[i] = s;
  }
}

/* db[m] += channel m's chunk sums, in order, rounded to float once. */
KCUDA_GLOBAL void k_plane_sum_parts(float *db, const double *part, int64_t M, int64_t parts) {
  KCUDA_FOR(m, M) {
    double t = 0;
    for (int64_t p = 0; p < parts; p++) t += part[m * parts + p];
    db[m] += (float)t;
  }
}

/* db[m] += the sum in double of dy[n][m][i] over n and i: two passes, so that a few channels of
 * large planes still spread over the device; the op's one scratch buffer. */
static int plane_sums_into(const kiln_op_ctx *c, float *db, const float *dy, int64_t N,
                           int64_t M, int64_t P) {
  if (M <= 0) return KILN_OK;
  const int64_t len = N > 0 && P > 0 ? N * P : 0;
  const int64_t parts = len > 0 ? (len + KCUDA_CHUNK - 1) / KCUDA_CHUNK : 1;
  void *sv;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(M * parts), &sv));
  double *part = (double *)sv;
  KCUDA_LAUNCH(c, M * parts, k_plane_chunk_sums, part, dy, N, M, P, parts);
  KCUDA_LAUNCH(c, M, k_plane_sum_parts, db, part, M, parts);
  return KILN_OK;
}

KCUDA_OP(plane_bias_add)(const kiln_op_ctx *c, float *y, const float *b, int64_t N, int64_t M,
                         int64_t P) {
  KCUDA_LAUNCH(c, N * M * P, k_plane_bias_add, y, b, N, M, P);
  return kcuda_launched(c, "plane_bias_add");
}

KCUDA_OP(plane_bias_grad)(const kiln_op_ctx *c, float *db, const float *dy, int64_t N, int64_t M,
                          int64_t P) {
  KILN_TRY(plane_sums_into(c, db, dy, N, M, P));
  return kcuda_launched(c, "plane_bias_grad");
}

/* ---- the im2col convolution ------------------------------------------------------------------- */

/* y (N x M x OH x OW) = conv(x, w) + b (b may be NULL); ws: column_floats(g, group). One GEMM an
 * image and group; the columns are the input itself for a pointwise kernel. */
static int conv_forward(const kiln_op_ctx *c, float *y, const float *x, const float *w,
                        const float *b, int64_t N, int M, int group, const kiln_conv_geom *g,
                        float *ws) {
  const int Cg = g->channels / group, Mg = M / group;
  const int64_t HW = (int64_t)g->height * g->width, P = (int64_t)g->out_h * g->out_w;
  const int64_t K = (int64_t)Cg * g->kernel_h * g->kernel_w;
  const bool pointwise = is_pointwise(g);
  kiln_conv_geom gg = *g; /* one group's input channels */
  gg.channels = Cg;
  for (int64_t n = 0; n < N; n++)
    for (int grp = 0; grp < group; grp++) {
      const float *in_g = x + (n * g->channels + (int64_t)grp * Cg) * HW;
      const float *cols = in_g;
      if (!pointwise) {
        KCUDA_LAUNCH(c, K * P, k_im2col, ws, in_g, gg, (int64_t)1);
        cols = ws;
      }
      float *out_g = y + (n * M + (int64_t)grp * Mg) * P;
      KILN_TRY(KCUDA_FN(gemm)(c, out_g, P, w + (int64_t)grp * Mg * K, K, cols, P, false, false,
                              Mg, P, K, 1.0f, 0.0f));
    }
  if (b) KCUDA_LAUNCH(c, N * M * P, k_plane_bias_add, y, b, N, (int64_t)M, P);
  return KILN_OK;
}

/* The gradients of conv_forward: dx = (NULL: skipped), dw += (NULL: skipped), db += (NULL:
 * skipped). Each image's weight gradient is added by its GEMM (beta 1), image after image; the
 * input gradient's columns overwrite the im2col columns once the weight GEMM has read them. */
static int conv_backward(const kiln_op_ctx *c, float *dx, float *dw, float *db, const float *dy,
                         const float *x, const float *w, int64_t N, int M, int group,
                         const kiln_conv_geom *g, float *ws) {
  const int Cg = g->channels / group, Mg = M / group;
  const int64_t HW = (int64_t)g->height * g->width, P = (int64_t)g->out_h * g->out_w;
  const int64_t K = (int64_t)Cg * g->kernel_h * g->kernel_w;
  const bool pointwise = is_pointwise(g);
  kiln_conv_geom gg = *g;
  gg.channels = Cg;
  if (db) KILN_TRY(plane_sums_into(c, db, dy, N, M, P));
  if (!dw && !dx) return KILN_OK;
  for (int64_t n = 0; n < N; n++)
    for (int grp = 0; grp < group; grp++) {
      const float *dy_g = dy + (n * M + (int64_t)grp * Mg) * P;
      const int64_t in_off = (n * g->channels + (int64_t)grp * Cg) * HW;
      const float *w_g = w + (int64_t)grp * Mg * K;
      if (dw) {
        const float *cols = x + in_off;
        if (!pointwise) {
          KCUDA_LAUNCH(c, K * P, k_im2col, ws, x + in_off, gg, (int64_t)1);
          cols = ws;
        }
        /* dw_g (Mg x K) += dy_g (Mg x P) cols^T (P x K) */
        KILN_TRY(KCUDA_FN(gemm)(c, dw + (int64_t)grp * Mg * K, K, dy_g, P, cols, P, false, true,
                                Mg, K, P, 1.0f, 1.0f));
      }
      if (dx) {
        /* dcols (K x P) = w_g^T (K x Mg) dy_g (Mg x P), then gathered back into the image */
        float *dst = pointwise ? dx + in_off : ws;
        KILN_TRY(KCUDA_FN(gemm)(c, dst, P, w_g, K, dy_g, P, true, false, K, P, Mg, 1.0f, 0.0f));
        if (!pointwise) KCUDA_LAUNCH(c, (int64_t)Cg * HW, k_col2im, dx + in_off, ws, gg, (int64_t)1);
      }
    }
  return KILN_OK;
}

KCUDA_OP(im2col_conv_fwd)(const kiln_op_ctx *c, float *y, const float *x, const float *w,
                          const float *b, int N, int M, int group, const kiln_conv_geom *g,
                          float *ws) {
  KILN_TRY(conv_forward(c, y, x, w, b, N, M, group, g, ws));
  return kcuda_launched(c, "im2col_conv_fwd");
}

KCUDA_OP(im2col_conv_bwd)(const kiln_op_ctx *c, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, int N, int M, int group,
                          const kiln_conv_geom *g, float *ws) {
  KILN_TRY(conv_backward(c, dx, dw, db, dy, x, w, N, M, group, g, ws));
  return kcuda_launched(c, "im2col_conv_bwd");
}

#ifdef KCUDA_CUDNN
/* ---- the cuDNN route -------------------------------------------------------------------------- */

/* The most workspace one algorithm may take: the net shares one workspace among its layers, and
 * the heuristics sometimes put first an FFT whose buffers are many times the tensors'; past it
 * the next algorithm of the list is taken. */
#define DNN_WS_MAX ((size_t)1 << 30)

/* Every list the heuristics give fits (each has at most its direction's algorithm count). */
enum {
  DNN_MAX_CANDS = CUDNN_CONVOLUTION_FWD_ALGO_COUNT + CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT +
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT
};

static const float dnn_one = 1.0f, dnn_zero = 0.0f; /* alpha and beta: host floats for fp32 */

#define DNN_CHECK(call)                                                                        \
  do {                                                                                         \
    const cudnnStatus_t dnn_st_ = (call);                                                      \
    if (dnn_st_ != CUDNN_STATUS_SUCCESS) return dnn_st_;                                       \
  } while (0)

static int dnn_error(cudnnStatus_t st) {
  return kiln_errorf(KILN_ERR_IO, "cuda convolution (cuDNN): %s", cudnnGetErrorString(st));
}

/* A status that says cuDNN cannot take the shape (a parameter it refuses, a case it lacks), not
 * that something failed: the im2col route runs such a shape. cuDNN 9's codes are a category (the
 * thousands) and a detail. */
static bool dnn_refused(cudnnStatus_t st) {
  const int cat = (int)st / 1000 * 1000;
  return st == CUDNN_STATUS_BAD_PARAM || st == CUDNN_STATUS_NOT_SUPPORTED ||
         cat == (int)CUDNN_STATUS_BAD_PARAM || cat == (int)CUDNN_STATUS_NOT_SUPPORTED;
}

/* One handle a GPU, made the first time a route on it needs one and kept for the process, as its
 * cuBLAS handle is (src/cuda/gpu/device.c); this file is one translation unit a build, so the
 * table is its own. */
enum { DNN_MAX_GPUS = 64 };
static cudnnHandle_t dnn_handles[DNN_MAX_GPUS];
static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER;

/* c->device's handle, bound to its stream so that cuDNN's kernels are ordered with every other
 * op's; NULL (the im2col route) for a GPU past the table. cudnnCreate works on the calling
 * thread's current device, which the cuda table's wrapper (src/cuda/gpu/table.c) made c's. */
static int dnn_handle(const kiln_op_ctx *c, cudnnHandle_t *h) {
  const int i = c->device->index;
  *h = NULL;
  if (i < 0 || i >= DNN_MAX_GPUS) return KILN_OK;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  pthread_mutex_lock(&dnn_lock);
  if (!dnn_handles[i]) {
    cudnnHandle_t made = NULL;
    st = cudnnCreate(&made);
    if (st == CUDNN_STATUS_SUCCESS) {
      st = cudnnSetStream(made, (cudaStream_t)c->device->queue);
      if (st == CUDNN_STATUS_SUCCESS)
        dnn_handles[i] = made;
      else
        cudnnDestroy(made); /* the failure reported is the stream's */
    }
  }
  *h = dnn_handles[i];
  pthread_mutex_unlock(&dnn_lock);
  if (st != CUDNN_STATUS_SUCCESS)
    return kiln_errorf(KILN_ERR_IO,
                       "cuda convolution (cuDNN): %s on %s (KILN_CUDNN=0 runs the convolutions "
                       "without cuDNN)",
                       cudnnGetErrorString(st), c->device->name);
  return KILN_OK;
}

/* The descriptors d lacks (all of them the first time). */
static cudnnStatus_t dnn_create(kcuda_dnn *d) {
  if (!d->x) DNN_CHECK(cudnnCreateTensorDescriptor(&d->x));
  if (!d->y) DNN_CHECK(cudnnCreateTensorDescriptor(&d->y));
  if (!d->bias) DNN_CHECK(cudnnCreateTensorDescriptor(&d->bias));
  if (!d->w) DNN_CHECK(cudnnCreateFilterDescriptor(&d->w));
  for (int k = 0; k < DNN_DIRS; k++)
    if (!d->conv[k]) DNN_CHECK(cudnnCreateConvolutionDescriptor(&d->conv[k]));
  return CUDNN_STATUS_SUCCESS;
}

/* Destroys d's descriptors (the handle is the device's); the first failure. */
static cudnnStatus_t dnn_destroy(kcuda_dnn *d) {
  cudnnStatus_t first = CUDNN_STATUS_SUCCESS, st;
#define DNN_DROP_(destroy, desc)                                                               \
  if (desc) {                                                                                  \
    st = destroy(desc);                                                                        \
    if (first == CUDNN_STATUS_SUCCESS) first = st;                                             \
    desc = NULL;                                                                               \
  }
  DNN_DROP_(cudnnDestroyTensorDescriptor, d->x)
  DNN_DROP_(cudnnDestroyTensorDescriptor, d->y)
  DNN_DROP_(cudnnDestroyTensorDescriptor, d->bias)
  DNN_DROP_(cudnnDestroyFilterDescriptor, d->w)
  for (int k = 0; k < DNN_DIRS; k++) DNN_DROP_(cudnnDestroyConvolutionDescriptor, d->conv[k])
#undef DNN_DROP_
  d->tried = false;
  return first;
}

/* Whether cuDNN's 4-d descriptors can hold the shape: the batch and each tensor's count in int
 * (their sizes and strides are int), and a batch at all (cuDNN refuses empty tensors; a batch of
 * no images runs nothing anyway). */
static bool dnn_fits(const kiln_conv_spec *s) {
  const kiln_conv_geom *g = &s->g;
  const double x = (double)s->N * g->channels * g->height * g->width;
  const double y = (double)s->N * s->M * g->out_h * g->out_w;
  const double w = (double)s->M * (g->channels / s->group) * g->kernel_h * g->kernel_w;
  return s->N > 0 && s->N <= INT_MAX && x <= INT_MAX && y <= INT_MAX && w <= INT_MAX;
}

static bool same_spec(const kiln_conv_spec *a, const kiln_conv_spec *b) {
  return a->N == b->N && a->M == b->M && a->group == b->group && a->bias == b->bias &&
         a->x_layout == b->x_layout && a->y_layout == b->y_layout &&
         memcmp(&a->g, &b->g, sizeof a->g) == 0; /* kiln_conv_geom is ints alone: no padding */
}

/* d's descriptors for s: NCHW tensors, the filter M x C/group x kh x kw, Caffe's convolution
 * (cross-correlation: no flipped kernel; one pad a side, as kiln_conv_geom has) in groups, its
 * math type FMA alone unless kiln_config.tf32 (in cuDNN 8 and 9, CUDNN_DEFAULT_MATH lets fp32
 * convolutions take TF32 tensor cores on Ampere and later). *same: cuDNN's output size is
 * Caffe's (else the im2col route). */
static cudnnStatus_t dnn_describe(kcuda_dnn *d, const kiln_conv_spec *s, bool tf32, bool *same) {
  const kiln_conv_geom *g = &s->g;
  const int N = (int)s->N;
  *same = false;
  DNN_CHECK(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, g->channels,
                                       g->height, g->width));
  DNN_CHECK(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, s->M,
                                       g->out_h, g->out_w));
  DNN_CHECK(cudnnSetTensor4dDescriptor(d->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, s->M, 1,
                                       1));
  DNN_CHECK(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s->M,
                                       g->channels / s->group, g->kernel_h, g->kernel_w));
  for (int k = 0; k < DNN_DIRS; k++) {
    DNN_CHECK(cudnnSetConvolution2dDescriptor(d->conv[k], g->pad_h, g->pad_w, g->stride_h,
                                              g->stride_w, g->dilation_h, g->dilation_w,
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN_CHECK(cudnnSetConvolutionGroupCount(d->conv[k], s->group));
    DNN_CHECK(cudnnSetConvolutionMathType(d->conv[k], tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  }
  int n = 0, m = 0, h = 0, w = 0;
  DNN_CHECK(cudnnGetConvolution2dForwardOutputDim(d->conv[DNN_FWD], d->x, d->w, &n, &m, &h, &w));
  *same = n == N && m == s->M && h == g->out_h && w == g->out_w;
  return CUDNN_STATUS_SUCCESS;
}

/* One entry of a heuristics list, whichever the direction. */
typedef struct {
  int algo;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
} dnn_cand;

#define DNN_CANDS_(perf, cap)                                                                  \
  do {                                                                                         \
    if (*n > (cap)) *n = (cap);                                                                \
    for (int i = 0; i < *n; i++) {                                                             \
      out[i].algo = (int)perf[i].algo;                                                         \
      out[i].status = perf[i].status;                                                          \
      out[i].determinism = perf[i].determinism;                                                \
      out[i].math = perf[i].mathType;                                                          \
    }                                                                                          \
  } while (0)

/* cuDNN's heuristics for one direction, best first (cudnnGet*Algorithm_v7: no trial runs, so the
 * choice depends on the shape, the GPU and the library alone, never on a timing). */
static cudnnStatus_t dnn_candidates(const kcuda_dnn *d, int dir, dnn_cand *out, int *n) {
  *n = 0;
  if (dir == DNN_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    DNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(d->handle, d->x, d->w, d->conv[dir], d->y,
                                                     CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, perf));
    DNN_CANDS_(perf, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  } else if (dir == DNN_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    DNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        d->handle, d->w, d->y, d->conv[dir], d->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, perf));
    DNN_CANDS_(perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        d->handle, d->x, d->y, d->conv[dir], d->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n,
        perf));
    DNN_CANDS_(perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  }
  return CUDNN_STATUS_SUCCESS;
}
#undef DNN_CANDS_

/* The workspace of one direction's algorithm, in the math type its descriptor has now. */
static cudnnStatus_t dnn_workspace(const kcuda_dnn *d, int dir, int algo, size_t *bytes) {
  *bytes = 0;
  if (dir == DNN_FWD)
    return cudnnGetConvolutionForwardWorkspaceSize(d->handle, d->x, d->w, d->conv[dir], d->y,
                                                   (cudnnConvolutionFwdAlgo_t)algo, bytes);
  if (dir == DNN_BWD_DATA)
    return cudnnGetConvolutionBackwardDataWorkspaceSize(d->handle, d->w, d->y, d->conv[dir], d->x,
                                                        (cudnnConvolutionBwdDataAlgo_t)algo,
                                                        bytes);
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(d->handle, d->x, d->y, d->conv[dir], d->w,
                                                        (cudnnConvolutionBwdFilterAlgo_t)algo,
                                                        bytes);
}

/* The first algorithm of the direction's list that runs the shape (CUDNN_STATUS_SUCCESS), gives
 * the same bits every run (CUDNN_DETERMINISTIC: kiln's results must not vary from run to run),
 * keeps to fp32 products unless kiln_config.tf32 (CUDNN_FMA_MATH; with TF32 any math type but a
 * conversion down to half precision) and whose workspace is at most DNN_WS_MAX; *algo -1 where
 * none is. The direction's descriptor is left in the chosen algorithm's math type, which is the
 * one cuDNN runs it in. */
static cudnnStatus_t dnn_pick(kcuda_dnn *d, int dir, bool tf32, int *algo, size_t *bytes) {
  dnn_cand cand[DNN_MAX_CANDS];
  int n = 0;
  *algo = -1;
  *bytes = 0;
  DNN_CHECK(dnn_candidates(d, dir, cand, &n));
  for (int i = 0; i < n; i++) {
    const dnn_cand *k = &cand[i];
    if (k->status != CUDNN_STATUS_SUCCESS || k->determinism != CUDNN_DETERMINISTIC) continue;
    if (tf32 ? k->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : k->math != CUDNN_FMA_MATH)
      continue;
    DNN_CHECK(cudnnSetConvolutionMathType(d->conv[dir], k->math));
    size_t b = 0;
    const cudnnStatus_t st = dnn_workspace(d, dir, k->algo, &b);
    if (st != CUDNN_STATUS_SUCCESS && !dnn_refused(st)) return st;
    if (st != CUDNN_STATUS_SUCCESS || b > DNN_WS_MAX) continue;
    *algo = k->algo;
    *bytes = b;
    return CUDNN_STATUS_SUCCESS;
  }
  return CUDNN_STATUS_SUCCESS;
}

/* d's descriptors and algorithms for s, made once a shape (a spec asked again keeps them, and a
 * refusal); *ok false where cuDNN cannot take s, which the im2col route then runs. */
static int dnn_update(const kiln_op_ctx *c, kcuda_dnn *d, const kiln_conv_spec *s, bool *ok) {
  const bool tf32 = c->config->tf32;
  if (d->tried && d->tf32 == tf32 && same_spec(&d->spec, s)) {
    *ok = d->ok;
    return KILN_OK;
  }
  d->tried = d->ok = *ok = false;
  const char *why = NULL; /* why not cuDNN */
  if (!dnn_fits(s)) {
    why = "the shape is past cuDNN's int sizes";
  } else {
    KILN_TRY(dnn_handle(c, &d->handle));
    if (!d->handle) why = "no cuDNN handle for a GPU past the table";
  }
  if (!why) {
    int algo[DNN_DIRS] = {-1, -1, -1};
    size_t bytes[DNN_DIRS] = {0, 0, 0};
    bool same = false;
    cudnnStatus_t st = dnn_create(d);
    if (st == CUDNN_STATUS_SUCCESS) st = dnn_describe(d, s, tf32, &same);
    for (int k = 0; k < DNN_DIRS && st == CUDNN_STATUS_SUCCESS && same; k++) {
      st = dnn_pick(d, k, tf32, &algo[k], &bytes[k]);
      if (st == CUDNN_STATUS_SUCCESS && algo[k] < 0) break;
    }
    if (st != CUDNN_STATUS_SUCCESS && !dnn_refused(st)) return dnn_error(st);
    if (st != CUDNN_STATUS_SUCCESS)
      why = cudnnGetErrorString(st);
    else if (!same)
      why = "cuDNN's output size differs from Caffe's";
    else if (algo[DNN_FWD] < 0 || algo[DNN_BWD_DATA] < 0 || algo[DNN_BWD_FILTER] < 0)
      why = "no deterministic algorithm in the math allowed within the workspace limit";
    else {
      d->fwd = (cudnnConvolutionFwdAlgo_t)algo[DNN_FWD];
      d->bwd_data = (cudnnConvolutionBwdDataAlgo_t)algo[DNN_BWD_DATA];
      d->bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)algo[DNN_BWD_FILTER];
      d->ws_bytes = bytes[DNN_FWD];
      if (bytes[DNN_BWD_DATA] > d->ws_bytes) d->ws_bytes = bytes[DNN_BWD_DATA];
      if (bytes[DNN_BWD_FILTER] > d->ws_bytes) d->ws_bytes = bytes[DNN_BWD_FILTER];
      d->ok = *ok = true;
    }
  }
  if (d->ok)
    kiln_log(KILN_LOG_DEBUG,
             "cuda convolution: cuDNN algorithms forward %d, backward data %d, backward filter "
             "%d, workspace %zu bytes",
             (int)d->fwd, (int)d->bwd_data, (int)d->bwd_filter, d->ws_bytes);
  else
    kiln_log(KILN_LOG_DEBUG, "cuda convolution: im2col instead of cuDNN: %s", why);
  d->tried = true;
  d->tf32 = tf32;
  d->spec = *s;
  return KILN_OK;
}

/* y = conv(x, w) (beta 0: overwritten), then y += b broadcast over the batch and the plane
 * (cudnnAddTensor: the one addition the im2col route's bias kernel makes). */
static int dnn_forward(const kcuda_dnn *d, float *y, const float *x, const float *w,
                       const float *b, float *ws) {
  cudnnStatus_t st =
      cudnnConvolutionForward(d->handle, &dnn_one, d->x, x, d->w, w, d->conv[DNN_FWD], d->fwd, ws,
                              d->ws_bytes, &dnn_zero, d->y, y);
  if (st == CUDNN_STATUS_SUCCESS && b)
    st = cudnnAddTensor(d->handle, &dnn_one, d->bias, b, &dnn_one, d->y, y);
  return st == CUDNN_STATUS_SUCCESS ? KILN_OK : dnn_error(st);
}

/* The contract's gradients: dx = (beta 0; NULL: skipped), dw += (beta 1), db += (NULL: skipped).
 * db by the im2col route's own sum (plane_sums_into: in double, in an order fixed by the sizes),
 * so that it is the same bits every run, and the same as that route's; cuDNN promises no order
 * for cudnnConvolutionBackwardBias. The two cuDNN calls take the workspace one after the other
 * on the stream. */
static int dnn_backward(const kiln_op_ctx *c, const kcuda_dnn *d, float *dx, float *dw,
                        float *db, const float *dy, const float *x, const float *w, float *ws,
                        const kiln_conv_spec *s) {
  if (db)
    KILN_TRY(plane_sums_into(c, db, dy, s->N, s->M, (int64_t)s->g.out_h * s->g.out_w));
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if (dw)
    st = cudnnConvolutionBackwardFilter(d->handle, &dnn_one, d->x, x, d->y, dy,
                                        d->conv[DNN_BWD_FILTER], d->bwd_filter, ws, d->ws_bytes,
                                        &dnn_one, d->w, dw);
  if (st == CUDNN_STATUS_SUCCESS && dx)
    st = cudnnConvolutionBackwardData(d->handle, &dnn_one, d->w, w, d->y, dy,
                                      d->conv[DNN_BWD_DATA], d->bwd_data, ws, d->ws_bytes,
                                      &dnn_zero, d->x, dx);
  return st == CUDNN_STATUS_SUCCESS ? KILN_OK : dnn_error(st);
}
#endif

/* ---- the route -------------------------------------------------------------------------------- */

/* The im2col route reads and writes Caffe's layout only, so it asks the net for no other
 * (layout_role 0): a blocked neighbour here means the spec came from another backend's plan; so
 * does the cuDNN route (NCHW descriptors). Which route runs is decided here, once a shape, and the
 * workspace reported is that route's. */
KCUDA_OP(conv_route_update)(const kiln_op_ctx *c, kiln_conv_route **route,
                            const kiln_conv_spec *spec, kiln_conv_route_info *info) {
  (void)c;
  if (spec->x_layout != KILN_LAYOUT_PLAIN || spec->y_layout != KILN_LAYOUT_PLAIN)
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "cuda convolution: only the plain layout (input layout %d, output layout %d)",
                       spec->x_layout, spec->y_layout);
  kcuda_conv_route *p = (kcuda_conv_route *)*route;
  if (!p) {
    if (!(p = (kcuda_conv_route *)calloc(1, sizeof *p)))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    *route = (kiln_conv_route *)p;
  }
  p->spec = *spec;
  info->workspace_floats = column_floats(&spec->g, spec->group);
#ifdef KCUDA_CUDNN
  /* A batch of no images runs nothing (conv_fwd and conv_bwd return at once): cuDNN's state is
   * left as it was, for the shape to come back to. */
  p->on_dnn = false;
  if (!c->config->no_cudnn && spec->N > 0) {
    KILN_TRY(dnn_update(c, &p->dn, spec, &p->on_dnn));
    if (p->on_dnn)
      info->workspace_floats = (int64_t)((p->dn.ws_bytes + sizeof(float) - 1) / sizeof(float));
  }
#endif
  info->layout_role = 0;
  info->block_channels = 0;
  return KILN_OK;
}

KCUDA_OP(conv_route_free)(const kiln_op_ctx *c, kiln_conv_route *route) {
  (void)c;
  kcuda_conv_route *p = (kcuda_conv_route *)route;
#ifdef KCUDA_CUDNN
  const cudnnStatus_t st = p ? dnn_destroy(&p->dn) : CUDNN_STATUS_SUCCESS;
  free(p);
  return st == CUDNN_STATUS_SUCCESS ? KILN_OK : dnn_error(st);
#else
  free(p);
  return KILN_OK;
#endif
}

KCUDA_OP(conv_fwd)(const kiln_op_ctx *c, const kiln_conv_route *route, float *y, const float *x,
                   const float *w, const float *b, float *ws) {
  const kcuda_conv_route *r = (const kcuda_conv_route *)route;
  const kiln_conv_spec *s = &r->spec;
  if (s->N == 0) return KILN_OK; /* a batch of no images */
#ifdef KCUDA_CUDNN
  if (r->on_dnn) {
    KILN_TRY(dnn_forward(&r->dn, y, x, w, b, ws));
    return kcuda_launched(c, "conv_fwd");
  }
#endif
  KILN_TRY(conv_forward(c, y, x, w, b, s->N, s->M, s->group, &s->g, ws));
  return kcuda_launched(c, "conv_fwd");
}

KCUDA_OP(conv_bwd)(const kiln_op_ctx *c, const kiln_conv_route *route, float *dx, float *dw,
                   float *db, const float *dy, const float *x, const float *w, float *ws) {
  const kcuda_conv_route *r = (const kcuda_conv_route *)route;
  const kiln_conv_spec *s = &r->spec;
  if (s->N == 0) return KILN_OK; /* nothing flows back, nothing accumulates */
#ifdef KCUDA_CUDNN
  if (r->on_dnn) {
    KILN_TRY(dnn_backward(c, &r->dn, dx, dw, db, dy, x, w, ws, s));
    return kcuda_launched(c, "conv_bwd");
  }
#endif
  KILN_TRY(conv_backward(c, dx, dw, db, dy, x, w, s->N, s->M, s->group, &s->g, ws));
  return kcuda_launched(c, "conv_bwd");
}

/* ---- pooling ---------------------------------------------------------------------------------- *
 * Both layouts in one index space of `lanes` channels a cell (1 plain, 16 nChw16c): value i is
 * lane i % lanes of cell (i / lanes) % cells of plane i / (lanes cells), and the mask holds the
 * winning cell h W + w, as the reference's. */

/* Caffe's AVE window along one axis: the cells [*a, *b) inside the image and the divisor's
 * extent, the window clipped to size + pad only (padding counts as zeros). */
KCUDA_DEV void ave_window(int o, int stride, int pad, int k, int size, int *a, int *b,
                          int *extent) {
  const int start = o * stride - pad;
  const int end = start + k < size + pad ? start + k : size + pad;
  *extent = end - start;
  *a = start > 0 ? start : 0;
  *b = end < size ? end : size;
}

/* One thread an output value. MAX: seeded with the window's first cell, strict >, so ties keep
 * the first in row order; an empty window gives 0 and mask -1. AVE: the sum in row order over
 * the divisor. */
KCUDA_GLOBAL void k_pool_fwd(float *y, int32_t *mask, const float *x, kiln_conv_geom g,
                             int64_t total, int lanes, bool max) {
  const int64_t Q = (int64_t)g.out_h * g.out_w, HW = (int64_t)g.height * g.width;
  KCUDA_FOR(i, total) {
    const int64_t k = i % lanes, q = i / lanes % Q, pl = i / lanes / Q;
    const int oh = (int)(q / g.out_w), ow = (int)(q % g.out_w);
    const float *xp = x + pl * HW * lanes + k;
    int h0, h1, w0, w1, eh = 1, ew = 1;
    if (max) {
      const int hs = oh * g.stride_h - g.pad_h, ws = ow * g.stride_w - g.pad_w;
      h0 = hs > 0 ? hs : 0;
      h1 = hs + g.kernel_h < g.height ? hs + g.kernel_h : g.height;
      w0 = ws > 0 ? ws : 0;
      w1 = ws + g.kernel_w < g.width ? ws + g.kernel_w : g.width;
    } else {
      ave_window(oh, g.stride_h, g.pad_h, g.kernel_h, g.height, &h0, &h1, &eh);
      ave_window(ow, g.stride_w, g.pad_w, g.kernel_w, g.width, &w0, &w1, &ew);
    }
    if (max && (h0 >= h1 || w0 >= w1)) {
      y[i] = 0.0f;
      if (mask) mask[i] = -1;
    } else if (max) {
      int32_t arg = h0 * g.width + w0;
      float best = xp[(int64_t)arg * lanes];
      for (int h = h0; h < h1; h++)
        for (int w = w0; w < w1; w++) {
          const int32_t at = h * g.width + w;
          const float v = xp[(int64_t)at * lanes];
          if (v > best) best = v, arg = at;
        }
      y[i] = best;
      if (mask) mask[i] = arg;
    } else if (eh <= 0 || ew <= 0) {
      y[i] = 0.0f;
    } else {
      float s = 0.0f;
      for (int h = h0; h < h1; h++)
        for (int w = w0; w < w1; w++) s += xp[((int64_t)h * g.width + w) * lanes];
      y[i] = s / (float)(eh * ew);
    }
  }
}

/* One thread an input value: the sum over the windows that cover its cell, in row order of the
 * windows (the reference's order of additions), of the gradient routed to it: MAX where the
 * window's mask names the cell, AVE the window's share. Every window covering the cell holds
 * it inside the image, so the AVE windows are never empty here. */
KCUDA_GLOBAL void k_pool_bwd(float *dx, const float *dy, const int32_t *mask, kiln_conv_geom g,
                             int64_t total, int lanes, bool max) {
  const int64_t Q = (int64_t)g.out_h * g.out_w, HW = (int64_t)g.height * g.width;
  KCUDA_FOR(i, total) {
    const int64_t k = i % lanes, at = i / lanes % HW, pl = i / lanes / HW;
    const int h = (int)(at / g.width), w = (int)(at % g.width);
    const int64_t base = pl * Q * lanes + k;
    /* windows o with o s - pad <= h < o s - pad + kernel */
    const int th = h + g.pad_h - g.kernel_h, tw = w + g.pad_w - g.kernel_w;
    const int oh0 = th < 0 ? 0 : th / g.stride_h + 1, ow0 = tw < 0 ? 0 : tw / g.stride_w + 1;
    int oh1 = (h + g.pad_h) / g.stride_h, ow1 = (w + g.pad_w) / g.stride_w;
    if (oh1 > g.out_h - 1) oh1 = g.out_h - 1;
    if (ow1 > g.out_w - 1) ow1 = g.out_w - 1;
    float s = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++) {
      int a, b, eh = 1;
      if (!max) ave_window(oh, g.stride_h, g.pad_h, g.kernel_h, g.height, &a, &b, &eh);
      for (int ow = ow0; ow <= ow1; ow++) {
        const int64_t yi = base + ((int64_t)oh * g.out_w + ow) * lanes;
        if (max) {
          if (mask[yi] == (int32_t)at) s += dy[yi];
        } else {
          int ew;
          ave_window(ow, g.stride_w, g.pad_w, g.kernel_w, g.width, &a, &b, &ew);
          s += dy[yi] / (float)(eh * ew);
        }
      }
    }
    dx[i] = s;
  }
}

/* Lanes a cell of the layout (the reference takes every layout but BLOCKED16 as plain), or 0
 * with the error set where the channels do not fill the blocks. */
static int pool_lanes(const kiln_conv_geom *g, int layout, const char *op) {
  if (layout != KILN_LAYOUT_BLOCKED16) return 1;
  if (g->channels % 16 != 0) {
    kiln_errorf(KILN_ERR_SHAPE, "cuda %s: %d channels in the blocked layout (nChw16c)", op,
                g->channels);
    return 0;
  }
  return 16;
}

KCUDA_OP(pool_fwd)(const kiln_op_ctx *c, float *y, int32_t *mask, const float *x, int N,
                   const kiln_conv_geom *g, bool max, int layout) {
  const int lanes = pool_lanes(g, layout, "pool_fwd");
  if (!lanes) return KILN_ERR_SHAPE;
  const int64_t total = (int64_t)N * g->channels * g->out_h * g->out_w;
  KCUDA_LAUNCH(c, total, k_pool_fwd, y, mask, x, *g, total, lanes, max);
  return kcuda_launched(c, "pool_fwd");
}

KCUDA_OP(pool_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const int32_t *mask, int N,
                   const kiln_conv_geom *g, bool max, int layout) {
  const int lanes = pool_lanes(g, layout, "pool_bwd");
  if (!lanes) return KILN_ERR_SHAPE;
  if (max && !mask) return kiln_errorf(KILN_ERR_INVALID, "cuda pool_bwd: MAX without its mask");
  const int64_t total = (int64_t)N * g->channels * g->height * g->width;
  KCUDA_LAUNCH(c, total, k_pool_bwd, dx, dy, mask, *g, total, lanes, max);
  return kcuda_launched(c, "pool_bwd");
}

KCUDA_REGISTER(conv) {
  b->conv_route_update = KCUDA_FN(conv_route_update);
  b->conv_route_free = KCUDA_FN(conv_route_free);
  b->conv_fwd = KCUDA_FN(conv_fwd);
  b->conv_bwd = KCUDA_FN(conv_bwd);
  b->im2col_conv_fwd = KCUDA_FN(im2col_conv_fwd);
  b->im2col_conv_bwd = KCUDA_FN(im2col_conv_bwd);
  b->plane_bias_add = KCUDA_FN(plane_bias_add);
  b->plane_bias_grad = KCUDA_FN(plane_bias_grad);
  b->im2col = KCUDA_FN(im2col);
  b->col2im = KCUDA_FN(col2im);
  b->pool_fwd = KCUDA_FN(pool_fwd);
  b->pool_bwd = KCUDA_FN(pool_bwd);
}
