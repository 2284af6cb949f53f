/* What the detection files of src/ops share (bbox.c, multibox.c, detect_eval.c) and nothing
 * outside them needs: reading a box out of a float row, decoding a whole prior blob, the
 * deterministic index sort, and appending rows to a kiln_det_buf. */
#ifndef KILN_OPS_DETECT_INTERNAL_H
#define KILN_OPS_DETECT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/detect.h"

/* The box of four consecutive floats (xmin, ymin, xmax, ymax). Copied rather than cast so that
 * no float array is read through a struct pointer. */
static inline kiln_bbox kiln_det_box(const float *v) {
  kiln_bbox b = {v[0], v[1], v[2], v[3]};
  return b;
}

/* Overwrites out[0 .. P) with the boxes of one item's location predictions decoded against the
 * priors: pred row p is loc[(p * L + c) * 4 ..] (L loc classes, c the one decoded); prior is
 * the 2 x 4P prior blob (boxes, then variances). */
void kiln_det_decode_all(kiln_bbox *out, const float *prior, int P, const float *loc, int L,
                         int c, kiln_box_code code, bool variance_in_target);

/* Whether index a goes before index b. */
typedef bool (*kiln_det_before)(int a, int b, const void *ctx);
/* Sorts idx[0 .. n) in place by `before`, which must be a strict total order (break every tie on
 * the index), so the result is that of a stable sort without scratch memory (heapsort). */
void kiln_det_sort(int *idx, int n, kiln_det_before before, const void *ctx);
/* idx[0 .. n) by key[idx] descending, ties by the lower index, NaN after every number. */
void kiln_det_sort_desc(int *idx, int n, const float *key);
/* The first k of kiln_det_sort_desc's order, in that order, in idx[0 .. k) (the rest of idx in
 * no particular order): O(n log k), for mining's few negatives among thousands of priors. */
void kiln_det_top_desc(int *idx, int n, const float *key, int k);

/* Room for `more` rows of `width` floats after b->rows; KILN_ERR_NOMEM (b unchanged) when the
 * allocation fails. */
int kiln_det_buf_reserve(kiln_det_buf *b, int64_t more, int width);

/* A coordinate off the image, as the fork tests it (a NaN is not off the image). */
static inline bool kiln_det_off(float v) { return v < 0 || v > 1; }
/* The fork's IsCrossBoundaryBBox: some coordinate off the image. */
static inline bool kiln_det_cross_boundary(const kiln_bbox *b) {
  return kiln_det_off(b->xmin) || kiln_det_off(b->ymin) || kiln_det_off(b->xmax) ||
         kiln_det_off(b->ymax);
}

#endif
