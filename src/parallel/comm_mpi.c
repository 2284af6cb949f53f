/* The MPI communicator (compiled when CMake finds MPI; KILN_HAVE_MPI). kiln talks on a duplicate
 * of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so a failed call becomes a status with MPI's message
 * instead of MPI's default abort. Counts are int in MPI, so large buffers go in chunks.
 *
 * This file holds start-up, the collectives and the watchdog; the sums are in comm_mpi_sums.c
 * (the ordered sum, the overlapped buckets), comm_mpi_shm.c (through shared memory on one host)
 * and comm_mpi_thread.c (the communication thread), and comm_mpi_internal.h holds the state
 * they share.
 *
 * The watchdog. Open MPI ends the job when a process dies, but a rank that stops without dying
 * (SIGSTOP, a hang outside MPI, a host cut off by the network) would leave the others in a
 * collective forever. So every collective here is started non-blocking (MPI_Iallreduce,
 * MPI_Ibcast, ...) and waited for in kiln_mpi_wait_on(): MPI_Test back to back for the first SPIN_MS (a
 * collective whose ranks arrive together is over by then, as with the blocking call), then with
 * sched_yield() between tests until YIELD_MS, then with sleeps of up to MAX_SLEEP_US, so that a
 * rank waiting for a slower one leaves the cores to it. A wait longer than c->timeout_s starts a
 * roll call on a second duplicate of the world communicator: the rank asks every other rank where
 * it is, and a rank that is waiting in any collective answers from its own polling loop (which
 * collective, since when).
 * After GRACE_MS the error names the ranks that did not answer and where the others are, and
 * the caller ends the job (kiln_comm_end_job). A collective that completes during the roll call
 * is no error. Everything stays on the thread that calls the collectives (MPI_THREAD_FUNNELED).
 * The watchdog covers the start-up too: kiln's communicators are made with MPI_Comm_idup, waited
 * for like any collective, with the roll call on MPI_COMM_WORLD until they exist. */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_mpi_internal.h"
#include "kiln/parallel.h"

#define SPIN_MS 2.0
#define YIELD_MS 20.0
#define MIN_SLEEP_US 20
#define MAX_SLEEP_US 1000
#define GRACE_MS 2000.0
#define LISTED_RANKS 8 /* a message lists this many ranks of a kind, then counts the rest */

/* A roll-call question or answer: where the sender is. */
typedef struct {
  uint64_t seq;      /* the sender's collective number: 1, 2, ... in call order on every rank */
  uint64_t reply_to; /* an answer: the seq of the collective the question came from */
  double waited_s;   /* how long the sender has waited in its collective */
  char what[64];     /* the collective, as in "allreduce of 620 floats" */
} roll_msg;

struct pending_send {
  MPI_Request req;
  roll_msg msg;
};

/* Where a rank runs: its host (MPI_Get_processor_name, cut to fit) and process id. */
struct rank_place {
  int32_t pid;
  char host[60];
};

