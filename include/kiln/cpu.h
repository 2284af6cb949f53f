/* The processor's arithmetic limit: the single-precision fused multiply-add rate of its vector
 * units, measured with register-only loops. Two users: `kiln-fma-peak`, whose figure every
 * ratio in docs/PERF.md divides by, and CE's machine class, which needs to know whether the
 * 512-bit FMAs run at twice the rate of the 256-bit ones (two full-width pipes) or at the same
 * rate (one pipe, or 512-bit work split over two 256-bit halves): hosts that report the same
 * CPU model can differ there, and their timings by up to two times. */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include <stdbool.h>

/* Vector widths of the FMA loops, in multiply-adds an instruction: fp32 lanes, or for
 * AVX512-BF16's VDPBF16PS the 32 bf16 products of its 16 fp32 lanes. */
enum { KILN_FMA_AVX2 = 8, KILN_FMA_AVX512 = 16, KILN_FMA_AVX512_BF16 = 32 };

/* Whether this CPU runs the loop of `lanes` lanes (8: AVX2 and FMA; 16: AVX-512F; 32:
 * AVX-512F with AVX512-BF16); false for any other width and on processors other than x86-64. */
bool kiln_fma_supported(int lanes);
/* Whether the CPU has AMX-BF16 tiles (CPUID leaf 7, EDX bit 22); false off x86-64. */
bool kiln_amx_bf16_supported(void);

/* The loop's rounds that take about `seconds` on one thread (from a short calibration run);
 * 0 when the loop is not supported. */
long kiln_fma_calibrate(int lanes, double seconds);

/* GFLOP/s of `threads` threads (1..256) each running `rounds` rounds of twelve independent FMA
 * chains of `lanes` lanes at once, started together; the best of `reps` runs. 0 when the loop
 * is not supported or a thread cannot be started. */
double kiln_fma_gflops(int lanes, int threads, long rounds, int reps);

#endif
