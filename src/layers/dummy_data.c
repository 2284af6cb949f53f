/* DummyData: tops of fixed shapes filled by Caffe's fillers, for tests and benchmarks (Caffe's
 * DummyDataLayer). dummy_data_param gives the shapes (`shape` once or once per top, or the legacy
 * num/channels/height/width, each once or once per top) and the fillers (none: constant 0; one for
 * every top; or one per top). Tops with a constant filler are filled once, on the first forward
 * pass (the net allocates tops after setup), and never again; the others are refilled on every
 * forward pass from the net's generator. */
#include <stdlib.h>
#include <string.h>

#include "layer_util.h"

static const Caffe__DummyDataParameter dummy_defaults = CAFFE__DUMMY_DATA_PARAMETER__INIT;

typedef struct {
  bool filled_once;
} dummy_state;

static const Caffe__DummyDataParameter *dummy_param(const kiln_layer *l) {
  return KILN_PARAM_OR(l->lp->dummy_data_param, dummy_defaults);
}

/* The filler of top t (NULL: constant 0). */
static const Caffe__FillerParameter *top_filler(const Caffe__DummyDataParameter *p, int t) {
  if (p->n_data_filler == 0) return NULL;
  return p->data_filler[p->n_data_filler == 1 ? 0 : t];
}

static bool is_constant(const Caffe__FillerParameter *f) {
  return !f || !f->type || strcmp(f->type, "constant") == 0;
}

static int check_count(kiln_layer *l, const char *field, size_t n) {
  if (n != 1 && (int)n != l->ntop)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "dummy_data_param needs '%s' once or once per top (%d tops), got %zu",
                            field, l->ntop, n);
  return KILN_OK;
}

static int dummy_setup(kiln_layer *l) {
  const Caffe__DummyDataParameter *p = dummy_param(l);
  if (p->n_data_filler > 1 && (int)p->n_data_filler != l->ntop)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "dummy_data_param needs 0 or 1 data_filler, or one per top (%d tops), "
                            "got %zu",
                            l->ntop, p->n_data_filler);
  bool legacy = p->n_num || p->n_channels || p->n_height || p->n_width;
  if (legacy) {
    if (p->n_shape)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "dummy_data_param gives both 'shape' and the legacy "
                              "num/channels/height/width");
    KILN_TRY(check_count(l, "num", p->n_num));
    KILN_TRY(check_count(l, "channels", p->n_channels));
    KILN_TRY(check_count(l, "height", p->n_height));
    KILN_TRY(check_count(l, "width", p->n_width));
  } else {
    KILN_TRY(check_count(l, "shape", p->n_shape));
    for (size_t i = 0; i < p->n_shape; i++)
      if (p->shape[i]->n_dim > KILN_MAX_AXES)
        return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "shape %zu has %zu axes (at most %d)", i,
                                p->shape[i]->n_dim, KILN_MAX_AXES);
  }
  /* Try each filler on one value now, so a bad filler fails here rather than on the first
   * forward pass; a private generator keeps the net's stream untouched. */
  kiln_blob *probe = kiln_blob_new("probe");
  if (!probe || kiln_blob_reshape(probe, 1, (const int64_t[]){1}) != KILN_OK) {
    kiln_blob_free(probe);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  kiln_rng rng;
  kiln_rng_seed(&rng, 1, 0);
  int rc = KILN_OK;
  for (size_t i = 0; rc == KILN_OK && i < p->n_data_filler; i++) {
    rc = kiln_fill(probe, p->data_filler[i], 0.0f, &rng);
    if (rc)
      rc = kiln_error_context(rc, "layer '%s' (%s): data_filler %zu: ", l->name, l->ops->type, i);
  }
  kiln_blob_free(probe);
  KILN_TRY(rc);
  dummy_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  return KILN_OK;
}

static int dummy_reshape(kiln_layer *l) {
  const Caffe__DummyDataParameter *p = dummy_param(l);
  for (int t = 0; t < l->ntop; t++) {
    int64_t shape[KILN_MAX_AXES];
    int naxes;
    if (p->n_num) {
      size_t i = (size_t)t;
      shape[0] = p->num[p->n_num == 1 ? 0 : i];
      shape[1] = p->channels[p->n_channels == 1 ? 0 : i];
      shape[2] = p->height[p->n_height == 1 ? 0 : i];
      shape[3] = p->width[p->n_width == 1 ? 0 : i];
      naxes = 4;
    } else {
      const Caffe__BlobShape *bs = p->shape[p->n_shape == 1 ? 0 : t];
      naxes = (int)bs->n_dim;
      for (int a = 0; a < naxes; a++) {
        if (bs->dim[a] < 0)
          return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "shape for top %d has a negative dim %lld",
                                  t, (long long)bs->dim[a]);
        shape[a] = bs->dim[a];
      }
    }
    int rc = kiln_blob_reshape(l->top[t], naxes, shape);
    if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  }
  return KILN_OK;
}

static int dummy_forward(kiln_layer *l) {
  const Caffe__DummyDataParameter *p = dummy_param(l);
  dummy_state *s = l->priv;
  for (int t = 0; t < l->ntop; t++) {
    const Caffe__FillerParameter *f = top_filler(p, t);
    if (s->filled_once && is_constant(f)) continue;
    int rc = kiln_fill(l->top[t], f, 0.0f, l->rng);
    if (rc) return kiln_error_context(rc, "layer '%s' (%s): top %d: ", l->name, l->ops->type, t);
  }
  s->filled_once = true;
  return KILN_OK;
}

static void dummy_destroy(kiln_layer *l) { free(l->priv); }

const kiln_layer_ops kiln_layer_dummy_data = {
    .type = "DummyData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = -1,
    .is_data = true, .setup = dummy_setup, .reshape = dummy_reshape, .forward = dummy_forward,
    .destroy = dummy_destroy,
    .kernels = KILN_NO_KERNELS, /* its values are drawn on the host (kiln_fill) and handed over */
};
