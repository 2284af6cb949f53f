/* shapes-det's images: a synthetic object detection set that kiln draws itself, since PASCAL VOC
 * and COCO cannot be downloaded where kiln is tested. Each image is a function of the set's seed
 * and its id alone (PCG32 stream `id`), drawn in integers only: shapes are placed in 1/16 pixel
 * units, rotated by a table of integer cosines and filled where a pixel's centre lies inside, so
 * no compiler's floating-point contraction (FMA under -march=native) or libm can change a pixel.
 *
 * An image (96 to 128 pixels a side, each side on its own) is:
 *   1. a background: a gradient between two muted colours, sometimes low-contrast stripes, up to
 *      three half-transparent elongated ellipses and up to three thin lines in other colours
 *      (clutter a detector must learn to ignore: none has an object's shape or saturation);
 *   2. 1 to 4 objects, each a disc, a square, a triangle or a cross (uniform), 12% to 60% of
 *      the image's shorter side, squares, triangles and crosses rotated in 5-degree steps, in a
 *      saturated colour of a palette (no two alike in one image), with a linear shading across;
 *      later ones drawn over earlier ones. A quarter may reach past the border (truncated), by
 *      at most 2/5 of their extent, at least half of the shape inside. A placement that would
 *      leave an earlier object with less than 35% of its shape visible is drawn again (up to 25
 *      tries, then the object is left out);
 *   3. noise over everything: gray noise plus a third as much per channel.
 * Each object's box is the box of the pixels where it shows (the mask), as VOC annotates the
 * visible extent; an object with less than half of its shape showing is `difficult`. */
#include <stdlib.h>
#include <string.h>

#include "data/det_sets.h"

#define SUB 16         /* subpixel units a pixel: a pixel's centre is at 16 x + 8 */
#define ONE 16384      /* 1.0 in the cosine table */
#define STEPS 72       /* angles are multiples of 5 degrees */
#define QUARTER 18     /* 90 degrees in steps */

/* round(16384 cos(5 k degrees)), k = 0 .. 18: the first quadrant; the others by symmetry. */
static const int32_t cos_q[QUARTER + 1] = {16384, 16322, 16135, 15826, 15396, 14849, 14189,
                                           13421, 12551, 11585, 10531, 9397,  8192,  6924,
                                           5604,  4240,  2845,  1428,  0};

static int32_t icos(int k) {
  k = ((k % STEPS) + STEPS) % STEPS;
  if (k <= QUARTER) return cos_q[k];
  if (k <= 2 * QUARTER) return -cos_q[2 * QUARTER - k];
  if (k <= 3 * QUARTER) return -cos_q[k - 2 * QUARTER];
  return cos_q[STEPS - k];
}

static int32_t isin(int k) { return icos(k - QUARTER); }

static const char *const class_names[KILN_SHAPES_DET_CLASSES] = {"disc", "square", "triangle",
                                                                 "cross"};
enum { DISC = 1, SQUARE, TRIANGLE, CROSS };

const char *kiln_shapes_det_class(int label) {
  return label >= 1 && label <= KILN_SHAPES_DET_CLASSES ? class_names[label - 1] : NULL;
}

/* Saturated colours, far from the muted background's; RGB. */
static const uint8_t palette[][3] = {
    {215, 35, 35},  {40, 170, 60},  {35, 70, 215},   {235, 215, 40},  {200, 50, 190},
    {40, 195, 205}, {245, 135, 30}, {240, 240, 240}, {20, 20, 20},
};
#define PALETTE (sizeof palette / sizeof palette[0])

/* ---- shapes --------------------------------------------------------------------------------- */

typedef struct {
  int64_t x, y;
} pt;

/* A disc (r > 0) or the union of one or two convex polygons (a cross's bars), in subpixel
 * units, with its extent. */
typedef struct {
  int64_t cx, cy, r;
  int parts, nv[2];
  pt v[2][4];
  int64_t x0, y0, x1, y1;
} shape;

static uint32_t below(kiln_rng *r, uint32_t n) { return kiln_rng_below(r, n); }

/* A point of the local frame, rotated by k steps (truncated toward zero, as C divides). */
static pt rotate(int64_t x, int64_t y, int k) {
  const int64_t c = icos(k), s = isin(k);
  return (pt){(x * c - y * s) / ONE, (x * s + y * c) / ONE};
}

