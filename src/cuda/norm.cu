/* The norm family on the CUDA backend (KILN_OPS_NORM): BatchNorm, Scale, Bias, LayerNorm, LRN,
 * MVN and Reduction. Outputs that are one value an element are one thread an element. Every sum
 * over a channel (BatchNorm, Scale, Bias), a column (LayerNorm's parameter gradients) or a row
 * (LayerNorm, MVN, Reduction) is in double, as the reference's, and in two passes: partial sums
 * of consecutive chunks of KCUDA_CHUNK values into scratch, then one thread a channel adding its
 * chunks in order. The order follows the sizes alone, so results never depend on the grid, and a
 * large batch still spreads over many threads. */
#include "cuda/kcuda.h"

/* ---- the sums ------------------------------------------------------------------------------- */

/* N x C x S values in the plain layout (block 0) or nChw16c (block 16, C a multiple of 16; the
 * whole blocks alone, as the reference's). A channel's values are its N x S, taken image by
 * image. Rows of L values are the view {1, rows, L, 0}; the columns of M rows of K,
 * {M, K, 1, 0}. */
typedef struct {
  int64_t N, C, S;
  int block;
} norm_view;

static norm_view view_of(int64_t N, int64_t C, int64_t S, int block) {
  norm_view v;
  v.N = N;
  v.C = block ? C / 16 * 16 : C;
  v.S = S;
  v.block = block;
  return v;
}

KCUDA_DEV int64_t view_at(norm_view v, int64_t n, int64_t ch, int64_t s) {
  return v.block ? ((n * (v.C / 16) + ch / 16) * v.S + s) * 16 + ch % 16 : (n * v.C + ch) * v.S + s;
}

/* The channel of element e. */
KCUDA_DEV int64_t view_channel(norm_view v, int64_t e) {
  return v.block ? e / (v.S * 16) % (v.C / 16) * 16 + e % 16 : e / v.S % v.C;
}

static int64_t view_count(norm_view v) { return v.N * v.C * v.S; }

static int64_t view_chunks(norm_view v) { return (v.N * v.S + KCUDA_CHUNK - 1) / KCUDA_CHUNK; }

/* What a channel sums: into s0 and, for the kinds with two sums, s1. */
enum {
  T_SUM,    /* s0: a */
  T_ASUM,   /* s0: |a| */
  T_SUMSQ,  /* s0: a^2 */
  T_DEV2,   /* s0: (a - mean)^2, the difference in double (BatchNorm, LayerNorm) */
  T_FDEV2,  /* s0: (a - mean)^2, the difference in float (MVN) */
  T_DOT,    /* s0: a, s1: a b */
  T_FUSED,  /* s0: dz, s1: dz b, dz = BatchNorm's fused gradient of a = dy at b = xn */
  T_GAINED, /* s0: dh, s1: dh b, dh = a gam[s] in double (or a): LayerNorm's row sums */
};

typedef struct {
  int kind;
  const float *a, *b;     /* the values, and the second factor */
  const double *mean;     /* a channel's mean (T_DEV2, T_FDEV2) */
  const float *gam, *bet; /* a channel's gamma and beta (T_FUSED); a row's gain (T_GAINED) */
  float slope;            /* the fused ReLU's (T_FUSED) */
} norm_terms;

static norm_terms terms_of(int kind, const float *a, const float *b) {
  norm_terms t;
  t.kind = kind;
  t.a = a;
  t.b = b;
  t.mean = NULL;
  t.gam = NULL;
  t.bet = NULL;
  t.slope = 1.0f;
  return t;
}

/* Fused BatchNorm, one normalised value v through Scale (gamma g, beta b) and ReLU: the
 * reference's expression. The backward recomputes the sign of Scale's output from v with the same
 * expression, so it masks where the forward did. */
KCUDA_DEV float fused_out(float v, float g, float b, float slope) {
  const float z = v * g + b;
  return z > 0 ? z : slope * z;
}

KCUDA_DEV float fused_dz(float v, float g, float b, float slope, float dy) {
  return v * g + b > 0 ? dy : slope * dy;
}

KCUDA_DEV void term_add(double *s0, double *s1, norm_terms t, int64_t e, int64_t ch, int64_t s) {
  const float a = t.a[e];
  switch (t.kind) {
    case T_ASUM: *s0 += fabsf(a); break;
    case T_SUMSQ: *s0 += (double)a * a; break;
    case T_DEV2: {
      const double d = a - t.mean[ch];
      *s0 += d * d;
      break;
    }
    case T_FDEV2: {
      const float o = a - (float)t.mean[ch];
      *s0 += (double)o * o;
      break;
    }
    case T_DOT:
      *s0 += a;
      *s1 += (double)a * t.b[e];
      break;
    case T_FUSED: {
      const float v = t.b[e], d = fused_dz(v, t.gam[ch], t.bet[ch], t.slope, a);
      *s0 += d;
      *s1 += (double)d * v;
      break;
    }
    case T_GAINED: {
      const double dh = t.gam ? (double)a * t.gam[s] : (double)a;
      *s0 += dh;
      *s1 += dh * t.b[e];
      break;
    }
    default: *s0 += a; break;
  }
}

