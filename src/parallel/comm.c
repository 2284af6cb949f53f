/* The communicator's front end (see include/kiln/parallel.h): NULL stands for one process, so code
 * that trains on one or on many workers calls the same functions; the watchdog's limit; the
 * launcher probe; and the one addition kernel that makes the deterministic reduction and
 * iter_size agree bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/parallel.h"

int kiln_comm_rank(const kiln_comm *c) { return c ? c->rank : 0; }
int kiln_comm_size(const kiln_comm *c) { return c ? c->size : 1; }

int kiln_comm_barrier(kiln_comm *c) { return c && c->size > 1 ? c->ops->barrier(c) : KILN_OK; }

int kiln_comm_broadcast(kiln_comm *c, float *buf, int64_t n, int root) {
  if (!c || c->size == 1 || n == 0) return KILN_OK;
  if (root < 0 || root >= c->size)
    return kiln_errorf(KILN_ERR_INVALID, "broadcast from rank %d of %d", root, c->size);
  return c->ops->broadcast(c, buf, n, root);
}

int kiln_comm_broadcast_bytes(kiln_comm *c, void *buf, size_t n, int root) {
  if (!c || c->size == 1 || n == 0) return KILN_OK;
  if (root < 0 || root >= c->size)
    return kiln_errorf(KILN_ERR_INVALID, "broadcast from rank %d of %d", root, c->size);
  return c->ops->broadcast_bytes(c, buf, n, root);
}

int kiln_comm_allreduce_sum(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  if (!c || c->size == 1 || n == 0) return KILN_OK;
  return ordered ? c->ops->allreduce_sum_ordered(c, buf, n) : c->ops->allreduce_sum(c, buf, n);
}

int kiln_comm_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  if (!c || c->size == 1) {
    if (n) memmove(recv, send, n);
    return KILN_OK;
  }
  return c->ops->allgather(c, send, n, recv);
}

int kiln_comm_set_timeout(kiln_comm *c, double seconds) {
  if (!isfinite(seconds) || seconds < 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "communication timeout %g: expected seconds (> 0, or 0 to wait forever)",
                       seconds);
  if (c) c->timeout_s = seconds;
  return KILN_OK;
}

int kiln_comm_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  if (!c || c->size == 1 || n == 0) return KILN_OK;
  if (c->ops->bucket_start) return c->ops->bucket_start(c, buf, n, ordered);
  return kiln_comm_allreduce_sum(c, buf, n, ordered);
}

int kiln_comm_bucket_progress(kiln_comm *c) {
  if (!c || c->size == 1 || !c->ops->bucket_progress) return KILN_OK;
  return c->ops->bucket_progress(c);
}

int kiln_comm_bucket_finish(kiln_comm *c) {
  if (!c || c->size == 1 || !c->ops->bucket_finish) return KILN_OK;
  return c->ops->bucket_finish(c);
}

float *kiln_comm_claim_sum_buffer(kiln_comm *c, int64_t n) {
  if (!c || c->size == 1 || n <= 0 || !c->ops->claim_sum_buffer) return NULL;
  return c->ops->claim_sum_buffer(c, n);
}

void kiln_comm_release_sum_buffer(kiln_comm *c, float *buf) {
  if (c && buf && c->ops->release_sum_buffer) c->ops->release_sum_buffer(c, buf);
}

void kiln_comm_end_job(kiln_comm *c, int code) {
  if (c && c->ops->end_job) c->ops->end_job(c, code);
}

void kiln_comm_free(kiln_comm *c) {
  if (c && c->ops->destroy) c->ops->destroy(c);
}

void kiln_parallel_accumulate(float *restrict acc, const float *restrict x, int64_t n) {
  /* Elementwise, so vectorising it changes nothing: each element gets exactly one rounding.
   * gcc's -O2 left the plain loop scalar. */
#pragma omp simd
  for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void kiln_parallel_sum_to_all(float *const *p, int np, int64_t n) {
  enum { BLOCK = 1024 }; /* 4 KiB on the stack; the blocks stay in L1 between the passes */
  float acc[BLOCK];
  for (int64_t i = 0; i < n; i += BLOCK) {
    int64_t m = n - i < BLOCK ? n - i : BLOCK;
    memcpy(acc, p[0] + i, sizeof(float) * (size_t)m);
    for (int r = 1; r < np; r++) kiln_parallel_accumulate(acc, p[r] + i, m);
    for (int r = 0; r < np; r++) memcpy(p[r] + i, acc, sizeof(float) * (size_t)m);
  }
}

#ifndef KILN_HAVE_MPI
int kiln_comm_mpi_init(int *argc, char ***argv, const kiln_config *cfg) {
  kiln_comm *c = NULL;
  return kiln_comm_mpi_create(argc, argv, cfg, &c);
}
int kiln_comm_mpi_create(int *argc, char ***argv, const kiln_config *cfg, kiln_comm **out) {
  (void)argc, (void)argv, (void)cfg;
  *out = NULL;
  return kiln_errorf(KILN_ERR_UNSUPPORTED,
                     "kiln was built without MPI; install Open MPI (scripts/install-deps) and "
                     "rebuild to train on several workers");
}
bool kiln_comm_mpi_built(void) { return false; }
#endif
