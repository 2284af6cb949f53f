/* What a net or solver written for kiln holds that Caffe 1.0 cannot read, and the same file
 * rewritten without it (`kiln upgrade --caffe IN OUT`).
 *
 * kiln's schema (kiln.proto) is Caffe's with fields added: kiln's own (numbers from 1000) and a
 * few that BVLC/caffe added after its 1.0 release (April 2017), which kiln took from Caffe's
 * later tree. Protobuf's binary reader skips fields it does not know, so Caffe reads kiln's
 * binary files; its text reader (Caffe's ReadProtoFromTextFile, OpenCV's readNetFromCaffe)
 * refuses them ("DataParameter has no field named shuffle"). A "field Caffe 1.0 lacks" is one of
 * a message Caffe 1.0 has whose number (and name) is not in Caffe 1.0's src/caffe/proto/caffe.proto;
 * whole parameter messages of kiln's own layers hang off such fields of LayerParameter. The table
 * below lists every one; tests/test_caffe_compat.c walks kiln's descriptors against Caffe 1.0's
 * field numbers message by message, so a field added to kiln.proto without a row here (or in
 * Caffe 1.0's list) fails it.
 *
 * Layer types likewise: Caffe 1.0's registry (every REGISTER_LAYER_CLASS and
 * REGISTER_LAYER_CREATOR of its src/caffe/layers and layer_factory.cpp) is written out here; a
 * net with a type outside it is refused by name, since no Caffe 1.0 net can stand for it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/proto.h"

#define KILN_ONLY "kiln only"
#define CAFFE_LATER "Caffe's after 1.0"
#define SSD "the SSD fork's"

static const kiln_caffe_field fields[] = {
    {&caffe__solver_parameter__descriptor, "weights", 42, KILN_CAFFE_DROP, CAFFE_LATER,
     "Caffe 1.0 takes the weights to start from on its command line (-weights)"},
    {&caffe__solver_parameter__descriptor, "sync", 1000, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's data-parallel settings"},
    {&caffe__solver_parameter__descriptor, "divergence_factor", 1001, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's divergence stop"},
    {&caffe__solver_parameter__descriptor, "divergence_iters", 1002, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's divergence stop"},
    {&caffe__solver_parameter__descriptor, "precision", 1003, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's bf16 mixed precision (Caffe 1.0 trains in fp32)"},
    {&caffe__solver_parameter__descriptor, "eval_type", 1004, KILN_CAFFE_DROP_DEFAULT, SSD,
     "Caffe 1.0's tests report classification figures only"},
    {&caffe__solver_parameter__descriptor, "ap_version", 1005, KILN_CAFFE_DROP, SSD,
     "how a detection test averages precision; Caffe 1.0 has no detection tests"},
    {&caffe__solver_parameter__descriptor, "show_per_class_result", 1006, KILN_CAFFE_DROP, SSD,
     "per-class average precision of detection tests"},
    {&caffe__solver_state__descriptor, "kiln_data_cursor", 1000, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_rng_state", 1001, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_loss_history", 1002, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_worker_rng_state", 1003, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_workers", 1004, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_test_data_cursor", 1005, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_first_loss", 1006, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__solver_state__descriptor, "kiln_divergence_run", 1007, KILN_CAFFE_DROP, KILN_ONLY,
     "kiln's resume state"},
    {&caffe__layer_parameter__descriptor, "swish_param", 147, KILN_CAFFE_DROP, CAFFE_LATER,
     "the parameters of Swish, a layer type Caffe added after 1.0"},
    {&caffe__layer_parameter__descriptor, "text_data_param", 1000, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's TextData layer"},
    {&caffe__layer_parameter__descriptor, "gelu_param", 1001, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's GELU layer"},
    {&caffe__layer_parameter__descriptor, "layer_norm_param", 1002, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's LayerNorm layer"},
    {&caffe__layer_parameter__descriptor, "positional_encoding_param", 1003, KILN_CAFFE_DROP,
     KILN_ONLY, "the parameters of kiln's PositionalEncoding layer"},
    {&caffe__layer_parameter__descriptor, "multihead_attention_param", 1004, KILN_CAFFE_DROP,
     KILN_ONLY, "the parameters of kiln's MultiHeadAttention layer"},
    {&caffe__layer_parameter__descriptor, "matmul_param", 1013, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's MatMul layer"},
    {&caffe__layer_parameter__descriptor, "sequence_pool_param", 1010, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's SequencePool layer"},
    {&caffe__layer_parameter__descriptor, "f1_param", 1011, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's F1 layer"},
    {&caffe__layer_parameter__descriptor, "libsvm_data_param", 1012, KILN_CAFFE_DROP, KILN_ONLY,
     "the parameters of kiln's LibSVMData layer"},
    {&caffe__layer_parameter__descriptor, "annotated_data_param", 200, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's AnnotatedData layer"},
    {&caffe__layer_parameter__descriptor, "multibox_loss_param", 201, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's MultiBoxLoss layer"},
    {&caffe__layer_parameter__descriptor, "permute_param", 202, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's Permute layer"},
    {&caffe__layer_parameter__descriptor, "prior_box_param", 203, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's PriorBox layer"},
    {&caffe__layer_parameter__descriptor, "detection_output_param", 204, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's DetectionOutput layer"},
    {&caffe__layer_parameter__descriptor, "detection_evaluate_param", 205, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's DetectionEvaluate layer"},
    {&caffe__layer_parameter__descriptor, "norm_param", 206, KILN_CAFFE_DROP, SSD,
     "the parameters of the SSD fork's Normalize layer"},
    {&caffe__transformation_parameter__descriptor, "resize_param", 8, KILN_CAFFE_DROP, SSD,
     "AnnotatedData's resizing to the net's input"},
    {&caffe__transformation_parameter__descriptor, "noise_param", 9, KILN_CAFFE_DROP, SSD,
     "AnnotatedData's noise policies"},
    {&caffe__transformation_parameter__descriptor, "emit_constraint", 10, KILN_CAFFE_DROP, SSD,
     "AnnotatedData's which boxes survive a crop"},
    {&caffe__transformation_parameter__descriptor, "distort_param", 13, KILN_CAFFE_DROP, SSD,
     "AnnotatedData's photometric distortion"},
    {&caffe__transformation_parameter__descriptor, "expand_param", 14, KILN_CAFFE_DROP, SSD,
     "AnnotatedData's zooming out"},
    {&caffe__data_parameter__descriptor, "source", 1, KILN_CAFFE_ONE_VALUE,
     "repeated in kiln, singular in Caffe", "kiln mixes several databases; Caffe 1.0 reads one"},
    {&caffe__data_parameter__descriptor, "shuffle", 1000, KILN_CAFFE_DROP, KILN_ONLY,
     "Caffe reads the records in key order"},
    {&caffe__data_parameter__descriptor, "last_batch", 1001, KILN_CAFFE_DROP, KILN_ONLY,
     "Caffe's last batch of an epoch runs on into the next"},
    {&caffe__data_parameter__descriptor, "source_weight", 1002, KILN_CAFFE_DROP, KILN_ONLY,
     "the weights of several sources; Caffe reads one"},
    {&caffe__hdf5_data_parameter__descriptor, "prefetch", 1000, KILN_CAFFE_DROP, KILN_ONLY,
     "Caffe's HDF5Data reads each batch on the net's thread"},
    {&caffe__pooling_parameter__descriptor, "round_mode", 13, KILN_CAFFE_DROP_DEFAULT, CAFFE_LATER,
     "Caffe 1.0 always rounds the pooled size up (CEIL)"},
    {&caffe__recurrent_parameter__descriptor, "bidirectional", 1000, KILN_CAFFE_DROP_DEFAULT,
     KILN_ONLY, "Caffe 1.0's RNN and LSTM run in one direction, with other output and weight "
     "shapes"},
    {NULL, NULL, 0, KILN_CAFFE_DROP, NULL, NULL},
};

const kiln_caffe_field *kiln_caffe_fields(void) { return fields; }

const kiln_caffe_field *kiln_caffe_field_find(const ProtobufCMessageDescriptor *message,
                                              unsigned number) {
  for (const kiln_caffe_field *f = fields; f->message; f++)
    if (f->message == message && f->number == number) return f;
  return NULL;
}

/* Caffe 1.0's layer registry, in its own order (alphabetical by file). */
static const char *const caffe10_types[] = {
    "AbsVal", "Accuracy", "ArgMax", "BatchNorm", "BatchReindex", "Bias", "BNLL", "Concat",
    "ContrastiveLoss", "Convolution", "Crop", "Data", "Deconvolution", "Dropout", "DummyData",
    "Eltwise", "ELU", "Embed", "EuclideanLoss", "Exp", "Filter", "Flatten", "HDF5Data",
    "HDF5Output", "HingeLoss", "Im2col", "ImageData", "InfogainLoss", "InnerProduct", "Input",
    "Log", "LRN", "LSTM", "LSTMUnit", "MemoryData", "MultinomialLogisticLoss", "MVN", "Parameter",
    "Pooling", "Power", "PReLU", "Python", "Reduction", "ReLU", "Reshape", "RNN", "Scale",
    "Sigmoid", "SigmoidCrossEntropyLoss", "Silence", "Slice", "Softmax", "SoftmaxWithLoss",
    "Split", "SPP", "TanH", "Threshold", "Tile", "WindowData", NULL,
};

