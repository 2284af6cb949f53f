/* Measures this machine's single-precision GEMM rate through the same CBLAS kiln uses (square
 * matrices, best of several runs), the figure `make bench` quotes kiln's achieved GFLOP/s against.
 * Usage: kiln-gemm-peak [threads] [size] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/core.h"

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  int n = argc > 2 ? atoi(argv[2]) : 1536;
  if (threads < 1 || n < 64) {
    fprintf(stderr, "usage: kiln-gemm-peak [threads >= 1] [size >= 64]\n");
    return 2;
  }
  kiln_set_num_threads(threads);
  float *a = kiln_alloc(sizeof(float) * (size_t)n * n), *b = kiln_alloc(sizeof(float) * (size_t)n * n),
        *c = kiln_alloc(sizeof(float) * (size_t)n * n);
  if (!a || !b || !c) return 1;
  kiln_rng r;
  kiln_rng_seed(&r, 1, 1);
  for (size_t i = 0; i < (size_t)n * n; i++) {
    a[i] = kiln_rng_uniform(&r, -1, 1);
    b[i] = kiln_rng_uniform(&r, -1, 1);
  }
  double best = 1e30;
  for (int rep = 0; rep < 6; rep++) {
    double t0 = kiln_now_ms();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double dt = kiln_now_ms() - t0;
    if (rep > 0 && dt < best) best = dt; /* the first run warms caches and threads */
  }
  printf("%.1f\n", 2.0 * n * n * (double)n / (best * 1e6));
  kiln_free(a);
  kiln_free(b);
  kiln_free(c);
  return 0;
}
