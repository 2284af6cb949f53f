/* kiln anno: SSD's augmentation of a training image together with its objects' boxes, as the
 * fork's AnnotatedData layer does it (transform_param's distort_param, expand_param,
 * resize_param, emit_constraint, crop_size and mirror, and the layer's batch_sampler), on host
 * planes (src/data/anno_*.c, image_warp.c; docs/detection.md, "Detection augmentation").
 *
 * Its boxes are data.h's kiln_anno_box, which the AnnotatedDatum reader fills. */
#ifndef KILN_ANNO_H
#define KILN_ANNO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.pb-c.h"
#include "kiln/data.h"
#include "kiln/detect.h"
#include "kiln/rng.h"

/* Every draw comes from the kiln_rng the caller passes, so what an image becomes is a function
 * of that generator's state; every buffer is the caller's kiln_anno_work, grown once to the
 * largest image seen and reused. Each step has a function taking its drawn values (what the
 * tests use) and one that draws them. The order of the whole chain is kiln_anno_augment's.
 * Mean subtraction and scaling are left to the layer. */

/* The boxes are data.h's kiln_anno_box: label, instance id, box normalised to the image,
 * difficult. */

/* An image's objects, in order (the steps below keep the order, dropping boxes in place).
 * Zero-initialise; free with kiln_anno_boxes_free. */
typedef struct kiln_anno_boxes {
  kiln_anno_box *v;
  int n, cap;
} kiln_anno_boxes;
/* Appends a box, growing the array (KILN_ERR_NOMEM). */
int kiln_anno_boxes_add(kiln_anno_boxes *b, const kiln_anno_box *box);
void kiln_anno_boxes_free(kiln_anno_boxes *b);

/* Boxes (the samplers' crops), grown as kiln_anno_boxes. */
typedef struct kiln_bbox_list {
  kiln_bbox *v;
  int n, cap;
} kiln_bbox_list;
void kiln_bbox_list_free(kiln_bbox_list *l);

/* The buffers of the augmentation: the images the geometric steps write (swapped with the
 * image's own buffer after each), the resize's, the samplers' crops. Zero-initialise; one per
 * thread; free with kiln_anno_work_free. */
typedef struct kiln_anno_work {
  uint8_t *img, *pad;
  size_t img_cap, pad_cap;
  kiln_warp_work warp;
  kiln_bbox_list samples;
} kiln_anno_work;
void kiln_anno_work_free(kiln_anno_work *w);

/* ---- photometric distortion (distort_param) */

/* One distortion's draws. The fork's order is brightness, contrast, saturation, hue, channel
 * order; with saturation_first (its first draw u <= 0.5) brightness, saturation, hue, contrast,
 * channel order. A step that is false leaves the image as it is. */
typedef struct kiln_distort_draws {
  bool saturation_first;
  bool brightness, contrast, saturation, hue, reorder;
  float brightness_delta; /* added to every value */
  float contrast_alpha;   /* every value multiplied by it */
  float saturation_alpha; /* S of HSV multiplied by it */
  float hue_delta;        /* added to H of HSV, in OpenCV's 8-bit units (2 degrees) */
  uint8_t order[3];       /* reorder: output plane c is input plane order[c] */
} kiln_distort_draws;
/* Draws as the fork does: u ~ U[0, 1) for the order, then for each step in that order a draw
 * below its probability and its value, U[-brightness_delta, brightness_delta),
 * U[contrast_lower, contrast_upper), U[saturation_lower, saturation_upper),
 * U[-hue_delta, hue_delta), a uniform permutation of the 3 planes. A gray image (channels 1)
 * draws brightness and contrast only. */
void kiln_distort_draw(const Caffe__DistortionParameter *p, int channels, kiln_rng *rng,
                       kiln_distort_draws *d);
/* Applies the draws to img (channels 1 or 3) in place, allocating nothing. Brightness and
 * contrast round each value to nearest, ties to even (OpenCV's convertTo), and saturate;
 * contrast within 1e-3 of 1 is skipped (the fork's rule). Saturation and hue go through HSV on
 * OpenCV's 8-bit scales (H in [0, 180), S and V in [0, 255]) but kept in float, not quantised
 * to bytes between the conversions: S saturates at 255, H wraps mod 180; an identity alpha or
 * delta gives the image back. */
void kiln_distort_apply(kiln_image *img, const kiln_distort_draws *d);
/* Both. */
void kiln_distort(kiln_image *img, const Caffe__DistortionParameter *p, kiln_rng *rng);

