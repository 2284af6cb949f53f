/* Layer lifecycle shared by the net and by standalone use (tests, tools): wiring bottoms and tops,
 * setup, reshape, parameter storage and filling, teardown. */
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "net_internal.h"


/* Fills `l` (zeroed by the caller) and checks the number of bottoms and tops. */
int kiln_layer_wire(kiln_layer *l, const Caffe__LayerParameter *lp, const kiln_layer_ops *ops,
                    const char *name, int phase, kiln_blob **bottoms, int nbottom,
                    kiln_blob **tops, int ntop) {
  l->ops = ops;
  l->lp = lp;
  l->name = name;
  l->phase = phase;
  l->nthreads = kiln_get_num_threads();
  l->config = kiln_config_defaults();
  if (nbottom < ops->min_bottoms || (ops->max_bottoms >= 0 && nbottom > ops->max_bottoms))
    return kiln_errorf(KILN_ERR_INVALID, "layer '%s' (%s): takes %d%s bottom(s), got %d", name,
                       ops->type, ops->min_bottoms,
                       ops->max_bottoms == ops->min_bottoms ? "" : " or more", nbottom);
  if (ntop < ops->min_tops || (ops->max_tops >= 0 && ntop > ops->max_tops))
    return kiln_errorf(KILN_ERR_INVALID, "layer '%s' (%s): takes %d to %d top(s), got %d", name,
                       ops->type, ops->min_tops, ops->max_tops, ntop);
  l->nbottom = nbottom;
  l->ntop = ntop;
  l->bottom = calloc((size_t)nbottom + 1, sizeof *l->bottom);
  l->top = calloc((size_t)ntop + 1, sizeof *l->top);
  l->propagate_down = calloc((size_t)nbottom + 1, sizeof *l->propagate_down);
  l->loss_weight = calloc((size_t)ntop + 1, sizeof *l->loss_weight);
  if (!l->bottom || !l->top || !l->propagate_down || !l->loss_weight)
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; i < nbottom; i++) l->bottom[i] = bottoms[i];
  for (int i = 0; i < ntop; i++) l->top[i] = tops[i];
  return KILN_OK;
}

int kiln_layer_choose_backend(kiln_layer *l) {
  const kiln_device *d = kiln_config_device(l->config);
  if (!d)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "layer '%s' (%s): no CUDA device %d (%s)", l->name,
                       l->ops->type, l->config->device_index, kiln_cuda_unavailable());
  const kiln_backend *b = NULL;
  int rc = kiln_backend_choose(l->config, kiln_device_is_host(d) ? NULL : d, &b);
  if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  if (!l->ops->kernels && !kiln_device_is_host(b->device))
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "layer '%s' (%s): no kernels for device %s (the layer's arithmetic is host "
                       "code)",
                       l->name, l->ops->type, d->name);
  for (const int *k = l->ops->kernels; k && *k != KILN_KERNELS_END; k++)
    if (!kiln_backend_has(b, *k))
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "layer '%s' (%s): backend %s has no kernel %s",
                         l->name, l->ops->type, b->name, kiln_op_name(*k));
  l->backend = b;
  return KILN_OK;
}

void kiln_layer_release(kiln_layer *l) {
  if (!l) return;
  if (l->ops && l->ops->destroy) l->ops->destroy(l);
  for (int i = 0; i < l->nparam; i++) kiln_blob_free(l->param[i]);
  for (int i = 0; i < l->nbuffer; i++) kiln_blob_free(l->buffer[i]);
  free(l->bottom);
  free(l->top);
  free(l->propagate_down);
  free(l->loss_weight);
}

typedef struct {
  kiln_layer layer;
  float *data, *diff, *workspace;
  kiln_config config;
} standalone_layer;

int kiln_layer_create(const Caffe__LayerParameter *lp, int phase, kiln_blob **bottoms, int nbottom,
                      kiln_blob **tops, int ntop, uint64_t seed, const kiln_config *cfg,
                      kiln_layer **out) {
  *out = NULL;
  const kiln_layer_ops *ops = kiln_layer_find(lp->type);
  if (!ops) return kiln_errorf(KILN_ERR_INVALID, "unknown layer type '%s'", lp->type ? lp->type : "");
  standalone_layer *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  kiln_layer *l = &s->layer;
  int rc = kiln_layer_wire(l, lp, ops, lp->name ? lp->name : lp->type, phase, bottoms, nbottom,
                           tops, ntop);
  s->config = cfg ? *cfg : *kiln_config_defaults();
  l->config = &s->config;
  if (!rc) rc = kiln_layer_choose_backend(l);
  kiln_rng *rng = calloc(1, sizeof *rng);
  l->rng = rng; /* owned by the layer from here, so every failure path frees it */
  if (!rc && !rng) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) {
    kiln_rng_seed(rng, seed, 0);
    l->seed = seed;
    for (int i = 0; i < nbottom; i++) l->propagate_down[i] = true;
    if (ops->is_loss) l->loss_weight[0] = lp->n_loss_weight ? lp->loss_weight[0] : 1.0f;
    if (ops->setup) rc = ops->setup(l);
  }
  if (!rc) rc = ops->reshape(l);
  int64_t total = 0;
  for (int i = 0; !rc && i < l->nparam; i++) total += l->param[i]->count;
  if (!rc) {
    s->data = kiln_alloc((size_t)total * sizeof(float));
    s->diff = kiln_alloc((size_t)total * sizeof(float));
    s->workspace = kiln_alloc((size_t)l->workspace_floats * sizeof(float));
    if (!s->data || !s->diff || !s->workspace) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  int64_t off = 0;
  /* A layer outside a net keeps its memory on the host whatever its backend's device: its
   * callers read and write it there (tests/support/device_mirror.c moves it for a pass). */
  for (int i = 0; !rc && i < l->nparam; i++) {
    l->param[i]->device = NULL;
    kiln_blob_set_view(l->param[i], s->data + off, s->diff + off);
    off += l->param[i]->count;
    rc = kiln_fill(l->param[i], l->param_filler[i], l->param_default_value[i], rng);
    if (!rc && ops->init_param) rc = ops->init_param(l, i);
  }
  for (int i = 0; !rc && i < l->nbuffer; i++) {
    l->buffer[i]->device = NULL;
    rc = kiln_blob_alloc(l->buffer[i]);
  }
  l->workspace = s->workspace;
  if (rc) {
    kiln_layer_free(l);
    return rc;
  }
  *out = l;
  return KILN_OK;
}

void kiln_layer_free(kiln_layer *l) {
  if (!l) return;
  standalone_layer *s = (standalone_layer *)l;
  kiln_rng *rng = l->rng;
  kiln_layer_release(l);
  free(rng);
  kiln_free(s->data);
  kiln_free(s->diff);
  kiln_free(s->workspace);
  free(s);
}
