/* src/cuda/l2norm.cu built as C: the emulated CUDA backend (src/cuda/kcuda.h). */
#define KCUDA_EMU
#include "../l2norm.cu"
