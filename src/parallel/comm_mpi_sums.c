/* Sums in flight for the MPI communicator (comm_mpi.c): the overlapped buckets of a gradient,
 * and the chunks of a whole-buffer allreduce, through MPI or, when every rank is on this host,
 * through shared memory (comm_mpi_shm.c).
 *
 * The ordered sum (--deterministic) is a reduce-scatter and an allgather of our own, in
 * point-to-point messages: rank r receives segment r of every other rank's buffer, adds the N
 * segments in rank order with kiln_parallel_accumulate() (rank 0's first, whoever adds them), and
 * sends the sum to every other rank. Each rank moves 2 (N-1)/N of the buffer, as a ring would,
 * and the bits do not depend on the library's algorithm. The same state machine serves the
 * overlapped buckets, so the ordered sum overlaps backward too. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi_internal.h"
#include "kiln/parallel.h"

/* ---- sums in flight: overlapped buckets and the ordered sum ------------------------------------ */

/* Segment q of a bucket of n floats dealt over `size` ranks: its offset and length. */
static int64_t seg(int64_t n, int q, int size, int64_t *len) {
  int64_t start = n * q / size;
  *len = n * (q + 1) / size - start;
  return start;
}

/* The ordered sum's exchanges. Stage 0: segment q of this rank's buffer goes to rank q, and the
 * other ranks' copies of this rank's segment arrive in tmp (slot q, or q - 1 past this rank).
 * Stage 1: this rank's added segment goes to every other rank, and theirs arrive in place. Every
 * rank posts a stage's messages for the buckets in bucket order, so with one tag per stage a
 * pair's messages match bucket for bucket. */
static int post_ordered(kiln_comm *c, bucket *b, int stage) {
  mpi_state *st = c->impl;
  int r = c->rank, size = c->size;
  int64_t len_r, off_r = seg(b->n, r, size, &len_r);
  int k = 0;
  /* a post that fails may leave its request unset: test_all skips null ones */
  for (int i = 0; i < 2 * (size - 1); i++) b->req[i] = MPI_REQUEST_NULL;
  for (int q = 0; q < size; q++) {
    if (q == r) continue;
    int64_t len_q, off_q = seg(b->n, q, size, &len_q);
    int err;
    if (stage == 0) {
      float *slot = b->tmp + (int64_t)(q < r ? q : q - 1) * len_r;
      err = MPI_Irecv(slot, (int)len_r, MPI_FLOAT, q, ORDERED_TAG, st->comm, &b->req[k++]);
      if (err == MPI_SUCCESS)
        err = MPI_Isend(b->buf + off_q, (int)len_q, MPI_FLOAT, q, ORDERED_TAG, st->comm,
                        &b->req[k++]);
    } else {
      err = MPI_Irecv(b->buf + off_q, (int)len_q, MPI_FLOAT, q, GATHER_TAG, st->comm, &b->req[k++]);
      if (err == MPI_SUCCESS)
        err = MPI_Isend(b->buf + off_r, (int)len_r, MPI_FLOAT, q, GATHER_TAG, st->comm,
                        &b->req[k++]);
    }
    b->nreq = k; /* what was posted, for test_all, even when a post failed */
    if (err != MPI_SUCCESS) return kiln_mpi_status(err, "point-to-point message (ordered sum)");
  }
  return KILN_OK;
}

/* This rank's segment becomes ((seg_0 + seg_1) + seg_2) + ... with kiln_parallel_accumulate: the
 * same additions in the same order as one process adding the ranks' buffers. Ranks before this
 * one are added up in rank 0's copy; their sum then goes into this rank's own segment in place
 * (a + b and b + a are the same float), and the later ranks after it. */
static void add_in_rank_order(kiln_comm *c, bucket *b) {
  int r = c->rank, size = c->size;
  int64_t len_r, off_r = seg(b->n, r, size, &len_r);
  float *own = b->buf + off_r;
  if (r > 0) {
    float *before = b->tmp; /* rank 0's copy, then ranks 1 .. r - 1 added */
    for (int q = 1; q < r; q++) kiln_parallel_accumulate(before, b->tmp + (int64_t)q * len_r, len_r);
    kiln_parallel_accumulate(own, before, len_r);
  }
  for (int q = r + 1; q < size; q++)
    kiln_parallel_accumulate(own, b->tmp + (int64_t)(q - 1) * len_r, len_r);
}

/* MPI_Testall, one request at a time (completed ones become MPI_REQUEST_NULL): with MPICH's
 * header, gcc 12 takes MPI_STATUSES_IGNORE for an empty array and warns. *flag: all complete. */
