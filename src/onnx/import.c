/* kiln_onnx_import: an ONNX model as a Caffe deploy net and its weights (docs/onnx.md).
 *
 * The model is checked whole first (its opset, every initializer's bytes against its dims, every
 * node's inputs written by something, the graph free of cycles), then the nodes are visited in
 * topological order (the file's order where it is one). A node whose inputs are all constants is
 * folded: computed here into a new constant (PyTorch's Shape -> Gather -> Unsqueeze -> Concat
 * chains that build a Reshape's target, its Constant nodes). Every other node becomes the kiln
 * layers that compute exactly what it computes, or is refused naming it and its op type.
 *
 * Each ONNX tensor that is not a constant lives in a Caffe blob. Ops that only rename the axes
 * (Reshape, Flatten, Squeeze, Unsqueeze, a Transpose that moves only axes of size 1, Identity,
 * Dropout) make no layer: the tensor keeps its blob and records its own ONNX shape beside the
 * blob's, and a layer that needs the blob in the tensor's shape gets a Reshape layer then
 * (materialize). So a Flatten before a Gemm is nothing (InnerProduct flattens), as in Caffe.
 *
 * The net is written as prototxt text and parsed back by kiln's own text reader into the
 * NetParameter, to which the weights are attached as the layers' blobs. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/files.h"
#include "kiln/onnx.h"
#include "kiln/proto.h"
#include "kiln/strbuf.h"
#include "onnx.pb-c.h"

#define MAXD 8
#define MAX_CONST ((int64_t)1 << 26) /* elements of a constant the folding makes */
#define MAXBLOBS 10 /* parameter blobs of a layer: a bidirectional RNN's, 5 a direction */

typedef struct {
  int nd;
  int64_t d[MAXD];
} shp;

enum { T_NONE, T_CONST, T_BLOB, T_PAD };
enum { DT_F, DT_I };

typedef struct tensor {
  const char *name;
  int kind;
  bool ready;
  shp s; /* the ONNX shape */
  /* T_CONST */
  int dt;
  float *f;
  int64_t *i;
  int64_t n;
  /* T_BLOB and T_PAD: the blob and its Caffe shape */
  const char *blob;
  shp cs;
  int uses;
  int ip_layer;        /* a MatMul's InnerProduct that an Add may give its bias, or -1 */
  int64_t pad[4];      /* T_PAD: zeros before and after axes 2 and 3 (hb, wb, he, we) */
  const char *pad_node;
  int producer;        /* the node that writes it, -1 for inputs and initializers */
} tensor;

typedef struct {
  const char *name;
  size_t bias_off; /* where " bias_term: false" is in the text (a MatMul's, for an Add), or 0 */
  int nblobs;
  shp bs[MAXBLOBS];
  float *bd[MAXBLOBS];
} ilayer;

typedef struct {
  char **v;
  size_t cap, n;
} strset;

typedef struct imp {
  const char *src;
  const kiln_onnx_import_options *opt;
  Onnx__ModelProto *model;
  Onnx__GraphProto *g;
  int opset;
  /* tensors by name (open addressing) */
  tensor **tv;
  size_t ntv, cap_tv;
  size_t *hidx;
  size_t hcap;
  /* names: of layers, of blobs, and the ONNX tensors' (which their own blobs take) */
  strset layer_names, blobs, reserved;
  /* memory freed at the end */
  void **allocs;
  size_t nallocs, cap_allocs;
  kiln_strbuf text;
  ilayer *layers;
  int nlayers, cap_layers;
  /* the node being mapped */
  const Onnx__NodeProto *node;
  int node_index;
  int folded, dropped;
  bool *fused; /* per node: computed by a layer of a chain that began at an earlier node */
  struct attn_match **attn; /* per node: the attention group it is the last node of, or NULL */
} imp;

/* ---- memory, names, messages ------------------------------------------------------------ */

static void *ialloc(imp *m, size_t n) {
  if (m->nallocs == m->cap_allocs) {
    size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 256;
    void **a = realloc(m->allocs, cap * sizeof *a);
    if (!a) return NULL;
    m->allocs = a;
    m->cap_allocs = cap;
  }
  void *p = calloc(1, n ? n : 1);
  if (p) m->allocs[m->nallocs++] = p;
  return p;
}

static int nomem(void) { return kiln_errorf(KILN_ERR_NOMEM, "out of memory"); }

static const char *nname(const imp *m) {
  static char buf[64];
  const Onnx__NodeProto *n = m->node;
  if (n->name && *n->name) return n->name;
  snprintf(buf, sizeof buf, "#%d", m->node_index);
  return buf;
}

static const char *nop(const Onnx__NodeProto *n) { return n->op_type ? n->op_type : "?"; }

/* KILN_ERR_* naming the source, the node and its op type. */
static int nfail(const imp *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int nfail(const imp *m, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kiln_errorf(code, "%s: node '%s' (%s): %s", m->src, nname(m), nop(m->node), msg);
}
#define REFUSE(...) nfail(m, KILN_ERR_UNSUPPORTED, __VA_ARGS__)
#define BAD(...) nfail(m, KILN_ERR_INVALID, __VA_ARGS__)

static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static size_t set_slot(const strset *st, const char *s) {
  size_t i = hash(s) & (st->cap - 1);
  while (st->v[i] && strcmp(st->v[i], s)) i = (i + 1) & (st->cap - 1);
  return i;
}

static bool set_has(const strset *st, const char *s) { return st->cap && st->v[set_slot(st, s)]; }

static char *istrdup(imp *m, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = ialloc(m, n);
  if (d) memcpy(d, s, n);
  return d;
}

static const char *set_add(imp *m, strset *st, const char *s) {
  if (2 * (st->n + 1) > st->cap) {
    size_t cap = st->cap ? 2 * st->cap : 1024;
    char **old = st->v;
    size_t old_cap = st->cap;
    if (!(st->v = calloc(cap, sizeof *st->v))) {
      st->v = old;
      return NULL;
    }
    st->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i]) st->v[set_slot(st, old[i])] = old[i];
    free(old);
  }
  char *d = istrdup(m, s);
  if (!d) return NULL;
  st->v[set_slot(st, d)] = d;
  st->n++;
  return d;
}

/* `base`, or `base` with "_2", "_3", ...: a name not in `st` (nor, for a blob, an ONNX tensor's
 * name, which that tensor may claim later). */
static const char *fresh(imp *m, strset *st, const char *base) {
  const bool blob = st == &m->blobs;
  if (!set_has(st, base) && !(blob && set_has(&m->reserved, base))) return set_add(m, st, base);
  size_t n = strlen(base) + 24;
  char *buf = malloc(n);
  if (!buf) return NULL;
  const char *r = NULL;
  for (long k = 2;; k++) {
    snprintf(buf, n, "%s_%ld", base, k);
    if (!set_has(st, buf) && !(blob && set_has(&m->reserved, buf))) {
      r = set_add(m, st, buf);
      break;
    }
  }
  free(buf);
  return r;
}

/* A layer's name. */
static const char *unique(imp *m, const char *base) { return fresh(m, &m->layer_names, base); }
/* A fresh blob's name. */
static const char *fresh_blob(imp *m, const char *base) { return fresh(m, &m->blobs, base); }
/* The blob named after tensor `name` itself, when no blob has taken it yet. */
static const char *own_blob(imp *m, const char *name) {
  if (!set_has(&m->blobs, name)) return set_add(m, &m->blobs, name);
  return fresh_blob(m, name);
}

/* ---- tensors ---------------------------------------------------------------------------- */

static size_t t_slot(const imp *m, const char *s) {
  size_t i = hash(s) & (m->hcap - 1);
  while (m->hidx[i] != (size_t)-1 && strcmp(m->tv[m->hidx[i]]->name, s)) i = (i + 1) & (m->hcap - 1);
  return i;
}

static tensor *t_find(const imp *m, const char *s) {
  if (!m->hcap || !s) return NULL;
  size_t i = m->hidx[t_slot(m, s)];
  return i == (size_t)-1 ? NULL : m->tv[i];
}

static tensor *t_new(imp *m, const char *name) {
  if (2 * (m->ntv + 1) > m->hcap) {
    size_t cap = m->hcap ? 2 * m->hcap : 1024;
    size_t *h = malloc(cap * sizeof *h);
    if (!h) return NULL;
    for (size_t i = 0; i < cap; i++) h[i] = (size_t)-1;
    free(m->hidx);
    m->hidx = h;
    m->hcap = cap;
    for (size_t i = 0; i < m->ntv; i++) m->hidx[t_slot(m, m->tv[i]->name)] = i;
  }
  if (m->ntv == m->cap_tv) {
    size_t cap = m->cap_tv ? 2 * m->cap_tv : 256;
    tensor **v = realloc(m->tv, cap * sizeof *v);
    if (!v) return NULL;
    m->tv = v;
    m->cap_tv = cap;
  }
  tensor *t = ialloc(m, sizeof *t);
  if (!t) return NULL;
  t->name = name;
  t->ip_layer = -1;
  t->producer = -1;
  m->tv[m->ntv] = t;
  m->hidx[t_slot(m, name)] = m->ntv++;
  return t;
}

static int64_t count(const shp *s) {
  int64_t n = 1;
  for (int a = 0; a < s->nd; a++) n *= s->d[a];
  return n;
}

static bool same_shape(const shp *a, const shp *b) {
  if (a->nd != b->nd) return false;
  for (int i = 0; i < a->nd; i++)
    if (a->d[i] != b->d[i]) return false;
  return true;
}

static const char *shape_str(const shp *s) {
  static char buf[4][160];
  static int k;
  char *b = buf[k++ & 3];
  size_t o = 0;
  o += (size_t)snprintf(b + o, 160 - o, "[");
  for (int a = 0; a < s->nd && o < 150; a++)
    o += (size_t)snprintf(b + o, 160 - o, "%s%lld", a ? ", " : "", (long long)s->d[a]);
  snprintf(b + o, 160 - o, "]");
  return b;
}

/* A shape from dims, checked: at most MAXD axes, each 0 .. 2^31, the count under 2^40. */
static int shape_set(shp *s, size_t nd, const int64_t *d, const char *what) {
  if (nd > MAXD) return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s has %zu axes (kiln: at most %d)", what, nd, MAXD);
  s->nd = (int)nd;
  int64_t n = 1;
  for (size_t a = 0; a < nd; a++) {
    if (d[a] < 0 || d[a] > ((int64_t)1 << 31))
      return kiln_errorf(KILN_ERR_INVALID, "%s: dim %zu is %lld", what, a, (long long)d[a]);
    s->d[a] = d[a];
    n *= d[a] ? d[a] : 1;
    if (n > ((int64_t)1 << 40)) return kiln_errorf(KILN_ERR_INVALID, "%s: too many elements", what);
  }
  return KILN_OK;
}

/* A constant of n elements of type dt (the data zeroed). */
static int make_const(imp *m, tensor *t, int dt, const shp *s) {
  int64_t n = count(s);
  if (n > MAX_CONST) return BAD("a constant of %lld elements is beyond the folding's limit", (long long)n);
  t->kind = T_CONST;
  t->dt = dt;
  t->s = *s;
  t->n = n;
  t->f = NULL;
  t->i = NULL;
  if (dt == DT_F) t->f = ialloc(m, sizeof(float) * (size_t)n);
  else t->i = ialloc(m, sizeof(int64_t) * (size_t)n);
  if (!t->f && !t->i) return nomem();
  t->ready = true;
  return KILN_OK;
}

static double cval(const tensor *t, int64_t k) { return t->dt == DT_F ? t->f[k] : (double)t->i[k]; }

/* ---- tensors from the file -------------------------------------------------------------- */

static size_t dt_size(int32_t dt) {
  switch (dt) {
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32: return 4;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64: return 8;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8:
  case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: return 1;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT16: case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16: return 2;
  default: return 0;
  }
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ONNX's raw_data is little-endian: byte swapping is needed on this machine"
#endif

/* A TensorProto (an initializer, a Constant's value) as the constant t. `what` names it. */
static int read_tensor(imp *m, tensor *t, const Onnx__TensorProto *p, const char *what) {
  shp s;
  KILN_TRY(shape_set(&s, p->n_dims, p->dims, what));
  const int32_t dt = p->has_data_type ? p->data_type : 0;
  if (p->has_data_location && p->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: its data is in an external file: kiln reads "
                       "self-contained models (save it with onnx.save(..., save_as_external_data=False))", what);
  const size_t es = dt_size(dt);
  if (!es)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: data_type %d is not one kiln reads (float, "
                       "double, the integers, bool)", what, dt);
  const int64_t n = count(&s);
  if (n > ((int64_t)1 << 31)) return kiln_errorf(KILN_ERR_INVALID, "%s: %lld elements", what, (long long)n);
  const bool isf = dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
  t->kind = T_CONST;
  t->ready = true;
  t->s = s;
  t->n = n;
  t->dt = isf ? DT_F : DT_I;
  if (isf) t->f = ialloc(m, sizeof(float) * (size_t)n);
  else t->i = ialloc(m, sizeof(int64_t) * (size_t)n);
  if (!t->f && !t->i) return nomem();
  size_t have;
  const char *field;
  if (p->has_raw_data) {
    have = p->raw_data.len / es;
    field = "raw_data";
    if (p->raw_data.len % es || have != (size_t)n)
      return kiln_errorf(KILN_ERR_INVALID, "%s: raw_data holds %zu bytes, its dims %s of %s take %lld",
                         what, p->raw_data.len, shape_str(&s), dt == 1 ? "float" : "this type",
                         (long long)n * (long long)es);
    const uint8_t *b = p->raw_data.data;
    for (int64_t k = 0; k < n; k++) {
      const uint8_t *e = b + (size_t)k * es;
      switch (dt) {
      case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: memcpy(&t->f[k], e, 4); break;
      case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: { double v; memcpy(&v, e, 8); t->f[k] = (float)v; break; }
      case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64: memcpy(&t->i[k], e, 8); break;
      case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: { int32_t v; memcpy(&v, e, 4); t->i[k] = v; break; }
      case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32: { uint32_t v; memcpy(&v, e, 4); t->i[k] = v; break; }
      case ONNX__TENSOR_PROTO__DATA_TYPE__INT16: { int16_t v; memcpy(&v, e, 2); t->i[k] = v; break; }
      case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16: { uint16_t v; memcpy(&v, e, 2); t->i[k] = v; break; }
      case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: t->i[k] = (int8_t)*e; break;
      default: t->i[k] = *e; break;
      }
    }
    return KILN_OK;
  }
  if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
    have = p->n_float_data, field = "float_data";
    if (have == (size_t)n) for (int64_t k = 0; k < n; k++) t->f[k] = p->float_data[k];
  } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE) {
    have = p->n_double_data, field = "double_data";
    if (have == (size_t)n) for (int64_t k = 0; k < n; k++) t->f[k] = (float)p->double_data[k];
  } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64) {
    have = p->n_int64_data, field = "int64_data";
    if (have == (size_t)n) for (int64_t k = 0; k < n; k++) t->i[k] = p->int64_data[k];
  } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__UINT64 || dt == ONNX__TENSOR_PROTO__DATA_TYPE__UINT32) {
    have = p->n_uint64_data, field = "uint64_data";
    if (have == (size_t)n) for (int64_t k = 0; k < n; k++) t->i[k] = (int64_t)p->uint64_data[k];
  } else {
    have = p->n_int32_data, field = "int32_data";
    if (have == (size_t)n) for (int64_t k = 0; k < n; k++) t->i[k] = p->int32_data[k];
  }
  if (have != (size_t)n)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %s holds %zu values, its dims %s take %lld", what,
                       field, have, shape_str(&s), (long long)n);
  return KILN_OK;
}

/* ---- attributes ------------------------------------------------------------------------- */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name)) return n->attribute[i];
  return NULL;
}

static int64_t attr_i(const Onnx__NodeProto *n, const char *name, int64_t def) {
  const Onnx__AttributeProto *a = attr(n, name);
  return a && a->has_i ? a->i : def;
}

static float attr_f(const Onnx__NodeProto *n, const char *name, float def) {
  const Onnx__AttributeProto *a = attr(n, name);
  return a && a->has_f ? a->f : def;
}

/* The ints of an attribute (count in *nv; NULL and 0 when absent). */
static const int64_t *attr_ints(const Onnx__NodeProto *n, const char *name, size_t *nv) {
  const Onnx__AttributeProto *a = attr(n, name);
  *nv = a ? a->n_ints : 0;
  return a ? a->ints : NULL;
}

static const char *attr_s(imp *m, const Onnx__NodeProto *n, const char *name, const char *def) {
  const Onnx__AttributeProto *a = attr(n, name);
  if (!a || !a->has_s) return def;
  char *s = ialloc(m, a->s.len + 1);
  if (!s) return def;
  memcpy(s, a->s.data, a->s.len);
  return s;
}

/* ---- the node's inputs and outputs ------------------------------------------------------ */

static tensor *in(const imp *m, int k) {
  const Onnx__NodeProto *n = m->node;
  if (k >= (int)n->n_input || !n->input[k] || !*n->input[k]) return NULL;
  return t_find(m, n->input[k]);
}

static tensor *out(const imp *m, int k) {
  const Onnx__NodeProto *n = m->node;
  if (k >= (int)n->n_output || !n->output[k] || !*n->output[k]) return NULL;
  return t_find(m, n->output[k]);
}

static int need_in(imp *m, int k, tensor **t) {
  if (!(*t = in(m, k))) return BAD("input %d is missing", k);
  return KILN_OK;
}

/* A computed (blob) input k. */
static int blob_in(imp *m, int k, tensor **t) {
  KILN_TRY(need_in(m, k, t));
  if ((*t)->kind != T_BLOB && (*t)->kind != T_PAD)
    return REFUSE("input %d ('%s') is expected to be computed, not a constant", k, (*t)->name);
  return KILN_OK;
}

static int const_in(imp *m, int k, tensor **t, const char *what) {
  KILN_TRY(need_in(m, k, t));
  if ((*t)->kind != T_CONST)
    return REFUSE("its %s (input %d, '%s') is computed in the graph: kiln needs it constant", what, k,
                  (*t)->name);
  return KILN_OK;
}

static int norm_axis(imp *m, int64_t axis, int nd, int *out_axis) {
  if (axis < -nd || axis >= nd) return BAD("axis %lld is outside a tensor of %d axes", (long long)axis, nd);
  *out_axis = (int)(axis < 0 ? axis + nd : axis);
  return KILN_OK;
}

/* ---- layers ----------------------------------------------------------------------------- */

static void put_str(imp *m, const char *s) {
  kiln_strbuf_printf(&m->text, "\"");
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') kiln_strbuf_printf(&m->text, "\\%c", *s);
    else if ((unsigned char)*s < 32) kiln_strbuf_printf(&m->text, "\\%03o", (unsigned char)*s);
    else kiln_strbuf_printf(&m->text, "%c", *s);
  }
  kiln_strbuf_printf(&m->text, "\"");
}

/* Starts a layer: `layer { name: ... type: ... bottom: ... top: ...`; the caller adds its
 * parameters and ends it with end_layer. The layer's index, or -1 (the error set). */
static int begin_layer(imp *m, const char *type, const char *base, int nb, const char *const *b,
                       int nt, const char *const *t) {
  const char *name = unique(m, base && *base ? base : type);
  if (!name) return nomem(), -1;
  if (m->nlayers == m->cap_layers) {
    int cap = m->cap_layers ? 2 * m->cap_layers : 64;
    ilayer *v = realloc(m->layers, sizeof *v * (size_t)cap);
    if (!v) return nomem(), -1;
    m->layers = v;
    m->cap_layers = cap;
  }
  ilayer *l = &m->layers[m->nlayers];
  memset(l, 0, sizeof *l);
  l->name = name;
  kiln_strbuf_printf(&m->text, "layer {\n  name: ");
  put_str(m, name);
  kiln_strbuf_printf(&m->text, "\n  type: \"%s\"\n", type);
  for (int i = 0; i < nb; i++) {
    kiln_strbuf_printf(&m->text, "  bottom: ");
    put_str(m, b[i]);
    kiln_strbuf_printf(&m->text, "\n");
  }
  for (int i = 0; i < nt; i++) {
    kiln_strbuf_printf(&m->text, "  top: ");
    put_str(m, t[i]);
    kiln_strbuf_printf(&m->text, "\n");
  }
  return m->nlayers++;
}

