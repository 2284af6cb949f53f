/* Net construction and execution (see include/kiln/net.h). Construction follows Caffe:
 *   1. keep the layers whose include/exclude rules match the net state;
 *   2. turn a deploy header (input: / input_dim: / input_shape:) into an Input layer;
 *   3. insert Split layers where one top feeds several bottoms (or a bottom and a loss), so each
 *      consumer writes its own gradient and the Split adds them up;
 *   4. wire blobs by name (a top may reuse a name only in place), set up and shape each layer;
 *   5. parameters: ParamSpec names share blobs; owners get slots in one flat buffer;
 *   6. decide which layers need backward (they have learnable parameters or gradient-needing
 *      inputs, and something they produce reaches a loss);
 *   7. plan memory and refuse a net that would not fit, then allocate and fill.
 * Steps 1 to 3 and the naming rule of step 4 are net_graph.c's (the layer graph, by name); the
 * layouts, fusion and shared Split data decided after step 4 are net_layout.c's, and step 7 is
 * net_memory.c's. This file wires the layers and blobs, runs the steps in order, and runs the
 * built net. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "net_internal.h"

/* ---- building ------------------------------------------------------------------------------ */

static kiln_blob *find_blob(kiln_net *net, const char *name) {
  for (int i = net->nblobs - 1; i >= 0; i--)
    if (strcmp(net->blobs[i]->name, name) == 0) return net->blobs[i];
  return NULL;
}

kiln_blob *kiln_net_blob(const kiln_net *net, const char *name) {
  return find_blob((kiln_net *)net, name);
}

const kiln_backend *kiln_net_backend(const kiln_net *net) { return net->backend; }

kiln_op_ctx kiln_net_op_ctx(const kiln_net *net) {
  return (kiln_op_ctx){.nthreads = net->nthreads, .config = &net->config,
                       .device = net->backend->device};
}

kiln_layer *kiln_net_layer(const kiln_net *net, const char *name) {
  for (int i = 0; i < net->nlayers; i++)
    if (strcmp(net->layers[i]->name, name) == 0) return net->layers[i];
  return NULL;
}

static int add_blob(kiln_net *net, const char *name, kiln_blob **out) {
  net_internal *in = net->internal;
  if (net->nblobs == in->blobs_cap) { /* doubling: a net of N blobs copies the list O(N) times */
    int cap = in->blobs_cap ? in->blobs_cap * 2 : 64;
    kiln_blob **v = realloc(net->blobs, (size_t)cap * sizeof *v);
    if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    net->blobs = v;
    in->blobs_cap = cap;
  }
  kiln_blob *b = kiln_blob_new(name);
  if (!b) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  b->defer_alloc = true;
  b->device = net->device;
  b->id = net->nblobs;
  net->blobs[net->nblobs++] = b;
  *out = b;
  return KILN_OK;
}

static int by_layer_name(const void *a, const void *b) {
  const kiln_layer *x = *(kiln_layer *const *)a, *y = *(kiln_layer *const *)b;
  return strcmp(x->name, y->name);
}

/* Weights are saved and loaded by layer name (.caffemodel), so a layer with parameters needs a
 * name no other layer of the net has: with two, a snapshot would load both layers' weights into
 * the first and leave the second as initialised. Layers without parameters may share names, as
 * Caffe lets them. */
static int check_param_layer_names(const kiln_net *net) {
  kiln_layer **v = malloc(sizeof *v * ((size_t)net->nlayers + 1));
  if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  memcpy(v, net->layers, sizeof *v * (size_t)net->nlayers);
  qsort(v, (size_t)net->nlayers, sizeof *v, by_layer_name);
  int rc = KILN_OK;
  for (int i = 0; i + 1 < net->nlayers && !rc; i++) {
    const kiln_layer *a = v[i], *b = v[i + 1];
    if (strcmp(a->name, b->name) || (a->nparam == 0 && b->nparam == 0)) continue;
    rc = kiln_errorf(KILN_ERR_INVALID,
                     "layer '%s': two layers have this name (%s and %s); weights are saved and "
                     "loaded by layer name, so a layer with parameters needs a name of its own",
                     a->name, a->ops->type, b->ops->type);
  }
  free(v);
  return rc;
}

