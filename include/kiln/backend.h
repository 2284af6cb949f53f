/* kiln backends: the kernels a net runs, as one table of functions per backend.
 *
 * An op is one kernel contract in the style of ops.h: outputs first, then inputs, then sizes and
 * settings; no allocation (the caller passes workspace); an int status (KILN_OK). Every op takes
 * an op context first: the threads it may use and the configuration, and the device its memory
 * is on. KILN_OP_LIST names every op once, with its parameters; the backend table has one
 * pointer per op (NULL where a backend lacks it), and the op ids, names and the check that a
 * backend has an op come from the same list, as do the tests (tests/test_backend_ops.c has a
 * row for every op and fails for an op without one).
 *
 * The backends:
 *   - "ref": the reference kernels, plain C (kiln's im2col + GEMM convolutions, the serial
 *     loops): KILN_ENGINE=ref;
 *   - "cpu": the optimised CPU kernels (oneDNN, shifted-row convolutions, OpenMP loops), the
 *     default; where an op has no faster form it is the reference's;
 *   - "hostsim": the cpu kernels on the hostsim device (include/kiln/device.h), each call
 *     between the device's enter and leave: the host behind a device's walls, for tests.
 * A layer reaches its kernels only through the table its net chose (kiln_layer.backend), by
 * device and engine; a layer type whose kernels the table lacks is refused when the net is
 * built, naming the layer and the backend. */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/config.h"
#include "kiln/core.h"
#include "kiln/device.h"
#include "kiln/ops.h"

/* What every op is told besides its tensors. */
typedef struct kiln_op_ctx {
  int nthreads;              /* OpenMP threads the op may use (1: none) */
  const kiln_config *config; /* never NULL */
  const kiln_device *device; /* where its tensors are */
} kiln_op_ctx;

/* A convolution as one Convolution layer runs it: the batch, the output channels, the groups,
 * the window over one image (kiln_conv_geom, its channels the input's), a bias or not, and the
 * layouts of its input and output (KILN_LAYOUT_*). */
typedef struct kiln_conv_spec {
  int64_t N;
  int M, group;
  kiln_conv_geom g;
  bool bias;
  int x_layout, y_layout;
} kiln_conv_spec;

/* What a route needs and takes: workspace, and the layouts it reads and writes without a
 * reorder: KILN_CONV_ROLE_* bits for the input (BOTTOM) and the output (TOP) in the blocked
 * layout of `block_channels` (0: plain only). */
enum { KILN_CONV_ROLE_BOTTOM = 2, KILN_CONV_ROLE_TOP = 4 };
typedef struct kiln_conv_route_info {
  int64_t workspace_floats;
  int layout_role;
  int block_channels;
} kiln_conv_route_info;

/* A backend's route for one convolution (which kernels, and their state), opaque. */
typedef struct kiln_conv_route kiln_conv_route;

/* Every op: X(name, parameters, arguments). The arguments repeat the parameters' names, so that
 * a wrapper (hostsim's) can pass a call on. The list is kept in families, each one macro, in the
 * order of the files in src/ops that hold them. */
#define KILN_OP_LIST(X)                                                                         \
  KILN_OPS_ELEMENTWISE(X)                                                                      \
  KILN_OPS_MATMUL(X)                                                                           \
  KILN_OPS_CONV(X)                                                                             \
  KILN_OPS_NEURON(X)                                                                           \
  KILN_OPS_NORM(X)                                                                             \
  KILN_OPS_L2NORM(X)                                                                           \
  KILN_OPS_LOSS(X)                                                                             \
  KILN_OPS_ARRANGE(X)                                                                          \
  KILN_OPS_SEQUENCE(X)                                                                         \
  KILN_OPS_SOLVER(X)

/* src/ops/elementwise.c: copies, products, ReLU, Sigmoid, TanH, dropout's mask. */
#define KILN_OPS_ELEMENTWISE(X)                                                                 \
  /* y = x (n floats; y may be x) */                                                           \
  X(copy, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))           \
  /* y = x > 0 ? x : slope x */                                                                \
  X(relu_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float slope),        \
    (c, y, x, n, slope))                                                                       \
  /* dx = v > 0 ? dy : slope dy, v the input or (in place, slope >= 0) the output */           \
  X(relu_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *v, int64_t n, float slope), \
    (c, dx, dy, v, n, slope))                                                                  \
  /* y = 1 / (1 + e^-x) */                                                                     \
  X(sigmoid_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))    \
  /* dx = dy y (1 - y) */                                                                      \
  X(sigmoid_bwd, (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n), \
    (c, dx, dy, y, n))                                                                         \
  /* y = tanh x */                                                                             \
  X(tanh_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))       \
  /* dx = dy (1 - y^2) */                                                                      \
  X(tanh_bwd, (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n),   \
    (c, dx, dy, y, n))                                                                         \
  /* mask[i] = (uniform draw from rng >= ratio) ? scale : 0, n draws in order */               \
  X(dropout_mask,                                                                              \
    (const kiln_op_ctx *c, float *mask, int64_t n, float ratio, float scale, kiln_rng *rng),    \
    (c, mask, n, ratio, scale, rng))                                                           \
  /* y = a * b element by element (y may be a or b) */                                         \
  X(mul, (const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n),          \
    (c, y, a, b, n))

/* src/ops/matmul.c: products and the bias rows of dense layers. */
#define KILN_OPS_MATMUL(X)                                                                      \
  /* C (M x N, ldc apart) = alpha op(A) op(B) + beta C, row-major; op(A) is M x K, op(B) K x N;  \
   * on c->nthreads 1 it runs on one thread (OpenBLAS and oneDNN held to one for the call) */   \
  X(gemm,                                                                                      \
    (const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda, const float *B, \
     int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta),  \
    (c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta))                                  \
  /* y[m][n] += b[n] for M rows of N */                                                        \
  X(add_bias_rows, (const kiln_op_ctx *c, float *y, const float *b, int64_t M, int64_t N),      \
    (c, y, b, M, N))                                                                           \
  /* db[n] += sum over m of dy[m][n], rows in order */                                         \
  X(sum_rows_into, (const kiln_op_ctx *c, float *db, const float *dy, int64_t M, int64_t N),    \
    (c, db, dy, M, N))                                                                         \
  /* y (M x N) = X op(W) + b (b may be NULL) for X the M x K rows of a CSR matrix; W is N x K,  \
   * or K x N when transposed */                                                               \
  X(csr_matmul,                                                                                \
    (const kiln_op_ctx *c, float *y, const kiln_csr *x, const float *w, const float *b,        \
     int64_t M, int64_t N, int64_t K, bool transposed),                                        \
    (c, y, x, w, b, M, N, K, transposed))                                                      \
  /* dW += dY^T X (W N x K), or X^T dY (transposed, W K x N), over X's entries */               \
  X(csr_weight_grad,                                                                           \
    (const kiln_op_ctx *c, float *dw, const kiln_csr *x, const float *dy, int64_t M,           \
     int64_t N, int64_t K, bool transposed),                                                   \
    (c, dw, x, dy, M, N, K, transposed))

/* src/ops/conv_route.c: convolution routes (the kernels a backend takes for one layer's shape and
 * its state: oneDNN's primitives), the im2col route as kernels, pooling, the plane-wise bias. */
