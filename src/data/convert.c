/* `kiln convert` for MNIST-style data and image lists: an images IDX and a labels IDX, or the
 * PNG and JPEG files of a list, become an LMDB of Datum records with the keys and layout of
 * Caffe's convert_mnist_data and convert_imageset, so Caffe's Data layer and kiln's read the
 * result alike; or the IDX pair an HDF5 data file of the same records, for HDF5Data. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "data/internal.h"
#include "kiln/data.h"
#include "kiln/proto.h"

/* The images and labels IDX files, checked as a set of records: N x H x W images and N labels,
 * N > 0. *out_path must not exist (checked before reading the inputs, which may take a while;
 * the writers check again). */
static int read_idx_pair(const char *images_path, const char *labels_path, const char *out_path,
                         kiln_idx *images, kiln_idx *labels) {
  struct stat st;
  if (stat(out_path, &st) == 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: already exists; remove it or choose another output path", out_path);
  KILN_TRY(kiln_idx_read(images_path, images));
  int rc = kiln_idx_read(labels_path, labels);
  if (rc) {
    kiln_idx_free(images);
    return rc;
  }
  if (images->ndims != 3 && images->ndims != 4) {
    rc = kiln_errorf(KILN_ERR_DATA,
                     "%s: an images IDX needs 3 dimensions (N x H x W) or 4 (N x C x H x W), "
                     "found %d",
                     images_path, images->ndims);
  } else if (labels->ndims != 1) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s: a labels IDX needs 1 dimension (N), found %d", labels_path,
                     labels->ndims);
  } else if (labels->dims[0] != images->dims[0]) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s holds %u images but %s holds %u labels", images_path,
                     (unsigned)images->dims[0], labels_path, (unsigned)labels->dims[0]);
  } else if (images->dims[0] == 0) { /* a data set of no records is one the data layers refuse */
    rc = kiln_errorf(KILN_ERR_DATA, "%s: holds no images (its first dimension is 0)", images_path);
  } else if (images->dims[1] == 0 || images->dims[2] == 0 ||
             (images->ndims == 4 && images->dims[3] == 0)) {
    rc = images->ndims == 3
             ? kiln_errorf(KILN_ERR_DATA, "%s: images of %ux%u pixels", images_path,
                           (unsigned)images->dims[1], (unsigned)images->dims[2])
             : kiln_errorf(KILN_ERR_DATA, "%s: images of %u channels of %ux%u pixels",
                           images_path, (unsigned)images->dims[1], (unsigned)images->dims[2],
                           (unsigned)images->dims[3]);
  }
  if (rc) {
    kiln_idx_free(images);
    kiln_idx_free(labels);
  }
  return rc;
}

int kiln_convert_idx_to_lmdb(const char *images_path, const char *labels_path, const char *out_path,
                             uint64_t *n_written) {
  return kiln_convert_idx_to_db(images_path, labels_path, out_path, KILN_DB_LMDB, n_written);
}

int kiln_convert_idx_to_db(const char *images_path, const char *labels_path, const char *out_path,
                           kiln_db_backend backend, uint64_t *n_written) {
  if (n_written) *n_written = 0;
  kiln_idx images, labels;
  KILN_TRY(read_idx_pair(images_path, labels_path, out_path, &images, &labels));
  const bool planes = images.ndims == 4; /* N x C x H x W; else N x H x W, one channel */
  uint32_t n = images.dims[0], channels = planes ? images.dims[1] : 1;
  uint32_t height = images.dims[planes ? 2 : 1], width = images.dims[planes ? 3 : 2];
  int rc = kiln_data_write_images(out_path, backend, images_path, n, 8, (int)channels,
                                  (int)height, (int)width, images.data, labels.data);
  if (rc == KILN_OK && n_written) *n_written = n;
  kiln_idx_free(&images);
  kiln_idx_free(&labels);
  return rc;
}

