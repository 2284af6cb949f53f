/* Images: PNG and JPEG decoding (files written here through libpng and libjpeg themselves, so
 * the pixels are known), gray and colour, Caffe's BGR plane order, PNG's palette, 16-bit,
 * alpha and interlaced forms, the bilinear resize against values worked out by hand, and
 * damaged input (a missing file, a file that is no image, truncated JPEG and PNG, a CMYK JPEG,
 * an absurd size) refused with a message naming it. Image lists: paths with spaces, blank lines,
 * CRLF, and lines without a label or with junk. The ImageData layer: batches, labels, the
 * transform, gray and resized images, the shuffle per epoch from the seed, a resume from the
 * cursor bit for bit, two sharded workers reading one worker's global batches, its errors.
 * kiln convert images: keys, shuffle, resize and gray; the Data layer reading an encoded LMDB
 * gives exactly the batches of the raw one (PNG) and of ImageData on the same files (JPEG). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <lmdb.h>
#include <zlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "files.h"
#include "kiln/data.h"
#include "layer_test.h"

static int setup(void **state) { return tmpdir_setup(state, "img"); }

/* ---- writing test images with the libraries ----------------------------------------------- */

/* A PNG of h rows of `row` bytes each (the file's own layout for `type` and `depth`); an
 * optional palette of n entries (RGB). */
static void write_png(const char *path, int w, int h, int type, int depth, bool interlace,
                      const uint8_t *pixels, size_t row, const png_color *palette, int n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png_create_info_struct(png);
  assert_non_null(info);
  if (setjmp(png_jmpbuf(png))) fail_msg("libpng failed writing %s", path);
  png_init_io(png, f);
  png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette) png_set_PLTE(png, info, palette, n);
  png_write_info(png, info);
  png_bytep rows[64];
  assert_true(h <= 64);
  for (int y = 0; y < h; y++) rows[y] = (png_bytep)(pixels + (size_t)y * row);
  png_write_image(png, rows);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  fclose(f);
}

/* A JPEG of interleaved pixels: 1 (gray), 3 (RGB) or 4 (CMYK) components. */
static void write_jpeg(const char *path, int w, int h, int comps, const uint8_t *pixels,
                       int quality) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = comps;
  c.in_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = (JSAMPROW)(pixels + (size_t)c.next_scanline * w * comps);
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  fclose(f);
}

/* Test pixel k (0 R, 1 G, 2 B) of image `rec` at (y, x). */
static uint8_t px(int rec, int y, int x, int k) {
  return (uint8_t)(rec * 37 + y * 13 + x * 5 + k * 71);
}

enum { IW = 5, IH = 4 };

/* Image `rec` as an RGB PNG of IW x IH. */
static void write_rgb(const char *path, int rec) {
  uint8_t p[IH * IW * 3];
  for (int y = 0; y < IH; y++)
    for (int x = 0; x < IW; x++)
      for (int k = 0; k < 3; k++) p[(y * IW + x) * 3 + k] = px(rec, y, x, k);
  write_png(path, IW, IH, PNG_COLOR_TYPE_RGB, 8, false, p, IW * 3, NULL, 0);
}

/* The decoded image holds image `rec`'s pixels in B, G, R planes. */
static void expect_bgr(const kiln_image *img, int rec) {
  assert_int_equal(img->channels, 3);
  assert_int_equal(img->height, IH);
  assert_int_equal(img->width, IW);
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < IH; y++)
      for (int x = 0; x < IW; x++)
        if (img->data[(c * IH + y) * IW + x] != px(rec, y, x, 2 - c))
          fail_msg("plane %d (%s) at (%d, %d): %d, want %d", c, c == 0 ? "B" : c == 1 ? "G" : "R",
                   y, x, img->data[(c * IH + y) * IW + x], px(rec, y, x, 2 - c));
}

/* Gray from R, G, B as libpng and libjpeg weigh them, to within one level of rounding. */
static double luma(int r, int g, int b) { return 0.299 * r + 0.587 * g + 0.114 * b; }

/* ---- PNG ------------------------------------------------------------------------------------ */

static void test_png_color_gray_and_bgr(void **state) {
  tmpdir_fixture *f = *state;
  char path[256];
  path_in(f, "rgb.png", path, sizeof path);
  write_rgb(path, 3);
  kiln_image img = {0};
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  expect_bgr(&img, 3);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  expect_bgr(&img, 3); /* a colour file as it is: 3 channels */
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_GRAY, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 1);
  for (int y = 0; y < IH; y++)
    for (int x = 0; x < IW; x++) {
      double want = luma(px(3, y, x, 0), px(3, y, x, 1), px(3, y, x, 2));
      assert_true(fabs(img.data[y * IW + x] - want) <= 1.0);
    }

  /* a gray file: 1 channel as it is, 3 equal planes as colour */
  uint8_t g[IH * IW];
  for (int i = 0; i < IH * IW; i++) g[i] = (uint8_t)(i * 11);
  path_in(f, "gray.png", path, sizeof path);
  write_png(path, IW, IH, PNG_COLOR_TYPE_GRAY, 8, false, g, IW, NULL, 0);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 1);
  assert_memory_equal(img.data, g, sizeof g);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_GRAY, 0, 0, &img), KILN_OK);
  assert_memory_equal(img.data, g, sizeof g);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 3);
  for (int c = 0; c < 3; c++) assert_memory_equal(img.data + c * IH * IW, g, sizeof g);
  kiln_image_free(&img);
}

