/* kiln test, kiln time and kiln describe: commands that build one net from a model prototxt. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "tool.h"

typedef struct {
  tool_common c;
  const char *model, *weights;
  int iterations, phase;
  const char *stages[16]; /* --stage, as Caffe's -stage: which layers a NetState rule selects */
  int nstages;
  /* kiln test --decode DEPLOY [--beam K] [--max-len L] [--limit N]: the test pairs decoded */
  const char *decode;
  int beam, max_len, limit;
  /* kiln test --ap-version: how a detection net's mAP averages precision */
  const char *ap_version;
} net_args;

/* The options --model, --phase and --stage, which the three commands share. */
#define NET_OPTIONS                                                                              \
  "  --model FILE           the net prototxt (required; Caffe's old formats are upgraded)\n"    \
  "  --phase TRAIN|TEST     the phase the net is built in (default %s)\n"                       \
  "  --stage S              a stage of the net's state, as Caffe's -stage (layers' include and\n" \
  "                         exclude rules select by it); repeat for several, at most 16\n"

static void test_usage(FILE *f) {
  fprintf(f,
          "usage: kiln test --model M.prototxt [--weights W.caffemodel] [options]\n"
          "\n"
          "Runs the net's forward passes and prints each output averaged over them (the loss and\n"
          "accuracies; a language model's perplexity, an F1 layer's precision, recall and f1; a\n"
          "detection net's mAP over every image of the passes, and each class's AP).\n"
          "\n"
          "options:\n" NET_OPTIONS
          "  --weights FILE         the .caffemodel to test (without it: random weights, with a\n"
          "                         warning)\n"
          "  --iterations N         the forward passes averaged (default 50)\n"
          "  --decode DEPLOY        then decode the test net's TextData pairs with the deploy net\n"
          "                         DEPLOY.prototxt and these weights, as kiln decode does (token\n"
          "                         error rate, word accuracy); needs --weights\n"
          "  --beam K               with --decode: beam search of width K (default: greedy)\n"
          "  --max-len L            with --decode: the longest output, in tokens (default 50)\n"
          "  --limit N              with --decode: only the first N pairs\n"
          "  --ap-version V         a detection net's average precision: 11point (VOC2007),\n"
          "                         MaxIntegral (VOC2012) or Integral (the SSD fork's default)\n",
          "TEST");
  tool_common_usage(f, "test, decode");
  tool_help_usage(f);
}

static void time_usage(FILE *f) {
  fprintf(f,
          "usage: kiln time --model M.prototxt [options]\n"
          "\n"
          "Times each layer's forward and backward pass, as caffe time does, after one pass\n"
          "untimed: the fillers' weights, random values in the inputs no data layer fills; then\n"
          "the totals, samples/s and GFLOP/s.\n"
          "\n"
          "options:\n" NET_OPTIONS
          "  --iterations N         the timed forward-backward passes (default 50)\n",
          "TRAIN");
  tool_common_usage(f, "layer_time, time");
  tool_help_usage(f);
}

static void describe_usage(FILE *f) {
  fprintf(f,
          "usage: kiln describe --model M.prototxt [options]\n"
          "\n"
          "Builds the net without running it and prints its layer table (output shapes,\n"
          "parameters, FLOPs) and its memory plan.\n"
          "\n"
          "options:\n" NET_OPTIONS,
          "TRAIN");
  tool_common_usage(f, NULL);
  tool_help_usage(f);
}

