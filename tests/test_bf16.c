/* bf16 mixed precision (the cpu-bf16 backend, include/kiln/backend.h; src/ops/bf16.c).
 *
 * The products of the bf16 table round their operands to bfloat16 and sum in fp32. So each is
 * checked against the same product in double of the operands rounded as kiln_bf16_round rounds
 * them, to fp32 accuracy (a bound of K fp32 roundings of the sum of |terms|), and is required to
 * be much further from the product of the unrounded operands (so it really ran in bf16, not in
 * fp32). A small net's gradients in bf16 are checked against finite differences of the same net
 * in fp32, within a stated bf16 tolerance; and precision BF16 is refused where the CPU cannot.
 * Every test skips, saying why, on a CPU without AVX512_BF16 or AMX-BF16. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gradcheck.h"
#include "kiln/cpu.h"
#include "kiln/backend.h"
#include "kiln/net.h"
#include "kiln/ops.h"
#include "kiln/rng.h"

static bool have_bf16(void) {
  if (kiln_bf16_check() == KILN_OK) return true;
  fprintf(stderr, "SKIP: %s\n", kiln_last_error());
  return false;
}

static float *fbuf(int64_t n) {
  float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64 + 64));
  assert_non_null(p);
  return p;
}

static void fill(kiln_rng *r, float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_uniform(r, -1.0f, 1.0f);
}

static kiln_op_ctx ctx(int threads) {
  static kiln_config cfg;
  kiln_config_init(&cfg);
  return (kiln_op_ctx){.nthreads = threads, .config = &cfg, .device = NULL};
}

/* Tracks the worst error against the bf16-rounded reference, as a share of its bound, and the
 * largest distance from the unrounded one. */
typedef struct {
  double worst_share, far;
} score;

static void score_one(score *s, double got, double ref16, double bound, double ref32) {
  const double e = fabs(got - ref16) / bound;
  if (e > s->worst_share) s->worst_share = e;
  if (fabs(got - ref32) > s->far) s->far = fabs(got - ref32);
}

static void score_check(const char *what, const score *s, double typical) {
  if (s->worst_share > 1.0)
    fail_msg("%s: off the bf16-rounded reference by %.2f times its fp32 bound", what,
             s->worst_share);
  /* bf16 keeps 8 significant bits: a sum of unit terms moves by ~2^-9 of its size */
  if (s->far < typical * 1e-4)
    fail_msg("%s: within %.3g of the fp32 product: the operands were not rounded to bf16", what,
             s->far);
}

/* ---- rounding ------------------------------------------------------------------------------- */

