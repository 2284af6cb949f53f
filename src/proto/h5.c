/* Caffe's HDF5 snapshots (`snapshot_format: HDF5`), through Debian's libhdf5, in Caffe's layout:
 *   .caffemodel.h5: a group "data" with a group per layer, named as the layer, holding the
 *     layer's parameter blobs as float datasets "0", "1", ... shaped as the blobs;
 *   .solverstate.h5: int datasets "iter" and "current_step" (one element each), a string dataset
 *     "learned_net", and a group "history" of float datasets "0", "1", ...; kiln's own state for
 *     an exact resume (data cursors, generators, the loss window) in a group "kiln", which Caffe
 *     never opens.
 * Files are read into memory first (regular files only, as every reader of kiln's) and opened as
 * HDF5 file images, and written as an image that goes to disk through a temporary name and a
 * rename, so that no half-written file ever carries the final name. The messages read back are
 * the same as the binary formats' (NetParameter, SolverState), so one restore path serves both.
 * libhdf5 prints its own error stack unless told not to: every entry point silences it. */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include "kiln/proto.h"

/* The most parameter blobs of one layer, and of history, read back. */
#define H5_MAX_BLOBS (1 << 20)

static void quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* Held by every thread of kiln's that calls libhdf5 in this process (the writers here and in
 * src/data/h5data.c) and by a thread that forks a reader, across the fork: a child forked while
 * another thread is inside libhdf5 would inherit libhdf5's own lock held, by a thread the child
 * does not have, and hang at its first call. The HDF5 data reader forks its reader server while
 * other threads may be writing. */
static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;

void kiln_h5_lock(void) { pthread_mutex_lock(&h5_lock); }
void kiln_h5_unlock(void) { pthread_mutex_unlock(&h5_lock); }

bool kiln_h5_path(const char *path) {
  size_t n = path ? strlen(path) : 0;
  return n >= 3 && !strcmp(path + n - 3, ".h5");
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct {
  const char *path;
  hid_t file;
  int rc;
} writer;

static void fail_w(writer *w, const char *what, const char *name) {
  if (!w->rc)
    w->rc = kiln_errorf(KILN_ERR_IO, "%s: cannot write %s%s%s (HDF5)", w->path, what,
                        name ? " " : "", name ? name : "");
}

static hid_t new_group(writer *w, hid_t parent, const char *name) {
  if (w->rc) return -1;
  hid_t g = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) fail_w(w, "group", name);
  return g;
}

static void put_dataset(writer *w, hid_t at, const char *name, hid_t type, int rank,
                        const hsize_t *dims, const void *data) {
  if (w->rc) return;
  hid_t space = rank ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
  hid_t d = space < 0 ? -1 : H5Dcreate2(at, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (d < 0 || H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) fail_w(w, "dataset", name);
  if (d >= 0) H5Dclose(d);
  if (space >= 0) H5Sclose(space);
}

static void put_int(writer *w, hid_t at, const char *name, int32_t v) {
  hsize_t one = 1;
  put_dataset(w, at, name, H5T_NATIVE_INT32, 1, &one, &v);
}

static void put_string(writer *w, hid_t at, const char *name, const char *s) {
  if (w->rc) return;
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0 || H5Tset_size(t, strlen(s) + 1) < 0) {
    fail_w(w, "string", name);
  } else {
    put_dataset(w, at, name, t, 0, NULL, s);
  }
  if (t >= 0) H5Tclose(t);
}

/* A blob as a float dataset of its shape (legacy num/channels/height/width when it has no
 * shape). */
static void put_blob(writer *w, hid_t at, const char *name, const Caffe__BlobProto *b) {
  hsize_t dims[32];
  int rank = 0;
  if (b->shape) {
    if (b->shape->n_dim > 32) return fail_w(w, "blob of more than 32 axes", name);
    for (size_t i = 0; i < b->shape->n_dim; i++) dims[rank++] = (hsize_t)b->shape->dim[i];
  } else {
    int32_t legacy[4] = {b->num, b->channels, b->height, b->width};
    for (int i = 0; i < 4; i++) dims[rank++] = (hsize_t)(legacy[i] > 0 ? legacy[i] : 1);
  }
  hsize_t count = 1;
  for (int i = 0; i < rank; i++) count *= dims[i];
  if (count != b->n_data) return fail_w(w, "blob whose data does not fill its shape", name);
  if (rank == 0) {
    dims[0] = 1;
    rank = 1;
  }
  put_dataset(w, at, name, H5T_NATIVE_FLOAT, rank, dims, b->data ? (const void *)b->data : "");
}