/* Parameter specs: ownership, sharing by name, multipliers. */
static int setup_params(kiln_net *net) {
  net_internal *in = net->internal;
  int total = 0;
  for (int i = 0; i < net->nlayers; i++) total += net->layers[i]->nparam;
  net->learnable = calloc((size_t)total + 1, sizeof(kiln_blob *));
  net->lr_mult = calloc((size_t)total + 1, sizeof(float));
  net->decay_mult = calloc((size_t)total + 1, sizeof(float));
  net->is_state = calloc((size_t)total + 1, sizeof(bool));
  net->learnable_offset = calloc((size_t)total + 1, sizeof(int64_t));
  in->param_owner_blob = calloc((size_t)total + 1, sizeof(kiln_blob *));
  const char **owner_names = calloc((size_t)total + 1, sizeof(char *));
  int *owner_index = calloc((size_t)total + 1, sizeof(int));
  if (!net->learnable || !net->lr_mult || !net->decay_mult || !net->is_state ||
      !net->learnable_offset ||
      !in->param_owner_blob || !owner_names || !owner_index) {
    free(owner_names);
    free(owner_index);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  int rc = KILN_OK, slot = 0;
  for (int i = 0; i < net->nlayers && !rc; i++) {
    kiln_layer *l = net->layers[i];
    if ((int)l->lp->n_param > l->nparam && l->lp->n_param > 0 && l->nparam > 0) {
      rc = kiln_errorf(KILN_ERR_INVALID, "layer '%s': %zu param specs for %d parameter blobs",
                       l->name, l->lp->n_param, l->nparam);
      break;
    }
    for (int p = 0; p < l->nparam; p++, slot++) {
      const Caffe__ParamSpec *spec = p < (int)l->lp->n_param ? l->lp->param[p] : NULL;
      const char *pname = spec && spec->name && spec->name[0] ? spec->name : NULL;
      int owner = -1;
      if (pname)
        for (int j = 0; j < net->nlearnable; j++)
          if (owner_names[j] && strcmp(owner_names[j], pname) == 0) owner = j;
      if (owner >= 0) {
        kiln_blob *o = net->learnable[owner];
        bool same = o->naxes == l->param[p]->naxes;
        for (int a = 0; same && a < o->naxes; a++) same = o->shape[a] == l->param[p]->shape[a];
        bool permissive = spec->share_mode == CAFFE__PARAM_SPEC__DIM_CHECK_MODE__PERMISSIVE;
        if (!same && !(permissive && o->count == l->param[p]->count)) {
          char s1[128], s2[128];
          rc = kiln_errorf(KILN_ERR_SHAPE,
                           "layer '%s': shared parameter '%s' has shape %s here but %s in its "
                           "owner",
                           l->name, pname, kiln_blob_shape_string(l->param[p], s1, sizeof s1),
                           kiln_blob_shape_string(o, s2, sizeof s2));
          break;
        }
        in->param_owner_blob[slot] = o;
        continue;
      }
      int k = net->nlearnable++;
      net->learnable[k] = l->param[p];
      owner_names[k] = pname;
      owner_index[k] = slot;
      net->lr_mult[k] = l->param_frozen[p] ? 0.0f : spec ? spec->lr_mult : 1.0f;
      net->decay_mult[k] = l->param_frozen[p] ? 0.0f : spec ? spec->decay_mult : 1.0f;
      net->is_state[k] = l->param_frozen[p];
      in->param_owner_blob[slot] = l->param[p];
    }
  }
  free(owner_names);
  free(owner_index);
  return rc;
}

/* Per-blob flags and figures are arrays indexed by kiln_blob.id, so that each pass over the net
 * is linear in its size (nets of tens of thousands of layers build in seconds). */

/* The forward half of Caffe's rule: a blob carries a gradient when a learning parameter lies
 * below it; force_backward adds each bottom that allows one. Sets every layer's propagate_down
 * and layer_need_backward from it, and `needs` per blob id. */
static void forward_needs(kiln_net *net, bool force_backward, bool *needs) {
  net_internal *in = net->internal;
  int slot = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    bool need = false;
    for (int p = 0; p < l->nparam; p++, slot++) {
      kiln_blob *o = in->param_owner_blob[slot];
      for (int k = 0; k < net->nlearnable; k++)
        if (net->learnable[k] == o && net->lr_mult[k] != 0) need = true;
    }
    /* force_backward applies to each bottom on its own (Caffe's AllowForceBackward: never a
     * loss layer's labels, kiln_layer_allows_gradient); it does not make the tops carry
     * gradients, or a label that passed through a Split would be asked for a gradient
     * downstream. */
    bool forced_any = false;
    for (int b = 0; b < l->nbottom; b++) {
      bool bn = needs[l->bottom[b]->id];
      bool fb = force_backward && !l->ops->is_data && kiln_layer_allows_gradient(l, b);
      if (b < (int)l->lp->n_propagate_down && !l->lp->propagate_down[b]) bn = fb = false;
      l->propagate_down[b] = bn || fb;
      need |= bn;
      forced_any |= fb;
    }
    net->layer_need_backward[i] = need || forced_any;
    if (need)
      for (int t = 0; t < l->ntop; t++) needs[l->top[t]->id] = true;
  }
}