static int parse_net_args(const char *cmd, int argc, char **argv, net_args *a, int default_phase,
                          int default_iters) {
  static const char *const test_names[] = {"--model", "--phase", "--stage", "--weights",
                                           "--iterations", "--decode", "--beam", "--max-len",
                                           "--limit", "--ap-version", NULL};
  static const char *const time_names[] = {"--model", "--phase", "--stage", "--iterations", NULL};
  static const char *const describe_names[] = {"--model", "--phase", "--stage", NULL};
  const bool test = !strcmp(cmd, "test"), timing = !strcmp(cmd, "time");
  memset(a, 0, sizeof *a);
  a->phase = default_phase;
  a->iterations = default_iters;
  for (int i = 1; i < argc; i++) {
    const char *o, *v;
    int r = tool_option_value(cmd, test ? test_names : timing ? time_names : describe_names,
                              test ? test_usage : timing ? time_usage : describe_usage, &a->c, argc,
                              argv, &i, &o, &v);
    if (r < 0) return 2;
    if (r == 0) continue;
    if (!strcmp(o, "--model")) a->model = v;
    else if (!strcmp(o, "--weights")) a->weights = v;
    else if (!strcmp(o, "--iterations")) {
      if (!tool_int_option_int(cmd, o, v, 1, INT_MAX, &a->iterations)) return 2;
    } else if (!strcmp(o, "--stage")) {
      if (a->nstages == 16) {
        fprintf(stderr, "kiln %s: more than 16 --stage options\n", cmd);
        return 2;
      }
      a->stages[a->nstages++] = v;
    } else if (!strcmp(o, "--phase")) {
      if (!strcmp(v, "TRAIN") || !strcmp(v, "train")) a->phase = CAFFE__PHASE__TRAIN;
      else if (!strcmp(v, "TEST") || !strcmp(v, "test")) a->phase = CAFFE__PHASE__TEST;
      else {
        fprintf(stderr, "kiln %s: --phase must be TRAIN or TEST\n", cmd);
        return 2;
      }
    } else if (!strcmp(cmd, "test") && !strcmp(o, "--decode")) {
      a->decode = v;
    } else if (!strcmp(cmd, "test") && !strcmp(o, "--ap-version")) {
      kiln_ap_version ap;
      if (kiln_ap_version_parse(v, &ap)) {
        fprintf(stderr, "kiln %s: --ap-version: %s\n", cmd, kiln_last_error());
        return 2;
      }
      a->ap_version = v;
    } else if (!strcmp(cmd, "test") &&
               (!strcmp(o, "--beam") || !strcmp(o, "--max-len") || !strcmp(o, "--limit"))) {
      int *to = o[2] == 'b' ? &a->beam : o[2] == 'm' ? &a->max_len : &a->limit;
      int hi = o[2] == 'b' ? TOOL_MAX_BEAM : o[2] == 'm' ? TOOL_MAX_DECODE_LEN : INT_MAX;
      if (!tool_int_option_int(cmd, o, v, 1, hi, to)) return 2;
    } else {
      fprintf(stderr, "kiln %s: unknown option '%s' (see kiln %s --help)\n", cmd, o, cmd);
      return 2;
    }
  }
  if (!test && !timing && a->c.metrics) {
    fprintf(stderr, "kiln describe: --metrics: describe runs nothing and writes no events\n");
    return 2;
  }
  if (!a->decode && (a->beam || a->max_len || a->limit)) {
    fprintf(stderr, "kiln %s: --beam, --max-len and --limit go with --decode DEPLOY.prototxt\n",
            cmd);
    return 2;
  }
  if (!a->model) {
    fprintf(stderr, "kiln %s: --model is required\n", cmd);
    return 2;
  }
  return 0;
}

/* share_data: off for kiln time, which runs backward passes training would not. */
static int load_net(const net_args *a, bool share_data, kiln_net **net, ProtobufCMessage **msg) {
  return tool_load_net(a->model, a->phase, a->stages, a->nstages, a->c.max_memory, share_data, net,
                       msg);
}

/* The test net's TextData layer of pairs (what --decode decodes), or NULL. */
static const Caffe__TextDataParameter *test_pairs(const kiln_net *net, const char **layer) {
  for (int i = 0; i < net->nlayers; i++) {
    const Caffe__TextDataParameter *p = net->layers[i]->lp->text_data_param;
    if (p && p->mode == CAFFE__TEXT_DATA_PARAMETER__MODE__PAIRS) {
      *layer = net->layers[i]->name;
      return p;
    }
  }
  return NULL;
}

/* --decode: the test pairs' sources decoded by the deploy net with the same weights, their
 * token error rate (PER for a G2P model) and word accuracy printed and recorded. */