/* Takes the lock (kiln_h5_lock), which finish() gives back; on failure it is given back here. */
static int begin(writer *w, const char *path) {
  kiln_h5_lock();
  quiet();
  w->path = path;
  w->rc = KILN_OK;
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 || H5Pset_fapl_core(fapl, 1 << 20, 0) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    kiln_h5_unlock();
    return kiln_errorf(KILN_ERR_IO, "%s: cannot set up an HDF5 file in memory", path);
  }
  w->file = H5Fcreate("kiln-image.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (w->file < 0) {
    kiln_h5_unlock();
    return kiln_errorf(KILN_ERR_IO, "%s: cannot create an HDF5 file in memory", path);
  }
  return KILN_OK;
}

/* The image to disk, whole under its final name or not at all. */
static int finish(writer *w) {
  int rc = w->rc;
  ssize_t size = rc ? -1 : (H5Fflush(w->file, H5F_SCOPE_GLOBAL) < 0 ? -1 : H5Fget_file_image(w->file, NULL, 0));
  void *image = size > 0 ? malloc((size_t)size) : NULL;
  if (!rc && (!image || H5Fget_file_image(w->file, image, (size_t)size) != size))
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot take the HDF5 file's image (%zd bytes)", w->path, size);
  H5Fclose(w->file);
  kiln_h5_unlock();
  if (!rc) rc = kiln_write_file_atomic(w->path, image, (size_t)size);
  free(image);
  return rc;
}

int kiln_h5_write_net(const char *path, const Caffe__NetParameter *np) {
  writer w;
  KILN_TRY(begin(&w, path));
  hid_t data = new_group(&w, w.file, "data");
  for (size_t i = 0; i < np->n_layer && !w.rc; i++) {
    const Caffe__LayerParameter *l = np->layer[i];
    if (!l->name || !l->name[0]) continue;
    if (H5Lexists(data, l->name, H5P_DEFAULT) > 0) {
      w.rc = kiln_errorf(KILN_ERR_INVALID, "%s: two layers named '%s'", path, l->name);
      break;
    }
    hid_t g = new_group(&w, data, l->name);
    for (size_t j = 0; j < l->n_blobs && !w.rc; j++) {
      char name[24];
      snprintf(name, sizeof name, "%zu", j);
      put_blob(&w, g, name, l->blobs[j]);
    }
    if (g >= 0) H5Gclose(g);
  }
  if (data >= 0) H5Gclose(data);
  return finish(&w);
}

