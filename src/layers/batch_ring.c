/* The data layers' ring of prefetched batches (batch_ring.h). */
#include "batch_ring.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kiln_batch_ring_init(kiln_batch_ring *r, const kiln_layer *l) {
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->nworkers = 1;
  if (l->config && l->config->fault.kind == KILN_FAULT_SLOW_READ &&
      !strcmp(l->config->fault.layer, l->name))
    r->slow_ms = (double)l->config->fault.us / 1000.0;
}

int kiln_batch_ring_bytes(const kiln_batch_ring *r, kiln_layer *l, const char *what,
                          int64_t *bytes) {
  if (r->nslots < 1 || r->nslots > KILN_RING_MAX_SLOTS || r->ntops < 1 ||
      r->ntops > KILN_RING_MAX_TOPS)
    return KILN_LAYER_ERROR(l, KILN_ERR_INTERNAL, "a ring of %d batches of %d tops", r->nslots,
                            r->ntops);
  int64_t per = 0, total = 0, side = 0;
  for (int t = 0; t < r->ntops; t++)
    if (__builtin_add_overflow(per, r->per[t], &per))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s %d: records too large", what, r->batch);
  for (int k = 0; k < KILN_RING_MAX_SIDES; k++)
    if (r->side_init[k] < 0 || __builtin_add_overflow(side, r->side_init[k], &side))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s %d: records too large", what, r->batch);
  if (__builtin_mul_overflow(per, (int64_t)r->batch, &total) ||
      __builtin_add_overflow(total, side, &total) ||
      __builtin_mul_overflow(total, (int64_t)r->nslots * (int64_t)sizeof(float), &total))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s %d of these records does not fit in memory",
                            what, r->batch);
  *bytes = total;
  return KILN_OK;
}

static void *fill_thread(void *arg) {
  kiln_batch_ring *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->stop && r->count == r->nslots) pthread_cond_wait(&r->cv, &r->mu);
    if (r->stop) break;
    kiln_ring_slot *slot = &r->slots[r->tail];
    const uint64_t global = r->fill_k * (uint64_t)r->nworkers + (uint64_t)r->rank;
    pthread_mutex_unlock(&r->mu);
    const double t0 = r->slow_ms > 0 ? kiln_now_ms() : 0;
    int rc = r->fill(r->owner, slot, global); /* the net never touches unfilled slots */
    if (rc == KILN_OK && r->slow_ms > 0) { /* the whole batch, reading included, takes slow_ms */
      const double left = r->slow_ms - (kiln_now_ms() - t0);
      if (left > 0) usleep((useconds_t)(left * 1000));
    }
    pthread_mutex_lock(&r->mu);
    if (rc != KILN_OK) {
      if (r->stop) break; /* stopped while the fill waited (for a file, say) */
      r->failed = true;
      r->fail_code = rc;
      snprintf(r->fail_msg, sizeof r->fail_msg, "%s", kiln_last_error());
      pthread_cond_broadcast(&r->cv);
      break;
    }
    r->fill_k++;
    r->tail = (r->tail + 1) % r->nslots;
    r->count++;
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* In host memory the tops' device copies from directly (pinned on a GPU: the batch's copy runs
 * at the bus's speed, without a staging copy by the driver). */
static int alloc_slots(kiln_batch_ring *r, kiln_layer *l) {
  r->slots = calloc((size_t)r->nslots, sizeof *r->slots);
  if (!r->slots) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  r->slot_device = l->ntop > 0 ? l->top[0]->device : NULL;
  for (int i = 0; i < r->nslots; i++) {
    for (int t = 0; t < r->ntops; t++)
      if (kiln_device_host_alloc(r->slot_device, sizeof(float) * (size_t)r->per[t] * (size_t)r->batch,
                                 (void **)&r->slots[i].top[t]))
        return KILN_LAYER_ERROR(l, KILN_ERR_NOMEM,
                                "out of memory for %d prefetched batches of %d records", r->nslots,
                                r->batch);
    for (int k = 0; k < KILN_RING_MAX_SIDES; k++)
      if (r->side_init[k] > 0 && kiln_ring_slot_side(&r->slots[i], k, r->side_init[k]))
        return KILN_LAYER_ERROR(l, KILN_ERR_NOMEM,
                                "out of memory for %d prefetched batches of %d records", r->nslots,
                                r->batch);
  }
  return KILN_OK;
}

