/* kiln ce history and kiln ce compare: the CE history read from the command line. `history`
 * prints one model's KPIs run by run (a table, or tab-separated values for scripts); `compare`
 * prints two runs side by side with the change of every KPI. Exit codes: 0 printed, 1 nothing in
 * the history matches (the message names what there is), 3 bad usage or no usable history. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/ce.h"
#include "tool.h"

enum { EXIT_NOT_FOUND = 1, EXIT_USAGE = 3 };

typedef struct query_args {
  const char *pos[2]; /* MODEL [KPI], or RUN_A RUN_B */
  int npos;
  const char *db, *machine_class, *suite, *format;
  bool all_classes;
  int workers, last;
} query_args;

static void history_usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce history MODEL [KPI] [options]\n"
          "\n"
          "A model's KPIs run by run from the CE history, one table per KPI (every KPI unless one\n"
          "is named), of this machine class's runs unless told otherwise. Exit 1 when the history\n"
          "has no such model, KPI or rows (the message names what it has), 3 for bad usage or no\n"
          "usable history.\n"
          "\n"
          "options:\n"
          "  --db FILE              the history (default $XDG_DATA_HOME/kiln/ce.db, else\n"
          "                         ~/.local/share/kiln/ce.db)\n"
          "  --machine-class C      the runs of machine class C\n"
          "  --all-classes          the runs of every machine class, in a column of their own\n"
          "  --workers N            only the rows of N workers\n"
          "  --last K               the newest K rows of each KPI and worker count\n"
          "  --suite S              only the runs of suite S (by its name)\n"
          "  --format table|tsv     tables (the default), or one tab-separated line per row with\n"
          "                         every field as stored, for scripts\n");
  tool_help_usage(f);
}

static void compare_usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce compare RUN_A RUN_B [--db F]\n"
          "\n"
          "Every KPI of two runs of the CE history side by side, with the change and both\n"
          "verdicts. A run is its id (as kiln ce run prints it), latest or latest~N (the Nth\n"
          "before the latest). Exit 1 when there is no such run, 3 for bad usage or no usable\n"
          "history.\n"
          "\n"
          "options:\n"
          "  --db FILE              the history (default $XDG_DATA_HOME/kiln/ce.db, else\n"
          "                         ~/.local/share/kiln/ce.db)\n");
  tool_help_usage(f);
}

static int parse(const char *cmd, int argc, char **argv, query_args *a) {
  char what[32];
  snprintf(what, sizeof what, "kiln ce %s", cmd);
  for (int i = 2; i < argc; i++) {
    const char *s = argv[i];
    if (tool_is_help(s)) tool_help(!strcmp(cmd, "history") ? history_usage : compare_usage);
    if (!strcmp(s, "--all-classes")) {
      a->all_classes = true;
      continue;
    }
    const char **slot = !strcmp(s, "--db")              ? &a->db
                        : !strcmp(s, "--machine-class") ? &a->machine_class
                        : !strcmp(s, "--suite")         ? &a->suite
                        : !strcmp(s, "--format")        ? &a->format
                                                        : NULL;
    int *islot = !strcmp(s, "--workers") ? &a->workers : !strcmp(s, "--last") ? &a->last : NULL;
    if (slot || islot) {
      if (tool_ce_option_value(what, argc, argv, &i, slot, islot)) return -1;
    } else if (s[0] == '-' && s[1]) {
      fprintf(stderr, "kiln ce %s: unknown option '%s'\n", cmd, s);
      return -1;
    } else if (a->npos < 2) {
      a->pos[a->npos++] = s;
    } else {
      fprintf(stderr, "kiln ce %s: unexpected argument '%s'\n", cmd, s);
      return -1;
    }
  }
  if (a->format && strcmp(a->format, "table") && strcmp(a->format, "tsv")) {
    fprintf(stderr, "kiln ce %s: --format '%s': expected table or tsv\n", cmd, a->format);
    return -1;
  }
  if (a->all_classes && a->machine_class) {
    fprintf(stderr, "kiln ce %s: --machine-class and --all-classes exclude each other\n", cmd);
    return -1;
  }
  return 0;
}

