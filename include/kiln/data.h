/* kiln data: readers and writers for the on-disk data set formats (IDX files, LMDB databases of
 * Caffe Datum records), SHA-256 for checking downloads, and the local data set cache that
 * `kiln data fetch` fills. */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/config.h"
#include "kiln/detect.h"

/* ---- IDX files (LeCun's MNIST format), gzipped or plain ---------------------------------- */

#define KILN_IDX_MAX_DIMS 4
/* Files whose dimensions multiply past this many elements are refused as absurd. */
#define KILN_IDX_MAX_ELEMENTS ((uint64_t)1 << 31)

typedef struct kiln_idx {
  int ndims;
  uint32_t dims[KILN_IDX_MAX_DIMS];
  uint8_t *data; /* `count` bytes, row-major; free with kiln_idx_free() */
  size_t count;  /* product of dims */
} kiln_idx;

/* Reads a whole IDX file of unsigned bytes (element type 0x08), gzip-compressed or not. Errors:
 * KILN_ERR_IO (cannot open or read), KILN_ERR_DATA (bad magic, truncated data, bytes after the
 * data, absurd dimensions, corrupt gzip stream), KILN_ERR_UNSUPPORTED (another element type or
 * more than KILN_IDX_MAX_DIMS dimensions). On failure *out is zeroed. */
int kiln_idx_read(const char *path, kiln_idx *out);
void kiln_idx_free(kiln_idx *idx);

/* ---- images: PNG and JPEG ---------------------------------------------------------------- */

/* Which channels an image decodes to. AS_IS is the file's own: 1 for a gray image (gray PNG,
 * with or without alpha; a one-component JPEG), 3 for everything else (OpenCV's
 * IMREAD_ANYCOLOR, what Caffe's Data layer uses for encoded records). */
typedef enum { KILN_IMAGE_AS_IS = 0, KILN_IMAGE_COLOR, KILN_IMAGE_GRAY } kiln_image_color;

/* Images with a side longer than this, or more pixels than KILN_IMAGE_MAX_PIXELS, are refused
 * (a damaged header would otherwise make the decoder ask for gigabytes). */
#define KILN_IMAGE_MAX_SIDE 65535
#define KILN_IMAGE_MAX_PIXELS ((uint64_t)1 << 26)

/* A decoded image: channels x height x width bytes, one plane per channel in Caffe's order (B,
 * G, R, as OpenCV gives Caffe; or the one gray plane). Zero-initialise; each decode reuses the
 * buffers of the last; free with kiln_image_free(). */
typedef struct kiln_image {
  int channels, height, width;
  uint8_t *data;
  size_t cap;
  uint8_t *work; /* the decoder's own: interleaved rows, row pointers */
  size_t work_cap;
  uint8_t *plane;
  size_t plane_cap;
} kiln_image;

/* "png", "jpeg", or NULL, from the first bytes. */
const char *kiln_image_format(const void *bytes, size_t n);
/* Decodes a PNG or JPEG held in memory; `what` names it in messages (a file, a record). PNG:
 * palette images become colour, 16 bits become 8 (the high byte, as OpenCV does), alpha is
 * dropped (not blended), interlacing is undone. JPEG: gray, YCbCr and RGB; CMYK is refused.
 * Colour to gray is the libraries' own conversion (libpng with 0.299, 0.587, 0.114; libjpeg's
 * luma), as in OpenCV. With new_height and new_width > 0 the image is resized to them, bilinear
 * (docs/formats.md, "Images"). Errors: KILN_ERR_DATA (not PNG or JPEG, damaged or truncated:
 * libjpeg's and libpng's message after `what`), KILN_ERR_UNSUPPORTED (CMYK JPEG),
 * KILN_ERR_INVALID (a size past the limits), KILN_ERR_NOMEM. */
int kiln_image_decode(const void *bytes, size_t n, kiln_image_color color, int new_height,
                      int new_width, const char *what, kiln_image *img);
/* The same for a file (KILN_ERR_IO when it cannot be read; messages name the path). */
int kiln_image_read(const char *path, kiln_image_color color, int new_height, int new_width,
                    kiln_image *img);
/* Bilinear resize of C x sh x sw planes into C x dh x dw (the decoder's; docs/formats.md);
 * KILN_ERR_NOMEM is the only error. */
int kiln_image_resize(const uint8_t *src, int channels, int sh, int sw, uint8_t *dst, int dh,
                      int dw);
/* The buffers of kiln_image_warp: its tables and one row-resized plane. Zero-initialise. */
typedef struct kiln_warp_work {
  void *buf;
  size_t cap;
} kiln_warp_work;
void kiln_warp_work_free(kiln_warp_work *w);

/* ResizeParameter.Interp_mode's values (the SSD fork's resize_param): OpenCV's INTER_LINEAR,
 * INTER_AREA, INTER_NEAREST, INTER_CUBIC and INTER_LANCZOS4. */
typedef enum {
  KILN_INTERP_LINEAR = 1,
  KILN_INTERP_AREA = 2,
  KILN_INTERP_NEAREST = 3,
  KILN_INTERP_CUBIC = 4,
  KILN_INTERP_LANCZOS4 = 5
} kiln_interp;
/* "LINEAR", "AREA", ...; "?" for another value. */
const char *kiln_interp_name(kiln_interp mode);

/* Resizes C x sh x sw planes into C x dh x dw as OpenCV's cv::resize does with `mode`: LINEAR,
 * CUBIC (Keys' kernel, a = -0.75) and LANCZOS4 (8 x 8 taps) sample the source at
 * (i + 0.5) sh / dh - 0.5, repeating the border pixels; NEAREST takes pixel floor(i sh / dh)
 * (OpenCV's INTER_NEAREST, no half-pixel shift); AREA averages the source over each
 * destination pixel's footprint when neither axis grows, and otherwise takes OpenCV's two taps
 * an axis (the footprint's average on a growing axis, two of its pixels on a shrinking one).
 * Computed in float, rounded to nearest and saturated to 0 .. 255: a value may differ from
 * OpenCV's fixed point by one level (NEAREST never). Unlike kiln_image_resize (kept as it is),
 * no allocation once `w` has grown to the sizes: tables and the intermediate plane live there.
 * Errors: KILN_ERR_INVALID (a size below 1, an unknown mode), KILN_ERR_NOMEM. */
int kiln_image_warp(const uint8_t *src, int channels, int sh, int sw, uint8_t *dst, int dh,
                    int dw, kiln_interp mode, kiln_warp_work *w);

/* A PNG of C x H x W planes (C 1: gray, 3: B, G, R), in a malloc'd buffer. */
int kiln_image_encode_png(const uint8_t *chw, int channels, int height, int width, uint8_t **out,
                          size_t *len);
/* A JPEG of the same planes at `quality` (1 to 100), in a malloc'd buffer: libjpeg's defaults
 * (baseline, 4:2:0 chroma for colour), as OpenCV's imencode writes one
 * (src/data/image_jpeg_encode.c). */
int kiln_image_encode_jpeg(const uint8_t *chw, int channels, int height, int width, int quality,
                           uint8_t **out, size_t *len);
