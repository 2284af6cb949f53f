/* Softmax over the middle axis of (outer, C, inner) data and its gradient. The maximum is
 * subtracted before exp so large inputs neither overflow nor lose the answer. */
#include <math.h>

#include "kiln/ops.h"

/* Below this many values a parallel region costs more than it saves. */
#define SOFTMAX_PARALLEL_MIN 16384

/* out, in are (outer, C, inner); each of the outer*inner columns of C values sums to 1. out may
 * alias in. */
void kiln_softmax_forward(float *out, const float *in, int64_t outer, int64_t C, int64_t inner) {
  const int64_t cols = outer * inner;
#pragma omp parallel for schedule(static) if (cols * C >= SOFTMAX_PARALLEL_MIN)
  for (int64_t j = 0; j < cols; j++) {
    const int64_t base = (j / inner) * C * inner + j % inner;
    const float *x = in + base;
    float *y = out + base;
    float mx = x[0];
    for (int64_t c = 1; c < C; c++)
      if (x[c * inner] > mx) mx = x[c * inner];
    float sum = 0.0f;
    for (int64_t c = 0; c < C; c++) {
      const float e = expf(x[c * inner] - mx);
      y[c * inner] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < C; c++) y[c * inner] *= inv;
  }
}

/* din = out * (dout - sum_c(dout * out)), all (outer, C, inner); din is overwritten and may alias
 * dout. */
void kiln_softmax_backward(float *din, const float *out, const float *dout, int64_t outer,
                           int64_t C, int64_t inner) {
  const int64_t cols = outer * inner;
#pragma omp parallel for schedule(static) if (cols * C >= SOFTMAX_PARALLEL_MIN)
  for (int64_t j = 0; j < cols; j++) {
    const int64_t base = (j / inner) * C * inner + j % inner;
    const float *y = out + base;
    const float *dy = dout + base;
    float *dx = din + base;
    float dot = 0.0f;
    for (int64_t c = 0; c < C; c++) dot += dy[c * inner] * y[c * inner];
    for (int64_t c = 0; c < C; c++) dx[c * inner] = y[c * inner] * (dy[c * inner] - dot);
  }
}