const char *const *kiln_caffe10_layer_types(void) { return caffe10_types; }

bool kiln_caffe10_has_layer_type(const char *type) {
  for (const char *const *t = caffe10_types; type && *t; t++)
    if (!strcmp(*t, type)) return true;
  return false;
}

static const kiln_caffe_extra_layer extra_layers[] = {
    {"TextData", KILN_ONLY}, {"LibSVMData", KILN_ONLY}, {"F1", KILN_ONLY},
    {"SequencePool", KILN_ONLY}, {"GRU", KILN_ONLY}, {"GELU", KILN_ONLY},
    {"AnnotatedData", SSD},
    {"LayerNorm", KILN_ONLY}, {"PositionalEncoding", KILN_ONLY},
    {"MultiHeadAttention", KILN_ONLY}, {"MatMul", KILN_ONLY}, {"Swish", CAFFE_LATER},
    {"Normalize", SSD},
    {"Permute", SSD}, {"PriorBox", SSD}, {"MultiBoxLoss", SSD}, {"DetectionOutput", SSD},
    {"DetectionEvaluate", SSD}, {NULL, NULL},
};

const kiln_caffe_extra_layer *kiln_caffe_extra_layers(void) { return extra_layers; }

const kiln_caffe_extra_layer *kiln_caffe_extra_layer_find(const char *type) {
  for (const kiln_caffe_extra_layer *l = extra_layers; type && l->type; l++)
    if (!strcmp(l->type, type)) return l;
  return NULL;
}

