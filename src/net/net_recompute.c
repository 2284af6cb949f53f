/* Recomputation in backward, the memory-efficient DenseNet technique: a layer whose top only the
 * next layer reads (BatchNorm, with the Scale and ReLU it fused, before a convolution) keeps
 * neither that top nor its kept output (BatchNorm's x_norm) from forward to backward. Both live
 * in two scratch buffers the net shares among all such layers, and the layer runs its forward
 * again (kiln_layer_ops.recompute) just before the reading layer's backward. Between that
 * backward and the layer's own, which follows it, nothing else writes the scratch.
 *
 * Then the Concats of a dense block: Concat l's top is the start of Concat l + 1's along the
 * channels (kiln_layer_ops.prefix_axis), so when only the next Concat and recomputing layers read
 * it, it is not kept either. Forward writes the tops of a chain alternately into two scratch
 * buffers (each is read only until the next Concat has run); backward copies a top back from
 * the start of the chain's last top, which is kept, just before the layer that recomputes from
 * it. A block's features are then kept once, in its last Concat's top. */
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

static int scratch_blob(const kiln_net *net, kiln_blob **out, const char *name);

/* The prefix layer whose top `b` is, directly or through a Split top sharing its data; -1: none. */
static int prefix_producer(const kiln_net *net, const kiln_blob *b) {
  const kiln_blob *root = b->data_of ? b->data_of : b;
  for (int k = 0; k < net->nlayers; k++) {
    const kiln_layer *l = net->layers[k];
    if (l->ntop == 1 && l->top[0] == root && l->ops->prefix_axis && l->ops->prefix_axis(l) >= 0)
      return k;
  }
  return -1;
}

/* The next link after prefix layer i: a prefix layer on the same axis whose first bottom is i's
 * top (or a Split top sharing it), when every other reader of that data is a Split passing it on
 * or a layer that recomputes (recomputing[k]), and all of them run no later than the link. -1:
 * none, and i's top is kept. */
static int next_link(const kiln_net *net, int i, const bool *recomputing) {
  const kiln_blob *t = net->layers[i]->top[0];
  const int axis = net->layers[i]->ops->prefix_axis(net->layers[i]);
  int link = -1, last = -1;
  for (int k = i + 1; k < net->nlayers; k++) {
    const kiln_layer *l = net->layers[k];
    for (int b = 0; b < l->nbottom; b++) {
      const kiln_blob *x = l->bottom[b];
      if (x != t && x->data_of != t) continue;
      last = k;
      if (l->ops->passes_through) continue; /* a Split: its tops are the same data */
      if (b == 0 && l->ntop == 1 && l->ops->prefix_axis && l->ops->prefix_axis(l) == axis &&
          link < 0)
        link = k;
      else if (!recomputing[k] || l->nbottom != 1)
        return -1;
    }
  }
  if (link < 0 || last > link) return -1;
  for (int k = 0; k < net->noutputs; k++)
    if (net->outputs[k] == t) return -1;
  return link;
}

/* Tops of prefix chains go to the two prefix scratch buffers (data_of), all but each chain's
 * last, which is kept. */
