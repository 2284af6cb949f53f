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

/* What a plan needs and takes: workspace, and the layouts it reads and writes without a
 * reorder: KILN_CONV_ROLE_* bits for the input (BOTTOM) and the output (TOP) in the blocked
 * layout of `block_channels` (0: plain only). */
enum { KILN_CONV_ROLE_BOTTOM = 2, KILN_CONV_ROLE_TOP = 4 };
typedef struct kiln_conv_plan_info {
  int64_t workspace_floats;
  int layout_role;
  int block_channels;
} kiln_conv_plan_info;

/* A backend's plan for one convolution (its route and state), opaque. */
typedef struct kiln_conv_plan kiln_conv_plan;

/* Every op: X(name, parameters, arguments). The arguments repeat the parameters' names, so that
 * a wrapper (hostsim's) can pass a call on. The list is kept in families, each one macro, in the
 * order of the files in src/ops that hold them. */
#define KILN_OP_LIST(X)                                                                         \
  KILN_OPS_ELEMENTWISE(X)                                                                      \
  KILN_OPS_MATMUL(X)                                                                           \
  KILN_OPS_CONV(X)                                                                             \
  KILN_OPS_NEURON(X)                                                                           \
  KILN_OPS_NORM(X)                                                                             \
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
  /* C (M x N, ldc apart) = alpha op(A) op(B) + beta C, row-major; op(A) is M x K, op(B) K x N */ \
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

/* src/ops/conv_plan.c: convolution plans (the route a backend takes for one layer's shape and
 * its state: oneDNN's primitives), the im2col route as kernels, pooling, the plane-wise bias. */
#define KILN_OPS_CONV(X)                                                                        \
  /* *plan (NULL: made) for spec, kept where spec is what it was made for; info filled */      \
  X(conv_plan_update,                                                                          \
    (const kiln_op_ctx *c, kiln_conv_plan **plan, const kiln_conv_spec *spec,                  \
     kiln_conv_plan_info *info),                                                               \
    (c, plan, spec, info))                                                                     \
  /* frees a plan (NULL: nothing) */                                                           \
  X(conv_plan_free, (const kiln_op_ctx *c, kiln_conv_plan *plan), (c, plan))                   \
  /* y = conv(x, w) + b (b may be NULL) by the plan's route; ws: info.workspace_floats */       \
  X(conv_fwd,                                                                                  \
    (const kiln_op_ctx *c, const kiln_conv_plan *plan, float *y, const float *x,               \
     const float *w, const float *b, float *ws),                                               \
    (c, plan, y, x, w, b, ws))                                                                 \
  /* dx = (NULL: skipped), dw +=, db += (NULL: skipped), from dy */                            \
  X(conv_bwd,                                                                                  \
    (const kiln_op_ctx *c, const kiln_conv_plan *plan, float *dx, float *dw, float *db,        \
     const float *dy, const float *x, const float *w, float *ws),                              \
    (c, plan, dx, dw, db, dy, x, w, ws))                                                       \
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
#define KILN_OPS_NEURON(X)

/* src/ops/norm.c: BatchNorm, Scale, Bias, LayerNorm, LRN, MVN and Reduction. */
#define KILN_OPS_NORM(X)

/* src/ops/loss.c: softmax and the loss and metric layers' arithmetic. */
#define KILN_OPS_LOSS(X)

/* src/ops/arrange.c: Eltwise, Concat, Slice, Embed, Tile, ArgMax and the other layers that
 * move, gather or combine values. s(z) below is a fused ReLU's select, z > 0 ? z : slope z
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
    (c, y, ws, x, num, dim, dist, top_k, out_max_val, along_axis))

/* src/ops/sequence.c: the recurrent and transformer layers' arithmetic besides GEMM. */
#define KILN_OPS_SEQUENCE(X)

/* src/ops/solver.c: the update rules, gradient clipping, the workers' accumulation. */
#define KILN_OPS_SOLVER(X)

#define KILN_OP_FIELD_(name, params, args) int(*name) params;
typedef struct kiln_backend {
  const char *name;          /* "ref", "cpu", "hostsim" */
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
/* The table for a device and an engine: the host's cpu or ref, hostsim's (which runs the cpu
 * kernels whatever the engine); NULL for a device without one. */
const kiln_backend *kiln_backend_for(const kiln_device *d, kiln_engine e);

/* A layer's kernels (kiln_layer_ops.kernels): op ids, KILN_KERNELS_END last. */
#define KILN_KERNELS_END (-1)
#define KILN_KERNELS(...) ((const int[]){__VA_ARGS__, KILN_KERNELS_END})
/* A layer with no arithmetic at all (Input: its tops are filled through the device table). */
#define KILN_NO_KERNELS ((const int[]){KILN_KERNELS_END})

#endif
