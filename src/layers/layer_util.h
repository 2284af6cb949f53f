/* Private helpers shared by the layer files: Caffe's defaults for absent *_param blocks, error
 * messages that name the layer, and the table boilerplate. */
#ifndef KILN_LAYER_UTIL_H
#define KILN_LAYER_UTIL_H

#include <string.h>

#include "kiln/data.h"
#include "kiln/layers.h"
#include "kiln/parallel.h"

/* The layer's sub-message, or `defaults` (a file-scope instance made with the type's INIT macro,
 * which carries Caffe's defaults) when the block is absent. */
#define KILN_PARAM_OR(p, defaults) ((p) ? (p) : &(defaults))

#define KILN_LAYER_ERROR(l, code, ...) \
  kiln_error_context(kiln_errorf((code), __VA_ARGS__), "layer '%s' (%s): ", (l)->name, (l)->ops->type)

/* Element-wise layers take any activation layout (kiln_layer_ops.layout_role). */
static inline int kiln_layout_any(const kiln_layer *l) {
  (void)l;
  return KILN_LAYOUT_ROLE_SAME;
}

/* kiln_layer_ops.backward_reads for layers whose backward reads no activation data (it reads
 * gradients and its own buffers only), and for those whose backward reads their first bottom's
 * or their first top's. */
static inline unsigned kiln_reads_none(const kiln_layer *l) {
  (void)l;
  return 0;
}
static inline unsigned kiln_reads_bottom0(const kiln_layer *l) {
  (void)l;
  return KILN_READS_BOTTOM(0);
}
static inline unsigned kiln_reads_top0(const kiln_layer *l) {
  (void)l;
  return KILN_READS_TOP(0);
}

/* Elements of the bottom at axes [from, to). */
static inline int64_t kiln_count(const kiln_blob *b, int from, int to) {
  return kiln_blob_count_range(b, from, to);
}

/* For fuse hooks: whether `next` offers to do `kind` in place on `blob`, and what it offers in
 * *offer (kiln_layer_ops.absorbable). */
static inline bool kiln_layer_absorbable(const kiln_layer *next, kiln_absorb_kind kind,
                                         const kiln_blob *blob, kiln_absorb *offer) {
  return next->ops->absorbable && next->ops->absorbable(next, kind, blob, offer);
}

/* For absorbable hooks: the layer works in place on `blob`, its only bottom, and no loss reads
 * its top. */
static inline bool kiln_in_place_without_loss(const kiln_layer *l, const kiln_blob *blob) {
  return l->nbottom == 1 && l->bottom[0] == blob && l->top[0] == blob && l->loss_weight[0] == 0;
}

/* ---- convolution_param (conv.c) ------------------------------------------------------------ */

/* Kernel, pad, stride and dilation of convolution_param into g (Convolution, Deconvolution,
 * Im2col), with Caffe's forms (one value, one per axis, or the _h and _w fields) and checks;
 * the input must be N x C x H x W with channels on axis 1. The sizes of g (channels, height,
 * width, out_h, out_w) are the caller's to fill. */
struct kiln_conv_geom;
int kiln_conv_param_geom(kiln_layer *l, const Caffe__ConvolutionParameter *p,
                         struct kiln_conv_geom *g);

/* ---- data layers (data_util.c) ------------------------------------------------------------ */

/* The order in which a data layer reads its records: position q of the endless stream is record
 * q mod size of epoch q / size, in the file's order or, with `shuffle`, through a permutation of
 * each epoch drawn from (seed, epoch). The permutations of the two most recent epochs are kept
 * (a batch may span two). Zero-initialise, then set seed, size (> 0, at most 2^32 when
 * shuffled) and shuffle. */
typedef struct kiln_record_order {
  uint64_t seed, size;
  bool shuffle;
  struct {
    uint64_t epoch;
    uint32_t *perm; /* NULL until built */
  } epoch[2];
} kiln_record_order;
int kiln_record_order_index(kiln_record_order *o, uint64_t q, uint64_t *index);
void kiln_record_order_free(kiln_record_order *o);

/* This worker's rank and the number of workers a data layer deals batches to: a TRAIN net's
 * are the layer's shard (a rank outside it is KILN_ERR_INVALID), a TEST net (rank 0's test
 * passes) reads every batch (0 of 1). */
int kiln_data_worker_share(kiln_layer *l, int *rank, int *nworkers);
/* Where the global stream stands once each of `nworkers` workers has taken `taken_k` batches:
 * global batches 0 .. taken_k x nworkers - 1 are done (the same on every rank). */
uint64_t kiln_data_stream_cursor(const kiln_batch_stream *stream, uint64_t taken_k,
                                 int nworkers);

/* A data layer's share of its batch stream when it reads on the net's thread (TextData,
 * LibSVMData): the worker's rank and count are fixed at the first batch (a TRAIN net's are the
 * layer's shard; a TEST net reads every batch), this worker reads global batches rank + k x
 * nworkers, and the cursor is where the global stream stands once every worker has read as many
 * batches as this one. Zero-initialise, then set `stream`. */
typedef struct kiln_batch_share {
  kiln_batch_stream stream;
  int rank, nworkers;
  uint64_t taken_k; /* this worker's batches so far */
  bool started;
} kiln_batch_share;
/* The stream position of this worker's next batch in *first and its record count in *count
 * (KILN_ERR_INVALID for a rank outside the shard); counts the batch as taken. */
int kiln_batch_share_next(kiln_layer *l, kiln_batch_share *s, uint64_t *first, int *count);

uint64_t kiln_batch_share_cursor(const kiln_batch_share *s);
void kiln_batch_share_set_cursor(kiln_batch_share *s, uint64_t cursor);

/* How a data layer decodes encoded images: transform_param's force_color and force_gray
 * (Caffe's for encoded records), data_param's old force_encoded_color being force_color; both
 * at once is an error naming the layer. */
int kiln_data_color_of(kiln_layer *l, const Caffe__TransformationParameter *t, bool force_color,
                       kiln_image_color *out);

/* Tops a data layer fills on the host (element by element, from its records) when they live on
 * a device: kiln_stage_begin points each device top's data at a host buffer of the layer's (kept
 * and grown across batches), kiln_stage_end hands the values to the device through its table and
 * points the tops back. On the host both do nothing. */
enum { KILN_STAGE_MAX_TOPS = 8 };
typedef struct kiln_stage {
  float *host[KILN_STAGE_MAX_TOPS];
  int64_t cap[KILN_STAGE_MAX_TOPS];
  float *device[KILN_STAGE_MAX_TOPS];
  bool active;
} kiln_stage;
int kiln_stage_begin(kiln_layer *l, kiln_stage *s);
int kiln_stage_end(kiln_layer *l, kiln_stage *s);
void kiln_stage_free(kiln_stage *s);

#endif
