/* kiln layers: the layer contract (Caffe's setup / reshape / forward / backward as a const table
 * of functions per type) and the registry that maps Caffe's type strings to those tables.
 *
 * Gradient convention: backward OVERWRITES the diff of each bottom whose propagate_down is set
 * (so in-place layers work, and fan-out is handled by Split layers that the net inserts) and
 * ACCUMULATES (+=) into parameter gradients (so iter_size can sum several passes). */
#ifndef KILN_LAYERS_H
#define KILN_LAYERS_H

#include "kiln/backend.h"
#include "kiln/config.h"
#include "kiln/core.h"
#include "kiln/proto.h"

#define KILN_MAX_LAYER_PARAMS 12 /* a bidirectional RNN with a static input has 2 x 6 */
#define KILN_MAX_LAYER_BUFFERS 4

typedef struct kiln_layer kiln_layer;

/* kiln_layer_ops.layout_role flags. */
enum {
  KILN_LAYOUT_ROLE_NONE = 0,   /* plain bottoms and tops only */
  KILN_LAYOUT_ROLE_SAME = 1,   /* any layout, the same for all its bottoms and tops */
  KILN_LAYOUT_ROLE_BOTTOM = 2, /* its (single) bottom in either layout, whatever the top's */
  KILN_LAYOUT_ROLE_TOP = 4,    /* its (single) top in either layout, whatever the bottom's */
};

/* What a layer offers to be absorbed into the layer before it (kiln_layer_ops.absorbable). */
typedef enum {
  /* y = gamma[c] * x + beta[c] per channel c of an (N, C, ...) blob, in place (Scale) */
  KILN_ABSORB_CHANNEL_AFFINE = 1,
  /* y = x > 0 ? x : slope * x in place, with slope >= 0, so the output's sign is the input's
   * (ReLU) */
  KILN_ABSORB_RELU = 2,
} kiln_absorb_kind;

typedef struct kiln_absorb {
  /* CHANNEL_AFFINE: the layer's learnable gamma and beta (C values each). The absorbing layer
   * reads their data and accumulates into their diffs, as the layer's own backward would. */
  kiln_blob *gamma, *beta;
  float slope; /* RELU: the negative slope */
} kiln_absorb;

