/* Net construction and execution (see include/kiln/net.h). Construction follows Caffe:
 *   1. keep the layers whose include/exclude rules match the net state;
 *   2. turn a deploy header (input: / input_dim: / input_shape:) into an Input layer;
 *   3. insert Split layers where one top feeds several bottoms (or a bottom and a loss), so each
 *      consumer writes its own gradient and the Split adds them up;
 *   4. wire blobs by name (a top may reuse a name only in place), set up and shape each layer;
 *   5. parameters: ParamSpec names share blobs; owners get slots in one flat buffer;
 *   6. decide which layers need backward (they have learnable parameters or gradient-needing
 *      inputs, and something they produce reaches a loss);
 *   7. plan memory and refuse a net that would not fit, then allocate and fill. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "net_internal.h"


/* One layer of the build plan: names only, before any blob exists. */
typedef struct {
  const Caffe__LayerParameter *lp;
  const kiln_layer_ops *ops;
  char *name;
  int nbottom, ntop;
  char **bottom, **top;
  float *loss_weight; /* per top */
  int *bottom_src_layer, *bottom_src_top;
  int *top_uses; /* consumers of each top (+1 if it carries a loss) */
} plan_layer;

typedef struct {
  plan_layer *v;
  int n, cap;
} plan;

typedef struct {
  plan plan;
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
  int fault_layer;              /* the layer whose forward sleeps (config.fault); -1: none */
} net_internal;

static char *xstrdup(const char *s) { return kiln_strdup(s ? s : ""); }

static void plan_layer_free(plan_layer *p) {
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

static plan_layer *plan_push(plan *p) {
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 16;
    plan_layer *v = realloc(p->v, (size_t)cap * sizeof *v);
    if (!v) return NULL;
    p->v = v;
    p->cap = cap;
  }
  plan_layer *l = &p->v[p->n++];
  memset(l, 0, sizeof *l);
  return l;
}

