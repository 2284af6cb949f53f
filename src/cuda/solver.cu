/* The solver family on the CUDA backend (KILN_OPS_SOLVER): the update rules one thread an
 * element, the reference's arithmetic (src/ops/solver.c) per element unchanged; the sum of
 * squares and the search for a value that is not finite as reductions over chunks of KCUDA_CHUNK
 * values, level by level, each chunk by one thread in order, so that the results depend on the
 * sizes only; the workers' sum as one addition a buffer, in rank order. */
#include "cuda/kcuda.h"

/* A reduction's levels: n values make ceil(n / KCUDA_CHUNK) chunk results, those again, until
 * one chunk is left. */
static int64_t kcuda_chunks(int64_t n) { return (n + KCUDA_CHUNK - 1) / KCUDA_CHUNK; }

/* The results of every level above n values, down to the level of one: the scratch a reduction
 * takes. */
static int64_t kcuda_level_total(int64_t n) {
  int64_t total = 0, m = n;
  do {
    m = kcuda_chunks(m);
    total += m;
  } while (m > 1);
  return total;
}

/* ---- clipping and regularisation ------------------------------------------------------------- */

KCUDA_GLOBAL void k_sumsq_chunks(double *part, const float *x, int64_t n) {
  KCUDA_FOR(p, (n + KCUDA_CHUNK - 1) / KCUDA_CHUNK) {
    const int64_t end = (p + 1) * KCUDA_CHUNK < n ? (p + 1) * KCUDA_CHUNK : n;
    double s = 0;
    for (int64_t i = p * KCUDA_CHUNK; i < end; i++) s += (double)x[i] * x[i];
    part[p] = s;
  }
}

KCUDA_GLOBAL void k_sum_chunks(double *out, const double *in, int64_t m) {
  KCUDA_FOR(p, (m + KCUDA_CHUNK - 1) / KCUDA_CHUNK) {
    const int64_t end = (p + 1) * KCUDA_CHUNK < m ? (p + 1) * KCUDA_CHUNK : m;
    double s = 0;
    for (int64_t i = p * KCUDA_CHUNK; i < end; i++) s += in[i];
    out[p] = s;
  }
}

/* The last level's sums onto sum[0], in order, by one thread. */
KCUDA_GLOBAL void k_sum_acc(double *sum, const double *in, int64_t m) {
  KCUDA_FOR(t, 1) {
    double s = 0;
    for (int64_t i = 0; i < m; i++) s += in[i];
    sum[0] += s;
  }
}

/* The chunks' sums added as a tree fixed by n: the reference's serial sum to within rounding
 * (the row asks 1e-12), and the same bits on every grid. */
KCUDA_OP(sumsq_acc)(const kiln_op_ctx *c, double *sum, const float *x, int64_t n) {
  if (n <= 0) return KILN_OK;
  void *sv;
  const int64_t first = kcuda_chunks(n);
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)kcuda_level_total(n), &sv));
  double *level = (double *)sv;
  KCUDA_LAUNCH(c, first, k_sumsq_chunks, level, x, n);
  int64_t m = first;
  while (kcuda_chunks(m) > 1) {
    double *next = level + m;
    KCUDA_LAUNCH(c, kcuda_chunks(m), k_sum_chunks, next, level, m);
    level = next;
    m = kcuda_chunks(m);
  }
  KCUDA_LAUNCH(c, 1, k_sum_acc, sum, level, m);
  return kcuda_launched(c, "sumsq_acc");
}

KCUDA_GLOBAL void k_regularize(float *g, const float *w, int64_t n, float norm, float wd,
                               bool l1) {
  KCUDA_FOR(i, n) {
    float gi = g[i];
    if (norm != 1.0f) gi *= norm;
    if (wd != 0) {
      if (l1)
        gi += wd * (float)((w[i] > 0) - (w[i] < 0));
      else
        gi += wd * w[i];
    }
    g[i] = gi;
  }
}

KCUDA_OP(regularize)(const kiln_op_ctx *c, float *g, const float *w, int64_t n, float norm,
                     float wd, bool l1) {
  if (norm == 1.0f && wd == 0) return KILN_OK;
  KCUDA_LAUNCH(c, n, k_regularize, g, w, n, norm, wd, l1);
  return kcuda_launched(c, "regularize");
}

/* ---- the update rules ------------------------------------------------------------------------ */

/* The flag: every thread that finds a weight not finite writes the same 1, so the result does
 * not depend on which, or on their order. */
