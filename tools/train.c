/* kiln train: trains the net a solver file names, optionally resuming from a .solverstate or
 * starting from a .caffemodel. Under mpirun (or another MPI launcher) every process is one
 * worker of a data-parallel run: rank 0 prints, tests, snapshots and writes the metrics; a
 * worker that fails ends the whole job (MPI_Abort), so no rank is left waiting, and one that
 * waits longer than --comm-timeout in a collective (a peer stopped or hung) fails the same way,
 * from MPI's start-up on. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln train --solver S.prototxt [--snapshot X.solverstate | --weights W.caffemodel]\n"
          "                  [options]\n"
          "\n"
          "Trains the net the solver names, with its test nets and snapshots. Under `mpirun -np N`\n"
          "every process is one worker of a data-parallel run (docs/distributed.md). Caffe's\n"
          "spellings work too: -solver F, -solver=F, --solver=F, and -gpu N (kiln runs on the CPU).\n"
          "\n"
          "options:\n"
          "  --solver FILE          the solver prototxt (required)\n"
          "  --snapshot FILE        resume from a .solverstate, continuing the run exactly\n"
          "  --weights A[,B...]     start from the weights of .caffemodel files, loaded in turn (a\n"
          "                         layer in several takes the last one's); not with --snapshot\n"
          "  --check                read the solver and build its nets, then stop without training\n"
          "  --sync MODE            how workers combine: grad (sum the gradients every iteration,\n"
          "                         the default), model:K[:W] (average the weights every K\n"
          "                         iterations, after W in grad mode) or time:T[:W] (every T\n"
          "                         seconds); replaces the solver file's sync settings\n"
          "  --deterministic        every sum over workers in rank order: the bits of one worker\n"
          "                         with iter_size N\n"
          "  --no-overlap           sum the whole gradient after backward, not bucket by bucket\n"
          "                         during it\n"
          "  --comm-timeout S       a worker waiting longer than S seconds for the others ends the\n"
          "                         job, from the MPI start-up on (default 300; 0 waits forever)\n"
          "  --debug-slow-rank R:MS rank R sleeps MS milliseconds after each iteration (tests)\n");
  tool_common_usage(f, "train, test, snapshot, worker, done");
  tool_help_usage(f);
}

static int usage_error(const char *why, const char *a) {
  fprintf(stderr, "kiln train: %s '%s'\n", why, a);
  usage(stderr);
  return 2;
}

/* MPI_Init waits for every process of the job, with no limit: a process that never gets there
 * (stopped, hung before it, or on a host cut off) would leave the others in it forever, before
 * kiln's watchdog exists. So a thread watches it, and past --comm-timeout says which ranks this
 * one waited for and ends this process, which makes the launcher end the job. Only the rank
 * numbers the launcher announced are known here: in a job of two the other rank is named, in a
 * larger one the candidates (the first rank to give up ends the job). Time this process
 * itself spent stopped (a gap between the thread's wake-ups far beyond its step) is no wait for
 * the others: a stopped rank that the launcher resumes to end it stays quiet. */
typedef struct {
  atomic_bool done;
  double limit_s;
  int rank, size;
} init_watch;

enum { INIT_WATCH_STEP_MS = 50 };

static void *watch_init(void *arg) {
  init_watch *w = arg;
  double waited_ms = 0, last = kiln_now_ms();
  while (!atomic_load(&w->done)) {
    kiln_sleep_ms(INIT_WATCH_STEP_MS);
    double now = kiln_now_ms(), gap = now - last;
    last = now;
    if (gap < 20 * INIT_WATCH_STEP_MS) waited_ms += gap;
    if (waited_ms < w->limit_s * 1e3 || atomic_load(&w->done)) continue;
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    char others[256] = "";
    size_t n = 0;
    int listed = 0, count = w->size - (w->rank >= 0 && w->rank < w->size);
    for (int r = 0; r < w->size && listed < 8 && n < sizeof others; r++) {
      if (r == w->rank) continue;
      int k = snprintf(others + n, sizeof others - n, "%s%d", listed++ ? ", " : "", r);
      if (k > 0) n += (size_t)k;
    }
    if (count > listed && n < sizeof others)
      snprintf(others + n, sizeof others - n, " and %d more", count - listed);
    fprintf(stderr,
            "kiln: rank %d of %d (pid %d on %s): MPI start-up (MPI_Init) waited %.1f s for the "
            "other workers, past the limit of %g s (--comm-timeout): %s%s did not join it "
            "(stopped, hung before start-up, or cut off)\n",
            w->rank, w->size, (int)getpid(), host, waited_ms / 1e3, w->limit_s,
            count == 1 ? "rank " : "one or more of ranks ", others);
    fflush(stderr);
    _exit(1);
  }
  return NULL;
}

