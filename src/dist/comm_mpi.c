/* The MPI communicator (compiled when CMake finds MPI; KILN_HAVE_MPI). kiln talks on a duplicate
 * of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so a failed call becomes a status with MPI's message
 * instead of MPI's default abort. Counts are int in MPI, so large buffers go in chunks.
 *
 * The ordered sum gathers to rank 0 chunk by chunk, adding the ranks' chunks in rank order with
 * kiln_dist_accumulate(), then broadcasts the result: N-1 receives on rank 0 per chunk, slower
 * than a tree or ring allreduce, but its bits do not depend on the library's algorithm. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/dist.h"

typedef struct {
  MPI_Comm comm;
  bool we_initialised;
  float *tmp; /* rank 0: one chunk, for the ordered sum */
  int64_t tmp_floats;
} mpi_state;

enum { CHUNK_FLOATS = 1 << 22, ORDERED_TAG = 0x6b6c };

static int mpi_status(int err, const char *what) {
  if (err == MPI_SUCCESS) return KILN_OK;
  char msg[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = '\0';
  return kiln_errorf(KILN_ERR_COMM, "MPI %s failed: %s", what, len ? msg : "unknown error");
}

static MPI_Comm comm_of(kiln_comm *c) { return ((mpi_state *)c->impl)->comm; }

static int mpi_barrier(kiln_comm *c) { return mpi_status(MPI_Barrier(comm_of(c)), "barrier"); }

static int mpi_broadcast(kiln_comm *c, float *buf, int64_t n, int root) {
  for (int64_t off = 0; off < n; off += CHUNK_FLOATS) {
    int cnt = (int)(n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS);
    KILN_TRY(mpi_status(MPI_Bcast(buf + off, cnt, MPI_FLOAT, root, comm_of(c)), "broadcast"));
  }
  return KILN_OK;
}

static int mpi_allreduce(kiln_comm *c, float *buf, int64_t n) {
  for (int64_t off = 0; off < n; off += CHUNK_FLOATS) {
    int cnt = (int)(n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS);
    KILN_TRY(mpi_status(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, comm_of(c)),
                        "allreduce"));
  }
  return KILN_OK;
}

static int mpi_allreduce_ordered(kiln_comm *c, float *buf, int64_t n) {
  mpi_state *st = c->impl;
  int64_t want = n < CHUNK_FLOATS ? n : CHUNK_FLOATS;
  if (c->rank == 0 && st->tmp_floats < want) {
    /* A failure here leaves the other ranks waiting: the caller must abort the job. */
    float *t = realloc(st->tmp, sizeof(float) * (size_t)want);
    if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the ordered reduction");
    st->tmp = t;
    st->tmp_floats = want;
  }
  for (int64_t off = 0; off < n; off += CHUNK_FLOATS) {
    int cnt = (int)(n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS);
    if (c->rank == 0) {
      for (int r = 1; r < c->size; r++) {
        KILN_TRY(mpi_status(MPI_Recv(st->tmp, cnt, MPI_FLOAT, r, ORDERED_TAG, st->comm,
                                     MPI_STATUS_IGNORE),
                            "receive (ordered sum)"));
        kiln_dist_accumulate(buf + off, st->tmp, cnt);
      }
    } else {
      KILN_TRY(mpi_status(MPI_Send(buf + off, cnt, MPI_FLOAT, 0, ORDERED_TAG, st->comm),
                          "send (ordered sum)"));
    }
  }
  return mpi_broadcast(c, buf, n, 0);
}

static int mpi_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  if (n > INT_MAX)
    return kiln_errorf(KILN_ERR_INVALID, "allgather of %zu bytes (at most %d)", n, INT_MAX);
  return mpi_status(MPI_Allgather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, comm_of(c)),
                    "allgather");
}

static void mpi_end_job(kiln_comm *c, int code) {
  (void)c;
  MPI_Abort(MPI_COMM_WORLD, code);
}

static void mpi_destroy(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (st->comm != MPI_COMM_NULL) MPI_Comm_free(&st->comm);
      if (st->we_initialised) MPI_Finalize();
    }
    free(st->tmp);
    free(st);
  }
  free(c);
}

static const kiln_comm_ops mpi_ops = {
    .name = "mpi",
    .barrier = mpi_barrier,
    .broadcast = mpi_broadcast,
    .allreduce_sum = mpi_allreduce,
    .allreduce_sum_ordered = mpi_allreduce_ordered,
    .allgather = mpi_allgather,
    .end_job = mpi_end_job,
    .destroy = mpi_destroy,
};

bool kiln_comm_mpi_built(void) { return true; }

int kiln_comm_mpi_create(int *argc, char ***argv, kiln_comm **out) {
  *out = NULL;
  kiln_comm *c = calloc(1, sizeof *c);
  mpi_state *st = calloc(1, sizeof *st);
  if (!c || !st) {
    free(c);
    free(st);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  c->ops = &mpi_ops;
  c->impl = st;
  st->comm = MPI_COMM_NULL;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    /* FUNNELED: prefetch and OpenMP threads exist, but only this thread calls MPI. */
    int provided = 0;
    int err = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (err != MPI_SUCCESS) {
      mpi_destroy(c);
      return kiln_errorf(KILN_ERR_COMM, "MPI_Init_thread failed (error %d)", err);
    }
    st->we_initialised = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &st->comm), "communicator duplication");
  if (!rc) MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
  if (!rc) rc = mpi_status(MPI_Comm_rank(st->comm, &c->rank), "rank");
  if (!rc) rc = mpi_status(MPI_Comm_size(st->comm, &c->size), "size");
  if (rc) {
    mpi_destroy(c);
    return rc;
  }
  *out = c;
  return KILN_OK;
}
