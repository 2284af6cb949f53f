/* ContrastiveLoss (Caffe's, after Hadsell, Chopra and LeCun 2006): features a and b (N, C, and
 * trailing axes of 1) and a similarity y (N values, read as integers: non-zero for a similar
 * pair). With d^2 = |a_n - b_n|^2,
 *   similar pairs add d^2, dissimilar ones max(margin - d, 0)^2 (legacy_version:
 *   max(margin - d^2, 0)), and L = sum / (2 N).
 * Gradients (to a; b gets the negation), with g = dL / N:
 *   similar: g (a - b); dissimilar with the margin not met: -g (margin - d) / (d + 1e-4) (a - b)
 *   (legacy: -g (a - b)); otherwise 0.
 * The 1e-4 is Caffe's guard against d = 0. y takes no gradient: force_backward asks none (Caffe's
 * AllowForceBackward) and a backward pass that asks for one is refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__ContrastiveLossParameter contrastive_defaults =
    CAFFE__CONTRASTIVE_LOSS_PARAMETER__INIT;

static int64_t items(const kiln_blob *b) { return b->naxes > 0 ? b->shape[0] : 1; }

static int contrastive_setup(kiln_layer *l) {
  if (!kiln_layer_add_buffer(l, "dist_sq")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int contrastive_reshape(kiln_layer *l) {
  const kiln_blob *a = l->bottom[0], *b = l->bottom[1], *y = l->bottom[2];
  const int64_t N = items(a);
  char sa[128], sb[128];
  if (a->naxes < 2 || kiln_count(a, 2, a->naxes) != 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the first features %s must be N x C (x 1 x 1)",
                            kiln_blob_shape_string(a, sa, sizeof sa));
  if (items(b) != N || b->count != a->count || b->naxes < 2 || b->shape[1] != a->shape[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the second features %s do not match the first %s",
                            kiln_blob_shape_string(b, sb, sizeof sb),
                            kiln_blob_shape_string(a, sa, sizeof sa));
  if (items(y) != N || y->count != N)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the similarity %s must hold one value per pair (N = %lld, N x 1 x 1 "
                            "x 1)",
                            kiln_blob_shape_string(y, sa, sizeof sa), (long long)N);
  l->flops = 3.0 * (double)a->count;
  KILN_TRY(kiln_blob_reshape(l->buffer[0], 1, &N));
  return kiln_blob_reshape(l->top[0], 0, NULL);
}

static int contrastive_forward(kiln_layer *l) {
  const Caffe__ContrastiveLossParameter *p =
      KILN_PARAM_OR(l->lp->contrastive_loss_param, contrastive_defaults);
  const kiln_blob *a = l->bottom[0];
  const int64_t N = items(a), C = a->shape[1];
  const float *x0 = a->data, *x1 = l->bottom[1]->data, *y = l->bottom[2]->data;
  float *dist_sq = l->buffer[0]->data;
  double loss = 0;
  for (int64_t n = 0; n < N; n++) {
    double d2 = 0;
    for (int64_t c = 0; c < C; c++) {
      const float d = x0[n * C + c] - x1[n * C + c];
      d2 += (double)d * d;
    }
    dist_sq[n] = (float)d2;
    if ((int)y[n]) {
      loss += dist_sq[n];
    } else if (p->legacy_version) {
      loss += fmaxf(p->margin - dist_sq[n], 0);
    } else {
      const float m = fmaxf(p->margin - sqrtf(dist_sq[n]), 0);
      loss += (double)m * m;
    }
  }
  l->top[0]->data[0] = (float)(loss / (double)(N ? N : 1) / 2);
  return KILN_OK;
}

static int contrastive_backward(kiln_layer *l) {
  if (l->propagate_down[2])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "cannot backpropagate to the similarity labels (third bottom); set "
                            "propagate_down: false for it");
  const Caffe__ContrastiveLossParameter *p =
      KILN_PARAM_OR(l->lp->contrastive_loss_param, contrastive_defaults);
  const kiln_blob *a = l->bottom[0];
  const int64_t N = items(a), C = a->shape[1];
  const float *x0 = a->data, *x1 = l->bottom[1]->data, *y = l->bottom[2]->data;
  const float *dist_sq = l->buffer[0]->data;
  for (int i = 0; i < 2; i++) {
    if (!l->propagate_down[i]) continue;
    const float alpha = (i == 0 ? 1 : -1) * l->top[0]->diff[0] / (float)(N ? N : 1);
    float *dx = l->bottom[i]->diff;
    for (int64_t n = 0; n < N; n++) {
      float beta;
      if ((int)y[n]) {
        beta = alpha;
      } else if (p->legacy_version) {
        beta = p->margin - dist_sq[n] > 0 ? -alpha : 0;
      } else {
        const float dist = sqrtf(dist_sq[n]), mdist = p->margin - dist;
        beta = mdist > 0 ? -alpha * mdist / (dist + 1e-4f) : 0;
      }
      for (int64_t c = 0; c < C; c++) dx[n * C + c] = beta * (x0[n * C + c] - x1[n * C + c]);
    }
  }
  return KILN_OK;
}

static bool contrastive_allows_gradient(const kiln_layer *l, int b) {
  (void)l;
  return b != 2;
}

const kiln_layer_ops kiln_layer_contrastive_loss = {
    .type = "ContrastiveLoss", .min_bottoms = 3, .max_bottoms = 3, .min_tops = 1, .max_tops = 1,
    .is_loss = true,
    .setup = contrastive_setup, .reshape = contrastive_reshape, .forward = contrastive_forward,
    .backward = contrastive_backward, .allows_gradient = contrastive_allows_gradient,
};