int kiln_h5_write_state(const char *path, const Caffe__SolverState *st) {
  writer w;
  KILN_TRY(begin(&w, path));
  put_int(&w, w.file, "iter", st->iter);
  put_string(&w, w.file, "learned_net", st->learned_net ? st->learned_net : "");
  put_int(&w, w.file, "current_step", st->current_step);
  hid_t h = new_group(&w, w.file, "history");
  for (size_t j = 0; j < st->n_history && !w.rc; j++) {
    char name[24];
    snprintf(name, sizeof name, "%zu", j);
    put_blob(&w, h, name, st->history[j]);
  }
  if (h >= 0) H5Gclose(h);
  /* kiln's fields, by their names in SolverState */
  hid_t k = new_group(&w, w.file, "kiln");
  hsize_t n;
  if ((n = st->n_kiln_data_cursor))
    put_dataset(&w, k, "kiln_data_cursor", H5T_NATIVE_UINT64, 1, &n, st->kiln_data_cursor);
  if ((n = st->n_kiln_test_data_cursor))
    put_dataset(&w, k, "kiln_test_data_cursor", H5T_NATIVE_UINT64, 1, &n, st->kiln_test_data_cursor);
  if (st->has_kiln_rng_state && (n = st->kiln_rng_state.len))
    put_dataset(&w, k, "kiln_rng_state", H5T_NATIVE_UINT8, 1, &n, st->kiln_rng_state.data);
  if ((n = st->n_kiln_loss_history))
    put_dataset(&w, k, "kiln_loss_history", H5T_NATIVE_FLOAT, 1, &n, st->kiln_loss_history);
  if (st->n_kiln_worker_rng_state) {
    size_t each = st->kiln_worker_rng_state[0].len;
    uint8_t *all = malloc(each * st->n_kiln_worker_rng_state + 1);
    bool same = all != NULL;
    for (size_t r = 0; same && r < st->n_kiln_worker_rng_state; r++) {
      same = st->kiln_worker_rng_state[r].len == each;
      if (same) memcpy(all + r * each, st->kiln_worker_rng_state[r].data, each);
    }
    hsize_t dims[2] = {st->n_kiln_worker_rng_state, each};
    if (!same) fail_w(&w, "workers' generator states of unequal sizes", NULL);
    else put_dataset(&w, k, "kiln_worker_rng_state", H5T_NATIVE_UINT8, 2, dims, all);
    free(all);
  }
  if (st->has_kiln_workers) put_int(&w, k, "kiln_workers", st->kiln_workers);
  if (st->has_kiln_first_loss) {
    hsize_t one = 1;
    put_dataset(&w, k, "kiln_first_loss", H5T_NATIVE_FLOAT, 1, &one, &st->kiln_first_loss);
  }
  if (st->has_kiln_divergence_run) put_int(&w, k, "kiln_divergence_run", st->kiln_divergence_run);
  if (k >= 0) H5Gclose(k);
  return finish(&w);
}

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct {
  const char *path;
  char *bytes;
  size_t len; /* of the file image */
  hid_t file;
} reader;

/* A dataset may claim more elements than its file could hold (compression aside): what is read
 * is at most this many times the file's size (plus 1 MiB), so that a small damaged file cannot
 * ask for gigabytes. Caffe writes its datasets uncompressed, at a ratio of 1. */
#define H5_MAX_EXPANSION 64

/* Opens an HDF5 file image of `len` bytes (the reader keeps `bytes`, NULL: the caller does). */
static int open_bytes(reader *r, const char *path, const void *image, size_t len, char *owned) {
  quiet();
  r->path = path;
  r->bytes = owned;
  r->len = len;
  r->file = -1;
  if (len < 8 || memcmp(image, "\x89HDF\r\n\x1a\n", 8) != 0) {
    free(r->bytes);
    return kiln_errorf(KILN_ERR_PARSE, "%s: not an HDF5 file (no HDF5 signature at its start)", path);
  }
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  int ok = fapl >= 0 && H5Pset_fapl_core(fapl, 1 << 20, 0) >= 0 &&
           H5Pset_file_image(fapl, (void *)image, len) >= 0; /* libhdf5 takes a copy */
  if (ok) r->file = H5Fopen("kiln-image.h5", H5F_ACC_RDONLY, fapl);
  if (fapl >= 0) H5Pclose(fapl);
  if (r->file < 0) {
    free(r->bytes);
    return kiln_errorf(KILN_ERR_PARSE, "%s: not a readable HDF5 file (corrupt or truncated)", path);
  }
  return KILN_OK;
}

static void close_image(reader *r) {
  if (r->file >= 0) H5Fclose(r->file);
  free(r->bytes);
}

/* Dataset `name` of `at`: its element count (and rank, dims), or an error naming it. */
static int dataset_shape(const reader *r, hid_t at, const char *name, int *rank, hsize_t *dims,
                         hsize_t *count) {
  hid_t d = H5Dopen2(at, name, H5P_DEFAULT);
  hid_t s = d < 0 ? -1 : H5Dget_space(d);
  int n = s < 0 ? -1 : H5Sget_simple_extent_ndims(s);
  if (n < 0 || n > 32 || H5Sget_simple_extent_dims(s, dims, NULL) < 0) {
    if (s >= 0) H5Sclose(s);
    if (d >= 0) H5Dclose(d);
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' is missing or not a simple array", r->path, name);
  }
  *rank = n;
  *count = 1;
  for (int i = 0; i < n; i++) *count *= dims[i];
  H5Sclose(s);
  H5Dclose(d);
  return KILN_OK;
}

