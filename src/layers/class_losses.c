/* Caffe's classification losses beyond SoftmaxWithLoss: MultinomialLogisticLoss (the negative
 * log of the probability given to the true class, on probabilities computed elsewhere),
 * InfogainLoss (a softmax, then the log probabilities weighted by row `label` of an infogain
 * matrix H) and HingeLoss (one-vs-all margins, L1 or L2). Caffe's CPU semantics: probabilities
 * are clamped at kLOG_THRESHOLD = 1e-20 before the log, and no gradient goes to labels (or to
 * H), which Caffe refuses. A label that is not a class index is refused too, where Caffe would
 * read past the row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/ops.h"
#include "kiln/data.h"
#include "layer_util.h"

#define LOG_THRESHOLD 1e-20f /* Caffe's kLOG_THRESHOLD */

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

/* The label at `pos` as a class index in [0, C), or an error. */
static int class_of(kiln_layer *l, float v, int64_t pos, int64_t C, int64_t *out) {
  const int64_t c = (int64_t)v;
  if (v != (float)c || c < 0 || c >= C)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                            "label %g at position %lld is out of range: expected an integer in "
                            "[0, %lld)",
                            v, (long long)pos, (long long)C);
  *out = c;
  return KILN_OK;
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
  double loss = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t c;
    KILN_TRY(class_of(l, l->bottom[1]->data[n], n, dim, &c));
    loss -= log(fmaxf(x->data[n * dim + c], LOG_THRESHOLD));
  }
  l->top[0]->data[0] = (float)(loss / (double)(N ? N : 1));
  return KILN_OK;
}

