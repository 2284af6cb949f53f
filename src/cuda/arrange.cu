/* The arrange family on the CUDA backend (KILN_OPS_ARRANGE): one thread an output value. Where
 * several inputs add into one place (Tile's, BatchReindex's and Embed's gradients) one thread
 * owns each output column and adds the items in their order, the reference's sum bit for bit,
 * without atomics. Host-side arrays (Eltwise's bottoms, Filter's indices, Crop's and Permute's
 * shapes) reach the kernels as a table copied to device scratch or as a struct by value. */
#include "cuda/kcuda.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "kiln/blob.h"
#ifdef __cplusplus
}
#endif

/* ---- whole tensors --------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_fill(float *y, float v, int64_t n) {
  KCUDA_FOR(i, n) y[i] = v;
}

KCUDA_OP(fill)(const kiln_op_ctx *c, float *y, float v, int64_t n) {
  KCUDA_LAUNCH(c, n, k_fill, y, v, n);
  return kcuda_launched(c, "fill");
}

KCUDA_GLOBAL void k_scale(float *y, const float *x, float a, int64_t n) {
  KCUDA_FOR(i, n) y[i] = a * x[i];
}

KCUDA_OP(scale)(const kiln_op_ctx *c, float *y, const float *x, float a, int64_t n) {
  KCUDA_LAUNCH(c, n, k_scale, y, x, a, n);
  return kcuda_launched(c, "scale");
}

KCUDA_GLOBAL void k_add(float *y, const float *a, const float *b, int64_t n) {
  KCUDA_FOR(i, n) y[i] = a[i] + b[i];
}

KCUDA_OP(add)(const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n) {
  KCUDA_LAUNCH(c, n, k_add, y, a, b, n);
  return kcuda_launched(c, "add");
}

KCUDA_GLOBAL void k_acc(float *y, const float *x, int64_t n) {
  KCUDA_FOR(i, n) y[i] += x[i];
}

KCUDA_OP(acc)(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  KCUDA_LAUNCH(c, n, k_acc, y, x, n);
  return kcuda_launched(c, "acc");
}

/* ---- Eltwise --------------------------------------------------------------------------------- */

/* The select of a fused ReLU; slope 1 leaves z as it is. */
KCUDA_DEV float sel_relu(float z, float slope) { return z > 0 ? z : slope * z; }

KCUDA_GLOBAL void k_eltwise_sum2(float *y, const float *x0, float c0, const float *x1, float c1,
                                 int64_t n, float slope) {
  KCUDA_FOR(i, n) {
    const float t = c0 * x0[i], z = t + c1 * x1[i];
    y[i] = sel_relu(z, slope);
  }
}

KCUDA_OP(eltwise_sum2)(const kiln_op_ctx *c, float *y, const float *x0, float c0, const float *x1,
                       float c1, int64_t n, float slope) {
  KCUDA_LAUNCH(c, n, k_eltwise_sum2, y, x0, c0, x1, c1, n, slope);
  return kcuda_launched(c, "eltwise_sum2");
}

KCUDA_GLOBAL void k_eltwise_sum_acc(float *y, const float *x, float cx, int64_t n, float slope) {
  KCUDA_FOR(i, n) y[i] = sel_relu(y[i] + cx * x[i], slope);
}

KCUDA_OP(eltwise_sum_acc)(const kiln_op_ctx *c, float *y, const float *x, float cx, int64_t n,
                          float slope) {
  KCUDA_LAUNCH(c, n, k_eltwise_sum_acc, y, x, cx, n, slope);
  return kcuda_launched(c, "eltwise_sum_acc");
}

/* The bottoms' pointers are a host array: the kernels read them from a copy in device scratch. */
static int bottoms_table(const kiln_op_ctx *c, const float *const *xs, int nb,
                         const float *const **out) {
  void *p;
  const size_t bytes = sizeof(const float *) * (size_t)nb;
  KILN_TRY(kcuda_scratch(c, bytes, &p));
  KILN_TRY(kiln_device_to_device(c->device, p, xs, bytes));
  *out = (const float *const *)p;
  return KILN_OK;
}

KCUDA_GLOBAL void k_eltwise_prod(float *y, const float *const *xs, int nb, int64_t n) {
  KCUDA_FOR(i, n) {
    float v = xs[0][i];
    for (int b = 1; b < nb; b++) v *= xs[b][i];
    y[i] = v;
  }
}

