/* kiln ops: pure kernels. Outputs first, then cached tensors, then inputs, then weights, then
 * sizes; no allocation (callers pass workspace), no globals. Backward kernels ACCUMULATE into
 * parameter gradients (+=) and OVERWRITE input gradients (=), as Caffe's layers do. */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/config.h"
#include "kiln/layout.h"

/* Geometry of a 2-D convolution or pooling window over one image. */
typedef struct kiln_conv_geom {
  int channels, height, width;       /* input (C, H, W) */
  int kernel_h, kernel_w;
  int pad_h, pad_w;
  int stride_h, stride_w;
  int dilation_h, dilation_w;        /* 1 for none; pooling uses 1 */
  int out_h, out_w;
} kiln_conv_geom;

/* The largest kernel size, pad, stride or dilation a layer takes, and the largest input height or
 * width: far beyond any real net, and small enough that the window arithmetic in int never
 * overflows. */
#define KILN_CONV_MAX_PARAM 65536
#define KILN_CONV_MAX_SIDE (1 << 24)

/* Convolution output size (Caffe): floor((H + 2p - (d(k-1)+1)) / s) + 1. Returns 0 on success,
 * -1 when the kernel does not fit or a size is past the limits above. Fills g->out_h, g->out_w. */
int kiln_conv_out_size(kiln_conv_geom *g);

/* col is (C*kh*kw, out_h*out_w); im is (C, H, W). Padding reads as zero. */
void kiln_im2col(float *col, const float *im, const kiln_conv_geom *g);
/* Inverse scatter: im = sum of col contributions (im is overwritten, not accumulated). */
void kiln_col2im(float *im, const float *col, const kiln_conv_geom *g);

/* Kernels that run their own OpenMP loop around GEMM calls hold OpenBLAS to one thread while
 * they run, and parallelism comes only from their loop:
 * - when several of our threads each call GEMM, a pthread build of OpenBLAS would start its own
 *   threads inside every call: cores get oversubscribed and its spinning workers starve ours
 *   (several times slower on 2 cores; `make bench` with KILN_ENGINE=ref shows it);
 * - a multi-threaded OpenBLAS GEMM does not always give the bits of a single-threaded one (seen
 *   for the weight-gradient GEMM), which would make results depend on the thread count.
 * kiln_blas_serial_begin asks OpenBLAS for one thread and returns what to restore;
 * kiln_blas_serial_end(that) restores it (an OpenMP build of OpenBLAS already runs serially
 * inside parallel regions, but not in a team of one, hence the check on every build that has
 * threads). This touches OpenBLAS's process-wide setting, so such kernels must not run
 * concurrently from several caller threads, which kiln's threading contract (one compute thread,
 * OpenMP inside kernels) already rules out. */
int kiln_blas_serial_begin(void);
void kiln_blas_serial_end(int prev);

/* C = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm (op: transposed when ta / tb; A is
 * M x K after op, B K x N, C M x N). Through oneDNN's matmul where the build has it and the shape
 * is one where it is faster (src/ops/gemm.c), else OpenBLAS; always OpenBLAS inside an OpenMP
 * parallel region and under the reference engine (cfg->engine KILN_ENGINE_REF; cfg NULL: the
 * defaults). */
void kiln_sgemm(const kiln_config *cfg, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                float *C, int64_t ldc);
/* The same product through OpenBLAS alone: the reference backend's GEMM. */
void kiln_sgemm_blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                     int64_t ldc);
/* The same product through oneDNN's matmul whatever the shape, for measurements and tests:
 * false (C untouched) when the build has no oneDNN or oneDNN has no fast kernel for it. */
bool kiln_sgemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);

/* bfloat16: the upper 16 bits of an fp32 (8 exponent bits, 7 of mantissa), rounded to nearest
 * even; a NaN stays a (quiet) NaN. kiln_bf16_round is the fp32 value of x's bf16. */
