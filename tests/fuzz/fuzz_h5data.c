/* The HDF5 data reader (the files HDF5Data reads) on a file of the input's bytes after the first:
 * inspected as an image, then loaded into buffers of the sizes inspection gave, under a 64 MiB
 * allowance; with bit 1 of the first byte also inspected from a file through libhdf5's POSIX
 * driver (what the layer's set-up does). Bit 0 asks for datasets "data" and "label", else "data"
 * alone. */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz.h"
#include "kiln/data.h"

enum { LIMIT = 64 << 20 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const char *const names[2] = {"data", "label"};
  const int n = (data[0] & 1) + 1;
  kiln_h5data_shape shapes[2];
  if (data[0] & 2) {
    const char *path = fuzz_temp_file(data + 1, size - 1, ".h5");
    if (path) {
      kiln_h5data_inspect(path, n, names, LIMIT, shapes, NULL);
      remove(path);
    }
  }
  if (kiln_h5data_inspect_image(data + 1, size - 1, "fuzz.h5", n, names, LIMIT, shapes))
    return 0;
  float *dst[2] = {NULL, NULL};
  uint64_t room[2] = {0, 0};
  int ok = 1;
  for (int i = 0; i < n; i++) {
    room[i] = (uint64_t)shapes[i].dims[0] * (uint64_t)kiln_h5data_record_size(&shapes[i]);
    ok &= (dst[i] = malloc(sizeof(float) * (size_t)room[i])) != NULL;
  }
  if (ok) kiln_h5data_load_image(data + 1, size - 1, "fuzz.h5", n, names, LIMIT, shapes, dst, room);
  free(dst[0]);
  free(dst[1]);
  return 0;
}
