/* shapes-det as files and as a cache entry: the generator's images (src/data/shapes_det.c)
 * encoded as JPEG, their boxes as VOC's XML annotations, the splits, create_annoset's lists, the
 * test images' sizes, the label map and a README, in PASCAL VOC's layout (src/data/voc_layout.c);
 * and `kiln data fetch shapes-det`, which writes them once into the cache.
 *
 * The set is a function of the seed and the counts: image ID (1-based, written as six digits)
 * is drawn from the seed and ID alone, trainval holds ids 1 .. T and test T + 1 .. T + N. The
 * cache's entry is seed KILN_SHAPES_DET_SEED with 4,000 and 1,000 images. READY names the
 * generator's version: when the drawing rules change, that number goes up and a cached entry of
 * the old rules is made again at the next fetch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/det_sets.h"
#include "data/internal.h"
#include "kiln/data.h"

#define GENERATOR_VERSION 1
#define JPEG_QUALITY 92

typedef struct {
  uint32_t images, objects, truncated, difficult;
  uint32_t per_class[KILN_SHAPES_DET_CLASSES + 1];
} split_counts;

/* Annotations/ID.xml: VOC's tags and layout (tab-indented), integers only. */
static void annotation(kiln_strbuf *b, const char *id, const kiln_shapes_det_image *img) {
  kiln_strbuf_printf(b,
                     "<annotation>\n\t<folder>shapes-det</folder>\n\t<filename>%s.jpg</filename>\n"
                     "\t<size>\n\t\t<width>%d</width>\n\t\t<height>%d</height>\n"
                     "\t\t<depth>3</depth>\n\t</size>\n",
                     id, img->width, img->height);
  for (int i = 0; i < img->n; i++) {
    const kiln_shapes_det_object *o = &img->obj[i];
    kiln_strbuf_printf(b,
                       "\t<object>\n\t\t<name>%s</name>\n\t\t<pose>Unspecified</pose>\n"
                       "\t\t<truncated>%d</truncated>\n\t\t<difficult>%d</difficult>\n"
                       "\t\t<bndbox>\n\t\t\t<xmin>%d</xmin>\n\t\t\t<ymin>%d</ymin>\n"
                       "\t\t\t<xmax>%d</xmax>\n\t\t\t<ymax>%d</ymax>\n\t\t</bndbox>\n\t</object>\n",
                       kiln_shapes_det_class(o->label), o->truncated, o->difficult, o->xmin,
                       o->ymin, o->xmax, o->ymax);
  }
  kiln_strbuf_printf(b, "</annotation>\n");
}

/* Image `id`: its JPEG and its annotation, counted into *c. */
static int write_image(const char *dir, uint64_t seed, uint32_t id, kiln_shapes_det_image *img,
                       split_counts *c) {
  char name[16], rel[64];
  snprintf(name, sizeof name, "%06u", id);
  KILN_TRY(kiln_shapes_det_draw(seed, id, img));
  uint8_t *jpg = NULL;
  size_t len = 0;
  KILN_TRY(kiln_image_encode_jpeg(img->bgr, 3, img->height, img->width, JPEG_QUALITY, &jpg, &len));
  snprintf(rel, sizeof rel, "JPEGImages/%s.jpg", name);
  int rc = kiln_voc_write(dir, rel, jpg, len);
  free(jpg);
  KILN_TRY(rc);
  kiln_strbuf x = {0};
  annotation(&x, name, img);
  snprintf(rel, sizeof rel, "Annotations/%s.xml", name);
  rc = x.failed ? kiln_errorf(KILN_ERR_NOMEM, "out of memory") : kiln_voc_write(dir, rel, x.s, x.len);
  free(x.s);
  c->images++;
  for (int i = 0; i < img->n; i++) {
    c->objects++;
    c->per_class[img->obj[i].label]++;
    c->truncated += img->obj[i].truncated;
    c->difficult += img->obj[i].difficult;
  }
  return rc;
}

/* "trainval: ids 000001 to 004000, 4000 images, 9987 objects (disc 2490, ...), 812
 * truncated, 95 difficult" */
