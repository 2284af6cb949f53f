/* SSD's AnnotatedData augmentation as one call, in the fork's order, and the check of every
 * parameter it reads, made once when the layer is set up so that a bad value is named there
 * rather than found on the prefetch thread. */
#include <math.h>
#include <stdio.h>

#include "kiln/anno.h"

/* ---- the check --------------------------------------------------------------------------- */

static int bad(const char *field, float v, const char *rule) {
  return kiln_errorf(KILN_ERR_INVALID, "%s: %g; %s", field, (double)v, rule);
}

static int check_prob(const char *field, float p) {
  return isfinite(p) && p >= 0 && p <= 1 ? KILN_OK : bad(field, p, "a probability is 0 .. 1");
}

static int check_range(const char *what, const char *lo_name, float lo, const char *hi_name,
                       float hi) {
  char f[160];
  snprintf(f, sizeof f, "%s.%s", what, lo_name);
  if (!isfinite(lo) || lo < 0) return bad(f, lo, "must be 0 or more");
  snprintf(f, sizeof f, "%s.%s", what, hi_name);
  if (!isfinite(hi)) return bad(f, hi, "must be finite");
  if (lo > hi)
    return kiln_errorf(KILN_ERR_INVALID, "%s.%s (%g) is above %s (%g)", what, lo_name,
                       (double)lo, hi_name, (double)hi);
  return KILN_OK;
}

static int check_distort(const Caffe__DistortionParameter *p) {
  const char *w = "transform_param.distort_param";
  KILN_TRY(check_prob("transform_param.distort_param.brightness_prob", p->brightness_prob));
  KILN_TRY(check_prob("transform_param.distort_param.contrast_prob", p->contrast_prob));
  KILN_TRY(check_prob("transform_param.distort_param.saturation_prob", p->saturation_prob));
  KILN_TRY(check_prob("transform_param.distort_param.hue_prob", p->hue_prob));
  KILN_TRY(check_prob("transform_param.distort_param.random_order_prob", p->random_order_prob));
  if (!isfinite(p->brightness_delta) || p->brightness_delta < 0)
    return bad("transform_param.distort_param.brightness_delta", p->brightness_delta,
               "must be 0 or more");
  if (!isfinite(p->hue_delta) || p->hue_delta < 0)
    return bad("transform_param.distort_param.hue_delta", p->hue_delta, "must be 0 or more");
  KILN_TRY(check_range(w, "contrast_lower", p->contrast_lower, "contrast_upper",
                       p->contrast_upper));
  return check_range(w, "saturation_lower", p->saturation_lower, "saturation_upper",
                     p->saturation_upper);
}

/* A constraint's bound pair: each in [0, 1], min <= max. */
static int check_bounds(const char *where, const char *name, protobuf_c_boolean has_min,
                        float min, protobuf_c_boolean has_max, float max) {
  char f[200];
  snprintf(f, sizeof f, "%s.min_%s", where, name);
  if (has_min && !(min >= 0 && min <= 1)) return bad(f, min, "must be 0 .. 1");
  snprintf(f, sizeof f, "%s.max_%s", where, name);
  if (has_max && !(max >= 0 && max <= 1)) return bad(f, max, "must be 0 .. 1");
  if (has_min && has_max && min > max)
    return kiln_errorf(KILN_ERR_INVALID, "%s.min_%s (%g) is above max_%s (%g): no crop can meet it",
                       where, name, (double)min, name, (double)max);
  return KILN_OK;
}

