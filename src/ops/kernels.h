/* The kernels behind the backend tables (include/kiln/backend.h), for src/ops only: every op's
 * reference kernel is kiln_ref_<op>; the cpu backend's table starts from them and replaces
 * those it has a faster form of (backend.c). */
#ifndef KILN_OPS_KERNELS_H
#define KILN_OPS_KERNELS_H

#include "kiln/backend.h"

#define KILN_REF_DECL_(name, params, args) int kiln_ref_##name params;
KILN_OP_LIST(KILN_REF_DECL_)
#undef KILN_REF_DECL_

/* The cpu backend's own kernels, where they differ from the reference's. */
int kiln_cpu_gemm(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                  const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, float beta);

int kiln_cpu_conv_route_update(const kiln_op_ctx *c, kiln_conv_route **route,
                               const kiln_conv_spec *spec, kiln_conv_route_info *info);

/* The sequence family's (src/ops/sequence.c, src/ops/attention.c). */
int kiln_cpu_packed_gemm_update(const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M,
                                int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                                float beta);
int kiln_cpu_gemm_rows(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                       const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                       int64_t K, float alpha, float beta);

/* The cpu-bf16 backend's (src/ops/bf16.c, conv_route.c). */
int kiln_bf16_gemm(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                   const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, float beta);
int kiln_bf16_gemm_rows(const kiln_op_ctx *c, float *C, int64_t ldc, const float *A, int64_t lda,
                        const float *B, int64_t ldb, bool ta, bool tb, int64_t M, int64_t N,
                        int64_t K, float alpha, float beta);
int kiln_bf16_packed_gemm_update(const kiln_op_ctx *c, kiln_packed_gemm **pg, bool tb, int64_t M,
                                 int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                                 float beta);
int kiln_bf16_attention_fwd(const kiln_op_ctx *c, float *ctx, float *probs, const float *q,
                            const float *k, const float *v, const float *valid, int T, int S,
                            int N, int H, int hd, float scale, bool causal);
int kiln_bf16_attention_bwd(const kiln_op_ctx *c, float *dq, float *dk, float *dv, float *work,
                            const float *dctx, const float *probs, const float *q, const float *k,
                            const float *v, int T, int S, int N, int H, int hd, float scale);
int kiln_bf16_conv_route_update(const kiln_op_ctx *c, kiln_conv_route **route,
                                const kiln_conv_spec *spec, kiln_conv_route_info *info);

/* Runs `stmt` (calls into OpenBLAS or oneDNN) on the op's threads. With c->nthreads 1 both run
 * on one thread for this call alone: OpenBLAS is held to one (kiln_blas_serial_begin, restored
 * after) and, where OpenMP would still give more, the call runs in a team of one whose own
 * thread count is 1, which is what oneDNN reads; nothing outlives the call. Otherwise the
 * libraries' threads are the process's. Needs <omp.h>. */
#define KILN_ON_OP_THREADS(c, stmt)                                                             \
  do {                                                                                         \
    if ((c)->nthreads == 1) {                                                                  \
      const int blas_prev_ = kiln_blas_serial_begin();                                         \
      if (omp_get_max_threads() > 1) {                                                         \
        _Pragma("omp parallel num_threads(1)") {                                               \
          omp_set_num_threads(1);                                                              \
          stmt;                                                                                \
        }                                                                                      \
      } else {                                                                                 \
        stmt;                                                                                  \
      }                                                                                        \
      kiln_blas_serial_end(blas_prev_);                                                        \
    } else {                                                                                   \
      stmt;                                                                                    \
    }                                                                                          \
  } while (0)

/* Element-wise loops run on the op's threads from this many elements up: below it a parallel
 * region costs more than it saves. */
#define KILN_PARALLEL_FROM 32768

#endif