/* Pass one: chunk k of channel ch summed into p0 (and p1) at ch * nchunks + k. Where neighbouring
 * channels are neighbours in memory (nChw16c, or one value a plane) neighbouring threads take
 * neighbouring channels; elsewhere, neighbouring chunks of one channel. */
KCUDA_GLOBAL void k_parts(double *p0, double *p1, norm_view v, int64_t nchunks, norm_terms t) {
  const int64_t m = v.N * v.S;
  const bool chan_fast = v.block || v.S == 1;
  KCUDA_FOR(i, v.C * nchunks) {
    const int64_t ch = chan_fast ? i % v.C : i / nchunks, k = chan_fast ? i / v.C : i % nchunks;
    const int64_t j0 = k * KCUDA_CHUNK, j1 = j0 + KCUDA_CHUNK < m ? j0 + KCUDA_CHUNK : m;
    int64_t n = j0 / v.S, s = j0 % v.S;
    double s0 = 0, s1 = 0;
    for (int64_t j = j0; j < j1; j++) {
      term_add(&s0, &s1, t, view_at(v, n, ch, s), ch, s);
      if (++s == v.S) s = 0, n++;
    }
    p0[ch * nchunks + k] = s0;
    if (p1) p1[ch * nchunks + k] = s1;
  }
}

/* Pass two's sum of one channel: its chunks in order. */
KCUDA_DEV double chunks_sum(const double *p, int64_t ch, int64_t nchunks) {
  double t = 0;
  for (int64_t k = 0; k < nchunks; k++) t += p[ch * nchunks + k];
  return t;
}

static void launch_parts(const kiln_op_ctx *c, double *p0, double *p1, norm_view v,
                         norm_terms t) {
  const int64_t nchunks = view_chunks(v);
  KCUDA_LAUNCH(c, v.C * nchunks, k_parts, p0, p1, v, nchunks, t);
}

/* ---- BatchNorm ------------------------------------------------------------------------------ */

static int bad_block(int block) {
  return kiln_errorf(KILN_ERR_INVALID, "batch norm: channel block %d (0 or 16)", block);
}

/* The running sums' statistics, which stay as they are. */
KCUDA_GLOBAL void k_bn_global(float *mean, float *inv, const float *mean_sum,
                              const float *var_sum, const float *factor, int64_t C, float eps) {
  KCUDA_FOR(ch, C) {
    const float f = factor[0] == 0 ? 0.0f : 1.0f / factor[0];
    mean[ch] = f * mean_sum[ch];
    inv[ch] = 1.0f / sqrtf(f * var_sum[ch] + eps);
  }
}

KCUDA_GLOBAL void k_bn_mean(double *mu, const double *part, int64_t C, int64_t nchunks,
                            int64_t m) {
  KCUDA_FOR(ch, C) mu[ch] = m ? chunks_sum(part, ch, nchunks) / (double)m : 0.0;
}

/* From the squared deviations' sums: the batch's mean and inverse deviation, the running sums
 * (the variance unbiased there, biased in the normalisation, as Caffe's). */
KCUDA_GLOBAL void k_bn_stats(float *mean, float *inv, float *mean_sum, float *var_sum,
                             const double *mu, const double *part, int64_t C, int64_t nchunks,
                             int64_t m, float maf, float eps) {
  const double correction = m > 1 ? (double)m / (double)(m - 1) : 1.0;
  KCUDA_FOR(ch, C) {
    const double var = m ? chunks_sum(part, ch, nchunks) / (double)m : 0.0;
    inv[ch] = (float)(1.0 / sqrt(var + eps));
    mean[ch] = (float)mu[ch];
    mean_sum[ch] = maf * mean_sum[ch] + (float)mu[ch];
    var_sum[ch] = maf * var_sum[ch] + (float)(correction * var);
  }
}

KCUDA_GLOBAL void k_bn_count(float *factor, float maf) {
  KCUDA_FOR(i, 1) factor[i] = maf * factor[i] + 1.0f;
}

/* xn = (x - mean) inv, y = xn or through the fused Scale and ReLU; y may be x. */
KCUDA_GLOBAL void k_bn_apply(float *y, float *xn, const float *x, const float *mean,
                             const float *inv, const float *gam, const float *bet, norm_view v,
                             float slope) {
  KCUDA_FOR(e, v.N * v.C * v.S) {
    const int64_t ch = view_channel(v, e);
    const float h = (x[e] - mean[ch]) * inv[ch];
    xn[e] = h;
    y[e] = gam ? fused_out(h, gam[ch], bet[ch], slope) : h;
  }
}

