/* The MPI communicator (compiled when CMake finds MPI; KILN_HAVE_MPI). kiln talks on a duplicate
 * of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so a failed call becomes a status with MPI's message
 * instead of MPI's default abort. Counts are int in MPI, so large buffers go in chunks.
 *
 * The ordered sum (--deterministic) is a reduce-scatter and an allgather of our own, in
 * point-to-point messages: rank r receives segment r of every other rank's buffer, adds the N
 * segments in rank order with kiln_parallel_accumulate() (rank 0's first, whoever adds them), and
 * sends the sum to every other rank. Each rank moves 2 (N-1)/N of the buffer, as a ring would,
 * and the bits do not depend on the library's algorithm. The same state machine serves the
 * overlapped buckets, so the ordered sum overlaps backward too.
 *
 * The watchdog. Open MPI ends the job when a process dies, but a rank that stops without dying
 * (SIGSTOP, a hang outside MPI, a host cut off by the network) would leave the others in a
 * collective forever. So every collective here is started non-blocking (MPI_Iallreduce,
 * MPI_Ibcast, ...) and waited for in wait_on(): MPI_Test back to back for the first SPIN_MS (a
 * collective whose ranks arrive together is over by then, as with the blocking call), then with
 * sched_yield() between tests until YIELD_MS, then with sleeps of up to MAX_SLEEP_US, so that a
 * rank waiting for a slower one leaves the cores to it. A wait longer than c->timeout_s starts a
 * roll call on a second duplicate of the world communicator: the rank asks every other rank where
 * it is, and a rank that is waiting in any collective answers from its own polling loop (which
 * collective, since when).
 * After GRACE_MS the error names the ranks that did not answer and where the others are, and
 * the caller ends the job (kiln_comm_end_job). A collective that completes during the roll call
 * is no error. Everything stays on the thread that calls the collectives (MPI_THREAD_FUNNELED).
 *
 * Sums through shared memory. When every rank is on one host (MPI_COMM_TYPE_SHARED), the sums
 * (overlapped buckets, allreduce, ordered allreduce) skip MPI: each rank has a segment of an
 * MPI-3 shared window. A rank's addend is in its own segment, either where it lies (the first
 * ARENA_FLOATS of the segment are lent to the solver, which places the train net's gradients
 * there: kiln_comm_claim_sum_buffer) or copied in after them; the rank publishes the addend's
 * offset and says it is there (`ready`, the round's number, in its segment's header). Rank q
 * then adds part q of the sum over the ranks' segments in rank order (kiln_parallel_sum_to_all:
 * ((s0 + s1) + s2) ..., the bits of the ordered sum, so every sum on one host is
 * deterministic), writes the result into every rank's segment and says so (`done`); once every
 * part is done, each rank has the whole sum in its own segment, where the solver reads it (or it
 * is copied out). From a bucket's `ready` to every rank's `done`, only rank q touches part q of
 * that bucket in any segment (meanwhile the owner writes other places of its segment: the
 * gradients backward is still computing, other buckets' copies); a rank writes the bucket's place
 * again only after every `done` of the round. Release stores and acquire loads of the round
 * numbers order the writes: no locks. Waits go through wait_on() as for MPI, watchdog
 * included. Why not MPI's own transfers on one host: their time for the same buffer varies
 * widely from minute to minute on a shared machine, and a sum where the gradients lie needs no
 * copies in or out, which would take time from backward (`kiln-comm-bench` and `bench/mpi`
 * measure both; docs/PERF.md). KILN_COMM_SHM=0 keeps every sum in MPI; KILN_COMM_SHM=copy lends
 * no memory (every addend copied). */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/parallel.h"

enum {
  CHUNK_FLOATS = 1 << 22,
  ARENA_FLOATS = 1 << 21, /* the start of each shared segment: a gradient summed where it lies */
  ORDERED_TAG = 0x6b6c, /* the ordered sum's segments on their way to be added */
  ROLL_CALL_TAG = 0x6b6d,
  ROLL_ANSWER_TAG,
  GATHER_TAG /* the ordered sum's added segments on their way back */
};
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

