/* SSD's image-and-box augmentation (include/kiln/anno.h): the photometric distortion on
 * hand-made draws (brightness and contrast exact, OpenCV's ties to even; HSV's round trip,
 * saturation and hue by hand, the hue's wrap; the plane order; gray images), the expansion (the
 * image at its offset, the mean around it, a box on the same pixels), the samplers (every kept
 * crop meets its constraint, over many draws; max_sample, max_trials, use_original_image; scale
 * and aspect bounds), the crop (the pixel rule, the emit rules by hand), the whole chain
 * (deterministic for a seed, another for another seed, the net's size and valid boxes whatever
 * the draws; nothing asked, crop_size, a gray image), and every parameter error naming its
 * field. The resize and the mirror are tests/test_anno_resize.c's. */
#include "anno_test.h"

#include <stdio.h>

#include "kiln/proto.h"

/* ---- helpers ------------------------------------------------------------------------------- */

/* A message of `desc` from prototxt text (freed by the caller with
 * protobuf_c_message_free_unpacked). */
static void *parse(const char *text, const ProtobufCMessageDescriptor *desc) {
  ProtobufCMessage *m = NULL;
  if (kiln_text_parse(text, strlen(text), "test", desc, &m) != KILN_OK)
    fail_msg("parse: %s", kiln_last_error());
  return m;
}

static Caffe__TransformationParameter *transform_of(const char *text) {
  return parse(text, &caffe__transformation_parameter__descriptor);
}

static Caffe__AnnotatedDataParameter *samplers_of(const char *text) {
  return parse(text, &caffe__annotated_data_parameter__descriptor);
}
/* ---- photometric distortion --------------------------------------------------------------- */

static void test_brightness_contrast_by_hand(void **state) {
  (void)state;
  kiln_image img = {0};
  /* two planes' worth of a colour image: 3 x 1 x 4 */
  const uint8_t v[12] = {10, 11, 254, 0, 3, 5, 200, 100, 1, 2, 3, 4};
  image_of(&img, 3, 1, 4, v);
  kiln_distort_draws d = {.brightness = true, .brightness_delta = 2.5f, .contrast_alpha = 1,
                          .saturation_alpha = 1, .order = {0, 1, 2}};
  kiln_distort_apply(&img, &d);
  /* + 2.5, nearest with ties to even (OpenCV's cvRound): 12.5 -> 12, 13.5 -> 14, 5.5 -> 6,
   * 7.5 -> 8, 3.5 -> 4, 4.5 -> 4, 5.5 -> 6, 6.5 -> 6; 256.5 saturates */
  const uint8_t b[12] = {12, 14, 255, 2, 6, 8, 202, 102, 4, 4, 6, 6};
  assert_bytes(img.data, b, 12);

  image_of(&img, 3, 1, 4, v);
  d = (kiln_distort_draws){.contrast = true, .contrast_alpha = 1.5f, .saturation_alpha = 1};
  kiln_distort_apply(&img, &d);
  /* x 1.5: 15, 16.5 -> 16, 381 -> 255, 0, 4.5 -> 4, 7.5 -> 8, 300 -> 255, 150, 1.5 -> 2, 3,
   * 4.5 -> 4, 6 */
  const uint8_t c[12] = {15, 16, 255, 0, 4, 8, 255, 150, 2, 3, 4, 6};
  assert_bytes(img.data, c, 12);

  /* within 1e-3 of 1 the fork leaves the image alone */
  image_of(&img, 3, 1, 4, v);
  d.contrast_alpha = 1.0009f;
  kiln_distort_apply(&img, &d);
  assert_bytes(img.data, v, 12);

  /* both, brightness first in either order: (10 - 3.25) x 2 = 13.5 -> 14 */
  for (int first = 0; first < 2; first++) {
    image_of(&img, 1, 1, 4, v);
    d = (kiln_distort_draws){.saturation_first = first, .brightness = true,
                             .brightness_delta = -3.25f, .contrast = true, .contrast_alpha = 2,
                             .saturation_alpha = 1};
    kiln_distort_apply(&img, &d);
    /* 10, 11, 254, 0 -> 6.75 -> 7, 7.75 -> 8, 250.75 -> 251, 0 (saturated) -> x 2 */
    const uint8_t g[4] = {14, 16, 255, 0};
    assert_bytes(img.data, g, 4);
  }
  kiln_image_free(&img);
}

/* (B, G, R) of one pixel after `d`. */
static void colour_after(const uint8_t bgr[3], const kiln_distort_draws *d, uint8_t out[3]) {
  kiln_image img = {0};
  image_of(&img, 3, 1, 1, bgr);
  kiln_distort_apply(&img, d);
  memcpy(out, img.data, 3);
  kiln_image_free(&img);
}

static void test_hsv_by_hand(void **state) {
  (void)state;
  uint8_t out[3];
  /* hue in OpenCV's half degrees: red (H 0) minus 30 is 300 degrees, magenta, wrapping past 0
   * (the fork's byte arithmetic would stop at 0 and leave red) */
  kiln_distort_draws d = {.hue = true, .hue_delta = -30, .contrast_alpha = 1,
                          .saturation_alpha = 1};
  colour_after((const uint8_t[]){0, 0, 255}, &d, out);
  assert_bytes(out, (const uint8_t[]){255, 0, 255}, 3);
  /* red plus 60 is 120 degrees, green */
  d.hue_delta = 60;
  colour_after((const uint8_t[]){0, 0, 255}, &d, out);
  assert_bytes(out, (const uint8_t[]){0, 255, 0}, 3);
  /* yellow (H 30) plus 170 wraps to 20: 40 degrees, G = 255 x 40 / 60 = 170 */
  d.hue_delta = 170;
  colour_after((const uint8_t[]){0, 255, 255}, &d, out);
  assert_bytes(out, (const uint8_t[]){0, 170, 255}, 3);
  /* saturation: alpha 0 leaves V gray; alpha 2 on (100, 150, 200) makes S 255: H 15 (30
   * degrees), V 200: (0, 100, 200) */
  d = (kiln_distort_draws){.saturation = true, .saturation_alpha = 0, .contrast_alpha = 1};
  colour_after((const uint8_t[]){0, 170, 255}, &d, out);
  assert_bytes(out, (const uint8_t[]){255, 255, 255}, 3);
  d.saturation_alpha = 2;
  colour_after((const uint8_t[]){100, 150, 200}, &d, out);
  assert_bytes(out, (const uint8_t[]){0, 100, 200}, 3);
}

