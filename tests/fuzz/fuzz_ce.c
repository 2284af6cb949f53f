/* The readers of continuous evaluation: the first byte picks the metrics file of a training run
 * or a decode (JSON Lines, read after every run, possibly cut off by a kill), a suite or a
 * baseline file (text format, then each field's range and the cross-checks). Figures derived
 * from the metrics (the KPI values, the wait discount) are computed too, as `kiln ce run`
 * does. */
#include <math.h>
#include <stdio.h>

#include "fuzz.h"
#include "kiln/ce.h"

static void metrics(const uint8_t *data, size_t size) {
  kiln_ce_metrics m;
  if (kiln_ce_metrics_parse((const char *)data, size, "fuzz.jsonl", &m) != KILN_OK) return;
  kiln_ce_metrics_discount_wait(&m, size & 1 ? NAN : (double)(size % 7));
  static const char *kpis[] = {"accuracy",   "f1",         "test_loss",     "train_loss",
                               "perplexity", "duration_s", "samples_per_s", "peak_rss_mb",
                               "per",        "word_accuracy"};
  for (size_t i = 0; i < sizeof kpis / sizeof *kpis; i++) {
    Caffe__CeKpi c = CAFFE__CE_KPI__INIT;
    c.name = (char *)kpis[i];
    c.has_reduction = 1;
    c.reduction = (Caffe__CeKpi__Reduction)((size + i) % 3);
    c.has_mean_last_n = 1;
    c.mean_last_n = (int32_t)(size % 5);
    kiln_ce_kpi_spec k;
    if (kiln_ce_kpi_resolve(&c, &k) == KILN_OK) (void)kiln_ce_kpi_value(&m, &k);
  }
  kiln_ce_metrics_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 3) {
  case 0:
    metrics(data + 1, size - 1);
    break;
  case 1: {
    const char *path = fuzz_temp_file(data + 1, size - 1, ".prototxt");
    Caffe__CeSuite *s = NULL;
    if (path && kiln_ce_suite_load(path, &s) == KILN_OK) protobuf_c_message_free_unpacked(&s->base, NULL);
    if (path) remove(path);
    break;
  }
  default: {
    const char *path = fuzz_temp_file(data + 1, size - 1, ".prototxt");
    Caffe__CeBaseline *b = NULL;
    if (path && kiln_ce_baseline_read(path, &b) == KILN_OK) protobuf_c_message_free_unpacked(&b->base, NULL);
    if (path) remove(path);
    break;
  }
  }
  return 0;
}