/* The scratch argument is the CPU's size (chunks of images); the chunks here are of values, so
 * that a big batch spreads over more threads, and their partial sums take the backend's own
 * scratch. */
KCUDA_OP(batch_norm_fwd)(const kiln_op_ctx *c, float *y, float *xn, float *mean, float *inv,
                         float *run_mean, float *run_var, float *run_count, void *scratch,
                         const float *x, const float *gamma, const float *beta, int64_t N,
                         int64_t C, int64_t S, int block, bool global, float maf, float eps,
                         float slope) {
  (void)scratch;
  if (block != 0 && block != 16) return bad_block(block);
  const norm_view v = view_of(N, C, S, block);
  if (global) {
    KCUDA_LAUNCH(c, v.C, k_bn_global, mean, inv, run_mean, run_var, run_count, v.C, eps);
  } else {
    const int64_t nchunks = view_chunks(v), m = N * S;
    void *sp;
    KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(C * nchunks + C), &sp));
    double *part = (double *)sp, *mu = part + C * nchunks;
    launch_parts(c, part, NULL, v, terms_of(T_SUM, x, NULL));
    KCUDA_LAUNCH(c, v.C, k_bn_mean, mu, part, v.C, nchunks, m);
    norm_terms t = terms_of(T_DEV2, x, NULL);
    t.mean = mu;
    launch_parts(c, part, NULL, v, t);
    KCUDA_LAUNCH(c, v.C, k_bn_stats, mean, inv, run_mean, run_var, mu, part, v.C, nchunks, m, maf,
                 eps);
    KCUDA_LAUNCH(c, 1, k_bn_count, run_count, maf);
  }
  KCUDA_LAUNCH(c, view_count(v), k_bn_apply, y, xn, x, mean, inv, gamma, beta, v, slope);
  return kcuda_launched(c, "batch_norm_fwd");
}

KCUDA_OP(batch_norm_apply)(const kiln_op_ctx *c, float *y, float *xn, const float *x,
                           const float *mean, const float *inv, const float *gamma,
                           const float *beta, int64_t N, int64_t C, int64_t S, int block,
                           float slope) {
  if (block != 0 && block != 16) return bad_block(block);
  const norm_view v = view_of(N, C, S, block);
  KCUDA_LAUNCH(c, view_count(v), k_bn_apply, y, xn, x, mean, inv, gamma, beta, v, slope);
  return kcuda_launched(c, "batch_norm_apply");
}

/* Per channel from the sums of dz and dz xn: with gamma, its and beta's gradients; with batch
 * statistics, a = mean(dz g) and q = mean(dz g xn) (g = gamma or 1). */
KCUDA_GLOBAL void k_bn_bwd_sums(float *dgam, float *dbet, float *a, float *q, const double *p0,
                                const double *p1, const float *gam, int64_t C, int64_t nchunks,
                                int64_t m, bool batch) {
  KCUDA_FOR(ch, C) {
    const double sd = chunks_sum(p0, ch, nchunks), sx = chunks_sum(p1, ch, nchunks);
    const float g = gam ? gam[ch] : 1.0f;
    if (gam) {
      dbet[ch] += (float)sd;
      dgam[ch] += (float)sx;
    }
    a[ch] = batch ? (float)((double)g * sd / (double)m) : 0.0f;
    q[ch] = batch ? (float)((double)g * sx / (double)m) : 0.0f;
  }
}

/* dx = (dz g - a - q xn) inv; a and q NULL: 0 (global statistics without gamma). dx may be
 * dy. */
KCUDA_GLOBAL void k_bn_bwd_dx(float *dx, const float *dy, const float *xn, const float *inv,
                              const float *gam, const float *bet, const float *a, const float *q,
                              norm_view v, float slope) {
  KCUDA_FOR(e, v.N * v.C * v.S) {
    const int64_t ch = view_channel(v, e);
    const float h = xn[e], g = gam ? gam[ch] : 1.0f;
    const float d = gam ? fused_dz(h, g, bet[ch], slope, dy[e]) : dy[e];
    const float ac = a ? a[ch] : 0.0f, qc = q ? q[ch] : 0.0f;
    dx[e] = (d * g - ac - qc * h) * inv[ch];
  }
}