void kiln_image_free(kiln_image *img);

/* ---- drawing on images (src/data/image_draw.c): how `kiln detect --draw` marks detections ---- */

/* A colour as people write it (red, green, blue): put into the B, G, R planes of a colour
 * image, or as its luma (0.299 R + 0.587 G + 0.114 B, rounded) into a gray one. */
typedef struct kiln_color {
  uint8_t r, g, b;
} kiln_color;
/* Each class's colour, from a fixed palette of KILN_PALETTE_SIZE: label 1 red, 2 green, 3 blue,
 * 4 yellow, 5 orange, 6 purple, 7 cyan, 8 magenta, 9 lime, 10 teal, 11 brown, 12 gray, then
 * round again (label modulo the size); a negative label gray. */
#define KILN_PALETTE_SIZE 12
kiln_color kiln_class_color(int label);

/* kiln's bitmap font (its own, drawn for kiln): printable ASCII, 32 to 126, each glyph
 * KILN_FONT_WIDTH x KILN_FONT_HEIGHT pixels (capitals and digits on rows 0 to 6, descenders on
 * row 7), characters KILN_FONT_ADVANCE pixels apart. */
#define KILN_FONT_WIDTH 5
#define KILN_FONT_HEIGHT 8
#define KILN_FONT_ADVANCE 6
/* Character c's glyph: KILN_FONT_HEIGHT rows, top first, each a byte whose bit 4 is the leftmost
 * column and bit 0 the rightmost. A character outside 32 .. 126 is drawn as '?'. */
const uint8_t *kiln_font_glyph(unsigned char c);
/* The width in pixels of `text` drawn at `scale` (each font pixel a scale x scale square): the
 * last character's glyph ends it, without the gap after it; 0 for "" or a scale below 1. */
int kiln_font_text_width(const char *text, int scale);

/* Rectangles are pixel indices x0 .. x1 by y0 .. y1, both ends included (given in either
 * order), and are clipped to the image: any coordinates are safe, and what lies outside draws
 * nothing. Each call refuses (KILN_ERR_INVALID) an image that is not 1 or 3 channels with
 * pixels, a thickness or scale below 1. */
int kiln_image_fill_rect(kiln_image *img, int x0, int y0, int x1, int y1, kiln_color c);
/* The outline: `thickness` pixels along each side, inside the rectangle (a box at the image's
 * edge keeps its whole line); sides thicker than half the box fill it. */
int kiln_image_draw_rect(kiln_image *img, int x0, int y0, int x1, int y1, int thickness,
                         kiln_color c);
/* The glyphs' set pixels only (the background shows through), the first glyph's top left at
 * (x, y). */
int kiln_image_draw_text(kiln_image *img, int x, int y, const char *text, int scale,
                         kiln_color c);
/* Where a box's label strip goes (strip: x0, y0, x1, y1 as above): text_width + 2 scale wide
 * and (KILN_FONT_HEIGHT + 2) scale high; its bottom row just above the box's top row y0, or,
 * when the box is too near the image's top for that, its top row on y0, inside the box; its
 * left column on the box's x0, moved left where it would run past the image's right edge (and
 * never left of 0). */
void kiln_label_strip(const kiln_image *img, int x0, int y0, const char *text, int scale,
                      int strip[4]);
/* A box's label, when text is not NULL or "": its strip (kiln_label_strip, for the box whose top
 * left pixel is x0, y0) filled with c and the text on it, one scale pixel in from the strip's
 * top and left, black on a light c (luma >= 128) and white on a dark one. */
int kiln_image_draw_label(kiln_image *img, int x0, int y0, const char *text, kiln_color c,
                          int scale);
/* A detection: the box outlined in c (kiln_image_draw_rect), then its label
 * (kiln_image_draw_label). Several overlapping detections read better with every box drawn
 * before any label. */
int kiln_image_draw_detection(kiln_image *img, int x0, int y0, int x1, int y1, const char *text,
                              kiln_color c, int thickness, int scale);

/* ---- image lists (Caffe's ImageData source, convert_imageset's input) --------------------- */

/* One image a line: PATH LABEL, the label after the last run of spaces or tabs (so a path may
 * hold spaces), a whole number in int32's range. Blank lines are skipped; anything else without
 * a label, or with a label that is not a whole number, is KILN_ERR_PARSE naming the file and
 * line. A list of no images is KILN_ERR_DATA. */
typedef struct kiln_image_list {
  size_t n;
  char **path;  /* as written in the list (not joined to a root folder) */
  int32_t *label;
  int *line;    /* the line each came from, for messages */
  char *text;   /* the file's text, which path[] points into */
  char *source; /* the list's path */
} kiln_image_list;
int kiln_image_list_read(const char *path, kiln_image_list *out);
void kiln_image_list_free(kiln_image_list *list);

/* kiln convert images: the images of a list (each ROOT + its path) into a new LMDB of Datum
 * records keyed "%08d_PATH" in list order (after the shuffle, when asked), as Caffe's
 * convert_imageset writes them. Raw records hold the decoded C x H x W bytes; `encoded` ones the
 * file's own bytes when they decode to what was asked as they are (no resize, the file's own
 * channels), else the decoded image as PNG. Refuses (KILN_ERR_INVALID) when `out_path` exists;
 * writes into `out_path`.tmp and renames it when complete. */
typedef struct kiln_convert_images_opts {
  int new_height, new_width; /* 0, 0: as they are */
  bool gray;                 /* 1 channel, else 3 */
  bool encoded;
  bool shuffle;
  uint64_t seed;
} kiln_convert_images_opts;
int kiln_convert_images_to_lmdb(const char *list_path, const char *root, const char *out_path,
                                const kiln_convert_images_opts *opts, uint64_t *n_written);

/* ---- Datum records in LMDB or LevelDB (Caffe's Data layer source) ------------------------- */

/* Which database: what the path holds (a LevelDB is a directory with CURRENT and no data.mdb;
 * anything else is read as an LMDB), or one of the two, refusing the other. */
typedef enum kiln_db_backend { KILN_DB_ANY, KILN_DB_LMDB, KILN_DB_LEVELDB } kiln_db_backend;

typedef struct kiln_datum {
  int channels, height, width, label;
  const uint8_t *u8; /* channels*height*width bytes if the record holds `data`, else NULL */
  const float *f32;  /* float_data, if the record holds float_data instead, else NULL */
} kiln_datum;        /* from a reader: pointers valid until the next call on the db */

typedef struct kiln_datum_db kiln_datum_db;

/* Records with `encoded: true` hold a PNG or JPEG (Caffe's convert_imageset --encoded); the
 * reader decodes them and hands out the decoded bytes, with the image's own shape. */

/* Opens an LMDB (a directory holding data.mdb, or a single file) read-only, with a read
 * transaction held until close, or a LevelDB (a directory holding CURRENT) through a private view
 * that leaves the database as it is (src/data/datum_leveldb.c; opening reads every record once,
 * checksums checked); the handle may be used from any one thread at a time. Errors: KILN_ERR_IO
 * (path missing or unreadable), KILN_ERR_DATA (not a database, corrupt, empty, or not the
 * `backend` asked for: the message names both). */
