/* PNG and JPEG images through libpng and libjpeg(-turbo): decoded into Caffe's C x H x W planes
 * in BGR order (what OpenCV hands Caffe), optionally resized (bilinear), and PNG written for
 * `kiln convert images --encoded`.
 *
 * Both libraries report a damaged file by calling an error function that must not return; their
 * defaults print and end the whole process, which library code must never do. Each decoder
 * installs its own that keeps the message and longjmps back to the setjmp in the one function
 * that drives the library: everything that function allocates lives in the kiln_image (or is
 * freed by the library's destroy call), so nothing leaks on the way out, and no local variable
 * changed after setjmp is read after the jump. */
#include <math.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE and size_t */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "kiln/data.h"

/* Scans of a progressive JPEG beyond this are refused: real files have about ten, and a damaged
 * one can declare thousands of tiny scans that take minutes to decode. */
#define JPEG_MAX_SCANS 500
/* What libjpeg may allocate for one image (a progressive image keeps all its coefficients). */
#define JPEG_MAX_MEMORY ((long)1 << 30)
/* deflate expands at most 1032:1; a PNG whose pixels need more than this many times its size in
 * bytes cannot hold them and is refused before the rows are allocated. */
#define PNG_MAX_RATIO 1100

static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

const char *kiln_image_format(const void *bytes, size_t n) {
  const uint8_t *b = bytes;
  if (n >= 8 && !memcmp(b, png_magic, 8)) return "png";
  if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return "jpeg";
  return NULL;
}

void kiln_image_free(kiln_image *img) {
  if (!img) return;
  free(img->data);
  free(img->work);
  free(img->plane);
  memset(img, 0, sizeof *img);
}

static bool grow(uint8_t **buf, size_t *cap, size_t need) {
  if (*cap >= need) return true;
  uint8_t *p = realloc(*buf, need);
  if (!p) return false;
  *buf = p;
  *cap = need;
  return true;
}

/* Sizes the decoder may work with: 1 .. KILN_IMAGE_MAX_SIDE a side, KILN_IMAGE_MAX_PIXELS in
 * all. */
static int check_size(const char *what, const char *whose, uint64_t h, uint64_t w) {
  if (h == 0 || w == 0 || h > KILN_IMAGE_MAX_SIDE || w > KILN_IMAGE_MAX_SIDE ||
      h * w > KILN_IMAGE_MAX_PIXELS)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: %s of %llu x %llu pixels; kiln takes 1 to %d a side and %llu pixels "
                       "in all",
                       what, whose, (unsigned long long)w, (unsigned long long)h,
                       KILN_IMAGE_MAX_SIDE, (unsigned long long)KILN_IMAGE_MAX_PIXELS);
  return KILN_OK;
}

/* ---- JPEG ---------------------------------------------------------------------------------- */

typedef struct {
  struct jpeg_error_mgr mgr; /* first: libjpeg hands back a pointer to it */
  jmp_buf jump;
  int code; /* -1: the library's failure (msg); else kiln's own, with its message set */
  char msg[JMSG_LENGTH_MAX];
} jpeg_failure;

static void jpeg_fail_exit(j_common_ptr c) {
  jpeg_failure *f = (jpeg_failure *)c->err;
  c->err->format_message(c, f->msg);
  longjmp(f->jump, 1);
}

/* Trace messages (level >= 0) are dropped. Warnings (-1) mean damaged data that libjpeg works
 * around; most leave a usable image, but a file that ends early is padded with gray, so that
 * one is an error: a truncated file must not train as a gray smear. */
static void jpeg_message(j_common_ptr c, int level) {
  if (level >= 0) return;
  c->err->num_warnings++;
  if (c->err->msg_code == JWRN_JPEG_EOF) {
    jpeg_failure *f = (jpeg_failure *)c->err;
    snprintf(f->msg, sizeof f->msg, "the file ends before the image does (truncated)");
    longjmp(f->jump, 1);
  }
}

static void jpeg_silent(j_common_ptr c) { (void)c; }

static void jpeg_scan_limit(j_common_ptr c) {
  j_decompress_ptr d = (j_decompress_ptr)c;
  if (c->is_decompressor && d->input_scan_number > JPEG_MAX_SCANS) {
    jpeg_failure *f = (jpeg_failure *)c->err;
    snprintf(f->msg, sizeof f->msg, "more than %d scans", JPEG_MAX_SCANS);
    longjmp(f->jump, 1);
  }
}

