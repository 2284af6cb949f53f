/* Blobs: shaped float tensors with a gradient buffer of the same shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/core.h"
#include "kiln/device.h"

/* `count` zeroed floats on the blob's device (the host's allocator for the host). */
static float *alloc_floats(const kiln_blob *b, int64_t count) {
  if (kiln_device_is_host(b->device)) return kiln_alloc((size_t)count * sizeof(float));
  void *p = NULL;
  if (kiln_device_alloc(b->device, (size_t)count * sizeof(float), &p)) return NULL;
  if (kiln_device_set(b->device, p, 0, (size_t)count * sizeof(float))) {
    kiln_device_free(b->device, p);
    return NULL;
  }
  return p;
}

static void free_floats(const kiln_blob *b, float *p) {
  if (kiln_device_is_host(b->device)) kiln_free(p);
  else kiln_device_free(b->device, p);
}

/* Storage a reshape outgrew: to the blob's keeper when it has one (kiln_blob.retire) */
static void outgrown(const kiln_blob *b, float *p) {
  if (p && b->retire && kiln_device_is_host(b->device)) b->retire(b->retire_user, p);
  else free_floats(b, p);
}

kiln_blob *kiln_blob_new(const char *name) {
  kiln_blob *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->name = kiln_strdup(name ? name : "");
  b->owned = true;
  b->id = -1;
  return b;
}

int kiln_csr_reserve(kiln_csr *m, int64_t rows, int64_t nnz) {
  if (rows > m->row_cap || !m->row_ptr) {
    int64_t *p = realloc(m->row_ptr, sizeof *p * (size_t)(rows + 1));
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "cannot allocate a sparse matrix of %lld rows",
                               (long long)rows);
    if (!m->row_ptr) p[0] = 0;
    m->row_ptr = p;
    m->row_cap = rows;
  }
  if (nnz > m->nnz_cap || !m->col) {
    int64_t cap = nnz > 0 ? nnz : 1;
    int32_t *c = realloc(m->col, sizeof *c * (size_t)cap);
    if (c) m->col = c;
    float *v = c ? realloc(m->val, sizeof *v * (size_t)cap) : NULL;
    if (v) m->val = v;
    if (!c || !v)
      return kiln_errorf(KILN_ERR_NOMEM, "cannot allocate a sparse matrix of %lld entries",
                         (long long)nnz);
    m->nnz_cap = cap;
  }
  return KILN_OK;
}

void kiln_csr_free(kiln_csr *m) {
  if (!m) return;
  free(m->row_ptr);
  free(m->col);
  free(m->val);
  memset(m, 0, sizeof *m);
}

int64_t kiln_csr_bytes(const kiln_csr *m) {
  return (m->row_ptr ? (m->row_cap + 1) * (int64_t)sizeof(int64_t) : 0) +
         m->nnz_cap * (int64_t)(sizeof(int32_t) + sizeof(float));
}

int kiln_blob_make_sparse(kiln_blob *b) {
  if (!b->csr && !(b->csr = calloc(1, sizeof *b->csr)))
    return kiln_errorf(KILN_ERR_NOMEM, "blob '%s': out of memory", b->name);
  b->no_diff = true;
  return KILN_OK;
}

void kiln_blob_free(kiln_blob *b) {
  if (!b) return;
  if (b->csr) {
    kiln_csr_free(b->csr);
    free(b->csr);
  }
  if (b->owned) {
    if (!b->data_of) free_floats(b, b->data);
    if (!b->diff_borrowed) free_floats(b, b->diff);
  }
  free(b->name);
  free(b);
}

int kiln_blob_reshape(kiln_blob *b, int naxes, const int64_t *shape) {
  if (naxes < 0 || naxes > KILN_MAX_AXES)
    return kiln_errorf(KILN_ERR_SHAPE, "blob '%s': %d axes (at most %d)", b->name, naxes,
                       KILN_MAX_AXES);
  int64_t count = 1;
  for (int i = 0; i < naxes; i++) {
    if (shape[i] < 0)
      return kiln_errorf(KILN_ERR_SHAPE, "blob '%s': negative dimension %lld on axis %d", b->name,
                         (long long)shape[i], i);
    if (shape[i] > 0 && count > INT64_MAX / 4 / shape[i])
      return kiln_errorf(KILN_ERR_SHAPE, "blob '%s': too many elements", b->name);
    count *= shape[i];
  }
  b->naxes = naxes;
  for (int i = 0; i < naxes; i++) b->shape[i] = shape[i];
  b->count = count;
  if (b->defer_alloc) return KILN_OK;
  return kiln_blob_alloc(b);
}