#define KILN_OPS_CONV(X)                                                                        \
  /* *route (NULL: made) for spec, kept where spec is what it was made for; info filled */     \
  X(conv_route_update,                                                                         \
    (const kiln_op_ctx *c, kiln_conv_route **route, const kiln_conv_spec *spec,                \
     kiln_conv_route_info *info),                                                              \
    (c, route, spec, info))                                                                    \
  /* frees a route (NULL: nothing) */                                                          \
  X(conv_route_free, (const kiln_op_ctx *c, kiln_conv_route *route), (c, route))               \
  /* y = conv(x, w) + b (b may be NULL) by the route; ws: info.workspace_floats */             \
  X(conv_fwd,                                                                                  \
    (const kiln_op_ctx *c, const kiln_conv_route *route, float *y, const float *x,             \
     const float *w, const float *b, float *ws),                                               \
    (c, route, y, x, w, b, ws))                                                                \
  /* dx = (NULL: skipped), dw +=, db += (NULL: skipped), from dy */                            \
  X(conv_bwd,                                                                                  \
    (const kiln_op_ctx *c, const kiln_conv_route *route, float *dx, float *dw, float *db,      \
     const float *dy, const float *x, const float *w, float *ws),                              \
    (c, route, dx, dw, db, dy, x, w, ws))                                                      \
  /* kiln_conv2d_forward: im2col + GEMM, threads over the batch; ws:                          \
   * kiln_im2col_conv_workspace */                                                             \
  X(im2col_conv_fwd,                                                                           \
    (const kiln_op_ctx *c, float *y, const float *x, const float *w, const float *b, int N,    \
     int M, int group, const kiln_conv_geom *g, float *ws),                                    \
    (c, y, x, w, b, N, M, group, g, ws))                                                       \
  /* kiln_conv2d_backward: dx = (may be NULL), dw += (may be NULL), db += (may be NULL) */     \
  X(im2col_conv_bwd,                                                                           \
    (const kiln_op_ctx *c, float *dx, float *dw, float *db, const float *dy, const float *x,   \
     const float *w, int N, int M, int group, const kiln_conv_geom *g, float *ws),             \
    (c, dx, dw, db, dy, x, w, N, M, group, g, ws))                                             \
  /* y[n][m][i] += b[m] over N x M planes of P */                                              \
  X(plane_bias_add,                                                                            \
    (const kiln_op_ctx *c, float *y, const float *b, int64_t N, int64_t M, int64_t P),         \
    (c, y, b, N, M, P))                                                                        \
  /* db[m] += the sum over n and i of dy[n][m][i], in double */                                \
  X(plane_bias_grad,                                                                           \
    (const kiln_op_ctx *c, float *db, const float *dy, int64_t N, int64_t M, int64_t P),       \
    (c, db, dy, N, M, P))                                                                      \
  /* Im2col of N images (col: N x C kh kw x OH OW) and its inverse (x overwritten) */          \
  X(im2col, (const kiln_op_ctx *c, float *col, const float *x, int64_t N, const kiln_conv_geom *g), \
    (c, col, x, N, g))                                                                         \
  X(col2im, (const kiln_op_ctx *c, float *x, const float *col, int64_t N, const kiln_conv_geom *g), \
    (c, x, col, N, g))                                                                         \
  /* MAX (the window's argmax into mask) or AVE pooling, Caffe's rules, either layout */      \
  X(pool_fwd,                                                                                  \
    (const kiln_op_ctx *c, float *y, int32_t *mask, const float *x, int N,                     \
     const kiln_conv_geom *g, bool max, int layout),                                           \
    (c, y, mask, x, N, g, max, layout))                                                        \
  /* dx = (overwritten) its gradient */                                                        \
  X(pool_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, const int32_t *mask, int N,             \
     const kiln_conv_geom *g, bool max, int layout),                                           \
    (c, dx, dy, mask, N, g, max, layout))

/* src/ops/neuron.c: the other element-wise functions of one input (AbsVal, ELU, BNLL, Threshold,
 * Exp, Log, Power, PReLU, Swish, GELU) and their gradients. */
#define KILN_OPS_NEURON(X)                                                                      \
  /* y = |x| */                                                                                 \
  X(absval_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))      \
  /* dx = sign(x) dy, sign(0) = 0 (Caffe's caffe_cpu_sign) */                                   \
  X(absval_bwd,                                                                                 \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n),              \
    (c, dx, dy, x, n))                                                                          \
  /* y = x > 0 ? x : alpha (e^x - 1), through expm1 */                                          \
  X(elu_fwd,                                                                                    \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float alpha),                   \
    (c, y, x, n, alpha))                                                                        \
  /* dx = x > 0 ? dy : dy alpha e^x */                                                          \
  X(elu_bwd,                                                                                    \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n, float alpha), \
    (c, dx, dy, x, n, alpha))                                                                   \
  /* y = log(1 + e^x) in double, as x + log(1 + e^-x) for x > 0 */                              \
  X(bnll_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))        \
  /* dx = dy e / (e + 1) in double, e = e^min(x, 50) */                                         \
  X(bnll_bwd,                                                                                   \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n),              \
    (c, dx, dy, x, n))                                                                          \
  /* y = x > t ? 1 : 0 */                                                                       \
  X(threshold_fwd,                                                                              \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float t),                       \
    (c, y, x, n, t))                                                                            \
  /* y = outer e^(inner x) */                                                                   \
  X(exp_fwd,                                                                                    \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float inner, float outer),      \
    (c, y, x, n, inner, outer))                                                                 \
  /* dx = y dy inner, y the output */                                                           \
  X(exp_bwd,                                                                                    \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n, float inner), \
    (c, dx, dy, y, n, inner))                                                                   \
  /* y = ln(scale x + shift) base_scale */                                                      \
  X(log_fwd,                                                                                    \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float scale, float shift,       \
     float base_scale),                                                                         \
    (c, y, x, n, scale, shift, base_scale))                                                     \
  /* dx = dy (bscale / (scale x + shift)) */                                                    \
  X(log_bwd,                                                                                    \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n, float scale,  \
     float shift, float bscale),                                                                \
    (c, dx, dy, x, n, scale, shift, bscale))                                                    \
  /* y = (scale x + shift)^power; power scale 0: shift^power (1 for power 0), x not read;       \
   * power 1: scale x + shift */                                                                \
  X(power_fwd,                                                                                  \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float power, float scale,       \
     float shift),                                                                              \
    (c, y, x, n, power, scale, shift))                                                          \
  /* dx = power scale (scale x + shift)^(power - 1) dy; power scale 0 or power 1: power         \
   * scale dy, x not read (may be NULL) */                                                      \
  X(power_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n, float power,  \
     float scale, float shift),                                                                 \
    (c, dx, dy, x, n, power, scale, shift))                                                     \
  /* y = x > 0 ? x : a[k] x, k the channel of x as N x C x D; shared: a[0] for all */           \
  X(prelu_fwd,                                                                                  \
    (const kiln_op_ctx *c, float *y, const float *x, const float *a, int64_t N, int64_t C,      \
     int64_t D, bool shared),                                                                   \
    (c, y, x, a, N, C, D, shared))                                                              \
  /* dx = x > 0 ? dy : a[k] dy (dx may be dy) */                                                \
  X(prelu_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, const float *a,          \
     int64_t N, int64_t C, int64_t D, bool shared),                                             \
    (c, dx, dy, x, a, N, C, D, shared))                                                         \
  /* da[k] += sum over x <= 0 of dy x, each channel k in double in image order into sums (C     \
   * doubles of scratch); shared: da[0] += the channel sums in order */                         \
  X(prelu_slope_bwd,                                                                            \
    (const kiln_op_ctx *c, float *da, const float *x, const float *dy, double *sums, int64_t N, \
     int64_t C, int64_t D, bool shared),                                                        \
    (c, da, x, dy, sums, N, C, D, shared))                                                      \
  /* y = x sigmoid(beta x) */                                                                   \
  X(swish_fwd,                                                                                  \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float beta),                    \
    (c, y, x, n, beta))                                                                         \
  /* dx = dy (s + beta x s (1 - s)), s = sigmoid(beta x) */                                     \
  X(swish_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n, float beta),  \
    (c, dx, dy, x, n, beta))                                                                    \
  /* y = x Phi(x), or with approx_tanh x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) */            \
  X(gelu_fwd,                                                                                   \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t n, bool approx_tanh),              \
    (c, y, x, n, approx_tanh))                                                                  \
  /* dx = dy GELU'(x), of the same form */                                                      \
  X(gelu_bwd,                                                                                   \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t n,               \
     bool approx_tanh),                                                                         \
    (c, dx, dy, x, n, approx_tanh))