static void test_bf16_rounding(void **state) {
  (void)state;
  assert_int_equal(kiln_bf16_of(1.0f), 0x3f80);
  assert_int_equal(kiln_bf16_of(-2.0f), 0xc000);
  /* 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1 */
  assert_true(kiln_bf16_round(1.0f + 0x1p-8f) == 1.0f);
  /* 1 + 3 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one, 1 + 2^-6 */
  assert_true(kiln_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  assert_true(kiln_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  assert_true(kiln_bf16_round(3.14159265f) == 3.140625f);
  assert_true(isinf(kiln_bf16_round(INFINITY)) && kiln_bf16_round(-INFINITY) < 0);
  assert_true(isnan(kiln_bf16_round(NAN)));
  /* a NaN whose payload sits in the low bits stays a NaN, not an infinity */
  union { uint32_t u; float f; } nan_low = {.u = 0x7f800001u};
  assert_true(isnan(kiln_bf16_round(nan_low.f)));
  assert_true(isinf(kiln_bf16_round(3.4028235e38f))); /* FLT_MAX rounds past bf16's largest */
  /* subnormals round too, not flushed: 1e-40 (bits 0x000116c2) to 2^-133 (0x0001) */
  assert_true(kiln_bf16_round(1e-40f) == ldexpf(1.0f, -133));
  float x[37];
  uint16_t y[37];
  kiln_rng r;
  kiln_rng_seed(&r, 5, 1);
  fill(&r, x, 37);
  kiln_bf16_from_f32(y, x, 37);
  for (int i = 0; i < 37; i++) assert_int_equal(y[i], kiln_bf16_of(x[i]));
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

typedef struct {
  int64_t M, N, K;
  bool ta, tb;
  int64_t pad; /* extra leading dimension */
  float alpha, beta;
} gemm_case;

static const gemm_case gemm_cases[] = {
    {64, 500, 800, false, true, 0, 1.0f, 0.0f},   /* LeNet's ip1 forward: x W^T */
    {64, 800, 500, false, false, 0, 1.0f, 0.0f},  /* its input gradient: dy W */
    {500, 800, 64, true, false, 0, 1.0f, 1.0f},   /* its weight gradient: dy^T x, += */
    {33, 129, 77, false, false, 3, 1.0f, 0.0f},   /* odd sizes, strided operands */
    {40, 64, 96, true, true, 5, 0.5f, 0.25f},     /* both transposed, alpha and beta */
};

static void run_gemm_case(const kiln_backend *b, const gemm_case *g, int threads, bool rows) {
  kiln_rng r;
  kiln_rng_seed(&r, 7, (uint64_t)(g->M * 31 + g->N));
  const int64_t ar = g->ta ? g->K : g->M, ac = g->ta ? g->M : g->K;
  const int64_t br = g->tb ? g->N : g->K, bc = g->tb ? g->K : g->N;
  const int64_t lda = ac + g->pad, ldb = bc + g->pad, ldc = g->N + g->pad;
  float *A = fbuf(ar * lda), *B = fbuf(br * ldb), *C = fbuf(g->M * ldc), *C0 = fbuf(g->M * ldc);
  fill(&r, A, ar * lda);
  fill(&r, B, br * ldb);
  fill(&r, C0, g->M * ldc);
  memcpy(C, C0, (size_t)(g->M * ldc) * sizeof *C);
  const kiln_op_ctx c = ctx(threads);
  if (rows)
    assert_int_equal(b->gemm_rows(&c, C, ldc, A, lda, B, ldb, g->ta, g->tb, g->M, g->N, g->K,
                                  g->alpha, g->beta),
                     KILN_OK);
  else
    assert_int_equal(b->gemm(&c, C, ldc, A, lda, B, ldb, g->ta, g->tb, g->M, g->N, g->K,
                             g->alpha, g->beta),
                     KILN_OK);
  score s = {0, 0};
  for (int64_t m = 0; m < g->M; m++)
    for (int64_t n = 0; n < g->N; n++) {
      double r16 = 0, r32 = 0, mag = 0;
      for (int64_t k = 0; k < g->K; k++) {
        const float a = g->ta ? A[k * lda + m] : A[m * lda + k];
        const float bb = g->tb ? B[n * ldb + k] : B[k * ldb + n];
        r16 += (double)kiln_bf16_round(a) * kiln_bf16_round(bb);
        r32 += (double)a * bb;
        mag += fabs((double)a * bb);
      }
      const double c0 = g->beta * (double)C0[m * ldc + n];
      score_one(&s, C[m * ldc + n], g->alpha * r16 + c0,
                (double)g->K * 0x1p-24 * (fabs(g->alpha) * mag + fabs(c0)) + 1e-30,
                g->alpha * r32 + c0);
    }
  char what[160];
  snprintf(what, sizeof what, "%s %s %lldx%lldx%lld%s%s, %d threads", b->name,
           rows ? "gemm_rows" : "gemm", (long long)g->M, (long long)g->N, (long long)g->K,
           g->ta ? " ta" : "", g->tb ? " tb" : "", threads);
  score_check(what, &s, sqrt((double)g->K) / 3);
  /* nothing past each row's N columns is written */
  for (int64_t m = 0; m < g->M; m++)
    for (int64_t n = g->N; n < ldc; n++) assert_true(C[m * ldc + n] == C0[m * ldc + n]);
  free(A), free(B), free(C), free(C0);
}

static void test_bf16_gemm_against_rounded_reference(void **state) {
  (void)state;
  if (!have_bf16()) skip();
  const kiln_backend *b = kiln_backend_cpu_bf16();
  for (size_t i = 0; i < sizeof gemm_cases / sizeof gemm_cases[0]; i++)
    for (int t = 1; t <= 2; t++) {
      run_gemm_case(b, &gemm_cases[i], t, false);
      run_gemm_case(b, &gemm_cases[i], t, true);
    }
}

/* Below KILN_BF16_MIN_MACS a product stays fp32: exact against the fp32 reference. */
static void test_bf16_small_gemm_stays_fp32(void **state) {
  (void)state;
  if (!have_bf16()) skip();
  const int64_t M = 8, N = 10, K = 20;
  kiln_rng r;
  kiln_rng_seed(&r, 3, 3);
  float A[8 * 20], B[20 * 10], C[80];
  fill(&r, A, M * K);
  fill(&r, B, K * N);
  const kiln_op_ctx c = ctx(1);
  assert_int_equal(kiln_backend_cpu_bf16()->gemm(&c, C, N, A, K, B, N, false, false, M, N, K,
                                                 1.0f, 0.0f),
                   KILN_OK);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double ref = 0;
      for (int64_t k = 0; k < K; k++) ref += (double)A[m * K + k] * B[k * N + n];
      assert_true(fabs(C[m * N + n] - ref) < 1e-5);
    }
}

/* The recurrent layers' packed products: B packed in bf16 once, A rounded each run. */
static void test_bf16_packed_gemm(void **state) {
  (void)state;
  if (!have_bf16()) skip();
  const kiln_backend *b = kiln_backend_cpu_bf16();
  const int64_t M = 32, N = 2048, K = 512;
  for (int tb = 0; tb < 2; tb++) {
    kiln_rng r;
    kiln_rng_seed(&r, 11, (uint64_t)tb);
    float *A = fbuf(M * K), *B = fbuf(K * N), *C = fbuf(M * N), *C0 = fbuf(M * N);
    fill(&r, A, M * K);
    fill(&r, B, K * N);
    fill(&r, C0, M * N);
    memcpy(C, C0, (size_t)(M * N) * sizeof *C);
    const kiln_op_ctx c = ctx(2);
    kiln_packed_gemm *pg = NULL;
    assert_int_equal(b->packed_gemm_update(&c, &pg, tb, M, N, K, K, tb ? K : N, N, 1.0f),
                     KILN_OK);
    assert_int_equal(b->packed_gemm_set_b(&c, pg, B), KILN_OK);
    assert_int_equal(b->packed_gemm_run(&c, pg, C, A), KILN_OK);
    score s = {0, 0};
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double r16 = 0, r32 = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
          const float a = A[m * K + k], bb = tb ? B[n * K + k] : B[k * N + n];
          r16 += (double)kiln_bf16_round(a) * kiln_bf16_round(bb);
          r32 += (double)a * bb;
          mag += fabs((double)a * bb);
        }
        const double c0 = C0[m * N + n];
        score_one(&s, C[m * N + n], r16 + c0, (double)K * 0x1p-24 * (mag + fabs(c0)),
                  r32 + c0);
      }
    score_check(tb ? "packed gemm, B transposed" : "packed gemm", &s, sqrt((double)K) / 3);
    assert_int_equal(b->packed_gemm_free(&c, pg), KILN_OK);
    free(A), free(B), free(C), free(C0);
  }
}

