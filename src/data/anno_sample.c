/* SSD's batch samplers (AnnotatedData's batch_sampler): crops of the image drawn by scale and
 * aspect ratio, kept when they meet a constraint against the image's objects. The layer then
 * takes one of the kept crops at random (anno_augment.c). */
#include <math.h>
#include <stdlib.h>

#include "kiln/anno.h"

void kiln_bbox_list_free(kiln_bbox_list *l) {
  if (!l) return;
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

static int list_add(kiln_bbox_list *l, const kiln_bbox *b) {
  if (l->n == l->cap) {
    const int cap = l->cap ? 2 * l->cap : 64;
    kiln_bbox *v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the samplers' crops");
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *b;
  return KILN_OK;
}

void kiln_sample_box(const Caffe__Sampler *s, kiln_rng *rng, kiln_bbox *out) {
  const float min_scale = s ? s->min_scale : 1, max_scale = s ? s->max_scale : 1;
  const float min_ar = s ? s->min_aspect_ratio : 1, max_ar = s ? s->max_aspect_ratio : 1;
  const float scale = kiln_rng_uniform(rng, min_scale, max_scale);
  float ar = kiln_rng_uniform(rng, min_ar, max_ar);
  /* held so that neither side exceeds the image's */
  const float lo = scale * scale, hi = 1 / (scale * scale);
  ar = ar < lo ? lo : ar > hi ? hi : ar;
  float w = scale * sqrtf(ar), h = scale / sqrtf(ar);
  if (w > 1) w = 1; /* rounding at the bounds */
  if (h > 1) h = 1;
  const float x0 = kiln_rng_uniform(rng, 0, 1 - w), y0 = kiln_rng_uniform(rng, 0, 1 - h);
  *out = (kiln_bbox){x0, y0, x0 + w, y0 + h};
}

/* Part of a's area that b covers. */
static float coverage(const kiln_bbox *a, const kiln_bbox *b) {
  kiln_bbox i;
  if (!kiln_bbox_intersect(a, b, &i)) return 0;
  const float area = kiln_bbox_size(a, true);
  return area > 0 ? kiln_bbox_size(&i, true) / area : 0;
}

/* v within the bounds that are set. */
static bool within(float v, protobuf_c_boolean has_min, float min, protobuf_c_boolean has_max,
                   float max) {
  return !(has_min && v < min) && !(has_max && v > max);
}

bool kiln_sample_satisfies(const kiln_bbox *sample, const kiln_anno_box *objects, int n,
                           const Caffe__SampleConstraint *c) {
  if (!c) return true;
  const bool jaccard = c->has_min_jaccard_overlap || c->has_max_jaccard_overlap;
  const bool sample_cov = c->has_min_sample_coverage || c->has_max_sample_coverage;
  const bool object_cov = c->has_min_object_coverage || c->has_max_object_coverage;
  if (!jaccard && !sample_cov && !object_cov) return true;
  /* One object must meet every bound. The fork's loop keeps a first kind's success when a
   * later kind fails for the same object, which differs only where one sampler mixes kinds of
   * bound; none of its published nets does. */
  for (int i = 0; i < n; i++) {
    const kiln_bbox *o = &objects[i].box;
    if (jaccard && !within(kiln_bbox_iou(sample, o), c->has_min_jaccard_overlap,
                           c->min_jaccard_overlap, c->has_max_jaccard_overlap,
                           c->max_jaccard_overlap))
      continue;
    if (sample_cov && !within(coverage(sample, o), c->has_min_sample_coverage,
                              c->min_sample_coverage, c->has_max_sample_coverage,
                              c->max_sample_coverage))
      continue;
    if (object_cov && !within(coverage(o, sample), c->has_min_object_coverage,
                              c->min_object_coverage, c->has_max_object_coverage,
                              c->max_object_coverage))
      continue;
    return true;
  }
  return false;
}

int kiln_generate_samples(Caffe__BatchSampler *const *samplers, size_t n,
                          const kiln_anno_boxes *objects, kiln_rng *rng, kiln_bbox_list *out) {
  out->n = 0;
  for (size_t s = 0; s < n; s++) {
    const Caffe__BatchSampler *b = samplers[s];
    if (!b->use_original_image) continue; /* the fork samples nothing else */
    uint32_t found = 0;
    for (uint32_t t = 0; t < b->max_trials; t++) {
      /* the fork's test is has_max_sample: an explicit 0 keeps nothing */
      if (b->has_max_sample && found >= b->max_sample) break;
      kiln_bbox box;
      kiln_sample_box(b->sampler, rng, &box);
      if (kiln_sample_satisfies(&box, objects->v, objects->n, b->sample_constraint)) {
        found++;
        KILN_TRY(list_add(out, &box));
      }
    }
  }
  return KILN_OK;
}
