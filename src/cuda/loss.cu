/* The loss family on the CUDA backend (KILN_OPS_LOSS): softmax one thread a column, the losses
 * and metrics as one thread an item writing its term (in double where the reference sums in
 * double) and its label's state into scratch, then chunk sums in order and one thread adding
 * the chunks, so that a loss does not depend on the grid. A label that is no class is found the
 * same way (the first bad position is the least index of the first chunk holding one); the op
 * reads it back and refuses the data with the reference's message, so an op that checks labels
 * waits for its kernels. */
#include "cuda/kcuda.h"

/* ---- softmax ------------------------------------------------------------------------------ */

/* The maximum is subtracted before exp so large inputs neither overflow nor lose the answer; the
 * column's own values only, so y may be x. */
KCUDA_GLOBAL void k_softmax_fwd(float *y, const float *x, int64_t outer, int64_t C,
                                int64_t inner) {
  KCUDA_FOR(col, outer * inner) {
    const int64_t base = (col / inner) * C * inner + col % inner;
    const float *xc = x + base;
    float *yc = y + base;
    float mx = xc[0];
    for (int64_t k = 1; k < C; k++)
      if (xc[k * inner] > mx) mx = xc[k * inner];
    float sum = 0.0f;
    for (int64_t k = 0; k < C; k++) {
      const float e = expf(xc[k * inner] - mx);
      yc[k * inner] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
    for (int64_t k = 0; k < C; k++) yc[k * inner] *= inv;
  }
}

KCUDA_OP(softmax_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t outer, int64_t C,
                      int64_t inner) {
  if (C <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, outer * inner, k_softmax_fwd, y, x, outer, C, inner);
  return kcuda_launched(c, "softmax_fwd");
}

KCUDA_GLOBAL void k_softmax_bwd(float *dx, const float *y, const float *dy, int64_t outer,
                                int64_t C, int64_t inner) {
  KCUDA_FOR(col, outer * inner) {
    const int64_t base = (col / inner) * C * inner + col % inner;
    const float *yc = y + base, *dyc = dy + base;
    float *dxc = dx + base;
    float dot = 0.0f;
    for (int64_t k = 0; k < C; k++) dot += dyc[k * inner] * yc[k * inner];
    for (int64_t k = 0; k < C; k++) dxc[k * inner] = yc[k * inner] * (dyc[k * inner] - dot);
  }
}

KCUDA_OP(softmax_bwd)(const kiln_op_ctx *c, float *dx, const float *y, const float *dy,
                      int64_t outer, int64_t C, int64_t inner) {
  if (C <= 0) return KILN_OK;
  KCUDA_LAUNCH(c, outer * inner, k_softmax_bwd, dx, y, dy, outer, C, inner);
  return kcuda_launched(c, "softmax_bwd");
}

/* ---- normalisers and labels --------------------------------------------------------------- */

/* What a loss is divided by, as the reference's: never less than 1. */
KCUDA_DEV float normalizer(kiln_loss_norm norm, double full, int64_t batch, int64_t valid) {
  double n;
  switch (norm) {
    case KILN_LOSS_FULL: n = full; break;
    case KILN_LOSS_VALID: n = (double)valid; break;
    case KILN_LOSS_BATCH: n = (double)batch; break;
    default: n = 1; break;
  }
  return (float)(n < 1 ? 1 : n);
}

/* A position's label: counted, ignored, or no class (the op refuses the data). */
enum { LABEL_COUNTED = 0, LABEL_IGNORED = 1, LABEL_BAD = 2 };

/* SoftmaxWithLoss, Accuracy and F1: the ignore_label first, then a class in [0, C). */
KCUDA_DEV int softmax_label(float lf, int64_t C, bool has_ignore, int ignore, int *lab) {
  *lab = (int)lf;
  if (has_ignore && *lab == ignore) return LABEL_IGNORED;
  if (lf != (float)*lab || *lab < 0 || *lab >= C) return LABEL_BAD;
  return LABEL_COUNTED;
}

/* The other classification losses: an integer class in [0, C), through int64 as the
 * reference's. */
KCUDA_DEV int item_label(float v, int64_t C, int64_t *cls) {
  *cls = (int64_t)v;
  return v != (float)*cls || *cls < 0 || *cls >= C ? LABEL_BAD : LABEL_COUNTED;
}

/* InfogainLoss: the ignore_label by the integer part, before the class check. */
KCUDA_DEV int infogain_label(float v, int64_t C, bool has_ignore, int ignore, int64_t *cls) {
  *cls = -1;
  if (has_ignore && (int)v == ignore) return LABEL_IGNORED;
  return item_label(v, C, cls);
}

/* SigmoidCrossEntropyLoss: (int)target == ignore, without the undefined cast of a target out
 * of int's range. */
KCUDA_DEV bool sce_ignored(float t, bool has_ignore, int ignore) {
  return has_ignore && trunc((double)t) == (double)ignore;
}

#define LOG_THRESHOLD 1e-20f /* Caffe's kLOG_THRESHOLD */

/* ---- the ordered reduction ---------------------------------------------------------------- */

/* Up to three terms an item (K), in double, and its label's state (NULL: every item counted),
 * then their sums over the counted items: one scratch buffer, carved once. */
#define RED_MAX_TERMS 3

typedef struct {
  int64_t n, parts;
  int K;
  double *terms;   /* K x n */
  double *psum;    /* K x parts */
  double *tot;     /* RED_MAX_TERMS */
  int64_t *pvalid; /* parts */
  int64_t *pbad;   /* parts: the chunk's first bad item, -1 for none */
  int64_t *toti;   /* [0] counted items, [1] the first bad one (-1: none) */
  int8_t *state;   /* n, or NULL */
  void *extra;     /* the op's own scratch */
} kcuda_red;

static size_t round8(size_t b) { return (b + 7) / 8 * 8; }

static int red_init(const kiln_op_ctx *c, kcuda_red *r, int64_t n, int K, bool with_state,
                    size_t extra) {
  r->n = n > 0 ? n : 0;
  r->K = K;
  r->parts = (r->n + KCUDA_CHUNK - 1) / KCUDA_CHUNK;
  const size_t nd = (size_t)K * (size_t)(r->n + r->parts) + RED_MAX_TERMS;
  const size_t ni = 2 * (size_t)r->parts + 2;
  const size_t bytes =
      sizeof(double) * nd + sizeof(int64_t) * ni + round8(extra) + (with_state ? (size_t)r->n : 0);
  void *p;
  KILN_TRY(kcuda_scratch(c, bytes, &p));
  r->terms = (double *)p;
  r->psum = r->terms + (size_t)K * (size_t)r->n;
  r->tot = r->psum + (size_t)K * (size_t)r->parts;
  r->pvalid = (int64_t *)(void *)(r->tot + RED_MAX_TERMS);
  r->pbad = r->pvalid + r->parts;
  r->toti = r->pbad + r->parts;
  r->extra = (void *)(r->toti + 2);
  r->state = with_state ? (int8_t *)r->extra + round8(extra) : NULL;
  return KILN_OK;
}

/* Each chunk's sums, counted items and first bad item, in index order. */
KCUDA_GLOBAL void k_red_chunks(kcuda_red r) {
  KCUDA_FOR(p, r.parts) {
    const int64_t lo = p * KCUDA_CHUNK;
    const int64_t hi = lo + KCUDA_CHUNK < r.n ? lo + KCUDA_CHUNK : r.n;
    double s[RED_MAX_TERMS] = {0, 0, 0};
    int64_t valid = 0, bad = -1;
    for (int64_t i = lo; i < hi; i++) {
      const int st = r.state ? r.state[i] : LABEL_COUNTED;
      if (st == LABEL_BAD && bad < 0) bad = i;
      if (st != LABEL_COUNTED) continue;
      valid++;
      for (int k = 0; k < r.K; k++) s[k] += r.terms[k * r.n + i];
    }
    for (int k = 0; k < r.K; k++) r.psum[k * r.parts + p] = s[k];
    r.pvalid[p] = valid;
    r.pbad[p] = bad;
  }
}

/* The chunks' sums in order, by one thread. */
KCUDA_GLOBAL void k_red_total(kcuda_red r) {
  KCUDA_FOR(t, 1) {
    int64_t valid = 0, bad = -1;
    for (int k = 0; k < RED_MAX_TERMS; k++) r.tot[k] = 0;
    for (int64_t p = 0; p < r.parts; p++) {
      for (int k = 0; k < r.K; k++) r.tot[k] += r.psum[k * r.parts + p];
      valid += r.pvalid[p];
      if (bad < 0) bad = r.pbad[p];
    }
    r.toti[0] = valid;
    r.toti[1] = bad;
  }
}

/* The items' terms and states must have been launched; this queues their sums. */
static void red_sum(const kiln_op_ctx *c, const kcuda_red *r) {
  KCUDA_LAUNCH(c, r->parts, k_red_chunks, *r);
  KCUDA_LAUNCH(c, 1, k_red_total, *r);
}

/* loss[0] = the first sum / the normaliser of the counted items (by_norm), or / div / div2;
 * nothing when a label was bad (the reference returns before writing it). */
KCUDA_GLOBAL void k_loss_final(float *loss, kcuda_red r, bool by_norm, kiln_loss_norm norm,
                               double full, int64_t batch, double div, double div2) {
  KCUDA_FOR(t, 1) {
    if (r.toti[1] >= 0) continue;
    if (by_norm) loss[0] = (float)(r.tot[0] / normalizer(norm, full, batch, r.toti[0]));
    else loss[0] = (float)(r.tot[0] / div / div2);
  }
}

static void loss_by_norm(const kiln_op_ctx *c, float *loss, const kcuda_red *r,
                         kiln_loss_norm norm, double full, int64_t batch) {
  KCUDA_LAUNCH(c, 1, k_loss_final, loss, *r, true, norm, full, batch, 1.0, 1.0);
}

static void loss_by(const kiln_op_ctx *c, float *loss, const kcuda_red *r, double div,
                    double div2) {
  KCUDA_LAUNCH(c, 1, k_loss_final, loss, *r, false, KILN_LOSS_NONE, 1.0, (int64_t)1, div, div2);
}

static int label_error(float v, int64_t pos, int64_t C) {
  return kiln_errorf(KILN_ERR_DATA,
                     "label %g at position %lld is out of range: expected an integer in [0, %lld)",
                     v, (long long)pos, (long long)C);
}

/* The launches' status, then (label != NULL) the first bad label read back: waits for the
 * kernels. */
static int red_finish(const kiln_op_ctx *c, const kcuda_red *r, const char *op,
                      const float *label, int64_t C) {
  KILN_TRY(kcuda_launched(c, op));
  if (!label) return KILN_OK;
  int64_t bad = -1;
  KILN_TRY(kiln_device_to_host(c->device, &bad, r->toti + 1, sizeof bad));
  if (bad < 0) return KILN_OK;
  float v = 0;
  KILN_TRY(kiln_device_to_host(c->device, &v, label + bad, sizeof v));
  return label_error(v, bad, C);
}

/* ---- SoftmaxWithLoss ---------------------------------------------------------------------- */

KCUDA_GLOBAL void k_softmax_loss_items(kcuda_red r, const float *prob, const float *label,
                                       int64_t C, int64_t inner, bool has_ignore, int ignore) {
  KCUDA_FOR(pos, r.n) {
    int lab;
    const int st = softmax_label(label[pos], C, has_ignore, ignore, &lab);
    r.state[pos] = (int8_t)st;
    double t = 0;
    if (st == LABEL_COUNTED) {
      const float pr = prob[((pos / inner) * C + lab) * inner + pos % inner];
      t = -log((double)(pr < FLT_MIN ? FLT_MIN : pr)); /* a NaN stays NaN */
    }
    r.terms[pos] = t;
  }
}

KCUDA_OP(softmax_loss_fwd)(const kiln_op_ctx *c, float *loss, const float *prob,
                           const float *label, int64_t outer, int64_t C, int64_t inner,
                           bool has_ignore, int ignore, kiln_loss_norm norm) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, outer * inner, 1, true, 0));
  KCUDA_LAUNCH(c, r.n, k_softmax_loss_items, r, prob, label, C, inner, has_ignore, ignore);
  red_sum(c, &r);
  loss_by_norm(c, loss, &r, norm, (double)outer * inner, outer);
  return red_finish(c, &r, "softmax_loss_fwd", label, C);
}