static void params(imp *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void params(imp *m, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  kiln_strbuf_printf(&m->text, "  %s\n", buf);
}

static void end_layer(imp *m) { kiln_strbuf_printf(&m->text, "}\n"); }

/* A parameter blob of layer li, shaped s, its data copied. */
static int add_blob(imp *m, int li, const shp *s, const float *data) {
  ilayer *l = &m->layers[li];
  if (l->nblobs == MAXBLOBS) return kiln_errorf(KILN_ERR_INTERNAL, "too many blobs");
  float *d = ialloc(m, sizeof(float) * (size_t)count(s));
  if (!d) return nomem();
  if (data) memcpy(d, data, sizeof(float) * (size_t)count(s));
  l->bs[l->nblobs] = *s;
  l->bd[l->nblobs++] = d;
  return KILN_OK;
}

#define shape1(a) ((shp){1, {(a)}})

/* The blob of t in t's own ONNX shape: a Reshape layer when its blob has another. */
static int materialize(imp *m, tensor *t, const char **blob) {
  if (t->kind == T_PAD) {
    const char *pn = t->pad_node;
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: node '%s' (Pad): kiln imports a Pad of zeros "
                       "only where a Conv or an AveragePool reads it (as their padding); node "
                       "'%s' (%s) reads it", m->src, pn, nname(m), nop(m->node));
  }
  if (t->kind != T_BLOB) return kiln_errorf(KILN_ERR_INTERNAL, "%s: '%s' has no blob", m->src, t->name);
  if (same_shape(&t->s, &t->cs)) {
    *blob = t->blob;
    return KILN_OK;
  }
  const char *top = own_blob(m, t->name);
  if (!top) return nomem();
  int li = begin_layer(m, "Reshape", top, 1, &t->blob, 1, &top);
  if (li < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  reshape_param { shape {");
  for (int a = 0; a < t->s.nd; a++)
    kiln_strbuf_printf(&m->text, " dim: %lld",
                       a == 0 && t->cs.nd > 0 && t->cs.d[0] == t->s.d[0] ? 0LL : (long long)t->s.d[a]);
  kiln_strbuf_printf(&m->text, " } }\n");
  end_layer(m);
  t->blob = top;
  t->cs = t->s;
  *blob = top;
  return KILN_OK;
}

/* Tensor t as a new blob of shape s (named after the tensor). */
static int set_blob(imp *m, tensor *t, const shp *s, const char **blob) {
  t->kind = T_BLOB;
  t->ready = true;
  t->s = *s;
  t->cs = *s;
  if (!(t->blob = own_blob(m, t->name))) return nomem();
  *blob = t->blob;
  return KILN_OK;
}

/* Output k of the node as a new blob of shape s. */
static int set_out(imp *m, int k, const shp *s, const char **blob) {
  tensor *t = out(m, k);
  if (!t) return BAD("output %d is missing", k);
  return set_blob(m, t, s, blob);
}

/* Output k is x's blob seen in shape s (no layer). */
static int alias_out(imp *m, int k, const tensor *x, const shp *s) {
  tensor *t = out(m, k);
  if (!t) return KILN_OK;
  if (count(s) != count(&x->s)) return BAD("reshapes %s (%lld elements) to %s", shape_str(&x->s), (long long)count(&x->s), shape_str(s));
  t->kind = x->kind;
  t->ready = true;
  t->blob = x->blob;
  t->cs = x->cs;
  t->s = *s;
  memcpy(t->pad, x->pad, sizeof t->pad);
  t->pad_node = x->pad_node;
  return KILN_OK;
}

/* A one-bottom one-top layer of op output 0 with shape s; its index or -1. */
static int layer1(imp *m, const char *type, const char *bottom, const shp *s) {
  const char *top;
  if (set_out(m, 0, s, &top)) return -1;
  return begin_layer(m, type, nname(m), 1, &bottom, 1, &top);
}

/* ---- elementwise ------------------------------------------------------------------------ */

static int op_unary(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  const char *op = nop(m->node), *type = NULL;
  char p[256] = "";
  if (!strcmp(op, "Relu")) type = "ReLU";
  else if (!strcmp(op, "LeakyRelu")) type = "ReLU", snprintf(p, sizeof p, "relu_param { negative_slope: %.9g }", attr_f(m->node, "alpha", 0.01f));
  else if (!strcmp(op, "Elu")) type = "ELU", snprintf(p, sizeof p, "elu_param { alpha: %.9g }", attr_f(m->node, "alpha", 1.0f));
  else if (!strcmp(op, "Sigmoid")) type = "Sigmoid";
  else if (!strcmp(op, "Tanh")) type = "TanH";
  else if (!strcmp(op, "Abs")) type = "AbsVal";
  else if (!strcmp(op, "Exp")) type = "Exp";
  else if (!strcmp(op, "Log")) type = "Log";
  else if (!strcmp(op, "Softplus")) type = "BNLL";
  else if (!strcmp(op, "Sqrt")) type = "Power", snprintf(p, sizeof p, "power_param { power: 0.5 }");
  else if (!strcmp(op, "Neg")) type = "Power", snprintf(p, sizeof p, "power_param { scale: -1 }");
  else if (!strcmp(op, "Reciprocal")) type = "Power", snprintf(p, sizeof p, "power_param { power: -1 }");
  if (!type) return REFUSE("not an op kiln imports");
  int li = layer1(m, type, b, &x->s);
  if (li < 0) return KILN_ERR_NOMEM;
  if (*p) params(m, "%s", p);
  end_layer(m);
  return KILN_OK;
}

/* Whether constant c (broadcast to x's shape s) varies over one span of x's axes [*a, *b) and
 * is constant along the others; it is then expanded over that span into *data (the span's
 * count). */
static int const_span(imp *m, const tensor *c, const shp *s, int *a, int *b, float **data) {
  if (c->s.nd > s->nd) return REFUSE("the constant '%s' %s has more axes than the tensor %s it applies to", c->name, shape_str(&c->s), shape_str(s));
  const int off = s->nd - c->s.nd;
  int lo = s->nd, hi = 0;
  for (int k = 0; k < c->s.nd; k++) {
    if (c->s.d[k] != 1 && c->s.d[k] != s->d[off + k])
      return BAD("the constant '%s' %s does not broadcast to %s", c->name, shape_str(&c->s), shape_str(s));
    if (c->s.d[k] != 1) {
      if (off + k < lo) lo = off + k;
      hi = off + k + 1;
    }
  }
  if (lo >= hi) lo = 1 < s->nd ? 1 : 0, hi = lo + (s->nd ? 1 : 0), lo = hi ? lo : 0;
  *a = lo;
  *b = hi;
  int64_t n = 1;
  for (int k = lo; k < hi; k++) n *= s->d[k];
  float *d = ialloc(m, sizeof(float) * (size_t)(n ? n : 1));
  if (!d) return nomem();
  /* element j of the span: its index along each axis, mapped into c (a 1 broadcasts) */
  for (int64_t j = 0; j < n; j++) {
    int64_t r = j, ci = 0, stride = 1;
    for (int k = hi - 1; k >= lo; k--) {
      const int64_t idx = r % s->d[k];
      r /= s->d[k];
      const int kc = k - off;
      if (kc >= 0 && c->s.d[kc] != 1) ci += idx * stride;
      if (kc >= 0) stride *= c->s.d[kc];
    }
    /* the axes of c after the span are 1s: the stride above already covers them */
    d[j] = (float)cval(c, ci);
  }
  *data = d;
  return KILN_OK;
}

static int try_gelu(imp *m, tensor *x, double c);
static int broadcast(imp *m, const shp *a, const shp *b, shp *s);

/* Whether y's axes longer than 1 are a run [*lo, *hi) of x's, aligned from the right (kiln's
 * Scale with a second bottom multiplies by such a factor; none: the run is empty, at 0). */
static bool scale_span(const tensor *x, const tensor *y, int *lo, int *hi) {
  const int off = x->s.nd - y->s.nd;
  if (off < 0) return false;
  *lo = -1, *hi = -1;
  for (int k = 0; k < y->s.nd; k++) {
    if (y->s.d[k] == 1) continue;
    if (y->s.d[k] != x->s.d[off + k] || (*hi >= 0 && *hi != off + k)) return false;
    if (*lo < 0) *lo = off + k;
    *hi = off + k + 1;
  }
  if (*lo < 0) *lo = 0, *hi = 0;
  return true;
}

/* Add, Sub, Mul or Max of two computed tensors of different shapes that broadcast (NumPy's
 * rule): each one's axes of 1 that the other's are longer than are repeated by Tile layers, and
 * Eltwise combines the two tensors of the output's shape. (An attention mask N x 1 x 1 x S added
 * to the scores N x H x T x S, as `kiln export onnx` writes MultiHeadAttention's padding mask.) */
static int broadcast_eltwise(imp *m, const char *op, tensor *x0, tensor *x1) {
  shp os;
  KILN_TRY(broadcast(m, &x0->s, &x1->s, &os));
  if (!strcmp(op, "Min")) return REFUSE("kiln's Eltwise has no MIN");
  const char *bs[2];
  tensor *xs[2] = {x0, x1};
  for (int i = 0; i < 2; i++) {
    /* the tensor itself where it has the output's axes (its blob kept for later readers), else
     * a view with leading 1s */
    tensor v = *xs[i], *src = xs[i];
    if (xs[i]->s.nd != os.nd) {
      v.s = (shp){os.nd, {0}};
      const int off = os.nd - xs[i]->s.nd;
      for (int k = 0; k < os.nd; k++) v.s.d[k] = k < off ? 1 : xs[i]->s.d[k - off];
      src = &v;
    }
    KILN_TRY(materialize(m, src, &bs[i]));
    shp cur = src->s;
    for (int k = 0; k < os.nd; k++) {
      if (cur.d[k] == os.d[k]) continue;
      char nm[1024];
      snprintf(nm, sizeof nm, "%s/tile%d_%d", nname(m), i, k);
      const char *top = fresh_blob(m, nm);
      if (!top) return nomem();
      if (begin_layer(m, "Tile", nm, 1, &bs[i], 1, &top) < 0) return KILN_ERR_NOMEM;
      params(m, "tile_param { axis: %d tiles: %lld }", k, (long long)os.d[k]);
      end_layer(m);
      bs[i] = top;
      cur.d[k] = os.d[k];
    }
  }
  const char *top;
  KILN_TRY(set_out(m, 0, &os, &top));
  if (begin_layer(m, "Eltwise", nname(m), 2, bs, 1, &top) < 0) return KILN_ERR_NOMEM;
  params(m, "eltwise_param { operation: %s%s }",
         !strcmp(op, "Mul") ? "PROD" : !strcmp(op, "Max") ? "MAX" : "SUM",
         !strcmp(op, "Sub") ? " coeff: 1 coeff: -1" : "");
  end_layer(m);
  return KILN_OK;
}

/* Add, Sub, Mul, Div, Max (and Min refused) with a constant or between computed tensors. */
static int op_binary(imp *m) {
  const char *op = nop(m->node);
  tensor *x0, *x1;
  KILN_TRY(need_in(m, 0, &x0));
  KILN_TRY(need_in(m, 1, &x1));
  const bool c0 = x0->kind == T_CONST, c1 = x1->kind == T_CONST;
  if (!c0 && !c1) {
    if (!strcmp(op, "Div") || !strcmp(op, "Pow"))
      return REFUSE("between two computed tensors: kiln has no layer for it");
    /* x * y where y spans a run of x's axes (a squeeze-and-excitation gate): Scale with y; any
     * other pair (the same shapes, or shapes that broadcast) an Eltwise */
    tensor *x = count(&x0->s) >= count(&x1->s) ? x0 : x1, *y = x == x0 ? x1 : x0;
    int lo, hi;
    if (strcmp(op, "Mul") || same_shape(&x0->s, &x1->s) || !scale_span(x, y, &lo, &hi))
      return broadcast_eltwise(m, op, x0, x1);
    tensor yv = *y;
    yv.s.nd = hi - lo;
    for (int k = lo; k < hi; k++) yv.s.d[k - lo] = x->s.d[k];
    const char *bs[2], *top;
    KILN_TRY(materialize(m, x, &bs[0]));
    KILN_TRY(materialize(m, &yv, &bs[1]));
    KILN_TRY(set_out(m, 0, &x->s, &top));
    if (begin_layer(m, "Scale", nname(m), 2, bs, 1, &top) < 0) return KILN_ERR_NOMEM;
    params(m, "scale_param { axis: %d num_axes: %d }", lo, hi - lo);
    end_layer(m);
    return KILN_OK;
  }
  if (c0 && c1) return REFUSE("both inputs constant (not folded)");
  tensor *x = c0 ? x1 : x0, *c = c0 ? x0 : x1;
  const bool c_first = c0;
  /* a MatMul's InnerProduct takes an Add of its bias [N] */
  if (!strcmp(op, "Add") && x->ip_layer >= 0 && x->uses == 1 && c->n == x->s.d[x->s.nd - 1] &&
      count(&c->s) == c->n) {
    bool vec = true;
    for (int k = 0; k < c->s.nd - 1; k++) vec &= c->s.d[k] == 1;
    if (vec && c->dt == DT_F) {
      KILN_TRY(add_blob(m, x->ip_layer, &(shp){1, {c->n}}, c->f));
      if (m->text.failed) return nomem();
      memset(m->text.s + m->layers[x->ip_layer].bias_off, ' ', strlen(" bias_term: false"));
      KILN_TRY(alias_out(m, 0, x, &x->s));
      m->dropped++;
      return KILN_OK;
    }
  }
  const char *b;
  if (c->n == 1 && (!strcmp(op, "Mul") || (!strcmp(op, "Div") && !c_first))) {
    const int r = try_gelu(m, x, cval(c, 0));
    if (r <= 0) return r;
  }
  if (c->n == 1) {
    const float v = (float)cval(c, 0);
    char p[256];
    if (!strcmp(op, "Add")) snprintf(p, sizeof p, "power_param { shift: %.9g }", v);
    else if (!strcmp(op, "Sub")) snprintf(p, sizeof p, c_first ? "power_param { scale: -1 shift: %.9g }" : "power_param { shift: %.9g }", c_first ? v : -v);
    else if (!strcmp(op, "Mul")) snprintf(p, sizeof p, "power_param { scale: %.9g }", v);
    else if (!strcmp(op, "Div") && !c_first) snprintf(p, sizeof p, "power_param { scale: %.9g }", 1.0f / v);
    else if (!strcmp(op, "Pow") && !c_first) snprintf(p, sizeof p, "power_param { power: %.9g }", v);
    else if (!strcmp(op, "Max") && v == 0) p[0] = 0;
    else return REFUSE("with the constant %g%s: kiln has no layer for it", v, c_first ? " first" : "");
    shp s = x->s;
    if (c->s.nd > s.nd) return REFUSE("the constant has more axes than the tensor");
    KILN_TRY(materialize(m, x, &b));
    int li = layer1(m, p[0] ? "Power" : "ReLU", b, &s);
    if (li < 0) return KILN_ERR_NOMEM;
    if (p[0]) params(m, "%s", p);
    end_layer(m);
    return KILN_OK;
  }
  if (c_first && (!strcmp(op, "Sub") || !strcmp(op, "Div")))
    return REFUSE("a constant %s a computed tensor: kiln has no layer for it", op[0] == 'S' ? "minus" : "over");
  if (strcmp(op, "Add") && strcmp(op, "Sub") && strcmp(op, "Mul") && strcmp(op, "Div"))
    return REFUSE("with a constant of %lld values: kiln has no layer for it", (long long)c->n);
  int a = 0, e = 0;
  float *d = NULL;
  KILN_TRY(const_span(m, c, &x->s, &a, &e, &d));
  int64_t n = 1;
  for (int k = a; k < e; k++) n *= x->s.d[k];
  const bool is_scale = !strcmp(op, "Mul") || !strcmp(op, "Div");
  for (int64_t k = 0; k < n; k++) {
    if (!strcmp(op, "Sub")) d[k] = -d[k];
    if (!strcmp(op, "Div")) d[k] = 1.0f / d[k];
  }
  KILN_TRY(materialize(m, x, &b));
  int li = layer1(m, is_scale ? "Scale" : "Bias", b, &x->s);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "%s { axis: %d num_axes: %d }", is_scale ? "scale_param" : "bias_param", a, e - a);
  end_layer(m);
  shp bs = {e - a, {0}};
  for (int k = a; k < e; k++) bs.d[k - a] = x->s.d[k];
  return add_blob(m, li, &bs, d);
}

static int op_prelu(imp *m) {
  tensor *x, *sl;
  KILN_TRY(blob_in(m, 0, &x));
  KILN_TRY(const_in(m, 1, &sl, "slope"));
  if (x->s.nd < 2) return REFUSE("an input of %d axes (kiln's PReLU: channels on axis 1)", x->s.nd);
  const int64_t C = x->s.d[1];
  bool ok = sl->n == 1 || sl->n == C;
  if (sl->n == C && C > 1) {
    /* the slopes must run along axis 1 once broadcast */
    const int off = x->s.nd - sl->s.nd;
    for (int k = 0; k < sl->s.nd; k++)
      if (sl->s.d[k] != 1 && off + k != 1) ok = false;
  }
  if (!ok || sl->dt != DT_F) return REFUSE("slopes %s: kiln's PReLU takes one per channel (axis 1) or one", shape_str(&sl->s));
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  int li = layer1(m, "PReLU", b, &x->s);
  if (li < 0) return KILN_ERR_NOMEM;
  if (sl->n == 1 && C != 1) params(m, "prelu_param { channel_shared: true }");
  end_layer(m);
  return add_blob(m, li, &(shp){1, {sl->n}}, sl->f);
}

/* ---- convolution and pooling ------------------------------------------------------------ */

typedef struct {
  int64_t k[2], s[2], d[2], pb[2], pe[2];
} win2;

/* A window's kernel, stride and (begin) pad as convolution_param's and pooling_param's fields:
 * one value where height and width agree, the _h and _w pair where they do not; a stride of 1
 * and a pad of 0 are the defaults of both and left out. */
static void window_fields(imp *m, const win2 *w) {
  static const char *const names[3][3] = {
      {"kernel_size", "kernel_h", "kernel_w"}, {"stride", "stride_h", "stride_w"}, {"pad", "pad_h", "pad_w"}};
  const int64_t *v[3] = {w->k, w->s, w->pb}, dflt[3] = {-1, 1, 0};
  for (int f = 0; f < 3; f++) {
    if (v[f][0] != v[f][1])
      kiln_strbuf_printf(&m->text, " %s: %lld %s: %lld", names[f][1], (long long)v[f][0], names[f][2],
                         (long long)v[f][1]);
    else if (v[f][0] != dflt[f])
      kiln_strbuf_printf(&m->text, " %s: %lld", names[f][0], (long long)v[f][0]);
  }
}

static int read_window(imp *m, const tensor *x, const int64_t *kshape, win2 *w) {
  size_t n;
  const int64_t *v;
  const char *ap = attr_s(m, m->node, "auto_pad", "NOTSET");
  if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
    return REFUSE("auto_pad %s: kiln imports explicit pads (export with pads, PyTorch's default)", ap);
  for (int i = 0; i < 2; i++) w->k[i] = kshape[i], w->s[i] = 1, w->d[i] = 1, w->pb[i] = w->pe[i] = 0;
  if ((v = attr_ints(m->node, "strides", &n)) && n) {
    if (n != 2) return BAD("strides has %zu values for 2 spatial axes", n);
    w->s[0] = v[0], w->s[1] = v[1];
  }
  if ((v = attr_ints(m->node, "dilations", &n)) && n) {
    if (n != 2) return BAD("dilations has %zu values for 2 spatial axes", n);
    w->d[0] = v[0], w->d[1] = v[1];
  }
  if ((v = attr_ints(m->node, "pads", &n)) && n) {
    if (n != 4) return BAD("pads has %zu values for 2 spatial axes", n);
    w->pb[0] = v[0], w->pb[1] = v[1], w->pe[0] = v[2], w->pe[1] = v[3];
  }
  for (int i = 0; i < 2; i++) {
    if (w->k[i] < 1 || w->s[i] < 1 || w->d[i] < 1 || w->pb[i] < 0 || w->pe[i] < 0 ||
        w->k[i] > 65536 || w->s[i] > 65536 || w->d[i] > 65536 || w->pb[i] > 65536 || w->pe[i] > 65536)
      return BAD("kernel %lld, stride %lld, dilation %lld, pads %lld and %lld: out of range",
                 (long long)w->k[i], (long long)w->s[i], (long long)w->d[i], (long long)w->pb[i], (long long)w->pe[i]);
  }
  if (x->kind == T_PAD)
    for (int i = 0; i < 2; i++) w->pb[i] += x->pad[i], w->pe[i] += x->pad[2 + i];
  return KILN_OK;
}

/* The blob under a T_PAD (its unpadded input) or the tensor's own. */
static int window_input(imp *m, tensor *x, const char **b, shp *s) {
  if (x->kind == T_PAD) {
    *b = x->blob;
    *s = x->cs;
    return KILN_OK;
  }
  *s = x->s;
  return materialize(m, x, b);
}

static int op_conv(imp *m) {
  const bool transposed = !strcmp(nop(m->node), "ConvTranspose");
  tensor *x, *w, *bias = in(m, 2);
  KILN_TRY(need_in(m, 0, &x));
  if (x->kind == T_CONST) return REFUSE("input 0 is a constant");
  KILN_TRY(const_in(m, 1, &w, "weight"));
  if (w->s.nd != 4 || w->dt != DT_F)
    return REFUSE("weights %s: kiln imports 2-D convolutions (4-D float weights)", shape_str(&w->s));
  if (bias && (bias->kind != T_CONST || bias->dt != DT_F)) return REFUSE("its bias is not a float constant");
  const char *b;
  shp xs;
  KILN_TRY(window_input(m, x, &b, &xs));
  if (xs.nd != 4) return REFUSE("input %s: kiln imports 2-D convolutions of N x C x H x W", shape_str(&xs));
  win2 wn;
  KILN_TRY(read_window(m, x, &w->s.d[2], &wn));
  const int64_t group = attr_i(m->node, "group", 1);
  if (group < 1 || xs.d[1] % group) return BAD("group %lld does not divide %lld channels", (long long)group, (long long)xs.d[1]);
  int64_t M;
  if (!transposed) {
    M = w->s.d[0];
    if (w->s.d[1] * group != xs.d[1] || M % group)
      return BAD("weights %s for %lld input channels in %lld groups", shape_str(&w->s), (long long)xs.d[1], (long long)group);
  } else {
    M = w->s.d[1] * group;
    if (w->s.d[0] != xs.d[1]) return BAD("weights %s for %lld input channels", shape_str(&w->s), (long long)xs.d[1]);
    size_t n;
    const int64_t *op = attr_ints(m->node, "output_padding", &n);
    for (size_t i = 0; op && i < n; i++)
      if (op[i]) return REFUSE("output_padding %lld: Caffe's Deconvolution has none", (long long)op[i]);
    if (attr(m->node, "output_shape")) return REFUSE("output_shape: kiln imports explicit pads");
  }
  if (bias && bias->n != M) return BAD("bias of %lld values for %lld outputs", (long long)bias->n, (long long)M);
  shp os = {4, {xs.d[0], M, 0, 0}};
  for (int i = 0; i < 2; i++) {
    const int64_t ek = wn.d[i] * (wn.k[i] - 1) + 1, in_ = xs.d[2 + i];
    if (!transposed) {
      const int64_t o = (in_ + wn.pb[i] + wn.pe[i] - ek) / wn.s[i] + 1;
      const int64_t oc = (in_ + 2 * wn.pb[i] - ek) / wn.s[i] + 1;
      if (in_ + wn.pb[i] + wn.pe[i] < ek) return BAD("the kernel is larger than the padded input");
      if (o != oc)
        return REFUSE("pads %lld and %lld on axis %d give %lld outputs; Caffe's symmetric pad %lld gives %lld",
                      (long long)wn.pb[i], (long long)wn.pe[i], 2 + i, (long long)o, (long long)wn.pb[i], (long long)oc);
      os.d[2 + i] = o;
    } else {
      if (wn.pb[i] != wn.pe[i]) return REFUSE("unequal pads %lld and %lld: Caffe's Deconvolution pads alike", (long long)wn.pb[i], (long long)wn.pe[i]);
      os.d[2 + i] = wn.s[i] * (in_ - 1) + ek - 2 * wn.pb[i];
      if (os.d[2 + i] < 1) return BAD("gives an empty output");
    }
  }
  int li = layer1(m, transposed ? "Deconvolution" : "Convolution", b, &os);
  if (li < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  convolution_param { num_output: %lld%s", (long long)M, bias ? "" : " bias_term: false");
  window_fields(m, &wn);
  if (group != 1) kiln_strbuf_printf(&m->text, " group: %lld", (long long)group);
  if (wn.d[0] == wn.d[1]) { if (wn.d[0] != 1) kiln_strbuf_printf(&m->text, " dilation: %lld", (long long)wn.d[0]); }
  else kiln_strbuf_printf(&m->text, " dilation: %lld dilation: %lld", (long long)wn.d[0], (long long)wn.d[1]);
  kiln_strbuf_printf(&m->text, " }\n");
  end_layer(m);
  KILN_TRY(add_blob(m, li, &w->s, w->f));
  if (bias) KILN_TRY(add_blob(m, li, &shape1(M), bias->f));
  return KILN_OK;
}

/* Caffe's pooled size with pad p (CEIL: its rule that the last window starts inside the padded
 * input). */
static int64_t caffe_pooled(int64_t in_, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  int64_t o = ceil_mode ? (in_ + 2 * p - k + s - 1) / s + 1 : (in_ + 2 * p - k) / s + 1;
  if (ceil_mode && p > 0 && (o - 1) * s >= in_ + p) o--;
  return o;
}

static int op_pool(imp *m) {
  const char *op = nop(m->node);
  const bool ave = !strcmp(op, "AveragePool");
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  if (x->kind == T_PAD && !ave) return REFUSE("reads a Pad of zeros ('%s'): a max over real zeros has no Caffe form", x->name);
  const char *b;
  shp xs;
  KILN_TRY(window_input(m, x, &b, &xs));
  if (xs.nd != 4) return REFUSE("input %s: kiln imports 2-D pooling of N x C x H x W", shape_str(&xs));
  size_t n;
  const int64_t *ks = attr_ints(m->node, "kernel_shape", &n);
  if (!ks || n != 2) return BAD("kernel_shape has %zu values for 2 spatial axes", n);
  win2 w;
  KILN_TRY(read_window(m, x, ks, &w));
  if (w.d[0] != 1 || w.d[1] != 1) return REFUSE("dilations: Caffe's pooling has none");
  if (attr_i(m->node, "storage_order", 0)) return REFUSE("storage_order 1");
  const bool ceil_mode = attr_i(m->node, "ceil_mode", 0) != 0;
  const bool cip = attr_i(m->node, "count_include_pad", 0) != 0;
  /* real zeros a Pad node put in: counted by the divisor whatever count_include_pad says */
  const int64_t rb[2] = {x->kind == T_PAD ? x->pad[0] : 0, x->kind == T_PAD ? x->pad[1] : 0};
  const int64_t re[2] = {x->kind == T_PAD ? x->pad[2] : 0, x->kind == T_PAD ? x->pad[3] : 0};
  shp os = {4, {xs.d[0], xs.d[1], 0, 0}};
  bool mode_ceil = ceil_mode;
  for (int i = 0; i < 2; i++) {
    const int64_t in_ = xs.d[2 + i], k = w.k[i], s = w.s[i], pb = w.pb[i], pe = w.pe[i];
    if (in_ + pb + pe < k) return BAD("the window is larger than the padded input");
    /* ONNX's size (PyTorch's rule for ceil_mode: a window must start inside the input or its
     * begin padding) */
    int64_t o = ceil_mode ? (in_ + pb + pe - k + s - 1) / s + 1 : (in_ + pb + pe - k) / s + 1;
    if (ceil_mode && (o - 1) * s >= in_ + pb) o--;
    os.d[2 + i] = o;
  }
  /* Caffe's pad is the begin pad; its round mode whichever gives ONNX's sizes on both axes
   * (CEIL, Caffe's default, where both do: the windows are the same) */
  bool found = false;
  for (int tries = 0; tries < 2 && !found; tries++) {
    const bool cm = tries == 0;
    if (caffe_pooled(xs.d[2], w.k[0], w.s[0], w.pb[0], cm) == os.d[2] &&
        caffe_pooled(xs.d[3], w.k[1], w.s[1], w.pb[1], cm) == os.d[3])
      found = true, mode_ceil = cm;
  }
  if (!found)
    return REFUSE("pads %lld, %lld, %lld, %lld with ceil_mode %d give %s; Caffe's symmetric pads cannot",
                  (long long)w.pb[0], (long long)w.pb[1], (long long)w.pe[0], (long long)w.pe[1],
                  ceil_mode, shape_str(&os));
  if (ave) {
    /* every window's divisor: ONNX's against Caffe's (the window clipped to [-pad, in + pad)) */
    for (int i = 0; i < 2; i++) {
      const int64_t in_ = xs.d[2 + i], k = w.k[i], s = w.s[i], pb = w.pb[i], pe = w.pe[i];
      for (int64_t o = 0; o < os.d[2 + i]; o++) {
        const int64_t hs = o * s - pb; /* in the real input's coordinates */
        const int64_t caffe = (hs + k < in_ + pb ? hs + k : in_ + pb) - hs;
        int64_t onnx;
        if (cip) onnx = (hs + k < in_ + pe ? hs + k : in_ + pe) - hs;
        else {
          const int64_t lo = hs > -rb[i] ? hs : -rb[i], hi = hs + k < in_ + re[i] ? hs + k : in_ + re[i];
          onnx = hi - lo;
        }
        if (onnx != caffe)
          return REFUSE("count_include_pad %d with pads %lld and %lld on axis %d: window %lld averages over %lld "
                        "values, Caffe's over %lld (kiln imports it where the two agree)",
                        cip, (long long)pb, (long long)pe, 2 + i, (long long)o, (long long)onnx, (long long)caffe);
      }
    }
  }
  int li = layer1(m, "Pooling", b, &os);
  if (li < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  pooling_param { pool: %s", ave ? "AVE" : "MAX");
  window_fields(m, &w);
  if (!mode_ceil) kiln_strbuf_printf(&m->text, " round_mode: FLOOR");
  kiln_strbuf_printf(&m->text, " }\n");
  end_layer(m);
  return KILN_OK;
}

static int op_global_pool(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  if (x->s.nd != 4) return REFUSE("input %s: kiln imports 2-D pooling of N x C x H x W", shape_str(&x->s));
  shp os = {4, {x->s.d[0], x->s.d[1], 1, 1}};
  if (layer1(m, "Pooling", b, &os) < 0) return KILN_ERR_NOMEM;
  params(m, "pooling_param { pool: %s global_pooling: true }", !strcmp(nop(m->node), "GlobalAveragePool") ? "AVE" : "MAX");
  end_layer(m);
  return KILN_OK;
}

static int op_pad(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  const char *mode = attr_s(m, m->node, "mode", "constant");
  if (strcmp(mode, "constant")) return REFUSE("mode %s: kiln imports padding with zeros", mode);
  int64_t p[2 * MAXD];
  size_t n;
  if (m->opset < 11) {
    const int64_t *v = attr_ints(m->node, "pads", &n);
    if (!v) return BAD("no pads");
    if (n > 2 * MAXD) return BAD("pads has %zu values", n);
    memcpy(p, v, n * sizeof *p);
    if (attr_f(m->node, "value", 0) != 0) return REFUSE("a value other than 0");
  } else {
    tensor *pt, *cv = in(m, 2);
    KILN_TRY(const_in(m, 1, &pt, "pads"));
    if (pt->dt != DT_I || pt->n > 2 * MAXD) return BAD("pads is not an int64 list");
    n = (size_t)pt->n;
    memcpy(p, pt->i, n * sizeof *p);
    if (cv && (cv->kind != T_CONST || cv->n != 1 || cval(cv, 0) != 0)) return REFUSE("a value other than 0");
    if (in(m, 3)) return REFUSE("axes: kiln imports pads of every axis");
  }
  if (x->s.nd != 4 || n != 8 || x->kind == T_PAD)
    return REFUSE("pads of %zu values on %s: kiln imports padding of H and W before a Conv or AveragePool", n, shape_str(&x->s));
  if (p[0] || p[1] || p[4] || p[5] || p[2] < 0 || p[3] < 0 || p[6] < 0 || p[7] < 0 || p[2] > 65536 || p[3] > 65536 || p[6] > 65536 || p[7] > 65536)
    return REFUSE("pads N or C, or negative: kiln imports padding of H and W");
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  tensor *t = out(m, 0);
  if (!t) return KILN_OK;
  t->kind = T_PAD;
  t->ready = true;
  t->blob = b;
  t->cs = x->s;
  t->s = x->s;
  t->s.d[2] += p[2] + p[6];
  t->s.d[3] += p[3] + p[7];
  t->pad[0] = p[2], t->pad[1] = p[3], t->pad[2] = p[6], t->pad[3] = p[7];
  if (!(t->pad_node = istrdup(m, nname(m)))) return nomem(); /* a copy that lives on */
  return KILN_OK;
}

/* ---- products --------------------------------------------------------------------------- */

static int op_gemm(imp *m) {
  tensor *a, *w, *c = in(m, 2);
  KILN_TRY(blob_in(m, 0, &a));
  KILN_TRY(const_in(m, 1, &w, "weight (B)"));
  if (attr_i(m->node, "transA", 0)) return REFUSE("transA 1: kiln's InnerProduct reads items as rows");
  const bool tb = attr_i(m->node, "transB", 0) != 0;
  const float alpha = attr_f(m->node, "alpha", 1), beta = attr_f(m->node, "beta", 1);
  if (a->s.nd != 2 || w->s.nd != 2 || w->dt != DT_F) return BAD("A %s and B %s are not matrices", shape_str(&a->s), shape_str(&w->s));
  const int64_t K = a->s.d[1], N = tb ? w->s.d[0] : w->s.d[1];
  if ((tb ? w->s.d[1] : w->s.d[0]) != K) return BAD("A %s and B %s (transB %d) do not multiply", shape_str(&a->s), shape_str(&w->s), tb);
  if (c && (c->kind != T_CONST || c->dt != DT_F)) return REFUSE("C is not a float constant");
  if (c && c->n != N && c->n != 1) return REFUSE("C %s: kiln's InnerProduct adds one bias per output", shape_str(&c->s));
  if (c && c->s.nd == 2 && c->s.d[0] != 1) return REFUSE("C %s: kiln's InnerProduct adds one bias per output", shape_str(&c->s));
  /* InnerProduct flattens from axis 1: a blob whose first axis is A's rows serves as it is */
  const char *b;
  if (a->kind == T_BLOB && a->cs.nd >= 2 && a->cs.d[0] == a->s.d[0]) b = a->blob;
  else KILN_TRY(materialize(m, a, &b));
  shp os = {2, {a->s.d[0], N}};
  int li = layer1(m, "InnerProduct", b, &os);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "inner_product_param { num_output: %lld%s }", (long long)N, c ? "" : " bias_term: false");
  end_layer(m);
  shp ws = {2, {N, K}};
  KILN_TRY(add_blob(m, li, &ws, NULL));
  float *wd = m->layers[li].bd[0];
  for (int64_t i = 0; i < N; i++)
    for (int64_t k = 0; k < K; k++) {
      const float v = tb ? w->f[i * K + k] : w->f[k * N + i];
      wd[i * K + k] = alpha == 1 ? v : alpha * v;
    }
  if (c) {
    KILN_TRY(add_blob(m, li, &shape1(N), NULL));
    for (int64_t i = 0; i < N; i++) {
      const float v = c->f[c->n == 1 ? 0 : i];
      m->layers[li].bd[1][i] = beta == 1 ? v : beta * v;
    }
  }
  return KILN_OK;
}

/* Two computed tensors: kiln's MatMul layer, with ONNX's (NumPy's) broadcasting of the axes
 * before the last two. */
static int matmul_computed(imp *m, tensor *a, tensor *b) {
  if (a->s.nd < 2 || b->s.nd < 2)
    return REFUSE("A %s by B %s: kiln's MatMul takes two tensors of two axes or more",
                  shape_str(&a->s), shape_str(&b->s));
  const int na = a->s.nd, nb = b->s.nd, nd = na > nb ? na : nb;
  if (a->s.d[na - 1] != b->s.d[nb - 2])
    return BAD("A %s and B %s do not multiply", shape_str(&a->s), shape_str(&b->s));
  shp os = {nd, {0}};
  for (int i = 0; i < nd - 2; i++) {
    const int ia = i - (nd - na), ib = i - (nd - nb);
    const int64_t da = ia >= 0 ? a->s.d[ia] : 1, db = ib >= 0 ? b->s.d[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return BAD("A %s and B %s do not broadcast", shape_str(&a->s), shape_str(&b->s));
    os.d[i] = da > db ? da : db;
  }
  os.d[nd - 2] = a->s.d[na - 2];
  os.d[nd - 1] = b->s.d[nb - 1];
  const char *bs[2], *top;
  KILN_TRY(materialize(m, a, &bs[0]));
  KILN_TRY(materialize(m, b, &bs[1]));
  KILN_TRY(set_out(m, 0, &os, &top));
  if (begin_layer(m, "MatMul", nname(m), 2, bs, 1, &top) < 0) return KILN_ERR_NOMEM;
  end_layer(m);
  return KILN_OK;
}

static int op_matmul(imp *m) {
  tensor *a, *w;
  KILN_TRY(need_in(m, 0, &a));
  KILN_TRY(need_in(m, 1, &w));
  if (a->kind != T_CONST && w->kind != T_CONST) return matmul_computed(m, a, w);
  if (a->kind == T_CONST)
    return REFUSE("a constant by a computed tensor: kiln imports a MatMul of a computed tensor "
                  "by a constant matrix (an InnerProduct) or of two computed tensors (MatMul)");
  if (w->s.nd != 2 || a->s.nd < 1 || w->dt != DT_F) return REFUSE("B %s is not a float matrix", shape_str(&w->s));
  const int64_t K = w->s.d[0], N = w->s.d[1];
  if (a->s.d[a->s.nd - 1] != K) return BAD("A %s and B %s do not multiply", shape_str(&a->s), shape_str(&w->s));
  const char *b;
  KILN_TRY(materialize(m, a, &b));
  shp os = a->s;
  os.d[os.nd - 1] = N;
  int li = layer1(m, "InnerProduct", b, &os);
  if (li < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  inner_product_param { num_output: %lld", (long long)N);
  m->layers[li].bias_off = m->text.len;
  kiln_strbuf_printf(&m->text, " bias_term: false axis: %d transpose: true }\n", a->s.nd - 1);
  end_layer(m);
  KILN_TRY(add_blob(m, li, &w->s, w->f));
  tensor *t = out(m, 0);
  if (t) t->ip_layer = li;
  return KILN_OK;
}

/* ---- normalization ---------------------------------------------------------------------- */

static int op_batchnorm(imp *m) {
  tensor *x, *sc, *bi, *mean, *var;
  KILN_TRY(blob_in(m, 0, &x));
  KILN_TRY(const_in(m, 1, &sc, "scale"));
  KILN_TRY(const_in(m, 2, &bi, "bias"));
  KILN_TRY(const_in(m, 3, &mean, "mean"));
  KILN_TRY(const_in(m, 4, &var, "variance"));
  if (attr_i(m->node, "training_mode", 0)) return REFUSE("training_mode 1: kiln imports inference graphs (export in eval mode)");
  if (m->opset < 9 && !attr_i(m->node, "spatial", 1)) return REFUSE("spatial 0");
  for (int k = 1; k < (int)m->node->n_output; k++)
    if (out(m, k) && out(m, k)->uses) return REFUSE("output %d (the running statistics) is read: kiln imports inference graphs", k);
  if (x->s.nd < 2) return REFUSE("input %s: no channel axis", shape_str(&x->s));
  const int64_t C = x->s.d[1];
  const tensor *ps[4] = {sc, bi, mean, var};
  for (int k = 0; k < 4; k++)
    if (ps[k]->n != C || ps[k]->dt != DT_F) return BAD("input %d has %lld values for %lld channels", k + 1, (long long)ps[k]->n, (long long)C);
  const float eps = attr_f(m->node, "epsilon", 1e-5f);
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  bool identity = true;
  for (int64_t c = 0; c < C; c++) identity &= sc->f[c] == 1 && bi->f[c] == 0;
  const char *top;
  KILN_TRY(set_out(m, 0, &x->s, &top));
  const char *bn_top = top;
  if (!identity) {
    char nm[1024];
    snprintf(nm, sizeof nm, "%s@bn", top);
    if (!(bn_top = fresh_blob(m, nm))) return nomem();
  }
  int li = begin_layer(m, "BatchNorm", nname(m), 1, &b, 1, &bn_top);
  if (li < 0) return KILN_ERR_NOMEM;
  /* global statistics in TEST, batch ones in TRAIN; ONNX's momentum (PyTorch's 1 - momentum)
   * is how much of the running statistics each training batch keeps: Caffe's
   * moving_average_fraction, so the imported net trains its statistics as the model did */
  const float momentum = attr_f(m->node, "momentum", 0.9f);
  if (!(momentum >= 0 && momentum <= 1)) return BAD("momentum %g outside 0..1", momentum);
  params(m, "batch_norm_param { eps: %.9g moving_average_fraction: %.9g }", eps, momentum);
  end_layer(m);
  const float one = 1;
  KILN_TRY(add_blob(m, li, &shape1(C), mean->f));
  KILN_TRY(add_blob(m, li, &shape1(C), var->f));
  KILN_TRY(add_blob(m, li, &shape1(1), &one));
  if (identity) return KILN_OK;
  char nm[1024];
  snprintf(nm, sizeof nm, "%s/scale", nname(m));
  li = begin_layer(m, "Scale", nm, 1, &bn_top, 1, &top);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "scale_param { bias_term: true }");
  end_layer(m);
  KILN_TRY(add_blob(m, li, &shape1(C), sc->f));
  return add_blob(m, li, &shape1(C), bi->f);
}

static int op_lrn(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  const int64_t size = attr_i(m->node, "size", 0);
  if (size < 1 || size % 2 == 0) return REFUSE("size %lld: Caffe's LRN takes an odd window", (long long)size);
  if (layer1(m, "LRN", b, &x->s) < 0) return KILN_ERR_NOMEM;
  params(m, "lrn_param { local_size: %lld alpha: %.9g beta: %.9g k: %.9g }", (long long)size,
         attr_f(m->node, "alpha", 1e-4f), attr_f(m->node, "beta", 0.75f), attr_f(m->node, "bias", 1.0f));
  end_layer(m);
  return KILN_OK;
}

/* ---- chains of nodes that are one kiln layer ----------------------------------------------
 *
 * Exporters write LayerNorm and GELU as the arithmetic they are (PyTorch before opset 17, kiln's
 * own export): ReduceMean, Sub, Pow (or Mul of the difference by itself), ReduceMean, Add eps,
 * Sqrt, Div [, Mul gain [, Add bias]]; and x / sqrt(2) (or x * 1/sqrt(2)), Erf, Add 1, Mul x, Mul
 * 0.5. ReduceMean and Erf have no kiln layer of their own; the whole chain is the layer, as
 * runtimes fuse it. A chain is taken only where each of its tensors is read by the next node of
 * the chain alone (and is no graph output), so nothing else needs its inner values. Its first
 * node writes the layer; the others are marked fused and make nothing. */

static bool is_graph_output(const imp *m, const char *name) {
  for (size_t k = 0; k < m->g->n_output; k++)
    if (m->g->output[k]->name && !strcmp(m->g->output[k]->name, name)) return true;
  return false;
}

/* The nodes that read `name` (each once), at most max of them listed; their number. */
static int readers(const imp *m, const char *name, int *idx, int max) {
  int n = 0;
  for (size_t k = 0; k < m->g->n_node; k++) {
    const Onnx__NodeProto *r = m->g->node[k];
    for (size_t i = 0; i < r->n_input; i++)
      if (r->input[i] && !strcmp(r->input[i], name)) {
        if (n < max) idx[n] = (int)k;
        n++;
        break;
      }
  }
  return n;
}

/* The one node that reads `name`, when it is of type op and `name` is no graph output; or -1. */
static int sole_reader(const imp *m, const char *name, const char *op) {
  int k;
  if (!name || is_graph_output(m, name) || readers(m, name, &k, 1) != 1) return -1;
  const Onnx__NodeProto *r = m->g->node[k];
  return r->op_type && !strcmp(r->op_type, op) && r->n_output >= 1 && r->output[0] ? k : -1;
}

static const char *in_name(const Onnx__NodeProto *n, size_t k) {
  return k < n->n_input && n->input[k] ? n->input[k] : "";
}

/* Of a two-input node that reads `name`: its other input (`name` itself where it reads it
 * twice), or NULL. */
static const char *other_in(const Onnx__NodeProto *n, const char *name) {
  if (n->n_input != 2) return NULL;
  if (!strcmp(in_name(n, 0), name)) return in_name(n, 1);
  if (!strcmp(in_name(n, 1), name)) return in_name(n, 0);
  return NULL;
}

/* Whether tensor `name` is a constant of one value; the value in *v. */
static bool scalar_const(const imp *m, const char *name, double *v) {
  const tensor *t = name ? t_find(m, name) : NULL;
  if (!t || t->kind != T_CONST || t->n != 1) return false;
  *v = cval(t, 0);
  return true;
}

static bool near(double v, double want) { return fabs(v - want) <= 1e-6 * fabs(want); }

/* The node that writes `name` when it is an `op`; or -1. */
static int writer(const imp *m, const char *name, const char *op) {
  const tensor *t = name && *name ? t_find(m, name) : NULL;
  if (!t || t->producer < 0) return -1;
  return strcmp(nop(m->g->node[t->producer]), op) ? -1 : t->producer;
}

/* A float constant of n values (n < 0: any), or NULL. */
static const tensor *fconst(const imp *m, const char *name, int64_t n) {
  const tensor *t = name && *name ? t_find(m, name) : NULL;
  if (!t || t->kind != T_CONST || t->dt != DT_F || (n >= 0 && t->n != n)) return NULL;
  return t;
}

static bool perm_is(const Onnx__NodeProto *n, const int64_t *p, size_t np) {
  size_t k;
  const int64_t *v = attr_ints(n, "perm", &k);
  return v && k == np && !memcmp(v, p, np * sizeof *p);
}

/* Whether a Reshape node's target is the constant `shape`. */
static bool reshape_is(const imp *m, const Onnx__NodeProto *n, const int64_t *shape, int nd) {
  const tensor *t = t_find(m, in_name(n, 1));
  if (!t || t->kind != T_CONST || t->dt != DT_I || t->n != nd) return false;
  for (int k = 0; k < nd; k++)
    if (t->i[k] != shape[k]) return false;
  return true;
}

/* A constant that is a LayerNorm's gain or bias for x normalized from axis `a`: its values span
 * those axes (in their shape, after any leading 1s). */
static bool norm_param(const imp *m, const char *name, const shp *x, int a) {
  const tensor *c = t_find(m, name);
  if (!c || c->kind != T_CONST || c->dt != DT_F || c->s.nd > x->nd) return false;
  const int off = x->nd - c->s.nd;
  for (int k = 0; k < c->s.nd; k++)
    if (c->s.d[k] != (off + k < a ? 1 : x->d[off + k])) return false;
  return off <= a;
}

/* The layer's name: the node's path with its last part replaced ("/norm1/ReduceMean" ->
 * "/norm1/LayerNorm"). */
static const char *chain_name(imp *m, const char *type) {
  const char *n = nname(m), *slash = strrchr(n, '/');
  if (!slash) return type;
  const size_t len = (size_t)(slash - n) + 1;
  char *s = ialloc(m, len + strlen(type) + 1);
  if (!s) return type;
  memcpy(s, n, len);
  strcpy(s + len, type);
  return s;
}

/* A LayerNorm layer: x normalized over its axes from `axis`, written to tensor y; gain and bias
 * the constants named (NULL: none). */
static int layer_norm_layer(imp *m, tensor *x, int axis, double eps, const char *gain,
                            const char *bias, tensor *y) {
  const char *b, *top;
  KILN_TRY(materialize(m, x, &b));
  KILN_TRY(set_blob(m, y, &x->s, &top));
  const int li = begin_layer(m, "LayerNorm", chain_name(m, "LayerNorm"), 1, &b, 1, &top);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "layer_norm_param { axis: %d eps: %.9g%s%s }", axis, eps,
         gain ? "" : " elementwise_affine: false", gain && !bias ? " bias_term: false" : "");
  end_layer(m);
  shp ps = {x->s.nd - axis, {0}};
  for (int k = axis; k < x->s.nd; k++) ps.d[k - axis] = x->s.d[k];
  if (gain) KILN_TRY(add_blob(m, li, &ps, t_find(m, gain)->f));
  if (bias) KILN_TRY(add_blob(m, li, &ps, t_find(m, bias)->f));
  return KILN_OK;
}

/* The trailing axes a ReduceMean node averages over, from the first (keepdims 1); or -1. */
static int reduce_from(const Onnx__NodeProto *n, int nd) {
  size_t na;
  const int64_t *axes = attr_ints(n, "axes", &na);
  if (!axes || na == 0 || na > (size_t)nd || attr_i(n, "keepdims", 1) != 1) return -1;
  bool seen[MAXD] = {false};
  for (size_t k = 0; k < na; k++) {
    const int64_t a = axes[k] < 0 ? axes[k] + nd : axes[k];
    if (a < 0 || a >= nd || seen[a]) return -1;
    seen[a] = true;
  }
  for (int a = nd - (int)na; a < nd; a++)
    if (!seen[a]) return -1;
  return nd - (int)na;
}

/* At a ReduceMean: the LayerNorm chain it begins, or a refusal. */
static int op_reduce_mean(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  const Onnx__NodeProto *n0 = m->node, *const *G = (const Onnx__NodeProto *const *)m->g->node;
  const int axis = reduce_from(n0, x->s.nd);
  const char *xn = in_name(n0, 0), *mean = n0->output[0];
  int ks = -1, kp = -1, kdiv = -1, km2 = -1, ka = -1, kq = -1, kg = -1, kb = -1;
  double eps = 0, two = 0;
  int rd[3];
  if (axis < 0 || (ks = sole_reader(m, mean, "Sub")) < 0 || strcmp(in_name(G[ks], 0), xn) ||
      strcmp(in_name(G[ks], 1), mean))
    goto refuse;
  const char *d = G[ks]->output[0];
  if (is_graph_output(m, d) || readers(m, d, rd, 3) != 2) goto refuse;
  for (int i = 0; i < 2; i++) {
    const Onnx__NodeProto *r = G[rd[i]];
    const char *o = other_in(r, d);
    if (!o) goto refuse;
    if (!strcmp(nop(r), "Div") && !strcmp(in_name(r, 0), d)) kdiv = rd[i];
    else if ((!strcmp(nop(r), "Pow") && !strcmp(in_name(r, 0), d) && scalar_const(m, o, &two) &&
              two == 2) ||
             (!strcmp(nop(r), "Mul") && !strcmp(o, d)))
      kp = rd[i];
  }
  if (kp < 0 || kdiv < 0 || (km2 = sole_reader(m, G[kp]->output[0], "ReduceMean")) < 0 ||
      reduce_from(G[km2], x->s.nd) != axis ||
      (ka = sole_reader(m, G[km2]->output[0], "Add")) < 0 ||
      !scalar_const(m, other_in(G[ka], G[km2]->output[0]), &eps) ||
      (kq = sole_reader(m, G[ka]->output[0], "Sqrt")) < 0 ||
      sole_reader(m, G[kq]->output[0], "Div") != kdiv || strcmp(in_name(G[kdiv], 1), G[kq]->output[0]))
    goto refuse;
  const char *y = G[kdiv]->output[0], *gain = NULL, *bias = NULL;
  if ((kg = sole_reader(m, y, "Mul")) >= 0 && (gain = other_in(G[kg], y)) &&
      norm_param(m, gain, &x->s, axis)) {
    y = G[kg]->output[0];
    if ((kb = sole_reader(m, y, "Add")) >= 0 && (bias = other_in(G[kb], y)) &&
        norm_param(m, bias, &x->s, axis))
      y = G[kb]->output[0];
    else
      kb = -1, bias = NULL;
  } else {
    kg = -1, gain = NULL;
  }
  const int chain[] = {m->node_index, ks, kp, kdiv, km2, ka, kq, kg, kb};
  for (size_t i = 0; i < sizeof chain / sizeof chain[0]; i++)
    if (chain[i] >= 0) m->fused[chain[i]] = true;
  return layer_norm_layer(m, x, axis, eps, gain, bias, t_find(m, y));
refuse:
  return REFUSE("kiln imports ReduceMean only as the start of a layer normalization written out "
                "(ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div [, Mul gain [, Add "
                "bias]] over the last axes, each value read by the next node alone)");
}

/* At a ReduceSumSquare: the SSD fork's Normalize as `kiln export onnx` writes it (ReduceSumSquare
 * over the channels, or every axis after the batch, Add eps, Sqrt, Div of the input [, Mul by
 * the scale]), or a refusal. */
static int op_reduce_sum_square(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  const Onnx__NodeProto *n0 = m->node, *const *G = (const Onnx__NodeProto *const *)m->g->node;
  const int nd = x->s.nd;
  size_t na = 0;
  const int64_t *axes = attr_ints(n0, "axes", &na);
  /* the channels (axis 1) alone, or every axis from 1 (across_spatial) */
  const bool channels = axes && na == 1 && (axes[0] == 1 || axes[0] == 1 - nd);
  const bool across = !channels && nd > 2 && reduce_from(n0, nd) == 1;
  int ka = -1, kq = -1, kd = -1, km = -1;
  double eps = 0;
  const char *ss = n0->output[0];
  if (nd < 2 || !(across || channels) || attr_i(n0, "keepdims", 1) != 1 ||
      (ka = sole_reader(m, ss, "Add")) < 0 || !scalar_const(m, other_in(G[ka], ss), &eps) ||
      (kq = sole_reader(m, G[ka]->output[0], "Sqrt")) < 0 ||
      (kd = sole_reader(m, G[kq]->output[0], "Div")) < 0 || strcmp(in_name(G[kd], 0), x->name) ||
      strcmp(in_name(G[kd], 1), G[kq]->output[0]))
    return REFUSE("kiln imports ReduceSumSquare only as the start of an L2 normalisation "
                  "(ReduceSumSquare over the channels or every axis after the batch, Add eps, "
                  "Sqrt, Div of the input [, Mul by a scale]: the SSD fork's Normalize)");
  const char *y = G[kd]->output[0];
  const int64_t C = x->s.d[1];
  const tensor *sc = NULL;
  if ((km = sole_reader(m, y, "Mul")) >= 0) {
    sc = t_find(m, other_in(G[km], y) ? other_in(G[km], y) : "");
    bool ok = sc && sc->kind == T_CONST && sc->dt == DT_F && (sc->n == 1 || sc->n == C);
    if (ok && sc->n == C && C > 1) { /* C x 1 x ... aligned with axis 1 */
      const int off = nd - sc->s.nd;
      for (int k = 0; k < sc->s.nd; k++) ok &= sc->s.d[k] == (off + k == 1 ? C : 1);
      ok &= off <= 1;
    }
    if (ok) y = G[km]->output[0];
    else km = -1, sc = NULL;
  }
  m->fused[m->node_index] = m->fused[ka] = m->fused[kq] = m->fused[kd] = true;
  if (km >= 0) m->fused[km] = true;
  const bool shared = !sc || sc->n == 1 || C == 1;
  const char *b, *top;
  KILN_TRY(materialize(m, x, &b));
  KILN_TRY(set_blob(m, t_find(m, y), &x->s, &top));
  const int li = begin_layer(m, "Normalize", chain_name(m, "Normalize"), 1, &b, 1, &top);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "norm_param { across_spatial: %s channel_shared: %s eps: %.9g }", across ? "true" : "false",
         shared ? "true" : "false", eps);
  end_layer(m);
  const float one = 1.0f;
  return add_blob(m, li, shared ? &(shp){0, {0}} : &shape1(C), sc ? sc->f : &one);
}

/* Opset 17's LayerNormalization. */
static int op_layer_norm(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  int axis = 0;
  KILN_TRY(norm_axis(m, attr_i(m->node, "axis", -1), x->s.nd, &axis));
  for (int k = 1; k < 3; k++)
    if (out(m, k) && out(m, k)->uses)
      return REFUSE("output %d (the mean or the inverse deviation) is read: kiln's LayerNorm keeps "
                    "them to itself", k);
  const char *gain = in_name(m->node, 1), *bias = in_name(m->node, 2);
  if (!*gain || !norm_param(m, gain, &x->s, axis))
    return REFUSE("its Scale is not a constant over the normalized axes");
  if (*bias && !norm_param(m, bias, &x->s, axis))
    return REFUSE("its B is not a constant over the normalized axes");
  return layer_norm_layer(m, x, axis, attr_f(m->node, "epsilon", 1e-5f), gain,
                          *bias ? bias : NULL, out(m, 0));
}

/* At a Div by sqrt(2) or a Mul by 1/sqrt(2) of a computed x: the GELU chain it begins, if it is
 * one. 1: not one (the node is mapped on its own). */
static int try_gelu(imp *m, tensor *x, double c) {
  const Onnx__NodeProto *n0 = m->node, *const *G = (const Onnx__NodeProto *const *)m->g->node;
  const char *xn = x->name;
  const bool div = !strcmp(nop(n0), "Div");
  if (!(div ? near(c, sqrt(2.0)) : near(c, sqrt(0.5)))) return 1;
  int ke, ka, km, kh;
  double one, half;
  if ((ke = sole_reader(m, n0->output[0], "Erf")) < 0 ||
      (ka = sole_reader(m, G[ke]->output[0], "Add")) < 0 ||
      !scalar_const(m, other_in(G[ka], G[ke]->output[0]), &one) || one != 1 ||
      (km = sole_reader(m, G[ka]->output[0], "Mul")) < 0 ||
      strcmp(other_in(G[km], G[ka]->output[0]) ? other_in(G[km], G[ka]->output[0]) : "", xn) ||
      (kh = sole_reader(m, G[km]->output[0], "Mul")) < 0 ||
      !scalar_const(m, other_in(G[kh], G[km]->output[0]), &half) || half != 0.5)
    return 1;
  m->fused[m->node_index] = m->fused[ke] = m->fused[ka] = m->fused[km] = m->fused[kh] = true;
  const char *b, *top;
  KILN_TRY(materialize(m, x, &b));
  KILN_TRY(set_blob(m, t_find(m, G[kh]->output[0]), &x->s, &top));
  if (begin_layer(m, "GELU", chain_name(m, "GELU"), 1, &b, 1, &top) < 0) return KILN_ERR_NOMEM;
  end_layer(m);
  return KILN_OK;
}

static int op_softmax(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  int axis = 0;
  KILN_TRY(norm_axis(m, attr_i(m->node, "axis", m->opset >= 13 ? -1 : 1), x->s.nd, &axis));
  int64_t rest = 1;
  for (int k = axis + 1; k < x->s.nd; k++) rest *= x->s.d[k];
  const char *b;
  if (m->opset < 13 && rest != 1) {
    /* opset < 13: over all the axes from `axis` at once: a view of two axes */
    tensor v = *x;
    v.name = x->name;
    int64_t lead = 1;
    for (int k = 0; k < axis; k++) lead *= x->s.d[k];
    v.s = (shp){2, {lead, rest * x->s.d[axis]}};
    KILN_TRY(materialize(m, &v, &b));
    const char *top;
    KILN_TRY(set_out(m, 0, &v.s, &top));
    if (begin_layer(m, "Softmax", nname(m), 1, &b, 1, &top) < 0) return KILN_ERR_NOMEM;
    params(m, "softmax_param { axis: 1 }");
    end_layer(m);
    out(m, 0)->s = x->s; /* the view back in the input's shape */
    return KILN_OK;
  }
  KILN_TRY(materialize(m, x, &b));
  if (layer1(m, "Softmax", b, &x->s) < 0) return KILN_ERR_NOMEM;
  if (axis != 1) params(m, "softmax_param { axis: %d }", axis);
  end_layer(m);
  return KILN_OK;
}

/* ---- shapes ----------------------------------------------------------------------------- */

/* The int64 list of a constant input k or of attribute `name` (by opset: attributes before
 * `since`). Missing: *n = -1. */
static int ints_arg(imp *m, int k, const char *name, int since, int64_t *v, int *n) {
  *n = -1;
  if (m->opset < since) {
    size_t c;
    const int64_t *a = attr_ints(m->node, name, &c);
    if (!a) return KILN_OK;
    if (c > MAXD * 2) return BAD("%s has %zu values", name, c);
    memcpy(v, a, c * sizeof *v);
    *n = (int)c;
    return KILN_OK;
  }
  tensor *t = in(m, k);
  if (!t) return KILN_OK;
  if (t->kind != T_CONST) return REFUSE("its %s (input %d) is computed in the graph: kiln needs it constant", name, k);
  if (t->dt != DT_I || t->n > MAXD * 2) return BAD("%s is not an int64 list", name);
  memcpy(v, t->i, (size_t)t->n * sizeof *v);
  *n = (int)t->n;
  return KILN_OK;
}

/* The output shape of the shape ops, on any tensor (constants too: the folding uses them). */
static int shape_of_reshape_op(imp *m, const tensor *x, shp *s) {
  const char *op = nop(m->node);
  const shp *xs = &x->s;
  if (!strcmp(op, "Flatten")) {
    int axis = 0;
    int64_t ax = attr_i(m->node, "axis", 1);
    if (ax == xs->nd) axis = xs->nd;
    else KILN_TRY(norm_axis(m, ax, xs->nd, &axis));
    int64_t a = 1, b = 1;
    for (int k = 0; k < xs->nd; k++) {
      if (k < axis) a *= xs->d[k];
      else b *= xs->d[k];
    }
    *s = (shp){2, {a, b}};
    return KILN_OK;
  }
  if (!strcmp(op, "Reshape")) {
    tensor *st;
    KILN_TRY(const_in(m, 1, &st, "shape"));
    if (st->dt != DT_I || st->n > MAXD) return BAD("shape is not an int64 list of at most %d", MAXD);
    const bool allowzero = attr_i(m->node, "allowzero", 0) != 0;
    int infer = -1;
    int64_t known = 1;
    s->nd = (int)st->n;
    for (int k = 0; k < s->nd; k++) {
      int64_t d = st->i[k];
      if (d == 0 && !allowzero) {
        if (k >= xs->nd) return BAD("shape copies axis %d of an input of %d axes", k, xs->nd);
        d = xs->d[k];
      }
      if (d == -1) {
        if (infer >= 0) return BAD("shape has two -1s");
        infer = k;
        d = 1;
      } else if (d < 0) return BAD("shape has %lld", (long long)d);
      s->d[k] = d;
      if (d > 0 && known > ((int64_t)1 << 40) / d) return BAD("shape is too large");
      known *= d;
    }
    if (infer >= 0) {
      if (known == 0 || count(xs) % known) return BAD("cannot reshape %s to %s", shape_str(xs), shape_str(s));
      s->d[infer] = count(xs) / known;
    }
    if (count(s) != count(xs)) return BAD("cannot reshape %s to %s", shape_str(xs), shape_str(s));
    return KILN_OK;
  }
  int64_t ax[MAXD * 2];
  int na;
  if (!strcmp(op, "Squeeze")) {
    KILN_TRY(ints_arg(m, 1, "axes", 13, ax, &na));
    bool drop[MAXD] = {0};
    if (na < 0) for (int k = 0; k < xs->nd; k++) drop[k] = xs->d[k] == 1;
    for (int j = 0; j < na; j++) {
      int a = 0;
      KILN_TRY(norm_axis(m, ax[j], xs->nd, &a));
      if (xs->d[a] != 1) return BAD("squeezes axis %d of %s, which is not 1", a, shape_str(xs));
      drop[a] = true;
    }
    s->nd = 0;
    for (int k = 0; k < xs->nd; k++)
      if (!drop[k]) s->d[s->nd++] = xs->d[k];
    return KILN_OK;
  }
  if (!strcmp(op, "Unsqueeze")) {
    KILN_TRY(ints_arg(m, 1, "axes", 13, ax, &na));
    if (na < 0) return BAD("no axes");
    const int nd = xs->nd + na;
    if (nd > MAXD) return REFUSE("gives %d axes (kiln: at most %d)", nd, MAXD);
    bool ins[MAXD] = {0};
    for (int j = 0; j < na; j++) {
      int a = 0;
      KILN_TRY(norm_axis(m, ax[j], nd, &a));
      if (ins[a]) return BAD("axis %d twice", a);
      ins[a] = true;
    }
    s->nd = nd;
    for (int k = 0, src = 0; k < nd; k++) s->d[k] = ins[k] ? 1 : xs->d[src++];
    return KILN_OK;
  }
  return REFUSE("not a shape op");
}

static int op_reshape_like(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  if (x->kind == T_PAD) {
    const char *b;
    return materialize(m, x, &b);
  }
  shp s;
  KILN_TRY(shape_of_reshape_op(m, x, &s));
  return alias_out(m, 0, x, &s);
}

static int op_identity(imp *m) {
  tensor *x;
  KILN_TRY(need_in(m, 0, &x));
  const char *op = nop(m->node);
  if (!strcmp(op, "Dropout")) {
    tensor *mask = out(m, 1);
    if (mask && mask->uses) return REFUSE("its mask is read: kiln imports inference graphs");
    tensor *tm = in(m, 2);
    if (tm && (tm->kind != T_CONST || cval(tm, 0) != 0)) return REFUSE("training_mode is not false");
  }
  m->dropped++;
  return alias_out(m, 0, x, &x->s);
}

static int op_transpose(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  size_t n;
  const int64_t *perm = attr_ints(m->node, "perm", &n);
  int64_t p[MAXD];
  if (!perm) {
    n = (size_t)x->s.nd;
    for (size_t k = 0; k < n; k++) p[k] = x->s.nd - 1 - (int64_t)k;
  } else {
    if (n != (size_t)x->s.nd) return BAD("perm has %zu values for %d axes", n, x->s.nd);
    memcpy(p, perm, n * sizeof *p);
  }
  bool seen[MAXD] = {0};
  shp s = {x->s.nd, {0}};
  for (size_t k = 0; k < n; k++) {
    if (p[k] < 0 || p[k] >= x->s.nd || seen[p[k]]) return BAD("perm is not a permutation");
    seen[p[k]] = true;
    s.d[k] = x->s.d[p[k]];
  }
  /* the axes longer than 1 in their order: a transpose that keeps it moves no data */
  int64_t last = -1;
  bool moves = false;
  for (size_t k = 0; k < n; k++)
    if (x->s.d[p[k]] != 1) {
      if (p[k] < last) moves = true;
      last = p[k];
    }
  if (!moves) {
    m->dropped++;
    return alias_out(m, 0, x, &s);
  }
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  if (layer1(m, "Permute", b, &s) < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  permute_param {");
  for (size_t k = 0; k < n; k++) kiln_strbuf_printf(&m->text, " order: %lld", (long long)p[k]);
  kiln_strbuf_printf(&m->text, " }\n");
  end_layer(m);
  return KILN_OK;
}

static int op_concat(imp *m) {
  const Onnx__NodeProto *node = m->node;
  if (node->n_input < 1 || node->n_input > 256) return BAD("%zu inputs", node->n_input);
  tensor *x0;
  KILN_TRY(blob_in(m, 0, &x0));
  int axis = 0;
  KILN_TRY(norm_axis(m, attr_i(node, "axis", 1), x0->s.nd, &axis));
  const char *bs[256];
  shp s = x0->s;
  s.d[axis] = 0;
  for (size_t k = 0; k < node->n_input; k++) {
    tensor *x;
    KILN_TRY(blob_in(m, (int)k, &x));
    if (x->s.nd != s.nd) return BAD("input %zu %s and input 0 %s differ in axes", k, shape_str(&x->s), shape_str(&x0->s));
    for (int a = 0; a < s.nd; a++)
      if (a != axis && x->s.d[a] != s.d[a]) return BAD("input %zu %s and input 0 %s differ off the axis", k, shape_str(&x->s), shape_str(&x0->s));
    s.d[axis] += x->s.d[axis];
    KILN_TRY(materialize(m, x, &bs[k]));
  }
  const char *top;
  KILN_TRY(set_out(m, 0, &s, &top));
  if (begin_layer(m, "Concat", nname(m), (int)node->n_input, bs, 1, &top) < 0) return KILN_ERR_NOMEM;
  if (axis != 1) params(m, "concat_param { axis: %d }", axis);
  end_layer(m);
  return KILN_OK;
}

/* A Caffe Slice of blob b (shape xs) along axis at the points given; tops named after the
 * tensors outt[j] where given, else fresh names (silenced later: nothing reads them). */
static int slice_layer(imp *m, const char *b, const shp *xs, int axis, int npts, const int64_t *pts,
                       tensor *const *outt) {
  const char *tops[MAXD * 4 + 1];
  int64_t prev = 0;
  for (int j = 0; j <= npts; j++) {
    const int64_t end = j < npts ? pts[j] : xs->d[axis];
    shp s = *xs;
    s.d[axis] = end - prev;
    if (s.d[axis] < 1) return BAD("an empty slice");
    prev = end;
    if (outt[j]) KILN_TRY(set_blob(m, outt[j], &s, &tops[j]));
    else {
      char nm[1024];
      snprintf(nm, sizeof nm, "%s/unused", nname(m));
      if (!(tops[j] = fresh_blob(m, nm))) return nomem();
    }
  }
  if (begin_layer(m, "Slice", nname(m), 1, &b, npts + 1, tops) < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  slice_param { axis: %d", axis);
  for (int j = 0; j < npts; j++) kiln_strbuf_printf(&m->text, " slice_point: %lld", (long long)pts[j]);
  kiln_strbuf_printf(&m->text, " }\n");
  end_layer(m);
  return KILN_OK;
}

static int op_split(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  int axis = 0;
  KILN_TRY(norm_axis(m, attr_i(m->node, "axis", 0), x->s.nd, &axis));
  const int no = (int)m->node->n_output;
  if (no < 1 || no > MAXD * 4) return REFUSE("%d outputs", no);
  int64_t sz[MAXD * 2];
  int ns;
  KILN_TRY(ints_arg(m, 1, "split", 13, sz, &ns));
  int64_t sizes[MAXD * 4];
  if (ns < 0) {
    if (x->s.d[axis] % no) return BAD("%lld does not split into %d equal parts", (long long)x->s.d[axis], no);
    for (int j = 0; j < no; j++) sizes[j] = x->s.d[axis] / no;
  } else {
    if (ns != no) return BAD("split has %d sizes for %d outputs", ns, no);
    int64_t tot = 0;
    for (int j = 0; j < no; j++) sizes[j] = sz[j], tot += sz[j];
    if (tot != x->s.d[axis]) return BAD("split sizes add to %lld, the axis has %lld", (long long)tot, (long long)x->s.d[axis]);
  }
  if (no == 1) return alias_out(m, 0, x, &x->s);
  int64_t pts[MAXD * 4];
  tensor *outt[MAXD * 4 + 1];
  int64_t acc = 0;
  for (int j = 0; j < no; j++) {
    acc += sizes[j];
    if (j < no - 1) pts[j] = acc;
    outt[j] = out(m, j);
  }
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  return slice_layer(m, b, &x->s, axis, no - 1, pts, outt);
}

/* Output 0 as [start, end) of x's axis: a Slice layer whose other pieces are unused; the output
 * tensor in shape outshape (a Gather's index may drop the axis). */
static int slice_range(imp *m, tensor *x, int axis, int64_t start, int64_t end, const shp *outshape) {
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  const int64_t D = x->s.d[axis];
  if (start == 0 && end == D) return alias_out(m, 0, x, outshape);
  int64_t pts[2];
  tensor *outt[3];
  int np = 0, k = 0;
  if (start > 0) pts[np++] = start, outt[k++] = NULL;
  outt[k++] = out(m, 0);
  if (end < D) pts[np++] = end, outt[k++] = NULL;
  shp rs = x->s;
  rs.d[axis] = end - start;
  KILN_TRY(slice_layer(m, b, &x->s, axis, np, pts, outt));
  tensor *t = out(m, 0);
  if (t) t->s = *outshape; /* the slice's blob is rs; the tensor may drop the axis */
  if (t && count(&rs) != count(outshape)) return kiln_errorf(KILN_ERR_INTERNAL, "slice shapes");
  return KILN_OK;
}

/* The one axis a Slice node cuts and its range [*b, *e) of x (*axis -1: the node cuts nothing).
 * Reads m->node. */
static int slice_of(imp *m, const tensor *x, int *axis, int64_t *b, int64_t *e) {
  int64_t st[MAXD * 2], en[MAXD * 2], ax[MAXD * 2], sp[MAXD * 2];
  int ns, ne, na, nsp;
  KILN_TRY(ints_arg(m, 1, "starts", 10, st, &ns));
  KILN_TRY(ints_arg(m, 2, "ends", 10, en, &ne));
  KILN_TRY(ints_arg(m, 3, "axes", 10, ax, &na));
  KILN_TRY(ints_arg(m, 4, "steps", 10, sp, &nsp));
  if (ns < 0 || ne != ns || (na >= 0 && na != ns) || (nsp >= 0 && nsp != ns)) return BAD("starts, ends, axes and steps disagree");
  *axis = -1;
  for (int j = 0; j < ns; j++) {
    int a = 0;
    KILN_TRY(norm_axis(m, na >= 0 ? ax[j] : j, x->s.nd, &a));
    if (nsp >= 0 && sp[j] != 1) return REFUSE("step %lld: kiln's Slice takes steps of 1", (long long)sp[j]);
    const int64_t D = x->s.d[a];
    int64_t lo = st[j] < 0 ? st[j] + D : st[j], hi = en[j] < 0 ? en[j] + D : en[j];
    lo = lo < 0 ? 0 : lo > D ? D : lo;
    hi = hi < 0 ? 0 : hi > D ? D : hi;
    if (hi <= lo) return REFUSE("an empty slice of axis %d", a);
    if (lo == 0 && hi == D) continue;
    if (*axis >= 0) return REFUSE("slices axes %d and %d: kiln imports a slice of one axis", *axis, a);
    *axis = a, *b = lo, *e = hi;
  }
  return KILN_OK;
}

/* The Slice nodes that read x as this one does, cut the same axis in ranges that overlap
 * neither this one's nor each other's, and have constant bounds now (PyTorch's chunk of attention's
 * in-projection into q, k and v is three of them): one Slice layer writes them all, and they are
 * marked fused. Their node indices (this one's first) and ranges; their number. */
static int slice_siblings(imp *m, const tensor *x, int axis, int64_t b, int64_t e, int *idx,
                          int64_t (*range)[2], int max) {
  int n = 1;
  idx[0] = m->node_index, range[0][0] = b, range[0][1] = e;
  const Onnx__NodeProto *self = m->node;
  const int self_index = m->node_index;
  for (size_t k = 0; k < m->g->n_node && n < max; k++) {
    const Onnx__NodeProto *r = m->g->node[k];
    if ((int)k == self_index || m->fused[k] || strcmp(nop(r), "Slice") || strcmp(in_name(r, 0), x->name) ||
        r->n_output < 1 || !r->output[0] || !*r->output[0])
      continue;
    bool known = true;
    for (size_t i = 1; i < r->n_input; i++) {
      const tensor *t = *in_name(r, i) ? t_find(m, in_name(r, i)) : NULL;
      if (*in_name(r, i) && (!t || t->kind != T_CONST)) known = false;
    }
    if (!known) continue;
    m->node = r, m->node_index = (int)k;
    int a;
    int64_t lo, hi;
    const int rc = slice_of(m, x, &a, &lo, &hi);
    m->node = self, m->node_index = self_index;
    if (rc || a != axis) continue; /* (its message is left unread: the node is mapped alone) */
    bool apart = true;
    for (int j = 0; j < n; j++) apart &= hi <= range[j][0] || lo >= range[j][1];
    if (!apart) continue;
    idx[n] = (int)k, range[n][0] = lo, range[n][1] = hi;
    n++;
  }
  return n;
}

static int op_slice(imp *m) {
  tensor *x;
  KILN_TRY(blob_in(m, 0, &x));
  int axis = -1;
  int64_t s0 = 0, e0 = 0;
  KILN_TRY(slice_of(m, x, &axis, &s0, &e0));
  if (axis < 0) {
    m->dropped++;
    return alias_out(m, 0, x, &x->s);
  }
  int idx[MAXD * 2];
  int64_t range[MAXD * 2][2];
  const int n = slice_siblings(m, x, axis, s0, e0, idx, range, MAXD * 2);
  /* the pieces in order along the axis, the gaps between them unused */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && range[j][0] < range[j - 1][0]; j--) {
      int64_t r0 = range[j][0], r1 = range[j][1];
      range[j][0] = range[j - 1][0], range[j][1] = range[j - 1][1];
      range[j - 1][0] = r0, range[j - 1][1] = r1;
      const int t = idx[j];
      idx[j] = idx[j - 1], idx[j - 1] = t;
    }
  int64_t pts[MAXD * 4 + 1];
  tensor *outt[MAXD * 4 + 2];
  int np = 0, k = 0;
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (range[i][0] > at) pts[np++] = range[i][0], outt[k++] = NULL;
    outt[k++] = t_find(m, m->g->node[idx[i]]->output[0]);
    if (range[i][1] < x->s.d[axis]) pts[np++] = range[i][1];
    at = range[i][1];
  }
  if (at < x->s.d[axis]) outt[k++] = NULL;
  const char *b;
  KILN_TRY(materialize(m, x, &b));
  KILN_TRY(slice_layer(m, b, &x->s, axis, np, pts, outt));
  for (int i = 0; i < n; i++)
    if (idx[i] != m->node_index) m->fused[idx[i]] = true;
  return KILN_OK;
}

static int op_gather(imp *m) {
  tensor *data, *idx;
  KILN_TRY(need_in(m, 0, &data));
  KILN_TRY(need_in(m, 1, &idx));
  int axis = 0;
  KILN_TRY(norm_axis(m, attr_i(m->node, "axis", 0), data->s.nd, &axis));
  if (data->kind == T_CONST && idx->kind != T_CONST) {
    /* a lookup table: Embed */
    if (axis != 0 || data->s.nd != 2 || data->dt != DT_F)
      return REFUSE("a Gather from a constant %s on axis %d: kiln imports a lookup table (2-D, axis 0) as Embed", shape_str(&data->s), axis);
    const char *b;
    KILN_TRY(materialize(m, idx, &b));
    shp s = idx->s;
    if (s.nd >= MAXD) return REFUSE("too many axes");
    s.d[s.nd++] = data->s.d[1];
    int li = layer1(m, "Embed", b, &s);
    if (li < 0) return KILN_ERR_NOMEM;
    params(m, "embed_param { num_output: %lld input_dim: %lld bias_term: false }", (long long)data->s.d[1], (long long)data->s.d[0]);
    end_layer(m);
    return add_blob(m, li, &data->s, data->f);
  }
  if (data->kind == T_BLOB && idx->kind == T_CONST && idx->n == 1 && idx->dt == DT_I) {
    /* one index of one axis: a Slice (the axis dropped for a scalar index) */
    const int64_t D = data->s.d[axis];
    int64_t i = idx->i[0] < 0 ? idx->i[0] + D : idx->i[0];
    if (i < 0 || i >= D) return BAD("index %lld is outside an axis of %lld", (long long)idx->i[0], (long long)D);
    shp s = {0, {0}};
    for (int k = 0; k < data->s.nd; k++) {
      if (k == axis) {
        for (int j = 0; j < idx->s.nd; j++) s.d[s.nd++] = 1;
      } else s.d[s.nd++] = data->s.d[k];
    }
    return slice_range(m, data, axis, i, i + 1, &s);
  }
  return REFUSE("kiln imports a Gather from a constant table (Embed) or of one constant index");
}

/* ---- LSTM ------------------------------------------------------------------------------- */

/* A Parameter layer that does not learn (lr_mult 0), its top `top`, holding the constant data of
 * shape s. */
static int param_layer(imp *m, const char *top, const shp *s, const float *data) {
  int li = begin_layer(m, "Parameter", top, 0, NULL, 1, &top);
  if (li < 0) return KILN_ERR_NOMEM;
  kiln_strbuf_printf(&m->text, "  param { lr_mult: 0 decay_mult: 0 }\n  parameter_param { shape {");
  for (int a = 0; a < s->nd; a++) kiln_strbuf_printf(&m->text, " dim: %lld", (long long)s->d[a]);
  kiln_strbuf_printf(&m->text, " } }\n");
  end_layer(m);
  return add_blob(m, li, s, data);
}

/* A Parameter layer of a fresh blob named after base; the blob's name in *blob. */
static int param_blob(imp *m, const char *base, const shp *s, const float *data, const char **blob) {
  if (!(*blob = fresh_blob(m, base))) return nomem();
  return param_layer(m, *blob, s, data);
}

/* LSTM, GRU and RNN nodes: kiln's LSTM, GRU and RNN layers (bidirectional: recurrent_param's),
 * with Parameter blobs for cont (and the initial state where expose_hidden carries it in). An RNN
 * node is taken only with Caffe's output layer after it (MatMul by W_ho^T, Add b_o, Tanh: how
 * `kiln export onnx` writes kiln's RNN), which Caffe's RNN always has and ONNX's lacks. */
static int op_recurrent(imp *m) {
  const bool gru = !strcmp(nop(m->node), "GRU"), rnn = !strcmp(nop(m->node), "RNN");
  const char *type = gru ? "GRU" : rnn ? "RNN" : "LSTM";
  tensor *x, *W, *R, *B = in(m, 3), *sl = in(m, 4), *h0 = in(m, 5);
  tensor *c0 = gru || rnn ? NULL : in(m, 6);
  KILN_TRY(blob_in(m, 0, &x));
  KILN_TRY(const_in(m, 1, &W, "W"));
  KILN_TRY(const_in(m, 2, &R, "R"));
  if (!gru && !rnn && in(m, 7)) return REFUSE("peepholes (P): kiln's LSTM has none");
  const char *dir = attr_s(m, m->node, "direction", "forward");
  const bool bidi = !strcmp(dir, "bidirectional");
  if (!bidi && strcmp(dir, "forward"))
    return REFUSE("direction %s: kiln's layers run forward, or both ways (bidirectional)", dir);
  const int ndir = bidi ? 2 : 1, ngates = gru ? 3 : rnn ? 1 : 4;
  if (attr(m->node, "activations")) {
    const Onnx__AttributeProto *a = attr(m->node, "activations");
    const char *want[3] = {"Sigmoid", "Tanh", "Tanh"};
    const size_t per = gru ? 2 : rnn ? 1 : 3;
    for (size_t k = 0; k < a->n_strings; k++) {
      const ProtobufCBinaryData *s = &a->strings[k];
      const char *w = rnn ? "Tanh" : want[k % per];
      if (k >= per * (size_t)ndir || s->len != strlen(w) || memcmp(s->data, w, s->len))
        return REFUSE("activations other than %s: kiln's %s has those",
                      gru ? "Sigmoid, Tanh" : rnn ? "Tanh" : "Sigmoid, Tanh, Tanh", type);
    }
  }
  if (attr(m->node, "clip")) return REFUSE("clip: kiln's %s does not clip", type);
  if (!gru && !rnn && attr_i(m->node, "input_forget", 0)) return REFUSE("input_forget 1");
  if (gru && attr_i(m->node, "linear_before_reset", 0) != 1)
    return REFUSE("linear_before_reset 0: kiln's GRU is PyTorch's (linear_before_reset 1: "
                  "r (W_hn h + b_hn))");
  if (attr_i(m->node, "layout", 0)) return REFUSE("layout 1 (batch first): kiln's %s reads T x N x D", type);
  const int64_t H = attr_i(m->node, "hidden_size", 0), G = ngates * H;
  if (x->s.nd != 3) return BAD("X %s is not T x N x D", shape_str(&x->s));
  const int64_t T = x->s.d[0], N = x->s.d[1], D = x->s.d[2];
  if (H < 1 || W->s.nd != 3 || W->s.d[0] != ndir || W->s.d[1] != G || W->s.d[2] != D || R->s.nd != 3 ||
      R->s.d[0] != ndir || R->s.d[1] != G || R->s.d[2] != H || W->dt != DT_F || R->dt != DT_F)
    return BAD("W %s and R %s do not fit hidden_size %lld, %d direction%s and X %s", shape_str(&W->s),
               shape_str(&R->s), (long long)H, ndir, bidi ? "s" : "", shape_str(&x->s));
  if (B && (B->kind != T_CONST || B->n != ndir * 2 * G || B->dt != DT_F))
    return BAD("B is not a constant of %lld values", (long long)(ndir * 2 * G));
  if (sl) {
    if (sl->kind != T_CONST) return REFUSE("sequence_lens is computed: kiln runs every step (cont marks sequence starts)");
    for (int64_t k = 0; k < sl->n; k++)
      if (cval(sl, k) != (double)T) return REFUSE("sequence_lens other than the %lld steps", (long long)T);
  }
  const tensor *st[2] = {h0, c0};
  bool zero_state = true;
  for (int k = 0; k < 2; k++) {
    if (!st[k]) continue;
    if (count(&st[k]->s) != ndir * N * H)
      return BAD("initial state %s is not %d x %lld x %lld", shape_str(&st[k]->s), ndir, (long long)N, (long long)H);
    if (st[k]->kind != T_CONST) zero_state = false;
    else
      for (int64_t j = 0; j < st[k]->n; j++)
        if (cval(st[k], j) != 0) zero_state = false;
  }
  tensor *yh = out(m, 1), *yc = gru ? NULL : out(m, 2);
  const bool expose = !zero_state || (yh && yh->uses) || (yc && yc->uses);
  if (expose && bidi)
    return REFUSE("a bidirectional %s with a nonzero initial state or a read final state: kiln's "
                  "bidirectional layers start from zeros and keep their state", type);
  const int nstate = gru || rnn ? 1 : 2;
  /* kiln's gates from ONNX's: LSTM i, f, o, g from i, o, f, c; GRU r, z, n from z, r, h */
  static const int lstm_from[4] = {0, 2, 1, 3}, gru_from[3] = {1, 0, 2}, rnn_from[1] = {0};
  const int *from = gru ? gru_from : rnn ? rnn_from : lstm_from;
  const char *xb;
  KILN_TRY(materialize(m, x, &xb));
  /* cont: 0 at the first step (no state from an earlier pass), or 1 where h0 is given */
  const shp cs = {2, {T, N}};
  float *cont = ialloc(m, sizeof(float) * (size_t)(T * N));
  if (!cont) return nomem();
  for (int64_t k = 0; k < T * N; k++) cont[k] = k >= N || expose ? 1.0f : 0.0f;
  char nm[1024];
  const char *bottoms[4], *tops[3];
  snprintf(nm, sizeof nm, "%s/cont", nname(m));
  bottoms[0] = xb;
  KILN_TRY(param_blob(m, nm, &cs, cont, &bottoms[1]));
  int nb = 2;
  if (expose) {
    for (int k = 0; k < nstate; k++) {
      const tensor *s = st[k];
      const shp ss = {3, {1, N, H}};
      if (s && s->kind != T_CONST) {
        tensor v = *s;
        v.s = ss;
        KILN_TRY(materialize(m, &v, &bottoms[nb++]));
      } else {
        float *z = ialloc(m, sizeof(float) * (size_t)(N * H));
        if (!z) return nomem();
        for (int64_t j = 0; s && j < N * H; j++) z[j] = (float)cval(s, j);
        snprintf(nm, sizeof nm, "%s/%s", nname(m), k ? "c0" : "h0");
        KILN_TRY(param_blob(m, nm, &ss, z, &bottoms[nb++]));
      }
    }
  }
  /* Y (T x ndir x N x H): kiln's top is T x N x ndir H. One way, Y is that memory; both ways,
   * the Transpose to T x N x 2 x H that PyTorch writes next is (fused), and a Y read otherwise
   * gets a Permute of kiln's top. */
  tensor *y = out(m, 0);
  const tensor *wo = NULL, *bo = NULL;
  if (rnn) { /* Caffe's output layer: o = tanh(W_ho h + b_o) per direction, on Y */
    const Onnx__NodeProto *const *G = (const Onnx__NodeProto *const *)m->g->node;
    const int kmm = y ? sole_reader(m, y->name, "MatMul") : -1;
    const int kad = kmm >= 0 ? sole_reader(m, G[kmm]->output[0], "Add") : -1;
    const int kth = kad >= 0 ? sole_reader(m, G[kad]->output[0], "Tanh") : -1;
    wo = kmm >= 0 && !strcmp(in_name(G[kmm], 0), y->name)
             ? fconst(m, in_name(G[kmm], 1), ndir * H * H)
             : NULL;
    bo = kad >= 0 ? fconst(m, other_in(G[kad], G[kmm]->output[0]), ndir * H) : NULL;
    if (!wo || !bo || kth < 0 || wo->s.nd != 3 || bo->s.nd != 3 || bo->s.d[1] != 1)
      return REFUSE("an RNN whose Y is not followed by Caffe's output layer (MatMul by [%d, H, H], "
                    "Add of [%d, 1, H], Tanh), as `kiln export onnx` writes kiln's RNN: Caffe's RNN "
                    "always has that layer and ONNX's RNN has none", ndir, ndir);
    m->fused[kmm] = m->fused[kad] = m->fused[kth] = true;
    y->ready = true; /* (the hidden states, read by the output layer's MatMul alone) */
    y = t_find(m, G[kth]->output[0]);
  }
  int kt = -1;
  if (bidi && y) {
    kt = sole_reader(m, y->name, "Transpose");
    size_t np = 0;
    const int64_t *perm = kt >= 0 ? attr_ints(m->g->node[kt], "perm", &np) : NULL;
    if (!perm || np != 4 || perm[0] != 0 || perm[1] != 2 || perm[2] != 1 || perm[3] != 3) kt = -1;
  }
  const shp ys = {3, {T, N, ndir * H}}, hs = {3, {1, N, H}};
  tensor *ytop = kt >= 0 ? t_find(m, m->g->node[kt]->output[0]) : y;
  tensor own = {0};
  char ynm[1024];
  if (!ytop) { /* Y unread and unnamed: kiln's layer still needs a top */
    own.name = nname(m);
    ytop = &own;
  }
  if (bidi && kt < 0 && y) {
    own = *y;
    snprintf(ynm, sizeof ynm, "%s/steps", y->name);
    own.name = ynm;
    ytop = &own;
  }
  KILN_TRY(set_blob(m, ytop, &ys, &tops[0]));
  int nt = 1;
  if (expose) {
    for (int k = 1; k <= nstate; k++) {
      if (out(m, k)) KILN_TRY(set_out(m, k, &hs, &tops[nt]));
      else {
        snprintf(nm, sizeof nm, "%s/unused", nname(m));
        if (!(tops[nt] = fresh_blob(m, nm))) return nomem();
      }
      nt++;
    }
  }
  int li = begin_layer(m, type, nname(m), nb, bottoms, nt, tops);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "recurrent_param { num_output: %lld%s%s }", (long long)H,
         expose ? " expose_hidden: true" : "", bidi ? " bidirectional: true" : "");
  end_layer(m);
  if (!bidi) {
    if (y) y->s = (shp){4, {T, 1, N, H}}; /* the same memory */
  } else if (kt >= 0) {
    ytop->s = (shp){4, {T, N, 2, H}};
    m->fused[m->node_index] = m->fused[kt] = true;
  } else if (y) {
    tensor v = *ytop;
    v.s = (shp){4, {T, N, 2, H}};
    const char *vb, *yb;
    KILN_TRY(materialize(m, &v, &vb));
    KILN_TRY(set_blob(m, y, &(shp){4, {T, 2, N, H}}, &yb));
    char pn[1024];
    snprintf(pn, sizeof pn, "%s/Y", nname(m));
    if (begin_layer(m, "Permute", pn, 1, &vb, 1, &yb) < 0) return KILN_ERR_NOMEM;
    params(m, "permute_param { order: 0 order: 2 order: 1 order: 3 }");
    end_layer(m);
  }
  for (int k = 1; k <= nstate && expose; k++)
    if (out(m, k)) out(m, k)->s = (shp){3, {1, N, H}};
  /* per direction: W_x (G x D), b (G), W_h (G x H) [, GRU's b_h (G)] */
  const shp wx = {2, {G, D}}, wh = {2, {G, H}}, bs = shape1(G);
  for (int d = 0; d < ndir; d++) {
    const int base = m->layers[li].nblobs;
    KILN_TRY(add_blob(m, li, &wx, NULL));
    KILN_TRY(add_blob(m, li, &bs, NULL));
    KILN_TRY(add_blob(m, li, &wh, NULL));
    if (gru) KILN_TRY(add_blob(m, li, &bs, NULL));
    if (rnn) { /* W_ho (H x H) from W_o^T, b_o */
      KILN_TRY(add_blob(m, li, &(shp){2, {H, H}}, NULL));
      float *dwo = m->layers[li].bd[base + 3];
      for (int64_t i = 0; i < H; i++)
        for (int64_t j = 0; j < H; j++) dwo[i * H + j] = wo->f[(d * H + j) * H + i];
      KILN_TRY(add_blob(m, li, &shape1(H), bo->f + d * H));
    }
    float *dwx = m->layers[li].bd[base], *db = m->layers[li].bd[base + 1];
    float *dwh = m->layers[li].bd[base + 2], *dbh = gru ? m->layers[li].bd[base + 3] : NULL;
    const float *w = W->f + d * G * D, *r = R->f + d * G * H, *b = B ? B->f + d * 2 * G : NULL;
    for (int g = 0; g < ngates; g++) {
      const int64_t src = from[g] * H, dst = g * H;
      memcpy(dwx + dst * D, w + src * D, sizeof(float) * (size_t)(H * D));
      memcpy(dwh + dst * H, r + src * H, sizeof(float) * (size_t)(H * H));
      for (int64_t j = 0; j < H; j++) {
        const float wb = b ? b[src + j] : 0.0f, rb = b ? b[G + src + j] : 0.0f;
        if (gru) db[dst + j] = wb, dbh[dst + j] = rb;
        else db[dst + j] = wb + rb;
      }
    }
  }
  return KILN_OK;
}

/* ---- constant folding ------------------------------------------------------------------- */

/* numpy's broadcasting of a and b into *s */
static int broadcast(imp *m, const shp *a, const shp *b, shp *s) {
  s->nd = a->nd > b->nd ? a->nd : b->nd;
  for (int k = 0; k < s->nd; k++) {
    const int ka = k - (s->nd - a->nd), kb = k - (s->nd - b->nd);
    const int64_t da = ka >= 0 ? a->d[ka] : 1, db = kb >= 0 ? b->d[kb] : 1;
    if (da != db && da != 1 && db != 1) return BAD("shapes %s and %s do not broadcast", shape_str(a), shape_str(b));
    s->d[k] = da == 1 ? db : da;
  }
  return KILN_OK;
}

static int64_t bidx(const shp *s, const shp *x, int64_t j) {
  int64_t r = j, idx = 0, stride = 1;
  for (int k = s->nd - 1; k >= 0; k--) {
    const int64_t i = r % s->d[k];
    r /= s->d[k];
    const int kx = k - (s->nd - x->nd);
    if (kx < 0) continue;
    if (x->d[kx] != 1) idx += i * stride;
    stride *= x->d[kx];
  }
  return idx;
}

/* A double as an int64, saturated (NaN as 0): ONNX leaves casts out of range undefined, and a
 * damaged model must not make the importer's own arithmetic undefined. */
static int64_t sat_i64(double v) {
  if (!(v == v)) return 0;
  if (v >= 9.2e18) return (int64_t)9.2e18;
  if (v <= -9.2e18) return -(int64_t)9.2e18;
  return (int64_t)v;
}

static int fold_binary(imp *m, const char *op, tensor *a, tensor *b, tensor *o) {
  shp s;
  KILN_TRY(broadcast(m, &a->s, &b->s, &s));
  const bool fl = a->dt == DT_F || b->dt == DT_F;
  const bool cmp = !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater");
  KILN_TRY(make_const(m, o, fl && !cmp ? DT_F : DT_I, &s));
  for (int64_t j = 0; j < o->n; j++) {
    const double x = cval(a, bidx(&s, &a->s, j)), y = cval(b, bidx(&s, &b->s, j));
    double r;
    if (!strcmp(op, "Add")) r = x + y;
    else if (!strcmp(op, "Sub")) r = x - y;
    else if (!strcmp(op, "Mul")) r = x * y;
    else if (!strcmp(op, "Div")) {
      if (!fl && y == 0) return BAD("an integer division by zero");
      if (!fl && !(fabs(x) < 9.2e18 && fabs(y) < 9.2e18)) return BAD("integers out of range");
      r = fl ? x / y : y == -1 ? -x : (double)((int64_t)x / (int64_t)y);
    } else if (!strcmp(op, "Equal")) r = x == y;
    else if (!strcmp(op, "Less")) r = x < y;
    else if (!strcmp(op, "Greater")) r = x > y;
    else if (!strcmp(op, "Max")) r = x > y ? x : y;
    else if (!strcmp(op, "Min")) r = x < y ? x : y;
    else r = pow(x, y);
    if (o->dt == DT_F) o->f[j] = (float)r;
    else if (!(r >= -9.2e18 && r <= 9.2e18)) return BAD("an integer result out of range (%g)", r);
    else o->i[j] = (int64_t)r;
  }
  if (fl && o->dt == DT_F && !strcmp(op, "Add")) /* float arithmetic as float32 */
    for (int64_t j = 0; j < o->n; j++) o->f[j] = (float)cval(a, bidx(&s, &a->s, j)) + (float)cval(b, bidx(&s, &b->s, j));
  if (fl && o->dt == DT_F && !strcmp(op, "Mul"))
    for (int64_t j = 0; j < o->n; j++) o->f[j] = (float)cval(a, bidx(&s, &a->s, j)) * (float)cval(b, bidx(&s, &b->s, j));
  return KILN_OK;
}

static bool foldable(const char *op) {
  static const char *const ops[] = {"Constant", "Identity", "Shape", "Gather", "Unsqueeze", "Squeeze",
                                    "Concat", "Reshape", "Flatten", "Cast", "Slice", "Add", "Sub",
                                    "Mul", "Div", "Neg", "ConstantOfShape", "Equal", "Where", "Less",
                                    "Greater", "Max", "Min", "Transpose", "Size", "Range", "Dropout", "Pow", "Sqrt", "Expand", NULL};
  for (int k = 0; ops[k]; k++)
    if (!strcmp(ops[k], op)) return true;
  return false;
}

/* Whether the node is folded: its inputs are constants (or, for Shape and Size, of a known
 * shape) and it is one of the ops folded. */
static bool folds(const imp *m) {
  const Onnx__NodeProto *n = m->node;
  const char *op = nop(n);
  if (!strcmp(op, "Shape") || !strcmp(op, "Size")) return true;
  if (!strcmp(op, "Constant")) return true;
  if (!foldable(op)) return false;
  bool any = false;
  for (size_t k = 0; k < n->n_input; k++) {
    const tensor *t = in(m, (int)k);
    if (!t) continue;
    any = true;
    if (t->kind != T_CONST) return false;
  }
  return any;
}

static int fold(imp *m) {
  const Onnx__NodeProto *node = m->node;
  const char *op = nop(node);
  tensor *o = out(m, 0), *a = in(m, 0), *b = in(m, 1);
  if (!o) return KILN_OK;
  m->folded++;
  if (!strcmp(op, "Constant")) {
    const Onnx__AttributeProto *v = attr(node, "value");
    if (v && v->t) return read_tensor(m, o, v->t, nname(m));
    if ((v = attr(node, "value_float")) && v->has_f) {
      KILN_TRY(make_const(m, o, DT_F, &(shp){0, {0}}));
      o->f[0] = v->f;
      return KILN_OK;
    }
    if ((v = attr(node, "value_int")) && v->has_i) {
      KILN_TRY(make_const(m, o, DT_I, &(shp){0, {0}}));
      o->i[0] = v->i;
      return KILN_OK;
    }
    if ((v = attr(node, "value_ints"))) {
      KILN_TRY(make_const(m, o, DT_I, &shape1((int64_t)v->n_ints)));
      for (size_t k = 0; k < v->n_ints; k++) o->i[k] = v->ints[k];
      return KILN_OK;
    }
    if ((v = attr(node, "value_floats"))) {
      KILN_TRY(make_const(m, o, DT_F, &shape1((int64_t)v->n_floats)));
      for (size_t k = 0; k < v->n_floats; k++) o->f[k] = v->floats[k];
      return KILN_OK;
    }
    return REFUSE("a value kiln does not read (value, value_float(s), value_int(s) are read)");
  }
  if (!a) return BAD("input 0 is missing");
  if (!strcmp(op, "Shape")) {
    int64_t st = attr_i(node, "start", 0), en = attr_i(node, "end", a->s.nd);
    if (st < 0) st += a->s.nd;
    if (en < 0) en += a->s.nd;
    st = st < 0 ? 0 : st > a->s.nd ? a->s.nd : st;
    en = en < st ? st : en > a->s.nd ? a->s.nd : en;
    KILN_TRY(make_const(m, o, DT_I, &shape1(en - st)));
    for (int64_t k = st; k < en; k++) o->i[k - st] = a->s.d[k];
    return KILN_OK;
  }
  if (!strcmp(op, "Size")) {
    KILN_TRY(make_const(m, o, DT_I, &(shp){0, {0}}));
    o->i[0] = count(&a->s);
    return KILN_OK;
  }
  if (!strcmp(op, "Identity") || !strcmp(op, "Dropout")) {
    *o = (tensor){.name = o->name, .kind = a->kind, .ready = true, .s = a->s, .dt = a->dt, .f = a->f,
                  .i = a->i, .n = a->n, .uses = o->uses, .ip_layer = -1, .producer = o->producer};
    return KILN_OK;
  }
  if (!strcmp(op, "Cast")) {
    const int64_t to = attr_i(node, "to", 1);
    const int dt = to == 1 || to == 11 || to == 10 || to == 16 ? DT_F : DT_I;
    KILN_TRY(make_const(m, o, dt, &a->s));
    for (int64_t k = 0; k < o->n; k++) {
      if (dt == DT_F) o->f[k] = (float)cval(a, k);
      else o->i[k] = to == 9 ? cval(a, k) != 0 : sat_i64(cval(a, k));
    }
    return KILN_OK;
  }
  if (!strcmp(op, "Neg") || !strcmp(op, "Sqrt")) {
    KILN_TRY(make_const(m, o, a->dt, &a->s));
    for (int64_t k = 0; k < o->n; k++) {
      const double v = !strcmp(op, "Neg") ? -cval(a, k) : sqrt(cval(a, k));
      if (a->dt == DT_F) o->f[k] = (float)v;
      else o->i[k] = sat_i64(v);
    }
    return KILN_OK;
  }
  if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") ||
      !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater") || !strcmp(op, "Max") ||
      !strcmp(op, "Min") || !strcmp(op, "Pow")) {
    if (!b) return BAD("input 1 is missing");
    if (node->n_input > 2) return REFUSE("more than two inputs");
    return fold_binary(m, op, a, b, o);
  }
  if (!strcmp(op, "Where")) {
    tensor *c = in(m, 2);
    if (!b || !c) return BAD("inputs missing");
    shp s1, s;
    KILN_TRY(broadcast(m, &a->s, &b->s, &s1));
    KILN_TRY(broadcast(m, &s1, &c->s, &s));
    const int dt = b->dt == DT_F || c->dt == DT_F ? DT_F : DT_I;
    KILN_TRY(make_const(m, o, dt, &s));
    for (int64_t j = 0; j < o->n; j++) {
      const double v = cval(a, bidx(&s, &a->s, j)) != 0 ? cval(b, bidx(&s, &b->s, j)) : cval(c, bidx(&s, &c->s, j));
      if (dt == DT_F) o->f[j] = (float)v;
      else o->i[j] = sat_i64(v);
    }
    return KILN_OK;
  }
  if (!strcmp(op, "Expand")) {
    if (!b || b->dt != DT_I || b->n > MAXD) return BAD("the shape is not an int64 list");
    shp bs;
    KILN_TRY(shape_set(&bs, (size_t)b->n, b->i, "Expand's shape"));
    shp s;
    KILN_TRY(broadcast(m, &a->s, &bs, &s));
    KILN_TRY(make_const(m, o, a->dt, &s));
    for (int64_t j = 0; j < o->n; j++) {
      const int64_t src = bidx(&s, &a->s, j);
      if (a->dt == DT_F) o->f[j] = a->f[src];
      else o->i[j] = a->i[src];
    }
    return KILN_OK;
  }
  if (!strcmp(op, "ConstantOfShape")) {
    if (a->dt != DT_I || a->n > MAXD) return BAD("the shape is not an int64 list");
    shp s;
    KILN_TRY(shape_set(&s, (size_t)a->n, a->i, "ConstantOfShape's shape"));
    const Onnx__AttributeProto *v = attr(node, "value");
    tensor val = {0};
    if (v && v->t) KILN_TRY(read_tensor(m, &val, v->t, nname(m)));
    else {
      KILN_TRY(make_const(m, &val, DT_F, &shape1(1)));
      val.f[0] = 0;
    }
    if (val.n != 1) return BAD("value has %lld elements", (long long)val.n);
    KILN_TRY(make_const(m, o, val.dt, &s));
    for (int64_t j = 0; j < o->n; j++) {
      if (val.dt == DT_F) o->f[j] = val.f[0];
      else o->i[j] = val.i[0];
    }
    return KILN_OK;
  }
  if (!strcmp(op, "Range")) {
    tensor *d = in(m, 2);
    if (!b || !d) return BAD("inputs missing");
    const double st = cval(a, 0), lim = cval(b, 0), dl = cval(d, 0);
    if (dl == 0 || a->n < 1 || b->n < 1 || d->n < 1) return BAD("a zero delta");
    double nn = ceil((lim - st) / dl);
    if (nn < 0) nn = 0;
    if (nn > (double)MAX_CONST) return BAD("a range of %g elements", nn);
    KILN_TRY(make_const(m, o, a->dt, &shape1((int64_t)nn)));
    for (int64_t j = 0; j < o->n; j++) {
      if (a->dt == DT_F) o->f[j] = (float)(st + dl * (double)j);
      else o->i[j] = sat_i64(st + dl * (double)j);
    }
    return KILN_OK;
  }
  if (!strcmp(op, "Gather")) {
    if (!b || b->dt != DT_I) return BAD("indices are missing or not integers");
    int axis = 0;
    KILN_TRY(norm_axis(m, attr_i(node, "axis", 0), a->s.nd, &axis));
    shp s = {0, {0}};
    for (int k = 0; k < axis; k++) s.d[s.nd++] = a->s.d[k];
    for (int k = 0; k < b->s.nd && s.nd < MAXD; k++) s.d[s.nd++] = b->s.d[k];
    for (int k = axis + 1; k < a->s.nd && s.nd < MAXD; k++) s.d[s.nd++] = a->s.d[k];
    if (s.nd != a->s.nd - 1 + b->s.nd) return REFUSE("gives too many axes");
    KILN_TRY(make_const(m, o, a->dt, &s));
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < axis; k++) outer *= a->s.d[k];
    for (int k = axis + 1; k < a->s.nd; k++) inner *= a->s.d[k];
    const int64_t D = a->s.d[axis];
    int64_t j = 0;
    for (int64_t p = 0; p < outer; p++)
      for (int64_t q = 0; q < b->n; q++) {
        int64_t i = b->i[q] < 0 ? b->i[q] + D : b->i[q];
        if (i < 0 || i >= D) return BAD("index %lld is outside an axis of %lld", (long long)b->i[q], (long long)D);
        for (int64_t r = 0; r < inner; r++, j++) {
          const int64_t src = (p * D + i) * inner + r;
          if (a->dt == DT_F) o->f[j] = a->f[src];
          else o->i[j] = a->i[src];
        }
      }
    return KILN_OK;
  }
  if (!strcmp(op, "Concat")) {
    int axis = 0;
    KILN_TRY(norm_axis(m, attr_i(node, "axis", 0), a->s.nd, &axis));
    shp s = a->s;
    s.d[axis] = 0;
    bool fl = false;
    for (size_t k = 0; k < node->n_input; k++) {
      tensor *t = in(m, (int)k);
      if (!t) continue;
      if (t->s.nd != s.nd) return BAD("input %zu has %d axes, input 0 %d", k, t->s.nd, s.nd);
      for (int q = 0; q < s.nd; q++)
        if (q != axis && t->s.d[q] != a->s.d[q]) return BAD("input %zu %s and input 0 %s differ off the axis", k, shape_str(&t->s), shape_str(&a->s));
      s.d[axis] += t->s.d[axis];
      fl |= t->dt == DT_F;
    }
    KILN_TRY(make_const(m, o, fl ? DT_F : DT_I, &s));
    int64_t outer = 1, inner = 1;
    for (int q = 0; q < axis; q++) outer *= s.d[q];
    for (int q = axis + 1; q < s.nd; q++) inner *= s.d[q];
    int64_t j = 0;
    for (int64_t p = 0; p < outer; p++)
      for (size_t k = 0; k < node->n_input; k++) {
        tensor *t = in(m, (int)k);
        if (!t) continue;
        const int64_t len = t->s.d[axis] * inner;
        for (int64_t r = 0; r < len; r++, j++) {
          const double v = cval(t, p * len + r);
          if (fl) o->f[j] = (float)v;
          else o->i[j] = sat_i64(v);
        }
      }
    return KILN_OK;
  }
  if (!strcmp(op, "Reshape") || !strcmp(op, "Flatten") || !strcmp(op, "Squeeze") || !strcmp(op, "Unsqueeze")) {
    shp s;
    KILN_TRY(shape_of_reshape_op(m, a, &s));
    *o = (tensor){.name = o->name, .kind = T_CONST, .ready = true, .s = s, .dt = a->dt, .f = a->f,
                  .i = a->i, .n = a->n, .uses = o->uses, .ip_layer = -1, .producer = o->producer};
    return KILN_OK;
  }
  if (!strcmp(op, "Slice")) {
    int64_t st[MAXD * 2], en[MAXD * 2], ax[MAXD * 2], sp[MAXD * 2];
    int ns, ne, na, nsp;
    KILN_TRY(ints_arg(m, 1, "starts", 10, st, &ns));
    KILN_TRY(ints_arg(m, 2, "ends", 10, en, &ne));
    KILN_TRY(ints_arg(m, 3, "axes", 10, ax, &na));
    KILN_TRY(ints_arg(m, 4, "steps", 10, sp, &nsp));
    if (ns < 0 || ne != ns || (na >= 0 && na != ns) || (nsp >= 0 && nsp != ns)) return BAD("starts, ends, axes and steps disagree");
    int64_t lo[MAXD], step[MAXD];
    shp s = a->s;
    for (int k = 0; k < s.nd; k++) lo[k] = 0, step[k] = 1;
    for (int j = 0; j < ns; j++) {
      int q = 0;
      KILN_TRY(norm_axis(m, na >= 0 ? ax[j] : j, a->s.nd, &q));
      const int64_t D = a->s.d[q], stp = nsp >= 0 ? sp[j] : 1;
      if (stp == 0) return BAD("a step of 0");
      int64_t b0 = st[j] < 0 ? st[j] + D : st[j], e0 = en[j] < 0 ? en[j] + D : en[j];
      if (stp > 0) {
        b0 = b0 < 0 ? 0 : b0 > D ? D : b0;
        e0 = e0 < 0 ? 0 : e0 > D ? D : e0;
        s.d[q] = e0 > b0 ? (e0 - b0 + stp - 1) / stp : 0;
      } else {
        b0 = b0 < 0 ? -1 : b0 > D - 1 ? D - 1 : b0;
        e0 = e0 < -1 ? -1 : e0 > D - 1 ? D - 1 : e0;
        s.d[q] = b0 > e0 ? (b0 - e0 - stp - 1) / -stp : 0;
      }
      lo[q] = b0, step[q] = stp;
    }
    KILN_TRY(make_const(m, o, a->dt, &s));
    for (int64_t j = 0; j < o->n; j++) {
      int64_t r = j, src = 0, stride = 1;
      for (int k = s.nd - 1; k >= 0; k--) {
        const int64_t i = r % s.d[k];
        r /= s.d[k];
        src += (lo[k] + i * step[k]) * stride;
        stride *= a->s.d[k];
      }
      if (a->dt == DT_F) o->f[j] = a->f[src];
      else o->i[j] = a->i[src];
    }
    return KILN_OK;
  }
  if (!strcmp(op, "Transpose")) {
    size_t n;
    const int64_t *perm = attr_ints(node, "perm", &n);
    int64_t p[MAXD];
    if (!perm) {
      n = (size_t)a->s.nd;
      for (size_t k = 0; k < n; k++) p[k] = a->s.nd - 1 - (int64_t)k;
    } else {
      if (n != (size_t)a->s.nd) return BAD("perm has %zu values for %d axes", n, a->s.nd);
      memcpy(p, perm, n * sizeof *p);
    }
    shp s = {a->s.nd, {0}};
    bool seen[MAXD] = {0};
    for (size_t k = 0; k < n; k++) {
      if (p[k] < 0 || p[k] >= a->s.nd || seen[p[k]]) return BAD("perm is not a permutation");
      seen[p[k]] = true;
      s.d[k] = a->s.d[p[k]];
    }
    KILN_TRY(make_const(m, o, a->dt, &s));
    int64_t astr[MAXD];
    for (int k = a->s.nd - 1, st = 1; k >= 0; k--) astr[k] = st, st *= (int)a->s.d[k];
    for (int64_t j = 0; j < o->n; j++) {
      int64_t r = j, src = 0;
      for (int k = s.nd - 1; k >= 0; k--) {
        const int64_t i = r % s.d[k];
        r /= s.d[k];
        src += i * astr[p[k]];
      }
      if (a->dt == DT_F) o->f[j] = a->f[src];
      else o->i[j] = a->i[src];
    }
    return KILN_OK;
  }
  return REFUSE("computes a constant kiln does not fold");
}

/* ---- attention as kiln's export writes it ----------------------------------------------------
 *
 * `kiln export onnx` writes MultiHeadAttention as some twenty nodes (docs/onnx.md): the three
 * projections into heads (MatMul by W^T, Add, Reshape to N x H, Transpose), q k^T, the scaling,
 * the causal and padding masks, Softmax, the masks again, the weighted sum, the heads joined and
 * the out-projection. Node by node they import as MatMul, Permute and Softmax layers, which compute
 * the same to float rounding; found whole, they are the MultiHeadAttention layer again, and a
 * model exported by kiln comes back bit for bit. The search runs before any node is mapped, from
 * each Softmax over the graph's structure and its initializers; a group found is mapped at its
 * last node (the out-projection), when its inputs are known, and its other nodes make nothing. */

typedef struct attn_match {
  const char *x, *kv, *mask; /* the query input, the keys' and values' (NULL: x), the mask (or NULL) */
  int64_t T, S, N, D, H;
  bool causal, bias;
  const float *w[4], *b[4]; /* W^T (D x D) and b of q, k, v and the out-projection */
} attn_match;

enum { MAXGROUP = 48 };
typedef struct {
  int n;
  int v[MAXGROUP];
} group;

static bool gadd(group *g, int k) {
  if (k < 0 || g->n == MAXGROUP) return false;
  g->v[g->n++] = k;
  return true;
}

/* heads = Transpose(perm) of Reshape [0, 0, H, hd] of [Add b of] MatMul(in, W^T): in, or NULL.
 * *H is set from the first projection and checked against the others; *bias likewise (-1:
 * not yet known). */
static const char *heads_of(const imp *m, const char *heads, const int64_t *perm, int64_t D,
                            int64_t *H, int *bias, const float **w, const float **b, group *g) {
  const Onnx__NodeProto *const *G = (const Onnx__NodeProto *const *)m->g->node;
  const int kt = writer(m, heads, "Transpose");
  if (kt < 0 || !perm_is(G[kt], perm, 4)) return NULL;
  const int kr = writer(m, in_name(G[kt], 0), "Reshape");
  if (kr < 0) return NULL;
  const tensor *sh = t_find(m, in_name(G[kr], 1));
  if (!sh || sh->kind != T_CONST || sh->dt != DT_I || sh->n != 4 || sh->i[2] < 1) return NULL;
  if (*H < 0) *H = sh->i[2];
  const int64_t want[4] = {0, 0, *H, D / *H};
  if (D % *H || !reshape_is(m, G[kr], want, 4)) return NULL;
  const char *y = in_name(G[kr], 0);
  const int ka = writer(m, y, "Add");
  const tensor *bt = NULL;
  if (ka >= 0) {
    if (!(bt = fconst(m, in_name(G[ka], 1), D))) return NULL;
    y = in_name(G[ka], 0);
  }
  if (*bias < 0) *bias = ka >= 0;
  if (*bias != (ka >= 0)) return NULL;
  const int km = writer(m, y, "MatMul");
  const tensor *wt = km >= 0 ? fconst(m, in_name(G[km], 1), D * D) : NULL;
  if (!wt || wt->s.nd != 2) return NULL;
  *w = wt->f;
  *b = bt ? bt->f : NULL;
  if (!gadd(g, kt) || !gadd(g, kr) || (ka >= 0 && !gadd(g, ka)) || !gadd(g, km)) return NULL;
  return in_name(G[km], 0);
}

/* Whether the T x S constant c holds `on` where s <= t and `off` elsewhere. */
static bool causal_pattern(const tensor *c, int64_t T, int64_t S, float on, float off) {
  if (c->s.nd != 2 || c->s.d[0] != T || c->s.d[1] != S) return false;
  for (int64_t t = 0; t < T; t++)
    for (int64_t s = 0; s < S; s++)
      if (c->f[t * S + s] != (s <= t ? on : off)) return false;
  return true;
}

/* The attention group whose Softmax is node ks, as kiln's export writes it; its last node, or -1. */
static int match_attention(imp *m, int ks, attn_match *a, group *g) {
  const Onnx__NodeProto *const *G = (const Onnx__NodeProto *const *)m->g->node;
  memset(a, 0, sizeof *a);
  g->n = 0;
  const Onnx__NodeProto *sm = G[ks];
  if (attr_i(sm, "axis", -1) != -1 || !gadd(g, ks)) return -1;
  /* back from the Softmax: [Add of the padding mask's -1e30s] [Add causal] Mul scale MatMul */
  const char *sc = in_name(sm, 0), *vis = NULL;
  int k = writer(m, sc, "Add"), kvr = -1;
  if (k >= 0) {
    const int ksub = writer(m, in_name(G[k], 1), "Sub");
    const int kmul = ksub >= 0 ? writer(m, in_name(G[ksub], 0), "Mul") : -1;
    const tensor *big2 = ksub >= 0 ? fconst(m, in_name(G[ksub], 1), 1) : NULL;
    const tensor *big = kmul >= 0 ? fconst(m, in_name(G[kmul], 1), 1) : NULL;
    if (big && big2 && big->f[0] == 1e30f && big2->f[0] == 1e30f) {
      vis = in_name(G[kmul], 0);
      /* visible = Reshape [0, 1, 1, S] of Transpose [1, 0] of the S x N mask */
      kvr = writer(m, vis, "Reshape");
      const int kvt = kvr >= 0 ? writer(m, in_name(G[kvr], 0), "Transpose") : -1;
      const int64_t p10[2] = {1, 0};
      if (kvt < 0 || !perm_is(G[kvt], p10, 2)) return -1;
      a->mask = in_name(G[kvt], 0);
      if (!gadd(g, k) || !gadd(g, ksub) || !gadd(g, kmul) || !gadd(g, kvr) || !gadd(g, kvt)) return -1;
      sc = in_name(G[k], 0);
      k = writer(m, sc, "Add");
    }
  }
  const tensor *cm = NULL;
  if (k >= 0 && (cm = fconst(m, in_name(G[k], 1), -1)) && cm->s.nd == 2) {
    a->causal = true;
    if (!gadd(g, k)) return -1;
    sc = in_name(G[k], 0);
  }
  const int kscale = writer(m, sc, "Mul");
  const tensor *scale = kscale >= 0 ? fconst(m, in_name(G[kscale], 1), 1) : NULL;
  const int kdot = scale ? writer(m, in_name(G[kscale], 0), "MatMul") : -1;
  if (kdot < 0 || !gadd(g, kscale) || !gadd(g, kdot)) return -1;
  /* forward: [Mul visible [Mul causal_visible]] MatMul v, Transpose, Reshape, MatMul W_o^T [Add] */
  const char *w8 = sm->output[0];
  if (vis) {
    const int kv1 = sole_reader(m, w8, "Mul");
    if (kv1 < 0 || strcmp(other_in(G[kv1], w8) ? other_in(G[kv1], w8) : "", vis) || !gadd(g, kv1)) return -1;
    w8 = G[kv1]->output[0];
    if (a->causal) {
      const int kv2 = sole_reader(m, w8, "Mul");
      const tensor *cv = kv2 >= 0 ? fconst(m, other_in(G[kv2], w8), -1) : NULL;
      if (!cv || !gadd(g, kv2)) return -1;
      if (!causal_pattern(cv, cm->s.d[0], cm->s.d[1], 1.0f, 0.0f)) return -1;
      w8 = G[kv2]->output[0];
    }
  }
  const int kctx = sole_reader(m, w8, "MatMul");
  if (kctx < 0 || strcmp(in_name(G[kctx], 0), w8) || !gadd(g, kctx)) return -1;
  const int kct = sole_reader(m, G[kctx]->output[0], "Transpose");
  const int64_t p2013[4] = {2, 0, 1, 3};
  if (kct < 0 || !perm_is(G[kct], p2013, 4) || !gadd(g, kct)) return -1;
  const int kj = sole_reader(m, G[kct]->output[0], "Reshape");
  const int ko = kj >= 0 ? sole_reader(m, G[kj]->output[0], "MatMul") : -1;
  const tensor *wo = ko >= 0 ? fconst(m, in_name(G[ko], 1), -1) : NULL;
  if (!wo || wo->s.nd != 2 || wo->s.d[0] != wo->s.d[1] || !gadd(g, kj) || !gadd(g, ko)) return -1;
  const int64_t D = wo->s.d[0];
  const int64_t joined[3] = {0, 0, D};
  if (!reshape_is(m, G[kj], joined, 3)) return -1;
  int last = ko, bias = -1;
  const int kob = sole_reader(m, G[ko]->output[0], "Add");
  const tensor *bo = kob >= 0 ? fconst(m, other_in(G[kob], G[ko]->output[0]), D) : NULL;
  if (bo) {
    if (!gadd(g, kob)) return -1;
    last = kob;
  }
  /* the three projections */
  int64_t H = -1;
  const int64_t pq[4] = {1, 2, 0, 3}, pk[4] = {1, 2, 3, 0};
  const char *xq = heads_of(m, in_name(G[kdot], 0), pq, D, &H, &bias, &a->w[0], &a->b[0], g);
  const char *xk = xq ? heads_of(m, in_name(G[kdot], 1), pk, D, &H, &bias, &a->w[1], &a->b[1], g) : NULL;
  const char *xv = xk ? heads_of(m, in_name(G[kctx], 1), pq, D, &H, &bias, &a->w[2], &a->b[2], g) : NULL;
  if (!xv || strcmp(xk, xv) || bias != (bo != NULL)) return -1;
  a->w[3] = wo->f;
  a->b[3] = bo ? bo->f : NULL;
  a->bias = bias;
  a->H = H, a->D = D;
  a->x = xq;
  a->kv = strcmp(xk, xq) ? xk : NULL;
  /* the scale kiln's, the causal mask's pattern (the inputs' shapes are known when the group's
   * last node is mapped: attention_layer checks them) */
  if (!near(scale->f[0], 1.0 / sqrt((double)(D / H)))) return -1;
  if (a->causal) {
    a->T = cm->s.d[0], a->S = cm->s.d[1];
    if (a->S != a->T || !causal_pattern(cm, a->T, a->S, 0.0f, -1e30f)) return -1;
  }
  /* nothing outside the group reads a value inside it */
  for (int i = 0; i < g->n; i++) {
    const Onnx__NodeProto *n = G[g->v[i]];
    if (g->v[i] == last) continue;
    for (size_t o = 0; o < n->n_output; o++) {
      if (!n->output[o] || !*n->output[o]) continue;
      if (is_graph_output(m, n->output[o])) return -1;
      int rd[MAXGROUP];
      const int nr = readers(m, n->output[o], rd, MAXGROUP);
      if (nr > MAXGROUP) return -1;
      for (int r = 0; r < nr; r++) {
        bool in = false;
        for (int j = 0; j < g->n; j++) in |= g->v[j] == rd[r];
        if (!in) return -1;
      }
    }
  }
  return last;
}

/* Before mapping: every attention group, its nodes marked and its match kept for its last node. */
static int find_attention(imp *m) {
  for (size_t k = 0; k < m->g->n_node; k++) {
    if (strcmp(nop(m->g->node[k]), "Softmax")) continue;
    attn_match a;
    group g;
    const int last = match_attention(m, (int)k, &a, &g);
    if (last < 0) continue;
    attn_match *keep = ialloc(m, sizeof *keep);
    if (!keep) return nomem();
    *keep = a;
    m->attn[last] = keep;
    for (int i = 0; i < g.n; i++)
      if (g.v[i] != last) m->fused[g.v[i]] = true;
  }
  return KILN_OK;
}

/* The MultiHeadAttention layer of a group found, at its last node. */
static int attention_layer(imp *m, attn_match *a) {
  const char *bs[3], *top;
  int nb = 0;
  const tensor *tx = t_find(m, a->x), *tk = t_find(m, a->kv ? a->kv : a->x);
  const tensor *tm = a->mask ? t_find(m, a->mask) : NULL;
  const int64_t D = a->D;
  if (!tx || !tk || tx->s.nd != 3 || tk->s.nd != 3 || tx->s.d[2] != D || tk->s.d[2] != D ||
      tx->s.d[1] != tk->s.d[1] || (a->causal && (tx->s.d[0] != a->T || tk->s.d[0] != a->S)) ||
      (tm && (tm->s.nd != 2 || tm->s.d[0] != tk->s.d[0] || tm->s.d[1] != tx->s.d[1])))
    return BAD("attention over %s (keys %s, mask %s) as `kiln export onnx` writes it, but not "
               "T x N x %lld, S x N x %lld and S x N", tx ? shape_str(&tx->s) : "?",
               tk ? shape_str(&tk->s) : "?", tm ? shape_str(&tm->s) : "none", (long long)D,
               (long long)D);
  a->T = tx->s.d[0], a->N = tx->s.d[1], a->S = tk->s.d[0];
  const char *names[3] = {a->x, a->kv, a->mask};
  for (int i = 0; i < 3; i++) {
    if (!names[i]) continue;
    tensor *t = t_find(m, names[i]);
    if (!t || (t->kind != T_BLOB && t->kind != T_PAD))
      return REFUSE("attention's input '%s' is not computed", names[i]);
    KILN_TRY(materialize(m, t, &bs[nb++]));
  }
  KILN_TRY(set_out(m, 0, &(shp){3, {a->T, a->N, a->D}}, &top));
  const int li = begin_layer(m, "MultiHeadAttention", chain_name(m, "MultiHeadAttention"), nb, bs, 1, &top);
  if (li < 0) return KILN_ERR_NOMEM;
  params(m, "multihead_attention_param { num_heads: %lld%s%s }", (long long)a->H,
         a->causal ? " causal: true" : "", a->bias ? "" : " bias_term: false");
  end_layer(m);
  KILN_TRY(add_blob(m, li, &(shp){2, {3 * D, D}}, NULL));
  float *win = m->layers[li].bd[m->layers[li].nblobs - 1];
  for (int p = 0; p < 3; p++) /* W (out x in) from W^T (in x out) */
    for (int64_t o = 0; o < D; o++)
      for (int64_t i = 0; i < D; i++) win[(p * D + o) * D + i] = a->w[p][i * D + o];
  if (a->bias) {
    KILN_TRY(add_blob(m, li, &shape1(3 * D), NULL));
    float *bin = m->layers[li].bd[m->layers[li].nblobs - 1];
    for (int p = 0; p < 3; p++) memcpy(bin + p * D, a->b[p], sizeof(float) * (size_t)D);
  }
  KILN_TRY(add_blob(m, li, &(shp){2, {D, D}}, NULL));
  float *wo = m->layers[li].bd[m->layers[li].nblobs - 1];
  for (int64_t o = 0; o < D; o++)
    for (int64_t i = 0; i < D; i++) wo[o * D + i] = a->w[3][i * D + o];
  if (a->bias) KILN_TRY(add_blob(m, li, &shape1(D), a->b[3]));
  return KILN_OK;
}

/* ---- the ops ---------------------------------------------------------------------------- */

typedef int (*op_fn)(imp *m);
static const struct {
  const char *op;
  op_fn fn;
} ops[] = {
    {"Conv", op_conv}, {"ConvTranspose", op_conv}, {"MaxPool", op_pool}, {"AveragePool", op_pool},
    {"GlobalAveragePool", op_global_pool}, {"GlobalMaxPool", op_global_pool}, {"Pad", op_pad},
    {"Gemm", op_gemm}, {"MatMul", op_matmul}, {"Relu", op_unary}, {"LeakyRelu", op_unary},
    {"Elu", op_unary}, {"Sigmoid", op_unary}, {"Tanh", op_unary}, {"Abs", op_unary},
    {"Exp", op_unary}, {"Log", op_unary}, {"Softplus", op_unary}, {"Sqrt", op_unary},
    {"Neg", op_unary}, {"Reciprocal", op_unary}, {"PRelu", op_prelu}, {"Add", op_binary},
    {"Sub", op_binary}, {"Mul", op_binary}, {"Div", op_binary}, {"Max", op_binary},
    {"Min", op_binary}, {"Pow", op_binary}, {"BatchNormalization", op_batchnorm}, {"LRN", op_lrn},
    {"Softmax", op_softmax}, {"Flatten", op_reshape_like}, {"Reshape", op_reshape_like},
    {"Squeeze", op_reshape_like}, {"Unsqueeze", op_reshape_like}, {"Identity", op_identity},
    {"Dropout", op_identity}, {"Transpose", op_transpose}, {"Concat", op_concat},
    {"Split", op_split}, {"Slice", op_slice}, {"Gather", op_gather}, {"LSTM", op_recurrent},
    {"GRU", op_recurrent}, {"RNN", op_recurrent},
    {"ReduceMean", op_reduce_mean}, {"LayerNormalization", op_layer_norm},
    {"ReduceSumSquare", op_reduce_sum_square},
    {NULL, NULL}};

static op_fn find_op(const char *op) {
  for (int k = 0; ops[k].op; k++)
    if (!strcmp(ops[k].op, op)) return ops[k].fn;
  return NULL;
}

static bool cast_to_int(int64_t to) {
  return to == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || to == ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
}

/* Whether every node that reads n's output reads it as a Gather's indices (input 1): the ids of
 * an Embed, which reads them as floats and refuses any that is not a whole number, so the Cast
 * to an integer type (what `kiln export onnx` writes before its Gather) changes nothing there. */
static bool only_gather_ids(const imp *m, const Onnx__NodeProto *n) {
  if (n->n_output != 1 || !n->output[0]) return false;
  const char *y = n->output[0];
  bool read = false;
  for (size_t k = 0; k < m->g->n_node; k++) {
    const Onnx__NodeProto *r = m->g->node[k];
    for (size_t i = 0; i < r->n_input; i++) {
      if (!r->input[i] || strcmp(r->input[i], y)) continue;
      if (i != 1 || !r->op_type || strcmp(r->op_type, "Gather")) return false;
      read = true;
    }
  }
  for (size_t k = 0; k < m->g->n_output; k++)
    if (m->g->output[k]->name && !strcmp(m->g->output[k]->name, y)) return false;
  return read;
}

static int map_node(imp *m) {
  const Onnx__NodeProto *n = m->node;
  if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx"))
    return REFUSE("an op of domain '%s': kiln imports the default domain (ai.onnx)", n->domain);
  const char *op = nop(n);
  if (m->fused[m->node_index]) return KILN_OK;
  if (m->attn[m->node_index]) return attention_layer(m, m->attn[m->node_index]);
  if (folds(m)) return fold(m);
  if (!strcmp(op, "Cast")) {
    tensor *x;
    KILN_TRY(blob_in(m, 0, &x));
    const int64_t to = attr_i(n, "to", 0);
    if (to != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && !(cast_to_int(to) && only_gather_ids(m, n)))
      return REFUSE("to data_type %lld: kiln computes in float (a Cast to an integer type is "
                    "taken only where Gathers read it as their indices: an Embed's ids)", (long long)to);
    m->dropped++;
    return alias_out(m, 0, x, &x->s);
  }
  if (folds(m)) return fold(m);
  op_fn fn = find_op(op);
  if (!fn) return REFUSE("an op kiln cannot express (docs/onnx.md lists the ops it imports)");
  return fn(m);
}

/* ---- the graph -------------------------------------------------------------------------- */

static int read_inputs(imp *m, Onnx__GraphProto *g, int *ninputs) {
  *ninputs = 0;
  for (size_t k = 0; k < g->n_input; k++) {
    const Onnx__ValueInfoProto *v = g->input[k];
    if (!v->name || !*v->name) return kiln_errorf(KILN_ERR_INVALID, "%s: graph input %zu has no name", m->src, k);
    tensor *t = t_find(m, v->name);
    if (t && t->kind == T_CONST) continue; /* an initializer listed as an input (IR < 4) */
    if (t) return kiln_errorf(KILN_ERR_INVALID, "%s: graph input '%s' is listed twice", m->src, v->name);
    const char *nm = set_add(m, &m->reserved, v->name);
    if (!nm || !(t = t_new(m, nm)) || !(nm = own_blob(m, v->name))) return nomem();
    const Onnx__TypeProto *ty = v->type;
    if (!ty || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !ty->tensor_type)
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph input '%s' is not a tensor", m->src, v->name);
    const Onnx__TypeProto__Tensor *tt = ty->tensor_type;
    const int32_t et = tt->has_elem_type ? tt->elem_type : 0;
    if (et != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && et != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 &&
        et != ONNX__TENSOR_PROTO__DATA_TYPE__INT32)
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph input '%s' has elem_type %d: kiln's inputs are float (or integer ids for an Embed)", m->src, v->name, et);
    if (!tt->shape) return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph input '%s' has no shape: kiln's nets have fixed shapes", m->src, v->name);
    int64_t d[MAXD];
    if (tt->shape->n_dim > MAXD) return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph input '%s' has %zu axes", m->src, v->name, tt->shape->n_dim);
    for (size_t a = 0; a < tt->shape->n_dim; a++) {
      const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[a];
      if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dm->dim_value > 0) d[a] = dm->dim_value;
      else if (a == 0) d[a] = m->opt->batch > 0 ? m->opt->batch : 1;
      else
        return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph input '%s': axis %zu is %s: kiln's nets have fixed shapes (only the first axis may be symbolic: --batch)",
                           m->src, v->name, a, dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM ? dm->dim_param : "unknown");
    }
    char what[512];
    snprintf(what, sizeof what, "%s: graph input '%s'", m->src, v->name);
    KILN_TRY(shape_set(&t->s, tt->shape->n_dim, d, what));
    t->kind = T_BLOB;
    t->ready = true;
    t->blob = nm;
    t->cs = t->s;
    if (begin_layer(m, "Input", nm, 0, NULL, 1, &nm) < 0) return KILN_ERR_NOMEM;
    kiln_strbuf_printf(&m->text, "  input_param { shape {");
    for (int a = 0; a < t->s.nd; a++) kiln_strbuf_printf(&m->text, " dim: %lld", (long long)t->s.d[a]);
    kiln_strbuf_printf(&m->text, " } }\n");
    end_layer(m);
    ++*ninputs;
  }
  return KILN_OK;
}

static int opset_of(imp *m) {
  const Onnx__ModelProto *md = m->model;
  m->opset = -1;
  for (size_t k = 0; k < md->n_opset_import; k++) {
    const Onnx__OperatorSetIdProto *o = md->opset_import[k];
    if (!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) m->opset = o->has_version ? (int)o->version : 1;
  }
  if (m->opset < 0 && md->n_opset_import == 0 && md->has_ir_version && md->ir_version < 3) m->opset = 1;
  if (m->opset < 0) return kiln_errorf(KILN_ERR_INVALID, "%s: opset_import names no opset of the default domain (ai.onnx)", m->src);
  if (m->opset < KILN_ONNX_IMPORT_OPSET_MIN || m->opset > KILN_ONNX_IMPORT_OPSET_MAX)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: opset_import: the model is of opset %d of ai.onnx; kiln reads opsets %d to %d (re-export it, e.g. torch.onnx.export(..., opset_version=13), or convert it with onnx.version_converter)",
                       m->src, m->opset, KILN_ONNX_IMPORT_OPSET_MIN, KILN_ONNX_IMPORT_OPSET_MAX);
  return KILN_OK;
}

/* A min-heap of node indices: the ready nodes, taken in the file's order. */
static void heap_push(int *h, int *n, int v) {
  int i = (*n)++;
  h[i] = v;
  while (i > 0 && h[(i - 1) / 2] > h[i]) {
    int p = (i - 1) / 2, t = h[p];
    h[p] = h[i], h[i] = t, i = p;
  }
}

static int heap_pop(int *h, int *n) {
  int r = h[0];
  h[0] = h[--*n];
  for (int i = 0;;) {
    int l = 2 * i + 1, s = i;
    if (l < *n && h[l] < h[s]) s = l;
    if (l + 1 < *n && h[l + 1] < h[s]) s = l + 1;
    if (s == i) break;
    int t = h[s];
    h[s] = h[i], h[i] = t, i = s;
  }
  return r;
}

/* Node k, ready (its inputs known): to the heap of nodes that fold, or the other. */
static void push_ready(imp *m, int k, int *heap, int *nh, int *fheap, int *nf) {
  const Onnx__NodeProto *node = m->node;
  const int index = m->node_index;
  m->node = m->g->node[k], m->node_index = k;
  if (folds(m)) heap_push(fheap, nf, k);
  else heap_push(heap, nh, k);
  m->node = node, m->node_index = index;
}

static int run_graph(imp *m, int *order_out) {
  Onnx__GraphProto *g = m->g;
  const int nn = (int)g->n_node;
  int *indeg = calloc((size_t)nn + 1, sizeof *indeg), *heap = malloc(sizeof(int) * ((size_t)nn + 1));
  int *fheap = malloc(sizeof(int) * ((size_t)nn + 1));
  int rc = KILN_OK, nh = 0, nf = 0, done = 0;
  if (!indeg || !heap || !fheap) {
    rc = nomem();
    goto out;
  }
  /* every node output a tensor, written once */
  for (int k = 0; k < nn; k++) {
    const Onnx__NodeProto *n = g->node[k];
    m->node = n, m->node_index = k;
    if (!n->op_type || !*n->op_type) { rc = BAD("no op_type"); goto out; }
    for (size_t j = 0; j < n->n_output; j++) {
      const char *o = n->output[j];
      if (!o || !*o) continue;
      tensor *t = t_find(m, o);
      if (t) {
        rc = t->producer >= 0 ? BAD("output '%s' is written by node '%s' too", o, g->node[t->producer]->name ? g->node[t->producer]->name : "?")
                              : BAD("output '%s' is also a graph input or an initializer", o);
        goto out;
      }
      const char *nm = set_add(m, &m->reserved, o);
      if (!nm || !(t = t_new(m, nm))) { rc = nomem(); goto out; }
      t->producer = k;
    }
  }
  for (int k = 0; k < nn; k++) {
    const Onnx__NodeProto *n = g->node[k];
    m->node = n, m->node_index = k;
    for (size_t j = 0; j < n->n_input; j++) {
      const char *i = n->input[j];
      if (!i || !*i) continue;
      tensor *t = t_find(m, i);
      if (!t) { rc = BAD("input '%s' is written by no node, initializer or graph input", i); goto out; }
      t->uses++;
      if (t->producer >= 0) indeg[k]++;
    }
  }
  for (size_t k = 0; k < g->n_output; k++) {
    tensor *t = g->output[k]->name ? t_find(m, g->output[k]->name) : NULL;
    if (!t) { rc = kiln_errorf(KILN_ERR_INVALID, "%s: graph output '%s' is written by no node", m->src, g->output[k]->name ? g->output[k]->name : ""); goto out; }
    t->uses++;
  }
  if (!(m->fused = ialloc(m, sizeof *m->fused * ((size_t)nn + 1)))) { rc = nomem(); goto out; }
  memset(m->fused, 0, sizeof *m->fused * ((size_t)nn + 1));
  if (!(m->attn = ialloc(m, sizeof *m->attn * ((size_t)nn + 1)))) { rc = nomem(); goto out; }
  memset(m->attn, 0, sizeof *m->attn * ((size_t)nn + 1));
  if ((rc = find_attention(m))) goto out;
  /* Constant nodes first (they read nothing), then whatever folds as soon as it is ready, then
   * the others: so a node that looks ahead (a chain of nodes that is one layer, LayerNorm or
   * GELU written out; the Slices that share one input) finds the constants of the nodes after it
   * folded when it is mapped */
  for (int k = 0; k < nn; k++)
    if (!indeg[k] && strcmp(nop(g->node[k]), "Constant")) push_ready(m, k, heap, &nh, fheap, &nf);
  for (int next_const = 0;;) {
    int k = -1;
    for (; next_const < nn && k < 0; next_const++)
      if (!indeg[next_const] && !strcmp(nop(g->node[next_const]), "Constant")) k = next_const;
    if (k < 0 && nf > 0) k = heap_pop(fheap, &nf);
    if (k < 0 && nh == 0) break;
    if (k < 0) k = heap_pop(heap, &nh);
    const Onnx__NodeProto *n = g->node[k];
    m->node = n, m->node_index = k;
    if ((rc = map_node(m))) goto out;
    for (size_t j = 0; j < n->n_output && !m->fused[k]; j++) {
      tensor *t = n->output[j] && *n->output[j] ? t_find(m, n->output[j]) : NULL;
      if (!t) continue;
      if (!t->ready && t->uses) { rc = REFUSE("output %zu ('%s') is not imported", j, t->name); goto out; }
    }
    order_out[done++] = k;
    /* the nodes this one's outputs feed */
    for (size_t j = 0; j < n->n_output; j++) {
      const char *o = n->output[j];
      if (!o || !*o) continue;
      for (int q = 0; q < nn; q++) {
        const Onnx__NodeProto *c = g->node[q];
        for (size_t i = 0; i < c->n_input; i++)
          if (c->input[i] && !strcmp(c->input[i], o) && --indeg[q] == 0)
            push_ready(m, q, heap, &nh, fheap, &nf);
      }
    }
  }
  if (done < nn) {
    for (int k = 0; k < nn; k++)
      if (indeg[k] > 0) {
        m->node = g->node[k], m->node_index = k;
        rc = nfail(m, KILN_ERR_INVALID, "the graph has a cycle: this node's inputs depend on its own "
                   "output (%d node%s in the cycle or after it)", nn - done, nn - done == 1 ? "" : "s");
        break;
      }
  }
out:
  free(indeg);
  free(heap);
  free(fheap);
  return rc;
}

/* Graph outputs under their ONNX names; blobs nothing reads that are not outputs silenced. */
static int finish_outputs(imp *m) {
  static const Onnx__NodeProto none = ONNX__NODE_PROTO__INIT; /* messages name no node */
  Onnx__GraphProto *g = m->g;
  for (size_t k = 0; k < g->n_output; k++) {
    tensor *t = t_find(m, g->output[k]->name);
    m->node = NULL;
    if (t->kind == T_CONST) {
      /* a constant output (a detector's priors, folded from PriorBox's constants): a Parameter
       * layer that does not learn holds it */
      if (t->dt != DT_F)
        return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph output '%s' is a constant of integers: "
                           "a kiln net's outputs are floats", m->src, t->name);
      m->node = &none;
      const char *top = own_blob(m, t->name);
      if (!top) return nomem();
      KILN_TRY(param_layer(m, top, &t->s, t->f));
      t->kind = T_BLOB, t->blob = top, t->cs = t->s;
      continue;
    }
    if (t->kind == T_PAD) return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: graph output '%s' is a Pad's: kiln imports a Pad only before a Conv or AveragePool", m->src, t->name);
    const char *b;
    m->node = &none;
    KILN_TRY(materialize(m, t, &b));
    if (strcmp(b, t->name)) {
      /* an alias (Identity, Dropout, a reshape to the same shape): a Split names it */
      const char *top = own_blob(m, t->name);
      if (!top) return nomem();
      char nm[1024];
      snprintf(nm, sizeof nm, "%s/output", t->name);
      if (begin_layer(m, "Split", nm, 1, &b, 1, &top) < 0) return KILN_ERR_NOMEM;
      end_layer(m);
      t->blob = top;
    }
  }
  return KILN_OK;
}