/* With gamma (the fused Scale), Scale's parameter gradients are taken even without dx. */
KCUDA_OP(batch_norm_bwd)(const kiln_op_ctx *c, float *dx, float *dgamma, float *dbeta,
                         void *scratch, const float *dy, const float *xn, const float *inv,
                         const float *gamma, const float *beta, int64_t N, int64_t C, int64_t S,
                         int block, bool global, float slope) {
  (void)scratch; /* as batch_norm_fwd's */
  if (block != 0 && block != 16) return bad_block(block);
  if (!gamma && !dx) return KILN_OK;
  const norm_view v = view_of(N, C, S, block);
  const int64_t m = N * S;
  float *a = NULL, *q = NULL;
  if (gamma || !global) {
    const int64_t nchunks = view_chunks(v);
    void *sp;
    KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(2 * C * nchunks) +
                                  sizeof(float) * (size_t)(2 * C), &sp));
    double *p0 = (double *)sp, *p1 = p0 + C * nchunks;
    a = (float *)(p1 + C * nchunks);
    q = a + C;
    norm_terms t = terms_of(gamma ? T_FUSED : T_DOT, dy, xn);
    t.gam = gamma;
    t.bet = beta;
    t.slope = slope;
    launch_parts(c, p0, p1, v, t);
    KCUDA_LAUNCH(c, v.C, k_bn_bwd_sums, dgamma, dbeta, a, q, p0, p1, gamma, v.C, nchunks, m,
                 !global && m);
  }
  if (dx) KCUDA_LAUNCH(c, view_count(v), k_bn_bwd_dx, dx, dy, xn, inv, gamma, beta, a, q, v, slope);
  return kcuda_launched(c, "batch_norm_bwd");
}

/* ---- Scale and Bias ------------------------------------------------------------------------- */

static int bad_scale_block(int block) {
  return kiln_errorf(KILN_ERR_INVALID, "scale: channel block %d (0 or 16)", block);
}

/* keep = x before y overwrites it (in place). */
KCUDA_GLOBAL void k_scale_fwd(float *y, float *keep, const float *x, const float *gam,
                              const float *bet, norm_view v) {
  KCUDA_FOR(e, v.N * v.C * v.S) {
    const int64_t d = view_channel(v, e);
    const float xv = x[e];
    if (keep) keep[e] = xv;
    y[e] = xv * gam[d] + (bet ? bet[d] : 0.0f);
  }
}

KCUDA_OP(scale_fwd)(const kiln_op_ctx *c, float *y, float *keep, const float *x,
                    const float *gamma, const float *beta, int64_t outer, int64_t dim,
                    int64_t inner, int block) {
  if (block != 0 && block != 16) return bad_scale_block(block);
  const norm_view v = view_of(outer, dim, inner, block);
  KCUDA_LAUNCH(c, view_count(v), k_scale_fwd, y, keep, x, gamma, beta, v);
  return kcuda_launched(c, "scale_fwd");
}

KCUDA_GLOBAL void k_scale_sums(float *dg, float *db, const double *p0, const double *p1,
                               int64_t D, int64_t nchunks, bool accumulate) {
  KCUDA_FOR(d, D) {
    if (dg) dg[d] = (accumulate ? dg[d] : 0.0f) + (float)chunks_sum(p1, d, nchunks);
    if (db) db[d] += (float)chunks_sum(p0, d, nchunks);
  }
}

KCUDA_GLOBAL void k_scale_dx(float *dx, const float *dy, const float *gam, norm_view v) {
  KCUDA_FOR(e, v.N * v.C * v.S) dx[e] = dy[e] * gam[view_channel(v, e)];
}

/* The parameter gradients first: in place, dx overwrites dy. */
KCUDA_OP(scale_bwd)(const kiln_op_ctx *c, float *dx, float *dgamma, float *dbeta,
                    const float *dy, const float *x, const float *gamma, int64_t outer,
                    int64_t dim, int64_t inner, int block, bool accumulate) {
  if (block != 0 && block != 16) return bad_scale_block(block);
  const norm_view v = view_of(outer, dim, inner, block);
  if (dgamma || dbeta) {
    const int64_t nchunks = view_chunks(v);
    void *sp;
    KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(2 * dim * nchunks), &sp));
    double *p0 = (double *)sp, *p1 = p0 + dim * nchunks;
    launch_parts(c, p0, p1, v, terms_of(T_DOT, dy, x));
    KCUDA_LAUNCH(c, v.C, k_scale_sums, dgamma, dbeta, p0, p1, v.C, nchunks, accumulate);
  }
  if (dx) KCUDA_LAUNCH(c, view_count(v), k_scale_dx, dx, dy, gamma, v);
  return kcuda_launched(c, "scale_bwd");
}

KCUDA_GLOBAL void k_bias_fwd(float *y, const float *x, const float *b, int64_t dim,
                             int64_t inner, int64_t count) {
  KCUDA_FOR(e, count) y[e] = x[e] + b[e / inner % dim];
}

KCUDA_OP(bias_fwd)(const kiln_op_ctx *c, float *y, const float *x, const float *b, int64_t outer,
                   int64_t dim, int64_t inner) {
  KCUDA_LAUNCH(c, outer * dim * inner, k_bias_fwd, y, x, b, dim, inner, outer * dim * inner);
  return kcuda_launched(c, "bias_fwd");
}

KCUDA_GLOBAL void k_bias_sums(float *db, const double *p, int64_t D, int64_t nchunks,
                              bool accumulate) {
  KCUDA_FOR(d, D) db[d] = (accumulate ? db[d] : 0.0f) + (float)chunks_sum(p, d, nchunks);
}

