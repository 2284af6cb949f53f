/* Blobs: shaped float tensors with data and gradient (Caffe's Blob), and the sparse (CSR) form
 * a blob may take. */
#ifndef KILN_BLOB_H
#define KILN_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_MAX_AXES 8

/* A sparse matrix in compressed sparse rows: row r's entries are col[k], val[k] for k in
 * row_ptr[r] .. row_ptr[r + 1), columns 0-based and increasing within a row. Capacities only
 * grow (kiln_csr_reserve), so refilling a matrix no larger than one seen before allocates
 * nothing. */
typedef struct kiln_csr {
  int64_t rows, cols, nnz;
  int64_t *row_ptr; /* rows + 1 */
  int32_t *col;
  float *val;
  int64_t row_cap, nnz_cap; /* allocated rows (row_ptr holds row_cap + 1) and entries */
} kiln_csr;

/* Room for `rows` rows and `nnz` entries (contents kept); KILN_ERR_NOMEM when it cannot. */
int kiln_csr_reserve(kiln_csr *m, int64_t rows, int64_t nnz);
void kiln_csr_free(kiln_csr *m);
/* Bytes the matrix holds allocated. */
int64_t kiln_csr_bytes(const kiln_csr *m);

/* A blob is an N-d float tensor with a gradient of the same shape (Caffe's Blob). Activations own
 * their memory; parameter blobs are views into the net's flat parameter and gradient buffers.
 * A sparse blob (csr non-NULL, kiln_blob_make_sparse) holds its values in that CSR matrix: its
 * shape (N x dim) is nominal, and it has no dense data or diff. */
typedef struct kiln_blob {
  char *name;
  int naxes;
  int64_t shape[KILN_MAX_AXES];
  int64_t count;
  float *data;
  float *diff;
  int64_t capacity; /* floats allocated when owned */
  bool owned;
  bool defer_alloc; /* reshape records the shape only; kiln_blob_alloc() allocates later */
  bool no_diff;     /* storage for data only (layer buffers: masks, caches); diff stays NULL */
  int64_t diff_borrowed; /* > 0: diff is someone else's buffer of this many floats (never freed
                            here; the blob cannot grow past it) */
  int layout; /* KILN_LAYOUT_* (include/kiln/layout.h): how data and diff are laid out; 0 plain */
  const struct kiln_blob *data_of; /* non-NULL: the data is that blob's (a Split's top reading
                                      its bottom's); only the diff is this blob's own */
  int id;                /* its index in its net's activation blobs; -1 for any other blob */
  kiln_csr *csr; /* non-NULL: a sparse blob; only layers whose table sets sparse_bottom read it */
  /* Where data and diff live (include/kiln/device.h); NULL: the host. Code other than its
   * backend's kernels moves values in and out only through the device's table. */
  const struct kiln_device *device;
  /* When set (host blobs): storage a reshape outgrows goes to retire(retire_user, p) instead of
   * being freed, and whoever set it frees it with kiln_free. The Python module keeps it until
   * the net is gone, because NumPy arrays made before the reshape may still point into it. */
  void (*retire)(void *user, void *p);
  void *retire_user;
} kiln_blob;

kiln_blob *kiln_blob_new(const char *name);
void kiln_blob_free(kiln_blob *b);
/* Sets the shape; an owned blob grows its storage when needed (new memory is zeroed) and keeps
 * it when shrinking, so steady-state reshapes never allocate. */
int kiln_blob_reshape(kiln_blob *b, int naxes, const int64_t *shape);
int kiln_blob_reshape_like(kiln_blob *b, const kiln_blob *other);
/* Allocates an owned blob's storage for its current shape (clears defer_alloc). */
int kiln_blob_alloc(kiln_blob *b);
/* Makes `b` a sparse blob (csr attached, empty; no dense data or diff ever allocated). */
int kiln_blob_make_sparse(kiln_blob *b);
/* Makes an owned blob's diff a borrowed buffer of `floats` (>= count) floats. */
void kiln_blob_borrow_diff(kiln_blob *b, float *diff, int64_t floats);
/* Makes `b` a view (no ownership) onto external data/diff. */
void kiln_blob_set_view(kiln_blob *b, float *data, float *diff);
/* Product of shape[start..end). */
int64_t kiln_blob_count_range(const kiln_blob *b, int start, int end);
/* Python-style negative axis to an index in [0, naxes); error if out of range. */
int kiln_blob_canonical_axis(const kiln_blob *b, int axis, int *out);
/* "64x20x24x24" */
const char *kiln_blob_shape_string(const kiln_blob *b, char *buf, size_t n);

#endif
