/* What the net decides about its layers once they are built and shaped, before its memory plan
 * (build() in net.c takes the steps in this order): the activation layouts (blocked where the
 * layers around a blob read it so), which Split tops share their bottom's data, which layers
 * fuse. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/layout.h"
#include "kiln/net.h"
#include "net_internal.h"

/* ---- activation layouts ------------------------------------------------------------------ */

static int uf_find(int *parent, int i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

/* Two requests for a group's channel block (kiln_layer_ops.block_channels): 0 none yet, -1 two
 * that differ. */
static int merge_block(int a, int b) { return !a ? b : !b || a == b ? a : -1; }

/* A blocked layout between the layers that read it (kiln_layer_ops.layout_role). Blobs joined
 * by SAME layers form groups that take one layout. A group is blocked when the layers that
 * convert (BOTTOM or TOP roles: convolution on oneDNN) ask for one channel block that kiln has a
 * layout for (kiln_layer_ops.block_channels: 16 for nChw16c), each of its blobs is 4-D with
 * channels a multiple of that block, every layer touching it reads blocked, and none of its
 * blobs leaves the net (outputs stay plain for whoever reads them); blobs of 1x1 cells are
 * exempt from the last two (the bytes are the same); and a convolution whose output channels
 * are not whole blocks reads plain. Then every layer is reshaped again, which
 * remakes the convolutions' primitives for their new layouts. */
int kiln_net_choose_layouts(kiln_net *net) {
  if (net->config.plain_layouts || net->nblobs == 0) return KILN_OK;
  const int n = net->nblobs;
  int *parent = malloc(sizeof(int) * (size_t)n);
  bool *plain = calloc((size_t)n, sizeof(bool)), *consumed = calloc((size_t)n, sizeof(bool));
  bool *root_plain = calloc((size_t)n, sizeof(bool));
  int *asked = calloc((size_t)n, sizeof(int)); /* block asked of each blob, then of each group */
  if (!parent || !plain || !consumed || !root_plain || !asked) {
    free(parent), free(plain), free(consumed), free(root_plain), free(asked);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) parent[i] = i;
  for (int li = 0; li < net->nlayers; li++) {
    kiln_layer *l = net->layers[li];
    const int role = l->ops->layout_role ? l->ops->layout_role(l) : KILN_LAYOUT_ROLE_NONE;
    int block = 0; /* the channel block its BOTTOM and TOP sides read and write */
    if ((role & (KILN_LAYOUT_ROLE_BOTTOM | KILN_LAYOUT_ROLE_TOP)) && l->ops->block_channels)
      block = l->ops->block_channels(l);
    int first = -1;
    for (int k = 0; k < l->nbottom + l->ntop; k++) {
      const bool is_bottom = k < l->nbottom;
      int bi = kiln_net_blob_index(net, is_bottom ? l->bottom[k] : l->top[k - l->nbottom]);
      if (bi < 0) continue;
      if (is_bottom) consumed[bi] = true;
      if (role & KILN_LAYOUT_ROLE_SAME) {
        if (first < 0) first = bi;
        else parent[uf_find(parent, bi)] = uf_find(parent, first);
      } else if (!(role & (is_bottom ? KILN_LAYOUT_ROLE_BOTTOM : KILN_LAYOUT_ROLE_TOP)) ||
                 block <= 0) {
        plain[bi] = true;
      } else {
        asked[bi] = merge_block(asked[bi], block);
      }
    }
  }
  for (int i = 0; i < n; i++) {
    const int r = uf_find(parent, i);
    asked[r] = merge_block(asked[r], asked[i]);
  }
  for (int i = 0; i < n; i++) {
    const kiln_blob *b = net->blobs[i];
    const int block = asked[uf_find(parent, i)];
    const bool fits = b->naxes == 4 && kiln_layout_for_block(block) != KILN_LAYOUT_PLAIN &&
                      b->shape[1] % block == 0;
    /* With one cell per channel (global pooling's output) both layouts are the same bytes, so
     * such a blob takes its group's layout whoever else reads it. */
    const bool same_bytes = fits && b->shape[2] * b->shape[3] == 1;
    if (!fits || (!same_bytes && (plain[i] || !consumed[i])))
      root_plain[uf_find(parent, i)] = true;
  }
  /* A converting layer (convolution on oneDNN) whose output channels are not a multiple of the
   * block reads plain: oneDNN has no optimised kernel from a blocked input to such an output
   * and runs its reference one (a dense block's 48 -> 12 channel convolution took 200 times as
   * long). A plain output of whole blocks (a convolution before a classifier) is fine. */
  for (int li = 0; li < net->nlayers; li++) {
    const kiln_layer *l = net->layers[li];
    const int role = l->ops->layout_role ? l->ops->layout_role(l) : KILN_LAYOUT_ROLE_NONE;
    if (!(role & KILN_LAYOUT_ROLE_BOTTOM) || !(role & KILN_LAYOUT_ROLE_TOP) ||
        !l->ops->block_channels)
      continue;
    const int block = l->ops->block_channels(l);
    bool partial = false;
    for (int t = 0; t < l->ntop; t++)
      partial |= block > 0 && l->top[t]->naxes == 4 && l->top[t]->shape[1] % block != 0;
    for (int b = 0; partial && b < l->nbottom; b++) {
      const int bi = kiln_net_blob_index(net, l->bottom[b]);
      if (bi >= 0) root_plain[uf_find(parent, bi)] = true;
    }
  }
  bool any = false;
  for (int i = 0; i < n; i++) {
    const int r = uf_find(parent, i);
    net->blobs[i]->layout = root_plain[r] ? KILN_LAYOUT_PLAIN : kiln_layout_for_block(asked[r]);
    any |= net->blobs[i]->layout != KILN_LAYOUT_PLAIN;
  }
  free(parent), free(plain), free(consumed), free(root_plain), free(asked);
  if (any)
    for (int li = 0; li < net->nlayers; li++)
      KILN_TRY(net->layers[li]->ops->reshape(net->layers[li]));
  return KILN_OK;
}

/* The tops of a layer that passes its bottom through (kiln_layer_ops.passes_through: Split)
 * read its bottom's data instead of copies (Caffe shares a Split's too), unless a consumer works
 * in place on one (any layer but this one that names the blob as a top), which would change it
 * under the others. Saves a copy per top in forward and the memory for it. */
void kiln_net_share_split_data(kiln_net *net) {
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (!l->ops->passes_through || l->nbottom != 1) continue;
    for (int t = 0; t < l->ntop; t++) {
      kiln_blob *b = l->top[t];
      if (b == l->bottom[0]) continue;
      bool written = false;
      for (int j = 0; j < net->nlayers && !written; j++)
        for (int k = 0; j != i && k < net->layers[j]->ntop; k++)
          written |= net->layers[j]->top[k] == b;
      if (!written) b->data_of = l->bottom[0];
    }
  }
}

/* Layers that do the work of the ones after them (kiln_layer_ops.fuse), decided once the
 * layouts are known. A layer already absorbed into another is not asked. */
void kiln_net_choose_fusion(kiln_net *net) {
  if (net->config.unfused) return;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (!l->ops->fuse || l->fused_into) continue;
    int k = l->ops->fuse(l, net->layers + i + 1, net->nlayers - i - 1);
    if (k <= 0) continue;
    l->fused = k;
    for (int j = 1; j <= k; j++) net->layers[i + j]->fused_into = l;
  }
}
