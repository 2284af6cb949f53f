/* InnerProduct on a sparse bottom (kiln_blob.csr): M rows of K features in CSR, of which each
 * row holds a few. Forward and the weight gradient loop over the entries, so their cost and
 * memory follow the entries, not K; nothing of size M x K is ever formed. Every sum runs in a
 * fixed order (entries in row order, rows in order) on each output, whatever the thread count.
 * Threads are used only for a batch of PARALLEL_MIN multiply-adds or more: below that, waking
 * them costs more than the work (logistic regression's 64 rows of 300 entries into 2 outputs
 * took 0.27 ms on one thread and 15 ms on two on a loaded machine). */
#include <omp.h>

#include "inner_product.h"

#define PARALLEL_MIN (1 << 18)

/* The matrix the bottom holds, checked against the layer's shape. */
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

int kiln_ip_sparse_forward(kiln_layer *l) {
  const ip_state *s = l->priv;
  const kiln_csr *x;
  KILN_TRY(rows_of(l, &x));
  const float *w = l->param[0]->data, *b = s->bias ? l->param[1]->data : NULL;
  float *y = l->top[0]->data;
  const int64_t M = s->M, N = s->N, K = s->K;
  const bool tr = s->transpose;
  l->flops = 2.0 * (double)N * (double)x->nnz;
  const bool par = x->nnz * N >= PARALLEL_MIN;
#pragma omp parallel for schedule(static) num_threads(l->nthreads > 0 ? l->nthreads : 1) if (par)
  for (int64_t m = 0; m < M; m++) {
    float *ym = y + m * N;
    for (int64_t n = 0; n < N; n++) ym[n] = 0;
    for (int64_t k = x->row_ptr[m]; k < x->row_ptr[m + 1]; k++) {
      const float v = x->val[k];
      const int64_t c = x->col[k];
      if (tr) { /* W is K x N: row c of W, scaled */
        const float *wc = w + c * N;
        for (int64_t n = 0; n < N; n++) ym[n] += v * wc[n];
      } else { /* W is N x K: column c of W */
        for (int64_t n = 0; n < N; n++) ym[n] += v * w[n * K + c];
      }
    }
    if (b)
      for (int64_t n = 0; n < N; n++) ym[n] += b[n];
  }
  return KILN_OK;
}

int kiln_ip_sparse_backward(kiln_layer *l) {
  const ip_state *s = l->priv;
  if (l->propagate_down[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "its bottom '%s' is sparse and takes no gradient; set "
                            "propagate_down: false for it",
                            l->bottom[0]->name);
  const kiln_csr *x;
  KILN_TRY(rows_of(l, &x));
  const float *dy = l->top[0]->diff;
  float *dw = l->param[0]->diff;
  const int64_t M = s->M, N = s->N, K = s->K;
  const bool par = x->nnz * N >= PARALLEL_MIN;
  if (s->transpose) {
    /* dW (K x N): row c += v dy[m]; each thread takes a range of outputs n, so every element
     * sums over the rows in order */
#pragma omp parallel num_threads(l->nthreads > 0 ? l->nthreads : 1) if (par)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = N * t / nt, hi = N * (t + 1) / nt;
      for (int64_t m = 0; m < M; m++)
        for (int64_t k = x->row_ptr[m]; k < x->row_ptr[m + 1]; k++) {
          float *dwc = dw + (int64_t)x->col[k] * N;
          const float v = x->val[k];
          for (int64_t n = lo; n < hi; n++) dwc[n] += v * dy[m * N + n];
        }
    }
  } else {
    /* dW (N x K): row n += dy[m][n] x_m, over the entries of x_m */
#pragma omp parallel for schedule(static) num_threads(l->nthreads > 0 ? l->nthreads : 1) if (par)
    for (int64_t n = 0; n < N; n++) {
      float *dwn = dw + n * K;
      for (int64_t m = 0; m < M; m++) {
        const float g = dy[m * N + n];
        for (int64_t k = x->row_ptr[m]; k < x->row_ptr[m + 1]; k++) dwn[x->col[k]] += g * x->val[k];
      }
    }
  }
  if (s->bias) {
    float *db = l->param[1]->diff;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) db[n] += dy[m * N + n];
  }
  return KILN_OK;
}
