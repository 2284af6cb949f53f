/* AnnotatedData, the SSD fork's data layer, on tiny databases of AnnotatedDatum records made
 * here: the TEST transform (a WARP resize, mean and scale) against kiln_image_warp's own pixels
 * and the label rows exactly (an image without boxes in a batch, a batch without any: the -1
 * row); TRAIN's mirror with the boxes on the bright squares they mark; batch samplers,
 * expansion and both fixed resizes keeping every box on its object's pixels; FIT_SMALL_SIZE's
 * batches of one image of its own size; the same seed the same batches (whatever the prefetch
 * depth), another seed others, a cursor resuming exactly; data-parallel workers reading the
 * global batches of one stream; and the errors, each naming the layer (and the record: one of
 * another size, a label the label map lacks, a damaged image). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/anno.h"
#include "kiln/data.h"
#include "layer_test.h"

static char dir[256], det_path[300], squares_path[300], plain_path[300], map_path[300],
    damaged_path[300];

/* ---- the databases ------------------------------------------------------------------------ */

/* det: six records of several sizes. 0: 8x12 of one colour (10, 20, 30), boxes of labels 1 and
 * 2; 1: 6x6 of (100, 110, 120), none; 2: a 5x7 pattern, none; 3: a 10x5 pattern, two boxes of
 * label 3 (the second difficult); 4: 4x4 of one colour, none; 5: a 9x9 pattern, none. */
enum { NDET = 6 };
static const int det_h[NDET] = {8, 6, 5, 10, 4, 9}, det_w[NDET] = {12, 6, 7, 5, 4, 9};

static uint8_t det_pixel(int r, int c, int y, int x) {
  static const uint8_t colour[NDET][3] = {
      {10, 20, 30}, {100, 110, 120}, {0, 0, 0}, {0, 0, 0}, {200, 5, 60}, {0, 0, 0}};
  if (r == 0 || r == 1 || r == 4) return colour[r][c];
  return (uint8_t)(r * 37 + c * 50 + y * 23 + x * 11);
}

static const kiln_anno_box det_boxes0[] = {
    {.label = 1, .instance_id = 0, .box = {0.125f, 0.25f, 0.5f, 0.75f}},
    {.label = 2, .instance_id = 0, .difficult = true, .box = {0.5f, 0.5f, 0.875f, 1.0f}},
};
static const kiln_anno_box det_boxes3[] = {
    {.label = 3, .instance_id = 0, .box = {0.2f, 0.1f, 0.6f, 0.9f}},
    {.label = 3, .instance_id = 1, .difficult = true, .box = {0.0f, 0.0f, 1.0f, 1.0f}},
};

static void det_image(int r, uint8_t *px) {
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < det_h[r]; y++)
      for (int x = 0; x < det_w[r]; x++)
        px[(c * det_h[r] + y) * det_w[r] + x] = det_pixel(r, c, y, x);
}

/* squares: 32 records of 24x32, a background of 20 with a square of 250 in the left half
 * (label 1 + r % 4) and, in every third record, one of 240 in the right half (label
 * 1 + (r + 1) % 4); each square's box is its pixels exactly. */
enum { NSQ = 32, SQ_H = 24, SQ_W = 32 };
typedef struct {
  int n;
  int x0[2], y0[2], side[2], label[2];
  uint8_t value[2];
} squares;

static squares squares_of(int r) {
  squares q = {.n = r % 3 == 0 ? 2 : 1};
  q.side[0] = 6 + r % 4;
  q.x0[0] = 1 + (r * 5) % (15 - q.side[0]);
  q.y0[0] = 1 + (r * 7) % (23 - q.side[0]);
  q.label[0] = 1 + r % 4;
  q.value[0] = 250;
  q.side[1] = 5 + r % 3;
  q.x0[1] = 17 + (r * 3) % (31 - 17 - q.side[1]);
  q.y0[1] = 1 + (r * 11) % (23 - q.side[1]);
  q.label[1] = 1 + (r + 1) % 4;
  q.value[1] = 240;
  return q;
}

static void squares_image(int r, uint8_t *px) {
  const squares q = squares_of(r);
  memset(px, 20, 3 * SQ_H * SQ_W);
  for (int k = 0; k < q.n; k++)
    for (int c = 0; c < 3; c++)
      for (int y = q.y0[k]; y < q.y0[k] + q.side[k]; y++)
        for (int x = q.x0[k]; x < q.x0[k] + q.side[k]; x++) px[(c * SQ_H + y) * SQ_W + x] = q.value[k];
}

