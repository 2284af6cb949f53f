/* kiln upgrade IN OUT: a net (text or .caffemodel) or solver in Caffe's old formats, written in
 * the current one (Caffe's upgrade_net_proto_text, upgrade_net_proto_binary and
 * upgrade_solver_proto_text in one command). kiln upgrades on load anyway; this keeps a copy. */
#include <stdlib.h>
#include <string.h>

#include "kiln/proto.h"
#include "tool.h"

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && !strcmp(s + n - m, tail);
}

static bool binary_name(const char *path) {
  return ends_with(path, ".caffemodel") || ends_with(path, ".binaryproto") || ends_with(path, ".pb");
}

int cmd_upgrade(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: kiln upgrade IN OUT\n"
                    "  a net (.prototxt or binary .caffemodel) or a solver in Caffe's old formats\n"
                    "  (V0/V1 layers, solver_type) written in the current one; OUT is binary when\n"
                    "  its name ends in .caffemodel, .binaryproto or .pb, text otherwise\n");
    return 2;
  }
  const char *in = argv[1], *out = argv[2];
  ProtobufCMessage *m = NULL;
  bool changed = false;
  int rc;
  if (binary_name(in)) {
    rc = kiln_proto_read_binary(in, &caffe__net_parameter__descriptor, &m);
    if (!rc) rc = kiln_net_param_upgrade((Caffe__NetParameter *)m, in, &changed);
  } else {
    rc = kiln_text_parse_file(in, &caffe__net_parameter__descriptor, &m);
    if (!rc) {
      rc = kiln_net_param_upgrade((Caffe__NetParameter *)m, in, &changed);
    } else {
      /* not a net: a solver? (the net's error stands if it is not one either) */
      char net_error[2048];
      snprintf(net_error, sizeof net_error, "%s", kiln_last_error());
      if (kiln_text_parse_file(in, &caffe__solver_parameter__descriptor, &m) == KILN_OK) {
        Caffe__SolverParameter *sp = (Caffe__SolverParameter *)m;
        bool nets = false;
        rc = kiln_solver_param_upgrade(sp, in, &changed);
        if (!rc) rc = kiln_solver_inline_nets_upgrade(sp, in, &nets), changed |= nets;
      } else {
        kiln_errorf(KILN_ERR_PARSE, "%s", net_error);
      }
    }
  }
  if (!rc) {
    if (binary_name(out)) {
      rc = kiln_proto_write_binary(out, m);
    } else {
      char *text = NULL;
      rc = kiln_text_format(m, &text);
      if (!rc) rc = kiln_write_file_atomic(out, text, strlen(text));
      free(text);
    }
  }
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  if (rc) return tool_fail("upgrade");
  printf("%s %s to %s\n", changed ? "upgraded" : "already current:", in, out);
  return 0;
}
