/* The "cuda" backend: the kernels of src/cuda/<family>.cu, one table a GPU (its device differs),
 * each op run with its GPU current on the calling thread. */
#ifdef KILN_HAVE_CUDA
#include <pthread.h>

#include "cuda/gpu/gpu.h"

static kiln_backend raw;
static pthread_once_t raw_once = PTHREAD_ONCE_INIT;

static void make_raw(void) {
#define REGISTER_(family) kiln_cuda_register_##family(&raw);
  KCUDA_GPU_FAMILIES(REGISTER_)
#undef REGISTER_
}

#define GPU_WRAP_(name, params, args) \
  static int gpu_##name params {      \
    kiln_cuda_use(c->device);         \
    return raw.name args;             \
  }
KILN_OP_LIST(GPU_WRAP_)
#undef GPU_WRAP_

enum { MAX_TABLES = 64 };
static kiln_backend tables[MAX_TABLES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

const kiln_backend *kiln_backend_cuda(int index) {
  const kiln_device *d = kiln_device_cuda(index);
  if (!d || index >= MAX_TABLES) return NULL;
  pthread_once(&raw_once, make_raw);
  pthread_mutex_lock(&lock);
  kiln_backend *b = &tables[index];
  if (!b->name) {
    b->device = d;
#define ENTRY_(name, params, args) b->name = raw.name ? gpu_##name : NULL;
    KILN_OP_LIST(ENTRY_)
#undef ENTRY_
    b->name = "cuda";
  }
  pthread_mutex_unlock(&lock);
  return b;
}
#endif
