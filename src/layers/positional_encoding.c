/* PositionalEncoding: y[t, n, :] = x[t, n, :] + pe[t, :] on a time-major T x N x D input, the
 * same vector for step t of every sequence. Positions count from 0 at the first step, which is
 * where TextData's SEQUENCES mode starts every sequence (its padding is at the end).
 *   SINUSOIDAL (default): Vaswani et al.'s fixed table, pe[t, 2i] = sin(t / 10000^(2i/D)),
 *     pe[t, 2i + 1] = cos(t / 10000^(2i/D)) (an odd D ends on a sine); no parameters. The rows
 *     are worked out in double once, the first time a T needs them, into a buffer.
 *   LEARNED: a parameter blob [max_len, D] (default filler gaussian, std 0.02) whose row t is
 *     added at step t (BERT's and GPT-2's learned position embeddings).
 * An input of more than max_len steps is refused. The gradient passes to x unchanged, so the
 * layer may run in place. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__PositionalEncodingParameter pe_defaults =
    CAFFE__POSITIONAL_ENCODING_PARAMETER__INIT;
static const Caffe__FillerParameter filler_init = CAFFE__FILLER_PARAMETER__INIT;

typedef struct {
  bool learned;
  int64_t max_len, T, N, D;
  int64_t rows_ready; /* SINUSOIDAL: rows of the table already worked out */
  Caffe__FillerParameter filler; /* LEARNED without a filler: gaussian, std 0.02 */
} pe_state;

static int pe_setup(kiln_layer *l) {
  const Caffe__PositionalEncodingParameter *p =
      KILN_PARAM_OR(l->lp->positional_encoding_param, pe_defaults);
  pe_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 3)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the input must be T x N x D (time-major), got %d axes", x->naxes);
  if (p->max_len < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "positional_encoding_param.max_len must be > 0");
  s->learned = p->mode == CAFFE__POSITIONAL_ENCODING_PARAMETER__MODE__LEARNED;
  s->max_len = p->max_len;
  s->D = x->shape[2];
  if (s->learned) {
    s->filler = filler_init;
    s->filler.type = "gaussian";
    s->filler.std = 0.02f;
    const int64_t shape[2] = {s->max_len, s->D};
    if (!kiln_layer_add_param(l, 2, shape, p->filler ? p->filler : &s->filler, 0))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  } else if (!kiln_layer_add_buffer(l, "table")) {
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  return KILN_OK;
}

static int pe_reshape(kiln_layer *l) {
  pe_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes != 3 || x->shape[2] != s->D)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the input must be T x N x %lld (as at setup)",
                            (long long)s->D);
  if (x->shape[0] > s->max_len)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the input has %lld time steps, more than "
                            "positional_encoding_param.max_len %lld",
                            (long long)x->shape[0], (long long)s->max_len);
  s->T = x->shape[0];
  s->N = x->shape[1];
  if (!s->learned) {
    /* A larger table may be new memory: work its rows out again. A smaller one keeps its
     * leading rows. */
    const kiln_blob *tb = l->buffer[0];
    if (tb->naxes != 2 || tb->shape[0] < s->T) s->rows_ready = 0;
    const int64_t shape[2] = {s->T, s->D};
    KILN_TRY(kiln_blob_reshape(l->buffer[0], 2, shape));
  }
  l->flops = (double)x->count;
  return kiln_blob_reshape_like(l->top[0], x);
}

/* The table's rows up to T, those not worked out yet. */
static int fill_table(kiln_layer *l, pe_state *s) {
  if (s->T > s->rows_ready) {
    KILN_TRY(KILN_OP(l, sinusoid_table, l->buffer[0]->data, s->rows_ready, s->T, s->D));
    s->rows_ready = s->T;
  }
  return KILN_OK;
}

static int pe_forward(kiln_layer *l) {
  pe_state *s = l->priv;
  if (!s->learned) KILN_TRY(fill_table(l, s));
  const float *pe = s->learned ? l->param[0]->data : l->buffer[0]->data;
  return KILN_OP(l, step_add, l->top[0]->data, l->bottom[0]->data, pe, s->T, s->N, s->D);
}

/* dx = dy; LEARNED: dpe[t, :] += sum over n of dy[t, n, :], the sequences added in order. */
static int pe_backward(kiln_layer *l) {
  pe_state *s = l->priv;
  const float *dy = l->top[0]->diff;
  const int64_t T = s->T, N = s->N, D = s->D;
  if (s->learned) KILN_TRY(KILN_OP(l, step_sum_into, l->param[0]->diff, dy, T, N, D));
  if (l->propagate_down[0] && l->bottom[0]->diff != dy)
    KILN_TRY(KILN_OP(l, copy, l->bottom[0]->diff, dy, T * N * D));
  return KILN_OK;
}

static void pe_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_positional_encoding = {
    .type = "PositionalEncoding", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1,
    .max_tops = 1, .in_place = true,
    .setup = pe_setup, .reshape = pe_reshape, .forward = pe_forward, .backward = pe_backward,
    .destroy = pe_destroy,
    .kernels = KILN_KERNELS(KILN_OP_sinusoid_table, KILN_OP_step_add, KILN_OP_step_sum_into,
                            KILN_OP_copy),
};