KCUDA_OP(bias_bwd)(const kiln_op_ctx *c, float *db, const float *dy, int64_t outer, int64_t dim,
                   int64_t inner, bool accumulate) {
  const norm_view v = view_of(outer, dim, inner, 0);
  const int64_t nchunks = view_chunks(v);
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(dim * nchunks), &sp));
  double *p = (double *)sp;
  launch_parts(c, p, NULL, v, terms_of(T_SUM, dy, NULL));
  KCUDA_LAUNCH(c, dim, k_bias_sums, db, p, dim, nchunks, accumulate);
  return kcuda_launched(c, "bias_bwd");
}

/* ---- LayerNorm ------------------------------------------------------------------------------ */

KCUDA_GLOBAL void k_row_mean(double *mu, const double *part, int64_t rows, int64_t nchunks,
                             int64_t dim) {
  KCUDA_FOR(r, rows) mu[r] = chunks_sum(part, r, nchunks) / (double)dim;
}

KCUDA_GLOBAL void k_ln_rstd(double *rs, float *rstd, const double *part, int64_t M,
                            int64_t nchunks, int64_t K, double eps) {
  KCUDA_FOR(r, M) {
    rs[r] = 1.0 / sqrt(chunks_sum(part, r, nchunks) / (double)K + eps);
    rstd[r] = (float)rs[r];
  }
}

/* y may be x: each element read before written. */
KCUDA_GLOBAL void k_ln_apply(float *y, float *xhat, const float *x, const double *mu,
                             const double *rs, const float *g, const float *b, int64_t M,
                             int64_t K) {
  KCUDA_FOR(e, M * K) {
    const int64_t r = e / K, k = e % K;
    const float h = (float)((x[e] - mu[r]) * rs[r]);
    xhat[e] = h;
    y[e] = g ? (b ? h * g[k] + b[k] : h * g[k]) : h;
  }
}

KCUDA_OP(layer_norm_fwd)(const kiln_op_ctx *c, float *y, float *xhat, float *rstd, const float *x,
                         const float *gain, const float *bias, int64_t M, int64_t K, float eps) {
  const norm_view v = view_of(1, M, K, 0);
  const int64_t nchunks = view_chunks(v);
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(M * nchunks + 2 * M), &sp));
  double *part = (double *)sp, *mu = part + M * nchunks, *rs = mu + M;
  launch_parts(c, part, NULL, v, terms_of(T_SUM, x, NULL));
  KCUDA_LAUNCH(c, M, k_row_mean, mu, part, M, nchunks, K);
  norm_terms t = terms_of(T_DEV2, x, NULL);
  t.mean = mu;
  launch_parts(c, part, NULL, v, t);
  KCUDA_LAUNCH(c, M, k_ln_rstd, rs, rstd, part, M, nchunks, K, (double)eps);
  KCUDA_LAUNCH(c, M * K, k_ln_apply, y, xhat, x, mu, rs, gain, bias, M, K);
  return kcuda_launched(c, "layer_norm_fwd");
}

/* dgain += the column sums of dy xhat, dbias (or NULL) += of dy. */
KCUDA_GLOBAL void k_ln_params(float *dg, float *db, const double *p0, const double *p1, int64_t K,
                              int64_t nchunks) {
  KCUDA_FOR(k, K) {
    dg[k] += (float)chunks_sum(p1, k, nchunks);
    if (db) db[k] += (float)chunks_sum(p0, k, nchunks);
  }
}

/* A row's mean(dh) and mean(dh xhat). */
KCUDA_GLOBAL void k_ln_means(float *fa, float *fc, const double *p0, const double *p1, int64_t M,
                             int64_t nchunks, int64_t K) {
  KCUDA_FOR(r, M) {
    fa[r] = (float)(chunks_sum(p0, r, nchunks) / (double)K);
    fc[r] = (float)(chunks_sum(p1, r, nchunks) / (double)K);
  }
}

/* dx may be dy: each element read before written. */
KCUDA_GLOBAL void k_ln_dx(float *dx, const float *dy, const float *xhat, const float *rstd,
                          const float *g, const float *fa, const float *fc, int64_t M,
                          int64_t K) {
  KCUDA_FOR(e, M * K) {
    const int64_t r = e / K, k = e % K;
    const float dh = g ? dy[e] * g[k] : dy[e];
    dx[e] = rstd[r] * (dh - fa[r] - xhat[e] * fc[r]);
  }
}