static void describe_split(kiln_strbuf *b, int split, uint32_t first, const split_counts *c) {
  kiln_strbuf_printf(b, "%s: ids %06u to %06u, %u images, %u objects (", kiln_voc_split_names[split],
                     first, first + c->images - 1, c->images, c->objects);
  for (int k = 1; k <= KILN_SHAPES_DET_CLASSES; k++)
    kiln_strbuf_printf(b, "%s%s %u", k > 1 ? ", " : "", kiln_shapes_det_class(k), c->per_class[k]);
  kiln_strbuf_printf(b, "), %u truncated, %u difficult\n", c->truncated, c->difficult);
}

static int write_readme(const char *dir, uint64_t seed, const char *summary) {
  kiln_strbuf b = {0};
  kiln_strbuf_printf(
      &b,
      "shapes-det: a synthetic object detection set in PASCAL VOC's layout, drawn by kiln\n"
      "(kiln data fetch shapes-det; kiln's docs/detection.md, \"Detection sets\").\n\n"
      "generator %d, seed %llu\n%s"
      "classes (labelmap.prototxt): 0 background, 1 disc, 2 square, 3 triangle, 4 cross\n\n"
      "Image ID is a function of the seed and ID alone (PCG32 stream ID, integer arithmetic), so\n"
      "every machine draws the same pixels; the JPEG files (quality %d, libjpeg's defaults) are\n"
      "what this machine's libjpeg-turbo made of them.\n\n"
      "Each image, 96 to 128 pixels a side (each side one of 96, 104, 112, 120, 128):\n"
      "- a background: a gradient between two muted colours, sometimes low-contrast stripes, up\n"
      "  to three half-transparent elongated ellipses and up to three thin lines (clutter, no\n"
      "  objects);\n"
      "- 1 to 4 objects, each a disc, square, triangle or cross (uniformly), 12%% to 60%% of the\n"
      "  shorter side, squares, triangles and crosses turned in 5-degree steps, in saturated\n"
      "  colours (none twice in an image) with a linear shading; later objects over earlier\n"
      "  ones, never leaving an earlier one less than 35%% visible; a quarter may reach past the\n"
      "  border (at least half of the shape inside);\n"
      "- noise over everything.\n\n"
      "Boxes (Annotations/ID.xml) enclose the pixels where the object shows, in VOC's 1-based\n"
      "pixel coordinates, both ends inside: 1 <= xmin <= xmax <= width. truncated: part of the\n"
      "shape lies beyond the border; difficult: less than half of the shape shows.\n\n"
      "Files: JPEGImages/ID.jpg, Annotations/ID.xml, ImageSets/Main/{trainval,test}.txt (ids),\n"
      "trainval.txt and test.txt (create_annoset's lists: image and annotation paths relative to\n"
      "this folder), test_name_size.txt (ID HEIGHT WIDTH), labelmap.prototxt.\n",
      GENERATOR_VERSION, (unsigned long long)seed, summary, JPEG_QUALITY);
  int rc = b.failed ? kiln_errorf(KILN_ERR_NOMEM, "out of memory")
                    : kiln_voc_write(dir, "README", b.s, b.len);
  free(b.s);
  return rc;
}

/* The ids first .. first + n - 1, one a line, as ImageSets/Main/SPLIT.txt. */
static int write_ids(const char *dir, int split, uint32_t first, uint32_t n) {
  kiln_strbuf b = {0};
  kiln_strbuf_printf(&b, "%s", "");
  for (uint32_t i = 0; i < n; i++) kiln_strbuf_printf(&b, "%06u\n", first + i);
  char rel[64];
  snprintf(rel, sizeof rel, "ImageSets/Main/%s.txt", kiln_voc_split_names[split]);
  int rc = b.failed ? kiln_errorf(KILN_ERR_NOMEM, "out of memory") : kiln_voc_write(dir, rel, b.s, b.len);
  free(b.s);
  return rc;
}