/* ---- convolution ----------------------------------------------------------------------------- */

typedef struct {
  int N, C, H, W, M, kh, kw, pad, stride, group;
  bool bias;
} conv_case;

static const conv_case conv_cases[] = {
    {4, 32, 16, 16, 32, 5, 5, 2, 1, 1, true},  /* cifar10_quick's conv2 */
    {4, 16, 10, 9, 32, 3, 3, 1, 1, 1, true},   /* a ResNet 3x3, odd width (Winograd in fp32) */
    {3, 3, 12, 12, 16, 3, 3, 1, 2, 1, false},  /* few input channels, stride 2, no bias */
    {2, 16, 8, 8, 32, 1, 1, 0, 1, 1, true},    /* 1x1 */
    {2, 32, 7, 7, 32, 3, 3, 1, 1, 2, true},    /* grouped */
};

static void test_bf16_conv_against_rounded_reference(void **state) {
  (void)state;
  if (!have_bf16()) skip();
  const kiln_backend *b = kiln_backend_cpu_bf16();
  for (size_t ci = 0; ci < sizeof conv_cases / sizeof conv_cases[0]; ci++) {
    const conv_case *k = &conv_cases[ci];
    kiln_conv_geom g = {.channels = k->C, .height = k->H, .width = k->W, .kernel_h = k->kh,
                        .kernel_w = k->kw, .pad_h = k->pad, .pad_w = k->pad,
                        .stride_h = k->stride, .stride_w = k->stride, .dilation_h = 1,
                        .dilation_w = 1};
    assert_int_equal(kiln_conv_out_size(&g), 0);
    const int OH = g.out_h, OW = g.out_w, Cg = k->C / k->group, Mg = k->M / k->group;
    const int64_t nx = (int64_t)k->N * k->C * k->H * k->W, ny = (int64_t)k->N * k->M * OH * OW;
    const int64_t nw = (int64_t)k->M * Cg * k->kh * k->kw;
    kiln_rng r;
    kiln_rng_seed(&r, 13, ci);
    float *x = fbuf(nx), *w = fbuf(nw), *bias = fbuf(k->M), *y = fbuf(ny), *dy = fbuf(ny);
    float *dx = fbuf(nx), *dw = fbuf(nw), *db = fbuf(k->M);
    fill(&r, x, nx);
    fill(&r, w, nw);
    fill(&r, bias, k->M);
    fill(&r, dy, ny);
    for (int64_t i = 0; i < nw; i++) dw[i] = 0.5f;
    for (int m = 0; m < k->M; m++) db[m] = -0.25f;
    const kiln_op_ctx c = ctx(2);
    kiln_conv_spec spec = {.N = k->N, .M = k->M, .group = k->group, .g = g, .bias = k->bias,
                           .x_layout = KILN_LAYOUT_PLAIN, .y_layout = KILN_LAYOUT_PLAIN};
    kiln_conv_route *route = NULL;
    kiln_conv_route_info info;
    assert_int_equal(b->conv_route_update(&c, &route, &spec, &info), KILN_OK);
    float *ws = fbuf(info.workspace_floats + 16);
    for (int64_t i = 0; i < info.workspace_floats; i++) ws[i] = NAN;
    assert_int_equal(b->conv_fwd(&c, route, y, x, w, k->bias ? bias : NULL, ws), KILN_OK);
    assert_int_equal(b->conv_bwd(&c, route, dx, dw, k->bias ? db : NULL, dy, x, w, ws), KILN_OK);
    /* The references, by the seven loops in double: r16 of the rounded operands, r32 of the
     * operands as they are, mag the sums of |terms| the bounds scale. */
    double *y16 = calloc((size_t)ny, 8), *y32 = calloc((size_t)ny, 8), *ym = calloc((size_t)ny, 8);
    double *dx16 = calloc((size_t)nx, 8), *dx32 = calloc((size_t)nx, 8), *dxm = calloc((size_t)nx, 8);
    double *dw16 = calloc((size_t)nw, 8), *dw32 = calloc((size_t)nw, 8), *dwm = calloc((size_t)nw, 8);
    double *db32 = calloc((size_t)k->M, 8), *dbm = calloc((size_t)k->M, 8);
    for (int n = 0; n < k->N; n++)
      for (int m = 0; m < k->M; m++)
        for (int oh = 0; oh < OH; oh++)
          for (int ow = 0; ow < OW; ow++) {
            const int64_t yi = (((int64_t)n * k->M + m) * OH + oh) * OW + ow;
            const double d = dy[yi], d16 = kiln_bf16_round(dy[yi]);
            db32[m] += d;
            dbm[m] += fabs(d);
            for (int cc = 0; cc < Cg; cc++)
              for (int ki = 0; ki < k->kh; ki++)
                for (int kj = 0; kj < k->kw; kj++) {
                  const int ih = oh * k->stride - k->pad + ki, iw = ow * k->stride - k->pad + kj;
                  if (ih < 0 || ih >= k->H || iw < 0 || iw >= k->W) continue;
                  const int chan = m / Mg * Cg + cc;
                  const int64_t wi = (((int64_t)m * Cg + cc) * k->kh + ki) * k->kw + kj;
                  const int64_t xi = (((int64_t)n * k->C + chan) * k->H + ih) * k->W + iw;
                  const double x16 = kiln_bf16_round(x[xi]), w16 = kiln_bf16_round(w[wi]);
                  y16[yi] += x16 * w16;
                  y32[yi] += (double)x[xi] * w[wi];
                  ym[yi] += fabs((double)x[xi] * w[wi]);
                  dx16[xi] += d16 * w16;
                  dx32[xi] += d * w[wi];
                  dxm[xi] += fabs(d * w[wi]);
                  dw16[wi] += d16 * x16;
                  dw32[wi] += d * x[xi];
                  dwm[wi] += fabs(d * x[xi]);
                }
          }
    const double K = (double)Cg * k->kh * k->kw;
    const double T = (double)k->N * OH * OW; /* terms of a weight gradient */
    score sy = {0, 0}, sx = {0, 0}, sw = {0, 0};
    for (int64_t i = 0; i < ny; i++) {
      const int m = (int)(i / ((int64_t)OH * OW) % k->M);
      const double b0 = k->bias ? bias[m] : 0.0;
      score_one(&sy, y[i], y16[i] + b0, K * 0x1p-24 * (ym[i] + fabs(b0)) + 1e-30, y32[i] + b0);
    }
    for (int64_t i = 0; i < nx; i++)
      score_one(&sx, dx[i], dx16[i], (double)k->M * k->kh * k->kw * 0x1p-24 * dxm[i] + 1e-30,
                dx32[i]);
    for (int64_t i = 0; i < nw; i++)
      score_one(&sw, dw[i], dw16[i] + 0.5, T * 0x1p-24 * (dwm[i] + 0.5) + 1e-30, dw32[i] + 0.5);
    char what[128];
    snprintf(what, sizeof what, "conv case %zu forward", ci);
    score_check(what, &sy, sqrt(K) / 3);
    snprintf(what, sizeof what, "conv case %zu input gradient", ci);
    if (Cg >= 16) score_check(what, &sx, sqrt(K) / 3);
    else if (sx.far > 1e-3) /* the plain fp32 route (few channels) */
      fail_msg("%s: %g from the fp32 gradient", what, sx.far);
    snprintf(what, sizeof what, "conv case %zu weight gradient", ci);
    score_check(what, &sw, sqrt(T) / 3);
    /* The bias gradient sums dy as oneDNN reads it (bf16) or as it is: within bf16's rounding
     * of each term either way. */
    for (int m = 0; k->bias && m < k->M; m++)
      if (fabs(db[m] - (db32[m] - 0.25)) > 0x1p-8 * dbm[m] + 1e-4)
        fail_msg("conv case %zu bias gradient %d: %g, want %g", ci, m, db[m], db32[m] - 0.25);
    assert_int_equal(b->conv_route_free(&c, route), KILN_OK);
    free(x), free(w), free(bias), free(y), free(dy), free(dx), free(dw), free(db), free(ws);
    free(y16), free(y32), free(ym), free(dx16), free(dx32), free(dxm), free(dw16), free(dw32);
    free(dwm), free(db32), free(dbm);
  }
}