/* The parameter gradients first: in place, dx overwrites dy. */
KCUDA_OP(layer_norm_bwd)(const kiln_op_ctx *c, float *dx, float *dgain, float *dbias,
                         const float *dy, const float *xhat, const float *rstd, const float *gain,
                         int64_t M, int64_t K) {
  if (!dgain && !dx) return KILN_OK;
  const norm_view cols = view_of(M, K, 1, 0), rows = view_of(1, M, K, 0);
  const int64_t ncc = dgain ? view_chunks(cols) : 0, ncr = dx ? view_chunks(rows) : 0;
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(2 * K * ncc + 2 * M * ncr) +
                                sizeof(float) * (size_t)(dx ? 2 * M : 0), &sp));
  double *cp = (double *)sp, *rp = cp + 2 * K * ncc;
  if (dgain) {
    launch_parts(c, cp, cp + K * ncc, cols, terms_of(T_DOT, dy, xhat));
    KCUDA_LAUNCH(c, K, k_ln_params, dgain, dbias, cp, cp + K * ncc, K, ncc);
  }
  if (dx) {
    float *fa = (float *)(rp + 2 * M * ncr), *fc = fa + M;
    norm_terms t = terms_of(T_GAINED, dy, xhat);
    t.gam = gain;
    launch_parts(c, rp, rp + M * ncr, rows, t);
    KCUDA_LAUNCH(c, M, k_ln_means, fa, fc, rp, rp + M * ncr, M, ncr, K);
    KCUDA_LAUNCH(c, M * K, k_ln_dx, dx, dy, xhat, rstd, gain, fa, fc, M, K);
  }
  return kcuda_launched(c, "layer_norm_bwd");
}

/* ---- LRN ------------------------------------------------------------------------------------ */

typedef struct {
  int64_t C, H, W, half;
  bool across;
} lrn_window;

static lrn_window lrn_window_of(int64_t C, int64_t H, int64_t W, int64_t size, bool across) {
  lrn_window d;
  d.C = C;
  d.H = H;
  d.W = W;
  d.half = (size - 1) / 2;
  d.across = across;
  return d;
}

/* Sum of v (squared first if `square`) over the window around (c, h, w) of one C x H x W image,
 * in double, in the reference's order. */
KCUDA_DEV double window_sum(const float *v, lrn_window d, int64_t c, int64_t h, int64_t w,
                            bool square) {
  double s = 0;
  const int64_t HW = d.H * d.W;
  if (d.across) {
    const int64_t c0 = c - d.half < 0 ? 0 : c - d.half;
    const int64_t c1 = c + d.half >= d.C ? d.C - 1 : c + d.half;
    for (int64_t cc = c0; cc <= c1; cc++) {
      const float t = v[cc * HW + h * d.W + w];
      s += square ? (double)t * t : (double)t;
    }
  } else {
    const int64_t h0 = h - d.half < 0 ? 0 : h - d.half;
    const int64_t h1 = h + d.half >= d.H ? d.H - 1 : h + d.half;
    const int64_t w0 = w - d.half < 0 ? 0 : w - d.half;
    const int64_t w1 = w + d.half >= d.W ? d.W - 1 : w + d.half;
    const float *plane = v + c * HW;
    for (int64_t hh = h0; hh <= h1; hh++)
      for (int64_t ww = w0; ww <= w1; ww++) {
        const float t = plane[hh * d.W + ww];
        s += square ? (double)t * t : (double)t;
      }
  }
  return s;
}

/* The window sum around element i of images of chw values, from the image's start. */
KCUDA_DEV double window_at(const float *v, lrn_window d, int64_t i, bool square) {
  const int64_t chw = d.C * d.H * d.W, j = i % chw;
  return window_sum(v + (i - j), d, j / (d.H * d.W), j / d.W % d.H, j % d.W, square);
}

KCUDA_GLOBAL void k_lrn_scale(float *scale, const float *x, lrn_window d, int64_t count,
                              float alpha_over_n, float k) {
  KCUDA_FOR(i, count) scale[i] = k + alpha_over_n * (float)window_at(x, d, i, true);
}

KCUDA_GLOBAL void k_lrn_out(float *y, const float *x, const float *scale, int64_t count,
                            float beta) {
  KCUDA_FOR(i, count) y[i] = x[i] * powf(scale[i], -beta);
}

/* Every scale first, then the output: y may be x. */
KCUDA_OP(lrn_fwd)(const kiln_op_ctx *c, float *y, float *scale, const float *x, int64_t N,
                  int64_t C, int64_t H, int64_t W, int64_t size, bool across, float alpha_over_n,
                  float beta, float k) {
  const lrn_window d = lrn_window_of(C, H, W, size, across);
  const int64_t count = N * C * H * W;
  KCUDA_LAUNCH(c, count, k_lrn_scale, scale, x, d, count, alpha_over_n, k);
  KCUDA_LAUNCH(c, count, k_lrn_out, y, x, scale, count, beta);
  return kcuda_launched(c, "lrn_fwd");
}