int kiln_datum_db_open(const char *path, kiln_datum_db **out);
int kiln_datum_db_open_as(const char *path, kiln_db_backend backend, kiln_datum_db **out);
uint64_t kiln_datum_db_size(const kiln_datum_db *db);
/* `position` counts records consumed since the start; the cursor moves to record
 * (position % size) in key order. Cost is linear in the distance walked. */
int kiln_datum_db_seek(kiln_datum_db *db, uint64_t position);
/* Records consumed so far (monotonic, not wrapped). */
uint64_t kiln_datum_db_position(const kiln_datum_db *db);
/* How encoded records are decoded: AS_IS (the default, the file's own channels, as Caffe's
 * DecodeDatumToCVMatNative), or COLOR or GRAY (transform_param's force_color, force_gray). */
void kiln_datum_db_set_color(kiln_datum_db *db, kiln_image_color color);
/* Decodes the record at the cursor and advances, wrapping round to the first key after the
 * last. Every raw record must have the shape of the first raw one read (encoded images may
 * differ: the caller decides). On error the cursor does not move. Errors: KILN_ERR_DATA (not a
 * Datum, wrong data size, shape change, no pixels, a damaged image), KILN_ERR_UNSUPPORTED (an
 * image kiln cannot decode). */
int kiln_datum_db_next(kiln_datum_db *db, kiln_datum *out);
/* Random access: the record at `index` in key order (0 <= index < size), without moving the
 * sequential cursor. The first call builds an index of the keys (one pass over them). */
int kiln_datum_db_read(kiln_datum_db *db, uint64_t index, kiln_datum *out);
/* A digest of the database that another host can compare with its own copy's: the record
 * count and the raw keys and values of `samples` records spread evenly over the key order, the
 * first and the last among them (every record when there are no more than `samples`). Builds
 * the random-access index, as read() does; does not move the sequential cursor. */
int kiln_datum_db_fingerprint(kiln_datum_db *db, int samples, uint8_t digest[32]);
/* Key of the record that the last successful next() or read() returned (NUL-terminated copy). */
const char *kiln_datum_db_last_key(const kiln_datum_db *db);
void kiln_datum_db_close(kiln_datum_db *db);

/* Writes a new LMDB into `final_path`.tmp and renames it to `final_path` on commit, so a reader
 * never sees half a database. Refuses (KILN_ERR_INVALID) when `final_path` already exists; a
 * leftover `final_path`.tmp from an interrupted run is removed. Records are committed in chunks;
 * the map grows as needed. A record with an existing key replaces it. */
typedef struct kiln_datum_writer kiln_datum_writer;
int kiln_datum_writer_open(const char *final_path, kiln_datum_writer **out);
/* The same for a LevelDB (KILN_DB_LEVELDB: written in batches and compacted into sorted tables
 * before the rename) or an LMDB (KILN_DB_LMDB or KILN_DB_ANY). */
int kiln_datum_writer_open_as(const char *final_path, kiln_db_backend backend,
                              kiln_datum_writer **out);
/* `d` must hold exactly one of u8 / f32 (channels*height*width values). */
int kiln_datum_writer_put(kiln_datum_writer *w, const char *key, const kiln_datum *d);
/* An encoded record: `bytes` (a PNG or JPEG file) with `encoded: true` and the label, as Caffe's
 * convert_imageset --encoded writes it (no shape: the image carries it). */
int kiln_datum_writer_put_encoded(kiln_datum_writer *w, const char *key, const void *bytes,
                                  size_t n, int label);
/* Finishes, syncs, closes and renames into place; frees `w` whether or not it succeeds (on
 * failure the temporary is removed). */
int kiln_datum_writer_commit(kiln_datum_writer *w);
/* Removes the temporary and frees `w`; NULL is a no-op. */
void kiln_datum_writer_abort(kiln_datum_writer *w);

/* Converts an images IDX (N x H x W) and a labels IDX (N) into an LMDB of Datum records keyed
 * "%08d" (channels 1, H, W, the pixel bytes, the label), as Caffe's convert_mnist_data does.
 * Refuses (KILN_ERR_INVALID) when `out_path` exists; leaves nothing behind on failure.
 * `n_written` may be NULL. */
int kiln_convert_idx_to_lmdb(const char *images_path, const char *labels_path, const char *out_path,
                             uint64_t *n_written);
/* The same into a LevelDB (KILN_DB_LEVELDB), as Caffe's converters write with -backend leveldb,
 * or an LMDB. */
int kiln_convert_idx_to_db(const char *images_path, const char *labels_path, const char *out_path,
                           kiln_db_backend backend, uint64_t *n_written);

/* Caffe's compute_image_mean: the mean of every record of an LMDB or LevelDB, pixel by pixel
 * (C x H x W, summed in double), written to out_path as a binaryproto BlobProto with the legacy 1 x C x H x W
 * header (a temporary name, then a rename). Records of different shapes are KILN_ERR_DATA naming
 * the record's key (the reader's check). An out_path that is the database or one of its files, a
 * device, a FIFO or a folder is refused before anything is read (kiln_check_output).
 * `n_records` may be NULL. */
int kiln_compute_mean(const char *db_path, const char *out_path, uint64_t *n_records);

/* ---- object detection data (the SSD fork of Caffe: label maps, PASCAL VOC annotations,
 * AnnotatedDatum records, create_annoset) ---------------------------------------------------- */

/* A label map (the fork's labelmap_voc.prototxt: `item { name: "none_of_the_above" label: 0
 * display_name: "background" } item { name: "aeroplane" label: 1 ... }`, a LabelMap message in
 * text format): item i is name[i], label[i] and display_name[i] ("" when the item has none),
 * written at line[i], in the file's order. */
typedef struct kiln_labelmap {
  size_t n;
  char **name;
  int32_t *label;
  char **display_name;
  int *line;    /* the line each item starts on (0 when unknown) */
  char *source; /* the file's path, for messages */
} kiln_labelmap;
/* Parses a label map's text (`path` names it in messages) with kiln's text-format parser.
 * Errors: KILN_ERR_PARSE (the parser's message: the file, the line and the column), and
 * KILN_ERR_DATA naming the file and the item's line for a map of no items, an item without a
 * name or without a label, an empty name, a negative label, and two items with the same name or
 * the same label (both items named, with their lines). On failure *out is zeroed. */
int kiln_labelmap_parse(const char *text, size_t len, const char *path, kiln_labelmap *out);
/* The same for a file (KILN_ERR_IO when it cannot be read). */
int kiln_labelmap_read(const char *path, kiln_labelmap *out);
void kiln_labelmap_free(kiln_labelmap *m);
/* The index of the item named `name` (compared whole, case and all), or of the item with
 * `label`; -1 when there is none. */
int kiln_labelmap_find_name(const kiln_labelmap *m, const char *name);
int kiln_labelmap_find_label(const kiln_labelmap *m, int32_t label);