static int write_det(void) {
  kiln_datum_writer *w;
  if (kiln_datum_writer_open_as(det_path, KILN_DB_LMDB, &w)) return -1;
  for (int r = 0; r < NDET; r++) {
    uint8_t px[3 * 10 * 12];
    det_image(r, px);
    kiln_datum d = {.channels = 3, .height = det_h[r], .width = det_w[r], .label = -1, .u8 = px};
    char key[16];
    snprintf(key, sizeof key, "%08d", r);
    const kiln_anno_box *b = r == 0 ? det_boxes0 : r == 3 ? det_boxes3 : NULL;
    if (kiln_datum_writer_put_annotated(w, key, &d, NULL, 0, b, b ? 2 : 0)) return -1;
  }
  return kiln_datum_writer_commit(w) ? -1 : 0;
}

static int write_squares(void) {
  kiln_datum_writer *w;
  if (kiln_datum_writer_open_as(squares_path, KILN_DB_LMDB, &w)) return -1;
  for (int r = 0; r < NSQ; r++) {
    uint8_t px[3 * SQ_H * SQ_W];
    squares_image(r, px);
    const squares q = squares_of(r);
    kiln_anno_box b[2];
    for (int k = 0; k < q.n; k++)
      b[k] = (kiln_anno_box){.label = q.label[k],
                             .box = {(float)q.x0[k] / SQ_W, (float)q.y0[k] / SQ_H,
                                     (float)(q.x0[k] + q.side[k]) / SQ_W,
                                     (float)(q.y0[k] + q.side[k]) / SQ_H}};
    kiln_datum d = {.channels = 3, .height = SQ_H, .width = SQ_W, .label = -1, .u8 = px};
    char key[16];
    snprintf(key, sizeof key, "%08d", r);
    /* through an encoded PNG for half of them: the layer decodes either */
    uint8_t *png = NULL;
    size_t len = 0;
    if (r % 2 && kiln_image_encode_png(px, 3, SQ_H, SQ_W, &png, &len)) return -1;
    int rc = kiln_datum_writer_put_annotated(w, key, &d, png, len, b, (size_t)q.n);
    free(png);
    if (rc) return -1;
  }
  return kiln_datum_writer_commit(w) ? -1 : 0;
}

static int write_plain(void) {
  kiln_datum_writer *w;
  if (kiln_datum_writer_open_as(plain_path, KILN_DB_LMDB, &w)) return -1;
  uint8_t px[3 * 4 * 4] = {0};
  kiln_datum d = {.channels = 3, .height = 4, .width = 4, .label = 1, .u8 = px};
  if (kiln_datum_writer_put(w, "00000000", &d)) return -1;
  return kiln_datum_writer_commit(w) ? -1 : 0;
}

/* damaged: a good record, then a PNG cut in half. */
static int write_damaged(void) {
  kiln_datum_writer *w;
  if (kiln_datum_writer_open_as(damaged_path, KILN_DB_LMDB, &w)) return -1;
  uint8_t px[3 * SQ_H * SQ_W], *png = NULL;
  size_t len = 0;
  squares_image(0, px);
  kiln_datum d = {.channels = 3, .height = SQ_H, .width = SQ_W, .label = -1, .u8 = px};
  int rc = kiln_datum_writer_put_annotated(w, "00000000", &d, NULL, 0, NULL, 0);
  if (!rc) rc = kiln_image_encode_png(px, 3, SQ_H, SQ_W, &png, &len);
  if (!rc) rc = kiln_datum_writer_put_annotated(w, "00000001", &d, png, len / 2, NULL, 0);
  free(png);
  if (rc) return -1;
  return kiln_datum_writer_commit(w) ? -1 : 0;
}

static int make_dbs(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-anno-layer-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(det_path, sizeof det_path, "%s/det", dir);
  snprintf(squares_path, sizeof squares_path, "%s/squares", dir);
  snprintf(plain_path, sizeof plain_path, "%s/plain", dir);
  snprintf(map_path, sizeof map_path, "%s/labelmap.prototxt", dir);
  snprintf(damaged_path, sizeof damaged_path, "%s/damaged", dir);
  const char *map = "item { name: 'background' label: 0 }\nitem { name: 'a' label: 1 }\n"
                    "item { name: 'b' label: 2 }\n";
  return write_det() || write_squares() || write_plain() || write_damaged() ||
                 kiln_write_file_atomic(map_path, map, strlen(map))
             ? -1
             : 0;
}

