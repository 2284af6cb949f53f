/* Permute (the SSD fork's, Wei Liu's Caffe): reorders the bottom's axes. permute_param.order
 * names, for each axis of the top, the bottom's axis it takes (top.shape[i] = bottom.shape
 * [order[i]]); as in the fork the list may be partial: each given axis must be one of the
 * bottom's and appear once, and the axes not given follow in ascending order (no order at all:
 * the identity, a plain copy). SSD puts its predictions' channels last with order 0 2 3 1 (N x C
 * x H x W -> N x H x W x C) before Flatten. Backward puts the gradient back through the inverse
 * order. kiln blobs do not share storage, so the top holds a copy even for the identity (the fork
 * shares the bottom's), and the layer does not run in place. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__PermuteParameter permute_defaults = CAFFE__PERMUTE_PARAMETER__INIT;

typedef struct {
  int naxes;
  int order[KILN_MAX_AXES], inverse[KILN_MAX_AXES];
  bool identity;
} permute_state;

/* The full order for a bottom of naxes axes: the given axes, checked, then the others. */
static int permute_order(kiln_layer *l, int naxes, permute_state *s) {
  const Caffe__PermuteParameter *p = KILN_PARAM_OR(l->lp->permute_param, permute_defaults);
  if (p->n_order > (size_t)naxes)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "permute_param has %zu order values for a bottom of %d axes",
                            p->n_order, naxes);
  bool used[KILN_MAX_AXES] = {false};
  int n = 0;
  for (size_t i = 0; i < p->n_order; i++) {
    const uint32_t a = p->order[i];
    if (a >= (uint32_t)naxes)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "permute_param.order %u (index %zu) is not an axis of the %d-axis "
                              "bottom",
                              a, i, naxes);
    if (used[a])
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "permute_param.order %u appears twice (index %zu)", a, i);
    used[a] = true;
    s->order[n++] = (int)a;
  }
  for (int a = 0; a < naxes; a++)
    if (!used[a]) s->order[n++] = a;
  s->naxes = naxes;
  s->identity = true;
  for (int i = 0; i < naxes; i++) {
    s->inverse[s->order[i]] = i;
    s->identity &= s->order[i] == i;
  }
  return KILN_OK;
}

static int permute_setup(kiln_layer *l) {
  permute_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  if (l->top[0] == l->bottom[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot run in place: give the top its own name");
  return permute_order(l, l->bottom[0]->naxes, s);
}

static int permute_reshape(kiln_layer *l) {
  permute_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != s->naxes) KILN_TRY(permute_order(l, x->naxes, s));
  int64_t shape[KILN_MAX_AXES];
  for (int i = 0; i < s->naxes; i++) shape[i] = x->shape[s->order[i]];
  l->flops = 0;
  return kiln_blob_reshape(l->top[0], s->naxes, shape);
}

static int permute_forward(kiln_layer *l) {
  permute_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (s->identity) return KILN_OP(l, copy, l->top[0]->data, x->data, x->count);
  return KILN_OP(l, permute, l->top[0]->data, x->data, s->naxes, x->shape, s->order, x->count);
}

/* The top's gradient through the inverse order: the top's axis order[i] back to axis i. */
static int permute_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  permute_state *s = l->priv;
  const kiln_blob *y = l->top[0];
  if (s->identity) return KILN_OP(l, copy, l->bottom[0]->diff, y->diff, y->count);
  return KILN_OP(l, permute, l->bottom[0]->diff, y->diff, s->naxes, y->shape, s->inverse,
                 y->count);
}

static void permute_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_permute = {
    .type = "Permute", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = permute_setup, .reshape = permute_reshape, .forward = permute_forward,
    .backward = permute_backward, .destroy = permute_destroy,
    .backward_reads = kiln_reads_none,
    .kernels = KILN_KERNELS(KILN_OP_permute, KILN_OP_copy),
};
