/* kiln solver: Caffe's training loop (iter_size accumulation, gradient clipping, L1/L2
 * regularisation, the update rules SGD, Nesterov, AdaGrad, RMSProp, AdaDelta and Adam, the seven
 * learning-rate policies, periodic tests, display, snapshots) and exact resume. Everything the
 * caller shows or records arrives as events; the library prints nothing.
 *
 * With a communicator of N workers (data-parallel, GRADIENT sync) every rank runs the same
 * solver: rank 0's parameters are broadcast before the first step (and after a restore), each
 * rank reads its share of the train data, the gradients are summed over the ranks every
 * iteration, and every rank applies the same update. Tests, snapshot files and events happen on
 * rank 0. Creation, step, solve, snapshot and restore are then collective: every rank calls
 * them, in the same order; a rank that gets an error must end the job (kiln_comm_end_job). */
#ifndef KILN_SOLVER_H
#define KILN_SOLVER_H

#include "kiln/metrics.h"
#include "kiln/parallel.h"
#include "kiln/net.h"

typedef struct kiln_solver_options {
  int nthreads;            /* 0: current OpenMP setting */
  uint64_t max_memory;     /* bytes; 0: what is available */
  kiln_event_fn on_event;
  void *user;
  int max_iter_override;   /* > 0: stop there instead of max_iter (tests) */
  kiln_comm *comm;         /* NULL (or one rank): a single worker; the caller keeps ownership */
  kiln_sync_config sync;   /* overrides of the solver file's sync { }: a mode other than
                              KILN_SYNC_DEFAULT replaces its mode and interval; deterministic
                              true forces the ordered reduction */
  /* The runtime configuration (NULL: kiln_config_defaults()), handed to every net the solver
   * builds. The solver itself takes from it the planted fault (applied to this run: a
   * malformed value never gets here, a sleep naming a layer the train net lacks is an error)
   * and debug_slow_rank / debug_slow_ms (that rank sleeps after each of its iterations: a slow
   * or busy machine, for TIME mode). Must outlive the solver. */
  const kiln_config *config;
  /* Every activation keeps its own data and, in the train net, its own gradient, readable
   * after forward and backward (for tests and inspection). Off (the default): both share
   * buffers by lifetime (kiln_net_options.share_diffs, share_data). */
  bool keep_diffs;
  /* GRADIENT mode sums the whole gradient after backward instead of bucket by bucket during it
   * (for measuring what the overlap gives). */
  bool no_overlap;
  /* Caffe's `caffe train -gpu` as given ("0", "0,1", "all"), or NULL. As in Caffe it overrides
   * the solver file's solver_mode and device_id: the worker trains on the GPU it names (by local
   * rank where it names several), or on the CPU, saying why, where kiln has no GPU. */
  const char *gpu_flag;
} kiln_solver_options;

typedef enum {
  KILN_SOLVER_SGD,
  KILN_SOLVER_NESTEROV,
  KILN_SOLVER_ADAGRAD,
  KILN_SOLVER_RMSPROP,
  KILN_SOLVER_ADADELTA,
  KILN_SOLVER_ADAM,
  KILN_SOLVER_TYPE_COUNT
} kiln_solver_type;

/* The solver's state is private to src/solver; callers read it through the functions below. */
typedef struct kiln_solver kiln_solver;

/* Reads the solver file and builds the train and test nets (net paths are taken as given, or
 * relative to the solver file's folder). The configuration's fault (KILN_FAULT,
 * include/kiln/core.h) is applied to this run: a sleep naming a layer the train net does not
 * have is an error. */
int kiln_solver_create(const char *solver_path, const kiln_solver_options *opt, kiln_solver **out);
void kiln_solver_free(kiln_solver *s);

/* Runs iterations until max_iter, with tests, display and snapshots; then the final snapshot
 * (snapshot_after_train) and test. */
int kiln_solver_solve(kiln_solver *s);
/* `n` iterations (no final snapshot). */
int kiln_solver_step(kiln_solver *s, int n);
/* One test pass over test net `k`: outputs averaged over test_iter batches. */
int kiln_solver_test(kiln_solver *s, int k);
/* <prefix>_iter_<N>.caffemodel and .solverstate; `path_out` (may be NULL) gets the
 * .solverstate path (caller frees). Collective with several workers: rank 0 writes (with every
 * rank's generator state); the others write nothing and get no path. */
int kiln_solver_snapshot(kiln_solver *s, char **path_out);
/* Restores iter, lr step, history, data cursors and generator state from a .solverstate and the
 * weights from the .caffemodel it names. With several workers every rank reads the files (they
 * must be visible to all of them), rank 0's parameters and history are then broadcast, and the
 * ranks check they restored the same iteration and cursors. A snapshot written by N workers
 * resumes exactly with N; with another count the global data stream continues from the same
 * cursor and ranks beyond the saved ones get fresh generator streams. */
int kiln_solver_restore(kiln_solver *s, const char *solverstate_path);
/* Starts from a .caffemodel (Caffe's --weights); broadcast from rank 0 before the first step. */
int kiln_solver_load_weights(kiln_solver *s, const char *caffemodel_path);

/* The learning rate the solver applies at the current iteration: the lr_policy's, times the
 * factor of a KILN_FAULT=lr:FACTOR (include/kiln/core.h). */
float kiln_solver_learning_rate(kiln_solver *s);
const char *kiln_solver_type_name(kiln_solver_type t);

/* What the solver holds, for callers that show or inspect it. */
kiln_net *kiln_solver_net(const kiln_solver *s); /* the train net */
/* The test nets (only rank 0 builds them; none elsewhere); NULL for k beyond the count. */
int kiln_solver_test_net_count(const kiln_solver *s);
kiln_net *kiln_solver_test_net(const kiln_solver *s, int k);
int kiln_solver_iter(const kiln_solver *s); /* iterations done */
const Caffe__SolverParameter *kiln_solver_param(const kiln_solver *s); /* the solver file */
kiln_solver_type kiln_solver_type_of(const kiln_solver *s);
int kiln_solver_batch_size(const kiln_solver *s); /* samples per pass of the train net (per worker) */
int kiln_solver_nworkers(const kiln_solver *s);
/* The sync settings in force: the solver file's sync { } with the options' overrides. */
const kiln_sync_config *kiln_solver_sync(const kiln_solver *s);
/* The update rule's history, flat like the train net's param_data: `per_param` copies (may be
 * NULL), the second (Adam, AdaDelta) nparam_floats after the first. It lies where the train
 * net's parameters do (kiln_net.device): read it through the device table off the host. */
const float *kiln_solver_history(const kiln_solver *s, int *per_param);

#endif
