/* Snapshots and restore (see include/kiln/solver.h): <prefix>_iter_<N>.caffemodel with the
 * weights, and .solverstate with Caffe's SolverState (iteration, lr step, history) plus kiln's
 * fields for exact resume (data cursors, generator states, the smoothed loss's window;
 * docs/architecture.md, Snapshots). With several workers, rank 0 writes and reads the files and
 * the others get what they need through the communicator. */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "solver_internal.h"
#include "worker_sync.h"

int kiln_solver_load_weights(kiln_solver *s, const char *path) {
  /* Rank 0's parameters go to the other workers before the first step, so only rank 0 needs the
   * file. */
  worker_sync_params_changed(s);
  return s->rank == 0 ? kiln_net_load_weights(s->net, path) : KILN_OK;
}

int kiln_solver_snapshot(kiln_solver *s, char **path_out) {
  kiln_net *net = s->net;
  if (path_out) *path_out = NULL;
  /* One model to save: MODEL / TIME workers average first, GRADIENT workers their statistics. */
  KILN_TRY(worker_sync_converge(s));
  /* Every worker's dropout generator, so that each resumes its own stream. */
  kiln_rng *rngs = NULL;
  if (s->nworkers > 1) {
    rngs = malloc(sizeof(kiln_rng) * (size_t)s->nworkers);
    if (!rngs) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    int rc = kiln_comm_allgather(s->opt.comm, &net->rng, sizeof net->rng, rngs);
    if (rc || s->rank != 0) {
      free(rngs);
      return rc ? kiln_error_context(rc, "snapshot: gathering generator states: ") : KILN_OK;
    }
  }
  size_t n = strlen(s->snapshot_prefix) + 64;
  char *model = malloc(n), *state_path = malloc(n);
  if (!model || !state_path) {
    free(model);
    free(state_path);
    free(rngs);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  /* A snapshot killed mid-write leaves its temporary file (<prefix>_iter_N.*.tmp.PID); the next
   * snapshot of the same prefix removes those whose process is gone. Failing to is no reason
   * not to snapshot. */
  snprintf(model, n, "%s_iter_", s->snapshot_prefix);
  int removed = 0;
  if (kiln_remove_stale_temporaries(model, &removed) == KILN_OK && removed)
    kiln_log(KILN_LOG_INFO, "removed %d temporary file%s left by killed snapshots (%s*.tmp.*)",
             removed, removed == 1 ? "" : "s", model);
  const char *h5 =
      s->param->snapshot_format == CAFFE__SOLVER_PARAMETER__SNAPSHOT_FORMAT__HDF5 ? ".h5" : "";
  snprintf(model, n, "%s_iter_%d.caffemodel%s", s->snapshot_prefix, s->iter, h5);
  snprintf(state_path, n, "%s_iter_%d.solverstate%s", s->snapshot_prefix, s->iter, h5);
  int rc = kiln_net_save_weights(net, model);

  Caffe__SolverState st = CAFFE__SOLVER_STATE__INIT;
  int nh = net->nlearnable * s->history_per_param;
  Caffe__BlobProto *bps = calloc((size_t)nh + 1, sizeof *bps);
  Caffe__BlobProto **bpp = calloc((size_t)nh + 1, sizeof *bpp);
  Caffe__BlobShape *shapes = calloc((size_t)nh + 1, sizeof *shapes);
  int nc = kiln_net_data_layer_count(net);
  uint64_t *cursors = calloc((size_t)nc + 1, sizeof *cursors); /* one per data layer */
  int ntc = 0; /* the test nets' data layers (rank 0 alone has test nets, and writes) */
  for (int k = 0; k < s->ntest; k++) ntc += kiln_net_data_layer_count(s->test_nets[k]);
  uint64_t *test_cursors = calloc((size_t)ntc + 1, sizeof *test_cursors);
  ProtobufCBinaryData *worker_rng = calloc((size_t)s->nworkers, sizeof *worker_rng);
  if (!rc && (!bps || !bpp || !shapes || !cursors || !test_cursors || !worker_rng))
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  /* The histories readable on the host: the buffer itself there, else a copy through the
   * device table. */
  const float *history = s->history;
  float *history_copy = NULL;
  if (!rc && !kiln_device_is_host(net->device)) {
    size_t bytes = sizeof(float) * (size_t)net->nparam_floats * (size_t)s->history_per_param;
    history_copy = malloc(bytes ? bytes : 1);
    rc = history_copy ? kiln_device_to_host(net->device, history_copy, s->history, bytes)
                      : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    history = history_copy;
  }
  if (!rc) {
    st.has_iter = st.has_current_step = true;
    st.iter = s->iter;
    st.current_step = s->current_step;
    st.learned_net = model;
    /* Caffe's layout: all first histories, then (Adam, AdaDelta) all second ones. */
    for (int h = 0; h < s->history_per_param; h++)
      for (int k = 0; k < net->nlearnable; k++) {
        int i = h * net->nlearnable + k;
        caffe__blob_proto__init(&bps[i]);
        caffe__blob_shape__init(&shapes[i]);
        shapes[i].n_dim = (size_t)net->learnable[k]->naxes;
        shapes[i].dim = net->learnable[k]->shape;
        bps[i].shape = &shapes[i];
        bps[i].n_data = (size_t)net->learnable[k]->count;
        /* protobuf-c's field is not const; the message is only packed */
        bps[i].data = (float *)history + (int64_t)h * net->nparam_floats + net->learnable_offset[k];
        bpp[i] = &bps[i];
      }
    st.n_history = (size_t)nh;
    st.history = bpp;
    kiln_net_get_cursors(net, cursors);
    st.n_kiln_data_cursor = (size_t)nc;
    st.kiln_data_cursor = cursors;
    for (int k = 0, at = 0; k < s->ntest; k++) {
      kiln_net_get_cursors(s->test_nets[k], test_cursors + at);
      at += kiln_net_data_layer_count(s->test_nets[k]);
    }
    st.n_kiln_test_data_cursor = (size_t)ntc;
    st.kiln_test_data_cursor = test_cursors;
    st.has_kiln_rng_state = true;
    st.kiln_rng_state.len = sizeof net->rng;
    st.kiln_rng_state.data = (uint8_t *)&net->rng;
    float window[1024];
    int wn = s->loss_window_n < 1024 ? s->loss_window_n : 1024;
    /* oldest first, so a restore can replay them in order */
    int avg = s->param->average_loss;
    for (int i = 0; i < wn; i++)
      window[i] = s->loss_window[(s->loss_window_pos - wn + i + 2 * avg) % avg];
    st.n_kiln_loss_history = (size_t)wn;
    st.kiln_loss_history = window;
    st.has_kiln_first_loss = s->have_first_loss;
    st.kiln_first_loss = s->first_loss;
    st.has_kiln_divergence_run = s->divergence_run > 0;
    st.kiln_divergence_run = s->divergence_run;
    if (s->nworkers > 1) {
      st.has_kiln_workers = true;
      st.kiln_workers = s->nworkers;
      for (int r = 1; r < s->nworkers; r++) {
        worker_rng[r - 1].len = sizeof(kiln_rng);
        worker_rng[r - 1].data = (uint8_t *)&rngs[r];
      }
      st.n_kiln_worker_rng_state = (size_t)s->nworkers - 1;
      st.kiln_worker_rng_state = worker_rng;
    }
    rc = *h5 ? kiln_h5_write_state(state_path, &st) : kiln_proto_write_binary(state_path, &st.base);
  }
  free(history_copy);
  free(worker_rng);
  free(cursors);
  free(test_cursors);
  free(rngs);
  free(bps);
  free(bpp);
  free(shapes);
  if (!rc) {
    kiln_event e = {.event = "snapshot", .iter = s->iter, .path = state_path};
    solver_emit(s, &e);
  }
  free(model);
  if (!rc && path_out) *path_out = state_path;
  else free(state_path);
  return rc;
}

/* The .solverstate's bytes on every rank. Rank 0 reads the file and broadcasts them, so the
 * other workers need not see it: on hosts without a shared file system the snapshots are where
 * rank 0 wrote them. A rank 0 that cannot read it fails every rank with the same cause. */
static int snapshot_bytes(kiln_solver *s, const char *path, char **buf, size_t *len) {
  *buf = NULL;
  *len = 0;
  int rc = s->rank == 0 ? kiln_read_file(path, buf, len) : KILN_OK;
  if (s->nworkers <= 1) return rc;
  int64_t head[2] = {rc, (int64_t)*len};
  int brc = kiln_comm_broadcast_bytes(s->opt.comm, head, sizeof head, 0);
  if (brc || rc) {
    free(*buf);
    *buf = NULL;
    return brc ? kiln_error_context(brc, "sending the snapshot: ") : rc;
  }
  if (head[0] != KILN_OK)
    return kiln_errorf((int)head[0], "%s: rank 0 could not read the snapshot (its message says why)",
                       path);
  if (s->rank != 0) {
    *len = (size_t)head[1];
    *buf = malloc(*len ? *len : 1);
    /* alone in failing: the caller ends the job */
    if (!*buf) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for %zu bytes", path, *len);
  }
  int crc = kiln_comm_broadcast_bytes(s->opt.comm, *buf, *len, 0);
  if (crc) {
    free(*buf);
    *buf = NULL;
    return kiln_error_context(crc, "sending the snapshot: ");
  }
  return KILN_OK;
}

static bool finite_all(const float *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(v[i])) return false;
  return true;
}

