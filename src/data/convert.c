/* `kiln convert` for MNIST-style data: an images IDX and a labels IDX become an LMDB of Datum
 * records with the keys and layout of Caffe's convert_mnist_data, so Caffe's Data layer and
 * kiln's read the result alike. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "data/internal.h"
#include "kiln/data.h"
#include "kiln/proto.h"

int kiln_convert_idx_to_lmdb(const char *images_path, const char *labels_path, const char *out_path,
                             uint64_t *n_written) {
  if (n_written) *n_written = 0;
  struct stat st;
  /* Checked before reading the inputs, which may take a while; the writer checks again. */
  if (stat(out_path, &st) == 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: already exists; remove it or choose another output path", out_path);

  kiln_idx images, labels;
  KILN_TRY(kiln_idx_read(images_path, &images));
  int rc = kiln_idx_read(labels_path, &labels);
  if (rc) {
    kiln_idx_free(&images);
    return rc;
  }
  if (images.ndims != 3) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s: an images IDX needs 3 dimensions (N x H x W), found %d",
                     images_path, images.ndims);
    goto done;
  }
  if (labels.ndims != 1) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s: a labels IDX needs 1 dimension (N), found %d", labels_path,
                     labels.ndims);
    goto done;
  }
  uint32_t n = images.dims[0], height = images.dims[1], width = images.dims[2];
  if (labels.dims[0] != n) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s holds %u images but %s holds %u labels", images_path,
                     (unsigned)n, labels_path, (unsigned)labels.dims[0]);
    goto done;
  }
  if (n == 0) { /* an LMDB of no records is one the Data layer refuses */
    rc = kiln_errorf(KILN_ERR_DATA, "%s: holds no images (its first dimension is 0)", images_path);
    goto done;
  }
  if (height == 0 || width == 0) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s: images of %ux%u pixels", images_path, (unsigned)height,
                     (unsigned)width);
    goto done;
  }
  rc = kiln_data_write_images(out_path, images_path, n, 8, 1, (int)height, (int)width, images.data,
                              labels.data);
  if (rc == KILN_OK && n_written) *n_written = n;
done:
  kiln_idx_free(&images);
  kiln_idx_free(&labels);
  return rc;
}

int kiln_compute_mean(const char *db_path, const char *out_path, uint64_t *n_records) {
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
