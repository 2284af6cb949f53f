/* The net's memory plan (which activation gradients and data share buffers, the total against
 * the limit), then the allocation of everything on the net's device and the filling of
 * parameters; kiln_net_describe prints the layers and the plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "net_internal.h"

/* qsort's comparison for plan_diff_sharing: `last` descending, then index ascending. qsort takes
 * no context argument: the array it compares by is the building thread's. */
static _Thread_local const int *sort_last;
static int by_last_desc(const void *pa, const void *pb) {
  const int a = *(const int *)pa, b = *(const int *)pb;
  if (sort_last[a] != sort_last[b]) return sort_last[a] < sort_last[b] ? 1 : -1;
  return (a > b) - (a < b);
}

static const char *human_bytes(int64_t b, char *buf, size_t n) {
  if (b >= (1LL << 30)) snprintf(buf, n, "%.2f GiB", b / (double)(1LL << 30));
  else if (b >= (1LL << 20)) snprintf(buf, n, "%.1f MiB", b / (double)(1LL << 20));
  else snprintf(buf, n, "%.1f KiB", b / 1024.0);
  return buf;
}

/* The buffer of a pool for a blob of `need` floats live from time `start` to `release`, blobs
 * placed in order of start: among the buffers whose last blob was released before `start`, the
 * smallest that fits, else the largest (it grows least); a new one when none is free. The buffer
 * grows to fit and is busy until `release`. Gradients (backward time) and activation data
 * (forward time) share this rule. */
static int pool_slot(int64_t need, int start, int release, int64_t *floats, int *busy_until,
                     int *slots) {
  int best = -1;
  for (int k = 0; k < *slots; k++) {
    if (busy_until[k] >= start) continue; /* its blob is still live when this one starts */
    if (best < 0) {
      best = k;
      continue;
    }
    const int64_t have = floats[k], bh = floats[best];
    if ((have >= need && (bh < need || have < bh)) || (bh < need && have > bh)) best = k;
  }
  if (best < 0) best = (*slots)++;
  if (floats[best] < need) floats[best] = need;
  busy_until[best] = release;
  return best;
}

/* Which activation gradients may share a buffer. In backward (layers in reverse order) a blob's
 * diff is first written by the last layer that reads the blob in forward and last read by the
 * first layer that writes it (its producer): it lives over the layer interval [first, last]
 * (a loss top from the start of backward, when its diff is set to the loss weight). Blobs whose
 * intervals do not overlap can use one buffer. Only blobs whose diff every consumer writes take
 * part: a diff nobody writes must stay zero (a top only Accuracy reads, a bottom with
 * propagate_down: false, an output that is not a loss), so those keep their own. Greedy, in
 * backward order, best-fitting free buffer first. */
static int plan_diff_sharing(kiln_net *net, const kiln_net_options *opt) {
  net_internal *in = net->internal;
  if (!opt->share_diffs || net->nblobs == 0) return KILN_OK;
  int n = net->nblobs;
  int *first = malloc(sizeof(int) * (size_t)n), *last = malloc(sizeof(int) * (size_t)n);
  int *order = malloc(sizeof(int) * (size_t)n), *busy_until = malloc(sizeof(int) * (size_t)(n + 1));
  bool *ok = malloc(sizeof(bool) * (size_t)n);
  in->diff_slot = malloc(sizeof(int) * (size_t)n);
  in->diff_pool_floats = calloc((size_t)n + 1, sizeof(int64_t));
  if (!first || !last || !order || !busy_until || !ok || !in->diff_slot || !in->diff_pool_floats) {
    free(first), free(last), free(order), free(busy_until), free(ok);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    first[i] = INT32_MAX, last[i] = -1, ok[i] = true, in->diff_slot[i] = -1;
  }
  for (int j = 0; j < net->nlayers; j++) {
    kiln_layer *l = net->layers[j];
    const int jb = j + l->fused; /* where its backward runs (a fused group's last layer) */
    for (int t = 0; t < l->ntop; t++) {
      const int i = l->top[t]->id;
      if (l->loss_weight[t] != 0) last[i] = net->nlayers; /* set when backward starts */
    }
    for (int k = 0; k < l->nbottom; k++)
      if (!net->layer_need_backward[j] || !l->propagate_down[k] || !l->ops->backward)
        ok[l->bottom[k]->id] = false;
    for (int k = 0; k < l->ntop + l->nbottom; k++) {
      const int i = (k < l->ntop ? l->top[k] : l->bottom[k - l->ntop])->id;
      if (j < first[i]) first[i] = j;
      if (jb > last[i]) last[i] = jb;
    }
  }
  for (int o = 0; o < net->noutputs; o++)
    if (net->output_loss_weight[o] == 0) ok[net->outputs[o]->id] = false;
  int m = 0;
  for (int i = 0; i < n; i++)
    if (ok[i] && last[i] >= 0 && net->blobs[i]->count > 0 && !net->blobs[i]->no_diff) order[m++] = i;
  /* backward order: the blob whose diff is written first comes first; among equals, creation
   * order (a stable sort) */
  sort_last = last;
  qsort(order, (size_t)m, sizeof *order, by_last_desc);
  int slots = 0;
  const int end = net->nlayers; /* backward time: end - layer index */
  for (int a = 0; a < m; a++) {
    const int i = order[a];
    in->diff_slot[i] = pool_slot(net->blobs[i]->count, end - last[i], end - first[i],
                                 in->diff_pool_floats, busy_until, &slots);
  }
  in->ndiff_pool = slots;
  free(first), free(last), free(order), free(busy_until), free(ok);
  return KILN_OK;
}

