/* What the SSD fork's host-side layers share (prior_box.c, multibox_loss.c, detection_output.c,
 * detection_evaluate.c): host buffers the layer owns, and the moves of a blob's values between
 * them and the net's device. These layers are host code over host copies, as in the fork, whose
 * MultiBoxLoss, DetectionOutput and DetectionEvaluate run on the CPU in GPU mode too: the
 * arithmetic is include/kiln/detect.h's; a layer only packs and unpacks. Device memory is reached
 * only through the device table (include/kiln/device.h): on the host device a bottom is read
 * where it is, elsewhere it is copied to the layer's buffer first. */
#ifndef KILN_DETECTION_UTIL_H
#define KILN_DETECTION_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiln/detect.h"
#include "kiln/device.h"
#include "layer_util.h"

/* A host array of floats, grown (never shrunk) as the shapes ask. */
typedef struct det_host {
  float *v;
  int64_t cap; /* floats */
} det_host;

static inline int det_host_reserve(det_host *h, int64_t n) {
  if (n <= h->cap && h->v) return KILN_OK;
  const int64_t want = n > 0 ? n : 1;
  float *v = realloc(h->v, sizeof(float) * (size_t)want);
  if (!v) return kiln_errorf(KILN_ERR_NOMEM, "cannot allocate %lld floats", (long long)want);
  h->v = v;
  h->cap = want;
  return KILN_OK;
}

static inline void det_host_free(det_host *h) {
  free(h->v);
  h->v = NULL;
  h->cap = 0;
}

static inline int64_t det_host_bytes(const det_host *h) {
  return h->cap * (int64_t)sizeof(float);
}

/* The layer's device (NULL: the host). */
static inline const kiln_device *det_device(const kiln_layer *l) {
  return l->backend ? l->backend->device : NULL;
}

/* The data of `b` on the host in *out: the blob's own memory on the host device, else a copy
 * in `h` (which reshape sized) through the device table. */
static inline int det_read(const kiln_layer *l, const kiln_blob *b, det_host *h,
                           const float **out) {
  const kiln_device *d = det_device(l);
  if (kiln_device_is_host(d)) {
    *out = b->data;
    return KILN_OK;
  }
  KILN_TRY(det_host_reserve(h, b->count));
  KILN_TRY(kiln_device_to_host(d, h->v, b->data, sizeof(float) * (size_t)b->count));
  *out = h->v;
  return KILN_OK;
}

/* n host floats into the device memory `dst` (a top's data) through the device table. */
static inline int det_write(const kiln_layer *l, float *dst, const float *src, int64_t n) {
  if (n <= 0) return KILN_OK;
  return kiln_device_to_device(det_device(l), dst, src, sizeof(float) * (size_t)n);
}

/* A library error with the layer's name before it. */
static inline int det_in_layer(const kiln_layer *l, int rc) {
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

/* Whether count == n x per (n, per >= 0), without overflowing. */
static inline bool det_count_is(int64_t count, int64_t n, int64_t per) {
  if (n == 0 || per == 0) return count == 0;
  return n <= INT64_MAX / per && count == n * per;
}

/* The shape of `b` in words, for messages. */
static inline const char *det_shape(const kiln_blob *b, char *buf, size_t n) {
  return kiln_blob_shape_string(b, buf, n);
}

#endif