void kiln_caffe_drops_free(kiln_caffe_drops *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n; i++) {
    free(d->v[i].where);
    free(d->v[i].field);
  }
  free(d->v);
  d->v = NULL;
  d->n = 0;
}

/* ---- walking a message -------------------------------------------------------------------- */

static size_t *count_of(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  return (size_t *)((char *)m + f->quantifier_offset);
}

static void *member(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  return (char *)m + f->offset;
}

/* How many values a field holds: a repeated field's count, or 0 / 1 for a singular one (set: a
 * has_ flag, or a string or message other than NULL and the static default). */
static size_t values(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  if (f->label == PROTOBUF_C_LABEL_REPEATED) return *count_of(m, f);
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) {
    const void *p = *(void **)member(m, f);
    return p != NULL && p != f->default_value;
  }
  if (f->label == PROTOBUF_C_LABEL_REQUIRED) return 1;
  return f->quantifier_offset && *(protobuf_c_boolean *)((char *)m + f->quantifier_offset);
}

/* A singular scalar at its schema default (0 where the schema gives none). */
static bool at_default(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const size_t n = kiln_proto_value_size(f->type);
  const unsigned char zero[16] = {0};
  return !memcmp(member(m, f), f->default_value ? f->default_value : zero, n);
}

static void free_value(ProtobufCType t, void *p, const void *default_value) {
  if (t == PROTOBUF_C_TYPE_MESSAGE) {
    ProtobufCMessage *sub = *(ProtobufCMessage **)p;
    if (sub) protobuf_c_message_free_unpacked(sub, NULL);
  } else if (t == PROTOBUF_C_TYPE_STRING) {
    char *s = *(char **)p;
    if (s && s != default_value) free(s);
  } else if (t == PROTOBUF_C_TYPE_BYTES) {
    ProtobufCBinaryData *b = p;
    const ProtobufCBinaryData *d = default_value;
    if (b->data && (!d || b->data != d->data)) free(b->data);
  }
}