/* The net blob whose memory b's data is (b itself, or the blob a Split top reads), or -1 when it
 * is no activation's (a recomputed top's scratch). */
static int data_root(const kiln_net *net, const kiln_blob *b) {
  while (b->data_of) b = b->data_of;
  return kiln_net_blob_index(net, b);
}

/* Whether layer j's backward runs: at a fused group's head, for the whole group. */
static bool backward_runs(const kiln_net *net, int j) {
  const kiln_layer *l = net->layers[j];
  if (net->forward_only || l->fused_into) return false;
  bool need = false;
  for (int k = j; k <= j + l->fused && k < net->nlayers; k++) need |= net->layer_need_backward[k];
  return need;
}

/* qsort's comparison for plan_data_sharing: `first` ascending, then index ascending (the
 * building thread's array, as for by_last_desc). */
static _Thread_local const int *sort_first;
static int by_first(const void *pa, const void *pb) {
  const int a = *(const int *)pa, b = *(const int *)pb;
  if (sort_first[a] != sort_first[b]) return sort_first[a] > sort_first[b] ? 1 : -1;
  return (a > b) - (a < b);
}

/* Which activations' data may share buffers (kiln_net_options.share_data). Blob i's data lives
 * from the first layer that writes it to the last that reads it in forward; to the end of the
 * step when a backward that runs reads it (kiln_layer_ops.backward_reads), a layer recomputes
 * from it or a refill copies from it in backward, a loss reads it, or it is an output of the
 * net. A Split top that reads its bottom's data counts as its bottom. Only blobs that every
 * layer touching them describes (backward_reads set) take part, and none a data layer or the
 * caller fills; blobs that live to the end keep their own memory. In a forward-only net the
 * buffers of described layers take part too, each living through its layer's forward alone
 * (what they keep serves backward, and such a layer keeps nothing in them from one forward to
 * the next). Then, in forward order, each goes to the best-fitting free buffer of a pool (the
 * smallest that fits, else the largest, which grows least), free again once its last reader has
 * run. */
