/* Every op of every backend (include/kiln/backend.h) against a double-precision reference, table
 * driven in the spirit of ggml's test-backend-ops: each row is an op, a size and a setting; the
 * row's case makes inputs, runs the op on the backend (its tensors in the backend's device memory,
 * moved in and out through the device table), and compares with the same arithmetic in double,
 * or, for a gradient, with central finite differences of the double-precision forward. Sizes
 * include 1, odd counts, counts off the SIMD width and counts past the size where loops go
 * parallel. Every op must have a row (test_every_op_has_a_row), and a planted wrong kernel must
 * be caught (test_a_wrong_kernel_is_caught). Adding an op or a backend adds rows here, not a
 * test file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gradcheck.h"
#include "kiln/backend.h"
#include "kiln/device.h"
#include "kiln/layers.h"

/* ---- tensors on a backend's device ----------------------------------------------------------- */

/* A float tensor of n values on the host (h) and on the device (d). */
typedef struct {
  float *h;
  float *d;
  int64_t n;
  const kiln_device *dev;
} tensor;

static tensor make(const kiln_op_ctx *c, int64_t n) {
  tensor t = {.n = n, .dev = c->device};
  t.h = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
  assert_non_null(t.h);
  void *d;
  assert_int_equal(kiln_device_alloc(c->device, sizeof(float) * (size_t)(n > 0 ? n : 1), &d),
                   KILN_OK);
  t.d = d;
  return t;
}

/* Values drawn uniformly in [lo, hi), with |v| >= gap (away from a kink at 0), to the device. */
static tensor input(const kiln_op_ctx *c, int64_t n, float lo, float hi, float gap, kiln_rng *r) {
  tensor t = make(c, n);
  for (int64_t i = 0; i < n; i++) {
    float v;
    do v = kiln_rng_uniform(r, lo, hi);
    while (fabsf(v) < gap);
    t.h[i] = v;
  }
  assert_int_equal(kiln_device_to_device(c->device, t.d, t.h, sizeof(float) * (size_t)n), KILN_OK);
  return t;
}

/* The device's values into t.h. */
static void fetch(tensor *t) {
  assert_int_equal(kiln_device_to_host(t->dev, t->h, t->d, sizeof(float) * (size_t)t->n), KILN_OK);
}

static void drop(tensor *t) {
  free(t->h);
  kiln_device_free(t->dev, t->d);
}

/* The largest |got - want| / (1 + |want|) over n values. */
static double error_of(const float *got, const double *want, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]) / (1 + fabs(want[i]));
    if (!(e <= worst)) worst = e; /* a NaN is the worst */
  }
  return worst;
}

/* ---- the double-precision arithmetic --------------------------------------------------------- */

typedef double (*scalar_fn)(double x, double p);
static double d_relu(double x, double p) { return x > 0 ? x : p * x; }
static double d_sigmoid(double x, double p) {
  (void)p;
  return 1 / (1 + exp(-x));
}
static double d_tanh(double x, double p) {
  (void)p;
  return tanh(x);
}
/* d f / dx by central differences in double */
static double d_slope(scalar_fn f, double x, double p) {
  const double h = 1e-5;
  return (f(x + h, p) - f(x - h, p)) / (2 * h);
}

/* ---- the cases: one per op ------------------------------------------------------------------- */

/* A case runs op on backend b (context c) at size n with setting p, returns the error. */
typedef double (*case_fn)(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                          kiln_rng *r);

static double unary_forward(int op, scalar_fn f, const kiln_backend *b, const kiln_op_ctx *c,
                            int64_t n, float p, kiln_rng *r) {
  tensor x = input(c, n, -4, 4, 0, r), y = make(c, n);
  int rc = op == KILN_OP_relu_fwd       ? b->relu_fwd(c, y.d, x.d, n, p)
           : op == KILN_OP_sigmoid_fwd ? b->sigmoid_fwd(c, y.d, x.d, n)
           : op == KILN_OP_tanh_fwd    ? b->tanh_fwd(c, y.d, x.d, n)
                                       : b->copy(c, y.d, x.d, n);
  assert_int_equal(rc, KILN_OK);
  fetch(&y);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = f ? f(x.h[i], p) : x.h[i];
  double e = error_of(y.h, want, n);
  free(want);
  drop(&x);
  drop(&y);
  return e;
}

static double case_copy(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                        kiln_rng *r) {
  return unary_forward(KILN_OP_copy, NULL, b, c, n, p, r);
}
static double case_relu_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  return unary_forward(KILN_OP_relu_fwd, d_relu, b, c, n, p, r);
}
static double case_sigmoid_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  return unary_forward(KILN_OP_sigmoid_fwd, d_sigmoid, b, c, n, p, r);
}
static double case_tanh_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  return unary_forward(KILN_OP_tanh_fwd, d_tanh, b, c, n, p, r);
}

/* A gradient dx = dy f'(x), given what the op reads: the input (relu) or the output. Checked
 * against finite differences of f in double. */
static double unary_backward(int op, scalar_fn f, const kiln_backend *b, const kiln_op_ctx *c,
                             int64_t n, float p, kiln_rng *r) {
  tensor x = input(c, n, -4, 4, 0.01f, r), dy = input(c, n, -2, 2, 0, r), dx = make(c, n);
  tensor v = make(c, n); /* what the op reads: x for relu, f(x) for sigmoid and tanh */
  for (int64_t i = 0; i < n; i++) v.h[i] = op == KILN_OP_relu_bwd ? x.h[i] : (float)f(x.h[i], p);
  assert_int_equal(kiln_device_to_device(c->device, v.d, v.h, sizeof(float) * (size_t)n), KILN_OK);
  int rc = op == KILN_OP_relu_bwd      ? b->relu_bwd(c, dx.d, dy.d, v.d, n, p)
           : op == KILN_OP_sigmoid_bwd ? b->sigmoid_bwd(c, dx.d, dy.d, v.d, n)
                                       : b->tanh_bwd(c, dx.d, dy.d, v.d, n);
  assert_int_equal(rc, KILN_OK);
  fetch(&dx);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = dy.h[i] * d_slope(f, x.h[i], p);
  double e = error_of(dx.h, want, n);
  free(want);
  drop(&x);
  drop(&dy);
  drop(&dx);
  drop(&v);
  return e;
}

static double case_relu_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  return unary_backward(KILN_OP_relu_bwd, d_relu, b, c, n, p, r);
}
static double case_sigmoid_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  return unary_backward(KILN_OP_sigmoid_bwd, d_sigmoid, b, c, n, p, r);
}
static double case_tanh_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  return unary_backward(KILN_OP_tanh_bwd, d_tanh, b, c, n, p, r);
}

static double case_mul(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                       kiln_rng *r) {
  (void)p;
  tensor x = input(c, n, -3, 3, 0, r), w = input(c, n, -3, 3, 0, r), y = make(c, n);
  assert_int_equal(b->mul(c, y.d, x.d, w.d, n), KILN_OK);
  fetch(&y);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = (double)x.h[i] * w.h[i];
  double e = error_of(y.h, want, n);
  free(want);
  drop(&x);
  drop(&w);
  drop(&y);
  return e;
}

/* Dropout's mask: the draws of the generator in order, `scale` where a draw reaches the ratio;
 * and the generator left where those draws leave it. */
static double case_dropout_mask(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  tensor m = make(c, n);
  kiln_rng gen = *r, mine = *r;
  const float scale = 1.0f / (1.0f - p);
  assert_int_equal(b->dropout_mask(c, m.d, n, p, scale, &gen), KILN_OK);
  fetch(&m);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = kiln_rng_uniform(&mine, 0, 1) >= p ? scale : 0.0;
  double e = error_of(m.h, want, n);
  if (gen.state != mine.state) e = INFINITY;
  free(want);
  drop(&m);
  return e;
}

/* ---- matmul cases ---- */

/* Shapes the products are tried at (M, N, K): tiny, odd, and one large enough for oneDNN. */
static const int64_t mm_shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 130, 96},
                                       {256, 256, 256}};

/* C = alpha op(A) op(B) + beta C with ta, tb from p's two bits, shape mm_shapes[n]; every
 * element against the sum in double. */
static double case_gemm(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                        kiln_rng *r) {
  const int64_t M = mm_shapes[n][0], N = mm_shapes[n][1], K = mm_shapes[n][2];
  const bool ta = (int)p & 1, tb = (int)p & 2;
  const float alpha = 0.5f, beta = 0.75f;
  tensor A = input(c, M * K, -1, 1, 0, r), B = input(c, K * N, -1, 1, 0, r);
  tensor C = input(c, M * N, -1, 1, 0, r);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  assert_int_equal(b->gemm(c, C.d, N, A.d, lda, B.d, ldb, ta, tb, M, N, K, alpha, beta), KILN_OK);
  double *want = malloc(sizeof(double) * (size_t)(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++)
        acc += (double)(ta ? A.h[k * lda + i] : A.h[i * lda + k]) *
               (tb ? B.h[j * ldb + k] : B.h[k * ldb + j]);
      want[i * N + j] = alpha * acc + beta * (double)C.h[i * N + j];
    }
  fetch(&C);
  double e = error_of(C.h, want, M * N) / sqrt((double)K); /* rounding grows with the sum */
  free(want);
  drop(&A);
  drop(&B);
  drop(&C);
  return e;
}

/* y[m][n] += b[n] (add_bias_rows), or db[n] += sum of dy[m][n] (sum_rows_into); n rows of 13. */
static double case_bias_rows(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                             kiln_rng *r) {
  const int64_t M = n, N = 13;
  tensor y = input(c, M * N, -2, 2, 0, r), v = input(c, N, -2, 2, 0, r);
  double *want = malloc(sizeof(double) * (size_t)(M * N));
  if (op == KILN_OP_add_bias_rows) {
    assert_int_equal(b->add_bias_rows(c, y.d, v.d, M, N), KILN_OK);
    for (int64_t i = 0; i < M * N; i++) want[i] = (double)y.h[i] + v.h[i % N];
    fetch(&y);
    double e = error_of(y.h, want, M * N);
    free(want);
    drop(&y);
    drop(&v);
    return e;
  }
  assert_int_equal(b->sum_rows_into(c, v.d, y.d, M, N), KILN_OK);
  for (int64_t j = 0; j < N; j++) {
    want[j] = v.h[j];
    for (int64_t i = 0; i < M; i++) want[j] += y.h[i * N + j];
  }
  fetch(&v);
  double e = error_of(v.h, want, N);
  free(want);
  drop(&y);
  drop(&v);
  return e;
}
static double case_add_bias_rows(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                 float p, kiln_rng *r) {
  (void)p;
  return case_bias_rows(KILN_OP_add_bias_rows, b, c, n, r);
}
static double case_sum_rows_into(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                 float p, kiln_rng *r) {
  (void)p;
  return case_bias_rows(KILN_OP_sum_rows_into, b, c, n, r);
}

/* A random CSR matrix of M rows over K columns, about `per` entries a row (some rows empty),
 * columns increasing, and the same as a dense M x K array. Its arrays stay host memory: the
 * matrix is the host-side description a sparse blob carries. */
static void random_csr(kiln_csr *x, double *dense, int64_t M, int64_t K, int per, kiln_rng *r) {
  memset(x, 0, sizeof *x);
  assert_int_equal(kiln_csr_reserve(x, M, M * K), KILN_OK);
  x->rows = M;
  x->cols = K;
  int64_t nnz = 0;
  for (int64_t m = 0; m < M; m++) {
    x->row_ptr[m] = nnz;
    for (int64_t k = 0; k < K; k++) {
      dense[m * K + k] = 0;
      if (kiln_rng_uniform(r, 0, 1) * K < per) {
        x->col[nnz] = (int32_t)k;
        x->val[nnz] = kiln_rng_uniform(r, -1, 1);
        dense[m * K + k] = x->val[nnz++];
      }
    }
  }
  x->row_ptr[M] = nnz;
  x->nnz = nnz;
}

/* y = X op(W) + b and dW += ..., X sparse, against the dense products in double; p: transposed
 * weights; n: the rows (K 300 columns, N 9 outputs; 700 rows reach the parallel size). */
static double case_csr(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t M, bool tr,
                       kiln_rng *r) {
  const int64_t K = 300, N = op == KILN_OP_csr_matmul ? 9 : 400;
  kiln_csr x;
  double *dense = malloc(sizeof(double) * (size_t)(M * K));
  random_csr(&x, dense, M, K, 5, r);
  tensor w = input(c, N * K, -1, 1, 0, r), bias = input(c, N, -1, 1, 0, r);
  double e;
  if (op == KILN_OP_csr_matmul) {
    tensor y = make(c, M * N);
    assert_int_equal(b->csr_matmul(c, y.d, &x, w.d, bias.d, M, N, K, tr), KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(M * N));
    for (int64_t m = 0; m < M; m++)
      for (int64_t j = 0; j < N; j++) {
        double acc = bias.h[j];
        for (int64_t k = 0; k < K; k++) acc += dense[m * K + k] * (tr ? w.h[k * N + j] : w.h[j * K + k]);
        want[m * N + j] = acc;
      }
    fetch(&y);
    e = error_of(y.h, want, M * N);
    free(want);
    drop(&y);
  } else {
    tensor dy = input(c, M * N, -1, 1, 0, r);
    assert_int_equal(b->csr_weight_grad(c, w.d, &x, dy.d, M, N, K, tr), KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(N * K));
    for (int64_t j = 0; j < N; j++)
      for (int64_t k = 0; k < K; k++) {
        double acc = tr ? w.h[k * N + j] : w.h[j * K + k];
        for (int64_t m = 0; m < M; m++) acc += dy.h[m * N + j] * dense[m * K + k];
        want[tr ? k * N + j : j * K + k] = acc;
      }
    fetch(&w);
    e = error_of(w.h, want, N * K);
    free(want);
    drop(&dy);
  }
  free(dense);
  kiln_csr_free(&x);
  drop(&w);
  drop(&bias);
  return e;
}
static double case_csr_matmul(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  return case_csr(KILN_OP_csr_matmul, b, c, n, p != 0, r);
}
static double case_csr_weight_grad(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  return case_csr(KILN_OP_csr_weight_grad, b, c, n, p != 0, r);
}

/* ---- conv cases ---- */

/* Convolution shapes: {N, C, H, W, M, group, k, stride, pad, dilation}, chosen to take each
 * route of the cpu backend: im2col (odd sizes, groups, dilation), oneDNN (16 and more channels),
 * shifted rows (LeNet's 1 -> 20 and 20 -> 50 5x5, in a build with AVX-512). */
static const int conv_shapes[][10] = {
    {1, 1, 5, 5, 1, 1, 3, 1, 0, 1},    {2, 3, 7, 9, 4, 1, 3, 2, 1, 1},
    {2, 4, 9, 8, 6, 2, 3, 1, 1, 2},    {2, 16, 10, 10, 32, 1, 3, 1, 1, 1},
    {3, 1, 28, 28, 20, 1, 5, 1, 0, 1}, {2, 20, 12, 12, 50, 1, 5, 1, 0, 1},
};

static kiln_conv_spec conv_spec_of(const int *v) {
  kiln_conv_spec sp = {.N = v[0], .M = v[4], .group = v[5], .bias = true};
  kiln_conv_geom *g = &sp.g;
  g->channels = v[1];
  g->height = v[2];
  g->width = v[3];
  g->kernel_h = g->kernel_w = v[6];
  g->stride_h = g->stride_w = v[7];
  g->pad_h = g->pad_w = v[8];
  g->dilation_h = g->dilation_w = v[9];
  assert_int_equal(kiln_conv_out_size(g), 0);
  return sp;
}

/* The window's input pixel for output (oh, ow) and kernel tap (kh, kw); false in the padding. */
static bool tap(const kiln_conv_geom *g, int oh, int ow, int kh, int kw, int *ih, int *iw) {
  *ih = oh * g->stride_h - g->pad_h + kh * g->dilation_h;
  *iw = ow * g->stride_w - g->pad_w + kw * g->dilation_w;
  return *ih >= 0 && *ih < g->height && *iw >= 0 && *iw < g->width;
}

/* The convolution in double (y: N x M x OH x OW), or with dy given its adjoints: dx
 * overwritten, dw and db added to what they hold. */
static void d_conv(double *y, double *dx, double *dw, double *db, const float *dy,
                   const float *x, const float *w, const float *b, const kiln_conv_spec *sp) {
  const kiln_conv_geom *g = &sp->g;
  const int C = g->channels, M = sp->M, Cg = C / sp->group, Mg = M / sp->group;
  if (dx) memset(dx, 0, sizeof(double) * (size_t)(sp->N * C * g->height * g->width));
  for (int64_t n = 0; n < sp->N; n++)
    for (int m = 0; m < M; m++)
      for (int oh = 0; oh < g->out_h; oh++)
        for (int ow = 0; ow < g->out_w; ow++) {
          const int64_t yi = ((n * M + m) * g->out_h + oh) * g->out_w + ow;
          double acc = b ? b[m] : 0;
          if (dy) db[m] += dy[yi];
          for (int cc = 0; cc < Cg; cc++)
            for (int kh = 0; kh < g->kernel_h; kh++)
              for (int kw = 0; kw < g->kernel_w; kw++) {
                int ih, iw;
                if (!tap(g, oh, ow, kh, kw, &ih, &iw)) continue;
                const int64_t xi = ((n * C + m / Mg * Cg + cc) * g->height + ih) * g->width + iw;
                const int64_t wi = ((m * Cg + cc) * g->kernel_h + kh) * g->kernel_w + kw;
                if (dy) {
                  dx[xi] += (double)dy[yi] * w[wi];
                  dw[wi] += (double)dy[yi] * x[xi];
                } else {
                  acc += (double)x[xi] * w[wi];
                }
              }
          if (!dy) y[yi] = acc;
        }
}

/* The plan's forward and backward (the plan ops' rows) or the im2col route's ops on
 * conv_shapes[n]: y, dx, dw and db against double, the sums' rounding allowed for by their
 * length. A plan asked again for its spec is kept; every plan is freed. */
static double case_conv(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                        kiln_rng *r) {
  const kiln_conv_spec sp = conv_spec_of(conv_shapes[n]);
  const kiln_conv_geom *g = &sp.g;
  const int64_t nx = sp.N * g->channels * g->height * g->width;
  const int64_t nw = (int64_t)sp.M * (g->channels / sp.group) * g->kernel_h * g->kernel_w;
  const int64_t ny = sp.N * sp.M * g->out_h * g->out_w;
  tensor x = input(c, nx, -1, 1, 0, r), w = input(c, nw, -1, 1, 0, r);
  tensor bias = input(c, sp.M, -1, 1, 0, r), y = make(c, ny), dy = input(c, ny, -1, 1, 0, r);
  tensor dx = make(c, nx), dw = input(c, nw, -1, 1, 0, r), db = input(c, sp.M, -1, 1, 0, r);
  const bool planned = op == KILN_OP_conv_route_update || op == KILN_OP_conv_fwd ||
                       op == KILN_OP_conv_bwd || op == KILN_OP_conv_route_free;
  kiln_conv_route *plan = NULL;
  kiln_conv_route_info info = {0};
  int64_t wsn = kiln_im2col_conv_workspace(g, sp.group, sp.M, c->nthreads);
  if (planned) {
    assert_int_equal(b->conv_route_update(c, &plan, &sp, &info), KILN_OK);
    kiln_conv_route *again = plan;
    assert_int_equal(b->conv_route_update(c, &again, &sp, &info), KILN_OK);
    assert_ptr_equal(again, plan);
    wsn = info.workspace_floats;
  }
  tensor ws = make(c, wsn > 0 ? wsn : 1);
  if (planned) {
    assert_int_equal(b->conv_fwd(c, plan, y.d, x.d, w.d, bias.d, ws.d), KILN_OK);
    assert_int_equal(b->conv_bwd(c, plan, dx.d, dw.d, db.d, dy.d, x.d, w.d, ws.d), KILN_OK);
    assert_int_equal(b->conv_route_free(c, plan), KILN_OK);
  } else {
    assert_int_equal(
        b->im2col_conv_fwd(c, y.d, x.d, w.d, bias.d, (int)sp.N, sp.M, sp.group, g, ws.d), KILN_OK);
    assert_int_equal(b->im2col_conv_bwd(c, dx.d, dw.d, db.d, dy.d, x.d, w.d, (int)sp.N, sp.M,
                                        sp.group, g, ws.d),
                     KILN_OK);
  }
  double *wy = malloc(sizeof(double) * (size_t)ny), *wx = malloc(sizeof(double) * (size_t)nx);
  double *ww = malloc(sizeof(double) * (size_t)nw), *wb = malloc(sizeof(double) * (size_t)sp.M);
  for (int64_t i = 0; i < nw; i++) ww[i] = dw.h[i];
  for (int i = 0; i < sp.M; i++) wb[i] = db.h[i];
  d_conv(wy, NULL, NULL, NULL, NULL, x.h, w.h, bias.h, &sp);
  d_conv(NULL, wx, ww, wb, dy.h, x.h, w.h, NULL, &sp);
  fetch(&y);
  fetch(&dx);
  fetch(&dw);
  fetch(&db);
  const double taps = sqrt((double)(g->channels / sp.group) * g->kernel_h * g->kernel_w);
  const double sites = sqrt((double)(sp.N * g->out_h * g->out_w));
  const double errs[4] = {error_of(y.h, wy, ny) / taps, error_of(dx.h, wx, nx) / taps,
                          error_of(dw.h, ww, nw) / sites, error_of(db.h, wb, sp.M) / sites};
  double e = 0;
  for (int i = 0; i < 4; i++)
    if (!(errs[i] <= e)) e = errs[i];
  free(wy);
  free(wx);
  free(ww);
  free(wb);
  tensor *all[] = {&x, &w, &bias, &y, &dy, &dx, &dw, &db, &ws};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}
#define CONV_CASE(name)                                                                        \
  static double case_##name(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,   \
                            kiln_rng *r) {                                                     \
    (void)p;                                                                                   \
    return case_conv(KILN_OP_##name, b, c, n, r);                                              \
  }
CONV_CASE(conv_route_update)
CONV_CASE(conv_route_free)
CONV_CASE(conv_fwd)
CONV_CASE(conv_bwd)
CONV_CASE(im2col_conv_fwd)
CONV_CASE(im2col_conv_bwd)

/* Deconvolution's plane bias: y[n][m][i] += b[m], and db[m] += the planes' sums. */
static double case_plane_bias(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                              kiln_rng *r) {
  const int64_t M = 5, P = 13;
  tensor y = input(c, n * M * P, -1, 1, 0, r), v = input(c, M, -1, 1, 0, r);
  double *want = malloc(sizeof(double) * (size_t)(n * M * P)), e;
  if (op == KILN_OP_plane_bias_add) {
    for (int64_t i = 0; i < n * M * P; i++) want[i] = (double)y.h[i] + v.h[i / P % M];
    assert_int_equal(b->plane_bias_add(c, y.d, v.d, n, M, P), KILN_OK);
    fetch(&y);
    e = error_of(y.h, want, n * M * P);
  } else {
    for (int64_t m = 0; m < M; m++) want[m] = v.h[m];
    for (int64_t i = 0; i < n * M * P; i++) want[i / P % M] += y.h[i];
    assert_int_equal(b->plane_bias_grad(c, v.d, y.d, n, M, P), KILN_OK);
    fetch(&v);
    e = error_of(v.h, want, M);
  }
  free(want);
  drop(&y);
  drop(&v);
  return e;
}
static double case_plane_bias_add(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  (void)p;
  return case_plane_bias(KILN_OP_plane_bias_add, b, c, n, r);
}
static double case_plane_bias_grad(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  (void)p;
  return case_plane_bias(KILN_OP_plane_bias_grad, b, c, n, r);
}

/* Im2col of conv_shapes[n]'s window (the channels of its input) and col2im its adjoint. */
static double case_im2col_pair(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                               kiln_rng *r) {
  const kiln_conv_spec sp = conv_spec_of(conv_shapes[n]);
  const kiln_conv_geom *g = &sp.g;
  const int64_t in = (int64_t)g->channels * g->height * g->width;
  const int64_t rows = (int64_t)g->channels * g->kernel_h * g->kernel_w;
  const int64_t cols = (int64_t)g->out_h * g->out_w;
  tensor x = input(c, sp.N * in, -1, 1, 0, r), col = input(c, sp.N * rows * cols, -1, 1, 0, r);
  const int64_t most = in > rows * cols ? in : rows * cols;
  double *want = calloc((size_t)(sp.N * most), sizeof(double));
  for (int64_t i = 0; i < sp.N; i++)
    for (int64_t k = 0; k < rows; k++) {
      const int ch = (int)(k / (g->kernel_h * g->kernel_w));
      const int kh = (int)(k / g->kernel_w % g->kernel_h), kw = (int)(k % g->kernel_w);
      for (int64_t q = 0; q < cols; q++) {
        int ih, iw;
        const bool inside = tap(g, (int)(q / g->out_w), (int)(q % g->out_w), kh, kw, &ih, &iw);
        const int64_t xi = i * in + ((int64_t)ch * g->height + ih) * g->width + iw;
        const int64_t ci = (i * rows + k) * cols + q;
        if (op == KILN_OP_im2col) want[ci] = inside ? x.h[xi] : 0;
        else if (inside) want[xi] += col.h[ci];
      }
    }
  double e;
  if (op == KILN_OP_im2col) {
    assert_int_equal(b->im2col(c, col.d, x.d, sp.N, g), KILN_OK);
    fetch(&col);
    e = error_of(col.h, want, sp.N * rows * cols);
  } else {
    assert_int_equal(b->col2im(c, x.d, col.d, sp.N, g), KILN_OK);
    fetch(&x);
    e = error_of(x.h, want, sp.N * in);
  }
  free(want);
  drop(&x);
  drop(&col);
  return e;
}
static double case_im2col(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                          kiln_rng *r) {
  (void)p;
  return case_im2col_pair(KILN_OP_im2col, b, c, n, r);
}
static double case_col2im(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                          kiln_rng *r) {
  (void)p;
  return case_im2col_pair(KILN_OP_col2im, b, c, n, r);
}

/* Pooling shapes: {N, C, H, W, k, stride, pad, ceil}; C 32 also runs blocked (nChw16c). */
static const int pool_shapes[][8] = {{1, 1, 4, 4, 2, 2, 0, 0}, {2, 3, 7, 9, 3, 2, 1, 1},
                                     {2, 32, 9, 9, 3, 2, 1, 1}, {1, 32, 6, 6, 6, 1, 0, 0}};

/* Where (n, ch, i) of a plane of P lies in nChw16c. */
static int64_t blocked_at(int64_t n, int64_t ch, int64_t i, int64_t C, int64_t P) {
  return ((n * (C / 16) + ch / 16) * P + i) * 16 + ch % 16;
}

/* MAX (p's ones digit 1) or AVE pooling of pool_shapes[n], plain or blocked (p's tens digit),
 * forward and backward against the window arithmetic in double; the inputs all apart. */
static double case_pool(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                        kiln_rng *r) {
  const int *v = pool_shapes[n];
  const bool max = (int)p % 10, blocked = (int)p / 10;
  kiln_conv_geom g = {.channels = v[1], .height = v[2], .width = v[3], .kernel_h = v[4],
                      .kernel_w = v[4], .stride_h = v[5], .stride_w = v[5], .pad_h = v[6],
                      .pad_w = v[6], .dilation_h = 1, .dilation_w = 1};
  assert_int_equal(kiln_pool_out_size(&g, v[7]), 0);
  const int64_t N = v[0], C = v[1], P = (int64_t)g.height * g.width;
  const int64_t Q = (int64_t)g.out_h * g.out_w;
  tensor x = make(c, N * C * P), y = make(c, N * C * Q), dy = input(c, N * C * Q, -1, 1, 0, r);
  tensor dx = make(c, N * C * P), mask = make(c, N * C * Q);
  for (int64_t i = 0; i < x.n; i++) x.h[i] = (float)((i * 7919) % x.n) / (float)x.n;
  assert_int_equal(kiln_device_to_device(c->device, x.d, x.h, sizeof(float) * (size_t)x.n), KILN_OK);
  const int layout = blocked ? KILN_LAYOUT_BLOCKED16 : KILN_LAYOUT_PLAIN;
  int32_t *m = max ? (int32_t *)mask.d : NULL;
  assert_int_equal(b->pool_fwd(c, y.d, m, x.d, (int)N, &g, max, layout), KILN_OK);
  assert_int_equal(b->pool_bwd(c, dx.d, dy.d, m, (int)N, &g, max, layout), KILN_OK);
  fetch(&y);
  fetch(&dx);
  double *wy = calloc((size_t)(N * C * Q), sizeof(double));
  double *wx = calloc((size_t)(N * C * P), sizeof(double));
  for (int64_t i = 0; i < N; i++)
    for (int64_t ch = 0; ch < C; ch++)
      for (int64_t q = 0; q < Q; q++) {
        int hs = (int)(q / g.out_w) * g.stride_h - g.pad_h, ws = (int)(q % g.out_w) * g.stride_w - g.pad_w;
        int he = hs + g.kernel_h, we = ws + g.kernel_w;
        /* AVE divides by the window clipped to the padded input (Caffe's rule) */
        const int hp = he < g.height + g.pad_h ? he : g.height + g.pad_h;
        const int wp = we < g.width + g.pad_w ? we : g.width + g.pad_w;
        const double area = (double)(hp - hs) * (wp - ws);
        hs = hs > 0 ? hs : 0;
        ws = ws > 0 ? ws : 0;
        he = he < g.height ? he : g.height;
        we = we < g.width ? we : g.width;
        const int64_t yi = blocked ? blocked_at(i, ch, q, C, Q) : (i * C + ch) * Q + q;
        double best = -INFINITY, sum = 0;
        int64_t arg = -1;
        for (int pass = 0; pass < 2; pass++)
          for (int h = hs; h < he; h++)
            for (int w = ws; w < we; w++) {
              const int64_t at = (int64_t)h * g.width + w;
              const int64_t xi = blocked ? blocked_at(i, ch, at, C, P) : (i * C + ch) * P + at;
              if (pass == 0) {
                sum += x.h[xi];
                if (x.h[xi] > best) best = x.h[xi], arg = xi;
              } else if (!max) {
                wx[xi] += dy.h[yi] / area;
              } else if (xi == arg) {
                wx[xi] += dy.h[yi];
              }
            }
        wy[yi] = max ? best : sum / area;
      }
  double e = error_of(y.h, wy, N * C * Q), e1 = error_of(dx.h, wx, N * C * P);
  if (!(e1 <= e)) e = e1;
  free(wy);
  free(wx);
  tensor *all[] = {&x, &y, &dy, &dx, &mask};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}
static double case_pool_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  return case_pool(b, c, n, p, r);
}
static double case_pool_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  return case_pool(b, c, n, p, r);
}

/* ---- neuron cases ---- */

/* The settings of Exp, Log and Power, which their rows pick by index (p): Exp's (inner, outer),
 * Log's (scale, shift, base_scale), Power's (power, scale, shift): the constant and linear cases
 * of Power too. */
static const float exp_settings[][2] = {{1, 1}, {0.48520303f, 1.2311444f}, {-0.7f, 0.5f}};
static const float log_settings[][3] = {{1, 5, 1}, {0.5f, 3, 0.43429448f}};
static const float power_settings[][3] = {{2, 0.5f, 1},      {3, 0.5f, 0.1f}, {0.5f, 0.2f, 3},
                                          {-1.5f, 0.25f, 2}, {1, 0.5f, 1},    {0, 0.5f, 1},
                                          {2, 0, 1.5f}};

static double d_abs(double x, double p) {
  (void)p;
  return fabs(x);
}
static double d_elu(double x, double p) { return x > 0 ? x : p * expm1(x); }
static double d_bnll(double x, double p) {
  (void)p;
  return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}