/* Decodes into img->work as H rows of W x C interleaved bytes (C 1 or 3, BGR). */
static int decode_jpeg(const uint8_t *bytes, size_t n, kiln_image_color color, const char *what,
                       kiln_image *img) {
  struct jpeg_decompress_struct d;
  jpeg_failure fail = {.code = -1};
  struct jpeg_progress_mgr progress = {.progress_monitor = jpeg_scan_limit};
  d.err = jpeg_std_error(&fail.mgr);
  fail.mgr.error_exit = jpeg_fail_exit;
  fail.mgr.emit_message = jpeg_message;
  fail.mgr.output_message = jpeg_silent;
  if (setjmp(fail.jump)) {
    jpeg_destroy_decompress(&d);
    if (fail.code >= 0) return fail.code;
    return kiln_errorf(KILN_ERR_DATA, "%s: damaged JPEG image: %s", what, fail.msg);
  }
  jpeg_create_decompress(&d);
  d.progress = &progress;
  d.mem->max_memory_to_use = JPEG_MAX_MEMORY;
  jpeg_mem_src(&d, bytes, (unsigned long)n);
  jpeg_read_header(&d, TRUE);
  if (d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK) {
    fail.code = kiln_errorf(KILN_ERR_UNSUPPORTED,
                            "%s: a CMYK JPEG image; kiln decodes gray, YCbCr and RGB ones only "
                            "(convert it to RGB)",
                            what);
    longjmp(fail.jump, 1);
  }
  if (check_size(what, "a JPEG image", d.image_height, d.image_width)) {
    fail.code = KILN_ERR_INVALID; /* the message is set */
    longjmp(fail.jump, 1);
  }
  const bool gray =
      color == KILN_IMAGE_GRAY || (color == KILN_IMAGE_AS_IS && d.num_components == 1);
  d.out_color_space = gray ? JCS_GRAYSCALE : JCS_EXT_BGR;
  jpeg_start_decompress(&d);
  const size_t c = gray ? 1 : 3, row = (size_t)d.output_width * c;
  if (d.output_components != (int)c || !grow(&img->work, &img->work_cap, row * d.output_height)) {
    fail.code = d.output_components != (int)c
                    ? kiln_errorf(KILN_ERR_INTERNAL, "%s: libjpeg gave %d components, not %zu",
                                  what, d.output_components, c)
                    : kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the image", what);
    longjmp(fail.jump, 1);
  }
  while (d.output_scanline < d.output_height) {
    JSAMPROW r = img->work + (size_t)d.output_scanline * row;
    jpeg_read_scanlines(&d, &r, 1);
  }
  img->channels = (int)c;
  img->height = (int)d.output_height;
  img->width = (int)d.output_width;
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  return KILN_OK;
}

/* ---- PNG ----------------------------------------------------------------------------------- */

typedef struct {
  jmp_buf jump;
  const uint8_t *bytes;
  size_t n, off;
  int code; /* -1: the library's failure (msg); else kiln's own, with its message set */
  char msg[256];
} png_job;

static void png_fail(png_structp png, png_const_charp msg) {
  png_job *j = png_get_error_ptr(png);
  snprintf(j->msg, sizeof j->msg, "%s", msg);
  longjmp(j->jump, 1);
}

