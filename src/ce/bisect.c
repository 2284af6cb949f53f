/* kiln ce bisect: the first commit between GOOD and BAD whose KPI is worse than GOOD's. Each
 * commit tested is checked out in one scratch worktree of the repository (so its build folder
 * carries over and builds are incremental), built by the build command, and its own copy of the
 * suite run for the one model and worker count through the same runner as `kiln ce run`, with
 * no baselines (nothing to judge there, no confirming re-runs): the harness stays this kiln's,
 * the trainer is the commit's. The search is git bisect's over the first-parent history, with
 * untestable commits skipped. Only git's worktree commands touch the user's repository. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"

typedef struct commit {
  char hash[41];
  char subject[160];
} commit;

typedef struct bisect {
  const kiln_ce_bisect_options *o;
  kiln_ce_bisect_result *r;
  char work[PATH_MAX], tree[PATH_MAX], logs[PATH_MAX], empty[PATH_MAX];
  char top[PATH_MAX];         /* the repository's top folder */
  char suite_rel[PATH_MAX];   /* the suite's path below it */
  kiln_ce_kpi_spec spec;
  double noise_k;
  commit *commits;            /* [0] GOOD, [1..n] the commits after it, [n] BAD */
  int n;
} bisect;

static void say(const bisect *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const bisect *b, const char *fmt, ...) {
  if (!b->o->progress) return;
  char buf[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  b->o->progress(buf, b->o->user);
}

static bool cancelled(const bisect *b) { return b->o->cancel && *b->o->cancel; }

/* Runs `git -C DIR ARGS...` with its output into logs/git.log; *out (when given) gets the
 * output, *code the exit code. KILN_OK when git ran and exited (any code). */
static int git_in(const bisect *b, const char *dir, const char *const *args, char **out,
                  int *code) {
  char *argv[16];
  const char *verb = args[0] ? args[0] : "";
  int k = 0;
  argv[k++] = "git";
  argv[k++] = "-C";
  argv[k++] = (char *)dir;
  for (; *args && k < 15; args++) argv[k++] = (char *)*args;
  argv[k] = NULL;
  kiln_ce_child c;
  ce_run_child(argv, b->logs, "git.log", 600, b->o->cancel, &c);
  if (out) *out = NULL;
  if (c.end != KILN_CE_CHILD_EXITED)
    return kiln_errorf(KILN_ERR_IO, "git %s could not run: %s", verb,
                       c.last_error[0] ? c.last_error : "is git installed?");
  *code = c.code;
  if (out) {
    char path[PATH_MAX + 16];
    size_t len;
    ce_fmt(path, sizeof path, "%s/git.log", b->logs);
    KILN_TRY(kiln_read_file(path, out, &len));
  }
  return KILN_OK;
}

/* The same, where anything but exit 0 is an error quoting git's last line. */
static int git_ok(const bisect *b, const char *dir, const char *what, const char *const *args,
                  char **out) {
  int code;
  char *text = NULL;
  KILN_TRY(git_in(b, dir, args, &text, &code));
  if (code != 0) {
    char last[300] = "";
    for (char *line = strtok(text ? text : (char *)"", "\n"); line; line = strtok(NULL, "\n"))
      ce_fmt(last, sizeof last, "%s", line);
    free(text);
    return kiln_errorf(KILN_ERR_INVALID, "%s: git says: %s", what, last[0] ? last : "(nothing)");
  }
  if (out) *out = text;
  else free(text);
  return KILN_OK;
}

static void chomp(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = '\0';
}

static int resolve(const bisect *b, const char *rev, const char *role, char *hash) {
  char spec[600], what[700];
  ce_fmt(spec, sizeof spec, "%s^{commit}", rev);
  ce_fmt(what, sizeof what, "%s '%s'", role, rev);
  char *out;
  const char *args[] = {"rev-parse", "--verify", "--quiet", spec, NULL};
  int code;
  KILN_TRY(git_in(b, b->o->repo, args, &out, &code));
  chomp(out);
  bool ok = code == 0 && strlen(out) == 40 && strspn(out, "0123456789abcdef") == 40;
  if (ok) memcpy(hash, out, 41);
  free(out);
  if (!ok)
    return kiln_errorf(KILN_ERR_INVALID, "%s is not a commit of the repository %s", what,
                       b->o->repo);
  return KILN_OK;
}

/* The commits after GOOD up to BAD on BAD's first-parent line, oldest first, behind GOOD. */
static int list_commits(bisect *b) {
  int code;
  const char *anc[] = {"merge-base", "--is-ancestor", b->r->good, b->r->bad, NULL};
  KILN_TRY(git_in(b, b->o->repo, anc, NULL, &code));
  if (code != 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "GOOD %.12s is not an ancestor of BAD %.12s: nothing lies between them to "
                       "search (swap them?)",
                       b->r->good, b->r->bad);
  if (!strcmp(b->r->good, b->r->bad))
    return kiln_errorf(KILN_ERR_INVALID, "GOOD and BAD are the same commit %.12s", b->r->good);
  char range[100];
  ce_fmt(range, sizeof range, "%s..%s", b->r->good, b->r->bad);
  const char *args[] = {"log", "--reverse", "--first-parent", "--format=%H%x09%s", range, NULL};
  char *out;
  KILN_TRY(git_ok(b, b->o->repo, "git log", args, &out));
  int lines = 1;
  for (const char *p = out; *p; p++) lines += *p == '\n';
  b->commits = calloc((size_t)lines + 1, sizeof *b->commits);
  if (!b->commits) {
    free(out);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  memcpy(b->commits[0].hash, b->r->good, 41);
  snprintf(b->commits[0].subject, sizeof b->commits[0].subject, "(GOOD)");
  int n = 0;
  for (char *save, *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *tab = strchr(line, '\t');
    if (!tab || tab - line != 40) continue;
    n++;
    memcpy(b->commits[n].hash, line, 40);
    b->commits[n].hash[40] = '\0';
    ce_fmt(b->commits[n].subject, sizeof b->commits[n].subject, "%s", tab + 1);
  }
  free(out);
  if (n == 0 || strcmp(b->commits[n].hash, b->r->bad))
    return kiln_errorf(KILN_ERR_INVALID, "git log %s listed no first-parent line to BAD", range);
  b->n = n;
  b->r->commits = n;
  return KILN_OK;
}

/* The suite's KPI entry for the model, as the runner judges it; the worker count to follow. */
static int kpi_of_suite(bisect *b) {
  const kiln_ce_bisect_options *o = b->o;
  Caffe__CeSuite *s;
  KILN_TRY(kiln_ce_suite_load(o->suite, &s));
  const Caffe__CeModel *m = NULL;
  for (size_t i = 0; i < s->n_model; i++)
    if (!strcmp(s->model[i]->name, o->model)) m = s->model[i];
  int rc = KILN_OK;
  if (!m) {
    kiln_strbuf names = {0};
    for (size_t i = 0; i < s->n_model; i++)
      kiln_strbuf_printf(&names, "%s%s", i ? ", " : "", s->model[i]->name);
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: no model named '%s' (its models: %s)", o->suite,
                     o->model, names.s ? names.s : "none");
    free(names.s);
  }
  const Caffe__CeKpi *k = NULL;
  for (size_t i = 0; !rc && i < m->n_kpi; i++)
    if (!strcmp(m->kpi[i]->name, o->kpi)) k = m->kpi[i];
  if (!rc && !k) {
    kiln_strbuf names = {0};
    for (size_t i = 0; i < m->n_kpi; i++)
      kiln_strbuf_printf(&names, "%s%s", i ? ", " : "", m->kpi[i]->name);
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: model '%s' declares no KPI '%s' (its KPIs: %s)",
                     o->suite, o->model, o->kpi, names.s ? names.s : "none");
    free(names.s);
  }
  if (!rc) rc = kiln_ce_kpi_resolve(k, &b->spec);
  if (!rc) {
    int w = o->workers > 0 ? o->workers : m->n_workers ? m->workers[0] : 1;
    bool has = m->n_workers == 0 && w == 1;
    for (size_t i = 0; i < m->n_workers; i++) has |= m->workers[i] == w;
    if (!has)
      rc = kiln_errorf(KILN_ERR_INVALID, "%s: model '%s' is not run on %d worker%s", o->suite,
                       o->model, w, w == 1 ? "" : "s");
    else if (b->spec.info->multi_worker && w == 1)
      rc = kiln_errorf(KILN_ERR_INVALID, "%s exists only for more than one worker (--workers N)",
                       o->kpi);
    b->r->workers = w;
    b->noise_k = s->noise_k;
  }
  protobuf_c_message_free_unpacked(&s->base, NULL);
  if (!rc) {
    snprintf(b->r->kpi, sizeof b->r->kpi, "%s", b->spec.info->name);
    snprintf(b->r->unit, sizeof b->r->unit, "%s", b->spec.info->unit);
    b->r->higher_is_better = b->spec.higher_is_better;
  }
  return rc;
}

