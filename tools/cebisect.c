/* kiln ce bisect MODEL KPI GOOD BAD: the commit that made a KPI regress (src/ce/bisect.c does the
 * work; this prints its progress and the table of the steps). Exit codes: 0 the first bad commit
 * named, 1 the regression does not reproduce between GOOD and BAD (or every commit that could be
 * it is untestable), 3 the search could not run. */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/ce.h"
#include "tool.h"

enum { EXIT_NOT_FOUND = 1, EXIT_HARNESS = 3 };

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln ce bisect MODEL KPI GOOD BAD [options]\n"
          "\n"
          "The first commit between GOOD and BAD (first-parent history) whose KPI of MODEL is\n"
          "worse than GOOD's by more than the suite's tolerance. Each commit tested is built in\n"
          "a scratch git worktree (the repository's own tree, index and HEAD are not touched)\n"
          "and runs its own copy of the suite's case of the model with the suite's repeats;\n"
          "GOOD and BAD are measured first, then the range is halved. Exit 0 with the first bad\n"
          "commit named, 1 when the regression does not reproduce between GOOD and BAD, 3 when\n"
          "the search cannot run.\n"
          "\n"
          "options:\n"
          "  --suite S          the suite, in the repository (default ce/quick.prototxt)\n"
          "  --workers N        the worker count whose KPI is followed (default the model's\n"
          "                     first)\n"
          "  --repo DIR         the git repository (default the one holding the suite)\n"
          "  --build CMD        the build command, run by /bin/sh in each commit's tree\n"
          "                     (default: cmake's release build of kiln into build/)\n"
          "  --kiln PATH        the kiln it builds, relative to the tree (default build/kiln)\n"
          "  --build-timeout S  the limit on one build in seconds (default 3600)\n"
          "  --work-dir D       scratch folder for the worktree, build logs and run folders\n"
          "                     (default a new /tmp/kiln-bisect-XXXXXX); give the same one again\n"
          "                     to reuse its worktree's builds\n"
          "  --keep-worktree    leave the worktree (and its builds) in place at the end\n"
          "  --repeats N        runs per commit (default the suite's)\n"
          "  --machine-class C  the class the runs record (default this machine's)\n"
          "  --mpirun PATH      for several workers (default mpirun from PATH)\n");
  tool_help_usage(f);
}

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

static void on_progress(const char *msg, void *user) {
  (void)user;
  fprintf(stderr, "ce bisect: %s\n", msg);
}

typedef struct bisect_args {
  const char *pos[4];
  int npos;
  const char *suite, *repo, *build, *kiln, *work_dir, *machine_class, *mpirun, *build_timeout;
  bool keep;
  int workers, repeats;
} bisect_args;

static int parse(int argc, char **argv, bisect_args *a) {
  for (int i = 2; i < argc; i++) {
    const char *s = argv[i];
    if (tool_is_help(s)) tool_help(usage);
    if (!strcmp(s, "--keep-worktree")) {
      a->keep = true;
      continue;
    }
    const char **slot = !strcmp(s, "--suite")           ? &a->suite
                        : !strcmp(s, "--repo")          ? &a->repo
                        : !strcmp(s, "--build")         ? &a->build
                        : !strcmp(s, "--kiln")          ? &a->kiln
                        : !strcmp(s, "--work-dir")      ? &a->work_dir
                        : !strcmp(s, "--machine-class") ? &a->machine_class
                        : !strcmp(s, "--mpirun")        ? &a->mpirun
                        : !strcmp(s, "--build-timeout") ? &a->build_timeout
                                                        : NULL;
    int *islot = !strcmp(s, "--workers") ? &a->workers : !strcmp(s, "--repeats") ? &a->repeats
                                                                                 : NULL;
    if (slot || islot) {
      if (tool_ce_option_value("kiln ce bisect", argc, argv, &i, slot, islot)) return -1;
    } else if (s[0] == '-' && s[1]) {
      fprintf(stderr, "kiln ce bisect: unknown option '%s'\n", s);
      return -1;
    } else if (a->npos < 4) {
      a->pos[a->npos++] = s;
    } else {
      fprintf(stderr, "kiln ce bisect: unexpected argument '%s'\n", s);
      return -1;
    }
  }
  if (a->npos != 4) {
    fprintf(stderr, "kiln ce bisect: needs MODEL KPI GOOD BAD\n");
    return -1;
  }
  return 0;
}

static void value_text(char *buf, size_t n, double v, const char *unit) {
  if (!isfinite(v)) snprintf(buf, n, "-");
  else snprintf(buf, n, "%.4g%s%s", v, unit[0] ? " " : "", unit);
}