/* Only the ignored positions: the backward does not check the labels again. */
KCUDA_GLOBAL void k_ignored_items(kcuda_red r, const float *label, bool has_ignore, int ignore) {
  KCUDA_FOR(pos, r.n) {
    r.state[pos] = (int8_t)(has_ignore && (int)label[pos] == ignore ? LABEL_IGNORED
                                                                     : LABEL_COUNTED);
  }
}

/* The scale dloss[0] / normaliser, valid read from the reduction when there is one. */
KCUDA_DEV float grad_scale(const float *dloss, kiln_loss_norm norm, double full, int64_t batch,
                           const int64_t *valid) {
  return dloss[0] / normalizer(norm, full, batch, valid ? valid[0] : 0);
}

KCUDA_GLOBAL void k_softmax_loss_bwd(float *dx, const float *prob, const float *label,
                                     const float *dloss, int64_t outer, int64_t C, int64_t inner,
                                     bool has_ignore, int ignore, kiln_loss_norm norm,
                                     const int64_t *valid) {
  KCUDA_FOR(i, outer * C * inner) {
    const int64_t j = i % inner, k = (i / inner) % C, o = i / (C * inner);
    const int lab = (int)label[o * inner + j];
    const float scale = grad_scale(dloss, norm, (double)outer * inner, outer, valid);
    float v;
    if (has_ignore && lab == ignore) v = 0;
    else v = k == lab ? prob[i] - 1 : prob[i];
    dx[i] = v * scale;
  }
}

