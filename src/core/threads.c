/* One knob for the threads of kernels (OpenMP) and of OpenBLAS, so the two never oversubscribe,
 * and one for their treatment of subnormal floats. */
#include <omp.h>
#if defined(__x86_64__) || defined(__SSE2__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#define KILN_HAVE_MXCSR 1
#endif

#include "kiln/core.h"

void openblas_set_num_threads(int num_threads);

void kiln_set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int kiln_get_num_threads(void) { return omp_get_max_threads(); }

#ifdef KILN_HAVE_MXCSR
static void set_mode(bool flush) {
  _MM_SET_FLUSH_ZERO_MODE(flush ? _MM_FLUSH_ZERO_ON : _MM_FLUSH_ZERO_OFF);
  _MM_SET_DENORMALS_ZERO_MODE(flush ? _MM_DENORMALS_ZERO_ON : _MM_DENORMALS_ZERO_OFF);
}
#endif

bool kiln_set_flush_denormals(bool flush) {
#ifdef KILN_HAVE_MXCSR
  set_mode(flush);
  /* the pool's threads (OpenBLAS and oneDNN run on them too); a thread made later copies its
   * creator's bits */
#pragma omp parallel
  set_mode(flush);
  return true;
#else
  (void)flush;
  return false;
#endif
}