/* What a Reduction takes of each value before it sums (Caffe's ReductionOp, MEAN being SUM with
 * coeff / dim). */
typedef enum { KILN_REDUCE_SUM, KILN_REDUCE_ASUM, KILN_REDUCE_SUMSQ } kiln_reduce_kind;

/* src/ops/batch_norm.c (BatchNorm) and src/ops/norm.c (Scale, Bias, LayerNorm, LRN, MVN and
 * Reduction). A per-channel op over N x C x S values (S: everything after the channel axis)
 * takes `block`: 0 for the plain layout, 16 for oneDNN's nChw16c (C a multiple of 16; include/
 * kiln/core.h). Every sum is in double and in an order fixed by the sizes, never by the thread
 * count. */
#define KILN_OPS_NORM(X)                                                                        \
  /* BatchNorm: mean[c] and inv[c] = 1 / sqrt(var + eps) of the batch (biased var), the       \
   * running sums updated (run_mean = maf run_mean + mean, run_var = maf run_var + unbiased     \
   * var, run_count = maf run_count + 1); with global, both from the running sums over          \
   * run_count, which stay; xn = (x - mean) inv, y = xn, or with gamma y = z > 0 ? z : slope z  \
   * for z = xn gamma + beta (the fused Scale and ReLU; slope 1: no ReLU); scratch:             \
   * kiln_batch_norm_scratch(N, C) bytes; y may be x */                                         \
  X(batch_norm_fwd,                                                                             \
    (const kiln_op_ctx *c, float *y, float *xn, float *mean, float *inv, float *run_mean,      \
     float *run_var, float *run_count, void *scratch, const float *x, const float *gamma,      \
     const float *beta, int64_t N, int64_t C, int64_t S, int block, bool global, float maf,     \
     float eps, float slope),                                                                   \
    (c, y, xn, mean, inv, run_mean, run_var, run_count, scratch, x, gamma, beta, N, C, S, block, \
     global, maf, eps, slope))                                                                  \
  /* batch_norm_fwd's xn and y again from x and the mean and inv it left (the same bits) */     \
  X(batch_norm_apply,                                                                           \
    (const kiln_op_ctx *c, float *y, float *xn, const float *x, const float *mean,              \
     const float *inv, const float *gamma, const float *beta, int64_t N, int64_t C, int64_t S,  \
     int block, float slope),                                                                   \
    (c, y, xn, x, mean, inv, gamma, beta, N, C, S, block, slope))                               \
  /* dz = dy, or with gamma dy where xn gamma + beta > 0 and slope dy elsewhere; with gamma     \
   * dgamma += sum of dz xn and dbeta += sum of dz per channel; dx (NULL: none; may be dy) =    \
   * (dz g - mean(dz g) - xn mean(dz g xn)) inv with batch statistics, dz g inv with global,    \
   * g = gamma or 1; scratch as batch_norm_fwd's */                                             \
  X(batch_norm_bwd,                                                                             \
    (const kiln_op_ctx *c, float *dx, float *dgamma, float *dbeta, void *scratch,               \
     const float *dy, const float *xn, const float *inv, const float *gamma, const float *beta, \
     int64_t N, int64_t C, int64_t S, int block, bool global, float slope),                     \
    (c, dx, dgamma, dbeta, scratch, dy, xn, inv, gamma, beta, N, C, S, block, global, slope))   \
  /* y = x gamma[d] + beta[d] (+ 0 without beta) over outer x dim x inner, block 16 with dim    \
   * the channels; keep (or NULL) = x; y may be x */                                            \
  X(scale_fwd,                                                                                  \
    (const kiln_op_ctx *c, float *y, float *keep, const float *x, const float *gamma,           \
     const float *beta, int64_t outer, int64_t dim, int64_t inner, int block),                  \
    (c, y, keep, x, gamma, beta, outer, dim, inner, block))                                     \
  /* dgamma[d] (+= with accumulate, = without; or NULL) = sum of dy x, dbeta[d] (or NULL) +=    \
   * sum of dy, then dx (or NULL; may be dy) = dy gamma[d] */                                   \
  X(scale_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, float *dgamma, float *dbeta, const float *dy,             \
     const float *x, const float *gamma, int64_t outer, int64_t dim, int64_t inner, int block,  \
     bool accumulate),                                                                          \
    (c, dx, dgamma, dbeta, dy, x, gamma, outer, dim, inner, block, accumulate))                 \
  /* y = x + b[d] over outer x dim x inner; y may be x */                                       \
  X(bias_fwd,                                                                                   \
    (const kiln_op_ctx *c, float *y, const float *x, const float *b, int64_t outer,             \
     int64_t dim, int64_t inner),                                                               \
    (c, y, x, b, outer, dim, inner))                                                            \
  /* db[d] (+= with accumulate, = without) = sum of dy over outer and inner, in order */        \
  X(bias_bwd,                                                                                   \
    (const kiln_op_ctx *c, float *db, const float *dy, int64_t outer, int64_t dim,              \
     int64_t inner, bool accumulate),                                                           \
    (c, db, dy, outer, dim, inner, accumulate))                                                 \
  /* per row of K of M rows: rstd = 1 / sqrt(biased var + eps), xhat = (x - mean) rstd,         \
   * y = xhat gain + bias (bias NULL: none; gain NULL: y = xhat, neither); y may be x */        \
  X(layer_norm_fwd,                                                                             \
    (const kiln_op_ctx *c, float *y, float *xhat, float *rstd, const float *x,                  \
     const float *gain, const float *bias, int64_t M, int64_t K, float eps),                    \
    (c, y, xhat, rstd, x, gain, bias, M, K, eps))                                               \
  /* dgain += sum over rows of dy xhat and dbias (or NULL) += of dy (dgain NULL: neither); dx   \
   * (or NULL; may be dy) = rstd (dh - mean(dh) - xhat mean(dh xhat)), dh = dy gain (or dy) */  \
  X(layer_norm_bwd,                                                                             \
    (const kiln_op_ctx *c, float *dx, float *dgain, float *dbias, const float *dy,              \
     const float *xhat, const float *rstd, const float *gain, int64_t M, int64_t K),            \
    (c, dx, dgain, dbias, dy, xhat, rstd, gain, M, K))                                          \
  /* scale = k + alpha_over_n (sum of x^2 over the window of `size` around each value of        \
   * N x C x H x W: across channels, or a size x size square within one, zero padded),          \
   * y = x scale^-beta; y may be x */                                                           \
  X(lrn_fwd,                                                                                    \
    (const kiln_op_ctx *c, float *y, float *scale, const float *x, int64_t N, int64_t C,        \
     int64_t H, int64_t W, int64_t size, bool across, float alpha_over_n, float beta, float k), \
    (c, y, scale, x, N, C, H, W, size, across, alpha_over_n, beta, k))                          \
  /* dx = dy scale^-beta - 2 alpha_over_n beta x (window sum of dy x scale^(-beta-1)); ws:     \
   * 2 C H W floats of scratch; dx may be dy */                                                 \
  X(lrn_bwd,                                                                                    \
    (const kiln_op_ctx *c, float *dx, float *ws, const float *dy, const float *x,               \
     const float *scale, int64_t N, int64_t C, int64_t H, int64_t W, int64_t size, bool across, \
     float alpha_over_n, float beta),                                                           \
    (c, dx, ws, dy, x, scale, N, C, H, W, size, across, alpha_over_n, beta))                    \
  /* per row of dim of `rows`: y = x - mean, and with normalize y / sd, sd[r] = sqrt(mean(y^2)) \
   * + eps (1 without); y may be x */                                                           \
  X(mvn_fwd,                                                                                    \
    (const kiln_op_ctx *c, float *y, float *sd, const float *x, int64_t rows, int64_t dim,      \
     bool normalize, float eps),                                                                \
    (c, y, sd, x, rows, dim, normalize, eps))                                                   \
  /* dx = (dy - mean(dy) - y mean(y dy)) / sd with normalize, dy - mean(dy) without, y the      \
   * output; dx may be dy */                                                                    \
  X(mvn_bwd,                                                                                    \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, const float *sd,         \
     int64_t rows, int64_t dim, bool normalize),                                                \
    (c, dx, dy, y, sd, rows, dim, normalize))                                                   \
  /* y[n] = coeff (sum of x, of |x| or of x^2, by kind) over row n of dim */                    \
  X(reduction_fwd,                                                                              \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t num, int64_t dim,                  \
     kiln_reduce_kind kind, float coeff),                                                       \
    (c, y, x, num, dim, kind, coeff))                                                           \
  /* dx = coeff dy[n] times 1, sign(x) (sign(0) = 0) or 2 x, by kind */                         \
  X(reduction_bwd,                                                                              \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *x, int64_t num,             \
     int64_t dim, kiln_reduce_kind kind, float coeff),                                          \
    (c, dx, dy, x, num, dim, kind, coeff))

