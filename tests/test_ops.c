/* Kernels: convolution against a direct 7-loop reference and finite differences, im2col/col2im,
 * pooling by hand and by finite differences, softmax stability and gradient. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/ops.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static float *fbuf(int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  assert_non_null(p);
  return p;
}

static double *dbuf(int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  assert_non_null(p);
  return p;
}

static void fill_uniform(kiln_rng *r, float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_uniform(r, lo, hi);
}

static void fill_const(float *x, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++) x[i] = v;
}

/* |a - b| <= atol + rtol * |b|, reporting the first offender. */
static void expect_close_d(const char *what, const float *a, const double *b, int64_t n,
                           double atol, double rtol) {
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= atol + rtol * fabs(b[i]))) {
      print_error("%s[%lld]: got %.9g, want %.9g\n", what, (long long)i, (double)a[i], b[i]);
      fail();
    }
  }
}

static void expect_close_f(const char *what, const float *a, const float *b, int64_t n,
                           double atol) {
  for (int64_t i = 0; i < n; i++) {
    if (!(fabs((double)a[i] - (double)b[i]) <= atol)) {
      print_error("%s[%lld]: got %.9g, want %.9g\n", what, (long long)i, (double)a[i],
                  (double)b[i]);
      fail();
    }
  }
}

/* Caffe's gradient-check criterion: |analytic - numeric| <= tol * max(1, |analytic|, |numeric|). */
static void expect_grad(const char *what, int64_t i, double analytic, double numeric, double tol) {
  double scale = fmax(1.0, fmax(fabs(analytic), fabs(numeric)));
  if (!(fabs(analytic - numeric) <= tol * scale)) {
    print_error("%s[%lld]: analytic %.9g, numeric %.9g\n", what, (long long)i, analytic, numeric);
    fail();
  }
}

static double dot_loss(const float *out, const float *R, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)out[i] * (double)R[i];
  return s;
}

/* ---- convolution: a direct reference ------------------------------------------------------ */

typedef struct conv_case {
  int N, C, H, W, M, kh, kw, ph, pw, sh, sw, dh, dw, group, bias;
} conv_case;

static kiln_conv_geom geom_of(const conv_case *c) {
  kiln_conv_geom g = {.channels = c->C, .height = c->H, .width = c->W, .kernel_h = c->kh,
                      .kernel_w = c->kw, .pad_h = c->ph, .pad_w = c->pw, .stride_h = c->sh,
                      .stride_w = c->sw, .dilation_h = c->dh, .dilation_w = c->dw};
  assert_int_equal(kiln_conv_out_size(&g), 0);
  return g;
}

/* The seven loops (n, m, oh, ow, c, ki, kj), accumulated in double. out += conv(in, w) + bias. */
static void ref_conv_forward(double *out, const float *in, const float *w, const float *bias,
                             const conv_case *c, const kiln_conv_geom *g) {
  const int Cg = c->C / c->group, Mg = c->M / c->group, OH = g->out_h, OW = g->out_w;
  for (int n = 0; n < c->N; n++)
    for (int m = 0; m < c->M; m++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double s = bias ? bias[m] : 0.0;
          const int grp = m / Mg;
          for (int cc = 0; cc < Cg; cc++)
            for (int ki = 0; ki < c->kh; ki++)
              for (int kj = 0; kj < c->kw; kj++) {
                int ih = oh * c->sh - c->ph + ki * c->dh, iw = ow * c->sw - c->pw + kj * c->dw;
                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                int ci = grp * Cg + cc;
                s += (double)w[((m * Cg + cc) * c->kh + ki) * c->kw + kj] *
                     in[((n * c->C + ci) * c->H + ih) * c->W + iw];
              }
          out[((n * c->M + m) * OH + oh) * OW + ow] = s;
        }
}

/* din = dL/din, dw = dL/dw, db = dL/db for dL/dout = dout, by the same loops. */
static void ref_conv_backward(double *din, double *dw, double *db, const float *dout,
                              const float *in, const float *w, const conv_case *c,
                              const kiln_conv_geom *g) {
  const int Cg = c->C / c->group, Mg = c->M / c->group, OH = g->out_h, OW = g->out_w;
  for (int n = 0; n < c->N; n++)
    for (int m = 0; m < c->M; m++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          const double d = dout[((n * c->M + m) * OH + oh) * OW + ow];
          const int grp = m / Mg;
          db[m] += d;
          for (int cc = 0; cc < Cg; cc++)
            for (int ki = 0; ki < c->kh; ki++)
              for (int kj = 0; kj < c->kw; kj++) {
                int ih = oh * c->sh - c->ph + ki * c->dh, iw = ow * c->sw - c->pw + kj * c->dw;
                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                int ci = grp * Cg + cc;
                int64_t wi = ((m * Cg + cc) * c->kh + ki) * c->kw + kj;
                int64_t ii = ((n * c->C + ci) * c->H + ih) * c->W + iw;
                dw[wi] += d * in[ii];
                din[ii] += d * w[wi];
              }
        }
}

static const conv_case conv_cases[] = {
    /* N  C  H   W  M kh kw ph pw sh sw dh dw grp bias */
    {3, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},  /* odd sizes, padding */
    {3, 4, 9, 8, 6, 3, 2, 0, 1, 2, 2, 1, 1, 2, 0},  /* stride 2, group 2, no bias */
    {3, 4, 11, 10, 4, 3, 3, 2, 2, 1, 1, 2, 2, 1, 1}, /* dilation 2 */
    {3, 6, 7, 7, 6, 3, 3, 1, 1, 2, 1, 1, 1, 6, 1},  /* depthwise: group = channels */
    {3, 6, 5, 7, 12, 3, 3, 1, 1, 1, 1, 1, 1, 6, 0}, /* group = channels, 2 outputs each */
    {3, 8, 5, 5, 10, 1, 1, 0, 0, 1, 1, 1, 1, 2, 1}, /* 1x1 fast path, grouped */
    {3, 3, 6, 7, 5, 1, 1, 0, 0, 2, 2, 1, 1, 1, 1},  /* 1x1 with stride 2 */
    {3, 3, 4, 5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0},  /* 1x1 with padding */
    {3, 2, 5, 5, 3, 5, 5, 0, 0, 1, 1, 1, 1, 1, 1},  /* kernel as large as the image */
    {3, 3, 10, 9, 4, 2, 4, 0, 2, 3, 1, 1, 2, 1, 1}, /* rectangular, mixed stride/dilation */
    {3, 4, 13, 12, 4, 3, 3, 3, 2, 2, 3, 2, 1, 2, 1}, /* pad beyond kernel reach, group 2 */
    {2, 16, 9, 8, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},  /* 16 | channels, 3x3: oneDNN's Winograd */
    {2, 32, 6, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0},  /* the same, odd width, no bias */
    {2, 16, 8, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},  /* 16 into 16: oneDNN direct */
    {2, 20, 12, 12, 50, 5, 5, 0, 0, 1, 1, 1, 1, 1, 1}, /* LeNet's conv2: shifted-row route */
    {2, 1, 28, 28, 20, 5, 5, 0, 0, 1, 1, 1, 1, 1, 1},  /* LeNet's conv1 */
    {3, 3, 9, 10, 7, 7, 2, 3, 1, 1, 1, 1, 2, 1, 1},    /* 7 kernel rows, 7 outputs: block tails */
    {2, 2, 8, 4, 3, 5, 3, 0, 5, 1, 1, 1, 5, 1, 1},     /* kernel columns shifted past the image */
};

/* The oneDNN route (when the build has it) on the same case: the same contract as the plain
 * kernels (out and din overwritten, dw and dbias accumulated) against the same double-precision
 * reference, with workspace full of garbage, on 1 and 2 threads; and the same bits when run
 * again with the same threads (snapshots resume exactly). */
