/* Direct convolution by shifted rows, for stride 1 and group 1: the route for shapes that fill
 * neither oneDNN's 16-channel blocks nor a large GEMM (LeNet's 1 -> 20 and 20 -> 50 channels,
 * 5x5, on 24x24 and 8x8 outputs).
 *
 * The idea: with stride 1, the im2col row of tap (c, kh, kw) is the output-sized window of input
 * plane c shifted by kh rows and kw columns. Copy each plane once per kernel column kw with that
 * column shift applied and the padding written in ("shifted plane": rows of out_w values, one for
 * each padded input row). Then the im2col row of (c, kh, kw) is a CONTIGUOUS run of out_h*out_w
 * floats in shifted plane (c, kw), starting kh*dilation_h rows down. The copy is kw times the
 * input rather than kh*kw times (im2col), and every kernel reads whole 16-float vectors:
 *
 *   forward      out[m][p]   = bias[m] + sum over taps t of w[m][t] * S[t][p]
 *   weight grad  dw[m][t]   += sum over images and p of dout[m][p] * S[t][p]
 *   input grad   dS[t][p]    = sum over m of w[m][t] * dout[m][p], added into shifted planes,
 *                              which are then folded back (each kw shifted back) into din.
 *
 * Each is a register-blocked product over 16-lane vectors of positions p (GCC vector types; the
 * compiler emits AVX-512 with -march=native and narrower code on a portable build). Results do
 * not depend on the thread count: the forward and the input gradient are per image, and each
 * weight-gradient element is summed by one thread over the images in order. */
#include <omp.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kiln/ops.h"

typedef float v16f __attribute__((vector_size(64)));
#define VL 16

/* The helpers below pass 64-byte vectors by value; they are static inline, so no call crosses
 * an ABI boundary, and gcc's note that the ABI differs without AVX-512 (portable builds) does
 * not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Output channels and kernel rows per weight-gradient block: 4 x 6 accumulators at most. */
#define DW_RM 4
#define DW_TH 6
#define DW_ACC (DW_RM * DW_TH)
/* Weight-gradient tiles: channel blocks x (c, kw) pairs (see kiln_conv_shift_backward). */
#define DW_TM 4
#define DW_TC 8


/* The products below rely on fused multiply-adds; GCC's ISO C mode leaves contraction off. Clang
 * has no per-function switch: CMakeLists.txt compiles this file with -ffp-contract=fast there. */
#if defined(__clang__)
#define KILN_FMA_FN
#else
#define KILN_FMA_FN __attribute__((optimize("fp-contract=fast")))
#endif

static inline v16f vload(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* A macro, not a function: gcc notes an ABI change for 64-byte vectors passed by value. */
#define VSTORE(p, expr)                            \
  do {                                             \
    const v16f vstore_v_ = (expr);                 \
    memcpy((p), &vstore_v_, sizeof(v16f));         \
  } while (0)

/* The first n (< 16) lanes of p, the rest zero. (A masked load here, which gcc may execute on
 * both sides of the full/partial branch, made the weight gradient 35% slower.) */
static inline v16f vload_part(const float *p, int n) {
  v16f v = {0};
  memcpy(&v, p, sizeof(float) * (size_t)n);
  return v;
}

/* The first n (< 16) lanes of v to p: a masked store with AVX-512, where a memcpy call made the
 * forward's accumulators spill around it. */
#ifdef __AVX512F__
#define VSTORE_PART(p, expr, n) \
  _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1u), (__m512)(expr))
#else
#define VSTORE_PART(p, expr, n)                              \
  do {                                                       \
    const v16f vpart_v_ = (expr);                            \
    for (int vpart_i_ = 0; vpart_i_ < (n); vpart_i_++)       \
      (p)[vpart_i_] = vpart_v_[vpart_i_];                    \
  } while (0)
#endif

/* x in every lane (x - 0 is x exactly, so this folds to one broadcast). */
static inline v16f vsplat(float x) {
  const v16f zero = {0};
  return x - zero;
}