static int mll_backward(kiln_layer *l) {
  KILN_TRY(refuse_label_gradient(l));
  if (!l->propagate_down[0]) return KILN_OK;
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  float *dx = l->bottom[0]->diff;
  memset(dx, 0, sizeof(float) * (size_t)x->count);
  const float scale = -l->top[0]->diff[0] / (float)(N ? N : 1);
  for (int64_t n = 0; n < N; n++) {
    int64_t c;
    KILN_TRY(class_of(l, l->bottom[1]->data[n], n, dim, &c));
    dx[n * dim + c] = scale / fmaxf(x->data[n * dim + c], LOG_THRESHOLD);
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_multinomial_logistic_loss = {
    .type = "MultinomialLogisticLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1,
    .max_tops = 1, .is_loss = true,
    .reshape = mll_reshape, .forward = mll_forward, .backward = mll_backward,
};

/* ---- InfogainLoss -------------------------------------------------------------------------- */
/* Caffe 1.0's InfogainLoss: p = softmax over `axis` of the scores x (outer, C, inner); for each
 * position with label l not ignored, L -= sum_k H[l, k] log(max(p_k, 1e-20)); L is divided by
 * the normaliser of loss_param.normalization (VALID by default; at least 1).
 * dx_k = (p_k sum_j H[l, j] - H[l, k]) dL / normaliser, zero at ignored positions. H is C x C,
 * from infogain_loss_param.source (a BlobProto file) or a third bottom. A second top gets p. */

static const Caffe__InfogainLossParameter infogain_defaults = CAFFE__INFOGAIN_LOSS_PARAMETER__INIT;
static const Caffe__LossParameter loss_defaults = CAFFE__LOSS_PARAMETER__INIT;

typedef struct {
  float *H;      /* from the source file (NULL with a third bottom) */
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
  return KILN_OK;
}

static void infogain_destroy(kiln_layer *l) {
  infogain_state *s = l->priv;
  if (s) free(s->H);
  free(s);
}

static const float *infogain_matrix(const kiln_layer *l) {
  const infogain_state *s = l->priv;
  return l->nbottom >= 3 ? l->bottom[2]->data : s->H;
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
  KILN_TRY(kiln_blob_reshape(l->top[0], 0, NULL));
  if (l->ntop > 1) KILN_TRY(kiln_blob_reshape_like(l->top[1], x));
  return KILN_OK;
}

static float infogain_normalizer(const kiln_layer *l, int64_t valid) {
  const infogain_state *s = l->priv;
  double n;
  switch (KILN_PARAM_OR(l->lp->loss_param, loss_defaults)->normalization) {
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__FULL: n = (double)(s->outer * s->inner); break;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__VALID: n = (double)valid; break;
    case CAFFE__LOSS_PARAMETER__NORMALIZATION_MODE__BATCH_SIZE: n = (double)s->outer; break;
    default: n = 1; break;
  }
  return (float)(n < 1 ? 1 : n);
}

static bool ignored(const kiln_layer *l, float v) {
  const Caffe__LossParameter *p = KILN_PARAM_OR(l->lp->loss_param, loss_defaults);
  return p->has_ignore_label && (int)v == p->ignore_label;
}

static int infogain_forward(kiln_layer *l) {
  const infogain_state *s = l->priv;
  float *prob = l->buffer[0]->data;
  kiln_softmax_forward(prob, l->bottom[0]->data, s->outer, s->C, s->inner);
  const float *label = l->bottom[1]->data, *H = infogain_matrix(l);
  double loss = 0;
  int64_t valid = 0;
  for (int64_t o = 0; o < s->outer; o++)
    for (int64_t j = 0; j < s->inner; j++) {
      const int64_t pos = o * s->inner + j;
      if (ignored(l, label[pos])) continue;
      int64_t c;
      KILN_TRY(class_of(l, label[pos], pos, s->C, &c));
      for (int64_t k = 0; k < s->C; k++)
        loss -= H[c * s->C + k] * log(fmaxf(prob[(o * s->C + k) * s->inner + j], LOG_THRESHOLD));
      valid++;
    }
  l->top[0]->data[0] = (float)(loss / infogain_normalizer(l, valid));
  if (l->ntop > 1) memcpy(l->top[1]->data, prob, sizeof(float) * (size_t)l->bottom[0]->count);
  return KILN_OK;
}

static int infogain_backward(kiln_layer *l) {
  KILN_TRY(refuse_label_gradient(l));
  if (!l->propagate_down[0]) return KILN_OK;
  const infogain_state *s = l->priv;
  const float *prob = l->buffer[0]->data, *label = l->bottom[1]->data, *H = infogain_matrix(l);
  float *dx = l->bottom[0]->diff;
  int64_t valid = 0;
  for (int64_t o = 0; o < s->outer; o++)
    for (int64_t j = 0; j < s->inner; j++) {
      const int64_t pos = o * s->inner + j;
      if (ignored(l, label[pos])) {
        for (int64_t k = 0; k < s->C; k++) dx[(o * s->C + k) * s->inner + j] = 0;
        continue;
      }
      int64_t c;
      KILN_TRY(class_of(l, label[pos], pos, s->C, &c));
      const float *row = H + c * s->C;
      float row_sum = 0;
      for (int64_t k = 0; k < s->C; k++) row_sum += row[k];
      for (int64_t k = 0; k < s->C; k++) {
        const int64_t i = (o * s->C + k) * s->inner + j;
        dx[i] = prob[i] * row_sum - row[k];
      }
      valid++;
    }
  const float scale = l->top[0]->diff[0] / infogain_normalizer(l, valid);
  for (int64_t i = 0; i < l->bottom[0]->count; i++) dx[i] *= scale;
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_infogain_loss = {
    .type = "InfogainLoss", .min_bottoms = 2, .max_bottoms = 3, .min_tops = 1, .max_tops = 2,
    .is_loss = true,
    .setup = infogain_setup, .reshape = infogain_reshape, .forward = infogain_forward,
    .backward = infogain_backward, .destroy = infogain_destroy,
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

/* max(0, 1 + s x) for score x of class k, with s = -1 for the true class c. */
static inline float hinge_margin(float x, int64_t k, int64_t c) {
  const float v = 1 + (k == c ? -x : x);
  return v > 0 ? v : 0;
}

static bool hinge_l2(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->hinge_loss_param, hinge_defaults)->norm ==
         CAFFE__HINGE_LOSS_PARAMETER__NORM__L2;
}

static int hinge_forward(kiln_layer *l) {
  const bool l2 = hinge_l2(l);
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  double loss = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t c;
    KILN_TRY(class_of(l, l->bottom[1]->data[n], n, dim, &c));
    for (int64_t k = 0; k < dim; k++) {
      const float m = hinge_margin(x->data[n * dim + k], k, c);
      loss += l2 ? (double)m * m : m;
    }
  }
  l->top[0]->data[0] = (float)(loss / (double)(N ? N : 1));
  return KILN_OK;
}

static int hinge_backward(kiln_layer *l) {
  KILN_TRY(refuse_label_gradient(l));
  if (!l->propagate_down[0]) return KILN_OK;
  const bool l2 = hinge_l2(l);
  const kiln_blob *x = l->bottom[0];
  const int64_t N = items(x), dim = N ? x->count / N : 0;
  const float scale = l->top[0]->diff[0] / (float)(N ? N : 1) * (l2 ? 2 : 1);
  for (int64_t n = 0; n < N; n++) {
    int64_t c;
    KILN_TRY(class_of(l, l->bottom[1]->data[n], n, dim, &c));
    float *d = l->bottom[0]->diff + n * dim;
    for (int64_t k = 0; k < dim; k++) {
      const float m = hinge_margin(x->data[n * dim + k], k, c);
      const float g = l2 ? m : (float)(m > 0);
      d[k] = (k == c ? -g : g) * scale;
    }
  }
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_hinge_loss = {
    .type = "HingeLoss", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .is_loss = true,
    .setup = hinge_setup, .reshape = hinge_reshape, .forward = hinge_forward,
    .backward = hinge_backward,
};
