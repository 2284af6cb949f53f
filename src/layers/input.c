/* Layers whose tops are fed from outside the net: Input (any shapes; deploy nets, kiln time
 * fills them) and MemoryData (data and label, set by the caller). */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

/* ---- Input ----------------------------------------------------------------------------- */

static int input_setup(kiln_layer *l) {
  const Caffe__InputParameter *p = l->lp->input_param;
  size_t nshape = p ? p->n_shape : 0;
  if (nshape != 1 && (int)nshape != l->ntop)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "input_param needs one shape, or one per top (%d tops, %zu shapes)",
                            l->ntop, nshape);
  for (size_t i = 0; i < nshape; i++)
    if (p->shape[i]->n_dim > KILN_MAX_AXES)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "shape %zu has %zu axes (at most %d)", i,
                              p->shape[i]->n_dim, KILN_MAX_AXES);
  return KILN_OK;
}

static int input_reshape(kiln_layer *l) {
  const Caffe__InputParameter *p = l->lp->input_param;
  for (int t = 0; t < l->ntop; t++) {
    const Caffe__BlobShape *s = p->shape[p->n_shape == 1 ? 0 : t];
    int64_t shape[KILN_MAX_AXES];
    for (size_t i = 0; i < s->n_dim; i++) shape[i] = s->dim[i];
    KILN_TRY(kiln_blob_reshape(l->top[t], (int)s->n_dim, shape));
  }
  return KILN_OK;
}

static int nothing(kiln_layer *l) {
  (void)l;
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_input = {
    .type = "Input", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = -1,
    .is_data = true, .fed_by_caller = true, .setup = input_setup, .reshape = input_reshape,
    .forward = nothing, .kernels = KILN_NO_KERNELS,
};

/* ---- MemoryData -------------------------------------------------------------------------- */

/* Caffe's MemoryData is filled by C++ or Python code that links Caffe (Reset, AddDatumVector).
 * kiln's is an Input with Caffe's shapes: the program driving the net writes the data top
 * (batch_size x channels x height x width) and the label top (batch_size) before each forward
 * pass, with the values the net is to see. */
static int memory_data_setup(kiln_layer *l) {
  const Caffe__MemoryDataParameter *p = l->lp->memory_data_param;
  if (!p)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "memory_data_param is required (batch_size, channels, height, width)");
  const struct {
    const char *name;
    uint32_t value;
  } dims[] = {{"batch_size", p->batch_size}, {"channels", p->channels}, {"height", p->height},
              {"width", p->width}};
  for (size_t i = 0; i < 4; i++)
    if (dims[i].value == 0 || dims[i].value > INT32_MAX)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "memory_data_param.%s is %u; it must be positive (at most %d)",
                              dims[i].name, (unsigned)dims[i].value, INT32_MAX);
  if (l->lp->transform_param)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                            "transform_param is not applied by MemoryData in kiln: the program "
                            "feeding the net writes the values the net sees; transform them "
                            "before writing, or read the data through Data or ImageData");
  return KILN_OK;
}

static int memory_data_reshape(kiln_layer *l) {
  const Caffe__MemoryDataParameter *p = l->lp->memory_data_param;
  int64_t shape[4] = {p->batch_size, p->channels, p->height, p->width};
  KILN_TRY(kiln_blob_reshape(l->top[0], 4, shape));
  return kiln_blob_reshape(l->top[1], 1, shape);
}

const kiln_layer_ops kiln_layer_memory_data = {
    .type = "MemoryData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 2, .max_tops = 2,
    .is_data = true, .fed_by_caller = true, .setup = memory_data_setup,
    .reshape = memory_data_reshape, .forward = nothing, .kernels = KILN_NO_KERNELS,
};