KCUDA_OP(eltwise_prod)(const kiln_op_ctx *c, float *y, const float *const *xs, int nb, int64_t n) {
  if (n <= 0 || nb <= 0) return KILN_OK;
  const float *const *t;
  KILN_TRY(bottoms_table(c, xs, nb, &t));
  KCUDA_LAUNCH(c, n, k_eltwise_prod, y, t, nb, n);
  return kcuda_launched(c, "eltwise_prod");
}

/* Caffe's order: bottom 1 wins a tie with bottom 0; later bottoms must be strictly greater. */
KCUDA_GLOBAL void k_eltwise_max(float *y, float *arg, const float *const *xs, int nb, int64_t n) {
  KCUDA_FOR(i, n) {
    float v = xs[1][i];
    int w = 1;
    const float a = xs[0][i];
    if (a > v) {
      v = a;
      w = 0;
    }
    for (int b = 2; b < nb; b++) {
      const float u = xs[b][i];
      if (u > v) {
        v = u;
        w = b;
      }
    }
    y[i] = v;
    arg[i] = (float)w;
  }
}

KCUDA_OP(eltwise_max)(const kiln_op_ctx *c, float *y, float *arg, const float *const *xs, int nb,
                      int64_t n) {
  if (n <= 0) return KILN_OK;
  if (nb < 2) return kiln_errorf(KILN_ERR_INVALID, "eltwise_max: %d bottoms, needs 2 or more", nb);
  const float *const *t;
  KILN_TRY(bottoms_table(c, xs, nb, &t));
  KCUDA_LAUNCH(c, n, k_eltwise_max, y, arg, t, nb, n);
  return kcuda_launched(c, "eltwise_max");
}

KCUDA_GLOBAL void k_eltwise_prod_bwd_stable(float *dx, const float *dy, const float *const *xs,
                                            int nb, int b, int64_t n) {
  KCUDA_FOR(i, n) {
    float v = dy[i];
    for (int j = 0; j < nb; j++)
      if (j != b) v *= xs[j][i];
    dx[i] = v;
  }
}

KCUDA_GLOBAL void k_eltwise_prod_bwd(float *dx, const float *dy, const float *y, const float *x,
                                     int64_t n) {
  KCUDA_FOR(i, n) dx[i] = y[i] / x[i] * dy[i];
}

KCUDA_OP(eltwise_prod_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *y,
                           const float *const *xs, int nb, int b, int64_t n, bool stable) {
  if (n <= 0) return KILN_OK;
  if (b < 0 || b >= nb)
    return kiln_errorf(KILN_ERR_INVALID, "eltwise_prod_bwd: bottom %d of %d", b, nb);
  if (stable) {
    const float *const *t;
    KILN_TRY(bottoms_table(c, xs, nb, &t));
    KCUDA_LAUNCH(c, n, k_eltwise_prod_bwd_stable, dx, dy, t, nb, b, n);
  } else {
    KCUDA_LAUNCH(c, n, k_eltwise_prod_bwd, dx, dy, y, xs[b], n);
  }
  return kcuda_launched(c, "eltwise_prod_bwd");
}

KCUDA_GLOBAL void k_eltwise_max_bwd(float *dx, const float *dy, const float *arg, int b,
                                    int64_t n) {
  KCUDA_FOR(i, n) dx[i] = (int)arg[i] == b ? dy[i] : 0.0f;
}

KCUDA_OP(eltwise_max_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *arg,
                          int b, int64_t n) {
  KCUDA_LAUNCH(c, n, k_eltwise_max_bwd, dx, dy, arg, b, n);
  return kcuda_launched(c, "eltwise_max_bwd");
}

KCUDA_GLOBAL void k_relu_scale_bwd(float *dx, float cx, const float *dy, const float *y,
                                   int64_t n, float slope) {
  KCUDA_FOR(i, n) dx[i] = cx * (y[i] > 0 ? dy[i] : slope * dy[i]);
}

KCUDA_OP(relu_scale_bwd)(const kiln_op_ctx *c, float *dx, float cx, const float *dy,
                         const float *y, int64_t n, float slope) {
  KCUDA_LAUNCH(c, n, k_relu_scale_bwd, dx, cx, dy, y, n, slope);
  return kcuda_launched(c, "relu_scale_bwd");
}

