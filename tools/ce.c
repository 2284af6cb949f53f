/* kiln ce: continuous evaluation from the command line. `run` trains a suite and judges it,
 * `accept` turns a run's values into baselines, `stability` trains one model several times to
 * show how much its KPIs move (`history` and `compare`, which read the history, are in
 * cequery.c). Exit codes: 0 pass, 1 regression, 2 absolute failure, 3 the
 * harness could not run (bad suite, database, report folder, missing data). */
#include <limits.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kiln/ce.h"
#include "tool.h"

enum { EXIT_HARNESS = 3 };

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce run SUITE [--db F] [--report-dir D] [--warn-only] [--machine-class C]\n"
          "                         [--model NAME] [--repeats N] [--mpirun PATH]\n"
          "       kiln ce accept SUITE|RUN_ID [--db F] [--baseline-dir D]\n"
          "       kiln ce stability MODEL [--times N] [--suite S] [--report-dir D]\n"
          "       kiln ce history MODEL [KPI] [--db F] [--machine-class C|--all-classes]\n"
          "                       [--workers N] [--last K] [--suite S] [--format table|tsv]\n"
          "       kiln ce compare RUN_A RUN_B [--db F]\n"
          "       kiln ce bisect MODEL KPI GOOD BAD [--suite S] [--workers N] [--build CMD]\n"
          "\n"
          "run: trains every model of the suite on each worker count, compares the KPIs with the\n"
          "     baselines and records them in the history (default ~/.local/share/kiln/ce.db).\n"
          "     Exit 0 pass, 1 regression, 2 absolute failure, 3 harness could not run;\n"
          "     --warn-only exits 0 whatever the verdicts; --model runs one model of the suite,\n"
          "     --repeats overrides the suite's repeats.\n"
          "accept: writes baselines (per machine class) from the newest run of SUITE, or of\n"
          "     run RUN_ID.\n"
          "stability: trains one model of a suite (default ce/quick.prototxt) N times (default 5)\n"
          "     and prints each KPI's spread, to choose tolerances.\n"
          "history: a model's KPIs run by run from the history (default: this machine class's;\n"
          "     every KPI unless one is named; --last K: the newest K of each series).\n"
          "compare: every KPI of two runs side by side with the change; a run is its id (as\n"
          "     `kiln ce run` prints it), latest or latest~N.\n"
          "     history and compare exit 1 when the history has no such model, KPI or run.\n"
          "bisect: builds the commits between GOOD and BAD in a scratch git worktree, runs the\n"
          "     model's case of the suite on each and names the first whose KPI is worse than\n"
          "     GOOD's by more than the suite's tolerance (`kiln ce bisect --help`).\n"
          "`kiln ce COMMAND --help` prints each one's options.\n");
}

#define CE_DB_OPTION                                                                             \
  "  --db FILE              the history (default $XDG_DATA_HOME/kiln/ce.db, else\n"              \
  "                         ~/.local/share/kiln/ce.db)\n"

static void run_usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce run SUITE [options]\n"
          "\n"
          "Trains every model of the suite (a CeSuite prototxt, e.g. ce/quick.prototxt) on each\n"
          "of its worker counts, judges the KPIs against the baselines and floors, records them\n"
          "in the history and writes a report (docs/ce.md). Exit 0 pass, 1 regression, 2 absolute\n"
          "failure, 3 the harness could not run.\n"
          "\n"
          "options:\n" CE_DB_OPTION
          "  --report-dir DIR       the run's folder and report (default: ce-runs/SUITE-TIME beside\n"
          "                         the history)\n"
          "  --warn-only            exit 0 whatever the verdicts (3 still when the harness could\n"
          "                         not run)\n"
          "  --machine-class C      judge against class C's baselines (default: this machine's)\n"
          "  --model NAME           run only this model of the suite\n"
          "  --repeats N            train each model N times (default: the suite's repeats)\n"
          "  --mpirun PATH          the MPI launcher for several workers (default: mpirun on PATH)\n");
  tool_help_usage(f);
}

