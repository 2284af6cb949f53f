/* kiln net: builds the layer graph from a NetParameter as Caffe does (file order, phase / level /
 * stage rules, in-place layers, Split layers for fan-out, loss weights, ParamSpec lr_mult /
 * decay_mult and sharing by name), keeps every learnable parameter in one flat buffer (and its
 * gradient in another), plans memory before allocating it, and runs forward and backward. */
#ifndef KILN_NET_H
#define KILN_NET_H

#include "kiln/layers.h"
#include "kiln/detect.h"

typedef struct kiln_net_options {
  int phase;               /* CAFFE__PHASE__TRAIN / TEST */
  int level;
  const char *const *stages;
  int nstages;
  uint64_t seed;
  int nthreads;            /* 0: kiln_get_num_threads() */
  uint64_t max_memory;     /* bytes; 0: what the OS reports as available */
  int history_per_param;   /* solver history copies per parameter, for the memory plan */
  const char *source;      /* file name for messages */
  bool share_diffs;        /* activation gradients share buffers by lifetime (much less memory);
                              a blob's diff is then valid only during backward. The solver's
                              train net uses it; off, every blob keeps its gradient */
  /* Activation data share buffers by lifetime (kiln_config.no_share_data unset): a blob's data
   * holds from the layer that writes it until the last that reads it, in forward, or in
   * backward where that backward reads it (kiln_layer_ops.backward_reads), so after forward
   * only the net's outputs, and the inputs a caller fills, may be read. A TEST net built so is
   * forward-only: no layer needs backward, and kiln_net_backward refuses it. The solver's nets
   * and the tools that only run forward use it; off, every blob keeps its data. */
  bool share_data;
  int shard_rank, shard_count; /* data-parallel worker rank and count (0: one worker); passed to
                                  every layer, used by train-phase Data layers */
  /* The runtime configuration (NULL: kiln_config_defaults()), copied into the net and seen by
   * every layer. What the net itself takes from it: plain_layouts keeps every activation in
   * Caffe's plain layout (otherwise blobs between layers that read oneDNN's blocked layout use
   * it); unfused runs every layer on its own (otherwise a layer may do the work of the ones
   * after it in the same passes over memory: kiln_layer_ops.fuse); a sleep fault slows every
   * forward of the layer it names (a net without the layer ignores it). */
  const kiln_config *config;
} kiln_net_options;

/* The name of the blobs that hold the shared activation data (kiln_net_options.share_data): a
 * blob whose data_of leads to one shares it with others. */
#define KILN_NET_SHARED_DATA "shared activation data"

typedef struct kiln_memory_plan {
  int64_t params, grads, history, activations, buffers, workspace, data_queues, total;
} kiln_memory_plan;

typedef struct kiln_net {
  char *name;
  int phase;
  int nlayers;
  kiln_layer **layers;
  bool *layer_need_backward;
  bool force_backward;        /* the NetParameter's */
  bool share_data;            /* built with kiln_net_options.share_data */
  bool forward_only;          /* a TEST net built with share_data: backward is refused */
  int nblobs;
  kiln_blob **blobs;          /* every activation blob, in creation order */
  /* Learnable parameters owned by this net, in layer order; shared ones appear once. */
  int nlearnable;
  kiln_blob **learnable;      /* views into param_data / param_diff */
  float *lr_mult, *decay_mult;
  bool *is_state;             /* running statistics a layer updates itself (BatchNorm's), not
                                 the solver: data-parallel workers average them */
  int64_t *learnable_offset;  /* offset of each learnable blob in the flat buffers */
  float *param_data, *param_diff;
  int64_t nparam_floats;
  bool param_diff_placed;     /* param_diff is someone else's memory (kiln_net_place_param_diff) */
  /* Outputs: blobs no layer consumes (the loss, accuracy, ...). */
  int noutputs;
  kiln_blob **outputs;
  float *output_loss_weight;  /* per output (0 for non-loss) */
  kiln_rng rng;
  uint64_t seed;
  float *workspace;
  int64_t workspace_floats;
  kiln_memory_plan memory;
  int nthreads;
  kiln_config config;         /* from kiln_net_options.config; every layer points here */
  /* Where its blobs, parameters, gradients, workspace and pools live (the configuration's
   * device; NULL: the host). Only its layers' kernels touch that memory; everything else moves
   * values through the device table (include/kiln/device.h). */
  const kiln_device *device;
  /* The kernels of the loops over its parameters and gradients outside its layers (the
   * solver's update, clipping and sums of passes): the backend of the configuration's device
   * and engine, as its layers' (kiln_layer_choose_backend); see kiln_net_backend, KILN_NET_OP. */
  const kiln_backend *backend;
  /* Called after each layer's place in backward (index i, from the last layer down; also for
   * layers that skip backward): the solver starts the sums of gradients that are final. */
  int (*backward_hook)(void *user, int layer);
  void *backward_hook_user;
  void *internal;             /* names, synthesized layer messages */
} kiln_net;

