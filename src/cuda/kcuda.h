/* The CUDA backend's kernels, written once and built twice.
 *
 * Every file src/cuda/<family>.cu holds one family's kernels (KILN_OPS_<FAMILY> in
 * include/kiln/backend.h) and the op functions that launch them. nvcc builds them for the GPU
 * (cmake -DKILN_CUDA=ON: the "cuda" backend on the cuda device). The C compiler builds the same
 * files again with KCUDA_EMU defined (src/cuda/emu/<family>.c): each kernel becomes a function a
 * launch calls once for every thread of a small grid, in turn, on the host; that is the
 * "cudaemu" backend, on the hostsim device, which every machine builds and tests
 * (tests/test_backend_ops.c), so that the kernels' arithmetic and indexing are checked without
 * a GPU, and a copy the backend forgot faults on hostsim's walls.
 *
 * So the kernels keep to what both can run:
 *   - C that is also C++ (no implicit conversion from void *, no compound literals);
 *   - one flat index space a launch: KCUDA_FOR(i, n) is a grid-stride loop, each index's work
 *     independent of the others (no shared memory, no __syncthreads, no warp functions);
 *   - sums in an order fixed by the sizes (each thread sums its own values serially, a second
 *     launch sums those partial sums in order): the results never depend on the grid;
 *   - GEMMs through the backend's own gemm (cuBLAS on the GPU, the reference GEMM in the
 *     emulation).
 * Launches on the device's stream (kiln_device.queue) in the order the ops are called; an op
 * that must return a status read from device memory (a label out of range) waits for it. */
#ifndef KILN_CUDA_KCUDA_H
#define KILN_CUDA_KCUDA_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define KCUDA_EXTERN extern "C"
extern "C" {
#else
#define KCUDA_EXTERN
#endif
#include "kiln/backend.h"
#include "kiln/core.h"
#ifdef __cplusplus
}
#endif

/* Threads a block on the GPU, and the most blocks a launch takes (a grid-stride loop covers the
 * rest). */
#define KCUDA_BLOCK 256
#define KCUDA_MAX_GRID 65536

#ifdef KCUDA_EMU
/* The emulation: a grid of KCUDA_EMU_GRID blocks of KCUDA_EMU_BLOCK threads, run one after the
 * other. Odd sizes, so that a kernel that only works when each thread has one index, or whose
 * stride is wrong, shows. */
#define KCUDA_EMU_GRID 3
#define KCUDA_EMU_BLOCK 5
#define KCUDA_GLOBAL static
#define KCUDA_DEV static inline
#define KCUDA_FN(name) kiln_cudaemu_##name
#define KCUDA_REGISTER(family) void kiln_cudaemu_register_##family(kiln_backend *b)
/* the emulated thread's index and the grid's size, each file's own (an extern thread-local would
 * take the initial-exec model, which nvcc's link of a CUDA build refuses) */
static _Thread_local int64_t kcuda_i0_ __attribute__((unused)), kcuda_step_ __attribute__((unused));
#define KCUDA_I0 kcuda_i0_
#define KCUDA_STEP kcuda_step_
#define KCUDA_LAUNCH(c, n, kernel, ...)                                                        \
  do {                                                                                         \
    (void)(c);                                                                                 \
    const int64_t kn_ = (n);                                                                   \
    int64_t kg_ = (kn_ + KCUDA_EMU_BLOCK - 1) / KCUDA_EMU_BLOCK;                               \
    if (kg_ > KCUDA_EMU_GRID) kg_ = KCUDA_EMU_GRID;                                            \
    for (int64_t kb_ = 0; kb_ < kg_; kb_++)                                                    \
      for (int64_t kt_ = 0; kt_ < KCUDA_EMU_BLOCK; kt_++) {                                    \
        kcuda_i0_ = kb_ * KCUDA_EMU_BLOCK + kt_;                                               \
        kcuda_step_ = kg_ * KCUDA_EMU_BLOCK;                                                   \
        kernel(__VA_ARGS__);                                                                   \
      }                                                                                        \
  } while (0)
#else
#include <cuda_runtime.h>
#define KCUDA_GLOBAL static __global__
#define KCUDA_DEV static __device__ __forceinline__
#define KCUDA_FN(name) kiln_cuda_##name
#define KCUDA_REGISTER(family) KCUDA_EXTERN void kiln_cuda_register_##family(kiln_backend *b)
#define KCUDA_I0 ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define KCUDA_STEP ((int64_t)gridDim.x * blockDim.x)
#define KCUDA_LAUNCH(c, n, kernel, ...)                                                        \
  do {                                                                                         \
    const int64_t kn_ = (n);                                                                   \
    if (kn_ > 0) {                                                                             \
      int64_t kg_ = (kn_ + KCUDA_BLOCK - 1) / KCUDA_BLOCK;                                     \
      if (kg_ > KCUDA_MAX_GRID) kg_ = KCUDA_MAX_GRID;                                          \
      kernel<<<(unsigned)kg_, KCUDA_BLOCK, 0, (cudaStream_t)(c)->device->queue>>>(__VA_ARGS__); \
    }                                                                                          \
  } while (0)
#endif

/* An op: `KCUDA_OP(relu_fwd)(const kiln_op_ctx *c, ...)`, its parameters those of the op's row in
 * KILN_OP_LIST. */
#define KCUDA_OP(name) KCUDA_EXTERN int KCUDA_FN(name)

/* Each thread's indices of a launch of n: a grid-stride loop. */
#define KCUDA_FOR(i, n) for (int64_t i = KCUDA_I0; i < (int64_t)(n); i += KCUDA_STEP)

/* Every op of this build, so that one family's op can call another's (a convolution route's
 * GEMMs, a loss's softmax) directly, without the table. */
#define KCUDA_DECL_(name, params, args) KCUDA_EXTERN int KCUDA_FN(name) params;
KILN_OP_LIST(KCUDA_DECL_)
#undef KCUDA_DECL_

/* What the kernel files share: src/cuda/emu/runtime.c for the emulation, src/cuda/gpu/device.c
 * on the GPU; each build's own names, so that a binary can hold both. */
#define kcuda_launched KCUDA_FN(launched)
#define kcuda_scratch KCUDA_FN(scratch)
#define kcuda_host_scratch KCUDA_FN(host_scratch)
#ifdef __cplusplus
extern "C" {
#endif
/* The status of the launches just queued: KILN_OK, or the CUDA error naming `op`. */
int kcuda_launched(const kiln_op_ctx *c, const char *op);
/* Device memory of at least `bytes` for the op's own use until it returns (the emulation frees it
 * then; the GPU keeps one buffer a device, grown when asked for more, its users ordered by the
 * stream). An op takes one scratch buffer: a second call may move the first. */
int kcuda_scratch(const kiln_op_ctx *c, size_t bytes, void **out);
/* Host memory the device copies to and from directly (pinned on the GPU), likewise; for an op's
 * own small transfers (a status read back, a host generator's draws). */
int kcuda_host_scratch(const kiln_op_ctx *c, size_t bytes, void **out);
#ifdef __cplusplus
}
#endif

#ifndef KCUDA_EMU
/* The device's cuBLAS handle (a cublasHandle_t bound to its stream), its math mode set for the
 * op's configuration (TF32 only with kiln_config.tf32). */
KCUDA_EXTERN void *kiln_cuda_blas(const kiln_op_ctx *c);
#endif

/* Sums in double of `parts` consecutive chunks of KCUDA_CHUNK values: the first pass of the
 * deterministic reductions. */
#define KCUDA_CHUNK 256

#endif