static double d_threshold(double x, double p) { return x > p ? 1 : 0; }
static double d_exp(double x, double p) {
  const float *s = exp_settings[(int)p];
  return s[1] * exp(s[0] * x);
}
static double d_log(double x, double p) {
  const float *s = log_settings[(int)p];
  return log(s[0] * x + s[1]) * s[2];
}
static double d_power(double x, double p) {
  const float *s = power_settings[(int)p];
  return pow(s[1] * x + s[2], s[0]);
}
static double d_swish(double x, double p) { return x / (1 + exp(-p * x)); }
static double d_gelu(double x, double p) {
  const double sqrt_2_pi = 0.79788456080286535588;
  return p != 0 ? 0.5 * x * (1 + tanh(sqrt_2_pi * (x + 0.044715 * x * x * x)))
                : 0.5 * x * erfc(-x / sqrt(2.0));
}

/* Runs neuron op `op` on n values with the row's setting p: out = f(v) for a forward; for a
 * gradient out = dy f'(x), v being what the op reads (x, or Exp's output). */
static int neuron_run(const kiln_backend *b, const kiln_op_ctx *c, int op, float *out,
                      const float *dy, const float *v, int64_t n, float p) {
  switch (op) {
  case KILN_OP_absval_fwd: return b->absval_fwd(c, out, v, n);
  case KILN_OP_absval_bwd: return b->absval_bwd(c, out, dy, v, n);
  case KILN_OP_elu_fwd: return b->elu_fwd(c, out, v, n, p);
  case KILN_OP_elu_bwd: return b->elu_bwd(c, out, dy, v, n, p);
  case KILN_OP_bnll_fwd: return b->bnll_fwd(c, out, v, n);
  case KILN_OP_bnll_bwd: return b->bnll_bwd(c, out, dy, v, n);
  case KILN_OP_threshold_fwd: return b->threshold_fwd(c, out, v, n, p);
  case KILN_OP_swish_fwd: return b->swish_fwd(c, out, v, n, p);
  case KILN_OP_swish_bwd: return b->swish_bwd(c, out, dy, v, n, p);
  case KILN_OP_gelu_fwd: return b->gelu_fwd(c, out, v, n, p != 0);
  case KILN_OP_gelu_bwd: return b->gelu_bwd(c, out, dy, v, n, p != 0);
  case KILN_OP_exp_fwd:
    return b->exp_fwd(c, out, v, n, exp_settings[(int)p][0], exp_settings[(int)p][1]);
  case KILN_OP_exp_bwd: return b->exp_bwd(c, out, dy, v, n, exp_settings[(int)p][0]);
  case KILN_OP_log_fwd: {
    const float *s = log_settings[(int)p];
    return b->log_fwd(c, out, v, n, s[0], s[1], s[2]);
  }
  case KILN_OP_log_bwd: {
    const float *s = log_settings[(int)p];
    return b->log_bwd(c, out, dy, v, n, s[0], s[1], s[0] * s[2]);
  }
  case KILN_OP_power_fwd:
  case KILN_OP_power_bwd: {
    const float *s = power_settings[(int)p];
    /* a constant output, or a constant gradient: the input is not read */
    if (op == KILN_OP_power_fwd)
      return b->power_fwd(c, out, s[0] * s[1] == 0 ? NULL : v, n, s[0], s[1], s[2]);
    return b->power_bwd(c, out, dy, s[0] * s[1] == 0 || s[0] == 1 ? NULL : v, n, s[0], s[1],
                        s[2]);
  }
  }
  return KILN_ERR_INVALID;
}

/* y = f(x), x in [-range, range), against f in double. */
static double neuron_forward(int op, scalar_fn f, float range, const kiln_backend *b,
                             const kiln_op_ctx *c, int64_t n, float p, kiln_rng *r) {
  tensor x = input(c, n, -range, range, 0, r), y = make(c, n);
  assert_int_equal(neuron_run(b, c, op, y.d, NULL, x.d, n, p), KILN_OK);
  fetch(&y);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = f(x.h[i], p);
  double e = error_of(y.h, want, n);
  free(want);
  drop(&x);
  drop(&y);
  return e;
}

/* dx = dy f'(x) against central differences of f in double; x away from the kinks at 0. The op
 * reads x, or (Exp) the output f(x) as float. */
static double neuron_backward(int op, scalar_fn f, float range, const kiln_backend *b,
                              const kiln_op_ctx *c, int64_t n, float p, kiln_rng *r) {
  tensor x = input(c, n, -range, range, 0.01f, r), dy = input(c, n, -2, 2, 0, r), dx = make(c, n);
  tensor v = make(c, n);
  for (int64_t i = 0; i < n; i++) v.h[i] = op == KILN_OP_exp_bwd ? (float)f(x.h[i], p) : x.h[i];
  assert_int_equal(kiln_device_to_device(c->device, v.d, v.h, sizeof(float) * (size_t)n), KILN_OK);
  assert_int_equal(neuron_run(b, c, op, dx.d, dy.d, v.d, n, p), KILN_OK);
  fetch(&dx);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = dy.h[i] * d_slope(f, x.h[i], p);
  double e = error_of(dx.h, want, n);
  free(want);
  drop(&x);
  drop(&dy);
  drop(&dx);
  drop(&v);
  return e;
}

/* One forward and one gradient case per function; BNLL's p is its inputs' range (past 50 its
 * gradient clamps), the others' inputs are in [-4, 4). */
#define NEURON_CASES(name, f, range)                                                            \
  static double case_##name##_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,       \
                                  float p, kiln_rng *r) {                                       \
    return neuron_forward(KILN_OP_##name##_fwd, f, range, b, c, n, p, r);                      \
  }                                                                                             \
  static double case_##name##_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,       \
                                  float p, kiln_rng *r) {                                       \
    return neuron_backward(KILN_OP_##name##_bwd, f, range, b, c, n, p, r);                     \
  }
NEURON_CASES(absval, d_abs, 4)
NEURON_CASES(elu, d_elu, 4)
NEURON_CASES(bnll, d_bnll, p)
NEURON_CASES(exp, d_exp, 4)
NEURON_CASES(log, d_log, 4)
NEURON_CASES(power, d_power, 4)
NEURON_CASES(swish, d_swish, 4)
NEURON_CASES(gelu, d_gelu, 4)
#undef NEURON_CASES
static double case_threshold_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                 kiln_rng *r) {
  return neuron_forward(KILN_OP_threshold_fwd, d_threshold, 4, b, c, n, p, r);
}

/* PReLU's shapes (N, C, D) by a row's n: one value, odd sizes, and one past the parallel size. */
static const int64_t prelu_shapes[][3] = {{1, 1, 1}, {2, 3, 5}, {3, 7, 33}, {4, 16, 700}};

static double d_prelu(double x, double a) { return x > 0 ? x : a * x; }

/* y, dx (central differences in x) or da (accumulated; central differences in the slope, summed
 * in double) against PReLU in double, slopes in [-0.5, 0.5) (learned ones may be negative);
 * shared: one slope for every channel. */
static double case_prelu(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t s,
                         bool shared, kiln_rng *r) {
  const int64_t N = prelu_shapes[s][0], C = prelu_shapes[s][1], D = prelu_shapes[s][2];
  const int64_t n = N * C * D, na = shared ? 1 : C;
  tensor x = input(c, n, -4, 4, 0.01f, r), a = input(c, na, -0.5f, 0.5f, 0, r);
  tensor dy = input(c, n, -2, 2, 0, r);
  double e;
  if (op == KILN_OP_prelu_slope_bwd) {
    tensor da = input(c, na, -1, 1, 0, r), sums = make(c, 2 * C); /* C doubles */
    assert_int_equal(b->prelu_slope_bwd(c, da.d, x.d, dy.d, (double *)sums.d, N, C, D, shared),
                     KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)na);
    const double h = 1e-5;
    for (int64_t k = 0; k < na; k++) want[k] = da.h[k];
    for (int64_t i = 0; i < n; i++) {
      const int64_t k = shared ? 0 : i / D % C;
      want[k] += dy.h[i] * (d_prelu(x.h[i], a.h[k] + h) - d_prelu(x.h[i], a.h[k] - h)) / (2 * h);
    }
    fetch(&da);
    e = error_of(da.h, want, na);
    free(want);
    drop(&da);
    drop(&sums);
  } else {
    tensor y = make(c, n);
    const bool fwd = op == KILN_OP_prelu_fwd;
    assert_int_equal(fwd ? b->prelu_fwd(c, y.d, x.d, a.d, N, C, D, shared)
                         : b->prelu_bwd(c, y.d, dy.d, x.d, a.d, N, C, D, shared),
                     KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
      const double slope = a.h[shared ? 0 : i / D % C];
      want[i] = fwd ? d_prelu(x.h[i], slope) : dy.h[i] * d_slope(d_prelu, x.h[i], slope);
    }
    fetch(&y);
    e = error_of(y.h, want, n);
    free(want);
    drop(&y);
  }
  drop(&x);
  drop(&a);
  drop(&dy);
  return e;
}
static double case_prelu_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  return case_prelu(KILN_OP_prelu_fwd, b, c, n, p != 0, r);
}
static double case_prelu_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  return case_prelu(KILN_OP_prelu_bwd, b, c, n, p != 0, r);
}
static double case_prelu_slope_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  return case_prelu(KILN_OP_prelu_slope_bwd, b, c, n, p != 0, r);
}

/* ---- norm cases ---- */

/* The host's values of t to its device copy. */
static void norm_upload(tensor *t) {
  assert_int_equal(kiln_device_to_device(t->dev, t->d, t->h, sizeof(float) * (size_t)t->n),
                   KILN_OK);
}

/* The worse of two errors (a NaN is the worst). */
static double norm_worse(double a, double b) { return !(a <= b) ? a : b; }

/* e against a tensor's values fetched from the device and `want` in double. */
static double norm_check(double e, tensor *t, const double *want) {
  fetch(t);
  return norm_worse(e, error_of(t->h, want, t->n));
}

static double *norm_doubles(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  assert_non_null(p);
  return p;
}

/* Element (n, ch, s) of N x C x S values in the plain layout (block 0) or nChw16c (block 16). */
static int64_t norm_at(int64_t n, int64_t ch, int64_t s, int64_t C, int64_t S, int block) {
  return block ? ((n * (C / 16) + ch / 16) * S + s) * 16 + ch % 16 : (n * C + ch) * S + s;
}

/* BatchNorm's shapes (N, C, S, block): 1, odd, channels that are not multiples of 16 in the
 * plain layout and are in the blocked one, one image and several chunks of KILN_BN_CHUNK images,
 * and one of each layout past the parallel threshold. */
static const int64_t bn_shapes[][4] = {{1, 1, 1, 0},   {2, 3, 1, 0},    {3, 7, 5, 0},
                                       {4, 5, 33, 0},  {3, 32, 5, 0},   {3, 400, 29, 0},
                                       {1, 16, 1, 16}, {2, 16, 3, 16},  {9, 48, 9, 16},
                                       {17, 128, 16, 16}};

/* Settings of the BatchNorm rows, bits of p. */
enum {
  BN_GLOBAL = 1, /* the running statistics, not the batch's */
  BN_FUSED = 2,  /* with the Scale's gamma and beta */
  BN_RELU = 4,   /* and a ReLU of slope 0.1 after them */
  BN_IN_PLACE = 8, /* y = x, or dx = dy */
  BN_NO_DX = 16,   /* backward: the parameter gradients alone */
};

/* One channel of BatchNorm in double over its m values v: the batch's mean and biased variance
 * (or, global, mu and var as given) into *mu, *var, then xn and y (either may be NULL), through
 * gamma g, beta b and a ReLU of `slope` when fused; returns the sum of dy y (dy non-NULL). */
static double bn_channel(double *y, double *xn, double *mu, double *var, const double *v,
                         int64_t m, bool global, double eps, bool fused, double g, double b,
                         double slope, const double *dy) {
  if (!global) {
    double s = 0, q = 0;
    for (int64_t j = 0; j < m; j++) s += v[j];
    *mu = s / (double)m;
    for (int64_t j = 0; j < m; j++) q += (v[j] - *mu) * (v[j] - *mu);
    *var = q / (double)m;
  }
  const double inv = 1 / sqrt(*var + eps);
  double L = 0;
  for (int64_t j = 0; j < m; j++) {
    const double h = (v[j] - *mu) * inv, z = fused ? h * g + b : h;
    const double out = z > 0 ? z : slope * z;
    if (xn) xn[j] = h;
    if (y) y[j] = out;
    if (dy) L += dy[j] * out;
  }
  return L;
}

/* Moves the values of one channel whose z = xn g + b lies within `gap` of the ReLU's kink away
 * from it, so that finite differences never step across it; where moving them cannot (two
 * values normalise to -1 and 1 wherever they are), moves beta. Returns false if it did not
 * settle. */
static bool bn_off_kink(double *v, int64_t m, bool global, double mu, double var, double eps,
                        double g, double *b) {
  const double gap = 0.05;
  for (int tries = 0; tries < 10; tries++, *b += 0.25) {
    for (int it = 0; it < 50; it++) {
      double mean = mu, variance = var;
      bn_channel(NULL, NULL, &mean, &variance, v, m, global, eps, false, 1, 0, 1, NULL);
      const double inv = 1 / sqrt(variance + eps);
      bool moved = false;
      for (int64_t j = 0; j < m; j++) {
        const double z = (v[j] - mean) * inv * g + *b;
        if (fabs(z) >= gap) continue;
        v[j] += (z >= 0 ? 1 : -1) * (g > 0 ? 1 : -1) * 4 * gap / (fabs(g) * inv);
        moved = true;
      }
      if (!moved) return true;
    }
  }
  return false;
}

/* batch_norm_fwd at bn_shapes[n] with the settings p: every output, the running sums included,
 * against the double-precision forward. */
static double case_batch_norm_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  const int64_t N = bn_shapes[n][0], C = bn_shapes[n][1], S = bn_shapes[n][2], m = N * S;
  const int block = (int)bn_shapes[n][3], set = (int)p;
  const bool global = set & BN_GLOBAL, fused = set & BN_FUSED;
  const float maf = 0.9f, eps = 1e-3f, slope = set & BN_RELU ? 0.1f : 1.0f;
  tensor x = input(c, N * C * S, -2, 3, 0, r), xn = make(c, N * C * S);
  tensor y = set & BN_IN_PLACE ? x : make(c, N * C * S);
  tensor mean = make(c, C), inv = make(c, C), rm = input(c, C, -1, 1, 0, r);
  tensor rv = input(c, C, 0.2f, 2, 0, r), cnt = input(c, 1, 1, 4, 0, r);
  tensor g = input(c, C, -1.5f, 1.5f, 0.3f, r), be = input(c, C, -1, 1, 0, r);
  void *scratch;
  assert_int_equal(kiln_device_alloc(c->device, kiln_batch_norm_scratch(N, C), &scratch), KILN_OK);
  double *want_y = norm_doubles(N * C * S), *want_xn = norm_doubles(N * C * S);
  double *want_mean = norm_doubles(C), *want_inv = norm_doubles(C), *want_rm = norm_doubles(C);
  double *want_rv = norm_doubles(C), want_cnt = global ? cnt.h[0] : maf * cnt.h[0] + 1.0;
  double *v = norm_doubles(m), *vy = norm_doubles(m), *vxn = norm_doubles(m);
  for (int64_t ch = 0; ch < C; ch++) {
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) v[i * S + s] = x.h[norm_at(i, ch, s, C, S, block)];
    double mu = rm.h[ch] / cnt.h[0], var = rv.h[ch] / cnt.h[0];
    bn_channel(vy, vxn, &mu, &var, v, m, global, eps, fused, g.h[ch], be.h[ch], slope, NULL);
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t e = norm_at(i, ch, s, C, S, block);
        want_y[e] = vy[i * S + s];
        want_xn[e] = vxn[i * S + s];
      }
    want_mean[ch] = mu;
    want_inv[ch] = 1 / sqrt(var + eps);
    want_rm[ch] = global ? rm.h[ch] : maf * rm.h[ch] + mu;
    want_rv[ch] = global ? rv.h[ch] : maf * rv.h[ch] + (m > 1 ? var * m / (m - 1) : var);
  }
  assert_int_equal(b->batch_norm_fwd(c, y.d, xn.d, mean.d, inv.d, rm.d, rv.d, cnt.d, scratch,
                                     x.d, fused ? g.d : NULL, fused ? be.d : NULL, N, C, S,
                                     block, global, maf, eps, slope),
                   KILN_OK);
  double e = norm_check(0, &y, want_y);
  e = norm_check(e, &xn, want_xn);
  e = norm_check(e, &mean, want_mean);
  e = norm_check(e, &inv, want_inv);
  e = norm_check(e, &rm, want_rm);
  e = norm_check(e, &rv, want_rv);
  e = norm_check(e, &cnt, &want_cnt);
  free(want_y), free(want_xn), free(want_mean), free(want_inv), free(want_rm), free(want_rv);
  free(v), free(vy), free(vxn);
  kiln_device_free(c->device, scratch);
  drop(&x), drop(&xn), drop(&mean), drop(&inv), drop(&rm), drop(&rv), drop(&cnt), drop(&g);
  drop(&be);
  if (!(set & BN_IN_PLACE)) drop(&y);
  return e;
}

/* batch_norm_apply: xn = (x - mean) inv and y (fused or not) from given means and inverses. */
static double case_batch_norm_apply(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                    float p, kiln_rng *r) {
  const int64_t N = bn_shapes[n][0], C = bn_shapes[n][1], S = bn_shapes[n][2];
  const int block = (int)bn_shapes[n][3], set = (int)p;
  const bool fused = set & BN_FUSED;
  const float slope = set & BN_RELU ? 0.1f : 1.0f;
  tensor x = input(c, N * C * S, -2, 3, 0, r), xn = make(c, N * C * S), y = make(c, N * C * S);
  tensor mean = input(c, C, -1, 1, 0, r), inv = input(c, C, 0.2f, 3, 0, r);
  tensor g = input(c, C, -1.5f, 1.5f, 0.3f, r), be = input(c, C, -1, 1, 0, r);
  double *want_y = norm_doubles(N * C * S), *want_xn = norm_doubles(N * C * S);
  for (int64_t i = 0; i < N; i++)
    for (int64_t ch = 0; ch < C; ch++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t e = norm_at(i, ch, s, C, S, block);
        const double h = ((double)x.h[e] - mean.h[ch]) * inv.h[ch];
        const double z = fused ? h * g.h[ch] + be.h[ch] : h;
        want_xn[e] = h;
        want_y[e] = z > 0 ? z : slope * z;
      }
  assert_int_equal(b->batch_norm_apply(c, y.d, xn.d, x.d, mean.d, inv.d, fused ? g.d : NULL,
                                       fused ? be.d : NULL, N, C, S, block, slope),
                   KILN_OK);
  double e = norm_check(0, &y, want_y);
  e = norm_check(e, &xn, want_xn);
  free(want_y), free(want_xn);
  drop(&x), drop(&xn), drop(&y), drop(&mean), drop(&inv), drop(&g), drop(&be);
  return e;
}

/* batch_norm_bwd against central differences of the double-precision forward, channel by
 * channel (a channel's outputs depend on its own inputs alone): dx, and with the fused Scale
 * gamma's and beta's gradients (added to what they held). xn and inv are the forward's, in
 * float, as batch_norm_fwd leaves them. */
static double case_batch_norm_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  const int64_t N = bn_shapes[n][0], C = bn_shapes[n][1], S = bn_shapes[n][2], m = N * S;
  const int block = (int)bn_shapes[n][3], set = (int)p;
  const bool global = set & BN_GLOBAL, fused = set & BN_FUSED, has_dx = !(set & BN_NO_DX);
  const double eps = 1e-3, slope = set & BN_RELU ? 0.1 : 1.0, h = 1e-4;
  tensor x = input(c, N * C * S, -2, 3, 0, r), dy = input(c, N * C * S, -1, 1, 0, r);
  tensor xn = make(c, N * C * S), inv = make(c, C);
  tensor dx = set & BN_IN_PLACE ? dy : make(c, N * C * S);
  tensor g = input(c, C, -1.5f, 1.5f, 0.3f, r), be = input(c, C, -1, 1, 0.1f, r);
  tensor dg = input(c, C, -1, 1, 0, r), db = input(c, C, -1, 1, 0, r);
  void *scratch;
  assert_int_equal(kiln_device_alloc(c->device, kiln_batch_norm_scratch(N, C), &scratch), KILN_OK);
  double *want_dx = norm_doubles(N * C * S), *want_dg = norm_doubles(C), *want_db = norm_doubles(C);
  double *v = norm_doubles(m), *vdy = norm_doubles(m), *vxn = norm_doubles(m);
  bool settled = true;
  for (int64_t ch = 0; ch < C; ch++) {
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t e = norm_at(i, ch, s, C, S, block);
        v[i * S + s] = x.h[e];
        vdy[i * S + s] = dy.h[e];
      }
    const double gmu = 0.3 * (double)ch / (double)C - 0.1, gvar = 0.5 + 0.01 * (double)ch;
    const double gc = fused ? g.h[ch] : 1;
    double bc = fused ? be.h[ch] : 0;
    if (fused && slope != 1) settled &= bn_off_kink(v, m, global, gmu, gvar, eps, gc, &bc);
    if (fused) be.h[ch] = (float)bc;
    bc = fused ? be.h[ch] : 0; /* as the op reads it */
    double mu = gmu, var = gvar;
    bn_channel(NULL, vxn, &mu, &var, v, m, global, eps, fused, gc, bc, slope, NULL);
    inv.h[ch] = (float)(1 / sqrt(var + eps));
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) xn.h[norm_at(i, ch, s, C, S, block)] = (float)vxn[i * S + s];
    /* L(v, gamma, beta) = sum dy y; its derivatives by central differences */
#define BN_LOSS(gamma, beta)                                                                    \
  bn_channel(NULL, NULL, &(double){gmu}, &(double){gvar}, v, m, global, eps, fused, gamma, beta, \
             slope, vdy)
    for (int64_t j = 0; j < m; j++) {
      const double keep = v[j];
      v[j] = keep + h;
      const double up = BN_LOSS(gc, bc);
      v[j] = keep - h;
      const double down = BN_LOSS(gc, bc);
      v[j] = keep;
      want_dx[norm_at(j / S, ch, j % S, C, S, block)] = (up - down) / (2 * h);
    }
    want_dg[ch] = dg.h[ch] + (BN_LOSS(gc + h, bc) - BN_LOSS(gc - h, bc)) / (2 * h);
    want_db[ch] = db.h[ch] + (BN_LOSS(gc, bc + h) - BN_LOSS(gc, bc - h)) / (2 * h);
#undef BN_LOSS
  }
  norm_upload(&xn);
  norm_upload(&inv);
  norm_upload(&be);
  assert_int_equal(b->batch_norm_bwd(c, has_dx ? dx.d : NULL, dg.d, db.d, scratch, dy.d, xn.d,
                                     inv.d, fused ? g.d : NULL, fused ? be.d : NULL, N, C, S,
                                     block, global, (float)slope),
                   KILN_OK);
  double e = settled ? 0 : INFINITY;
  if (has_dx) e = norm_check(e, &dx, want_dx);
  if (fused) {
    e = norm_check(e, &dg, want_dg);
    e = norm_check(e, &db, want_db);
  }
  free(want_dx), free(want_dg), free(want_db), free(v), free(vdy), free(vxn);
  kiln_device_free(c->device, scratch);
  drop(&x), drop(&dy), drop(&xn), drop(&inv), drop(&g), drop(&be), drop(&dg), drop(&db);
  if (!(set & BN_IN_PLACE)) drop(&dx);
  return e;
}

/* Scale's and Bias's shapes (outer, dim, inner, block): 1, odd, a scalar, inner 1, a blocked
 * layout of 16 and of 48 channels, and past the parallel threshold in both. */
static const int64_t affine_shapes[][4] = {{1, 1, 1, 0},   {3, 7, 5, 0},    {2, 1, 33, 0},
                                           {5, 13, 1, 0},  {40, 30, 31, 0}, {1, 16, 1, 16},
                                           {3, 48, 7, 16}, {9, 32, 121, 16}};

/* Settings of the Scale and Bias rows, bits of p. */
enum {
  AFF_BETA = 1,     /* scale: with beta, and its gradient */
  AFF_KEEP = 2,     /* scale_fwd: the input kept aside */
  AFF_IN_PLACE = 4, /* y = x, or dx = dy */
  AFF_SET = 8,      /* the gradient of gamma (or b) overwritten, not accumulated */
  AFF_NO_DX = 16,   /* scale_bwd: no dx */
  AFF_NO_DG = 32,   /* scale_bwd: no dgamma */
};

static int64_t affine_d(int64_t e, int64_t dim, int64_t inner, int block) {
  return block ? (e / (inner * 16)) % (dim / 16) * 16 + e % 16 : e / inner % dim;
}

/* y = x gamma + beta, and the kept copy. */
static double case_scale_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  const int64_t O = affine_shapes[n][0], D = affine_shapes[n][1], I = affine_shapes[n][2];
  const int block = (int)affine_shapes[n][3], set = (int)p;
  const int64_t count = O * D * I;
  tensor x = input(c, count, -2, 2, 0, r), keep = make(c, count);
  tensor y = set & AFF_IN_PLACE ? x : make(c, count);
  tensor g = input(c, D, -2, 2, 0, r), be = input(c, D, -1, 1, 0, r);
  double *want = norm_doubles(count), *want_keep = norm_doubles(count);
  for (int64_t e = 0; e < count; e++) {
    const int64_t d = affine_d(e, D, I, block);
    want[e] = (double)x.h[e] * g.h[d] + (set & AFF_BETA ? be.h[d] : 0);
    want_keep[e] = x.h[e];
  }
  assert_int_equal(b->scale_fwd(c, y.d, set & AFF_KEEP ? keep.d : NULL, x.d, g.d,
                                set & AFF_BETA ? be.d : NULL, O, D, I, block),
                   KILN_OK);
  double e = norm_check(0, &y, want);
  if (set & AFF_KEEP) e = norm_check(e, &keep, want_keep);
  free(want), free(want_keep);
  drop(&x), drop(&keep), drop(&g), drop(&be);
  if (!(set & AFF_IN_PLACE)) drop(&y);
  return e;
}

/* L = sum dy (x gamma + beta): dx, dgamma and dbeta by central differences (element by element,
 * each touching the outputs it feeds). */
static double case_scale_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  const int64_t O = affine_shapes[n][0], D = affine_shapes[n][1], I = affine_shapes[n][2];
  const int block = (int)affine_shapes[n][3], set = (int)p;
  const int64_t count = O * D * I;
  const double h = 1e-3;
  tensor x = input(c, count, -2, 2, 0, r), dy = input(c, count, -1, 1, 0, r);
  tensor dx = set & AFF_IN_PLACE ? dy : make(c, count);
  tensor g = input(c, D, -2, 2, 0, r), be = input(c, D, -1, 1, 0, r);
  tensor dg = input(c, D, -1, 1, 0, r), db = input(c, D, -1, 1, 0, r);
  double *want_dx = norm_doubles(count), *want_dg = norm_doubles(D), *want_db = norm_doubles(D);
  for (int64_t d = 0; d < D; d++) {
    want_dg[d] = set & AFF_SET ? 0 : dg.h[d];
    want_db[d] = db.h[d];
  }
  for (int64_t e = 0; e < count; e++) {
    const int64_t d = affine_d(e, D, I, block);
    const double xe = x.h[e], ge = g.h[d], bd = be.h[d], dye = dy.h[e];
    want_dx[e] = (dye * ((xe + h) * ge + bd) - dye * ((xe - h) * ge + bd)) / (2 * h);
    want_dg[d] += (dye * (xe * (ge + h) + bd) - dye * (xe * (ge - h) + bd)) / (2 * h);
    want_db[d] += (dye * (xe * ge + bd + h) - dye * (xe * ge + bd - h)) / (2 * h);
  }
  const bool has_dx = !(set & AFF_NO_DX), has_dg = !(set & AFF_NO_DG), has_db = set & AFF_BETA;
  assert_int_equal(b->scale_bwd(c, has_dx ? dx.d : NULL, has_dg ? dg.d : NULL,
                                has_db ? db.d : NULL, dy.d, x.d, g.d, O, D, I, block,
                                !(set & AFF_SET)),
                   KILN_OK);
  double e = 0;
  if (has_dx) e = norm_check(e, &dx, want_dx);
  if (has_dg) e = norm_check(e, &dg, want_dg);
  if (has_db) e = norm_check(e, &db, want_db);
  free(want_dx), free(want_dg), free(want_db);
  drop(&x), drop(&g), drop(&be), drop(&dg), drop(&db);
  drop(&dy);
  if (!(set & AFF_IN_PLACE)) drop(&dx);
  return e;
}

/* y = x + b (plain shapes of affine_shapes). */
static double case_bias_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  const int64_t O = affine_shapes[n][0], D = affine_shapes[n][1], I = affine_shapes[n][2];
  const int64_t count = O * D * I;
  tensor x = input(c, count, -2, 2, 0, r), bias = input(c, D, -1, 1, 0, r);
  tensor y = (int)p & AFF_IN_PLACE ? x : make(c, count);
  double *want = norm_doubles(count);
  for (int64_t e = 0; e < count; e++) want[e] = (double)x.h[e] + bias.h[e / I % D];
  assert_int_equal(b->bias_fwd(c, y.d, x.d, bias.d, O, D, I), KILN_OK);
  double e = norm_check(0, &y, want);
  free(want);
  drop(&x), drop(&bias);
  if (!((int)p & AFF_IN_PLACE)) drop(&y);
  return e;
}

/* L = sum dy (x + b): db by central differences, added or (AFF_SET) in place of what it held. */
static double case_bias_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  const int64_t O = affine_shapes[n][0], D = affine_shapes[n][1], I = affine_shapes[n][2];
  const int64_t count = O * D * I;
  const double h = 1e-3;
  tensor x = input(c, count, -2, 2, 0, r), dy = input(c, count, -1, 1, 0, r);
  tensor bias = input(c, D, -1, 1, 0, r), db = input(c, D, -1, 1, 0, r);
  double *want = norm_doubles(D);
  for (int64_t d = 0; d < D; d++) want[d] = (int)p & AFF_SET ? 0 : db.h[d];
  for (int64_t e = 0; e < count; e++) {
    const double xe = x.h[e], bd = bias.h[e / I % D];
    want[e / I % D] += (dy.h[e] * (xe + bd + h) - dy.h[e] * (xe + bd - h)) / (2 * h);
  }
  assert_int_equal(b->bias_bwd(c, db.d, dy.d, O, D, I, !((int)p & AFF_SET)), KILN_OK);
  double e = norm_check(0, &db, want);
  free(want);
  drop(&x), drop(&dy), drop(&bias), drop(&db);
  return e;
}

/* LayerNorm's shapes (M rows of K): 1, odd, K off the 64-wide column blocks, and past the
 * parallel threshold. */
static const int64_t ln_shapes[][2] = {{1, 1}, {3, 5}, {7, 65}, {2, 130}, {470, 70}};
enum { LN_GAIN = 1, LN_BIAS = 2, LN_IN_PLACE = 4, LN_NO_DX = 8 };

/* One row of LayerNorm in double: xhat and y (either NULL), the sum of dy y (dy non-NULL). */
static double ln_row(double *y, double *xhat, double *rstd, const double *v, int64_t K,
                     double eps, const double *g, const double *bias, const double *dy) {
  double s = 0, q = 0;
  for (int64_t k = 0; k < K; k++) s += v[k];
  const double mean = s / (double)K;
  for (int64_t k = 0; k < K; k++) q += (v[k] - mean) * (v[k] - mean);
  const double rs = 1 / sqrt(q / (double)K + eps);
  if (rstd) *rstd = rs;
  double L = 0;
  for (int64_t k = 0; k < K; k++) {
    const double hk = (v[k] - mean) * rs;
    const double out = (g ? hk * g[k] : hk) + (bias ? bias[k] : 0);
    if (xhat) xhat[k] = hk;
    if (y) y[k] = out;
    if (dy) L += dy[k] * out;
  }
  return L;
}

