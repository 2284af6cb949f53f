/* Embed (Caffe's EmbedLayer): a lookup table. The bottom holds integer indices stored as floats,
 * of any shape; each becomes a row of the weight W (input_dim x num_output, transposed from
 * InnerProduct's so that a row is contiguous), plus the bias (num_output) when bias_term is set.
 * top shape = bottom shape + [num_output]. Indices take no gradient (Caffe refuses them too). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__EmbedParameter embed_defaults = CAFFE__EMBED_PARAMETER__INIT;

typedef struct {
  int64_t K, N; /* input_dim, num_output */
  bool bias;
} embed_state;

static int embed_setup(kiln_layer *l) {
  const Caffe__EmbedParameter *p = KILN_PARAM_OR(l->lp->embed_param, embed_defaults);
  if (p->num_output == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "embed_param.num_output must be set and > 0");
  if (p->input_dim == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "embed_param.input_dim must be set and > 0");
  embed_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->K = p->input_dim;
  s->N = p->num_output;
  s->bias = p->bias_term;
  if (!kiln_layer_add_param(l, 2, (const int64_t[]){s->K, s->N}, p->weight_filler, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (s->bias && !kiln_layer_add_param(l, 1, (const int64_t[]){s->N}, p->bias_filler, 0))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static int embed_reshape(kiln_layer *l) {
  embed_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  if (x->naxes + 1 > KILN_MAX_AXES)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "input has %d axes; the output would have more than %d", x->naxes,
                            KILN_MAX_AXES);
  int64_t shape[KILN_MAX_AXES];
  for (int i = 0; i < x->naxes; i++) shape[i] = x->shape[i];
  shape[x->naxes] = s->N;
  l->flops = s->bias ? (double)x->count * s->N : 0;
  return kiln_blob_reshape(l->top[0], x->naxes + 1, shape);
}

/* Element i of the bottom as a row of W, or an error naming the value: Caffe only checks this in
 * debug builds and reads past the table otherwise. */
static int embed_index(kiln_layer *l, const embed_state *s, int64_t i, int64_t *row) {
  const float v = l->bottom[0]->data[i];
  if (!(v >= 0 && v < (float)s->K) || v != floorf(v))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "index %g at element %lld of '%s' is not a whole number in [0, %lld) "
                            "(embed_param.input_dim)",
                            (double)v, (long long)i, l->bottom[0]->name, (long long)s->K);
  *row = (int64_t)v;
  return KILN_OK;
}

static int embed_forward(kiln_layer *l) {
  embed_state *s = l->priv;
  const int64_t M = l->bottom[0]->count, N = s->N;
  const float *w = l->param[0]->data, *b = s->bias ? l->param[1]->data : NULL;
  float *y = l->top[0]->data;
  for (int64_t m = 0; m < M; m++) {
    int64_t k;
    KILN_TRY(embed_index(l, s, m, &k));
    const float *row = w + k * N;
    float *out = y + m * N;
    if (b)
      for (int64_t n = 0; n < N; n++) out[n] = row[n] + b[n];
    else
      memcpy(out, row, sizeof(float) * (size_t)N);
  }
  return KILN_OK;
}

static int embed_backward(kiln_layer *l) {
  if (l->propagate_down[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot backpropagate to the index input");
  embed_state *s = l->priv;
  const int64_t M = l->bottom[0]->count, N = s->N;
  const float *dy = l->top[0]->diff;
  float *dw = l->param[0]->diff;
  /* Rows of W that several positions share get their gradients added in position order, so the
   * result is the same whatever the thread count: threads split the columns, never the
   * positions. Indices were checked by the forward pass; checked again, since the bottom is the
   * caller's and backward must not write outside W. */
  for (int64_t m = 0; m < M; m++) {
    int64_t k;
    KILN_TRY(embed_index(l, s, m, &k));
  }
  const float *x = l->bottom[0]->data;
#pragma omp parallel for schedule(static) num_threads(l->nthreads) if (M * N > 65536)
  for (int64_t c0 = 0; c0 < N; c0 += 64) {
    const int64_t c1 = c0 + 64 < N ? c0 + 64 : N;
    for (int64_t m = 0; m < M; m++) {
      float *row = dw + (int64_t)x[m] * N;
      const float *g = dy + m * N;
      for (int64_t n = c0; n < c1; n++) row[n] += g[n];
    }
  }
  if (s->bias) {
    float *db = l->param[1]->diff;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) db[n] += dy[m * N + n];
  }
  return KILN_OK;
}

static void embed_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_embed = {
    .type = "Embed", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .no_gradient_bottoms = 1u << 0,
    .setup = embed_setup, .reshape = embed_reshape, .forward = embed_forward,
    .backward = embed_backward, .destroy = embed_destroy,
};
