/* The detection sets of the cache: the JPEG encoder (a round trip through kiln's decoder), the
 * shapes-det generator (the same seed draws the same bytes, another seed others; every box
 * inside its image and tight around the pixels where its object shows; the classes balanced;
 * the counts and flags consistent), a small set written through kiln_shapes_det_write (its VOC
 * layout, lists, sizes, label map and annotations, read back against the drawing), and the VOC
 * layout's refusals (an id without its image, a bad id, a tar that is not VOC 2007's, a listed
 * image without its annotation). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/det_sets.h"
#include "files.h"
#include "kiln/data.h"

static int setup(void **state) { return tmpdir_setup(state, "sdet"); }

static char *slurp(const char *path, size_t *len) {
  char *text = NULL;
  size_t n = 0;
  if (kiln_read_file(path, &text, &n) != KILN_OK) return NULL;
  if (len) *len = n;
  return text;
}

static int count_lines(const char *text) {
  int n = 0;
  for (const char *p = text; *p; p++) n += *p == '\n';
  return n;
}

/* ---- the JPEG encoder ----------------------------------------------------------------------- */

static void test_jpeg_round_trip(void **state) {
  (void)state;
  const int H = 37, W = 53; /* not multiples of the 16-pixel blocks */
  uint8_t *chw = malloc(3 * H * W);
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) chw[(c * H + y) * W + x] = (uint8_t)(40 + c * 60 + x + y);
  uint8_t *jpg = NULL;
  size_t len = 0;
  assert_int_equal(kiln_image_encode_jpeg(chw, 3, H, W, 95, &jpg, &len), KILN_OK);
  assert_string_equal(kiln_image_format(jpg, len), "jpeg");
  kiln_image img = {0};
  assert_int_equal(kiln_image_decode(jpg, len, KILN_IMAGE_AS_IS, 0, 0, "round trip", &img),
                   KILN_OK);
  assert_int_equal(img.channels, 3);
  assert_int_equal(img.height, H);
  assert_int_equal(img.width, W);
  /* the planes come back in their order (B, G, R: c * 60 apart), each value close */
  int worst = 0;
  for (int i = 0; i < 3 * H * W; i++) {
    const int d = abs((int)img.data[i] - (int)chw[i]);
    if (d > worst) worst = d;
  }
  assert_true(worst <= 6);
  free(jpg);

  /* one gray plane stays one */
  assert_int_equal(kiln_image_encode_jpeg(chw, 1, H, W, 90, &jpg, &len), KILN_OK);
  assert_int_equal(kiln_image_decode(jpg, len, KILN_IMAGE_AS_IS, 0, 0, "gray", &img), KILN_OK);
  assert_int_equal(img.channels, 1);
  for (int i = 0; i < H * W; i++) assert_true(abs((int)img.data[i] - (int)chw[i]) <= 6);
  free(jpg);

  /* a larger image than the first buffer holds (the destination grows) */
  const int big = 700;
  uint8_t *noisy = malloc(3 * big * big);
  kiln_rng r;
  kiln_rng_seed(&r, 3, 0);
  for (int i = 0; i < 3 * big * big; i++) noisy[i] = (uint8_t)kiln_rng_u32(&r);
  assert_int_equal(kiln_image_encode_jpeg(noisy, 3, big, big, 100, &jpg, &len), KILN_OK);
  assert_true(len > 3 * (size_t)big * big / 4 + 1024);
  assert_int_equal(kiln_image_decode(jpg, len, KILN_IMAGE_AS_IS, 0, 0, "big", &img), KILN_OK);
  assert_int_equal(img.height, big);
  free(jpg);
  free(noisy);

  /* bad requests */
  assert_int_equal(kiln_image_encode_jpeg(chw, 2, H, W, 90, &jpg, &len), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_encode_jpeg(chw, 3, H, W, 0, &jpg, &len), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_encode_jpeg(chw, 3, H, W, 101, &jpg, &len), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_encode_jpeg(chw, 3, 0, W, 90, &jpg, &len), KILN_ERR_INVALID);
  assert_null(jpg);
  kiln_image_free(&img);
  free(chw);
}

