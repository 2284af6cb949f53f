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
  return KILN_OP(l, contrastive_loss_fwd, l->top[0]->data, l->buffer[0]->data, a->data,
                 l->bottom[1]->data, l->bottom[2]->data, items(a), a->shape[1], p->margin,
                 p->legacy_version);
}

static int contrastive_backward(kiln_layer *l) {
  if (l->propagate_down[2])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "cannot backpropagate to the similarity labels (third bottom); set "
                            "propagate_down: false for it");
  if (!l->propagate_down[0] && !l->propagate_down[1]) return KILN_OK;
  const Caffe__ContrastiveLossParameter *p =
      KILN_PARAM_OR(l->lp->contrastive_loss_param, contrastive_defaults);
  const kiln_blob *a = l->bottom[0];
  return KILN_OP(l, contrastive_loss_bwd, l->propagate_down[0] ? l->bottom[0]->diff : NULL,
                 l->propagate_down[1] ? l->bottom[1]->diff : NULL, a->data, l->bottom[1]->data,
                 l->bottom[2]->data, l->buffer[0]->data, l->top[0]->diff, items(a), a->shape[1],
                 p->margin, p->legacy_version);
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
    .kernels = KILN_KERNELS(KILN_OP_contrastive_loss_fwd, KILN_OP_contrastive_loss_bwd),
};
