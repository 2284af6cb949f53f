/* The state shared by the files of the MPI communicator (compiled when CMake finds MPI):
 * comm_mpi.c (start-up, the collectives, the watchdog), comm_mpi_sums.c (the sums in flight:
 * the ordered sum, the overlapped buckets), comm_mpi_shm.c (sums through shared memory on one
 * host) and comm_mpi_thread.c (the communication thread). Not part of the public API. */
#ifndef KILN_PARALLEL_COMM_MPI_INTERNAL_H
#define KILN_PARALLEL_COMM_MPI_INTERNAL_H

#include <mpi.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln/parallel.h"

enum {
  CHUNK_FLOATS = 1 << 22,
  ARENA_FLOATS = 1 << 21, /* the start of each shared segment: a gradient summed where it lies */
  ORDERED_TAG = 0x6b6c, /* the ordered sum's segments on their way to be added */
  ROLL_CALL_TAG = 0x6b6d,
  ROLL_ANSWER_TAG,
  GATHER_TAG /* the ordered sum's added segments on their way back */
};

typedef struct pending_send pending_send; /* comm_mpi.c */
typedef struct rank_place rank_place;     /* comm_mpi.c */
typedef struct comm_thread comm_thread;   /* comm_mpi_thread.c */

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

/* comm_mpi.c: MPI's error codes as kiln statuses, and the watchdog that every collective is
 * begun, waited for and ended through. */
int kiln_mpi_status(int err, const char *what);
void kiln_mpi_begin_op(kiln_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kiln_mpi_end_op(kiln_comm *c);
/* Whether what a rank waits for is complete: one request, or the sums in flight. */
typedef int (*poll_fn)(kiln_comm *c, void *arg, bool *done);
int kiln_mpi_wait_on(kiln_comm *c, poll_fn poll, void *arg);

/* comm_mpi_sums.c: the sums in flight, which serve the whole-buffer sums too, and the
 * communicator's overlapped bucket sums. */
int kiln_mpi_start_sums(kiln_comm *c, float *buf, int64_t n, bool ordered);
int kiln_mpi_progress_buckets(kiln_comm *c, void *arg, bool *all_done);
void kiln_mpi_sums_over(mpi_state *st);
int kiln_mpi_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered);
int kiln_mpi_bucket_progress(kiln_comm *c);
int kiln_mpi_bucket_finish(kiln_comm *c);

/* comm_mpi_shm.c: the sums through shared memory, and their setup at start. */
void kiln_mpi_shm_start(kiln_comm *c, bucket *b);
void kiln_mpi_shm_advance(kiln_comm *c, bucket *b);
float *kiln_mpi_claim_sum_buffer(kiln_comm *c, int64_t n);
void kiln_mpi_release_sum_buffer(kiln_comm *c, float *buf);
void kiln_mpi_shm_setup(kiln_comm *c);

/* comm_mpi_thread.c: the communication thread, and the overlapped bucket sums it drives. */
int kiln_mpi_thread_start(kiln_comm *c, long poll_us);
void kiln_mpi_thread_stop(mpi_state *st);
int kiln_mpi_thread_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered);
int kiln_mpi_thread_bucket_finish(kiln_comm *c);

#endif
