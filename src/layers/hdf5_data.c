/* HDF5Data: batches of records from HDF5 files (Caffe's HDF5Data layer). `hdf5_data_param {
 * source: LIST batch_size: N shuffle: B }`: LIST names the files (separated by white space, each
 * path as given, as Caffe reads them), each top is read from the dataset of its name, and the
 * datasets of a file hold one row per record (docs/formats.md, "HDF5 data files").
 *
 * Records are addressed by their position in an endless stream, as in the Data layer: pass
 * p = position / S (S: the records of all files), and within a pass the files in the pass's
 * order and each file's rows in order. Without shuffle both are the list's and the file's; with
 * it, the files of pass p follow a permutation drawn from (seed, p) and the rows of file f in
 * pass p one drawn from (seed, p, f): Caffe shuffles the files at each wrap and a file's rows at
 * each load, and so does kiln, from the seed. Batches run on across files and wrap at the end of
 * a pass, as in Caffe. So a cursor is one position, resume is exact, and data-parallel workers
 * deal whole global batches (kiln_batch_stream) as in the Data layer.
 *
 * Set-up reads every file's metadata (its record count, and its records' shapes, checked against
 * the first file's), not its data. Data flow through two threads started at the first forward:
 *   - the loader reads whole files, one at a time, into the spare of two file buffers: while
 *     the ring's thread makes batches from one file, the next file of the walk is loaded;
 *   - the ring's thread (batch_ring.h, shared with the Data layer) fills `prefetch` batches
 *     from the current file.
 * The buffers are sized for the largest file when the data start flowing: nothing is allocated
 * per batch. When every file fits in memory at once (a few small files, within the allowance
 * of HDF5 data, KILN_HDF5_FILE_LIMIT) each file has a buffer of its own and stays there once
 * loaded: with two buffers, three files of one batch each were loaded again at every iteration
 * (a millisecond a load against 0.01 ms for a step of the file in memory). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_ring.h"
#include "kiln/data.h"

static const Caffe__HDF5DataParameter hdf5_defaults = CAFFE__HDF5_DATA_PARAMETER__INIT;

/* Salts of the two kinds of draws, apart from each other and from the net's other streams. */
#define FILE_SALT 0x6835666966696c65ULL
#define ROW_SALT 0x683564726f77735fULL

enum { MAX_TOPS = KILN_H5DATA_MAX_SETS, FINGERPRINT_SAMPLES = 16, NO_FILE = -1,
       MAX_RESIDENT = 16 /* files kept in memory together, at most */ };
_Static_assert((int)MAX_TOPS <= (int)KILN_RING_MAX_TOPS && KILN_RING_MAX_SLOTS == 64,
               "a batch of every dataset fits one ring slot; prefetch's limit is 64");

typedef struct {
  char *path;
  int line;      /* in the list */
  uint64_t rows; /* records */
  uint64_t bytes;
} h5_file;

/* One whole file in memory. */
typedef struct {
  int file;                 /* index in files; NO_FILE: empty */
  uint64_t pass;            /* the pass `order` is drawn for */
  kiln_h5data_region mem;   /* every top's values, which the reader's worker fills in place */
  float *data[MAX_TOPS];    /* rows x per[t] values each, in mem at offset[t] */
  uint64_t offset[MAX_TOPS];
  uint32_t *order;          /* shuffle: the file's row at each place in the pass; else NULL */
} file_buf;