/* Reads a whole dataset converted to `type`, `elem` bytes each, into a new array. */
static int read_all(const reader *r, hid_t at, const char *name, hid_t type, size_t elem,
                    hsize_t max_count, void **out, hsize_t *count, int *rank, hsize_t *dims) {
  *out = NULL;
  hsize_t dd[32];
  int rr;
  if (!dims) dims = dd;
  if (!rank) rank = &rr;
  KILN_TRY(dataset_shape(r, at, name, rank, dims, count));
  if (*count > max_count)
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' has %llu elements, more than %llu", r->path,
                       name, (unsigned long long)*count, (unsigned long long)max_count);
  if ((double)*count * (double)elem > (double)r->len * H5_MAX_EXPANSION + (1 << 20))
    return kiln_errorf(KILN_ERR_PARSE,
                       "%s: dataset '%s' claims %llu elements, more than a file of %zu bytes holds",
                       r->path, name, (unsigned long long)*count, r->len);
  void *buf = malloc(*count ? (size_t)*count * elem : 1);
  if (!buf) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for dataset '%s'", r->path, name);
  hid_t d = H5Dopen2(at, name, H5P_DEFAULT);
  /* Numbers of at most 8 bytes, as Caffe and kiln write them: libhdf5 converts through a
   * buffer sized by the file's element size, which a damaged file may declare in gigabytes. */
  hid_t ft = d < 0 ? -1 : H5Dget_type(d);
  H5T_class_t cls = ft < 0 ? H5T_NO_CLASS : H5Tget_class(ft);
  size_t fsize = ft < 0 ? 0 : H5Tget_size(ft);
  if (ft >= 0) H5Tclose(ft);
  /* A contiguous dataset's bytes must lie inside the file: libhdf5 copies from where the file
   * says they are without checking it against the file's end. */
  haddr_t at_byte = d < 0 ? HADDR_UNDEF : H5Dget_offset(d);
  bool outside = at_byte != HADDR_UNDEF &&
                 ((double)at_byte + (double)*count * (double)fsize > (double)r->len);
  /* Nor may a compact or contiguous dataset hold fewer bytes than its shape needs. */
  hid_t plist = d < 0 ? -1 : H5Dget_create_plist(d);
  H5D_layout_t layout = plist < 0 ? H5D_LAYOUT_ERROR : H5Pget_layout(plist);
  if (plist >= 0) H5Pclose(plist);
  if (d >= 0 && layout != H5D_CHUNKED &&
      (layout == H5D_LAYOUT_ERROR || (double)H5Dget_storage_size(d) < (double)*count * (double)fsize))
    outside = true;
  if (d >= 0 && outside) {
    H5Dclose(d);
    free(buf);
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' lies past the end of the file", r->path, name);
  }
  if (d >= 0 && ((cls != H5T_INTEGER && cls != H5T_FLOAT) || fsize == 0 || fsize > 8)) {
    H5Dclose(d);
    free(buf);
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' does not hold numbers (class %d, %zu bytes each)",
                       r->path, name, (int)cls, fsize);
  }
  if (d < 0 || (*count && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)) {
    if (d >= 0) H5Dclose(d);
    free(buf);
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' cannot be read as numbers of this kind",
                       r->path, name);
  }
  H5Dclose(d);
  *out = buf;
  return KILN_OK;
}

static int read_int(const reader *r, hid_t at, const char *name, int32_t *v) {
  void *p;
  hsize_t n;
  KILN_TRY(read_all(r, at, name, H5T_NATIVE_INT32, 4, 1, &p, &n, NULL, NULL));
  if (n != 1) {
    free(p);
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' holds %llu values, not one", r->path, name,
                       (unsigned long long)n);
  }
  *v = *(int32_t *)p;
  free(p);
  return KILN_OK;
}

