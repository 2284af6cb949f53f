/* The loss family's kernels: softmax over the middle axis of (outer, C, inner) data and its
 * gradient, and the arithmetic of the loss and metric layers (SoftmaxWithLoss, Accuracy, F1,
 * MultinomialLogisticLoss, InfogainLoss, HingeLoss, SigmoidCrossEntropyLoss, EuclideanLoss,
 * ContrastiveLoss). A loss is written into a one-value tensor, and a gradient reads the loss's
 * own gradient (the loss weight the net seeds) from one, so that no scalar has to cross to the
 * host. Every loss is one serial sum in a fixed order (double where the layers always summed in
 * double), so it does not depend on the thread count; the loops that go parallel (softmax's
 * columns, the element-wise gradients) write each output from one thread. A label that is no
 * class is KILN_ERR_DATA naming its position; the layer adds its own name. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kiln/ops.h"
#include "ops/kernels.h"

/* ---- softmax ------------------------------------------------------------------------------ */

/* Below this many values a parallel region costs more than it saves. */
#define SOFTMAX_PARALLEL_MIN 16384

/* The maximum is subtracted before exp so large inputs neither overflow nor lose the answer;
 * each of the outer*inner columns is one thread's. */
static void softmax_cols(int nthreads, float *out, const float *in, int64_t outer, int64_t C,
                         int64_t inner) {
  const int64_t cols = outer * inner;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (cols * C >= SOFTMAX_PARALLEL_MIN)
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

static void softmax_grad_cols(int nthreads, float *din, const float *out, const float *dout,
                              int64_t outer, int64_t C, int64_t inner) {
  const int64_t cols = outer * inner;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (cols * C >= SOFTMAX_PARALLEL_MIN)
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

static int threads_of(const kiln_op_ctx *c) { return c->nthreads > 0 ? c->nthreads : 1; }

int kiln_ref_softmax_fwd(const kiln_op_ctx *c, float *y, const float *x, int64_t outer,
                         int64_t C, int64_t inner) {
  softmax_cols(threads_of(c), y, x, outer, C, inner);
  return KILN_OK;
}

int kiln_ref_softmax_bwd(const kiln_op_ctx *c, float *dx, const float *y, const float *dy,
                         int64_t outer, int64_t C, int64_t inner) {
  softmax_grad_cols(threads_of(c), dx, y, dy, outer, C, inner);
  return KILN_OK;
}

/* ops.h's softmax, for callers outside a backend: the same arithmetic on OpenMP's default
 * threads. */
void kiln_softmax_forward(float *out, const float *in, int64_t outer, int64_t C, int64_t inner) {
  softmax_cols(omp_get_max_threads(), out, in, outer, C, inner);
}

void kiln_softmax_backward(float *din, const float *out, const float *dout, int64_t outer,
                           int64_t C, int64_t inner) {
  softmax_grad_cols(omp_get_max_threads(), din, out, dout, outer, C, inner);
}

/* ---- normalisers and labels --------------------------------------------------------------- */

/* What a loss over `full` positions, `batch` items and `valid` counted positions is divided by;
 * never less than 1 (Caffe: every label ignored gives loss 0, not NaN). */
static float normalizer(kiln_loss_norm norm, double full, int64_t batch, int64_t valid) {
  double n;
  switch (norm) {
    case KILN_LOSS_FULL: n = full; break;
    case KILN_LOSS_VALID: n = (double)valid; break;
    case KILN_LOSS_BATCH: n = (double)batch; break;
    default: n = 1; break;
  }
  return (float)(n < 1 ? 1 : n);
}

static int label_error(float v, int64_t pos, int64_t C) {
  return kiln_errorf(KILN_ERR_DATA,
                     "label %g at position %lld is out of range: expected an integer in [0, %lld)",
                     v, (long long)pos, (long long)C);
}

/* The class label[i] names in *lab (SoftmaxWithLoss, Accuracy, F1): -1 for the ignore_label
 * (when there is one), an error for anything that is no class in [0, C). */
static int softmax_class(const float *label, int64_t i, int64_t C, bool has_ignore, int ignore,
                         int *lab) {
  float lf = label[i];
  *lab = (int)lf;
  if (has_ignore && *lab == ignore) {
    *lab = -1;
    return KILN_OK;
  }
  if (lf != (float)*lab || *lab < 0 || *lab >= C) return label_error(lf, i, C);
  return KILN_OK;
}

/* The label v at pos as a class index in [0, C) (Caffe's other classification losses). */
static int item_class(float v, int64_t pos, int64_t C, int64_t *out) {
  const int64_t c = (int64_t)v;
  if (v != (float)c || c < 0 || c >= C) return label_error(v, pos, C);
  *out = c;
  return KILN_OK;
}

/* ---- SoftmaxWithLoss ---------------------------------------------------------------------- */

int kiln_ref_softmax_loss_fwd(const kiln_op_ctx *c, float *loss, const float *prob,
                              const float *label, int64_t outer, int64_t C, int64_t inner,
                              bool has_ignore, int ignore, kiln_loss_norm norm) {
  (void)c;
  double sum = 0;
  int64_t valid = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      int lab;
      int rc = softmax_class(label, o * inner + j, C, has_ignore, ignore, &lab);
      if (rc) return rc;
      if (lab < 0) continue;
      float pr = prob[(o * C + lab) * inner + j];
      sum -= log(pr < FLT_MIN ? FLT_MIN : pr); /* a NaN stays NaN, so divergence shows */
      valid++;
    }
  loss[0] = (float)(sum / normalizer(norm, (double)outer * inner, outer, valid));
  return KILN_OK;
}

int kiln_ref_softmax_loss_bwd(const kiln_op_ctx *c, float *dx, const float *prob,
                              const float *label, const float *dloss, int64_t outer, int64_t C,
                              int64_t inner, bool has_ignore, int ignore, kiln_loss_norm norm) {
  (void)c;
  const int64_t count = outer * C * inner;
  if (dx != prob && count > 0) memcpy(dx, prob, sizeof(float) * (size_t)count);
  int64_t valid = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      int lab = (int)label[o * inner + j];
      if (has_ignore && lab == ignore) {
        for (int64_t k = 0; k < C; k++) dx[(o * C + k) * inner + j] = 0;
        continue;
      }
      dx[(o * C + lab) * inner + j] -= 1;
      valid++;
    }
  float scale = dloss[0] / normalizer(norm, (double)outer * inner, outer, valid);
  for (int64_t i = 0; i < count; i++) dx[i] *= scale;
  return KILN_OK;
}

