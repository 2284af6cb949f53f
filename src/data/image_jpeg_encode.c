/* JPEG out through libjpeg(-turbo): C x H x W planes (B, G, R, or one gray plane) into a
 * baseline JPEG in memory, as OpenCV's imencode(".jpg") writes one for Caffe (libjpeg's
 * defaults at the quality asked: 4:2:0 chroma for colour). Errors longjmp back from libjpeg's
 * error handler, which must not return; the buffer libjpeg grows (jpeg_mem_dest) is freed on
 * the way out. */
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "kiln/data.h"

typedef struct {
  struct jpeg_error_mgr mgr; /* first: libjpeg hands back a pointer to it */
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  unsigned char *buf; /* jpeg_mem_dest's buffer */
  unsigned long len;
  uint8_t *rows;
} jpeg_out;

static void jpeg_out_fail(j_common_ptr c) {
  jpeg_out *o = (jpeg_out *)c->err;
  c->err->format_message(c, o->msg);
  longjmp(o->jump, 1);
}

static void jpeg_out_quiet(j_common_ptr c) { (void)c; }

int kiln_image_encode_jpeg(const uint8_t *chw, int channels, int height, int width, int quality,
                           uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (channels != 1 && channels != 3)
    return kiln_errorf(KILN_ERR_INVALID, "JPEG of %d channels: 1 or 3", channels);
  if (quality < 1 || quality > 100)
    return kiln_errorf(KILN_ERR_INVALID, "JPEG quality %d: 1 to 100", quality);
  if (height < 1 || width < 1 || height > KILN_IMAGE_MAX_SIDE || width > KILN_IMAGE_MAX_SIDE ||
      (uint64_t)height * (uint64_t)width > KILN_IMAGE_MAX_PIXELS)
    return kiln_errorf(KILN_ERR_INVALID,
                       "JPEG out: an image of %d x %d pixels; kiln takes 1 to %d a side and %llu "
                       "pixels in all",
                       width, height, KILN_IMAGE_MAX_SIDE,
                       (unsigned long long)KILN_IMAGE_MAX_PIXELS);
  const size_t row = (size_t)width * channels, plane = (size_t)height * width;
  struct jpeg_compress_struct c;
  jpeg_out o = {.buf = NULL};
  o.rows = malloc(row * height);
  if (!o.rows) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a JPEG");
  for (int k = 0; k < channels; k++) /* planes to interleaved B, G, R rows */
    for (size_t i = 0; i < plane; i++) o.rows[i * channels + k] = chw[(size_t)k * plane + i];
  c.err = jpeg_std_error(&o.mgr);
  o.mgr.error_exit = jpeg_out_fail;
  o.mgr.output_message = jpeg_out_quiet;
  if (setjmp(o.jump)) {
    jpeg_destroy_compress(&c);
    free(o.buf);
    free(o.rows);
    return kiln_errorf(KILN_ERR_NOMEM, "cannot write a JPEG: %s", o.msg);
  }
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, &o.buf, &o.len);
  c.image_width = (JDIMENSION)width;
  c.image_height = (JDIMENSION)height;
  c.input_components = channels;
  c.in_color_space = channels == 3 ? JCS_EXT_BGR : JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = o.rows + (size_t)c.next_scanline * row;
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  free(o.rows);
  *out = o.buf;
  *len = o.len;
  return KILN_OK;
}