static void test_hsv_round_trip(void **state) {
  (void)state;
  /* Every colour of a coarse grid and many random ones through HSV and back with alpha 1 (the
   * fork converts at alpha 1 too) and with the hue turned by 90 twice (a whole turn): within one
   * level. In OpenCV's byte HSV, (0, 100, 255) alone comes back as (0, 102, 255). */
  kiln_image img = {0};
  enum { N = 7 * 7 * 7 + 2000 };
  uint8_t v[3 * N];
  kiln_rng rng;
  kiln_rng_seed(&rng, 5, 0);
  int k = 0;
  for (int b = 0; b < 7; b++)
    for (int g = 0; g < 7; g++)
      for (int r = 0; r < 7; r++, k++) {
        v[k] = (uint8_t)(b * 255 / 6);
        v[N + k] = (uint8_t)(g * 255 / 6);
        v[2 * N + k] = (uint8_t)(r * 255 / 6);
      }
  for (; k < N; k++)
    for (int c = 0; c < 3; c++) v[c * N + k] = (uint8_t)kiln_rng_below(&rng, 256);
  const kiln_distort_draws sat = {.saturation = true, .saturation_alpha = 1, .contrast_alpha = 1};
  const kiln_distort_draws hue = {.hue = true, .hue_delta = 90, .contrast_alpha = 1,
                                  .saturation_alpha = 1};
  for (int pass = 0; pass < 2; pass++) {
    image_of(&img, 3, 1, N, v);
    if (pass == 0) kiln_distort_apply(&img, &sat);
    else {
      kiln_distort_apply(&img, &hue);
      kiln_distort_apply(&img, &hue);
    }
    for (int i = 0; i < 3 * N; i++)
      if (abs(img.data[i] - v[i]) > 1)
        fail_msg("pass %d, value %d: %d came back as %d", pass, i, v[i], img.data[i]);
  }
  kiln_image_free(&img);
}

static void test_order_and_gray(void **state) {
  (void)state;
  kiln_image img = {0};
  const uint8_t v[6] = {1, 2, 3, 4, 5, 6}; /* 3 planes of 1 x 2 */
  image_of(&img, 3, 1, 2, v);
  const kiln_distort_draws d = {.reorder = true, .order = {2, 0, 1}, .contrast_alpha = 1,
                                .saturation_alpha = 1};
  kiln_distort_apply(&img, &d);
  assert_bytes(img.data, (const uint8_t[]){5, 6, 1, 2, 3, 4}, 6);

  /* a gray image draws brightness and contrast only, whatever the probabilities */
  Caffe__DistortionParameter p = CAFFE__DISTORTION_PARAMETER__INIT;
  p.brightness_prob = p.contrast_prob = p.saturation_prob = p.hue_prob = p.random_order_prob = 1;
  p.brightness_delta = 32;
  p.contrast_lower = 0.5f;
  p.contrast_upper = 1.5f;
  p.saturation_lower = 0.5f;
  p.saturation_upper = 1.5f;
  p.hue_delta = 18;
  kiln_rng rng;
  kiln_rng_seed(&rng, 1, 0);
  int first = 0, permuted = 0;
  for (int i = 0; i < 400; i++) {
    kiln_distort_draws g, c;
    kiln_distort_draw(&p, 1, &rng, &g);
    assert_true(g.brightness && g.contrast && !g.saturation && !g.hue && !g.reorder);
    assert_true(g.brightness_delta >= -32 && g.brightness_delta < 32);
    assert_true(g.contrast_alpha >= 0.5f && g.contrast_alpha < 1.5f);
    kiln_distort_draw(&p, 3, &rng, &c);
    assert_true(c.brightness && c.contrast && c.saturation && c.hue && c.reorder);
    assert_true(c.saturation_alpha >= 0.5f && c.saturation_alpha < 1.5f);
    assert_true(c.hue_delta >= -18 && c.hue_delta < 18);
    assert_int_equal(c.order[0] + c.order[1] + c.order[2], 3);
    assert_true(c.order[0] != c.order[1] && c.order[1] != c.order[2] && c.order[0] != c.order[2]);
    first += c.saturation_first;
    permuted += c.order[0] != 0 || c.order[1] != 1;
  }
  /* the order is a fair coin; 5 of 6 permutations move a plane */
  assert_in_range(first, 150, 250);
  assert_in_range(permuted, 290, 370);
  /* probabilities 0: nothing */
  Caffe__DistortionParameter none = CAFFE__DISTORTION_PARAMETER__INIT;
  kiln_distort_draws z;
  kiln_distort_draw(&none, 3, &rng, &z);
  assert_false(z.brightness || z.contrast || z.saturation || z.hue || z.reorder);
  kiln_image_free(&img);
}

/* ---- expansion ---------------------------------------------------------------------------- */

