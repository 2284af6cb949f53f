/* Caffe's old file formats brought to the current one on load, as Caffe does (its
 * UpgradeNetAsNeeded and UpgradeSolverAsNeeded), so that nets, weights and solvers written before
 * 2015 run unchanged:
 *   - V0 layers (`layers { layer { type: "conv" kernelsize: 5 ... } }`, 2013-2014), first to V1,
 *     with their "padding" layers folded into the convolution or pooling they feed;
 *   - V1 layers (`layers { type: CONVOLUTION blobs_lr: 1 ... }`) to `layer { type:
 *     "Convolution" param { lr_mult: 1 } ... }`;
 *   - the data transformation fields once in data_param and image_data_param (scale, mean_file,
 *     crop_size, mirror) to transform_param;
 *   - a solver's `solver_type` enum to its `type` string.
 * Messages are rebuilt with malloc'd fields, so protobuf_c_message_free_unpacked frees old and new
 * alike; what moves from an old message to a new one is unlinked from the old first. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kiln/proto.h"

/* ---- V1 layer types ------------------------------------------------------------------------ */

static const struct {
  int v1;
  const char *v0, *type;
} types[] = {
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__ABSVAL, NULL, "AbsVal"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__ACCURACY, "accuracy", "Accuracy"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__ARGMAX, NULL, "ArgMax"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__BNLL, "bnll", "BNLL"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__CONCAT, "concat", "Concat"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__CONTRASTIVE_LOSS, NULL, "ContrastiveLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__CONVOLUTION, "conv", "Convolution"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__DATA, "data", "Data"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__DECONVOLUTION, NULL, "Deconvolution"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__DROPOUT, "dropout", "Dropout"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__DUMMY_DATA, NULL, "DummyData"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__EUCLIDEAN_LOSS, "euclidean_loss", "EuclideanLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__ELTWISE, NULL, "Eltwise"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__EXP, NULL, "Exp"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__FLATTEN, "flatten", "Flatten"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__HDF5_DATA, "hdf5_data", "HDF5Data"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__HDF5_OUTPUT, "hdf5_output", "HDF5Output"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__HINGE_LOSS, NULL, "HingeLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__IM2COL, "im2col", "Im2col"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__IMAGE_DATA, "images", "ImageData"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__INFOGAIN_LOSS, "infogain_loss", "InfogainLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__INNER_PRODUCT, "innerproduct", "InnerProduct"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__LRN, "lrn", "LRN"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__MEMORY_DATA, NULL, "MemoryData"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__MULTINOMIAL_LOGISTIC_LOSS, "multinomial_logistic_loss",
     "MultinomialLogisticLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__MVN, NULL, "MVN"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__POOLING, "pool", "Pooling"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__POWER, NULL, "Power"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__RELU, "relu", "ReLU"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SIGMOID, "sigmoid", "Sigmoid"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SIGMOID_CROSS_ENTROPY_LOSS, NULL,
     "SigmoidCrossEntropyLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SILENCE, NULL, "Silence"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SOFTMAX, "softmax", "Softmax"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SOFTMAX_LOSS, "softmax_loss", "SoftmaxWithLoss"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SPLIT, "split", "Split"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SLICE, NULL, "Slice"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__TANH, "tanh", "TanH"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__WINDOW_DATA, "window_data", "WindowData"},
    {CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__THRESHOLD, NULL, "Threshold"},
};


