/* The emulated CUDA backend's own declarations (src/cuda/emu). */
#ifndef KILN_CUDA_EMU_EMU_H
#define KILN_CUDA_EMU_EMU_H

#include "kiln/backend.h"

/* Frees what the op that just returned took as scratch. */
void kiln_cudaemu_op_done(void);

/* Each family's kernels into the table (src/cuda/<family>.cu built as C). */
#define KCUDA_FAMILIES(X) \
  X(elementwise) X(matmul) X(conv) X(neuron) X(norm) X(l2norm) X(loss) X(arrange) X(sequence) \
  X(solver)
#define KCUDA_EMU_REGISTER_DECL_(family) void kiln_cudaemu_register_##family(kiln_backend *b);
KCUDA_FAMILIES(KCUDA_EMU_REGISTER_DECL_)
#undef KCUDA_EMU_REGISTER_DECL_

#endif
