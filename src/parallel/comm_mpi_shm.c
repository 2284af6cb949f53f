/* Sums through shared memory. When every rank is on one host (MPI_COMM_TYPE_SHARED), the sums
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
 * numbers order the writes: no locks. Waits go through kiln_mpi_wait_on() as for MPI, watchdog
 * included. Why not MPI's own transfers on one host: their time for the same buffer varies
 * widely from minute to minute on a shared machine, and a sum where the gradients lie needs no
 * copies in or out, which would take time from backward (`kiln-comm-bench` and `bench/mpi`
 * measure both; docs/PERF.md). KILN_COMM_SHM=0 keeps every sum in MPI; KILN_COMM_SHM=copy lends
 * no memory (every addend copied). */
#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_mpi_internal.h"
#include "kiln/parallel.h"

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

/* Part q of a shared-memory sum of n floats: as seg() of comm_mpi_sums.c, with the boundaries on
 * 16 floats (64 bytes) so that two ranks never write one cache line. */
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
void kiln_mpi_shm_start(kiln_comm *c, bucket *b) {
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
void kiln_mpi_shm_advance(kiln_comm *c, bucket *b) {
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

float *kiln_mpi_claim_sum_buffer(kiln_comm *c, int64_t n) {
  mpi_state *st = c->impl;
  if (!st->shm || st->arena_lent || n > ARENA_FLOATS) return NULL;
  if (st->shm_mode == KILN_COMM_SHM_COPY) return NULL; /* sums through copies (measurements) */
  st->arena_lent = true;
  return st->shm_data[c->rank];
}

void kiln_mpi_release_sum_buffer(kiln_comm *c, float *buf) {
  mpi_state *st = c->impl;
  if (st->shm && buf == st->shm_data[c->rank]) st->arena_lent = false;
}

/* Sums through shared memory when every rank is on this host, unless KILN_COMM_SHM=0. Every
 * rank reaches the same decision (the node split is collective, and a failed allocation on any
 * rank turns it off everywhere); a failure leaves the sums in MPI, with a warning. Blocking
 * calls, as the communicator's own setup. */
void kiln_mpi_shm_setup(kiln_comm *c) {
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
