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
  /* (the count decides the tops' shapes: it comes back to the host with the indices) */
  KILN_TRY(KILN_OP(l, select_nonzero, s->index, &s->nindex, sel->data, sel->shape[0]));
  if (l->ntop > 0 && l->top[0]->shape[0] != s->nindex) {
    KILN_TRY(filter_shape_tops(l, s->nindex));
    l->reshaped = true;
  }
  for (int t = 0; t < l->ntop; t++)
    KILN_TRY(KILN_OP(l, gather_rows, l->top[t]->data, l->bottom[t]->data, s->index, s->nindex,
                     item_size(l->bottom[t])));
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
    float *dx = l->bottom[t]->diff;
    KILN_TRY(KILN_OP(l, fill, dx, 0.0f, l->bottom[t]->count));
    KILN_TRY(KILN_OP(l, scatter_rows, dx, l->top[t]->diff, s->index, s->nindex,
                     item_size(l->bottom[t])));
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
    .kernels = KILN_KERNELS(KILN_OP_select_nonzero, KILN_OP_gather_rows, KILN_OP_fill,
                            KILN_OP_scatter_rows),
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
  int rc = KILN_OP(l, gather_rows_at, l->top[0]->data, x->data, idx->data, idx->count, items(x),
                   item_size(x));
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

static int reindex_backward(kiln_layer *l) {
  if (l->propagate_down[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "cannot backpropagate to the indices (second bottom); set "
                            "propagate_down: false for it");
  if (!l->propagate_down[0]) return KILN_OK;
  const kiln_blob *x = l->bottom[0], *idx = l->bottom[1];
  KILN_TRY(KILN_OP(l, fill, x->diff, 0.0f, x->count));
  int rc = KILN_OP(l, scatter_add_rows_at, x->diff, l->top[0]->diff, idx->data, idx->count,
                   items(x), item_size(x));
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

static bool reindex_allows_gradient(const kiln_layer *l, int b) {
  (void)l;
  return b == 0;
}

const kiln_layer_ops kiln_layer_batch_reindex = {
    .type = "BatchReindex", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .reshape = reindex_reshape, .forward = reindex_forward, .backward = reindex_backward,
    .allows_gradient = reindex_allows_gradient,
    .kernels = KILN_KERNELS(KILN_OP_gather_rows_at, KILN_OP_fill, KILN_OP_scatter_add_rows_at),
};
