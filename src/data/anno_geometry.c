/* The geometric steps of SSD's augmentation, each on an image and its boxes together:
 * expansion into a canvas, a crop, the resize to the net's input (with its padding), the
 * mirror; and the projection of boxes onto a window that the crops share.
 *
 * Each step writes its image into the work's buffer and then swaps that buffer with the
 * image's own, so the two are grown to the largest image once and reused. Where the fork places
 * boxes by the normalised geometry it asked for (a crop's drawn box, FIT_LARGE_SIZE_AND_PAD's
 * fractional padding), kiln places them on the pixels the image actually went to; the two
 * differ by less than a pixel, and the fork's padding formula for tall images is wrong
 * (docs/detection.md, "Detection augmentation"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/anno.h"

int kiln_anno_boxes_add(kiln_anno_boxes *b, const kiln_anno_box *box) {
  if (b->n == b->cap) {
    const int cap = b->cap ? 2 * b->cap : 16;
    kiln_anno_box *v = realloc(b->v, (size_t)cap * sizeof *v);
    if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for an image's boxes");
    b->v = v;
    b->cap = cap;
  }
  b->v[b->n++] = *box;
  return KILN_OK;
}

void kiln_anno_boxes_free(kiln_anno_boxes *b) {
  if (!b) return;
  free(b->v);
  b->v = NULL;
  b->n = b->cap = 0;
}

void kiln_anno_work_free(kiln_anno_work *w) {
  if (!w) return;
  free(w->img);
  free(w->pad);
  kiln_warp_work_free(&w->warp);
  kiln_bbox_list_free(&w->samples);
  memset(w, 0, sizeof *w);
}

static int grow(uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return KILN_OK;
  uint8_t *p = realloc(*buf, need);
  if (!p)
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for an augmented image (%zu bytes)", need);
  *buf = p;
  *cap = need;
  return KILN_OK;
}

/* The work's image becomes img's, of the given size; img's old buffer becomes the work's. */
static void swap_in(kiln_image *img, kiln_anno_work *w, int h, int wd) {
  uint8_t *d = img->data;
  size_t cap = img->cap;
  img->data = w->img;
  img->cap = w->img_cap;
  w->img = d;
  w->img_cap = cap;
  img->height = h;
  img->width = wd;
}

/* ---- boxes against a window -------------------------------------------------------------- */

bool kiln_emit_ok(const kiln_bbox *window, const kiln_bbox *box, const Caffe__EmitConstraint *e) {
  if (!e) return true;
  if (e->emit_type == CAFFE__EMIT_CONSTRAINT__EMIT_TYPE__MIN_OVERLAP) {
    kiln_bbox i;
    const float area = kiln_bbox_size(box, true);
    if (!kiln_bbox_intersect(box, window, &i) || area <= 0) return false;
    return kiln_bbox_size(&i, true) / area > e->emit_overlap;
  }
  const float cx = (box->xmin + box->xmax) / 2, cy = (box->ymin + box->ymax) / 2;
  return cx >= window->xmin && cx <= window->xmax && cy >= window->ymin && cy <= window->ymax;
}

void kiln_project_boxes(kiln_anno_boxes *boxes, const kiln_bbox *window,
                        const Caffe__EmitConstraint *e) {
  const double x0 = window->xmin, y0 = window->ymin;
  const double sx = window->xmax - x0, sy = window->ymax - y0;
  int kept = 0;
  for (int i = 0; i < boxes->n; i++) {
    kiln_anno_box a = boxes->v[i];
    const kiln_bbox *b = &a.box;
    if (!kiln_emit_ok(window, b, e)) continue;
    if (b->xmin >= window->xmax || b->xmax <= window->xmin || b->ymin >= window->ymax ||
        b->ymax <= window->ymin)
      continue;
    a.box = (kiln_bbox){(float)((b->xmin - x0) / sx), (float)((b->ymin - y0) / sy),
                        (float)((b->xmax - x0) / sx), (float)((b->ymax - y0) / sy)};
    kiln_bbox_clip(&a.box);
    if (kiln_bbox_size(&a.box, true) <= 0) continue;
    boxes->v[kept++] = a;
  }
  boxes->n = kept;
}

/* ---- expansion --------------------------------------------------------------------------- */