static inline uint16_t kiln_bf16_of(float x) {
  union { float f; uint32_t u; } v = {.f = x};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float kiln_bf16_round(float x) {
  union { float f; uint32_t u; } v = {.u = (uint32_t)kiln_bf16_of(x) << 16};
  return v.f;
}
/* y[i] = x[i] in bf16, n values (vectorised; one thread) */
void kiln_bf16_from_f32(uint16_t *y, const float *x, int64_t n);
/* KILN_OK where bf16 products run on this CPU through oneDNN's kernels for it (AVX512_BF16 or
 * AMX-BF16), else KILN_ERR_UNSUPPORTED saying which feature is missing: kiln does not emulate
 * bf16 (oneDNN would, on AVX-512 alone, slower than fp32). */
int kiln_bf16_check(void);
/* Whether bf16 products are slower than fp32 ones on a CPU whose VDPBF16PS and fp32 FMA loops
 * measure these GFLOP/s (kiln-fma-peak's loops): under three quarters of the rate, without AMX. */
bool kiln_bf16_slower(double bf16_gflops, double fp32_gflops, bool amx);
/* Those two rates on one core of this CPU, a few milliseconds of each loop (0 where the CPU has
 * no such loop). */
void kiln_bf16_rates(double *bf16_gflops, double *fp32_gflops);
/* Once a process, a warning through kiln_log where kiln_bf16_rates say bf16 is slower. */
void kiln_bf16_rate_note(void);
/* Products of fewer multiply-adds stay fp32 in the bf16 backend: rounding the operands and the
 * call would cost more than the product (and fp32 is exact where bf16 rounds). */
#define KILN_BF16_MIN_MACS (1LL << 16)
/* kiln_sgemm's product with A and B rounded to bf16 and the products summed in fp32, through
 * oneDNN's bf16 matmul: false (C untouched) where the build has no oneDNN or oneDNN no JIT kernel
 * for the shape. */
bool kiln_sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc);

/* B0 x B1 products in bf16 with fp32 sums (attention's, through oneDNN's batched matmul):
 * C[i][j] (M x N) = alpha A[i][j] (M x K) B[i][j] (K x N); A bf16, contiguous (B0, B1, M, K); B
 * bf16 and C fp32 with the strides bs and cs (elements) of their axes (B0, B1, rows, columns).
 * false (C untouched) without oneDNN or a JIT kernel for the shape. */
bool kiln_bmm_bf16(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                   const uint16_t *A, const uint16_t *B, const int64_t bs[4], float *C,
                   const int64_t cs[4]);

/* A product C = A op(B) + beta C of one shape (A M x K row-major, lda apart; op(B) K x N) whose B
 * stays the same over many calls: set_b copies B once into the layout the fast kernel reads
 * (on the oneDNN route; the OpenBLAS route only keeps the pointer, which must stay valid), run
 * then reads A and C only. update keeps *plan when it already has this shape, configuration and
 * OpenMP thread count, and else replaces it (NULL to start); KILN_ERR_NOMEM when no plan could
 * be made (*plan is then NULL). destroy accepts NULL. */
typedef struct kiln_packed_gemm kiln_packed_gemm;
int kiln_packed_gemm_update(kiln_packed_gemm **plan, const kiln_config *cfg, bool tb, int64_t M,
                            int64_t N, int64_t K, int64_t lda, int64_t ldb, float beta,
                            int64_t ldc);
/* The same in bf16: B packed in bf16 by set_b, A rounded by each run, sums in fp32 (the OpenBLAS
 * route in fp32 for products under KILN_BF16_MIN_MACS or without a oneDNN kernel). */
int kiln_packed_gemm_update_bf16(kiln_packed_gemm **plan, const kiln_config *cfg, bool tb,
                                 int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                                 float beta, int64_t ldc);
