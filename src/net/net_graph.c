/* The layer graph (steps 1 to 3 of the construction in net.c, and the naming rule of step 4): the
 * NetParameter's layers for this net state, by name, before any blob exists, each bottom resolved
 * to the layer and top that last produced it, with the Splits inserted. It works on names because
 * where a Split goes is known only once every consumer of each top has been counted. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "net_internal.h"

void kiln_net_graph_layer_free(graph_layer *p) {
  free(p->name);
  for (int i = 0; i < p->nbottom; i++) free(p->bottom[i]);
  for (int i = 0; i < p->ntop; i++) free(p->top[i]);
  free(p->bottom);
  free(p->top);
  free(p->loss_weight);
  free(p->bottom_src_layer);
  free(p->bottom_src_top);
  free(p->top_uses);
}

static graph_layer *graph_push(layer_graph *p) {
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 16;
    graph_layer *v = realloc(p->v, (size_t)cap * sizeof *v);
    if (!v) return NULL;
    p->v = v;
    p->cap = cap;
  }
  graph_layer *l = &p->v[p->n++];
  memset(l, 0, sizeof *l);
  return l;
}

static int plan_layer_alloc(graph_layer *l, int nbottom, int ntop) {
  l->nbottom = nbottom;
  l->ntop = ntop;
  l->bottom = calloc((size_t)nbottom + 1, sizeof(char *));
  l->top = calloc((size_t)ntop + 1, sizeof(char *));
  l->loss_weight = calloc((size_t)ntop + 1, sizeof(float));
  l->bottom_src_layer = calloc((size_t)nbottom + 1, sizeof(int));
  l->bottom_src_top = calloc((size_t)nbottom + 1, sizeof(int));
  l->top_uses = calloc((size_t)ntop + 1, sizeof(int));
  if (!l->bottom || !l->top || !l->loss_weight || !l->bottom_src_layer || !l->bottom_src_top ||
      !l->top_uses)
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

/* ---- state rules ------------------------------------------------------------------------ */

static bool has_stage(const kiln_net_options *opt, const char *s) {
  for (int i = 0; i < opt->nstages; i++)
    if (strcmp(opt->stages[i], s) == 0) return true;
  return false;
}

static bool rule_matches(const Caffe__NetStateRule *r, const kiln_net_options *opt) {
  if (r->has_phase && (int)r->phase != opt->phase) return false;
  if (r->has_min_level && opt->level < r->min_level) return false;
  if (r->has_max_level && opt->level > r->max_level) return false;
  for (size_t i = 0; i < r->n_stage; i++)
    if (!has_stage(opt, r->stage[i])) return false;
  for (size_t i = 0; i < r->n_not_stage; i++)
    if (has_stage(opt, r->not_stage[i])) return false;
  return true;
}

static int layer_included(const Caffe__LayerParameter *lp, const kiln_net_options *opt,
                          bool *included) {
  if (lp->n_include && lp->n_exclude)
    return kiln_errorf(KILN_ERR_INVALID, "layer '%s': give include or exclude rules, not both",
                       lp->name ? lp->name : "");
  if (lp->n_include) {
    *included = false;
    for (size_t i = 0; i < lp->n_include; i++)
      if (rule_matches(lp->include[i], opt)) *included = true;
  } else {
    *included = true;
    for (size_t i = 0; i < lp->n_exclude; i++)
      if (rule_matches(lp->exclude[i], opt)) *included = false;
  }
  return KILN_OK;
}

/* ---- messages kiln makes itself --------------------------------------------------------- */

static Caffe__LayerParameter *synth_layer(net_internal *in, const char *name, const char *type) {
  Caffe__LayerParameter **v = realloc(in->synth, (size_t)(in->nsynth + 1) * sizeof *v);
  if (!v) return NULL;
  in->synth = v;
  Caffe__LayerParameter *lp = malloc(sizeof *lp);
  if (!lp) return NULL;
  caffe__layer_parameter__init(lp);
  lp->name = xstrdup(name);
  lp->type = xstrdup(type);
  in->synth[in->nsynth++] = lp;
  return lp;
}