/* dst += the sum of the lanes of a vector expression (a macro for the reason VSTORE is). */
#define VSUM_ADD(dst, expr)                        \
  do {                                             \
    const v16f vsum_v_ = (expr);                   \
    float vsum_s_ = 0.0f;                          \
    for (int vsum_i_ = 0; vsum_i_ < VL; vsum_i_++) \
      vsum_s_ += vsum_v_[vsum_i_];                 \
    (dst) += vsum_s_;                              \
  } while (0)

/* Rows here are a few to a few dozen floats (LeNet: 8 and 24), copied or added many thousand
 * times a pass: whole vectors, then 8, then single floats, inline, where a memcpy call per row
 * cost more than the copy (3% of LeNet's step). */
typedef float v8f __attribute__((vector_size(32)));

static inline void copy_row(float *d, const float *s, int n) {
  int i = 0;
  for (; i + VL <= n; i += VL) VSTORE(d + i, vload(s + i));
  if (i + 8 <= n) {
    v8f v;
    memcpy(&v, s + i, sizeof v);
    memcpy(d + i, &v, sizeof v);
    i += 8;
  }
  for (; i < n; i++) d[i] = s[i];
}

static inline void add_row(float *d, const float *s, int n) {
  int i = 0;
  for (; i + VL <= n; i += VL) VSTORE(d + i, vload(d + i) + vload(s + i));
  if (i + 8 <= n) {
    v8f a, b;
    memcpy(&a, d + i, sizeof a);
    memcpy(&b, s + i, sizeof b);
    a += b;
    memcpy(d + i, &a, sizeof a);
    i += 8;
  }
  for (; i < n; i++) d[i] += s[i];
}

typedef struct {
  int C, KH, KW, dh, OW;
  int64_t P;     /* out_h * out_w */
  int64_t plane; /* floats per shifted plane: (H + 2 pad_h) * out_w, rounded up past a tail */
  int64_t K;     /* C * KH * KW */
  int nv;        /* vectors per output plane: ceil(P / 16) */
  int tail;      /* valid lanes in the last vector (16 when P is a multiple) */
} shift_geom;

static shift_geom make_geom(const kiln_conv_geom *g) {
  shift_geom s;
  s.C = g->channels;
  s.KH = g->kernel_h;
  s.KW = g->kernel_w;
  s.dh = g->dilation_h;
  s.OW = g->out_w;
  s.P = (int64_t)g->out_h * g->out_w;
  s.K = (int64_t)s.C * s.KH * s.KW;
  s.nv = (int)((s.P + VL - 1) / VL);
  s.tail = (int)(s.P - (int64_t)(s.nv - 1) * VL);
  /* A window starts at most (KH-1)*dh rows down and reads nv whole vectors. */
  int64_t need = (int64_t)(s.KH - 1) * s.dh * s.OW + (int64_t)s.nv * VL;
  int64_t rows = (int64_t)(g->height + 2 * g->pad_h) * s.OW;
  int64_t n = need > rows ? need : rows;
  s.plane = (n + VL - 1) / VL * VL;
  return s;
}

/* The kernels are written for 32 vector registers of 16 floats: with AVX-512 they run at
 * most of the FMA peak; compiled for SSE or AVX2 (a portable build, the sanitizer build) their
 * 20-24 accumulators spill and they fall far behind oneDNN, which picks its kernels at run time
 * (`kiln-conv-routes` times both). Layers take the route only when this build has AVX-512. */
bool kiln_conv_shift_fast(void) {
#ifdef __AVX512F__
  return true;
#else
  return false;
#endif
}

bool kiln_conv_shift_supported(const kiln_conv_geom *g, int group) {
  return group == 1 && g->stride_h == 1 && g->stride_w == 1 && g->out_h > 0 && g->out_w > 0;
}

/* floats of shifted planes for one image */
static int64_t image_floats(const shift_geom *s) { return (int64_t)s->C * s->KW * s->plane; }

static int dw_chunk(const shift_geom *s, int N, int M);
static int64_t dw_items(const shift_geom *s, int M);