static void add_polygon(shape *sh, const pt *local, int n, int k) {
  int p = sh->parts++;
  sh->nv[p] = n;
  for (int i = 0; i < n; i++) sh->v[p][i] = rotate(local[i].x, local[i].y, k);
}

/* Shape `label` of size s pixels (a disc's diameter, a square's side, a triangle's side, a
 * cross's bar length) turned by k steps, centred on the origin. */
static shape make_shape(int label, int s, int k) {
  shape sh = {0};
  const int64_t h = (int64_t)s * SUB / 2;
  if (label == DISC) {
    sh.r = h;
    sh.x0 = sh.y0 = -h;
    sh.x1 = sh.y1 = h;
    return sh;
  }
  if (label == SQUARE) {
    const pt sq[4] = {{h, h}, {-h, h}, {-h, -h}, {h, -h}};
    add_polygon(&sh, sq, 4, k);
  } else if (label == TRIANGLE) {
    /* circumradius side / sqrt(3) */
    const int64_t rad = (int64_t)s * SUB * 577 / 1000;
    pt tri[3];
    for (int i = 0; i < 3; i++) tri[i] = rotate(rad, 0, i * STEPS / 3);
    add_polygon(&sh, tri, 3, k);
  } else {
    const int64_t t = h * 7 / 20; /* bars 35% as thick as long */
    const pt a[4] = {{h, t}, {-h, t}, {-h, -t}, {h, -t}};
    const pt b[4] = {{t, h}, {-t, h}, {-t, -h}, {t, -h}};
    add_polygon(&sh, a, 4, k);
    add_polygon(&sh, b, 4, k);
  }
  sh.x0 = sh.y0 = INT64_MAX;
  sh.x1 = sh.y1 = INT64_MIN;
  for (int p = 0; p < sh.parts; p++)
    for (int i = 0; i < sh.nv[p]; i++) {
      const pt q = sh.v[p][i];
      if (q.x < sh.x0) sh.x0 = q.x;
      if (q.x > sh.x1) sh.x1 = q.x;
      if (q.y < sh.y0) sh.y0 = q.y;
      if (q.y > sh.y1) sh.y1 = q.y;
    }
  return sh;
}

/* Inside a convex polygon: on the same side of every edge (either winding). */
static bool in_polygon(const pt *v, int n, int64_t x, int64_t y) {
  bool pos = false, neg = false;
  for (int i = 0; i < n; i++) {
    const pt a = v[i], b = v[(i + 1) % n];
    const int64_t cross = (b.x - a.x) * (y - a.y) - (b.y - a.y) * (x - a.x);
    pos |= cross > 0;
    neg |= cross < 0;
  }
  return !(pos && neg);
}

/* Whether the pixel (x, y) belongs to the shape placed at (sh->cx, sh->cy). */
static bool covers(const shape *sh, int x, int y) {
  const int64_t px = (int64_t)x * SUB + SUB / 2 - sh->cx, py = (int64_t)y * SUB + SUB / 2 - sh->cy;
  if (sh->r) return px * px + py * py <= sh->r * sh->r;
  for (int p = 0; p < sh->parts; p++)
    if (in_polygon(sh->v[p], sh->nv[p], px, py)) return true;
  return false;
}

/* floor(a / b) for b > 0 */
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* The pixels whose centres may lie in [lo, hi] (subpixel units, relative to the image). */
static void pixel_span(int64_t lo, int64_t hi, int *a, int *b) {
  *a = (int)floor_div(lo - SUB / 2, SUB);
  *b = (int)floor_div(hi - SUB / 2, SUB) + 1;
}

/* ---- painting ------------------------------------------------------------------------------- */

static uint8_t clamp8(int v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); }

static void set_px(kiln_shapes_det_image *img, int x, int y, const int rgb[3]) {
  const size_t plane = (size_t)img->height * img->width, i = (size_t)y * img->width + x;
  for (int c = 0; c < 3; c++) img->bgr[c * plane + i] = clamp8(rgb[2 - c]);
}

static void get_px(const kiln_shapes_det_image *img, int x, int y, int rgb[3]) {
  const size_t plane = (size_t)img->height * img->width, i = (size_t)y * img->width + x;
  for (int c = 0; c < 3; c++) rgb[2 - c] = img->bgr[c * plane + i];
}