KCUDA_OP(softmax_loss_bwd)(const kiln_op_ctx *c, float *dx, const float *prob,
                           const float *label, const float *dloss, int64_t outer, int64_t C,
                           int64_t inner, bool has_ignore, int ignore, kiln_loss_norm norm) {
  const int64_t *valid = NULL;
  kcuda_red r;
  if (norm == KILN_LOSS_VALID) { /* the only normaliser that counts */
    KILN_TRY(red_init(c, &r, outer * inner, 0, true, 0));
    KCUDA_LAUNCH(c, r.n, k_ignored_items, r, label, has_ignore, ignore);
    red_sum(c, &r);
    valid = r.toti;
  }
  KCUDA_LAUNCH(c, outer * C * inner, k_softmax_loss_bwd, dx, prob, label, dloss, outer, C, inner,
               has_ignore, ignore, norm, valid);
  return kcuda_launched(c, "softmax_loss_bwd");
}

/* ---- Accuracy and F1 ---------------------------------------------------------------------- */

/* Term 0: a hit, when fewer than top_k other classes score at least the true one (a tie counts
 * against it, as Caffe's). */
KCUDA_GLOBAL void k_accuracy_items(kcuda_red r, const float *x, const float *label, int64_t C,
                                   int64_t inner, int top_k, bool has_ignore, int ignore) {
  KCUDA_FOR(pos, r.n) {
    int lab;
    const int st = softmax_label(label[pos], C, has_ignore, ignore, &lab);
    r.state[pos] = (int8_t)st;
    double hit = 0;
    if (st == LABEL_COUNTED) {
      const float *xc = x + (pos / inner) * C * inner + pos % inner;
      const float truth = xc[lab * inner];
      unsigned higher = 0;
      for (int64_t k = 0; k < C; k++)
        if (k != lab && xc[k * inner] >= truth) higher++;
      hit = higher < (unsigned)top_k;
    }
    r.terms[pos] = hit;
  }
}