/* ---- attention ------------------------------------------------------------------------------- */

/* max |a - b| over n, and max |b| */
static void spread(const float *a, const float *b, int64_t n, double *diff, double *mag) {
  *diff = 0, *mag = 0;
  for (int64_t i = 0; i < n; i++) {
    if (fabs((double)a[i] - b[i]) > *diff) *diff = fabs((double)a[i] - b[i]);
    if (fabs((double)b[i]) > *mag) *mag = fabs((double)b[i]);
  }
}

/* Scores, weighted sums and their gradients in bf16 against cpu's fp32 kernels on the same
 * inputs (causal, and with padding): within 1e-2 of each output's largest value (bf16 rounds each
 * operand by 2^-9), and not equal to fp32's (so they did run in bf16). */
static void test_bf16_attention(void **state) {
  (void)state;
  if (!have_bf16()) skip();
  const int T = 12, S = 12, N = 3, H = 2, hd = 32, D = H * hd;
  const int64_t nq = (int64_t)T * N * D, nk = (int64_t)S * N * D, np = (int64_t)N * H * T * S;
  for (int variant = 0; variant < 2; variant++) {
    kiln_rng r;
    kiln_rng_seed(&r, 17, (uint64_t)variant);
    float *q = fbuf(nq), *k = fbuf(nk), *v = fbuf(nk), *dctx = fbuf(nq), valid[12 * 3];
    fill(&r, q, nq), fill(&r, k, nk), fill(&r, v, nk), fill(&r, dctx, nq);
    for (int i = 0; i < S * N; i++) valid[i] = (i % 5 == 4) ? 0.0f : 1.0f;
    const bool causal = variant == 0;
    const float *vm = variant ? valid : NULL;
    float *out[2][6];
    const kiln_backend *bs[2] = {kiln_backend_cpu(), kiln_backend_cpu_bf16()};
    for (int b = 0; b < 2; b++) {
      float *cx = fbuf(nq), *probs = fbuf(np), *dq = fbuf(nq), *dk = fbuf(nk), *dv = fbuf(nk);
      float *work = fbuf(kiln_attention_workspace(T, S, 2));
      const kiln_op_ctx c = ctx(2);
      assert_int_equal(bs[b]->attention_fwd(&c, cx, probs, q, k, v, vm, T, S, N, H, hd, 0.125f,
                                            causal),
                       KILN_OK);
      assert_int_equal(bs[b]->attention_bwd(&c, dq, dk, dv, work, dctx, probs, q, k, v, T, S, N,
                                            H, hd, 0.125f),
                       KILN_OK);
      out[b][0] = cx, out[b][1] = probs, out[b][2] = dq, out[b][3] = dk, out[b][4] = dv;
      out[b][5] = work;
    }
    const int64_t counts[5] = {nq, np, nq, nk, nk};
    static const char *const names[5] = {"ctx", "probs", "dq", "dk", "dv"};
    for (int o = 0; o < 5; o++) {
      double diff, mag;
      spread(out[1][o], out[0][o], counts[o], &diff, &mag);
      if (diff > 1e-2 * mag)
        fail_msg("attention %s (variant %d): bf16 off fp32 by %g of %g", names[o], variant, diff,
                 mag);
      if (diff < 1e-6 * mag)
        fail_msg("attention %s (variant %d): bf16 equals fp32 (%g): not run in bf16", names[o],
                 variant, diff);
    }
    for (int b = 0; b < 2; b++)
      for (int o = 0; o < 6; o++) free(out[b][o]);
    free(q), free(k), free(v), free(dctx);
  }
}

