/* The one-BLAS-thread guard that kernels running their own OpenMP loops around GEMM calls share
 * (convolution, attention); see kiln_blas_serial_begin in include/kiln/ops.h for why. */
#include <cblas.h>

#include "kiln/ops.h"

int kiln_blas_serial_begin(void) {
  if (openblas_get_parallel() == 0) return 0;
  int prev = openblas_get_num_threads();
  if (prev > 1) openblas_set_num_threads(1);
  return prev;
}

void kiln_blas_serial_end(int prev) {
  if (prev > 1) openblas_set_num_threads(prev);
}