/* ---- Accuracy and F1 ---------------------------------------------------------------------- */

int kiln_ref_accuracy_fwd(const kiln_op_ctx *c, float *acc, float *per_class, float *class_count,
                          const float *x, const float *label, int64_t outer, int64_t C,
                          int64_t inner, int top_k, bool has_ignore, int ignore) {
  (void)c;
  int64_t correct = 0, count = 0;
  if (per_class)
    for (int64_t k = 0; k < C; k++) per_class[k] = class_count[k] = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      int lab;
      int rc = softmax_class(label, o * inner + j, C, has_ignore, ignore, &lab);
      if (rc) return rc;
      if (lab < 0) continue;
      /* Correct when fewer than top_k other classes score at least as high as the true one
       * (Caffe: a tie counts against the true class, so equal scores are not a hit). */
      float truth = x[(o * C + lab) * inner + j];
      unsigned higher = 0;
      for (int64_t k = 0; k < C; k++)
        if (k != lab && x[(o * C + k) * inner + j] >= truth) higher++;
      bool ok = higher < (unsigned)top_k;
      correct += ok;
      count++;
      if (per_class) {
        per_class[lab] += ok;
        class_count[lab]++;
      }
    }
  acc[0] = count ? (float)correct / count : 0.0f;
  if (per_class)
    for (int64_t k = 0; k < C; k++)
      per_class[k] = class_count[k] ? per_class[k] / class_count[k] : 0.0f;
  return KILN_OK;
}