static int plan_data_sharing(kiln_net *net) {
  net_internal *in = net->internal;
  const int n = net->nblobs, L = net->nlayers, END = L;
  if (!net->share_data || n == 0) return KILN_OK;
  int nitems = n;
  for (int j = 0; net->forward_only && j < L; j++) nitems += net->layers[j]->nbuffer;
  kiln_blob **item = malloc(sizeof(kiln_blob *) * (size_t)nitems);
  int *first = malloc(sizeof(int) * (size_t)nitems), *last = malloc(sizeof(int) * (size_t)nitems);
  int *order = malloc(sizeof(int) * (size_t)nitems);
  int *busy_until = malloc(sizeof(int) * (size_t)nitems);
  int *slot_of = malloc(sizeof(int) * (size_t)nitems);
  int64_t *floats = calloc((size_t)nitems, sizeof(int64_t));
  bool *ok = malloc(sizeof(bool) * (size_t)nitems);
  int rc = KILN_OK;
  if (!item || !first || !last || !order || !busy_until || !slot_of || !floats || !ok) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    goto done;
  }
  for (int i = 0; i < n; i++) item[i] = net->blobs[i];
  for (int j = 0, k = n; k < nitems; j++)
    for (int b = 0; b < net->layers[j]->nbuffer; b++, k++) {
      const kiln_layer *l = net->layers[j];
      item[k] = l->buffer[b];
      first[k] = last[k] = j;
      ok[k] = l->ops->backward_reads != NULL && !l->buffer[b]->data_of && l->buffer[b]->count > 0;
    }
  for (int i = 0; i < n; i++) {
    const kiln_blob *b = net->blobs[i];
    first[i] = INT32_MAX, last[i] = -1;
    ok[i] = !b->data_of && !b->csr && b->count > 0;
  }
  for (int j = 0; j < L; j++) {
    const kiln_layer *l = net->layers[j];
    const bool described = l->ops->backward_reads != NULL;
    const unsigned reads = !backward_runs(net, j) ? 0 : described ? l->ops->backward_reads(l) : ~0u;
    for (int k = 0; k < l->nbottom + l->ntop; k++) {
      const bool top = k >= l->nbottom;
      const int idx = top ? k - l->nbottom : k;
      const int r = data_root(net, top ? l->top[idx] : l->bottom[idx]);
      if (r < 0) continue;
      if (!described || (top && (l->ops->is_data || l->ops->fed_by_caller))) ok[r] = false;
      if (top && j < first[r]) first[r] = j;
      if (j > last[r]) last[r] = j;
      const unsigned bit = idx >= 16 ? 0 : top ? KILN_READS_TOP(idx) : KILN_READS_BOTTOM(idx);
      if (reads && (!bit || (reads & bit))) last[r] = END;
      if (top && l->loss_weight[idx] != 0) last[r] = END;
    }
  }
  for (int o = 0; o < net->noutputs; o++) {
    const int r = data_root(net, net->outputs[o]);
    if (r >= 0) last[r] = END;
  }
  for (int c = 0; in->recompute_before && c < L; c++) {
    const int j = in->recompute_before[c];
    if (j < 0) continue;
    const int r = data_root(net, net->layers[j]->bottom[0]);
    if (r >= 0) last[r] = END;
  }
  /* the kept last top of each prefix chain, which backward's refills copy from */
  for (int k = 0; in->refill_from && k < L; k++) {
    if (in->refill_from[k] < 0) continue;
    const int e = data_root(net, net->layers[in->refill_from[k]]->top[0]);
    if (e >= 0) last[e] = END;
  }
  int m = 0;
  for (int i = 0; i < nitems; i++)
    if (ok[i] && last[i] < END && first[i] <= last[i]) order[m++] = i;
  sort_first = first;
  qsort(order, (size_t)m, sizeof *order, by_first);
  int slots = 0;
  for (int i = 0; i < nitems; i++) slot_of[i] = -1;
  for (int a = 0; a < m; a++) {
    const int i = order[a];
    slot_of[i] = pool_slot(item[i]->count, first[i], last[i], floats, busy_until, &slots);
  }
  if (slots) {
    in->data_pool = calloc((size_t)slots, sizeof(kiln_blob *));
    if (!in->data_pool) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      goto done;
    }
    in->ndata_pool = slots;
    for (int k = 0; k < slots && !rc; k++) {
      kiln_blob *p = kiln_blob_new(KILN_NET_SHARED_DATA);
      if (!p) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        break;
      }
      in->data_pool[k] = p;
      p->device = net->device;
      p->defer_alloc = true;
      p->no_diff = true;
      rc = kiln_blob_reshape(p, 1, (const int64_t[]){floats[k]});
    }
    for (int i = 0; i < nitems && !rc; i++)
      if (slot_of[i] >= 0) item[i]->data_of = in->data_pool[slot_of[i]];
  }
done:
  free(item), free(first), free(last), free(order), free(busy_until), free(slot_of), free(floats),
      free(ok);
  return rc;
}

