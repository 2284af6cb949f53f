/* The detection sets of the cache (shapes-det, voc2007), shared by their files and open to the
 * tests: the shapes-det generator's images before they are encoded (src/data/shapes_det.c), and
 * PASCAL VOC's on-disk layout (src/data/voc_layout.c). Not part of the public API. */
#ifndef KILN_DATA_DET_SETS_H
#define KILN_DATA_DET_SETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/core.h"

/* ---- shapes-det: one image ------------------------------------------------------------------ */

#define KILN_SHAPES_DET_CLASSES 4     /* labels 1 .. 4: disc, square, triangle, cross */
#define KILN_SHAPES_DET_MAX_OBJECTS 4 /* and at least 1 */

typedef struct kiln_shapes_det_object {
  int label; /* 1 .. KILN_SHAPES_DET_CLASSES */
  /* The box of its visible pixels (mask == index + 1), as VOC writes boxes: 1-based pixel
   * columns and rows, both ends inside the box (1 <= xmin <= xmax <= width). */
  int xmin, ymin, xmax, ymax;
  int area;    /* pixels the whole shape covers, those beyond the border counted */
  int visible; /* of them, inside the image and not under a later object */
  bool truncated; /* part of the shape lies beyond the image's border */
  bool difficult; /* less than half of the shape is visible */
  uint8_t rgb[3]; /* its colour before shading and noise */
} kiln_shapes_det_object;

typedef struct kiln_shapes_det_image {
  int height, width;
  uint8_t *bgr;  /* 3 x height x width planes, B, G, R: what is encoded */
  uint8_t *mask; /* height x width: 0 background, i + 1 where object i is what shows */
  int n;         /* objects */
  kiln_shapes_det_object obj[KILN_SHAPES_DET_MAX_OBJECTS];
} kiln_shapes_det_image;

/* The class names, label 1 .. KILN_SHAPES_DET_CLASSES; NULL outside. */
const char *kiln_shapes_det_class(int label);
/* Image `id` (1, 2, ...) of the set of `seed`: a function of the two alone (its own PCG32
 * stream, integer arithmetic throughout), so every machine draws the same pixels. Reuses img's
 * buffers; zero-initialise it first. Only KILN_ERR_NOMEM. */
int kiln_shapes_det_draw(uint64_t seed, uint32_t id, kiln_shapes_det_image *img);
void kiln_shapes_det_image_free(kiln_shapes_det_image *img);

/* ---- PASCAL VOC's layout -------------------------------------------------------------------- */

/* The splits of a VOC layout: ImageSets/Main/SPLIT.txt names the images, SPLIT.txt at the root
 * lists them for create_annoset. */
enum { KILN_VOC_TRAINVAL = 0, KILN_VOC_TEST = 1, KILN_VOC_SPLITS = 2 };
extern const char *const kiln_voc_split_names[KILN_VOC_SPLITS];

/* An image id as VOC's lists hold them: 1 to 64 letters, digits, '_' or '-'. */
bool kiln_voc_id_ok(const char *id, size_t n);
/* The first <tag>...</tag> inside xml[0 .. n) as a whole number in 0 .. INT32_MAX; -1 when it
 * is missing or not one. *next (may be NULL) gets the position after the closing tag. */
long kiln_voc_xml_int(const char *xml, size_t n, const char *tag, size_t *next);
/* Writes `len` bytes to dir/rel, created or truncated (no temporary, no fsync: an entry's files
 * are vouched for by READY, written after kiln_voc_sync). */
int kiln_voc_write(const char *dir, const char *rel, const void *data, size_t len);
/* Folders JPEGImages, Annotations and ImageSets/Main under dir. */
int kiln_voc_make_folders(const char *dir);
/* Removes everything in the entry folder `dir` but its lock file (an unfinished or outdated
 * entry), folders three levels deep at most. */
int kiln_voc_clear_entry(const char *dir);
/* From dir/ImageSets/Main/SPLIT.txt: dir/SPLIT.txt ("JPEGImages/ID.jpg Annotations/ID.xml" a
 * line, in the same order), each image and annotation checked to be there; for the test split
 * also test_name_size.txt ("ID HEIGHT WIDTH" from each annotation's <size>). *images (may be
 * NULL) gets the count. KILN_ERR_DATA naming the file and line of a bad id, a missing file or
 * an annotation without its size. */
int kiln_voc_write_list(const char *dir, int split, uint32_t *images);
/* labelmap.prototxt in the SSD fork's format: none_of_the_above (label 0, display name
 * background), then names[i] with label i + 1. */
int kiln_voc_write_labelmap(const char *dir, const char *const *names, int n);
/* The end of a detection set's fetch, once its VOC layout is written: the steps that derive
 * further files from it (kiln_voc_derive), the data synced, SHA256SUMS, then READY holding
 * `ready`. */
int kiln_voc_finish(const char *cache_dir, const char *name, const char *ready, size_t len);

#endif
