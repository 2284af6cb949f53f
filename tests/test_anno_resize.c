/* The resize of SSD's augmentation: kiln_image_warp's five interpolations by hand (values that
 * OpenCV 4.6's cv::resize gives too) and by property (constant images kept, ramps monotone,
 * 1 x N sizes, LINEAR against the decoder's bilinear), resize_param's modes with their boxes
 * and padding (CONSTANT, MIRRORED, REPEAT_NEAREST), the draw of the interpolation, and the
 * mirror. */
#include "anno_test.h"

#include <stdio.h>

/* ---- interpolation ------------------------------------------------------------------------ */

static void warp(const uint8_t *src, int c, int sh, int sw, uint8_t *dst, int dh, int dw,
                 kiln_interp mode, kiln_warp_work *w) {
  if (kiln_image_warp(src, c, sh, sw, dst, dh, dw, mode, w) != KILN_OK)
    fail_msg("%s %dx%d -> %dx%d: %s", kiln_interp_name(mode), sw, sh, dw, dh, kiln_last_error());
}

static void test_interpolation_by_hand(void **state) {
  (void)state;
  kiln_warp_work w = {0};
  uint8_t out[64];
  const uint8_t sq[4] = {0, 100, 200, 40};
  /* bilinear 2x2 -> 4x4: an axis of (a, b) gives (a, .75a + .25b, .25a + .75b, b), the border
   * pixels repeated */
  warp(sq, 1, 2, 2, out, 4, 4, KILN_INTERP_LINEAR, &w);
  assert_bytes(out, (const uint8_t[]){0, 25, 75, 100,      /* row 0 */
                                      50, 59, 76, 85,      /* .75 row 0 + .25 row 1 */
                                      150, 126, 79, 55,    /* .25 row 0 + .75 row 1 */
                                      200, 160, 80, 40},
               16);
  /* the same as the decoder's bilinear kiln_image_resize */
  uint8_t ref[16];
  assert_int_equal(kiln_image_resize(sq, 1, 2, 2, ref, 4, 4), KILN_OK);
  assert_bytes(out, ref, 16);
  /* nearest, OpenCV's floor(i src / dst): doubling repeats, halving takes pixels 0 and 2 */
  warp(sq, 1, 2, 2, out, 4, 4, KILN_INTERP_NEAREST, &w);
  assert_bytes(out, (const uint8_t[]){0, 0, 100, 100, 0, 0, 100, 100,
                                      200, 200, 40, 40, 200, 200, 40, 40}, 16);
  const uint8_t four[16] = {1, 2, 10, 20, 2, 2, 30, 40, 0, 0, 1, 1, 0, 1, 2, 2};
  warp(four, 1, 4, 4, out, 2, 2, KILN_INTERP_NEAREST, &w);
  assert_bytes(out, (const uint8_t[]){1, 10, 0, 1}, 4);
  warp((const uint8_t[]){7, 8, 9}, 1, 1, 3, out, 1, 2, KILN_INTERP_NEAREST, &w);
  assert_bytes(out, (const uint8_t[]){7, 8}, 2); /* floor(0), floor(1.5) */
  /* area 4x4 -> 2x2: the blocks' means, rounded half up: 1.75 -> 2, 25, 0.25 -> 0, 1.5 -> 2 */
  warp(four, 1, 4, 4, out, 2, 2, KILN_INTERP_AREA, &w);
  assert_bytes(out, (const uint8_t[]){2, 25, 0, 2}, 4);
  /* area 3 -> 2: thirds of the middle pixel go to both (10, 50); 3 -> 4 enlarging: the
   * footprints straddling a border mix two pixels by area (OpenCV's INTER_AREA), 2 -> 4 repeats */
  const uint8_t ramp3[3] = {0, 30, 60};
  warp(ramp3, 1, 1, 3, out, 1, 2, KILN_INTERP_AREA, &w);
  assert_bytes(out, (const uint8_t[]){10, 50}, 2);
  warp(ramp3, 1, 1, 3, out, 1, 4, KILN_INTERP_AREA, &w);
  assert_bytes(out, (const uint8_t[]){0, 20, 40, 60}, 4);
  warp(sq, 1, 2, 2, out, 4, 4, KILN_INTERP_AREA, &w);
  assert_bytes(out, (const uint8_t[]){0, 0, 100, 100, 0, 0, 100, 100,
                                      200, 200, 40, 40, 200, 200, 40, 40}, 16);
  /* one axis growing and the other shrinking: OpenCV then reads two pixels a footprint on the
   * shrinking axis, the first and the one after it (1 x 3 -> 2 x 1 gives 20, not the mean 30;
   * 1 x 6 -> 3 x 2 gives 20 and 110), and kiln does as it does */
  warp(ramp3, 1, 1, 3, out, 2, 1, KILN_INTERP_AREA, &w);
  assert_bytes(out, (const uint8_t[]){20, 20}, 2);
  warp((const uint8_t[]){0, 30, 60, 90, 120, 150}, 1, 1, 6, out, 3, 2, KILN_INTERP_AREA, &w);
  assert_bytes(out, (const uint8_t[]){20, 110, 20, 110, 20, 110}, 6);
  /* cubic on a step, by Keys' weights: (0, 0, 90, 90) from 4 to 8 */
  const uint8_t step[4] = {0, 0, 90, 90};
  warp(step, 1, 1, 4, out, 1, 8, KILN_INTERP_CUBIC, &w);
  /* output 3 samples x = 1.25: taps 0, 1, 2, 3 at distances 1.25, .25, .75, 1.75 with weights
   * -0.10547, 0.87891, 0.26172, -0.03516: 90 (0.26172 - 0.03516) = 20.39 -> 20; output 4
   * mirrors it: 90 - 20.39 = 69.61 -> 70 */
  assert_int_equal(out[3], 20);
  assert_int_equal(out[4], 70);
  /* the whole row, with the undershoot held at 0 and the overshoot past 90: OpenCV 4.6's own */
  assert_bytes(out, (const uint8_t[]){0, 0, 0, 20, 70, 99, 93, 90}, 8);
  /* and the same size is a copy in every mode */
  for (int m = KILN_INTERP_LINEAR; m <= KILN_INTERP_LANCZOS4; m++) {
    warp(four, 1, 4, 4, out, 4, 4, (kiln_interp)m, &w);
    assert_bytes(out, four, 16);
  }
  assert_int_equal(kiln_image_warp(four, 1, 4, 4, out, 0, 4, KILN_INTERP_LINEAR, &w),
                   KILN_ERR_INVALID);
  assert_int_equal(kiln_image_warp(four, 1, 4, 4, out, 2, 2, (kiln_interp)9, &w),
                   KILN_ERR_INVALID);
  kiln_warp_work_free(&w);
}