typedef struct {
  char *list; /* the list's path, $KILN_DATA expanded */
  h5_file *files;
  int nfiles, ntop;
  const char *names[MAX_TOPS];           /* the tops' names: the datasets read */
  kiln_h5data_shape shape[MAX_TOPS];     /* the first file's: every file's records have these */
  int64_t per[MAX_TOPS];                 /* values per record */
  uint64_t total;                        /* records in a pass */
  uint64_t max_rows, limit;
  int batch;
  bool shuffle;
  uint64_t seed;
  kiln_batch_stream stream;
  /* the producer's walk: the file that the last record read came from */
  kiln_record_order file_order; /* pass p's k-th file: index p * nfiles + k */
  bool walked;
  uint64_t walk_pass, walk_start; /* walk_start: the stream position of the file's first row */
  int walk_k, walk_file;
  /* the file buffers: buf[cur] is the producer's. Two, the other the loader's; or (resident)
   * one per file, buf[f] holding file f once loaded */
  file_buf buf[MAX_RESIDENT];
  int nbuf;
  bool resident;
  int cur;
  int want_file;            /* what the loader is asked to load next (NO_FILE: nothing) */
  uint64_t want_pass;
  int failed_file, fail_load_code;
  char fail_load_msg[1024];
  bool loader_running, buffers_ready;
  pthread_t loader;
  pthread_cond_t lcv; /* with ring.mu */
  kiln_batch_ring ring; /* batches, one array per top; its mutex guards the loader's fields */
} h5_state;

/* ---- the walk over files and rows ---------------------------------------------------------- */

/* File f's rows in pass `pass` (b holds f): a permutation drawn from (seed, pass, f) with
 * shuffle. */
static void draw_order(const h5_state *s, file_buf *b, int f, uint64_t pass) {
  b->pass = pass;
  if (!s->shuffle) return;
  const uint32_t n = (uint32_t)s->files[f].rows;
  kiln_rng r;
  kiln_rng_seed(&r, s->seed ^ ROW_SALT, pass * (uint64_t)s->nfiles + (uint64_t)f + 1);
  for (uint32_t j = 0; j < n; j++) b->order[j] = j;
  for (uint32_t j = n - 1; j > 0; j--) { /* Fisher-Yates */
    const uint32_t x = kiln_rng_below(&r, j + 1), t = b->order[j];
    b->order[j] = b->order[x];
    b->order[x] = t;
  }
}

static int file_of(h5_state *s, uint64_t pass, int k, int *file) {
  uint64_t index;
  KILN_TRY(kiln_record_order_index(&s->file_order, pass * (uint64_t)s->nfiles + (uint64_t)k,
                                   &index));
  *file = (int)index;
  return KILN_OK;
}

/* Moves the walk to the file holding stream position `pos`: on from where it stands within a
 * pass (the producer's positions only grow between resets), from the pass's start otherwise. */
static int walk_to(h5_state *s, uint64_t pos) {
  if (s->walked && pos >= s->walk_start && pos - s->walk_start < s->files[s->walk_file].rows)
    return KILN_OK;
  if (!s->walked || pos < s->walk_start || pos / s->total != s->walk_pass) {
    s->walk_pass = pos / s->total;
    s->walk_start = s->walk_pass * s->total;
    s->walk_k = 0;
  } else {
    s->walk_start += s->files[s->walk_file].rows;
    s->walk_k++;
  }
  s->walked = false;
  for (;; s->walk_k++) { /* pos lies in this pass, so some file of it holds it */
    if (s->walk_k >= s->nfiles)
      return kiln_errorf(KILN_ERR_INTERNAL, "record %llu lies past the files of its pass",
                         (unsigned long long)pos);
    KILN_TRY(file_of(s, s->walk_pass, s->walk_k, &s->walk_file));
    if (pos - s->walk_start < s->files[s->walk_file].rows) break;
    s->walk_start += s->files[s->walk_file].rows;
  }
  s->walked = true;
  return KILN_OK;
}

/* ---- the loader ---------------------------------------------------------------------------- */

/* The buffer file f is loaded into: its own (resident), else the one the producer is not
 * reading. */
static int slot_of(const h5_state *s, int f) { return s->resident ? f : 1 - s->cur; }

/* Whether a buffer holds file f. */
static bool held(const h5_state *s, int f) {
  return s->resident ? s->buf[f].file == f : s->buf[0].file == f || s->buf[1].file == f;
}