static int decode_test_pairs(const net_args *a, const kiln_net *net, tool_metrics *m) {
  const char *layer = NULL;
  const Caffe__TextDataParameter *p = test_pairs(net, &layer);
  if (!p) {
    fprintf(stderr, "kiln test: --decode: %s has no TextData layer of mode PAIRS in phase TEST: "
                    "nothing to decode\n", a->model);
    return 2;
  }
  if (!a->weights) {
    fprintf(stderr, "kiln test: --decode needs --weights\n");
    return 2;
  }
  kiln_config cfg;
  char source[4096], vocab[4096], target[4096];
  if (kiln_config_from_env(&cfg) ||
      kiln_data_source_path(&cfg, p->source ? p->source : "", source, sizeof source) ||
      kiln_data_vocab_path(&cfg, p->vocab, source, "vocab.txt", vocab, sizeof vocab) ||
      kiln_data_vocab_path(&cfg, p->target_vocab, source, "target_vocab.txt", target,
                           sizeof target))
    return tool_fail("test: --decode");
  printf("decoding the pairs of layer '%s' (%s) with %s\n", layer, source, a->decode);
  const tool_decode_args d = {.model = a->decode, .weights = a->weights, .vocab = vocab,
                              .target_vocab = target, .input = source, .beam = a->beam,
                              .max_len = a->max_len ? a->max_len : 50, .limit = a->limit,
                              .max_memory = a->c.max_memory};
  return tool_decode(&d, m);
}

/* A detection net's mAP over the passes and each class's AP, printed; the mAP into *f. */
static int print_map(kiln_net_map *map, const char *version, kiln_metric_field *f) {
  kiln_ap_version v = KILN_AP_INTEGRAL; /* the SSD fork's default */
  if (version && kiln_ap_version_parse(version, &v)) return 1;
  enum { MAX_CLASSES = 1024 };
  int label[MAX_CLASSES], n = 0, nclasses = 0;
  double ap[MAX_CLASSES], m_ap = 0;
  int64_t pos[MAX_CLASSES];
  if (kiln_net_map_result(map, v, &m_ap, &nclasses) ||
      kiln_net_map_per_class(map, v, MAX_CLASSES, label, ap, pos, &n))
    return 1;
  for (int i = 0; i < n; i++)
    printf("class %d: AP %.4f (%lld positives)\n", label[i], ap[i], (long long)pos[i]);
  printf("%s = %.4f (%s average precision over %d classes)\n", KILN_MF_MAP, m_ap,
         kiln_ap_version_name(v), nclasses);
  *f = (kiln_metric_field){KILN_MF_MAP, m_ap, NULL};
  return 0;
}