int kiln_net_plan_memory(kiln_net *net, const kiln_net_options *opt) {
  kiln_memory_plan *m = &net->memory;
  memset(m, 0, sizeof *m);
  for (int k = 0; k < net->nlearnable; k++) m->params += net->learnable[k]->count * 4;
  m->grads = m->params;
  m->history = m->params * opt->history_per_param;
  KILN_TRY(plan_diff_sharing(net, opt));
  KILN_TRY(plan_data_sharing(net));
  net_internal *in = net->internal;
  for (int i = 0; i < net->nblobs; i++) {
    const kiln_blob *b = net->blobs[i];
    if (b->csr) /* a sparse blob: its CSR matrix, sized by its data layer */
      m->activations += kiln_csr_bytes(b->csr);
    else {
      const bool own_diff = !net->forward_only && !(in->diff_slot && in->diff_slot[i] >= 0);
      m->activations += b->count * ((b->data_of ? 0 : 4) + (own_diff ? 4 : 0));
    }
  }
  for (int k = 0; k < in->ndiff_pool; k++) m->activations += in->diff_pool_floats[k] * 4;
  for (int k = 0; k < in->ndata_pool; k++) m->activations += in->data_pool[k]->count * 4;
  if (in->recompute_before) {
    m->activations += in->scratch_top->count * 4;
    for (int p = 0; p < 2; p++)
      if (in->scratch_prefix[p]) m->activations += in->scratch_prefix[p]->count * 4;
    m->buffers += in->scratch_kept->count * 4;
  }
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    for (int b = 0; b < l->nbuffer; b++) /* data only; a recomputed one's is the scratch's */
      if (!l->buffer[b]->data_of) m->buffers += l->buffer[b]->count * 4;
    if (l->workspace_floats > net->workspace_floats) net->workspace_floats = l->workspace_floats;
    m->data_queues += l->extra_bytes;
  }
  m->workspace = net->workspace_floats * 4;
  m->total = m->params + m->grads + m->history + m->activations + m->buffers + m->workspace +
             m->data_queues;
  /* a net on a GPU: its memory is the GPU's (--max-memory counts that too) */
  size_t dev_free = 0;
  const bool dev_limit = kiln_device_available(net->device, &dev_free) == KILN_OK;
  uint64_t limit = opt->max_memory ? opt->max_memory
                   : dev_limit     ? (uint64_t)dev_free
                                   : kiln_mem_available();
  if (limit && (uint64_t)m->total > limit) {
    const char *names[] = {"parameters", "gradients", "solver history", "activations",
                           "layer buffers", "workspace", "data prefetch queues"};
    int64_t parts[] = {m->params, m->grads, m->history, m->activations, m->buffers, m->workspace,
                       m->data_queues};
    int big = 0;
    for (int i = 1; i < 7; i++)
      if (parts[i] > parts[big]) big = i;
    char a[32], b[32], c[32];
    const char *hint = big == 3   ? " (reduce batch_size)"
                       : big == 6 ? " (reduce data_param.batch_size or prefetch)"
                       : big <= 2 ? " (a smaller model)"
                                  : "";
    return kiln_errorf(KILN_ERR_NOMEM,
                       "net '%s' (%s) needs %s but the memory limit is %s%s; the largest part is "
                       "%s: %s%s",
                       net->name, net->phase == CAFFE__PHASE__TRAIN ? "TRAIN" : "TEST",
                       human_bytes(m->total, a, sizeof a), human_bytes((int64_t)limit, b, sizeof b),
                       opt->max_memory ? " (--max-memory)"
                       : dev_limit     ? " (memory free on the GPU)"
                                       : " (memory available on this machine)",
                       names[big], human_bytes(parts[big], c, sizeof c), hint);
  }
  return KILN_OK;
}

float *kiln_net_alloc_floats(const kiln_net *net, int64_t n, bool huge) {
  const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
  if (kiln_device_is_host(net->device)) return huge ? kiln_alloc_huge(bytes) : kiln_alloc(bytes);
  void *p = NULL;
  if (kiln_device_alloc(net->device, bytes, &p)) return NULL;
  if (kiln_device_set(net->device, p, 0, bytes)) { /* zeroed, as the host's */
    kiln_device_free(net->device, p);
    return NULL;
  }
  return p;
}

void kiln_net_free_floats(const kiln_net *net, float *p) {
  if (kiln_device_is_host(net->device)) kiln_free(p);
  else kiln_device_free(net->device, p);
}