int kiln_net_create(const Caffe__NetParameter *np, const kiln_net_options *opt, kiln_net **out);

/* The net's backend (kiln_net.backend), and an op context for it: the net's threads,
 * configuration and the backend's device. */
const kiln_backend *kiln_net_backend(const kiln_net *net);
kiln_op_ctx kiln_net_op_ctx(const kiln_net *net);
/* Runs op `op` of the net's backend in the net's op context: an int status (KILN_OK). */
#define KILN_NET_OP(net, op, ...)                                                               \
  (kiln_net_backend(net)->op(&(kiln_op_ctx){(net)->nthreads, &(net)->config,                    \
                                            kiln_net_backend(net)->device},                     \
                             __VA_ARGS__))
void kiln_net_free(kiln_net *net);

/* Forward pass; *loss (may be NULL) gets the sum of loss_weight x top over the loss tops. */
int kiln_net_forward(kiln_net *net, float *loss);
/* Backward pass from the loss tops; parameter gradients accumulate. */
int kiln_net_backward(kiln_net *net);
/* One layer's place in the passes (what kiln_net_forward and kiln_net_backward do for layer i,
 * without the loss and the backward hook): a layer whose work another does (fused_into) does
 * nothing in forward, and the last such layer of a fused group runs the group's backward. */
int kiln_net_layer_forward(kiln_net *net, int i);
int kiln_net_layer_backward(kiln_net *net, int i);
void kiln_net_zero_param_diff(kiln_net *net);
/* Marks the net for timing its backward pass as a training step runs it (kiln time), whether or
 * not a loss reads its outputs (a deploy net has none): every layer with a backward pass runs it,
 * and each bottom's gradient is computed only where training computes it, where a learning
 * parameter lies below it or force_backward asks (Caffe's rule, without the pruning of what
 * reaches no loss). So the gradient of the net's input is not timed, as `caffe time` does not
 * time it. For nets built without share_diffs. Returns KILN_ERR_NOMEM or KILN_OK. */
int kiln_net_need_backward_everywhere(kiln_net *net);
/* Moves the parameter gradients (nparam_floats floats, 64-byte aligned) to `to`, memory the
 * caller owns and keeps for the net's life (the communicator's shared memory, where the workers'
 * sums read and write them in place); every parameter blob follows. Nets sharing this net's
 * parameters (kiln_net_share_params) must share them again. */
void kiln_net_place_param_diff(kiln_net *net, float *to);

/* After the caller gave the tops of the Input layers other shapes than the prototxt's: every
 * other layer reshaped to follow, in order. Shapes up to those the net was built with allocate
 * nothing (build it at the largest: kiln_seq2seq_size_inputs). */
int kiln_net_reshape_inputs(kiln_net *net);

kiln_blob *kiln_net_blob(const kiln_net *net, const char *name);
/* The sum of blob b's data in double, in order, read through the net's device table (a loss, an
 * accuracy: a scalar or a few values). */
