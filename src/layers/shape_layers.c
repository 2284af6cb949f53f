/* Layers that move data without arithmetic: Input and MemoryData (blobs fed from outside),
 * Flatten, Split (the net inserts it where one blob feeds several layers, so their gradients add
 * up). */
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

/* ---- Flatten --------------------------------------------------------------------------- */

static const Caffe__FlattenParameter flatten_defaults = CAFFE__FLATTEN_PARAMETER__INIT;

static int flatten_reshape(kiln_layer *l) {
  const Caffe__FlattenParameter *p = KILN_PARAM_OR(l->lp->flatten_param, flatten_defaults);
  const kiln_blob *x = l->bottom[0];
  int a, e;
  KILN_TRY(kiln_blob_canonical_axis(x, p->axis, &a));
  KILN_TRY(kiln_blob_canonical_axis(x, p->end_axis, &e));
  if (e < a) return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "end_axis before axis");
  int64_t shape[KILN_MAX_AXES];
  int n = 0;
  for (int i = 0; i < a; i++) shape[n++] = x->shape[i];
  shape[n++] = kiln_count(x, a, e + 1);
  for (int i = e + 1; i < x->naxes; i++) shape[n++] = x->shape[i];
  return kiln_blob_reshape(l->top[0], n, shape);
}

static int copy_forward(kiln_layer *l) {
  return KILN_OP(l, copy, l->top[0]->data, l->bottom[0]->data, l->bottom[0]->count);
}

static int copy_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  return KILN_OP(l, copy, l->bottom[0]->diff, l->top[0]->diff, l->bottom[0]->count);
}

const kiln_layer_ops kiln_layer_flatten = {
    .type = "Flatten", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = 1,
    .reshape = flatten_reshape, .forward = copy_forward, .backward = copy_backward,
    .backward_reads = kiln_reads_none, .kernels = KILN_KERNELS(KILN_OP_copy),
};

/* ---- Split ----------------------------------------------------------------------------- */

static int split_reshape(kiln_layer *l) {
  for (int t = 0; t < l->ntop; t++) KILN_TRY(kiln_blob_reshape_like(l->top[t], l->bottom[0]));
  return KILN_OK;
}

static int split_forward(kiln_layer *l) {
  const int64_t n = l->bottom[0]->count;
  for (int t = 0; t < l->ntop; t++)
    KILN_TRY(KILN_OP(l, copy, l->top[t]->data, l->bottom[0]->data, n));
  return KILN_OK;
}

/* dx = sum of the tops' diffs, in one pass for the usual two tops. */
static int split_backward(kiln_layer *l) {
  if (!l->propagate_down[0]) return KILN_OK;
  float *dx = l->bottom[0]->diff;
  const int64_t n = l->bottom[0]->count;
  const float *d0 = l->top[0]->diff;
  if (l->ntop > 1) KILN_TRY(KILN_OP(l, add, dx, d0, l->top[1]->diff, n));
  else KILN_TRY(KILN_OP(l, copy, dx, d0, n));
  for (int t = 2; t < l->ntop; t++) KILN_TRY(KILN_OP(l, acc, dx, l->top[t]->diff, n));
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_split = {
    .type = "Split", .min_bottoms = 1, .max_bottoms = 1, .min_tops = 1, .max_tops = -1,
    .passes_through = true, .reshape = split_reshape, .forward = split_forward,
    .backward = split_backward, .layout_role = kiln_layout_any, .backward_reads = kiln_reads_none,
    .kernels = KILN_KERNELS(KILN_OP_copy, KILN_OP_add, KILN_OP_acc),
};
