/* What the data layers share (layer_util.h): the order of the records in the stream, and the
 * share of the batch stream a layer reading on the net's thread takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "layer_util.h"

int kiln_record_order_index(kiln_record_order *o, uint64_t q, uint64_t *index) {
  uint64_t e = q / o->size, i = q % o->size;
  if (!o->shuffle) {
    *index = i;
    return KILN_OK;
  }
  if (o->size > UINT32_MAX) return kiln_errorf(KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 records");
  int k = -1;
  for (int j = 0; j < 2; j++)
    if (o->epoch[j].perm && o->epoch[j].epoch == e) k = j;
  if (k < 0) {
    /* Replace the older of the two. */
    k = !o->epoch[0].perm ? 0 : !o->epoch[1].perm ? 1 : o->epoch[0].epoch < o->epoch[1].epoch ? 0 : 1;
    uint32_t *perm = o->epoch[k].perm;
    if (!perm && !(perm = o->epoch[k].perm = malloc(sizeof(uint32_t) * (size_t)o->size)))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the shuffled order");
    o->epoch[k].epoch = e;
    kiln_rng r;
    kiln_rng_seed(&r, o->seed, 0x5348554646ULL + e); /* a stream per epoch */
    for (uint64_t j = 0; j < o->size; j++) perm[j] = (uint32_t)j;
    for (uint64_t j = o->size - 1; j > 0; j--) { /* Fisher-Yates */
      uint32_t x = kiln_rng_below(&r, (uint32_t)(j + 1)), t = perm[j];
      perm[j] = perm[x];
      perm[x] = t;
    }
  }
  *index = o->epoch[k].perm[i];
  return KILN_OK;
}

void kiln_record_order_free(kiln_record_order *o) {
  free(o->epoch[0].perm);
  free(o->epoch[1].perm);
  o->epoch[0].perm = o->epoch[1].perm = NULL;
}

int kiln_data_worker_share(kiln_layer *l, int *rank, int *nworkers) {
  *rank = 0;
  *nworkers = 1;
  if (l->phase == CAFFE__PHASE__TRAIN && l->shard_count > 1) {
    if (l->shard_rank < 0 || l->shard_rank >= l->shard_count)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "worker rank %d of %d", l->shard_rank,
                              l->shard_count);
    *rank = l->shard_rank;
    *nworkers = l->shard_count;
  }
  return KILN_OK;
}

int kiln_batch_share_next(kiln_layer *l, kiln_batch_share *s, uint64_t *first, int *count) {
  if (!s->started) {
    KILN_TRY(kiln_data_worker_share(l, &s->rank, &s->nworkers));
    s->started = true;
  }
  uint64_t global = s->taken_k * (uint64_t)s->nworkers + (uint64_t)s->rank;
  *first = kiln_batch_stream_start(&s->stream, global, count);
  s->taken_k++;
  return KILN_OK;
}

uint64_t kiln_data_stream_cursor(const kiln_batch_stream *stream, uint64_t taken_k,
                                 int nworkers) {
  if (taken_k == 0) return stream->base;
  return kiln_batch_stream_end(stream, taken_k * (uint64_t)(nworkers > 0 ? nworkers : 1) - 1);
}

uint64_t kiln_batch_share_cursor(const kiln_batch_share *s) {
  return kiln_data_stream_cursor(&s->stream, s->taken_k, s->nworkers);
}

void kiln_batch_share_set_cursor(kiln_batch_share *s, uint64_t cursor) {
  s->stream.base = cursor;
  s->taken_k = 0;
}

/* ---- host-filled tops on a device ----------------------------------------------------------- */

int kiln_stage_begin(kiln_layer *l, kiln_stage *s) {
  s->active = false;
  if (l->ntop > KILN_STAGE_MAX_TOPS)
    return kiln_errorf(KILN_ERR_INTERNAL, "layer '%s': more than %d tops to stage", l->name,
                       KILN_STAGE_MAX_TOPS);
  for (int t = 0; t < l->ntop; t++) {
    kiln_blob *b = l->top[t];
    s->device[t] = NULL;
    if (kiln_device_is_host(b->device) || b->csr) continue;
    const int64_t n = b->count > 0 ? b->count : 1;
    if (n > s->cap[t]) {
      float *h = realloc(s->host[t], sizeof(float) * (size_t)n);
      if (!h) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      s->host[t] = h;
      s->cap[t] = n;
    }
    s->device[t] = b->data;
    b->data = s->host[t];
    s->active = true;
  }
  return KILN_OK;
}

int kiln_stage_end(kiln_layer *l, kiln_stage *s) {
  int rc = KILN_OK;
  for (int t = 0; s->active && t < l->ntop; t++) {
    kiln_blob *b = l->top[t];
    if (!s->device[t]) continue;
    if (!rc)
      rc = kiln_device_to_device(b->device, s->device[t], b->data, sizeof(float) * (size_t)b->count);
    b->data = s->device[t];
    s->device[t] = NULL;
  }
  s->active = false;
  return rc;
}

void kiln_stage_free(kiln_stage *s) {
  for (int t = 0; t < KILN_STAGE_MAX_TOPS; t++) free(s->host[t]);
  memset(s, 0, sizeof *s);
}

int kiln_data_color_of(kiln_layer *l, const Caffe__TransformationParameter *t, bool force_color,
                       kiln_image_color *out) {
  force_color |= t->force_color;
  if (force_color && t->force_gray)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "give force_color or force_gray, not both");
  *out = force_color ? KILN_IMAGE_COLOR : t->force_gray ? KILN_IMAGE_GRAY : KILN_IMAGE_AS_IS;
  return KILN_OK;
}