int kiln_net_blob_sum(const kiln_net *net, const kiln_blob *b, double *sum);
/* The first n values of blob b's data into host memory, through the net's device table. */
int kiln_net_blob_read(const kiln_net *net, const kiln_blob *b, float *out, int64_t n);
kiln_layer *kiln_net_layer(const kiln_net *net, const char *name);

/* Makes `dst`'s parameters views of `src`'s for every layer name present in both (test nets
 * evaluating the train net's weights). Shapes must agree. */
int kiln_net_share_params(kiln_net *dst, const kiln_net *src);

/* Weights: Caffe's .caffemodel (binary NetParameter, blobs per layer, matched by layer name). */
int kiln_net_load_weights(kiln_net *net, const char *path);
int kiln_net_save_weights(const kiln_net *net, const char *path);

/* Data cursors (records consumed) of the data layers, in layer order. */
int kiln_net_data_layer_count(const kiln_net *net);
int kiln_net_get_cursors(const kiln_net *net, uint64_t *cursors);
int kiln_net_set_cursors(kiln_net *net, const uint64_t *cursors, int n);

/* The names of the figures a test pass derives, which the metrics file records as they are (the
 * net sits below the metrics file's header, include/kiln/metrics.h, so it names them itself;
 * KILN_MF_PERPLEXITY and KILN_MF_F1 there are the same strings). */
#define KILN_NET_PERPLEXITY "perplexity"
#define KILN_NET_PRECISION "precision"
#define KILN_NET_RECALL "recall"
#define KILN_NET_F1 "f1"

/* A figure derived from a test pass's output means (kiln_net_derived_metrics). */
typedef struct kiln_derived_metric {
  const char *name; /* KILN_NET_PERPLEXITY, KILN_NET_PRECISION, KILN_NET_RECALL, KILN_NET_F1 */
  double value;
  char from[160];   /* how, in words for people: "exp of loss", "2 tp / (2 tp + fp + fn)" */
} kiln_derived_metric;
#define KILN_NET_MAX_DERIVED 4

/* The figures a test pass reports beside its outputs, derived from mean[o], the mean over the
 * pass's batches of output o (its elements summed), as the solver's test events and `kiln test`
 * average every output: "perplexity", exp of the first per-token cross-entropy loss
 * (the first per-token cross-entropy loss: kiln_layer_is_token_xent); "precision", "recall" and "f1" from the first F1 layer whose
 * three tops (tp, fp, fn) are outputs: tp / (tp + fp), tp / (tp + fn) and
 * 2 tp / (2 tp + fp + fn), each 0 where its denominator is. Averaging keeps the counts' ratios,
 * so these are the whole pass's, not a mean of the batches'. A figure whose name an output
 * already has is left out (the output is reported as it is). Writes at most
 * KILN_NET_MAX_DERIVED entries to out and returns how many. */
int kiln_net_derived_metrics(const kiln_net *net, const double *mean, kiln_derived_metric *out);

/* ---- object detection's test figure -------------------------------------------------------- */

/* A detection test pass's mean average precision (the SSD fork's eval_type "detection"): the
 * rows (-1, label, positives, -1, -1) and (item, label, score, tp, fp) that the net's first
 * DetectionEvaluate layer whose top is an output writes each pass, added up over the pass and
 * averaged as kiln_map does (include/kiln/detect.h). Its output's sum is no figure: the solver
 * and `kiln test` leave it out. The metrics file records it as "mAP". */
#define KILN_NET_MAP "mAP"
typedef struct kiln_net_map kiln_net_map;
/* *out is NULL (and KILN_OK) for a net without such a layer. */
int kiln_net_map_new(const kiln_net *net, kiln_net_map **out);
/* The rows of the pass just run (after kiln_net_forward), read through the net's device. */
int kiln_net_map_add(kiln_net_map *m, const kiln_net *net);
/* The pass's mAP so far and how many classes it averages; kiln_net_map_per_class as
 * kiln_map_per_class. */
int kiln_net_map_result(kiln_net_map *m, kiln_ap_version v, double *map, int *nclasses);
int kiln_net_map_per_class(kiln_net_map *m, kiln_ap_version v, int cap, int *label, double *ap,
                           int64_t *positives, int *n);
