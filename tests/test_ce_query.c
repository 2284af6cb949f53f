/* The CE history read back (`kiln ce history`, `kiln ce compare`): a database of four known runs
 * on two machine classes and two suites, then the exact rows, their order and grouping, the
 * filters (machine class, suite, workers, the newest K), the messages that name what the history
 * holds when nothing matches, run names (an id, latest, latest~N), and two runs side by side with
 * each change and its direction. Files live in a mkdtemp() folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ce_support.h"
#include "gradcheck.h"
#include "kiln/ce.h"

static char dir[64], db[128];

/* make_row's row with the KPI's unit and direction and one sample. */
static kiln_ce_row row_of(const char *model, int workers, const char *kpi, double value,
                          kiln_ce_verdict v) {
  kiln_ce_row r = make_row(model, workers, kpi, value, v);
  const kiln_ce_kpi_info *info = kiln_ce_kpi_lookup(kpi);
  snprintf(r.unit, sizeof r.unit, "%s", info ? info->unit : "");
  r.higher_is_better = info && info->higher_is_better;
  r.spread = isfinite(value) ? 0.001 : NAN;
  r.nsamples = isfinite(value) ? 1 : 0;
  r.samples[0] = value;
  r.busy = NAN;
  return r;
}

static void with_baseline(kiln_ce_row *r, double baseline) {
  r->has_baseline = true;
  r->baseline = baseline;
  r->baseline_spread = 0;
  r->change = (r->value - baseline) / fabs(baseline);
}

static void start(kiln_ce_result *r, const char *time, const char *commit, const char *suite,
                  const char *machine_class) {
  memset(r, 0, sizeof *r);
  snprintf(r->started_at, sizeof r->started_at, "%s", time);
  snprintf(r->git_commit, sizeof r->git_commit, "%s", commit);
  snprintf(r->suite_name, sizeof r->suite_name, "%s", suite);
  snprintf(r->suite_path, sizeof r->suite_path, "/suites/%s.prototxt", suite);
  snprintf(r->machine_class, sizeof r->machine_class, "%s", machine_class);
  r->duration_s = 60;
}

static void add(kiln_ce_result *r, kiln_ce_row row) {
  assert_int_equal(kiln_ce_result_add_row(r, &row), KILN_OK);
}

/* Run 1 and 2 (quick, amd-f25m17-avx2rate-2c), 3 (nightly, big-16c, with cifar), 4 (quick, amd-f25m17-avx2rate-2c:
 * accuracy regressed, 2 workers skipped). */
static int group_setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-test-ceq-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(db, sizeof db, "%s/ce.db", dir);
  kiln_ce_history *h;
  if (kiln_ce_history_open(db, &h)) return -1;
  kiln_ce_result r;
  kiln_ce_row x;

  start(&r, "2026-11-01T10:00:00Z", "aaa1111", "quick", "amd-f25m17-avx2rate-2c");
  add(&r, row_of("lenet", 1, "accuracy", 0.85, KILN_CE_NEW));
  add(&r, row_of("lenet", 1, "duration_s", 30, KILN_CE_NEW));
  add(&r, row_of("lenet", 2, "accuracy", 0.84, KILN_CE_NEW));
  if (kiln_ce_history_record(h, &r)) return -1;
  kiln_ce_result_free(&r);

  start(&r, "2026-11-02T10:00:00Z", "bbb2222-dirty", "quick", "amd-f25m17-avx2rate-2c");
  x = row_of("lenet", 1, "accuracy", 0.86, KILN_CE_PASS);
  with_baseline(&x, 0.85);
  add(&r, x);
  x = row_of("lenet", 1, "duration_s", 27, KILN_CE_PASS);
  with_baseline(&x, 30);
  add(&r, x);
  add(&r, row_of("lenet", 2, "accuracy", 0.845, KILN_CE_PASS));
  if (kiln_ce_history_record(h, &r)) return -1;
  kiln_ce_result_free(&r);

  start(&r, "2026-11-03T10:00:00Z", "ccc3333", "nightly", "big-16c");
  add(&r, row_of("lenet", 1, "accuracy", 0.87, KILN_CE_NEW));
  add(&r, row_of("cifar", 1, "accuracy", 0.7, KILN_CE_NEW));
  if (kiln_ce_history_record(h, &r)) return -1;
  kiln_ce_result_free(&r);

  start(&r, "2026-11-04T10:00:00Z", "ddd4444", "quick", "amd-f25m17-avx2rate-2c");
  x = row_of("lenet", 1, "accuracy", 0.83, KILN_CE_REGRESSION);
  with_baseline(&x, 0.85);
  snprintf(x.reason, sizeof x.reason, "accuracy 0.83 is worse than the baseline 0.85");
  add(&r, x);
  x = row_of("lenet", 1, "duration_s", 33, KILN_CE_PASS);
  with_baseline(&x, 30);
  add(&r, x);
  x = row_of("lenet", 2, "run", NAN, KILN_CE_SKIP);
  snprintf(x.reason, sizeof x.reason, "mpirun not found");
  add(&r, x);
  if (kiln_ce_history_record(h, &r)) return -1;
  kiln_ce_result_free(&r);
  kiln_ce_history_close(h);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  char p[160];
  const char *names[] = {"ce.db", "ce.db-wal", "ce.db-shm"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  return rmdir(dir);
}