static void need_backward(kiln_net *net, const Caffe__NetParameter *np) {
  bool *needs = calloc((size_t)net->nblobs + 1, sizeof *needs);
  net->layer_need_backward = calloc((size_t)net->nlayers + 1, sizeof(bool));
  if (!needs || !net->layer_need_backward) {
    free(needs);
    return;
  }
  net->force_backward = np->force_backward;
  forward_needs(net, np->force_backward, needs);
  /* Backward: only what reaches a loss through bottoms that take its gradient. A blob whose
   * (single: the net inserts Splits) consumer does not propagate down to it needs no gradient,
   * so a layer whose tops all lie so skips backward, as in Caffe (its blobs_skip_backp): SSD's
   * PriorBox, which has no backward, below a Concat of priors that MultiBoxLoss takes with
   * propagate_down: false. */
  /* With force_backward the net's outputs that no loss weighs take gradients too (a caller
   * sets their diffs: pycaffe's net.backward(prob=...) on a deploy net), as Caffe forces
   * backward through every layer that has one. `read` marks the blobs a later layer reads. */
  bool *read = np->force_backward ? calloc((size_t)net->nblobs + 1, sizeof *read) : NULL;
  memset(needs, 0, sizeof *needs * (size_t)net->nblobs);
  for (int i = net->nlayers - 1; i >= 0; i--) {
    kiln_layer *l = net->layers[i];
    bool contributes = false;
    for (int t = 0; t < l->ntop; t++) {
      if (l->loss_weight[t] != 0) contributes = true;
      contributes |= needs[l->top[t]->id];
      if (read && !read[l->top[t]->id] && l->ops->backward && !l->ops->is_data) contributes = true;
    }
    for (int b = 0; read && b < l->nbottom; b++) read[l->bottom[b]->id] = true;
    if (!contributes) {
      net->layer_need_backward[i] = false;
      for (int b = 0; b < l->nbottom; b++) l->propagate_down[b] = false;
    } else {
      for (int b = 0; b < l->nbottom; b++)
        if (l->propagate_down[b]) needs[l->bottom[b]->id] = true;
    }
  }
  free(read);
  free(needs);
}

int kiln_net_need_backward_everywhere(kiln_net *net) {
  if (net->share_data) /* its memory plan frees what no planned backward reads */
    return kiln_errorf(KILN_ERR_INVALID,
                       "net '%s': built with shared activation data, it cannot be given more "
                       "backward passes than planned", net->name);
  bool *needs = calloc((size_t)net->nblobs + 1, sizeof *needs);
  if (!needs) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  forward_needs(net, net->force_backward, needs);
  free(needs);
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    net->layer_need_backward[i] = !l->ops->is_data && l->ops->backward;
  }
  return KILN_OK;
}