/* Deploy headers: `input: "data" input_dim: 1 input_dim: 3 ...` or input_shape blocks. */
static int add_deploy_inputs(net_internal *in, const Caffe__NetParameter *np) {
  if (np->n_input == 0) return KILN_OK;
  bool by_dim = np->n_input_dim > 0;
  if (by_dim ? np->n_input_dim != 4 * np->n_input : np->n_input_shape != np->n_input)
    return kiln_errorf(KILN_ERR_INVALID,
                       "net '%s': %zu input(s) need %s (got %zu input_dim, %zu input_shape)",
                       np->name ? np->name : "", np->n_input,
                       by_dim ? "4 input_dim each" : "one input_shape each", np->n_input_dim,
                       np->n_input_shape);
  Caffe__LayerParameter *lp = synth_layer(in, "input", "Input");
  if (!lp) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  lp->input_param = malloc(sizeof *lp->input_param);
  lp->top = calloc(np->n_input, sizeof(char *));
  if (!lp->input_param || !lp->top) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  caffe__input_parameter__init(lp->input_param);
  lp->input_param->shape = calloc(np->n_input, sizeof(Caffe__BlobShape *));
  if (!lp->input_param->shape) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < np->n_input; i++) {
    lp->top[lp->n_top++] = xstrdup(np->input[i]);
    Caffe__BlobShape *s = malloc(sizeof *s);
    if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    caffe__blob_shape__init(s);
    lp->input_param->shape[lp->input_param->n_shape++] = s;
    size_t nd = by_dim ? 4 : np->input_shape[i]->n_dim;
    s->dim = calloc(nd + 1, sizeof(int64_t));
    if (!s->dim) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    for (size_t d = 0; d < nd; d++)
      s->dim[d] = by_dim ? np->input_dim[4 * i + d] : np->input_shape[i]->dim[d];
    s->n_dim = nd;
  }
  return KILN_OK;
}

/* ---- the graph ---------------------------------------------------------------------------- */

static int find_type(const Caffe__LayerParameter *lp, const kiln_layer_ops **ops) {
  *ops = kiln_layer_find(lp->type);
  if (*ops) return KILN_OK;
  const kiln_caffe_missing_layer *m = kiln_caffe_missing_by_type(lp->type);
  if (m)
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "layer '%s': Caffe's layer type '%s' is not in kiln%s%s (docs/caffe-layers.md)",
                       lp->name ? lp->name : "", m->type, m->note ? ": " : "",
                       m->note ? m->note : "");
  char known[2048] = "";
  size_t used = 0;
  for (const char *const *t = kiln_layer_type_names(); *t && used < sizeof known; t++)
    used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", used ? ", " : "", *t);
  return kiln_errorf(KILN_ERR_UNSUPPORTED, "layer '%s': unknown layer type '%s' (known: %s)",
                     lp->name ? lp->name : "", lp->type ? lp->type : "", known);
}

/* Every float and double of a layer's settings, in nested messages too, must be a finite number:
 * a NaN or an infinity (`power: nan`, `scale: inf`) would only surface later as a diverged loss
 * that names no field. `path` holds the dotted name so far; stored weights (blobs) are left to
 * the weights' own checks. */
static int finite_settings(const ProtobufCMessage *m, const char *layer, const char *type,
                           char *path, size_t used, size_t cap) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m + f->offset;
    size_t n = f->label == PROTOBUF_C_LABEL_REPEATED
                   ? *(const size_t *)((const char *)m + f->quantifier_offset)
                   : 1;
    const char *elems = f->label == PROTOBUF_C_LABEL_REPEATED ? *(const char *const *)base : base;
    int w = snprintf(path + used, cap - used, "%s%s", used ? "." : "", f->name);
    size_t sub_used = w > 0 && used + (size_t)w < cap ? used + (size_t)w : used;
    if (f->type == PROTOBUF_C_TYPE_FLOAT || f->type == PROTOBUF_C_TYPE_DOUBLE) {
      for (size_t k = 0; k < n; k++) {
        double v = f->type == PROTOBUF_C_TYPE_FLOAT ? ((const float *)elems)[k]
                                                    : ((const double *)elems)[k];
        if (!isfinite(v))
          return kiln_errorf(KILN_ERR_INVALID,
                             "layer '%s' (%s): %s is %g; a layer's settings must be finite "
                             "numbers", layer, type, path, v);
      }
    } else if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->descriptor != &caffe__blob_proto__descriptor) {
      for (size_t k = 0; k < n; k++) {
        const ProtobufCMessage *sub = ((const ProtobufCMessage *const *)elems)[k];
        if (sub) KILN_TRY(finite_settings(sub, layer, type, path, sub_used, cap));
      }
    }
    path[used] = '\0';
  }
  return KILN_OK;
}