/* The blobs of the text's layers that no layer reads and that are not outputs: Silence. */
static int silence_unread(imp *m, Caffe__NetParameter *np) {
  kiln_strbuf extra = {0};
  for (size_t i = 0; i < np->n_layer; i++) {
    const Caffe__LayerParameter *l = np->layer[i];
    for (size_t t = 0; t < l->n_top; t++) {
      bool read = false;
      for (size_t j = i + 1; j < np->n_layer && !read; j++)
        for (size_t b = 0; b < np->layer[j]->n_bottom; b++)
          if (!strcmp(np->layer[j]->bottom[b], l->top[t])) read = true;
      for (size_t k = 0; k < m->g->n_output && !read; k++)
        if (!strcmp(m->g->output[k]->name, l->top[t])) read = true;
      if (read) continue;
      const char *nm = unique(m, "silence");
      if (!nm) {
        free(extra.s);
        return nomem();
      }
      kiln_strbuf_printf(&m->text, "layer {\n  name: ");
      put_str(m, nm);
      kiln_strbuf_printf(&m->text, "\n  type: \"Silence\"\n  bottom: ");
      put_str(m, l->top[t]);
      kiln_strbuf_printf(&m->text, "\n}\n");
    }
  }
  free(extra.s);
  return KILN_OK;
}