static void test_expand_places_image_and_boxes(void **state) {
  (void)state;
  kiln_image img = {0};
  kiln_anno_work w = {0};
  kiln_anno_boxes boxes = {0};
  uint8_t v[3 * 2 * 3];
  for (int i = 0; i < 18; i++) v[i] = (uint8_t)(100 + i);
  image_of(&img, 3, 2, 3, v);
  /* the pixel at row 0, column 1, and the whole image */
  add_box(&boxes, 7, 1.0f / 3, 0, 2.0f / 3, 0.5f);
  add_box(&boxes, 8, 0, 0, 1, 1);
  const kiln_expand_draws d = {.expand = true, .height = 4, .width = 6, .h_off = 1, .w_off = 2};
  const uint8_t fill[3] = {1, 2, 3};
  assert_int_equal(kiln_expand(&img, &boxes, &d, fill, NULL, &w), KILN_OK);
  assert_int_equal(img.height, 4);
  assert_int_equal(img.width, 6);
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < 4; y++)
      for (int x = 0; x < 6; x++) {
        const bool in = y >= 1 && y < 3 && x >= 2 && x < 5;
        const int want = in ? v[(c * 2 + y - 1) * 3 + x - 2] : fill[c];
        if (px(&img, c, y, x) != want)
          fail_msg("plane %d (%d, %d): %d, expected %d", c, x, y, px(&img, c, y, x), want);
      }
  assert_int_equal(boxes.n, 2);
  assert_int_equal(boxes.v[0].label, 7);
  assert_box(&boxes.v[0].box, 3.0f / 6, 1.0f / 4, 4.0f / 6, 2.0f / 4);
  assert_box(&boxes.v[1].box, 2.0f / 6, 1.0f / 4, 5.0f / 6, 3.0f / 4);
  /* the first box covers canvas pixel (3, 1), which is the image's (1, 0) */
  const kiln_bbox *b = &boxes.v[0].box;
  assert_int_equal((int)(b->xmin * 6 + 0.5f), 3);
  assert_int_equal((int)(b->xmax * 6 + 0.5f), 4);
  assert_int_equal((int)(b->ymin * 4 + 0.5f), 1);
  for (int c = 0; c < 3; c++) assert_int_equal(px(&img, c, 1, 3), v[(c * 2 + 0) * 3 + 1]);

  /* the draws: offsets inside the canvas, canvas up to the ratio */
  Caffe__ExpansionParameter p = CAFFE__EXPANSION_PARAMETER__INIT;
  p.max_expand_ratio = 4;
  kiln_rng rng;
  kiln_rng_seed(&rng, 3, 0);
  for (int i = 0; i < 500; i++) {
    kiln_expand_draws e;
    kiln_expand_draw(&p, 30, 50, &rng, &e);
    assert_true(e.expand);
    assert_in_range(e.height, 30, 120);
    assert_in_range(e.width, 50, 200);
    assert_in_range(e.h_off, 0, e.height - 30);
    assert_in_range(e.w_off, 0, e.width - 50);
  }
  /* the fork's rule: a ratio within 1e-2 of 1, or prob 0, never expands */
  p.max_expand_ratio = 1.005f;
  for (int i = 0; i < 50; i++) {
    kiln_expand_draws e;
    kiln_expand_draw(&p, 30, 50, &rng, &e);
    assert_false(e.expand);
    assert_int_equal(e.height, 30);
  }
  p.max_expand_ratio = 2;
  p.prob = 0;
  kiln_expand_draws e;
  kiln_expand_draw(&p, 30, 50, &rng, &e);
  assert_false(e.expand);
  /* an absurd ratio: a canvas past kiln's image limits is refused, naming the field */
  p.prob = 1;
  p.max_expand_ratio = 1e9f;
  kiln_expand_draw(&p, 30, 50, &rng, &e);
  assert_true(e.expand && e.height <= KILN_IMAGE_MAX_SIDE + 1);
  assert_int_equal(kiln_expand(&img, &boxes, &e, fill, NULL, &w), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "expand_param.max_expand_ratio"));
  kiln_anno_boxes_free(&boxes);
  kiln_anno_work_free(&w);
  kiln_image_free(&img);
}

/* ---- samplers ----------------------------------------------------------------------------- */

/* The fork's overlap measures, computed here apart from the library's. */
static float inter_area(const kiln_bbox *a, const kiln_bbox *b) {
  const float w = fminf(a->xmax, b->xmax) - fmaxf(a->xmin, b->xmin);
  const float h = fminf(a->ymax, b->ymax) - fmaxf(a->ymin, b->ymin);
  return w > 0 && h > 0 ? w * h : 0;
}
static float area(const kiln_bbox *a) { return (a->xmax - a->xmin) * (a->ymax - a->ymin); }

