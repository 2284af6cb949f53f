/* kiln export onnx --model DEPLOY --weights W OUT.onnx [--dynamic-batch] [--outputs B,...]: a
 * deploy net and its
 * weights as an ONNX model (src/onnx, docs/onnx.md). */
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/onnx.h"
#include "tool.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln export onnx --model DEPLOY.prototxt --weights W.caffemodel OUT.onnx\n"
          "                        [--dynamic-batch] [--outputs BLOB[,BLOB...]]\n"
          "\n"
          "Writes a deploy net (built in the TEST phase) and its weights as an ONNX model of\n"
          "opset %d: the Input layers' tops are the model's inputs, the blobs no layer reads its\n"
          "outputs, under their Caffe names; each layer becomes the ONNX nodes that compute it at\n"
          "inference (Dropout none). A layer type with no ONNX form is refused, naming the layer,\n"
          "and nothing is written. OUT is written whole under a temporary name. docs/onnx.md has\n"
          "the layer types and their ONNX forms.\n"
          "\n"
          "options:\n"
          "  --model FILE           the deploy prototxt (required)\n"
          "  --weights FILE         its .caffemodel (or .caffemodel.h5; required)\n"
          "  --dynamic-batch        the inputs' and outputs' first axis as the symbol N, not the\n"
          "                         net's batch size\n"
          "  --outputs LIST         the blobs (comma-separated; repeatable) that are the model's\n"
          "                         outputs instead of those no layer reads; only the layers they\n"
          "                         depend on are written (an SSD net's heads: mbox_loc,\n"
          "                         mbox_conf_flatten,mbox_priorbox, without DetectionOutput)\n",
          KILN_ONNX_OPSET);
  tool_common_usage(f, NULL);
  tool_help_usage(f);
}

/* "1x3x224x224" */
static void shape_text(const kiln_blob *b, bool dynamic, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int a = 0; a < b->naxes && k < n; a++)
    k += (size_t)snprintf(buf + k, n - k, "%s%s%lld", a ? "x" : "",
                          a == 0 && dynamic ? "N=" : "", (long long)b->shape[a]);
}

/* The folder OUT goes into must exist and take new files: said before the net is built. */
static int check_folder(const char *out) {
  char *copy = strdup(out);
  if (!copy) {
    fprintf(stderr, "kiln: out of memory\n");
    return 1;
  }
  const char *dir = dirname(copy);
  int rc = 0;
  if (access(dir, W_OK | X_OK) != 0) {
    fprintf(stderr, "kiln export onnx: %s: cannot write into the folder '%s': %s\n", out, dir,
            strerror(errno));
    rc = 1;
  }
  free(copy);
  return rc;
}