static int attach_blobs(imp *m, Caffe__NetParameter *np, int64_t *params) {
  *params = 0;
  if ((int)np->n_layer < m->nlayers) return kiln_errorf(KILN_ERR_INTERNAL, "%s: the net text lost layers", m->src);
  for (int i = 0; i < m->nlayers; i++) {
    const ilayer *il = &m->layers[i];
    Caffe__LayerParameter *l = np->layer[i];
    if (!il->nblobs) continue;
    if (strcmp(l->name, il->name)) return kiln_errorf(KILN_ERR_INTERNAL, "%s: layer %d is '%s' in the text, '%s' here", m->src, i, l->name, il->name);
    l->blobs = calloc((size_t)il->nblobs, sizeof *l->blobs);
    if (!l->blobs) return nomem();
    for (int k = 0; k < il->nblobs; k++) {
      Caffe__BlobProto *b = malloc(sizeof *b);
      Caffe__BlobShape *s = b ? malloc(sizeof *s) : NULL;
      const int64_t n = count(&il->bs[k]);
      float *d = s ? malloc(sizeof(float) * (size_t)(n ? n : 1)) : NULL;
      int64_t *dims = d ? malloc(sizeof(int64_t) * (size_t)(il->bs[k].nd + 1)) : NULL;
      if (!dims) {
        free(b), free(s), free(d);
        return nomem();
      }
      caffe__blob_proto__init(b);
      caffe__blob_shape__init(s);
      memcpy(dims, il->bs[k].d, sizeof(int64_t) * (size_t)il->bs[k].nd);
      s->n_dim = (size_t)il->bs[k].nd;
      s->dim = dims;
      b->shape = s;
      memcpy(d, il->bd[k], sizeof(float) * (size_t)n);
      b->n_data = (size_t)n;
      b->data = d;
      l->blobs[l->n_blobs++] = b;
      *params += n;
    }
  }
  return KILN_OK;
}