int kiln_ref_f1_fwd(const kiln_op_ctx *c, float *tp, float *fp, float *fn, const float *x,
                    const float *label, int64_t outer, int64_t C, int64_t inner, int positive,
                    bool has_ignore, int ignore) {
  (void)c;
  int64_t ntp = 0, nfp = 0, nfn = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      int lab;
      int rc = softmax_class(label, o * inner + j, C, has_ignore, ignore, &lab);
      if (rc) return rc;
      if (lab < 0) continue;
      /* the top-1 class; among equal highest scores the first */
      const float *xc = x + o * C * inner + j;
      int64_t pred = 0;
      for (int64_t k = 1; k < C; k++)
        if (xc[k * inner] > xc[pred * inner]) pred = k;
      bool predicted = pred == positive, actual = lab == positive;
      ntp += predicted && actual;
      nfp += predicted && !actual;
      nfn += !predicted && actual;
    }
  tp[0] = (float)ntp;
  fp[0] = (float)nfp;
  fn[0] = (float)nfn;
  return KILN_OK;
}

/* ---- MultinomialLogisticLoss, InfogainLoss, HingeLoss ------------------------------------- */

#define LOG_THRESHOLD 1e-20f /* Caffe's kLOG_THRESHOLD */

int kiln_ref_multinomial_loss_fwd(const kiln_op_ctx *c, float *loss, const float *p,
                                  const float *label, int64_t N, int64_t dim) {
  (void)c;
  double sum = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t k = 0;
    int rc = item_class(label[n], n, dim, &k);
    if (rc) return rc;
    sum -= log(fmaxf(p[n * dim + k], LOG_THRESHOLD));
  }
  loss[0] = (float)(sum / (double)(N ? N : 1));
  return KILN_OK;
}

int kiln_ref_multinomial_loss_bwd(const kiln_op_ctx *c, float *dp, const float *p,
                                  const float *label, const float *dloss, int64_t N,
                                  int64_t dim) {
  (void)c;
  if (N * dim > 0) memset(dp, 0, sizeof(float) * (size_t)(N * dim));
  const float scale = -dloss[0] / (float)(N ? N : 1);
  for (int64_t n = 0; n < N; n++) {
    int64_t k = 0;
    int rc = item_class(label[n], n, dim, &k);
    if (rc) return rc;
    dp[n * dim + k] = scale / fmaxf(p[n * dim + k], LOG_THRESHOLD);
  }
  return KILN_OK;
}

/* InfogainLoss's test of an ignored label: its integer part, as Caffe casts it. */
static bool infogain_ignored(float v, bool has_ignore, int ignore) {
  return has_ignore && (int)v == ignore;
}

int kiln_ref_infogain_loss_fwd(const kiln_op_ctx *c, float *loss, const float *prob,
                               const float *label, const float *H, int64_t outer, int64_t C,
                               int64_t inner, bool has_ignore, int ignore, kiln_loss_norm norm) {
  (void)c;
  double sum = 0;
  int64_t valid = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      const int64_t pos = o * inner + j;
      if (infogain_ignored(label[pos], has_ignore, ignore)) continue;
      int64_t l = 0;
      int rc = item_class(label[pos], pos, C, &l);
      if (rc) return rc;
      for (int64_t k = 0; k < C; k++)
        sum -= H[l * C + k] * log(fmaxf(prob[(o * C + k) * inner + j], LOG_THRESHOLD));
      valid++;
    }
  loss[0] = (float)(sum / normalizer(norm, (double)(outer * inner), outer, valid));
  return KILN_OK;
}

