/* SequencePool (kiln's own layer): one vector per sequence from a time-major T x N x D blob,
 * over each sequence's valid steps only: the last one, their mean or their maximum. The valid
 * steps come from an optional second bottom, a T x N mask (1 on a step of the sequence, 0 on
 * padding), which TextData's SEQUENCES mode produces; without it every step is valid. A
 * sequence's valid steps need not be a prefix, but a sequence without any is an error (its
 * vector would be undefined). The mask is a step function: its gradient is zero. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static bool valid(const kiln_layer *l, int t, int n, int N) {
  return l->nbottom < 2 || l->bottom[1]->data[(int64_t)t * N + n] != 0;
}

static int seqpool_forward(kiln_layer *l) {
  seqpool_state *s = l->priv;
  const int T = s->T, N = s->N, D = s->D;
  const float *x = l->bottom[0]->data;
  float *y = l->top[0]->data;
  float *arg = l->nbuffer > 0 ? l->buffer[0]->data : NULL;
  for (int n = 0; n < N; n++) {
    float *yn = y + (int64_t)n * D;
    int count = 0, last = -1;
    for (int t = 0; t < T; t++)
      if (valid(l, t, n, N)) {
        count++;
        last = t;
      }
    if (count == 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "sequence %d of the batch has no valid step in the mask", n);
    switch (s->pool) {
    case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__LAST:
      memcpy(yn, x + ((int64_t)last * N + n) * D, sizeof(float) * (size_t)D);
      break;
    case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__MEAN:
      for (int d = 0; d < D; d++) {
        double sum = 0;
        for (int t = 0; t < T; t++)
          if (valid(l, t, n, N)) sum += x[((int64_t)t * N + n) * D + d];
        yn[d] = (float)(sum / count);
      }
      break;
    default: /* MAX */
      for (int d = 0; d < D; d++) {
        float best = -INFINITY;
        int at = last;
        for (int t = 0; t < T; t++) {
          float v = x[((int64_t)t * N + n) * D + d];
          if (valid(l, t, n, N) && v > best) {
            best = v;
            at = t;
          }
        }
        yn[d] = best;
        arg[(int64_t)n * D + d] = (float)at;
      }
    }
  }
  return KILN_OK;
}

static int seqpool_backward(kiln_layer *l) {
  if (l->nbottom > 1 && l->propagate_down[1])
    memset(l->bottom[1]->diff, 0, sizeof(float) * (size_t)l->bottom[1]->count);
  if (!l->propagate_down[0]) return KILN_OK;
  seqpool_state *s = l->priv;
  const int T = s->T, N = s->N, D = s->D;
  const float *dy = l->top[0]->diff;
  float *dx = l->bottom[0]->diff;
  const float *arg = l->nbuffer > 0 ? l->buffer[0]->data : NULL;
  memset(dx, 0, sizeof(float) * (size_t)l->bottom[0]->count);
  for (int n = 0; n < N; n++) {
    const float *dyn = dy + (int64_t)n * D;
    int count = 0, last = -1;
    for (int t = 0; t < T; t++)
      if (valid(l, t, n, N)) {
        count++;
        last = t;
      }
    if (count == 0) continue;
    switch (s->pool) {
    case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__LAST:
      memcpy(dx + ((int64_t)last * N + n) * D, dyn, sizeof(float) * (size_t)D);
      break;
    case CAFFE__SEQUENCE_POOL_PARAMETER__POOL__MEAN:
      for (int t = 0; t < T; t++)
        if (valid(l, t, n, N))
          for (int d = 0; d < D; d++) dx[((int64_t)t * N + n) * D + d] = dyn[d] / (float)count;
      break;
    default:
      for (int d = 0; d < D; d++) {
        int t = (int)arg[(int64_t)n * D + d];
        dx[((int64_t)t * N + n) * D + d] = dyn[d];
      }
    }
  }
  return KILN_OK;
}

static void seqpool_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_sequence_pool = {
    .type = "SequencePool", .min_bottoms = 1, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .setup = seqpool_setup, .reshape = seqpool_reshape, .forward = seqpool_forward,
    .backward = seqpool_backward, .destroy = seqpool_destroy,
};