/* Palette images become colour; 16 bits keep the high byte; alpha is dropped; an interlaced
 * file decodes to the same pixels; gray with alpha stays gray. */
static void test_png_palette_16bit_alpha_interlace(void **state) {
  tmpdir_fixture *f = *state;
  char path[256];
  kiln_image img = {0};
  png_color pal[4] = {{10, 20, 30}, {200, 100, 0}, {0, 255, 7}, {90, 91, 92}};
  uint8_t idx[IH * IW];
  for (int i = 0; i < IH * IW; i++) idx[i] = (uint8_t)(i * 7 % 4);
  path_in(f, "pal.png", path, sizeof path);
  write_png(path, IW, IH, PNG_COLOR_TYPE_PALETTE, 8, false, idx, IW, pal, 4);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 3);
  for (int i = 0; i < IH * IW; i++) {
    assert_int_equal(img.data[i], pal[idx[i]].blue);
    assert_int_equal(img.data[IH * IW + i], pal[idx[i]].green);
    assert_int_equal(img.data[2 * IH * IW + i], pal[idx[i]].red);
  }

  uint8_t wide[IH * IW * 6], rgba[IH * IW * 4], ga[IH * IW * 2], rgb[IH * IW * 3];
  for (int y = 0; y < IH; y++)
    for (int x = 0; x < IW; x++) {
      const int i = y * IW + x;
      for (int k = 0; k < 3; k++) {
        rgb[i * 3 + k] = px(5, y, x, k);
        wide[i * 6 + 2 * k] = px(5, y, x, k); /* big-endian: the high byte first */
        wide[i * 6 + 2 * k + 1] = (uint8_t)(255 - x);
        rgba[i * 4 + k] = px(5, y, x, k);
      }
      rgba[i * 4 + 3] = (uint8_t)(x * 60); /* some transparent: still the colour */
      ga[i * 2] = px(5, y, x, 1);
      ga[i * 2 + 1] = 0;
    }
  path_in(f, "wide.png", path, sizeof path);
  write_png(path, IW, IH, PNG_COLOR_TYPE_RGB, 16, false, wide, IW * 6, NULL, 0);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  expect_bgr(&img, 5);
  path_in(f, "rgba.png", path, sizeof path);
  write_png(path, IW, IH, PNG_COLOR_TYPE_RGB_ALPHA, 8, false, rgba, IW * 4, NULL, 0);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  expect_bgr(&img, 5);
  path_in(f, "adam7.png", path, sizeof path);
  write_png(path, IW, IH, PNG_COLOR_TYPE_RGB, 8, true, rgb, IW * 3, NULL, 0);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  expect_bgr(&img, 5);
  path_in(f, "ga.png", path, sizeof path);
  write_png(path, IW, IH, PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, ga, IW * 2, NULL, 0);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 1);
  for (int i = 0; i < IH * IW; i++) assert_int_equal(img.data[i], ga[i * 2]);
  /* kiln's own PNG writer (convert images --encoded) reads back the same planes */
  uint8_t *png = NULL;
  size_t len = 0;
  kiln_image again = {0};
  assert_int_equal(kiln_image_encode_png(img.data, 1, IH, IW, &png, &len), KILN_OK);
  assert_int_equal(kiln_image_decode(png, len, KILN_IMAGE_AS_IS, 0, 0, "mem", &again), KILN_OK);
  assert_int_equal(again.channels, 1);
  assert_memory_equal(again.data, img.data, IH * IW);
  free(png);
  path_in(f, "adam7.png", path, sizeof path);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  assert_int_equal(kiln_image_encode_png(img.data, 3, IH, IW, &png, &len), KILN_OK);
  assert_int_equal(kiln_image_decode(png, len, KILN_IMAGE_AS_IS, 0, 0, "mem", &again), KILN_OK);
  expect_bgr(&again, 5);
  free(png);
  kiln_image_free(&again);
  kiln_image_free(&img);
}

/* ---- JPEG ----------------------------------------------------------------------------------- */

enum { JW = 16, JH = 16 };

