/* The figures a test pass derives from the means of a net's outputs (include/kiln/net.h,
 * kiln_net_derived_metrics), in one place so that the solver's test events and `kiln test`
 * report the same ones: perplexity from a per-token cross-entropy, and precision, recall and F1
 * from an F1 layer's counts. The counts' means are the pooled counts divided by the number of
 * batches, which cancels in every ratio, so those three are exactly the whole pass's, however
 * the batches differ; a mean of each batch's F1 would not be. A detection net's mAP is not a
 * function of means: its DetectionEvaluate rows are kept pass by pass (kiln_net_map). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"

static int output_index(const kiln_net *net, const kiln_blob *b) {
  for (int o = 0; o < net->noutputs; o++)
    if (net->outputs[o] == b) return o;
  return -1;
}

/* The index in outputs of the first loss that is a mean cross-entropy per token (a language
 * model's or a tagger's), whose exp is the per-token perplexity; -1 when there is none. */
static int perplexity_output(const kiln_net *net) {
  for (int o = 0; o < net->noutputs; o++)
    for (int i = 0; i < net->nlayers; i++) {
      const kiln_layer *l = net->layers[i];
      if (l->ntop > 0 && l->top[0] == net->outputs[o] && kiln_layer_is_token_xent(l)) return o;
    }
  return -1;
}

/* The first F1 layer whose three tops all leave the net: their output indices. */
static bool f1_outputs(const kiln_net *net, int out[3]) {
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (!kiln_layer_is_f1(l) || l->ntop != 3) continue;
    bool all = true;
    for (int t = 0; t < 3; t++) all &= (out[t] = output_index(net, l->top[t])) >= 0;
    if (all) return true;
  }
  return false;
}

static bool is_output_name(const kiln_net *net, const char *name) {
  for (int o = 0; o < net->noutputs; o++)
    if (!strcmp(net->outputs[o]->name, name)) return true;
  return false;
}

/* a / b, 0 where b is 0 (no positives predicted, or none there: nothing to be right about) */
static double ratio(double a, double b) { return b != 0 ? a / b : 0; }

int kiln_net_derived_metrics(const kiln_net *net, const double *mean, kiln_derived_metric *out) {
  int n = 0;
  /* An output of the same name is the net's own figure and stands. */
#define ADD(NAME, VALUE, ...)                                                                     \
  do {                                                                                            \
    if (is_output_name(net, NAME)) break;                                                         \
    out[n].name = NAME;                                                                           \
    out[n].value = VALUE;                                                                         \
    snprintf(out[n].from, sizeof out[n].from, __VA_ARGS__);                                       \
    n++;                                                                                          \
  } while (0)
  int ppl = perplexity_output(net);
  if (ppl >= 0) ADD(KILN_NET_PERPLEXITY, exp(mean[ppl]), "exp of %s", net->outputs[ppl]->name);
  int c[3];
  if (f1_outputs(net, c)) {
    double tp = mean[c[0]], fp = mean[c[1]], fn = mean[c[2]];
    const char *a = net->outputs[c[0]]->name, *b = net->outputs[c[1]]->name,
               *d = net->outputs[c[2]]->name;
    ADD(KILN_NET_PRECISION, ratio(tp, tp + fp), "%s / (%s + %s)", a, a, b);
    ADD(KILN_NET_RECALL, ratio(tp, tp + fn), "%s / (%s + %s)", a, a, d);
    ADD(KILN_NET_F1, ratio(2 * tp, 2 * tp + fp + fn), "2 %s / (2 %s + %s + %s)", a, a, b, d);
  }
#undef ADD
  return n;
}

/* ---- detection ------------------------------------------------------------------------------ */

struct kiln_net_map {
  const kiln_blob *rows; /* the DetectionEvaluate layer's top */
  int output;            /* its index in the net's outputs */
  float *host;           /* a pass's rows, read from the net's device */
  int64_t cap;
  kiln_map *map;
};

int kiln_net_map_new(const kiln_net *net, kiln_net_map **out) {
  *out = NULL;
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (!kiln_layer_is_detection_evaluate(l) || l->ntop < 1) continue;
    const int o = output_index(net, l->top[0]);
    if (o < 0) continue;
    kiln_net_map *m = calloc(1, sizeof *m);
    if (!m || !(m->map = kiln_map_new())) {
      free(m);
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a detection test pass");
    }
    m->rows = l->top[0];
    m->output = o;
    *out = m;
    return KILN_OK;
  }
  return KILN_OK;
}

int kiln_net_map_add(kiln_net_map *m, const kiln_net *net) {
  const int64_t n = m->rows->count;
  if (n % 5)
    return kiln_errorf(KILN_ERR_SHAPE, "'%s': %lld values, not rows of 5", m->rows->name,
                       (long long)n);
  if (n > m->cap) {
    float *p = realloc(m->host, (size_t)n * sizeof *p);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for %lld detection rows", (long long)n / 5);
    m->host = p;
    m->cap = n;
  }
  KILN_TRY(kiln_net_blob_read(net, m->rows, m->host, n));
  const int rc = kiln_map_add(m->map, m->host, n / 5);
  return rc ? kiln_error_context(rc, "'%s': ", m->rows->name) : KILN_OK;
}

int kiln_net_map_result(kiln_net_map *m, kiln_ap_version v, double *map, int *nclasses) {
  return kiln_map_result(m->map, v, map, nclasses);
}

int kiln_net_map_per_class(kiln_net_map *m, kiln_ap_version v, int cap, int *label, double *ap,
                           int64_t *positives, int *n) {
  return kiln_map_per_class(m->map, v, cap, label, ap, positives, n);
}

int kiln_net_map_output(const kiln_net_map *m) { return m->output; }

void kiln_net_map_free(kiln_net_map *m) {
  if (!m) return;
  kiln_map_free(m->map);
  free(m->host);
  free(m);
}