int kiln_net_allocate_and_fill(kiln_net *net) {
  net_internal *in = net->internal;
  /* first the shared data, which blobs and buffers point into as they are allocated */
  for (int k = 0; k < in->ndata_pool; k++) KILN_TRY(kiln_blob_alloc(in->data_pool[k]));
  int64_t total = 0;
  for (int k = 0; k < net->nlearnable; k++) {
    net->learnable_offset[k] = total;
    total += (net->learnable[k]->count + 15) & ~(int64_t)15; /* 64-byte aligned slots */
  }
  net->nparam_floats = total;
  /* huge pages: every step streams these, and MPI pins them for its single-copy transfers */
  net->param_data = kiln_net_alloc_floats(net, total, true);
  net->param_diff = kiln_net_alloc_floats(net, total, true);
  net->workspace = kiln_net_alloc_floats(net, net->workspace_floats, false);
  if (!net->param_data || !net->param_diff || !net->workspace)
    return kiln_errorf(KILN_ERR_NOMEM, "net '%s': cannot allocate parameters", net->name);
  for (int k = 0; k < net->nlearnable; k++)
    kiln_blob_set_view(net->learnable[k], net->param_data + net->learnable_offset[k],
                       net->param_diff + net->learnable_offset[k]);
  int slot = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    l->workspace = net->workspace;
    for (int p = 0; p < l->nparam; p++, slot++) {
      kiln_blob *o = in->param_owner_blob[slot];
      if (o == l->param[p]) {
        int rc = kiln_fill(o, l->param_filler[p], l->param_default_value[p], &net->rng);
        if (!rc && l->ops->init_param) rc = l->ops->init_param(l, p);
        if (rc) return kiln_error_context(rc, "layer '%s': ", l->name);
      } else {
        kiln_blob_set_view(l->param[p], o->data, o->diff);
      }
    }
    for (int b = 0; b < l->nbuffer; b++) KILN_TRY(kiln_blob_alloc(l->buffer[b]));
  }
  if (in->ndiff_pool) {
    in->diff_pool = calloc((size_t)in->ndiff_pool, sizeof(float *));
    if (!in->diff_pool) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    for (int k = 0; k < in->ndiff_pool; k++)
      if (!(in->diff_pool[k] = kiln_net_alloc_floats(net, in->diff_pool_floats[k], false)))
        return kiln_errorf(KILN_ERR_NOMEM, "net '%s': cannot allocate gradients", net->name);
  }
  for (int i = 0; i < net->nblobs; i++) {
    kiln_blob *b = net->blobs[i];
    int k = in->diff_slot ? in->diff_slot[i] : -1;
    if (net->forward_only) { /* no gradient is ever asked */
      b->no_diff = true;
      KILN_TRY(kiln_blob_alloc(b));
    } else if (k >= 0) {
      b->no_diff = true; /* data only; the diff is the pool's */
      KILN_TRY(kiln_blob_alloc(b));
      kiln_blob_borrow_diff(b, in->diff_pool[k], in->diff_pool_floats[k]);
    } else {
      KILN_TRY(kiln_blob_alloc(b));
    }
  }
  return KILN_OK;
}

char *kiln_net_describe(const kiln_net *net) {
  size_t cap = 4096 + (size_t)net->nlayers * 200, used = 0;
  char *s = malloc(cap);
  if (!s) return NULL;
#define OUT(...) used += (size_t)snprintf(s + used, used < cap ? cap - used : 0, __VA_ARGS__)
  OUT("%-24s %-16s %-20s %12s %12s\n", "layer", "type", "output", "params", "MFLOPs");
  int64_t total_params = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    char shape[96] = "-";
    if (l->ntop) kiln_blob_shape_string(l->top[0], shape, sizeof shape);
    int64_t np = 0;
    for (int p = 0; p < l->nparam; p++) np += l->param[p]->count;
    total_params += np;
    OUT("%-24.24s %-16.16s %-20.20s %12lld %12.2f\n", l->name, l->ops->type, shape, (long long)np,
        l->flops / 1e6);
  }
  const kiln_memory_plan *m = &net->memory;
  char a[32], b[32], c[32], d[32], e[32], f[32], g[32], t[32];
  OUT("total: %lld parameters, %.2f MFLOPs forward per pass\n", (long long)total_params,
      kiln_net_forward_flops(net) / 1e6);
  /* all of it on the net's device (every blob of a net is on one): named when not the host */
  if (!kiln_device_is_host(net->device)) OUT("memory on %s: ", net->device->name);
  else OUT("memory: ");
  OUT("%s = parameters %s + gradients %s + solver history %s + activations %s + buffers "
      "%s + workspace %s + prefetch %s\n",
      human_bytes(m->total, t, sizeof t), human_bytes(m->params, a, sizeof a),
      human_bytes(m->grads, b, sizeof b), human_bytes(m->history, c, sizeof c),
      human_bytes(m->activations, d, sizeof d), human_bytes(m->buffers, e, sizeof e),
      human_bytes(m->workspace, f, sizeof f), human_bytes(m->data_queues, g, sizeof g));
#undef OUT
  return s;
}