int kiln_blob_alloc(kiln_blob *b) {
  /* A blob of no elements still gets storage (one float): its pointers are never NULL, which
   * the C library's copies and fills require even for 0 bytes. */
  int64_t count = b->count > 0 ? b->count : 1;
  b->defer_alloc = false;
  if (b->csr) return KILN_OK; /* its values are the CSR matrix's; the shape is nominal */
  if (b->data_of && b->owned) { /* the data is another blob's: follow it; only the diff here */
    if (b->count > b->data_of->count)
      return kiln_errorf(KILN_ERR_SHAPE, "blob '%s': %lld elements, more than the %lld of '%s' "
                         "whose data it shares", b->name, (long long)b->count,
                         (long long)b->data_of->count, b->data_of->name);
    b->data = b->data_of->data;
    if (b->diff_borrowed && count > b->diff_borrowed)
      return kiln_errorf(KILN_ERR_SHAPE,
                         "blob '%s': cannot grow to %lld elements past its planned %lld (its "
                         "gradient shares a buffer)",
                         b->name, (long long)count, (long long)b->diff_borrowed);
    if (!b->no_diff && !b->diff_borrowed && count > b->capacity) {
      float *g = alloc_floats(b, count);
      if (!g)
        return kiln_errorf(KILN_ERR_NOMEM, "blob '%s': cannot allocate %lld floats", b->name,
                           (long long)count);
      outgrown(b, b->diff);
      b->diff = g;
      b->capacity = count;
    }
    return KILN_OK;
  }
  if (b->owned && count > b->capacity) {
    if (b->diff_borrowed)
      return kiln_errorf(KILN_ERR_SHAPE,
                         "blob '%s': cannot grow to %lld elements past its planned %lld (its "
                         "gradient shares a buffer)",
                         b->name, (long long)count, (long long)b->capacity);
    float *d = alloc_floats(b, count);
    float *g = b->no_diff ? NULL : alloc_floats(b, count);
    if (!d || (!g && !b->no_diff)) {
      free_floats(b, d);
      free_floats(b, g);
      return kiln_errorf(KILN_ERR_NOMEM, "blob '%s': cannot allocate %lld floats", b->name,
                         (long long)count);
    }
    outgrown(b, b->data);
    outgrown(b, b->diff);
    b->data = d;
    b->diff = g;
    b->capacity = count;
  }
  return KILN_OK;
}

int kiln_blob_reshape_like(kiln_blob *b, const kiln_blob *other) {
  return kiln_blob_reshape(b, other->naxes, other->shape);
}

void kiln_blob_borrow_diff(kiln_blob *b, float *diff, int64_t floats) {
  if (!b->diff_borrowed) free_floats(b, b->diff);
  b->diff = diff;
  b->diff_borrowed = floats;
  b->no_diff = false;
}

void kiln_blob_set_view(kiln_blob *b, float *data, float *diff) {
  if (b->owned) {
    if (!b->data_of) free_floats(b, b->data);
    if (!b->diff_borrowed) free_floats(b, b->diff);
  }
  b->data_of = NULL;
  b->diff_borrowed = 0;
  b->owned = false;
  b->data = data;
  b->diff = diff;
  b->capacity = 0;
}

int64_t kiln_blob_count_range(const kiln_blob *b, int start, int end) {
  int64_t c = 1;
  for (int i = start; i < end && i < b->naxes; i++) c *= b->shape[i];
  return c;
}

int kiln_blob_canonical_axis(const kiln_blob *b, int axis, int *out) {
  int a = axis < 0 ? axis + b->naxes : axis;
  if (a < 0 || (a >= b->naxes && !(b->naxes == 0 && a == 0)))
    return kiln_errorf(KILN_ERR_SHAPE, "axis %d out of range for blob '%s' with %d axes", axis,
                       b->name, b->naxes);
  *out = a;
  return KILN_OK;
}

const char *kiln_blob_shape_string(const kiln_blob *b, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < b->naxes && used < n; i++)
    used += snprintf(buf + used, n - used, "%s%lld", i ? "x" : "", (long long)b->shape[i]);
  if (b->naxes == 0) snprintf(buf, n, "scalar");
  return buf;
}