/* Bytes of scratch batch_norm_fwd and batch_norm_bwd take: by 16-channel block, two sums of 16
 * doubles for each chunk of KILN_BN_CHUNK images and the block's 16 means, then two floats a
 * channel. The chunk is fixed, so the order of the additions does not follow the threads. */
#define KILN_BN_CHUNK 8
static inline size_t kiln_batch_norm_scratch(int64_t N, int64_t C) {
  const int64_t blocks = (C + 15) / 16, chunks = (N + KILN_BN_CHUNK - 1) / KILN_BN_CHUNK;
  return sizeof(double) * (size_t)(blocks * chunks * 32 + blocks * 16) +
         sizeof(float) * (size_t)(2 * C);
}

/* src/ops/l2norm.c: Normalize (the SSD fork's L2 normalisation) over N x C x S values (S:
 * everything after the channel axis), plain layout. A group is the C values at one (n, s), or
 * (across) one image's C x S; its norm is sqrt(sum of x^2 over it + eps). Every sum is in double,
 * in an order fixed by the sizes, never by the thread count. */
#define KILN_OPS_L2NORM(X)                                                                      \
  /* norm[g] of each group (N x S values, or N across); y = x / norm[g] * scale[c] (scale[0]   \
   * with shared) */                                                                            \
  X(l2norm_fwd,                                                                                 \
    (const kiln_op_ctx *c, float *y, float *norm, const float *x, const float *scale,           \
     int64_t N, int64_t C, int64_t S, bool across, bool shared, float eps),                     \
    (c, y, norm, x, scale, N, C, S, across, shared, eps))                                       \
  /* from l2norm_fwd's norm, with d = dy scale[c] (scale[0] with shared): dscale[c] (dscale[0]  \
   * with shared; NULL: none) += sum of dy x / norm[g] over the channel's values (all values   \
   * with shared); dx (NULL: none) = (d - x k[g]) / norm[g], k[g] = (sum over the group of      \
   * d x) / norm[g]^2; ws: 2 C floats when dscale and shared, else unused (NULL) */             \
  X(l2norm_bwd,                                                                                 \
    (const kiln_op_ctx *c, float *dx, float *dscale, float *ws, const float *dy,                \
     const float *x, const float *norm, const float *scale, int64_t N, int64_t C, int64_t S,    \
     bool across, bool shared),                                                                 \
    (c, dx, dscale, ws, dy, x, norm, scale, N, C, S, across, shared))

/* How a loss is divided (Caffe's LossParameter.NormalizationMode, in its order): by every
 * position, by the positions whose label is not ignored, by the batch (the first axis), or not
 * at all; never by less than 1. */
typedef enum { KILN_LOSS_FULL, KILN_LOSS_VALID, KILN_LOSS_BATCH, KILN_LOSS_NONE } kiln_loss_norm;

/* src/ops/loss.c: softmax and the loss and metric layers' arithmetic. A loss is written to
 * loss[0] and a gradient reads the loss's own gradient from dloss[0], both device tensors of one
 * value; losses are summed in one fixed order. */
