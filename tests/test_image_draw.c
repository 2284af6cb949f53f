/* Drawing on images (src/data/image_draw.c), what `kiln detect --draw` marks detections with:
 * rectangles at exactly the pixels they cover, outlines inside their box, clipping at every
 * border, glyphs of the font where expected (a known glyph written out here by hand, at scale 1
 * and 2), the label strip's place (above a box, inside one at the image's top, pulled in at the
 * right edge), each class's colour in the B, G, R planes, gray images, and refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"

/* A W x H image of `channels` planes, every byte `bg`. */
static kiln_image make(int channels, int w, int h, uint8_t bg) {
  kiln_image img = {.channels = channels, .height = h, .width = w};
  img.cap = (size_t)channels * w * h;
  img.data = malloc(img.cap);
  assert_non_null(img.data);
  memset(img.data, bg, img.cap);
  return img;
}

static uint8_t at(const kiln_image *img, int c, int x, int y) {
  return img->data[((size_t)c * img->height + y) * img->width + x];
}

/* Whether pixel (x, y) holds colour c (B, G, R planes). */
static bool is(const kiln_image *img, int x, int y, kiln_color c) {
  return at(img, 0, x, y) == c.b && at(img, 1, x, y) == c.g && at(img, 2, x, y) == c.r;
}

/* Every pixel: set (colour c) where want(x, y) says, else still the background (all 0). */
static void expect_pixels(const kiln_image *img, kiln_color c, bool (*want)(int, int)) {
  for (int y = 0; y < img->height; y++)
    for (int x = 0; x < img->width; x++) {
      const bool set = want(x, y);
      const bool ok = set ? is(img, x, y, c)
                          : at(img, 0, x, y) == 0 && at(img, 1, x, y) == 0 && at(img, 2, x, y) == 0;
      if (!ok) fail_msg("pixel (%d, %d): expected %s", x, y, set ? "the colour" : "background");
    }
}

static const kiln_color red = {230, 40, 40};

static void test_palette(void **state) {
  (void)state;
  /* fixed colours, distinct over a round of the palette, the planes in B, G, R order */
  const kiln_color one = kiln_class_color(1);
  assert_true(one.r == 230 && one.g == 40 && one.b == 40);
  const kiln_color blue = kiln_class_color(3);
  assert_true(blue.b > blue.r && blue.b > blue.g);
  for (int a = 0; a < KILN_PALETTE_SIZE; a++)
    for (int b = a + 1; b < KILN_PALETTE_SIZE; b++) {
      const kiln_color x = kiln_class_color(a), y = kiln_class_color(b);
      assert_false(x.r == y.r && x.g == y.g && x.b == y.b);
    }
  const kiln_color w = kiln_class_color(1 + KILN_PALETTE_SIZE), g = kiln_class_color(-3);
  assert_true(w.r == 230 && w.g == 40 && w.b == 40);
  assert_true(g.r == kiln_class_color(0).r && g.g == kiln_class_color(0).g);
  kiln_image img = make(3, 4, 3, 0);
  assert_int_equal(kiln_image_fill_rect(&img, 1, 1, 1, 1, blue), KILN_OK);
  assert_int_equal(at(&img, 0, 1, 1), blue.b);
  assert_int_equal(at(&img, 1, 1, 1), blue.g);
  assert_int_equal(at(&img, 2, 1, 1), blue.r);
  assert_int_equal(at(&img, 0, 0, 0), 0);
  free(img.data);
}

static bool fill_want(int x, int y) { return x >= 2 && x <= 5 && y >= 0 && y <= 3; }
static bool nothing(int x, int y) { (void)x, (void)y; return false; }

static void test_fill_clipped(void **state) {
  (void)state;
  kiln_image img = make(3, 6, 5, 0);
  /* reversed corners, running past the top and the right edge */
  assert_int_equal(kiln_image_fill_rect(&img, 40, 3, 2, -7, red), KILN_OK);
  expect_pixels(&img, red, fill_want);
  memset(img.data, 0, img.cap);
  /* wholly outside, on every side */
  assert_int_equal(kiln_image_fill_rect(&img, -5, 0, -1, 4, red), KILN_OK);
  assert_int_equal(kiln_image_fill_rect(&img, 6, 0, 9, 4, red), KILN_OK);
  assert_int_equal(kiln_image_fill_rect(&img, 0, -9, 5, -1, red), KILN_OK);
  assert_int_equal(kiln_image_fill_rect(&img, 0, 5, 5, 50, red), KILN_OK);
  expect_pixels(&img, red, nothing);
  free(img.data);
}