/* ---- a net's gradients in bf16 ---------------------------------------------------------------- */

static const char *small_net =
    "name: 'small' "
    "layer { name: 'data' type: 'Input' top: 'data' top: 'label' "
    "  input_param { shape { dim: 8 dim: 16 dim: 8 dim: 8 } shape { dim: 8 } } } "
    "layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'conv' "
    "  convolution_param { num_output: 16 kernel_size: 3 pad: 1 "
    "    weight_filler { type: 'gaussian' std: 0.1 } bias_filler { type: 'constant' value: 0.1 } } } "
    "layer { name: 'relu' type: 'TanH' bottom: 'conv' top: 'conv' } "
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'conv' top: 'ip' "
    "  inner_product_param { num_output: 10 weight_filler { type: 'gaussian' std: 0.05 } } } "
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }";

/* The net (its parameter message, which the net reads from while it lives, in *np). */
static kiln_net *make_net(kiln_precision p, Caffe__NetParameter **np) {
  assert_int_equal(kiln_net_param_from_text(small_net, "<small>", np), KILN_OK);
  static kiln_config cfg[3];
  kiln_config_init(&cfg[p]);
  cfg[p].precision = p;
  kiln_net_options o = {0};
  o.phase = CAFFE__PHASE__TRAIN;
  o.seed = 1;
  o.nthreads = 2;
  o.config = &cfg[p];
  kiln_net *net = NULL;
  const int rc = kiln_net_create(*np, &o, &net);
  if (rc) fail_msg("%s", kiln_last_error());
  return net;
}

