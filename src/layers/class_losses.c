/* Caffe's classification losses beyond SoftmaxWithLoss: MultinomialLogisticLoss (the negative
 * log of the probability given to the true class, on probabilities computed elsewhere),
 * InfogainLoss (a softmax, then the log probabilities weighted by row `label` of an infogain
 * matrix H) and HingeLoss (one-vs-all margins, L1 or L2). Caffe's CPU semantics: probabilities
 * are clamped at kLOG_THRESHOLD = 1e-20 before the log, and no gradient goes to labels (or to
 * H), which Caffe refuses. A label that is not a class index is refused too, where Caffe would
 * read past the row. */
#include <stdlib.h>

#include "kiln/data.h"
#include "layer_util.h"

static int64_t items(const kiln_blob *b) { return b->naxes > 0 ? b->shape[0] : 1; }

/* For losses over (N, C) predictions with one label per item: N labels, the label blob's first
 * axis N and its others 1 (Caffe's N x 1 x 1 x 1). */
static int check_item_labels(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0], *lab = l->bottom[1];
  if (items(lab) != items(x) || lab->count != items(x)) {
    char sx[128], sl[128];
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "labels %s do not match predictions %s: one label per item (N x 1 "
                            "x 1 x 1)",
                            kiln_blob_shape_string(lab, sl, sizeof sl),
                            kiln_blob_shape_string(x, sx, sizeof sx));
  }
  return KILN_OK;
}

/* An op's error (a label that is no class) with the layer's name before it. */
static int in_layer(const kiln_layer *l, int rc) {
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

static int refuse_label_gradient(kiln_layer *l) {
  for (int b = 1; b < l->nbottom; b++)
    if (l->propagate_down[b])
      return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED,
                              "cannot backpropagate to bottom %d ('%s'), the %s", b,
                              l->bottom[b]->name, b == 1 ? "labels" : "infogain matrix");
  return KILN_OK;
}

/* ---- MultinomialLogisticLoss --------------------------------------------------------------- */
/* x (N, dim) holds probabilities: L = -sum_n log(max(x[n, label_n], 1e-20)) / N;
 * dx[n, label_n] = -dL / max(x[n, label_n], 1e-20) / N, zero elsewhere. */

static int mll_reshape(kiln_layer *l) {
  KILN_TRY(check_item_labels(l));
  l->flops = (double)items(l->bottom[0]);
  return kiln_blob_reshape(l->top[0], 0, NULL);
}

static int mll_forward(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  return in_layer(l, KILN_OP(l, multinomial_loss_fwd, l->top[0]->data, x->data,
                             l->bottom[1]->data, N, dim));
}

static int mll_backward(kiln_layer *l) {
  KILN_TRY(refuse_label_gradient(l));
  if (!l->propagate_down[0]) return KILN_OK;
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  return in_layer(l, KILN_OP(l, multinomial_loss_bwd, l->bottom[0]->diff, x->data,
                             l->bottom[1]->data, l->top[0]->diff, N, dim));
}

const kiln_layer_ops kiln_layer_multinomial_logistic_loss = {
    .type = "MultinomialLogisticLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1,
    .max_tops = 1, .is_loss = true,
    .reshape = mll_reshape, .forward = mll_forward, .backward = mll_backward,
    .kernels = KILN_KERNELS(KILN_OP_multinomial_loss_fwd, KILN_OP_multinomial_loss_bwd),
};

/* ---- InfogainLoss -------------------------------------------------------------------------- */
/* Caffe 1.0's InfogainLoss: p = softmax over `axis` of the scores x (outer, C, inner); for each
 * position with label l not ignored, L -= sum_k H[l, k] log(max(p_k, 1e-20)); L is divided by
 * the normaliser of loss_param.normalization (VALID by default; at least 1).
 * dx_k = (p_k sum_j H[l, j] - H[l, k]) dL / normaliser, zero at ignored positions. H is C x C,
 * from infogain_loss_param.source (a BlobProto file, handed to the device in a buffer on every
 * forward) or a third bottom. A second top gets p. */

static const Caffe__InfogainLossParameter infogain_defaults = CAFFE__INFOGAIN_LOSS_PARAMETER__INIT;
static const Caffe__LossParameter loss_defaults = CAFFE__LOSS_PARAMETER__INIT;

typedef struct {
  float *H;      /* from the source file (NULL with a third bottom), host memory */
  int64_t nH;    /* its values */
  int64_t outer, C, inner;
} infogain_state;

