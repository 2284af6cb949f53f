/* kiln devices: where memory lives, and the only way host code moves values in and out of it.
 *
 * A device is a const table of functions (allocate, free, copy host to device, device to host
 * and device to device, set, synchronise) with a queue its kernels run on. The host is the first
 * device: its memory is the process's, copies are memcpy. Every blob, parameter buffer,
 * workspace and pool records the device its memory is on (kiln_blob.device), and code outside
 * the kernels of that device's backend (include/kiln/backend.h) reads or writes such memory only
 * through this table: data layers hand their batches over with to_device, snapshots and the
 * loss read with to_host.
 *
 * "hostsim" is the host behind a device's walls, for tests: its memory is its own mappings,
 * which are unreadable (PROT_NONE) except while one of its kernels runs (between enter and
 * leave, which its backend calls around every op) or while the table itself copies. Host code
 * that touches device memory directly, a copy forgotten or a pointer read behind the table's
 * back, faults at once instead of passing unnoticed on a machine without a GPU. Its new memory
 * is filled with a NaN pattern, so a value read before anything was copied in shows as well. */
#ifndef KILN_DEVICE_H
#define KILN_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { KILN_DEVICE_HOST = 0, KILN_DEVICE_HOSTSIM = 1, KILN_DEVICE_CUDA = 2 } kiln_device_kind;

typedef struct kiln_device kiln_device;

typedef struct kiln_device_ops {
  /* `bytes` of device memory, 64-byte aligned, zeroed on the host, NaN-patterned on hostsim;
   * KILN_ERR_NOMEM when it cannot. free accepts NULL. */
  int (*alloc)(const kiln_device *d, size_t bytes, void **out);
  void (*free)(const kiln_device *d, void *p);
  /* Copies that return when the bytes are where they go (after what the queue holds). */
  int (*to_device)(const kiln_device *d, void *dst, const void *src, size_t bytes);
  int (*to_host)(const kiln_device *d, void *dst, const void *src, size_t bytes);
  int (*copy)(const kiln_device *d, void *dst, const void *src, size_t bytes);
  /* Every byte of dst[0 .. bytes) set to `byte`. */
  int (*set)(const kiln_device *d, void *dst, int byte, size_t bytes);
  /* Waits for everything queued. */
  int (*sync)(const kiln_device *d);
  /* Host memory the device copies to and from directly (a GPU's pinned memory), 64-byte
   * aligned; NULL: the process's own (kiln_alloc). */
  int (*host_alloc)(const kiln_device *d, size_t bytes, void **out);
  void (*host_free)(const kiln_device *d, void *p);
  /* The backend's kernels run between enter and leave (hostsim: its memory readable there);
   * NULL on devices with nothing to do. */
  void (*enter)(const kiln_device *d);
  void (*leave)(const kiln_device *d);
} kiln_device_ops;

struct kiln_device {
  const char *name; /* "host", "hostsim" */
  kiln_device_kind kind;
  int index;        /* of its kind (a GPU's number) */
  const kiln_device_ops *ops;
  void *queue;      /* the stream its kernels run on; NULL on the host */
};

/* The devices kiln has in this build. */
const kiln_device *kiln_device_host(void);
const kiln_device *kiln_device_hostsim(void);
/* GPU `index` (src/cuda/gpu/device.c): NULL in a build without CUDA (-DKILN_CUDA=ON), or where
 * the machine has no such GPU; kiln_cuda_unavailable says which. */
const kiln_device *kiln_device_cuda(int index);
/* The GPUs this process sees (0 without CUDA). */
int kiln_cuda_device_count(void);
/* GPU `index` in words ("NVIDIA H200, 139.8 GiB, sm_90") into buf. */
void kiln_cuda_describe(int index, char *buf, size_t n);
/* Why kiln_device_cuda gives none: "built without CUDA", "no CUDA device", the driver's error. */
const char *kiln_cuda_unavailable(void);
/* A GPU's memory: what its pool has handed out now and at most so far (the peak device memory
 * that runs report), and what it holds from the driver (cached blocks and scratch too);
 * KILN_ERR_INVALID for a device that is not a GPU. */
int kiln_cuda_memory(const kiln_device *d, size_t *in_use, size_t *peak, size_t *reserved);
/* The driver's free memory on that GPU (cudaMemGetInfo). */
int kiln_cuda_free_memory(const kiln_device *d, size_t *bytes);
/* By name ("host", "hostsim", "cuda:N" / "cuda" for GPU 0); NULL for another. */
const kiln_device *kiln_device_find(const char *name);

/* The table's functions through the device, NULL meaning the host. */
static inline bool kiln_device_is_host(const kiln_device *d) {
  return !d || d->kind == KILN_DEVICE_HOST;
}
int kiln_device_alloc(const kiln_device *d, size_t bytes, void **out);
void kiln_device_free(const kiln_device *d, void *p);
int kiln_device_to_device(const kiln_device *d, void *dst, const void *src, size_t bytes);
int kiln_device_to_host(const kiln_device *d, void *dst, const void *src, size_t bytes);
int kiln_device_copy(const kiln_device *d, void *dst, const void *src, size_t bytes);
int kiln_device_set(const kiln_device *d, void *dst, int byte, size_t bytes);
int kiln_device_sync(const kiln_device *d);
int kiln_device_host_alloc(const kiln_device *d, size_t bytes, void **out);
void kiln_device_host_free(const kiln_device *d, void *p);
void kiln_device_enter(const kiln_device *d);
void kiln_device_leave(const kiln_device *d);

/* The memory a device's allocations hold now and at most so far, in bytes (a GPU: what its pool
 * handed out; hostsim: its mappings); KILN_ERR_UNSUPPORTED on the host, whose memory is the
 * process's (its peak RSS). */
int kiln_device_memory(const kiln_device *d, size_t *in_use, size_t *peak);

/* The bytes a device can still hand out (a GPU: the driver's free memory and the pool's cached
 * blocks); KILN_ERR_UNSUPPORTED where that is the host's (host, hostsim). */
int kiln_device_available(const kiln_device *d, size_t *bytes);

/* hostsim's bookkeeping, for its tests: the mappings it holds, and whether its memory is open
 * (inside enter .. leave). */
int kiln_hostsim_mappings(void);
bool kiln_hostsim_open(void);

#endif