int64_t kiln_conv_shift_workspace(const kiln_conv_geom *g, int N, int M, int nthreads,
                                  bool backward) {
  if (nthreads < 1) nthreads = 1;
  shift_geom s = make_geom(g);
  int64_t per = image_floats(&s);
  if (!backward) return per * nthreads;
  /* weight gradient: one chunk of images' planes, then each block's kept accumulators (when
   * the batch takes more than one chunk); input gradient: one image's planes per thread */
  const int chunk = dw_chunk(&s, N, M);
  int64_t dw = per * chunk + (chunk < N ? dw_items(&s, M) * DW_ACC * VL : 0);
  int64_t din = per * nthreads;
  return dw > din ? dw : din;
}

/* Kernel column kw of a plane shifted for it: its output column 0 reads input column *off, and
 * output columns [*lo, *hi) read inside the image (an empty range when the shift lies wholly in
 * the padding); the others read padding. */
static void shifted_cols(const kiln_conv_geom *g, int OW, int kw, int *off, int *lo, int *hi) {
  const int o = kw * g->dilation_w - g->pad_w;
  int a = o < 0 ? -o : 0, b = g->width - o;
  if (b > OW) b = OW;
  if (b < 0) b = 0;
  if (a > b) a = b;
  *off = o, *lo = a, *hi = b;
}

/* The shifted planes of one image x (C, H, W): S[c][kw] at S + (c*KW + kw) * plane, row r
 * (padded input row r - pad_h) holding x[c][r - pad_h][ow + kw*dil_w - pad_w] for ow < out_w,
 * zero where that falls in the padding; zero after the last row. */
static void build_planes(float *S, const float *x, const kiln_conv_geom *g, const shift_geom *s) {
  const int H = g->height, W = g->width, R = g->height + 2 * g->pad_h, OW = s->OW;
  for (int c = 0; c < s->C; c++) {
    const float *xc = x + (int64_t)c * H * W;
    for (int kw = 0; kw < s->KW; kw++) {
      float *dst = S + ((int64_t)c * s->KW + kw) * s->plane;
      int off, lo, hi;
      shifted_cols(g, OW, kw, &off, &lo, &hi);
      for (int r = 0; r < R; r++, dst += OW) {
        const int ih = r - g->pad_h;
        if (ih < 0 || ih >= H) {
          memset(dst, 0, sizeof(float) * (size_t)OW);
          continue;
        }
        const float *src = xc + (int64_t)ih * W + off;
        for (int ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
        copy_row(dst + lo, src + lo, hi - lo);
        for (int ow = hi; ow < OW; ow++) dst[ow] = 0.0f;
      }
      int64_t used = (int64_t)R * OW;
      memset(S + ((int64_t)c * s->KW + kw) * s->plane + used, 0,
             sizeof(float) * (size_t)(s->plane - used));
    }
  }
}

/* ---- forward: RM output channels x V vectors of positions ---- */

static inline __attribute__((always_inline)) void fwd_block(float *out, const float *S,
                                                            const float *w, const float *bias,
                                                            const shift_geom *s, int m0, int v0,
                                                            const int RM, const int V) {
  v16f acc[6][4];
#pragma GCC unroll 6
  for (int i = 0; i < RM; i++) {
    const float b = bias ? bias[m0 + i] : 0.0f;
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) acc[i][v] = vsplat(b);
  }
  const float *wm = w + (int64_t)m0 * s->K;
  int64_t t = 0;
  for (int c = 0; c < s->C; c++)
    for (int kh = 0; kh < s->KH; kh++)
      for (int kw = 0; kw < s->KW; kw++, t++) {
        const float *src = S + ((int64_t)c * s->KW + kw) * s->plane +
                           (int64_t)kh * s->dh * s->OW + (int64_t)v0 * VL;
        v16f x[4];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) x[v] = vload(src + v * VL);
#pragma GCC unroll 6
        for (int i = 0; i < RM; i++) {
          const v16f wb = vsplat(wm[i * s->K + t]);
#pragma GCC unroll 4
          for (int v = 0; v < V; v++) acc[i][v] += wb * x[v];
        }
      }
