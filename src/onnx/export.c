/* kiln_onnx_export: a deploy net as an ONNX model. The net's layers in order, each through the
 * emitter of its type (layers.c, layers_shape.c), with the names ONNX needs: every tensor is
 * written once (SSA), so a Caffe blob that in-place layers rewrite is a new tensor after each,
 * named "<blob>@<layer>", and only the version its last writer leaves takes the blob's own name;
 * Split and Dropout add no node (their tops are their bottom). Weights are initializers pointing
 * at the net's parameters, packed once into the file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/files.h"
#include "onnx_internal.h"

/* ---- memory and names ------------------------------------------------------------------- */

void *ox_alloc(ox_graph *g, size_t n) {
  if (g->nallocs == g->cap_allocs) {
    size_t cap = g->cap_allocs ? 2 * g->cap_allocs : 256;
    void **a = realloc(g->allocs, cap * sizeof *a);
    if (!a) {
      kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      return NULL;
    }
    g->allocs = a;
    g->cap_allocs = cap;
  }
  void *p = calloc(1, n ? n : 1);
  if (!p) {
    kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    return NULL;
  }
  g->allocs[g->nallocs++] = p;
  return p;
}

char *ox_strdup(ox_graph *g, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = ox_alloc(g, n);
  if (d) memcpy(d, s, n);
  return d;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The slot of `s` in the set, or of the empty slot where it would go. */
static size_t name_slot(const ox_graph *g, const char *s) {
  size_t i = name_hash(s) & (g->names_cap - 1);
  while (g->names[i] && strcmp(g->names[i], s)) i = (i + 1) & (g->names_cap - 1);
  return i;
}

static bool name_taken(const ox_graph *g, const char *s) {
  return g->names_cap && g->names[name_slot(g, s)];
}

/* Adds s (interned) to the set; the interned copy, or NULL when out of memory. */
static const char *name_add(ox_graph *g, const char *s) {
  if (2 * (g->names_n + 1) > g->names_cap) {
    size_t cap = g->names_cap ? 2 * g->names_cap : 1024;
    char **old = g->names;
    size_t old_cap = g->names_cap;
    g->names = calloc(cap, sizeof *g->names);
    if (!g->names) {
      g->names = old;
      kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      return NULL;
    }
    g->names_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i]) g->names[name_slot(g, old[i])] = old[i];
    free(old);
  }
  char *d = ox_strdup(g, s);
  if (!d) return NULL;
  g->names[name_slot(g, d)] = d;
  g->names_n++;
  return d;
}

const char *ox_unique(ox_graph *g, const char *base) {
  if (!name_taken(g, base)) return name_add(g, base);
  size_t n = strlen(base) + 24;
  char *buf = malloc(n);
  if (!buf) {
    kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    return NULL;
  }
  const char *r = NULL;
  for (long k = 2;; k++) {
    snprintf(buf, n, "%s_%ld", base, k);
    if (!name_taken(g, buf)) {
      r = name_add(g, buf);
      break;
    }
  }
  free(buf);
  return r;
}

const char *ox_tmp(ox_graph *g, const char *what) {
  size_t n = strlen(g->l->name) + strlen(what) + 2;
  char *buf = malloc(n);
  if (!buf) {
    kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    return NULL;
  }
  snprintf(buf, n, "%s.%s", g->l->name, what);
  const char *r = ox_unique(g, buf);
  free(buf);
  return r;
}

/* ---- nodes and attributes --------------------------------------------------------------- */

static int grow(void ***v, size_t n, size_t *cap) {
  if (n < *cap) return KILN_OK;
  size_t c = *cap ? 2 * *cap : 256;
  void **a = realloc(*v, c * sizeof *a);
  if (!a) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  *v = a;
  *cap = c;
  return KILN_OK;
}