/* Clears a field as if the file had never set it (the allocator is the system's, as
 * protobuf_c_message_free_unpacked(m, NULL) expects). */
static void clear_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  void *p = member(m, f);
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    size_t *n = count_of(m, f);
    char *arr = *(char **)p;
    for (size_t i = 0; i < *n; i++) free_value(f->type, arr + i * kiln_proto_value_size(f->type), NULL);
    free(arr);
    *(void **)p = NULL;
    *n = 0;
    return;
  }
  free_value(f->type, p, f->default_value);
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) {
    *(const void **)p = f->default_value;
    return;
  }
  if (f->default_value) memcpy(p, f->default_value, kiln_proto_value_size(f->type));
  else memset(p, 0, kiln_proto_value_size(f->type));
  if (f->quantifier_offset) *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 0;
}

typedef struct {
  const char *source;
  bool strip;              /* false: check only (nothing changes); true: drop */
  kiln_caffe_drops *drops; /* strip: what was dropped */
  int nrefused;            /* check: layers and fields Caffe 1.0 cannot take */
  char first[1024];        /* check: the first of them */
  bool nomem;
} walk_ctx;

static void refuse(walk_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(walk_ctx *c, const char *fmt, ...) {
  if (!c->nrefused++) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->first, sizeof c->first, fmt, ap);
    va_end(ap);
  }
}

/* "A: B", or whichever is not empty. */
static char *join(const char *a, const char *sep, const char *b) {
  kiln_strbuf s = {0};
  kiln_strbuf_printf(&s, "%s%s%s", a, *a && *b ? sep : "", b);
  if (s.failed) {
    free(s.s);
    return NULL;
  }
  return s.s;
}

static void record(walk_ctx *c, const char *where, const char *path,
                   const ProtobufCFieldDescriptor *f, const kiln_caffe_field *e) {
  kiln_caffe_drop *v = realloc(c->drops->v, (c->drops->n + 1) * sizeof *v);
  if (!v) {
    c->nomem = true;
    return;
  }
  c->drops->v = v;
  kiln_caffe_drop *d = &v[c->drops->n];
  d->where = kiln_strdup(where);
  d->field = join(path, "", f->name);
  d->entry = e;
  if (!d->where || !d->field) {
    free(d->where);
    free(d->field);
    c->nomem = true;
    return;
  }
  c->drops->n++;
}

static const char *value_text(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, char *buf,
                              size_t n) {
  const void *p = member(m, f);
  if (f->type == PROTOBUF_C_TYPE_BOOL) return *(const protobuf_c_boolean *)p ? "true" : "false";
  if (f->type == PROTOBUF_C_TYPE_ENUM) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(f->descriptor,
                                                                        *(const int *)p);
    if (v) return v->name;
    snprintf(buf, n, "%d", *(const int *)p);
    return buf;
  }
  return "a value other than its default";
}

static void walk(walk_ctx *c, ProtobufCMessage *m, const char *where, const char *path);

static void check_layer_type(walk_ctx *c, const Caffe__LayerParameter *lp, const char *where) {
  const char *type = lp->type;
  if (!type || !*type || kiln_caffe10_has_layer_type(type)) return;
  const kiln_caffe_extra_layer *x = kiln_caffe_extra_layer_find(type);
  if (x && !strcmp(x->origin, KILN_ONLY))
    refuse(c, "%s: %s: type '%s' is kiln's own; Caffe 1.0 has no such layer type", c->source,
           where, type);
  else if (x)
    refuse(c, "%s: %s: type '%s' was added to Caffe after 1.0; Caffe 1.0 has no such layer type",
           c->source, where, type);
  else
    refuse(c, "%s: %s: type '%s' is not a layer type of Caffe 1.0", c->source, where, type);
}