static const Caffe__InfogainLossParameter *infogain_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->infogain_loss_param, infogain_defaults);
}

static int load_infogain(kiln_layer *l, infogain_state *s, const char *source) {
  char path[4096];
  KILN_TRY(kiln_data_source_path(l->config, source, path, sizeof path));
  ProtobufCMessage *m;
  int rc = kiln_proto_read_binary(path, &caffe__blob_proto__descriptor, &m);
  if (rc) return kiln_error_context(rc, "layer '%s' (InfogainLoss): infogain_loss_param.source: ", l->name);
  const Caffe__BlobProto *bp = (const Caffe__BlobProto *)m;
  const size_t n = bp->n_double_data ? bp->n_double_data : bp->n_data;
  s->H = malloc(sizeof(float) * (n ? n : 1));
  if (!s->H) {
    protobuf_c_message_free_unpacked(m, NULL);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++)
    s->H[i] = bp->n_double_data ? (float)bp->double_data[i] : bp->data[i];
  s->nH = (int64_t)n;
  protobuf_c_message_free_unpacked(m, NULL);
  return KILN_OK;
}

static int infogain_setup(kiln_layer *l) {
  const Caffe__LossParameter *lp = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  if (lp->has_normalize)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "loss_param.normalize is deprecated: use loss_param.normalization");
  infogain_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  if (l->nbottom < 3) {
    const char *src = infogain_param(l)->source;
    if (!src || !src[0])
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "infogain_loss_param.source must name the infogain matrix (or give "
                              "it as a third bottom)");
    KILN_TRY(load_infogain(l, s, src));
  }
  if (!kiln_layer_add_buffer(l, "prob")) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (l->nbottom < 3 && !kiln_layer_add_buffer(l, "infogain"))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  return KILN_OK;
}

static void infogain_destroy(kiln_layer *l) {
  infogain_state *s = l->priv;
  if (s) free(s->H);
  free(s);
}

/* H on the device: the third bottom, or the buffer forward copies the file's matrix into. */
static const float *infogain_matrix(const kiln_layer *l) {
  return l->nbottom >= 3 ? l->bottom[2]->data : l->buffer[1]->data;
}

static int infogain_reshape(kiln_layer *l) {
  infogain_state *s = l->priv;
  const kiln_blob *x = l->bottom[0];
  const int axis_param = infogain_param(l)->axis;
  int axis;
  if (kiln_blob_canonical_axis(x, axis_param, &axis))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "infogain_loss_param.axis %d is not an axis of a %d-axis input",
                            axis_param, x->naxes);
  s->outer = kiln_count(x, 0, axis);
  s->C = x->shape[axis];
  s->inner = kiln_count(x, axis + 1, x->naxes);
  if (items(l->bottom[1]) != items(x) || l->bottom[1]->count != s->outer * s->inner)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "label count %lld does not match the predictions' %lld positions "
                            "(the count without the class axis %d)",
                            (long long)l->bottom[1]->count, (long long)(s->outer * s->inner), axis);
  const int64_t nH = l->nbottom >= 3 ? l->bottom[2]->count : s->nH;
  if (nH != s->C * s->C)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                            "the infogain matrix has %lld values, not %lld x %lld for the %lld "
                            "classes",
                            (long long)nH, (long long)s->C, (long long)s->C, (long long)s->C);
  l->flops = 5.0 * (double)x->count;
  KILN_TRY(kiln_blob_reshape_like(l->buffer[0], x));
  if (l->nbottom < 3) KILN_TRY(kiln_blob_reshape(l->buffer[1], 1, &nH));
  KILN_TRY(kiln_blob_reshape(l->top[0], 0, NULL));
  if (l->ntop > 1) KILN_TRY(kiln_blob_reshape_like(l->top[1], x));
  return KILN_OK;
}

/* The mode as the loss ops take it; an unknown one divides by 1, as NONE. */
static kiln_loss_norm infogain_norm(const kiln_layer *l) {
  switch (KILN_PARAM_OR(l->lp->loss_param, loss_defaults)->normalization) {
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL: return KILN_LOSS_FULL;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID: return KILN_LOSS_VALID;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE: return KILN_LOSS_BATCH;
    default: return KILN_LOSS_NONE;
  }
}

