/* Private to src/solver: the synchronisation of data-parallel workers (worker_sync.c), as hooks
 * that the solver calls at fixed points, in the spirit of Caffe attaching its multi-GPU sync to
 * the solver as callbacks. With one worker each hook returns at once (or does what one worker
 * needs), so the loop reads the same for any number of workers. Where solver.c calls them:
 *
 *   kiln_solver_create   worker_sync_configure        before the nets are built
 *                        worker_sync_attach           after: buckets, gradient memory, agreement
 *   kiln_solver_step     worker_sync_before_steps     rank 0's parameters to every worker
 *     each iteration     worker_sync_before_backward  the last pass: the net's backward hook
 *                                                     starts bucket sums as layers finish
 *                        worker_sync_after_backward   the gradients summed over the workers
 *                        worker_sync_loss             the loss over the workers
 *                        (the update)
 *                        worker_sync_after_update     MODEL: the average every K iterations
 *     each TIME round    worker_sync_end_round        the weighted average, the furthest cursor
 *   tests, snapshots     worker_sync_converge         one model on every worker
 *   kiln_solver_solve    worker_sync_converge, then worker_sync_report ("worker" events)
 *   restore, weights     worker_sync_params_changed, worker_sync_check_restored (snapshot.c)
 *
 * All but before_backward, params_changed and seed_rng work with the other workers (collectives,
 * or bucket sums that every rank starts in the same order): every rank calls them at the same
 * points. */
#ifndef KILN_SOLVER_WORKER_SYNC_H
#define KILN_SOLVER_WORKER_SYNC_H

#include "solver_internal.h"

/* The solver file's sync { } with the caller's overrides on top, checked: before anything is
 * built, so a bad setting costs nothing. */
int worker_sync_configure(kiln_solver *s);
/* Once the train net and its buffers exist: this worker's dropout stream, the gradient buckets,
 * the gradients placed in the communicator's memory, and the checks that every worker has the
 * same solver, net and data (all fail together, naming the ranks that differ). */
int worker_sync_attach(kiln_solver *s);
/* Frees what attach made; after the train net is freed (its gradients may lie in the memory). */
void worker_sync_release(kiln_solver *s);

/* Before the first step, and again after a restore or load_weights: rank 0's parameters and
 * solver history to every worker. */
int worker_sync_before_steps(kiln_solver *s);
/* Before the backward of an iteration's last pass: when its gradients are summed with overlap,
 * sets the net's backward_hook, which after each layer's backward starts the sums of the buckets
 * backward is done with (adding in the earlier passes' sum first), and returns true. The caller
 * clears the hook after backward. */
bool worker_sync_before_backward(kiln_solver *s, bool local);
/* After backward: the gradients summed over the workers (finishing the overlapped buckets), unless
 * this iteration steps `local`ly. `summed` gets the number of workers whose gradients were
 * added (1 when none were), for the update's normalisation. */
int worker_sync_after_backward(kiln_solver *s, bool local, int *summed);
/* The iteration's loss over every pass of every worker (this worker's own when `local`). */
int worker_sync_loss(kiln_solver *s, double local_loss, bool local, float *out);
/* After the update (and iter += 1): notes what now differs between workers; MODEL mode averages
 * the model every interval_iters iterations. */
int worker_sync_after_update(kiln_solver *s, bool local);
/* The end of a TIME round that began at iteration `start` and ran `steps` local iterations here:
 * the average weighted by each worker's steps, then the iteration count and data cursors moved
 * to the furthest worker's. */
int worker_sync_end_round(kiln_solver *s, int start, uint64_t steps);
/* Before a test pass, a snapshot or the end of training: one model on every worker. */
int worker_sync_converge(kiln_solver *s);
/* At the end of solve: each worker's throughput and time in sync as "worker" events. */
int worker_sync_report(kiln_solver *s);

/* Rank 0's parameters changed (a restore, a --weights load): they go out again before the next
 * step. */
void worker_sync_params_changed(kiln_solver *s);
/* After a restore: every worker resumed at the same iteration and data cursors. */
int worker_sync_check_restored(kiln_solver *s);
/* Rank 0 keeps the single-worker generator stream; the others get a stream of their own for
 * iteration `iter` (creation, or a restore from a snapshot of another worker count). */
void worker_sync_seed_rng(kiln_solver *s, uint64_t iter);

#endif