static void test_jpeg_color_gray_and_bgr(void **state) {
  tmpdir_fixture *f = *state;
  char path[256];
  /* left half pure red, right half pure blue, a smooth green ramp: within JPEG's tolerance, the
   * B plane is low on the left and high on the right */
  uint8_t p[JH * JW * 3];
  for (int y = 0; y < JH; y++)
    for (int x = 0; x < JW; x++) {
      uint8_t *q = p + (y * JW + x) * 3;
      q[0] = x < JW / 2 ? 250 : 5;
      q[1] = (uint8_t)(y * 8);
      q[2] = x < JW / 2 ? 5 : 250;
    }
  path_in(f, "c.jpg", path, sizeof path);
  write_jpeg(path, JW, JH, 3, p, 100);
  kiln_image img = {0};
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 3);
  assert_int_equal(img.height, JH);
  assert_int_equal(img.width, JW);
  double worst = 0, sum = 0;
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < JH; y++)
      for (int x = 0; x < JW; x++) {
        /* away from the sharp edge, where chroma subsampling blurs */
        if (x >= JW / 2 - 2 && x < JW / 2 + 2) continue;
        double d = fabs(img.data[(c * JH + y) * JW + x] - (double)p[(y * JW + x) * 3 + 2 - c]);
        worst = d > worst ? d : worst;
        sum += d;
      }
  if (worst > 12 || sum / (3 * JH * (JW - 4)) > 3)
    fail_msg("JPEG pixels off by up to %g, %g on average", worst, sum / (3 * JH * (JW - 4)));
  assert_true(img.data[0] < 30 && img.data[JW - 1] > 220);                     /* B */
  assert_true(img.data[2 * JH * JW] > 220 && img.data[2 * JH * JW + JW - 1] < 30); /* R */
  /* the same file as gray: one plane of the luma */
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_GRAY, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 1);
  for (int y = 0; y < JH; y++)
    for (int x = 0; x < JW; x++) {
      if (x >= JW / 2 - 2 && x < JW / 2 + 2) continue;
      const uint8_t *q = p + (y * JW + x) * 3;
      assert_true(fabs(img.data[y * JW + x] - luma(q[0], q[1], q[2])) <= 8);
    }
  /* a gray JPEG: one channel as it is, three equal ones as colour */
  uint8_t g[JH * JW];
  for (int i = 0; i < JH * JW; i++) g[i] = (uint8_t)(i % JW * 12 + i / JW);
  path_in(f, "g.jpg", path, sizeof path);
  write_jpeg(path, JW, JH, 1, g, 100);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_AS_IS, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 1);
  for (int i = 0; i < JH * JW; i++) assert_true(abs(img.data[i] - g[i]) <= 3);
  uint8_t first[JH * JW];
  memcpy(first, img.data, sizeof first);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  assert_int_equal(img.channels, 3);
  for (int c = 0; c < 3; c++) assert_memory_equal(img.data + c * JH * JW, first, sizeof first);
  kiln_image_free(&img);
}

/* ---- resize --------------------------------------------------------------------------------- */

/* OpenCV's INTER_LINEAR grid: 2 x 2 up to 4 x 4 weighs the source 1, 3/4 + 1/4, 1/4 + 3/4, 1
 * along each axis; 4 x 1 down to 2 x 1 averages pairs. Worked by hand. */
static void test_resize_by_hand(void **state) {
  tmpdir_fixture *f = *state;
  const uint8_t src[4] = {0, 100, 200, 40};
  uint8_t dst[16];
  assert_int_equal(kiln_image_resize(src, 1, 2, 2, dst, 4, 4), KILN_OK);
  /* rows 0 and 3 are the source rows resampled (0 25 75 100 and 200 160 80 40); row 1 is 3/4 of
   * row 0 and 1/4 of row 3 (50, 58.75, 76.25, 85), row 2 the other way round (150, 126.25,
   * 78.75, 55) */
  const uint8_t want[16] = {0,   25,  75, 100, 50,  59,  76, 85,
                            150, 126, 79, 55,  200, 160, 80, 40};
  assert_memory_equal(dst, want, sizeof want);
  const uint8_t row[4] = {10, 20, 30, 52};
  uint8_t half[2];
  assert_int_equal(kiln_image_resize(row, 1, 1, 4, half, 1, 2), KILN_OK);
  assert_int_equal(half[0], 15);
  assert_int_equal(half[1], 41);
  /* through the decoder: a 2 x 2 gray PNG asked for 4 x 4, and each plane of a colour one */
  char path[256];
  path_in(f, "two.png", path, sizeof path);
  write_png(path, 2, 2, PNG_COLOR_TYPE_GRAY, 8, false, src, 2, NULL, 0);
  kiln_image img = {0};
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_GRAY, 4, 4, &img), KILN_OK);
  assert_int_equal(img.height, 4);
  assert_int_equal(img.width, 4);
  assert_memory_equal(img.data, want, sizeof want);
  uint8_t rgb[12];
  for (int i = 0; i < 4; i++) rgb[i * 3] = src[i], rgb[i * 3 + 1] = 9, rgb[i * 3 + 2] = src[3 - i];
  path_in(f, "two_rgb.png", path, sizeof path);
  write_png(path, 2, 2, PNG_COLOR_TYPE_RGB, 8, false, rgb, 6, NULL, 0);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 4, 4, &img), KILN_OK);
  assert_memory_equal(img.data + 32, want, sizeof want); /* R, the third plane */
  for (int i = 0; i < 16; i++) assert_int_equal(img.data[16 + i], 9);
  /* the same size: the pixels as they are */
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 2, 2, &img), KILN_OK);
  assert_int_equal(img.data[8], 0);
  assert_int_equal(img.data[11], 40);
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_COLOR, 3, 0, &img), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "give both height and width"));
  kiln_image_free(&img);
}

/* ---- damaged input -------------------------------------------------------------------------- */

static void expect_error(int rc, int code, const char *a, const char *b) {
  if (rc != code) fail_msg("status %d, want %d: %s", rc, code, kiln_last_error());
  if (a && !strstr(kiln_last_error(), a)) fail_msg("'%s' lacks '%s'", kiln_last_error(), a);
  if (b && !strstr(kiln_last_error(), b)) fail_msg("'%s' lacks '%s'", kiln_last_error(), b);
}

/* The first `n` bytes of file `from` as file `to`. */
static void cut(const char *from, const char *to, size_t n) {
  char *bytes;
  size_t len;
  assert_int_equal(kiln_read_file(from, &bytes, &len), KILN_OK);
  assert_true(n < len);
  write_plain(to, bytes, n);
  free(bytes);
}