typedef struct {
  MPI_Request req;
  roll_msg msg;
} pending_send;

/* Where a rank runs: its host (MPI_Get_processor_name, cut to fit) and process id. */
typedef struct {
  int32_t pid;
  char host[60];
} rank_place;

/* One sum in flight: an MPI_Iallreduce, or an ordered sum going through its two exchanges. The
 * slots persist across iterations (the same buckets come back every step), so after the first
 * step nothing is allocated. */
typedef struct {
  float *buf;
  int64_t n;
  bool ordered;
  int slot;           /* >= 0: summed through shared memory, in this slot of the round */
  int64_t shm_off;    /* ... at this offset of this rank's segment */
  bool in_place;      /* ... where buf lies (the claimed sum buffer): no copies */
  int stage;          /* 0: first exchange (or the allreduce) in flight, 1: second, 2: done;
                         shared memory: 0 waiting for every rank's addend, 1 for every part */
  MPI_Request *req;   /* 1, or 2 (N-1) for an ordered sum */
  int nreq;
  float *tmp;         /* ordered: the other ranks' copies of this rank's segment */
  int64_t tmp_floats;
} bucket;

/* The communication thread (KILN_COMM_THREAD=POLL_US): it starts the overlapped sums that the
 * main thread queues and tests them every POLL_US microseconds while backward runs, instead of
 * the main thread testing them between layers. MPI then runs MPI_THREAD_SERIALIZED: from the
 * first queued bucket to the end of bucket_finish only this thread calls MPI, and the main thread
 * calls none. */
typedef struct {
  float *buf;
  int64_t n;
  bool ordered;
} queued_sum;

typedef struct {
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
} comm_thread;

/* The header of each rank's segment of the shared window: round numbers and offsets, written by
 * the rank that owns the segment, read by all. The floats follow at SHM_HEADER bytes. */
enum { SHM_SLOTS = 512, SHM_HEADER = 16384 };
typedef struct {
  _Atomic uint64_t ready[SHM_SLOTS]; /* this rank's addend of the slot's sum is in its segment */
  _Atomic uint64_t done[SHM_SLOTS];  /* this rank's part of the slot's sum is in every segment */
  int64_t off[SHM_SLOTS]; /* where in this segment's floats (set before `ready` is released) */
} shm_header;
_Static_assert(sizeof(shm_header) <= SHM_HEADER, "shared-memory header too large");
/* atomics that take a lock would take a lock private to each process */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free across processes");

typedef struct {
  MPI_Comm comm;  /* the collectives */
  MPI_Comm watch; /* the watchdog's roll calls, apart from the collectives' messages */
  bool we_initialised;
  /* The collective this rank is in (or was in last), for messages and roll-call answers. */
  char what[64];
  uint64_t seq;
  double op_start_ms, last_end_ms;
  bool warned_away;
  pending_send **sends; /* roll-call messages not yet known to be delivered */
  rank_place *places;   /* per rank, gathered at start (NULL until then) */
  int nsends, cap_sends;
  /* Sums in flight: the overlapped buckets of one gradient (one collective for the watchdog:
   * begun with the first bucket, ended by bucket_finish), or the chunks of one allreduce. */
  bucket *buckets;
  int64_t bucket_floats;
  int nbuckets, cap_buckets;
  int done_buckets; /* buckets[0 .. done_buckets) are complete */
  comm_thread *ct;  /* NULL: the main thread polls between layers */
  /* sums through shared memory (every rank on this host) */
  bool shm;
  MPI_Comm node;
  MPI_Win win;
  shm_header **shm_head; /* per rank */
  float **shm_data;      /* per rank: ARENA_FLOATS + CHUNK_FLOATS floats (and a little slack) */
  float **shm_parts;     /* per rank: scratch for kiln_parallel_sum_to_all */
  uint64_t shm_round;    /* the round under way (or last), 1, 2, ... */
  int shm_slots;         /* slots used in this round */
  int64_t shm_floats;    /* floats of the round's sums (as if all were copied: alike on every
                            rank, whatever each rank sums in place) */
  int64_t shm_copied;    /* floats copied into this rank's segment this round, after the arena */
  bool arena_lent;       /* the segment's first ARENA_FLOATS are the claimed sum buffer */
  kiln_comm_shm shm_mode;    /* kiln_config.comm_shm of this rank */
} mpi_state;

