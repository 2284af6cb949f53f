/* The layer registry: Caffe type string -> function table. Adding a layer means its file, one
 * line here, and its tests. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "kiln/layers.h"

extern const kiln_layer_ops kiln_layer_input, kiln_layer_data, kiln_layer_convolution,
    kiln_layer_pooling, kiln_layer_inner_product, kiln_layer_relu, kiln_layer_sigmoid,
    kiln_layer_tanh, kiln_layer_dropout, kiln_layer_softmax, kiln_layer_softmax_loss,
    kiln_layer_accuracy, kiln_layer_flatten, kiln_layer_split;
extern const kiln_layer_ops kiln_layer_batch_norm, kiln_layer_scale, kiln_layer_bias,
    kiln_layer_eltwise, kiln_layer_concat, kiln_layer_slice, kiln_layer_reshape;
extern const kiln_layer_ops kiln_layer_lrn, kiln_layer_power, kiln_layer_absval, kiln_layer_elu,
    kiln_layer_prelu, kiln_layer_argmax, kiln_layer_euclidean_loss, kiln_layer_sigmoid_ce_loss,
    kiln_layer_dummy_data;

static const kiln_layer_ops *const registry[] = {
    &kiln_layer_input,    &kiln_layer_data,          &kiln_layer_convolution,
    &kiln_layer_pooling,  &kiln_layer_inner_product, &kiln_layer_relu,
    &kiln_layer_sigmoid,  &kiln_layer_tanh,          &kiln_layer_dropout,
    &kiln_layer_softmax,  &kiln_layer_softmax_loss,  &kiln_layer_accuracy,
    &kiln_layer_flatten,  &kiln_layer_split,
    &kiln_layer_batch_norm, &kiln_layer_scale, &kiln_layer_bias, &kiln_layer_eltwise,
    &kiln_layer_concat, &kiln_layer_slice, &kiln_layer_reshape,
    &kiln_layer_lrn,      &kiln_layer_power,         &kiln_layer_absval,
    &kiln_layer_elu,      &kiln_layer_prelu,         &kiln_layer_argmax,
    &kiln_layer_euclidean_loss, &kiln_layer_sigmoid_ce_loss, &kiln_layer_dummy_data,
};
#define NREGISTRY (sizeof registry / sizeof registry[0])

const kiln_layer_ops *kiln_layer_find(const char *type) {
  if (!type) return NULL;
  for (size_t i = 0; i < NREGISTRY; i++)
    if (strcmp(registry[i]->type, type) == 0) return registry[i];
  return NULL;
}

const char *const *kiln_layer_type_names(void) {
  static const char *names[NREGISTRY + 1];
  for (size_t i = 0; i < NREGISTRY; i++) names[i] = registry[i]->type;
  names[NREGISTRY] = NULL;
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
  l->buffer[l->nbuffer++] = b;
  return b;
}