/* The suite's path below the repository's top, so that each commit's tree has its copy. */
static int place_suite(bisect *b) {
  const char *args[] = {"rev-parse", "--show-toplevel", NULL};
  char *out;
  KILN_TRY(git_ok(b, b->o->repo, "the repository", args, &out));
  chomp(out);
  char real_top[PATH_MAX], real_suite[PATH_MAX];
  bool ok = realpath(out, real_top) != NULL;
  free(out);
  if (!ok) return kiln_errorf(KILN_ERR_IO, "%s: the repository's top folder", b->o->repo);
  snprintf(b->top, sizeof b->top, "%s", real_top);
  if (!realpath(b->o->suite, real_suite))
    return kiln_errorf(KILN_ERR_IO, "%s: %s", b->o->suite, strerror(errno));
  size_t n = strlen(real_top);
  if (strncmp(real_suite, real_top, n) || real_suite[n] != '/')
    return kiln_errorf(KILN_ERR_INVALID, "%s: the suite is not in the repository %s",
                       b->o->suite, real_top);
  snprintf(b->suite_rel, sizeof b->suite_rel, "%s", real_suite + n + 1);
  return KILN_OK;
}

/* The scratch worktree at GOOD: made, or (a folder kept from an earlier search) reused when git
 * lists it as a worktree of this repository. */