static int graph_add(layer_graph *p, const Caffe__LayerParameter *lp) {
  graph_layer *l = graph_push(p);
  if (!l) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->lp = lp;
  l->name = xstrdup(lp->name && lp->name[0] ? lp->name : lp->type);
  KILN_TRY(find_type(lp, &l->ops));
  char path[512] = "";
  KILN_TRY(finite_settings(&lp->base, l->name, l->ops->type, path, 0, sizeof path));
  /* A loss layer that names no top gets one, as Caffe's AutoTopBlobs gives it (Caffe calls it
   * "(automatic)"; the layer's name is added here, so that two such tops stay apart). */
  const bool automatic = lp->n_top == 0 && l->ops->is_loss;
  const size_t ntop = automatic ? 1 : lp->n_top;
  KILN_TRY(plan_layer_alloc(l, (int)lp->n_bottom, (int)ntop));
  for (size_t i = 0; i < lp->n_bottom; i++) l->bottom[i] = xstrdup(lp->bottom[i]);
  for (size_t i = 0; i < lp->n_top; i++) l->top[i] = xstrdup(lp->top[i]);
  if (automatic) {
    char name[512];
    snprintf(name, sizeof name, "%s (automatic)", l->name);
    l->top[0] = xstrdup(name);
  }
  if (lp->n_loss_weight && lp->n_loss_weight != ntop)
    return kiln_errorf(KILN_ERR_INVALID, "layer '%s': %zu loss_weight values for %zu tops", l->name,
                       lp->n_loss_weight, ntop);
  for (size_t i = 0; i < ntop; i++)
    l->loss_weight[i] = lp->n_loss_weight ? lp->loss_weight[i] : (l->ops->is_loss && i == 0);
  return KILN_OK;
}

/* Blob names to the layer and top that last produced them: an open-addressed table (names are
 * borrowed from the graph), so that resolving a net of N layers takes time linear in N. */
typedef struct {
  const char *name;
  int layer, top;
} producer;

typedef struct {
  producer *slot;
  size_t mask;
} producers;

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

static producer *producer_slot(producers *m, const char *name) {
  size_t i = (size_t)name_hash(name) & m->mask;
  while (m->slot[i].name && strcmp(m->slot[i].name, name) != 0) i = (i + 1) & m->mask;
  return &m->slot[i];
}

/* Resolves each bottom to the layer and top that last produced it, and counts consumers. */
static int graph_resolve(layer_graph *p, const char *source, int phase) {
  size_t ntops = 0;
  for (int i = 0; i < p->n; i++) ntops += (size_t)p->v[i].ntop;
  producers m = {.mask = 15};
  while (m.mask + 1 < 2 * ntops) m.mask = m.mask * 2 + 1;
  m.slot = calloc(m.mask + 1, sizeof *m.slot);
  if (!m.slot) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = KILN_OK;
  for (int i = 0; i < p->n && !rc; i++) {
    graph_layer *l = &p->v[i];
    for (int b = 0; b < l->nbottom; b++) {
      const producer *src = producer_slot(&m, l->bottom[b]);
      if (!src->name) {
        rc = kiln_errorf(KILN_ERR_INVALID,
                         "%s%slayer '%s': bottom '%s' is not produced by any earlier layer in "
                         "phase %s",
                         source ? source : "", source ? ": " : "", l->name, l->bottom[b],
                         phase == CAFFE__PHASE__TRAIN ? "TRAIN" : "TEST");
        break;
      }
      l->bottom_src_layer[b] = src->layer;
      l->bottom_src_top[b] = src->top;
      p->v[src->layer].top_uses[src->top]++;
    }
    for (int t = 0; t < l->ntop && !rc; t++) {
      if (l->loss_weight[t] != 0) l->top_uses[t]++;
      /* A name may be produced again only in place (as the bottom at the same index), and only
       * by a layer whose table says it computes correctly so (kiln_layer_ops.in_place): one that
       * changes the shape, or reads its input after writing its output, would not. Caffe
       * refuses those too. */
      bool in_place = t < l->nbottom && strcmp(l->bottom[t], l->top[t]) == 0;
      if (in_place && !l->ops->in_place) {
        rc = kiln_errorf(KILN_ERR_INVALID,
                         "%s%slayer '%s' (%s): cannot run in place (top '%s' is its bottom); give "
                         "the top a name of its own",
                         source ? source : "", source ? ": " : "", l->name, l->ops->type,
                         l->top[t]);
        break;
      }
      producer *slot = producer_slot(&m, l->top[t]);
      if (!in_place && slot->name) {
        rc = slot->layer == i
                 ? kiln_errorf(KILN_ERR_INVALID, "layer '%s': top '%s' appears twice", l->name,
                               l->top[t])
                 : kiln_errorf(KILN_ERR_INVALID,
                               "%s%slayer '%s': top '%s' is already produced by layer '%s'; a "
                               "layer may reuse a blob name only in place (as its bottom at the "
                               "same position)",
                               source ? source : "", source ? ": " : "", l->name, l->top[t],
                               p->v[slot->layer].name);
        break;
      }
      *slot = (producer){.name = l->top[t], .layer = i, .top = t};
    }
  }
  free(m.slot);
  return rc;
}

