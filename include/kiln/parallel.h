/* kiln parallel: data-parallel training. A communicator (a table of collective operations with a
 * single-process and an MPI implementation), the synchronisation settings (GRADIENT, MODEL and
 * TIME, docs/distributed.md) and their collectives, and the batch arithmetic that deals whole
 * batches of the data stream round-robin to the workers.
 *
 * Every collective must be called by every rank, in the same order, from the thread that created
 * the communicator (never from OpenMP regions or prefetch threads). A rank that fails between
 * collectives cannot tell the others; the caller must then end the job with kiln_comm_end_job()
 * rather than return, or the other ranks wait for it forever. */
#ifndef KILN_PARALLEL_H
#define KILN_PARALLEL_H

#include "kiln/config.h"

typedef struct kiln_comm kiln_comm;

/* One implementation of the collectives. Buffers are in place; counts may exceed INT_MAX (the
 * MPI implementation sends in chunks). All return KILN_OK or KILN_ERR_COMM with a message. */
typedef struct kiln_comm_ops {
  const char *name; /* "local", "mpi" */
  int (*barrier)(kiln_comm *c);
  /* buf (n floats) on every rank becomes root's. */
  int (*broadcast)(kiln_comm *c, float *buf, int64_t n, int root);
  /* The same for n bytes. */
  int (*broadcast_bytes)(kiln_comm *c, void *buf, size_t n, int root);
  /* buf becomes the elementwise sum over ranks, in whatever order the library finds fastest
   * (so the last bits may depend on the number of ranks and on the MPI library). */
  int (*allreduce_sum)(kiln_comm *c, float *buf, int64_t n);
  /* buf becomes ((buf_0 + buf_1) + buf_2) + ... in float, summed in rank order with
   * kiln_parallel_accumulate() and sent back to every rank: the same bits as one process adding the
   * same buffers in the same order. */
  int (*allreduce_sum_ordered)(kiln_comm *c, float *buf, int64_t n);
  /* Each rank sends n bytes; recv (size x n bytes) gets them in rank order on every rank. */
  int (*allgather)(kiln_comm *c, const void *send, size_t n, void *recv);
  /* Overlapped sums (optional; NULL: the front end sums each bucket at once, blocking).
   * bucket_start begins the sum of buf (n floats) in place over the ranks and returns at once,
   * in rank order (as allreduce_sum_ordered) when `ordered`; buckets are started in the same
   * order on every rank. bucket_progress lets outstanding sums advance (MPI makes no progress on
   * its own between calls). bucket_finish waits for all of them, within the watchdog's limit. */
  int (*bucket_start)(kiln_comm *c, float *buf, int64_t n, bool ordered);
  int (*bucket_progress)(kiln_comm *c);
  int (*bucket_finish)(kiln_comm *c);
  /* Optional: n floats of this rank's memory (64-byte aligned) that the sums (buckets and
   * allreduce) of ranges within it read and write where they lie, with no copy in or out: the
   * shared memory of ranks on one host. NULL when there is none, n is too large, or it is lent
   * already. Not collective: each rank may claim or not. Given back with release_sum_buffer;
   * the memory is gone once the communicator is destroyed. */
  float *(*claim_sum_buffer)(kiln_comm *c, int64_t n);
  void (*release_sum_buffer)(kiln_comm *c, float *buf);
  /* Ends every process of the job with exit status `code` (MPI_Abort). The local communicator
   * returns: a single process ends by returning the code itself. */
  void (*end_job)(kiln_comm *c, int code);
  /* Releases the communicator (MPI_Finalize for the MPI one). */
  void (*destroy)(kiln_comm *c);
} kiln_comm_ops;

struct kiln_comm {
  const kiln_comm_ops *ops;
  int rank, size;
  void *impl; /* the implementation's state */
  /* The watchdog: a collective that has waited this long for the other ranks fails with
   * KILN_ERR_COMM, naming the ranks that did not answer (0: wait forever). The limit must exceed
   * the longest time one rank spends between collectives: rank 0's test pass or snapshot. */
  double timeout_s;
};