void kiln_expand_draw(const Caffe__ExpansionParameter *p, int h, int w, kiln_rng *rng,
                      kiln_expand_draws *d) {
  *d = (kiln_expand_draws){.height = h, .width = w};
  if (!(kiln_rng_uniform(rng, 0, 1) < p->prob)) return;
  if (fabsf(p->max_expand_ratio - 1) < 1e-2f) return; /* the fork's test, before any draw */
  const float ratio = kiln_rng_uniform(rng, 1, p->max_expand_ratio);
  d->expand = true;
  /* an absurd ratio is held just past kiln's largest side, which kiln_expand then refuses */
  const float cap = KILN_IMAGE_MAX_SIDE + 1;
  d->height = (int)fminf(h * ratio, cap);
  d->width = (int)fminf(w * ratio, cap);
  d->h_off = (int)floorf(kiln_rng_uniform(rng, 0, (float)(d->height - h)));
  d->w_off = (int)floorf(kiln_rng_uniform(rng, 0, (float)(d->width - w)));
}

int kiln_expand(kiln_image *img, kiln_anno_boxes *boxes, const kiln_expand_draws *d,
                const uint8_t *fill, const Caffe__EmitConstraint *emit, kiln_anno_work *w) {
  if (!d->expand) return KILN_OK;
  const int C = img->channels, h = img->height, wd = img->width, H = d->height, W = d->width;
  if ((uint64_t)H * W > KILN_IMAGE_MAX_PIXELS || H > KILN_IMAGE_MAX_SIDE || W > KILN_IMAGE_MAX_SIDE)
    return kiln_errorf(KILN_ERR_DATA,
                       "transform_param.expand_param.max_expand_ratio: expanding a %d x %d image "
                       "gives a canvas of %d x %d, past kiln's limit of %d a side and %llu pixels",
                       wd, h, W, H, KILN_IMAGE_MAX_SIDE, (unsigned long long)KILN_IMAGE_MAX_PIXELS);
  if (H < h || W < wd || d->h_off < 0 || d->w_off < 0 || d->h_off + h > H || d->w_off + wd > W)
    return kiln_errorf(KILN_ERR_INVALID, "expansion of a %d x %d image into %d x %d at (%d, %d): "
                       "the image does not fit", wd, h, W, H, d->w_off, d->h_off);
  KILN_TRY(grow(&w->img, &w->img_cap, (size_t)C * H * W));
  for (int c = 0; c < C; c++) {
    uint8_t *q = w->img + (size_t)c * H * W;
    const uint8_t *p = img->data + (size_t)c * h * wd;
    memset(q, fill ? fill[c] : 0, (size_t)H * W);
    for (int y = 0; y < h; y++)
      memcpy(q + (size_t)(d->h_off + y) * W + d->w_off, p + (size_t)y * wd, (size_t)wd);
  }
  /* The fork projects the boxes onto the canvas seen from the image: the window
   * (-w_off / w, -h_off / h) .. ((W - w_off) / w, (H - h_off) / h). */
  const kiln_bbox window = {(float)(-(double)d->w_off / wd), (float)(-(double)d->h_off / h),
                            (float)((double)(W - d->w_off) / wd),
                            (float)((double)(H - d->h_off) / h)};
  int kept = 0;
  for (int i = 0; i < boxes->n; i++) {
    kiln_anno_box a = boxes->v[i];
    if (!kiln_emit_ok(&window, &a.box, emit)) continue;
    /* x' = (x w + w_off) / W, in double: a box on whole pixels stays on whole pixels */
    a.box = (kiln_bbox){(float)(((double)a.box.xmin * wd + d->w_off) / W),
                        (float)(((double)a.box.ymin * h + d->h_off) / H),
                        (float)(((double)a.box.xmax * wd + d->w_off) / W),
                        (float)(((double)a.box.ymax * h + d->h_off) / H)};
    kiln_bbox_clip(&a.box);
    if (kiln_bbox_size(&a.box, true) <= 0) continue;
    boxes->v[kept++] = a;
  }
  boxes->n = kept;
  swap_in(img, w, H, W);
  return KILN_OK;
}

/* ---- crop ---------------------------------------------------------------------------------- */

/* One axis of kiln_crop_rect: the fork's truncations, then at least a pixel, inside. */
static void crop_axis(float lo, float hi, int n, int *off, int *len) {
  lo = lo < 0 ? 0 : lo > 1 ? 1 : lo;
  hi = hi < 0 ? 0 : hi > 1 ? 1 : hi;
  const float a = lo * n, b = hi * n;
  int o = (int)a, l = (int)(b - a);
  if (o > n - 1) o = n - 1;
  if (l < 1) l = 1;
  if (o + l > n) l = n - o;
  *off = o;
  *len = l;
}