static int remove_dbs(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

/* ---- layers ------------------------------------------------------------------------------- */

typedef struct {
  Caffe__LayerParameter *lp;
  kiln_blob *top[2];
  kiln_layer *l;
} anno_layer;

/* The layer 'ad' on `src` with `rest` after data_param's source and backend (the rest of
 * data_param, its closing brace, and the other blocks). */
static int open_anno(anno_layer *a, const char *src, const char *rest, int phase, uint64_t seed) {
  char text[2048];
  snprintf(text, sizeof text,
           "name: 'ad' type: 'AnnotatedData' top: 'data' top: 'label' data_param { source: '%s' "
           "backend: LMDB %s",
           src, rest);
  a->lp = gc_layer_param(text);
  a->top[0] = kiln_blob_new("data");
  a->top[1] = kiln_blob_new("label");
  return kiln_layer_create(a->lp, phase, NULL, 0, a->top, 2, seed, kiln_test_config(), &a->l);
}

static void must_open(anno_layer *a, const char *src, const char *rest, int phase, uint64_t seed) {
  if (open_anno(a, src, rest, phase, seed)) fail_msg("'%s': %s", rest, kiln_last_error());
}

static void close_anno(anno_layer *a) {
  kiln_layer_free(a->l);
  kiln_blob_free(a->top[0]);
  kiln_blob_free(a->top[1]);
  protobuf_c_message_free_unpacked(&a->lp->base, NULL);
}

static void next(anno_layer *a) {
  if (layer_forward(a->l) != KILN_OK) fail_msg("forward: %s", kiln_last_error());
}

/* One batch as the layer gave it: the data's shape and values, the label rows. */
enum { MAX_DATA = 8 * 3 * 32 * 32, MAX_ROWS = 64 };
typedef struct {
  int64_t shape[4], rows;
  float data[MAX_DATA], label[MAX_ROWS * 8];
} batch;

static void take(anno_layer *a, batch *b) {
  next(a);
  assert_int_equal(a->top[0]->naxes, 4);
  assert_true(a->top[0]->count <= MAX_DATA);
  memcpy(b->shape, a->top[0]->shape, sizeof b->shape);
  memcpy(b->data, a->top[0]->data, sizeof(float) * (size_t)a->top[0]->count);
  expect_shape(a->top[1], 4, SHAPE(1, 1, a->top[1]->shape[2], 8));
  b->rows = a->top[1]->shape[2];
  assert_true(b->rows <= MAX_ROWS);
  memcpy(b->label, a->top[1]->data, sizeof(float) * (size_t)a->top[1]->count);
}

static bool same_batch(const batch *x, const batch *y) {
  if (memcmp(x->shape, y->shape, sizeof x->shape) || x->rows != y->rows) return false;
  const size_t n = (size_t)(x->shape[0] * x->shape[1] * x->shape[2] * x->shape[3]);
  return !memcmp(x->data, y->data, sizeof(float) * n) &&
         !memcmp(x->label, y->label, sizeof(float) * (size_t)x->rows * 8);
}

static void expect_row(const float *row, float item, const kiln_anno_box *b) {
  const float want[8] = {item, (float)b->label, (float)b->instance_id, b->box.xmin, b->box.ymin,
                         b->box.xmax, b->box.ymax, b->difficult ? 1.0f : 0.0f};
  for (int k = 0; k < 8; k++)
    if (row[k] != want[k])
      fail_msg("label row value %d: %.9g, want %.9g (item %g, label %d)", k, (double)row[k],
               (double)want[k], (double)item, b->label);
}

/* ---- TEST: the resize, mean and scale; the rows ----------------------------------------- */

/* Batches of 2 from det, WARPed to 4 x 6 (LINEAR), (x - mean) * 0.5: a constant image stays
 * constant; a pattern is kiln_image_warp's own output; the rows are the records' boxes, item by
 * item (record 2 has none, so record 3's rows are item 1's), and records 4 and 5, with none,
 * give the one row of -1. The fourth batch wraps to the first records. */
static void test_test_phase_warp_and_rows(void **state) {
  (void)state;
  anno_layer a;
  must_open(&a, det_path,
            "batch_size: 2 } transform_param { mean_value: 5 mean_value: 6 mean_value: 7 "
            "scale: 0.5 resize_param { resize_mode: WARP height: 4 width: 6 interp_mode: LINEAR } "
            "} annotated_data_param { batch_sampler { } label_map_file: '' }",
            TEST, 1);
  assert_true(a.l->ops->is_data);
  expect_shape(a.top[0], 4, SHAPE(2, 3, 4, 6));
  expect_shape(a.top[1], 4, SHAPE(1, 1, 4, 8)); /* planned: 2 images of the first's 2 boxes */
  assert_true(a.l->extra_bytes >= (int64_t)(4 * (2 * 3 * 4 * 6 + 4 * 8) * sizeof(float)));
  const float mean[3] = {5, 6, 7};
  static batch b;
  kiln_warp_work work = {0};
  for (int k = 0; k < 4; k++) {
    a.l->reshaped = false;
    take(&a, &b);
    assert_true(b.shape[0] == 2 && b.shape[1] == 3 && b.shape[2] == 4 && b.shape[3] == 6);
    for (int i = 0; i < 2; i++) {
      const int r = (2 * k + i) % NDET;
      uint8_t src[3 * 10 * 12], dst[3 * 4 * 6];
      det_image(r, src);
      assert_int_equal(kiln_image_warp(src, 3, det_h[r], det_w[r], dst, 4, 6, KILN_INTERP_LINEAR,
                                       &work),
                       KILN_OK);
      for (int c = 0; c < 3; c++)
        for (int p = 0; p < 24; p++) {
          const float got = b.data[(i * 3 + c) * 24 + p];
          const float want = ((float)dst[c * 24 + p] - mean[c]) * 0.5f;
          if (got != want) fail_msg("batch %d item %d channel %d pixel %d: %g, want %g", k, i, c,
                                    p, (double)got, (double)want);
          if (r == 0 || r == 1) /* one colour: the same after any resize */
            assert_true(got == ((float)det_pixel(r, c, 0, 0) - mean[c]) * 0.5f);
        }
    }
    const int kk = k % 3;
    if (kk == 0) {
      assert_int_equal(b.rows, 2);
      expect_row(b.label, 0, &det_boxes0[0]);
      expect_row(b.label + 8, 0, &det_boxes0[1]);
    } else if (kk == 1) {
      assert_int_equal(b.rows, 2);
      expect_row(b.label, 1, &det_boxes3[0]);
      expect_row(b.label + 8, 1, &det_boxes3[1]);
    } else {
      assert_int_equal(b.rows, 1);
      for (int v = 0; v < 8; v++) assert_true(b.label[v] == -1);
    }
    if (k == 0 || k == 2 || k == 3) assert_true(a.l->reshaped); /* the rows' count changed */
  }
  assert_int_equal(a.l->ops->get_cursor(a.l), 8);
  kiln_warp_work_free(&work);
  close_anno(&a);
}

/* Without a label top the layer gives the data alone; a batch of one. */
static void test_data_top_alone(void **state) {
  (void)state;
  char text[512];
  snprintf(text, sizeof text,
           "name: 'ad' type: 'AnnotatedData' top: 'data' data_param { source: '%s' backend: LMDB "
           "batch_size: 1 } transform_param { resize_param { height: 3 width: 3 } }",
           det_path);
  built b = build(text, TEST, NULL, 0, 1);
  forward(&b);
  expect_shape(b.top[0], 4, SHAPE(1, 3, 3, 3));
  for (int c = 0; c < 3; c++) assert_true(b.top[0]->data[c * 9 + 4] == det_pixel(0, c, 0, 0));
  unbuild(&b);
}

/* FIT_SMALL_SIZE gives each image a size of its own: batches of one, the data top reshaped to
 * each (kiln_resize_size's), l->reshaped set when it changes. */
static void test_fit_small_size_batches_of_one(void **state) {
  (void)state;
  anno_layer a;
  must_open(&a, det_path,
            "batch_size: 1 } transform_param { resize_param { resize_mode: FIT_SMALL_SIZE "
            "height: 6 width: 6 } }",
            TEST, 1);
  expect_shape(a.top[0], 4, SHAPE(1, 3, 6, 6));
  Caffe__ResizeParameter r = CAFFE__RESIZE_PARAMETER__INIT;
  r.resize_mode = CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_SMALL_SIZE;
  r.height = r.width = 6;
  int64_t h = 6, w = 6;
  for (int k = 0; k < NDET + 1; k++) {
    int oh, ow;
    kiln_resize_size(&r, det_h[k % NDET], det_w[k % NDET], &oh, &ow);
    a.l->reshaped = false;
    next(&a);
    expect_shape(a.top[0], 4, SHAPE(1, 3, oh, ow));
    if (oh != h || ow != w) assert_true(a.l->reshaped);
    h = oh, w = ow;
  }
  close_anno(&a);
}

/* ---- TRAIN: mirror, samplers, expansion ------------------------------------------------- */

/* The pixel rectangle a row's box covers in an image of h x w (boxes on whole pixels). */
static void box_pixels(const float *row, int h, int w, int *x0, int *y0, int *x1, int *y1) {
  *x0 = (int)lrintf(row[3] * (float)w), *y0 = (int)lrintf(row[4] * (float)h);
  *x1 = (int)lrintf(row[5] * (float)w), *y1 = (int)lrintf(row[6] * (float)h);
}

/* Mirror alone (no sampler, no resize): each image is its record or its record flipped, both
 * occurring; each row's box is its square's pixels, flipped with the image, and those pixels
 * are the square's value (the mean 20 taken off). */
static void test_train_mirror_moves_boxes_with_pixels(void **state) {
  (void)state;
  anno_layer a;
  must_open(&a, squares_path, "batch_size: 8 } transform_param { mirror: true mean_value: 20 }",
            TRAIN, 3);
  static batch b;
  int flips = 0, plain = 0;
  for (int k = 0; k < NSQ / 8; k++) {
    take(&a, &b);
    int row = 0;
    for (int i = 0; i < 8; i++) {
      const int r = k * 8 + i;
      uint8_t src[3 * SQ_H * SQ_W];
      squares_image(r, src);
      bool same = true, mirrored = true;
      for (int c = 0; c < 3; c++)
        for (int y = 0; y < SQ_H; y++)
          for (int x = 0; x < SQ_W; x++) {
            const float got = b.data[((i * 3 + c) * SQ_H + y) * SQ_W + x];
            same &= got == (float)src[(c * SQ_H + y) * SQ_W + x] - 20;
            mirrored &= got == (float)src[(c * SQ_H + y) * SQ_W + SQ_W - 1 - x] - 20;
          }
      assert_true(same || mirrored);
      const bool flip = !same;
      flip ? flips++ : plain++;
      const squares q = squares_of(r);
      /* the records hold the boxes group by group, labels ascending */
      const bool swap = q.n == 2 && q.label[1] < q.label[0];
      for (int k = 0; k < q.n; k++, row++) {
        const int s = swap ? 1 - k : k;
        const float *lr = b.label + row * 8;
        assert_true(lr[0] == (float)i && lr[1] == (float)q.label[s]);
        int x0, y0, x1, y1;
        box_pixels(lr, SQ_H, SQ_W, &x0, &y0, &x1, &y1);
        const int want_x0 = flip ? SQ_W - q.x0[s] - q.side[s] : q.x0[s];
        if (x0 != want_x0 || x1 != want_x0 + q.side[s] || y0 != q.y0[s] ||
            y1 != q.y0[s] + q.side[s])
          fail_msg("record %d square %d (flip %d): box %d,%d..%d,%d, want %d,%d..%d,%d", r, s,
                   flip, x0, y0, x1, y1, want_x0, q.y0[s], want_x0 + q.side[s], q.y0[s] + q.side[s]);
        for (int y = y0; y < y1; y++)
          for (int x = x0; x < x1; x++)
            assert_true(b.data[((i * 3) * SQ_H + y) * SQ_W + x] == (float)q.value[s] - 20);
      }
    }
    assert_int_equal(b.rows, row);
  }
  assert_true(flips >= 4 && plain >= 4);
  close_anno(&a);
}

/* Batch samplers (the whole image, and crops of 0.3 to 1 of it overlapping an object), an
 * expansion up to 2.5 times (filled with the mean, the background's value), a resize to 32 x 32
 * (WARP, and FIT_LARGE_SIZE_AND_PAD padded with the background) by NEAREST, and mirror: over
 * 128 images, every bright pixel of the output lies in a box of its item, and every pixel wholly
 * inside a box is bright. The boxes take many sizes (the crops and expansions happened). */
static void test_train_samplers_keep_boxes_on_objects(void **state) {
  (void)state;
  const char *const resize[2] = {"resize_mode: WARP",
                                 "resize_mode: FIT_LARGE_SIZE_AND_PAD pad_value: 20"};
  static batch b;
  for (int m = 0; m < 2; m++) {
    char rest[1024];
    snprintf(rest, sizeof rest,
             "batch_size: 4 shuffle: true } transform_param { mirror: true mean_value: 20 "
             "resize_param { %s height: 32 width: 32 interp_mode: NEAREST } "
             "expand_param { prob: 0.5 max_expand_ratio: 2.5 } } annotated_data_param { "
             "batch_sampler { max_sample: 1 max_trials: 1 } "
             "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
             "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.1 } max_sample: 1 "
             "max_trials: 50 } }",
             resize[m]);
    anno_layer a;
    must_open(&a, squares_path, rest, TRAIN, 11);
    int widths[512], nwidths = 0, nrows = 0;
    const float eps = 1e-3f;
    for (int k = 0; k < 32; k++) {
      take(&a, &b);
      assert_true(b.shape[2] == 32 && b.shape[3] == 32);
      for (int i = 0; i < 4; i++) {
        const float *img = b.data + (size_t)i * 3 * 32 * 32;
        for (int y = 0; y < 32; y++)
          for (int x = 0; x < 32; x++) {
            bool in_box = false, bright = img[y * 32 + x] > 100;
            for (int r = 0; r < b.rows; r++) {
              const float *lr = b.label + r * 8;
              if (lr[0] != (float)i) continue;
              const float bx0 = lr[3] * 32, by0 = lr[4] * 32, bx1 = lr[5] * 32, by1 = lr[6] * 32;
              in_box |= x + 1 > bx0 + eps && x < bx1 - eps && y + 1 > by0 + eps && y < by1 - eps;
              if (x >= bx0 - eps && x + 1 <= bx1 + eps && y >= by0 - eps && y + 1 <= by1 + eps &&
                  !bright)
                fail_msg("%s: batch %d item %d: pixel %d,%d inside box %d (%g %g %g %g) is %g",
                         resize[m], k, i, x, y, r, (double)lr[3], (double)lr[4], (double)lr[5],
                         (double)lr[6], (double)img[y * 32 + x]);
            }
            if (bright && !in_box)
              fail_msg("%s: batch %d item %d: bright pixel %d,%d in no box", resize[m], k, i, x,
                       y);
          }
      }
      for (int r = 0; r < b.rows; r++) {
        const float *lr = b.label + r * 8;
        if (lr[0] < 0) continue; /* a batch without boxes */
        nrows++;
        const int wpx = (int)lrintf((lr[5] - lr[3]) * 1000);
        bool seen = false;
        for (int j = 0; j < nwidths; j++) seen |= widths[j] == wpx;
        if (!seen && nwidths < 512) widths[nwidths++] = wpx;
      }
    }
    assert_true(nrows > 100);
    if (nwidths < 30) fail_msg("%s: only %d box widths: no crops or expansions?", resize[m], nwidths);
    close_anno(&a);
  }
}

/* ---- determinism, resume, workers --------------------------------------------------------- */

/* The whole chain: distortion, expansion, samplers, every interpolation, mirror, shuffle. */
static const char *full_chain =
    "batch_size: 4 shuffle: true prefetch: %d } transform_param { mirror: true mean_value: 104 "
    "mean_value: 117 mean_value: 123 scale: 0.25 emit_constraint { emit_type: CENTER } "
    "resize_param { resize_mode: WARP height: 20 width: 20 interp_mode: LINEAR interp_mode: AREA "
    "interp_mode: NEAREST interp_mode: CUBIC interp_mode: LANCZOS4 } "
    "distort_param { brightness_prob: 0.5 brightness_delta: 32 contrast_prob: 0.5 "
    "contrast_lower: 0.5 contrast_upper: 1.5 hue_prob: 0.5 hue_delta: 18 saturation_prob: 0.5 "
    "saturation_lower: 0.5 saturation_upper: 1.5 random_order_prob: 0.5 } "
    "expand_param { prob: 0.5 max_expand_ratio: 3 } } annotated_data_param { "
    "batch_sampler { max_sample: 1 max_trials: 1 } "
    "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 "
    "max_aspect_ratio: 2 } sample_constraint { min_jaccard_overlap: 0.3 } max_sample: 1 "
    "max_trials: 50 } label_map_file: '%s' }";

static void open_full(anno_layer *a, int prefetch, uint64_t seed, bool shuffle) {
  char fixed[2048];
  /* the label map of the squares' labels 1 .. 4 */
  char map[400];
  snprintf(map, sizeof map, "%s/map4.prototxt", dir);
  if (access(map, F_OK) != 0) {
    const char *t = "item { name: 'bg' label: 0 } item { name: 'a' label: 1 } item { name: 'b' "
                    "label: 2 } item { name: 'c' label: 3 } item { name: 'd' label: 4 }";
    assert_int_equal(kiln_write_file_atomic(map, t, strlen(t)), KILN_OK);
  }
  snprintf(fixed, sizeof fixed, full_chain, prefetch, map);
  if (!shuffle) { /* blanked out */
    char *s = strstr(fixed, "shuffle: true");
    memset(s, ' ', strlen("shuffle: true"));
  }
  must_open(a, squares_path, fixed, TRAIN, seed);
}

/* The same seed gives the same batches, whatever the prefetch depth (so the reader's timing);
 * another seed other batches; a layer set to a cursor gives the batch read at that position. */
static void test_same_seed_same_batches_and_resume(void **state) {
  (void)state;
  enum { K = 12 };
  static batch x[K], y, z;
  anno_layer a, b, c;
  open_full(&a, 4, 3, true);
  open_full(&b, 1, 3, true);
  open_full(&c, 4, 4, true);
  int differ = 0;
  uint64_t cursor[K];
  for (int k = 0; k < K; k++) {
    take(&a, &x[k]);
    cursor[k] = a.l->ops->get_cursor(a.l);
    take(&b, &y);
    if (!same_batch(&x[k], &y)) fail_msg("batch %d differs between prefetch 4 and 1", k);
    take(&c, &z);
    differ += !same_batch(&x[k], &z);
  }
  assert_true(differ >= K - 1);
  assert_int_equal(cursor[K - 1], 4 * K);
  /* resume at batch 5 (crossing the epochs of 32 records from there), and back at batch 2 */
  anno_layer d;
  open_full(&d, 2, 3, true);
  assert_int_equal(d.l->ops->set_cursor(d.l, cursor[4]), KILN_OK);
  for (int k = 5; k < K; k++) {
    take(&d, &y);
    if (!same_batch(&x[k], &y)) fail_msg("resumed at %llu: batch %d differs",
                                         (unsigned long long)cursor[4], k);
  }
  assert_int_equal(d.l->ops->set_cursor(d.l, cursor[1]), KILN_OK);
  take(&d, &y);
  assert_true(same_batch(&x[2], &y));
  assert_int_equal(d.l->ops->get_cursor(d.l), cursor[2]);
  close_anno(&a);
  close_anno(&b);
  close_anno(&c);
  close_anno(&d);
}

/* Worker r of 2 reads global batches r, r + 2, ... of the one-worker stream (in key order and
 * shuffled), and both report the one-worker cursor after all their batches. */
static void test_workers_read_global_batches(void **state) {
  (void)state;
  enum { ROUNDS = 4, N = 2 };
  static batch one[ROUNDS * N], got;
  for (int shuffle = 0; shuffle < 2; shuffle++) {
    anno_layer s;
    open_full(&s, 3, 9, shuffle);
    for (int j = 0; j < ROUNDS * N; j++) take(&s, &one[j]);
    const uint64_t end = s.l->ops->get_cursor(s.l);
    close_anno(&s);
    anno_layer w[N];
    for (int r = 0; r < N; r++) {
      open_full(&w[r], 3, 9, shuffle);
      w[r].l->shard_rank = r;
      w[r].l->shard_count = N;
    }
    for (int k = 0; k < ROUNDS; k++)
      for (int r = 0; r < N; r++) {
        take(&w[r], &got);
        if (!same_batch(&one[k * N + r], &got))
          fail_msg("shuffle %d: worker %d's batch %d is not global batch %d", shuffle, r, k,
                   k * N + r);
      }
    for (int r = 0; r < N; r++) {
      assert_true(w[r].l->ops->get_cursor(w[r].l) == end);
      close_anno(&w[r]);
    }
  }
}

/* ---- errors ------------------------------------------------------------------------------- */

static void expect_open_fails(const char *src, const char *rest, int code, const char *what) {
  char text[2048];
  snprintf(text, sizeof text,
           "name: 'ad' type: 'AnnotatedData' top: 'data' top: 'label' data_param { source: '%s' "
           "backend: LMDB %s",
           src, rest);
  expect_create_fails(text, TRAIN, NULL, 0, 2, code, "layer 'ad' (AnnotatedData)", what);
}

/* A forward that fails naming the layer and each fragment. */
static void expect_forward_fails(anno_layer *a, const char *what, const char *what2) {
  int rc = layer_forward(a->l);
  if (rc != KILN_ERR_DATA) fail_msg("forward: %s (%s)", kiln_status_name(rc), kiln_last_error());
  expect_message("layer 'ad' (AnnotatedData)", what, what2);
}

static void test_errors(void **state) {
  (void)state;
  expect_open_fails(plain_path, "batch_size: 2 }", KILN_ERR_DATA, "AnnotatedDatum");
  expect_open_fails("/nonexistent/anno_lmdb", "batch_size: 2 }", KILN_ERR_IO,
                    "/nonexistent/anno_lmdb");
  expect_open_fails(det_path, "batch_size: 2 } transform_param { resize_param { resize_mode: "
                    "FIT_SMALL_SIZE height: 6 width: 6 } }",
                    KILN_ERR_UNSUPPORTED, "FIT_SMALL_SIZE");
  expect_open_fails(det_path, "batch_size: 2 } transform_param { expand_param { prob: 1 "
                    "max_expand_ratio: 2 } }",
                    KILN_ERR_UNSUPPORTED, "batch_size 1");
  expect_open_fails(det_path, "batch_size: 2 } transform_param { resize_param { height: 4 "
                    "width: 4 } noise_param { prob: 0.5 } }",
                    KILN_ERR_UNSUPPORTED, "noise_param.prob");
  expect_open_fails(det_path, "batch_size: 2 } transform_param { mean_value: 1 mean_value: 2 "
                    "resize_param { height: 4 width: 4 } }",
                    KILN_ERR_INVALID, "mean_value: 2 values");
  expect_open_fails(det_path, "batch_size: 2 } transform_param { mean_file: 'mean.binaryproto' }",
                    KILN_ERR_UNSUPPORTED, "mean_value");
  expect_open_fails(det_path, "batch_size: 0 }", KILN_ERR_INVALID, "batch_size");
  char rest[700];
  snprintf(rest, sizeof rest, "source: '%s' batch_size: 2 }", squares_path);
  expect_open_fails(det_path, rest, KILN_ERR_UNSUPPORTED, "one database");
  expect_open_fails(det_path, "batch_size: 2 } annotated_data_param { label_map_file: "
                    "'/nonexistent/labelmap.prototxt' }",
                    KILN_ERR_IO, "label_map_file");
  expect_open_fails(det_path, "batch_size: 2 } annotated_data_param { batch_sampler { sampler { "
                    "min_scale: 0 } } }",
                    KILN_ERR_INVALID, "batch_sampler[0].sampler.min_scale");
  /* a record of another size, without resize_param: named when its batch is read */
  anno_layer a;
  must_open(&a, det_path, "batch_size: 2 }", TEST, 1);
  expect_forward_fails(&a, "record 1 (00000001)", "6x6");
  close_anno(&a);
  /* a box whose label the label map lacks: record 3's label 3 (records 0 .. 2 pass) */
  char text[700];
  snprintf(text, sizeof text, "batch_size: 2 } transform_param { resize_param { height: 4 width: "
           "4 } } annotated_data_param { label_map_file: '%s' }", map_path);
  must_open(&a, det_path, text, TEST, 1);
  next(&a);
  expect_forward_fails(&a, "record 3 (00000003)", "label 3");
  close_anno(&a);
  /* a damaged image: the reader's error, naming the database and the record's key */
  must_open(&a, damaged_path, "batch_size: 1 } transform_param { resize_param { height: 4 width: "
            "4 } }", TEST, 1);
  next(&a);
  expect_forward_fails(&a, damaged_path, "00000001");
  close_anno(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_test_phase_warp_and_rows),
      cmocka_unit_test(test_data_top_alone),
      cmocka_unit_test(test_fit_small_size_batches_of_one),
      cmocka_unit_test(test_train_mirror_moves_boxes_with_pixels),
      cmocka_unit_test(test_train_samplers_keep_boxes_on_objects),
      cmocka_unit_test(test_same_seed_same_batches_and_resume),
      cmocka_unit_test(test_workers_read_global_batches),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests_name("AnnotatedData", tests, make_dbs, remove_dbs);
}
