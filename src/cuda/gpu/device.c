/* The GPUs as kiln devices (include/kiln/device.h), and the CUDA backend's runtime on them
 * (src/cuda/kcuda.h): built with cmake -DKILN_CUDA=ON only.
 *
 * Each GPU a process uses is one kiln device "cuda:N": one stream, which every kernel, copy and
 * set of that device is queued on (so ops and copies are ordered without events), one cuBLAS
 * handle bound to it, and a caching pool over cudaMalloc. The pool exists because cudaMalloc and
 * cudaFree synchronise the whole device: blobs are reshaped and workspaces regrown every pass,
 * and a free block of the same size class is handed out again instead (the stream orders its
 * last user before its next). No managed memory: a page fault on the GPU is the slow failure a
 * forgotten copy would otherwise be. */
#ifdef KILN_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu/gpu.h"
#include "kiln/backend.h"
#include "kiln/core.h"

enum { MAX_GPUS = 64 };

/* A free block of the pool. */
typedef struct block {
  void *p;
  size_t bytes; /* its size class */
  struct block *next;
} block;

/* Blocks handed out, by address, for free to find their class. */
typedef struct {
  void *p;
  size_t bytes;
} live_block;

typedef struct {
  kiln_device dev; /* first: the kiln_device * is this struct's */
  char name[16];
  cudaStream_t stream;
  cublasHandle_t blas;
  int blas_math; /* the math mode last set: 0 default, 1 TF32 */
  pthread_mutex_t lock;
  block *free_blocks;
  live_block *live;
  int nlive, cap_live;
  size_t in_use, peak, reserved;
  void *scratch, *host_scratch;
  size_t scratch_bytes, host_scratch_bytes;
} gpu;

static gpu gpus[MAX_GPUS];
static int ngpus = -1; /* not yet asked */
static char why[256];
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static gpu *of(const kiln_device *d) { return (gpu *)(void *)d; }

/* The calling thread's current device, set where it differs: the runtime's is per thread, and
 * the data layer's prefetch threads copy too. */
static _Thread_local int current = -1;
void kiln_cuda_use(const kiln_device *d) {
  if (d && d->index != current) {
    cudaSetDevice(d->index);
    current = d->index;
  }
}

static int cuda_error(cudaError_t e, const char *what, const kiln_device *d) {
  return kiln_errorf(e == cudaErrorMemoryAllocation ? KILN_ERR_NOMEM : KILN_ERR_IO, "%s: %s: %s",
                     d ? d->name : "cuda", what, cudaGetErrorString(e));
}

/* Size classes: 512 bytes up to 1 MiB, then 2 MiB steps, so that a blob regrown by a little
 * takes a block of the class it had. */
static size_t size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t step = bytes <= ((size_t)1 << 20) ? 512 : ((size_t)2 << 20);
  return (bytes + step - 1) / step * step;
}

static void release_cached(gpu *g) {
  for (block *b = g->free_blocks, *next; b; b = next) {
    next = b->next;
    cudaFree(b->p);
    g->reserved -= b->bytes;
    free(b);
  }
  g->free_blocks = NULL;
}

static int gpu_alloc(const kiln_device *d, size_t bytes, void **out) {
  gpu *g = of(d);
  const size_t cls = size_class(bytes);
  *out = NULL;
  pthread_mutex_lock(&g->lock);
  void *p = NULL;
  for (block **bp = &g->free_blocks; *bp; bp = &(*bp)->next)
    if ((*bp)->bytes == cls) {
      block *b = *bp;
      *bp = b->next;
      p = b->p;
      free(b);
      break;
    }
  int rc = KILN_OK;
  if (!p) {
    kiln_cuda_use(d);
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) { /* the cached blocks back to the driver, then again */
      cudaGetLastError();
      release_cached(g);
      e = cudaMalloc(&p, cls);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      rc = kiln_errorf(e == cudaErrorMemoryAllocation ? KILN_ERR_NOMEM : KILN_ERR_IO,
                       "%s: out of device memory for %zu bytes (%zu in use): %s", d->name, bytes,
                       g->in_use, cudaGetErrorString(e));
      p = NULL;
    } else {
      g->reserved += cls;
    }
  }
  if (p && g->nlive == g->cap_live) {
    int cap = g->cap_live ? 2 * g->cap_live : 256;
    live_block *l = (live_block *)realloc(g->live, sizeof *l * (size_t)cap);
    if (!l) {
      cudaFree(p);
      g->reserved -= cls;
      p = NULL;
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    } else {
      g->live = l;
      g->cap_live = cap;
    }
  }
  if (p) {
    g->live[g->nlive++] = (live_block){p, cls};
    g->in_use += cls;
    if (g->in_use > g->peak) g->peak = g->in_use;
  }
  pthread_mutex_unlock(&g->lock);
  *out = p;
  return rc;
}