Onnx__NodeProto *ox_node(ox_graph *g, const char *op, int nin, const char *const *in, int nout,
                         const char *const *out) {
  Onnx__NodeProto *n = ox_alloc(g, sizeof *n);
  char **ins = ox_alloc(g, sizeof(char *) * (size_t)(nin + 1));
  char **outs = ox_alloc(g, sizeof(char *) * (size_t)(nout + 1));
  if (!n || !ins || !outs || grow((void ***)&g->nodes, g->nnodes, &g->cap_nodes)) return NULL;
  onnx__node_proto__init(n);
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return NULL; /* a name that failed to be made: its error stands */
    ins[i] = (char *)in[i];
  }
  for (int i = 0; i < nout; i++) {
    if (!out[i]) return NULL;
    outs[i] = (char *)out[i];
  }
  n->n_input = (size_t)nin;
  n->input = ins;
  n->n_output = (size_t)nout;
  n->output = outs;
  n->op_type = (char *)op;
  if (g->node_in_layer++ == 0) {
    n->name = (char *)g->l->name;
  } else {
    char buf[64];
    snprintf(buf, sizeof buf, "/%s_%d", op, g->node_in_layer);
    size_t len = strlen(g->l->name) + strlen(buf) + 1;
    if (!(n->name = ox_alloc(g, len))) return NULL;
    snprintf(n->name, len, "%s%s", g->l->name, buf);
  }
  g->nodes[g->nnodes++] = n;
  return n;
}

Onnx__NodeProto *ox_node1(ox_graph *g, const char *op, const char *in, const char *out) {
  return ox_node(g, op, 1, &in, 1, &out);
}

const char *ox_op2(ox_graph *g, const char *op, const char *a, const char *b, const char *out) {
  const char *in[2] = {a, b};
  return ox_node(g, op, 2, in, 1, &out) ? out : NULL;
}

static Onnx__AttributeProto *attr_new(ox_graph *g, Onnx__NodeProto *n, const char *name,
                                      Onnx__AttributeProto__AttributeType type) {
  if (!n) return NULL;
  Onnx__AttributeProto *a = ox_alloc(g, sizeof *a);
  Onnx__AttributeProto **v = ox_alloc(g, sizeof *v * (n->n_attribute + 1));
  if (!a || !v) return NULL;
  onnx__attribute_proto__init(a);
  a->name = (char *)name;
  a->has_type = true;
  a->type = type;
  if (n->n_attribute) memcpy(v, n->attribute, sizeof *v * n->n_attribute);
  v[n->n_attribute++] = a;
  n->attribute = v; /* the old array stays in the arena */
  return a;
}