static double case_layer_norm_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  const int64_t M = ln_shapes[n][0], K = ln_shapes[n][1];
  const int set = (int)p;
  const float eps = 1e-5f;
  tensor x = input(c, M * K, -2, 3, 0, r), xhat = make(c, M * K), rstd = make(c, M);
  tensor y = set & LN_IN_PLACE ? x : make(c, M * K);
  tensor g = input(c, K, -2, 2, 0, r), bias = input(c, K, -1, 1, 0, r);
  double *want_y = norm_doubles(M * K), *want_h = norm_doubles(M * K), *want_r = norm_doubles(M);
  double *v = norm_doubles(K), *gd = norm_doubles(K), *bd = norm_doubles(K);
  for (int64_t k = 0; k < K; k++) gd[k] = g.h[k], bd[k] = bias.h[k];
  for (int64_t i = 0; i < M; i++) {
    for (int64_t k = 0; k < K; k++) v[k] = x.h[i * K + k];
    ln_row(want_y + i * K, want_h + i * K, want_r + i, v, K, eps, set & LN_GAIN ? gd : NULL,
           set & LN_GAIN && set & LN_BIAS ? bd : NULL, NULL);
  }
  assert_int_equal(b->layer_norm_fwd(c, y.d, xhat.d, rstd.d, x.d, set & LN_GAIN ? g.d : NULL,
                                     set & LN_GAIN && set & LN_BIAS ? bias.d : NULL, M, K, eps),
                   KILN_OK);
  double e = norm_check(0, &y, want_y);
  e = norm_check(e, &xhat, want_h);
  e = norm_check(e, &rstd, want_r);
  free(want_y), free(want_h), free(want_r), free(v), free(gd), free(bd);
  drop(&x), drop(&xhat), drop(&rstd), drop(&g), drop(&bias);
  if (!(set & LN_IN_PLACE)) drop(&y);
  return e;
}

/* layer_norm_bwd against central differences of the double forward: dx row by row, dgain and
 * dbias column by column over every row. */
static double case_layer_norm_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  const int64_t M = ln_shapes[n][0], K = ln_shapes[n][1];
  const int set = (int)p;
  const bool gain = set & LN_GAIN, bias = gain && set & LN_BIAS, has_dx = !(set & LN_NO_DX);
  const double eps = 1e-5, h = 1e-4;
  tensor x = input(c, M * K, -2, 3, 0, r), dy = input(c, M * K, -1, 1, 0, r);
  tensor xhat = make(c, M * K), rstd = make(c, M), dx = set & LN_IN_PLACE ? dy : make(c, M * K);
  tensor g = input(c, K, -2, 2, 0, r), dg = input(c, K, -1, 1, 0, r), db = input(c, K, -1, 1, 0, r);
  double *want_dx = norm_doubles(M * K), *want_dg = norm_doubles(K), *want_db = norm_doubles(K);
  double *gd = norm_doubles(K), *v = norm_doubles(M * K), *vdy = norm_doubles(M * K);
  double *vh = norm_doubles(K), *bd = norm_doubles(K); /* bd: a bias of 0, moved for its gradient */
  for (int64_t k = 0; k < K; k++) gd[k] = g.h[k], want_dg[k] = dg.h[k], want_db[k] = db.h[k];
  for (int64_t e = 0; e < M * K; e++) v[e] = x.h[e], vdy[e] = dy.h[e];
  for (int64_t i = 0; i < M; i++) {
    double *vi = v + i * K, *dyi = vdy + i * K, rs;
    ln_row(NULL, vh, &rs, vi, K, eps, gain ? gd : NULL, NULL, NULL);
    for (int64_t k = 0; k < K; k++) xhat.h[i * K + k] = (float)vh[k];
    rstd.h[i] = (float)rs;
    for (int64_t k = 0; k < K; k++) {
      const double keep = vi[k];
      vi[k] = keep + h;
      const double up = ln_row(NULL, NULL, NULL, vi, K, eps, gain ? gd : NULL, NULL, dyi);
      vi[k] = keep - h;
      const double down = ln_row(NULL, NULL, NULL, vi, K, eps, gain ? gd : NULL, NULL, dyi);
      vi[k] = keep;
      want_dx[i * K + k] = (up - down) / (2 * h);
    }
    /* each row's share of the gain's and the bias's gradients */
    for (int64_t k = 0; k < K; k++) {
      const double gk = gd[k];
      gd[k] = gk + h;
      double up = ln_row(NULL, NULL, NULL, vi, K, eps, gd, bd, dyi);
      gd[k] = gk - h;
      double down = ln_row(NULL, NULL, NULL, vi, K, eps, gd, bd, dyi);
      gd[k] = gk;
      want_dg[k] += (up - down) / (2 * h);
      bd[k] = h;
      up = ln_row(NULL, NULL, NULL, vi, K, eps, gd, bd, dyi);
      bd[k] = -h;
      down = ln_row(NULL, NULL, NULL, vi, K, eps, gd, bd, dyi);
      bd[k] = 0;
      want_db[k] += (up - down) / (2 * h);
    }
  }
  norm_upload(&xhat);
  norm_upload(&rstd);
  assert_int_equal(b->layer_norm_bwd(c, has_dx ? dx.d : NULL, gain ? dg.d : NULL,
                                     bias ? db.d : NULL, dy.d, xhat.d, rstd.d, gain ? g.d : NULL,
                                     M, K),
                   KILN_OK);
  double e = 0;
  if (has_dx) e = norm_check(e, &dx, want_dx);
  if (gain) e = norm_check(e, &dg, want_dg);
  if (bias) e = norm_check(e, &db, want_db);
  free(want_dx), free(want_dg), free(want_db), free(gd), free(v), free(vdy), free(vh), free(bd);
  drop(&x), drop(&xhat), drop(&rstd), drop(&g), drop(&dg), drop(&db), drop(&dy);
  if (!(set & LN_IN_PLACE)) drop(&dx);
  return e;
}

/* LRN's shapes (N, C, H, W): 1, odd, windows wider than the image, and past both thresholds
 * (the window sums' 8192 and the element loops' 32768 per image). p: local_size * 2 + 1 across
 * channels, + 0 within one. */
static const int64_t lrn_shapes[][4] = {{1, 1, 1, 1}, {2, 7, 5, 3}, {1, 3, 2, 2}, {1, 20, 40, 45}};

typedef struct {
  int64_t C, H, W, size;
  bool across;
  double alpha_over_n, beta, k;
} lrn_case;

/* The window sum of v^2 around (ch, hh, ww) of one image, in double. */
static double lrn_sq(const double *v, const lrn_case *q, int64_t ch, int64_t hh, int64_t ww) {
  const int64_t half = (q->size - 1) / 2;
  double s = 0;
  for (int64_t a = -half; a <= half; a++)
    for (int64_t b2 = q->across ? 0 : -half; b2 <= (q->across ? 0 : half); b2++) {
      const int64_t cc = q->across ? ch + a : ch, h2 = q->across ? hh : hh + a;
      const int64_t w2 = q->across ? ww : ww + b2;
      if (cc < 0 || cc >= q->C || h2 < 0 || h2 >= q->H || w2 < 0 || w2 >= q->W) continue;
      const double t = v[(cc * q->H + h2) * q->W + w2];
      s += t * t;
    }
  return s;
}

static double lrn_out(const double *v, const lrn_case *q, int64_t j) {
  const int64_t ch = j / (q->H * q->W), hh = j / q->W % q->H, ww = j % q->W;
  return v[j] * pow(q->k + q->alpha_over_n * lrn_sq(v, q, ch, hh, ww), -q->beta);
}

static lrn_case lrn_setting(int64_t n, float p) {
  const int set = (int)p;
  const lrn_case q = {.C = lrn_shapes[n][1], .H = lrn_shapes[n][2], .W = lrn_shapes[n][3],
                      .size = set / 2, .across = set & 1, .alpha_over_n = 0.3f / (float)(set / 2),
                      .beta = 0.75, .k = set & 1 ? 2.0 : 1.0};
  return q;
}

static double case_lrn_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                           kiln_rng *r) {
  const lrn_case q = lrn_setting(n, p);
  const int64_t N = lrn_shapes[n][0], chw = q.C * q.H * q.W;
  tensor x = input(c, N * chw, -2, 2, 0, r), y = make(c, N * chw), scale = make(c, N * chw);
  double *want_y = norm_doubles(N * chw), *want_s = norm_doubles(N * chw), *v = norm_doubles(chw);
  for (int64_t i = 0; i < N; i++) {
    for (int64_t j = 0; j < chw; j++) v[j] = x.h[i * chw + j];
    for (int64_t j = 0; j < chw; j++) {
      const int64_t ch = j / (q.H * q.W), hh = j / q.W % q.H, ww = j % q.W;
      want_s[i * chw + j] = q.k + q.alpha_over_n * lrn_sq(v, &q, ch, hh, ww);
      want_y[i * chw + j] = lrn_out(v, &q, j);
    }
  }
  assert_int_equal(b->lrn_fwd(c, y.d, scale.d, x.d, N, q.C, q.H, q.W, q.size, q.across,
                              (float)q.alpha_over_n, (float)q.beta, (float)q.k),
                   KILN_OK);
  double e = norm_check(0, &y, want_y);
  e = norm_check(e, &scale, want_s);
  free(want_y), free(want_s), free(v);
  drop(&x), drop(&y), drop(&scale);
  return e;
}

/* lrn_bwd against central differences of the double forward: a value moves the outputs of the
 * windows around it only, so only those are summed. dx in place of dy. */
static double case_lrn_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                           kiln_rng *r) {
  const lrn_case q = lrn_setting(n, p);
  const int64_t N = lrn_shapes[n][0], chw = q.C * q.H * q.W, half = (q.size - 1) / 2;
  const double h = 1e-4;
  tensor x = input(c, N * chw, -2, 2, 0, r), dy = input(c, N * chw, -1, 1, 0, r);
  tensor scale = make(c, N * chw), ws = make(c, 2 * chw);
  double *want = norm_doubles(N * chw), *v = norm_doubles(chw);
  for (int64_t i = 0; i < N; i++) {
    for (int64_t j = 0; j < chw; j++) v[j] = x.h[i * chw + j];
    for (int64_t j = 0; j < chw; j++) {
      const int64_t ch = j / (q.H * q.W), hh = j / q.W % q.H, ww = j % q.W;
      scale.h[i * chw + j] = (float)(q.k + q.alpha_over_n * lrn_sq(v, &q, ch, hh, ww));
    }
    for (int64_t j = 0; j < chw; j++) {
      const int64_t ch = j / (q.H * q.W), hh = j / q.W % q.H, ww = j % q.W;
      double diff = 0;
      for (int sign = 1; sign >= -1; sign -= 2) {
        const double keep = v[j];
        v[j] = keep + sign * h;
        for (int64_t a = -half; a <= half; a++)
          for (int64_t b2 = q.across ? 0 : -half; b2 <= (q.across ? 0 : half); b2++) {
            const int64_t cc = q.across ? ch + a : ch, h2 = q.across ? hh : hh + a;
            const int64_t w2 = q.across ? ww : ww + b2;
            if (cc < 0 || cc >= q.C || h2 < 0 || h2 >= q.H || w2 < 0 || w2 >= q.W) continue;
            const int64_t o = (cc * q.H + h2) * q.W + w2;
            diff += sign * dy.h[i * chw + o] * lrn_out(v, &q, o);
          }
        v[j] = keep;
      }
      want[i * chw + j] = diff / (2 * h);
    }
  }
  norm_upload(&scale);
  assert_int_equal(b->lrn_bwd(c, dy.d, ws.d, dy.d, x.d, scale.d, N, q.C, q.H, q.W, q.size,
                              q.across, (float)q.alpha_over_n, (float)q.beta),
                   KILN_OK);
  double e = norm_check(0, &dy, want);
  free(want), free(v);
  drop(&x), drop(&dy), drop(&scale), drop(&ws);
  return e;
}

/* MVN's shapes (rows of dim): 1, odd, and past the parallel threshold. p: bit 0 normalize,
 * bit 1 in place. */
static const int64_t mvn_shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {400, 93}};

/* One row of MVN in double: y (or NULL), sd, the sum of dy y (dy non-NULL). */
static double mvn_row(double *y, double *sd, const double *v, int64_t dim, bool normalize,
                      double eps, const double *dy) {
  double s = 0, q = 0;
  for (int64_t i = 0; i < dim; i++) s += v[i];
  const double mean = s / (double)dim;
  for (int64_t i = 0; i < dim; i++) q += (v[i] - mean) * (v[i] - mean);
  const double d = normalize ? sqrt(q / (double)dim) + eps : 1;
  if (sd) *sd = d;
  double L = 0;
  for (int64_t i = 0; i < dim; i++) {
    const double out = (v[i] - mean) / d;
    if (y) y[i] = out;
    if (dy) L += dy[i] * out;
  }
  return L;
}

static double case_mvn_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                           kiln_rng *r) {
  const int64_t R = mvn_shapes[n][0], D = mvn_shapes[n][1];
  const bool normalize = (int)p & 1;
  const float eps = 1e-3f;
  tensor x = input(c, R * D, -2, 3, 0, r), sd = make(c, R);
  tensor y = (int)p & 2 ? x : make(c, R * D);
  double *want_y = norm_doubles(R * D), *want_sd = norm_doubles(R), *v = norm_doubles(D);
  for (int64_t i = 0; i < R; i++) {
    for (int64_t k = 0; k < D; k++) v[k] = x.h[i * D + k];
    mvn_row(want_y + i * D, want_sd + i, v, D, normalize, eps, NULL);
  }
  assert_int_equal(b->mvn_fwd(c, y.d, sd.d, x.d, R, D, normalize, eps), KILN_OK);
  double e = norm_check(0, &y, want_y);
  e = norm_check(e, &sd, want_sd);
  free(want_y), free(want_sd), free(v);
  drop(&x), drop(&sd);
  if (!((int)p & 2)) drop(&y);
  return e;
}

/* mvn_bwd against central differences of the double forward, row by row. Its formula leaves
 * out eps's share of the variance's gradient (Caffe's), so eps is MVN's default, 1e-9. */
static double case_mvn_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                           kiln_rng *r) {
  const int64_t R = mvn_shapes[n][0], D = mvn_shapes[n][1];
  const bool normalize = (int)p & 1;
  const double eps = 1e-9, h = 1e-4;
  tensor x = input(c, R * D, -2, 3, 0, r), dy = input(c, R * D, -1, 1, 0, r);
  tensor y = make(c, R * D), sd = make(c, R), dx = (int)p & 2 ? dy : make(c, R * D);
  double *want = norm_doubles(R * D), *v = norm_doubles(D), *vy = norm_doubles(D);
  double *vdy = norm_doubles(D);
  for (int64_t i = 0; i < R; i++) {
    double s;
    for (int64_t k = 0; k < D; k++) v[k] = x.h[i * D + k], vdy[k] = dy.h[i * D + k];
    mvn_row(vy, &s, v, D, normalize, eps, NULL);
    for (int64_t k = 0; k < D; k++) y.h[i * D + k] = (float)vy[k];
    sd.h[i] = (float)s;
    for (int64_t k = 0; k < D; k++) {
      const double keep = v[k];
      v[k] = keep + h;
      const double up = mvn_row(NULL, &s, v, D, normalize, eps, vdy);
      v[k] = keep - h;
      const double down = mvn_row(NULL, &s, v, D, normalize, eps, vdy);
      v[k] = keep;
      want[i * D + k] = (up - down) / (2 * h);
    }
  }
  norm_upload(&y);
  norm_upload(&sd);
  assert_int_equal(b->mvn_bwd(c, dx.d, dy.d, y.d, sd.d, R, D, normalize), KILN_OK);
  double e = norm_check(0, &dx, want);
  free(want), free(v), free(vy), free(vdy);
  drop(&x), drop(&y), drop(&sd);
  drop(&dy);
  if (!((int)p & 2)) drop(&dx);
  return e;
}

/* Reduction's shapes (num rows of dim): 1, odd, one row, and past the parallel threshold.
 * p: the kind (kiln_reduce_kind), with coeff 1, 0.5 and -2 for SUM, ASUM and SUMSQ. */
static const int64_t red_shapes[][2] = {{1, 1}, {3, 7}, {1, 1000}, {40, 930}};

static double red_value(double v, int kind) {
  return kind == KILN_REDUCE_ASUM ? fabs(v) : kind == KILN_REDUCE_SUMSQ ? v * v : v;
}
static float red_coeff(int kind) { return kind == 0 ? 1.0f : kind == 1 ? 0.5f : -2.0f; }

static double case_reduction_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                 float p, kiln_rng *r) {
  const int64_t R = red_shapes[n][0], D = red_shapes[n][1];
  const int kind = (int)p;
  tensor x = input(c, R * D, -2, 2, 0, r), y = make(c, R);
  double *want = norm_doubles(R);
  for (int64_t i = 0; i < R; i++) {
    for (int64_t k = 0; k < D; k++) want[i] += red_value(x.h[i * D + k], kind);
    want[i] *= red_coeff(kind);
  }
  assert_int_equal(b->reduction_fwd(c, y.d, x.d, R, D, (kiln_reduce_kind)kind, red_coeff(kind)),
                   KILN_OK);
  double e = norm_check(0, &y, want);
  free(want);
  drop(&x), drop(&y);
  return e;
}

/* L = sum dy y: dx by central differences, each value moving its own row's output. */
static double case_reduction_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                 float p, kiln_rng *r) {
  const int64_t R = red_shapes[n][0], D = red_shapes[n][1];
  const int kind = (int)p;
  const double h = 1e-3, coeff = red_coeff(kind);
  tensor x = input(c, R * D, -2, 2, 0.01f, r), dy = input(c, R, -1, 1, 0, r), dx = make(c, R * D);
  double *want = norm_doubles(R * D);
  for (int64_t e = 0; e < R * D; e++) {
    const double v = x.h[e], g = dy.h[e / D] * coeff;
    want[e] = (g * red_value(v + h, kind) - g * red_value(v - h, kind)) / (2 * h);
  }
  assert_int_equal(b->reduction_bwd(c, dx.d, dy.d, x.d, R, D, (kiln_reduce_kind)kind,
                                    (float)coeff),
                   KILN_OK);
  double e = norm_check(0, &dx, want);
  free(want);
  drop(&x), drop(&dy), drop(&dx);
  return e;
}

/* The rows of the norm ops over their cases' shape tables. */
#define BN_SMALL_ROWS(op, fn, p, tol)                                                            \
  {op, fn, 0, p, tol}, {op, fn, 1, p, tol}, {op, fn, 2, p, tol}, {op, fn, 3, p, tol},           \
      {op, fn, 4, p, tol}, {op, fn, 6, p, tol}, {op, fn, 7, p, tol}, {op, fn, 8, p, tol}
#define BN_ROWS(op, fn, p, tol)                                                                  \
  BN_SMALL_ROWS(op, fn, p, tol), {op, fn, 5, p, tol}, {op, fn, 9, p, tol}
#define PLAIN_AFFINE_ROWS(op, fn, p, tol)                                                        \
  {op, fn, 0, p, tol}, {op, fn, 1, p, tol}, {op, fn, 2, p, tol}, {op, fn, 3, p, tol},           \
      {op, fn, 4, p, tol}
#define AFFINE_ROWS(op, fn, p, tol)                                                              \
  PLAIN_AFFINE_ROWS(op, fn, p, tol), {op, fn, 5, p, tol}, {op, fn, 6, p, tol}, {op, fn, 7, p, tol}
#define LN_ROWS(op, fn, p, tol) PLAIN_AFFINE_ROWS(op, fn, p, tol)
#define FOUR_ROWS(op, fn, p, tol)                                                                \
  {op, fn, 0, p, tol}, {op, fn, 1, p, tol}, {op, fn, 2, p, tol}, {op, fn, 3, p, tol}

/* ---- l2norm cases ---- */

/* Normalize's shapes (N, C, S): 1, odd, a 2-axis input (S 1), and past the parallel threshold
 * with positions past a block of 64 and images past a chunk of 256. p: the L2_* bits. */
static const int64_t l2_shapes[][3] = {{1, 1, 1}, {2, 3, 5}, {3, 17, 33}, {5, 9, 1}, {4, 70, 130}};
enum { L2_ACROSS = 1, L2_SHARED = 2, L2_NO_DX = 4, L2_NO_DSCALE = 8 };

typedef struct {
  int64_t N, C, S;
  bool across, shared;
  double eps;
} l2_case;

static l2_case l2_setting(int64_t n, float p) {
  const int set = (int)p;
  const l2_case q = {.N = l2_shapes[n][0], .C = l2_shapes[n][1], .S = l2_shapes[n][2],
                     .across = set & L2_ACROSS, .shared = set & L2_SHARED, .eps = 0.25};
  return q;
}

static int64_t l2_group_of(const l2_case *q, int64_t e) {
  const int64_t n = e / (q->C * q->S);
  return q->across ? n : n * q->S + e % q->S;
}

static double l2_scale_of(const l2_case *q, const float *s, int64_t e) {
  return q->shared ? s[0] : s[e / q->S % q->C];
}

/* In double, per group: sq[g] = sum of x^2 + eps and, with dy, dot[g] = sum of dy scale x. */
static void l2_sums(const l2_case *q, double *sq, double *dot, const float *x, const float *dy,
                    const float *s) {
  const int64_t count = q->N * q->C * q->S;
  for (int64_t g = 0; g < (q->across ? q->N : q->N * q->S); g++) sq[g] = q->eps;
  for (int64_t e = 0; e < count; e++) {
    const int64_t g = l2_group_of(q, e);
    sq[g] += (double)x[e] * x[e];
    if (dy) dot[g] += dy[e] * l2_scale_of(q, s, e) * x[e];
  }
}

static double case_l2norm_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const l2_case q = l2_setting(n, p);
  const int64_t count = q.N * q.C * q.S, groups = q.across ? q.N : q.N * q.S;
  tensor x = input(c, count, -2, 2, 0, r), s = input(c, q.shared ? 1 : q.C, -3, 3, 0, r);
  tensor y = make(c, count), norm = make(c, groups);
  double *sq = norm_doubles(groups), *want_y = norm_doubles(count), *want_n = norm_doubles(groups);
  l2_sums(&q, sq, NULL, x.h, NULL, s.h);
  for (int64_t g = 0; g < groups; g++) want_n[g] = sqrt(sq[g]);
  for (int64_t e = 0; e < count; e++)
    want_y[e] = x.h[e] / want_n[l2_group_of(&q, e)] * l2_scale_of(&q, s.h, e);
  assert_int_equal(b->l2norm_fwd(c, y.d, norm.d, x.d, s.d, q.N, q.C, q.S, q.across, q.shared,
                                 (float)q.eps),
                   KILN_OK);
  double e = norm_check(0, &y, want_y);
  e = norm_check(e, &norm, want_n);
  free(sq), free(want_y), free(want_n);
  drop(&x), drop(&s), drop(&y), drop(&norm);
  return e;
}

/* L = sum of dy y. dx by central differences of the double forward: moving x_j by t moves only
 * its group's share, (dot + dy_j scale_j t) / sqrt(sq + 2 x_j t + t^2). L is linear in the
 * scale, so its gradient is sum of dy x / norm exactly; it adds to what dscale held. */
static double case_l2norm_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const l2_case q = l2_setting(n, p);
  const int set = (int)p;
  const bool has_dx = !(set & L2_NO_DX), has_ds = !(set & L2_NO_DSCALE);
  const int64_t count = q.N * q.C * q.S, groups = q.across ? q.N : q.N * q.S;
  const int64_t ns = q.shared ? 1 : q.C;
  const double h = 1e-4;
  tensor x = input(c, count, -2, 2, 0, r), dy = input(c, count, -1, 1, 0, r);
  tensor s = input(c, ns, -3, 3, 0, r), ds = input(c, ns, -1, 1, 0, r);
  tensor dx = make(c, count), norm = make(c, groups), ws = make(c, 2 * q.C);
  double *sq = norm_doubles(groups), *dot = norm_doubles(groups);
  double *want_dx = norm_doubles(count), *want_ds = norm_doubles(ns);
  l2_sums(&q, sq, dot, x.h, dy.h, s.h);
  for (int64_t g = 0; g < groups; g++) norm.h[g] = (float)sqrt(sq[g]);
  norm_upload(&norm);
  for (int64_t e = 0; e < count; e++) {
    const int64_t g = l2_group_of(&q, e);
    const double d = dy.h[e] * l2_scale_of(&q, s.h, e), v = x.h[e];
    const double up = (dot[g] + d * h) / sqrt(sq[g] + 2 * v * h + h * h);
    const double down = (dot[g] - d * h) / sqrt(sq[g] - 2 * v * h + h * h);
    want_dx[e] = (up - down) / (2 * h);
  }
  for (int64_t k = 0; k < ns; k++) want_ds[k] = ds.h[k];
  for (int64_t e = 0; e < count; e++)
    want_ds[q.shared ? 0 : e / q.S % q.C] +=
        (double)dy.h[e] * x.h[e] / sqrt(sq[l2_group_of(&q, e)]);
  assert_int_equal(b->l2norm_bwd(c, has_dx ? dx.d : NULL, has_ds ? ds.d : NULL,
                                 q.shared && has_ds ? ws.d : NULL, dy.d, x.d, norm.d, s.d, q.N,
                                 q.C, q.S, q.across, q.shared),
                   KILN_OK);
  double e = 0;
  if (has_dx) e = norm_check(e, &dx, want_dx);
  if (has_ds) e = norm_check(e, &ds, want_ds);
  free(sq), free(dot), free(want_dx), free(want_ds);
  drop(&x), drop(&dy), drop(&s), drop(&ds), drop(&dx), drop(&norm), drop(&ws);
  return e;
}

#define L2_ROWS(op, fn, p, tol)                                                                  \
  {op, fn, 0, p, tol}, {op, fn, 1, p, tol}, {op, fn, 2, p, tol}, {op, fn, 3, p, tol},           \
      {op, fn, 4, p, tol}

/* ---- loss cases ---- */

#include <float.h> /* FLT_MIN, softmax_loss's clamp */

/* Shapes (outer, C, inner) the loss ops are tried at: 1, 3, 10 and 1000 classes, an inner axis,
 * and one past softmax's parallel size (16384 values). The ops over items take N = outer inner
 * items of C values. */
static const int64_t loss_shapes[][3] = {{1, 1, 1},    {4, 3, 1}, {3, 10, 5},
                                         {2, 1000, 1}, {5, 3, 7}, {50, 10, 37}};
#define LOSS_SHAPES(op, fn, p, tol)                                                             \
  {op, fn, 0, p, tol}, {op, fn, 1, p, tol}, {op, fn, 2, p, tol}, {op, fn, 3, p, tol},           \
      {op, fn, 4, p, tol}, {op, fn, 5, p, tol}

/* A loss row's setting, in bits: the normalization (0 .. 3: FULL, VALID, BATCH, NONE); 4:
 * ignore_label -1, which about a quarter of the labels take; 8: ignore_label 0, a class; 16: one
 * label that is no class, which the op must refuse; from 32 up, a count (top_k, the positive
 * class). */
enum { LOSS_IGNORE_NEG = 4, LOSS_IGNORE_0 = 8, LOSS_BAD_LABEL = 16, LOSS_COUNT = 32 };

typedef struct {
  bool has_ignore;
  int ignore;
  kiln_loss_norm norm;
} loss_setting;

static loss_setting loss_setting_of(float p) {
  const int bits = (int)p;
  return (loss_setting){.has_ignore = (bits & (LOSS_IGNORE_NEG | LOSS_IGNORE_0)) != 0,
                        .ignore = bits & LOSS_IGNORE_NEG ? -1 : 0,
                        .norm = (kiln_loss_norm)(bits & 3)};
}

/* The divisor of the setting, in double: never below 1. */
static double loss_divisor(kiln_loss_norm norm, double full, double batch, double valid) {
  const double n = norm == KILN_LOSS_FULL    ? full
                   : norm == KILN_LOSS_VALID ? valid
                   : norm == KILN_LOSS_BATCH ? batch
                                             : 1;
  return n < 1 ? 1 : n;
}

static bool loss_ignored(const loss_setting *s, float label) {
  return s->has_ignore && (int)label == s->ignore;
}

/* t's host values to the device. */
static void loss_put(const kiln_op_ctx *c, tensor *t) {
  assert_int_equal(kiln_device_to_device(c->device, t->d, t->h, sizeof(float) * (size_t)t->n),
                   KILN_OK);
}

/* One value v on the device (the loss weight a gradient reads). */
static tensor loss_scalar(const kiln_op_ctx *c, float v) {
  tensor t = make(c, 1);
  t.h[0] = v;
  loss_put(c, &t);
  return t;
}

/* n labels, classes in [0, C), as the setting p wants them. */
static tensor loss_labels(const kiln_op_ctx *c, int64_t n, int64_t C, float p, kiln_rng *r) {
  tensor t = make(c, n);
  for (int64_t i = 0; i < n; i++) {
    int64_t k = (int64_t)kiln_rng_uniform(r, 0, (float)C);
    t.h[i] = (float)(k < C ? k : C - 1);
    if (((int)p & LOSS_IGNORE_NEG) && kiln_rng_uniform(r, 0, 1) < 0.25f) t.h[i] = -1;
  }
  if (((int)p & LOSS_BAD_LABEL) && n > 0) t.h[n / 2] = (float)C;
  loss_put(c, &t);
  return t;
}

/* A refused label: KILN_ERR_DATA, the message naming it; 0 when so. */
static double loss_refused(int rc) {
  return rc == KILN_ERR_DATA && strstr(kiln_last_error(), "is out of range") ? 0 : INFINITY;
}

/* Column (o, j) of x (outer, C, inner) into v[0 .. C), in double. */
static void loss_col(double *v, const float *x, int64_t o, int64_t j, int64_t C, int64_t inner) {
  for (int64_t k = 0; k < C; k++) v[k] = x[(o * C + k) * inner + j];
}

static void loss_softmax_d(double *y, const double *x, int64_t C) {
  double mx = x[0], sum = 0;
  for (int64_t k = 1; k < C; k++) mx = x[k] > mx ? x[k] : mx;
  for (int64_t k = 0; k < C; k++) sum += y[k] = exp(x[k] - mx);
  for (int64_t k = 0; k < C; k++) y[k] /= sum;
}

/* Scores x (outer, C, inner) in [-8, 8) and their softmax in double, rounded to float. */
static void loss_scores(const kiln_op_ctx *c, const int64_t *sh, tensor *x, tensor *prob,
                        kiln_rng *r) {
  const int64_t outer = sh[0], C = sh[1], inner = sh[2];
  *x = input(c, outer * C * inner, -8, 8, 0, r);
  *prob = make(c, outer * C * inner);
  double *v = malloc(sizeof(double) * (size_t)(2 * C));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      loss_col(v, x->h, o, j, C, inner);
      loss_softmax_d(v + C, v, C);
      for (int64_t k = 0; k < C; k++) prob->h[(o * C + k) * inner + j] = (float)v[C + k];
    }
  free(v);
  loss_put(c, prob);
}

/* A function of one column (or item) of values in double, for finite differences. */
typedef double (*loss_fn)(const double *v, void *ctx);

/* d f / d v[i] by central differences; v[i] is restored. */
static double loss_fd(loss_fn f, double *v, int64_t i, void *ctx) {
  const double h = 1e-5, keep = v[i];
  v[i] = keep + h;
  const double up = f(v, ctx);
  v[i] = keep - h;
  const double down = f(v, ctx);
  v[i] = keep;
  return (up - down) / (2 * h);
}

/* What the column functions below read besides the column. */
typedef struct {
  int64_t C;
  int64_t label;
  const double *w; /* dy's column (softmax), H's row (infogain) */
  double *tmp;     /* C values of scratch */
  bool l2, legacy, similar;
  double margin;
} loss_ctx;

/* sum_k w_k softmax(v)_k: its gradient is softmax's backward of w. */
static double loss_f_softmax_dot(const double *v, void *ctx) {
  loss_ctx *k = ctx;
  loss_softmax_d(k->tmp, v, k->C);
  double s = 0;
  for (int64_t i = 0; i < k->C; i++) s += k->w[i] * k->tmp[i];
  return s;
}

/* -log softmax(v)[label] */
static double loss_f_xent(const double *v, void *ctx) {
  loss_ctx *k = ctx;
  loss_softmax_d(k->tmp, v, k->C);
  return -log(k->tmp[k->label]);
}

