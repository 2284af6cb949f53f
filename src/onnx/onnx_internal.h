/* The ONNX exporter's private pieces: the graph being built (its nodes, initializers, the names
 * it has given) and the helpers the layers' emitters (layers.c, layers_shape.c) build it with. */
#ifndef KILN_ONNX_INTERNAL_H
#define KILN_ONNX_INTERNAL_H

#include <stdarg.h>

#include "kiln/onnx.h"
#include "onnx.pb-c.h"

typedef struct ox_graph {
  const kiln_net *net;
  const kiln_onnx_options *opt;
  const float *params;      /* the net's parameters on the host (net->param_data or a copy) */
  /* what the model holds, grown as layers are emitted */
  Onnx__NodeProto **nodes;
  size_t nnodes, cap_nodes;
  Onnx__TensorProto **inits;
  size_t ninits, cap_inits;
  int64_t init_floats;
  /* every allocation the model's messages point to, freed together */
  void **allocs;
  size_t nallocs, cap_allocs;
  /* the tensor names given so far (an open-addressing set of interned strings) */
  char **names;
  size_t names_cap, names_n;
  /* per activation blob (kiln_blob.id): its current ONNX name, and the last layer that writes it
   * with nodes of its own (that layer's output takes the Caffe name itself) */
  const char **cur;
  int *last_writer;
  int64_t batch;            /* the inputs' first axis */
  /* the layer being emitted */
  int li;
  const kiln_layer *l;
  int node_in_layer;        /* nodes emitted for it so far (names after the first are numbered) */
  int skip;                 /* a layer whose work its emitter did too (the next), or -1 */
} ox_graph;

/* Memory that lives as long as the model (NULL after setting the error, when out of memory). */
void *ox_alloc(ox_graph *g, size_t n);
char *ox_strdup(ox_graph *g, const char *s);
/* A tensor name not given yet: `base`, or `base` with "_2", "_3", ... appended. */
const char *ox_unique(ox_graph *g, const char *base);
/* A name for an intermediate tensor of the current layer: "<layer>.<what>", made unique. */
const char *ox_tmp(ox_graph *g, const char *what);

/* A node of the current layer: op type, its inputs and outputs (names). Its name is the layer's
 * (numbered after the first). NULL when out of memory (the error set). */
Onnx__NodeProto *ox_node(ox_graph *g, const char *op, int nin, const char *const *in, int nout,
                         const char *const *out);
/* One-input one-output node, the most common kind. */
Onnx__NodeProto *ox_node1(ox_graph *g, const char *op, const char *in, const char *out);
/* A two-input node into `out` (a name): `out`, or NULL when out of memory (the error set). */
const char *ox_op2(ox_graph *g, const char *op, const char *a, const char *b, const char *out);
/* For an emitter: return KILN_ERR_NOMEM (the error is set) when a node could not be made. */
#define TRY_NODE(n)                      \
  do {                                   \
    if (!(n)) return KILN_ERR_NOMEM;     \
  } while (0)
int ox_attr_int(ox_graph *g, Onnx__NodeProto *n, const char *name, int64_t v);
int ox_attr_float(ox_graph *g, Onnx__NodeProto *n, const char *name, float v);
int ox_attr_ints(ox_graph *g, Onnx__NodeProto *n, const char *name, int count, const int64_t *v);
/* A string attribute; `v` must outlive the model (a literal). */
int ox_attr_string(ox_graph *g, Onnx__NodeProto *n, const char *name, const char *v);

/* Initializers of the current layer, named "<layer>.<what>": float32 of the given shape,
 * `data` kept as it is (it must outlive the model: the net's parameters or ox_alloc memory);
 * int64 (copied); one float as a tensor of shape [1]. The name, or NULL (error set). */
const char *ox_init_float(ox_graph *g, const char *what, int ndims, const int64_t *dims,
                          const float *data);
const char *ox_init_int64(ox_graph *g, const char *what, int64_t n, const int64_t *v);
const char *ox_init_scalar(ox_graph *g, const char *what, float v);
/* Parameter p of the current layer on the host. */
const float *ox_param(const ox_graph *g, int p);

/* The current ONNX name of the layer's bottom b, and the name its top t is to take (the Caffe
 * blob's name when this layer writes it last, else "<blob>@<layer>"); ox_set_top records it once
 * the nodes that compute it are emitted. */
const char *ox_bottom(const ox_graph *g, int b);
const char *ox_top(ox_graph *g, int t);
void ox_set_top(ox_graph *g, int t, const char *name);

/* KILN_ERR_UNSUPPORTED (or `code`) naming the current layer and its type. */
int ox_refuse(const ox_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ox_fail(const ox_graph *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The emitter of a layer type: nodes computing the current layer's tops from its bottoms
 * (ox_set_top on each). */
typedef int (*ox_emit_fn)(ox_graph *g);
typedef struct ox_layer_form {
  const char *type;
  ox_emit_fn emit;
} ox_layer_form;
/* The types with an ONNX form (layers.c, layers_shape.c, layers_seq.c), each list ended by a NULL
 * type. */
extern const ox_layer_form ox_forms_compute[];
extern const ox_layer_form ox_forms_shape[];
extern const ox_layer_form ox_forms_seq[]; /* layers_seq.c: the sequence and text layers */
extern const ox_layer_form ox_forms_det[]; /* layers_det.c: the SSD fork's Normalize, PriorBox */
/* Types that pass their bottom on unchanged at inference (Split, Dropout): no node. */
bool ox_is_alias(const kiln_layer *l);

#endif
