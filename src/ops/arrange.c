/* Kernels that move, gather or combine values: scaling and sums of whole tensors, Eltwise's SUM
 * (with a fused ReLU's select), PROD and MAX and their gradients, blocks copied between strided
 * places (Concat, Slice, SPP), Tile, Crop's window, rows gathered and scattered by index (Filter,
 * BatchReindex, Embed), ArgMax and Permute's reordered axes. The element-wise ones are
 * vectorised and, from KILN_PARALLEL_FROM elements, split over the op's threads; sums over
 * several inputs add them one input after another, in the inputs' order, whatever the thread
 * count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/kernels.h"

/* The `if` names `parallel`, as in elementwise.c: a bare `if` would also turn `simd` off. */
#define EACH(n)                                                                                  \
  _Pragma("omp parallel for simd schedule(static) num_threads(c->nthreads) if (parallel: n > KILN_PARALLEL_FROM)") \
  for (int64_t k = 0; k < (n); k++)

int kiln_ref_fill(const kiln_op_ctx *c, float *y, float v, int64_t n) {
  (void)c;
  if (v == 0.0f && !signbit(v)) {
    if (n > 0) memset(y, 0, sizeof(float) * (size_t)n);
    return KILN_OK;
  }
  for (int64_t k = 0; k < n; k++) y[k] = v;
  return KILN_OK;
}

int kiln_ref_scale(const kiln_op_ctx *c, float *y, const float *x, float a, int64_t n) {
  EACH(n) y[k] = a * x[k];
  return KILN_OK;
}

int kiln_ref_add(const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n) {
  EACH(n) y[k] = a[k] + b[k];
  return KILN_OK;
}

int kiln_ref_acc(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  EACH(n) y[k] += x[k];
  return KILN_OK;
}

/* ---- Eltwise --------------------------------------------------------------------------------- */

/* The select of a fused ReLU; slope 1 leaves z as it is. */
static inline float sel(float z, float slope) { return z > 0 ? z : slope * z; }

int kiln_ref_eltwise_sum2(const kiln_op_ctx *c, float *y, const float *x0, float c0,
                          const float *x1, float c1, int64_t n, float slope) {
  EACH(n) {
    const float t = c0 * x0[k], z = t + c1 * x1[k];
    y[k] = sel(z, slope);
  }
  return KILN_OK;
}

int kiln_ref_eltwise_sum_acc(const kiln_op_ctx *c, float *y, const float *x, float cx, int64_t n,
                             float slope) {
  EACH(n) y[k] = sel(y[k] + cx * x[k], slope);
  return KILN_OK;
}

int kiln_ref_eltwise_prod(const kiln_op_ctx *c, float *y, const float *const *xs, int nb,
                          int64_t n) {
  (void)c;
  for (int64_t k = 0; k < n; k++) {
    float v = xs[0][k];
    for (int b = 1; b < nb; b++) v *= xs[b][k];
    y[k] = v;
  }
  return KILN_OK;
}

/* Caffe's order: bottom 1 wins a tie with bottom 0; later bottoms must be strictly greater. */
int kiln_ref_eltwise_max(const kiln_op_ctx *c, float *y, float *arg, const float *const *xs,
                         int nb, int64_t n) {
  (void)c;
  const float *a = xs[0], *b1 = xs[1];
  for (int64_t k = 0; k < n; k++) {
    float v = b1[k];
    int w = 1;
    if (a[k] > v) {
      v = a[k];
      w = 0;
    }
    for (int b = 2; b < nb; b++)
      if (xs[b][k] > v) {
        v = xs[b][k];
        w = b;
      }
    y[k] = v;
    arg[k] = (float)w;
  }
  return KILN_OK;
}

int kiln_ref_eltwise_prod_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *y,
                              const float *const *xs, int nb, int b, int64_t n, bool stable) {
  (void)c;
  if (stable) {
    for (int64_t k = 0; k < n; k++) {
      float v = dy[k];
      for (int j = 0; j < nb; j++)
        if (j != b) v *= xs[j][k];
      dx[k] = v;
    }
  } else {
    const float *x = xs[b];
    for (int64_t k = 0; k < n; k++) dx[k] = y[k] / x[k] * dy[k];
  }
  return KILN_OK;
}

int kiln_ref_eltwise_max_bwd(const kiln_op_ctx *c, float *dx, const float *dy, const float *arg,
                             int b, int64_t n) {
  (void)c;
  for (int64_t k = 0; k < n; k++) dx[k] = (int)arg[k] == b ? dy[k] : 0.0f;
  return KILN_OK;
}