static int check_sampler(const Caffe__BatchSampler *b, size_t i) {
  char f[160];
  const Caffe__Sampler *s = b->sampler;
  if (s) {
    snprintf(f, sizeof f, "batch_sampler[%zu].sampler.min_scale", i);
    if (!(s->min_scale > 0 && s->min_scale <= 1)) return bad(f, s->min_scale, "must be in (0, 1]");
    snprintf(f, sizeof f, "batch_sampler[%zu].sampler.max_scale", i);
    if (!(s->max_scale > 0 && s->max_scale <= 1)) return bad(f, s->max_scale, "must be in (0, 1]");
    if (s->min_scale > s->max_scale)
      return kiln_errorf(KILN_ERR_INVALID, "batch_sampler[%zu].sampler.min_scale (%g) is above "
                         "max_scale (%g)", i, (double)s->min_scale, (double)s->max_scale);
    snprintf(f, sizeof f, "batch_sampler[%zu].sampler.min_aspect_ratio", i);
    if (!(s->min_aspect_ratio > 0 && isfinite(s->min_aspect_ratio)))
      return bad(f, s->min_aspect_ratio, "must be above 0");
    snprintf(f, sizeof f, "batch_sampler[%zu].sampler.max_aspect_ratio", i);
    if (!(s->max_aspect_ratio > 0 && isfinite(s->max_aspect_ratio)))
      return bad(f, s->max_aspect_ratio, "must be above 0 and finite");
    if (s->min_aspect_ratio > s->max_aspect_ratio)
      return kiln_errorf(KILN_ERR_INVALID, "batch_sampler[%zu].sampler.min_aspect_ratio (%g) is "
                         "above max_aspect_ratio (%g)", i, (double)s->min_aspect_ratio,
                         (double)s->max_aspect_ratio);
  }
  const Caffe__SampleConstraint *c = b->sample_constraint;
  if (c) {
    snprintf(f, sizeof f, "batch_sampler[%zu].sample_constraint", i);
    KILN_TRY(check_bounds(f, "jaccard_overlap", c->has_min_jaccard_overlap, c->min_jaccard_overlap,
                          c->has_max_jaccard_overlap, c->max_jaccard_overlap));
    KILN_TRY(check_bounds(f, "sample_coverage", c->has_min_sample_coverage, c->min_sample_coverage,
                          c->has_max_sample_coverage, c->max_sample_coverage));
    KILN_TRY(check_bounds(f, "object_coverage", c->has_min_object_coverage, c->min_object_coverage,
                          c->has_max_object_coverage, c->max_object_coverage));
  }
  return KILN_OK;
}

/* A per-channel list (mean_value, pad_value): none, one for all, or one per channel. */
static int check_count(const char *field, size_t n, int channels) {
  if (n == 0 || n == 1 || channels == 0 || n == (size_t)channels) return KILN_OK;
  return kiln_errorf(KILN_ERR_INVALID, "%s: %zu values for an image of %d channel%s; give 1 or %d",
                     field, n, channels, channels == 1 ? "" : "s", channels);
}

static int check_resize(const Caffe__ResizeParameter *r, int channels) {
  if (r->height < 1 || r->height > KILN_IMAGE_MAX_SIDE)
    return kiln_errorf(KILN_ERR_INVALID, "transform_param.resize_param.height: %u; give the net's "
                       "input height, 1 .. %d", r->height, KILN_IMAGE_MAX_SIDE);
  if (r->width < 1 || r->width > KILN_IMAGE_MAX_SIDE)
    return kiln_errorf(KILN_ERR_INVALID, "transform_param.resize_param.width: %u; give the net's "
                       "input width, 1 .. %d", r->width, KILN_IMAGE_MAX_SIDE);
  if (r->resize_mode < CAFFE__RESIZE_PARAMETER__RESIZE_MODE__WARP ||
      r->resize_mode > CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_LARGE_SIZE_AND_PAD)
    return kiln_errorf(KILN_ERR_INVALID,
                       "transform_param.resize_param.resize_mode: unknown value %d",
                       (int)r->resize_mode);
  if (r->pad_mode < CAFFE__RESIZE_PARAMETER__PAD_MODE__CONSTANT ||
      r->pad_mode > CAFFE__RESIZE_PARAMETER__PAD_MODE__REPEAT_NEAREST)
    return kiln_errorf(KILN_ERR_INVALID, "transform_param.resize_param.pad_mode: unknown value %d",
                       (int)r->pad_mode);
  for (size_t i = 0; i < r->n_interp_mode; i++)
    if (r->interp_mode[i] < CAFFE__RESIZE_PARAMETER__INTERP_MODE__LINEAR ||
        r->interp_mode[i] > CAFFE__RESIZE_PARAMETER__INTERP_MODE__LANCZOS4)
      return kiln_errorf(KILN_ERR_INVALID, "transform_param.resize_param.interp_mode[%zu]: unknown "
                         "value %d", i, (int)r->interp_mode[i]);
  for (size_t i = 0; i < r->n_pad_value; i++)
    if (!isfinite(r->pad_value[i]))
      return bad("transform_param.resize_param.pad_value", r->pad_value[i], "must be finite");
  return check_count("transform_param.resize_param.pad_value", r->n_pad_value, channels);
}