static int infogain_forward(kiln_layer *l) {
  const infogain_state *s = l->priv;
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  float *prob = l->buffer[0]->data;
  if (l->nbottom < 3)
    KILN_TRY(kiln_device_to_device(l->backend->device, l->buffer[1]->data, s->H,
                                   sizeof(float) * (size_t)s->nH));
  KILN_TRY(KILN_OP(l, softmax_fwd, prob, l->bottom[0]->data, s->outer, s->C, s->inner));
  KILN_TRY(in_layer(l, KILN_OP(l, infogain_loss_fwd, l->top[0]->data, prob, l->bottom[1]->data,
                               infogain_matrix(l), s->outer, s->C, s->inner, p->has_ignore_label,
                               p->ignore_label, infogain_norm(l))));
  if (l->ntop > 1) KILN_TRY(KILN_OP(l, copy, l->top[1]->data, prob, l->bottom[0]->count));
  return KILN_OK;
}

static int infogain_backward(kiln_layer *l) {
  KILN_TRY(refuse_label_gradient(l));
  if (!l->propagate_down[0]) return KILN_OK;
  const infogain_state *s = l->priv;
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  return in_layer(l, KILN_OP(l, infogain_loss_bwd, l->bottom[0]->diff, l->buffer[0]->data,
                             l->bottom[1]->data, infogain_matrix(l), l->top[0]->diff, s->outer,
                             s->C, s->inner, p->has_ignore_label, p->ignore_label,
                             infogain_norm(l)));
}

const kiln_layer_ops kiln_layer_infogain_loss = {
    .type = "InfogainLoss", .min_bottoms = 2, .max_bottoms = 3, .min_tops = 1, .max_tops = 2,
    .is_loss = true,
    .setup = infogain_setup, .reshape = infogain_reshape, .forward = infogain_forward,
    .backward = infogain_backward, .destroy = infogain_destroy,
    .kernels = KILN_KERNELS(KILN_OP_softmax_fwd, KILN_OP_infogain_loss_fwd,
                            KILN_OP_infogain_loss_bwd, KILN_OP_copy),
};

/* ---- HingeLoss ----------------------------------------------------------------------------- */
/* x (N, dim) scores; with s = -1 for the true class and +1 for the others, the margins
 * m = max(0, 1 + s x). L1: L = sum m / N, dx = s sign(m) dL / N; L2: L = sum m^2 / N,
 * dx = 2 s m dL / N. */

static const Caffe__HingeLossParameter hinge_defaults = CAFFE__HINGE_LOSS_PARAMETER__INIT;

static int hinge_setup(kiln_layer *l) {
  const Caffe__HingeLossParameter *p = KILN_PARAM_OR(l->lp->hinge_loss_param, hinge_defaults);
  if (p->norm != CAFFE__HINGE_LOSS_PARAMETER__NORM__L1 &&
      p->norm != CAFFE__HINGE_LOSS_PARAMETER__NORM__L2)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "hinge_loss_param.norm %d is unknown",
                            (int)p->norm);
  return KILN_OK;
}

static int hinge_reshape(kiln_layer *l) {
  KILN_TRY(check_item_labels(l));
  l->flops = 3.0 * (double)l->bottom[0]->count;
  return kiln_blob_reshape(l->top[0], 0, NULL);
}

static bool hinge_l2(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->hinge_loss_param, hinge_defaults)->norm ==
         CAFFE__HINGE_LOSS_PARAMETER__NORM__L2;
}

static int hinge_forward(kiln_layer *l) {
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  return in_layer(l, KILN_OP(l, hinge_loss_fwd, l->top[0]->data, x->data, l->bottom[1]->data, N,
                             dim, hinge_l2(l)));
}

static int hinge_backward(kiln_layer *l) {
  KILN_TRY(refuse_label_gradient(l));
  if (!l->propagate_down[0]) return KILN_OK;
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  return in_layer(l, KILN_OP(l, hinge_loss_bwd, l->bottom[0]->diff, x->data, l->bottom[1]->data,
                             l->top[0]->diff, N, dim, hinge_l2(l)));
}

const kiln_layer_ops kiln_layer_hinge_loss = {
    .type = "HingeLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .is_loss = true,
    .setup = hinge_setup, .reshape = hinge_reshape, .forward = hinge_forward,
    .backward = hinge_backward,
    .kernels = KILN_KERNELS(KILN_OP_hinge_loss_fwd, KILN_OP_hinge_loss_bwd),
};