static void accept_usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce accept SUITE|RUN_ID [options]\n"
          "\n"
          "Writes the baselines (one file per model, under the run's machine class) from the\n"
          "newest run of SUITE, or from run RUN_ID of the history. Exit 0 when it wrote some, 1\n"
          "when none, 3 when it could not.\n"
          "\n"
          "options:\n" CE_DB_OPTION
          "  --baseline-dir DIR     write under DIR (default: the suite's baseline folder)\n");
  tool_help_usage(f);
}

static void stability_usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce stability MODEL [options]\n"
          "\n"
          "Trains one model of a suite several times and prints each KPI's median, min, max,\n"
          "standard deviation and relative spread, to choose tolerances (nothing is recorded).\n"
          "\n"
          "options:\n"
          "  --times N              the trainings (default 5)\n"
          "  --suite FILE           the suite the model is in (default ce/quick.prototxt)\n"
          "  --report-dir DIR       the runs' folder and report (default: ce-runs/stability-TIME\n"
          "                         beside the history)\n"
          "  --db FILE              the history whose folder holds the default report folder\n"
          "  --machine-class C      judge against class C's baselines (default: this machine's)\n"
          "  --mpirun PATH          the MPI launcher for several workers (default: mpirun on PATH)\n");
  tool_help_usage(f);
}

/* The usage of `kiln ce SUB` (all of kiln ce's for a subcommand it does not know). */
static void (*sub_usage(const char *sub))(FILE *f) {
  return !strcmp(sub, "run")         ? run_usage
         : !strcmp(sub, "accept")    ? accept_usage
         : !strcmp(sub, "stability") ? stability_usage
                                     : usage;
}

typedef struct ce_args {
  const char *target, *db, *report_dir, *machine_class, *mpirun, *baseline_dir, *suite, *model;
  bool warn_only;
  int repeats, times;
  kiln_config config; /* the environment's (include/kiln/config.h) */
} ce_args;

int tool_ce_option_value(const char *what, int argc, char **argv, int *i, const char **slot,
                         int *islot) {
  const char *opt = argv[*i];
  if (*i + 1 >= argc) {
    fprintf(stderr, "%s: %s needs a value\n", what, opt);
    return -1;
  }
  const char *v = argv[++*i];
  const char *cmd = strncmp(what, "kiln ", 5) ? what : what + 5; /* "ce history" */
  if (!tool_nonempty(cmd, opt, v)) return -1;
  if (slot) *slot = v;
  else if (!tool_int_option_int(cmd, opt, v, 1, INT_MAX, islot)) return -1;
  return 0;
}

static int parse_args(int argc, char **argv, ce_args *a) {
  for (int i = 2; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "--warn-only")) {
      a->warn_only = true;
      continue;
    }
    if (tool_is_help(s)) tool_help(sub_usage(argv[1]));
    const char **slot = !strcmp(s, "--db")              ? &a->db
                        : !strcmp(s, "--report-dir")    ? &a->report_dir
                        : !strcmp(s, "--machine-class") ? &a->machine_class
                        : !strcmp(s, "--mpirun")        ? &a->mpirun
                        : !strcmp(s, "--baseline-dir")  ? &a->baseline_dir
                        : !strcmp(s, "--suite")         ? &a->suite
                        : !strcmp(s, "--model")         ? &a->model
                                                        : NULL;
    int *islot = !strcmp(s, "--repeats") ? &a->repeats : !strcmp(s, "--times") ? &a->times : NULL;
    if (slot || islot) {
      if (tool_ce_option_value("kiln ce", argc, argv, &i, slot, islot)) return -1;
    } else if (s[0] == '-' && s[1]) {
      fprintf(stderr, "kiln ce: unknown option '%s'\n", s);
      return -1;
    } else if (!a->target) {
      a->target = s;
    } else {
      fprintf(stderr, "kiln ce: unexpected argument '%s'\n", s);
      return -1;
    }
  }
  return 0;
}

/* Ctrl-C (or a CI job cancelled) stops the training child too: children run in their own
 * process groups, so the runner has to be told. */
static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

static void on_progress(const char *msg, void *user) {
  (void)user;
  fprintf(stderr, "ce: %s\n", msg);
}

static int self_path(char *buf, size_t n) {
  ssize_t len = readlink("/proc/self/exe", buf, n - 1);
  if (len <= 0) return -1;
  buf[len] = '\0';
  return 0;
}