#pragma GCC unroll 6
  for (int i = 0; i < RM; i++) {
    float *o = out + (int64_t)(m0 + i) * s->P + (int64_t)v0 * VL;
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
      if (v0 + v < s->nv - 1 || s->tail == VL) {
        VSTORE(o + v * VL, acc[i][v]);
      } else {
        VSTORE_PART(o + v * VL, acc[i][v], s->tail);
      }
    }
  }
}

#define FWD_CASES(RM)                                                 \
  case RM * 8 + 1: fwd_block(out, S, w, bias, s, m0, v0, RM, 1); break; \
  case RM * 8 + 2: fwd_block(out, S, w, bias, s, m0, v0, RM, 2); break; \
  case RM * 8 + 3: fwd_block(out, S, w, bias, s, m0, v0, RM, 3); break; \
  case RM * 8 + 4: fwd_block(out, S, w, bias, s, m0, v0, RM, 4); break;

static KILN_FMA_FN void fwd_dispatch(float *out, const float *S, const float *w,
                                     const float *bias, const shift_geom *s, int m0, int v0,
                                     int rm, int v) {
  switch (rm * 8 + v) {
    FWD_CASES(1)
    FWD_CASES(2)
    FWD_CASES(3)
    FWD_CASES(4)
    FWD_CASES(5)
    FWD_CASES(6)
    default: break;
  }
}

/* Output channels per block: 6, 5 or 4 when one divides M, else 6 with a smaller last block. */
static int pick_rm(int M) {
  if (M % 6 == 0) return 6;
  if (M % 5 == 0) return 5;
  if (M % 4 == 0) return 4;
  return 6;
}

static void forward_image(float *out, const float *S, const float *w, const float *bias, int M,
                          const shift_geom *s) {
  const int RM = pick_rm(M);
  for (int v0 = 0; v0 < s->nv; v0 += 4) {
    const int V = s->nv - v0 < 4 ? s->nv - v0 : 4;
    for (int m0 = 0; m0 < M; m0 += RM) {
      const int rm = M - m0 < RM ? M - m0 : RM;
      fwd_dispatch(out, S, w, bias, s, m0, v0, rm, V);
    }
  }
}

static int team_size(int nthreads, int64_t items) {
  if (nthreads > items) nthreads = (int)items;
  return nthreads < 1 ? 1 : nthreads;
}

void kiln_conv_shift_forward(float *out, const float *in, const float *w, const float *bias,
                             int N, int M, const kiln_conv_geom *g, float *ws, int nthreads) {
  const shift_geom s = make_geom(g);
  const int64_t per = image_floats(&s), in_img = (int64_t)g->channels * g->height * g->width;
#pragma omp parallel for schedule(static) num_threads(team_size(nthreads, N))
  for (int n = 0; n < N; n++) {
    float *S = ws + (int64_t)omp_get_thread_num() * per;
    build_planes(S, in + n * in_img, g, &s);
    forward_image(out + (int64_t)n * M * s.P, S, w, bias, M, &s);
  }
}

/* ---- weight gradient: RM output channels x T kernel rows (one c, kw), over the images ---- */

/* Adds images [n0, n1) (their planes at S, image n at S + (n - n0) * img) into one block's
 * 16-lane accumulators: starting from zero for the first images (first), else from `keep`; left
 * in `keep` for the next images, or (last) summed across lanes and added into dw. The lanes are
 * stored and reloaded exactly, so the sums do not depend on where the images are cut. */