static kiln_ce_history *open_db(void) {
  kiln_ce_history *h;
  if (kiln_ce_history_open(db, &h)) fail_msg("%s", kiln_last_error());
  return h;
}

/* The rows of a query as "kpi wN rR" words, for exact comparison of order and content. */
static void query_words(kiln_ce_history *h, const kiln_ce_query *q, char *buf, size_t n) {
  kiln_ce_history_row *rows;
  int count;
  if (kiln_ce_history_query(h, q, &rows, &count)) fail_msg("%s", kiln_last_error());
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < count; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%s w%d r%lld", i ? ", " : "", rows[i].kpi,
                            rows[i].workers, (long long)rows[i].run_id);
  free(rows);
}

static void test_history_series(void **state) {
  (void)state;
  kiln_ce_history *h = open_db();
  kiln_ce_query q = {.model = "lenet", .kpi = "accuracy", .machine_class = "amd-f25m17-avx2rate-2c"};
  kiln_ce_history_row *rows;
  int n;
  assert_int_equal(kiln_ce_history_query(h, &q, &rows, &n), KILN_OK);
  assert_int_equal(n, 5); /* run 3 is of another class */
  /* 1 worker, oldest first */
  assert_int_equal(rows[0].run_id, 1);
  assert_string_equal(rows[0].time, "2026-11-01T10:00:00Z");
  assert_string_equal(rows[0].git_commit, "aaa1111");
  assert_string_equal(rows[0].suite, "quick");
  assert_string_equal(rows[0].machine_class, "amd-f25m17-avx2rate-2c");
  assert_string_equal(rows[0].model, "lenet");
  assert_int_equal(rows[0].workers, 1);
  assert_true(rows[0].value == 0.85);
  assert_true(rows[0].spread == 0.001);
  assert_true(isnan(rows[0].baseline) && isnan(rows[0].change));
  assert_string_equal(rows[0].verdict, "new");
  assert_true(rows[0].higher_is_better);
  assert_int_equal(rows[1].run_id, 2);
  assert_string_equal(rows[1].git_commit, "bbb2222-dirty");
  assert_true(rows[1].value == 0.86);
  assert_true(rows[1].baseline == 0.85);
  assert_float_equal(rows[1].change, 0.01 / 0.85, 1e-12);
  assert_string_equal(rows[1].verdict, "pass");
  assert_int_equal(rows[2].run_id, 4);
  assert_true(rows[2].value == 0.83);
  assert_float_equal(rows[2].change, -0.02 / 0.85, 1e-12);
  assert_string_equal(rows[2].verdict, "regression");
  assert_string_equal(rows[2].reason, "accuracy 0.83 is worse than the baseline 0.85");
  /* then 2 workers */
  assert_int_equal(rows[3].workers, 2);
  assert_int_equal(rows[3].run_id, 1);
  assert_true(rows[3].value == 0.84);
  assert_int_equal(rows[4].run_id, 2);
  assert_true(rows[4].value == 0.845);
  free(rows);

  /* every KPI of the model, grouped in the order the newest run recorded them */
  char words[1024];
  q.kpi = NULL;
  query_words(h, &q, words, sizeof words);
  assert_string_equal(words, "accuracy w1 r1, accuracy w1 r2, accuracy w1 r4, accuracy w2 r1, "
                             "accuracy w2 r2, duration_s w1 r1, duration_s w1 r2, "
                             "duration_s w1 r4, run w2 r4");
  assert_int_equal(kiln_ce_history_query(h, &q, &rows, &n), KILN_OK);
  assert_string_equal(rows[5].unit, "s");
  assert_false(rows[5].higher_is_better);
  assert_true(rows[8].value != rows[8].value); /* the skipped run: no value */
  assert_string_equal(rows[8].verdict, "skipped");
  assert_string_equal(rows[8].reason, "mpirun not found");
  free(rows);

  /* the newest 2 of each series */
  q.last = 2;
  query_words(h, &q, words, sizeof words);
  assert_string_equal(words, "accuracy w1 r2, accuracy w1 r4, accuracy w2 r1, accuracy w2 r2, "
                             "duration_s w1 r2, duration_s w1 r4, run w2 r4");
  /* one worker count: the newest of its runs (4) recorded only the skipped run, so that first */
  q.last = 0;
  q.workers = 2;
  query_words(h, &q, words, sizeof words);
  assert_string_equal(words, "run w2 r4, accuracy w2 r1, accuracy w2 r2");
  /* every machine class */
  q = (kiln_ce_query){.model = "lenet", .kpi = "accuracy", .workers = 1};
  query_words(h, &q, words, sizeof words);
  assert_string_equal(words, "accuracy w1 r1, accuracy w1 r2, accuracy w1 r3, accuracy w1 r4");
  /* one suite (by name) */
  q = (kiln_ce_query){.model = "lenet", .suite = "nightly"};
  query_words(h, &q, words, sizeof words);
  assert_string_equal(words, "accuracy w1 r3");
  q = (kiln_ce_query){.model = "cifar", .machine_class = ""}; /* "": every class */
  query_words(h, &q, words, sizeof words);
  assert_string_equal(words, "accuracy w1 r3");
  kiln_ce_history_close(h);
}

