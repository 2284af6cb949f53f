/* Continuous evaluation: KPI extraction from metrics JSON Lines (ranks, nulls, a cut-off last
 * line), reductions and statistics, KPI defaults, baseline verdicts with tolerances and the noise
 * rule, absolute checks (crash, timeout, NaN, floor, a run that ended early, a model that does not
 * learn), machine classes, the text-format writer, baseline files and accept, the SQLite history
 * (including a writer killed in the middle of a run) and the reports. Files live in a mkdtemp()
 * folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ce_support.h"
#include "gradcheck.h"
#include "kiln/ce.h"

static char dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-ce-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static kiln_ce_kpi_spec spec_of(const char *text) {
  ProtobufCMessage *m;
  if (kiln_text_parse(text, strlen(text), "kpi", &caffe__ce_kpi__descriptor, &m))
    fail_msg("%s", kiln_last_error());
  kiln_ce_kpi_spec s;
  if (kiln_ce_kpi_resolve((Caffe__CeKpi *)m, &s)) fail_msg("%s", kiln_last_error());
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* ---- metrics ------------------------------------------------------------------------------- */

static const char metrics_text[] =
    "{\"event\":\"test\",\"iter\":0,\"time_ms\":10,\"rank\":0,\"loss\":2.3,\"test_net\":0,"
    "\"accuracy\":0.1,\"peak_rss_mb\":50}\n"
    "{\"event\":\"train\",\"iter\":0,\"time_ms\":20,\"rank\":0,\"loss\":2.3,\"lr\":0.01,"
    "\"samples_per_s\":10,\"peak_rss_mb\":51}\n"
    "{\"event\":\"train\",\"iter\":100,\"time_ms\":1000,\"rank\":0,\"loss\":0.9,\"lr\":0.01,"
    "\"samples_per_s\":1000,\"peak_rss_mb\":60,\"accuracy\":0.5}\n"
    "{\"event\":\"train\",\"iter\":200,\"time_ms\":2000,\"rank\":0,\"loss\":0.7,\"lr\":0.01,"
    "\"samples_per_s\":1200,\"peak_rss_mb\":61,\"accuracy\":0.75}\n"
    "{\"event\":\"train\",\"iter\":200,\"time_ms\":2000,\"rank\":1,\"loss\":0.7,\"lr\":0.01,"
    "\"accuracy\":0.01}\n"
    "{\"event\":\"test\",\"iter\":200,\"time_ms\":2100,\"rank\":0,\"loss\":0.6,\"test_net\":0,"
    "\"accuracy\":0.8,\"f1\":0.75,\"mAP\":0.625,\"peak_rss_mb\":62}\n"
    "{\"event\":\"test\",\"iter\":200,\"time_ms\":2100,\"rank\":0,\"loss\":9,\"test_net\":1,"
    "\"accuracy\":0.01,\"f1\":0.01,\"mAP\":0.01}\n"
    "{\"event\":\"train\",\"iter\":300,\"time_ms\":3000,\"rank\":0,\"loss\":0.5,\"lr\":0.01,"
    "\"samples_per_s\":1100,\"peak_rss_mb\":63,\"accuracy\":0.875}\n"
    "\n"
    "{\"event\":\"test\",\"iter\":400,\"time_ms\":4000,\"rank\":0,\"loss\":0.4,\"test_net\":0,"
    "\"accuracy\":0.85,\"f1\":0.7,\"mAP\":0.75,\"peak_rss_mb\":64}\n"
    "{\"event\":\"worker\",\"iter\":400,\"time_ms\":4000,\"rank\":0,\"samples_per_s\":550}\n"
    "{\"event\":\"worker\",\"iter\":400,\"time_ms\":4000,\"rank\":1,\"samples_per_s\":540,"
    "\"peak_rss_mb\":70}\n"
    "{\"event\":\"done\",\"iter\":400,\"time_ms\":4200,\"rank\":0,\"peak_rss_mb\":64,"
    "\"peak_device_mb\":31.5}\n";

static void test_metrics_extraction(void **state) {
  (void)state;
  kiln_ce_metrics m;
  int rc = kiln_ce_metrics_parse(metrics_text, strlen(metrics_text), "m.jsonl", &m);
  assert_int_equal(rc, KILN_OK);
  assert_int_equal(m.train_loss.n, 4);
  assert_int_equal(m.test_loss.n, 3); /* test net 1 is not the model's figure */
  assert_int_equal(m.accuracy.n, 3); /* the test events' only: train accuracy is apart */
  assert_float_equal(m.accuracy.value[2], 0.85, 1e-12);
  /* the train events of rank 0 that report an accuracy (the first has none; rank 1's is not
   * the model's figure) */
  assert_int_equal(m.train_accuracy.n, 3);
  assert_int_equal(m.train_accuracy.iter[0], 100);
  assert_float_equal(m.train_accuracy.value[0], 0.5, 1e-12);
  assert_float_equal(m.train_accuracy.value[1], 0.75, 1e-12);
  assert_float_equal(m.train_accuracy.value[2], 0.875, 1e-12);
  assert_int_equal(m.accuracy.iter[2], 400);
  assert_float_equal(m.perplexity.value[0], exp(2.3), 1e-9);
  /* f1 where the test events of test net 0 have it */
  assert_int_equal(m.f1.n, 2);
  assert_int_equal(m.f1.iter[0], 200);
  assert_float_equal(m.f1.value[1], 0.7, 1e-12);
  /* mAP likewise (a detection net's DetectionEvaluate, over the pass) */
  assert_int_equal(m.map.n, 2);
  assert_float_equal(m.map.value[0], 0.625, 1e-12);
  assert_float_equal(m.map.value[1], 0.75, 1e-12);
  assert_float_equal(m.peak_rss_mb, 70, 0); /* the largest over every rank */
  assert_float_equal(m.peak_device_mb, 31.5, 0);
  assert_float_equal(m.duration_s, 4.2, 1e-12);
  /* the first window (start-up) is left out: median of 1000, 1200, 1100 */
  assert_float_equal(m.samples_per_s, 1100, 1e-9);
  assert_true(m.done);
  assert_int_equal(m.last_iter, 400);
  assert_int_equal(m.nonfinite_iter, -1);
  assert_int_equal(m.nranks, 2);
  assert_int_equal(m.nworkers_reported, 2);
  assert_false(m.truncated_tail);

  kiln_ce_kpi_spec acc = spec_of("name: 'accuracy'");
  assert_float_equal(kiln_ce_kpi_value(&m, &acc), 0.85, 1e-12);
  kiln_ce_kpi_spec f1 = spec_of("name: 'f1' reduction: BEST"); /* higher is better */
  assert_float_equal(kiln_ce_kpi_value(&m, &f1), 0.75, 1e-12);
  kiln_ce_kpi_spec map = spec_of("name: 'mAP'");
  assert_float_equal(kiln_ce_kpi_value(&m, &map), 0.75, 1e-12); /* the last pass's */
  kiln_ce_kpi_spec best = spec_of("name: 'test_loss' reduction: BEST");
  assert_float_equal(kiln_ce_kpi_value(&m, &best), 0.4, 1e-12);
  kiln_ce_kpi_spec mean = spec_of("name: 'train_loss' reduction: MEAN_LAST mean_last_n: 2");
  assert_float_equal(kiln_ce_kpi_value(&m, &mean), 0.6, 1e-12);
  kiln_ce_kpi_spec ta = spec_of("name: 'train_accuracy'");
  assert_float_equal(kiln_ce_kpi_value(&m, &ta), 0.875, 1e-12);
  kiln_ce_kpi_spec ta_mean = spec_of("name: 'train_accuracy' reduction: MEAN_LAST mean_last_n: 2");
  assert_float_equal(kiln_ce_kpi_value(&m, &ta_mean), (0.75 + 0.875) / 2, 1e-12);
  kiln_ce_kpi_spec dur = spec_of("name: 'duration_s'");
  assert_float_equal(kiln_ce_kpi_value(&m, &dur), 4.2, 1e-12);
  kiln_ce_kpi_spec rss = spec_of("name: 'peak_rss_mb'");
  assert_float_equal(kiln_ce_kpi_value(&m, &rss), 70, 0);
  kiln_ce_metrics_free(&m);
}

static void test_metrics_nan_and_damage(void **state) {
  (void)state;
  /* kiln writes a non-finite loss as null; the run then has a NaN at that iteration */
  const char *nan_text =
      "{\"event\":\"train\",\"iter\":0,\"time_ms\":1,\"rank\":0,\"loss\":2.3,\"samples_per_s\":5}\n"
      "{\"event\":\"train\",\"iter\":10,\"time_ms\":2,\"rank\":0,\"loss\":null,"
      "\"samples_per_s\":5}\n"
      "{\"event\":\"train\",\"iter\":20,\"time_ms\":3,\"rank\":0,\"loss\":null,"
      "\"samples_per_s\":5}\n";
  kiln_ce_metrics m;
  assert_int_equal(kiln_ce_metrics_parse(nan_text, strlen(nan_text), "nan.jsonl", &m), KILN_OK);
  assert_int_equal(m.nonfinite_iter, 10);
  assert_false(m.done);
  assert_true(isnan(m.duration_s));
  kiln_ce_kpi_spec loss = spec_of("name: 'train_loss' reduction: BEST");
  assert_true(isnan(kiln_ce_kpi_value(&m, &loss))); /* BEST must not skip over the NaN */
  kiln_ce_metrics_free(&m);

  /* a writer killed mid-line: the cut-off last line is skipped */
  const char *cut = "{\"event\":\"train\",\"iter\":0,\"time_ms\":1,\"rank\":0,\"loss\":2.3}\n"
                    "{\"event\":\"train\",\"iter\":10,\"ti";
  assert_int_equal(kiln_ce_metrics_parse(cut, strlen(cut), "cut.jsonl", &m), KILN_OK);
  assert_true(m.truncated_tail);
  assert_int_equal(m.train_loss.n, 1);
  kiln_ce_metrics_free(&m);

  /* damage anywhere else is an error naming the line */
  const char *bad = "{\"event\":\"train\",\"iter\":0}\nnot json\n{\"event\":\"done\",\"iter\":1}\n";
  assert_int_equal(kiln_ce_metrics_parse(bad, strlen(bad), "bad.jsonl", &m), KILN_ERR_PARSE);
  assert_contains(kiln_last_error(), "bad.jsonl:2");
  /* an iteration or rank that is no int (it used to be cast, undefined beyond INT_MAX) */
  const char *huge = "{\"event\":\"train\",\"iter\":0}\n{\"event\":\"train\",\"iter\":3e89}\n{}\n";
  assert_int_equal(kiln_ce_metrics_parse(huge, strlen(huge), "huge.jsonl", &m), KILN_ERR_PARSE);
  assert_contains(kiln_last_error(), "huge.jsonl:2: \"iter\" is 3e+89");
  const char *neg = "{\"event\":\"test\",\"iter\":5,\"rank\":-1}\n{}\n";
  assert_int_equal(kiln_ce_metrics_parse(neg, strlen(neg), "neg.jsonl", &m), KILN_ERR_PARSE);
  assert_contains(kiln_last_error(), "neg.jsonl:1: \"rank\"");

  char path[128];
  snprintf(path, sizeof path, "%s/nothere.jsonl", dir);
  assert_int_equal(kiln_ce_metrics_read(path, &m), KILN_ERR_IO);
}

/* `kiln decode --metrics` writes one "decode" event; its figures become the KPIs per and
 * word_accuracy of the training run they judge. */