/* Outputs: blobs no layer consumes (but in place), with the loss weight of the last layer that
 * gives them one. */
static int find_outputs(kiln_net *net) {
  net->outputs = calloc((size_t)net->nblobs + 1, sizeof(kiln_blob *));
  net->output_loss_weight = calloc((size_t)net->nblobs + 1, sizeof(float));
  bool *consumed = calloc((size_t)net->nblobs + 1, sizeof *consumed);
  float *lw = calloc((size_t)net->nblobs + 1, sizeof *lw);
  if (!net->outputs || !net->output_loss_weight || !consumed || !lw) {
    free(consumed);
    free(lw);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int j = 0; j < net->nlayers; j++) {
    kiln_layer *l = net->layers[j];
    for (int t = 0; t < l->nbottom; t++)
      if (!(t < l->ntop && l->top[t] == l->bottom[t])) consumed[l->bottom[t]->id] = true;
    for (int t = 0; t < l->ntop; t++)
      if (l->loss_weight[t] != 0) lw[l->top[t]->id] = l->loss_weight[t];
  }
  for (int i = 0; i < net->nblobs; i++)
    if (!consumed[i]) {
      net->outputs[net->noutputs] = net->blobs[i];
      net->output_loss_weight[net->noutputs++] = lw[i];
    }
  free(consumed);
  free(lw);
  return KILN_OK;
}

/* A sparse blob (kiln_blob.csr) has no dense values: only bottom 0 of a layer that reads CSR
 * rows (kiln_layer_ops.sparse_bottom) may take it, and something must, since the net's
 * outputs are read densely. */
static int check_sparse(const kiln_net *net) {
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    for (int b = 0; b < l->nbottom; b++)
      if (l->bottom[b]->csr && !(b == 0 && l->ops->sparse_bottom))
        return kiln_errorf(KILN_ERR_INVALID,
                           "layer '%s' (%s): its bottom '%s' is sparse (CSR rows without dense "
                           "values), which only InnerProduct reads, as its only bottom%s",
                           l->name, l->ops->type, l->bottom[b]->name,
                           l->ops->passes_through ? " (a sparse blob cannot feed two layers)" : "");
  }
  for (int o = 0; o < net->noutputs; o++)
    if (net->outputs[o]->csr)
      return kiln_errorf(KILN_ERR_INVALID,
                         "blob '%s' is sparse and no layer reads it (an InnerProduct must)",
                         net->outputs[o]->name);
  return KILN_OK;
}