static void test_samples_meet_constraints(void **state) {
  (void)state;
  /* SSD's own samplers (ssd_pascal.py): the whole image, then crops whose IoU with some object
   * is at least 0.1, 0.3, 0.5, 0.7, 0.9, or at most 1 */
  Caffe__AnnotatedDataParameter *ap = samplers_of(
      "batch_sampler { sampler { min_scale: 1 max_scale: 1 min_aspect_ratio: 1 "
      "max_aspect_ratio: 1 } max_sample: 1 max_trials: 1 }\n"
      "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
      "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.5 } max_sample: 1 "
      "max_trials: 50 }\n"
      "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
      "max_aspect_ratio: 2 } sample_constraint { max_jaccard_overlap: 1 } max_sample: 1 "
      "max_trials: 50 }\n"
      "batch_sampler { sampler { min_scale: 0.1 max_scale: 0.6 min_aspect_ratio: 0.25 "
      "max_aspect_ratio: 4 } sample_constraint { min_sample_coverage: 0.2 "
      "max_sample_coverage: 0.9 min_object_coverage: 0.3 } max_trials: 40 }");
  assert_int_equal(kiln_anno_augment_check(NULL, ap->batch_sampler, ap->n_batch_sampler, 3),
                   KILN_OK);
  kiln_rng rng;
  kiln_rng_seed(&rng, 11, 0);
  kiln_anno_boxes objects = {0};
  kiln_bbox_list out = {0};
  int kept = 0;
  for (int image = 0; image < 300; image++) {
    objects.n = 0;
    const int n = 1 + (int)kiln_rng_below(&rng, 4);
    for (int i = 0; i < n; i++) {
      const float x = kiln_rng_uniform(&rng, 0, 0.8f), y = kiln_rng_uniform(&rng, 0, 0.8f);
      add_box(&objects, 1, x, y, x + kiln_rng_uniform(&rng, 0.05f, 1 - x),
              y + kiln_rng_uniform(&rng, 0.05f, 1 - y));
    }
    /* each sampler on its own, to know which made each crop */
    for (size_t s = 0; s < ap->n_batch_sampler; s++) {
      const Caffe__BatchSampler *b = ap->batch_sampler[s];
      assert_int_equal(kiln_generate_samples(&ap->batch_sampler[s], 1, &objects, &rng, &out),
                       KILN_OK);
      if (b->has_max_sample) assert_true(out.n <= (int)b->max_sample);
      assert_true(out.n <= (int)b->max_trials);
      for (int k = 0; k < out.n; k++, kept++) {
        const kiln_bbox *c = &out.v[k];
        const float w = c->xmax - c->xmin, h = c->ymax - c->ymin;
        const float scale = sqrtf(w * h), ar = w / h;
        const Caffe__Sampler *sp = b->sampler;
        assert_true(c->xmin >= 0 && c->ymin >= 0 && c->xmax <= 1 + 1e-6f && c->ymax <= 1 + 1e-6f);
        assert_true(scale >= sp->min_scale - 1e-4f && scale <= sp->max_scale + 1e-4f);
        assert_true(ar >= fmaxf(sp->min_aspect_ratio, scale * scale) * 0.999f);
        assert_true(ar <= fminf(sp->max_aspect_ratio, 1 / (scale * scale)) * 1.001f);
        const Caffe__SampleConstraint *ct = b->sample_constraint;
        bool met = !ct;
        for (int i = 0; i < objects.n && !met; i++) {
          const kiln_bbox *o = &objects.v[i].box;
          const float in = inter_area(c, o), iou = in / (area(c) + area(o) - in);
          const float sc = in / area(c), oc = in / area(o);
          met = !(ct->has_min_jaccard_overlap && iou < ct->min_jaccard_overlap) &&
                !(ct->has_max_jaccard_overlap && iou > ct->max_jaccard_overlap) &&
                !(ct->has_min_sample_coverage && sc < ct->min_sample_coverage) &&
                !(ct->has_max_sample_coverage && sc > ct->max_sample_coverage) &&
                !(ct->has_min_object_coverage && oc < ct->min_object_coverage);
        }
        if (!met) fail_msg("sampler %zu kept (%g, %g, %g, %g), which meets no object", s,
                           c->xmin, c->ymin, c->xmax, c->ymax);
      }
    }
  }
  assert_true(kept > 300); /* the property was exercised */
  kiln_bbox_list_free(&out);
  kiln_anno_boxes_free(&objects);
  protobuf_c_message_free_unpacked(&ap->base, NULL);
}

static void test_sample_counts(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 2, 0);
  kiln_anno_boxes objects = {0};
  kiln_bbox_list out = {0};
  Caffe__BatchSampler b = CAFFE__BATCH_SAMPLER__INIT;
  Caffe__BatchSampler *bs[1] = {&b};
  /* no constraint: every trial is kept, max_trials of them */
  b.max_trials = 37;
  assert_int_equal(kiln_generate_samples(bs, 1, &objects, &rng, &out), KILN_OK);
  assert_int_equal(out.n, 37);
  /* the default sampler is the whole image */
  assert_box(&out.v[0], 0, 0, 1, 1);
  /* max_sample stops early; the fork's explicit 0 keeps none */
  b.has_max_sample = true;
  b.max_sample = 3;
  assert_int_equal(kiln_generate_samples(bs, 1, &objects, &rng, &out), KILN_OK);
  assert_int_equal(out.n, 3);
  b.max_sample = 0;
  assert_int_equal(kiln_generate_samples(bs, 1, &objects, &rng, &out), KILN_OK);
  assert_int_equal(out.n, 0);
  /* a constraint with no object cannot be met */
  Caffe__SampleConstraint c = CAFFE__SAMPLE_CONSTRAINT__INIT;
  c.has_min_jaccard_overlap = true;
  c.min_jaccard_overlap = 0.1f;
  b.has_max_sample = false;
  b.sample_constraint = &c;
  assert_int_equal(kiln_generate_samples(bs, 1, &objects, &rng, &out), KILN_OK);
  assert_int_equal(out.n, 0);
  /* use_original_image false: the fork samples nothing */
  b.sample_constraint = NULL;
  b.use_original_image = false;
  assert_int_equal(kiln_generate_samples(bs, 1, &objects, &rng, &out), KILN_OK);
  assert_int_equal(out.n, 0);

  /* the constraint by hand: sample (0, 0, 0.5, 0.5) against object (0.25, 0.25, 0.75, 0.75):
   * intersection 1/16, IoU 1/7, each coverage 1/4 */
  add_box(&objects, 1, 0.25f, 0.25f, 0.75f, 0.75f);
  const kiln_bbox s = {0, 0, 0.5f, 0.5f};
  c = (Caffe__SampleConstraint)CAFFE__SAMPLE_CONSTRAINT__INIT;
  assert_true(kiln_sample_satisfies(&s, objects.v, 1, &c)); /* no bound set */
  c.has_min_jaccard_overlap = true;
  c.min_jaccard_overlap = 0.14f;
  assert_true(kiln_sample_satisfies(&s, objects.v, 1, &c));
  c.min_jaccard_overlap = 0.15f;
  assert_false(kiln_sample_satisfies(&s, objects.v, 1, &c));
  c.min_jaccard_overlap = 0.1f;
  c.has_min_object_coverage = true;
  c.min_object_coverage = 0.25f; /* inclusive */
  assert_true(kiln_sample_satisfies(&s, objects.v, 1, &c));
  c.has_max_sample_coverage = true;
  c.max_sample_coverage = 0.2f; /* IoU and object coverage met, sample coverage not */
  assert_false(kiln_sample_satisfies(&s, objects.v, 1, &c));
  /* a second object that meets all three */
  add_box(&objects, 2, 0, 0, 0.1f, 0.1f);
  c.min_object_coverage = 1;
  c.max_sample_coverage = 0.05f;
  c.min_jaccard_overlap = 0.03f; /* its IoU is 0.04 */
  assert_true(kiln_sample_satisfies(&s, objects.v, 2, &c));
  kiln_bbox_list_free(&out);
  kiln_anno_boxes_free(&objects);
}

