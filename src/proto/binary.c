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

/* How many bytes protobuf-c gives one value of type t in a message (one element of a repeated
 * field's array). */
size_t kiln_proto_value_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: return sizeof(int32_t);
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: return sizeof(uint32_t);
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: return sizeof(int64_t);
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: return sizeof(uint64_t);
  case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
  case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM: return sizeof(int); /* protobuf-c forces enums to int size */
  case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
  }
  return 0;
}