/* d is read before either write: dx0 or dx1 may be dy. */
KCUDA_GLOBAL void k_relu_scale2_bwd(float *dx0, float c0, float *dx1, float c1, const float *dy,
                                    const float *y, int64_t n, float slope) {
  KCUDA_FOR(i, n) {
    const float d = y[i] > 0 ? dy[i] : slope * dy[i];
    dx1[i] = c1 * d;
    dx0[i] = c0 * d;
  }
}

KCUDA_OP(relu_scale2_bwd)(const kiln_op_ctx *c, float *dx0, float c0, float *dx1, float c1,
                          const float *dy, const float *y, int64_t n, float slope) {
  KCUDA_LAUNCH(c, n, k_relu_scale2_bwd, dx0, c0, dx1, c1, dy, y, n, slope);
  return kcuda_launched(c, "relu_scale2_bwd");
}

/* ---- blocks, tiles, windows ------------------------------------------------------------------ */

KCUDA_GLOBAL void k_copy_blocks(float *dst, int64_t dst_stride, const float *src,
                                int64_t src_stride, int64_t block, int64_t count) {
  KCUDA_FOR(i, block * count) {
    const int64_t o = i / block, j = i % block;
    dst[o * dst_stride + j] = src[o * src_stride + j];
  }
}

KCUDA_OP(copy_blocks)(const kiln_op_ctx *c, float *dst, int64_t dst_stride, const float *src,
                      int64_t src_stride, int64_t block, int64_t count) {
  if (block <= 0 || count <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, block * count, k_copy_blocks, dst, dst_stride, src, src_stride, block, count);
  return kcuda_launched(c, "copy_blocks");
}

KCUDA_GLOBAL void k_tile_fwd(float *y, const float *x, int64_t outer, int64_t tiles,
                             int64_t inner) {
  KCUDA_FOR(i, outer * tiles * inner) y[i] = x[i / (tiles * inner) * inner + i % inner];
}

KCUDA_OP(tile_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t outer, int64_t tiles,
                   int64_t inner) {
  if (inner <= 0 || tiles <= 0 || outer <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, outer * tiles * inner, k_tile_fwd, y, x, outer, tiles, inner);
  return kcuda_launched(c, "tile_fwd");
}

/* One thread a value of dx, its tiles added in order from the first (the reference's copy). */
KCUDA_GLOBAL void k_tile_bwd(float *dx, const float *dy, int64_t outer, int64_t tiles,
                             int64_t inner) {
  KCUDA_FOR(i, outer * inner) {
    const float *g = dy + i / inner * tiles * inner + i % inner;
    float s = tiles > 0 ? g[0] : 0.0f;
    for (int64_t t = 1; t < tiles; t++) s += g[t * inner];
    dx[i] = s;
  }
}

KCUDA_OP(tile_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, int64_t outer, int64_t tiles,
                   int64_t inner) {
  if (inner <= 0 || outer <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, outer * inner, k_tile_bwd, dx, dy, outer, tiles, inner);
  return kcuda_launched(c, "tile_bwd");
}

/* Crop's shapes, by value. */
typedef struct {
  int64_t big[KILN_MAX_AXES], small[KILN_MAX_AXES], offset[KILN_MAX_AXES];
  int naxes;
} kcuda_crop;

/* One thread a value of the window: its place in big from its index in small, last axis first. */
KCUDA_GLOBAL void k_crop_copy(float *small, float *big, kcuda_crop g, int64_t count,
                              bool to_small) {
  KCUDA_FOR(i, count) {
    int64_t rem = i, at = 0, stride = 1;
    for (int a = g.naxes - 1; a >= 0; a--) {
      const int64_t q = rem % g.small[a];
      rem /= g.small[a];
      at += (q + g.offset[a]) * stride;
      stride *= g.big[a];
    }
    if (to_small) small[i] = big[at];
    else big[at] = small[i];
  }
}

