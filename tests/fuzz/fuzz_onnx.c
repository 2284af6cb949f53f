/* The ONNX importer (kiln import onnx, src/onnx/import.c) on arbitrary bytes: the protobuf
 * reader, the checks of the model (opset, initializers against their dims, the graph's order),
 * the constant folding and the mapping of each node. */
#include "fuzz.h"
#include "kiln/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kiln_onnx_imported m;
  if (kiln_onnx_import(data, size, "fuzz", NULL, &m) == KILN_OK) kiln_onnx_imported_free(&m);
  return 0;
}
