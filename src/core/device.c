/* The device tables (include/kiln/device.h): the host, and hostsim, the host behind a device's
 * walls for tests. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kiln/core.h"
#include "kiln/device.h"

/* ---- the host ------------------------------------------------------------------------------ */

static int host_alloc(const kiln_device *d, size_t bytes, void **out) {
  (void)d;
  *out = kiln_alloc(bytes ? bytes : 1);
  return *out ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory for %zu bytes", bytes);
}

static void host_free(const kiln_device *d, void *p) {
  (void)d;
  kiln_free(p);
}

static int host_copy(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  if (bytes && dst != src) memmove(dst, src, bytes);
  return KILN_OK;
}

static int host_set(const kiln_device *d, void *dst, int byte, size_t bytes) {
  (void)d;
  memset(dst, byte, bytes);
  return KILN_OK;
}

static int host_sync(const kiln_device *d) {
  (void)d;
  return KILN_OK;
}

static const kiln_device_ops host_ops = {
    .alloc = host_alloc, .free = host_free, .to_device = host_copy, .to_host = host_copy,
    .copy = host_copy, .set = host_set, .sync = host_sync,
};

static const kiln_device host = {.name = "host", .kind = KILN_DEVICE_HOST, .ops = &host_ops};

const kiln_device *kiln_device_host(void) { return &host; }

/* ---- hostsim ------------------------------------------------------------------------------- */

/* Every mapping it handed out; all of them are opened and closed together. */
typedef struct {
  void *p;
  size_t len;
} mapping;

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;
static int nmaps, cap_maps;
static size_t mapped, peak_mapped; /* bytes */
static int depth; /* enter .. leave nesting: open while > 0 */

static void protect_all(int prot) {
  for (int i = 0; i < nmaps; i++) mprotect(maps[i].p, maps[i].len, prot);
}

static void sim_enter(const kiln_device *d) {
  (void)d;
  pthread_mutex_lock(&sim_lock);
  if (depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
  pthread_mutex_unlock(&sim_lock);
}

static void sim_leave(const kiln_device *d) {
  (void)d;
  pthread_mutex_lock(&sim_lock);
  if (depth > 0 && --depth == 0) protect_all(PROT_NONE);
  pthread_mutex_unlock(&sim_lock);
}

static int sim_alloc(const kiln_device *d, size_t bytes, void **out) {
  (void)d;
  *out = NULL;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t len = (bytes ? bytes : 1) + page - 1 - ((bytes ? bytes : 1) + page - 1) % page;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kiln_errorf(KILN_ERR_NOMEM, "hostsim: out of memory for %zu bytes", bytes);
  memset(p, 0xff, len); /* every float a NaN until something is written */
  pthread_mutex_lock(&sim_lock);
  if (nmaps == cap_maps) {
    int cap = cap_maps ? 2 * cap_maps : 64;
    mapping *m = realloc(maps, sizeof *m * (size_t)cap);
    if (!m) {
      pthread_mutex_unlock(&sim_lock);
      munmap(p, len);
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    }
    maps = m;
    cap_maps = cap;
  }
  maps[nmaps++] = (mapping){p, len};
  mapped += len;
  if (mapped > peak_mapped) peak_mapped = mapped;
  if (depth == 0) mprotect(p, len, PROT_NONE);
  pthread_mutex_unlock(&sim_lock);
  *out = p;
  return KILN_OK;
}

static void sim_free(const kiln_device *d, void *p) {
  (void)d;
  if (!p) return;
  pthread_mutex_lock(&sim_lock);
  for (int i = 0; i < nmaps; i++)
    if (maps[i].p == p) {
      munmap(maps[i].p, maps[i].len);
      mapped -= maps[i].len;
      maps[i] = maps[--nmaps];
      break;
    }
  pthread_mutex_unlock(&sim_lock);
}

/* The table's own copies run with the walls open, as a driver's would. */
static int sim_copy(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  sim_enter(d);
  if (bytes && dst != src) memmove(dst, src, bytes);
  sim_leave(d);
  return KILN_OK;
}

static int sim_set(const kiln_device *d, void *dst, int byte, size_t bytes) {
  sim_enter(d);
  memset(dst, byte, bytes);
  sim_leave(d);
  return KILN_OK;
}

static const kiln_device_ops sim_ops = {
    .alloc = sim_alloc, .free = sim_free, .to_device = sim_copy, .to_host = sim_copy,
    .copy = sim_copy, .set = sim_set, .sync = host_sync, .enter = sim_enter, .leave = sim_leave,
};

static const kiln_device hostsim = {.name = "hostsim", .kind = KILN_DEVICE_HOSTSIM,
                                    .ops = &sim_ops};

const kiln_device *kiln_device_hostsim(void) { return &hostsim; }

int kiln_hostsim_mappings(void) {
  pthread_mutex_lock(&sim_lock);
  int n = nmaps;
  pthread_mutex_unlock(&sim_lock);
  return n;
}

bool kiln_hostsim_open(void) {
  pthread_mutex_lock(&sim_lock);
  bool open = depth > 0;
  pthread_mutex_unlock(&sim_lock);
  return open;
}

/* ---- through the table --------------------------------------------------------------------- */

int kiln_device_available(const kiln_device *d, size_t *bytes) {
  if (d && d->kind == KILN_DEVICE_CUDA) {
    size_t in_use, reserved;
    KILN_TRY(kiln_cuda_memory(d, &in_use, NULL, &reserved));
    KILN_TRY(kiln_cuda_free_memory(d, bytes));
    *bytes += reserved > in_use ? reserved - in_use : 0;
    return KILN_OK;
  }
  return KILN_ERR_UNSUPPORTED;
}

int kiln_device_memory(const kiln_device *d, size_t *in_use, size_t *peak) {
  if (kiln_device_is_host(d))
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "the host's memory is the process's (peak RSS)");
  if (d->kind == KILN_DEVICE_CUDA) return kiln_cuda_memory(d, in_use, peak, NULL);
  pthread_mutex_lock(&sim_lock);
  if (in_use) *in_use = mapped;
  if (peak) *peak = peak_mapped;
  pthread_mutex_unlock(&sim_lock);
  return KILN_OK;
}