KCUDA_OP(crop_copy)(const kiln_op_ctx *c, float *small, float *big, int naxes,
                    const int64_t *big_shape, const int64_t *small_shape, const int64_t *offset,
                    bool to_small) {
  if (naxes < 0 || naxes > KILN_MAX_AXES)
    return kiln_errorf(KILN_ERR_INVALID, "crop_copy: %d axes (at most %d)", naxes, KILN_MAX_AXES);
  kcuda_crop g;
  g.naxes = naxes;
  int64_t count = 1;
  for (int a = 0; a < naxes; a++) {
    g.big[a] = big_shape[a];
    g.small[a] = small_shape[a];
    g.offset[a] = offset[a];
    count *= small_shape[a];
  }
  if (count <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, count, k_crop_copy, small, big, g, count, to_small);
  return kcuda_launched(c, "crop_copy");
}

/* ---- rows by index --------------------------------------------------------------------------- */

/* The selector comes back to the host: the count decides the tops' shapes there, and the
 * indices stay on the host for gather_rows and scatter_rows. */
KCUDA_OP(select_nonzero)(const kiln_op_ctx *c, int64_t *index, int64_t *count, const float *sel,
                         int64_t n) {
  int64_t k = 0;
  if (n > 0) {
    void *hv;
    KILN_TRY(kcuda_host_scratch(c, sizeof(float) * (size_t)n, &hv));
    const float *h = (const float *)hv;
    KILN_TRY(kiln_device_to_host(c->device, hv, sel, sizeof(float) * (size_t)n));
    for (int64_t i = 0; i < n; i++)
      if (h[i] != 0) index[k++] = i;
  }
  *count = k;
  return KILN_OK;
}

/* Host indices to device scratch. */
static int indices_to_device(const kiln_op_ctx *c, const int64_t *index, int64_t nindex,
                             const int64_t **out) {
  void *p;
  const size_t bytes = sizeof(int64_t) * (size_t)nindex;
  KILN_TRY(kcuda_scratch(c, bytes, &p));
  KILN_TRY(kiln_device_to_device(c->device, p, index, bytes));
  *out = (const int64_t *)p;
  return KILN_OK;
}

KCUDA_GLOBAL void k_gather_rows(float *y, const float *x, const int64_t *index, int64_t nindex,
                                int64_t dim) {
  KCUDA_FOR(i, nindex * dim) y[i] = x[index[i / dim] * dim + i % dim];
}

KCUDA_OP(gather_rows)(const kiln_op_ctx *c, float *y, const float *x, const int64_t *index,
                      int64_t nindex, int64_t dim) {
  if (nindex <= 0 || dim <= 0) return KILN_OK;
  const int64_t *d;
  KILN_TRY(indices_to_device(c, index, nindex, &d));
  KCUDA_LAUNCH(c, nindex * dim, k_gather_rows, y, x, d, nindex, dim);
  return kcuda_launched(c, "gather_rows");
}

KCUDA_GLOBAL void k_scatter_rows(float *dx, const float *dy, const int64_t *index, int64_t nindex,
                                 int64_t dim) {
  KCUDA_FOR(i, nindex * dim) dx[index[i / dim] * dim + i % dim] = dy[i];
}

/* A repeated row: one thread a column writes the rows in order, so the last one stays. */
KCUDA_GLOBAL void k_scatter_rows_ordered(float *dx, const float *dy, const int64_t *index,
                                         int64_t nindex, int64_t dim) {
  KCUDA_FOR(j, dim) {
    for (int64_t k = 0; k < nindex; k++) dx[index[k] * dim + j] = dy[k * dim + j];
  }
}

KCUDA_OP(scatter_rows)(const kiln_op_ctx *c, float *dx, const float *dy, const int64_t *index,
                       int64_t nindex, int64_t dim) {
  if (nindex <= 0 || dim <= 0) return KILN_OK;
  bool increasing = true; /* Filter's: no row twice, every row its own threads */
  for (int64_t k = 1; k < nindex && increasing; k++) increasing = index[k] > index[k - 1];
  const int64_t *d;
  KILN_TRY(indices_to_device(c, index, nindex, &d));
  if (increasing) KCUDA_LAUNCH(c, nindex * dim, k_scatter_rows, dx, dy, d, nindex, dim);
  else KCUDA_LAUNCH(c, dim, k_scatter_rows_ordered, dx, dy, d, nindex, dim);
  return kcuda_launched(c, "scatter_rows");
}

/* Float indices are checked on the device: each chunk's first bad position, then the first of
 * those, with its value, comes back to the host for the reference's message. */
enum { KCUDA_ROW_BATCH, KCUDA_ROW_EMBED };