#define KILN_OPS_LOSS(X)                                                                       \
  /* y = softmax over the C values (inner apart) of each of the outer x inner columns of x     \
   * (outer, C, inner); y may be x */                                                          \
  X(softmax_fwd,                                                                               \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t outer, int64_t C, int64_t inner), \
    (c, y, x, outer, C, inner))                                                                \
  /* dx = y (dy - sum over C of dy y), column by column; dx may be dy */                       \
  X(softmax_bwd,                                                                               \
    (const kiln_op_ctx *c, float *dx, const float *y, const float *dy, int64_t outer,          \
     int64_t C, int64_t inner),                                                                \
    (c, dx, y, dy, outer, C, inner))                                                           \
  /* loss[0] = -sum of log max(prob[label], FLT_MIN) over the labels (outer, inner) not        \
   * ignored, / norm; a label that is no class in [0, C) is KILN_ERR_DATA */                   \
  X(softmax_loss_fwd,                                                                          \
    (const kiln_op_ctx *c, float *loss, const float *prob, const float *label, int64_t outer,  \
     int64_t C, int64_t inner, bool has_ignore, int ignore, kiln_loss_norm norm),              \
    (c, loss, prob, label, outer, C, inner, has_ignore, ignore, norm))                         \
  /* dx = (prob - onehot(label)) dloss[0] / norm, 0 at ignored positions (labels as forward    \
   * checked them) */                                                                          \
  X(softmax_loss_bwd,                                                                          \
    (const kiln_op_ctx *c, float *dx, const float *prob, const float *label,                   \
     const float *dloss, int64_t outer, int64_t C, int64_t inner, bool has_ignore, int ignore, \
     kiln_loss_norm norm),                                                                     \
    (c, dx, prob, label, dloss, outer, C, inner, has_ignore, ignore, norm))                    \
  /* acc[0] = the share of counted labels with fewer than top_k other classes scoring at least \
   * theirs; per_class (C, or NULL) the same per class, class_count (C) its counts */          \
  X(accuracy_fwd,                                                                              \
    (const kiln_op_ctx *c, float *acc, float *per_class, float *class_count, const float *x,   \
     const float *label, int64_t outer, int64_t C, int64_t inner, int top_k, bool has_ignore,  \
     int ignore),                                                                              \
    (c, acc, per_class, class_count, x, label, outer, C, inner, top_k, has_ignore, ignore))    \
  /* tp[0], fp[0], fn[0] = class `positive`'s counts under the top-1 class (the first of equal \
   * highest scores), over the counted labels */                                               \
  X(f1_fwd,                                                                                    \
    (const kiln_op_ctx *c, float *tp, float *fp, float *fn, const float *x,                    \
     const float *label, int64_t outer, int64_t C, int64_t inner, int positive,                \
     bool has_ignore, int ignore),                                                             \
    (c, tp, fp, fn, x, label, outer, C, inner, positive, has_ignore, ignore))                  \
  /* loss[0] = -sum over n of log max(p[n, label n], 1e-20) / N, p (N, dim) */                 \
  X(multinomial_loss_fwd,                                                                      \
    (const kiln_op_ctx *c, float *loss, const float *p, const float *label, int64_t N,         \
     int64_t dim),                                                                             \
    (c, loss, p, label, N, dim))                                                               \
  /* dp = -dloss[0] / N / max(p, 1e-20) at each label, 0 elsewhere */                          \
  X(multinomial_loss_bwd,                                                                      \
    (const kiln_op_ctx *c, float *dp, const float *p, const float *label, const float *dloss,  \
     int64_t N, int64_t dim),                                                                  \
    (c, dp, p, label, dloss, N, dim))                                                          \
  /* loss[0] = -sum over counted positions of sum_k H[label, k] log max(prob_k, 1e-20),        \
   * / norm; H (C, C) */                                                                       \
  X(infogain_loss_fwd,                                                                         \
    (const kiln_op_ctx *c, float *loss, const float *prob, const float *label, const float *H, \
     int64_t outer, int64_t C, int64_t inner, bool has_ignore, int ignore,                     \
     kiln_loss_norm norm),                                                                     \
    (c, loss, prob, label, H, outer, C, inner, has_ignore, ignore, norm))                      \
  /* dx_k = (prob_k sum_j H[label, j] - H[label, k]) dloss[0] / norm, 0 where ignored */       \
  X(infogain_loss_bwd,                                                                         \
    (const kiln_op_ctx *c, float *dx, const float *prob, const float *label, const float *H,   \
     const float *dloss, int64_t outer, int64_t C, int64_t inner, bool has_ignore, int ignore, \
     kiln_loss_norm norm),                                                                     \
    (c, dx, prob, label, H, dloss, outer, C, inner, has_ignore, ignore, norm))                 \
  /* loss[0] = sum of m (l2: m^2) / N, m = max(0, 1 + s x), s -1 at the label, +1 elsewhere */ \
  X(hinge_loss_fwd,                                                                            \
    (const kiln_op_ctx *c, float *loss, const float *x, const float *label, int64_t N,         \
     int64_t dim, bool l2),                                                                    \
    (c, loss, x, label, N, dim, l2))                                                           \
  /* dx = s (m > 0) dloss[0] / N (l2: 2 s m dloss[0] / N) */                                   \
  X(hinge_loss_bwd,                                                                            \
    (const kiln_op_ctx *c, float *dx, const float *x, const float *label, const float *dloss,  \
     int64_t N, int64_t dim, bool l2),                                                         \
    (c, dx, x, label, dloss, N, dim, l2))                                                      \
  /* loss[0] = sum of max(x, 0) - x t + log(1 + e^-|x|) over the n targets t whose integer     \
   * part is not ignore, / norm (batch: the first axis) */                                     \
  X(sigmoid_ce_fwd,                                                                            \
    (const kiln_op_ctx *c, float *loss, const float *x, const float *t, int64_t n,             \
     int64_t batch, bool has_ignore, int ignore, kiln_loss_norm norm),                         \
    (c, loss, x, t, n, batch, has_ignore, ignore, norm))                                       \
  /* dx = (sigmoid(x) - t) dloss[0] / norm, 0 where t is ignored */                            \
  X(sigmoid_ce_bwd,                                                                            \
    (const kiln_op_ctx *c, float *dx, const float *x, const float *t, const float *dloss,      \
     int64_t n, int64_t batch, bool has_ignore, int ignore, kiln_loss_norm norm),              \
    (c, dx, x, t, dloss, n, batch, has_ignore, ignore, norm))                                  \
  /* loss[0] = sum of (a - b)^2 / N / 2 over n values */                                       \
  X(euclidean_loss_fwd,                                                                        \
    (const kiln_op_ctx *c, float *loss, const float *a, const float *b, int64_t n, int64_t N), \
    (c, loss, a, b, n, N))                                                                     \
  /* da = (a - b) dloss[0] / N, db = -da (either may be NULL: not wanted) */                   \
  X(euclidean_loss_bwd,                                                                        \
    (const kiln_op_ctx *c, float *da, float *db, const float *a, const float *b,               \
     const float *dloss, int64_t n, int64_t N),                                                \
    (c, da, db, a, b, dloss, n, N))                                                            \
  /* dist_sq[n] = |a_n - b_n|^2 (a, b N x C); loss[0] = sum of sim ? d^2 :                     \
   * max(margin - d, 0)^2 (legacy: max(margin - d^2, 0)), / 2N */                              \
  X(contrastive_loss_fwd,                                                                      \
    (const kiln_op_ctx *c, float *loss, float *dist_sq, const float *a, const float *b,        \
     const float *sim, int64_t N, int64_t C, float margin, bool legacy),                       \
    (c, loss, dist_sq, a, b, sim, N, C, margin, legacy))                                       \
  /* da = g (a - b) for similar pairs, -g (margin - d) / (d + 1e-4) (a - b) within the margin  \
   * (legacy: -g (a - b)), else 0, g = dloss[0] / N; db = -da (either may be NULL) */          \
  X(contrastive_loss_bwd,                                                                      \
    (const kiln_op_ctx *c, float *da, float *db, const float *a, const float *b,               \
     const float *sim, const float *dist_sq, const float *dloss, int64_t N, int64_t C,         \
     float margin, bool legacy),                                                               \
    (c, da, db, a, b, sim, dist_sq, dloss, N, C, margin, legacy))

/* src/ops/arrange.c: Eltwise, Concat, Slice, Embed, Tile, ArgMax, Permute and the other layers
 * that move, gather or combine values. s(z) below is a fused ReLU's select, z > 0 ? z : slope z
 * (slope 1: none). */