static const char *db_path(const ce_args *a, char *buf, size_t n) {
  if (a->db) return a->db;
  if (kiln_ce_history_default_path(&a->config, buf, n)) return NULL;
  return buf;
}

/* <folder of the db>/ce-runs/<suite>-<UTC time>: reports stay beside the history they plot. */
static void default_report_dir(const char *db, const char *suite, char *buf, size_t n) {
  char dir[4096];
  const char *slash = strrchr(db, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - db) : 1, slash ? db : ".");
  const char *base = strrchr(suite, '/');
  base = base ? base + 1 : suite;
  char name[256];
  snprintf(name, sizeof name, "%s", base);
  char *dot = strrchr(name, '.');
  if (dot && dot != name) *dot = '\0';
  char stamp[32];
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  int w = snprintf(buf, n, "%s/ce-runs/%s-%s", dir, name, stamp);
  if (w < 0 || (size_t)w >= n) snprintf(buf, n, "ce-runs/%s-%s", name, stamp);
}

/* Records, writes the reports and prints the table; returns the exit code. */
static int finish_run(kiln_ce_result *r, kiln_ce_history *h, const char *db, bool warn_only,
                      bool record) {
  bool harness_trouble = false;
  if (record && h && kiln_ce_history_record(h, r)) {
    fprintf(stderr, "kiln ce: history %s: %s\n", db, kiln_last_error());
    harness_trouble = true;
  }
  char jsonl[4200], html[4200];
  snprintf(jsonl, sizeof jsonl, "%s/results.jsonl", r->report_dir);
  snprintf(html, sizeof html, "%s/report.html", r->report_dir);
  if (kiln_ce_report_jsonl(r, jsonl)) {
    fprintf(stderr, "kiln ce: %s\n", kiln_last_error());
    harness_trouble = true;
  }
  if (kiln_ce_report_html(r, h, html)) {
    fprintf(stderr, "kiln ce: %s\n", kiln_last_error());
    harness_trouble = true;
  }
  const char *nc = getenv("NO_COLOR");
  bool colour = isatty(STDOUT_FILENO) && !(nc && *nc);
  char *table = kiln_ce_report_table(r, colour);
  if (table) fputs(table, stdout);
  free(table);
  int code = kiln_ce_result_exit_code(r);
  static const char *const words[] = {"pass", "regression", "absolute failure",
                                      "harness could not run everything"};
  printf("\nsuite %s: %s (exit %d%s) in %.0f s on %s\n", r->suite_name, words[code], code,
         warn_only && code != 0 && code != EXIT_HARNESS ? ", --warn-only: exiting 0" : "",
         r->duration_s, r->machine_class);
  printf("report: %s\n", html);
  printf("results: %s\n", jsonl);
  if (record && h && r->run_id > 0) printf("history: %s (run %lld)\n", db, (long long)r->run_id);
  fflush(stdout);
  if (code == 0 && harness_trouble) code = EXIT_HARNESS;
  if (warn_only && code != EXIT_HARNESS) code = 0;
  return code;
}

/* Whether two paths name one place: the same file when both exist, else the same folder and
 * name (a path that does not exist yet, spelt ./x or x). */
static bool same_path(const char *a, const char *b) {
  struct stat sa, sb;
  if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char ra[PATH_MAX], rb[PATH_MAX], da[PATH_MAX], db[PATH_MAX];
  snprintf(da, sizeof da, "%s", a);
  snprintf(db, sizeof db, "%s", b);
  const char *na = strrchr(a, '/'), *nb = strrchr(b, '/');
  char *sla = strrchr(da, '/'), *slb = strrchr(db, '/');
  if (sla) *sla = '\0';
  if (slb) *slb = '\0';
  if (!realpath(sla ? (da[0] ? da : "/") : ".", ra) || !realpath(slb ? (db[0] ? db : "/") : ".", rb))
    return false;
  return !strcmp(ra, rb) && !strcmp(na ? na + 1 : a, nb ? nb + 1 : b);
}