/* A float dataset as a BlobProto with its shape. */
static int read_blob(const reader *r, hid_t at, const char *name, Caffe__BlobProto **out) {
  *out = NULL;
  void *data;
  hsize_t n, dims[32];
  int rank;
  KILN_TRY(read_all(r, at, name, H5T_NATIVE_FLOAT, sizeof(float), (hsize_t)INT32_MAX, &data, &n,
                    &rank, dims));
  Caffe__BlobProto *b = malloc(sizeof *b);
  Caffe__BlobShape *s = malloc(sizeof *s);
  int64_t *d = malloc(sizeof *d * (size_t)(rank ? rank : 1));
  if (!b || !s || !d) {
    free(b), free(s), free(d), free(data);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", r->path);
  }
  caffe__blob_proto__init(b);
  caffe__blob_shape__init(s);
  for (int i = 0; i < rank; i++) d[i] = (int64_t)dims[i];
  s->n_dim = (size_t)rank;
  s->dim = d;
  b->shape = s;
  b->n_data = (size_t)n;
  b->data = data;
  *out = b;
  return KILN_OK;
}

/* The names "0", "1", ... of group `g`, in that order, as Caffe writes them: their count. */
static int numbered_count(const reader *r, hid_t g, const char *what, size_t *count) {
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0)
    return kiln_errorf(KILN_ERR_PARSE, "%s: group %s cannot be read", r->path, what);
  if (info.nlinks > H5_MAX_BLOBS)
    return kiln_errorf(KILN_ERR_PARSE, "%s: group %s has %llu members", r->path, what,
                       (unsigned long long)info.nlinks);
  for (hsize_t i = 0; i < info.nlinks; i++) {
    char name[24];
    snprintf(name, sizeof name, "%llu", (unsigned long long)i);
    if (H5Lexists(g, name, H5P_DEFAULT) <= 0)
      return kiln_errorf(KILN_ERR_PARSE, "%s: group %s has %llu members but no '%s' (Caffe numbers "
                         "them 0, 1, ...)", r->path, what, (unsigned long long)info.nlinks, name);
  }
  *count = (size_t)info.nlinks;
  return KILN_OK;
}

static int read_blobs(const reader *r, hid_t g, const char *what, Caffe__BlobProto ***out,
                      size_t *n) {
  KILN_TRY(numbered_count(r, g, what, n));
  *out = calloc(*n ? *n : 1, sizeof **out);
  if (!*out) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", r->path);
  for (size_t j = 0; j < *n; j++) {
    char name[24];
    snprintf(name, sizeof name, "%zu", j);
    int rc = read_blob(r, g, name, &(*out)[j]);
    if (rc) {
      *n = j; /* the caller frees what was read */
      return kiln_error_context(rc, "group %s: ", what);
    }
  }
  return KILN_OK;
}

typedef struct {
  const reader *r;
  Caffe__NetParameter *np;
  size_t cap;
  int rc;
} net_walk;

static herr_t take_layer(hid_t data, const char *name, const H5L_info_t *info, void *user) {
  (void)info;
  net_walk *w = user;
  if (w->np->n_layer == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 64;
    Caffe__LayerParameter **l = realloc(w->np->layer, cap * sizeof *l);
    if (!l) {
      w->rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", w->r->path);
      return -1;
    }
    w->np->layer = l;
    w->cap = cap;
  }
  Caffe__LayerParameter *l = malloc(sizeof *l);
  if (!l || !(caffe__layer_parameter__init(l), l->name = strdup(name))) {
    free(l);
    w->rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", w->r->path);
    return -1;
  }
  w->np->layer[w->np->n_layer++] = l;
  hid_t g = H5Gopen2(data, name, H5P_DEFAULT);
  if (g < 0) {
    w->rc = kiln_errorf(KILN_ERR_PARSE, "%s: data/%s is not a group of blobs", w->r->path, name);
    return -1;
  }
  char what[300];
  snprintf(what, sizeof what, "data/%.256s", name);
  w->rc = read_blobs(w->r, g, what, &l->blobs, &l->n_blobs);
  H5Gclose(g);
  return w->rc ? -1 : 0;
}

/* The readers proper, on a file image (`path` names it in messages); run in a child process by
 * isolated(). */