static int check_noise(const Caffe__NoiseParameter *n) {
  if (n->prob > 0)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "transform_param.noise_param.prob: %g; kiln does not "
                       "implement the SSD fork's OpenCV noise policies (give prob 0, or leave out "
                       "noise_param)", (double)n->prob);
  /* The fork's ApplyNoise reads the switches alone, never prob: a switch on changes the image. */
  const struct { bool on; const char *name; } sw[] = {
      {n->hist_eq, "hist_eq"},       {n->inverse, "inverse"},   {n->decolorize, "decolorize"},
      {n->gauss_blur, "gauss_blur"}, {n->jpeg > 0, "jpeg"},     {n->posterize, "posterize"},
      {n->erode, "erode"},           {n->saltpepper, "saltpepper"}, {n->clahe, "clahe"},
      {n->convert_to_hsv, "convert_to_hsv"}, {n->convert_to_lab, "convert_to_lab"}};
  for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
    if (sw[i].on)
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "transform_param.noise_param.%s: kiln does not "
                         "implement the SSD fork's OpenCV noise policies, which apply whatever "
                         "prob says (leave them off, or leave out noise_param)", sw[i].name);
  return KILN_OK;
}

/* Whether expand_param can change an image at all. */
static bool expands(const Caffe__ExpansionParameter *e) {
  return e && e->prob > 0 && fabsf(e->max_expand_ratio - 1) >= 1e-2f;
}

int kiln_anno_augment_check(const Caffe__TransformationParameter *tp,
                            Caffe__BatchSampler *const *samplers, size_t nsamplers, int channels) {
  if (channels != 0 && channels != 1 && channels != 3)
    return kiln_errorf(KILN_ERR_INVALID, "detection augmentation of %d-channel images: 1 or 3",
                       channels);
  if (tp) {
    if (tp->distort_param) KILN_TRY(check_distort(tp->distort_param));
    const Caffe__ExpansionParameter *e = tp->expand_param;
    if (e) {
      KILN_TRY(check_prob("transform_param.expand_param.prob", e->prob));
      if (!(e->max_expand_ratio >= 1 && isfinite(e->max_expand_ratio)))
        return bad("transform_param.expand_param.max_expand_ratio", e->max_expand_ratio,
                   "must be 1 or more");
    }
    if (expands(e) && tp->mean_file && tp->mean_file[0])
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "transform_param.mean_file with expand_param: the "
                         "fork fills the expanded canvas from a mean image of the canvas's size, "
                         "which is drawn at random; give mean_value instead");
    for (size_t i = 0; i < tp->n_mean_value; i++)
      if (!isfinite(tp->mean_value[i]))
        return bad("transform_param.mean_value", tp->mean_value[i], "must be finite");
    KILN_TRY(check_count("transform_param.mean_value", tp->n_mean_value, channels));
    const Caffe__EmitConstraint *em = tp->emit_constraint;
    if (em) {
      if (em->emit_type != CAFFE__EMIT_CONSTRAINT__EMIT_TYPE__CENTER &&
          em->emit_type != CAFFE__EMIT_CONSTRAINT__EMIT_TYPE__MIN_OVERLAP)
        return kiln_errorf(KILN_ERR_INVALID, "transform_param.emit_constraint.emit_type: unknown "
                           "value %d", (int)em->emit_type);
      if (!(em->emit_overlap >= 0 && em->emit_overlap <= 1))
        return bad("transform_param.emit_constraint.emit_overlap", em->emit_overlap,
                   "must be 0 .. 1");
    }
    const Caffe__ResizeParameter *r = tp->resize_param;
    if (r) KILN_TRY(check_resize(r, channels));
    const bool fixed = r && r->resize_mode != CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_SMALL_SIZE;
    if (tp->crop_size && fixed && (tp->crop_size > r->height || tp->crop_size > r->width))
      return kiln_errorf(KILN_ERR_INVALID, "transform_param.crop_size: %u is larger than the "
                         "resize_param's %u x %u", tp->crop_size, r->width, r->height);
    if (tp->noise_param) KILN_TRY(check_noise(tp->noise_param));
  }
  for (size_t i = 0; i < nsamplers; i++) KILN_TRY(check_sampler(samplers[i], i));
  return KILN_OK;
}

