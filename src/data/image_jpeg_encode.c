/* JPEG writing through libjpeg(-turbo): Caffe's C x H x W planes (B, G, R, or one gray plane) into
 * a JPEG file held in memory, as OpenCV's imencode writes one (libjpeg's defaults: baseline,
 * 4:2:0 chroma for colour, the integer DCT, the standard Huffman tables).
 *
 * libjpeg reports a failure (out of memory, a bad parameter) by calling an error function that
 * must not return; its default prints and ends the process, which library code must never do.
 * As the decoder in image.c, the encoder installs one that keeps the message and longjmps back
 * to the setjmp in the one function driving the library. The output goes through a destination
 * manager of kiln's own rather than jpeg_mem_dest: the library's keeps a buffer it grew only in
 * its memory pool on the way out of an error, where nothing frees it; ours lives in a struct
 * whose address the library holds, so it is found and freed after the jump. */
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "kiln/data.h"

typedef struct {
  struct jpeg_error_mgr mgr;       /* first: libjpeg hands back a pointer to it */
  struct jpeg_destination_mgr dest; /* libjpeg's view of `buf` */
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  uint8_t *buf; /* the file so far: the first `cap - dest.free_in_buffer` bytes */
  size_t cap;
  bool nomem;
} jpeg_sink;

static void sink_fail(j_common_ptr c) {
  jpeg_sink *s = (jpeg_sink *)c->err;
  c->err->format_message(c, s->msg);
  longjmp(s->jump, 1);
}

static void sink_quiet(j_common_ptr c) { (void)c; }

static jpeg_sink *sink_of(j_compress_ptr c) { return (jpeg_sink *)c->err; }

static void sink_init(j_compress_ptr c) {
  jpeg_sink *s = sink_of(c);
  s->dest.next_output_byte = s->buf;
  s->dest.free_in_buffer = s->cap;
}

/* The buffer is full: twice the room, the bytes kept. */
static boolean sink_grow(j_compress_ptr c) {
  jpeg_sink *s = sink_of(c);
  size_t used = s->cap, cap = 2 * s->cap;
  uint8_t *p = realloc(s->buf, cap);
  if (!p) {
    s->nomem = true;
    snprintf(s->msg, sizeof s->msg, "out of memory for %zu bytes", cap);
    longjmp(s->jump, 1);
  }
  s->buf = p;
  s->cap = cap;
  s->dest.next_output_byte = p + used;
  s->dest.free_in_buffer = cap - used;
  return TRUE;
}

static void sink_term(j_compress_ptr c) { (void)c; }

int kiln_image_encode_jpeg(const uint8_t *chw, int channels, int height, int width, int quality,
                           uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  if (channels != 1 && channels != 3)
    return kiln_errorf(KILN_ERR_INVALID, "JPEG of %d channels: 1 or 3", channels);
  if (quality < 1 || quality > 100)
    return kiln_errorf(KILN_ERR_INVALID, "JPEG quality %d: 1 to 100", quality);
  if (height <= 0 || width <= 0 || height > KILN_IMAGE_MAX_SIDE || width > KILN_IMAGE_MAX_SIDE ||
      (uint64_t)height * (uint64_t)width > KILN_IMAGE_MAX_PIXELS)
    return kiln_errorf(KILN_ERR_INVALID,
                       "JPEG of %d x %d pixels; kiln takes 1 to %d a side and %llu pixels in all",
                       width, height, KILN_IMAGE_MAX_SIDE,
                       (unsigned long long)KILN_IMAGE_MAX_PIXELS);
  const size_t plane = (size_t)height * width, row = (size_t)width * channels;
  uint8_t *rows = malloc(plane * channels);
  /* a start that holds most small images whole; grown by doubling */
  jpeg_sink s = {.cap = plane * channels / 4 + 1024};
  s.buf = malloc(s.cap);
  if (!rows || !s.buf) {
    free(rows);
    free(s.buf);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a JPEG");
  }
  /* planes to interleaved rows, B G R as they are: libjpeg-turbo takes BGR pixels (JCS_EXT_BGR) */
  for (int c = 0; c < channels; c++)
    for (size_t i = 0; i < plane; i++) rows[i * channels + c] = chw[(size_t)c * plane + i];
  struct jpeg_compress_struct j;
  j.err = jpeg_std_error(&s.mgr);
  s.mgr.error_exit = sink_fail;
  s.mgr.output_message = sink_quiet;
  s.dest.init_destination = sink_init;
  s.dest.empty_output_buffer = sink_grow;
  s.dest.term_destination = sink_term;
  if (setjmp(s.jump)) {
    jpeg_destroy_compress(&j);
    free(rows);
    free(s.buf);
    return kiln_errorf(s.nomem ? KILN_ERR_NOMEM : KILN_ERR_INTERNAL, "cannot write a JPEG: %s",
                       s.msg);
  }
  jpeg_create_compress(&j);
  j.dest = &s.dest;
  j.image_width = (JDIMENSION)width;
  j.image_height = (JDIMENSION)height;
  j.input_components = channels;
  j.in_color_space = channels == 3 ? JCS_EXT_BGR : JCS_GRAYSCALE;
  jpeg_set_defaults(&j);
  jpeg_set_quality(&j, quality, TRUE);
  jpeg_start_compress(&j, TRUE);
  while (j.next_scanline < j.image_height) {
    JSAMPROW r = rows + (size_t)j.next_scanline * row;
    jpeg_write_scanlines(&j, &r, 1);
  }
  jpeg_finish_compress(&j);
  *len = s.cap - s.dest.free_in_buffer;
  jpeg_destroy_compress(&j);
  free(rows);
  *out = s.buf;
  return KILN_OK;
}