KCUDA_GLOBAL void k_sgd_update(float *w, float *h, float *g, int32_t *bad, int64_t n, float norm,
                               float wd, float lr, float m) {
  KCUDA_FOR(i, n) {
    float gi = g[i];
    if (norm != 1.0f) gi *= norm;
    if (wd != 0) gi += wd * w[i];
    g[i] = gi;
    const float hi = m * h[i] + lr * gi;
    h[i] = hi;
    const float wi = w[i] - hi;
    w[i] = wi;
    if (!(fabsf(wi) <= FLT_MAX)) bad[0] = 1;
  }
}

KCUDA_OP(sgd_update)(const kiln_op_ctx *c, float *w, float *h, float *g, int32_t *bad, int64_t n,
                     float norm, float wd, float lr, float m) {
  KCUDA_LAUNCH(c, n, k_sgd_update, w, h, g, bad, n, norm, wd, lr, m);
  return kcuda_launched(c, "sgd_update");
}

KCUDA_GLOBAL void k_nesterov_update(float *w, float *h, const float *g, int64_t n, float lr,
                                    float m) {
  KCUDA_FOR(i, n) {
    const float old = h[i];
    const float hi = m * old + lr * g[i];
    h[i] = hi;
    w[i] -= (1 + m) * hi - m * old;
  }
}

KCUDA_OP(nesterov_update)(const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n,
                          float lr, float m) {
  KCUDA_LAUNCH(c, n, k_nesterov_update, w, h, g, n, lr, m);
  return kcuda_launched(c, "nesterov_update");
}

KCUDA_GLOBAL void k_adagrad_update(float *w, float *h, const float *g, int64_t n, float lr,
                                   float delta) {
  KCUDA_FOR(i, n) {
    const float hi = h[i] + g[i] * g[i];
    h[i] = hi;
    w[i] -= lr * g[i] / (sqrtf(hi) + delta);
  }
}

KCUDA_OP(adagrad_update)(const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n,
                         float lr, float delta) {
  KCUDA_LAUNCH(c, n, k_adagrad_update, w, h, g, n, lr, delta);
  return kcuda_launched(c, "adagrad_update");
}

KCUDA_GLOBAL void k_rmsprop_update(float *w, float *h, const float *g, int64_t n, float lr,
                                   float decay, float delta) {
  KCUDA_FOR(i, n) {
    const float hi = decay * h[i] + (1 - decay) * g[i] * g[i];
    h[i] = hi;
    w[i] -= lr * g[i] / (sqrtf(hi) + delta);
  }
}

KCUDA_OP(rmsprop_update)(const kiln_op_ctx *c, float *w, float *h, const float *g, int64_t n,
                         float lr, float decay, float delta) {
  KCUDA_LAUNCH(c, n, k_rmsprop_update, w, h, g, n, lr, decay, delta);
  return kcuda_launched(c, "rmsprop_update");
}

/* h: running mean of g^2; h2: running mean of squared updates (Caffe's update history). */
KCUDA_GLOBAL void k_adadelta_update(float *w, float *h, float *h2, const float *g, int64_t n,
                                    float lr, float m, float delta) {
  KCUDA_FOR(i, n) {
    const float hi = m * h[i] + (1 - m) * g[i] * g[i];
    h[i] = hi;
    const float u = g[i] * sqrtf((h2[i] + delta) / (hi + delta));
    h2[i] = m * h2[i] + (1 - m) * u * u;
    w[i] -= lr * u;
  }
}

KCUDA_OP(adadelta_update)(const kiln_op_ctx *c, float *w, float *h, float *h2, const float *g,
                          int64_t n, float lr, float m, float delta) {
  KCUDA_LAUNCH(c, n, k_adadelta_update, w, h, h2, g, n, lr, m, delta);
  return kcuda_launched(c, "adadelta_update");
}

/* The moments in double (b1 and b2 are), stored as floats, the step from the stored floats. */
KCUDA_GLOBAL void k_adam_update(float *w, float *h, float *h2, const float *g, int64_t n,
                                float lr, double b1, double b2, float delta) {
  KCUDA_FOR(i, n) {
    const float hi = (float)(b1 * h[i] + (1 - b1) * g[i]);
    const float h2i = (float)(b2 * h2[i] + (1 - b2) * g[i] * g[i]);
    h[i] = hi;
    h2[i] = h2i;
    w[i] -= lr * hi / (sqrtf(h2i) + delta);
  }
}