/* ---- the generator -------------------------------------------------------------------------- */

static bool same_image(const kiln_shapes_det_image *a, const kiln_shapes_det_image *b) {
  if (a->height != b->height || a->width != b->width || a->n != b->n) return false;
  const size_t plane = (size_t)a->height * a->width;
  return !memcmp(a->bgr, b->bgr, 3 * plane) && !memcmp(a->mask, b->mask, plane) &&
         !memcmp(a->obj, b->obj, sizeof a->obj);
}

static void test_draw_is_deterministic(void **state) {
  (void)state;
  kiln_shapes_det_image a = {0}, b = {0};
  for (uint32_t id = 1; id <= 30; id++) {
    assert_int_equal(kiln_shapes_det_draw(1701, id, &a), KILN_OK);
    /* b's buffers held another image before: nothing of it may show */
    assert_int_equal(kiln_shapes_det_draw(1701, id == 1 ? 2 : id - 1, &b), KILN_OK);
    assert_int_equal(kiln_shapes_det_draw(1701, id, &b), KILN_OK);
    assert_true(same_image(&a, &b));
    assert_int_equal(kiln_shapes_det_draw(1702, id, &b), KILN_OK);
    assert_false(same_image(&a, &b));
  }
  kiln_shapes_det_image_free(&a);
  kiln_shapes_det_image_free(&b);
}

/* The drawing rules, pinned: the pixels, masks and objects of the first 50 images of seed 1701
 * as the cache's entry holds them. Integer arithmetic makes them the same on every machine and
 * build (-march=native or not, sanitizers or not); a change of rules changes this digest, and
 * must raise the generator's version (src/data/shapes_det_set.c) so that cached entries are
 * drawn again. */
static void test_drawing_rules_pinned(void **state) {
  (void)state;
  kiln_shapes_det_image img = {0};
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  for (uint32_t id = 1; id <= 50; id++) {
    assert_int_equal(kiln_shapes_det_draw(1701, id, &img), KILN_OK);
    const size_t plane = (size_t)img.height * img.width;
    int32_t head[3] = {img.height, img.width, img.n};
    kiln_sha256_update(&h, head, sizeof head);
    kiln_sha256_update(&h, img.bgr, 3 * plane);
    kiln_sha256_update(&h, img.mask, plane);
    for (int i = 0; i < img.n; i++) {
      const kiln_shapes_det_object *o = &img.obj[i];
      int32_t v[12] = {o->label, o->xmin, o->ymin, o->xmax, o->ymax, o->area, o->visible,
                       o->truncated, o->difficult, o->rgb[0], o->rgb[1], o->rgb[2]};
      kiln_sha256_update(&h, v, sizeof v);
    }
  }
  uint8_t digest[32];
  char hex[65];
  kiln_sha256_final(&h, digest);
  kiln_sha256_hex(digest, hex);
  assert_string_equal(hex, "3fc8125151a48a1f226cc63feecbf85b9621132eee5139a053e6894c09c7c339");
  kiln_shapes_det_image_free(&img);
}

/* Every box inside its image, tight around the pixels where its object shows (each side touched
 * by one), with the counts and the flags that the mask gives; the object's pixels near its
 * colour (shading within 20, noise within 12 + 4). */