/* A muted colour: a gray level in lo .. hi, each channel within 30 of it. */
static void muted(kiln_rng *r, int lo, int hi, int rgb[3]) {
  const int g = lo + (int)below(r, (uint32_t)(hi - lo + 1));
  for (int c = 0; c < 3; c++) rgb[c] = g + (int)below(r, 61) - 30;
}

static void background(kiln_rng *r, kiln_shapes_det_image *img) {
  const int W = img->width, H = img->height;
  int a[3], b[3];
  muted(r, 80, 175, a);
  muted(r, 80, 175, b);
  const int dir = (int)below(r, 4);
  const int span = dir == 0 ? W - 1 : dir == 1 ? H - 1 : W + H - 2;
  const bool stripes = below(r, 20) < 7;
  const int period = 6 + (int)below(r, 15), orient = (int)below(r, 4);
  const int delta = ((int)below(r, 2) * 2 - 1) * (8 + (int)below(r, 20));
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      const int t = dir == 0 ? x : dir == 1 ? y : dir == 2 ? x + y : x + (H - 1 - y);
      const int along = orient == 0 ? x : orient == 1 ? y : orient == 2 ? x + y : x - y + H;
      const int add = stripes && (along % period) * 2 < period ? delta : 0;
      int rgb[3];
      for (int c = 0; c < 3; c++) rgb[c] = a[c] + (b[c] - a[c]) * t / span + add;
      set_px(img, x, y, rgb);
    }
}

/* Half-transparent elongated ellipses: blobs of colour that are no object. */
static void blobs(kiln_rng *r, kiln_shapes_det_image *img) {
  const int W = img->width, H = img->height, m = W < H ? W : H;
  const int n = (int)below(r, 4);
  for (int i = 0; i < n; i++) {
    const int64_t a = (int64_t)m * SUB * (8 + below(r, 20)) / 100;
    const int64_t b = a * (25 + below(r, 21)) / 100;
    const int64_t cx = below(r, (uint32_t)(W * SUB)), cy = below(r, (uint32_t)(H * SUB));
    const int k = (int)below(r, STEPS / 2);
    int col[3];
    muted(r, 40, 215, col);
    const int64_t c = icos(k), s = isin(k);
    int xa, xb, ya, yb;
    pixel_span(cx - a, cx + a, &xa, &xb);
    pixel_span(cy - a, cy + a, &ya, &yb);
    for (int y = ya < 0 ? 0 : ya; y <= yb && y < H; y++)
      for (int x = xa < 0 ? 0 : xa; x <= xb && x < W; x++) {
        const int64_t dx = (int64_t)x * SUB + SUB / 2 - cx, dy = (int64_t)y * SUB + SUB / 2 - cy;
        const int64_t u = (dx * c + dy * s) / ONE, v = (dy * c - dx * s) / ONE;
        if (u * u * b * b + v * v * a * a > a * a * b * b) continue;
        int rgb[3];
        get_px(img, x, y, rgb);
        for (int ch = 0; ch < 3; ch++) rgb[ch] = (rgb[ch] + col[ch] + 1) / 2;
        set_px(img, x, y, rgb);
      }
  }
}

/* Thin straight lines (1 to 3 pixels) across the background. */
static void lines(kiln_rng *r, kiln_shapes_det_image *img) {
  const int W = img->width, H = img->height;
  const int n = (int)below(r, 4);
  for (int i = 0; i < n; i++) {
    const pt a = {below(r, (uint32_t)(W * SUB)), below(r, (uint32_t)(H * SUB))};
    const pt b = {below(r, (uint32_t)(W * SUB)), below(r, (uint32_t)(H * SUB))};
    const int64_t hw = SUB / 2 + below(r, SUB);
    int col[3];
    muted(r, 30, 225, col);
    const int64_t ex = b.x - a.x, ey = b.y - a.y, len2 = ex * ex + ey * ey;
    int xa, xb, ya, yb;
    pixel_span((a.x < b.x ? a.x : b.x) - hw, (a.x > b.x ? a.x : b.x) + hw, &xa, &xb);
    pixel_span((a.y < b.y ? a.y : b.y) - hw, (a.y > b.y ? a.y : b.y) + hw, &ya, &yb);
    for (int y = ya < 0 ? 0 : ya; y <= yb && y < H; y++)
      for (int x = xa < 0 ? 0 : xa; x <= xb && x < W; x++) {
        const int64_t px = (int64_t)x * SUB + SUB / 2, py = (int64_t)y * SUB + SUB / 2;
        const int64_t t = (px - a.x) * ex + (py - a.y) * ey;
        bool on;
        if (len2 == 0 || t <= 0) {
          on = (px - a.x) * (px - a.x) + (py - a.y) * (py - a.y) <= hw * hw;
        } else if (t >= len2) {
          on = (px - b.x) * (px - b.x) + (py - b.y) * (py - b.y) <= hw * hw;
        } else {
          const int64_t cross = ex * (py - a.y) - ey * (px - a.x);
          on = cross * cross <= hw * hw * len2;
        }
        if (on) set_px(img, x, y, col);
      }
  }
}