static char *split_blob_name(const char *layer, const char *blob, int top, int k) {
  size_t n = strlen(layer) + strlen(blob) + 48;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s_%s_%d_split_%d", blob, layer, top, k);
  return s;
}

/* Rebuilds the graph with a Split after every top used more than once. */
static int graph_insert_splits(net_internal *in, layer_graph *out) {
  layer_graph *p = &in->graph;
  int total_tops = 0;
  for (int i = 0; i < p->n; i++) total_tops += p->v[i].ntop;
  int *next_split = calloc((size_t)total_tops + 1, sizeof(int));
  int *top_base = calloc((size_t)p->n + 1, sizeof(int));
  if (!next_split || !top_base) {
    free(next_split);
    free(top_base);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int i = 1; i < p->n; i++) top_base[i] = top_base[i - 1] + p->v[i - 1].ntop;
  int rc = KILN_OK;
  for (int i = 0; i < p->n && !rc; i++) {
    graph_layer *src = &p->v[i];
    graph_layer *l = graph_push(out);
    if (!l) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      break;
    }
    int li = out->n - 1;
    l->lp = src->lp;
    l->ops = src->ops;
    l->name = xstrdup(src->name);
    if ((rc = plan_layer_alloc(l, src->nbottom, src->ntop))) break;
    for (int b = 0; b < src->nbottom; b++) {
      int sl = src->bottom_src_layer[b], st = src->bottom_src_top[b];
      if (p->v[sl].top_uses[st] > 1)
        l->bottom[b] = split_blob_name(p->v[sl].name, src->bottom[b], st,
                                       next_split[top_base[sl] + st]++);
      else
        l->bottom[b] = xstrdup(src->bottom[b]);
    }
    for (int t = 0; t < src->ntop; t++) {
      l->top[t] = xstrdup(src->top[t]);
      l->loss_weight[t] = src->loss_weight[t];
    }
    for (int t = 0; t < src->ntop && !rc; t++) {
      int uses = src->top_uses[t];
      if (uses <= 1) continue;
      char lname[1024];
      snprintf(lname, sizeof lname, "%s_%s_%d_split", src->top[t], src->name, t);
      Caffe__LayerParameter *slp = synth_layer(in, lname, "Split");
      graph_layer *s = graph_push(out);
      if (!slp || !s) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        break;
      }
      l = &out->v[li]; /* graph_push may have moved the array */
      s->lp = slp;
      s->ops = kiln_layer_find(slp->type);
      s->name = xstrdup(lname);
      if ((rc = plan_layer_alloc(s, 1, uses))) break;
      s->bottom[0] = xstrdup(src->top[t]);
      for (int k = 0; k < uses; k++) s->top[k] = split_blob_name(src->name, src->top[t], t, k);
      if (src->loss_weight[t] != 0) {
        /* The loss moves to the Split's first top; consumers take the others. */
        s->loss_weight[0] = src->loss_weight[t];
        l->loss_weight[t] = 0;
        next_split[top_base[i] + t] = 1;
      }
    }
  }
  free(next_split);
  free(top_base);
  return rc;
}

/* ---- the whole graph ----------------------------------------------------------------------- */

int kiln_net_build_graph(net_internal *in, const Caffe__NetParameter *np,
                         const kiln_net_options *opt) {
  KILN_TRY(add_deploy_inputs(in, np));
  for (int i = 0; i < in->nsynth; i++) KILN_TRY(graph_add(&in->graph, in->synth[i]));
  for (size_t i = 0; i < np->n_layer; i++) {
    bool inc = false;
    int rc = layer_included(np->layer[i], opt, &inc);
    if (rc) return rc;
    if (inc) KILN_TRY(graph_add(&in->graph, np->layer[i]));
  }
  KILN_TRY(graph_resolve(&in->graph, opt->source, opt->phase));
  layer_graph full = {0};
  int rc = graph_insert_splits(in, &full);
  for (int i = 0; i < in->graph.n; i++) kiln_net_graph_layer_free(&in->graph.v[i]);
  free(in->graph.v);
  in->graph = full;
  return rc;
}