/* One object's box as AnnotatedDatum records hold it: its AnnotationGroup's label (the class),
 * its Annotation's instance_id, its NormalizedBBox (fractions of the image's width and height,
 * x right and y down) and `difficult`. The augmentation (anno.h) works on the same boxes. */
typedef struct kiln_anno_box {
  int label, instance_id;
  bool difficult;
  kiln_bbox box;
} kiln_anno_box;

/* One <object> of a PASCAL VOC annotation: `box` (group_label: the label map's label for its
 * <name>; instance_id: how many objects of that label come before it in the file; the
 * coordinates normalised as the fork does, xmin / width, ymin / height, xmax / width,
 * ymax / height, in float; difficult: <difficult>1</difficult>, 0 when absent), the <bndbox>
 * as written (pixels, xmin ymin xmax ymax) and the line of the <object>. */
typedef struct kiln_voc_object {
  kiln_anno_box box;
  double pixels[4];
  int line;
} kiln_voc_object;
typedef struct kiln_voc_annotation {
  int width, height, depth; /* <size>; depth 0 when absent */
  size_t n;                 /* at least one */
  kiln_voc_object *object;  /* in the file's order */
} kiln_voc_annotation;
/* Reads a VOC annotation (`<annotation>` with `<size>` `<width>` `<height>` [`<depth>`] and
 * `<object>`s, each with `<name>`, optional `<difficult>` 0 or 1, and `<bndbox>` `<xmin>`
 * `<ymin>` `<xmax>` `<ymax>`, numbers in pixels) through libxml2, with no network access, no
 * DTD (a document with a DOCTYPE is refused, so no entity is ever declared or expanded: no XXE)
 * and libxml2's messages kept, never printed. Other elements (<filename>, <pose>, <part>...)
 * are ignored. Errors, each naming `path` and the line: KILN_ERR_PARSE (not well-formed XML:
 * libxml2's message and line; an empty document), KILN_ERR_DATA (no <annotation> root; a <size>
 * missing, or a width or height that is not a whole number from 1 to KILN_IMAGE_MAX_SIDE, a
 * depth that is not a whole number >= 0; no <object> ("no objects"); an object without a <name>
 * or a <bndbox>, or with two; a name not in `map`; a coordinate missing or not a finite number;
 * xmin > xmax or ymin > ymax; a coordinate below 0 or beyond the width or height; a <difficult>
 * other than 0 or 1). Threads may parse at once: libxml2's error handlers are per thread, and
 * the calling thread's are kiln's during the parse and put back after it. On failure *out is
 * zeroed. */
int kiln_voc_parse(const char *xml, size_t len, const char *path, const kiln_labelmap *map,
                   kiln_voc_annotation *out);
/* The same for a file of at most 16 MiB (KILN_ERR_IO when it cannot be read). */
int kiln_voc_read(const char *path, const kiln_labelmap *map, kiln_voc_annotation *out);
void kiln_voc_free(kiln_voc_annotation *a);

/* Databases of AnnotatedDatum records (what the fork's create_annoset writes and its
 * AnnotatedData layer reads): a kiln_datum_db opened in annotated mode. Everything of the
 * kiln_datum_db API holds for it (LMDB or LevelDB, size, seek, position, set_color,
 * fingerprint, last_key, close; one thread at a time, any thread: open it on one, read it on a
 * prefetch thread), and each record's Datum is checked and decoded as kiln_datum_db_next does
 * (encoded PNG or JPEG decoded, raw bytes checked against the shape), except that raw records
 * may differ in shape from one another (detection images do). */
typedef struct kiln_annotated_datum {
  kiln_datum datum;          /* the image; label: the Datum's (create_annoset writes -1) */
  const kiln_anno_box *box;  /* n_box boxes in the record's order: group after group, each */
  size_t n_box;              /* group's annotations in order (0 boxes: none in the record) */
} kiln_annotated_datum;      /* pointers valid until the next call on the db */
/* Opens `path` (as kiln_datum_db_open_as) and reads its first record, so that a database of
 * plain Datum records or a damaged first record is refused here rather than at the first read;
 * the cursor is then back at record 0, position 0. */
int kiln_datum_db_open_annotated(const char *path, kiln_db_backend backend, kiln_datum_db **out);
bool kiln_datum_db_is_annotated(const kiln_datum_db *db);
/* The record at the cursor, then advance (kiln_datum_db_next), or record `index` in key order
 * without moving the cursor (kiln_datum_db_read), with its boxes. On a db not opened annotated:
 * KILN_ERR_INVALID. A damaged record is KILN_ERR_DATA naming the database and the key: not an
 * AnnotatedDatum (a plain Datum is not one), no datum, an annotation without a bbox, a
 * coordinate that is not finite; and the Datum's own errors; a type other than BBOX is
 * KILN_ERR_UNSUPPORTED. kiln_datum_db_next and kiln_datum_db_read on an annotated db give the
 * image alone. */
int kiln_datum_db_next_annotated(kiln_datum_db *db, kiln_annotated_datum *out);
int kiln_datum_db_read_annotated(kiln_datum_db *db, uint64_t index, kiln_annotated_datum *out);

/* Writes one AnnotatedDatum record (type BBOX) into a database that kiln_datum_writer_open_as
 * opened. The image is raw (`image->u8`, image's shape; f32 is refused) or, with `encoded`
 * non-NULL, the n bytes of a PNG or JPEG file with `encoded: true` and image's shape (which the
 * fork records and readers ignore); image->label is the Datum's label (create_annoset writes
 * -1). The boxes, in any order, become one AnnotationGroup per group_label, in ascending label
 * order, each holding its boxes in the order given with their instance_id, coordinates and
 * difficult. KILN_ERR_INVALID for a coordinate that is not finite. */
int kiln_datum_writer_put_annotated(kiln_datum_writer *w, const char *key,
                                    const kiln_datum *image, const void *encoded, size_t n,
                                    const kiln_anno_box *box, size_t n_box);

/* kiln convert annoset: the fork's create_annoset. LIST holds one `IMAGE ANNOTATION` pair a
 * line (two fields separated by spaces or tabs, both joined to `root` as they are, as Caffe
 * joins root_folder: VOC2007/JPEGImages/000005.jpg VOC2007/Annotations/000005.xml); blank
 * lines are skipped, any other line without exactly two fields is KILN_ERR_PARSE naming the
 * list and the line. Each pair becomes an AnnotatedDatum record keyed "%08d_IMAGE" in list
 * order (after the shuffle, when asked: Fisher-Yates from `seed`, as kiln convert images): the
 * image as kiln convert images writes it (raw C x H x W bytes; encoded, the file's own bytes
 * when they decode to what was asked as they are and, with encode_type, are of that format,
 * else the decoded image re-encoded: as encode_type, PNG without one), Datum label -1, and
 * the annotation's objects as boxes (kiln_voc_parse against the label map; normalised by the
 * annotation's <size>). Errors name the list's line and the file: an unreadable or damaged
 * image or annotation, and with check_size an image whose decoded size is not the
 * annotation's (both files named). The output is refused (KILN_ERR_INVALID) when it exists,
 * and written under a temporary name, renamed when complete; name_size (written last, through
 * a temporary name; the database is removed again if that fails) gets one `NAME HEIGHT WIDTH`
 * line per image in the list's order, NAME the image's file name without its extension, HEIGHT
 * and WIDTH its own size before any resize: the fork's test_name_size.txt, DetectionEvaluate's
 * name_size_file. Nothing is left at out_path on failure. */