#define KILN_OPS_ARRANGE(X)                                                                     \
  /* y = v (n floats) */                                                                       \
  X(fill, (const kiln_op_ctx *c, float *y, float v, int64_t n), (c, y, v, n))                  \
  /* y = a x (y may be x) */                                                                   \
  X(scale, (const kiln_op_ctx *c, float *y, const float *x, float a, int64_t n), (c, y, x, a, n)) \
  /* y = a + b */                                                                              \
  X(add, (const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n),          \
    (c, y, a, b, n))                                                                           \
  /* y += x */                                                                                 \
  X(acc, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))            \
  /* y = s(c0 x0 + c1 x1) */                                                                   \
  X(eltwise_sum2,                                                                              \
    (const kiln_op_ctx *c, float *y, const float *x0, float c0, const float *x1, float c1,     \
     int64_t n, float slope),                                                                  \
    (c, y, x0, c0, x1, c1, n, slope))                                                          \
  /* y = s(y + cx x) */                                                                        \
  X(eltwise_sum_acc,                                                                           \
    (const kiln_op_ctx *c, float *y, const float *x, float cx, int64_t n, float slope),        \
    (c, y, x, cx, n, slope))                                                                   \
  /* y = xs[0] xs[1] ... xs[nb-1], multiplied in that order */                                 \
  X(eltwise_prod, (const kiln_op_ctx *c, float *y, const float *const *xs, int nb, int64_t n), \
    (c, y, xs, nb, n))                                                                         \
  /* y = the largest of xs (xs[1] wins a tie with xs[0], later ones must be greater); arg = its \
   * index as a float */                                                                       \
  X(eltwise_max,                                                                               \
    (const kiln_op_ctx *c, float *y, float *arg, const float *const *xs, int nb, int64_t n),   \
    (c, y, arg, xs, nb, n))                                                                    \
  /* dx = dy times the product of xs but xs[b] (stable), or dy y / xs[b] */                    \
  X(eltwise_prod_bwd,                                                                          \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, const float *const *xs, \
     int nb, int b, int64_t n, bool stable),                                                   \
    (c, dx, dy, y, xs, nb, b, n, stable))                                                      \
  /* dx = arg == b ? dy : 0 */                                                                 \
  X(eltwise_max_bwd,                                                                           \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *arg, int b, int64_t n),    \
    (c, dx, dy, arg, b, n))                                                                    \
  /* dx = cx (y > 0 ? dy : slope dy) */                                                        \
  X(relu_scale_bwd,                                                                            \
    (const kiln_op_ctx *c, float *dx, float cx, const float *dy, const float *y, int64_t n,    \
     float slope),                                                                             \
    (c, dx, cx, dy, y, n, slope))                                                              \
  /* d = y > 0 ? dy : slope dy; dx1 = c1 d, then dx0 = c0 d (either may be dy) */              \
  X(relu_scale2_bwd,                                                                           \
    (const kiln_op_ctx *c, float *dx0, float c0, float *dx1, float c1, const float *dy,        \
     const float *y, int64_t n, float slope),                                                  \
    (c, dx0, c0, dx1, c1, dy, y, n, slope))                                                    \
  /* for o < count: dst[o dst_stride ..] = src[o src_stride ..], block floats each */          \
  X(copy_blocks,                                                                               \
    (const kiln_op_ctx *c, float *dst, int64_t dst_stride, const float *src,                   \
     int64_t src_stride, int64_t block, int64_t count),                                        \
    (c, dst, dst_stride, src, src_stride, block, count))                                       \
  /* y = each of outer blocks of x (inner floats) repeated tiles times */                      \
  X(tile_fwd,                                                                                  \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t outer, int64_t tiles,             \
     int64_t inner),                                                                           \
    (c, y, x, outer, tiles, inner))                                                            \
  /* dx = the sum of each block's tiles of dy, in order */                                     \
  X(tile_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, int64_t outer, int64_t tiles,           \
     int64_t inner),                                                                           \
    (c, dx, dy, outer, tiles, inner))                                                          \
  /* small = big's window at offset (to_small), or that window = small; naxes of each shape */  \
  X(crop_copy,                                                                                 \
    (const kiln_op_ctx *c, float *small, float *big, int naxes, const int64_t *big_shape,      \
     const int64_t *small_shape, const int64_t *offset, bool to_small),                        \
    (c, small, big, naxes, big_shape, small_shape, offset, to_small))                          \
  /* index[0 .. *count) = the positions of sel's nonzero values, in order */                   \
  X(select_nonzero,                                                                            \
    (const kiln_op_ctx *c, int64_t *index, int64_t *count, const float *sel, int64_t n),       \
    (c, index, count, sel, n))                                                                 \
  /* row k of y (dim floats) = row index[k] of x */                                            \
  X(gather_rows,                                                                               \
    (const kiln_op_ctx *c, float *y, const float *x, const int64_t *index, int64_t nindex,     \
     int64_t dim),                                                                             \
    (c, y, x, index, nindex, dim))                                                             \
  /* row index[k] of dx = row k of dy */                                                       \
  X(scatter_rows,                                                                              \
    (const kiln_op_ctx *c, float *dx, const float *dy, const int64_t *index, int64_t nindex,   \
     int64_t dim),                                                                             \
    (c, dx, dy, index, nindex, dim))                                                           \
  /* gather_rows with float indices into `rows` rows (BatchReindex: checked, KILN_ERR_DATA) */  \
  X(gather_rows_at,                                                                            \
    (const kiln_op_ctx *c, float *y, const float *x, const float *index, int64_t nindex,       \
     int64_t rows, int64_t dim),                                                               \
    (c, y, x, index, nindex, rows, dim))                                                       \
  /* row index[k] of dx += row k of dy, k in order (indices checked) */                        \
  X(scatter_add_rows_at,                                                                       \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *index, int64_t nindex,     \
     int64_t rows, int64_t dim),                                                               \
    (c, dx, dy, index, nindex, rows, dim))                                                     \
  /* row m of y (N) = row index[m] of W (K x N) + b (b may be NULL); an index that is not a    \
   * whole number in [0, K) is KILN_ERR_INVALID naming it */                                   \
  X(embed_fwd,                                                                                 \
    (const kiln_op_ctx *c, float *y, const float *w, const float *b, const float *index,       \
     int64_t M, int64_t N, int64_t K),                                                         \
    (c, y, w, b, index, M, N, K))                                                              \
  /* row index[m] of dW += row m of dy, positions in order (indices checked first) */          \
  X(embed_bwd,                                                                                 \
    (const kiln_op_ctx *c, float *dw, const float *dy, const float *index, int64_t M,          \
     int64_t N, int64_t K),                                                                    \
    (c, dw, dy, index, M, N, K))                                                               \
  /* ArgMax over dim values dist apart in each of num items: the top_k indices (or values, or  \
   * both) as Caffe lays them out; ws: kiln_argmax_workspace_bytes(dim) */                     \
  X(argmax_fwd,                                                                                \
    (const kiln_op_ctx *c, float *y, void *ws, const float *x, int64_t num, int64_t dim,       \
     int64_t dist, int64_t top_k, bool out_max_val, bool along_axis),                          \
    (c, y, ws, x, num, dim, dist, top_k, out_max_val, along_axis))                             \
  /* y = x with its axes reordered (Permute): y's axis i is x's axis order[i], of the naxes     \
   * axes of x's shape; n = x's count; y is not x */                                            \
  X(permute,                                                                                   \
    (const kiln_op_ctx *c, float *y, const float *x, int naxes, const int64_t *shape,          \
     const int *order, int64_t n),                                                             \
    (c, y, x, naxes, shape, order, n))

/* What SequencePool takes of each sequence's valid steps (Caffe's SequencePoolParameter.Pool, in
 * its order). */
typedef enum { KILN_SEQ_POOL_LAST, KILN_SEQ_POOL_MEAN, KILN_SEQ_POOL_MAX } kiln_seq_pool;

/* src/ops/sequence.c: the recurrent layers' steps (LSTM, RNN, GRU, LSTMUnit) and the packed
 * GEMMs of their per-step products, PositionalEncoding, SequencePool; src/ops/attention.c:
 * MultiHeadAttention's. Sequences are time-major: row t N + n is step t of stream n. An op that
 * runs GEMMs on c->nthreads 1 holds OpenBLAS and oneDNN to one thread for that call alone. */
