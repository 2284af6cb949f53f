/* Private to src/net: what its files share. net.c builds, runs and frees the net; net_graph.c
 * turns the NetParameter into the layer graph (layers by name); net_layout.c decides, once the
 * net is built, layouts, fusion and shared Split data, and net_memory.c its memory plan; layer.c
 * holds the layer lifecycle that the net and standalone layers share. */
#ifndef KILN_NET_INTERNAL_H
#define KILN_NET_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/net.h"

/* A copy of `s`, NULL (a string the message leaves out) copied as "". */
static inline char *xstrdup(const char *s) { return kiln_strdup(s ? s : ""); }

/* One layer of the layer graph: names only, before any blob exists. */
typedef struct {
  const Caffe__LayerParameter *lp;
  const kiln_layer_ops *ops;
  char *name;
  int nbottom, ntop;
  char **bottom, **top;
  float *loss_weight; /* per top */
  int *bottom_src_layer, *bottom_src_top;
  int *top_uses; /* consumers of each top (+1 if it carries a loss) */
} graph_layer;

typedef struct {
  graph_layer *v;
  int n, cap;
} layer_graph;

typedef struct {
  layer_graph graph;
  Caffe__LayerParameter **synth; /* layer messages kiln made (Input for deploy headers, Split) */
  int nsynth;
  kiln_layer *layer_storage;
  kiln_blob **param_owner_blob; /* per (layer, param) owned or shared */
  /* Activation gradients sharing buffers by lifetime (kiln_net_options.share_diffs): blob i's
   * diff is slot diff_slot[i] of the pool (-1: a diff of its own). */
  int *diff_slot;
  int ndiff_pool;
  int64_t *diff_pool_floats;
  float **diff_pool;
  /* Activation data sharing buffers by lifetime (kiln_net_options.share_data): the pool's
   * buffers, which the blobs that share them read through data_of. */
  int ndata_pool;
  kiln_blob **data_pool;
  /* Recomputation (net_recompute.c): per layer, the layer to run again before its backward (-1:
   * none; NULL: no layer recomputes), and the scratch buffers the recomputed tops and kept
   * outputs share. */
  int *recompute_before;
  kiln_blob *scratch_top, *scratch_kept;
  /* Prefix layers (Concat) whose top is not kept: per layer, the one whose top to refill before
   * its backward (-1: none), and per such layer the kept top of its chain to refill it from;
   * their tops share two scratch buffers, alternating along a chain. */
  int *refill_before, *refill_from;
  kiln_blob *scratch_prefix[2];
  int fault_layer;              /* the layer whose forward sleeps (config.fault); -1: none */
  int blobs_cap;                /* room in net->blobs */
} net_internal;

/* Blob b's index in net->blobs, -1 for a blob that is not one of its activations. */
static inline int kiln_net_blob_index(const kiln_net *net, const kiln_blob *b) {
  return b->id >= 0 && b->id < net->nblobs && net->blobs[b->id] == b ? b->id : -1;
}

/* ---- net_graph.c: the layer graph ---------------------------------------------------------- */

/* Fills in->graph from `np`: the layers the net state includes (a deploy header becoming an Input
 * layer), each bottom resolved to the top that produces it, a Split after every top used more
 * than once. */
int kiln_net_build_graph(net_internal *in, const Caffe__NetParameter *np,
                         const kiln_net_options *opt);
void kiln_net_graph_layer_free(graph_layer *p);

/* ---- net_layout.c: decisions once the layers are built, in the order build() takes them --- */

int kiln_net_choose_layouts(kiln_net *net);
void kiln_net_share_split_data(kiln_net *net);
void kiln_net_choose_fusion(kiln_net *net);

/* ---- net_memory.c: the memory plan, allocation ---------------------------------------------- */

/* Fills net->memory, deciding which activation gradients share buffers; refuses a net over the
 * memory limit. */
int kiln_net_plan_memory(kiln_net *net, const kiln_net_options *opt);
int kiln_net_allocate_and_fill(kiln_net *net);

/* ---- net_recompute.c: recomputation in backward -------------------------------------------- */

/* Decides which layers recompute (their tops and kept outputs then share scratch data). After
 * fusion and Split sharing, before the memory plan. */
int kiln_net_choose_recompute(kiln_net *net, const kiln_net_options *opt);
/* Allocates the scratch buffers: before kiln_net_allocate_and_fill. */
int kiln_net_alloc_recompute(kiln_net *net);
/* Before layer i's backward: recomputes the layer that needs it. */
int kiln_net_recompute_for(kiln_net *net, int i);
void kiln_net_free_recompute(net_internal *in);

/* ---- layer.c ------------------------------------------------------------------------------ */

/* Fills `l` (zeroed by the caller) and checks the number of bottoms and tops. */
/* n zeroed floats on the net's device (huge: the host's huge pages for the flat parameter and
 * gradient buffers), and their release; NULL when it cannot. */
float *kiln_net_alloc_floats(const kiln_net *net, int64_t n, bool huge);
void kiln_net_free_floats(const kiln_net *net, float *p);

int kiln_layer_wire(kiln_layer *l, const Caffe__LayerParameter *lp, const kiln_layer_ops *ops,
                    const char *name, int phase, kiln_blob **bottoms, int nbottom,
                    kiln_blob **tops, int ntop);
/* Runs the layer's destroy and frees what wire and setup allocated (not `l` itself). */
void kiln_layer_release(kiln_layer *l);

#endif