static void run_dnnl_case(const conv_case *c, const kiln_conv_geom *g, const float *in,
                          const float *w, const float *b, const float *dout, const float *dw0,
                          const float *db0, const double *ref_out, const double *ref_din,
                          const double *ref_dw, const double *ref_db) {
  if (!kiln_dnnl_available()) return;
  const int64_t nin = (int64_t)c->N * c->C * c->H * c->W;
  const int64_t nout = (int64_t)c->N * c->M * g->out_h * g->out_w;
  const int64_t nw = (int64_t)c->M * (c->C / c->group) * c->kh * c->kw;
  kiln_dnnl_conv *dn = NULL;
  if (kiln_dnnl_conv_create(&dn, c->N, c->M, c->group, g, c->bias, true, KILN_LAYOUT_PLAIN,
                            KILN_LAYOUT_PLAIN, NULL, 0, false) != KILN_OK)
    fail_msg("oneDNN has no convolution for N%d C%d %dx%d M%d k%dx%d: %s", c->N, c->C, c->H,
             c->W, c->M, c->kh, c->kw, kiln_last_error());
  /* 3x3 at stride 1 with 16 | channels, unless 16 into 16, runs Winograd; the same tolerance
   * holds for it. */
  const bool wino = c->kh == 3 && c->kw == 3 && c->sh == 1 && c->sw == 1 && c->dh == 1 &&
                    c->dw == 1 && c->group == 1 && c->C % 16 == 0 && c->M % 16 == 0 &&
                    c->C + c->M > 32;
  for (int which = 0; which < 3; which++)
    if ((strstr(kiln_dnnl_conv_impl(dn, which), "wino") != NULL) != wino)
      fail_msg("primitive %d is %s; Winograd expected: %d", which, kiln_dnnl_conv_impl(dn, which),
               wino);
  const int64_t nws = kiln_dnnl_conv_workspace(dn);
  float *ws = kiln_alloc(sizeof(float) * (size_t)(nws > 0 ? nws : 1));
  assert_non_null(ws);
  float *out[3], *din[3], *dw[3], *db[3];
  const int threads[3] = {1, 2, 2};
  for (int t = 0; t < 3; t++) {
    kiln_set_num_threads(threads[t]);
    out[t] = fbuf(nout), din[t] = fbuf(nin), dw[t] = fbuf(nw), db[t] = fbuf(c->M);
    fill_const(out[t], nout, NAN);
    fill_const(din[t], nin, 777.0f);
    fill_const(ws, nws, NAN);
    memcpy(dw[t], dw0, sizeof(float) * (size_t)nw);
    memcpy(db[t], db0, sizeof(float) * (size_t)c->M);
    assert_int_equal(kiln_dnnl_conv_forward(dn, out[t], in, w, b, ws), KILN_OK);
    fill_const(ws, nws, NAN);
    assert_int_equal(kiln_dnnl_conv_backward(dn, din[t], dw[t], c->bias ? db[t] : NULL, dout, in,
                                             w, ws),
                     KILN_OK);
    expect_close_d("dnnl out", out[t], ref_out, nout, 1e-4, 1e-4);
    expect_close_d("dnnl din", din[t], ref_din, nin, 1e-4, 1e-4);
    expect_close_d("dnnl dw", dw[t], ref_dw, nw, 1e-4, 1e-4);
    if (c->bias) expect_close_d("dnnl dbias", db[t], ref_db, c->M, 1e-4, 1e-4);
  }
  assert_memory_equal(out[2], out[1], sizeof(float) * (size_t)nout);
  assert_memory_equal(din[2], din[1], sizeof(float) * (size_t)nin);
  assert_memory_equal(dw[2], dw[1], sizeof(float) * (size_t)nw);
  assert_memory_equal(db[2], db[1], sizeof(float) * (size_t)c->M);
  for (int t = 0; t < 3; t++) free(out[t]), free(din[t]), free(dw[t]), free(db[t]);
  kiln_set_num_threads(2);
  kiln_free(ws);
  kiln_dnnl_conv_destroy(dn);
}

/* The shifted-row route (stride 1, group 1) on the same case and contract, on 1, 2 and 3
 * threads with garbage workspace: close to the reference and the same bits on every thread
 * count. */
static void run_shift_case(const conv_case *c, const kiln_conv_geom *g, const float *in,
                           const float *w, const float *b, const float *dout, const float *dw0,
                           const float *db0, const double *ref_out, const double *ref_din,
                           const double *ref_dw, const double *ref_db) {
  if (!kiln_conv_shift_supported(g, c->group)) return;
  const int64_t nin = (int64_t)c->N * c->C * c->H * c->W;
  const int64_t nout = (int64_t)c->N * c->M * g->out_h * g->out_w;
  const int64_t nw = (int64_t)c->M * c->C * c->kh * c->kw;
  float *out[3], *din[3], *dw[3], *db[3];
  for (int t = 0; t < 3; t++) {
    const int nt = t + 1;
    const int64_t nws = kiln_conv_shift_workspace(g, c->N, c->M, nt, true);
    float *ws = fbuf(nws);
    out[t] = fbuf(nout), din[t] = fbuf(nin), dw[t] = fbuf(nw), db[t] = fbuf(c->M);
    fill_const(out[t], nout, NAN);
    fill_const(din[t], nin, 777.0f);
    fill_const(ws, nws, NAN);
    memcpy(dw[t], dw0, sizeof(float) * (size_t)nw);
    memcpy(db[t], db0, sizeof(float) * (size_t)c->M);
    kiln_conv_shift_forward(out[t], in, w, b, c->N, c->M, g, ws, nt);
    fill_const(ws, nws, NAN);
    kiln_conv_shift_backward(din[t], dw[t], c->bias ? db[t] : NULL, dout, in, w, c->N, c->M, g,
                             ws, nt);
    free(ws);
  }
  expect_close_d("shift out", out[0], ref_out, nout, 1e-4, 1e-4);
  expect_close_d("shift din", din[0], ref_din, nin, 1e-4, 1e-4);
  expect_close_d("shift dw", dw[0], ref_dw, nw, 1e-4, 1e-4);
  if (c->bias) expect_close_d("shift dbias", db[0], ref_db, c->M, 1e-4, 1e-4);
  for (int t = 1; t < 3; t++) {
    assert_memory_equal(out[t], out[0], sizeof(float) * (size_t)nout);
    assert_memory_equal(din[t], din[0], sizeof(float) * (size_t)nin);
    assert_memory_equal(dw[t], dw[0], sizeof(float) * (size_t)nw);
    assert_memory_equal(db[t], db[0], sizeof(float) * (size_t)c->M);
  }
  /* Each gradient alone (the others NULL) gives the same bits. */
  const int64_t nws = kiln_conv_shift_workspace(g, c->N, c->M, 2, true);
  float *ws = fbuf(nws), *din1 = fbuf(nin), *dw1 = fbuf(nw);
  memcpy(dw1, dw0, sizeof(float) * (size_t)nw);
  fill_const(ws, nws, NAN);
  kiln_conv_shift_backward(din1, NULL, NULL, dout, in, w, c->N, c->M, g, ws, 2);
  kiln_conv_shift_backward(NULL, dw1, NULL, dout, in, w, c->N, c->M, g, ws, 2);
  assert_memory_equal(din1, din[0], sizeof(float) * (size_t)nin);
  assert_memory_equal(dw1, dw[0], sizeof(float) * (size_t)nw);
  free(ws), free(din1), free(dw1);
  for (int t = 0; t < 3; t++) free(out[t]), free(din[t]), free(dw[t]), free(db[t]);
}