#define KILN_OPS_SEQUENCE(X)                                                                    \
  /* *pg (NULL: made) for C (M x N, ldc apart) = A (M x K, lda apart) op(B) + beta C, op(B)    \
   * K x N read from B (ldb apart, tb: transposed), kept where it has this shape already; ref: \
   * OpenBLAS, cpu: oneDNN's matmul with B packed where it wins (kiln_packed_gemm) */          \
  X(packed_gemm_update,                                                                        \
    (const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M, int64_t N, int64_t K,    \
     int64_t lda, int64_t ldb, int64_t ldc, float beta),                                       \
    (c, pg, tb, M, N, K, lda, ldb, ldc, beta))                                                 \
  /* B for pg's products from now on (packed once; B must stay valid until the next) */        \
  X(packed_gemm_set_b, (const kiln_op_ctx *c, kiln_packed_gemm *pg, const float *B),           \
    (c, pg, B))                                                                                \
  /* C = A op(B) + beta C by pg */                                                             \
  X(packed_gemm_run, (const kiln_op_ctx *c, kiln_packed_gemm *pg, float *C, const float *A),   \
    (c, pg, C, A))                                                                             \
  /* frees pg (NULL: nothing) */                                                               \
  X(packed_gemm_free, (const kiln_op_ctx *c, kiln_packed_gemm *pg), (c, pg))                   \
  /* y[n][d] = m[n] x[n ldx + d] for N rows of H (m NULL: 0); y may be x when ldx is H */      \
  X(carry_rows,                                                                                \
    (const kiln_op_ctx *c, float *y, const float *x, int64_t ldx, const float *m, int64_t N,   \
     int64_t H),                                                                               \
    (c, y, x, ldx, m, N, H))                                                                   \
  /* LSTM cells of N streams of H (Caffe's LSTMUnit): gates (N x 4H: input, forget, output,    \
   * candidate) from pre-activations to values, f = cont sigmoid (0 where cont is 0; cont      \
   * NULL: all 0), cell = f c_prev + i g, h[n ldh + d] = o tanh(cell) */                        \
  X(lstm_cell_fwd,                                                                             \
    (const kiln_op_ctx *c, float *cell, float *h, int64_t ldh, float *gates,                   \
     const float *c_prev, const float *cont, int64_t N, int64_t H),                            \
    (c, cell, h, ldh, gates, c_prev, cont, N, H))                                              \
  /* its backward from dc and dh[n ldh + d] (+ dh2, N x H, where not NULL): dgates (N x 4H) and \
   * dc_prev (may be dc), each NULL where not wanted; f (1 - f) the forget gate's derivative */  \
  X(lstm_cell_bwd,                                                                             \
    (const kiln_op_ctx *c, float *dc_prev, float *dgates, const float *gates,                  \
     const float *cell, const float *c_prev, const float *dc, const float *dh, int64_t ldh,    \
     const float *dh2, int64_t N, int64_t H),                                                  \
    (c, dc_prev, dgates, gates, cell, c_prev, dc, dh, ldh, dh2, N, H))                         \
  /* GRU cells (PyTorch's): gates (N x 3H) holds the input terms gi and becomes (r, z, n), with \
   * r = sigmoid(gi_r + gh_r + bh_r), z likewise, ghn = gh_n + bh_n (N x H, kept), n =         \
   * tanh(gi_n + r ghn); h[n ldh + d] = (1 - z) n + z hp */                                    \
  X(gru_cell_fwd,                                                                              \
    (const kiln_op_ctx *c, float *h, int64_t ldh, float *ghn, float *gates, const float *gh,   \
     const float *bh, const float *hp, int64_t N, int64_t H),                                  \
    (c, h, ldh, ghn, gates, gh, bh, hp, N, H))                                                 \
  /* its backward, dh_t = dy[n ldy + d] + dh: d_in (N x 3H) = (dr, dz, dn) of the input terms, \
   * d_rec = (dr, dz, r dn) of the recurrent ones, then dh = dh_t z */                         \
  X(gru_cell_bwd,                                                                              \
    (const kiln_op_ctx *c, float *d_in, float *d_rec, float *dh, const float *dy, int64_t ldy, \
     const float *gates, const float *ghn, const float *hp, int64_t N, int64_t H),             \
    (c, d_in, d_rec, dh, dy, ldy, gates, ghn, hp, N, H))                                       \
  /* h = tanh h in place (kiln_vtanhf, the recurrent layers' tanh): an RNN step */             \
  X(rnn_step_fwd, (const kiln_op_ctx *c, float *h, int64_t n), (c, h, n))                      \
  /* d = (d + dh) (1 - h^2): an RNN step's pre-activation gradient */                          \
  X(rnn_step_bwd, (const kiln_op_ctx *c, float *d, const float *dh, const float *h, int64_t n), \
    (c, d, dh, h, n))                                                                          \
  /* out = tanh(out + b) (kiln_vtanhf) for M rows of H, then row m of y (ldy apart) = row m    \
   * of out */                                                                                 \
  X(rnn_out_fwd,                                                                               \
    (const kiln_op_ctx *c, float *y, int64_t ldy, float *out, const float *b, int64_t M,       \
     int64_t H),                                                                               \
    (c, y, ldy, out, b, M, H))                                                                 \
  /* dz[m][d] = dy[m ldy + d] (1 - out[m][d]^2) for M rows of H */                             \
  X(rnn_out_bwd,                                                                               \
    (const kiln_op_ctx *c, float *dz, const float *dy, int64_t ldy, const float *out,          \
     int64_t M, int64_t H),                                                                    \
    (c, dz, dy, ldy, out, M, H))                                                               \
  /* rows [from, T) of the sinusoidal table (T x D): sin(t / 10000^(2i/D)) at 2i, cos at      \
   * 2i + 1, in double */                                                                      \
  X(sinusoid_table,                                                                            \
    (const kiln_op_ctx *c, float *table, int64_t from, int64_t T, int64_t D),                  \
    (c, table, from, T, D))                                                                    \
  /* y[t][n][:] = x[t][n][:] + v[t][:] over T x N x D (y may be x) */                          \
  X(step_add,                                                                                  \
    (const kiln_op_ctx *c, float *y, const float *x, const float *v, int64_t T, int64_t N,     \
     int64_t D),                                                                               \
    (c, y, x, v, T, N, D))                                                                     \
  /* dv[t][:] += dy[t][n][:] for n in order */                                                 \
  X(step_sum_into,                                                                             \
    (const kiln_op_ctx *c, float *dv, const float *dy, int64_t T, int64_t N, int64_t D),       \
    (c, dv, dy, T, N, D))                                                                      \
  /* y (N x D) = the last, the mean (in double) or the max of x (T x N x D) over each          \
   * sequence's valid steps (mask T x N: 1 valid, 0 padding; NULL: all valid); MAX: arg (N x D) \
   * = the winning steps; a sequence with no valid step is KILN_ERR_DATA naming it */           \
  X(seq_pool_fwd,                                                                              \
    (const kiln_op_ctx *c, float *y, float *arg, const float *x, const float *mask, int64_t T, \
     int64_t N, int64_t D, kiln_seq_pool pool),                                                \
    (c, y, arg, x, mask, T, N, D, pool))                                                       \
  /* dx (T x N x D) = dy at the steps seq_pool_fwd took (MEAN: dy / the valid steps at each),  \
   * 0 elsewhere */                                                                            \
  X(seq_pool_bwd,                                                                              \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *arg, const float *mask,    \
     int64_t T, int64_t N, int64_t D, kiln_seq_pool pool),                                     \
    (c, dx, dy, arg, mask, T, N, D, pool))                                                     \
  /* gemm's product in fixed blocks of 64 rows of C, each one OpenBLAS call on one thread, the \
   * blocks over the op's threads: bits set by the shapes alone; cpu: products of 2^19         \
   * multiply-adds and more whole, through gemm */                                             \
  X(gemm_rows,                                                                                 \
    (const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda, const float *B, \
     int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta),  \
    (c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta))                                  \
  /* db[n] += the sum in double of dy[m][n] over the M rows in order */                        \
  X(sum_rows_double_into,                                                                      \
    (const kiln_op_ctx *c, float *db, const float *dy, int64_t M, int64_t N),                  \
    (c, db, dy, M, N))                                                                         \
  /* KILN_ERR_DATA naming the first value of the padding mask (S x N) that is not 1 or 0 */    \
  X(mask_check, (const kiln_op_ctx *c, const float *mask, int64_t S, int64_t N),               \
    (c, mask, S, N))                                                                           \
  /* scaled dot-product attention of H heads of hd (D = H hd) over q (T x N x D), k and v      \
   * (S x N x D): probs (N x H x T x S) = softmax of scale q.k over the keys query t sees      \
   * (valid S x N or NULL; causal: s <= t), 0 elsewhere and for a query that sees none; ctx    \
   * (T x N x D) = probs v */                                                                  \
  X(attention_fwd,                                                                             \
    (const kiln_op_ctx *c, float *ctx, float *probs, const float *q, const float *k,           \
     const float *v, const float *valid, int T, int S, int N, int H, int hd, float scale,      \
     bool causal),                                                                             \
    (c, ctx, probs, q, k, v, valid, T, S, N, H, hd, scale, causal))                            \
  /* dq, dk, dv (overwritten) from dctx and the forward's probs, q, k, v; work:                \
   * kiln_attention_workspace(T, S, c->nthreads) floats */                                     \
  X(attention_bwd,                                                                             \
    (const kiln_op_ctx *c, float *dq, float *dk, float *dv, float *work, const float *dctx,    \
     const float *probs, const float *q, const float *k, const float *v, int T, int S, int N,  \
     int H, int hd, float scale),                                                              \
    (c, dq, dk, dv, work, dctx, probs, q, k, v, T, S, N, H, hd, scale))

