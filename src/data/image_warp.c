/* Image resizing with OpenCV's five interpolations (cv::resize), on C x H x W byte planes: what
 * the SSD fork's resize_param asks for with interp_mode. Written from the methods' definitions
 * (Keys' cubic convolution, the Lanczos window, area averaging) and OpenCV's documented pixel
 * grid, not from its code.
 *
 * Every mode is separable: an axis table says, for each destination index, which source
 * indices it reads (border pixels repeated) and with what weights; rows are resized along x
 * into a float plane, then columns along y, rounded once at the end. All of it lives in one
 * buffer of the caller's kiln_warp_work, so a steady stream of images allocates nothing. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"

void kiln_warp_work_free(kiln_warp_work *w) {
  if (!w) return;
  free(w->buf);
  w->buf = NULL;
  w->cap = 0;
}

const char *kiln_interp_name(kiln_interp mode) {
  switch (mode) {
  case KILN_INTERP_LINEAR: return "LINEAR";
  case KILN_INTERP_AREA: return "AREA";
  case KILN_INTERP_NEAREST: return "NEAREST";
  case KILN_INTERP_CUBIC: return "CUBIC";
  case KILN_INTERP_LANCZOS4: return "LANCZOS4";
  }
  return "?";
}

/* One axis: destination index i reads taps ofs[i] .. ofs[i + 1] - 1, each a source index and
 * a weight (the weights of an index sum to 1). */
typedef struct {
  int *ofs, *idx;
  float *w;
} axis_table;

/* Taps an axis of `dst` indices may need: the kernel's width, or for AREA the source pixels a
 * footprint can touch (at most floor(src / dst) + 2). */