int kiln_ref_infogain_loss_bwd(const kiln_op_ctx *c, float *dx, const float *prob,
                               const float *label, const float *H, const float *dloss,
                               int64_t outer, int64_t C, int64_t inner, bool has_ignore,
                               int ignore, kiln_loss_norm norm) {
  (void)c;
  int64_t valid = 0;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      const int64_t pos = o * inner + j;
      if (infogain_ignored(label[pos], has_ignore, ignore)) {
        for (int64_t k = 0; k < C; k++) dx[(o * C + k) * inner + j] = 0;
        continue;
      }
      int64_t l = 0;
      int rc = item_class(label[pos], pos, C, &l);
      if (rc) return rc;
      const float *row = H + l * C;
      float row_sum = 0;
      for (int64_t k = 0; k < C; k++) row_sum += row[k];
      for (int64_t k = 0; k < C; k++) {
        const int64_t i = (o * C + k) * inner + j;
        dx[i] = prob[i] * row_sum - row[k];
      }
      valid++;
    }
  const float scale = dloss[0] / normalizer(norm, (double)(outer * inner), outer, valid);
  for (int64_t i = 0; i < outer * C * inner; i++) dx[i] *= scale;
  return KILN_OK;
}

/* max(0, 1 + s x) for score x of class k, with s = -1 for the true class l. */
static inline float hinge_margin(float x, int64_t k, int64_t l) {
  const float v = 1 + (k == l ? -x : x);
  return v > 0 ? v : 0;
}

int kiln_ref_hinge_loss_fwd(const kiln_op_ctx *c, float *loss, const float *x,
                            const float *label, int64_t N, int64_t dim, bool l2) {
  (void)c;
  double sum = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t l = 0;
    int rc = item_class(label[n], n, dim, &l);
    if (rc) return rc;
    for (int64_t k = 0; k < dim; k++) {
      const float m = hinge_margin(x[n * dim + k], k, l);
      sum += l2 ? (double)m * m : m;
    }
  }
  loss[0] = (float)(sum / (double)(N ? N : 1));
  return KILN_OK;
}

int kiln_ref_hinge_loss_bwd(const kiln_op_ctx *c, float *dx, const float *x, const float *label,
                            const float *dloss, int64_t N, int64_t dim, bool l2) {
  (void)c;
  const float scale = dloss[0] / (float)(N ? N : 1) * (l2 ? 2 : 1);
  for (int64_t n = 0; n < N; n++) {
    int64_t l = 0;
    int rc = item_class(label[n], n, dim, &l);
    if (rc) return rc;
    float *d = dx + n * dim;
    for (int64_t k = 0; k < dim; k++) {
      const float m = hinge_margin(x[n * dim + k], k, l);
      const float g = l2 ? m : (float)(m > 0);
      d[k] = (k == l ? -g : g) * scale;
    }
  }
  return KILN_OK;
}

/* ---- SigmoidCrossEntropyLoss -------------------------------------------------------------- */

/* (int)target == ignore, without the undefined cast of an out-of-range target. */
static inline bool sce_ignored(float target, bool has_ignore, int ignore) {
  return has_ignore && trunc((double)target) == (double)ignore;
}

int kiln_ref_sigmoid_ce_fwd(const kiln_op_ctx *c, float *loss, const float *x, const float *t,
                            int64_t n, int64_t batch, bool has_ignore, int ignore,
                            kiln_loss_norm norm) {
  (void)c;
  int64_t valid = 0;
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    if (sce_ignored(t[i], has_ignore, ignore)) continue;
    double xi = x[i];
    sum += (xi > 0 ? xi : 0) - xi * t[i] + log1p(exp(-fabs(xi)));
    valid++;
  }
  loss[0] = (float)(sum / normalizer(norm, (double)n, batch, valid));
  return KILN_OK;
}

