/* The protobuf text-format parser on the messages kiln reads as text: nets, solvers, CE suites and
 * baselines, and for nets and solvers the upgrade of Caffe's old formats that follows every load.
 * The first byte picks the message. */
#include <protobuf-c/protobuf-c.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kiln/core.h"
#include "kiln/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const ProtobufCMessageDescriptor *const kinds[] = {
      &caffe__net_parameter__descriptor, &caffe__solver_parameter__descriptor,
      &caffe__ce_suite__descriptor, &caffe__ce_baseline__descriptor};
  const ProtobufCMessageDescriptor *d = kinds[data[0] % 4];
  ProtobufCMessage *m = NULL;
  if (kiln_text_parse((const char *)data + 1, size - 1, "fuzz", d, &m) == KILN_OK) {
    char *text = NULL; /* what parses must print and parse back */
    if (kiln_text_format(m, &text) == KILN_OK) {
      ProtobufCMessage *again = NULL;
      if (kiln_text_parse(text, strlen(text), "fuzz-again", d, &again) != KILN_OK) __builtin_trap();
      protobuf_c_message_free_unpacked(again, NULL);
    }
    free(text);
    /* Caffe's old formats are upgraded on load: whatever parses must upgrade or be refused */
    if (d == &caffe__net_parameter__descriptor)
      (void)kiln_net_param_upgrade((Caffe__NetParameter *)m, "fuzz", NULL);
    if (d == &caffe__solver_parameter__descriptor)
      (void)kiln_solver_param_upgrade((Caffe__SolverParameter *)m, "fuzz", NULL);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  return 0;
}
