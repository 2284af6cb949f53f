/* The communication thread (KILN_COMM_THREAD=POLL_US): it starts the overlapped sums that the
 * main thread queues and tests them every POLL_US microseconds while backward runs, instead of
 * the main thread testing them between layers. MPI then runs MPI_THREAD_SERIALIZED: from the
 * first queued bucket to the end of bucket_finish only this thread calls MPI, and the main thread
 * calls none. */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_mpi_internal.h"
#include "kiln/parallel.h"

typedef struct {
  float *buf;
  int64_t n;
  bool ordered;
} queued_sum;

struct comm_thread {
  pthread_t tid;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long poll_us;
  queued_sum *q;
  int qn, qtaken, qcap;
  bool active;  /* main: a round of buckets is under way */
  bool finish;  /* main: every bucket of the round is queued */
  bool done;    /* thread: the round is complete (rc, msg) */
  bool quit;
  int rc;
  char msg[1024];
};

static void thread_fail(comm_thread *ct, int rc) {
  if (ct->rc) return;
  ct->rc = rc;
  snprintf(ct->msg, sizeof ct->msg, "%s", kiln_last_error());
}

static void *comm_thread_main(void *arg) {
  kiln_comm *c = arg;
  mpi_state *st = c->impl;
  comm_thread *ct = st->ct;
  pthread_mutex_lock(&ct->mu);
  for (;;) {
    /* Outside a round (!active) the buckets are the main thread's (sum_now): not touched here. */
    while (!ct->quit && ct->qtaken == ct->qn && !ct->finish &&
           (!ct->active || st->nbuckets == 0))
      pthread_cond_wait(&ct->cv, &ct->mu);
    if (ct->quit) break;
    while (ct->qtaken < ct->qn) {
      queued_sum q = ct->q[ct->qtaken++];
      pthread_mutex_unlock(&ct->mu);
      int rc = ct->rc ? KILN_OK : kiln_mpi_start_sums(c, q.buf, q.n, q.ordered);
      pthread_mutex_lock(&ct->mu);
      if (rc) thread_fail(ct, rc);
    }
    if (ct->finish) {
      pthread_mutex_unlock(&ct->mu);
      int rc = ct->rc ? KILN_OK : kiln_mpi_wait_on(c, kiln_mpi_progress_buckets, NULL);
      kiln_mpi_sums_over(st);
      kiln_mpi_end_op(c);
      pthread_mutex_lock(&ct->mu);
      if (rc) thread_fail(ct, rc);
      ct->qn = ct->qtaken = 0;
      ct->finish = false;
      ct->done = true;
      pthread_cond_broadcast(&ct->cv);
      continue;
    }
    if (ct->active && st->nbuckets > st->done_buckets && !ct->rc) {
      pthread_mutex_unlock(&ct->mu);
      bool all;
      int rc = kiln_mpi_progress_buckets(c, NULL, &all);
      pthread_mutex_lock(&ct->mu);
      if (rc) thread_fail(ct, rc);
    }
    if (ct->qtaken == ct->qn && !ct->finish) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += ct->poll_us * 1000;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&ct->cv, &ct->mu, &until);
    }
  }
  pthread_mutex_unlock(&ct->mu);
  return NULL;
}

int kiln_mpi_thread_start(kiln_comm *c, long poll_us) {
  mpi_state *st = c->impl;
  comm_thread *ct = calloc(1, sizeof *ct);
  if (!ct) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  ct->poll_us = poll_us;
  pthread_mutex_init(&ct->mu, NULL);
  pthread_cond_init(&ct->cv, NULL);
  st->ct = ct;
  if (pthread_create(&ct->tid, NULL, comm_thread_main, c) != 0) {
    pthread_mutex_destroy(&ct->mu);
    pthread_cond_destroy(&ct->cv);
    free(ct);
    st->ct = NULL;
    return kiln_errorf(KILN_ERR_COMM, "cannot start the communication thread");
  }
  return KILN_OK;
}

void kiln_mpi_thread_stop(mpi_state *st) {
  comm_thread *ct = st->ct;
  if (!ct) return;
  pthread_mutex_lock(&ct->mu);
  ct->quit = true;
  pthread_cond_broadcast(&ct->cv);
  pthread_mutex_unlock(&ct->mu);
  pthread_join(ct->tid, NULL);
  pthread_mutex_destroy(&ct->mu);
  pthread_cond_destroy(&ct->cv);
  free(ct->q);
  free(ct);
  st->ct = NULL;
}

int kiln_mpi_thread_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  comm_thread *ct = st->ct;
  pthread_mutex_lock(&ct->mu);
  int rc = KILN_OK;
  if (!ct->active) {
    kiln_mpi_begin_op(c, "overlapped gradient sum");
    st->bucket_floats = 0;
    ct->active = true;
    ct->rc = 0;
  }
  if (ct->qn == ct->qcap) {
    int cap = ct->qcap ? 2 * ct->qcap : 16;
    queued_sum *q = realloc(ct->q, sizeof *q * (size_t)cap);
    if (!q) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory for the sums in flight");
    else {
      ct->q = q;
      ct->qcap = cap;
    }
  }
  if (!rc) {
    ct->q[ct->qn++] = (queued_sum){.buf = buf, .n = n, .ordered = ordered};
    st->bucket_floats += n;
    pthread_cond_broadcast(&ct->cv);
  }
  pthread_mutex_unlock(&ct->mu);
  return rc;
}

int kiln_mpi_thread_bucket_finish(kiln_comm *c) {
  mpi_state *st = c->impl;
  comm_thread *ct = st->ct;
  pthread_mutex_lock(&ct->mu);
  if (!ct->active) {
    pthread_mutex_unlock(&ct->mu);
    return KILN_OK;
  }
  snprintf(st->what, sizeof st->what, "overlapped gradient sum of %lld floats in %d parts",
           (long long)st->bucket_floats, ct->qn);
  ct->finish = true;
  pthread_cond_broadcast(&ct->cv);
  while (!ct->done) pthread_cond_wait(&ct->cv, &ct->mu);
  ct->done = ct->active = false;
  int rc = ct->rc;
  char msg[sizeof ct->msg];
  memcpy(msg, ct->msg, sizeof msg);
  ct->rc = 0;
  pthread_mutex_unlock(&ct->mu);
  return rc ? kiln_errorf(rc, "%s", msg) : KILN_OK;
}