typedef struct kiln_layer_ops {
  const char *type;
  int min_bottoms, max_bottoms; /* -1: no upper bound */
  int min_tops, max_tops;
  bool is_loss;                 /* loss_weight defaults to 1 on the first top */
  bool is_data;                 /* produces data; nothing flows back into it */
  /* Bottoms that never take a gradient, bit i for bottom i (Caffe's AllowForceBackward false: a
   * recurrent layer's sequence indicators, an embedding's indices): force_backward leaves them
   * alone, and the layer's backward refuses a propagate_down set on them. A loss layer's labels
   * (bottoms after the first) are left alone without it. */
  unsigned no_gradient_bottoms;
  /* Its tops hold its (single) bottom's values unchanged (Split): the net lets each top read the
   * bottom's data instead of holding a copy, unless another layer writes that top, and a saved
   * .caffemodel leaves the layer out (it has nothing to save, and a net that loads the file
   * inserts its own where it fans a blob out). */
  bool passes_through;
  /* Its tops are filled by whoever runs the net, not by the layer (Input): tools that run a net
   * on made-up data (kiln time) fill them. */
  bool fed_by_caller;
  /* May run in place (top i the same blob as bottom i): its forward and backward stay correct
   * when they overwrite their input (element-wise layers that keep what backward needs). The net
   * refuses a prototxt that puts any other layer in place. */
  bool in_place;
  /* Its bottom 0 may be a sparse blob (kiln_blob.csr: CSR rows, no dense data; InnerProduct).
   * The net refuses a sparse blob as the bottom of any other layer, naming that layer, and never
   * asks a gradient of one (the layer's allows_gradient says no). */
  bool sparse_bottom;
  /* The ops its forward and backward call through kiln_layer.backend (KILN_KERNELS(...)):
   * the net refuses the layer on a backend that lacks one, naming both. NULL: the layer's
   * arithmetic is still its own host code, so it runs only on a host backend. */
  const int *kernels;
  /* Check the layer's parameters and bottoms' axes, declare parameter blobs (add_param). */
  int (*setup)(kiln_layer *l);
  /* Size the tops (and internal buffers, workspace) from the bottoms; set l->flops. */
  int (*reshape)(kiln_layer *l);
  int (*forward)(kiln_layer *l);
  int (*backward)(kiln_layer *l); /* NULL: no gradient (the net refuses to ask it for one) */
  /* Whether bottom `b` takes a gradient at all (Caffe's AllowForceBackward): force_backward, and
   * tools that run every backward pass (kiln time), ask none of a bottom it refuses. NULL: every
   * bottom but a loss layer's labels (its bottoms after the first); kiln_layer_allows_gradient. */
  bool (*allows_gradient)(const kiln_layer *l, int b);
  void (*destroy)(kiln_layer *l);
  /* Which activation layouts the layer reads and writes, as KILN_LAYOUT_ROLE_* flags (asked
   * after its first reshape); NULL: plain only. SAME: element-wise and per-channel layers;
   * BOTTOM | TOP: convolution on oneDNN, which reorders inside. The net sets the blobs'
   * layout, then reshapes every layer again. */
  int (*layout_role)(const kiln_layer *l);
  /* The channel block of the blocked layout the layer's route reads and writes on the sides its
   * layout_role marks BOTTOM or TOP (16: oneDNN's nChw16c); 0 or NULL: none, and those blobs
   * stay plain. Asked with layout_role. The net gives a group of blobs joined by SAME layers
   * the block its converting layers ask for (kiln_layout_for_block), or keeps it plain when they
   * differ or ask for none. */
  int (*block_channels)(const kiln_layer *l);
  /* A buffer that holds a copy of the layer's (single) top as forward left it, unchanged until
   * the layer's own backward (BatchNorm's normalised output); NULL: none. The net hands it to
   * the next layer when that one works in place on this top (kiln_layer.input_copy). */
  const kiln_blob *(*kept_output)(const kiln_layer *l);
  /* Fusion: shown the layers that follow this one (next[0 .. n)), returns how many of the first
   * of them this layer's own forward and backward also do (0: none); asked once, after the net
   * is wired, shaped and its layouts planned, and only when the net fuses
   * (kiln_net_options.unfused unset). The net then skips their forward and, in backward, runs
   * this layer's backward in the place of the last of them (so gradients reach a backward hook
   * no later than unfused). NULL: never fuses. A fuse hook learns what the next layers do only
   * through their `absorbable` hooks, never from their private state. */
  int (*fuse)(kiln_layer *l, kiln_layer *const *next, int n);
  /* The other side of fusion, asked by the `fuse` hook of the layer before: whether this
   * layer's whole work is the operation `kind`, in place on `blob` (that layer's top), with no
   * loss weight on its top (a loss would read a value the fused top no longer holds). If so it
   * fills *offer with what the absorbing layer needs to do that work and returns true. NULL:
   * never absorbed. */
  bool (*absorbable)(const kiln_layer *l, kiln_absorb_kind kind, const kiln_blob *blob,
                     kiln_absorb *offer);
  /* Recomputation in backward (kiln_config.no_recompute unset, a training net): whether this
   * layer, as built and fused, can run its forward again with the same bits and no other effect
   * (recompute: its top and its kept output from its bottom, statistics untouched). The net then
   * keeps neither between forward and backward when only the next layer reads the top, and
   * recomputes them before that layer's backward. NULL: never. */
  bool (*recomputable)(const kiln_layer *l);
  int (*recompute)(kiln_layer *l);
  /* The axis along which the layer's first bottom is, unchanged, the start of its (single) top
   * (Concat: its axis), its backward reading no data; -1 or NULL: none. The net then need not
   * keep the bottom for a layer that recomputes from it: the start of the top holds it. */
  int (*prefix_axis)(const kiln_layer *l);
  /* Which activation data its backward reads, as KILN_READS_BOTTOM(b) | KILN_READS_TOP(t) bits
   * (0: none; a bottom or top past the 16th counts as read unless the answer is 0), asked once
   * the net is fused, so that the net need not keep the rest from forward to backward
   * (kiln_net_options.share_data). A layer that sets it also promises that its forward writes
   * every element of its tops from its bottoms, parameters and own state, never reading what a
   * top held before (in place: what its bottom put there), so a top's memory may hold other
   * blobs' data between passes. NULL: the net keeps every blob the layer reads or writes. */
  unsigned (*backward_reads)(const kiln_layer *l);
  /* Data layers: records consumed, and repositioning, for exact resume. */
  uint64_t (*get_cursor)(kiln_layer *l);
  int (*set_cursor)(kiln_layer *l, uint64_t cursor);
  /* Data layers that read files: a digest of what the layer reads (so that workers on several
   * hosts can check that they hold the same data) and, in `what` (n bytes), the source it names.
   * Called before the first forward. NULL: the layer reads no files. */
  int (*fingerprint)(kiln_layer *l, uint8_t digest[32], char *what, size_t n);
  /* Parameter p's first values, chosen by the layer itself (a Python layer's setup writes them,
   * as pycaffe's do): called once the net has given the parameter its storage and its filler
   * has run, for each parameter the layer owns (not one it shares by name from another layer).
   * Weights loaded later replace them. NULL: the filler's values stand. */
  int (*init_param)(kiln_layer *l, int p);
} kiln_layer_ops;