/* Reads the configuration and opens the history the arguments name, which must exist: reading
 * creates nothing. NULL after printing why. */
static kiln_ce_history *open_history(const char *cmd, const query_args *a, kiln_config *cfg,
                                     char *path, size_t n) {
  if (kiln_config_from_env(cfg)) {
    fprintf(stderr, "kiln ce %s: %s\n", cmd, kiln_last_error());
    return NULL;
  }
  if (a->db) snprintf(path, n, "%s", a->db);
  else if (kiln_ce_history_default_path(cfg, path, n)) {
    fprintf(stderr, "kiln ce %s: %s\n", cmd, kiln_last_error());
    return NULL;
  }
  kiln_ce_history *h = NULL;
  if (kiln_ce_history_open_existing(path, &h)) {
    fprintf(stderr, "kiln ce %s: %s\n", cmd, kiln_last_error());
    return NULL;
  }
  return h;
}

/* "2026-11-30T12:00:00Z" as "2026-11-30 12:00:00" */
static void fmt_time(char *buf, size_t n, const char *iso) {
  snprintf(buf, n, "%s", iso);
  char *t = strchr(buf, 'T');
  if (t) *t = ' ';
  size_t len = strlen(buf);
  if (len && buf[len - 1] == 'Z') buf[len - 1] = '\0';
}

static void fmt_change(char *buf, size_t n, double change) {
  if (isfinite(change)) snprintf(buf, n, "%+.1f%%", 100 * change);
  else snprintf(buf, n, "-");
}

/* A field of a tab-separated line: tabs and line breaks become spaces. */
static void tsv_text(const char *s) {
  for (; *s; s++) putchar(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s);
}

static void tsv_real(double v) {
  if (isfinite(v)) printf("%.15g", v);
}

static void print_history_tsv(const kiln_ce_history_row *rows, int n) {
  printf("run_id\ttime\tgit_commit\tsuite\tmachine_class\tmodel\tworkers\tkpi\tunit\tvalue\t"
         "spread\tbaseline\tchange\tverdict\treason\n");
  for (int i = 0; i < n; i++) {
    const kiln_ce_history_row *r = &rows[i];
    printf("%lld\t", (long long)r->run_id);
    const char *texts[] = {r->time, r->git_commit, r->suite, r->machine_class, r->model};
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
      tsv_text(texts[t]);
      putchar('\t');
    }
    printf("%d\t", r->workers);
    tsv_text(r->kpi);
    putchar('\t');
    tsv_text(r->unit);
    const double reals[] = {r->value, r->spread, r->baseline, r->change};
    for (size_t t = 0; t < sizeof reals / sizeof reals[0]; t++) {
      putchar('\t');
      tsv_real(reals[t]);
    }
    putchar('\t');
    tsv_text(r->verdict);
    putchar('\t');
    tsv_text(r->reason);
    putchar('\n');
  }
}

/* One table per KPI: run, time, commit, suite, [class,] workers, value, spread, baseline, change,
 * verdict; the reasons under it. */