static void run_conv_case(const conv_case *c, kiln_rng *r) {
  kiln_conv_geom g = geom_of(c);
  const int64_t nin = (int64_t)c->N * c->C * c->H * c->W;
  const int64_t nout = (int64_t)c->N * c->M * g.out_h * g.out_w;
  const int64_t nw = (int64_t)c->M * (c->C / c->group) * c->kh * c->kw;
  float *in = fbuf(nin), *w = fbuf(nw), *bias = fbuf(c->M), *dout = fbuf(nout);
  fill_uniform(r, in, nin, -1, 1);
  fill_uniform(r, w, nw, -1, 1);
  fill_uniform(r, bias, c->M, -1, 1);
  fill_uniform(r, dout, nout, -1, 1);
  const float *b = c->bias ? bias : NULL;

  double *ref_out = dbuf(nout), *ref_din = dbuf(nin), *ref_dw = dbuf(nw), *ref_db = dbuf(c->M);
  ref_conv_forward(ref_out, in, w, b, c, &g);
  ref_conv_backward(ref_din, ref_dw, ref_db, dout, in, w, c, &g);

  float *dw0 = fbuf(nw), *db0 = fbuf(c->M); /* starting values, to see += */
  fill_uniform(r, dw0, nw, -1, 1);
  fill_uniform(r, db0, c->M, -1, 1);
  for (int64_t i = 0; i < nw; i++) ref_dw[i] += dw0[i];
  for (int i = 0; i < c->M; i++) ref_db[i] += db0[i];

  float *out[3], *din[3], *dw[3], *db[3];
  const int threads[3] = {1, 2, 3};
  for (int t = 0; t < 3; t++) {
    int nt = threads[t];
    int64_t ncol = kiln_conv_workspace(&g, c->group, nt);
    float *col = fbuf(ncol), *dw_ws = fbuf(nt * nw);
    out[t] = fbuf(nout);
    din[t] = fbuf(nin);
    dw[t] = fbuf(nw);
    db[t] = fbuf(c->M);
    fill_const(out[t], nout, NAN);
    fill_const(din[t], nin, 777.0f); /* must be overwritten */
    fill_const(dw_ws, nt * nw, NAN); /* workspace contents must not matter */
    memcpy(dw[t], dw0, sizeof(float) * (size_t)nw);
    memcpy(db[t], db0, sizeof(float) * (size_t)c->M);
    kiln_conv2d_forward(out[t], in, w, b, c->N, c->M, c->group, &g, col, nt);
    kiln_conv2d_backward(din[t], dw[t], db[t], dout, in, w, c->N, c->M, c->group, &g, col,
                         dw_ws, nt);
    free(col);
    free(dw_ws);
  }
  expect_close_d("out", out[0], ref_out, nout, 1e-4, 1e-4);
  expect_close_d("din", din[0], ref_din, nin, 1e-4, 1e-4);
  expect_close_d("dw", dw[0], ref_dw, nw, 1e-4, 1e-4);
  expect_close_d("dbias", db[0], ref_db, c->M, 1e-4, 1e-4);
  for (int t = 1; t < 3; t++) { /* bitwise equal whatever the thread count */
    assert_memory_equal(out[t], out[0], sizeof(float) * (size_t)nout);
    assert_memory_equal(din[t], din[0], sizeof(float) * (size_t)nin);
    assert_memory_equal(dw[t], dw[0], sizeof(float) * (size_t)nw);
    assert_memory_equal(db[t], db[0], sizeof(float) * (size_t)c->M);
  }
  for (int t = 0; t < 3; t++) {
    free(out[t]);
    free(din[t]);
    free(dw[t]);
    free(db[t]);
  }
  run_dnnl_case(c, &g, in, w, b, dout, dw0, db0, ref_out, ref_din, ref_dw, ref_db);
  run_shift_case(c, &g, in, w, b, dout, dw0, db0, ref_out, ref_din, ref_dw, ref_db);
  free(in), free(w), free(bias), free(dout), free(dw0), free(db0);
  free(ref_out), free(ref_din), free(ref_dw), free(ref_db);
}

static void test_conv_matches_direct_reference(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 7, 1);
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) run_conv_case(&conv_cases[i], &r);
}

/* A Winograd convolution whose scratchpad for the whole batch would be larger than its output
 * runs in chunks of the batch (conv_dnnl.c), and keeps the contract with garbage workspace: the
 * output and input gradient against the double-precision reference as in run_dnnl_case, the
 * weight and bias gradients of the chunks added (+=) to the starting values, the same bits when
 * run again. On this shape oneDNN's schedule transforms the whole batch at once. A weight's
 * gradient sums N x 64 x 64 = 131,072 products, which Winograd's fp32 transforms round more
 * than a direct sum: they are held to 1e-4 of the sums' typical size, sqrt(131,072). */
static void test_dnnl_conv_in_chunks(void **state) {
  (void)state;
  if (!kiln_dnnl_available()) skip();
  const conv_case c = {32, 16, 64, 64, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
  const kiln_conv_geom g = geom_of(&c);
  kiln_dnnl_conv *dn = NULL;
  assert_int_equal(kiln_dnnl_conv_create(&dn, c.N, c.M, 1, &g, true, true, KILN_LAYOUT_PLAIN,
                                         KILN_LAYOUT_PLAIN, NULL, 0, false),
                   KILN_OK);
  if (kiln_dnnl_conv_chunks(dn) < 2)
    fail_msg("N%d C%d %dx%d M%d runs in %d chunk: oneDNN's Winograd schedule for this shape "
             "changed (pick a shape whose scratchpad grows with the batch)",
             c.N, c.C, c.H, c.W, c.M, kiln_dnnl_conv_chunks(dn));
  const int64_t nin = (int64_t)c.N * c.C * c.H * c.W;
  const int64_t nout = (int64_t)c.N * c.M * g.out_h * g.out_w;
  const int64_t nw = (int64_t)c.M * c.C * c.kh * c.kw;
  kiln_rng r;
  kiln_rng_seed(&r, 13, 3);
  float *in = fbuf(nin), *w = fbuf(nw), *bias = fbuf(c.M), *dout = fbuf(nout);
  float *dw0 = fbuf(nw), *db0 = fbuf(c.M);
  fill_uniform(&r, in, nin, -1, 1);
  fill_uniform(&r, w, nw, -1, 1);
  fill_uniform(&r, bias, c.M, -1, 1);
  fill_uniform(&r, dout, nout, -1, 1);
  fill_uniform(&r, dw0, nw, -1, 1);
  fill_uniform(&r, db0, c.M, -1, 1);
  double *ref_out = dbuf(nout), *ref_din = dbuf(nin), *ref_dw = dbuf(nw), *ref_db = dbuf(c.M);
  ref_conv_forward(ref_out, in, w, bias, &c, &g);
  ref_conv_backward(ref_din, ref_dw, ref_db, dout, in, w, &c, &g);
  for (int64_t i = 0; i < nw; i++) ref_dw[i] += dw0[i];
  for (int i = 0; i < c.M; i++) ref_db[i] += db0[i];
  const int64_t nws = kiln_dnnl_conv_workspace(dn);
  float *ws = kiln_alloc(sizeof(float) * (size_t)nws);
  assert_non_null(ws);
  float *out[2], *din[2], *dw[2], *db[2];
  for (int t = 0; t < 2; t++) {
    out[t] = fbuf(nout), din[t] = fbuf(nin), dw[t] = fbuf(nw), db[t] = fbuf(c.M);
    fill_const(out[t], nout, NAN);
    fill_const(din[t], nin, 777.0f);
    memcpy(dw[t], dw0, sizeof(float) * (size_t)nw);
    memcpy(db[t], db0, sizeof(float) * (size_t)c.M);
    fill_const(ws, nws, NAN);
    assert_int_equal(kiln_dnnl_conv_forward(dn, out[t], in, w, bias, ws), KILN_OK);
    fill_const(ws, nws, NAN);
    assert_int_equal(kiln_dnnl_conv_backward(dn, din[t], dw[t], db[t], dout, in, w, ws), KILN_OK);
  }
  const double sums = sqrt((double)c.N * g.out_h * g.out_w);
  expect_close_d("chunked out", out[0], ref_out, nout, 1e-4, 1e-4);
  expect_close_d("chunked din", din[0], ref_din, nin, 1e-4, 1e-4);
  expect_close_d("chunked dw", dw[0], ref_dw, nw, 1e-4 * sums, 1e-4);
  expect_close_d("chunked dbias", db[0], ref_db, c.M, 1e-4 * sums, 1e-4);
  assert_memory_equal(out[1], out[0], sizeof(float) * (size_t)nout);
  assert_memory_equal(din[1], din[0], sizeof(float) * (size_t)nin);
  assert_memory_equal(dw[1], dw[0], sizeof(float) * (size_t)nw);
  assert_memory_equal(db[1], db[0], sizeof(float) * (size_t)c.M);
  for (int t = 0; t < 2; t++) free(out[t]), free(din[t]), free(dw[t]), free(db[t]);
  free(in), free(w), free(bias), free(dout), free(dw0), free(db0);
  free(ref_out), free(ref_din), free(ref_dw), free(ref_db);
  kiln_free(ws);
  /* Another batch (a smaller last one) runs no more images at once than the planned batch's
   * calls, in the fewest chunks that divide it (a prime one by one), so it fits in the
   * workspace planned for the batch. */
  const int images = c.N / kiln_dnnl_conv_chunks(dn);
  const int other[3] = {30, 17, images};
  for (int k = 0; k < 3; k++) {
    int want_chunks = 1;
    while (other[k] / want_chunks > images || other[k] % want_chunks) want_chunks++;
    kiln_dnnl_conv *o = NULL;
    assert_int_equal(kiln_dnnl_conv_create(&o, other[k], c.M, 1, &g, true, true,
                                           KILN_LAYOUT_PLAIN, KILN_LAYOUT_PLAIN, NULL, images, false),
                     KILN_OK);
    assert_int_equal(kiln_dnnl_conv_chunks(o), want_chunks);
    assert_true(kiln_dnnl_conv_workspace(o) <= nws);
    kiln_dnnl_conv_destroy(o);
  }
  kiln_dnnl_conv_destroy(dn);
}

/* A bigger batch than threads and random shapes, still checked against the reference. */
static void test_conv_random_shapes(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 11, 2);
  for (int it = 0; it < 25; it++) {
    conv_case c;
    int groups[] = {1, 1, 2, 3};
    c.group = groups[kiln_rng_below(&r, 4)];
    c.N = 3;
    c.C = c.group * (1 + (int)kiln_rng_below(&r, 3));
    c.M = c.group * (1 + (int)kiln_rng_below(&r, 3));
    c.kh = 1 + (int)kiln_rng_below(&r, 4);
    c.kw = 1 + (int)kiln_rng_below(&r, 4);
    c.dh = 1 + (int)kiln_rng_below(&r, 2);
    c.dw = 1 + (int)kiln_rng_below(&r, 2);
    c.ph = (int)kiln_rng_below(&r, 3);
    c.pw = (int)kiln_rng_below(&r, 3);
    c.sh = 1 + (int)kiln_rng_below(&r, 3);
    c.sw = 1 + (int)kiln_rng_below(&r, 3);
    c.H = (c.kh - 1) * c.dh + 1 + (int)kiln_rng_below(&r, 6);
    c.W = (c.kw - 1) * c.dw + 1 + (int)kiln_rng_below(&r, 6);
    c.bias = (int)kiln_rng_below(&r, 2);
    run_conv_case(&c, &r);
  }
}

