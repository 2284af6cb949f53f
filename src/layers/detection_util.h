/* What the SSD fork's host-side layers share (prior_box.c, multibox_loss.c, detection_output.c,
 * detection_evaluate.c): host buffers the layer owns, and the moves of a blob's values between
 * them and the net's device. These layers are host code over host copies, as in the fork, whose
 * MultiBoxLoss, DetectionOutput and DetectionEvaluate run on the CPU in GPU mode too: the
 * arithmetic is include/kiln/detect.h's; a layer only packs and unpacks. Device memory is reached
 * only through the device table (include/kiln/device.h): on the host device a bottom is read
 * where it is, elsewhere it is copied to the layer's buffer first. */
#ifndef KILN_DETECTION_UTIL_H
#define KILN_DETECTION_UTIL_H

#include <limits.h>
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

/* The shapes MultiBoxLoss and DetectionOutput both take: loc (bottom 0) N x (P L 4), conf
 * (bottom 1) N x (P C), the priors (bottom 2) 1 x 2 x 4P; their N and P, or an error naming
 * the layer and the bottom. */
static inline int det_check_predictions(kiln_layer *l, int L, int C, int64_t *N, int64_t *P) {
  const kiln_blob *loc = l->bottom[0], *conf = l->bottom[1], *prior = l->bottom[2];
  char s0[128], s1[128];
  if (prior->naxes != 3 || prior->shape[0] != 1 || prior->shape[1] != 2 ||
      prior->shape[2] % 4 != 0 || prior->shape[2] / 4 > INT_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the priors (bottom 2, '%s') are %s: expected 1 x "
                            "2 x 4P (PriorBox's boxes, then their variances)", prior->name,
                            det_shape(prior, s0, sizeof s0));
  if (loc->naxes < 2 || conf->naxes < 2 || loc->shape[0] != conf->shape[0] ||
      loc->shape[0] > INT_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "loc (bottom 0) %s and conf (bottom 1) %s must "
                            "both be N x ... for the same N images",
                            det_shape(loc, s0, sizeof s0), det_shape(conf, s1, sizeof s1));
  *N = loc->shape[0];
  *P = prior->shape[2] / 4;
  if (!det_count_is(loc->count, *N, *P * L * 4))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "loc (bottom 0) is %s: expected %lld values an "
                            "image (%lld priors x %d location classes x 4)",
                            det_shape(loc, s0, sizeof s0), (long long)(*P * L * 4),
                            (long long)*P, L);
  if (!det_count_is(conf->count, *N, *P * C))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "conf (bottom 1) is %s: expected %lld values an "
                            "image (%lld priors x %d classes)", det_shape(conf, s0, sizeof s0),
                            (long long)(*P * C), (long long)*P, C);
  return KILN_OK;
}

#endif