static int build(kiln_net *net, const Caffe__NetParameter *np, const kiln_net_options *opt) {
  net_internal *in = net->internal;
  KILN_TRY(kiln_net_build_graph(in, np, opt));

  layer_graph *p = &in->graph;
  if (p->n == 0) /* an empty or truncated file, or include rules that leave nothing */
    return kiln_errorf(KILN_ERR_INVALID, "the net '%s' has no layers in phase %s",
                       net->name, opt->phase == CAFFE__PHASE__TEST ? "TEST" : "TRAIN");
  int rc;
  net->layers = calloc((size_t)p->n + 1, sizeof(kiln_layer *));
  in->layer_storage = calloc((size_t)p->n + 1, sizeof(kiln_layer));
  if (!net->layers || !in->layer_storage) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < p->n; i++) {
    graph_layer *pl = &p->v[i];
    kiln_blob *bottoms[64], *tops[64];
    if (pl->nbottom > 64 || pl->ntop > 64)
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "layer '%s': more than 64 bottoms or tops", pl->name);
    for (int b = 0; b < pl->nbottom; b++) {
      bottoms[b] = find_blob(net, pl->bottom[b]);
      if (!bottoms[b])
        return kiln_errorf(KILN_ERR_INTERNAL, "layer '%s': bottom '%s' vanished", pl->name,
                           pl->bottom[b]);
    }
    for (int t = 0; t < pl->ntop; t++) {
      if (t < pl->nbottom && strcmp(pl->bottom[t], pl->top[t]) == 0) tops[t] = bottoms[t];
      else KILN_TRY(add_blob(net, pl->top[t], &tops[t]));
    }
    kiln_layer *l = &in->layer_storage[i];
    net->layers[net->nlayers++] = l;
    KILN_TRY(kiln_layer_wire(l, pl->lp, pl->ops, pl->name, opt->phase, bottoms, pl->nbottom, tops,
                             pl->ntop));
    l->nthreads = net->nthreads;
    l->config = &net->config;
    KILN_TRY(kiln_layer_choose_backend(l));
    l->rng = &net->rng;
    l->seed = net->seed;
    l->shard_rank = opt->shard_rank;
    l->shard_count = opt->shard_count;
    for (int t = 0; t < pl->ntop; t++) l->loss_weight[t] = pl->loss_weight[t];
    if (pl->ops->setup) {
      rc = pl->ops->setup(l);
      if (rc) return rc;
    }
    rc = pl->ops->reshape(l);
    if (rc) return rc;
  }
  /* A layer working in place on the output of the layer just before, which keeps a copy of
   * that output, reads the copy instead of saving its input (Scale after BatchNorm). */
  for (int i = 0; i + 1 < net->nlayers; i++) {
    kiln_layer *a = net->layers[i], *b = net->layers[i + 1];
    if (a->ops->kept_output && a->ntop == 1 && b->nbottom >= 1 && b->bottom[0] == a->top[0] &&
        b->ntop >= 1 && b->top[0] == b->bottom[0]) {
      b->input_copy = a->ops->kept_output(a);
      KILN_TRY(b->ops->reshape(b));
    }
  }
  KILN_TRY(kiln_net_choose_layouts(net));
  kiln_net_choose_fusion(net);
  kiln_net_share_split_data(net);
  KILN_TRY(check_param_layer_names(net));
  KILN_TRY(setup_params(net));
  need_backward(net, np);
  net->share_data = opt->share_data && !net->config.no_share_data;
  if (net->share_data && net->phase == CAFFE__PHASE__TEST) { /* forward only */
    net->forward_only = true;
    for (int i = 0; i < net->nlayers; i++) {
      net->layer_need_backward[i] = false;
      for (int b = 0; b < net->layers[i]->nbottom; b++) net->layers[i]->propagate_down[b] = false;
    }
  }
  KILN_TRY(find_outputs(net));
  KILN_TRY(check_sparse(net));
  KILN_TRY(kiln_net_choose_recompute(net, opt));
  KILN_TRY(kiln_net_plan_memory(net, opt));
  if (net->config.fault.kind == KILN_FAULT_SLEEP)
    for (int i = 0; i < net->nlayers; i++)
      if (!strcmp(net->layers[i]->name, net->config.fault.layer)) {
        in->fault_layer = i;
        break;
      }
  KILN_TRY(kiln_net_alloc_recompute(net));
  return kiln_net_allocate_and_fill(net);
}