static void export_usage(FILE *f) {
  fprintf(f, "usage: kiln export onnx --model DEPLOY.prototxt --weights W.caffemodel OUT.onnx\n"
             "                        [--dynamic-batch]\n"
             "\n"
             "A trained net in another format: ONNX (docs/onnx.md). kiln export FORM --help for\n"
             "one form's options.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

int cmd_export(int argc, char **argv) {
  if (argc >= 2 && tool_is_help(argv[1])) tool_help(export_usage);
  for (int i = 2; i < argc; i++)
    if (tool_is_help(argv[i]) && !strcmp(argv[1], "onnx")) tool_help(usage);
  if (argc < 2 || strcmp(argv[1], "onnx")) {
    if (argc >= 2 && argv[1][0] == '-')
      fprintf(stderr, "kiln export: unknown option '%s' (see kiln export --help)\n", argv[1]);
    else if (argc >= 2)
      fprintf(stderr, "kiln export: unknown format '%s' (kiln export onnx ...)\n", argv[1]);
    else
      export_usage(stderr);
    return 2;
  }
  static const char *const names[] = {"--model", "--weights", "--outputs", NULL};
  const char *outputs[64];
  int noutputs = 0;
  tool_common c = {0};
  const char *model = NULL, *weights = NULL, *out = NULL;
  bool dynamic = false;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--dynamic-batch")) {
      dynamic = true;
      continue;
    }
    if (argv[i][0] != '-' || !argv[i][1]) {
      if (out) return tool_unexpected("export onnx", argv[i]);
      if (!tool_nonempty("export onnx", "OUT", argv[i])) return 2;
      out = argv[i];
      continue;
    }
    const char *o, *v;
    int r = tool_option_value("export onnx", names, usage, &c, argc, argv, &i, &o, &v);
    if (r < 0) return 2;
    if (r == 0) continue;
    if (!strcmp(o, "--model")) model = v;
    else if (!strcmp(o, "--weights")) weights = v;
    else {
      /* the list is cut in place: v points into argv, which is the program's to change */
      for (char *save = NULL, *tok = strtok_r((char *)v, ",", &save); tok;
           tok = strtok_r(NULL, ",", &save)) {
        if (noutputs == (int)(sizeof outputs / sizeof outputs[0])) {
          fprintf(stderr, "kiln export onnx: --outputs: more than %d blobs\n", noutputs);
          return 2;
        }
        outputs[noutputs++] = tok;
      }
      if (noutputs == 0 || !*v) {
        fprintf(stderr, "kiln export onnx: --outputs: no blob named\n");
        return 2;
      }
    }
  }
  if (c.metrics) {
    fprintf(stderr, "kiln export onnx: --metrics: export writes no events\n");
    return 2;
  }
  if (!model || !weights || !out) {
    fprintf(stderr, "kiln export onnx: %s is required (see kiln export onnx --help)\n",
            !model ? "--model" : !weights ? "--weights" : "OUT.onnx");
    return 2;
  }
  const char *inputs[] = {model, weights};
  if (kiln_check_output(out, KILN_OUTPUT_RENAMED, inputs, 2))
    return tool_fail("export onnx (nothing written)");
  if (check_folder(out)) return 1;
  kiln_net *net = NULL;
  ProtobufCMessage *msg = NULL;
  if (tool_load_net(model, CAFFE__PHASE__TEST, NULL, 0, c.max_memory, true, &net, &msg))
    return tool_fail("export onnx (nothing written)");
  const kiln_onnx_options opt = {.dynamic_batch = dynamic, .model = model, .weights = weights,
                                 .outputs = outputs, .noutputs = noutputs};
  kiln_onnx_summary s;
  int rc = kiln_onnx_check(net, &opt); /* a refused layer is said before the weights are read */
  if (rc) kiln_error_context(rc, "%s: ", model);
  else if (!(rc = kiln_net_load_weights(net, weights)) &&
           (rc = kiln_onnx_export(net, &opt, out, &s)))
    kiln_error_context(rc, "%s: ", model);
  if (rc) {
    tool_free_net(net, msg);
    return tool_fail("export onnx (nothing written)");
  }
  printf("wrote %s: ONNX opset %d, %d nodes, %d initializers (%lld parameters), %.1f MB\n", out,
         KILN_ONNX_OPSET, s.nodes, s.initializers, (long long)s.parameters, s.bytes / 1e6);
  char shape[256];
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "Input")) continue;
    for (int t = 0; t < l->ntop; t++) {
      shape_text(l->top[t], dynamic, shape, sizeof shape);
      printf("input %s %s\n", l->top[t]->name, shape);
    }
  }
  const int nout = noutputs ? noutputs : net->noutputs;
  for (int o = 0; o < nout; o++) {
    const kiln_blob *b = noutputs ? kiln_net_blob(net, outputs[o]) : net->outputs[o];
    shape_text(b, dynamic, shape, sizeof shape);
    printf("output %s %s\n", b->name, shape);
  }
  if (s.dropped)
    printf("%d Dropout layer%s left out (the identity at inference)\n", s.dropped,
           s.dropped == 1 ? "" : "s");
  tool_free_net(net, msg);
  return 0;
}