static void png_quiet(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

static void png_read_mem(png_structp png, png_bytep out, size_t len) {
  png_job *j = png_get_io_ptr(png);
  if (len > j->n - j->off) png_error(png, "the file ends before the image does (truncated)");
  memcpy(out, j->bytes + j->off, len);
  j->off += len;
}

static int decode_png(const uint8_t *bytes, size_t n, kiln_image_color color, const char *what,
                      kiln_image *img) {
  png_job job = {.bytes = bytes, .n = n, .code = -1};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_fail, png_quiet);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_read_struct(&png, NULL, NULL);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the PNG decoder", what);
  }
  if (setjmp(job.jump)) {
    png_destroy_read_struct(&png, &info, NULL);
    if (job.code >= 0) return job.code;
    return kiln_errorf(KILN_ERR_DATA, "%s: damaged PNG image: %s", what, job.msg);
  }
  png_set_read_fn(png, &job, png_read_mem);
  png_set_user_limits(png, KILN_IMAGE_MAX_SIDE, KILN_IMAGE_MAX_SIDE);
  png_read_info(png, info);
  png_uint_32 w, h;
  int depth, type, interlace;
  png_get_IHDR(png, info, &w, &h, &depth, &type, &interlace, NULL, NULL);
  if (check_size(what, "a PNG image", h, w)) {
    job.code = KILN_ERR_INVALID; /* the message is set */
    longjmp(job.jump, 1);
  }
  const uint64_t raw = (uint64_t)h * png_get_rowbytes(png, info);
  if (raw / PNG_MAX_RATIO > n) {
    job.code = kiln_errorf(KILN_ERR_DATA,
                           "%s: damaged PNG image: %u x %u pixels cannot fit in a file of %zu "
                           "bytes (truncated?)",
                           what, (unsigned)w, (unsigned)h, n);
    longjmp(job.jump, 1);
  }
  const bool has_color = (type & PNG_COLOR_MASK_COLOR) != 0; /* palette images too */
  const bool gray = color == KILN_IMAGE_GRAY || (color == KILN_IMAGE_AS_IS && !has_color);
  if (depth == 16) png_set_strip_16(png);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (gray && has_color) png_set_rgb_to_gray_fixed(png, 1, 29900, 58700);
  if (!gray && !has_color) png_set_gray_to_rgb(png);
  if (!gray) png_set_bgr(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t c = gray ? 1 : 3, row = (size_t)w * c;
  if (png_get_rowbytes(png, info) != row || png_get_channels(png, info) != c) {
    job.code = kiln_errorf(KILN_ERR_INTERNAL, "%s: libpng gave rows of %zu bytes, not %zu", what,
                           (size_t)png_get_rowbytes(png, info), row);
    longjmp(job.jump, 1);
  }
  /* the rows, then their pointers, in one block of the image's work buffer */
  const size_t pixels = row * h, ptrs = sizeof(png_bytep) * h;
  const size_t at = (pixels + 15) / 16 * 16;
  if (!grow(&img->work, &img->work_cap, at + ptrs)) {
    job.code = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the image", what);
    longjmp(job.jump, 1);
  }
  png_bytep *rows = (png_bytep *)(void *)(img->work + at);
  for (png_uint_32 y = 0; y < h; y++) rows[y] = img->work + (size_t)y * row;
  png_read_image(png, rows);
  png_read_end(png, NULL); /* the chunks after the pixels, to IEND: a file cut short fails */
  img->channels = (int)c;
  img->height = (int)h;
  img->width = (int)w;
  png_destroy_read_struct(&png, &info, NULL);
  return KILN_OK;
}

/* ---- planes and resizing ------------------------------------------------------------------ */

/* One axis of OpenCV's INTER_LINEAR: destination pixel i takes source pixels lo[i] and lo[i] + 1
 * (held to the last) with weights 1 - f[i] and f[i], pixel centres aligned: x = (i + 0.5) *
 * src / dst - 0.5, clamped to the image. */
static void resize_axis(int src, int dst, int *lo, int *hi, float *f) {
  const double scale = (double)src / dst;
  for (int i = 0; i < dst; i++) {
    double x = (i + 0.5) * scale - 0.5;
    int x0 = (int)floor(x);
    double fx = x - x0;
    if (x0 < 0) x0 = 0, fx = 0;
    if (x0 >= src - 1) x0 = src - 1, fx = 0;
    lo[i] = x0;
    hi[i] = x0 + 1 < src ? x0 + 1 : src - 1;
    f[i] = (float)fx;
  }
}

int kiln_image_resize(const uint8_t *src, int channels, int sh, int sw, uint8_t *dst, int dh,
                      int dw) {
  const size_t m = (size_t)(dh > dw ? dh : dw);
  int *ylo = malloc(m * (4 * sizeof(int) + 2 * sizeof(float)));
  if (!ylo) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for resizing an image");
  int *yhi = ylo + m, *xlo = yhi + m, *xhi = xlo + m;
  float *fy = (float *)(void *)(xhi + m), *fx = fy + m;
  resize_axis(sh, dh, ylo, yhi, fy);
  resize_axis(sw, dw, xlo, xhi, fx);
  for (int c = 0; c < channels; c++) {
    const uint8_t *p = src + (size_t)c * sh * sw;
    uint8_t *q = dst + (size_t)c * dh * dw;
    for (int y = 0; y < dh; y++) {
      const uint8_t *r0 = p + (size_t)ylo[y] * sw, *r1 = p + (size_t)yhi[y] * sw;
      const float wy = fy[y];
      for (int x = 0; x < dw; x++) {
        const float wx = fx[x];
        const float top = (1 - wx) * r0[xlo[x]] + wx * r0[xhi[x]];
        const float bottom = (1 - wx) * r1[xlo[x]] + wx * r1[xhi[x]];
        const float v = (1 - wy) * top + wy * bottom;
        q[(size_t)y * dw + x] = (uint8_t)(v <= 0 ? 0 : v >= 255 ? 255 : (int)(v + 0.5f));
      }
    }
  }
  free(ylo);
  return KILN_OK;
}