/* ---- crop --------------------------------------------------------------------------------- */

static void test_crop_rect(void **state) {
  (void)state;
  int y0, x0, ch, cw;
  /* x: floor(2.6) = 2, floor(7.4 - 2.6) = 4; y: 1, floor(6 - 1) = 5 */
  kiln_crop_rect(&(kiln_bbox){0.26f, 0.1f, 0.74f, 0.6f}, 10, 10, &y0, &x0, &ch, &cw);
  assert_int_equal(x0, 2);
  assert_int_equal(cw, 4);
  assert_int_equal(y0, 1);
  assert_int_equal(ch, 5);
  /* outside [0, 1]: clipped first */
  kiln_crop_rect(&(kiln_bbox){-0.5f, 0.5f, 0.5f, 1.5f}, 10, 20, &y0, &x0, &ch, &cw);
  assert_int_equal(x0, 0);
  assert_int_equal(cw, 10);
  assert_int_equal(y0, 5);
  assert_int_equal(ch, 5);
  /* thinner than a pixel: one pixel, inside the image even at the far edge */
  kiln_crop_rect(&(kiln_bbox){0.99f, 0.2f, 1.0f, 0.21f}, 10, 10, &y0, &x0, &ch, &cw);
  assert_int_equal(x0, 9);
  assert_int_equal(cw, 1);
  assert_int_equal(y0, 2);
  assert_int_equal(ch, 1);
  kiln_crop_rect(&(kiln_bbox){1, 1, 1, 1}, 1, 7, &y0, &x0, &ch, &cw);
  assert_int_equal(x0, 6);
  assert_int_equal(cw, 1);
  assert_int_equal(y0, 0);
  assert_int_equal(ch, 1);
}

static void test_crop_emit_rules(void **state) {
  (void)state;
  kiln_image img = {0};
  kiln_anno_work w = {0};
  kiln_anno_boxes boxes = {0};
  uint8_t v[16];
  for (int i = 0; i < 16; i++) v[i] = (uint8_t)i;
  Caffe__EmitConstraint center = CAFFE__EMIT_CONSTRAINT__INIT;
  Caffe__EmitConstraint overlap = CAFFE__EMIT_CONSTRAINT__INIT;
  overlap.emit_type = CAFFE__EMIT_CONSTRAINT__EMIT_TYPE__MIN_OVERLAP;
  const Caffe__EmitConstraint *rules[4] = {NULL, &center, &overlap, &overlap};
  const float overlaps[4] = {0, 0, 0.1f, 0.2f};
  /* which of boxes A .. E each rule keeps */
  const int kept[4][5] = {{1, 1, 0, 0, 1}, {1, 0, 0, 0, 1}, {1, 1, 0, 0, 1}, {1, 0, 0, 0, 1}};
  for (int r = 0; r < 4; r++) {
    image_of(&img, 1, 4, 4, v);
    boxes.n = 0;
    add_box(&boxes, 1, 0.1f, 0.1f, 0.4f, 0.4f);   /* A: inside */
    add_box(&boxes, 2, 0.3f, 0.3f, 0.9f, 0.9f);   /* B: centre out, 1/9 of it in */
    add_box(&boxes, 3, 0.6f, 0.6f, 0.9f, 0.9f);   /* C: outside */
    add_box(&boxes, 4, 0.5f, 0.0f, 0.8f, 0.2f);   /* D: touching the edge only */
    add_box(&boxes, 5, 0.25f, 0.25f, 0.5f, 0.5f); /* E: centre inside, edge on the crop's */
    overlap.emit_overlap = overlaps[r];
    assert_int_equal(kiln_crop(&img, &boxes, &(kiln_bbox){0, 0, 0.5f, 0.5f}, rules[r], &w),
                     KILN_OK);
    assert_int_equal(img.height, 2);
    assert_int_equal(img.width, 2);
    assert_bytes(img.data, (const uint8_t[]){0, 1, 4, 5}, 4);
    int n = 0;
    for (int b = 0; b < 5; b++) {
      if (!kept[r][b]) continue;
      if (n >= boxes.n || boxes.v[n].label != b + 1)
        fail_msg("rule %d: box %c should have been kept", r, 'A' + b);
      n++;
    }
    assert_int_equal(boxes.n, n);
    assert_box(&boxes.v[0].box, 0.2f, 0.2f, 0.8f, 0.8f);
    if (kept[r][1]) assert_box(&boxes.v[1].box, 0.6f, 0.6f, 1, 1); /* clipped */
    assert_box(&boxes.v[n - 1].box, 0.5f, 0.5f, 1, 1);
  }
  /* the window follows the pixels, not the drawn box: x 0.3 .. 0.8 of 4 pixels is pixel 1
   * and 2 (floor(1.2) = 1, floor(3.2 - 1.2) = 2), so the window is 0.25 .. 0.75 */
  image_of(&img, 1, 4, 4, v);
  boxes.n = 0;
  add_box(&boxes, 1, 0.25f, 0, 0.5f, 1);
  assert_int_equal(kiln_crop(&img, &boxes, &(kiln_bbox){0.3f, 0, 0.8f, 1}, NULL, &w), KILN_OK);
  assert_int_equal(img.width, 2);
  assert_int_equal(px(&img, 0, 0, 0), 1);
  assert_box(&boxes.v[0].box, 0, 0, 0.5f, 1);
  /* pixels outside the image are refused */
  assert_int_equal(kiln_crop_pixels(&img, &boxes, 0, 1, 4, 2, NULL, &w), KILN_ERR_INVALID);
  kiln_anno_boxes_free(&boxes);
  kiln_anno_work_free(&w);
  kiln_image_free(&img);
}

/* ---- the chain ---------------------------------------------------------------------------- */

