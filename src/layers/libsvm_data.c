/* LibSVMData: the records of a libsvm (svmlight) file as sparse batches (kiln's own layer;
 * docs/formats.md, "libsvm"). Top 0 is a sparse blob of batch_size x dim (kiln_blob.csr: the
 * batch's rows in CSR, no dense values) for an InnerProduct; top 1, when asked for, the labels
 * as written. The whole file is read when the net is built (kiln_libsvm_read: memory follows
 * its entries), and a batch is a copy of its records' rows into the top's matrix, whose
 * capacity is reserved then for the fullest possible batch (batch_size x the fullest row), so
 * no batch allocates. Batches run on across epochs (WRAP); their order, the shuffle from
 * (seed, epoch), the workers' shares and the cursor for exact resume follow the Data layer's
 * rules (data.c), through the share TextData uses too (kiln_batch_share). */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/data.h"
#include "layer_util.h"

static const Caffe__LibSVMDataParameter libsvm_defaults = CAFFE__LIB_SVMDATA_PARAMETER__INIT;

typedef struct {
  char source[4096];
  int batch;
  int64_t dim;
  kiln_libsvm file;
  kiln_record_order order;
  kiln_batch_share share;
  kiln_stage stage; /* the label top on a device is filled here, then handed over */
} libsvm_state;

static int libsvm_setup(kiln_layer *l) {
  const Caffe__LibSVMDataParameter *p = KILN_PARAM_OR(l->lp->libsvm_data_param, libsvm_defaults);
  libsvm_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  if (!p->source || !p->source[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "libsvm_data_param.source is required");
  if (!p->has_batch_size)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "libsvm_data_param.batch_size must be set, 1 to %u", 1u << 20);
  if (p->batch_size == 0 || p->batch_size > 1u << 20)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "libsvm_data_param.batch_size %u is out of range: 1 to %u",
                            p->batch_size, 1u << 20);
  if (!p->has_dim)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "libsvm_data_param.dim (the feature count) must be set, 1 to %d",
                            KILN_LIBSVM_MAX_DIM);
  if (p->dim == 0 || p->dim > KILN_LIBSVM_MAX_DIM)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "libsvm_data_param.dim (the feature count) %lld is out of range: 1 "
                            "to %d", (long long)p->dim, KILN_LIBSVM_MAX_DIM);
  s->batch = (int)p->batch_size;
  s->dim = p->dim;
  KILN_TRY(kiln_data_source_path(l->config, p->source, s->source, sizeof s->source));
  int rc = kiln_libsvm_read(s->source, s->dim, &s->file);
  if (rc) return kiln_error_context(rc, "layer '%s' (LibSVMData): ", l->name);
  if (s->file.x.rows == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "%s: no records", s->source);
  if (p->shuffle && (uint64_t)s->file.x.rows > UINT32_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 records");
  KILN_TRY(kiln_blob_make_sparse(l->top[0]));
  KILN_TRY(kiln_csr_reserve(l->top[0]->csr, s->batch, (int64_t)s->batch * s->file.max_row_nnz));
  /* the file's rows, held for the whole run */
  l->extra_bytes = kiln_csr_bytes(&s->file.x) + s->file.x.rows * (int64_t)sizeof(float);
  uint64_t n = (uint64_t)s->file.x.rows;
  s->share.stream = (kiln_batch_stream){.size = n, .batch = s->batch,
                                        .last_batch = KILN_LAST_BATCH_WRAP};
  s->order = (kiln_record_order){.seed = l->seed, .size = n, .shuffle = p->shuffle};
  return KILN_OK;
}

static int libsvm_reshape(kiln_layer *l) {
  libsvm_state *s = l->priv;
  int64_t shape[2] = {s->batch, s->dim}, n[1] = {s->batch};
  KILN_TRY(kiln_blob_reshape(l->top[0], 2, shape));
  return l->ntop > 1 ? kiln_blob_reshape(l->top[1], 1, n) : KILN_OK;
}

static int libsvm_fill(kiln_layer *l) {
  libsvm_state *s = l->priv;
  uint64_t first = 0;
  int count = 0;
  KILN_TRY(kiln_batch_share_next(l, &s->share, &first, &count));
  const kiln_csr *f = &s->file.x;
  kiln_csr *x = l->top[0]->csr;
  x->rows = count;
  x->cols = s->dim;
  x->nnz = 0;
  x->row_ptr[0] = 0;
  for (int n = 0; n < count; n++) {
    uint64_t r = 0;
    KILN_TRY(kiln_record_order_index(&s->order, first + (uint64_t)n, &r));
    for (int64_t k = f->row_ptr[r]; k < f->row_ptr[r + 1]; k++) {
      x->col[x->nnz] = f->col[k];
      x->val[x->nnz++] = f->val[k];
    }
    x->row_ptr[n + 1] = x->nnz;
    if (l->ntop > 1) l->top[1]->data[n] = s->file.label[r];
  }
  return KILN_OK;
}

/* The sparse top's CSR arrays stay in host memory (the CSR kernels of every backend read them
 * there); only the label top is staged. */
static int libsvm_forward(kiln_layer *l) {
  libsvm_state *s = l->priv;
  KILN_TRY(kiln_stage_begin(l, &s->stage));
  int rc = libsvm_fill(l);
  int rc2 = kiln_stage_end(l, &s->stage);
  return rc ? rc : rc2;
}

static uint64_t libsvm_get_cursor(kiln_layer *l) {
  libsvm_state *s = l->priv;
  return kiln_batch_share_cursor(&s->share);
}

static int libsvm_set_cursor(kiln_layer *l, uint64_t cursor) {
  libsvm_state *s = l->priv;
  kiln_batch_share_set_cursor(&s->share, cursor);
  return KILN_OK;
}

/* The file, whole: workers on several hosts must read the same records. */
static int libsvm_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  libsvm_state *s = l->priv;
  char hex[65];
  int rc = kiln_sha256_file(s->source, hex);
  if (rc) return kiln_error_context(rc, "layer '%s' (LibSVMData): ", l->name);
  kiln_sha256(hex, 64, digest);
  snprintf(what, n, "%s (compared whole)", s->source);
  return KILN_OK;
}

static void libsvm_destroy(kiln_layer *l) {
  libsvm_state *s = l->priv;
  if (!s) return;
  kiln_libsvm_free(&s->file);
  kiln_record_order_free(&s->order);
  kiln_stage_free(&s->stage);
  free(s);
}

const kiln_layer_ops kiln_layer_libsvm_data = {
    .type = "LibSVMData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 2,
    .is_data = true, .setup = libsvm_setup, .reshape = libsvm_reshape, .forward = libsvm_forward,
    .destroy = libsvm_destroy, .get_cursor = libsvm_get_cursor, .set_cursor = libsvm_set_cursor,
    .fingerprint = libsvm_fingerprint, .kernels = KILN_NO_KERNELS,
};