int kiln_solver_restore(kiln_solver *s, const char *path) {
  ProtobufCMessage *m;
  char *bytes;
  size_t nbytes;
  KILN_TRY(snapshot_bytes(s, path, &bytes, &nbytes));
  int urc;
  if (kiln_h5_path(path)) { /* Caffe's .solverstate.h5 */
    Caffe__SolverState *h5 = NULL;
    urc = kiln_h5_unpack_state(bytes, nbytes, path, &h5);
    m = h5 ? &h5->base : NULL;
  } else {
    urc = kiln_proto_unpack(bytes, nbytes, path, &caffe__solver_state__descriptor, &m);
  }
  free(bytes);
  KILN_TRY(urc);
  Caffe__SolverState *st = (Caffe__SolverState *)m;
  kiln_net *net = s->net;
  int rc = KILN_OK;
  int nh = net->nlearnable * s->history_per_param;
  const bool multistep = s->param->lr_policy && !strcmp(s->param->lr_policy, "multistep");
  if (st->iter < 0) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: iter is %d; it cannot be negative", path, (int)st->iter);
  } else if (st->current_step < 0 ||
             (multistep && (size_t)st->current_step > s->param->n_stepvalue)) {
    rc = kiln_errorf(KILN_ERR_INVALID,
                     "%s: current_step is %d; the solver's multistep schedule has steps 0 to %zu",
                     path, (int)st->current_step, multistep ? s->param->n_stepvalue : 0);
  } else if (st->has_kiln_workers && st->kiln_workers < 1) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: kiln_workers is %d; a run has at least 1 worker", path,
                     (int)st->kiln_workers);
  } else if (st->has_kiln_first_loss && !isfinite(st->kiln_first_loss)) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: kiln_first_loss is %g; a loss that started training "
                     "is finite", path, (double)st->kiln_first_loss);
  } else if (st->kiln_divergence_run < 0) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: kiln_divergence_run is %d; it cannot be negative",
                     path, (int)st->kiln_divergence_run);
  } else if (!finite_all(st->kiln_loss_history, st->n_kiln_loss_history)) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: kiln_loss_history holds a value that is not finite",
                     path);
  } else if (!st->learned_net || !st->learned_net[0]) {
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: names no learned_net (.caffemodel)", path);
  } else if ((int)st->n_history != nh) {
    rc = kiln_errorf(KILN_ERR_SHAPE,
                     "%s: %zu history blobs, but a %s solver for this net needs %d", path,
                     st->n_history, kiln_solver_type_name(s->type), nh);
  }
  for (int i = 0; !rc && i < nh; i++) {
    int k = i % net->nlearnable, h = i / net->nlearnable;
    if ((int64_t)st->history[i]->n_data != net->learnable[k]->count) {
      rc = kiln_errorf(KILN_ERR_SHAPE, "%s: history blob %d has %zu values, parameter '%s' has %lld",
                       path, i, st->history[i]->n_data, net->learnable[k]->name,
                       (long long)net->learnable[k]->count);
      break;
    }
    for (int64_t j = 0; j < net->learnable[k]->count; j++)
      if (!isfinite(st->history[i]->data[j])) {
        rc = kiln_errorf(KILN_ERR_INVALID, "%s: history blob %d (parameter '%s') holds %g at %lld",
                         path, i, net->learnable[k]->name, (double)st->history[i]->data[j],
                         (long long)j);
        break;
      }
    if (rc) break;
    float *to = s->history + (int64_t)h * net->nparam_floats + net->learnable_offset[k];
    rc = kiln_device_to_device(net->device, to, st->history[i]->data,
                               sizeof(float) * (size_t)net->learnable[k]->count);
  }
  if (!rc && s->rank == 0) {
    /* The weights file: as recorded, else beside the solverstate. Rank 0 alone reads it: its
     * parameters go to the other workers before the first step (worker_sync_before_steps). */
    const char *model = st->learned_net;
    char buf[4096];
    if (access(model, R_OK) != 0) {
      char tmp[4096], tmp2[4096];
      snprintf(tmp, sizeof tmp, "%s", path);
      snprintf(tmp2, sizeof tmp2, "%s", model);
      snprintf(buf, sizeof buf, "%s/%s", dirname(tmp), basename(tmp2));
      model = buf;
    }
    rc = kiln_net_load_weights(net, model);
    if (rc) rc = kiln_error_context(rc, "%s: its learned_net '%s': ", path, st->learned_net);
  }
  if (!rc) {
    s->iter = st->iter;
    s->current_step = st->current_step;
    /* Without the fields (Caffe's snapshots) the check starts afresh from the next loss. */
    s->have_first_loss = st->has_kiln_first_loss;
    s->first_loss = st->kiln_first_loss;
    s->divergence_run = st->kiln_divergence_run;
    if (st->n_kiln_data_cursor)
      rc = kiln_net_set_cursors(net, st->kiln_data_cursor, (int)st->n_kiln_data_cursor);
    if (rc) rc = kiln_error_context(rc, "%s: ", path);
  }
  if (!rc && s->rank == 0 && st->n_kiln_test_data_cursor) {
    /* Absent (Caffe's snapshots, or no test data): the test passes start at the beginning. */
    int ntc = 0;
    for (int k = 0; k < s->ntest; k++) ntc += kiln_net_data_layer_count(s->test_nets[k]);
    if ((size_t)ntc != st->n_kiln_test_data_cursor)
      rc = kiln_errorf(KILN_ERR_SHAPE, "%s: %zu test data cursors, but the solver's test nets have "
                       "%d data layers", path, st->n_kiln_test_data_cursor, ntc);
    for (int k = 0, at = 0; !rc && k < s->ntest; k++) {
      int n = kiln_net_data_layer_count(s->test_nets[k]);
      if (n) rc = kiln_net_set_cursors(s->test_nets[k], st->kiln_test_data_cursor + at, n);
      if (rc) rc = kiln_error_context(rc, "%s: test net %d: ", path, k);
      at += n;
    }
  }
  if (!rc && s->rank > 0) {
    /* A worker's own saved stream when the snapshot came from as many workers; a fresh one,
     * distinct per rank and iteration, otherwise. */
    const ProtobufCBinaryData *mine = NULL;
    if (st->kiln_workers == s->nworkers && (int)st->n_kiln_worker_rng_state == s->nworkers - 1)
      mine = &st->kiln_worker_rng_state[s->rank - 1];
    if (mine && mine->len != sizeof net->rng)
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: generator state of rank %d has %zu bytes, expected %zu",
                       path, s->rank, mine->len, sizeof net->rng);
    else if (mine)
      memcpy(&net->rng, mine->data, sizeof net->rng);
    else
      worker_sync_seed_rng(s, (uint64_t)st->iter);
  } else if (!rc && st->has_kiln_rng_state) {
    if (st->kiln_rng_state.len != sizeof net->rng)
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: generator state has %zu bytes, expected %zu", path,
                       st->kiln_rng_state.len, sizeof net->rng);
    else
      memcpy(&net->rng, st->kiln_rng_state.data, sizeof net->rng);
  }
  if (!rc) {
    s->loss_window_n = s->loss_window_pos = 0;
    int avg = s->param->average_loss;
    for (size_t i = 0; i < st->n_kiln_loss_history; i++) {
      s->loss_window[s->loss_window_pos] = st->kiln_loss_history[i];
      s->loss_window_pos = (s->loss_window_pos + 1) % avg;
      if (s->loss_window_n < avg) s->loss_window_n++;
    }
    kiln_log(KILN_LOG_INFO, "resumed from %s at iteration %d", path, s->iter);
    if (s->rank == 0 && st->kiln_workers != s->nworkers)
      kiln_log(KILN_LOG_INFO,
               "%s was written by %d worker(s), resuming on %d: the data stream continues from "
               "the saved cursor, with a global batch of %d x %d worker(s) x iter_size %d",
               path, st->kiln_workers, s->nworkers, s->batch_size, s->nworkers,
               s->param->iter_size);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  worker_sync_params_changed(s);
  /* Every rank parsed rank 0's bytes; a check that they restored the same place costs one small
   * collective. */
  if (!rc) rc = worker_sync_check_restored(s);
  return rc;
}
