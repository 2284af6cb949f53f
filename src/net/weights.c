/* .caffemodel files: a binary NetParameter whose layers carry their parameter blobs, matched by
 * layer name on load (Caffe's CopyTrainedLayersFrom), written atomically on save. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"

/* The net's parameters readable on the host: the flat buffer itself on the host, else a copy
 * made through the device table (*copy: to free). */
static int host_params(const kiln_net *net, float **host, float **copy) {
  *copy = NULL;
  *host = net->param_data;
  if (kiln_device_is_host(net->device)) return KILN_OK;
  const size_t bytes = sizeof(float) * (size_t)(net->nparam_floats > 0 ? net->nparam_floats : 1);
  if (!(*copy = malloc(bytes))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  *host = *copy;
  return kiln_device_to_host(net->device, *copy, net->param_data,
                             sizeof(float) * (size_t)net->nparam_floats);
}

/* Where a parameter's data lies in the host copy (the data itself on the host). Weights are
 * saved from and loaded into a net that owns its parameters (a solver's test nets, which share
 * the training net's, kiln_net_share_params, are neither). */
static float *in_host(const kiln_net *net, float *host, float *data) {
  if (host == net->param_data) return data;
  return host + (data - net->param_data);
}

int kiln_net_save_weights(const kiln_net *net, const char *path) {
  Caffe__NetParameter np = CAFFE__NET_PARAMETER__INIT;
  np.name = net->name;
  np.layer = calloc((size_t)net->nlayers + 1, sizeof *np.layer);
  Caffe__LayerParameter *lps = calloc((size_t)net->nlayers + 1, sizeof *lps);
  Caffe__BlobProto *bps = calloc((size_t)net->nlayers * KILN_MAX_LAYER_PARAMS + 1, sizeof *bps);
  Caffe__BlobProto **bpp = calloc((size_t)net->nlayers * KILN_MAX_LAYER_PARAMS + 1, sizeof *bpp);
  Caffe__BlobShape *shapes = calloc((size_t)net->nlayers * KILN_MAX_LAYER_PARAMS + 1, sizeof *shapes);
  float *host = NULL, *copy = NULL;
  int rc = KILN_OK;
  if (!np.layer || !lps || !bps || !bpp || !shapes) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    goto done;
  }
  if ((rc = host_params(net, &host, &copy))) goto done;
  int nb = 0;
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (l->ops->passes_through) continue; /* nothing to save (Split) */
    Caffe__LayerParameter *lp = &lps[np.n_layer];
    caffe__layer_parameter__init(lp);
    lp->name = (char *)l->name;
    lp->type = (char *)l->ops->type;
    lp->n_bottom = l->lp->n_bottom;
    lp->bottom = l->lp->bottom;
    lp->n_top = l->lp->n_top;
    lp->top = l->lp->top;
    lp->blobs = &bpp[nb];
    for (int p = 0; p < l->nparam; p++, nb++) {
      Caffe__BlobProto *bp = &bps[nb];
      caffe__blob_proto__init(bp);
      caffe__blob_shape__init(&shapes[nb]);
      shapes[nb].n_dim = (size_t)l->param[p]->naxes;
      shapes[nb].dim = (int64_t *)l->param[p]->shape;
      bp->shape = &shapes[nb];
      bp->n_data = (size_t)l->param[p]->count;
      bp->data = in_host(net, host, l->param[p]->data);
      bpp[nb] = bp;
      lp->n_blobs++;
    }
    np.layer[np.n_layer++] = lp;
  }
  rc = kiln_h5_path(path) ? kiln_h5_write_net(path, &np) : kiln_proto_write_binary(path, &np.base);
done:
  free(copy);
  free(np.layer);
  free(lps);
  free(bps);
  free(bpp);
  free(shapes);
  return rc;
}

/* The blob's shape as stored: `shape` or Caffe's legacy num/channels/height/width. */
static int stored_shape(const Caffe__BlobProto *bp, int64_t *shape) {
  if (bp->shape) {
    if (bp->shape->n_dim > KILN_MAX_AXES) return -1;
    for (size_t i = 0; i < bp->shape->n_dim; i++) shape[i] = bp->shape->dim[i];
    return (int)bp->shape->n_dim;
  }
  shape[0] = bp->num;
  shape[1] = bp->channels;
  shape[2] = bp->height;
  shape[3] = bp->width;
  return 4;
}