int kiln_shapes_det_write(const char *dir, uint64_t seed, uint32_t trainval, uint32_t test,
                          kiln_strbuf *summary) {
  if (trainval == 0 || test == 0 || trainval + (uint64_t)test > 999999)
    return kiln_errorf(KILN_ERR_INVALID,
                       "shapes-det: %u trainval and %u test images: at least 1 each, 999999 in "
                       "all (six-digit ids)",
                       trainval, test);
  KILN_TRY(kiln_mkdir_p(dir));
  KILN_TRY(kiln_voc_make_folders(dir));
  kiln_shapes_det_image img = {0};
  split_counts c[KILN_VOC_SPLITS] = {{0}};
  int rc = KILN_OK;
  for (uint32_t id = 1; !rc && id <= trainval + test; id++)
    rc = write_image(dir, seed, id, &img, &c[id > trainval ? KILN_VOC_TEST : KILN_VOC_TRAINVAL]);
  kiln_shapes_det_image_free(&img);
  KILN_TRY(rc);
  KILN_TRY(write_ids(dir, KILN_VOC_TRAINVAL, 1, trainval));
  KILN_TRY(write_ids(dir, KILN_VOC_TEST, trainval + 1, test));
  for (int s = 0; s < KILN_VOC_SPLITS; s++) KILN_TRY(kiln_voc_write_list(dir, s, NULL));
  const char *names[KILN_SHAPES_DET_CLASSES];
  for (int k = 0; k < KILN_SHAPES_DET_CLASSES; k++) names[k] = kiln_shapes_det_class(k + 1);
  KILN_TRY(kiln_voc_write_labelmap(dir, names, KILN_SHAPES_DET_CLASSES));
  kiln_strbuf text = {0};
  describe_split(&text, KILN_VOC_TRAINVAL, 1, &c[KILN_VOC_TRAINVAL]);
  describe_split(&text, KILN_VOC_TEST, trainval + 1, &c[KILN_VOC_TEST]);
  rc = text.failed ? kiln_errorf(KILN_ERR_NOMEM, "out of memory")
                   : write_readme(dir, seed, text.s);
  if (!rc && summary) kiln_strbuf_printf(summary, "%s", text.s);
  free(text.s);
  return rc;
}

/* ---- the cache's entry ---------------------------------------------------------------------- */

/* READY's line naming what made the entry: another line means other drawing rules. */
static void source_line(char *buf, size_t n) {
  snprintf(buf, n, "source generated by kiln (shapes-det generator %d, seed %d)\n",
           GENERATOR_VERSION, KILN_SHAPES_DET_SEED);
}

/* Whether READY is there, made by this generator. */
static bool current(const char *ready) {
  char *text = NULL, line[128];
  if (kiln_read_file_max(ready, 1 << 16, &text, NULL) != KILN_OK) return false;
  source_line(line, sizeof line);
  const bool same = strstr(text, line) != NULL;
  free(text);
  return same;
}

static int build_locked(const char *cache_dir, const char *dir, const char *ready) {
  if (access(ready, F_OK) == 0) {
    kiln_log(KILN_LOG_INFO, "shapes-det: the cached set was drawn by other rules; drawing it again");
    if (unlink(ready) != 0)
      return kiln_errorf(KILN_ERR_IO, "%s: cannot remove: %s", ready, strerror(errno));
  }
  /* whatever an interrupted fetch, or another generator, left */
  KILN_TRY(kiln_voc_clear_entry(dir));
  kiln_log(KILN_LOG_INFO, "shapes-det: drawing %d + %d images into %s", KILN_SHAPES_DET_TRAINVAL,
           KILN_SHAPES_DET_TEST, dir);
  kiln_strbuf r = {0};
  char line[128];
  source_line(line, sizeof line);
  kiln_strbuf_printf(&r, "shapes-det\n%s", line);
  int rc = kiln_shapes_det_write(dir, KILN_SHAPES_DET_SEED, KILN_SHAPES_DET_TRAINVAL,
                                 KILN_SHAPES_DET_TEST, &r);
  if (!rc && r.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) rc = kiln_voc_finish(cache_dir, "shapes-det", r.s, r.len);
  free(r.s);
  return rc;
}

int kiln_data_fetch_shapes_det(const char *cache_dir, bool *already) {
  if (already) *already = false;
  char dir[4096], ready[4200], lock[4200];
  if ((size_t)snprintf(dir, sizeof dir, "%s/shapes-det", cache_dir) >= sizeof dir)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  snprintf(ready, sizeof ready, "%s/READY", dir);
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  if (current(ready)) {
    if (already) *already = true;
    return KILN_OK;
  }
  KILN_TRY(kiln_mkdir_p(dir));
  int fd = -1;
  KILN_TRY(kiln_data_lock_entry(lock, &fd));
  int rc = KILN_OK;
  if (current(ready)) { /* another fetch finished while this one waited */
    if (already) *already = true;
  } else {
    rc = build_locked(cache_dir, dir, ready);
  }
  close(fd); /* releases the lock */
  return rc;
}