static int plan_prefix_chains(kiln_net *net) {
  net_internal *in = net->internal;
  const int n = net->nlayers;
  bool *recomputing = calloc((size_t)n, sizeof(bool));
  int *link = malloc(sizeof(int) * (size_t)n);
  in->refill_before = malloc(sizeof(int) * (size_t)n);
  in->refill_from = malloc(sizeof(int) * (size_t)n);
  if (!recomputing || !link || !in->refill_before || !in->refill_from) {
    free(recomputing), free(link);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int k = 0; k < n; k++) {
    in->refill_before[k] = in->refill_from[k] = link[k] = -1;
    if (in->recompute_before[k] >= 0) recomputing[in->recompute_before[k]] = true;
  }
  for (int k = 0; k < n; k++) {
    const kiln_layer *l = net->layers[k];
    if (l->ntop == 1 && l->ops->prefix_axis && l->ops->prefix_axis(l) >= 0 && !l->fused_into)
      link[k] = next_link(net, k, recomputing);
  }
  int64_t floats = 0;
  int rc = KILN_OK;
  for (int k = 0; k < n && !rc; k++) {
    if (link[k] < 0) continue;
    bool head = true; /* no link leads to k: a chain starts here */
    for (int j = 0; j < k; j++) head &= link[j] != k;
    if (!head) continue;
    int end = k, parity = 0;
    while (link[end] >= 0) end = link[end];
    /* the kept last top must still hold forward's values in backward */
    if (written_outside(net, net->layers[end]->top[0], end, end)) continue;
    for (int c = k; c != end && !rc; c = link[c], parity ^= 1) {
      kiln_blob *t = net->layers[c]->top[0];
      if (!in->scratch_prefix[parity] &&
          (rc = scratch_blob(net, &in->scratch_prefix[parity],
                             parity ? "prefix tops b" : "prefix tops a")))
        break;
      t->data_of = in->scratch_prefix[parity];
      if (t->count > floats) floats = t->count;
      in->refill_from[c] = end;
      /* refill before each recomputing reader's recompute (scheduled before its reader) */
      for (int r = 0; r < n; r++) {
        const int j = in->recompute_before[r];
        if (j >= 0 && prefix_producer(net, net->layers[j]->bottom[0]) == c) in->refill_before[r] = c;
      }
    }
  }
  free(recomputing), free(link);
  if (rc) return rc;
  int64_t shape[1] = {floats};
  for (int p = 0; p < 2; p++)
    if (in->scratch_prefix[p]) KILN_TRY(kiln_blob_reshape(in->scratch_prefix[p], 1, shape));
  return KILN_OK;
}

static int scratch_blob(const kiln_net *net, kiln_blob **out, const char *name) {
  if (!(*out = kiln_blob_new(name))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  (*out)->device = net->device;
  (*out)->defer_alloc = true;
  (*out)->no_diff = true;
  return KILN_OK;
}

int kiln_net_choose_recompute(kiln_net *net, const kiln_net_options *opt) {
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
      KILN_TRY(scratch_blob(net, &in->scratch_top, "recomputed tops"));
      KILN_TRY(scratch_blob(net, &in->scratch_kept, "recomputed kept outputs"));
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
  if (!in->recompute_before) return KILN_OK;
  int64_t s1[1] = {top_floats}, s2[1] = {kept_floats};
  KILN_TRY(kiln_blob_reshape(in->scratch_top, 1, s1));
  KILN_TRY(kiln_blob_reshape(in->scratch_kept, 1, s2));
  return plan_prefix_chains(net);
}

int kiln_net_alloc_recompute(kiln_net *net) {
  net_internal *in = net->internal;
  if (!in->recompute_before) return KILN_OK;
  for (int p = 0; p < 2; p++)
    if (in->scratch_prefix[p]) KILN_TRY(kiln_blob_alloc(in->scratch_prefix[p]));
  KILN_TRY(kiln_blob_alloc(in->scratch_top));
  return kiln_blob_alloc(in->scratch_kept);
}

/* The top of prefix layer c copied back from the start of its chain's kept last top. */
static int refill(kiln_net *net, int c, int end) {
  const kiln_layer *l = net->layers[c];
  kiln_blob *t = l->top[0];
  const kiln_blob *from = net->layers[end]->top[0];
  const int axis = l->ops->prefix_axis(l);
  int64_t outer = 1;
  for (int a = 0; a < axis; a++) outer *= t->shape[a];
  const int64_t inner = outer ? t->count / outer : 0, inner_from = outer ? from->count / outer : 0;
  return KILN_OP(l, copy_blocks, t->data, inner, from->data, inner_from, inner, outer);
}

int kiln_net_recompute_for(kiln_net *net, int i) {
  const net_internal *in = net->internal;
  if (!in->recompute_before || in->recompute_before[i] < 0) return KILN_OK;
  const int c = in->refill_before[i];
  if (c >= 0) KILN_TRY(refill(net, c, in->refill_from[c]));
  kiln_layer *l = net->layers[in->recompute_before[i]];
  return l->ops->recompute(l);
}

void kiln_net_free_recompute(net_internal *in) {
  free(in->recompute_before);
  free(in->refill_before);
  free(in->refill_from);
  kiln_blob_free(in->scratch_prefix[0]);
  kiln_blob_free(in->scratch_prefix[1]);
  kiln_blob_free(in->scratch_top);
  kiln_blob_free(in->scratch_kept);
}
