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
  const float *a = l->bottom[0]->data, *b = l->bottom[1]->data;
  int64_t n = l->bottom[0]->count;
  double sum = 0; /* one thread, so the loss does not depend on the thread count */
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    sum += d * d;
  }
  l->top[0]->data[0] = (float)(sum / (double)items(l->bottom[0]) / 2.0);
  return KILN_OK;
}

static int euclidean_backward(kiln_layer *l) {
  const float *a = l->bottom[0]->data, *b = l->bottom[1]->data;
  int64_t n = l->bottom[0]->count;
  float scale = l->top[0]->diff[0] / (float)items(l->bottom[0]);
  for (int k = 0; k < 2; k++) {
    if (!l->propagate_down[k]) continue;
    float alpha = k == 0 ? scale : -scale;
    float *dx = l->bottom[k]->diff;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (n > 32768)
    for (int64_t i = 0; i < n; i++) dx[i] = alpha * (a[i] - b[i]);
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_euclidean_loss = {
    .type = "EuclideanLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .is_loss = true, .reshape = euclidean_reshape, .forward = euclidean_forward,
    .backward = euclidean_backward,
};
