/* Helpers of the detection augmentation tests (tests/test_anno_*.c): small images and boxes,
 * and checks of bytes and boxes. */
#ifndef KILN_TEST_ANNO_TEST_H
#define KILN_TEST_ANNO_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/anno.h"

/* An image of c planes of h x w holding `v` (NULL: zeros). */
static inline void image_of(kiln_image *img, int c, int h, int w, const uint8_t *v) {
  const size_t n = (size_t)c * h * w;
  img->data = realloc(img->data, n);
  assert_non_null(img->data);
  img->cap = n;
  img->channels = c;
  img->height = h;
  img->width = w;
  if (v) memcpy(img->data, v, n);
  else memset(img->data, 0, n);
}

static inline uint8_t px(const kiln_image *img, int c, int y, int x) {
  return img->data[((size_t)c * img->height + y) * img->width + x];
}

static inline void add_box(kiln_anno_boxes *b, int label, float x0, float y0, float x1, float y1) {
  const kiln_anno_box a = {.label = label, .instance_id = b->n, .box = {x0, y0, x1, y1}};
  assert_int_equal(kiln_anno_boxes_add(b, &a), KILN_OK);
}

static inline void assert_box(const kiln_bbox *b, float x0, float y0, float x1, float y1) {
  if (fabsf(b->xmin - x0) > 1e-5f || fabsf(b->ymin - y0) > 1e-5f || fabsf(b->xmax - x1) > 1e-5f ||
      fabsf(b->ymax - y1) > 1e-5f)
    fail_msg("box (%g, %g, %g, %g), expected (%g, %g, %g, %g)", b->xmin, b->ymin, b->xmax, b->ymax,
             x0, y0, x1, y1);
}

static inline void assert_bytes(const uint8_t *got, const uint8_t *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) fail_msg("byte %zu: %d, expected %d", i, got[i], want[i]);
}

#endif