int kiln_net_create(const Caffe__NetParameter *np, const kiln_net_options *opt, kiln_net **out) {
  *out = NULL;
  kiln_net *net = calloc(1, sizeof *net);
  net_internal *in = calloc(1, sizeof *in);
  if (!net || !in) {
    free(net);
    free(in);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  net->internal = in;
  in->fault_layer = -1;
  net->name = xstrdup(np->name && np->name[0] ? np->name : "net");
  net->phase = opt->phase;
  net->seed = opt->seed;
  net->nthreads = opt->nthreads > 0 ? opt->nthreads : kiln_get_num_threads();
  net->config = opt->config ? *opt->config : *kiln_config_defaults();
  const kiln_device *dev = kiln_config_device(&net->config);
  net->device = kiln_device_is_host(dev) ? NULL : dev;
  kiln_rng_seed(&net->rng, opt->seed, 0x6b696c6eULL);
  /* by device, engine and precision, as kiln_layer_choose_backend picks its layers' */
  int rc = !dev ? kiln_errorf(KILN_ERR_UNSUPPORTED, "net '%s': no CUDA device %d (%s)", net->name,
                              net->config.device_index, kiln_cuda_unavailable())
                : kiln_backend_choose(&net->config, net->device, &net->backend);
  if (rc && dev) kiln_error_context(rc, "net '%s': ", net->name);
  if (!rc) rc = build(net, np, opt);
  if (rc) {
    if (opt->source && strncmp(kiln_last_error(), opt->source, strlen(opt->source)) != 0)
      kiln_error_context(rc, "%s: ", opt->source);
    kiln_net_free(net);
    return rc;
  }
  *out = net;
  return KILN_OK;
}

void kiln_net_free(kiln_net *net) {
  if (!net) return;
  net_internal *in = net->internal;
  for (int i = 0; i < net->nlayers; i++) kiln_layer_release(net->layers[i]);
  for (int i = 0; i < net->nblobs; i++) kiln_blob_free(net->blobs[i]);
  if (in) {
    for (int i = 0; i < in->graph.n; i++) kiln_net_graph_layer_free(&in->graph.v[i]);
    free(in->graph.v);
    for (int i = 0; i < in->nsynth; i++)
      protobuf_c_message_free_unpacked(&in->synth[i]->base, NULL);
    free(in->synth);
    free(in->layer_storage);
    free(in->param_owner_blob);
    for (int k = 0; k < in->ndiff_pool && in->diff_pool; k++)
      kiln_net_free_floats(net, in->diff_pool[k]);
    free(in->diff_pool);
    free(in->diff_pool_floats);
    free(in->diff_slot);
    for (int k = 0; k < in->ndata_pool; k++) kiln_blob_free(in->data_pool[k]);
    free(in->data_pool);
    kiln_net_free_recompute(in);
    free(in);
  }
  free(net->layers);
  free(net->layer_need_backward);
  free(net->blobs);
  free(net->learnable);
  free(net->lr_mult);
  free(net->decay_mult);
  free(net->is_state);
  free(net->learnable_offset);
  kiln_net_free_floats(net, net->param_data);
  if (!net->param_diff_placed) kiln_net_free_floats(net, net->param_diff);
  kiln_net_free_floats(net, net->workspace);
  free(net->outputs);
  free(net->output_loss_weight);
  free(net->name);
  free(net);
}

/* ---- running ------------------------------------------------------------------------------- */

int kiln_net_blob_read(const kiln_net *net, const kiln_blob *b, float *out, int64_t n) {
  if (n > b->count) n = b->count;
  if (n <= 0) return KILN_OK;
  return kiln_device_to_host(net->device, out, b->data, sizeof(float) * (size_t)n);
}

int kiln_net_blob_sum(const kiln_net *net, const kiln_blob *b, double *sum) {
  float few[64];
  const float *d = b->data;
  float *copy = NULL;
  if (!kiln_device_is_host(net->device)) {
    copy = b->count <= 64 ? few : malloc(sizeof(float) * (size_t)b->count);
    if (!copy) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    int rc = kiln_device_to_host(net->device, copy, b->data, sizeof(float) * (size_t)b->count);
    if (rc) {
      if (copy != few) free(copy);
      return rc;
    }
    d = copy;
  }
  double s = 0;
  for (int64_t k = 0; k < b->count; k++) s += d[k];
  if (copy != few) free(copy);
  *sum = s;
  return KILN_OK;
}

/* After layers were reshaped at run time: the shared workspace grows if one of them now asks
 * more than the planned maximum (a shape the plan did not foresee), instead of being overrun. */
static int fit_workspace(kiln_net *net) {
  int64_t need = net->workspace_floats;
  for (int i = 0; i < net->nlayers; i++)
    if (net->layers[i]->workspace_floats > need) need = net->layers[i]->workspace_floats;
  if (need == net->workspace_floats) return KILN_OK;
  float *w = kiln_net_alloc_floats(net, need, false);
  if (!w)
    return kiln_errorf(KILN_ERR_NOMEM, "net '%s': cannot grow the workspace to %lld floats",
                       net->name, (long long)need);
  kiln_net_free_floats(net, net->workspace);
  net->workspace = w;
  net->workspace_floats = need;
  for (int i = 0; i < net->nlayers; i++) net->layers[i]->workspace = w;
  return KILN_OK;
}

/* A forward that changed its tops' shapes (a data layer's smaller last batch, Filter's
 * selection) has the layers after it reshaped, whoever runs the layers (kiln time runs them one
 * by one). Shrinking, or growing back to the planned size, never allocates. */
int kiln_net_layer_forward(kiln_net *net, int i) {
  kiln_layer *l = net->layers[i];
  if (l->fused_into) return KILN_OK;
  KILN_TRY(l->ops->forward(l));
  if (l->reshaped) {
    l->reshaped = false;
    for (int j = i + 1; j < net->nlayers; j++) KILN_TRY(net->layers[j]->ops->reshape(net->layers[j]));
    KILN_TRY(fit_workspace(net));
  }
  return KILN_OK;
}

/* A fused group [h, h + fused] runs its head's backward at its last layer, when any of its layers
 * needs backward (the head skips what is not wanted: its input gradient without propagate_down). */
/* A layer without a backward pass (Threshold, ArgMax, Accuracy) asked for the gradient of one of
 * its bottoms: refused when the pass runs, as Caffe's NOT_IMPLEMENTED backward is (a net that
 * is only run forward, in TEST or for deployment, builds and runs). */
static int no_gradient(const kiln_layer *l) {
  for (int b = 0; b < l->nbottom; b++)
    if (l->propagate_down[b])
      return kiln_errorf(KILN_ERR_UNSUPPORTED,
                         "layer '%s' (%s): has no gradient, but its bottom '%s' needs one; set "
                         "propagate_down: false for it",
                         l->name, l->ops->type, l->bottom[b]->name);
  return KILN_OK;
}

/* A TEST net built with shared data has no gradients to write. */
static int refuse_forward_only(const kiln_net *net) {
  return kiln_errorf(KILN_ERR_INVALID,
                     "net '%s' (TEST) was built to run forward only (shared activation data)",
                     net->name);
}

int kiln_net_layer_backward(kiln_net *net, int i) {
  kiln_layer *l = net->layers[i];
  if (net->forward_only) return refuse_forward_only(net);
  KILN_TRY(kiln_net_recompute_for(net, i));
  if (l->fused) return KILN_OK; /* done at the group's last layer */
  if (!l->fused_into) {
    if (!net->layer_need_backward[i]) return KILN_OK;
    return l->ops->backward ? l->ops->backward(l) : no_gradient(l);
  }
  int h = i;
  while (h > 0 && net->layers[h] != l->fused_into) h--;
  if (h + net->layers[h]->fused != i) return KILN_OK;
  bool need = false;
  for (int j = h; j <= i; j++) need |= net->layer_need_backward[j];
  kiln_layer *head = net->layers[h];
  return need && head->ops->backward ? head->ops->backward(head) : KILN_OK;
}

int kiln_net_reshape_inputs(kiln_net *net) {
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    /* an Input layer's reshape would put back the prototxt's shapes */
    if (!l->ops->fed_by_caller) KILN_TRY(l->ops->reshape(l));
  }
  return fit_workspace(net);
}