/* Stride 1, group 1 (the shifted-row route's domain) with wide padding and dilation, so that
 * kernel rows and columns fall wholly in the padding, against the reference on every route. */
static void test_conv_random_stride1_wide_padding(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 29, 3);
  for (int it = 0; it < 60; it++) {
    conv_case c = {.N = 2, .sh = 1, .sw = 1, .group = 1};
    c.C = 1 + (int)kiln_rng_below(&r, 3);
    c.M = 1 + (int)kiln_rng_below(&r, 9);
    c.kh = 1 + (int)kiln_rng_below(&r, 7);
    c.kw = 1 + (int)kiln_rng_below(&r, 7);
    c.dh = 1 + (int)kiln_rng_below(&r, 4);
    c.dw = 1 + (int)kiln_rng_below(&r, 4);
    c.ph = (int)kiln_rng_below(&r, 7);
    c.pw = (int)kiln_rng_below(&r, 7);
    c.H = 1 + (int)kiln_rng_below(&r, 12);
    c.W = 1 + (int)kiln_rng_below(&r, 12);
    c.bias = (int)kiln_rng_below(&r, 2);
    kiln_conv_geom g = {.channels = c.C, .height = c.H, .width = c.W, .kernel_h = c.kh,
                        .kernel_w = c.kw, .pad_h = c.ph, .pad_w = c.pw, .stride_h = 1,
                        .stride_w = 1, .dilation_h = c.dh, .dilation_w = c.dw};
    if (kiln_conv_out_size(&g) != 0) {
      it--; /* the kernel does not fit: draw again */
      continue;
    }
    run_conv_case(&c, &r);
  }
}

static void test_conv_backward_optional_outputs(void **state) {
  (void)state;
  const conv_case c = {3, 4, 6, 5, 4, 3, 3, 1, 0, 1, 2, 1, 1, 2, 1};
  kiln_conv_geom g = geom_of(&c);
  kiln_rng r;
  kiln_rng_seed(&r, 3, 3);
  const int64_t nin = (int64_t)c.N * c.C * c.H * c.W, nout = (int64_t)c.N * c.M * g.out_h * g.out_w;
  const int64_t nw = (int64_t)c.M * (c.C / c.group) * c.kh * c.kw;
  float *in = fbuf(nin), *w = fbuf(nw), *dout = fbuf(nout);
  fill_uniform(&r, in, nin, -1, 1);
  fill_uniform(&r, w, nw, -1, 1);
  fill_uniform(&r, dout, nout, -1, 1);
  float *col = fbuf(kiln_conv_workspace(&g, c.group, 2)), *ws = fbuf(2 * nw);
  float *din = fbuf(nin), *dw = fbuf(nw), *db = fbuf(c.M);
  float *din2 = fbuf(nin), *dw2 = fbuf(nw), *db2 = fbuf(c.M);
  fill_const(dw, nw, 0), fill_const(db, c.M, 0), fill_const(dw2, nw, 0), fill_const(db2, c.M, 0);
  kiln_conv2d_backward(din, dw, db, dout, in, w, c.N, c.M, c.group, &g, col, ws, 2);
  kiln_conv2d_backward(din2, NULL, NULL, dout, in, w, c.N, c.M, c.group, &g, col, NULL, 2);
  assert_memory_equal(din2, din, sizeof(float) * (size_t)nin);
  kiln_conv2d_backward(NULL, dw2, NULL, dout, in, w, c.N, c.M, c.group, &g, col, ws, 2);
  assert_memory_equal(dw2, dw, sizeof(float) * (size_t)nw);
  kiln_conv2d_backward(NULL, NULL, db2, dout, in, w, c.N, c.M, c.group, &g, NULL, NULL, 2);
  assert_memory_equal(db2, db, sizeof(float) * (size_t)c.M);
  free(in), free(w), free(dout), free(col), free(ws);
  free(din), free(dw), free(db), free(din2), free(dw2), free(db2);
}

/* Shapes big enough for OpenBLAS to thread its GEMMs if let (a threaded OpenBLAS GEMM does not
 * give the bits of a serial one): results must be the same bits for every nthreads and every
 * process thread setting (kiln_set_num_threads, which also sets OpenBLAS's), and OpenBLAS's own
 * setting must come back unchanged. */
static void test_conv_thread_count_independent_large(void **state) {
  (void)state;
  const conv_case cases[] = {{4, 32, 20, 20, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
                             {2, 20, 12, 12, 50, 5, 5, 0, 0, 1, 1, 1, 1, 1, 1}};
  kiln_rng r;
  kiln_rng_seed(&r, 29, 10);
  for (int ci = 0; ci < 2; ci++) {
    const conv_case c = cases[ci];
    kiln_conv_geom g = geom_of(&c);
    const int64_t nin = (int64_t)c.N * c.C * c.H * c.W;
    const int64_t nout = (int64_t)c.N * c.M * g.out_h * g.out_w;
    const int64_t nw = (int64_t)c.M * c.C * c.kh * c.kw;
    float *in = fbuf(nin), *w = fbuf(nw), *bias = fbuf(c.M), *dout = fbuf(nout);
    fill_uniform(&r, in, nin, -1, 1);
    fill_uniform(&r, w, nw, -1, 1);
    fill_uniform(&r, bias, c.M, -1, 1);
    fill_uniform(&r, dout, nout, -1, 1);
    float *out[4], *din[4], *dw[4], *db[4];
    for (int t = 0; t < 4; t++) {
      const int process_threads = 1 + t / 2, nt = 1 + t % 2;
      kiln_set_num_threads(process_threads);
      const int blas_threads = openblas_get_num_threads();
      float *col = fbuf(kiln_conv_workspace(&g, 1, nt)), *ws = fbuf(nt * nw);
      out[t] = fbuf(nout), din[t] = fbuf(nin), dw[t] = fbuf(nw), db[t] = fbuf(c.M);
      fill_const(dw[t], nw, 0), fill_const(db[t], c.M, 0);
      kiln_conv2d_forward(out[t], in, w, bias, c.N, c.M, 1, &g, col, nt);
      kiln_conv2d_backward(din[t], dw[t], db[t], dout, in, w, c.N, c.M, 1, &g, col, ws, nt);
      assert_int_equal(openblas_get_num_threads(), blas_threads);
      free(col), free(ws);
    }
    for (int t = 1; t < 4; t++) {
      assert_memory_equal(out[t], out[0], sizeof(float) * (size_t)nout);
      assert_memory_equal(din[t], din[0], sizeof(float) * (size_t)nin);
      assert_memory_equal(dw[t], dw[0], sizeof(float) * (size_t)nw);
      assert_memory_equal(db[t], db[0], sizeof(float) * (size_t)c.M);
    }
    for (int t = 0; t < 4; t++) free(out[t]), free(din[t]), free(dw[t]), free(db[t]);
    free(in), free(w), free(bias), free(dout);
  }
  kiln_set_num_threads(2);
}

/* Finite differences of L = sum(out * R) against the analytic din, dw, dbias. */
static void conv_gradcheck(const conv_case *c, kiln_rng *r) {
  kiln_conv_geom g = geom_of(c);
  const int64_t nin = (int64_t)c->N * c->C * c->H * c->W;
  const int64_t nout = (int64_t)c->N * c->M * g.out_h * g.out_w;
  const int64_t nw = (int64_t)c->M * (c->C / c->group) * c->kh * c->kw;
  float *in = fbuf(nin), *w = fbuf(nw), *bias = fbuf(c->M), *R = fbuf(nout), *out = fbuf(nout);
  fill_uniform(r, in, nin, -1, 1);
  fill_uniform(r, w, nw, -1, 1);
  fill_uniform(r, bias, c->M, -1, 1);
  fill_uniform(r, R, nout, -1, 1);
  float *col = fbuf(kiln_conv_workspace(&g, c->group, 1)), *ws = fbuf(nw);
  float *din = fbuf(nin), *dw = fbuf(nw), *db = fbuf(c->M);
  fill_const(dw, nw, 0), fill_const(db, c->M, 0);
  kiln_conv2d_backward(din, dw, db, R, in, w, c->N, c->M, c->group, &g, col, ws, 1);

  const float h = 1e-2f;
  struct {
    const char *name;
    float *x, *grad;
    int64_t n;
  } vars[] = {{"din", in, din, nin}, {"dw", w, dw, nw}, {"dbias", bias, db, c->M}};
  for (int v = 0; v < 3; v++) {
    for (int64_t i = 0; i < vars[v].n; i++) {
      const float x0 = vars[v].x[i];
      vars[v].x[i] = x0 + h;
      kiln_conv2d_forward(out, in, w, bias, c->N, c->M, c->group, &g, col, 1);
      double lp = dot_loss(out, R, nout);
      vars[v].x[i] = x0 - h;
      kiln_conv2d_forward(out, in, w, bias, c->N, c->M, c->group, &g, col, 1);
      double lm = dot_loss(out, R, nout);
      vars[v].x[i] = x0;
      expect_grad(vars[v].name, i, vars[v].grad[i], (lp - lm) / (2.0 * h), 1e-3);
    }
  }
  free(in), free(w), free(bias), free(R), free(out), free(col), free(ws);
  free(din), free(dw), free(db);
}

static void test_conv_gradient_finite_differences(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 5, 4);
  const conv_case a = {2, 2, 5, 4, 3, 3, 3, 1, 1, 2, 1, 1, 1, 1, 1};
  const conv_case b = {2, 4, 6, 6, 4, 2, 3, 1, 0, 1, 2, 2, 1, 2, 1};
  conv_gradcheck(&a, &r);
  conv_gradcheck(&b, &r);
}