static int ce_run(const ce_args *a, const char *only_model, int repeats, bool record) {
  if (!a->target) {
    run_usage(stderr);
    return EXIT_HARNESS;
  }
  char self[PATH_MAX], dbbuf[4096], report[4096];
  if (self_path(self, sizeof self)) {
    fprintf(stderr, "kiln ce: cannot find the kiln executable (/proc/self/exe)\n");
    return EXIT_HARNESS;
  }
  const char *db = db_path(a, dbbuf, sizeof dbbuf);
  if (!db) {
    fprintf(stderr, "kiln ce: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  if (a->report_dir) snprintf(report, sizeof report, "%s", a->report_dir);
  else default_report_dir(db, a->target, report, sizeof report);
  /* The report folder first: one that cannot be made (or that is the history itself) stops the
   * run before a history is created. */
  if (same_path(report, db)) {
    fprintf(stderr, "kiln ce: --report-dir %s and the history %s are the same path\n", report, db);
    return EXIT_HARNESS;
  }
  const bool made_report = access(report, F_OK) != 0;
  if (kiln_mkdir_p(report)) {
    fprintf(stderr, "kiln ce: report folder: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  kiln_ce_history *h = NULL;
  if (kiln_ce_history_open(db, &h)) {
    fprintf(stderr, "kiln ce: %s\n", kiln_last_error());
    if (made_report) rmdir(report);
    return EXIT_HARNESS;
  }
  kiln_ce_options o = {.kiln_path = self, .report_dir = report, .machine_class = a->machine_class,
                       .mpirun = a->mpirun, .only_model = only_model, .repeats = repeats,
                       .progress = on_progress, .cancel = &interrupted, .config = &a->config};
  kiln_ce_result r;
  catch_signals();
  if (kiln_ce_run(a->target, &o, &r)) {
    fprintf(stderr, "kiln ce: %s%s\n", kiln_last_error(),
            interrupted ? " (nothing recorded in the history)" : "");
    kiln_ce_history_close(h);
    if (made_report) rmdir(report); /* when nothing went into it */
    return EXIT_HARNESS;
  }
  int code = finish_run(&r, h, db, a->warn_only, record);
  kiln_ce_result_free(&r);
  kiln_ce_history_close(h);
  return code;
}

static bool all_digits(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return false;
  return true;
}

static int ce_accept(const ce_args *a) {
  if (!a->target) {
    accept_usage(stderr);
    return EXIT_HARNESS;
  }
  char dbbuf[4096];
  const char *db = db_path(a, dbbuf, sizeof dbbuf);
  kiln_ce_history *h = NULL;
  /* accept reads the history and writes baselines only: a missing history is not created */
  if (!db || kiln_ce_history_open_existing(db, &h)) {
    fprintf(stderr, "kiln ce accept: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  int64_t run_id = 0;
  int rc = KILN_OK;
  if (all_digits(a->target) || !strncmp(a->target, "latest", 6)) {
    rc = kiln_ce_history_resolve_run(h, a->target, &run_id);
  } else {
    char real[PATH_MAX];
    if (!realpath(a->target, real)) {
      fprintf(stderr, "kiln ce accept: %s: no such suite file (or give a run id)\n", a->target);
      kiln_ce_history_close(h);
      return EXIT_HARNESS;
    }
    rc = kiln_ce_history_last_run(h, real, &run_id);
  }
  kiln_ce_result r;
  memset(&r, 0, sizeof r);
  if (!rc) rc = kiln_ce_history_load_run(h, run_id, &r);
  kiln_ce_history_close(h);
  if (rc) {
    fprintf(stderr, "kiln ce accept: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  char dir[4096];
  if (a->baseline_dir) {
    snprintf(dir, sizeof dir, "%s", a->baseline_dir);
  } else {
    Caffe__CeSuite *s;
    if (kiln_ce_suite_load(r.suite_path, &s)) {
      fprintf(stderr, "kiln ce accept: run %lld's suite: %s (give --baseline-dir)\n",
              (long long)run_id, kiln_last_error());
      kiln_ce_result_free(&r);
      return EXIT_HARNESS;
    }
    kiln_ce_suite_baseline_dir(s, r.suite_path, dir, sizeof dir);
    protobuf_c_message_free_unpacked(&s->base, NULL);
  }
  int written = 0;
  rc = kiln_ce_accept(&r, dir, &written);
  for (int i = 0; i < r.nwarnings; i++) fprintf(stderr, "kiln ce accept: %s\n", r.warnings[i]);
  if (rc) {
    fprintf(stderr, "kiln ce accept: %s\n", kiln_last_error());
    kiln_ce_result_free(&r);
    return EXIT_HARNESS;
  }
  printf("accepted %d model%s of run %lld (%s, commit %s) into %s/%s/\n", written,
         written == 1 ? "" : "s", (long long)run_id, r.suite_name, r.git_commit, dir,
         r.machine_class);
  kiln_ce_result_free(&r);
  return written > 0 ? 0 : 1;
}

static int ce_stability(ce_args *a) {
  if (!a->target) {
    stability_usage(stderr);
    return EXIT_HARNESS;
  }
  const char *model = a->target;
  int times = a->times > 0 ? a->times : 5;
  if (times > KILN_CE_MAX_SAMPLES / 2) {
    fprintf(stderr, "kiln ce stability: --times is at most %d\n", KILN_CE_MAX_SAMPLES / 2);
    return EXIT_HARNESS;
  }
  char self[PATH_MAX], report[4096], dbbuf[4096];
  if (self_path(self, sizeof self)) return EXIT_HARNESS;
  const char *suite = a->suite ? a->suite : "ce/quick.prototxt";
  if (a->report_dir) {
    snprintf(report, sizeof report, "%s", a->report_dir);
  } else {
    const char *db = db_path(a, dbbuf, sizeof dbbuf);
    default_report_dir(db ? db : "./ce.db", "stability", report, sizeof report);
  }
  kiln_ce_options o = {.kiln_path = self, .report_dir = report, .machine_class = a->machine_class,
                       .mpirun = a->mpirun, .only_model = model, .repeats = times,
                       .progress = on_progress, .cancel = &interrupted, .config = &a->config};
  kiln_ce_result r;
  catch_signals();
  if (kiln_ce_run(suite, &o, &r)) {
    fprintf(stderr, "kiln ce stability: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  printf("%-14s %7s %3s %12s %12s %12s %11s %8s\n", "KPI", "workers", "n", "median", "min", "max",
         "stddev", "rel");
  for (int i = 0; i < r.nrows; i++) {
    const kiln_ce_row *row = &r.rows[i];
    if (row->nsamples == 0) {
      printf("%-14s %7d  %s: %s\n", row->kpi, row->workers, kiln_ce_verdict_name(row->verdict),
             row->reason);
      continue;
    }
    double lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < row->nsamples; k++) {
      lo = fmin(lo, row->samples[k]);
      hi = fmax(hi, row->samples[k]);
    }
    double med = kiln_ce_median(row->samples, row->nsamples);
    double sd = kiln_ce_stddev(row->samples, row->nsamples);
    printf("%-14s %7d %3d %12.6g %12.6g %12.6g %11.3g %7.2f%%\n", row->kpi, row->workers,
           row->nsamples, med, lo, hi, sd, med != 0 ? 100 * sd / fabs(med) : 0.0);
  }
  printf("\nA tolerance below noise_k x stddev would flag noise; see docs/ce.md.\n");
  int code = kiln_ce_result_exit_code(&r);
  kiln_ce_result_free(&r);
  return code == 2 || code == EXIT_HARNESS ? code : 0;
}

int cmd_ce(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? EXIT_HARNESS : 0;
  }
  if (!strcmp(argv[1], "history")) return cmd_ce_history(argc, argv);
  if (!strcmp(argv[1], "compare")) return cmd_ce_compare(argc, argv);
  if (!strcmp(argv[1], "bisect")) return cmd_ce_bisect(argc, argv);
  ce_args a = {0};
  if (parse_args(argc, argv, &a)) {
    sub_usage(argv[1])(stderr);
    return EXIT_HARNESS;
  }
  /* A malformed KILN_FAULT would fail every training: the harness stops before any. */
  if (kiln_config_from_env(&a.config)) {
    fprintf(stderr, "kiln ce: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "run")) return ce_run(&a, a.model, a.repeats, true);
  if (!strcmp(sub, "accept")) return ce_accept(&a);
  if (!strcmp(sub, "stability")) return ce_stability(&a);
  fprintf(stderr, "kiln ce: unknown subcommand '%s'\n", sub);
  usage(stderr);
  return EXIT_HARNESS;
}