static void set_inputs(kiln_net *net) {
  kiln_rng r;
  kiln_rng_seed(&r, 21, 0);
  kiln_blob *data = kiln_net_blob(net, "data"), *label = kiln_net_blob(net, "label");
  fill(&r, data->data, data->count);
  for (int i = 0; i < 8; i++) label->data[i] = (float)(i * 3 % 10);
}

/* Analytic gradients of the bf16 net against central differences of the loss of the same net in
 * fp32, in double around each weight. Tolerance: each gradient vector within 2% of its norm
 * (bf16 keeps 8 significant bits, 2^-9 = 0.2% an operand; the sums do not grow it), and every
 * element within 5% of its vector's largest. The fp32 net's own analytic gradients agree with
 * the differences to 1e-3 of the same scale, so the check can tell bf16 from a wrong gradient. */
static void test_bf16_net_gradients(void **state) {
  (void)state;
  if (!have_bf16()) skip();
  Caffe__NetParameter *p16 = NULL, *p32 = NULL;
  kiln_net *n16 = make_net(KILN_PRECISION_BF16, &p16), *n32 = make_net(KILN_PRECISION_FP32, &p32);
  assert_string_equal(kiln_net_backend(n16)->name, "cpu-bf16");
  assert_string_equal(kiln_net_backend(n32)->name, "cpu");
  assert_int_equal(n16->nparam_floats, n32->nparam_floats);
  memcpy(n16->param_data, n32->param_data, (size_t)n32->nparam_floats * sizeof(float));
  set_inputs(n16);
  set_inputs(n32);
  float loss16, loss32;
  kiln_net_zero_param_diff(n16);
  kiln_net_zero_param_diff(n32);
  assert_int_equal(kiln_net_forward(n16, &loss16), KILN_OK);
  assert_int_equal(kiln_net_backward(n16), KILN_OK);
  assert_int_equal(kiln_net_forward(n32, &loss32), KILN_OK);
  assert_int_equal(kiln_net_backward(n32), KILN_OK);
  assert_true(fabsf(loss16 - loss32) < 0.02f * fabsf(loss32));
  assert_true(loss16 != loss32); /* it did run in bf16 */
  for (int p = 0; p < n32->nlearnable; p++) {
    const kiln_blob *b32 = n32->learnable[p];
    const int64_t off = n32->learnable_offset[p], cnt = b32->count;
    /* at most 200 elements of each blob, spread over it */
    const int64_t stride = cnt > 200 ? cnt / 200 : 1;
    double num2 = 0, err16 = 0, err32 = 0, maxg = 0, worst = 0;
    for (int64_t i = 0; i < cnt; i += stride) {
      float *w = n32->param_data + off + i;
      const float w0 = *w, h = 1e-2f;
      float lp, lm;
      *w = w0 + h;
      assert_int_equal(kiln_net_forward(n32, &lp), KILN_OK);
      *w = w0 - h;
      assert_int_equal(kiln_net_forward(n32, &lm), KILN_OK);
      *w = w0;
      const double fd = ((double)lp - lm) / (2.0 * h);
      const double g16 = n16->param_diff[off + i], g32 = n32->param_diff[off + i];
      num2 += fd * fd;
      err16 += (g16 - fd) * (g16 - fd);
      err32 += (g32 - fd) * (g32 - fd);
      if (fabs(fd) > maxg) maxg = fabs(fd);
      if (fabs(g16 - fd) > worst) worst = fabs(g16 - fd);
    }
    const double norm = sqrt(num2);
    fprintf(stderr, "blob %d: |fd| %.4g, bf16 off by %.3g%%, fp32 by %.3g%%, worst %.3g of %.3g\n",
            p, norm, 100 * sqrt(err16) / norm, 100 * sqrt(err32) / norm, worst, maxg);
    assert_true(sqrt(err32) <= 1e-3 * norm + 1e-6);
    if (sqrt(err16) > 0.02 * norm) fail_msg("blob %d: bf16 gradient off by %.3g of its norm", p,
                                            sqrt(err16) / norm);
    if (worst > 0.05 * maxg) fail_msg("blob %d: an element off by %.3g of the largest", p,
                                      worst / maxg);
  }
  kiln_net_free(n16);
  kiln_net_free(n32);
  protobuf_c_message_free_unpacked(&p16->base, NULL);
  protobuf_c_message_free_unpacked(&p32->base, NULL);
}

