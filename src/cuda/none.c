/* A build without CUDA (cmake -DKILN_CUDA=ON builds src/cuda/gpu instead): no GPU, and a reason
 * that says how to get one. */
#ifndef KILN_HAVE_CUDA
#include <stddef.h>

#include "kiln/backend.h"
#include "kiln/device.h"

const kiln_device *kiln_device_cuda(int index) {
  (void)index;
  return NULL;
}

int kiln_cuda_device_count(void) { return 0; }

void kiln_cuda_describe(int index, char *buf, size_t n) {
  (void)index;
  if (n) buf[0] = '\0';
}

const char *kiln_cuda_unavailable(void) {
  return "kiln was built without CUDA: scripts/install-deps --cuda, then cmake -DKILN_CUDA=ON";
}

int kiln_cuda_memory(const kiln_device *d, size_t *in_use, size_t *peak, size_t *reserved) {
  (void)d;
  (void)in_use;
  (void)peak;
  (void)reserved;
  return KILN_ERR_INVALID;
}

int kiln_cuda_free_memory(const kiln_device *d, size_t *bytes) {
  (void)d;
  *bytes = 0;
  return KILN_ERR_INVALID;
}

const kiln_backend *kiln_backend_cuda(int index) {
  (void)index;
  return NULL;
}
#endif
