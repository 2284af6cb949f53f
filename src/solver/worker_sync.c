/* Worker synchronisation: the solver's side of data-parallel training (the hooks and where the
 * loop calls them: worker_sync.h; the communicator and the sync settings: include/kiln/parallel.h;
 * docs/distributed.md).
 *
 * GRADIENT: the workers' gradients are summed every iteration, in buckets started during backward
 * as soon as backward has passed every layer using them (or the whole buffer after backward with
 * --no-overlap), and every worker applies the same update. With workers on one host the gradients
 * lie in the communicator's shared memory, where the sums read and write them. MODEL and TIME:
 * every worker steps on its own, and the model (parameters, running statistics and solver
 * history) is averaged every K iterations, or every T seconds weighted by each worker's steps.
 * Before tests, snapshots and the end the workers converge to one model. At creation and restore
 * the workers check that they agree (solver, net, data, resumed state) and fail together, naming
 * the ranks that differ, instead of hanging in a later collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "worker_sync.h"

/* ---- configuration and agreement ------------------------------------------------------------- */

/* The solver file's sync { } with the caller's overrides on top. */
int worker_sync_configure(kiln_solver *s) {
  const Caffe__SyncParameter *f = s->param->sync;
  kiln_sync_config c = {.mode = KILN_SYNC_GRADIENT};
  if (f) {
    c.mode = f->mode == CAFFE__SYNC_PARAMETER__MODE__MODEL  ? KILN_SYNC_MODEL
             : f->mode == CAFFE__SYNC_PARAMETER__MODE__TIME ? KILN_SYNC_TIME
                                                            : KILN_SYNC_GRADIENT;
    c.interval_iters = f->interval_iters;
    c.interval_seconds = f->interval_seconds;
    c.warmup_iters = f->warmup_iters;
    c.deterministic = f->deterministic;
  }
  const kiln_sync_config *o = &s->opt.sync;
  if (o->mode != KILN_SYNC_DEFAULT) {
    c.mode = o->mode;
    c.interval_iters = o->interval_iters;
    c.interval_seconds = o->interval_seconds;
    c.warmup_iters = o->warmup_iters;
  }
  c.deterministic |= o->deterministic;
  s->sync = c;
  int rc = kiln_sync_check(&c, s->nworkers);
  return rc ? kiln_error_context(rc, "%s: ", s->source) : KILN_OK;
}

/* Rank 0 keeps the single-worker generator stream (so one worker trains as before); the others
 * draw dropout masks from streams of their own. */
void worker_sync_seed_rng(kiln_solver *s, uint64_t iter) {
  if (s->rank > 0)
    kiln_rng_seed(&s->net->rng, s->seed, 0x776f726b00000000ULL + ((uint64_t)s->rank << 40) + iter);
}

static int hash_message(kiln_sha256_ctx *h, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n + 1);
  if (!buf) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  protobuf_c_message_pack(m, buf);
  kiln_sha256_update(h, buf, n);
  free(buf);
  return KILN_OK;
}

/* What must be equal on every worker: the solver and train net as parsed (so comments and
 * layout do not matter) and the settings that change what the collectives do. */
static int config_digest(kiln_solver *s, uint8_t digest[32]) {
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  KILN_TRY(hash_message(&h, &s->param->base));
  KILN_TRY(hash_message(&h, &s->train_param->base));
  int64_t settings[] = {s->nworkers, s->sync.mode, s->sync.interval_iters,
                        (int64_t)(s->sync.interval_seconds * 1e6), s->sync.warmup_iters,
                        s->sync.deterministic,
                        s->max_iter, s->net->nparam_floats, s->batch_size, s->history_per_param};
  kiln_sha256_update(&h, settings, sizeof settings);
  kiln_sha256_final(&h, digest);
  return KILN_OK;
}

/* Every rank contributes a digest; all of them learn which ranks differ from rank 0, so all of
 * them fail together with the same message instead of hanging in a later collective. */