static int test_all(int n, MPI_Request *req, int *flag) {
  *flag = 1;
  for (int i = 0; i < n; i++) {
    if (req[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    int err = MPI_Test(&req[i], &done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) return err;
    if (!done) {
      *flag = 0;
      break; /* the rest advance inside MPI meanwhile */
    }
  }
  return MPI_SUCCESS;
}

/* Moves a sum on as far as its messages allow (stage 2: complete). */
static int advance(kiln_comm *c, bucket *b) {
  if (b->slot >= 0) {
    kiln_mpi_shm_advance(c, b);
    return KILN_OK;
  }
  while (b->stage < 2) {
    int flag = 0;
    KILN_TRY(kiln_mpi_status(test_all(b->nreq, b->req, &flag),
                        b->ordered ? "point-to-point message (ordered sum)" : "allreduce"));
    if (!flag) break;
    if (!b->ordered || b->stage == 1) {
      b->stage = 2;
      break;
    }
    add_in_rank_order(c, b);
    KILN_TRY(post_ordered(c, b, 1));
    b->stage = 1;
  }
  return KILN_OK;
}

/* Lets the sums in flight advance. A sum enters its second exchange only after every sum
 * before it has, so that every rank posts those messages in the same order. */
int kiln_mpi_progress_buckets(kiln_comm *c, void *arg, bool *all_done) {
  (void)arg;
  mpi_state *st = c->impl;
  for (int i = st->done_buckets; i < st->nbuckets; i++) {
    KILN_TRY(advance(c, &st->buckets[i]));
    if (st->buckets[i].stage == 0 && st->buckets[i].slot < 0) break;
  }
  while (st->done_buckets < st->nbuckets && st->buckets[st->done_buckets].stage == 2)
    st->done_buckets++;
  *all_done = st->done_buckets == st->nbuckets;
  return KILN_OK;
}

/* Starts the sum of buf (n floats) in place, in chunks that MPI's int counts can carry. */
int kiln_mpi_start_sums(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  for (int64_t off = 0; off < n; off += CHUNK_FLOATS) {
    if (st->nbuckets == st->cap_buckets) {
      int cap = st->cap_buckets ? 2 * st->cap_buckets : 16;
      bucket *v = realloc(st->buckets, sizeof *v * (size_t)cap);
      if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the sums in flight");
      memset(v + st->cap_buckets, 0, sizeof *v * (size_t)(cap - st->cap_buckets));
      st->buckets = v;
      st->cap_buckets = cap;
    }
    bucket *b = &st->buckets[st->nbuckets];
    if (!b->req) {
      b->req = malloc(sizeof *b->req * 2 * (size_t)c->size);
      if (!b->req) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the sums in flight");
    }
    b->buf = buf + off;
    b->n = n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS;
    b->ordered = ordered;
    b->stage = 0;
    b->nreq = 0;
    b->slot = -1;
    st->nbuckets++;
    /* every rank decides alike: the same buckets in the same order */
    if (st->shm && st->shm_slots < SHM_SLOTS && st->shm_floats + b->n <= CHUNK_FLOATS) {
      kiln_mpi_shm_start(c, b);
      continue;
    }
    if (ordered) {
      int64_t len;
      seg(b->n, c->rank, c->size, &len);
      int64_t want = (int64_t)(c->size - 1) * len;
      if (b->tmp_floats < want) {
        /* A failure here leaves the other ranks waiting: the caller must end the job. */
        float *t = realloc(b->tmp, sizeof(float) * (size_t)want);
        if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the ordered sum");
        b->tmp = t;
        b->tmp_floats = want;
      }
      KILN_TRY(post_ordered(c, b, 0));
    } else {
      b->nreq = 1;
      KILN_TRY(kiln_mpi_status(MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->n, MPI_FLOAT, MPI_SUM,
                                         st->comm, &b->req[0]),
                          "allreduce"));
    }
  }
  return KILN_OK;
}

/* The sums in flight are complete (or failed: the job ends): a new list, and a new round. */
void kiln_mpi_sums_over(mpi_state *st) {
  st->nbuckets = st->done_buckets = 0;
  st->shm_slots = 0;
  st->shm_floats = st->shm_copied = 0;
}

/* Waits for every sum in flight (one collective for the watchdog) and clears the list. */
static int finish_sums(kiln_comm *c) {
  int rc = kiln_mpi_wait_on(c, kiln_mpi_progress_buckets, NULL);
  kiln_mpi_sums_over(c->impl);
  kiln_mpi_end_op(c);
  return rc;
}

/* ---- overlapped bucket sums -------------------------------------------------------------- */

int kiln_mpi_bucket_progress(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st->ct) return KILN_OK; /* the thread does it */
  bool done;
  return kiln_mpi_progress_buckets(c, NULL, &done);
}

int kiln_mpi_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  if (st->ct) return kiln_mpi_thread_bucket_start(c, buf, n, ordered);
  if (st->nbuckets == 0) {
    kiln_mpi_begin_op(c, "overlapped gradient sum");
    st->bucket_floats = 0;
  }
  st->bucket_floats += n;
  KILN_TRY(kiln_mpi_start_sums(c, buf, n, ordered));
  return kiln_mpi_bucket_progress(c);
}

int kiln_mpi_bucket_finish(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st->ct) return kiln_mpi_thread_bucket_finish(c);
  if (st->nbuckets == 0) return KILN_OK;
  snprintf(st->what, sizeof st->what, "overlapped gradient sum of %lld floats in %d parts",
           (long long)st->bucket_floats, st->nbuckets);
  return finish_sums(c);
}