/* the box 3..12 x 2..7, two pixels thick, inside it */
static bool rect_want(int x, int y) {
  if (x < 3 || x > 12 || y < 2 || y > 7) return false;
  return x <= 4 || x >= 11 || y <= 3 || y >= 6;
}
/* the whole 20 x 10 image's frame */
static bool frame_want(int x, int y) { return x <= 1 || x >= 18 || y <= 1 || y >= 8; }
/* a box past the left and top edges (-4..5 x -4..5): only its right and bottom sides show */
static bool past_want(int x, int y) {
  return x <= 5 && y <= 5 && (x >= 4 || y >= 4);
}
static bool thin_want(int x, int y) { return x >= 7 && x <= 9 && y >= 3 && y <= 6; }

static void test_rectangles(void **state) {
  (void)state;
  kiln_image img = make(3, 20, 10, 0);
  assert_int_equal(kiln_image_draw_rect(&img, 3, 2, 12, 7, 2, red), KILN_OK);
  expect_pixels(&img, red, rect_want);
  memset(img.data, 0, img.cap);
  assert_int_equal(kiln_image_draw_rect(&img, 12, 7, 3, 2, 2, red), KILN_OK); /* either order */
  expect_pixels(&img, red, rect_want);
  memset(img.data, 0, img.cap);
  /* a box on the image's border keeps its whole line */
  assert_int_equal(kiln_image_draw_rect(&img, 0, 0, 19, 9, 2, red), KILN_OK);
  expect_pixels(&img, red, frame_want);
  memset(img.data, 0, img.cap);
  assert_int_equal(kiln_image_draw_rect(&img, -4, -4, 5, 5, 2, red), KILN_OK);
  expect_pixels(&img, red, past_want);
  memset(img.data, 0, img.cap);
  /* a box narrower than its lines is filled */
  assert_int_equal(kiln_image_draw_rect(&img, 7, 3, 9, 6, 2, red), KILN_OK);
  expect_pixels(&img, red, thin_want);
  memset(img.data, 0, img.cap);
  assert_int_equal(kiln_image_draw_rect(&img, 30, 30, 40, 40, 2, red), KILN_OK);
  expect_pixels(&img, red, nothing);
  free(img.data);
}

/* The font's 'A', 'g' and '1', written out here: what the table must draw. */
static const char *const glyph_a[KILN_FONT_HEIGHT] = {
    ".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#", ".....",
};
static const char *const glyph_g[KILN_FONT_HEIGHT] = {
    ".....", ".....", ".####", "#...#", "#...#", ".####", "....#", ".###.",
};
static const char *const glyph_1[KILN_FONT_HEIGHT] = {
    "..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###.", ".....",
};

/* Text drawn at (ox, oy), scale s: glyph k's set pixels, and nothing else. */
static const char *const *text_glyphs[3];
static int text_ox, text_oy, text_s, text_n;
static bool text_want(int x, int y) {
  const int cell = KILN_FONT_ADVANCE * text_s;
  if (x < text_ox || y < text_oy) return false;
  const int k = (x - text_ox) / cell, cx = (x - text_ox) % cell / text_s,
            cy = (y - text_oy) / text_s;
  if (k >= text_n || cx >= KILN_FONT_WIDTH || cy >= KILN_FONT_HEIGHT) return false;
  return text_glyphs[k][cy][cx] == '#';
}

