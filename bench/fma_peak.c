/* Measures this machine's single-precision fused multiply-add peak: the limit any implementation
 * of the same arithmetic runs into, which docs/PERF.md quotes kiln's achieved GFLOP/s against (a
 * library's GEMM rate is a lower, implementation-dependent figure). The loops are the library's
 * (src/core/cpu_peak.c, which CE's machine class uses too), in AVX2 (8 lanes) and AVX-512 (16
 * lanes), and AVX512-BF16's VDPBF16PS (32 bf16 products an instruction: bf16 training's limit)
 * where the CPU has them, on one thread and on one thread per online CPU at once (the
 * all-core figure: shared cores, frequency and power limits show there). Best of five runs each.
 * Usage: kiln-fma-peak [seconds per run] */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kiln/cpu.h"

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
  return 0;
}