/* src/ops/solver.c: the update rules, gradient clipping, the workers' accumulation. One call
 * covers one parameter blob: w its values, g its gradient, h and h2 its histories (n floats each);
 * lr is the rate with the blob's multiplier (Adam's bias-corrected), every scalar from the host;
 * Adam's moments are computed in double. The passes' and workers' sums use acc, and clipping's
 * scaling scale (arrange). */
#define KILN_OPS_SOLVER(X)                                                                      \
  /* sum[0] += the sum of x[i]^2 in double, i in order (clipping's squared L2 norm) */          \
  X(sumsq_acc, (const kiln_op_ctx *c, double *sum, const float *x, int64_t n), (c, sum, x, n))  \
  /* g = norm g (norm 1: unchanged), then g += wd sign(w) (l1) or wd w (wd 0: unchanged) */     \
  X(regularize,                                                                                 \
    (const kiln_op_ctx *c, float *g, const float *w, int64_t n, float norm, float wd, bool l1), \
    (c, g, w, n, norm, wd, l1))                                                                 \
  /* SGD: g = norm g + wd w, h = m h + lr g, w -= h (one pass); bad[0] = 1 if a w is not finite */ \
  X(sgd_update,                                                                                 \
    (const kiln_op_ctx *c, float *w, float *h, float *g, int32_t *bad, int64_t n, float norm,   \
     float wd, float lr, float m),                                                              \
    (c, w, h, g, bad, n, norm, wd, lr, m))                                                      \
  /* Nesterov: h' = m h + lr g, w -= (1 + m) h' - m h */                                        \
  X(nesterov_update,                                                                            \
    (const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n, float lr, float m),   \
    (c, w, h, g, n, lr, m))                                                                     \
  /* AdaGrad: h += g^2, w -= lr g / (sqrt(h) + delta) */                                        \
  X(adagrad_update,                                                                             \
    (const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n, float lr,             \
     float delta),                                                                              \
    (c, w, h, g, n, lr, delta))                                                                 \
  /* RMSProp: h = decay h + (1 - decay) g^2, w -= lr g / (sqrt(h) + delta) */                   \
  X(rmsprop_update,                                                                             \
    (const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n, float lr,             \
     float decay, float delta),                                                                 \
    (c, w, h, g, n, lr, decay, delta))                                                          \
  /* AdaDelta: h = m h + (1 - m) g^2, u = g sqrt((h2 + delta) / (h + delta)),                   \
   * h2 = m h2 + (1 - m) u^2, w -= lr u */                                                      \
  X(adadelta_update,                                                                            \
    (const kiln_op_ctx *c, float *w, float *h, float *h2, const float *g, int64_t n, float lr,  \
     float m, float delta),                                                                     \
    (c, w, h, h2, g, n, lr, m, delta))                                                          \
  /* Adam: h = b1 h + (1 - b1) g, h2 = b2 h2 + (1 - b2) g^2, w -= lr h / (sqrt(h2) + delta) */   \
  X(adam_update,                                                                                \
    (const kiln_op_ctx *c, float *w, float *h, float *h2, const float *g, int64_t n, float lr,  \
     double b1, double b2, float delta),                                                        \
    (c, w, h, h2, g, n, lr, b1, b2, delta))                                                     \
  /* at[0] = the index of the first value of x that is not finite; -1 when every one is */      \
  X(find_nonfinite, (const kiln_op_ctx *c, int64_t *at, const float *x, int64_t n),             \
    (c, at, x, n))                                                                              \
  /* every p[r][0 .. n) (r < np) = ((p[0] + p[1]) + p[2]) + ..., added in rank order */         \
  X(ordered_sum, (const kiln_op_ctx *c, float *const *p, int np, int64_t n), (c, p, np, n))

#define KILN_OP_FIELD_(name, params, args) int(*name) params;
typedef struct kiln_backend {
  const char *name;          /* "ref", "cpu", "cpu-bf16", "hostsim", "cudaemu", "cuda" */
  const kiln_device *device; /* where its kernels' tensors are */
  KILN_OP_LIST(KILN_OP_FIELD_)
} kiln_backend;
#undef KILN_OP_FIELD_

#define KILN_OP_ID_(name, params, args) KILN_OP_##name,
enum { KILN_OP_LIST(KILN_OP_ID_) KILN_OP_COUNT };
#undef KILN_OP_ID_

/* The workspace im2col_conv_fwd and im2col_conv_bwd need. */
int64_t kiln_im2col_conv_workspace(const kiln_conv_geom *g, int group, int M, int nthreads);

/* The workspace argmax_fwd needs for `dim` values an item. */
int64_t kiln_argmax_workspace_bytes(int64_t dim);

/* The op's name ("relu_fwd"); NULL for an id past the list. */
const char *kiln_op_name(int op);
/* Whether the backend has a kernel for op. */
bool kiln_backend_has(const kiln_backend *b, int op);

const kiln_backend *kiln_backend_ref(void);
const kiln_backend *kiln_backend_cpu(void);
const kiln_backend *kiln_backend_hostsim(void);
/* cpu's table with the products in bf16 (precision BF16): gemm, gemm_rows and the packed GEMMs
 * round their operands to bfloat16 and sum in fp32, convolutions run oneDNN's bf16 primitives
 * (src/ops/bf16.c); every other op is cpu's, in fp32. */
const kiln_backend *kiln_backend_cpu_bf16(void);
/* The CUDA backend's kernels (src/cuda) built as C and run on hostsim, one small grid's threads in
 * turn (KILN_DEVICE=hostsim KILN_ENGINE=cuda); ops the CUDA backend lacks are NULL. */
const kiln_backend *kiln_backend_cudaemu(void);
/* The CUDA backend on GPU `index` (NULL: no such GPU, or a build without CUDA). */
const kiln_backend *kiln_backend_cuda(int index);
/* The table for a device and an engine: the host's cpu or ref; on hostsim the cpu kernels, or
 * with KILN_ENGINE_CUDA the emulated CUDA kernels; a GPU's CUDA backend; NULL for a device without
 * one. */
const kiln_backend *kiln_backend_for(const kiln_device *d, kiln_engine e);
/* The table a configuration runs on device d: kiln_backend_for's by engine, or in precision BF16
 * cpu-bf16, which needs the host, the cpu engine and a CPU with bf16 kernels (kiln_bf16_check);
 * KILN_ERR_UNSUPPORTED saying what is missing otherwise. */
int kiln_backend_choose(const kiln_config *cfg, const kiln_device *d, const kiln_backend **out);
/* The device a configuration puts nets on (kiln_config.device, .device_index); NULL where it is
 * not in this build or this machine. */
const kiln_device *kiln_config_device(const kiln_config *c);

/* A layer's kernels (kiln_layer_ops.kernels): op ids, KILN_KERNELS_END last. */
#define KILN_KERNELS_END (-1)
#define KILN_KERNELS(...) ((const int[]){__VA_ARGS__, KILN_KERNELS_END})
/* A layer with no arithmetic at all (Input: its tops are filled through the device table). */
#define KILN_NO_KERNELS ((const int[]){KILN_KERNELS_END})

#endif