int kiln_ref_relu_scale_bwd(const kiln_op_ctx *c, float *dx, float cx, const float *dy,
                            const float *y, int64_t n, float slope) {
  EACH(n) dx[k] = cx * (y[k] > 0 ? dy[k] : slope * dy[k]);
  return KILN_OK;
}

int kiln_ref_relu_scale2_bwd(const kiln_op_ctx *c, float *dx0, float c0, float *dx1, float c1,
                             const float *dy, const float *y, int64_t n, float slope) {
  EACH(n) {
    const float d = y[k] > 0 ? dy[k] : slope * dy[k];
    dx1[k] = c1 * d;
    dx0[k] = c0 * d;
  }
  return KILN_OK;
}

/* ---- blocks, tiles, windows ------------------------------------------------------------------ */

int kiln_ref_copy_blocks(const kiln_op_ctx *c, float *dst, int64_t dst_stride, const float *src,
                         int64_t src_stride, int64_t block, int64_t count) {
  (void)c;
  if (block <= 0) return KILN_OK;
  for (int64_t o = 0; o < count; o++)
    memcpy(dst + o * dst_stride, src + o * src_stride, sizeof(float) * (size_t)block);
  return KILN_OK;
}

int kiln_ref_tile_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t outer,
                      int64_t tiles, int64_t inner) {
  (void)c;
  if (inner <= 0) return KILN_OK;
  for (int64_t o = 0; o < outer; o++, x += inner)
    for (int64_t t = 0; t < tiles; t++, y += inner) memcpy(y, x, sizeof(float) * (size_t)inner);
  return KILN_OK;
}

int kiln_ref_tile_bwd(const kiln_op_ctx *c, float *dx, const float *dy, int64_t outer,
                      int64_t tiles, int64_t inner) {
  (void)c;
  if (inner <= 0) return KILN_OK;
  for (int64_t o = 0; o < outer; o++, dx += inner) {
    memcpy(dx, dy, sizeof(float) * (size_t)inner);
    dy += inner;
    for (int64_t t = 1; t < tiles; t++, dy += inner)
      for (int64_t i = 0; i < inner; i++) dx[i] += dy[i];
  }
  return KILN_OK;
}

int kiln_ref_crop_copy(const kiln_op_ctx *c, float *small, float *big, int naxes,
                       const int64_t *big_shape, const int64_t *small_shape,
                       const int64_t *offset, bool to_small) {
  (void)c;
  int64_t count = 1;
  for (int i = 0; i < naxes; i++) count *= small_shape[i];
  if (count == 0) return KILN_OK;
  if (naxes == 0) {
    if (to_small) small[0] = big[0];
    else big[0] = small[0];
    return KILN_OK;
  }
  const int64_t row = small_shape[naxes - 1], rows = count / row;
  int64_t idx[KILN_MAX_AXES] = {0};
  for (int64_t r = 0; r < rows; r++) {
    /* the row's start in the input: index + offset on each axis */
    int64_t at = 0;
    for (int i = 0; i < naxes; i++)
      at = at * big_shape[i] + (i < naxes - 1 ? idx[i] : 0) + offset[i];
    if (to_small) memcpy(small + r * row, big + at, sizeof(float) * (size_t)row);
    else memcpy(big + at, small + r * row, sizeof(float) * (size_t)row);
    for (int i = naxes - 2; i >= 0; i--) { /* next row */
      if (++idx[i] < small_shape[i]) break;
      idx[i] = 0;
    }
  }
  return KILN_OK;
}

/* ---- rows by index --------------------------------------------------------------------------- */

int kiln_ref_select_nonzero(const kiln_op_ctx *c, int64_t *index, int64_t *count,
                            const float *sel, int64_t n) {
  (void)c;
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++)
    if (sel[i] != 0) index[k++] = i;
  *count = k;
  return KILN_OK;
}

int kiln_ref_gather_rows(const kiln_op_ctx *c, float *y, const float *x, const int64_t *index,
                         int64_t nindex, int64_t dim) {
  (void)c;
  for (int64_t k = 0; k < nindex; k++)
    memcpy(y + k * dim, x + index[k] * dim, sizeof(float) * (size_t)dim);
  return KILN_OK;
}