static void test_metrics_decode(void **state) {
  (void)state;
  const char *text =
      "{\"event\":\"decode\",\"iter\":0,\"time_ms\":812.5,\"rank\":0,\"per\":0.1045,"
      "\"word_accuracy\":0.617,\"words\":12535,\"beam\":0,\"peak_rss_mb\":60}\n"
      "{\"event\":\"decode\",\"iter\":0,\"time_ms\":9,\"rank\":1,\"per\":0.9,"
      "\"word_accuracy\":0,\"words\":3}\n";
  kiln_ce_metrics d;
  assert_int_equal(kiln_ce_metrics_parse(text, strlen(text), "decode.jsonl", &d), KILN_OK);
  assert_true(d.decoded);
  assert_float_equal(d.per, 0.1045, 1e-12); /* rank 0's: the figures are the model's */
  assert_float_equal(d.word_accuracy, 0.617, 1e-12);
  assert_int_equal(d.decode_words, 12535);
  assert_false(d.done);

  kiln_ce_kpi_spec per = spec_of("name: 'per'");
  kiln_ce_kpi_spec words = spec_of("name: 'word_accuracy'");
  kiln_ce_metrics m;
  assert_int_equal(kiln_ce_metrics_parse(metrics_text, strlen(metrics_text), "m.jsonl", &m),
                   KILN_OK);
  assert_false(m.decoded); /* a training's metrics have no decode figures */
  assert_true(isnan(kiln_ce_kpi_value(&m, &per)));
  assert_true(isnan(kiln_ce_kpi_value(&m, &words)));
  kiln_ce_metrics_take_decode(&m, &d);
  assert_true(m.decoded);
  assert_float_equal(kiln_ce_kpi_value(&m, &per), 0.1045, 1e-12);
  assert_float_equal(kiln_ce_kpi_value(&m, &words), 0.617, 1e-12);
  assert_float_equal(m.peak_rss_mb, 70, 0); /* the training's memory, not the decode's */
  kiln_ce_metrics_free(&m);
  kiln_ce_metrics_free(&d);

  /* a null figure (non-finite) is NaN; a damaged word count is an error naming the line */
  const char *null_per = "{\"event\":\"decode\",\"iter\":0,\"rank\":0,\"per\":null,"
                         "\"word_accuracy\":0.5,\"words\":4}\n";
  assert_int_equal(kiln_ce_metrics_parse(null_per, strlen(null_per), "d", &d), KILN_OK);
  assert_true(d.decoded);
  assert_true(isnan(d.per));
  assert_float_equal(d.word_accuracy, 0.5, 0);
  kiln_ce_metrics_free(&d);
  const char *bad = "{\"event\":\"decode\",\"iter\":0,\"rank\":0,\"per\":0.1,"
                    "\"words\":-2}\n{}\n";
  assert_int_equal(kiln_ce_metrics_parse(bad, strlen(bad), "bad.jsonl", &d), KILN_ERR_PARSE);
  assert_contains(kiln_last_error(), "bad.jsonl:1: \"words\" is -2");
}

/* The trainer's wait for a CPU, as far as other processes' CPU time accounts for it, comes out
 * of the timings: of the duration, and of each throughput window by its own share. */
static void test_metrics_discount_wait(void **state) {
  (void)state;
  static const char text[] =
      "{\"event\":\"train\",\"iter\":0,\"time_ms\":0,\"rank\":0,\"loss\":1,"
      "\"samples_per_s\":10,\"cpu_wait_ms\":0}\n"
      "{\"event\":\"train\",\"iter\":100,\"time_ms\":1000,\"rank\":0,\"loss\":1,"
      "\"samples_per_s\":1000,\"cpu_wait_ms\":0}\n"
      "{\"event\":\"train\",\"iter\":200,\"time_ms\":2000,\"rank\":0,\"loss\":1,"
      "\"samples_per_s\":500,\"cpu_wait_ms\":500}\n"
      "{\"event\":\"train\",\"iter\":300,\"time_ms\":3000,\"rank\":0,\"loss\":1,"
      "\"samples_per_s\":250,\"cpu_wait_ms\":1250}\n"
      "{\"event\":\"done\",\"iter\":300,\"time_ms\":4000,\"rank\":0,\"cpu_wait_ms\":1500}\n";
  kiln_ce_metrics m;
  assert_int_equal(kiln_ce_metrics_parse(text, strlen(text), "w.jsonl", &m), KILN_OK);
  assert_float_equal(m.cpu_wait_s, 1.5, 1e-12);
  assert_float_equal(m.duration_s, 4, 1e-12);
  assert_float_equal(m.samples_per_s, 500, 1e-9); /* on the wall clock: 1000, 500, 250 */
  assert_int_equal(m.window_sps.n, 4);
  /* other processes used plenty of CPU: the whole wait was theirs */
  kiln_ce_metrics_discount_wait(&m, 10);
  assert_float_equal(m.discounted_wait_s, 1.5, 1e-12);
  assert_float_equal(m.duration_s, 2.5, 1e-12);
  assert_float_equal(m.samples_per_s, 1000, 1e-9); /* every window back to 1000 */
  assert_float_equal(m.wall_duration_s, 4, 1e-12);
  assert_float_equal(m.wall_samples_per_s, 500, 1e-9);
  /* they used 0.75 CPU-s: half the wait is theirs, the other half the trainer's own */
  kiln_ce_metrics_discount_wait(&m, 0.75);
  assert_float_equal(m.discounted_wait_s, 0.75, 1e-12);
  assert_float_equal(m.duration_s, 3.25, 1e-12);
  assert_float_equal(m.samples_per_s, 500.0 * 1000 / 750, 1e-9); /* 1000, 666.7, 400 */
  /* nobody else ran, or nothing is known: the wall clock stands */
  kiln_ce_metrics_discount_wait(&m, 0);
  assert_float_equal(m.duration_s, 4, 1e-12);
  assert_float_equal(m.samples_per_s, 500, 1e-9);
  assert_float_equal(m.discounted_wait_s, 0, 0);
  kiln_ce_metrics_discount_wait(&m, NAN);
  assert_float_equal(m.duration_s, 4, 1e-12);
  kiln_ce_metrics_free(&m);
  /* metrics without cpu_wait_ms (an older trainer): nothing changes */
  assert_int_equal(kiln_ce_metrics_parse(metrics_text, strlen(metrics_text), "m.jsonl", &m),
                   KILN_OK);
  assert_true(isnan(m.cpu_wait_s));
  kiln_ce_metrics_discount_wait(&m, 10);
  assert_float_equal(m.duration_s, 4.2, 1e-12);
  assert_float_equal(m.samples_per_s, 1100, 1e-9);
  kiln_ce_metrics_free(&m);
}

/* ---- reductions and statistics -------------------------------------------------------------- */

static void test_reductions(void **state) {
  (void)state;
  const double v[] = {0.5, 0.9, 0.7, 0.8};
  const int L = CAFFE__CE_KPI__REDUCTION__LAST, B = CAFFE__CE_KPI__REDUCTION__BEST,
            M = CAFFE__CE_KPI__REDUCTION__MEAN_LAST;
  assert_float_equal(kiln_ce_reduce(v, 4, L, 3, true), 0.8, 0);
  assert_float_equal(kiln_ce_reduce(v, 4, B, 3, true), 0.9, 0);
  assert_float_equal(kiln_ce_reduce(v, 4, B, 3, false), 0.5, 0);
  assert_float_equal(kiln_ce_reduce(v, 4, M, 2, true), 0.75, 1e-15);
  assert_float_equal(kiln_ce_reduce(v, 4, M, 10, true), 0.725, 1e-15); /* n beyond the series */
  assert_true(isnan(kiln_ce_reduce(v, 0, L, 3, true)));
  const double withnan[] = {0.5, NAN, 0.8};
  assert_true(isnan(kiln_ce_reduce(withnan, 3, L, 1, true)));

  const double odd[] = {3, 1, 2}, even[] = {4, 1, 3, 2};
  assert_float_equal(kiln_ce_median(odd, 3), 2, 0);
  assert_float_equal(kiln_ce_median(even, 4), 2.5, 0);
  assert_true(isnan(kiln_ce_median(odd, 0)));
  assert_float_equal(kiln_ce_stddev(odd, 3), 1, 1e-15);
  assert_float_equal(kiln_ce_stddev(odd, 1), 0, 0);
}