/* SSD300's training transform and samplers (the fork's ssd_pascal.py), at 30 x 30 */
static const char *ssd_transform =
    "mirror: true mean_value: 104 mean_value: 117 mean_value: 123\n"
    "resize_param { prob: 1 resize_mode: WARP height: 30 width: 30 interp_mode: LINEAR "
    "interp_mode: AREA interp_mode: NEAREST interp_mode: CUBIC interp_mode: LANCZOS4 }\n"
    "emit_constraint { emit_type: CENTER }\n"
    "distort_param { brightness_prob: 0.5 brightness_delta: 32 contrast_prob: 0.5 "
    "contrast_lower: 0.5 contrast_upper: 1.5 hue_prob: 0.5 hue_delta: 18 saturation_prob: 0.5 "
    "saturation_lower: 0.5 saturation_upper: 1.5 random_order_prob: 0.0 }\n"
    "expand_param { prob: 0.5 max_expand_ratio: 4.0 }\n";

static const char *ssd_samplers =
    "batch_sampler { sampler { min_scale: 1 max_scale: 1 min_aspect_ratio: 1 max_aspect_ratio: 1 }"
    " max_sample: 1 max_trials: 1 }\n"
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.1 } max_sample: 1 "
    "max_trials: 50 }\n"
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.3 } max_sample: 1 "
    "max_trials: 50 }\n"
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.5 } max_sample: 1 "
    "max_trials: 50 }\n"
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.7 } max_sample: 1 "
    "max_trials: 50 }\n"
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.9 } max_sample: 1 "
    "max_trials: 50 }\n"
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { max_jaccard_overlap: 1 } max_sample: 1 "
    "max_trials: 50 }\n";

/* A 3 x 40 x 60 image of noise and three boxes, into img and boxes. */
static void record(kiln_image *img, kiln_anno_boxes *boxes) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 77, 0);
  image_of(img, 3, 40, 60, NULL);
  for (int i = 0; i < 3 * 40 * 60; i++) img->data[i] = (uint8_t)kiln_rng_below(&rng, 256);
  boxes->n = 0;
  add_box(boxes, 3, 0.1f, 0.2f, 0.5f, 0.6f);
  add_box(boxes, 12, 0.4f, 0.1f, 0.95f, 0.9f);
  add_box(boxes, 3, 0.7f, 0.7f, 0.8f, 0.85f);
}

static void test_chain_deterministic(void **state) {
  (void)state;
  Caffe__TransformationParameter *tp = transform_of(ssd_transform);
  Caffe__AnnotatedDataParameter *ap = samplers_of(ssd_samplers);
  assert_int_equal(kiln_anno_augment_check(tp, ap->batch_sampler, ap->n_batch_sampler, 3), KILN_OK);
  kiln_image a = {0}, b = {0};
  kiln_anno_boxes ba = {0}, bb = {0};
  kiln_anno_work w = {0}, w2 = {0};
  int differ = 0, mirrored = 0, cropped = 0, expanded = 0, interp[6] = {0};
  for (uint64_t seed = 1; seed <= 200; seed++) {
    kiln_rng r1, r2;
    kiln_anno_report rep;
    /* the same seed twice, through two different work areas: the same bytes and boxes */
    record(&a, &ba);
    record(&b, &bb);
    kiln_rng_seed(&r1, 1234, seed);
    kiln_rng_seed(&r2, 1234, seed);
    assert_int_equal(kiln_anno_augment(&a, &ba, tp, ap->batch_sampler, ap->n_batch_sampler, true,
                                       &r1, &w, &rep), KILN_OK);
    assert_int_equal(kiln_anno_augment(&b, &bb, tp, ap->batch_sampler, ap->n_batch_sampler, true,
                                       &r2, &w2, NULL), KILN_OK);
    assert_int_equal(a.height, 30);
    assert_int_equal(a.width, 30);
    assert_int_equal(b.height, 30);
    assert_bytes(a.data, b.data, 3 * 30 * 30);
    assert_int_equal(ba.n, bb.n);
    assert_memory_equal(ba.v, bb.v, (size_t)ba.n * sizeof *ba.v);
    for (int i = 0; i < ba.n; i++) {
      const kiln_bbox *x = &ba.v[i].box;
      assert_true(x->xmin >= 0 && x->ymin >= 0 && x->xmax <= 1 && x->ymax <= 1);
      assert_true(x->xmax > x->xmin && x->ymax > x->ymin);
      assert_true(ba.v[i].label == 3 || ba.v[i].label == 12);
    }
    mirrored += rep.mirrored;
    cropped += rep.cropped;
    expanded += rep.expand.expand;
    assert_true(rep.resized);
    interp[rep.interp]++;
    /* the next record position: another result */
    record(&b, &bb);
    kiln_rng_seed(&r2, 1234, seed + 1000);
    assert_int_equal(kiln_anno_augment(&b, &bb, tp, ap->batch_sampler, ap->n_batch_sampler, true,
                                       &r2, &w2, NULL), KILN_OK);
    differ += memcmp(a.data, b.data, 3 * 30 * 30) != 0;
  }
  assert_int_equal(differ, 200);
  assert_in_range(mirrored, 70, 130);
  assert_in_range(expanded, 70, 130);
  assert_true(cropped >= 195); /* the whole-image sampler always keeps one */
  for (int m = 1; m <= 5; m++) assert_in_range(interp[m], 20, 60);
  /* the same sizes again allocate nothing: the buffers are the work's and the image's */
  const size_t cap = w.img_cap;
  record(&a, &ba);
  kiln_rng r;
  kiln_rng_seed(&r, 1234, 1);
  assert_int_equal(kiln_anno_augment(&a, &ba, tp, ap->batch_sampler, ap->n_batch_sampler, true,
                                     &r, &w, NULL), KILN_OK);
  assert_int_equal(w.img_cap, cap);
  kiln_anno_boxes_free(&ba);
  kiln_anno_boxes_free(&bb);
  kiln_anno_work_free(&w);
  kiln_anno_work_free(&w2);
  kiln_image_free(&a);
  kiln_image_free(&b);
  protobuf_c_message_free_unpacked(&tp->base, NULL);
  protobuf_c_message_free_unpacked(&ap->base, NULL);
}