/* ---- the chain --------------------------------------------------------------------------- */

/* A per-channel list as bytes (OpenCV's saturate_cast of a Scalar): none gives 0. */
static int fill_bytes(const float *v, size_t n, int channels, const char *field, uint8_t *out) {
  KILN_TRY(check_count(field, n, channels));
  for (int c = 0; c < channels; c++) {
    const float x = n == 0 ? 0 : v[n == 1 ? 0 : c];
    out[c] = x <= 0 ? 0 : x >= 255 ? 255 : (uint8_t)lrintf(x);
  }
  return KILN_OK;
}

int kiln_anno_augment(kiln_image *img, kiln_anno_boxes *boxes,
                      const Caffe__TransformationParameter *tp,
                      Caffe__BatchSampler *const *samplers, size_t nsamplers, bool train,
                      kiln_rng *rng, kiln_anno_work *w, kiln_anno_report *report) {
  kiln_anno_report rep = {.distort = {.contrast_alpha = 1, .saturation_alpha = 1,
                                      .order = {0, 1, 2}}};
  const int C = img->channels;
  if ((C != 1 && C != 3) || img->height < 1 || img->width < 1)
    return kiln_errorf(KILN_ERR_INVALID, "detection augmentation of a %d x %d image of %d "
                       "channels: 1 or 3 channels, at least a pixel", img->width, img->height, C);
  rep.expand = (kiln_expand_draws){.height = img->height, .width = img->width};

  if (tp && tp->distort_param) {
    kiln_distort_draw(tp->distort_param, C, rng, &rep.distort);
    kiln_distort_apply(img, &rep.distort);
  }
  if (tp && tp->expand_param) {
    uint8_t mean[3];
    KILN_TRY(fill_bytes(tp->mean_value, tp->n_mean_value, C, "transform_param.mean_value", mean));
    kiln_expand_draw(tp->expand_param, img->height, img->width, rng, &rep.expand);
    KILN_TRY(kiln_expand(img, boxes, &rep.expand, mean, tp->emit_constraint, w));
  }
  if (nsamplers > 0) {
    KILN_TRY(kiln_generate_samples(samplers, nsamplers, boxes, rng, &w->samples));
    rep.samples = w->samples.n;
    if (w->samples.n > 0) {
      rep.cropped = true;
      rep.crop = w->samples.v[kiln_rng_below(rng, (uint32_t)w->samples.n)];
      KILN_TRY(kiln_crop(img, boxes, &rep.crop, tp ? tp->emit_constraint : NULL, w));
    }
  }
  if (tp && tp->resize_param) {
    const Caffe__ResizeParameter *r = tp->resize_param;
    uint8_t pad[3];
    KILN_TRY(fill_bytes(r->pad_value, r->n_pad_value, C, "transform_param.resize_param.pad_value",
                        pad));
    rep.resized = true;
    rep.interp = kiln_resize_draw(r, rng);
    KILN_TRY(kiln_resize(img, boxes, r, rep.interp, pad, w));
  }
  /* The net's window: crop_size's crop, else the whole image. The fork applies the emit
   * constraint and the projection here whether or not it crops, which also clips the boxes a
   * resize left partly outside and drops those left without area. */
  if (tp && tp->crop_size) {
    const int cs = (int)tp->crop_size, h = img->height, wd = img->width;
    if (cs > h || cs > wd)
      return kiln_errorf(KILN_ERR_DATA, "transform_param.crop_size %d is larger than the %d x %d "
                         "image it crops", cs, wd, h);
    const int y0 = train ? (int)kiln_rng_below(rng, (uint32_t)(h - cs + 1)) : (h - cs) / 2;
    const int x0 = train ? (int)kiln_rng_below(rng, (uint32_t)(wd - cs + 1)) : (wd - cs) / 2;
    KILN_TRY(kiln_crop_pixels(img, boxes, y0, x0, cs, cs, tp->emit_constraint, w));
  } else {
    const kiln_bbox whole = {0, 0, 1, 1};
    kiln_project_boxes(boxes, &whole, tp ? tp->emit_constraint : NULL);
  }
  if (tp && tp->mirror && kiln_rng_below(rng, 2)) {
    rep.mirrored = true;
    kiln_mirror(img, boxes);
  }
  if (report) *report = rep;
  return KILN_OK;
}