static void test_kpi_defaults(void **state) {
  (void)state;
  kiln_ce_kpi_spec a = spec_of("name: 'accuracy'");
  assert_true(a.higher_is_better);
  assert_float_equal(a.floor, 0.5, 0); /* accuracy's floor unless declared */
  assert_true(isnan(a.ceiling));
  assert_true(a.abs_tolerance > 0);
  kiln_ce_kpi_spec d = spec_of("name: 'duration_s'");
  assert_false(d.higher_is_better);
  assert_true(d.info->timing && d.info->machine_dependent);
  assert_true(isnan(d.floor));
  kiln_ce_kpi_spec own = spec_of("name: 'accuracy' direction: LOWER rel_tolerance: 0.2 floor: 0.8");
  assert_false(own.higher_is_better);
  assert_float_equal(own.rel_tolerance, 0.2, 0);
  assert_float_equal(own.abs_tolerance, 0, 0); /* declared tolerances replace both defaults */
  assert_float_equal(own.floor, 0.8, 0);
  assert_false(kiln_ce_kpi_lookup("accuracy")->machine_dependent);
  /* train accuracy: higher is better, machine-independent, no floor unless declared */
  kiln_ce_kpi_spec ta = spec_of("name: 'train_accuracy'");
  assert_true(ta.higher_is_better);
  assert_false(ta.info->machine_dependent || ta.info->timing || ta.info->multi_worker ||
               ta.info->decoded);
  assert_true(isnan(ta.floor) && isnan(ta.ceiling));
  assert_true(ta.abs_tolerance > 0);
  assert_contains(kiln_ce_kpi_names(), "train_accuracy");
  kiln_ce_kpi_spec map = spec_of("name: 'mAP'");
  assert_true(map.higher_is_better);
  assert_false(map.info->machine_dependent || map.info->timing || map.info->multi_worker);
  assert_true(isnan(map.floor));
  assert_contains(kiln_ce_kpi_names(), "mAP");
  kiln_ce_kpi_spec f = spec_of("name: 'f1'");
  assert_true(f.higher_is_better);
  assert_false(f.info->machine_dependent || f.info->timing);
  assert_true(isnan(f.floor)); /* no floor unless declared: what is good depends on the task */
  assert_true(f.abs_tolerance > 0);
  assert_true(kiln_ce_kpi_lookup("speedup")->multi_worker);
  /* the decode's figures: machine-independent, no floor unless declared, only with decode */
  kiln_ce_kpi_spec per = spec_of("name: 'per'");
  assert_false(per.higher_is_better);
  assert_true(per.info->decoded);
  assert_false(per.info->machine_dependent || per.info->timing || per.info->multi_worker);
  assert_true(isnan(per.floor) && isnan(per.ceiling));
  assert_true(per.abs_tolerance > 0);
  kiln_ce_kpi_spec wa = spec_of("name: 'word_accuracy' floor: 0.2");
  assert_true(wa.higher_is_better);
  assert_true(wa.info->decoded);
  assert_false(wa.info->machine_dependent || wa.info->timing);
  assert_float_equal(wa.floor, 0.2, 0);
  assert_false(kiln_ce_kpi_lookup("accuracy")->decoded);
  assert_contains(kiln_ce_kpi_names(), "per, word_accuracy");

  ProtobufCMessage *m;
  const char *t = "name: 'acuracy'";
  assert_int_equal(kiln_text_parse(t, strlen(t), "k", &caffe__ce_kpi__descriptor, &m), KILN_OK);
  kiln_ce_kpi_spec s;
  assert_int_equal(kiln_ce_kpi_resolve((Caffe__CeKpi *)m, &s), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "unknown KPI 'acuracy'");
  assert_contains(kiln_last_error(), "samples_per_s");
  protobuf_c_message_free_unpacked(m, NULL);
  t = "name: 'accuracy' abs_tolerance: -1";
  assert_int_equal(kiln_text_parse(t, strlen(t), "k", &caffe__ce_kpi__descriptor, &m), KILN_OK);
  assert_int_equal(kiln_ce_kpi_resolve((Caffe__CeKpi *)m, &s), KILN_ERR_INVALID);
  protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- verdicts ------------------------------------------------------------------------------ */

static void test_compare_tolerances_and_noise(void **state) {
  (void)state;
  char why[512];
  double tol, change;
  kiln_ce_kpi_spec acc = spec_of("name: 'accuracy' abs_tolerance: 0.01");
  assert_int_equal(kiln_ce_compare(&acc, 0.845, 0, 0.85, 0, 3, &tol, &change, why, sizeof why),
                   KILN_CE_PASS);
  assert_float_equal(tol, 0.01, 1e-15);
  assert_float_equal(change, (0.845 - 0.85) / 0.85, 1e-12);
  assert_int_equal(why[0], '\0');
  assert_int_equal(kiln_ce_compare(&acc, 0.83, 0, 0.85, 0, 3, &tol, &change, why, sizeof why),
                   KILN_CE_REGRESSION);
  assert_contains(why, "worse than the baseline 0.85");
  assert_int_equal(kiln_ce_compare(&acc, 0.87, 0, 0.85, 0, 3, &tol, &change, why, sizeof why),
                   KILN_CE_IMPROVED);
  assert_contains(why, "kiln ce accept");

  /* lower is better: a longer duration is the regression; the larger of rel and abs applies */
  kiln_ce_kpi_spec dur = spec_of("name: 'duration_s' rel_tolerance: 0.1 abs_tolerance: 0.5");
  assert_int_equal(kiln_ce_compare(&dur, 10.9, 0, 10, 0, 3, &tol, NULL, NULL, 0), KILN_CE_PASS);
  assert_float_equal(tol, 1.0, 1e-12);
  assert_int_equal(kiln_ce_compare(&dur, 11.2, 0, 10, 0, 3, &tol, NULL, NULL, 0),
                   KILN_CE_REGRESSION);
  assert_int_equal(kiln_ce_compare(&dur, 8.5, 0, 10, 0, 3, &tol, NULL, NULL, 0), KILN_CE_IMPROVED);
  kiln_ce_kpi_spec small = spec_of("name: 'duration_s' rel_tolerance: 0.01 abs_tolerance: 0.5");
  assert_int_equal(kiln_ce_compare(&small, 10.4, 0, 10, 0, 3, &tol, NULL, NULL, 0), KILN_CE_PASS);
  assert_float_equal(tol, 0.5, 1e-12);

  /* noise: k x the larger spread widens the tolerance, from this run or from the baseline */
  assert_int_equal(kiln_ce_compare(&dur, 11.5, 0.6, 10, 0, 3, &tol, NULL, why, sizeof why),
                   KILN_CE_PASS);
  assert_float_equal(tol, 1.8, 1e-12);
  assert_int_equal(kiln_ce_compare(&dur, 11.5, 0, 10, 0.6, 3, &tol, NULL, NULL, 0), KILN_CE_PASS);
  assert_int_equal(kiln_ce_compare(&dur, 12.0, 0.6, 10, 0, 3, &tol, NULL, why, sizeof why),
                   KILN_CE_REGRESSION);
  assert_contains(why, "widened by noise");
  /* noise_k 0 switches the rule off */
  assert_int_equal(kiln_ce_compare(&dur, 11.5, 0.6, 10, 0, 0, &tol, NULL, NULL, 0),
                   KILN_CE_REGRESSION);
}

static void test_absolute_checks(void **state) {
  (void)state;
  char why[512];
  kiln_ce_kpi_spec acc = spec_of("name: 'accuracy' floor: 0.8");
  kiln_ce_run_facts ok = {.planned_iter = 1500, .reached_iter = 1500, .epochs = 1.6,
                          .min_epochs_learning = 3};
  assert_false(kiln_ce_kpi_failed(&acc, 0.85, &ok, why, sizeof why));
  assert_true(kiln_ce_kpi_failed(&acc, 0.7, &ok, why, sizeof why));
  assert_contains(why, "under the floor 0.8");
  assert_true(kiln_ce_kpi_failed(&acc, NAN, &ok, why, sizeof why));
  assert_contains(why, "nan");

  kiln_ce_run_facts early = {.planned_iter = 1500, .reached_iter = 50, .epochs = NAN,
                             .min_epochs_learning = 3};
  assert_true(kiln_ce_kpi_failed(&acc, 0.3, &early, why, sizeof why));
  assert_contains(why, "ended early, at iteration 50 of 1500");
  kiln_ce_run_facts many = {.planned_iter = 5000, .reached_iter = 5000, .epochs = 5.3,
                            .min_epochs_learning = 3};
  assert_true(kiln_ce_kpi_failed(&acc, 0.1, &many, why, sizeof why));
  assert_contains(why, "after 5.3 epochs");
  assert_contains(why, "not learning");
  kiln_ce_run_facts tiny = {.planned_iter = 20, .reached_iter = 20, .epochs = 0.02,
                            .min_epochs_learning = 3};
  assert_true(kiln_ce_kpi_failed(&acc, 0.3, &tiny, why, sizeof why));
  assert_contains(why, "too short to mean anything");

  kiln_ce_kpi_spec rss = spec_of("name: 'peak_rss_mb' ceiling: 200");
  assert_false(kiln_ce_kpi_failed(&rss, 150, NULL, why, sizeof why));
  assert_true(kiln_ce_kpi_failed(&rss, 250, NULL, why, sizeof why));
  assert_contains(why, "above the ceiling 200");

  /* run-level */
  kiln_ce_metrics m;
  const char *text = "{\"event\":\"done\",\"iter\":10,\"time_ms\":5,\"rank\":0}\n";
  assert_int_equal(kiln_ce_metrics_parse(text, strlen(text), "m", &m), KILN_OK);
  kiln_ce_child c = {.end = KILN_CE_CHILD_EXITED, .code = 0};
  assert_false(kiln_ce_run_failed(&c, &m, why, sizeof why));
  c = (kiln_ce_child){.end = KILN_CE_CHILD_SIGNALED, .code = SIGSEGV};
  assert_true(kiln_ce_run_failed(&c, &m, why, sizeof why));
  assert_contains(why, "crashed: killed by signal 11");
  c = (kiln_ce_child){.end = KILN_CE_CHILD_TIMEOUT, .wall_s = 61, .timeout_s = 60};
  assert_true(kiln_ce_run_failed(&c, &m, why, sizeof why));
  assert_contains(why, "timed out");
  assert_contains(why, "timeout_seconds 60");
  c = (kiln_ce_child){.end = KILN_CE_CHILD_EXITED, .code = 1};
  snprintf(c.last_error, sizeof c.last_error,
           "kiln: train: iteration 3: the loss is nan; training diverged (lower base_lr)");
  assert_true(kiln_ce_run_failed(&c, &m, why, sizeof why));
  assert_contains(why, "NaN or infinite loss");
  snprintf(c.last_error, sizeof c.last_error, "kiln: train: data: no such file");
  assert_true(kiln_ce_run_failed(&c, &m, why, sizeof why));
  assert_contains(why, "failed (exit 1): kiln: train: data: no such file");
  kiln_ce_metrics_free(&m);

  const char *nan_text = "{\"event\":\"train\",\"iter\":7,\"rank\":0,\"loss\":null}\n"
                         "{\"event\":\"done\",\"iter\":10,\"time_ms\":5,\"rank\":0}\n";
  assert_int_equal(kiln_ce_metrics_parse(nan_text, strlen(nan_text), "m", &m), KILN_OK);
  c = (kiln_ce_child){.end = KILN_CE_CHILD_EXITED, .code = 0};
  assert_true(kiln_ce_run_failed(&c, &m, why, sizeof why));
  assert_contains(why, "NaN or infinite loss at iteration 7");
  kiln_ce_metrics_free(&m);
  const char *nodone = "{\"event\":\"train\",\"iter\":7,\"rank\":0,\"loss\":1}\n";
  assert_int_equal(kiln_ce_metrics_parse(nodone, strlen(nodone), "m", &m), KILN_OK);
  assert_true(kiln_ce_run_failed(&c, &m, why, sizeof why));
  assert_contains(why, "without a \"done\" event");
  kiln_ce_metrics_free(&m);

  /* the decode after training, each failure naming the decode */
  const char *decoded = "{\"event\":\"decode\",\"iter\":0,\"rank\":0,\"per\":0.2,"
                        "\"word_accuracy\":0.4,\"words\":10}\n";
  assert_int_equal(kiln_ce_metrics_parse(decoded, strlen(decoded), "d", &m), KILN_OK);
  c = (kiln_ce_child){.end = KILN_CE_CHILD_EXITED, .code = 0};
  assert_false(kiln_ce_decode_failed(&c, &m, why, sizeof why));
  assert_true(kiln_ce_decode_failed(&c, NULL, why, sizeof why)); /* no readable metrics */
  assert_contains(why, "kiln decode wrote no \"decode\" event");
  c = (kiln_ce_child){.end = KILN_CE_CHILD_EXITED, .code = 1};
  snprintf(c.last_error, sizeof c.last_error, "kiln: decode: d.prototxt: no such file");
  assert_true(kiln_ce_decode_failed(&c, &m, why, sizeof why));
  assert_contains(why, "kiln decode failed (exit 1): kiln: decode: d.prototxt: no such file");
  c = (kiln_ce_child){.end = KILN_CE_CHILD_SIGNALED, .code = SIGSEGV};
  assert_true(kiln_ce_decode_failed(&c, &m, why, sizeof why));
  assert_contains(why, "kiln decode crashed: killed by signal 11");
  c = (kiln_ce_child){.end = KILN_CE_CHILD_TIMEOUT, .wall_s = 61, .timeout_s = 60};
  assert_true(kiln_ce_decode_failed(&c, &m, why, sizeof why));
  assert_contains(why, "still decoding after 61 s (timeout_seconds 60)");
  c = (kiln_ce_child){.end = KILN_CE_CHILD_NOT_STARTED};
  assert_true(kiln_ce_decode_failed(&c, &m, why, sizeof why));
  assert_contains(why, "the decode could not be started");
  kiln_ce_metrics_free(&m);
  assert_int_equal(kiln_ce_metrics_parse(nodone, strlen(nodone), "m", &m), KILN_OK);
  c = (kiln_ce_child){.end = KILN_CE_CHILD_EXITED, .code = 0};
  assert_true(kiln_ce_decode_failed(&c, &m, why, sizeof why)); /* metrics without the event */
  assert_contains(why, "no \"decode\" event");
  kiln_ce_metrics_free(&m);
}

static void test_exit_codes(void **state) {
  (void)state;
  kiln_ce_result r;
  memset(&r, 0, sizeof r);
  assert_int_equal(kiln_ce_result_exit_code(&r), 0);
  kiln_ce_row row = make_row("m", 1, "accuracy", 0.9, KILN_CE_PASS);
  kiln_ce_result_add_row(&r, &row);
  row.verdict = KILN_CE_SKIP;
  kiln_ce_result_add_row(&r, &row);
  row.verdict = KILN_CE_NEW;
  kiln_ce_result_add_row(&r, &row);
  assert_int_equal(kiln_ce_result_exit_code(&r), 0);
  row.verdict = KILN_CE_REGRESSION;
  kiln_ce_result_add_row(&r, &row);
  assert_int_equal(kiln_ce_result_exit_code(&r), 1);
  row.verdict = KILN_CE_ERROR;
  kiln_ce_result_add_row(&r, &row);
  assert_int_equal(kiln_ce_result_exit_code(&r), 3);
  row.verdict = KILN_CE_FAIL;
  kiln_ce_result_add_row(&r, &row);
  assert_int_equal(kiln_ce_result_exit_code(&r), 2); /* a real failure is never masked */
  kiln_ce_result_free(&r);
}

/* ---- text format writer ---------------------------------------------------------------------- */

static void test_text_format_round_trip(void **state) {
  (void)state;
  const char *text = "net: \"a \\\"b\\\".prototxt\"\nbase_lr: 0.01\ntest_iter: 5\ntest_iter: 7\n"
                     "max_iter: 1500\nlr_policy: \"inv\"\nsolver_mode: CPU\nrandom_seed: -3\n"
                     "snapshot_after_train: false\nclip_gradients: 1e-07\n";
  ProtobufCMessage *m, *back;
  const ProtobufCMessageDescriptor *sd = &caffe__solver_parameter__descriptor;
  assert_int_equal(kiln_text_parse(text, strlen(text), "s", sd, &m), KILN_OK);
  char *out;
  assert_int_equal(kiln_text_format(m, &out), KILN_OK);
  assert_contains(out, "base_lr: 0.01\n"); /* the shortest form, not 0.00999999978 */
  assert_contains(out, "solver_mode: CPU\n");
  assert_contains(out, "snapshot_after_train: false\n");
  assert_contains(out, "net: \"a \\\"b\\\".prototxt\"\n");
  assert_null(strstr(out, "momentum")); /* unset fields stay out */
  assert_int_equal(kiln_text_parse(out, strlen(out), "out", sd, &back), KILN_OK);
  uint8_t a[1024], b[1024];
  size_t na = protobuf_c_message_get_packed_size(m), nb = protobuf_c_message_get_packed_size(back);
  assert_int_equal(na, nb);
  protobuf_c_message_pack(m, a);
  protobuf_c_message_pack(back, b);
  assert_memory_equal(a, b, na);
  free(out);
  protobuf_c_message_free_unpacked(m, NULL);
  protobuf_c_message_free_unpacked(back, NULL);
}

/* ---- baselines ----------------------------------------------------------------------------- */

static void test_baseline_round_trip_and_accept(void **state) {
  (void)state;
  char bdir[128], path[256];
  snprintf(bdir, sizeof bdir, "%s/baselines", dir);
  kiln_ce_result r;
  memset(&r, 0, sizeof r);
  snprintf(r.machine_class, sizeof r.machine_class, "test-class-2c");
  snprintf(r.git_commit, sizeof r.git_commit, "abc1234");
  r.run_id = 42;
  kiln_ce_row row = make_row("lenet", 1, "accuracy", 0.8523, KILN_CE_NEW);
  kiln_ce_result_add_row(&r, &row);
  row = make_row("lenet", 1, "duration_s", 31.25, KILN_CE_NEW);
  kiln_ce_result_add_row(&r, &row);
  row = make_row("lenet", 2, "run", NAN, KILN_CE_SKIP);
  kiln_ce_result_add_row(&r, &row);
  row = make_row("broken", 1, "run", NAN, KILN_CE_FAIL);
  snprintf(row.reason, sizeof row.reason, "crashed");
  kiln_ce_result_add_row(&r, &row);
  int written = -1;
  assert_int_equal(kiln_ce_accept(&r, bdir, &written), KILN_OK);
  assert_int_equal(written, 1);
  assert_int_equal(r.nwarnings, 1);
  assert_contains(r.warnings[0], "broken: not accepted");

  assert_int_equal(kiln_ce_baseline_path(bdir, "test-class-2c", "lenet", path, sizeof path),
                   KILN_OK);
  Caffe__CeBaseline *b;
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_OK);
  assert_string_equal(b->model, "lenet");
  assert_string_equal(b->machine_class, "test-class-2c");
  assert_string_equal(b->git_commit, "abc1234");
  assert_string_equal(b->config_hash, "0123456789abcdef");
  assert_int_equal(b->run_id, 42);
  assert_int_equal(b->n_value, 2);
  const Caffe__CeBaselineValue *v = kiln_ce_baseline_find(b, "accuracy", 1);
  assert_non_null(v);
  assert_true(v->value == 0.8523); /* exact: doubles written in their shortest exact form */
  assert_true(v->spread == 0.01);
  assert_int_equal(v->samples, 3);
  assert_null(kiln_ce_baseline_find(b, "accuracy", 2));
  assert_null(kiln_ce_baseline_find(b, "speedup", 1));
  protobuf_c_message_free_unpacked(&b->base, NULL);
  char broken[256];
  kiln_ce_baseline_path(bdir, "test-class-2c", "broken", broken, sizeof broken);
  assert_int_not_equal(access(broken, F_OK), 0);

  /* accepting again merges: a new value replaces, a value this run lacks stays */
  kiln_ce_result r2;
  memset(&r2, 0, sizeof r2);
  snprintf(r2.machine_class, sizeof r2.machine_class, "test-class-2c");
  row = make_row("lenet", 1, "accuracy", 0.86, KILN_CE_PASS);
  kiln_ce_result_add_row(&r2, &row);
  assert_int_equal(kiln_ce_accept(&r2, bdir, &written), KILN_OK);
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_OK);
  assert_int_equal(b->n_value, 2);
  assert_true(kiln_ce_baseline_find(b, "accuracy", 1)->value == 0.86);
  assert_true(kiln_ce_baseline_find(b, "duration_s", 1)->value == 31.25);
  protobuf_c_message_free_unpacked(&b->base, NULL);

  /* lookup: this class first, else another class's file */
  char found[64];
  assert_int_equal(kiln_ce_baseline_lookup(bdir, "test-class-2c", "lenet", &b, found, sizeof found),
                   KILN_OK);
  assert_non_null(b);
  assert_string_equal(found, "test-class-2c");
  protobuf_c_message_free_unpacked(&b->base, NULL);
  assert_int_equal(kiln_ce_baseline_lookup(bdir, "other-64c", "lenet", &b, found, sizeof found),
                   KILN_OK);
  assert_non_null(b);
  assert_string_equal(found, "test-class-2c");
  protobuf_c_message_free_unpacked(&b->base, NULL);
  assert_int_equal(kiln_ce_baseline_lookup(bdir, "other-64c", "nomodel", &b, found, sizeof found),
                   KILN_OK);
  assert_null(b);
  /* an empty baseline folder: nothing found, and no class list to sort (UBSan checks the sort) */
  char empty[256];
  snprintf(empty, sizeof empty, "%s/empty", bdir);
  assert_int_equal(mkdir(empty, 0775), 0);
  assert_int_equal(kiln_ce_baseline_lookup(empty, "other-64c", "lenet", &b, found, sizeof found),
                   KILN_OK);
  assert_null(b);
  assert_string_equal(found, "");

  /* baselines that could not judge a run are refused, naming the file and the field */
  const struct {
    const char *text, *error;
  } bad[] = {
      {"model: \"m\"\n", "holds no values"},
      {"model: \"m\" value { kpi: \"accuracy\" value: nan }\n", "KPI 'accuracy' (1 workers): value is not a finite number"},
      {"model: \"m\" value { kpi: \"accuracy\" }\n", "value is missing"},
      {"model: \"m\" value { kpi: \"duration_s\" value: 3 spread: -1 }\n", "spread -1 must be >= 0"},
      {"model: \"m\" value { kpi: \"duration_s\" value: 3 spread: nan }\n", "spread nan must be >= 0"},
      {"model: \"m\" value { kpi: \"duration_s\" value: 3 workers: 0 }\n", "workers 0"},
      {"model: \"m\" value { kpi: \"accuracy\" value: 0.9 } value { kpi: \"accuracy\" value: 0.8 }\n",
       "KPI 'accuracy' (1 workers) given twice"},
      {"model: \"m\" value { value: 3 }\n", "value 1 has no kpi"},
  };
  char bad_path[256];
  snprintf(bad_path, sizeof bad_path, "%s/bad.prototxt", bdir);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_text(bad_path, bad[i].text);
    assert_int_equal(kiln_ce_baseline_read(bad_path, &b), KILN_ERR_INVALID);
    assert_null(b);
    assert_contains(kiln_last_error(), "bad.prototxt");
    if (!strstr(kiln_last_error(), bad[i].error))
      fail_msg("baseline %zu: '%s' lacks '%s'", i, kiln_last_error(), bad[i].error);
  }
  /* a baseline filed under another model or machine class than its own */
  char placed[256];
  snprintf(placed, sizeof placed, "%s/test-class-2c/mm.prototxt", bdir);
  write_text(placed, "model: \"lenet\" value { kpi: \"accuracy\" value: 0.9 }\n");
  assert_int_equal(kiln_ce_baseline_lookup(bdir, "test-class-2c", "mm", &b, found, sizeof found),
                   KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "model 'lenet', but it is the baseline file of 'mm'");
  write_text(placed, "model: \"mm\" machine_class: \"other-1c\" value { kpi: \"accuracy\" value: 0.9 }\n");
  assert_int_equal(kiln_ce_baseline_lookup(bdir, "test-class-2c", "mm", &b, found, sizeof found),
                   KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "machine_class 'other-1c', but it lies in the folder of class 'test-class-2c'");
  remove(placed);

  /* a damaged baseline is an error with its location, not a silent pass */
  snprintf(path, sizeof path, "%s/test-class-2c/bad.prototxt", bdir);
  write_text(path, "model: \"bad\"\nvalue { kpi: \"accuracy\" valu: 1 }\n");
  assert_int_equal(kiln_ce_baseline_read(path, &b), KILN_ERR_PARSE);
  assert_contains(kiln_last_error(), "bad.prototxt:2:");
  kiln_ce_result_free(&r);
  kiln_ce_result_free(&r2);
}