/* Plain host memory: the side buffers grow on the ring's thread, where a device's own host
 * allocator (pinned memory on a GPU) may not be called; the device copies from them all the
 * same, and they are small next to the tops (a batch's label rows). */
int kiln_ring_slot_side(kiln_ring_slot *slot, int k, int64_t n) {
  if (k < 0 || k >= KILN_RING_MAX_SIDES || n < 0)
    return kiln_errorf(KILN_ERR_INTERNAL, "side buffer %d of %lld floats", k, (long long)n);
  if (n <= slot->side_cap[k]) return KILN_OK;
  int64_t cap = slot->side_cap[k] + slot->side_cap[k] / 2;
  if (cap < n) cap = n;
  if ((uint64_t)cap > SIZE_MAX / sizeof(float))
    return kiln_errorf(KILN_ERR_NOMEM, "a prefetched batch of %lld values", (long long)n);
  float *p = realloc(slot->side[k], sizeof(float) * (size_t)cap);
  if (!p)
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a prefetched batch of %lld values",
                       (long long)n);
  slot->side[k] = p;
  slot->side_cap[k] = cap;
  return KILN_OK;
}

int kiln_batch_ring_start(kiln_batch_ring *r, kiln_layer *l) {
  /* The share is fixed from the first batch on. */
  KILN_TRY(kiln_data_worker_share(l, &r->rank, &r->nworkers));
  if (!r->slots) KILN_TRY(alloc_slots(r, l));
  r->stop = r->failed = false;
  r->head = r->tail = r->count = 0;
  r->fill_k = r->taken_k; /* slots filled before a stop were dropped */
  if (pthread_create(&r->thread, NULL, fill_thread, r) != 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INTERNAL, "cannot start the prefetch thread");
  r->running = true;
  return KILN_OK;
}

void kiln_batch_ring_stop(kiln_batch_ring *r) {
  if (!r->running) return;
  pthread_mutex_lock(&r->mu);
  r->stop = true;
  pthread_cond_broadcast(&r->cv);
  if (r->on_stop) r->on_stop(r->owner);
  pthread_mutex_unlock(&r->mu);
  pthread_join(r->thread, NULL);
  r->running = false;
}

int kiln_batch_ring_take(kiln_batch_ring *r, kiln_layer *l, const kiln_ring_slot **slot) {
  if (!r->running) KILN_TRY(kiln_batch_ring_start(r, l));
  pthread_mutex_lock(&r->mu);
  while (r->count == 0 && !r->failed) pthread_cond_wait(&r->cv, &r->mu);
  if (r->count == 0 && r->failed) {
    int code = r->fail_code;
    pthread_mutex_unlock(&r->mu);
    return kiln_error_context(kiln_errorf(code, "%s", r->fail_msg), "layer '%s' (%s): ", l->name,
                              l->ops->type);
  }
  *slot = &r->slots[r->head];
  pthread_mutex_unlock(&r->mu);
  return KILN_OK;
}

void kiln_batch_ring_release(kiln_batch_ring *r) {
  pthread_mutex_lock(&r->mu);
  r->taken_k++;
  r->head = (r->head + 1) % r->nslots;
  r->count--;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

uint64_t kiln_batch_ring_cursor(const kiln_batch_ring *r, const kiln_batch_stream *stream) {
  return kiln_data_stream_cursor(stream, r->taken_k, r->nworkers);
}

void kiln_batch_ring_reset(kiln_batch_ring *r) {
  kiln_batch_ring_stop(r);
  r->head = r->tail = r->count = 0;
  r->fill_k = r->taken_k = 0;
}

void kiln_batch_ring_destroy(kiln_batch_ring *r) {
  kiln_batch_ring_stop(r);
  if (r->slots)
    for (int i = 0; i < r->nslots; i++) {
      for (int t = 0; t < r->ntops; t++) kiln_device_host_free(r->slot_device, r->slots[i].top[t]);
      for (int k = 0; k < KILN_RING_MAX_SIDES; k++) free(r->slots[i].side[k]);
    }
  free(r->slots);
  r->slots = NULL;
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
}