/* KILN_ERR_INVALID unless seconds is finite and >= 0 (0: no limit); NULL: nothing to set. */
int kiln_comm_set_timeout(kiln_comm *c, double seconds);

/* The single-process communicator: rank 0 of 1, every collective a no-op (allgather copies). */
int kiln_comm_local_create(kiln_comm **out);
/* MPI's start-up (MPI_Init_thread with MPI_THREAD_FUNNELED: only the calling thread talks; with
 * cfg->comm_thread_us, SERIALIZED), unless MPI is up already. MPI_Init waits for every process of
 * the job and has no limit of its own: a caller that must not hang on a process that never
 * starts watches this call from another thread (the `kiln` command does, --comm-timeout).
 * KILN_ERR_UNSUPPORTED when kiln was built without MPI. */
int kiln_comm_mpi_init(int *argc, char ***argv, const kiln_config *cfg);
/* MPI_COMM_WORLD, after kiln_comm_mpi_init (called here when MPI is not up). Every collective,
 * from the first, waits within cfg->comm_timeout_s (kiln_comm_set_timeout changes it later).
 * KILN_ERR_UNSUPPORTED when kiln was built without MPI. When MPI started but the communicator
 * could not be set up in a job of several processes, the error comes back with *out still set:
 * the caller must end the job with kiln_comm_end_job (finalizing would wait for the other ranks
 * forever). From `cfg` (NULL: defaults): comm_thread_us (a communication thread that drives the
 * overlapped sums) and comm_shm (how sums on one host go). Whether a launcher started this
 * process is kiln_config.launcher_size. */
int kiln_comm_mpi_create(int *argc, char ***argv, const kiln_config *cfg, kiln_comm **out);
bool kiln_comm_mpi_built(void);
void kiln_comm_free(kiln_comm *c);

/* The collectives through `c`; c == NULL stands for a single process (rank 0 of 1). */
int kiln_comm_rank(const kiln_comm *c);
int kiln_comm_size(const kiln_comm *c);
int kiln_comm_barrier(kiln_comm *c);
int kiln_comm_broadcast(kiln_comm *c, float *buf, int64_t n, int root);
int kiln_comm_broadcast_bytes(kiln_comm *c, void *buf, size_t n, int root);
int kiln_comm_allreduce_sum(kiln_comm *c, float *buf, int64_t n, bool ordered);
int kiln_comm_allgather(kiln_comm *c, const void *send, size_t n, void *recv);
/* Overlapped sums of buckets (see kiln_comm_ops): start each, let them progress while computing,
 * finish once. Without an implementation, start sums the bucket at once. */
int kiln_comm_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered);
int kiln_comm_bucket_progress(kiln_comm *c);
int kiln_comm_bucket_finish(kiln_comm *c);
void kiln_comm_end_job(kiln_comm *c, int code);
/* See kiln_comm_ops.claim_sum_buffer: NULL for one process and where there is none. */
float *kiln_comm_claim_sum_buffer(kiln_comm *c, int64_t n);
void kiln_comm_release_sum_buffer(kiln_comm *c, float *buf);

/* A setting every rank must be given alike: its name as the user gives it ("--weights") and its
 * value as text (NULL: not given; "" for a flag that is given). */
typedef struct kiln_comm_setting {
  const char *name, *value;
} kiln_comm_setting;
enum { KILN_COMM_MAX_SETTINGS = 32 };
/* Collective: every rank passes the same n names (at most KILN_COMM_MAX_SETTINGS, in the same
 * order) with its own values. KILN_OK when every rank's values are rank 0's; otherwise
 * KILN_ERR_INVALID on every rank, with the same message naming the first setting that differs,
 * the first rank that differs on it, both values, and the other settings that differ ("the 2
 * workers were given different options: --weights is 'w.caffemodel' on rank 1 but not given on
 * rank 0; every worker must be given the same ..."). KILN_ERR_COMM when the exchange failed (the
 * caller ends the job). */
int kiln_comm_agree_settings(kiln_comm *c, const kiln_comm_setting *s, int n);

/* acc[i] += x[i], one float addition per element in index order. The deterministic reduction
 * and the solver's iter_size accumulation both add through here, so one worker with iter_size N
 * and N workers with --deterministic round identically. */