typedef struct kiln_convert_annoset_opts {
  int new_height, new_width;  /* 0, 0: as they are */
  bool gray;                  /* 1 channel, else 3 */
  bool encoded;
  const char *encode_type;    /* NULL, "jpg" (or "jpeg") or "png"; implies encoded */
  bool shuffle;
  uint64_t seed;
  kiln_db_backend backend;    /* KILN_DB_LEVELDB, else an LMDB */
  const char *name_size;      /* NULL: none */
  bool check_size;
} kiln_convert_annoset_opts;
/* n_written and n_boxes (records and boxes written) may be NULL. */
int kiln_convert_annoset(const char *list_path, const char *root, const char *out_path,
                         const char *label_map_path, const kiln_convert_annoset_opts *opts,
                         uint64_t *n_written, uint64_t *n_boxes);

/* ---- HDF5 data files (Caffe's HDF5Data layer source) ------------------------------------- */

/* A file holds datasets of numbers (integer or floating point, at most 8 bytes each) in its root
 * group, whose first axis counts the records: dataset "data" of shape N x 3 x 32 x 32 holds N
 * records of 3 x 32 x 32 values. Read as float (docs/formats.md, "HDF5 data files"). */
#define KILN_H5DATA_MAX_SETS 16 /* datasets read from one file */

typedef struct kiln_h5data_shape {
  int naxes;                   /* 1 .. KILN_MAX_AXES */
  int64_t dims[KILN_MAX_AXES]; /* dims[0]: the records */
} kiln_h5data_shape;

/* Values in one record: the product of dims[1 ..] (1 for a dataset of one axis). */
int64_t kiln_h5data_record_size(const kiln_h5data_shape *s);

/* The path functions below read in a child process, which sends its answer back through a pipe:
 * a file that crashes libhdf5 itself (1.10.8 does on some damaged files) is KILN_ERR_PARSE naming
 * it ("libhdf5 crashed reading it ...: the file is damaged"), not the end of the process. The
 * _image functions read in this process (the fuzz target's way in). */

/* The shapes of datasets names[0 .. n) of the file at `path`, checked, reading only the file's
 * metadata: each is present (a dataset of the root group, not a link elsewhere), holds numbers,
 * has 1 to KILN_MAX_AXES axes and at least one record, and is stored inside the file itself
 * (no external or virtual storage, no bytes past the file's end); all hold the same number of
 * records. With `limit` (bytes, 0: none), the file's size plus its values as floats must not
 * exceed it (KILN_ERR_NOMEM, saying so). Errors name the file and the dataset: KILN_ERR_IO
 * (missing, not a regular file), KILN_ERR_PARSE (not HDF5, truncated, damaged), KILN_ERR_DATA
 * (a dataset missing or not as above). *bytes (may be NULL) gets the file's size. */
int kiln_h5data_inspect(const char *path, int n, const char *const *names, uint64_t limit,
                        kiln_h5data_shape *shapes, uint64_t *bytes);
/* The same for a file image in memory (`name` names it in messages). */
int kiln_h5data_inspect_image(const void *image, size_t len, const char *name, int n,
                              const char *const *names, uint64_t limit,
                              kiln_h5data_shape *shapes);
/* Reads the whole file into memory (the child's), checks it as kiln_h5data_inspect does, and
 * reads dataset i converted to float into dst[i], which has room for room[i] values (a dataset
 * holding more is KILN_ERR_DATA). Every value must be finite and within float's range (KILN_ERR_NUMERIC naming
 * the file, the dataset and the record). The file's bytes are refused against `limit` before
 * they are read. */
int kiln_h5data_load(const char *path, int n, const char *const *names, uint64_t limit,
                     kiln_h5data_shape *shapes, float *const *dst, const uint64_t *room);
/* Memory that the reader's worker process fills in place: HDF5Data's file buffers. A shared
 * mapping of a memory file (fd >= 0) where the system gives one, so a file's values reach the
 * caller without a copy through a pipe; else plain memory (fd -1), filled through the pipe. */
typedef struct kiln_h5data_region {
  float *base;
  size_t bytes;
  int fd;
} kiln_h5data_region;
int kiln_h5data_region_new(size_t bytes, kiln_h5data_region *r);
void kiln_h5data_region_free(kiln_h5data_region *r);
/* kiln_h5data_load into a region: dataset i at base + offset[i] (values), room[i] values there;
 * each must lie inside the region (KILN_ERR_INVALID). */
int kiln_h5data_load_region(const char *path, int n, const char *const *names, uint64_t limit,
                            kiln_h5data_shape *shapes, const kiln_h5data_region *r,
                            const uint64_t *offset, const uint64_t *room);
/* The same on a file image in memory, which is only read (in place, not copied). */
int kiln_h5data_load_image(const void *image, size_t len, const char *name, int n,
                           const char *const *names, uint64_t limit, kiln_h5data_shape *shapes,
                           float *const *dst, const uint64_t *room);
/* Adds to `h` the file's size and `samples` runs of 64 bytes spread evenly over it, the first at
 * its start and the last at its end: a fingerprint of a data file that reads little of it. */
int kiln_h5data_sample(const char *path, int samples, kiln_sha256_ctx *h);
/* Writes datasets names[0 .. n) of little-endian floats, dataset i of shapes[i] holding data[i],
 * as a new HDF5 file at `path`: made in memory, then written whole through a temporary name and
 * a rename, so no partial file ever carries the name. */
int kiln_h5data_write(const char *path, int n, const char *const *names,
                      const kiln_h5data_shape *shapes, const float *const *data);
/* Converts an images IDX (N x H x W) and a labels IDX (N) into an HDF5 data file: "data" of
 * N x 1 x H x W floats (the pixel values, 0 to 255) and "label" of N floats, the records that
 * kiln_convert_idx_to_lmdb writes as Datum records, in the same order. Refuses
 * (KILN_ERR_INVALID) when `out_path` exists. `n_written` may be NULL. */
int kiln_convert_idx_to_h5(const char *images_path, const char *labels_path, const char *out_path,
                           uint64_t *n_written);

/* ---- the data set cache ------------------------------------------------------------------ */

/* The configuration's data set cache (kiln_config.data_dir: $KILN_DATA if set and non-empty,
 * else $HOME/.cache/kiln/datasets; NULL: the defaults, which know none), created (mkdir -p) if
 * missing. */
int kiln_data_cache_dir(const kiln_config *cfg, char *buf, size_t n);
/* `$KILN_DATA/...` (or `${KILN_DATA}/...`) names a file in the data set cache, so nets in the zoo
 * need no absolute paths; any other path is copied as it is. */