static void test_bad_images(void **state) {
  tmpdir_fixture *f = *state;
  char png[256], jpg[256], bad[256];
  kiln_image img = {0};
  path_in(f, "none.png", bad, sizeof bad);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_IO, bad, NULL);
  path_in(f, "text.png", bad, sizeof bad);
  write_plain(bad, "hello, not an image\n", 20);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad,
               "not a PNG or JPEG image");
  path_in(f, "empty.jpg", bad, sizeof bad);
  write_plain(bad, "", 0);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad, "empty");

  /* truncated JPEG: half the file, and all but its last bytes (the end-of-image marker) */
  uint8_t p[JH * JW * 3];
  for (int i = 0; i < JH * JW * 3; i++) p[i] = (uint8_t)(i * 31 % 251);
  path_in(f, "ok.jpg", jpg, sizeof jpg);
  write_jpeg(jpg, JW, JH, 3, p, 90);
  assert_int_equal(kiln_image_read(jpg, KILN_IMAGE_COLOR, 0, 0, &img), KILN_OK);
  char *bytes;
  size_t len;
  assert_int_equal(kiln_read_file(jpg, &bytes, &len), KILN_OK);
  free(bytes);
  path_in(f, "half.jpg", bad, sizeof bad);
  cut(jpg, bad, len / 2);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad,
               "damaged JPEG image");
  path_in(f, "head.jpg", bad, sizeof bad);
  cut(jpg, bad, 40); /* inside the headers */
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad,
               "damaged JPEG image");
  path_in(f, "noeoi.jpg", bad, sizeof bad);
  cut(jpg, bad, len - 2);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad, "truncated");

  /* truncated PNG: inside the pixels, and without its last chunk (IEND) */
  path_in(f, "ok.png", png, sizeof png);
  write_rgb(png, 1);
  assert_int_equal(kiln_read_file(png, &bytes, &len), KILN_OK);
  path_in(f, "half.png", bad, sizeof bad);
  cut(png, bad, len - 20);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad,
               "damaged PNG image");
  path_in(f, "noiend.png", bad, sizeof bad);
  cut(png, bad, len - 12);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad, "truncated");
  path_in(f, "sig.png", bad, sizeof bad);
  cut(png, bad, 12);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad,
               "damaged PNG image");
  /* a flipped bit in the header chunk fails its CRC */
  bytes[20] ^= 0x10;
  path_in(f, "crc.png", bad, sizeof bad);
  write_plain(bad, bytes, len);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad, "CRC");
  /* an absurd size in the header (CRC fixed up) is refused before anything is allocated */
  bytes[20] ^= 0x10;
  bytes[16] = 0x7f; /* width 2^30 and more */
  uint32_t crc = (uint32_t)crc32(0, (const uint8_t *)bytes + 12, 17);
  bytes[29] = (char)(crc >> 24), bytes[30] = (char)(crc >> 16), bytes[31] = (char)(crc >> 8);
  bytes[32] = (char)crc;
  path_in(f, "huge.png", bad, sizeof bad);
  write_plain(bad, bytes, len);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_DATA, bad,
               "damaged PNG image");
  free(bytes);

  /* CMYK: refused as unsupported, naming the file */
  uint8_t cmyk[JH * JW * 4] = {0};
  path_in(f, "cmyk.jpg", bad, sizeof bad);
  write_jpeg(bad, JW, JH, 4, cmyk, 90);
  expect_error(kiln_image_read(bad, KILN_IMAGE_COLOR, 0, 0, &img), KILN_ERR_UNSUPPORTED, bad,
               "CMYK");
  kiln_image_free(&img);
}

/* ---- image lists ---------------------------------------------------------------------------- */

static void test_image_lists(void **state) {
  tmpdir_fixture *f = *state;
  char path[256];
  path_in(f, "list.txt", path, sizeof path);
  const char good[] = "a.png 0\n\n  my photos/b c.jpg\t7\r\n   \nd.png -1   \ne.png +3";
  write_plain(path, good, strlen(good));
  kiln_image_list list;
  assert_int_equal(kiln_image_list_read(path, &list), KILN_OK);
  assert_int_equal(list.n, 4);
  assert_string_equal(list.path[0], "a.png");
  assert_string_equal(list.path[1], "my photos/b c.jpg");
  assert_string_equal(list.path[2], "d.png");
  assert_string_equal(list.path[3], "e.png");
  assert_int_equal(list.label[0], 0);
  assert_int_equal(list.label[1], 7);
  assert_int_equal(list.label[2], -1);
  assert_int_equal(list.label[3], 3);
  assert_int_equal(list.line[1], 3);
  assert_int_equal(list.line[3], 6);
  kiln_image_list_free(&list);

  static const struct {
    const char *text, *want;
    int code;
  } bad[] = {
      {"a.png 1\nb.png\nc.png 2\n", "list.txt:2: 'b.png' has no label", KILN_ERR_PARSE},
      {"a.png 1\n\nc.png 2x\n", "list.txt:3: label '2x' is not a whole number", KILN_ERR_PARSE},
      {"a.png one\n", "list.txt:1: label 'one'", KILN_ERR_PARSE},
      {"a.png 99999999999\n", "list.txt:1: label '99999999999'", KILN_ERR_PARSE},
      {"\n  \n", "the list names no images", KILN_ERR_DATA},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_plain(path, bad[i].text, strlen(bad[i].text));
    expect_error(kiln_image_list_read(path, &list), bad[i].code, bad[i].want, NULL);
  }
  path_in(f, "missing.txt", path, sizeof path);
  expect_error(kiln_image_list_read(path, &list), KILN_ERR_IO, path, NULL);
}