static void test_conv_hand_computed(void **state) {
  (void)state;
  /* 1x1x3x3 input 1..9, a 2x2 kernel of ones: each output is the sum of a 2x2 block. */
  kiln_conv_geom g = {.channels = 1, .height = 3, .width = 3, .kernel_h = 2, .kernel_w = 2,
                      .stride_h = 1, .stride_w = 1, .dilation_h = 1, .dilation_w = 1};
  assert_int_equal(kiln_conv_out_size(&g), 0);
  assert_int_equal(g.out_h, 2);
  assert_int_equal(g.out_w, 2);
  float in[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 1, 1, 1}, bias[1] = {0.5f};
  float col[4 * 4], out[4];
  kiln_conv2d_forward(out, in, w, NULL, 1, 1, 1, &g, col, 1);
  const float want[4] = {12, 16, 24, 28};
  expect_close_f("out", out, want, 4, 0);
  kiln_conv2d_forward(out, in, w, bias, 1, 1, 1, &g, col, 1);
  const float want_b[4] = {12.5f, 16.5f, 24.5f, 28.5f};
  expect_close_f("out+bias", out, want_b, 4, 0);

  /* Backward with dout = 1: din counts the windows covering each pixel; dw sums the windows. */
  float dout[4] = {1, 1, 1, 1}, din[9], dw[4] = {0}, db[1] = {0}, ws[4];
  kiln_conv2d_backward(din, dw, db, dout, in, w, 1, 1, 1, &g, col, ws, 1);
  const float want_din[9] = {1, 2, 1, 2, 4, 2, 1, 2, 1};
  const float want_dw[4] = {1 + 2 + 4 + 5, 2 + 3 + 5 + 6, 4 + 5 + 7 + 8, 5 + 6 + 8 + 9};
  expect_close_f("din", din, want_din, 9, 0);
  expect_close_f("dw", dw, want_dw, 4, 0);
  assert_true(db[0] == 4.0f);

  /* Padding 1, stride 2 over the same image: corners of the zero-padded 5x5. */
  g.pad_h = g.pad_w = 1;
  g.stride_h = g.stride_w = 2;
  assert_int_equal(kiln_conv_out_size(&g), 0);
  assert_int_equal(g.out_h, 2);
  kiln_conv2d_forward(out, in, w, NULL, 1, 1, 1, &g, col, 1);
  const float want_p[4] = {1, 2 + 3, 4 + 7, 5 + 6 + 8 + 9};
  expect_close_f("padded out", out, want_p, 4, 0);
}

static void test_conv_out_size(void **state) {
  (void)state;
  kiln_conv_geom g = {.channels = 1, .height = 28, .width = 28, .kernel_h = 5, .kernel_w = 5,
                      .stride_h = 1, .stride_w = 1, .dilation_h = 1, .dilation_w = 1};
  assert_int_equal(kiln_conv_out_size(&g), 0);
  assert_int_equal(g.out_h, 24);
  assert_int_equal(g.out_w, 24);
  g.height = 7, g.width = 8, g.pad_h = 1, g.pad_w = 0, g.kernel_h = 3, g.kernel_w = 3;
  g.stride_h = 2, g.stride_w = 3, g.dilation_w = 2;
  assert_int_equal(kiln_conv_out_size(&g), 0);
  assert_int_equal(g.out_h, (7 + 2 - 3) / 2 + 1); /* 4 */
  assert_int_equal(g.out_w, (8 - 5) / 3 + 1);     /* 2 */
  /* Does not fit: 5 > 3 + 2*1; the outputs are left alone. */
  kiln_conv_geom bad = {.channels = 1, .height = 3, .width = 3, .kernel_h = 5, .kernel_w = 5,
                        .pad_h = 0, .pad_w = 1, .stride_h = 1, .stride_w = 1, .dilation_h = 1,
                        .dilation_w = 1, .out_h = -7, .out_w = -7};
  assert_int_equal(kiln_conv_out_size(&bad), -1);
  assert_int_equal(bad.out_h, -7);
  assert_int_equal(bad.out_w, -7);
  bad.pad_h = 1; /* 5 == 3 + 2: fits exactly */
  assert_int_equal(kiln_conv_out_size(&bad), 0);
  assert_int_equal(bad.out_h, 1);
  bad.dilation_w = 2; /* effective extent 9 */
  assert_int_equal(kiln_conv_out_size(&bad), -1);
  bad.dilation_w = 1;
  bad.stride_h = 0;
  assert_int_equal(kiln_conv_out_size(&bad), -1);
}

/* col2im(im2col(x)) = x times the number of windows that read each pixel. */
static void test_im2col_col2im_roundtrip(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 9, 5);
  const kiln_conv_geom geoms[] = {
      {2, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0},
      {3, 7, 6, 3, 2, 0, 1, 2, 2, 1, 1, 0, 0},
      {1, 9, 8, 3, 3, 2, 1, 1, 2, 2, 2, 0, 0},
      {2, 4, 4, 1, 1, 2, 0, 3, 1, 1, 1, 0, 0},
      {1, 6, 5, 2, 4, 1, 2, 3, 2, 1, 2, 0, 0},
  };
  for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++) {
    kiln_conv_geom g = geoms[gi];
    assert_int_equal(kiln_conv_out_size(&g), 0);
    const int64_t nim = (int64_t)g.channels * g.height * g.width;
    const int64_t ncol = (int64_t)g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
    float *x = fbuf(nim), *col = fbuf(ncol), *back = fbuf(nim);
    double *want = dbuf(nim);
    fill_uniform(&r, x, nim, -1, 1);
    fill_const(back, nim, 555.0f);
    kiln_im2col(col, x, &g);
    /* im2col itself: each entry is the pixel it names or 0 in the padding. */
    int64_t row = 0;
    for (int c = 0; c < g.channels; c++)
      for (int ki = 0; ki < g.kernel_h; ki++)
        for (int kj = 0; kj < g.kernel_w; kj++, row++)
          for (int oh = 0; oh < g.out_h; oh++)
            for (int ow = 0; ow < g.out_w; ow++) {
              int ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
              int iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
              int inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
              float v = inside ? x[(c * g.height + ih) * g.width + iw] : 0.0f;
              assert_true(col[(row * g.out_h + oh) * g.out_w + ow] == v);
              if (inside) want[(c * g.height + ih) * g.width + iw] += x[(c * g.height + ih) * g.width + iw];
            }
    kiln_col2im(back, col, &g);
    expect_close_d("col2im", back, want, nim, 1e-6, 1e-6);
    free(x), free(col), free(back), free(want);
  }
}