static int mpi_status(int err, const char *what) {
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

static void begin_op(kiln_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void begin_op(kiln_comm *c, const char *fmt, ...) {
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

static void end_op(kiln_comm *c) { ((mpi_state *)c->impl)->last_end_ms = kiln_now_ms(); }

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

/* Whether what a rank waits for is complete: one request, or the sums in flight. */
typedef int (*poll_fn)(kiln_comm *c, void *arg, bool *done);

static int poll_request(kiln_comm *c, void *arg, bool *done) {
  int flag = 0;
  int err = MPI_Test(arg, &flag, MPI_STATUS_IGNORE);
  if (err != MPI_SUCCESS) return mpi_status(err, ((mpi_state *)c->impl)->what);
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
static int wait_on(kiln_comm *c, poll_fn poll, void *arg) {
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
static int wait_for(kiln_comm *c, MPI_Request *req) { return wait_on(c, poll_request, req); }

/* ---- the collectives ---------------------------------------------------------------------- */

static int mpi_barrier(kiln_comm *c) {
  begin_op(c, "barrier");
  MPI_Request req;
  int rc = mpi_status(MPI_Ibarrier(comm_of(c), &req), "barrier");
  if (!rc) rc = wait_for(c, &req);
  end_op(c);
  return rc;
}

/* root's `count` elements of `type` (`size` bytes each) at buf, to every rank, in chunks that
 * MPI's int counts can carry. */
static int bcast_chunks(kiln_comm *c, void *buf, int64_t count, MPI_Datatype type, size_t size,
                        int root) {
  for (int64_t off = 0; off < count; off += CHUNK_FLOATS) {
    int cnt = (int)(count - off < CHUNK_FLOATS ? count - off : CHUNK_FLOATS);
    MPI_Request req;
    KILN_TRY(mpi_status(MPI_Ibcast((char *)buf + (size_t)off * size, cnt, type, root, comm_of(c), &req),
                        "broadcast"));
    KILN_TRY(wait_for(c, &req));
  }
  return KILN_OK;
}

static int mpi_broadcast(kiln_comm *c, float *buf, int64_t n, int root) {
  begin_op(c, "broadcast of %lld floats from rank %d", (long long)n, root);
  int rc = bcast_chunks(c, buf, n, MPI_FLOAT, sizeof(float), root);
  end_op(c);
  return rc;
}

static int mpi_broadcast_bytes(kiln_comm *c, void *buf, size_t n, int root) {
  begin_op(c, "broadcast of %zu bytes from rank %d", n, root);
  int rc = bcast_chunks(c, buf, (int64_t)n, MPI_BYTE, 1, root);
  end_op(c);
  return rc;
}

/* Forward declarations: the sums in flight (below) serve the whole-buffer sums too. */
static int start_sums(kiln_comm *c, float *buf, int64_t n, bool ordered);
static int progress_buckets(kiln_comm *c, void *arg, bool *all_done);
static void sums_over(mpi_state *st);

/* A whole buffer summed now, a chunk at a time (each through shared memory where it can be). */
static int sum_now(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  if (st->nbuckets) {
    end_op(c);
    return kiln_errorf(KILN_ERR_INVALID, "allreduce while %d overlapped sums are in flight",
                       st->nbuckets - st->done_buckets);
  }
  int rc = KILN_OK;
  for (int64_t off = 0; off < n && !rc; off += CHUNK_FLOATS) {
    rc = start_sums(c, buf + off, n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS, ordered);
    if (!rc) rc = wait_on(c, progress_buckets, NULL);
    sums_over(st);
  }
  end_op(c);
  return rc;
}

static int mpi_allreduce(kiln_comm *c, float *buf, int64_t n) {
  begin_op(c, "allreduce of %lld floats", (long long)n);
  return sum_now(c, buf, n, false);
}

/* ---- sums in flight: overlapped buckets and the ordered sum ------------------------------------ */

/* Segment q of a bucket of n floats dealt over `size` ranks: its offset and length. */
static int64_t seg(int64_t n, int q, int size, int64_t *len) {
  int64_t start = n * q / size;
  *len = n * (q + 1) / size - start;
  return start;
}

/* ---- sums through shared memory ------------------------------------------------------------ */

typedef enum { SHM_READY, SHM_DONE } shm_mark;

/* Every rank's `mark` of `slot` has reached `round`. */
static bool all_reached(mpi_state *st, int size, shm_mark mark, int slot, uint64_t round) {
  for (int r = 0; r < size; r++) {
    shm_header *h = st->shm_head[r];
    _Atomic uint64_t *v = mark == SHM_READY ? &h->ready[slot] : &h->done[slot];
    if (atomic_load_explicit(v, memory_order_acquire) < round) return false;
  }
  return true;
}

/* Part q of a shared-memory sum of n floats: as seg(), with the boundaries on 16 floats (64
 * bytes) so that two ranks never write one cache line. */
static int64_t shm_part(int64_t n, int q, int size, int64_t *len) {
  int64_t start = q == 0 ? 0 : (n * q / size) & ~(int64_t)15;
  int64_t end = q == size - 1 ? n : (n * (q + 1) / size) & ~(int64_t)15;
  *len = end - start;
  return start;
}

static bool in_arena(const mpi_state *st, int rank, const float *buf, int64_t n) {
  uintptr_t a = (uintptr_t)st->shm_data[rank], b = (uintptr_t)buf;
  return st->arena_lent && b >= a && b + (uintptr_t)n * sizeof(float) <=
                                         a + (uintptr_t)ARENA_FLOATS * sizeof(float);
}

/* This rank's addend goes into its segment: where it lies when buf is in the claimed sum buffer,
 * else copied after the arena; its offset and `ready` tell the others. */
static void shm_start(kiln_comm *c, bucket *b) {
  mpi_state *st = c->impl;
  if (st->shm_slots == 0) st->shm_round++;
  b->slot = st->shm_slots++;
  int64_t padded = (b->n + 15) & ~(int64_t)15; /* the next one 64-byte aligned */
  st->shm_floats += padded;
  b->in_place = in_arena(st, c->rank, b->buf, b->n);
  if (b->in_place) {
    b->shm_off = (int64_t)(((uintptr_t)b->buf - (uintptr_t)st->shm_data[c->rank]) / sizeof(float));
  } else {
    b->shm_off = ARENA_FLOATS + st->shm_copied;
    st->shm_copied += padded;
    memcpy(st->shm_data[c->rank] + b->shm_off, b->buf, sizeof(float) * (size_t)b->n);
  }
  shm_header *h = st->shm_head[c->rank];
  h->off[b->slot] = b->shm_off;
  atomic_store_explicit(&h->ready[b->slot], st->shm_round, memory_order_release);
}

/* Moves a shared-memory sum on: once every addend is in, this rank adds part q over the ranks
 * and writes the sum into every rank's segment; once every part is done, the sum is in this
 * rank's segment (copied out unless the bucket is summed in place). */
static void shm_advance(kiln_comm *c, bucket *b) {
  mpi_state *st = c->impl;
  uint64_t round = st->shm_round;
  if (b->stage == 0 && all_reached(st, c->size, SHM_READY, b->slot, round)) {
    int64_t len, off = shm_part(b->n, c->rank, c->size, &len);
    for (int r = 0; r < c->size; r++)
      st->shm_parts[r] = st->shm_data[r] + st->shm_head[r]->off[b->slot] + off;
    kiln_parallel_sum_to_all(st->shm_parts, c->size, len);
    atomic_store_explicit(&st->shm_head[c->rank]->done[b->slot], round, memory_order_release);
    b->stage = 1;
  }
  if (b->stage == 1 && all_reached(st, c->size, SHM_DONE, b->slot, round)) {
    if (!b->in_place)
      memcpy(b->buf, st->shm_data[c->rank] + b->shm_off, sizeof(float) * (size_t)b->n);
    b->stage = 2;
  }
}

/* The sums in flight are complete (or failed: the job ends): a new list, and a new round. */
static void sums_over(mpi_state *st) {
  st->nbuckets = st->done_buckets = 0;
  st->shm_slots = 0;
  st->shm_floats = st->shm_copied = 0;
}

static float *mpi_claim_sum_buffer(kiln_comm *c, int64_t n) {
  mpi_state *st = c->impl;
  if (!st->shm || st->arena_lent || n > ARENA_FLOATS) return NULL;
  if (st->shm_mode == KILN_COMM_SHM_COPY) return NULL; /* sums through copies (measurements) */
  st->arena_lent = true;
  return st->shm_data[c->rank];
}

static void mpi_release_sum_buffer(kiln_comm *c, float *buf) {
  mpi_state *st = c->impl;
  if (st->shm && buf == st->shm_data[c->rank]) st->arena_lent = false;
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
    if (err != MPI_SUCCESS) return mpi_status(err, "point-to-point message (ordered sum)");
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
    shm_advance(c, b);
    return KILN_OK;
  }
  while (b->stage < 2) {
    int flag = 0;
    KILN_TRY(mpi_status(test_all(b->nreq, b->req, &flag),
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
static int progress_buckets(kiln_comm *c, void *arg, bool *all_done) {
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
static int start_sums(kiln_comm *c, float *buf, int64_t n, bool ordered) {
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
      shm_start(c, b);
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
      KILN_TRY(mpi_status(MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->n, MPI_FLOAT, MPI_SUM,
                                         st->comm, &b->req[0]),
                          "allreduce"));
    }
  }
  return KILN_OK;
}

/* Waits for every sum in flight (one collective for the watchdog) and clears the list. */
static int finish_sums(kiln_comm *c) {
  int rc = wait_on(c, progress_buckets, NULL);
  sums_over(c->impl);
  end_op(c);
  return rc;
}

/* ---- the communication thread ------------------------------------------------------------- */

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
      int rc = ct->rc ? KILN_OK : start_sums(c, q.buf, q.n, q.ordered);
      pthread_mutex_lock(&ct->mu);
      if (rc) thread_fail(ct, rc);
    }
    if (ct->finish) {
      pthread_mutex_unlock(&ct->mu);
      int rc = ct->rc ? KILN_OK : wait_on(c, progress_buckets, NULL);
      sums_over(st);
      end_op(c);
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
      int rc = progress_buckets(c, NULL, &all);
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

static int comm_thread_start(kiln_comm *c, long poll_us) {
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

static void comm_thread_stop(mpi_state *st) {
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

static int thread_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  comm_thread *ct = st->ct;
  pthread_mutex_lock(&ct->mu);
  int rc = KILN_OK;
  if (!ct->active) {
    begin_op(c, "overlapped gradient sum");
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

static int thread_bucket_finish(kiln_comm *c) {
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

/* ---- overlapped bucket sums -------------------------------------------------------------- */

static int mpi_bucket_progress(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st->ct) return KILN_OK; /* the thread does it */
  bool done;
  return progress_buckets(c, NULL, &done);
}

static int mpi_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  mpi_state *st = c->impl;
  if (st->ct) return thread_bucket_start(c, buf, n, ordered);
  if (st->nbuckets == 0) {
    begin_op(c, "overlapped gradient sum");
    st->bucket_floats = 0;
  }
  st->bucket_floats += n;
  KILN_TRY(start_sums(c, buf, n, ordered));
  return mpi_bucket_progress(c);
}

static int mpi_bucket_finish(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st->ct) return thread_bucket_finish(c);
  if (st->nbuckets == 0) return KILN_OK;
  snprintf(st->what, sizeof st->what, "overlapped gradient sum of %lld floats in %d parts",
           (long long)st->bucket_floats, st->nbuckets);
  return finish_sums(c);
}

static int mpi_allreduce_ordered(kiln_comm *c, float *buf, int64_t n) {
  begin_op(c, "ordered allreduce of %lld floats", (long long)n);
  return sum_now(c, buf, n, true);
}

static int mpi_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  if (n > INT_MAX)
    return kiln_errorf(KILN_ERR_INVALID, "allgather of %zu bytes (at most %d)", n, INT_MAX);
  begin_op(c, "allgather of %zu bytes", n);
  MPI_Request req;
  int rc = mpi_status(
      MPI_Iallgather(send, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, comm_of(c), &req), "allgather");
  if (!rc) rc = wait_for(c, &req);
  end_op(c);
  return rc;
}

static void mpi_end_job(kiln_comm *c, int code) {
  (void)c;
  MPI_Abort(MPI_COMM_WORLD, code);
}

static void mpi_destroy(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (st) {
    comm_thread_stop(st);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (st->watch != MPI_COMM_NULL) {
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
    .bucket_start = mpi_bucket_start,
    .bucket_progress = mpi_bucket_progress,
    .bucket_finish = mpi_bucket_finish,
    .claim_sum_buffer = mpi_claim_sum_buffer,
    .release_sum_buffer = mpi_release_sum_buffer,
    .end_job = mpi_end_job,
    .destroy = mpi_destroy,
};

/* Sums through shared memory when every rank is on this host, unless KILN_COMM_SHM=0. Every
 * rank reaches the same decision (the node split is collective, and a failed allocation on any
 * rank turns it off everywhere); a failure leaves the sums in MPI, with a warning. Blocking
 * calls, as the communicator's own setup. */
static void shm_setup(kiln_comm *c) {
  mpi_state *st = c->impl;
  if (c->size < 2) return;
  /* KILN_COMM_SHM=0 on any rank (the environment may differ) turns it off on all */
  int want = st->shm_mode != KILN_COMM_SHM_OFF, all_want = 0;
  if (MPI_Allreduce(&want, &all_want, 1, MPI_INT, MPI_MIN, st->comm) != MPI_SUCCESS || !all_want)
    return;
  if (MPI_Comm_split_type(st->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &st->node) !=
      MPI_SUCCESS) {
    st->node = MPI_COMM_NULL;
    return;
  }
  MPI_Comm_set_errhandler(st->node, MPI_ERRORS_RETURN);
  int nsize = 0;
  MPI_Comm_size(st->node, &nsize);
  if (nsize != c->size) return; /* several hosts: MPI (the split agrees on every rank) */
  void *base = NULL;
  MPI_Aint bytes = SHM_HEADER + (MPI_Aint)sizeof(float) * (ARENA_FLOATS + CHUNK_FLOATS + 16);
  MPI_Info info; /* each rank's segment on its own pages (placed near that rank) */
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  int made = MPI_Win_allocate_shared(bytes, 1, info, st->node, &base, &st->win) == MPI_SUCCESS;
  MPI_Info_free(&info);
  if (made) MPI_Win_set_errhandler(st->win, MPI_ERRORS_RETURN);
  int ok = made;
  st->shm_head = calloc((size_t)c->size, sizeof *st->shm_head);
  st->shm_data = calloc((size_t)c->size, sizeof *st->shm_data);
  st->shm_parts = calloc((size_t)c->size, sizeof *st->shm_parts);
  ok = ok && st->shm_head && st->shm_data && st->shm_parts;
  for (int r = 0; ok && r < c->size; r++) {
    MPI_Aint sz;
    int unit;
    char *seg_base = NULL;
    ok = MPI_Win_shared_query(st->win, r, &sz, &unit, &seg_base) == MPI_SUCCESS && sz >= bytes;
    st->shm_head[r] = (shm_header *)seg_base;
    st->shm_data[r] = (float *)(seg_base + SHM_HEADER);
  }
  if (ok) {
    shm_header *h = st->shm_head[c->rank];
    for (int i = 0; i < SHM_SLOTS; i++) {
      atomic_init(&h->ready[i], 0);
      atomic_init(&h->done[i], 0);
    }
    atomic_thread_fence(memory_order_seq_cst); /* before the others may look (the allreduce) */
  }
  int mine[2] = {made, ok}, all[2] = {0, 0};
  if (MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, st->node) != MPI_SUCCESS)
    all[0] = all[1] = 0;
  if (!all[1]) {
    if (c->rank == 0)
      kiln_log(KILN_LOG_WARN, "no shared memory for the sums between this host's ranks: the sums "
                              "go through MPI");
    if (all[0]) MPI_Win_free(&st->win); /* collective: only if every rank has one */
    return;
  }
  MPI_Win_lock_all(MPI_MODE_NOCHECK, st->win);
  st->shm = true;
  if (c->rank == 0)
    kiln_log(KILN_LOG_INFO, "the %d workers share this host: sums go through shared memory",
             c->size);
}

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

int kiln_comm_mpi_create(int *argc, char ***argv, const kiln_config *cfg, kiln_comm **out) {
  *out = NULL;
  if (!cfg) cfg = kiln_config_defaults();
  kiln_comm *c = calloc(1, sizeof *c);
  mpi_state *st = calloc(1, sizeof *st);
  if (!c || !st) {
    free(c);
    free(st);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  c->ops = &mpi_ops;
  c->impl = st;
  c->timeout_s = KILN_COMM_DEFAULT_TIMEOUT_S;
  st->comm = st->watch = st->node = MPI_COMM_NULL;
  st->shm_mode = cfg->comm_shm;
  int initialised = 0;
  long poll_us = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    /* Open MPI's non-blocking allreduce (coll/libnbc) takes a binomial tree on fewer than 4 ranks
     * or in place: the whole buffer goes to rank 0 and back, several times the blocking
     * MPI_Allreduce's time on 2 ranks (kiln-comm-bench). Reduce-scatter + allgather
     * (Rabenseifner, libnbc's own choice for 4 ranks and more) matches the blocking call. A value the user set
     * in the environment wins; other MPI libraries ignore the variable. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    /* FUNNELED: prefetch and OpenMP threads exist, but only this thread calls MPI; with the
     * communication thread, SERIALIZED (never two at once). */
    int provided = 0;
    poll_us = cfg->comm_thread_us;
    int err = MPI_Init_thread(argc, argv, poll_us ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED,
                              &provided);
    if (poll_us && provided < MPI_THREAD_SERIALIZED) {
      kiln_log(KILN_LOG_WARN, "this MPI library does not allow MPI_THREAD_SERIALIZED: no "
                              "communication thread, the sums are polled between layers");
      poll_us = 0;
    }
    if (err != MPI_SUCCESS) {
      mpi_destroy(c);
      return kiln_errorf(KILN_ERR_COMM, "MPI_Init_thread failed (error %d)", err);
    }
    st->we_initialised = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &st->comm), "communicator duplication");
  if (!rc) rc = mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &st->watch), "communicator duplication");
  if (!rc) MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
  if (!rc) MPI_Comm_set_errhandler(st->watch, MPI_ERRORS_RETURN);
  if (!rc) rc = mpi_status(MPI_Comm_rank(st->comm, &c->rank), "rank");
  if (!rc) rc = mpi_status(MPI_Comm_size(st->comm, &c->size), "size");
  if (rc) {
    /* MPI_Finalize would wait for ranks that are still setting up (or stuck in MPI_Comm_dup
     * with us): in a job of several processes hand back a communicator on MPI_COMM_WORLD whose
     * end_job aborts them all. */
    int world = 1;
    if (MPI_Comm_size(MPI_COMM_WORLD, &world) == MPI_SUCCESS && world > 1 &&
        MPI_Comm_rank(MPI_COMM_WORLD, &c->rank) == MPI_SUCCESS) {
      c->size = world;
      *out = c;
      return rc;
    }
    mpi_destroy(c);
    return rc;
  }
  rc = gather_places(c);
  if (rc) {
    *out = c; /* the caller ends the job */
    return rc;
  }
  shm_setup(c);
  if (poll_us && c->size > 1) {
    rc = comm_thread_start(c, poll_us);
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
