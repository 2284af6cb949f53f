/* The GPU side of the CUDA backend (src/cuda/gpu), for its own files. */
#ifndef KILN_CUDA_GPU_GPU_H
#define KILN_CUDA_GPU_GPU_H

#include <stddef.h>

#include "kiln/backend.h"

/* Makes d the calling thread's current CUDA device. */
void kiln_cuda_use(const kiln_device *d);

/* Each family's kernels into the table (src/cuda/<family>.cu built by nvcc). */
#define KCUDA_GPU_FAMILIES(X) \
  X(elementwise) X(matmul) X(conv) X(neuron) X(norm) X(l2norm) X(loss) X(arrange) X(sequence) \
  X(solver)
#define KCUDA_GPU_REGISTER_DECL_(family) void kiln_cuda_register_##family(kiln_backend *b);
KCUDA_GPU_FAMILIES(KCUDA_GPU_REGISTER_DECL_)
#undef KCUDA_GPU_REGISTER_DECL_

#endif