static int workers_agree(kiln_solver *s, const uint8_t digest[32], const char *what,
                         const char *hint) {
  if (s->nworkers <= 1) return KILN_OK;
  uint8_t *all = malloc((size_t)s->nworkers * 32);
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = kiln_comm_allgather(s->opt.comm, digest, 32, all);
  if (rc) {
    free(all);
    return kiln_error_context(rc, "checking that the workers agree on %s: ", what);
  }
  char ranks[512] = "";
  size_t used = 0;
  int ndiff = 0, first = -1;
  for (int r = 1; r < s->nworkers; r++) {
    if (memcmp(all + 32 * r, all, 32) == 0) continue;
    if (first < 0) first = r;
    if (used < sizeof ranks - 16)
      used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", ndiff ? ", " : "", r);
    ndiff++;
  }
  if (ndiff) {
    char h0[65], h1[65];
    kiln_sha256_hex(all, h0);
    kiln_sha256_hex(all + 32 * first, h1);
    rc = kiln_errorf(KILN_ERR_COMM,
                     "the %d workers disagree on %s: rank%s %s differ%s from rank 0 (hash "
                     "%.12s on rank 0, %.12s on rank %d); %s",
                     s->nworkers, what, ndiff > 1 ? "s" : "", ranks, ndiff > 1 ? "" : "s", h0, h1,
                     first, hint);
  }
  free(all);
  return rc;
}

/* The train net's data as this worker's files hold it (the layers' fingerprints), and in `what`
 * the sources; empty when no layer reads files. Two hosts with different files under the same
 * path would otherwise train on different data without a word. */
static int data_digest(kiln_solver *s, uint8_t digest[32], char *what, size_t n) {
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  size_t used = 0;
  what[0] = '\0';
  for (int i = 0; i < s->net->nlayers; i++) {
    kiln_layer *l = s->net->layers[i];
    if (!l->ops->fingerprint) continue;
    uint8_t d[32];
    char src[1024];
    KILN_TRY(l->ops->fingerprint(l, d, src, sizeof src));
    kiln_sha256_update(&h, l->name, strlen(l->name) + 1);
    kiln_sha256_update(&h, d, sizeof d);
    if (used + 1 < n) {
      int k = snprintf(what + used, n - used, "%slayer '%s' reads %s", used ? "; " : "", l->name, src);
      used = k < 0 ? used : used + (size_t)k < n ? used + (size_t)k : n - 1;
    }
  }
  kiln_sha256_final(&h, digest);
  return KILN_OK;
}

/* ---- the gradients' memory and buckets ------------------------------------------------------- */

struct worker_bucket {
  int64_t off, n;   /* a range of the flat gradient */
  int ready_layer;  /* final once backward has run this layer (the first layer using it) */
};

/* 256 KiB: big enough that a sum's fixed cost is small, small enough that the last layers'
 * gradients go out while the first layers still compute. At 1 MiB, LeNet's and resnet20's whole
 * gradients (1.7 and 1.1 MB) made one or two buckets that could start only when backward ended,
 * so their sums hardly overlapped it (the wait per iteration in bench/mpi: docs/PERF.md). */
enum { BUCKET_FLOATS = 1 << 16 };

static int plan_buckets(kiln_solver *s) {
  kiln_net *net = s->net;
  int nl = net->nlearnable;
  if (nl == 0) return KILN_OK;
  int *ready = malloc(sizeof(int) * (size_t)nl);
  s->buckets = malloc(sizeof *s->buckets * (size_t)nl);
  if (!ready || !s->buckets) {
    free(ready);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int k = 0; k < nl; k++) ready[k] = net->nlayers;
  /* a shared parameter is final only after the first layer using it */
  for (int j = 0; j < net->nlayers; j++)
    for (int p = 0; p < net->layers[j]->nparam; p++)
      for (int k = 0; k < nl; k++)
        if (net->learnable[k]->data == net->layers[j]->param[p]->data && j < ready[k]) ready[k] = j;
  int64_t end = net->nparam_floats;
  int r = net->nlayers;
  for (int k = nl - 1; k >= 0; k--) {
    if (ready[k] < r) r = ready[k];
    int64_t start = net->learnable_offset[k];
    if (end - start >= BUCKET_FLOATS || k == 0) {
      s->buckets[s->nbuckets++] = (struct worker_bucket){.off = start, .n = end - start,
                                                         .ready_layer = r};
      end = start;
      r = net->nlayers;
    }
  }
  free(ready);
  return KILN_OK;
}

