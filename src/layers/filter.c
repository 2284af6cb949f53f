/* Layers that pick items of the batch (the first axis): Filter (the items whose selector is not
 * zero, from every bottom but the selector, so the batch of its tops varies from pass to pass)
 * and BatchReindex (the items a list of indices names, in its order, repeats allowed). Both with
 * Caffe's semantics and checks; neither passes a gradient to its selector or indices, and a
 * backward pass that asks for one is refused, as in Caffe. */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

/* Items of `b` (its first axis) and the floats in one item. */
static int64_t items(const kiln_blob *b) { return b->naxes ? b->shape[0] : 1; }
static int64_t item_size(const kiln_blob *b) { return kiln_count(b, 1, b->naxes); }

/* ---- Filter -------------------------------------------------------------------------------- */
/* Bottoms x_0 .. x_{k-1} and the selector s (N, then axes of 1); top t holds the items n of x_t
 * with s[n] != 0, in order. Caffe shapes the tops for the whole batch at the first reshape and
 * for the selected items at every later one; here reshape gives the whole batch (so the net
 * plans memory for it) and forward sets the tops to the selected items, marking the layer
 * reshaped so the net reshapes the layers after it. Backward copies each kept item's gradient
 * back and writes zero for the others. */

typedef struct {
  int64_t *index; /* the selected items, from forward */
  int64_t nindex, cap;
} filter_state;

static int filter_setup(kiln_layer *l) {
  if (l->ntop != l->nbottom - 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "takes one top per bottom but the last (the selector): %d bottoms, "
                            "%d tops",
                            l->nbottom, l->ntop);
  filter_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  return KILN_OK;
}

/* The tops with `n` items, each of its bottom's item shape. */
static int filter_shape_tops(kiln_layer *l, int64_t n) {
  for (int t = 0; t < l->ntop; t++) {
    const kiln_blob *x = l->bottom[t];
    int64_t shape[KILN_MAX_AXES];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = n;
    KILN_TRY(kiln_blob_reshape(l->top[t], x->naxes, shape));
  }
  return KILN_OK;
}

static int filter_reshape(kiln_layer *l) {
  filter_state *s = l->priv;
  const kiln_blob *sel = l->bottom[l->nbottom - 1];
  if (sel->naxes < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the selector (last bottom) has no axes");
  for (int i = 1; i < sel->naxes; i++)
    if (sel->shape[i] != 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "the selector (last bottom) must be N x 1 x ...: axis %d is %lld",
                              i, (long long)sel->shape[i]);
  for (int t = 0; t < l->ntop; t++)
    if (l->bottom[t]->naxes < 1 || l->bottom[t]->shape[0] != sel->shape[0])
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "bottom %d ('%s') must have the selector's %lld items on its first "
                              "axis",
                              t, l->bottom[t]->name, (long long)sel->shape[0]);
  const int64_t n = sel->shape[0];
  if (n > s->cap) {
    int64_t *p = realloc(s->index, sizeof *p * (size_t)n);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->index = p;
    s->cap = n;
  }
  s->nindex = 0;
  l->flops = 0;
  return filter_shape_tops(l, n);
}

static int filter_forward(kiln_layer *l) {
  filter_state *s = l->priv;
  const kiln_blob *sel = l->bottom[l->nbottom - 1];
  s->nindex = 0;
  for (int64_t n = 0; n < sel->shape[0]; n++)
    if (sel->data[n] != 0) s->index[s->nindex++] = n;
  if (l->ntop > 0 && l->top[0]->shape[0] != s->nindex) {
    KILN_TRY(filter_shape_tops(l, s->nindex));
    l->reshaped = true;
  }
  for (int t = 0; t < l->ntop; t++) {
    const int64_t dim = item_size(l->bottom[t]);
    const float *x = l->bottom[t]->data;
    float *y = l->top[t]->data;
    for (int64_t k = 0; k < s->nindex; k++)
      memcpy(y + k * dim, x + s->index[k] * dim, sizeof(float) * (size_t)dim);
  }
  return KILN_OK;
}

