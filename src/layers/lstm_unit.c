/* LSTMUnit (Caffe's LSTMUnitLayer): one step of an LSTM's non-linearity, the layer Caffe's
 * unrolled LSTM nets compose with InnerProduct and Eltwise. kiln's LSTM layer runs the same
 * arithmetic inside (recurrent.c); this one serves nets that spell the steps out.
 *
 * Bottoms: c_prev (1 x N x D), X (1 x N x 4D: the pre-activations of the gates in Caffe's order
 * input, forget, output, candidate) and cont (1 x N: 0 where a sequence starts). Tops: C and H
 * (1 x N x D):
 *   i = sigmoid(X_i), f = cont sigmoid(X_f) (0 when cont is 0), o = sigmoid(X_o), g = tanh(X_g)
 *   C = f c_prev + i g,  H = o tanh(C).
 * Backward as Caffe's: with dC' = dC + dH o (1 - tanh(C)^2), dc_prev = dC' f and the gates'
 * pre-activation gradients from di = dC' g, df = dC' c_prev, do = dH tanh(C), dg = dC' i, where f
 * is the forget gate with cont folded in and its derivative taken as f (1 - f) (exact for cont
 * in {0, 1}). No gradient reaches cont. */
#include <stdlib.h>

#include "layer_util.h"

typedef struct {
  int64_t N, D;
} unit_state;

static int unit_setup(kiln_layer *l) {
  unit_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  /* backward reads the gates' activations: kept apart, as a layer after this one may take a top
   * in place */
  if (!kiln_layer_add_buffer(l, "gates")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int unit_reshape(kiln_layer *l) {
  unit_state *s = l->priv;
  const kiln_blob *c = l->bottom[0], *x = l->bottom[1], *cont = l->bottom[2];
  char buf[96];
  if (c->naxes != 3 || c->shape[0] != 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "c_prev must be 1 x N x D, is %s",
                            kiln_blob_shape_string(c, buf, sizeof buf));
  s->N = c->shape[1];
  s->D = c->shape[2];
  if (x->naxes != 3 || x->shape[0] != 1 || x->shape[1] != s->N || x->shape[2] != 4 * s->D)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the gate input must be 1 x N x 4D = 1 x %lld x %lld, is %s",
                            (long long)s->N, (long long)(4 * s->D), kiln_blob_shape_string(x, buf, sizeof buf));
  if (cont->naxes != 2 || cont->shape[0] != 1 || cont->shape[1] != s->N)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "cont must be 1 x N = 1 x %lld, is %s",
                            (long long)s->N, kiln_blob_shape_string(cont, buf, sizeof buf));
  l->flops = 12.0 * (double)(s->N * s->D);
  KILN_TRY(kiln_blob_reshape_like(l->buffer[0], x));
  KILN_TRY(kiln_blob_reshape_like(l->top[0], c));
  return kiln_blob_reshape_like(l->top[1], c);
}

/* The gates are computed in a copy of X, which backward reads. */
static int unit_forward(kiln_layer *l) {
  const unit_state *s = l->priv;
  const int64_t N = s->N, D = s->D;
  float *gates = l->buffer[0]->data;
  KILN_TRY(KILN_OP(l, copy, gates, l->bottom[1]->data, N * 4 * D));
  return KILN_OP(l, lstm_cell_fwd, l->top[0]->data, l->top[1]->data, D, gates,
                 l->bottom[0]->data, l->bottom[2]->data, N, D);
}

static int unit_backward(kiln_layer *l) {
  if (l->propagate_down[2])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "cannot backpropagate to the sequence indicators (cont)");
  const unit_state *s = l->priv;
  return KILN_OP(l, lstm_cell_bwd, l->propagate_down[0] ? l->bottom[0]->diff : NULL,
                 l->propagate_down[1] ? l->bottom[1]->diff : NULL, l->buffer[0]->data,
                 l->top[0]->data, l->bottom[0]->data, l->top[0]->diff, l->top[1]->diff, s->D,
                 NULL, s->N, s->D);
}

static void unit_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_lstm_unit = {
    .type = "LSTMUnit", .min_bottoms = 3, .max_bottoms = 3, .min_tops = 2, .max_tops = 2,
    .setup = unit_setup, .reshape = unit_reshape, .forward = unit_forward,
    .backward = unit_backward, .destroy = unit_destroy, .no_gradient_bottoms = 1u << 2,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_lstm_cell_fwd, KILN_OP_lstm_cell_bwd),
};