void kiln_parallel_accumulate(float *restrict acc, const float *restrict x, int64_t n);
/* p[0][i] .. p[np - 1][i] (distinct buffers) all become ((p[0][i] + p[1][i]) + p[2][i]) + ...
 * for i < n: kiln_parallel_accumulate's additions in the same order, written to every buffer. */
void kiln_parallel_sum_to_all(float *const *p, int np, int64_t n);

/* ---- synchronisation settings ------------------------------------------------------------ */

typedef enum kiln_sync_mode {
  KILN_SYNC_DEFAULT = 0, /* unset: the solver file's sync { mode }, else GRADIENT */
  KILN_SYNC_GRADIENT,    /* sum gradients every iteration */
  KILN_SYNC_MODEL,       /* local steps; average parameters every interval_iters iterations */
  KILN_SYNC_TIME,        /* local steps; average every interval_seconds, weighted by samples */
  KILN_SYNC_MODE_COUNT
} kiln_sync_mode;

typedef struct kiln_sync_config {
  kiln_sync_mode mode;
  int interval_iters;
  double interval_seconds;
  int warmup_iters;   /* MODEL / TIME: iterations in GRADIENT mode first */
  bool deterministic; /* fixed reduction order (allreduce_sum_ordered) */
} kiln_sync_config;

const char *kiln_sync_mode_name(kiln_sync_mode m); /* "gradient", "model", "time" */
/* Command-line form: "grad" (or "gradient"), "model:K[:W]", "time:T[:W]" (T seconds, W warm-up
 * iterations in GRADIENT mode). Sets mode, interval and warm-up; leaves `deterministic` alone. */
int kiln_sync_parse(const char *text, kiln_sync_config *out);
/* KILN_ERR_INVALID for a missing or bad interval or warm-up. */
int kiln_sync_check(const kiln_sync_config *cfg, int nworkers);
/* True when iteration `iter` steps locally (MODEL / TIME past the warm-up, several workers). */
bool kiln_sync_is_local(const kiln_sync_config *cfg, int nworkers, int64_t iter);
/* GRADIENT: every rank's `diff` (n floats) becomes the sum over ranks (ordered when
 * cfg->deterministic). The caller scales by 1/N (the solver folds it into iter_size's 1/I). */
int kiln_sync_gradients(kiln_comm *c, const kiln_sync_config *cfg, float *diff, int64_t n);
/* MODEL / TIME: every rank's `buf` (n floats) becomes sum over ranks of weight_r x buf_r, the
 * same on every rank (weights summing to 1 give the weighted average). */
int kiln_sync_average(kiln_comm *c, const kiln_sync_config *cfg, float *buf, int64_t n,
                      float weight);

/* ---- the batch stream, dealt to workers ---------------------------------------------------- */

/* The batches of a data set read as an endless stream of record positions (epoch = position /
 * size), numbered from `base` (position 0, or the cursor a snapshot restored). Batch j's start
 * and length follow from j alone, so worker r of N can read global batches r, r + N, r + 2N, ...
 * (exactly what one worker with iter_size N reads, pass by pass) without reading the others. */
typedef enum { KILN_LAST_BATCH_WRAP = 0, KILN_LAST_BATCH_DROP = 1, KILN_LAST_BATCH_KEEP = 2 } kiln_last_batch;

typedef struct kiln_batch_stream {
  uint64_t base;  /* position of batch 0 */
  uint64_t size;  /* records per epoch (> 0) */
  int batch;      /* batch_size (> 0) */
  kiln_last_batch last_batch;
  /* WRAP: a batch runs on into the next epoch. DROP: a batch that would cross the end of the
   * epoch moves to the start of the next one. KEEP: it ends at the end of the epoch (short). */
} kiln_batch_stream;

/* Start position of batch j and its record count (batch, or fewer for KEEP's last batch). */
uint64_t kiln_batch_stream_start(const kiln_batch_stream *s, uint64_t j, int *count);
/* Position after batch j (the cursor once batches 0..j are consumed). */
uint64_t kiln_batch_stream_end(const kiln_batch_stream *s, uint64_t j);

#endif