/* One worker (no launcher) or MPI_COMM_WORLD. */
static int open_comm(int *argc, char ***argv, const kiln_config *cfg, kiln_comm **comm) {
  int launched = cfg->launcher_size;
  if (launched > 1 && kiln_comm_mpi_built() && cfg->comm_timeout_s > 0) {
    init_watch w = {.limit_s = cfg->comm_timeout_s, .rank = cfg->launcher_rank, .size = launched};
    atomic_init(&w.done, false);
    pthread_t th;
    bool watching = pthread_create(&th, NULL, watch_init, &w) == 0; /* else unwatched */
    int rc = kiln_comm_mpi_init(argc, argv, cfg);
    if (watching) {
      atomic_store(&w.done, true);
      pthread_join(th, NULL);
    }
    if (rc) return rc;
  }
  if (launched > 0 && kiln_comm_mpi_built()) return kiln_comm_mpi_create(argc, argv, cfg, comm);
  if (launched > 1)
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "started by an MPI launcher as one of %d processes, but kiln was built "
                       "without MPI: each would train alone; install Open MPI "
                       "(scripts/install-deps) and rebuild",
                       launched);
  return kiln_comm_local_create(comm);
}

/* Several workers on one host would each start a thread per core: unless told (--threads,
 * OMP_NUM_THREADS), each takes its share of the cores it may use. */
static void share_cores(const tool_common *c, const kiln_config *cfg) {
  if (c->threads > 0 || cfg->omp_threads > 0) return;
  int local = cfg->local_ranks;
  if (local <= 1) return;
  int t = kiln_get_num_threads() / local;
  kiln_set_num_threads(t > 0 ? t : 1);
}

/* A failure on one rank: say which rank, then end every process of the job. */
static int fail(kiln_comm *comm, const char *what) {
  if (kiln_comm_size(comm) > 1) {
    fprintf(stderr, "kiln: rank %d of %d: %s: %s\n", kiln_comm_rank(comm), kiln_comm_size(comm),
            what, kiln_last_error());
    fflush(stderr);
    kiln_comm_end_job(comm, 1); /* does not return */
  }
  int rc = tool_fail(what);
  kiln_comm_free(comm);
  return rc;
}

/* --weights A.caffemodel[,B.caffemodel...]: Caffe's list, each file loaded in turn (a layer in
 * several takes its weights from the last). */
static int load_weight_list(kiln_solver *s, const char *list) {
  char *copy = strdup(list);
  if (!copy) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = KILN_OK;
  char *save = NULL;
  for (char *p = strtok_r(copy, ",", &save); p && !rc; p = strtok_r(NULL, ",", &save))
    rc = kiln_solver_load_weights(s, p);
  free(copy);
  return rc;
}

/* Every file of a --weights list named: "a,,b" or "a," would skip a file without a word. */
static bool weight_list_ok(const char *list) {
  size_t n = strlen(list); /* > 0: an empty value is refused before */
  if (list[0] != ',' && list[n - 1] != ',' && !strstr(list, ",,")) return true;
  fprintf(stderr, "kiln train: --weights '%s': an empty file name in the list (A[,B...])\n",
          list);
  return false;
}

/* The options that change what the job trains or how its workers meet, as text for
 * kiln_comm_agree_settings (docs/distributed.md, Settings): every rank must be given the same.
 * --threads, --max-memory and --metrics may differ (each host's cores and memory; only rank 0
 * writes the metrics), and the solver file is compared by its content later. */
enum { TRAIN_SETTINGS = 8 };
typedef struct {
  kiln_comm_setting s[TRAIN_SETTINGS];
  char sync[96], timeout[32], slow[64];
} train_settings;

static void train_settings_of(train_settings *t, const char *snapshot, const char *weights,
                              const kiln_sync_config *sync, bool no_overlap, bool check,
                              double comm_timeout, int slow_rank, double slow_ms) {
  const char *sync_text = NULL;
  if (sync->mode == KILN_SYNC_GRADIENT) {
    sync_text = "grad";
  } else if (sync->mode == KILN_SYNC_MODEL) {
    snprintf(t->sync, sizeof t->sync, "model:%d:%d", sync->interval_iters, sync->warmup_iters);
    sync_text = t->sync;
  } else if (sync->mode == KILN_SYNC_TIME) {
    snprintf(t->sync, sizeof t->sync, "time:%g:%d", sync->interval_seconds, sync->warmup_iters);
    sync_text = t->sync;
  }
  snprintf(t->timeout, sizeof t->timeout, "%g", comm_timeout);
  snprintf(t->slow, sizeof t->slow, "%d:%g", slow_rank, slow_ms);
  const kiln_comm_setting s[TRAIN_SETTINGS] = {
      {"--snapshot", snapshot},
      {"--weights", weights},
      {"--sync", sync_text},
      {"--deterministic", sync->deterministic ? "" : NULL},
      {"--no-overlap", no_overlap ? "" : NULL},
      {"--check", check ? "" : NULL},
      {"--comm-timeout", t->timeout},
      {"--debug-slow-rank", slow_ms > 0 ? t->slow : NULL},
  };
  memcpy(t->s, s, sizeof s);
}