int kiln_data_source_path(const kiln_config *cfg, const char *src, char *out, size_t n);
/* A text source's vocabulary file: `given` resolved as a source is when the net names one, else
 * the file `name` ("vocab.txt", "target_vocab.txt") beside the resolved `source`, as TextData and
 * `kiln test --decode` both look for it. */
int kiln_data_vocab_path(const kiln_config *cfg, const char *given, const char *source,
                         const char *name, char *out, size_t n);

/* Where Debian's dataset-fashion-mnist package puts the files. */
#define KILN_FASHION_MNIST_SYSTEM_DIR "/usr/share/datasets/fashion-mnist"

/* Checks the SHA-256 of the four Fashion-MNIST .gz files in `src_dir` (NULL: the system
 * directory above), converts them into CACHE/fashion-mnist/train_lmdb and test_lmdb and
 * writes CACHE/fashion-mnist/READY last (CACHE: `cache_dir`, from kiln_data_cache_dir). When
 * READY is already there nothing is done and *already (may be NULL) is set to true. Concurrent
 * callers are serialised by a lock file. A hash mismatch gives KILN_ERR_DATA naming the file and
 * both hashes. */
int kiln_data_fetch_fashion_mnist(const char *src_dir, const char *cache_dir, bool *already);

/* Every fetch writes CACHE/NAME/SHA256SUMS (the SHA-256 of each file of the entry, an LMDB's
 * data.mdb included, its lock.mdb not) just before READY; seal writes it again (after files
 * were added). verify: *intact is false when READY is missing (not cached); true when every
 * listed file is there with its checksum and no other (an entry cached before checksums were
 * kept gets its SHA256SUMS now); KILN_ERR_DATA naming the file that is missing, differs or is
 * new, after removing READY so that the next fetch rebuilds the entry. */
int kiln_data_entry_seal(const char *cache_dir, const char *name);
int kiln_data_entry_verify(const char *cache_dir, const char *name, bool *intact);

/* The data sets kiln knows, for `kiln data list`: name and where the data come from. */
typedef struct kiln_data_set_entry {
  const char *name, *source;
} kiln_data_set_entry;
size_t kiln_data_sets(const kiln_data_set_entry **out);
/* Whether CACHE/NAME is cached (READY there) and the bytes of its files. */
int kiln_data_entry_size(const char *cache_dir, const char *name, bool *cached, uint64_t *bytes);

/* ---- text data sets ---------------------------------------------------------------------- */

/* A text data set of the cache: an npm package of @stdlib's data sets (a .tgz of JSON files),
 * pinned by version and SHA-256, converted into CACHE/NAME/{train,valid,test}.txt (corpora:
 * documents in order, a blank line between) or .tsv (labelled records, one per line:
 * "LABEL<TAB>TEXT" with \\, \t, \n and \r escaped in the mails; "WORD<TAB>PHONEMES" in the
 * dictionary). */
typedef struct kiln_text_set_info {
  const char *name;    /* "moby-dick", "sotu", "spam-assassin", "cmudict" */
  const char *package; /* the npm package */
  const char *version;
  const char *sha256;  /* of the tarball `npm pack PACKAGE@VERSION` writes */
  const char *what;    /* one line: the content and the splits */
} kiln_text_set_info;

typedef struct kiln_text_set_counts {
  size_t records[3]; /* train, valid, test */
  uint64_t bytes[3];
} kiln_text_set_counts;

/* NULL for an unknown name. */
const kiln_text_set_info *kiln_text_set_find(const char *name);
/* "moby-dick, sotu, ..." for messages. */
const char *kiln_text_set_names(void);
/* Converts the package tarball into the three split files in out_dir (each written whole under
 * a temporary name first), without checking the tarball's hash (the tests' own small archives).
 * A damaged archive or record is KILN_ERR_DATA naming the tarball and the member; a split left
 * empty is an error too. `counts` may be NULL. */
int kiln_text_set_convert(const kiln_text_set_info *set, const char *tarball, const char *out_dir,
                          kiln_text_set_counts *counts);
/* CACHE/NAME/READY is there: nothing to do (*already = true) but write the set's vocab.txt (and
 * cmudict's target_vocab.txt), and Moby Dick's words-*.tsv (adding their line to READY), where
 * they are missing. Otherwise checks the tarball's SHA-256 against the pinned one, converts it
 * into CACHE/NAME, writes vocab.txt (from the train split, by the set's fixed rule;
 * docs/formats.md; for cmudict the words' characters, and target_vocab.txt the phonemes with
 * <s> and </s> reserved), for moby-dick the
 * word-boundary set words-{train,valid,test}.tsv (TextData TAGGED records from the split files:
 * the text without white space, 1 where a word starts) and READY last, with concurrent callers
 * serialised by a lock file. A NULL tarball is an error unless READY exists. */
int kiln_data_fetch_text(const char *name, const char *tarball, const char *cache_dir,
                         bool *already);

/* ---- libsvm (svmlight) files: sparse rows (src/data/libsvm.c; docs/formats.md, "libsvm") ---- */

/* Feature indices are 1-based in the file and at most this (they are held as 0-based int32). */
#define KILN_LIBSVM_MAX_DIM INT32_MAX

typedef struct kiln_libsvm {
  kiln_csr x;       /* one row per record; x.cols: `dim` when given, else the largest index */
  float *label;     /* x.rows labels, as written */
  int64_t max_row_nnz; /* entries of the fullest row */
} kiln_libsvm;

/* Parses libsvm text text[0 .. len) (`name` is the file's name in messages): a record per line,
 * `LABEL INDEX:VALUE ...` with indices 1-based and strictly increasing within the line, white
 * space of spaces and tabs, `#` to the end of the line a comment, blank lines skipped. dim > 0:
 * an index above it is refused; 0: any up to KILN_LIBSVM_MAX_DIM. KILN_ERR_PARSE naming the
 * file, the line and the token for index 0, a non-increasing index, an index past `dim`, a
 * `qid:` token (not supported), a label or value that is not a finite number, and anything
 * else that is not INDEX:VALUE. Memory is proportional to the entries. On failure *out is
 * zeroed. */
int kiln_libsvm_parse(const char *text, size_t len, const char *name, int64_t dim,
                      kiln_libsvm *out);
/* kiln_libsvm_parse on the whole file at `path` (KILN_ERR_IO when it cannot be read). */
int kiln_libsvm_read(const char *path, int64_t dim, kiln_libsvm *out);
void kiln_libsvm_free(kiln_libsvm *s);

/* Caches CACHE/spam-bow from the cached spam-assassin (KILN_ERR_INVALID when it is not there):
 * its train, valid and test splits as train.svm, valid.svm, test.svm (libsvm rows: feature i is
 * word id i - 1 of its vocab.txt, copied beside them; binary presence scaled to unit length),
 * SHA256SUMS, and READY last, with concurrent callers serialised by a lock file; with READY
 * there nothing is done (*already true; may be NULL). src/data/bow_sets.c. */
int kiln_data_fetch_spam_bow(const char *cache_dir, bool *already);

/* ---- tokens and vocabularies --------------------------------------------------------------- */