typedef struct {
  int64_t pos; /* -1: none */
  float value;
} kcuda_bad;

/* BatchReindex's rule: Caffe's truncation of a fraction, but never a row outside the batch;
 * Embed's: a whole number in [0, rows). */
KCUDA_DEV bool bad_row(float v, int64_t rows, int rule) {
  if (rule == KCUDA_ROW_EMBED) return !(v >= 0 && v < (float)rows) || v != floorf(v);
  return !(v >= 0) || !(v < (float)rows) || (int64_t)v >= rows;
}

KCUDA_GLOBAL void k_first_bad_parts(int64_t *part, const float *index, int64_t n, int64_t rows,
                                    int rule, int64_t parts) {
  KCUDA_FOR(p, parts) {
    const int64_t end = (p + 1) * KCUDA_CHUNK < n ? (p + 1) * KCUDA_CHUNK : n;
    int64_t first = -1;
    for (int64_t k = p * KCUDA_CHUNK; k < end; k++)
      if (bad_row(index[k], rows, rule)) {
        first = k;
        break;
      }
    part[p] = first;
  }
}

KCUDA_GLOBAL void k_first_bad(kcuda_bad *out, const int64_t *part, int64_t parts,
                              const float *index) {
  KCUDA_FOR(t, 1) {
    out->pos = -1;
    out->value = 0;
    for (int64_t p = 0; p < parts; p++)
      if (part[p] >= 0) {
        out->pos = part[p];
        out->value = index[part[p]];
        break;
      }
  }
}

/* KILN_OK when every index is a row by `rule`, else the reference's error naming the first. */
static int check_rows(const kiln_op_ctx *c, const char *op, const float *index, int64_t n,
                      int64_t rows, int rule) {
  if (n <= 0) return KILN_OK;
  const int64_t parts = (n + KCUDA_CHUNK - 1) / KCUDA_CHUNK;
  void *p;
  KILN_TRY(kcuda_scratch(c, sizeof(kcuda_bad) + sizeof(int64_t) * (size_t)parts, &p));
  kcuda_bad *bad = (kcuda_bad *)p;
  int64_t *part = (int64_t *)((char *)p + sizeof(kcuda_bad));
  KCUDA_LAUNCH(c, parts, k_first_bad_parts, part, index, n, rows, rule, parts);
  KCUDA_LAUNCH(c, 1, k_first_bad, bad, part, parts, index);
  KILN_TRY(kcuda_launched(c, op));
  kcuda_bad h;
  KILN_TRY(kiln_device_to_host(c->device, &h, bad, sizeof h));
  if (h.pos < 0) return KILN_OK;
  const double v = (double)h.value;
  if (rule == KCUDA_ROW_EMBED)
    return kiln_errorf(KILN_ERR_INVALID,
                       "index %g at element %lld is not a whole number in [0, %lld)", v,
                       (long long)h.pos, (long long)rows);
  if (!(h.value >= 0))
    return kiln_errorf(KILN_ERR_DATA, "index %g at position %lld is negative", v,
                       (long long)h.pos);
  return kiln_errorf(KILN_ERR_DATA, "index %g at position %lld is past the batch of %lld", v,
                     (long long)h.pos, (long long)rows);
}

KCUDA_GLOBAL void k_gather_rows_at(float *y, const float *x, const float *index, int64_t nindex,
                                   int64_t dim) {
  KCUDA_FOR(i, nindex * dim) y[i] = x[(int64_t)index[i / dim] * dim + i % dim];
}

KCUDA_OP(gather_rows_at)(const kiln_op_ctx *c, float *y, const float *x, const float *index,
                         int64_t nindex, int64_t rows, int64_t dim) {
  KILN_TRY(check_rows(c, "gather_rows_at", index, nindex, rows, KCUDA_ROW_BATCH)); /* all first */
  if (nindex <= 0 || dim <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, nindex * dim, k_gather_rows_at, y, x, index, nindex, dim);
  return kcuda_launched(c, "gather_rows_at");
}

/* One thread a column, the items in order: repeated rows add up as on the host. */
KCUDA_GLOBAL void k_scatter_add_cols(float *dx, const float *dy, const float *index,
                                     int64_t nindex, int64_t dim) {
  KCUDA_FOR(j, dim) {
    for (int64_t k = 0; k < nindex; k++) dx[(int64_t)index[k] * dim + j] += dy[k * dim + j];
  }
}