/* dy x scale^(-beta-1) of the images from `off` on, into ratio. */
KCUDA_GLOBAL void k_lrn_ratio(float *ratio, const float *dy, const float *x, const float *scale,
                              int64_t off, int64_t count, float beta) {
  KCUDA_FOR(i, count) {
    const int64_t o = off + i;
    ratio[i] = dy[o] * x[o] * powf(scale[o], -beta) / scale[o];
  }
}

KCUDA_GLOBAL void k_lrn_dx(float *dx, const float *ratio, const float *dy, const float *x,
                           const float *scale, lrn_window d, int64_t off, int64_t count,
                           float beta, float coef) {
  KCUDA_FOR(i, count) {
    const int64_t o = off + i;
    const float acc = (float)window_at(ratio, d, i, false);
    dx[o] = dy[o] * powf(scale[o], -beta) - coef * x[o] * acc;
  }
}

/* At most this many floats of ratios at a time: a group of whole images. */
#define LRN_GROUP_FLOATS ((int64_t)1 << 24)

/* Group by group of images: the ratios of the whole group first, so that dx may overwrite dy.
 * dx_j sums over the windows containing j, which (windows being symmetric) is the window around
 * j. The ratios take the backend's scratch, whole groups of images, rather than ws's one. */
KCUDA_OP(lrn_bwd)(const kiln_op_ctx *c, float *dx, float *ws, const float *dy, const float *x,
                  const float *scale, int64_t N, int64_t C, int64_t H, int64_t W, int64_t size,
                  bool across, float alpha_over_n, float beta) {
  (void)ws;
  const lrn_window d = lrn_window_of(C, H, W, size, across);
  const int64_t chw = C * H * W;
  if (N <= 0 || chw <= 0) return KILN_OK;
  int64_t group = LRN_GROUP_FLOATS / chw;
  if (group < 1) group = 1;
  if (group > N) group = N;
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(float) * (size_t)(group * chw), &sp));
  float *ratio = (float *)sp;
  const float coef = 2.0f * alpha_over_n * beta;
  for (int64_t n0 = 0; n0 < N; n0 += group) {
    const int64_t count = (N - n0 < group ? N - n0 : group) * chw, off = n0 * chw;
    KCUDA_LAUNCH(c, count, k_lrn_ratio, ratio, dy, x, scale, off, count, beta);
    KCUDA_LAUNCH(c, count, k_lrn_dx, dx, ratio, dy, x, scale, d, off, count, beta, coef);
  }
  return kcuda_launched(c, "lrn_bwd");
}

/* ---- MVN ------------------------------------------------------------------------------------ */

/* A row's mean, rounded to float as the reference's (kept in double for T_FDEV2). */
KCUDA_GLOBAL void k_mvn_mean(double *mu, const double *part, int64_t rows, int64_t nchunks,
                             int64_t dim) {
  KCUDA_FOR(r, rows) mu[r] = (float)(chunks_sum(part, r, nchunks) / (double)dim);
}

KCUDA_GLOBAL void k_mvn_sd(float *sd, const double *part, int64_t rows, int64_t nchunks,
                           int64_t dim, bool normalize, float eps) {
  KCUDA_FOR(r, rows) {
    sd[r] = normalize ? sqrtf((float)(chunks_sum(part, r, nchunks) / (double)dim)) + eps : 1.0f;
  }
}

/* y may be x. */
KCUDA_GLOBAL void k_mvn_apply(float *y, const float *x, const double *mu, const float *sd,
                              int64_t rows, int64_t dim, bool normalize) {
  KCUDA_FOR(e, rows * dim) {
    const int64_t r = e / dim;
    const float o = x[e] - (float)mu[r];
    y[e] = normalize ? o / sd[r] : o;
  }
}

KCUDA_OP(mvn_fwd)(const kiln_op_ctx *c, float *y, float *sd, const float *x, int64_t rows,
                  int64_t dim, bool normalize, float eps) {
  const norm_view v = view_of(1, rows, dim, 0);
  const int64_t nchunks = view_chunks(v);
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(rows * nchunks + rows), &sp));
  double *part = (double *)sp, *mu = part + rows * nchunks;
  launch_parts(c, part, NULL, v, terms_of(T_SUM, x, NULL));
  KCUDA_LAUNCH(c, rows, k_mvn_mean, mu, part, rows, nchunks, dim);
  if (normalize) {
    norm_terms t = terms_of(T_FDEV2, x, NULL);
    t.mean = mu;
    launch_parts(c, part, NULL, v, t);
  }
  KCUDA_LAUNCH(c, rows, k_mvn_sd, sd, part, rows, nchunks, dim, normalize, eps);
  KCUDA_LAUNCH(c, rows * dim, k_mvn_apply, y, x, mu, sd, rows, dim, normalize);
  return kcuda_launched(c, "mvn_fwd");
}

