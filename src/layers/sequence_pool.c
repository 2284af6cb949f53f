/* SequencePool (kiln's own layer): one vector per sequence from a time-major T x N x D blob,
 * over each sequence's valid steps only: the last one, their mean or their maximum. The valid
 * steps come from an optional second bottom, a T x N mask (1 on a step of the sequence, 0 on
 * padding), which TextData's SEQUENCES mode produces; without it every step is valid. A
 * sequence's valid steps need not be a prefix, but a sequence without any is an error (its
 * vector would be undefined). The mask is a step function: its gradient is zero. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__SequencePoolParameter pool_defaults = CAFFE__SEQUENCE_POOL_PARAMETER__INIT;

typedef struct {
  int T, N, D;
  int pool;
} seqpool_state;

static int seqpool_setup(kiln_layer *l) {
  seqpool_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->pool = KILN_PARAM_OR(l->lp->sequence_pool_param, pool_defaults)->pool;
  /* MAX remembers which step won each element */
  if (s->pool == CAFFE__SEQUENCE_POOL_PARAMETER__POOL__MAX && !kiln_layer_add_buffer(l, "argmax"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int seqpool_reshape(kiln_layer *l) {
  seqpool_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes < 2)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "bottom '%s' has %d axes; it must be T x N x ...",
                            x->name, x->naxes);
  s->T = (int)x->shape[0];
  s->N = (int)x->shape[1];
  s->D = (int)kiln_count(x, 2, x->naxes);
  if (l->nbottom > 1) {
    const kiln_blob *m = l->bottom[1];
    if (m->naxes < 2 || m->shape[0] != s->T || m->shape[1] != s->N || m->count != (int64_t)s->T * s->N)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "mask '%s' must be T x N = %d x %d, like the first two axes of '%s'",
                              m->name, s->T, s->N, x->name);
  }
  int64_t shape[KILN_MAX_AXES];
  shape[0] = s->N;
  for (int a = 2; a < x->naxes; a++) shape[a - 1] = x->shape[a];
  KILN_TRY(kiln_blob_reshape(l->top[0], x->naxes - 1, shape));
  if (l->nbuffer > 0) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], l->top[0]));
  l->flops = (double)x->count;
  return KILN_OK;
}

/* The mask, or NULL when every step is valid. */
static const float *mask_of(const kiln_layer *l) {
  return l->nbottom > 1 ? l->bottom[1]->data : NULL;
}

static kiln_seq_pool pool_of(const seqpool_state *s) {
  switch (s->pool) {
  case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__LAST: return KILN_SEQ_POOL_LAST;
  case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__MEAN: return KILN_SEQ_POOL_MEAN;
  default: return KILN_SEQ_POOL_MAX;
  }
}

/* The op reads the mask to find each sequence's steps and reports one without any. */
static int seqpool_forward(kiln_layer *l) {
  seqpool_state *s = l->priv;
  int rc = KILN_OP(l, seq_pool_fwd, l->top[0]->data, l->nbuffer > 0 ? l->buffer[0]->data : NULL,
                   l->bottom[0]->data, mask_of(l), s->T, s->N, s->D, pool_of(s));
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

static int seqpool_backward(kiln_layer *l) {
  if (l->nbottom > 1 && l->propagate_down[1])
    KILN_TRY(KILN_OP(l, fill, l->bottom[1]->diff, 0.0f, l->bottom[1]->count));
  if (!l->propagate_down[0]) return KILN_OK;
  seqpool_state *s = l->priv;
  return KILN_OP(l, seq_pool_bwd, l->bottom[0]->diff, l->top[0]->diff,
                 l->nbuffer > 0 ? l->buffer[0]->data : NULL, mask_of(l), s->T, s->N, s->D,
                 pool_of(s));
}

static void seqpool_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_sequence_pool = {
    .type = "SequencePool", .min_bottoms = 1, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .setup = seqpool_setup, .reshape = seqpool_reshape, .forward = seqpool_forward,
    .backward = seqpool_backward, .destroy = seqpool_destroy,
    .kernels = KILN_KERNELS(KILN_OP_seq_pool_fwd, KILN_OP_seq_pool_bwd, KILN_OP_fill),
};