static int read_net_image(const char *path, const void *image, size_t len, ProtobufCMessage **m) {
  Caffe__NetParameter **out = (Caffe__NetParameter **)m;
  *out = NULL;
  reader r;
  KILN_TRY(open_bytes(&r, path, image, len, NULL));
  int rc = KILN_OK;
  hid_t data = H5Gopen2(r.file, "data", H5P_DEFAULT);
  Caffe__NetParameter *np = malloc(sizeof *np);
  if (!np) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  else caffe__net_parameter__init(np);
  if (!rc && data < 0)
    rc = kiln_errorf(KILN_ERR_PARSE, "%s: no group 'data' (not a .caffemodel.h5?)", path);
  if (!rc) {
    net_walk w = {.r = &r, .np = np};
    /* in name order: the layers are matched by name */
    hsize_t idx = 0;
    if (H5Literate(data, H5_INDEX_NAME, H5_ITER_INC, &idx, take_layer, &w) < 0)
      rc = w.rc ? w.rc : kiln_errorf(KILN_ERR_PARSE, "%s: group 'data' cannot be read", path);
  }
  if (data >= 0) H5Gclose(data);
  close_image(&r);
  if (rc) {
    if (np) protobuf_c_message_free_unpacked(&np->base, NULL);
    return rc;
  }
  *out = np;
  return KILN_OK;
}

/* A kiln dataset, when present: its values as `type`. */
static int read_optional(const reader *r, hid_t k, const char *name, hid_t type, size_t elem,
                         void **out, hsize_t *n) {
  *out = NULL;
  *n = 0;
  if (k < 0 || H5Lexists(k, name, H5P_DEFAULT) <= 0) return KILN_OK;
  return read_all(r, k, name, type, elem, (hsize_t)1 << 30, out, n, NULL, NULL);
}

static int read_state(reader r, const char *path, Caffe__SolverState **out);

static int read_state_image(const char *path, const void *image, size_t len,
                            ProtobufCMessage **m) {
  Caffe__SolverState **out = (Caffe__SolverState **)m;
  *out = NULL;
  reader r;
  KILN_TRY(open_bytes(&r, path, image, len, NULL));
  return read_state(r, path, out);
}

/* ---- reading in a child process --------------------------------------------------------------
 * libhdf5 itself crashes on some damaged files before kiln can look at anything (1.10.8: a
 * group's local heap that claims an impossible size makes H5Dopen2's name lookup copy into the
 * null it got back; docs/fuzzing.md). So a file is read in a child process, which sends the
 * message back packed (or the error's code and text) through a pipe: a crash there is an
 * error naming the file, not the end of training. A fuzzing build reads in process, so that
 * the fuzzer sees kiln's own faults. */

typedef int (*image_reader)(const char *path, const void *image, size_t len,
                            ProtobufCMessage **out);

#ifndef KILN_FUZZ_BUILD
/* The child: read, then send int32 status, uint64 length and the packed message (or the
 * error's text). */
static void child_read(int fd, image_reader fn, const char *path, const void *image, size_t len) {
  kiln_child_default_signals();
  ProtobufCMessage *m = NULL;
  int32_t rc = fn(path, image, len, &m);
  uint8_t *bytes = NULL;
  uint64_t n = 0;
  if (!rc) {
    n = protobuf_c_message_get_packed_size(m);
    bytes = malloc(n ? n : 1);
    if (!bytes) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
    else protobuf_c_message_pack(m, bytes);
  }
  if (rc) {
    bytes = (uint8_t *)kiln_last_error();
    n = strlen((const char *)bytes);
  }
  bool ok = kiln_fd_write_all(fd, &rc, sizeof rc) && kiln_fd_write_all(fd, &n, sizeof n) &&
            kiln_fd_write_all(fd, bytes, n);
  _exit(ok ? 0 : 3); /* no atexit handlers: they belong to the parent */
}
#endif