void kiln_crop_rect(const kiln_bbox *crop, int h, int w, int *y0, int *x0, int *ch, int *cw) {
  crop_axis(crop->xmin, crop->xmax, w, x0, cw);
  crop_axis(crop->ymin, crop->ymax, h, y0, ch);
}

int kiln_crop_pixels(kiln_image *img, kiln_anno_boxes *boxes, int y0, int x0, int ch, int cw,
                     const Caffe__EmitConstraint *emit, kiln_anno_work *w) {
  const int C = img->channels, h = img->height, wd = img->width;
  if (y0 < 0 || x0 < 0 || ch < 1 || cw < 1 || y0 + ch > h || x0 + cw > wd)
    return kiln_errorf(KILN_ERR_INVALID, "a crop of %d x %d pixels at (%d, %d) from a %d x %d "
                       "image: not inside it", cw, ch, x0, y0, wd, h);
  KILN_TRY(grow(&w->img, &w->img_cap, (size_t)C * ch * cw));
  for (int c = 0; c < C; c++)
    for (int y = 0; y < ch; y++)
      memcpy(w->img + ((size_t)c * ch + y) * cw,
             img->data + ((size_t)c * h + y0 + y) * wd + x0, (size_t)cw);
  const kiln_bbox window = {(float)((double)x0 / wd), (float)((double)y0 / h),
                            (float)((double)(x0 + cw) / wd), (float)((double)(y0 + ch) / h)};
  kiln_project_boxes(boxes, &window, emit);
  swap_in(img, w, ch, cw);
  return KILN_OK;
}

int kiln_crop(kiln_image *img, kiln_anno_boxes *boxes, const kiln_bbox *crop,
              const Caffe__EmitConstraint *emit, kiln_anno_work *w) {
  int y0, x0, ch, cw;
  kiln_crop_rect(crop, img->height, img->width, &y0, &x0, &ch, &cw);
  return kiln_crop_pixels(img, boxes, y0, x0, ch, cw, emit, w);
}

/* ---- resize ------------------------------------------------------------------------------ */

kiln_interp kiln_resize_draw(const Caffe__ResizeParameter *p, kiln_rng *rng) {
  if (p->n_interp_mode == 0) return KILN_INTERP_LINEAR;
  if (p->n_interp_mode == 1) return (kiln_interp)p->interp_mode[0];
  return (kiln_interp)p->interp_mode[kiln_rng_below(rng, (uint32_t)p->n_interp_mode)];
}

/* The resized image's size inside the output (rh x rw) and where it goes (top, left), as the
 * fork's AspectKeepingResizeAndPad and AspectKeepingResizeBySmall compute them, in float. */
static void layout(const Caffe__ResizeParameter *p, int h, int w, int *rh, int *rw, int *top,
                   int *left) {
  const int H = (int)p->height, W = (int)p->width;
  const float aspect = (float)w / (float)h, target = (float)W / (float)H;
  *top = *left = 0;
  *rh = H;
  *rw = W;
  if (p->resize_mode == CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_LARGE_SIZE_AND_PAD) {
    if (aspect > target) {
      *rh = (int)floorf((float)W / aspect);
      if (*rh < 1) *rh = 1;
      *top = (H - *rh) / 2;
    } else {
      *rw = (int)floorf(aspect * (float)H);
      if (*rw < 1) *rw = 1;
      *left = (W - *rw) / 2;
    }
  } else if (p->resize_mode == CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_SMALL_SIZE) {
    if (aspect < target) *rh = (int)floorf((float)W / aspect);
    else *rw = (int)floorf(aspect * (float)H);
    if (*rh < 1) *rh = 1;
    if (*rw < 1) *rw = 1;
  }
}

void kiln_resize_size(const Caffe__ResizeParameter *p, int h, int w, int *oh, int *ow) {
  int top, left;
  layout(p, h, w, oh, ow, &top, &left);
  if (p->resize_mode == CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_LARGE_SIZE_AND_PAD) {
    *oh = (int)p->height;
    *ow = (int)p->width;
  }
}

/* Where padding index i (of an axis of n, the image at [lo, lo + len)) reads: -1 for the
 * constant, else an index into the image. REFLECT_101 mirrors about the edge pixels without
 * repeating them (dcb|abcd|cba), as often as the pad needs. */