/* ---- host copies for the collectives --------------------------------------------------------- */

/* MPI moves host memory. A buffer of a train net on another device goes through the solver's
 * host copy (made in worker_sync_attach, as large as the largest buffer a collective moves):
 * to_host_view gives the host values of dev[0 .. n) at stage + at (dev itself on the host),
 * from_host_view puts them back after the collective changed them. One copy serves every
 * collective, one at a time, and the buckets in flight at their own offsets (so it never moves
 * while a sum is under way). */
static int to_host_view(kiln_solver *s, float *dev, int64_t n, int64_t at, float **host) {
  const kiln_device *d = s->net->device;
  if (kiln_device_is_host(d)) {
    *host = dev;
    return KILN_OK;
  }
  if (at < 0 || at + n > s->stage_floats)
    return kiln_errorf(KILN_ERR_INTERNAL, "%lld floats at %lld past the host copy's %lld",
                       (long long)n, (long long)at, (long long)s->stage_floats);
  *host = s->stage + at;
  return kiln_device_to_host(d, *host, dev, sizeof(float) * (size_t)n);
}

static int from_host_view(kiln_solver *s, float *dev, const float *host, int64_t n) {
  if (host == dev) return KILN_OK;
  return kiln_device_to_device(s->net->device, dev, host, sizeof(float) * (size_t)n);
}

/* kiln_sync_average of dev[0 .. n) by way of the host copy. */
static int average_on_host(kiln_solver *s, float *dev, int64_t n, float weight) {
  float *h = NULL;
  KILN_TRY(to_host_view(s, dev, n, 0, &h));
  KILN_TRY(kiln_sync_average(s->opt.comm, &s->sync, h, n, weight));
  return from_host_view(s, dev, h, n);
}

static int broadcast_on_host(kiln_solver *s, float *dev, int64_t n) {
  float *h = NULL;
  KILN_TRY(to_host_view(s, dev, n, 0, &h));
  KILN_TRY(kiln_comm_broadcast(s->opt.comm, h, n, 0));
  return from_host_view(s, dev, h, n);
}

/* With workers on one host, the train net's gradients move into the communicator's shared
 * memory: backward writes them where the other workers add them up, and the sum lands where the
 * update reads it (no copy in or out). Elsewhere, or for a gradient too large, they stay. */
static int place_gradients(kiln_solver *s) {
  /* Host memory: gradients on another device stay there (the sums would stage them). */
  if (!kiln_device_is_host(s->net->device)) return KILN_OK;
  float *home = kiln_comm_claim_sum_buffer(s->opt.comm, s->net->nparam_floats);
  if (!home) return KILN_OK;
  kiln_net_place_param_diff(s->net, home);
  s->sum_buffer = home;
  for (int i = 0; i < s->ntest; i++) KILN_TRY(kiln_net_share_params(s->test_nets[i], s->net));
  if (s->rank == 0)
    kiln_log(KILN_LOG_INFO, "the gradients (%lld floats) lie in shared memory: summed in place",
             (long long)s->net->nparam_floats);
  return KILN_OK;
}