static size_t axis_cap(int src, int dst, kiln_interp mode) {
  switch (mode) {
  case KILN_INTERP_NEAREST: return (size_t)dst;
  case KILN_INTERP_LINEAR: return 2 * (size_t)dst;
  case KILN_INTERP_CUBIC: return 4 * (size_t)dst;
  case KILN_INTERP_LANCZOS4: return 8 * (size_t)dst;
  case KILN_INTERP_AREA: return (size_t)dst * ((size_t)(src / dst) + 2);
  }
  return 0;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Keys' cubic convolution kernel with OpenCV's a = -0.75. */
static double keys(double t) {
  const double a = -0.75;
  t = fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

/* The Lanczos window of 4 lobes, sinc(t) sinc(t / 4). */
static double lanczos4(double t) {
  if (fabs(t) < 1e-12) return 1;
  const double pt = M_PI * t;
  return 4 * sin(pt) * sin(pt / 4) / (pt * pt);
}

/* Fills the table of one axis; returns its taps. OpenCV's grid: the source step is the
 * reciprocal of dst / src, and the kernels' centre is (i + 0.5) step - 0.5, in float. AREA
 * averages over footprints when no axis grows (`area_box`); otherwise OpenCV takes two taps on
 * each axis, pixel s = floor(i step) and the next, the second weighted by the part of
 * destination pixel i past the end of pixel s, (i + 1) - (s + 1) dst / src, less its whole
 * part: on a growing axis that is the area average again, on a shrinking one it reads only two
 * pixels of the footprint. */
static int build_axis(int src, int dst, kiln_interp mode, bool area_box, axis_table *t) {
  const double step = 1.0 / ((double)dst / src);
  int n = 0;
  for (int i = 0; i < dst; i++) {
    t->ofs[i] = n;
    if (mode == KILN_INTERP_NEAREST) {
      t->idx[n] = clampi((int)floor(i * step), 0, src - 1);
      t->w[n++] = 1;
      continue;
    }
    if (mode == KILN_INTERP_AREA && !area_box) {
      const double grow = (double)dst / src;
      int s = (int)floor(i * step);
      float x = (float)((i + 1) - (s + 1) * grow);
      x = x <= 0 ? 0 : x - floorf(x);
      if (s >= src - 1) s = src - 1, x = 0;
      t->idx[n] = s;
      t->w[n++] = 1 - x;
      t->idx[n] = s + 1 < src ? s + 1 : src - 1;
      t->w[n++] = x;
      continue;
    }
    if (mode == KILN_INTERP_AREA) {
      /* the footprint [i step, (i + 1) step) against each source pixel [s, s + 1) */
      const double a = i * step, b = (i + 1) * step;
      for (int s = (int)floor(a); s < src && s < b; s++) {
        const double lo = a > s ? a : s, hi = b < s + 1 ? b : s + 1;
        if (hi - lo <= 1e-9 * step) continue;
        t->idx[n] = s;
        t->w[n++] = (float)((hi - lo) / step);
      }
      if (n == t->ofs[i]) { /* a footprint past the last pixel by rounding */
        t->idx[n] = src - 1;
        t->w[n++] = 1;
      }
      continue;
    }
    const float f = (float)((i + 0.5) * step - 0.5);
    const int s = (int)floorf(f);
    const float x = f - (float)s;
    if (mode == KILN_INTERP_LINEAR) {
      t->idx[n] = clampi(s, 0, src - 1);
      t->w[n++] = 1 - x;
      t->idx[n] = clampi(s + 1, 0, src - 1);
      t->w[n++] = x;
    } else if (mode == KILN_INTERP_CUBIC) {
      double sum = 0;
      for (int k = 0; k < 3; k++) {
        const double v = keys(x + 1 - k);
        t->idx[n] = clampi(s - 1 + k, 0, src - 1);
        t->w[n++] = (float)v;
        sum += v;
      }
      t->idx[n] = clampi(s + 2, 0, src - 1);
      t->w[n++] = (float)(1 - sum); /* the weights sum to 1 exactly, as OpenCV makes them */
    } else { /* LANCZOS4: taps s - 3 .. s + 4, normalised */
      if (x < FLT_EPSILON) {
        t->idx[n] = clampi(s, 0, src - 1);
        t->w[n++] = 1;
        continue;
      }
      double v[8], sum = 0;
      for (int k = 0; k < 8; k++) sum += v[k] = lanczos4(x + 3 - k);
      for (int k = 0; k < 8; k++) {
        t->idx[n] = clampi(s - 3 + k, 0, src - 1);
        t->w[n++] = (float)(v[k] / sum);
      }
    }
  }
  t->ofs[dst] = n;
  return n;
}

static uint8_t to_byte(float v) {
  return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)(v + 0.5f);
}

int kiln_image_warp(const uint8_t *src, int channels, int sh, int sw, uint8_t *dst, int dh,
                    int dw, kiln_interp mode, kiln_warp_work *w) {
  if (channels < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1)
    return kiln_errorf(KILN_ERR_INVALID, "resize of %d planes of %d x %d to %d x %d: sizes must be "
                       "at least 1", channels, sw, sh, dw, dh);
  if (mode < KILN_INTERP_LINEAR || mode > KILN_INTERP_LANCZOS4)
    return kiln_errorf(KILN_ERR_INVALID, "resize: unknown interpolation %d", (int)mode);
  const size_t plane_in = (size_t)sh * sw, plane_out = (size_t)dh * dw;
  if (sh == dh && sw == dw) { /* every mode's weights are then the identity */
    memcpy(dst, src, plane_in * (size_t)channels);
    return KILN_OK;
  }
  /* one buffer: x table, y table (offsets, indices, weights), the row-resized plane, a row */
  const size_t xt = axis_cap(sw, dw, mode), yt = axis_cap(sh, dh, mode);
  const size_t words = (size_t)(dw + 1) + (size_t)(dh + 1) + 2 * (xt + yt) + (size_t)sh * dw +
                       (size_t)dw;
  const size_t need = words * 4;
  if (w->cap < need) {
    void *p = realloc(w->buf, need);
    if (!p)
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory for resizing a %d x %d image", sw, sh);
    w->buf = p;
    w->cap = need;
  }
  _Static_assert(sizeof(int) == 4 && sizeof(float) == 4, "the buffer holds 4-byte words");
  int *ints = w->buf;
  axis_table tx = {.ofs = ints, .idx = ints + dw + 1};
  axis_table ty = {.ofs = tx.idx + xt, .idx = tx.idx + xt + dh + 1};
  float *floats = (float *)(void *)(ty.idx + yt);
  tx.w = floats;
  ty.w = floats + xt;
  float *rows = ty.w + yt, *acc = rows + (size_t)sh * dw;
  const bool area_box = dh <= sh && dw <= sw; /* OpenCV's test: neither axis grows */
  build_axis(sw, dw, mode, area_box, &tx);
  build_axis(sh, dh, mode, area_box, &ty);

  for (int c = 0; c < channels; c++) {
    const uint8_t *p = src + (size_t)c * plane_in;
    uint8_t *q = dst + (size_t)c * plane_out;
    /* along x: every source row into dw floats */
    for (int y = 0; y < sh; y++) {
      const uint8_t *r = p + (size_t)y * sw;
      float *o = rows + (size_t)y * dw;
      for (int i = 0; i < dw; i++) {
        float v = 0;
        for (int k = tx.ofs[i]; k < tx.ofs[i + 1]; k++) v += tx.w[k] * r[tx.idx[k]];
        o[i] = v;
      }
    }
    /* along y: each output row a weighted sum of whole rows */
    for (int j = 0; j < dh; j++) {
      memset(acc, 0, (size_t)dw * sizeof *acc);
      for (int k = ty.ofs[j]; k < ty.ofs[j + 1]; k++) {
        const float wk = ty.w[k];
        const float *r = rows + (size_t)ty.idx[k] * dw;
        for (int i = 0; i < dw; i++) acc[i] += wk * r[i];
      }
      uint8_t *o = q + (size_t)j * dw;
      for (int i = 0; i < dw; i++) o[i] = to_byte(acc[i]);
    }
  }
  return KILN_OK;
}
