/* Eltwise (Caffe's): element-wise SUM (with one coefficient per bottom, default 1), PROD or MAX of
 * two or more bottoms of the same shape. MAX records which bottom won each element; the gradient
 * goes to that bottom only. May run in place on its first bottom. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__EltwiseParameter eltwise_defaults = CAFFE__ELTWISE_PARAMETER__INIT;

#define OP_PROD CAFFE__ELTWISE_PARAMETER__ELTWISE_OP__PROD
#define OP_SUM CAFFE__ELTWISE_PARAMETER__ELTWISE_OP__SUM
#define OP_MAX CAFFE__ELTWISE_PARAMETER__ELTWISE_OP__MAX

typedef struct {
  int op;
  bool stable_prod_grad;
  bool in_place; /* top is bottom 0 */
  float *coeff;  /* one per bottom */
  bool relu;     /* SUM fused with the in-place ReLU after it (eltwise_fuse) */
  float slope;   /* that ReLU's negative_slope */
} eltwise_state;

/* Buffer 0: MAX's winning bottom per element (as a float); PROD in place: bottom 0's input. */

static int eltwise_setup(kiln_layer *l) {
  const Caffe__EltwiseParameter *p = KILN_PARAM_OR(l->lp->eltwise_param, eltwise_defaults);
  eltwise_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->op = p->operation;
  s->stable_prod_grad = p->stable_prod_grad;
  s->in_place = l->top[0] == l->bottom[0];
  if (s->op != OP_PROD && s->op != OP_SUM && s->op != OP_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "unknown eltwise_param.operation %d", s->op);
  if (p->n_coeff != 0 && (int)p->n_coeff != l->nbottom)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "eltwise_param has %zu coeff values for %d bottoms (give one per "
                            "bottom, or none)",
                            p->n_coeff, l->nbottom);
  if (p->n_coeff && s->op == OP_PROD)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "coeff applies to SUM only, not PROD");
  if (p->n_coeff && s->op == OP_MAX) /* Caffe accepts and ignores them */
    kiln_log(KILN_LOG_WARN, "layer '%s' (Eltwise): coeff is ignored by MAX", l->name);
  s->coeff = malloc(sizeof(float) * (size_t)l->nbottom);
  if (!s->coeff) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < l->nbottom; i++) s->coeff[i] = p->n_coeff ? p->coeff[i] : 1.0f;
  if ((s->op == OP_MAX || (s->op == OP_PROD && s->in_place)) &&
      !kiln_layer_add_buffer(l, s->op == OP_MAX ? "argmax" : "bottom_copy"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int eltwise_reshape(kiln_layer *l) {
  const kiln_blob *x0 = l->bottom[0];
  for (int b = 1; b < l->nbottom; b++) {
    const kiln_blob *xb = l->bottom[b];
    bool same = xb->naxes == x0->naxes;
    for (int i = 0; same && i < x0->naxes; i++) same = xb->shape[i] == x0->shape[i];
    if (!same) {
      char s0[128], sb[128];
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "bottom %d '%s' has shape %s, bottom 0 '%s' has %s: all bottoms "
                              "must have the same shape",
                              b, xb->name, kiln_blob_shape_string(xb, sb, sizeof sb), x0->name,
                              kiln_blob_shape_string(x0, s0, sizeof s0));
    }
  }
  if (l->nbuffer) KILN_TRY(kiln_blob_reshape_like(l->buffer[0], x0));
  l->flops = (double)(l->nbottom - 1) * (double)x0->count;
  return kiln_blob_reshape_like(l->top[0], x0);
}

/* The bottoms' data, with bottom 0's copy in its place where PROD works in place (its input is
 * the top then). */
static void inputs(const kiln_layer *l, const eltwise_state *s, const float **xs) {
  for (int b = 0; b < l->nbottom; b++) xs[b] = l->bottom[b]->data;
  if (s->op == OP_PROD && s->in_place) xs[0] = l->buffer[0]->data;
}

static int eltwise_forward(kiln_layer *l) {
  eltwise_state *s = l->priv;
  const int nb = l->nbottom;
  const int64_t n = l->bottom[0]->count;
  float *y = l->top[0]->data;
  /* In place y is bottom 0: each element is read from every bottom before it is written. */
  switch (s->op) {
    case OP_SUM:
      /* The first two bottoms in one pass, then one per further bottom, the fused ReLU's select
       * in the last pass (slope 1: none): the additions are those of one bottom after another. */
      KILN_TRY(KILN_OP(l, eltwise_sum2, y, l->bottom[0]->data, s->coeff[0], l->bottom[1]->data,
                       s->coeff[1], n, s->relu && nb == 2 ? s->slope : 1.0f));
      for (int b = 2; b < nb; b++)
        KILN_TRY(KILN_OP(l, eltwise_sum_acc, y, l->bottom[b]->data, s->coeff[b], n,
                         s->relu && b == nb - 1 ? s->slope : 1.0f));
      return KILN_OK;
    case OP_PROD: {
      if (s->in_place) KILN_TRY(KILN_OP(l, copy, l->buffer[0]->data, l->bottom[0]->data, n));
      const float *xs[nb];
      inputs(l, s, xs);
      return KILN_OP(l, eltwise_prod, y, xs, nb, n);
    }
    default: {
      const float *xs[nb];
      inputs(l, s, xs);
      return KILN_OP(l, eltwise_max, y, l->buffer[0]->data, xs, nb, n);
    }
  }
}

/* SUM fused with ReLU: each bottom's gradient from the masked top gradient (the mask read from
 * the top, as the in-place ReLU reads it: its sign is the sum's for slope >= 0), element by
 * element, so a bottom's diff may be the top's (in place). */
static int sum_relu_backward(kiln_layer *l, const eltwise_state *s) {
  const int64_t n = l->bottom[0]->count;
  const float *dy = l->top[0]->diff, *y = l->top[0]->data;
  const int nb = l->nbottom;
  if (nb == 2 && l->propagate_down[0] && l->propagate_down[1]) /* resnets' shortcut sums */
    return KILN_OP(l, relu_scale2_bwd, l->bottom[0]->diff, s->coeff[0], l->bottom[1]->diff,
                   s->coeff[1], dy, y, n, s->slope);
  /* Otherwise bottom by bottom, bottom 0 last: in place its diff is the top's. */
  for (int b = nb - 1; b >= 0; b--)
    if (l->propagate_down[b])
      KILN_TRY(KILN_OP(l, relu_scale_bwd, l->bottom[b]->diff, s->coeff[b], dy, y, n, s->slope));
  return KILN_OK;
}

/* SUM reads nothing (fused with a ReLU, its top for the mask), MAX its winners (a buffer), PROD
 * every bottom, and its top unless stable_prod_grad. */
static unsigned eltwise_backward_reads(const kiln_layer *l) {
  const eltwise_state *s = l->priv;
  if (s->op == OP_SUM) return s->relu ? KILN_READS_TOP(0) : 0;
  if (s->op == OP_MAX) return 0;
  return 0xffffu | (s->stable_prod_grad ? 0 : KILN_READS_TOP(0));
}

/* Bottom 0 last: in place its diff is the top's. */
static int eltwise_backward(kiln_layer *l) {
  eltwise_state *s = l->priv;
  const int nb = l->nbottom;
  const int64_t n = l->bottom[0]->count;
  const float *dy = l->top[0]->diff, *y = l->top[0]->data;
  if (s->relu) return sum_relu_backward(l, s);
  const float *xs[nb];
  inputs(l, s, xs);
  for (int b = nb - 1; b >= 0; b--) {
    if (!l->propagate_down[b]) continue;
    float *dx = l->bottom[b]->diff;
    if (s->op == OP_SUM) {
      if (s->coeff[b] == 1.0f && dx == dy) continue; /* in place with coefficient 1: the top's */
      KILN_TRY(KILN_OP(l, scale, dx, dy, s->coeff[b], n));
    } else if (s->op == OP_PROD) {
      KILN_TRY(KILN_OP(l, eltwise_prod_bwd, dx, dy, y, xs, nb, b, n, s->stable_prod_grad));
    } else {
      KILN_TRY(KILN_OP(l, eltwise_max_bwd, dx, dy, l->buffer[0]->data, b, n));
    }
  }
  return KILN_OK;
}

static void eltwise_destroy(kiln_layer *l) {
  eltwise_state *s = l->priv;
  if (s) free(s->coeff);
  free(s);
}

/* Fusion: SUM takes the ReLU (negative_slope >= 0) working in place on its top, when no loss
 * reads the top in between. */
static int eltwise_fuse(kiln_layer *l, kiln_layer *const *next, int n) {
  eltwise_state *s = l->priv;
  kiln_absorb relu;
  if (s->op != OP_SUM || n < 1 || l->loss_weight[0] != 0 ||
      !kiln_layer_absorbable(next[0], KILN_ABSORB_RELU, l->top[0], &relu))
    return 0;
  s->relu = true;
  s->slope = relu.slope;
  return 1;
}

const kiln_layer_ops kiln_layer_eltwise = {
    .type = "Eltwise", .min_bottoms = 2, .max_bottoms = -1, .min_tops = 1, .max_tops = 1,
    .in_place = true,
    .setup = eltwise_setup, .reshape = eltwise_reshape, .forward = eltwise_forward,
    .backward = eltwise_backward, .destroy = eltwise_destroy, .layout_role = kiln_layout_any,
    .fuse = eltwise_fuse, .backward_reads = eltwise_backward_reads,
    .kernels = KILN_KERNELS(KILN_OP_eltwise_sum2, KILN_OP_eltwise_sum_acc, KILN_OP_copy,
                            KILN_OP_eltwise_prod, KILN_OP_eltwise_max, KILN_OP_relu_scale2_bwd,
                            KILN_OP_relu_scale_bwd, KILN_OP_scale, KILN_OP_eltwise_prod_bwd,
                            KILN_OP_eltwise_max_bwd),
};