static void print_table(const kiln_ce_bisect_result *r) {
  printf("%s of %d worker%s (%s is better), GOOD %.12s, BAD %.12s: %d commit%s after GOOD\n",
         r->kpi, r->workers, r->workers == 1 ? "" : "s", r->higher_is_better ? "higher" : "lower",
         r->good, r->bad, r->commits, r->commits == 1 ? "" : "s");
  printf("%4s %8s  %-12s %14s %14s %9s  %-10s %s\n", "step", "position", "commit", "value",
         "spread", "change", "verdict", "subject");
  for (int i = 0; i < r->nsteps; i++) {
    const kiln_ce_bisect_step *s = &r->steps[i];
    char v[48], sp[48], ch[24];
    value_text(v, sizeof v, s->value, r->unit);
    value_text(sp, sizeof sp, s->spread, r->unit);
    if (isfinite(s->change)) snprintf(ch, sizeof ch, "%+.1f%%", 100 * s->change);
    else snprintf(ch, sizeof ch, "-");
    const char *verdict = s->position == 0                       ? "GOOD"
                          : s->verdict == KILN_CE_STEP_SKIP ? "untestable"
                          : s->verdict == KILN_CE_STEP_BAD  ? "bad"
                                                            : "good";
    printf("%4d %8d  %-12.12s %14s %14s %9s  %-10s %s\n", i + 1, s->position, s->commit, v, sp,
           ch, verdict, s->position == 0 ? "" : s->subject);
  }
  for (int i = 0; i < r->nsteps; i++)
    if (r->steps[i].reason[0] && r->steps[i].position > 0)
      printf("  %.12s: %s\n", r->steps[i].commit, r->steps[i].reason);
}

int cmd_ce_bisect(int argc, char **argv) {
  bisect_args a = {0};
  if (parse(argc, argv, &a)) {
    usage(stderr);
    return EXIT_HARNESS;
  }
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) {
    fprintf(stderr, "kiln ce bisect: %s\n", kiln_last_error());
    return EXIT_HARNESS;
  }
  double build_timeout = 0;
  if (a.build_timeout) {
    char *end;
    build_timeout = strtod(a.build_timeout, &end);
    if (*end || !(build_timeout > 0)) {
      fprintf(stderr, "kiln ce bisect: --build-timeout: '%s' is not a positive number of "
                      "seconds\n", a.build_timeout);
      return EXIT_HARNESS;
    }
  }
  const char *suite = a.suite ? a.suite : "ce/quick.prototxt";
  char repo[PATH_MAX], work[PATH_MAX];
  if (a.repo) {
    snprintf(repo, sizeof repo, "%s", a.repo);
  } else {
    snprintf(repo, sizeof repo, "%s", suite);
    char *slash = strrchr(repo, '/');
    if (slash) *slash = '\0';
    else snprintf(repo, sizeof repo, ".");
  }
  if (a.work_dir) {
    snprintf(work, sizeof work, "%s", a.work_dir);
  } else {
    snprintf(work, sizeof work, "/tmp/kiln-bisect-XXXXXX");
    if (!mkdtemp(work)) {
      perror("kiln ce bisect: mkdtemp");
      return EXIT_HARNESS;
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  kiln_ce_bisect_options o = {.repo = repo, .model = a.pos[0], .kpi = a.pos[1],
                              .good = a.pos[2], .bad = a.pos[3], .suite = suite,
                              .workers = a.workers, .build_command = a.build,
                              .kiln_path = a.kiln, .build_timeout_s = build_timeout,
                              .work_dir = work, .keep_worktree = a.keep,
                              .repeats = a.repeats, .machine_class = a.machine_class,
                              .mpirun = a.mpirun, .progress = on_progress,
                              .cancel = &interrupted, .config = &cfg};
  kiln_ce_bisect_result *r = malloc(sizeof *r);
  if (!r) {
    fprintf(stderr, "kiln ce bisect: out of memory\n");
    return EXIT_HARNESS;
  }
  int rc = kiln_ce_bisect(&o, r);
  if (rc) {
    fprintf(stderr, "kiln ce bisect: %s%s\n(logs and run folders: %s)\n", kiln_last_error(),
            interrupted ? " (interrupted)" : "", work);
    if (r->nsteps) print_table(r);
    free(r);
    return EXIT_HARNESS;
  }
  print_table(r);
  int code = 0;
  if (!r->reproduced) {
    printf("\nnot reproduced: BAD's %s is not worse than GOOD's by more than the tolerance; "
           "nothing to search\n", r->kpi);
    code = EXIT_NOT_FOUND;
  } else if (r->first_bad < 0) {
    printf("\nno first bad commit: every commit that could be it is untestable\n");
    code = EXIT_NOT_FOUND;
  } else {
    const kiln_ce_bisect_step *s = &r->steps[r->first_bad];
    if (r->ambiguous_from > 0)
      printf("\nfirst bad commit: one of positions %d to %d (the ones before %.12s are "
             "untestable); the first testable bad one is %.12s %s\n",
             r->ambiguous_from, s->position, s->commit, s->commit, s->subject);
    else
      printf("\nfirst bad commit: %s %s\n", s->commit, s->subject);
  }
  printf("logs and run folders: %s%s%s\n", work, a.keep ? "; worktree kept: " : "",
         a.keep ? r->worktree : "");
  free(r);
  return code;
}
