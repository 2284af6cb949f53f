/* kiln import onnx IN.onnx OUT_NET.prototxt OUT_WEIGHTS.caffemodel [--batch N]: an ONNX model as a
 * Caffe deploy net and its weights (src/onnx/import.c, docs/onnx.md). */
#include <stdlib.h>
#include <string.h>

#include "kiln/files.h"
#include "kiln/onnx.h"
#include "tool.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln import onnx IN.onnx OUT_NET.prototxt OUT_WEIGHTS.caffemodel [--batch N]\n"
          "\n"
          "Reads an ONNX model (opsets %d to %d of ai.onnx, as torch.onnx.export writes them)\n"
          "and writes it as a Caffe deploy net (Input layers for the model's inputs, its outputs\n"
          "under their ONNX names) and a .caffemodel of its weights. Constant parts of the graph\n"
          "(Shape, Gather, Concat, ... of constants) are folded first; each other node becomes the\n"
          "kiln layers that compute exactly what it computes, or is refused, naming the node and\n"
          "its op type, and nothing is written. The net is built once to check it before the\n"
          "files are written, each under a temporary name. docs/onnx.md has the op table and how\n"
          "to train an imported net (add a data layer and a loss).\n"
          "\n"
          "options:\n"
          "  --batch N              the size of an input's first axis where the model leaves it\n"
          "                         symbolic (default 1)\n",
          KILN_ONNX_IMPORT_OPSET_MIN, KILN_ONNX_IMPORT_OPSET_MAX);
  tool_common_usage(f, NULL);
  tool_help_usage(f);
}

static void import_usage(FILE *f) {
  fprintf(f, "usage: kiln import onnx IN.onnx OUT_NET.prototxt OUT_WEIGHTS.caffemodel [--batch N]\n"
             "\n"
             "A model of another format as a kiln (Caffe) net and weights: ONNX (docs/onnx.md).\n"
             "kiln import FORM --help for one form's options.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

static void shape_text(const kiln_blob *b, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int a = 0; a < b->naxes && k < n; a++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", a ? "x" : "", (long long)b->shape[a]);
}

int cmd_import(int argc, char **argv) {
  if (argc >= 2 && tool_is_help(argv[1])) tool_help(import_usage);
  for (int i = 2; i < argc; i++)
    if (tool_is_help(argv[i]) && !strcmp(argv[1], "onnx")) tool_help(usage);
  if (argc < 2 || strcmp(argv[1], "onnx")) {
    if (argc >= 2 && argv[1][0] == '-')
      fprintf(stderr, "kiln import: unknown option '%s' (see kiln import --help)\n", argv[1]);
    else if (argc >= 2)
      fprintf(stderr, "kiln import: unknown format '%s' (kiln import onnx ...)\n", argv[1]);
    else
      import_usage(stderr);
    return 2;
  }
  static const char *const names[] = {"--batch", NULL};
  tool_common c = {0};
  const char *files[3] = {NULL, NULL, NULL};
  int nfiles = 0;
  long long batch = 0;
  for (int i = 2; i < argc; i++) {
    if (argv[i][0] != '-' || !argv[i][1]) {
      if (nfiles == 3) return tool_unexpected("import onnx", argv[i]);
      if (!tool_nonempty("import onnx", nfiles == 0 ? "IN" : nfiles == 1 ? "OUT_NET" : "OUT_WEIGHTS", argv[i])) return 2;
      files[nfiles++] = argv[i];
      continue;
    }
    const char *o, *v;
    int r = tool_option_value("import onnx", names, usage, &c, argc, argv, &i, &o, &v);
    if (r < 0) return 2;
    if (r == 0) continue;
    if (!tool_int_option("import onnx", "--batch", v, 1, 1 << 20, &batch)) return 2;
  }
  if (c.metrics) {
    fprintf(stderr, "kiln import onnx: --metrics: import writes no events\n");
    return 2;
  }
  if (nfiles < 3) {
    fprintf(stderr, "kiln import onnx: %s is required (see kiln import onnx --help)\n",
            nfiles == 0 ? "IN.onnx" : nfiles == 1 ? "OUT_NET.prototxt" : "OUT_WEIGHTS.caffemodel");
    return 2;
  }
  const char *in = files[0], *out_net = files[1], *out_w = files[2];
  if (!strcmp(out_net, out_w)) {
    fprintf(stderr, "kiln import onnx (nothing written): OUT_NET and OUT_WEIGHTS are both '%s'\n", out_net);
    return 1;
  }
  const char *inputs[] = {in};
  if (kiln_check_output(out_net, KILN_OUTPUT_RENAMED, inputs, 1) ||
      kiln_check_output(out_w, KILN_OUTPUT_RENAMED, inputs, 1))
    return tool_fail("import onnx (nothing written)");
  char *data = NULL;
  size_t len = 0;
  if (kiln_read_file_max(in, (size_t)INT32_MAX, &data, &len)) return tool_fail("import onnx (nothing written)");
  kiln_onnx_imported m;
  const kiln_onnx_import_options opt = {.batch = batch};
  int rc = kiln_onnx_import(data, len, in, &opt, &m);
  free(data);
  if (rc) return tool_fail("import onnx (nothing written)");
  /* the net must build in kiln as it will be read: checked before anything is written */
  kiln_net_options no = {.phase = CAFFE__PHASE__TEST, .source = out_net, .max_memory = c.max_memory};
  kiln_net *net = NULL;
  if ((rc = kiln_net_create(m.net, &no, &net))) {
    kiln_error_context(rc, "%s: the imported net does not build in kiln: ", in);
    kiln_onnx_imported_free(&m);
    return tool_fail("import onnx (nothing written)");
  }
  if ((rc = kiln_onnx_imported_write(&m, out_net, out_w))) {
    kiln_net_free(net);
    kiln_onnx_imported_free(&m);
    return tool_fail("import onnx (nothing written)");
  }
  char chained[64] = "";
  if (m.chained) snprintf(chained, sizeof chained, ", %d computed by another node's layer", m.chained);
  printf("wrote %s and %s: ONNX opset %d, %d nodes (%d folded as constants, %d without a layer%s) "
         "as %d layers, %lld parameters\n",
         out_net, out_w, m.opset, m.nodes, m.folded, m.dropped, chained, m.layers,
         (long long)m.parameters);
  char shape[256];
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "Input")) continue;
    for (int t = 0; t < l->ntop; t++) {
      shape_text(l->top[t], shape, sizeof shape);
      printf("input %s %s\n", l->top[t]->name, shape);
    }
  }
  for (int o = 0; o < net->noutputs; o++) {
    shape_text(net->outputs[o], shape, sizeof shape);
    printf("output %s %s\n", net->outputs[o]->name, shape);
  }
  kiln_net_free(net);
  kiln_onnx_imported_free(&m);
  return 0;
}