void kiln_packed_gemm_set_b(kiln_packed_gemm *plan, const float *B);
void kiln_packed_gemm_run(kiln_packed_gemm *plan, const float *A, float *C);
void kiln_packed_gemm_destroy(kiln_packed_gemm *plan);

/* Convolution of a batch.
 *   out is (N, M, OH, OW); in is (N, C, H, W); w is (M, C/group, kh, kw); bias is (M) or NULL.
 *   col is workspace of (C/group*kh*kw) * (OH*OW) floats per thread: kiln_conv_workspace().
 * Threads over the batch (OpenMP); each thread uses its own slice of `col`. */
int64_t kiln_conv_workspace(const kiln_conv_geom *g, int group, int nthreads); /* floats */
void kiln_conv2d_forward(float *out, const float *in, const float *w, const float *bias, int N,
                         int M, int group, const kiln_conv_geom *g, float *col, int nthreads);
/* dout is (N, M, OH, OW). dw += ..., dbias += ... (either may be NULL to skip);
 * din = ... (overwritten; NULL to skip). dw accumulation across the batch is made in a fixed
 * order so results do not depend on the thread count. `dw_ws` is workspace of nthreads * |w|
 * floats for per-thread partial weight gradients. */
void kiln_conv2d_backward(float *din, float *dw, float *dbias, const float *dout, const float *in,
                          const float *w, int N, int M, int group, const kiln_conv_geom *g,
                          float *col, float *dw_ws, int nthreads);

/* The same convolution through oneDNN's JIT kernels (src/ops/conv_dnnl.c), when the build has
 * oneDNN (kiln_dnnl_available()). A kiln_dnnl_conv holds the primitives for one shape; its calls
 * keep the contract above (dw and dbias +=, din =) and use kiln_dnnl_conv_workspace() floats of
 * caller workspace (64-byte aligned) for the blocked copies and oneDNN's scratchpad. The plain
 * kernels above are the reference it is tested against. `backward` false builds the inference
 * forward only. x_layout and y_layout (KILN_LAYOUT_*) say how the caller holds the input and
 * the output (and their gradients); BLOCKED16 needs group 1 and 16 | channels. `cfg` (NULL:
 * defaults) may turn Winograd off (conv_direct) or force the plain side's layout (dnnl_layout).
 * `max_images` > 0 caps the images each call runs at once (kiln_dnnl_conv_chunks): a layer that
 * made its primitives for its planned batch passes that creation's N / chunks when it remakes
 * them for another batch, so that no batch asks for more workspace than the planned one; 0: the
 * chunks are chosen for N alone. `bf16`: the primitives read their inputs in bfloat16 (rounded
 * to nearest even from kiln's fp32, in the workspace) and write fp32, with no Winograd.
 * Creation fails with KILN_ERR_UNSUPPORTED when oneDNN has no kernel for a shape (in bf16, no
 * JIT kernel). */
typedef struct kiln_dnnl_conv kiln_dnnl_conv;
bool kiln_dnnl_available(void);
/* The channel block of the blocked activation layout the primitives read and write directly
 * (16: nChw16c, KILN_LAYOUT_BLOCKED16); 0 in a build without oneDNN. */
int kiln_dnnl_block_channels(void);
int kiln_dnnl_conv_create(kiln_dnnl_conv **out, int N, int M, int group, const kiln_conv_geom *g,
                          bool bias, bool backward, int x_layout, int y_layout,
                          const kiln_config *cfg, int max_images, bool bf16);
int64_t kiln_dnnl_conv_workspace(const kiln_dnnl_conv *c);
/* How many chunks of the batch each call runs in turn (1: the whole batch at once; more where a
 * Winograd scratchpad for the whole batch would be larger than the output, conv_dnnl.c). */
int kiln_dnnl_conv_chunks(const kiln_dnnl_conv *c);
/* The implementation oneDNN chose: 0 forward, 1 backward data, 2 backward weights. */
const char *kiln_dnnl_conv_impl(const kiln_dnnl_conv *c, int which);
int kiln_dnnl_conv_forward(kiln_dnnl_conv *c, float *out, const float *in, const float *w,
                           const float *bias, float *ws);