static void test_glyphs(void **state) {
  (void)state;
  /* the table agrees with the drawings */
  const char *const *const drawn[] = {glyph_a, glyph_g, glyph_1};
  const char chars[] = "Ag1";
  for (int k = 0; k < 3; k++) {
    const uint8_t *g = kiln_font_glyph((unsigned char)chars[k]);
    for (int r = 0; r < KILN_FONT_HEIGHT; r++)
      for (int c = 0; c < KILN_FONT_WIDTH; c++)
        assert_int_equal(g[r] >> (KILN_FONT_WIDTH - 1 - c) & 1, drawn[k][r][c] == '#');
  }
  /* every printable glyph but the space has pixels, within 5 columns; others draw as '?' */
  for (int c = 33; c < 127; c++) {
    const uint8_t *g = kiln_font_glyph((unsigned char)c);
    int any = 0;
    for (int r = 0; r < KILN_FONT_HEIGHT; r++) {
      any |= g[r];
      assert_int_equal(g[r] & ~0x1f, 0);
    }
    if (!any) fail_msg("glyph %d ('%c') is empty", c, c);
  }
  assert_ptr_equal(kiln_font_glyph(7), kiln_font_glyph('?'));
  assert_ptr_equal(kiln_font_glyph(200), kiln_font_glyph('?'));
  for (int r = 0; r < KILN_FONT_HEIGHT; r++) assert_int_equal(kiln_font_glyph(' ')[r], 0);

  assert_int_equal(kiln_font_text_width("disc 0.97", 1), 9 * 6 - 1);
  assert_int_equal(kiln_font_text_width("disc 0.97", 2), 2 * (9 * 6 - 1));
  assert_int_equal(kiln_font_text_width("", 3), 0);

  /* "Ag1" at (3, 2), scale 1, and at (1, 4), scale 2: exactly the glyphs' pixels */
  for (int s = 1; s <= 2; s++) {
    kiln_image img = make(3, 40, 22, 0);
    text_glyphs[0] = glyph_a, text_glyphs[1] = glyph_g, text_glyphs[2] = glyph_1;
    text_ox = s == 1 ? 3 : 1, text_oy = s == 1 ? 2 : 4, text_s = s, text_n = 3;
    assert_int_equal(kiln_image_draw_text(&img, text_ox, text_oy, "Ag1", s, red), KILN_OK);
    expect_pixels(&img, red, text_want);
    free(img.data);
  }
  /* clipped at the right and bottom edges: the part inside, nothing elsewhere */
  kiln_image img = make(3, 8, 5, 0);
  text_ox = 4, text_oy = 1, text_s = 1, text_n = 3;
  assert_int_equal(kiln_image_draw_text(&img, 4, 1, "Ag1", 1, red), KILN_OK);
  expect_pixels(&img, red, text_want);
  memset(img.data, 0, img.cap);
  assert_int_equal(kiln_image_draw_text(&img, -100, -100, "Ag1", 1, red), KILN_OK);
  expect_pixels(&img, red, nothing);
  free(img.data);
}

static void test_label_strip(void **state) {
  (void)state;
  kiln_image img = make(3, 100, 60, 0);
  const int w = kiln_font_text_width("disc 0.97", 1) + 2, h = KILN_FONT_HEIGHT + 2;
  int s[4];
  kiln_label_strip(&img, 20, 30, "disc 0.97", 1, s); /* room above the box */
  assert_int_equal(s[0], 20);
  assert_int_equal(s[1], 30 - h);
  assert_int_equal(s[2], 20 + w - 1);
  assert_int_equal(s[3], 29);
  kiln_label_strip(&img, 20, h, "disc 0.97", 1, s); /* just room */
  assert_int_equal(s[1], 0);
  kiln_label_strip(&img, 20, h - 1, "disc 0.97", 1, s); /* none: inside the box, at its top */
  assert_int_equal(s[1], h - 1);
  assert_int_equal(s[3], 2 * h - 2);
  kiln_label_strip(&img, 90, 0, "disc 0.97", 1, s); /* the right edge: pulled in */
  assert_int_equal(s[0], 100 - w);
  assert_int_equal(s[2], 99);
  assert_int_equal(s[1], 0);
  kiln_label_strip(&img, 0, 30, "disc 0.97", 2, s);
  assert_int_equal(s[2] - s[0] + 1, 2 * w);
  assert_int_equal(s[3] - s[1] + 1, 2 * h);
  kiln_image narrow = make(3, 10, 60, 0); /* narrower than the strip: from 0 */
  kiln_label_strip(&narrow, 5, 30, "disc 0.97", 1, s);
  assert_int_equal(s[0], 0);
  free(narrow.data);
  free(img.data);
}