static void test_interpolation_properties(void **state) {
  (void)state;
  kiln_warp_work w = {0};
  kiln_rng rng;
  kiln_rng_seed(&rng, 9, 0);
  static const int sizes[][4] = {{1, 1, 4, 4}, {1, 5, 3, 2}, {5, 1, 1, 1}, {1, 9, 1, 4},
                                 {7, 5, 3, 11}, {6, 6, 13, 13}, {20, 30, 7, 9}, {9, 3, 2, 17},
                                 {3, 40, 3, 7}, {16, 16, 16, 5}, {2, 12, 3, 40}, {4, 8, 4, 3},
                                 {1, 12, 1, 5}, {3, 7, 1, 23}};
  uint8_t src[1200], dst[3 * 25 * 25];
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const int sh = sizes[s][0], sw = sizes[s][1], dh = sizes[s][2], dw = sizes[s][3];
    for (int m = KILN_INTERP_LINEAR; m <= KILN_INTERP_LANCZOS4; m++) {
      /* a constant image stays constant */
      const uint8_t k = (uint8_t)kiln_rng_below(&rng, 256);
      memset(src, k, (size_t)sh * sw * 2);
      warp(src, 2, sh, sw, dst, dh, dw, (kiln_interp)m, &w);
      for (int i = 0; i < 2 * dh * dw; i++)
        if (dst[i] != k) fail_msg("%s %dx%d -> %dx%d of %d: %d at %d", kiln_interp_name(m), sw, sh,
                                  dw, dh, k, dst[i], i);
      /* a ramp along x (10 + 20 x, every row) stays non-decreasing along x, rows equal */
      for (int y = 0; y < sh; y++)
        for (int x = 0; x < sw; x++) src[y * sw + x] = (uint8_t)(10 + 20 * (x % 12));
      if (sw > 12) continue;
      warp(src, 1, sh, sw, dst, dh, dw, (kiln_interp)m, &w);
      for (int y = 0; y < dh; y++)
        for (int x = 0; x < dw; x++) {
          if (x > 0 && dst[y * dw + x] < dst[y * dw + x - 1])
            fail_msg("%s %dx%d -> %dx%d: the ramp falls at (%d, %d): %d after %d",
                     kiln_interp_name(m), sw, sh, dw, dh, x, y, dst[y * dw + x],
                     dst[y * dw + x - 1]);
          if (dst[y * dw + x] != dst[x]) fail_msg("%s: rows differ", kiln_interp_name(m));
        }
    }
  }
  /* LINEAR is the decoder's bilinear on any sizes, within a level: the decoder takes each
   * weight from a double, this (like OpenCV) from a float, so a value near a half may round
   * the other way */
  for (int t = 0; t < 20; t++) {
    const int sh = 1 + (int)kiln_rng_below(&rng, 20), sw = 1 + (int)kiln_rng_below(&rng, 20);
    const int dh = 1 + (int)kiln_rng_below(&rng, 25), dw = 1 + (int)kiln_rng_below(&rng, 25);
    for (int i = 0; i < 3 * sh * sw; i++) src[i] = (uint8_t)kiln_rng_below(&rng, 256);
    uint8_t ref[3 * 25 * 25];
    warp(src, 3, sh, sw, dst, dh, dw, KILN_INTERP_LINEAR, &w);
    assert_int_equal(kiln_image_resize(src, 3, sh, sw, ref, dh, dw), KILN_OK);
    for (int i = 0; i < 3 * dh * dw; i++)
      if (abs(dst[i] - ref[i]) > 1)
        fail_msg("%dx%d -> %dx%d: %d against the decoder's %d at %d", sw, sh, dw, dh, dst[i],
                 ref[i], i);
  }
  kiln_warp_work_free(&w);
}