static void gpu_free(const kiln_device *d, void *p) {
  if (!p) return;
  gpu *g = of(d);
  pthread_mutex_lock(&g->lock);
  for (int i = 0; i < g->nlive; i++)
    if (g->live[i].p == p) {
      block *b = (block *)malloc(sizeof *b);
      if (b) {
        *b = (block){p, g->live[i].bytes, g->free_blocks};
        g->free_blocks = b;
      } else {
        cudaFree(p);
        g->reserved -= g->live[i].bytes;
      }
      g->in_use -= g->live[i].bytes;
      g->live[i] = g->live[--g->nlive];
      break;
    }
  pthread_mutex_unlock(&g->lock);
}

static int copy_kind(const kiln_device *d, void *dst, const void *src, size_t bytes,
                     enum cudaMemcpyKind kind, bool wait) {
  if (!bytes || dst == src) return KILN_OK;
  kiln_cuda_use(d);
  cudaStream_t s = (cudaStream_t)d->queue;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
  if (e == cudaSuccess && wait) e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? KILN_OK : cuda_error(e, "copy", d);
}

static int gpu_to_device(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  return copy_kind(d, dst, src, bytes, cudaMemcpyHostToDevice, true);
}
static int gpu_to_host(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  return copy_kind(d, dst, src, bytes, cudaMemcpyDeviceToHost, true);
}
/* Within the device: queued, as the kernels are; nothing on the host sees its bytes before a
 * copy to the host, which waits. */
static int gpu_copy(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  return copy_kind(d, dst, src, bytes, cudaMemcpyDeviceToDevice, false);
}

static int gpu_set(const kiln_device *d, void *dst, int byte, size_t bytes) {
  if (!bytes) return KILN_OK;
  kiln_cuda_use(d);
  cudaError_t e = cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)d->queue);
  return e == cudaSuccess ? KILN_OK : cuda_error(e, "set", d);
}

static int gpu_sync(const kiln_device *d) {
  kiln_cuda_use(d);
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)d->queue);
  return e == cudaSuccess ? KILN_OK : cuda_error(e, "kernels", d);
}

static int gpu_host_alloc(const kiln_device *d, size_t bytes, void **out) {
  kiln_cuda_use(d);
  cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *out = NULL;
    return cuda_error(e, "pinned host memory", d);
  }
  return KILN_OK;
}

static void gpu_host_free(const kiln_device *d, void *p) {
  if (!p) return;
  kiln_cuda_use(d);
  cudaFreeHost(p);
}

static const kiln_device_ops gpu_ops = {
    .alloc = gpu_alloc, .free = gpu_free, .to_device = gpu_to_device, .to_host = gpu_to_host,
    .copy = gpu_copy, .set = gpu_set, .sync = gpu_sync, .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
};

static void count_gpus(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, sizeof why, "no CUDA device: %s", cudaGetErrorString(e));
    n = 0;
  } else if (n == 0) {
    snprintf(why, sizeof why, "no CUDA device");
  }
  ngpus = n < MAX_GPUS ? n : MAX_GPUS;
}

int kiln_cuda_device_count(void) {
  pthread_mutex_lock(&init_lock);
  if (ngpus < 0) count_gpus();
  int n = ngpus;
  pthread_mutex_unlock(&init_lock);
  return n;
}

const char *kiln_cuda_unavailable(void) {
  kiln_cuda_device_count();
  return why[0] ? why : "no such CUDA device";
}

void kiln_cuda_describe(int index, char *buf, size_t n) {
  struct cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    snprintf(buf, n, "(unreadable)");
    return;
  }
  snprintf(buf, n, "%s, %.1f GiB, sm_%d%d", p.name, (double)p.totalGlobalMem / (1 << 30), p.major,
           p.minor);
}