/* ---- the ImageData layer -------------------------------------------------------------------- */

enum { NIMG = 10 };

/* NIMG RGB PNGs img0.png .. img9.png in DIR/imgs/, and DIR/list.txt naming them with labels
 * 0 .. 9 (relative to the root folder DIR/imgs/). */
static void write_image_set(const tmpdir_fixture *f) {
  char path[320], dir[256];
  path_in(f, "imgs", dir, sizeof dir);
  kiln_mkdir_p(dir);
  kiln_strbuf list = {0};
  for (int i = 0; i < NIMG; i++) {
    snprintf(path, sizeof path, "%s/img%d.png", dir, i);
    write_rgb(path, i);
    kiln_strbuf_printf(&list, "img%d.png %d\n", i, i);
  }
  write_plain(path_in(f, "list.txt", path, sizeof path), list.s, list.len);
  free(list.s);
}

typedef struct {
  Caffe__LayerParameter *lp;
  kiln_blob *top[2];
  kiln_layer *l;
} image_layer;

/* An ImageData layer over the set; `extra` goes on inside image_data_param (which it closes). */
static int open_images(image_layer *d, const tmpdir_fixture *f, const char *type,
                       const char *extra, int phase, uint64_t seed) {
  char text[1024];
  if (!strcmp(type, "ImageData"))
    snprintf(text, sizeof text,
             "name: 'd' type: 'ImageData' top: 'data' top: 'label' image_data_param { source: "
             "'%s/list.txt' root_folder: '%s/imgs/' %s",
             f->dir, f->dir, extra);
  else /* Data over an LMDB of the set: `type` is its path */
    snprintf(text, sizeof text,
             "name: 'd' type: 'Data' top: 'data' top: 'label' data_param { source: '%s' backend: "
             "LMDB %s",
             type, extra);
  d->lp = gc_layer_param(text);
  d->top[0] = kiln_blob_new("data");
  d->top[1] = kiln_blob_new("label");
  return kiln_layer_create(d->lp, phase, NULL, 0, d->top, 2, seed, kiln_test_config(), &d->l);
}

static void close_images(image_layer *d) {
  kiln_layer_free(d->l);
  kiln_blob_free(d->top[0]);
  kiln_blob_free(d->top[1]);
  protobuf_c_message_free_unpacked(&d->lp->base, NULL);
}

static int next_labels(image_layer *d, int *labels) {
  assert_int_equal(layer_forward(d->l), KILN_OK);
  int n = (int)d->top[1]->shape[0];
  for (int i = 0; i < n; i++) labels[i] = (int)d->top[1]->data[i];
  return n;
}

/* Batches in list order wrapping round, labels, BGR planes, the transform, the shapes. */
static void test_image_data_batches(void **state) {
  tmpdir_fixture *f = *state;
  write_image_set(f);
  image_layer d;
  assert_int_equal(open_images(&d, f, "ImageData",
                               "batch_size: 4 } transform_param { scale: 0.5 mean_value: 1 "
                               "mean_value: 2 mean_value: 3 }",
                               TRAIN, 1),
                   KILN_OK);
  expect_shape(d.top[0], 4, SHAPE(4, 3, IH, IW));
  expect_shape(d.top[1], 1, SHAPE(4));
  const int want[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 0, 1}};
  for (int b = 0; b < 3; b++) {
    assert_int_equal(layer_forward(d.l), KILN_OK);
    for (int i = 0; i < 4; i++) {
      const int rec = want[b][i];
      assert_true(d.top[1]->data[i] == (float)rec);
      for (int c = 0; c < 3; c++)
        for (int y = 0; y < IH; y++)
          for (int x = 0; x < IW; x++) {
            float v = (px(rec, y, x, 2 - c) - (float)(c + 1)) * 0.5f;
            assert_true(d.top[0]->data[((i * 3 + c) * IH + y) * IW + x] == v);
          }
    }
  }
  assert_int_equal(d.l->ops->get_cursor(d.l), 12);
  close_images(&d);

  /* is_color false: one gray plane; new_height and new_width: resized */
  assert_int_equal(open_images(&d, f, "ImageData",
                               "batch_size: 2 is_color: false new_height: 8 new_width: 3 }",
                               TEST, 1),
                   KILN_OK);
  expect_shape(d.top[0], 4, SHAPE(2, 1, 8, 3));
  assert_int_equal(layer_forward(d.l), KILN_OK);
  char path[256];
  snprintf(path, sizeof path, "%s/imgs/img1.png", f->dir);
  kiln_image img = {0};
  assert_int_equal(kiln_image_read(path, KILN_IMAGE_GRAY, 8, 3, &img), KILN_OK);
  for (int i = 0; i < 24; i++) assert_true(d.top[0]->data[24 + i] == img.data[i]);
  kiln_image_free(&img);
  close_images(&d);
}

/* The same seed gives the same order, another seed another; each epoch is a permutation; a
 * resume from the cursor continues bit for bit (random crops and mirrors included). */