/* Characters (UTF-8 code points) or words (runs of letters and digits with inner apostrophes;
 * every other character but white space a token of its own): src/data/vocab.c. */
typedef enum { KILN_TOKENS_CHAR = 0, KILN_TOKENS_WORD = 1 } kiln_token_level;
typedef int (*kiln_token_fn)(void *user, const char *token, size_t len);
/* Calls fn with each token of text[0 .. n) in order (lowercased ASCII when asked); stops at the
 * first status fn returns that is not KILN_OK, and returns it. */
int kiln_tokenize(const char *text, size_t n, kiln_token_level level, bool lowercase,
                  kiln_token_fn fn, void *user);

#define KILN_VOCAB_PAD "<pad>"
#define KILN_VOCAB_UNK "<unk>"
/* A target's start and end (TextData's PAIRS mode, kiln decode): a target vocabulary holds both. */
#define KILN_VOCAB_BOS "<s>"
#define KILN_VOCAB_EOS "</s>"
#define KILN_VOCAB_MAX_TOKENS (1 << 24)

/* Token i <-> id i. The file (docs/formats.md, "Vocabulary files"): a first line naming the
 * level, the lowercasing and the count, then one token per line with \\ \n \t \r \s (space)
 * \0 escaped; id = line number - 2. "<pad>" and "<unk>", where present, are the padding and the
 * unknown token. */
typedef struct kiln_vocab kiln_vocab;
int kiln_vocab_read(const char *path, kiln_vocab **out);
/* Written whole under a temporary name, then renamed. */
int kiln_vocab_write(const kiln_vocab *v, const char *path);
void kiln_vocab_free(kiln_vocab *v);
/* The id of a token, -1 when it has none. */
int kiln_vocab_id(const kiln_vocab *v, const char *token, size_t len);
int kiln_vocab_size(const kiln_vocab *v);
int kiln_vocab_pad_id(const kiln_vocab *v); /* -1: none */
int kiln_vocab_unk_id(const kiln_vocab *v); /* -1: none */
kiln_token_level kiln_vocab_level(const kiln_vocab *v);
bool kiln_vocab_lowercase(const kiln_vocab *v);
/* Token `id`'s bytes (not NUL-terminated in general: `len`); NULL outside 0 .. size - 1. */
const char *kiln_vocab_token(const kiln_vocab *v, int id, size_t *len);

/* Counting tokens over any number of texts, then the vocabulary: <pad> (id 0), <unk> (id 1),
 * the reserved tokens, then the tokens seen at least min_count times, most frequent first (ties
 * in byte order), at most max_size tokens in all (0: no limit). */
typedef struct kiln_vocab_builder kiln_vocab_builder;
int kiln_vocab_builder_new(kiln_token_level level, bool lowercase, kiln_vocab_builder **out);
/* A token the vocabulary holds whether the text has it or not, with the ids after <pad> and
 * <unk> in the order reserved (a target vocabulary's <s> and </s>: ids 2 and 3); at most
 * KILN_VOCAB_MAX_RESERVED. */
#define KILN_VOCAB_MAX_RESERVED 8
int kiln_vocab_builder_reserve(kiln_vocab_builder *b, const char *token);
int kiln_vocab_builder_add(kiln_vocab_builder *b, const char *text, size_t n);
/* kiln_vocab_builder_add as a kiln_text_record_fn (user: the builder), for counting every
 * record of a file with kiln_text_records. */
int kiln_vocab_builder_add_record(void *builder, const char *text, size_t len, int label,
                                  int line);
/* The tokens counted so far (every occurrence): a text that adds none is an empty corpus. */
int64_t kiln_vocab_builder_tokens(const kiln_vocab_builder *b);
/* The one rule for max_size, which finish applies too: 0 (no limit), or room for <pad>, <unk>,
 * the reserved tokens and one token of the text, up to KILN_VOCAB_MAX_TOKENS; KILN_ERR_INVALID
 * saying so otherwise. Checking it before the texts are read saves reading them in vain. */
int kiln_vocab_builder_check_size(const kiln_vocab_builder *b, int max_size);
int kiln_vocab_builder_finish(kiln_vocab_builder *b, int64_t min_count, int max_size,
                              kiln_vocab **out);
void kiln_vocab_builder_free(kiln_vocab_builder *b);

/* The Levenshtein distance between a[0 .. na) and b[0 .. nb): the fewest insertions, deletions
 * and substitutions of one token that turn a into b (a decoded sequence against its reference:
 * the token error rate is the sum of the distances over the sum of the references' lengths). */
int kiln_edit_distance(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t *out);

/* ---- text records ------------------------------------------------------------------------- */

/* The records of a text file: a .tsv file is one record per line, "LABEL<TAB>TEXT" with LABEL a
 * whole number in 0 .. 2^31-1 and \\ \t \n \r escaped in TEXT (the text data sets' format);
 * any other file is one record, its whole text, label -1. fn gets each record's text (decoded,
 * NUL-terminated, `len` bytes), its label and its line; a malformed line is KILN_ERR_PARSE naming
 * the file and line. Files of more than KILN_TEXT_RECORDS_MAX_BYTES are refused. */
#define KILN_TEXT_RECORDS_MAX_BYTES ((size_t)1 << 30)
typedef int (*kiln_text_record_fn)(void *user, const char *text, size_t len, int label, int line);
int kiln_text_records(const char *path, kiln_text_record_fn fn, void *user);
/* Appends text[0 .. n) to b escaped as a .tsv field (\\ \t \n \r), the inverse of what
 * kiln_text_records decodes. */
void kiln_text_escape(kiln_strbuf *b, const char *text, size_t n);
/* The tagged records of a .tsv file, one per line: "TAGS<TAB>TEXT" with TAGS whole numbers in
 * 0 .. 2^31-1 separated by spaces (meant as one per token of TEXT; the reader does not know the
 * tokenizer, so the caller checks the count) and TEXT escaped as above. fn gets each record's
 * decoded text, its tags (valid until fn returns) and its line. A file that is not .tsv is
 * KILN_ERR_DATA; a malformed line (no tab, a tag that is no whole number, a bad escape)
 * KILN_ERR_PARSE naming the file and line. */
typedef int (*kiln_text_tagged_fn)(void *user, const char *text, size_t len, const int32_t *tags,
                                   size_t ntags, int line);
int kiln_text_tagged_records(const char *path, kiln_text_tagged_fn fn, void *user);
/* The records of a .tsv file of pairs, one per line: "SOURCE<TAB>TARGET" (a word and its
 * pronunciation, a sentence and its translation), both escaped as TEXT above, TARGET running to
 * the end of the line. fn gets each record's decoded source and target (NUL-terminated, valid
 * until fn returns) and its line. A file that is not .tsv is KILN_ERR_DATA; a malformed line (no
 * tab, a bad escape) KILN_ERR_PARSE naming the file and line. */
typedef int (*kiln_text_pair_fn)(void *user, const char *source, size_t slen, const char *target,
                                 size_t tlen, int line);
int kiln_text_pairs(const char *path, kiln_text_pair_fn fn, void *user);

/* ---- CIFAR-10 and CIFAR-100 (binary version) --------------------------------------------- */