/* ---- where bf16 cannot run ------------------------------------------------------------------- */

static void test_bf16_refused_off_the_host(void **state) {
  (void)state;
  kiln_config cfg;
  kiln_config_init(&cfg);
  cfg.precision = KILN_PRECISION_BF16;
  const kiln_backend *b = NULL;
  assert_int_equal(kiln_backend_choose(&cfg, kiln_device_hostsim(), &b), KILN_ERR_UNSUPPORTED);
  assert_non_null(strstr(kiln_last_error(), "precision BF16 runs on the CPU"));
  assert_null(b);
  cfg.engine = KILN_ENGINE_REF;
  assert_int_equal(kiln_backend_choose(&cfg, NULL, &b), KILN_ERR_UNSUPPORTED);
  assert_non_null(strstr(kiln_last_error(), "KILN_ENGINE=ref"));
  /* fp32 and the default choose as kiln_backend_for does */
  cfg.engine = KILN_ENGINE_CPU;
  cfg.precision = KILN_PRECISION_FP32;
  assert_int_equal(kiln_backend_choose(&cfg, NULL, &b), KILN_OK);
  assert_ptr_equal(b, kiln_backend_cpu());
  cfg.precision = KILN_PRECISION_DEFAULT;
  assert_int_equal(kiln_backend_choose(&cfg, NULL, &b), KILN_OK);
  assert_ptr_equal(b, kiln_backend_cpu());
}

