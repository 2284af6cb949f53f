/* kiln backends: the kernels a net runs, as one table of functions per backend.
 *
 * An op is one kernel contract in the style of ops.h: outputs first, then inputs, then sizes and
 * settings; no allocation (the caller passes workspace); an int status (KILN_OK). Every op takes
 * an op context first: the threads it may use and the configuration, and the device its memory
 * is on. KILN_OP_LIST names every op once, with its parameters; the backend table has one
 * pointer per op (NULL where a backend lacks it), and the op ids, names and the check that a
 * backend has an op come from the same list, as do the tests (tests/test_backend_ops.c has a
 * row for every op and fails for an op without one).
 *
 * The backends:
 *   - "ref": the reference kernels, plain C (kiln's im2col + GEMM convolutions, the serial
 *     loops): KILN_ENGINE=ref;
 *   - "cpu": the optimised CPU kernels (oneDNN, shifted-row convolutions, OpenMP loops), the
 *     default; where an op has no faster form it is the reference's;
 *   - "hostsim": the cpu kernels on the hostsim device (include/kiln/device.h), each call
 *     between the device's enter and leave: the host behind a device's walls, for tests.
 * A layer reaches its kernels only through the table its net chose (kiln_layer.backend), by
 * device and engine; a layer type whose kernels the table lacks is refused when the net is
 * built, naming the layer and the backend. */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/config.h"
#include "kiln/core.h"
#include "kiln/device.h"

/* What every op is told besides its tensors. */
typedef struct kiln_op_ctx {
  int nthreads;              /* OpenMP threads the op may use (1: none) */
  const kiln_config *config; /* never NULL */
  const kiln_device *device; /* where its tensors are */
} kiln_op_ctx;

/* Every op: X(name, parameters, arguments). The arguments repeat the parameters' names, so that
 * a wrapper (hostsim's) can pass a call on. */
#define KILN_OP_LIST(X)                                                                         \
  /* y = x (n floats; y may be x) */                                                           \
  X(copy, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))           \
  /* y = x > 0 ? x : slope x */                                                                \
  X(relu_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n, float slope),        \
    (c, y, x, n, slope))                                                                       \
  /* dx = v > 0 ? dy : slope dy, v the input or (in place, slope >= 0) the output */           \
  X(relu_bwd,                                                                                  \
    (const kiln_op_ctx *c, float *dx, const float *dy, const float *v, int64_t n, float slope), \
    (c, dx, dy, v, n, slope))                                                                  \
  /* y = 1 / (1 + e^-x) */                                                                     \
  X(sigmoid_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))    \
  /* dx = dy y (1 - y) */                                                                      \
  X(sigmoid_bwd, (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n), \
    (c, dx, dy, y, n))                                                                         \
  /* y = tanh x */                                                                             \
  X(tanh_fwd, (const kiln_op_ctx *c, float *y, const float *x, int64_t n), (c, y, x, n))       \
  /* dx = dy (1 - y^2) */                                                                      \
  X(tanh_bwd, (const kiln_op_ctx *c, float *dx, const float *dy, const float *y, int64_t n),   \
    (c, dx, dy, y, n))                                                                         \
  /* mask[i] = (uniform draw from rng >= ratio) ? scale : 0, n draws in order */               \
  X(dropout_mask,                                                                              \
    (const kiln_op_ctx *c, float *mask, int64_t n, float ratio, float scale, kiln_rng *rng),    \
    (c, mask, n, ratio, scale, rng))                                                           \
  /* y = a * b element by element (y may be a or b) */                                         \
  X(mul, (const kiln_op_ctx *c, float *y, const float *a, const float *b, int64_t n),          \
    (c, y, a, b, n))

#define KILN_OP_FIELD_(name, params, args) int(*name) params;
typedef struct kiln_backend {
  const char *name;          /* "ref", "cpu", "hostsim" */
  const kiln_device *device; /* where its kernels' tensors are */
  KILN_OP_LIST(KILN_OP_FIELD_)
} kiln_backend;
#undef KILN_OP_FIELD_

#define KILN_OP_ID_(name, params, args) KILN_OP_##name,
enum { KILN_OP_LIST(KILN_OP_ID_) KILN_OP_COUNT };
#undef KILN_OP_ID_

/* The op's name ("relu_fwd"); NULL for an id past the list. */
const char *kiln_op_name(int op);
/* Whether the backend has a kernel for op. */
bool kiln_backend_has(const kiln_backend *b, int op);

const kiln_backend *kiln_backend_ref(void);
const kiln_backend *kiln_backend_cpu(void);
const kiln_backend *kiln_backend_hostsim(void);
/* The table for a device and an engine: the host's cpu or ref, hostsim's (which runs the cpu
 * kernels whatever the engine); NULL for a device without one. */
const kiln_backend *kiln_backend_for(const kiln_device *d, kiln_engine e);

/* A layer's kernels (kiln_layer_ops.kernels): op ids, KILN_KERNELS_END last. */
#define KILN_KERNELS_END (-1)
#define KILN_KERNELS(...) ((const int[]){__VA_ARGS__, KILN_KERNELS_END})

#endif