KCUDA_OP(adam_update)(const kiln_op_ctx *c, float *w, float *h, float *h2, const float *g,
                      int64_t n, float lr, double b1, double b2, float delta) {
  KCUDA_LAUNCH(c, n, k_adam_update, w, h, h2, g, n, lr, b1, b2, delta);
  return kcuda_launched(c, "adam_update");
}

/* ---- checks and sums ------------------------------------------------------------------------- */

/* Each chunk's first index of a value that is not finite (-1: none). */
KCUDA_GLOBAL void k_nonfinite_chunks(int64_t *first, const float *x, int64_t n) {
  KCUDA_FOR(p, (n + KCUDA_CHUNK - 1) / KCUDA_CHUNK) {
    const int64_t end = (p + 1) * KCUDA_CHUNK < n ? (p + 1) * KCUDA_CHUNK : n;
    int64_t at = -1;
    for (int64_t i = p * KCUDA_CHUNK; i < end && at < 0; i++)
      if (!(fabsf(x[i]) <= FLT_MAX)) at = i;
    first[p] = at;
  }
}

/* Each chunk of chunk results' first hit: the chunks are in index order, so the first hit of a
 * level is the first index of all. */
KCUDA_GLOBAL void k_first_hit(int64_t *out, const int64_t *in, int64_t m) {
  KCUDA_FOR(p, (m + KCUDA_CHUNK - 1) / KCUDA_CHUNK) {
    const int64_t end = (p + 1) * KCUDA_CHUNK < m ? (p + 1) * KCUDA_CHUNK : m;
    int64_t at = -1;
    for (int64_t i = p * KCUDA_CHUNK; i < end && at < 0; i++)
      if (in[i] >= 0) at = in[i];
    out[p] = at;
  }
}

/* Levels of chunks down to one value, written straight into at[0]. */
KCUDA_OP(find_nonfinite)(const kiln_op_ctx *c, int64_t *at, const float *x, int64_t n) {
  if (n <= 0) return kiln_device_set(c->device, at, 0xff, sizeof *at); /* every bit: -1 */
  const int64_t first = kcuda_chunks(n);
  if (first == 1) {
    KCUDA_LAUNCH(c, 1, k_nonfinite_chunks, at, x, n);
    return kcuda_launched(c, "find_nonfinite");
  }
  void *sv;
  KILN_TRY(kcuda_scratch(c, sizeof(int64_t) * (size_t)kcuda_level_total(n), &sv));
  int64_t *level = (int64_t *)sv;
  KCUDA_LAUNCH(c, first, k_nonfinite_chunks, level, x, n);
  int64_t m = first;
  while (kcuda_chunks(m) > 1) {
    int64_t *next = level + m;
    KCUDA_LAUNCH(c, kcuda_chunks(m), k_first_hit, next, level, m);
    level = next;
    m = kcuda_chunks(m);
  }
  KCUDA_LAUNCH(c, 1, k_first_hit, at, level, m);
  return kcuda_launched(c, "find_nonfinite");
}

KCUDA_GLOBAL void k_add_into(float *acc, const float *x, int64_t n) {
  KCUDA_FOR(i, n) acc[i] += x[i];
}

/* Each element one rounding an addition, in rank order into p[0], then p[0] copied to the
 * others: every buffer the same bits, the reference's. */
KCUDA_OP(ordered_sum)(const kiln_op_ctx *c, float *const *p, int np, int64_t n) {
  if (np <= 1 || n <= 0) return KILN_OK;
  for (int r = 1; r < np; r++) KCUDA_LAUNCH(c, n, k_add_into, p[0], p[r], n);
  KILN_TRY(kcuda_launched(c, "ordered_sum"));
  for (int r = 1; r < np; r++) KILN_TRY(KCUDA_FN(copy)(c, p[r], p[0], n));
  return KILN_OK;
}

KCUDA_REGISTER(solver) {
  b->sumsq_acc = KCUDA_FN(sumsq_acc);
  b->regularize = KCUDA_FN(regularize);
  b->sgd_update = KCUDA_FN(sgd_update);
  b->nesterov_update = KCUDA_FN(nesterov_update);
  b->adagrad_update = KCUDA_FN(adagrad_update);
  b->rmsprop_update = KCUDA_FN(rmsprop_update);
  b->adadelta_update = KCUDA_FN(adadelta_update);
  b->adam_update = KCUDA_FN(adam_update);
  b->find_nonfinite = KCUDA_FN(find_nonfinite);
  b->ordered_sum = KCUDA_FN(ordered_sum);
}