static void check_image(const kiln_shapes_det_image *img) {
  const int W = img->width, H = img->height;
  assert_true(W >= 96 && W <= 128 && W % 8 == 0 && H >= 96 && H <= 128 && H % 8 == 0);
  assert_true(img->n >= 1 && img->n <= KILN_SHAPES_DET_MAX_OBJECTS);
  const size_t plane = (size_t)W * H;
  for (int i = 0; i < img->n; i++) {
    const kiln_shapes_det_object *o = &img->obj[i];
    assert_non_null(kiln_shapes_det_class(o->label));
    assert_true(1 <= o->xmin && o->xmin <= o->xmax && o->xmax <= W);
    assert_true(1 <= o->ymin && o->ymin <= o->ymax && o->ymax <= H);
    int visible = 0;
    bool left = false, right = false, top = false, bottom = false;
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) {
        if (img->mask[(size_t)y * W + x] != i + 1) continue;
        visible++;
        assert_true(x + 1 >= o->xmin && x + 1 <= o->xmax && y + 1 >= o->ymin && y + 1 <= o->ymax);
        left |= x + 1 == o->xmin;
        right |= x + 1 == o->xmax;
        top |= y + 1 == o->ymin;
        bottom |= y + 1 == o->ymax;
        for (int c = 0; c < 3; c++)
          assert_true(abs((int)img->bgr[c * plane + (size_t)y * W + x] - (int)o->rgb[2 - c]) <= 36);
      }
    assert_true(left && right && top && bottom);
    assert_int_equal(visible, o->visible);
    assert_true(o->visible <= o->area);
    assert_true(o->visible * 100 >= 35 * o->area);
    assert_int_equal(o->difficult, o->visible * 2 < o->area);
  }
  for (size_t p = 0; p < plane; p++) assert_true(img->mask[p] <= img->n);
}

static void test_boxes_are_tight(void **state) {
  (void)state;
  kiln_shapes_det_image img = {0};
  int per_class[KILN_SHAPES_DET_CLASSES + 1] = {0}, objects = 0, truncated = 0, difficult = 0;
  int sizes[2][5] = {{0}};
  for (uint32_t id = 1; id <= 400; id++) {
    assert_int_equal(kiln_shapes_det_draw(1701, id, &img), KILN_OK);
    check_image(&img);
    sizes[0][(img.width - 96) / 8]++;
    sizes[1][(img.height - 96) / 8]++;
    for (int i = 0; i < img.n; i++) {
      per_class[img.obj[i].label]++;
      truncated += img.obj[i].truncated;
      difficult += img.obj[i].difficult;
    }
    objects += img.n;
  }
  /* 1 to 4 objects an image, few left out; each class within a quarter of its share */
  assert_true(objects >= 400 * 2 && objects <= 400 * 3);
  for (int k = 1; k <= KILN_SHAPES_DET_CLASSES; k++) {
    const int share = objects / KILN_SHAPES_DET_CLASSES;
    assert_true(per_class[k] > share * 3 / 4 && per_class[k] < share * 5 / 4);
  }
  /* some objects cut by the border and some mostly hidden, never most of them */
  assert_true(truncated > objects / 20 && truncated < objects / 3);
  assert_true(difficult > 0 && difficult < objects / 10);
  for (int s = 0; s < 5; s++) assert_true(sizes[0][s] > 40 && sizes[1][s] > 40);
  kiln_shapes_det_image_free(&img);
}

/* ---- a small set on disk -------------------------------------------------------------------- */

/* The number in <tag> after position *at of xml, moving *at past it. */
static long next_int(const char *xml, size_t n, size_t *at, const char *tag) {
  size_t next = 0;
  long v = kiln_voc_xml_int(xml + *at, n - *at, tag, &next);
  *at += next;
  return v;
}