/* -sum_i H[label, i] log softmax(v)_i */
static double loss_f_infogain(const double *v, void *ctx) {
  loss_ctx *k = ctx;
  loss_softmax_d(k->tmp, v, k->C);
  double s = 0;
  for (int64_t i = 0; i < k->C; i++) s -= k->w[i] * log(k->tmp[i]);
  return s;
}

/* -log v[label] (multinomial logistic loss on probabilities) */
static double loss_f_log(const double *v, void *ctx) {
  return -log(v[((loss_ctx *)ctx)->label]);
}

/* sum_i m_i (l2: m_i^2), m_i = max(0, 1 + s v_i), s -1 at the label */
static double loss_f_hinge(const double *v, void *ctx) {
  loss_ctx *k = ctx;
  double s = 0;
  for (int64_t i = 0; i < k->C; i++) {
    double m = 1 + (i == k->label ? -v[i] : v[i]);
    m = m > 0 ? m : 0;
    s += k->l2 ? m * m : m;
  }
  return s;
}

/* A pair's term of the contrastive loss, v = a then b (C each) */
static double loss_f_contrastive(const double *v, void *ctx) {
  loss_ctx *k = ctx;
  double d2 = 0;
  for (int64_t i = 0; i < k->C; i++) d2 += (v[i] - v[k->C + i]) * (v[i] - v[k->C + i]);
  if (k->similar) return d2;
  if (k->legacy) return d2 < k->margin ? k->margin - d2 : 0;
  const double m = k->margin - sqrt(d2);
  return m > 0 ? m * m : 0;
}

/* softmax_fwd at loss_shapes[n]; p: 1 in place, 2 scores 20 times as large (past e^88, where
 * exp overflows without the maximum taken out). */
static double case_softmax_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const int64_t count = outer * C * inner;
  const bool in_place = (int)p & 1;
  const float span = (int)p & 2 ? 160 : 8;
  tensor x = input(c, count, -span, span, 0, r), y = make(c, count);
  double *want = malloc(sizeof(double) * (size_t)count), *v = malloc(sizeof(double) * 2 * C);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      loss_col(v, x.h, o, j, C, inner);
      loss_softmax_d(v + C, v, C);
      for (int64_t k = 0; k < C; k++) want[(o * C + k) * inner + j] = v[C + k];
    }
  tensor *out = in_place ? &x : &y;
  assert_int_equal(b->softmax_fwd(c, out->d, x.d, outer, C, inner), KILN_OK);
  fetch(out);
  double e = error_of(out->h, want, count);
  free(want);
  free(v);
  drop(&x);
  drop(&y);
  return e;
}

/* softmax_bwd at loss_shapes[n] against finite differences of sum dy softmax(x), column by
 * column; p: 1 in place (dx = dy). */
static double case_softmax_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const int64_t count = outer * C * inner;
  const bool in_place = (int)p & 1;
  tensor x, y, dy = make(c, count), dx = make(c, count);
  loss_scores(c, loss_shapes[n], &x, &y, r);
  for (int64_t i = 0; i < count; i++) dy.h[i] = kiln_rng_uniform(r, -1, 1);
  loss_put(c, &dy);
  double *want = malloc(sizeof(double) * (size_t)count), *v = malloc(sizeof(double) * 3 * C);
  loss_ctx k = {.C = C, .w = v + C, .tmp = v + 2 * C};
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      loss_col(v, x.h, o, j, C, inner);
      loss_col(v + C, dy.h, o, j, C, inner);
      for (int64_t i = 0; i < C; i++)
        want[(o * C + i) * inner + j] = loss_fd(loss_f_softmax_dot, v, i, &k);
    }
  tensor *out = in_place ? &dy : &dx;
  assert_int_equal(b->softmax_bwd(c, out->d, y.d, dy.d, outer, C, inner), KILN_OK);
  fetch(out);
  double e = error_of(out->h, want, count);
  free(want);
  free(v);
  drop(&x);
  drop(&y);
  drop(&dy);
  drop(&dx);
  return e;
}

/* softmax_loss_fwd on the softmax of random scores: -sum log max(p, FLT_MIN) / the divisor. */
static double case_softmax_loss_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                    float p, kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const loss_setting s = loss_setting_of(p);
  tensor x, prob, lab = loss_labels(c, outer * inner, C, p, r), loss = make(c, 1);
  loss_scores(c, loss_shapes[n], &x, &prob, r);
  int rc = b->softmax_loss_fwd(c, loss.d, prob.d, lab.d, outer, C, inner, s.has_ignore, s.ignore,
                               s.norm);
  double e;
  if ((int)p & LOSS_BAD_LABEL) {
    e = loss_refused(rc);
  } else {
    assert_int_equal(rc, KILN_OK);
    double want = 0, valid = 0;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < inner; j++) {
        const float l = lab.h[o * inner + j];
        if (loss_ignored(&s, l)) continue;
        const double pr = prob.h[(o * C + (int64_t)l) * inner + j];
        want -= log(pr < FLT_MIN ? FLT_MIN : pr);
        valid++;
      }
    want /= loss_divisor(s.norm, (double)(outer * inner), (double)outer, valid);
    fetch(&loss);
    e = error_of(loss.h, &want, 1);
  }
  drop(&x);
  drop(&prob);
  drop(&lab);
  drop(&loss);
  return e;
}

/* softmax_loss_bwd against finite differences of the loss through the softmax, in double. */
static double case_softmax_loss_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                    float p, kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const int64_t count = outer * C * inner;
  const loss_setting s = loss_setting_of(p);
  const float weight = 1.7f;
  tensor x, prob, lab = loss_labels(c, outer * inner, C, p, r), dx = make(c, count);
  tensor dl = loss_scalar(c, weight);
  loss_scores(c, loss_shapes[n], &x, &prob, r);
  assert_int_equal(b->softmax_loss_bwd(c, dx.d, prob.d, lab.d, dl.d, outer, C, inner,
                                       s.has_ignore, s.ignore, s.norm),
                   KILN_OK);
  double valid = 0;
  for (int64_t i = 0; i < outer * inner; i++) valid += !loss_ignored(&s, lab.h[i]);
  const double scale = weight / loss_divisor(s.norm, (double)(outer * inner), (double)outer, valid);
  double *want = calloc((size_t)count, sizeof(double)), *v = malloc(sizeof(double) * 2 * C);
  loss_ctx k = {.C = C, .tmp = v + C};
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      if (loss_ignored(&s, lab.h[o * inner + j])) continue;
      k.label = (int64_t)lab.h[o * inner + j];
      loss_col(v, x.h, o, j, C, inner);
      for (int64_t i = 0; i < C; i++)
        want[(o * C + i) * inner + j] = scale * loss_fd(loss_f_xent, v, i, &k);
    }
  fetch(&dx);
  double e = error_of(dx.h, want, count);
  free(want);
  free(v);
  drop(&x);
  drop(&prob);
  drop(&lab);
  drop(&dx);
  drop(&dl);
  return e;
}

/* Scores in {0, 1, 2, 3}, so that ties are common (Accuracy and F1 rank them). */
static tensor loss_tied_scores(const kiln_op_ctx *c, int64_t n, kiln_rng *r) {
  tensor x = make(c, n);
  for (int64_t i = 0; i < n; i++) x.h[i] = floorf(kiln_rng_uniform(r, 0, 4));
  loss_put(c, &x);
  return x;
}

/* accuracy_fwd: p's bit 1 asks the per-class top, p / 32 is top_k (at most C). A hit: fewer
 * than top_k other classes score at least the label's. */
static double case_accuracy_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const loss_setting s = loss_setting_of(p);
  const bool per = (int)p & 1;
  int top_k = (int)p / LOSS_COUNT;
  top_k = top_k < 1 ? 1 : top_k > C ? (int)C : top_k;
  tensor x = loss_tied_scores(c, outer * C * inner, r), lab = loss_labels(c, outer * inner, C, p, r);
  tensor acc = make(c, 1), pc = make(c, C), cc = make(c, C);
  int rc = b->accuracy_fwd(c, acc.d, per ? pc.d : NULL, per ? cc.d : NULL, x.d, lab.d, outer, C,
                           inner, top_k, s.has_ignore, s.ignore);
  double e;
  if ((int)p & LOSS_BAD_LABEL) {
    e = loss_refused(rc);
  } else {
    assert_int_equal(rc, KILN_OK);
    double hits = 0, total = 0, *ch = calloc((size_t)(2 * C), sizeof(double));
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < inner; j++) {
        const float l = lab.h[o * inner + j];
        if (loss_ignored(&s, l)) continue;
        const int64_t t = (int64_t)l;
        const float truth = x.h[(o * C + t) * inner + j];
        int higher = 0;
        for (int64_t k = 0; k < C; k++) higher += k != t && x.h[(o * C + k) * inner + j] >= truth;
        hits += higher < top_k;
        total++;
        ch[t] += higher < top_k;
        ch[C + t]++;
      }
    double want = total ? hits / total : 0;
    fetch(&acc);
    e = error_of(acc.h, &want, 1);
    if (per) {
      for (int64_t k = 0; k < C; k++) ch[k] = ch[C + k] ? ch[k] / ch[C + k] : 0;
      fetch(&pc);
      const double ep = error_of(pc.h, ch, C);
      e = ep > e || ep != ep ? ep : e;
    }
    free(ch);
  }
  drop(&x);
  drop(&lab);
  drop(&acc);
  drop(&pc);
  drop(&cc);
  return e;
}

/* f1_fwd: the positive class is p / 32 (mod C); counts exact. */
static double case_f1_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                          kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const loss_setting s = loss_setting_of(p);
  const int positive = (int)((int)p / LOSS_COUNT % C);
  tensor x = loss_tied_scores(c, outer * C * inner, r), lab = loss_labels(c, outer * inner, C, p, r);
  tensor tp = make(c, 1), fp = make(c, 1), fn = make(c, 1);
  int rc = b->f1_fwd(c, tp.d, fp.d, fn.d, x.d, lab.d, outer, C, inner, positive, s.has_ignore,
                     s.ignore);
  double e;
  if ((int)p & LOSS_BAD_LABEL) {
    e = loss_refused(rc);
  } else {
    assert_int_equal(rc, KILN_OK);
    double want[3] = {0, 0, 0};
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < inner; j++) {
        const float l = lab.h[o * inner + j];
        if (loss_ignored(&s, l)) continue;
        int64_t pred = 0;
        for (int64_t k = 1; k < C; k++)
          if (x.h[(o * C + k) * inner + j] > x.h[(o * C + pred) * inner + j]) pred = k;
        const bool predicted = pred == positive, actual = (int64_t)l == positive;
        want[0] += predicted && actual;
        want[1] += predicted && !actual;
        want[2] += !predicted && actual;
      }
    fetch(&tp);
    fetch(&fp);
    fetch(&fn);
    const float got[3] = {tp.h[0], fp.h[0], fn.h[0]};
    e = error_of(got, want, 3);
  }
  drop(&x);
  drop(&lab);
  drop(&tp);
  drop(&fp);
  drop(&fn);
  return e;
}

/* multinomial_loss_fwd on probabilities in [0.05, 1) of N = outer inner items of C; p's bit 1
 * puts 1e-30 (under the 1e-20 clamp) at item 0's label. */
static double case_multinomial_loss_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                        float p, kiln_rng *r) {
  const int64_t N = loss_shapes[n][0] * loss_shapes[n][2], C = loss_shapes[n][1];
  tensor x = input(c, N * C, 0.05f, 1, 0, r), loss = make(c, 1);
  tensor lab = loss_labels(c, N, C, (float)((int)p & LOSS_BAD_LABEL), r);
  if ((int)p & 1) {
    x.h[(int64_t)lab.h[0] < C ? (int64_t)lab.h[0] : 0] = 1e-30f;
    loss_put(c, &x);
  }
  int rc = b->multinomial_loss_fwd(c, loss.d, x.d, lab.d, N, C);
  double e;
  if ((int)p & LOSS_BAD_LABEL) {
    e = loss_refused(rc);
  } else {
    assert_int_equal(rc, KILN_OK);
    double want = 0;
    for (int64_t i = 0; i < N; i++) {
      const double v = x.h[i * C + (int64_t)lab.h[i]];
      want -= log(v > 1e-20f ? v : 1e-20f);
    }
    want /= (double)N;
    fetch(&loss);
    e = error_of(loss.h, &want, 1);
  }
  drop(&x);
  drop(&lab);
  drop(&loss);
  return e;
}

static double case_multinomial_loss_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                        float p, kiln_rng *r) {
  (void)p;
  const int64_t N = loss_shapes[n][0] * loss_shapes[n][2], C = loss_shapes[n][1];
  const float weight = 0.6f;
  tensor x = input(c, N * C, 0.05f, 1, 0, r), lab = loss_labels(c, N, C, 0, r);
  tensor dx = make(c, N * C), dl = loss_scalar(c, weight);
  assert_int_equal(b->multinomial_loss_bwd(c, dx.d, x.d, lab.d, dl.d, N, C), KILN_OK);
  double *want = malloc(sizeof(double) * (size_t)(N * C)), *v = malloc(sizeof(double) * C);
  for (int64_t i = 0; i < N; i++) {
    loss_ctx k = {.C = C, .label = (int64_t)lab.h[i]};
    for (int64_t j = 0; j < C; j++) v[j] = x.h[i * C + j];
    for (int64_t j = 0; j < C; j++) want[i * C + j] = weight / N * loss_fd(loss_f_log, v, j, &k);
  }
  fetch(&dx);
  double e = error_of(dx.h, want, N * C);
  free(want);
  free(v);
  drop(&x);
  drop(&lab);
  drop(&dx);
  drop(&dl);
  return e;
}

/* infogain_loss_fwd and _bwd on the softmax of random scores, H (C x C) in [0, 1). */
static double case_infogain(bool backward, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                            float p, kiln_rng *r) {
  const int64_t outer = loss_shapes[n][0], C = loss_shapes[n][1], inner = loss_shapes[n][2];
  const int64_t count = outer * C * inner;
  const loss_setting s = loss_setting_of(p);
  const float weight = 1.3f;
  tensor x, prob, lab = loss_labels(c, outer * inner, C, p, r);
  tensor H = input(c, C * C, 0, 1, 0, r), out = make(c, backward ? count : 1);
  tensor dl = loss_scalar(c, weight);
  loss_scores(c, loss_shapes[n], &x, &prob, r);
  int rc = backward ? b->infogain_loss_bwd(c, out.d, prob.d, lab.d, H.d, dl.d, outer, C, inner,
                                           s.has_ignore, s.ignore, s.norm)
                    : b->infogain_loss_fwd(c, out.d, prob.d, lab.d, H.d, outer, C, inner,
                                           s.has_ignore, s.ignore, s.norm);
  double e;
  if ((int)p & LOSS_BAD_LABEL) {
    e = loss_refused(rc);
  } else {
    assert_int_equal(rc, KILN_OK);
    double valid = 0;
    for (int64_t i = 0; i < outer * inner; i++) valid += !loss_ignored(&s, lab.h[i]);
    const double div = loss_divisor(s.norm, (double)(outer * inner), (double)outer, valid);
    double *want = calloc((size_t)count, sizeof(double)), *v = malloc(sizeof(double) * 3 * C);
    loss_ctx k = {.C = C, .w = v + C, .tmp = v + 2 * C};
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < inner; j++) {
        const float l = lab.h[o * inner + j];
        if (loss_ignored(&s, l)) continue;
        for (int64_t i = 0; i < C; i++) v[C + i] = H.h[(int64_t)l * C + i];
        if (backward) {
          loss_col(v, x.h, o, j, C, inner);
          for (int64_t i = 0; i < C; i++)
            want[(o * C + i) * inner + j] = weight / div * loss_fd(loss_f_infogain, v, i, &k);
        } else {
          for (int64_t i = 0; i < C; i++) {
            const double pr = prob.h[(o * C + i) * inner + j];
            want[0] -= v[C + i] * log(pr > 1e-20f ? pr : 1e-20f);
          }
        }
      }
    if (!backward) want[0] /= div;
    fetch(&out);
    e = error_of(out.h, want, out.n);
    free(want);
    free(v);
  }
  drop(&x);
  drop(&prob);
  drop(&lab);
  drop(&H);
  drop(&out);
  drop(&dl);
  return e;
}
static double case_infogain_loss_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                     float p, kiln_rng *r) {
  return case_infogain(false, b, c, n, p, r);
}
static double case_infogain_loss_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                     float p, kiln_rng *r) {
  return case_infogain(true, b, c, n, p, r);
}

/* hinge_loss_fwd and _bwd over N = outer inner items of C scores in [-3, 3), none within 0.01
 * of a kink (+-1); p's bit 1: L2. */
static double case_hinge(bool backward, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                         float p, kiln_rng *r) {
  const int64_t N = loss_shapes[n][0] * loss_shapes[n][2], C = loss_shapes[n][1];
  const bool l2 = (int)p & 1;
  const float weight = 0.9f;
  tensor x = make(c, N * C), out = make(c, backward ? N * C : 1), dl = loss_scalar(c, weight);
  for (int64_t i = 0; i < N * C; i++) {
    float v;
    do v = kiln_rng_uniform(r, -3, 3);
    while (fabsf(fabsf(v) - 1) < 0.01f);
    x.h[i] = v;
  }
  loss_put(c, &x);
  tensor lab = loss_labels(c, N, C, (float)((int)p & LOSS_BAD_LABEL), r);
  int rc = backward ? b->hinge_loss_bwd(c, out.d, x.d, lab.d, dl.d, N, C, l2)
                    : b->hinge_loss_fwd(c, out.d, x.d, lab.d, N, C, l2);
  double e;
  if ((int)p & LOSS_BAD_LABEL) {
    e = loss_refused(rc);
  } else {
    assert_int_equal(rc, KILN_OK);
    double *want = calloc((size_t)(N * C), sizeof(double)), *v = malloc(sizeof(double) * C);
    for (int64_t i = 0; i < N; i++) {
      loss_ctx k = {.C = C, .label = (int64_t)lab.h[i], .l2 = l2};
      for (int64_t j = 0; j < C; j++) v[j] = x.h[i * C + j];
      if (!backward) want[0] += loss_f_hinge(v, &k) / N;
      else
        for (int64_t j = 0; j < C; j++) want[i * C + j] = weight / N * loss_fd(loss_f_hinge, v, j, &k);
    }
    fetch(&out);
    e = error_of(out.h, want, out.n);
    free(want);
    free(v);
  }
  drop(&x);
  drop(&lab);
  drop(&out);
  drop(&dl);
  return e;
}
static double case_hinge_loss_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  return case_hinge(false, b, c, n, p, r);
}
static double case_hinge_loss_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  return case_hinge(true, b, c, n, p, r);
}

/* sigmoid_ce_fwd and _bwd over n scores in [-6, 6) and targets in [0, 1] (a fifth exactly 0 or
 * 1; with LOSS_IGNORE_NEG a quarter -1), batch 7 (1 under 7); p: the setting's bits. Each
 * element's term max(x, 0) - x t + log(1 + e^-|x|) is smooth, so its finite differences are
 * the gradient. */
static double sce_term(double x, double t) { return (x > 0 ? x : 0) - x * t + log1p(exp(-fabs(x))); }

static double case_sigmoid_ce(bool backward, const kiln_backend *b, const kiln_op_ctx *c,
                              int64_t n, float p, kiln_rng *r) {
  const loss_setting s = loss_setting_of(p);
  const int64_t batch = n < 7 ? 1 : 7;
  const float weight = 2.5f;
  tensor x = input(c, n, -6, 6, 0, r), t = make(c, n), out = make(c, backward ? n : 1);
  tensor dl = loss_scalar(c, weight);
  for (int64_t i = 0; i < n; i++) {
    const float u = kiln_rng_uniform(r, 0, 1);
    t.h[i] = u < 0.1f ? 0 : u < 0.2f ? 1 : kiln_rng_uniform(r, 0, 1);
    if (((int)p & LOSS_IGNORE_NEG) && kiln_rng_uniform(r, 0, 1) < 0.25f) t.h[i] = -1;
  }
  loss_put(c, &t);
  int rc = backward ? b->sigmoid_ce_bwd(c, out.d, x.d, t.d, dl.d, n, batch, s.has_ignore,
                                        s.ignore, s.norm)
                    : b->sigmoid_ce_fwd(c, out.d, x.d, t.d, n, batch, s.has_ignore, s.ignore,
                                        s.norm);
  assert_int_equal(rc, KILN_OK);
  double valid = 0, sum = 0;
  for (int64_t i = 0; i < n; i++) {
    if (s.has_ignore && trunc((double)t.h[i]) == s.ignore) continue;
    sum += sce_term(x.h[i], t.h[i]);
    valid++;
  }
  const double div = loss_divisor(s.norm, (double)n, (double)batch, valid);
  double *want = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!backward) want[0] = sum / div;
  else
    for (int64_t i = 0; i < n; i++) {
      if (s.has_ignore && trunc((double)t.h[i]) == s.ignore) continue;
      const double h = 1e-5;
      want[i] = weight / div * (sce_term(x.h[i] + h, t.h[i]) - sce_term(x.h[i] - h, t.h[i])) / (2 * h);
    }
  fetch(&out);
  double e = error_of(out.h, want, out.n);
  free(want);
  drop(&x);
  drop(&t);
  drop(&out);
  drop(&dl);
  return e;
}
static double case_sigmoid_ce_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                  kiln_rng *r) {
  return case_sigmoid_ce(false, b, c, n, p, r);
}
static double case_sigmoid_ce_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                  kiln_rng *r) {
  return case_sigmoid_ce(true, b, c, n, p, r);
}

/* euclidean_loss_fwd and _bwd over n values of a and b in [-2, 2), N 7 items (1 under 7); the
 * backward's p: 1 wants da, 2 db. */
static double case_euclidean(bool backward, const kiln_backend *b, const kiln_op_ctx *c,
                             int64_t n, float p, kiln_rng *r) {
  const int64_t N = n < 7 ? 1 : 7;
  const bool wa = (int)p & 1, wb = (int)p & 2;
  const float weight = 0.7f;
  tensor a = input(c, n, -2, 2, 0, r), bb = input(c, n, -2, 2, 0, r), dl = loss_scalar(c, weight);
  tensor out = make(c, backward ? n : 1), out2 = make(c, n);
  int rc = backward ? b->euclidean_loss_bwd(c, wa ? out.d : NULL, wb ? out2.d : NULL, a.d, bb.d,
                                            dl.d, n, N)
                    : b->euclidean_loss_fwd(c, out.d, a.d, bb.d, n, N);
  assert_int_equal(rc, KILN_OK);
  double e = 0;
  if (!backward) {
    double want = 0;
    for (int64_t i = 0; i < n; i++) want += ((double)a.h[i] - bb.h[i]) * ((double)a.h[i] - bb.h[i]);
    want = want / N / 2;
    fetch(&out);
    e = error_of(out.h, &want, 1);
  } else {
    /* d/da of weight (a - b)^2 / 2N by central differences, and its negation for b */
    double *want = malloc(sizeof(double) * (size_t)n);
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
      const double d = (double)a.h[i] - bb.h[i];
      want[i] = weight * ((d + h) * (d + h) - (d - h) * (d - h)) / (2 * h) / N / 2;
    }
    if (wa) {
      fetch(&out);
      e = error_of(out.h, want, n);
    }
    if (wb) {
      for (int64_t i = 0; i < n; i++) want[i] = -want[i];
      fetch(&out2);
      const double e2 = error_of(out2.h, want, n);
      e = e2 > e || e2 != e2 ? e2 : e;
    }
    free(want);
  }
  drop(&a);
  drop(&bb);
  drop(&dl);
  drop(&out);
  drop(&out2);
  return e;
}
static double case_euclidean_loss_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                      float p, kiln_rng *r) {
  return case_euclidean(false, b, c, n, p, r);
}
static double case_euclidean_loss_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                      float p, kiln_rng *r) {
  return case_euclidean(true, b, c, n, p, r);
}

/* contrastive_loss_fwd and _bwd over N = outer inner pairs of C features in [-2, 2), about half
 * of them similar (some with similarity 2, which counts as similar too), the margin near the
 * typical distance (d^2 for legacy); p's bit 1: legacy, 2 wants da, 4 db. A dissimilar pair
 * near the margin's kink, or closer than 1 (where the kernel's d + 1e-4 guard departs from the
 * true gradient by more than 1e-4 of it), is made similar. */
static double case_contrastive(bool backward, const kiln_backend *b, const kiln_op_ctx *c,
                               int64_t n, float p, kiln_rng *r) {
  const int64_t N = loss_shapes[n][0] * loss_shapes[n][2], C = loss_shapes[n][1];
  const bool legacy = (int)p & 1, wa = (int)p & 2, wb = (int)p & 4;
  const float margin = legacy ? 2.67f * (float)C : 1.63f * sqrtf((float)C);
  const float weight = 1.1f;
  tensor a = input(c, N * C, -2, 2, 0, r), bb = input(c, N * C, -2, 2, 0, r), sim = make(c, N);
  tensor dist = make(c, N), loss = make(c, 1), da = make(c, N * C), db = make(c, N * C);
  tensor dl = loss_scalar(c, weight);
  double *d2 = malloc(sizeof(double) * (size_t)N);
  for (int64_t i = 0; i < N; i++) {
    d2[i] = 0;
    for (int64_t k = 0; k < C; k++)
      d2[i] += ((double)a.h[i * C + k] - bb.h[i * C + k]) * ((double)a.h[i * C + k] - bb.h[i * C + k]);
    const float u = kiln_rng_uniform(r, 0, 1);
    sim.h[i] = u < 0.1f ? 2 : u < 0.5f ? 1 : 0;
    const double from_kink = legacy ? fabs(d2[i] - margin) / margin : fabs(sqrt(d2[i]) - margin);
    if (from_kink < 0.01 || (!legacy && d2[i] < 1)) sim.h[i] = 1;
  }
  loss_put(c, &sim);
  assert_int_equal(b->contrastive_loss_fwd(c, loss.d, dist.d, a.d, bb.d, sim.d, N, C, margin,
                                           legacy),
                   KILN_OK);
  double e;
  if (!backward) {
    double want = 0;
    for (int64_t i = 0; i < N; i++) {
      if (sim.h[i] != 0) want += d2[i];
      else if (legacy) want += d2[i] < margin ? margin - d2[i] : 0;
      else {
        const double m = margin - sqrt(d2[i]);
        want += m > 0 ? m * m : 0;
      }
    }
    want = want / N / 2;
    fetch(&loss);
    fetch(&dist);
    e = error_of(loss.h, &want, 1);
    const double ed = error_of(dist.h, d2, N);
    e = ed > e || ed != ed ? ed : e;
  } else {
    assert_int_equal(b->contrastive_loss_bwd(c, wa ? da.d : NULL, wb ? db.d : NULL, a.d, bb.d,
                                             sim.d, dist.d, dl.d, N, C, margin, legacy),
                     KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(2 * N * C)), *v = malloc(sizeof(double) * 2 * C);
    for (int64_t i = 0; i < N; i++) {
      loss_ctx k = {.C = C, .legacy = legacy, .similar = sim.h[i] != 0, .margin = margin};
      for (int64_t j = 0; j < C; j++) v[j] = a.h[i * C + j], v[C + j] = bb.h[i * C + j];
      for (int64_t j = 0; j < 2 * C; j++)
        want[(j < C ? 0 : N * C) + i * C + j % C] =
            weight / N / 2 * loss_fd(loss_f_contrastive, v, j, &k);
    }
    e = 0;
    if (wa) {
      fetch(&da);
      e = error_of(da.h, want, N * C);
    }
    if (wb) {
      fetch(&db);
      const double e2 = error_of(db.h, want + N * C, N * C);
      e = e2 > e || e2 != e2 ? e2 : e;
    }
    free(want);
    free(v);
  }
  free(d2);
  drop(&a);
  drop(&bb);
  drop(&sim);
  drop(&dist);
  drop(&loss);
  drop(&da);
  drop(&db);
  drop(&dl);
  return e;
}
static double case_contrastive_loss_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                        float p, kiln_rng *r) {
  return case_contrastive(false, b, c, n, p, r);
}
static double case_contrastive_loss_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                        float p, kiln_rng *r) {
  return case_contrastive(true, b, c, n, p, r);
}

/* ---- arrange cases ---- */