int worker_sync_attach(kiln_solver *s) {
  worker_sync_seed_rng(s, 0);
  /* Summed in buckets during backward (the last pass's, with iter_size > 1), in rank order
   * with --deterministic; --no-overlap sums the whole buffer after backward instead. */
  s->overlap = s->nworkers > 1 && !s->opt.no_overlap;
  if (s->overlap) KILN_TRY(plan_buckets(s));
  if (s->nworkers > 1) KILN_TRY(place_gradients(s));
  if (s->nworkers > 1 && !kiln_device_is_host(s->net->device)) {
    const int64_t n = s->net->nparam_floats,
                  most = s->history_per_param > 1 ? n * s->history_per_param : n;
    if (most > 0 && !(s->stage = malloc(sizeof(float) * (size_t)most)))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the host copy of %lld floats",
                         (long long)most);
    s->stage_floats = most;
  }
  uint8_t digest[32];
  KILN_TRY(config_digest(s, digest));
  KILN_TRY(workers_agree(s, digest, "the solver and train net",
                         "start every worker with the same solver and net files and the same "
                         "--sync / --deterministic options"));
  if (s->nworkers <= 1) return KILN_OK;
  char what[1536], hint[2048];
  KILN_TRY(data_digest(s, digest, what, sizeof what));
  if (!what[0]) return KILN_OK;
  snprintf(hint, sizeof hint, "every worker must hold the same data under the same path: %s", what);
  return workers_agree(s, digest, "the training data", hint);
}

void worker_sync_release(kiln_solver *s) {
  kiln_comm_release_sum_buffer(s->opt.comm, s->sum_buffer);
  free(s->buckets);
  free(s->stage);
}

/* ---- the loop's hooks ------------------------------------------------------------------------ */

int worker_sync_before_steps(kiln_solver *s) {
  if (s->params_synced) return KILN_OK;
  if (s->nworkers > 1) {
    kiln_net *net = s->net;
    int rc = broadcast_on_host(s, net->param_data, net->nparam_floats);
    if (!rc)
      rc = broadcast_on_host(s, s->history, net->nparam_floats * (int64_t)s->history_per_param);
    if (rc) return kiln_error_context(rc, "broadcast of rank 0's parameters: ");
  }
  s->params_synced = true;
  return KILN_OK;
}

/* Starts the sum of every bucket that backward is done with (all of them for layer -1). With
 * iter_size > 1 the earlier passes' sum is added in first, as the loop's compute_gradients would
 * after backward: the same additions, bucket by bucket. */
static int start_ready_buckets(kiln_solver *s, int layer) {
  while (s->next_bucket < s->nbuckets && s->buckets[s->next_bucket].ready_layer >= layer) {
    const struct worker_bucket *b = &s->buckets[s->next_bucket++];
    float *g = s->net->param_diff + b->off;
    if (s->param->iter_size > 1)
      KILN_TRY(KILN_NET_OP(s->net, acc, g, s->grad_acc + b->off, b->n));
    float *h = NULL; /* another device: the bucket's place in the host copy, back after */
    KILN_TRY(to_host_view(s, g, b->n, b->off, &h));
    KILN_TRY(kiln_comm_bucket_start(s->opt.comm, h, b->n, s->sync.deterministic));
  }
  return kiln_comm_bucket_progress(s->opt.comm);
}

static int backward_hook(void *solver, int layer) {
  int rc = start_ready_buckets(solver, layer);
  return rc ? kiln_error_context(rc, "gradient sync: ") : KILN_OK;
}

bool worker_sync_before_backward(kiln_solver *s, bool local) {
  if (!s->overlap || local) return false;
  s->next_bucket = 0;
  s->net->backward_hook = backward_hook;
  s->net->backward_hook_user = s;
  return true;
}

