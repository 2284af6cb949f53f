/* The l2norm family on the CUDA backend (KILN_OPS_L2NORM): Normalize, the SSD fork's L2
 * normalisation. Outputs that are one value an element are one thread an element. A group's sum
 * is in double, as the reference's: per position one thread a group adds its C terms in channel
 * order (the reference's sum bit for bit); across, and for the scale's gradient per channel, in
 * two passes, partial sums of consecutive chunks of KCUDA_CHUNK values into scratch, then one
 * thread a group (or channel) adding its chunks in order. The order follows the sizes alone, so
 * results never depend on the grid. */
#include "cuda/kcuda.h"

/* Normalize's sizes: a group is the C values at one (n, s), or (across) one image's C x S. */
typedef struct {
  int64_t N, C, S;
  bool across, shared;
} l2_dims;

static l2_dims l2_dims_of(int64_t N, int64_t C, int64_t S, bool across, bool shared) {
  l2_dims d;
  d.N = N;
  d.C = C;
  d.S = S;
  d.across = across;
  d.shared = shared;
  return d;
}

static int64_t l2_groups(l2_dims d) { return d.across ? d.N : d.N * d.S; }

static int64_t l2_chunks(int64_t m) { return (m + KCUDA_CHUNK - 1) / KCUDA_CHUNK; }

KCUDA_DEV float l2_sc(const float *scale, l2_dims d, int64_t ch) {
  return d.shared ? scale[0] : scale[ch];
}

/* The group of element e. */
KCUDA_DEV int64_t l2_group(l2_dims d, int64_t e) {
  const int64_t n = e / (d.C * d.S);
  return d.across ? n : n * d.S + e % d.S;
}

/* A term of a group's sum, as the reference's: x^2 (dy NULL), or (dy scale) x. */
KCUDA_DEV double l2_term(const float *dy, const float *x, const float *scale, l2_dims d,
                         int64_t e) {
  const float v = x[e];
  return dy ? (double)(dy[e] * l2_sc(scale, d, e / d.S % d.C)) * v : (double)v * v;
}

/* The sum of chunks k = 0 .. nchunks - 1 of row r, in order. */
KCUDA_DEV double l2_chunks_sum(const double *part, int64_t r, int64_t nchunks) {
  double t = 0;
  for (int64_t k = 0; k < nchunks; k++) t += part[r * nchunks + k];
  return t;
}

/* ---- the groups' sums ------------------------------------------------------------------------ */

/* Per position: one thread a group, its channels in order. */
KCUDA_GLOBAL void k_l2_pos_sums(double *sum, const float *dy, const float *x, const float *scale,
                                l2_dims d) {
  KCUDA_FOR(g, d.N * d.S) {
    const int64_t base = g / d.S * d.C * d.S + g % d.S;
    double t = 0;
    for (int64_t ch = 0; ch < d.C; ch++) t += l2_term(dy, x, scale, d, base + ch * d.S);
    sum[g] = t;
  }
}

/* Across: chunk k of image n's terms into part[n nchunks + k]. */
KCUDA_GLOBAL void k_l2_img_parts(double *part, const float *dy, const float *x,
                                 const float *scale, l2_dims d, int64_t nchunks) {
  const int64_t cs = d.C * d.S;
  KCUDA_FOR(i, d.N * nchunks) {
    const int64_t n = i / nchunks, j0 = i % nchunks * KCUDA_CHUNK;
    const int64_t j1 = j0 + KCUDA_CHUNK < cs ? j0 + KCUDA_CHUNK : cs;
    double t = 0;
    for (int64_t j = j0; j < j1; j++) t += l2_term(dy, x, scale, d, n * cs + j);
    part[i] = t;
  }
}

KCUDA_GLOBAL void k_l2_img_sums(double *sum, const double *part, int64_t N, int64_t nchunks) {
  KCUDA_FOR(n, N) sum[n] = l2_chunks_sum(part, n, nchunks);
}

/* Every group's sum of x^2 (dy NULL) or of d x into sum; part: N l2_chunks(C S) doubles across,
 * unused otherwise. */
static void l2_sums(const kiln_op_ctx *c, double *sum, double *part, const float *dy,
                    const float *x, const float *scale, l2_dims d) {
  if (d.across) {
    const int64_t nchunks = l2_chunks(d.C * d.S);
    KCUDA_LAUNCH(c, d.N * nchunks, k_l2_img_parts, part, dy, x, scale, d, nchunks);
    KCUDA_LAUNCH(c, d.N, k_l2_img_sums, sum, part, d.N, nchunks);
  } else {
    KCUDA_LAUNCH(c, d.N * d.S, k_l2_pos_sums, sum, dy, x, scale, d);
  }
}

/* ---- forward --------------------------------------------------------------------------------- */

KCUDA_GLOBAL void k_l2_norm(float *norm, const double *sum, int64_t groups, double eps) {
  KCUDA_FOR(g, groups) norm[g] = (float)sqrt(sum[g] + eps);
}