static int isolated(image_reader fn, const ProtobufCMessageDescriptor *d, const char *path,
                    const void *image, size_t len, ProtobufCMessage **out) {
  *out = NULL;
#ifdef KILN_FUZZ_BUILD
  (void)d;
  return fn(path, image, len, out);
#else
  int fds[2];
  if (pipe(fds) != 0)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot read it in a child process: pipe: %s", path,
                       strerror(errno));
  kiln_h5_lock(); /* no other thread inside libhdf5 while the child is made */
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child_read(fds[1], fn, path, image, len);
  }
  kiln_h5_unlock();
  if (pid < 0) {
    int e = errno;
    close(fds[0]);
    close(fds[1]);
    return kiln_errorf(KILN_ERR_IO, "%s: cannot read it in a child process: fork: %s", path,
                       strerror(e));
  }
  close(fds[1]);
  /* all the child sends, until it closes its end */
  size_t cap = 1 << 16, got = 0;
  uint8_t *buf = malloc(cap);
  int rc = buf ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (ssize_t r = 1; !rc && r != 0;) {
    if (got == cap) {
      uint8_t *more = realloc(buf, cap * 2);
      if (!more) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        break;
      }
      buf = more, cap *= 2;
    }
    r = read(fds[0], buf + got, cap - got);
    if (r < 0 && errno != EINTR) rc = kiln_errorf(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    if (r > 0) got += (size_t)r;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int32_t child_rc = 0;
  uint64_t n = 0;
  const size_t head = sizeof child_rc + sizeof n;
  if (!rc && (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got < head))
    rc = kiln_child_failed(path, "libhdf5", "the HDF5 reader", status);
  if (!rc) {
    memcpy(&child_rc, buf, sizeof child_rc);
    memcpy(&n, buf + sizeof child_rc, sizeof n);
    if (n != got - head) {
      rc = kiln_errorf(KILN_ERR_INTERNAL, "%s: the HDF5 reader sent %zu bytes for %llu", path,
                       got - head, (unsigned long long)n);
    } else if (child_rc) {
      rc = kiln_errorf(child_rc, "%.*s", (int)n, (const char *)buf + head);
    } else {
      *out = protobuf_c_message_unpack(d, NULL, (size_t)n, buf + head);
      if (!*out) rc = kiln_errorf(KILN_ERR_INTERNAL, "%s: the HDF5 reader's answer is unreadable", path);
    }
  }
  free(buf);
  return rc;
#endif
}

int kiln_h5_read_net(const char *path, Caffe__NetParameter **out) {
  *out = NULL;
  char *bytes;
  size_t len;
  KILN_TRY(kiln_read_file(path, &bytes, &len));
  int rc = isolated(read_net_image, &caffe__net_parameter__descriptor, path, bytes, len,
                    (ProtobufCMessage **)out);
  free(bytes);
  return rc;
}

int kiln_h5_read_state(const char *path, Caffe__SolverState **out) {
  *out = NULL;
  char *bytes;
  size_t len;
  KILN_TRY(kiln_read_file(path, &bytes, &len));
  int rc = isolated(read_state_image, &caffe__solver_state__descriptor, path, bytes, len,
                    (ProtobufCMessage **)out);
  free(bytes);
  return rc;
}

int kiln_h5_unpack_state(const void *image, size_t len, const char *name, Caffe__SolverState **out) {
  return isolated(read_state_image, &caffe__solver_state__descriptor, name, image, len,
                  (ProtobufCMessage **)out);
}