int kiln_net_load_weights(kiln_net *net, const char *path) {
  ProtobufCMessage *m;
  if (kiln_h5_path(path)) { /* Caffe's .caffemodel.h5 */
    Caffe__NetParameter *h5;
    KILN_TRY(kiln_h5_read_net(path, &h5));
    m = &h5->base;
  } else {
    KILN_TRY(kiln_proto_read_binary(path, &caffe__net_parameter__descriptor, &m));
  }
  Caffe__NetParameter *np = (Caffe__NetParameter *)m;
  float *host = NULL, *copy = NULL;
  int rc = kiln_net_param_upgrade(np, path, NULL), matched = 0; /* V0/V1 files of old Caffe */
  if (!rc) rc = host_params(net, &host, &copy);
  if (!rc && np->n_layer == 0)
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: holds no layers (%s)", path,
                     np->base.n_unknown_fields ? "not a .caffemodel?" : "an empty file?");
  for (size_t i = 0; i < np->n_layer && !rc; i++) {
    const Caffe__LayerParameter *src = np->layer[i];
    if (!src->name || src->n_blobs == 0) continue;
    kiln_layer *l = kiln_net_layer(net, src->name);
    if (!l) continue; /* Caffe ignores source layers the target net lacks */
    /* Two layers of one name would both load into the net's layer, the last silently winning. */
    for (size_t j = 0; j < i && !rc; j++)
      if (np->layer[j]->name && np->layer[j]->n_blobs && !strcmp(np->layer[j]->name, src->name))
        rc = kiln_errorf(KILN_ERR_INVALID,
                         "%s: layer '%s' appears twice in the file (layers %zu and %zu): which "
                         "weights to load is ambiguous", path, src->name, j + 1, i + 1);
    if (rc) break;
    if ((int)src->n_blobs != l->nparam) {
      rc = kiln_errorf(KILN_ERR_SHAPE, "%s: layer '%s' has %zu blobs in the file, %d in the net",
                       path, src->name, src->n_blobs, l->nparam);
      break;
    }
    for (int p = 0; p < l->nparam && !rc; p++) {
      const Caffe__BlobProto *bp = src->blobs[p];
      kiln_blob *b = l->param[p];
      int64_t shape[KILN_MAX_AXES];
      int n = stored_shape(bp, shape);
      if (n < 0) {
        rc = kiln_errorf(KILN_ERR_SHAPE, "%s: layer '%s' blob %d has a shape of too many axes "
                         "(%zu; at most %d)", path, src->name, p, bp->shape->n_dim, KILN_MAX_AXES);
        break;
      }
      int64_t count = 1;
      int negative = -1; /* the first axis of a negative size */
      bool fits = true;
      for (int a = 0; a < n && fits && negative < 0; a++) {
        if (shape[a] < 0) negative = a;
        else fits = !__builtin_mul_overflow(count, shape[a], &count);
      }
      if (negative >= 0) {
        rc = kiln_errorf(KILN_ERR_SHAPE, "%s: layer '%s' blob %d has a negative dimension %lld "
                         "(axis %d)", path, src->name, p, (long long)shape[negative], negative);
        break;
      }
      if (!fits) {
        rc = kiln_errorf(KILN_ERR_SHAPE, "%s: layer '%s' blob %d has a shape of more elements "
                         "than fit 64 bits", path, src->name, p);
        break;
      }
      bool same = n == b->naxes;
      for (int a = 0; same && a < n; a++) same = shape[a] == b->shape[a];
      /* Legacy 4-d shapes pad with leading 1s (a bias stored as 1x1x1xN). */
      if (!same && !bp->shape && count == b->count) same = true;
      size_t have = bp->n_data ? bp->n_data : bp->n_double_data;
      if (!same || (int64_t)have != b->count) {
        char s1[128];
        rc = kiln_errorf(KILN_ERR_SHAPE,
                         "%s: layer '%s' blob %d holds %zu values (%lld in its shape), the net "
                         "expects %s",
                         path, src->name, p, have, (long long)count,
                         kiln_blob_shape_string(b, s1, sizeof s1));
        break;
      }
      /* A NaN or an infinity would only show later, as a diverged loss that names no file. */
      for (int64_t k = 0; k < b->count; k++) {
        const float v = bp->n_data ? bp->data[k] : (float)bp->double_data[k];
        if (!isfinite(v)) {
          rc = kiln_errorf(KILN_ERR_NUMERIC, "%s: layer '%s' blob %d value %lld is %g; weights "
                           "must be finite numbers", path, src->name, p, (long long)k, (double)v);
          break;
        }
      }
      if (rc) break;
      float *to = in_host(net, host, b->data);
      if (bp->n_data) memcpy(to, bp->data, sizeof(float) * (size_t)b->count);
      else
        for (int64_t k = 0; k < b->count; k++) to[k] = (float)bp->double_data[k];
    }
    matched++;
  }
  protobuf_c_message_free_unpacked(m, NULL);
  if (!rc && copy) /* the values loaded, to the device */
    rc = kiln_device_to_device(net->device, net->param_data, copy,
                               sizeof(float) * (size_t)net->nparam_floats);
  free(copy);
  /* Layers the net lacks are skipped, as Caffe skips them when fine-tuning; but a file of which
   * nothing matches is a wrong file, not a start from those weights. */
  if (!rc && matched == 0 && net->nlearnable > 0)
    rc = kiln_errorf(KILN_ERR_INVALID,
                     "%s: no layer of the file matches a layer with parameters of the net '%s' "
                     "by name; weights unchanged",
                     path, net->name);
  return rc;
}