int kiln_mpi_status(int err, const char *what) {
  if (err == MPI_SUCCESS) return KILN_OK;
  char msg[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = '\0';
  return kiln_errorf(KILN_ERR_COMM, "MPI %s failed: %s", what, len ? msg : "unknown error");
}

static MPI_Comm comm_of(kiln_comm *c) { return ((mpi_state *)c->impl)->comm; }

/* ---- the watchdog ------------------------------------------------------------------------- */

static void sleep_us(long us) {
  struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

void kiln_mpi_begin_op(kiln_comm *c, const char *fmt, ...) {
  mpi_state *st = c->impl;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->what, sizeof st->what, fmt, ap);
  va_end(ap);
  st->seq++;
  st->op_start_ms = kiln_now_ms();
  /* While this rank was away from the collectives, the others waited for it in one: say so
   * before a longer test pass or snapshot makes them give up. */
  double away_s = (st->op_start_ms - st->last_end_ms) / 1e3;
  if (st->last_end_ms > 0 && c->timeout_s > 0 && away_s > 0.5 * c->timeout_s && !st->warned_away) {
    st->warned_away = true;
    kiln_log(KILN_LOG_WARN,
             "rank %d was away from the collectives for %.1f s (a test pass, a snapshot, or "
             "stopped) while the other workers waited for it; they give up after %g s "
             "(--comm-timeout): raise the limit if test passes or snapshots take this long",
             c->rank, away_s, c->timeout_s);
  }
}

void kiln_mpi_end_op(kiln_comm *c) { ((mpi_state *)c->impl)->last_end_ms = kiln_now_ms(); }

/* Roll-call messages are small (sent eagerly), but MPI owns their buffers until the send
 * completes. */
static void reap_sends(mpi_state *st) {
  for (int i = 0; i < st->nsends;) {
    int done = 0;
    /* An error completes the request too (MPI frees it). */
    if (MPI_Test(&st->sends[i]->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
    if (done) {
      free(st->sends[i]);
      st->sends[i] = st->sends[--st->nsends];
    } else {
      i++;
    }
  }
}

/* Best effort: a roll call that cannot be sent only makes the report less precise. */
static void post_roll(kiln_comm *c, int to, int tag, uint64_t reply_to) {
  mpi_state *st = c->impl;
  if (st->nsends == st->cap_sends) {
    int cap = st->cap_sends ? 2 * st->cap_sends : 16;
    pending_send **s = realloc(st->sends, sizeof *s * (size_t)cap);
    if (!s) return;
    st->sends = s;
    st->cap_sends = cap;
  }
  pending_send *p = calloc(1, sizeof *p);
  if (!p) return;
  p->msg.seq = st->seq;
  p->msg.reply_to = reply_to;
  p->msg.waited_s = (kiln_now_ms() - st->op_start_ms) / 1e3;
  snprintf(p->msg.what, sizeof p->msg.what, "%s", st->what);
  if (MPI_Isend(&p->msg, (int)sizeof p->msg, MPI_BYTE, to, tag, st->watch, &p->req) != MPI_SUCCESS) {
    free(p);
    return;
  }
  st->sends[st->nsends++] = p;
}

/* Receives the roll-call messages that have arrived: answers another rank's question (this rank
 * is waiting in a collective, or it would not be here), and records answers to this rank's own
 * question in `answers` (others, from a roll call whose collective completed after all, are
 * dropped). `answer_to` is this rank's question (its seq), 0 when it asked none. */
static void serve_watch(kiln_comm *c, uint64_t answer_to, roll_msg *answers, bool *answered) {
  mpi_state *st = c->impl;
  for (;;) {
    int flag = 0;
    MPI_Status s;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, st->watch, &flag, &s) != MPI_SUCCESS || !flag) break;
    roll_msg m;
    if (MPI_Recv(&m, (int)sizeof m, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, st->watch,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    m.what[sizeof m.what - 1] = '\0';
    if (s.MPI_TAG == ROLL_CALL_TAG) {
      post_roll(c, s.MPI_SOURCE, ROLL_ANSWER_TAG, m.seq);
    } else if (answers && answer_to && m.reply_to == answer_to && s.MPI_SOURCE >= 0 &&
               s.MPI_SOURCE < c->size) {
      answers[s.MPI_SOURCE] = m;
      answered[s.MPI_SOURCE] = true;
    }
  }
  reap_sends(st);
}

/* Appends printf output at *len, never past cap (the message is cut, not overrun). */
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len >= cap - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* "rank 3" or "ranks 1, 2, 5 and 4 more" for the ranks r with pick[r]; with places, each listed
 * rank's process and host too: "rank 3 (pid 4242 on node2)". */
static void append_ranks(char *buf, size_t cap, size_t *len, const bool *pick, int size,
                         const rank_place *places) {
  int n = 0;
  for (int r = 0; r < size; r++) n += pick[r];
  append(buf, cap, len, n == 1 ? "rank" : "ranks");
  int listed = 0;
  for (int r = 0; r < size && listed < LISTED_RANKS; r++) {
    if (!pick[r]) continue;
    append(buf, cap, len, "%s %d", listed++ ? "," : "", r);
    if (places) append(buf, cap, len, " (pid %d on %s)", (int)places[r].pid, places[r].host);
  }
  if (n > listed) append(buf, cap, len, " and %d more", n - listed);
}

/* The start-up's two communicator duplications. */
static int poll_two_requests(kiln_comm *c, void *arg, bool *done) {
  int flag = 0;
  int err = MPI_Testall(2, arg, &flag, MPI_STATUSES_IGNORE);
  if (err != MPI_SUCCESS) return kiln_mpi_status(err, ((mpi_state *)c->impl)->what);
  *done = flag;
  return KILN_OK;
}

static int poll_request(kiln_comm *c, void *arg, bool *done) {
  int flag = 0;
  int err = MPI_Test(arg, &flag, MPI_STATUS_IGNORE);
  if (err != MPI_SUCCESS) return kiln_mpi_status(err, ((mpi_state *)c->impl)->what);
  *done = flag;
  return KILN_OK;
}

/* The wait passed the limit: ask every other rank where it is, give them GRACE_MS to answer,
 * then fail naming those that did not. KILN_OK if the collective completes meanwhile. */
static int roll_call(kiln_comm *c, poll_fn poll, void *arg, double waited_ms) {
  mpi_state *st = c->impl;
  roll_msg *answers = calloc((size_t)c->size, sizeof *answers);
  bool *answered = calloc((size_t)c->size, sizeof *answered);
  bool asked = answers && answered;
  if (asked)
    for (int r = 0; r < c->size; r++)
      if (r != c->rank) post_roll(c, r, ROLL_CALL_TAG, 0);
  double t0 = kiln_now_ms();
  int rc = -1;
  while (rc < 0 && kiln_now_ms() - t0 < GRACE_MS) {
    bool done = false;
    int err = poll(c, arg, &done);
    if (err) rc = err;
    else if (done) rc = KILN_OK;
    if (rc >= 0) break;
    serve_watch(c, asked ? st->seq : 0, answers, answered);
    int missing = 0;
    for (int r = 0; asked && r < c->size; r++) missing += r != c->rank && !answered[r];
    if (asked && missing == 0) break;
    sleep_us(MAX_SLEEP_US);
  }
  if (rc < 0) {
    char msg[1024];
    size_t len = 0;
    append(msg, sizeof msg, &len,
           "%s (collective %llu) waited %.1f s for the other workers, past the limit of %g s "
           "(--comm-timeout)",
           st->what, (unsigned long long)st->seq, waited_ms / 1e3, c->timeout_s);
    if (asked) {
      bool *pick = calloc((size_t)c->size, sizeof *pick);
      int n = 0;
      for (int r = 0; pick && r < c->size; r++) n += pick[r] = r != c->rank && !answered[r];
      if (n) {
        append(msg, sizeof msg, &len, ": ");
        append_ranks(msg, sizeof msg, &len, pick, c->size, st->places);
        append(msg, sizeof msg, &len, " did not answer (stopped, hung outside MPI, or cut off)");
      }
      n = 0;
      for (int r = 0; pick && r < c->size; r++)
        n += pick[r] = answered[r] && answers[r].seq == st->seq && !strcmp(answers[r].what, st->what);
      if (n) {
        append(msg, sizeof msg, &len, "; ");
        append_ranks(msg, sizeof msg, &len, pick, c->size, NULL);
        append(msg, sizeof msg, &len, " %s waiting in it too", n == 1 ? "is" : "are");
      }
      /* A rank may be one collective ahead or behind (a peer stopped half-way through one),
       * but the same number with another collective is a mismatch in the callers. */
      int listed = 0;
      bool mismatch = false;
      for (int r = 0; r < c->size; r++) {
        if (!answered[r] || (answers[r].seq == st->seq && !strcmp(answers[r].what, st->what)))
          continue;
        mismatch |= answers[r].seq == st->seq;
        if (listed++ < LISTED_RANKS)
          append(msg, sizeof msg, &len, "; rank %d is in %s (collective %llu, for %.1f s)", r,
                 answers[r].what, (unsigned long long)answers[r].seq, answers[r].waited_s);
      }
      if (mismatch) append(msg, sizeof msg, &len, ": the ranks called different collectives");
      free(pick);
    }
    rc = kiln_errorf(KILN_ERR_COMM, "%s", msg);
  }
  free(answers);
  free(answered);
  return rc;
}

/* Waits, within the limit, until `poll` says the current collective is complete. Three phases:
 * MPI_Test back to back for SPIN_MS; then each test followed by sched_yield() until YIELD_MS, so
 * that a rank sharing its core with another (an oversubscribed host) hands the core over, while
 * on a core of its own it still leaves the wait within microseconds; then sleeps of 1/16 of the
 * time waited (MIN_SLEEP_US to MAX_SLEEP_US), for long waits such as rank 0's test pass. A
 * training step waits here whenever another worker is late, often by a few milliseconds on a busy
 * or virtual machine; sleeping from the start would leave a rank up to a millisecond behind a
 * late peer, where yielding leaves it microseconds behind (`kiln-comm-bench ... late`). */
int kiln_mpi_wait_on(kiln_comm *c, poll_fn poll, void *arg) {
  double t0 = kiln_now_ms();
  for (;;) {
    bool done = false;
    KILN_TRY(poll(c, arg, &done));
    if (done) return KILN_OK;
    double waited = kiln_now_ms() - t0;
    if (waited < SPIN_MS) continue;
    serve_watch(c, 0, NULL, NULL);
    if (c->timeout_s > 0 && waited >= c->timeout_s * 1e3) return roll_call(c, poll, arg, waited);
    if (waited < YIELD_MS) {
      sched_yield();
      continue;
    }
    long pause_us = (long)(waited * 1e3 / 16);
    if (pause_us < MIN_SLEEP_US) pause_us = MIN_SLEEP_US;
    sleep_us(pause_us < MAX_SLEEP_US ? pause_us : MAX_SLEEP_US);
  }
}

/* Waits for one non-blocking operation of the current collective, within the limit. */
static int wait_for(kiln_comm *c, MPI_Request *req) { return kiln_mpi_wait_on(c, poll_request, req); }

/* ---- the collectives ---------------------------------------------------------------------- */

static int mpi_barrier(kiln_comm *c) {
  kiln_mpi_begin_op(c, "barrier");
  MPI_Request req;
  int rc = kiln_mpi_status(MPI_Ibarrier(comm_of(c), &req), "barrier");
  if (!rc) rc = wait_for(c, &req);
  kiln_mpi_end_op(c);
  return rc;
}

/* root's `count` elements of `type` (`size` bytes each) at buf, to every rank, in chunks that
 * MPI's int counts can carry. */
static int bcast_chunks(kiln_comm *c, void *buf, int64_t count, MPI_Datatype type, size_t size,
                        int root) {
  for (int64_t off = 0; off < count; off += CHUNK_FLOATS) {
    int cnt = (int)(count - off < CHUNK_FLOATS ? count - off : CHUNK_FLOATS);
    MPI_Request req;
    KILN_TRY(kiln_mpi_status(MPI_Ibcast((char *)buf + (size_t)off * size, cnt, type, root, comm_of(c), &req),
                        "broadcast"));
    KILN_TRY(wait_for(c, &req));
  }
  return KILN_OK;
}

static int mpi_broadcast(kiln_comm *c, float *buf, int64_t n, int root) {
  kiln_mpi_begin_op(c, "broadcast of %lld floats from rank %d", (long long)n, root);
  int rc = bcast_chunks(c, buf, n, MPI_FLOAT, sizeof(float), root);
  kiln_mpi_end_op(c);
  return rc;
}

static int mpi_broadcast_bytes(kiln_comm *c, void *buf, size_t n, int root) {
  kiln_mpi_begin_op(c, "broadcast of %zu bytes from rank %d", n, root);
  int rc = bcast_chunks(c, buf, (int64_t)n, MPI_BYTE, 1, root);
  kiln_mpi_end_op(c);
  return rc;
}

/* A whole buffer summed now, a chunk at a time (each through shared memory where it can be). */
static int sum_now(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  if (st->nbuckets) {
    kiln_mpi_end_op(c);
    return kiln_errorf(KILN_ERR_INVALID, "allreduce while %d overlapped sums are in flight",
                       st->nbuckets - st->done_buckets);
  }
  int rc = KILN_OK;
  for (int64_t off = 0; off < n && !rc; off += CHUNK_FLOATS) {
    rc = kiln_mpi_start_sums(c, buf + off, n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS, ordered);
    if (!rc) rc = kiln_mpi_wait_on(c, kiln_mpi_progress_buckets, NULL);
    kiln_mpi_sums_over(st);
  }
  kiln_mpi_end_op(c);
  return rc;
}

static int mpi_allreduce(kiln_comm *c, float *buf, int64_t n) {
  kiln_mpi_begin_op(c, "allreduce of %lld floats", (long long)n);
  return sum_now(c, buf, n, false);
}

static int mpi_allreduce_ordered(kiln_comm *c, float *buf, int64_t n) {
  kiln_mpi_begin_op(c, "ordered allreduce of %lld floats", (long long)n);
  return sum_now(c, buf, n, true);
}

static int mpi_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  if (n > INT_MAX)
    return kiln_errorf(KILN_ERR_INVALID, "allgather of %zu bytes (at most %d)", n, INT_MAX);
  kiln_mpi_begin_op(c, "allgather of %zu bytes", n);
  MPI_Request req;
  int rc = kiln_mpi_status(
      MPI_Iallgather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, comm_of(c), &req), "allgather");
  if (!rc) rc = wait_for(c, &req);
  kiln_mpi_end_op(c);
  return rc;
}

static void mpi_end_job(kiln_comm *c, int code) {
  (void)c;
  MPI_Abort(MPI_COMM_WORLD, code);
}

static void mpi_destroy(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st) {
    kiln_mpi_thread_stop(st);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (st->watch != MPI_COMM_NULL && st->watch != MPI_COMM_WORLD) {
        /* Roll-call messages left over from collectives that completed after all. */
        for (int flag = 1; flag;) {
          MPI_Status s;
          roll_msg m;
          if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, st->watch, &flag, &s) != MPI_SUCCESS) break;
          if (flag && MPI_Recv(&m, (int)sizeof m, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, st->watch,
                               MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        }
        reap_sends(st);
        for (int i = 0; i < st->nsends; i++) {
          MPI_Cancel(&st->sends[i]->req);
          MPI_Wait(&st->sends[i]->req, MPI_STATUS_IGNORE);
        }
        MPI_Comm_free(&st->watch);
      }
      if (st->shm) {
        MPI_Win_unlock_all(st->win);
        MPI_Win_free(&st->win);
      }
      if (st->node != MPI_COMM_NULL) MPI_Comm_free(&st->node);
      if (st->comm != MPI_COMM_NULL) MPI_Comm_free(&st->comm);
      if (st->we_initialised) MPI_Finalize();
    }
    for (int i = 0; i < st->nsends; i++) free(st->sends[i]);
    free(st->sends);
    for (int i = 0; i < st->cap_buckets; i++) {
      free(st->buckets[i].req);
      free(st->buckets[i].tmp);
    }
    free(st->buckets);
    free(st->shm_head);
    free(st->shm_data);
    free(st->shm_parts);
    free(st->places);
    free(st);
  }
  free(c);
}