/* fill, scale, add, acc: y against the same in double. */
static double case_simple(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                          kiln_rng *r) {
  tensor x = input(c, n, -3, 3, 0, r), w = input(c, n, -3, 3, 0, r), y = input(c, n, -3, 3, 0, r);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    want[i] = op == KILN_OP_fill    ? p
              : op == KILN_OP_scale ? (double)p * x.h[i]
              : op == KILN_OP_add   ? (double)x.h[i] + w.h[i]
                                    : (double)y.h[i] + x.h[i];
  int rc = op == KILN_OP_fill    ? b->fill(c, y.d, p, n)
           : op == KILN_OP_scale ? b->scale(c, y.d, x.d, p, n)
           : op == KILN_OP_add   ? b->add(c, y.d, x.d, w.d, n)
                                 : b->acc(c, y.d, x.d, n);
  assert_int_equal(rc, KILN_OK);
  fetch(&y);
  double e = error_of(y.h, want, n);
  free(want);
  drop(&x);
  drop(&w);
  drop(&y);
  return e;
}
#define SIMPLE_CASE(name)                                                                      \
  static double case_##name(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,   \
                            kiln_rng *r) {                                                     \
    return case_simple(KILN_OP_##name, b, c, n, p, r);                                         \
  }
SIMPLE_CASE(fill)
SIMPLE_CASE(scale)
SIMPLE_CASE(add)
SIMPLE_CASE(acc)

static double d_sel(double z, double slope) { return z > 0 ? z : slope * z; }

/* Eltwise SUM of two bottoms, then a third accumulated, each with a coefficient and the select of
 * a fused ReLU (p: its slope; 1 none). */
static double case_eltwise_sum(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                               float p, kiln_rng *r) {
  tensor x0 = input(c, n, -3, 3, 0, r), x1 = input(c, n, -3, 3, 0, r), y = input(c, n, -3, 3, 0, r);
  const float c0 = 0.5f, c1 = -1.25f;
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    want[i] = op == KILN_OP_eltwise_sum2 ? d_sel((double)c0 * x0.h[i] + (double)c1 * x1.h[i], p)
                                         : d_sel((double)y.h[i] + (double)c1 * x1.h[i], p);
  int rc = op == KILN_OP_eltwise_sum2 ? b->eltwise_sum2(c, y.d, x0.d, c0, x1.d, c1, n, p)
                                      : b->eltwise_sum_acc(c, y.d, x1.d, c1, n, p);
  assert_int_equal(rc, KILN_OK);
  fetch(&y);
  double e = error_of(y.h, want, n);
  free(want);
  drop(&x0);
  drop(&x1);
  drop(&y);
  return e;
}
static double case_eltwise_sum2(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  return case_eltwise_sum(KILN_OP_eltwise_sum2, b, c, n, p, r);
}
static double case_eltwise_sum_acc(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  return case_eltwise_sum(KILN_OP_eltwise_sum_acc, b, c, n, p, r);
}

/* PROD and MAX of three bottoms and their gradients (p: PROD's stable gradient, 1 or 0); the
 * gradients against finite differences of the double-precision forward. MAX's inputs are kept
 * apart so that no difference crosses a tie. */
enum { NB = 3 };
static double nary(int op, const double *v) {
  if (op == KILN_OP_eltwise_prod || op == KILN_OP_eltwise_prod_bwd) return v[0] * v[1] * v[2];
  double m = v[1] >= v[0] ? v[1] : v[0];
  return v[2] > m ? v[2] : m;
}
static double case_eltwise_nary(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                float p, kiln_rng *r) {
  const bool max = op == KILN_OP_eltwise_max || op == KILN_OP_eltwise_max_bwd;
  tensor xs[NB], y = make(c, n), arg = make(c, n), dy = input(c, n, -2, 2, 0, r), dx = make(c, n);
  for (int j = 0; j < NB; j++) xs[j] = input(c, n, 0.2f, 2, 0, r);
  if (max) /* three apart values: 0.x, 1.x, 2.x in a random order per element */
    for (int64_t i = 0; i < n; i++) {
      int first = (int)kiln_rng_below(r, 3);
      for (int j = 0; j < NB; j++) xs[j].h[i] = (float)((first + j) % 3) + 0.5f * xs[j].h[i] / 2;
    }
  for (int j = 0; j < NB; j++)
    assert_int_equal(kiln_device_to_device(c->device, xs[j].d, xs[j].h, sizeof(float) * (size_t)n), KILN_OK);
  const float *xd[NB] = {xs[0].d, xs[1].d, xs[2].d};
  double *want = malloc(sizeof(double) * (size_t)n), e = 0;
  if (op == KILN_OP_eltwise_prod || op == KILN_OP_eltwise_max) {
    int rc = max ? b->eltwise_max(c, y.d, arg.d, xd, NB, n) : b->eltwise_prod(c, y.d, xd, NB, n);
    assert_int_equal(rc, KILN_OK);
    for (int64_t i = 0; i < n; i++) {
      double v[NB] = {xs[0].h[i], xs[1].h[i], xs[2].h[i]};
      want[i] = nary(op, v);
    }
    fetch(&y);
    e = error_of(y.h, want, n);
    if (max) { /* and the winners */
      fetch(&arg);
      for (int64_t i = 0; i < n; i++) {
        int w = xs[1].h[i] >= xs[0].h[i] ? 1 : 0;
        if (xs[2].h[i] > xs[w].h[i]) w = 2;
        if (arg.h[i] != (float)w) e = INFINITY;
      }
    }
  } else {
    /* the forward's y (and arg) first, from the backend itself */
    assert_int_equal(max ? b->eltwise_max(c, y.d, arg.d, xd, NB, n) : b->eltwise_prod(c, y.d, xd, NB, n),
                     KILN_OK);
    for (int which = 0; which < NB; which++) {
      int rc = max ? b->eltwise_max_bwd(c, dx.d, dy.d, arg.d, which, n)
                   : b->eltwise_prod_bwd(c, dx.d, dy.d, y.d, xd, NB, which, n, p != 0);
      assert_int_equal(rc, KILN_OK);
      for (int64_t i = 0; i < n; i++) {
        double v[NB] = {xs[0].h[i], xs[1].h[i], xs[2].h[i]}, h = 1e-5;
        v[which] += h;
        double up = nary(op, v);
        v[which] -= 2 * h;
        want[i] = dy.h[i] * (up - nary(op, v)) / (2 * h);
      }
      fetch(&dx);
      double ew = error_of(dx.h, want, n);
      if (!(ew <= e)) e = ew;
    }
  }
  free(want);
  for (int j = 0; j < NB; j++) drop(&xs[j]);
  drop(&y);
  drop(&arg);
  drop(&dy);
  drop(&dx);
  return e;
}
#define NARY_CASE(name)                                                                        \
  static double case_##name(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,   \
                            kiln_rng *r) {                                                     \
    return case_eltwise_nary(KILN_OP_##name, b, c, n, p, r);                                   \
  }
NARY_CASE(eltwise_prod)
NARY_CASE(eltwise_max)
NARY_CASE(eltwise_prod_bwd)
NARY_CASE(eltwise_max_bwd)

/* A fused ReLU's gradient with coefficients: d/dx of c s(x) at the output y = s(x) (p: the slope,
 * y's sign is x's), against finite differences; relu_scale2_bwd for two coefficients at once. */
static double case_relu_scale(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                              float p, kiln_rng *r) {
  tensor z = input(c, n, -3, 3, 0.01f, r), dy = input(c, n, -2, 2, 0, r), y = make(c, n);
  tensor d0 = make(c, n), d1 = make(c, n);
  for (int64_t i = 0; i < n; i++) y.h[i] = (float)d_sel(z.h[i], p);
  assert_int_equal(kiln_device_to_device(c->device, y.d, y.h, sizeof(float) * (size_t)n), KILN_OK);
  const float c0 = 0.75f, c1 = -2.0f;
  int rc = op == KILN_OP_relu_scale_bwd ? b->relu_scale_bwd(c, d1.d, c1, dy.d, y.d, n, p)
                                        : b->relu_scale2_bwd(c, d0.d, c0, d1.d, c1, dy.d, y.d, n, p);
  assert_int_equal(rc, KILN_OK);
  double *w0 = malloc(sizeof(double) * (size_t)n), *w1 = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    const double g = dy.h[i] * (d_sel(z.h[i] + 1e-5, p) - d_sel(z.h[i] - 1e-5, p)) / 2e-5;
    w0[i] = c0 * g;
    w1[i] = c1 * g;
  }
  fetch(&d1);
  double e = error_of(d1.h, w1, n);
  if (op == KILN_OP_relu_scale2_bwd) {
    fetch(&d0);
    double e0 = error_of(d0.h, w0, n);
    if (!(e0 <= e)) e = e0;
  }
  free(w0);
  free(w1);
  drop(&z);
  drop(&dy);
  drop(&y);
  drop(&d0);
  drop(&d1);
  return e;
}
static double case_relu_scale_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  return case_relu_scale(KILN_OP_relu_scale_bwd, b, c, n, p, r);
}
static double case_relu_scale2_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  return case_relu_scale(KILN_OP_relu_scale2_bwd, b, c, n, p, r);
}

/* Blocks of 5 floats copied between strides 11 and 7 (n blocks): moved values exact, the
 * floats between the blocks untouched. */
static double case_copy_blocks(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  (void)p;
  const int64_t block = 5, ds = 11, ss = 7;
  tensor dst = input(c, n * ds, -1, 1, 0, r), src = input(c, n * ss, -1, 1, 0, r);
  double *want = malloc(sizeof(double) * (size_t)(n * ds));
  for (int64_t i = 0; i < n * ds; i++)
    want[i] = i % ds < block ? src.h[i / ds * ss + i % ds] : dst.h[i];
  assert_int_equal(b->copy_blocks(c, dst.d, ds, src.d, ss, block, n), KILN_OK);
  fetch(&dst);
  double e = error_of(dst.h, want, n * ds);
  free(want);
  drop(&dst);
  drop(&src);
  return e;
}

/* Tile: n outer blocks of 6 floats, 3 tiles; its gradient sums the tiles. */
static double case_tile(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                        kiln_rng *r) {
  const int64_t inner = 6, tiles = 3;
  tensor x = input(c, n * inner, -1, 1, 0, r), y = input(c, n * inner * tiles, -1, 1, 0, r);
  double e;
  if (op == KILN_OP_tile_fwd) {
    assert_int_equal(b->tile_fwd(c, y.d, x.d, n, tiles, inner), KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(n * inner * tiles));
    for (int64_t i = 0; i < n * inner * tiles; i++)
      want[i] = x.h[i / (inner * tiles) * inner + i % inner];
    fetch(&y);
    e = error_of(y.h, want, n * inner * tiles);
    free(want);
  } else {
    assert_int_equal(b->tile_bwd(c, x.d, y.d, n, tiles, inner), KILN_OK);
    double *want = calloc((size_t)(n * inner), sizeof(double));
    for (int64_t i = 0; i < n * inner * tiles; i++)
      want[i / (inner * tiles) * inner + i % inner] += y.h[i];
    fetch(&x);
    e = error_of(x.h, want, n * inner);
    free(want);
  }
  drop(&x);
  drop(&y);
  return e;
}
static double case_tile_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  (void)p;
  return case_tile(KILN_OP_tile_fwd, b, c, n, r);
}
static double case_tile_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  (void)p;
  return case_tile(KILN_OP_tile_bwd, b, c, n, r);
}

/* Crop's window of a 3-axis n x 5 x 7 input at offset (0, 1, 2), shape n x 3 x 4, both ways
 * (p: 1 to the small side, 0 back into the big one, whose other values stay). */
static double case_crop_copy(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  const int64_t big_shape[3] = {n, 5, 7}, small_shape[3] = {n, 3, 4}, offset[3] = {0, 1, 2};
  tensor big = input(c, n * 35, -1, 1, 0, r), small = input(c, n * 12, -1, 1, 0, r);
  const bool to_small = p != 0;
  assert_int_equal(b->crop_copy(c, small.d, big.d, 3, big_shape, small_shape, offset, to_small),
                   KILN_OK);
  double *want = malloc(sizeof(double) * (size_t)(n * 35));
  double e;
  if (to_small) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < 3; h++)
        for (int64_t w = 0; w < 4; w++)
          want[(i * 3 + h) * 4 + w] = big.h[(i * 5 + h + 1) * 7 + w + 2];
    fetch(&small);
    e = error_of(small.h, want, n * 12);
  } else {
    for (int64_t i = 0; i < n * 35; i++) want[i] = big.h[i];
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < 3; h++)
        for (int64_t w = 0; w < 4; w++)
          want[(i * 5 + h + 1) * 7 + w + 2] = small.h[(i * 3 + h) * 4 + w];
    fetch(&big);
    e = error_of(big.h, want, n * 35);
  }
  free(want);
  drop(&big);
  drop(&small);
  return e;
}

/* Permute's cases: a shape and an order; one value, 3 and 4 axes (SSD's 0 2 3 1 among them), an
 * identity, the inverse of 0 2 3 1, 6 axes, and past the parallel threshold. */
static const struct {
  int naxes;
  int64_t shape[6];
  int order[6];
} perm_cases[] = {
    {1, {1}, {0}},
    {3, {2, 3, 5}, {2, 0, 1}},
    {3, {4, 1, 7}, {1, 2, 0}},
    {4, {2, 3, 4, 5}, {0, 2, 3, 1}},
    {4, {2, 4, 5, 3}, {0, 3, 1, 2}},
    {4, {3, 2, 5, 7}, {0, 1, 2, 3}},
    {6, {2, 1, 3, 2, 4, 3}, {5, 3, 0, 4, 1, 2}},
    {4, {4, 33, 17, 19}, {0, 2, 3, 1}},
    {4, {4, 33, 17, 19}, {3, 1, 0, 2}},
};

static double case_permute(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                           kiln_rng *r) {
  (void)p;
  const int naxes = perm_cases[n].naxes;
  const int64_t *shape = perm_cases[n].shape;
  const int *order = perm_cases[n].order;
  int64_t count = 1, stride[6], out[6];
  for (int a = naxes - 1; a >= 0; a--) {
    stride[a] = count;
    count *= shape[a];
  }
  tensor x = input(c, count, -1, 1, 0, r), y = make(c, count);
  double *want = norm_doubles(count);
  for (int i = 0; i < naxes; i++) out[i] = shape[order[i]];
  for (int64_t i = 0; i < count; i++) { /* output index i: its input place, axis by axis */
    int64_t rem = i, at = 0;
    for (int a = naxes - 1; a >= 0; a--) {
      at += rem % out[a] * stride[order[a]];
      rem /= out[a];
    }
    want[i] = x.h[at];
  }
  assert_int_equal(b->permute(c, y.d, x.d, naxes, shape, order, count), KILN_OK);
  double e = norm_check(0, &y, want);
  /* an order that is no permutation, and a count that is not the shape's, are refused */
  const int bad[6] = {0, 0, 1, 2, 3, 4};
  if (naxes > 1)
    assert_int_equal(b->permute(c, y.d, x.d, naxes, shape, bad, count), KILN_ERR_INVALID);
  assert_int_equal(b->permute(c, y.d, x.d, naxes, shape, order, count + 1), KILN_ERR_INVALID);
  free(want);
  drop(&x), drop(&y);
  return e;
}

/* Rows by index: select_nonzero on a selector with zeros; gather_rows and scatter_rows by
 * those positions; the float-index forms with repeats (BatchReindex) and an index out of range
 * refused. Rows of 3 floats. */
static double case_rows(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                        kiln_rng *r) {
  const int64_t dim = 3;
  tensor sel = make(c, n), x = input(c, n * dim, -1, 1, 0, r), y = input(c, n * dim, -1, 1, 0, r);
  for (int64_t i = 0; i < n; i++) sel.h[i] = kiln_rng_below(r, 3) ? (float)(i % 5) : 0.0f;
  assert_int_equal(kiln_device_to_device(c->device, sel.d, sel.h, sizeof(float) * (size_t)n), KILN_OK);
  int64_t *index = malloc(sizeof(int64_t) * (size_t)n), count = -1, want_count = 0;
  double *want = malloc(sizeof(double) * (size_t)(n * dim)), e = 0;
  assert_int_equal(b->select_nonzero(c, index, &count, sel.d, n), KILN_OK);
  for (int64_t i = 0; i < n; i++)
    if (sel.h[i] != 0 && index[want_count++] != i) e = INFINITY;
  if (count != want_count) e = INFINITY;
  if (op == KILN_OP_gather_rows || op == KILN_OP_select_nonzero) {
    assert_int_equal(b->gather_rows(c, y.d, x.d, index, count, dim), KILN_OK);
    for (int64_t k = 0; k < count * dim; k++) want[k] = x.h[index[k / dim] * dim + k % dim];
    fetch(&y);
    double ek = error_of(y.h, want, count * dim);
    if (!(ek <= e)) e = ek;
  } else if (op == KILN_OP_scatter_rows) {
    for (int64_t k = 0; k < n * dim; k++) want[k] = y.h[k];
    for (int64_t k = 0; k < count * dim; k++) want[index[k / dim] * dim + k % dim] = x.h[k];
    assert_int_equal(b->scatter_rows(c, y.d, x.d, index, count, dim), KILN_OK);
    fetch(&y);
    double ek = error_of(y.h, want, n * dim);
    if (!(ek <= e)) e = ek;
  } else { /* float indices with repeats: gather_rows_at, scatter_add_rows_at */
    tensor idx = make(c, n);
    for (int64_t k = 0; k < n; k++) idx.h[k] = (float)kiln_rng_below(r, (uint32_t)n);
    assert_int_equal(kiln_device_to_device(c->device, idx.d, idx.h, sizeof(float) * (size_t)n), KILN_OK);
    if (op == KILN_OP_gather_rows_at) {
      assert_int_equal(b->gather_rows_at(c, y.d, x.d, idx.d, n, n, dim), KILN_OK);
      for (int64_t k = 0; k < n * dim; k++) want[k] = x.h[(int64_t)idx.h[k / dim] * dim + k % dim];
    } else {
      for (int64_t k = 0; k < n * dim; k++) want[k] = y.h[k];
      for (int64_t k = 0; k < n * dim; k++) want[(int64_t)idx.h[k / dim] * dim + k % dim] += x.h[k];
      assert_int_equal(b->scatter_add_rows_at(c, y.d, x.d, idx.d, n, n, dim), KILN_OK);
    }
    fetch(&y);
    double ek = error_of(y.h, want, n * dim);
    if (!(ek <= e)) e = ek;
    /* an index past the rows, and a negative one: refused, naming the position */
    idx.h[n - 1] = (float)n;
    assert_int_equal(kiln_device_to_device(c->device, idx.d, idx.h, sizeof(float) * (size_t)n), KILN_OK);
    int rc = op == KILN_OP_gather_rows_at ? b->gather_rows_at(c, y.d, x.d, idx.d, n, n, dim)
                                          : b->scatter_add_rows_at(c, y.d, x.d, idx.d, n, n, dim);
    if (rc != KILN_ERR_DATA || !strstr(kiln_last_error(), "past the batch")) e = INFINITY;
    drop(&idx);
  }
  free(index);
  free(want);
  drop(&sel);
  drop(&x);
  drop(&y);
  return e;
}
#define ROWS_CASE(name)                                                                        \
  static double case_##name(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,   \
                            kiln_rng *r) {                                                     \
    (void)p;                                                                                   \
    return case_rows(KILN_OP_##name, b, c, n, r);                                              \
  }
ROWS_CASE(select_nonzero)
ROWS_CASE(gather_rows)
ROWS_CASE(scatter_rows)
ROWS_CASE(gather_rows_at)
ROWS_CASE(scatter_add_rows_at)

/* Embed: n positions into a table of 17 rows of N 70 (past a column block of 64), with a bias
 * (p 1) or not; its weight gradient with repeated rows; a fractional index refused. */
static double case_embed(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                         kiln_rng *r) {
  const int64_t K = 17, N = 70;
  tensor w = input(c, K * N, -1, 1, 0, r), bias = input(c, N, -1, 1, 0, r), idx = make(c, n);
  tensor y = input(c, n * N, -1, 1, 0, r);
  for (int64_t m = 0; m < n; m++) idx.h[m] = (float)kiln_rng_below(r, (uint32_t)K);
  assert_int_equal(kiln_device_to_device(c->device, idx.d, idx.h, sizeof(float) * (size_t)n), KILN_OK);
  double *want = malloc(sizeof(double) * (size_t)(K * N > n * N ? K * N : n * N)), e;
  if (op == KILN_OP_embed_fwd) {
    assert_int_equal(b->embed_fwd(c, y.d, w.d, p != 0 ? bias.d : NULL, idx.d, n, N, K), KILN_OK);
    for (int64_t m = 0; m < n; m++)
      for (int64_t j = 0; j < N; j++)
        want[m * N + j] = (double)w.h[(int64_t)idx.h[m] * N + j] + (p != 0 ? bias.h[j] : 0.0);
    fetch(&y);
    e = error_of(y.h, want, n * N);
  } else {
    for (int64_t k = 0; k < K * N; k++) want[k] = w.h[k];
    for (int64_t m = 0; m < n; m++)
      for (int64_t j = 0; j < N; j++) want[(int64_t)idx.h[m] * N + j] += y.h[m * N + j];
    assert_int_equal(b->embed_bwd(c, w.d, y.d, idx.d, n, N, K), KILN_OK);
    fetch(&w);
    e = error_of(w.h, want, K * N);
  }
  idx.h[0] = 2.5f;
  assert_int_equal(kiln_device_to_device(c->device, idx.d, idx.h, sizeof(float)), KILN_OK);
  int rc = op == KILN_OP_embed_fwd ? b->embed_fwd(c, y.d, w.d, NULL, idx.d, n, N, K)
                                   : b->embed_bwd(c, w.d, y.d, idx.d, n, N, K);
  if (rc != KILN_ERR_INVALID || !strstr(kiln_last_error(), "index 2.5 at element 0")) e = INFINITY;
  free(want);
  drop(&w);
  drop(&bias);
  drop(&idx);
  drop(&y);
  return e;
}
static double case_embed_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  return case_embed(KILN_OP_embed_fwd, b, c, n, p, r);
}
static double case_embed_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  return case_embed(KILN_OP_embed_bwd, b, c, n, p, r);
}

/* ArgMax of n items of 9 values along an axis with 2 values apart (dist 2) or over each item
 * (dist 1): the top 1 and top 3 (n and p: p's units digit the top_k, its tens out_max_val, its
 * hundreds along the axis), ties broken towards the larger index. */
static double case_argmax_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const int ip = (int)p, k = ip % 10;
  const bool out_max = ip / 10 % 10, along = ip / 100;
  const int64_t dim = 9, dist = along ? 2 : 1, num = n * dist;
  tensor x = make(c, n * dim * dist), y = make(c, 2 * num * k);
  for (int64_t i = 0; i < x.n; i++) x.h[i] = (float)kiln_rng_below(r, 5); /* many ties */
  assert_int_equal(kiln_device_to_device(c->device, x.d, x.h, sizeof(float) * (size_t)x.n), KILN_OK);
  void *ws = malloc((size_t)kiln_argmax_workspace_bytes(dim));
  assert_int_equal(b->argmax_fwd(c, y.d, ws, x.d, num, dim, dist, k, out_max, along), KILN_OK);
  fetch(&y);
  double e = 0;
  for (int64_t i = 0; i < num; i++) {
    const int64_t outer = i / dist, inner = i % dist;
    bool used[9] = {false};
    for (int j = 0; j < k; j++) { /* the j-th: the largest unused value, then the larger index */
      int64_t best = -1;
      for (int64_t q = dim - 1; q >= 0; q--)
        if (!used[q] && (best < 0 || x.h[(outer * dim + q) * dist + inner] >
                                         x.h[(outer * dim + best) * dist + inner]))
          best = q;
      used[best] = true;
      const float v = x.h[(outer * dim + best) * dist + inner];
      if (along) {
        if (y.h[(outer * k + j) * dist + inner] != (out_max ? v : (float)best)) e = INFINITY;
      } else if (out_max) {
        if (y.h[2 * i * k + j] != (float)best || y.h[2 * i * k + k + j] != v) e = INFINITY;
      } else if (y.h[i * k + j] != (float)best) {
        e = INFINITY;
      }
    }
  }
  free(ws);
  drop(&x);
  drop(&y);
  return e;
}

/* ---- sequence cases ---- */

/* Host values of t to the device. */
static void seq_put(tensor *t) {
  assert_int_equal(kiln_device_to_device(t->dev, t->d, t->h, sizeof(float) * (size_t)t->n),
                   KILN_OK);
}

static double seq_sig(double x) { return 1 / (1 + exp(-x)); }

static double *seq_dmalloc(int64_t n) { return malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); }

/* Worst of two errors (a NaN is the worst). */
static double seq_worst(double a, double b) { return !(a <= b) ? a : b; }

/* N streams of H state values: one, odd, off the SIMD widths, past the parallel threshold. */
static const int64_t seq_cells[][2] = {{1, 1}, {3, 7}, {5, 33}, {41, 800}};

/* C = A op(B) + beta C through a plan, against the sum in double: made, B set, run; run again
 * with another A; B set anew and run; an update of the same shape keeps the plan (n: the shape;
 * p: bit 1 B transposed, bit 2 beta 0.5 rather than 0). The last shape takes oneDNN on cpu. */
static const int64_t seq_plan_shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {32, 256, 64}};
static double seq_packed_gemm(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const int64_t M = seq_plan_shapes[n][0], N = seq_plan_shapes[n][1], K = seq_plan_shapes[n][2];
  const bool tb = (int)p & 1;
  const float beta = (int)p & 2 ? 0.5f : 0.0f;
  const int64_t lda = K, ldb = tb ? K : N, ldc = N;
  kiln_packed_gemm *plan = NULL;
  assert_int_equal(b->packed_gemm_update(c, &plan, tb, M, N, K, lda, ldb, ldc, beta), KILN_OK);
  assert_non_null(plan);
  kiln_packed_gemm *first = plan;
  assert_int_equal(b->packed_gemm_update(c, &plan, tb, M, N, K, lda, ldb, ldc, beta), KILN_OK);
  double e = plan == first ? 0 : INFINITY;
  tensor B = {0};
  double *want = malloc(sizeof(double) * (size_t)(M * N));
  for (int round = 0; round < 3; round++) {
    if (round != 1) {
      if (round) drop(&B);
      B = input(c, K * N, -1, 1, 0, r);
      assert_int_equal(b->packed_gemm_set_b(c, plan, B.d), KILN_OK);
    }
    tensor A = input(c, M * K, -1, 1, 0, r), C = input(c, M * N, -1, 1, 0, r);
    assert_int_equal(b->packed_gemm_run(c, plan, C.d, A.d), KILN_OK);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++)
          acc += (double)A.h[i * lda + k] * (tb ? B.h[j * ldb + k] : B.h[k * ldb + j]);
        want[i * N + j] = acc + beta * (double)C.h[i * N + j];
      }
    fetch(&C);
    e = seq_worst(e, error_of(C.h, want, M * N) / sqrt((double)K));
    drop(&A);
    drop(&C);
  }
  assert_int_equal(b->packed_gemm_free(c, plan), KILN_OK);
  assert_int_equal(b->packed_gemm_free(c, NULL), KILN_OK);
  free(want);
  drop(&B);
  return e;
}
static double case_packed_gemm_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                      float p, kiln_rng *r) {
  return seq_packed_gemm(b, c, n, p, r);
}
static double case_packed_gemm_set_b(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                     float p, kiln_rng *r) {
  return seq_packed_gemm(b, c, n, p, r);
}
static double case_packed_gemm_run(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                   kiln_rng *r) {
  return seq_packed_gemm(b, c, n, p, r);
}
static double case_packed_gemm_free(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                    float p, kiln_rng *r) {
  return seq_packed_gemm(b, c, n, p, r);
}

/* y = m x row by row from rows ldx apart, some factors 0 (p: m NULL, all 0). */
static double case_carry_rows(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const int64_t N = seq_cells[n][0], H = seq_cells[n][1], ldx = H + 3;
  tensor x = input(c, N * ldx, -2, 2, 0, r), m = input(c, N, -1, 1, 0, r), y = make(c, N * H);
  for (int64_t i = 0; i < N; i += 2) m.h[i] = 0;
  seq_put(&m);
  assert_int_equal(b->carry_rows(c, y.d, x.d, ldx, p ? NULL : m.d, N, H), KILN_OK);
  double *want = malloc(sizeof(double) * (size_t)(N * H));
  for (int64_t i = 0; i < N; i++)
    for (int64_t d = 0; d < H; d++) want[i * H + d] = p ? 0 : (double)m.h[i] * x.h[i * ldx + d];
  fetch(&y);
  double e = error_of(y.h, want, N * H);
  free(want);
  drop(&x);
  drop(&m);
  drop(&y);
  return e;
}

/* One LSTM cell in double from its four pre-activations a (H apart), cont and c_prev: the cell,
 * h, and (gates, or NULL) the gates' values. */
static void seq_lstm(const double *a, double cont, double cp, double *cell, double *h,
                     double *gates) {
  const double i = seq_sig(a[0]), f = cont == 0 ? 0 : cont * seq_sig(a[1]), o = seq_sig(a[2]);
  const double g = tanh(a[3]);
  *cell = f * cp + i * g;
  *h = o * tanh(*cell);
  if (gates) gates[0] = i, gates[1] = f, gates[2] = o, gates[3] = g;
}

/* cell, h (rows ldh apart) and the gates against the double cell; cont in {0, 1, 0.5} (p: cont
 * NULL, all 0). */
static double case_lstm_cell_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                 kiln_rng *r) {
  const int64_t N = seq_cells[n][0], H = seq_cells[n][1], ldh = H + 2;
  tensor pre = input(c, N * 4 * H, -3, 3, 0, r), cp = input(c, N * H, -2, 2, 0, r);
  tensor cont = input(c, N, 0, 1, 0, r), cell = make(c, N * H), h = make(c, N * ldh);
  for (int64_t i = 0; i < N; i++) cont.h[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : 0.5f;
  seq_put(&cont);
  assert_int_equal(b->lstm_cell_fwd(c, cell.d, h.d, ldh, pre.d, cp.d, p ? NULL : cont.d, N, H),
                   KILN_OK);
  double *wc = seq_dmalloc(N * H), *wh = seq_dmalloc(N * ldh), *wg = seq_dmalloc(N * 4 * H);
  float *hs = malloc(sizeof(float) * (size_t)(N * ldh));
  fetch(&cell);
  fetch(&h);
  for (int64_t i = 0; i < N * ldh; i++) wh[i] = hs[i] = 0;
  for (int64_t k = 0; k < N; k++)
    for (int64_t d = 0; d < H; d++) {
      double a[4], g[4];
      for (int q = 0; q < 4; q++) a[q] = pre.h[k * 4 * H + q * H + d];
      seq_lstm(a, p ? 0 : cont.h[k], cp.h[k * H + d], &wc[k * H + d], &wh[k * ldh + d], g);
      hs[k * ldh + d] = h.h[k * ldh + d];
      for (int q = 0; q < 4; q++) wg[k * 4 * H + q * H + d] = g[q];
    }
  fetch(&pre);
  double e = seq_worst(error_of(cell.h, wc, N * H), error_of(hs, wh, N * ldh));
  e = seq_worst(e, error_of(pre.h, wg, N * 4 * H));
  free(wc);
  free(wh);
  free(wg);
  free(hs);
  drop(&pre);
  drop(&cp);
  drop(&cont);
  drop(&cell);
  drop(&h);
  return e;
}

/* L = sum dc cell + dh_t h with dh_t = dh[n ldh + d] (+ dh2): the gates' and c_prev's gradients
 * against central differences of the double cell at the pre-activations; the gates and the cell
 * from the backend's lstm_cell_fwd, cont in {0, 1}. p: bit 1 no dgates, bit 2 dh2 and dc_prev in
 * place of dc, bit 4 no dc_prev. */
static double case_lstm_cell_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                 kiln_rng *r) {
  const int64_t N = seq_cells[n][0], H = seq_cells[n][1], ldh = H + 1, G = 4 * H;
  const bool no_dg = (int)p & 1, extra = (int)p & 2, no_dcp = (int)p & 4;
  tensor pre = input(c, N * G, -2, 2, 0, r), cp = input(c, N * H, -2, 2, 0, r);
  tensor cont = input(c, N, 0, 1, 0, r), cell = make(c, N * H), h = make(c, N * H);
  for (int64_t i = 0; i < N; i++) cont.h[i] = i % 3 == 1 ? 0.0f : 1.0f;
  seq_put(&cont);
  tensor gates = make(c, N * G);
  memcpy(gates.h, pre.h, sizeof(float) * (size_t)(N * G));
  seq_put(&gates);
  assert_int_equal(b->lstm_cell_fwd(c, cell.d, h.d, H, gates.d, cp.d, cont.d, N, H), KILN_OK);
  tensor dc = input(c, N * H, -1, 1, 0, r), dh = input(c, N * ldh, -1, 1, 0, r);
  tensor dh2 = input(c, N * H, -1, 1, 0, r), dg = make(c, N * G), dcp = make(c, N * H);
  float *dcp_d = no_dcp ? NULL : extra ? dc.d : dcp.d;
  assert_int_equal(b->lstm_cell_bwd(c, dcp_d, no_dg ? NULL : dg.d, gates.d, cell.d, cp.d, dc.d,
                                    dh.d, ldh, extra ? dh2.d : NULL, N, H),
                   KILN_OK);
  double *wg = seq_dmalloc(N * G), *wc = seq_dmalloc(N * H);
  const double step = 1e-5;
  for (int64_t k = 0; k < N; k++)
    for (int64_t d = 0; d < H; d++) {
      const int64_t e = k * H + d;
      const double w_h = (double)dh.h[k * ldh + d] + (extra ? dh2.h[e] : 0.0f);
      double v[5];
      for (int q = 0; q < 4; q++) v[q] = pre.h[k * G + q * H + d];
      v[4] = cp.h[e];
      for (int q = 0; q < 5; q++) {
        double lo, hi, cl, hl, ch, hh;
        const double keep = v[q];
        v[q] = keep + step;
        seq_lstm(v, cont.h[k], v[4], &ch, &hh, NULL);
        hi = dc.h[e] * ch + w_h * hh;
        v[q] = keep - step;
        seq_lstm(v, cont.h[k], v[4], &cl, &hl, NULL);
        lo = dc.h[e] * cl + w_h * hl;
        v[q] = keep;
        const double g = (hi - lo) / (2 * step);
        if (q < 4) wg[k * G + q * H + d] = g;
        else wc[e] = g;
      }
    }
  double e = 0;
  if (!no_dg) {
    fetch(&dg);
    e = error_of(dg.h, wg, N * G);
  }
  if (!no_dcp) {
    tensor *got = extra ? &dc : &dcp;
    fetch(got);
    e = seq_worst(e, error_of(got->h, wc, N * H));
  }
  free(wg);
  free(wc);
  tensor *all[] = {&pre, &cp, &cont, &cell, &h, &gates, &dc, &dh, &dh2, &dg, &dcp};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}

/* One GRU cell in double: gi and gh (the gates' input and recurrent terms, H apart), bh, h'. */
static void seq_gru(const double *gi, const double *gh, const double *bh, double hp, double *h,
                    double *gates, double *ghn) {
  const double rr = seq_sig(gi[0] + gh[0] + bh[0]), z = seq_sig(gi[1] + gh[1] + bh[1]);
  const double g = gh[2] + bh[2], nn = tanh(gi[2] + rr * g);
  *h = (1 - z) * nn + z * hp;
  if (gates) gates[0] = rr, gates[1] = z, gates[2] = nn;
  if (ghn) *ghn = g;
}

