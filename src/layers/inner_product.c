/* InnerProduct (fully connected): top (M, N) = bottom (M, K) x W^T + b, where the bottom is
 * flattened from `axis`; W is (N, K), or (K, N) with transpose. GEMM through kiln_sgemm; a
 * sparse bottom (M x K rows in CSR, kiln_blob.csr) through loops over its entries
 * (inner_product_sparse.c). */
#include <stdlib.h>

#include "inner_product.h"
#include "kiln/ops.h"

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

static int ip_forward(kiln_layer *l) {
  ip_state *s = l->priv;
  if (s->sparse) return kiln_ip_sparse_forward(l);
  const float *x = l->bottom[0]->data, *w = l->param[0]->data;
  float *y = l->top[0]->data;
  kiln_sgemm(l->config, false, !s->transpose, s->M, s->N, s->K, 1.0f, x, s->K, w,
             s->transpose ? s->N : s->K, 0.0f, y, s->N);
  if (s->bias) {
    const float *b = l->param[1]->data;
    for (int64_t m = 0; m < s->M; m++)
      for (int64_t n = 0; n < s->N; n++) y[m * s->N + n] += b[n];
  }
  return KILN_OK;
}

static int ip_backward(kiln_layer *l) {
  ip_state *s = l->priv;
  if (s->sparse) return kiln_ip_sparse_backward(l);
  const float *x = l->bottom[0]->data, *dy = l->top[0]->diff, *w = l->param[0]->data;
  float *dw = l->param[0]->diff;
  int M = (int)s->M, N = (int)s->N, K = (int)s->K;
  /* dW (N, K) += dy^T (N, M) x (M, K); transposed weights: dW (K, N) += x^T dy. */
  if (s->transpose)
    kiln_sgemm(l->config, true, false, K, N, M, 1.0f, x, K, dy, N, 1.0f, dw, N);
  else
    kiln_sgemm(l->config, true, false, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
  if (s->bias) {
    float *db = l->param[1]->diff;
    for (int64_t m = 0; m < s->M; m++)
      for (int64_t n = 0; n < s->N; n++) db[n] += dy[m * s->N + n];
  }
  if (l->propagate_down[0]) {
    float *dx = l->bottom[0]->diff;
    kiln_sgemm(l->config, false, s->transpose, M, K, N, 1.0f, dy, N, w, s->transpose ? N : K, 0.0f,
               dx, K);
  }
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
};
