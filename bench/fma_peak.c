/* Measures this core's single-precision fused multiply-add peak: the limit any implementation of
 * the same arithmetic runs into, which docs/PERF.md quotes kiln's achieved GFLOP/s against (a
 * library's GEMM rate is a lower, implementation-dependent figure). Twelve independent chains of
 * 16-lane vector FMAs (AVX-512 with -march=native on a CPU that has it; narrower vectors in a
 * portable build, which then measures that build's peak): enough chains in flight to cover the
 * FMA latency on every core kiln has met. One thread, best of several runs.
 * Usage: kiln-fma-peak [seconds per run] */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/core.h"

typedef float v16f __attribute__((vector_size(64)));

enum { CHAINS = 12, INNER = 1000 };

/* GCC's ISO C mode does not contract a * b + c into one FMA unless told; clang does it within an
 * expression by default. */
#if defined(__clang__)
#define FMA_FN __attribute__((noinline))
#else
#define FMA_FN __attribute__((noinline, optimize("fp-contract=fast")))
#endif

/* The chains' values stay finite: x = x * a + b with a just below 1 converges to b / (1 - a). */
FMA_FN static void run(v16f *acc, long rounds) {
  const v16f a = (v16f){0} + 0.999999f, b = (v16f){0} + 1e-6f;
  v16f x[CHAINS];
  for (int c = 0; c < CHAINS; c++) x[c] = acc[c];
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < INNER; i++)
#pragma GCC unroll 12
      for (int c = 0; c < CHAINS; c++) x[c] = x[c] * a + b;
  for (int c = 0; c < CHAINS; c++) acc[c] = x[c];
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0.5;
  if (!(seconds > 0) || seconds > 60) {
    fprintf(stderr, "usage: kiln-fma-peak [seconds per run, 0 < s <= 60]\n");
    return 2;
  }
  v16f acc[CHAINS];
  for (int c = 0; c < CHAINS; c++) acc[c] = (v16f){0} + (float)c;
  /* rounds for the wanted duration, from a short calibration */
  long rounds = 1000;
  double t0 = kiln_now_ms();
  run(acc, rounds);
  double ms = kiln_now_ms() - t0;
  if (ms > 0) rounds = (long)(rounds * seconds * 1e3 / ms) + 1;
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    t0 = kiln_now_ms();
    run(acc, rounds);
    ms = kiln_now_ms() - t0;
    /* 2 FLOPs (multiply and add) per lane per FMA */
    double gflops = 2.0 * 16 * CHAINS * INNER * (double)rounds / (ms * 1e6);
    if (gflops > best) best = gflops;
  }
  float sink = 0;
  for (int c = 0; c < CHAINS; c++) sink += acc[c][0];
  printf("%.1f GFLOP/s single-precision FMA peak, 1 thread (16-lane vectors, %d chains)%s\n", best,
         CHAINS, sink == sink ? "" : " (values not finite)");
  return 0;
}