int cmd_test(int argc, char **argv) {
  net_args a;
  int r = parse_net_args("test", argc, argv, &a, CAFFE__PHASE__TEST, 50);
  if (r) return r;
  if (!a.weights) fprintf(stderr, "kiln test: no --weights given: testing random weights\n");
  tool_metrics m;
  const char *const inputs[] = {a.model, a.weights, a.decode};
  if (tool_metrics_open(&m, a.c.metrics, inputs, 3)) return tool_fail("metrics");
  kiln_net *net = NULL;
  ProtobufCMessage *msg = NULL;
  double *sum = NULL;
  kiln_net_map *map = NULL;
  int code = 0;
  if (load_net(&a, true, &net, &msg) || (a.weights && kiln_net_load_weights(net, a.weights)) ||
      kiln_net_map_new(net, &map)) {
    code = tool_fail("test");
    goto done;
  }
  /* a detection net's DetectionEvaluate rows make its mAP, not a figure of their own */
  const int skip = map ? kiln_net_map_output(map) : -1;
  for (int i = 0; i < net->nlayers; i++) { /* an HDF5Output file may not replace an input */
    const kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "HDF5Output") || !l->lp->hdf5_output_param) continue;
    const char *const inputs[] = {a.model, a.weights};
    if (kiln_check_output(l->lp->hdf5_output_param->file_name, KILN_OUTPUT_RENAMED, inputs, 2)) {
      kiln_error_context(1, "layer '%s' (HDF5Output): hdf5_output_param.file_name ", l->name);
      code = tool_fail("test");
      goto done;
    }
  }
  double start = kiln_now_ms();
  sum = calloc((size_t)net->noutputs + 1, sizeof(double));
  if (!sum) {
    fprintf(stderr, "kiln: test: out of memory\n");
    code = 1;
    goto done;
  }
  double loss = 0;
  for (int it = 0; it < a.iterations; it++) {
    float l;
    if (kiln_net_forward(net, &l)) {
      code = tool_fail("test");
      goto done;
    }
    loss += l;
    if (map && kiln_net_map_add(map, net)) {
      code = tool_fail("test");
      goto done;
    }
    for (int o = 0; o < net->noutputs; o++) {
      double v = 0;
      if (o != skip && kiln_net_blob_sum(net, net->outputs[o], &v)) {
        code = tool_fail("test");
        goto done;
      }
      sum[o] += v;
    }
  }
  /* what went to files rather than to the net's outputs (a net whose outputs all feed
   * HDF5Output layers would otherwise print nothing) */
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "HDF5Output") || !l->lp->hdf5_output_param || l->nbottom != 2)
      continue;
    printf("wrote %d batch%s of '%s' and '%s' to %s (datasets data and label; layer '%s')\n",
           a.iterations, a.iterations == 1 ? "" : "es", l->bottom[0]->name, l->bottom[1]->name,
           l->lp->hdf5_output_param->file_name, l->name);
  }
  enum { MAX_OUTPUTS = 64 }; /* recorded in the metrics; all are printed */
  kiln_metric_field fl[1 + MAX_OUTPUTS + KILN_NET_MAX_DERIVED + 1];
  int n = 0;
  /* as the solver reports it */
  fl[n++] = (kiln_metric_field){KILN_MF_LOSS, (float)(loss / a.iterations), NULL};
  const char *bad = NULL; /* the output that is not finite, or NULL */
  for (int o = 0; o < net->noutputs; o++) {
    sum[o] /= a.iterations; /* the mean, from here on */
    if (o == skip) continue;
    if (o < MAX_OUTPUTS) fl[n++] = (kiln_metric_field){net->outputs[o]->name, (float)sum[o], NULL};
    printf("%s = %.4f\n", net->outputs[o]->name, sum[o]);
    if (!bad && !isfinite(sum[o])) bad = net->outputs[o]->name;
  }
  /* perplexity, precision, recall, f1: the figures the solver's test events carry too */
  kiln_derived_metric d[KILN_NET_MAX_DERIVED];
  const int nd = kiln_net_derived_metrics(net, sum, d);
  for (int k = 0; k < nd; k++) {
    fl[n++] = (kiln_metric_field){d[k].name, (float)d[k].value, NULL};
    printf("%s = %.4f (%s)\n", d[k].name, d[k].value, d[k].from);
  }
  if (map && print_map(map, a.ap_version, &fl[n])) {
    code = tool_fail("test");
    goto done;
  }
  if (map) n++;
  fl[n++] = (kiln_metric_field){KILN_MF_PEAK_RSS_MB, kiln_peak_rss_mb(), NULL};
  tool_metrics_write(&m, KILN_EV_TEST, a.iterations, kiln_now_ms() - start, n, fl);
  if (!isfinite(loss) || bad) { /* a NaN is no test result: the weights or the net are broken */
    fprintf(stderr, "kiln: test: %s%s is not finite (NaN or infinite) over %d iterations of %s\n",
            bad ? "output " : "the loss", bad ? bad : "", a.iterations, a.model);
    code = 1;
  }
  const char *pairs_layer;
  if (!code && a.decode) code = decode_test_pairs(&a, net, &m);
  else if (!code && test_pairs(net, &pairs_layer))
    printf("per: not computed (the token error rate needs decoding: give --decode "
           "DEPLOY.prototxt)\n");
done:
  free(sum);
  kiln_net_map_free(map);
  tool_free_net(net, msg);
  if (tool_metrics_close(&m) && !code) code = 1;
  return code;
}

int cmd_describe(int argc, char **argv) {
  net_args a;
  int r = parse_net_args("describe", argc, argv, &a, CAFFE__PHASE__TRAIN, 1);
  if (r) return r;
  kiln_net *net;
  ProtobufCMessage *msg;
  if (load_net(&a, true, &net, &msg)) return tool_fail("describe");
  char *t = kiln_net_describe(net);
  if (t) fputs(t, stdout);
  free(t);
  tool_free_net(net, msg);
  return 0;
}

/* A blob some layer reads as other than its first bottom, or as a bottom that takes no gradient
 * (directly, or through the Splits the net inserts for fan-out): a label, a weight, a second
 * operand, Embed's indices or a recurrent layer's sequence indicators. Filled with zeros it is
 * class 0 for a loss or an accuracy, index 0 for Embed, every step a sequence start for RNN and
 * LSTM, and a valid operand for the rest. */
