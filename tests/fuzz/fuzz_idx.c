/* The IDX reader (MNIST's format, plain or gzipped) on a file of the input's bytes. */
#include <stdio.h>

#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_temp_file(data, size, ".idx");
  if (!path) return 0;
  kiln_idx idx;
  if (kiln_idx_read(path, &idx) == KILN_OK) kiln_idx_free(&idx);
  remove(path);
  return 0;
}
