/* The binary protobuf reader on what kiln reads as binary: .caffemodel (NetParameter),
 * .solverstate, mean files (BlobProto) and Datum records. The first byte picks the message. */
#include <protobuf-c/protobuf-c.h>

#include "fuzz.h"
#include "kiln/core.h"
#include "kiln/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const ProtobufCMessageDescriptor *const kinds[] = {
      &caffe__net_parameter__descriptor, &caffe__solver_state__descriptor,
      &caffe__blob_proto__descriptor, &caffe__datum__descriptor};
  ProtobufCMessage *m = NULL;
  if (kiln_proto_unpack(data + 1, size - 1, "fuzz", kinds[data[0] % 4], &m) == KILN_OK) {
    /* a .caffemodel of old Caffe (V0/V1 layers) is upgraded on load */
    if (m->descriptor == &caffe__net_parameter__descriptor)
      (void)kiln_net_param_upgrade((Caffe__NetParameter *)m, "fuzz", NULL);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  return 0;
}