int kiln_net_forward(kiln_net *net, float *loss) {
  const net_internal *in = net->internal;
  double total = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    int rc = kiln_net_layer_forward(net, i);
    if (rc) return rc;
    if (i == in->fault_layer) kiln_fault_sleep(&net->config.fault);
    for (int t = 0; t < l->ntop; t++)
      if (l->loss_weight[t] != 0) {
        double s = 0;
        KILN_TRY(kiln_net_blob_sum(net, l->top[t], &s));
        total += l->loss_weight[t] * s;
      }
  }
  if (loss) *loss = (float)total;
  return KILN_OK;
}

int kiln_net_backward(kiln_net *net) {
  if (net->forward_only) return refuse_forward_only(net);
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    for (int t = 0; t < l->ntop; t++)
      if (l->loss_weight[t] != 0)
        KILN_TRY(KILN_OP(l, fill, l->top[t]->diff, l->loss_weight[t], l->top[t]->count));
  }
  for (int i = net->nlayers - 1; i >= 0; i--) {
    KILN_TRY(kiln_net_layer_backward(net, i));
    if (net->backward_hook) KILN_TRY(net->backward_hook(net->backward_hook_user, i));
  }
  return KILN_OK;
}

void kiln_net_zero_param_diff(kiln_net *net) {
  kiln_device_set(net->device, net->param_diff, 0, (size_t)net->nparam_floats * sizeof(float));
}