int cmd_train(int argc, char **argv) {
  tool_common c = {0};
  const char *solver = NULL, *snapshot = NULL, *weights = NULL;
  kiln_sync_config sync = {0};
  int slow_rank = 0;
  double slow_ms = 0;
  double comm_timeout = KILN_COMM_DEFAULT_TIMEOUT_S;
  bool no_overlap = false, check = false;
  for (int i = 1; i < argc; i++) {
    if (tool_is_help(argv[i])) tool_help(usage);
    int r = tool_common_option(&c, argc, argv, &i);
    if (r < 0) return 2;
    if (r > 0) continue;
    const char *a = argv[i];
    if (!strcmp(a, "--deterministic")) {
      sync.deterministic = true;
      continue;
    }
    if (!strcmp(a, "--check")) {
      check = true;
      continue;
    }
    if (!strcmp(a, "--no-overlap")) {
      no_overlap = true;
      continue;
    }
    if (!strcmp(a, "--sync")) {
      if (i + 1 >= argc) return usage_error("missing value for", a);
      if (kiln_sync_parse(argv[++i], &sync)) {
        fprintf(stderr, "kiln train: %s\n", kiln_last_error());
        return 2;
      }
      continue;
    }
    if (!strcmp(a, "--debug-slow-rank")) {
      /* A testing aid: rank R sleeps MS milliseconds after each iteration (a busy machine). */
      if (i + 1 >= argc) return usage_error("missing value for", a);
      const char *v = argv[++i];
      char *end;
      long r = strtol(v, &end, 10);
      if (end == v || *end != ':' || r < 0 || r > INT_MAX)
        return usage_error("expected R:MS, not", v);
      const char *ms = end + 1;
      slow_ms = strtod(ms, &end);
      if (end == ms || *end || !(slow_ms >= 0) || slow_ms > 1e7)
        return usage_error("expected R:MS (milliseconds >= 0), not", v);
      slow_rank = (int)r;
      continue;
    }
    if (!strcmp(a, "--comm-timeout")) {
      if (i + 1 >= argc) return usage_error("missing value for", a);
      const char *v = argv[++i];
      char *end;
      errno = 0;
      comm_timeout = strtod(v, &end);
      if (errno || end == v || *end || !isfinite(comm_timeout) || comm_timeout < 0) {
        fprintf(stderr,
                "kiln train: --comm-timeout '%s': expected the seconds a worker may wait for the "
                "others in one collective (> 0; 0 waits forever)\n",
                v);
        return 2;
      }
      continue;
    }
    const char **slot = !strcmp(a, "--solver") ? &solver : !strcmp(a, "--snapshot") ? &snapshot
                      : !strcmp(a, "--weights") ? &weights : NULL;
    if (!slot && a[0] != '-') return tool_unexpected("train", a);
    if (!slot || i + 1 >= argc) return usage_error(slot ? "missing value for" : "unknown option", a);
    *slot = argv[++i];
    if (!tool_nonempty("train", a, *slot)) return 2;
  }
  if (weights && !weight_list_ok(weights)) return 2;
  if (!solver) {
    fprintf(stderr, "kiln train: --solver is required\n");
    return 2;
  }
  if (snapshot && weights) {
    fprintf(stderr, "kiln train: give --snapshot or --weights, not both\n");
    return 2;
  }
  /* The environment's switches, then the command line's (include/kiln/config.h). */
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) return tool_fail("train");
  cfg.debug_slow_rank = slow_rank;
  cfg.debug_slow_ms = slow_ms;
  cfg.comm_timeout_s = comm_timeout;
  kiln_comm *comm = NULL;
  if (open_comm(&argc, &argv, &cfg, &comm)) {
    if (comm) return fail(comm, "starting MPI"); /* ends every rank */
    return tool_fail("train");
  }
  int rank = kiln_comm_rank(comm), nworkers = kiln_comm_size(comm);
  if (nworkers > 1) {
    /* Before anything is read: a rank given other options would train something else, or wait
     * in a collective the others never enter. Every rank knows, so every rank says it and
     * ends cleanly; only a failed exchange ends the job. */
    train_settings t;
    train_settings_of(&t, snapshot, weights, &sync, no_overlap, check, comm_timeout, slow_rank,
                      slow_ms);
    int rc = kiln_comm_agree_settings(comm, t.s, TRAIN_SETTINGS);
    if (rc == KILN_ERR_INVALID) {
      fprintf(stderr, "kiln: rank %d of %d: train: %s\n", rank, nworkers, kiln_last_error());
      fflush(stderr);
      kiln_comm_free(comm);
      return 2;
    }
    if (rc) return fail(comm, "train");
  }
  if (slow_ms > 0 && slow_rank >= nworkers) {
    /* every rank sees the same arguments and fails alike */
    if (nworkers == 1)
      kiln_errorf(KILN_ERR_INVALID, "--debug-slow-rank %d: the job has 1 worker (rank 0)",
                  slow_rank);
    else
      kiln_errorf(KILN_ERR_INVALID, "--debug-slow-rank %d: the job has %d workers (ranks 0 to %d)",
                  slow_rank, nworkers, nworkers - 1);
    return fail(comm, "train");
  }
  if (nworkers > 1) share_cores(&c, &cfg);
  if (rank != 0) kiln_log_set_level(KILN_LOG_WARN); /* rank 0 speaks for the job */
  tool_metrics m;
  const char *const inputs[] = {solver, snapshot, weights};
  if (tool_metrics_open(&m, rank == 0 ? c.metrics : NULL, inputs, 3)) return fail(comm, "metrics");
  m.rank = rank;
  kiln_solver_options o = {.max_memory = c.max_memory, .on_event = tool_on_event, .user = &m,
                           .comm = comm, .sync = sync, .no_overlap = no_overlap,
                           .config = &cfg, .gpu_flag = tool_caffe_gpu};
  kiln_solver *s;
  if (kiln_solver_create(solver, &o, &s)) {
    tool_metrics_close(&m);
    return fail(comm, "train");
  }
  if (rank == 0) {
    char *table = kiln_net_describe(kiln_solver_net(s));
    if (table) fprintf(stderr, "%s", table);
    free(table);
    if (nworkers > 1) {
      const kiln_sync_config *y = kiln_solver_sync(s);
      int batch = kiln_solver_batch_size(s), iter_size = kiln_solver_param(s)->iter_size;
      char how[160] = "";
      if (y->mode == KILN_SYNC_MODEL)
        snprintf(how, sizeof how, " every %d iterations", y->interval_iters);
      else if (y->mode == KILN_SYNC_TIME)
        snprintf(how, sizeof how, " every %g s", y->interval_seconds);
      if (y->mode != KILN_SYNC_GRADIENT && y->warmup_iters > 0)
        snprintf(how + strlen(how), sizeof how - strlen(how), " after %d in gradient mode",
                 y->warmup_iters);
      fprintf(stderr, "%d workers, %s sync%s%s, global batch %d = batch %d x %d workers x "
              "iter_size %d\n",
              nworkers, kiln_sync_mode_name(y->mode), how,
              y->deterministic ? " (deterministic: rank-order sum)" : "",
              batch * nworkers * iter_size, batch, nworkers, iter_size);
    }
  }
  int rc = KILN_OK;
  if (check) { /* read and built: say so, and train nothing */
    if (rank == 0)
      printf("%s: read (%s), train net and %d test net%s built; not trained (--check)\n", solver,
             kiln_solver_type_name(kiln_solver_type_of(s)), kiln_solver_test_net_count(s),
             kiln_solver_test_net_count(s) == 1 ? "" : "s");
    /* the SSD fork's test figure, which kiln_solver_create has checked against the test nets */
    const Caffe__SolverParameter *sp = kiln_solver_param(s);
    if (rank == 0 && sp->eval_type && !strcmp(sp->eval_type, "detection"))
      printf("%s: test passes report mAP (eval_type: detection, ap_version: %s)\n", solver,
             sp->ap_version ? sp->ap_version : "Integral");
    kiln_solver_free(s);
    tool_metrics_close(&m);
    kiln_comm_free(comm);
    return 0;
  }
  if (snapshot) rc = kiln_solver_restore(s, snapshot);
  else if (weights) rc = load_weight_list(s, weights);
  if (!rc) rc = kiln_solver_solve(s);
  if (rc) {
    if (m.tty && rank == 0) fprintf(stderr, "\n");
    int iter = kiln_solver_iter(s);
    const char *what = snapshot && iter == 0 ? "resume" : weights && iter == 0 ? "weights" : "train";
    tool_metrics_close(&m);
    if (nworkers > 1) { /* the solver stays allocated: the job ends */
      char at[64]; /* where training stood: a watchdog message names the collective */
      snprintf(at, sizeof at, "train at iteration %d", iter);
      return fail(comm, strcmp(what, "train") ? what : at);
    }
    kiln_solver_free(s);
    return fail(comm, what);
  }
  kiln_solver_free(s);
  int failed = tool_metrics_close(&m); /* a cut metrics file is not a finished run */
  kiln_comm_free(comm);
  return failed ? 1 : 0;
}