int kiln_convert_idx_to_h5(const char *images_path, const char *labels_path, const char *out_path,
                           uint64_t *n_written) {
  if (n_written) *n_written = 0;
  kiln_idx images, labels;
  KILN_TRY(read_idx_pair(images_path, labels_path, out_path, &images, &labels));
  const uint32_t n = images.dims[0];
  float *pixels = malloc(sizeof(float) * images.count);
  float *label = malloc(sizeof(float) * n);
  int rc =
      pixels && label ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", images_path);
  if (!rc) {
    /* the values the Data layer makes of the same records' bytes (before its transform) */
    for (size_t i = 0; i < images.count; i++) pixels[i] = (float)images.data[i];
    for (uint32_t i = 0; i < n; i++) label[i] = (float)labels.data[i];
    const char *const names[2] = {"data", "label"};
    const bool planes = images.ndims == 4;
    const kiln_h5data_shape shapes[2] = {
        {.naxes = 4,
         .dims = {n, planes ? images.dims[1] : 1, images.dims[planes ? 2 : 1],
                  images.dims[planes ? 3 : 2]}},
        {.naxes = 1, .dims = {n}}};
    const float *const data[2] = {pixels, label};
    rc = kiln_h5data_write(out_path, 2, names, shapes, data);
  }
  if (rc == KILN_OK && n_written) *n_written = n;
  free(pixels);
  free(label);
  kiln_idx_free(&images);
  kiln_idx_free(&labels);
  return rc;
}

int kiln_compute_mean(const char *db_path, const char *out_path, uint64_t *n_records) {
  /* before the records are read: never the database (nor one of its files), nor a device */
  KILN_TRY(kiln_check_output(out_path, KILN_OUTPUT_RENAMED, &db_path, 1));
  kiln_datum_db *db;
  KILN_TRY(kiln_datum_db_open(db_path, &db));
  const uint64_t n = kiln_datum_db_size(db);
  double *sum = NULL;
  int C = 0, H = 0, W = 0, rc = KILN_OK;
  size_t per = 0;
  for (uint64_t r = 0; r < n && !rc; r++) {
    kiln_datum d;
    rc = kiln_datum_db_next(db, &d);
    if (rc) break;
    if (r == 0) {
      C = d.channels, H = d.height, W = d.width;
      per = (size_t)C * H * W;
      sum = calloc(per ? per : 1, sizeof *sum);
      if (!sum) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for a %dx%dx%d mean", db_path,
                                 C, H, W);
    } /* the reader refuses a record of another shape than the earlier ones' */
    for (size_t i = 0; !rc && i < per; i++) sum[i] += d.u8 ? (double)d.u8[i] : (double)d.f32[i];
  }
  kiln_datum_db_close(db);
  Caffe__BlobProto bp = CAFFE__BLOB_PROTO__INIT;
  float *mean = NULL;
  if (!rc) {
    mean = malloc(per * sizeof *mean);
    if (!mean) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  if (!rc) {
    for (size_t i = 0; i < per; i++) mean[i] = (float)(sum[i] / (double)n);
    /* the legacy 4-D header, as Caffe's compute_image_mean writes it */
    bp.has_num = bp.has_channels = bp.has_height = bp.has_width = 1;
    bp.num = 1, bp.channels = C, bp.height = H, bp.width = W;
    bp.n_data = per;
    bp.data = mean;
    rc = kiln_proto_write_binary(out_path, &bp.base);
  }
  free(mean);
  free(sum);
  if (!rc && n_records) *n_records = n;
  return rc;
}

/* ---- images: Caffe's convert_imageset ------------------------------------------------------ */

/* One image of the list as a record: raw (the decoded bytes) or encoded (the file's bytes when
 * they decode to what was asked as they are, else the decoded image as PNG). */
