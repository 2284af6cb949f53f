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

/* The ops check every index (Caffe only does in debug builds and reads past the table
 * otherwise); an error names the bottom and the field too. */
static int index_error(kiln_layer *l, const embed_state *s, int rc) {
  return kiln_error_context(rc, "layer '%s' (Embed): '%s' (embed_param.input_dim %lld): ", l->name,
                            l->bottom[0]->name, (long long)s->K);
}

static int embed_forward(kiln_layer *l) {
  embed_state *s = l->priv;
  int rc = KILN_OP(l, embed_fwd, l->top[0]->data, l->param[0]->data,
                   s->bias ? l->param[1]->data : NULL, l->bottom[0]->data, l->bottom[0]->count,
                   s->N, s->K);
  return rc ? index_error(l, s, rc) : KILN_OK;
}

static int embed_backward(kiln_layer *l) {
  if (l->propagate_down[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "cannot backpropagate to the index input");
  embed_state *s = l->priv;
  const int64_t M = l->bottom[0]->count;
  int rc = KILN_OP(l, embed_bwd, l->param[0]->diff, l->top[0]->diff, l->bottom[0]->data, M, s->N,
                   s->K);
  if (rc) return index_error(l, s, rc);
  if (s->bias) KILN_TRY(KILN_OP(l, sum_rows_into, l->param[1]->diff, l->top[0]->diff, M, s->N));
  return KILN_OK;
}

static void embed_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_embed = {
    .type = "Embed", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .no_gradient_bottoms = 1u << 0,
    .setup = embed_setup, .reshape = embed_reshape, .forward = embed_forward,
    .backward = embed_backward, .destroy = embed_destroy,
    .kernels = KILN_KERNELS(KILN_OP_embed_fwd, KILN_OP_embed_bwd, KILN_OP_sum_rows_into),
};