/* Annotations/ID.xml against the drawing: VOC's tags in VOC's order, the same values. */
static void check_annotation(const char *dir, uint32_t id, const kiln_shapes_det_image *img) {
  char path[1024], want[64];
  snprintf(path, sizeof path, "%s/Annotations/%06u.xml", dir, id);
  size_t n = 0;
  char *xml = slurp(path, &n);
  assert_non_null(xml);
  assert_true(!strncmp(xml, "<annotation>\n", 13));
  assert_non_null(strstr(xml, "</annotation>\n"));
  assert_non_null(strstr(xml, "<folder>shapes-det</folder>"));
  snprintf(want, sizeof want, "<filename>%06u.jpg</filename>", id);
  assert_non_null(strstr(xml, want));
  size_t at = 0;
  assert_int_equal(next_int(xml, n, &at, "width"), img->width);
  assert_int_equal(next_int(xml, n, &at, "height"), img->height);
  assert_int_equal(next_int(xml, n, &at, "depth"), 3);
  int objects = 0;
  for (const char *p = xml; (p = strstr(p, "<object>")); p++) objects++;
  assert_int_equal(objects, img->n);
  for (int i = 0; i < img->n; i++) {
    const kiln_shapes_det_object *o = &img->obj[i];
    const char *obj = strstr(xml + at, "<object>");
    assert_non_null(obj);
    snprintf(want, sizeof want, "<object>\n\t\t<name>%s</name>\n\t\t<pose>Unspecified</pose>",
             kiln_shapes_det_class(o->label));
    assert_true(!strncmp(obj, want, strlen(want)));
    assert_int_equal(next_int(xml, n, &at, "truncated"), o->truncated);
    assert_int_equal(next_int(xml, n, &at, "difficult"), o->difficult);
    assert_int_equal(next_int(xml, n, &at, "xmin"), o->xmin);
    assert_int_equal(next_int(xml, n, &at, "ymin"), o->ymin);
    assert_int_equal(next_int(xml, n, &at, "xmax"), o->xmax);
    assert_int_equal(next_int(xml, n, &at, "ymax"), o->ymax);
  }
  free(xml);
}

static const char *const set_files[] = {
    "README", "labelmap.prototxt", "trainval.txt", "test.txt", "test_name_size.txt",
    "ImageSets/Main/trainval.txt", "ImageSets/Main/test.txt"};