/* ---- pooling ----------------------------------------------------------------------------- */

static kiln_conv_geom pool_geom(int C, int H, int W, int k, int s, int p, int ceil_mode) {
  kiln_conv_geom g = {.channels = C, .height = H, .width = W, .kernel_h = k, .kernel_w = k,
                      .pad_h = p, .pad_w = p, .stride_h = s, .stride_w = s, .dilation_h = 1,
                      .dilation_w = 1};
  assert_int_equal(kiln_pool_out_size(&g, ceil_mode), 0);
  return g;
}

/* NCHW <-> nChw16c (KILN_LAYOUT_BLOCKED16) for N images of C (16 | C) channels of S cells. */
static void to_blocked16(float *dst, const float *src, int N, int C, int64_t S) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int64_t i = 0; i < S; i++)
        dst[(((int64_t)n * (C / 16) + c / 16) * S + i) * 16 + c % 16] =
            src[((int64_t)n * C + c) * S + i];
}
static void from_blocked16(float *dst, const float *src, int N, int C, int64_t S) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int64_t i = 0; i < S; i++)
        dst[((int64_t)n * C + c) * S + i] =
            src[(((int64_t)n * (C / 16) + c / 16) * S + i) * 16 + c % 16];
}

/* Pooling on the blocked layout against the plain kernels on random shapes (odd sizes, padding,
 * stride, CEIL and FLOOR, windows larger than the stride and smaller): the same windows in the
 * same order, so the same bits, forward and backward, MAX (with its mask) and AVE. */
/* Max pooling's 2x2 stride-2 route (8 and 4 windows per vector step, general loop for the
 * rest) against the rule written out: per window the first maximum in row-major order, strict >,
 * seeded with the window's first value (a NaN there stays; a NaN later never wins). Widths that
 * exercise the 8-step, the 4-step and the scalar rest; CEIL mode with odd sizes adds partial
 * windows; ties and NaNs in the data. Values and indices must match bit for bit. */
static void test_maxpool_2x2_matches_rule(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 23, 6);
  for (int it = 0; it < 60; it++) {
    const int N = 1 + (int)kiln_rng_below(&r, 2), C = 1 + (int)kiln_rng_below(&r, 3);
    const int H = 2 + (int)kiln_rng_below(&r, 30), W = 2 + (int)kiln_rng_below(&r, 40);
    const int ceil_mode = (int)kiln_rng_below(&r, 2);
    kiln_conv_geom g = {.channels = C, .height = H, .width = W, .kernel_h = 2, .kernel_w = 2,
                        .stride_h = 2, .stride_w = 2, .dilation_h = 1, .dilation_w = 1};
    assert_int_equal(kiln_pool_out_size(&g, ceil_mode), 0);
    const int64_t nin = (int64_t)N * C * H * W, nout = (int64_t)N * C * g.out_h * g.out_w;
    float *x = fbuf(nin), *y = fbuf(nout);
    int32_t *mk = malloc(sizeof(int32_t) * (size_t)nout);
    assert_non_null(mk);
    for (int64_t i = 0; i < nin; i++) /* few distinct values: many ties */
      x[i] = (float)kiln_rng_below(&r, 5) - 2.0f;
    for (int64_t i = 0; i < nin; i += 13) x[i] = NAN;
    kiln_maxpool_forward(y, mk, x, N, &g);
    for (int64_t pl = 0; pl < (int64_t)N * C; pl++)
      for (int oh = 0; oh < g.out_h; oh++)
        for (int ow = 0; ow < g.out_w; ow++) {
          const float *xp = x + pl * H * W;
          const int h0 = 2 * oh, w0 = 2 * ow;
          const int h1 = h0 + 2 < H ? h0 + 2 : H, w1 = w0 + 2 < W ? w0 + 2 : W;
          float best = xp[h0 * W + w0];
          int32_t arg = h0 * W + w0;
          for (int h = h0; h < h1; h++)
            for (int w = w0; w < w1; w++)
              if (xp[h * W + w] > best) best = xp[h * W + w], arg = h * W + w;
          const int64_t o = (pl * g.out_h + oh) * g.out_w + ow;
          if (mk[o] != arg || memcmp(&y[o], &best, sizeof best) != 0)
            fail_msg("%dx%d ceil%d window (%d,%d): got %g at %d, want %g at %d", H, W, ceil_mode,
                     oh, ow, (double)y[o], mk[o], (double)best, arg);
        }
    free(x), free(y), free(mk);
  }
}

static void test_pool_blocked_matches_plain(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 17, 4);
  int tried = 0;
  for (int it = 0; it < 40; it++) {
    const int N = 1 + (int)kiln_rng_below(&r, 3), C = 16 * (1 + (int)kiln_rng_below(&r, 2));
    const int k = 1 + (int)kiln_rng_below(&r, 4), st = 1 + (int)kiln_rng_below(&r, 3);
    const int pad = (int)kiln_rng_below(&r, (uint32_t)k), ceil_mode = (int)kiln_rng_below(&r, 2);
    const int H = k + (int)kiln_rng_below(&r, 8), W = k + (int)kiln_rng_below(&r, 8);
    kiln_conv_geom g = {.channels = C, .height = H, .width = W, .kernel_h = k, .kernel_w = k,
                        .pad_h = pad, .pad_w = pad, .stride_h = st, .stride_w = st,
                        .dilation_h = 1, .dilation_w = 1};
    if (kiln_pool_out_size(&g, ceil_mode) != 0) continue;
    tried++;
    const int64_t S = (int64_t)H * W, P = (int64_t)g.out_h * g.out_w;
    const int64_t nin = N * C * S, nout = N * C * P;
    float *x = fbuf(nin), *xb = fbuf(nin), *dy = fbuf(nout), *dyb = fbuf(nout);
    float *y = fbuf(nout), *yb = fbuf(nout), *yb_plain = fbuf(nout);
    float *dx = fbuf(nin), *dxb = fbuf(nin), *dxb_plain = fbuf(nin);
    int32_t *mk = malloc(sizeof(int32_t) * (size_t)nout), *mkb = malloc(sizeof(int32_t) * (size_t)nout);
    assert_non_null(mk), assert_non_null(mkb);
    fill_uniform(&r, x, nin, -1, 1);
    for (int64_t i = 0; i < nin; i += 7) x[i] = x[i / 2]; /* ties */
    fill_uniform(&r, dy, nout, -1, 1);
    to_blocked16(xb, x, N, C, S);
    to_blocked16(dyb, dy, N, C, P);
    for (int max = 0; max < 2; max++) {
      if (max) {
        kiln_maxpool_forward(y, mk, x, N, &g);
        kiln_maxpool_backward(dx, dy, mk, N, &g);
      } else {
        kiln_avepool_forward(y, x, N, &g);
        kiln_avepool_backward(dx, dy, N, &g);
      }
      fill_const(dxb, nin, 777.0f);
      kiln_pool_blocked16_forward(yb, max ? mkb : NULL, xb, N, &g, max);
      kiln_pool_blocked16_backward(dxb, dyb, max ? mkb : NULL, N, &g, max);
      from_blocked16(yb_plain, yb, N, C, P);
      from_blocked16(dxb_plain, dxb, N, C, S);
      if (memcmp(yb_plain, y, sizeof(float) * (size_t)nout) ||
          memcmp(dxb_plain, dx, sizeof(float) * (size_t)nin))
        fail_msg("%s pooling N%d C%d %dx%d k%d s%d p%d ceil%d: blocked differs from plain",
                 max ? "max" : "ave", N, C, H, W, k, st, pad, ceil_mode);
      if (max) {
        float *m = fbuf(nout), *mb = fbuf(nout), *mbp = fbuf(nout);
        for (int64_t i = 0; i < nout; i++) m[i] = (float)mk[i], mb[i] = (float)mkb[i];
        from_blocked16(mbp, mb, N, C, P);
        assert_memory_equal(mbp, m, sizeof(float) * (size_t)nout);
        free(m), free(mb), free(mbp);
      }
    }
    free(x), free(xb), free(dy), free(dyb), free(y), free(yb), free(yb_plain);
    free(dx), free(dxb), free(dxb_plain), free(mk), free(mkb);
  }
  assert_true(tried >= 30);
}