static void test_image_data_shuffle_and_resume(void **state) {
  tmpdir_fixture *f = *state;
  write_image_set(f);
  const char *p = "batch_size: 5 shuffle: true } transform_param { crop_size: 3 mirror: true }";
  image_layer a, b, c;
  assert_int_equal(open_images(&a, f, "ImageData", p, TRAIN, 7), KILN_OK);
  assert_int_equal(open_images(&b, f, "ImageData", p, TRAIN, 7), KILN_OK);
  assert_int_equal(open_images(&c, f, "ImageData", p, TRAIN, 8), KILN_OK);
  int ea[4][5], eb[5], ec[4][5];
  for (int k = 0; k < 4; k++) {
    assert_int_equal(next_labels(&a, ea[k]), 5);
    next_labels(&b, eb);
    next_labels(&c, ec[k]);
    assert_memory_equal(ea[k], eb, sizeof eb);
    assert_memory_equal(a.top[0]->data, b.top[0]->data, sizeof(float) * a.top[0]->count);
  }
  for (int epoch = 0; epoch < 2; epoch++) {
    int seen[NIMG] = {0};
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 5; i++) seen[ea[2 * epoch + k][i]]++;
    for (int r = 0; r < NIMG; r++) assert_int_equal(seen[r], 1);
  }
  bool identity = true;
  for (int i = 0; i < 10; i++) identity &= ea[i / 5][i % 5] == i;
  assert_false(identity);
  assert_true(memcmp(ea, ec, sizeof ea) != 0);

  /* resume: a reads on; r starts from a's cursor */
  const uint64_t cursor = a.l->ops->get_cursor(a.l);
  assert_int_equal(cursor, 20);
  image_layer r;
  assert_int_equal(open_images(&r, f, "ImageData", p, TRAIN, 7), KILN_OK);
  assert_int_equal(r.l->ops->set_cursor(r.l, cursor), KILN_OK);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(layer_forward(a.l), KILN_OK);
    assert_int_equal(layer_forward(r.l), KILN_OK);
    assert_memory_equal(a.top[0]->data, r.top[0]->data, sizeof(float) * a.top[0]->count);
    assert_memory_equal(a.top[1]->data, r.top[1]->data, sizeof(float) * 5);
  }
  close_images(&a);
  close_images(&b);
  close_images(&c);
  close_images(&r);
}

/* Worker r of 2 reads global batches r, r + 2, ... of the one-worker stream, and both report
 * its cursor. */
static void test_image_data_two_workers(void **state) {
  tmpdir_fixture *f = *state;
  write_image_set(f);
  const char *cases[] = {"batch_size: 3 }",
                         "batch_size: 4 shuffle: true } transform_param { crop_size: 2 mirror: "
                         "true }"};
  enum { ROUNDS = 6 };
  for (size_t k = 0; k < 2; k++) {
    image_layer one, w[2];
    float data[2 * ROUNDS][4 * 3 * IH * IW];
    int lab[2 * ROUNDS][4];
    uint64_t cursor = 0;
    assert_int_equal(open_images(&one, f, "ImageData", cases[k], TRAIN, 3), KILN_OK);
    for (int j = 0; j < 2 * ROUNDS; j++) {
      next_labels(&one, lab[j]);
      memcpy(data[j], one.top[0]->data, sizeof(float) * one.top[0]->count);
    }
    cursor = one.l->ops->get_cursor(one.l);
    const size_t bytes = sizeof(float) * one.top[0]->count;
    close_images(&one);
    for (int r = 0; r < 2; r++) {
      assert_int_equal(open_images(&w[r], f, "ImageData", cases[k], TRAIN, 3), KILN_OK);
      w[r].l->shard_rank = r;
      w[r].l->shard_count = 2;
    }
    for (int round = 0; round < ROUNDS; round++)
      for (int r = 0; r < 2; r++) {
        int got[4];
        const int n = next_labels(&w[r], got);
        assert_memory_equal(got, lab[2 * round + r], sizeof(int) * (size_t)n);
        assert_memory_equal(w[r].top[0]->data, data[2 * round + r], bytes);
      }
    for (int r = 0; r < 2; r++) {
      assert_true(w[r].l->ops->get_cursor(w[r].l) == cursor);
      close_images(&w[r]);
    }
  }
}

static void expect_layer_fails(const tmpdir_fixture *f, const char *extra, const char *a,
                               const char *b) {
  image_layer d;
  int rc = open_images(&d, f, "ImageData", extra, TRAIN, 1);
  if (rc == KILN_OK) fail_msg("'%s' was accepted", extra);
  if (!strstr(kiln_last_error(), "layer 'd' (ImageData)"))
    fail_msg("'%s' does not name the layer", kiln_last_error());
  if (a && !strstr(kiln_last_error(), a)) fail_msg("'%s' lacks '%s'", kiln_last_error(), a);
  if (b && !strstr(kiln_last_error(), b)) fail_msg("'%s' lacks '%s'", kiln_last_error(), b);
  kiln_blob_free(d.top[0]);
  kiln_blob_free(d.top[1]);
  protobuf_c_message_free_unpacked(&d.lp->base, NULL);
}

/* Bad parameters, a list line without a label, a missing image at setup and one met later
 * (an error from forward naming the list's line and the file), an image of another size. */