const kiln_device *kiln_device_find(const char *name) {
  if (!name) return NULL;
  if (!strcmp(name, "host")) return &host;
  if (!strcmp(name, "hostsim")) return &hostsim;
  if (!strcmp(name, "cuda")) return kiln_device_cuda(0);
  if (!strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9') {
    char *end;
    long n = strtol(name + 5, &end, 10);
    return *end || n > 1023 ? NULL : kiln_device_cuda((int)n);
  }
  return NULL;
}

static const kiln_device *or_host(const kiln_device *d) { return d ? d : &host; }

int kiln_device_alloc(const kiln_device *d, size_t bytes, void **out) {
  d = or_host(d);
  return d->ops->alloc(d, bytes, out);
}
void kiln_device_free(const kiln_device *d, void *p) {
  d = or_host(d);
  d->ops->free(d, p);
}
int kiln_device_to_device(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  d = or_host(d);
  return d->ops->to_device(d, dst, src, bytes);
}
int kiln_device_to_host(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  d = or_host(d);
  return d->ops->to_host(d, dst, src, bytes);
}
int kiln_device_copy(const kiln_device *d, void *dst, const void *src, size_t bytes) {
  d = or_host(d);
  return d->ops->copy(d, dst, src, bytes);
}
int kiln_device_set(const kiln_device *d, void *dst, int byte, size_t bytes) {
  d = or_host(d);
  return d->ops->set(d, dst, byte, bytes);
}
int kiln_device_sync(const kiln_device *d) {
  d = or_host(d);
  return d->ops->sync(d);
}
int kiln_device_host_alloc(const kiln_device *d, size_t bytes, void **out) {
  d = or_host(d);
  if (d->ops->host_alloc) return d->ops->host_alloc(d, bytes, out);
  *out = kiln_alloc(bytes ? bytes : 1);
  return *out ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory for %zu bytes", bytes);
}
void kiln_device_host_free(const kiln_device *d, void *p) {
  d = or_host(d);
  if (d->ops->host_free) d->ops->host_free(d, p);
  else kiln_free(p);
}
void kiln_device_enter(const kiln_device *d) {
  if (d && d->ops->enter) d->ops->enter(d);
}
void kiln_device_leave(const kiln_device *d) {
  if (d && d->ops->leave) d->ops->leave(d);
}
