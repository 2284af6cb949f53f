/* The CIFAR reader (tar, tar.gz, or a single batch file) on a file of the input's bytes; the
 * first byte picks CIFAR-10 or -100 and the split. */
#include <stdio.h>

#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *path = fuzz_temp_file(data + 1, size - 1, ".tar.gz");
  if (!path) return 0;
  kiln_cifar_set set;
  kiln_cifar_kind kind = data[0] & 1 ? KILN_CIFAR100_FINE : KILN_CIFAR10;
  if (kiln_cifar_read(path, kind, (data[0] & 2) != 0, &set) == KILN_OK) kiln_cifar_free(&set);
  remove(path);
  return 0;
}