static int pad_source(int i, int lo, int len, Caffe__ResizeParameter__PadMode mode) {
  int p = i - lo;
  if (p >= 0 && p < len) return p;
  if (mode == CAFFE__RESIZE_PARAMETER__PAD_MODE__REPEAT_NEAREST) return p < 0 ? 0 : len - 1;
  if (mode != CAFFE__RESIZE_PARAMETER__PAD_MODE__MIRRORED) return -1;
  if (len == 1) return 0;
  const int period = 2 * (len - 1);
  p %= period;
  if (p < 0) p += period;
  return p < len ? p : period - p;
}

int kiln_resize(kiln_image *img, kiln_anno_boxes *boxes, const Caffe__ResizeParameter *p,
                kiln_interp mode, const uint8_t *fill, kiln_anno_work *w) {
  const int C = img->channels, h = img->height, wd = img->width;
  if (p->height < 1 || p->width < 1 || p->height > KILN_IMAGE_MAX_SIDE ||
      p->width > KILN_IMAGE_MAX_SIDE)
    return kiln_errorf(KILN_ERR_INVALID, "resize_param: height %u and width %u must be 1 .. %d",
                       p->height, p->width, KILN_IMAGE_MAX_SIDE);
  int rh, rw, top, left, oh, ow;
  layout(p, h, wd, &rh, &rw, &top, &left);
  kiln_resize_size(p, h, wd, &oh, &ow);
  if ((uint64_t)oh * ow > KILN_IMAGE_MAX_PIXELS || oh > KILN_IMAGE_MAX_SIDE ||
      ow > KILN_IMAGE_MAX_SIDE)
    return kiln_errorf(KILN_ERR_DATA, "resize_param: FIT_SMALL_SIZE makes a %d x %d image %d x %d, "
                       "past kiln's image limits", wd, h, ow, oh);
  const bool padded = rh != oh || rw != ow;
  /* unpadded, the resize writes the output; padded, it writes the pad buffer first */
  uint8_t **to = padded ? &w->pad : &w->img;
  size_t *cap = padded ? &w->pad_cap : &w->img_cap;
  KILN_TRY(grow(to, cap, (size_t)C * rh * rw));
  KILN_TRY(kiln_image_warp(img->data, C, h, wd, *to, rh, rw, mode, &w->warp));
  if (padded) {
    KILN_TRY(grow(&w->img, &w->img_cap, (size_t)C * oh * ow));
    const Caffe__ResizeParameter__PadMode pm = p->pad_mode;
    for (int c = 0; c < C; c++) {
      const uint8_t *s = w->pad + (size_t)c * rh * rw;
      uint8_t *q = w->img + (size_t)c * oh * ow;
      for (int y = 0; y < oh; y++) {
        uint8_t *row = q + (size_t)y * ow;
        const int sy = pad_source(y, top, rh, pm);
        if (sy < 0) {
          memset(row, fill ? fill[c] : 0, (size_t)ow);
          continue;
        }
        const uint8_t *src = s + (size_t)sy * rw;
        for (int x = 0; x < ow; x++) {
          const int sx = pad_source(x, left, rw, pm);
          row[x] = sx < 0 ? (fill ? fill[c] : 0) : src[sx];
        }
      }
    }
    /* the boxes go where the pixels went */
    for (int i = 0; i < boxes->n; i++) {
      kiln_bbox *b = &boxes->v[i].box;
      *b = (kiln_bbox){(float)((left + (double)b->xmin * rw) / ow),
                       (float)((top + (double)b->ymin * rh) / oh),
                       (float)((left + (double)b->xmax * rw) / ow),
                       (float)((top + (double)b->ymax * rh) / oh)};
    }
  }
  swap_in(img, w, oh, ow);
  return KILN_OK;
}

/* ---- mirror ------------------------------------------------------------------------------ */

void kiln_mirror(kiln_image *img, kiln_anno_boxes *boxes) {
  const int wd = img->width;
  const size_t rows = (size_t)img->channels * img->height;
  for (size_t r = 0; r < rows; r++) {
    uint8_t *p = img->data + r * wd;
    for (int a = 0, b = wd - 1; a < b; a++, b--) {
      const uint8_t t = p[a];
      p[a] = p[b];
      p[b] = t;
    }
  }
  for (int i = 0; i < boxes->n; i++) {
    kiln_bbox *b = &boxes->v[i].box;
    const float x0 = b->xmin;
    b->xmin = 1 - b->xmax;
    b->xmax = 1 - x0;
  }
}