static void test_pool_out_size(void **state) {
  (void)state;
  kiln_conv_geom g = pool_geom(1, 6, 6, 3, 2, 0, 1);
  assert_int_equal(g.out_h, 3); /* ceil((6-3)/2) + 1 */
  g = pool_geom(1, 6, 6, 3, 2, 0, 0);
  assert_int_equal(g.out_h, 2); /* floor */
  g = pool_geom(1, 24, 24, 2, 2, 0, 1);
  assert_int_equal(g.out_h, 12);
  g = pool_geom(1, 32, 32, 3, 2, 0, 1); /* cifar10_quick */
  assert_int_equal(g.out_h, 16);
  g = pool_geom(1, 5, 5, 3, 2, 1, 1);
  assert_int_equal(g.out_h, 3);
  /* H=4, k=2, s=3, p=1: ceil gives 3 windows, but the third would start at 6 - 1 = 5 >= H, in
   * the right padding: Caffe drops it. */
  g = pool_geom(1, 4, 4, 2, 3, 1, 1);
  assert_int_equal(g.out_h, 2);
  g = pool_geom(1, 4, 4, 2, 3, 1, 0);
  assert_int_equal(g.out_h, 2);
  /* Without padding no window is dropped, even one that starts past the image (Caffe). */
  g = pool_geom(1, 4, 4, 1, 2, 0, 1);
  assert_int_equal(g.out_h, 3);
  /* Kernel does not fit, or pad >= kernel: -1 and nothing written. */
  kiln_conv_geom bad = {.channels = 1, .height = 2, .width = 2, .kernel_h = 5, .kernel_w = 5,
                        .pad_h = 1, .pad_w = 1, .stride_h = 1, .stride_w = 1, .out_h = -3,
                        .out_w = -3};
  assert_int_equal(kiln_pool_out_size(&bad, 1), -1);
  assert_int_equal(bad.out_h, -3);
  bad.kernel_h = bad.kernel_w = 2, bad.pad_h = 2;
  assert_int_equal(kiln_pool_out_size(&bad, 1), -1);
  bad.pad_h = 1;
  assert_int_equal(kiln_pool_out_size(&bad, 1), 0);
  assert_int_equal(bad.out_h, 3); /* (2+2-2)/1 + 1; the last window starts at 2-1 = 1 < H */
}

static void test_pool_hand_computed(void **state) {
  (void)state;
  const float in[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  kiln_conv_geom g = pool_geom(1, 4, 4, 2, 2, 0, 1);
  assert_int_equal(g.out_h, 2);
  float out[4];
  int32_t mask[4];
  kiln_maxpool_forward(out, mask, in, 1, &g);
  const float want_max[4] = {6, 8, 14, 16};
  expect_close_f("max", out, want_max, 4, 0);
  assert_int_equal(mask[0], 5), assert_int_equal(mask[1], 7);
  assert_int_equal(mask[2], 13), assert_int_equal(mask[3], 15);
  kiln_avepool_forward(out, in, 1, &g);
  const float want_ave[4] = {3.5f, 5.5f, 11.5f, 13.5f};
  expect_close_f("ave", out, want_ave, 4, 0);

  /* Max backward routes each gradient to its argmax; ave spreads it over the 4 cells. */
  const float dout[4] = {1, 2, 3, 4};
  float din[16];
  kiln_maxpool_backward(din, dout, mask, 1, &g);
  const float want_dmax[16] = {0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4};
  expect_close_f("dmax", din, want_dmax, 16, 0);
  kiln_avepool_backward(din, dout, 1, &g);
  const float want_dave[16] = {.25f, .25f, .5f,  .5f,  .25f, .25f, .5f, .5f,
                               .75f, .75f, 1.0f, 1.0f, .75f, .75f, 1.0f, 1.0f};
  expect_close_f("dave", din, want_dave, 16, 0);

  /* Overlapping windows (k=2, s=1) sharing one maximum: its gradient adds up. */
  const float in2[9] = {0, 0, 0, 0, 9, 0, 0, 0, 0};
  g = pool_geom(1, 3, 3, 2, 1, 0, 1);
  kiln_maxpool_forward(out, mask, in2, 1, &g);
  for (int i = 0; i < 4; i++) assert_int_equal(mask[i], 4);
  const float ones[4] = {1, 1, 1, 1};
  kiln_maxpool_backward(din, ones, mask, 1, &g);
  const float want_d2[9] = {0, 0, 0, 0, 4, 0, 0, 0, 0};
  expect_close_f("dmax overlap", din, want_d2, 9, 0);
}

/* Padding: MAX never picks the padding, AVE counts it in the divisor up to H + pad. */
static void test_pool_padding(void **state) {
  (void)state;
  float in[16], out[9];
  int32_t mask[9];
  fill_const(in, 9, 1.0f);
  kiln_conv_geom g = pool_geom(1, 3, 3, 3, 1, 1, 1);
  assert_int_equal(g.out_h, 3);
  kiln_avepool_forward(out, in, 1, &g);
  const float want9[9] = {4.f / 9, 6.f / 9, 4.f / 9, 6.f / 9, 1, 6.f / 9, 4.f / 9, 6.f / 9, 4.f / 9};
  expect_close_f("ave pad", out, want9, 9, 1e-7);

  /* H=W=4, k=3, s=2, p=1: windows start at -1, 1, 3; the last spans [3, 6) but the divisor
   * clips it to H + pad = 5, so it counts 2 rows (one real, one padding). */
  fill_const(in, 16, 1.0f);
  g = pool_geom(1, 4, 4, 3, 2, 1, 1);
  assert_int_equal(g.out_h, 3);
  kiln_avepool_forward(out, in, 1, &g);
  const float want_e[9] = {4.f / 9, 6.f / 9, 2.f / 6, 6.f / 9, 1, 3.f / 6, 2.f / 6, 3.f / 6, 1.f / 4};
  expect_close_f("ave pad edge", out, want_e, 9, 1e-7);
  /* Backward spreads dout / divisor over the real cells only. */
  float dout[9], din[16];
  fill_const(dout, 9, 0);
  dout[8] = 1.0f; /* bottom-right window: one real cell, divisor 4 */
  kiln_avepool_backward(din, dout, 1, &g);
  for (int i = 0; i < 15; i++) assert_true(din[i] == 0.0f);
  assert_true(din[15] == 0.25f);

  /* Max with negative inputs and padding: the answer is a real (negative) value. */
  for (int i = 0; i < 16; i++) in[i] = -1.0f - (float)i;
  kiln_maxpool_forward(out, mask, in, 1, &g);
  assert_true(out[0] == -1.0f);
  assert_int_equal(mask[0], 0);
  assert_true(out[8] == -16.0f);
  assert_int_equal(mask[8], 15);
  for (int i = 0; i < 9; i++) assert_true(mask[i] >= 0 && mask[i] < 16);

  /* No padding, CEIL, stride > kernel: the last window lies past the image (Caffe keeps it).
   * kiln writes 0 there, mask -1, and routes no gradient. */
  const float in4[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  g = pool_geom(1, 4, 4, 1, 2, 0, 1);
  assert_int_equal(g.out_h, 3);
  kiln_maxpool_forward(out, mask, in4, 1, &g);
  assert_true(out[0] == 1.0f && out[4] == 11.0f && out[8] == 0.0f);
  assert_int_equal(mask[2], -1);
  assert_int_equal(mask[4], 10);
  fill_const(dout, 9, 1.0f);
  kiln_maxpool_backward(din, dout, mask, 1, &g);
  assert_true(din[0] == 1.0f && din[10] == 1.0f && din[1] == 0.0f);
  kiln_avepool_forward(out, in4, 1, &g);
  assert_true(out[4] == 11.0f && out[8] == 0.0f);
  kiln_avepool_backward(din, dout, 1, &g);
  assert_true(din[10] == 1.0f && din[3] == 0.0f);
}

/* Finite differences of L = sum(out * R) for both pool types on padded, overlapping windows. */
static void test_pool_gradient_finite_differences(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 13, 6);
  const int N = 2, C = 3, H = 7, W = 6;
  const int64_t nin = (int64_t)N * C * H * W;
  float *in = fbuf(nin), *din = fbuf(nin);
  /* Distinct values 0.05 apart so a step of 1e-2 never changes an argmax. */
  for (int64_t i = 0; i < nin; i++) in[i] = 0.05f * (float)i;
  for (int64_t i = nin - 1; i > 0; i--) {
    int64_t j = kiln_rng_below(&r, (uint32_t)(i + 1));
    float t = in[i];
    in[i] = in[j], in[j] = t;
  }
  const int cfg[][4] = {{3, 2, 1, 1}, {2, 2, 0, 1}, {3, 2, 1, 0}, {3, 1, 0, 1}};
  for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
    kiln_conv_geom g = pool_geom(C, H, W, cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3]);
    const int64_t nout = (int64_t)N * C * g.out_h * g.out_w;
    float *out = fbuf(nout), *R = fbuf(nout);
    int32_t *mask = malloc(sizeof(int32_t) * (size_t)nout);
    fill_uniform(&r, R, nout, -1, 1);
    const float h = 1e-2f;
    for (int type = 0; type < 2; type++) {
      if (type == 0) {
        kiln_maxpool_forward(out, mask, in, N, &g);
        kiln_maxpool_backward(din, R, mask, N, &g);
      } else {
        kiln_avepool_forward(out, in, N, &g);
        kiln_avepool_backward(din, R, N, &g);
      }
      for (int64_t i = 0; i < nin; i++) {
        const float x0 = in[i];
        double l[2];
        for (int sgn = 0; sgn < 2; sgn++) {
          in[i] = sgn ? x0 - h : x0 + h;
          if (type == 0)
            kiln_maxpool_forward(out, mask, in, N, &g);
          else
            kiln_avepool_forward(out, in, N, &g);
          l[sgn] = dot_loss(out, R, nout);
        }
        in[i] = x0;
        expect_grad(type == 0 ? "dmax" : "dave", i, din[i], (l[0] - l[1]) / (2.0 * h), 1e-3);
      }
    }
    free(out), free(R), free(mask);
  }
  free(in), free(din);
}

