/* kiln solver: Caffe's training loop (iter_size accumulation, gradient clipping, L1/L2
 * regularisation, the update rules SGD, Nesterov, AdaGrad, RMSProp, AdaDelta and Adam, the seven
 * learning-rate policies, periodic tests, display, snapshots) and exact resume. Everything the
 * caller shows or records arrives as events; the library prints nothing. */
#ifndef KILN_SOLVER_H
#define KILN_SOLVER_H

#include "kiln/net.h"

typedef struct kiln_event {
  const char *event;   /* "train", "test", "snapshot", "done", "progress" (every iteration) */
  int iter, max_iter;
  double time_ms;      /* since the solver was created */
  float loss;          /* train: loss smoothed over average_loss iterations; test: loss outputs */
  float lr;
  double samples_per_s;
  double peak_rss_mb;
  int test_net;        /* test: which test net */
  int noutputs;        /* test and train: the net's outputs, averaged */
  const char *const *output_names;
  const float *output_values;
  const char *path;    /* snapshot: the .solverstate written */
} kiln_event;

typedef void (*kiln_event_fn)(const kiln_event *e, void *user);

typedef struct kiln_solver_options {
  int nthreads;            /* 0: current OpenMP setting */
  uint64_t max_memory;     /* bytes; 0: what is available */
  kiln_event_fn on_event;
  void *user;
  int max_iter_override;   /* > 0: stop there instead of max_iter (tests) */
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

typedef struct kiln_solver {
  Caffe__SolverParameter *param;
  char *source;            /* solver file */
  char *snapshot_prefix;
  kiln_solver_type type;
  kiln_net *net;           /* the train net */
  int ntest;
  kiln_net **test_nets;
  Caffe__NetParameter **net_params; /* parsed net files, owned */
  int nnet_params;
  int iter, current_step, max_iter;
  int history_per_param;
  float *history;          /* history_per_param x net->nparam_floats, flat like the params */
  float *loss_window;      /* the last average_loss losses */
  int loss_window_n, loss_window_pos;
  uint64_t seed;
  int batch_size;          /* samples per forward pass of the train net */
  double start_ms;
  kiln_solver_options opt;
} kiln_solver;

/* Reads the solver file and builds the train and test nets (net paths are taken as given, or
 * relative to the solver file's folder). */
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
 * .solverstate path (caller frees). */
int kiln_solver_snapshot(kiln_solver *s, char **path_out);
/* Restores iter, lr step, history, data cursors and generator state from a .solverstate and the
 * weights from the .caffemodel it names. */
int kiln_solver_restore(kiln_solver *s, const char *solverstate_path);

/* The learning rate at the current iteration under the solver's lr_policy. */
float kiln_solver_learning_rate(kiln_solver *s);
const char *kiln_solver_type_name(kiln_solver_type t);

#endif