static void seq_gru_inputs(const float *gi, const float *gh, const float *bh, int64_t k,
                           int64_t d, int64_t H, double *a, double *g, double *bb) {
  for (int q = 0; q < 3; q++) {
    a[q] = gi[k * 3 * H + q * H + d];
    g[q] = gh[k * 3 * H + q * H + d];
    bb[q] = bh[q * H + d];
  }
}

/* h (rows ldh apart), ghn and the gates against the double cell. */
static double case_gru_cell_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  (void)p;
  const int64_t N = seq_cells[n][0], H = seq_cells[n][1], ldh = H + 2, G = 3 * H;
  tensor gi = input(c, N * G, -2, 2, 0, r), gh = input(c, N * G, -2, 2, 0, r);
  tensor bh = input(c, G, -1, 1, 0, r), hp = input(c, N * H, -1, 1, 0, r);
  tensor h = make(c, N * ldh), ghn = make(c, N * H);
  assert_int_equal(b->gru_cell_fwd(c, h.d, ldh, ghn.d, gi.d, gh.d, bh.d, hp.d, N, H), KILN_OK);
  double *wh = calloc((size_t)(N * ldh), sizeof(double)), *wn = seq_dmalloc(N * H);
  double *wg = seq_dmalloc(N * G);
  float *hs = calloc((size_t)(N * ldh), sizeof(float));
  fetch(&h);
  for (int64_t k = 0; k < N; k++)
    for (int64_t d = 0; d < H; d++) {
      double a[3], g[3], bb[3], gates[3];
      seq_gru_inputs(gi.h, gh.h, bh.h, k, d, H, a, g, bb);
      seq_gru(a, g, bb, hp.h[k * H + d], &wh[k * ldh + d], gates, &wn[k * H + d]);
      for (int q = 0; q < 3; q++) wg[k * G + q * H + d] = gates[q];
      hs[k * ldh + d] = h.h[k * ldh + d];
    }
  fetch(&gi);
  fetch(&ghn);
  double e = seq_worst(error_of(hs, wh, N * ldh), error_of(ghn.h, wn, N * H));
  e = seq_worst(e, error_of(gi.h, wg, N * G));
  free(wh);
  free(wn);
  free(wg);
  free(hs);
  tensor *all[] = {&gi, &gh, &bh, &hp, &h, &ghn};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}

/* L = sum (dy[n ldy + d] + dh) h: d_in, d_rec and h''s direct gradient (into dh) against central
 * differences of the double cell in gi, gh and h'; the gates from the backend's gru_cell_fwd. */
static double case_gru_cell_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  (void)p;
  const int64_t N = seq_cells[n][0], H = seq_cells[n][1], ldy = H + 3, G = 3 * H;
  tensor gi = input(c, N * G, -2, 2, 0, r), gh = input(c, N * G, -2, 2, 0, r);
  tensor bh = input(c, G, -1, 1, 0, r), hp = input(c, N * H, -1, 1, 0, r);
  tensor h = make(c, N * H), ghn = make(c, N * H), gates = make(c, N * G);
  memcpy(gates.h, gi.h, sizeof(float) * (size_t)(N * G));
  seq_put(&gates);
  assert_int_equal(b->gru_cell_fwd(c, h.d, H, ghn.d, gates.d, gh.d, bh.d, hp.d, N, H), KILN_OK);
  tensor dy = input(c, N * ldy, -1, 1, 0, r), dh = input(c, N * H, -1, 1, 0, r);
  tensor d_in = make(c, N * G), d_rec = make(c, N * G);
  assert_int_equal(b->gru_cell_bwd(c, d_in.d, d_rec.d, dh.d, dy.d, ldy, gates.d, ghn.d, hp.d, N, H),
                   KILN_OK);
  double *wi = seq_dmalloc(N * G), *wr = seq_dmalloc(N * G), *wp = seq_dmalloc(N * H);
  const double step = 1e-5;
  for (int64_t k = 0; k < N; k++)
    for (int64_t d = 0; d < H; d++) {
      const int64_t e = k * H + d;
      const double w = (double)dy.h[k * ldy + d] + dh.h[e];
      double a[3], g[3], bb[3], x = hp.h[e], hi, lo;
      seq_gru_inputs(gi.h, gh.h, bh.h, k, d, H, a, g, bb);
      for (int q = 0; q < 7; q++) {
        double *v = q < 3 ? &a[q] : q < 6 ? &g[q - 3] : &x;
        const double keep = *v;
        *v = keep + step;
        seq_gru(a, g, bb, x, &hi, NULL, NULL);
        *v = keep - step;
        seq_gru(a, g, bb, x, &lo, NULL, NULL);
        *v = keep;
        const double grad = w * (hi - lo) / (2 * step);
        if (q < 3) wi[k * G + q * H + d] = grad;
        else if (q < 6) wr[k * G + (q - 3) * H + d] = grad;
        else wp[e] = grad;
      }
    }
  fetch(&d_in);
  fetch(&d_rec);
  fetch(&dh);
  double e = seq_worst(error_of(d_in.h, wi, N * G), error_of(d_rec.h, wr, N * G));
  e = seq_worst(e, error_of(dh.h, wp, N * H));
  free(wi);
  free(wr);
  free(wp);
  tensor *all[] = {&gi, &gh, &bh, &hp, &h, &ghn, &gates, &dy, &dh, &d_in, &d_rec};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}

/* h = tanh h in place, against tanh in double. */
static double case_rnn_step_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  (void)p;
  tensor h = input(c, n, -5, 5, 0, r);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = tanh(h.h[i]);
  assert_int_equal(b->rnn_step_fwd(c, h.d, n), KILN_OK);
  fetch(&h);
  double e = error_of(h.h, want, n);
  free(want);
  drop(&h);
  return e;
}

/* L = sum (d + dh) tanh(z), h = tanh z: d against central differences in z. */
static double case_rnn_step_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  (void)p;
  tensor z = input(c, n, -3, 3, 0, r), h = make(c, n), d = input(c, n, -1, 1, 0, r);
  tensor dh = input(c, n, -1, 1, 0, r);
  for (int64_t i = 0; i < n; i++) h.h[i] = (float)tanh(z.h[i]);
  seq_put(&h);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    want[i] = ((double)d.h[i] + dh.h[i]) * d_slope(d_tanh, z.h[i], 0);
  assert_int_equal(b->rnn_step_bwd(c, d.d, dh.d, h.d, n), KILN_OK);
  fetch(&d);
  double e = error_of(d.h, want, n);
  free(want);
  drop(&z);
  drop(&h);
  drop(&d);
  drop(&dh);
  return e;
}

/* out = tanh(out + b) and its rows into y, ldy apart, against double (M x H: seq_cells[n]). */
static double case_rnn_out_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  (void)p;
  const int64_t M = seq_cells[n][0], H = seq_cells[n][1], ldy = 2 * H;
  tensor out = input(c, M * H, -3, 3, 0, r), bias = input(c, H, -1, 1, 0, r);
  tensor y = make(c, M * ldy);
  double *want = malloc(sizeof(double) * (size_t)(M * H));
  for (int64_t i = 0; i < M; i++)
    for (int64_t d = 0; d < H; d++) want[i * H + d] = tanh((double)out.h[i * H + d] + bias.h[d]);
  assert_int_equal(b->rnn_out_fwd(c, y.d, ldy, out.d, bias.d, M, H), KILN_OK);
  fetch(&out);
  fetch(&y);
  double e = error_of(out.h, want, M * H);
  for (int64_t i = 0; i < M; i++) e = seq_worst(e, error_of(y.h + i * ldy, want + i * H, H));
  free(want);
  drop(&out);
  drop(&bias);
  drop(&y);
  return e;
}

/* L = sum dy tanh(u), out = tanh u: dz against central differences in u; dy rows ldy apart. */
static double case_rnn_out_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  (void)p;
  const int64_t M = seq_cells[n][0], H = seq_cells[n][1], ldy = H + 5;
  tensor u = input(c, M * H, -3, 3, 0, r), out = make(c, M * H);
  tensor dy = input(c, M * ldy, -1, 1, 0, r), dz = make(c, M * H);
  for (int64_t i = 0; i < M * H; i++) out.h[i] = (float)tanh(u.h[i]);
  seq_put(&out);
  double *want = malloc(sizeof(double) * (size_t)(M * H));
  for (int64_t i = 0; i < M; i++)
    for (int64_t d = 0; d < H; d++)
      want[i * H + d] = dy.h[i * ldy + d] * d_slope(d_tanh, u.h[i * H + d], 0);
  assert_int_equal(b->rnn_out_bwd(c, dz.d, dy.d, ldy, out.d, M, H), KILN_OK);
  fetch(&dz);
  double e = error_of(dz.h, want, M * H);
  free(want);
  drop(&u);
  drop(&out);
  drop(&dy);
  drop(&dz);
  return e;
}

/* Rows [T / 3, T) of the sinusoidal table against double; the rows before stay as they were
 * (n: T; D 1, 6 or 7 by T's size). */
static double case_sinusoid_table(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                  kiln_rng *r) {
  (void)p;
  const int64_t T = n, D = n == 1 ? 1 : n < 50 ? 7 : 6, from = T / 3;
  tensor tab = input(c, T * D, -1, 1, 0, r);
  double *want = malloc(sizeof(double) * (size_t)(T * D));
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < D; j++) {
      const double angle = (double)t / pow(10000.0, (double)(j - j % 2) / (double)D);
      want[t * D + j] = t < from ? tab.h[t * D + j] : j % 2 ? cos(angle) : sin(angle);
    }
  assert_int_equal(b->sinusoid_table(c, tab.d, from, T, D), KILN_OK);
  fetch(&tab);
  double e = error_of(tab.h, want, T * D);
  free(want);
  drop(&tab);
  return e;
}

/* T x N x D shapes of the per-step ops: one, odd, past the parallel threshold. */
static const int64_t seq_steps[][3] = {{1, 1, 1}, {3, 5, 7}, {40, 30, 33}};

/* y = x + v[t], and dv += the sum over n of dy, against double. */
static double seq_step_case(int op, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                            kiln_rng *r) {
  const int64_t T = seq_steps[n][0], N = seq_steps[n][1], D = seq_steps[n][2];
  tensor x = input(c, T * N * D, -2, 2, 0, r), v = input(c, T * D, -2, 2, 0, r);
  tensor y = make(c, T * N * D);
  double e;
  if (op == KILN_OP_step_add) {
    assert_int_equal(b->step_add(c, y.d, x.d, v.d, T, N, D), KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(T * N * D));
    for (int64_t i = 0; i < T * N * D; i++)
      want[i] = (double)x.h[i] + v.h[(i / (N * D)) * D + i % D];
    fetch(&y);
    e = error_of(y.h, want, T * N * D);
    free(want);
  } else {
    assert_int_equal(b->step_sum_into(c, v.d, x.d, T, N, D), KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(T * D));
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < D; j++) {
        want[t * D + j] = v.h[t * D + j];
        for (int64_t k = 0; k < N; k++) want[t * D + j] += x.h[(t * N + k) * D + j];
      }
    fetch(&v);
    e = error_of(v.h, want, T * D) / sqrt((double)N);
    free(want);
  }
  drop(&x);
  drop(&v);
  drop(&y);
  return e;
}
static double case_step_add(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                            kiln_rng *r) {
  (void)p;
  return seq_step_case(KILN_OP_step_add, b, c, n, r);
}
static double case_step_sum_into(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                 kiln_rng *r) {
  (void)p;
  return seq_step_case(KILN_OP_step_sum_into, b, c, n, r);
}

/* SequencePool in double over T x N x D (seq_pool_shapes[n]): y, and the winning steps. */
static const int64_t seq_pool_shapes[][3] = {{1, 1, 1}, {6, 4, 5}, {9, 3, 33}};
static void seq_pool_double(double *y, int64_t *arg, const float *x, const float *mask,
                            const double *xd, int64_t T, int64_t N, int64_t D, int pool) {
  for (int64_t k = 0; k < N; k++) {
    int64_t count = 0, last = -1;
    for (int64_t t = 0; t < T; t++)
      if (!mask || mask[t * N + k] != 0) count++, last = t;
    for (int64_t d = 0; d < D; d++) {
      double best = -INFINITY, sum = 0;
      int64_t at = last;
      for (int64_t t = 0; t < T; t++) {
        if (mask && mask[t * N + k] == 0) continue;
        const double v = xd ? xd[(t * N + k) * D + d] : x[(t * N + k) * D + d];
        sum += v;
        if (v > best) best = v, at = t;
      }
      const double lastv = xd ? xd[(last * N + k) * D + d] : x[(last * N + k) * D + d];
      y[k * D + d] = pool == KILN_SEQ_POOL_LAST   ? lastv
                     : pool == KILN_SEQ_POOL_MEAN ? sum / count
                                                  : best;
      if (arg) arg[k * D + d] = at;
    }
  }
}

/* A mask with some padding, every sequence keeping a valid step (none for the last sequence
 * when `empty`). */
static void seq_pool_mask(tensor *m, int64_t T, int64_t N, bool empty, kiln_rng *r) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t k = 0; k < N; k++)
      m->h[t * N + k] = t == k % T || kiln_rng_uniform(r, 0, 1) < 0.5f ? 1.0f : 0.0f;
  if (empty)
    for (int64_t t = 0; t < T; t++) m->h[t * N + N - 1] = 0;
  seq_put(m);
}

/* y and arg against double; p: the pool kind + 3 with a mask; 6: a sequence without a valid
 * step must be KILN_ERR_DATA. */
static double case_seq_pool_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  const int64_t T = seq_pool_shapes[n][0], N = seq_pool_shapes[n][1], D = seq_pool_shapes[n][2];
  const int pool = (int)p % 3;
  const bool masked = (int)p >= 3, empty = (int)p == 6;
  tensor x = input(c, T * N * D, -2, 2, 0, r), m = make(c, T * N), y = make(c, N * D);
  tensor arg = make(c, N * D);
  if (masked) seq_pool_mask(&m, T, N, empty, r);
  const int rc =
      b->seq_pool_fwd(c, y.d, arg.d, x.d, masked ? m.d : NULL, T, N, D, (kiln_seq_pool)pool);
  double e;
  if (empty) {
    e = rc == KILN_ERR_DATA && strstr(kiln_last_error(), "no valid step") ? 0 : INFINITY;
  } else {
    assert_int_equal(rc, KILN_OK);
    double *want = malloc(sizeof(double) * (size_t)(N * D));
    int64_t *wa = malloc(sizeof(int64_t) * (size_t)(N * D));
    seq_pool_double(want, wa, x.h, masked ? m.h : NULL, NULL, T, N, D, pool);
    fetch(&y);
    e = error_of(y.h, want, N * D);
    if (pool == KILN_SEQ_POOL_MAX) {
      fetch(&arg);
      for (int64_t i = 0; i < N * D; i++)
        if (arg.h[i] != (float)wa[i]) e = INFINITY;
    }
    free(want);
    free(wa);
  }
  drop(&x);
  drop(&m);
  drop(&y);
  drop(&arg);
  return e;
}

/* L = sum dy y: dx (overwritten) against central differences of the double pooling in x; arg
 * from the backend's seq_pool_fwd; p: the pool kind + 3 with a mask. */
static double case_seq_pool_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                kiln_rng *r) {
  const int64_t T = seq_pool_shapes[n][0], N = seq_pool_shapes[n][1], D = seq_pool_shapes[n][2];
  const int pool = (int)p % 3;
  const bool masked = (int)p >= 3;
  const int64_t X = T * N * D;
  tensor x = input(c, X, -2, 2, 0, r), m = make(c, T * N), y = make(c, N * D);
  tensor arg = make(c, N * D), dy = input(c, N * D, -1, 1, 0, r), dx = input(c, X, 5, 6, 0, r);
  if (masked) seq_pool_mask(&m, T, N, false, r);
  const float *mh = masked ? m.h : NULL;
  assert_int_equal(
      b->seq_pool_fwd(c, y.d, arg.d, x.d, masked ? m.d : NULL, T, N, D, (kiln_seq_pool)pool),
      KILN_OK);
  assert_int_equal(
      b->seq_pool_bwd(c, dx.d, dy.d, arg.d, masked ? m.d : NULL, T, N, D, (kiln_seq_pool)pool),
      KILN_OK);
  double *xd = malloc(sizeof(double) * (size_t)X), *want = malloc(sizeof(double) * (size_t)X);
  double *yd = malloc(sizeof(double) * (size_t)(N * D));
  for (int64_t i = 0; i < X; i++) xd[i] = x.h[i];
  const double step = 1e-4;
  for (int64_t i = 0; i < X; i++) {
    double lo = 0, hi = 0;
    xd[i] = x.h[i] + step;
    seq_pool_double(yd, NULL, NULL, mh, xd, T, N, D, pool);
    for (int64_t j = 0; j < N * D; j++) hi += dy.h[j] * yd[j];
    xd[i] = x.h[i] - step;
    seq_pool_double(yd, NULL, NULL, mh, xd, T, N, D, pool);
    for (int64_t j = 0; j < N * D; j++) lo += dy.h[j] * yd[j];
    xd[i] = x.h[i];
    want[i] = (hi - lo) / (2 * step);
  }
  fetch(&dx);
  double e = error_of(dx.h, want, X);
  free(xd);
  free(want);
  free(yd);
  tensor *all[] = {&x, &m, &y, &arg, &dy, &dx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}

/* gemm_rows as gemm (case_gemm's check) at shapes of one block, several blocks, and one large
 * enough for the cpu backend's whole product; p: ta and tb as bits. */
static const int64_t seq_rows_shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {130, 17, 65}, {256, 64, 64}};
static double case_gemm_rows(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  const int64_t M = seq_rows_shapes[n][0], N = seq_rows_shapes[n][1], K = seq_rows_shapes[n][2];
  const bool ta = (int)p & 1, tb = (int)p & 2;
  const float alpha = 0.5f, beta = 0.75f;
  tensor A = input(c, M * K, -1, 1, 0, r), B = input(c, K * N, -1, 1, 0, r);
  tensor C = input(c, M * N, -1, 1, 0, r);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  assert_int_equal(b->gemm_rows(c, C.d, N, A.d, lda, B.d, ldb, ta, tb, M, N, K, alpha, beta),
                   KILN_OK);
  double *want = malloc(sizeof(double) * (size_t)(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++)
        acc += (double)(ta ? A.h[k * lda + i] : A.h[i * lda + k]) *
               (tb ? B.h[j * ldb + k] : B.h[k * ldb + j]);
      want[i * N + j] = alpha * acc + beta * (double)C.h[i * N + j];
    }
  fetch(&C);
  double e = error_of(C.h, want, M * N) / sqrt((double)K);
  free(want);
  drop(&A);
  drop(&B);
  drop(&C);
  return e;
}

/* db += the column sums of n rows of 37 (a block of 16 short), against double. */
static double case_sum_rows_double_into(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                        float p, kiln_rng *r) {
  (void)p;
  const int64_t M = n, N = 37;
  tensor dy = input(c, M * N, -2, 2, 0, r), db = input(c, N, -2, 2, 0, r);
  double *want = malloc(sizeof(double) * (size_t)N);
  for (int64_t j = 0; j < N; j++) {
    double s = 0;
    for (int64_t i = 0; i < M; i++) s += dy.h[i * N + j];
    want[j] = (double)db.h[j] + s;
  }
  assert_int_equal(b->sum_rows_double_into(c, db.d, dy.d, M, N), KILN_OK);
  fetch(&db);
  double e = error_of(db.h, want, N);
  free(want);
  drop(&dy);
  drop(&db);
  return e;
}

/* A mask of 0s and 1s passes; with p, one 0.5 is KILN_ERR_DATA naming its step and sequence. */
static double case_mask_check(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const int64_t S = n, N = 3;
  tensor m = make(c, S * N);
  for (int64_t i = 0; i < S * N; i++) m.h[i] = kiln_rng_uniform(r, 0, 1) < 0.5f ? 0.0f : 1.0f;
  const int64_t bad = S * N - 2; /* step S - 1, sequence 1 */
  if (p) m.h[bad] = 0.5f;
  seq_put(&m);
  const int rc = b->mask_check(c, m.d, S, N);
  char want[96];
  snprintf(want, sizeof want, "holds 0.5 at step %lld of sequence 1", (long long)(S - 1));
  const double e = p ? (rc == KILN_ERR_DATA && strstr(kiln_last_error(), want) ? 0 : 1)
                     : (rc == KILN_OK ? 0 : 1);
  drop(&m);
  return e;
}

/* Attention in double: ctx (T x N x D) and probs (N x H x T x S) from q, k, v. */
static const int seq_att_shapes[][5] = {{1, 1, 1, 1, 1}, {3, 4, 2, 2, 3}, {5, 5, 3, 2, 4},
                                        {7, 6, 5, 3, 5}};
static void seq_attention(double *ctx, double *probs, const double *q, const double *k,
                          const double *v, const float *valid, int T, int S, int N, int H, int hd,
                          double scale, bool causal) {
  const int D = H * hd;
  for (int i = 0; i < T * N * D; i++) ctx[i] = 0;
  for (int n = 0; n < N; n++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        double *p = probs + (((int64_t)n * H + h) * T + t) * S, mx = -INFINITY, sum = 0;
        for (int s = 0; s < S; s++) {
          const bool on = (!causal || s <= t) && (!valid || valid[s * N + n] != 0);
          const double *qt = q + ((int64_t)t * N + n) * D + h * hd;
          const double *ks = k + ((int64_t)s * N + n) * D + h * hd;
          double dot = 0;
          for (int j = 0; j < hd; j++) dot += qt[j] * ks[j];
          p[s] = on ? scale * dot : -INFINITY;
          if (p[s] > mx) mx = p[s];
        }
        for (int s = 0; s < S; s++) {
          p[s] = mx == -INFINITY || p[s] == -INFINITY ? 0 : exp(p[s] - mx);
          sum += p[s];
        }
        for (int s = 0; s < S; s++) {
          if (sum > 0) p[s] /= sum;
          double *ct = ctx + ((int64_t)t * N + n) * D + h * hd;
          const double *vs = v + ((int64_t)s * N + n) * D + h * hd;
          for (int j = 0; j < hd; j++) ct[j] += p[s] * vs[j];
        }
      }
}

/* A key padding mask, sequence 0 all padding (its queries see nothing). */
static void seq_att_mask(tensor *m, int S, int N, kiln_rng *r) {
  for (int s = 0; s < S; s++)
    for (int n = 0; n < N; n++)
      m->h[s * N + n] = n == 0 && N > 1 ? 0.0f : s == n % S || kiln_rng_uniform(r, 0, 1) < 0.6f;
  seq_put(m);
}

static double *seq_doubles(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* ctx and probs against double (seq_att_shapes[n]); p: bit 1 a padding mask, bit 2 causal. */
static double case_attention_fwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                 kiln_rng *r) {
  const int T = seq_att_shapes[n][0], S = seq_att_shapes[n][1], N = seq_att_shapes[n][2];
  const int H = seq_att_shapes[n][3], hd = seq_att_shapes[n][4], D = H * hd;
  const bool masked = (int)p & 1, causal = (int)p & 2;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t TND = (int64_t)T * N * D, SND = (int64_t)S * N * D;
  tensor q = input(c, TND, -2, 2, 0, r), k = input(c, SND, -2, 2, 0, r);
  tensor v = input(c, SND, -2, 2, 0, r), m = make(c, (int64_t)S * N);
  tensor ctx = make(c, TND), probs = make(c, (int64_t)N * H * T * S);
  if (masked) seq_att_mask(&m, S, N, r);
  assert_int_equal(b->attention_fwd(c, ctx.d, probs.d, q.d, k.d, v.d, masked ? m.d : NULL, T, S,
                                    N, H, hd, scale, causal),
                   KILN_OK);
  double *qd = seq_doubles(q.h, q.n), *kd = seq_doubles(k.h, k.n), *vd = seq_doubles(v.h, v.n);
  double *wc = seq_dmalloc(ctx.n), *wp = seq_dmalloc(probs.n);
  seq_attention(wc, wp, qd, kd, vd, masked ? m.h : NULL, T, S, N, H, hd, scale, causal);
  fetch(&ctx);
  fetch(&probs);
  double e = seq_worst(error_of(ctx.h, wc, ctx.n), error_of(probs.h, wp, probs.n));
  free(qd);
  free(kd);
  free(vd);
  free(wc);
  free(wp);
  tensor *all[] = {&q, &k, &v, &m, &ctx, &probs};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}

/* L = sum dctx ctx: dq, dk, dv (overwritten) against central differences of the double
 * attention; probs from the backend's attention_fwd; p as attention_fwd's. */
static double case_attention_bwd(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                                 kiln_rng *r) {
  const int T = seq_att_shapes[n][0], S = seq_att_shapes[n][1], N = seq_att_shapes[n][2];
  const int H = seq_att_shapes[n][3], hd = seq_att_shapes[n][4], D = H * hd;
  const bool masked = (int)p & 1, causal = (int)p & 2;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t TND = (int64_t)T * N * D, SND = (int64_t)S * N * D;
  tensor q = input(c, TND, -2, 2, 0, r), k = input(c, SND, -2, 2, 0, r);
  tensor v = input(c, SND, -2, 2, 0, r);
  tensor m = make(c, (int64_t)S * N), ctx = make(c, TND), probs = make(c, (int64_t)N * H * T * S);
  tensor dctx = input(c, TND, -1, 1, 0, r), dq = input(c, TND, 7, 8, 0, r);
  tensor dk = input(c, SND, 7, 8, 0, r), dv = input(c, SND, 7, 8, 0, r);
  tensor work = make(c, kiln_attention_workspace(T, S, c->nthreads));
  if (masked) seq_att_mask(&m, S, N, r);
  const float *valid = masked ? m.d : NULL;
  const float *mh = masked ? m.h : NULL;
  assert_int_equal(b->attention_fwd(c, ctx.d, probs.d, q.d, k.d, v.d, valid, T, S, N, H, hd,
                                    scale, causal),
                   KILN_OK);
  assert_int_equal(b->attention_bwd(c, dq.d, dk.d, dv.d, work.d, dctx.d, probs.d, q.d, k.d, v.d,
                                    T, S, N, H, hd, scale),
                   KILN_OK);
  double *in[3] = {seq_doubles(q.h, TND), seq_doubles(k.h, SND), seq_doubles(v.h, SND)};
  const int64_t len[3] = {TND, SND, SND};
  tensor *got[3] = {&dq, &dk, &dv};
  double *wc = malloc(sizeof(double) * (size_t)TND), *wp = malloc(sizeof(double) * (size_t)probs.n);
  const double step = 1e-5;
  double e = 0;
  for (int which = 0; which < 3; which++) {
    double *want = malloc(sizeof(double) * (size_t)len[which]);
    for (int64_t i = 0; i < len[which]; i++) {
      const double keep = in[which][i];
      double lo = 0, hi = 0;
      in[which][i] = keep + step;
      seq_attention(wc, wp, in[0], in[1], in[2], mh, T, S, N, H, hd, scale, causal);
      for (int64_t j = 0; j < TND; j++) hi += dctx.h[j] * wc[j];
      in[which][i] = keep - step;
      seq_attention(wc, wp, in[0], in[1], in[2], mh, T, S, N, H, hd, scale, causal);
      for (int64_t j = 0; j < TND; j++) lo += dctx.h[j] * wc[j];
      in[which][i] = keep;
      want[i] = (hi - lo) / (2 * step);
    }
    fetch(got[which]);
    e = seq_worst(e, error_of(got[which]->h, want, len[which]));
    free(want);
  }
  for (int i = 0; i < 3; i++) free(in[i]);
  free(wc);
  free(wp);
  tensor *all[] = {&q, &k, &v, &m, &ctx, &probs, &dctx, &dq, &dk, &dv, &work};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
  return e;
}

/* ---- solver cases ---- */

/* One step of each rule on one blob of n floats from random parameters w, gradients g and
 * histories h, h2, against the same step in double; the scalars an op reduces into (a sum, a
 * flag, an index) on the device too, read back through the device table. */

/* `bytes` on the device holding `v` (a scalar an op reads and writes). */
static void *dev_scalar(const kiln_op_ctx *c, const void *v, size_t bytes) {
  void *d;
  assert_int_equal(kiln_device_alloc(c->device, bytes, &d), KILN_OK);
  assert_int_equal(kiln_device_to_device(c->device, d, v, bytes), KILN_OK);
  return d;
}

static void host_scalar(const kiln_op_ctx *c, void *v, const void *d, size_t bytes) {
  assert_int_equal(kiln_device_to_host(c->device, v, d, bytes), KILN_OK);
}

/* The worse of two errors, a NaN the worst. */
static double sv_worse(double a, double b) { return !(a <= b) ? a : b; }

/* The error of the device's t against want (fetched first), freeing want. */
static double sv_check(tensor *t, double *want) {
  fetch(t);
  double e = error_of(t->h, want, t->n);
  free(want);
  return e;
}

static double *sv_doubles(int64_t n) {
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  assert_non_null(v);
  return v;
}

/* x^2 summed onto 0.5 in double (p: unused) */
static double case_sumsq_acc(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                             kiln_rng *r) {
  (void)p;
  tensor x = input(c, n, -2, 2, 0, r);
  double start = 0.5, got, want = start;
  double *d = dev_scalar(c, &start, sizeof start);
  assert_int_equal(b->sumsq_acc(c, d, x.d, n), KILN_OK);
  host_scalar(c, &got, d, sizeof got);
  for (int64_t i = 0; i < n; i++) want += (double)x.h[i] * x.h[i];
  kiln_device_free(c->device, d);
  drop(&x);
  return fabs(got - want) / (1 + fabs(want));
}

/* p: 0 L2 (norm 1/3, wd 0.01), 1 L1 (norm 1/4, wd 0.02, a zero weight first), 2 neither (norm 1,
 * wd 0: g unchanged) */
static double case_regularize(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const int mode = (int)p;
  const float norms[] = {1.0f / 3, 0.25f, 1}, wds[] = {0.01f, 0.02f, 0};
  const float norm = norms[mode], wd = wds[mode];
  tensor g = input(c, n, -1, 1, 0, r), w = input(c, n, -3, 3, 0, r);
  if (mode == 1) {
    w.h[0] = 0;
    assert_int_equal(kiln_device_to_device(c->device, w.d, w.h, sizeof(float)), KILN_OK);
  }
  double *want = sv_doubles(n);
  for (int64_t i = 0; i < n; i++) {
    double v = (double)g.h[i] * norm;
    double s = w.h[i] > 0 ? 1 : w.h[i] < 0 ? -1 : 0;
    want[i] = v + wd * (mode == 1 ? s : (double)w.h[i]);
  }
  assert_int_equal(b->regularize(c, g.d, w.d, n, norm, wd, mode == 1), KILN_OK);
  double e = sv_check(&g, want);
  drop(&g);
  drop(&w);
  return e;
}

/* p: 0 plain momentum (norm 1, wd 0), 1 normalised and decayed (norm 1/3, wd 5e-4), 2 as 1 with a
 * NaN gradient planted half-way, which must set the flag (the other elements still checked) */
static double case_sgd_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                              kiln_rng *r) {
  const int mode = (int)p;
  const float norm = mode ? 1.0f / 3 : 1, wd = mode ? 5e-4f : 0, lr = 0.05f, m = 0.9f;
  tensor w = input(c, n, -1, 1, 0, r), h = input(c, n, -0.1f, 0.1f, 0, r),
         g = input(c, n, -2, 2, 0, r);
  const int64_t planted = mode == 2 ? n / 2 : -1;
  if (planted >= 0) {
    g.h[planted] = NAN;
    assert_int_equal(
        kiln_device_to_device(c->device, g.d + planted, g.h + planted, sizeof(float)), KILN_OK);
  }
  double *ww = sv_doubles(n), *wh = sv_doubles(n), *wg = sv_doubles(n);
  for (int64_t i = 0; i < n; i++) {
    double gi = g.h[i];
    if (norm != 1) gi *= norm;
    if (wd != 0) gi += (double)wd * w.h[i];
    wg[i] = gi;
    wh[i] = (double)m * h.h[i] + (double)lr * gi;
    ww[i] = w.h[i] - wh[i];
  }
  if (planted >= 0) ww[planted] = wh[planted] = wg[planted] = 0; /* not compared */
  int32_t flag = 0, *bad = dev_scalar(c, &flag, sizeof flag);
  assert_int_equal(b->sgd_update(c, w.d, h.d, g.d, bad, n, norm, wd, lr, m), KILN_OK);
  host_scalar(c, &flag, bad, sizeof flag);
  kiln_device_free(c->device, bad);
  fetch(&w);
  fetch(&h);
  fetch(&g);
  if (planted >= 0) w.h[planted] = h.h[planted] = g.h[planted] = 0;
  double e = sv_worse(error_of(w.h, ww, n), error_of(h.h, wh, n));
  e = sv_worse(e, error_of(g.h, wg, n));
  if (flag != (planted >= 0)) e = INFINITY;
  free(ww);
  free(wh);
  free(wg);
  drop(&w);
  drop(&h);
  drop(&g);
  return e;
}