static int make_tree(bisect *b) {
  struct stat st;
  if (stat(b->tree, &st) == 0) {
    const char *args[] = {"worktree", "list", "--porcelain", NULL};
    char *out;
    KILN_TRY(git_ok(b, b->o->repo, "git worktree list", args, &out));
    char want[PATH_MAX + 16];
    ce_fmt(want, sizeof want, "worktree %s\n", b->tree);
    bool ours = strstr(out, want) != NULL;
    free(out);
    if (!ours)
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s exists and is not a worktree of %s: choose another work folder",
                         b->tree, b->top);
    return KILN_OK;
  }
  const char *args[] = {"worktree", "add", "--detach", "--quiet", b->tree, b->r->good, NULL};
  return git_ok(b, b->o->repo, "git worktree add", args, NULL);
}

static void remove_tree(bisect *b) {
  const char *args[] = {"worktree", "remove", "--force", b->tree, NULL};
  int code;
  if (git_in(b, b->o->repo, args, NULL, &code) == KILN_OK && code == 0) return;
  const char *prune[] = {"worktree", "prune", NULL};
  (void)git_in(b, b->o->repo, prune, NULL, &code);
}

/* Builds and runs commit `pos`; fills the step (a skip for a failed build or a run that gave
 * no value). A failure status only when the search cannot go on (cancelled, no memory). */
