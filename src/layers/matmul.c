/* MatMul (kiln's): the matrix product of two computed blobs, as ONNX's MatMul and NumPy's matmul
 * define it, with the operands optionally transposed (matmul_param): the last two axes of each
 * bottom are a matrix, A (M x K, or K x M with transpose_a) and B (K x N, or N x K with
 * transpose_b), and the top is op(A) op(B), M x N, for every index of the axes before them. Those
 * batch axes broadcast as NumPy's do: aligned from the right, an axis of 1 (or a missing one)
 * stands for every index of the other bottom's. This is what attention computes between its
 * queries, keys and weights when a model spells it out (PyTorch's nn.TransformerEncoderLayer
 * exported to ONNX: q k^T and softmax(.) v), which kiln's InnerProduct (a blob by a parameter)
 * cannot. Each product is one gemm op of the backend, in batch order; the gradient of a bottom
 * whose batch axes broadcast is the sum over the products that read each of its matrices, added
 * in that order, so the bits do not depend on the thread count. */
#include <stdlib.h>

#include "layer_util.h"

static const Caffe__MatMulParameter matmul_defaults = CAFFE__MAT_MUL_PARAMETER__INIT;

typedef struct {
  bool ta, tb;
  int64_t M, N, K, batch;
  int64_t *off_a, *off_b; /* each product's A and B matrix, in elements */
} matmul_state;

static int matmul_setup(kiln_layer *l) {
  matmul_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  const Caffe__MatMulParameter *p = KILN_PARAM_OR(l->lp->matmul_param, matmul_defaults);
  s->ta = p->transpose_a;
  s->tb = p->transpose_b;
  if (l->top[0] == l->bottom[0] || l->top[0] == l->bottom[1])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot run in place: give the top its own name");
  return KILN_OK;
}

static int matmul_reshape(kiln_layer *l) {
  matmul_state *s = l->priv;
  const kiln_blob *a = l->bottom[0], *b = l->bottom[1];
  if (a->naxes < 2 || b->naxes < 2)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "bottoms of %d and %d axes: each needs at least 2 (a matrix)",
                            a->naxes, b->naxes);
  const int na = a->naxes, nb = b->naxes;
  const int64_t am = a->shape[na - 2], ak = a->shape[na - 1];
  const int64_t bk = b->shape[nb - 2], bn = b->shape[nb - 1];
  const int64_t M = s->ta ? ak : am, Ka = s->ta ? am : ak;
  const int64_t Kb = s->tb ? bn : bk, N = s->tb ? bk : bn;
  if (Ka != Kb)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "op(A) is %lld x %lld and op(B) %lld x %lld: they do not multiply",
                            (long long)M, (long long)Ka, (long long)Kb, (long long)N);
  /* the batch axes, aligned from the right */
  const int nbat = (na > nb ? na : nb) - 2;
  int64_t shape[KILN_MAX_AXES], sa[KILN_MAX_AXES], sb[KILN_MAX_AXES];
  int64_t stride_a = am * ak, stride_b = bk * bn, batch = 1;
  for (int i = nbat - 1; i >= 0; i--) {
    const int ia = i - (nbat - (na - 2)), ib = i - (nbat - (nb - 2));
    const int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                              "batch axis %d: A has %lld and B %lld (they must be equal, or "
                              "one of them 1)",
                              i, (long long)da, (long long)db);
    shape[i] = da > db ? da : db;
    sa[i] = da == 1 ? 0 : stride_a;
    sb[i] = db == 1 ? 0 : stride_b;
    stride_a *= da;
    stride_b *= db;
    batch *= shape[i];
  }
  shape[nbat] = M;
  shape[nbat + 1] = N;
  if (batch != s->batch || !s->off_a) {
    int64_t *oa = realloc(s->off_a, sizeof *oa * (size_t)(batch ? batch : 1));
    if (oa) s->off_a = oa;
    int64_t *ob = realloc(s->off_b, sizeof *ob * (size_t)(batch ? batch : 1));
    if (ob) s->off_b = ob;
    if (!oa || !ob) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  /* each product's matrices: the batch index's digits times the bottoms' strides */
  for (int64_t p = 0; p < batch; p++) {
    int64_t r = p, oa = 0, ob = 0;
    for (int i = nbat - 1; i >= 0; i--) {
      const int64_t d = r % shape[i];
      r /= shape[i];
      oa += d * sa[i];
      ob += d * sb[i];
    }
    s->off_a[p] = oa;
    s->off_b[p] = ob;
  }
  s->M = M, s->N = N, s->K = Ka, s->batch = batch;
  l->flops = 2.0 * (double)batch * (double)M * (double)N * (double)Ka;
  return kiln_blob_reshape(l->top[0], nbat + 2, shape);
}