KCUDA_GLOBAL void k_accuracy_final(float *acc, kcuda_red r) {
  KCUDA_FOR(t, 1) {
    if (r.toti[1] >= 0) continue;
    const int64_t correct = (int64_t)r.tot[0], count = r.toti[0];
    acc[0] = count ? (float)correct / count : 0.0f;
  }
}

/* Class k's hits and counts in chunk p: index p C + k. */
KCUDA_GLOBAL void k_accuracy_class_chunks(int64_t *phit, int64_t *pcnt, kcuda_red r,
                                          const float *label, int64_t C) {
  KCUDA_FOR(t, r.parts * C) {
    const int64_t p = t / C, k = t % C;
    const int64_t lo = p * KCUDA_CHUNK;
    const int64_t hi = lo + KCUDA_CHUNK < r.n ? lo + KCUDA_CHUNK : r.n;
    int64_t hits = 0, cnt = 0;
    for (int64_t i = lo; i < hi; i++)
      if (r.state[i] == LABEL_COUNTED && (int)label[i] == k) {
        hits += r.terms[i] != 0;
        cnt++;
      }
    phit[t] = hits;
    pcnt[t] = cnt;
  }
}

KCUDA_GLOBAL void k_accuracy_class_total(float *per_class, float *class_count,
                                         const int64_t *phit, const int64_t *pcnt, int64_t parts,
                                         int64_t C) {
  KCUDA_FOR(k, C) {
    int64_t hits = 0, cnt = 0;
    for (int64_t p = 0; p < parts; p++) {
      hits += phit[p * C + k];
      cnt += pcnt[p * C + k];
    }
    class_count[k] = (float)cnt;
    per_class[k] = cnt ? (float)hits / (float)cnt : 0.0f;
  }
}

KCUDA_OP(accuracy_fwd)(const kiln_op_ctx *c, float *acc, float *per_class, float *class_count,
                       const float *x, const float *label, int64_t outer, int64_t C,
                       int64_t inner, int top_k, bool has_ignore, int ignore) {
  const int64_t n = outer * inner > 0 ? outer * inner : 0;
  const int64_t parts = (n + KCUDA_CHUNK - 1) / KCUDA_CHUNK;
  const size_t extra = per_class ? 2 * sizeof(int64_t) * (size_t)(parts * C) : 0;
  kcuda_red r;
  KILN_TRY(red_init(c, &r, n, 1, true, extra));
  KCUDA_LAUNCH(c, n, k_accuracy_items, r, x, label, C, inner, top_k, has_ignore, ignore);
  red_sum(c, &r);
  KCUDA_LAUNCH(c, 1, k_accuracy_final, acc, r);
  if (per_class) {
    int64_t *phit = (int64_t *)r.extra, *pcnt = phit + parts * C;
    KCUDA_LAUNCH(c, parts * C, k_accuracy_class_chunks, phit, pcnt, r, label, C);
    KCUDA_LAUNCH(c, C, k_accuracy_class_total, per_class, class_count, phit, pcnt, parts, C);
  }
  return red_finish(c, &r, "accuracy_fwd", label, C);
}

/* Terms: a true positive, a false positive, a false negative of class `positive` under the
 * top-1 class (among equal highest scores the first). */
KCUDA_GLOBAL void k_f1_items(kcuda_red r, const float *x, const float *label, int64_t C,
                             int64_t inner, int positive, bool has_ignore, int ignore) {
  KCUDA_FOR(pos, r.n) {
    int lab;
    const int st = softmax_label(label[pos], C, has_ignore, ignore, &lab);
    r.state[pos] = (int8_t)st;
    bool predicted = false, actual = false;
    if (st == LABEL_COUNTED) {
      const float *xc = x + (pos / inner) * C * inner + pos % inner;
      int64_t pred = 0;
      for (int64_t k = 1; k < C; k++)
        if (xc[k * inner] > xc[pred * inner]) pred = k;
      predicted = pred == positive;
      actual = lab == positive;
    }
    r.terms[pos] = predicted && actual;
    r.terms[r.n + pos] = predicted && !actual;
    r.terms[2 * r.n + pos] = !predicted && actual;
  }
}

