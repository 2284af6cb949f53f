/* src/cuda/loss.cu built as C: the emulated CUDA backend (src/cuda/kcuda.h). */
#define KCUDA_EMU
#include "../loss.cu"
