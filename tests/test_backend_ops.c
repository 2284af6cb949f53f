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
  const bool planned = op == KILN_OP_conv_plan_update || op == KILN_OP_conv_fwd ||
                       op == KILN_OP_conv_bwd || op == KILN_OP_conv_plan_free;
  kiln_conv_plan *plan = NULL;
  kiln_conv_plan_info info = {0};
  int64_t wsn = kiln_im2col_conv_workspace(g, sp.group, sp.M, c->nthreads);
  if (planned) {
    assert_int_equal(b->conv_plan_update(c, &plan, &sp, &info), KILN_OK);
    kiln_conv_plan *again = plan;
    assert_int_equal(b->conv_plan_update(c, &again, &sp, &info), KILN_OK);
    assert_ptr_equal(again, plan);
    wsn = info.workspace_floats;
  }
  tensor ws = make(c, wsn > 0 ? wsn : 1);
  if (planned) {
    assert_int_equal(b->conv_fwd(c, plan, y.d, x.d, w.d, bias.d, ws.d), KILN_OK);
    assert_int_equal(b->conv_bwd(c, plan, dx.d, dw.d, db.d, dy.d, x.d, w.d, ws.d), KILN_OK);
    assert_int_equal(b->conv_plan_free(c, plan), KILN_OK);
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
CONV_CASE(conv_plan_update)
CONV_CASE(conv_plan_free)
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

/* ---- norm cases ---- */

/* ---- loss cases ---- */

/* ---- arrange cases ---- */

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

/* ---- solver cases ---- */

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
    /* ---- conv (src/ops/conv_plan.c); n picks a shape, pooling's p its kind ---- */
    {KILN_OP_conv_plan_update, case_conv_plan_update, 0, 0, 1e-6},
    {KILN_OP_conv_plan_free, case_conv_plan_free, 1, 0, 1e-6},
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
    /* ---- norm (src/ops/norm.c) ---- */
    /* ---- loss (src/ops/loss.c) ---- */
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
    /* ---- sequence (src/ops/sequence.c) ---- */
    /* ---- solver (src/ops/solver.c) ---- */
};
enum { NROWS = sizeof rows / sizeof rows[0] };

/* Runs every row on backend b; returns the failures, and prints each. */
static int run_table(const kiln_backend *b, int nthreads, int *failed_op) {
  kiln_op_ctx c = {.nthreads = nthreads, .config = kiln_test_config(), .device = b->device};
  int failures = 0;
  for (int i = 0; i < NROWS; i++) {
    const op_row *row = &rows[i];
    if (!kiln_backend_has(b, row->op)) {
      print_message("%s: no kernel %s\n", b->name, kiln_op_name(row->op));
      failures++;
      continue;
    }
    kiln_rng r;
    kiln_rng_seed(&r, 1234 + (uint64_t)i, 7);
    double e = row->run(b, &c, row->n, row->p, &r);
    if (!(e <= row->tol)) {
      print_message("%s %s (n %lld, setting %g, %d threads): error %g above %g\n", b->name,
                    kiln_op_name(row->op), (long long)row->n, (double)row->p, nthreads, e,
                    row->tol);
      if (failed_op) *failed_op = row->op;
      failures++;
    }
  }
  return failures;
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
               {KILN_ENGINE_REF, KILN_DEVICE_HOSTSIM, kiln_backend_hostsim()}};
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
      cmocka_unit_test(test_cpu), cmocka_unit_test(test_hostsim),
      cmocka_unit_test(test_a_wrong_kernel_is_caught), cmocka_unit_test(test_hostsim_walls),
      cmocka_unit_test(test_layers_choose_their_backend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