static void test_chain_pieces(void **state) {
  (void)state;
  kiln_image img = {0};
  kiln_anno_boxes boxes = {0};
  kiln_anno_work w = {0};
  kiln_rng rng;
  kiln_rng_seed(&rng, 1, 0);
  /* nothing asked: the image as it was, boxes clipped and the empty one dropped */
  Caffe__TransformationParameter *tp = transform_of("scale: 0.5");
  record(&img, &boxes);
  uint8_t before[3 * 40 * 60];
  memcpy(before, img.data, sizeof before);
  add_box(&boxes, 5, 0.5f, 0.5f, 0.5f, 0.9f);
  add_box(&boxes, 6, -0.2f, 0.9f, 0.3f, 1.3f);
  assert_int_equal(kiln_anno_augment(&img, &boxes, tp, NULL, 0, true, &rng, &w, NULL), KILN_OK);
  assert_bytes(img.data, before, sizeof before);
  assert_int_equal(boxes.n, 4);
  assert_int_equal(boxes.v[3].label, 6);
  assert_box(&boxes.v[3].box, 0, 0.9f, 0.3f, 1);
  protobuf_c_message_free_unpacked(&tp->base, NULL);

  /* crop_size in TEST: the centre 20 x 20 of 40 x 60, boxes onto it with the emit rule */
  tp = transform_of("crop_size: 20 emit_constraint { emit_type: CENTER }");
  record(&img, &boxes);
  boxes.n = 0;
  add_box(&boxes, 1, 0.35f, 0.3f, 0.55f, 0.5f); /* centre (0.45, 0.4): inside */
  add_box(&boxes, 2, 0, 0, 0.3f, 0.3f);         /* centre (0.15, 0.15) */
  add_box(&boxes, 3, 0.6f, 0.6f, 0.9f, 0.9f);   /* centre (0.75, 0.75), partly inside */
  assert_int_equal(kiln_anno_augment(&img, &boxes, tp, NULL, 0, false, &rng, &w, NULL), KILN_OK);
  assert_int_equal(img.height, 20);
  assert_int_equal(img.width, 20);
  assert_bytes(img.data, before + 10 * 60 + 20, 20);
  /* the window is x 1/3 .. 2/3, y 1/4 .. 3/4: only the first box's centre is inside */
  assert_int_equal(boxes.n, 1);
  assert_int_equal(boxes.v[0].label, 1);
  assert_box(&boxes.v[0].box, 0.05f, 0.1f, 0.65f, 0.5f);
  protobuf_c_message_free_unpacked(&tp->base, NULL);

  /* a gray image through distortion and expansion: one plane, the mean's first value */
  tp = transform_of("mean_value: 50 distort_param { brightness_prob: 1 brightness_delta: 10 "
                    "saturation_prob: 1 saturation_lower: 0 saturation_upper: 0 hue_prob: 1 "
                    "hue_delta: 90 random_order_prob: 1 } expand_param { prob: 1 "
                    "max_expand_ratio: 3 }");
  assert_int_equal(kiln_anno_augment_check(tp, NULL, 0, 1), KILN_OK);
  image_of(&img, 1, 5, 5, NULL);
  memset(img.data, 100, 25);
  boxes.n = 0;
  add_box(&boxes, 1, 0, 0, 1, 1);
  kiln_anno_report rep;
  assert_int_equal(kiln_anno_augment(&img, &boxes, tp, NULL, 0, true, &rng, &w, &rep), KILN_OK);
  assert_false(rep.distort.saturation || rep.distort.hue || rep.distort.reorder);
  assert_true(rep.expand.expand);
  assert_int_equal(img.channels, 1);
  const int v = 100 + (int)lrintf(rep.distort.brightness_delta);
  int inside = 0, mean = 0;
  for (int i = 0; i < img.height * img.width; i++) {
    inside += img.data[i] == v;
    mean += img.data[i] == 50;
  }
  assert_int_equal(inside, 25);
  assert_int_equal(inside + mean, img.height * img.width);
  assert_box(&boxes.v[0].box, (float)rep.expand.w_off / img.width,
             (float)rep.expand.h_off / img.height, (float)(rep.expand.w_off + 5) / img.width,
             (float)(rep.expand.h_off + 5) / img.height);
  /* a colour image then meets a mean of the wrong count */
  image_of(&img, 3, 5, 5, NULL);
  assert_int_equal(tp->n_mean_value, 1); /* fine: one for all */
  assert_int_equal(kiln_anno_augment(&img, &boxes, tp, NULL, 0, true, &rng, &w, NULL), KILN_OK);
  float two[2] = {1, 2}, *parsed = tp->mean_value;
  tp->mean_value = two;
  tp->n_mean_value = 2;
  image_of(&img, 3, 5, 5, NULL);
  assert_int_equal(kiln_anno_augment(&img, &boxes, tp, NULL, 0, true, &rng, &w, NULL),
                   KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "transform_param.mean_value"));
  tp->n_mean_value = 1;
  tp->mean_value = parsed;
  protobuf_c_message_free_unpacked(&tp->base, NULL);
  kiln_anno_boxes_free(&boxes);
  kiln_anno_work_free(&w);
  kiln_image_free(&img);
}

/* ---- parameter errors --------------------------------------------------------------------- */