static int matmul_forward(kiln_layer *l) {
  matmul_state *s = l->priv;
  const float *a = l->bottom[0]->data, *b = l->bottom[1]->data;
  float *c = l->top[0]->data;
  const int64_t M = s->M, N = s->N, K = s->K;
  for (int64_t p = 0; p < s->batch; p++)
    KILN_TRY(KILN_OP(l, gemm, c + p * M * N, N, a + s->off_a[p], s->ta ? M : K, b + s->off_b[p],
                     s->tb ? K : N, s->ta, s->tb, M, N, K, 1.0f, 0.0f));
  return KILN_OK;
}

/* C = op(A) op(B): d op(A) = dC op(B)^T and d op(B) = op(A)^T dC, each transposed back where the
 * bottom is stored transposed. A bottom read by several products (a broadcast one) sums theirs. */
static int matmul_backward(kiln_layer *l) {
  matmul_state *s = l->priv;
  const kiln_blob *A = l->bottom[0], *B = l->bottom[1];
  const float *a = A->data, *b = B->data, *dc = l->top[0]->diff;
  const int64_t M = s->M, N = s->N, K = s->K;
  const int64_t lda = s->ta ? M : K, ldb = s->tb ? K : N;
  if (l->propagate_down[0]) {
    float *da = A->diff;
    KILN_TRY(KILN_OP(l, fill, da, 0.0f, A->count));
    for (int64_t p = 0; p < s->batch; p++) {
      const float *g = dc + p * M * N, *bp = b + s->off_b[p];
      float *dap = da + s->off_a[p];
      if (!s->ta) /* dA (M x K) = dC (M x N) op(B)^T */
        KILN_TRY(KILN_OP(l, gemm, dap, K, g, N, bp, ldb, false, !s->tb, M, K, N, 1.0f, 1.0f));
      else /* dA (K x M) = op(B) (K x N) dC^T */
        KILN_TRY(KILN_OP(l, gemm, dap, M, bp, ldb, g, N, s->tb, true, K, M, N, 1.0f, 1.0f));
    }
  }
  if (l->propagate_down[1]) {
    float *db = B->diff;
    KILN_TRY(KILN_OP(l, fill, db, 0.0f, B->count));
    for (int64_t p = 0; p < s->batch; p++) {
      const float *g = dc + p * M * N, *ap = a + s->off_a[p];
      float *dbp = db + s->off_b[p];
      if (!s->tb) /* dB (K x N) = op(A)^T (K x M) dC */
        KILN_TRY(KILN_OP(l, gemm, dbp, N, ap, lda, g, N, !s->ta, false, K, N, M, 1.0f, 1.0f));
      else /* dB (N x K) = dC^T (N x M) op(A) */
        KILN_TRY(KILN_OP(l, gemm, dbp, K, g, N, ap, lda, true, s->ta, N, K, M, 1.0f, 1.0f));
    }
  }
  return KILN_OK;
}

static unsigned matmul_backward_reads(const kiln_layer *l) {
  return (l->propagate_down[1] ? KILN_READS_BOTTOM(0) : 0u) |
         (l->propagate_down[0] ? KILN_READS_BOTTOM(1) : 0u);
}

static void matmul_destroy(kiln_layer *l) {
  matmul_state *s = l->priv;
  if (s) {
    free(s->off_a);
    free(s->off_b);
  }
  free(s);
}

const kiln_layer_ops kiln_layer_matmul = {
    .type = "MatMul", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .setup = matmul_setup, .reshape = matmul_reshape, .forward = matmul_forward,
    .backward = matmul_backward, .destroy = matmul_destroy,
    .backward_reads = matmul_backward_reads,
    .kernels = KILN_KERNELS(KILN_OP_gemm, KILN_OP_fill),
};