static const kiln_comm_ops mpi_ops = {
    .name = "mpi",
    .barrier = mpi_barrier,
    .broadcast = mpi_broadcast,
    .broadcast_bytes = mpi_broadcast_bytes,
    .allreduce_sum = mpi_allreduce,
    .allreduce_sum_ordered = mpi_allreduce_ordered,
    .allgather = mpi_allgather,
    .bucket_start = kiln_mpi_bucket_start,
    .bucket_progress = kiln_mpi_bucket_progress,
    .bucket_finish = kiln_mpi_bucket_finish,
    .claim_sum_buffer = kiln_mpi_claim_sum_buffer,
    .release_sum_buffer = kiln_mpi_release_sum_buffer,
    .end_job = mpi_end_job,
    .destroy = mpi_destroy,
};

/* Every rank learns where every rank runs, and rank 0 logs it, one line per host (16 ranks a
 * line): "host node2: rank 2 (pid 4242), rank 3 (pid 4243)". A launcher that reports a dead
 * process by its id (MPICH's Hydra: "PID 4243 RUNNING AT node2") can then be read as a rank, and
 * the watchdog names the host and process of a rank that does not answer. */
static int gather_places(kiln_comm *c) {
  mpi_state *st = c->impl;
  rank_place me = {.pid = (int32_t)getpid()};
  char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
  int len = 0;
  if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0) snprintf(name, sizeof name, "?");
  snprintf(me.host, sizeof me.host, "%s", name);
  rank_place *all = calloc((size_t)c->size, sizeof *all);
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for %d ranks' host names", c->size);
  int rc = mpi_allgather(c, &me, sizeof me, all);
  if (rc) {
    free(all);
    return rc;
  }
  st->places = all;
  if (c->rank != 0 || c->size < 2) return KILN_OK;
  bool *logged = calloc((size_t)c->size, sizeof *logged);
  if (!logged) return KILN_OK; /* the table is a courtesy */
  for (int r = 0; r < c->size; r++) {
    char line[1024];
    size_t n = 0;
    int listed = 0;
    for (int q = r; q < c->size; q++) {
      if (logged[q] || strcmp(all[q].host, all[r].host)) continue;
      logged[q] = true;
      if (listed == 0) append(line, sizeof line, &n, "host %s: ", all[r].host);
      append(line, sizeof line, &n, "%srank %d (pid %d)", listed ? ", " : "", q, (int)all[q].pid);
      if (++listed == 16) {
        kiln_log(KILN_LOG_INFO, "%s", line);
        n = 0;
        listed = 0;
      }
    }
    if (listed) kiln_log(KILN_LOG_INFO, "%s", line);
  }
  free(logged);
  return KILN_OK;
}