int ox_attr_int(ox_graph *g, Onnx__NodeProto *n, const char *name, int64_t v) {
  Onnx__AttributeProto *a = attr_new(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
  if (!a) return KILN_ERR_NOMEM; /* the error is set */
  a->has_i = true;
  a->i = v;
  return KILN_OK;
}

int ox_attr_float(ox_graph *g, Onnx__NodeProto *n, const char *name, float v) {
  Onnx__AttributeProto *a = attr_new(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
  if (!a) return KILN_ERR_NOMEM; /* the error is set */
  a->has_f = true;
  a->f = v;
  return KILN_OK;
}

int ox_attr_ints(ox_graph *g, Onnx__NodeProto *n, const char *name, int count, const int64_t *v) {
  Onnx__AttributeProto *a = attr_new(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
  int64_t *c = a ? ox_alloc(g, sizeof *c * (size_t)(count + 1)) : NULL;
  if (!c) return KILN_ERR_NOMEM; /* the error is set */
  memcpy(c, v, sizeof *c * (size_t)count);
  a->n_ints = (size_t)count;
  a->ints = c;
  return KILN_OK;
}

int ox_attr_string(ox_graph *g, Onnx__NodeProto *n, const char *name, const char *v) {
  Onnx__AttributeProto *a = attr_new(g, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
  if (!a) return KILN_ERR_NOMEM; /* the error is set */
  a->has_s = true;
  a->s.data = (uint8_t *)v;
  a->s.len = strlen(v);
  return KILN_OK;
}

/* ---- initializers ----------------------------------------------------------------------- */

static Onnx__TensorProto *init_new(ox_graph *g, const char *what, int ndims, const int64_t *dims,
                                   Onnx__TensorProto__DataType type) {
  const char *name = ox_tmp(g, what);
  Onnx__TensorProto *t = name ? ox_alloc(g, sizeof *t) : NULL;
  int64_t *d = t ? ox_alloc(g, sizeof *d * (size_t)(ndims + 1)) : NULL;
  if (!d || grow((void ***)&g->inits, g->ninits, &g->cap_inits)) return NULL;
  onnx__tensor_proto__init(t);
  t->name = (char *)name;
  t->has_data_type = true;
  t->data_type = type;
  memcpy(d, dims, sizeof *d * (size_t)ndims);
  t->n_dims = (size_t)ndims;
  t->dims = d;
  g->inits[g->ninits++] = t;
  return t;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ONNX's raw_data is little-endian: byte swapping is needed on this machine"
#endif

const char *ox_init_float(ox_graph *g, const char *what, int ndims, const int64_t *dims,
                          const float *data) {
  Onnx__TensorProto *t = init_new(g, what, ndims, dims, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
  if (!t) return NULL;
  int64_t n = 1;
  for (int i = 0; i < ndims; i++) n *= dims[i];
  t->has_raw_data = true;
  t->raw_data.len = sizeof(float) * (size_t)n;
  t->raw_data.data = (uint8_t *)data;
  g->init_floats += n;
  return t->name;
}

const char *ox_init_int64(ox_graph *g, const char *what, int64_t n, const int64_t *v) {
  Onnx__TensorProto *t = init_new(g, what, 1, &n, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
  uint8_t *d = t ? ox_alloc(g, sizeof(int64_t) * (size_t)n) : NULL;
  if (!d) return NULL;
  memcpy(d, v, sizeof(int64_t) * (size_t)n);
  t->has_raw_data = true;
  t->raw_data.len = sizeof(int64_t) * (size_t)n;
  t->raw_data.data = d;
  return t->name;
}

const char *ox_init_scalar(ox_graph *g, const char *what, float v) {
  float *d = ox_alloc(g, sizeof *d);
  if (!d) return NULL;
  *d = v;
  const int64_t one = 1;
  return ox_init_float(g, what, 1, &one, d);
}

const float *ox_param(const ox_graph *g, int p) {
  return g->params + (g->l->param[p]->data - g->net->param_data);
}

/* ---- blob names ------------------------------------------------------------------------- */

const char *ox_bottom(const ox_graph *g, int b) { return g->cur[g->l->bottom[b]->id]; }

const char *ox_top(ox_graph *g, int t) {
  const kiln_blob *b = g->l->top[t];
  if (g->last_writer[b->id] == g->li && !name_taken(g, b->name)) return name_add(g, b->name);
  size_t n = strlen(b->name) + strlen(g->l->name) + 2;
  char *buf = malloc(n);
  if (!buf) {
    kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    return NULL;
  }
  snprintf(buf, n, "%s@%s", b->name, g->l->name);
  const char *r = ox_unique(g, buf);
  free(buf);
  return r;
}

void ox_set_top(ox_graph *g, int t, const char *name) { g->cur[g->l->top[t]->id] = name; }

static int vfail(const ox_graph *g, int code, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  return kiln_errorf(code, "layer '%s' (%s): %s", g->l->name, g->l->ops->type, msg);
}

int ox_refuse(const ox_graph *g, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(g, KILN_ERR_UNSUPPORTED, fmt, ap);
  va_end(ap);
  return rc;
}

int ox_fail(const ox_graph *g, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(g, code, fmt, ap);
  va_end(ap);
  return rc;
}

/* ---- which layers ----------------------------------------------------------------------- */

bool ox_is_alias(const kiln_layer *l) {
  return l->ops->passes_through || !strcmp(l->ops->type, "Dropout");
}

static ox_emit_fn find_form(const char *type) {
  const ox_layer_form *lists[] = {ox_forms_compute, ox_forms_shape, ox_forms_seq, ox_forms_det};
  for (size_t k = 0; k < 4; k++)
    for (const ox_layer_form *f = lists[k]; f->type; f++)
      if (!strcmp(f->type, type)) return f->emit;
  return NULL;
}

/* Layers with no ONNX form whose refusal says more than that, and what (docs/onnx.md). */
static const struct {
  const char *type, *why;
} refused[] = {
    {"LSTMUnit", "one step of Caffe's unrolled LSTM, its cont and state as bottoms: export the "
                 "LSTM layer, which has an ONNX form (docs/onnx.md)"},
    {"DetectionOutput", "has no ONNX form in kiln's export (decoding and NMS are the runtime's); "
                        "export the detection heads instead: --outputs with its bottoms"},
    {NULL, NULL}};

bool kiln_onnx_exports_type(const char *type, const char **why) {
  static char buf[256];
  const kiln_layer_ops *ops = kiln_layer_find(type);
  if (ops && (!strcmp(type, "Input") || ops->passes_through || !strcmp(type, "Dropout") ||
              find_form(type))) {
    if (why) *why = NULL;
    return true;
  }
  const char *w = "has no ONNX form in kiln's export (docs/onnx.md lists the layer types it "
                  "exports)";
  for (size_t i = 0; refused[i].type; i++)
    if (!strcmp(refused[i].type, type)) w = refused[i].why;
  if (ops && ops->is_loss)
    w = "a loss layer has no place in an exported model: export the deploy net";
  else if (ops && ops->is_data)
    w = "a data layer reads files at training time: export the deploy net, whose inputs are "
        "Input layers (or an input: header)";
  snprintf(buf, sizeof buf, "%s", w);
  if (why) *why = buf;
  return false;
}

/* ---- the model -------------------------------------------------------------------------- */

static Onnx__ValueInfoProto *value_info(ox_graph *g, const char *name, const kiln_blob *b) {
  Onnx__ValueInfoProto *v = ox_alloc(g, sizeof *v);
  Onnx__TypeProto *t = ox_alloc(g, sizeof *t);
  Onnx__TypeProto__Tensor *tt = ox_alloc(g, sizeof *tt);
  Onnx__TensorShapeProto *s = ox_alloc(g, sizeof *s);
  Onnx__TensorShapeProto__Dimension *dims = ox_alloc(g, sizeof *dims * (size_t)(b->naxes + 1));
  Onnx__TensorShapeProto__Dimension **dp = ox_alloc(g, sizeof *dp * (size_t)(b->naxes + 1));
  if (!v || !t || !tt || !s || !dims || !dp) return NULL;
  onnx__value_info_proto__init(v);
  onnx__type_proto__init(t);
  onnx__type_proto__tensor__init(tt);
  onnx__tensor_shape_proto__init(s);
  for (int a = 0; a < b->naxes; a++) {
    onnx__tensor_shape_proto__dimension__init(&dims[a]);
    if (a == 0 && g->opt->dynamic_batch) {
      dims[a].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      dims[a].dim_param = "N";
    } else {
      dims[a].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      dims[a].dim_value = b->shape[a];
    }
    dp[a] = &dims[a];
  }
  s->n_dim = (size_t)b->naxes;
  s->dim = dp;
  tt->has_elem_type = true;
  tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  tt->shape = s;
  t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  t->tensor_type = tt;
  v->name = (char *)name;
  v->type = t;
  return v;
}

/* Whether the layer's nodes read its bottoms' values: PriorBox reads their shapes alone (its boxes
 * are a constant of the model), so what computes them is not needed for its sake. */
static bool reads_bottoms(const kiln_layer *l) { return strcmp(l->ops->type, "PriorBox") != 0; }

/* The model's outputs (opt's, or the net's own) into outs (net->nblobs + 1 room), their number
 * in *nout; and in need[i] whether layer i is written: it writes a blob that an output depends
 * on. Walking the layers from the last, a layer is needed when one of its tops is; its bottoms
 * then are. */
static int model_outputs(const kiln_net *net, const kiln_onnx_options *opt, const kiln_blob **outs,
                         bool *need, int *nout) {
  int n = 0;
  if (opt && opt->noutputs > 0) {
    for (int o = 0; o < opt->noutputs; o++) {
      const kiln_blob *b = kiln_net_blob(net, opt->outputs[o]);
      if (!b)
        return kiln_errorf(KILN_ERR_INVALID, "output '%s' is no blob of net '%s'",
                           opt->outputs[o], net->name ? net->name : "");
      for (int j = 0; j < n; j++)
        if (outs[j] == b)
          return kiln_errorf(KILN_ERR_INVALID, "output '%s' is named twice", opt->outputs[o]);
      outs[n++] = b;
    }
  } else {
    for (int o = 0; o < net->noutputs; o++) outs[n++] = net->outputs[o];
  }
  bool *wanted = calloc((size_t)net->nblobs + 1, sizeof *wanted);
  if (!wanted) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int o = 0; o < n; o++) wanted[outs[o]->id] = true;
  for (int i = net->nlayers - 1; i >= 0; i--) {
    const kiln_layer *l = net->layers[i];
    need[i] = false;
    for (int t = 0; t < l->ntop; t++) need[i] |= wanted[l->top[t]->id];
    for (int b = 0; need[i] && reads_bottoms(l) && b < l->nbottom; b++)
      wanted[l->bottom[b]->id] = true;
  }
  free(wanted);
  *nout = n;
  return KILN_OK;
}

int kiln_onnx_check(const kiln_net *net, const kiln_onnx_options *opt) {
  if (net->phase != CAFFE__PHASE__TEST)
    return kiln_errorf(KILN_ERR_INVALID, "net '%s' is built in the TRAIN phase: a model for "
                       "inference is the net of the TEST phase", net->name ? net->name : "");
  const kiln_blob **outs = malloc(sizeof *outs * ((size_t)net->nblobs + 1));
  bool *need = malloc(sizeof *need * ((size_t)net->nlayers + 1));
  int n = 0;
  const int rc = outs && need ? model_outputs(net, opt, outs, need, &n)
                              : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  free(outs);
  if (rc) {
    free(need);
    return rc;
  }
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (!need[i] && strcmp(l->ops->type, "Input")) continue;
    const char *why;
    if (!kiln_onnx_exports_type(l->ops->type, &why)) {
      free(need);
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "layer '%s' (%s): %s", l->name, l->ops->type, why);
    }
  }
  free(need);
  return KILN_OK;
}

/* The graph's nodes, inputs and outputs from the net's layers. */
static int build_graph(ox_graph *g, Onnx__GraphProto *graph) {
  const kiln_net *net = g->net;
  int ninputs = 0;
  for (int i = 0; i < net->nlayers; i++)
    if (!strcmp(net->layers[i]->ops->type, "Input")) ninputs += net->layers[i]->ntop;
  if (ninputs == 0)
    return kiln_errorf(KILN_ERR_INVALID, "net '%s' has no Input layer (nor an input: header): a "
                       "model needs inputs; export the deploy net", net->name ? net->name : "");
  Onnx__ValueInfoProto **ins = ox_alloc(g, sizeof *ins * (size_t)ninputs);
  Onnx__ValueInfoProto **outs = ox_alloc(g, sizeof *outs * (size_t)(net->nblobs + 1));
  const kiln_blob **mouts = ox_alloc(g, sizeof *mouts * (size_t)(net->nblobs + 1));
  bool *need = ox_alloc(g, sizeof *need * (size_t)(net->nlayers + 1));
  if (!ins || !outs || !mouts || !need) return KILN_ERR_NOMEM;
  int nouts = 0;
  KILN_TRY(model_outputs(net, g->opt, mouts, need, &nouts));
  /* the last layer with nodes of its own to write each blob */
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (ox_is_alias(l) || !need[i]) continue;
    for (int t = 0; t < l->ntop; t++) g->last_writer[l->top[t]->id] = i;
  }
  g->batch = -1;
  g->skip = -1;
  int nin = 0;
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    g->li = i;
    g->l = l;
    g->node_in_layer = 0;
    if (!strcmp(l->ops->type, "Input")) {
      for (int t = 0; t < l->ntop; t++) {
        const kiln_blob *b = l->top[t];
        if (name_taken(g, b->name))
          return ox_fail(g, KILN_ERR_INVALID, "input '%s' is named twice", b->name);
        const char *name = name_add(g, b->name);
        if (!name) return KILN_ERR_NOMEM;
        if (b->naxes < 1)
          return ox_refuse(g, "input '%s' has no axes", b->name);
        if (g->batch < 0) g->batch = b->shape[0];
        else if (g->opt->dynamic_batch && b->shape[0] != g->batch)
          return ox_refuse(g, "input '%s' has %lld items on its first axis, the first input %lld: "
                           "--dynamic-batch needs one batch size", b->name,
                           (long long)b->shape[0], (long long)g->batch);
        g->cur[b->id] = name;
        if (!(ins[nin++] = value_info(g, name, b))) return KILN_ERR_NOMEM;
      }
      continue;
    }
    if (i == g->skip) continue; /* done by the layer before it (a Scale folded into BatchNorm) */
    if (!need[i]) continue;     /* no output depends on it */
    if (ox_is_alias(l)) {
      /* a Split's tops, Dropout's top: the bottom itself */
      for (int t = 0; t < l->ntop; t++) g->cur[l->top[t]->id] = g->cur[l->bottom[0]->id];
      continue;
    }
    for (int b = 0; reads_bottoms(l) && b < l->nbottom; b++)
      if (!g->cur[l->bottom[b]->id])
        return ox_fail(g, KILN_ERR_INTERNAL, "bottom '%s' has no value yet", l->bottom[b]->name);
    ox_emit_fn emit = find_form(l->ops->type);
    if (!emit) return ox_refuse(g, "no ONNX form"); /* check_types said there is one */
    KILN_TRY(emit(g));
  }
  /* outputs under their Caffe names: an Identity where the last writer was an alias */
  for (int o = 0; o < nouts; o++) {
    const kiln_blob *b = mouts[o];
    const char *name = g->cur[b->id];
    if (!name)
      return kiln_errorf(KILN_ERR_INTERNAL, "output '%s' has no value", b->name);
    if (strcmp(name, b->name)) {
      if (name_taken(g, b->name))
        return kiln_errorf(KILN_ERR_INVALID, "output '%s': the name is taken by another tensor",
                           b->name);
      const char *to = name_add(g, b->name);
      g->l = net->layers[net->nlayers - 1];
      g->node_in_layer = 1;
      if (!to || !ox_node1(g, "Identity", name, to)) return KILN_ERR_NOMEM;
      name = to;
    }
    if (!(outs[o] = value_info(g, name, b))) return KILN_ERR_NOMEM;
  }
  graph->name = net->name && *net->name ? net->name : "kiln";
  graph->n_node = g->nnodes;
  graph->node = g->nodes;
  graph->n_initializer = g->ninits;
  graph->initializer = g->inits;
  graph->n_input = (size_t)nin;
  graph->input = ins;
  graph->n_output = (size_t)nouts;
  graph->output = outs;
  return KILN_OK;
}

int kiln_onnx_export(const kiln_net *net, const kiln_onnx_options *opt, const char *path,
                     kiln_onnx_summary *summary) {
  KILN_TRY(kiln_onnx_check(net, opt));
  const kiln_onnx_options defaults = {0};
  ox_graph g = {.net = net, .opt = opt ? opt : &defaults};
  float *copy = NULL;
  uint8_t *buf = NULL;
  int rc = KILN_OK;
  g.cur = calloc((size_t)net->nblobs + 1, sizeof *g.cur);
  g.last_writer = malloc(sizeof *g.last_writer * ((size_t)net->nblobs + 1));
  if (!g.cur || !g.last_writer) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    goto done;
  }
  for (int i = 0; i < net->nblobs; i++) g.last_writer[i] = -1;
  g.params = net->param_data;
  if (!kiln_device_is_host(net->device) && net->nparam_floats > 0) {
    const size_t bytes = sizeof(float) * (size_t)net->nparam_floats;
    if (!(copy = malloc(bytes))) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      goto done;
    }
    if ((rc = kiln_device_to_host(net->device, copy, net->param_data, bytes))) goto done;
    g.params = copy;
  }
  Onnx__GraphProto graph = ONNX__GRAPH_PROTO__INIT;
  if ((rc = build_graph(&g, &graph))) goto done;
  Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
  opset.domain = "";
  opset.has_version = true;
  opset.version = KILN_ONNX_OPSET;
  Onnx__OperatorSetIdProto *opsets[] = {&opset};
  Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
  model.has_ir_version = true;
  model.ir_version = KILN_ONNX_IR_VERSION;
  model.n_opset_import = 1;
  model.opset_import = opsets;
  model.producer_name = "kiln";
  model.producer_version = "export onnx";
  char doc[2048];
  snprintf(doc, sizeof doc, "exported by kiln from %s%s%s", g.opt->model ? g.opt->model : "a net",
           g.opt->weights ? " with weights " : "", g.opt->weights ? g.opt->weights : "");
  model.doc_string = doc;
  model.graph = &graph;
  const size_t size = protobuf_c_message_get_packed_size(&model.base);
  if (size > (size_t)INT32_MAX) {
    rc = kiln_errorf(KILN_ERR_UNSUPPORTED, "the model would be %zu bytes, past protobuf's 2 GiB "
                     "limit on one message (ONNX's external data files are not written yet)",
                     size);
    goto done;
  }
  if (!(buf = malloc(size ? size : 1))) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory (%zu bytes for the model)", size);
    goto done;
  }
  protobuf_c_message_pack(&model.base, buf);
  if ((rc = kiln_write_file_atomic(path, buf, size))) goto done;
  if (summary) {
    *summary = (kiln_onnx_summary){.nodes = (int)g.nnodes, .initializers = (int)g.ninits,
                                   .inputs = (int)graph.n_input, .outputs = (int)graph.n_output,
                                   .parameters = g.init_floats, .bytes = size};
    for (int i = 0; i < net->nlayers; i++)
      summary->dropped += !strcmp(net->layers[i]->ops->type, "Dropout");
  }
done:
  free(buf);
  free(copy);
  for (size_t i = 0; i < g.nallocs; i++) free(g.allocs[i]);
  free(g.allocs);
  free(g.names);
  free(g.nodes);
  free(g.inits);
  free(g.cur);
  free(g.last_writer);
  return rc;
}