int worker_sync_after_backward(kiln_solver *s, bool local, int *summed) {
  *summed = 1;
  if (s->nworkers <= 1 || local) return KILN_OK;
  double t = kiln_now_ms();
  if (s->overlap) {
    int rc = start_ready_buckets(s, -1); /* every layer is done */
    if (!rc) rc = kiln_comm_bucket_finish(s->opt.comm);
    for (int i = 0; i < s->nbuckets && !rc && s->stage; i++) { /* sums landed in the host copy */
      const struct worker_bucket *b = &s->buckets[i];
      rc = from_host_view(s, s->net->param_diff + b->off, s->stage + b->off, b->n);
    }
    if (rc) return kiln_error_context(rc, "gradient sync: ");
  } else {
    float *h = NULL;
    const int64_t n = s->net->nparam_floats;
    KILN_TRY(to_host_view(s, s->net->param_diff, n, 0, &h));
    KILN_TRY(kiln_sync_gradients(s->opt.comm, &s->sync, h, n));
    KILN_TRY(from_host_view(s, s->net->param_diff, h, n));
  }
  s->sync_ms += kiln_now_ms() - t;
  *summed = s->nworkers;
  return KILN_OK;
}

/* The iteration's loss over every pass of every worker, added in rank order (the order one
 * worker adds its passes in, so the loss too matches one worker with iter_size N). A worker that
 * steps on its own (`local`) reports its own. */
int worker_sync_loss(kiln_solver *s, double local_loss, bool local, float *out) {
  double total = local_loss;
  int workers = local ? 1 : s->nworkers;
  if (workers > 1) {
    double *all = malloc(sizeof(double) * (size_t)s->nworkers);
    if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    int rc = kiln_comm_allgather(s->opt.comm, &local_loss, sizeof local_loss, all);
    total = 0;
    for (int r = 0; r < s->nworkers && !rc; r++) total += all[r];
    free(all);
    if (rc) return kiln_error_context(rc, "gathering the workers' losses: ");
  }
  *out = (float)(total / ((double)s->param->iter_size * workers));
  return KILN_OK;
}

/* Every worker's parameters (running statistics included) and solver history become
 * sum_r weight_r x theirs_r: one model again. */
static int average_model(kiln_solver *s, float weight) {
  kiln_net *net = s->net;
  double t = kiln_now_ms();
  int rc = average_on_host(s, net->param_data, net->nparam_floats, weight);
  if (!rc)
    rc = average_on_host(s, s->history, net->nparam_floats * (int64_t)s->history_per_param,
                         weight);
  s->sync_ms += kiln_now_ms() - t;
  if (rc) return rc;
  s->naverages++;
  s->diverged = s->state_diverged = false;
  return KILN_OK;
}

/* The running statistics alone (BatchNorm's): in GRADIENT mode every worker holds the same
 * parameters, but each updates its statistics from its own batches. The updates are linear
 * (decayed sums), so averaging before each test and snapshot gives what averaging every
 * iteration would, without a collective per iteration. */
static int average_state(kiln_solver *s) {
  kiln_net *net = s->net;
  float w = 1.0f / (float)s->nworkers;
  double t = kiln_now_ms();
  for (int k = 0; k < net->nlearnable; k++)
    if (net->is_state[k])
      KILN_TRY(average_on_host(s, net->learnable[k]->data, net->learnable[k]->count, w));
  s->sync_ms += kiln_now_ms() - t;
  s->state_diverged = false;
  return KILN_OK;
}

int worker_sync_after_update(kiln_solver *s, bool local) {
  if (s->nworkers <= 1) return KILN_OK;
  s->state_diverged = true;
  if (!local) return KILN_OK;
  s->diverged = true;
  /* TIME averages at the end of its rounds (worker_sync_end_round) */
  if (s->sync.mode != KILN_SYNC_MODEL) return KILN_OK;
  if ((s->iter - s->sync.warmup_iters) % s->sync.interval_iters != 0) return KILN_OK;
  return average_model(s, 1.0f / (float)s->nworkers);
}

/* The average weighted by the iterations (hence samples) each worker ran, so a slow worker's few
 * steps pull the model as little as they moved it. The iteration count and the data cursors then
 * move to the furthest worker's: the schedule follows the fastest worker, and batches dealt to a
 * slower worker that it did not reach in the round are skipped (docs/distributed.md). */