static int plan_layer_alloc(plan_layer *l, int nbottom, int ntop) {
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

/* ---- the plan ----------------------------------------------------------------------------- */

static int find_type(const Caffe__LayerParameter *lp, const kiln_layer_ops **ops) {
  *ops = kiln_layer_find(lp->type);
  if (*ops) return KILN_OK;
  char known[2048] = "";
  size_t used = 0;
  for (const char *const *t = kiln_layer_type_names(); *t && used < sizeof known; t++)
    used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", used ? ", " : "", *t);
  return kiln_errorf(KILN_ERR_UNSUPPORTED, "layer '%s': unknown layer type '%s' (known: %s)",
                     lp->name ? lp->name : "", lp->type ? lp->type : "", known);
}

static int plan_add(plan *p, const Caffe__LayerParameter *lp) {
  plan_layer *l = plan_push(p);
  if (!l) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->lp = lp;
  l->name = xstrdup(lp->name && lp->name[0] ? lp->name : lp->type);
  KILN_TRY(find_type(lp, &l->ops));
  KILN_TRY(plan_layer_alloc(l, (int)lp->n_bottom, (int)lp->n_top));
  for (size_t i = 0; i < lp->n_bottom; i++) l->bottom[i] = xstrdup(lp->bottom[i]);
  for (size_t i = 0; i < lp->n_top; i++) l->top[i] = xstrdup(lp->top[i]);
  if (lp->n_loss_weight && lp->n_loss_weight != lp->n_top)
    return kiln_errorf(KILN_ERR_INVALID, "layer '%s': %zu loss_weight values for %zu tops", l->name,
                       lp->n_loss_weight, lp->n_top);
  for (size_t i = 0; i < lp->n_top; i++)
    l->loss_weight[i] = lp->n_loss_weight ? lp->loss_weight[i] : (l->ops->is_loss && i == 0);
  return KILN_OK;
}

/* Resolves each bottom to the layer and top that last produced it, and counts consumers. */
static int plan_resolve(plan *p, const char *source, int phase) {
  for (int i = 0; i < p->n; i++) {
    plan_layer *l = &p->v[i];
    for (int b = 0; b < l->nbottom; b++) {
      int src = -1, src_top = -1;
      for (int j = i - 1; j >= 0 && src < 0; j--)
        for (int t = 0; t < p->v[j].ntop; t++)
          if (strcmp(p->v[j].top[t], l->bottom[b]) == 0) {
            src = j;
            src_top = t;
            break;
          }
      if (src < 0)
        return kiln_errorf(KILN_ERR_INVALID,
                           "%s%slayer '%s': bottom '%s' is not produced by any earlier layer in "
                           "phase %s",
                           source ? source : "", source ? ": " : "", l->name, l->bottom[b],
                           phase == CAFFE__PHASE__TRAIN ? "TRAIN" : "TEST");
      l->bottom_src_layer[b] = src;
      l->bottom_src_top[b] = src_top;
      p->v[src].top_uses[src_top]++;
    }
    for (int t = 0; t < l->ntop; t++) {
      if (l->loss_weight[t] != 0) l->top_uses[t]++;
      /* A name may be produced again only in place (as the bottom at the same index). */
      bool in_place = t < l->nbottom && strcmp(l->bottom[t], l->top[t]) == 0;
      if (in_place) continue;
      for (int j = 0; j < i; j++)
        for (int u = 0; u < p->v[j].ntop; u++)
          if (strcmp(p->v[j].top[u], l->top[t]) == 0)
            return kiln_errorf(KILN_ERR_INVALID,
                               "%s%slayer '%s': top '%s' is already produced by layer '%s'; a "
                               "layer may reuse a blob name only in place (as its bottom at the "
                               "same position)",
                               source ? source : "", source ? ": " : "", l->name, l->top[t],
                               p->v[j].name);
      for (int u = 0; u < t; u++)
        if (strcmp(l->top[u], l->top[t]) == 0)
          return kiln_errorf(KILN_ERR_INVALID, "layer '%s': top '%s' appears twice", l->name,
                             l->top[t]);
    }
  }
  return KILN_OK;
}

static char *split_blob_name(const char *layer, const char *blob, int top, int k) {
  size_t n = strlen(layer) + strlen(blob) + 48;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s_%s_%d_split_%d", blob, layer, top, k);
  return s;
}

/* Rebuilds the plan with a Split after every top used more than once. */
static int plan_insert_splits(net_internal *in, plan *out) {
  plan *p = &in->plan;
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
    plan_layer *src = &p->v[i];
    plan_layer *l = plan_push(out);
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
      plan_layer *s = plan_push(out);
      if (!slp || !s) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        break;
      }
      l = &out->v[li]; /* plan_push may have moved the array */
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

/* ---- building ------------------------------------------------------------------------------ */

static kiln_blob *find_blob(kiln_net *net, const char *name) {
  for (int i = net->nblobs - 1; i >= 0; i--)
    if (strcmp(net->blobs[i]->name, name) == 0) return net->blobs[i];
  return NULL;
}

kiln_blob *kiln_net_blob(const kiln_net *net, const char *name) {
  return find_blob((kiln_net *)net, name);
}

kiln_layer *kiln_net_layer(const kiln_net *net, const char *name) {
  for (int i = 0; i < net->nlayers; i++)
    if (strcmp(net->layers[i]->name, name) == 0) return net->layers[i];
  return NULL;
}

static int add_blob(kiln_net *net, const char *name, kiln_blob **out) {
  kiln_blob **v = realloc(net->blobs, (size_t)(net->nblobs + 1) * sizeof *v);
  if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  net->blobs = v;
  kiln_blob *b = kiln_blob_new(name);
  if (!b) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  b->defer_alloc = true;
  net->blobs[net->nblobs++] = b;
  *out = b;
  return KILN_OK;
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

static bool blob_in(kiln_blob *const *v, int n, const kiln_blob *b) {
  for (int k = 0; k < n; k++)
    if (v[k] == b) return true;
  return false;
}

/* `v` holds at most net->nblobs distinct blobs; in-place layers name the same blob again and
 * again, so only new ones are added. */
static void add_blob_once(kiln_blob **v, int *n, kiln_blob *b) {
  if (!blob_in(v, *n, b)) v[(*n)++] = b;
}

static void need_backward(kiln_net *net, const Caffe__NetParameter *np) {
  /* Forward: which blobs carry gradients. */
  kiln_blob **needs = calloc((size_t)net->nblobs + 1, sizeof *needs);
  int nneeds = 0;
  net->layer_need_backward = calloc((size_t)net->nlayers + 1, sizeof(bool));
  if (!needs || !net->layer_need_backward) {
    free(needs);
    return;
  }
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
     * loss layer's labels); it does not make the tops carry gradients, or a label that passed
     * through a Split would be asked for a gradient downstream. */
    bool forced_any = false;
    for (int b = 0; b < l->nbottom; b++) {
      bool bn = blob_in(needs, nneeds, l->bottom[b]);
      bool fb = np->force_backward && !l->ops->is_data && !(l->ops->is_loss && b > 0);
      if (b < (int)l->lp->n_propagate_down && !l->lp->propagate_down[b]) bn = fb = false;
      l->propagate_down[b] = bn || fb;
      need |= bn;
      forced_any |= fb;
    }
    net->layer_need_backward[i] = need || forced_any;
    if (need)
      for (int t = 0; t < l->ntop; t++) add_blob_once(needs, &nneeds, l->top[t]);
  }
  /* Backward: only what reaches a loss. */
  nneeds = 0;
  for (int i = net->nlayers - 1; i >= 0; i--) {
    kiln_layer *l = net->layers[i];
    bool contributes = false;
    for (int t = 0; t < l->ntop; t++) {
      if (l->loss_weight[t] != 0) contributes = true;
      contributes |= blob_in(needs, nneeds, l->top[t]);
    }
    if (!contributes) {
      net->layer_need_backward[i] = false;
      for (int b = 0; b < l->nbottom; b++) l->propagate_down[b] = false;
    } else {
      for (int b = 0; b < l->nbottom; b++) add_blob_once(needs, &nneeds, l->bottom[b]);
    }
  }
  free(needs);
}

static const char *human_bytes(int64_t b, char *buf, size_t n) {
  if (b >= (1LL << 30)) snprintf(buf, n, "%.2f GiB", b / (double)(1LL << 30));
  else if (b >= (1LL << 20)) snprintf(buf, n, "%.1f MiB", b / (double)(1LL << 20));
  else snprintf(buf, n, "%.1f KiB", b / 1024.0);
  return buf;
}

/* Which activation gradients may share a buffer. In backward (layers in reverse order) a blob's
 * diff is first written by the last layer that reads the blob in forward and last read by the
 * first layer that writes it (its producer): it lives over the layer interval [first, last]
 * (a loss top from the start of backward, when its diff is set to the loss weight). Blobs whose
 * intervals do not overlap can use one buffer. Only blobs whose diff every consumer writes take
 * part: a diff nobody writes must stay zero (a top only Accuracy reads, a bottom with
 * propagate_down: false, an output that is not a loss), so those keep their own. Greedy, in
 * backward order, best-fitting free buffer first. */
static int plan_diff_sharing(kiln_net *net, const kiln_net_options *opt) {
  net_internal *in = net->internal;
  if (!opt->share_diffs || net->nblobs == 0) return KILN_OK;
  int n = net->nblobs;
  int *first = malloc(sizeof(int) * (size_t)n), *last = malloc(sizeof(int) * (size_t)n);
  int *order = malloc(sizeof(int) * (size_t)n), *busy_until = malloc(sizeof(int) * (size_t)(n + 1));
  bool *ok = malloc(sizeof(bool) * (size_t)n);
  in->diff_slot = malloc(sizeof(int) * (size_t)n);
  in->diff_pool_floats = calloc((size_t)n + 1, sizeof(int64_t));
  if (!first || !last || !order || !busy_until || !ok || !in->diff_slot || !in->diff_pool_floats) {
    free(first), free(last), free(order), free(busy_until), free(ok);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    first[i] = INT32_MAX, last[i] = -1, ok[i] = true, in->diff_slot[i] = -1;
  }
  for (int j = 0; j < net->nlayers; j++) {
    kiln_layer *l = net->layers[j];
    const int jb = j + l->fused; /* where its backward runs (a fused group's last layer) */
    for (int i = 0; i < n; i++) {
      kiln_blob *b = net->blobs[i];
      bool touches = false;
      for (int t = 0; t < l->ntop; t++)
        if (l->top[t] == b) {
          touches = true;
          if (l->loss_weight[t] != 0) last[i] = net->nlayers; /* set when backward starts */
        }
      for (int k = 0; k < l->nbottom; k++)
        if (l->bottom[k] == b) {
          touches = true;
          if (!net->layer_need_backward[j] || !l->propagate_down[k] || !l->ops->backward)
            ok[i] = false;
        }
      if (!touches) continue;
      if (j < first[i]) first[i] = j;
      if (jb > last[i]) last[i] = jb;
    }
  }
  for (int o = 0; o < net->noutputs; o++)
    if (net->output_loss_weight[o] == 0)
      for (int i = 0; i < n; i++)
        if (net->blobs[i] == net->outputs[o]) ok[i] = false;
  int m = 0;
  for (int i = 0; i < n; i++)
    if (ok[i] && last[i] >= 0 && net->blobs[i]->count > 0 && !net->blobs[i]->no_diff) order[m++] = i;
  /* backward order: the blob whose diff is written first comes first */
  for (int a = 1; a < m; a++)
    for (int b = a; b > 0 && last[order[b]] > last[order[b - 1]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  int slots = 0;
  for (int a = 0; a < m; a++) {
    int i = order[a];
    int64_t need = net->blobs[i]->count;
    int best = -1;
    for (int k = 0; k < slots; k++) {
      if (busy_until[k] <= last[i]) continue; /* its blob is still live when this one starts */
      if (best < 0) {
        best = k;
        continue;
      }
      int64_t have = in->diff_pool_floats[k], bh = in->diff_pool_floats[best];
      /* the smallest that fits, else the largest (it grows least) */
      if ((have >= need && (bh < need || have < bh)) || (bh < need && have > bh)) best = k;
    }
    if (best < 0) best = slots++;
    if (in->diff_pool_floats[best] < need) in->diff_pool_floats[best] = need;
    busy_until[best] = first[i];
    in->diff_slot[i] = best;
  }
  in->ndiff_pool = slots;
  free(first), free(last), free(order), free(busy_until), free(ok);
  return KILN_OK;
}

static int plan_memory(kiln_net *net, const kiln_net_options *opt) {
  kiln_memory_plan *m = &net->memory;
  memset(m, 0, sizeof *m);
  for (int k = 0; k < net->nlearnable; k++) m->params += net->learnable[k]->count * 4;
  m->grads = m->params;
  m->history = m->params * opt->history_per_param;
  KILN_TRY(plan_diff_sharing(net, opt));
  net_internal *in = net->internal;
  for (int i = 0; i < net->nblobs; i++)
    m->activations += net->blobs[i]->count * ((net->blobs[i]->data_of ? 0 : 4) +
                                              (in->diff_slot && in->diff_slot[i] >= 0 ? 0 : 4));
  for (int k = 0; k < in->ndiff_pool; k++) m->activations += in->diff_pool_floats[k] * 4;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    for (int b = 0; b < l->nbuffer; b++) m->buffers += l->buffer[b]->count * 4; /* data only */
    if (l->workspace_floats > net->workspace_floats) net->workspace_floats = l->workspace_floats;
    m->data_queues += l->extra_bytes;
  }
  m->workspace = net->workspace_floats * 4;
  m->total = m->params + m->grads + m->history + m->activations + m->buffers + m->workspace +
             m->data_queues;
  uint64_t limit = opt->max_memory ? opt->max_memory : kiln_mem_available();
  if (limit && (uint64_t)m->total > limit) {
    const char *names[] = {"parameters", "gradients", "solver history", "activations",
                           "layer buffers", "workspace", "data prefetch queues"};
    int64_t parts[] = {m->params, m->grads, m->history, m->activations, m->buffers, m->workspace,
                       m->data_queues};
    int big = 0;
    for (int i = 1; i < 7; i++)
      if (parts[i] > parts[big]) big = i;
    char a[32], b[32], c[32];
    const char *hint = big == 3 ? " (reduce batch_size)" : big <= 2 ? " (a smaller model)" : "";
    return kiln_errorf(KILN_ERR_NOMEM,
                       "net '%s' (%s) needs %s but the memory limit is %s%s; the largest part is "
                       "%s: %s%s",
                       net->name, net->phase == CAFFE__PHASE__TRAIN ? "TRAIN" : "TEST",
                       human_bytes(m->total, a, sizeof a), human_bytes((int64_t)limit, b, sizeof b),
                       opt->max_memory ? " (--max-memory)" : " (memory available on this machine)",
                       names[big], human_bytes(parts[big], c, sizeof c), hint);
  }
  return KILN_OK;
}

static int allocate_and_fill(kiln_net *net) {
  net_internal *in = net->internal;
  int64_t total = 0;
  for (int k = 0; k < net->nlearnable; k++) {
    net->learnable_offset[k] = total;
    total += (net->learnable[k]->count + 15) & ~(int64_t)15; /* 64-byte aligned slots */
  }
  net->nparam_floats = total;
  /* huge pages: every step streams these, and MPI pins them for its single-copy transfers */
  net->param_data = kiln_alloc_huge((size_t)total * sizeof(float));
  net->param_diff = kiln_alloc_huge((size_t)total * sizeof(float));
  net->workspace = kiln_alloc((size_t)net->workspace_floats * sizeof(float));
  if (!net->param_data || !net->param_diff || !net->workspace)
    return kiln_errorf(KILN_ERR_NOMEM, "net '%s': cannot allocate parameters", net->name);
  for (int k = 0; k < net->nlearnable; k++)
    kiln_blob_set_view(net->learnable[k], net->param_data + net->learnable_offset[k],
                       net->param_diff + net->learnable_offset[k]);
  int slot = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    l->workspace = net->workspace;
    for (int p = 0; p < l->nparam; p++, slot++) {
      kiln_blob *o = in->param_owner_blob[slot];
      if (o == l->param[p]) {
        int rc = kiln_fill(o, l->param_filler[p], l->param_default_value[p], &net->rng);
        if (rc) return kiln_error_context(rc, "layer '%s': ", l->name);
      } else {
        kiln_blob_set_view(l->param[p], o->data, o->diff);
      }
    }
    for (int b = 0; b < l->nbuffer; b++) KILN_TRY(kiln_blob_alloc(l->buffer[b]));
  }
  if (in->ndiff_pool) {
    in->diff_pool = calloc((size_t)in->ndiff_pool, sizeof(float *));
    if (!in->diff_pool) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    for (int k = 0; k < in->ndiff_pool; k++)
      if (!(in->diff_pool[k] = kiln_alloc((size_t)in->diff_pool_floats[k] * sizeof(float))))
        return kiln_errorf(KILN_ERR_NOMEM, "net '%s': cannot allocate gradients", net->name);
  }
  for (int i = 0; i < net->nblobs; i++) {
    kiln_blob *b = net->blobs[i];
    int k = in->diff_slot ? in->diff_slot[i] : -1;
    if (k >= 0) {
      b->no_diff = true; /* data only; the diff is the pool's */
      KILN_TRY(kiln_blob_alloc(b));
      kiln_blob_borrow_diff(b, in->diff_pool[k], in->diff_pool_floats[k]);
    } else {
      KILN_TRY(kiln_blob_alloc(b));
    }
  }
  return KILN_OK;
}

static int find_outputs(kiln_net *net) {
  net->outputs = calloc((size_t)net->nblobs + 1, sizeof(kiln_blob *));
  net->output_loss_weight = calloc((size_t)net->nblobs + 1, sizeof(float));
  if (!net->outputs || !net->output_loss_weight) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < net->nblobs; i++) {
    kiln_blob *b = net->blobs[i];
    bool consumed = false;
    float lw = 0;
    for (int j = 0; j < net->nlayers; j++) {
      kiln_layer *l = net->layers[j];
      for (int t = 0; t < l->nbottom; t++)
        if (l->bottom[t] == b && !(t < l->ntop && l->top[t] == b)) consumed = true;
      for (int t = 0; t < l->ntop; t++)
        if (l->top[t] == b && l->loss_weight[t] != 0) lw = l->loss_weight[t];
    }
    if (!consumed) {
      net->outputs[net->noutputs] = b;
      net->output_loss_weight[net->noutputs++] = lw;
    }
  }
  return KILN_OK;
}