static void test_image_data_errors(void **state) {
  tmpdir_fixture *f = *state;
  write_image_set(f);
  expect_layer_fails(f, "batch_size: 0 }", "batch_size", NULL);
  expect_layer_fails(f, "batch_size: 2 crop_size: 3 }", "image_data_param.crop_size",
                     "transform_param");
  expect_layer_fails(f, "batch_size: 2 new_height: 3 }", "new_height 3", "both");
  expect_layer_fails(f, "batch_size: 2 } transform_param { crop_size: 9 }", "crop_size 9", NULL);
  char path[256], list[256];
  path_in(f, "list.txt", list, sizeof list);
  const char nolabel[] = "img0.png 0\nimg1.png\n";
  write_plain(list, nolabel, strlen(nolabel));
  expect_layer_fails(f, "batch_size: 2 }", "list.txt:2: 'img1.png' has no label", NULL);
  const char missing_first[] = "nothere.png 0\nimg1.png 1\n";
  write_plain(list, missing_first, strlen(missing_first));
  snprintf(path, sizeof path, "%s/imgs/nothere.png", f->dir);
  expect_layer_fails(f, "batch_size: 2 }", "list.txt:1: ", path);

  /* a missing file and an image of another size, met by the prefetch thread */
  const char later[] = "img0.png 0\nimg1.png 1\ngone.png 2\nimg3.png 3\n";
  write_plain(list, later, strlen(later));
  image_layer d;
  assert_int_equal(open_images(&d, f, "ImageData", "batch_size: 2 }", TRAIN, 1), KILN_OK);
  assert_int_equal(layer_forward(d.l), KILN_OK);
  assert_int_equal(layer_forward(d.l), KILN_ERR_IO);
  snprintf(path, sizeof path, "%s/imgs/gone.png", f->dir);
  assert_non_null(strstr(kiln_last_error(), "list.txt:3: "));
  assert_non_null(strstr(kiln_last_error(), path));
  assert_non_null(strstr(kiln_last_error(), "layer 'd' (ImageData)"));
  close_images(&d);
  snprintf(path, sizeof path, "%s/imgs/gone.png", f->dir);
  uint8_t g[2 * 2] = {1, 2, 3, 4};
  write_png(path, 2, 2, PNG_COLOR_TYPE_GRAY, 8, false, g, 2, NULL, 0);
  assert_int_equal(open_images(&d, f, "ImageData", "batch_size: 2 }", TRAIN, 1), KILN_OK);
  assert_int_equal(layer_forward(d.l), KILN_OK);
  assert_int_equal(layer_forward(d.l), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "list.txt:3: image"));
  assert_non_null(strstr(kiln_last_error(), "3x2x2, the first record was 3x4x5"));
  close_images(&d);
  /* ... which passes once every image is cropped to one size */
  assert_int_equal(open_images(&d, f, "ImageData",
                               "batch_size: 4 } transform_param { crop_size: 2 }", TEST, 1),
                   KILN_OK);
  assert_int_equal(layer_forward(d.l), KILN_OK);
  assert_true(d.top[0]->data[2 * 12] == 1 && d.top[0]->data[2 * 12 + 3] == 4); /* gone.png */
  close_images(&d);
}

/* ---- kiln convert images, encoded records in the Data layer --------------------------------- */

/* The keys of an LMDB in order, joined by spaces. */
static void lmdb_keys(const char *path, char *out, size_t n) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  MDB_cursor *c;
  MDB_val k, v;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_open(env, path, MDB_RDONLY | MDB_NOLOCK, 0664), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  assert_int_equal(mdb_cursor_open(txn, dbi, &c), 0);
  size_t o = 0;
  out[0] = '\0';
  for (int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
    o += (size_t)snprintf(out + o, n - o, "%s%.*s", o ? " " : "", (int)k.mv_size,
                          (const char *)k.mv_data);
  mdb_cursor_close(c);
  mdb_txn_abort(txn);
  mdb_env_close(env);
}

/* Batches of two layers are equal bit for bit, for `batches` passes. */
static void expect_same_batches(image_layer *a, image_layer *b, int batches) {
  for (int k = 0; k < batches; k++) {
    assert_int_equal(layer_forward(a->l), KILN_OK);
    assert_int_equal(layer_forward(b->l), KILN_OK);
    assert_int_equal(a->top[0]->count, b->top[0]->count);
    assert_memory_equal(a->top[0]->data, b->top[0]->data, sizeof(float) * a->top[0]->count);
    assert_memory_equal(a->top[1]->data, b->top[1]->data, sizeof(float) * a->top[1]->count);
  }
}

