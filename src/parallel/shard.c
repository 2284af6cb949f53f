/* The batch stream (see include/kiln/parallel.h): where batch j starts and how long it is, from j
 * alone. One worker reads batches 0, 1, 2, ...; worker r of N reads r, r + N, r + 2N, ...; so N
 * workers together read exactly what one worker with iter_size N reads, and the cursor after
 * every worker has read k batches, the end of batch kN - 1, is the same number on every rank.
 *
 * From an arbitrary base position (a restored cursor), the epoch it falls in is partial: its
 * batches start at the base; later epochs start at a multiple of the epoch size. This is what the
 * Data layer did reading batch after batch, so single-worker runs are unchanged. */
#include "kiln/parallel.h"

/* Batches in an epoch of `avail` records starting at its first record. */
static uint64_t batches_in(const kiln_batch_stream *s, uint64_t avail) {
  uint64_t b = (uint64_t)s->batch;
  return s->last_batch == KILN_LAST_BATCH_KEEP ? (avail + b - 1) / b : avail / b;
}

uint64_t kiln_batch_stream_start(const kiln_batch_stream *s, uint64_t j, int *count) {
  uint64_t b = (uint64_t)s->batch;
  *count = s->batch;
  if (s->last_batch == KILN_LAST_BATCH_WRAP) return s->base + j * b;
  uint64_t e0 = s->base / s->size, i0 = s->base % s->size;
  uint64_t n0 = batches_in(s, s->size - i0); /* left in the epoch of the base */
  uint64_t epoch, offset;
  if (j < n0) {
    epoch = e0;
    offset = i0 + j * b;
  } else {
    uint64_t per = batches_in(s, s->size), jj = j - n0; /* per >= 1: DROP needs batch <= size */
    epoch = e0 + 1 + jj / per;
    offset = (jj % per) * b;
  }
  if (s->last_batch == KILN_LAST_BATCH_KEEP && offset + b > s->size)
    *count = (int)(s->size - offset);
  return epoch * s->size + offset;
}

uint64_t kiln_batch_stream_end(const kiln_batch_stream *s, uint64_t j) {
  int count;
  uint64_t start = kiln_batch_stream_start(s, j, &count);
  return start + (uint64_t)count;
}