static void test_small_set_on_disk(void **state) {
  tmpdir_fixture *f = *state;
  char a[512], b[512], c[512], path[600];
  path_in(f, "a", a, sizeof a);
  path_in(f, "b", b, sizeof b);
  path_in(f, "c", c, sizeof c);
  kiln_strbuf summary = {0};
  assert_int_equal(kiln_shapes_det_write(a, 1701, 15, 5, &summary), KILN_OK);
  assert_int_equal(kiln_shapes_det_write(b, 1701, 15, 5, NULL), KILN_OK);
  assert_int_equal(kiln_shapes_det_write(c, 1702, 15, 5, NULL), KILN_OK);
  assert_non_null(strstr(summary.s, "trainval: ids 000001 to 000015, 15 images, "));
  assert_non_null(strstr(summary.s, "\ntest: ids 000016 to 000020, 5 images, "));
  free(summary.s);

  /* byte for byte the same set from the same seed; another seed another one */
  for (size_t i = 0; i < sizeof set_files / sizeof set_files[0]; i++) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", a, set_files[i]);
    snprintf(pb, sizeof pb, "%s/%s", b, set_files[i]);
    size_t na = 0, nb = 0;
    char *ta = slurp(pa, &na), *tb = slurp(pb, &nb);
    assert_non_null(ta);
    assert_non_null(tb);
    assert_true(na == nb && !memcmp(ta, tb, na));
    free(ta);
    free(tb);
  }
  int differ = 0;
  for (uint32_t id = 1; id <= 20; id++) {
    static const char *const kinds[2][2] = {{"JPEGImages", "jpg"}, {"Annotations", "xml"}};
    for (int k = 0; k < 2; k++) {
      char pa[600], pb[600], pc[600];
      snprintf(pa, sizeof pa, "%s/%s/%06u.%s", a, kinds[k][0], id, kinds[k][1]);
      snprintf(pb, sizeof pb, "%s/%s/%06u.%s", b, kinds[k][0], id, kinds[k][1]);
      snprintf(pc, sizeof pc, "%s/%s/%06u.%s", c, kinds[k][0], id, kinds[k][1]);
      size_t na = 0, nb = 0, nc = 0;
      char *ta = slurp(pa, &na), *tb = slurp(pb, &nb), *tc = slurp(pc, &nc);
      assert_true(ta && tb && tc && na == nb && !memcmp(ta, tb, na));
      differ += na != nc || memcmp(ta, tc, na);
      free(ta);
      free(tb);
      free(tc);
    }
  }
  assert_true(differ >= 38);

  /* the lists, the ids, the sizes and the label map */
  char *t = slurp(strcat(strcpy(path, a), "/trainval.txt"), NULL);
  assert_int_equal(count_lines(t), 15);
  assert_true(!strncmp(t, "JPEGImages/000001.jpg Annotations/000001.xml\n", 45));
  free(t);
  t = slurp(strcat(strcpy(path, a), "/test.txt"), NULL);
  assert_string_equal(t, "JPEGImages/000016.jpg Annotations/000016.xml\n"
                         "JPEGImages/000017.jpg Annotations/000017.xml\n"
                         "JPEGImages/000018.jpg Annotations/000018.xml\n"
                         "JPEGImages/000019.jpg Annotations/000019.xml\n"
                         "JPEGImages/000020.jpg Annotations/000020.xml\n");
  free(t);
  t = slurp(strcat(strcpy(path, a), "/ImageSets/Main/test.txt"), NULL);
  assert_string_equal(t, "000016\n000017\n000018\n000019\n000020\n");
  free(t);
  t = slurp(strcat(strcpy(path, a), "/labelmap.prototxt"), NULL);
  const char *head = "item {\n  name: \"none_of_the_above\"\n  label: 0\n  display_name: "
                     "\"background\"\n}\nitem {\n  name: \"disc\"\n  label: 1\n  display_name: "
                     "\"disc\"\n}\n";
  assert_true(!strncmp(t, head, strlen(head)));
  assert_non_null(strstr(t, "  name: \"cross\"\n  label: 4\n"));
  assert_int_equal(count_lines(t), 25);
  free(t);
  char *sizes = slurp(strcat(strcpy(path, a), "/test_name_size.txt"), NULL);
  assert_int_equal(count_lines(sizes), 5);

  /* every image and annotation against the drawing; the test images' sizes as listed */
  kiln_shapes_det_image img = {0};
  kiln_image dec = {0};
  const char *line = sizes;
  for (uint32_t id = 1; id <= 20; id++) {
    assert_int_equal(kiln_shapes_det_draw(1701, id, &img), KILN_OK);
    snprintf(path, sizeof path, "%s/JPEGImages/%06u.jpg", a, id);
    assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &dec), KILN_OK);
    assert_int_equal(dec.channels, 3);
    assert_int_equal(dec.height, img.height);
    assert_int_equal(dec.width, img.width);
    /* quality 92 of noisy pixels: each within a few levels on average */
    const size_t n = 3 * (size_t)img.height * img.width;
    uint64_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += (uint64_t)abs((int)dec.data[i] - (int)img.bgr[i]);
    assert_true(diff < 6 * n);
    check_annotation(a, id, &img);
    if (id > 15) {
      char want[64];
      snprintf(want, sizeof want, "%06u %d %d\n", id, img.height, img.width);
      assert_true(!strncmp(line, want, strlen(want)));
      line += strlen(want);
    }
  }
  kiln_image_free(&dec);
  kiln_shapes_det_image_free(&img);
  free(sizes);

  /* counts the ids cannot hold */
  assert_int_equal(kiln_shapes_det_write(c, 1, 0, 5, NULL), KILN_ERR_INVALID);
  assert_int_equal(kiln_shapes_det_write(c, 1, 999999, 1, NULL), KILN_ERR_INVALID);
}

/* ---- the VOC layout's refusals -------------------------------------------------------------- */