/* A row's mean(dy) and mean(y dy). */
KCUDA_GLOBAL void k_mvn_means(float *mg, float *myg, const double *p0, const double *p1,
                              int64_t rows, int64_t nchunks, int64_t dim) {
  KCUDA_FOR(r, rows) {
    mg[r] = (float)(chunks_sum(p0, r, nchunks) / (double)dim);
    myg[r] = (float)(chunks_sum(p1, r, nchunks) / (double)dim);
  }
}

/* dx may be dy. */
KCUDA_GLOBAL void k_mvn_dx(float *dx, const float *dy, const float *y, const float *sd,
                           const float *mg, const float *myg, int64_t rows, int64_t dim,
                           bool normalize) {
  KCUDA_FOR(e, rows * dim) {
    const int64_t r = e / dim;
    dx[e] = normalize ? (dy[e] - mg[r] - y[e] * myg[r]) / sd[r] : dy[e] - mg[r];
  }
}

KCUDA_OP(mvn_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *y,
                  const float *sd, int64_t rows, int64_t dim, bool normalize) {
  const norm_view v = view_of(1, rows, dim, 0);
  const int64_t nchunks = view_chunks(v);
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(2 * rows * nchunks) +
                                sizeof(float) * (size_t)(2 * rows), &sp));
  double *p0 = (double *)sp, *p1 = p0 + rows * nchunks;
  float *mg = (float *)(p1 + rows * nchunks), *myg = mg + rows;
  launch_parts(c, p0, p1, v, terms_of(T_DOT, dy, y));
  KCUDA_LAUNCH(c, rows, k_mvn_means, mg, myg, p0, p1, rows, nchunks, dim);
  KCUDA_LAUNCH(c, rows * dim, k_mvn_dx, dx, dy, y, sd, mg, myg, rows, dim, normalize);
  return kcuda_launched(c, "mvn_bwd");
}

/* ---- Reduction ------------------------------------------------------------------------------ */

KCUDA_GLOBAL void k_red_out(float *y, const double *part, int64_t num, int64_t nchunks,
                            float coeff) {
  KCUDA_FOR(n, num) y[n] = (float)(chunks_sum(part, n, nchunks) * coeff);
}

KCUDA_OP(reduction_fwd)(const kiln_op_ctx *c, float *y, const float *x, int64_t num, int64_t dim,
                        kiln_reduce_kind kind, float coeff) {
  const norm_view v = view_of(1, num, dim, 0);
  const int64_t nchunks = view_chunks(v);
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(num * nchunks), &sp));
  double *part = (double *)sp;
  const int t = kind == KILN_REDUCE_ASUM ? T_ASUM : kind == KILN_REDUCE_SUMSQ ? T_SUMSQ : T_SUM;
  launch_parts(c, part, NULL, v, terms_of(t, x, NULL));
  KCUDA_LAUNCH(c, num, k_red_out, y, part, num, nchunks, coeff);
  return kcuda_launched(c, "reduction_fwd");
}

KCUDA_GLOBAL void k_red_bwd(float *dx, const float *dy, const float *x, int64_t num, int64_t dim,
                            int kind, float coeff) {
  KCUDA_FOR(e, num * dim) {
    const float g = dy[e / dim] * coeff, v = x[e];
    if (kind == KILN_REDUCE_ASUM)
      dx[e] = (float)((v > 0) - (v < 0)) * g;
    else if (kind == KILN_REDUCE_SUMSQ)
      dx[e] = 2 * v * g;
    else
      dx[e] = g;
  }
}

KCUDA_OP(reduction_bwd)(const kiln_op_ctx *c, float *dx, const float *dy, const float *x,
                        int64_t num, int64_t dim, kiln_reduce_kind kind, float coeff) {
  KCUDA_LAUNCH(c, num * dim, k_red_bwd, dx, dy, x, num, dim, (int)kind, coeff);
  return kcuda_launched(c, "reduction_bwd");
}

KCUDA_REGISTER(norm) {
  b->batch_norm_fwd = KCUDA_FN(batch_norm_fwd);
  b->batch_norm_apply = KCUDA_FN(batch_norm_apply);
  b->batch_norm_bwd = KCUDA_FN(batch_norm_bwd);
  b->scale_fwd = KCUDA_FN(scale_fwd);
  b->scale_bwd = KCUDA_FN(scale_bwd);
  b->bias_fwd = KCUDA_FN(bias_fwd);
  b->bias_bwd = KCUDA_FN(bias_bwd);
  b->layer_norm_fwd = KCUDA_FN(layer_norm_fwd);
  b->layer_norm_bwd = KCUDA_FN(layer_norm_bwd);
  b->lrn_fwd = KCUDA_FN(lrn_fwd);
  b->lrn_bwd = KCUDA_FN(lrn_bwd);
  b->mvn_fwd = KCUDA_FN(mvn_fwd);
  b->mvn_bwd = KCUDA_FN(mvn_bwd);
  b->reduction_fwd = KCUDA_FN(reduction_fwd);
  b->reduction_bwd = KCUDA_FN(reduction_bwd);
}