/* The slow-bf16 rule on the rates of the hosts kiln has run on (kiln-fma-peak, a core): the AMD
 * EPYC whose VDPBF16PS doubles its FMAs (235.0 against 117.5), the Intel Xeon of family 6 model
 * 207 where it halves them (86.2 against 175.8, no AMX exposed), and the same with AMX, whose
 * tiles oneDNN would use instead. Then the note on this CPU: a warning through kiln_log exactly
 * where this CPU's own loops say bf16 is slower, once a process. */
static int g_warnings;
static char g_warning[512];
static void capture(kiln_log_level level, const char *msg, void *user) {
  (void)user;
  if (level == KILN_LOG_WARN && strstr(msg, "precision BF16")) {
    g_warnings++;
    snprintf(g_warning, sizeof g_warning, "%s", msg);
  }
}

static void test_bf16_slow_rate_warned(void **state) {
  (void)state;
  assert_false(kiln_bf16_slower(235.0, 117.5, false));
  assert_true(kiln_bf16_slower(86.2, 175.8, false));
  assert_false(kiln_bf16_slower(86.2, 175.8, true));
  assert_false(kiln_bf16_slower(0, 175.8, false)); /* no such loop: nothing measured */
  if (kiln_bf16_check() != KILN_OK) skip();
  /* choosing the bf16 backend notes it (this test runs first: the note is once a process) */
  kiln_config cfg;
  kiln_config_init(&cfg);
  cfg.precision = KILN_PRECISION_BF16;
  const kiln_backend *b = NULL;
  kiln_log_set_handler(capture, NULL);
  assert_int_equal(kiln_backend_choose(&cfg, NULL, &b), KILN_OK);
  assert_int_equal(kiln_backend_choose(&cfg, NULL, &b), KILN_OK);
  kiln_log_set_handler(NULL, NULL);
  double bf16, fp32; /* measured again: the note's own figures are not kept */
  kiln_bf16_rates(&bf16, &fp32);
  print_message("this CPU: VDPBF16PS %.1f, fp32 FMA %.1f GFLOP/s; warned %d time(s)%s%s\n", bf16,
                fp32, g_warnings, g_warnings ? ": " : "", g_warning);
  assert_true(g_warnings <= 1);
  /* far from the threshold both measurements agree (a rate between 0.6 and 0.9 of fp32's could
   * fall either side of it twice) */
  if (bf16 < 0.6 * fp32 || bf16 > 0.9 * fp32)
    assert_int_equal(g_warnings, kiln_bf16_slower(bf16, fp32, kiln_amx_bf16_supported()) ? 1 : 0);
}

static void test_precision_names(void **state) {
  (void)state;
  kiln_config cfg;
  kiln_config_init(&cfg);
  assert_int_equal(cfg.precision, KILN_PRECISION_DEFAULT);
  assert_int_equal(kiln_config_set_precision(&cfg, "bf16", "--precision"), KILN_OK);
  assert_int_equal(cfg.precision, KILN_PRECISION_BF16);
  assert_int_equal(kiln_config_set_precision(&cfg, "fp32", "--precision"), KILN_OK);
  assert_int_equal(cfg.precision, KILN_PRECISION_FP32);
  assert_int_equal(kiln_config_set_precision(&cfg, "fp16", "KILN_PRECISION"), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "KILN_PRECISION: unknown precision 'fp16'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_slow_rate_warned), /* first: the note is once a process */
      cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_bf16_gemm_against_rounded_reference),
      cmocka_unit_test(test_bf16_small_gemm_stays_fp32),
      cmocka_unit_test(test_bf16_packed_gemm),
      cmocka_unit_test(test_bf16_conv_against_rounded_reference),
      cmocka_unit_test(test_bf16_attention),
      cmocka_unit_test(test_bf16_net_gradients),
      cmocka_unit_test(test_bf16_refused_off_the_host),
      cmocka_unit_test(test_precision_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