static bool open_gpu(gpu *g, int index) {
  cudaError_t e = cudaSetDevice(index);
  current = index;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, sizeof why, "cuda:%d: %s", index, cudaGetErrorString(e));
    return false;
  }
  if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS ||
      cublasSetStream(g->blas, g->stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    snprintf(why, sizeof why, "cuda:%d: cuBLAS could not start", index);
    cudaStreamDestroy(g->stream);
    return false;
  }
  pthread_mutex_init(&g->lock, NULL);
  snprintf(g->name, sizeof g->name, "cuda:%d", index);
  g->dev = (kiln_device){.name = g->name, .kind = KILN_DEVICE_CUDA, .index = index,
                         .ops = &gpu_ops, .queue = g->stream};
  return true;
}

const kiln_device *kiln_device_cuda(int index) {
  if (index < 0 || index >= kiln_cuda_device_count()) return NULL;
  pthread_mutex_lock(&init_lock);
  gpu *g = &gpus[index];
  const kiln_device *d = g->dev.ops || open_gpu(g, index) ? &g->dev : NULL;
  pthread_mutex_unlock(&init_lock);
  return d;
}

int kiln_cuda_memory(const kiln_device *d, size_t *in_use, size_t *peak, size_t *reserved) {
  if (!d || d->kind != KILN_DEVICE_CUDA) return KILN_ERR_INVALID;
  gpu *g = of(d);
  pthread_mutex_lock(&g->lock);
  if (in_use) *in_use = g->in_use;
  if (peak) *peak = g->peak;
  if (reserved) *reserved = g->reserved + g->scratch_bytes;
  pthread_mutex_unlock(&g->lock);
  return KILN_OK;
}

int kiln_cuda_free_memory(const kiln_device *d, size_t *bytes) {
  size_t free_b = 0, total = 0;
  kiln_cuda_use(d);
  cudaError_t e = cudaMemGetInfo(&free_b, &total);
  *bytes = free_b;
  return e == cudaSuccess ? KILN_OK : cuda_error(e, "memory", d);
}

/* ---- the kernels' runtime (src/cuda/kcuda.h) ----------------------------------------------- */

int kiln_cuda_launched(const kiln_op_ctx *c, const char *op) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? KILN_OK : cuda_error(e, op, c->device);
}

/* A buffer of the device's grown to `bytes` and a quarter more (the old one freed: cudaFree and
 * cudaFreeHost wait for the kernels that used it), device memory or pinned host memory. */
static int grow(const kiln_op_ctx *c, void **buf, size_t *have, size_t bytes, bool pinned) {
  if (bytes <= *have) return KILN_OK;
  kiln_cuda_use(c->device);
  if (pinned) cudaFreeHost(*buf);
  else cudaFree(*buf);
  *buf = NULL;
  *have = 0;
  const size_t want = bytes + bytes / 4;
  cudaError_t e = pinned ? cudaMallocHost(buf, want) : cudaMalloc(buf, want);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *buf = NULL;
    return cuda_error(e, pinned ? "pinned host scratch" : "scratch", c->device);
  }
  *have = want;
  return KILN_OK;
}

/* One buffer a device. */
int kiln_cuda_scratch(const kiln_op_ctx *c, size_t bytes, void **out) {
  gpu *g = of(c->device);
  KILN_TRY(grow(c, &g->scratch, &g->scratch_bytes, bytes, false));
  *out = g->scratch;
  return KILN_OK;
}

/* Pinned; its users wait for their copies before the next op can take it. */
int kiln_cuda_host_scratch(const kiln_op_ctx *c, size_t bytes, void **out) {
  gpu *g = of(c->device);
  KILN_TRY(grow(c, &g->host_scratch, &g->host_scratch_bytes, bytes, true));
  *out = g->host_scratch;
  return KILN_OK;
}

void *kiln_cuda_blas(const kiln_op_ctx *c) {
  gpu *g = of(c->device);
  const int math = c->config->tf32 ? 1 : 0;
  if (math != g->blas_math) {
    cublasSetMathMode(g->blas, math ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    g->blas_math = math;
  }
  return g->blas;
}
#endif
