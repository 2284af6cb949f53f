/* The communicator's front end (see include/kiln/parallel.h): NULL stands for one process, so code
 * that trains on one or on many workers calls the same functions; the watchdog's limit; the
 * launcher probe; the comparison of the settings every rank must be given alike; and the one
 * addition kernel that makes the deterministic reduction and iter_size agree bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
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

/* ---- settings every rank must share ------------------------------------------------------- */

/* One setting as a rank sends it: whether it is given, a digest of its value (which decides),
 * and the value shortened to fit (which the message shows). */
typedef struct {
  uint8_t given;
  uint8_t digest[32];
  char shown[95];
} setting_record;

static void describe_value(const setting_record *r, char *out, size_t n) {
  if (!r->given) snprintf(out, n, "not given");
  else if (!r->shown[0]) snprintf(out, n, "given");
  else snprintf(out, n, "'%s'", r->shown);
}

int kiln_comm_agree_settings(kiln_comm *c, const kiln_comm_setting *s, int n) {
  int size = kiln_comm_size(c);
  if (size <= 1 || n <= 0) return KILN_OK;
  if (n > KILN_COMM_MAX_SETTINGS)
    return kiln_errorf(KILN_ERR_INTERNAL, "%d settings to compare, at most %d", n,
                       KILN_COMM_MAX_SETTINGS);
  setting_record mine[KILN_COMM_MAX_SETTINGS];
  memset(mine, 0, sizeof mine);
  for (int k = 0; k < n; k++) {
    const char *v = s[k].value;
    if (!v) continue;
    mine[k].given = 1;
    kiln_sha256(v, strlen(v), mine[k].digest);
    kiln_shorten_middle(mine[k].shown, sizeof mine[k].shown, v, strlen(v));
  }
  size_t bytes = sizeof(setting_record) * (size_t)n;
  setting_record *all = malloc(bytes * (size_t)size);
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = kiln_comm_allgather(c, mine, bytes, all);
  if (rc) {
    free(all);
    return kiln_error_context(rc, "comparing the workers' command-line options: ");
  }
  /* the first setting on which a rank differs from rank 0, and that rank; the other settings */
  int first = -1, first_rank = -1, more_ranks = 0, nothers = 0;
  char others[512] = "", names[1024] = "";
  size_t used = 0, nused = 0;
  for (int k = 0; k < n; k++) {
    int k_nused = snprintf(names + nused, sizeof names - nused, "%s%s",
                           k == 0 ? "" : k + 1 == n ? " and " : ", ", s[k].name);
    if (k_nused > 0 && nused + (size_t)k_nused < sizeof names) nused += (size_t)k_nused;
    const setting_record *r0 = &all[k];
    bool differs = false;
    for (int r = 1; r < size; r++) {
      const setting_record *rr = &all[(size_t)r * (size_t)n + (size_t)k];
      if (rr->given == r0->given && memcmp(rr->digest, r0->digest, sizeof rr->digest) == 0)
        continue;
      differs = true;
      if (first < 0) {
        first = k;
        first_rank = r;
      } else if (first == k) {
        more_ranks++;
      }
    }
    if (differs && first != k) {
      nothers++;
      int m = snprintf(others + used, sizeof others - used, "%s%s", used ? ", " : "", s[k].name);
      if (m > 0 && used + (size_t)m < sizeof others) used += (size_t)m;
    }
  }
  if (first >= 0) {
    char theirs[128], ours[128], more[64] = "";
    describe_value(&all[(size_t)first_rank * (size_t)n + (size_t)first], theirs, sizeof theirs);
    describe_value(&all[first], ours, sizeof ours);
    if (more_ranks)
      snprintf(more, sizeof more, " (and %d more rank%s)", more_ranks, more_ranks > 1 ? "s" : "");
    rc = kiln_errorf(KILN_ERR_INVALID,
                     "the %d workers were given different options: %s is %s on rank %d%s but %s "
                     "on rank 0%s%s%s; every worker must be given the same %s "
                     "(docs/distributed.md)",
                     size, s[first].name, theirs, first_rank, more, ours,
                     nothers ? " (" : "", nothers ? others : "",
                     nothers == 0 ? "" : nothers == 1 ? " differs too)" : " differ too)", names);
  }
  free(all);
  return rc;
}

/* The sums are ops of the host's cpu backend (include/kiln/backend.h), on the calling thread
 * alone: the communicator's buffers are host memory (MPI moves host memory; gradients on another
 * device reach them through a host copy), and the thread driving a sum may be the communication
 * thread. The same kernel (acc) adds a solver's iter_size passes, so the bits agree. Neither op
 * can fail. */
static kiln_op_ctx host_ctx(void) {
  return (kiln_op_ctx){.nthreads = 1, .config = kiln_config_defaults(), .device = NULL};
}

void kiln_parallel_accumulate(float *restrict acc, const float *restrict x, int64_t n) {
  const kiln_op_ctx c = host_ctx();
  (void)kiln_backend_cpu()->acc(&c, acc, x, n);
}

void kiln_parallel_sum_to_all(float *const *p, int np, int64_t n) {
  const kiln_op_ctx c = host_ctx();
  (void)kiln_backend_cpu()->ordered_sum(&c, p, np, n);
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