/* ---- history ------------------------------------------------------------------------------- */

static void fill_result(kiln_ce_result *r, const char *suite_path, double accuracy) {
  memset(r, 0, sizeof *r);
  snprintf(r->suite_name, sizeof r->suite_name, "quick");
  snprintf(r->suite_path, sizeof r->suite_path, "%s", suite_path);
  snprintf(r->started_at, sizeof r->started_at, "2026-11-30T12:00:00Z");
  snprintf(r->git_commit, sizeof r->git_commit, "abc1234");
  snprintf(r->machine_class, sizeof r->machine_class, "test-class-2c");
  kiln_ce_machine_describe(&r->machine, kiln_test_config());
  r->duration_s = 12.5;
  kiln_ce_row row = make_row("lenet", 1, "accuracy", accuracy, KILN_CE_PASS);
  kiln_ce_result_add_row(r, &row);
  row = make_row("lenet", 1, "duration_s", 30, KILN_CE_PASS);
  snprintf(row.unit, sizeof row.unit, "s");
  kiln_ce_result_add_row(r, &row);
  row = make_row("lenet", 2, "run", NAN, KILN_CE_SKIP);
  snprintf(row.reason, sizeof row.reason, "mpirun not found");
  kiln_ce_result_add_row(r, &row);
}