/* Enters one value of a message field: a layer or a nested net starts a new `where`. */
static void walk_child(walk_ctx *c, ProtobufCMessage *sub, const ProtobufCFieldDescriptor *f,
                       size_t index, bool repeated, const char *where, const char *path) {
  char name[512];
  if (repeated) snprintf(name, sizeof name, "%s[%zu]", f->name, index);
  else snprintf(name, sizeof name, "%s", f->name);
  char *w = NULL, *p = NULL;
  if (sub->descriptor == &caffe__layer_parameter__descriptor) {
    const Caffe__LayerParameter *lp = (const Caffe__LayerParameter *)sub;
    char layer[512];
    if (lp->name && *lp->name) snprintf(layer, sizeof layer, "layer '%s'", lp->name);
    else snprintf(layer, sizeof layer, "layer %zu (unnamed)", index);
    char *prefix = join(where, "", path);
    w = prefix ? join(prefix, ": ", layer) : NULL;
    free(prefix);
    p = kiln_strdup("");
    if (w && !c->strip) check_layer_type(c, lp, w);
  } else if (sub->descriptor == &caffe__net_parameter__descriptor) {
    char *prefix = join(path, "", name);
    w = prefix ? join(where, ": ", prefix) : NULL;
    free(prefix);
    p = kiln_strdup("");
  } else {
    w = kiln_strdup(where);
    char *q = join(path, "", name);
    p = q ? join(q, "", ".") : NULL;
    free(q);
  }
  if (w && p) walk(c, sub, w, p);
  else c->nomem = true;
  free(w);
  free(p);
}

static void walk(walk_ctx *c, ProtobufCMessage *m, const char *where, const char *path) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned k = 0; k < d->n_fields && !c->nomem; k++) {
    const ProtobufCFieldDescriptor *f = &d->fields[k];
    const size_t n = values(m, f);
    if (!n) continue;
    const kiln_caffe_field *e = kiln_caffe_field_find(d, f->id);
    if (e && !c->strip) {
      char buf[32];
      const char *sep = *where ? ": " : "";
      if (e->rule == KILN_CAFFE_ONE_VALUE && n > 1)
        refuse(c, "%s: %s%s%s%s has %zu values (%s): %s", c->source, where, sep, path, f->name, n,
               e->origin, e->note);
      else if (e->rule == KILN_CAFFE_DROP_DEFAULT && !at_default(m, f))
        refuse(c, "%s: %s%s%s%s: %s (%s) has no Caffe 1.0 equivalent: %s", c->source, where, sep,
               path, f->name, value_text(m, f, buf, sizeof buf), e->origin, e->note);
    }
    if (e && e->rule != KILN_CAFFE_ONE_VALUE) {
      if (c->strip) {
        record(c, where, path, f, e);
        clear_field(m, f);
      }
      continue;
    }
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      ProtobufCMessage **arr = *(ProtobufCMessage ***)member(m, f);
      for (size_t i = 0; i < n && !c->nomem; i++) walk_child(c, arr[i], f, i, true, where, path);
    } else {
      walk_child(c, *(ProtobufCMessage **)member(m, f), f, 0, false, where, path);
    }
  }
}

/* Checks the whole message first, so that a refusal leaves it as it was. */
static int to_caffe10(ProtobufCMessage *m, const char *source, kiln_caffe_drops *dropped) {
  dropped->v = NULL;
  dropped->n = 0;
  walk_ctx c = {.source = source, .drops = dropped};
  walk(&c, m, "", "");
  if (c.nomem) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", source);
  if (c.nrefused == 1) return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s", c.first);
  if (c.nrefused > 1)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s (and %d more layers or fields Caffe 1.0 cannot "
                       "take)", c.first, c.nrefused - 1);
  c.strip = true;
  walk(&c, m, "", "");
  if (c.nomem) {
    kiln_caffe_drops_free(dropped);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", source);
  }
  return KILN_OK;
}

int kiln_net_param_to_caffe10(Caffe__NetParameter *np, const char *source,
                              kiln_caffe_drops *dropped) {
  return to_caffe10(&np->base, source, dropped);
}

int kiln_solver_param_to_caffe10(Caffe__SolverParameter *sp, const char *source,
                                 kiln_caffe_drops *dropped) {
  return to_caffe10(&sp->base, source, dropped);
}