static void test_convert_and_encoded_records(void **state) {
  tmpdir_fixture *f = *state;
  write_image_set(f);
  char list[256], root[256], raw[256], enc[256], keys[2048];
  path_in(f, "list.txt", list, sizeof list);
  snprintf(root, sizeof root, "%s/imgs/", f->dir);
  path_in(f, "raw", raw, sizeof raw);
  path_in(f, "enc", enc, sizeof enc);
  uint64_t n = 0;
  kiln_convert_images_opts o = {0};
  assert_int_equal(kiln_convert_images_to_lmdb(list, root, raw, &o, &n), KILN_OK);
  assert_int_equal(n, NIMG);
  lmdb_keys(raw, keys, sizeof keys);
  assert_true(!strncmp(keys, "00000000_img0.png 00000001_img1.png 00000002_img2.png", 53));
  o.encoded = true;
  assert_int_equal(kiln_convert_images_to_lmdb(list, root, enc, &o, &n), KILN_OK);
  /* the encoded LMDB through the Data layer: exactly the raw one's batches (PNG is lossless) */
  image_layer a, b;
  assert_int_equal(open_images(&a, f, raw, "batch_size: 3 } transform_param { crop_size: 3 "
                               "mirror: true }", TRAIN, 2), KILN_OK);
  assert_int_equal(open_images(&b, f, enc, "batch_size: 3 } transform_param { crop_size: 3 "
                               "mirror: true }", TRAIN, 2), KILN_OK);
  expect_same_batches(&a, &b, 5);
  close_images(&a);
  close_images(&b);
  /* ... and ImageData's on the files themselves */
  assert_int_equal(open_images(&a, f, "ImageData", "batch_size: 4 }", TRAIN, 2), KILN_OK);
  assert_int_equal(open_images(&b, f, enc, "batch_size: 4 }", TRAIN, 2), KILN_OK);
  expect_same_batches(&a, &b, 4);
  close_images(&a);
  close_images(&b);
  /* force_gray decodes the encoded records to one plane */
  assert_int_equal(open_images(&b, f, enc, "batch_size: 1 } transform_param { force_gray: true }",
                               TEST, 2), KILN_OK);
  expect_shape(b.top[0], 4, SHAPE(1, 1, IH, IW));
  close_images(&b);

  /* JPEG files go into an encoded LMDB as they are: the Data layer decodes them exactly as
   * ImageData does */
  char path[256];
  kiln_strbuf jl = {0};
  for (int i = 0; i < 4; i++) {
    uint8_t p[JH * JW * 3];
    for (int j = 0; j < JH * JW * 3; j++) p[j] = (uint8_t)(j * (i + 3) % 253);
    snprintf(path, sizeof path, "%s/imgs/j%d.jpg", f->dir, i);
    write_jpeg(path, JW, JH, 3, p, 85);
    kiln_strbuf_printf(&jl, "j%d.jpg %d\n", i, 10 + i);
  }
  write_plain(list, jl.s, jl.len);
  free(jl.s);
  path_in(f, "jenc", enc, sizeof enc);
  assert_int_equal(kiln_convert_images_to_lmdb(list, root, enc, &o, &n), KILN_OK);
  char *bytes, mdb[320];
  size_t len;
  snprintf(mdb, sizeof mdb, "%s/data.mdb", enc);
  assert_int_equal(kiln_read_file(mdb, &bytes, &len), KILN_OK);
  bool has_jpeg = false;
  for (size_t i = 0; i + 3 < len && !has_jpeg; i++)
    has_jpeg = (uint8_t)bytes[i] == 0xff && (uint8_t)bytes[i + 1] == 0xd8 &&
               (uint8_t)bytes[i + 2] == 0xff;
  free(bytes);
  assert_true(has_jpeg);
  assert_int_equal(open_images(&a, f, "ImageData", "batch_size: 3 }", TRAIN, 2), KILN_OK);
  assert_int_equal(open_images(&b, f, enc, "batch_size: 3 }", TRAIN, 2), KILN_OK);
  expect_same_batches(&a, &b, 3);
  close_images(&a);
  close_images(&b);

  /* --shuffle --seed, --resize, --gray: keys in the shuffled order, records resized, gray */
  o = (kiln_convert_images_opts){.new_height = 6, .new_width = 7, .gray = true, .shuffle = true,
                                 .seed = 5};
  path_in(f, "small", raw, sizeof raw);
  assert_int_equal(kiln_convert_images_to_lmdb(list, root, raw, &o, &n), KILN_OK);
  lmdb_keys(raw, keys, sizeof keys);
  assert_null(strstr(keys, "00000000_j0.jpg 00000001_j1.jpg 00000002_j2.jpg 00000003_j3.jpg"));
  assert_non_null(strstr(keys, "00000000_j"));
  kiln_datum_db *db;
  kiln_datum d;
  assert_int_equal(kiln_datum_db_open(raw, &db), KILN_OK);
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  assert_true(d.channels == 1 && d.height == 6 && d.width == 7);
  kiln_datum_db_close(db);
  /* the output exists already: refused, left as it is */
  expect_error(kiln_convert_images_to_lmdb(list, root, raw, &o, &n), KILN_ERR_INVALID, raw,
               "already exists");
  /* a bad line or a missing image: refused naming the list's line, nothing left behind */
  const char bad[] = "j0.jpg 1\nj1.jpg\n";
  write_plain(list, bad, strlen(bad));
  path_in(f, "never", raw, sizeof raw);
  expect_error(kiln_convert_images_to_lmdb(list, root, raw, &o, &n), KILN_ERR_PARSE,
               "list.txt:2: 'j1.jpg' has no label", NULL);
  const char gone[] = "j0.jpg 1\ngone.jpg 2\n";
  write_plain(list, gone, strlen(gone));
  expect_error(kiln_convert_images_to_lmdb(list, root, raw, &o, &n), KILN_ERR_IO, "list.txt:2: ",
               "gone.jpg");
  assert_false(exists(raw));
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", raw);
  assert_false(exists(tmp));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_png_color_gray_and_bgr, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_png_palette_16bit_alpha_interlace, setup,
                                      tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_jpeg_color_gray_and_bgr, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_resize_by_hand, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_bad_images, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_image_lists, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_image_data_batches, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_image_data_shuffle_and_resume, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_image_data_two_workers, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_image_data_errors, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_and_encoded_records, setup, tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