struct kiln_layer {
  const kiln_layer_ops *ops;
  const Caffe__LayerParameter *lp;
  const char *name;
  int phase; /* CAFFE__PHASE__TRAIN or CAFFE__PHASE__TEST */
  int nbottom, ntop;
  kiln_blob **bottom, **top;
  bool *propagate_down; /* per bottom, set by the net */
  float *loss_weight;   /* per top */
  /* Learnable parameters: shapes declared in setup, storage assigned by the net (views into its
   * flat buffers). */
  int nparam;
  kiln_blob *param[KILN_MAX_LAYER_PARAMS];
  const Caffe__FillerParameter *param_filler[KILN_MAX_LAYER_PARAMS];
  float param_default_value[KILN_MAX_LAYER_PARAMS]; /* constant fill when no filler is given */
  /* Parameters the solver must never update (BatchNorm's statistics): lr_mult and decay_mult
   * are forced to 0 whatever the ParamSpec says, as Caffe does. */
  bool param_frozen[KILN_MAX_LAYER_PARAMS];
  /* Internal buffers (masks, caches) that the net allocates with the activations. */
  int nbuffer;
  kiln_blob *buffer[KILN_MAX_LAYER_BUFFERS];
  int64_t workspace_floats; /* scratch this layer needs, shared across layers */
  int64_t extra_bytes;      /* memory the layer holds itself (prefetch queues), for the plan */
  float *workspace;
  double flops;              /* forward floating-point operations per pass */
  bool reshaped;             /* set by a forward that changed its tops' shapes (a smaller last
                                batch): the net reshapes the layers after it */
  int nthreads;
  const kiln_config *config; /* the net's runtime configuration (never NULL) */
  const kiln_backend *backend; /* the kernels it runs (kiln_layer_choose_backend) */
  kiln_rng *rng;             /* the net's generator (dropout) */
  uint64_t seed;             /* the net's seed, for layers with their own streams */
  /* Data-parallel training: this worker's rank and the number of workers (0 or 1: one). A
   * train-phase Data layer reads only its share of the batches (see include/kiln/parallel.h). Set
   * before the first forward; fixed after it. */
  int shard_rank, shard_count;
  /* Set by the net when the layer just before this one keeps a copy of this layer's bottom 0
   * (kiln_layer_ops.kept_output): an in-place layer can read it in backward instead of saving
   * its input itself (Scale after BatchNorm). NULL otherwise. */
  const kiln_blob *input_copy;
  /* Fusion (kiln_layer_ops.fuse), set by the net: on the layer that does the work, how many
   * layers after it it does it for; on each of those, that layer. */
  int fused;
  kiln_layer *fused_into;
  void *priv;
};