KCUDA_GLOBAL void k_f1_final(float *tp, float *fp, float *fn, kcuda_red r) {
  KCUDA_FOR(t, 1) {
    if (r.toti[1] >= 0) continue;
    tp[0] = (float)(int64_t)r.tot[0];
    fp[0] = (float)(int64_t)r.tot[1];
    fn[0] = (float)(int64_t)r.tot[2];
  }
}

KCUDA_OP(f1_fwd)(const kiln_op_ctx *c, float *tp, float *fp, float *fn, const float *x,
                 const float *label, int64_t outer, int64_t C, int64_t inner, int positive,
                 bool has_ignore, int ignore) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, outer * inner, 3, true, 0));
  KCUDA_LAUNCH(c, r.n, k_f1_items, r, x, label, C, inner, positive, has_ignore, ignore);
  red_sum(c, &r);
  KCUDA_LAUNCH(c, 1, k_f1_final, tp, fp, fn, r);
  return red_finish(c, &r, "f1_fwd", label, C);
}

/* ---- MultinomialLogisticLoss -------------------------------------------------------------- */

KCUDA_GLOBAL void k_multinomial_items(kcuda_red r, const float *p, const float *label,
                                      int64_t dim) {
  KCUDA_FOR(n, r.n) {
    int64_t k;
    const int st = item_label(label[n], dim, &k);
    r.state[n] = (int8_t)st;
    r.terms[n] = st == LABEL_COUNTED ? -log((double)fmaxf(p[n * dim + k], LOG_THRESHOLD)) : 0;
  }
}

KCUDA_OP(multinomial_loss_fwd)(const kiln_op_ctx *c, float *loss, const float *p,
                               const float *label, int64_t N, int64_t dim) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, N, 1, true, 0));
  KCUDA_LAUNCH(c, r.n, k_multinomial_items, r, p, label, dim);
  red_sum(c, &r);
  loss_by(c, loss, &r, (double)(N ? N : 1), 1.0);
  return red_finish(c, &r, "multinomial_loss_fwd", label, dim);
}

/* The label states alone (item_label), for the backward passes that refuse bad labels too. */
KCUDA_GLOBAL void k_item_states(kcuda_red r, const float *label, int64_t C) {
  KCUDA_FOR(n, r.n) {
    int64_t k;
    r.state[n] = (int8_t)item_label(label[n], C, &k);
  }
}

KCUDA_GLOBAL void k_multinomial_bwd(float *dp, const float *p, const float *label,
                                    const float *dloss, int64_t N, int64_t dim) {
  KCUDA_FOR(i, N * dim) {
    const int64_t n = i / dim;
    int64_t k;
    const bool ok = item_label(label[n], dim, &k) == LABEL_COUNTED;
    const float scale = -dloss[0] / (float)(N ? N : 1);
    dp[i] = ok && i % dim == k ? scale / fmaxf(p[i], LOG_THRESHOLD) : 0.0f;
  }
}

KCUDA_OP(multinomial_loss_bwd)(const kiln_op_ctx *c, float *dp, const float *p,
                               const float *label, const float *dloss, int64_t N, int64_t dim) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, N, 0, true, 0));
  KCUDA_LAUNCH(c, r.n, k_item_states, r, label, dim);
  red_sum(c, &r);
  KCUDA_LAUNCH(c, N * dim, k_multinomial_bwd, dp, p, label, dloss, N, dim);
  return red_finish(c, &r, "multinomial_loss_bwd", label, dim);
}

/* ---- InfogainLoss ------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_infogain_items(kcuda_red r, const float *prob, const float *label,
                                   const float *H, int64_t C, int64_t inner, bool has_ignore,
                                   int ignore) {
  KCUDA_FOR(pos, r.n) {
    int64_t l;
    const int st = infogain_label(label[pos], C, has_ignore, ignore, &l);
    r.state[pos] = (int8_t)st;
    double t = 0;
    if (st == LABEL_COUNTED) {
      const float *pc = prob + (pos / inner) * C * inner + pos % inner;
      for (int64_t k = 0; k < C; k++)
        t -= H[l * C + k] * log(fmaxf(pc[k * inner], LOG_THRESHOLD));
    }
    r.terms[pos] = t;
  }
}

KCUDA_OP(infogain_loss_fwd)(const kiln_op_ctx *c, float *loss, const float *prob,
                            const float *label, const float *H, int64_t outer, int64_t C,
                            int64_t inner, bool has_ignore, int ignore, kiln_loss_norm norm) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, outer * inner, 1, true, 0));
  KCUDA_LAUNCH(c, r.n, k_infogain_items, r, prob, label, H, C, inner, has_ignore, ignore);
  red_sum(c, &r);
  loss_by_norm(c, loss, &r, norm, (double)(outer * inner), outer);
  return red_finish(c, &r, "infogain_loss_fwd", label, C);
}

KCUDA_GLOBAL void k_infogain_states(kcuda_red r, const float *label, int64_t C, bool has_ignore,
                                    int ignore) {
  KCUDA_FOR(pos, r.n) {
    int64_t l;
    r.state[pos] = (int8_t)infogain_label(label[pos], C, has_ignore, ignore, &l);
  }
}

/* H's row sums in float, in order, as the reference's per position. */
KCUDA_GLOBAL void k_row_sums(float *rs, const float *H, int64_t C) {
  KCUDA_FOR(l, C) {
    float s = 0;
    for (int64_t k = 0; k < C; k++) s += H[l * C + k];
    rs[l] = s;
  }
}

