/* Caffe 1.0's layer types that kiln does not have, with their parameter blocks in Caffe's
 * LayerParameter, so that a Caffe net using one is refused by naming the layer type (and, for a
 * parameter block the schema lacks, the line), not as an unknown field or type. The list shrinks
 * as layers land: tests/test_textformat.c checks that no type here is registered and no block
 * here is in kiln's schema. docs/caffe-layers.md lists every Caffe type and its state. */
#include <string.h>

#include "kiln/proto.h"

static const kiln_caffe_missing_layer missing[] = {
    /* Known only where a Python runtime registers it (kiln_layer_register): the kiln command
     * built with Python, and the kiln Python module. Its block parses everywhere. */
    {"Python", NULL,
     "a Python layer runs where kiln has Python: the kiln command built with Python's "
     "development files (python3-dev, python3-numpy), or the kiln Python module "
     "(docs/python.md)"},
    {"WindowData", "window_data_param",
     "it crops R-CNN detection windows out of images listed in a window file; cut the windows "
     "into image files and list them for an ImageData layer, or convert them to an LMDB of "
     "crops"},
    {NULL, NULL, NULL},
};

const kiln_caffe_missing_layer *kiln_caffe_missing_layers(void) { return missing; }

const kiln_caffe_missing_layer *kiln_caffe_missing_by_type(const char *type) {
  for (const kiln_caffe_missing_layer *m = missing; type && m->type; m++)
    if (!strcmp(m->type, type)) return m;
  return NULL;
}

const kiln_caffe_missing_layer *kiln_caffe_missing_by_field(const char *field, size_t len) {
  for (const kiln_caffe_missing_layer *m = missing; field && m->type; m++)
    if (m->param_field && strlen(m->param_field) == len && !strncmp(m->param_field, field, len))
      return m;
  return NULL;
}
