/* InnerProduct (fully connected): top (M, N) = bottom (M, K) x W^T + b, where the bottom is
 * flattened from `axis`; W is (N, K), or (K, N) with transpose. A dense bottom through the gemm
 * op; a sparse bottom (M x K rows in CSR, kiln_blob.csr) through the ops that loop over its
 * entries, so nothing of size M x K is formed and it takes no gradient. */
#include <stdlib.h>

#include "layer_util.h"

typedef struct {
  int axis;
  int64_t M, K, N;
  bool bias, transpose;
  bool sparse; /* bottom 0 is a sparse blob (kiln_blob.csr) */
} ip_state;

static const Caffe__InnerProductParameter ip_defaults = CAFFE__INNER_PRODUCT_PARAMETER__INIT;

static int ip_setup(kiln_layer *l) {
  const Caffe__InnerProductParameter *p = KILN_PARAM_OR(l->lp->inner_product_param, ip_defaults);
  if (!p->has_num_output || p->num_output == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "inner_product_param.num_output must be set and > 0");
  ip_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  KILN_TRY(kiln_blob_canonical_axis(l->bottom[0], p->axis, &s->axis));
  s->sparse = l->bottom[0]->csr != NULL;
  if (s->sparse && (s->axis != 1 || l->bottom[0]->naxes != 2))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "a sparse bottom ('%s') is N x features: axis must be 1, not %d",
                            l->bottom[0]->name, p->axis);
  s->N = p->num_output;
  s->K = kiln_count(l->bottom[0], s->axis, l->bottom[0]->naxes);
  s->bias = p->bias_term;
  s->transpose = p->transpose;
  int64_t wshape[2] = {s->transpose ? s->K : s->N, s->transpose ? s->N : s->K};
  if (!kiln_layer_add_param(l, 2, wshape, p->weight_filler, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (s->bias) {
    int64_t bshape[1] = {s->N};
    if (!kiln_layer_add_param(l, 1, bshape, p->bias_filler, 0))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  return KILN_OK;
}

static int ip_reshape(kiln_layer *l) {
  ip_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  int64_t K = kiln_count(x, s->axis, x->naxes);
  if (K != s->K)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "input has %lld features per sample, the weights expect %lld",
                            (long long)K, (long long)s->K);
  s->M = kiln_count(x, 0, s->axis);
  int64_t shape[KILN_MAX_AXES];
  for (int i = 0; i < s->axis; i++) shape[i] = x->shape[i];
  shape[s->axis] = s->N;
  /* a sparse bottom: a multiply-add per entry and output; the fullest batch's until a forward
   * pass counts its own */
  l->flops = 2.0 * s->N * (s->sparse ? (double)x->csr->nnz_cap : (double)s->M * s->K);
  return kiln_blob_reshape(l->top[0], s->axis + 1, shape);
}

/* The matrix a sparse bottom holds, checked against the layer's shape. */
static int rows_of(kiln_layer *l, const kiln_csr **out) {
  const ip_state *s = l->priv;
  const kiln_csr *x = l->bottom[0]->csr;
  if (x->rows != s->M || x->cols != s->K)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "sparse bottom '%s' holds %lld x %lld, the layer expects %lld x %lld",
                            l->bottom[0]->name, (long long)x->rows, (long long)x->cols,
                            (long long)s->M, (long long)s->K);
  *out = x;
  return KILN_OK;
}

static int sparse_forward(kiln_layer *l) {
  const ip_state *s = l->priv;
  const kiln_csr *x;
  KILN_TRY(rows_of(l, &x));
  l->flops = 2.0 * (double)s->N * (double)x->nnz;
  return KILN_OP(l, csr_matmul, l->top[0]->data, x, l->param[0]->data,
                 s->bias ? l->param[1]->data : NULL, s->M, s->N, s->K, s->transpose);
}

static int sparse_backward(kiln_layer *l) {
  const ip_state *s = l->priv;
  if (l->propagate_down[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "its bottom '%s' is sparse and takes no gradient; set "
                            "propagate_down: false for it",
                            l->bottom[0]->name);
  const kiln_csr *x;
  KILN_TRY(rows_of(l, &x));
  KILN_TRY(KILN_OP(l, csr_weight_grad, l->param[0]->diff, x, l->top[0]->diff, s->M, s->N, s->K,
                   s->transpose));
  if (s->bias) KILN_TRY(KILN_OP(l, sum_rows_into, l->param[1]->diff, l->top[0]->diff, s->M, s->N));
  return KILN_OK;
}

static int ip_forward(kiln_layer *l) {
  ip_state *s = l->priv;
  if (s->sparse) return sparse_forward(l);
  const float *x = l->bottom[0]->data, *w = l->param[0]->data;
  float *y = l->top[0]->data;
  KILN_TRY(KILN_OP(l, gemm, y, s->N, x, s->K, w, s->transpose ? s->N : s->K, false, !s->transpose,
                   s->M, s->N, s->K, 1.0f, 0.0f));
  if (s->bias) KILN_TRY(KILN_OP(l, add_bias_rows, y, l->param[1]->data, s->M, s->N));
  return KILN_OK;
}

static int ip_backward(kiln_layer *l) {
  ip_state *s = l->priv;
  if (s->sparse) return sparse_backward(l);
  const float *x = l->bottom[0]->data, *dy = l->top[0]->diff, *w = l->param[0]->data;
  float *dw = l->param[0]->diff;
  const int64_t M = s->M, N = s->N, K = s->K;
  /* dW (N, K) += dy^T (N, M) x (M, K); transposed weights: dW (K, N) += x^T dy. */
  if (s->transpose)
    KILN_TRY(KILN_OP(l, gemm, dw, N, x, K, dy, N, true, false, K, N, M, 1.0f, 1.0f));
  else
    KILN_TRY(KILN_OP(l, gemm, dw, K, dy, N, x, K, true, false, N, K, M, 1.0f, 1.0f));
  if (s->bias) KILN_TRY(KILN_OP(l, sum_rows_into, l->param[1]->diff, dy, M, N));
  if (l->propagate_down[0])
    KILN_TRY(KILN_OP(l, gemm, l->bottom[0]->diff, K, dy, N, w, s->transpose ? N : K, false,
                     s->transpose, M, K, N, 1.0f, 0.0f));
  return KILN_OK;
}

static void ip_destroy(kiln_layer *l) { free(l->priv); }

/* A sparse bottom takes no gradient (its values are data, and it has no dense diff). */
static bool ip_allows_gradient(const kiln_layer *l, int b) { return !l->bottom[b]->csr; }

const kiln_layer_ops kiln_layer_inner_product = {
    .type = "InnerProduct", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .setup = ip_setup, .reshape = ip_reshape, .forward = ip_forward, .backward = ip_backward,
    .destroy = ip_destroy, .allows_gradient = ip_allows_gradient, .sparse_bottom = true,
    .backward_reads = kiln_reads_bottom0, /* the weight gradient's */
    .kernels = KILN_KERNELS(KILN_OP_gemm, KILN_OP_add_bias_rows, KILN_OP_sum_rows_into,
                            KILN_OP_csr_matmul, KILN_OP_csr_weight_grad),
};