static void test_history_nothing_matches(void **state) {
  (void)state;
  kiln_ce_history *h = open_db();
  kiln_ce_history_row *rows = (kiln_ce_history_row *)1;
  int n = -1;
  struct {
    kiln_ce_query q;
    const char *want;
  } cases[] = {
      /* a misspelt model: the models of the class */
      {{.model = "lenett", .machine_class = "amd-f25m17-avx2rate-2c"},
       "no model 'lenett' in the history on machine class amd-f25m17-avx2rate-2c (models: lenet)"},
      {{.model = "lenett"}, "no model 'lenett' in the history (models: cifar, lenet)"},
      /* a model of another class: where it has history */
      {{.model = "cifar", .machine_class = "amd-f25m17-avx2rate-2c"},
       "model 'cifar' has no history on machine class amd-f25m17-avx2rate-2c; it has on machine class "
       "big-16c"},
      /* a misspelt KPI: the model's KPIs */
      {{.model = "lenet", .kpi = "acuracy", .machine_class = "amd-f25m17-avx2rate-2c"},
       "model 'lenet' has no KPI 'acuracy' in the history on machine class amd-f25m17-avx2rate-2c (its "
       "KPIs: accuracy, duration_s, run)"},
      /* filters that leave nothing: what the series has */
      {{.model = "lenet", .kpi = "accuracy", .machine_class = "amd-f25m17-avx2rate-2c", .workers = 4},
       "no history of model 'lenet' KPI 'accuracy' with 4 workers (recorded: workers 1, 2; "
       "suites quick)"},
      {{.model = "lenet", .suite = "text"},
       "no history of model 'lenet' in suite 'text' (recorded: workers 1, 2; suites nightly, "
       "quick)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(kiln_ce_history_query(h, &cases[i].q, &rows, &n), KILN_ERR_INVALID);
    assert_contains(kiln_last_error(), cases[i].want);
    assert_contains(kiln_last_error(), db); /* names the history */
    assert_null(rows);
    assert_int_equal(n, 0);
  }
  kiln_ce_query none = {.model = ""};
  assert_int_equal(kiln_ce_history_query(h, &none, &rows, &n), KILN_ERR_INVALID);
  kiln_ce_history_close(h);
}

static void test_resolve_run(void **state) {
  (void)state;
  kiln_ce_history *h = open_db();
  struct {
    const char *spec;
    int64_t id;
  } good[] = {{"latest", 4}, {"latest~0", 4}, {"latest~1", 3}, {"latest~3", 1}, {"2", 2},
              {"17", 17}}; /* an id is checked when the run is loaded */
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    int64_t id = -1;
    if (kiln_ce_history_resolve_run(h, good[i].spec, &id)) fail_msg("%s", kiln_last_error());
    assert_int_equal(id, good[i].id);
  }
  /* malformed names are bad usage (PARSE), not a run that is missing */
  const char *bad[] = {"latest~", "latest~x", "latest~-1", "latest1", "newest", "0", "-3", "2x",
                       "", "0x1", "+2", " 2", "99999999999999999999", "latest~99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t id = -1;
    assert_int_equal(kiln_ce_history_resolve_run(h, bad[i], &id), KILN_ERR_PARSE);
    assert_contains(kiln_last_error(), "expected a run id (1 to 9223372036854775807, as `kiln ce "
                                       "run` prints it), latest or latest~N");
    assert_int_equal(id, -1);
  }
  int64_t id = -1;
  assert_int_equal(kiln_ce_history_resolve_run(h, "latest~4", &id), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "run 'latest~4': the history has 4 runs");
  kiln_ce_result r;
  assert_int_equal(kiln_ce_history_load_run(h, 17, &r), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "no run 17");
  kiln_ce_history_close(h);
}