/* ---- objects -------------------------------------------------------------------------------- */

typedef struct {
  int area[KILN_SHAPES_DET_MAX_OBJECTS], visible[KILN_SHAPES_DET_MAX_OBJECTS];
} counts;

/* Places object i (its label and colour chosen) or leaves it out: true when drawn. */
static bool place(kiln_rng *r, kiln_shapes_det_image *img, counts *k, int i, int label,
                  const uint8_t rgb[3]) {
  const int W = img->width, H = img->height, m = W < H ? W : H;
  const int lo = m * 12 / 100, hi = m * 60 / 100;
  const int gx = (int)below(r, 41) - 20, gy = (int)below(r, 41) - 20; /* shading at the edge */
  for (int attempt = 0; attempt < 25; attempt++) {
    const int s = lo + (int)below(r, (uint32_t)(hi - lo + 1));
    const int turn = label == DISC ? 0 : (int)below(r, label == TRIANGLE ? STEPS / 3 : QUARTER);
    /* the last tries stay inside, so that an image's first object is always drawn */
    const bool reach = below(r, 4) == 0 && attempt < 20;
    shape sh = make_shape(label, s, turn);
    const int64_t ox = reach ? (sh.x1 - sh.x0) * 2 / 5 : 0, oy = reach ? (sh.y1 - sh.y0) * 2 / 5 : 0;
    const int64_t cx0 = -sh.x0 - ox, cx1 = (int64_t)W * SUB - sh.x1 + ox;
    const int64_t cy0 = -sh.y0 - oy, cy1 = (int64_t)H * SUB - sh.y1 + oy;
    if (cx1 < cx0 || cy1 < cy0) continue; /* too large for this image */
    sh.cx = cx0 + below(r, (uint32_t)(cx1 - cx0 + 1));
    sh.cy = cy0 + below(r, (uint32_t)(cy1 - cy0 + 1));
    int xa, xb, ya, yb;
    pixel_span(sh.cx + sh.x0, sh.cx + sh.x1, &xa, &xb);
    pixel_span(sh.cy + sh.y0, sh.cy + sh.y1, &ya, &yb);
    int area = 0, inside = 0, hidden[KILN_SHAPES_DET_MAX_OBJECTS + 1] = {0};
    for (int y = ya; y <= yb; y++)
      for (int x = xa; x <= xb; x++) {
        if (!covers(&sh, x, y)) continue;
        area++;
        if (x < 0 || y < 0 || x >= W || y >= H) continue;
        inside++;
        hidden[img->mask[(size_t)y * W + x]]++;
      }
    if (area < 24 || inside * 2 < area) continue;
    bool spoils = false; /* an earlier object left with too little of it showing */
    for (int j = 0; j < i; j++)
      spoils |= (int64_t)(k->visible[j] - hidden[j + 1]) * 100 < (int64_t)35 * k->area[j];
    if (spoils) continue;
    const int64_t half = (int64_t)s * SUB / 2;
    for (int y = ya < 0 ? 0 : ya; y <= yb && y < H; y++)
      for (int x = xa < 0 ? 0 : xa; x <= xb && x < W; x++) {
        if (!covers(&sh, x, y)) continue;
        const int64_t dx = (int64_t)x * SUB + SUB / 2 - sh.cx, dy = (int64_t)y * SUB + SUB / 2 - sh.cy;
        const int shade = (int)((dx * gx + dy * gy) / (2 * half)); /* within 20 */
        int px[3];
        for (int c = 0; c < 3; c++) px[c] = rgb[c] + shade;
        set_px(img, x, y, px);
        img->mask[(size_t)y * W + x] = (uint8_t)(i + 1);
      }
    for (int j = 0; j < i; j++) k->visible[j] -= hidden[j + 1];
    k->area[i] = area;
    k->visible[i] = inside;
    kiln_shapes_det_object *o = &img->obj[i];
    o->label = label;
    o->truncated = inside < area;
    memcpy(o->rgb, rgb, 3);
    return true;
  }
  return false;
}