/* kiln_layer_ops.backward_reads bits. */
#define KILN_READS_BOTTOM(b) (1u << (b))
#define KILN_READS_TOP(t) (1u << (16 + (t)))

/* Whether bottom `b` of `l` takes a gradient at all (kiln_layer_ops.allows_gradient). */
static inline bool kiln_layer_allows_gradient(const kiln_layer *l, int b) {
  if (b < 32 && (l->ops->no_gradient_bottoms >> b & 1)) return false; /* never, whatever the shape */
  return l->ops->allows_gradient ? l->ops->allows_gradient(l, b) : !(l->ops->is_loss && b > 0);
}

/* Runs op `op` of the layer's backend on the layer's threads, configuration and device: an int
 * status (KILN_OK). */
#define KILN_OP(l, op, ...)                                                                     \
  ((l)->backend->op(&(kiln_op_ctx){(l)->nthreads, (l)->config, (l)->backend->device},          \
                    __VA_ARGS__))

/* The backend of the layer's configuration (its device and engine) into l->backend, refusing a
 * backend that lacks one of the layer's kernels, or a layer with no kernel list on a device
 * other than the host, naming the layer, the op and the backend. */
int kiln_layer_choose_backend(kiln_layer *l);

/* For setup: declares a parameter blob of the given shape filled by `filler` (NULL: constant
 * `default_value`). Returns the (storage-less until the net assigns it) blob. */
kiln_blob *kiln_layer_add_param(kiln_layer *l, int naxes, const int64_t *shape,
                                const Caffe__FillerParameter *filler, float default_value);
/* For setup: an internal buffer blob, shaped in reshape, allocated by the net. */
kiln_blob *kiln_layer_add_buffer(kiln_layer *l, const char *what);

/* True for a SoftmaxWithLoss that predicts at every step of a sequence (its class axis is 2 or
 * later, as a language model's T x N x V scores) and averages over the predictions (VALID or
 * FULL normalization): its loss is the mean cross-entropy per token in nats, and exp of it the
 * per-token perplexity. */
bool kiln_layer_is_token_xent(const kiln_layer *l);
/* True for an F1 layer: its three tops are a batch's true positives, false positives and false
 * negatives of one class, whose averages over a test pass give that pass's precision, recall
 * and F1 (kiln_net_derived_metrics). */
bool kiln_layer_is_f1(const kiln_layer *l);
/* True for a DetectionEvaluate layer (the SSD fork's): its top holds a batch's rows
 * (-1, label, positives, -1, -1) and (item, label, score, tp, fp), which a test pass adds up
 * with kiln_map_add (include/kiln/detect.h) into that pass's mAP, instead of averaging them. */
bool kiln_layer_is_detection_evaluate(const kiln_layer *l);

/* Registry: the built-in types, then those registered at run time. */
const kiln_layer_ops *kiln_layer_find(const char *type);
/* Adds a layer type whose code lives outside the library (Caffe's `Python`, which the kiln
 * command and the kiln Python module supply when they have a Python runtime). Registering a
 * type again replaces its table; a built-in type cannot be replaced (KILN_ERR_INVALID). Not
 * thread-safe: register before building nets. At most 16 types. */
int kiln_layer_register(const kiln_layer_ops *ops);
/* The known type names, NULL-terminated (for suggestions and docs). */
const char *const *kiln_layer_type_names(void);

/* Fillers (Caffe's): constant, uniform, gaussian (with sparse), xavier, msra, positive_unitball.
 * fan_in = count / shape[0], fan_out = count / shape[1]. */
int kiln_fill(kiln_blob *b, const Caffe__FillerParameter *filler, float default_value,
              kiln_rng *rng);

#endif
