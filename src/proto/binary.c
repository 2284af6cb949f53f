/* Binary protobuf files: whole-file unpack with a clear error, and packed atomic writes. */
#include <stdlib.h>

#include "kiln/proto.h"

int kiln_proto_unpack(const void *buf, size_t len, const char *name,
                      const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out) {
  *out = protobuf_c_message_unpack(desc, NULL, len, buf);
  if (!*out)
    return kiln_errorf(KILN_ERR_PARSE, "%s: not a valid binary %s (%zu bytes): corrupt or truncated",
                       name, desc->short_name, len);
  return KILN_OK;
}

int kiln_proto_read_binary(const char *path, const ProtobufCMessageDescriptor *desc,
                           ProtobufCMessage **out) {
  char *buf;
  size_t len;
  *out = NULL;
  KILN_TRY(kiln_read_file(path, &buf, &len));
  int rc = kiln_proto_unpack(buf, len, path, desc, out);
  free(buf);
  return rc;
}

int kiln_proto_write_binary(const char *path, const ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return kiln_errorf(KILN_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, len);
  protobuf_c_message_pack(msg, buf);
  int rc = kiln_write_file_atomic(path, buf, len);
  free(buf);
  return rc;
}