/* ---- activation layouts ------------------------------------------------------------------ */

static int blob_index(const kiln_net *net, const kiln_blob *b) {
  for (int i = 0; i < net->nblobs; i++)
    if (net->blobs[i] == b) return i;
  return -1;
}

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
 * exempt from the last two (the bytes are the same). Then every layer is reshaped again, which
 * remakes the convolutions' primitives for their new layouts. */
static int plan_layouts(kiln_net *net) {
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
      int bi = blob_index(net, is_bottom ? l->bottom[k] : l->top[k - l->nbottom]);
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
static void share_split_data(kiln_net *net) {
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
static void plan_fusion(kiln_net *net) {
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

static int build(kiln_net *net, const Caffe__NetParameter *np, const kiln_net_options *opt) {
  net_internal *in = net->internal;
  KILN_TRY(add_deploy_inputs(in, np));
  for (int i = 0; i < in->nsynth; i++) KILN_TRY(plan_add(&in->plan, in->synth[i]));
  for (size_t i = 0; i < np->n_layer; i++) {
    bool inc = false;
    int rc = layer_included(np->layer[i], opt, &inc);
    if (rc) return rc;
    if (inc) KILN_TRY(plan_add(&in->plan, np->layer[i]));
  }
  KILN_TRY(plan_resolve(&in->plan, opt->source, opt->phase));
  plan full = {0};
  int rc = plan_insert_splits(in, &full);
  for (int i = 0; i < in->plan.n; i++) plan_layer_free(&in->plan.v[i]);
  free(in->plan.v);
  in->plan = full;
  if (rc) return rc;

  plan *p = &in->plan;
  net->layers = calloc((size_t)p->n + 1, sizeof(kiln_layer *));
  in->layer_storage = calloc((size_t)p->n + 1, sizeof(kiln_layer));
  if (!net->layers || !in->layer_storage) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < p->n; i++) {
    plan_layer *pl = &p->v[i];
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
  KILN_TRY(plan_layouts(net));
  plan_fusion(net);
  share_split_data(net);
  KILN_TRY(setup_params(net));
  need_backward(net, np);
  KILN_TRY(find_outputs(net));
  KILN_TRY(plan_memory(net, opt));
  if (net->config.fault.kind == KILN_FAULT_SLEEP)
    for (int i = 0; i < net->nlayers; i++)
      if (!strcmp(net->layers[i]->name, net->config.fault.layer)) {
        in->fault_layer = i;
        break;
      }
  return allocate_and_fill(net);
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
  kiln_rng_seed(&net->rng, opt->seed, 0x6b696c6eULL);
  int rc = build(net, np, opt);
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
    for (int i = 0; i < in->plan.n; i++) plan_layer_free(&in->plan.v[i]);
    free(in->plan.v);
    for (int i = 0; i < in->nsynth; i++)
      protobuf_c_message_free_unpacked(&in->synth[i]->base, NULL);
    free(in->synth);
    free(in->layer_storage);
    free(in->param_owner_blob);
    for (int k = 0; k < in->ndiff_pool && in->diff_pool; k++) kiln_free(in->diff_pool[k]);
    free(in->diff_pool);
    free(in->diff_pool_floats);
    free(in->diff_slot);
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
  kiln_free(net->param_data);
  if (!net->param_diff_placed) kiln_free(net->param_diff);
  kiln_free(net->workspace);
  free(net->outputs);
  free(net->output_loss_weight);
  free(net->name);
  free(net);
}

/* ---- running ------------------------------------------------------------------------------- */

int kiln_net_layer_forward(kiln_net *net, int i) {
  kiln_layer *l = net->layers[i];
  return l->fused_into ? KILN_OK : l->ops->forward(l);
}

/* A fused group [h, h + fused] runs its head's backward at its last layer, when any of its layers
 * needs backward (the head skips what is not wanted: its input gradient without propagate_down). */
int kiln_net_layer_backward(kiln_net *net, int i) {
  kiln_layer *l = net->layers[i];
  if (l->fused) return KILN_OK; /* done at the group's last layer */
  if (!l->fused_into)
    return net->layer_need_backward[i] && l->ops->backward ? l->ops->backward(l) : KILN_OK;
  int h = i;
  while (h > 0 && net->layers[h] != l->fused_into) h--;
  if (h + net->layers[h]->fused != i) return KILN_OK;
  bool need = false;
  for (int j = h; j <= i; j++) need |= net->layer_need_backward[j];
  kiln_layer *head = net->layers[h];
  return need && head->ops->backward ? head->ops->backward(head) : KILN_OK;
}

int kiln_net_forward(kiln_net *net, float *loss) {
  const net_internal *in = net->internal;
  double total = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    int rc = kiln_net_layer_forward(net, i);
    if (rc) return rc;
    if (i == in->fault_layer) kiln_fault_sleep(&net->config.fault);
    if (l->reshaped) {
      /* Shrinking (or growing back to the planned size) never allocates. */
      l->reshaped = false;
      for (int j = i + 1; j < net->nlayers; j++)
        if ((rc = net->layers[j]->ops->reshape(net->layers[j]))) return rc;
    }
    for (int t = 0; t < l->ntop; t++)
      if (l->loss_weight[t] != 0) {
        const float *d = l->top[t]->data;
        double s = 0;
        for (int64_t k = 0; k < l->top[t]->count; k++) s += d[k];
        total += l->loss_weight[t] * s;
      }
  }
  if (loss) *loss = (float)total;
  return KILN_OK;
}

int kiln_net_backward(kiln_net *net) {
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    for (int t = 0; t < l->ntop; t++)
      if (l->loss_weight[t] != 0)
        for (int64_t k = 0; k < l->top[t]->count; k++) l->top[t]->diff[k] = l->loss_weight[t];
  }
  for (int i = net->nlayers - 1; i >= 0; i--) {
    KILN_TRY(kiln_net_layer_backward(net, i));
    if (net->backward_hook) KILN_TRY(net->backward_hook(net->backward_hook_user, i));
  }
  return KILN_OK;
}

void kiln_net_zero_param_diff(kiln_net *net) {
  memset(net->param_diff, 0, (size_t)net->nparam_floats * sizeof(float));
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
  int k = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (!l->ops->set_cursor) continue;
    if (k >= n) return kiln_errorf(KILN_ERR_INVALID, "snapshot holds %d data cursors, the net has more", n);
    KILN_TRY(l->ops->set_cursor(l, cursors[k++]));
  }
  return KILN_OK;
}

