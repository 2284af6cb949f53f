/* The figures a test pass derives from the means of a net's outputs (include/kiln/net.h,
 * kiln_net_derived_metrics), in one place so that the solver's test events and `kiln test`
 * report the same ones: perplexity from a per-token cross-entropy, and precision, recall and F1
 * from an F1 layer's counts. The counts' means are the pooled counts divided by the number of
 * batches, which cancels in every ratio, so those three are exactly the whole pass's, however
 * the batches differ; a mean of each batch's F1 would not be. */
#include <math.h>
#include <stdio.h>
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
