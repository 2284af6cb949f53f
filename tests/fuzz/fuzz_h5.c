/* The HDF5 snapshot readers (Caffe's .caffemodel.h5 and .solverstate.h5) on a file of the input's
 * bytes; the first byte picks which. */
#include <stdio.h>

#include "fuzz.h"
#include "kiln/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) {
    Caffe__SolverState *st = NULL;
    if (kiln_h5_unpack_state(data + 1, size - 1, "fuzz.solverstate.h5", &st) == KILN_OK)
      protobuf_c_message_free_unpacked(&st->base, NULL);
    return 0;
  }
  const char *path = fuzz_temp_file(data + 1, size - 1, ".caffemodel.h5");
  Caffe__NetParameter *np = NULL;
  if (path && kiln_h5_read_net(path, &np) == KILN_OK) protobuf_c_message_free_unpacked(&np->base, NULL);
  if (path) remove(path);
  return 0;
}
