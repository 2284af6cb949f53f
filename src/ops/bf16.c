/* The cpu-bf16 backend's own kernels (include/kiln/backend.h): mixed-precision products. Every
 * product of the table's gemm, gemm_rows and packed GEMMs rounds its operands to bfloat16 and
 * sums in fp32 through oneDNN's bf16 matmul (gemm.c); its convolutions are oneDNN's bf16
 * primitives (conv_route.c, conv_dnnl.c). Everything else in the table is cpu's, in fp32.
 * Products under KILN_BF16_MIN_MACS, products called from inside a parallel region, and shapes
 * oneDNN has no JIT kernel for run cpu's fp32 kernels: more exact, and for those faster. */
#include <omp.h>
#include <pthread.h>

#include "kiln/cpu.h"
#include "kiln/ops.h"
#include "ops/kernels.h"
#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

void kiln_bf16_from_f32(uint16_t *y, const float *x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = kiln_bf16_of(x[i]);
}

bool kiln_bf16_slower(double bf16_gflops, double fp32_gflops, bool amx) {
  return !amx && bf16_gflops > 0 && fp32_gflops > 0 && bf16_gflops < 0.75 * fp32_gflops;
}

/* Once a process: where VDPBF16PS runs at under three quarters of the fp32 FMAs' rate and there
 * is no AMX (Intel's family 6 model 207 without AMX exposed: 86 against 176 GFLOP/s a core),
 * bf16 products are slower than fp32 ones, and a user asking for bf16 for speed is told. A few
 * milliseconds of the FMA loops. */
void kiln_bf16_rates(double *bf16, double *fp32) {
  const long r16 = kiln_fma_calibrate(KILN_FMA_AVX512, 0.002);
  const long r32 = kiln_fma_calibrate(KILN_FMA_AVX512_BF16, 0.002);
  *fp32 = r16 > 0 ? kiln_fma_gflops(KILN_FMA_AVX512, 1, r16, 3) : 0;
  *bf16 = r32 > 0 ? kiln_fma_gflops(KILN_FMA_AVX512_BF16, 1, r32, 3) : 0;
}

static void bf16_rate_once(void) {
  double bf16, fp32;
  kiln_bf16_rates(&bf16, &fp32);
  if (kiln_bf16_slower(bf16, fp32, kiln_amx_bf16_supported()))
    kiln_log(KILN_LOG_WARN,
             "precision BF16: this CPU's bf16 dot products (VDPBF16PS) run at %.0f GFLOP/s a "
             "core and its fp32 FMAs at %.0f (measured now), and it has no AMX: bf16 trains "
             "slower than fp32 here",
             bf16, fp32);
}

void kiln_bf16_rate_note(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, bf16_rate_once);
}

int kiln_bf16_check(void) {
#ifndef KILN_HAVE_DNNL
  return kiln_errorf(KILN_ERR_UNSUPPORTED,
                     "precision BF16 runs on oneDNN's bf16 kernels, and this build of kiln has no "
                     "oneDNN (KILN_WITH_DNNL=OFF)");
#else
  if (!kiln_fma_supported(KILN_FMA_AVX512_BF16))
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "precision BF16 needs a CPU with AVX512_BF16 (the VDPBF16PS instruction) "
                       "or AMX-BF16, and this one has neither; kiln does not emulate bf16 (it "
                       "would be slower than fp32): train in fp32");
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
    const char *name = isa == dnnl_cpu_isa_avx512_core_vnni ? "AVX512_CORE_VNNI"
                       : isa == dnnl_cpu_isa_avx512_core    ? "AVX512_CORE"
                       : isa == dnnl_cpu_isa_avx2_vnni      ? "AVX2_VNNI"
                       : isa == dnnl_cpu_isa_avx2           ? "AVX2"
                                                            : "an older instruction set";
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "precision BF16 needs AVX512_BF16 (or AMX-BF16): the CPU has it, but "
                       "oneDNN may use only %s here (DNNL_MAX_CPU_ISA?), so its bf16 kernels "
                       "would be an emulation; kiln does not run one: train in fp32",
                       name);
  }
  return KILN_OK;
#endif
}

/* bf16 where the product is large enough and runs outside a parallel region, else cpu's fp32. */
int kiln_bf16_gemm(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                   const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, float beta) {
  bool done = false;
  if (M * N * K >= KILN_BF16_MIN_MACS && !omp_in_parallel())
    KILN_ON_OP_THREADS(c, done = kiln_sgemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                                 ldc));
  if (done) return KILN_OK;
  return kiln_cpu_gemm(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
}

/* The projections of attention: as gemm_rows' cpu kernel, whole products in bf16. */
int kiln_bf16_gemm_rows(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                        const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                        int64_t K, float alpha, float beta) {
  if (M * N * K >= KILN_BF16_MIN_MACS)
    return kiln_bf16_gemm(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
  return kiln_cpu_gemm_rows(c, C, ldc, A, lda, B, ldb, ta, tb, M, N, K, alpha, beta);
}

int kiln_bf16_packed_gemm_update(const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M,
                                 int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                                 float beta) {
  int rc = KILN_OK;
  /* made on the threads it will run on, as cpu's */
  KILN_ON_OP_THREADS(c, rc = kiln_packed_gemm_update_bf16(pg, c->config, tb, M, N, K, lda, ldb,
                                                          beta, ldc));
  return rc;
}