static int measure(bisect *b, int pos, kiln_ce_bisect_step *st) {
  const kiln_ce_bisect_options *o = b->o;
  const commit *c = &b->commits[pos];
  memset(st, 0, sizeof *st);
  memcpy(st->commit, c->hash, 41);
  snprintf(st->subject, sizeof st->subject, "%s", c->subject);
  st->position = pos;
  st->value = st->spread = st->change = NAN;
  st->verdict = KILN_CE_STEP_SKIP;
  char short_hash[13];
  snprintf(short_hash, sizeof short_hash, "%.12s", c->hash);
  say(b, "%.12s (%d of %d after GOOD): checking out and building", c->hash, pos, b->n);
  const char *co[] = {"checkout", "--detach", "--force", "--quiet", c->hash, NULL};
  KILN_TRY(git_ok(b, b->tree, "git checkout in the worktree", co, NULL));
  const char *cmd = o->build_command && *o->build_command
                        ? o->build_command
                        : "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && "
                          "cmake --build build -j \"$(nproc)\" --target kiln";
  char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
  char log_name[64];
  snprintf(log_name, sizeof log_name, "../logs/build-%s.log", short_hash);
  kiln_ce_child child;
  ce_run_child(argv, b->tree, log_name, o->build_timeout_s > 0 ? o->build_timeout_s : 3600,
               o->cancel, &child);
  if (cancelled(b)) return kiln_errorf(KILN_ERR_INVALID, "interrupted while building %s", short_hash);
  if (child.end != KILN_CE_CHILD_EXITED || child.code != 0) {
    char how[48];
    if (child.end == KILN_CE_CHILD_TIMEOUT) snprintf(how, sizeof how, "timed out");
    else if (child.end == KILN_CE_CHILD_SIGNALED) snprintf(how, sizeof how, "signal %d", child.code);
    else if (child.end == KILN_CE_CHILD_EXITED) snprintf(how, sizeof how, "exit %d", child.code);
    else snprintf(how, sizeof how, "not started");
    ce_fmt(st->reason, sizeof st->reason, "the build failed (%s): %.200s (log: %s/build-%s.log)",
           how, child.last_error, b->logs, short_hash);
    return KILN_OK;
  }
  char kiln_path[PATH_MAX], suite[PATH_MAX], report[PATH_MAX];
  ce_fmt(kiln_path, sizeof kiln_path, "%s/%s", b->tree,
         o->kiln_path && *o->kiln_path ? o->kiln_path : "build/kiln");
  if (access(kiln_path, X_OK) != 0) {
    ce_fmt(st->reason, sizeof st->reason, "the build made no executable %s", kiln_path);
    return KILN_OK;
  }
  ce_fmt(suite, sizeof suite, "%s/%s", b->tree, b->suite_rel);
  ce_fmt(report, sizeof report, "%s/runs/%02d-%s", b->work, pos, short_hash);
  say(b, "%.12s: running %s x%d", c->hash, o->model, b->r->workers);
  kiln_ce_options ce = {.kiln_path = kiln_path, .report_dir = report,
                        .machine_class = o->machine_class, .mpirun = o->mpirun,
                        .only_model = o->model, .only_workers = b->r->workers,
                        .baseline_dir = b->empty, .repeats = o->repeats,
                        .progress = o->progress, .user = o->user, .cancel = o->cancel,
                        .config = o->config};
  kiln_ce_result res;
  if (kiln_ce_run(suite, &ce, &res)) {
    if (cancelled(b)) return KILN_ERR_INVALID;
    ce_fmt(st->reason, sizeof st->reason, "its suite could not run: %.400s", kiln_last_error());
    return KILN_OK;
  }
  const kiln_ce_row *row = NULL, *run = NULL;
  for (int i = 0; i < res.nrows; i++) {
    const kiln_ce_row *x = &res.rows[i];
    if (strcmp(x->model, o->model) || x->workers != b->r->workers) continue;
    if (!strcmp(x->kpi, b->r->kpi)) row = x;
    if (!strcmp(x->kpi, "run")) run = x;
  }
  if (row && row->nsamples > 0 && isfinite(row->value)) {
    st->value = row->value;
    st->spread = row->spread;
    st->verdict = KILN_CE_STEP_GOOD; /* judged by the caller */
  } else {
    ce_fmt(st->reason, sizeof st->reason, "no %s from its run: %.400s", b->r->kpi,
           row ? row->reason : run ? run->reason : "the run reported no such row");
  }
  kiln_ce_result_free(&res);
  return KILN_OK;
}

static void judge(bisect *b, kiln_ce_bisect_step *st, const kiln_ce_bisect_step *good,
                  double *tolerance) {
  if (st->verdict == KILN_CE_STEP_SKIP) return;
  double tol = NAN, change = NAN;
  char words[512];
  kiln_ce_verdict v = kiln_ce_compare(&b->spec, st->value, st->spread, good->value, good->spread,
                                      b->noise_k, &tol, &change, words, sizeof words);
  st->change = change;
  st->verdict = v == KILN_CE_REGRESSION ? KILN_CE_STEP_BAD : KILN_CE_STEP_GOOD;
  const double d = fabs(st->value - good->value);
  if (d == 0)
    ce_fmt(st->reason, sizeof st->reason, "%s %.4g, the same as GOOD's", b->r->kpi, st->value);
  else
    ce_fmt(st->reason, sizeof st->reason,
           "%s %.4g against GOOD's %.4g: %s by %.3g, %s the tolerance %.3g", b->r->kpi,
           st->value, good->value,
           (st->value > good->value) == b->spec.higher_is_better ? "better" : "worse", d,
           d > tol ? "more than" : "within", tol);
  if (tolerance) *tolerance = tol;
}

static int add_step(bisect *b, int pos, int *index) {
  kiln_ce_bisect_result *r = b->r;
  if (r->nsteps >= KILN_CE_BISECT_MAX_STEPS)
    return kiln_errorf(KILN_ERR_INVALID, "more than %d steps: too many untestable commits",
                       KILN_CE_BISECT_MAX_STEPS);
  kiln_ce_bisect_step *st = &r->steps[r->nsteps];
  KILN_TRY(measure(b, pos, st));
  *index = r->nsteps++;
  if (pos > 0) judge(b, st, &r->steps[0], pos == b->n ? &r->tolerance : NULL);
  if (st->verdict == KILN_CE_STEP_SKIP)
    say(b, "%.12s: untestable: %s", st->commit, st->reason);
  else
    say(b, "%.12s: %s %.6g%s%s", st->commit, r->kpi, st->value, pos == 0 ? "" : ": ",
        pos == 0 ? "" : st->verdict == KILN_CE_STEP_BAD ? "bad" : "good");
  return KILN_OK;
}