/* ---- softmax ----------------------------------------------------------------------------- */

static void test_softmax_forward(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 17, 7);
  const int64_t outer = 3, C = 5, inner = 4, n = outer * C * inner;
  float x[60], y[60];
  fill_uniform(&r, x, n, -5, 5);
  kiln_softmax_forward(y, x, outer, C, inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      double s = 0, mx = -1e30;
      for (int64_t c = 0; c < C; c++) mx = fmax(mx, x[(o * C + c) * inner + i]);
      for (int64_t c = 0; c < C; c++) s += exp(x[(o * C + c) * inner + i] - mx);
      double total = 0;
      for (int64_t c = 0; c < C; c++) {
        double want = exp(x[(o * C + c) * inner + i] - mx) / s;
        float got = y[(o * C + c) * inner + i];
        assert_true(fabs(got - want) <= 1e-6 + 1e-5 * want);
        total += got;
      }
      assert_true(fabs(total - 1.0) < 1e-5);
    }
  /* In place gives the same answer. */
  float z[60];
  memcpy(z, x, sizeof z);
  kiln_softmax_forward(z, z, outer, C, inner);
  assert_memory_equal(z, y, sizeof z);

  /* Large inputs: no overflow, exact ratios. */
  const float big[4] = {1000.0f, 1001.0f, -1000.0f, 1000.0f};
  float p[4];
  kiln_softmax_forward(p, big, 2, 2, 1);
  const double e = exp(1.0);
  assert_true(fabs(p[0] - 1.0 / (1.0 + e)) < 1e-6);
  assert_true(fabs(p[1] - e / (1.0 + e)) < 1e-6);
  assert_true(p[2] == 0.0f);
  assert_true(p[3] == 1.0f);
  for (int i = 0; i < 4; i++) assert_false(isnan(p[i]));
}

static void test_softmax_gradient_finite_differences(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 19, 8);
  const int64_t outer = 2, C = 6, inner = 3, n = outer * C * inner;
  float x[36], y[36], R[36], din[36];
  fill_uniform(&r, x, n, -2, 2);
  fill_uniform(&r, R, n, -1, 1);
  kiln_softmax_forward(y, x, outer, C, inner);
  kiln_softmax_backward(din, y, R, outer, C, inner);
  const float h = 1e-2f;
  for (int64_t i = 0; i < n; i++) {
    const float x0 = x[i];
    x[i] = x0 + h;
    kiln_softmax_forward(y, x, outer, C, inner);
    double lp = dot_loss(y, R, n);
    x[i] = x0 - h;
    kiln_softmax_forward(y, x, outer, C, inner);
    double lm = dot_loss(y, R, n);
    x[i] = x0;
    expect_grad("dsoftmax", i, din[i], (lp - lm) / (2.0 * h), 1e-3);
  }
  /* din may alias dout. */
  kiln_softmax_forward(y, x, outer, C, inner);
  kiln_softmax_backward(R, y, R, outer, C, inner);
  assert_memory_equal(R, din, sizeof din);
}

/* Large enough to take the parallel path of every pooling and softmax kernel. */
static void test_parallel_paths_match_serial_shapes(void **state) {
  (void)state;
  kiln_rng r;
  kiln_rng_seed(&r, 23, 9);
  const int N = 4, C = 16, H = 20, W = 19;
  const int64_t nin = (int64_t)N * C * H * W;
  float *in = fbuf(nin), *din = fbuf(nin);
  fill_uniform(&r, in, nin, -1, 1);
  kiln_conv_geom g = pool_geom(C, H, W, 3, 2, 1, 1);
  const int64_t nout = (int64_t)N * C * g.out_h * g.out_w;
  float *out = fbuf(nout), *one = fbuf(nout), *dout = fbuf(nout), *din1 = fbuf(nin);
  int32_t *mask = malloc(sizeof(int32_t) * (size_t)nout), *mask1 = malloc(sizeof(int32_t) * (size_t)nout);
  fill_uniform(&r, dout, nout, -1, 1);
  kiln_maxpool_forward(out, mask, in, N, &g);
  kiln_maxpool_backward(din, dout, mask, N, &g);
  /* Image by image (below the parallel threshold) must agree exactly. */
  const int64_t pin = (int64_t)C * H * W, pout = (int64_t)C * g.out_h * g.out_w;
  for (int n = 0; n < N; n++) {
    kiln_maxpool_forward(one + n * pout, mask1 + n * pout, in + n * pin, 1, &g);
    kiln_maxpool_backward(din1 + n * pin, dout + n * pout, mask1 + n * pout, 1, &g);
  }
  assert_memory_equal(one, out, sizeof(float) * (size_t)nout);
  assert_memory_equal(mask1, mask, sizeof(int32_t) * (size_t)nout);
  assert_memory_equal(din1, din, sizeof(float) * (size_t)nin);
  kiln_avepool_forward(out, in, N, &g);
  kiln_avepool_backward(din, dout, N, &g);
  for (int n = 0; n < N; n++) {
    kiln_avepool_forward(one + n * pout, in + n * pin, 1, &g);
    kiln_avepool_backward(din1 + n * pin, dout + n * pout, 1, &g);
  }
  assert_memory_equal(one, out, sizeof(float) * (size_t)nout);
  assert_memory_equal(din1, din, sizeof(float) * (size_t)nin);

  /* Softmax over channels of the whole tensor vs. one image at a time. */
  float *sm = fbuf(nin), *sm1 = fbuf(nin);
  kiln_softmax_forward(sm, in, N, C, (int64_t)H * W);
  for (int n = 0; n < N; n++) kiln_softmax_forward(sm1 + n * pin, in + n * pin, 1, C, (int64_t)H * W);
  assert_memory_equal(sm1, sm, sizeof(float) * (size_t)nin);
  float *dsm = fbuf(nin), *dsm1 = fbuf(nin);
  kiln_softmax_backward(dsm, sm, in, N, C, (int64_t)H * W);
  for (int n = 0; n < N; n++)
    kiln_softmax_backward(dsm1 + n * pin, sm + n * pin, in + n * pin, 1, C, (int64_t)H * W);
  assert_memory_equal(dsm1, dsm, sizeof(float) * (size_t)nin);
  free(in), free(din), free(out), free(one), free(dout), free(din1), free(mask), free(mask1);
  free(sm), free(sm1), free(dsm), free(dsm1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_out_size),
      cmocka_unit_test(test_conv_hand_computed),
      cmocka_unit_test(test_im2col_col2im_roundtrip),
      cmocka_unit_test(test_conv_matches_direct_reference),
      cmocka_unit_test(test_dnnl_conv_in_chunks),
      cmocka_unit_test(test_conv_random_shapes),
      cmocka_unit_test(test_conv_random_stride1_wide_padding),
      cmocka_unit_test(test_conv_backward_optional_outputs),
      cmocka_unit_test(test_conv_thread_count_independent_large),
      cmocka_unit_test(test_conv_gradient_finite_differences),
      cmocka_unit_test(test_pool_out_size),
      cmocka_unit_test(test_pool_hand_computed),
      cmocka_unit_test(test_pool_padding),
      cmocka_unit_test(test_pool_blocked_matches_plain),
      cmocka_unit_test(test_maxpool_2x2_matches_rule),
      cmocka_unit_test(test_pool_gradient_finite_differences),
      cmocka_unit_test(test_softmax_forward),
      cmocka_unit_test(test_softmax_gradient_finite_differences),
      cmocka_unit_test(test_parallel_paths_match_serial_shapes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
