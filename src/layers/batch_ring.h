/* The ring of prefetched batches the data layers share (Data and ImageData in data.c, HDF5Data,
 * AnnotatedData): a thread fills up to `nslots` batches ahead of the net, each of `ntops` arrays
 * of `batch` records, and the layer's forward takes them in order. The layer supplies what a
 * batch is (the `fill` hook: global batch j of the stream, into a slot); the ring keeps the
 * slots, the thread, this worker's share of the global batches, the fault switch that slows the
 * reader, and the count of batches taken that a cursor is computed from.
 *
 * Data-parallel workers: in TRAIN, worker r of N fills global batches r, r + N, r + 2N, ...
 * (kiln_batch_stream), fixed at the first batch. Nothing is allocated per batch: the slots are
 * allocated when the data start flowing (their size is counted at set-up through
 * kiln_batch_ring_bytes).
 *
 * A part of a batch whose size varies from batch to batch (AnnotatedData's label rows, one per
 * box of the batch's images) goes into a slot's side buffers: side[k] is ordinary host memory,
 * allocated with the slots at `side_init[k]` floats (counted by kiln_batch_ring_bytes) and grown
 * by the fill hook on the ring's thread (kiln_ring_slot_side) when a batch needs more; it is
 * kept across batches, so growth stops at the largest batch seen. Layers that set no side_init
 * and never call kiln_ring_slot_side have none. */
#ifndef KILN_BATCH_RING_H
#define KILN_BATCH_RING_H

#include <pthread.h>

#include "kiln/parallel.h"
#include "layer_util.h"

enum { KILN_RING_MAX_TOPS = 16, KILN_RING_MAX_SLOTS = 64, KILN_RING_MAX_SIDES = 2 };

typedef struct {
  float *top[KILN_RING_MAX_TOPS];
  int count; /* records in the batch (smaller than batch only at a short batch, KEEP) */
  /* The batch's variable parts: side_n[k] floats of side[k] (of side_cap[k] allocated), and
   * what the layer records of their sizes in `dims` (the fill hook writes all three). */
  float *side[KILN_RING_MAX_SIDES];
  int64_t side_n[KILN_RING_MAX_SIDES], side_cap[KILN_RING_MAX_SIDES];
  int64_t dims[4];
} kiln_ring_slot;

typedef struct kiln_batch_ring {
  /* Set by the layer before the first kiln_batch_ring_start. fill: global batch `global` of
   * the stream into `slot` (its count too), called on the ring's thread; an error stops the
   * thread and the next take reports it. on_stop (or NULL): called with the mutex held when the
   * thread is asked to stop, to wake anything else it may wait for (HDF5Data's loader). */
  int (*fill)(void *owner, kiln_ring_slot *slot, uint64_t global);
  void (*on_stop)(void *owner);
  void *owner;
  int nslots, ntops, batch;
  int64_t per[KILN_RING_MAX_TOPS]; /* floats of one record of each top */
  int64_t side_init[KILN_RING_MAX_SIDES]; /* floats each slot's side buffers start with */
  double slow_ms; /* KILN_FAULT=slowread:LAYER:MS: each batch takes the reader this long */
  /* This worker's share, from kiln_batch_ring_start. */
  int rank, nworkers;
  /* The ring, under mu. The layer may wait on cv with mu held for its own conditions too. */
  kiln_ring_slot *slots;
  const kiln_device *slot_device; /* whose host memory the slots are (kiln_device_host_alloc) */
  int head, count, tail; /* slots[head] is the next to take; count are filled */
  uint64_t fill_k;       /* this worker's batches filled */
  uint64_t taken_k;      /* this worker's batches taken by the net */
  bool running, stop, failed;
  int fail_code;
  char fail_msg[1024];
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} kiln_batch_ring;

/* The mutex and condition, the worker share of one, and the slow-read fault when the runtime
 * configuration names this layer. */
void kiln_batch_ring_init(kiln_batch_ring *r, const kiln_layer *l);
/* The bytes the slots will take (for the layer's extra_bytes), their side buffers' first size
 * included, or a layer error naming `what` (the batch size's field) when they overflow. nslots
 * (1..KILN_RING_MAX_SLOTS, which the layer checks naming its field), ntops, batch and per must
 * be set. */
int kiln_batch_ring_bytes(const kiln_batch_ring *r, kiln_layer *l, const char *what,
                          int64_t *bytes);
/* Starts the thread (allocating the slots the first time): in a TRAIN net the share comes from
 * the layer's shard rank and count; a TEST net (rank 0's test passes) reads the whole stream.
 * Batches taken before are kept: filling resumes at taken_k. */
int kiln_batch_ring_start(kiln_batch_ring *r, kiln_layer *l);
/* Stops the thread; filled slots not taken are dropped (the next start refills them). */
void kiln_batch_ring_stop(kiln_batch_ring *r);
/* For the fill hook, on the ring's thread: side buffer k of `slot` holds at least n floats
 * (grown by half again at least; its contents are kept). KILN_ERR_NOMEM when memory runs out. */
int kiln_ring_slot_side(kiln_ring_slot *slot, int k, int64_t n);
/* The next batch, waiting for it (starting the thread if needed); a failure of the thread is
 * returned with the layer named. Hand it back with kiln_batch_ring_release once copied. */
int kiln_batch_ring_take(kiln_batch_ring *r, kiln_layer *l, const kiln_ring_slot **slot);
void kiln_batch_ring_release(kiln_batch_ring *r);
/* Where the global stream stands after this worker's batches taken: every worker has taken as
 * many, so global batches 0 .. taken_k * N - 1 are done (the same on every rank). */
uint64_t kiln_batch_ring_cursor(const kiln_batch_ring *r, const kiln_batch_stream *stream);
/* Stops the thread and forgets every batch filled or taken (a new cursor follows). */
void kiln_batch_ring_reset(kiln_batch_ring *r);
/* Stops the thread, frees the slots, the mutex and the condition. */
void kiln_batch_ring_destroy(kiln_batch_ring *r);

#endif