static int put_image(kiln_datum_writer *w, const char *key, const char *file, int label,
                     const kiln_convert_images_opts *o, kiln_image *img) {
  char *bytes = NULL;
  size_t n = 0;
  KILN_TRY(kiln_read_file_max(file, (size_t)1 << 30, &bytes, &n));
  const kiln_image_color color = o->gray ? KILN_IMAGE_GRAY : KILN_IMAGE_COLOR;
  int rc;
  if (o->encoded && !o->new_height) {
    /* Caffe's Data layer decodes encoded records with the file's own channels: the file goes
     * in as it is only when those are the ones asked for */
    rc = kiln_image_decode(bytes, n, KILN_IMAGE_AS_IS, 0, 0, file, img);
    if (!rc && img->channels == (o->gray ? 1 : 3)) {
      rc = kiln_datum_writer_put_encoded(w, key, bytes, n, label);
      free(bytes);
      return rc;
    }
  }
  rc = kiln_image_decode(bytes, n, color, o->new_height, o->new_width, file, img);
  free(bytes);
  if (rc) return rc;
  if (!o->encoded) {
    kiln_datum d = {.channels = img->channels, .height = img->height, .width = img->width,
                    .label = label, .u8 = img->data};
    return kiln_datum_writer_put(w, key, &d);
  }
  uint8_t *png = NULL;
  size_t len = 0;
  KILN_TRY(kiln_image_encode_png(img->data, img->channels, img->height, img->width, &png, &len));
  rc = kiln_datum_writer_put_encoded(w, key, png, len, label);
  free(png);
  return rc;
}

int kiln_convert_images_to_lmdb(const char *list_path, const char *root, const char *out_path,
                                const kiln_convert_images_opts *opts, uint64_t *n_written) {
  if (n_written) *n_written = 0;
  const kiln_convert_images_opts o = *opts;
  if ((o.new_height > 0) != (o.new_width > 0) || o.new_height < 0 || o.new_width < 0)
    return kiln_errorf(KILN_ERR_INVALID, "resize to %d x %d: give both height and width (> 0)",
                       o.new_height, o.new_width);
  struct stat st;
  if (stat(out_path, &st) == 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: already exists; remove it or choose another output path", out_path);
  kiln_image_list list;
  KILN_TRY(kiln_image_list_read(list_path, &list));
  size_t *order = malloc(list.n * sizeof *order);
  if (!order) {
    kiln_image_list_free(&list);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", list_path);
  }
  for (size_t i = 0; i < list.n; i++) order[i] = i;
  if (o.shuffle) { /* Fisher-Yates from the seed, as convert_imageset --shuffle */
    kiln_rng r;
    kiln_rng_seed(&r, o.seed, 0x434f4e56ULL);
    for (size_t i = list.n - 1; i > 0; i--) {
      size_t j = i < UINT32_MAX ? kiln_rng_below(&r, (uint32_t)(i + 1)) : i, t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
  }
  kiln_datum_writer *w = NULL;
  kiln_image img = {0};
  kiln_strbuf file = {0}, key = {0};
  int rc = kiln_datum_writer_open(out_path, &w);
  for (size_t i = 0; !rc && i < list.n; i++) {
    const size_t k = order[i];
    file.len = key.len = 0;
    kiln_strbuf_printf(&file, "%s%s", root, list.path[k]); /* Caffe joins them as they are */
    kiln_strbuf_printf(&key, "%08zu_%s", i, list.path[k]);
    if (file.failed || key.failed) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", list_path);
      break;
    }
    rc = put_image(w, key.s, file.s, list.label[k], &o, &img);
    if (rc) rc = kiln_error_context(rc, "%s:%d: ", list_path, list.line[k]);
  }
  if (w) {
    if (rc) kiln_datum_writer_abort(w);
    else rc = kiln_datum_writer_commit(w); /* frees it either way */
  }
  if (!rc && n_written) *n_written = list.n;
  free(file.s);
  free(key.s);
  kiln_image_free(&img);
  free(order);
  kiln_image_list_free(&list);
  return rc;
}