static int load_file(h5_state *s, int f, uint64_t pass, file_buf *b) {
  kiln_h5data_shape shapes[MAX_TOPS];
  uint64_t room[MAX_TOPS];
  for (int t = 0; t < s->ntop; t++) room[t] = s->max_rows * (uint64_t)s->per[t];
  const h5_file *hf = &s->files[f];
  KILN_TRY(kiln_h5data_load_region(hf->path, s->ntop, s->names, s->limit, shapes, &b->mem,
                                   b->offset, room));
  /* set-up's counts and shapes are what the cursor and the buffers stand on */
  for (int t = 0; t < s->ntop; t++) {
    bool same = shapes[t].naxes == s->shape[t].naxes && (uint64_t)shapes[t].dims[0] == hf->rows;
    for (int i = 1; same && i < shapes[t].naxes; i++)
      same = shapes[t].dims[i] == s->shape[t].dims[i];
    if (!same)
      return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' changed since the layer was set up "
                         "(%llu records then); a data file must not change while it is read",
                         hf->path, s->names[t], (unsigned long long)hf->rows);
  }
  draw_order(s, b, f, pass); /* b->file is set under the lock by the loader */
  return KILN_OK;
}

/* Loads whatever file is wanted into the spare buffer, one at a time, until stopped. */
static void *loader(void *arg) {
  h5_state *s = arg;
  pthread_mutex_lock(&s->ring.mu);
  for (;;) {
    while (!s->ring.stop && (s->want_file == NO_FILE || held(s, s->want_file) ||
                             s->failed_file == s->want_file))
      pthread_cond_wait(&s->lcv, &s->ring.mu);
    if (s->ring.stop) break;
    const int f = s->want_file;
    const uint64_t pass = s->want_pass;
    file_buf *b = &s->buf[slot_of(s, f)]; /* the producer swaps only to a loaded buffer */
    b->file = NO_FILE;
    pthread_mutex_unlock(&s->ring.mu);
    int rc = load_file(s, f, pass, b);
    pthread_mutex_lock(&s->ring.mu);
    if (!rc) b->file = f;
    if (rc) {
      s->failed_file = f;
      s->fail_load_code = rc;
      snprintf(s->fail_load_msg, sizeof s->fail_load_msg, "%s", kiln_last_error());
    }
    pthread_cond_broadcast(&s->lcv);
  }
  pthread_mutex_unlock(&s->ring.mu);
  return NULL;
}

/* Asks the loader for file f (its rows drawn for `pass`) unless a buffer holds it already. */
static void want(h5_state *s, int f, uint64_t pass) {
  pthread_mutex_lock(&s->ring.mu);
  if (!held(s, f) && s->want_file != f) {
    s->want_file = f;
    s->want_pass = pass;
    pthread_cond_broadcast(&s->lcv);
  }
  pthread_mutex_unlock(&s->ring.mu);
}

/* Makes file f, its rows in pass `pass`'s order, the current buffer: it is already, or the loader
 * has it or is asked for it and waited for. Then asks for the file after it in the walk.
 * KILN_ERR_INTERNAL with s->ring.stop set: stopped while waiting. */
static int take_file(h5_state *s, int f, uint64_t pass) {
  if (s->buf[s->cur].file != f) {
    want(s, f, pass);
    pthread_mutex_lock(&s->ring.mu);
    while (!s->ring.stop && s->buf[slot_of(s, f)].file != f && s->failed_file != f)
      pthread_cond_wait(&s->lcv, &s->ring.mu);
    int rc = KILN_OK;
    if (s->ring.stop) rc = kiln_errorf(KILN_ERR_INTERNAL, "stopped");
    else if (s->buf[slot_of(s, f)].file != f)
      rc = kiln_errorf(s->fail_load_code, "%s", s->fail_load_msg);
    else s->cur = slot_of(s, f);
    if (!rc && s->want_file == f) s->want_file = NO_FILE; /* had, not to be loaded again */
    pthread_mutex_unlock(&s->ring.mu);
    KILN_TRY(rc);
  }
  file_buf *b = &s->buf[s->cur];
  if (b->pass != pass) draw_order(s, b, f, pass); /* the same file again, in another pass */
  /* the next file of the walk, loaded while this one is read */
  uint64_t next_pass = s->walk_pass;
  int next_k = s->walk_k + 1, next;
  if (next_k == s->nfiles) next_k = 0, next_pass++;
  KILN_TRY(file_of(s, next_pass, next_k, &next));
  if (next != f) want(s, next, next_pass);
  return KILN_OK;
}