/* b's diff, if it lies in from[0 .. n), moves to the same place in to (addresses compared as
 * integers: the blob's diff may be another buffer) */
static void rebase_diff(kiln_blob *b, const float *from, int64_t n, float *to) {
  uintptr_t d = (uintptr_t)b->diff, f = (uintptr_t)from;
  if (b->diff && d >= f && d < f + (uintptr_t)n * sizeof(float))
    b->diff = to + (d - f) / sizeof(float);
}

void kiln_net_place_param_diff(kiln_net *net, float *to) {
  float *from = net->param_diff;
  if (to == from) return;
  int64_t n = net->nparam_floats;
  memcpy(to, from, (size_t)n * sizeof(float));
  for (int k = 0; k < net->nlearnable; k++) rebase_diff(net->learnable[k], from, n, to);
  for (int i = 0; i < net->nlayers; i++)
    for (int p = 0; p < net->layers[i]->nparam; p++)
      rebase_diff(net->layers[i]->param[p], from, n, to);
  if (!net->param_diff_placed) kiln_free(from);
  net->param_diff = to;
  net->param_diff_placed = true;
}

double kiln_net_forward_flops(const kiln_net *net) {
  double f = 0;
  for (int i = 0; i < net->nlayers; i++) f += net->layers[i]->flops;
  return f;
}

int kiln_net_share_params(kiln_net *dst, const kiln_net *src) {
  for (int i = 0; i < dst->nlayers; i++) {
    kiln_layer *d = dst->layers[i];
    if (!d->nparam) continue;
    kiln_layer *s = kiln_net_layer(src, d->name);
    if (!s) continue;
    if (s->nparam != d->nparam)
      return kiln_errorf(KILN_ERR_SHAPE, "layer '%s': %d parameter blobs in one net, %d in the other",
                         d->name, d->nparam, s->nparam);
    for (int p = 0; p < d->nparam; p++) {
      if (s->param[p]->count != d->param[p]->count)
        return kiln_errorf(KILN_ERR_SHAPE, "layer '%s': parameter %d differs in size between nets",
                           d->name, p);
      kiln_blob_set_view(d->param[p], s->param[p]->data, s->param[p]->diff);
    }
  }
  return KILN_OK;
}

int kiln_net_data_layer_count(const kiln_net *net) {
  int n = 0;
  for (int i = 0; i < net->nlayers; i++) n += net->layers[i]->ops->get_cursor != NULL;
  return n;
}

int kiln_net_get_cursors(const kiln_net *net, uint64_t *cursors) {
  int n = 0;
  for (int i = 0; i < net->nlayers; i++)
    if (net->layers[i]->ops->get_cursor) cursors[n++] = net->layers[i]->ops->get_cursor(net->layers[i]);
  return n;
}

int kiln_net_set_cursors(kiln_net *net, const uint64_t *cursors, int n) {
  /* One cursor per data layer: a count that differs is a snapshot of another net. */
  const int want = kiln_net_data_layer_count(net);
  if (n != want)
    return kiln_errorf(KILN_ERR_INVALID, "%d data cursors for the %d data layers of net '%s'", n,
                       want, net->name);
  int k = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (!l->ops->set_cursor) continue;
    KILN_TRY(l->ops->set_cursor(l, cursors[k++]));
  }
  return KILN_OK;
}

int kiln_net_param_from_text(const char *text, const char *source, Caffe__NetParameter **out) {
  ProtobufCMessage *m;
  int rc = kiln_text_parse(text, strlen(text), source, &caffe__net_parameter__descriptor, &m);
  if (!rc) rc = kiln_net_param_upgrade((Caffe__NetParameter *)m, source, NULL);
  if (rc && m) protobuf_c_message_free_unpacked(m, NULL);
  *out = rc ? NULL : (Caffe__NetParameter *)m;
  return rc;
}