/* ---- resize modes, mirror ------------------------------------------------------------------ */

static void test_resize_modes_and_boxes(void **state) {
  (void)state;
  kiln_image img = {0};
  kiln_anno_work w = {0};
  kiln_anno_boxes boxes = {0};
  Caffe__ResizeParameter r = CAFFE__RESIZE_PARAMETER__INIT;
  r.height = 4;
  r.width = 4;
  const uint8_t fill[3] = {7, 8, 9};
  /* FIT_LARGE_SIZE_AND_PAD, a wide 2 x 4 image into 4 x 4: rows 1 and 2, padding above and
   * below; the box's pixels are the image's */
  const uint8_t wide[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  image_of(&img, 1, 2, 4, wide);
  add_box(&boxes, 1, 0, 0, 0.5f, 1);
  r.resize_mode = CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_LARGE_SIZE_AND_PAD;
  assert_int_equal(kiln_resize(&img, &boxes, &r, KILN_INTERP_LINEAR, fill, &w), KILN_OK);
  assert_int_equal(img.height, 4);
  assert_int_equal(img.width, 4);
  assert_bytes(img.data, (const uint8_t[]){7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 7, 7, 7, 7}, 16);
  assert_box(&boxes.v[0].box, 0, 0.25f, 0.5f, 0.75f);
  /* a tall 4 x 2 image: columns 1 and 2; its box x' = (1 + 2 x) / 4 */
  const uint8_t tall[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  image_of(&img, 1, 4, 2, tall);
  boxes.n = 0;
  add_box(&boxes, 1, 0.5f, 0.25f, 1, 0.5f);
  assert_int_equal(kiln_resize(&img, &boxes, &r, KILN_INTERP_NEAREST, fill, &w), KILN_OK);
  assert_bytes(img.data, (const uint8_t[]){7, 1, 2, 7, 7, 3, 4, 7, 7, 5, 6, 7, 7, 7, 8, 7}, 16);
  assert_box(&boxes.v[0].box, 0.5f, 0.25f, 0.75f, 0.5f);
  /* and resized on the way: 3 x 6 into 4 x 4 is 2 x 4 (floor(4 / 2)) from row 1; a box of the
   * right half stays on columns 2 .. 3, rows 1 .. 2 */
  uint8_t v18[18];
  for (int i = 0; i < 18; i++) v18[i] = (uint8_t)(10 * i);
  image_of(&img, 1, 3, 6, v18);
  boxes.n = 0;
  add_box(&boxes, 1, 0.5f, 0, 1, 1);
  assert_int_equal(kiln_resize(&img, &boxes, &r, KILN_INTERP_AREA, fill, &w), KILN_OK);
  assert_box(&boxes.v[0].box, 0.5f, 0.25f, 1, 0.75f);
  assert_int_equal(px(&img, 0, 0, 0), 7);
  assert_int_equal(px(&img, 0, 3, 3), 7);
  assert_true(px(&img, 0, 1, 3) != 7 && px(&img, 0, 2, 0) != 7);

  /* the other pad modes, on a 1 x 3 row into 1 x 9: b c b | a b c | b a b (OpenCV's
   * REFLECT_101) and a a a | a b c | c c c */
  Caffe__ResizeParameter row = CAFFE__RESIZE_PARAMETER__INIT;
  row.resize_mode = CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_LARGE_SIZE_AND_PAD;
  row.height = 1;
  row.width = 9;
  row.pad_mode = CAFFE__RESIZE_PARAMETER__PAD_MODE__MIRRORED;
  image_of(&img, 1, 1, 3, (const uint8_t[]){1, 2, 3});
  boxes.n = 0;
  assert_int_equal(kiln_resize(&img, &boxes, &row, KILN_INTERP_LINEAR, fill, &w), KILN_OK);
  assert_bytes(img.data, (const uint8_t[]){2, 3, 2, 1, 2, 3, 2, 1, 2}, 9);
  row.pad_mode = CAFFE__RESIZE_PARAMETER__PAD_MODE__REPEAT_NEAREST;
  image_of(&img, 1, 1, 3, (const uint8_t[]){1, 2, 3});
  assert_int_equal(kiln_resize(&img, &boxes, &row, KILN_INTERP_LINEAR, fill, &w), KILN_OK);
  assert_bytes(img.data, (const uint8_t[]){1, 1, 1, 1, 2, 3, 3, 3, 3}, 9);
  /* constant padding takes each plane's value */
  row.pad_mode = CAFFE__RESIZE_PARAMETER__PAD_MODE__CONSTANT;
  image_of(&img, 3, 1, 3, (const uint8_t[]){1, 2, 3, 1, 2, 3, 1, 2, 3});
  assert_int_equal(kiln_resize(&img, &boxes, &row, KILN_INTERP_LINEAR, fill, &w), KILN_OK);
  for (int c = 0; c < 3; c++) {
    assert_int_equal(px(&img, c, 0, 0), fill[c]);
    assert_int_equal(px(&img, c, 0, 4), 2);
    assert_int_equal(px(&img, c, 0, 8), fill[c]);
  }

  /* FIT_SMALL_SIZE: 2 x 4 to cover 4 x 4 is 4 x 8; WARP is 4 x 4; boxes unchanged */
  r.resize_mode = CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_SMALL_SIZE;
  int oh, ow;
  kiln_resize_size(&r, 2, 4, &oh, &ow);
  assert_int_equal(oh, 4);
  assert_int_equal(ow, 8);
  kiln_resize_size(&r, 6, 2, &oh, &ow);
  assert_int_equal(oh, 12);
  assert_int_equal(ow, 4);
  image_of(&img, 1, 2, 4, wide);
  boxes.n = 0;
  add_box(&boxes, 1, 0.25f, 0.5f, 0.75f, 1);
  assert_int_equal(kiln_resize(&img, &boxes, &r, KILN_INTERP_NEAREST, fill, &w), KILN_OK);
  assert_int_equal(img.height, 4);
  assert_int_equal(img.width, 8);
  assert_int_equal(px(&img, 0, 3, 7), 8);
  assert_box(&boxes.v[0].box, 0.25f, 0.5f, 0.75f, 1);
  r.resize_mode = CAFFE__RESIZE_PARAMETER__RESIZE_MODE__WARP;
  image_of(&img, 1, 2, 4, wide);
  assert_int_equal(kiln_resize(&img, &boxes, &r, KILN_INTERP_CUBIC, fill, &w), KILN_OK);
  assert_int_equal(img.height, 4);
  assert_int_equal(img.width, 4);
  assert_box(&boxes.v[0].box, 0.25f, 0.5f, 0.75f, 1);

  /* the interpolation drawn: one of those listed, uniformly; none: LINEAR */
  kiln_rng rng;
  kiln_rng_seed(&rng, 4, 0);
  assert_int_equal(kiln_resize_draw(&r, &rng), KILN_INTERP_LINEAR);
  Caffe__ResizeParameter__InterpMode modes[5] = {1, 2, 3, 4, 5};
  r.interp_mode = modes;
  r.n_interp_mode = 5;
  int seen[6] = {0};
  for (int i = 0; i < 1000; i++) seen[kiln_resize_draw(&r, &rng)]++;
  for (int m = 1; m <= 5; m++) assert_in_range(seen[m], 150, 250);
  r.n_interp_mode = 1;
  r.interp_mode = &modes[4];
  assert_int_equal(kiln_resize_draw(&r, &rng), KILN_INTERP_LANCZOS4);

  /* mirror */
  image_of(&img, 2, 1, 3, (const uint8_t[]){1, 2, 3, 4, 5, 6});
  boxes.n = 0;
  add_box(&boxes, 1, 0.1f, 0.2f, 0.4f, 0.6f);
  kiln_mirror(&img, &boxes);
  assert_bytes(img.data, (const uint8_t[]){3, 2, 1, 6, 5, 4}, 6);
  assert_box(&boxes.v[0].box, 0.6f, 0.2f, 0.9f, 0.6f);
  kiln_anno_boxes_free(&boxes);
  kiln_anno_work_free(&w);
  kiln_image_free(&img);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interpolation_by_hand),
      cmocka_unit_test(test_interpolation_properties),
      cmocka_unit_test(test_resize_modes_and_boxes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
