/* The element-wise family on the CUDA backend (KILN_OPS_ELEMENTWISE): one thread an element. */
#include "cuda/kcuda.h"

KCUDA_GLOBAL void k_copy(float *y, const float *x, int64_t n) {
  KCUDA_FOR(i, n) y[i] = x[i];
}

KCUDA_OP(copy)(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  if (y == x || n <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, n, k_copy, y, x, n);
  return kcuda_launched(c, "copy");
}

KCUDA_GLOBAL void k_relu_fwd(float *y, const float *x, int64_t n, float slope) {
  KCUDA_FOR(i, n) y[i] = x[i] > 0 ? x[i] : slope * x[i];
}

KCUDA_OP(relu_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n, float slope) {
  KCUDA_LAUNCH(c, n, k_relu_fwd, y, x, n, slope);
  return kcuda_launched(c, "relu_fwd");
}

KCUDA_GLOBAL void k_relu_bwd(float *dx, const float *dy, const float *v, int64_t n, float slope) {
  KCUDA_FOR(i, n) dx[i] = v[i] > 0 ? dy[i] : slope * dy[i];
}

KCUDA_OP(relu_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *v, int64_t n,
                   float slope) {
  KCUDA_LAUNCH(c, n, k_relu_bwd, dx, dy, v, n, slope);
  return kcuda_launched(c, "relu_bwd");
}

/* The logistic function through tanh, as the host's: no overflow of e^-x for large |x|. */
KCUDA_GLOBAL void k_sigmoid_fwd(float *y, const float *x, int64_t n) {
  KCUDA_FOR(i, n) y[i] = 0.5f * tanhf(0.5f * x[i]) + 0.5f;
}

KCUDA_OP(sigmoid_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  KCUDA_LAUNCH(c, n, k_sigmoid_fwd, y, x, n);
  return kcuda_launched(c, "sigmoid_fwd");
}

KCUDA_GLOBAL void k_sigmoid_bwd(float *dx, const float *dy, const float *y, int64_t n) {
  KCUDA_FOR(i, n) dx[i] = dy[i] * y[i] * (1 - y[i]);
}

KCUDA_OP(sigmoid_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n) {
  KCUDA_LAUNCH(c, n, k_sigmoid_bwd, dx, dy, y, n);
  return kcuda_launched(c, "sigmoid_bwd");
}

KCUDA_GLOBAL void k_tanh_fwd(float *y, const float *x, int64_t n) {
  KCUDA_FOR(i, n) y[i] = tanhf(x[i]);
}

KCUDA_OP(tanh_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t n) {
  KCUDA_LAUNCH(c, n, k_tanh_fwd, y, x, n);
  return kcuda_launched(c, "tanh_fwd");
}

KCUDA_GLOBAL void k_tanh_bwd(float *dx, const float *dy, const float *y, int64_t n) {
  KCUDA_FOR(i, n) dx[i] = dy[i] * (1 - y[i] * y[i]);
}

KCUDA_OP(tanh_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n) {
  KCUDA_LAUNCH(c, n, k_tanh_bwd, dx, dy, y, n);
  return kcuda_launched(c, "tanh_bwd");
}

/* The draws are the host generator's, in order, as on the CPU: a snapshot's generator state then
 * resumes the same masks on either device, and a run on the GPU drops the units the host would.
 * The mask goes over in one copy from pinned memory. */
KCUDA_OP(dropout_mask)(const kiln_op_ctx *c, float *mask, int64_t n, float ratio, float scale,
                       kiln_rng *rng) {
  if (n <= 0) return KILN_OK;
  void *hv;
  KILN_TRY(kcuda_host_scratch(c, sizeof(float) * (size_t)n, &hv));
  float *h = (float *)hv;
  for (int64_t i = 0; i < n; i++) h[i] = kiln_rng_uniform(rng, 0, 1) >= ratio ? scale : 0.0f;
  return kiln_device_to_device(c->device, mask, h, sizeof(float) * (size_t)n);
}

KCUDA_GLOBAL void k_mul(float *y, const float *a, const float *b, int64_t n) {
  KCUDA_FOR(i, n) y[i] = a[i] * b[i];
}

KCUDA_OP(mul)(const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n) {
  KCUDA_LAUNCH(c, n, k_mul, y, a, b, n);
  return kcuda_launched(c, "mul");
}

KCUDA_REGISTER(elementwise) {
  b->copy = KCUDA_FN(copy);
  b->relu_fwd = KCUDA_FN(relu_fwd);
  b->relu_bwd = KCUDA_FN(relu_bwd);
  b->sigmoid_fwd = KCUDA_FN(sigmoid_fwd);
  b->sigmoid_bwd = KCUDA_FN(sigmoid_bwd);
  b->tanh_fwd = KCUDA_FN(tanh_fwd);
  b->tanh_bwd = KCUDA_FN(tanh_bwd);
  b->dropout_mask = KCUDA_FN(dropout_mask);
  b->mul = KCUDA_FN(mul);
}