/* The other rules: (w, h, h2) one step in double. p: the rule's momentum or decay. */
enum { RULE_NESTEROV, RULE_ADAGRAD, RULE_RMSPROP, RULE_ADADELTA, RULE_ADAM };

static double rule_case(int rule, const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                        float p, kiln_rng *r) {
  /* histories where the rules keep them: squares and means of squares are positive */
  const bool squares = rule != RULE_NESTEROV;
  tensor w = input(c, n, -1, 1, 0, r), g = input(c, n, -1, 1, 0, r),
         h = squares ? input(c, n, 0.05f, 1, 0, r) : input(c, n, -0.1f, 0.1f, 0, r),
         h2 = input(c, n, 0.05f, 1, 0, r);
  const float lr = rule == RULE_ADADELTA ? 1.0f : 0.01f;
  const float delta = rule == RULE_ADADELTA ? 1e-6f : 1e-8f;
  const double b1 = 0.9, b2 = 0.999;
  double *ww = sv_doubles(n), *wh = sv_doubles(n), *wh2 = sv_doubles(n);
  for (int64_t i = 0; i < n; i++) {
    const double gi = g.h[i], hi = h.h[i], h2i = h2.h[i];
    double nh = hi, nh2 = h2i, step = 0;
    switch (rule) {
      case RULE_NESTEROV:
        nh = (double)p * hi + (double)lr * gi;
        step = (1 + (double)p) * nh - (double)p * hi;
        break;
      case RULE_ADAGRAD:
        nh = hi + gi * gi;
        step = lr * gi / (sqrt(nh) + delta);
        break;
      case RULE_RMSPROP:
        nh = (double)p * hi + (1 - (double)p) * gi * gi;
        step = lr * gi / (sqrt(nh) + delta);
        break;
      case RULE_ADADELTA: {
        nh = (double)p * hi + (1 - (double)p) * gi * gi;
        const double u = gi * sqrt((h2i + delta) / (nh + delta));
        nh2 = (double)p * h2i + (1 - (double)p) * u * u;
        step = lr * u;
        break;
      }
      default: /* Adam */
        nh = b1 * hi + (1 - b1) * gi;
        nh2 = b2 * h2i + (1 - b2) * gi * gi;
        step = lr * nh / (sqrt(nh2) + delta);
        break;
    }
    ww[i] = w.h[i] - step;
    wh[i] = nh;
    wh2[i] = nh2;
  }
  int rc = rule == RULE_NESTEROV  ? b->nesterov_update(c, w.d, h.d, g.d, n, lr, p)
           : rule == RULE_ADAGRAD ? b->adagrad_update(c, w.d, h.d, g.d, n, lr, delta)
           : rule == RULE_RMSPROP ? b->rmsprop_update(c, w.d, h.d, g.d, n, lr, p, delta)
           : rule == RULE_ADADELTA
               ? b->adadelta_update(c, w.d, h.d, h2.d, g.d, n, lr, p, delta)
               : b->adam_update(c, w.d, h.d, h2.d, g.d, n, lr, b1, b2, delta);
  assert_int_equal(rc, KILN_OK);
  double e = sv_worse(sv_check(&w, ww), sv_check(&h, wh));
  e = sv_worse(e, sv_check(&h2, wh2)); /* untouched by the rules of one history */
  drop(&w);
  drop(&g);
  drop(&h);
  drop(&h2);
  return e;
}
static double case_nesterov_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  return rule_case(RULE_NESTEROV, b, c, n, p, r);
}
static double case_adagrad_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  return rule_case(RULE_ADAGRAD, b, c, n, p, r);
}
static double case_rmsprop_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  return rule_case(RULE_RMSPROP, b, c, n, p, r);
}
static double case_adadelta_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                   float p, kiln_rng *r) {
  return rule_case(RULE_ADADELTA, b, c, n, p, r);
}
static double case_adam_update(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  return rule_case(RULE_ADAM, b, c, n, p, r);
}

/* p: 0 every value finite (-1), 1 a NaN at a random place and an infinity after it (the NaN's
 * index), 2 an infinity in the last place */
static double case_find_nonfinite(const kiln_backend *b, const kiln_op_ctx *c, int64_t n,
                                  float p, kiln_rng *r) {
  const int mode = (int)p;
  tensor x = input(c, n, -1e30f, 1e30f, 0, r);
  int64_t want = -1;
  if (mode == 1) {
    want = (int64_t)kiln_rng_below(r, (uint32_t)n);
    x.h[want] = NAN;
    if (want + 1 < n) x.h[n - 1] = INFINITY;
  } else if (mode == 2) {
    want = n - 1;
    x.h[want] = -INFINITY;
  }
  assert_int_equal(kiln_device_to_device(c->device, x.d, x.h, sizeof(float) * (size_t)n), KILN_OK);
  int64_t at = 12345, *d = dev_scalar(c, &at, sizeof at);
  assert_int_equal(b->find_nonfinite(c, d, x.d, n), KILN_OK);
  host_scalar(c, &at, d, sizeof at);
  kiln_device_free(c->device, d);
  drop(&x);
  return at == want ? 0 : INFINITY;
}

/* p buffers summed into each: against the sum in double, and every buffer the same bits */
static double case_ordered_sum(const kiln_backend *b, const kiln_op_ctx *c, int64_t n, float p,
                               kiln_rng *r) {
  const int np = (int)p;
  tensor t[4];
  float *ptrs[4];
  double *want = sv_doubles(n);
  for (int64_t i = 0; i < n; i++) want[i] = 0;
  for (int k = 0; k < np; k++) {
    t[k] = input(c, n, -1, 1, 0, r);
    ptrs[k] = t[k].d;
    for (int64_t i = 0; i < n; i++) want[i] += t[k].h[i];
  }
  assert_int_equal(b->ordered_sum(c, ptrs, np, n), KILN_OK);
  double e = 0;
  for (int k = 0; k < np; k++) {
    fetch(&t[k]);
    e = sv_worse(e, error_of(t[k].h, want, n));
    if (memcmp(t[k].h, t[0].h, sizeof(float) * (size_t)n)) e = INFINITY;
  }
  for (int k = 0; k < np; k++) drop(&t[k]);
  free(want);
  return e;
}

/* ---- the table ------------------------------------------------------------------------------ */

typedef struct {
  int op;
  case_fn run;
  int64_t n;
  float p;    /* the op's setting (a slope, a ratio) */
  double tol; /* on the error of error_of */
} op_row;

/* Sizes every element-wise op is tried at: one, odd, off the SIMD widths, past the parallel
 * threshold (32768). */
#define SIZES(op, fn, p, tol)                                                                   \
  {op, fn, 1, p, tol}, {op, fn, 7, p, tol}, {op, fn, 33, p, tol}, {op, fn, 1000, p, tol},       \
      {op, fn, 40001, p, tol}

static const op_row rows[] = {
    SIZES(KILN_OP_copy, case_copy, 0, 0),
    SIZES(KILN_OP_relu_fwd, case_relu_fwd, 0, 0),
    SIZES(KILN_OP_relu_fwd, case_relu_fwd, 0.1f, 1e-7),
    SIZES(KILN_OP_relu_bwd, case_relu_bwd, 0, 1e-6),
    SIZES(KILN_OP_relu_bwd, case_relu_bwd, 0.25f, 1e-6),
    SIZES(KILN_OP_sigmoid_fwd, case_sigmoid_fwd, 0, 2e-7),
    SIZES(KILN_OP_sigmoid_bwd, case_sigmoid_bwd, 0, 1e-6),
    SIZES(KILN_OP_tanh_fwd, case_tanh_fwd, 0, 2e-7),
    SIZES(KILN_OP_tanh_bwd, case_tanh_bwd, 0, 1e-6),
    SIZES(KILN_OP_mul, case_mul, 0, 1e-7),
    SIZES(KILN_OP_dropout_mask, case_dropout_mask, 0.3f, 0),
    SIZES(KILN_OP_dropout_mask, case_dropout_mask, 0, 0),
    /* ---- matmul (src/ops/matmul.c); gemm's n picks a shape, p the transposes ---- */
    {KILN_OP_gemm, case_gemm, 0, 0, 1e-6}, {KILN_OP_gemm, case_gemm, 1, 0, 1e-6},
    {KILN_OP_gemm, case_gemm, 2, 1, 1e-6}, {KILN_OP_gemm, case_gemm, 3, 2, 1e-6},
    {KILN_OP_gemm, case_gemm, 4, 3, 1e-6}, {KILN_OP_gemm, case_gemm, 4, 0, 1e-6},
    {KILN_OP_gemm, case_gemm, 3, 1, 1e-6},
    {KILN_OP_add_bias_rows, case_add_bias_rows, 1, 0, 1e-7},
    {KILN_OP_add_bias_rows, case_add_bias_rows, 37, 0, 1e-7},
    {KILN_OP_sum_rows_into, case_sum_rows_into, 1, 0, 1e-6},
    {KILN_OP_sum_rows_into, case_sum_rows_into, 300, 0, 1e-5},
    {KILN_OP_csr_matmul, case_csr_matmul, 1, 0, 1e-6},
    {KILN_OP_csr_matmul, case_csr_matmul, 37, 1, 1e-6},
    {KILN_OP_csr_matmul, case_csr_matmul, 7000, 0, 1e-6},
    {KILN_OP_csr_weight_grad, case_csr_weight_grad, 3, 0, 1e-6},
    {KILN_OP_csr_weight_grad, case_csr_weight_grad, 200, 1, 1e-5},
    {KILN_OP_csr_weight_grad, case_csr_weight_grad, 200, 0, 1e-5},
    /* ---- conv (src/ops/conv_route.c); n picks a shape, pooling's p its kind ---- */
    {KILN_OP_conv_route_update, case_conv_route_update, 0, 0, 1e-6},
    {KILN_OP_conv_route_free, case_conv_route_free, 1, 0, 1e-6},
    {KILN_OP_conv_fwd, case_conv_fwd, 2, 0, 1e-6}, {KILN_OP_conv_fwd, case_conv_fwd, 3, 0, 1e-6},
    {KILN_OP_conv_fwd, case_conv_fwd, 4, 0, 1e-6}, {KILN_OP_conv_bwd, case_conv_bwd, 5, 0, 1e-6},
    {KILN_OP_conv_bwd, case_conv_bwd, 1, 0, 1e-6},
    {KILN_OP_im2col_conv_fwd, case_im2col_conv_fwd, 0, 0, 1e-6},
    {KILN_OP_im2col_conv_fwd, case_im2col_conv_fwd, 2, 0, 1e-6},
    {KILN_OP_im2col_conv_bwd, case_im2col_conv_bwd, 1, 0, 1e-6},
    {KILN_OP_im2col_conv_bwd, case_im2col_conv_bwd, 3, 0, 1e-6},
    {KILN_OP_plane_bias_add, case_plane_bias_add, 1, 0, 1e-7},
    {KILN_OP_plane_bias_add, case_plane_bias_add, 3, 0, 1e-7},
    {KILN_OP_plane_bias_grad, case_plane_bias_grad, 1, 0, 1e-7},
    {KILN_OP_plane_bias_grad, case_plane_bias_grad, 7, 0, 1e-7},
    {KILN_OP_im2col, case_im2col, 1, 0, 0}, {KILN_OP_im2col, case_im2col, 2, 0, 0},
    {KILN_OP_col2im, case_col2im, 1, 0, 1e-7}, {KILN_OP_col2im, case_col2im, 2, 0, 1e-7},
    {KILN_OP_pool_fwd, case_pool_fwd, 0, 1, 1e-7}, {KILN_OP_pool_fwd, case_pool_fwd, 1, 1, 1e-7},
    {KILN_OP_pool_fwd, case_pool_fwd, 1, 0, 1e-6}, {KILN_OP_pool_fwd, case_pool_fwd, 2, 11, 1e-7},
    {KILN_OP_pool_fwd, case_pool_fwd, 2, 10, 1e-6}, {KILN_OP_pool_bwd, case_pool_bwd, 3, 11, 1e-7},
    {KILN_OP_pool_bwd, case_pool_bwd, 3, 10, 1e-6}, {KILN_OP_pool_bwd, case_pool_bwd, 2, 1, 1e-7},
    {KILN_OP_pool_bwd, case_pool_bwd, 1, 0, 1e-6},
    /* ---- neuron (src/ops/neuron.c) ---- */
    /* p: ELU's alpha, Threshold's t, Swish's beta, GELU's tanh form (1), BNLL's input range;
     * Exp, Log and Power: an index into their settings; PReLU: n a shape, p shared slopes */
    SIZES(KILN_OP_absval_fwd, case_absval_fwd, 0, 0),
    SIZES(KILN_OP_absval_bwd, case_absval_bwd, 0, 1e-8),
    SIZES(KILN_OP_elu_fwd, case_elu_fwd, 1, 1e-7),
    SIZES(KILN_OP_elu_fwd, case_elu_fwd, 0.3f, 1e-7),
    SIZES(KILN_OP_elu_bwd, case_elu_bwd, 1, 2e-7),
    SIZES(KILN_OP_elu_bwd, case_elu_bwd, 0.3f, 2e-7),
    SIZES(KILN_OP_bnll_fwd, case_bnll_fwd, 4, 2e-7),
    SIZES(KILN_OP_bnll_fwd, case_bnll_fwd, 60, 2e-7),
    SIZES(KILN_OP_bnll_bwd, case_bnll_bwd, 4, 2e-7),
    SIZES(KILN_OP_bnll_bwd, case_bnll_bwd, 60, 2e-7),
    SIZES(KILN_OP_threshold_fwd, case_threshold_fwd, 0, 0),
    SIZES(KILN_OP_threshold_fwd, case_threshold_fwd, 0.2f, 0),
    SIZES(KILN_OP_exp_fwd, case_exp_fwd, 0, 5e-7),
    SIZES(KILN_OP_exp_fwd, case_exp_fwd, 1, 5e-7),
    SIZES(KILN_OP_exp_fwd, case_exp_fwd, 2, 5e-7),
    SIZES(KILN_OP_exp_bwd, case_exp_bwd, 0, 5e-7),
    SIZES(KILN_OP_exp_bwd, case_exp_bwd, 1, 5e-7),
    SIZES(KILN_OP_exp_bwd, case_exp_bwd, 2, 5e-7),
    SIZES(KILN_OP_log_fwd, case_log_fwd, 0, 2e-7),
    SIZES(KILN_OP_log_fwd, case_log_fwd, 1, 2e-7),
    SIZES(KILN_OP_log_bwd, case_log_bwd, 0, 2e-7),
    SIZES(KILN_OP_log_bwd, case_log_bwd, 1, 2e-7),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 0, 1e-6),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 1, 1e-6),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 2, 1e-6),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 3, 1e-6),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 4, 0),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 5, 0),
    SIZES(KILN_OP_power_fwd, case_power_fwd, 6, 0),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 0, 1e-6),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 1, 1e-6),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 2, 1e-6),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 3, 1e-6),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 4, 1e-8),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 5, 0),
    SIZES(KILN_OP_power_bwd, case_power_bwd, 6, 0),
    SIZES(KILN_OP_swish_fwd, case_swish_fwd, 1, 5e-7),
    SIZES(KILN_OP_swish_fwd, case_swish_fwd, 1.7f, 5e-7),
    SIZES(KILN_OP_swish_bwd, case_swish_bwd, 1, 1e-6),
    SIZES(KILN_OP_swish_bwd, case_swish_bwd, 1.7f, 1e-6),
    SIZES(KILN_OP_gelu_fwd, case_gelu_fwd, 0, 5e-7),
    SIZES(KILN_OP_gelu_fwd, case_gelu_fwd, 1, 5e-7),
    SIZES(KILN_OP_gelu_bwd, case_gelu_bwd, 0, 1e-6),
    SIZES(KILN_OP_gelu_bwd, case_gelu_bwd, 1, 3e-6),
    {KILN_OP_prelu_fwd, case_prelu_fwd, 0, 0, 1e-7},
    {KILN_OP_prelu_fwd, case_prelu_fwd, 1, 0, 1e-7},
    {KILN_OP_prelu_fwd, case_prelu_fwd, 2, 1, 1e-7},
    {KILN_OP_prelu_fwd, case_prelu_fwd, 3, 0, 1e-7},
    {KILN_OP_prelu_fwd, case_prelu_fwd, 3, 1, 1e-7},
    {KILN_OP_prelu_bwd, case_prelu_bwd, 0, 0, 1e-7},
    {KILN_OP_prelu_bwd, case_prelu_bwd, 1, 0, 1e-7},
    {KILN_OP_prelu_bwd, case_prelu_bwd, 2, 1, 1e-7},
    {KILN_OP_prelu_bwd, case_prelu_bwd, 3, 0, 1e-7},
    {KILN_OP_prelu_bwd, case_prelu_bwd, 3, 1, 1e-7},
    {KILN_OP_prelu_slope_bwd, case_prelu_slope_bwd, 0, 0, 5e-7},
    {KILN_OP_prelu_slope_bwd, case_prelu_slope_bwd, 1, 1, 5e-7},
    {KILN_OP_prelu_slope_bwd, case_prelu_slope_bwd, 2, 0, 5e-7},
    {KILN_OP_prelu_slope_bwd, case_prelu_slope_bwd, 3, 0, 5e-7},
    {KILN_OP_prelu_slope_bwd, case_prelu_slope_bwd, 3, 1, 5e-7},
    /* ---- norm (src/ops/batch_norm.c, src/ops/norm.c); n picks a shape of the case's table,
     * p the setting's bits ---- */
    BN_ROWS(KILN_OP_batch_norm_fwd, case_batch_norm_fwd, 0, 2e-6),
    BN_ROWS(KILN_OP_batch_norm_fwd, case_batch_norm_fwd, BN_GLOBAL, 2e-6),
    BN_ROWS(KILN_OP_batch_norm_fwd, case_batch_norm_fwd, BN_FUSED, 2e-6),
    BN_ROWS(KILN_OP_batch_norm_fwd, case_batch_norm_fwd, BN_FUSED | BN_RELU, 2e-6),
    BN_ROWS(KILN_OP_batch_norm_fwd, case_batch_norm_fwd, BN_GLOBAL | BN_FUSED | BN_RELU, 2e-6),
    BN_ROWS(KILN_OP_batch_norm_fwd, case_batch_norm_fwd, BN_IN_PLACE | BN_FUSED | BN_RELU, 2e-6),
    BN_ROWS(KILN_OP_batch_norm_apply, case_batch_norm_apply, 0, 1e-6),
    BN_ROWS(KILN_OP_batch_norm_apply, case_batch_norm_apply, BN_FUSED, 1e-6),
    BN_ROWS(KILN_OP_batch_norm_apply, case_batch_norm_apply, BN_FUSED | BN_RELU, 1e-6),
    BN_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, 0, 1e-5),
    BN_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, BN_FUSED | BN_RELU, 1e-5),
    BN_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, BN_GLOBAL | BN_FUSED, 1e-5),
    BN_SMALL_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, BN_GLOBAL, 1e-5),
    BN_SMALL_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, BN_FUSED, 1e-5),
    BN_SMALL_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd,
                   BN_GLOBAL | BN_FUSED | BN_RELU, 1e-5),
    BN_SMALL_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, BN_FUSED | BN_RELU | BN_NO_DX, 1e-5),
    BN_SMALL_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd, BN_IN_PLACE, 1e-5),
    BN_SMALL_ROWS(KILN_OP_batch_norm_bwd, case_batch_norm_bwd,
                   BN_IN_PLACE | BN_FUSED | BN_RELU, 1e-5),
    AFFINE_ROWS(KILN_OP_scale_fwd, case_scale_fwd, 0, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_fwd, case_scale_fwd, AFF_BETA, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_fwd, case_scale_fwd, AFF_BETA | AFF_KEEP, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_fwd, case_scale_fwd, AFF_KEEP | AFF_IN_PLACE, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, 0, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_BETA, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_BETA | AFF_SET, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_BETA | AFF_IN_PLACE, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_BETA | AFF_NO_DX, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_BETA | AFF_NO_DG, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_NO_DG | AFF_IN_PLACE, 1e-6),
    AFFINE_ROWS(KILN_OP_scale_bwd, case_scale_bwd, AFF_SET | AFF_NO_DX, 1e-6),
    PLAIN_AFFINE_ROWS(KILN_OP_bias_fwd, case_bias_fwd, 0, 1e-6),
    PLAIN_AFFINE_ROWS(KILN_OP_bias_fwd, case_bias_fwd, AFF_IN_PLACE, 1e-6),
    PLAIN_AFFINE_ROWS(KILN_OP_bias_bwd, case_bias_bwd, 0, 1e-6),
    PLAIN_AFFINE_ROWS(KILN_OP_bias_bwd, case_bias_bwd, AFF_SET, 1e-6),
    LN_ROWS(KILN_OP_layer_norm_fwd, case_layer_norm_fwd, 0, 2e-6),
    LN_ROWS(KILN_OP_layer_norm_fwd, case_layer_norm_fwd, LN_GAIN, 2e-6),
    LN_ROWS(KILN_OP_layer_norm_fwd, case_layer_norm_fwd, LN_GAIN | LN_BIAS, 2e-6),
    LN_ROWS(KILN_OP_layer_norm_fwd, case_layer_norm_fwd, LN_GAIN | LN_BIAS | LN_IN_PLACE, 2e-6),
    LN_ROWS(KILN_OP_layer_norm_bwd, case_layer_norm_bwd, 0, 1e-5),
    LN_ROWS(KILN_OP_layer_norm_bwd, case_layer_norm_bwd, LN_GAIN, 1e-5),
    LN_ROWS(KILN_OP_layer_norm_bwd, case_layer_norm_bwd, LN_GAIN | LN_BIAS, 1e-5),
    LN_ROWS(KILN_OP_layer_norm_bwd, case_layer_norm_bwd, LN_GAIN | LN_BIAS | LN_IN_PLACE, 1e-5),
    LN_ROWS(KILN_OP_layer_norm_bwd, case_layer_norm_bwd, LN_GAIN | LN_BIAS | LN_NO_DX, 1e-5),
    FOUR_ROWS(KILN_OP_lrn_fwd, case_lrn_fwd, 5 * 2 + 1, 2e-6),
    FOUR_ROWS(KILN_OP_lrn_fwd, case_lrn_fwd, 3 * 2, 2e-6),
    FOUR_ROWS(KILN_OP_lrn_fwd, case_lrn_fwd, 1 * 2 + 1, 2e-6),
    FOUR_ROWS(KILN_OP_lrn_bwd, case_lrn_bwd, 5 * 2 + 1, 1e-5),
    FOUR_ROWS(KILN_OP_lrn_bwd, case_lrn_bwd, 3 * 2, 1e-5),
    FOUR_ROWS(KILN_OP_lrn_bwd, case_lrn_bwd, 1 * 2 + 1, 1e-5),
    FOUR_ROWS(KILN_OP_mvn_fwd, case_mvn_fwd, 0, 2e-6),
    FOUR_ROWS(KILN_OP_mvn_fwd, case_mvn_fwd, 1, 2e-6),
    FOUR_ROWS(KILN_OP_mvn_fwd, case_mvn_fwd, 3, 2e-6),
    FOUR_ROWS(KILN_OP_mvn_bwd, case_mvn_bwd, 0, 1e-5),
    FOUR_ROWS(KILN_OP_mvn_bwd, case_mvn_bwd, 1, 1e-5),
    FOUR_ROWS(KILN_OP_mvn_bwd, case_mvn_bwd, 3, 1e-5),
    FOUR_ROWS(KILN_OP_reduction_fwd, case_reduction_fwd, KILN_REDUCE_SUM, 1e-6),
    FOUR_ROWS(KILN_OP_reduction_fwd, case_reduction_fwd, KILN_REDUCE_ASUM, 1e-6),
    FOUR_ROWS(KILN_OP_reduction_fwd, case_reduction_fwd, KILN_REDUCE_SUMSQ, 1e-6),
    FOUR_ROWS(KILN_OP_reduction_bwd, case_reduction_bwd, KILN_REDUCE_SUM, 1e-6),
    FOUR_ROWS(KILN_OP_reduction_bwd, case_reduction_bwd, KILN_REDUCE_ASUM, 1e-6),
    FOUR_ROWS(KILN_OP_reduction_bwd, case_reduction_bwd, KILN_REDUCE_SUMSQ, 1e-6),
    /* ---- l2norm (src/ops/l2norm.c); n picks a shape, p the L2_* bits ---- */
    L2_ROWS(KILN_OP_l2norm_fwd, case_l2norm_fwd, 0, 2e-6),
    L2_ROWS(KILN_OP_l2norm_fwd, case_l2norm_fwd, L2_ACROSS, 2e-6),
    L2_ROWS(KILN_OP_l2norm_fwd, case_l2norm_fwd, L2_SHARED, 2e-6),
    L2_ROWS(KILN_OP_l2norm_fwd, case_l2norm_fwd, L2_ACROSS | L2_SHARED, 2e-6),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, 0, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_ACROSS, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_SHARED, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_ACROSS | L2_SHARED, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_NO_DX, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_ACROSS | L2_SHARED | L2_NO_DX, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_SHARED | L2_NO_DSCALE, 1e-5),
    L2_ROWS(KILN_OP_l2norm_bwd, case_l2norm_bwd, L2_ACROSS | L2_NO_DSCALE, 1e-5),
    /* ---- loss (src/ops/loss.c) ---- */
    /* (n: a shape of loss_shapes, or a count for sigmoid_ce and euclidean; p: the setting's
     * bits, LOSS_* in the loss cases) */
    LOSS_SHAPES(KILN_OP_softmax_fwd, case_softmax_fwd, 0, 1e-6),
    LOSS_SHAPES(KILN_OP_softmax_fwd, case_softmax_fwd, 1, 1e-6),
    {KILN_OP_softmax_fwd, case_softmax_fwd, 2, 2, 1e-6},
    {KILN_OP_softmax_fwd, case_softmax_fwd, 5, 3, 1e-6},
    LOSS_SHAPES(KILN_OP_softmax_bwd, case_softmax_bwd, 0, 1e-5),
    {KILN_OP_softmax_bwd, case_softmax_bwd, 2, 1, 1e-5},
    {KILN_OP_softmax_bwd, case_softmax_bwd, 5, 1, 1e-5},
    LOSS_SHAPES(KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd, KILN_LOSS_FULL, 1e-6),
    LOSS_SHAPES(KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd, KILN_LOSS_VALID, 1e-6),
    LOSS_SHAPES(KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd,
                KILN_LOSS_VALID | LOSS_IGNORE_NEG, 1e-6),
    LOSS_SHAPES(KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd,
                KILN_LOSS_BATCH | LOSS_IGNORE_0, 1e-6),
    LOSS_SHAPES(KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd, KILN_LOSS_NONE, 1e-6),
    {KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd, 1, KILN_LOSS_VALID | LOSS_BAD_LABEL, 0},
    {KILN_OP_softmax_loss_fwd, case_softmax_loss_fwd, 0, LOSS_IGNORE_0 | LOSS_BAD_LABEL, 0},
    LOSS_SHAPES(KILN_OP_softmax_loss_bwd, case_softmax_loss_bwd, KILN_LOSS_FULL, 1e-5),
    LOSS_SHAPES(KILN_OP_softmax_loss_bwd, case_softmax_loss_bwd, KILN_LOSS_VALID, 1e-5),
    LOSS_SHAPES(KILN_OP_softmax_loss_bwd, case_softmax_loss_bwd,
                KILN_LOSS_VALID | LOSS_IGNORE_NEG, 1e-5),
    LOSS_SHAPES(KILN_OP_softmax_loss_bwd, case_softmax_loss_bwd,
                KILN_LOSS_BATCH | LOSS_IGNORE_0, 1e-5),
    LOSS_SHAPES(KILN_OP_softmax_loss_bwd, case_softmax_loss_bwd, KILN_LOSS_NONE, 1e-5),
    LOSS_SHAPES(KILN_OP_accuracy_fwd, case_accuracy_fwd, LOSS_COUNT, 1e-7),
    LOSS_SHAPES(KILN_OP_accuracy_fwd, case_accuracy_fwd, 1 | LOSS_COUNT, 1e-7),
    LOSS_SHAPES(KILN_OP_accuracy_fwd, case_accuracy_fwd, 1 | LOSS_IGNORE_NEG | 2 * LOSS_COUNT,
                1e-7),
    LOSS_SHAPES(KILN_OP_accuracy_fwd, case_accuracy_fwd, 1 | LOSS_IGNORE_0 | 3 * LOSS_COUNT, 1e-7),
    {KILN_OP_accuracy_fwd, case_accuracy_fwd, 2, LOSS_BAD_LABEL | LOSS_COUNT, 0},
    LOSS_SHAPES(KILN_OP_f1_fwd, case_f1_fwd, 0, 0),
    LOSS_SHAPES(KILN_OP_f1_fwd, case_f1_fwd, LOSS_IGNORE_NEG | LOSS_COUNT, 0),
    LOSS_SHAPES(KILN_OP_f1_fwd, case_f1_fwd, LOSS_IGNORE_0 | 2 * LOSS_COUNT, 0),
    {KILN_OP_f1_fwd, case_f1_fwd, 2, LOSS_BAD_LABEL, 0},
    LOSS_SHAPES(KILN_OP_multinomial_loss_fwd, case_multinomial_loss_fwd, 0, 1e-6),
    LOSS_SHAPES(KILN_OP_multinomial_loss_fwd, case_multinomial_loss_fwd, 1, 1e-6),
    {KILN_OP_multinomial_loss_fwd, case_multinomial_loss_fwd, 1, LOSS_BAD_LABEL, 0},
    LOSS_SHAPES(KILN_OP_multinomial_loss_bwd, case_multinomial_loss_bwd, 0, 1e-5),
    LOSS_SHAPES(KILN_OP_infogain_loss_fwd, case_infogain_loss_fwd, KILN_LOSS_FULL, 1e-6),
    LOSS_SHAPES(KILN_OP_infogain_loss_fwd, case_infogain_loss_fwd,
                KILN_LOSS_VALID | LOSS_IGNORE_NEG, 1e-6),
    LOSS_SHAPES(KILN_OP_infogain_loss_fwd, case_infogain_loss_fwd,
                KILN_LOSS_BATCH | LOSS_IGNORE_0, 1e-6),
    LOSS_SHAPES(KILN_OP_infogain_loss_fwd, case_infogain_loss_fwd, KILN_LOSS_NONE, 1e-6),
    {KILN_OP_infogain_loss_fwd, case_infogain_loss_fwd, 2, LOSS_BAD_LABEL, 0},
    LOSS_SHAPES(KILN_OP_infogain_loss_bwd, case_infogain_loss_bwd, KILN_LOSS_FULL, 1e-5),
    LOSS_SHAPES(KILN_OP_infogain_loss_bwd, case_infogain_loss_bwd,
                KILN_LOSS_VALID | LOSS_IGNORE_NEG, 1e-5),
    LOSS_SHAPES(KILN_OP_infogain_loss_bwd, case_infogain_loss_bwd,
                KILN_LOSS_BATCH | LOSS_IGNORE_0, 1e-5),
    LOSS_SHAPES(KILN_OP_infogain_loss_bwd, case_infogain_loss_bwd, KILN_LOSS_NONE, 1e-5),
    {KILN_OP_infogain_loss_bwd, case_infogain_loss_bwd, 1, LOSS_BAD_LABEL, 0},
    LOSS_SHAPES(KILN_OP_hinge_loss_fwd, case_hinge_loss_fwd, 0, 1e-6),
    LOSS_SHAPES(KILN_OP_hinge_loss_fwd, case_hinge_loss_fwd, 1, 1e-6),
    {KILN_OP_hinge_loss_fwd, case_hinge_loss_fwd, 2, LOSS_BAD_LABEL, 0},
    LOSS_SHAPES(KILN_OP_hinge_loss_bwd, case_hinge_loss_bwd, 0, 1e-5),
    LOSS_SHAPES(KILN_OP_hinge_loss_bwd, case_hinge_loss_bwd, 1, 1e-5),
    {KILN_OP_hinge_loss_bwd, case_hinge_loss_bwd, 1, LOSS_BAD_LABEL, 0},
    SIZES(KILN_OP_sigmoid_ce_fwd, case_sigmoid_ce_fwd, KILN_LOSS_FULL, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_fwd, case_sigmoid_ce_fwd, KILN_LOSS_VALID | LOSS_IGNORE_NEG, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_fwd, case_sigmoid_ce_fwd, KILN_LOSS_BATCH, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_fwd, case_sigmoid_ce_fwd, KILN_LOSS_NONE | LOSS_IGNORE_0, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_bwd, case_sigmoid_ce_bwd, KILN_LOSS_FULL, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_bwd, case_sigmoid_ce_bwd, KILN_LOSS_VALID | LOSS_IGNORE_NEG, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_bwd, case_sigmoid_ce_bwd, KILN_LOSS_BATCH, 1e-6),
    SIZES(KILN_OP_sigmoid_ce_bwd, case_sigmoid_ce_bwd, KILN_LOSS_NONE | LOSS_IGNORE_0, 1e-6),
    SIZES(KILN_OP_euclidean_loss_fwd, case_euclidean_loss_fwd, 0, 1e-7),
    SIZES(KILN_OP_euclidean_loss_bwd, case_euclidean_loss_bwd, 3, 1e-6),
    SIZES(KILN_OP_euclidean_loss_bwd, case_euclidean_loss_bwd, 1, 1e-6),
    SIZES(KILN_OP_euclidean_loss_bwd, case_euclidean_loss_bwd, 2, 1e-6),
    LOSS_SHAPES(KILN_OP_contrastive_loss_fwd, case_contrastive_loss_fwd, 0, 1e-6),
    LOSS_SHAPES(KILN_OP_contrastive_loss_fwd, case_contrastive_loss_fwd, 1, 1e-6),
    LOSS_SHAPES(KILN_OP_contrastive_loss_bwd, case_contrastive_loss_bwd, 2 | 4, 1e-4),
    LOSS_SHAPES(KILN_OP_contrastive_loss_bwd, case_contrastive_loss_bwd, 1 | 2, 1e-5),
    LOSS_SHAPES(KILN_OP_contrastive_loss_bwd, case_contrastive_loss_bwd, 1 | 4, 1e-5),
    LOSS_SHAPES(KILN_OP_contrastive_loss_bwd, case_contrastive_loss_bwd, 2, 1e-4),
    /* ---- arrange (src/ops/arrange.c) ---- */
    SIZES(KILN_OP_fill, case_fill, 0, 0), SIZES(KILN_OP_fill, case_fill, -2.5f, 0),
    SIZES(KILN_OP_scale, case_scale, -0.75f, 1e-7), SIZES(KILN_OP_add, case_add, 0, 1e-7),
    SIZES(KILN_OP_acc, case_acc, 0, 1e-7),
    /* (two roundings: the product, then the sum) */
    SIZES(KILN_OP_eltwise_sum2, case_eltwise_sum2, 1, 3e-7),
    SIZES(KILN_OP_eltwise_sum2, case_eltwise_sum2, 0, 3e-7),
    SIZES(KILN_OP_eltwise_sum2, case_eltwise_sum2, 0.1f, 3e-7),
    SIZES(KILN_OP_eltwise_sum_acc, case_eltwise_sum_acc, 1, 3e-7),
    SIZES(KILN_OP_eltwise_sum_acc, case_eltwise_sum_acc, 0.2f, 3e-7),
    SIZES(KILN_OP_eltwise_prod, case_eltwise_prod, 0, 2e-7),
    SIZES(KILN_OP_eltwise_max, case_eltwise_max, 0, 0),
    SIZES(KILN_OP_eltwise_prod_bwd, case_eltwise_prod_bwd, 1, 1e-6),
    SIZES(KILN_OP_eltwise_prod_bwd, case_eltwise_prod_bwd, 0, 1e-6),
    SIZES(KILN_OP_eltwise_max_bwd, case_eltwise_max_bwd, 0, 1e-6),
    SIZES(KILN_OP_relu_scale_bwd, case_relu_scale_bwd, 0, 1e-6),
    SIZES(KILN_OP_relu_scale_bwd, case_relu_scale_bwd, 0.3f, 1e-6),
    SIZES(KILN_OP_relu_scale2_bwd, case_relu_scale2_bwd, 0, 1e-6),
    SIZES(KILN_OP_relu_scale2_bwd, case_relu_scale2_bwd, 0.3f, 1e-6),
    {KILN_OP_copy_blocks, case_copy_blocks, 1, 0, 0}, {KILN_OP_copy_blocks, case_copy_blocks, 40, 0, 0},
    {KILN_OP_tile_fwd, case_tile_fwd, 1, 0, 0}, {KILN_OP_tile_fwd, case_tile_fwd, 9, 0, 0},
    {KILN_OP_tile_bwd, case_tile_bwd, 1, 0, 1e-7}, {KILN_OP_tile_bwd, case_tile_bwd, 9, 0, 1e-7},
    {KILN_OP_crop_copy, case_crop_copy, 1, 1, 0}, {KILN_OP_crop_copy, case_crop_copy, 3, 1, 0},
    {KILN_OP_crop_copy, case_crop_copy, 3, 0, 0},
    {KILN_OP_permute, case_permute, 0, 0, 0}, {KILN_OP_permute, case_permute, 1, 0, 0},
    {KILN_OP_permute, case_permute, 2, 0, 0}, {KILN_OP_permute, case_permute, 3, 0, 0},
    {KILN_OP_permute, case_permute, 4, 0, 0}, {KILN_OP_permute, case_permute, 5, 0, 0},
    {KILN_OP_permute, case_permute, 6, 0, 0}, {KILN_OP_permute, case_permute, 7, 0, 0},
    {KILN_OP_permute, case_permute, 8, 0, 0},
    {KILN_OP_select_nonzero, case_select_nonzero, 1, 0, 0},
    {KILN_OP_select_nonzero, case_select_nonzero, 77, 0, 0},
    {KILN_OP_gather_rows, case_gather_rows, 33, 0, 0},
    {KILN_OP_scatter_rows, case_scatter_rows, 33, 0, 0},
    {KILN_OP_gather_rows_at, case_gather_rows_at, 1, 0, 0},
    {KILN_OP_gather_rows_at, case_gather_rows_at, 33, 0, 0},
    {KILN_OP_scatter_add_rows_at, case_scatter_add_rows_at, 1, 0, 0},
    {KILN_OP_scatter_add_rows_at, case_scatter_add_rows_at, 33, 0, 1e-6},
    {KILN_OP_embed_fwd, case_embed_fwd, 1, 0, 0}, {KILN_OP_embed_fwd, case_embed_fwd, 30, 1, 1e-7},
    {KILN_OP_embed_bwd, case_embed_bwd, 1, 0, 1e-7}, {KILN_OP_embed_bwd, case_embed_bwd, 2000, 0, 2e-5},
    {KILN_OP_argmax_fwd, case_argmax_fwd, 1, 1, 0}, {KILN_OP_argmax_fwd, case_argmax_fwd, 7, 3, 0},
    {KILN_OP_argmax_fwd, case_argmax_fwd, 7, 13, 0}, {KILN_OP_argmax_fwd, case_argmax_fwd, 5, 103, 0},
    {KILN_OP_argmax_fwd, case_argmax_fwd, 5, 113, 0},
    /* ---- sequence (src/ops/sequence.c, src/ops/attention.c); the plans' n picks a shape, p
     * B transposed (1) and beta (2); the cells' n picks N x H, the last past the parallel size */
    {KILN_OP_packed_gemm_update, case_packed_gemm_update, 0, 0, 1e-6},
    {KILN_OP_packed_gemm_update, case_packed_gemm_update, 3, 2, 1e-6},
    {KILN_OP_packed_gemm_set_b, case_packed_gemm_set_b, 1, 1, 1e-6},
    {KILN_OP_packed_gemm_set_b, case_packed_gemm_set_b, 3, 3, 1e-6},
    {KILN_OP_packed_gemm_run, case_packed_gemm_run, 2, 2, 1e-6},
    {KILN_OP_packed_gemm_run, case_packed_gemm_run, 3, 0, 1e-6},
    {KILN_OP_packed_gemm_free, case_packed_gemm_free, 1, 0, 1e-6},
    {KILN_OP_carry_rows, case_carry_rows, 0, 0, 1e-7},
    {KILN_OP_carry_rows, case_carry_rows, 2, 0, 1e-7},
    {KILN_OP_carry_rows, case_carry_rows, 2, 1, 0},
    {KILN_OP_carry_rows, case_carry_rows, 3, 0, 1e-7},
    {KILN_OP_lstm_cell_fwd, case_lstm_cell_fwd, 0, 0, 1e-6},
    {KILN_OP_lstm_cell_fwd, case_lstm_cell_fwd, 1, 1, 1e-6},
    {KILN_OP_lstm_cell_fwd, case_lstm_cell_fwd, 2, 0, 1e-6},
    {KILN_OP_lstm_cell_fwd, case_lstm_cell_fwd, 3, 0, 1e-6},
    {KILN_OP_lstm_cell_bwd, case_lstm_cell_bwd, 0, 0, 1e-5},
    {KILN_OP_lstm_cell_bwd, case_lstm_cell_bwd, 1, 2, 1e-5},
    {KILN_OP_lstm_cell_bwd, case_lstm_cell_bwd, 2, 1, 1e-5},
    {KILN_OP_lstm_cell_bwd, case_lstm_cell_bwd, 2, 4, 1e-5},
    {KILN_OP_lstm_cell_bwd, case_lstm_cell_bwd, 3, 2, 1e-5},
    {KILN_OP_lstm_cell_bwd, case_lstm_cell_bwd, 3, 1, 1e-5},
    {KILN_OP_gru_cell_fwd, case_gru_cell_fwd, 0, 0, 1e-6},
    {KILN_OP_gru_cell_fwd, case_gru_cell_fwd, 2, 0, 1e-6},
    {KILN_OP_gru_cell_fwd, case_gru_cell_fwd, 3, 0, 1e-6},
    {KILN_OP_gru_cell_bwd, case_gru_cell_bwd, 0, 0, 1e-5},
    {KILN_OP_gru_cell_bwd, case_gru_cell_bwd, 2, 0, 1e-5},
    {KILN_OP_gru_cell_bwd, case_gru_cell_bwd, 3, 0, 1e-5},
    SIZES(KILN_OP_rnn_step_fwd, case_rnn_step_fwd, 0, 1e-6),
    SIZES(KILN_OP_rnn_step_bwd, case_rnn_step_bwd, 0, 1e-5),
    {KILN_OP_rnn_out_fwd, case_rnn_out_fwd, 0, 0, 1e-6},
    {KILN_OP_rnn_out_fwd, case_rnn_out_fwd, 2, 0, 1e-6},
    {KILN_OP_rnn_out_fwd, case_rnn_out_fwd, 3, 0, 1e-6},
    {KILN_OP_rnn_out_bwd, case_rnn_out_bwd, 0, 0, 1e-5},
    {KILN_OP_rnn_out_bwd, case_rnn_out_bwd, 2, 0, 1e-5},
    {KILN_OP_rnn_out_bwd, case_rnn_out_bwd, 3, 0, 1e-5},
    {KILN_OP_sinusoid_table, case_sinusoid_table, 1, 0, 1e-7},
    {KILN_OP_sinusoid_table, case_sinusoid_table, 7, 0, 1e-7},
    {KILN_OP_sinusoid_table, case_sinusoid_table, 300, 0, 1e-7},
    {KILN_OP_step_add, case_step_add, 0, 0, 1e-7}, {KILN_OP_step_add, case_step_add, 1, 0, 1e-7},
    {KILN_OP_step_add, case_step_add, 2, 0, 1e-7},
    {KILN_OP_step_sum_into, case_step_sum_into, 0, 0, 1e-6},
    {KILN_OP_step_sum_into, case_step_sum_into, 1, 0, 1e-6},
    {KILN_OP_step_sum_into, case_step_sum_into, 2, 0, 1e-6},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 0, 0, 0},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 1, 1, 1e-7},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 2, 2, 0},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 1, 3, 0},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 2, 4, 1e-7},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 2, 5, 0},
    {KILN_OP_seq_pool_fwd, case_seq_pool_fwd, 1, 6, 0},
    {KILN_OP_seq_pool_bwd, case_seq_pool_bwd, 0, 2, 1e-6},
    {KILN_OP_seq_pool_bwd, case_seq_pool_bwd, 1, 0, 1e-6},
    {KILN_OP_seq_pool_bwd, case_seq_pool_bwd, 2, 1, 1e-6},
    {KILN_OP_seq_pool_bwd, case_seq_pool_bwd, 2, 5, 1e-6},
    {KILN_OP_seq_pool_bwd, case_seq_pool_bwd, 1, 3, 1e-6},
    {KILN_OP_seq_pool_bwd, case_seq_pool_bwd, 2, 4, 1e-6},
    {KILN_OP_gemm_rows, case_gemm_rows, 0, 0, 1e-6},
    {KILN_OP_gemm_rows, case_gemm_rows, 1, 3, 1e-6},
    {KILN_OP_gemm_rows, case_gemm_rows, 2, 1, 1e-6},
    {KILN_OP_gemm_rows, case_gemm_rows, 2, 2, 1e-6},
    {KILN_OP_gemm_rows, case_gemm_rows, 3, 0, 1e-6},
    {KILN_OP_gemm_rows, case_gemm_rows, 3, 1, 1e-6},
    {KILN_OP_sum_rows_double_into, case_sum_rows_double_into, 1, 0, 2e-7},
    {KILN_OP_sum_rows_double_into, case_sum_rows_double_into, 33, 0, 2e-7},
    {KILN_OP_sum_rows_double_into, case_sum_rows_double_into, 2000, 0, 2e-7},
    {KILN_OP_mask_check, case_mask_check, 1, 0, 0}, {KILN_OP_mask_check, case_mask_check, 9, 0, 0},
    {KILN_OP_mask_check, case_mask_check, 9, 1, 0},
    {KILN_OP_attention_fwd, case_attention_fwd, 0, 0, 1e-6},
    {KILN_OP_attention_fwd, case_attention_fwd, 1, 1, 1e-6},
    {KILN_OP_attention_fwd, case_attention_fwd, 2, 3, 1e-6},
    {KILN_OP_attention_fwd, case_attention_fwd, 3, 0, 1e-6},
    {KILN_OP_attention_bwd, case_attention_bwd, 0, 0, 1e-5},
    {KILN_OP_attention_bwd, case_attention_bwd, 1, 1, 1e-5},
    {KILN_OP_attention_bwd, case_attention_bwd, 2, 3, 1e-5},
    {KILN_OP_attention_bwd, case_attention_bwd, 3, 2, 1e-5},
    /* ---- solver (src/ops/solver.c) ---- */
    /* p: regularize's and sgd_update's setting, the rules' momentum or decay, find_nonfinite's
     * planted value, ordered_sum's buffer count (in the cases above) */
    SIZES(KILN_OP_sumsq_acc, case_sumsq_acc, 0, 1e-12),
    SIZES(KILN_OP_regularize, case_regularize, 0, 1e-7),
    SIZES(KILN_OP_regularize, case_regularize, 1, 1e-7),
    SIZES(KILN_OP_regularize, case_regularize, 2, 0),
    SIZES(KILN_OP_sgd_update, case_sgd_update, 0, 1e-6),
    SIZES(KILN_OP_sgd_update, case_sgd_update, 1, 1e-6),
    SIZES(KILN_OP_sgd_update, case_sgd_update, 2, 1e-6),
    SIZES(KILN_OP_nesterov_update, case_nesterov_update, 0.9f, 1e-6),
    SIZES(KILN_OP_nesterov_update, case_nesterov_update, 0, 1e-6),
    SIZES(KILN_OP_adagrad_update, case_adagrad_update, 0, 1e-6),
    SIZES(KILN_OP_rmsprop_update, case_rmsprop_update, 0.98f, 1e-6),
    SIZES(KILN_OP_rmsprop_update, case_rmsprop_update, 0.9f, 1e-6),
    SIZES(KILN_OP_adadelta_update, case_adadelta_update, 0.95f, 5e-6),
    SIZES(KILN_OP_adam_update, case_adam_update, 0, 1e-6),
    SIZES(KILN_OP_find_nonfinite, case_find_nonfinite, 0, 0),
    SIZES(KILN_OP_find_nonfinite, case_find_nonfinite, 1, 0),
    SIZES(KILN_OP_find_nonfinite, case_find_nonfinite, 2, 0),
    SIZES(KILN_OP_ordered_sum, case_ordered_sum, 1, 0),
    SIZES(KILN_OP_ordered_sum, case_ordered_sum, 2, 1e-6),
    SIZES(KILN_OP_ordered_sum, case_ordered_sum, 4, 1e-6),
};
enum { NROWS = sizeof rows / sizeof rows[0] };

