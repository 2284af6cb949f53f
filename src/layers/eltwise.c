/* Eltwise (Caffe's): element-wise SUM (with one coefficient per bottom, default 1), PROD or MAX of
 * two or more bottoms of the same shape. MAX records which bottom won each element; the gradient
 * goes to that bottom only. May run in place on its first bottom. */
#include <stdlib.h>
#include <string.h>

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

static int eltwise_forward(kiln_layer *l) {
  eltwise_state *s = l->priv;
  int nb = l->nbottom;
  int64_t n = l->bottom[0]->count;
  float *y = l->top[0]->data;
  /* In place y is bottom 0: each element is read from every bottom before it is written. */
  switch (s->op) {
    case OP_SUM: {
      /* Threaded, vectorised passes, element-wise, so bottom 0 may be the top (in place): the
       * first two bottoms in one pass, then one per further bottom; the fused ReLU's select in
       * the last pass. The additions are those of one bottom after another. */
      const float c0 = s->coeff[0], c1 = s->coeff[1], *x0 = l->bottom[0]->data;
      const float *x1 = l->bottom[1]->data;
      const float slope = s->relu && nb == 2 ? s->slope : 1.0f; /* 1: no select */
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (parallel: n > 32768)
      for (int64_t k = 0; k < n; k++) {
        const float t = c0 * x0[k], z = t + c1 * x1[k];
        y[k] = z > 0 ? z : slope * z;
      }
      for (int b = 2; b < nb; b++) {
        const float cb = s->coeff[b], *xb = l->bottom[b]->data;
        const float sl = s->relu && b == nb - 1 ? s->slope : 1.0f;
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (parallel: n > 32768)
        for (int64_t k = 0; k < n; k++) {
          const float z = y[k] + cb * xb[k];
          y[k] = z > 0 ? z : sl * z;
        }
      }
      break;
    }
    case OP_PROD:
      if (s->in_place) memcpy(l->buffer[0]->data, l->bottom[0]->data, sizeof(float) * (size_t)n);
      for (int64_t k = 0; k < n; k++) {
        float v = l->bottom[0]->data[k];
        for (int b = 1; b < nb; b++) v *= l->bottom[b]->data[k];
        y[k] = v;
      }
      break;
    case OP_MAX: {
      /* Caffe's order: bottom 1 wins a tie with bottom 0; later bottoms must be strictly
       * greater. */
      float *arg = l->buffer[0]->data;
      const float *a = l->bottom[0]->data, *b1 = l->bottom[1]->data;
      for (int64_t k = 0; k < n; k++) {
        float v = b1[k];
        int w = 1;
        if (a[k] > v) {
          v = a[k];
          w = 0;
        }
        for (int b = 2; b < nb; b++)
          if (l->bottom[b]->data[k] > v) {
            v = l->bottom[b]->data[k];
            w = b;
          }
        y[k] = v;
        arg[k] = (float)w;
      }
      break;
    }
  }
  return KILN_OK;
}

/* SUM fused with ReLU: each bottom's gradient from the masked top gradient in one pass (the
 * mask read from the top, as the in-place ReLU reads it: its sign is the sum's for slope >= 0).
 * Element by element, so a bottom's diff may be the top's (in place). */
static void sum_relu_backward(kiln_layer *l, const eltwise_state *s) {
  const int64_t n = l->bottom[0]->count;
  const float *dy = l->top[0]->diff, *y = l->top[0]->data, slope = s->slope;
  const int nb = l->nbottom;
  float *dx0 = l->propagate_down[0] ? l->bottom[0]->diff : NULL;
  float *dx1 = l->propagate_down[1] ? l->bottom[1]->diff : NULL;
  const float c0 = s->coeff[0], c1 = s->coeff[1];
  if (nb == 2 && dx0 && dx1) { /* resnets' shortcut sums */
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (parallel: n > 32768)
    for (int64_t k = 0; k < n; k++) {
      const float d = y[k] > 0 ? dy[k] : slope * dy[k];
      dx1[k] = c1 * d;
      dx0[k] = c0 * d;
    }
    return;
  }
  /* Otherwise bottom by bottom, bottom 0 last: in place its diff is the top's. */
  for (int b = nb - 1; b >= 0; b--) {
    if (!l->propagate_down[b]) continue;
    float *dx = l->bottom[b]->diff;
    const float c = s->coeff[b];
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (parallel: n > 32768)
    for (int64_t k = 0; k < n; k++) dx[k] = c * (y[k] > 0 ? dy[k] : slope * dy[k]);
  }
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
  int nb = l->nbottom;
  int64_t n = l->bottom[0]->count;
  const float *dy = l->top[0]->diff, *y = l->top[0]->data;
  if (s->relu) {
    sum_relu_backward(l, s);
    return KILN_OK;
  }
  for (int b = nb - 1; b >= 0; b--) {
    if (!l->propagate_down[b]) continue;
    float *dx = l->bottom[b]->diff;
    switch (s->op) {
      case OP_SUM: {
        const float c = s->coeff[b];
        if (c == 1.0f && dx == dy) break; /* in place with coefficient 1: already the top's */
#pragma omp parallel for simd schedule(static) num_threads(l->nthreads) if (parallel: n > 32768)
        for (int64_t k = 0; k < n; k++) dx[k] = c * dy[k];
        break;
      }
      case OP_PROD:
        if (s->stable_prod_grad) {
          for (int64_t k = 0; k < n; k++) {
            float v = dy[k];
            for (int j = 0; j < nb; j++) {
              if (j == b) continue;
              v *= j == 0 && s->in_place ? l->buffer[0]->data[k] : l->bottom[j]->data[k];
            }
            dx[k] = v;
          }
        } else {
          const float *x = b == 0 && s->in_place ? l->buffer[0]->data : l->bottom[b]->data;
          for (int64_t k = 0; k < n; k++) dx[k] = y[k] / x[k] * dy[k];
        }
        break;
      case OP_MAX: {
        const float *arg = l->buffer[0]->data;
        for (int64_t k = 0; k < n; k++) dx[k] = (int)arg[k] == b ? dy[k] : 0.0f;
        break;
      }
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
};