static inline __attribute__((always_inline)) void dw_block(float *dw, float *keep,
                                                           const float *dout, const float *S,
                                                           int n0, int n1, int M,
                                                           const shift_geom *s, int64_t img,
                                                           int m0, int c, int kh0, int kw,
                                                           bool first, bool last, const int RM,
                                                           const int T) {
  v16f acc[DW_RM][DW_TH];
#pragma GCC unroll 4
  for (int i = 0; i < RM; i++)
#pragma GCC unroll 6
    for (int j = 0; j < T; j++)
      acc[i][j] = first ? (v16f){0} : vload(keep + (i * DW_TH + j) * VL);
  const int64_t rowstep = (int64_t)s->dh * s->OW;
  for (int n = n0; n < n1; n++) {
    const float *dy = dout + ((int64_t)n * M + m0) * s->P;
    const float *src = S + (n - n0) * img + ((int64_t)c * s->KW + kw) * s->plane + kh0 * rowstep;
    for (int v = 0; v < s->nv; v++) {
      v16f d[DW_RM];
      if (v < s->nv - 1 || s->tail == VL) {
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) d[i] = vload(dy + i * s->P + v * VL);
      } else {
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) d[i] = vload_part(dy + i * s->P + v * VL, s->tail);
      }
      /* In a partial last vector the output gradient's lanes past the plane are zero and the
       * plane's are the next rows' values, so those lanes add 0 x value: nothing, unless the
       * input holds an Inf or NaN (then training has diverged anyway, and the solver stops). */
#pragma GCC unroll 6
      for (int j = 0; j < T; j++) {
        const v16f x = vload(src + j * rowstep + v * VL);
#pragma GCC unroll 4
        for (int i = 0; i < RM; i++) acc[i][j] += d[i] * x;
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < RM; i++)
#pragma GCC unroll 6
    for (int j = 0; j < T; j++) {
      if (last)
        VSUM_ADD(dw[(int64_t)(m0 + i) * s->K + ((int64_t)c * s->KH + kh0 + j) * s->KW + kw],
                 acc[i][j]);
      else
        VSTORE(keep + (i * DW_TH + j) * VL, acc[i][j]);
    }
}

#define DW_CASE(RM, T)                                                                      \
  case RM * 8 + T:                                                                          \
    dw_block(dw, keep, dout, S, n0, n1, M, s, img, m0, c, kh0, kw, first, last, RM, T); \
    break;
#define DW_CASES(RM) \
  DW_CASE(RM, 1) DW_CASE(RM, 2) DW_CASE(RM, 3) DW_CASE(RM, 4) DW_CASE(RM, 5) DW_CASE(RM, 6)

static KILN_FMA_FN void dw_dispatch(float *dw, float *keep, const float *dout, const float *S,
                                    int n0, int n1, int M, const shift_geom *s, int64_t img,
                                    int m0, int c, int kh0, int kw, bool first, bool last, int rm,
                                    int t) {
  switch (rm * 8 + t) {
    DW_CASES(1)
    DW_CASES(2)
    DW_CASES(3)
    DW_CASES(4)
    default: break;
  }
}

/* Images per weight-gradient pass. Every block keeps 24 accumulators (1.5 KiB) between passes,
 * so passes pay only when each block has much to do per image: with 16 or more vectors per
 * output plane (LeNet's conv1: 36), as many images as keep their planes and output gradients
 * within about 256 KiB (the per-core L2), at least one; with fewer (LeNet's conv2: 4, 1,300
 * blocks), the whole batch in one pass (2.9 MiB for LeNet), unless that passes 8 MiB. */
static int dw_chunk(const shift_geom *s, int N, int M) {
  const int64_t bytes = (image_floats(s) + (int64_t)M * s->P) * (int64_t)sizeof(float);
  /* few vectors: the whole batch, up to 8 MiB of planes (a bound on the workspace) */
  int64_t k = s->nv < 16 ? (8 << 20) / bytes : (256 * 1024) / bytes;
  if (k < 1) k = 1;
  return k > N ? N : (int)k;
}

static int64_t dw_items(const shift_geom *s, int M) {
  return (int64_t)s->C * s->KW * ((M + DW_RM - 1) / DW_RM) * ((s->KH + DW_TH - 1) / DW_TH);
}

/* ---- input gradient: T kernel rows (one c, kw) x V vectors, summed over output channels ---- */