/* Runs every row on backend b; returns the failures, and prints each. */
/* Every row on b: the failures; an op b lacks is one, unless `missing` is given, which then
 * counts the rows skipped for that reason. */
/* The ops the cpu-bf16 backend runs in bf16 (its products), whose rows it is held to within
 * BF16_TOL instead of their fp32 tolerance. */
static const int bf16_ops[] = {KILN_OP_gemm,     KILN_OP_gemm_rows,         KILN_OP_packed_gemm_update,
                               KILN_OP_conv_fwd, KILN_OP_conv_bwd,          KILN_OP_packed_gemm_run,
                               KILN_OP_conv_route_update, KILN_OP_packed_gemm_set_b,
                               KILN_OP_attention_fwd, KILN_OP_attention_bwd};
/* bf16 keeps 8 significant bits (2^-9 relative rounding an operand); sums of products of such
 * operands stay within about 2^-8 of the largest term's size. */
#define BF16_TOL 1e-2
static double tol_bf16;

static double row_tol(const kiln_backend *b, const op_row *row) {
  if (!tol_bf16 || strcmp(b->name, "cpu-bf16")) return row->tol;
  for (size_t k = 0; k < sizeof bf16_ops / sizeof bf16_ops[0]; k++)
    if (row->op == bf16_ops[k]) return row->tol > tol_bf16 ? row->tol : tol_bf16;
  return row->tol;
}

static int run_rows(const kiln_backend *b, int nthreads, int *failed_op, int *missing) {
  kiln_op_ctx c = {.nthreads = nthreads, .config = kiln_test_config(), .device = b->device};
  int failures = 0;
  for (int i = 0; i < NROWS; i++) {
    const op_row *row = &rows[i];
    if (!kiln_backend_has(b, row->op)) {
      if (missing) {
        (*missing)++;
        continue;
      }
      print_message("%s: no kernel %s\n", b->name, kiln_op_name(row->op));
      failures++;
      continue;
    }
    kiln_rng r;
    kiln_rng_seed(&r, 1234 + (uint64_t)i, 7);
    double e = row->run(b, &c, row->n, row->p, &r);
    const double tol = row_tol(b, row);
    if (!(e <= tol)) {
      print_message("%s %s (n %lld, setting %g, %d threads): error %g above %g\n", b->name,
                    kiln_op_name(row->op), (long long)row->n, (double)row->p, nthreads, e, tol);
      if (failed_op) *failed_op = row->op;
      failures++;
    }
  }
  return failures;
}

static int run_table(const kiln_backend *b, int nthreads, int *failed_op) {
  return run_rows(b, nthreads, failed_op, NULL);
}

/* A CUDA backend's table (emulated or on a GPU): every op, against the rows. */
static void check_cuda_table(const kiln_backend *b) {
  assert_int_equal(run_rows(b, 1, NULL, NULL), 0);
  print_message("%s: all %d ops pass their rows\n", b->name, KILN_OP_COUNT);
}

/* The CUDA kernels (src/cuda) built as C on hostsim: their indexing and arithmetic against the
 * rows on every machine; a host read of device memory faults on hostsim's walls. */
static void test_cudaemu(void **state) {
  (void)state;
  const kiln_backend *b = kiln_backend_cudaemu();
  assert_string_equal(b->name, "cudaemu");
  assert_ptr_equal(b->device, kiln_device_hostsim());
  kiln_config cfg = *kiln_test_config();
  cfg.device = KILN_DEVICE_HOSTSIM;
  cfg.engine = KILN_ENGINE_CUDA;
  assert_ptr_equal(kiln_backend_for(kiln_config_device(&cfg), cfg.engine), b);
  const int before = kiln_hostsim_mappings();
  check_cuda_table(b);
  assert_false(kiln_hostsim_open());
  assert_int_equal(kiln_hostsim_mappings(), before);
}

/* Every layer type whose arithmetic is kernels finds all of its kernels in the CUDA backend's
 * table, so that any net of them builds on a GPU; the types that are host code (no kernel list)
 * are refused there by name, and are the ones named here: none of the zoo's trainable nets uses
 * one (tests/cli/cudaemu.sh builds them). */
static void test_cuda_covers_every_layer_type(void **state) {
  (void)state;
  const kiln_backend *b = kiln_backend_cudaemu();
  char host_code[2048] = "";
  int types = 0;
  for (const char *const *t = kiln_layer_type_names(); *t; t++) {
    const kiln_layer_ops *ops = kiln_layer_find(*t);
    assert_non_null(ops);
    types++;
    if (!ops->kernels) {
      if (strlen(host_code) + strlen(*t) + 2 < sizeof host_code) {
        strcat(host_code, " ");
        strcat(host_code, *t);
      }
      continue;
    }
    for (const int *k = ops->kernels; *k != KILN_KERNELS_END; k++)
      if (!kiln_backend_has(b, *k)) fail_msg("layer type %s: no CUDA kernel %s", *t, kiln_op_name(*k));
  }
  print_message("%d layer types; host code only:%s\n", types, host_code[0] ? host_code : " none");
}

/* The same table on GPU 0, where the machine has one. */
static void test_cuda(void **state) {
  (void)state;
  const kiln_backend *b = kiln_backend_cuda(0);
  if (!b) {
    print_message("skipped: no CUDA device (%s)\n", kiln_cuda_unavailable());
    skip();
  }
  assert_string_equal(b->name, "cuda");
  assert_ptr_equal(b->device, kiln_device_cuda(0));
  check_cuda_table(b);
}

static void test_every_op_has_a_row(void **state) {
  (void)state;
  for (int op = 0; op < KILN_OP_COUNT; op++) {
    bool found = false;
    for (int i = 0; i < NROWS && !found; i++) found = rows[i].op == op;
    if (!found) fail_msg("op %s has no row in tests/test_backend_ops.c", kiln_op_name(op));
  }
  assert_null(kiln_op_name(KILN_OP_COUNT));
  assert_string_equal(kiln_op_name(KILN_OP_relu_fwd), "relu_fwd");
}

static void test_ref(void **state) {
  (void)state;
  assert_int_equal(run_table(kiln_backend_ref(), 1, NULL), 0);
  assert_int_equal(run_table(kiln_backend_ref(), 2, NULL), 0);
}

static void test_cpu(void **state) {
  (void)state;
  assert_int_equal(run_table(kiln_backend_cpu(), 1, NULL), 0);
  assert_int_equal(run_table(kiln_backend_cpu(), 2, NULL), 0);
}

/* cpu-bf16 (precision BF16): every row against the same double-precision references, its products
 * within bf16's tolerance and every other op (cpu's) within fp32's; where the CPU has no bf16
 * kernels, skipped saying why. tests/test_bf16.c checks the products to fp32 accuracy against
 * references of the bf16-rounded operands. */
static void test_cpu_bf16(void **state) {
  (void)state;
  if (kiln_bf16_check() != KILN_OK) {
    print_message("SKIP: %s\n", kiln_last_error());
    skip();
  }
  tol_bf16 = BF16_TOL;
  const int f1 = run_table(kiln_backend_cpu_bf16(), 1, NULL);
  const int f2 = run_table(kiln_backend_cpu_bf16(), 2, NULL);
  tol_bf16 = 0;
  assert_int_equal(f1, 0);
  assert_int_equal(f2, 0);
}

/* hostsim: its tensors in walled-off mappings, moved only through the device table; the walls
 * are closed again after every op. */
static void test_hostsim(void **state) {
  (void)state;
  const kiln_backend *b = kiln_backend_hostsim();
  assert_ptr_equal(b->device, kiln_device_hostsim());
  const int before = kiln_hostsim_mappings();
  assert_int_equal(run_table(b, 2, NULL), 0);
  assert_false(kiln_hostsim_open());
  assert_int_equal(kiln_hostsim_mappings(), before); /* every tensor freed */
}

/* A kernel off by a little for negative inputs (the slope ignored): the table names it. */
static int wrong_relu(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float slope) {
  (void)c;
  (void)slope;
  for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0;
  return KILN_OK;
}

static void test_a_wrong_kernel_is_caught(void **state) {
  (void)state;
  kiln_backend planted = *kiln_backend_cpu();
  planted.name = "planted";
  planted.relu_fwd = wrong_relu;
  int failed = -1;
  assert_true(run_table(&planted, 1, &failed) > 0);
  assert_int_equal(failed, KILN_OP_relu_fwd);
  planted = *kiln_backend_cpu();
  planted.name = "planted";
  planted.tanh_bwd = NULL; /* a missing kernel is a failure too */
  assert_false(kiln_backend_has(&planted, KILN_OP_tanh_bwd));
  assert_true(run_table(&planted, 1, NULL) > 0);
}

/* A layer runs on the backend of its configuration's device and engine; one whose kernels that
 * backend lacks, or that has no kernel list (its arithmetic still host code), is refused on a
 * device other than the host, naming the layer and the device. */
static void test_layers_choose_their_backend(void **state) {
  (void)state;
  kiln_config cfg = *kiln_test_config();
  kiln_blob *bottom = kiln_blob_new("x"), *top = kiln_blob_new("y");
  assert_int_equal(kiln_blob_reshape(bottom, 2, (int64_t[]){2, 3}), KILN_OK);
  Caffe__LayerParameter *relu = gc_layer_param("name: 'r' type: 'ReLU' bottom: 'x' top: 'y'");
  Caffe__LayerParameter *conv = gc_layer_param(
      "name: 'c' type: 'Convolution' bottom: 'x' top: 'y' convolution_param { num_output: 1 "
      "kernel_size: 1 }");
  const struct {
    kiln_engine engine;
    kiln_device_kind device;
    const kiln_backend *want;
  } cases[] = {{KILN_ENGINE_CPU, KILN_DEVICE_HOST, kiln_backend_cpu()},
               {KILN_ENGINE_REF, KILN_DEVICE_HOST, kiln_backend_ref()},
               {KILN_ENGINE_CPU, KILN_DEVICE_HOSTSIM, kiln_backend_hostsim()},
               {KILN_ENGINE_REF, KILN_DEVICE_HOSTSIM, kiln_backend_hostsim()},
               {KILN_ENGINE_CUDA, KILN_DEVICE_HOSTSIM, kiln_backend_cudaemu()},
               {KILN_ENGINE_CUDA, KILN_DEVICE_HOST, kiln_backend_cpu()}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cfg.engine = cases[i].engine;
    cfg.device = cases[i].device;
    kiln_layer *l;
    assert_int_equal(kiln_layer_create(relu, CAFFE__PHASE__TRAIN, &bottom, 1, &top, 1, 1, &cfg, &l), KILN_OK);
    assert_ptr_equal(l->backend, cases[i].want);
    kiln_layer_free(l);
  }
  /* a layer table with no kernel list: host code, refused on hostsim, taken on the host */
  kiln_layer_ops host_code = *kiln_layer_find("ReLU");
  host_code.type = "HostCode";
  host_code.kernels = NULL;
  kiln_layer fake = {.ops = &host_code, .name = "h", .config = &cfg};
  cfg.engine = KILN_ENGINE_CPU;
  cfg.device = KILN_DEVICE_HOSTSIM;
  assert_int_equal(kiln_layer_choose_backend(&fake), KILN_ERR_UNSUPPORTED);
  assert_non_null(strstr(kiln_last_error(), "layer 'h' (HostCode): no kernels for device hostsim"));
  cfg.device = KILN_DEVICE_HOST;
  assert_int_equal(kiln_layer_choose_backend(&fake), KILN_OK);
  assert_ptr_equal(fake.backend, kiln_backend_cpu());
  /* a kernel no backend has (an id past the list): refused, naming the backend */
  host_code.kernels = KILN_KERNELS(KILN_OP_relu_fwd, KILN_OP_COUNT);
  assert_int_equal(kiln_layer_choose_backend(&fake), KILN_ERR_UNSUPPORTED);
  assert_non_null(strstr(kiln_last_error(), "layer 'h' (HostCode): backend cpu has no kernel"));
  (void)conv;
  protobuf_c_message_free_unpacked(&relu->base, NULL);
  protobuf_c_message_free_unpacked(&conv->base, NULL);
  kiln_blob_free(bottom);
  kiln_blob_free(top);
}

/* hostsim's memory is a wall: read outside a kernel or the table's own copies, it faults (in a
 * child process here); inside enter .. leave it holds the NaN pattern of fresh memory, then what
 * was copied in. */
static void test_hostsim_walls(void **state) {
  (void)state;
  const kiln_device *d = kiln_device_hostsim();
  float *p;
  assert_int_equal(kiln_device_alloc(d, 1000 * sizeof(float), (void **)&p), KILN_OK);
  for (int k = 0; k < 2; k++) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL); /* cmocka's handler would carry on in the child */
      volatile float v = k ? (p[999] = 1.0f) : p[0]; /* a read, then a write */
      (void)v;
      _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* the fault; under AddressSanitizer its report and exit code instead of the signal */
    assert_true((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
                (WIFEXITED(status) && WEXITSTATUS(status) != 0));
  }
  kiln_device_enter(d);
  assert_true(kiln_hostsim_open());
  assert_true(isnan(p[0]) && isnan(p[999]));
  kiln_device_leave(d);
  assert_false(kiln_hostsim_open());
  const float in[3] = {1, 2, 3};
  float out[3] = {0};
  assert_int_equal(kiln_device_to_device(d, p + 10, in, sizeof in), KILN_OK);
  assert_int_equal(kiln_device_to_host(d, out, p + 10, sizeof out), KILN_OK);
  assert_memory_equal(in, out, sizeof in);
  assert_int_equal(kiln_device_set(d, p, 0, 1000 * sizeof(float)), KILN_OK);
  assert_int_equal(kiln_device_to_host(d, out, p + 10, sizeof out), KILN_OK);
  assert_true(out[0] == 0 && out[2] == 0);
  kiln_device_free(d, p);
  assert_ptr_equal(kiln_device_find("hostsim"), d);
  assert_ptr_equal(kiln_device_find("host"), kiln_device_host());
  assert_null(kiln_device_find("gpu"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op_has_a_row), cmocka_unit_test(test_ref),
      cmocka_unit_test(test_cpu), cmocka_unit_test(test_cpu_bf16), cmocka_unit_test(test_hostsim), cmocka_unit_test(test_cudaemu),
      cmocka_unit_test(test_cuda), cmocka_unit_test(test_cuda_covers_every_layer_type),
      cmocka_unit_test(test_a_wrong_kernel_is_caught), cmocka_unit_test(test_hostsim_walls),
      cmocka_unit_test(test_layers_choose_their_backend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