int kiln_image_decode(const void *bytes, size_t n, kiln_image_color color, int new_height,
                      int new_width, const char *what, kiln_image *img) {
  if ((new_height > 0) != (new_width > 0) || new_height < 0 || new_width < 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: resize to %d x %d: give both height and width (> 0), or neither",
                       what, new_height, new_width);
  if (new_height > 0) KILN_TRY(check_size(what, "a resize", (uint64_t)new_height, (uint64_t)new_width));
  const char *format = kiln_image_format(bytes, n);
  if (!format)
    return kiln_errorf(KILN_ERR_DATA, "%s: not a PNG or JPEG image (%zu bytes%s)", what, n,
                       n ? ", unknown signature" : ": empty");
  KILN_TRY(format[0] == 'p' ? decode_png(bytes, n, color, what, img)
                            : decode_jpeg(bytes, n, color, what, img));
  /* interleaved rows to planes */
  const int c = img->channels, h = img->height, w = img->width;
  const size_t plane = (size_t)h * w;
  const bool resize = new_height > 0 && (new_height != h || new_width != w);
  uint8_t **to = resize ? &img->plane : &img->data;
  size_t *cap = resize ? &img->plane_cap : &img->cap;
  if (!grow(to, cap, plane * (size_t)c))
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the image", what);
  for (int k = 0; k < c; k++)
    for (size_t i = 0; i < plane; i++) (*to)[(size_t)k * plane + i] = img->work[i * (size_t)c + k];
  if (resize) {
    if (!grow(&img->data, &img->cap, (size_t)c * (size_t)new_height * (size_t)new_width))
      return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the resized image", what);
    KILN_TRY(kiln_image_resize(img->plane, c, h, w, img->data, new_height, new_width));
    img->height = new_height;
    img->width = new_width;
  }
  return KILN_OK;
}

/* Image files larger than this are refused before they are read. */
#define IMAGE_FILE_MAX ((size_t)1 << 30)

int kiln_image_read(const char *path, kiln_image_color color, int new_height, int new_width,
                    kiln_image *img) {
  char *bytes = NULL;
  size_t n = 0;
  KILN_TRY(kiln_read_file_max(path, IMAGE_FILE_MAX, &bytes, &n));
  int rc = kiln_image_decode(bytes, n, color, new_height, new_width, path, img);
  free(bytes);
  return rc;
}

/* ---- PNG out ------------------------------------------------------------------------------- */

typedef struct {
  jmp_buf jump;
  uint8_t *buf;
  size_t len, cap;
  char msg[256];
} png_out;

static void png_write_mem(png_structp png, png_bytep data, size_t len) {
  png_out *o = png_get_io_ptr(png);
  if (o->len + len > o->cap) {
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + len) cap *= 2;
    uint8_t *p = realloc(o->buf, cap);
    if (!p) png_error(png, "out of memory");
    o->buf = p;
    o->cap = cap;
  }
  memcpy(o->buf + o->len, data, len);
  o->len += len;
}

static void png_flush_mem(png_structp png) { (void)png; }

static void png_out_fail(png_structp png, png_const_charp msg) {
  png_out *o = png_get_error_ptr(png);
  snprintf(o->msg, sizeof o->msg, "%s", msg);
  longjmp(o->jump, 1);
}

int kiln_image_encode_png(const uint8_t *chw, int channels, int height, int width, uint8_t **out,
                          size_t *len) {
  *out = NULL;
  *len = 0;
  if (channels != 1 && channels != 3)
    return kiln_errorf(KILN_ERR_INVALID, "PNG of %d channels: 1 or 3", channels);
  KILN_TRY(check_size("PNG out", "an image", (uint64_t)height, (uint64_t)width));
  const size_t row = (size_t)width * channels, plane = (size_t)height * width;
  uint8_t *rows = malloc(row * height);
  if (!rows) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a PNG");
  for (int c = 0; c < channels; c++) /* planes (B, G, R) to RGB rows */
    for (size_t i = 0; i < plane; i++)
      rows[i * channels + (channels == 3 ? 2 - c : 0)] = chw[(size_t)c * plane + i];
  png_out o = {0};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &o, png_out_fail, png_quiet);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_write_struct(&png, NULL);
    free(rows);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the PNG encoder");
  }
  if (setjmp(o.jump)) {
    png_destroy_write_struct(&png, &info);
    free(rows);
    free(o.buf);
    return kiln_errorf(KILN_ERR_NOMEM, "cannot write a PNG: %s", o.msg);
  }
  png_set_write_fn(png, &o, png_write_mem, png_flush_mem);
  png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8,
               channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < height; y++) png_write_row(png, rows + (size_t)y * row);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  free(rows);
  *out = o.buf;
  *len = o.len;
  return KILN_OK;
}