KCUDA_OP(scatter_add_rows_at)(const kiln_op_ctx *c, float *dx, const float *dy,
                              const float *index, int64_t nindex, int64_t rows, int64_t dim) {
  KILN_TRY(check_rows(c, "scatter_add_rows_at", index, nindex, rows, KCUDA_ROW_BATCH));
  if (nindex <= 0 || dim <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, dim, k_scatter_add_cols, dx, dy, index, nindex, dim);
  return kcuda_launched(c, "scatter_add_rows_at");
}

KCUDA_GLOBAL void k_embed_fwd(float *y, const float *w, const float *b, const float *index,
                              int64_t M, int64_t N) {
  KCUDA_FOR(i, M * N) {
    const int64_t n = i % N;
    const float v = w[(int64_t)index[i / N] * N + n];
    y[i] = b ? v + b[n] : v;
  }
}

/* Every index is checked before any row is written (the reference stops at the bad one). */
KCUDA_OP(embed_fwd)(const kiln_op_ctx *c, float *y, const float *w, const float *b,
                    const float *index, int64_t M, int64_t N, int64_t K) {
  KILN_TRY(check_rows(c, "embed_fwd", index, M, K, KCUDA_ROW_EMBED));
  if (M <= 0 || N <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, M * N, k_embed_fwd, y, w, b, index, M, N);
  return kcuda_launched(c, "embed_fwd");
}

/* Every index is checked first: backward must not write outside W. */
KCUDA_OP(embed_bwd)(const kiln_op_ctx *c, float *dw, const float *dy, const float *index,
                    int64_t M, int64_t N, int64_t K) {
  KILN_TRY(check_rows(c, "embed_bwd", index, M, K, KCUDA_ROW_EMBED));
  if (M <= 0 || N <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, N, k_scatter_add_cols, dw, dy, index, M, N);
  return kcuda_launched(c, "embed_bwd");
}

/* ---- ArgMax ---------------------------------------------------------------------------------- */

/* The reference's order: descending by value, then by index (ties put the larger index first). */
KCUDA_DEV bool ranks_before(float uv, int64_t ui, float vv, int64_t vi) {
  return uv > vv || (uv == vv && ui > vi);
}

/* One thread an item: its j-th value is the first by that order of those after the (j-1)-th,
 * so no item needs memory of its own. With k 1 it is the reference's scan exactly (a NaN
 * included); past the first, a NaN ranks after nothing and is never picked (the reference's
 * sort leaves it anywhere): a rank with none left reads index -1, value NaN. */
KCUDA_GLOBAL void k_argmax(float *y, const float *x, int64_t num, int64_t dim, int64_t dist,
                           int64_t k, bool out_max_val, bool along_axis) {
  KCUDA_FOR(i, num) {
    const int64_t outer = i / dist, inner = i % dist;
    const float *xi = x + outer * dim * dist + inner;
    float pv = 0;
    int64_t pj = -1;
    for (int64_t r = 0; r < k; r++) {
      float bv = NAN;
      int64_t bj = -1;
      for (int64_t j = 0; j < dim; j++) {
        const float v = xi[j * dist];
        if (r > 0 && !ranks_before(pv, pj, v, j)) continue;
        if (bj < 0 || ranks_before(v, j, bv, bj)) {
          bv = v;
          bj = j;
        }
      }
      if (along_axis) {
        y[(outer * k + r) * dist + inner] = out_max_val ? bv : (float)bj;
      } else if (out_max_val) {
        y[2 * i * k + r] = (float)bj;
        y[2 * i * k + k + r] = bv;
      } else {
        y[i * k + r] = (float)bj;
      }
      pv = bv;
      pj = bj;
    }
  }
}

/* ws is the host's pairs buffer (kiln_argmax_workspace_bytes): not needed here. */
KCUDA_OP(argmax_fwd)(const kiln_op_ctx *c, float *y, void *ws, const float *x, int64_t num,
                     int64_t dim, int64_t dist, int64_t top_k, bool out_max_val, bool along_axis) {
  (void)ws;
  if (num <= 0 || top_k <= 0) return KILN_OK;
  if (dim <= 0 || dist <= 0 || top_k > dim)
    return kiln_errorf(KILN_ERR_INVALID, "argmax_fwd: top %lld of %lld values %lld apart",
                       (long long)top_k, (long long)dim, (long long)dist);
  KCUDA_LAUNCH(c, num, k_argmax, y, x, num, dim, dist, top_k, out_max_val, along_axis);
  return kcuda_launched(c, "argmax_fwd");
}