/* ---- the producer -------------------------------------------------------------------------- */

static int fill_slot(void *owner, kiln_ring_slot *slot, uint64_t global) {
  h5_state *s = owner;
  const uint64_t start = kiln_batch_stream_start(&s->stream, global, &slot->count);
  for (int j = 0; j < slot->count; j++) {
    const uint64_t pos = start + (uint64_t)j;
    KILN_TRY(walk_to(s, pos));
    const file_buf *b = &s->buf[s->cur];
    if (b->file != s->walk_file || b->pass != s->walk_pass) {
      KILN_TRY(take_file(s, s->walk_file, s->walk_pass));
      b = &s->buf[s->cur];
    }
    const uint64_t place = pos - s->walk_start, row = b->order ? b->order[place] : place;
    for (int t = 0; t < s->ntop; t++)
      memcpy(slot->top[t] + (size_t)j * (size_t)s->per[t], b->data[t] + row * (uint64_t)s->per[t],
             sizeof(float) * (size_t)s->per[t]);
  }
  return KILN_OK;
}

/* The file buffers, allocated when the data start flowing (counted in the net's memory plan at
 * set-up: extra_bytes), as the ring's slots are. */
static int alloc_buffers(kiln_layer *l, h5_state *s) {
  for (int k = 0; k < s->nbuf; k++) {
    file_buf *b = &s->buf[k];
    uint64_t values = 0;
    for (int t = 0; t < s->ntop; t++) { /* each top's start on a 64-byte line */
      b->offset[t] = values;
      values += ((uint64_t)s->per[t] * s->max_rows + 15) / 16 * 16;
    }
    if (kiln_h5data_region_new(sizeof(float) * (size_t)values, &b->mem))
      return KILN_LAYER_ERROR(l, KILN_ERR_NOMEM, "out of memory for %d files of %llu records",
                              s->nbuf, (unsigned long long)s->max_rows);
    for (int t = 0; t < s->ntop; t++) b->data[t] = b->mem.base + b->offset[t];
    if (s->shuffle && !(s->buf[k].order = malloc(sizeof(uint32_t) * (size_t)s->max_rows)))
      return KILN_LAYER_ERROR(l, KILN_ERR_NOMEM, "out of memory");
  }
  s->buffers_ready = true;
  return KILN_OK;
}

/* The ring's thread may wait for the loader: stopping it wakes the loader's waits too. */
static void wake_loader(void *owner) {
  h5_state *s = owner;
  pthread_cond_broadcast(&s->lcv);
}

static void stop_threads(h5_state *s) {
  kiln_batch_ring_stop(&s->ring); /* first: its fill may be waiting for a file */
  if (!s->loader_running) return;
  pthread_mutex_lock(&s->ring.mu);
  s->ring.stop = true;
  pthread_cond_broadcast(&s->lcv);
  pthread_mutex_unlock(&s->ring.mu);
  pthread_join(s->loader, NULL); /* after the file it may be loading */
  s->loader_running = false;
}

static int start_threads(kiln_layer *l) {
  h5_state *s = l->priv;
  if (!s->buffers_ready) KILN_TRY(alloc_buffers(l, s));
  s->ring.stop = false;
  s->want_file = s->failed_file = NO_FILE; /* the buffers keep what they hold */
  if (pthread_create(&s->loader, NULL, loader, s) != 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INTERNAL, "cannot start the file loading thread");
  s->loader_running = true;
  int rc = kiln_batch_ring_start(&s->ring, l);
  if (rc) stop_threads(s);
  return rc;
}