KCUDA_GLOBAL void k_l2_apply(float *y, const float *x, const float *norm, const float *scale,
                             l2_dims d) {
  KCUDA_FOR(e, d.N * d.C * d.S) {
    y[e] = x[e] / norm[l2_group(d, e)] * l2_sc(scale, d, e / d.S % d.C);
  }
}

KCUDA_OP(l2norm_fwd)(const kiln_op_ctx *c, float *y, float *norm, const float *x,
                     const float *scale, int64_t N, int64_t C, int64_t S, bool across,
                     bool shared, float eps) {
  const l2_dims d = l2_dims_of(N, C, S, across, shared);
  const int64_t groups = l2_groups(d), parts = across ? N * l2_chunks(C * S) : 0;
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(groups + parts), &sp));
  double *sum = (double *)sp;
  l2_sums(c, sum, sum + groups, NULL, x, NULL, d);
  KCUDA_LAUNCH(c, groups, k_l2_norm, norm, sum, groups, (double)eps);
  KCUDA_LAUNCH(c, N * C * S, k_l2_apply, y, x, norm, scale, d);
  return kcuda_launched(c, "l2norm_fwd");
}

/* ---- backward -------------------------------------------------------------------------------- */

/* Chunk k of channel ch's N x S terms dy x / norm (image by image) into part[ch nchunks + k]. */
KCUDA_GLOBAL void k_l2_scale_parts(double *part, const float *dy, const float *x,
                                   const float *norm, l2_dims d, int64_t nchunks) {
  const int64_t m = d.N * d.S;
  KCUDA_FOR(i, d.C * nchunks) {
    const int64_t ch = i / nchunks, j0 = i % nchunks * KCUDA_CHUNK;
    const int64_t j1 = j0 + KCUDA_CHUNK < m ? j0 + KCUDA_CHUNK : m;
    double t = 0;
    for (int64_t j = j0; j < j1; j++) {
      const int64_t e = (j / d.S * d.C + ch) * d.S + j % d.S;
      t += (double)dy[e] * x[e] / norm[l2_group(d, e)];
    }
    part[i] = t;
  }
}

/* Each channel's sum into its scale's gradient, or with shared all of them, in channel order,
 * into the one. */
KCUDA_GLOBAL void k_l2_scale_sums(float *dscale, const double *part, l2_dims d, int64_t nchunks) {
  if (d.shared) {
    KCUDA_FOR(i, 1) {
      double t = 0;
      for (int64_t ch = 0; ch < d.C; ch++) t += l2_chunks_sum(part, ch, nchunks);
      dscale[i] += (float)t;
    }
  } else {
    KCUDA_FOR(ch, d.C) dscale[ch] += (float)l2_chunks_sum(part, ch, nchunks);
  }
}

KCUDA_GLOBAL void k_l2_dx(float *dx, const float *dy, const float *x, const float *norm,
                          const double *sum, const float *scale, l2_dims d) {
  KCUDA_FOR(e, d.N * d.C * d.S) {
    const int64_t g = l2_group(d, e);
    const float nr = norm[g], k = (float)(sum[g] / ((double)nr * nr));
    dx[e] = (dy[e] * l2_sc(scale, d, e / d.S % d.C) - x[e] * k) / nr;
  }
}

/* The channels' sums take the backend's scratch, not ws (the host's). */
KCUDA_OP(l2norm_bwd)(const kiln_op_ctx *c, float *dx, float *dscale, float *ws, const float *dy,
                     const float *x, const float *norm, const float *scale, int64_t N, int64_t C,
                     int64_t S, bool across, bool shared) {
  (void)ws;
  if (!dx && !dscale) return KILN_OK;
  const l2_dims d = l2_dims_of(N, C, S, across, shared);
  const int64_t groups = dx ? l2_groups(d) : 0, parts = dx && across ? N * l2_chunks(C * S) : 0;
  const int64_t ncc = dscale ? l2_chunks(N * S) : 0;
  void *sp;
  KILN_TRY(kcuda_scratch(c, sizeof(double) * (size_t)(groups + parts + C * ncc), &sp));
  double *sum = (double *)sp, *part = sum + groups, *cpart = part + parts;
  if (dscale) {
    KCUDA_LAUNCH(c, C * ncc, k_l2_scale_parts, cpart, dy, x, norm, d, ncc);
    KCUDA_LAUNCH(c, shared ? 1 : C, k_l2_scale_sums, dscale, cpart, d, ncc);
  }
  if (dx) {
    l2_sums(c, sum, part, dy, x, scale, d);
    KCUDA_LAUNCH(c, N * C * S, k_l2_dx, dx, dy, x, norm, sum, scale, d);
  }
  return kcuda_launched(c, "l2norm_bwd");
}

KCUDA_REGISTER(l2norm) {
  b->l2norm_fwd = KCUDA_FN(l2norm_fwd);
  b->l2norm_bwd = KCUDA_FN(l2norm_bwd);
}