int kiln_ref_scatter_rows(const kiln_op_ctx *c, float *dx, const float *dy, const int64_t *index,
                          int64_t nindex, int64_t dim) {
  (void)c;
  for (int64_t k = 0; k < nindex; k++)
    memcpy(dx + index[k] * dim, dy + k * dim, sizeof(float) * (size_t)dim);
  return KILN_OK;
}

/* BatchReindex's index v at position k as a row of a batch of `rows`: Caffe's truncation of a
 * fraction, but never a row outside the batch. */
static int batch_row(float v, int64_t k, int64_t rows) {
  if (!(v >= 0))
    return kiln_errorf(KILN_ERR_DATA, "index %g at position %lld is negative", (double)v,
                       (long long)k);
  if (!(v < (float)rows) || (int64_t)v >= rows)
    return kiln_errorf(KILN_ERR_DATA, "index %g at position %lld is past the batch of %lld",
                       (double)v, (long long)k, (long long)rows);
  return KILN_OK;
}

/* Embed's index v at element k as a row of W: Caffe only checks this in debug builds and reads
 * past the table otherwise. */
static int embed_row(float v, int64_t k, int64_t rows, int64_t *row) {
  if (!(v >= 0 && v < (float)rows) || v != floorf(v))
    return kiln_errorf(KILN_ERR_INVALID, "index %g at element %lld is not a whole number in [0, %lld)",
                       (double)v, (long long)k, (long long)rows);
  *row = (int64_t)v;
  return KILN_OK;
}

int kiln_ref_gather_rows_at(const kiln_op_ctx *c, float *y, const float *x, const float *index,
                            int64_t nindex, int64_t rows, int64_t dim) {
  (void)c;
  for (int64_t k = 0; k < nindex; k++) KILN_TRY(batch_row(index[k], k, rows)); /* all first */
  for (int64_t k = 0; k < nindex; k++)
    memcpy(y + k * dim, x + (int64_t)index[k] * dim, sizeof(float) * (size_t)dim);
  return KILN_OK;
}

int kiln_ref_scatter_add_rows_at(const kiln_op_ctx *c, float *dx, const float *dy,
                                 const float *index, int64_t nindex, int64_t rows, int64_t dim) {
  (void)c;
  for (int64_t k = 0; k < nindex; k++) KILN_TRY(batch_row(index[k], k, rows));
  for (int64_t k = 0; k < nindex; k++) {
    float *d = dx + (int64_t)index[k] * dim;
    const float *g = dy + k * dim;
    for (int64_t i = 0; i < dim; i++) d[i] += g[i];
  }
  return KILN_OK;
}

int kiln_ref_embed_fwd(const kiln_op_ctx *c, float *y, const float *w, const float *b,
                       const float *index, int64_t M, int64_t N, int64_t K) {
  (void)c;
  for (int64_t m = 0; m < M; m++) {
    int64_t k = 0;
    KILN_TRY(embed_row(index[m], m, K, &k));
    const float *row = w + k * N;
    float *out = y + m * N;
    if (b)
      for (int64_t n = 0; n < N; n++) out[n] = row[n] + b[n];
    else
      memcpy(out, row, sizeof(float) * (size_t)N);
  }
  return KILN_OK;
}

/* Rows of W that several positions share get their gradients added in position order, so the
 * result is the same whatever the thread count: threads split the columns, never the positions.
 * Every index is checked first: backward must not write outside W. */
int kiln_ref_embed_bwd(const kiln_op_ctx *c, float *dw, const float *dy, const float *index,
                       int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; m++) {
    int64_t k;
    KILN_TRY(embed_row(index[m], m, K, &k));
  }
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (M * N > 65536)
  for (int64_t c0 = 0; c0 < N; c0 += 64) {
    const int64_t c1 = c0 + 64 < N ? c0 + 64 : N;
    for (int64_t m = 0; m < M; m++) {
      float *row = dw + (int64_t)index[m] * N;
      const float *g = dy + m * N;
      for (int64_t n = c0; n < c1; n++) row[n] += g[n];
    }
  }
  return KILN_OK;
}

/* ---- ArgMax ---------------------------------------------------------------------------------- */

typedef struct {
  float value;
  int64_t index;
} ranked;

static bool ranks_before(const ranked *u, const ranked *v) {
  return u->value > v->value || (u->value == v->value && u->index > v->index);
}