static bool read_as_second_operand(const kiln_net *net, const kiln_blob *b, int depth) {
  for (int i = 0; i < net->nlayers && depth < 8; i++) {
    const kiln_layer *l = net->layers[i];
    for (int k = 0; k < l->nbottom; k++) {
      if (l->bottom[k] != b) continue;
      if (k > 0 || (l->ops->no_gradient_bottoms >> k & 1u)) return true;
      if (l->ops->passes_through)
        for (int t = 0; t < l->ntop; t++)
          if (read_as_second_operand(net, l->top[t], depth + 1)) return true;
    }
  }
  return false;
}

/* Fills inputs that no data layer produces: N(0,1), or zeros where they may be labels (a random
 * real is no class index); a data layer's labels stay as it wrote them. Marks every layer for
 * backward so each one's time is measured, as `caffe time` does, with the bottom gradients a
 * training step computes (not the input's). */
static int prepare_for_timing(kiln_net *net) {
  kiln_rng r;
  kiln_rng_seed(&r, 7, 7);
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (l->ops->fed_by_caller)
      for (int t = 0; t < l->ntop; t++) {
        const bool zeros = read_as_second_operand(net, l->top[t], 0);
        /* made on the host, handed over through the device table */
        const int64_t n = l->top[t]->count;
        float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        if (!v) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        for (int64_t k = 0; k < n; k++) v[k] = zeros ? 0.0f : kiln_rng_gaussian(&r, 0, 1);
        int rc = kiln_device_to_device(net->device, l->top[t]->data, v, sizeof(float) * (size_t)n);
        free(v);
        KILN_TRY(rc);
      }
  }
  return kiln_net_need_backward_everywhere(net);
}