/* ---- set-up -------------------------------------------------------------------------------- */

/* The files the list names: white-space separated paths, as Caffe reads them (`>>` into a
 * string), each as given (relative to the working folder) or in the data set cache
 * ($KILN_DATA/...). */
static int read_list(kiln_layer *l, h5_state *s, const char *given) {
  char path[4096];
  KILN_TRY(kiln_data_source_path(l->config, given, path, sizeof path));
  if (!(s->list = strdup(path))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  char *text;
  size_t len;
  int rc = kiln_read_file_max(path, (size_t)64 << 20, &text, &len);
  if (rc) return kiln_error_context(rc, "layer '%s' (HDF5Data): hdf5_data_param.source: ", l->name);
  if ((rc = kiln_text_check_nul(path, text, len))) { /* else the list would end there, unsaid */
    free(text);
    return kiln_error_context(rc, "layer '%s' (HDF5Data): hdf5_data_param.source: ", l->name);
  }
  int cap = 0, line = 1;
  for (char *p = text; !rc && *p;) {
    if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\v' || *p == '\f') {
      line += *p++ == '\n';
      continue;
    }
    char *end = p;
    while (*end && !strchr(" \t\r\n\v\f", *end)) end++;
    char saved = *end;
    *end = '\0';
    if (s->nfiles == cap) {
      cap = cap ? 2 * cap : 16;
      h5_file *f = realloc(s->files, sizeof *f * (size_t)cap);
      if (!f) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      else s->files = f;
    }
    if (!rc) rc = kiln_data_source_path(l->config, p, path, sizeof path);
    if (!rc) {
      h5_file *f = &s->files[s->nfiles];
      *f = (h5_file){.path = strdup(path), .line = line};
      if (!f->path) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      else s->nfiles++;
    }
    *end = saved;
    p = end;
  }
  free(text);
  if (rc) return kiln_error_context(rc, "layer '%s' (HDF5Data): %s, line %d: ", l->name, s->list,
                                    line);
  if (s->nfiles == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%s names no HDF5 files (a list of paths, one a "
                            "line)", s->list);
  return KILN_OK;
}

static const char *shape_text(const kiln_h5data_shape *sh, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 1; i < sh->naxes && used + 1 < n; i++) {
    int w = snprintf(buf + used, n - used, "%s%lld", i > 1 ? "x" : "", (long long)sh->dims[i]);
    used = w < 0 ? used : used + (size_t)w;
  }
  if (sh->naxes == 1) snprintf(buf, n, "single values");
  return buf;
}

/* Every file's metadata: its records, and its records' shapes against the first file's. */
static int inspect_files(kiln_layer *l, h5_state *s) {
  for (int i = 0; i < s->nfiles; i++) {
    h5_file *f = &s->files[i];
    kiln_h5data_shape shapes[MAX_TOPS];
    int rc = kiln_h5data_inspect(f->path, s->ntop, s->names, s->limit, shapes, &f->bytes);
    if (rc)
      return kiln_error_context(rc, "layer '%s' (HDF5Data): %s, line %d: ", l->name, s->list,
                                f->line);
    for (int t = 0; t < s->ntop && i > 0; t++) {
      bool same = shapes[t].naxes == s->shape[t].naxes;
      for (int k = 1; same && k < shapes[t].naxes; k++)
        same = shapes[t].dims[k] == s->shape[t].dims[k];
      char a[128], b[128];
      if (!same)
        return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE,
                                "%s: dataset '%s' holds records of %s, %s (the first file) of %s: "
                                "every file's records have one shape",
                                f->path, s->names[t], shape_text(&shapes[t], a, sizeof a),
                                s->files[0].path, shape_text(&s->shape[t], b, sizeof b));
    }
    if (i == 0)
      for (int t = 0; t < s->ntop; t++) {
        s->shape[t] = shapes[t];
        s->per[t] = kiln_h5data_record_size(&shapes[t]);
      }
    f->rows = (uint64_t)shapes[0].dims[0];
    if (s->shuffle && f->rows > UINT32_MAX)
      return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "%s: shuffle of more than 2^32 records in "
                              "one file", f->path);
    s->total += f->rows;
    if (f->rows > s->max_rows) s->max_rows = f->rows;
  }
  return KILN_OK;
}