/* Descending by value, then by index (so ties put the larger index first). */
static int rank_desc(const void *a, const void *b) {
  const ranked *u = a, *v = b;
  if (u->value != v->value) return u->value < v->value ? 1 : -1;
  return u->index < v->index ? 1 : u->index > v->index ? -1 : 0;
}

int64_t kiln_argmax_workspace_bytes(int64_t dim) { return (int64_t)sizeof(ranked) * dim; }

int kiln_ref_argmax_fwd(const kiln_op_ctx *c, float *y, void *ws, const float *x, int64_t num,
                        int64_t dim, int64_t dist, int64_t top_k, bool out_max_val,
                        bool along_axis) {
  (void)c;
  ranked *pr = ws;
  const int64_t k = top_k;
  for (int64_t i = 0; i < num; i++) {
    int64_t outer = i / dist, inner = i % dist;
    for (int64_t j = 0; j < dim; j++)
      pr[j] = (ranked){.value = x[(outer * dim + j) * dist + inner], .index = j};
    if (k == 1) { /* the common case: one pass */
      int64_t best = 0;
      for (int64_t j = 1; j < dim; j++)
        if (ranks_before(&pr[j], &pr[best])) best = j;
      ranked t = pr[0];
      pr[0] = pr[best];
      pr[best] = t;
    } else {
      qsort(pr, (size_t)dim, sizeof *pr, rank_desc);
    }
    for (int64_t j = 0; j < k; j++) {
      if (along_axis) {
        y[(outer * k + j) * dist + inner] = out_max_val ? pr[j].value : (float)pr[j].index;
      } else if (out_max_val) {
        y[2 * i * k + j] = (float)pr[j].index;
        y[2 * i * k + k + j] = pr[j].value;
      } else {
        y[i * k + j] = (float)pr[j].index;
      }
    }
  }
  return KILN_OK;
}

/* ---- Permute --------------------------------------------------------------------------------- */

/* The output's shape and, per output axis, the input's stride along it; KILN_ERR_INVALID for an
 * order that is not a permutation of the axes or a count that is not the shape's. */
static int permute_plan(int naxes, const int64_t *shape, const int *order, int64_t n,
                        int64_t *out_shape, int64_t *src_stride) {
  if (naxes < 0 || naxes > KILN_MAX_AXES)
    return kiln_errorf(KILN_ERR_INVALID, "permute: %d axes (at most %d)", naxes, KILN_MAX_AXES);
  int64_t stride[KILN_MAX_AXES], count = 1;
  for (int a = naxes - 1; a >= 0; a--) {
    stride[a] = count;
    count *= shape[a];
  }
  if (count != n)
    return kiln_errorf(KILN_ERR_INVALID, "permute: %lld values for a shape of %lld",
                       (long long)n, (long long)count);
  unsigned seen = 0;
  for (int i = 0; i < naxes; i++) {
    if (order[i] < 0 || order[i] >= naxes || (seen >> order[i] & 1))
      return kiln_errorf(KILN_ERR_INVALID, "permute: order[%d] = %d is no unused axis of %d", i,
                         order[i], naxes);
    seen |= 1u << order[i];
    out_shape[i] = shape[order[i]];
    src_stride[i] = stride[order[i]];
  }
  return KILN_OK;
}

/* Row by row of the output (its last axis), each row's start in the input from its index. */
int kiln_ref_permute(const kiln_op_ctx *c, float *y, const float *x, int naxes,
                     const int64_t *shape, const int *order, int64_t n) {
  int64_t ts[KILN_MAX_AXES], ss[KILN_MAX_AXES];
  KILN_TRY(permute_plan(naxes, shape, order, n, ts, ss));
  if (n == 0) return KILN_OK;
  const int last = naxes - 1;
  const int64_t inner = naxes ? ts[last] : 1, step = naxes ? ss[last] : 1, rows = n / inner;
#pragma omp parallel for schedule(static) num_threads(c->nthreads) if (n > KILN_PARALLEL_FROM)
  for (int64_t r = 0; r < rows; r++) {
    int64_t rem = r, at = 0;
    for (int a = last - 1; a >= 0; a--) {
      at += rem % ts[a] * ss[a];
      rem /= ts[a];
    }
    const float *xr = x + at;
    float *yr = y + r * inner;
    if (step == 1) memcpy(yr, xr, sizeof(float) * (size_t)inner);
    else
      for (int64_t j = 0; j < inner; j++) yr[j] = xr[j * step];
  }
  return KILN_OK;
}