static int search(bisect *b) {
  kiln_ce_bisect_result *r = b->r;
  int gi, bi;
  KILN_TRY(add_step(b, 0, &gi));
  if (r->steps[gi].verdict == KILN_CE_STEP_SKIP)
    return kiln_errorf(KILN_ERR_INVALID, "GOOD %.12s cannot be measured: %s", r->good,
                       r->steps[gi].reason);
  KILN_TRY(add_step(b, b->n, &bi));
  if (r->steps[bi].verdict == KILN_CE_STEP_SKIP)
    return kiln_errorf(KILN_ERR_INVALID, "BAD %.12s cannot be measured: %s", r->bad,
                       r->steps[bi].reason);
  r->reproduced = r->steps[bi].verdict == KILN_CE_STEP_BAD;
  if (!r->reproduced) return KILN_OK;
  bool *skipped = calloc((size_t)b->n + 1, sizeof *skipped);
  int *step_of = calloc((size_t)b->n + 1, sizeof *step_of);
  if (!skipped || !step_of) {
    free(skipped);
    free(step_of);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  step_of[b->n] = bi;
  int lo = 0, hi = b->n, rc = KILN_OK;
  while (hi - lo > 1 && !rc) {
    /* the untested commit nearest the middle, as git bisect skip does */
    int mid = -1, centre = lo + (hi - lo) / 2;
    for (int d = 0; d < hi - lo && mid < 0; d++) {
      if (centre + d < hi && centre + d > lo && !skipped[centre + d]) mid = centre + d;
      else if (centre - d > lo && centre - d < hi && !skipped[centre - d]) mid = centre - d;
    }
    if (mid < 0) break; /* everything between is untestable */
    int si;
    rc = add_step(b, mid, &si);
    if (rc) break;
    if (r->steps[si].verdict == KILN_CE_STEP_SKIP) {
      skipped[mid] = true;
    } else if (r->steps[si].verdict == KILN_CE_STEP_BAD) {
      hi = mid;
      step_of[mid] = si;
    } else {
      lo = mid;
    }
  }
  if (!rc) {
    r->first_bad = step_of[hi];
    r->ambiguous_from = -1;
    for (int p = lo + 1; p < hi; p++)
      if (skipped[p]) {
        r->ambiguous_from = p;
        break;
      }
  }
  free(skipped);
  free(step_of);
  return rc;
}

int kiln_ce_bisect(const kiln_ce_bisect_options *o, kiln_ce_bisect_result *out) {
  memset(out, 0, sizeof *out);
  out->first_bad = out->ambiguous_from = -1;
  out->tolerance = NAN;
  if (!o->repo || !o->good || !o->bad || !o->suite || !o->model || !o->kpi || !o->work_dir)
    return kiln_errorf(KILN_ERR_INVALID,
                       "kiln_ce_bisect: repo, good, bad, suite, model, kpi and work_dir are "
                       "required");
  /* git runs in the logs folder: the repository's path must not be relative to here */
  char repo[PATH_MAX];
  if (!realpath(o->repo, repo))
    return kiln_errorf(KILN_ERR_IO, "%s: %s", o->repo, strerror(errno));
  kiln_ce_bisect_options abs = *o;
  abs.repo = repo;
  o = &abs;
  bisect b = {.o = o, .r = out};
  KILN_TRY(kiln_mkdir_p(o->work_dir));
  if (!realpath(o->work_dir, b.work))
    return kiln_errorf(KILN_ERR_IO, "%s: %s", o->work_dir, strerror(errno));
  ce_fmt(b.tree, sizeof b.tree, "%s/tree", b.work);
  ce_fmt(b.logs, sizeof b.logs, "%s/logs", b.work);
  ce_fmt(b.empty, sizeof b.empty, "%s/no-baselines", b.work);
  snprintf(out->worktree, sizeof out->worktree, "%s", b.tree);
  KILN_TRY(kiln_mkdir_p(b.logs));
  KILN_TRY(kiln_mkdir_p(b.empty));
  KILN_TRY(kpi_of_suite(&b));
  KILN_TRY(place_suite(&b));
  KILN_TRY(resolve(&b, o->good, "GOOD", out->good));
  KILN_TRY(resolve(&b, o->bad, "BAD", out->bad));
  int rc = list_commits(&b);
  bool made = false;
  if (!rc) rc = make_tree(&b), made = rc == KILN_OK;
  if (!rc) rc = search(&b);
  if (made && !o->keep_worktree) remove_tree(&b);
  free(b.commits);
  return rc;
}
