/* Shared by the fuzz targets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

const char *fuzz_temp_file(const uint8_t *data, size_t size, const char *suffix) {
  static char path[128];
  snprintf(path, sizeof path, "/tmp/kiln-fuzz-%ld%s", (long)getpid(), suffix ? suffix : "");
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  size_t put = size ? fwrite(data, 1, size, f) : 0;
  if (fclose(f) != 0 || put != size) return NULL;
  return path;
}