int cmd_time(int argc, char **argv) {
  net_args a;
  int r = parse_net_args("time", argc, argv, &a, CAFFE__PHASE__TRAIN, 50);
  if (r) return r;
  tool_metrics m;
  if (tool_metrics_open(&m, a.c.metrics, &a.model, 1)) return tool_fail("metrics");
  kiln_net *net = NULL;
  ProtobufCMessage *msg = NULL;
  double *fwd = NULL, *bwd = NULL;
  bool *runs_fwd = NULL, *runs_bwd = NULL;
  int code = 0;
  if (load_net(&a, false, &net, &msg)) {
    code = tool_fail("time");
    goto done;
  }
  if (prepare_for_timing(net)) {
    code = tool_fail("time");
    goto done;
  }
  int L = net->nlayers;
  fwd = calloc((size_t)L, sizeof(double));
  bwd = calloc((size_t)L, sizeof(double));
  /* one untimed pass warms caches and the prefetch thread */
  float loss;
  if (kiln_net_forward(net, &loss)) {
    code = tool_fail("time");
    goto done;
  }
  /* A fused group's work is timed where it runs: its forward on its first layer, its backward on
   * its last; the other places stay at 0. */
  runs_fwd = calloc((size_t)L, sizeof(bool));
  runs_bwd = calloc((size_t)L, sizeof(bool));
  if (!fwd || !bwd || !runs_fwd || !runs_bwd) {
    fprintf(stderr, "kiln: time: out of memory\n");
    code = 1;
    goto done;
  }
  for (int i = 0; i < L; i++) {
    const kiln_layer *l = net->layers[i];
    runs_fwd[i] = !l->fused_into;
    runs_bwd[i] = l->fused_into ? i + 1 == L || net->layers[i + 1]->fused_into != l->fused_into
                                : !l->fused;
  }
  double total_start = kiln_now_ms();
  for (int it = 0; it < a.iterations; it++) {
    for (int i = 0; i < L; i++) {
      double t0 = kiln_now_ms();
      /* a device's kernels are queued: each layer's time is until they are done */
      if (kiln_net_layer_forward(net, i) || kiln_device_sync(net->device)) {
        code = tool_fail("time");
        goto done;
      }
      if (runs_fwd[i]) fwd[i] += kiln_now_ms() - t0;
    }
    for (int i = 0; i < L; i++) {
      kiln_layer *l = net->layers[i];
      for (int t = 0; t < l->ntop; t++)
        if (l->loss_weight[t] != 0 &&
            KILN_OP(l, fill, l->top[t]->diff, l->loss_weight[t], l->top[t]->count)) {
          code = tool_fail("time");
          goto done;
        }
    }
    for (int i = L - 1; i >= 0; i--) {
      double t0 = kiln_now_ms();
      if (kiln_net_layer_backward(net, i) || kiln_device_sync(net->device)) {
        code = tool_fail("time");
        goto done;
      }
      if (runs_bwd[i]) bwd[i] += kiln_now_ms() - t0;
    }
  }
  double total = kiln_now_ms() - total_start;
  int batch = 1;
  for (int i = 0; i < L; i++)
    if (net->layers[i]->ops->is_data && net->layers[i]->top[0]->naxes > 0) {
      batch = (int)net->layers[i]->top[0]->shape[0];
      break;
    }
  printf("%-24s %-16s %12s %12s %10s\n", "layer", "type", "forward_ms", "backward_ms", "GFLOP/s");
  double fsum = 0, bsum = 0;
  for (int i = 0; i < L; i++) {
    kiln_layer *l = net->layers[i];
    double f = fwd[i] / a.iterations, b = bwd[i] / a.iterations;
    fsum += f;
    bsum += b;
    double group_flops = l->flops; /* a fused group's forward runs on its first layer */
    for (int j = 1; j <= l->fused; j++) group_flops += net->layers[i + j]->flops;
    printf("%-24.24s %-16.16s %12.4f %12.4f %10.2f\n", l->name, l->ops->type, f, b,
           f > 0 ? group_flops / (f * 1e6) : 0.0);
    const kiln_metric_field fl[] = {{.name = KILN_MF_LAYER, .text = l->name},
                                    {.name = KILN_MF_TYPE, .text = l->ops->type},
                                    {KILN_MF_FORWARD_MS, f, NULL},
                                    {KILN_MF_BACKWARD_MS, b, NULL},
                                    {KILN_MF_MFLOPS, l->flops / 1e6, NULL}};
    tool_metrics_write(&m, KILN_EV_LAYER_TIME, a.iterations, total, 5, fl);
  }
  double per_iter = total / a.iterations;
  int groups = 0;
  for (int i = 0; i < L; i++) groups += net->layers[i]->fused > 0;
  if (groups)
    printf("%d fused groups (BatchNorm + Scale [+ ReLU], Eltwise sum + ReLU): each one's "
           "forward is timed on its first layer, its backward on its last; KILN_FUSE=0 times "
           "them apart\n", groups);
  printf("average forward: %.3f ms, backward: %.3f ms, forward-backward: %.3f ms per iteration\n",
         fsum, bsum, per_iter);
  printf("%.1f samples/s (batch %d), %.2f GFLOP/s forward\n", batch / (per_iter / 1e3), batch,
         kiln_net_forward_flops(net) / (fsum * 1e6));
  size_t dev_peak = 0;
  const bool on_device = net->device && kiln_device_memory(net->device, NULL, &dev_peak) == KILN_OK;
  if (on_device)
    printf("peak device memory: %.1f MB on %s\n", (double)dev_peak / (1 << 20), net->device->name);
  const kiln_metric_field fl[] = {{KILN_MF_FORWARD_MS, fsum, NULL},
                                  {KILN_MF_BACKWARD_MS, bsum, NULL},
                                  {KILN_MF_TOTAL_MS, per_iter, NULL},
                                  {KILN_MF_SAMPLES_PER_S, batch / (per_iter / 1e3), NULL},
                                  {KILN_MF_BATCH, batch, NULL},
                                  {KILN_MF_PEAK_RSS_MB, kiln_peak_rss_mb(), NULL},
                                  {KILN_MF_PEAK_DEVICE_MB, (double)dev_peak / (1 << 20), NULL}};
  tool_metrics_write(&m, KILN_EV_TIME, a.iterations, total, on_device ? 7 : 6, fl);
done:
  free(fwd);
  free(bwd);
  free(runs_fwd);
  free(runs_bwd);
  tool_free_net(net, msg);
  if (tool_metrics_close(&m) && !code) code = 1;
  return code;
}