bool kiln_comm_mpi_built(void) { return true; }

/* Whether kiln_comm_mpi_init started MPI (and so the communicator finalizes it). */
static bool kiln_started_mpi;

int kiln_comm_mpi_init(int *argc, char ***argv, const kiln_config *cfg) {
  if (!cfg) cfg = kiln_config_defaults();
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return KILN_OK;
  kiln_fault_stop(&cfg->fault, "start", cfg->launcher_rank);
  /* Open MPI's non-blocking allreduce (coll/libnbc) takes a binomial tree on fewer than 4 ranks
   * or in place: the whole buffer goes to rank 0 and back, several times the blocking
   * MPI_Allreduce's time on 2 ranks (kiln-comm-bench). Reduce-scatter + allgather (Rabenseifner,
   * libnbc's own choice for 4 ranks and more) matches the blocking call. A value the user set in
   * the environment wins; other MPI libraries ignore the variable. */
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
  /* FUNNELED: prefetch and OpenMP threads exist, but only this thread calls MPI; with the
   * communication thread, SERIALIZED (never two at once). */
  int provided = 0;
  int err = MPI_Init_thread(argc, argv,
                            cfg->comm_thread_us ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED,
                            &provided);
  if (err != MPI_SUCCESS) return kiln_errorf(KILN_ERR_COMM, "MPI_Init_thread failed (error %d)", err);
  kiln_started_mpi = true;
  return KILN_OK;
}