/* Each object's box, visible count and difficulty from the mask. */
static void boxes(kiln_shapes_det_image *img, const counts *k) {
  const int W = img->width, H = img->height;
  for (int i = 0; i < img->n; i++) {
    kiln_shapes_det_object *o = &img->obj[i];
    o->xmin = W;
    o->ymin = H;
    o->xmax = o->ymax = -1;
  }
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      const int id = img->mask[(size_t)y * W + x];
      if (!id) continue;
      kiln_shapes_det_object *o = &img->obj[id - 1];
      if (x < o->xmin) o->xmin = x;
      if (x > o->xmax) o->xmax = x;
      if (y < o->ymin) o->ymin = y;
      if (y > o->ymax) o->ymax = y;
    }
  for (int i = 0; i < img->n; i++) {
    kiln_shapes_det_object *o = &img->obj[i];
    o->xmin++, o->ymin++, o->xmax++, o->ymax++; /* VOC's 1-based pixels */
    o->area = k->area[i];
    o->visible = k->visible[i];
    o->difficult = o->visible * 2 < o->area;
  }
}

static void noise(kiln_rng *r, kiln_shapes_det_image *img) {
  const int amp = 2 + (int)below(r, 11), chan = amp / 3;
  for (int y = 0; y < img->height; y++)
    for (int x = 0; x < img->width; x++) {
      const int gray = (int)below(r, (uint32_t)(2 * amp + 1)) - amp;
      int rgb[3];
      get_px(img, x, y, rgb);
      for (int c = 0; c < 3; c++) rgb[c] += gray + (int)below(r, (uint32_t)(2 * chan + 1)) - chan;
      set_px(img, x, y, rgb);
    }
}

int kiln_shapes_det_draw(uint64_t seed, uint32_t id, kiln_shapes_det_image *img) {
  kiln_rng r;
  kiln_rng_seed(&r, seed, id);
  const int W = 96 + 8 * (int)below(&r, 5), H = 96 + 8 * (int)below(&r, 5);
  const size_t plane = (size_t)W * H;
  uint8_t *bgr = realloc(img->bgr, 3 * plane);
  if (bgr) img->bgr = bgr;
  uint8_t *mask = bgr ? realloc(img->mask, plane) : NULL;
  if (mask) img->mask = mask;
  if (!bgr || !mask) return kiln_errorf(KILN_ERR_NOMEM, "shapes-det: out of memory for an image");
  img->width = W;
  img->height = H;
  img->n = 0;
  memset(img->mask, 0, plane);
  memset(img->obj, 0, sizeof img->obj);
  background(&r, img);
  blobs(&r, img);
  lines(&r, img);
  const int want = 1 + (int)below(&r, KILN_SHAPES_DET_MAX_OBJECTS);
  bool used[PALETTE] = {false};
  counts k = {{0}, {0}};
  for (int i = 0; i < want; i++) {
    const int label = 1 + (int)below(&r, KILN_SHAPES_DET_CLASSES);
    /* a colour no earlier object of the image has: the k-th unused one */
    int pick = (int)below(&r, (uint32_t)(PALETTE - i)), c = 0;
    for (;; c++)
      if (!used[c] && pick-- == 0) break;
    used[c] = true;
    if (place(&r, img, &k, img->n, label, palette[c])) img->n++;
  }
  boxes(img, &k);
  noise(&r, img);
  return KILN_OK;
}

void kiln_shapes_det_image_free(kiln_shapes_det_image *img) {
  if (!img) return;
  free(img->bgr);
  free(img->mask);
  memset(img, 0, sizeof *img);
}