int kiln_dnnl_conv_backward(kiln_dnnl_conv *c, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, float *ws);
void kiln_dnnl_conv_destroy(kiln_dnnl_conv *c);

/* Direct convolution by shifted rows (src/ops/conv_shift.c) for stride 1 and group 1: the
 * route for small channel counts on small planes, where neither oneDNN's 16-channel blocks nor
 * im2col's GEMMs are filled (LeNet). Same contract as kiln_conv2d_forward/backward (out and din
 * overwritten, dw and dbias accumulated, any gradient NULL to skip), workspace of
 * kiln_conv_shift_workspace() floats (backward true: the size the backward pass needs, which
 * also covers the forward). Results are bitwise independent of nthreads. */
bool kiln_conv_shift_supported(const kiln_conv_geom *g, int group);
/* Whether this build compiled the kernels for AVX-512, the only target they are fast on. */
bool kiln_conv_shift_fast(void);
int64_t kiln_conv_shift_workspace(const kiln_conv_geom *g, int N, int M, int nthreads,
                                  bool backward);
void kiln_conv_shift_forward(float *out, const float *in, const float *w, const float *bias,
                             int N, int M, const kiln_conv_geom *g, float *ws, int nthreads);
void kiln_conv_shift_backward(float *din, float *dw, float *dbias, const float *dout,
                              const float *in, const float *w, int N, int M,
                              const kiln_conv_geom *g, float *ws, int nthreads);

/* Pooling over (N, C, H, W) -> (N, C, OH, OW), Caffe's semantics: windows clipped to the padded
 * input; AVE divides by the window size clipped to H+pad (not to H); MAX records the argmax index
 * (into the H*W plane) in `mask` for backward. Output size with CEIL or FLOOR rounding and
 * Caffe's rule that the last window must start inside the image or left padding:
 * kiln_pool_out_size(). */
int kiln_pool_out_size(kiln_conv_geom *g, int ceil_mode);
void kiln_maxpool_forward(float *out, int32_t *mask, const float *in, int N,
                          const kiln_conv_geom *g);
void kiln_maxpool_backward(float *din, const float *dout, const int32_t *mask, int N,
                           const kiln_conv_geom *g); /* din overwritten */
void kiln_avepool_forward(float *out, const float *in, int N, const kiln_conv_geom *g);
void kiln_avepool_backward(float *din, const float *dout, int N,
                           const kiln_conv_geom *g); /* din overwritten */

/* The same pooling (max = MAX, else AVE) over the nChw16c layout (KILN_LAYOUT_BLOCKED16, 16 |
 * channels): out, mask and in all blocked. Results equal the plain kernels' after reordering. */
void kiln_pool_blocked16_forward(float *out, int32_t *mask, const float *in, int N,
                                 const kiln_conv_geom *g, bool max);
void kiln_pool_blocked16_backward(float *din, const float *dout, const int32_t *mask, int N,
                                  const kiln_conv_geom *g, bool max); /* din overwritten */

/* Softmax over axis of size C, for `outer` x C x `inner` data (numerically stable): the
 * softmax_fwd and softmax_bwd ops' arithmetic (src/ops/loss.c) on OpenMP's default threads, for
 * callers outside a backend. */
void kiln_softmax_forward(float *out, const float *in, int64_t outer, int64_t C, int64_t inner);
/* din = out * (dout - sum(dout * out)) (overwritten). */
void kiln_softmax_backward(float *din, const float *out, const float *dout, int64_t outer,
                           int64_t C, int64_t inner);

/* The floats of work the attention_bwd op (include/kiln/backend.h) takes on nthreads threads:
 * one T x S gradient of the attention weights per thread. */
int64_t kiln_attention_workspace(int T, int S, int nthreads);

#endif