/* ---- Permute -------------------------------------------------------------------------------- */

/* Permute's plan, by value: the output's shape and the input's stride along each output axis. */
typedef struct {
  int64_t shape[KILN_MAX_AXES], stride[KILN_MAX_AXES];
  int naxes;
} kcuda_perm;

/* One thread a value of the output: its place in the input from its index, last axis first. */
KCUDA_GLOBAL void k_permute(float *y, const float *x, kcuda_perm g, int64_t n) {
  KCUDA_FOR(i, n) {
    int64_t rem = i, at = 0;
    for (int a = g.naxes - 1; a >= 0; a--) {
      at += rem % g.shape[a] * g.stride[a];
      rem /= g.shape[a];
    }
    y[i] = x[at];
  }
}

/* The reference's checks: a permutation of the axes, and n the shape's count. */
KCUDA_OP(permute)(const kiln_op_ctx *c, float *y, const float *x, int naxes, const int64_t *shape,
                  const int *order, int64_t n) {
  if (naxes < 0 || naxes > KILN_MAX_AXES)
    return kiln_errorf(KILN_ERR_INVALID, "permute: %d axes (at most %d)", naxes, KILN_MAX_AXES);
  kcuda_perm g;
  int64_t stride[KILN_MAX_AXES], count = 1;
  for (int a = naxes - 1; a >= 0; a--) {
    stride[a] = count;
    count *= shape[a];
  }
  if (count != n)
    return kiln_errorf(KILN_ERR_INVALID, "permute: %lld values for a shape of %lld",
                       (long long)n, (long long)count);
  unsigned seen = 0;
  g.naxes = naxes;
  for (int i = 0; i < naxes; i++) {
    if (order[i] < 0 || order[i] >= naxes || (seen >> order[i] & 1))
      return kiln_errorf(KILN_ERR_INVALID, "permute: order[%d] = %d is no unused axis of %d", i,
                         order[i], naxes);
    seen |= 1u << order[i];
    g.shape[i] = shape[order[i]];
    g.stride[i] = stride[order[i]];
  }
  if (n <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, n, k_permute, y, x, g, n);
  return kcuda_launched(c, "permute");
}

KCUDA_REGISTER(arrange) {
  b->fill = KCUDA_FN(fill);
  b->scale = KCUDA_FN(scale);
  b->add = KCUDA_FN(add);
  b->acc = KCUDA_FN(acc);
  b->eltwise_sum2 = KCUDA_FN(eltwise_sum2);
  b->eltwise_sum_acc = KCUDA_FN(eltwise_sum_acc);
  b->eltwise_prod = KCUDA_FN(eltwise_prod);
  b->eltwise_max = KCUDA_FN(eltwise_max);
  b->eltwise_prod_bwd = KCUDA_FN(eltwise_prod_bwd);
  b->eltwise_max_bwd = KCUDA_FN(eltwise_max_bwd);
  b->relu_scale_bwd = KCUDA_FN(relu_scale_bwd);
  b->relu_scale2_bwd = KCUDA_FN(relu_scale2_bwd);
  b->copy_blocks = KCUDA_FN(copy_blocks);
  b->tile_fwd = KCUDA_FN(tile_fwd);
  b->tile_bwd = KCUDA_FN(tile_bwd);
  b->crop_copy = KCUDA_FN(crop_copy);
  b->select_nonzero = KCUDA_FN(select_nonzero);
  b->gather_rows = KCUDA_FN(gather_rows);
  b->scatter_rows = KCUDA_FN(scatter_rows);
  b->gather_rows_at = KCUDA_FN(gather_rows_at);
  b->scatter_add_rows_at = KCUDA_FN(scatter_add_rows_at);
  b->embed_fwd = KCUDA_FN(embed_fwd);
  b->embed_bwd = KCUDA_FN(embed_bwd);
  b->argmax_fwd = KCUDA_FN(argmax_fwd);
  b->permute = KCUDA_FN(permute);
}