int kiln_onnx_import(const void *data, size_t len, const char *name,
                     const kiln_onnx_import_options *opt, kiln_onnx_imported *outm) {
  memset(outm, 0, sizeof *outm);
  const kiln_onnx_import_options defaults = {0};
  imp M = {.src = name ? name : "model", .opt = opt ? opt : &defaults};
  imp *m = &M;
  int rc = KILN_OK;
  int *order = NULL;
  ProtobufCMessage *msg = NULL;
  static const Onnx__NodeProto none = ONNX__NODE_PROTO__INIT;
  m->node = &none;
  if (len == 0) {
    rc = kiln_errorf(KILN_ERR_PARSE, "%s: an empty file, not an ONNX model", m->src);
    goto done;
  }
  m->model = (Onnx__ModelProto *)protobuf_c_message_unpack(&onnx__model_proto__descriptor, NULL, len, data);
  if (!m->model) {
    rc = kiln_errorf(KILN_ERR_PARSE, "%s: not an ONNX model (%zu bytes that protobuf cannot read as a ModelProto: truncated or another format)", m->src, len);
    goto done;
  }
  if (!m->model->graph) {
    rc = kiln_errorf(KILN_ERR_PARSE, "%s: not an ONNX model: ModelProto.graph is missing", m->src);
    goto done;
  }
  m->g = m->model->graph;
  if ((rc = opset_of(m))) goto done;
  /* initializers */
  for (size_t k = 0; k < m->g->n_initializer; k++) {
    const Onnx__TensorProto *p = m->g->initializer[k];
    if (!p->name || !*p->name) {
      rc = kiln_errorf(KILN_ERR_INVALID, "%s: initializer %zu has no name", m->src, k);
      goto done;
    }
    if (t_find(m, p->name)) {
      rc = kiln_errorf(KILN_ERR_INVALID, "%s: initializer '%s' is given twice", m->src, p->name);
      goto done;
    }
    const char *nm = set_add(m, &m->reserved, p->name);
    tensor *t = nm ? t_new(m, nm) : NULL;
    if (!t) {
      rc = nomem();
      goto done;
    }
    char what[512];
    snprintf(what, sizeof what, "%s: initializer '%s'", m->src, p->name);
    if ((rc = read_tensor(m, t, p, what))) goto done;
  }
  int ninputs;
  if ((rc = read_inputs(m, m->g, &ninputs))) goto done;
  if (!(order = malloc(sizeof(int) * (m->g->n_node + 1)))) {
    rc = nomem();
    goto done;
  }
  if ((rc = run_graph(m, order))) goto done;
  if ((rc = finish_outputs(m))) goto done;
  if (m->text.failed) {
    rc = nomem();
    goto done;
  }
  /* parse the text once to find what nothing reads, then with the Silence layers for good */
  if ((rc = kiln_text_parse(m->text.s ? m->text.s : "", m->text.len, m->src, &caffe__net_parameter__descriptor, &msg))) {
    kiln_error_context(rc, "%s: the imported net does not read back (a bug in kiln's importer): ", m->src);
    goto done;
  }
  rc = silence_unread(m, (Caffe__NetParameter *)msg);
  protobuf_c_message_free_unpacked(msg, NULL);
  msg = NULL;
  if (rc) goto done;
  kiln_strbuf head = {0};
  kiln_strbuf_printf(&head, "# imported by kiln import onnx from %s (opset %d%s%s)\nname: ", m->src, m->opset,
                     m->model->producer_name && *m->model->producer_name ? ", written by " : "",
                     m->model->producer_name ? m->model->producer_name : "");
  {
    kiln_strbuf keep = m->text;
    m->text = head;
    put_str(m, m->g->name && *m->g->name ? m->g->name : "imported");
    kiln_strbuf_printf(&m->text, "\n%s", keep.s ? keep.s : "");
    free(keep.s);
  }
  if (m->text.failed) {
    rc = nomem();
    goto done;
  }
  if ((rc = kiln_text_parse(m->text.s, m->text.len, m->src, &caffe__net_parameter__descriptor, &msg))) {
    kiln_error_context(rc, "%s: the imported net does not read back (a bug in kiln's importer): ", m->src);
    goto done;
  }
  outm->net = (Caffe__NetParameter *)msg;
  if ((rc = attach_blobs(m, outm->net, &outm->parameters))) goto done;
  outm->prototxt = m->text.s;
  m->text.s = NULL;
  outm->opset = m->opset;
  outm->nodes = (int)m->g->n_node;
  outm->folded = m->folded;
  outm->dropped = m->dropped;
  for (size_t k = 0; k < m->g->n_node; k++) outm->chained += m->fused[k];
  outm->layers = (int)outm->net->n_layer;
  outm->inputs = ninputs;
  outm->outputs = (int)m->g->n_output;
done:
  if (rc) {
    if (outm->net) protobuf_c_message_free_unpacked(&outm->net->base, NULL);
    outm->net = NULL;
  }
  free(order);
  free(m->text.s);
  if (m->model) protobuf_c_message_free_unpacked(&m->model->base, NULL);
  for (size_t i = 0; i < m->nallocs; i++) free(m->allocs[i]);
  free(m->allocs);
  free(m->layer_names.v);
  free(m->blobs.v);
  free(m->reserved.v);
  free(m->tv);
  free(m->hidx);
  free(m->layers);
  return rc;
}

