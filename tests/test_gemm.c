/* kiln_sgemm and kiln_packed_gemm (src/ops/gemm.c): every transpose, alpha, beta and leading
 * dimension against a product summed in double, on shapes below and above the size where the
 * oneDNN route takes over, through kiln_sgemm's choice, OpenBLAS alone and oneDNN alone; the same bits on 1, 2 and
 * 3 threads for the products kiln sends to oneDNN; a plan's packed operand following set_b. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/ops.h"

typedef struct {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  int64_t pad; /* added to every leading dimension */
} shape;

typedef struct {
  float *A, *B, *C;
  int64_t lda, ldb, ldc;
} operands;

static float *filled(int64_t n, kiln_rng *r) {
  float *p = malloc(sizeof(float) * (size_t)n);
  assert_non_null(p);
  for (int64_t i = 0; i < n; i++) p[i] = kiln_rng_uniform(r, -1, 1);
  return p;
}

/* A is M x K after op (stored K x M when transposed), B is K x N after op. */
static operands make(const shape *s, uint64_t seed) {
  kiln_rng r;
  kiln_rng_seed(&r, seed, 3);
  operands o;
  o.lda = (s->ta ? s->M : s->K) + s->pad;
  o.ldb = (s->tb ? s->K : s->N) + s->pad;
  o.ldc = s->N + s->pad;
  o.A = filled((s->ta ? s->K : s->M) * o.lda, &r);
  o.B = filled((s->tb ? s->N : s->K) * o.ldb, &r);
  o.C = filled(s->M * o.ldc, &r);
  return o;
}

static void release(operands *o) {
  free(o->A);
  free(o->B);
  free(o->C);
}

static double a_at(const shape *s, const operands *o, int64_t m, int64_t k) {
  return s->ta ? o->A[k * o->lda + m] : o->A[m * o->lda + k];
}
static double b_at(const shape *s, const operands *o, int64_t k, int64_t n) {
  return s->tb ? o->B[n * o->ldb + k] : o->B[k * o->ldb + n];
}

/* Checks got (the C after the call) against alpha op(A) op(B) + beta C0 summed in double, and
 * that the padding columns of C were left alone. C0 is the C before the call. */
static void check(const char *what, const shape *s, const operands *o, const float *C0,
                  const float *got) {
  for (int64_t m = 0; m < s->M; m++) {
    for (int64_t n = 0; n < s->N; n++) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < s->K; k++) {
        const double p = a_at(s, o, m, k) * b_at(s, o, k, n);
        sum += p;
        mag += fabs(p);
      }
      const double want = s->alpha * sum + (s->beta != 0 ? s->beta * C0[m * o->ldc + n] : 0);
      const double tol = 1e-5 * (fabs(s->alpha) * mag + fabs(s->beta * C0[m * o->ldc + n])) + 1e-6;
      const double g = got[m * o->ldc + n];
      if (!(fabs(g - want) <= tol))
        fail_msg("%s: %lldx%lldx%lld ta=%d tb=%d alpha=%g beta=%g pad=%lld: C[%lld][%lld] = %.9g, "
                 "expected %.9g",
                 what, (long long)s->M, (long long)s->N, (long long)s->K, s->ta, s->tb, s->alpha,
                 s->beta, (long long)s->pad, (long long)m, (long long)n, g, want);
    }
    for (int64_t n = s->N; n < o->ldc; n++)
      assert_true(got[m * o->ldc + n] == C0[m * o->ldc + n]);
  }
}

static void run(const kiln_config *cfg, const shape *s, operands *o) {
  kiln_sgemm(cfg, s->ta, s->tb, s->M, s->N, s->K, s->alpha, o->A, o->lda, o->B, o->ldb, s->beta,
             o->C, o->ldc);
}

/* Below and above 2^19 multiply-adds, every transpose, alpha and beta, tight and padded. */
static void test_sgemm_matches_double_reference(void **state) {
  (void)state;
  kiln_config ref;
  kiln_config_init(&ref);
  ref.engine = KILN_ENGINE_REF;
  const int64_t sizes[][3] = {{5, 7, 3}, {32, 256, 64}, {33, 130, 200}, {64, 300, 96}};
  const float alphas[] = {1.0f, -0.5f}, betas[] = {0.0f, 1.0f, 0.25f};
  int cases = 0;
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (int t = 0; t < 4; t++)
      for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
          for (int64_t pad = 0; pad <= 3; pad += 3) {
            shape s = {sizes[z][0], sizes[z][1], sizes[z][2], t & 1, (t >> 1) & 1,
                       alphas[a],   betas[b],    pad};
            for (int route = 0; route < 3; route++) {
              operands o = make(&s, (uint64_t)(z * 100 + t * 10 + b));
              const int64_t nc = s.M * o.ldc;
              float *C0 = malloc(sizeof(float) * (size_t)nc);
              assert_non_null(C0);
              memcpy(C0, o.C, sizeof(float) * (size_t)nc);
              static const char *const names[] = {"kiln_sgemm", "openblas", "onednn"};
              if (route < 2)
                run(route ? &ref : NULL, &s, &o);
              else if (kiln_dnnl_available()) /* a build without oneDNN has no such route */
                assert_true(kiln_sgemm_onednn(s.ta, s.tb, s.M, s.N, s.K, s.alpha, o.A, o.lda,
                                              o.B, o.ldb, s.beta, o.C, o.ldc));
              if (route < 2 || kiln_dnnl_available()) check(names[route], &s, &o, C0, o.C);
              free(C0);
              release(&o);
              cases++;
            }
          }
  assert_int_equal(cases, 4 * 4 * 2 * 3 * 2 * 3);
}