static void test_compare_runs(void **state) {
  (void)state;
  kiln_ce_history *h = open_db();
  kiln_ce_result a, b;
  assert_int_equal(kiln_ce_history_load_run(h, 2, &a), KILN_OK);
  assert_int_equal(kiln_ce_history_load_run(h, 4, &b), KILN_OK);
  kiln_ce_history_close(h);
  kiln_ce_pair *p;
  int n;
  assert_int_equal(kiln_ce_compare_runs(&a, &b, &p, &n), KILN_OK);
  assert_int_equal(n, 4);
  /* accuracy fell: worse */
  assert_string_equal(p[0].model, "lenet");
  assert_string_equal(p[0].kpi, "accuracy");
  assert_int_equal(p[0].workers, 1);
  assert_true(p[0].in_a && p[0].in_b);
  assert_true(p[0].a == 0.86 && p[0].b == 0.83);
  assert_float_equal(p[0].change, (0.83 - 0.86) / 0.86, 1e-12);
  assert_int_equal(p[0].better, -1);
  assert_int_equal(p[0].verdict_a, KILN_CE_PASS);
  assert_int_equal(p[0].verdict_b, KILN_CE_REGRESSION);
  /* duration grew: lower is better, so worse */
  assert_string_equal(p[1].kpi, "duration_s");
  assert_string_equal(p[1].unit, "s");
  assert_float_equal(p[1].change, 6.0 / 27, 1e-12);
  assert_int_equal(p[1].better, -1);
  /* only run 2 has 2 workers' accuracy */
  assert_string_equal(p[2].kpi, "accuracy");
  assert_int_equal(p[2].workers, 2);
  assert_true(p[2].in_a && !p[2].in_b);
  assert_true(p[2].a == 0.845 && isnan(p[2].b));
  assert_true(isnan(p[2].change));
  assert_int_equal(p[2].better, 0);
  assert_int_equal(p[2].verdict_b, KILN_CE_VERDICT_COUNT);
  /* only run 4 has the skipped 2-worker run: last */
  assert_string_equal(p[3].kpi, "run");
  assert_true(!p[3].in_a && p[3].in_b);
  assert_int_equal(p[3].verdict_a, KILN_CE_VERDICT_COUNT);
  assert_int_equal(p[3].verdict_b, KILN_CE_SKIP);
  free(p);

  /* the other way round: both better */
  assert_int_equal(kiln_ce_compare_runs(&b, &a, &p, &n), KILN_OK);
  assert_int_equal(n, 4);
  assert_int_equal(p[0].better, 1);
  assert_float_equal(p[0].change, (0.86 - 0.83) / 0.83, 1e-12);
  assert_int_equal(p[1].better, 1);
  assert_float_equal(p[1].change, -6.0 / 33, 1e-12);
  assert_string_equal(p[2].kpi, "run"); /* b's rows first now */
  assert_string_equal(p[3].kpi, "accuracy");
  assert_true(!p[3].in_a && p[3].in_b);
  free(p);
  kiln_ce_result_free(&a);
  kiln_ce_result_free(&b);

  /* from 0 there is no relative change, but still a direction; equal values are the same */
  kiln_ce_result z0, z1;
  start(&z0, "t", "c", "s", "m");
  start(&z1, "t", "c", "s", "m");
  add(&z0, row_of("g2p", 1, "per", 0, KILN_CE_NEW));
  add(&z1, row_of("g2p", 1, "per", 0.1, KILN_CE_NEW));
  add(&z0, row_of("g2p", 1, "word_accuracy", 0.5, KILN_CE_NEW));
  add(&z1, row_of("g2p", 1, "word_accuracy", 0.5, KILN_CE_NEW));
  assert_int_equal(kiln_ce_compare_runs(&z0, &z1, &p, &n), KILN_OK);
  assert_int_equal(n, 2);
  assert_true(isnan(p[0].change));
  assert_int_equal(p[0].better, -1); /* per: lower is better */
  assert_float_equal(p[1].change, 0, 0);
  assert_int_equal(p[1].better, 0);
  free(p);
  kiln_ce_result_free(&z0);
  kiln_ce_result_free(&z1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_history_series),
      cmocka_unit_test(test_history_nothing_matches),
      cmocka_unit_test(test_resolve_run),
      cmocka_unit_test(test_compare_runs),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
