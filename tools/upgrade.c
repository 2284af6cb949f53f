/* kiln upgrade IN OUT: a net (text or .caffemodel) or solver in Caffe's old formats, written in
 * the current one (Caffe's upgrade_net_proto_text, upgrade_net_proto_binary and
 * upgrade_solver_proto_text in one command). kiln upgrades on load anyway; this keeps a copy.
 * kiln upgrade --caffe IN OUT writes it for Caffe 1.0 too: without the fields Caffe 1.0 lacks
 * (each named on stderr), or not at all when a layer type or value has no Caffe 1.0 equivalent
 * (src/proto/caffe_compat.c). */
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

static void usage(FILE *f) {
  fprintf(f, "usage: kiln upgrade [--caffe] IN OUT\n"
             "\n"
             "A net (.prototxt or binary .caffemodel) or a solver in Caffe's old formats (V0/V1\n"
             "layers, solver_type) written in the current one; kiln also upgrades them on load.\n"
             "IN and OUT are binary when their names end in .caffemodel, .binaryproto or .pb, text\n"
             "otherwise. OUT is written whole under a temporary name, never over IN.\n"
             "\n"
             "options:\n"
             "  --caffe     write it for Caffe 1.0 (and OpenCV's readNetFromCaffe): every field\n"
             "              kiln adds to Caffe's messages is dropped, each named on stderr; a layer\n"
             "              type Caffe 1.0 lacks (TextData, GELU, ...) is refused, and nothing is\n"
             "              written\n");
  tool_help_usage(f);
}

int cmd_upgrade(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (tool_is_help(argv[i])) tool_help(usage);
  const char *files[2];
  int nfiles = 0;
  bool caffe = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--caffe")) {
      caffe = true;
    } else if (!strncmp(argv[i], "--", 2)) {
      fprintf(stderr, "kiln upgrade: unknown option '%s' (see kiln upgrade --help)\n", argv[i]);
      return 2;
    } else if (nfiles == 2) {
      return tool_unexpected("upgrade", argv[i]);
    } else if (!tool_nonempty("upgrade", nfiles ? "OUT" : "IN", argv[i])) {
      return 2;
    } else {
      files[nfiles++] = argv[i];
    }
  }
  if (nfiles != 2) {
    usage(stderr);
    return 2;
  }
  const char *in = files[0], *out = files[1];
  if (kiln_check_output(out, KILN_OUTPUT_RENAMED, &in, 1)) return tool_fail("upgrade");
  ProtobufCMessage *m = NULL;
  bool changed = false;
  kiln_caffe_drops drops = {0};
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
      char net_error[4096]; /* as long as the library's messages: its end, the reason, stays */
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
  if (!rc && caffe) {
    rc = m->descriptor == &caffe__solver_parameter__descriptor
             ? kiln_solver_param_to_caffe10((Caffe__SolverParameter *)m, in, &drops)
             : kiln_net_param_to_caffe10((Caffe__NetParameter *)m, in, &drops);
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
  const char *kind = m && m->descriptor == &caffe__solver_parameter__descriptor ? "solver" : "net";
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  if (rc) {
    kiln_caffe_drops_free(&drops);
    return tool_fail(caffe ? "upgrade --caffe (nothing written)" : "upgrade");
  }
  for (size_t i = 0; i < drops.n; i++)
    fprintf(stderr, "kiln upgrade: %s%sdropped %s (%s; Caffe 1.0 has no such field: %s)\n",
            drops.v[i].where, *drops.v[i].where ? ": " : "", drops.v[i].field,
            drops.v[i].entry->origin, drops.v[i].entry->note);
  if (caffe)
    printf("wrote a Caffe 1.0 %s to %s from %s (%s; %zu field%s dropped)\n", kind, out, in,
           changed ? "upgraded from Caffe's old format" : "already current", drops.n,
           drops.n == 1 ? "" : "s");
  else if (changed)
    printf("upgraded %s to %s\n", in, out);
  else
    printf("already current: %s (nothing to upgrade); wrote the same %s to %s%s\n", in, kind, out,
           binary_name(in) || binary_name(out) ? "" : " (comments and layout are not kept)");
  kiln_caffe_drops_free(&drops);
  return 0;
}