int kiln_comm_mpi_create(int *argc, char ***argv, const kiln_config *cfg, kiln_comm **out) {
  *out = NULL;
  if (!cfg) cfg = kiln_config_defaults();
  KILN_TRY(kiln_comm_mpi_init(argc, argv, cfg));
  kiln_comm *c = calloc(1, sizeof *c);
  mpi_state *st = calloc(1, sizeof *st);
  if (!c || !st) {
    free(c);
    free(st);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  c->ops = &mpi_ops;
  c->impl = st;
  c->timeout_s = cfg->comm_timeout_s;
  st->comm = st->watch = st->node = MPI_COMM_NULL;
  st->shm_mode = cfg->comm_shm;
  st->we_initialised = kiln_started_mpi;
  long poll_us = st->we_initialised ? cfg->comm_thread_us : 0;
  int provided = 0;
  if (poll_us && (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_SERIALIZED)) {
    kiln_log(KILN_LOG_WARN, "this MPI library does not allow MPI_THREAD_SERIALIZED: no "
                            "communication thread, the sums are polled between layers");
    poll_us = 0;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = kiln_mpi_status(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), "rank");
  if (!rc) rc = kiln_mpi_status(MPI_Comm_size(MPI_COMM_WORLD, &c->size), "size");
  if (rc) {
    mpi_destroy(c);
    return rc;
  }
  kiln_fault_stop(&cfg->fault, "init", c->rank);
  /* kiln talks on communicators of its own, one for the collectives and one for the roll call;
   * duplicating is the job's first collective, so it waits within the limit like the others,
   * with the roll call on the world communicator meanwhile. */
  st->watch = MPI_COMM_WORLD;
  MPI_Comm made[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  kiln_mpi_begin_op(c, "start-up (communicator duplication)");
  rc = kiln_mpi_status(MPI_Comm_idup(MPI_COMM_WORLD, &made[0], &req[0]), "communicator duplication");
  if (!rc)
    rc = kiln_mpi_status(MPI_Comm_idup(MPI_COMM_WORLD, &made[1], &req[1]), "communicator duplication");
  if (!rc) rc = kiln_mpi_wait_on(c, poll_two_requests, req);
  kiln_mpi_end_op(c);
  if (!rc) {
    st->comm = made[0];
    st->watch = made[1];
    MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(st->watch, MPI_ERRORS_RETURN);
  }
  if (rc) {
    /* MPI_Finalize would wait for ranks that are still setting up (or stopped): in a job of
     * several processes hand back the communicator, whose end_job aborts them all. */
    if (c->size > 1) {
      *out = c;
      return rc;
    }
    mpi_destroy(c);
    return rc;
  }
  kiln_fault_stop(&cfg->fault, "setup", c->rank);
  rc = gather_places(c);
  if (rc) {
    *out = c; /* the caller ends the job */
    return rc;
  }
  kiln_mpi_shm_setup(c);
  if (poll_us && c->size > 1) {
    rc = kiln_mpi_thread_start(c, poll_us);
    if (rc) {
      *out = c; /* the caller ends the job */
      return rc;
    }
    if (c->rank == 0)
      kiln_log(KILN_LOG_INFO, "a communication thread tests the overlapped sums every %ld us",
               poll_us);
  }
  *out = c;
  return KILN_OK;
}
