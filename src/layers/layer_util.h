/* Private helpers shared by the layer files: Caffe's defaults for absent *_param blocks, error
 * messages that name the layer, and the table boilerplate. */
#ifndef KILN_LAYER_UTIL_H
#define KILN_LAYER_UTIL_H

#include <string.h>

#include "kiln/layers.h"

/* The layer's sub-message, or `defaults` (a file-scope instance made with the type's INIT macro,
 * which carries Caffe's defaults) when the block is absent. */
#define KILN_PARAM_OR(p, defaults) ((p) ? (p) : &(defaults))

#define KILN_LAYER_ERROR(l, code, ...) \
  kiln_error_context(kiln_errorf((code), __VA_ARGS__), "layer '%s' (%s): ", (l)->name, (l)->ops->type)

/* Elements of the bottom at axes [from, to). */
static inline int64_t kiln_count(const kiln_blob *b, int from, int to) {
  return kiln_blob_count_range(b, from, to);
}

#endif