static int hdf5_data_setup(kiln_layer *l) {
  const Caffe__HDF5DataParameter *p = KILN_PARAM_OR(l->lp->hdf5_data_param, hdf5_defaults);
  h5_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  kiln_batch_ring_init(&s->ring, l);
  s->ring.fill = fill_slot;
  s->ring.on_stop = wake_loader;
  s->ring.owner = s;
  pthread_cond_init(&s->lcv, NULL);
  for (int k = 0; k < MAX_RESIDENT; k++) s->buf[k].file = NO_FILE;
  if (!p->source || !p->source[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "hdf5_data_param.source is required (a text file "
                            "naming the HDF5 files)");
  if (!p->has_batch_size || p->batch_size == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "hdf5_data_param.batch_size must be set and > 0");
  if (l->lp->transform_param)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "HDF5Data does not transform its data (Caffe "
                            "refuses transform_param here too): store the values as they are to "
                            "be used, or transform them with layers after this one");
  if (p->prefetch > 64)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "hdf5_data_param.prefetch %u is more than 64 "
                            "batches", p->prefetch);
  if ((int)l->lp->n_top != l->ntop)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "%d tops given for the %zu named", l->ntop,
                            l->lp->n_top);
  s->ntop = l->ntop;
  for (int t = 0; t < s->ntop; t++) s->names[t] = l->lp->top[t];
  s->batch = (int)p->batch_size;
  s->shuffle = p->shuffle;
  s->seed = l->seed;
  s->ring.nslots = p->prefetch > 0 ? (int)p->prefetch : 1;
  s->ring.ntops = s->ntop;
  s->ring.batch = s->batch;
  /* Two files are in memory at once, and a third's bytes while it loads: a quarter of what is
   * available keeps them, and the net, inside it. */
  s->limit = l->config->hdf5_file_limit ? l->config->hdf5_file_limit : kiln_mem_available() / 4;
  KILN_TRY(read_list(l, s, p->source));
  KILN_TRY(inspect_files(l, s));
  uint64_t max_bytes = 0;
  for (int i = 0; i < s->nfiles; i++)
    if (s->files[i].bytes > max_bytes) max_bytes = s->files[i].bytes;
  s->stream = (kiln_batch_stream){.base = 0, .size = s->total, .batch = s->batch,
                                  .last_batch = KILN_LAST_BATCH_WRAP};
  s->file_order = (kiln_record_order){.seed = s->seed ^ FILE_SALT, .size = (uint64_t)s->nfiles,
                                      .shuffle = s->shuffle};
  /* Counted here (the net's memory plan refuses a net that would not fit, before anything is
   * allocated): the ring, the file buffers, and the bytes of a file while it loads. Every file
   * has a buffer of its own when all of them fit the allowance of one (s->limit) together. */
  double per = 0;
  for (int t = 0; t < s->ntop; t++) per += (double)(s->ring.per[t] = s->per[t]);
  int64_t ring_bytes;
  KILN_TRY(kiln_batch_ring_bytes(&s->ring, l, "hdf5_data_param.batch_size", &ring_bytes));
  const double one = (4.0 * per + (s->shuffle ? 4 : 0)) * (double)s->max_rows;
  s->resident = s->nfiles > 2 && s->nfiles <= MAX_RESIDENT &&
                one * s->nfiles + (double)max_bytes <= (double)s->limit;
  s->nbuf = s->resident ? s->nfiles : 2;
  const double bytes = (double)ring_bytes + s->nbuf * one + (double)max_bytes;
  if (bytes > 9e18)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "hdf5_data_param.batch_size %d of these records "
                            "does not fit in memory", s->batch);
  l->extra_bytes = (int64_t)bytes;
  return KILN_OK;
}

