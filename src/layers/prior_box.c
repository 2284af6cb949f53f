/* PriorBox (the SSD fork's, Wei Liu's Caffe): the default boxes of one feature map. Bottoms: the
 * feature map (N x C x H x W; only H and W are read) and the data image (N x C x IH x IW; only
 * its size is read, and only when prior_box_param gives none); one top 1 x 2 x 4P: P boxes
 * (xmin, ymin, xmax, ymax, normalised to the image) then their P x 4 variances, the same for
 * every image of the batch.
 *
 * prior_box_param as the fork reads it: min_size (one at least), max_size (none, or one for each
 * min_size, each greater than its min_size), aspect_ratio expanded to 1 first then each given
 * ratio not already in the list (within 1e-6), followed by its inverse when `flip` (default
 * true); clip; variance (none: 0.1, one: used for all four, or four); img_size or img_h and
 * img_w (not both; else the data bottom's height and width); step or step_h and step_w (not
 * both; else the image's size over the feature map's, as floats); offset (default 0.5). The boxes
 * are kiln_prior_boxes' (include/kiln/detect.h), computed once per shape in reshape into a host
 * buffer and copied to the top through the device table every forward. No gradient goes through
 * priors: the layer has no backward, and neither bottom allows one. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "detection_util.h"

static const Caffe__PriorBoxParameter prior_defaults = CAFFE__PRIOR_BOX_PARAMETER__INIT;

typedef struct {
  kiln_prior_spec spec; /* the parameters; the sizes and steps resolved per shape */
  bool img_given, step_given;
  det_host boxes; /* 8 P floats */
  int64_t nvalues; /* 8 P for the current shape */
  int key[4];      /* the sizes the boxes were computed for: layer h, w, image h, w */
} prior_state;

/* The expanded aspect ratios, as the fork's setup builds them. */
static int expand_ratios(kiln_layer *l, const Caffe__PriorBoxParameter *p, kiln_prior_spec *s) {
  s->ratio[0] = 1;
  s->n_ratio = 1;
  for (size_t i = 0; i < p->n_aspect_ratio; i++) {
    const float ar = p->aspect_ratio[i];
    bool seen = false;
    for (int j = 0; j < s->n_ratio; j++)
      if (fabsf(ar - s->ratio[j]) < 1e-6f) seen = true;
    if (seen) continue;
    if (s->n_ratio + (p->flip ? 2 : 1) > KILN_PRIOR_MAX_RATIOS)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "prior_box_param.aspect_ratio: more than %d ratios once expanded",
                              KILN_PRIOR_MAX_RATIOS);
    if (!(ar > 0) || !isfinite(ar))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "prior_box_param.aspect_ratio[%zu] = %g: expected a positive ratio",
                              i, ar);
    s->ratio[s->n_ratio++] = ar;
    if (p->flip) s->ratio[s->n_ratio++] = 1.0f / ar;
  }
  return KILN_OK;
}

static int prior_params(kiln_layer *l, prior_state *st) {
  const Caffe__PriorBoxParameter *p = KILN_PARAM_OR(l->lp->prior_box_param, prior_defaults);
  kiln_prior_spec *s = &st->spec;
  if (p->n_min_size < 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param.min_size is required");
  if (p->n_min_size > KILN_PRIOR_MAX_SIZES)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param has %zu min_size values: at "
                            "most %d", p->n_min_size, KILN_PRIOR_MAX_SIZES);
  if (p->n_max_size && p->n_max_size != p->n_min_size)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param has %zu max_size values for "
                            "%zu min_size values: expected none or one for each",
                            p->n_max_size, p->n_min_size);
  s->n_min = (int)p->n_min_size;
  s->n_max = (int)p->n_max_size;
  for (int i = 0; i < s->n_min; i++) s->min_size[i] = p->min_size[i];
  for (int i = 0; i < s->n_max; i++) s->max_size[i] = p->max_size[i];
  KILN_TRY(expand_ratios(l, p, s));
  s->clip = p->clip;
  if (p->n_variance > 4 || p->n_variance == 2 || p->n_variance == 3)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param has %zu variance values: "
                            "expected one or four (none: 0.1)", p->n_variance);
  s->n_variance = (int)p->n_variance;
  for (int i = 0; i < s->n_variance; i++) s->variance[i] = p->variance[i];
  if (p->has_img_h || p->has_img_w) {
    if (p->has_img_size)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param gives img_size and "
                              "img_h/img_w: give one or the other");
    if (!p->has_img_h || !p->has_img_w || p->img_h < 1 || p->img_w < 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param.img_h %u and img_w %u: "
                              "expected both, positive", p->img_h, p->img_w);
    s->img_h = (int)p->img_h, s->img_w = (int)p->img_w;
    st->img_given = true;
  } else if (p->has_img_size) {
    if (p->img_size < 1 || p->img_size > INT32_MAX)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param.img_size %u: expected a "
                              "positive size", p->img_size);
    s->img_h = s->img_w = (int)p->img_size;
    st->img_given = true;
  }
  if (p->has_step_h || p->has_step_w) {
    if (p->has_step)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param gives step and "
                              "step_h/step_w: give one or the other");
    if (!p->has_step_h || !p->has_step_w || !(p->step_h > 0) || !(p->step_w > 0))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param.step_h %g and step_w %g: "
                              "expected both, positive", p->step_h, p->step_w);
    s->step_h = p->step_h, s->step_w = p->step_w;
    st->step_given = true;
  } else if (p->has_step) {
    if (!(p->step > 0))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "prior_box_param.step %g: expected a positive "
                              "step", p->step);
    s->step_h = s->step_w = p->step;
    st->step_given = true;
  }
  s->offset = p->offset;
  return KILN_OK;
}

