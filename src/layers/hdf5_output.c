/* HDF5Output: writes its two bottoms to `hdf5_output_param.file_name` as the float datasets
 * "data" and "label" (Caffe's HDF5Output), in Caffe's shapes: (num, channels, height, width),
 * the axes a bottom lacks counted as 1 (a bottom of more than 4 axes, which Caffe refuses, keeps
 * its own shape).
 *
 * Caffe creates the file at set-up and writes the datasets in forward, into the same open file
 * every time, so its second forward fails (the datasets exist: BVLC/caffe#1726) and a run that
 * stops leaves a half-written file. kiln keeps the records of every forward since the layer was
 * set up and, after each forward, writes the file anew with all of them, in order: made in
 * memory, then written through a temporary name and a rename, so the name always holds a whole
 * file of every record so far, never a partial one. Each forward rewrites what came before: the
 * layer is for a test pass's outputs (`kiln test --iterations N`), not for a training's stream.
 * No gradient flows back through it (Caffe's backward does nothing; it has no tops, so no loss
 * depends on it). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/data.h"
#include "kiln/device.h"
#include "layer_util.h"

typedef struct {
  char *path;
  kiln_h5data_shape shape[2]; /* dims[0]: the records so far; the rest, a record's */
  float *rows[2];             /* the records so far */
  uint64_t cap;               /* records there is room for */
} out_state;

static const char *const dataset_names[2] = {"data", "label"};

/* The record shape Caffe writes for bottom b: its axes after the first, to 4 in all. */
static void record_shape(const kiln_blob *b, kiln_h5data_shape *s) {
  s->naxes = b->naxes > 4 ? b->naxes : 4;
  for (int i = 1; i < s->naxes; i++) s->dims[i] = i < b->naxes ? b->shape[i] : 1;
}

static int hdf5_output_setup(kiln_layer *l) {
  const Caffe__HDF5OutputParameter *p = l->lp->hdf5_output_param;
  out_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  if (!p || !p->file_name || !p->file_name[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "hdf5_output_param.file_name is required");
  if (!(s->path = strdup(p->file_name))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  /* Caffe creates the file here; kiln writes it after the first forward, but a folder that is
   * not there is better said now than after a test pass's work. */
  char *dir = strdup(s->path);
  if (!dir) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  char *slash = strrchr(dir, '/');
  if (slash) slash[slash == dir] = '\0'; /* "a/b.h5": "a"; "/b.h5": "/" */
  struct stat st;
  const bool ok = !slash || (stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
  free(dir);
  if (!ok)
    return KILN_LAYER_ERROR(l, KILN_ERR_IO, "hdf5_output_param.file_name %s: its folder does not "
                            "exist", s->path);
  /* the file is replaced at each forward: a device, FIFO or folder under the name is refused
   * now (each write checks again) */
  int rc = kiln_check_output(s->path, KILN_OUTPUT_RENAMED, NULL, 0);
  return rc ? kiln_error_context(rc, "layer '%s' (HDF5Output): hdf5_output_param.file_name ",
                                 l->name)
            : KILN_OK;
}

static int hdf5_output_reshape(kiln_layer *l) {
  if (l->bottom[0]->naxes < 1 || l->bottom[1]->naxes < 1 ||
      l->bottom[0]->shape[0] != l->bottom[1]->shape[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "bottoms '%s' and '%s' hold %lld and %lld records "
                            "(their first axes): one label row per data row",
                            l->bottom[0]->name, l->bottom[1]->name,
                            (long long)(l->bottom[0]->naxes ? l->bottom[0]->shape[0] : 1),
                            (long long)(l->bottom[1]->naxes ? l->bottom[1]->shape[0] : 1));
  return KILN_OK;
}

static int hdf5_output_forward(kiln_layer *l) {
  out_state *s = l->priv;
  KILN_TRY(hdf5_output_reshape(l));
  const uint64_t n = (uint64_t)l->bottom[0]->shape[0], had = s->shape[0].dims[0];
  for (int t = 0; t < 2; t++) {
    kiln_h5data_shape now;
    record_shape(l->bottom[t], &now);
    if (!had) {
      s->shape[t] = now;
      continue;
    }
    bool same = now.naxes == s->shape[t].naxes;
    for (int i = 1; same && i < now.naxes; i++) same = now.dims[i] == s->shape[t].dims[i];
    if (!same)
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "bottom '%s' changed its record shape since the "
                              "records already written to %s", l->bottom[t]->name, s->path);
  }
  if (had + n > s->cap) {
    uint64_t cap = s->cap ? 2 * s->cap : n;
    if (cap < had + n) cap = had + n;
    for (int t = 0; t < 2; t++) {
      const uint64_t per = (uint64_t)kiln_h5data_record_size(&s->shape[t]);
      float *r = realloc(s->rows[t], sizeof(float) * (size_t)(cap * per));
      if (!r)
        return KILN_LAYER_ERROR(l, KILN_ERR_NOMEM, "out of memory for %llu records for %s",
                                (unsigned long long)cap, s->path);
      s->rows[t] = r;
    }
    s->cap = cap;
  }
  for (int t = 0; t < 2; t++) {
    const uint64_t per = (uint64_t)kiln_h5data_record_size(&s->shape[t]);
    KILN_TRY(kiln_device_to_host(l->bottom[t]->device, s->rows[t] + had * per,
                                 l->bottom[t]->data, sizeof(float) * (size_t)(n * per)));
  }
  s->shape[0].dims[0] = s->shape[1].dims[0] = (int64_t)(had + n);
  const float *const data[2] = {s->rows[0], s->rows[1]};
  int rc = kiln_h5data_write(s->path, 2, dataset_names, s->shape, data);
  return rc ? kiln_error_context(rc, "layer '%s' (HDF5Output): ", l->name) : KILN_OK;
}

static void hdf5_output_destroy(kiln_layer *l) {
  out_state *s = l->priv;
  if (!s) return;
  free(s->path);
  free(s->rows[0]);
  free(s->rows[1]);
  free(s);
}

const kiln_layer_ops kiln_layer_hdf5_output = {
    .type = "HDF5Output", .min_bottoms = 2, .max_bottoms = 2, .min_tops = 0, .max_tops = 0,
    .setup = hdf5_output_setup, .reshape = hdf5_output_reshape, .forward = hdf5_output_forward,
    .destroy = hdf5_output_destroy, .kernels = KILN_NO_KERNELS,
};
