/* Measures this machine's single-precision fused multiply-add peak: the limit any implementation
 * of the same arithmetic runs into, which docs/PERF.md quotes kiln's achieved GFLOP/s against (a
 * library's GEMM rate is a lower, implementation-dependent figure). Register-only loops of twelve
 * independent FMA chains (enough in flight to cover the FMA latency on every core kiln has met),
 * in AVX2 (8 lanes) and AVX-512 (16 lanes) where the CPU has them, on one thread and on one
 * thread per online CPU at once (the all-core figure: shared cores, frequency and power limits
 * show there). Best of five runs each. The kernels carry their own target attributes, so the
 * figures do not depend on the flags the build was made with.
 * Usage: kiln-fma-peak [seconds per run] */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kiln/core.h"

enum { CHAINS = 12, INNER = 1000, MAX_THREADS = 256 };

/* The chains' values stay finite: x = x * a + b with a just below 1 converges to b / (1 - a). */
__attribute__((noinline, target("avx2,fma"))) static float run8(long rounds, float seed) {
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  __m256 x[CHAINS];
  for (int c = 0; c < CHAINS; c++) x[c] = _mm256_set1_ps(seed + (float)c);
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < INNER; i++)
#pragma GCC unroll 12
      for (int c = 0; c < CHAINS; c++) x[c] = _mm256_fmadd_ps(x[c], a, b);
  float sum = 0;
  for (int c = 0; c < CHAINS; c++) sum += _mm256_cvtss_f32(x[c]);
  return sum;
}

__attribute__((noinline, target("avx512f"))) static float run16(long rounds, float seed) {
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  __m512 x[CHAINS];
  for (int c = 0; c < CHAINS; c++) x[c] = _mm512_set1_ps(seed + (float)c);
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < INNER; i++)
#pragma GCC unroll 12
      for (int c = 0; c < CHAINS; c++) x[c] = _mm512_fmadd_ps(x[c], a, b);
  float sum = 0;
  for (int c = 0; c < CHAINS; c++) sum += _mm512_cvtss_f32(x[c]);
  return sum;
}

typedef struct {
  int lanes;
  long rounds;
  pthread_barrier_t *start;
  float sink;
} job;

static void *worker(void *arg) {
  job *j = arg;
  if (j->start) pthread_barrier_wait(j->start);
  j->sink = j->lanes == 16 ? run16(j->rounds, 1.0f) : run8(j->rounds, 1.0f);
  return NULL;
}

/* GFLOP/s of `threads` threads each running `rounds` rounds at once, best of five; 0 when a
 * thread cannot be started. */
static double measure(int lanes, int threads, long rounds, float *sink) {
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    pthread_t t[MAX_THREADS];
    job jobs[MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    int made = 0;
    for (; made < threads; made++) {
      jobs[made] = (job){.lanes = lanes, .rounds = rounds, .start = &start};
      if (pthread_create(&t[made], NULL, worker, &jobs[made]) != 0) break;
    }
    if (made < threads) { /* release the ones started, then give up */
      for (int i = made; i < threads; i++) pthread_barrier_wait(&start);
      for (int i = 0; i < made; i++) pthread_join(t[i], NULL);
      pthread_barrier_destroy(&start);
      return 0;
    }
    pthread_barrier_wait(&start);
    const double t0 = kiln_now_ms();
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    const double ms = kiln_now_ms() - t0;
    pthread_barrier_destroy(&start);
    for (int i = 0; i < threads; i++) *sink += jobs[i].sink;
    /* 2 FLOPs (multiply and add) per lane per FMA */
    const double gflops =
        2.0 * lanes * CHAINS * INNER * (double)rounds * threads / (ms * 1e6);
    if (gflops > best) best = gflops;
  }
  return best;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0.5;
  if (!(seconds > 0) || seconds > 60) {
    fprintf(stderr, "usage: kiln-fma-peak [seconds per run, 0 < s <= 60]\n");
    return 2;
  }
  __builtin_cpu_init();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int cpus = online < 1 ? 1 : online > MAX_THREADS ? MAX_THREADS : (int)online;
  const struct {
    int lanes;
    const char *isa;
    int have;
  } kinds[] = {{8, "AVX2", __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
               {16, "AVX-512", __builtin_cpu_supports("avx512f")}};
  float sink = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    if (!kinds[k].have) {
      printf("%-8s (%2d-lane FMA): not on this CPU\n", kinds[k].isa, kinds[k].lanes);
      continue;
    }
    /* rounds for the wanted duration, from a short calibration on one thread */
    long rounds = 1000;
    double t0 = kiln_now_ms();
    sink += kinds[k].lanes == 16 ? run16(rounds, 0.0f) : run8(rounds, 0.0f);
    const double ms = kiln_now_ms() - t0;
    if (ms > 0) rounds = (long)(rounds * seconds * 1e3 / ms) + 1;
    const double one = measure(kinds[k].lanes, 1, rounds, &sink);
    const double all = measure(kinds[k].lanes, cpus, rounds, &sink);
    printf("%-8s (%2d-lane FMA, %d chains): %.1f GFLOP/s on 1 thread, %.1f on %d threads "
           "(%.1f a thread)\n",
           kinds[k].isa, kinds[k].lanes, CHAINS, one, all, cpus, all / cpus);
  }
  if (sink != sink) printf("(values not finite)\n");
  return 0;
}
