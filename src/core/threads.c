/* One knob for the threads of kernels (OpenMP) and of OpenBLAS, so the two never oversubscribe. */
#include <omp.h>

#include "kiln/core.h"

void openblas_set_num_threads(int num_threads);

void kiln_set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int kiln_get_num_threads(void) { return omp_get_max_threads(); }