static void test_detection(void **state) {
  (void)state;
  /* a yellow box (class 4) with room above: the strip yellow, the text black on it */
  kiln_image img = make(3, 80, 50, 0);
  const kiln_color yellow = kiln_class_color(4), blue = kiln_class_color(3);
  assert_int_equal(kiln_image_draw_detection(&img, 10, 20, 60, 45, "Ag1", yellow, 2, 1), KILN_OK);
  const int h = KILN_FONT_HEIGHT + 2, w = kiln_font_text_width("Ag1", 1) + 2;
  assert_true(is(&img, 10, 20, yellow) && is(&img, 11, 21, yellow) && is(&img, 60, 45, yellow));
  assert_true(is(&img, 12, 22, (kiln_color){0, 0, 0})); /* inside the box: untouched */
  for (int y = 20 - h; y < 20; y++)
    for (int x = 10; x < 10 + w; x++) {
      const int gx = x - 11, gy = y - (20 - h + 1);
      const bool ink = gx >= 0 && gy >= 0 && gy < KILN_FONT_HEIGHT &&
                       gx % KILN_FONT_ADVANCE < KILN_FONT_WIDTH && gx / KILN_FONT_ADVANCE < 3 &&
                       (gx / KILN_FONT_ADVANCE == 0 ? glyph_a : gx / KILN_FONT_ADVANCE == 1
                                                                    ? glyph_g
                                                                    : glyph_1)
                               [gy][gx % KILN_FONT_ADVANCE] == '#';
      if (!is(&img, x, y, ink ? (kiln_color){0, 0, 0} : yellow))
        fail_msg("strip pixel (%d, %d): expected %s", x, y, ink ? "black ink" : "yellow");
    }
  assert_true(is(&img, 10 + w, 20 - h, (kiln_color){0, 0, 0})); /* past the strip */
  assert_true(is(&img, 10, 20 - h - 1, (kiln_color){0, 0, 0}));
  /* a dark blue box at the top: the strip inside it, white text */
  memset(img.data, 0, img.cap);
  assert_int_equal(kiln_image_draw_detection(&img, 5, 0, 70, 40, "1", blue, 2, 1), KILN_OK);
  assert_true(is(&img, 5, 0, blue) && is(&img, 5 + 6, h - 1, blue));
  assert_true(is(&img, 5 + 1 + 2, 1, (kiln_color){255, 255, 255})); /* the 1's top */
  /* no text: the box alone */
  memset(img.data, 0, img.cap);
  assert_int_equal(kiln_image_draw_detection(&img, 10, 20, 60, 45, "", blue, 2, 1), KILN_OK);
  assert_true(is(&img, 10, 19, (kiln_color){0, 0, 0}) && is(&img, 10, 20, blue));
  free(img.data);
}

static void test_gray_and_refusals(void **state) {
  (void)state;
  kiln_image gray = make(1, 10, 10, 0);
  assert_int_equal(kiln_image_draw_rect(&gray, 0, 0, 9, 9, 1, (kiln_color){255, 0, 0}), KILN_OK);
  assert_int_equal(gray.data[0], 76); /* 0.299 x 255, rounded */
  assert_int_equal(gray.data[5 * 10 + 5], 0);
  assert_int_equal(kiln_image_draw_text(&gray, 2, 1, "1", 1, (kiln_color){255, 255, 255}),
                   KILN_OK);
  assert_int_equal(gray.data[1 * 10 + 4], 255); /* the 1's top pixel, column 2 of its glyph */
  assert_int_equal(kiln_image_draw_rect(&gray, 0, 0, 3, 3, 0, red), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_draw_text(&gray, 0, 0, "x", 0, red), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_draw_detection(&gray, 0, 0, 3, 3, "x", red, 2, 0),
                   KILN_ERR_INVALID);
  gray.channels = 2;
  assert_int_equal(kiln_image_fill_rect(&gray, 0, 0, 3, 3, red), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_fill_rect(NULL, 0, 0, 3, 3, red), KILN_ERR_INVALID);
  free(gray.data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_palette),
      cmocka_unit_test(test_fill_clipped),
      cmocka_unit_test(test_rectangles),
      cmocka_unit_test(test_glyphs),
      cmocka_unit_test(test_label_strip),
      cmocka_unit_test(test_detection),
      cmocka_unit_test(test_gray_and_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
