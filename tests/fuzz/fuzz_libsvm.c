/* The libsvm reader: the input's bytes as a file. The first byte picks `dim` (0: any index;
 * otherwise 1 to 255); what parses must be well-formed CSR: row pointers non-decreasing up to
 * the entry count, columns increasing within each row and below the column count, values and
 * labels finite. */
#include <math.h>
#include <stdlib.h>

#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int64_t dim = data[0];
  kiln_libsvm s;
  if (kiln_libsvm_parse((const char *)data + 1, size - 1, "fuzz.svm", dim, &s) != KILN_OK)
    return 0;
  const kiln_csr *x = &s.x;
  if (x->row_ptr[0] != 0 || x->row_ptr[x->rows] != x->nnz) abort();
  if (dim > 0 && x->cols != dim) abort();
  for (int64_t r = 0; r < x->rows; r++) {
    if (!isfinite(s.label[r]) || x->row_ptr[r + 1] < x->row_ptr[r]) abort();
    if (x->row_ptr[r + 1] - x->row_ptr[r] > s.max_row_nnz) abort();
    for (int64_t k = x->row_ptr[r]; k < x->row_ptr[r + 1]; k++) {
      if (x->col[k] < 0 || x->col[k] >= x->cols || !isfinite(x->val[k])) abort();
      if (k > x->row_ptr[r] && x->col[k] <= x->col[k - 1]) abort();
    }
  }
  kiln_libsvm_free(&s);
  return 0;
}
