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

/* ---- neuron cases ---- */

/* ---- norm cases ---- */

/* ---- loss cases ---- */

/* ---- arrange cases ---- */

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
    /* ---- neuron (src/ops/neuron.c) ---- */
    /* ---- norm (src/ops/norm.c) ---- */
    /* ---- loss (src/ops/loss.c) ---- */
    /* ---- arrange (src/ops/arrange.c) ---- */
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
  cfg.device = KILN_DEVICE_HOSTSIM;
  kiln_layer *l = NULL;
  assert_int_equal(kiln_layer_create(conv, CAFFE__PHASE__TRAIN, &bottom, 1, &top, 1, 1, &cfg, &l),
                   KILN_ERR_UNSUPPORTED);
  assert_null(l);
  assert_non_null(strstr(kiln_last_error(), "layer 'c' (Convolution): no kernels for device hostsim"));
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