static void test_errors_name_the_field(void **state) {
  (void)state;
  static const struct {
    const char *transform, *samplers;
    int channels, code;
    const char *field;
  } cases[] = {
      {"distort_param { brightness_prob: 1.5 }", "", 3, KILN_ERR_INVALID,
       "distort_param.brightness_prob"},
      {"distort_param { brightness_delta: -1 }", "", 3, KILN_ERR_INVALID,
       "distort_param.brightness_delta"},
      {"distort_param { contrast_lower: 1.5 contrast_upper: 0.5 }", "", 3, KILN_ERR_INVALID,
       "distort_param.contrast_lower"},
      {"distort_param { saturation_lower: -0.5 saturation_upper: 0.5 }", "", 3, KILN_ERR_INVALID,
       "distort_param.saturation_lower"},
      {"distort_param { hue_prob: -0.1 }", "", 3, KILN_ERR_INVALID, "distort_param.hue_prob"},
      {"distort_param { hue_delta: -3 }", "", 3, KILN_ERR_INVALID, "distort_param.hue_delta"},
      {"distort_param { random_order_prob: 2 }", "", 3, KILN_ERR_INVALID,
       "distort_param.random_order_prob"},
      {"expand_param { prob: 1.1 }", "", 3, KILN_ERR_INVALID, "expand_param.prob"},
      {"expand_param { max_expand_ratio: 0.5 }", "", 3, KILN_ERR_INVALID,
       "expand_param.max_expand_ratio"},
      {"mean_file: 'm.binaryproto' expand_param { max_expand_ratio: 4 }", "", 3,
       KILN_ERR_UNSUPPORTED, "transform_param.mean_file"},
      {"mean_value: 1 mean_value: 2", "", 3, KILN_ERR_INVALID, "transform_param.mean_value"},
      {"emit_constraint { emit_type: MIN_OVERLAP emit_overlap: 1.5 }", "", 3, KILN_ERR_INVALID,
       "emit_constraint.emit_overlap"},
      {"resize_param { width: 300 }", "", 3, KILN_ERR_INVALID, "resize_param.height"},
      {"resize_param { height: 300 }", "", 3, KILN_ERR_INVALID, "resize_param.width"},
      {"resize_param { height: 3 width: 3 pad_value: 1 pad_value: 2 }", "", 3, KILN_ERR_INVALID,
       "resize_param.pad_value"},
      {"crop_size: 40 resize_param { height: 30 width: 30 }", "", 3, KILN_ERR_INVALID,
       "transform_param.crop_size"},
      {"noise_param { prob: 0.5 }", "", 3, KILN_ERR_UNSUPPORTED, "noise_param.prob"},
      {"noise_param { decolorize: true }", "", 3, KILN_ERR_UNSUPPORTED, "noise_param.decolorize"},
      {"noise_param { jpeg: 50 }", "", 3, KILN_ERR_UNSUPPORTED, "noise_param.jpeg"},
      {"", "batch_sampler { } batch_sampler { sampler { min_scale: 0 } }", 3, KILN_ERR_INVALID,
       "batch_sampler[1].sampler.min_scale"},
      {"", "batch_sampler { sampler { max_scale: 1.5 } }", 3, KILN_ERR_INVALID,
       "batch_sampler[0].sampler.max_scale"},
      {"", "batch_sampler { sampler { min_scale: 0.8 max_scale: 0.5 } }", 3, KILN_ERR_INVALID,
       "batch_sampler[0].sampler.min_scale"},
      {"", "batch_sampler { sampler { min_aspect_ratio: 0 } }", 3, KILN_ERR_INVALID,
       "batch_sampler[0].sampler.min_aspect_ratio"},
      {"", "batch_sampler { sampler { min_aspect_ratio: 2 max_aspect_ratio: 0.5 } }", 3,
       KILN_ERR_INVALID, "batch_sampler[0].sampler.min_aspect_ratio"},
      {"", "batch_sampler { sample_constraint { min_jaccard_overlap: 1.2 } }", 3,
       KILN_ERR_INVALID, "batch_sampler[0].sample_constraint.min_jaccard_overlap"},
      {"", "batch_sampler { sample_constraint { min_object_coverage: 0.8 "
           "max_object_coverage: 0.2 } }", 3, KILN_ERR_INVALID,
       "batch_sampler[0].sample_constraint.min_object_coverage"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Caffe__TransformationParameter *tp = transform_of(cases[i].transform);
    Caffe__AnnotatedDataParameter *ap = samplers_of(cases[i].samplers);
    const int rc = kiln_anno_augment_check(tp, ap->batch_sampler, ap->n_batch_sampler,
                                           cases[i].channels);
    if (rc != cases[i].code || !strstr(kiln_last_error(), cases[i].field))
      fail_msg("case %zu (%s%s): %s, \"%s\"; expected %s naming %s", i, cases[i].transform,
               cases[i].samplers, kiln_status_name(rc), kiln_last_error(),
               kiln_status_name(cases[i].code), cases[i].field);
    protobuf_c_message_free_unpacked(&tp->base, NULL);
    protobuf_c_message_free_unpacked(&ap->base, NULL);
  }
  /* what passes: SSD's own, an empty noise block, mean_file without expansion, counts unknown */
  Caffe__TransformationParameter *tp = transform_of(ssd_transform);
  Caffe__AnnotatedDataParameter *ap = samplers_of(ssd_samplers);
  assert_int_equal(kiln_anno_augment_check(tp, ap->batch_sampler, ap->n_batch_sampler, 0), KILN_OK);
  assert_int_equal(kiln_anno_augment_check(tp, ap->batch_sampler, ap->n_batch_sampler, 1),
                   KILN_ERR_INVALID); /* three means for a gray image */
  protobuf_c_message_free_unpacked(&tp->base, NULL);
  tp = transform_of("mean_file: 'm' noise_param { prob: 0 } expand_param { prob: 0 "
                    "max_expand_ratio: 4 } resize_param { height: 3 width: 5 pad_value: 1 }");
  assert_int_equal(kiln_anno_augment_check(tp, NULL, 0, 3), KILN_OK);
  protobuf_c_message_free_unpacked(&tp->base, NULL);
  protobuf_c_message_free_unpacked(&ap->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_brightness_contrast_by_hand),
      cmocka_unit_test(test_hsv_by_hand),
      cmocka_unit_test(test_hsv_round_trip),
      cmocka_unit_test(test_order_and_gray),
      cmocka_unit_test(test_expand_places_image_and_boxes),
      cmocka_unit_test(test_samples_meet_constraints),
      cmocka_unit_test(test_sample_counts),
      cmocka_unit_test(test_crop_rect),
      cmocka_unit_test(test_crop_emit_rules),
      cmocka_unit_test(test_chain_deterministic),
      cmocka_unit_test(test_chain_pieces),
      cmocka_unit_test(test_errors_name_the_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
