/* SSD's photometric distortion (distort_param): brightness, contrast, saturation, hue and the
 * order of the colour planes, each with its own probability, in one of the fork's two orders.
 *
 * The draws and their application are apart (kiln_distort_draw, kiln_distort_apply) so that
 * the arithmetic can be checked on hand-made draws. Saturation and hue pass through HSV on
 * OpenCV's 8-bit scales, which is what the fork's parameters are in (hue_delta 18 is 36
 * degrees), but the HSV values stay in float: OpenCV's byte HSV quantises the hue to 2 degrees,
 * and a saturated colour then comes back up to 4 levels off even when nothing was changed, an
 * error the fork adds to every distorted image (its saturation step converts even at alpha 1).
 * Here an identity alpha or delta gives the image back within rounding. */
#include <math.h>
#include <stddef.h>

#include "kiln/anno.h"

/* The six orders of three planes, for a uniform shuffle. */
static const uint8_t perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                    {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

static bool happens(kiln_rng *rng, float prob) { return kiln_rng_uniform(rng, 0, 1) < prob; }

static void draw_contrast(const Caffe__DistortionParameter *p, kiln_rng *rng,
                          kiln_distort_draws *d) {
  if ((d->contrast = happens(rng, p->contrast_prob)))
    d->contrast_alpha = kiln_rng_uniform(rng, p->contrast_lower, p->contrast_upper);
}

static void draw_colour(const Caffe__DistortionParameter *p, kiln_rng *rng,
                        kiln_distort_draws *d) {
  if ((d->saturation = happens(rng, p->saturation_prob)))
    d->saturation_alpha = kiln_rng_uniform(rng, p->saturation_lower, p->saturation_upper);
  if ((d->hue = happens(rng, p->hue_prob)))
    d->hue_delta = kiln_rng_uniform(rng, -p->hue_delta, p->hue_delta);
}

void kiln_distort_draw(const Caffe__DistortionParameter *p, int channels, kiln_rng *rng,
                       kiln_distort_draws *d) {
  *d = (kiln_distort_draws){.contrast_alpha = 1, .saturation_alpha = 1, .order = {0, 1, 2}};
  const bool colour = channels == 3;
  d->saturation_first = kiln_rng_uniform(rng, 0, 1) <= 0.5f;
  if ((d->brightness = happens(rng, p->brightness_prob)))
    d->brightness_delta = kiln_rng_uniform(rng, -p->brightness_delta, p->brightness_delta);
  if (d->saturation_first) {
    if (colour) draw_colour(p, rng, d);
    draw_contrast(p, rng, d);
  } else {
    draw_contrast(p, rng, d);
    if (colour) draw_colour(p, rng, d);
  }
  if (colour && (d->reorder = happens(rng, p->random_order_prob))) {
    const uint8_t *perm = perms[kiln_rng_below(rng, 6)];
    for (int c = 0; c < 3; c++) d->order[c] = perm[c];
  }
}

/* A float to a byte as OpenCV's saturate_cast does: nearest, ties to even, then held to
 * 0 .. 255. */
static uint8_t sat_round(float v) {
  if (!(v > 0)) return 0; /* NaN too */
  if (v >= 255) return 255;
  return (uint8_t)lrintf(v);
}

/* ---- HSV on OpenCV's 8-bit scales, in float --------------------------------------------- */

/* H in [0, 180) (half degrees), S and V in [0, 255]. */
static void to_hsv(float b, float g, float r, float *h, float *s, float *v) {
  const float mx = fmaxf(b, fmaxf(g, r)), mn = fminf(b, fminf(g, r)), d = mx - mn;
  *v = mx;
  *s = mx > 0 ? 255 * d / mx : 0;
  float hh = 0;
  if (d > 0) {
    if (mx == r) hh = 30 * (g - b) / d;
    else if (mx == g) hh = 60 + 30 * (b - r) / d;
    else hh = 120 + 30 * (r - g) / d;
    if (hh < 0) hh += 180;
  }
  *h = hh;
}

static void from_hsv(float h, float s, float v, float *b, float *g, float *r) {
  if (s <= 0) {
    *b = *g = *r = v;
    return;
  }
  float x = h / 30; /* sixths of the circle */
  x -= 6 * floorf(x / 6);
  int sector = (int)x;
  if (sector > 5) sector = 5; /* x just below 6 rounding up */
  const float f = x - (float)sector, sn = s / 255;
  const float p = v * (1 - sn), q = v * (1 - sn * f), t = v * (1 - sn * (1 - f));
  switch (sector) {
  case 0: *r = v, *g = t, *b = p; break;
  case 1: *r = q, *g = v, *b = p; break;
  case 2: *r = p, *g = v, *b = t; break;
  case 3: *r = p, *g = q, *b = v; break;
  case 4: *r = t, *g = p, *b = v; break;
  default: *r = v, *g = p, *b = q; break;
  }
}

/* One pass over the pixels in HSV: S times alpha (held to 255), H plus delta (mod 180). */
static void adjust_hsv(kiln_image *img, float alpha, float delta) {
  const size_t n = (size_t)img->height * img->width;
  uint8_t *B = img->data, *G = B + n, *R = G + n;
  for (size_t i = 0; i < n; i++) {
    float h, s, v, b, g, r;
    to_hsv(B[i], G[i], R[i], &h, &s, &v);
    s = fminf(s * alpha, 255);
    h += delta;
    h -= 180 * floorf(h / 180);
    from_hsv(h, s, v, &b, &g, &r);
    B[i] = sat_round(b);
    G[i] = sat_round(g);
    R[i] = sat_round(r);
  }
}

/* v alpha + beta over every value (OpenCV's convertTo). */
static void scale_shift(kiln_image *img, float alpha, float beta) {
  const size_t n = (size_t)img->channels * img->height * img->width;
  for (size_t i = 0; i < n; i++) img->data[i] = sat_round(img->data[i] * alpha + beta);
}

static void apply_contrast(kiln_image *img, const kiln_distort_draws *d) {
  /* the fork leaves alphas within 1e-3 of 1 alone */
  if (d->contrast && fabsf(d->contrast_alpha - 1) > 1e-3f) scale_shift(img, d->contrast_alpha, 0);
}

static void apply_colour(kiln_image *img, const kiln_distort_draws *d) {
  if (img->channels != 3) return;
  if (d->saturation) adjust_hsv(img, d->saturation_alpha, 0);
  if (d->hue && d->hue_delta != 0) adjust_hsv(img, 1, d->hue_delta);
}

void kiln_distort_apply(kiln_image *img, const kiln_distort_draws *d) {
  if (d->brightness && d->brightness_delta != 0) scale_shift(img, 1, d->brightness_delta);
  if (d->saturation_first) {
    apply_colour(img, d);
    apply_contrast(img, d);
  } else {
    apply_contrast(img, d);
    apply_colour(img, d);
  }
  if (d->reorder && img->channels == 3) {
    /* the planes exchanged in place, a pixel at a time: no second image */
    const size_t n = (size_t)img->height * img->width;
    uint8_t *p[3] = {img->data, img->data + n, img->data + 2 * n};
    for (size_t i = 0; i < n; i++) {
      const uint8_t v[3] = {p[0][i], p[1][i], p[2][i]};
      for (int c = 0; c < 3; c++) p[c][i] = v[d->order[c]];
    }
  }
}

void kiln_distort(kiln_image *img, const Caffe__DistortionParameter *p, kiln_rng *rng) {
  kiln_distort_draws d;
  kiln_distort_draw(p, img->channels, rng, &d);
  kiln_distort_apply(img, &d);
}