int kiln_ref_sigmoid_ce_bwd(const kiln_op_ctx *c, float *dx, const float *x, const float *t,
                            const float *dloss, int64_t n, int64_t batch, bool has_ignore,
                            int ignore, kiln_loss_norm norm) {
  int64_t valid = 0; /* forward's count again: only VALID divides by it */
  if (norm == KILN_LOSS_VALID)
    for (int64_t i = 0; i < n; i++) valid += !sce_ignored(t[i], has_ignore, ignore);
  const float scale = dloss[0] / normalizer(norm, (double)n, batch, valid);
#pragma omp parallel for schedule(static) num_threads(threads_of(c)) if (n > KILN_PARALLEL_FROM)
  for (int64_t i = 0; i < n; i++) {
    float sig = 0.5f * tanhf(0.5f * x[i]) + 0.5f;
    dx[i] = sce_ignored(t[i], has_ignore, ignore) ? 0.0f : (sig - t[i]) * scale;
  }
  return KILN_OK;
}

/* ---- EuclideanLoss, ContrastiveLoss ------------------------------------------------------- */

int kiln_ref_euclidean_loss_fwd(const kiln_op_ctx *c, float *loss, const float *a,
                                const float *b, int64_t n, int64_t N) {
  (void)c;
  double sum = 0; /* one thread, so the loss does not depend on the thread count */
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    sum += d * d;
  }
  loss[0] = (float)(sum / (double)N / 2.0);
  return KILN_OK;
}

int kiln_ref_euclidean_loss_bwd(const kiln_op_ctx *c, float *da, float *db, const float *a,
                                const float *b, const float *dloss, int64_t n, int64_t N) {
  const float scale = dloss[0] / (float)N;
  for (int k = 0; k < 2; k++) {
    float *dx = k == 0 ? da : db;
    if (!dx) continue;
    const float alpha = k == 0 ? scale : -scale;
#pragma omp parallel for schedule(static) num_threads(threads_of(c)) if (n > KILN_PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) dx[i] = alpha * (a[i] - b[i]);
  }
  return KILN_OK;
}

int kiln_ref_contrastive_loss_fwd(const kiln_op_ctx *c, float *loss, float *dist_sq,
                                  const float *a, const float *b, const float *sim, int64_t N,
                                  int64_t C, float margin, bool legacy) {
  (void)c;
  double sum = 0;
  for (int64_t n = 0; n < N; n++) {
    double d2 = 0;
    for (int64_t k = 0; k < C; k++) {
      const float d = a[n * C + k] - b[n * C + k];
      d2 += (double)d * d;
    }
    dist_sq[n] = (float)d2;
    if ((int)sim[n]) {
      sum += dist_sq[n];
    } else if (legacy) {
      sum += fmaxf(margin - dist_sq[n], 0);
    } else {
      const float m = fmaxf(margin - sqrtf(dist_sq[n]), 0);
      sum += (double)m * m;
    }
  }
  loss[0] = (float)(sum / (double)(N ? N : 1) / 2);
  return KILN_OK;
}

int kiln_ref_contrastive_loss_bwd(const kiln_op_ctx *c, float *da, float *db, const float *a,
                                  const float *b, const float *sim, const float *dist_sq,
                                  const float *dloss, int64_t N, int64_t C, float margin,
                                  bool legacy) {
  (void)c;
  for (int i = 0; i < 2; i++) {
    float *dx = i == 0 ? da : db;
    if (!dx) continue;
    const float alpha = (i == 0 ? 1 : -1) * dloss[0] / (float)(N ? N : 1);
    for (int64_t n = 0; n < N; n++) {
      float beta;
      if ((int)sim[n]) {
        beta = alpha;
      } else if (legacy) {
        beta = margin - dist_sq[n] > 0 ? -alpha : 0;
      } else {
        const float dist = sqrtf(dist_sq[n]), mdist = margin - dist;
        beta = mdist > 0 ? -alpha * mdist / (dist + 1e-4f) : 0;
      }
      for (int64_t k = 0; k < C; k++) dx[n * C + k] = beta * (a[n * C + k] - b[n * C + k]);
    }
  }
  return KILN_OK;
}