static int hdf5_data_reshape(kiln_layer *l) {
  h5_state *s = l->priv;
  for (int t = 0; t < s->ntop; t++) {
    int64_t shape[KILN_MAX_AXES];
    shape[0] = s->batch;
    for (int i = 1; i < s->shape[t].naxes; i++) shape[i] = s->shape[t].dims[i];
    KILN_TRY(kiln_blob_reshape(l->top[t], s->shape[t].naxes, shape));
  }
  return KILN_OK;
}

static int hdf5_data_forward(kiln_layer *l) {
  h5_state *s = l->priv;
  if (!s->ring.running) KILN_TRY(start_threads(l));
  const kiln_ring_slot *slot;
  KILN_TRY(kiln_batch_ring_take(&s->ring, l, &slot));
  /* the batch, made on the host, handed to the tops' device */
  int rc = KILN_OK;
  for (int t = 0; t < s->ntop && !rc; t++)
    rc = kiln_device_to_device(l->top[t]->device, l->top[t]->data, slot->top[t],
                               sizeof(float) * (size_t)l->top[t]->count);
  kiln_batch_ring_release(&s->ring);
  if (rc) return rc;
  return KILN_OK;
}

/* Where the global stream stands after round taken_k (as the Data layer's). */
static uint64_t hdf5_data_get_cursor(kiln_layer *l) {
  h5_state *s = l->priv;
  return kiln_batch_ring_cursor(&s->ring, &s->stream);
}

static int hdf5_data_set_cursor(kiln_layer *l, uint64_t cursor) {
  h5_state *s = l->priv;
  stop_threads(s);
  kiln_batch_ring_reset(&s->ring);
  s->stream.base = cursor;
  s->walked = false;
  return KILN_OK;
}

/* The files' sizes, record counts and FINGERPRINT_SAMPLES runs of bytes spread over each. */
static int hdf5_data_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  h5_state *s = l->priv;
  if (s->ring.running)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "fingerprint asked for after the first forward");
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  for (int i = 0; i < s->nfiles; i++) {
    uint8_t rows[8];
    for (int k = 0; k < 8; k++) rows[k] = (uint8_t)(s->files[i].rows >> (8 * k));
    kiln_sha256_update(&h, rows, sizeof rows);
    int rc = kiln_h5data_sample(s->files[i].path, FINGERPRINT_SAMPLES, &h);
    if (rc) return kiln_error_context(rc, "layer '%s' (HDF5Data): ", l->name);
  }
  kiln_sha256_final(&h, digest);
  snprintf(what, n, "%s (%d HDF5 file%s, %llu records, compared by their sizes, record counts "
           "and %d runs of 64 bytes spread over each)", s->list, s->nfiles,
           s->nfiles == 1 ? "" : "s", (unsigned long long)s->total, FINGERPRINT_SAMPLES);
  return KILN_OK;
}

static void hdf5_data_destroy(kiln_layer *l) {
  h5_state *s = l->priv;
  if (!s) return;
  stop_threads(s);
  for (int i = 0; i < s->nfiles; i++) free(s->files[i].path);
  free(s->files);
  free(s->list);
  for (int k = 0; k < s->nbuf; k++) {
    kiln_h5data_region_free(&s->buf[k].mem);
    free(s->buf[k].order);
  }
  kiln_record_order_free(&s->file_order);
  kiln_batch_ring_destroy(&s->ring);
  pthread_cond_destroy(&s->lcv);
  free(s);
}

const kiln_layer_ops kiln_layer_hdf5_data = {
    .type = "HDF5Data", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = MAX_TOPS,
    .is_data = true, .setup = hdf5_data_setup, .reshape = hdf5_data_reshape,
    .forward = hdf5_data_forward, .destroy = hdf5_data_destroy,
    .get_cursor = hdf5_data_get_cursor, .set_cursor = hdf5_data_set_cursor,
    .fingerprint = hdf5_data_fingerprint, .kernels = KILN_NO_KERNELS,
};