static void test_history(void **state) {
  (void)state;
  char db[128];
  snprintf(db, sizeof db, "%s/hist/sub/ce.db", dir); /* folders are created */
  kiln_ce_history *h;
  assert_int_equal(kiln_ce_history_open(db, &h), KILN_OK);
  kiln_ce_result r;
  for (int i = 0; i < 3; i++) {
    fill_result(&r, "/suites/quick.prototxt", 0.80 + 0.01 * i);
    assert_int_equal(kiln_ce_history_record(h, &r), KILN_OK);
    assert_int_equal(r.run_id, i + 1);
    kiln_ce_result_free(&r);
  }
  int64_t runs, rows;
  assert_int_equal(kiln_ce_history_count(h, &runs, &rows), KILN_OK);
  assert_int_equal(runs, 3);
  assert_int_equal(rows, 9);
  int64_t last;
  assert_int_equal(kiln_ce_history_last_run(h, "/suites/quick.prototxt", &last), KILN_OK);
  assert_int_equal(last, 3);
  assert_int_equal(kiln_ce_history_last_run(h, "/suites/other.prototxt", &last), KILN_ERR_INVALID);

  assert_int_equal(kiln_ce_history_load_run(h, 2, &r), KILN_OK);
  assert_int_equal(r.nrows, 3);
  assert_string_equal(r.suite_name, "quick");
  assert_string_equal(r.machine_class, "test-class-2c");
  assert_string_equal(r.rows[0].kpi, "accuracy");
  assert_float_equal(r.rows[0].value, 0.81, 1e-12);
  assert_int_equal(r.rows[0].nsamples, 3);
  assert_float_equal(r.rows[0].samples[2], 0.82, 1e-12);
  assert_int_equal(r.rows[0].seed, 1701);
  assert_string_equal(r.rows[0].config_hash, "0123456789abcdef");
  assert_true(isnan(r.rows[2].value));
  assert_int_equal(r.rows[2].verdict, KILN_CE_SKIP);
  assert_string_equal(r.rows[2].reason, "mpirun not found");
  kiln_ce_result_free(&r);
  assert_int_equal(kiln_ce_history_load_run(h, 99, &r), KILN_ERR_INVALID);

  kiln_ce_point *p;
  int n;
  assert_int_equal(kiln_ce_history_series(h, "lenet", 1, "accuracy", "test-class-2c", 2, &p, &n),
                   KILN_OK);
  assert_int_equal(n, 2); /* the newest two, oldest first */
  assert_int_equal(p[0].run_id, 2);
  assert_float_equal(p[1].value, 0.82, 1e-12);
  free(p);
  assert_int_equal(kiln_ce_history_series(h, "lenet", 1, "accuracy", "elsewhere-8c", 10, &p, &n),
                   KILN_OK);
  assert_int_equal(n, 0);
  free(p);

  /* Closing in the middle of a run rolls it back. */
  fill_result(&r, "/suites/quick.prototxt", 0.5);
  assert_int_equal(kiln_ce_history_begin(h, &r), KILN_OK);
  assert_int_equal(kiln_ce_history_add_row(h, &r, &r.rows[0]), KILN_OK);
  kiln_ce_history_close(h);
  kiln_ce_result_free(&r);

  /* A writer killed in the middle of a run: the child begins, writes rows and dies by SIGKILL
   * without committing or closing. */
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    kiln_ce_history *hc;
    kiln_ce_result rc;
    if (kiln_ce_history_open(db, &hc)) _exit(3);
    fill_result(&rc, "/suites/quick.prototxt", 0.4);
    if (kiln_ce_history_begin(hc, &rc)) _exit(4);
    for (int i = 0; i < rc.nrows; i++)
      if (kiln_ce_history_add_row(hc, &rc, &rc.rows[i])) _exit(5);
    raise(SIGKILL);
    _exit(6);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  assert_int_equal(kiln_ce_history_open(db, &h), KILN_OK);
  assert_int_equal(kiln_ce_history_count(h, &runs, &rows), KILN_OK);
  assert_int_equal(runs, 3); /* the finished runs, and nothing of the two unfinished ones */
  assert_int_equal(rows, 9);
  fill_result(&r, "/suites/quick.prototxt", 0.83); /* and the database takes new runs */
  assert_int_equal(kiln_ce_history_record(h, &r), KILN_OK);
  kiln_ce_result_free(&r);
  kiln_ce_history_close(h);

  sqlite3 *raw;
  assert_int_equal(sqlite3_open(db, &raw), SQLITE_OK);
  sqlite3_stmt *s;
  assert_int_equal(sqlite3_prepare_v2(raw, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
  sqlite3_finalize(s);
  assert_int_equal(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
  sqlite3_finalize(s);
  /* one row per run and KPI, with its time, commit and machine */
  assert_int_equal(sqlite3_prepare_v2(raw,
                                      "SELECT count(*), min(time), min(git_commit), "
                                      "count(machine) FROM kpi_history WHERE kpi = 'accuracy'",
                                      -1, &s, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  assert_int_equal(sqlite3_column_int(s, 0), 4);
  assert_string_equal((const char *)sqlite3_column_text(s, 1), "2026-11-30T12:00:00Z");
  assert_string_equal((const char *)sqlite3_column_text(s, 2), "abc1234");
  assert_int_equal(sqlite3_column_int(s, 3), 4);
  sqlite3_finalize(s);
  sqlite3_close(raw);

  /* not a database: a clear error */
  char junk[128];
  snprintf(junk, sizeof junk, "%s/junk.db", dir);
  write_text(junk, "this is not an SQLite file, not even close; it is long enough to be read\n");
  assert_int_not_equal(kiln_ce_history_open(junk, &h), KILN_OK);
  assert_contains(kiln_last_error(), "junk.db");
}

/* ---- reports ------------------------------------------------------------------------------- */

static void test_reports(void **state) {
  (void)state;
  char db[128], html[128], jsonl[128];
  snprintf(db, sizeof db, "%s/report.db", dir);
  snprintf(html, sizeof html, "%s/report.html", dir);
  snprintf(jsonl, sizeof jsonl, "%s/results.jsonl", dir);
  kiln_ce_history *h;
  assert_int_equal(kiln_ce_history_open(db, &h), KILN_OK);
  kiln_ce_result r;
  for (int i = 0; i < 3; i++) {
    fill_result(&r, "/suites/quick.prototxt", 0.8 + 0.02 * i);
    kiln_ce_row row = make_row("cifar10_quick", 1, "accuracy", 0.7, KILN_CE_REGRESSION);
    row.has_baseline = true;
    row.baseline = 0.75;
    row.change = -0.0667;
    snprintf(row.reason, sizeof row.reason, "accuracy 0.7 is worse than <the> baseline");
    kiln_ce_result_add_row(&r, &row);
    assert_int_equal(kiln_ce_history_record(h, &r), KILN_OK);
    if (i < 2) kiln_ce_result_free(&r);
  }
  kiln_ce_result_warn(&r, "a warning & more");
  assert_int_equal(kiln_ce_report_html(&r, h, html), KILN_OK);
  char *text;
  size_t len;
  assert_int_equal(kiln_read_file(html, &text, &len), KILN_OK);
  assert_contains(text, "<!doctype html>");
  assert_contains(text, "<table class=\"grid\">");
  assert_contains(text, "<th>accuracy</th>");
  assert_contains(text, "<th>duration_s</th>");
  assert_contains(text, "class=\"regression\"");
  assert_contains(text, "worse than &lt;the&gt; baseline"); /* escaped */
  assert_contains(text, "a warning &amp; more");
  /* one plot per model and KPI: lenet accuracy, lenet duration_s, cifar10_quick accuracy */
  assert_int_equal(count_of(text, "<svg"), 3);
  assert_int_equal(count_of(text, "</svg>"), 3);
  assert_contains(text, "<polyline"); /* three runs of history make a line */
  assert_contains(text, "stroke-dasharray"); /* the baseline */
  /* self-contained: no scripts, stylesheets or images from elsewhere */
  assert_null(strstr(text, "<script"));
  assert_null(strstr(text, "<link"));
  assert_null(strstr(text, "src="));
  free(text);

  /* without a history: this run's points only */
  assert_int_equal(kiln_ce_report_html(&r, NULL, html), KILN_OK);
  assert_int_equal(kiln_read_file(html, &text, &len), KILN_OK);
  assert_int_equal(count_of(text, "<svg"), 3);
  free(text);

  assert_int_equal(kiln_ce_report_jsonl(&r, jsonl), KILN_OK);
  assert_int_equal(kiln_read_file(jsonl, &text, &len), KILN_OK);
  assert_int_equal(count_of(text, "\n"), 1 + r.nrows);
  assert_contains(text, "{\"type\":\"run\",\"run_id\":3,");
  assert_contains(text, "\"machine\":{\"cpu\":");
  assert_contains(text, "\"samples\":[0.83,0.84,0.85]");
  assert_contains(text, "\"verdict\":\"regression\"");
  assert_contains(text, "\"value\":null"); /* the skipped row */
  free(text);

  char *table = kiln_ce_report_table(&r, false);
  assert_non_null(table);
  assert_contains(table, "model");
  assert_contains(table, "baseline");
  assert_contains(table, "verdict");
  assert_contains(table, "cifar10_quick");
  assert_contains(table, "regression");
  assert_contains(table, "-6.7%");
  assert_contains(table, "30 s");
  assert_contains(table, "skipped lenet x2 run: mpirun not found");
  assert_contains(table, "warning: a warning & more");
  assert_null(strstr(table, "\033["));
  free(table);
  table = kiln_ce_report_table(&r, true);
  assert_contains(table, "\033[");
  free(table);
  kiln_ce_result_free(&r);
  kiln_ce_history_close(h);
}

/* ---- suites -------------------------------------------------------------------------------- */

static void test_suite_load(void **state) {
  (void)state;
  char solver[128], path[128], deploy[128];
  snprintf(solver, sizeof solver, "%s/s.prototxt", dir);
  write_text(solver, "net: \"n.prototxt\"\nbase_lr: 0.01\nmax_iter: 10\n");
  snprintf(deploy, sizeof deploy, "%s/d.prototxt", dir);
  write_text(deploy, "name: \"d\"\n");
  snprintf(path, sizeof path, "%s/suite.prototxt", dir);
  struct {
    const char *text, *error;
  } cases[] = {
      {"model { name: 'a' solver: 's.prototxt' workers: 1 workers: 2 kpi { name: 'accuracy' } }",
       NULL},
      {"", "has no model"},
      {"model { name: 'a b' solver: 's.prototxt' kpi { name: 'accuracy' } }", "name 'a b'"},
      {"model { name: 'a' solver: 'none.prototxt' kpi { name: 'accuracy' } }", "none.prototxt"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'acc' } }", "unknown KPI 'acc'"},
      {"model { name: 'a' solver: 's.prototxt' }", "kpi entries"},
      {"model { name: 'a' solver: 's.prototxt' workers: 0 kpi { name: 'accuracy' } }",
       "workers 0"},
      {"model { name: 'a' solver: 's.prototxt' workers: 2 workers: 2 kpi { name: 'accuracy' } }",
       "given twice"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' } }\n"
       "model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' } }",
       "model 'a' given twice"},
      {"repeats: 0 model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' } }", "repeats"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' } flor: 1 }",
       "suite.prototxt:1:"},
      /* fields out of range, each named */
      {"model { name: 'a' solver: 's.prototxt' threads: 0 kpi { name: 'accuracy' } }",
       "threads 0 is not in 1..1024"},
      {"model { name: 'a' solver: 's.prototxt' threads: 100000 kpi { name: 'accuracy' } }",
       "threads 100000 is not in 1..1024"},
      {"model { name: 'a' solver: 's.prototxt' precision: 'fp16' kpi { name: 'accuracy' } }",
       "precision 'fp16' is not fp32 or bf16"},
      {"model { name: 'a' solver: 's.prototxt' iters_per_epoch: -1 kpi { name: 'accuracy' } }",
       "iters_per_epoch -1 must be a positive number"},
      {"model { name: 'a' solver: 's.prototxt' test_iter: 0 kpi { name: 'accuracy' } }",
       "test_iter must be positive"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' floor: 0.9 ceiling: 0.5 } }",
       "floor 0.9 is above ceiling 0.5"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' rel_tolerance: inf } }",
       "KPI 'accuracy': rel_tolerance inf is not a finite number"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' rel_tolerance: nan } }",
       "KPI 'accuracy': rel_tolerance nan is not a finite number"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'accuracy' abs_tolerance: -1 } }",
       "KPI 'accuracy': abs_tolerance -1 is negative"},
      {"model { name: '.a' solver: 's.prototxt' kpi { name: 'accuracy' } }",
       "name '.a' must be 1 to 63 letters, digits, '_', '-' or '.', not starting with '.'"},
      /* a model judged by decoding */
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' ceiling: 0.5 }\n"
       "  kpi { name: 'word_accuracy' }\n"
       "  decode { model: 'd.prototxt' input: 'c/test.tsv' vocab: 'c/v.txt'\n"
       "           target_vocab: 'c/t.txt' beam: 4 limit: 100 } }",
       NULL},
      {"model { name: 'g2p' solver: 's.prototxt' kpi { name: 'per' } }",
       "suite.prototxt: model 'g2p': KPI 'per' comes from `kiln decode`: the model needs a "
       "decode { model: ... input: ... } entry"},
      {"model { name: 'g2p' solver: 's.prototxt' kpi { name: 'accuracy' }\n"
       "  kpi { name: 'word_accuracy' } }",
       "model 'g2p': KPI 'word_accuracy' comes from `kiln decode`"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { model: 'no.prototxt'"
       " input: 'i' vocab: 'v' target_vocab: 't' } }",
       "model 'a': decode: model "},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { input: 'i' vocab: "
       "'v' target_vocab: 't' } }",
       "model 'a': decode: no model"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { model: 'd.prototxt'"
       " vocab: 'v' target_vocab: 't' } }",
       "model 'a': decode: no input"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { model: 'd.prototxt'"
       " input: 'i' vocab: 'v' } }",
       "model 'a': decode: no target_vocab"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { model: 'd.prototxt'"
       " input: 'i' vocab: 'v' target_vocab: 't' beam: 0 } }",
       "model 'a': decode: beam 0 is not in 1..1024"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { model: 'd.prototxt'"
       " input: 'i' vocab: 'v' target_vocab: 't' limit: -1 } }",
       "model 'a': decode: limit -1 is negative"},
      {"model { name: 'a' solver: 's.prototxt' kpi { name: 'per' } decode { model: 'd.prototxt'"
       " input: 'i' vocab: 'v' target_vocab: 't' bem: 2 } }",
       "unknown field 'bem'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_text(path, cases[i].text);
    Caffe__CeSuite *s = NULL;
    int rc = kiln_ce_suite_load(path, &s);
    if (!cases[i].error) {
      if (rc) fail_msg("case %zu: %s", i, kiln_last_error());
      assert_int_equal(s->n_model, 1);
      assert_int_equal(s->repeats, 3); /* defaults */
      assert_float_equal(s->noise_k, 3, 0);
      char bdir[256];
      kiln_ce_suite_baseline_dir(s, path, bdir, sizeof bdir);
      assert_contains(bdir, "/baselines");
      protobuf_c_message_free_unpacked(&s->base, NULL);
    } else {
      assert_int_not_equal(rc, KILN_OK);
      assert_null(s);
      assert_contains(kiln_last_error(), cases[i].error);
    }
  }
}


/* ---- the runner, with a fake trainer ------------------------------------------------------- */

/* A stand-in for `kiln train` that writes metrics as kiln does, with figures the test chooses:
 * line N of ctl/durations is the N-th run's duration (and sets its throughput), ctl/mode makes it
 * crash, diverge or hang, or (nobf16) refuse --precision bf16 as a CPU without bf16 does. It records its arguments, and how many workers it was started as. It
 * writes the final weights when the solver asks for them (mode noweights: it does not), and as
 * `kiln decode` writes a "decode" event (ctl/decode: fail exits 1, silent writes nothing). */
static const char fake_kiln[] =
    "#!/bin/sh\n"
    "CTL=$(dirname \"$0\")/ctl\n"
    "echo \"$@\" >> \"$CTL/argv\"\n"
    "cmd=$1\n"
    "while [ $# -gt 0 ]; do case \"$1\" in --metrics) M=$2; shift;; --solver) S=$2; shift;;"
    " --precision) P=$2; shift;; esac; shift; done\n"
    "if [ \"$cmd\" = decode ]; then\n"
    "  case \"$(cat \"$CTL/decode\" 2>/dev/null)\" in\n"
    "    fail) echo 'kiln: decode: broken.prototxt: no such file' >&2; exit 1 ;;\n"
    "    silent) exit 0 ;;\n"
    "  esac\n"
    "  echo '{\"event\":\"decode\",\"iter\":0,\"time_ms\":5,\"rank\":0,\"per\":0.25,"
    "\"word_accuracy\":0.5,\"words\":40,\"beam\":3}' > \"$M\"\n"
    "  exit 0\n"
    "fi\n"
    "n=$(cat \"$CTL/count\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$CTL/count\"\n"
    "mode=$(cat \"$CTL/mode\" 2>/dev/null)\n"
    "if [ \"$mode\" = nobf16 ] && [ \"${P:-}\" = bf16 ]; then\n"
    "  echo 'kiln: train: s.prototxt: net: precision BF16 needs a CPU with AVX512_BF16' >&2; exit 1\n"
    "fi\n"
    "if [ \"$mode\" != noweights ] && grep -q '^snapshot_after_train: true' \"$S\"; then\n"
    "  touch \"snapshot_iter_$(sed -n 's/^max_iter: //p' \"$S\").caffemodel\"\n"
    "fi\n"
    "np=${FAKE_NP:-1}\n"
    "d=$(sed -n \"${n}p\" \"$CTL/durations\")\n"
    "sps=$(awk -v d=\"$d\" -v np=\"$np\" 'BEGIN { print 6400 * np / d }')\n"
    "ms=$(awk -v d=\"$d\" 'BEGIN { print d * 1000 }')\n"
    "echo '{\"event\":\"test\",\"iter\":0,\"time_ms\":1,\"rank\":0,\"loss\":2.3,\"test_net\":0,"
    "\"accuracy\":0.1,\"peak_rss_mb\":50}' > \"$M\"\n"
    "ta=; [ \"$mode\" = trainacc ] && ta=',\"accuracy\":0.8'\n"
    "for i in 0 10 20 30 40 50 60 70 80 90; do\n"
    "  echo \"{\\\"event\\\":\\\"train\\\",\\\"iter\\\":$i,\\\"time_ms\\\":$i,\\\"rank\\\":0,"
    "\\\"loss\\\":0.5,\\\"samples_per_s\\\":$sps,\\\"peak_rss_mb\\\":60$ta}\" >> \"$M\"\n"
    "done\n"
    "case \"$mode\" in\n"
    "  crash) kill -SEGV $$ ;;\n"
    "  hang) sleep 30 ;;\n"
    "  nan) echo '{\"event\":\"train\",\"iter\":95,\"time_ms\":9,\"rank\":0,"
    "\"loss\":null}' >> \"$M\";"
    " echo 'kiln: train: iteration 95: the loss is nan; training diverged' >&2; exit 1 ;;\n"
    "esac\n"
    "echo \"{\\\"event\\\":\\\"test\\\",\\\"iter\\\":100,\\\"time_ms\\\":$ms,\\\"rank\\\":0,"
    "\\\"loss\\\":0.3,\\\"test_net\\\":0,\\\"accuracy\\\":0.9,\\\"peak_rss_mb\\\":61}\" >> \"$M\"\n"
    "r=0; while [ $r -lt $np ]; do echo \"{\\\"event\\\":\\\"worker\\\",\\\"iter\\\":100,"
    "\\\"time_ms\\\":$ms,\\\"rank\\\":$r}\" >> \"$M\"; r=$((r+1)); done\n"
    "echo \"{\\\"event\\\":\\\"done\\\",\\\"iter\\\":100,\\\"time_ms\\\":$ms,\\\"rank\\\":0,"
    "\\\"peak_rss_mb\\\":61}\" >> \"$M\"\n";

/* mpirun -np N [options] PROGRAM ARGS: runs PROGRAM once, telling it N. */
static const char fake_mpirun[] =
    "#!/bin/sh\n"
    "echo \"mpirun $@\" >> \"$(dirname \"$0\")/ctl/argv\"\n"
    "while [ $# -gt 0 ]; do case \"$1\" in -np) np=$2; shift 2;; --bind-to) shift 2;;"
    " -*) shift;; *) break;; esac; done\n"
    "FAKE_NP=$np exec \"$@\"\n";

typedef struct runner_env {
  char root[128], kiln[160], mpirun[160], ctl[160], suite[160];
} runner_env;

static void runner_setup(runner_env *e, const char *name, const char *durations, const char *mode,
                         const char *suite_models, const char *baseline) {
  snprintf(e->root, sizeof e->root, "%s/%s", dir, name);
  mkdir(e->root, 0775);
  snprintf(e->ctl, sizeof e->ctl, "%s/ctl", e->root);
  mkdir(e->ctl, 0775);
  snprintf(e->kiln, sizeof e->kiln, "%s/kiln", e->root);
  snprintf(e->mpirun, sizeof e->mpirun, "%s/mpirun", e->root);
  write_text(e->kiln, fake_kiln);
  write_text(e->mpirun, fake_mpirun);
  chmod(e->kiln, 0755);
  chmod(e->mpirun, 0755);
  char p[256];
  snprintf(p, sizeof p, "%s/durations", e->ctl);
  write_text(p, durations);
  snprintf(p, sizeof p, "%s/mode", e->ctl);
  write_text(p, mode);
  snprintf(p, sizeof p, "%s/solver.prototxt", e->root);
  write_text(p, "net: \"net.prototxt\"\nbase_lr: 0.01\nmax_iter: 5000\ntest_interval: 1000\n"
                "display: 10\nrandom_seed: 7\n");
  snprintf(e->suite, sizeof e->suite, "%s/suite.prototxt", e->root);
  write_text(e->suite, suite_models);
  if (baseline) {
    snprintf(p, sizeof p, "%s/baselines/test-1c", e->root);
    char b[200];
    snprintf(b, sizeof b, "%s/baselines", e->root);
    mkdir(b, 0775);
    mkdir(p, 0775);
    snprintf(p, sizeof p, "%s/baselines/test-1c/m.prototxt", e->root);
    write_text(p, baseline);
  }
}

static int runner_run(runner_env *e, kiln_ce_result *r) {
  char report[200];
  snprintf(report, sizeof report, "%s/report", e->root);
  kiln_ce_options o = {.kiln_path = e->kiln, .report_dir = report, .machine_class = "test-1c",
                       .mpirun = e->mpirun, .assume_mpi = true, .config = kiln_test_config()};
  return kiln_ce_run(e->suite, &o, r);
}

static const kiln_ce_row *row_of(const kiln_ce_result *r, int workers, const char *kpi) {
  for (int i = 0; i < r->nrows; i++)
    if (r->rows[i].workers == workers && !strcmp(r->rows[i].kpi, kpi)) return &r->rows[i];
  fail_msg("no row %d %s", workers, kpi);
  return NULL;
}

static const char timing_suite[] =
    "repeats: 3\nmodel { name: 'm' solver: 'solver.prototxt' max_iter: 100 test_interval: 100\n"
    "  kpi { name: 'accuracy' } kpi { name: 'duration_s' rel_tolerance: 0.1 }\n"
    "  kpi { name: 'samples_per_s' rel_tolerance: 0.1 } }\n";
static const char timing_baseline[] =
    "model: 'm' machine_class: 'test-1c'\n"
    "value { kpi: 'accuracy' workers: 1 value: 0.9 spread: 0 }\n"
    "value { kpi: 'duration_s' workers: 1 value: 10 spread: 0.05 }\n"
    "value { kpi: 'samples_per_s' workers: 1 value: 640 spread: 2 }\n";

static void test_runner_timing_noise(void **state) {
  (void)state;
  kiln_ce_result r;
  /* a slow first measurement that the re-run does not confirm: noise, a pass */
  runner_env e;
  runner_setup(&e, "noise", "13\n13.2\n12.9\n10.1\n10\n9.9\n", "", timing_suite, timing_baseline);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  const kiln_ce_row *d = row_of(&r, 1, "duration_s");
  assert_int_equal(d->verdict, KILN_CE_PASS);
  assert_contains(d->reason, "not confirmed on a re-run");
  assert_int_equal(d->nsamples, 6); /* every sample is kept */
  assert_float_equal(d->value, 10, 1e-9); /* the re-run's median decides */
  assert_float_equal(d->samples[0], 13, 1e-9);
  assert_int_equal(row_of(&r, 1, "accuracy")->verdict, KILN_CE_PASS);
  assert_float_equal(row_of(&r, 1, "accuracy")->value, 0.9, 1e-12);
  assert_int_equal(row_of(&r, 1, "samples_per_s")->verdict, KILN_CE_PASS);
  assert_int_equal(row_of(&r, 1, "duration_s")->seed, 7);
  assert_int_equal(row_of(&r, 1, "duration_s")->iterations, 100);
  assert_int_equal(strlen(row_of(&r, 1, "duration_s")->config_hash), 16);
  assert_int_equal(kiln_ce_result_exit_code(&r), 0);
  /* the solver as run: the suite's overrides, no snapshots, the net path made absolute */
  char p[300], *text;
  size_t len;
  snprintf(p, sizeof p, "%s/report/runs/m-w1-r1/solver.prototxt", e.root);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_contains(text, "max_iter: 100\n");
  assert_contains(text, "test_interval: 100\n");
  assert_contains(text, "snapshot_after_train: false\n");
  snprintf(p, sizeof p, "net: \"%s/net.prototxt\"", e.root);
  assert_contains(text, p);
  free(text);
  kiln_ce_result_free(&r);

  /* slow again on the re-run: a confirmed regression */
  runner_setup(&e, "slow", "13\n13.2\n12.9\n13\n13.1\n13\n", "", timing_suite, timing_baseline);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  d = row_of(&r, 1, "duration_s");
  assert_int_equal(d->verdict, KILN_CE_REGRESSION);
  assert_contains(d->reason, "confirmed on a re-run");
  assert_int_equal(row_of(&r, 1, "samples_per_s")->verdict, KILN_CE_REGRESSION);
  assert_int_equal(kiln_ce_result_exit_code(&r), 1);
  kiln_ce_result_free(&r);

  /* noisy but centred: the spread widens the tolerance (3 x stddev) */
  runner_setup(&e, "spread", "8.5\n11.5\n10\n", "", timing_suite, timing_baseline);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(row_of(&r, 1, "duration_s")->verdict, KILN_CE_PASS);
  assert_float_equal(row_of(&r, 1, "duration_s")->tolerance, 3 * 1.5, 1e-9);
  kiln_ce_result_free(&r);
}

static void test_runner_workers_and_failures(void **state) {
  (void)state;
  kiln_ce_result r;
  runner_env e;
  const char *two =
      "repeats: 1\nmodel { name: 'm' solver: 'solver.prototxt' workers: 1 workers: 2 threads: 1\n"
      "  kpi { name: 'accuracy' } kpi { name: 'samples_per_s' } kpi { name: 'speedup' }\n"
      "  kpi { name: 'efficiency' } }\n";
  /* two workers in 6.4 s against one in 10 s: 2000 against 640 samples/s */
  runner_setup(&e, "workers", "10\n6.4\n", "", two, NULL);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_float_equal(row_of(&r, 2, "samples_per_s")->value, 2000, 1e-6);
  assert_float_equal(row_of(&r, 2, "speedup")->value, 2000.0 / 640, 1e-9);
  assert_float_equal(row_of(&r, 2, "efficiency")->value, 2000.0 / 640 / 2, 1e-9);
  assert_int_equal(row_of(&r, 2, "speedup")->verdict, KILN_CE_NEW);
  for (int i = 0; i < r.nrows; i++) /* no speedup of one worker */
    assert_false(r.rows[i].workers == 1 && !strcmp(r.rows[i].kpi, "speedup"));
  assert_int_equal(r.nwarnings, 0); /* the metrics reported both workers */
  char p[300], *text;
  size_t len;
  snprintf(p, sizeof p, "%s/argv", e.ctl);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_contains(text, "mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none ");
  assert_contains(text, " train --solver ");
  assert_contains(text, "--threads 1");
  free(text);
  kiln_ce_result_free(&r);

  /* no mpirun: the 2-worker entry is skipped with the reason, the rest runs */
  runner_setup(&e, "nompi", "10\n", "", two, NULL);
  char report[200];
  snprintf(report, sizeof report, "%s/report", e.root);
  kiln_ce_options o = {.kiln_path = e.kiln, .report_dir = report, .machine_class = "test-1c",
                       .mpirun = "/nonexistent/mpirun", .assume_mpi = true,
                       .config = kiln_test_config()};
  if (kiln_ce_run(e.suite, &o, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(row_of(&r, 2, "run")->verdict, KILN_CE_SKIP);
  assert_contains(row_of(&r, 2, "run")->reason, "mpirun not found");
  assert_int_equal(row_of(&r, 1, "accuracy")->verdict, KILN_CE_NEW);
  assert_int_equal(kiln_ce_result_exit_code(&r), 0);
  kiln_ce_result_free(&r);

  /* a bf16 model: --precision bf16 on the command line; skipped where the CPU refuses it */
  const char *bf16 = "repeats: 1\nmodel { name: 'm' solver: 'solver.prototxt' precision: 'bf16'\n"
                     "  kpi { name: 'accuracy' } }\n";
  runner_setup(&e, "bf16", "10\n", "", bf16, NULL);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(row_of(&r, 1, "accuracy")->verdict, KILN_CE_NEW);
  snprintf(p, sizeof p, "%s/argv", e.ctl);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_contains(text, " --precision bf16");
  free(text);
  kiln_ce_result_free(&r);
  runner_setup(&e, "nobf16", "10\n", "nobf16", bf16, NULL);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(row_of(&r, 1, "run")->verdict, KILN_CE_SKIP);
  assert_contains(row_of(&r, 1, "run")->reason, "precision BF16 needs a CPU with AVX512_BF16");
  assert_int_equal(kiln_ce_result_exit_code(&r), 0);
  kiln_ce_result_free(&r);

  const char *one = "repeats: 2\nmodel { name: 'm' solver: 'solver.prototxt' timeout_seconds: 1\n"
                    "  kpi { name: 'accuracy' } kpi { name: 'duration_s' } }\n";
  struct {
    const char *mode, *want;
    kiln_ce_verdict verdict;
  } cases[] = {
      {"crash", "crashed: killed by signal 11", KILN_CE_FAIL},
      {"nan", "NaN or infinite loss: kiln: train: iteration 95", KILN_CE_FAIL},
      {"hang", "timed out", KILN_CE_FAIL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    runner_setup(&e, cases[i].mode, "10\n10\n", cases[i].mode, one, NULL);
    if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
    assert_int_equal(r.nrows, 1); /* one "run" row: the failure, with the log to read */
    assert_int_equal(r.rows[0].verdict, cases[i].verdict);
    assert_contains(r.rows[0].reason, cases[i].want);
    assert_contains(r.rows[0].reason, "train.log");
    assert_int_equal(kiln_ce_result_exit_code(&r), 2);
    kiln_ce_result_free(&r);
    snprintf(p, sizeof p, "%s/count", e.ctl); /* a failed repeat stops the configuration */
    assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
    assert_int_equal(atoi(text), 1);
    free(text);
  }

  /* train accuracy: the train events' accuracy where the train net reports one; where it
   * reports none, the row says so (exit 3: nothing was judged), and the rest is judged */
  const char *ta = "repeats: 1\nmodel { name: 'm' solver: 'solver.prototxt'\n"
                   "  kpi { name: 'accuracy' } kpi { name: 'train_accuracy' floor: 0.7 } }\n";
  runner_setup(&e, "trainacc", "10\n", "trainacc", ta, NULL);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(row_of(&r, 1, "train_accuracy")->verdict, KILN_CE_NEW);
  assert_float_equal(row_of(&r, 1, "train_accuracy")->value, 0.8, 1e-12);
  assert_int_equal(kiln_ce_result_exit_code(&r), 0);
  kiln_ce_result_free(&r);
  runner_setup(&e, "notrainacc", "10\n", "", ta, NULL);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(row_of(&r, 1, "accuracy")->verdict, KILN_CE_NEW);
  assert_int_equal(row_of(&r, 1, "train_accuracy")->verdict, KILN_CE_ERROR);
  assert_contains(row_of(&r, 1, "train_accuracy")->reason,
                  "the train net reports no accuracy (it needs an Accuracy layer in phase TRAIN");
  assert_int_equal(kiln_ce_result_exit_code(&r), 3);
  kiln_ce_result_free(&r);

  /* the kiln to run is missing: the harness could not run it (exit 3) */
  runner_setup(&e, "missing", "10\n", "", one, NULL);
  remove(e.kiln);
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  assert_int_equal(r.rows[0].verdict, KILN_CE_ERROR);
  assert_int_equal(kiln_ce_result_exit_code(&r), 3);
  kiln_ce_result_free(&r);
}

/* More workers than cores: the timing KPIs of that configuration are "n/a" with the reason (the
 * workers measure how they share the cores, not kiln), even against a baseline they would fail;
 * accuracy, losses and memory are judged as usual; accept leaves the timings out of the
 * baseline. The machine is said to have 2 cores, whatever this one has. */
static void test_runner_more_workers_than_cores(void **state) {
  (void)state;
  char why[128] = "";
  const kiln_ce_kpi_info *sps = kiln_ce_kpi_lookup("samples_per_s");
  assert_true(kiln_ce_kpi_not_applicable(sps, 4, 2, why, sizeof why));
  assert_string_equal(why, "4 workers on 2 cores: timing not judged");
  assert_true(kiln_ce_kpi_not_applicable(kiln_ce_kpi_lookup("speedup"), 3, 1, why, sizeof why));
  assert_string_equal(why, "3 workers on 1 core: timing not judged");
  assert_false(kiln_ce_kpi_not_applicable(sps, 2, 2, why, sizeof why));
  const char *judged[] = {"accuracy", "train_loss", "test_loss", "peak_rss_mb", "perplexity"};
  for (size_t i = 0; i < sizeof judged / sizeof judged[0]; i++)
    assert_false(kiln_ce_kpi_not_applicable(kiln_ce_kpi_lookup(judged[i]), 4, 2, why, sizeof why));
  const char *timed[] = {"duration_s", "samples_per_s", "speedup", "efficiency"};
  for (size_t i = 0; i < sizeof timed / sizeof timed[0]; i++)
    assert_true(kiln_ce_kpi_not_applicable(kiln_ce_kpi_lookup(timed[i]), 4, 2, why, sizeof why));

  const char *suite =
      "repeats: 1\nmodel { name: 'm' solver: 'solver.prototxt' workers: 1 workers: 4 threads: 1\n"
      "  kpi { name: 'accuracy' } kpi { name: 'train_loss' } kpi { name: 'duration_s' }\n"
      "  kpi { name: 'samples_per_s' } kpi { name: 'speedup' } kpi { name: 'efficiency' } }\n";
  /* a 4-worker baseline whose throughput this run would miss by far, and whose accuracy it
   * misses by more than the tolerance */
  const char *baseline = "model: 'm' machine_class: 'test-1c'\n"
                         "value { kpi: 'accuracy' workers: 4 value: 0.95 spread: 0 }\n"
                         "value { kpi: 'samples_per_s' workers: 4 value: 90000 spread: 0 }\n";
  runner_env e;
  runner_setup(&e, "four", "10\n5\n", "", suite, baseline);
  char report[200];
  snprintf(report, sizeof report, "%s/report", e.root);
  kiln_ce_options o = {.kiln_path = e.kiln, .report_dir = report, .machine_class = "test-1c",
                       .mpirun = e.mpirun, .assume_mpi = true, .cores = 2,
                       .config = kiln_test_config()};
  kiln_ce_result r;
  if (kiln_ce_run(e.suite, &o, &r)) fail_msg("%s", kiln_last_error());
  for (size_t i = 0; i < sizeof timed / sizeof timed[0]; i++) {
    const kiln_ce_row *row = row_of(&r, 4, timed[i]);
    assert_int_equal(row->verdict, KILN_CE_NA);
    assert_string_equal(row->reason, "4 workers on 2 cores: timing not judged");
    assert_false(row->has_baseline);
  }
  /* measured all the same: 4 x 6400 samples in 5 s, 8 times the one worker's 640 */
  assert_float_equal(row_of(&r, 4, "samples_per_s")->value, 5120, 1e-6);
  assert_float_equal(row_of(&r, 4, "speedup")->value, 8, 1e-9);
  assert_float_equal(row_of(&r, 4, "efficiency")->value, 2, 1e-9);
  const kiln_ce_row *acc = row_of(&r, 4, "accuracy");
  assert_int_equal(acc->verdict, KILN_CE_REGRESSION);
  assert_float_equal(acc->baseline, 0.95, 0);
  assert_int_equal(row_of(&r, 4, "train_loss")->verdict, KILN_CE_NEW);
  assert_int_equal(row_of(&r, 1, "samples_per_s")->verdict, KILN_CE_NEW); /* 1 <= 2 cores */
  assert_int_equal(row_of(&r, 1, "duration_s")->verdict, KILN_CE_NEW);
  assert_string_equal(kiln_ce_verdict_name(KILN_CE_NA), "n/a");
  assert_int_equal(kiln_ce_result_exit_code(&r), 1); /* the accuracy, not the timings */
  char p[300], *text;
  size_t len;
  snprintf(p, sizeof p, "%s/argv", e.ctl);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_contains(text, "mpirun -np 4 --oversubscribe ");
  free(text);
  /* the table, JSON Lines and HTML say why */
  char *table = kiln_ce_report_table(&r, false);
  assert_contains(table, "n/a m x4 samples_per_s: 4 workers on 2 cores: timing not judged");
  free(table);
  snprintf(p, sizeof p, "%s/results.jsonl", e.root);
  assert_int_equal(kiln_ce_report_jsonl(&r, p), KILN_OK);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_int_equal(count_of(text, "\"verdict\":\"n/a\",\"reason\":\"4 workers on 2 cores: timing "
                                  "not judged\""), 4);
  free(text);
  snprintf(p, sizeof p, "%s/report.html", e.root);
  assert_int_equal(kiln_ce_report_html(&r, NULL, p), KILN_OK);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_int_equal(count_of(text, "<td class=\"na\" title=\"4 workers on 2 cores: timing not "
                                  "judged\">"), 4);
  assert_contains(text, ".skip,.na{");
  free(text);

  /* accept: 4 workers' accuracy and loss go into the baseline, their timings do not */
  char bdir[200];
  snprintf(bdir, sizeof bdir, "%s/accepted", e.root);
  r.run_id = 7;
  for (int i = 0; i < r.nrows; i++) /* accept refuses a model with a failed row, not a regression */
    assert_int_not_equal(r.rows[i].verdict, KILN_CE_FAIL);
  int written = 0;
  assert_int_equal(kiln_ce_accept(&r, bdir, &written), KILN_OK);
  assert_int_equal(written, 1);
  assert_int_equal(kiln_ce_baseline_path(bdir, "test-1c", "m", p, sizeof p), KILN_OK);
  Caffe__CeBaseline *b;
  assert_int_equal(kiln_ce_baseline_read(p, &b), KILN_OK);
  assert_non_null(kiln_ce_baseline_find(b, "accuracy", 4));
  assert_non_null(kiln_ce_baseline_find(b, "train_loss", 4));
  assert_non_null(kiln_ce_baseline_find(b, "samples_per_s", 1));
  assert_non_null(kiln_ce_baseline_find(b, "duration_s", 1));
  for (size_t i = 0; i < sizeof timed / sizeof timed[0]; i++)
    assert_null(kiln_ce_baseline_find(b, timed[i], 4));
  assert_int_equal(b->n_value, 6); /* w1: accuracy, loss, duration, throughput; w4: the first two */
  protobuf_c_message_free_unpacked(&b->base, NULL);
  kiln_ce_result_free(&r);
}

/* A model with a decode entry: the training keeps its final weights, `kiln decode` runs on them
 * with the entry's settings (paths in the cache, the deploy net beside the suite), and its event
 * gives per and word_accuracy; a decode that fails, or writes no event, fails the run naming
 * decode.log, and so does a training that left no weights. */
static void test_runner_decode(void **state) {
  (void)state;
  const char *suite =
      "repeats: 1\nmodel { name: 'm' solver: 'solver.prototxt' max_iter: 100 test_interval: 100\n"
      "  threads: 1 kpi { name: 'accuracy' } kpi { name: 'per' ceiling: 0.5 }\n"
      "  kpi { name: 'word_accuracy' }\n"
      "  decode { model: 'deploy.prototxt' input: 'set/test.tsv' vocab: 'set/v.txt'\n"
      "           target_vocab: 'set/t.txt' beam: 3 limit: 40 } }\n";
  struct {
    const char *name, *mode, *decode, *want;
  } cases[] = {
      {"decode-ok", "", "", NULL},
      {"decode-fail", "", "fail", "kiln decode failed (exit 1): kiln: decode: broken.prototxt"},
      {"decode-silent", "", "silent", "kiln decode wrote no \"decode\" event"},
      {"decode-noweights", "noweights", "", "the training left no final weights to decode"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    runner_env e;
    runner_setup(&e, cases[i].name, "10\n", cases[i].mode, suite, NULL);
    char p[400], report[200], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/deploy.prototxt", e.root);
    write_text(p, "name: \"deploy\"\n");
    snprintf(p, sizeof p, "%s/decode", e.ctl);
    write_text(p, cases[i].decode);
    kiln_config cfg = *kiln_test_config();
    snprintf(cfg.data_dir, sizeof cfg.data_dir, "%s/cache", e.root);
    snprintf(report, sizeof report, "%s/report", e.root);
    kiln_ce_options o = {.kiln_path = e.kiln, .report_dir = report, .machine_class = "test-1c",
                         .mpirun = e.mpirun, .config = &cfg};
    kiln_ce_result r;
    if (kiln_ce_run(e.suite, &o, &r)) fail_msg("%s", kiln_last_error());
    char run[200];
    snprintf(run, sizeof run, "%s/report/runs/m-w1-r1", e.root);
    if (!cases[i].want) {
      assert_int_equal(r.nrows, 3);
      const kiln_ce_row *per = row_of(&r, 1, "per");
      assert_float_equal(per->value, 0.25, 1e-12);
      assert_false(per->higher_is_better);
      assert_int_equal(per->verdict, KILN_CE_NEW);
      assert_float_equal(row_of(&r, 1, "word_accuracy")->value, 0.5, 1e-12);
      assert_float_equal(row_of(&r, 1, "accuracy")->value, 0.9, 1e-12);
      assert_int_equal(kiln_ce_result_exit_code(&r), 0);
      /* the solver keeps the final weights; the decode reads them with the entry's settings */
      snprintf(p, sizeof p, "%s/solver.prototxt", run);
      assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
      assert_contains(text, "snapshot_after_train: true\n");
      free(text);
      snprintf(p, sizeof p, "%s/argv", e.ctl);
      assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
      char want[2048];
      snprintf(want, sizeof want,
               "decode --model %s/deploy.prototxt --weights %s/snapshot_iter_100.caffemodel "
               "--vocab %s/cache/set/v.txt --target-vocab %s/cache/set/t.txt --input "
               "%s/cache/set/test.tsv --beam 3 --limit 40 --metrics %s/decode.jsonl --threads 1\n",
               e.root, run, e.root, e.root, e.root, run);
      assert_contains(text, want);
      assert_int_equal(count_of(text, "decode --model"), 1);
      free(text);
      snprintf(p, sizeof p, "%s/decode.log", run);
      assert_int_equal(access(p, F_OK), 0);
    } else {
      assert_int_equal(r.nrows, 1); /* one "run" row, as for a failed training */
      assert_string_equal(r.rows[0].kpi, "run");
      assert_int_equal(r.rows[0].verdict, KILN_CE_FAIL);
      assert_contains(r.rows[0].reason, cases[i].want);
      assert_contains(r.rows[0].reason, i == 3 ? "train.log" : "decode.log");
      assert_int_equal(kiln_ce_result_exit_code(&r), 2);
    }
    kiln_ce_result_free(&r);
  }

  /* without a decode entry the weights are not kept, and nothing is decoded */
  runner_env e;
  runner_setup(&e, "plain", "10\n", "",
               "repeats: 1\nmodel { name: 'm' solver: 'solver.prototxt' max_iter: 100\n"
               "  test_interval: 100 kpi { name: 'accuracy' } }\n",
               NULL);
  kiln_ce_result r;
  if (runner_run(&e, &r)) fail_msg("%s", kiln_last_error());
  if (kiln_ce_result_exit_code(&r)) fail_msg("%s: %s", r.rows[0].kpi, r.rows[0].reason);
  kiln_ce_result_free(&r);
  char p[300], *text;
  size_t len;
  snprintf(p, sizeof p, "%s/argv", e.ctl);
  assert_int_equal(kiln_read_file(p, &text, &len), KILN_OK);
  assert_int_equal(count_of(text, " decode --model"), 0);
  free(text);
  snprintf(p, sizeof p, "%s/report/runs/m-w1-r1/snapshot_iter_100.caffemodel", e.root);
  assert_int_not_equal(access(p, F_OK), 0);
}

/* Whether a suite model declares KPI `name` with a floor (floor true) or a ceiling. */
static bool has_bound(const Caffe__CeModel *m, const char *name, bool floor) {
  for (size_t k = 0; k < m->n_kpi; k++)
    if (!strcmp(m->kpi[k]->name, name) && (floor ? m->kpi[k]->has_floor : m->kpi[k]->has_ceiling))
      return true;
  return false;
}

static bool has_kpi(const Caffe__CeModel *m, const char *name) {
  for (size_t k = 0; k < m->n_kpi; k++)
    if (!strcmp(m->kpi[k]->name, name)) return true;
  return false;
}

/* The full suite trains every trainable model of models/: each solver file there but the
 * ImageNet nets' (their data cannot be fetched) is some entry's, on 1 and 2 workers at one
 * thread, once, judged by a bounded quality KPI (an accuracy or F1 floor, a perplexity or PER
 * ceiling), by train_accuracy where the train net reports one, and on 2 workers by speedup. */
static void check_full_suite(const char *root, const Caffe__CeSuite *s) {
  assert_true(s->has_repeats && s->repeats == 1);
  for (size_t m = 0; m < s->n_model; m++) {
    const Caffe__CeModel *e = s->model[m];
    if (e->n_workers != 2 || e->workers[0] != 1 || e->workers[1] != 2)
      fail_msg("full suite: model '%s' is not on 1 and 2 workers", e->name);
    if (!e->has_threads || e->threads != 1 || !e->has_max_iter)
      fail_msg("full suite: model '%s' needs threads: 1 and a max_iter", e->name);
    bool bounded = has_bound(e, "accuracy", true) || has_bound(e, "f1", true) ||
                   has_bound(e, "mAP", true) || has_bound(e, "perplexity", false) ||
                   has_bound(e, "per", false);
    if (!bounded)
      fail_msg("full suite: model '%s' has no floor or ceiling on its quality", e->name);
    if (!has_kpi(e, "speedup")) fail_msg("full suite: model '%s' has no speedup", e->name);
    bool train_acc = strstr(e->solver, "/cifar10_full/") || strstr(e->solver, "/vgg/") ||
                     strstr(e->solver, "/resnet20/") || strstr(e->solver, "/densenet/");
    if (train_acc != has_kpi(e, "train_accuracy"))
      fail_msg("full suite: model '%s': train_accuracy %s", e->name,
               train_acc ? "missing" : "asked of a net that does not report it");
  }
  char models[4096];
  snprintf(models, sizeof models, "%s/models", root);
  DIR *d = opendir(models);
  assert_non_null(d);
  int solvers = 0;
  for (struct dirent *de; (de = readdir(d));) {
    /* the nets whose data cannot be fetched: ILSVRC-2012's, PASCAL VOC's */
    if (de->d_name[0] == '.' || !strcmp(de->d_name, "alexnet") ||
        !strcmp(de->d_name, "googlenet") || !strcmp(de->d_name, "resnet50") ||
        !strcmp(de->d_name, "ssd300"))
      continue;
    char sub[4600];
    snprintf(sub, sizeof sub, "%s/%s", models, de->d_name);
    DIR *md = opendir(sub);
    if (!md) continue; /* README.md */
    for (struct dirent *f; (f = readdir(md));) {
      size_t n = strlen(f->d_name), suffix = strlen("solver.prototxt");
      if (n < suffix || strcmp(f->d_name + n - suffix, "solver.prototxt")) continue;
      char want[600];
      snprintf(want, sizeof want, "../models/%s/%s", de->d_name, f->d_name);
      bool found = false;
      for (size_t m = 0; m < s->n_model; m++) found |= !strcmp(s->model[m]->solver, want);
      if (!found) fail_msg("full suite: no entry trains %s", want);
      solvers++;
    }
    closedir(md);
  }
  closedir(d);
  assert_int_equal(solvers, 17);
}

/* The repository's own suites load: every model's solver exists and every KPI is known; the full
 * and text suites keep their baselines apart from the quick one's (the same models at other
 * budgets), and the full suite trains the whole zoo (check_full_suite). */
static void test_repository_suites(void **state) {
  (void)state;
  const char *root = getenv("KILN_SOURCE_DIR"); /* the repository root, set by CTest */
  assert_non_null(root);
  struct {
    const char *file;
    size_t models;
    const char *baselines;
  } suites[] = {{"quick.prototxt", 4, "/ce/baselines"},
                {"full.prototxt", 17, "/ce/baselines-full"},
                {"text.prototxt", 6, "/ce/baselines-text"}};
  for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ce/%s", root, suites[i].file);
    Caffe__CeSuite *s = NULL;
    if (kiln_ce_suite_load(path, &s)) fail_msg("%s: %s", suites[i].file, kiln_last_error());
    assert_int_equal(s->n_model, suites[i].models);
    char bdir[4096];
    kiln_ce_suite_baseline_dir(s, path, bdir, sizeof bdir);
    assert_contains(bdir, suites[i].baselines);
    if (i == 1) check_full_suite(root, s);
    protobuf_c_message_free_unpacked(&s->base, NULL);
  }
}

int main(void) {
  kiln_log_set_level(KILN_LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_metrics_extraction),
      cmocka_unit_test(test_metrics_nan_and_damage),
      cmocka_unit_test(test_metrics_discount_wait),
      cmocka_unit_test(test_metrics_decode),
      cmocka_unit_test(test_reductions),
      cmocka_unit_test(test_kpi_defaults),
      cmocka_unit_test(test_compare_tolerances_and_noise),
      cmocka_unit_test(test_absolute_checks),
      cmocka_unit_test(test_exit_codes),
      cmocka_unit_test(test_text_format_round_trip),
      cmocka_unit_test(test_baseline_round_trip_and_accept),
      cmocka_unit_test(test_history),
      cmocka_unit_test(test_reports),
      cmocka_unit_test(test_suite_load),
      cmocka_unit_test(test_repository_suites),
      cmocka_unit_test(test_runner_timing_noise),
      cmocka_unit_test(test_runner_workers_and_failures),
      cmocka_unit_test(test_runner_more_workers_than_cores),
      cmocka_unit_test(test_runner_decode),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
