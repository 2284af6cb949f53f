/* EuclideanLoss: L = sum((a - b)^2) / (2 N) over two inputs of the same shape per item (N is the
 * first axis), Caffe's EuclideanLossLayer. Gradients go to both inputs: +(a - b) / N to a and
 * -(a - b) / N to b, times the loss weight the net seeds into the top's diff. */
#include "layer_util.h"

static int64_t items(const kiln_blob *b) { return b->naxes > 0 ? b->shape[0] : 1; }

static int euclidean_reshape(kiln_layer *l) {
  const kiln_blob *a = l->bottom[0], *b = l->bottom[1];
  if (items(a) != items(b) || kiln_count(a, 1, a->naxes) != kiln_count(b, 1, b->naxes)) {
    char sa[128], sb[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "inputs %s (count %lld) and %s (count %lld) do not match: they need "
                            "the same first axis and the same count per item",
                            kiln_blob_shape_string(a, sa, sizeof sa), (long long)a->count,
                            kiln_blob_shape_string(b, sb, sizeof sb), (long long)b->count);
  }
  l->flops = 3.0 * (double)a->count;
  return kiln_blob_reshape(l->top[0], 0, NULL);
}

static int euclidean_forward(kiln_layer *l) {
  return KILN_OP(l, euclidean_loss_fwd, l->top[0]->data, l->bottom[0]->data, l->bottom[1]->data,
                 l->bottom[0]->count, items(l->bottom[0]));
}

static int euclidean_backward(kiln_layer *l) {
  if (!l->propagate_down[0] && !l->propagate_down[1]) return KILN_OK;
  return KILN_OP(l, euclidean_loss_bwd, l->propagate_down[0] ? l->bottom[0]->diff : NULL,
                 l->propagate_down[1] ? l->bottom[1]->diff : NULL, l->bottom[0]->data,
                 l->bottom[1]->data, l->top[0]->diff, l->bottom[0]->count, items(l->bottom[0]));
}

const kiln_layer_ops kiln_layer_euclidean_loss = {
    .type = "EuclideanLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .is_loss = true, .reshape = euclidean_reshape, .forward = euclidean_forward,
    .backward = euclidean_backward,
    .kernels = KILN_KERNELS(KILN_OP_euclidean_loss_fwd, KILN_OP_euclidean_loss_bwd),
};