static int filter_backward(kiln_layer *l) {
  if (l->propagate_down[l->nbottom - 1])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "cannot backpropagate to the selector (last bottom); set "
                            "propagate_down: false for it");
  const filter_state *s = l->priv;
  for (int t = 0; t < l->ntop; t++) {
    if (!l->propagate_down[t]) continue;
    const int64_t dim = item_size(l->bottom[t]);
    float *dx = l->bottom[t]->diff;
    const float *dy = l->top[t]->diff;
    memset(dx, 0, sizeof(float) * (size_t)l->bottom[t]->count);
    for (int64_t k = 0; k < s->nindex; k++)
      memcpy(dx + s->index[k] * dim, dy + k * dim, sizeof(float) * (size_t)dim);
  }
  return KILN_OK;
}

static bool filter_allows_gradient(const kiln_layer *l, int b) { return b < l->nbottom - 1; }

static void filter_destroy(kiln_layer *l) {
  filter_state *s = l->priv;
  if (s) free(s->index);
  free(s);
}

const kiln_layer_ops kiln_layer_filter = {
    .type = "Filter", .min_bottoms = 2, .max_bottoms = -1, .min_tops = 1, .max_tops = -1,
    .setup = filter_setup, .reshape = filter_reshape, .forward = filter_forward,
    .backward = filter_backward, .allows_gradient = filter_allows_gradient,
    .destroy = filter_destroy,
};

/* ---- BatchReindex -------------------------------------------------------------------------- */
/* top item k = x item idx[k], for the 1-axis list idx of K indices in [0, N); the gradient adds
 * each top item's into the item it came from (repeats add up), zero for items not named. */

static int reindex_reshape(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0], *idx = l->bottom[1];
  if (idx->naxes != 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the indices (second bottom) must have 1 axis, not %d",
                            idx->naxes);
  if (x->naxes < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the input (first bottom) has no axes");
  int64_t shape[KILN_MAX_AXES];
  memcpy(shape, x->shape, sizeof shape);
  shape[0] = idx->shape[0];
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], x->naxes, shape);
}

static int reindex_forward(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0], *idx = l->bottom[1];
  const int64_t N = items(x), dim = item_size(x);
  for (int64_t k = 0; k < idx->count; k++) {
    const float v = idx->data[k];
    if (!(v >= 0))
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "index %g at position %lld is negative", v,
                              (long long)k);
    if (!(v < (float)N) || (int64_t)v >= N)
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                              "index %g at position %lld is past the batch of %lld", v,
                              (long long)k, (long long)N);
  }
  for (int64_t k = 0; k < idx->count; k++)
    memcpy(l->top[0]->data + k * dim, x->data + (int64_t)idx->data[k] * dim,
           sizeof(float) * (size_t)dim);
  return KILN_OK;
}

static int reindex_backward(kiln_layer *l) {
  if (l->propagate_down[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "cannot backpropagate to the indices (second bottom); set "
                            "propagate_down: false for it");
  if (!l->propagate_down[0]) return KILN_OK;
  const kiln_blob *x = l->bottom[0], *idx = l->bottom[1];
  const int64_t dim = item_size(x);
  float *dx = x->diff;
  memset(dx, 0, sizeof(float) * (size_t)x->count);
  for (int64_t k = 0; k < idx->count; k++) {
    float *d = dx + (int64_t)idx->data[k] * dim;
    const float *g = l->top[0]->diff + k * dim;
    for (int64_t i = 0; i < dim; i++) d[i] += g[i];
  }
  return KILN_OK;
}

static bool reindex_allows_gradient(const kiln_layer *l, int b) {
  (void)l;
  return b == 0;
}

const kiln_layer_ops kiln_layer_batch_reindex = {
    .type = "BatchReindex", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .reshape = reindex_reshape, .forward = reindex_forward, .backward = reindex_backward,
    .allows_gradient = reindex_allows_gradient,
};