static int prior_setup(kiln_layer *l) {
  prior_state *st = calloc(1, sizeof *st);
  if (!st) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = st;
  return prior_params(l, st);
}

static int prior_reshape(kiln_layer *l) {
  prior_state *st = l->priv;
  kiln_prior_spec s = st->spec;
  const kiln_blob *fm = l->bottom[0], *img = l->bottom[1];
  char b0[128];
  if (fm->naxes != 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the feature map (bottom 0) is %s: expected N x "
                            "C x H x W", det_shape(fm, b0, sizeof b0));
  if (!st->img_given && img->naxes != 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the image (bottom 1) is %s: expected N x C x H "
                            "x W (or prior_box_param.img_size)", det_shape(img, b0, sizeof b0));
  if (fm->shape[2] > INT32_MAX || fm->shape[3] > INT32_MAX ||
      (!st->img_given && (img->shape[2] > INT32_MAX || img->shape[3] > INT32_MAX)))
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "the bottoms are too large");
  s.layer_h = (int)fm->shape[2];
  s.layer_w = (int)fm->shape[3];
  if (!st->img_given) {
    s.img_h = (int)img->shape[2];
    s.img_w = (int)img->shape[3];
  }
  if (!st->step_given && s.layer_h > 0 && s.layer_w > 0) {
    s.step_h = (float)s.img_h / (float)s.layer_h;
    s.step_w = (float)s.img_w / (float)s.layer_w;
  }
  KILN_TRY(det_in_layer(l, kiln_prior_check(&s)));
  const int64_t P = (int64_t)s.layer_h * s.layer_w * kiln_prior_per_cell(&s);
  const int key[4] = {s.layer_h, s.layer_w, s.img_h, s.img_w};
  if (st->nvalues != 8 * P || memcmp(key, st->key, sizeof key) != 0) { /* once per shape */
    KILN_TRY(det_host_reserve(&st->boxes, 8 * P));
    kiln_prior_boxes(st->boxes.v, &s);
    st->nvalues = 8 * P;
    memcpy(st->key, key, sizeof key);
  }
  l->extra_bytes = det_host_bytes(&st->boxes);
  l->flops = 0;
  const int64_t shape[3] = {1, 2, 4 * P};
  return kiln_blob_reshape(l->top[0], 3, shape);
}

/* The top holds nothing between passes that forward relies on: every forward writes it. */
static int prior_forward(kiln_layer *l) {
  prior_state *st = l->priv;
  return det_write(l, l->top[0]->data, st->boxes.v, st->nvalues);
}

static bool prior_allows_gradient(const kiln_layer *l, int b) {
  (void)l, (void)b;
  return false;
}

static void prior_destroy(kiln_layer *l) {
  prior_state *st = l->priv;
  if (st) det_host_free(&st->boxes);
  free(st);
}

const kiln_layer_ops kiln_layer_prior_box = {
    .type = "PriorBox", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 1, .max_tops = 1,
    .setup = prior_setup, .reshape = prior_reshape, .forward = prior_forward,
    .allows_gradient = prior_allows_gradient, .destroy = prior_destroy,
    .kernels = KILN_NO_KERNELS,
};