/* Every image is 3 x 32 x 32 bytes, channel-planar (all R, then G, then B), which is Caffe's
 * C x H x W. A CIFAR-10 record is 1 label byte + the image; a CIFAR-100 record is a coarse label
 * byte, a fine label byte, then the image. */
#define KILN_CIFAR_CHANNELS 3
#define KILN_CIFAR_SIZE 32
#define KILN_CIFAR_IMAGE_BYTES (KILN_CIFAR_CHANNELS * KILN_CIFAR_SIZE * KILN_CIFAR_SIZE)
/* Sources holding more records than this are refused as absurd (the real sets hold 60,000). */
#define KILN_CIFAR_MAX_RECORDS (1u << 24)

typedef enum kiln_cifar_kind {
  KILN_CIFAR10,         /* 10 classes */
  KILN_CIFAR100_FINE,   /* 100 classes */
  KILN_CIFAR100_COARSE, /* the same records with their 20 superclass labels */
  KILN_CIFAR_KIND_COUNT
} kiln_cifar_kind;

typedef struct kiln_cifar_set {
  uint32_t n;
  uint8_t *labels; /* n labels, of the kind asked for */
  uint8_t *pixels; /* n * KILN_CIFAR_IMAGE_BYTES, record after record */
} kiln_cifar_set;     /* free with kiln_cifar_free() */

/* Classes of a kind (10, 100 or 20); 0 for an unknown kind. */
int kiln_cifar_num_classes(kiln_cifar_kind kind);
/* Bytes per record in the files: 3073 (CIFAR-10) or 3074 (CIFAR-100). */
size_t kiln_cifar_record_bytes(kiln_cifar_kind kind);

/* Reads the train split (CIFAR-10: data_batch_1.bin .. data_batch_5.bin concatenated in that
 * order; CIFAR-100: train.bin) or the test split (test_batch.bin; test.bin) from `source`, which
 * is one of:
 *   - the published archive, cifar-10-binary.tar.gz (members under cifar-10-batches-bin/) or
 *     cifar-100-binary.tar.gz (under cifar-100-binary/), gzipped or as a plain tar;
 *   - the folder of .bin files, or the folder it was unpacked into (holding
 *     cifar-10-batches-bin/ or cifar-100-binary/).
 * Both CIFAR-100 labels are checked; `kind` chooses which is kept. Errors: KILN_ERR_IO (source
 * or a .bin file missing or unreadable; the message names the file), KILN_ERR_DATA (not a gzip
 * or tar archive, archive truncated, corrupt gzip data or tar header, missing member, a file
 * whose size is not a multiple of the record size, a label out of range: each names the file or
 * member and the byte offset or record index), KILN_ERR_INVALID (unknown kind). On failure *out
 * is zeroed. */
int kiln_cifar_read(const char *source, kiln_cifar_kind kind, bool train, kiln_cifar_set *out);
void kiln_cifar_free(kiln_cifar_set *s);

/* Converts one split into an LMDB of Datum records (3 x 32 x 32 bytes and the label) keyed
 * "%05d" from 00000 in record order, as Caffe's convert_cifar_data does. Refuses
 * (KILN_ERR_INVALID) when `out_path` exists; leaves nothing behind on failure. `n_written` may be
 * NULL. */
int kiln_convert_cifar_to_lmdb(const char *source, kiln_cifar_kind kind, bool train,
                               const char *out_path, uint64_t *n_written);

/* Caches a user's binary CIFAR archive (or folder; as kiln_cifar_read takes it) as
 * CACHE/cifar10 or CACHE/cifar100 (fine labels): train_lmdb, test_lmdb, SHA256SUMS and READY
 * last. Nothing is downloaded: with READY there nothing is done (*already true, may be NULL);
 * without it a NULL archive is KILN_ERR_INVALID saying which archive to give. CIFAR's Python
 * and MATLAB archives are refused, naming the binary one. */
int kiln_data_fetch_cifar(kiln_cifar_kind kind, const char *archive, const char *cache_dir,
                          bool *already);

/* ---- detection sets in PASCAL VOC's layout (shapes-det, voc2007) ---------------------------- */

/* An entry holds JPEGImages/ID.jpg, Annotations/ID.xml (VOC's XML, boxes in 1-based pixels),
 * ImageSets/Main/{trainval,test}.txt (ids), trainval.txt and test.txt (create_annoset's lists:
 * "JPEGImages/ID.jpg Annotations/ID.xml" a line, relative to the entry), test_name_size.txt
 * ("ID HEIGHT WIDTH" a test image) and labelmap.prototxt (the SSD fork's LabelMap, background 0);
 * docs/detection.md, "Detection sets". */

/* The cache's shapes-det: this seed, these counts. */
#define KILN_SHAPES_DET_SEED 1701
#define KILN_SHAPES_DET_TRAINVAL 4000
#define KILN_SHAPES_DET_TEST 1000

/* shapes-det, kiln's synthetic detection set (discs, squares, triangles and crosses on cluttered
 * backgrounds: src/data/shapes_det.c), in VOC's layout in `dir` (created when missing; files of
 * the same names replaced), with a README: trainval images 1 .. trainval, test images
 * trainval + 1 .. trainval + test, each a function of the seed and its id alone. `summary` (may
 * be NULL) gets a line per split: ids, images, objects per class, truncated, difficult.
 * KILN_ERR_INVALID for a count of 0 or more than 999999 images in all. */
int kiln_shapes_det_write(const char *dir, uint64_t seed, uint32_t trainval, uint32_t test,
                          kiln_strbuf *summary);
/* Caches CACHE/shapes-det (seed KILN_SHAPES_DET_SEED, KILN_SHAPES_DET_TRAINVAL and
 * KILN_SHAPES_DET_TEST images), SHA256SUMS, and READY last, naming the generator's version, with
 * concurrent callers serialised by a lock file; with READY of this version there nothing is
 * done (*already true; may be NULL), an older one is drawn again. src/data/shapes_det_set.c. */
int kiln_data_fetch_shapes_det(const char *cache_dir, bool *already);
/* Caches CACHE/voc2007 from the user's PASCAL VOC 2007 tar files (n of them, 1 or 2; plain or
 * gzipped): VOCtrainval_06-Nov-2007.tar (the trainval split) and VOCtest_06-Nov-2007.tar (the
 * test split, with annotations). Their VOCdevkit/VOC2007/ JPEGImages, Annotations and
 * ImageSets/Main members go into the entry, then the lists, test_name_size.txt (from the
 * annotations' sizes), labelmap.prototxt (VOC's 20 classes), SHA256SUMS and READY. A tar
 * without VOCdevkit/VOC2007/ members or without either split's list is KILN_ERR_DATA naming it;
 * an id a list names without its image or annotation KILN_ERR_DATA naming both. With READY
 * there and every split of the tars cached nothing is done (*already true); a tar of a split
 * the entry lacks is added to it. src/data/voc_import.c. */
int kiln_data_fetch_voc2007(const char *const *tars, int n, const char *cache_dir, bool *already);

#endif