static void print_history_table(const kiln_ce_history_row *rows, int n, bool show_class,
                                const char *machine_class) {
  int ws = 5, wc = 6, wm = 5, wv = 5; /* suite, commit, class, value columns */
  for (int i = 0; i < n; i++) {
    int s = (int)strlen(rows[i].suite), c = (int)strnlen(rows[i].git_commit, 12),
        m = (int)strlen(rows[i].machine_class);
    ws = s > ws ? s : ws;
    wc = c > wc ? c : wc;
    wm = m > wm ? m : wm;
    const double v[] = {rows[i].value, rows[i].spread, rows[i].baseline};
    for (int k = 0; k < 3; k++) {
      char text[48];
      kiln_ce_format_value(text, sizeof text, v[k], rows[i].unit);
      wv = (int)strlen(text) > wv ? (int)strlen(text) : wv;
    }
  }
  for (int i = 0; i < n;) {
    int end = i;
    while (end < n && !strcmp(rows[end].kpi, rows[i].kpi)) end++;
    const char *dir = !strcmp(rows[i].kpi, "run") ? "failed or skipped runs"
                      : rows[i].higher_is_better  ? "higher is better"
                                                  : "lower is better";
    printf("%s%s %s (%s%s%s)\n", i ? "\n" : "", rows[i].model, rows[i].kpi, dir,
           show_class ? "" : "; machine class ", show_class ? "" : machine_class);
    printf("%5s  %-19s  %-*s  %-*s  ", "run", "time (UTC)", wc, "commit", ws, "suite");
    if (show_class) printf("%-*s  ", wm, "class");
    printf("%7s  %*s  %*s  %*s  %8s  %s\n", "workers", wv, "value", wv, "spread", wv,
           "baseline", "change", "verdict");
    bool any_reason = false;
    for (int k = i; k < end; k++) {
      const kiln_ce_history_row *r = &rows[k];
      char when[32], value[48], spread[48], base[48], change[24];
      fmt_time(when, sizeof when, r->time);
      kiln_ce_format_value(value, sizeof value, r->value, r->unit);
      kiln_ce_format_value(spread, sizeof spread, r->spread, r->unit);
      kiln_ce_format_value(base, sizeof base, r->baseline, r->unit);
      fmt_change(change, sizeof change, r->change);
      printf("%5lld  %-19s  %-*.12s  %-*s  ", (long long)r->run_id, when, wc, r->git_commit, ws,
             r->suite);
      if (show_class) printf("%-*s  ", wm, r->machine_class);
      printf("%7d  %*s  %*s  %*s  %8s  %s\n", r->workers, wv, value, wv, spread, wv, base,
             change, r->verdict);
      any_reason |= r->reason[0] != '\0';
    }
    if (any_reason)
      for (int k = i; k < end; k++)
        if (rows[k].reason[0])
          printf("  run %lld x%d %s: %s\n", (long long)rows[k].run_id, rows[k].workers,
                 rows[k].verdict, rows[k].reason);
    i = end;
  }
}

int cmd_ce_history(int argc, char **argv) {
  query_args a = {0};
  if (parse("history", argc, argv, &a)) return EXIT_USAGE;
  if (a.npos < 1) {
    history_usage(stderr);
    return EXIT_USAGE;
  }
  kiln_config cfg;
  char path[4096], cls[128] = "";
  kiln_ce_history *h = open_history("history", &a, &cfg, path, sizeof path);
  if (!h) return EXIT_USAGE;
  if (a.machine_class) {
    snprintf(cls, sizeof cls, "%s", a.machine_class);
  } else if (!a.all_classes) { /* this machine's, as `kiln ce run` names it */
    kiln_ce_machine m;
    kiln_ce_machine_describe(&m, &cfg);
    kiln_ce_machine_class(&m, cls, sizeof cls);
  }
  kiln_ce_query q = {.model = a.pos[0], .kpi = a.npos > 1 ? a.pos[1] : NULL,
                     .machine_class = a.all_classes ? NULL : cls, .suite = a.suite,
                     .workers = a.workers, .last = a.last};
  kiln_ce_history_row *rows = NULL;
  int n = 0;
  int rc = kiln_ce_history_query(h, &q, &rows, &n);
  kiln_ce_history_close(h);
  if (rc) {
    fprintf(stderr, "kiln ce history: %s\n", kiln_last_error());
    return rc == KILN_ERR_INVALID ? EXIT_NOT_FOUND : EXIT_USAGE;
  }
  if (a.format && !strcmp(a.format, "tsv")) print_history_tsv(rows, n);
  else print_history_table(rows, n, a.all_classes, cls);
  free(rows);
  return 0;
}

/* ---- compare ----------------------------------------------------------------------------------- */

static void print_run_header(const char *label, const kiln_ce_result *r) {
  char when[32];
  fmt_time(when, sizeof when, r->started_at);
  printf("%s: run %lld, %s UTC, commit %s, suite %s, machine class %s\n", label,
         (long long)r->run_id, when, r->git_commit, r->suite_name, r->machine_class);
}

