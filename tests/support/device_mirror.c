/* One pass of a standalone layer on its backend's device (device_mirror.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_mirror.h"
#include "kiln/device.h"

enum { MAX_BLOBS = 64, MAX_SPANS = 2 * MAX_BLOBS + 1 };

/* A stretch of host memory and its copy on the device. Blobs that share memory (a view, a top in
 * place on its bottom, parameters in one flat buffer) land in one span, so that they share it on
 * the device too. */
typedef struct {
  float *host, *dev;
  int64_t n;
} span;

typedef struct {
  const kiln_device *d;
  kiln_blob *blob[MAX_BLOBS];
  float *data[MAX_BLOBS], *diff[MAX_BLOBS]; /* the host pointers before the pass */
  const kiln_device *was[MAX_BLOBS];
  int nblob;
  span span[MAX_SPANS];
  int nspan;
  float *workspace;
} mirror;

static void add_blob(mirror *m, kiln_blob *b) {
  if (!b || b->csr) return; /* sparse blobs' CSR arrays stay on the host, read there */
  for (int i = 0; i < m->nblob; i++)
    if (m->blob[i] == b) return;
  if (m->nblob == MAX_BLOBS) {
    fprintf(stderr, "device mirror: more than %d blobs\n", MAX_BLOBS);
    abort();
  }
  m->blob[m->nblob++] = b;
}

static void add_span(mirror *m, float *p, int64_t n) {
  if (!p || n <= 0) return;
  m->span[m->nspan++] = (span){.host = p, .n = n};
}

static int by_start(const void *a, const void *b) {
  const span *x = a, *y = b;
  return (x->host > y->host) - (x->host < y->host);
}

/* Sorts the spans and joins those that overlap. */
static void merge_spans(mirror *m) {
  qsort(m->span, (size_t)m->nspan, sizeof m->span[0], by_start);
  int k = 0;
  for (int i = 0; i < m->nspan; i++) {
    if (k && m->span[i].host < m->span[k - 1].host + m->span[k - 1].n) {
      float *end = m->span[i].host + m->span[i].n, *had = m->span[k - 1].host + m->span[k - 1].n;
      if (end > had) m->span[k - 1].n = end - m->span[k - 1].host;
    } else {
      m->span[k++] = m->span[i];
    }
  }
  m->nspan = k;
}

static float *on_device(const mirror *m, float *p) {
  if (!p) return NULL;
  for (int i = 0; i < m->nspan; i++)
    if (p >= m->span[i].host && p < m->span[i].host + m->span[i].n)
      return m->span[i].dev + (p - m->span[i].host);
  return p; /* not a blob's: left alone */
}

static bool span_in_use(const mirror *m, const span *s) {
  for (int i = 0; i < m->nblob; i++) {
    const kiln_blob *b = m->blob[i];
    if ((b->data >= s->dev && b->data < s->dev + s->n) ||
        (b->diff >= s->dev && b->diff < s->dev + s->n))
      return true;
  }
  return false;
}

static void must(int rc, const char *what) {
  if (rc) {
    fprintf(stderr, "device mirror: %s: %s\n", what, kiln_last_error());
    abort();
  }
}

static void to_device(mirror *m, kiln_layer *l) {
  for (int i = 0; i < l->nbottom; i++) add_blob(m, l->bottom[i]);
  for (int i = 0; i < l->ntop; i++) add_blob(m, l->top[i]);
  for (int i = 0; i < l->nparam; i++) add_blob(m, l->param[i]);
  for (int i = 0; i < l->nbuffer; i++) add_blob(m, l->buffer[i]);
  for (int i = 0; i < m->nblob; i++) {
    kiln_blob *b = m->blob[i];
    /* what it may grow into during the pass without new memory: its capacity */
    const int64_t n = b->owned && b->capacity > b->count ? b->capacity : b->count;
    add_span(m, b->data, n);
    add_span(m, b->diff, b->no_diff ? 0 : n);
  }
  merge_spans(m);
  for (int i = 0; i < m->nspan; i++) {
    span *s = &m->span[i];
    const size_t bytes = sizeof(float) * (size_t)s->n;
    must(kiln_device_alloc(m->d, bytes, (void **)&s->dev), "allocate");
    must(kiln_device_to_device(m->d, s->dev, s->host, bytes), "copy in");
    memset(s->host, 0xff, bytes); /* NaN: a read of the host copy during the pass shows */
  }
  for (int i = 0; i < m->nblob; i++) {
    kiln_blob *b = m->blob[i];
    m->data[i] = b->data;
    m->diff[i] = b->diff;
    m->was[i] = b->device;
    b->data = on_device(m, b->data);
    b->diff = on_device(m, b->diff);
    b->device = m->d;
  }
  if (l->workspace_floats > 0) { /* fresh device memory: NaN until the kernels write it */
    m->workspace = l->workspace;
    void *w = NULL;
    must(kiln_device_alloc(m->d, sizeof(float) * (size_t)l->workspace_floats, &w), "workspace");
    l->workspace = w;
  }
}

/* A blob the pass gave new memory (it grew): that memory is the device's; move it to the
 * host. */
static float *adopt(const mirror *m, float *dev, int64_t n) {
  float *h = kiln_alloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!h) must(KILN_ERR_NOMEM, "host memory");
  must(kiln_device_to_host(m->d, h, dev, sizeof(float) * (size_t)n), "copy out");
  kiln_device_free(m->d, dev);
  return h;
}

static void to_host(mirror *m, kiln_layer *l) {
  for (int i = 0; i < m->nspan; i++) {
    span *s = &m->span[i];
    if (!span_in_use(m, s)) { /* freed by a blob that grew during the pass */
      s->dev = NULL;
      continue;
    }
    must(kiln_device_to_host(m->d, s->host, s->dev, sizeof(float) * (size_t)s->n), "copy out");
  }
  for (int i = 0; i < m->nblob; i++) {
    kiln_blob *b = m->blob[i];
    if (b->data == on_device(m, m->data[i]) || !b->data) {
      b->data = m->data[i];
    } else {
      if (b->owned && !b->data_of) kiln_free(m->data[i]);
      b->data = adopt(m, b->data, b->capacity);
    }
    if (b->diff == on_device(m, m->diff[i]) || !b->diff) {
      b->diff = m->diff[i];
    } else {
      if (b->owned && !b->diff_borrowed) kiln_free(m->diff[i]);
      b->diff = adopt(m, b->diff, b->capacity);
    }
    b->device = m->was[i];
  }
  for (int i = 0; i < m->nspan; i++)
    if (m->span[i].dev) kiln_device_free(m->d, m->span[i].dev);
  if (m->workspace) {
    kiln_device_free(m->d, l->workspace);
    l->workspace = m->workspace;
  }
}

static int run(kiln_layer *l, int (*pass)(kiln_layer *)) {
  const kiln_device *d = l->backend ? l->backend->device : NULL;
  if (kiln_device_is_host(d)) return pass(l);
  mirror *m = calloc(1, sizeof *m);
  if (!m) must(KILN_ERR_NOMEM, "mirror");
  m->d = d;
  to_device(m, l);
  int rc = pass(l);
  to_host(m, l);
  free(m);
  return rc;
}

int layer_forward(kiln_layer *l) { return run(l, l->ops->forward); }

int layer_backward(kiln_layer *l) { return run(l, l->ops->backward); }
