/* The single-process communicator: rank 0 of 1. Every collective leaves its buffer as it is,
 * which is what a sum or broadcast over one rank means; allgather copies. */
#include <stdlib.h>
#include <string.h>

#include "kiln/parallel.h"

static int local_barrier(kiln_comm *c) {
  (void)c;
  return KILN_OK;
}

static int local_broadcast(kiln_comm *c, float *buf, int64_t n, int root) {
  (void)c, (void)buf, (void)n, (void)root;
  return KILN_OK;
}

static int local_broadcast_bytes(kiln_comm *c, void *buf, size_t n, int root) {
  (void)c, (void)buf, (void)n, (void)root;
  return KILN_OK;
}

static int local_allreduce(kiln_comm *c, float *buf, int64_t n) {
  (void)c, (void)buf, (void)n;
  return KILN_OK;
}

static int local_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  (void)c;
  if (n) memmove(recv, send, n);
  return KILN_OK;
}

static void local_end_job(kiln_comm *c, int code) { (void)c, (void)code; }

static void local_destroy(kiln_comm *c) { free(c); }

static const kiln_comm_ops local_ops = {
    .name = "local",
    .barrier = local_barrier,
    .broadcast = local_broadcast,
    .broadcast_bytes = local_broadcast_bytes,
    .allreduce_sum = local_allreduce,
    .allreduce_sum_ordered = local_allreduce,
    .allgather = local_allgather,
    .end_job = local_end_job,
    .destroy = local_destroy,
};

int kiln_comm_local_create(kiln_comm **out) {
  kiln_comm *c = calloc(1, sizeof *c);
  *out = c;
  if (!c) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  c->ops = &local_ops;
  c->rank = 0;
  c->size = 1;
  return KILN_OK;
}