KCUDA_GLOBAL void k_infogain_bwd(float *dx, const float *prob, const float *label,
                                 const float *H, const float *rs, const float *dloss,
                                 int64_t outer, int64_t C, int64_t inner, bool has_ignore,
                                 int ignore, kiln_loss_norm norm, const int64_t *valid) {
  KCUDA_FOR(i, outer * C * inner) {
    const int64_t j = i % inner, k = (i / inner) % C, o = i / (C * inner);
    int64_t l;
    const int st = infogain_label(label[o * inner + j], C, has_ignore, ignore, &l);
    const float scale = grad_scale(dloss, norm, (double)(outer * inner), outer, valid);
    float v = 0;
    if (st == LABEL_COUNTED) v = prob[i] * rs[l] - H[l * C + k];
    dx[i] = st == LABEL_BAD ? 0.0f : v * scale;
  }
}

KCUDA_OP(infogain_loss_bwd)(const kiln_op_ctx *c, float *dx, const float *prob,
                            const float *label, const float *H, const float *dloss,
                            int64_t outer, int64_t C, int64_t inner, bool has_ignore, int ignore,
                            kiln_loss_norm norm) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, outer * inner, 0, true, sizeof(float) * (size_t)(C > 0 ? C : 0)));
  float *rs = (float *)r.extra;
  KCUDA_LAUNCH(c, r.n, k_infogain_states, r, label, C, has_ignore, ignore);
  red_sum(c, &r);
  KCUDA_LAUNCH(c, C, k_row_sums, rs, H, C);
  KCUDA_LAUNCH(c, outer * C * inner, k_infogain_bwd, dx, prob, label, H, rs, dloss, outer, C,
               inner, has_ignore, ignore, norm, (const int64_t *)r.toti);
  return red_finish(c, &r, "infogain_loss_bwd", label, C);
}

/* ---- HingeLoss ---------------------------------------------------------------------------- */

/* max(0, 1 + s x) for score x of class k, with s = -1 for the true class l. */
KCUDA_DEV float hinge_margin(float x, int64_t k, int64_t l) {
  const float v = 1 + (k == l ? -x : x);
  return v > 0 ? v : 0;
}

KCUDA_GLOBAL void k_hinge_items(kcuda_red r, const float *x, const float *label, int64_t dim,
                                bool l2) {
  KCUDA_FOR(n, r.n) {
    int64_t l;
    const int st = item_label(label[n], dim, &l);
    r.state[n] = (int8_t)st;
    double t = 0;
    if (st == LABEL_COUNTED)
      for (int64_t k = 0; k < dim; k++) {
        const float m = hinge_margin(x[n * dim + k], k, l);
        t += l2 ? (double)m * m : m;
      }
    r.terms[n] = t;
  }
}

KCUDA_OP(hinge_loss_fwd)(const kiln_op_ctx *c, float *loss, const float *x, const float *label,
                         int64_t N, int64_t dim, bool l2) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, N, 1, true, 0));
  KCUDA_LAUNCH(c, r.n, k_hinge_items, r, x, label, dim, l2);
  red_sum(c, &r);
  loss_by(c, loss, &r, (double)(N ? N : 1), 1.0);
  return red_finish(c, &r, "hinge_loss_fwd", label, dim);
}

KCUDA_GLOBAL void k_hinge_bwd(float *dx, const float *x, const float *label, const float *dloss,
                              int64_t N, int64_t dim, bool l2) {
  KCUDA_FOR(i, N * dim) {
    const int64_t k = i % dim;
    int64_t l;
    const bool ok = item_label(label[i / dim], dim, &l) == LABEL_COUNTED;
    const float scale = dloss[0] / (float)(N ? N : 1) * (l2 ? 2 : 1);
    const float m = hinge_margin(x[i], k, l);
    const float g = l2 ? m : (float)(m > 0);
    dx[i] = ok ? (k == l ? -g : g) * scale : 0.0f;
  }
}

