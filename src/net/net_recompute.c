/* Recomputation in backward, the memory-efficient DenseNet technique: a layer whose top only the
 * next layer reads (BatchNorm, with the Scale and ReLU it fused, before a convolution) keeps
 * neither that top nor its kept output (BatchNorm's x_norm) from forward to backward. Both live
 * in two scratch buffers the net shares among all such layers, and the layer runs its forward
 * again (kiln_layer_ops.recompute) just before the reading layer's backward. Between that
 * backward and the layer's own, which follows it, nothing else writes the scratch. */
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "net_internal.h"

/* Whether `b` is written by a layer outside [from, to]. */
static bool written_outside(const kiln_net *net, const kiln_blob *b, int from, int to) {
  for (int k = 0; k < net->nlayers; k++) {
    if (k >= from && k <= to) continue;
    for (int t = 0; t < net->layers[k]->ntop; t++)
      if (net->layers[k]->top[t] == b) return true;
  }
  return false;
}

/* Layer j, its fused group ending at e, may recompute for reader c = e + 1: c is the only
 * layer outside the group that reads the top, and reads it without writing it; no layer outside
 * the group writes the top; the bottom (or the blob whose data it shares) is written by no layer
 * after j, so it still holds forward's values in backward; the top is no output of the net. */
static kiln_blob *recompute_candidate(const kiln_net *net, int j) {
  kiln_layer *l = net->layers[j];
  const int e = j + l->fused, c = e + 1;
  if (!l->ops->recomputable || !l->ops->recompute || l->ntop != 1 || l->nbottom != 1 ||
      c >= net->nlayers || l->fused_into || l->loss_weight[0] != 0 || !l->ops->recomputable(l))
    return NULL;
  kiln_blob *y = l->top[0];
  const kiln_blob *x = l->bottom[0], *root = x->data_of ? x->data_of : x;
  if (written_outside(net, y, j, e)) return NULL;
  int reads = 0;
  for (int k = 0; k < net->nlayers; k++) {
    if (k >= j && k <= e) continue;
    for (int b = 0; b < net->layers[k]->nbottom; b++)
      if (net->layers[k]->bottom[b] == y) {
        if (k != c) return NULL;
        reads++;
      }
  }
  if (reads != 1) return NULL;
  for (int k = j + 1; k < net->nlayers; k++)
    for (int t = 0; t < net->layers[k]->ntop; t++)
      if (net->layers[k]->top[t] == x || net->layers[k]->top[t] == root) return NULL;
  for (int o = 0; o < net->noutputs; o++)
    if (net->outputs[o] == y) return NULL;
  return y;
}

/* The buffer of l that is its kept output, or NULL. */
static kiln_blob *kept_buffer(kiln_layer *l) {
  const kiln_blob *k = l->ops->kept_output ? l->ops->kept_output(l) : NULL;
  for (int b = 0; k && b < l->nbuffer; b++)
    if (l->buffer[b] == k) return l->buffer[b];
  return NULL;
}

static int scratch_blob(kiln_blob **out, const char *name) {
  if (!(*out = kiln_blob_new(name))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  (*out)->defer_alloc = true;
  (*out)->no_diff = true;
  return KILN_OK;
}

int kiln_net_plan_recompute(kiln_net *net, const kiln_net_options *opt) {
  net_internal *in = net->internal;
  if (net->config.no_recompute || !opt->share_diffs || net->phase != CAFFE__PHASE__TRAIN)
    return KILN_OK;
  int64_t top_floats = 0, kept_floats = 0;
  for (int j = 0; j < net->nlayers; j++) {
    kiln_layer *l = net->layers[j];
    kiln_blob *y = recompute_candidate(net, j);
    if (!y) continue;
    if (!in->recompute_before) {
      if (!(in->recompute_before = malloc(sizeof(int) * (size_t)net->nlayers)))
        return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      for (int k = 0; k < net->nlayers; k++) in->recompute_before[k] = -1;
      KILN_TRY(scratch_blob(&in->scratch_top, "recomputed tops"));
      KILN_TRY(scratch_blob(&in->scratch_kept, "recomputed kept outputs"));
    }
    in->recompute_before[j + l->fused + 1] = j;
    y->data_of = in->scratch_top;
    if (y->count > top_floats) top_floats = y->count;
    kiln_blob *kept = kept_buffer(l);
    if (kept) {
      kept->data_of = in->scratch_kept;
      if (kept->count > kept_floats) kept_floats = kept->count;
    }
  }
  if (in->recompute_before) {
    int64_t s1[1] = {top_floats}, s2[1] = {kept_floats};
    KILN_TRY(kiln_blob_reshape(in->scratch_top, 1, s1));
    KILN_TRY(kiln_blob_reshape(in->scratch_kept, 1, s2));
  }
  return KILN_OK;
}

int kiln_net_alloc_recompute(kiln_net *net) {
  net_internal *in = net->internal;
  if (!in->recompute_before) return KILN_OK;
  KILN_TRY(kiln_blob_alloc(in->scratch_top));
  return kiln_blob_alloc(in->scratch_kept);
}

int kiln_net_recompute_for(kiln_net *net, int i) {
  const net_internal *in = net->internal;
  if (!in->recompute_before || in->recompute_before[i] < 0) return KILN_OK;
  kiln_layer *l = net->layers[in->recompute_before[i]];
  return l->ops->recompute(l);
}

void kiln_net_free_recompute(net_internal *in) {
  free(in->recompute_before);
  kiln_blob_free(in->scratch_top);
  kiln_blob_free(in->scratch_kept);
}