static int read_state(reader r, const char *path, Caffe__SolverState **out) {
  Caffe__SolverState *st = malloc(sizeof *st);
  int rc = st ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  if (!rc) caffe__solver_state__init(st);
  if (!rc) rc = read_int(&r, r.file, "iter", &st->iter);
  if (!rc) st->has_iter = 1;
  if (!rc && H5Lexists(r.file, "current_step", H5P_DEFAULT) > 0) {
    rc = read_int(&r, r.file, "current_step", &st->current_step);
    st->has_current_step = 1;
  }
  if (!rc && H5Lexists(r.file, "learned_net", H5P_DEFAULT) > 0) {
    hid_t d = H5Dopen2(r.file, "learned_net", H5P_DEFAULT);
    hid_t t = d < 0 ? -1 : H5Dget_type(d);
    size_t size = t < 0 || H5Tget_class(t) != H5T_STRING ? 0 : H5Tget_size(t);
    char *s = size && size < 65536 ? calloc(1, size + 1) : NULL;
    hid_t mt = s ? H5Tcopy(H5T_C_S1) : -1;
    if (!s || mt < 0 || H5Tset_size(mt, size) < 0 || H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, s) < 0) {
      free(s);
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: 'learned_net' is not a string", path);
    } else {
      st->learned_net = s;
    }
    if (mt >= 0) H5Tclose(mt);
    if (t >= 0) H5Tclose(t);
    if (d >= 0) H5Dclose(d);
  }
  hid_t h = rc ? -1 : H5Gopen2(r.file, "history", H5P_DEFAULT);
  if (!rc && h < 0) rc = kiln_errorf(KILN_ERR_PARSE, "%s: no group 'history' (not a .solverstate.h5?)", path);
  if (!rc) rc = read_blobs(&r, h, "history", &st->history, &st->n_history);
  if (h >= 0) H5Gclose(h);
  hid_t k = rc || H5Lexists(r.file, "kiln", H5P_DEFAULT) <= 0 ? -1 : H5Gopen2(r.file, "kiln", H5P_DEFAULT);
  void *p;
  hsize_t n;
  if (!rc) rc = read_optional(&r, k, "kiln_data_cursor", H5T_NATIVE_UINT64, 8, &p, &n);
  if (!rc) st->kiln_data_cursor = p, st->n_kiln_data_cursor = (size_t)n;
  if (!rc) rc = read_optional(&r, k, "kiln_test_data_cursor", H5T_NATIVE_UINT64, 8, &p, &n);
  if (!rc) st->kiln_test_data_cursor = p, st->n_kiln_test_data_cursor = (size_t)n;
  if (!rc) rc = read_optional(&r, k, "kiln_rng_state", H5T_NATIVE_UINT8, 1, &p, &n);
  if (!rc && p) st->kiln_rng_state.data = p, st->kiln_rng_state.len = (size_t)n, st->has_kiln_rng_state = 1;
  if (!rc) rc = read_optional(&r, k, "kiln_loss_history", H5T_NATIVE_FLOAT, 4, &p, &n);
  if (!rc) st->kiln_loss_history = p, st->n_kiln_loss_history = (size_t)n;
  if (!rc && k >= 0 && H5Lexists(k, "kiln_worker_rng_state", H5P_DEFAULT) > 0) {
    hsize_t dims[32];
    int rank;
    rc = read_all(&r, k, "kiln_worker_rng_state", H5T_NATIVE_UINT8, 1, (hsize_t)1 << 30, &p, &n, &rank, dims);
    if (!rc && rank != 2) {
      free(p);
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: kiln_worker_rng_state is not workers x bytes", path);
    }
    if (!rc) {
      st->kiln_worker_rng_state = calloc(dims[0] ? dims[0] : 1, sizeof *st->kiln_worker_rng_state);
      for (hsize_t w = 0; st->kiln_worker_rng_state && !rc && w < dims[0]; w++) {
        uint8_t *one = malloc(dims[1] ? dims[1] : 1);
        if (!one) {
          rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
          break;
        }
        memcpy(one, (uint8_t *)p + w * dims[1], dims[1]);
        st->kiln_worker_rng_state[w].data = one;
        st->kiln_worker_rng_state[w].len = dims[1];
        st->n_kiln_worker_rng_state++;
      }
      if (!st->kiln_worker_rng_state) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
      free(p);
    }
  }
  if (!rc && k >= 0 && H5Lexists(k, "kiln_workers", H5P_DEFAULT) > 0) {
    rc = read_int(&r, k, "kiln_workers", &st->kiln_workers);
    st->has_kiln_workers = 1;
  }
  if (!rc) rc = read_optional(&r, k, "kiln_first_loss", H5T_NATIVE_FLOAT, 4, &p, &n);
  if (!rc && p) {
    if (n == 1) st->kiln_first_loss = *(float *)p, st->has_kiln_first_loss = 1;
    else rc = kiln_errorf(KILN_ERR_PARSE, "%s: kiln_first_loss holds %llu values", path, (unsigned long long)n);
    free(p);
  }
  if (!rc && k >= 0 && H5Lexists(k, "kiln_divergence_run", H5P_DEFAULT) > 0) {
    rc = read_int(&r, k, "kiln_divergence_run", &st->kiln_divergence_run);
    st->has_kiln_divergence_run = 1;
  }
  if (k >= 0) H5Gclose(k);
  close_image(&r);
  if (rc) {
    if (st) protobuf_c_message_free_unpacked(&st->base, NULL);
    return rc;
  }
  *out = st;
  return KILN_OK;
}