KCUDA_OP(hinge_loss_bwd)(const kiln_op_ctx *c, float *dx, const float *x, const float *label,
                         const float *dloss, int64_t N, int64_t dim, bool l2) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, N, 0, true, 0));
  KCUDA_LAUNCH(c, r.n, k_item_states, r, label, dim);
  red_sum(c, &r);
  KCUDA_LAUNCH(c, N * dim, k_hinge_bwd, dx, x, label, dloss, N, dim, l2);
  return red_finish(c, &r, "hinge_loss_bwd", label, dim);
}

/* ---- SigmoidCrossEntropyLoss -------------------------------------------------------------- */

KCUDA_GLOBAL void k_sce_items(kcuda_red r, const float *x, const float *t, bool has_ignore,
                              int ignore) {
  KCUDA_FOR(i, r.n) {
    const bool ign = sce_ignored(t[i], has_ignore, ignore);
    r.state[i] = (int8_t)(ign ? LABEL_IGNORED : LABEL_COUNTED);
    const double xi = x[i];
    r.terms[i] = ign ? 0 : (xi > 0 ? xi : 0) - xi * t[i] + log1p(exp(-fabs(xi)));
  }
}

KCUDA_OP(sigmoid_ce_fwd)(const kiln_op_ctx *c, float *loss, const float *x, const float *t,
                         int64_t n, int64_t batch, bool has_ignore, int ignore,
                         kiln_loss_norm norm) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, n, 1, true, 0));
  KCUDA_LAUNCH(c, r.n, k_sce_items, r, x, t, has_ignore, ignore);
  red_sum(c, &r);
  loss_by_norm(c, loss, &r, norm, (double)n, batch);
  return red_finish(c, &r, "sigmoid_ce_fwd", NULL, 0);
}

KCUDA_GLOBAL void k_sce_states(kcuda_red r, const float *t, bool has_ignore, int ignore) {
  KCUDA_FOR(i, r.n) {
    r.state[i] = (int8_t)(sce_ignored(t[i], has_ignore, ignore) ? LABEL_IGNORED : LABEL_COUNTED);
  }
}

KCUDA_GLOBAL void k_sce_bwd(float *dx, const float *x, const float *t, const float *dloss,
                            int64_t n, int64_t batch, bool has_ignore, int ignore,
                            kiln_loss_norm norm, const int64_t *valid) {
  KCUDA_FOR(i, n) {
    const float scale = grad_scale(dloss, norm, (double)n, batch, valid);
    const float sig = 0.5f * tanhf(0.5f * x[i]) + 0.5f;
    dx[i] = sce_ignored(t[i], has_ignore, ignore) ? 0.0f : (sig - t[i]) * scale;
  }
}

KCUDA_OP(sigmoid_ce_bwd)(const kiln_op_ctx *c, float *dx, const float *x, const float *t,
                         const float *dloss, int64_t n, int64_t batch, bool has_ignore,
                         int ignore, kiln_loss_norm norm) {
  const int64_t *valid = NULL;
  kcuda_red r;
  if (norm == KILN_LOSS_VALID) { /* forward's count again: only VALID divides by it */
    KILN_TRY(red_init(c, &r, n, 0, true, 0));
    KCUDA_LAUNCH(c, r.n, k_sce_states, r, t, has_ignore, ignore);
    red_sum(c, &r);
    valid = r.toti;
  }
  KCUDA_LAUNCH(c, n, k_sce_bwd, dx, x, t, dloss, n, batch, has_ignore, ignore, norm, valid);
  return kcuda_launched(c, "sigmoid_ce_bwd");
}

/* ---- EuclideanLoss ------------------------------------------------------------------------ */

KCUDA_GLOBAL void k_euclidean_items(kcuda_red r, const float *a, const float *b) {
  KCUDA_FOR(i, r.n) {
    const double d = (double)a[i] - (double)b[i];
    r.terms[i] = d * d;
  }
}

KCUDA_OP(euclidean_loss_fwd)(const kiln_op_ctx *c, float *loss, const float *a, const float *b,
                             int64_t n, int64_t N) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, n, 1, false, 0));
  KCUDA_LAUNCH(c, r.n, k_euclidean_items, r, a, b);
  red_sum(c, &r);
  loss_by(c, loss, &r, (double)N, 2.0);
  return red_finish(c, &r, "euclidean_loss_fwd", NULL, 0);
}

/* da = (a - b) dloss[0] / N and db its negation, each where wanted. */
KCUDA_GLOBAL void k_euclidean_bwd(float *da, float *db, const float *a, const float *b,
                                  const float *dloss, int64_t n, int64_t N) {
  KCUDA_FOR(i, n) {
    const float scale = dloss[0] / (float)N;
    if (da) da[i] = scale * (a[i] - b[i]);
    if (db) db[i] = -scale * (a[i] - b[i]);
  }
}

KCUDA_OP(euclidean_loss_bwd)(const kiln_op_ctx *c, float *da, float *db, const float *a,
                             const float *b, const float *dloss, int64_t n, int64_t N) {
  if (!da && !db) return KILN_OK;
  KCUDA_LAUNCH(c, n, k_euclidean_bwd, da, db, a, b, dloss, n, N);
  return kcuda_launched(c, "euclidean_loss_bwd");
}