int worker_sync_end_round(kiln_solver *s, int start, uint64_t steps) {
  int nc = kiln_net_data_layer_count(s->net);
  size_t per = (size_t)nc + 1;
  uint64_t *mine = calloc(per, sizeof(uint64_t));
  uint64_t *all = calloc(per * (size_t)s->nworkers, sizeof(uint64_t));
  int rc = mine && all ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) {
    mine[0] = steps;
    kiln_net_get_cursors(s->net, mine + 1); /* returns the count, nc */
  }
  double t = kiln_now_ms();
  if (!rc) rc = kiln_comm_allgather(s->opt.comm, mine, per * sizeof(uint64_t), all);
  s->sync_ms += kiln_now_ms() - t; /* waiting for the slowest worker's last step */
  uint64_t total = 0, most = 0;
  bool move = false;
  if (!rc) {
    for (int r = 0; r < s->nworkers; r++) {
      total += all[r * per];
      if (all[r * per] > most) most = all[r * per];
    }
    for (int c = 0; c < nc; c++) {
      uint64_t far = 0;
      for (int r = 0; r < s->nworkers; r++)
        if (all[r * per + 1 + (size_t)c] > far) far = all[r * per + 1 + (size_t)c];
      if (far != mine[1 + c]) move = true;
      mine[1 + c] = far;
    }
    rc = average_model(s, (float)((double)steps / (double)total));
  }
  if (!rc && move) rc = kiln_net_set_cursors(s->net, mine + 1, nc);
  free(mine);
  free(all);
  if (rc) return kiln_error_context(rc, "time sync after iteration %d: ", s->iter);
  s->iter = start + (int)most;
  return KILN_OK;
}

int worker_sync_converge(kiln_solver *s) {
  if (s->nworkers <= 1) return KILN_OK;
  if (s->diverged) return average_model(s, 1.0f / (float)s->nworkers);
  if (s->state_diverged) return average_state(s);
  return KILN_OK;
}

/* One "worker" event per rank on rank 0: each worker's own throughput and time in sync, so a
 * slow worker (which every other one waits for) shows. */
int worker_sync_report(kiln_solver *s) {
  if (s->nworkers <= 1) return KILN_OK;
  double busy = s->work_ms + s->sync_ms;
  double mine[4] = {s->work_ms > 0 ? s->work_samples / (s->work_ms / 1e3) : 0, s->sync_ms,
                    busy > 0 ? s->work_samples / (busy / 1e3) : 0, (double)s->work_iters};
  double *all = malloc(sizeof mine * (size_t)s->nworkers);
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = kiln_comm_allgather(s->opt.comm, mine, sizeof mine, all);
  for (int r = 0; r < s->nworkers && !rc; r++) {
    kiln_event e = {.event = "worker", .iter = s->iter, .rank = r, .samples_per_s = all[4 * r],
                    .sync_ms = all[4 * r + 1], .wall_samples_per_s = all[4 * r + 2],
                    .worker_iters = (int64_t)all[4 * r + 3]};
    solver_emit(s, &e);
  }
  free(all);
  return rc ? kiln_error_context(rc, "gathering the workers' throughput: ") : KILN_OK;
}

void worker_sync_params_changed(kiln_solver *s) { s->params_synced = false; }

int worker_sync_check_restored(kiln_solver *s) {
  if (s->nworkers <= 1) return KILN_OK;
  kiln_sha256_ctx h;
  uint8_t digest[32];
  int nc = kiln_net_data_layer_count(s->net);
  uint64_t *cursors = calloc((size_t)nc + 1, sizeof *cursors);
  if (!cursors) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  kiln_net_get_cursors(s->net, cursors);
  int64_t where[2] = {s->iter, s->current_step};
  kiln_sha256_init(&h);
  kiln_sha256_update(&h, where, sizeof where);
  kiln_sha256_update(&h, cursors, sizeof(uint64_t) * (size_t)nc);
  kiln_sha256_final(&h, digest);
  free(cursors);
  return workers_agree(s, digest, "the resumed state (iteration and data cursors)",
                       "give every worker the same --snapshot");
}