void kiln_onnx_imported_free(kiln_onnx_imported *m) {
  if (!m) return;
  if (m->net) protobuf_c_message_free_unpacked(&m->net->base, NULL);
  free(m->prototxt);
  memset(m, 0, sizeof *m);
}

/* `path`.tmp.PID: where a file waits, written whole, until both are */
static char *waiting_name(const char *path) {
  size_t n = strlen(path) + 32;
  char *t = malloc(n);
  if (t) snprintf(t, n, "%s.tmp.%ld", path, (long)getpid());
  return t;
}

int kiln_onnx_imported_write(const kiln_onnx_imported *m, const char *net_path,
                             const char *weights_path) {
  /* Both files are written whole under waiting names first and renamed only when both are, so
   * a failure leaves the names as they were (no weights without their net, no file replaced) */
  KILN_TRY(kiln_check_output(weights_path, KILN_OUTPUT_RENAMED, NULL, 0));
  KILN_TRY(kiln_check_output(net_path, KILN_OUTPUT_RENAMED, NULL, 0));
  char *tw = waiting_name(weights_path), *tn = waiting_name(net_path);
  int rc = tw && tn ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) rc = kiln_proto_write_binary(tw, &m->net->base);
  if (!rc) rc = kiln_write_file_atomic(tn, m->prototxt, strlen(m->prototxt));
  if (!rc && rename(tw, weights_path) != 0)
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot write: %s", weights_path, strerror(errno));
  if (!rc && rename(tn, net_path) != 0)
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot write: %s (the weights are in %s)", net_path,
                     strerror(errno), weights_path);
  if (rc) {
    if (tw) unlink(tw);
    if (tn) unlink(tn);
  }
  free(tw);
  free(tn);
  return rc;
}
