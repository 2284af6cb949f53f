/* Measures this machine's single-precision fused multiply-add peak: the limit any implementation
 * of the same arithmetic runs into, which docs/PERF.md quotes kiln's achieved GFLOP/s against (a
 * library's GEMM rate is a lower, implementation-dependent figure). The loops are the library's
 * (src/core/cpu_peak.c, which CE's machine class uses too), in AVX2 (8 lanes) and AVX-512 (16
 * lanes), and AVX512-BF16's VDPBF16PS (32 bf16 products an instruction: bf16 training's limit)
 * where the CPU has them, on one thread and on one thread per online CPU at once (the
 * all-core figure: shared cores, frequency and power limits show there). Best of five runs each.
 * Then the limit of the layers that do a few operations an element (BatchNorm, Scale, ReLU,
 * Eltwise, Split): the rate at which one pass over a chain of activation-sized buffers, each
 * written from the one before (y = a x + b), moves data through memory, the bytes read and
 * written counted, on one thread and on all.
 * Usage: kiln-fma-peak [seconds per run] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kiln/cpu.h"
#include "kiln/memory.h"
#include "kiln/system.h"

/* Buffers of 8 MiB (a 16-channel 32 x 32 activation at batch 128), 32 of them: 256 MiB, more
 * than a last-level cache, as a training step's activations are. */
enum { STREAM_BUFS = 32 };
#define STREAM_FLOATS ((int64_t)2 << 20)

/* GB/s of one pass down the chain on `threads` threads, the best of `reps`. */
static double stream_gbs(float *const *buf, int threads, int reps) {
  double best = 0;
  for (int r = 0; r < reps; r++) {
    const double t0 = kiln_now_ms();
    for (int j = 0; j + 1 < STREAM_BUFS; j++) {
      const float *x = buf[j];
      float *y = buf[j + 1];
#pragma omp parallel for simd schedule(static) num_threads(threads)
      for (int64_t i = 0; i < STREAM_FLOATS; i++) y[i] = 0.5f * x[i] + 0.25f;
    }
    const double ms = kiln_now_ms() - t0;
    const double gbs = (STREAM_BUFS - 1) * STREAM_FLOATS * 8.0 / (ms * 1e6);
    if (gbs > best) best = gbs;
  }
  return best;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0.5;
  if (!(seconds > 0) || seconds > 60) {
    fprintf(stderr, "usage: kiln-fma-peak [seconds per run, 0 < s <= 60]\n");
    return 2;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int cpus = online < 1 ? 1 : online > 256 ? 256 : (int)online;
  const struct {
    int lanes;
    const char *isa;
  } kinds[] = {{KILN_FMA_AVX2, "AVX2"}, {KILN_FMA_AVX512, "AVX-512"},
               {KILN_FMA_AVX512_BF16, "BF16"}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    if (!kiln_fma_supported(kinds[k].lanes)) {
      printf("%-8s (%2d-lane FMA): not on this CPU\n", kinds[k].isa, kinds[k].lanes);
      continue;
    }
    const long rounds = kiln_fma_calibrate(kinds[k].lanes, seconds);
    const double one = kiln_fma_gflops(kinds[k].lanes, 1, rounds, 5);
    const double all = kiln_fma_gflops(kinds[k].lanes, cpus, rounds, 5);
    printf("%-8s (%2d-lane %s, 12 chains): %.1f GFLOP/s on 1 thread, %.1f on %d threads "
           "(%.1f a thread)\n",
           kinds[k].isa, kinds[k].lanes, kinds[k].lanes == KILN_FMA_AVX512_BF16 ? "VDPBF16PS" : "FMA",
           one, all, cpus, all / cpus);
  }
  float *buf[STREAM_BUFS];
  for (int j = 0; j < STREAM_BUFS; j++) {
    buf[j] = kiln_alloc(sizeof(float) * (size_t)STREAM_FLOATS);
    if (!buf[j]) {
      fprintf(stderr, "kiln-fma-peak: no memory for the stream buffers\n");
      return 1;
    }
#pragma omp parallel for schedule(static) num_threads(cpus)
    for (int64_t i = 0; i < STREAM_FLOATS; i++) buf[j][i] = (float)(i % 1000) * 1e-3f;
  }
  const double one = stream_gbs(buf, 1, 5), all = stream_gbs(buf, cpus, 5);
  printf("memory   (y = a x + b down %d buffers of 8 MiB, bytes read and written): %.1f GB/s on 1 "
         "thread, %.1f on %d threads\n",
         STREAM_BUFS, one, all, cpus);
  for (int j = 0; j < STREAM_BUFS; j++) kiln_free(buf[j]);
  return 0;
}
