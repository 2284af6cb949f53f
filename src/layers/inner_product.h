/* InnerProduct's state, shared by its dense path (inner_product.c) and its sparse one
 * (inner_product_sparse.c). */
#ifndef KILN_INNER_PRODUCT_H
#define KILN_INNER_PRODUCT_H

#include "layer_util.h"

typedef struct {
  int axis;
  int64_t M, K, N;
  bool bias, transpose;
  bool sparse; /* bottom 0 is a sparse blob (kiln_blob.csr) */
} ip_state;

/* y = X W^T + b with X the bottom's CSR rows; dW += dY^T X and db += the column sums of dY from
 * the same rows, never densifying X. */
int kiln_ip_sparse_forward(kiln_layer *l);
int kiln_ip_sparse_backward(kiln_layer *l);

#endif