static void test_lists_refuse_what_is_missing(void **state) {
  tmpdir_fixture *f = *state;
  char dir[512], path[600];
  path_in(f, "v", dir, sizeof dir);
  assert_int_equal(kiln_shapes_det_write(dir, 5, 3, 2, NULL), KILN_OK);
  /* an id without its annotation: named with the list's file and line */
  snprintf(path, sizeof path, "%s/Annotations/000002.xml", dir);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(kiln_voc_write_list(dir, KILN_VOC_TRAINVAL, NULL), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "ImageSets/Main/trainval.txt:2: image 000002: "
                                            "Annotations/000002.xml is missing"));
  /* an annotation without its size */
  snprintf(path, sizeof path, "%s/Annotations/000005.xml", dir);
  write_plain(path, "<annotation><object></object></annotation>", 42);
  assert_int_equal(kiln_voc_write_list(dir, KILN_VOC_TEST, NULL), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "Annotations/000005.xml: no <size>"));
  /* a line that is no id; blank lines and CRLF are fine */
  snprintf(path, sizeof path, "%s/ImageSets/Main/test.txt", dir);
  write_plain(path, "000004\r\n\n../000001\n", 20);
  assert_int_equal(kiln_voc_write_list(dir, KILN_VOC_TEST, NULL), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "test.txt:3: '../000001' is no image id"));
  write_plain(path, "000004\r\n\n", 9);
  uint32_t n = 0;
  assert_int_equal(kiln_voc_write_list(dir, KILN_VOC_TEST, &n), KILN_OK);
  assert_int_equal(n, 1);
  write_plain(path, "\n", 1);
  assert_int_equal(kiln_voc_write_list(dir, KILN_VOC_TEST, NULL), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "names no image"));
}

static void test_xml_numbers(void **state) {
  (void)state;
  const char *x = "<size><width> 12 </width><height>x</height><depth>99999999999</depth></size>";
  size_t next = 0, n = strlen(x);
  assert_int_equal(kiln_voc_xml_int(x, n, "width", &next), 12);
  assert_int_equal(next, strlen("<size><width> 12 </width>"));
  assert_int_equal(kiln_voc_xml_int(x, n, "height", NULL), -1);
  assert_int_equal(kiln_voc_xml_int(x, n, "depth", NULL), -1);
  assert_int_equal(kiln_voc_xml_int(x, n, "xmin", NULL), -1);
  assert_int_equal(kiln_voc_xml_int("<w>5", 4, "w", NULL), -1);
}

/* A tar that is not VOC 2007's is refused naming it, and nothing is cached. */
static void test_voc_refuses_other_tars(void **state) {
  tmpdir_fixture *f = *state;
  char cmd[2048], cache[512], tar[512], ready[600];
  path_in(f, "cache", cache, sizeof cache);
  path_in(f, "other.tar", tar, sizeof tar);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && mkdir -p VOCdevkit/VOC2012/JPEGImages && echo x > "
           "VOCdevkit/VOC2012/JPEGImages/1.jpg && tar cf other.tar VOCdevkit && rm -r VOCdevkit",
           f->dir);
  assert_int_equal(system(cmd), 0);
  const char *tars[1] = {tar};
  bool already = true;
  assert_int_equal(kiln_data_fetch_voc2007(tars, 1, cache, &already), KILN_ERR_DATA);
  assert_false(already);
  assert_non_null(strstr(kiln_last_error(), "other.tar: not a PASCAL VOC 2007 archive"));
  snprintf(ready, sizeof ready, "%s/voc2007/READY", cache);
  assert_false(exists(ready));
  /* nothing given and nothing cached: says which archives to give */
  assert_int_equal(kiln_data_fetch_voc2007(NULL, 0, cache, NULL), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "VOCtrainval_06-Nov-2007.tar"));
  /* a file that is no tar at all */
  write_plain(tar, "not a tar", 9);
  assert_int_equal(kiln_data_fetch_voc2007(tars, 1, cache, NULL), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "other.tar"));
  assert_false(exists(ready));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jpeg_round_trip),
      cmocka_unit_test(test_draw_is_deterministic),
      cmocka_unit_test(test_drawing_rules_pinned),
      cmocka_unit_test(test_boxes_are_tight),
      cmocka_unit_test(test_xml_numbers),
      cmocka_unit_test_setup_teardown(test_small_set_on_disk, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_lists_refuse_what_is_missing, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_voc_refuses_other_tars, setup, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