/* ---- ContrastiveLoss ---------------------------------------------------------------------- */

KCUDA_GLOBAL void k_contrastive_items(kcuda_red r, float *dist_sq, const float *a,
                                      const float *b, const float *sim, int64_t C, float margin,
                                      bool legacy) {
  KCUDA_FOR(n, r.n) {
    double d2 = 0;
    for (int64_t k = 0; k < C; k++) {
      const float d = a[n * C + k] - b[n * C + k];
      d2 += (double)d * d;
    }
    const float ds = (float)d2;
    dist_sq[n] = ds;
    double t;
    if ((int)sim[n]) {
      t = ds;
    } else if (legacy) {
      t = fmaxf(margin - ds, 0);
    } else {
      const float m = fmaxf(margin - sqrtf(ds), 0);
      t = (double)m * m;
    }
    r.terms[n] = t;
  }
}

KCUDA_OP(contrastive_loss_fwd)(const kiln_op_ctx *c, float *loss, float *dist_sq, const float *a,
                               const float *b, const float *sim, int64_t N, int64_t C,
                               float margin, bool legacy) {
  kcuda_red r;
  KILN_TRY(red_init(c, &r, N, 1, false, 0));
  KCUDA_LAUNCH(c, r.n, k_contrastive_items, r, dist_sq, a, b, sim, C, margin, legacy);
  red_sum(c, &r);
  loss_by(c, loss, &r, (double)(N ? N : 1), 2.0);
  return red_finish(c, &r, "contrastive_loss_fwd", NULL, 0);
}

/* One element of da (sign 1) or db (sign -1): beta (a - b), beta by the pair's case. */
KCUDA_GLOBAL void k_contrastive_bwd(float *dx, int sign, const float *a, const float *b,
                                    const float *sim, const float *dist_sq, const float *dloss,
                                    int64_t N, int64_t C, float margin, bool legacy) {
  KCUDA_FOR(i, N * C) {
    const int64_t n = i / C;
    const float alpha = sign * dloss[0] / (float)(N ? N : 1);
    float beta;
    if ((int)sim[n]) {
      beta = alpha;
    } else if (legacy) {
      beta = margin - dist_sq[n] > 0 ? -alpha : 0;
    } else {
      const float dist = sqrtf(dist_sq[n]), mdist = margin - dist;
      beta = mdist > 0 ? -alpha * mdist / (dist + 1e-4f) : 0;
    }
    dx[i] = beta * (a[i] - b[i]);
  }
}

KCUDA_OP(contrastive_loss_bwd)(const kiln_op_ctx *c, float *da, float *db, const float *a,
                               const float *b, const float *sim, const float *dist_sq,
                               const float *dloss, int64_t N, int64_t C, float margin,
                               bool legacy) {
  if (da)
    KCUDA_LAUNCH(c, N * C, k_contrastive_bwd, da, 1, a, b, sim, dist_sq, dloss, N, C, margin,
                 legacy);
  if (db)
    KCUDA_LAUNCH(c, N * C, k_contrastive_bwd, db, -1, a, b, sim, dist_sq, dloss, N, C, margin,
                 legacy);
  return kcuda_launched(c, "contrastive_loss_bwd");
}

KCUDA_REGISTER(loss) {
  b->softmax_fwd = KCUDA_FN(softmax_fwd);
  b->softmax_bwd = KCUDA_FN(softmax_bwd);
  b->softmax_loss_fwd = KCUDA_FN(softmax_loss_fwd);
  b->softmax_loss_bwd = KCUDA_FN(softmax_loss_bwd);
  b->accuracy_fwd = KCUDA_FN(accuracy_fwd);
  b->f1_fwd = KCUDA_FN(f1_fwd);
  b->multinomial_loss_fwd = KCUDA_FN(multinomial_loss_fwd);
  b->multinomial_loss_bwd = KCUDA_FN(multinomial_loss_bwd);
  b->infogain_loss_fwd = KCUDA_FN(infogain_loss_fwd);
  b->infogain_loss_bwd = KCUDA_FN(infogain_loss_bwd);
  b->hinge_loss_fwd = KCUDA_FN(hinge_loss_fwd);
  b->hinge_loss_bwd = KCUDA_FN(hinge_loss_bwd);
  b->sigmoid_ce_fwd = KCUDA_FN(sigmoid_ce_fwd);
  b->sigmoid_ce_bwd = KCUDA_FN(sigmoid_ce_bwd);
  b->euclidean_loss_fwd = KCUDA_FN(euclidean_loss_fwd);
  b->euclidean_loss_bwd = KCUDA_FN(euclidean_loss_bwd);
  b->contrastive_loss_fwd = KCUDA_FN(contrastive_loss_fwd);
  b->contrastive_loss_bwd = KCUDA_FN(contrastive_loss_bwd);
}
