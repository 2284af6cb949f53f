/* The layer registry: Caffe type string -> function table, built from layer_list.h (adding a
 * layer means its file, its line there, and its tests). */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "kiln/layers.h"

#define KILN_LAYER(type, ops) extern const kiln_layer_ops ops;
#include "layer_list.h"
#undef KILN_LAYER

/* Looked up by the list's string: the coverage test checks that it is the table's own .type. */
static const struct {
  const char *type;
  const kiln_layer_ops *ops;
} registry[] = {
#define KILN_LAYER(type, ops) {type, &ops},
#include "layer_list.h"
#undef KILN_LAYER
};
#define NREGISTRY (sizeof registry / sizeof registry[0])

/* Types registered at run time (kiln_layer_register). */
enum { MAX_REGISTERED = 16 };
static const kiln_layer_ops *registered[MAX_REGISTERED];
static int nregistered;

static const kiln_layer_ops *find_builtin(const char *type) {
  for (size_t i = 0; i < NREGISTRY; i++)
    if (strcmp(registry[i].type, type) == 0) return registry[i].ops;
  return NULL;
}

const kiln_layer_ops *kiln_layer_find(const char *type) {
  if (!type) return NULL;
  const kiln_layer_ops *ops = find_builtin(type);
  for (int i = 0; !ops && i < nregistered; i++)
    if (strcmp(registered[i]->type, type) == 0) ops = registered[i];
  return ops;
}

int kiln_layer_register(const kiln_layer_ops *ops) {
  if (!ops || !ops->type || !ops->reshape || !ops->forward)
    return kiln_errorf(KILN_ERR_INVALID, "kiln_layer_register: a table without type, reshape or "
                                         "forward");
  if (find_builtin(ops->type))
    return kiln_errorf(KILN_ERR_INVALID, "kiln_layer_register: '%s' is a built-in layer type",
                       ops->type);
  for (int i = 0; i < nregistered; i++)
    if (strcmp(registered[i]->type, ops->type) == 0) {
      registered[i] = ops;
      return KILN_OK;
    }
  if (nregistered == MAX_REGISTERED)
    return kiln_errorf(KILN_ERR_INVALID, "kiln_layer_register: more than %d types",
                       MAX_REGISTERED);
  registered[nregistered++] = ops;
  return KILN_OK;
}

const char *const *kiln_layer_type_names(void) {
  static const char *const names[] = {
#define KILN_LAYER(type, ops) type,
#include "layer_list.h"
#undef KILN_LAYER
      NULL,
  };
  return names;
}

kiln_blob *kiln_layer_add_param(kiln_layer *l, int naxes, const int64_t *shape,
                                const Caffe__FillerParameter *filler, float default_value) {
  if (l->nparam >= KILN_MAX_LAYER_PARAMS) return NULL;
  char name[256];
  snprintf(name, sizeof name, "%s.param%d", l->name, l->nparam);
  kiln_blob *b = kiln_blob_new(name);
  if (!b) return NULL;
  b->owned = false; /* storage is a view the net assigns */
  b->device = l->backend ? l->backend->device : NULL;
  if (kiln_blob_reshape(b, naxes, shape) != KILN_OK) {
    kiln_blob_free(b);
    return NULL;
  }
  l->param[l->nparam] = b;
  l->param_filler[l->nparam] = filler;
  l->param_default_value[l->nparam] = default_value;
  l->nparam++;
  return b;
}

kiln_blob *kiln_layer_add_buffer(kiln_layer *l, const char *what) {
  if (l->nbuffer >= KILN_MAX_LAYER_BUFFERS) return NULL;
  char name[256];
  snprintf(name, sizeof name, "%s.%s", l->name, what);
  kiln_blob *b = kiln_blob_new(name);
  if (!b) return NULL;
  b->defer_alloc = true;
  b->no_diff = true;
  b->device = l->backend ? l->backend->device : NULL; /* on the device of its kernels */
  l->buffer[l->nbuffer++] = b;
  return b;
}