/* The index in the net's outputs of the layer's top. */
int kiln_net_map_output(const kiln_net_map *m);
void kiln_net_map_free(kiln_net_map *m);

/* ---- encoder-decoder models: decoding (src/net/seq2seq.c; docs/sequence.md) --------------- */

/* A decoding net is a deploy net whose inputs are named as TextData PAIRS' tops: "source" and
 * "target_in" (the source's ids and the current target token), and where the net reads them
 * "source_mask", "source_cont" and "target_cont"; one of its outputs holds every step's scores
 * of the target vocabulary's tokens (logits, T x N x V). */
#define KILN_S2S_NINPUTS 5

/* Before the net is built: gives its inputs (a deploy header's input_shape, or Input layers)
 * the largest shapes a decode uses, max_source x max_streams for the source's and max_steps x
 * max_streams for the target's, so that the memory planned serves every pass. Refuses, naming
 * `model`, an input of another name, one not declared with two axes, and a net without source
 * or target_in. */
int kiln_seq2seq_size_inputs(Caffe__NetParameter *np, const char *model, int max_source,
                             int max_streams, int max_steps);

/* The target vocabulary's special ids: <s> starts target_in, </s> ends a target; neither <pad>
 * nor <s> is ever decoded. */
typedef struct kiln_seq2seq_marks {
  int bos, eos, pad;
} kiln_seq2seq_marks;

typedef struct kiln_seq2seq kiln_seq2seq;
/* A decoder on a net built after kiln_seq2seq_size_inputs, whose scores have vocab_size tokens. */
int kiln_seq2seq_open(kiln_net *net, int vocab_size, const kiln_seq2seq_marks *marks,
                      const char *model, kiln_seq2seq **out);
void kiln_seq2seq_free(kiln_seq2seq *d);
/* Decodes source[0 .. S) into out (room for max_len tokens), *n tokens without the </s>, and
 * *score its log-probability (with the </s>, where it ended). Greedy: the likeliest token at
 * every step, one pass a token, the decoder's recurrent state carried from pass to pass. Stops
 * at </s> or after max_len tokens. */
int kiln_seq2seq_greedy(kiln_seq2seq *d, const int32_t *source, int S, int max_len,
                        int32_t *out, int *n, double *score);
/* Beam search of width `beam` (at most the planned streams), each step recomputing the live
 * hypotheses' prefixes as one pass of `beam` streams (max_len at most the planned steps): the
 * best `beam` extensions of the live hypotheses go on, those that end with </s> finish, and the
 * search stops when no live hypothesis can beat the best finished one (log-probabilities never
 * rise). The best finished hypothesis, or at max_len without one the best live one. A beam of 1
 * chooses what greedy does. */
int kiln_seq2seq_beam(kiln_seq2seq *d, const int32_t *source, int S, int beam, int max_len,
                      int32_t *out, int *n, double *score);

/* Human-readable layer table (name, type, top shape, params, MFLOPs) and memory plan; caller
 * frees the string. */
char *kiln_net_describe(const kiln_net *net);
/* Forward FLOPs of one pass (sum over layers). */
double kiln_net_forward_flops(const kiln_net *net);

/* A single layer outside a net (tests, tools): setup + reshape on the given blobs, with its own
 * parameter storage, filled by its fillers from `seed`, under a copy of `cfg` (NULL: defaults).
 * Its parameters, buffers and workspace are host memory whatever its backend's device; a caller
 * that runs it on a device moves them there for the pass. */
int kiln_layer_create(const Caffe__LayerParameter *lp, int phase, kiln_blob **bottoms, int nbottom,
                      kiln_blob **tops, int ntop, uint64_t seed, const kiln_config *cfg,
                      kiln_layer **out);
void kiln_layer_free(kiln_layer *l);
/* Parses a net from prototxt text (convenience for tests and tools). */
int kiln_net_param_from_text(const char *text, const char *source, Caffe__NetParameter **out);

#endif
