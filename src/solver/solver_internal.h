/* Private to src/solver: the solver's state and what its files share. The training loop, creation
 * and tests are in solver.c, the update rules and learning-rate policies in update.c, snapshots
 * and restore in snapshot.c, and the synchronisation of several workers in worker_sync.c (its
 * hooks are declared in worker_sync.h). */
#ifndef KILN_SOLVER_INTERNAL_H
#define KILN_SOLVER_INTERNAL_H

#include "kiln/solver.h"

/* What the update's ops reduce into, on the train net's device; update.c reads it back through
 * the device table. */
typedef struct solver_scalars {
  double sumsq;  /* clipping: the gradients' squared L2 norm */
  int64_t at;    /* the check: the first value of a parameter that is not finite, or -1 */
  int32_t bad;   /* SGD: set when its pass left a value that is not finite */
} solver_scalars;

struct kiln_solver {
  /* the solver file and the caller's options */
  Caffe__SolverParameter *param;
  char *source;            /* solver file */
  char *snapshot_prefix;
  kiln_solver_type type;
  kiln_ap_version ap_version; /* how a detection test pass averages precision (ap_version) */
  uint64_t seed;
  kiln_solver_options opt;
  kiln_fault fault;        /* the configuration's: an injected slowdown or leak */
  kiln_config device_config; /* the caller's with the GPU that solver_mode / -gpu chose, which
                              opt.config then points at */

  /* the nets */
  kiln_net *net;           /* the train net */
  const Caffe__NetParameter *train_param;
  int ntest;
  kiln_net **test_nets;
  Caffe__NetParameter **net_params; /* parsed net files, owned */
  int nnet_params;
  int batch_size;          /* samples per forward pass of the train net (per worker) */

  /* the loop (solver.c) */
  int iter, current_step, max_iter; /* current_step: multistep's step values passed */
  float *grad_acc;         /* iter_size > 1: the passes' gradients summed in pass order */
  float *loss_window;      /* the last average_loss losses */
  int loss_window_n, loss_window_pos;
  /* the divergence check: the run's first loss, and the iterations in a row since the loss has
   * been above divergence_factor times it (both in the snapshot) */
  float first_loss;
  bool have_first_loss;
  int divergence_run;
  double start_ms;
  double start_cpu_wait_ms; /* the creating thread's CPU wait at creation */
  double round_start_ms;   /* TIME: when the next round's clock started (the last average) */
  double work_ms;          /* this worker's time in training iterations, its waits excluded */
  uint64_t work_samples, work_iters;

  /* the update rule (update.c) */
  int history_per_param;
  float *history;          /* history_per_param x net->nparam_floats, flat like the params, on
                              the train net's device as grad_acc is */
  solver_scalars *scalars; /* on the train net's device */

  /* the workers (worker_sync.c) */
  int rank, nworkers;
  kiln_sync_config sync;   /* resolved: file, then options */
  float *sum_buffer;       /* the communicator's memory the train net's gradients lie in (summed
                              there with no copies), or NULL */
  float *stage;            /* a train net on another device than the host: the host copy that
                              its buffers pass through for MPI, which moves host memory */
  int64_t stage_floats;
  bool params_synced;      /* rank 0's parameters broadcast since creation or restore */
  double sync_ms;          /* this worker's time in collectives that wait for the others
                              (gradient sums, model averages) */
  int64_t naverages;       /* MODEL / TIME: model averages so far */
  bool diverged;           /* MODEL / TIME: local steps since the last model average */
  bool state_diverged;     /* running statistics (BatchNorm's) updated since the last average */
  /* GRADIENT, not deterministic, iter_size 1: the flat gradient in buckets (from the end, where
   * the last layers' gradients lie), each summed as soon as backward has passed every layer
   * using it, while earlier layers still compute. */
  struct worker_bucket *buckets;
  int nbuckets, next_bucket;
  bool overlap;
};

/* solver.c: an event to the caller's callback, on rank 0 only (rank 0 speaks for the workers). */
void solver_emit(kiln_solver *s, kiln_event *e);

/* update.c */
/* The update rule the solver file names (`type`, or Caffe's older `solver_type`). */
int update_resolve_type(kiln_solver *s);
/* History copies per parameter the rule keeps (2 for Adam and AdaDelta, else 1). */
int update_history_count(kiln_solver_type t);
/* Clips, normalises (`workers` gradient sets were summed, 1 when each worker steps on its own),
 * regularises and applies the rule with learning rate `rate`. *all_finite: true when the
 * update's own pass has already found every parameter finite; otherwise update_check_finite
 * must look. */
int update_apply(kiln_solver *s, float rate, int workers, bool *all_finite);
/* KILN_ERR_NUMERIC, naming the parameter, when the update left one that is not finite. */
int update_check_finite(kiln_solver *s, float rate);

#endif