static int oom(const char *source) { return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", source); }

/* Moves a repeated field: *to takes the array and count, the source is emptied. */
#define MOVE_REPEATED(to_n, to, from_n, from) \
  do {                                        \
    (to_n) = (from_n);                        \
    (to) = (from);                            \
    (from_n) = 0;                             \
    (from) = NULL;                            \
  } while (0)

/* Moves a sub-message pointer. */
#define MOVE(to, from) \
  do {                 \
    (to) = (from);     \
    (from) = NULL;     \
  } while (0)

static void *new_message(const ProtobufCMessageDescriptor *d) {
  void *m = malloc(d->sizeof_message);
  if (m) protobuf_c_message_init(d, m);
  return m;
}

/* ---- V0 to V1 ------------------------------------------------------------------------------ */

static Caffe__ConvolutionParameter *conv_of(Caffe__V1LayerParameter *v) {
  if (!v->convolution_param) v->convolution_param = new_message(&caffe__convolution_parameter__descriptor);
  return v->convolution_param;
}
static Caffe__InnerProductParameter *ip_of(Caffe__V1LayerParameter *v) {
  if (!v->inner_product_param)
    v->inner_product_param = new_message(&caffe__inner_product_parameter__descriptor);
  return v->inner_product_param;
}
static Caffe__PoolingParameter *pool_of(Caffe__V1LayerParameter *v) {
  if (!v->pooling_param) v->pooling_param = new_message(&caffe__pooling_parameter__descriptor);
  return v->pooling_param;
}
static Caffe__DataParameter *data_of(Caffe__V1LayerParameter *v) {
  if (!v->data_param) v->data_param = new_message(&caffe__data_parameter__descriptor);
  return v->data_param;
}

static int set_uint_list(uint32_t **list, size_t *n, uint32_t value) {
  uint32_t *l = malloc(sizeof *l);
  if (!l) return -1;
  *l = value;
  free(*list);
  *list = l;
  *n = 1;
  return 0;
}

static int v0_to_v1(Caffe__V1LayerParameter *v, const char *source, int index) {
  Caffe__V0LayerParameter *o = v->layer;
  const char *t = o->type ? o->type : "";
  int type = -1;
  for (size_t i = 0; i < sizeof types / sizeof *types; i++)
    if (types[i].v0 && !strcmp(types[i].v0, t)) type = types[i].v1;
  if (type < 0)
    return kiln_errorf(KILN_ERR_PARSE, "%s: V0 layer %d ('%s'): unknown V0 layer type '%s'", source,
                       index, o->name ? o->name : "", t);
  v->has_type = 1;
  v->type = (Caffe__V1LayerParameter__LayerType)type;
  if (!v->name) MOVE(v->name, o->name);
  const bool conv = type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__CONVOLUTION;
  const bool ip = type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__INNER_PRODUCT;
  const bool pool = type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__POOLING;
  const bool data = type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__DATA;
  if ((conv && !conv_of(v)) || (ip && !ip_of(v)) || (pool && !pool_of(v)) || (data && !data_of(v)))
    return oom(source);
  if (o->has_num_output) {
    if (conv) conv_of(v)->num_output = o->num_output, v->convolution_param->has_num_output = 1;
    if (ip) ip_of(v)->num_output = o->num_output, v->inner_product_param->has_num_output = 1;
  }
  if (o->has_biasterm) {
    if (conv) v->convolution_param->bias_term = o->biasterm, v->convolution_param->has_bias_term = 1;
    if (ip) v->inner_product_param->bias_term = o->biasterm, v->inner_product_param->has_bias_term = 1;
  }
  if (conv) MOVE(v->convolution_param->weight_filler, o->weight_filler);
  if (conv) MOVE(v->convolution_param->bias_filler, o->bias_filler);
  if (ip) MOVE(v->inner_product_param->weight_filler, o->weight_filler);
  if (ip) MOVE(v->inner_product_param->bias_filler, o->bias_filler);
  if (o->has_pad && conv &&
      set_uint_list(&v->convolution_param->pad, &v->convolution_param->n_pad, o->pad))
    return oom(source);
  if (o->has_pad && pool) v->pooling_param->pad = o->pad, v->pooling_param->has_pad = 1;
  if (o->has_kernelsize && conv &&
      set_uint_list(&v->convolution_param->kernel_size, &v->convolution_param->n_kernel_size,
                    o->kernelsize))
    return oom(source);
  if (o->has_kernelsize && pool)
    v->pooling_param->kernel_size = o->kernelsize, v->pooling_param->has_kernel_size = 1;
  if (o->has_group && conv) v->convolution_param->group = o->group, v->convolution_param->has_group = 1;
  if (o->has_stride && conv &&
      set_uint_list(&v->convolution_param->stride, &v->convolution_param->n_stride, o->stride))
    return oom(source);
  if (o->has_stride && pool) v->pooling_param->stride = o->stride, v->pooling_param->has_stride = 1;
  if (o->has_pool && pool)
    v->pooling_param->pool = (Caffe__PoolingParameter__PoolMethod)o->pool, v->pooling_param->has_pool = 1;
  if (o->has_dropout_ratio) {
    if (!v->dropout_param && !(v->dropout_param = new_message(&caffe__dropout_parameter__descriptor)))
      return oom(source);
    v->dropout_param->dropout_ratio = o->dropout_ratio;
    v->dropout_param->has_dropout_ratio = 1;
  }
  if (o->has_local_size || o->has_alpha || o->has_beta || o->has_k) {
    if (!v->lrn_param && !(v->lrn_param = new_message(&caffe__lrnparameter__descriptor)))
      return oom(source);
    Caffe__LRNParameter *l = v->lrn_param;
    if (o->has_local_size) l->local_size = o->local_size, l->has_local_size = 1;
    if (o->has_alpha) l->alpha = o->alpha, l->has_alpha = 1;
    if (o->has_beta) l->beta = o->beta, l->has_beta = 1;
    if (o->has_k) l->k = o->k, l->has_k = 1;
  }
  if (data) {
    Caffe__DataParameter *d = v->data_param;
    if (o->source) {
      char **one = malloc(sizeof *one);
      if (!one) return oom(source);
      MOVE(one[0], o->source);
      d->source = one;
      d->n_source = 1;
    }
    if (o->has_batchsize) d->batch_size = o->batchsize, d->has_batch_size = 1;
    if (o->has_rand_skip) d->rand_skip = o->rand_skip, d->has_rand_skip = 1;
    /* moved on into transform_param by the data transformation upgrade */
    if (o->has_scale) d->scale = o->scale, d->has_scale = 1;
    if (o->meanfile) MOVE(d->mean_file, o->meanfile);
    if (o->has_cropsize) d->crop_size = o->cropsize, d->has_crop_size = 1;
    if (o->has_mirror) d->mirror = o->mirror, d->has_mirror = 1;
  }
  /* HDF5Data took `source` and `batchsize` from the V0 layer too, and HDF5Output kept its block */
  if (type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__HDF5_DATA && (o->source || o->has_batchsize)) {
    if (!v->hdf5_data_param &&
        !(v->hdf5_data_param = new_message(&caffe__hdf5_data_parameter__descriptor)))
      return oom(source);
    if (o->source) MOVE(v->hdf5_data_param->source, o->source);
    if (o->has_batchsize)
      v->hdf5_data_param->batch_size = o->batchsize, v->hdf5_data_param->has_batch_size = 1;
  }
  if (o->hdf5_output_param && type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__HDF5_OUTPUT)
    MOVE(v->hdf5_output_param, o->hdf5_output_param);
  if (o->has_concat_dim && type == CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__CONCAT) {
    if (!v->concat_param && !(v->concat_param = new_message(&caffe__concat_parameter__descriptor)))
      return oom(source);
    v->concat_param->axis = (int32_t)o->concat_dim;
    v->concat_param->has_axis = 1;
  }
  MOVE_REPEATED(v->n_blobs, v->blobs, o->n_blobs, o->blobs);
  MOVE_REPEATED(v->n_blobs_lr, v->blobs_lr, o->n_blobs_lr, o->blobs_lr);
  MOVE_REPEATED(v->n_weight_decay, v->weight_decay, o->n_weight_decay, o->weight_decay);
  protobuf_c_message_free_unpacked(&o->base, NULL);
  v->layer = NULL;
  return KILN_OK;
}

/* V0 "padding" layers: the convolution or pooling they feed takes their pad and their input. */
static int fold_padding(Caffe__NetParameter *np, const char *source) {
  size_t kept = 0;
  for (size_t i = 0; i < np->n_layers; i++) {
    Caffe__V1LayerParameter *v = np->layers[i];
    if (!v->layer || !v->layer->type || strcmp(v->layer->type, "padding")) {
      np->layers[kept++] = v;
      continue;
    }
    if (v->n_bottom != 1 || v->n_top != 1)
      return kiln_errorf(KILN_ERR_PARSE, "%s: V0 padding layer '%s' needs one bottom and one top",
                         source, v->layer->name ? v->layer->name : "");
    int users = 0;
    for (size_t j = i + 1; j < np->n_layers; j++) {
      Caffe__V1LayerParameter *w = np->layers[j];
      for (size_t b = 0; b < w->n_bottom; b++) {
        if (strcmp(w->bottom[b], v->top[0])) continue;
        const char *t = w->layer && w->layer->type ? w->layer->type : "";
        if (strcmp(t, "conv") && strcmp(t, "pool"))
          return kiln_errorf(KILN_ERR_PARSE,
                             "%s: V0 padding layer '%s' feeds a '%s' layer; only conv and pool "
                             "layers take their padding",
                             source, v->layer->name ? v->layer->name : "", t);
        w->layer->pad = v->layer->pad;
        w->layer->has_pad = 1;
        char *in = strdup(v->bottom[0]);
        if (!in) return oom(source);
        free(w->bottom[b]);
        w->bottom[b] = in;
        users++;
      }
    }
    protobuf_c_message_free_unpacked(&v->base, NULL);
  }
  np->n_layers = kept;
  return KILN_OK;
}

/* ---- V1 to the current format -------------------------------------------------------------- */

static int v1_to_layer(Caffe__V1LayerParameter *v, Caffe__LayerParameter **out, const char *source,
                       int index) {
  *out = NULL;
  const char *type = NULL;
  for (size_t i = 0; i < sizeof types / sizeof *types; i++)
    if (v->has_type && (int)v->type == types[i].v1) type = types[i].type;
  if (!type)
    return kiln_errorf(KILN_ERR_PARSE, "%s: V1 layer %d ('%s') has no layer type", source, index,
                       v->name ? v->name : "");
  Caffe__LayerParameter *l = new_message(&caffe__layer_parameter__descriptor);
  if (!l || !(l->type = strdup(type))) {
    free(l);
    return oom(source);
  }
  MOVE(l->name, v->name);
  MOVE_REPEATED(l->n_bottom, l->bottom, v->n_bottom, v->bottom);
  MOVE_REPEATED(l->n_top, l->top, v->n_top, v->top);
  MOVE_REPEATED(l->n_include, l->include, v->n_include, v->include);
  MOVE_REPEATED(l->n_exclude, l->exclude, v->n_exclude, v->exclude);
  MOVE_REPEATED(l->n_blobs, l->blobs, v->n_blobs, v->blobs);
  MOVE_REPEATED(l->n_loss_weight, l->loss_weight, v->n_loss_weight, v->loss_weight);
  size_t np = v->n_param;
  if (v->n_blob_share_mode > np) np = v->n_blob_share_mode;
  if (v->n_blobs_lr > np) np = v->n_blobs_lr;
  if (v->n_weight_decay > np) np = v->n_weight_decay;
  if (np) {
    l->param = calloc(np, sizeof *l->param);
    if (!l->param) {
      protobuf_c_message_free_unpacked(&l->base, NULL);
      return oom(source);
    }
    for (size_t i = 0; i < np; i++) {
      Caffe__ParamSpec *p = new_message(&caffe__param_spec__descriptor);
      if (!p) {
        protobuf_c_message_free_unpacked(&l->base, NULL);
        return oom(source);
      }
      l->param[l->n_param++] = p;
      if (i < v->n_param) MOVE(p->name, v->param[i]);
      if (i < v->n_blob_share_mode)
        p->share_mode = (Caffe__ParamSpec__DimCheckMode)v->blob_share_mode[i], p->has_share_mode = 1;
      if (i < v->n_blobs_lr) p->lr_mult = v->blobs_lr[i], p->has_lr_mult = 1;
      if (i < v->n_weight_decay) p->decay_mult = v->weight_decay[i], p->has_decay_mult = 1;
    }
  }
  MOVE(l->accuracy_param, v->accuracy_param);
  MOVE(l->argmax_param, v->argmax_param);
  MOVE(l->concat_param, v->concat_param);
  MOVE(l->convolution_param, v->convolution_param);
  MOVE(l->data_param, v->data_param);
  MOVE(l->dropout_param, v->dropout_param);
  MOVE(l->dummy_data_param, v->dummy_data_param);
  MOVE(l->eltwise_param, v->eltwise_param);
  MOVE(l->hdf5_data_param, v->hdf5_data_param);
  MOVE(l->hdf5_output_param, v->hdf5_output_param);
  MOVE(l->image_data_param, v->image_data_param);
  MOVE(l->inner_product_param, v->inner_product_param);
  MOVE(l->lrn_param, v->lrn_param);
  MOVE(l->memory_data_param, v->memory_data_param);
  MOVE(l->pooling_param, v->pooling_param);
  MOVE(l->power_param, v->power_param);
  MOVE(l->relu_param, v->relu_param);
  MOVE(l->sigmoid_param, v->sigmoid_param);
  MOVE(l->softmax_param, v->softmax_param);
  MOVE(l->slice_param, v->slice_param);
  MOVE(l->tanh_param, v->tanh_param);
  MOVE(l->transform_param, v->transform_param);
  MOVE(l->loss_param, v->loss_param);
  MOVE(l->contrastive_loss_param, v->contrastive_loss_param);
  MOVE(l->exp_param, v->exp_param);
  MOVE(l->hinge_loss_param, v->hinge_loss_param);
  MOVE(l->infogain_loss_param, v->infogain_loss_param);
  MOVE(l->mvn_param, v->mvn_param);
  MOVE(l->threshold_param, v->threshold_param);
  *out = l;
  return KILN_OK;
}

/* The old transformation fields of data_param or image_data_param (`d`, named `what`; both
 * messages spell them alike) into transform_param (Caffe's UpgradeNetDataTransformation); a
 * field set in both places is refused. */
#define UPGRADE_TRANSFORM(l, d, what, source)                                                      \
  do {                                                                                             \
    if (!(d) || !((d)->has_scale || (d)->mean_file || (d)->has_crop_size || (d)->has_mirror))      \
      break;                                                                                       \
    if (!(l)->transform_param &&                                                                   \
        !((l)->transform_param = new_message(&caffe__transformation_parameter__descriptor)))       \
      return oom(source);                                                                          \
    Caffe__TransformationParameter *t = (l)->transform_param;                                      \
    if (((d)->has_scale && t->has_scale) || ((d)->mean_file && t->mean_file) ||                    \
        ((d)->has_crop_size && t->has_crop_size) || ((d)->has_mirror && t->has_mirror))            \
      return kiln_errorf(KILN_ERR_PARSE,                                                           \
                         "%s: layer '%s' sets a transformation both in " what " (the old place) "  \
                         "and in transform_param",                                                 \
                         source, (l)->name ? (l)->name : "");                                      \
    if ((d)->has_scale) t->scale = (d)->scale, t->has_scale = 1, (d)->has_scale = 0;               \
    if ((d)->mean_file) MOVE(t->mean_file, (d)->mean_file);                                        \
    if ((d)->has_crop_size)                                                                        \
      t->crop_size = (d)->crop_size, t->has_crop_size = 1, (d)->has_crop_size = 0;                 \
    if ((d)->has_mirror) t->mirror = (d)->mirror, t->has_mirror = 1, (d)->has_mirror = 0;          \
  } while (0)

static int upgrade_data_transform(Caffe__LayerParameter *l, const char *source) {
  UPGRADE_TRANSFORM(l, l->data_param, "data_param", source);
  UPGRADE_TRANSFORM(l, l->image_data_param, "image_data_param", source);
  return KILN_OK;
}

int kiln_net_param_upgrade(Caffe__NetParameter *np, const char *source, bool *changed) {
  if (changed) *changed = false;
  if (np->n_layers && np->n_layer)
    return kiln_errorf(KILN_ERR_PARSE, "%s: holds both 'layer' (the current format) and 'layers' "
                       "(Caffe's V1): one format per file", source);
  bool any = false;
  if (np->n_layers) {
    any = true;
    KILN_TRY(fold_padding(np, source));
    for (size_t i = 0; i < np->n_layers; i++)
      if (np->layers[i]->layer) KILN_TRY(v0_to_v1(np->layers[i], source, (int)i));
    Caffe__LayerParameter **layer = calloc(np->n_layers, sizeof *layer);
    if (!layer) return oom(source);
    int rc = KILN_OK;
    size_t n = 0;
    for (size_t i = 0; i < np->n_layers && !rc; i++) {
      rc = v1_to_layer(np->layers[i], &layer[n], source, (int)i);
      if (!rc) n++;
    }
    if (rc) {
      for (size_t i = 0; i < n; i++) protobuf_c_message_free_unpacked(&layer[i]->base, NULL);
      free(layer);
      return rc;
    }
    for (size_t i = 0; i < np->n_layers; i++) protobuf_c_message_free_unpacked(&np->layers[i]->base, NULL);
    free(np->layers);
    np->layers = NULL;
    np->n_layers = 0;
    np->layer = layer;
    np->n_layer = n;
  }
  for (size_t i = 0; i < np->n_layer; i++) {
    Caffe__DataParameter *d = np->layer[i]->data_param;
    Caffe__ImageDataParameter *m = np->layer[i]->image_data_param;
    any |= d && (d->has_scale || d->mean_file || d->has_crop_size || d->has_mirror);
    any |= m && (m->has_scale || m->mean_file || m->has_crop_size || m->has_mirror);
    KILN_TRY(upgrade_data_transform(np->layer[i], source));
  }
  if (changed) *changed = any;
  return KILN_OK;
}

int kiln_solver_param_upgrade(Caffe__SolverParameter *sp, const char *source, bool *changed) {
  if (changed) *changed = false;
  if (!sp->has_solver_type) return KILN_OK;
  static const char *const names[] = {"SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"};
  if ((unsigned)sp->solver_type >= sizeof names / sizeof *names)
    return kiln_errorf(KILN_ERR_PARSE, "%s: solver_type %d is none of Caffe's", source,
                       (int)sp->solver_type);
  const char *name = names[sp->solver_type];
  if (sp->type && strcmp(sp->type, "SGD") && strcasecmp(sp->type, name))
    return kiln_errorf(KILN_ERR_PARSE, "%s: solver_type %s and type '%s' disagree; give type alone",
                       source, name, sp->type);
  char *t = strdup(name);
  if (!t) return oom(source);
  if (sp->type != caffe__solver_parameter__type__default_value) free(sp->type);
  sp->type = t;
  sp->has_solver_type = 0;
  if (changed) *changed = true;
  return KILN_OK;
}

int kiln_solver_inline_nets_upgrade(Caffe__SolverParameter *sp, const char *source,
                                    bool *changed) {
  bool any = false, one = false;
  Caffe__NetParameter *nets[2] = {sp->net_param, sp->train_net_param};
  for (int k = 0; k < 2; k++) {
    if (!nets[k]) continue;
    KILN_TRY(kiln_net_param_upgrade(nets[k], source, &one));
    any |= one;
  }
  for (size_t k = 0; k < sp->n_test_net_param; k++) {
    KILN_TRY(kiln_net_param_upgrade(sp->test_net_param[k], source, &one));
    any |= one;
  }
  if (changed) *changed = any;
  return KILN_OK;
}