char *kiln_net_describe(const kiln_net *net) {
  size_t cap = 4096 + (size_t)net->nlayers * 200, used = 0;
  char *s = malloc(cap);
  if (!s) return NULL;
#define OUT(...) used += (size_t)snprintf(s + used, used < cap ? cap - used : 0, __VA_ARGS__)
  OUT("%-24s %-16s %-20s %12s %12s\n", "layer", "type", "output", "params", "MFLOPs");
  int64_t total_params = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    char shape[96] = "-";
    if (l->ntop) kiln_blob_shape_string(l->top[0], shape, sizeof shape);
    int64_t np = 0;
    for (int p = 0; p < l->nparam; p++) np += l->param[p]->count;
    total_params += np;
    OUT("%-24.24s %-16.16s %-20.20s %12lld %12.2f\n", l->name, l->ops->type, shape, (long long)np,
        l->flops / 1e6);
  }
  const kiln_memory_plan *m = &net->memory;
  char a[32], b[32], c[32], d[32], e[32], f[32], g[32], t[32];
  OUT("total: %lld parameters, %.2f MFLOPs forward per pass\n", (long long)total_params,
      kiln_net_forward_flops(net) / 1e6);
  OUT("memory: %s = parameters %s + gradients %s + solver history %s + activations %s + buffers "
      "%s + workspace %s + prefetch %s\n",
      human_bytes(m->total, t, sizeof t), human_bytes(m->params, a, sizeof a),
      human_bytes(m->grads, b, sizeof b), human_bytes(m->history, c, sizeof c),
      human_bytes(m->activations, d, sizeof d), human_bytes(m->buffers, e, sizeof e),
      human_bytes(m->workspace, f, sizeof f), human_bytes(m->data_queues, g, sizeof g));
#undef OUT
  return s;
}

int kiln_net_param_from_text(const char *text, const char *source, Caffe__NetParameter **out) {
  ProtobufCMessage *m;
  int rc = kiln_text_parse(text, strlen(text), source, &caffe__net_parameter__descriptor, &m);
  *out = rc ? NULL : (Caffe__NetParameter *)m;
  return rc;
}