/* ---- expansion (expand_param), crop, resize, mirror: the image and its boxes */

/* One expansion's draws: whether, the canvas's size and where the image goes in it. */
typedef struct kiln_expand_draws {
  bool expand;
  int height, width; /* the canvas */
  int h_off, w_off;  /* of the image's top left pixel in it */
} kiln_expand_draws;
/* As the fork: with probability prob (u < prob), unless |max_expand_ratio - 1| < 1e-2, ratio ~
 * U[1, max_expand_ratio), canvas floor(h ratio) x floor(w ratio), h_off = floor(U[0, H' - h)),
 * w_off likewise. */
void kiln_expand_draw(const Caffe__ExpansionParameter *p, int h, int w, kiln_rng *rng,
                      kiln_expand_draws *d);
/* Puts img into the canvas filled with fill[c] per plane, and maps the boxes to it:
 * x' = (x w + w_off) / W', y' likewise (after the emit constraint against the image's place in
 * the canvas, as the fork; `emit` may be NULL). A canvas past KILN_IMAGE_MAX_PIXELS is
 * KILN_ERR_DATA naming expand_param.max_expand_ratio. */
int kiln_expand(kiln_image *img, kiln_anno_boxes *boxes, const kiln_expand_draws *d,
                const uint8_t *fill, const Caffe__EmitConstraint *emit, kiln_anno_work *w);

/* The batch samplers' crop: scale ~ U[min_scale, max_scale), ar ~ U[min_aspect_ratio,
 * max_aspect_ratio) held to [scale^2, 1 / scale^2], width scale sqrt(ar), height
 * scale / sqrt(ar), xmin ~ U[0, 1 - width), ymin ~ U[0, 1 - height). s NULL: the defaults
 * (the whole image). */
void kiln_sample_box(const Caffe__Sampler *s, kiln_rng *rng, kiln_bbox *out);
/* Whether `sample` meets constraint c against the objects: with no bound set (c NULL), yes;
 * else when one object meets every bound given, IoU against min/max_jaccard_overlap,
 * intersection over the sample's area against min/max_sample_coverage, intersection over the
 * object's area against min/max_object_coverage (inclusive). */
bool kiln_sample_satisfies(const kiln_bbox *sample, const kiln_anno_box *objects, int n,
                           const Caffe__SampleConstraint *c);
/* The fork's GenerateBatchSamples: for each sampler with use_original_image, up to max_trials
 * draws, stopping once max_sample (when set) were kept; the kept crops are appended to out
 * (emptied first), sampler after sampler. */
int kiln_generate_samples(Caffe__BatchSampler *const *samplers, size_t n,
                          const kiln_anno_boxes *objects, kiln_rng *rng, kiln_bbox_list *out);

/* The pixels a normalised crop takes from an h x w image, the fork's rule: the crop clipped to
 * [0, 1], x0 = floor(xmin w), width = floor(xmax w - xmin w), at least 1 and held inside the
 * image (likewise y0, height). */
void kiln_crop_rect(const kiln_bbox *crop, int h, int w, int *y0, int *x0, int *ch, int *cw);
/* The emit constraint (NULL: always): CENTER, the box's centre inside the window (edges
 * included); MIN_OVERLAP, the box's area inside the window over its area > emit_overlap. */
bool kiln_emit_ok(const kiln_bbox *window, const kiln_bbox *box, const Caffe__EmitConstraint *e);
/* The fork's TransformAnnotation over a window in the boxes' coordinates: a box that fails the
 * emit constraint or does not overlap the window is dropped; the others are projected
 * ((x - x0) / (x1 - x0)), clipped to [0, 1], and dropped when that leaves no area. */
void kiln_project_boxes(kiln_anno_boxes *boxes, const kiln_bbox *window,
                        const Caffe__EmitConstraint *e);
/* Crops img to the ch x cw pixels at (y0, x0) (inside the image: else KILN_ERR_INVALID) and
 * projects the boxes onto those pixels' window (x0 / w .. (x0 + cw) / w, likewise in y), with
 * the emit constraint (NULL: none): the boxes stay on their pixels. */
int kiln_crop_pixels(kiln_image *img, kiln_anno_boxes *boxes, int y0, int x0, int ch, int cw,
                     const Caffe__EmitConstraint *emit, kiln_anno_work *w);
/* kiln_crop_pixels of kiln_crop_rect(crop): a sampler's crop. */
int kiln_crop(kiln_image *img, kiln_anno_boxes *boxes, const kiln_bbox *crop,
              const Caffe__EmitConstraint *emit, kiln_anno_work *w);