static inline __attribute__((always_inline)) void din_block(float *dS, const float *dy,
                                                            const float *w, int M,
                                                            const shift_geom *s, int c, int kh0,
                                                            int kw, int v0, const int T,
                                                            const int V) {
  v16f acc[5][4];
#pragma GCC unroll 5
  for (int j = 0; j < T; j++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) acc[j][v] = (v16f){0};
  const int64_t t0 = ((int64_t)c * s->KH + kh0) * s->KW + kw;
  const bool part = v0 + V == s->nv && s->tail != VL;
  for (int m = 0; m < M; m++) {
    const float *d = dy + (int64_t)m * s->P + (int64_t)v0 * VL;
    v16f x[4];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++)
      x[v] = part && v == V - 1 ? vload_part(d + v * VL, s->tail) : vload(d + v * VL);
    const float *wm = w + (int64_t)m * s->K + t0;
#pragma GCC unroll 5
    for (int j = 0; j < T; j++) {
      const v16f wb = vsplat(wm[j * s->KW]);
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) acc[j][v] += wb * x[v];
    }
  }
  float *dst = dS + ((int64_t)c * s->KW + kw) * s->plane + (int64_t)v0 * VL;
  const int64_t rowstep = (int64_t)s->dh * s->OW;
#pragma GCC unroll 5
  for (int j = 0; j < T; j++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
      float *p = dst + (kh0 + j) * rowstep + v * VL;
      VSTORE(p, vload(p) + acc[j][v]);
    }
}

#define DIN_CASES(T)                                                   \
  case T * 8 + 1: din_block(dS, dy, w, M, s, c, kh0, kw, v0, T, 1); break; \
  case T * 8 + 2: din_block(dS, dy, w, M, s, c, kh0, kw, v0, T, 2); break; \
  case T * 8 + 3: din_block(dS, dy, w, M, s, c, kh0, kw, v0, T, 3); break; \
  case T * 8 + 4: din_block(dS, dy, w, M, s, c, kh0, kw, v0, T, 4); break;

static KILN_FMA_FN void din_dispatch(float *dS, const float *dy, const float *w, int M,
                                     const shift_geom *s, int c, int kh0, int kw, int v0, int t,
                                     int v) {
  switch (t * 8 + v) {
    DIN_CASES(1)
    DIN_CASES(2)
    DIN_CASES(3)
    DIN_CASES(4)
    DIN_CASES(5)
    default: break;
  }
}

/* din (C, H, W) = the gradient planes dS folded back: each plane (c, kw) row r column ow holds
 * the gradient of input (r - pad_h, ow + kw*dil_w - pad_w); positions in the padding drop. */
static void fold_planes(float *din, const float *dS, const kiln_conv_geom *g,
                        const shift_geom *s) {
  const int H = g->height, W = g->width, OW = s->OW;
  memset(din, 0, sizeof(float) * (size_t)((int64_t)s->C * H * W));
  for (int c = 0; c < s->C; c++) {
    for (int kw = 0; kw < s->KW; kw++) {
      const float *src = dS + ((int64_t)c * s->KW + kw) * s->plane + (int64_t)g->pad_h * OW;
      int off, lo, hi;
      shifted_cols(g, OW, kw, &off, &lo, &hi);
      for (int ih = 0; ih < H; ih++) {
        float *d = din + ((int64_t)c * H + ih) * W + off;
        const float *r = src + (int64_t)ih * OW;
        add_row(d + lo, r + lo, hi - lo);
      }
    }
  }
}

typedef double v8d __attribute__((vector_size(64)));

/* The sum over n of the P values at d + n * stride, in double: 32 lanes of partial sums (four
 * independent chains, so the adds do not wait on each other's latency), then across lanes, then
 * the values past the last whole group of 32. A fixed order: the same bits on any thread count. */
static double bias_sum(const float *d, int N, int64_t stride, int64_t P) {
  v8d a[4] = {{0}, {0}, {0}, {0}};
  double rest = 0.0;
  const int64_t whole = P / 32 * 32;
  for (int n = 0; n < N; n++, d += stride) {
    for (int64_t p = 0; p < whole; p += 32)
      for (int k = 0; k < 4; k++) {
        v8f x;
        memcpy(&x, d + p + 8 * k, sizeof x);
        a[k] += __builtin_convertvector(x, v8d);
      }
    for (int64_t p = whole; p < P; p++) rest += d[p];
  }
  double s = 0.0;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 8; i++) s += a[k][i];
  return s + rest;
}