static void print_pairs(const kiln_ce_pair *p, int n) {
  int wm = 5, wk = 3, wv = 5;
  for (int i = 0; i < n; i++) {
    int m = (int)strlen(p[i].model), k = (int)strlen(p[i].kpi);
    wm = m > wm ? m : wm;
    wk = k > wk ? k : wk;
    const double v[] = {p[i].a, p[i].b};
    for (int j = 0; j < 2; j++) {
      char text[48];
      kiln_ce_format_value(text, sizeof text, v[j], p[i].unit);
      wv = (int)strlen(text) > wv ? (int)strlen(text) : wv;
    }
  }
  printf("%-*s  %7s  %-*s  %*s  %*s  %-15s  %-10s  %s\n", wm, "model", "workers", wk, "KPI", wv,
         "A", wv, "B", "change", "verdict A", "verdict B");
  for (int i = 0; i < n; i++) {
    char va[48] = "-", vb[48] = "-", change[40];
    if (p[i].in_a) kiln_ce_format_value(va, sizeof va, p[i].a, p[i].unit);
    if (p[i].in_b) kiln_ce_format_value(vb, sizeof vb, p[i].b, p[i].unit);
    const char *word = p[i].better > 0 ? "better" : p[i].better < 0 ? "worse" : "same";
    if (!isfinite(p[i].a) || !isfinite(p[i].b)) snprintf(change, sizeof change, "-");
    else if (p[i].a == p[i].b) snprintf(change, sizeof change, "same");
    else if (isfinite(p[i].change))
      snprintf(change, sizeof change, "%+.1f%% %s", 100 * p[i].change, word);
    else snprintf(change, sizeof change, "%s", word); /* from 0: no relative change */
    printf("%-*s  %7d  %-*s  %*s  %*s  %-15s  %-10s  %s\n", wm, p[i].model, p[i].workers, wk,
           p[i].kpi, wv, va, wv, vb, change, p[i].in_a ? kiln_ce_verdict_name(p[i].verdict_a) : "-",
           p[i].in_b ? kiln_ce_verdict_name(p[i].verdict_b) : "-");
  }
}

int cmd_ce_compare(int argc, char **argv) {
  query_args a = {0};
  if (parse("compare", argc, argv, &a)) return EXIT_USAGE;
  if (a.npos != 2 || a.machine_class || a.all_classes || a.suite || a.workers || a.last ||
      a.format) {
    compare_usage(stderr);
    return EXIT_USAGE;
  }
  kiln_config cfg;
  char path[4096];
  kiln_ce_history *h = open_history("compare", &a, &cfg, path, sizeof path);
  if (!h) return EXIT_USAGE;
  kiln_ce_result r[2];
  memset(r, 0, sizeof r);
  int rc = KILN_OK;
  for (int i = 0; i < 2 && rc == KILN_OK; i++) {
    int64_t id = 0;
    rc = kiln_ce_history_resolve_run(h, a.pos[i], &id);
    if (rc == KILN_OK) rc = kiln_ce_history_load_run(h, id, &r[i]);
  }
  kiln_ce_history_close(h);
  kiln_ce_pair *pairs = NULL;
  int n = 0;
  if (rc == KILN_OK) rc = kiln_ce_compare_runs(&r[0], &r[1], &pairs, &n);
  if (rc) {
    fprintf(stderr, "kiln ce compare: %s\n", kiln_last_error());
    kiln_ce_result_free(&r[0]);
    kiln_ce_result_free(&r[1]);
    return rc == KILN_ERR_INVALID ? EXIT_NOT_FOUND : EXIT_USAGE; /* a malformed name: PARSE */
  }
  print_run_header("A", &r[0]);
  print_run_header("B", &r[1]);
  if (strcmp(r[0].machine_class, r[1].machine_class))
    printf("warning: the runs are from different machine classes (%s, %s): their timings and "
           "memory are not comparable\n",
           r[0].machine_class, r[1].machine_class);
  printf("\n");
  print_pairs(pairs, n);
  free(pairs);
  kiln_ce_result_free(&r[0]);
  kiln_ce_result_free(&r[1]);
  return 0;
}
