/* The edit distance between two token sequences (include/kiln/data.h, kiln_edit_distance):
 * Levenshtein's, by the usual dynamic programme over one row of the table. A decoder's output
 * against its reference gives the token (phoneme) error rate: the total distance over the total
 * reference length. */
#include <stdlib.h>

#include "kiln/data.h"

int kiln_edit_distance(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t *out) {
  *out = 0;
  if (na == 0 || nb == 0) {
    *out = na + nb;
    return KILN_OK;
  }
  /* row[j]: the distance between a[0 .. i) and b[0 .. j) for the row i in hand */
  size_t *row = malloc((nb + 1) * sizeof *row);
  if (!row) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for an edit distance of %zu tokens", nb);
  for (size_t j = 0; j <= nb; j++) row[j] = j;
  for (size_t i = 1; i <= na; i++) {
    size_t diagonal = row[0]; /* the distance of a[0 .. i-1) and b[0 .. j-1) */
    row[0] = i;
    for (size_t j = 1; j <= nb; j++) {
      size_t up = row[j];
      size_t best = diagonal + (a[i - 1] != b[j - 1]); /* substitute (or keep) */
      if (up + 1 < best) best = up + 1;                /* delete a[i-1] */
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1; /* insert b[j-1] */
      row[j] = best;
      diagonal = up;
    }
  }
  *out = row[nb];
  free(row);
  return KILN_OK;
}