/* The interpolation of one resize: one of interp_mode's, uniformly (none listed: LINEAR, no
 * draw). */
kiln_interp kiln_resize_draw(const Caffe__ResizeParameter *p, kiln_rng *rng);
/* The size resize_param gives an h x w image: WARP and FIT_LARGE_SIZE_AND_PAD height x width;
 * FIT_SMALL_SIZE the image scaled to cover height x width (the fork's: the side that is
 * relatively shorter to the target's, the other floor(side x scale)), so it depends on the
 * image. */
void kiln_resize_size(const Caffe__ResizeParameter *p, int h, int w, int *oh, int *ow);
/* Resizes img by resize_param with `mode` (fill: the pad values per plane, for
 * FIT_LARGE_SIZE_AND_PAD's CONSTANT padding), and maps the boxes: unchanged (normalised) for
 * WARP and FIT_SMALL_SIZE; for FIT_LARGE_SIZE_AND_PAD into the padded frame, onto the pixels
 * the image went to (x' = (pad_left + x rw) / width). MIRRORED pads reflect the image (OpenCV's
 * BORDER_REFLECT_101), REPEAT_NEAREST repeat its edge. */
int kiln_resize(kiln_image *img, kiln_anno_boxes *boxes, const Caffe__ResizeParameter *p,
                kiln_interp mode, const uint8_t *fill, kiln_anno_work *w);

/* Flips img left to right in place and its boxes with it (xmin' = 1 - xmax, xmax' = 1 - xmin). */
void kiln_mirror(kiln_image *img, kiln_anno_boxes *boxes);

/* ---- the whole chain */

/* Checks, once at set-up, every parameter the chain reads: distort_param (probabilities in
 * [0, 1], deltas >= 0, 0 <= lower <= upper), expand_param (prob in [0, 1], max_expand_ratio >=
 * 1; with mean_file refused, KILN_ERR_UNSUPPORTED: the fork fills the canvas from a mean image
 * of the canvas's drawn size), each batch_sampler (0 < min_scale <= max_scale <= 1,
 * 0 < min_aspect_ratio <= max_aspect_ratio, finite; constraints in [0, 1], min <= max),
 * emit_constraint (emit_overlap in [0, 1]), resize_param (height and width >= 1, the modes
 * known, pad_value 1 or `channels` values), mean_value (1 or `channels` values), crop_size (no
 * larger than a fixed resize), noise_param (KILN_ERR_UNSUPPORTED for prob > 0 or any policy
 * turned on: the fork applies those whatever prob says; an empty block passes). channels: 1, 3,
 * or 0 when not yet known (the counts are then checked per image). KILN_ERR_INVALID naming the
 * field ("transform_param.distort_param.contrast_lower ...", "batch_sampler[1].sampler...."). */
int kiln_anno_augment_check(const Caffe__TransformationParameter *tp,
                            Caffe__BatchSampler *const *samplers, size_t nsamplers, int channels);

/* What one kiln_anno_augment call did. */
typedef struct kiln_anno_report {
  kiln_distort_draws distort; /* all false without distort_param */
  kiln_expand_draws expand;
  int samples;     /* crops the samplers kept */
  bool cropped;    /* one of them taken */
  kiln_bbox crop;  /* that crop, in the expanded image */
  bool resized;
  kiln_interp interp;
  bool mirrored;
} kiln_anno_report;

/* The fork's AnnotatedData augmentation of one image and its boxes, in its order: distortion
 * (distort_param), expansion (expand_param, the canvas filled with mean_value, 0 without),
 * the batch samplers' crop (one of the kept crops, uniformly; none kept: no crop), the resize
 * (resize_param), crop_size (a random window when `train`, the centre one otherwise), the emit
 * constraint and projection onto the net's window, the mirror (mirror: true, with probability
 * 1/2). Steps whose parameters are absent do nothing and draw nothing. img: channels 1 or 3;
 * boxes normalised to it. `report` may be NULL. Parameters must have passed
 * kiln_anno_augment_check; the counts of mean_value and pad_value are checked against the
 * image's channels here (KILN_ERR_INVALID). */
int kiln_anno_augment(kiln_image *img, kiln_anno_boxes *boxes,
                      const Caffe__TransformationParameter *tp,
                      Caffe__BatchSampler *const *samplers, size_t nsamplers, bool train,
                      kiln_rng *rng, kiln_anno_work *w, kiln_anno_report *report);

#endif
