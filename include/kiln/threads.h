/* The kernels' threads: how many, and how they treat subnormal floats. */
#ifndef KILN_THREADS_H
#define KILN_THREADS_H

#include <stdbool.h>

/* Sets the threads used by kernels (OpenMP) and by the BLAS library together. */
void kiln_set_num_threads(int n);
int kiln_get_num_threads(void);

/* flush: subnormal results are flushed to zero and subnormal inputs read as zero (the SSE/AVX
 * control register's FTZ and DAZ bits) on the calling thread and on every OpenMP thread, and so
 * on the threads they start later, which inherit the bits; false: IEEE arithmetic again. Many
 * x86 processors take a microcode assist of about a hundred cycles for each subnormal operand,
 * which a net whose gradients fade towards zero meets in every layer. Called once by the tools
 * before any kernel runs (kiln_config.keep_denormals); the library never calls it. Returns
 * whether this processor has the bits (false elsewhere: nothing changes). */
bool kiln_set_flush_denormals(bool flush);

#endif
