/* kiln-gemm-routes: one GEMM shape through OpenBLAS (the reference route), through oneDNN's
 * matmul, and through kiln_sgemm's choice between them (src/ops/gemm.c), best of R repetitions
 * in ms and GFLOP/s. It is the measurement behind the rule kiln_sgemm follows
 * (docs/PERF.md); not a test.
 *
 *   kiln-gemm-routes THREADS M N K TA TB [BETA [REPS]]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/core.h"
#include "kiln/ops.h"

static double best_ms(const kiln_config *cfg, bool onednn, int reps, bool ta, bool tb, int64_t M, int64_t N,
                      int64_t K, const float *a, const float *b, float beta, float *c) {
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  double best = 1e30;
  for (int rep = 0; rep <= reps; rep++) { /* the first run warms caches, threads and the JIT */
    double t0 = kiln_now_ms();
    if (!onednn)
      kiln_sgemm(cfg, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, c, N);
    else if (!kiln_sgemm_onednn(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, c, N))
      return NAN;
    double dt = kiln_now_ms() - t0;
    if (rep > 0 && dt < best) best = dt;
  }
  return best;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s THREADS M N K TA TB [BETA [REPS]]\n", argv[0]);
    return 2;
  }
  int threads = atoi(argv[1]);
  int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
  bool ta = atoi(argv[5]), tb = atoi(argv[6]);
  float beta = argc > 7 ? (float)atof(argv[7]) : 0.0f;
  int reps = argc > 8 ? atoi(argv[8]) : 20;
  if (threads < 1 || M < 1 || N < 1 || K < 1 || reps < 1) {
    fprintf(stderr, "%s: THREADS, M, N, K and REPS must be positive\n", argv[0]);
    return 2;
  }
  kiln_set_num_threads(threads);
  float *a = kiln_alloc(sizeof(float) * (size_t)(M * K)), *b = kiln_alloc(sizeof(float) * (size_t)(K * N)),
        *c = kiln_alloc(sizeof(float) * (size_t)(M * N));
  if (!a || !b || !c) return 1;
  kiln_rng r;
  kiln_rng_seed(&r, 1, 1);
  for (int64_t i = 0; i < M * K; i++) a[i] = kiln_rng_uniform(&r, -1, 1);
  for (int64_t i = 0; i < K * N; i++) b[i] = kiln_rng_uniform(&r, -1, 1);
  for (int64_t i = 0; i < M * N; i++) c[i] = 0;
  kiln_config ref;
  kiln_config_init(&ref);
  ref.engine = KILN_ENGINE_REF;
  double gflop = 2.0 * (double)M * (double)N * (double)K * 1e-9;
  double t_blas = best_ms(&ref, false, reps, ta, tb, M, N, K, a, b, beta, c);
  double t_dnnl = best_ms(NULL, true, reps, ta, tb, M, N, K, a, b, beta, c);
  double t_auto = best_ms(NULL, false, reps, ta, tb, M, N, K, a, b, beta, c);
  printf("%lld x %lld x %lld ta=%d tb=%d beta=%g threads=%d: openblas %.3f ms %.1f GFLOP/s, "
         "onednn %.3f ms %.1f GFLOP/s, kiln_sgemm %.3f ms %.1f GFLOP/s\n",
         (long long)M, (long long)N, (long long)K, ta, tb, beta, threads, t_blas,
         gflop / t_blas * 1e3, t_dnnl, gflop / t_dnnl * 1e3, t_auto, gflop / t_auto * 1e3);
  kiln_free(a);
  kiln_free(b);
  kiln_free(c);
  return 0;
}