void kiln_conv_shift_backward(float *din, float *dw, float *dbias, const float *dout,
                              const float *in, const float *w, int N, int M,
                              const kiln_conv_geom *g, float *ws, int nthreads) {
  if (nthreads < 1) nthreads = 1;
  const shift_geom s = make_geom(g);
  const int64_t per = image_floats(&s), in_img = (int64_t)g->channels * g->height * g->width;
  if (dbias) {
#pragma omp parallel for schedule(static) num_threads(team_size(nthreads, M))
    for (int m = 0; m < M; m++) dbias[m] += (float)bias_sum(dout + (int64_t)m * s.P, N,
                                                           (int64_t)M * s.P, s.P);
  }
  if (dw) {
    /* Images in chunks: the chunk's planes are built, then every block adds the chunk into its
     * accumulators, kept between chunks. Blocks are dealt to threads in fixed ranges, so each
     * block's sums run over the images in order on one thread. */
    const int chunk = dw_chunk(&s, N, M);
    const int mblocks = (M + DW_RM - 1) / DW_RM, hchunks = (s.KH + DW_TH - 1) / DW_TH;
    const int64_t items = dw_items(&s, M);
    float *S = ws, *keep_all = ws + per * chunk;
#pragma omp parallel num_threads(team_size(nthreads, items))
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = items * t / nt, hi = items * (t + 1) / nt;
      for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n1 = N - n0 < chunk ? N : n0 + chunk;
        for (int n = n0 + t; n < n1; n += nt)
          build_planes(S + (n - n0) * per, in + n * in_img, g, &s);
#pragma omp barrier
        /* Blocks in tiles of DW_TM channel blocks x DW_TC (c, kw) pairs: a tile's output
         * gradients and planes (LeNet's conv2: 256 + 230 KiB) stay in L2 while its blocks read
         * them, instead of every (c, kw) reading all the output gradients (800 KiB, about the
         * whole L2, so a busy neighbour on the host's core pushed them out: the weight gradient
         * ran a third slower then). Numbered in tile order, each block's index fixed. */
        int64_t it = 0;
        for (int tm = 0; tm < mblocks && it < hi; tm += DW_TM)
          for (int tc = 0; tc < s.C * s.KW && it < hi; tc += DW_TC)
            for (int ck = tc; ck < tc + DW_TC && ck < s.C * s.KW; ck++)
              for (int mb = tm; mb < tm + DW_TM && mb < mblocks; mb++)
                for (int hc = 0; hc < hchunks; hc++, it++) {
                  if (it < lo || it >= hi) continue;
                  const int c = ck / s.KW, kw = ck % s.KW;
                  const int m0 = mb * DW_RM, kh0 = hc * DW_TH;
                  const int rm = M - m0 < DW_RM ? M - m0 : DW_RM;
                  const int th = s.KH - kh0 < DW_TH ? s.KH - kh0 : DW_TH;
                  dw_dispatch(dw, keep_all + it * DW_ACC * VL, dout, S, n0, n1, M, &s, per, m0,
                              c, kh0, kw, n0 == 0, n1 == N, rm, th);
                }
#pragma omp barrier
      }
    }
  }
  if (din) {
    float *dS_all = ws;
    const int TH = 5;
#pragma omp parallel for schedule(static) num_threads(team_size(nthreads, N))
    for (int n = 0; n < N; n++) {
      float *dS = dS_all + (int64_t)omp_get_thread_num() * per;
      memset(dS, 0, sizeof(float) * (size_t)per);
      const float *dy = dout + (int64_t)n * M * s.P;
      for (int c = 0; c < s.C; c++)
        for (int kw = 0; kw < s.KW; kw++)
          for (int kh0 = 0; kh0 < s.KH; kh0 += TH) {
            const int t = s.KH - kh0 < TH ? s.KH - kh0 : TH;
            for (int v0 = 0; v0 < s.nv; v0 += 4) {
              const int V = s.nv - v0 < 4 ? s.nv - v0 : 4;
              din_dispatch(dS, dy, w, M, &s, c, kh0, kw, v0, t, V);
            }
          }
      fold_planes(din + n * in_img, dS, g, &s);
    }
  }
}