/* beta 0 overwrites C whatever it held, NaN included, on both routes. */
static void test_sgemm_beta_zero_ignores_c(void **state) {
  (void)state;
  const shape s = {64, 512, 64, false, true, 1.0f, 0.0f, 0};
  operands o = make(&s, 9);
  float *clean = malloc(sizeof(float) * (size_t)(s.M * o.ldc));
  assert_non_null(clean);
  for (int64_t i = 0; i < s.M * o.ldc; i++) o.C[i] = NAN;
  run(NULL, &s, &o);
  memcpy(clean, o.C, sizeof(float) * (size_t)(s.M * o.ldc));
  for (int64_t i = 0; i < s.M * o.ldc; i++) assert_false(isnan(clean[i]));
  free(clean);
  release(&o);
}

/* The products kiln routes to oneDNN (A as it lies, at least 2^19 multiply-adds) give the same
 * bits on 1, 2 and 3 threads: multi-worker runs compare bits against one process with another
 * thread count. */
static void test_sgemm_thread_count_independent(void **state) {
  (void)state;
  const int saved = kiln_get_num_threads();
  const shape shapes[] = {{32, 2048, 512, false, true, 1.0f, 1.0f, 0},
                          {32, 512, 2048, false, false, 1.0f, 0.0f, 0},
                          {640, 512, 512, false, true, 1.0f, 0.0f, 0},
                          {4096, 10, 512, false, true, 1.0f, 0.0f, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    float *first = NULL;
    for (int threads = 1; threads <= 3; threads++) {
      kiln_set_num_threads(threads);
      operands o = make(s, 77);
      run(NULL, s, &o);
      const size_t bytes = sizeof(float) * (size_t)(s->M * o.ldc);
      if (threads == 1) {
        first = malloc(bytes);
        assert_non_null(first);
        memcpy(first, o.C, bytes);
      } else if (memcmp(first, o.C, bytes)) {
        fail_msg("%lldx%lldx%lld: %d threads differ from 1", (long long)s->M, (long long)s->N,
                 (long long)s->K, threads);
      }
      release(&o);
    }
    free(first);
  }
  kiln_set_num_threads(saved);
}

/* A plan computes A op(B) + beta C for each A it is given, with the B of the latest set_b; update
 * keeps a plan of the same shape and replaces one of another. */
static void test_plan_follows_set_b(void **state) {
  (void)state;
  const shape shapes[] = {{32, 1024, 256, false, true, 1.0f, 1.0f, 0},
                          {32, 256, 1024, false, false, 1.0f, 0.0f, 0},
                          {4, 6, 5, false, true, 1.0f, 1.0f, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    kiln_packed_gemm *plan = NULL;
    assert_int_equal(kiln_packed_gemm_update(&plan, NULL, s->tb, s->M, s->N, s->K, s->K,
                                             s->tb ? s->K : s->N, s->beta, s->N),
                     KILN_OK);
    assert_non_null(plan);
    kiln_packed_gemm *same = plan;
    assert_int_equal(kiln_packed_gemm_update(&plan, NULL, s->tb, s->M, s->N, s->K, s->K,
                                             s->tb ? s->K : s->N, s->beta, s->N),
                     KILN_OK);
    assert_ptr_equal(plan, same);
    for (int round = 0; round < 3; round++) {
      operands o = make(s, 100 + (uint64_t)round);
      float *C0 = malloc(sizeof(float) * (size_t)(s->M * s->N));
      assert_non_null(C0);
      memcpy(C0, o.C, sizeof(float) * (size_t)(s->M * s->N));
      kiln_packed_gemm_set_b(plan, o.B);
      /* two A against the same packed B */
      kiln_packed_gemm_run(plan, o.A, o.C);
      check("plan", s, &o, C0, o.C);
      kiln_rng r;
      kiln_rng_seed(&r, 5, (uint64_t)round);
      for (int64_t k = 0; k < s->M * s->K; k++) o.A[k] = kiln_rng_uniform(&r, -1, 1);
      memcpy(o.C, C0, sizeof(float) * (size_t)(s->M * s->N));
      kiln_packed_gemm_run(plan, o.A, o.C);
      check("plan, second A", s, &o, C0, o.C);
      free(C0);
      release(&o);
    }
    /* another shape replaces it */
    assert_int_equal(kiln_packed_gemm_update(&plan, NULL, s->tb, s->M + 1, s->N, s->K, s->K,
                                             s->tb ? s->K : s->N, s->beta, s->N),
                     KILN_OK);
    assert_non_null(plan);
    kiln_packed_gemm_destroy(plan);
  }
  kiln_packed_gemm_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgemm_matches_double_reference),
      cmocka_unit_test(test_sgemm_beta_zero_ignores_c),
      cmocka_unit_test(test_sgemm_thread_count_independent),
      cmocka_unit_test(test_plan_follows_set_b),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
