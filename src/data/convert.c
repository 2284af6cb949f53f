/* `kiln convert` for MNIST-style data: an images IDX and a labels IDX become an LMDB of Datum
 * records with the keys and layout of Caffe's convert_mnist_data, so Caffe's Data layer and
 * kiln's read the result alike. */
#include <stdio.h>
#include <sys/stat.h>

#include "data/internal.h"
#include "kiln/data.h"

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
